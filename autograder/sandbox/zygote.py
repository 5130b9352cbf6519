"""The zygote: one process per grader (or per worker pool) that has imported torch and forks each sandbox from there.

It also imports, once, what notebooks' setup cells import: each sandbox inherits them. What an assignment's sandboxes
may import later at a cost of seconds (course.yaml's `preload`: torch._dynamo, which torch.optim's first optimizer
imports) it imports once a sandbox that names it has forked, while it waits for the next request: no grading waits
for it (child/monitor.py zygote).

Started from child/__main__.py with the grader's import path less the course and an environment with nothing of
the grader's but its thread count (import_path, sandbox_env); a sandbox then starts in milliseconds, not in torch's
import time. This module imports no torch (its protocol imports are deferred): a worker starts its zygote first and
imports the grader (torch, pytest) while the zygote imports torch on another core.
"""
import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

CHILD = Path(__file__).with_name("child") / "__main__.py"  # the student's side, run as a script (child/__init__.py)
SCRATCH_DIR = tempfile.gettempdir()  # where each sandbox's scratch folder is made
STARTUP_SECONDS = 300  # the process importing torch before any student code runs: not the student's time


def import_path():
    """The grader's sys.path for the zygote, less the course: no folder that holds the course's or the grader's
    own files (solutions, suites, the checkout's root that an editable install or pytest puts on the path), the
    working folder (`python -m` puts it first: a TA's batch folder, say), the home folder or the temporary
    folder above them; what is inside the Python environment, or is an installed packages folder
    (site-packages, even one inside the course's folder), stays."""
    from autograder.course.config import ROOT, course_root
    env = [Path(p).resolve() for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}]
    hidden = [ROOT.resolve(), course_root().resolve(), Path.cwd().resolve(), Path.home().resolve(),
              Path(SCRATCH_DIR).resolve()]
    out = []
    for entry in sys.path:
        if not entry or not os.path.exists(entry):
            continue
        path = Path(entry).resolve()
        inside_env = any(path == e or e in path.parents for e in env) or \
            bool({"site-packages", "dist-packages"} & set(path.parts))
        holds_hidden = any(path == h or path in h.parents for h in hidden)
        inside_course = any(h in path.parents for h in hidden[:2])
        if inside_env or not (holds_hidden or inside_course):
            out.append(str(path))
    return out


def threads_per_worker(workers):
    """CPU threads for each of `workers` sandboxes running at once: the cores split evenly, at least one each and
    at most course.yaml's `threads`.

    Two processes that each run torch's default of one thread per core on the same cores do not share them:
    OpenMP's spinning threads fight, and a 20 s training took over ten minutes here. So the cores are split, and
    one worker gets its share explicitly (never torch's default, which OMP_NUM_THREADS in the TA's shell moves).
    The lectures' models are small: two threads that wait passively trained w8l4's transformer 2.3x slower than
    one thread, and two that spin were 8x slower beside a busy process (course.yaml's `threads` says more).
    """
    from autograder.course.config import load_course
    return max(1, min(load_course().threads, cpu_cores() // max(1, workers)))


def experiments_at_once(workers):
    """How many experiments one of `workers` gradings may train side by side (each sandbox with
    threads_per_worker's threads): its share of the cores over its threads. One grading on two cores trains two
    at once; two workers on two cores, one each."""
    return max(1, cpu_cores() // max(1, workers) // threads_per_worker(workers))


def cpu_cores():
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def sandbox_env(threads=None):
    """The student's environment: nothing of the grader's but locale, threads and the visible GPUs.

    OpenMP's threads wait passively: its default spins them between parallel regions, and where another process
    keeps the cores busy (a shared JupyterHub server, a second worker) the spinning fights it for them. libgomp
    reads the setting when torch loads it, so it must be in the zygote's environment, not set after the fork; so
    must the thread count (the zygote sets torch's from OMP_NUM_THREADS as it imports it, child/monitor.py).
    """
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES",
                                                         "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                         "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env.update(PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg", CUBLAS_WORKSPACE_CONFIG=":4096:8",
               OMP_WAIT_POLICY="PASSIVE")
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


class Zygote:
    """The grader's zygote (see child/monitor.py's `zygote`): started at the first spawn, replaced once if it died;
    or another process's, shared (attach)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.proc = None
        self.threads = None  # the CPU threads its sandboxes start with (sandbox_env's OMP_NUM_THREADS)
        self.shared = False  # whether it is another process's (attach): then self.proc is None

    def attach(self, sock, threads):
        """Fork this process's sandboxes from another process's zygote, through `sock` (its control socket, as a
        pool's coordinator passes it to each worker): one zygote's imports (torch, matplotlib, IPython: 2.5 s of CPU)
        for the whole pool instead of one per worker. Each request is one message carrying its own pipes, so the
        workers' requests never mix. A shared zygote that stops answering is replaced by one of this process's."""
        with self.lock:
            self.sock, self.threads, self.proc, self.shared = sock, threads, None, True

    def spawn(self, cfg):
        """Start a sandbox; returns (pid, (req_w, resp_r, out_r, status_r, life_w)), the grader's pipe ends.

        life_w is the sandbox's lifeline: only this process holds it, and its closing ends the sandbox.
        """
        from autograder.sandbox.channel import read_line
        from autograder.sandbox.protocol import SandboxFailure
        for _attempt in (1, 2):  # a zygote that died since its last spawn is replaced once
            (req_r, req_w), (resp_r, resp_w), (out_r, out_w), (status_r, status_w), (life_r, life_w) = \
                (os.pipe() for _ in range(5))
            theirs = [req_r, resp_w, out_w, status_w, life_r]
            try:
                with self.lock:
                    if not self.shared and (self.proc is None or self.proc.poll() is not None):
                        self._start(cfg.get("threads") or self.threads)
                    # the zygote may have gone away between poll() and send: reading the pid below fails then
                    with contextlib.suppress(OSError):
                        socket.send_fds(self.sock, [json.dumps(cfg).encode()], theirs)
            finally:
                for fd in theirs:  # the message holds its own copies: a zygote that dies means EOF, not a wait
                    os.close(fd)
            ready, _, _ = select.select([status_r], [], [], STARTUP_SECONDS)
            line = read_line(status_r) if ready else ""
            if line.strip().isdigit():
                return int(line), (req_w, resp_r, out_r, status_r, life_w)
            for fd in (req_w, resp_r, out_r, status_r, life_w):
                os.close(fd)
            with self.lock:
                if self.shared:  # the coordinator's zygote is gone: the next attempt starts this process's own
                    self.shared, self.proc = False, None
                    continue
                try:  # a dying zygote closes its files a moment before it can be reaped
                    self.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    break  # the zygote is alive and still could not start it: no point retrying
        raise SandboxFailure("sandbox", f"the sandbox process could not be started: {self.last_error()}")

    def ensure_started(self, threads=None):
        """Start the zygote now (a warm worker's), not at the first spawn, its sandboxes with `threads` CPU threads;
        a running one is kept."""
        with self.lock:
            if not self.shared and (self.proc is None or self.proc.poll() is not None):
                self._start(threads)

    def _start(self, threads=None):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message per spawn
        # its stderr (an import that fails, a monitor's traceback) goes to a file only the grader holds: the
        # cause a failed start names; its stdout nowhere (each sandbox has its own output pipe), so that neither it
        # nor a sandbox holds the grader's stdout, which a caller reading it to its end would wait on
        self.errors = tempfile.TemporaryFile()  # noqa: SIM115 -- kept for the zygote's life
        self.proc = subprocess.Popen([sys.executable, "-I", str(CHILD), str(theirs.fileno()),
                                      json.dumps(import_path()), str(os.getpid())],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.errors,
                                     env=sandbox_env(threads), cwd="/")
        theirs.close()
        self.sock, self.threads = ours, threads

    def last_error(self):
        """The last line of the zygote's stderr that says something (`ModuleNotFoundError: No module named ...`)."""
        from autograder.sandbox.protocol import as_text
        try:
            self.errors.seek(0)
            lines = [line.strip() for line in self.errors.read()[-8192:].decode(errors="replace").splitlines()]
        except (AttributeError, OSError, ValueError):
            lines = []
        said = [line for line in lines if line and not line.startswith(("File ", "Traceback", "^", "~"))]
        return as_text(said[-1][:300]) if said else "it wrote nothing on stderr"


ZYGOTE = Zygote()
