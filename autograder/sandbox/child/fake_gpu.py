"""The fake GPU: a request's tensors and modules on a CUDA device that exists only as torch's FakeTensorMode.

A fake `cuda` tensor has a shape, a dtype and a device but no data, and carries CUDA's device rules: an element-wise
op, a matrix product, `F.linear`, `bmm`, an embedding or `gather` that meets a CPU tensor raises, and `.cpu()` gives a
fake CPU tensor that fails the same way later, on a machine without a GPU (grading/device_check.py). A 0-dim CPU
tensor is a scalar, as on CUDA.

Where the stray tensor came from is what a student needs, not where it met the inputs (often a function it was handed
to): every CPU tensor made while a request runs remembers the student's lines that made it, or moved it there
(`.cpu()`, `.to('cpu')`), and a tensor computed from it keeps that origin. A mismatch, or a result left on the CPU,
raises DeviceMismatch naming the graded item's own line first (where it called `causal_mask(T)` without its device),
then the helper's line that made the tensor, if another.
"""
import contextlib
import linecache
import sys

DEVICE = "cuda"  # the device the fake GPU's tensors say they are on
CELL = "<cell "  # how the student's cells are named as files (server.op_load)


class DeviceMismatch(RuntimeError):
    """An op met the inputs' fake CUDA device and a CPU tensor; `student_line` is where that tensor was made."""

    def __init__(self, message, student_line):
        super().__init__(message)
        self.student_line = student_line


def student_frames(frame):
    """The student's frames from `frame` outwards: (cell, line, function), innermost first."""
    frames = []
    while frame is not None:
        if frame.f_code.co_filename.startswith(CELL):
            frames.append((frame.f_code.co_filename[1:-1], frame.f_lineno,
                           getattr(frame.f_code, "co_qualname", frame.f_code.co_name)))
        frame = frame.f_back
    return frames


def strays(values, scalars=False):
    """The tensors among `values` that are on the CPU (0-dim ones, a GPU op's scalars, only with `scalars`)."""
    import torch
    from torch.utils._pytree import tree_flatten
    return [t for t in tree_flatten(values)[0] if isinstance(t, torch.Tensor) and t.device.type == "cpu"
            and (scalars or t.dim() > 0)]


def names_the_gpu(v, torch):
    """Whether an input is on the fake GPU: a tensor there, or a device naming it (torch.device or 'cuda')."""
    if isinstance(v, torch.Tensor):
        return v.device.type == DEVICE
    if isinstance(v, str):
        return v.split(":")[0] == DEVICE
    return isinstance(v, torch.device) and v.type == DEVICE


def mismatch(origin, item, what="is not on the same device as the inputs"):
    """DeviceMismatch for a CPU tensor of `origin` (None: unknown) met, or returned, where the inputs are on cuda."""
    return DeviceMismatch(f"a tensor on cpu {what} ({DEVICE}, a fake GPU): it was {told(origin, item)}; make it with "
                          f"device=x.device, or move it with .to(x.device)",
                          blamed(origin, item)[:2] if origin else None)


def blamed(origin, item):
    """The frame of an origin the student reads first: the innermost line in the graded item's own cell (where it
    called what made the tensor: `causal_mask(T)` without its device), else the innermost line of all."""
    frames = origin[1]
    return next((f for f in frames if f[0] == f"cell {item}"), frames[0])


def told(origin, item):
    """'made on the CPU at cell c, line 4 (`code`, in f()), inside cell d, line 9 (in g())': an origin in words."""
    if not origin:
        return "made outside the code the check called (a global of the notebook, or a module attribute that " \
               ".to(device) does not move: register it as a buffer)"
    how, frames = origin
    first = blamed(origin, item)
    said = f"{how} at {place(first)}"
    if first is not frames[0]:
        said += f" by what it calls: {place(frames[0])}"
    return said


def place(frame):
    cell, line, fn = frame
    code = linecache.getline(f"<{cell}>", line).strip()
    return f"{cell}, line {line}" + (f" (`{code}`, in {fn}())" if code else f" (in {fn}())")


def traced_mode():
    """A FakeTensorMode that remembers where each CPU tensor came from, and says so when one meets a CUDA one (torch
    is imported here, not with this module: the zygote loads this folder before it sets its import path)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._pytree import tree_flatten

    class TracedFakeMode(FakeTensorMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return traced_dispatch(super().__torch_dispatch__, func, types, args, kwargs, torch, tree_flatten,
                                   self.course_item)

    mode = TracedFakeMode(allow_non_fake_inputs=True)
    mode.course_item = ""  # the graded item whose request runs (FakeGPU.running)
    return mode


def traced_dispatch(dispatch, func, types, args, kwargs, torch, tree_flatten, item):
    """One op of the fake GPU: run it, remember the origin of the CPU tensors it makes, or name it on a mismatch."""
    try:
        out = dispatch(func, types, args, kwargs)
    except RuntimeError as e:
        if "found at least two devices" not in str(e) and "on the expected device" not in str(e):
            raise
        origin = next((t._course_origin for t in strays((args, kwargs)) if getattr(t, "_course_origin", None)), None)
        raise mismatch(origin, item) from None
    made = strays(out, scalars=True)
    if made:
        kept = next((t._course_origin for t in strays((args, kwargs)) if getattr(t, "_course_origin", None)), None)
        if kept is None:
            moved = any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in tree_flatten(args)[0])
            frames = student_frames(sys._getframe(1))
            kept = ("moved to the CPU" if moved else "made on the CPU", frames) if frames else None
        for t in made:
            with contextlib.suppress(AttributeError, RuntimeError):
                t._course_origin = kept
    return out


def warm():
    """Import what FakeTensorMode imports at its first use (torch._dynamo, sympy: a second or more of CPU), in the
    zygote before any sandbox forks, so that each sandbox inherits it and none reads those files behind its wall.

    Imports only: entering a FakeTensorMode changes the process for good (on a machine without a GPU it installs a
    no-op CUDA device guard; with one it asks the CUDA driver, which torch documents as poisoning a later fork), and
    every sandbox would inherit that. Under the no-op guard torch's autograd engine starts a thread per CUDA device
    it then believes in (8) at a sandbox's first backward pass, and those threads race to rebuild the intra-op
    thread pool the fork left behind: "Invalid thread pool!" (SIGABRT) or a SIGSEGV in a CPU gradients check, in 1
    sandbox of 8 to 1 of 300 (settle_autograd; tests/test_sandbox_fake_gpu.py)."""
    import torch._dynamo  # noqa: F401
    import torch._subclasses.fake_tensor  # noqa: F401


def settle_autograd(torch):
    """Have torch's autograd engine decide its device threads now, before the fake GPU's first use installs its
    no-op CUDA device guard: one tiny CPU backward pass starts them (none without a GPU, one per real GPU), once per
    process. After that guard, the engine's first backward would start 8 threads that rebuild the forked intra-op
    thread pool at once, and crash the sandbox now and then (warm)."""
    x = torch.ones(1, requires_grad=True)
    torch.autograd.grad(x.sum(), x)


class FakeGPU:
    """The sandbox's one fake GPU: a request runs inside it (`running`), and modules are moved onto it (`module`).
    One mode for the sandbox's life, since a module built in one request is called in the next."""

    def __init__(self):
        import torch
        settle_autograd(torch)
        self.mode = traced_mode()

    @contextlib.contextmanager
    def running(self, item=""):
        """The request's code on the fake GPU; `item` is the graded item it checks, whose lines a reason names."""
        self.mode.course_item = item
        with self.mode:
            yield

    def check_returned(self, value, fn, args, kwargs):
        """An answer to inputs on the fake GPU holds no tensor on the CPU: one that does raises, naming where it was
        made (a GPU grader's inputs are on the GPU, and so must the item's results be). Inputs: a tensor or module
        there, or a device naming it (`causal_mask(T, device='cuda')`); `causal_mask(T)` alone may answer on the CPU."""
        import torch
        from torch.utils._pytree import tree_flatten
        owner = getattr(fn, "__self__", fn)
        given = tree_flatten((args, kwargs))[0] + (list(owner.parameters()) + list(owner.buffers())
                                                   if isinstance(owner, torch.nn.Module) else [])
        if not any(names_the_gpu(v, torch) for v in given):
            return
        for t in strays(value, scalars=True):
            raise mismatch(getattr(t, "_course_origin", None), self.mode.course_item,
                           "came back, not on the same device as the inputs")

    def tensor(self, t, device=DEVICE):
        with self.mode:
            return t.to(device)

    def module(self, module, device=DEVICE):
        """Each parameter and buffer replaced by a fake one on `device` (Module.to cannot swap a fake tensor
        made in the mode for another: it holds weak references)."""
        import torch
        with self.mode, torch.no_grad():
            for m in module.modules():
                for name, p in list(m._parameters.items()):
                    if p is not None:
                        m._parameters[name] = torch.nn.Parameter(p.detach().to(device), p.requires_grad)
                for name, b in list(m._buffers.items()):
                    if b is not None:
                        m._buffers[name] = b.to(device)
        return module

    def place(self, value, device):
        """A tensor or a module on `device`, fake when it is the fake GPU's."""
        import torch
        if device != DEVICE:
            return value.to(device)
        return self.module(value) if isinstance(value, torch.nn.Module) else self.tensor(value)
