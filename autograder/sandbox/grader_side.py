"""The grader's side of the sandbox: start the student's process, send requests, enforce the limits.

Limits that hold: a wall-clock deadline per request that bounds every wait on the student's process (its
writes, its reads, whatever it sends or does not send), memory of the student's process tree, output cut at
a size; disk, processes and isolation as child/isolation.py describes. On any breach the sandbox is ended as a
whole, so nothing the student started outlives its item; a request that times out, crashes or blows memory
restarts the process (reloading the notebook's cells) for the next item. Tensors come back inside the
answer on a pipe the grader created (safetensors bytes, never a file the student could name or replace).

The parts, a module each: sandbox_protocol (the messages and the value codec, shared with child/, the student's side),
sandbox_accounting (uid leases, processes and memory from /proc), sandbox_zygote (the process sandboxes are
forked from), sandbox_output (the output tap), sandbox_channel (bounded waits on the pipes). Here: `Sandbox`,
which ties them together, and what the machine allows. The names other modules use are importable from here.
"""
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from autograder.errors import SetupProblem
from autograder.sandbox.accounting import (
    UID_BASE,
    UID_LEASES,
    UID_SPAN,
    descendants,
    lease_uid,
    memory_bytes,
    over_memory,
    parent,
    pids_of_uid,
    processes,
    resident_bytes,
)
from autograder.sandbox.channel import Channel
from autograder.sandbox.output import OutputTap
from autograder.sandbox.protocol import (
    MAX_ANSWER_BYTES,
    Fresh,
    Opaque,
    Remote,
    SandboxFailure,
    Seeded,
    StudentRaised,
    as_text,
    carried,
    from_student,
    pack,
    to_student,
    unpack,
)
from autograder.sandbox.zygote import (
    SCRATCH_DIR,
    STARTUP_SECONDS,
    ZYGOTE,
    Zygote,
    cpu_cores,
    import_path,
    sandbox_env,
    threads_per_worker,
)

__all__ = ["Sandbox", "SandboxFailure", "StudentRaised", "Remote", "Opaque", "Seeded", "Fresh", "as_text",
           "to_student", "from_student", "MAX_ANSWER_BYTES", "UID_BASE", "UID_SPAN", "UID_LEASES", "processes",
           "descendants", "pids_of_uid", "resident_bytes", "memory_bytes", "OutputTap", "Zygote", "ZYGOTE",
           "SCRATCH_DIR", "STARTUP_SECONDS", "import_path", "sandbox_env", "can_isolate", "can_contain",
           "unisolated_allowed", "threads_per_worker", "cpu_cores", "UNISOLATED", "NoIsolation"]

UNISOLATED = ("process",)  # levels that isolate nothing: refused unless the TA allowed them


class NoIsolation(SandboxFailure, SetupProblem):
    """The machine isolates nothing and the TA did not allow that: the same for every submission."""

    def __init__(self):
        super().__init__("sandbox", "no isolation for the student's code on this machine (not root, and neither user "
                         "namespaces nor Landlock are allowed): it could read the course and other submissions; "
                         "grade as root, allow unprivileged user namespaces, or, for a trusted class, pass "
                         "--allow-unisolated (limits.allow_unisolated in course.yaml)")


def can_isolate():
    """Root on Linux: the sandbox gets a fresh uid (and namespaces where CAP_SYS_ADMIN allows)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0 and sys.platform.startswith("linux")


def can_contain():
    """Not root, on Linux: the sandbox tries a user namespace of its own, then Landlock."""
    return sys.platform.startswith("linux") and os.geteuid() != 0


def unisolated_allowed(limits):
    """Whether the TA allowed grading without isolation (`course grade --allow-unisolated`, or course.yaml)."""
    return os.environ.get("COURSE_ALLOW_UNISOLATED") == "1" or getattr(limits, "allow_unisolated", False)


class Sandbox:
    """One student's process: start, request, and kill; restarts itself after a failure.

    `with Sandbox(...) as sb:` starts it (unless it runs already) and kills it on the way out, however the
    block ends. Its CPU threads: `threads` (a worker's share of the cores), else one grading's (threads_per_worker(1):
    course.yaml's `threads`, at most the cores), never torch's default of one per core, so that a notebook trains the
    same bits through nbgrader, Gradescope or `course grade`.
    """

    def __init__(self, cells, harness_sources, limits, device="cpu", threads=None, tripwire=None, preload=()):
        self.cells, self.harness_sources = cells, harness_sources
        self.limits, self.device, self.threads = limits, device, threads or threads_per_worker(1)
        self.tripwire = tripwire  # scoring.tripwire_table: the oracles watched before any of the student's cells loads
        self.preload = list(preload)  # what the zygote imports once this sandbox is out (course.yaml's `preload`)
        self.isolated = can_isolate()
        self.isolation = None   # what the sandbox process reports it got (see child/isolation.py's levels)
        self.proc = None
        self.skip = set()       # cells that hung while loading: left out of every restart
        self.load_errors = {}
        self.next_id = 0
        self.restarts = 0
        self.life_fd, self.abandoned = None, False
        self.spawned = False  # whether a process was ever started: ensure() then counts a restart
        self._lifeline = threading.Lock()  # the lifeline's end, which abandon() closes from another thread

    def __enter__(self):
        if self.proc is None:
            try:
                self.start()
            except BaseException:
                self.kill()
                raise
        return self

    def __exit__(self, *exc):
        self.kill()
        return False

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self):
        # An empty folder: the sandbox's root is mounted there (in its own namespace), or, without
        # namespaces, its working folder. The sandbox's monitor removes it, whatever happens to the grader.
        self.scratch = Path(tempfile.mkdtemp(prefix="course-sandbox-", dir=SCRATCH_DIR))
        self.uid, self.lease = lease_uid() if self.isolated else (os.getuid(), None)
        if self.isolated:
            os.chown(self.scratch, self.uid, self.uid)
        os.chmod(self.scratch, 0o700)
        cfg = {"isolate": self.isolated, "contain": can_contain(), "uid": self.uid, "scratch": str(self.scratch),
               "disk_mb": self.limits.disk_mb, "processes": self.limits.processes,
               "env": sandbox_env(self.threads), "threads": self.threads, "tripwire": self.tripwire,
               "preload": self.preload}
        try:
            with self._lifeline:
                if self.abandoned:
                    raise SandboxFailure("sandbox", "not started: the grading it was for has ended")
                self.proc, (req_w, resp_r, out_r, status_r, self.life_fd) = ZYGOTE.spawn(cfg)
                self.spawned = True
        except SandboxFailure:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self._release_uid()
            raise
        self.channel = Channel(req_w, resp_r, status_r, watch=self._check_memory, end=self.kill)
        # whose processes count against the memory limit without a fresh uid: all under the sandbox's monitor
        # (the sandbox, what it started, and its orphans: the monitor is their subreaper or init is the sandbox)
        self.family = parent(self.proc)
        self.tap = OutputTap(out_r, self.limits.output_kb * 1024)
        self.tap.start()
        hello, _ = self.channel.receive(time.monotonic() + STARTUP_SECONDS, STARTUP_SECONDS)
        if "fatal" in hello:
            self.kill()
            raise SandboxFailure("sandbox", hello["fatal"])
        self.isolation = hello.get("isolation", "process")
        if self.isolation in UNISOLATED and not unisolated_allowed(self.limits):
            self.kill()
            raise NoIsolation()
        for module, source in self.harness_sources.items():
            try:  # before any student code runs: a harness that cannot load is the grader's failure
                self.request("harness", STARTUP_SECONDS, module=module, source=source)
            except (StudentRaised, SandboxFailure) as e:
                self.kill()
                raise SandboxFailure("sandbox",
                                     f"the harness '{module}' could not be loaded in the sandbox: {e}") from e
        self._load_cells()

    def _load_cells(self):
        """Run setup and graded cells; a cell that hangs is skipped and the process restarted without it."""
        cells = [[c.grade_id, c.source] for c in self.cells if c.grade_id not in self.skip]
        self.current_cell = None
        try:
            out = self.request("load", self.limits.setup_seconds * max(1, len(cells) // 4 + 1),
                               step_s=self.limits.setup_seconds, cells=cells)
        except SandboxFailure as e:
            if self.current_cell is None:
                raise
            self.skip.add(self.current_cell)
            self.load_errors[self.current_cell] = f"could not be loaded: {e}"
            self.kill()
            self.start()
            return
        for grade_id, error in out["cells"]:
            if error:
                self.load_errors.setdefault(grade_id, f"raised {error}")
        self.load_output = self.tap.take()

    def ensure(self):
        """Start the sandbox unless it runs: a restart when it ran before (a crash, a limit), else its first start."""
        if self.proc is None:
            self.restarts += self.spawned
            self.start()

    def kill(self):
        """End the sandbox: close its lifeline, and wait (bounded) for its monitor to say every process is gone.

        The grader never signals a pid itself: the monitor, the sandbox's parent, does, so the pid is never
        someone else's. The monitor also removes the scratch folder.
        """
        if self.proc is None:
            return
        self._close_lifeline()
        self.channel.exit_status(10)
        self.channel.close()
        self.proc = None
        self._release_uid()

    def abandon(self):
        """End the sandbox from another thread than the one using it, and keep it from starting again: its
        lifeline is closed (the monitor ends every process of it), and that thread's request fails as if the
        sandbox had crashed; that thread's kill() then does the rest."""
        self._close_lifeline(abandon=True)

    def _close_lifeline(self, abandon=False):
        """Close the grader's end of the lifeline once (the monitor then ends the sandbox), from any thread."""
        with self._lifeline:
            self.abandoned = self.abandoned or abandon
            if self.life_fd is not None:
                os.close(self.life_fd)
                self.life_fd = None

    def _release_uid(self):
        """Give the uid back once nothing of it is alive (killed above)."""
        if getattr(self, "lease", None) is not None:
            self.lease.close()
            self.lease = None

    def _check_memory(self):
        """End the sandbox if its processes hold more than the memory limit (the channel's watch)."""
        pids = pids_of_uid(self.uid) if self.isolated else {self.proc, *descendants(self.family)}
        if over_memory(pids, self.limits.memory_mb * 2**20):
            self.kill()
            raise SandboxFailure("memory", f"used more than {self.limits.memory_mb} MB of memory (memory limit)")

    # --- requests --------------------------------------------------------------------------------
    def request(self, op, timeout, tensors=None, limit_s=None, step_s=None, **fields):
        """Send one request and wait for its answer, all within `timeout` seconds; tensors travel inline.

        `limit_s` is the limit a timeout names (the item's, when `timeout` is what is left of it). With `step_s`
        each step the process reports (a cell it starts loading) must also end within `step_s` seconds, so a cell
        that hangs costs its own limit, not the whole request's; the request's own deadline still bounds them all.
        """
        deadline, limit_s = time.monotonic() + timeout, limit_s or timeout
        whole = (deadline, limit_s)
        self.next_id += 1
        blob = pack({k: carried(v) for k, v in tensors.items()}) if tensors else b""
        self.channel.send({"op": op, "id": self.next_id, **fields}, blob, deadline, limit_s)
        while True:  # a progress line starts a step's deadline, never one past the request's
            answer, blob = self.channel.receive(deadline, limit_s)
            if "progress" in answer:
                self.current_cell = answer["progress"]
                if step_s:
                    step_end = time.monotonic() + step_s
                    deadline, limit_s = (step_end, step_s) if step_end < whole[0] else whole
                continue
            if answer.get("id") == self.next_id:
                break
        if answer.get("restart"):  # a full disk: the next item gets a fresh one
            self.kill()
        if not answer.get("ok"):
            raise StudentRaised(str(answer.get("error", "failed"))[:500])
        answer["blob"] = blob
        return answer

    def value(self, answer):
        """The answer's value with its tensors read back (safetensors: data only, never code)."""
        try:
            tensors = unpack(answer.get("blob"))
        except Exception as e:  # bytes the student forged are a wrong answer, not a grader crash
            raise StudentRaised(f"returned tensors that could not be read back ({type(e).__name__})") from e
        try:
            return from_student(answer.get("value"), tensors)
        except (KeyError, TypeError, AttributeError) as e:
            raise StudentRaised(f"returned tensors that could not be read back ({type(e).__name__})") from e

    def output(self):
        return self.tap.take()
