"""Scoring: each check's outcome, the rules that act on a whole item, and results.json.

The rules, in the order they apply to an item:
1. a check passes or fails on its own, with the checker's message (and the case it failed on);
2. a from-scratch item whose cell names its oracle, or whose code called it while checked (any function course.yaml's
   `oracles` lists for the name, however reached: the sandbox watches the functions themselves, see
   autograder/sandbox/child/tripwire.py), scores 0 on every check and experiment, with that one reason; its
   experiment's training calling it fails that experiment;
3. otherwise, a stub (any check saw NotImplementedError raised in the item's own cell) scores 0 on every check,
   with one reason; one raised in the cell of another item it calls is that item's: the caller is regraded with
   that item's reference under `dependencies: independent` (regrade.py), else it scores 0 saying whose stub it met.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

import torch

from autograder.notebooks.cells import names_used
from autograder.notebooks.public_checks import MIXED_DEVICES

if TYPE_CHECKING:
    from autograder.course.config import Assignment, Course, Item

NOT_IMPLEMENTED = "NotImplementedError"
# where sandbox child's describe() says a student's frame raised
CELL_FRAME = re.compile(r"\(cell ([^()]*), line \d+\)$")
DISTRIBUTION = "attention-course"  # pyproject.toml's [project] name: the package's version comes from its metadata


class CheckResult(TypedDict):
    """One check (item, kind) in results.json's `tests`: Gradescope's test fields, plus the item it scores."""
    item: str
    name: str  # "<item>: <kind>"
    score: float
    max_score: float
    status: Literal["passed", "failed"]
    output: str  # the checker's message: what was expected, what came back, on which case
    visibility: str
    seconds: float
    extra_data: NotRequired[dict[str, Any]]  # a failed check's case; an experiment's metrics and seed


class Results(TypedDict):
    """results.json: Gradescope's format (score, output, visibility, tests), read by nbgrader's and Otter's paths."""
    score: float
    max_score: float
    output: str
    visibility: str
    tests: list[CheckResult]
    extra_data: dict[str, Any]  # assignment, notebook, device, seed, isolation, restarts, seconds, versions, notes


def seed_for(*parts: object) -> int:
    """A check's input seed: fresh per course seed, item and check, the same every run."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:4], "big")


class Outcome:
    """One (item, kind)'s result in the shape results.json wants; every test scoring it must pass for its points."""

    def __init__(self, item: str, kind: str, max_score: float) -> None:
        self.item, self.kind, self.max_score = item, kind, float(max_score)
        self.score, self.output, self.seconds = 0.0, "", 0.0
        self.not_implemented = False     # a check saw NotImplementedError raised in the item's own cell
        self.not_implemented_in = ""     # ... or in another item's cell, which the item calls: that item
        # a failed check's case; an experiment's measured metrics and the seed that gave them
        self.extra: dict[str, Any] = {}
        self.failed = False   # one of its tests failed (a kind may have several: parametrized checks)

    def add(self, passed: bool, output: str, seconds: float, case: str = "") -> None:
        """Fold in one test's result: the first failure's message and case are the ones shown."""
        self.seconds += seconds
        if passed and not self.failed:
            self.score, self.output = self.max_score, self.output or output
        elif not passed and not self.failed:
            self.failed, self.score, self.output = True, 0.0, output
            if case:
                self.extra["case"] = case

    def raised(self, item: str, error: str, items: Iterable[str]) -> str:
        """Fold in the student's exception: a NotImplementedError raised in another item's cell (`items`) is that
        item's, never this one's, and a device mix-up met there may be this one's; the words that say so, or ''."""
        cell, stub = raised_in(error), error.startswith(NOT_IMPLEMENTED)
        if cell != item and cell in items and MIXED_DEVICES.search(error):
            # the op that meets two devices is rarely where the stray tensor was made: often the caller made it
            return (f"; '{cell}' was handed a tensor on another device: look where '{item}' and what it calls "
                    f"make tensors")
        if cell != item and cell in items:
            self.not_implemented_in = self.not_implemented_in or (cell if stub else "")
            return f"; the error is in '{cell}', which '{item}' calls (see that item)"
        self.not_implemented |= stub
        return ""

    def as_test(self) -> CheckResult:
        test: CheckResult = {"item": self.item, "name": f"{self.item}: {self.kind}", "score": self.score,
                "max_score": self.max_score, "status": "passed" if self.score >= self.max_score else "failed",
                "output": self.output, "visibility": "visible", "seconds": round(self.seconds, 3)}
        if self.extra:
            test["extra_data"] = self.extra
        return test


class ItemState:
    """What the grading rules remember about one item while its tests run."""

    def __init__(self, problem: str, scratch_hit: str, deadline: float) -> None:
        self.problem = problem          # why its remaining checks are not run
        self.scratch_hit = scratch_hit  # the oracle its cell names, for a from-scratch item
        self.deadline = deadline        # one time limit across all its checks
        self.oracle_calls: set[str] = set()       # oracles the runtime tripwire saw it call
        self.zeroed: str | None = None              # rules 2 and 3, once its checks are done: the reason, or ''


def scratch_violation(spec: Item, source: str | None, own: Iterable[str] = ()) -> str:
    """The oracle name a from-scratch item's cell mentions in code (comments and strings don't count). An oracle
    named as one of the student's own graded functions (`own`: `layer_norm` beside F.layer_norm) counts only as an
    attribute or an import (`F.layer_norm`), never as the bare name that calls the student's own function."""
    if not spec.from_scratch or source is None:
        return ""
    names, attributes, own = names_used(source) or set(), names_used(source, bare=False) or set(), set(own)
    return next((oracle for oracle in spec.from_scratch
                 if oracle in (attributes if oracle in own else names)), "")


def tripwire_table(course: Course, assignment: Assignment) -> dict[str, dict[str, Any]]:
    """What the sandbox watches for an assignment: {"oracles": name -> dotted paths, "scratch": item -> names,
    "experiments": experiment -> item}, only for the oracles its from-scratch items name."""
    scratch = {item: list(spec.from_scratch) for item, spec in assignment.items.items() if spec.from_scratch}
    names = {name for names in scratch.values() for name in names}
    oracles = {**course.oracles, **assignment.oracles}
    return {"oracles": {name: list(oracles[name]) for name in sorted(names)}, "scratch": scratch,
            "experiments": {e.name: e.item for e in assignment.experiments.values() if e.item in scratch}}


def raised_in(message: str) -> str:
    """The cell (grade_id) whose code raised, from the sandbox's description of a student's error; '' if none."""
    match = CELL_FRAME.search(message)
    return match.group(1) if match else ""


def zero_reason(item: str, oracle_used: str, not_implemented: bool, stub_called: str = "") -> str:
    """Why every check of the item scores 0 (rules 2 and 3), or ''.

    `stub_called`: the other item whose NotImplementedError the item's checks met, when no regrade with its
    reference could run (autograder/grading/regrade.py; always, under `dependencies: cascade`).
    """
    if oracle_used:
        # a from-scratch item that calls its oracle has shown nothing of its own, whatever else passed or failed
        return (f"'{item}' uses {oracle_used}; this item is written from scratch, so the oracle it is compared "
                f"with may not be called, however it is reached (the whole item scores 0)")
    if not_implemented:
        return f"'{item}' is not implemented yet (it raises NotImplementedError)"
    if stub_called:
        return (f"'{item}' calls '{stub_called}', which is not implemented yet, so '{item}' could not be checked "
                f"(the whole item scores 0)")
    return ""


def grader_version() -> str:
    """The installed package's version, or 'unknown' where it runs from a checkout that was never installed."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def results_json(outcomes: list[Outcome], *, aid: str, notebook: str | Path, device: str, seed: int, output: str,
                 isolation: str | None, restarts: int, seconds: float, notes: list[str]) -> Results:
    """results.json (Gradescope's format, which nbgrader's and Otter's paths read too) as a dict."""
    tests = [o.as_test() for o in outcomes]
    return {
        "score": round(sum(t["score"] for t in tests), 4),
        "max_score": sum(t["max_score"] for t in tests),
        "output": output,
        "visibility": "visible",
        "tests": tests,
        "extra_data": {"assignment": aid, "notebook": Path(notebook).name, "device": device, "seed": seed,
                       "isolation": isolation or "none", "restarts": restarts, "seconds": round(seconds, 2),
                       "versions": {"torch": str(torch.__version__), "python": platform.python_version(),
                                    "autograder": grader_version()},
                       "notes": notes},
    }
