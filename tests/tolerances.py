"""Tolerances of the reference-vs-oracle tests: float32 1e-5 (1e-4 when loose), float64 1e-10 (1e-8 when loose)."""
import torch


def tol(dtype, loose=False):
    """(atol, rtol) for one comparison in `dtype`; loose for decompositions, recurrences and long chains."""
    if dtype == torch.float64:
        return (1e-8, 1e-8) if loose else (1e-10, 1e-10)
    return (1e-4, 1e-4) if loose else (1e-5, 1e-5)


def assert_close(a, b, dtype, loose=False):
    atol, rtol = tol(dtype, loose)
    torch.testing.assert_close(a, b, atol=atol, rtol=rtol)
