"""Where the hidden suites are, and which checks each one holds (read from its markers)."""
import importlib
from pathlib import Path

SUITES = Path(__file__).resolve().parent.parent / "suites"  # the package's own, wherever it is installed


def suite_path(aid):
    """The hidden suite of an assignment."""
    return SUITES / f"test_{aid}.py"


def suite_checks(aid):
    """{(item, kind): [name of each test function scoring it]} of a suite, read from the markers."""
    module = importlib.import_module(f"autograder.suites.test_{aid}")
    checks = {}
    for name, fn in vars(module).items():
        for mark in getattr(fn, "pytestmark", []) if name.startswith("test_") else []:
            if mark.name == "item":
                checks.setdefault(tuple(mark.args), []).append(name)
    return module, checks
