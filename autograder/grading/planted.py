"""Planted mistakes: an assignment's file of realistic wrong (and right) variants of its reference cells, the cell
each variant makes, and the rounds they are graded in. The files are the course's, `tests/planted/<id>.py` (`course
new` writes one); the meta-tests (tests/test_grading.py) and `course check --planted` read them through here.

A file defines PLANTED = {item: {"wrong": {name: variant}, "right": {name: variant}, "catches": {name: kinds}}},
a variant being an (old, new) edit of the item's solved cell or a whole cell.
"""
import importlib.util
import sys
from contextlib import contextmanager
from pathlib import Path

from autograder.course.config import course_root, load_course
from autograder.grading.dependencies import closure, uses
from autograder.notebooks.examples import mutate


@contextmanager
def importable(root: Path):
    """`tests.planted` importable from the course at `root` (a planted file imports its helpers from there)."""
    added = str(root) not in sys.path
    if added:
        sys.path.insert(0, str(root))
    try:
        yield
    finally:
        if added:
            sys.path.remove(str(root))


def planted_file(aid, root=None, name="PLANTED"):
    """The PLANTED (or another table, `name`: EDGE_SLIPS) of the course's tests/planted/<aid>.py, read from disk now;
    None when there is no such file."""
    root = Path(root or course_root())
    path = root / "tests" / "planted" / f"{aid}.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(f"course_planted_{aid}", path)
    assert spec is not None and spec.loader is not None  # a .py file's path always has both
    module = importlib.util.module_from_spec(spec)
    with importable(root):
        spec.loader.exec_module(module)
    return getattr(module, name, {})


def variant_source(aid, item, variant):
    """A planted variant's cell: an (old, new) edit of the reference cell, or a whole cell."""
    return mutate(aid, item, *variant) if isinstance(variant, tuple) else variant


def dependents(aid):
    """item -> the items whose reference code or checks use it, directly or through others (the grader's graph,
    grading/dependencies.py)."""
    assignment = load_course().assignment(aid)
    graph = uses(aid, assignment)
    return {item: {j for j in assignment.items if item in closure(graph, {j})} for item in assignment.items}


def packed(aid, variants):
    """[(item, name, variant)] packed into rounds whose items neither share nor feed each other's dependents, so that
    one grading judges a round's variants each on its own item."""
    deps = dependents(aid)
    pending, out = list(variants), []
    while pending:
        taken, reach, rest = [], set(), []
        for item, name, v in pending:
            mine = {item} | deps[item]
            if mine & reach or any(item == t[0] for t in taken):
                rest.append((item, name, v))
            else:
                taken.append((item, name, v))
                reach |= mine
        out.append(taken)
        pending = rest
    return out
