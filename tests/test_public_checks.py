"""The public-check helper students run: stand-alone, honest counts, and a hint for a recognised mistake."""
import ast
import math

import pytest
import torch
import torch.nn.functional as F

from autograder.build import PUBLIC_CHECKS
from autograder.public_checks import SCALE_MISSING, PublicChecks, unscaled


def test_the_helper_needs_only_torch_and_math():
    tree = ast.parse(PUBLIC_CHECKS.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"torch", "math"}, imported


def attention_without_scale(Q, K, V):
    return (Q @ K.transpose(-2, -1)).softmax(-1) @ V


def test_a_missing_scale_fails_with_the_hint_and_counts_the_checks(capsys):
    g = torch.Generator().manual_seed(0)
    Q, K, V = (torch.randn(2, 5, 8, generator=g, dtype=torch.float64) for _ in range(3))
    chk = PublicChecks("attention", points=6)
    chk.check(True, "a first check", "x", "x")
    with pytest.raises(AssertionError) as failure:
        chk.close("out", attention_without_scale(Q, K, V), F.scaled_dot_product_attention(Q, K, V), 1e-10,
                  against="F.scaled_dot_product_attention",
                  mistakes={SCALE_MISSING: F.scaled_dot_product_attention(unscaled(Q), K, V)})
    message = str(failure.value)
    assert message.startswith("attention: public check 2 failed: out vs F.scaled_dot_product_attention")
    assert SCALE_MISSING in message


def test_other_mistakes_get_no_hint_and_a_pass_reports_the_points(capsys):
    g = torch.Generator().manual_seed(1)
    Q, K, V = (torch.randn(3, 4, 8, generator=g) for _ in range(3))
    ref = F.scaled_dot_product_attention(Q, K, V)
    chk = PublicChecks("attention", points=6)
    with pytest.raises(AssertionError) as failure:
        chk.close("out", ref * 2, ref, 1e-5, mistakes={SCALE_MISSING: F.scaled_dot_product_attention(unscaled(Q), K, V)})
    assert "hint" not in str(failure.value)
    chk = PublicChecks("attention", points=6, note="hidden tests and an experiment")
    chk.close("out", ref, ref.clone(), 1e-6)
    chk.shape("out", ref, (3, 4, 8))
    chk.done()
    assert "public checks passed (2/2); hidden tests and an experiment worth 6 points" in capsys.readouterr().out


def test_unscaled_queries_undo_the_scale():
    q, k = torch.randn(4, 16, dtype=torch.float64), torch.randn(6, 16, dtype=torch.float64)
    torch.testing.assert_close(unscaled(q) @ k.T / math.sqrt(16), q @ k.T)
