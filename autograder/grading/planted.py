"""Planted mistakes: an assignment's file of realistic wrong (and right) variants of its reference cells, the cell
each variant makes, and the rounds they are graded in. The files are the course's, `tests/planted/<id>.py` (`course
new` writes one); the meta-tests (tests/test_grading.py) and `course check --planted` read them through here, and
check them by the same rules (RULES).

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


def planted_module(aid, root=None):
    """The course's tests/planted/<aid>.py as a module, read from disk now; None when there is no such file."""
    root = Path(root or course_root())
    path = root / "tests" / "planted" / f"{aid}.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(f"course_planted_{aid}", path)
    assert spec is not None and spec.loader is not None  # a .py file's path always has both
    module = importlib.util.module_from_spec(spec)
    with importable(root):
        spec.loader.exec_module(module)
    return module


def planted_file(aid, root=None, name="PLANTED"):
    """The PLANTED (or another table, `name`: EDGE_SLIPS) of the course's tests/planted/<aid>.py, read from disk now;
    None when there is no such file."""
    module = planted_module(aid, root)
    return None if module is None else getattr(module, name, {})


# --- what a planted file must hold: `course check --planted` and the meta-tests (tests/test_grading.py) read these
# same rules, so an author meets each in `course check` first. Each returns its problems, one line each.

def checks_of(aid, item):
    """The kinds of check of an item that carry points (exists is generic: the signature)."""
    return {k for k in load_course().assignment(aid).items[item].points if k != "exists"}


def item_rules(aid, module):
    """Every item has two planted mistakes and a correct alternative, each mistake naming the checks that catch it,
    of the item's own kinds."""
    spec, problems = getattr(module, "PLANTED", {}), []
    for item in load_course().assignment(aid).items:
        mine = spec.get(item, {})
        if len(mine.get("wrong", {})) < 2:
            problems.append(f"'{item}' needs two planted mistakes (PLANTED['{item}']['wrong'])")
        if len(mine.get("right", {})) < 1:
            problems.append(f"'{item}' needs a correct alternative (PLANTED['{item}']['right'])")
        catches = mine.get("catches", {})
        if set(catches) != set(mine.get("wrong", {})):
            problems.append(f"'{item}': each planted mistake names the checks that catch it (CATCHES['{item}'])")
        problems += [f"'{item}/{name}' names checks {sorted(kinds or [])}, where '{item}' has points for "
                     f"{sorted(checks_of(aid, item))}" for name, kinds in catches.items()
                     if not kinds or not set(kinds) <= checks_of(aid, item)]
    return problems


def wanted_checks(aid):
    return {(item, kind) for item in load_course().assignment(aid).items for kind in checks_of(aid, item)}


def uncaught_checks(aid, module):
    """A check no planted mistake must fail: the rounds assert each mistake's exact catch set, so a check named in
    one cannot become a no-op unnoticed; a check named in none could."""
    named = {(item, kind) for item, s in getattr(module, "PLANTED", {}).items()
             for kinds in s.get("catches", {}).values() for kind in kinds}
    missing = sorted(wanted_checks(aid) - named)
    return [f"checks no planted mistake must fail: {missing}"] if missing else []


def unisolated_checks(aid, module):
    """A check that is the only one to catch no planted mistake, with no reason in NOT_ISOLATED: it could become a
    no-op unnoticed where its mistakes are all caught elsewhere too."""
    exempt = set(getattr(module, "NOT_ISOLATED", {}))
    alone = {(item, next(iter(kinds))) for item, s in getattr(module, "PLANTED", {}).items()
             for kinds in s.get("catches", {}).values() if len(kinds) == 1}
    problems = [f"isolated after all, drop from NOT_ISOLATED: {sorted(alone & exempt)}"] if alone & exempt else []
    missing = sorted(wanted_checks(aid) - alone - exempt)
    return problems + ([f"checks no planted mistake isolates (plant one, or say why in NOT_ISOLATED): {missing}"]
                       if missing else [])


def untrained_experiments(aid, module):
    """A graded experiment with no planted training failure (TRAINING) nor a reason (TRAINING_NOT_PLANTED)."""
    covered = {e for t in getattr(module, "TRAINING", {}).values() for e in t["fails"]}
    covered |= set(getattr(module, "TRAINING_NOT_PLANTED", {}))
    graded = {name for name, e in load_course().assignment(aid).experiments.items() if e.graded}
    missing = sorted(graded - covered)
    return [f"graded experiments without a planted training failure: {missing}"] if missing else []


RULES = (item_rules, uncaught_checks, unisolated_checks, untrained_experiments)


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
    """[(item, name, variant)] packed into rounds in which no item uses another (directly or through others), one
    variant per item, so that one grading judges a round's variants each on its own item: an item's checks run
    only its own code and what it uses. Two items may share a dependent (attention and positional_encoding both
    feed Transformer): the dependent is in both their reaches, whose scores no round judges."""
    deps = dependents(aid)
    pending, out = list(variants), []
    while pending:
        taken: list = []
        rest = []
        for item, name, v in pending:
            if any(item == other or item in deps[other] or other in deps[item] for other, _, _ in taken):
                rest.append((item, name, v))
            else:
                taken.append((item, name, v))
        out.append(taken)
        pending = rest
    return out
