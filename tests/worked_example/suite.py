"""Hidden checks of w9l1_vit: patchify against F.unfold, PatchClassifier against the reference carrying the
student's weights. PYTEST_DONT_REWRITE"""
import pytest
import torch
import torch.nn.functional as F

from autograder.grading.suite_api import check_close, check_tensor, copy_state, randn, reference, tol

ref = reference("w9l1_vit")


# --- patchify --------------------------------------------------------------------------------------------------------

def patchify_cases(rng):
    """(label, arguments) that `patchify` is checked on."""
    yield "images (2, 1, 28, 28), P 7", (randn(rng, 2, 1, 28, 28), 7)
    yield "images (3, 3, 8, 12) float64, P 4: colour, not square", (randn(rng, 3, 3, 8, 12, dtype=torch.float64), 4)
    yield "images (1, 1, 4, 4), P 4: one patch", (randn(rng, 1, 1, 4, 4), 4)


@pytest.mark.item("patchify", "shapes")
def test_patchify_shapes(student, rng):
    for label, args in patchify_cases(rng):
        student.case(label)
        check_tensor("patchify", ref.patchify(*args), student.call("patchify", *args), device=student.device)


@pytest.mark.item("patchify", "values")
def test_patchify_values(student, rng):
    for label, (images, P) in patchify_cases(rng):
        student.case(label)
        expected = F.unfold(images, P, stride=P).transpose(1, 2)  # (B, N, C*P*P), patches row by row
        check_close("patchify", expected, student.call("patchify", images, P), atol=tol(student, images.dtype),
                    oracle="F.unfold", case=label)


# --- PatchClassifier -------------------------------------------------------------------------------------------------

def patchclassifier_cases(rng):
    """(label, constructor arguments, forward arguments) that `PatchClassifier` is checked on."""
    yield "PatchClassifier(), images (2, 1, 28, 28)", (), (randn(rng, 2, 1, 28, 28),)
    yield "PatchClassifier(4, 16, 3, 16), images (3, 1, 16, 16)", (4, 16, 3, 16), (randn(rng, 3, 1, 16, 16),)


@pytest.mark.item("PatchClassifier", "shapes")
def test_patchclassifier_shapes(student, rng):
    for label, init, args in patchclassifier_cases(rng):
        student.case(label)
        model = student.new("PatchClassifier", *init)
        expected = ref.PatchClassifier(*init).eval()(*args)
        student.method(model, "eval")
        check_tensor("forward", expected, student.method(model, "forward", *args), device=student.device)


@pytest.mark.item("PatchClassifier", "values")
def test_patchclassifier_values(student, rng):
    for label, init, args in patchclassifier_cases(rng):
        student.case(label)
        model = student.new("PatchClassifier", *init)
        student.method(model, "eval")
        weights = [randn(rng, *t.shape) / 4 if t.is_floating_point() else t  # none left at its init
                   for t in student.state(model).values()]
        student.load_state(model, weights)
        oracle = ref.PatchClassifier(*init).eval()
        copy_state("PatchClassifier", weights, oracle)
        with torch.no_grad():
            expected = oracle(*args)
        check_close("forward", expected, student.method(model, "forward", *args),
                    atol=tol(student, args[0].dtype), oracle="the reference with your weights",
                    case=label)
