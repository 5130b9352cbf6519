"""Hidden checks for Week 8, Lecture 1: attention models in vision.

Oracles: F.mse_loss; the reference autoencoder with the student's weights copied in; the statistics of the noise;
torch.linalg.svd, torch.linalg.qr and sklearn's PCA (subspaces through projectors, never signs);
scipy.linalg.subspace_angles; nn.Embedding + a bidirectional nn.GRU with copied weights, run on each row alone;
einsum and F.cosine_similarity for the scores; F.scaled_dot_product_attention with a length-1 query and
nn.MultiheadAttention with identity projections for the attention step; the definitions for the modes.
Mask convention of this assignment: True = real token (may be attended). PYTEST_DONT_REWRITE
"""
import math

import numpy as np
import pytest
import scipy.linalg
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.decomposition import PCA

from autograder.grading.suite_api import (
    SCALE_MISSING,
    Fail,
    Remote,
    Seeded,
    bool_mask,
    check_close,
    check_number,
    check_tensor,
    check_true,
    check_tuple,
    copy_state,
    dim,
    dtype_name,
    function_search,
    gradient_search,
    int_seed,
    ints,
    randn,
    reference,
    smallest_case,
    st,
    tol,
    unscaled,
    with_upstream,
)

ref = reference("w8l1_attention_vision")

SCORE_DIMS = ("batch", "position")


def padding_mask(rng, B, T):
    """(B, T) bool, True = real token; each row a random length >= 1 with padding at the end, row 0 full."""
    lengths = torch.randint(1, T + 1, (B,), generator=rng)
    lengths[0] = T
    return torch.arange(T)[None, :] < lengths[:, None], lengths


def is_module(got, name):
    check_true(isinstance(got, Remote), f"'{name}' is {got!r}, expected a torch.nn.Module")
    return got


# --- mse_loss ---------------------------------------------------------------------------------------

def mse_cases(rng):
    yield "x (5, 784), float32", randn(rng, 5, 784), torch.rand(5, 784, generator=rng)
    yield "x (7,), float64", randn(rng, 7, dtype=torch.float64), randn(rng, 7, dtype=torch.float64)
    yield "x (2, 3, 11), float32", randn(rng, 2, 3, 11), randn(rng, 2, 3, 11)
    yield "x (1,), float64", randn(rng, 1, dtype=torch.float64), randn(rng, 1, dtype=torch.float64)


@pytest.mark.item("mse_loss", "shapes")
def test_mse_shapes(student, rng):
    for label, a, b in mse_cases(rng):
        student.case(label)
        got = student.call("mse_loss", a, b)
        check_tensor("mse_loss(x_hat, x)", torch.empty((), dtype=a.dtype), got, device=student.device)


def small_pair(draw):
    """x_hat and x of one shape: 1 or 2 dimensions of 1..3."""
    shape = tuple(dim(draw) for _ in range(dim(draw, 1, 2)))
    return {"shape": shape, "x_hat": ints(draw, *shape), "x": ints(draw, *shape)}


@pytest.mark.item("mse_loss", "values")
@smallest_case(function_search("mse_loss", small_pair, F.mse_loss, ("loss",), ("x_hat", "x")))
def test_mse_values(student, rng):
    for label, a, b in mse_cases(rng):
        student.case(label)
        got = student.call("mse_loss", a, b)
        check_close("mse_loss(x_hat, x)", F.mse_loss(a, b), got, atol=tol(student, a.dtype), oracle="F.mse_loss",
                    case=label)


@pytest.mark.item("mse_loss", "gradients")
@smallest_case(gradient_search("mse_loss", with_upstream(small_pair, "d_loss", lambda c: ()), F.mse_loss,
                               ("x_hat", "x"), ("x_hat", "x"), ("d_loss",)))
def test_mse_gradients(student, rng):
    for label, a, b in list(mse_cases(rng))[:3]:
        student.case(label + ", gradients w.r.t. x_hat and x")
        up = torch.randn((), generator=rng, dtype=a.dtype)
        _, grads = student.grad("mse_loss", (a, b), wrt=[0, 1], upstream=[up])
        leaves = [t.clone().requires_grad_(True) for t in (a, b)]
        expected = torch.autograd.grad(F.mse_loss(*leaves) * up, leaves)
        for name, e, got in zip(("d/dx_hat", "d/dx"), expected, grads, strict=False):
            if got is None:
                raise Fail(f"no gradient reached {name[2:]} ({label})")
            check_close(name, e, got, atol=tol(student, a.dtype), oracle="autograd through F.mse_loss",
                        case=student.label)


# --- AutoEncoder ----------------------------------------------------------------------------------

def ae_copy(student, ae, k, hidden):
    """The reference AutoEncoder(k, hidden) carrying the student's encoder and decoder weights."""
    reference = ref.AutoEncoder(k, hidden)
    for part in ("encoder", "decoder"):
        got = student.attr(ae, part)
        check_true(isinstance(got, Remote), f"AutoEncoder.{part} is {got!r}, expected an nn.Module")
        copy_state(f"AutoEncoder({k}, hidden={hidden}).{part}", student.state(got).values(), getattr(reference, part),
                   f"{'784 -> hidden -> k' if part == 'encoder' else 'k -> hidden -> 784'}, with biases")
    return reference.eval()


@pytest.mark.item("AutoEncoder", "shapes")
def test_ae_shapes(student, rng):
    for k, hidden in [(32, 256), (8, 64)]:
        student.case(f"AutoEncoder({k}, hidden={hidden})")
        ae = student.new("AutoEncoder", k, hidden=hidden)
        n = sum(t.numel() for t in student.state(ae).values() if t.dtype.is_floating_point)
        want = sum(p.numel() for p in ref.AutoEncoder(k, hidden).parameters())
        check_true(n == want, f"AutoEncoder({k}, hidden={hidden}) has {n:,} parameters, expected {want:,}")
        x = torch.rand(6, 784, generator=rng)
        check_tensor("forward(x)", x, student.method(ae, "forward", x), device=student.device)
        enc, dec = is_module(student.attr(ae, "encoder"), "encoder"), is_module(student.attr(ae, "decoder"), "decoder")
        check_tensor("encoder(x)", torch.empty(6, k), student.method(enc, "forward", x), device=student.device)
        check_tensor("decoder(z)", x, student.method(dec, "forward", randn(rng, 6, k)), device=student.device)


@pytest.mark.item("AutoEncoder", "values")
def test_ae_values(student, rng):
    for k, hidden, B in [(32, 256, 8), (2, 64, 5), (16, 8, 3)]:
        label = f"AutoEncoder({k}, hidden={hidden}), x ({B}, 784)"
        student.case(label)
        ae = student.new("AutoEncoder", k, hidden=hidden)
        reference = ae_copy(student, ae, k, hidden)
        x = torch.rand(B, 784, generator=rng)
        with torch.no_grad():
            want_x, want_code = reference(x), reference.encoder(x)
        got = student.method(ae, "forward", x)
        # the code is the encoder's output (no ReLU on it); where the Sigmoid sits is the student's choice
        check_close("encoder(x)", want_code, student.method(student.attr(ae, "encoder"), "forward", x),
                    atol=tol(student, x.dtype), oracle="784 -> hidden -> ReLU -> k", dims=("row", "code"), case=label)
        check_close("forward(x)", want_x, got, atol=tol(student, x.dtype),
                    oracle="784 -> hidden -> ReLU -> k -> hidden -> ReLU -> 784 -> Sigmoid", dims=("row", "pixel"),
                    case=label)
        check_true(bool(((got > 0) & (got < 1)).all()), f"forward(x) has values outside (0, 1) ({label}): "
                                                         f"the output layer is a Sigmoid")


# --- corrupt --------------------------------------------------------------------------------------

def noise_stats(student, x, y, sigma, label):
    """(y - x) / sigma must look like independent N(0, 1) draws."""
    check_tensor("corrupt(x, sigma)", x, y, device=student.device)
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


@pytest.mark.item("corrupt", "shapes")
def test_corrupt_shapes(student, rng):
    for shape, dtype, sigma in [((4, 784), torch.float32, 0.5), ((3, 5, 7), torch.float64, 1.0),
                                ((2, 784), torch.float32, 0.0)]:
        student.case(f"x {shape}, {dtype_name(dtype)}, sigma {sigma}")
        x = torch.rand(*shape, generator=rng, dtype=dtype)
        check_tensor("corrupt(x, sigma, generator)", x,
                     student.call("corrupt", x, sigma, generator=Seeded(int_seed(rng))), device=student.device)
        check_tensor("corrupt(x, sigma)", x, student.call("corrupt", x, sigma), device=student.device)


@pytest.mark.item("corrupt", "values")
def test_corrupt_values(student, rng):
    for sigma, dtype, seeded in [(0.5, torch.float32, True), (0.1, torch.float64, True), (1.5, torch.float32, True),
                                 (0.3, torch.float32, False)]:
        label = (f"x (200, 784) {dtype_name(dtype)}, sigma {sigma}, "
                 + ("a seeded generator" if seeded else "generator=None"))
        student.case(label)
        x = torch.rand(200, 784, generator=rng, dtype=dtype)
        y = (student.call("corrupt", x, sigma, generator=Seeded(int_seed(rng))) if seeded
             else student.call("corrupt", x, sigma))
        noise_stats(student, x, y, sigma, label)


@pytest.mark.item("corrupt", "properties")
def test_corrupt_properties(student, rng):
    x = torch.rand(4, 784, generator=rng)
    student.case("sigma = 0")
    for kwargs in ({}, {"generator": Seeded(int_seed(rng))}):
        got = student.call("corrupt", x, 0.0, **kwargs)
        check_tensor("corrupt(x, 0)", x, got)
        check_true(torch.equal(got, x), "corrupt(x, 0) must return x's values exactly "
                                        f"(max |diff| = {(got - x).abs().max().item():.3g})")
    seed = int_seed(rng)
    student.case(f"generator seeded with {seed}, twice; then with {seed + 1}")
    a = student.call("corrupt", x, 0.5, generator=Seeded(seed))
    b = student.call("corrupt", x, 0.5, generator=Seeded(seed))
    c = student.call("corrupt", x, 0.5, generator=Seeded(seed + 1))
    check_true(torch.equal(a, b), "two calls with generators seeded alike gave different noise: draw the noise "
                                  "from the generator argument")
    check_true(not torch.allclose(a, c), "generators with different seeds gave the same noise: the generator "
                                         "argument is not used")
    check_true(not torch.allclose(a, x), "corrupt(x, 0.5) returned x unchanged")
    student.case("the same draw on x and on x + 1")
    shifted = student.call("corrupt", x + 1, 0.5, generator=Seeded(seed))
    check_close("corrupt(x + 1, sigma) - 1", a, shifted - 1, atol=1e-5, oracle="corrupt(x, sigma)",
                case="the noise is added and does not depend on x's values (same generator seed)")


# --- pca ------------------------------------------------------------------------------------------

def low_rank_data(rng, m, d, r, dtype):
    """Centred (m, d) data: r strong directions of decreasing scale plus small isotropic noise."""
    scales = torch.linspace(3.0, 1.0, r, dtype=torch.float64)
    X = (randn(rng, m, r, dtype=torch.float64) * scales) @ randn(rng, r, d, dtype=torch.float64)
    X = X + 0.05 * randn(rng, m, d, dtype=torch.float64)
    return (X - X.mean(0, keepdim=True)).to(dtype)


@pytest.mark.item("pca", "shapes")
def test_pca_shapes(student, rng):
    for m, d, k, dtype in [(60, 10, 3, torch.float32), (20, 30, 4, torch.float64)]:
        student.case(f"X ({m}, {d}) {dtype_name(dtype)}, k = {k}")
        X = low_rank_data(rng, m, d, k + 2, dtype)
        V_k, err = check_tuple("pca", 2, student.call("pca", X, k))
        check_tensor("V_k", torch.empty(d, k, dtype=dtype), V_k, device=student.device)
        ok = isinstance(err, (int, float)) and not isinstance(err, bool) or \
            isinstance(err, torch.Tensor) and err.numel() == 1 and err.dtype.is_floating_point
        check_true(ok, f"'err' is {err!r}, expected a number (a 0-dim tensor or a float)")


@pytest.mark.item("pca", "values")
def test_pca_values(student, rng):
    for m, d, k, dtype in [(300, 20, 3, torch.float64), (50, 80, 5, torch.float64), (200, 12, 1, torch.float32),
                           (100, 24, 8, torch.float32), (40, 6, 6, torch.float64)]:
        label = f"X ({m}, {d}) {dtype_name(dtype)} centred, k = {k}"
        student.case(label)
        X = low_rank_data(rng, m, d, min(k + 2, d), dtype)
        V_k, err = check_tuple("pca", 2, student.call("pca", X, k))
        check_tensor("V_k", torch.empty(d, k), V_k, dtype=False)
        V = V_k.double()
        X64 = X.double()
        atol = tol(student, dtype, "decompositions")
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

def basis(rng, *shape, dtype=torch.float64):
    """A non-orthonormal basis of condition number 100: U diag(0.1 .. 10) R with U orthonormal, R a rotation,
    so the columns have different lengths and are not orthogonal, yet any sound method is accurate to 1e-10."""
    U, _ = torch.linalg.qr(randn(rng, *shape, dtype=torch.float64))
    R, _ = torch.linalg.qr(randn(rng, *shape[:-2], shape[-1], shape[-1], dtype=torch.float64))
    return (U * torch.logspace(-1, 1, shape[-1], dtype=torch.float64) @ R).to(dtype)


@pytest.mark.item("projector", "shapes")
def test_projector_shapes(student, rng):
    for shape, dtype in [((10, 3), torch.float32), ((4, 12, 5), torch.float64), ((2, 3, 6, 1), torch.float32)]:
        student.case(f"W {shape}, {dtype_name(dtype)}")
        W = basis(rng, *shape, dtype=dtype)
        d = shape[-2]
        check_tensor("projector(W)", torch.empty(*shape[:-2], d, d, dtype=dtype), student.call("projector", W),
                     device=student.device)


@pytest.mark.item("projector", "values")
def test_projector_values(student, rng):
    for shape, dtype in [((10, 3), torch.float64), ((4, 12, 5), torch.float64), ((7, 1), torch.float64),
                         ((784, 16), torch.float32), ((3, 6, 6), torch.float64)]:
        label = f"W {shape} {dtype_name(dtype)}, not orthonormal (singular values 0.1 to 10)"
        student.case(label)
        W = basis(rng, *shape, dtype=dtype)
        Q, _ = torch.linalg.qr(W.double())
        got = student.call("projector", W)
        check_close("projector(W)", Q @ Q.mT, got, atol=tol(student, dtype, "decompositions"),
                    oracle="Q Q^T with Q from torch.linalg.qr(W)",
                    dims=("batch",) * (len(shape) - 2) + ("row", "column"), case=label)


@pytest.mark.item("projector", "properties")
def test_projector_properties(student, rng):
    for shape in [(12, 4), (3, 9, 2)]:
        label = f"W {shape} float64"
        student.case(label)
        W = basis(rng, *shape)
        P = student.call("projector", W).double()
        k = shape[-1]
        check_close("P @ P", P, P @ P, atol=1e-8, oracle="P", case=label + ": a projector is idempotent")
        check_close("P^T", P, P.mT, atol=1e-8, oracle="P", case=label + ": an orthogonal projector is symmetric")
        check_close("P @ W", W, P @ W, atol=1e-8, oracle="W", case=label + ": P leaves the columns of W where they are")
        trace = torch.diagonal(P, dim1=-2, dim2=-1).sum(-1)
        check_close("trace(P)", torch.full_like(trace, float(k)), trace, atol=1e-8, oracle="k",
                    case=label + ": the trace is the rank k")
        R = randn(rng, *shape[:-2], k, k, dtype=torch.float64) + 3 * torch.eye(k, dtype=torch.float64)
        check_close("projector(W @ R)", P, student.call("projector", W @ R).double(), atol=1e-8, oracle="projector(W)",
                    case=label + ": another basis W R of the same column space gives the same P")


# --- principal_angle_cosines ------------------------------------------------------------------------

def scipy_cosines(W, V):
    angles = scipy.linalg.subspace_angles(W.double().numpy(), V.double().numpy())
    return torch.from_numpy(np.sort(np.cos(angles))[::-1].copy())


@pytest.mark.item("principal_angle_cosines", "shapes")
def test_angles_shapes(student, rng):
    for d, k1, k2, dtype in [(10, 3, 3, torch.float32), (20, 2, 5, torch.float64), (8, 4, 2, torch.float32)]:
        student.case(f"W ({d}, {k1}), V ({d}, {k2}), {dtype_name(dtype)}")
        W, V = basis(rng, d, k1, dtype=dtype), basis(rng, d, k2, dtype=dtype)
        check_tensor("principal_angle_cosines(W, V)", torch.empty(min(k1, k2), dtype=dtype),
                     student.call("principal_angle_cosines", W, V), device=student.device)


@pytest.mark.item("principal_angle_cosines", "values")
def test_angles_values(student, rng):
    cases = []
    for d, k1, k2, dtype in [(10, 3, 3, torch.float64), (20, 2, 5, torch.float64), (8, 4, 2, torch.float64),
                             (64, 16, 16, torch.float32)]:
        W, V = basis(rng, d, k1, dtype=dtype), basis(rng, d, k2, dtype=dtype)
        V[:, 0] = W[:, 0] + 0.1 * V[:, 0]           # one small angle, so the cosines are spread out
        cases.append((f"W ({d}, {k1}), V ({d}, {k2}) {dtype_name(dtype)}, non-orthonormal bases", W, V))
    W = basis(rng, 12, 4)
    R = randn(rng, 4, 4, dtype=torch.float64) + 3 * torch.eye(4, dtype=torch.float64)
    cases.append(("V = W R: the same subspace in another basis (all cosines 1)", W, W @ R))
    E = torch.eye(12, dtype=torch.float64)[torch.randperm(12, generator=rng)]
    cases.append(("orthogonal subspaces, columns of a permuted identity (all cosines 0)", E[:, :4] * 3, E[:, 4:7]))
    for label, W, V in cases:
        student.case(label)
        got = student.call("principal_angle_cosines", W, V)
        check_close("cosines", scipy_cosines(W, V), got, atol=tol(student, W.dtype, "decompositions") * 10,
                    oracle="cos(scipy.linalg.subspace_angles), descending", dims=("angle",), case=label)


# --- LinearAE ---------------------------------------------------------------------------------------

def linear_parts(student, net, k, n_in, label, dtype=torch.float32):
    """The student's We and Wd: bias-free maps n_in -> k and k -> n_in."""
    out = []
    for attr, shape in (("We", (k, n_in)), ("Wd", (n_in, k))):
        part = student.attr(net, attr)
        check_true(isinstance(part, Remote), f"LinearAE.{attr} is {part!r}, expected an nn.Linear (bias=False)")
        state = student.state(part)
        check_true(list(state) == ["weight"], f"LinearAE.{attr} has parameters {list(state)}, expected only "
                                              f"'weight' (an nn.Linear with bias=False), {label}")
        check_tensor(f"{attr}.weight", torch.empty(shape, dtype=dtype), state["weight"], device=student.device)
        out.append(part)
    n = len(student.state(net))
    check_true(n == 2, f"LinearAE has {n} parameters and buffers, expected 2 (We.weight and Wd.weight), {label}")
    return out


@pytest.mark.item("LinearAE", "shapes")
def test_linear_shapes(student, rng):
    for args, k, n_in in [((5,), 5, 784), ((5, 30), 5, 30), ((1, 4), 1, 4)]:
        label = f"LinearAE({', '.join(map(str, args))})"
        student.case(label)
        net = student.new("LinearAE", *args)
        linear_parts(student, net, k, n_in, label)
        x = randn(rng, 7, n_in)
        check_tensor("forward(x)", x, student.method(net, "forward", x), device=student.device)


@pytest.mark.item("LinearAE", "values")
def test_linear_values(student, rng):
    for k, n_in, B in [(5, 30, 7), (16, 784, 4), (3, 3, 2)]:
        label = f"LinearAE({k}, n_in={n_in}) with random weights, x ({B}, {n_in})"
        student.case(label)
        net = student.new("LinearAE", k, n_in=n_in)
        We_mod, Wd_mod = linear_parts(student, net, k, n_in, label)
        We, Wd = randn(rng, k, n_in), randn(rng, n_in, k)
        student.load_state(We_mod, [We])
        student.load_state(Wd_mod, [Wd])
        x = randn(rng, B, n_in)
        check_close("forward(x)", x @ We.T @ Wd.T, student.method(net, "forward", x), atol=tol(student, x.dtype) * 10,
                    oracle="x We^T Wd^T", dims=("row", "column"), case=label)


# --- train_linear_ae ----------------------------------------------------------------------------------

def trained(student, X, k, steps, lr, label, **kwargs):
    """train_linear_ae(...) in the student's process; `new` because training needs autograd switched on."""
    net = student.new("train_linear_ae", X, k, steps, lr, **kwargs)
    We_mod, Wd_mod = linear_parts(student, net, k, X.shape[1], label, dtype=X.dtype)
    We, Wd = student.state(We_mod)["weight"], student.state(Wd_mod)["weight"]
    return net, We.double(), Wd.double()


@pytest.mark.item("train_linear_ae", "shapes")
def test_train_shapes(student, rng):
    # two strong directions, then a clear gap: k = 2 is well defined and Adam gets there in 150 steps
    scales = torch.tensor([3.0, 2.5, 0.7, 0.5], dtype=torch.float64)
    X64 = (randn(rng, 100, 4, dtype=torch.float64) * scales) @ randn(rng, 4, 10, dtype=torch.float64)
    X64 = X64 + 0.05 * randn(rng, 100, 10, dtype=torch.float64)
    X64 = X64 - X64.mean(0, keepdim=True)
    X = X64.float()
    X64 = X.double()
    err_pca = ref.pca(X64, 2)[1].item()
    total = (X64 ** 2).sum(1).mean().item()
    for kwargs in ({}, {"batch": 25}):
        label = "train_linear_ae(X (100, 10) float32 centred, k=2, steps=150, lr=0.03" + \
            "".join(f", {k}={v}" for k, v in kwargs.items()) + ")"
        student.case(label)
        net, We, Wd = trained(student, X, 2, 150, 3e-2, label, **kwargs)
        check_tensor("forward(X)", X, student.method(net, "forward", X), device=student.device)
        err = ((X64 - X64 @ We.T @ Wd.T) ** 2).sum(1).mean().item()
        missed = (err - err_pca) / (total - err_pca)
        check_true(missed < 0.1,
                   f"after training the reconstruction error is {err:.4g}: PCA's rank-2 error is {err_pca:.4g} and "
                   f"the data's mean squared norm {total:.4g}, so the model captured only {1 - missed:.0%} of what "
                   f"PCA captures (expected at least 90%): is it trained with Adam at this lr for `steps` steps? "
                   f"{label}")
    X = low_rank_data(rng, 40, 8, 3, torch.float64)
    label = "train_linear_ae(X (40, 8) float64, k=3, steps=3, lr=0.01): the model follows X's dtype"
    student.case(label)
    trained(student, X, 3, 3, 1e-2, label)
    label = "train_linear_ae(X (40, 8) float64, k=3, steps=3, lr=0.01) with seed=0 and seed=1"
    student.case(label)
    _, We0, _ = trained(student, X, 3, 3, 1e-2, label, seed=0)
    _, We1, _ = trained(student, X, 3, 3, 1e-2, label, seed=1)
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
    copy_state(f"GRUEncoder({n_tokens}, {d}) besides its embedding", [v for k, v in items if k != first], gru,
               f"those of nn.GRU({d}, {d // 2}, bidirectional=True)")
    with torch.no_grad():
        emb.weight.copy_(state[first])
    return emb, gru


def tokens(rng, B, T, n_tokens):
    return torch.randint(0, n_tokens, (B, T), generator=rng)


@pytest.mark.item("GRUEncoder", "shapes")
def test_gru_shapes(student, rng):
    student.case("GRUEncoder(12, 32)")
    enc = student.new("GRUEncoder", 12, 32)
    n = sum(t.numel() for t in student.state(enc).values() if t.dtype.is_floating_point)
    check_true(n == 5184, f"GRUEncoder(12, 32) has {n:,} parameters, expected 5,184 (an embedding and a GRU "
                          f"with hidden 16 each way)")
    for B, T, with_lengths in [(5, 9, True), (5, 9, False), (1, 1, True)]:
        student.case(f"GRUEncoder(12, 32), x ({B}, {T}), " + ("lengths given" if with_lengths else "lengths=None"))
        x = tokens(rng, B, T, 12)
        args = (x, padding_mask(rng, B, T)[1]) if with_lengths else (x,)
        H, h_T = check_tuple("GRUEncoder.forward", 2, student.method(enc, "forward", *args))
        check_tensor("H", torch.empty(B, T, 32), H, device=student.device)
        check_tensor("h_T", torch.empty(B, 32), h_T, device=student.device)


@pytest.mark.item("GRUEncoder", "values")
def test_gru_values(student, rng):
    for n_tokens, B, T, d, with_lengths in [(12, 5, 9, 32, True), (13, 3, 4, 8, True), (12, 1, 1, 6, True),
                                            (12, 4, 7, 10, False), (12, 6, 12, 16, True)]:
        label = f"GRUEncoder({n_tokens}, {d}), x ({B}, {T}), " + (
            "padded rows with lengths" if with_lengths else "lengths=None")
        student.case(label)
        enc = student.new("GRUEncoder", n_tokens, d)
        emb, gru = gru_oracle(student.state(enc), n_tokens, d)
        x = tokens(rng, B, T, n_tokens)
        mask, lengths = padding_mask(rng, B, T) if with_lengths else (torch.ones(B, T, dtype=torch.bool),
                                                                   torch.full((B,), T))
        args = (x, lengths) if with_lengths else (x,)
        H, h_T = check_tuple("GRUEncoder.forward", 2, student.method(enc, "forward", *args))
        check_tensor("H", torch.empty(B, T, d), H, dtype=False)
        check_tensor("h_T", torch.empty(B, d), h_T, dtype=False)
        # CPU: 1e-5. CUDA: cuDNN's GRU differs from the CPU oracle by up to 3.5e-4 on the reference (H200), so 2e-3
        atol = 1e-5 if student.device == "cpu" else 2e-3
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

def score_cases(rng):
    """(label, s, H): s (B, d), H (B, T, d); B = 1 and T = 1 included, float64 once."""
    for B, T, d, dtype in [(4, 7, 16, torch.float32), (1, 1, 4, torch.float32), (3, 5, 8, torch.float64),
                           (2, 9, 6, torch.float32), (1, 6, 5, torch.float32)]:
        yield (f"s ({B}, {d}), H ({B}, {T}, {d}), {dtype_name(dtype)}", randn(rng, B, d, dtype=dtype),
               randn(rng, B, T, d, dtype=dtype))


def score_shapes(student, rng, name, extra=lambda rng, d, dtype: ()):
    for label, q, H in score_cases(rng):
        student.case(label)
        got = student.call(name, q, H, *extra(rng, q.shape[-1], q.dtype))
        check_tensor(f"{name}(s, H)", torch.empty(H.shape[:-1], dtype=q.dtype), got, device=student.device)


def score_values(student, rng, name, oracle, oracle_name, extra=lambda rng, d, dtype: (),
                 mistakes=lambda q, H, *args: {}):
    for label, q, H in score_cases(rng):
        student.case(label)
        args = extra(rng, q.shape[-1], q.dtype)
        got = student.call(name, q, H, *args)
        check_close(f"{name}(s, H)", oracle(q, H, *args), got, atol=tol(student, q.dtype) * 10, oracle=oracle_name,
                    dims=SCORE_DIMS, case=label, mistakes=mistakes(q, H, *args))


def small_scores(draw, extra=lambda draw, d: {}):
    """s (B, d) and H (B, T, d) of small integers, B, T, d in 1..3, then `extra(draw, d)`'s inputs."""
    case = {"B": dim(draw), "T": dim(draw), "d": dim(draw)}
    case["s"], case["H"] = ints(draw, case["B"], case["d"]), ints(draw, case["B"], case["T"], case["d"])
    case.update(extra(draw, case["d"]))
    return case


def score_search(name, oracle, extra=lambda draw, d: {}, extra_names=()):
    """The smallest s, H (and the score's weights `extra_names`) on which `name` disagrees with `oracle`."""
    return function_search(name, lambda draw: small_scores(draw, extra), oracle, ("scores",), ("s", "H", *extra_names))


def dot_oracle(q, H):
    return torch.einsum("bd,btd->bt", q, H)


@pytest.mark.item("score_dot", "shapes")
def test_dot_shapes(student, rng):
    score_shapes(student, rng, "score_dot")


@pytest.mark.item("score_dot", "values")
@smallest_case(score_search("score_dot", lambda q, H: dot_oracle(q, H)))
def test_dot_values(student, rng):
    score_values(student, rng, "score_dot", dot_oracle, "einsum('bd,btd->bt')")


@pytest.mark.item("score_scaled", "shapes")
def test_scaled_shapes(student, rng):
    score_shapes(student, rng, "score_scaled")


@pytest.mark.item("score_scaled", "values")
@smallest_case(score_search("score_scaled", lambda q, H: dot_oracle(q, H) / math.sqrt(q.shape[-1])))
def test_scaled_values(student, rng):
    scaled = lambda q, H: dot_oracle(q, H) / math.sqrt(q.shape[-1])  # noqa: E731
    score_values(student, rng, "score_scaled", scaled, "s^T h_t / sqrt(d)",
                 mistakes=lambda q, H: {SCALE_MISSING: scaled(unscaled(q), H)})


def general_args(rng, d, dtype):
    return (randn(rng, d, d, dtype=dtype),)           # not symmetric: W_a and W_a^T give different scores


@pytest.mark.item("score_general", "shapes")
def test_general_shapes(student, rng):
    score_shapes(student, rng, "score_general", general_args)


@pytest.mark.item("score_general", "values")
@smallest_case(score_search("score_general", lambda q, H, W: torch.einsum("bd,de,bte->bt", q, W, H),
                            lambda draw, d: {"W_a": ints(draw, d, d)}, ("W_a",)))
def test_general_values(student, rng):
    score_values(student, rng, "score_general", lambda q, H, W: torch.einsum("bd,de,bte->bt", q, W, H), "s^T W_a h_t",
                 general_args)
    label = "W_a = I (general attention is then the dot product)"
    student.case(label)
    q, H = randn(rng, 3, 8), randn(rng, 3, 5, 8)
    check_close("score_general(s, H, I)", dot_oracle(q, H), student.call("score_general", q, H, torch.eye(8)),
                atol=tol(student, q.dtype) * 10, oracle="s^T h_t", dims=SCORE_DIMS, case=label)


def cosine_oracle(q, H):
    return F.cosine_similarity(q[:, None, :].expand_as(H), H, dim=-1)


def small_additive(draw, d):
    k = dim(draw, 1, 2)
    return {"k": k, "W_a": ints(draw, k, 2 * d), "v_a": ints(draw, k)}


@pytest.mark.item("score_cosine", "shapes")
def test_cosine_shapes(student, rng):
    score_shapes(student, rng, "score_cosine")


@pytest.mark.item("score_cosine", "values")
@smallest_case(score_search("score_cosine", cosine_oracle))
def test_cosine_values(student, rng):
    score_values(student, rng, "score_cosine", cosine_oracle, "F.cosine_similarity")
    label = "s (2, 6) and H (2, 4, 6) scaled by 1e3 and 1e-3: the cosine ignores lengths"
    student.case(label)
    q, H = randn(rng, 2, 6), randn(rng, 2, 4, 6)
    check_close("score_cosine(1e3 s, 1e-3 H)", cosine_oracle(q, H), student.call("score_cosine", q * 1e3, H * 1e-3),
                atol=tol(student, q.dtype) * 10, oracle="F.cosine_similarity(s, H)", dims=SCORE_DIMS, case=label)
    label = "H (2, 4, 6) whose state 2 of row 1 is all zeros (F.cosine_similarity gives 0 there)"
    student.case(label)
    H[1, 2] = 0
    check_close("score_cosine(s, H)", cosine_oracle(q, H), student.call("score_cosine", q, H),
                atol=tol(student, q.dtype) * 10, oracle="F.cosine_similarity", dims=SCORE_DIMS, case=label)


def additive_args(rng, d, dtype):
    k = 2 * d + 3                                   # k != 2d, so W_a's two axes cannot be confused
    return randn(rng, k, 2 * d, dtype=dtype) / math.sqrt(d), randn(rng, k, dtype=dtype)


def additive_oracle(q, H, W_a, v_a):
    pair = torch.cat([q[:, None, :].expand_as(H), H], dim=-1)               # [s; h_t], (B, T, 2d)
    return torch.tanh(pair @ W_a.T) @ v_a


@pytest.mark.item("score_additive", "shapes")
def test_additive_shapes(student, rng):
    score_shapes(student, rng, "score_additive", additive_args)


@pytest.mark.item("score_additive", "values")
@smallest_case(score_search("score_additive", additive_oracle, small_additive, ("W_a", "v_a")))
def test_additive_values(student, rng):
    score_values(student, rng, "score_additive", additive_oracle, "v_a^T tanh(W_a [s; h_t])", additive_args)


def location_cases(rng):
    for B, T, d, dtype in [(4, 7, 16, torch.float32), (1, 1, 4, torch.float32), (3, 5, 8, torch.float64),
                           (2, 12, 3, torch.float32)]:
        yield (f"s ({B}, {d}), W_loc ({T}, {d}), {dtype_name(dtype)}", randn(rng, B, d, dtype=dtype),
               randn(rng, T, d, dtype=dtype))


@pytest.mark.item("alpha_location", "shapes")
def test_location_shapes(student, rng):
    for label, q, W in location_cases(rng):
        student.case(label)
        check_tensor("alpha_location(s, W_loc)", torch.empty(q.shape[0], W.shape[0], dtype=q.dtype),
                     student.call("alpha_location", q, W), device=student.device)


def small_location(draw):
    case = {"B": dim(draw), "T": dim(draw), "d": dim(draw)}
    case["s"], case["W_loc"] = ints(draw, case["B"], case["d"]), ints(draw, case["T"], case["d"])
    return case


@pytest.mark.item("alpha_location", "values")
@smallest_case(function_search("alpha_location", small_location, lambda q, W: torch.softmax(q @ W.T, dim=-1),
                               ("alpha",), ("s", "W_loc")))
def test_location_values(student, rng):
    for label, q, W in location_cases(rng):
        student.case(label)
        check_close("alpha_location(s, W_loc)", torch.softmax(q @ W.T, dim=-1), student.call("alpha_location", q, W),
                    atol=tol(student, q.dtype), oracle="softmax(W_loc s)", dims=SCORE_DIMS, case=label)


@pytest.mark.item("alpha_location", "properties")
def test_location_properties(student, rng):
    q, W = randn(rng, 3, 6, dtype=torch.float64), randn(rng, 8, 6, dtype=torch.float64)
    label = "s (3, 6), W_loc (8, 6) float64"
    student.case(label)
    a = student.call("alpha_location", q, W)
    check_true(bool((a >= 0).all()), f"alpha_location has negative weights ({label})")
    check_close("row sums", torch.ones(3, dtype=torch.float64), a.sum(-1), atol=1e-10, oracle="1",
                case=label + ": each row is a distribution over the T positions")
    shift = randn(rng, 6, dtype=torch.float64)
    check_close("alpha_location(s, W_loc + 1 c^T)", a, student.call("alpha_location", q, W + shift), atol=1e-10,
                oracle="alpha_location(s, W_loc)",
                case=label + ": adding one vector c to every row of W_loc shifts every score by c^T s, which "
                             "cancels in the softmax")
    perm = torch.randperm(8, generator=rng)
    check_close("alpha_location(s, W_loc[perm])", a[:, perm], student.call("alpha_location", q, W[perm]), atol=1e-10,
                oracle="alpha_location(s, W_loc)[:, perm]",
                case=label + ": permuting the rows of W_loc permutes the weights (position t reads row t)")
    other = student.call("alpha_location", randn(rng, 3, 6, dtype=torch.float64), W)
    check_true(not torch.allclose(a, other),
               "the weights did not change with s: location attention is softmax(W_loc s)")
    student.case("W_loc scaled by 1e3 (very sharp weights)")
    sharp = student.call("alpha_location", q, W * 1e3)
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


def context_cases(rng):
    """(label, scores, H, mask)."""
    yield "scores (4, 7), H (4, 7, 16), no mask", randn(rng, 4, 7) * 2, randn(rng, 4, 7, 16), None
    mask, _ = padding_mask(rng, 5, 9)
    yield ("scores (5, 9), H (5, 9, 6), padding mask (True = real token)", randn(rng, 5, 9) * 2, randn(rng, 5, 9, 6),
           mask)
    mask, _ = padding_mask(rng, 3, 6)
    yield ("scores (3, 6), H (3, 6, 4) float64, padding mask", randn(rng, 3, 6, dtype=torch.float64),
           randn(rng, 3, 6, 4, dtype=torch.float64), mask)
    yield ("scores (1, 1), H (1, 1, 5), one position", randn(rng, 1, 1), randn(rng, 1, 1, 5),
           torch.ones(1, 1, dtype=torch.bool))
    mask, _ = padding_mask(rng, 4, 8)
    mask[1] = torch.rand(8, generator=rng) < 0.5
    mask[1, 3] = True
    yield ("scores (4, 8) + 500, H (4, 8, 3), mask with holes in row 1 (large scores must not overflow)",
           randn(rng, 4, 8) * 3 + 500, randn(rng, 4, 8, 3), mask)


@pytest.mark.item("attention_context", "shapes")
def test_context_shapes(student, rng):
    for label, scores, H, mask in list(context_cases(rng))[:4]:
        student.case(label)
        c, alpha = check_tuple("attention_context", 2, student.call("attention_context", scores, H, mask=mask))
        check_tensor("c", torch.empty(H.shape[0], H.shape[-1], dtype=H.dtype), c, device=student.device)
        check_tensor("alpha", scores, alpha, device=student.device)


def small_context(draw):
    """scores (B, T), H (B, T, d), a (B, T) mask (True = real, one at least per row) or none."""
    case = {"B": dim(draw), "T": dim(draw), "d": dim(draw)}
    case["scores"], case["H"] = ints(draw, case["B"], case["T"]), ints(draw, case["B"], case["T"], case["d"])
    case["mask"] = bool_mask(draw, case["B"], case["T"], open_value=True)
    return case


@pytest.mark.item("attention_context", "values")
@smallest_case(function_search("attention_context", small_context, context_oracle, ("c", "alpha"), ("scores", "H"),
                               ("mask",)))
def test_context_values(student, rng):
    for label, scores, H, mask in context_cases(rng):
        student.case(label)
        c, alpha = check_tuple("attention_context", 2, student.call("attention_context", scores, H, mask=mask))
        ref_c, ref_alpha = context_oracle(scores, H, mask)
        atol = tol(student, H.dtype)
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
        student.case(label)
        q, H = randn(rng, B, d), randn(rng, B, T, d)
        mask = padding_mask(rng, B, T)[0] if with_mask else None
        scores = dot_oracle(q, H) / math.sqrt(d)
        c, alpha = check_tuple("attention_context", 2, student.call("attention_context", scores, H, mask=mask))
        ref_c, ref_alpha = mha_oracle(q, H, mask)
        check_close("alpha", ref_alpha, alpha, atol=tol(student, H.dtype), oracle="nn.MultiheadAttention's weights",
                    dims=SCORE_DIMS, case=label)
        check_close("c", ref_c, c, atol=tol(student, H.dtype), oracle="nn.MultiheadAttention (identity projections)",
                    dims=("batch", "unit"), case=label)


@pytest.mark.item("attention_context", "gradients")
@smallest_case(gradient_search(
    "attention_context", with_upstream(with_upstream(small_context, "d_c", lambda c: (c["B"], c["d"])), "d_alpha",
                                       lambda c: (c["B"], c["T"])),
    context_oracle, ("scores", "H", "mask"), ("scores", "H"), ("d_c", "d_alpha")))
def test_context_gradients(student, rng):
    for label, scores, H, mask in list(context_cases(rng))[:3]:
        student.case(label + ", gradients w.r.t. scores and H")
        up_c, up_a = randn(rng, H.shape[0], H.shape[-1], dtype=H.dtype), randn(rng, *scores.shape, dtype=H.dtype)
        _, grads = student.grad("attention_context", (scores, H, mask), wrt=[0, 1], upstream=[up_c, up_a])
        leaves = [t.clone().requires_grad_(True) for t in (scores, H)]
        ref_c, ref_alpha = context_oracle(*leaves, mask)
        expected = torch.autograd.grad((ref_c * up_c).sum() + (ref_alpha * up_a).sum(), leaves)
        for name, e, got, dims in zip(("d/dscores", "d/dH"), expected, grads, (SCORE_DIMS, SCORE_DIMS + ("unit",)),
                                  strict=False):
            if got is None:
                raise Fail(f"no gradient reached {name[2:]} ({label})")
            check_close(name, e, got, atol=1e-4 if H.dtype == torch.float32 else 1e-9,
                        oracle="autograd through F.scaled_dot_product_attention", dims=dims, case=label)


@pytest.mark.item("attention_context", "properties")
def test_context_properties(student, rng):
    B, T, d = 5, 8, 6
    scores, H = randn(rng, B, T, dtype=torch.float64) * 2, randn(rng, B, T, d, dtype=torch.float64)
    mask, lengths = padding_mask(rng, B, T)
    label = f"scores ({B}, {T}), H ({B}, {T}, {d}) float64, padding mask"
    student.case(label)
    c, alpha = check_tuple("attention_context", 2, student.call("attention_context", scores, H, mask=mask))
    check_true(bool((alpha >= 0).all()), f"alpha has negative weights ({label})")
    check_close("row sums of alpha", torch.ones(B, dtype=torch.float64), alpha.sum(-1), atol=1e-10, oracle="1",
                case=label + ": alpha is a distribution over the real positions")
    if not bool((alpha[~mask] == 0).all()):
        raise Fail(f"padded positions get weight {alpha[~mask].abs().max().item():.3g}, expected exactly 0 ({label})")
    check_true(bool(((c >= H.min(1).values - 1e-10) & (c <= H.max(1).values + 1e-10)).all()),
               f"c lies outside the box spanned by the states h_j: it must be a convex combination ({label})")
    student.case(label + "; the padded states and their scores replaced by large junk")
    junk_H = torch.where(mask[..., None], H, 1e3 * randn(rng, B, T, d, dtype=torch.float64))
    junk_scores = torch.where(mask, scores, 50 + 10 * randn(rng, B, T, dtype=torch.float64))
    c2, alpha2 = student.call("attention_context", junk_scores, junk_H, mask=mask)
    check_close("alpha", alpha, alpha2, atol=1e-10, oracle="alpha before",
                case="what sits at padded positions must not change alpha")
    check_close("c", c, c2, atol=1e-8, oracle="c before", case="what sits at padded positions must not change c")
    student.case(label + "; every score of a row shifted by the same constant")
    shift = 100 * randn(rng, B, 1, dtype=torch.float64)
    _, alpha3 = student.call("attention_context", scores + shift, H, mask=mask)
    check_close("alpha(scores + const)", alpha, alpha3, atol=1e-10, oracle="alpha(scores)",
                case="the softmax ignores a per-row constant")
    student.case("row 1 with no real token (its mask row all False), float64: zero weights and a zero context, not NaN")
    scores, H = randn(rng, 3, 5, dtype=torch.float64), randn(rng, 3, 5, 4, dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    c, alpha = student.call("attention_context", scores, H, mask=mask)
    ref_alpha = scores.masked_fill(~mask, -math.inf).softmax(-1).nan_to_num(0.0)  # (3, 5): row 1 zeros
    check_close("alpha", ref_alpha, alpha, atol=1e-10, oracle="softmax over the real positions, zeros where none is",
                case=student.label)
    check_close("c", torch.einsum("bt,btd->bd", ref_alpha, H), c, atol=1e-10, oracle="sum_j alpha_j h_j",
                case=student.label)


# --- unroll_annotations -----------------------------------------------------------------------------

@pytest.mark.item("unroll_annotations", "shapes")
def test_unroll_shapes(student, rng):
    for shape, dtype in [((2, 5, 3, 4), torch.float32), ((1, 32, 8, 8), torch.float64), ((3, 1, 2, 7), torch.float32)]:
        student.case(f"volume {shape}, {dtype_name(dtype)}")
        N, C, Hh, W = shape
        check_tensor("unroll_annotations(volume)", torch.empty(N, Hh * W, C, dtype=dtype),
                     student.call("unroll_annotations", randn(rng, *shape, dtype=dtype)), device=student.device)


def small_volume(draw):
    case = {"N": dim(draw, 1, 2), "C": dim(draw, 1, 2), "H": dim(draw), "W": dim(draw)}
    case["volume"] = ints(draw, *case.values())
    return case


@pytest.mark.item("unroll_annotations", "values")
@smallest_case(function_search("unroll_annotations", small_volume,
                               lambda v: v.permute(0, 2, 3, 1).reshape(v.shape[0], -1, v.shape[1]), ("annotations",),
                               ("volume",)))
def test_unroll_values(student, rng):
    for shape, dtype in [((2, 5, 3, 4), torch.float32), ((1, 32, 8, 8), torch.float64), ((3, 6, 2, 7), torch.float32),
                         ((2, 4, 5, 1), torch.float32)]:
        label = f"volume {shape} (N, C, H, W), {dtype_name(dtype)}"
        student.case(label)
        N, C, Hh, W = shape
        volume = randn(rng, *shape, dtype=dtype)
        got = student.call("unroll_annotations", volume)
        check_close("annotations", volume.permute(0, 2, 3, 1).reshape(N, Hh * W, C), got, atol=0, rtol=0,
                    oracle="annotation l = i * W + j holding volume[n, :, i, j] (row-major)",
                    dims=("image", "annotation", "channel"), case=label)


# --- spatial_attention --------------------------------------------------------------------------------

def spatial_oracle(q, A, W_a):
    alpha = torch.softmax(torch.einsum("bd,de,ble->bl", q, W_a, A), dim=-1)
    return torch.einsum("bl,bld->bd", alpha, A), alpha


def spatial_cases(rng):
    for B, L, d, dtype in [(4, 64, 16, torch.float32), (2, 12, 8, torch.float64), (1, 5, 3, torch.float32),
                           (3, 64, 32, torch.float32)]:
        yield (f"s ({B}, {d}), A ({B}, {L}, {d}), W_a ({d}, {d}) {dtype_name(dtype)}", randn(rng, B, d, dtype=dtype),
               randn(rng, B, L, d, dtype=dtype), randn(rng, d, d, dtype=dtype) / math.sqrt(d))


@pytest.mark.item("spatial_attention", "shapes")
def test_spatial_shapes(student, rng):
    for label, q, A, W in list(spatial_cases(rng))[:3]:
        student.case(label)
        ctx, alpha = check_tuple("spatial_attention", 2, student.call("spatial_attention", q, A, W))
        check_tensor("ctx", q, ctx, device=student.device)
        check_tensor("alpha", torch.empty(A.shape[:2], dtype=q.dtype), alpha, device=student.device)


def small_spatial(draw):
    case = {"B": dim(draw), "L": dim(draw), "d": dim(draw)}
    case["s"], case["A"] = ints(draw, case["B"], case["d"]), ints(draw, case["B"], case["L"], case["d"])
    case["W_a"] = ints(draw, case["d"], case["d"])
    return case


@pytest.mark.item("spatial_attention", "values")
@smallest_case(function_search("spatial_attention", small_spatial, spatial_oracle, ("ctx", "alpha"), ("s", "A", "W_a")))
def test_spatial_values(student, rng):
    cases = list(spatial_cases(rng))
    q, A = randn(rng, 3, 8), randn(rng, 3, 10, 8)
    cases.append(("s (3, 8), A (3, 10, 8), W_a = I", q, A, torch.eye(8)))
    for label, q, A, W in cases:
        student.case(label)
        ctx, alpha = check_tuple("spatial_attention", 2, student.call("spatial_attention", q, A, W))
        ref_ctx, ref_alpha = spatial_oracle(q, A, W)
        atol = tol(student, q.dtype) * 10
        check_close("alpha", ref_alpha, alpha, atol=atol, oracle="softmax_l(s^T W_a a_l)",
                    dims=("batch", "annotation"), case=label)
        check_close("ctx", ref_ctx, ctx, atol=atol, oracle="sum_l alpha_l a_l", dims=("batch", "unit"), case=label)


# --- hard_attention -----------------------------------------------------------------------------------

def alpha_cases(rng):
    for shape, dtype in [((4, 7), torch.float32), ((3, 12), torch.float64), ((1, 5), torch.float32),
                         ((2, 3, 6), torch.float32), ((4, 1), torch.float32)]:
        yield (f"alpha {shape} {dtype_name(dtype)} (rows are softmax weights)",
               torch.softmax(randn(rng, *shape, dtype=dtype) * 2, -1))


@pytest.mark.item("hard_attention", "shapes")
def test_hard_shapes(student, rng):
    for label, alpha in list(alpha_cases(rng))[:3]:
        student.case(label)
        check_tensor("hard_attention(alpha)", alpha, student.call("hard_attention", alpha), device=student.device)


def small_alpha(draw):
    """alpha (B, T): each row a permutation of 1..T, normalised (one clear argmax per row)."""
    case = {"B": dim(draw), "T": dim(draw)}
    rows = torch.tensor([draw(st.permutations(range(1, case["T"] + 1))) for _ in range(case["B"])], dtype=torch.float32)
    case["alpha"] = rows / rows.sum(-1, keepdim=True)
    return case


@pytest.mark.item("hard_attention", "values")
@smallest_case(function_search("hard_attention", small_alpha,
                               lambda a: F.one_hot(a.argmax(-1), a.shape[-1]).to(a.dtype), ("hard",), ("alpha",)))
def test_hard_values(student, rng):
    for label, alpha in alpha_cases(rng):
        student.case(label)
        want = F.one_hot(alpha.argmax(-1), alpha.shape[-1]).to(alpha.dtype)
        got = student.call("hard_attention", alpha)
        check_tensor("hard_attention(alpha)", alpha, got)
        check_close("hard_attention(alpha)", want, got, atol=0, rtol=0, oracle="one-hot at argmax_j alpha_j",
                    dims=("batch",) * (alpha.dim() - 1) + ("position",), case=label)


# --- local_attention ----------------------------------------------------------------------------------

def local_oracle(alpha, centre, D):
    pos = torch.arange(alpha.shape[-1])
    kept = alpha * ((pos - centre[:, None]).abs() <= D)
    return kept / kept.sum(-1, keepdim=True)


def local_cases(rng):
    """(label, alpha, centre, D): windows at random centres, at the edges, at the argmax, at p_t = t."""
    alpha = torch.softmax(randn(rng, 6, 10), -1)
    centre = torch.randint(0, 10, (6,), generator=rng)
    centre[0], centre[1] = 0, 9
    for D in (2, 0, 1):
        yield f"alpha (6, 10), centres {centre.tolist()}, D = {D}", alpha, centre, D
    alpha = torch.softmax(randn(rng, 4, 12, dtype=torch.float64) * 2, -1)
    yield "alpha (4, 12) float64, centre at the argmax, D = 3", alpha, alpha.argmax(-1), 3
    yield "alpha (4, 12) float64, centre p_t = 5 for every row, D = 2", alpha, torch.full((4,), 5), 2
    alpha = torch.softmax(randn(rng, 3, 7), -1)
    yield "alpha (3, 7), D = 6 (the window covers everything from any centre)", alpha, torch.tensor([0, 3, 6]), 6


@pytest.mark.item("local_attention", "shapes")
def test_local_shapes(student, rng):
    for label, alpha, centre, D in list(local_cases(rng))[:4]:
        student.case(label)
        check_tensor("local_attention(alpha, centre, D)", alpha, student.call("local_attention", alpha, centre, D),
                     device=student.device)


def small_local(draw):
    """alpha (B, T) rows of 1, 2, 3 normalised, a centre per row, D in 0..2."""
    case = {"B": dim(draw), "T": dim(draw, 1, 4)}
    weights = ints(draw, case["B"], case["T"], lo=1, hi=3)
    case["alpha"] = weights / weights.sum(-1, keepdim=True)
    case["centre"] = torch.tensor([draw(st.integers(0, case["T"] - 1)) for _ in range(case["B"])])
    case["D"] = draw(st.integers(0, 2))
    return case


@pytest.mark.item("local_attention", "values")
@smallest_case(function_search("local_attention", small_local, local_oracle, ("alpha_local",),
                               ("alpha", "centre", "D")))
def test_local_values(student, rng):
    for label, alpha, centre, D in local_cases(rng):
        student.case(label)
        got = student.call("local_attention", alpha, centre, D)
        check_close("local_attention(alpha, centre, D)", local_oracle(alpha, centre, D), got,
                    atol=tol(student, alpha.dtype), oracle="alpha zeroed where |j - centre| > D, rows renormalised",
                    dims=("batch", "position"), case=label)


@pytest.mark.item("local_attention", "properties")
def test_local_properties(student, rng):
    T = 11
    alpha = torch.softmax(randn(rng, 5, T, dtype=torch.float64) * 2, -1)
    centre = torch.randint(0, T, (5,), generator=rng)
    pos = torch.arange(T)
    previous = None
    for D in (0, 1, 3):
        label = f"alpha (5, {T}) float64, centres {centre.tolist()}, D = {D}"
        student.case(label)
        got = student.call("local_attention", alpha, centre, D)
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
    student.case(label)
    at_max = student.call("local_attention", alpha, alpha.argmax(-1), 0)
    check_close("local_attention(alpha, argmax, 0)", F.one_hot(alpha.argmax(-1), T).double(), at_max, atol=1e-12,
                oracle="one-hot at the argmax", dims=("batch", "position"),
                case=label)
    check_close(f"local_attention(alpha, centre, {T - 1})", alpha,
                student.call("local_attention", alpha, centre, T - 1), oracle="alpha", dims=("batch", "position"),
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


def self_cases(rng):
    yield "one sequence H (7, 16)", randn(rng, 7, 16)
    yield "a batch H (3, 5, 8)", randn(rng, 3, 5, 8) * 2
    yield "a batch H (2, 6, 4) float64", randn(rng, 2, 6, 4, dtype=torch.float64) * 2
    yield "one sequence H (12, 32) float64", randn(rng, 12, 32, dtype=torch.float64)
    yield "one sequence H (1, 5)", randn(rng, 1, 5)


@pytest.mark.item("self_attention", "shapes")
def test_self_shapes(student, rng):
    for label, H in list(self_cases(rng))[:3]:
        student.case(label)
        Z, A = check_tuple("self_attention", 2, student.call("self_attention", H))
        check_tensor("Z", H, Z, device=student.device)
        check_tensor("A", torch.empty(*H.shape[:-1], H.shape[-2], dtype=H.dtype), A, device=student.device)


def small_self(draw):
    """H (T, d) or (B, T, d) of small integers."""
    case = {"B": dim(draw, 1, 2)} if draw(st.booleans()) else {}
    case.update(T=dim(draw), d=dim(draw))
    case["H"] = ints(draw, *case.values())
    return case


def self_attention_oracle(H):
    Z, A = self_oracle(H if H.dim() == 3 else H[None])
    return (Z, A) if H.dim() == 3 else (Z[0], A[0])


@pytest.mark.item("self_attention", "values")
@smallest_case(function_search("self_attention", small_self, self_attention_oracle, ("Z", "A"), ("H",)))
def test_self_values(student, rng):
    for label, H in self_cases(rng):
        student.case(label)
        Z, A = check_tuple("self_attention", 2, student.call("self_attention", H))
        batch = H if H.dim() == 3 else H[None]
        (ref_Z, ref_A), (bad_Z, bad_A) = self_oracle(batch), self_oracle(batch, math.sqrt(H.shape[-1]))
        if H.dim() == 2:
            ref_Z, ref_A, bad_Z, bad_A = ref_Z[0], ref_A[0], bad_Z[0], bad_A[0]
        dims = ("batch",) * (H.dim() - 2)
        atol = tol(student, H.dtype) * 10
        check_close("A", ref_A, A, atol=atol, oracle="nn.MultiheadAttention's weights (one head, identity projections)",
                    dims=dims + ("query", "key"), case=label, mistakes={SCALE_MISSING: bad_A})
        check_close("Z", ref_Z, Z, atol=atol, oracle="nn.MultiheadAttention (one head, identity projections)",
                    dims=dims + ("position", "unit"), case=label, mistakes={SCALE_MISSING: bad_Z})
