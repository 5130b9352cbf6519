"""The grader's side of the sandbox: start the student's process, send requests, enforce the limits.

Limits that hold: a wall-clock deadline per request, resident memory of the student's process tree,
output cut at a size, and on any breach every process of the sandbox's own uid is killed, so nothing the
student started outlives its item. A request that times out, crashes or blows memory restarts the process
(reloading the notebook's cells) for the next item.
"""
import fcntl
import json
import os
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
from safetensors.torch import load_file, save_file

from autograder.config import ROOT

CHILD = Path(__file__).with_name("sandbox_child.py")
UID_BASE, UID_SPAN = 200000, 50000
UID_LEASES = Path(tempfile.gettempdir()) / "course-sandbox-uids"   # one flock per uid in use
STARTUP_SECONDS = 300  # the process importing torch before any student code runs: not the student's time


class SandboxFailure(Exception):
    """The student's process did not answer: kind is timeout, memory, crash or sandbox."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


class StudentRaised(Exception):
    """The student's code raised; the message is the exception and the cell line it came from."""


def can_isolate():
    return hasattr(os, "geteuid") and os.geteuid() == 0 and sys.platform.startswith("linux")


def hidden_paths(extra=()):
    """Folders the student's process must not see: the whole course, the installed packages, submissions."""
    hide = [ROOT] + [Path(__import__(m).__path__[0]) for m in ("solutions", "autograder")]
    hide += [Path(p) for p in extra]
    return sorted({str(p.resolve() if p.is_dir() else p.resolve().parent) for p in hide})


def kept_paths():
    """What stays visible inside a hidden folder: the Python environment the grader runs in."""
    return sorted({str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix)})


def _lease_uid():
    """(uid, lease): a uid no live process has, held by an flock for the sandbox's life.

    The lease is what keeps two graders (or two batch workers) from picking the same uid at the same moment:
    the sandbox is killed by uid, so a shared uid would let one grader kill another's student.
    """
    UID_LEASES.mkdir(mode=0o700, exist_ok=True)
    used = _uids_in_use()
    start = (os.getpid() * 7919 + time.monotonic_ns()) % UID_SPAN
    for k in range(UID_SPAN):
        uid = UID_BASE + (start + k) % UID_SPAN
        if uid in used:
            continue
        lease = open(UID_LEASES / str(uid), "w")
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


def pids_of_uid(uid):
    """Live (not zombie) processes owned by `uid`."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if d.stat().st_uid == uid and (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(int(d.name))
            except (OSError, IndexError):
                pass
    return out


def rss_bytes(pids):
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
    return total


def threads_per_worker(workers):
    """CPU threads for each of `workers` sandboxes running at once (None: one sandbox, torch's default).

    Two processes that each run torch's default of one thread per core on the same cores do not share them:
    OpenMP's spinning threads fight, and a 20 s training took over ten minutes here. So the cores are split.
    """
    if workers <= 1:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // workers)


def sandbox_env(threads=None):
    """The student's environment: nothing of the grader's but locale, threads and the visible GPUs."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES",
                                                         "OMP_NUM_THREADS", "MKL_NUM_THREADS",
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
        """Start a sandbox process; returns (pid, (req_w, resp_r, out_r, status_r)), the grader's pipe ends."""
        for attempt in (1, 2):  # a zygote that died since its last spawn is replaced once
            (req_r, req_w), (resp_r, resp_w), (out_r, out_w), (status_r, status_w) = (os.pipe() for _ in range(4))
            theirs = [req_r, resp_w, out_w, status_w]
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
                return int(line), (req_w, resp_r, out_r, status_r)
            for fd in (req_w, resp_r, out_r, status_r):
                os.close(fd)
            with self.lock:
                try:  # a dying zygote closes its files a moment before it can be reaped
                    self.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    break  # the zygote is alive and still could not start it: no point retrying
        raise SandboxFailure("sandbox", "the sandbox process could not be started")

    def _start(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message per spawn
        self.proc = subprocess.Popen([sys.executable, "-I", str(CHILD), str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                     env=sandbox_env(), cwd="/")
        theirs.close()
        self.sock = ours


ZYGOTE = Zygote()


class OutputTap(threading.Thread):
    """Reads the student's stdout/stderr; keeps the first `limit` bytes and counts the rest."""

    def __init__(self, fd, limit):
        super().__init__(daemon=True)
        self.fd, self.limit = fd, limit
        self.kept, self.dropped = bytearray(), 0
        self.lock = threading.Lock()

    def run(self):
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            with self.lock:
                room = self.limit - len(self.kept)
                self.kept += chunk[:max(room, 0)]
                self.dropped += max(len(chunk) - max(room, 0), 0)

    def take(self):
        """What was printed since the last take, cut to the limit with a note."""
        time.sleep(0.05)  # let the reader drain what the process flushed before it answered
        with self.lock:
            text = self.kept.decode("utf-8", "replace")
            if self.dropped:
                text += f"\n[... {self.dropped} more bytes of output cut]"
            self.kept, self.dropped = bytearray(), 0
        return text


class Sandbox:
    """One student's process: start, request, and kill; restarts itself after a failure."""

    def __init__(self, cells, harness_sources, limits, hide=(), device="cpu", threads=None):
        self.cells, self.harness_sources = cells, harness_sources
        self.limits, self.device, self.threads = limits, device, threads
        self.isolated = can_isolate()
        self.hide = hidden_paths(hide) if self.isolated else []
        self.proc = None
        self.skip = set()       # cells that hung while loading: left out of every restart
        self.load_errors = {}
        self.next_id = 0
        self.restarts = 0

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self):
        self.scratch = Path(tempfile.mkdtemp(prefix="course-sandbox-"))
        self.uid, self.lease = _lease_uid() if self.isolated else (os.getuid(), None)
        if self.isolated:
            os.chown(self.scratch, self.uid, self.uid)
        os.chmod(self.scratch, 0o700)
        cfg = {"isolate": self.isolated, "uid": self.uid, "hide": self.hide, "keep": kept_paths(),
               "scratch": str(self.scratch), "max_file_bytes": 512 * 2**20, "env": sandbox_env(self.threads),
               "threads": self.threads}
        try:
            self.proc, (req_w, resp_r, out_r, status_r) = ZYGOTE.spawn(cfg)
        except SandboxFailure:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self._release_uid()
            raise
        self.req, self.resp_fd, self.status_fd, self.buf = os.fdopen(req_w, "w"), resp_r, status_r, b""
        self.tap = OutputTap(out_r, self.limits.output_kb * 1024)
        self.tap.start()
        hello = self._read(STARTUP_SECONDS)
        if "fatal" in hello:
            self.kill()
            raise SandboxFailure("sandbox", hello["fatal"])
        for module, source in self.harness_sources.items():
            self.request("harness", STARTUP_SECONDS, module=module, source=source)
        self._load_cells()

    def _load_cells(self):
        """Run setup and graded cells; a cell that hangs is skipped and the process restarted without it."""
        cells = [[c.grade_id, c.source] for c in self.cells if c.grade_id not in self.skip]
        self.current_cell = None
        try:
            out = self.request("load", self.limits.setup_seconds * max(1, len(cells) // 4 + 1), cells=cells)
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
        """Kill every process of the sandbox's uid (or group), close the pipes, remove scratch."""
        if self.proc is None:
            return
        for _ in range(3):
            try:
                os.killpg(self.proc, signal.SIGKILL)
            except OSError:
                pass
            if self.isolated:
                for pid in pids_of_uid(self.uid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            if not self.isolated or not pids_of_uid(self.uid):
                break
            time.sleep(0.05)
        for f in (self.req,):
            try:
                f.close()
            except OSError:
                pass
        for fd in (self.resp_fd, self.status_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.proc = None
        self._release_uid()

    def _release_uid(self):
        """Give the uid back once nothing of it is alive (killed above)."""
        if getattr(self, "lease", None) is not None:
            self.lease.close()
            self.lease = None

    def close(self):
        self.kill()

    # --- requests --------------------------------------------------------------------------------
    def _read(self, timeout):
        """The next JSON line from the student's process, within `timeout` and the memory limit."""
        deadline = time.monotonic() + timeout
        limit = self.limits.memory_mb * 2**20
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise SandboxFailure("timeout", f"did not finish within {timeout:g} s (time limit)")
            ready, _, _ = select.select([self.resp_fd], [], [], min(left, 0.1))
            if ready:
                chunk = os.read(self.resp_fd, 1 << 20)
                if not chunk:
                    code = self._exit_status()
                    self.kill()
                    raise SandboxFailure("crash", f"the notebook's process ended ({code})")
                self.buf += chunk
                if len(self.buf) > 64 * 2**20:
                    self.kill()
                    raise SandboxFailure("crash", "the notebook's process sent more than 64 MB on the grader's channel")
            pids = pids_of_uid(self.uid) if self.isolated else [self.proc]
            if rss_bytes(pids) > limit:
                self.kill()
                raise SandboxFailure("memory", f"used more than {self.limits.memory_mb} MB of memory (memory limit)")
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            self.kill()
            raise SandboxFailure("crash", "the grader's channel carried something that is not the protocol")

    def _exit_status(self):
        """How the student's process ended, as its monitor saw it."""
        ready, _, _ = select.select([self.status_fd], [], [], 5)
        line = _read_line(self.status_fd) if ready else ""
        if not line.strip().lstrip("-").isdigit():
            return "exit status unknown"
        status = int(line)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            return f"killed by signal {signal.Signals(sig).name}" if sig in signal.Signals._value2member_map_ else f"signal {sig}"
        return f"exit code {os.WEXITSTATUS(status)}"

    def request(self, op, timeout, tensors=None, **fields):
        """Send one request and wait for its answer; tensors travel in a safetensors file."""
        self.next_id += 1
        msg = {"op": op, "id": self.next_id, **fields}
        if tensors:
            name = f"in_{self.next_id}.safetensors"
            save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}, str(self.scratch / name))
            os.chmod(self.scratch / name, 0o644)
            msg["file"] = name
        try:
            self.req.write(json.dumps(msg) + "\n")
            self.req.flush()
        except (BrokenPipeError, OSError):
            code = self._exit_status()
            self.kill()
            raise SandboxFailure("crash", f"the notebook's process ended ({code})")
        while True:
            answer = self._read(timeout)
            if "progress" in answer:
                self.current_cell = answer["progress"]
                continue
            if answer.get("id") == self.next_id:
                break
        if msg.get("file"):
            (self.scratch / msg["file"]).unlink(missing_ok=True)
        if not answer.get("ok"):
            raise StudentRaised(str(answer.get("error", "failed"))[:500])
        return answer

    def value(self, answer):
        """The answer's value with its tensors read back (safetensors: data only, never code)."""
        tensors = {}
        name = answer.get("file")
        if name:
            path = self.scratch / Path(name).name
            try:
                tensors = load_file(str(path))
            except Exception as e:  # a file the student tampered with is a wrong answer, not a grader crash
                raise StudentRaised(f"returned tensors that could not be read back ({type(e).__name__})")
            finally:
                path.unlink(missing_ok=True)
        return decode(answer.get("value"), tensors)

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
        self.text = text

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
