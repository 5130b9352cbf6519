"""A grading process warmed before its first submission, with its share of the cores, that never outlives its
coordinator.

`warm(threads)` sets the thread environment before any math library loads (OpenMP reads it once, when torch
loads libgomp), starts the zygote first (a process that imports torch on another core) and only then imports the
grader (torch, pytest, the plugin), so that the two imports overlap. A pool worker of `course grade --workers N`
(`started`, the pool's initializer), a single `course grade`, and a Dask worker (task.py) all start this way; a
pool worker forks its sandboxes from its coordinator's zygote instead of starting one (run.py worker_pool).

A pool worker watches its coordinator (a pidfd of its parent): when the coordinator ends in any way (SIGKILL and
the OOM killer included) the worker interrupts itself, unwinds (its sandbox closed, its result lock released) and
exits; its zygote sees the worker end, and each sandbox's monitor its lifeline close. Interrupted (SIGTERM from
the coordinator, SIGINT from the terminal, SIGHUP), a worker that is grading unwinds the same way and exits, one
that is not exits at once.

This module imports nothing heavy: the pool's spawned process loads it before the initializer runs.
"""
import contextlib
import multiprocessing.context
import os
import signal
import sys
import threading
import time
import types

EXIT_AFTER_SECONDS = 5  # an orphaned worker still alive this long after interrupting itself exits unconditionally
_grading = False  # whether a submission is being graded here (then an interrupt unwinds it first)


def thread_environment(threads):
    """This process's and its children's CPU threads, for the math libraries that have not loaded yet."""
    os.environ.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # OpenMP's threads sleep between regions, never spin


def start_zygote(threads):
    """This process's threads set, and its zygote started with `threads` CPU threads per sandbox (not waited for)."""
    thread_environment(threads)
    from autograder.sandbox.zygote import ZYGOTE
    ZYGOTE.ensure_started(threads)


def warm(threads):
    """The zygote started with `threads` CPU threads per sandbox, then the grader imported and given them too."""
    start_zygote(threads)
    import torch
    torch.set_num_threads(threads)  # the grader's own reference computations use the same share
    from autograder.grading import grade  # noqa: F401  (pytest, the plugin, the checks)


def started(threads, coordinator, zygote=None):
    """A pool worker's initializer: watch the coordinator (its pid), take interrupts as described above, fork its
    sandboxes from the coordinator's zygote (`zygote`: its control socket; None: start one's own), then warm up."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _interrupted)
    watch_parent(coordinator)
    if zygote is not None:
        from autograder.sandbox.zygote import ZYGOTE
        ZYGOTE.attach(zygote, threads)
    warm(threads)


class _Spawned(multiprocessing.context.SpawnProcess):
    """A spawned worker that does not run the coordinator's main module first (see spawn_context)."""

    def start(self):
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")  # no file, no spec: the child imports nothing of it
        try:
            super().start()  # reads the main module synchronously (multiprocessing.spawn.get_preparation_data)
        finally:
            sys.modules["__main__"] = main

    def _bootstrap(self, parent_sentinel=None):
        """In the worker: the process's work, then its end as a forked child's (os._exit), not a spawned one's
        (sys.exit): the pool's shutdown waits for every worker, and the interpreter's teardown of torch took about
        0.6 s of it; multiprocessing's own exit work (its finalizers, the flushes) is done by then."""
        os._exit(super()._bootstrap(parent_sentinel))


class _SpawnContext(multiprocessing.context.SpawnContext):
    Process = _Spawned


def spawn_context():
    """The pool's start method: spawn (never fork: the coordinator may hold threads and locks), without the
    coordinator's main module. A spawned process runs the parent's __main__ before its task, and `nbgrader`'s is
    nbgrader's whole app (1.7 s of imports per worker here); a worker needs nothing of it: what it runs
    (started, run, and the grading functions they are given) is named by module."""
    return _SpawnContext()


def run(fn, *args):
    """fn(*args) in a pool worker; an interrupt unwinds it, then ends the worker (the coordinator is going)."""
    global _grading
    _grading = True
    try:
        return fn(*args)
    except KeyboardInterrupt:
        os._exit(130)  # unwound: sandbox closed, lock released; the pool would only wait for work that never comes
    finally:
        _grading = False


def _interrupted(signum, frame):
    if not _grading:
        os._exit(128 + signum)  # nothing to unwind: the zygote sees this process end
    raise KeyboardInterrupt


def watch_parent(parent):
    """A daemon thread that interrupts this process when its parent (pid `parent`) ends, and ends it
    EXIT_AFTER_SECONDS later; ended at once when that parent has already gone.

    The parent's pid comes from the parent itself: a spawned worker reaches this a second or more after it was
    started (a fresh interpreter, its imports), and a coordinator killed meanwhile has left it to init, whose pid
    getppid() would then give. A pidfd, not PR_SET_PDEATHSIG, which fires when the parent's
    *thread* that started us ends (the pool starts workers from whichever thread submits); where pidfds are
    missing (Linux < 5.3), getppid() is polled.
    """
    try:
        pidfd = os.pidfd_open(parent)
    except (AttributeError, OSError):
        pidfd = None
    if os.getppid() != parent:  # gone already (or the pidfd is of a process that took its pid)
        os._exit(1)

    def watch():
        import select
        if pidfd is not None:
            select.select([pidfd], [], [])
        else:
            while os.getppid() == parent:
                time.sleep(1)
        with contextlib.suppress(OSError):
            os.kill(os.getpid(), signal.SIGTERM)  # to the main thread: the grading unwinds
        time.sleep(EXIT_AFTER_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="course-parent-watch", daemon=True).start()
