"""Shared fixtures, the run's split over pytest-xdist workers, and every experiment's measured figure beside the
lecture's at the end of the run."""
import fcntl
import json
import os

import nbformat
import pytest

FIGURES = []


def cores():
    return len(os.sched_getaffinity(0))


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker more than there are cores (at most 8). A worker spends about half its time waiting on
    a kernel, a sandbox, a subprocess or a time limit (measured: 2 workers kept 2 cores 56% busy)."""
    return min(cores() + 1, 8)


def pytest_configure(config):
    # Under xdist each worker gets its share of the cores: torch's default (every core) in two processes on
    # the same cores makes OpenMP's spinning threads fight, and training slows many times over. The sandboxes,
    # kernels and subprocesses a worker starts inherit the share through the environment.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch
        threads = max(1, cores() // workers)
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(items):
    """The graded solutions first, the tests that reuse their training (from the grader's cache) last.

    Under `--dist worksteal` each worker takes a contiguous share of this list: the first worker starts the
    training, and the reusing tests, at the far end, run (or are stolen) once it is long done.
    """
    def rank(item):
        if item.originalname == "test_the_reference_solution_scores_full_marks":
            return 0
        return 2 if "graded_solutions" in item.fixturenames else 1
    items.sort(key=rank)  # stable: within a rank, collection order


def pytest_runtest_logreport(report):
    # the call's report carries what its setup printed too (a session fixture that trains prints then)
    if report.when == "call" and report.passed:
        FIGURES.extend(line for line in report.capstdout.splitlines() if line.startswith("EXPERIMENT"))


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        terminalreporter.section("experiments: measured (lecture figure, threshold)")
        for line in FIGURES:
            terminalreporter.write_line(line)


def grade_solutions(folder):
    """Each assignment's complete submission (release + reference bodies), graded with experiments."""
    from autograder.config import load_course
    from autograder.grade import grade_notebook
    from autograder.examples import release_notebook, solved_sources, with_cells
    from autograder.report import experiment_lines
    out = {}
    for aid in load_course().assignments:
        path = folder / f"{aid}.ipynb"
        nbformat.write(with_cells(release_notebook(aid), solved_sources(aid)), path)
        out[aid] = grade_notebook(path, aid, device="cpu")
        print(f"\nsolution of {aid}: {out[aid]['score']}/{out[aid]['max_score']} in "
              f"{out[aid]['extra_data']['seconds']} s")
        for line in experiment_lines(aid, out[aid]):
            print(f"EXPERIMENT {line}")
    return out


@pytest.fixture(scope="session")
def graded_solutions(tmp_path_factory):
    """Each assignment's complete submission graded once per run, experiments included.

    The experiments' results land in the grader's cache, so later gradings of the same code (the solved
    notebook, the nbgrader round trip, the TA workflow) reuse them instead of training again: tests that do
    such a grading ask for this fixture to be sure the cache is filled first. Under xdist the first worker
    grades and the others wait on a lock in the run's shared temporary folder, then read its results.
    """
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return grade_solutions(tmp_path_factory.mktemp("solutions"))
    shared = tmp_path_factory.getbasetemp().parent  # one per run, shared by its workers
    done = shared / "graded_solutions.json"
    with open(shared / "graded_solutions.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            out = grade_solutions(tmp_path_factory.mktemp("solutions"))
            done.write_text(json.dumps(out))
        return json.loads(done.read_text())
