"""Hidden checks for Lab 14: attention and transformers (mask convention: 1/True = may attend).

Oracles: F.scaled_dot_product_attention, nn.MultiheadAttention, the sinusoid formula in float64,
nn.TransformerEncoderLayer carrying the student's weights, and the reference classifier. PYTEST_DONT_REWRITE
"""
import pytest
import torch
import torch.nn as nn

from autograder.grading.suite_api import (
    SCALE_MISSING,
    Fail,
    Fresh,
    Remote,
    Search,
    attention_case,
    attention_oracle,
    check_close,
    check_tensor,
    check_true,
    check_tuple,
    copy_state,
    dim,
    function_search,
    gradient_search,
    int_seed,
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

ref = reference("lab14_transformers")

HEAD_DIMS = ("batch", "head", "query", "col")


# --- scaled_dot_product_attention ---------------------------------------------------------------

def attention_cases(rng):
    """(label, Q, K, V, mask) covering batch and head dims, T_q != T_k, d_v != d_k, masks, float64."""
    Q, K, V = randn(rng, 2, 3, 5, 8), randn(rng, 2, 3, 7, 8), randn(rng, 2, 3, 7, 6)
    yield "plain, Q (2, 3, 5, 8), K (2, 3, 7, 8), V (2, 3, 7, 6)", Q, K, V, None
    Q, K, V = randn(rng, 2, 6, 4), randn(rng, 2, 6, 4), randn(rng, 2, 6, 4)
    yield "causal mask (lower-triangular True = may attend)", Q, K, V, torch.ones(6, 6, dtype=torch.bool).tril()
    lengths = torch.tensor([3, 7])
    pad = (torch.arange(7)[None, :] < lengths[:, None])[:, None, None, :]  # (2, 1, 1, 7)
    Q, K, V = randn(rng, 2, 2, 4, 5), randn(rng, 2, 2, 7, 5), randn(rng, 2, 2, 7, 3)
    yield "padding mask (keys 3.. of batch 0 blocked)", Q, K, V, pad
    Q, K, V = (randn(rng, 3, 5, 4, dtype=torch.float64) for _ in range(3))
    yield "float64, 0/1 integer causal mask", Q, K, V, torch.ones(5, 5, dtype=torch.long).tril()
    Q, K, V = randn(rng, 9, 16) * 3, randn(rng, 11, 16) * 3, randn(rng, 11, 16)
    yield "unbatched (9, 16) x (11, 16), large scores", Q, K, V, None
    # (the query with no open key is an edge case beyond the lecture's -inf recipe: its own point, properties)


@pytest.mark.item("scaled_dot_product_attention", "shapes")
def test_sdpa_shapes(student, rng):
    for label, Q, K, V, mask in list(attention_cases(rng))[:4]:
        student.case(label)
        out, w = check_tuple("scaled_dot_product_attention", 2,
                             student.call("scaled_dot_product_attention", Q, K, V, mask=mask))
        ref_out, ref_w = attention_oracle(Q, K, V, mask)
        check_tensor("out", ref_out, out, device=student.device)
        check_tensor("weights", ref_w, w, device=student.device)


def small_attention(draw):
    return attention_case(draw, open_value=True)


SDPA_GRAD_SEARCH = gradient_search(
    "scaled_dot_product_attention", with_upstream(small_attention, "d_out", lambda c: (*c["Q"].shape[:-1], c["d_v"])),
    attention_oracle, ("Q", "K", "V", "mask"), ("Q", "K", "V"), ("d_out", None))


@pytest.mark.item("scaled_dot_product_attention", "values")
@smallest_case(function_search("scaled_dot_product_attention", small_attention, attention_oracle, ("out", "weights"),
                               ("Q", "K", "V"), ("mask",)))
def test_sdpa_values(student, rng):
    for label, Q, K, V, mask in attention_cases(rng):
        student.case(label)
        out, w = check_tuple("scaled_dot_product_attention", 2,
                             student.call("scaled_dot_product_attention", Q, K, V, mask=mask))
        ref_out, ref_w = attention_oracle(Q, K, V, mask)
        bad_out, bad_w = attention_oracle(unscaled(Q), K, V, mask)
        dims = HEAD_DIMS[-Q.dim():]
        check_close("out", ref_out, out, atol=tol(student, Q.dtype), oracle="F.scaled_dot_product_attention",
                    dims=dims, case=label, mistakes={SCALE_MISSING: bad_out})
        check_close("weights", ref_w, w, atol=tol(student, Q.dtype), oracle="softmax(Q K^T / sqrt(d_k))",
                    dims=dims[:-1] + ("key",), case=label, mistakes={SCALE_MISSING: bad_w})


@pytest.mark.item("scaled_dot_product_attention", "gradients")
@smallest_case(SDPA_GRAD_SEARCH)
def test_sdpa_gradients(student, rng):
    for label, Q, K, V, mask in list(attention_cases(rng))[:3]:
        student.case(label + ", gradients w.r.t. Q, K, V")
        up = randn(rng, *Q.shape[:-1], V.shape[-1])
        (out, _), grads = student.grad("scaled_dot_product_attention", (Q, K, V, mask), wrt=[0, 1, 2],
                                       upstream=[up, None])
        leaves = [t.clone().requires_grad_(True) for t in (Q, K, V)]
        expected = torch.autograd.grad((attention_oracle(*leaves, mask)[0] * up).sum(), leaves)
        for name, e, got in zip(("dQ", "dK", "dV"), expected, grads, strict=False):
            if got is None:
                raise Fail(f"no gradient reached {name[1]} ({label})")
            check_close(name, e, got, atol=1e-4, oracle="autograd through F.scaled_dot_product_attention",
                        dims=HEAD_DIMS[-Q.dim():], case=label)


@pytest.mark.item("scaled_dot_product_attention", "properties")
def test_sdpa_no_open_key(student, rng):
    """The all-blocked row: beyond the lecture's -inf recipe (which gives 0/0 = NaN there), so a point of its own."""
    Q, K, V = randn(rng, 2, 4, 6), randn(rng, 2, 5, 6), randn(rng, 2, 5, 3)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[2] = False
    student.case("query 2 may attend to no key (its mask row all 0): zero weights and a zero output, not NaN")
    out, w = check_tuple("scaled_dot_product_attention", 2,
                         student.call("scaled_dot_product_attention", Q, K, V, mask=mask))
    ref_out, ref_w = attention_oracle(Q, K, V, mask)
    check_close("weights[:, 2], the query with no open key", ref_w[:, 2], w[:, 2], atol=1e-6, oracle="zeros",
                dims=("batch", "key"), case=student.label)
    check_close("out[:, 2], the query with no open key", ref_out[:, 2], out[:, 2], atol=1e-6, oracle="zeros",
                dims=("batch", "col"), case=student.label)


# --- manual_multihead -----------------------------------------------------------------------------

def fresh_mha(rng, E, H, bias=True):
    """A randomly initialised nn.MultiheadAttention here, and the same one built in the student's process."""
    torch.manual_seed(int_seed(rng))
    mha = nn.MultiheadAttention(E, H, bias=bias, batch_first=True)
    with torch.no_grad():  # non-zero biases, so a forgotten bias shows
        for p in mha.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=rng))
    remote = Fresh("MultiheadAttention", E, H, bias=bias, batch_first=True,
                   state=list(mha.state_dict().values()))
    return mha, remote


@pytest.mark.item("manual_multihead", "shapes")
def test_mh_shapes(student, rng):
    mha, remote = fresh_mha(rng, 16, 4)
    x = randn(rng, 3, 5, 16)
    student.case("x (3, 5, 16), 4 heads")
    out, w = check_tuple("manual_multihead", 2, student.call("manual_multihead", x, remote))
    check_tensor("out", torch.empty(3, 5, 16), out, device=student.device)
    check_tensor("weights", torch.empty(3, 4, 5, 5), w, device=student.device)


def small_mha(draw):
    """nn.MultiheadAttention(E = heads * D, heads, bias, batch_first=True) with weights of -1, 0, 1; x (B, S, E)."""
    case = {"heads": dim(draw, 1, 2), "D": dim(draw, 1, 2), "B": dim(draw, 1, 2), "S": dim(draw, 1, 2)}
    E = case["E"] = case["heads"] * case["D"]
    case["bias"] = draw(st.booleans())
    case["in_proj_weight"] = ints(draw, 3 * E, E, lo=-1, hi=1)
    if case["bias"]:
        case["in_proj_bias"] = ints(draw, 3 * E, lo=-1, hi=1)
    case["out_proj.weight"] = ints(draw, E, E, lo=-1, hi=1)
    if case["bias"]:
        case["out_proj.bias"] = ints(draw, E, lo=-1, hi=1)
    case["x"] = ints(draw, case["B"], case["S"], E)
    return case


def small_mha_module(case):
    """The case's nn.MultiheadAttention here (dropout 0), and its state in state_dict order."""
    mha = nn.MultiheadAttention(case["E"], case["heads"], bias=case["bias"], batch_first=True)
    state = [case[k] for k in mha.state_dict()]
    with torch.no_grad():
        for t, v in zip(mha.state_dict().values(), state, strict=True):
            t.copy_(v)
    return mha, state


def small_mha_student(student, case, memo):
    mha, state = small_mha_module(case)
    remote = Fresh("MultiheadAttention", case["E"], case["heads"], bias=case["bias"], batch_first=True, state=state)
    return student.call("manual_multihead", case["x"], remote)


def small_mha_oracle(case):
    mha, _ = small_mha_module(case)
    with torch.no_grad():
        return mha(case["x"], case["x"], case["x"], average_attn_weights=False)


@pytest.mark.item("manual_multihead", "values")
@smallest_case(Search(small_mha, small_mha_student, small_mha_oracle, ("out", "weights")))
def test_mh_values(student, rng):
    for E, H, B, S, bias in [(16, 4, 3, 5, True), (24, 3, 2, 7, False), (8, 1, 1, 4, True), (32, 8, 2, 6, True)]:
        label = f"E {E}, {H} heads, x ({B}, {S}, {E}), bias={bias}"
        student.case(label)
        mha, remote = fresh_mha(rng, E, H, bias)
        x = randn(rng, B, S, E)
        out, w = check_tuple("manual_multihead", 2, student.call("manual_multihead", x, remote))
        with torch.no_grad():
            ref_out, ref_w = mha(x, x, x, average_attn_weights=False)
            bad_out, bad_w = unscaled_mha(mha)(x, x, x, average_attn_weights=False)
        check_close("out", ref_out, out, atol=tol(student, x.dtype), oracle="nn.MultiheadAttention",
                    dims=("batch", "position", "col"), case=label, mistakes={SCALE_MISSING: bad_out})
        check_close("weights", ref_w, w, atol=tol(student, x.dtype), oracle="nn.MultiheadAttention's weights",
                    dims=HEAD_DIMS[:3] + ("key",), case=label, mistakes={SCALE_MISSING: bad_w})


# --- PositionalEncoding ---------------------------------------------------------------------------

@pytest.mark.item("PositionalEncoding", "shapes")
def test_pe_shapes(student, rng):
    student.case("PositionalEncoding(16, max_len=50)")
    pe = student.new("PositionalEncoding", 16, max_len=50)
    table = student.attr(pe, "pe")
    check_tensor("pe", torch.empty(1, 50, 16), table, dtype=False, device=student.device)
    x = randn(rng, 4, 9, 16)
    check_tensor("forward(x)", x, student.method(pe, "forward", x), device=student.device)


def small_pe(draw):
    """PositionalEncoding(d_model in 2, 4, 6, max_len 1..4) and x (1, S, d_model) of small integers, S <= max_len."""
    case = {"d_model": 2 * dim(draw), "max_len": dim(draw, 1, 4)}
    case["S"] = dim(draw, 1, case["max_len"])
    case["x"] = ints(draw, 1, case["S"], case["d_model"])
    return case


def small_pe_student(student, case, memo):
    key = (case["d_model"], case["max_len"])
    if key not in memo:
        memo[key] = student.new("PositionalEncoding", key[0], max_len=key[1])
    return student.attr(memo[key], "pe"), student.method(memo[key], "forward", case["x"])


def small_pe_oracle(case):
    table = sinusoid_table(case["max_len"], case["d_model"])[None]  # (1, max_len, d_model)
    return table, case["x"] + table[:, :case["S"]].float()


@pytest.mark.item("PositionalEncoding", "values")
@smallest_case(Search(small_pe, small_pe_student, small_pe_oracle, ("pe", "forward(x)")))
def test_pe_values(student, rng):
    for d, max_len, S in [(16, 50, 9), (32, 512, 61), (6, 20, 20)]:
        label = f"PositionalEncoding({d}, max_len={max_len}), x (2, {S}, {d})"
        student.case(label)
        pe = student.new("PositionalEncoding", d, max_len=max_len)
        table = student.attr(pe, "pe")
        check_close("pe", sinusoid_table(max_len, d)[None], table, atol=1e-4, oracle="sin/cos formula (float64)",
                    dims=("", "position", "column"), case=label)
        x = randn(rng, 2, S, d)
        check_close("forward(x)", x + sinusoid_table(max_len, d)[None, :S].float(), student.method(pe, "forward", x),
                    atol=1e-4, oracle="x + PE[:S]", dims=("batch", "position", "column"), case=label)


@pytest.mark.item("PositionalEncoding", "properties")
def test_pe_properties(student, rng):
    student.case("PositionalEncoding(16)")
    pe = student.new("PositionalEncoding", 16)
    buffers, params = student.attr(pe, "_buffers"), student.attr(pe, "_parameters")
    check_true(isinstance(buffers, dict) and "pe" in buffers,
               "'pe' is not a registered buffer (use self.register_buffer('pe', ...)), so it would not move "
               "with .to(device) or be saved with the model")
    check_true(isinstance(params, dict) and not params,
               f"PositionalEncoding has parameters {sorted(params) if isinstance(params, dict) else params}; "
               f"the encoding is fixed, not learned")
    table = buffers["pe"][0].double()
    pair_norms = table[:, 0::2] ** 2 + table[:, 1::2] ** 2
    check_close("sin^2 + cos^2 of each column pair", torch.ones_like(pair_norms), pair_norms, atol=1e-5)


# --- EncoderBlock ---------------------------------------------------------------------------------

def oracle_layer(state, d, h, ff):
    """nn.TransformerEncoderLayer (pre-norm, GELU, no dropout) carrying the student's weights."""
    layer = nn.TransformerEncoderLayer(d, h, dim_feedforward=ff, dropout=0.0, activation="gelu",
                                       norm_first=True, batch_first=True)
    linears = [k for k in state if k.startswith("ff.")]
    if len(linears) != 4:
        raise Fail(f"'ff' has parameters {linears}, expected two nn.Linear layers (weight and bias each)")
    mapping = {"self_attn." + k[5:]: v for k, v in state.items() if k.startswith("attn.")}
    mapping.update({k: v for k, v in state.items() if k.startswith(("norm1.", "norm2."))})
    mapping.update(dict(zip(["linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"],
                            [state[k] for k in linears], strict=True)))
    missing = set(layer.state_dict()) - set(mapping)
    if missing:
        raise Fail(f"EncoderBlock's state has no counterpart for {sorted(missing)} of nn.TransformerEncoderLayer "
                   f"(attributes attn, norm1, norm2, ff as in the spec)")
    try:
        layer.load_state_dict(mapping)
    except RuntimeError as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        first = next((line for line in lines if line.startswith("size mismatch")), lines[-1])  # one, not all
        raise Fail(f"EncoderBlock's weights do not fit nn.TransformerEncoderLayer: {first[:200]}") from e
    return layer.eval()


@pytest.mark.item("EncoderBlock", "shapes")
def test_block_shapes(student, rng):
    student.case("EncoderBlock(32, 4)")
    block = student.new("EncoderBlock", 32, 4)
    for attr, kind in [("attn", "MultiheadAttention"), ("norm1", "LayerNorm"), ("norm2", "LayerNorm"),
                       ("dropout", "Dropout")]:
        got = student.attr(block, attr)
        check_true(isinstance(got, Remote) and got.type_name == kind,
                   f"EncoderBlock.{attr} is {got!r}, expected an nn.{kind}")
    n = sum(t.numel() for t in student.state(block).values())
    check_true(n == 12704, f"EncoderBlock(32, 4) has {n} parameters, expected 12,704")
    student.method(block, "eval")
    x = randn(rng, 2, 7, 32)
    y, w = check_tuple("EncoderBlock.forward", 2, student.method(block, "forward", x, need_weights=True))
    check_tensor("y", x, y, device=student.device)
    check_tensor("weights", torch.empty(2, 4, 7, 7), w, device=student.device)
    _, none = student.method(block, "forward", x)
    check_true(none is None, f"forward(x) without need_weights returned {none!r} as weights, expected None")


@pytest.mark.item("EncoderBlock", "values")
def test_block_values(student, rng):
    for d, h, ff, B, S in [(32, 4, None, 2, 7), (16, 2, 24, 3, 5)]:
        label = f"EncoderBlock({d}, {h}, ff_dim={ff}, dropout=0), x ({B}, {S}, {d})"
        student.case(label)
        block = student.new("EncoderBlock", d, h, ff_dim=ff, dropout=0.0)
        state = student.state(block)
        with torch.no_grad():  # non-trivial LayerNorm affine parameters, so swapped norms show
            for _k, v in state.items():
                v.add_(0.1 * torch.randn(v.shape, generator=rng))
        student.load_state(block, list(state.values()))
        layer = oracle_layer(state, d, h, ff or 4 * d)
        x = randn(rng, B, S, d)
        y, w = check_tuple("EncoderBlock.forward", 2, student.method(block, "forward", x, need_weights=True))
        with torch.no_grad():
            expected = layer(x)
            hx = layer.norm1(x)
            _, ref_w = layer.self_attn(hx, hx, hx, average_attn_weights=False)
        check_close("y", expected, y, atol=tol(student, x.dtype) * 10,
                    oracle="nn.TransformerEncoderLayer(norm_first=True)", dims=("batch", "position", "col"), case=label)
        check_close("weights", ref_w, w, atol=tol(student, x.dtype) * 10, oracle="the attention weights of LN1(x)",
                    dims=HEAD_DIMS[:3] + ("key",), case=label)


@pytest.mark.item("EncoderBlock", "properties")
def test_block_properties(student, rng):
    student.case("EncoderBlock(24, 3) with default ff_dim")
    state = student.state(student.new("EncoderBlock", 24, 3))
    widths = [tuple(v.shape) for k, v in state.items() if k.startswith("ff.") and v.dim() == 2]
    check_true(widths[:1] == [(96, 24)], f"ff's first layer has weight shape {widths[:1]}, expected (96, 24): "
                                         f"ff_dim defaults to 4 * d_model")
    student.case("EncoderBlock(16, 2, dropout=0.5) in train mode")
    block = student.new("EncoderBlock", 16, 2, dropout=0.5)
    x = randn(rng, 2, 5, 16)
    y1, _ = student.method(block, "forward", x)
    student.seed += 1
    y2, _ = student.method(block, "forward", x)
    check_true(not torch.allclose(y1, y2), "with dropout 0.5 in train mode two forward passes gave the same output: "
                                           "is dropout applied?")
    student.case("EncoderBlock(16, 2, dropout=0.5) in eval mode")
    student.method(block, "eval")
    y3, _ = student.method(block, "forward", x)
    student.seed += 1
    y4, _ = student.method(block, "forward", x)
    check_close("eval-mode output, second pass", y3, y4, atol=1e-6, case="dropout must be off in eval mode")


# --- make_memory_dataset --------------------------------------------------------------------------

@pytest.mark.item("make_memory_dataset", "shapes")
def test_memory_shapes(student, rng):
    student.case("make_memory_dataset(50, 12, seed=3)")
    X, y = check_tuple("make_memory_dataset", 2, student.call("make_memory_dataset", 50, 12, seed=3))
    check_tensor("X", torch.empty(50, 12, 1), X)
    check_tensor("y", torch.empty(50, 1), y)


@pytest.mark.item("make_memory_dataset", "properties")
def test_memory_properties(student, rng):
    seed = int_seed(rng) % 10000
    student.case(f"make_memory_dataset(2000, 30, seed={seed})")
    X, y = student.call("make_memory_dataset", 2000, 30, seed=seed)
    marker = X[:, 0, 0]
    check_true(bool(((marker == 1) | (marker == -1)).all()), "X[:, 0, 0] must be the +-1 marker")
    check_true(torch.equal(y[:, 0].float(), (marker > 0).float()), "y must be 1 exactly where the marker is +1")
    check_true(bool((X.abs() <= 1).all()), f"X has values outside [-1, 1] (max |X| = {X.abs().max():.3g})")
    rest = X[:, 1:, 0]
    check_true(abs(rest.mean()) < 0.05 and abs(rest.var() - 1 / 3) < 0.03,
               f"positions 1.. have mean {rest.mean():.3f} and variance {rest.var():.3f}; "
               f"uniform on [-1, 1] has 0 and 1/3")
    frac = y.float().mean().item()
    check_true(0.42 < frac < 0.58, f"{frac:.1%} of labels are 1; the two classes should be about equally likely")
    X2, y2 = student.call("make_memory_dataset", 2000, 30, seed=seed)
    check_true(torch.equal(X, X2) and torch.equal(y, y2), "the same seed gave different data")
    X3, _ = student.call("make_memory_dataset", 2000, 30, seed=seed + 1)
    check_true(not torch.equal(X, X3), "different seeds gave the same data")


# --- TransformerClassifier ------------------------------------------------------------------------

@pytest.mark.item("TransformerClassifier", "shapes")
def test_clf_shapes(student, rng):
    student.case("TransformerClassifier() with defaults")
    model = student.new("TransformerClassifier")
    n = sum(t.numel() for t in student.state(model).values() if t.dtype.is_floating_point) - 61 * 32  # PE is a buffer
    check_true(n == 25601, f"TransformerClassifier() has {n} parameters, expected 25,601")
    student.method(model, "eval")
    x = randn(rng, 3, 60, 1)
    logits, attns = check_tuple("forward(x, return_attn=True)", 2,
                                student.method(model, "forward", x, return_attn=True))
    check_tensor("logits", torch.empty(3, 1), logits, device=student.device)
    check_true(isinstance(attns, list) and len(attns) == 2, f"return_attn gave {type(attns).__name__} of "
               f"{len(attns) if isinstance(attns, (list, tuple)) else '?'} items, expected a list of 2 (one per layer)")
    for k, a in enumerate(attns):
        check_tensor(f"attention of layer {k}", torch.empty(3, 4, 61, 61), a)
    check_tensor("forward(x)", torch.empty(3, 1), student.method(model, "forward", x))


@pytest.mark.item("TransformerClassifier", "values")
def test_clf_values(student, rng):
    # the last case keeps the default dropout 0.1: in eval mode it must be off, as the notebook's public check says
    for kwargs, S in [({"dropout": 0.0}, 60), ({"dropout": 0.0, "d_model": 16, "num_heads": 2, "num_layers": 3,
                                                "max_len": 21}, 20), ({}, 30)]:
        label = (f"TransformerClassifier({', '.join(f'{k}={v}' for k, v in kwargs.items())}), eval mode, "
                 f"x (4, {S}, 1)")
        student.case(label)
        model = student.new("TransformerClassifier", **kwargs)
        student.method(model, "eval")
        reference = ref.TransformerClassifier(**kwargs).eval()
        copy_state("the model", student.state(model).values(), reference,
                   "input_proj, cls_token, pos_enc, blocks, norm, head")
        x = randn(rng, 4, S, 1)
        with torch.no_grad():
            expected = reference(x)
        check_close("logits", expected, student.method(model, "forward", x), atol=1e-4, oracle="the reference model",
                    dims=("batch", ""), case=label)
