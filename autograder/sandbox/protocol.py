"""The sandbox's wire protocol, for both sides: how a message travels, the tags a value travels under, the limits.

The grader imports it as autograder.sandbox.protocol; the student's process (child/helpers.py) loads this file by
path before it enters the sandbox (its root holds no course file), so it imports nothing of the course: the
standard library, torch and safetensors only.

A message is one JSON line whose `blob` field counts the safetensors bytes that follow it (its tensors), on pipes
the grader created. The grader sends {"op": one of OPS, "id": n, ...}; the student's process says {"ready",
"isolation"} (or {"fatal"}) once, {"progress": cell} while it loads cells, and {"id": n, "ok": ...} per request.

A value JSON cannot carry travels as a dict keyed by its tag:
  T             a tensor: its key among the message's tensors, the device it is (or was) on; an answer's its dtype
  tuple, list, dict   containers of values (dict keys are strings)
  handle        a module living in the student's process (Remote on the grader's side)
  generator     a torch.Generator seeded in the student's process (Seeded)          grader to student only
  dtype         a torch.dtype, by name                                               grader to student only
  device        a torch.device                                                       grader to student only
  new           a torch.nn module built there with the grader's weights (Fresh)     grader to student only
  repr          a value that could not be carried, described (Opaque)                student to grader only
The grader's side encodes with `to_student` and decodes with `from_student`; the student's side encodes with
`to_grader` and decodes with `from_grader`.
"""
import json
import re
from collections.abc import Callable
from typing import Any

import safetensors.torch
import torch

TENSOR, TUPLE, LIST, DICT, HANDLE, GENERATOR, DTYPE, DEVICE, NEW, REPR = (
    "T", "tuple", "list", "dict", "handle", "generator", "dtype", "device", "new", "repr")
OPS = ("harness", "load", "call", "new", "state", "load_state", "attr", "signature", "experiment")

MAX_ANSWER_BYTES = 256 * 2**20  # one answer from the student's process, tensors included
MAX_ITEMS = 100_000  # entries of one list/dict sent back: far above any state_dict, below a runaway structure
MAX_DEPTH = 6        # containers inside containers sent back; deeper is described, not carried
MAX_TEXT = 1000      # characters of a string sent back
MAX_REPR = 200       # characters of a description (Opaque)

Tensors = dict[str, torch.Tensor]  # a message's tensors by key
Objects = dict[str, Any]            # the student's side: modules by handle


class ProtocolError(ValueError):
    """A line on the channel that is not a message of this protocol (a forgery, say)."""


class SandboxFailure(Exception):
    """The student's process did not answer: kind is timeout, memory, crash or sandbox."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class StudentRaised(Exception):
    """The student's code raised; the message is the exception and the cell line it came from."""

    def __init__(self, message: str) -> None:
        super().__init__(as_text(message))


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def as_text(text: str) -> str:
    """What the student's process said, with control characters shown as escapes (`\\x1b[2J`), never acted on.

    It ends up in terminals, results.json and feedback pages: an ANSI escape or a bidi override must read as
    what it is there, not clear a TA's screen or reorder a reason.
    """
    return CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def safe_repr(v: object) -> str:
    """repr(v), cut; whatever the student's __repr__ does."""
    try:
        return repr(v)[:MAX_REPR]
    except BaseException:  # noqa: BLE001 -- the student's __repr__ may raise anything
        return "<unprintable>"


# --- messages ------------------------------------------------------------------------------------

def frame(msg: dict[str, Any], blob: bytes = b"") -> bytes:
    """One message on the wire: its JSON line, which announces `blob`'s length, then `blob`."""
    return (json.dumps({**msg, "blob": len(blob)}) + "\n").encode() + blob


def header(line: bytes | str) -> tuple[dict[str, Any], int]:
    """(message, size of the blob that follows) from one line; ProtocolError if it is not a message."""
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError):  # a forged line, say a thousand nested lists deep
        msg = None
    size = msg.get("blob", 0) if isinstance(msg, dict) else None
    if not isinstance(size, int) or size < 0:
        raise ProtocolError("the grader's channel carried something that is not the protocol")
    return msg, size


def carried(t: torch.Tensor) -> torch.Tensor:
    """A tensor as it travels: detached, on the CPU, contiguous, its own storage (safetensors refuses shared). A
    tensor on torch's `meta` device, or a fake one (the fake GPU's, sandbox/child/fake_gpu.py), has no data: zeros of
    its shape and dtype stand in (its device travels beside)."""
    if t.is_meta or getattr(t, "fake_mode", None) is not None:
        return torch.zeros(t.shape, dtype=t.dtype)
    return t.detach().to("cpu").contiguous().clone()


def pack(tensors: Tensors) -> bytes:
    """A message's tensors as safetensors bytes (data only, never code); b"" for none."""
    return safetensors.torch.save(tensors) if tensors else b""


def unpack(blob: bytes) -> Tensors:
    """The tensors of a message's blob."""
    return safetensors.torch.load(blob) if blob else {}


# --- values, the grader's side -------------------------------------------------------------------

class Remote:
    """A student's object that lives in the sandbox (a module), referred to by handle."""

    def __init__(self, handle: str, type_name: str) -> None:
        self.handle, self.type_name = handle, type_name

    def __repr__(self) -> str:
        return f"<student {self.type_name}>"


class Opaque:
    """A value the protocol could not carry (neither tensor nor number): only its description came back."""

    def __init__(self, text: object) -> None:
        self.text = as_text(str(text))

    def __repr__(self) -> str:
        return self.text


class Seeded:
    """A torch.Generator seeded in the student's process."""

    def __init__(self, seed: int) -> None:
        self.seed = seed


class Fresh:
    """A PyTorch module (torch.nn.<cls>) built in the student's process with the grader's weights."""

    def __init__(self, cls: str, *args: Any, state: tuple | list = (), **kwargs: Any) -> None:
        self.cls, self.args, self.kwargs, self.state = cls, args, kwargs, list(state)


def to_student(v: Any, tensors: Tensors, device: str = "cpu") -> Any:
    """Arguments for the student's process: tensors by reference (added to `tensors`), modules by handle."""
    if isinstance(v, torch.Tensor):
        key = f"a{len(tensors)}"
        tensors[key] = v
        return {TENSOR: key, DEVICE: device}
    if isinstance(v, Remote):
        return {HANDLE: v.handle}
    if isinstance(v, torch.dtype):
        return {DTYPE: str(v).replace("torch.", "")}
    if isinstance(v, torch.device):
        return {DEVICE: str(v)}
    if isinstance(v, torch.Generator):
        raise TypeError("send a generator as Seeded(seed)")
    if isinstance(v, Seeded):
        return {GENERATOR: v.seed}
    if isinstance(v, Fresh):
        state = []
        for t in v.state:
            key = f"s{len(tensors)}"
            tensors[key] = t
            state.append(key)
        return {NEW: v.cls, "args": to_student(list(v.args), tensors, device),
                "kwargs": to_student(dict(v.kwargs), tensors, device), "state": state, "to": device}
    if isinstance(v, tuple):
        return {TUPLE: [to_student(x, tensors, device) for x in v]}
    if isinstance(v, list):
        return {LIST: [to_student(x, tensors, device) for x in v]}
    if isinstance(v, dict):
        return {DICT: {k: to_student(x, tensors, device) for k, x in v.items()}}
    return v


def from_student(v: Any, tensors: Tensors) -> Any:
    """An answer's value: tensors from `tensors` (marked with the device they were on there), modules as Remote.

    What the student's process sent is untrusted: a forged value raises KeyError, TypeError or AttributeError.
    """
    if isinstance(v, dict):
        if TENSOR in v:
            t = tensors[v[TENSOR]]
            t.student_device = v.get(DEVICE, "cpu")  # type: ignore[attr-defined]  # the checks read it beside the values
            return t
        if TUPLE in v:
            return tuple(from_student(x, tensors) for x in v[TUPLE])
        if LIST in v:
            return [from_student(x, tensors) for x in v[LIST]]
        if DICT in v:
            return {k: from_student(x, tensors) for k, x in v[DICT].items()}
        if HANDLE in v:
            return Remote(v[HANDLE], v.get("type", "object"))
        if REPR in v:
            return Opaque(v[REPR])
    return v


# --- values, the student's side ------------------------------------------------------------------

def moved(value: Any, device: str) -> Any:
    """A tensor or module on `device`: the default placement of from_grader."""
    return value.to(device)


def from_grader(v: Any, tensors: Tensors, objects: Objects,
                assign_state: Callable[[torch.nn.Module, list[torch.Tensor]], object],
                place: Callable[[Any, str], Any] = moved) -> Any:
    """Arguments as the student's code gets them: tensors on their device (requires_grad where `grad`), modules
    from `objects` by handle; `assign_state(module, tensors)` gives a `new` module the grader's weights, and
    `place(tensor or module, device)` puts each on its device (the fake GPU's own, sandbox/child/fake_gpu.py)."""
    if isinstance(v, dict):
        if TENSOR in v:
            t = place(tensors[v[TENSOR]], v.get(DEVICE, "cpu"))
            return t.requires_grad_(True) if v.get("grad") else t
        if TUPLE in v:
            return tuple(from_grader(x, tensors, objects, assign_state, place) for x in v[TUPLE])
        if LIST in v:
            return [from_grader(x, tensors, objects, assign_state, place) for x in v[LIST]]
        if DICT in v:
            return {k: from_grader(x, tensors, objects, assign_state, place) for k, x in v[DICT].items()}
        if HANDLE in v:
            return objects[v[HANDLE]]
        if GENERATOR in v:
            return torch.Generator().manual_seed(v[GENERATOR])
        if DTYPE in v:
            return getattr(torch, v[DTYPE])
        if DEVICE in v:
            return torch.device(v[DEVICE])
        if NEW in v:  # a fresh PyTorch module built by the protocol, e.g. an nn.MultiheadAttention
            args = from_grader(v.get("args", {LIST: []}), tensors, objects, assign_state, place)
            kwargs = from_grader(v.get("kwargs", {DICT: {}}), tensors, objects, assign_state, place)
            mod = getattr(torch.nn, v[NEW])(*args, **kwargs)
            if v.get("state"):
                assign_state(mod, [tensors[k] for k in v["state"]])
            return place(mod, v.get("to", "cpu"))
    return v


def to_grader(v: Any, tensors: Tensors, objects: Objects, depth: int = 0) -> Any:
    """A value for the grader: tensors (and numpy arrays) copied into `tensors`, modules kept in `objects` and
    sent by handle, anything else described; cut to the limits above."""
    if depth > MAX_DEPTH:
        return {REPR: "nested too deeply"}
    if isinstance(v, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = carried(v)
        return {TENSOR: key, DEVICE: str(v.device), DTYPE: str(v.dtype).replace("torch.", "")}
    if type(v).__module__ == "numpy" and hasattr(v, "shape"):
        key = f"t{len(tensors)}"
        tensors[key] = torch.from_numpy(__import__("numpy").ascontiguousarray(v)).clone()
        return {TENSOR: key, DEVICE: "numpy", DTYPE: str(v.dtype)}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v if not isinstance(v, str) else v[:MAX_TEXT]
    if isinstance(v, tuple):
        return {TUPLE: [to_grader(x, tensors, objects, depth + 1) for x in v[:MAX_ITEMS]]}
    if isinstance(v, list):
        return {LIST: [to_grader(x, tensors, objects, depth + 1) for x in v[:MAX_ITEMS]]}
    if isinstance(v, dict):
        return {DICT: {str(k): to_grader(x, tensors, objects, depth + 1) for k, x in list(v.items())[:MAX_ITEMS]}}
    if isinstance(v, torch.nn.Module):
        h = f"h{len(objects)}"
        objects[h] = v
        return {HANDLE: h, "type": type(v).__name__}
    return {REPR: f"{type(v).__name__}: {safe_repr(v)}"}
