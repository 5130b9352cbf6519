"""Shared fixtures, the run's split over pytest-xdist workers, and every experiment's measured figure beside the
lecture's at the end of the run."""
import fcntl
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

# pytest's own fixture for running a pytest session in the test (tests/unit/test_plugin_rules.py)
pytest_plugins = ["pytester"]
FIGURES = []
# Under CI=true a skip is a failure unless the machine lacks the hardware: a package or a permission a fresh machine
# can have (tools/test_system_packages.sh installs them as root) must not hide a test (#60).
HARDWARE_SKIPS = ("GPU", "CUDA", "flush-to-zero")
SKIPPED = []
# Each test's seconds (setup, call and teardown), for tools/quick_tier.py: the quick tier's cost in this run.
DURATIONS = {}
# A pytest run inside a test (tests/test_levels_corpus.py's, as an ordinary user who may not write the course's
# folder) names a file of its own: its durations are not the test command's.
DURATIONS_FILE = Path(os.environ.get("COURSE_TEST_DURATIONS") or
                      Path(__file__).resolve().parents[1] / ".test-durations.json")
# Only the test command's own session judges its skips and writes its durations: not its xdist workers, and not a
# pytest run inside a test (a copy of the course's tests run by tests/test_handwritten_assignment.py, the levels
# corpus), which inherits this variable.
OUTERMOST = "COURSE_TEST_SESSION" not in os.environ
os.environ.setdefault("COURSE_TEST_SESSION", str(os.getpid()))
STARTED = {}
# The smallest-failing-case search adds up to course.yaml's limits.search_seconds to each item a planted mistake
# fails (test_grading grades some 150): off here, on in tests/test_smallest_case.py, which tests it.
os.environ.setdefault("COURSE_SEARCH_SECONDS", "0")


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core (at most 8). On two cores three workers were no faster than two (912 s
    against 910 s)."""
    from autograder.sandbox.grader_side import cpu_cores
    return min(cpu_cores(), 8)


def pytest_configure(config):
    # Under xdist each worker gets its share of the cores, as `course grade --workers` gives its workers (see
    # threads_per_worker). The sandboxes, kernels and subprocesses a worker starts inherit it through the environment.
    from autograder.sandbox.grader_side import threads_per_worker
    threads = threads_per_worker(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    if threads:
        import torch
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(items):
    mark_the_quick_tier(items)
    run_longest_first(items)


def mark_the_quick_tier(items):
    """Everything that grades a notebook or trains a model is `slow` too: `pytest -m "not slow"` is the quick tier,
    the loop before a commit (README, DEVELOPING.md), and its cost is watched by tools/quick_tier.py."""
    for item in items:
        if item.get_closest_marker("grading") or item.get_closest_marker("experiment"):
            item.add_marker(pytest.mark.slow)


def run_longest_first(items):
    """Longest first, so that under xdist (one test at a time to whichever worker is free, pyproject's addopts) no
    worker is left with a long test at the end: the Gradescope rehearsal and the graded solutions, then the tests
    marked slow or experiment, then the rest. The Gradescope exports come after the slow tests: by then the graded
    solutions have put the reference's curves in the cache, which an export ships, and it trains none of them (as
    first tests, each trained them beside the grading that was training them too: two minutes each)."""
    def rank(item):
        if item.originalname in ("test_the_rehearsal_builds_the_zip_as_gradescope_does_and_grades_three_uploads",
                                 "test_the_reference_solution_scores_full_marks"):
            return 0
        if item.originalname == "test_export_gradescope_and_otter_run":
            return 1.5
        return 1 if item.get_closest_marker("slow") or item.get_closest_marker("experiment") else 2
    items.sort(key=rank)  # stable: within a rank, collection order


def pytest_sessionstart(session):
    STARTED["session"] = time.monotonic()


def pytest_runtest_logreport(report):
    # the session's start (collection, xdist's workers) until the first test ended, less that test
    STARTED.setdefault("start", time.monotonic() - STARTED.get("session", time.monotonic()) - report.duration)
    DURATIONS[report.nodeid] = DURATIONS.get(report.nodeid, (0.0, False))[0] + report.duration, \
        "slow" in report.keywords
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        SKIPPED.append((report.nodeid, reason))
    # the call's report carries what its setup printed too (a session fixture that trains prints then)
    if report.when == "call" and report.passed:
        FIGURES.extend(line for line in report.capstdout.splitlines() if line.startswith("EXPERIMENT"))


def pytest_sessionfinish(session):
    if not OUTERMOST or hasattr(session.config, "workerinput"):
        return  # a worker (the controller sees every report and decides), or a pytest run inside a test
    if DURATIONS and not session.config.option.collectonly:
        workers = int(getattr(session.config.option, "numprocesses", 0) or 1)
        try:
            DURATIONS_FILE.write_text(json.dumps({"workers": workers, "start": STARTED.get("start", 0.0),
                                                   "tests": DURATIONS}))
        except OSError as e:  # a folder this user may not write: the run's verdict does not depend on it
            print(f"\nthe test durations were not written ({e}): tools/quick_tier.py will not find them")
    if os.environ.get("CI") == "true" and not_hardware(SKIPPED) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def not_hardware(skipped):
    return [(nodeid, reason) for nodeid, reason in skipped if not any(word in reason for word in HARDWARE_SKIPS)]


def pytest_terminal_summary(terminalreporter):
    if OUTERMOST and os.environ.get("CI") == "true" and not_hardware(SKIPPED):
        terminalreporter.section("skipped for a reason a fresh machine can fix (CI=true fails the run)")
        for nodeid, reason in not_hardware(SKIPPED):
            terminalreporter.write_line(f"{nodeid}: {reason}")
    if FIGURES:
        terminalreporter.section("experiments: measured (lecture figure, threshold)")
        for line in FIGURES:
            terminalreporter.write_line(line)


def grade_solution(aid, folder):
    """An assignment's complete submission (release + reference bodies), graded with experiments."""
    from autograder.grading.grade import grade_notebook
    from autograder.notebooks.examples import write_solution
    from autograder.reports.tables import experiment_lines
    result = grade_notebook(write_solution(aid, folder), aid, device="cpu")
    print(f"\nsolution of {aid}: {result['score']}/{result['max_score']} in {result['extra_data']['seconds']} s")
    for line in experiment_lines(aid, result):
        print(f"EXPERIMENT {line}")
    return result


class GradedSolutions:
    """assignment id -> its complete submission's result, graded on first use and once per run.

    The experiments' results land in the grader's cache, so later gradings of the same code (the solved
    notebook, the nbgrader round trip, the TA workflow) reuse them instead of training again: such a test looks
    up its assignment here first. Under xdist the first worker to ask grades, with a lock in the run's shared
    temporary folder (one per assignment, so three workers grade three assignments at once), and the others
    wait for it and read the result it saved there.
    """

    def __init__(self, tmp_path_factory):
        self.factory, self.results = tmp_path_factory, {}
        self.shared = tmp_path_factory.getbasetemp().parent if "PYTEST_XDIST_WORKER" in os.environ else None

    def __getitem__(self, aid):
        if aid not in self.results:
            self.results[aid] = self._shared(aid) if self.shared else grade_solution(aid, self.factory.mktemp(aid))
        return self.results[aid]

    def _shared(self, aid):
        done = self.shared / f"graded_solution_{aid}.json"
        with open(self.shared / f"graded_solution_{aid}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                done.write_text(json.dumps(grade_solution(aid, self.factory.mktemp(aid))))
            return json.loads(done.read_text())


@pytest.fixture
def tmp():
    """A folder every user may enter, for graders run as other users (pytest's own are 0700 under
    /tmp/pytest-of-root)."""
    folder = Path(tempfile.mkdtemp(prefix="course-iso-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def graded_solutions(tmp_path_factory):
    """Each assignment's complete submission graded once per run, experiments included (see GradedSolutions)."""
    return GradedSolutions(tmp_path_factory)
