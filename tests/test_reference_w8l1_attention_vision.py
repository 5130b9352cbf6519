"""Reference solution of w8l1_attention_vision against its oracles, the lecture's identities, and its experiments.

Oracles: F.mse_loss; an nn.Sequential autoencoder with copied weights; the statistics of the noise;
torch.linalg.svd and sklearn's PCA (subspaces, not signs); the projector's algebra; scipy's
subspace_angles; nn.Embedding + nn.GRU with copied weights run one row at a time; einsum and
F.cosine_similarity for the scores, with the identities of the lecture's Section 7;
F.scaled_dot_product_attention with a length-1 query and nn.MultiheadAttention with identity projections.
Tolerances are stated per test: float32 atol/rtol 1e-5 (1e-4 through a GRU or an SVD), float64 1e-10.
"""
import math

import numpy as np
import pytest
import scipy.linalg
import scipy.stats
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.decomposition import PCA

import solutions.w8l1_attention_vision as ref
from tests.tolerances import assert_close

AID = "w8l1_attention_vision"
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.float64]


def randn(*shape, gen, dtype, device, requires_grad=False):
    """Standard normal drawn on the CPU generator, then moved: the same numbers on every device."""
    x = torch.randn(*shape, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
    return x.requires_grad_(requires_grad)


def grads(out, inputs, seed=0):
    """Gradients of <out, R> for a fixed random R: a full vector-Jacobian product, not just of a sum."""
    R = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.autograd.grad((out * R.to(out)).sum(), inputs)


def padding_mask(B, T, gen, device):
    """(B, T) bool, True = real token: each row a random length >= 1, padding at the end."""
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    lengths[0] = T                                   # one full row
    return (torch.arange(T) < lengths[:, None]).to(device), lengths


# ---------------------------------------------------------------------------------------------
# 2. mse_loss, AutoEncoder
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7,), (5, 784), (2, 3, 11)])
def test_mse_loss_matches_torch(device, dtype, shape):
    """Value and both gradients against F.mse_loss (tolerance per dtype)."""
    gen = torch.Generator().manual_seed(len(shape))
    a = randn(*shape, gen=gen, dtype=dtype, device=device, requires_grad=True)
    b = randn(*shape, gen=gen, dtype=dtype, device=device, requires_grad=True)
    got, want = ref.mse_loss(a, b), F.mse_loss(a, b)
    assert got.shape == () and got.dtype == dtype and got.device.type == device
    assert_close(got, want, dtype)
    for g_got, g_want in zip(torch.autograd.grad(got, (a, b)), torch.autograd.grad(want, (a, b)), strict=True):
        assert_close(g_got, g_want, dtype)


def _sequential_copy(ae, k, hidden):
    """The spec's architecture written out as one nn.Sequential, weights copied in order."""
    seq = nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, k),
                        nn.Linear(k, hidden), nn.ReLU(), nn.Linear(hidden, 784), nn.Sigmoid())
    src = list(ae.parameters())
    assert [p.shape for p in src] == [p.shape for p in seq.parameters()]
    with torch.no_grad():
        for p, q in zip(seq.parameters(), src, strict=True):
            p.copy_(q)
    return seq.to(src[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k,hidden", [(32, 256), (2, 64), (16, 8)])
def test_autoencoder_matches_sequential(device, dtype, k, hidden):
    """Same output as an nn.Sequential with copied weights; outputs in (0, 1); attrs encoder/decoder."""
    torch.manual_seed(k)
    ae = ref.AutoEncoder(k, hidden).to(device=device, dtype=dtype)
    assert isinstance(ae.encoder, nn.Module) and isinstance(ae.decoder, nn.Module)
    x = torch.rand(6, 784, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(device, dtype)
    out = ae(x)
    assert out.shape == (6, 784) and out.dtype == dtype and out.device.type == device
    assert_close(out, _sequential_copy(ae, k, hidden)(x), dtype)
    assert ae.encoder(x).shape == (6, k)
    assert (out > 0).all() and (out < 1).all()


def test_autoencoder_parameter_count():
    """k = 32, hidden 256: the lecture's 419,120 parameters."""
    assert sum(p.numel() for p in ref.AutoEncoder(32).parameters()) == 419120


# ---------------------------------------------------------------------------------------------
# 3. corrupt
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sigma", [0.1, 0.5, 1.5])
def test_corrupt_noise_statistics(device, dtype, sigma):
    """(corrupt(x) - x) / sigma is N(0, 1): mean within 5 standard errors, std within 2%, KS p > 1e-3."""
    x = torch.rand(200, 784, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(device, dtype)
    y = ref.corrupt(x, sigma, generator=torch.Generator().manual_seed(2))
    assert y.shape == x.shape and y.dtype == dtype and y.device.type == device
    eps = ((y - x) / sigma).double().cpu().flatten()
    n = eps.numel()
    assert abs(eps.mean().item()) < 5 / math.sqrt(n)
    assert abs(eps.std().item() - 1) < 0.02
    assert scipy.stats.kstest(eps[:20000].numpy(), "norm").pvalue > 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_corrupt_properties(device):
    """sigma = 0 gives x's values exactly; a seeded generator reproduces the draw; x is not modified."""
    x = torch.rand(4, 784, generator=torch.Generator().manual_seed(0)).to(device)
    x0 = x.clone()
    assert torch.equal(ref.corrupt(x, 0.0), x)
    a = ref.corrupt(x, 0.5, generator=torch.Generator().manual_seed(7))
    b = ref.corrupt(x, 0.5, generator=torch.Generator().manual_seed(7))
    c = ref.corrupt(x, 0.5, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.allclose(a, c)
    assert torch.equal(x, x0)
    # the noise does not depend on the data: the same draw corrupts a different x by the same amount
    assert torch.allclose(ref.corrupt(x + 1, 0.5, generator=torch.Generator().manual_seed(7)) - 1, a, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# 4. pca, projector, principal_angle_cosines, LinearAE, train_linear_ae
# ---------------------------------------------------------------------------------------------

def low_rank_data(m, d, r, gen, dtype, device):
    """Centred data with a clear spectrum: r strong directions of decreasing scale plus small noise."""
    scales = torch.linspace(3.0, 1.0, r, dtype=torch.float64)
    X = (torch.randn(m, r, generator=gen, dtype=torch.float64) * scales) @ torch.randn(
        r, d, generator=gen, dtype=torch.float64) + 0.05 * torch.randn(m, d, generator=gen, dtype=torch.float64)
    X = X - X.mean(0, keepdim=True)
    return X.to(device=device, dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,d,k", [(300, 20, 3), (50, 80, 5), (1000, 64, 16)])
def test_pca_matches_svd_and_sklearn(device, dtype, m, d, k):
    """Subspace (projector) and error against torch.linalg.svd and sklearn PCA; err is also the direct
    mean per-row reconstruction error. float32 1e-4, float64 1e-8 relative."""
    X = low_rank_data(m, d, k + 2, torch.Generator().manual_seed(m), dtype, device)
    V_k, err = ref.pca(X, k)
    assert V_k.shape == (d, k) and V_k.dtype == dtype and V_k.device.type == device
    assert err.shape == () and err.dtype == dtype
    X64 = X.double().cpu()
    # orthonormal columns
    assert_close(V_k.mT @ V_k, torch.eye(k, dtype=dtype, device=device), dtype, loose=True)
    # torch.linalg.svd of X / sqrt(m)
    _, S, Vh = torch.linalg.svd(X64 / math.sqrt(m), full_matrices=False)
    P_svd = Vh[:k].T @ Vh[:k]
    P = (V_k @ V_k.mT).double().cpu()
    assert_close(P, P_svd, torch.float64, loose=dtype == torch.float64) if dtype == torch.float64 else \
        torch.testing.assert_close(P, P_svd, atol=1e-4, rtol=1e-4)
    assert math.isclose(err.item(), (S[k:] ** 2).sum().item(), rel_tol=1e-4 if dtype == torch.float32 else 1e-8)
    # the direct reconstruction error: Eckart-Young's bookkeeping
    direct = ((X64 - X64 @ P_svd) ** 2).sum(1).mean().item()
    assert math.isclose(err.item(), direct, rel_tol=1e-4 if dtype == torch.float32 else 1e-8)
    # sklearn: same subspace; explained_variance_ uses 1 / (m - 1), err uses 1 / m
    sk = PCA(n_components=min(m, d)).fit(X64.numpy())
    P_sk = torch.from_numpy(sk.components_[:k].T @ sk.components_[:k])
    torch.testing.assert_close(P, P_sk, atol=1e-4 if dtype == torch.float32 else 1e-8, rtol=0)
    err_sk = sk.explained_variance_[k:].sum() * (m - 1) / m
    assert math.isclose(err.item(), err_sk, rel_tol=1e-4 if dtype == torch.float32 else 1e-8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,d,k", [((), 10, 3), ((), 784, 16), ((4,), 12, 5), ((2, 3), 6, 1)])
def test_projector_algebra(device, dtype, batch, d, k):
    """P^2 = P, P^T = P, P W = W, trace k, P = V V^T for an orthonormal basis V, and P(W R) = P(W)."""
    gen = torch.Generator().manual_seed(d + k)
    W = randn(*batch, d, k, gen=gen, dtype=dtype, device=device)
    P = ref.projector(W)
    assert P.shape == (*batch, d, d) and P.dtype == dtype and P.device.type == device
    assert_close(P @ P, P, dtype, loose=True)
    assert_close(P.mT, P, dtype, loose=True)
    assert_close(P @ W, W, dtype, loose=True)
    assert_close(torch.diagonal(P, dim1=-2, dim2=-1).sum(-1), torch.full(batch, float(k), dtype=dtype, device=device),
                 dtype, loose=True)
    V, _ = torch.linalg.qr(W.double())
    assert_close(P.double(), V @ V.mT, torch.float64, loose=True) if dtype == torch.float64 else \
        torch.testing.assert_close(P.double(), V @ V.mT, atol=1e-4, rtol=1e-4)
    R = randn(*batch, k, k, gen=gen, dtype=dtype, device=device) + 3 * torch.eye(k, dtype=dtype, device=device)
    assert_close(ref.projector(W @ R), P, dtype, loose=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d,k1,k2", [(10, 3, 3), (20, 2, 5), (784, 16, 16), (8, 4, 2)])
def test_principal_angle_cosines_match_scipy(device, dtype, d, k1, k2):
    """cos of scipy.linalg.subspace_angles, descending, count min(k1, k2); float32 1e-5, float64 1e-10."""
    gen = torch.Generator().manual_seed(d * k1 + k2)
    W = randn(d, k1, gen=gen, dtype=dtype, device=device)
    V = randn(d, k2, gen=gen, dtype=dtype, device=device)
    V[:, 0] = W[:, 0] + 0.1 * V[:, 0]           # one small angle, so the spectrum is not all near zero
    c = ref.principal_angle_cosines(W, V)
    assert c.shape == (min(k1, k2),) and c.dtype == dtype and c.device.type == device
    want = np.sort(np.cos(scipy.linalg.subspace_angles(W.double().cpu().numpy(), V.double().cpu().numpy())))[::-1]
    torch.testing.assert_close(c.double().cpu(), torch.from_numpy(want.copy()),
                               atol=1e-5 if dtype == torch.float32 else 1e-10, rtol=0)
    assert (c[:-1] >= c[1:]).all()


@pytest.mark.parametrize("device", DEVICES)
def test_principal_angle_cosines_extremes(device):
    """Same subspace in another basis: all ones; orthogonal subspaces: all zeros."""
    gen = torch.Generator().manual_seed(0)
    W = randn(12, 4, gen=gen, dtype=torch.float64, device=device)
    R = randn(4, 4, gen=gen, dtype=torch.float64, device=device) + 3 * torch.eye(4, dtype=torch.float64, device=device)
    torch.testing.assert_close(ref.principal_angle_cosines(W, W @ R), torch.ones(4, dtype=torch.float64, device=device),
                               atol=1e-10, rtol=0)
    E = torch.eye(12, dtype=torch.float64, device=device)
    torch.testing.assert_close(ref.principal_angle_cosines(E[:, :4], E[:, 4:7]),
                               torch.zeros(3, dtype=torch.float64, device=device), atol=1e-12, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_ae_is_two_bias_free_maps(device, dtype):
    """We: n_in -> k, Wd: k -> n_in, no biases; forward is x We^T Wd^T."""
    torch.manual_seed(0)
    net = ref.LinearAE(5, n_in=30).to(device=device, dtype=dtype)
    assert net.We.bias is None and net.Wd.bias is None
    assert net.We.weight.shape == (5, 30) and net.Wd.weight.shape == (30, 5)
    assert len(list(net.parameters())) == 2
    x = randn(7, 30, gen=torch.Generator().manual_seed(1), dtype=dtype, device=device)
    out = net(x)
    assert out.shape == (7, 30) and out.dtype == dtype
    assert_close(out, x @ net.We.weight.T @ net.Wd.weight.T, dtype)
    assert ref.LinearAE(16).We.weight.shape == (16, 784)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch", [None, 128])
def test_train_linear_ae_reaches_pca(device, batch):
    """On a small centred problem the trained AE reaches PCA's error within 1% (full batch) / 3% (minibatch),
    spans the PCA subspace (projector distance < 0.05 / 0.2 with minibatch noise), returns a LinearAE on X's
    device and dtype, and is reproducible under its seed."""
    X = low_rank_data(400, 20, 6, torch.Generator().manual_seed(3), torch.float32, device)
    net = ref.train_linear_ae(X, 3, steps=600, lr=1e-2, batch=batch, seed=0)
    assert isinstance(net, ref.LinearAE)
    assert net.We.weight.shape == (3, 20) and net.We.weight.device.type == device
    assert net.We.weight.dtype == torch.float32
    X64 = X.double().cpu()
    V_k, err_pca = ref.pca(X64, 3)
    We, Wd = net.We.weight.detach().double().cpu(), net.Wd.weight.detach().double().cpu()
    err = ((X64 - X64 @ We.T @ Wd.T) ** 2).sum(1).mean()
    gap = ((err - err_pca) / err_pca).item()
    assert -1e-6 < gap < (0.01 if batch is None else 0.03), gap
    assert torch.linalg.matrix_norm(ref.projector(Wd) - V_k @ V_k.T) < (0.05 if batch is None else 0.2)
    again = ref.train_linear_ae(X, 3, steps=600, lr=1e-2, batch=batch, seed=0)
    assert torch.equal(again.Wd.weight, net.Wd.weight)


def test_train_linear_ae_float64():
    """The returned model follows X's dtype."""
    X = low_rank_data(100, 10, 3, torch.Generator().manual_seed(0), torch.float64, "cpu")
    assert ref.train_linear_ae(X, 2, steps=3, lr=1e-2).Wd.weight.dtype == torch.float64


# ---------------------------------------------------------------------------------------------
# GRUEncoder
# ---------------------------------------------------------------------------------------------

def _gru_copy(enc, n_tokens, d):
    """nn.Embedding + bidirectional nn.GRU with the encoder's weights, copied in registration order."""
    emb = nn.Embedding(n_tokens, d)
    gru = nn.GRU(d, d // 2, batch_first=True, bidirectional=True)
    src = list(enc.parameters())
    dst = list(emb.parameters()) + list(gru.parameters())
    assert [p.shape for p in src] == [p.shape for p in dst]
    with torch.no_grad():
        for p, q in zip(dst, src, strict=True):
            p.copy_(q)
    return emb.to(src[0]), gru.to(src[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T,d", [(5, 9, 32), (3, 4, 8), (1, 1, 6)])
def test_gru_encoder_padded_batch_matches_rows_alone(device, dtype, B, T, d):
    """Padded batch vs a copied nn.GRU run on each row alone (no padding): H on real tokens, 0 on padding;
    h_T = [forward state at the last real token; backward state at the first]. float32 1e-4, float64 1e-10."""
    n_tokens = 12
    torch.manual_seed(B * T + d)
    enc = ref.GRUEncoder(n_tokens, d).to(device=device, dtype=dtype)
    emb, gru = _gru_copy(enc, n_tokens, d)
    gen = torch.Generator().manual_seed(T)
    mask, lengths = padding_mask(B, T, gen, device)
    x = torch.randint(0, 10, (B, T), generator=gen).to(device).masked_fill(~mask, 10)
    H, h_T = enc(x, lengths.to(device))
    assert H.shape == (B, T, d) and h_T.shape == (B, d)
    assert H.dtype == dtype and h_T.device.type == device
    half = d // 2
    for i in range(B):
        Li = int(lengths[i])
        H_i, h_n = gru(emb(x[i:i + 1, :Li]))                     # (1, Li, d), (2, 1, d // 2)
        assert_close(H[i, :Li], H_i[0], dtype, loose=True)
        assert (H[i, Li:] == 0).all()
        assert_close(h_T[i], torch.cat([H_i[0, Li - 1, :half], H_i[0, 0, half:]]), dtype, loose=True)
        assert_close(h_T[i], torch.cat([h_n[0, 0], h_n[1, 0]]), dtype, loose=True)


@pytest.mark.parametrize("device", DEVICES)
def test_gru_encoder_padding_content_and_no_lengths(device):
    """What sits in the padding never matters; lengths=None treats every token as real."""
    torch.manual_seed(0)
    enc = ref.GRUEncoder(12, 16).to(device)
    gen = torch.Generator().manual_seed(1)
    mask, lengths = padding_mask(6, 10, gen, device)
    x = torch.randint(0, 10, (6, 10), generator=gen).to(device)
    H1, h1 = enc(x.masked_fill(~mask, 10), lengths.to(device))
    H2, h2 = enc(x.masked_fill(~mask, 3), lengths.to(device))
    torch.testing.assert_close(H1, H2, atol=0, rtol=0)
    torch.testing.assert_close(h1, h2, atol=0, rtol=0)
    H_full, h_full = enc(x)
    H_len, h_len = enc(x, torch.full((6,), 10, device=device))
    torch.testing.assert_close(H_full, H_len, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(h_full, h_len, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(h_full, torch.cat([H_full[:, -1, :8], H_full[:, 0, 8:]], -1), atol=0, rtol=0)


def test_gru_encoder_size_independent_of_length():
    """The lecture's count: 5,184 parameters at (12, 32), and h_T has width d for any T."""
    enc = ref.GRUEncoder(12, 32)
    assert sum(p.numel() for p in enc.parameters()) == 5184
    for T in (5, 50, 500):
        assert enc(torch.randint(0, 10, (2, T)))[1].shape == (2, 32)


def test_gru_encoder_gradients_match_copy():
    """Gradients w.r.t. every weight through a padded batch equal the per-row reference's (float64, 1e-10)."""
    torch.manual_seed(3)
    enc = ref.GRUEncoder(12, 8).double()
    emb, gru = _gru_copy(enc, 12, 8)
    gen = torch.Generator().manual_seed(4)
    mask, lengths = padding_mask(4, 6, gen, "cpu")
    x = torch.randint(0, 10, (4, 6), generator=gen).masked_fill(~mask, 10)
    H, h_T = enc(x, lengths)
    g_got = grads(torch.cat([H.flatten(), h_T.flatten()]), list(enc.parameters()))
    H_ref = torch.zeros(4, 6, 8, dtype=torch.float64)
    h_ref = []
    for i in range(4):
        Li = int(lengths[i])
        Hi, h_n = gru(emb(x[i:i + 1, :Li]))
        H_ref = H_ref.index_put((torch.tensor([i]), torch.arange(Li)), Hi[0])
        h_ref.append(torch.cat([h_n[0, 0], h_n[1, 0]]))
    g_want = grads(torch.cat([H_ref.flatten(), torch.stack(h_ref).flatten()]),
                   list(emb.parameters()) + list(gru.parameters()))
    for a, b in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


# ---------------------------------------------------------------------------------------------
# 7. Score functions
# ---------------------------------------------------------------------------------------------

SCORE_SHAPES = [((4,), 7, 16), ((2, 3), 5, 8), ((1,), 1, 4)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,T,d", SCORE_SHAPES)
def test_scores_match_einsum_and_cosine_similarity(device, dtype, batch, T, d):
    """dot, scaled, general, cosine, additive against einsum / F.cosine_similarity, values and gradients."""
    gen = torch.Generator().manual_seed(T * d)
    s = randn(*batch, d, gen=gen, dtype=dtype, device=device, requires_grad=True)
    H = randn(*batch, T, d, gen=gen, dtype=dtype, device=device, requires_grad=True)
    W_a = randn(d, d, gen=gen, dtype=dtype, device=device, requires_grad=True)
    k = 6
    W_add = randn(k, 2 * d, gen=gen, dtype=dtype, device=device, requires_grad=True)
    v_a = randn(k, gen=gen, dtype=dtype, device=device, requires_grad=True)
    pair = torch.cat([s.unsqueeze(-2).expand(*batch, T, d), H], dim=-1)     # [s; h_t], (..., T, 2d)
    cases = [
        (ref.score_dot(s, H), torch.einsum("...d,...td->...t", s, H), (s, H)),
        (ref.score_scaled(s, H), torch.einsum("...d,...td->...t", s, H) / math.sqrt(d), (s, H)),
        (ref.score_general(s, H, W_a), torch.einsum("...d,de,...te->...t", s, W_a, H), (s, H, W_a)),
        (ref.score_cosine(s, H), F.cosine_similarity(s.unsqueeze(-2), H, dim=-1), (s, H)),
        (ref.score_additive(s, H, W_add, v_a), torch.tanh(pair @ W_add.mT) @ v_a, (s, H, W_add, v_a)),
    ]
    for got, want, inputs in cases:
        assert got.shape == (*batch, T) and got.dtype == dtype and got.device.type == device
        assert_close(got, want, dtype)
        for g_got, g_want in zip(grads(got, inputs), grads(want, inputs), strict=True):
            assert_close(g_got, g_want, dtype, loose=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_score_identities_of_section_7(dtype):
    """dot = general with W_a = I; cosine = dot on unit vectors; scaled = dot / sqrt(d) with the same argmax;
    location ignores H; additive linearised is f(s) + g(h), so its softmax ignores s."""
    gen = torch.Generator().manual_seed(7)
    B, T, d, k = 4, 7, 16, 12
    s, H = randn(B, d, gen=gen, dtype=dtype, device="cpu"), randn(B, T, d, gen=gen, dtype=dtype, device="cpu")
    eye = torch.eye(d, dtype=dtype)
    assert_close(ref.score_general(s, H, eye), ref.score_dot(s, H), dtype)
    assert_close(ref.score_cosine(s, H), ref.score_dot(F.normalize(s, dim=-1), F.normalize(H, dim=-1)), dtype)
    assert_close(ref.score_scaled(s, H) * math.sqrt(d), ref.score_dot(s, H), dtype)
    assert torch.equal(ref.score_scaled(s, H).argmax(-1), ref.score_dot(s, H).argmax(-1))
    # cosine scores are bounded by 1 in absolute value
    assert (ref.score_cosine(s, H).abs() <= 1 + 1e-6).all()
    # additive with small inputs: v^T W_s s + v^T W_h h to first order
    W_add, v_a = randn(k, 2 * d, gen=gen, dtype=dtype, device="cpu"), randn(k, gen=gen, dtype=dtype, device="cpu")
    small = 1e-4
    lin = (small * s) @ W_add[:, :d].T @ v_a
    lin = lin[:, None] + (small * H) @ W_add[:, d:].T @ v_a                # (B, T)
    torch.testing.assert_close(ref.score_additive(small * s, small * H, W_add, v_a), lin,
                               atol=1e-9 if dtype == torch.float64 else 1e-6, rtol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,T,d", SCORE_SHAPES)
def test_alpha_location(device, dtype, batch, T, d):
    """softmax(W_loc s) against einsum + softmax; rows are distributions; the weights never see H."""
    gen = torch.Generator().manual_seed(T + d)
    s = randn(*batch, d, gen=gen, dtype=dtype, device=device, requires_grad=True)
    W_loc = randn(T, d, gen=gen, dtype=dtype, device=device, requires_grad=True)
    got = ref.alpha_location(s, W_loc)
    want = torch.softmax(torch.einsum("td,...d->...t", W_loc, s), dim=-1)
    assert got.shape == (*batch, T) and got.dtype == dtype and got.device.type == device
    assert_close(got, want, dtype)
    for a, b in zip(grads(got, (s, W_loc)), grads(want, (s, W_loc)), strict=True):
        assert_close(a, b, dtype, loose=True)
    assert_close(got.sum(-1), torch.ones(batch, dtype=dtype, device=device), dtype)
    assert (got >= 0).all()


def test_score_parameter_shapes():
    """The lecture's table at d = 16, k = 12, T = 7: the parametrised scores take W_a (d, d) = 256 numbers,
    W_a (k, 2d) + v_a (k,) = 2dk + k = 396, W_loc (T, d) = 112, and all give (B, T)."""
    d, k, T = 16, 12, 7
    W_gen, W_add, v_a, W_loc = torch.randn(d, d), torch.randn(k, 2 * d), torch.randn(k), torch.randn(T, d)
    assert W_gen.numel() == 256 and W_add.numel() + v_a.numel() == 396 and W_loc.numel() == 112
    s, H = torch.randn(2, d), torch.randn(2, T, d)
    assert ref.score_general(s, H, W_gen).shape == (2, T)
    assert ref.score_additive(s, H, W_add, v_a).shape == (2, T)
    assert ref.alpha_location(s, W_loc).shape == (2, T)


# ---------------------------------------------------------------------------------------------
# 6. attention_context
# ---------------------------------------------------------------------------------------------

def _mha_identity(d, device, dtype):
    """nn.MultiheadAttention, one head, Q = K = V = input, output projection I."""
    mha = nn.MultiheadAttention(d, 1, bias=False, batch_first=True).to(device=device, dtype=dtype)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.eye(d, dtype=dtype).repeat(3, 1))
        mha.out_proj.weight.copy_(torch.eye(d, dtype=dtype))
    return mha


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T,d", [(4, 7, 16), (1, 1, 8), (3, 12, 32)])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_context_matches_sdpa(device, dtype, B, T, d, masked):
    """With scaled scores, c = F.scaled_dot_product_attention(s[:, None], H, H)[:, 0] (bool mask True = real);
    padding gets exactly 0; values and gradients w.r.t. s and H."""
    gen = torch.Generator().manual_seed(B * T)
    s = randn(B, d, gen=gen, dtype=dtype, device=device, requires_grad=True)
    H = randn(B, T, d, gen=gen, dtype=dtype, device=device, requires_grad=True)
    mask = padding_mask(B, T, gen, device)[0] if masked else None
    c, alpha = ref.attention_context(ref.score_scaled(s, H), H, mask)
    assert c.shape == (B, d) and alpha.shape == (B, T) and c.dtype == dtype and c.device.type == device
    attn_mask = None if mask is None else mask[:, None, :]                 # (B, 1, T): the one query's keys
    c_ref = F.scaled_dot_product_attention(s[:, None, :], H, H, attn_mask=attn_mask)[:, 0]
    assert_close(c, c_ref, dtype)
    for a, b in zip(grads(c, (s, H)), grads(c_ref, (s, H)), strict=True):
        assert_close(a, b, dtype, loose=True)
    if mask is not None:
        assert (alpha[~mask] == 0).all()
    assert_close(alpha.sum(-1), torch.ones(B, dtype=dtype, device=device), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_context_matches_multihead(device, dtype):
    """Context and weights against nn.MultiheadAttention (one head, identity projections), with padding."""
    B, T, d = 5, 9, 16
    gen = torch.Generator().manual_seed(11)
    s = randn(B, d, gen=gen, dtype=dtype, device=device)
    H = randn(B, T, d, gen=gen, dtype=dtype, device=device)
    mask, _ = padding_mask(B, T, gen, device)
    c, alpha = ref.attention_context(ref.score_scaled(s, H), H, mask)
    with torch.no_grad():
        c_mha, a_mha = _mha_identity(d, device, dtype)(s[:, None], H, H, key_padding_mask=~mask)
    assert_close(c, c_mha[:, 0], dtype)
    assert_close(alpha, a_mha[:, 0], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_context_properties(dtype):
    """Weights are a distribution; c lies in the convex hull (|c| <= max |h_j|); padding content is ignored;
    a row with no real token gives zero weights and no NaN; batch dims are arbitrary."""
    gen = torch.Generator().manual_seed(5)
    scores = randn(2, 3, 6, gen=gen, dtype=dtype, device="cpu")
    H = randn(2, 3, 6, 4, gen=gen, dtype=dtype, device="cpu")
    mask = torch.ones(2, 3, 6, dtype=torch.bool)
    mask[0, 1, 4:] = False
    mask[1, 2, :] = False                                                  # nothing real in this row
    c, alpha = ref.attention_context(scores, H, mask)
    assert c.shape == (2, 3, 4) and alpha.shape == (2, 3, 6)
    assert torch.isfinite(c).all() and torch.isfinite(alpha).all()
    assert (alpha[1, 2] == 0).all() and (c[1, 2] == 0).all()
    ok = mask.any(-1)
    assert_close(alpha.sum(-1)[ok], torch.ones(int(ok.sum()), dtype=dtype), dtype)
    assert (c.norm(dim=-1) <= H.norm(dim=-1).amax(-1) + 1e-6).all()
    H2 = H.clone()
    H2[0, 1, 4:] = 1e3                                                     # garbage in the padding
    scores2 = scores.clone()
    scores2[0, 1, 4:] = 1e3
    c2, _ = ref.attention_context(scores2, H2, mask)
    assert_close(c2, c, dtype)
    c_nomask, _ = ref.attention_context(scores, H)
    assert_close(c_nomask, torch.einsum("...t,...td->...d", torch.softmax(scores, -1), H), dtype)


# ---------------------------------------------------------------------------------------------
# 8. unroll_annotations, spatial_attention
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,C,Hh,Ww", [(1, 512, 14, 14), (2, 30, 8, 8), (3, 5, 2, 7)])
def test_unroll_annotations(device, dtype, N, C, Hh, Ww):
    """(N, C, H, W) -> (N, H*W, C); annotation i*W + j is the channel vector at grid cell (i, j)."""
    vol = randn(N, C, Hh, Ww, gen=torch.Generator().manual_seed(C), dtype=dtype, device=device)
    A = ref.unroll_annotations(vol)
    assert A.shape == (N, Hh * Ww, C) and A.dtype == dtype and A.device.type == device
    torch.testing.assert_close(A, vol.permute(0, 2, 3, 1).reshape(N, Hh * Ww, C), atol=0, rtol=0)
    i, j = Hh - 1, Ww // 2
    torch.testing.assert_close(A[:, i * Ww + j], vol[:, :, i, j], atol=0, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,L,d", [(4, 64, 32), (1, 196, 16), (3, 5, 8)])
def test_spatial_attention_matches_einsum(device, dtype, B, L, d):
    """alpha = softmax_l(s^T W_a a_l), ctx = sum_l alpha_l a_l against einsum; values and gradients."""
    gen = torch.Generator().manual_seed(L)
    s = randn(B, d, gen=gen, dtype=dtype, device=device, requires_grad=True)
    A = randn(B, L, d, gen=gen, dtype=dtype, device=device, requires_grad=True)
    W_a = randn(d, d, gen=gen, dtype=dtype, device=device, requires_grad=True) / math.sqrt(d)
    ctx, alpha = ref.spatial_attention(s, A, W_a)
    assert ctx.shape == (B, d) and alpha.shape == (B, L) and ctx.dtype == dtype and ctx.device.type == device
    a_ref = torch.softmax(torch.einsum("bd,de,ble->bl", s, W_a, A), dim=-1)
    c_ref = torch.einsum("bl,bld->bd", a_ref, A)
    assert_close(alpha, a_ref, dtype)
    assert_close(ctx, c_ref, dtype)
    for a, b in zip(grads(ctx, (s, A)), grads(c_ref, (s, A)), strict=True):
        assert_close(a, b, dtype, loose=True)
    assert_close(alpha.sum(-1), torch.ones(B, dtype=dtype, device=device), dtype)


# ---------------------------------------------------------------------------------------------
# 10. hard_attention, local_attention, self_attention
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5,), (4, 7), (2, 3, 12)])
def test_hard_attention(device, dtype, shape):
    """One-hot at the argmax, same shape and dtype; the beta -> infinity limit of softmax(beta * scores)."""
    scores = randn(*shape, gen=torch.Generator().manual_seed(shape[-1]), dtype=dtype, device=device)
    alpha = torch.softmax(scores, -1)
    h = ref.hard_attention(alpha)
    assert h.shape == alpha.shape and h.dtype == dtype and h.device.type == device
    torch.testing.assert_close(h, F.one_hot(alpha.argmax(-1), shape[-1]).to(dtype), atol=0, rtol=0)
    assert ((h == 0) | (h == 1)).all() and (h.sum(-1) == 1).all()
    torch.testing.assert_close(torch.softmax(1e4 * scores, -1), h, atol=1e-3, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [0, 1, 2, 11])
def test_local_attention_definition(device, dtype, D):
    """Zero beyond |j - centre| > D, the kept weights rescaled to sum 1 (float32 1e-5, float64 1e-10)."""
    B, T = 6, 12
    gen = torch.Generator().manual_seed(D)
    alpha = torch.softmax(randn(B, T, gen=gen, dtype=dtype, device=device), -1)
    centre = torch.randint(0, T, (B,), generator=gen).to(device)
    out = ref.local_attention(alpha, centre, D)
    assert out.shape == (B, T) and out.dtype == dtype and out.device.type == device
    keep = (torch.arange(T, device=device) - centre[:, None]).abs() <= D
    want = alpha * keep / (alpha * keep).sum(-1, keepdim=True)
    assert_close(out, want, dtype)
    assert (out[~keep] == 0).all()
    assert_close(out.sum(-1), torch.ones(B, dtype=dtype, device=device), dtype)


def test_local_attention_limits():
    """D >= T - 1 is global attention; D = 0 at the argmax is hard attention; the ratios inside the window are kept."""
    alpha = torch.softmax(torch.randn(5, 9, generator=torch.Generator().manual_seed(0)), -1)
    centre = alpha.argmax(-1)
    torch.testing.assert_close(ref.local_attention(alpha, centre, 8), alpha)
    torch.testing.assert_close(ref.local_attention(alpha, centre, 0), ref.hard_attention(alpha))
    out = ref.local_attention(alpha, torch.full((5,), 4), 2)
    torch.testing.assert_close(out[:, 3] / out[:, 4], alpha[:, 3] / alpha[:, 4])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,T,d", [((), 12, 32), ((3,), 5, 8), ((2, 2), 1, 4)])
def test_self_attention_matches_multihead(device, dtype, batch, T, d):
    """Z and A against nn.MultiheadAttention (one head, identity projections) and F.scaled_dot_product_attention;
    gradients w.r.t. H against the SDPA path."""
    H = randn(*batch, T, d, gen=torch.Generator().manual_seed(T * d), dtype=dtype, device=device, requires_grad=True)
    Z, A = ref.self_attention(H)
    assert Z.shape == (*batch, T, d) and A.shape == (*batch, T, T) and Z.dtype == dtype and Z.device.type == device
    flat = H.reshape(-1, T, d)                                              # (B', T, d)
    with torch.no_grad():
        Z_m, A_m = _mha_identity(d, device, dtype)(flat, flat, flat)
    assert_close(Z.reshape(-1, T, d), Z_m, dtype)
    assert_close(A.reshape(-1, T, T), A_m, dtype)
    Z_s = F.scaled_dot_product_attention(H, H, H)
    assert_close(Z, Z_s, dtype)
    for a, b in zip(grads(Z, (H,)), grads(Z_s, (H,)), strict=True):
        assert_close(a, b, dtype, loose=True)
    assert_close(A.sum(-1), torch.ones(*batch, T, dtype=dtype, device=device), dtype)


# ---------------------------------------------------------------------------------------------
# Experiments (grader harness with the reference parts)
# ---------------------------------------------------------------------------------------------

def _harness():
    import autograder.harness.w8l1_attention_vision as h
    return h


def test_harness_registry_matches_course_and_ships_no_solution():
    """Every experiment of course.yaml's w8l1 section is registered; the harness imports nothing it may not
    and defines none of the graded items."""
    import ast

    from autograder.course.config import load_course
    from autograder.grading.experiments import harness_sources
    h = _harness()
    course = load_course().assignment(AID)
    assert set(h.EXPERIMENTS) == set(course.experiments)
    for name, spec in h.EXPERIMENTS.items():
        assert set(spec) - {"reuses"} == {"parts", "data", "build", "train", "evaluate"}, name
        assert spec.get("reuses", name) in h.EXPERIMENTS, name
        assert set(spec["parts"]) <= set(course.items), name
    for module, source in harness_sources(AID).items():  # what the sandbox loads: the shared loop, red_square
        tree = ast.parse(source)
        top = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        top |= {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and not n.level}
        assert top <= {"contextlib", "math", "time", "numpy", "torch", "torch.nn", "torch.nn.functional"}, (module, top)
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        assert not defined & set(course.items), (module, defined & set(course.items))


def test_dae_mnist_given_ae_mnists_trained_state_is_bit_for_bit_its_own_training():
    """dae_mnist's plain AE is ae_mnist's recipe (grading/shared_runs.py): loading ae_mnist's trained state instead
    of training it leaves both of dae_mnist's models bit for bit as they were (a short budget here)."""
    from autograder.grading import shared_runs
    from autograder.grading.experiments import reference_parts
    h, ref = _harness(), reference_parts(AID)
    cfg, seed = {"steps": 12}, 1
    data = {"X_train": h.mnist_data(ref, cfg, seed, "cpu")["X_train"][:512]}
    torch.manual_seed(seed)
    ae = h.build_ae(ref, cfg, seed, "cpu")
    history = h.train_ae(ae, ref, data, cfg, seed)
    assert history["global_rng_used"] is False and shared_runs.shareable(history)
    runs = []
    for given in ({}, shared_runs.as_data(shared_runs.state_of(ae))):
        torch.manual_seed(seed)
        pair = h.build_ae_pair(ref, cfg, seed, "cpu")
        h.train_ae_pair(pair, ref, {**data, **given}, cfg, seed)
        runs.append(pair.state_dict())
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    assert all(torch.equal(runs[1][f"ae.{k}"], v) for k, v in ae.state_dict().items())


def test_an_ae_that_draws_from_the_global_generator_is_never_shared():
    """Dropout in a student's AutoEncoder draws other numbers in dae_mnist's run (built after two models), so its
    ae_mnist run is not kept for dae_mnist."""
    from autograder.grading import shared_runs
    from autograder.grading.experiments import reference_parts
    h, ref = _harness(), reference_parts(AID)

    class Dropping(torch.nn.Module):
        def __init__(self, k):
            super().__init__()
            self.net = ref.AutoEncoder(k)

        def forward(self, x):
            return self.net(torch.nn.functional.dropout(x, 0.1, self.training))
    parts = type("Parts", (), {"AutoEncoder": Dropping})
    cfg = {"steps": 3}
    ae = h.build_ae(parts, cfg, 0, "cpu")
    history = h.train_ae(ae, parts, {"X_train": h.mnist_data(ref, cfg, 0, "cpu")["X_train"][:256]}, cfg, 0)
    assert history["global_rng_used"] is True and not shared_runs.shareable(history)
    shared_runs.keep("an identity", shared_runs.state_of(ae), history)
    assert shared_runs.kept("an identity") is None


def test_make_reverse_batch():
    """Targets are the inputs reversed over each row's length, PAD after it; lengths within range."""
    h = _harness()
    x, y, lens = h.make_reverse_batch(50, 1, 12, torch.Generator().manual_seed(0))
    assert x.shape == y.shape and x.shape[1] == int(lens.max()) and lens.min() >= 1 and lens.max() <= 12
    for i in range(50):
        Li = int(lens[i])
        assert torch.equal(y[i, :Li], x[i, :Li].flip(0)) and (x[i, Li:] == h.PAD).all() and (y[i, Li:] == h.PAD).all()
        assert (x[i, :Li] < 10).all()


def test_make_shapes():
    """Three objects per image, one of each colour; answers are cells 0..15; the same seed gives the same set."""
    import autograder.harness.w8l1_red_square as h
    imgs, q, a = h.make_shapes(20, 0)
    assert imgs.shape == (20, 3, 32, 32) and q.shape == a.shape == (20, 3)
    assert torch.equal(q // 3, torch.arange(3).expand(20, 3)) and (a >= 0).all() and (a < 16).all()
    assert imgs.min() >= 0 and imgs.max() <= 1
    assert torch.equal(h.make_shapes(20, 0)[0], imgs) and not torch.equal(h.make_shapes(20, 1)[0], imgs)


def _run(name):
    """run_reference with the configured seeds; prints the measured figure beside the lecture's."""
    from autograder.course.config import load_course
    from autograder.grading.experiments import run_reference
    from autograder.reports.tables import format_row
    exp = load_course().assignment(AID).experiments[name]
    r = run_reference(AID, name, device="cpu")
    steps = r.history.get("steps")
    print(f"EXPERIMENT {format_row(exp, r)}" + (f", {steps} steps" if steps is not None else ""))
    return exp, r


def ungraded_experiments():
    from autograder.course.config import load_course
    return [n for n, e in load_course().assignment(AID).experiments.items() if not e.points]


@pytest.mark.experiment
@pytest.mark.parametrize("name", ungraded_experiments())
def test_experiment(name):
    """Each ungraded experiment (the lecture's baselines and modes) through the harness with the reference parts
    meets its course.yaml thresholds within its step budget. The graded ones are trained by grading the
    reference solution (tests/test_grading.py), through the same harness in the sandbox."""
    exp, r = _run(name)
    assert r.passed, r.failures
    if "steps" in r.history:
        assert r.history["steps"] <= exp.steps
