"""Grade many submissions: in parallel, resumable, each result written the moment it is done.

Each submission is one pytest session (autograder/grading/grade.py). pytest is not thread-safe, so with several
workers each runs in a worker process of its own (started once per batch and warmed before its first submission,
autograder/batch/worker.py: the cost of importing torch is paid per worker, not per submission), and they fork
their sandboxes from one zygote, the coordinator's (its imports paid once per batch); with one worker, sessions
run in this process. The coordinator of several workers imports no torch, pytest or grader: it only dispatches
(this module's grading imports are deferred into the functions that grade).

A results folder (`--results-dir`) keeps each result the moment it is done, and gives back one saved by the same
grading instead of grading again (batch/results.py, which every path writes through).
"""
import os
import signal
import tempfile
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path

from autograder.batch import worker
from autograder.batch.identity import file_digest, identity_here, parts_here
from autograder.batch.results import claimed, grading_identity, held
from autograder.errors import setup_problem
from autograder.sandbox.zygote import ZYGOTE, experiments_at_once, threads_per_worker

WORKER_EXIT_SECONDS = 5  # an interrupted worker closes its sandbox and lock in well under this


def failed_result(aid, name, reason, cause=None, setup=False, trace=""):
    """A result for a submission the grader itself could not finish: the cause and no score (`grader_error`: the
    table, --json and --csv show none, never a 0); not saved in --results-dir, so the next run grades it again.

    `cause` is the line a TA reads, the same text for every submission that failed alike, so that a batch names
    it once (reports.tables.grader_error_lines); `setup`: it is something the machine or the course lacks
    (errors.SetupProblem: the cause names the fix). `trace`, the traceback, goes to the batch's log
    (write_error_log), never to the terminal unless asked for.
    """
    return {"score": 0.0, "max_score": 0.0, "output": reason, "visibility": "visible", "tests": [],
            "extra_data": {"assignment": aid, "notebook": name, "grader_error": True, "setup": setup,
                           "cause": (cause or reason).splitlines()[0], "traceback": trace}}


def write_error_log(rows, folder=None):
    """The tracebacks of the batch's grader failures in one file (`folder`/grader-errors.log, else a new file in
    the temporary folder); its path, or None when nothing failed."""
    failed = [(name, result) for name, result in rows if result.get("extra_data", {}).get("grader_error")]
    if not failed:
        return None
    text = "".join(f"=== {name}: {result['output']}\n{result['extra_data'].get('traceback') or 'no traceback'}\n"
                   for name, result in failed)
    if folder is not None:
        path = Path(folder) / "grader-errors.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path
    fd, path = tempfile.mkstemp(prefix="course-grader-errors-", suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return Path(path)


def grade_one(name, notebook, aid, items, device, results_dir, threads=None, grader=None, at_once=1):
    """(result, how): how is 'graded', 'reused' (the saved result is the same grading), 'rescored' (only the points
    moved: scored again from its saved checks) or 'merged' (the items regraded into the saved result); under a
    lock, so that runs sharing a results folder grade each once. `threads`: each sandbox's CPU threads; `at_once`:
    the experiments trained side by side (zygote.py's experiments_at_once)."""
    if results_dir is None:
        return grade_submission(name, notebook, aid, items, device, threads, at_once), "graded"
    parts = parts_here(aid, device) if grader is None else None  # a grader given by name: a test's, no parts
    identity = grading_identity(aid, file_digest(notebook), items, grader or identity_here(aid, device))
    with claimed(results_dir, name) as entry:
        found = entry.without_grading(identity, parts, aid, notebook)
        if found is not None:
            return found
        result = grade_submission(name, notebook, aid, items, device, threads, at_once)
        return entry.store(result, identity, items, notebook, parts)


def grade_submission(name, notebook, aid, items, device, threads=None, at_once=1):
    """One notebook's result in this process, a grader failure on it reported as its result (never raised)."""
    from autograder.grading.grade import grade_notebook
    try:
        return grade_notebook(notebook, aid, items=items, device=device, threads=threads,
                              experiments_at_once=at_once)
    except Exception as e:  # a grader bug on one submission must not stop the batch
        problem = setup_problem(e)
        return failed_result(aid, name, f"the grader failed on this submission ({type(e).__name__}: {e}); "
                                        f"it was not scored, rerun it",
                             cause=str(problem if problem else e), setup=problem is not None,
                             trace=traceback.format_exc())


def grade_batch(submissions, aid, items=None, device="auto", workers=1, results_dir=None, progress=None):
    """[(name, result)] in the order given; each result is saved as soon as it is done.

    `progress(done, total, name, result, how)` is called as each finishes; how: 'graded', 'reused' or 'merged'
    (see grade_one). Interrupted (KeyboardInterrupt, which `course grade` also makes of SIGTERM), every worker is
    interrupted too and closes its sandbox, the submissions being graded get no result (nothing half-done is
    saved), and the interrupt goes on to the caller; a rerun with the same results folder grades only what is
    missing.
    """
    if results_dir is not None:
        results_dir = Path(results_dir)
        results_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    if workers <= 1:
        threads = threads_per_worker(workers)
        worker.warm(threads)
        for done, (name, nb) in enumerate(submissions, 1):
            result, how = grade_one(name, nb, aid, items, device, results_dir, threads,
                                    at_once=experiments_at_once(workers))
            results[name] = held(result)
            if progress:
                progress(done, len(submissions), name, results[name], how)
        return [(name, results[name]) for name, _ in submissions]
    with worker_pool(workers, device, expected=len(submissions)) as pool:
        futures = {pool.submit(name, nb, aid, items, results_dir): name for name, nb in submissions}
        for done, future in enumerate(as_completed(futures), 1):
            name = futures[future]
            result, how = future.result()
            results[name] = held(result)
            if progress:
                progress(done, len(futures), name, results[name], how)
    return [(name, results[name]) for name, _ in submissions]


class WorkerPool:
    """Warm grading workers taking one submission at a time: `submit` returns a future of grade_one's
    (result, how). grade_batch submits a list; the nbgrader path submits each notebook as its collecting walk
    writes it, so that grading starts while nbgrader is still walking the class."""

    def __init__(self, executor, device, threads, at_once=1):
        self.executor, self.device, self.threads, self.at_once = executor, device, threads, at_once
        self.identities = {}  # (assignment, device) -> the future of a worker's identity_here

    def identity(self, aid, device):
        """The grader identity the workers grade `aid` on `device` with, computed in a worker (the coordinator
        imports no torch): this process's own, as they are its children, with its code, course and libraries."""
        return self._identity(aid, device).result()

    def _identity(self, aid, device):
        if (aid, device) not in self.identities:
            self.identities[aid, device] = self.executor.submit(identity_here, aid, device)
        return self.identities[aid, device]

    def submit(self, name, notebook, aid, items=None, results_dir=None):
        if results_dir is not None:  # asked for before the gradings queue up ahead of it (a worker computes it
            self._identity(aid, self.device)  # for its results anyway, once)
        return self.executor.submit(worker.run, grade_one, name, notebook, aid, items, self.device, results_dir,
                                    self.threads, None, self.at_once)  # worker.run passes no keywords


@contextmanager
def worker_pool(workers, device, expected=None):
    """A WorkerPool of `workers` processes, started and warmed (worker.started) at once, before the first submission
    arrives (only as many as the `expected` submissions, when known; the pool starts another when one is wanted).

    Left by an exception (an interrupt: KeyboardInterrupt, which `course grade` also makes of SIGTERM), every worker
    is interrupted too and closes its sandbox, what was being graded gets no result (nothing half-done is saved),
    and the exception goes on. Left normally, it waits for the gradings under way and cancels those not started.
    """
    threads = threads_per_worker(workers)
    starting = workers if expected is None else min(workers, expected)
    # one zygote for the pool, the coordinator's (it imports no torch itself: the zygote is a process of its own),
    # started now beside the workers' own imports; each worker forks its sandboxes from it (worker.started)
    if starting:
        ZYGOTE.ensure_started(threads)
    # each worker computes the grader identity itself (identity_here): it imports torch, and the coordinator never does
    executor = ProcessPoolExecutor(max_workers=workers, mp_context=worker.spawn_context(), initializer=worker.started,
                                   initargs=(threads, os.getpid(), ZYGOTE.sock if starting else None))
    try:
        for _ in range(starting):
            # the pool starts a process for each submission that finds none idle: one no-op each starts them all now
            executor.submit(os.getpid)
        yield WorkerPool(executor, device, threads, experiments_at_once(workers))
    except BaseException:
        _interrupt_workers(executor)
        raise
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def _interrupt_workers(pool):
    """Interrupt every worker and wait until each has closed its sandbox and released its result lock, and exited
    (worker.run); one still alive WORKER_EXIT_SECONDS later is killed."""
    workers = list((pool._processes or {}).values())
    for process in workers:
        if process.is_alive():
            os.kill(process.pid, signal.SIGTERM)
    for process in workers:
        process.join(WORKER_EXIT_SECONDS)
        if process.is_alive():
            process.kill()  # its sandboxes die with it (their lifelines close)
