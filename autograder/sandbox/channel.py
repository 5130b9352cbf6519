"""The channel: the grader's ends of one sandbox's request, answer and status pipes.

Every wait on the student's process (its reads, its writes, whatever it sends or does not send) is bounded by a
deadline and watched for the memory limit: a student who never reads, never answers or answers a forgery can
make the grader neither wait past the item's limit nor read more than MAX_ANSWER_BYTES.
"""
import contextlib
import os
import select
import signal
import time

from autograder.sandbox.protocol import MAX_ANSWER_BYTES, ProtocolError, SandboxFailure, frame, header

POLL_SECONDS = 0.1  # how often a wait looks at the student's memory


def read_line(fd):
    """One line from a blocking pipe, byte by byte (nothing past it is consumed)."""
    out = b""
    while not out.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            break
        out += chunk
    return out.decode(errors="replace")


class Channel:
    """Messages to and from one sandbox within a deadline.

    `watch()` runs at most every POLL_SECONDS while waiting (it raises SandboxFailure past the memory limit);
    `end()` ends the whole sandbox before a timeout or a crash is raised, so nothing of it outlives its item.
    """

    def __init__(self, req_fd, resp_fd, status_fd, watch, end):
        self.req_fd, self.resp_fd, self.status_fd = req_fd, resp_fd, status_fd
        self.watch, self.end = watch, end
        self.buf, self.watched = b"", 0.0
        os.set_blocking(req_fd, False)  # a student who never reads cannot block the grader's writes

    def wait(self, fd, deadline, limit_s, write=False):
        """Until `fd` is ready; raises at the deadline or when `watch` does."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.end()
                raise SandboxFailure("timeout", f"did not finish within {limit_s:g} s (time limit)")
            ready = select.select([] if write else [fd], [fd] if write else [], [], min(left, POLL_SECONDS))
            if time.monotonic() - self.watched >= POLL_SECONDS:
                self.watched = time.monotonic()
                self.watch()
            if ready[0] or ready[1]:
                return

    def crash(self, why):
        self.end()
        raise SandboxFailure("crash", why)

    def send(self, msg, blob, deadline, limit_s):
        """Write one message (see sandbox_protocol.frame), all of it before the deadline."""
        view = memoryview(frame(msg, blob))
        while view:
            self.wait(self.req_fd, deadline, limit_s, write=True)
            try:
                view = view[os.write(self.req_fd, view[:1 << 20]):]
            except BlockingIOError:
                continue
            except OSError:
                self.crash(f"the notebook's process ended ({self.exit_status()})")

    def _fill(self, deadline, limit_s):
        self.wait(self.resp_fd, deadline, limit_s)
        chunk = os.read(self.resp_fd, 1 << 20)
        if not chunk:
            self.crash(f"the notebook's process ended ({self.exit_status()})")
        self.buf += chunk
        if len(self.buf) > MAX_ANSWER_BYTES + 2**20:
            self.crash(f"the notebook's process sent more than {MAX_ANSWER_BYTES >> 20} MB on the grader's channel")

    def receive(self, deadline, limit_s):
        """(message, blob): the next JSON line and the bytes it announces, all before the deadline."""
        while b"\n" not in self.buf:
            self._fill(deadline, limit_s)
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            msg, size = header(line)
        except ProtocolError as e:
            self.crash(str(e))
        if size > MAX_ANSWER_BYTES:
            self.crash(f"the notebook's process sent more than {MAX_ANSWER_BYTES >> 20} MB on the grader's channel")
        while len(self.buf) < size:
            self._fill(deadline, limit_s)
        blob, self.buf = self.buf[:size], self.buf[size:]
        return msg, blob

    def exit_status(self, wait_s=5):
        """How the student's process ended, as its monitor saw it (bounded wait)."""
        ready, _, _ = select.select([self.status_fd], [], [], wait_s)
        line = read_line(self.status_fd) if ready else ""
        if not line.strip().lstrip("-").isdigit():
            return "exit status unknown"
        status = int(line)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            if sig in signal.Signals._value2member_map_:
                return f"killed by signal {signal.Signals(sig).name}"
            return f"signal {sig}"
        return f"exit code {os.WEXITSTATUS(status)}"

    def close(self):
        for fd in (self.req_fd, self.resp_fd, self.status_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
