"""The student's side of the sandbox: a standalone script run as its own process, never imported.

It enters the sandbox before it reads any student code, then answers the grader's requests: run the
notebook's cells, call an item on tensors the grader sent, construct a module, return its state, train a
harness experiment. Nothing here decides a score: the grader compares what comes back with its own reference.

Every message is one JSON line, followed by `blob` bytes of safetensors when it carries tensors, on pipes
the grader created: the grader never opens a path the student can name, so nothing the student leaves on
disk (a FIFO, a symlink, a huge file) can make the grader wait or write where it should not.

Isolation, the best the machine allows (the grader reports which in `extra_data.isolation`):
  namespaces  root with CAP_SYS_ADMIN: a PID namespace (the sandbox is its init: when it dies, every process
              it started dies with it), no network, and a root of its own holding only the system's programs
              and libraries and the Python environment (read only), a fresh /proc, and a size-limited tmpfs
              (/tmp, /var/tmp, /dev/shm) as the only writable place; a fresh uid; process and file-size limits.
  uid         root without CAP_SYS_ADMIN (Docker's default): a fresh uid with its process and file-size limits,
              killed as a whole by uid; the machine's files and network stay as that uid finds them.
  process     not root: a plain child process in its own session, killed by process group.
At every level a seccomp filter forbids new user namespaces (see forbid_user_namespaces).
"""
import ctypes
import errno
import json
import os
import platform
import sys
import traceback

CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWIPC, CLONE_NEWPID = 0x00020000, 0x40000000, 0x08000000, 0x20000000
MAX_ITEMS = 100_000  # entries of one list/dict sent back: far above any state_dict, below a runaway structure
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 1, 22, 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# What programs and libraries read from /etc; nothing else of the machine's configuration is visible.
ETC = ("passwd", "group", "nsswitch.conf", "hosts", "host.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
       "localtime", "timezone", "fonts", "alternatives", "ssl", "ca-certificates", "mime.types", "matplotlibrc")
DEVICES = ("null", "zero", "full", "random", "urandom")
HOME = "/tmp/home"


def libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(result, what):
    if result != 0:
        raise OSError(ctypes.get_errno(), f"could not {what}")


def bind(lib, source, target, writable=False, dev=False, recursive=True):
    """Mount `source` at `target` (made as a file or folder to match), read only unless asked."""
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _check(lib.mount(source.encode(), target.encode(), None, MS_BIND | (MS_REC if recursive else 0), None),
           f"mount {source}")
    if not writable:
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (0 if dev else MS_NODEV)
        _check(lib.mount(None, target.encode(), None, flags, None), f"make {source} read-only")


def python_dirs():
    """The Python environment the grader runs in: its prefixes and the interpreter's own folder, resolved."""
    dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                                          os.path.dirname(sys.executable),
                                          os.path.dirname(os.path.realpath(sys.executable)))}
    dirs |= {os.path.realpath(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p}
    outer = sorted(d for d in dirs if os.path.isdir(d))
    return [d for d in outer if not any(d != o and d.startswith(o.rstrip("/") + "/") for o in outer)]


def build_root(lib, cfg):
    """Mount the sandbox's whole world at cfg['scratch'] and make it the root: an allowlist, not a denylist."""
    root = cfg["scratch"]
    _check(lib.mount(b"tmpfs", root.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=2m,mode=0755"), "make the root")
    for name in SYSTEM_DIRS:
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), f"{root}/{name}")
        elif os.path.isdir(host):
            bind(lib, host, root + host)
    for name in ETC:
        if os.path.exists("/etc/" + name):
            bind(lib, "/etc/" + name, f"{root}/etc/{name}")
    for path in python_dirs():
        if not path.startswith(tuple(f"/{d}/" for d in SYSTEM_DIRS)):
            bind(lib, path, root + path)
    os.makedirs(root + "/dev", exist_ok=True)
    _check(lib.mount(b"tmpfs", f"{root}/dev".encode(), b"tmpfs", MS_NOSUID, b"size=64k,mode=0755"), "make /dev")
    gpus = [n for n in os.listdir("/dev") if n.startswith("nvidia")]  # CUDA's device files, when there are any
    for name in DEVICES + tuple(gpus):
        if os.path.exists("/dev/" + name):
            bind(lib, "/dev/" + name, f"{root}/dev/{name}", writable=True, dev=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    os.makedirs(root + "/proc")
    _check(lib.mount(b"proc", f"{root}/proc".encode(), b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
    if os.path.isdir("/sys"):  # devices and CPUs for torch and CUDA; not what is mounted below it (cgroups, debugfs)
        bind(lib, "/sys", root + "/sys", recursive=False)
    # The only writable place: one tmpfs of disk_mb, seen at /tmp, /var/tmp and /dev/shm.
    os.makedirs(root + "/tmp")
    _check(lib.mount(b"tmpfs", f"{root}/tmp".encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                     f"size={cfg['disk_mb']}m,mode=1777".encode()), "make /tmp")
    for alias in ("/var/tmp", "/dev/shm"):
        bind(lib, root + "/tmp", root + alias, writable=True)
    os.makedirs(root + HOME, mode=0o700)
    os.chown(root + HOME, cfg["uid"], cfg["uid"])
    os.chdir(root)
    _check(lib.syscall(SYS_PIVOT_ROOT[platform.machine()], b".", b"."), "pivot into the sandbox's root")
    _check(lib.umount2(b".", MNT_DETACH), "leave the machine's root")
    os.chdir("/")
    for path in (b"/", b"/dev"):
        _check(lib.mount(None, path, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | (MS_NODEV if path == b"/" else 0), None),
               "make the root read-only")


# (audit arch, clone, unshare, clone3) per machine, for the seccomp filter below
SECCOMP_ARCH = {"x86_64": (0xC000003E, 56, 272, 435), "aarch64": (0xC00000B7, 220, 97, 435)}
CLONE_NEWUSER = 0x10000000


def forbid_user_namespaces(lib):
    """A seccomp filter: no new user namespace (unshare or clone with CLONE_NEWUSER), no clone3, no x32 calls.

    Inside a user namespace of its own an unprivileged process may mount a tmpfs of any size: memory that
    neither the disk limit nor the memory limit (which counts processes) would see. clone3 passes its flags
    in memory a filter cannot read, so it answers ENOSYS and the C library falls back to clone.
    """
    import struct
    if platform.machine() not in SECCOMP_ARCH:
        return False
    arch, clone, unshare, clone3 = SECCOMP_ARCH[platform.machine()]
    allow, enosys, eperm = 0x7FFF0000, 0x00050000 | errno.ENOSYS, 0x00050000 | errno.EPERM
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    program = [
        (ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, allow),       # 0-2  another ABI: not ours to judge
        (ld, 0, 0, 0), (jge, 0, 1, 0x40000000), (ret, 0, 0, enosys),  # 3-5  x32 calls
        (jeq, 0, 1, clone3), (ret, 0, 0, enosys),                     # 6-7
        (jeq, 1, 0, unshare), (jeq, 0, 3, clone),                     # 8-9
        (ld, 0, 0, 16), (jset, 0, 1, CLONE_NEWUSER), (ret, 0, 0, eperm),  # 10-12 flags are args[0]
        (ret, 0, 0, allow),                                           # 13
    ]
    code = b"".join(struct.pack("HBBI", *insn) for insn in program)
    buf = ctypes.create_string_buffer(code)
    fprog = struct.pack("HxxxxxxP", len(program), ctypes.addressof(buf))
    _check(lib.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0), "install the seccomp filter")
    return True


def enter_sandbox(cfg, in_pid_namespace):
    """Isolate this process as well as the machine allows, drop to the sandbox's uid; returns the level."""
    import resource
    import signal
    level, lib = "process", libc()
    if cfg["isolate"]:
        level = "uid"
        if in_pid_namespace and lib.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC) == 0:
            _check(lib.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make the mounts private")
            build_root(lib, cfg)
            level = "namespaces"
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    file_bytes = cfg["disk_mb"] * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file past the limit fails to grow (EFBIG), nothing dies
    if cfg["isolate"]:
        resource.setrlimit(resource.RLIMIT_NPROC, (cfg["processes"], cfg["processes"]))  # counts this uid only
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
    _check(lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")
    forbid_user_namespaces(lib)
    home = HOME if level == "namespaces" else cfg["scratch"]
    os.chdir(home)
    os.environ["HOME"] = home
    return level


def serve(cfg, req_fd, resp_fd, in_pid_namespace):
    """Enter the sandbox, then answer requests until the grader closes the channel."""
    req, resp = os.fdopen(req_fd, "rb"), os.fdopen(resp_fd, "wb")
    try:
        level = enter_sandbox(cfg, in_pid_namespace)
    except Exception as e:
        resp.write((json.dumps({"fatal": f"could not enter the sandbox: {e}"}) + "\n").encode())
        resp.flush()
        return
    Server(req, resp, cfg, level).serve()


def sandbox_process(cfg, fds, in_pid_namespace):
    """In a fresh fork: own session, dies with its monitor, the output pipe as stdout and stderr."""
    req_r, resp_w, out_w, status_w, life_r = fds
    os.close(status_w)
    os.close(life_r)
    os.setsid()
    libc().prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    os.close(out_w)
    os.environ.clear()
    os.environ.update(cfg["env"])
    if cfg.get("threads"):  # the grader's share of the cores for this sandbox (torch was imported before)
        import torch
        torch.set_num_threads(cfg["threads"])
    import faulthandler
    faulthandler.enable()
    try:
        serve(cfg, req_r, resp_w, in_pid_namespace)
    finally:
        sys.stdout.flush()
        os._exit(0)


def kill_uid(uid):
    """SIGKILL every process of `uid` at once: kill(-1) from a process of that uid reaches them all, forks too."""
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                os.kill(-1, 9)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)


def monitor(cfg, fds):
    """Start the sandbox, watch it and the grader; when either goes, end every process of the sandbox.

    The grader holds the only write end of the lifeline: its EOF (the grader closed the sandbox, or died in
    any way, SIGKILL included) means kill. The monitor is the sandbox's parent, so the pid it signals is
    never someone else's. Its status line (the sandbox's wait status) comes after everything is gone.
    """
    import select
    import shutil
    import signal
    req_r, resp_w, out_w, status_w, life_r = fds
    in_pid_namespace = bool(cfg["isolate"]) and libc().unshare(CLONE_NEWPID) == 0
    pid = os.fork()
    if pid == 0:
        sandbox_process(cfg, fds, in_pid_namespace)
    for fd in (req_r, resp_w, out_w):
        os.close(fd)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a grader gone is seen on the lifeline, not as a signal
    status = None
    try:
        try:
            os.write(status_w, f"{pid}\n".encode())
        except OSError:
            pass
        try:
            ended = os.pidfd_open(pid)
        except (AttributeError, OSError):
            ended = None
        poll = select.poll()
        poll.register(life_r, select.POLLIN)
        if ended is not None:
            poll.register(ended, select.POLLIN)
        while status is None:
            events = dict(poll.poll(None if ended is not None else 100))
            if life_r in events:
                os.kill(pid, signal.SIGKILL)  # not reaped yet: still ours
                poll.unregister(life_r)
            if ended is None or ended in events:
                done, wait_status = os.waitpid(pid, 0 if ended is not None else os.WNOHANG)
                if done:
                    status = wait_status
    finally:
        if status is None:  # the monitor itself failed: the sandbox goes with it
            os.kill(pid, signal.SIGKILL)
            status = os.waitpid(pid, 0)[1]
        if not in_pid_namespace:  # a PID namespace died with its init; otherwise end the rest here
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            if cfg["isolate"]:
                kill_uid(cfg["uid"])
        shutil.rmtree(cfg["scratch"], ignore_errors=True)
        try:
            os.write(status_w, f"{status}\n".encode())
        finally:
            os._exit(0)


PRELOAD = ("matplotlib.pyplot", "IPython.display", "IPython.core.inputtransformer2", "ipywidgets", "torchvision", "scipy.linalg", "math", "random",
           "inspect", "types", "json", "typing", "dataclasses", "collections", "itertools", "functools")


STATE = None  # autograder/state.py, loaded by path before any sandbox exists (the sandbox's root has no course files)


def load_state_helpers():
    """The grader's one copy-by-order-and-shape, as a module of its own: this script imports no autograder package."""
    global STATE
    import importlib.util
    spec = importlib.util.spec_from_file_location("course_state", os.path.join(os.path.dirname(__file__), "state.py"))
    STATE = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(STATE)


def zygote(control_fd):
    """Import torch once, then fork a sandbox (through its monitor) per request: a sandbox starts in milliseconds."""
    import signal
    import socket
    # No PR_SET_PDEATHSIG: it fires when the *thread* that started us ends (a batch worker), not the grader.
    # The grader's end of the control socket closing (its exit, or its death) is what ends the loop below,
    # and each monitor watches its own lifeline: a Ctrl-C meant for the grader is not for these processes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import numpy, torch, safetensors.torch  # noqa: F401 -- imported once, shared copy-on-write
    load_state_helpers()
    os.environ["MPLBACKEND"] = "Agg"
    for name in PRELOAD:  # what notebooks' setup cells import: loaded once here instead of in every sandbox
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 -- optional: a missing package is the notebook's own business
            pass
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)       # monitors are reaped by the kernel
    sock = socket.socket(fileno=control_fd)
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 5)
        if not msg:
            return
        cfg = json.loads(msg)
        if os.fork() == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            sock.close()
            monitor(cfg, fds)
        for fd in fds:
            os.close(fd)


class StudentError(Exception):
    pass


def as_python(source):
    """A notebook cell as plain Python: IPython's magics and shell escapes become get_ipython() calls."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return source
    return TransformerManager().transform_cell(source)


class QuietShell:
    """What get_ipython() returns while grading: magics (%matplotlib, !pip install) do nothing."""

    def run_line_magic(self, *args, **kwargs):
        return None

    run_cell_magic = system = getoutput = run_line_magic

    def __getattr__(self, name):
        return self.run_line_magic


QUIET_SHELL = QuietShell()


import builtins  # noqa: E402
_BUILTINS = dict(builtins.__dict__)


def restore_builtins():
    """Undo whatever the student's code did to builtins before the protocol's own code runs again."""
    if builtins.__dict__ != _BUILTINS:
        builtins.__dict__.clear()
        builtins.__dict__.update(_BUILTINS)


class Server:
    def __init__(self, req, resp, cfg, level):
        import torch
        import safetensors.torch as st
        self.torch, self.st, self.cfg, self.level = torch, st, cfg, level
        self.req, self.resp = req, resp
        self.pid = os.getpid()
        self.ns = {"__name__": "__main__"}
        self.objects = {}
        self.harness = {}
        self.oracle_calls = []
        self.blob = b""

    # --- transport -------------------------------------------------------------------------------
    def send(self, msg, blob=b""):
        """One JSON line, then `blob` bytes; a process the student forked never speaks for the sandbox."""
        if os.getpid() != self.pid:
            os._exit(0)
        self.resp.write((json.dumps({**msg, "blob": len(blob)}) + "\n").encode() + blob)
        self.resp.flush()

    def receive(self):
        line = self.req.readline()
        if not line:
            return None
        msg = json.loads(line)
        self.blob = self.req.read(msg.get("blob", 0)) if msg.get("blob") else b""
        return msg

    def serve(self):
        self.send({"ready": True, "pid": self.pid, "isolation": self.level})
        while (msg := self.receive()) is not None:
            try:
                out = getattr(self, "op_" + msg["op"])(msg)
                answer, blob = {"id": msg["id"], "ok": True, **out}, out.pop("_blob", b"")
            except StudentError as e:
                answer, blob = {"id": msg["id"], "ok": False, "error": str(e)}, b""
            except BaseException as e:  # noqa: BLE001 -- student code may raise anything, SystemExit included
                restore_builtins()
                error, restart = self.limit_reached(e)
                answer, blob = {"id": msg["id"], "ok": False, "restart": restart,
                                "error": error or describe(e, student_frames_only=True)}, b""
            answer.pop("_blob", None)
            self.flush_output()  # what the request printed is read with its answer, not one request later
            self.send(answer, blob)
            self.end_strays()

    @staticmethod
    def flush_output():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 -- the student may have replaced or closed them
                pass

    def limit_reached(self, e):
        """(reason, restart?) when the exception is the sandbox's disk or process limit biting."""
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            return f"wrote more than {self.cfg['disk_mb']} MB (disk limit): {describe(e, True)}", True
        if isinstance(e, BlockingIOError) and e.errno == errno.EAGAIN and self.cfg["isolate"]:
            return (f"started more than {self.cfg['processes']} processes and threads (process limit): "
                    f"{describe(e, True)}"), False
        return "", False

    def end_strays(self):
        """Processes the student's code started during a request end with it (a fresh uid: all are the student's)."""
        if not self.cfg["isolate"]:
            return
        try:
            os.kill(-1, 9)  # every process of this uid (of this PID namespace) but this one, forks in flight too
        except OSError:
            pass
        while True:  # as a namespace's init, orphans are ours to reap
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break

    def load_tensors(self):
        return self.st.load(self.blob) if self.blob else {}

    def decode(self, v, tensors):
        torch = self.torch
        if isinstance(v, dict):
            if "T" in v:
                t = tensors[v["T"]].to(v.get("device", "cpu"))
                return t.requires_grad_(True) if v.get("grad") else t
            if "tuple" in v:
                return tuple(self.decode(x, tensors) for x in v["tuple"])
            if "list" in v:
                return [self.decode(x, tensors) for x in v["list"]]
            if "dict" in v:
                return {k: self.decode(x, tensors) for k, x in v["dict"].items()}
            if "handle" in v:
                return self.objects[v["handle"]]
            if "generator" in v:
                return torch.Generator().manual_seed(v["generator"])
            if "dtype" in v:
                return getattr(torch, v["dtype"])
            if "device" in v:
                return torch.device(v["device"])
            if "new" in v:  # a fresh PyTorch module built by the protocol, e.g. an nn.MultiheadAttention
                mod = getattr(torch.nn, v["new"])(*self.decode(v.get("args", {"list": []}), tensors),
                                                  **self.decode(v.get("kwargs", {"dict": {}}), tensors))
                if v.get("state"):
                    self.assign_state(mod, [tensors[k] for k in v["state"]])
                return mod.to(v.get("to", "cpu"))
        return v

    def encode(self, v, out, depth=0):
        torch = self.torch
        if depth > 6:
            return {"repr": "nested too deeply"}
        if isinstance(v, torch.Tensor):
            key = f"t{len(out)}"
            out[key] = v.detach().to("cpu").contiguous().clone()
            return {"T": key, "device": str(v.device), "dtype": str(v.dtype).replace("torch.", "")}
        if type(v).__module__ == "numpy" and hasattr(v, "shape"):
            key = f"t{len(out)}"
            out[key] = torch.from_numpy(__import__("numpy").ascontiguousarray(v)).clone()
            return {"T": key, "device": "numpy", "dtype": str(v.dtype)}
        if v is None or isinstance(v, (bool, int, float, str)):
            return v if not isinstance(v, str) else v[:1000]
        if isinstance(v, tuple):
            return {"tuple": [self.encode(x, out, depth + 1) for x in v[:MAX_ITEMS]]}
        if isinstance(v, list):
            return {"list": [self.encode(x, out, depth + 1) for x in v[:MAX_ITEMS]]}
        if isinstance(v, dict):
            return {"dict": {str(k): self.encode(x, out, depth + 1) for k, x in list(v.items())[:MAX_ITEMS]}}
        if isinstance(v, torch.nn.Module):
            h = f"h{len(self.objects)}"
            self.objects[h] = v
            return {"handle": h, "type": type(v).__name__}
        return {"repr": f"{type(v).__name__}: {safe_repr(v)}"}

    def reply(self, value, msg):
        tensors = {}
        enc = self.encode(value, tensors)
        return {"value": enc, "_blob": self.st.save(tensors) if tensors else b""}

    # --- operations ------------------------------------------------------------------------------
    def op_load(self, msg):
        """Run the setup and graded cells in order; one failing cell costs only what depends on it."""
        results = []
        self.ns.setdefault("get_ipython", lambda: QUIET_SHELL)
        for grade_id, source in msg["cells"]:
            self.send({"progress": grade_id})
            try:
                exec(compile(as_python(source), f"<cell {grade_id}>", "exec"), self.ns)
                restore_builtins()
                results.append([grade_id, ""])
            except BaseException as e:  # noqa: BLE001
                restore_builtins()
                results.append([grade_id, describe(e, student_frames_only=True)])
            self.flush_output()
        return {"cells": results}

    def target(self, msg, tensors):
        if "handle" in msg:
            obj = self.objects[msg["handle"]]
            return getattr(obj, msg["method"]) if msg.get("method") else obj
        if msg["name"] not in self.ns:
            raise StudentError(f"'{msg['name']}' is not defined")
        return self.ns[msg["name"]]

    def watch(self, names):
        """Record calls to the listed PyTorch oracles while a from-scratch item runs."""
        torch, undo = self.torch, []
        spots = {"scaled_dot_product_attention": [(torch.nn.functional, "scaled_dot_product_attention")],
                 "multi_head_attention_forward": [(torch.nn.functional, "multi_head_attention_forward")],
                 "mse_loss": [(torch.nn.functional, "mse_loss")],
                 "MultiheadAttention": [(torch.nn.MultiheadAttention, "forward")],
                 "TransformerEncoderLayer": [(torch.nn.TransformerEncoderLayer, "forward")],
                 "TransformerDecoderLayer": [(torch.nn.TransformerDecoderLayer, "forward")]}
        for name in names:
            for owner, attr in spots.get(name, []):
                original = getattr(owner, attr)

                def wrapper(*a, __original=original, __name=name, **k):
                    self.oracle_calls.append(__name)
                    return __original(*a, **k)
                setattr(owner, attr, wrapper)
                undo.append((owner, attr, original))
        return undo

    def op_call(self, msg):
        torch = self.torch
        tensors = self.load_tensors()
        fn = self.target(msg, tensors)
        args = self.decode({"list": msg.get("args", [])}, tensors)
        kwargs = self.decode({"dict": msg.get("kwargs", {})}, tensors)
        torch.manual_seed(msg.get("seed", 0))
        self.oracle_calls = []
        undo = self.watch(msg.get("watch", []))
        try:
            grad = msg.get("grad")
            with torch.enable_grad() if grad else torch.no_grad():
                value = fn(*args, **kwargs)
                if grad:
                    value = self.backward(value, args, grad, tensors)
        finally:
            restore_builtins()
            for owner, attr, original in undo:
                setattr(owner, attr, original)
        out = self.reply(value, msg)
        out["oracle_calls"] = sorted(set(self.oracle_calls))
        return out

    def backward(self, value, args, grad, tensors):
        """d(sum_i <out_i, upstream_i>)/d(args[j]) for the requested args, next to the outputs."""
        torch = self.torch
        outs = value if isinstance(value, (tuple, list)) else (value,)
        pairs = [(o, tensors[u]) for o, u in zip(outs, grad["upstream"]) if u is not None]
        for o, _ in pairs:
            if not isinstance(o, torch.Tensor) or not o.requires_grad:
                raise StudentError("the output does not carry a gradient (was it detached, or computed under no_grad?)")
        total = sum((o * u.to(o.device, o.dtype)).sum() for o, u in pairs)
        inputs = [args[j] for j in grad["wrt"]]
        grads = torch.autograd.grad(total, inputs, allow_unused=True)
        return (value, tuple(grads))

    def op_new(self, msg):
        torch = self.torch
        tensors = self.load_tensors()
        cls = self.target(msg, tensors)
        args = self.decode({"list": msg.get("args", [])}, tensors)
        kwargs = self.decode({"dict": msg.get("kwargs", {})}, tensors)
        torch.manual_seed(msg.get("seed", 0))
        try:
            obj = cls(*args, **kwargs)
        finally:
            restore_builtins()
        if isinstance(obj, torch.nn.Module):
            obj = obj.to(msg.get("device", "cpu"))
        return self.reply(obj, msg)

    def op_state(self, msg):
        obj = self.objects[msg["handle"]]
        items = list(obj.state_dict().items())
        out = self.reply([t for _, t in items], msg)
        out["names"] = [k for k, _ in items]
        return out

    def assign_state(self, module, values):
        try:
            STATE.assign_state(module, values)
        except STATE.StateMismatch as e:
            raise StudentError(f"parameters and buffers have shapes {e.module_shapes}, expected {e.value_shapes}") from None

    def op_load_state(self, msg):
        tensors = self.load_tensors()
        self.assign_state(self.objects[msg["handle"]], [tensors[k] for k in msg["keys"]])
        return {"value": None}

    def op_attr(self, msg):
        tensors = {}
        obj = self.target(msg, tensors)
        missing = object()
        value = getattr(obj, msg["attr"], missing)
        if value is missing:
            raise StudentError(f"has no attribute '{msg['attr']}'")
        return self.reply(value, msg)

    def op_signature(self, msg):
        """The parameters of a function, or of a class's __init__, and of the listed methods."""
        import inspect
        obj = self.target(msg, {})
        info = {"kind": "class" if isinstance(obj, type) else ("function" if callable(obj) else type(obj).__name__)}

        def params(f, drop_self):
            try:
                sig = inspect.signature(f)
            except (TypeError, ValueError):
                return None
            ps = list(sig.parameters.values())[(1 if drop_self else 0):]
            return [[p.name, str(p.kind), "" if p.default is p.empty else repr(p.default)] for p in ps]
        if info["kind"] == "class":
            info["params"] = params(obj.__init__, True)
            info["methods"] = {m: params(getattr(obj, m), True) if callable(getattr(obj, m, None)) else None
                               for m in msg.get("methods", [])}
        elif info["kind"] == "function":
            info["params"] = params(obj, False)
        return {"value": info}

    def op_harness(self, msg):
        """Load a harness module's source (the lecture's models and training loops) as a module."""
        import types
        mod = types.ModuleType(msg["module"])
        exec(compile(msg["source"], f"<harness {msg['module']}>", "exec"), mod.__dict__)
        self.harness[msg["module"]] = mod
        return {"value": None}

    def op_experiment(self, msg):
        """Build the experiment's model from the student's items and train it with the harness loop."""
        import types
        torch = self.torch
        spec = self.harness[msg["module"]].EXPERIMENTS[msg["name"]]
        parts = types.SimpleNamespace(**{k: v for k, v in self.ns.items() if not k.startswith("__")})
        data = {k: v.to(msg["device"]) for k, v in self.load_tensors().items()}
        torch.manual_seed(msg["seed"])
        model = spec["build"](parts, msg["cfg"], msg["seed"], msg["device"])
        try:
            history = spec["train"](model, parts, data, msg["cfg"], msg["seed"])
        finally:
            restore_builtins()
        out = self.reply(list(model.state_dict().values()), msg)
        out["history"] = json.loads(json.dumps(history, default=float)) if history else {}
        return out


def safe_repr(v):
    try:
        return repr(v)[:200]
    except BaseException:  # noqa: BLE001
        return "<unprintable>"


def describe(e, student_frames_only=False):
    """'ValueError: message (cell attention, line 7)': the error and where in the student's code."""
    try:
        frames = traceback.extract_tb(e.__traceback__)
        where = [f for f in frames if f.filename.startswith("<cell ")] if student_frames_only else frames
        loc = ""
        if where:
            f = where[-1]
            loc = f" ({f.filename[1:-1]}, line {f.lineno})"
        elif isinstance(e, SyntaxError) and e.filename:
            loc = f" ({e.filename.strip('<>')}, line {e.lineno})"
        msg = safe_repr(e.args[0]) if len(e.args) == 1 and not isinstance(e.args[0], str) else str(e)
        return f"{type(e).__name__}: {msg[:300]}{loc}"
    except BaseException:  # noqa: BLE001
        return "an exception that could not be described"


if __name__ == "__main__":
    zygote(int(sys.argv[1]))
