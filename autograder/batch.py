"""Grade many submissions: in parallel, resumable, each result written the moment it is done.

Each submission is one pytest session (autograder/grade.py). pytest is not thread-safe, so with several
workers each runs in a worker process of its own (started once per batch: the cost of importing torch is paid
per worker, not per submission); with one worker, sessions run in this process.
"""
import fcntl
import json
import multiprocessing
import os
import signal
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path

import torch

from autograder.cache import atomic_write
from autograder.grade import grade_notebook
from autograder.sandbox import threads_per_worker

WORKER_EXIT_SECONDS = 30  # an interrupted worker closes its sandbox and lock in well under this


def find_submissions(paths, aid):
    """(name, notebook) for each argument: a notebook, or a folder searched for notebooks."""
    found = []
    for arg in map(Path, paths):
        if arg.is_file():
            found.append((arg.stem if arg.stem != aid else arg.parent.name, arg))
            continue
        notebooks = sorted(p for p in arg.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        for nb in notebooks:
            rel = nb.relative_to(arg)
            found.append((rel.parts[0] if len(rel.parts) > 1 else nb.stem, nb))
        if not notebooks:
            found.append((arg.name, arg))  # reported as unreadable, never silently dropped
    names, unique = {}, []
    for name, nb in found:
        names[name] = names.get(name, 0) + 1
        unique.append((name if names[name] == 1 else f"{name}~{names[name]}", nb))
    return unique


def failed_result(aid, name, reason):
    """A result for a submission the grader itself could not finish: zero, with the reason."""
    return {"score": 0.0, "max_score": 0.0, "output": reason, "visibility": "visible", "tests": [],
            "extra_data": {"assignment": aid, "notebook": name, "grader_error": True}}


def grade_one(name, notebook, aid, items, device, results_dir, threads=None):
    """Grade one submission under a lock; reuse a finished result from an earlier (or a parallel) run."""
    if results_dir is None:
        return _grade(name, notebook, aid, items, device, threads)
    out = results_dir / f"{name}.json"
    with result_lock(results_dir / f".{name}.lock"):
        if out.exists():
            return json.loads(out.read_text())
        result = _grade(name, notebook, aid, items, device, threads)
        if not result.get("extra_data", {}).get("grader_error"):  # a grader failure is retried on the next run
            atomic_write(out, json.dumps(result, indent=1))
        return result


@contextmanager
def result_lock(path):
    """An flock on `path`, removed when released: two graders sharing a results folder wait for each other.

    The holder unlinks the file before unlocking; a waiter that then gets the lock on the unlinked file
    sees that the path no longer names what it holds, and tries again.
    """
    while True:
        lock = open(path, "a")
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if os.fstat(lock.fileno()).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        lock.close()
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        lock.close()


def _grade(name, notebook, aid, items, device, threads=None):
    try:
        return grade_notebook(notebook, aid, items=items, device=device, threads=threads)
    except Exception as e:  # a grader bug on one submission must not stop the batch
        traceback.print_exc(file=sys.stderr)
        return failed_result(aid, name, f"the grader failed on this submission ({type(e).__name__}: {e}); "
                                        f"it was not scored, rerun it")


def grade_batch(submissions, aid, items=None, device="auto", workers=1, results_dir=None, progress=None):
    """[(name, result)] in the order given; each result is saved as soon as it is done.

    Interrupted (KeyboardInterrupt, which `course grade` also makes of SIGTERM), every worker is interrupted
    too and closes its sandbox, the submissions being graded get no result (nothing half-done is saved), and
    the interrupt goes on to the caller; a rerun with the same results folder grades only what is missing.
    """
    if results_dir is not None:
        results_dir = Path(results_dir)
        results_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    threads = threads_per_worker(workers)
    if workers <= 1:
        for done, (name, nb) in enumerate(submissions, 1):
            results[name] = grade_one(name, nb, aid, items, device, results_dir, threads)
            if progress:
                progress(done, len(submissions), name, results[name])
        return [(name, results[name]) for name, _ in submissions]
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_started, initargs=(threads,))
    try:
        futures = {pool.submit(grade_one, name, nb, aid, items, device, results_dir, threads): name
                   for name, nb in submissions}
        for done, future in enumerate(as_completed(futures), 1):
            name = futures[future]
            results[name] = future.result()
            if progress:
                progress(done, len(futures), name, results[name])
    except BaseException:
        _interrupt_workers(pool)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return [(name, results[name]) for name, _ in submissions]


def _worker_started(threads):
    """A worker process: its share of the cores, and SIGTERM as Ctrl-C, so that it unwinds (sandbox, lock)."""
    if threads:
        torch.set_num_threads(threads)  # the grader's own reference computations share the cores too
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupt_workers(pool):
    """Interrupt every worker and wait until each has closed its sandbox and released its result lock."""
    workers = list((pool._processes or {}).values())
    for process in workers:
        if process.is_alive():
            os.kill(process.pid, signal.SIGTERM)
    for process in workers:
        process.join(WORKER_EXIT_SECONDS)
        if process.is_alive():
            process.kill()  # its sandboxes die with it (their lifelines close)
