"""`course check [ID ...]`: is an assignment safe to hand out? One line per problem, exit 1 when there is any.

The fast form (the default, what CI runs) reads, runs nothing of the student's kind:
  0. what `course new` left to write: each `TODO(course new)` in the assignment's files, one line each;
  1. the solution: every item of course.yaml in solutions/<id>.py, with course.yaml's signature and its methods;
  2. the suite: a check (`@pytest.mark.item(ITEM, KIND)`) for every kind an item has points for, and none for
     an item or kind course.yaml does not have;
  3. the harness: every experiment of course.yaml in its EXPERIMENTS, and every metric its thresholds and lecture
     figures name written in the harness (a misspelt metric is otherwise found only when grading runs);
  4. the source notebook: nothing `course sync` would change (stubs, points, rules, facts: notebooks/facts.py);
  5. the release: `course release`'s own verification (no hidden line leaks, every stub and test cell, points,
     facts as course.yaml gives them), and made from the source notebook as it is now;
  6. device checks: every item checked on the fake GPU has a `chk.device(...)` in its test cell (check_device.py);
  7. edge cases: each edge case beyond the lecture is a check of its own worth one point (check_edges.py).
`--grade` also grades the reference solution (full marks) and the untouched release (0), without experiments;
`--planted`, `--mutations N` and `--seeds N` run the slower stages of check_deep.py, `--full` all of them.
"""
import ast
import importlib
import importlib.util
import inspect
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from autograder.apps.check_device import device_check_problems
from autograder.apps.check_edges import edge_case_problems
from autograder.course.config import Assignment, course_root, load_course
from autograder.grading.checks import Fail, check_signature

SUITE_MARK = re.compile(r"""mark\.item\(\s*["'](\w+)["']\s*,\s*["'](\w+)["']""")


def signature_info(obj, methods):
    """What the sandbox's `signature` operation reports for the student's object, here for the solution's."""
    def params(f, drop_self):
        try:
            ps = list(inspect.signature(f).parameters.values())[(1 if drop_self else 0):]
        except (TypeError, ValueError):
            return None
        return [[p.name, p.kind.name, "" if p.default is p.empty else repr(p.default)] for p in ps]
    if isinstance(obj, type):
        return {"kind": "class", "params": params(obj.__init__, True),
                "methods": {m: params(getattr(obj, m), True) if callable(getattr(obj, m, None)) else None
                            for m in methods}}
    return {"kind": "function", "params": params(obj, False)} if callable(obj) else {"kind": type(obj).__name__}


def solution_problems(aid: str, assignment: Assignment) -> list[str]:
    path = course_root() / "solutions" / f"{aid}.py"
    if not path.is_file():
        return [f"{aid}: solutions/{aid}.py is missing (the reference solution every other part is made from)"]
    # read as it is on disk now, beside (not over) the `solutions.<aid>` that sync and grading import
    found = importlib.util.spec_from_file_location(f"course_check_solutions_{aid}", path)
    assert found is not None and found.loader is not None  # a .py file's path always has both
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    problems = []
    for item, spec in assignment.items.items():
        if not hasattr(module, item):
            problems.append(f"{aid}: item '{item}' is in course.yaml but not in solutions/{aid}.py")
            continue
        try:
            check_signature(item, spec.signature, signature_info(getattr(module, item), spec.methods), spec.methods)
        except Fail as e:
            problems.append(f"{aid}: solutions/{aid}.py: {e} (course.yaml's signature)")
    return problems + [f"{aid}: solutions/{aid}.py: {problem}" for problem in docstring_problems(aid, module)]


MASKED = re.compile(r"\bmask=")  # a signature that takes a mask


def graded_callables(aid: str, module):
    """(label, signature, object) of every graded function, class and listed method the module has."""
    for name, item in load_course().assignment(aid).items.items():
        obj = getattr(module, name, None)
        if obj is not None:
            yield name, item.signature, obj
            yield from ((f"{name}.{m}", sig, getattr(obj, m)) for m, sig in item.methods.items() if hasattr(obj, m))


def docstring_problems(aid: str, module) -> list[str]:
    """The stubs' docstrings (`course sync` writes them from the solution): every graded function and method says
    what it does, and one that takes a mask states its convention and names how each earlier assignment with a
    masked item differs (issue #52: one idea, several conventions), by its short name (w8l1, lab14)."""
    course, problems = load_course(), []
    earlier = list(course.assignments)[:list(course.assignments).index(aid)]
    masked_before = [other.split("_")[0] for other in earlier
                     if any(MASKED.search(sig) for item in course.assignment(other).items.values()
                            for sig in [item.signature, *item.methods.values()])]
    for label, signature, obj in graded_callables(aid, module):
        doc = inspect.getdoc(obj) or ""
        if not doc.strip():
            problems.append(f"'{label}' has no docstring, so its stub says nothing")
        elif MASKED.search(signature):
            missing = [short for short in masked_before if short not in doc]
            if missing:
                problems.append(f"'{label}' takes a mask, but its docstring does not say how {missing} differ")
            if not re.search(r"True|1\b", doc):
                problems.append(f"'{label}' takes a mask, but its docstring states no convention")
    return problems


def suite_problems(aid: str, assignment: Assignment) -> list[str]:
    path = Path(__file__).parents[1] / "suites" / f"test_{aid}.py"
    if not path.is_file():
        return [f"{aid}: the hidden suite autograder/suites/test_{aid}.py is missing"]
    marked = set(SUITE_MARK.findall(path.read_text()))
    wanted = {(item, kind) for item, spec in assignment.items.items() for kind in spec.points if kind != "exists"}
    return ([f"{aid}: '{item}' has {kind} points in course.yaml, but no check in test_{aid}.py "
             f"(@pytest.mark.item(\"{item}\", \"{kind}\"))" for item, kind in sorted(wanted - marked)]
            + [f"{aid}: test_{aid}.py checks '{item}' {kind}, which course.yaml gives no points"
               for item, kind in sorted(marked - wanted)])


def harness_problems(aid: str, assignment: Assignment) -> list[str]:
    if not assignment.experiments:
        return []
    path = Path(__file__).parents[1] / "harness" / f"{aid}.py"
    if not path.is_file():
        return [f"{aid}: course.yaml has experiments, but autograder/harness/{aid}.py is missing"]
    module = importlib.import_module(f"autograder.harness.{aid}")
    declared = getattr(module, "EXPERIMENTS", {})
    written = written_names(path)
    problems = [f"{aid}: experiment '{name}' is in course.yaml but not in the harness's EXPERIMENTS"
                for name in assignment.experiments if name not in declared]
    problems += [f"{aid}: the harness's experiment '{name}' is not in course.yaml" for name in declared
                 if name not in assignment.experiments]
    for name, exp in assignment.experiments.items():
        problems += [f"{aid}: experiment '{name}' names metric '{metric}', which autograder/harness/{aid}.py "
                     f"never writes" for metric in sorted({exp.metric, *exp.threshold})
                     if not any(re.fullmatch(pattern, metric) for pattern in written)]
    return problems


def written_names(path: Path, seen: frozenset = frozenset()) -> set[str]:
    """The strings a harness module and the harness modules it imports write, as patterns: an f-string's
    `f"gap_D{D}"` stands for every name it can make (`gap_D.+`)."""
    tree = ast.parse(path.read_text())
    patterns = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            patterns.add("".join(re.escape(str(part.value)) if isinstance(part, ast.Constant) else ".+"
                                 for part in node.values))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            patterns.add(re.escape(node.value))
        elif isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            imported = path.with_name(f"{node.module}.py")
            if imported.is_file() and imported not in seen:
                patterns |= written_names(imported, seen | {path})
    return patterns


def notebook_problems(aid: str) -> list[str]:
    from autograder.notebooks.build import notebook_path, sync
    from autograder.notebooks.facts import stale_facts
    path = notebook_path(aid)
    if not path.is_file():
        return [f"{aid}: the source notebook {path.relative_to(course_root())} is missing"]
    assignment = load_course().assignment(aid)
    stale = [f"{aid}: the source notebook says {said}: run `course sync {aid}`"
             for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "markdown"
             for said in stale_facts(assignment, cell.source)]
    changed = [c for c in sync(aid, write=False) if not c.startswith("markdown ")]  # stale facts: said above
    if changed:
        stale.append(f"{aid}: the source notebook is out of date in {', '.join(changed)}: run `course sync {aid}`")
    return stale


def release_problems(aid: str) -> list[str]:
    from autograder.notebooks.build import release_behind, verify
    folder = course_root() / "release" / aid
    if not (folder / f"{aid}.ipynb").is_file():
        return [f"{aid}: no release yet: run `course release {aid}`"]
    problems = verify(aid, folder) + [line for line in [release_behind(aid, folder)] if line]
    return [f"{problem} (run `course release {aid}`)" for problem in problems]


def graded_problems(aid: str, assignment: Assignment) -> list[str]:
    """The reference solution graded full marks and the untouched release 0, without experiments."""
    from autograder.grading.grade import grade_notebook
    from autograder.notebooks.examples import release_notebook, write_solution
    from autograder.reports.tables import lost_points
    problems = []
    with tempfile.TemporaryDirectory(prefix="course-check-") as folder:
        result = grade_notebook(write_solution(aid, folder), aid, device="cpu", experiments=False)
        if result["score"] < result["max_score"]:
            reasons, _ = lost_points(result, limit=3)
            problems.append(f"{aid}: the reference solution scores {result['score']:g}/{result['max_score']:g}: "
                            + "; ".join(reasons))
        empty = Path(folder) / "release" / f"{aid}.ipynb"
        empty.parent.mkdir()
        nbformat.write(release_notebook(aid), empty)
        result = grade_notebook(empty, aid, device="cpu", experiments=False)
        if result["score"] > 0:
            earned = [t["name"] for t in result["tests"] if t["score"] > 0]
            problems.append(f"{aid}: the untouched release scores {result['score']:g}, expected 0 "
                            f"({', '.join(earned[:5])})")
    return problems


def unwritten(aid: str, assignment: Assignment) -> list[str]:
    """Each place `course new` left for the author (TODO(course new)), as 'file:line: what to write'."""
    from autograder.apps.new import PACKAGE, TODO
    from autograder.notebooks.build import notebook_path
    root = course_root()
    lines = course_section(load_course().path.read_text(), aid)
    found = [(f"course.yaml:{number}", text) for number, text in lines]
    for path in (PACKAGE / "suites" / f"test_{aid}.py", PACKAGE / "harness" / f"{aid}.py",
                 root / "tests" / "planted" / f"{aid}.py"):
        if path.is_file():
            shown = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path
            found += [(f"{shown}:{k}", line) for k, line in enumerate(path.read_text().splitlines(), 1)]
    path = notebook_path(aid)
    if path.is_file():
        found += [(f"{path.relative_to(root)} cell {k}", line) for k, cell in
                  enumerate(nbformat.read(path, as_version=4).cells) for line in cell.source.splitlines()]
    said = [(where, re.sub(r"(<!--/fact-->|\"\)?)$", "", line.split(TODO, 1)[1].lstrip(": ").strip()))
            for where, line in found if TODO in line and "<!--fact" not in line.split(TODO, 1)[0]]
    return [f"{aid}: {where}: {text or 'to write'}" for where, text in said]


def course_section(text: str, aid: str) -> list[tuple[int, str]]:
    """(line number, line) of the assignment's section of course.yaml."""
    lines = text.splitlines()
    start = next((k for k, line in enumerate(lines) if line.rstrip() == f"  {aid}:"), None)
    if start is None:
        return []
    end = next((k for k in range(start + 1, len(lines))
                if lines[k].strip() and not lines[k].startswith("   ") and not lines[k].lstrip().startswith("#")),
               len(lines))
    return [(k + 1, lines[k]) for k in range(start, end)]


STAGES = [("what is left to write", unwritten),
          ("solution", solution_problems), ("suite", suite_problems), ("harness", harness_problems),
          ("notebook", lambda aid, _: notebook_problems(aid)), ("release", lambda aid, _: release_problems(aid)),
          ("device checks", device_check_problems), ("edge cases", edge_case_problems)]


def problems_of(aid: str, grade: bool = False, planted: bool = False, mutations: int = 0,
                seeds: int = 0) -> list[str]:
    """Every problem of one assignment, a line each; a stage that cannot run is one line, never a traceback."""
    from autograder.apps import check_deep
    assignment = load_course().assignment(aid)
    problems: list[str] = []
    stages = STAGES + ([("grading", graded_problems)] if grade else []) + (
        [("planted mistakes", check_deep.planted_problems)] if planted else []) + (
        [("mutations", lambda aid, a: check_deep.mutation_problems(aid, a, mutations))] if mutations else []) + (
        [("seeds", lambda aid, a: check_deep.seed_problems(aid, a, seeds))] if seeds else [])
    for stage, run in stages:
        if stage in ("grading", "planted mistakes", "mutations", "seeds") and problems:
            problems.append(f"{aid}: not graded until the problems above are fixed")
            break
        try:
            problems += run(aid, assignment)
        except Exception as e:  # the author's code may be half written: say where, keep checking the rest
            where = "".join(f" ({Path(f.filename).name}, line {f.lineno})" for f in
                            inspect.trace()[-1:]) if inspect.trace() else ""
            problems.append(f"{aid}: the {stage} could not be checked: {type(e).__name__}: {e}{where}")
    return list(dict.fromkeys(problems))  # one line per problem, however many places state it


def check(aids=None, grade=False, planted=False, mutations=0, seeds=0) -> int:
    """`course check`: the problems of each assignment (all when none is named), then a summary; 0 when none."""
    course = load_course()
    aids = list(aids or course.assignments)
    unknown = [aid for aid in aids if aid not in course.assignments]
    if unknown:
        print(f"error: not in course.yaml: {', '.join(unknown)} (it has {', '.join(course.assignments)})",
              file=sys.stderr)
        return 2
    t0, total = time.monotonic(), 0
    for aid in aids:
        problems = problems_of(aid, grade, planted, mutations, seeds)
        total += len(problems)
        for line in problems:
            print(line, flush=True)
        if not problems:
            print(f"{aid}: ok", flush=True)
    slower = [flag for flag, on in (("--grade", grade), ("--planted", planted), ("--mutations", mutations),
                                    ("--seeds", seeds)) if not on]
    print(f"check: {total} problem(s) in {len(aids)} assignment(s) ({time.monotonic() - t0:.0f} s"
          f"{f'; not run: {chr(32).join(slower)} (--full)' if slower else ''})")
    return 1 if total else 0
