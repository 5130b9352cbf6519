"""Dask's logs of recent messages, kept empty in the coordinator: a grading's messages carry its notebook.

Each of Dask's batched streams (the client's to the scheduler, the scheduler's to each worker) keeps its last
`distributed.admin.low-level-log-length` (1,000) messages for debugging (distributed/batched.py). A grading's
messages carry the submission's notebook (about 100 KB), so a coordinator that runs its cluster's scheduler held up
to 1,000 notebooks per stream, and its peak memory grew with the class (benchmarks/RESULTS.md, "A class on Dask
with faults"). The setting itself must not be 0: it also bounds the scheduler's event log, where a grading's starts
are counted (autograder/batch/scheduler.py KILLS_TO_BLAME). So the streams' logs alone are emptied, as they open.
"""
from collections import deque

from distributed.diagnostics.plugin import SchedulerPlugin


def forget_messages(stream):
    """A batched stream (distributed.batched.BatchedSend) that logs nothing it sends."""
    if stream is not None:
        stream.recent_message_log = deque(maxlen=0)


class NoMessageLog(SchedulerPlugin):
    """On the scheduler: the stream to each worker, present and joining later, logs nothing."""
    name = "course-no-message-log"

    def start(self, scheduler):
        for address in list(scheduler.stream_comms):
            self.add_worker(scheduler, address)

    def add_worker(self, scheduler, worker):
        forget_messages(scheduler.stream_comms.get(worker))
