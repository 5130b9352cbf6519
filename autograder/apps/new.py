"""`course new ID`: a new assignment scaffolded from the one file its author writes first, solutions/ID.py.

Every public function and class of the reference module becomes a graded item. `course new` writes the rest, each
place still to be written marked `TODO(course new)`, which `course check ID` lists one line each:
  - course.yaml: the assignment's section (items with their signatures, methods and points; `--experiment` runs
    with placeholder thresholds);
  - assignments/ID/ID.ipynb: the source notebook, with an nbgrader-correct graded cell and test cell per item (the
    stubs, the rules cell and the public-check helper are `course sync`'s, run at the end);
  - autograder/suites/test_ID.py: a shapes and a values check per item, comparing with the reference on the cases
    the author lists;
  - autograder/harness/ID.py: the grader's training loop per experiment (only with `--experiment`);
  - tests/planted/ID.py: two typical mistakes and a correct alternative per item, for the meta-tests.
No shared file changes: every table the grader keeps per assignment is derived from these.
"""
import ast
import json
import re
from pathlib import Path

import nbformat

from autograder.apps.new_files import TODO, Found, harness, planted, suite
from autograder.course.config import course_root, load_course
from autograder.errors import ConfigError
from autograder.notebooks.build import HIDDEN_BEGIN, HIDDEN_END

PACKAGE = Path(__file__).resolve().parents[1]
# the end of every test cell (docs/NOTEBOOKS.md): a marker only, the hidden checks live in the suite
HIDDEN_TESTS = f"{HIDDEN_BEGIN}\n# The hidden checks run outside this notebook, in the course autograder.\n{HIDDEN_END}"
ID = re.compile(r"[a-z][a-z0-9_]*")
POINTS = {"exists": 1, "shapes": 1, "values": 2}


def signature_of(node: ast.FunctionDef, drop_self: bool) -> str:
    args = node.args
    if drop_self and args.args:
        args = ast.arguments(posonlyargs=args.posonlyargs, args=args.args[1:], vararg=args.vararg,
                             kwonlyargs=args.kwonlyargs, kw_defaults=args.kw_defaults, kwarg=args.kwarg,
                             defaults=args.defaults[-(len(args.args) - 1):] if len(args.args) > 1 and args.defaults
                             else [])
    return f"({ast.unparse(args)})"


def items_of(source: str) -> list[Found]:
    """The module's public functions and classes, in order, with their signatures and public methods."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            found.append(Found(node.name, signature_of(node, drop_self=False)))
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            methods = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
            init = methods.get("__init__")
            found.append(Found(node.name, signature_of(init, drop_self=True) if init else "()",
                               {name: signature_of(m, drop_self=True) for name, m in methods.items()
                                if not name.startswith("_")}))
    return found


def setup_source(source: str) -> str:
    """The setup cell: the module's imports, and its `# --- setup` section when it has one."""
    lines = source.splitlines()
    imports = [ast.get_source_segment(source, node) for node in ast.parse(source).body
               if isinstance(node, (ast.Import, ast.ImportFrom))]
    start = next((i for i, line in enumerate(lines) if line.startswith("# --- setup")), None)
    end = next((i for i, line in enumerate(lines) if line.startswith("# --- end of setup")), None)
    setup = lines[start + 1:end] if start is not None and end is not None else []
    return "\n".join([*(line for line in imports if line), *([""] + setup if setup else [])])


def from_scratch_of(specs: list[str], items: list[Found], shared: dict[str, list[str]]) -> tuple[dict, dict]:
    """`--from-scratch ITEM=ORACLE` options as ({item: [oracle names]}, {name: [dotted path]}, the assignment's own
    oracles): ORACLE is the dotted path of the function the item may not call (its name, the path's last part), or
    the name of one in the course's shared `oracles:`."""
    scratch: dict[str, list[str]] = {}
    own: dict[str, list[str]] = {}
    names = [i.name for i in items]
    for spec in specs:
        item, _, oracle = spec.partition("=")
        if item not in names or not oracle:
            raise ConfigError(f"--from-scratch {spec}: ITEM=ORACLE, with ITEM one of {', '.join(names)} and ORACLE "
                              f"a function's dotted path (torch.nn.functional.layer_norm) or a name of course.yaml's "
                              f"`oracles:` ({', '.join(shared) or 'none'})")
        if "." in oracle:
            if resolved(oracle) is None:
                raise ConfigError(f"--from-scratch {spec}: {oracle} does not resolve here (a module and attributes, "
                                  f"e.g. torch.nn.functional.layer_norm)")
            name = oracle.rsplit(".", 1)[1]
            own.setdefault(name, [])
            own[name] += [oracle] if oracle not in own[name] else []
        elif oracle in shared or oracle in own:
            name = oracle
        else:
            raise ConfigError(f"--from-scratch {spec}: '{oracle}' is not in course.yaml's `oracles:` "
                              f"({', '.join(shared)}); give the function's dotted path instead")
        scratch.setdefault(item, [])
        scratch[item] += [name] if name not in scratch[item] else []
    return scratch, own


def compared_with(scratch: dict[str, list[str]], own: dict[str, list[str]],
                  shared: dict[str, list[str]]) -> dict[str, list[str]]:
    """item -> the first function each of its from-scratch names stands for (what its values check compares with)."""
    return {item: [{**shared, **own}[name][0] for name in names] for item, names in scratch.items()}


def resolved(path: str):
    """The object a dotted path names (its longest importable module, then attributes), or None."""
    import importlib
    parts = path.split(".")
    for k in range(len(parts) - 1, 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            found = getattr(found, attr, None)
        return found
    return None


def yaml_section(aid: str, items: list[Found], experiments: dict[str, str],
                 scratch: dict[str, list[str]] | None = None, own: dict[str, list[str]] | None = None) -> str:
    """The assignment's section of course.yaml, as text appended under `assignments:`."""
    out = [f"  {aid}:",
           f"    title: \"{TODO}: the assignment's title\"",
           f"    lecture: \"{TODO}: the lecture it belongs to\"",
           f"    notebook: assignments/{aid}/{aid}.ipynb",
           "    items:"]
    for item in items:
        out.append(f"      {item.name}:")
        out.append(f"        signature: {json.dumps(item.signature)}")
        if item.methods:
            out.append("        methods: {" + ", ".join(f"{m}: {json.dumps(s)}" for m, s in item.methods.items()) + "}")
        if item.name in (scratch or {}):  # calling what it is compared with scores the whole item 0
            out.append(f"        from_scratch: [{', '.join((scratch or {})[item.name])}]")
        out.append("        points: {" + ", ".join(f"{k}: {v}" for k, v in POINTS.items()) + "}")
    if own:
        out.append("    # what its from-scratch items may not call, however reached (the sandbox watches these)")
        out.append("    oracles:")
        out += [f"      {name}: [{', '.join(paths)}]" for name, paths in own.items()]
    if experiments:
        out.append("    experiments:")
    for name, item in experiments.items():
        out += [f"      {name}:",
                f"        item: {item}",
                "        points: 2",
                f"        description: \"{TODO}: what the run trains and what it measures\"",
                "        metric: score",
                f"        threshold: {{score: {{min: 0.5}}}}   # {TODO}: the pass mark, cleared by the reference on "
                f"every seed with a margin",
                f"        lecture: {{score: 0.5}}             # {TODO}: the lecture's measured figure",
                "        steps: 100",
                "        seeds: [0, 1]"]
    return "\n".join(out) + "\n"


def md(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(text)


def code(text: str, grade_id: str, solution: bool = False, points: float | None = None) -> nbformat.NotebookNode:
    """A code cell with nbgrader's metadata: a setup cell, a graded (solution) cell or a test cell."""
    meta = {"grade": points is not None, "grade_id": grade_id, "locked": not solution, "schema_version": 3,
            "solution": solution, "task": False}
    if points is not None:
        meta["points"] = points
    return nbformat.v4.new_code_cell(text, metadata={"nbgrader": meta})


def notebook(aid: str, items: list[Found], setup: str) -> nbformat.NotebookNode:
    """The source notebook: introduction, setup cells, then a section per item with its graded and test cell."""
    total = f"<!--fact total_points-->{sum(POINTS.values()) * len(items)}<!--/fact-->"
    table = "\n".join(f"| `{i.name}` | <!--fact points.{i.name}-->{sum(POINTS.values())}<!--/fact--> |" for i in items)
    cells = [md(f"# <!--fact title-->{aid}<!--/fact-->\n\n{TODO}: the introduction: what the student builds, and "
                f"why.\n\n| graded item | points |\n|---|---|\n{table}\n| **total** | **{total}** |"),
             md("## 0. Setup\n\nRun the code cells below first, in order: the imports, then the helper the test cells "
                "report with."),
             code(setup, "setup_imports"),
             code("", "setup_checks")]
    for k, item in enumerate(items, 1):
        points = sum(POINTS.values())
        cells += [md(f"## {k}. `{item.name}`\n\n{TODO}: the lecture's section that `{item.name}` implements.\n\n"
                     f"### Your turn: `{item.name}` (graded, <!--fact points.{item.name}-->{points}<!--/fact--> "
                     f"points)"),
                  code("", item.name, solution=True),
                  code(f"chk = PublicChecks('{item.name}', points={points})\n# {TODO}: public checks a student can "
                       f"read: chk.check, chk.shape, chk.close, chk.device\nchk.done()\n\n{HIDDEN_TESTS}",
                       f"test_{item.name}", points=points)]
    cells += [md("## Self-check\n\nThe cell below runs the public checks of every item again and prints one table: "
                 "how many of each item's public checks pass now, *not started* for an item still raising "
                 "`NotImplementedError`, and the points at stake. `self_check()` works in any cell at any time."),
              nbformat.v4.new_code_cell("self_check()")]  # no nbgrader metadata: it never runs at grading
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata.update({"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                        "language_info": {"name": "python"}})
    return nb


def new(aid: str, experiments: list[str] = (), from_scratch: list[str] = ()) -> int:
    """Scaffold assignment `aid` from solutions/<aid>.py; prints what it wrote and what to do next."""
    root = course_root()
    course = load_course()
    if not ID.fullmatch(aid):
        raise ConfigError(f"'{aid}' is not an assignment id: lower case letters, digits and _, e.g. w9l2_vit")
    if aid in course.assignments:
        raise ConfigError(f"{aid} is already in course.yaml")
    solution = root / "solutions" / f"{aid}.py"
    if not solution.is_file():
        raise ConfigError(f"write the reference module first: solutions/{aid}.py (its public functions and classes "
                          f"become the graded items)")
    source = solution.read_text()
    items = items_of(source)
    if not items:
        raise ConfigError(f"solutions/{aid}.py defines no public function or class to grade")
    runs = {}
    for spec in experiments:
        name, _, item = spec.partition(":")
        if not ID.fullmatch(name) or item not in {i.name for i in items}:
            raise ConfigError(f"--experiment {spec}: NAME:ITEM, with ITEM one of {', '.join(i.name for i in items)}")
        runs[name] = item
    scratch, own = from_scratch_of(list(from_scratch), items, course.oracles)
    files = {root / "assignments" / aid / f"{aid}.ipynb": None,
             PACKAGE / "suites" / f"test_{aid}.py": suite(aid, items, compared_with(scratch, own, course.oracles)),
             root / "tests" / "planted" / f"{aid}.py": planted(aid, items, runs)}
    if runs:
        files[PACKAGE / "harness" / f"{aid}.py"] = harness(aid, runs)
    there = [str(path) for path in files if path.exists()]
    if there:
        raise ConfigError(f"{aid}: these files exist already, and course new overwrites nothing: {', '.join(there)}")
    course.path.write_text(insert_section(course.path.read_text(), yaml_section(aid, items, runs, scratch, own)))
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is None:
            nbformat.write(notebook(aid, items, setup_source(source)), path)
        else:
            path.write_text(content)
    from autograder.notebooks.build import sync
    sync(aid)
    print(f"{aid}: {len(items)} items ({', '.join(i.name for i in items)})" +
          (f", experiments {', '.join(runs)}" if runs else "") +
          (f", from scratch {', '.join(scratch)}" if scratch else ""))
    for path in [course.path, *files]:
        print(f"  wrote {path.relative_to(root) if path.is_relative_to(root) else path}")
    print(f"next: `course check {aid}` lists what is left to write, one line each")
    return 0


def insert_section(text: str, section: str) -> str:
    """course.yaml with `section` as its last assignment: at the end of `assignments:`, before the next top-level key
    (and the comments above it) when there is one."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.startswith("assignments:")), None)
    if start is None:
        raise ConfigError(f"{load_course().path} has no `assignments:` to add to")
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in (" ", "\n", "#")), len(lines))
    while end > start + 1 and lines[end - 1].startswith("#"):
        end -= 1
    head = "".join(lines[:end])
    return head + ("" if head.endswith("\n") else "\n") + section + "".join(lines[end:])
