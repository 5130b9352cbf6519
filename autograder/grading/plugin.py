"""The grading pytest plugin: `pytest autograder/suites/test_<id>.py --submission NB` grades one notebook.

A hidden suite is a plain pytest module. Each check is a test marked with the course item and the check kind
it scores, `@pytest.mark.item("scaled_dot_product_attention", "values")`, taking the fixtures defined here:
`student` (the submission's code, in its sandbox), `rng` (the check's seeded generator), `device` and `ref`
(the reference solution). Points stay in course.yaml. The plugin adds the generic `exists` check and the
lecture's experiments as tests of their own, runs each item's tests in course.yaml's order (CHECK_ORDER within
an item) and the experiments after all of them in theirs (grading/ahead.py trains them side by side), applies the
grading rules of autograder/grading/scoring.py, regrades an item whose failed dependency failed it (course.yaml
`dependencies`, autograder/grading/regrade.py) and writes results.json.

A suite imports what it needs of this module through autograder.grading.suite_api. PYTEST_DONT_REWRITE
"""
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from autograder.course.config import CHECK_ORDER, load_course, released_notebook
from autograder.errors import UNUSABLE, ConfigError, GraderError
from autograder.grading.ahead import Experiments
from autograder.grading.cache import atomic_write
from autograder.grading.checks import Fail, check_signature
from autograder.grading.dependencies import uses
from autograder.grading.device_check import CHECKS_DEVICE, DeviceCheck, placement
from autograder.grading.experiments import harness_sources, reference_parts, resolve_device
from autograder.grading.regrade import Regrades, regrade_experiment
from autograder.grading.scoring import (
    ItemState,
    Outcome,
    results_json,
    scratch_violation,
    seed_for,
    tripwire_table,
    zero_reason,
)
from autograder.grading.student import Student
from autograder.notebooks.cells import load_student_code, restore_setup_cells
from autograder.sandbox.grader_side import Fresh, Opaque, Remote, Sandbox, SandboxFailure, Seeded, StudentRaised

__all__ = ["Fresh", "Opaque", "Remote", "Seeded", "reference", "Settings", "Grading", "GRADER_FAILED"]

GRADER_FAILED = 70  # a session's exit code when the grader itself failed (EX_SOFTWARE): nothing was scored, rerun
GRADING = pytest.StashKey["Grading"]()  # the session's Grading in config.stash; absent when nothing is graded
def reference(aid: str) -> SimpleNamespace:
    """The reference solution (solutions/<id>.py) as one namespace: what a suite compares against."""
    return reference_parts(aid)


@dataclass(kw_only=True)
class Settings:
    """What one graded session is asked to do (the command line's options, or grade_notebook's arguments)."""
    submission: Path
    assignment: str | None = None     # None: from the suite's file name, test_<id>.py
    device: str = "auto"              # auto: course.yaml's device
    items: list | None = None         # grade only these items
    experiments: bool = True
    limits: dict | None = None        # overrides of course.yaml's limits, e.g. {"item_seconds": 5}
    threads: int | None = None        # the sandbox's CPU threads, when several submissions share the cores
    experiments_at_once: int = 1      # experiments trained side by side, each in its own sandbox (grading/ahead.py)
    log: Callable | None = None       # called with each item's name as its first test starts
    results_json: Path | None = None  # where to write results.json
    failed_elsewhere: frozenset = frozenset()  # grade_within_budget: items failed in its earlier sessions
    budget_end: float | None = None            # ... and its time.monotonic() end (a regrade uses only the slack)


# --- command line, markers and fixtures ----------------------------------------------------------

def pytest_addoption(parser):
    group = parser.getgroup("course", "grading a submission with a hidden suite")
    group.addoption("--submission", metavar="NOTEBOOK", help="the notebook to grade")
    group.addoption("--assignment", metavar="ID", help="the assignment (default: from the suite's name, test_<ID>.py)")
    group.addoption("--device", dest="course_device", default="auto", help="cpu, cuda or auto (course.yaml's device)")
    group.addoption("--results-json", metavar="OUT", help="also write the scores as results.json to OUT")
    group.addoption("--no-experiments", action="store_true", help="leave out the training experiments")


def pytest_configure(config):
    config.addinivalue_line("markers", "item(name, kind): the course.yaml item and check kind this test scores")
    submission = config.getoption("submission")
    if submission and grading_of(config) is None:  # grade_notebook registers its own Grading
        out = config.getoption("results_json")
        config.pluginmanager.register(Grading(Settings(
            submission=Path(submission), assignment=config.getoption("assignment"),
            device=config.getoption("course_device"), experiments=not config.getoption("no_experiments"),
            results_json=Path(out) if out else None)), "course-grading")


def pytest_collection_modifyitems(config, items):
    if grading_of(config) is None and any(t.get_closest_marker("item") for t in items):
        raise pytest.UsageError("these are hidden grading checks: "
                                "name the notebook to grade with --submission NOTEBOOK")


def grading_of(config):
    """The session's Grading plugin, or None when no submission is being graded."""
    return config.stash.get(GRADING, None)


@pytest.fixture
def student(request: pytest.FixtureRequest) -> Student:
    """The submission's code seen from the grader (autograder.grading.student.Student), bound to this test's item,
    on the CPU or, in a shapes check's second run, on meta (device_check.py)."""
    return grading_of(request.config).student_for(request.node, placement(request))


@pytest.fixture
def rng(student: Student) -> torch.Generator:
    """This check's own generator, seeded per course seed, item and kind: draw every input from it."""
    return torch.Generator().manual_seed(student.seed)


@pytest.fixture
def ref(request: pytest.FixtureRequest) -> SimpleNamespace:
    """The reference solution's parts."""
    return reference(grading_of(request.config).aid)


def check_of(test):
    """(item, kind) a test scores."""
    return tuple(test.get_closest_marker("item").args)


class GeneratedCheck(pytest.Item):
    """A test the plugin adds to every suite: an item's `exists` check, a missing check, or an experiment."""

    def __init__(self, *, course_item, course_kind, experiment=None, **kwargs):
        super().__init__(**kwargs)
        self.course_item, self.course_kind, self.experiment = course_item, course_kind, experiment
        self.add_marker(pytest.mark.item(course_item, course_kind))
        self.extra_keyword_matches.add(course_item)

    def runtest(self):
        grading_of(self.config).run_generated(self)

    def reportinfo(self):
        return self.path, None, self.name


# --- one graded session ----------------------------------------------------------------------------

class Grading:
    """One graded session: the submission's code, its sandbox, the item rules and the outcomes."""

    def __init__(self, settings):
        self.settings = settings
        self.outcomes = {}      # (item, kind) -> Outcome, in grading order
        self.states = {}        # item -> ItemState
        self.students = {}      # nodeid -> the Student a running test was given
        self.selected = set()   # (item, kind) with at least one test left after -k / deselection
        # set by configure() once the suite is collected: course.yaml, the assignment, the submission's code
        self.course, self.assignment, self.aid, self.device = None, None, None, None
        self.wanted = []        # the items graded, in course.yaml's order
        self.code = None        # the submission's cells (autograder.notebooks.cells.load_student_code)
        self.notes = []         # what was repaired or failed to load: in the student's output and extra_data.notes
        self.sandbox, self.started, self.current_item, self.results = None, False, None, None
        self.grader_error, self.grader_exception = "", None  # the grader's failure, and the exception it came from
        self.ta_notes = []      # the grader's warnings for the TA (extra_data.notes), never in a student's output
        self.independent, self.graph = False, {}  # course.yaml `dependencies`; item -> the graded items it uses
        self.asked_before = 0   # the sandbox's request count as the running test's call began (judge)
        self.experiments = Experiments(self, settings.experiments_at_once)
        self.t0 = time.monotonic()

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config):
        """Where the fixtures and generated tests find this session (grading_of)."""
        config.stash[GRADING] = self
        self.regrades = Regrades(self)
        config.pluginmanager.register(self.regrades, "course-regrades")
        config.pluginmanager.register(self.experiments, "course-experiments")
        config.pluginmanager.register(DeviceCheck(self.ta_notes), "course-device-check")

    # --- collection: one suite, ordered by course.yaml, with the generated tests -------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session, config, items):
        marked = [t for t in items if t.get_closest_marker("item")]
        if not marked:
            raise pytest.UsageError("no test marked @pytest.mark.item(name, kind) was collected: "
                                    "give a hidden suite, autograder/suites/test_<ID>.py")
        unmarked = [t.nodeid for t in items if not t.get_closest_marker("item")]
        if unmarked:
            raise pytest.UsageError(f"{unmarked[0]} has no @pytest.mark.item(name, kind): every test of a suite "
                                    f"scores one check of one item")
        self.configure({t.module.__name__.rsplit(".", 1)[-1].removeprefix("test_") for t in marked})
        by_check = {}
        for t in marked:
            item, kind = check_of(t)
            spec = self.assignment.items.get(item)
            if spec is None or kind == "exists" or kind not in spec.points:
                raise pytest.UsageError(f"{t.nodeid}: course.yaml gives no points to {kind!r} of {item!r} in "
                                        f"{self.aid} (exists is the plugin's own check)")
            t.extra_keyword_matches.add(item)
            by_check.setdefault((item, kind), []).append(t)
        # every check, then the experiments in course.yaml's order: each may swap in the reference for a failed item
        # (regrade.py), and at the end they train side by side, the first listed beside the checks (ahead.py)
        parent, ordered = marked[0].parent, []
        for item in self.wanted:
            spec = self.assignment.items[item]
            for kind in (k for k in CHECK_ORDER if k in spec.points):
                ordered += by_check.get((item, kind)) or [GeneratedCheck.from_parent(
                    parent, name=f"{kind}[{item}]", course_item=item, course_kind=kind)]
                self.outcomes[(item, kind)] = Outcome(item, kind, spec.points[kind])
        for exp in self.assignment.experiments.values() if self.settings.experiments else []:
            if exp.graded and exp.item in self.wanted:
                kind = f"experiment {exp.name}"
                ordered.append(GeneratedCheck.from_parent(
                    parent, name=f"experiment[{exp.name}]", course_item=exp.item, course_kind=kind, experiment=exp))
                self.outcomes[(exp.item, kind)] = Outcome(exp.item, kind, exp.points)
        dropped = [t for t in marked if check_of(t)[0] not in self.wanted]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = ordered

    def pytest_collection_finish(self, session):
        # an unmarked test is already a usage error (reported by collection); it must not crash this hook too
        self.selected = {check_of(t) for t in session.items if t.get_closest_marker("item")}

    def configure(self, suites):
        """The assignment, its items and the device, and the submission's code with the released setup cells."""
        s = self.settings
        if s.assignment is None and len(suites) != 1:
            raise pytest.UsageError(f"one suite per session (got {sorted(suites)}), or name it with --assignment")
        self.aid = s.assignment or next(iter(suites))
        course = load_course()
        if s.limits:
            course = course.model_copy(update={"limits": course.limits.model_copy(update=s.limits)})
        try:
            self.assignment = course.assignment(self.aid)
            self.device = resolve_device(s.device if s.device != "auto" else course.device)
        except (ConfigError, RuntimeError) as e:
            raise pytest.UsageError(str(e)) from None
        self.course = course
        self.independent = course.dependencies_for(self.aid) == "independent"
        self.graph = uses(self.aid, self.assignment)
        self.wanted = [i for i in self.assignment.items if s.items is None or i in s.items]
        self.code = load_student_code(s.submission, list(self.assignment.items))
        try:  # the released setup cells replace the submission's: without them a student's edits would be graded
            released = released_notebook(self.aid)
        except ConfigError as e:
            self.grader_error = str(e)
            raise pytest.UsageError(self.grader_error) from None
        restore_setup_cells(self.code, released)
        self.notes = list(self.code.notes)

    # --- the sandbox: started once, at the first test ----------------------------------------------

    def new_sandbox(self, cells=None):
        """A sandbox of the submission's code (or `cells`), not started: the session's, one experiment's (ahead.py)
        or a stand-in's (regrade.py)."""
        return Sandbox(self.code.cells if cells is None else cells, harness_sources(self.aid),
                       self.course.limits_for(self.aid), device=self.device, threads=self.settings.threads,
                       tripwire=tripwire_table(self.course, self.assignment), preload=self.assignment.preload)

    def start(self):
        if self.started:
            return
        self.started = True
        if self.code.error:
            return
        sandbox = self.new_sandbox()
        try:
            try:
                sandbox.start()
            except SandboxFailure as e:
                if e.kind != "sandbox":
                    raise
                sandbox.kill()
                sandbox.start()  # the grader's own process failed to start: once more before blaming anyone
            self.sandbox = sandbox
        except SandboxFailure as e:
            sandbox.kill()
            if e.kind == "sandbox":  # before any student code ran: the grader's failure, never a student's zero
                self.grader_error = f"the sandbox could not be started on this machine: {e}"
                self.grader_exception = e
                pytest.exit(self.grader_error, returncode=GRADER_FAILED)
            self.code.error = f"the notebook's code could not be loaded: {e}"
        except StudentRaised as e:
            sandbox.kill()
            self.code.error = f"the notebook's code could not be loaded: {e}"

    def state_of(self, item):
        """The item's rule state, made when its first test starts (which starts its time limit)."""
        if item not in self.states:
            spec = self.assignment.items[item]
            problem = self.code.problems.get(item) or self.code.error
            if not problem and self.sandbox is not None and self.sandbox.load_errors.get(item):
                problem = f"its cell {self.sandbox.load_errors[item]}"
            hit = scratch_violation(spec, self.code.source_of(item), own=self.assignment.items)
            deadline = time.monotonic() + self.course.limits_for(self.aid, item).item_seconds
            self.states[item] = ItemState(problem or zero_reason(item, hit, False), hit, deadline)
        return self.states[item]

    def student_for(self, test, device=CHECKS_DEVICE):
        """A Student for this test on `device`: its item's deadline and oracle tripwire, its (item, kind)'s seed."""
        item, kind = check_of(test)
        spec, state = self.assignment.items[item], self.state_of(item)
        limits = self.course.limits_for(self.aid, item)
        student = Student(self.sandbox, item, device, state.deadline, watch=spec.from_scratch,
                          limit_s=limits.item_seconds, tripwire=tripwire_table(self.course, self.assignment))
        student.search_s = limits.search_seconds
        student.seed = seed_for(self.course.seed, self.aid, item, kind)
        self.students[test.nodeid] = student
        return student

    # --- running: the item rules around each test --------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        name, kind = check_of(item)
        if name != self.current_item:
            if self.current_item is not None:
                self.finish_item(self.current_item)
            self.current_item = name
            if self.settings.log:
                self.settings.log(name)
        self.start()
        state = self.state_of(name)
        if kind.startswith("experiment"):
            return
        if not state.problem and self.sandbox is not None:
            t0 = time.monotonic()
            try:  # restarting after an earlier item's crash is the grader's time, not this item's
                self.sandbox.ensure()
            except SandboxFailure as e:
                if e.kind == "sandbox":  # the grader's own process or harness: never the student's zero
                    self.grader_error = f"the sandbox could not be restarted: {e}"
                    self.grader_exception = e
                    pytest.exit(self.grader_error, returncode=GRADER_FAILED)
                state.problem = f"the notebook's code could not be reloaded: {e}"
            except StudentRaised as e:
                state.problem = f"the notebook's code could not be reloaded: {e}"
            state.deadline += time.monotonic() - t0
        if state.problem:
            pytest.skip(f"not checked: {state.problem}")

    def experiment_why(self, item):
        """'' when the item's experiments may train, else why not (the item zeroed, missing or not implemented);
        its checks are all done by then (the session puts experiments after them)."""
        self.finish_item(item)
        exists, state = self.outcomes.get((item, "exists")), self.state_of(item)
        ready = not state.zeroed and (exists.score > 0 if (item, "exists") in self.selected else not state.problem)
        return state.zeroed or ("" if ready else f"not run: '{item}' must exist and be implemented first")

    def run_generated(self, test):
        item, kind = test.course_item, test.course_kind
        spec = self.assignment.items[item]
        if test.experiment is not None:
            why = self.experiment_why(item)
            outcome = self.experiments.outcome(test, why)
            outcome = regrade_experiment(self, test.experiment, outcome, why)
            self.outcomes[(item, kind)] = outcome
            if outcome.score < outcome.max_score:
                raise Fail(outcome.output)
        elif kind == "exists":
            info = self.student_for(test).signature(item, methods=list(spec.methods))
            check_signature(item, spec.signature, info, spec.methods)
        else:
            # course.yaml gives the kind points but the suite has no test for it: never the student's zero
            raise GraderError(f"course.yaml gives {kind} of '{item}' points, but the suite has no check of it")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        made = yield
        report = made.get_result()
        if call.when == "setup" and report.skipped:
            name, kind = check_of(item)
            self.outcomes[(name, kind)].add(False, str(call.excinfo.value.msg), 0.0)
            report.longrepr = (str(item.path), None, str(call.excinfo.value.msg))
        elif call.when == "setup" and report.failed:
            self.fail_session(item, call)
        elif call.when == "call":
            output = self.judge(item, call)
            if output is not None and not report.passed:
                report.longrepr = output

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item):
        self.asked_before = self.sandbox.next_id if self.sandbox is not None else 0

    def asked_student(self):
        """Whether the running test's call has sent the student's code anything (and so may hold its answer)."""
        return self.sandbox is not None and self.sandbox.next_id > self.asked_before

    def judge(self, test, call):
        """Score one test's call: its outcome, the item rules it triggers, and the message a student reads.

        The student's only when the student's code did it: a checker's Fail, the student's code raising or
        hitting a limit, or an answer the check cannot use (UNUSABLE, raised after the student's code was asked);
        anything else, an experiment's included, is the grader's failure (fail_session), and nobody is scored.
        """
        name, kind = check_of(test)
        state, student = self.states[name], self.students.pop(test.nodeid, None)
        label = student.label if student else ""
        on_case = f" on case: {label}" if label else ""
        e = call.excinfo.value if call.excinfo else None
        if isinstance(test, GeneratedCheck) and test.experiment is not None:
            if e is not None and not isinstance(e, Fail):  # run_experiment scores all the student did: not this
                self.fail_session(test, call)
                return None
            return e and str(e)  # run_generated has stored the experiment's own outcome
        outcome = self.outcomes[(name, kind)]
        if e is None:
            output = ("ok" if kind != "exists"
                      else f"'{name}' exists with signature {self.assignment.items[name].signature}")
        elif isinstance(e, Fail):
            output = str(e) + (f" (case: {label})" if label and label not in str(e) else "")
            if kind == "exists":
                state.problem = f"'{name}' does not match the spec: {e}"
        elif isinstance(e, StudentRaised):
            output = f"'{name}' raised {e}{on_case}" + outcome.raised(name, str(e), self.assignment.items)
        elif isinstance(e, SandboxFailure) and e.kind != "sandbox":  # "sandbox": the grader's own process failed
            output = f"'{name}' {e}{on_case}"
            if e.kind == "timeout":
                seconds = self.course.limits_for(self.aid, name).item_seconds
                state.problem = f"'{name}' ran out of its {seconds:g} s time limit"
            elif e.kind == "memory":
                state.problem = f"an earlier check {e.kind}: {e}"
        elif isinstance(e, UNUSABLE) and self.asked_student():  # before any answer, it can only be the suite's
            output = f"'{name}' returned something this check cannot use ({type(e).__name__}: {str(e)[:150]}){on_case}"
        else:  # the suite itself broke: a grader failure, never the student's zero
            self.fail_session(test, call)
            return None
        if student is not None:
            state.oracle_calls |= student.oracle_calls
        printed = self.sandbox.output() if self.sandbox is not None and self.sandbox.proc is not None else ""
        if printed.strip() and e is not None:
            output += "\nprinted: " + printed.strip()[-400:]
        outcome.add(e is None, output, call.duration, case=label if e is not None else "")
        return output

    def pytest_internalerror(self, excrepr, excinfo):
        # a bug of this plugin (or of pytest): the TA needs the traceback, the student gets no score from it
        self.grader_error = f"the grading session broke: {excinfo.typename}: {excinfo.value}\n{excrepr}"

    def fail_session(self, test, call):
        self.grader_error = f"the grader failed in {test.nodeid}: {call.excinfo.typename}: {call.excinfo.value}"
        self.grader_exception = call.excinfo.value
        test.session.shouldstop = self.grader_error

    def finish_item(self, item):
        """Rules 2 and 3 (autograder/grading/scoring.py), once all of the item's checks have run."""
        state = self.states.get(item)
        if state is None or state.zeroed is not None:
            return
        checks = [o for (i, k), o in self.outcomes.items() if i == item and not k.startswith("experiment")]
        # under cascade, a stub it calls zeroes it as today (an independent item is regraded instead)
        stub_called = "" if self.independent else next((o.not_implemented_in for o in checks
                                                          if o.not_implemented_in), "")
        state.zeroed = zero_reason(item, state.scratch_hit or min(state.oracle_calls, default=""),
                                   any(o.not_implemented for o in checks), stub_called)
        for o in checks if state.zeroed else []:
            o.score, o.output = 0.0, state.zeroed

    # --- results -------------------------------------------------------------------------------------

    def pytest_sessionfinish(self, session, exitstatus):
        try:
            for item in list(self.states):
                self.finish_item(item)
            isolation, restarts = None, 0
            if self.sandbox is not None:
                self.notes += [f"setup cell '{g}' {e}" for g, e in self.sandbox.load_errors.items()
                               if g.startswith("setup_")]
                isolation, restarts = self.sandbox.isolation, self.sandbox.restarts + self.experiments.restarts
        finally:
            self.experiments.close()
            if self.sandbox is not None:
                self.sandbox.kill()
        if self.grader_error:
            session.exitstatus = GRADER_FAILED
            return
        if self.code is None or exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.USAGE_ERROR):
            return
        outcomes = [o for key, o in self.outcomes.items() if key in self.selected]
        self.results = results_json(outcomes, aid=self.aid, notebook=self.settings.submission, device=self.device,
                                    seed=self.course.seed, output=self.code.error or "; ".join(self.notes),
                                    isolation=isolation, restarts=restarts, seconds=time.monotonic() - self.t0,
                                    notes=self.notes + self.ta_notes)
        if self.settings.results_json:
            atomic_write(self.settings.results_json, json.dumps(self.results, indent=1))

    def pytest_terminal_summary(self, terminalreporter):
        if self.results is None:
            if self.grader_error:
                terminalreporter.write_sep("=", "grader failure: nothing was scored", red=True)
                terminalreporter.write_line(self.grader_error)
            return
        terminalreporter.write_sep("=", f"{self.aid}: {self.results['score']:g} / {self.results['max_score']:g} points")
        for item, state in self.states.items():
            if state.zeroed:
                terminalreporter.write_line(f"{item}: 0 points, {state.zeroed}")
