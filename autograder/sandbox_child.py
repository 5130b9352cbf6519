"""The student's side of the sandbox: a standalone script run as its own process, never imported.

It enters the sandbox before it reads any student code (private mount namespace with the course's files
hidden, no network, its own unprivileged uid), then answers the grader's requests one JSON line at a time:
run the notebook's cells, call an item on tensors the grader sent, construct a module, return its state,
train a harness experiment. Tensors travel as safetensors files in the scratch folder; everything else as
JSON. Nothing here decides a score: the grader compares what comes back with its own reference.
"""
import ctypes
import json
import os
import sys
import traceback

CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MAX_ITEMS = 100_000  # entries of one list/dict sent back: far above any state_dict, below a runaway structure
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG = 38, 1


def graft(libc, fd, path):
    """Mount the directory behind `fd` at `path` (made in whatever now covers that place)."""
    os.makedirs(path, exist_ok=True)
    if libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, MS_BIND | MS_REC, None) != 0:
        raise OSError(ctypes.get_errno(), f"could not mount {path}")


def expose(libc, path):
    """Make `path` reachable for an unprivileged uid when an ancestor (say /root, mode 0700) is not."""
    parts = os.path.realpath(path).strip("/").split("/")
    for depth in range(1, len(parts)):
        here = "/" + "/".join(parts[:depth])
        if os.stat(here).st_mode & 0o001:
            continue
        below = "/" + "/".join(parts[:depth + 1])
        fd = os.open(below, os.O_PATH)
        if libc.mount(b"tmpfs", here.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=4k,mode=0755") != 0:
            raise OSError(ctypes.get_errno(), f"could not cover {here}")
        graft(libc, fd, below)
        os.close(fd)


def enter_sandbox(cfg):
    """Hide the course from this process, cut the network, and drop to the sandbox's own uid."""
    import resource
    if cfg.get("isolate"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare failed")
        libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None)
        scratch = os.getcwd()
        # resolved now: the environment may be reached through a link inside a folder about to be hidden
        python_dirs = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, os.path.dirname(sys.executable),
                                                     os.path.dirname(os.path.realpath(sys.executable)))}
        scratch_fd = os.open(scratch, os.O_PATH)  # before anything is hidden: it may sit inside a hidden folder
        keep = [(path, os.open(path, os.O_PATH)) for path in cfg["keep"] if os.path.isdir(path)]
        for path in cfg["hide"]:
            if not os.path.isdir(path):
                continue
            if libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64k,mode=0755") != 0:
                raise OSError(ctypes.get_errno(), f"could not hide {path}")
            for kept, fd in keep:  # the Python environment may live inside the course folder
                if kept.startswith(path.rstrip("/") + "/"):
                    graft(libc, fd, kept)
            libc.mount(None, path.encode(), None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
        # A private /tmp with only this sandbox's scratch folder in it, at the same path (and the Python
        # environment, when the course was checked out under /tmp).
        for tmp in ("/tmp", "/dev/shm", "/var/tmp"):
            if os.path.isdir(tmp):
                libc.mount(b"tmpfs", tmp.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=256m,mode=1777")
                for kept, fd in keep:
                    if kept.startswith(tmp + "/"):
                        graft(libc, fd, kept)
        for _, fd in keep:
            os.close(fd)
        graft(libc, scratch_fd, scratch)
        os.close(scratch_fd)
        os.chdir(scratch)
        for path in python_dirs:
            expose(libc, path)
        libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["max_file_bytes"], cfg["max_file_bytes"]))
    if cfg.get("isolate"):
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.environ["HOME"] = os.getcwd()


def serve(cfg, req_fd, resp_fd):
    """Enter the sandbox, then answer requests until the grader closes the channel."""
    req = os.fdopen(req_fd, "r", encoding="utf-8")
    resp = os.fdopen(resp_fd, "w", encoding="utf-8")
    try:
        enter_sandbox(cfg)
    except Exception as e:
        resp.write(json.dumps({"fatal": f"could not enter the sandbox: {e}"}) + "\n")
        resp.flush()
        return
    Server(req, resp, cfg).serve()


def sandbox_process(cfg, fds):
    """In a fresh fork: own session, the scratch folder as cwd, the output pipe as stdout and stderr."""
    req_r, resp_w, out_w, status_w = fds
    os.close(status_w)
    os.setsid()
    os.chdir(cfg["scratch"])
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
        serve(cfg, req_r, resp_w)
    finally:
        sys.stdout.flush()
        os._exit(0)


PRELOAD = ("matplotlib.pyplot", "IPython.display", "IPython.core.inputtransformer2", "ipywidgets", "torchvision", "scipy.linalg", "math", "random",
           "inspect", "types", "json", "typing", "dataclasses", "collections", "itertools", "functools")


def zygote(control_fd):
    """Import torch once, then fork a sandbox per request: a sandbox starts in milliseconds, not seconds.

    Each request forks a small monitor that forks the sandbox, reports the sandbox's pid, waits for it
    and reports its wait status, so the grader can say how the student's process ended.
    """
    import signal
    import socket
    # No PR_SET_PDEATHSIG: it fires when the *thread* that started us ends (a batch worker), not the grader.
    # The grader's end of the control socket closing (its exit, or its death) is what ends the loop below.
    import numpy, torch, safetensors.torch  # noqa: F401 -- imported once, shared copy-on-write
    os.environ["MPLBACKEND"] = "Agg"
    for name in PRELOAD:  # what notebooks' setup cells import: loaded once here instead of in every sandbox
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 -- optional: a missing package is the notebook's own business
            pass
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)       # monitors are reaped by the kernel
    sock = socket.socket(fileno=control_fd)
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 4)
        if not msg:
            return
        cfg = json.loads(msg)
        if os.fork() == 0:  # the monitor
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            sock.close()
            pid = os.fork()
            if pid == 0:
                sandbox_process(cfg, fds)
            for fd in fds[:3]:
                os.close(fd)
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # the grader may stop listening: then just go
            try:
                os.write(fds[3], f"{pid}\n".encode())
                _, status = os.waitpid(pid, 0)
                os.write(fds[3], f"{status}\n".encode())
            finally:
                os._exit(0)
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
    def __init__(self, req, resp, cfg):
        import torch
        import safetensors.torch as st
        self.torch, self.st, self.cfg = torch, st, cfg
        self.req, self.resp = req, resp
        self.ns = {"__name__": "__main__"}
        self.objects = {}
        self.harness = {}
        self.oracle_calls = []

    # --- transport -------------------------------------------------------------------------------
    def send(self, msg):
        self.resp.write(json.dumps(msg) + "\n")
        self.resp.flush()

    def serve(self):
        self.send({"ready": True, "pid": os.getpid()})
        for line in self.req:
            msg = json.loads(line)
            try:
                out = getattr(self, "op_" + msg["op"])(msg)
                self.send({"id": msg["id"], "ok": True, **out})
            except StudentError as e:
                self.send({"id": msg["id"], "ok": False, "error": str(e)})
            except BaseException as e:  # noqa: BLE001 -- student code may raise anything, SystemExit included
                restore_builtins()
                self.send({"id": msg["id"], "ok": False, "error": describe(e, student_frames_only=True)})

    def load_tensors(self, name):
        if not name:
            return {}
        return self.st.load_file(name)

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
        name = ""
        if tensors:
            name = f"out_{msg['id']}.safetensors"
            self.st.save_file(tensors, name)
        return {"value": enc, "file": name}

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
            sys.stdout.flush()
            sys.stderr.flush()
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
        tensors = self.load_tensors(msg.get("file"))
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
        tensors = self.load_tensors(msg.get("file"))
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
        torch = self.torch
        dst = list(module.state_dict().values())
        if [tuple(t.shape) for t in dst] != [tuple(t.shape) for t in values]:
            raise StudentError("parameters and buffers have shapes " + str([tuple(t.shape) for t in dst])
                               + ", expected " + str([tuple(t.shape) for t in values]))
        with torch.no_grad():
            for d, s in zip(dst, values):
                d.copy_(s)

    def op_load_state(self, msg):
        tensors = self.load_tensors(msg.get("file"))
        self.assign_state(self.objects[msg["handle"]], [tensors[k] for k in msg["keys"]])
        return {"value": None, "file": ""}

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
        return {"value": info, "file": ""}

    def op_harness(self, msg):
        """Load a harness module's source (the lecture's models and training loops) as a module."""
        import types
        mod = types.ModuleType(msg["module"])
        exec(compile(msg["source"], f"<harness {msg['module']}>", "exec"), mod.__dict__)
        self.harness[msg["module"]] = mod
        return {"value": None, "file": ""}

    def op_experiment(self, msg):
        """Build the experiment's model from the student's items and train it with the harness loop."""
        import types
        torch = self.torch
        spec = self.harness[msg["module"]].EXPERIMENTS[msg["name"]]
        parts = types.SimpleNamespace(**{k: v for k, v in self.ns.items() if not k.startswith("__")})
        data = {k: v.to(msg["device"]) for k, v in self.load_tensors(msg.get("file")).items()}
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
