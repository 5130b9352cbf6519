"""The smallest failing case: when a value or gradient check fails, Hypothesis looks for the smallest input on
which the student's function still disagrees with the oracle, and the reason ends with it.

A suite marks a check with `@smallest_case(search)` (below its `item` mark); `search` is a `Search`: how to draw
a case (dimensions first, then small-integer inputs), how to ask the student (through the `student` proxy, so the
student's code runs in its sandbox) and the oracle (here, on the grader's side). Nothing runs while checks pass.

Smallest: every dimension at most 1 if any such case fails, else at most 2, else 3; then each dimension as low as
it goes; then Hypothesis's shrinking (fewer and smaller nonzero values). Rules: deterministic (derandomized, no
example database: a regrade finds the same case, as long as the search ends within its budget); bounded
(course.yaml's limits.search_seconds per item, shared by its failing checks, at most half of what is left of the
item's time limit; past it the best case found so far stands, or the grader's own case alone); a case fails only
when the student's answer has the wrong structure or shape, or is off by more than 1e-4 (so float32 rounding never
makes one); a case on which the student's code raises is not one (that is another problem than the check's).
"""
import contextlib
import functools
import os
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from autograder.grading.checks import Fail
from autograder.sandbox.grader_side import StudentRaised


class _Strategies:
    """hypothesis.strategies, imported at the first search: the import costs a second of CPU in every grader
    process, and most gradings never search."""

    def __getattr__(self, name):
        if name.startswith("_"):  # what introspection asks (pytest's collection looks for `_mock_name`)
            raise AttributeError(name)
        from hypothesis import strategies
        return getattr(strategies, name)


st = _Strategies()
BUDGET_S = 5.0  # search seconds per item (all its failing checks together) where no course says (limits.search_seconds)
MAX_EXAMPLES = 20    # generated cases per cap before shrinking; small inputs show most mistakes within a few
LOWER_EXAMPLES = 10  # generated cases when trying one dimension lower
CAPS = (1, 2, 3)     # the largest dimension drawn, in turn
_cap, _caps = CAPS[-1], []  # the search running now: its cap on every dimension, and on the k-th drawn, if any
_drawn = []          # (value, lowest) of each dimension the case being drawn has drawn so far
ATOL = RTOL = 1e-4   # a disagreement far above float32 rounding on inputs of small integers
_spent = weakref.WeakKeyDictionary()  # sandbox -> {item: search seconds spent}
SEARCHES = []        # (item, seconds, whether a case was found) of every search in this process (benchmarks)


@dataclass
class Search:
    """How to look for one item's smallest failing case.

    `draw(draw)` -> {name: value}: dimensions (ints) first, then inputs; Hypothesis's `draw` takes a strategy.
    `student(student, case, memo)` and `oracle(case)` -> the outputs, one tensor or a tuple of `len(outputs)`;
    `memo` is a dict that lasts one search (a module built once per configuration, say).
    """
    draw: Callable
    student: Callable
    oracle: Callable
    outputs: Sequence[str]


def function_search(name, draw, oracle, outputs, args, kwargs=()):
    """A Search of the function `name`, called with the case's `args` in order and `kwargs` by name."""
    def ask(student, case, memo):
        return student.call(name, *[case[a] for a in args], **{k: case[k] for k in kwargs})
    return Search(draw, ask, lambda case: oracle(*[case[a] for a in args], **{k: case[k] for k in kwargs}), outputs)


def gradient_search(name, draw, oracle, args, wrt, upstream, kwargs=()):
    """A Search of the gradients of sum_i <out_i, case[upstream[i]]> w.r.t. the args named in `wrt`.

    `upstream` names, per output of `name`, the case's tensor it is multiplied by, or None to leave it out.
    """
    wrt_at = [args.index(w) for w in wrt]

    def ask(student, case, memo):
        ups = [None if u is None else case[u] for u in upstream]
        _, grads = student.grad(name, [case[a] for a in args], wrt=wrt_at, upstream=ups,
                                **{k: case[k] for k in kwargs})
        return tuple(grads)

    def expected(case):
        leaves = {w: case[w].clone().requires_grad_(True) for w in wrt}
        out = oracle(*[leaves.get(a, case[a]) for a in args], **{k: case[k] for k in kwargs})
        outs = out if isinstance(out, (tuple, list)) else (out,)
        total = sum((o * case[u]).sum() for o, u in zip(outs, upstream, strict=False) if u is not None)
        return torch.autograd.grad(total, list(leaves.values()), allow_unused=True)
    return Search(draw, ask, expected, tuple(f"d{w}" for w in wrt))


# --- drawing small cases ---------------------------------------------------------------------------

def ints(draw, *shape, lo=-2, hi=2, dtype=torch.float32):
    """A tensor of small integers (shrinking towards 0)."""
    n = 1
    for s in shape:
        n *= s
    return torch.tensor(draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n)), dtype=dtype).reshape(shape)


def dim(draw, lo=1, hi=3):
    """A dimension in lo..hi, at most the search's current cap for it (shrinking towards lo)."""
    k = len(_drawn)
    cap = _caps[k] if k < len(_caps) else _cap
    value = draw(st.integers(lo, max(lo, min(hi, cap))))
    _drawn.append((value, lo))
    return value


def batch_shape(draw, names=("B", "H"), hi=2):
    """0 to len(names) leading batch dimensions, each 1..hi: {name: size} (shrinks to none)."""
    n = draw(st.integers(0, len(names)))
    return {name: dim(draw, 1, hi) for name in names[:n]}


def bool_mask(draw, rows, cols, open_value):
    """None, or a (rows, cols) bool mask with at least one key `open_value` (may attend) in every row."""
    if not draw(st.booleans()):
        return None
    m = torch.tensor(draw(st.lists(st.booleans(), min_size=rows * cols, max_size=rows * cols))).reshape(rows, cols)
    shut = (m != open_value).all(-1)
    m[shut, 0] = open_value
    return m


def attention_case(draw, open_value):
    """Q, K, V with 0-2 batch dims (B, H), T_q, T_k, d_k, d_v in 1..3, a (T_q, T_k) mask or none; `open_value`
    is the mask's value for a key that may be attended (True in lab14 and w8l1, False in w8l4)."""
    case = batch_shape(draw)
    case.update(T_q=dim(draw), T_k=dim(draw), d_k=dim(draw), d_v=dim(draw, 1, 2))
    lead = tuple(case.values())[:-4]
    case["Q"] = ints(draw, *lead, case["T_q"], case["d_k"])
    case["K"] = ints(draw, *lead, case["T_k"], case["d_k"])
    case["V"] = ints(draw, *lead, case["T_k"], case["d_v"])
    case["mask"] = bool_mask(draw, case["T_q"], case["T_k"], open_value)
    return case


def with_upstream(draw_case, name, like):
    """`draw_case` plus `name`, an upstream gradient of small integers shaped like the output `like(case)`."""
    def draw(d):
        case = draw_case(d)
        case[name] = ints(d, *like(case))
        return case
    return draw


# --- the search --------------------------------------------------------------------------------------

def smallest_case(search):
    """Decorate a suite's check: when it fails, its reason ends with the smallest failing case `search` finds."""
    def wrap(check):
        @functools.wraps(check)
        def checked(**fixtures):
            try:
                return check(**fixtures)
            except Fail as e:
                found, printed = find(fixtures["student"], search)
                if found is None and not printed:
                    raise
                raise Fail(str(e) + (f"; smallest failing case: {found}" if found else "")
                           + (f"\nprinted: {printed[-400:]}" if printed else "")) from None
        return checked
    return wrap


def search_budget(student):
    """This item's search seconds: $COURSE_SEARCH_SECONDS where set (0: off; the test suite's grading of many planted
    mistakes, benchmarks), else the course's limits.search_seconds as the plugin handed it over."""
    if os.environ.get("COURSE_SEARCH_SECONDS"):
        return float(os.environ["COURSE_SEARCH_SECONDS"])
    return getattr(student, "search_s", BUDGET_S)


def find(student, search, budget_s=None):
    """(the smallest failing case described, or None when none was found within the budget; what the student's
    code printed on the check's own case, which the search takes from the sandbox's output)."""
    sandbox = getattr(student, "sandbox", None)
    spent = _spent.setdefault(sandbox, {}) if sandbox is not None else {}
    item = getattr(student, "item", "")
    t0 = time.monotonic()
    left = student.deadline - t0 if hasattr(student, "deadline") else float("inf")
    if budget_s is None:
        budget_s = search_budget(student)
    budget = min(budget_s - spent.get(item, 0.0), left / 2)
    if budget <= 0.1:
        return None, ""
    printed = sandbox.output() if sandbox is not None and getattr(sandbox, "proc", None) is not None else ""
    deadline = getattr(student, "deadline", None)
    if deadline is not None:  # a call that hangs in the search costs the search's time, not the item's
        student.deadline = min(deadline, t0 + budget + 1.0)
    best = None
    try:
        best = search_cases(student, search, t0 + budget)
    finally:
        if deadline is not None:
            student.deadline = deadline
        spent[item] = spent.get(item, 0.0) + time.monotonic() - t0
        SEARCHES.append((item, time.monotonic() - t0, best is not None))
        if sandbox is not None and getattr(sandbox, "proc", None) is not None:
            sandbox.output()  # what the student's code printed during the search is not the check's
    return (None if best is None else describe_case(*best)), printed.strip()


class _Disagrees(Exception):
    """The student's answer and the oracle's differ on this case (Hypothesis shrinks it)."""


class _OutOfTime(BaseException):
    """The budget is spent: a BaseException, so Hypothesis lets it through and ends at once (passing every case
    instead would still cost the rest of its examples and up to 200 shrink attempts, seconds under load)."""


def search_cases(student, search, t_end):
    """(case, mismatch) of the smallest failing case met before t_end, or None.

    One Hypothesis run per cap on the dimensions (1, then 2, then 3) until one finds a failing case; then one run
    per dimension of that case with it one lower and the others capped at theirs, keeping what still fails. Lowering
    a dimension shifts every value drawn after it, which Hypothesis's shrinker alone rarely gets past."""
    best, stopped, memo, seen = [], [], {}, {}

    def probe(data):
        if stopped or time.monotonic() > t_end:
            raise _OutOfTime()
        _drawn.clear()
        case = search.draw(data.draw)
        key = fingerprint(case)
        if key not in seen:  # different draws can make the same case: ask the student once
            seen[key] = ask(case)
        if seen[key] is None:
            return
        if not best or size(case) < size(best[0][0]):
            best[:] = [(case, seen[key]), list(_drawn)]
        raise _Disagrees()

    def ask(case):
        try:
            return compare(search.outputs, search.oracle(case), search.student(student, case, memo))
        except StudentRaised:
            return None
        except Exception:  # the sandbox failed, or the answer is beyond this search (a Fail): stop searching
            stopped.append(True)
            return None

    def run(cap, caps=(), examples=MAX_EXAMPLES):
        from hypothesis import HealthCheck, Phase, Verbosity, given, settings
        global _cap, _caps
        _cap, _caps = cap, list(caps)
        # our _Disagrees re-raised, Hypothesis' own, the budget: the best stands
        with contextlib.suppress(Exception, _OutOfTime):
            settings(derandomize=True, database=None, max_examples=examples, deadline=None,
                     phases=(Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck),
                     verbosity=Verbosity.quiet, report_multiple_bugs=False, print_blob=False,
                     )(given(st.data())(probe))()
        return not (stopped or time.monotonic() > t_end)

    global _cap, _caps
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a thread pool only waits for its threads (10 ms a softmax, loaded)
    try:
        for cap in CAPS:
            if not run(cap) or best:
                break
        k = 0
        while best and k < len(best[1]) and time.monotonic() < t_end and not stopped:
            caps = [v for v, _ in best[1]]
            if caps[k] > best[1][k][1]:
                caps[k] -= 1
                run(cap, caps, LOWER_EXAMPLES)
            k += 1
    finally:
        _cap, _caps = CAPS[-1], []
        torch.set_num_threads(threads)
    return best[0] if best else None


def fingerprint(case):
    """The case's exact contents, hashable."""
    return tuple((k, (str(v.dtype), tuple(v.shape), tuple(v.flatten().tolist())) if isinstance(v, torch.Tensor)
                  else repr(v)) for k, v in case.items())


def size(case):
    """Smaller: fewer input numbers, then smaller dimensions, then smaller magnitudes."""
    tensors = [v for v in case.values() if isinstance(v, torch.Tensor)]
    numel = sum(t.numel() for t in tensors)
    dims = sum(v for v in case.values() if isinstance(v, int) and not isinstance(v, bool))
    magnitude = sum(float(t.double().abs().sum()) for t in tensors)
    return numel, dims, magnitude


def compare(names, expected, got):
    """(name, expected, got) of the first output that disagrees, or None."""
    many = len(names) > 1
    if many and (not isinstance(got, (tuple, list)) or len(got) != len(names)):
        return "the answer", None, got
    exp = expected if many else (expected[0] if isinstance(expected, (tuple, list)) else expected,)
    gots = got if many else (got[0] if isinstance(got, (tuple, list)) and len(got) == 1 else got,)
    for name, e, g in zip(names, exp, gots, strict=False):
        if e is None and g is None:
            continue
        if isinstance(g, (int, float)) and not isinstance(g, bool):
            g = torch.tensor(float(g))
        if e is None or g is None:  # no gradient reached an input: right only where the other one is all zeros
            other = g if e is None else e
            if not isinstance(other, torch.Tensor) or bool((other != 0).any()):
                return name, e, g
            continue
        e = e.detach()
        if not isinstance(g, torch.Tensor) or tuple(g.shape) != tuple(e.shape):
            return name, e, g
        e64, g64 = e.double(), g.detach().double()
        if e.dtype == torch.bool or g.dtype == torch.bool:
            if not torch.equal(e.bool(), g.bool()) or e.dtype != g.dtype:
                return name, e, g
            continue
        close = (e64 - g64).abs() <= ATOL + RTOL * e64.abs()
        close |= torch.isinf(e64) & (e64 == g64)
        if not bool(close.all()):
            return name, e, g
    return None


def show(v):
    """A value as a student would type it: nested lists, 3 significant digits."""
    if isinstance(v, torch.Tensor):
        if v.dtype == torch.bool:
            return str(v.tolist())
        return _nested(v.detach().double().tolist())
    if isinstance(v, (tuple, list)):
        return f"a {type(v).__name__} of {len(v)}"
    return repr(v)


def _nested(x):
    if isinstance(x, list):
        return "[" + ", ".join(_nested(y) for y in x) + "]"
    return f"{x:.3g}"


def describe_case(case, mismatch):
    """'T_q=1, d_k=2, Q=[[1, 0]], ...: expected Z=[[0.67]], got Z=[[0.731]]'."""
    name, expected, got = mismatch
    inputs = ", ".join(f"{k}={show(v)}" for k, v in case.items())
    if name == "the answer":
        return inputs + f": the answer is {show(got)}"
    if isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor) and got.shape != expected.shape:
        return inputs + f": expected {name} of shape {tuple(expected.shape)}, got {tuple(got.shape)}"
    return inputs + f": expected {name}={show(expected)}, got {name}={show(got)}"
