"""A `dask worker --preload` for tests/test_cluster.py: SIGKILLs its own worker process while it grades a chosen
submission, as a host's OOM killer or a node failure would. Not part of the grader.

COURSE_TEST_KILL_ONCE=NAME: the first worker to start grading NAME dies KILL_AFTER seconds into it (a marker file
in COURSE_TEST_KILL_MARKS keeps it to once across the workers the nanny restarts);
COURSE_TEST_KILL_ALWAYS=NAME: every worker that starts grading NAME dies at once.
"""
import os
import signal
import threading
from pathlib import Path

from distributed import WorkerPlugin

KILL_AFTER = 2.0


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


class Killer(WorkerPlugin):
    name = "test-killer"

    def transition(self, key, start, finish, **kwargs):
        if finish != "executing":
            return
        key = str(key)
        once, always = os.environ.get("COURSE_TEST_KILL_ONCE"), os.environ.get("COURSE_TEST_KILL_ALWAYS")
        if always and key.startswith(f"grade-{always}-"):
            _die()  # before the task runs: a warm worker grades one item in well under a second
        elif once and key.startswith(f"grade-{once}-"):
            mark = Path(os.environ["COURSE_TEST_KILL_MARKS"]) / once
            try:
                mark.open("x").close()
            except FileExistsError:
                return
            threading.Timer(KILL_AFTER, _die).start()


async def dask_setup(worker):
    await worker.plugin_add(Killer())
