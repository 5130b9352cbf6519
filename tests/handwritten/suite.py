"""Hidden checks of w9l2_normalization: layer_norm against F.layer_norm, RMSNorm against the formula, NormMLP against
the reference carrying the student's weights. PYTEST_DONT_REWRITE"""
import pytest
import torch
import torch.nn.functional as F

from autograder.grading.suite_api import check_close, check_tensor, copy_state, randn, reference, tol

ref = reference("w9l2_normalization")


# --- layer_norm ------------------------------------------------------------------------------------------------------

def layer_norm_cases(rng):
    """(label, arguments) that `layer_norm` is checked on."""
    yield "x (2, 5, 8) float64", (randn(rng, 2, 5, 8, dtype=torch.float64), randn(rng, 8, dtype=torch.float64),
                                  randn(rng, 8, dtype=torch.float64))
    yield "x (6,): one vector", (randn(rng, 6), randn(rng, 6), randn(rng, 6))
    yield "x (3, 4) float64, eps 0.5", (randn(rng, 3, 4, dtype=torch.float64), randn(rng, 4, dtype=torch.float64),
                                        randn(rng, 4, dtype=torch.float64), 0.5)


@pytest.mark.item("layer_norm", "shapes")
def test_layer_norm_shapes(student, rng):
    for label, args in layer_norm_cases(rng):
        student.case(label)
        check_tensor("layer_norm", ref.layer_norm(*args), student.call("layer_norm", *args), device=student.device)


@pytest.mark.item("layer_norm", "values")
def test_layer_norm_values(student, rng):
    for label, (x, weight, bias, *eps) in layer_norm_cases(rng):
        student.case(label)
        expected = F.layer_norm(x, weight.shape, weight, bias, *eps)
        check_close("layer_norm", expected, student.call("layer_norm", x, weight, bias, *eps),
                    atol=tol(student, x.dtype), oracle="F.layer_norm", case=label)


# --- RMSNorm ---------------------------------------------------------------------------------------------------------

def rmsnorm_cases(rng):
    """(label, constructor arguments, forward arguments) that `RMSNorm` is checked on."""
    yield "RMSNorm(8), x (2, 5, 8)", (8,), (randn(rng, 2, 5, 8),)
    yield "RMSNorm(6, 0.5), x (6,): one vector", (6, 0.5), (randn(rng, 6),)


@pytest.mark.item("RMSNorm", "shapes")
def test_rmsnorm_shapes(student, rng):
    for label, init, args in rmsnorm_cases(rng):
        student.case(label)
        model = student.new("RMSNorm", *init)
        expected = ref.RMSNorm(*init)(*args)
        check_tensor("forward", expected, student.method(model, "forward", *args), device=student.device)


@pytest.mark.item("RMSNorm", "values")
def test_rmsnorm_values(student, rng):
    for label, (d, *eps), (x,) in rmsnorm_cases(rng):
        student.case(label)
        model = student.new("RMSNorm", d, *eps)
        weight = randn(rng, d)
        student.load_state(model, [weight])
        expected = x / torch.sqrt((x * x).mean(-1, keepdim=True) + (eps[0] if eps else 1e-6)) * weight
        check_close("forward", expected, student.method(model, "forward", x), atol=tol(student, x.dtype),
                    oracle="x / sqrt(mean(x ** 2) + eps) * weight", case=label)


# --- NormMLP ---------------------------------------------------------------------------------------------------------

def normmlp_cases(rng):
    """(label, constructor arguments, forward arguments) that `NormMLP` is checked on."""
    yield "NormMLP(), images (2, 1, 28, 28)", (), (randn(rng, 2, 1, 28, 28),)
    yield "NormMLP(16), images (3, 1, 28, 28)", (16,), (randn(rng, 3, 1, 28, 28),)


@pytest.mark.item("NormMLP", "shapes")
def test_normmlp_shapes(student, rng):
    for label, init, args in normmlp_cases(rng):
        student.case(label)
        model = student.new("NormMLP", *init)
        expected = ref.NormMLP(*init).eval()(*args)
        student.method(model, "eval")
        check_tensor("forward", expected, student.method(model, "forward", *args), device=student.device)


@pytest.mark.item("NormMLP", "values")
def test_normmlp_values(student, rng):
    for label, init, args in normmlp_cases(rng):
        student.case(label)
        model = student.new("NormMLP", *init)
        student.method(model, "eval")
        weights = [randn(rng, *t.shape) / 4 for t in student.state(model).values()]  # none left at its init
        student.load_state(model, weights)
        oracle = ref.NormMLP(*init).eval()
        copy_state("NormMLP", weights, oracle)
        with torch.no_grad():
            expected = oracle(*args)
        check_close("forward", expected, student.method(model, "forward", *args), atol=tol(student, args[0].dtype),
                    oracle="the reference with your weights", case=label)
