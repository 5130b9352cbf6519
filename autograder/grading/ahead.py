"""A session's experiments, each trained in a sandbox of its own, several at once where the cores allow.

Each experiment trains in a fresh sandbox that loads the notebook anew, never in the sandbox the checks used: what
the checks did to the student's module state never reaches a training, so a run is the same alone or beside
another, and a grade the same on one core or many (Settings.experiments_at_once, from the cores a grading has:
sandbox/zygote.py experiments_at_once).

With room for more than one, the first experiment (plugin.py puts them after every check, in course.yaml's order)
starts as soon as the notebook has loaded, beside the checks; the others start when the first comes up, each in a
thread of its own; the session then takes each outcome in its order, with its notes. A run started before its
item's checks were done is dropped (its sandbox ended) when they leave the item not ready: the outcome is then the
one a run never started would have. The grader's side of a run (data, the reference's curve, evaluation) and each
test of the session run one at a time (experiments.GRADER_SIDE: torch's global RNG and thread count are the
process's, and Python 3.11's ast.parse is not safe in two threads): only the sandboxes' work overlaps. An
experiment that starts from another's trained model (grading/shared_runs.py) is never started ahead: it runs in
its turn, after the run it reuses.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, wait

import pytest

from autograder.grading import shared_runs
from autograder.grading.experiments import GRADER_SIDE, harness, in_the_sandbox, run_experiment

CLOSE_SECONDS = 30  # an abandoned run ends within a second or two: its sandbox is gone and never restarts


class Experiments:
    """The session's experiment runs: started in order, at most `at_once` at a time, each taken once."""

    def __init__(self, grading, at_once=1):
        self.grading, self.at_once = grading, max(1, at_once)
        self.runs = {}  # experiment name -> (Future of its Outcome, its TA notes, its sandbox or None)
        self.restarts = 0  # of the taken runs' sandboxes, after a crash or a limit (results.json's `restarts`)
        self.started_early = False
        self.dropped = []  # the futures of runs ended before their turn (close waits for their threads)

    def outcome(self, test, why):
        """The experiment's Outcome (test: its GeneratedCheck; why: the reason it cannot run, or ''); the ones
        that follow it in the session start beside it when there is room."""
        name = test.experiment.name
        if why and name in self.runs:  # started beside the checks, which then left its item not ready
            self.drop(name)
        if name not in self.runs:
            self.start(test.experiment, why)
        tests = list(test.session.items)
        for later in self.startable(tests[tests.index(test) + 1:]):
            if sum(not run[0].done() for run in self.runs.values()) >= self.at_once:
                break
            self.start(later.experiment, self.grading.experiment_why(later.course_item))
        future, notes, sandbox = self.runs.pop(name)
        with in_the_sandbox():
            outcome = future.result()
        self.restarts += sandbox.restarts if sandbox is not None else 0
        self.grading.ta_notes.extend(n for n in notes if n not in self.grading.ta_notes)
        return outcome

    def start_early(self, session):
        """Start the session's first experiment beside its checks (the session's sandbox keeps one core busy),
        once the notebook has loaded; its outcome is kept only if the checks leave its item ready."""
        known = self.grading.code.problems  # an item the notebook lacks, say: its run would not be kept
        for test in [t for t in self.startable(session.items) if not known.get(t.course_item)][:self.at_once - 1]:
            self.start(test.experiment, "")

    def startable(self, tests):
        """The experiments of `tests` (the session's, in order, up to the first test that is not one after an
        experiment) that may start before their turn: not yet started, and not starting from another
        experiment's trained model. None when one run at a time."""
        if self.at_once <= 1:
            return []
        g = self.grading
        assignment, experiments, out = g.assignment, harness(g.aid).EXPERIMENTS, []
        for later in tests:
            exp = getattr(later, "experiment", None)
            if exp is None:
                if out:
                    break
                continue
            if exp.name not in self.runs and not shared_runs.reused_here(assignment, exp.name,
                                                                           experiments[exp.name]):
                out.append(later)
        return out

    # --- the session's hooks (plugin.py registers this object) ------------------------------------------

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_setup(self, item):
        """Once the session's sandbox has loaded the notebook (at its first test), the first runs start."""
        if not self.started_early and self.grading.sandbox is not None:
            self.started_early = True
            self.start_early(item.session)

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        """Each test and the grader's side of the runs in their threads take turns (experiments.GRADER_SIDE); an
        experiment's test lets go while it waits for its run (outcome)."""
        with GRADER_SIDE:
            yield

    def sandbox(self):
        """A sandbox of the submission's code for one run, not started (its training starts it), or None when the
        notebook's code could not be loaded at all (the session has no sandbox)."""
        return None if self.grading.sandbox is None else self.grading.new_sandbox()

    def start(self, exp, why):
        """Run `exp` in a fresh sandbox: now, in this thread, when one run at a time; else in a thread of its own."""
        g, notes, future = self.grading, [], Future()
        sandbox = None if why else self.sandbox()

        def run():
            outcome, error = None, None
            try:
                outcome = run_experiment(g.course, g.aid, exp, g.code, sandbox, g.device, why=why, notes=notes)
            except BaseException as e:  # the session's thread raises it when it takes the outcome
                error = e
            if sandbox is not None:  # ended before the session takes the outcome
                sandbox.kill()
            if error is None:
                future.set_result(outcome)
            else:
                future.set_exception(error)
        self.runs[exp.name] = (future, notes, sandbox)
        if self.at_once <= 1:
            run()
        else:  # a daemon: an interrupted grader exits without waiting for it (its sandbox ends with the grader)
            threading.Thread(target=run, name=f"experiment-{exp.name}", daemon=True).start()

    def drop(self, name):
        """End a run no one will take: its sandbox ends now and never restarts; its outcome and notes are lost."""
        future, _, sandbox = self.runs.pop(name)
        self.dropped.append(future)
        if sandbox is not None and not future.done():
            sandbox.abandon()

    def close(self):
        """End the runs no one took (the session ended early), and wait (bounded) for every run's thread to end:
        none outlives its session (a batch worker grades the next submission in the same process)."""
        futures = [future for future, _, _ in self.runs.values()] + self.dropped
        for name in list(self.runs):
            self.drop(name)
        wait(futures, timeout=CLOSE_SECONDS)
