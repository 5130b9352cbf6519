"""Mutation test of the meta-tests: each suite check in turn becomes a no-op; some planted test must then fail.

For every (item, kind) a suite scores, its test function is replaced in this process by one that does nothing and the
planted-mistake rounds that hold that item are run with pytest; the tests that failed are the ones that caught
the no-op. A check that no test catches is printed as SURVIVED. Not run in CI (about half a minute a check).

    python tools/mutate_checks.py [ID ...] [--item NAME]
"""
import argparse
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autograder.course.config import load_course  # noqa: E402
from autograder.grading.suite_files import suite_checks  # noqa: E402
from tests.planted import rounds  # noqa: E402


class Failed:
    """pytest plugin: the node ids of the tests that failed."""

    def __init__(self):
        self.ids = []

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.ids.append(report.nodeid)


def catchers(aid, item, kind):
    """The planted tests that fail while (item, kind) of aid's suite does nothing."""
    module, checks = suite_checks(aid)
    ids = [f"{aid}-round{k}" for k, batch in enumerate(rounds(aid)) if any(i == item for i, _, _ in batch)]
    if not ids:
        return None
    originals = {name: getattr(module, name) for name in checks[(item, kind)]}
    for name, fn in originals.items():
        def does_nothing(student, rng):
            pass
        does_nothing.pytestmark = fn.pytestmark  # still scores (item, kind)
        setattr(module, name, does_nothing)
    try:
        failed = Failed()
        tests = [f"{ROOT}/tests/test_grading.py::test_planted_mistakes_lose_points_on_their_item_only[{i}]"
                 for i in ids]
        pytest.main(["-q", "-p", "no:cacheprovider", "--no-header", "--tb=no", "-p", "no:warnings", *tests],
                    plugins=[failed])
        return failed.ids
    finally:
        for name, fn in originals.items():
            setattr(module, name, fn)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ids", nargs="*")
    parser.add_argument("--item")
    args = parser.parse_args()
    course = load_course()
    survived = []
    for aid in args.ids or list(course.assignments):
        for (item, kind) in suite_checks(aid)[1]:
            if args.item and item != args.item:
                continue
            t0 = time.monotonic()
            caught = catchers(aid, item, kind)
            line = f"{aid}.{item}: {kind} -> " + ("no planted round holds this item" if caught is None else
                                                 ", ".join(c.split("[")[-1].rstrip("]") for c in caught) or "SURVIVED")
            print(f"MUTANT {line} ({time.monotonic() - t0:.0f} s)", flush=True)
            if not caught:
                survived.append(f"{aid}.{item}: {kind}")
    print("\nsurvived (no test noticed the check doing nothing):" if survived else "\nevery no-op check was caught")
    for s in survived:
        print(f"  {s}")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
