"""Hidden checks for Week 8, Lecture 1: attention models in vision.

Oracles: F.mse_loss; the reference autoencoder with the student's weights copied in; the statistics of the noise;
torch.linalg.svd, torch.linalg.qr and sklearn's PCA (subspaces through projectors, never signs);
scipy.linalg.subspace_angles; nn.Embedding + a bidirectional nn.GRU with copied weights, run on each row alone;
einsum and F.cosine_similarity for the scores; F.scaled_dot_product_attention with a length-1 query and
nn.MultiheadAttention with identity projections for the attention step; the definitions for the modes.
Mask convention of this assignment: True = real token (may be attended).
"""
import math

import numpy as np
import scipy.linalg
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.decomposition import PCA

import solutions.w8l1_attention_vision as ref
from autograder.checks import (Fail, check_close, check_number, check_tensor, check_true,
                              check_tuple, int_seed, randn, tol)
from autograder.engine import Registry
from autograder.public_checks import SCALE_MISSING, unscaled
from autograder.sandbox import Remote, Seeded

CHECKS = Registry()
SCORE_DIMS = ("batch", "position")


def loose(s, dtype):
    """For decompositions (SVD, QR) and recurrences: float64 1e-8, float32 1e-4 (1e-3 on CUDA)."""
    if dtype == torch.float64:
        return 1e-8
    return 1e-4 if s.device == "cpu" else 1e-3


def dt(dtype):
    return str(dtype).replace("torch.", "")


def padding_mask(g, B, T):
    """(B, T) bool, True = real token; each row a random length >= 1 with padding at the end, row 0 full."""
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    return torch.arange(T)[None, :] < lengths[:, None], lengths


def is_module(got, name):
    check_true(isinstance(got, Remote), f"'{name}' is {got!r}, expected a torch.nn.Module")
    return got


# --- mse_loss ---------------------------------------------------------------------------------------

def mse_cases(g):
    yield "x (5, 784), float32", randn(g, 5, 784), torch.rand(5, 784, generator=g)
    yield "x (7,), float64", randn(g, 7, dtype=torch.float64), randn(g, 7, dtype=torch.float64)
    yield "x (2, 3, 11), float32", randn(g, 2, 3, 11), randn(g, 2, 3, 11)
    yield "x (1,), float64", randn(g, 1, dtype=torch.float64), randn(g, 1, dtype=torch.float64)


@CHECKS.check("mse_loss", "shapes")
def mse_shapes(s, g):
    for label, a, b in mse_cases(g):
        s.case(label)
        got = s.call("mse_loss", a, b)
        check_tensor("mse_loss(x_hat, x)", torch.empty((), dtype=a.dtype), got, device=s.device)


@CHECKS.check("mse_loss", "values")
def mse_values(s, g):
    for label, a, b in mse_cases(g):
        s.case(label)
        got = s.call("mse_loss", a, b)
        check_close("mse_loss(x_hat, x)", F.mse_loss(a, b), got, atol=tol(s, a.dtype), oracle="F.mse_loss", case=label)


@CHECKS.check("mse_loss", "gradients")
def mse_gradients(s, g):
    for label, a, b in list(mse_cases(g))[:3]:
        s.case(label + ", gradients w.r.t. x_hat and x")
        up = torch.randn((), generator=g, dtype=a.dtype)
        _, grads = s.grad("mse_loss", (a, b), wrt=[0, 1], upstream=[up])
        leaves = [t.clone().requires_grad_(True) for t in (a, b)]
        expected = torch.autograd.grad(F.mse_loss(*leaves) * up, leaves)
        for name, e, got in zip(("d/dx_hat", "d/dx"), expected, grads):
            if got is None:
                raise Fail(f"no gradient reached {name[2:]} ({label})")
            check_close(name, e, got, atol=tol(s, a.dtype), oracle="autograd through F.mse_loss", case=s.label)


# --- AutoEncoder ----------------------------------------------------------------------------------

def ae_copy(s, ae, k, hidden):
    """The reference AutoEncoder(k, hidden) carrying the student's encoder and decoder weights."""
    reference = ref.AutoEncoder(k, hidden)
    for part in ("encoder", "decoder"):
        got = s.attr(ae, part)
        check_true(isinstance(got, Remote), f"AutoEncoder.{part} is {got!r}, expected an nn.Module")
        state = list(s.state(got).values())
        target = list(getattr(reference, part).state_dict().values())
        got_shapes, want = [tuple(t.shape) for t in state], [tuple(t.shape) for t in target]
        if got_shapes != want:
            raise Fail(f"AutoEncoder({k}, hidden={hidden}).{part} has parameters of shapes {got_shapes}, expected "
                       f"{want} ({'784 -> hidden -> k' if part == 'encoder' else 'k -> hidden -> 784'}, with biases)")
        with torch.no_grad():
            for t, v in zip(target, state):
                t.copy_(v)
    return reference.eval()


@CHECKS.check("AutoEncoder", "shapes")
def ae_shapes(s, g):
    for k, hidden in [(32, 256), (8, 64)]:
        s.case(f"AutoEncoder({k}, hidden={hidden})")
        ae = s.new("AutoEncoder", k, hidden=hidden)
        n = sum(t.numel() for t in s.state(ae).values() if t.dtype.is_floating_point)
        want = sum(p.numel() for p in ref.AutoEncoder(k, hidden).parameters())
        check_true(n == want, f"AutoEncoder({k}, hidden={hidden}) has {n:,} parameters, expected {want:,}")
        x = torch.rand(6, 784, generator=g)
        check_tensor("forward(x)", x, s.method(ae, "forward", x), device=s.device)
        enc, dec = is_module(s.attr(ae, "encoder"), "encoder"), is_module(s.attr(ae, "decoder"), "decoder")
        check_tensor("encoder(x)", torch.empty(6, k), s.method(enc, "forward", x), device=s.device)
        check_tensor("decoder(z)", x, s.method(dec, "forward", randn(g, 6, k)), device=s.device)


@CHECKS.check("AutoEncoder", "values")
def ae_values(s, g):
    for k, hidden, B in [(32, 256, 8), (2, 64, 5), (16, 8, 3)]:
        label = f"AutoEncoder({k}, hidden={hidden}), x ({B}, 784)"
        s.case(label)
        ae = s.new("AutoEncoder", k, hidden=hidden)
        reference = ae_copy(s, ae, k, hidden)
        x = torch.rand(B, 784, generator=g)
        with torch.no_grad():
            want_x, want_code = reference(x), reference.encoder(x)
        got = s.method(ae, "forward", x)
        # the code is the encoder's output (no ReLU on it); where the Sigmoid sits is the student's choice
        check_close("encoder(x)", want_code, s.method(s.attr(ae, "encoder"), "forward", x), atol=tol(s, x.dtype),
                    oracle="784 -> hidden -> ReLU -> k", dims=("row", "code"), case=label)
        check_close("forward(x)", want_x, got, atol=tol(s, x.dtype),
                    oracle="784 -> hidden -> ReLU -> k -> hidden -> ReLU -> 784 -> Sigmoid", dims=("row", "pixel"),
                    case=label)
        check_true(bool(((got > 0) & (got < 1)).all()), f"forward(x) has values outside (0, 1) ({label}): "
                                                         f"the output layer is a Sigmoid")


# --- corrupt --------------------------------------------------------------------------------------

def noise_stats(s, x, y, sigma, label):
    """(y - x) / sigma must look like independent N(0, 1) draws."""
    check_tensor("corrupt(x, sigma)", x, y, device=s.device)
    eps = ((y.double() - x.double()) / sigma).flatten()
    n = eps.numel()
    mean, std = eps.mean().item(), eps.std().item()
    check_true(abs(mean) < 5 / math.sqrt(n), f"(corrupt(x, sigma) - x) / sigma has mean {mean:.4f}, expected 0 "
                                             f"(within {5 / math.sqrt(n):.4f}), {label}")
    check_true(abs(std - 1) < 0.02, f"(corrupt(x, sigma) - x) / sigma has standard deviation {std:.4f}, expected 1 "
                                    f"(the noise is sigma * N(0, 1)), {label}")
    inside = (eps.abs() < 1).double().mean().item()
    check_true(abs(inside - 0.6827) < 0.01, f"{inside:.1%} of the noise lies within one sigma, expected 68.3% for "
                                            f"Gaussian noise, {label}")
    kurt = (((eps - mean) / std) ** 4).mean().item()
    check_true(abs(kurt - 3) < 0.2, f"the noise has kurtosis {kurt:.2f}, expected 3 for Gaussian noise, {label}")
    distinct = eps.unique().numel() / n
    check_true(distinct > 0.9, f"only {distinct:.1%} of the {n} noise values are distinct: the noise must be drawn "
                               f"independently for every element of x, {label}")


@CHECKS.check("corrupt", "shapes")
def corrupt_shapes(s, g):
    for shape, dtype, sigma in [((4, 784), torch.float32, 0.5), ((3, 5, 7), torch.float64, 1.0),
                                ((2, 784), torch.float32, 0.0)]:
        s.case(f"x {shape}, {dt(dtype)}, sigma {sigma}")
        x = torch.rand(*shape, generator=g, dtype=dtype)
        check_tensor("corrupt(x, sigma, generator)", x, s.call("corrupt", x, sigma, generator=Seeded(int_seed(g))),
                     device=s.device)
        check_tensor("corrupt(x, sigma)", x, s.call("corrupt", x, sigma), device=s.device)


@CHECKS.check("corrupt", "values")
def corrupt_values(s, g):
    for sigma, dtype, seeded in [(0.5, torch.float32, True), (0.1, torch.float64, True), (1.5, torch.float32, True),
                                 (0.3, torch.float32, False)]:
        label = f"x (200, 784) {dt(dtype)}, sigma {sigma}, " + ("a seeded generator" if seeded else "generator=None")
        s.case(label)
        x = torch.rand(200, 784, generator=g, dtype=dtype)
        y = s.call("corrupt", x, sigma, generator=Seeded(int_seed(g))) if seeded else s.call("corrupt", x, sigma)
        noise_stats(s, x, y, sigma, label)


@CHECKS.check("corrupt", "properties")
def corrupt_properties(s, g):
    x = torch.rand(4, 784, generator=g)
    s.case("sigma = 0")
    for kwargs in ({}, {"generator": Seeded(int_seed(g))}):
        got = s.call("corrupt", x, 0.0, **kwargs)
        check_tensor("corrupt(x, 0)", x, got)
        check_true(torch.equal(got, x), "corrupt(x, 0) must return x's values exactly "
                                        f"(max |diff| = {(got - x).abs().max().item():.3g})")
    seed = int_seed(g)
    s.case(f"generator seeded with {seed}, twice; then with {seed + 1}")
    a = s.call("corrupt", x, 0.5, generator=Seeded(seed))
    b = s.call("corrupt", x, 0.5, generator=Seeded(seed))
    c = s.call("corrupt", x, 0.5, generator=Seeded(seed + 1))
    check_true(torch.equal(a, b), "two calls with generators seeded alike gave different noise: draw the noise "
                                  "from the generator argument")
    check_true(not torch.allclose(a, c), "generators with different seeds gave the same noise: the generator "
                                         "argument is not used")
    check_true(not torch.allclose(a, x), "corrupt(x, 0.5) returned x unchanged")
    s.case("the same draw on x and on x + 1")
    shifted = s.call("corrupt", x + 1, 0.5, generator=Seeded(seed))
    check_close("corrupt(x + 1, sigma) - 1", a, shifted - 1, atol=1e-5, oracle="corrupt(x, sigma)",
                case="the noise is added and does not depend on x's values (same generator seed)")


# --- pca ------------------------------------------------------------------------------------------

def low_rank_data(g, m, d, r, dtype):
    """Centred (m, d) data: r strong directions of decreasing scale plus small isotropic noise."""
    scales = torch.linspace(3.0, 1.0, r, dtype=torch.float64)
    X = (randn(g, m, r, dtype=torch.float64) * scales) @ randn(g, r, d, dtype=torch.float64)
    X = X + 0.05 * randn(g, m, d, dtype=torch.float64)
    return (X - X.mean(0, keepdim=True)).to(dtype)


@CHECKS.check("pca", "shapes")
def pca_shapes(s, g):
    for m, d, k, dtype in [(60, 10, 3, torch.float32), (20, 30, 4, torch.float64)]:
        s.case(f"X ({m}, {d}) {dt(dtype)}, k = {k}")
        X = low_rank_data(g, m, d, k + 2, dtype)
        V_k, err = check_tuple("pca", 2, s.call("pca", X, k))
        check_tensor("V_k", torch.empty(d, k, dtype=dtype), V_k, device=s.device)
        ok = isinstance(err, (int, float)) and not isinstance(err, bool) or \
            isinstance(err, torch.Tensor) and err.numel() == 1 and err.dtype.is_floating_point
        check_true(ok, f"'err' is {err!r}, expected a number (a 0-dim tensor or a float)")


@CHECKS.check("pca", "values")
def pca_values(s, g):
    for m, d, k, dtype in [(300, 20, 3, torch.float64), (50, 80, 5, torch.float64), (200, 12, 1, torch.float32),
                           (100, 24, 8, torch.float32), (40, 6, 6, torch.float64)]:
        label = f"X ({m}, {d}) {dt(dtype)} centred, k = {k}"
        s.case(label)
        X = low_rank_data(g, m, d, min(k + 2, d), dtype)
        V_k, err = check_tuple("pca", 2, s.call("pca", X, k))
        check_tensor("V_k", torch.empty(d, k), V_k, dtype=False)
        V = V_k.double()
        X64 = X.double()
        atol = loose(s, dtype)
        check_close("V_k^T V_k", torch.eye(k, dtype=torch.float64), V.T @ V, atol=atol,
                    oracle="the identity (orthonormal columns)", dims=("column", "column"), case=label)
        _, S, Vh = torch.linalg.svd(X64 / math.sqrt(m), full_matrices=False)
        P_svd = Vh[:k].T @ Vh[:k]
        check_close("V_k V_k^T", P_svd, V @ V.T, atol=atol, oracle="torch.linalg.svd's top-k projector",
                    dims=("row", "column"), case=label)
        sk = PCA(n_components=k, svd_solver="full").fit(X64.numpy())
        P_sk = torch.from_numpy(sk.components_.T @ sk.components_)
        check_close("V_k V_k^T", P_sk, V @ V.T, atol=atol, oracle="sklearn PCA's projector", dims=("row", "column"),
                    case=label)
        if k < d:  # one column per singular value, in decreasing order (signs are free)
            align = (V * Vh[:k].T).sum(0).abs()
            worst = int(align.argmin())
            check_true(bool((align > 1 - 1e3 * atol).all()),
                       f"column {worst} of V_k is not the right singular vector of the {worst + 1}-th largest "
                       f"singular value (|cosine| {align[worst].item():.4f}); the columns go in decreasing order "
                       f"of singular value, {label}")
        err_svd = (S[k:] ** 2).sum().item()
        scale = (S ** 2).sum().item()
        check_number("err", err_svd, err.item() if isinstance(err, torch.Tensor) else err,
                     tol=1e-8 if dtype == torch.float64 else 1e-4)
        direct = ((X64 - X64 @ P_svd) ** 2).sum(1).mean().item()
        got = err.item() if isinstance(err, torch.Tensor) else err
        check_true(abs(got - direct) <= 1e-4 * scale,
                   f"'err' is {got:.6g}, expected {direct:.6g}, the mean over rows of ||x - x V_k V_k^T||^2 "
                   f"(sum of the discarded squared singular values of X / sqrt(m)), {label}")


# --- projector ------------------------------------------------------------------------------------

def basis(g, *shape, dtype=torch.float64):
    """A non-orthonormal basis of condition number 100: U diag(0.1 .. 10) R with U orthonormal, R a rotation,
    so the columns have different lengths and are not orthogonal, yet any sound method is accurate to 1e-10."""
    U, _ = torch.linalg.qr(randn(g, *shape, dtype=torch.float64))
    R, _ = torch.linalg.qr(randn(g, *shape[:-2], shape[-1], shape[-1], dtype=torch.float64))
    return (U * torch.logspace(-1, 1, shape[-1], dtype=torch.float64) @ R).to(dtype)


@CHECKS.check("projector", "shapes")
def projector_shapes(s, g):
    for shape, dtype in [((10, 3), torch.float32), ((4, 12, 5), torch.float64), ((2, 3, 6, 1), torch.float32)]:
        s.case(f"W {shape}, {dt(dtype)}")
        W = basis(g, *shape, dtype=dtype)
        d = shape[-2]
        check_tensor("projector(W)", torch.empty(*shape[:-2], d, d, dtype=dtype), s.call("projector", W),
                     device=s.device)


@CHECKS.check("projector", "values")
def projector_values(s, g):
    for shape, dtype in [((10, 3), torch.float64), ((4, 12, 5), torch.float64), ((7, 1), torch.float64),
                         ((784, 16), torch.float32), ((3, 6, 6), torch.float64)]:
        label = f"W {shape} {dt(dtype)}, not orthonormal (singular values 0.1 to 10)"
        s.case(label)
        W = basis(g, *shape, dtype=dtype)
        Q, _ = torch.linalg.qr(W.double())
        got = s.call("projector", W)
        check_close("projector(W)", Q @ Q.mT, got, atol=loose(s, dtype), oracle="Q Q^T with Q from torch.linalg.qr(W)",
                    dims=("batch",) * (len(shape) - 2) + ("row", "column"), case=label)


@CHECKS.check("projector", "properties")
def projector_properties(s, g):
    for shape in [(12, 4), (3, 9, 2)]:
        label = f"W {shape} float64"
        s.case(label)
        W = basis(g, *shape)
        P = s.call("projector", W).double()
        k = shape[-1]
        check_close("P @ P", P, P @ P, atol=1e-8, oracle="P", case=label + ": a projector is idempotent")
        check_close("P^T", P, P.mT, atol=1e-8, oracle="P", case=label + ": an orthogonal projector is symmetric")
        check_close("P @ W", W, P @ W, atol=1e-8, oracle="W", case=label + ": P leaves the columns of W where they are")
        trace = torch.diagonal(P, dim1=-2, dim2=-1).sum(-1)
        check_close("trace(P)", torch.full_like(trace, float(k)), trace, atol=1e-8, oracle="k",
                    case=label + ": the trace is the rank k")
        R = randn(g, *shape[:-2], k, k, dtype=torch.float64) + 3 * torch.eye(k, dtype=torch.float64)
        check_close("projector(W @ R)", P, s.call("projector", W @ R).double(), atol=1e-8, oracle="projector(W)",
                    case=label + ": another basis W R of the same column space gives the same P")


# --- principal_angle_cosines ------------------------------------------------------------------------

def scipy_cosines(W, V):
    angles = scipy.linalg.subspace_angles(W.double().numpy(), V.double().numpy())
    return torch.from_numpy(np.sort(np.cos(angles))[::-1].copy())


@CHECKS.check("principal_angle_cosines", "shapes")
def angles_shapes(s, g):
    for d, k1, k2, dtype in [(10, 3, 3, torch.float32), (20, 2, 5, torch.float64), (8, 4, 2, torch.float32)]:
        s.case(f"W ({d}, {k1}), V ({d}, {k2}), {dt(dtype)}")
        W, V = basis(g, d, k1, dtype=dtype), basis(g, d, k2, dtype=dtype)
        check_tensor("principal_angle_cosines(W, V)", torch.empty(min(k1, k2), dtype=dtype),
                     s.call("principal_angle_cosines", W, V), device=s.device)


@CHECKS.check("principal_angle_cosines", "values")
def angles_values(s, g):
    cases = []
    for d, k1, k2, dtype in [(10, 3, 3, torch.float64), (20, 2, 5, torch.float64), (8, 4, 2, torch.float64),
                             (64, 16, 16, torch.float32)]:
        W, V = basis(g, d, k1, dtype=dtype), basis(g, d, k2, dtype=dtype)
        V[:, 0] = W[:, 0] + 0.1 * V[:, 0]           # one small angle, so the cosines are spread out
        cases.append((f"W ({d}, {k1}), V ({d}, {k2}) {dt(dtype)}, non-orthonormal bases", W, V))
    W = basis(g, 12, 4)
    R = randn(g, 4, 4, dtype=torch.float64) + 3 * torch.eye(4, dtype=torch.float64)
    cases.append(("V = W R: the same subspace in another basis (all cosines 1)", W, W @ R))
    E = torch.eye(12, dtype=torch.float64)[torch.randperm(12, generator=g)]
    cases.append(("orthogonal subspaces, columns of a permuted identity (all cosines 0)", E[:, :4] * 3, E[:, 4:7]))
    for label, W, V in cases:
        s.case(label)
        got = s.call("principal_angle_cosines", W, V)
        check_close("cosines", scipy_cosines(W, V), got, atol=loose(s, W.dtype) * 10,
                    oracle="cos(scipy.linalg.subspace_angles), descending", dims=("angle",), case=label)


# --- LinearAE ---------------------------------------------------------------------------------------

def linear_parts(s, net, k, n_in, label, dtype=torch.float32):
    """The student's We and Wd: bias-free maps n_in -> k and k -> n_in."""
    out = []
    for attr, shape in (("We", (k, n_in)), ("Wd", (n_in, k))):
        part = s.attr(net, attr)
        check_true(isinstance(part, Remote), f"LinearAE.{attr} is {part!r}, expected an nn.Linear (bias=False)")
        state = s.state(part)
        check_true(list(state) == ["weight"], f"LinearAE.{attr} has parameters {list(state)}, expected only "
                                              f"'weight' (an nn.Linear with bias=False), {label}")
        check_tensor(f"{attr}.weight", torch.empty(shape, dtype=dtype), state["weight"], device=s.device)
        out.append(part)
    n = len(s.state(net))
    check_true(n == 2, f"LinearAE has {n} parameters and buffers, expected 2 (We.weight and Wd.weight), {label}")
    return out


@CHECKS.check("LinearAE", "shapes")
def linear_shapes(s, g):
    for args, k, n_in in [((5,), 5, 784), ((5, 30), 5, 30), ((1, 4), 1, 4)]:
        label = f"LinearAE({', '.join(map(str, args))})"
        s.case(label)
        net = s.new("LinearAE", *args)
        linear_parts(s, net, k, n_in, label)
        x = randn(g, 7, n_in)
        check_tensor("forward(x)", x, s.method(net, "forward", x), device=s.device)


@CHECKS.check("LinearAE", "values")
def linear_values(s, g):
    for k, n_in, B in [(5, 30, 7), (16, 784, 4), (3, 3, 2)]:
        label = f"LinearAE({k}, n_in={n_in}) with random weights, x ({B}, {n_in})"
        s.case(label)
        net = s.new("LinearAE", k, n_in=n_in)
        We_mod, Wd_mod = linear_parts(s, net, k, n_in, label)
        We, Wd = randn(g, k, n_in), randn(g, n_in, k)
        s.load_state(We_mod, [We])
        s.load_state(Wd_mod, [Wd])
        x = randn(g, B, n_in)
        check_close("forward(x)", x @ We.T @ Wd.T, s.method(net, "forward", x), atol=tol(s, x.dtype) * 10,
                    oracle="x We^T Wd^T", dims=("row", "column"), case=label)


# --- train_linear_ae ----------------------------------------------------------------------------------

def trained(s, X, k, steps, lr, label, **kwargs):
    """train_linear_ae(...) in the student's process; `new` because training needs autograd switched on."""
    net = s.new("train_linear_ae", X, k, steps, lr, **kwargs)
    We_mod, Wd_mod = linear_parts(s, net, k, X.shape[1], label, dtype=X.dtype)
    We, Wd = s.state(We_mod)["weight"], s.state(Wd_mod)["weight"]
    return net, We.double(), Wd.double()


@CHECKS.check("train_linear_ae", "shapes")
def train_shapes(s, g):
    # two strong directions, then a clear gap: k = 2 is well defined and Adam gets there in 150 steps
    scales = torch.tensor([3.0, 2.5, 0.7, 0.5], dtype=torch.float64)
    X64 = (randn(g, 100, 4, dtype=torch.float64) * scales) @ randn(g, 4, 10, dtype=torch.float64)
    X64 = X64 + 0.05 * randn(g, 100, 10, dtype=torch.float64)
    X64 = X64 - X64.mean(0, keepdim=True)
    X = X64.float()
    X64 = X.double()
    err_pca = ref.pca(X64, 2)[1].item()
    total = (X64 ** 2).sum(1).mean().item()
    for kwargs in ({}, {"batch": 25}):
        label = "train_linear_ae(X (100, 10) float32 centred, k=2, steps=150, lr=0.03" + \
            "".join(f", {k}={v}" for k, v in kwargs.items()) + ")"
        s.case(label)
        net, We, Wd = trained(s, X, 2, 150, 3e-2, label, **kwargs)
        check_tensor("forward(X)", X, s.method(net, "forward", X), device=s.device)
        err = ((X64 - X64 @ We.T @ Wd.T) ** 2).sum(1).mean().item()
        missed = (err - err_pca) / (total - err_pca)
        check_true(missed < 0.1,
                   f"after training the reconstruction error is {err:.4g}: PCA's rank-2 error is {err_pca:.4g} and "
                   f"the data's mean squared norm {total:.4g}, so the model captured only {1 - missed:.0%} of what "
                   f"PCA captures (expected at least 90%): is it trained with Adam at this lr for `steps` steps? "
                   f"{label}")
    X = low_rank_data(g, 40, 8, 3, torch.float64)
    label = "train_linear_ae(X (40, 8) float64, k=3, steps=3, lr=0.01): the model follows X's dtype"
    s.case(label)
    trained(s, X, 3, 3, 1e-2, label)
    label = "train_linear_ae(X (40, 8) float64, k=3, steps=3, lr=0.01) with seed=0 and seed=1"
    s.case(label)
    _, We0, _ = trained(s, X, 3, 3, 1e-2, label, seed=0)
    _, We1, _ = trained(s, X, 3, 3, 1e-2, label, seed=1)
    check_true(not torch.allclose(We0, We1), f"seed=0 and seed=1 gave the same weights: the seed argument must "
                                             f"seed the initialisation, {label}")


# --- GRUEncoder -----------------------------------------------------------------------------------

def gru_oracle(state, n_tokens, d):
    """nn.Embedding(n_tokens, d) + nn.GRU(d, d // 2, bidirectional) carrying the student's weights."""
    emb = nn.Embedding(n_tokens, d)
    gru = nn.GRU(d, d // 2, batch_first=True, bidirectional=True)
    items = list(state.items())
    first = next((k for k, v in items if tuple(v.shape) == (n_tokens, d)), None)
    if first is None:
        raise Fail(f"GRUEncoder({n_tokens}, {d}) has no ({n_tokens}, {d}) token embedding among its parameters "
                   f"{[tuple(v.shape) for _, v in items]}")
    rest = [v for k, v in items if k != first]
    want = [tuple(t.shape) for t in gru.state_dict().values()]
    if [tuple(v.shape) for v in rest] != want:
        raise Fail(f"GRUEncoder({n_tokens}, {d})'s parameters besides the embedding have shapes "
                   f"{[tuple(v.shape) for v in rest]}, expected those of nn.GRU({d}, {d // 2}, bidirectional=True): "
                   f"{want}")
    with torch.no_grad():
        emb.weight.copy_(state[first])
        for t, v in zip(gru.state_dict().values(), rest):
            t.copy_(v)
    return emb, gru


def tokens(g, B, T, n_tokens):
    return torch.randint(0, n_tokens, (B, T), generator=g)


@CHECKS.check("GRUEncoder", "shapes")
def gru_shapes(s, g):
    s.case("GRUEncoder(12, 32)")
    enc = s.new("GRUEncoder", 12, 32)
    n = sum(t.numel() for t in s.state(enc).values() if t.dtype.is_floating_point)
    check_true(n == 5184, f"GRUEncoder(12, 32) has {n:,} parameters, expected 5,184 (an embedding and a GRU "
                          f"with hidden 16 each way)")
    for B, T, with_lengths in [(5, 9, True), (5, 9, False), (1, 1, True)]:
        s.case(f"GRUEncoder(12, 32), x ({B}, {T}), " + ("lengths given" if with_lengths else "lengths=None"))
        x = tokens(g, B, T, 12)
        args = (x, padding_mask(g, B, T)[1]) if with_lengths else (x,)
        H, h_T = check_tuple("GRUEncoder.forward", 2, s.method(enc, "forward", *args))
        check_tensor("H", torch.empty(B, T, 32), H, device=s.device)
        check_tensor("h_T", torch.empty(B, 32), h_T, device=s.device)


@CHECKS.check("GRUEncoder", "values")
def gru_values(s, g):
    for n_tokens, B, T, d, with_lengths in [(12, 5, 9, 32, True), (13, 3, 4, 8, True), (12, 1, 1, 6, True),
                                            (12, 4, 7, 10, False), (12, 6, 12, 16, True)]:
        label = f"GRUEncoder({n_tokens}, {d}), x ({B}, {T}), " + (
            "padded rows with lengths" if with_lengths else "lengths=None")
        s.case(label)
        enc = s.new("GRUEncoder", n_tokens, d)
        emb, gru = gru_oracle(s.state(enc), n_tokens, d)
        x = tokens(g, B, T, n_tokens)
        mask, lengths = padding_mask(g, B, T) if with_lengths else (torch.ones(B, T, dtype=torch.bool),
                                                                   torch.full((B,), T))
        args = (x, lengths) if with_lengths else (x,)
        H, h_T = check_tuple("GRUEncoder.forward", 2, s.method(enc, "forward", *args))
        check_tensor("H", torch.empty(B, T, d), H, dtype=False)
        check_tensor("h_T", torch.empty(B, d), h_T, dtype=False)
        atol = loose(s, torch.float32) / 10
        for i in range(B):
            L = int(lengths[i])
            with torch.no_grad():
                H_i, h_n = gru(emb(x[i:i + 1, :L]))                   # (1, L, d), (2, 1, d // 2)
            row = f"{label}; row {i} has {L} real tokens of {T}"
            check_close("H on real tokens", H_i[0], H[i, :L], atol=atol,
                        oracle="nn.GRU(bidirectional) run on the row alone", dims=("position", "unit"), case=row)
            check_close("h_T", torch.cat([h_n[0, 0], h_n[1, 0]]), h_T[i], atol=atol,
                        oracle="[forward state at the last real token; backward state at the first token]",
                        dims=("unit",), case=row)


# --- score functions ---------------------------------------------------------------------------------

def score_cases(g):
    """(label, s, H): s (B, d), H (B, T, d); B = 1 and T = 1 included, float64 once."""
    for B, T, d, dtype in [(4, 7, 16, torch.float32), (1, 1, 4, torch.float32), (3, 5, 8, torch.float64),
                           (2, 9, 6, torch.float32), (1, 6, 5, torch.float32)]:
        yield (f"s ({B}, {d}), H ({B}, {T}, {d}), {dt(dtype)}", randn(g, B, d, dtype=dtype),
               randn(g, B, T, d, dtype=dtype))


def score_shapes(s, g, name, extra=lambda g, d, dtype: ()):
    for label, q, H in score_cases(g):
        s.case(label)
        got = s.call(name, q, H, *extra(g, q.shape[-1], q.dtype))
        check_tensor(f"{name}(s, H)", torch.empty(H.shape[:-1], dtype=q.dtype), got, device=s.device)


def score_values(s, g, name, oracle, oracle_name, extra=lambda g, d, dtype: (), mistakes=lambda q, H, *args: {}):
    for label, q, H in score_cases(g):
        s.case(label)
        args = extra(g, q.shape[-1], q.dtype)
        got = s.call(name, q, H, *args)
        check_close(f"{name}(s, H)", oracle(q, H, *args), got, atol=tol(s, q.dtype) * 10, oracle=oracle_name,
                    dims=SCORE_DIMS, case=label, mistakes=mistakes(q, H, *args))


def dot_oracle(q, H):
    return torch.einsum("bd,btd->bt", q, H)


@CHECKS.check("score_dot", "shapes")
def dot_shapes(s, g):
    score_shapes(s, g, "score_dot")


@CHECKS.check("score_dot", "values")
def dot_values(s, g):
    score_values(s, g, "score_dot", dot_oracle, "einsum('bd,btd->bt')")


@CHECKS.check("score_scaled", "shapes")
def scaled_shapes(s, g):
    score_shapes(s, g, "score_scaled")


@CHECKS.check("score_scaled", "values")
def scaled_values(s, g):
    scaled = lambda q, H: dot_oracle(q, H) / math.sqrt(q.shape[-1])  # noqa: E731
    score_values(s, g, "score_scaled", scaled, "s^T h_t / sqrt(d)",
                 mistakes=lambda q, H: {SCALE_MISSING: scaled(unscaled(q), H)})


def general_args(g, d, dtype):
    return (randn(g, d, d, dtype=dtype),)           # not symmetric: W_a and W_a^T give different scores


@CHECKS.check("score_general", "shapes")
def general_shapes(s, g):
    score_shapes(s, g, "score_general", general_args)


@CHECKS.check("score_general", "values")
def general_values(s, g):
    score_values(s, g, "score_general", lambda q, H, W: torch.einsum("bd,de,bte->bt", q, W, H), "s^T W_a h_t",
                 general_args)
    label = "W_a = I (general attention is then the dot product)"
    s.case(label)
    q, H = randn(g, 3, 8), randn(g, 3, 5, 8)
    check_close("score_general(s, H, I)", dot_oracle(q, H), s.call("score_general", q, H, torch.eye(8)),
                atol=tol(s, q.dtype) * 10, oracle="s^T h_t", dims=SCORE_DIMS, case=label)


def cosine_oracle(q, H):
    return F.cosine_similarity(q[:, None, :].expand_as(H), H, dim=-1)


@CHECKS.check("score_cosine", "shapes")
def cosine_shapes(s, g):
    score_shapes(s, g, "score_cosine")


@CHECKS.check("score_cosine", "values")
def cosine_values(s, g):
    score_values(s, g, "score_cosine", cosine_oracle, "F.cosine_similarity")
    label = "s (2, 6) and H (2, 4, 6) scaled by 1e3 and 1e-3: the cosine ignores lengths"
    s.case(label)
    q, H = randn(g, 2, 6), randn(g, 2, 4, 6)
    check_close("score_cosine(1e3 s, 1e-3 H)", cosine_oracle(q, H), s.call("score_cosine", q * 1e3, H * 1e-3),
                atol=tol(s, q.dtype) * 10, oracle="F.cosine_similarity(s, H)", dims=SCORE_DIMS, case=label)
    label = "H (2, 4, 6) whose state 2 of row 1 is all zeros (F.cosine_similarity gives 0 there)"
    s.case(label)
    H[1, 2] = 0
    check_close("score_cosine(s, H)", cosine_oracle(q, H), s.call("score_cosine", q, H), atol=tol(s, q.dtype) * 10,
                oracle="F.cosine_similarity", dims=SCORE_DIMS, case=label)


def additive_args(g, d, dtype):
    k = 2 * d + 3                                   # k != 2d, so W_a's two axes cannot be confused
    return randn(g, k, 2 * d, dtype=dtype) / math.sqrt(d), randn(g, k, dtype=dtype)


def additive_oracle(q, H, W_a, v_a):
    pair = torch.cat([q[:, None, :].expand_as(H), H], dim=-1)               # [s; h_t], (B, T, 2d)
    return torch.tanh(pair @ W_a.T) @ v_a


@CHECKS.check("score_additive", "shapes")
def additive_shapes(s, g):
    score_shapes(s, g, "score_additive", additive_args)


@CHECKS.check("score_additive", "values")
def additive_values(s, g):
    score_values(s, g, "score_additive", additive_oracle, "v_a^T tanh(W_a [s; h_t])", additive_args)


def location_cases(g):
    for B, T, d, dtype in [(4, 7, 16, torch.float32), (1, 1, 4, torch.float32), (3, 5, 8, torch.float64),
                           (2, 12, 3, torch.float32)]:
        yield (f"s ({B}, {d}), W_loc ({T}, {d}), {dt(dtype)}", randn(g, B, d, dtype=dtype),
               randn(g, T, d, dtype=dtype))


@CHECKS.check("alpha_location", "shapes")
def location_shapes(s, g):
    for label, q, W in location_cases(g):
        s.case(label)
        check_tensor("alpha_location(s, W_loc)", torch.empty(q.shape[0], W.shape[0], dtype=q.dtype),
                     s.call("alpha_location", q, W), device=s.device)


@CHECKS.check("alpha_location", "values")
def location_values(s, g):
    for label, q, W in location_cases(g):
        s.case(label)
        check_close("alpha_location(s, W_loc)", torch.softmax(q @ W.T, dim=-1), s.call("alpha_location", q, W),
                    atol=tol(s, q.dtype), oracle="softmax(W_loc s)", dims=SCORE_DIMS, case=label)


@CHECKS.check("alpha_location", "properties")
def location_properties(s, g):
    q, W = randn(g, 3, 6, dtype=torch.float64), randn(g, 8, 6, dtype=torch.float64)
    label = "s (3, 6), W_loc (8, 6) float64"
    s.case(label)
    a = s.call("alpha_location", q, W)
    check_true(bool((a >= 0).all()), f"alpha_location has negative weights ({label})")
    check_close("row sums", torch.ones(3, dtype=torch.float64), a.sum(-1), atol=1e-10, oracle="1",
                case=label + ": each row is a distribution over the T positions")
    shift = randn(g, 6, dtype=torch.float64)
    check_close("alpha_location(s, W_loc + 1 c^T)", a, s.call("alpha_location", q, W + shift), atol=1e-10,
                oracle="alpha_location(s, W_loc)",
                case=label + ": adding one vector c to every row of W_loc shifts every score by c^T s, which "
                             "cancels in the softmax")
    perm = torch.randperm(8, generator=g)
    check_close("alpha_location(s, W_loc[perm])", a[:, perm], s.call("alpha_location", q, W[perm]), atol=1e-10,
                oracle="alpha_location(s, W_loc)[:, perm]",
                case=label + ": permuting the rows of W_loc permutes the weights (position t reads row t)")
    other = s.call("alpha_location", randn(g, 3, 6, dtype=torch.float64), W)
    check_true(not torch.allclose(a, other),
               "the weights did not change with s: location attention is softmax(W_loc s)")
    s.case("W_loc scaled by 1e3 (very sharp weights)")
    sharp = s.call("alpha_location", q, W * 1e3)
    check_close("alpha_location(s, 1e3 W_loc)", torch.softmax(q @ W.T * 1e3, -1), sharp, atol=1e-8,
                oracle="torch.softmax",
                case="scores of size 1e3 must not overflow (softmax, not exp / sum)")


# --- attention_context ------------------------------------------------------------------------------

def context_oracle(scores, H, mask):
    """c and alpha from F.scaled_dot_product_attention: query 1, keys = the scores (d_k = 1), values H or I."""
    B, T = scores.shape
    q = torch.ones(B, 1, 1, dtype=scores.dtype)
    k = scores[..., None]
    attn_mask = None if mask is None else mask[:, None, :]
    c = F.scaled_dot_product_attention(q, k, H, attn_mask=attn_mask)[:, 0]
    eye = torch.eye(T, dtype=scores.dtype).expand(B, T, T)
    alpha = F.scaled_dot_product_attention(q, k, eye, attn_mask=attn_mask)[:, 0]
    return c, alpha


def mha_oracle(q, H, mask):
    """nn.MultiheadAttention, one head, identity projections, no bias: the query s attends over H."""
    d = q.shape[-1]
    mha = nn.MultiheadAttention(d, 1, bias=False, batch_first=True).to(q.dtype)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.eye(d, dtype=q.dtype).repeat(3, 1))
        mha.out_proj.weight.copy_(torch.eye(d, dtype=q.dtype))
        c, alpha = mha(q[:, None], H, H, key_padding_mask=None if mask is None else ~mask)
    return c[:, 0], alpha[:, 0]


def context_cases(g):
    """(label, scores, H, mask)."""
    yield "scores (4, 7), H (4, 7, 16), no mask", randn(g, 4, 7) * 2, randn(g, 4, 7, 16), None
    mask, _ = padding_mask(g, 5, 9)
    yield "scores (5, 9), H (5, 9, 6), padding mask (True = real token)", randn(g, 5, 9) * 2, randn(g, 5, 9, 6), mask
    mask, _ = padding_mask(g, 3, 6)
    yield ("scores (3, 6), H (3, 6, 4) float64, padding mask", randn(g, 3, 6, dtype=torch.float64),
           randn(g, 3, 6, 4, dtype=torch.float64), mask)
    yield ("scores (1, 1), H (1, 1, 5), one position", randn(g, 1, 1), randn(g, 1, 1, 5),
           torch.ones(1, 1, dtype=torch.bool))
    mask, _ = padding_mask(g, 4, 8)
    mask[1] = torch.rand(8, generator=g) < 0.5
    mask[1, 3] = True
    yield ("scores (4, 8) + 500, H (4, 8, 3), mask with holes in row 1 (large scores must not overflow)",
           randn(g, 4, 8) * 3 + 500, randn(g, 4, 8, 3), mask)


@CHECKS.check("attention_context", "shapes")
def context_shapes(s, g):
    for label, scores, H, mask in list(context_cases(g))[:4]:
        s.case(label)
        c, alpha = check_tuple("attention_context", 2, s.call("attention_context", scores, H, mask=mask))
        check_tensor("c", torch.empty(H.shape[0], H.shape[-1], dtype=H.dtype), c, device=s.device)
        check_tensor("alpha", scores, alpha, device=s.device)


@CHECKS.check("attention_context", "values")
def context_values(s, g):
    for label, scores, H, mask in context_cases(g):
        s.case(label)
        c, alpha = check_tuple("attention_context", 2, s.call("attention_context", scores, H, mask=mask))
        ref_c, ref_alpha = context_oracle(scores, H, mask)
        atol = tol(s, H.dtype)
        check_close("alpha", ref_alpha, alpha, atol=atol, oracle="F.scaled_dot_product_attention's weights",
                    dims=SCORE_DIMS, case=label)
        check_close("c", ref_c, c, atol=atol, oracle="F.scaled_dot_product_attention with a length-1 query",
                    dims=("batch", "unit"), case=label)
        if mask is not None and not bool((alpha[~mask] == 0).all()):
            raise Fail(f"padded positions get weights up to {alpha[~mask].abs().max().item():.3g}, "
                       f"expected exactly 0, {label}")
    for B, T, d, with_mask in [(6, 9, 16, True), (2, 5, 8, False)]:
        label = f"scores = s^T h_j / sqrt(d), s ({B}, {d}), H ({B}, {T}, {d}), " + (
            "padding mask" if with_mask else "no mask")
        s.case(label)
        q, H = randn(g, B, d), randn(g, B, T, d)
        mask = padding_mask(g, B, T)[0] if with_mask else None
        scores = dot_oracle(q, H) / math.sqrt(d)
        c, alpha = check_tuple("attention_context", 2, s.call("attention_context", scores, H, mask=mask))
        ref_c, ref_alpha = mha_oracle(q, H, mask)
        check_close("alpha", ref_alpha, alpha, atol=tol(s, H.dtype), oracle="nn.MultiheadAttention's weights",
                    dims=SCORE_DIMS, case=label)
        check_close("c", ref_c, c, atol=tol(s, H.dtype), oracle="nn.MultiheadAttention (identity projections)",
                    dims=("batch", "unit"), case=label)


@CHECKS.check("attention_context", "gradients")
def context_gradients(s, g):
    for label, scores, H, mask in list(context_cases(g))[:3]:
        s.case(label + ", gradients w.r.t. scores and H")
        up_c, up_a = randn(g, H.shape[0], H.shape[-1], dtype=H.dtype), randn(g, *scores.shape, dtype=H.dtype)
        _, grads = s.grad("attention_context", (scores, H, mask), wrt=[0, 1], upstream=[up_c, up_a])
        leaves = [t.clone().requires_grad_(True) for t in (scores, H)]
        ref_c, ref_alpha = context_oracle(*leaves, mask)
        expected = torch.autograd.grad((ref_c * up_c).sum() + (ref_alpha * up_a).sum(), leaves)
        for name, e, got, dims in zip(("d/dscores", "d/dH"), expected, grads, (SCORE_DIMS, SCORE_DIMS + ("unit",))):
            if got is None:
                raise Fail(f"no gradient reached {name[2:]} ({label})")
            check_close(name, e, got, atol=1e-4 if H.dtype == torch.float32 else 1e-9,
                        oracle="autograd through F.scaled_dot_product_attention", dims=dims, case=label)


@CHECKS.check("attention_context", "properties")
def context_properties(s, g):
    B, T, d = 5, 8, 6
    scores, H = randn(g, B, T, dtype=torch.float64) * 2, randn(g, B, T, d, dtype=torch.float64)
    mask, lengths = padding_mask(g, B, T)
    label = f"scores ({B}, {T}), H ({B}, {T}, {d}) float64, padding mask"
    s.case(label)
    c, alpha = check_tuple("attention_context", 2, s.call("attention_context", scores, H, mask=mask))
    check_true(bool((alpha >= 0).all()), f"alpha has negative weights ({label})")
    check_close("row sums of alpha", torch.ones(B, dtype=torch.float64), alpha.sum(-1), atol=1e-10, oracle="1",
                case=label + ": alpha is a distribution over the real positions")
    if not bool((alpha[~mask] == 0).all()):
        raise Fail(f"padded positions get weight {alpha[~mask].abs().max().item():.3g}, expected exactly 0 ({label})")
    check_true(bool(((c >= H.min(1).values - 1e-10) & (c <= H.max(1).values + 1e-10)).all()),
               f"c lies outside the box spanned by the states h_j: it must be a convex combination ({label})")
    s.case(label + "; the padded states and their scores replaced by large junk")
    junk_H = torch.where(mask[..., None], H, 1e3 * randn(g, B, T, d, dtype=torch.float64))
    junk_scores = torch.where(mask, scores, 50 + 10 * randn(g, B, T, dtype=torch.float64))
    c2, alpha2 = s.call("attention_context", junk_scores, junk_H, mask=mask)
    check_close("alpha", alpha, alpha2, atol=1e-10, oracle="alpha before",
                case="what sits at padded positions must not change alpha")
    check_close("c", c, c2, atol=1e-8, oracle="c before", case="what sits at padded positions must not change c")
    s.case(label + "; every score of a row shifted by the same constant")
    shift = 100 * randn(g, B, 1, dtype=torch.float64)
    _, alpha3 = s.call("attention_context", scores + shift, H, mask=mask)
    check_close("alpha(scores + const)", alpha, alpha3, atol=1e-10, oracle="alpha(scores)",
                case="the softmax ignores a per-row constant")


# --- unroll_annotations -----------------------------------------------------------------------------

@CHECKS.check("unroll_annotations", "shapes")
def unroll_shapes(s, g):
    for shape, dtype in [((2, 5, 3, 4), torch.float32), ((1, 32, 8, 8), torch.float64), ((3, 1, 2, 7), torch.float32)]:
        s.case(f"volume {shape}, {dt(dtype)}")
        N, C, Hh, W = shape
        check_tensor("unroll_annotations(volume)", torch.empty(N, Hh * W, C, dtype=dtype),
                     s.call("unroll_annotations", randn(g, *shape, dtype=dtype)), device=s.device)


@CHECKS.check("unroll_annotations", "values")
def unroll_values(s, g):
    for shape, dtype in [((2, 5, 3, 4), torch.float32), ((1, 32, 8, 8), torch.float64), ((3, 6, 2, 7), torch.float32),
                         ((2, 4, 5, 1), torch.float32)]:
        label = f"volume {shape} (N, C, H, W), {dt(dtype)}"
        s.case(label)
        N, C, Hh, W = shape
        volume = randn(g, *shape, dtype=dtype)
        got = s.call("unroll_annotations", volume)
        check_close("annotations", volume.permute(0, 2, 3, 1).reshape(N, Hh * W, C), got, atol=0, rtol=0,
                    oracle="annotation l = i * W + j holding volume[n, :, i, j] (row-major)",
                    dims=("image", "annotation", "channel"), case=label)


# --- spatial_attention --------------------------------------------------------------------------------

def spatial_oracle(q, A, W_a):
    alpha = torch.softmax(torch.einsum("bd,de,ble->bl", q, W_a, A), dim=-1)
    return torch.einsum("bl,bld->bd", alpha, A), alpha


def spatial_cases(g):
    for B, L, d, dtype in [(4, 64, 16, torch.float32), (2, 12, 8, torch.float64), (1, 5, 3, torch.float32),
                           (3, 64, 32, torch.float32)]:
        yield (f"s ({B}, {d}), A ({B}, {L}, {d}), W_a ({d}, {d}) {dt(dtype)}", randn(g, B, d, dtype=dtype),
               randn(g, B, L, d, dtype=dtype), randn(g, d, d, dtype=dtype) / math.sqrt(d))


@CHECKS.check("spatial_attention", "shapes")
def spatial_shapes(s, g):
    for label, q, A, W in list(spatial_cases(g))[:3]:
        s.case(label)
        ctx, alpha = check_tuple("spatial_attention", 2, s.call("spatial_attention", q, A, W))
        check_tensor("ctx", q, ctx, device=s.device)
        check_tensor("alpha", torch.empty(A.shape[:2], dtype=q.dtype), alpha, device=s.device)


@CHECKS.check("spatial_attention", "values")
def spatial_values(s, g):
    cases = list(spatial_cases(g))
    q, A = randn(g, 3, 8), randn(g, 3, 10, 8)
    cases.append(("s (3, 8), A (3, 10, 8), W_a = I", q, A, torch.eye(8)))
    for label, q, A, W in cases:
        s.case(label)
        ctx, alpha = check_tuple("spatial_attention", 2, s.call("spatial_attention", q, A, W))
        ref_ctx, ref_alpha = spatial_oracle(q, A, W)
        atol = tol(s, q.dtype) * 10
        check_close("alpha", ref_alpha, alpha, atol=atol, oracle="softmax_l(s^T W_a a_l)",
                    dims=("batch", "annotation"), case=label)
        check_close("ctx", ref_ctx, ctx, atol=atol, oracle="sum_l alpha_l a_l", dims=("batch", "unit"), case=label)


# --- hard_attention -----------------------------------------------------------------------------------

def alpha_cases(g):
    for shape, dtype in [((4, 7), torch.float32), ((3, 12), torch.float64), ((1, 5), torch.float32),
                         ((2, 3, 6), torch.float32), ((4, 1), torch.float32)]:
        yield (f"alpha {shape} {dt(dtype)} (rows are softmax weights)",
               torch.softmax(randn(g, *shape, dtype=dtype) * 2, -1))


@CHECKS.check("hard_attention", "shapes")
def hard_shapes(s, g):
    for label, alpha in list(alpha_cases(g))[:3]:
        s.case(label)
        check_tensor("hard_attention(alpha)", alpha, s.call("hard_attention", alpha), device=s.device)


@CHECKS.check("hard_attention", "values")
def hard_values(s, g):
    for label, alpha in alpha_cases(g):
        s.case(label)
        want = F.one_hot(alpha.argmax(-1), alpha.shape[-1]).to(alpha.dtype)
        got = s.call("hard_attention", alpha)
        check_tensor("hard_attention(alpha)", alpha, got)
        check_close("hard_attention(alpha)", want, got, atol=0, rtol=0, oracle="one-hot at argmax_j alpha_j",
                    dims=("batch",) * (alpha.dim() - 1) + ("position",), case=label)


# --- local_attention ----------------------------------------------------------------------------------

def local_oracle(alpha, centre, D):
    pos = torch.arange(alpha.shape[-1])
    kept = alpha * ((pos - centre[:, None]).abs() <= D)
    return kept / kept.sum(-1, keepdim=True)


def local_cases(g):
    """(label, alpha, centre, D): windows at random centres, at the edges, at the argmax, at p_t = t."""
    alpha = torch.softmax(randn(g, 6, 10), -1)
    centre = torch.randint(0, 10, (6,), generator=g)
    centre[0], centre[1] = 0, 9
    for D in (2, 0, 1):
        yield f"alpha (6, 10), centres {centre.tolist()}, D = {D}", alpha, centre, D
    alpha = torch.softmax(randn(g, 4, 12, dtype=torch.float64) * 2, -1)
    yield "alpha (4, 12) float64, centre at the argmax, D = 3", alpha, alpha.argmax(-1), 3
    yield "alpha (4, 12) float64, centre p_t = 5 for every row, D = 2", alpha, torch.full((4,), 5), 2
    alpha = torch.softmax(randn(g, 3, 7), -1)
    yield "alpha (3, 7), D = 6 (the window covers everything from any centre)", alpha, torch.tensor([0, 3, 6]), 6


@CHECKS.check("local_attention", "shapes")
def local_shapes(s, g):
    for label, alpha, centre, D in list(local_cases(g))[:4]:
        s.case(label)
        check_tensor("local_attention(alpha, centre, D)", alpha, s.call("local_attention", alpha, centre, D),
                     device=s.device)


@CHECKS.check("local_attention", "values")
def local_values(s, g):
    for label, alpha, centre, D in local_cases(g):
        s.case(label)
        got = s.call("local_attention", alpha, centre, D)
        check_close("local_attention(alpha, centre, D)", local_oracle(alpha, centre, D), got,
                    atol=tol(s, alpha.dtype), oracle="alpha zeroed where |j - centre| > D, rows renormalised",
                    dims=("batch", "position"), case=label)


@CHECKS.check("local_attention", "properties")
def local_properties(s, g):
    T = 11
    alpha = torch.softmax(randn(g, 5, T, dtype=torch.float64) * 2, -1)
    centre = torch.randint(0, T, (5,), generator=g)
    pos = torch.arange(T)
    previous = None
    for D in (0, 1, 3):
        label = f"alpha (5, {T}) float64, centres {centre.tolist()}, D = {D}"
        s.case(label)
        got = s.call("local_attention", alpha, centre, D)
        outside = (pos - centre[:, None]).abs() > D
        if not bool((got[outside] == 0).all()):
            raise Fail(f"weights farther than D from the centre are not 0 (up to "
                       f"{got[outside].abs().max().item():.3g}), {label}")
        check_close("row sums", torch.ones(5, dtype=torch.float64), got.sum(-1), atol=1e-10, oracle="1",
                    case=label + ": each row is renormalised to a distribution")
        ratio = got / alpha
        inside_ratio = torch.where(outside, torch.nan, ratio)
        top = inside_ratio.nan_to_num(-math.inf).max(-1).values
        spread = ((top - inside_ratio.nan_to_num(math.inf).min(-1).values).abs() / top.abs()).max().item()
        check_true(spread < 1e-9, f"inside the window the weights are not alpha times one constant per row "
                                  f"(spread {spread:.3g}): only renormalise, {label}")
        if previous is not None:
            check_true(not bool(((previous > 0) & (got == 0)).any()),
                       f"a wider window lost a position the narrower one kept ({label})")
        previous = got
    label = f"centre at the argmax, D = 0 is hard attention; D = {T - 1} is global attention"
    s.case(label)
    at_max = s.call("local_attention", alpha, alpha.argmax(-1), 0)
    check_close("local_attention(alpha, argmax, 0)", F.one_hot(alpha.argmax(-1), T).double(), at_max, atol=1e-12,
                oracle="one-hot at the argmax", dims=("batch", "position"),
                case=label)
    check_close(f"local_attention(alpha, centre, {T - 1})", alpha, s.call("local_attention", alpha, centre, T - 1),
                oracle="alpha", dims=("batch", "position"),
                atol=1e-12, case=label)


# --- self_attention -----------------------------------------------------------------------------------

def self_oracle(H, q_scale=1.0):
    """nn.MultiheadAttention, one head, identity projections (queries times q_scale), no bias, on a batch (B, T, d)."""
    d = H.shape[-1]
    mha = nn.MultiheadAttention(d, 1, bias=False, batch_first=True).to(H.dtype)
    eye = torch.eye(d, dtype=H.dtype)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([eye * q_scale, eye, eye]))
        mha.out_proj.weight.copy_(torch.eye(d, dtype=H.dtype))
        return mha(H, H, H)


def self_cases(g):
    yield "one sequence H (7, 16)", randn(g, 7, 16)
    yield "a batch H (3, 5, 8)", randn(g, 3, 5, 8) * 2
    yield "a batch H (2, 6, 4) float64", randn(g, 2, 6, 4, dtype=torch.float64) * 2
    yield "one sequence H (12, 32) float64", randn(g, 12, 32, dtype=torch.float64)
    yield "one sequence H (1, 5)", randn(g, 1, 5)


@CHECKS.check("self_attention", "shapes")
def self_shapes(s, g):
    for label, H in list(self_cases(g))[:3]:
        s.case(label)
        Z, A = check_tuple("self_attention", 2, s.call("self_attention", H))
        check_tensor("Z", H, Z, device=s.device)
        check_tensor("A", torch.empty(*H.shape[:-1], H.shape[-2], dtype=H.dtype), A, device=s.device)


@CHECKS.check("self_attention", "values")
def self_values(s, g):
    for label, H in self_cases(g):
        s.case(label)
        Z, A = check_tuple("self_attention", 2, s.call("self_attention", H))
        batch = H if H.dim() == 3 else H[None]
        (ref_Z, ref_A), (bad_Z, bad_A) = self_oracle(batch), self_oracle(batch, math.sqrt(H.shape[-1]))
        if H.dim() == 2:
            ref_Z, ref_A, bad_Z, bad_A = ref_Z[0], ref_A[0], bad_Z[0], bad_A[0]
        dims = ("batch",) * (H.dim() - 2)
        atol = tol(s, H.dtype) * 10
        check_close("A", ref_A, A, atol=atol, oracle="nn.MultiheadAttention's weights (one head, identity projections)",
                    dims=dims + ("query", "key"), case=label, mistakes={SCALE_MISSING: bad_A})
        check_close("Z", ref_Z, Z, atol=atol, oracle="nn.MultiheadAttention (one head, identity projections)",
                    dims=dims + ("position", "unit"), case=label, mistakes={SCALE_MISSING: bad_Z})
