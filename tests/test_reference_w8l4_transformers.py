"""Reference tests for w8l4_transformers: every graded item against its oracle, the lecture's facts, the experiments.

Run: PYTHONPATH=. pytest -s tests/test_reference_w8l4_transformers.py        (add -m "not experiment" to skip training)
Tolerances are stated per test: float64 comparisons are held to ~1e-10, float32 ones to ~1e-5.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from solutions import w8l4_transformers as S

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-9)}
GRAD_TOL = {torch.float32: dict(atol=1e-4, rtol=1e-3), torch.float64: dict(atol=1e-9, rtol=1e-8)}


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, dtype=torch.float64, g=None, requires_grad=False):
    x = torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
    return x.requires_grad_(requires_grad)


def pad_mask(lens, T):
    """(B,) lengths -> (B, T) bool, True at padded positions (the blocked keys)."""
    return torch.arange(T)[None, :] >= torch.as_tensor(lens)[:, None]


def assert_grads_close(outs_a, inputs_a, outs_b, inputs_b, seed, tol):
    """The same random upstream gradient through both graphs gives the same input gradients."""
    g = gen(seed)
    ups = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype) for o in outs_a]
    ga = torch.autograd.grad(outs_a, inputs_a, ups, retain_graph=True)
    gb = torch.autograd.grad(outs_b, inputs_b, ups, retain_graph=True)
    for a, b in zip(ga, gb, strict=True):
        torch.testing.assert_close(a, b, **tol)


# ----------------------------------------------------------------------------------------------- attention
def sdpa(Q, K, V, mask=None):
    """F.scaled_dot_product_attention with our mask convention (True = blocked); A from V = identity."""
    attn_mask = None if mask is None else ~mask  # SDPA's bool mask is True = may attend
    Z = F.scaled_dot_product_attention(Q, K, V, attn_mask=attn_mask)
    eye = torch.eye(K.shape[-2], dtype=K.dtype).expand(*K.shape[:-1], K.shape[-2])
    A = F.scaled_dot_product_attention(Q, K, eye, attn_mask=attn_mask)
    return Z, A


ATTN_CASES = [  # (batch dims, T_q, T_k, d_k, d_v, mask kind)
    ((), 5, 5, 8, 8, None),
    ((3,), 4, 7, 16, 5, None),
    ((2, 3), 6, 6, 8, 8, "causal"),
    ((2, 4), 9, 9, 4, 12, "causal"),
    ((3, 2), 5, 7, 8, 8, "padding"),
    ((2, 1, 3), 6, 6, 16, 16, "padding"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(ATTN_CASES)))
def test_attention_matches_sdpa_values_and_gradients(case, dtype):
    """Z and A against SDPA (plain, causal, padding), then gradients w.r.t. Q, K, V. Tolerance: TOL / GRAD_TOL."""
    batch, Tq, Tk, dk, dv, kind = ATTN_CASES[case]
    g = gen(100 + case)
    Q = randn(*batch, Tq, dk, dtype=dtype, g=g, requires_grad=True)
    K = randn(*batch, Tk, dk, dtype=dtype, g=g, requires_grad=True)
    V = randn(*batch, Tk, dv, dtype=dtype, g=g, requires_grad=True)
    mask = None
    if kind == "causal":
        mask = S.causal_mask(Tq)
    elif kind == "padding":
        B = batch[0]
        lens = torch.randint(1, Tk + 1, (B,), generator=g)
        lens[0] = Tk - 2                                     # at least one row really is padded
        mask = pad_mask(lens, Tk).reshape(B, *([1] * (len(batch) - 1)), 1, Tk)  # (B, 1.., 1, T_k)
    Z, A = S.attention(Q, K, V, mask)
    Z_ref, A_ref = sdpa(Q, K, V, mask)
    assert Z.shape == (*batch, Tq, dv) and A.shape == (*batch, Tq, Tk)
    assert Z.dtype == dtype and A.dtype == dtype
    torch.testing.assert_close(Z, Z_ref, **TOL[dtype])
    torch.testing.assert_close(A, A_ref, **TOL[dtype])
    assert_grads_close([Z], [Q, K, V], [Z_ref], [Q, K, V], 7 + case, GRAD_TOL[dtype])


def test_attention_masked_weights_are_exactly_zero_and_rows_sum_to_one():
    """Blocked keys get weight 0.0 exactly; each row sums to 1 to 1e-12 (float64)."""
    g = gen(1)
    Q, K, V = (randn(2, 4, 6, 8, g=g) for _ in range(3))
    mask = S.causal_mask(6) | pad_mask([5, 3], 6)[:, None, None, :]
    _, A = S.attention(Q, K, V, mask)
    assert (A.masked_select(mask.expand_as(A)) == 0).all()
    torch.testing.assert_close(A.sum(-1), torch.ones(2, 4, 6, dtype=torch.float64), atol=1e-12, rtol=0)


def test_attention_row_with_every_key_blocked_gives_zero_like_sdpa():
    """A query that may see nothing gets zero weights and a zero output, as SDPA returns (no NaN)."""
    g = gen(2)
    Q, K, V = (randn(1, 3, 4, g=g) for _ in range(3))
    mask = torch.tensor([[True, True, True], [False, True, False], [False, False, False]])
    Z, A = S.attention(Q, K, V, mask)
    assert torch.isfinite(Z).all() and (A[0, 0] == 0).all() and (Z[0, 0] == 0).all()
    torch.testing.assert_close(Z, sdpa(Q, K, V, mask)[0], atol=1e-12, rtol=0)


def test_attention_is_permutation_equivariant_without_positions():
    """Permuting the rows of X permutes self-attention's output rows the same way (float64, 1e-12)."""
    g = gen(3)
    X = randn(2, 7, 16, g=g)
    W = [randn(16, 16, g=g) / 4 for _ in range(3)]
    perm = torch.randperm(7, generator=g)
    Z, _ = S.attention(X @ W[0], X @ W[1], X @ W[2])
    Xp = X[:, perm]
    Zp, _ = S.attention(Xp @ W[0], Xp @ W[1], Xp @ W[2])
    torch.testing.assert_close(Zp, Z[:, perm], atol=1e-12, rtol=0)
    # the same for the whole multi-head layer
    mha = S.MultiHeadAttention(16, 4).double()
    torch.testing.assert_close(mha(Xp)[0], mha(X)[0][:, perm], atol=1e-12, rtol=0)


def test_slides_worked_example_112_96():
    """Scores 112 and 96 with d_k = 64: divided by 8 gives 14 and 12, softmax 0.88 / 0.12 (slides, to 0.005)."""
    d_k = 64
    q = torch.zeros(1, d_k, dtype=torch.float64)
    q[0, 0] = 1.0
    K = torch.zeros(2, d_k, dtype=torch.float64)
    K[0, 0], K[1, 0] = 112.0, 96.0   # q.k1 = 112, q.k2 = 96
    V = torch.eye(2, dtype=torch.float64)
    Z, A = S.attention(q, K, V)
    assert math.sqrt(d_k) == 8.0
    exact = torch.tensor([[1 / (1 + math.exp(-2)), 1 / (1 + math.exp(2))]], dtype=torch.float64)  # softmax(14, 12)
    torch.testing.assert_close(A, exact, atol=1e-12, rtol=0)
    torch.testing.assert_close(A, torch.tensor([[0.88, 0.12]], dtype=torch.float64), atol=5e-3, rtol=0)
    torch.testing.assert_close(Z, A, atol=1e-12, rtol=0)        # identity values: Z is the weights
    print(f"\n  slides: 112/96 -> 14/12 -> 0.88/0.12; measured {A[0, 0]:.4f}/{A[0, 1]:.4f}")


@pytest.mark.parametrize("d_k", [8, 32, 128, 512])
def test_dot_product_variance_grows_like_d_k_and_scaling_removes_it(d_k):
    """Var(q.k) ~ d_k for unit-variance entries (std within 10% of sqrt(d_k)); after attention's 1/sqrt(d_k)
    the log-odds of two keys, (q.k1 - q.k2)/sqrt(d_k), have variance 2 whatever d_k is (within 10%)."""
    g = gen(d_k)
    n = 4000
    q, k1, k2 = (torch.randn(n, d_k, generator=g, dtype=torch.float64) for _ in range(3))
    dots = (q * k1).sum(1)
    assert abs(dots.std().item() / math.sqrt(d_k) - 1) < 0.1
    K = torch.stack([k1, k2], dim=1)                          # (n, 2, d_k): two keys per query
    _, A = S.attention(q[:, None, :], K, K)                   # (n, 1, 2)
    log_odds = torch.log(A[:, 0, 0]) - torch.log(A[:, 0, 1])  # = (q.k1 - q.k2) / sqrt(d_k)
    torch.testing.assert_close(log_odds, (dots - (q * k2).sum(1)) / math.sqrt(d_k), atol=1e-8, rtol=1e-8)
    assert abs(log_odds.var().item() / 2 - 1) < 0.1


# -------------------------------------------------------------------------------------- multi-head attention
def torch_mha_from(ours):
    """nn.MultiheadAttention(batch_first=True) holding our weights: in_proj = cat(WQ, WK, WV), out_proj = WO."""
    d = ours.WQ.in_features
    bias = ours.WQ.bias is not None
    ref = nn.MultiheadAttention(d, ours.h, bias=bias, batch_first=True).to(ours.WQ.weight.dtype)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.WQ.weight, ours.WK.weight, ours.WV.weight]))
        ref.out_proj.weight.copy_(ours.WO.weight)
        if bias:
            ref.in_proj_bias.copy_(torch.cat([ours.WQ.bias, ours.WK.bias, ours.WV.bias]))
            ref.out_proj.bias.copy_(ours.WO.bias)
    return ref


def mha_param_pairs(ours, ref):
    """(our parameter, the matching slice of the oracle's) for gradient comparison."""
    d = ours.WQ.in_features
    pairs = [(ours.WQ.weight, lambda: ref.in_proj_weight.grad[:d]),
             (ours.WK.weight, lambda: ref.in_proj_weight.grad[d:2 * d]),
             (ours.WV.weight, lambda: ref.in_proj_weight.grad[2 * d:]),
             (ours.WO.weight, lambda: ref.out_proj.weight.grad)]
    if ours.WQ.bias is not None:
        pairs += [(ours.WQ.bias, lambda: ref.in_proj_bias.grad[:d]),
                  (ours.WK.bias, lambda: ref.in_proj_bias.grad[d:2 * d]),
                  (ours.WV.bias, lambda: ref.in_proj_bias.grad[2 * d:]),
                  (ours.WO.bias, lambda: ref.out_proj.bias.grad)]
    return pairs


MHA_CASES = [  # (d_model, h, B, T_q, T_k, cross?, mask kind, bias)
    (32, 4, 3, 7, 7, False, None, True),
    (48, 6, 2, 5, 9, True, None, True),
    (32, 8, 2, 6, 6, False, "causal", True),
    (24, 3, 4, 5, 8, True, "padding", True),
    (16, 2, 3, 6, 6, False, "per_batch", False),
    (64, 1, 2, 4, 4, False, "padding", False),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(MHA_CASES)))
def test_mha_matches_nn_multiheadattention(case, dtype):
    """Output, per-head weights (average_attn_weights=False) and every gradient against nn.MultiheadAttention."""
    d, h, B, Tq, Tk, cross, kind, bias = MHA_CASES[case]
    torch.manual_seed(case)
    ours = S.MultiHeadAttention(d, h, bias=bias).to(dtype)
    ref = torch_mha_from(ours)
    g = gen(200 + case)
    x_q = randn(B, Tq, d, dtype=dtype, g=g, requires_grad=True)
    x_kv = randn(B, Tk, d, dtype=dtype, g=g, requires_grad=True) if cross else x_q
    mask, kw = None, {}
    if kind == "causal":
        mask = S.causal_mask(Tq)
        kw = dict(attn_mask=mask)                             # nn.MHA's bool attn_mask is True = blocked too
    elif kind == "padding":
        lens = torch.randint(1, Tk + 1, (B,), generator=g)
        lens[0] = max(1, Tk - 3)
        kpm = pad_mask(lens, Tk)
        mask, kw = kpm[:, None, None, :], dict(key_padding_mask=kpm)
    elif kind == "per_batch":                                 # (B, T_q, T_k): the same for every head
        mask = torch.rand(B, Tq, Tk, generator=g) < 0.4
        mask[..., 0] = False                                  # every query keeps one key
        kw = dict(attn_mask=mask.repeat_interleave(h, dim=0))  # nn.MHA wants (B * h, T_q, T_k)
    out, A = ours(x_q, None if not cross else x_kv, mask=mask)
    out_ref, A_ref = ref(x_q, x_kv, x_kv, average_attn_weights=False, **kw)
    assert out.shape == (B, Tq, d) and A.shape == (B, h, Tq, Tk) and out.dtype == dtype
    assert ours.h == h and ours.d_k == d // h
    torch.testing.assert_close(out, out_ref, **TOL[dtype])
    torch.testing.assert_close(A, A_ref, **TOL[dtype])
    inputs = [x_q, x_kv] if cross else [x_q]
    assert_grads_close([out], inputs, [out_ref], inputs, 300 + case, GRAD_TOL[dtype])
    # parameter gradients: the same loss through both modules
    up = torch.randn(out.shape, generator=gen(400 + case), dtype=torch.float64).to(dtype)
    (out * up).sum().backward()
    (out_ref * up).sum().backward()
    for p, ref_grad in mha_param_pairs(ours, ref):
        torch.testing.assert_close(p.grad, ref_grad(), **GRAD_TOL[dtype])


def test_mha_split_heads_and_paper_parameter_count():
    """split_heads: (B, T, d) -> (B, h, T, d_k) with head i = columns i*d_k:(i+1)*d_k; 4 x 512^2 = 2^20 weights."""
    mha = S.MultiHeadAttention(512, 8, bias=False)
    x = torch.randn(2, 5, 512)
    s = mha.split_heads(x)
    assert s.shape == (2, 8, 5, 64)
    torch.testing.assert_close(s[:, 3], x[..., 3 * 64:4 * 64], atol=0, rtol=0)
    assert sum(p.numel() for p in mha.parameters()) == 4 * 512 * 512 == 2 ** 20
    assert sum(p.numel() for p in S.MultiHeadAttention(512, 8).parameters()) == 2 ** 20 + 4 * 512


def test_mha_causal_mask_stops_the_future_leaking():
    """With the causal mask, changing the last token leaves every earlier output unchanged (float64, 1e-12)."""
    torch.manual_seed(0)
    mha = S.MultiHeadAttention(64, 8).double()
    x = torch.randn(1, 6, 64, dtype=torch.float64)
    x2 = x.clone()
    x2[0, -1] = torch.randn(64, dtype=torch.float64)
    m = S.causal_mask(6)
    torch.testing.assert_close(mha(x, mask=m)[0][0, :-1], mha(x2, mask=m)[0][0, :-1], atol=1e-12, rtol=0)
    assert (mha(x)[0][0, :-1] - mha(x2)[0][0, :-1]).abs().max() > 1e-3   # without it the change leaks


# ------------------------------------------------------------------------------------- positional encoding
def pe_formula(max_len, d):
    """The paper's table written out entry by entry in float64."""
    pe = np.zeros((max_len, d))
    for pos in range(max_len):
        for col in range(d):
            two_i = col - col % 2
            angle = pos / 10000 ** (two_i / d)
            pe[pos, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
    return torch.from_numpy(pe)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("max_len,d", [(50, 16), (100, 64), (30, 7), (1, 2)])
def test_positional_encoding_formula(max_len, d, dtype):
    """Every entry against the float64 formula: 1e-12 in float64, float32 rounding (1e-6) in float32."""
    pe = S.positional_encoding(max_len, d, dtype=dtype)
    assert pe.shape == (max_len, d) and pe.dtype == dtype
    tol = dict(atol=1e-12, rtol=0) if dtype == torch.float64 else dict(atol=1e-6, rtol=0)
    torch.testing.assert_close(pe.double(), pe_formula(max_len, d), **tol)
    assert (pe[0, 0::2] == 0).all() and (pe[0, 1::2] == 1).all()     # sin 0 = 0, cos 0 = 1


def test_positional_encoding_added_not_concatenated_keeps_width():
    """Adding PE keeps d_model (the residual needs it); the default table is float32."""
    pe = S.positional_encoding(100, 512)
    assert pe.dtype == torch.float32
    emb = torch.randn(100, 512)
    assert (emb + pe).shape == (100, 512) and torch.cat([emb, pe], 1).shape == (100, 1024)


@pytest.mark.parametrize("k", [0, 1, 5, 17, 60])
@pytest.mark.parametrize("d", [16, 128])
def test_offset_matrix_identity_to_1e9(k, d):
    """PE[pos + k] = M_k PE[pos] for 150 positions to 1e-9 (float64); M_k is orthogonal, M_0 = I."""
    M = S.offset_matrix(k, d)
    assert M.shape == (d, d) and M.dtype == torch.float64
    PE = S.positional_encoding(150 + k, d, dtype=torch.float64)
    err = (PE[k:] - PE[:150] @ M.T).abs().max().item()
    assert err < 1e-9, err
    torch.testing.assert_close(M @ M.T, torch.eye(d, dtype=torch.float64), atol=1e-12, rtol=0)
    if k == 0:
        torch.testing.assert_close(M, torch.eye(d, dtype=torch.float64), atol=0, rtol=0)


def test_offset_matrix_composes_and_pe_dot_depends_only_on_offset():
    """M_a M_b = M_(a+b) (1e-12); PE[p] . PE[p+k] is the same for every p (spread below 1e-9), largest at k = 0."""
    d = 128
    torch.testing.assert_close(S.offset_matrix(3, d) @ S.offset_matrix(9, d), S.offset_matrix(12, d),
                               atol=1e-12, rtol=0)
    PE = S.positional_encoding(260, d, dtype=torch.float64)
    dots = PE @ PE.T
    for k in (1, 5, 17):
        diag = torch.stack([dots[p, p + k] for p in range(100)])
        assert diag.std() < 1e-9
    # |PE[p]|^2 = sum over the d/2 pairs of sin^2 + cos^2 = d/2, and every other offset scores lower
    assert dots[0, 0].item() == pytest.approx(d / 2) and (dots[0, 1:60] < dots[0, 0]).all()


# ----------------------------------------------------------------------------------------- causal mask
@pytest.mark.parametrize("T", [1, 2, 5, 16])
def test_causal_mask_is_strict_upper_triangle(T):
    """Bool (T, T), True strictly above the diagonal: torch.triu(ones, 1), exactly."""
    m = S.causal_mask(T)
    assert m.dtype == torch.bool and m.shape == (T, T)
    assert torch.equal(m, torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1))
    assert S.causal_mask(T, device="cpu").device.type == "cpu"


# ----------------------------------------------------------------------------------- feed-forward, layers
@pytest.mark.parametrize("dtype", DTYPES)
def test_feedforward_is_lin2_relu_lin1(dtype):
    """Against the two linear maps written out (TOL), on (..., d_model) inputs."""
    ff = S.FeedForward(16, 40).to(dtype)
    x = randn(2, 3, 5, 16, dtype=dtype, g=gen(5))
    want = F.relu(x @ ff.lin1.weight.T + ff.lin1.bias) @ ff.lin2.weight.T + ff.lin2.bias
    assert ff(x).shape == x.shape
    torch.testing.assert_close(ff(x), want, **TOL[dtype])


def torch_encoder_from(ours, d, h, d_ff):
    """nn.TransformerEncoderLayer (post-norm, ReLU, dropout 0, batch_first) with our weights copied in."""
    ref = nn.TransformerEncoderLayer(d, h, dim_feedforward=d_ff, dropout=0.0, batch_first=True)
    ref = ref.to(ours.norm1.weight.dtype)
    ref.self_attn = torch_mha_from(ours.attn)
    ref.linear1.load_state_dict(ours.ff.lin1.state_dict())
    ref.linear2.load_state_dict(ours.ff.lin2.state_dict())
    ref.norm1.load_state_dict(ours.norm1.state_dict())
    ref.norm2.load_state_dict(ours.norm2.state_dict())
    return ref


def torch_decoder_from(ours, d, h, d_ff):
    """nn.TransformerDecoderLayer (post-norm, ReLU, dropout 0, batch_first) with our weights copied in."""
    ref = nn.TransformerDecoderLayer(d, h, dim_feedforward=d_ff, dropout=0.0, batch_first=True)
    ref = ref.to(ours.norm1.weight.dtype)
    ref.self_attn = torch_mha_from(ours.self_attn)
    ref.multihead_attn = torch_mha_from(ours.cross_attn)
    ref.linear1.load_state_dict(ours.ff.lin1.state_dict())
    ref.linear2.load_state_dict(ours.ff.lin2.state_dict())
    for i in (1, 2, 3):
        getattr(ref, f"norm{i}").load_state_dict(getattr(ours, f"norm{i}").state_dict())
    return ref


def perturb_norms(module, g):
    """LayerNorms start at (1, 0); move them so that a swapped or missing norm cannot pass unnoticed."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.add_(0.3 * torch.randn(m.weight.shape, generator=g, dtype=torch.float64).to(m.weight.dtype))
                m.bias.add_(0.3 * torch.randn(m.bias.shape, generator=g, dtype=torch.float64).to(m.bias.dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("padded", [False, True])
def test_encoder_layer_matches_nn_transformer_encoder_layer(padded, dtype):
    """Output and gradients (input and weights) against nn.TransformerEncoderLayer with copied weights (TOL)."""
    d, h, d_ff, B, T = 32, 4, 64, 3, 7
    torch.manual_seed(1)
    ours = S.EncoderLayer(d, h, d_ff).to(dtype)
    perturb_norms(ours, gen(11))
    ref = torch_encoder_from(ours, d, h, d_ff).train()        # train mode: the exact (slow) path, dropout is 0
    x = randn(B, T, d, dtype=dtype, g=gen(12), requires_grad=True)
    kpm = pad_mask([T, 4, 2], T) if padded else None
    y, A = ours(x, mask=None if kpm is None else kpm[:, None, None, :])
    y_ref = ref(x, src_key_padding_mask=kpm)
    assert y.shape == x.shape and A.shape == (B, h, T, T)
    torch.testing.assert_close(y, y_ref, **TOL[dtype])
    assert_grads_close([y], [x], [y_ref], [x], 13, GRAD_TOL[dtype])
    up = torch.randn(y.shape, generator=gen(14), dtype=torch.float64).to(dtype)
    (y * up).sum().backward()
    (y_ref * up).sum().backward()
    for p, ref_grad in mha_param_pairs(ours.attn, ref.self_attn):
        torch.testing.assert_close(p.grad, ref_grad(), **GRAD_TOL[dtype])
    for a, b in [(ours.ff.lin1, ref.linear1), (ours.ff.lin2, ref.linear2),
                 (ours.norm1, ref.norm1), (ours.norm2, ref.norm2)]:
        torch.testing.assert_close(a.weight.grad, b.weight.grad, **GRAD_TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("padded", [False, True])
def test_decoder_layer_matches_nn_transformer_decoder_layer(padded, dtype):
    """Output against nn.TransformerDecoderLayer (causal tgt_mask, memory padding), and input gradients (TOL)."""
    d, h, d_ff, B, T, Sm = 32, 4, 64, 3, 6, 8
    torch.manual_seed(2)
    ours = S.DecoderLayer(d, h, d_ff).to(dtype)
    perturb_norms(ours, gen(21))
    ref = torch_decoder_from(ours, d, h, d_ff).train()
    y = randn(B, T, d, dtype=dtype, g=gen(22), requires_grad=True)
    mem = randn(B, Sm, d, dtype=dtype, g=gen(23), requires_grad=True)
    kpm = pad_mask([Sm, 5, 3], Sm) if padded else None
    cm = S.causal_mask(T)
    out, A_self, A_cross = ours(y, mem, cm, None if kpm is None else kpm[:, None, None, :])
    out_ref = ref(y, mem, tgt_mask=cm, memory_key_padding_mask=kpm)
    assert out.shape == y.shape and A_self.shape == (B, h, T, T) and A_cross.shape == (B, h, T, Sm)
    torch.testing.assert_close(out, out_ref, **TOL[dtype])
    assert_grads_close([out], [y, mem], [out_ref], [y, mem], 24, GRAD_TOL[dtype])
    if padded:
        assert (A_cross[1, :, :, 5:] == 0).all() and (A_cross[2, :, :, 3:] == 0).all()


def test_decoder_layer_is_causal():
    """Changing target position t changes no output before t (float64, 1e-12); the cross weights are rows of T x S."""
    torch.manual_seed(3)
    layer = S.DecoderLayer(32, 4, 64).double()
    y = torch.randn(2, 6, 32, dtype=torch.float64)
    mem = torch.randn(2, 9, 32, dtype=torch.float64)
    y2 = y.clone()
    y2[:, 4] += 1.0
    cm = S.causal_mask(6)
    a, A_self, _ = layer(y, mem, cm)
    b, _, _ = layer(y2, mem, cm)
    torch.testing.assert_close(a[:, :4], b[:, :4], atol=1e-12, rtol=0)
    assert (a[:, 4:] - b[:, 4:]).abs().max() > 1e-3
    assert (A_self[..., 0, 1:] == 0).all()


# -------------------------------------------------------------------------------------------- transformer
def torch_transformer_logits(model, src, tgt_in, pad_id, causal=True, pe_scale=1.0):
    """The same network assembled from nn.Transformer*Layer modules and a PE table from the formula."""
    d = model.d_model
    # the model keeps its table as a float32 buffer (the default dtype), so round the formula the same way
    pe = pe_formula(64, d).float().to(model.out.weight.dtype)
    kpm = None if pad_id is None else src == pad_id
    x = model.src_emb(src) * math.sqrt(d) + pe_scale * pe[:src.shape[1]]
    for layer in model.encoder:
        x = torch_encoder_from(layer, d, layer.attn.h, layer.ff.lin1.out_features).train()(x, src_key_padding_mask=kpm)
    y = model.tgt_emb(tgt_in) * math.sqrt(d) + pe_scale * pe[:tgt_in.shape[1]]
    cm = S.causal_mask(tgt_in.shape[1]) if causal else None
    for layer in model.decoder:
        ref = torch_decoder_from(layer, d, layer.self_attn.h, layer.ff.lin1.out_features).train()
        y = ref(y, x, tgt_mask=cm, memory_key_padding_mask=kpm)
    return model.out(y)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal,pe_scale", [(True, 1.0), (False, 1.0), (True, 0.5)])
def test_transformer_matches_pytorch_layers(causal, pe_scale, dtype):
    """Logits against the same weights run through nn.TransformerEncoderLayer / DecoderLayer (TOL)."""
    torch.manual_seed(4)
    model = S.Transformer(S.VOCAB, d_model=32, h=4, d_ff=48, n_enc=2, n_dec=2, pad_id=S.PAD).to(dtype)
    model.use_causal_mask, model.pe_scale = causal, pe_scale
    perturb_norms(model, gen(41))
    src, tgt_in, _, _ = S.make_batch(5, 3, 9, gen(42))
    logits = model(src, tgt_in)
    assert logits.shape == (*tgt_in.shape, S.VOCAB) and logits.dtype == dtype
    want = torch_transformer_logits(model, src, tgt_in, S.PAD, causal, pe_scale)
    torch.testing.assert_close(logits, want, **TOL[dtype])
    torch.testing.assert_close(model.decode(tgt_in, model.encode(src)), logits, atol=0, rtol=0)


def test_transformer_padding_is_invisible_and_parameter_count():
    """Extra PAD columns on the source change no logit (1e-12, float64); the lecture's model has 169,933 weights."""
    torch.manual_seed(5)
    model = S.Transformer(S.VOCAB, pad_id=S.PAD).double()
    assert sum(p.numel() for p in model.parameters()) == 169_933
    src, tgt_in, _, _ = S.make_batch(4, 3, 6, gen(51))
    longer = F.pad(src, (0, 5), value=S.PAD)
    torch.testing.assert_close(model(longer, tgt_in), model(src, tgt_in), atol=1e-12, rtol=0)
    # without pad_id the padding is attended to, and the logits move
    model.pad_id = None
    assert (model(longer, tgt_in) - model(src, tgt_in)).abs().max() > 1e-6


def test_transformer_without_pe_is_permutation_invariant_in_the_source():
    """pe_scale = 0: permuting the source permutes the memory rows, and the logits do not change (1e-10)."""
    torch.manual_seed(6)
    model = S.Transformer(S.VOCAB).double()
    model.pe_scale = 0.0
    src = torch.randint(0, 10, (3, 7), generator=gen(61))
    tgt_in = torch.randint(0, 10, (3, 5), generator=gen(62))
    perm = torch.randperm(7, generator=gen(63))
    mem, _ = model.encode(src)
    mem_p, _ = model.encode(src[:, perm])
    torch.testing.assert_close(mem_p, mem[:, perm], atol=1e-10, rtol=0)
    torch.testing.assert_close(model(src[:, perm], tgt_in), model(src, tgt_in), atol=1e-10, rtol=0)
    model.pe_scale = 1.0
    assert (model(src[:, perm], tgt_in) - model(src, tgt_in)).abs().max() > 1e-4


def test_paper_base_model_parameter_count():
    """d_model 512, 8 heads, d_ff 2048, 6 + 6 layers: 44.1 M weights in the blocks (seed), 63 M with a
    37,000-word shared embedding (the paper reports 65 M). Built on the meta device: nothing allocated."""
    with torch.device("meta"):
        enc, dec = S.EncoderLayer(512, 8, 2048), S.DecoderLayer(512, 8, 2048)
    n_enc, n_dec = (sum(p.numel() for p in m.parameters()) for m in (enc, dec))
    assert n_enc == 3_152_384 and n_dec == 4_204_032                  # the seed's per-layer figures
    blocks = 6 * (n_enc + n_dec)
    assert round(blocks / 1e6, 1) == 44.1
    assert round((blocks + 37_000 * 512) / 1e6) == 63
    print(f"\n  base model blocks {blocks / 1e6:.1f} M (lecture 44.1 M), with embedding "
          f"{(blocks + 37_000 * 512) / 1e6:.0f} M (paper 65 M)")


# ------------------------------------------------------------------------------------ reverse-task data
@pytest.mark.parametrize("B,L_min,L_max,seed", [(64, 3, 10, 0), (32, 1, 1, 1), (50, 5, 12, 2), (8, 0, 4, 3)])
def test_make_batch_properties(B, L_min, L_max, seed):
    """Layout of src / tgt / tgt_in row by row, lengths in range, reproducible from the generator."""
    src, tgt_in, tgt, lens = S.make_batch(B, L_min, L_max, gen(seed))
    T = int(lens.max()) + 1
    assert src.shape == tgt.shape == tgt_in.shape == (B, T) and lens.shape == (B,)
    assert src.dtype == tgt.dtype == tgt_in.dtype == torch.long
    assert ((lens >= L_min) & (lens <= L_max)).all()
    for b in range(B):
        L = int(lens[b])
        digits = src[b, :L]
        assert ((digits >= 0) & (digits <= 9)).all()
        assert src[b, L] == S.EOS and (src[b, L + 1:] == S.PAD).all()
        assert torch.equal(tgt[b, :L], digits.flip(0)) and tgt[b, L] == S.EOS and (tgt[b, L + 1:] == S.PAD).all()
        assert tgt_in[b, 0] == S.BOS and torch.equal(tgt_in[b, 1:L + 1], tgt[b, :L])
        assert (tgt_in[b, L + 1:] == S.PAD).all()
    again = S.make_batch(B, L_min, L_max, gen(seed))
    assert all(torch.equal(a, b) for a, b in zip((src, tgt_in, tgt, lens), again, strict=True))
    assert (S.BOS, S.EOS, S.PAD, S.VOCAB) == (10, 11, 12, 13)


def test_make_batch_covers_lengths_and_digits():
    """Over 2,000 rows every length 3-10 and every digit appears (a generator that ignored `gen` would still pass
    this, the reproducibility test above catches that)."""
    src, _, _, lens = S.make_batch(2000, 3, 10, gen(9))
    assert set(lens.tolist()) == set(range(3, 11))
    assert set(src[src < 10].tolist()) == set(range(10))


# ------------------------------------------------------------------------------------------ greedy decode
class CountingModel(nn.Module):
    """decode() predicts (last input token + 1) mod V at every position: greedy from BOS gives 11, 12, 0, 1, ..."""

    def encode(self, src):
        return src

    def decode(self, tgt_in, state):
        return F.one_hot((tgt_in + 1) % S.VOCAB, S.VOCAB).double()


def test_greedy_decode_feeds_its_own_output_back():
    """From BOS (10): 11, 12, 0, 1, ... exactly; (B, n_steps), long, no BOS in the result."""
    src = torch.zeros(3, 4, dtype=torch.long)
    out = S.greedy_decode(CountingModel(), src, 6)
    assert out.shape == (3, 6) and out.dtype == torch.long
    assert out[0].tolist() == [11, 12, 0, 1, 2, 3]


def test_greedy_decode_matches_a_step_by_step_oracle():
    """On an untrained transformer: the oracle re-decodes each prefix by forward(src, prefix); tokens identical."""
    torch.manual_seed(7)
    model = S.Transformer(S.VOCAB, pad_id=S.PAD).double().eval()
    src, _, _, _ = S.make_batch(6, 3, 8, gen(71))
    out = S.greedy_decode(model, src, 9)
    ys = torch.full((6, 1), S.BOS)
    with torch.no_grad():
        for _ in range(9):
            ys = torch.cat([ys, model(src, ys)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, ys[:, 1:])
    assert not any(p.grad is not None for p in model.parameters())


# ------------------------------------------------------------------------------------------------ cost
def test_mha_cost_formula_and_constant_cost_line():
    """3 d h d_k + h d_k d and h T^2 d_k; with d_k = 512 / h both are constant in h (the lecture's table)."""
    assert S.mha_cost(512, 8, 64, 100) == (2 ** 20, 5_120_000)
    assert S.mha_cost(10, 3, 7, 5) == (3 * 10 * 3 * 7 + 3 * 7 * 10, 3 * 25 * 7)
    for h in (1, 2, 4, 8, 16, 32, 64):
        assert S.mha_cost(512, h, 512 // h, 100) == (1_048_576, 5_120_000)
    assert S.mha_cost(512, 64, 512, 100) == (67_108_864, 327_680_000)
    assert S.mha_cost(64, 4, 16, 10)[0] == sum(p.numel() for p in S.MultiHeadAttention(64, 4, bias=False).parameters())


# ---------------------------------------------------------------------------------------------- experiments
# reverse_transformer and no_causal_mask are graded: grading the reference solution trains them through the
# sandbox (tests/test_grading.py, the graded_solutions fixture). The GRU baseline is ungraded and lives here.

@pytest.mark.experiment
def test_experiment_gru_baseline(graded_solutions):
    from autograder.course.config import load_course
    from autograder.grading.experiments import run_reference
    from autograder.reports.tables import format_row
    exp = load_course().assignment("w8l4_transformers").experiments["gru_baseline"]
    r = run_reference("w8l4_transformers", "gru_baseline", device="cpu")
    transformer = next(t["extra_data"]["metrics"] for t in graded_solutions["w8l4_transformers"]["tests"]
                       if t.get("extra_data", {}).get("experiment") == "reverse_transformer")
    m, tf_L10 = r.metrics, transformer["token_acc_L10"]
    print(f"\nEXPERIMENT {format_row(exp, r)}; transformer {tf_L10:.3f} "
          f"(lecture {exp.lecture['transformer_token_acc_L10']})")
    print("  GRU token accuracy by length: " + "  ".join(f"L={L}: {m[f'token_acc_L{L}']:.2f}" for L in range(3, 11)))
    assert r.passed, r.failures
    assert m["token_acc_L3"] > m["token_acc_L10"], "the bottleneck should cost accuracy as L grows"
    assert tf_L10 > m["token_acc_L10"], "the transformer should beat the GRU at L = 10"


def test_what_the_notebook_says_pytorch_returns_for_a_row_with_every_key_blocked():
    """§3.b: `F.scaled_dot_product_attention` gives zeros for a query with no open key, `nn.MultiheadAttention` NaN
    (torch 2.14): if torch changes either, the sentence in the notebook must change with it."""
    from autograder.course.config import ROOT
    text = (ROOT / "assignments" / "w8l4_transformers" / "w8l4_transformers.ipynb").read_text()
    assert "what `F.scaled_dot_product_attention` returns; `nn.MultiheadAttention` returns NaN there" in text
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8)
    blocked = torch.zeros(3, 3, dtype=torch.bool)
    blocked[1] = True  # query 1 may attend to no key
    out, _ = torch.nn.MultiheadAttention(8, 2, batch_first=True)(x, x, x, attn_mask=blocked)
    assert bool(out[0, 1].isnan().all())
    z = torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=~blocked)
    assert bool((z[0, 1] == 0).all())
