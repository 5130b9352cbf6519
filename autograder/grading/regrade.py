"""Independent grading (course.yaml `dependencies: independent`): an item that failed while an item it uses had
failed its own checks is graded again with the reference of each such item standing in, and keeps the better result.

The graph, the stand-in and why it is safe: autograder/grading/dependencies.py. Here, the plugin's side: when to
regrade, the regrade's own sandbox, and what a kept regrade shows. A kept regrade shows its scores, never its
messages: a failed check keeps the first run's message (about the student's own code), a passed one says "ok",
and each carries the one-line note. What the student's code printed or raised there never reaches the student
(it ran next to the references). Every check's and experiment's outcome records the points the swap restored
(`extra_data.restored`, summed per item in the class report).
"""
from __future__ import annotations

import copy
import time

import pytest
from _pytest.runner import runtestprotocol

from autograder.grading.dependencies import STANDIN_CELL, closure, experiment_uses, note, standin_cell
from autograder.grading.experiments import harness, run_experiment
from autograder.grading.scoring import Outcome, zero_reason
from autograder.sandbox.grader_side import SandboxFailure, StudentRaised


def is_experiment(kind):
    return kind.startswith("experiment")


class Regrades:
    """The plugin's companion in a graded session: after an item's last check, its regrade when it is due."""

    def __init__(self, grading):
        self.grading = grading
        self.checks = {}  # item -> its checks' tests left after deselection, in order (experiments not included)
        self.order, self.current = [], None  # the session's tests, and the one running
        self.kept = {}  # item or experiment -> the items whose references stood in for the result it kept

    def pytest_collection_finish(self, session):
        self.order = list(session.items)
        for test in session.items:
            mark = test.get_closest_marker("item")
            if mark and not is_experiment(mark.args[1]):
                self.checks.setdefault(mark.args[0], []).append(test)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.current = item
        yield
        g = self.grading
        if not g.independent or g.grader_error or not item.get_closest_marker("item"):
            return
        name, kind = item.get_closest_marker("item").args
        following = nextitem.get_closest_marker("item").args if nextitem is not None else None
        if is_experiment(kind) or (following and following[0] == name and not is_experiment(following[1])):
            return
        g.finish_item(name)
        regrade_checks(g, name, self.checks.get(name, []), nextitem)

    def pytest_terminal_summary(self, terminalreporter):
        """The TA's terminal (`pytest ... --submission`) reports each test's first run: say what a regrade kept."""
        for what, swapped in self.kept.items() if self.grading.results is not None else []:
            terminalreporter.write_line(f"{what}: {note(swapped)}; the failures reported above for it are its first "
                                        f"run's (results.json has the scores kept)")

    def fits(self, cost, what):
        """Whether `cost` more seconds leave the tests after the running one their worst case within the session's
        time budget (Settings.budget_end); if not, the TA is told that `what` was not regraded."""
        g = self.grading
        if g.settings.budget_end is None:
            return True
        rest = self.order[self.order.index(self.current) + 1:] if self.current in self.order else []
        marks = [t.get_closest_marker("item").args for t in rest if t.get_closest_marker("item")]
        need = cost + sum(g.course.limits_for(g.aid, i).item_seconds for i in dict.fromkeys(
            i for i, k in marks if not is_experiment(k)))
        need += sum(experiment_seconds(g, g.assignment.experiments[k.split(" ", 1)[1]])
                    for _, k in marks if is_experiment(k))
        if time.monotonic() + need <= g.settings.budget_end:
            return True
        g.ta_notes.append(f"{what} was not regraded with the references of its failed dependencies: it would not "
                          f"fit the time budget")
        return False


def load_seconds(grading):
    """The longest a regrade's sandbox may take to load the notebook (Sandbox._load_cells's limit)."""
    return grading.course.limits.setup_seconds * max(1, (len(grading.code.cells) + 1) // 4 + 1)


def experiment_seconds(grading, exp):
    """The longest one experiment may train: every seed at its limit."""
    return grading.course.limits_for(grading.aid, exp.item).experiment_seconds * len(exp.seeds)


def checks_failed(grading, item):
    """Whether the item's kept checks (its experiments not counted) lost points in this session."""
    outcomes = [o for (i, k), o in grading.outcomes.items()
                if i == item and not is_experiment(k) and (i, k) in grading.selected]
    return any(o.score < o.max_score for o in outcomes)


def failed_among(grading, items):
    """The items of `items` whose checks failed, in this session or an earlier one of the same submission (in a
    time budget): the only ones ever swapped."""
    return {i for i in items if (i in grading.states and checks_failed(grading, i))
            or (i not in grading.wanted and i in grading.settings.failed_elsewhere)}


def standin_sandbox(grading, swapped):
    """A sandbox of the student's cells with the references of `swapped` bound after them; None if it cannot load."""
    code = copy.copy(grading.code)
    code.cells = [*grading.code.cells, standin_cell(grading.aid, swapped, len(grading.code.cells))]
    sandbox = grading.new_sandbox(code.cells)
    try:
        sandbox.start()
    except (SandboxFailure, StudentRaised) as e:
        sandbox.kill()
        grading.ta_notes.append(f"the regrade with the reference {sorted(swapped)} could not start: {e}")
        return None, code
    if STANDIN_CELL in sandbox.load_errors:  # the student's names got in the way: no regrade, nothing lost
        sandbox.kill()
        return None, code
    return sandbox, code


def total(outcomes):
    return sum(o.score for o in outcomes.values())


def zero(grading, item, outcomes, state, reason):
    """The whole item scores 0 for `reason` (scoring.py's rules 2 and 3), whichever run it comes from."""
    for o in outcomes.values():
        o.score, o.output = 0.0, reason
    grading.outcomes.update(outcomes)
    state.zeroed = reason
    grading.states[item] = state


def regrade_checks(grading, item, tests, nextitem):
    """Run the item's checks again with the references of its failed dependencies; keep the better result.

    A stub is a stub whoever's code raised first: an item whose checks met only another item's NotImplementedError
    scores 0 (that item's reason) when no regrade could run, and 0 (its own) when the regrade met its own.
    """
    state = grading.states.get(item)
    if state is None or state.zeroed or not checks_failed(grading, item):
        return
    first = {k: o for k, o in grading.outcomes.items() if k[0] == item and not is_experiment(k[1])}
    exists = first.get((item, "exists"))
    swapped = failed_among(grading, closure(grading.graph, {item}))
    due = swapped and not (exists and exists.failed) and grading.regrades.fits(
        grading.course.limits_for(grading.aid, item).item_seconds + load_seconds(grading), f"'{item}'")
    sandbox = standin_sandbox(grading, swapped)[0] if due else None
    if sandbox is None:
        stub = next((o.not_implemented_in for o in first.values() if o.not_implemented_in), "")
        if stub:
            zero(grading, item, first, state, zero_reason(item, "", False, stub))
        return
    main, grading.sandbox = grading.sandbox, sandbox
    grading.states.pop(item)
    for key, o in first.items():
        grading.outcomes[key] = Outcome(item, key[1], o.max_score)
    try:
        for test, after in zip(tests, [*tests[1:], nextitem], strict=True):
            runtestprotocol(test, log=False, nextitem=after)
        grading.finish_item(item)
    finally:
        grading.sandbox = main
        sandbox.kill()
    again = {k: grading.outcomes[k] for k in first}
    if grading.states[item].zeroed:  # its own stub or oracle showed once its dependency answered: 0 as rules say
        zero(grading, item, first, grading.states[item], grading.states[item].zeroed)
        return
    if grading.grader_error or total(again) <= total(first):
        grading.outcomes.update(first)
        grading.states[item] = state
        return
    line, names = note(swapped), " and ".join(f"`{n}`" for n in sorted(swapped))
    for key, o in again.items():
        before = first[key]
        if o.score >= o.max_score:
            o.output = before.output if not before.failed else "ok"
        else:  # the first run's message: the regrade's own could carry what the student's code read there
            o.output, o.extra = (before.output if before.failed else "", dict(before.extra))
            o.output += ("\n" if o.output else "") + (f"it fails with the reference in place as well (that run's "
                                                       f"details are not shown: fix {names} first to see them)")
        o.output += "\n" + line
        o.extra.update({"regraded_with": sorted(swapped), "restored": o.score - before.score})
    grading.regrades.kept[item] = swapped


def regrade_experiment(grading, exp, outcome, why):
    """The experiment's outcome, trained again with the references of its failed parts when it failed."""
    independent = grading.course.dependencies_for(grading.aid, exp.name) == "independent"
    if outcome.score >= outcome.max_score or why or not independent:
        return outcome
    swapped = failed_among(grading, experiment_uses(grading.aid, grading.assignment, exp, grading.graph,
                                                    harness(grading.aid)))
    if not swapped or not grading.regrades.fits(load_seconds(grading) + experiment_seconds(grading, exp),
                                                f"experiment {exp.name}"):
        return outcome
    sandbox, code = standin_sandbox(grading, swapped)
    if sandbox is None:
        return outcome
    try:
        again = run_experiment(grading.course, grading.aid, exp, code, sandbox, grading.device,
                               notes=grading.ta_notes)
    finally:
        sandbox.kill()
    if again.score <= outcome.score:
        return outcome
    # the verdict and the passing seed's figures (measured here): an earlier seed's error is the student's text
    lines = again.output.splitlines()
    again.output = "\n".join([lines[0], lines[-1], note(swapped)])
    again.extra.update({"regraded_with": sorted(swapped), "restored": again.score - outcome.score})
    grading.regrades.kept[f"experiment {exp.name}"] = swapped
    return again
