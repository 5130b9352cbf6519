"""The grader's side of the sandbox: start the student's process, send requests, enforce the limits.

Limits that hold: a wall-clock deadline per request that bounds every wait on the student's process (its
writes, its reads, whatever it sends or does not send), memory of the student's process tree, output cut at
a size; disk, processes and isolation as sandbox_child.py describes. On any breach the sandbox is ended as a
whole, so nothing the student started outlives its item; a request that times out, crashes or blows memory
restarts the process (reloading the notebook's cells) for the next item. Tensors come back inside the
answer on a pipe the grader created (safetensors bytes, never a file the student could name or replace).
"""
import fcntl
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import safetensors.torch

CHILD = Path(__file__).with_name("sandbox_child.py")
UID_BASE, UID_SPAN = 200000, 50000
# One flock per uid in use, shared on purpose by every root grader of the machine (they lease from one range):
# under /run, which only root may write, where there is one, so no other user can plant it or its files
UID_LEASES = Path("/run" if os.access("/run", os.W_OK) else tempfile.gettempdir()) / "course-sandbox-uids"
SCRATCH_DIR = tempfile.gettempdir()  # where each sandbox's scratch folder is made
UNISOLATED = ("process",)  # levels that isolate nothing: refused unless the TA allowed them
STARTUP_SECONDS = 300  # the process importing torch before any student code runs: not the student's time
MAX_ANSWER_BYTES = 256 * 2**20  # one answer from the student's process, tensors included
MEMORY_POLL_SECONDS = 0.1


class SandboxFailure(Exception):
    """The student's process did not answer: kind is timeout, memory, crash or sandbox."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


class StudentRaised(Exception):
    """The student's code raised; the message is the exception and the cell line it came from."""

    def __init__(self, message):
        super().__init__(as_text(message))


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def as_text(text):
    """What the student's process said, with control characters shown as escapes (`\\x1b[2J`), never acted on.

    It ends up in terminals, results.json and feedback pages: an ANSI escape or a bidi override must read as
    what it is there, not clear a TA's screen or reorder a reason.
    """
    return CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def can_isolate():
    """Root on Linux: the sandbox gets a fresh uid (and namespaces where CAP_SYS_ADMIN allows)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0 and sys.platform.startswith("linux")


def can_contain():
    """Not root, on Linux: the sandbox tries a user namespace of its own, then Landlock."""
    return sys.platform.startswith("linux") and os.geteuid() != 0


def unisolated_allowed(limits):
    """Whether the TA allowed grading without isolation (`course grade --allow-unisolated`, or course.yaml)."""
    return os.environ.get("COURSE_ALLOW_UNISOLATED") == "1" or getattr(limits, "allow_unisolated", False)


def import_path():
    """The grader's sys.path for the zygote, less the course: no folder that holds the course's or the grader's
    own files (solutions, suites, the checkout's root that an editable install or pytest puts on the path), the
    working folder (`python -m` puts it first: a TA's batch folder, say), the home folder or the temporary
    folder above them; what is inside the Python environment, or is an installed packages folder
    (site-packages, even one inside the course's folder), stays."""
    from autograder.config import ROOT, course_root
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


def _lease_uid():
    """(uid, lease): a uid no live process has, held by an flock for the sandbox's life.

    The lease is what keeps two graders (or two batch workers) from picking the same uid at the same moment:
    the sandbox is killed by uid, so a shared uid would let one grader kill another's student.
    """
    UID_LEASES.mkdir(mode=0o700, exist_ok=True)
    st = UID_LEASES.lstat()
    if not UID_LEASES.is_dir() or UID_LEASES.is_symlink() or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise SandboxFailure("sandbox", f"{UID_LEASES} is not a folder of this user's alone: remove it")
    used = _uids_in_use()
    start = (os.getpid() * 7919 + time.monotonic_ns()) % UID_SPAN
    for k in range(UID_SPAN):
        uid = UID_BASE + (start + k) % UID_SPAN
        if uid in used:
            continue
        lease = os.fdopen(os.open(UID_LEASES / str(uid), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600), "w")
        try:
            fcntl.flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lease.close()
            continue
        if uid in _uids_in_use():  # started by a grader between our /proc scan and the lease
            lease.close()
            continue
        return uid, lease
    raise SandboxFailure("sandbox", "no free uid for the sandbox")


def _uids_in_use():
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out.add(d.stat().st_uid)
            except OSError:
                pass
    return out


def _parent(pid):
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return pid


def pids_of_uid(uid):
    """Live (not zombie) processes owned by `uid`."""
    return [pid for pid, (_, owner) in processes().items() if owner == uid]


def processes():
    """pid -> (ppid, uid) of every live (not zombie) process."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
                if stat[0] != "Z":
                    out[int(d.name)] = (int(stat[1]), d.stat().st_uid)
            except (OSError, IndexError, ValueError):
                pass
    return out


def descendants(root):
    """pid -> uid of the live processes under `root` (a grader's zygote, monitors, sandboxes, the student's)."""
    procs, found, frontier = processes(), set(), {root}
    while frontier:
        frontier = {pid for pid, (ppid, _) in procs.items() if ppid in frontier} - found
        found |= frontier
    return {pid: procs[pid][1] for pid in found}


def resident_bytes(pids):
    """Resident set size of `pids`, from statm (cheap: no page-table walk); never less than memory_bytes."""
    total, page = 0, os.sysconf("SC_PAGE_SIZE")
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            pass
    return total


def memory_bytes(pids):
    """Proportional set size of `pids`: pages shared between them (a fork's, the zygote's) counted once."""
    total = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
            key = "Pss:"
        except OSError:
            try:
                text, key = Path(f"/proc/{pid}/status").read_text(), "VmRSS:"
            except OSError:
                continue
        for line in text.splitlines():
            if line.startswith(key):
                total += int(line.split()[1]) * 1024
                break
    return total


def threads_per_worker(workers):
    """CPU threads for each of `workers` sandboxes running at once (None: one sandbox, torch's default).

    Two processes that each run torch's default of one thread per core on the same cores do not share them:
    OpenMP's spinning threads fight, and a 20 s training took over ten minutes here. So the cores are split.
    """
    if workers <= 1:
        return None
    return max(1, cpu_cores() // workers)


def cpu_cores():
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def sandbox_env(threads=None):
    """The student's environment: nothing of the grader's but locale, threads and the visible GPUs."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES",
                                                         "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                         "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env.update(PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg", CUBLAS_WORKSPACE_CONFIG=":4096:8")
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def _read_line(fd):
    out = b""
    while not out.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            break
        out += chunk
    return out.decode(errors="replace")


class Zygote:
    """One process per grader that has imported torch and forks each sandbox from there (see sandbox_child)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.proc = None

    def spawn(self, cfg):
        """Start a sandbox; returns (pid, (req_w, resp_r, out_r, status_r, life_w)), the grader's pipe ends.

        life_w is the sandbox's lifeline: only this process holds it, and its closing ends the sandbox.
        """
        for attempt in (1, 2):  # a zygote that died since its last spawn is replaced once
            (req_r, req_w), (resp_r, resp_w), (out_r, out_w), (status_r, status_w), (life_r, life_w) = \
                (os.pipe() for _ in range(5))
            theirs = [req_r, resp_w, out_w, status_w, life_r]
            try:
                with self.lock:
                    if self.proc is None or self.proc.poll() is not None:
                        self._start()
                    try:
                        socket.send_fds(self.sock, [json.dumps(cfg).encode()], theirs)
                    except OSError:
                        pass  # the zygote went away between poll() and send: reading the pid below fails
            finally:
                for fd in theirs:  # the message holds its own copies: a zygote that dies means EOF, not a wait
                    os.close(fd)
            ready, _, _ = select.select([status_r], [], [], STARTUP_SECONDS)
            line = _read_line(status_r) if ready else ""
            if line.strip().isdigit():
                return int(line), (req_w, resp_r, out_r, status_r, life_w)
            for fd in (req_w, resp_r, out_r, status_r, life_w):
                os.close(fd)
            with self.lock:
                try:  # a dying zygote closes its files a moment before it can be reaped
                    self.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    break  # the zygote is alive and still could not start it: no point retrying
        raise SandboxFailure("sandbox", f"the sandbox process could not be started: {self.last_error()}")

    def _start(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message per spawn
        # its stderr (an import that fails, a monitor's traceback) goes to a file only the grader holds: the
        # cause a failed start names
        self.errors = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-I", str(CHILD), str(theirs.fileno()),
                                      json.dumps(import_path())],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stderr=self.errors,
                                     env=sandbox_env(), cwd="/")
        theirs.close()
        self.sock = ours

    def last_error(self):
        """The last line of the zygote's stderr that says something (`ModuleNotFoundError: No module named ...`)."""
        try:
            self.errors.seek(0)
            lines = [line.strip() for line in self.errors.read()[-8192:].decode(errors="replace").splitlines()]
        except (AttributeError, OSError, ValueError):
            lines = []
        said = [line for line in lines if line and not line.startswith(("File ", "Traceback", "^", "~"))]
        return as_text(said[-1][:300]) if said else "it wrote nothing on stderr"


ZYGOTE = Zygote()


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


class Sandbox:
    """One student's process: start, request, and kill; restarts itself after a failure."""

    def __init__(self, cells, harness_sources, limits, device="cpu", threads=None, tripwire=None):
        self.cells, self.harness_sources = cells, harness_sources
        self.limits, self.device, self.threads = limits, device, threads
        self.tripwire = tripwire  # scoring.tripwire_table: the oracles watched before any of the student's cells loads
        self.isolated = can_isolate()
        self.isolation = None   # what the sandbox process reports it got (see sandbox_child's levels)
        self.proc = None
        self.skip = set()       # cells that hung while loading: left out of every restart
        self.load_errors = {}
        self.next_id = 0
        self.restarts = 0

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self):
        # An empty folder: the sandbox's root is mounted there (in its own namespace), or, without
        # namespaces, its working folder. The sandbox's monitor removes it, whatever happens to the grader.
        self.scratch = Path(tempfile.mkdtemp(prefix="course-sandbox-", dir=SCRATCH_DIR))
        self.uid, self.lease = _lease_uid() if self.isolated else (os.getuid(), None)
        if self.isolated:
            os.chown(self.scratch, self.uid, self.uid)
        os.chmod(self.scratch, 0o700)
        cfg = {"isolate": self.isolated, "contain": can_contain(), "uid": self.uid, "scratch": str(self.scratch),
               "disk_mb": self.limits.disk_mb, "processes": self.limits.processes,
               "env": sandbox_env(self.threads), "threads": self.threads, "tripwire": self.tripwire}
        try:
            self.proc, (req_w, self.resp_fd, out_r, self.status_fd, self.life_fd) = ZYGOTE.spawn(cfg)
        except SandboxFailure:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self._release_uid()
            raise
        os.set_blocking(req_w, False)  # a student who never reads cannot block the grader's writes
        # whose processes count against the memory limit without a fresh uid: all under the sandbox's monitor
        # (the sandbox, what it started, and its orphans: the monitor is their subreaper or init is the sandbox)
        self.family = _parent(self.proc)
        self.req_fd, self.buf, self.memory_checked = req_w, b"", 0.0
        self.tap = OutputTap(out_r, self.limits.output_kb * 1024)
        self.tap.start()
        hello, _ = self._receive(time.monotonic() + STARTUP_SECONDS, STARTUP_SECONDS)
        if "fatal" in hello:
            self.kill()
            raise SandboxFailure("sandbox", hello["fatal"])
        self.isolation = hello.get("isolation", "process")
        if self.isolation in UNISOLATED and not unisolated_allowed(self.limits):
            self.kill()
            raise SandboxFailure("sandbox", "no isolation for the student's code on this machine (not root, and "
                                 "neither user namespaces nor Landlock are allowed): it could read the course and "
                                 "other submissions; grade as root, allow unprivileged user namespaces, or, for a "
                                 "trusted class, pass --allow-unisolated (limits.allow_unisolated in course.yaml)")
        for module, source in self.harness_sources.items():
            try:  # before any student code runs: a harness that cannot load is the grader's failure
                self.request("harness", STARTUP_SECONDS, module=module, source=source)
            except (StudentRaised, SandboxFailure) as e:
                self.kill()
                raise SandboxFailure("sandbox", f"the harness '{module}' could not be loaded in the sandbox: {e}") from e
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
            self.load_errors[self.current_cell] = f"{e} when the notebook's cells were run"
            self.kill()
            self.start()
            return
        for grade_id, error in out["cells"]:
            if error:
                self.load_errors.setdefault(grade_id, f"raised {error}")
        self.load_output = self.tap.take()

    def ensure(self):
        if self.proc is None:
            self.restarts += 1
            self.start()

    def kill(self):
        """End the sandbox: close its lifeline, and wait (bounded) for its monitor to say every process is gone.

        The grader never signals a pid itself: the monitor, the sandbox's parent, does, so the pid is never
        someone else's. The monitor also removes the scratch folder.
        """
        if self.proc is None:
            return
        os.close(self.life_fd)
        self._exit_status(10)
        for fd in (self.req_fd, self.resp_fd, self.status_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.proc = None
        self._release_uid()

    def _release_uid(self):
        """Give the uid back once nothing of it is alive (killed above)."""
        if getattr(self, "lease", None) is not None:
            self.lease.close()
            self.lease = None

    def close(self):
        self.kill()

    # --- the channel -----------------------------------------------------------------------------
    def _wait(self, fd, deadline, limit_s, write=False):
        """Until `fd` is ready; raises at the deadline or past the memory limit."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise SandboxFailure("timeout", f"did not finish within {limit_s:g} s (time limit)")
            ready = select.select([] if write else [fd], [fd] if write else [], [], min(left, MEMORY_POLL_SECONDS))
            if time.monotonic() - self.memory_checked >= MEMORY_POLL_SECONDS:
                self.memory_checked = time.monotonic()
                pids = pids_of_uid(self.uid) if self.isolated else {self.proc, *descendants(self.family)}
                limit = self.limits.memory_mb * 2**20
                # PSS walks every page table (ms per poll, which slowed a 2-thread training by 10%): only when
                # the resident sizes, which count shared pages once per process, add up to more than the limit
                if resident_bytes(pids) > limit and memory_bytes(pids) > limit:
                    self.kill()
                    raise SandboxFailure("memory", f"used more than {self.limits.memory_mb} MB of memory (memory limit)")
            if ready[0] or ready[1]:
                return

    def _crash(self, why):
        self.kill()
        raise SandboxFailure("crash", why)

    def _send(self, data, deadline, limit_s):
        view = memoryview(data)
        while view:
            self._wait(self.req_fd, deadline, limit_s, write=True)
            try:
                view = view[os.write(self.req_fd, view[:1 << 20]):]
            except BlockingIOError:
                continue
            except OSError:
                self._crash(f"the notebook's process ended ({self._exit_status()})")

    def _fill(self, deadline, limit_s):
        self._wait(self.resp_fd, deadline, limit_s)
        chunk = os.read(self.resp_fd, 1 << 20)
        if not chunk:
            self._crash(f"the notebook's process ended ({self._exit_status()})")
        self.buf += chunk
        if len(self.buf) > MAX_ANSWER_BYTES + 2**20:
            self._crash(f"the notebook's process sent more than {MAX_ANSWER_BYTES >> 20} MB on the grader's channel")

    def _receive(self, deadline, limit_s):
        """(message, blob): the next JSON line and the bytes it announces, all before the deadline."""
        while b"\n" not in self.buf:
            self._fill(deadline, limit_s)
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):  # a forged line, say a thousand nested lists deep
            msg = None
        size = msg.get("blob", 0) if isinstance(msg, dict) else None
        if not isinstance(size, int) or size < 0:
            self._crash("the grader's channel carried something that is not the protocol")
        if size > MAX_ANSWER_BYTES:
            self._crash(f"the notebook's process sent more than {MAX_ANSWER_BYTES >> 20} MB on the grader's channel")
        while len(self.buf) < size:
            self._fill(deadline, limit_s)
        blob, self.buf = self.buf[:size], self.buf[size:]
        return msg, blob

    def _exit_status(self, wait_s=5):
        """How the student's process ended, as its monitor saw it (bounded wait)."""
        ready, _, _ = select.select([self.status_fd], [], [], wait_s)
        line = _read_line(self.status_fd) if ready else ""
        if not line.strip().lstrip("-").isdigit():
            return "exit status unknown"
        status = int(line)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            return f"killed by signal {signal.Signals(sig).name}" if sig in signal.Signals._value2member_map_ else f"signal {sig}"
        return f"exit code {os.WEXITSTATUS(status)}"

    def request(self, op, timeout, tensors=None, limit_s=None, step_s=None, **fields):
        """Send one request and wait for its answer, all within `timeout` seconds; tensors travel inline.

        `limit_s` is the limit a timeout names (the item's, when `timeout` is what is left of it). With `step_s`
        each step the process reports (a cell it starts loading) must also end within `step_s` seconds, so a cell
        that hangs costs its own limit, not the whole request's; the request's own deadline still bounds them all.
        """
        deadline, limit_s = time.monotonic() + timeout, limit_s or timeout
        whole = (deadline, limit_s)
        self.next_id += 1
        blob = b""
        if tensors:
            blob = safetensors.torch.save({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()})
        msg = {"op": op, "id": self.next_id, **fields, "blob": len(blob)}
        self._send((json.dumps(msg) + "\n").encode() + blob, deadline, limit_s)
        while True:  # a progress line starts a step's deadline, never one past the request's
            answer, blob = self._receive(deadline, limit_s)
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
        tensors = {}
        if answer.get("blob"):
            try:
                tensors = safetensors.torch.load(answer["blob"])
            except Exception as e:  # bytes the student forged are a wrong answer, not a grader crash
                raise StudentRaised(f"returned tensors that could not be read back ({type(e).__name__})")
        try:
            return decode(answer.get("value"), tensors)
        except (KeyError, TypeError) as e:
            raise StudentRaised(f"returned tensors that could not be read back ({type(e).__name__})")

    def output(self):
        return self.tap.take()


class Remote:
    """A student's object that lives in the sandbox (a module), referred to by handle."""

    def __init__(self, handle, type_name):
        self.handle, self.type_name = handle, type_name

    def __repr__(self):
        return f"<student {self.type_name}>"


def decode(v, tensors):
    if isinstance(v, dict):
        if "T" in v:
            t = tensors[v["T"]]
            t.student_device = v.get("device", "cpu")
            return t
        if "tuple" in v:
            return tuple(decode(x, tensors) for x in v["tuple"])
        if "list" in v:
            return [decode(x, tensors) for x in v["list"]]
        if "dict" in v:
            return {k: decode(x, tensors) for k, x in v["dict"].items()}
        if "handle" in v:
            return Remote(v["handle"], v.get("type", "object"))
        if "repr" in v:
            return Opaque(v["repr"])
        return v
    return v


class Opaque:
    """A value the protocol could not carry (neither tensor nor number): only its description came back."""

    def __init__(self, text):
        self.text = as_text(str(text))

    def __repr__(self):
        return self.text


def encode(v, tensors, device="cpu"):
    """Arguments for the student's process: tensors by reference, modules by handle."""
    if isinstance(v, torch.Tensor):
        key = f"a{len(tensors)}"
        tensors[key] = v
        return {"T": key, "device": device}
    if isinstance(v, Remote):
        return {"handle": v.handle}
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).replace("torch.", "")}
    if isinstance(v, torch.Generator):
        raise TypeError("send a generator as Seeded(seed)")
    if isinstance(v, Seeded):
        return {"generator": v.seed}
    if isinstance(v, Fresh):
        state = []
        for k, t in enumerate(v.state):
            key = f"s{len(tensors)}"
            tensors[key] = t
            state.append(key)
        return {"new": v.cls, "args": encode(list(v.args), tensors, device),
                "kwargs": encode(dict(v.kwargs), tensors, device), "state": state, "to": device}
    if isinstance(v, tuple):
        return {"tuple": [encode(x, tensors, device) for x in v]}
    if isinstance(v, list):
        return {"list": [encode(x, tensors, device) for x in v]}
    if isinstance(v, dict):
        return {"dict": {k: encode(x, tensors, device) for k, x in v.items()}}
    return v


class Seeded:
    """A torch.Generator seeded in the student's process."""

    def __init__(self, seed):
        self.seed = seed


class Fresh:
    """A PyTorch module (torch.nn.<cls>) built in the student's process with the grader's weights."""

    def __init__(self, cls, *args, state=(), **kwargs):
        self.cls, self.args, self.kwargs, self.state = cls, args, kwargs, list(state)
