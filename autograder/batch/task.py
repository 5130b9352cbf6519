"""One grading task as a cluster worker runs it: notebook bytes in, a small JSON result out.

A task carries the notebook's bytes, their sha256, the assignment and the coordinator's grader identity
(autograder/batch/identity.py grader_identity), never a path: the workers share no file system with the coordinator.
A worker whose own grader identity differs (other code, solutions, course.yaml, torch or device) refuses the
task rather than grade with other code. The worker only launches the per-submission sandbox, as `course grade`
does; the student's code never runs in the worker's process.

A worker is warmed once (WarmWorker, a Dask WorkerPlugin: in the background, its first task waiting for it), as a
local pool worker is (batch/worker.py): its GPU claimed, its thread count set explicitly (Dask's nanny sets
OMP_NUM_THREADS=1 in every worker), its zygote started with that count, then torch and the grader imported while the
zygote imports torch, and the data read, so that a task pays for none of it. It dies with its parent, even while
stopped (die_with_parent).
"""
import concurrent.futures
import fcntl
import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path

from distributed import WorkerPlugin

STARTED = "course-grading-started"  # the Dask event topic a task logs as it starts grading (see scheduler.py)
THREADS_ENV = "COURSE_WORKER_THREADS"  # the CPU threads of each grading on this worker (default: worker_threads)
GPU_LOCKS = Path(tempfile.gettempdir())
_one_at_a_time = threading.Lock()  # pytest is not thread-safe: a worker started with --nthreads 2 still grades one
_warmer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="course-warm")  # one warm-up at a time
_warm_ups: list[concurrent.futures.Future] = []
_gpu_claim = None


class GraderMismatch(RuntimeError):
    """The worker's grader identity is not the coordinator's: it refuses to grade with other code."""


def worker_threads():
    """This worker's CPU threads per grading: $COURSE_WORKER_THREADS, else course.yaml's `threads` (at most its
    cores): start one worker per core to use them all."""
    from autograder.sandbox.zygote import threads_per_worker
    value = os.environ.get(THREADS_ENV, "")
    if value and not (value.isdigit() and int(value) > 0):
        raise ValueError(f"{THREADS_ENV}={value!r}: expected a positive number of CPU threads")
    return int(value) if value else threads_per_worker(1)


def claim_gpu():
    """With several GPUs visible (a job running one worker per GPU), keep one: the first not claimed by another
    worker of this machine (an flock held for the worker's life), as CUDA_VISIBLE_DEVICES, before CUDA starts."""
    global _gpu_claim
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if len(visible) <= 1 or _gpu_claim is not None:
        return os.environ.get("CUDA_VISIBLE_DEVICES")
    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("PBS_JOBID") or "local"
    for device in visible:
        lock = open(GPU_LOCKS / f"course-gpu-{job}-{device}.lock", "a")  # noqa: SIM115 -- held while grading
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        _gpu_claim = lock  # held open: released when this worker ends
        os.environ["CUDA_VISIBLE_DEVICES"] = device
        return device
    raise RuntimeError(f"all of CUDA_VISIBLE_DEVICES={','.join(visible)} are claimed by other workers on this "
                       f"machine: start one worker per GPU (--nworkers equal to the GPUs of the job)")


def die_with_parent():
    """Have the kernel SIGKILL this worker when its parent (its nanny; with --cluster local, the coordinator) dies.
    Dask's own watch of the parent is a thread of the worker, which cannot run while the worker hangs (stopped,
    swapped out): a coordinator killed then would leave it, and the sandbox it holds, behind for good."""
    import ctypes
    import signal
    import sys
    if sys.platform != "linux":
        return
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the signal was set
        os._exit(1)


def warm(assignments=None):
    """Everything a grading needs that does not depend on the submission, once per worker process: as a pool
    worker warms (batch/worker.py: threads, then the zygote, then the grader), then harnesses and data."""
    claim_gpu()
    from autograder.batch import worker
    worker.warm(worker_threads())
    from autograder.course.config import load_course
    from autograder.grading.experiments import data_source_of, harness
    for aid in assignments or load_course().assignments:
        harness(aid)
        if data_source_of(aid):
            from autograder.course.mnist import load_mnist
            load_mnist()  # read once: later readings come from the page cache (or the loader's own cache)


class WarmWorker(WorkerPlugin):
    """A Dask WorkerPlugin: warm() when the worker starts (registered by the coordinator, or by a site's
    `dask worker --preload autograder.batch.task`)."""

    name = "course-warm-worker"
    idempotent = True  # registered again by each coordinator: warmed once

    def __init__(self, assignments=None):
        self.assignments = assignments

    async def setup(self, worker):
        begin_warming(worker, self.assignments)


def begin_warming(worker, assignments=None):
    """warm() begun in a thread of its own, returning at once; each grading waits for it (warmed).

    The worker's start is bounded by its nanny's death timeout (distributed starts a worker within it), and a
    plugin's setup is part of that start: a warm-up that takes longer on a loaded node (torch imported, the zygote
    started) made the worker fail to start at all, with a site's short death timeout (15 s: seen under load). The
    event loop goes on heartbeating meanwhile, so a long warm-up is not taken for a hang (clusters.py's worker-ttl).
    The parent-death signal is set first, on the event loop's thread, which lives as long as the worker. A warm-up
    that fails closes the worker, as a failed start did, so that no more gradings reach it; the one waiting on it is
    a grader error naming the cause (scheduler._outcome), never a score."""
    die_with_parent()
    warm_up = _warmer.submit(warm, assignments)
    _warm_ups.append(warm_up)
    loop = worker.loop

    def close_if_failed(done):
        if done.exception() is not None:
            loop.add_callback(worker.close, reason=f"course warm-up failed: {done.exception()!r}")
    warm_up.add_done_callback(close_if_failed)


def warmed():
    """Wait for this worker's warm-ups; one that failed raises its error in the grading that waits."""
    for warm_up in list(_warm_ups):
        warm_up.result()


async def dask_setup(worker):
    """`dask worker --preload autograder.batch.task`: warm the worker as it starts."""
    begin_warming(worker)


def grade_bytes(name, filename, notebook, sha256, aid, items, device, grader):
    """The result of grading `notebook` (bytes; None for a submission that is no file) as JSON text.

    Raises GraderMismatch when this worker's grader is not the coordinator's, and ValueError when the bytes
    are not the ones the coordinator hashed."""
    import socket

    warmed()  # first: no parsing beside the warm-up's (CPython 3.11's ast is not thread-safe: "AST constructor
    # recursion depth mismatch" when the identity hashed the code while the warm-up imported)
    from autograder.batch.identity import identity_here
    from autograder.batch.run import grade_submission
    if notebook is not None and hashlib.sha256(notebook).hexdigest() != sha256:
        raise ValueError(f"{name}: the notebook's bytes arrived with sha256 {hashlib.sha256(notebook).hexdigest()}, "
                         f"the coordinator sent {sha256}")
    here = identity_here(aid, device)
    if here != grader:
        raise GraderMismatch(f"the worker on {socket.gethostname()} (pid {os.getpid()}) has grader identity "
                             f"{here[:12]} for {aid} on {device}, the coordinator {grader[:12]}: install the same "
                             f"course (code, solutions, course.yaml, release) and torch on the workers, or pass "
                             f"--device explicitly; nothing was graded with other code")
    with _one_at_a_time, tempfile.TemporaryDirectory(prefix="course-task-") as tmp:
        from distributed import get_worker
        worker = get_worker()
        worker.log_event(STARTED, {"key": str(worker.get_current_task()), "name": name})
        path = Path(tmp) / filename
        if notebook is not None:
            path.write_bytes(notebook)
        result = grade_submission(name, path, aid, items, device, worker_threads())
    return json.dumps(result)


def resolved_device(device):
    """What `device` means on this worker ('auto': cuda where it has a GPU)."""
    from autograder.grading.experiments import resolve_device
    return resolve_device(device)
