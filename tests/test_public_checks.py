"""The public-check helper students run: stand-alone, honest counts, and a hint for a recognised mistake."""
import ast
import linecache
import math
import re
import sys

import pytest
import torch
import torch.nn.functional as F

from autograder.notebooks.build import PUBLIC_CHECKS
from autograder.notebooks.public_checks import SCALE_MISSING, PublicChecks, unscaled


def test_the_helper_needs_only_torch_and_the_standard_library():
    tree = ast.parse(PUBLIC_CHECKS.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "torch" in imported and imported - {"torch"} <= sys.stdlib_module_names, imported


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
        chk.close("out", ref * 2, ref, 1e-5,
                  mistakes={SCALE_MISSING: F.scaled_dot_product_attention(unscaled(Q), K, V)})
    assert "hint" not in str(failure.value)
    chk = PublicChecks("attention", points=6, note="hidden tests and an experiment")
    chk.close("out", ref, ref.clone(), 1e-6)
    chk.shape("out", ref, (3, 4, 8))
    chk.done()
    assert "public checks passed (2/2); hidden tests and an experiment worth 6 points" in capsys.readouterr().out


def test_unscaled_queries_undo_the_scale():
    q, k = torch.randn(4, 16, dtype=torch.float64), torch.randn(6, 16, dtype=torch.float64)
    torch.testing.assert_close(unscaled(q) @ k.T / math.sqrt(16), q @ k.T)


def notebook(monkeypatch):
    """A namespace run like a Jupyter kernel's: each cell's text kept in linecache as IPython keeps it."""
    ns = {}

    def run(source):
        name = f"<ipython-input-{len(ns)}-{abs(hash(source))}>"
        monkeypatch.setitem(linecache.cache, name, (len(source), None, source.splitlines(True), name))
        exec(compile(source, name, "exec"), ns)
    run(PUBLIC_CHECKS.read_text())
    return ns, run


STUDENT = """
def double(x):
    raise NotImplementedError()

def halve(x):
    return x / 3

def square(x):
    return x * x

def cube(x):
    return x ** '3'

def quadruple(x):
    return double(double(x))
"""

TEST_CELLS = {
    "double": ("chk = PublicChecks('double', points=2)\n"
               "chk.check(double(1) == 2, 'double(1)', 2, double(1))\nchk.done()"),
    "halve": ("chk = PublicChecks('halve', points=3)\n"
              "chk.check(halve(4) is not None, 'returns a value', 'a number', None)\n"
              "chk.check(halve(4) == 2, 'halve(4)', 2, halve(4))\nchk.done()"),
    "square": ("chk = PublicChecks('square', points=4)\ng = torch.Generator().manual_seed(0)\ntorch.manual_seed(1)\n"
               "x = torch.randn(3)\nchk.close('square(x)', square(x), x * x)\n"
               "chk.check(square(-2) == 4, 'square(-2)', 4, square(-2))\nchk.done()"),
    "cube": "chk = PublicChecks('cube', points=1)\nchk.check(cube(2) == 8, 'cube(2)', 8, cube(2))\nchk.done()",
    "quadruple": ("chk = PublicChecks('quadruple', points=5)\n"
                  "chk.check(quadruple(1) == 4, 'quadruple(1)', 4, 0)\nchk.done()"),
}


def table(out):
    """The self-check table's rows as (item, status, points), split on the runs of spaces between columns."""
    return [tuple(re.split(r"\s{2,}", line.strip())) for line in out.splitlines()
            if line.strip() and not line.startswith(("Self-check", "---", "  ", "Why", "This"))][1:]


def test_self_check_reruns_each_test_cell_and_tabulates_stub_wrong_right_and_broken(monkeypatch, capsys):
    ns, run = notebook(monkeypatch)
    run(STUDENT)
    for item, cell in TEST_CELLS.items():
        if item == "square":
            run(cell)
        else:
            with pytest.raises((NotImplementedError, AssertionError, TypeError)):
                run(cell)
    ns["chk"], ns["x"] = "the student's chk", "the student's x"
    rng = torch.get_rng_state()
    capsys.readouterr()
    ns["self_check"]()
    out = capsys.readouterr().out
    assert table(out) == [("double", "not started", "2"),
                          ("halve", "1 passed, check 2 failed", "3"),
                          ("square", "all 2 passed", "4"),
                          ("cube", "0 passed, then TypeError", "1"),
                          ("quadruple", "not started", "5"),
                          ("total", "1 of 5 items pass", "15")]
    assert "halve: public check 2 failed: halve(4)" in out and "got:      1.33" in out
    assert "cube: TypeError in cube:" in out
    assert "quadruple: waits on double, not written yet" in out and "double: waits" not in out
    assert "  ok  " not in out  # the checks' own lines stay out of the table
    assert ns["chk"] == "the student's chk" and ns["x"] == "the student's x"
    assert torch.equal(torch.get_rng_state(), rng)
    run("def halve(x):\n    return x / 2")  # the student fixes it: the next self-check runs the new code
    ns["self_check"]()
    assert ("halve", "all 2 passed", "3") in table(capsys.readouterr().out)


def test_self_check_before_any_test_cell_and_checks_made_outside_a_cell_register_nothing(monkeypatch, capsys):
    ns, run = notebook(monkeypatch)
    script = STUDENT + TEST_CELLS["square"]  # the notebook run as a script: its file, not a cell, made the checks
    monkeypatch.setitem(linecache.cache, "/a/script.py", (len(script), 1.7e9, script.splitlines(True), "/a/script.py"))
    exec(compile(script, "/a/script.py", "exec"), ns)
    ns["PublicChecks"]("square", points=4)
    capsys.readouterr()
    ns["self_check"]()
    assert capsys.readouterr().out.startswith("No test cell has run yet")


def local_window(alpha, centre, D):
    """A device slip: the positions are made on the CPU whatever alpha's device."""
    pos = torch.arange(alpha.shape[-1])
    keep = (pos - centre.unsqueeze(-1)).abs() <= D
    return alpha * keep


def test_the_device_check_names_the_line_that_made_a_cpu_tensor_and_passes_the_same_code_done_right(capsys):
    """On a CPU, with no GPU: the inputs go to a fake GPU (torch's FakeTensorMode as cuda), and the CPU tensor the
    code made meets them."""
    alpha, centre = torch.rand(2, 7), torch.tensor([1, 4])
    chk = PublicChecks("local_attention", points=3)
    local_window(alpha, centre, 1)  # the slip runs on the CPU
    with pytest.raises(AssertionError) as failure:
        chk.device("local_attention(alpha, centre, 1)", local_window, alpha, centre, 1)
    message = str(failure.value)
    assert "public check 1 failed: local_attention(alpha, centre, 1) with every input on a fake GPU (cuda)" in message
    assert "found at least two devices" in message, message
    assert re.search(r"local_window\(\), line \d+: keep = \(pos - centre\.unsqueeze\(-1\)\)\.abs\(\) <= D",
                     message), message

    def fixed(alpha, centre, D):
        pos = torch.arange(alpha.shape[-1], device=alpha.device)
        return alpha * ((pos - centre.unsqueeze(-1)).abs() <= D)
    chk.device("local_attention(alpha, centre, 1)", fixed, alpha, centre, 1)
    with pytest.raises(AssertionError, match="output 0 on cpu"):  # an answer moved back to the CPU
        chk.device("local_attention(alpha, centre, 1)", lambda *a: torch.zeros(2, 7), alpha, centre, 1)
    block = torch.nn.BatchNorm1d(4)
    block(torch.randn(5, 4)).sum().backward()
    before = [t.clone() for t in (block.weight, block.weight.grad, block.running_mean)]
    chk.device("BatchNorm1d(4)(x)", block, torch.randn(2, 4))  # a module goes to the fake GPU with its weights...
    after = (block.weight, block.weight.grad, block.running_mean)  # ... and comes back with them, values and all
    assert all(a.device.type == "cpu" and torch.equal(a, b) for a, b in zip(after, before, strict=True))


def weight_to_the_cpu(x, w):
    w = w.cpu()  # a .cpu() round trip: fine while x is on the CPU too
    return x @ w.T


def cpu_linear(x, w):
    return F.linear(x, w, torch.zeros(w.shape[0]))  # a CPU bias in a linear layer


def cpu_tokens(x, w):
    return F.embedding(torch.zeros(x.shape[0], dtype=torch.long), w) + x[:, :1]  # CPU indices into a GPU table


@pytest.mark.parametrize("slip", [weight_to_the_cpu, cpu_linear, cpu_tokens])
def test_the_device_check_catches_the_slips_meta_let_through(slip):
    """A .cpu() round trip, a CPU tensor in a linear layer, CPU indices in an embedding: each runs on the CPU, none
    raised on the meta device, each fails the public device check on this CPU-only machine."""
    x, w = torch.randn(3, 4), torch.randn(5, 4)
    slip(x, w)
    with pytest.raises(AssertionError, match="found at least two devices") as failure:
        PublicChecks("item", points=1).device("item(x, w)", slip, x, w)
    assert f"{slip.__name__}(), line" in str(failure.value), str(failure.value)
