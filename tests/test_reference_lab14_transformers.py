"""Reference solution of lab14_transformers against its oracles, the lab's demonstrations, and its experiment.

Oracles: F.scaled_dot_product_attention, nn.MultiheadAttention, the sinusoid formula in float64,
nn.TransformerEncoderLayer / nn.TransformerEncoder with copied weights, and training.
Tolerances are stated per test: float32 atol 1e-5 (1e-4 through a whole block), float64 1e-10.
"""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import solutions.lab14_transformers as ref
from autograder.grading.scoring import seed_for
from tests.tolerances import assert_close

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.float64]


def make_mask(kind, batch, S_q, S_k, gen):
    """A mask in this lab's convention (1/True = may attend), in one of several dtypes/shapes."""
    if kind == "none":
        return None
    if kind in ("causal_bool", "causal_float", "causal_int"):
        m = torch.ones(S_q, S_k).tril()  # 1 = allowed, like the lab's torch.tril(torch.ones(n, n))
        return {"causal_bool": m.bool(), "causal_float": m, "causal_int": m.long()}[kind]
    if kind == "padding":
        # (..., 1, S_k): per-sequence valid lengths >= 1, broadcast over queries
        lengths = torch.randint(1, S_k + 1, batch + (1,), generator=gen)
        return torch.arange(S_k) < lengths.unsqueeze(-1)  # (..., 1, S_k)
    if kind == "random":
        m = torch.rand(batch + (S_q, S_k), generator=gen) < 0.6
        m[..., 0] = True  # every query keeps at least one key
        return m
    raise ValueError(kind)


# ---------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,S_q,S_k,d_k,d_v,mask_kind", [
    (batch, S_q, S_k, d_k, d_v, kind)
    for batch, S_q, S_k, d_k, d_v in [((), 4, 4, 8, 8), ((2,), 5, 7, 16, 3), ((2, 3), 6, 6, 4, 5), ((3,), 1, 9, 32, 8)]
    for kind in ["none", "causal_bool", "causal_float", "causal_int", "padding", "random"]
    if S_q == S_k or not kind.startswith("causal")])  # a causal mask needs square scores
def test_sdpa_matches_torch(device, dtype, batch, S_q, S_k, d_k, d_v, mask_kind):
    """out and weights against F.scaled_dot_product_attention (bool mask: True = take part); values and
    gradients of Q, K, V; tolerance float32 1e-5, float64 1e-10."""
    gen = torch.Generator().manual_seed(seed_for(batch, S_q, S_k, d_k, mask_kind))  # not hash(): salted per process
    Q = torch.randn(batch + (S_q, d_k), generator=gen, dtype=dtype).to(device)
    K = torch.randn(batch + (S_k, d_k), generator=gen, dtype=dtype).to(device)
    V = torch.randn(batch + (S_k, d_v), generator=gen, dtype=dtype).to(device)
    mask = make_mask(mask_kind, batch, S_q, S_k, gen)
    mask = None if mask is None else mask.to(device)
    bool_mask = None if mask is None else (mask != 0)

    q1, k1, v1 = (t.clone().requires_grad_() for t in (Q, K, V))
    q2, k2, v2 = (t.clone().requires_grad_() for t in (Q, K, V))
    out, weights = ref.scaled_dot_product_attention(q1, k1, v1, mask)
    expect = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=bool_mask)
    # the oracle's weights: attend over the identity as values, one column per key
    eye = torch.eye(S_k, dtype=dtype, device=device).expand(batch + (S_k, S_k))
    expect_w = F.scaled_dot_product_attention(Q, K, eye, attn_mask=bool_mask)

    assert out.shape == batch + (S_q, d_v) and weights.shape == batch + (S_q, S_k)
    assert out.dtype == dtype and weights.dtype == dtype
    assert out.device.type == device and weights.device.type == device
    assert_close(out, expect, dtype)
    assert_close(weights, expect_w, dtype)

    g = torch.randn(out.shape, generator=gen, dtype=dtype).to(device)
    (out * g).sum().backward()
    (expect * g).sum().backward()
    for a, b in ((q1, q2), (k1, k2), (v1, v2)):
        assert_close(a.grad, b.grad, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_kind", ["none", "causal_bool", "causal_float", "random"])
def test_sdpa_rows_sum_to_one_and_blocked_get_zero(dtype, mask_kind):
    """Each row of weights sums to 1 (to 1e-6 / 1e-12) and a blocked key gets exactly 0 weight."""
    gen = torch.Generator().manual_seed(1)
    Q, K, V = (torch.randn(2, 6, 16, generator=gen, dtype=dtype) for _ in range(3))
    mask = make_mask(mask_kind, (2,), 6, 6, gen)
    _, w = ref.scaled_dot_product_attention(Q, K, V, mask)
    atol = 1e-6 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 6, dtype=dtype), atol=atol, rtol=0)
    assert (w >= 0).all()
    if mask is not None:
        blocked = (mask == 0).expand_as(w)
        assert (w[blocked] == 0).all()
        assert (w[~blocked] > 0).all()
    if mask_kind.startswith("causal"):
        assert torch.equal(w, w.tril()), "a causal mask makes the weights lower-triangular"


@pytest.mark.parametrize("dtype", DTYPES)
def test_sdpa_fully_blocked_row(dtype):
    """A query with every key blocked: zero output and weights (as F.sdpa in torch >= 2.5), finite gradients."""
    gen = torch.Generator().manual_seed(2)
    Q, K, V = (torch.randn(3, 5, generator=gen, dtype=dtype).requires_grad_() for _ in range(3))
    mask = torch.tensor([[1, 0, 1], [0, 0, 0], [1, 1, 1]])
    out, w = ref.scaled_dot_product_attention(Q, K, V, mask)
    assert (w[1] == 0).all() and (out[1] == 0).all()
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (Q, K, V))
    expect = F.scaled_dot_product_attention(Q.detach(), K.detach(), V.detach(), attn_mask=mask.bool())
    assert_close(out.detach(), expect, dtype)


def test_sdpa_and_multihead_from_scratch(monkeypatch):
    """Neither attention function calls the oracle it is graded against (the oracles raise if called)."""
    def forbidden(*args, **kwargs):
        raise AssertionError("called the oracle")
    monkeypatch.setattr(F, "scaled_dot_product_attention", forbidden)
    monkeypatch.setattr(F, "multi_head_attention_forward", forbidden)
    monkeypatch.setattr(torch._C._nn, "scaled_dot_product_attention", forbidden, raising=False)
    Q = torch.randn(2, 4, 8)
    ref.scaled_dot_product_attention(Q, Q, Q, torch.ones(4, 4).tril())
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    monkeypatch.setattr(nn.MultiheadAttention, "forward", forbidden)
    ref.manual_multihead(Q, mha)


def test_dot_product_variance_grows_like_d_k():
    """Lab section 2: for unit-variance q, k, Var(q.k) = d_k; dividing by sqrt(d_k) keeps it at 1.
    Measured on 20,000 pairs per d_k; tolerance 5% relative."""
    gen = torch.Generator().manual_seed(0)
    for d in (8, 64, 512):
        q = torch.randn(20000, d, generator=gen, dtype=torch.float64)
        k = torch.randn(20000, d, generator=gen, dtype=torch.float64)
        dots = (q * k).sum(-1)
        assert abs(dots.var().item() / d - 1) < 0.05, (d, dots.var().item())
        assert abs((dots / math.sqrt(d)).var().item() - 1) < 0.05


def test_unscaled_softmax_saturates():
    """Lab section 2's table: max softmax weight of 1 query over 16 keys, averaged over 200 draws.
    Unscaled it is near one-hot at d_k = 4096 (lecture 1.0000 on one draw; here > 0.95) while
    scaled it stays spread out (lecture 0.15-0.42; here mean < 0.5); unscaled grows with d_k."""
    gen = torch.Generator().manual_seed(0)
    mean_max_unscaled, mean_max_scaled = [], []
    for d in (8, 64, 512, 4096):
        q = torch.randn(200, 1, d, generator=gen, dtype=torch.float64)
        k = torch.randn(200, 16, d, generator=gen, dtype=torch.float64)
        v = torch.zeros(200, 16, 1, dtype=torch.float64)
        _, w_scaled = ref.scaled_dot_product_attention(q, k, v)
        w_unscaled = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        mean_max_unscaled.append(w_unscaled.amax(-1).mean().item())
        mean_max_scaled.append(w_scaled.amax(-1).mean().item())
    print("mean max weight unscaled:", [round(v, 3) for v in mean_max_unscaled],
          " scaled:", [round(v, 3) for v in mean_max_scaled])
    assert mean_max_unscaled == sorted(mean_max_unscaled)
    assert mean_max_unscaled[-1] > 0.95
    assert max(mean_max_scaled) < 0.5


# ---------------------------------------------------------------------------------------------
# manual_multihead
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("B,S,E,H", [(2, 6, 32, 4), (3, 9, 24, 8), (1, 1, 16, 1), (4, 5, 12, 3)])
def test_manual_multihead_matches_torch(device, dtype, bias, B, S, E, H):
    """out and per-head weights against mha(x, x, x, average_attn_weights=False), and the gradients
    of x and of every mha parameter; tolerance float32 1e-5, float64 1e-10."""
    torch.manual_seed(B * 100 + S * 10 + E + H)
    mha = nn.MultiheadAttention(E, H, bias=bias, batch_first=True).to(device=device, dtype=dtype).eval()
    if bias:  # PyTorch initialises the biases to zero; make them count
        with torch.no_grad():
            mha.in_proj_bias.normal_()
            mha.out_proj.bias.normal_()
    x = torch.randn(B, S, E, device=device, dtype=dtype)

    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, w = ref.manual_multihead(x1, mha)
    grads1 = torch.autograd.grad(out.pow(2).sum() + (w * w).sum(), [x1] + list(mha.parameters()))
    expect, expect_w = mha(x2, x2, x2, average_attn_weights=False)
    grads2 = torch.autograd.grad(expect.pow(2).sum() + (expect_w * expect_w).sum(), [x2] + list(mha.parameters()))

    assert out.shape == (B, S, E) and w.shape == (B, H, S, S)
    assert out.dtype == dtype and out.device.type == device
    assert_close(out, expect, dtype)
    assert_close(w, expect_w, dtype)
    for a, b in zip(grads1, grads2, strict=True):
        assert_close(a, b, dtype, loose=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_manual_multihead_unbatched_and_averaged(dtype):
    """An unbatched (S, E) input gives (H, S, S) weights like nn.MultiheadAttention; averaging the heads
    gives mha's default need_weights output (lab's note); tolerance 1e-5 / 1e-10."""
    torch.manual_seed(3)
    mha = nn.MultiheadAttention(32, 4, batch_first=True).to(dtype).eval()
    x = torch.randn(2, 6, 32, dtype=dtype)
    out, w = ref.manual_multihead(x[0], mha)
    expect, expect_w = mha(x[0], x[0], x[0], average_attn_weights=False)
    assert w.shape == (4, 6, 6)
    assert_close(out, expect, dtype)
    assert_close(w, expect_w, dtype)
    _, w = ref.manual_multihead(x, mha)
    _, avg = mha(x, x, x, need_weights=True)  # (B, S, S): heads averaged by default
    assert_close(w.mean(1), avg, dtype)


def test_heads_attend_differently():
    """Lab section 4: at initialisation the heads already give different attention patterns."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    _, w = ref.manual_multihead(torch.randn(2, 6, 32), mha)
    for i in range(4):
        for j in range(i + 1, 4):
            assert (w[:, i] - w[:, j]).abs().max() > 1e-3


def test_attention_is_permutation_equivariant_without_pe():
    """Lab section 5: shuffling the positions shuffles self-attention's output the same way (1e-5);
    adding the positional encoding first breaks that (difference > 1e-2)."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    x = torch.randn(2, 8, 32)
    perm = torch.randperm(8)
    out, _ = ref.manual_multihead(x, mha)
    out_perm, _ = ref.manual_multihead(x[:, perm], mha)
    torch.testing.assert_close(out_perm, out[:, perm], atol=1e-5, rtol=1e-5)
    pe = ref.PositionalEncoding(32, max_len=8)
    out_pe, _ = ref.manual_multihead(pe(x), mha)
    out_pe_perm, _ = ref.manual_multihead(pe(x[:, perm]), mha)
    assert (out_pe_perm - out_pe[:, perm]).abs().max() > 1e-2


# ---------------------------------------------------------------------------------------------
# PositionalEncoding
# ---------------------------------------------------------------------------------------------

def pe_formula(max_len, d):
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same), in float64."""
    pe = torch.zeros(max_len, d, dtype=torch.float64)
    for pos in range(max_len):
        for j in range(d):
            angle = pos / 10000 ** ((j - j % 2) / d)
            pe[pos, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return pe


@pytest.mark.parametrize("d_model,max_len", [(64, 100), (32, 61), (7, 20), (2, 5)])
def test_positional_encoding_formula(d_model, max_len):
    """The buffer against the formula in float64: shape (1, max_len, d), float32 storage, atol 1e-6."""
    pe = ref.PositionalEncoding(d_model, max_len=max_len)
    assert pe.pe.shape == (1, max_len, d_model) and pe.pe.dtype == torch.float32
    torch.testing.assert_close(pe.pe[0].double(), pe_formula(max_len, d_model), atol=1e-6, rtol=0)


def test_positional_encoding_default_max_len():
    assert ref.PositionalEncoding(16).pe.shape == (1, 512, 16)


def test_positional_encoding_is_a_buffer():
    """pe is a buffer (in the state dict, moved by .to()), never a parameter the optimiser would train."""
    pe = ref.PositionalEncoding(32, max_len=10)
    assert list(pe.parameters()) == []
    assert "pe" in dict(pe.named_buffers()) and "pe" in pe.state_dict()
    assert pe.double().pe.dtype == torch.float64


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 7, 16), (7, 16), (2, 3, 5, 16), (1, 50, 16)])
def test_positional_encoding_forward(device, dtype, shape):
    """forward(x) = x + PE[:S] on (..., S, d); dtype and device follow x; gradient of x is the identity."""
    pe = ref.PositionalEncoding(16, max_len=50).to(device)
    x = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    y = pe(x)
    assert y.shape == x.shape and y.dtype == dtype and y.device.type == device
    S = shape[-2]
    expect = x.detach() + pe_formula(50, 16)[:S].to(dtype=dtype, device=device)
    torch.testing.assert_close(y.detach(), expect, atol=1e-6, rtol=0)
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_positional_encoding_properties():
    """Lab section 5: every position's code is unique; values in [-1, 1]; low dimensions oscillate
    faster than high ones; a fixed offset k is one linear map M_k with PE[pos + k] = M_k PE[pos] (atol 1e-5)."""
    d, L = 64, 100
    pe = ref.PositionalEncoding(d, max_len=L).pe[0].double()  # (L, d)
    dist = torch.cdist(pe, pe) + torch.eye(L) * 1e9
    assert dist.min() > 1e-2
    assert pe.abs().max() <= 1 + 1e-7
    def crossings(col):
        return int((torch.sign(pe[1:, col]) != torch.sign(pe[:-1, col])).sum())
    assert crossings(0) > crossings(4) > crossings(12) > crossings(30)
    # least-squares M_k from positions 0..L-k-1 reproduces PE[pos + k] exactly
    for k in (1, 5, 17):
        A, Bk = pe[:L - k], pe[k:]
        M = torch.linalg.lstsq(A, Bk).solution  # PE[pos + k] = PE[pos] @ M
        torch.testing.assert_close(A @ M, Bk, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------
# EncoderBlock
# ---------------------------------------------------------------------------------------------

def torch_encoder_layer(block, d_model, num_heads, ff_dim):
    """nn.TransformerEncoderLayer (pre-norm, GELU, no dropout) holding a copy of the block's weights."""
    layer = nn.TransformerEncoderLayer(d_model, num_heads, dim_feedforward=ff_dim, dropout=0.0,
                                       activation="gelu", batch_first=True, norm_first=True)
    linears = [m for m in block.ff if isinstance(m, nn.Linear)]
    assert len(linears) == 2
    pairs = [(layer.self_attn, block.attn), (layer.linear1, linears[0]), (layer.linear2, linears[1]),
             (layer.norm1, block.norm1), (layer.norm2, block.norm2)]
    with torch.no_grad():
        for dst, src in pairs:
            for (name, p), (name2, q) in zip(dst.named_parameters(), src.named_parameters(), strict=True):
                assert name == name2 and p.shape == q.shape
                p.copy_(q)
    return layer.to(next(block.parameters()).dtype)


def test_encoder_block_parameter_count():
    """12,704 parameters at (32, 4), as the lab prints; ff_dim defaults to 4 * d_model."""
    block = ref.EncoderBlock(32, 4)
    assert sum(p.numel() for p in block.parameters()) == 12704
    linears = [m for m in block.ff if isinstance(m, nn.Linear)]
    assert [tuple(m.weight.shape) for m in linears] == [(128, 32), (32, 128)]
    assert isinstance(block.attn, nn.MultiheadAttention) and block.attn.batch_first
    assert isinstance(block.norm1, nn.LayerNorm) and isinstance(block.norm2, nn.LayerNorm)
    assert isinstance(block.dropout, nn.Dropout)
    assert any(isinstance(m, nn.GELU) for m in block.ff)
    assert [tuple(m.weight.shape) for m in ref.EncoderBlock(16, 2, ff_dim=40).ff if isinstance(m, nn.Linear)] \
        == [(40, 16), (16, 40)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d_model,num_heads,ff_dim,B,S", [(32, 4, None, 2, 10), (24, 3, 40, 3, 7),
                                                          (16, 1, None, 1, 1), (32, 8, 64, 2, 61)])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_encoder_block_matches_torch(device, dtype, d_model, num_heads, ff_dim, B, S, dropout):
    """Against nn.TransformerEncoderLayer(norm_first=True, activation='gelu', dropout=0) with copied
    weights, in eval mode (so dropout=0.1 is off too): output and gradients of x and all weights;
    tolerance float32 1e-4, float64 1e-9 (a whole block)."""
    gen = torch.Generator().manual_seed(d_model + num_heads + S)
    torch.manual_seed(0)
    block = ref.EncoderBlock(d_model, num_heads, ff_dim=ff_dim, dropout=dropout)
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))  # move LayerNorm / biases off 1 and 0
    block = block.to(device=device, dtype=dtype).eval()
    layer = torch_encoder_layer(block, d_model, num_heads, ff_dim or 4 * d_model).to(device).eval()
    x = torch.randn(B, S, d_model, generator=gen, dtype=dtype).to(device)

    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, w = block(x1)
    assert w is None
    expect = layer(x2)
    assert y.shape == x.shape and y.dtype == dtype and y.device.type == device
    assert_close(y, expect, dtype, loose=True)

    g = torch.randn(y.shape, generator=gen, dtype=dtype).to(device)
    ga = torch.autograd.grad((y * g).sum(), [x1] + list(block.parameters()))
    linears = [m for m in block.ff if isinstance(m, nn.Linear)]
    layer_params = (list(layer.self_attn.parameters()) + list(layer.norm1.parameters())
                    + list(layer.norm2.parameters()) + list(layer.linear1.parameters())
                    + list(layer.linear2.parameters()))
    block_params = (list(block.attn.parameters()) + list(block.norm1.parameters())
                    + list(block.norm2.parameters()) + list(linears[0].parameters())
                    + list(linears[1].parameters()))
    gb = torch.autograd.grad((expect * g).sum(), [x2] + layer_params)
    grads_block = dict(zip([id(p) for p in [x1] + list(block.parameters())], ga, strict=True))
    for p, g_torch in zip([x1] + block_params, gb, strict=True):
        assert_close(grads_block[id(p)], g_torch, dtype, loose=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_encoder_block_weights(dtype):
    """need_weights=True gives per-head weights (B, H, S, S), rows summing to 1, equal to the
    attention of norm1(x) (manual_multihead); the output is the same as without weights (1e-5 / 1e-10)."""
    torch.manual_seed(0)
    block = ref.EncoderBlock(32, 4).to(dtype).eval()
    x = torch.randn(2, 10, 32, dtype=dtype)
    y, w = block(x, need_weights=True)
    y0, _ = block(x)
    assert w.shape == (2, 4, 10, 10) and w.dtype == dtype
    assert_close(w.sum(-1), torch.ones(2, 4, 10, dtype=dtype), dtype)
    _, expect_w = ref.manual_multihead(block.norm1(x), block.attn)
    assert_close(w, expect_w, dtype)
    assert_close(y, y0, dtype)


def test_encoder_block_dropout_only_in_training():
    """dropout=0.1: training mode is stochastic, eval mode is deterministic."""
    torch.manual_seed(0)
    block = ref.EncoderBlock(32, 4, dropout=0.1)
    x = torch.randn(2, 10, 32)
    assert not torch.equal(block.train()(x)[0], block(x)[0])
    block.eval()
    assert torch.equal(block(x)[0], block(x)[0])


def test_encoder_block_pre_norm():
    """Pre-norm: with the sub-layers' last linear maps zeroed the block is the identity (the residual
    path is never normalised); a post-norm block would return LayerNorm(x) instead."""
    torch.manual_seed(0)
    block = ref.EncoderBlock(32, 4).eval()
    linears = [m for m in block.ff if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for lin in (block.attn.out_proj, linears[1]):
            lin.weight.zero_()
            lin.bias.zero_()
    x = 3 * torch.randn(2, 5, 32) + 1
    torch.testing.assert_close(block(x)[0], x, atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------
# make_memory_dataset
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,S,seed", [(4000, 60, 0), (1000, 60, 1), (7, 3, 5), (500, 300, 2)])
def test_memory_dataset_properties(n, S, seed):
    """Shapes (n, S, 1) and (n, 1), float32; noise in [-1, 1]; marker +-1 at position 0; y = marker > 0;
    deterministic in seed; both classes present for n >= 500 (within 10% of balance)."""
    X, y = ref.make_memory_dataset(n, S, seed=seed)
    assert X.shape == (n, S, 1) and y.shape == (n, 1)
    assert X.dtype == torch.float32 and y.dtype == torch.float32
    assert (X >= -1).all() and (X <= 1).all()
    assert set(X[:, 0, 0].tolist()) <= {-1.0, 1.0}
    assert torch.equal(y[:, 0], (X[:, 0, 0] > 0).float())
    X2, y2 = ref.make_memory_dataset(n, S, seed=seed)
    assert torch.equal(X, X2) and torch.equal(y, y2)
    if n >= 500:
        assert abs(y.mean().item() - 0.5) < 0.1
        noise = X[:, 1:, 0]
        assert abs(noise.mean().item()) < 0.02 and abs(noise.var().item() - 1 / 3) < 0.02  # U[-1, 1]
        assert (noise.abs() < 1).float().mean() > 0.999  # the +-1 values are (almost) only the marker


def test_memory_dataset_seeds_differ():
    X0, _ = ref.make_memory_dataset(100, 60, seed=0)
    X1, _ = ref.make_memory_dataset(100, 60, seed=1)
    assert not torch.equal(X0, X1)


def test_memory_dataset_only_position_zero_informative():
    """The label is a function of position 0 alone: correlation with any later step is ~0 (|r| < 0.1)."""
    X, y = ref.make_memory_dataset(4000, 60, seed=0)
    yc = y[:, 0] - y.mean()
    r = [(yc * (X[:, t, 0] - X[:, t, 0].mean())).mean() / (yc.std() * X[:, t, 0].std()) for t in range(60)]
    assert r[0] > 0.99
    assert max(abs(v) for v in r[1:]) < 0.1


# ---------------------------------------------------------------------------------------------
# TransformerClassifier
# ---------------------------------------------------------------------------------------------

def test_classifier_structure():
    """25,601 parameters by default (lab); blocks alone 25,408 = nn.TransformerEncoder's count (lab section 9);
    CLS is a (1, 1, d) parameter; pos_enc is a PositionalEncoding buffer of max_len = 61 positions."""
    model = ref.TransformerClassifier()
    assert sum(p.numel() for p in model.parameters()) == 25601
    assert sum(p.numel() for b in model.blocks for p in b.parameters()) == 25408
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=128, dropout=0.1, activation="gelu",
                                       batch_first=True, norm_first=True)
    builtin = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    assert sum(p.numel() for p in builtin.parameters()) == 25408
    assert isinstance(model.cls_token, nn.Parameter) and model.cls_token.shape == (1, 1, 32)
    assert isinstance(model.pos_enc, ref.PositionalEncoding) and model.pos_enc.pe.shape == (1, 61, 32)
    assert isinstance(model.blocks, nn.ModuleList) and len(model.blocks) == 2
    assert isinstance(model.input_proj, nn.Linear) and model.input_proj.in_features == 1
    assert isinstance(model.norm, nn.LayerNorm) and isinstance(model.head, nn.Linear)
    assert model.head.out_features == 1
    big = ref.TransformerClassifier(input_size=3, d_model=16, num_heads=2, num_layers=3, max_len=301)
    assert len(big.blocks) == 3 and big.pos_enc.pe.shape == (1, 301, 16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,S,num_layers,num_heads", [(5, 60, 2, 4), (1, 1, 1, 1), (3, 20, 3, 8)])
def test_classifier_matches_builtin_encoder(device, dtype, B, S, num_layers, num_heads):
    """logits = head(LN(encoder(PE([CLS; x W + b])))[:, 0]) with nn.TransformerEncoder (pre-norm, GELU)
    holding copied weights, in eval mode; return_attn gives num_layers weights (B, H, S+1, S+1), rows
    summing to 1; tolerance float32 1e-4, float64 1e-9."""
    torch.manual_seed(S + num_layers)
    model = ref.TransformerClassifier(num_heads=num_heads, num_layers=num_layers).to(device=device, dtype=dtype)
    model.eval()
    x = torch.randn(B, S, 1, dtype=dtype, device=device)
    logits = model(x)
    logits2, attn = model(x, return_attn=True)
    assert logits.shape == (B, 1) and logits.dtype == dtype and logits.device.type == device
    assert isinstance(attn, list) and len(attn) == num_layers
    for w in attn:
        assert w.shape == (B, num_heads, S + 1, S + 1)
        assert_close(w.sum(-1), torch.ones(B, num_heads, S + 1, dtype=dtype, device=device), dtype)
    assert_close(logits, logits2, dtype)

    layers = [torch_encoder_layer(b, 32, num_heads, 128).to(device) for b in model.blocks]
    with torch.no_grad():
        h = torch.cat([model.cls_token.expand(B, -1, -1), model.input_proj(x)], dim=1)  # (B, S+1, 32)
        h = h + ref.PositionalEncoding(32, 61).pe[0, :S + 1].to(device=device, dtype=dtype)
        for layer in layers:
            h = layer.eval()(h)
        expect = model.head(model.norm(h)[:, 0])
    assert_close(logits.detach(), expect, dtype, loose=True)


def test_classifier_reads_only_cls():
    """The logit is head(norm(h)[:, 0]) for the model's own final hidden states (atol 1e-6), and the last
    input step, 60 positions from CLS, still moves it: every position reaches CLS in one hop."""
    torch.manual_seed(0)
    model = ref.TransformerClassifier().eval()
    x = torch.randn(4, 60, 1)
    captured = []
    handle = model.norm.register_forward_hook(lambda m, i, o: captured.append(o) and None)
    logits = model(x)
    handle.remove()
    assert captured[0].shape == (4, 61, 32)
    torch.testing.assert_close(logits, model.head(captured[0][:, 0]), atol=1e-6, rtol=0)
    x2 = x.clone()
    x2[:, -1] += 1.0
    assert (model(x2) - logits).abs().max() > 1e-6  # every step reaches CLS in one hop


def test_classifier_gradients_flow_everywhere():
    """One BCE backward gives a non-zero gradient to every parameter, CLS token included."""
    torch.manual_seed(0)
    model = ref.TransformerClassifier()
    X, y = ref.make_memory_dataset(32, 60, seed=0)
    F.binary_cross_entropy_with_logits(model(X), y).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


# The memory-task experiment is graded: grading the reference solution trains it (tests/test_grading.py).
