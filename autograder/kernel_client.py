"""A Jupyter kernel client whose waits cannot miss a message already on the socket.

A zmq socket's file descriptor is edge-triggered: anyone who processes the socket's pending commands (reading
`zmq.EVENTS`, a send) can consume the edge that a waiting `zmq.asyncio` poll was registered for, and the poll then
sleeps while the message sits on the socket (pyzmq#2173 describes the same class of miss). Under load this stalled
notebook executions here: the kernel had finished the cell and sent its reply, nbclient waited on the shell socket
for it, and the cell time-out was the only way out (2 to 3 of every 4 executions of the w8l4 release notebook with
two busy threads beside it on two cores; none of 16 with this client). Every wait here is a series of polls of at
most `REPOLL_S`, and each new poll reads the socket's events first, so a missed edge costs one slice.
"""
import time
from queue import Empty

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from traitlets import Type

REPOLL_S = 1.0


class RepollingChannel(AsyncZMQSocketChannel):
    """A kernel channel whose `get_msg` polls in slices of at most REPOLL_S seconds."""

    async def get_msg(self, timeout=None):
        """The next message; `queue.Empty` after `timeout` seconds (None: wait for ever)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait_s = REPOLL_S if deadline is None else min(REPOLL_S, max(0.0, deadline - time.monotonic()))
            if await self.socket.poll(int(wait_s * 1000)):
                return await self._recv()
            if deadline is not None and time.monotonic() >= deadline:
                raise Empty


class RepollingKernelClient(AsyncKernelClient):
    """nbclient's kernel client with every zmq channel a RepollingChannel (the heartbeat is a thread of its own)."""

    shell_channel_class = Type(RepollingChannel)
    iopub_channel_class = Type(RepollingChannel)
    stdin_channel_class = Type(RepollingChannel)
    control_channel_class = Type(RepollingChannel)
