"""A Jupyter kernel client whose waits cannot miss a message already on the socket.

A zmq socket's file descriptor is edge-triggered: anyone who processes the socket's pending commands (reading
`zmq.EVENTS`, a send) can consume the edge that a waiting `zmq.asyncio` poll was registered for, and the poll then
sleeps while the message sits on the socket (pyzmq#2173 describes the same class of miss). Under load this stalled
notebook executions here: the kernel had finished the cell and sent its reply, nbclient waited on the shell socket
for it, and the cell time-out was the only way out (2 to 3 of every 4 executions of the w8l4 release notebook with
two busy threads beside it on two cores; none of 16 with this client). Every wait here is a series of polls of at
most `REPOLL_S`, and each new poll reads the socket's events first, so a missed edge costs one slice.

Kernels also start one at a time on a machine (`kernel_start_lock`): jupyter_client picks free ports, then the
kernel binds them, so two starting at once can pick the same ports (jupyter_client#487), whoever started them.
"""
import errno
import fcntl
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
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


# Shared by every user on purpose (ports are the machine's): made readable by all, and flock needs no more.
KERNEL_START_LOCK = Path(tempfile.gettempdir()) / "course-kernel-start.lock"
LOCK_WAIT_S = 120  # past this, start anyway: the lock only narrows a port race, and another user may hold it


def _open_shared(path):
    """A read-only descriptor of the shared lock file, made world-readable by whoever creates it first."""
    # Open what is there without O_CREAT: Linux's protected_regular refuses O_CREAT on another user's file in a
    # sticky world-writable folder (/tmp) even when its mode allows the open; never through a symlink.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags)
    except FileNotFoundError:
        pass
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except FileExistsError:  # another process made it meanwhile
        return os.open(path, flags)
    os.fchmod(fd, 0o644)  # whatever this user's umask: every user opens it
    return fd


@contextmanager
def kernel_start_lock(path=KERNEL_START_LOCK, wait_s=LOCK_WAIT_S):
    """Hold the machine's kernel-start lock for the block; yields whether it is held.

    Not held (and no error) when the file cannot be opened (someone made it unreadable) or another process
    keeps it for more than `wait_s` seconds: a kernel start is never refused over the lock.
    """
    try:
        fd = _open_shared(path)
    except OSError:
        yield False
        return
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                    held = False
                    break
                time.sleep(0.05)
        yield held
    finally:
        os.close(fd)  # closing releases the flock
