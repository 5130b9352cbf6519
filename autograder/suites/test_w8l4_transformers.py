"""Hidden checks for Week 8, Lecture 4: self-attention and transformers (mask convention: True = blocked).

Oracles: F.scaled_dot_product_attention for `attention`; nn.MultiheadAttention, nn.TransformerEncoderLayer and
nn.TransformerDecoderLayer carrying the student's own weights (mapped by the spec's attribute names) for the
modules; the sinusoid formula in float64 for the encodings; the reference solution for the Transformer. Oracle
modules stay in train mode (dropout 0), so PyTorch's fused inference path, which zeroes padded rows, is never used.
PYTEST_DONT_REWRITE
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autograder.grading.suite_api import (
    SCALE_MISSING,
    Fail,
    Opaque,
    Remote,
    Search,
    Seeded,
    attention_case,
    attention_oracle,
    bool_mask,
    check_close,
    check_number,
    check_tensor,
    check_true,
    check_tuple,
    dim,
    dtype_name,
    first_difference,
    function_search,
    gradient_search,
    ints,
    randn,
    reference,
    sinusoid_table,
    smallest_case,
    st,
    tol,
    unscaled,
    unscaled_mha,
    with_upstream,
)

ref = reference("w8l4_transformers")

HEAD_DIMS = ("batch", "head", "query", "col")
ATTN_DIMS = ("batch", "head", "query", "key")
SEQ_DIMS = ("batch", "position", "col")
BOS, EOS, PAD, VOCAB, N_DIGITS = ref.BOS, ref.EOS, ref.PAD, ref.VOCAB, ref.N_DIGITS


def randint(rng, lo, hi):
    """An int in [lo, hi]."""
    return int(torch.randint(lo, hi + 1, (1,), generator=rng))


def dims_of(t, names=HEAD_DIMS):
    return names[-t.dim():]


def pad_mask(lengths, T):
    """(B, 1, 1, T) bool, True at key positions >= the row's length (blocked)."""
    return (torch.arange(T)[None, :] >= torch.as_tensor(lengths)[:, None])[:, None, None, :]


def tri(T, S=None):
    """(T, S) bool, True strictly above the diagonal (the causal mask by torch.triu)."""
    return torch.triu(torch.ones(T, S or T, dtype=torch.bool), diagonal=1)


def random_mask(rng, *shape):
    """A random bool mask (True = blocked) that leaves at least one key open in every query row."""
    m = torch.rand(*shape, generator=rng) < 0.4
    open_key = torch.randint(0, shape[-1], shape[:-1], generator=rng)
    return m.scatter(-1, open_key.unsqueeze(-1), False)


# --- attention ------------------------------------------------------------------------------------

def attention_cases(rng):
    """(label, Q, K, V, mask): batch and head dims, T_q != T_k, d_v != d_k, every mask kind, float64."""
    Q, K, V = randn(rng, 2, 3, 5, 8), randn(rng, 2, 3, 7, 8), randn(rng, 2, 3, 7, 6)
    yield "no mask, Q (2, 3, 5, 8), K (2, 3, 7, 8), V (2, 3, 7, 6)", Q, K, V, None
    Q, K, V = randn(rng, 2, 6, 4), randn(rng, 2, 6, 4), randn(rng, 2, 6, 4)
    yield "causal mask (6, 6) True above the diagonal, Q/K/V (2, 6, 4)", Q, K, V, tri(6)
    Q, K, V = randn(rng, 2, 2, 4, 5), randn(rng, 2, 2, 7, 5), randn(rng, 2, 2, 7, 3)
    yield "padding mask (2, 1, 1, 7), keys 3.. of batch 0 blocked", Q, K, V, pad_mask([3, 7], 7)
    Q, K, V = (randn(rng, 2, 2, 5, 4, dtype=torch.float64) for _ in range(3))
    yield "float64, causal and padding mask (2, 1, 5, 5)", Q, K, V, tri(5) | pad_mask([2, 5], 5)[:, :, 0:1, :]
    Q, K, V = randn(rng, 9, 16) * 3, randn(rng, 11, 16) * 3, randn(rng, 11, 16)
    yield "unbatched (9, 16) x (11, 16), large scores", Q, K, V, None
    Q, K, V = randn(rng, 3, 2, 4, 6), randn(rng, 3, 2, 5, 6), randn(rng, 3, 2, 5, 7)
    yield "random (4, 5) mask broadcast over batch and heads", Q, K, V, random_mask(rng, 4, 5)


@pytest.mark.item("attention", "shapes")
def test_attention_shapes(student, rng):
    for label, Q, K, V, mask in attention_cases(rng):
        student.case(label)
        Z, A = check_tuple("attention", 2, student.call("attention", Q, K, V, mask=mask))
        ref_Z, ref_A = attention_oracle(Q, K, V, mask, blocked=True)
        check_tensor("Z", ref_Z, Z, device=student.device)
        check_tensor("A", ref_A, A, device=student.device)


def blocked_attention(Q, K, V, mask=None):
    return attention_oracle(Q, K, V, mask, blocked=True)


def small_attention(draw):
    return attention_case(draw, open_value=False)


ATTENTION_SEARCH = function_search("attention", small_attention, blocked_attention, ("Z", "A"), ("Q", "K", "V"),
                                   ("mask",))
ATTENTION_GRAD_SEARCH = gradient_search(
    "attention", with_upstream(small_attention, "dZ", lambda c: (*c["Q"].shape[:-1], c["d_v"])), blocked_attention,
    ("Q", "K", "V", "mask"), ("Q", "K", "V"), ("dZ", None))


@pytest.mark.item("attention", "values")
@smallest_case(ATTENTION_SEARCH)
def test_attention_values(student, rng):
    for label, Q, K, V, mask in attention_cases(rng):
        student.case(label)
        Z, A = check_tuple("attention", 2, student.call("attention", Q, K, V, mask=mask))
        ref_Z, ref_A = attention_oracle(Q, K, V, mask, blocked=True)
        bad_Z, bad_A = attention_oracle(unscaled(Q), K, V, mask, blocked=True)
        check_close("Z", ref_Z, Z, atol=tol(student, Q.dtype), oracle="F.scaled_dot_product_attention",
                    dims=dims_of(Q), case=label, mistakes={SCALE_MISSING: bad_Z})
        check_close("A", ref_A, A, atol=tol(student, Q.dtype),
                    oracle="softmax(Q K^T / sqrt(d_k)) with blocked keys at 0", dims=dims_of(Q, ATTN_DIMS), case=label,
                    mistakes={SCALE_MISSING: bad_A})


@pytest.mark.item("attention", "gradients")
@smallest_case(ATTENTION_GRAD_SEARCH)
def test_attention_gradients(student, rng):
    for label, Q, K, V, mask in list(attention_cases(rng))[:4]:
        student.case(label + ", gradients w.r.t. Q, K, V")
        up = randn(rng, *Q.shape[:-1], V.shape[-1], dtype=Q.dtype)
        (Z, _), grads = student.grad("attention", (Q, K, V, mask), wrt=[0, 1, 2], upstream=[up, None])
        leaves = [t.clone().requires_grad_(True) for t in (Q, K, V)]
        expected = torch.autograd.grad((attention_oracle(*leaves, mask, blocked=True)[0] * up).sum(), leaves)
        for name, e, got in zip(("dQ", "dK", "dV"), expected, grads, strict=False):
            if got is None:
                raise Fail(f"no gradient reached {name[1]} ({label})")
            check_close(name, e, got, atol=tol(student, Q.dtype, "gradients"),
                        oracle="autograd through F.scaled_dot_product_attention", dims=dims_of(Q), case=label)


@pytest.mark.item("attention", "properties")
def test_attention_properties(student, rng):
    student.case("random Q, K, V (2, 3, 6, 5) with a random mask: rows of A")
    Q, K, V = randn(rng, 2, 3, 6, 5), randn(rng, 2, 3, 8, 5), randn(rng, 2, 3, 8, 4)
    mask = random_mask(rng, 2, 1, 6, 8)
    _, A = student.call("attention", Q, K, V, mask=mask)
    check_true(bool((A >= 0).all()), f"A has negative entries (min {A.min().item():.3g}); softmax weights are >= 0")
    check_close("row sums of A", torch.ones(2, 3, 6), A.sum(-1), atol=1e-5, oracle="1", dims=HEAD_DIMS[:3],
                case=student.label)
    blocked = A.masked_select(mask.expand_as(A)).abs()
    check_true(bool((blocked <= 1e-12).all()), f"A is {blocked.max().item():.3g} at a blocked key, expected exactly 0 "
                                              f"(mask True = blocked), {student.label}")

    student.case("causal mask, T = 7, float64: zeros above the diagonal and no look-ahead")
    X = randn(rng, 2, 7, 6, dtype=torch.float64)
    Z, A = student.call("attention", X, X, X, mask=tri(7))
    above = A.masked_select(tri(7).expand_as(A)).abs()
    check_true(bool((above <= 1e-12).all()), f"with the causal mask A is {above.max().item():.3g} above the diagonal, "
                                            f"expected 0 (query t may not see keys after t)")
    t0 = randint(rng, 2, 5)
    X2 = X.clone()
    X2[:, t0 + 1:] = randn(rng, 2, 6 - t0, 6, dtype=torch.float64)
    Z2, _ = student.call("attention", X, X2, X2, mask=tri(7))
    check_close(f"Z[:, :{t0 + 1}] after changing keys/values after position {t0}", Z[:, :t0 + 1], Z2[:, :t0 + 1],
                atol=1e-10, oracle="Z before the change", dims=("batch", "query", "col"),
                case="the causal mask must hide later positions")

    student.case("self-attention without PE, X (2, 6, 8) float64, positions permuted")
    X = randn(rng, 2, 6, 8, dtype=torch.float64)
    perm = torch.randperm(6, generator=rng)
    Z, A = student.call("attention", X, X, X)
    Zp, Ap = student.call("attention", X[:, perm], X[:, perm], X[:, perm])
    check_close("attention(X[perm]) (permutation equivariance)", Z[:, perm], Zp, atol=1e-10, oracle="Z[perm]",
                dims=("batch", "position", "col"), case=f"expected attention(X)[perm], perm {perm.tolist()}")
    check_close("A of X[perm]", A[:, perm][:, :, perm], Ap, atol=1e-10, oracle="A[perm][:, perm]",
                dims=("batch", "query", "key"),
                case=f"expected A[perm][:, perm], perm {perm.tolist()}")

    student.case("the lecture's worked example: d_k = 64, q.k = 112 and 96")
    q = torch.ones(1, 64)
    K = torch.stack([torch.full((64,), 112 / 64), torch.full((64,), 96 / 64)])
    V = torch.eye(2)
    Z, A = student.call("attention", q, K, V)
    expected = torch.tensor([[112.0, 96.0]]).div(8).softmax(-1)
    check_close("A", expected, A, atol=1e-5, oracle="softmax([112, 96] / 8)", dims=("query", "key"),
                case="scores 112 and 96 scaled by 1/sqrt(64) give weights 0.88 and 0.12")

    student.case("query 1 with every key blocked (its mask row all True), float64: zero weights and a zero output, "
                 "not NaN")
    Q, K, V = (randn(rng, 2, t, 6, dtype=torch.float64) for t in (4, 5, 5))
    mask = torch.zeros(4, 5, dtype=torch.bool)
    mask[1] = True
    Z, A = student.call("attention", Q, K, V, mask=mask)
    ref_Z, ref_A = attention_oracle(Q, K, V, mask, blocked=True)
    check_close("A", ref_A, A, atol=1e-10, oracle="softmax over the open keys, zeros where none is open",
                dims=("batch", "query", "key"), case=student.label)
    check_close("Z", ref_Z, Z, atol=1e-10, oracle="F.scaled_dot_product_attention", dims=("batch", "query", "col"),
                case=student.label)


# --- MultiHeadAttention -----------------------------------------------------------------------------

def take(state, key, owner):
    if key not in state:
        raise Fail(f"{owner}'s state has no '{key}' (it has {', '.join(list(state)[:10])}): "
                   f"use the spec's attribute names")
    return state[key]


def oracle_mha(state, prefix, d, h, bias, dtype=torch.float32):
    """nn.MultiheadAttention(batch_first=True) with in_proj = cat(W^Q, W^K, W^V) and out_proj = W^O."""
    owner = prefix.rstrip(".") or "MultiHeadAttention"
    has_bias = f"{prefix}WQ.bias" in state
    if has_bias != bias:
        raise Fail(f"{owner} was built with bias={bias} but its W^Q {'has' if has_bias else 'has no'} bias")
    mha = nn.MultiheadAttention(d, h, bias=bias, batch_first=True, dtype=dtype)
    sd = {"in_proj_weight": torch.cat([take(state, f"{prefix}W{n}.weight", owner) for n in "QKV"]),
          "out_proj.weight": take(state, f"{prefix}WO.weight", owner)}
    if bias:
        sd["in_proj_bias"] = torch.cat([take(state, f"{prefix}W{n}.bias", owner) for n in "QKV"])
        sd["out_proj.bias"] = take(state, f"{prefix}WO.bias", owner)
    try:
        mha.load_state_dict({k: v.to(dtype) for k, v in sd.items()})
    except RuntimeError as e:
        raise Fail(f"{owner}'s W^Q, W^K, W^V, W^O do not have the shapes of nn.Linear({d}, {d}): "
                   f"{str(e).splitlines()[-1][:200]}") from e
    return mha


def head_mask(mask, B, h, Tq, Tk):
    """A mask broadcastable to (B, h, T_q, T_k) as nn.MultiheadAttention's (B * h, T_q, T_k) attn_mask."""
    return None if mask is None else mask.expand(B, h, Tq, Tk).reshape(B * h, Tq, Tk)


def mha_oracle(mha, x_q, x_kv, mask, h):
    B, Tq, Tk = x_q.shape[0], x_q.shape[1], x_kv.shape[1]
    return mha(x_q, x_kv, x_kv, attn_mask=head_mask(mask, B, h, Tq, Tk), need_weights=True,
               average_attn_weights=False)


def mha_cases(rng):
    """(label, d, h, bias, x_q, x_kv or None, mask, dtype)."""
    yield ("d_model 16, 4 heads, self-attention x (3, 5, 16)",
           16, 4, True, randn(rng, 3, 5, 16), None, None, torch.float32)
    yield ("d_model 24, 3 heads, x_q (2, 4, 24), x_kv (2, 7, 24), padding mask (2, 1, 1, 7)",
           24, 3, True, randn(rng, 2, 4, 24), randn(rng, 2, 7, 24), pad_mask([5, 7], 7), torch.float32)
    yield ("d_model 32, 8 heads, causal mask (6, 6)", 32, 8, True, randn(rng, 2, 6, 32), None, tri(6), torch.float32)
    yield ("d_model 12, 2 heads, bias=False, x_q (2, 3, 12), x_kv (2, 5, 12), per-head mask (2, 2, 3, 5)",
           12, 2, False, randn(rng, 2, 3, 12), randn(rng, 2, 5, 12), random_mask(rng, 2, 2, 3, 5), torch.float32)
    yield ("d_model 8, 1 head, float64 (module.double()), causal mask",
           8, 1, True, randn(rng, 2, 5, 8, dtype=torch.float64), None, tri(5), torch.float64)


def student_mha(student, d, h, bias, dtype):
    m = student.new("MultiHeadAttention", d, h, bias=bias)
    if dtype == torch.float64:
        student.method(m, "double")
    return m


@pytest.mark.item("MultiHeadAttention", "shapes")
def test_mha_shapes(student, rng):
    student.case("MultiHeadAttention() with the defaults")
    m = student.new("MultiHeadAttention")
    check_true(student.attr(m, "h") == 8 and student.attr(m, "d_k") == 64,
               f"MultiHeadAttention() has h = {student.attr(m, 'h')!r}, d_k = {student.attr(m, 'd_k')!r}, "
               f"expected 8 and 64")
    student.case("MultiHeadAttention(24, 3)")
    m = student.new("MultiHeadAttention", 24, 3)
    check_true(student.attr(m, "h") == 3 and student.attr(m, "d_k") == 8,
               f"MultiHeadAttention(24, 3) has h = {student.attr(m, 'h')!r}, d_k = {student.attr(m, 'd_k')!r}, "
               f"expected 3 and 8")
    state = student.state(m)
    for n in "QKVO":
        lin = student.attr(m, f"W{n}")
        check_true(isinstance(lin, Remote) and lin.type_name == "Linear", f"W{n} is {lin!r}, expected an nn.Linear")
        check_tensor(f"W{n}.weight", torch.empty(24, 24), take(state, f"W{n}.weight", "MultiHeadAttention"))
        check_tensor(f"W{n}.bias", torch.empty(24), take(state, f"W{n}.bias", "MultiHeadAttention"))
    n_params = sum(t.numel() for t in state.values())
    check_true(n_params == 4 * (24 * 24 + 24), f"MultiHeadAttention(24, 3) has {n_params} weights, expected 2,400")
    nb = student.state(student.new("MultiHeadAttention", 24, 3, bias=False))
    check_true(not any(k.endswith("bias") for k in nb), f"MultiHeadAttention(24, 3, bias=False) has biases: "
                                                        f"{[k for k in nb if k.endswith('bias')]}")
    x = randn(rng, 2, 7, 24)
    student.case("split_heads of x (2, 7, 24), 3 heads")
    check_tensor("split_heads(x)", torch.empty(2, 3, 7, 8), student.method(m, "split_heads", x), device=student.device)
    student.case("x_q (2, 4, 24), x_kv (2, 7, 24), 3 heads")
    out, A = check_tuple("forward", 2, student.method(m, "forward", randn(rng, 2, 4, 24), x))
    check_tensor("out", torch.empty(2, 4, 24), out, device=student.device)
    check_tensor("A", torch.empty(2, 3, 4, 7), A, device=student.device)
    student.case("self-attention x (2, 7, 24), x_kv omitted")
    out, A = check_tuple("forward", 2, student.method(m, "forward", x))
    check_tensor("out", torch.empty(2, 7, 24), out, device=student.device)
    check_tensor("A", torch.empty(2, 3, 7, 7), A, device=student.device)


def small_mha(draw):
    """MultiHeadAttention(h * d_k, h, bias) with weights of -1, 0, 1; self- or cross-attention, a mask or none."""
    case = {"h": dim(draw, 1, 2), "d_k": dim(draw, 1, 2), "B": dim(draw, 1, 2), "T_q": dim(draw, 1, 2)}
    cross = draw(st.booleans())
    if cross:
        case["T_k"] = dim(draw, 1, 2)
    d = case["d_model"] = case["h"] * case["d_k"]
    case["bias"] = draw(st.booleans())
    for n in "QKVO":
        case[f"W{n}.weight"] = ints(draw, d, d, lo=-1, hi=1)
        if case["bias"]:
            case[f"W{n}.bias"] = ints(draw, d, lo=-1, hi=1)
    case["x_q"] = ints(draw, case["B"], case["T_q"], d)
    case["x_kv"] = ints(draw, case["B"], case["T_k"], d) if cross else None
    case["mask"] = bool_mask(draw, case["T_q"], case.get("T_k", case["T_q"]), open_value=False)
    return case


def mha_with(student, case, memo):
    """The student's MultiHeadAttention of the case's size, carrying the case's weights (by the spec's names)."""
    key = (case["d_model"], case["h"], case["bias"])
    if key not in memo:
        m = student.new("MultiHeadAttention", *key[:2], bias=key[2])
        memo[key] = m, list(student.state(m))
    m, names = memo[key]
    student.load_state(m, [case[n] for n in names])  # a name not of the spec: KeyError ends the search
    return m


def small_mha_oracle(case, x_q, x_kv):
    weights = {k: v for k, v in case.items() if k.startswith("W")}
    mha = oracle_mha(weights, "", case["d_model"], case["h"], case["bias"])
    return mha_oracle(mha, x_q, x_q if x_kv is None else x_kv, case["mask"], case["h"])


MHA_SEARCH = Search(small_mha, lambda student, c, memo: student.method(mha_with(student, c, memo), "forward", c["x_q"],
                                                                         c["x_kv"], mask=c["mask"]),
                    lambda c: small_mha_oracle(c, c["x_q"], c["x_kv"]), ("out", "A"))


def as_pair(grads):
    """(d x_q, d x_kv): None for d x_kv in self-attention, so that a right answer there matches the search's two
    outputs (a tuple of one was taken for a wrong answer, and named a case that does not fail)."""
    return (grads[0], grads[1] if len(grads) > 1 else None)


def mha_grad_student(student, c, memo):
    wrt = [0] if c["x_kv"] is None else [0, 1]
    _, grads = student.grad(mha_with(student, c, memo), (c["x_q"], c["x_kv"], c["mask"]), wrt=wrt,
                            upstream=[c["d_out"], None], method="forward")
    return as_pair(tuple(grads))


def mha_grad_oracle(c):
    leaves = [t.clone().requires_grad_(True) for t in (c["x_q"], c["x_kv"]) if t is not None]
    out, _ = small_mha_oracle(c, leaves[0], leaves[1] if len(leaves) > 1 else None)
    return as_pair(torch.autograd.grad((out * c["d_out"]).sum(), leaves))


MHA_GRAD_SEARCH = Search(with_upstream(small_mha, "d_out", lambda c: c["x_q"].shape), mha_grad_student, mha_grad_oracle,
                         ("dx_q", "dx_kv"))


@pytest.mark.item("MultiHeadAttention", "values")
@smallest_case(MHA_SEARCH)
def test_mha_values(student, rng):
    for label, d, h, bias, x_q, x_kv, mask, dtype in mha_cases(rng):
        student.case(label)
        m = student_mha(student, d, h, bias, dtype)
        mha = oracle_mha(student.state(m), "", d, h, bias, dtype)
        if label.startswith("d_model 16"):
            dk = d // h
            check_close("split_heads(x)", x_q.reshape(3, 5, h, dk).transpose(1, 2),
                        student.method(m, "split_heads", x_q), atol=0, dims=HEAD_DIMS,
                        case="head i takes columns i*d_k:(i+1)*d_k")
        args = (x_q,) if x_kv is None else (x_q, x_kv)
        out, A = check_tuple("forward", 2, student.method(m, "forward", *args, mask=mask))
        with torch.no_grad():
            ref_out, ref_A = mha_oracle(mha, x_q, x_q if x_kv is None else x_kv, mask, h)
            bad_out, bad_A = mha_oracle(unscaled_mha(mha), x_q, x_q if x_kv is None else x_kv, mask, h)
        check_close("out", ref_out, out, atol=tol(student, dtype), oracle="nn.MultiheadAttention", dims=SEQ_DIMS,
                    case=label, mistakes={SCALE_MISSING: bad_out})
        check_close("A", ref_A, A, atol=tol(student, dtype), oracle="nn.MultiheadAttention's per-head weights",
                    dims=ATTN_DIMS, case=label, mistakes={SCALE_MISSING: bad_A})


@pytest.mark.item("MultiHeadAttention", "gradients")
@smallest_case(MHA_GRAD_SEARCH)
def test_mha_gradients(student, rng):
    for label, d, h, bias, x_q, x_kv, mask, dtype in list(mha_cases(rng))[:4]:
        student.case(label + ", gradients w.r.t. the inputs")
        m = student_mha(student, d, h, bias, dtype)
        mha = oracle_mha(student.state(m), "", d, h, bias, dtype)
        cross = x_kv is not None
        up = randn(rng, *x_q.shape, dtype=dtype)
        args = (x_q, x_kv, mask) if cross else (x_q, None, mask)
        (out, _), grads = student.grad(m, args, wrt=[0, 1] if cross else [0], upstream=[up, None], method="forward")
        leaves = [t.clone().requires_grad_(True) for t in ((x_q, x_kv) if cross else (x_q,))]
        ref_out, _ = mha_oracle(mha, leaves[0], leaves[-1], mask, h)
        expected = torch.autograd.grad((ref_out * up).sum(), leaves)
        for name, e, got in zip(("d x_q", "d x_kv"), expected, grads, strict=False):
            if got is None:
                raise Fail(f"no gradient reached {name[2:]} ({label})")
            check_close(name, e, got, atol=tol(student, dtype, "gradients"),
                        oracle="autograd through nn.MultiheadAttention", dims=SEQ_DIMS,
                        case=label)


# --- positional_encoding and offset_matrix ------------------------------------------------------------

@pytest.mark.item("positional_encoding", "shapes")
def test_pe_shapes(student, rng):
    """Even d_emb only, as in the lecture's code; the odd case is the properties check."""
    for args, kwargs, shape, dtype in [((50, 16), {}, (50, 16), torch.float32),
                                       ((12, 6), {"dtype": torch.float64}, (12, 6), torch.float64),
                                       ((1, 4), {}, (1, 4), torch.float32)]:
        student.case(f"positional_encoding{args}" + (", dtype=float64" if kwargs else ""))
        check_tensor("PE", torch.empty(shape, dtype=dtype), student.call("positional_encoding", *args, **kwargs))


def check_pe(student, max_len, d, dtype):
    """One table against the formula: shape and dtype, then values (float64 to 1e-9, float32 to 3e-5)."""
    label = f"positional_encoding({max_len}, {d}, dtype={dtype_name(dtype)})"
    label += " (a float64 table is computed in float64)" if dtype == torch.float64 else ""
    student.case(label + (" (odd d_emb: the last column is a sine with no partner)" if d % 2 else ""))
    got = student.call("positional_encoding", max_len, d, dtype=dtype)
    check_tensor("PE", torch.empty(max_len, d, dtype=dtype), got)
    atol = 1e-9 if dtype == torch.float64 else 3e-5
    check_close("PE", sinusoid_table(max_len, d), got, atol=atol, rtol=0, oracle="sin/cos formula in float64",
                dims=("position", "column"), case=student.label)


def pe_search(parity):
    """positional_encoding(max_len, d_emb) for max_len 1..4 and d_emb of this parity (0 even, 1 odd) up to 6."""
    def draw(d):
        return {"max_len": dim(d, 1, 4), "d_emb": 2 * dim(d, 1 - parity, 3 - parity) + parity}
    return function_search("positional_encoding", draw, sinusoid_table, ("PE",), ("max_len", "d_emb"))


@pytest.mark.item("positional_encoding", "values")
@smallest_case(pe_search(0))
def test_pe_values(student, rng):
    d_rand = 2 * randint(rng, 3, 12)
    for max_len, d, dtype in [(50, 16, torch.float32), (128, d_rand, torch.float32), (64, 32, torch.float64),
                              (20, 6, torch.float64)]:
        check_pe(student, max_len, d, dtype)


@pytest.mark.item("positional_encoding", "properties")
@smallest_case(pe_search(1))
def test_pe_odd(student, rng):
    """The edge case beyond the lecture's code: an odd d_emb has one sine column more than cosines."""
    for max_len, d, dtype in [(10, 7, torch.float32), (9, 2 * randint(rng, 2, 8) + 1, torch.float64)]:
        check_pe(student, max_len, d, dtype)


def offset_ks(rng):
    return [0, 1, randint(rng, 2, 9), randint(rng, 10, 60), -randint(rng, 1, 5)]


@pytest.mark.item("offset_matrix", "shapes")
def test_offset_shapes(student, rng):
    for k, d in [(3, 8), (1, 2), (randint(rng, 0, 20), 2 * randint(rng, 2, 10))]:
        student.case(f"offset_matrix({k}, {d})")
        check_tensor("M_k", torch.empty(d, d, dtype=torch.float64), student.call("offset_matrix", k, d))


def small_offset(draw):
    return {"k": draw(st.integers(-3, 3)), "d_emb": 2 * dim(draw, 1, 3)}


@pytest.mark.item("offset_matrix", "values")
@smallest_case(function_search("offset_matrix", small_offset, ref.offset_matrix, ("M_k",), ("k", "d_emb")))
def test_offset_values(student, rng):
    for d, k in zip([16, 8, 2 * randint(rng, 2, 12), 32, 6], offset_ks(rng), strict=True):
        label = f"offset_matrix({k}, {d})"
        student.case(label)
        M = student.call("offset_matrix", k, d)
        check_tensor("M_k", torch.empty(d, d, dtype=torch.float64), M)
        lo = max(0, -k)
        P = sinusoid_table(lo + 40 + max(k, 0), d)
        pos = torch.arange(lo, lo + 40)
        check_close("M_k @ PE[pos]", P[pos + k], P[pos] @ M.T, atol=1e-9, rtol=0, oracle="PE[pos + k]",
                    dims=("position", "column"), case=label + ", positions " + f"{lo}..{lo + 39}, float64 formula")
        check_close("M_k", ref.offset_matrix(k, d), M, atol=1e-9, rtol=0, oracle="the block rotation",
                    dims=("row", "column"), case=label)


@pytest.mark.item("offset_matrix", "properties")
def test_offset_properties(student, rng):
    """Exact rotations (absolute tolerances, as the spec says: a float32 matrix is off by ~1e-7)."""
    d = 2 * randint(rng, 3, 10)
    a, b = randint(rng, 1, 30), randint(rng, 1, 30)
    student.case(f"offset_matrix(k, {d}) for k = 0, {a}, {b}, {a + b}")
    Ma, Mb, Mab, M0 = (student.call("offset_matrix", k, d) for k in (a, b, a + b, 0))
    eye = torch.eye(d, dtype=torch.float64)
    check_close("M_0", eye, M0, atol=1e-12, rtol=0, oracle="the identity", dims=("row", "column"),
                case="a shift by 0 is the identity")
    block = torch.block_diag(*[torch.ones(2, 2, dtype=torch.bool)] * (d // 2))
    off = Ma.masked_select(~block).abs()
    check_true(bool((off <= 1e-12).all()), f"M_{a} has {off.max().item():.3g} outside its 2x2 diagonal blocks: "
                                          f"it must be block-diagonal (each sin/cos pair rotates on its own)")
    check_close(f"M_{a} M_{a}^T", eye, Ma @ Ma.T, atol=1e-12, rtol=0, oracle="the identity", dims=("row", "column"),
                case="each block is a rotation, so M_k is orthogonal")
    dets = torch.stack([torch.linalg.det(Ma[i:i + 2, i:i + 2]) for i in range(0, d, 2)])
    check_close(f"determinants of M_{a}'s 2x2 blocks", torch.ones(d // 2, dtype=torch.float64), dets, atol=1e-12,
                oracle="1", dims=("block",), case="rotations, not reflections")
    check_close(f"M_{a} @ M_{b}", Mab, Ma @ Mb, atol=1e-9, rtol=0, oracle=f"M_{a + b}", dims=("row", "column"),
                case=f"shifting by {a} then by {b} is shifting by {a + b}")


# --- causal_mask -----------------------------------------------------------------------------------

@pytest.mark.item("causal_mask", "shapes")
def test_causal_shapes(student, rng):
    for T in (1, 5, randint(rng, 6, 20)):
        student.case(f"causal_mask({T})")
        check_tensor("mask", torch.empty(T, T, dtype=torch.bool), student.call("causal_mask", T), device="cpu")
        student.case(f"causal_mask({T}, device='{student.device}')")
        check_tensor("mask", torch.empty(T, T, dtype=torch.bool), student.call("causal_mask", T, device=student.device),
                     device=student.device)


@pytest.mark.item("causal_mask", "values")
@smallest_case(function_search("causal_mask", lambda draw: {"T": dim(draw, 1, 5)}, tri, ("mask",), ("T",)))
def test_causal_values(student, rng):
    for T in (1, 2, 7, randint(rng, 8, 40)):
        student.case(f"causal_mask({T})")
        got = student.call("causal_mask", T)
        check_tensor("mask", torch.empty(T, T, dtype=torch.bool), got)
        wrong = (got != tri(T)).nonzero()
        if len(wrong):
            i, j = wrong[0].tolist()
            raise Fail(f"mask[{i}, {j}] is {bool(got[i, j])}, expected {bool(tri(T)[i, j])} (torch.triu(ones, 1): "
                       f"True = blocked, strictly above the diagonal), causal_mask({T})")


# --- FeedForward -----------------------------------------------------------------------------------

@pytest.mark.item("FeedForward", "shapes")
def test_ff_shapes(student, rng):
    student.case("FeedForward(16, 40)")
    m = student.new("FeedForward", 16, 40)
    state = student.state(m)
    for key, shape in [("lin1.weight", (40, 16)), ("lin1.bias", (40,)), ("lin2.weight", (16, 40)),
                       ("lin2.bias", (16,))]:
        check_tensor(key, torch.empty(shape), take(state, key, "FeedForward"))
    check_true(len(state) == 4, f"FeedForward(16, 40) has state {list(state)}, expected lin1 and lin2 only")
    for shape in [(2, 5, 16), (3, 2, 4, 16), (16,)]:
        student.case(f"FeedForward(16, 40) on x {shape}")
        check_tensor("y", torch.empty(shape), student.method(m, "forward", randn(rng, *shape)), device=student.device)


@pytest.mark.item("FeedForward", "values")
def test_ff_values(student, rng):
    for d, d_ff, shape in [(16, 40, (2, 5, 16)), (8, 32, (3, 2, 4, 8)), (24, 24, (6, 24))]:
        label = f"FeedForward({d}, {d_ff}), x {shape}"
        student.case(label)
        m = student.new("FeedForward", d, d_ff)
        st = student.state(m)
        x = randn(rng, *shape)
        w1, b1, w2, b2 = (take(st, k, "FeedForward") for k in ("lin1.weight", "lin1.bias", "lin2.weight", "lin2.bias"))
        expected = F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2)
        check_close("y", expected, student.method(m, "forward", x), atol=tol(student, x.dtype),
                    oracle="lin2(ReLU(lin1(x)))", dims=None, case=label)


# --- EncoderLayer ----------------------------------------------------------------------------------

def perturbed(student, remote, rng, scale=0.1, skip=()):
    """The module's state with noise added (non-trivial LayerNorms), loaded back in the same order."""
    state = student.state(remote)
    with torch.no_grad():
        for k, v in state.items():
            if v.is_floating_point() and k not in skip:
                v.add_(scale * torch.randn(v.shape, generator=rng, dtype=v.dtype))
    student.load_state(remote, list(state.values()))
    return state


def top_buffers(student, remote):
    """Names of the module's own buffers (the Transformer's fixed PE table)."""
    buffers = student.attr(remote, "_buffers")
    return set(buffers) if isinstance(buffers, dict) else set()


def copy_linear_norm(sd, state, pairs, owner):
    for ours, theirs in pairs:
        for p in ("weight", "bias"):
            sd[f"{ours}.{p}"] = take(state, f"{theirs}.{p}", owner)


def oracle_mha_into(sd, state, prefix, ours, owner):
    sd[f"{ours}.in_proj_weight"] = torch.cat([take(state, f"{prefix}W{n}.weight", owner) for n in "QKV"])
    sd[f"{ours}.in_proj_bias"] = torch.cat([take(state, f"{prefix}W{n}.bias", owner) for n in "QKV"])
    sd[f"{ours}.out_proj.weight"] = take(state, f"{prefix}WO.weight", owner)
    sd[f"{ours}.out_proj.bias"] = take(state, f"{prefix}WO.bias", owner)


def load_oracle(layer, sd, owner):
    try:
        layer.load_state_dict(sd)
    except RuntimeError as e:
        raise Fail(f"{owner}'s weights do not fit {type(layer).__name__}: {str(e).splitlines()[-1][:200]}") from e
    return layer  # left in train mode (dropout 0): PyTorch's fused eval path would zero padded rows


def oracle_encoder(state, d, h, d_ff):
    """nn.TransformerEncoderLayer (post-norm, ReLU, dropout 0) carrying the student's weights."""
    layer = nn.TransformerEncoderLayer(d, h, dim_feedforward=d_ff, dropout=0.0, batch_first=True)
    sd = {}
    oracle_mha_into(sd, state, "attn.", "self_attn", "EncoderLayer")
    copy_linear_norm(sd, state, [("linear1", "ff.lin1"), ("linear2", "ff.lin2"), ("norm1", "norm1"),
                                 ("norm2", "norm2")], "EncoderLayer")
    return load_oracle(layer, sd, "EncoderLayer")


def encoder_oracle(layer, x, mask, h):
    B, T = x.shape[:2]
    m = head_mask(mask, B, h, T, T)
    y = layer(x, src_mask=m)
    _, A = layer.self_attn(x, x, x, attn_mask=m, need_weights=True, average_attn_weights=False)
    return y, A


def encoder_cases(rng):
    yield "EncoderLayer(32, 4, 64), x (2, 7, 32), no mask", 32, 4, 64, randn(rng, 2, 7, 32), None
    yield ("EncoderLayer(16, 2, 24), x (3, 5, 16), padding mask (3, 1, 1, 5)", 16, 2, 24, randn(rng, 3, 5, 16),
           pad_mask([2, 5, 4], 5))
    yield "EncoderLayer(24, 3, 40), x (2, 6, 24), causal mask (6, 6)", 24, 3, 40, randn(rng, 2, 6, 24), tri(6)


@pytest.mark.item("EncoderLayer", "shapes")
def test_enc_shapes(student, rng):
    student.case("EncoderLayer(32, 4, 64)")
    layer = student.new("EncoderLayer", 32, 4, 64)
    for attr, kind in [("attn", "MultiHeadAttention"), ("ff", "FeedForward"), ("norm1", "LayerNorm"),
                       ("norm2", "LayerNorm")]:
        got = student.attr(layer, attr)
        check_true(isinstance(got, Remote) and got.type_name == kind, f"EncoderLayer.{attr} is {got!r}, "
                                                                      f"expected a {kind}")
    n = sum(t.numel() for t in student.state(layer).values())
    want = sum(t.numel() for t in ref.EncoderLayer(32, 4, 64).state_dict().values())
    check_true(n == want, f"EncoderLayer(32, 4, 64) has {n:,} weights, expected {want:,}")
    for shape, mask in [((2, 7, 32), None), ((3, 5, 32), pad_mask([5, 2, 3], 5))]:
        student.case(f"EncoderLayer(32, 4, 64), x {shape}" + (", padding mask" if mask is not None else ""))
        y, A = check_tuple("EncoderLayer.forward", 2, student.method(layer, "forward", randn(rng, *shape), mask=mask))
        check_tensor("y", torch.empty(shape), y, device=student.device)
        check_tensor("A", torch.empty(shape[0], 4, shape[1], shape[1]), A, device=student.device)


@pytest.mark.item("EncoderLayer", "values")
def test_enc_values(student, rng):
    for label, d, h, d_ff, x, mask in encoder_cases(rng):
        student.case(label)
        layer = student.new("EncoderLayer", d, h, d_ff)
        oracle = oracle_encoder(perturbed(student, layer, rng), d, h, d_ff)
        y, A = check_tuple("EncoderLayer.forward", 2, student.method(layer, "forward", x, mask=mask))
        with torch.no_grad():
            ref_y, ref_A = encoder_oracle(oracle, x, mask, h)
        check_close("y", ref_y, y, atol=tol(student, x.dtype) * 10,
                    oracle="nn.TransformerEncoderLayer (post-norm, ReLU)", dims=SEQ_DIMS, case=label)
        check_close("A", ref_A, A, atol=tol(student, x.dtype) * 10, oracle="the self-attention weights of x",
                    dims=ATTN_DIMS, case=label)


@pytest.mark.item("EncoderLayer", "gradients")
def test_enc_gradients(student, rng):
    for label, d, h, d_ff, x, mask in list(encoder_cases(rng))[:2]:
        student.case(label + ", gradient w.r.t. x")
        layer = student.new("EncoderLayer", d, h, d_ff)
        oracle = oracle_encoder(perturbed(student, layer, rng), d, h, d_ff)
        up = randn(rng, *x.shape)
        _, grads = student.grad(layer, (x, mask), wrt=[0], upstream=[up, None], method="forward")
        leaf = x.clone().requires_grad_(True)
        expected, = torch.autograd.grad((encoder_oracle(oracle, leaf, mask, h)[0] * up).sum(), [leaf])
        if grads[0] is None:
            raise Fail(f"no gradient reached x ({label})")
        check_close("dx", expected, grads[0], atol=tol(student, x.dtype, "gradients") * 2,
                    oracle="autograd through nn.TransformerEncoderLayer", dims=SEQ_DIMS, case=label)


# --- DecoderLayer ----------------------------------------------------------------------------------

def oracle_decoder(state, d, h, d_ff):
    """nn.TransformerDecoderLayer (post-norm, ReLU, dropout 0) carrying the student's weights."""
    layer = nn.TransformerDecoderLayer(d, h, dim_feedforward=d_ff, dropout=0.0, batch_first=True)
    sd = {}
    oracle_mha_into(sd, state, "self_attn.", "self_attn", "DecoderLayer")
    oracle_mha_into(sd, state, "cross_attn.", "multihead_attn", "DecoderLayer")
    copy_linear_norm(sd, state, [("linear1", "ff.lin1"), ("linear2", "ff.lin2"), ("norm1", "norm1"),
                                 ("norm2", "norm2"), ("norm3", "norm3")], "DecoderLayer")
    return load_oracle(layer, sd, "DecoderLayer")


def decoder_oracle(layer, y, memory, cmask, mmask, h):
    B, T, S = y.shape[0], y.shape[1], memory.shape[1]
    tm, mm = head_mask(cmask, B, h, T, T), head_mask(mmask, B, h, T, S)
    out = layer(y, memory, tgt_mask=tm, memory_mask=mm)
    a, A_self = layer.self_attn(y, y, y, attn_mask=tm, need_weights=True, average_attn_weights=False)
    y1 = layer.norm1(y + a)
    _, A_cross = layer.multihead_attn(y1, memory, memory, attn_mask=mm, need_weights=True, average_attn_weights=False)
    return out, A_self, A_cross


def decoder_cases(rng):
    yield ("DecoderLayer(32, 4, 64), y (2, 6, 32), memory (2, 9, 32), causal mask, memory padding (2, 1, 1, 9)",
           32, 4, 64, randn(rng, 2, 6, 32), randn(rng, 2, 9, 32), tri(6), pad_mask([9, 4], 9))
    yield ("DecoderLayer(16, 2, 24), y (3, 4, 16), memory (3, 7, 16), no masks",
           16, 2, 24, randn(rng, 3, 4, 16), randn(rng, 3, 7, 16), None, None)
    yield ("DecoderLayer(24, 3, 40), y (2, 5, 24), memory (2, 3, 24), causal mask, memory mask (5, 3)",
           24, 3, 40, randn(rng, 2, 5, 24), randn(rng, 2, 3, 24), tri(5), random_mask(rng, 5, 3))


@pytest.mark.item("DecoderLayer", "shapes")
def test_dec_shapes(student, rng):
    student.case("DecoderLayer(32, 4, 64)")
    layer = student.new("DecoderLayer", 32, 4, 64)
    for attr, kind in [("self_attn", "MultiHeadAttention"), ("cross_attn", "MultiHeadAttention"), ("ff", "FeedForward"),
                       ("norm1", "LayerNorm"), ("norm2", "LayerNorm"), ("norm3", "LayerNorm")]:
        got = student.attr(layer, attr)
        check_true(isinstance(got, Remote) and got.type_name == kind, f"DecoderLayer.{attr} is {got!r}, "
                                                                      f"expected a {kind}")
    n = sum(t.numel() for t in student.state(layer).values())
    want = sum(t.numel() for t in ref.DecoderLayer(32, 4, 64).state_dict().values())
    check_true(n == want, f"DecoderLayer(32, 4, 64) has {n:,} weights, expected {want:,}")
    student.case("DecoderLayer(32, 4, 64), y (2, 6, 32), memory (2, 9, 32), causal mask")
    out = check_tuple("DecoderLayer.forward", 3,
                      student.method(layer, "forward", randn(rng, 2, 6, 32), randn(rng, 2, 9, 32), causal_mask=tri(6)))
    for name, want_shape, t in zip(("y", "A_self", "A_cross"), [(2, 6, 32), (2, 4, 6, 6), (2, 4, 6, 9)], out,
                                   strict=False):
        check_tensor(name, torch.empty(want_shape), t, device=student.device)


@pytest.mark.item("DecoderLayer", "values")
def test_dec_values(student, rng):
    for label, d, h, d_ff, y, mem, cmask, mmask in decoder_cases(rng):
        student.case(label)
        layer = student.new("DecoderLayer", d, h, d_ff)
        oracle = oracle_decoder(perturbed(student, layer, rng), d, h, d_ff)
        got = check_tuple("DecoderLayer.forward", 3,
                          student.method(layer, "forward", y, mem, causal_mask=cmask, memory_mask=mmask))
        with torch.no_grad():
            expected = decoder_oracle(oracle, y, mem, cmask, mmask, h)
        for name, e, t, dims, what in zip(("y", "A_self", "A_cross"), expected, got, (SEQ_DIMS, ATTN_DIMS, ATTN_DIMS),
                                          ("nn.TransformerDecoderLayer (post-norm, ReLU)", "the self-attention weights",
                                           "the cross-attention weights (queries from LN1(y + SelfAttn))"),
                                          strict=False):
            check_close(name, e, t, atol=tol(student, y.dtype) * 10, oracle=what, dims=dims, case=label)


@pytest.mark.item("DecoderLayer", "properties")
def test_dec_properties(student, rng):
    layer = student.new("DecoderLayer", 16, 2, 32)
    perturbed(student, layer, rng)
    T, S, t0 = 7, 6, randint(rng, 2, 5)
    y, mem = randn(rng, 2, T, 16), randn(rng, 2, S, 16)
    y2 = y.clone()
    y2[:, t0:] = randn(rng, 2, T - t0, 16)
    student.case(f"DecoderLayer(16, 2, 32) with the causal mask, target positions {t0}.. changed")
    out1, A_self, _ = student.method(layer, "forward", y, mem, causal_mask=tri(T))
    out2, _, _ = student.method(layer, "forward", y2, mem, causal_mask=tri(T))
    check_close(f"y[:, :{t0}]", out1[:, :t0], out2[:, :t0], atol=1e-6 if student.device == "cpu" else 1e-5,
                oracle="y[:, :t0] before the change", dims=SEQ_DIMS,
                case=f"changing target tokens {t0}.. must leave earlier outputs untouched under the causal mask")
    check_true(not torch.allclose(out1[:, t0:], out2[:, t0:], atol=1e-4),
               f"changing target tokens {t0}.. left the outputs at {t0}.. unchanged: is y used?")
    above = A_self.masked_select(tri(T).expand_as(A_self)).abs()
    check_true(bool((above <= 1e-12).all()), f"A_self is {above.max().item():.3g} above the diagonal with the causal "
                                            f"mask, expected 0")
    student.case(f"DecoderLayer(16, 2, 32) without a causal mask, target positions {t0}.. changed")
    out3, _, _ = student.method(layer, "forward", y, mem)
    out4, _, _ = student.method(layer, "forward", y2, mem)
    check_true(not torch.allclose(out3[:, :t0], out4[:, :t0], atol=1e-4),
               "without a causal mask, earlier outputs did not change when later target tokens did: "
               "the layer must only mask when given causal_mask")
    student.case("DecoderLayer(16, 2, 32), memory padding (2, 1, 1, 6), padded memory changed")
    mmask = pad_mask([3, 5], S)
    mem2 = torch.where(mmask[:, 0, 0, :, None], randn(rng, 2, S, 16), mem)
    out5, _, A_cross = student.method(layer, "forward", y, mem, causal_mask=tri(T), memory_mask=mmask)
    out6, _, _ = student.method(layer, "forward", y, mem2, causal_mask=tri(T), memory_mask=mmask)
    check_close("y", out5, out6, atol=1e-6 if student.device == "cpu" else 1e-5, oracle="y before the change",
                dims=SEQ_DIMS, case="blocked memory positions must not matter")
    blocked = A_cross.masked_select(mmask.expand_as(A_cross)).abs()
    check_true(bool((blocked <= 1e-12).all()), f"A_cross is {blocked.max().item():.3g} at a blocked memory position, "
                                              f"expected 0")


# --- Transformer -----------------------------------------------------------------------------------

def transportable(v):
    """Whether an encoder state came back as plain tensors / containers (so it can be sent back to decode)."""
    if isinstance(v, (Opaque, Remote)):
        return False
    if isinstance(v, (tuple, list)):
        return all(transportable(x) for x in v)
    if isinstance(v, dict):
        return all(transportable(x) for x in v.values())
    return True


def matched_reference(student, model, rng, kwargs):
    """A local reference Transformer holding the student's (perturbed) parameters; the fixed PE stays its own."""
    buffers = top_buffers(student, model)
    state = perturbed(student, model, rng, scale=0.05, skip=buffers)
    theirs = [(k, v) for k, v in state.items() if k not in buffers]  # else by registration order
    reference = ref.Transformer(VOCAB, **kwargs)
    ours = list(reference.named_parameters())
    if all(name in state for name, _ in ours):  # the reference's names: map by name, whatever the order
        theirs = [(name, state[name]) for name, _ in ours]
    diff = first_difference([tuple(p.shape) for _, p in ours], [tuple(v.shape) for _, v in theirs])
    if diff is not None:
        k, want_shape, got_shape = diff
        got_k = f"'{theirs[k][0]}' of shape {got_shape}" if got_shape is not None else "nothing"
        want_k = f"'{ours[k][0]}' of shape {want_shape}" if want_shape is not None else "nothing"
        raise Fail(f"the Transformer's parameters do not line up with the reference's ({len(theirs)} tensors, expected "
                   f"{len(ours)}: src_emb, tgt_emb, encoder layers, decoder layers, out, in that order); parameter "
                   f"{k} is {got_k}, expected {want_k}")
    with torch.no_grad():
        for (_, p), (_, v) in zip(ours, theirs, strict=True):
            p.copy_(v)
    return reference


def transformer_cases(rng):
    """(label, kwargs, src, tgt_in, attribute changes)."""
    lens = torch.tensor([4, 7, 2])
    src = torch.randint(0, N_DIGITS, (3, 8), generator=rng)
    src = torch.where(torch.arange(8) < lens[:, None], src, torch.full_like(src, PAD))
    src[torch.arange(3), lens] = EOS
    tgt_in = torch.randint(0, VOCAB, (3, 6), generator=rng)
    kw = dict(d_model=32, h=4, d_ff=48, n_enc=2, n_dec=1, max_len=20, pad_id=PAD)
    yield "Transformer(13, d_model=32, h=4, d_ff=48, n_enc=2, n_dec=1, pad_id=PAD), padded src (3, 8)", kw, src, \
        tgt_in, {}
    yield "the same model with pe_scale = 0.5 and use_causal_mask = False", kw, src, tgt_in, \
        {"pe_scale": 0.5, "use_causal_mask": False}
    src = torch.randint(0, VOCAB, (2, 5), generator=rng)
    tgt_in = torch.randint(0, VOCAB, (2, 9), generator=rng)
    yield "Transformer(13, n_enc=1, n_dec=1), pad_id=None, src (2, 5), tgt_in (2, 9)", dict(n_enc=1, n_dec=1), src, \
        tgt_in, {}


@pytest.mark.item("Transformer", "shapes")
def test_tr_shapes(student, rng):
    student.case("Transformer(13, d_model=32, h=4, d_ff=48, n_enc=1, n_dec=2)")
    model = student.new("Transformer", VOCAB, d_model=32, h=4, d_ff=48, n_enc=1, n_dec=2)
    check_true(student.attr(model, "use_causal_mask") is True,
               f"use_causal_mask is {student.attr(model, 'use_causal_mask')!r} after construction, expected True")
    check_true(student.attr(model, "pe_scale") == 1.0,
               f"pe_scale is {student.attr(model, 'pe_scale')!r} after construction, expected 1.0")
    reference = ref.Transformer(VOCAB, d_model=32, h=4, d_ff=48, n_enc=1, n_dec=2)
    buffers = top_buffers(student, model)
    n = sum(v.numel() for k, v in student.state(model).items() if k not in buffers)
    want = sum(p.numel() for p in reference.parameters())
    check_true(n == want, f"the model has {n:,} trainable weights, expected {want:,} (the PE table is not trained)")
    src, tgt_in = torch.randint(0, VOCAB, (2, 5), generator=rng), torch.randint(0, VOCAB, (2, 4), generator=rng)
    student.case("forward(src (2, 5), tgt_in (2, 4))")
    check_tensor("logits", torch.empty(2, 4, VOCAB), student.method(model, "forward", src, tgt_in),
                 device=student.device)
    state = student.method(model, "encode", src)
    if transportable(state):
        student.case("decode(tgt_in (2, 4), encode(src (2, 5)))")
        check_tensor("logits", torch.empty(2, 4, VOCAB), student.method(model, "decode", tgt_in, state),
                     device=student.device)


@pytest.mark.item("Transformer", "values")
def test_tr_values(student, rng):
    model = reference = None
    for label, kw, src, tgt_in, changes in transformer_cases(rng):
        student.case(label)
        if not changes:
            model = student.new("Transformer", VOCAB, **kw)
            reference = matched_reference(student, model, rng, kw)
        for attr, value in changes.items():
            student.method(model, "__setattr__", attr, value)
            setattr(reference, attr, value)
        with torch.no_grad():
            expected = reference(src, tgt_in)
        atol = 1e-4 if student.device == "cpu" else 2e-2
        check_close("logits", expected, student.method(model, "forward", src, tgt_in), atol=atol, rtol=1e-4,
                    oracle="the reference Transformer with the same weights", dims=("batch", "position", "token"),
                    case=label)
        state = student.method(model, "encode", src)
        if transportable(state):
            check_close("decode(tgt_in, encode(src))", expected, student.method(model, "decode", tgt_in, state),
                        atol=atol, rtol=1e-4, oracle="the reference Transformer", dims=("batch", "position", "token"),
                        case=label)


# --- make_batch ------------------------------------------------------------------------------------

def check_batch(out, B, L_min, L_max):
    """The four outputs' types and shapes; returns them."""
    src, tgt_in, tgt, lens = check_tuple("make_batch", 4, out)
    check_tensor("lens", torch.empty(B), lens, dtype=False)
    check_true(not lens.is_floating_point() and lens.dtype != torch.bool,
               f"'lens' has dtype {dtype_name(lens.dtype)}, expected an integer dtype")
    T = int(lens.max()) + 1
    for name, t in (("src", src), ("tgt_in", tgt_in), ("tgt", tgt)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[0] != B or t.shape[1] not in (T, L_max + 1):
            got = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else repr(t)
            raise Fail(f"'{name}' has {got}, expected ({B}, {T}): the longest row's digits and its EOS")
        check_tensor(name, torch.empty(t.shape, dtype=torch.long), t)
    return src, tgt_in, tgt, lens


@pytest.mark.item("make_batch", "shapes")
def test_batch_shapes(student, rng):
    for B, L_min, L_max in [(16, 3, 10), (1, 5, 5), (7, 1, 4)]:
        student.case(f"make_batch({B}, {L_min}, {L_max}, gen)")
        check_batch(student.call("make_batch", B, L_min, L_max, Seeded(randint(rng, 0, 10**6))), B, L_min, L_max)


def row_problem(b, L, src, tgt_in, tgt):
    """What is wrong with row b of length L (empty when nothing)."""
    T = src.shape[1]
    digits = src[b, :L]
    if not bool(((digits >= 0) & (digits < N_DIGITS)).all()):
        return f"src[{b}, :{L}] = {digits.tolist()} must be digits 0-9"
    want_src = torch.cat([digits, torch.tensor([EOS]), torch.full((T - L - 1,), PAD)])
    want_tgt = torch.cat([digits.flip(0), torch.tensor([EOS]), torch.full((T - L - 1,), PAD)])
    want_in = torch.cat([torch.tensor([BOS]), want_tgt[:L], torch.full((T - L - 1,), PAD)])
    for name, want, got in (("src", want_src, src[b]), ("tgt", want_tgt, tgt[b]), ("tgt_in", want_in, tgt_in[b])):
        if not torch.equal(want, got):
            k, want_k, got_k = first_difference(want.tolist(), got.tolist())
            return (f"row {b} (length {L}): {name}[{b}, {k}] is {got_k}, expected {want_k} (the row is "
                    f"{got.tolist()}, expected {want.tolist()}; BOS {BOS}, EOS {EOS}, PAD {PAD})")
    return ""


@pytest.mark.item("make_batch", "properties")
def test_batch_properties(student, rng):
    seed = randint(rng, 0, 10**6)
    B, L_min, L_max = 600, 3, 10
    student.case(f"make_batch({B}, {L_min}, {L_max}, Generator seeded {seed})")
    src, tgt_in, tgt, lens = check_batch(student.call("make_batch", B, L_min, L_max, Seeded(seed)), B, L_min, L_max)
    check_true(int(lens.min()) >= L_min and int(lens.max()) <= L_max,
               f"lens range over {int(lens.min())}..{int(lens.max())}, expected within {L_min}..{L_max}")
    missing = sorted(set(range(L_min, L_max + 1)) - set(lens.tolist()))
    check_true(not missing, f"in {B} rows no sequence has length {missing}: lengths are uniform on "
                            f"{L_min}..{L_max}, both ends included")
    for b in range(B):
        problem = row_problem(b, int(lens[b]), src, tgt_in, tgt)
        if problem:
            raise Fail(problem + f", {student.label}")
    digits = src[src < N_DIGITS]
    counts = torch.bincount(digits, minlength=N_DIGITS).double() / digits.numel()
    check_true(bool((counts - 0.1).abs().max() < 0.03), f"digit frequencies {[round(c, 3) for c in counts.tolist()]}, "
                                                      f"expected about 0.1 each (uniform digits)")
    student.case("make_batch(8, 6, 6, gen): every row of length 6")
    src6, tgt_in6, tgt6, lens6 = check_batch(student.call("make_batch", 8, 6, 6, Seeded(seed + 1)), 8, 6, 6)
    check_true(bool((lens6 == 6).all()), f"lens is {lens6.tolist()} with L_min = L_max = 6")
    for b in range(8):
        problem = row_problem(b, 6, src6, tgt_in6, tgt6)
        check_true(not problem, problem + f", {student.label}")
    student.case(f"make_batch({B}, {L_min}, {L_max}, gen) twice with the same seed {seed}, global RNG state changed")
    student.seed += 1
    again = student.call("make_batch", B, L_min, L_max, Seeded(seed))
    check_true(all(torch.equal(a, b) for a, b in zip((src, tgt_in, tgt, lens), again, strict=False)),
               "the same generator seed gave a different batch: draw every random number from `gen`, "
               "not from the global RNG")
    other = student.call("make_batch", B, L_min, L_max, Seeded(seed + 7))
    check_true(not all(torch.equal(a, b) for a, b in zip((src, lens), other[::3], strict=False)),
               f"generators seeded {seed} and {seed + 7} gave the same batch")


# --- greedy_decode ---------------------------------------------------------------------------------

def greedy_loop(student, model, src, n, by_decode=False):
    """The greedy loop driven from here through the student's own model (forward, or encode once then decode)."""
    state = student.method(model, "encode", src) if by_decode else None
    ys = torch.full((src.shape[0], 1), BOS, dtype=torch.long)
    for _ in range(n):
        logits = student.method(model, "decode", ys, state) if by_decode else student.method(model, "forward", src, ys)
        ys = torch.cat([ys, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ys[:, 1:]


def check_greedy(student, model, src, got, n, label):
    """got must be the greedy tokens of this model. A causal decoder scores every prefix in one teacher-forced
    pass, so one forward call confirms a right answer; a mismatch is confirmed step by step before it fails."""
    ys = torch.cat([torch.full((src.shape[0], 1), BOS, dtype=torch.long), got[:, :-1]], dim=1)
    if torch.equal(student.method(model, "forward", src, ys).argmax(-1), got):
        return
    runs = [greedy_loop(student, model, src, n)]
    if torch.equal(got, runs[0]):
        return
    if transportable(student.method(model, "encode", src)):
        runs.append(greedy_loop(student, model, src, n, by_decode=True))
        if torch.equal(got, runs[1]):
            return
    r = runs[0]
    b, t = (got != r).nonzero()[0].tolist()
    raise Fail(f"token {t} of row {b} is {int(got[b, t])}, expected {int(r[b, t])}: the argmax of the last "
               f"position's logits given BOS and the tokens chosen so far; expected row {r[b].tolist()}, "
               f"got {got[b].tolist()} ({label})")


def greedy_model(student, rng):
    """The student's Transformer (the model greedy_decode is handed) with large random weights: varied argmaxes."""
    kw = dict(d_model=32, h=4, d_ff=64, n_enc=1, n_dec=1, max_len=32)
    model = student.new("Transformer", VOCAB, **kw)
    perturbed(student, model, rng, scale=0.5)
    return model


def random_src(rng, B, L_min, L_max):
    lens = torch.randint(L_min, L_max + 1, (B,), generator=rng)
    T = int(lens.max()) + 1
    src = torch.randint(0, N_DIGITS, (B, T), generator=rng)
    src = torch.where(torch.arange(T) < lens[:, None], src, torch.full_like(src, PAD))
    src[torch.arange(B), lens] = EOS
    return src


@pytest.mark.item("greedy_decode", "shapes")
def test_greedy_shapes(student, rng):
    model = greedy_model(student, rng)
    for B, n in [(3, 5), (1, 1)]:
        student.case(f"greedy_decode(model, src ({B}, T), {n})")
        got = student.call("greedy_decode", model, random_src(rng, B, 2, 6), n)
        check_tensor("tokens", torch.empty(B, n, dtype=torch.long), got, device=student.device)


@pytest.mark.item("greedy_decode", "values")
def test_greedy_values(student, rng):
    model = greedy_model(student, rng)
    for B, n, L_min, L_max in [(5, 7, 3, 7), (2, 1, 2, 4), (4, 11, 5, 10)]:
        src = random_src(rng, B, L_min, L_max)
        label = f"greedy_decode(model, src {tuple(src.shape)}, {n}), a transformer with random weights"
        student.case(label)
        got = student.call("greedy_decode", model, src, n)
        check_tensor("tokens", torch.empty(B, n, dtype=torch.long), got)
        check_greedy(student, model, src, got, n, label)


# --- mha_cost --------------------------------------------------------------------------------------

def cost_oracle(d, h, d_k, T):
    return torch.tensor(3 * d * h * d_k + h * d_k * d), torch.tensor(h * T * T * d_k)


def small_cost(draw):
    return {"d_model": dim(draw, 1, 4), "h": dim(draw, 1, 3), "d_k": dim(draw, 1, 3), "T": dim(draw, 1, 3)}


@pytest.mark.item("mha_cost", "values")
@smallest_case(function_search("mha_cost", small_cost, cost_oracle, ("params", "score_flops"),
                               ("d_model", "h", "d_k", "T")))
def test_cost_values(student, rng):
    cases = [(512, 8, 64, 100)] + [
        (randint(rng, 8, 256), randint(rng, 1, 16), randint(rng, 2, 64), randint(rng, 1, 300)) for _ in range(4)]
    for d, h, d_k, T in cases:
        student.case(f"mha_cost({d}, {h}, {d_k}, {T})")
        params, flops = check_tuple("mha_cost", 2, student.call("mha_cost", d, h, d_k, T))
        check_number("params", 3 * d * h * d_k + h * d_k * d, params, tol=0)
        check_number("score_flops", h * T * T * d_k, flops, tol=0)
