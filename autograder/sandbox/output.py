"""The output tap: what the student's processes print, read as it comes, kept up to a size."""
import os
import select
import threading

from autograder.sandbox.protocol import as_text


class OutputTap(threading.Thread):
    """Reads the student's stdout/stderr; keeps the first `limit` bytes and counts the rest.

    Reads happen only under the lock, so `take` never misses a chunk read but not yet kept: the sandbox flushes
    what a request printed before it answers, so all of it is in the pipe or kept by the time `take` runs.
    """

    def __init__(self, fd, limit):
        super().__init__(daemon=True)
        self.fd, self.limit = fd, limit
        self.kept, self.dropped = bytearray(), 0
        self.eof = False
        self.lock = threading.Lock()
        os.set_blocking(fd, False)

    def run(self):
        try:
            while not self.eof:
                select.select([self.fd], [], [], 1.0)
                with self.lock:
                    self._read_available()
        finally:
            with self.lock:  # EOF (every process that could print is gone), or select failed: no read after this
                self.eof = True
                os.close(self.fd)

    def _read_available(self, chunks=16):
        """Keep what the pipe holds now, at most `chunks` reads (the caller holds the lock; a process that never
        stops printing must not keep it forever)."""
        for _ in range(chunks):
            if self.eof:
                return
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self.eof = True
                return
            room = self.limit - len(self.kept)
            self.kept += chunk[:max(room, 0)]
            self.dropped += max(len(chunk) - max(room, 0), 0)

    def take(self):
        """What was printed since the last take, cut to the limit with a note."""
        with self.lock:
            self._read_available(chunks=2048)  # all a request printed, unless it is still printing past 128 MB
            text = as_text(self.kept.decode("utf-8", "replace"))
            if self.dropped:
                text += f"\n[... {self.dropped} more bytes of output cut]"
            self.kept, self.dropped = bytearray(), 0
        return text
