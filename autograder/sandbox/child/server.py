"""The request server: answer the grader's requests with the student's code.

Messages and values as protocol.py defines them (helpers.PROTOCOL); each request's exceptions, output and stray
processes end with its answer.
"""
import builtins
import errno
import json
import linecache
import os
import sys
import traceback

from . import helpers
from .tripwire import Tripwire

HARNESS_PACKAGE = "course_harness"  # the package the harness modules are loaded as (Server.op_harness)

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


_BUILTINS = dict(builtins.__dict__)


def restore_builtins():
    """Undo whatever the student's code did to builtins before the protocol's own code runs again."""
    if builtins.__dict__ != _BUILTINS:
        builtins.__dict__.clear()
        builtins.__dict__.update(_BUILTINS)


class Server:
    """Answers the grader's requests in the sandbox, one at a time, until the grader closes the channel.

    A request (sandbox_protocol.OPS) is answered by its method op_<op>, which returns the answer's fields, with
    its tensors as safetensors bytes under "_blob". Whatever the student's code does (raise, exit, fill the
    disk, fork) the answer says so and the server goes on; the processes it started end with the request. What
    the student's code returns that cannot travel (its modules) stays here in `objects`, sent by handle.
    """

    def __init__(self, req, resp, cfg, level):
        import torch
        self.torch, self.cfg, self.level = torch, cfg, level
        self.req, self.resp = req, resp
        self.pid = os.getpid()
        self.ns = {"__name__": "__main__"}
        self.objects = {}
        self.harness = {}
        self.tripwire = Tripwire(torch)
        self.tripwire.configure(cfg.get("tripwire"))  # given with the sandbox: watched before any cell loads
        self.blob = b""
        self.fake_gpu = None  # fake_gpu.FakeGPU, made at the first request that asks for it

    # --- transport -------------------------------------------------------------------------------
    def send(self, msg, blob=b""):
        """One message (sandbox_protocol.frame)."""
        self.only_the_server()
        self.resp.write(helpers.PROTOCOL.frame(msg, blob))
        self.resp.flush()

    def only_the_server(self):
        """A process the student forked that came back into this loop never speaks or kills for the sandbox."""
        if os.getpid() != self.pid:
            os._exit(0)

    def receive(self):
        """The grader's next request (its tensors' bytes kept in self.blob); None when the grader closed."""
        line = self.req.readline()
        if not line:
            return None
        msg, size = helpers.PROTOCOL.header(line)
        self.blob = self.req.read(size) if size else b""
        return msg

    def serve(self):
        self.send({"ready": True, "pid": self.pid, "isolation": self.level})
        while (msg := self.receive()) is not None:
            answer, blob = self.answer(msg)
            self.flush_output()  # what the request printed is read with its answer, not one request later
            self.end_strays()  # before the answer: once the grader has it, nothing the request started still runs
            self.send(answer, blob)

    def answer(self, msg):
        """(answer, blob) for one request: the student's exception, or a limit it reached, is an answer too."""
        try:
            self.tripwire.configure(msg.get("tripwire"), self.ns)
            out = getattr(self, "op_" + msg["op"])(msg)
            blob = out.pop("_blob", b"")
            return {"id": msg["id"], "ok": True, **out}, blob
        except StudentError as e:
            return {"id": msg["id"], "ok": False, "error": str(e)}, b""
        except BaseException as e:  # noqa: BLE001 -- student code may raise anything, SystemExit included
            restore_builtins()
            error, restart = self.limit_reached(e)
            return {"id": msg["id"], "ok": False, "restart": restart,
                    "error": error or describe(e, student_frames_only=True)}, b""

    # --- limits ----------------------------------------------------------------------------------
    @staticmethod
    def flush_output():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # the student may have replaced or closed them
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
        self.only_the_server()  # (from a fork, kill(-1) would end the sandbox's own process)
        if not self.cfg["isolate"]:
            return
        try:
            os.kill(-1, 9)  # every process of this uid (of this PID namespace) but this one, forks in flight too
        except OSError:
            pass
        # Reap what was killed (as a namespace's init, orphans too): a zombie still counts against the process
        # limit, and one killed a moment ago is not a zombie yet. Bounded: something that will not die in a second
        # is left to the next request's reaping.
        import time
        deadline = time.monotonic() + 1.0
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.002)
            except ChildProcessError:
                break

    # --- values (sandbox_protocol's codec) -------------------------------------------------------
    def load_tensors(self):
        return helpers.PROTOCOL.unpack(self.blob)

    def decode(self, v, tensors, place=None):
        return helpers.PROTOCOL.from_grader(v, tensors, self.objects, self.assign_state,
                                            place or helpers.PROTOCOL.moved)

    def arguments(self, msg, tensors):
        """(args, kwargs) of a call or a construction, decoded."""
        place = self.fake().place if msg.get("fake_gpu") else None
        return (self.decode({helpers.PROTOCOL.LIST: msg.get("args", [])}, tensors, place),
                self.decode({helpers.PROTOCOL.DICT: msg.get("kwargs", {})}, tensors, place))

    def fake(self):
        """The sandbox's fake GPU (fake_gpu.py), made once."""
        if self.fake_gpu is None:
            from .fake_gpu import FakeGPU
            self.fake_gpu = FakeGPU()
        return self.fake_gpu

    def on_device(self, msg):
        """Where a request's student code runs: inside the fake GPU when the request asks for it."""
        import contextlib
        return self.fake().running(msg.get("item", "")) if msg.get("fake_gpu") else contextlib.nullcontext()

    def reply(self, value, msg):
        tensors = {}
        enc = helpers.PROTOCOL.to_grader(value, tensors, self.objects)
        return {"value": enc, "_blob": helpers.PROTOCOL.pack(tensors)}

    def assign_state(self, module, values):
        try:
            helpers.STATE.assign_state(module, values)
        except helpers.STATE.StateMismatch as e:
            raise StudentError(f"parameters and buffers have shapes {e.module_shapes}, "
                               f"expected {e.value_shapes}") from None

    def target(self, msg):
        """What a request names: a module by handle (or one of its methods), else a name of the notebook's."""
        if "handle" in msg:
            obj = self.objects[msg["handle"]]
            return getattr(obj, msg["method"]) if msg.get("method") else obj
        if msg["name"] not in self.ns:
            raise StudentError(f"'{msg['name']}' is not defined")
        return self.ns[msg["name"]]

    # --- operations ------------------------------------------------------------------------------
    def op_load(self, msg):
        """Run the setup and graded cells in order; one failing cell costs only what depends on it."""
        results = []
        self.ns.setdefault("get_ipython", lambda: QUIET_SHELL)
        for grade_id, source in msg["cells"]:
            self.send({"progress": grade_id})
            try:
                code = as_python(source)
                # its lines, for the fake GPU's messages (fake_gpu.told) to quote
                linecache.cache[f"<cell {grade_id}>"] = (len(code), None, code.splitlines(True), f"<cell {grade_id}>")
                exec(compile(code, f"<cell {grade_id}>", "exec"), self.ns)
                restore_builtins()
                results.append([grade_id, ""])
            except BaseException as e:  # noqa: BLE001
                restore_builtins()
                results.append([grade_id, describe(e, student_frames_only=True)])
            self.flush_output()
        return {"cells": results}

    def prepared(self, msg):
        """(the student's function or class, args, kwargs, tensors) of a check's request, torch seeded as asked."""
        tensors = self.load_tensors()
        target = self.target(msg)
        args, kwargs = self.arguments(msg, tensors)
        self.torch.manual_seed(msg.get("seed", 0))
        return target, args, kwargs, tensors

    def op_call(self, msg):
        """Call a function or method of the student's on the grader's arguments (and backward, with `grad`)."""
        torch = self.torch
        try:
            grad = msg.get("grad")
            # a student's backward counts too
            with self.on_device(msg), self.tripwire.checking(msg.get("watch", [])) as watched, \
                    torch.enable_grad() if grad else torch.no_grad():
                fn, args, kwargs, tensors = self.prepared(msg)
                value = fn(*args, **kwargs)
                if msg.get("fake_gpu"):
                    self.fake().check_returned(value, fn, args, kwargs)
                if grad and msg.get("fake_gpu"):  # torch's autograd engine asks the CUDA driver for the device
                    raise StudentError("the fake GPU runs no backward pass: no verdict on devices there")
                if grad:
                    value = self.backward(value, args, grad, tensors)
        finally:
            restore_builtins()
        return self.watched_reply(value, msg, watched)

    def backward(self, value, args, grad, tensors):
        """d(sum_i <out_i, upstream_i>)/d(args[j]) for the requested args, next to the outputs."""
        torch = self.torch
        outs = value if isinstance(value, (tuple, list)) else (value,)
        pairs = [(o, tensors[u]) for o, u in zip(outs, grad["upstream"], strict=False) if u is not None]
        for o, _ in pairs:
            if not isinstance(o, torch.Tensor) or not o.requires_grad:
                raise StudentError("the output does not carry a gradient (was it detached, or computed under no_grad?)")
        total = sum((o * u.to(o.device, o.dtype)).sum() for o, u in pairs)
        inputs = [args[j] for j in grad["wrt"]]
        grads = torch.autograd.grad(total, inputs, allow_unused=True)
        return (value, tuple(grads))

    def op_new(self, msg):
        """An instance of the student's class, built on the grader's arguments and seed, kept by handle."""
        torch = self.torch
        try:
            with self.on_device(msg), self.tripwire.checking(msg.get("watch", [])) as watched:
                cls, args, kwargs, _ = self.prepared(msg)
                obj = cls(*args, **kwargs)
        finally:
            restore_builtins()
        if isinstance(obj, torch.nn.Module):
            place = self.fake().place if msg.get("fake_gpu") else helpers.PROTOCOL.moved
            obj = place(obj, msg.get("device", "cpu"))
        return self.watched_reply(obj, msg, watched)

    def watched_reply(self, value, msg, watched):
        """The reply to a check's request, with the oracles the student's code called while it ran."""
        out = self.reply(value, msg)
        out["oracle_calls"] = sorted(watched.seen)
        return out

    def op_state(self, msg):
        """A module's state_dict(): its tensors in order, and their names."""
        obj = self.objects[msg["handle"]]
        items = list(obj.state_dict().items())
        out = self.reply([t for _, t in items], msg)
        out["names"] = [k for k, _ in items]
        return out

    def op_load_state(self, msg):
        """Copy the grader's tensors into a module's state, by order and shape."""
        tensors = self.load_tensors()
        with self.on_device(msg):
            self.assign_state(self.objects[msg["handle"]], [tensors[k] for k in msg["keys"]])
        return {"value": None}

    def op_attr(self, msg):
        """An attribute of a module or of a name of the notebook's."""
        obj = self.target(msg)
        missing = object()
        value = getattr(obj, msg["attr"], missing)
        if value is missing:
            raise StudentError(f"has no attribute '{msg['attr']}'")
        return self.reply(value, msg)

    def op_signature(self, msg):
        """The parameters of a function, or of a class's __init__, and of the listed methods."""
        import inspect
        obj = self.target(msg)
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
        """Load a harness module's source (the lecture's models and training loops) as a module of one package,
        HARNESS_PACKAGE, so that `from .training import ...` finds a harness module loaded before it."""
        import types
        mod = types.ModuleType(f"{HARNESS_PACKAGE}.{msg['module']}")
        mod.__package__ = HARNESS_PACKAGE
        sys.modules[mod.__name__] = mod  # what a relative import looks up
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
        with self.tripwire.training(msg["name"]) as watched:
            model = spec["build"](parts, msg["cfg"], msg["seed"], msg["device"])
            try:
                history = spec["train"](model, parts, data, msg["cfg"], msg["seed"])
            finally:
                restore_builtins()
        if watched.seen:  # in describe()'s form, "(cell X, line N)" last: the grader reads it as the student's error
            oracle, (item, line) = min(watched.seen.items())
            raise StudentError(f"'{item}' uses {oracle} while training; this item is written from scratch, so the "
                               f"oracle it is compared with may not be called (cell {item}, line {line})")
        out = self.reply(list(model.state_dict().values()), msg)
        out["history"] = json.loads(json.dumps(history, default=float)) if history else {}
        return out


def describe(e, student_frames_only=False):
    """'ValueError: message (cell attention, line 7)': the error and where in the student's code."""
    try:
        frames = traceback.extract_tb(e.__traceback__)
        where = [f for f in frames if f.filename.startswith("<cell ")] if student_frames_only else frames
        loc = ""
        if getattr(e, "student_line", None):  # fake_gpu.DeviceMismatch: where the stray tensor was made, not used
            loc = f" ({e.student_line[0]}, line {e.student_line[1]})"
        elif where:
            f = where[-1]
            loc = f" ({f.filename[1:-1]}, line {f.lineno})"
        elif isinstance(e, SyntaxError) and e.filename:
            loc = f" ({e.filename.strip('<>')}, line {e.lineno})"
        msg = helpers.PROTOCOL.safe_repr(e.args[0]) if len(e.args) == 1 and not isinstance(e.args[0], str) else str(e)
        return f"{type(e).__name__}: {msg[:300]}{loc}"
    except BaseException:  # noqa: BLE001
        return "an exception that could not be described"

