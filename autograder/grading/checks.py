"""Checkers in PrairieLearn's style: fixed argument order (name, ref, got), messages that say expected vs got.

With autograder.grading.plugin, this is everything a suite imports: the checkers, the shared inputs and
tolerances, the oracles two assignments share, and the named mistakes of the public checks.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from autograder.notebooks.public_checks import (  # noqa: F401 -- for suites
    SCALE_MISSING,
    first_difference,
    known_mistake,
    unscaled,
    unscaled_mha,
)
from autograder.sandbox.grader_side import Opaque, Remote
from autograder.sandbox.state import StateMismatch, assign_state


class Fail(Exception):
    """A check failed; the message is what the student reads."""


def describe(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"a tensor of shape {tuple(v.shape)}"
    if isinstance(v, (Opaque, Remote)):
        return repr(v)
    return f"{type(v).__name__} {str(v)[:60]}"


def check_true(cond: object, message: str) -> None:
    if not cond:
        raise Fail(message)


def check_tuple(name: str, length: int, got: Any) -> tuple | list:
    """`got` is a tuple (or list) of `length` things."""
    if not isinstance(got, (tuple, list)) or len(got) != length:
        raise Fail(f"'{name}' returned {describe(got)}, expected a tuple of {length}")
    return got


def check_tensor(name: str, ref: torch.Tensor, got: Any, dtype: bool = True, device: str | None = None) -> None:
    """`got` is a tensor with ref's shape (and dtype, and device when given)."""
    if not isinstance(got, torch.Tensor):
        raise Fail(f"'{name}' is {describe(got)}, expected a tensor of shape {tuple(ref.shape)}")
    check_shape(name, ref, got)
    if dtype and got.dtype != ref.dtype:
        raise Fail(f"'{name}' has dtype {dtype_name(got.dtype)}, expected {dtype_name(ref.dtype)}")
    if device is not None:
        check_device(name, device, got)


def check_shape(name: str, ref: torch.Tensor | Sequence[int], got: Any) -> None:
    ref_shape = tuple(ref.shape) if isinstance(ref, torch.Tensor) else tuple(ref)
    if tuple(got.shape) != ref_shape:
        raise Fail(f"'{name}' has shape {tuple(got.shape)}, expected {ref_shape}")


def check_device(name: str, ref: str | torch.device, got: Any) -> None:
    """The student's tensor stayed on the input's device (cpu, cuda)."""
    got_dev = getattr(got, "student_device", "cpu")
    if got_dev.split(":")[0] != str(ref).split(":")[0]:
        raise Fail(f"'{name}' is on {got_dev}, expected {ref} (the input's device)")


def _where(index: Any, dims: Any) -> str:
    if dims is None:
        return "at index " + str(tuple(index))
    labels = [f"{d} {i}" for d, i in zip(dims, index, strict=False) if d]
    return "at " + ", ".join(labels) if labels else ""


def check_close(name: str, ref: torch.Tensor, got: Any, atol: float = 1e-5, rtol: float = 1e-5,
                oracle: str | None = None, dims: Sequence[str] | None = None, case: str | None = None,
                mistakes: Mapping[str, torch.Tensor] | None = None) -> None:
    """Values agree: max |got - ref| within atol + rtol |ref|; the message names the worst entry.

    `mistakes` maps a hint (public_checks.SCALE_MISSING, ...) to what the oracle gives when run the mistaken way;
    the message ends with the hint of the one `got` reproduces.
    """
    check_tensor(name, ref, got, dtype=False)
    ref64, got64 = ref.detach().double(), got.detach().double()
    if not torch.isfinite(got64).all() and torch.isfinite(ref64).all():
        bad = (~torch.isfinite(got64)).nonzero()[0].tolist()
        raise Fail(f"'{name}' has a non-finite value ({got64[tuple(bad)].item()}) {_where(bad, dims)}"
                   + (f", {case}" if case else ""))
    err = (got64 - ref64).abs()
    both_inf = torch.isinf(ref64) & (ref64 == got64)
    err = torch.where(both_inf, torch.zeros_like(err), err)
    excess = err - (atol + rtol * ref64.abs().nan_to_num(0, 0, 0))
    if err.numel() and excess.max() > 0:
        worst = torch.nonzero(excess == excess.max())[0].tolist()
        against = oracle or "the reference"
        hint = known_mistake(got, mistakes, atol)
        raise Fail(f"max |{name} - {against}| = {err.max().item():.3g} {_where(worst, dims)} "
                   f"(tolerance {atol:g})" + (f", {case}" if case else "") + (f": {hint}" if hint else ""))


def check_number(name: str, ref: float, got: Any, tol: float = 1e-6) -> None:
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        else:
            raise Fail(f"'{name}' is {describe(got)}, expected a number")
    if abs(got - ref) > tol * max(1.0, abs(ref)):
        raise Fail(f"'{name}' is {got:.10g}, expected {ref:.10g}")  # :g would show 1000005 as 1e+06


def check_signature(name: str, expected: str, info: Any, methods: Mapping[str, str] | None = None) -> None:
    """The spec's parameters are there, in order, with their defaults; extra optional ones are allowed."""
    if not isinstance(info, dict) or info.get("kind") not in ("function", "class"):
        kind = info.get("kind") if isinstance(info, dict) else info
        raise Fail(f"'{name}' is not a function or class (it is {kind})")
    _compare_params(name, expected, info.get("params"))
    for method, sig in (methods or {}).items():
        got = (info.get("methods") or {}).get(method)
        if got is None:
            raise Fail(f"'{name}' has no method '{method}'")
        _compare_params(f"{name}.{method}", sig, got)


def _compare_params(name: str, expected: str, got: Any) -> None:
    if got is None:
        raise Fail(f"the signature of '{name}' cannot be read")
    want = parse_signature(expected)
    names = [p[0] for p in got]
    variadic = any(p[1] in ("VAR_POSITIONAL", "VAR_KEYWORD") for p in got)
    for k, (pname, _default) in enumerate(want):
        if k < len(got) and got[k][0] == pname:
            continue
        if variadic and pname not in names:
            continue
        raise Fail(f"'{name}' has parameters ({', '.join(names)}), expected {expected}")
    extra = [p for p in got[len(want):] if p[1] not in ("VAR_POSITIONAL", "VAR_KEYWORD") and p[2] == ""]
    if extra:
        raise Fail(f"'{name}' has extra required parameters ({', '.join(p[0] for p in extra)}); "
                   f"only optional ones may be added to {expected}")


def parse_signature(text: str) -> list[tuple[str, str | None]]:
    """'(Q, K, V, mask=None)' -> [('Q', None), ..., ('mask', 'None')]."""
    inner = text.strip()[1:-1].strip()
    if not inner:
        return []
    out = []
    for part in inner.split(","):
        name, _, default = part.strip().partition("=")
        out.append((name.strip(), default.strip() or None))
    return out


# --- inputs and tolerances shared by the suites -----------------------------------------------

TOLERANCES = {  # kind -> (float64, float32 on the CPU, float32 where CUDA may use TF32)
    "values": (1e-10, 1e-5, 1e-3),
    "gradients": (1e-9, 1e-4, 5e-3),
    "decompositions": (1e-8, 1e-4, 1e-3),  # SVD, QR and recurrences: rounding accumulates
}


def tol(student: Any, dtype: torch.dtype, kind: str = "values") -> float:
    """The absolute tolerance of a `kind` check on `dtype` where the student's code runs (TOLERANCES)."""
    f64, cpu, cuda = TOLERANCES[kind]
    if dtype == torch.float64:
        return f64
    return cpu if student.device == "cpu" else cuda


def dtype_name(dtype: torch.dtype) -> str:
    """torch.float32 -> 'float32', as a student writes it."""
    return str(dtype).replace("torch.", "")


def randn(g: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal inputs from the check's own generator `g`."""
    return torch.randn(*shape, generator=g, dtype=dtype)


def int_seed(g: torch.Generator) -> int:
    """A seed for what the student's code builds (weights, data), drawn from the check's generator."""
    return int(torch.randint(0, 2**31 - 1, (1,), generator=g))


# --- state and oracles shared by the suites -----------------------------------------------------

def copy_state(name: str, tensors: Sequence[torch.Tensor], module: Any, expected: str = "") -> Any:
    """`module` carrying `tensors` (by registration order and shape); Fail naming `name` when they do not fit."""
    try:
        return assign_state(module, list(tensors))
    except StateMismatch as e:
        got, want = e.value_shapes, e.module_shapes
        k, want_k, got_k = first_difference(want, got)
        shown = (f"{len(got)} parameter tensor{'s' * (len(got) != 1)}, expected {len(want)}; tensor {k} has shape "
                 f"{got_k or 'none'}, expected {want_k or 'none'}")
        raise Fail(f"{name} has {shown}" + (f" ({expected})" if expected else "")) from None


def attention_oracle(Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor | None = None,
                     blocked: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """F.scaled_dot_product_attention's output and the weights it implies.

    `mask` follows the assignment's convention: True = may attend (lab14, w8l1), or True = blocked with
    `blocked=True` (w8l4). Weights: softmax(Q K^T / sqrt(d_k)) with the masked scores at -inf; a query whose every
    key is blocked gets zero weights, as SDPA gives it a zero output (the courses' spec: zeros, not NaN).
    """
    allowed = None if mask is None else (~mask.bool() if blocked else mask.bool())
    out = F.scaled_dot_product_attention(Q, K, V, attn_mask=allowed)
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])  # (..., T_q, T_k)
    if allowed is None:
        return out, scores.softmax(-1)
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)  # NaN in a row with no open key
    return out, weights.masked_fill(~allowed.any(-1, keepdim=True), 0.0)


def sinusoid_table(max_len: int, d: int) -> torch.Tensor:
    """The positional-encoding table in float64, from the formula:
    PE[pos, j] = sin or cos(pos / 10000^((j - j % 2) / d))."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    j = torch.arange(d, dtype=torch.float64)[None, :]  # (1, d)
    angle = pos / 10000 ** ((j - j % 2) / d)  # (max_len, d): columns 2i and 2i + 1 share a frequency
    return torch.where(j % 2 == 0, torch.sin(angle), torch.cos(angle))
