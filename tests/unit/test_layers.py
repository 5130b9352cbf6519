"""The grader's layout is its architecture: packages in layers, imports only pointing down, no cycle anywhere.

Every import counts, a function's own included (a deferred import is still a dependency). The student's side of the
sandbox is checked apart: it must import nothing of the grader at all (tests/unit/test_protocol.py loads it alone).
"""
import ast

from autograder.course.config import ROOT

PACKAGE = ROOT / "autograder"
# Lowest first: a module may import from its own layer and the ones before it, never from a later one.
LAYERS = [
    {"errors"},                   # the errors and fault kinds (a leaf)
    {"course"},                   # course.yaml, the course folder, MNIST
    {"sandbox"},                  # the student's process
    {"notebooks"},                # cells, repair, build and release
    {"grading"},                  # one notebook's grading
    {"harness", "suites"},        # the assignments' own training loops and hidden suites
    {"reports"},                  # what people read, from results
    {"batch"},                    # many notebooks
    {"integrations"},             # nbgrader, Otter, Gradescope
    {"apps", "cli"},              # the `course` verbs
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def grader_modules():
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def imported(path):
    """The autograder modules a file imports, anywhere in it (`from autograder.x import y` counts x.y when that is
    a module); a relative import (`from .training import ...`) counts as the absolute name it stands for."""
    found = set()
    package = module_name(path).split(".") if path.is_relative_to(ROOT) else []
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("autograder")}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = ".".join(package[:len(package) - node.level + 1] + ([module] if module else []))
            if module.startswith("autograder"):
                found.add(module)
                found |= {f"{module}.{a.name}" for a in node.names}
    return found


def edges():
    modules = grader_modules()
    return {name: sorted(m for m in imported(path) if m in modules and m != name) for name, path in modules.items()}


def package_of(module):
    return module.split(".")[1]


def test_every_package_has_a_layer_and_a_one_line_docstring():
    top = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
           if (p.suffix == ".py" or (p / "__init__.py").is_file()) and p.name != "__init__.py"}
    assert top == set(LAYER), f"packages without a layer: {sorted(top - set(LAYER))}; stale: {sorted(set(LAYER) - top)}"
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "\n" not in doc.strip(), f"{init.relative_to(ROOT)}: its job in one line, as its docstring"
    modules = [p for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert len(modules) <= 4, \
        f"top-level modules: {[p.name for p in modules]} (a handful at most; the rest in packages)"


def test_imports_point_down():
    wrong = [f"{a} imports {b}" for a, targets in edges().items() for b in targets
             if LAYER[package_of(b)] > LAYER[package_of(a)]]
    assert not wrong, "imports against the layers (lowest first: " \
        + " < ".join("/".join(sorted(n)) for n in LAYERS) + "):\n" + "\n".join(wrong)


def test_no_import_cycle():
    graph, cycles = edges(), []
    state = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_rule_sees_a_wrong_import(tmp_path):
    """The checker itself: an upward import and a cycle in a made-up pair of modules are both found."""
    low, high = tmp_path / "low.py", tmp_path / "high.py"
    low.write_text("def f():\n    from autograder.reports.tables import grade_table\n")
    high.write_text("from autograder.course import config\n")
    inside = PACKAGE / "harness" / "lab14_transformers.py"  # a relative import counts as the name it stands for
    assert "autograder.harness.training" in imported(inside)
    assert "autograder.reports.tables" in imported(low)
    assert {"autograder.course", "autograder.course.config"} <= imported(high)
    assert LAYER["reports"] > LAYER["course"]


def test_student_side_imports_nothing_of_the_grader():
    """The student's side (sandbox/child/) imports nothing outside its own folder: its process loads the folder as
    a package of its own (child/__main__.py), and the grader's three shared files by path (child/helpers.py)."""
    child = PACKAGE / "sandbox" / "child"
    assert (child / "__main__.py").is_file()
    for path in child.rglob("*.py"):
        outside = {m for m in imported(path) if not m.startswith("autograder.sandbox.child")}
        assert not outside, \
            f"{path.relative_to(ROOT)} imports the grader ({sorted(outside)}): the student's process must not"


def test_no_grader_module_over_500_lines():
    """One job per file: a module past 500 lines holds more than one (the hidden suites excepted: a suite is one
    assignment's checks)."""
    long = {name: n for name, path in grader_modules().items() if ".suites." not in name
            and (n := len(path.read_text().splitlines())) > 500}
    assert not long, f"split these by job: {long}"


def test_a_suite_imports_the_grader_through_one_module():
    """A suite author imports what they need from autograder.grading.suite_api (docs/SUITES.md), and that module
    offers every name the three suites use."""
    import autograder.grading.suite_api as api
    for path in sorted((PACKAGE / "suites").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        froms = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("autogr")]
        assert {n.module for n in froms} == {"autograder.grading.suite_api"}, [n.module for n in froms]
        assert all(alias.name in api.__all__ for n in froms for alias in n.names), path.name
