"""A `dask worker --preload` for tests/test_cluster.py: SIGKILLs its own worker process while it grades a chosen
submission, as a host's OOM killer or a node failure would. Not part of the grader.

COURSE_TEST_KILL_ONCE=NAME: the first worker grading NAME dies ONCE_AFTER seconds into it (a marker file in
COURSE_TEST_KILL_MARKS, written as it dies, keeps it to once across the workers the nanny restarts);
COURSE_TEST_KILL_ALWAYS=NAME: every worker grading NAME dies ALWAYS_AFTER seconds into it.

A death comes only while the grading still runs (a timer, cancelled when the task leaves `executing`), never in the
transition itself: a worker killed in the very tick its previous task finished dies before its batched stream
reports that task done, and the scheduler then counts the death against a grading that had ended (one run in three
of the old killer, which died on entering `executing`, blamed the innocent `wrong` so).
"""
import os
import signal
import threading
from pathlib import Path

from distributed import WorkerPlugin

ONCE_AFTER = 0.25   # `complete` grades in about 0.6 s on a warm worker: well inside it
ALWAYS_AFTER = 1.0  # `poison` sleeps far longer in its graded cell; a second lets its start reach the scheduler


def _die(mark=None):
    if mark is not None:
        try:
            mark.open("x").close()
        except FileExistsError:
            return
    os.kill(os.getpid(), signal.SIGKILL)


class Killer(WorkerPlugin):
    name = "test-killer"

    def __init__(self):
        self.timers = {}

    def transition(self, key, start, finish, **kwargs):
        key = str(key)
        if start == "executing" and key in self.timers:
            self.timers.pop(key).cancel()
        if finish != "executing":
            return
        once, always = os.environ.get("COURSE_TEST_KILL_ONCE"), os.environ.get("COURSE_TEST_KILL_ALWAYS")
        if always and key.startswith(f"grade-{always}-"):
            self.timers[key] = threading.Timer(ALWAYS_AFTER, _die)
        elif once and key.startswith(f"grade-{once}-"):
            mark = Path(os.environ["COURSE_TEST_KILL_MARKS"]) / once
            if mark.exists():
                return
            self.timers[key] = threading.Timer(ONCE_AFTER, _die, [mark])
        else:
            return
        self.timers[key].start()


async def dask_setup(worker):
    await worker.plugin_add(Killer())
