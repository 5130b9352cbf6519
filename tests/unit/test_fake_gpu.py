"""The fake GPU (autograder/sandbox/child/fake_gpu.py) on this CPU-only machine: every kind of device slip raises and
names the student's line that made or moved the stray tensor; the same code done right, and a 0-dim CPU scalar, pass;
a read of values is no verdict (another error)."""
import linecache

import pytest
import torch

from autograder.sandbox.child.fake_gpu import DeviceMismatch, FakeGPU

SLIPS = {  # name -> (the student's cell, the line the reason must name)
    "cpu_round_trip": ("def f(x, w):\n    w = w.cpu()\n    return x @ w.T\n", 2),
    "matmul": ("def f(x, w):\n    eye = torch.eye(x.shape[-1])\n    return x @ eye + w.sum()\n", 2),
    "linear": ("def f(x, w):\n    b = torch.zeros(w.shape[0])\n    return F.linear(x, w, b)\n", 2),
    "bmm": ("def f(x, w):\n    y = torch.ones(x.shape[0], x.shape[-1], 2)\n    return torch.bmm(x, y)\n", 2),
    "embedding": ("def f(x, w):\n    idx = torch.zeros(2, dtype=torch.long)\n    return F.embedding(idx, w)\n", 2),
    "index_select": ("def f(x, w):\n    idx = torch.arange(2)\n    return x.index_select(1, idx)\n", 2),
    "gather": ("def f(x, w):\n    idx = torch.zeros(x.shape[0], 1, x.shape[2], dtype=torch.long)\n"
               "    return x.gather(1, idx)\n", 2),
    "element_wise": ("def f(x, w):\n    pos = torch.arange(x.shape[-1])\n    return x + pos\n", 2),
    "masked_fill": ("def f(x, w):\n    m = torch.ones(x.shape[-2], x.shape[-1]).triu(1).bool()\n"
                    "    return x.masked_fill(m, 0.0)\n", 2),
    "cat": ("def f(x, w):\n    col = torch.full((x.shape[0], 1, x.shape[2]), 2.0)\n"
            "    return torch.cat([col, x], 1)\n", 2),
}
RIGHT = {
    "on_the_inputs_device": "def f(x, w):\n    pos = torch.arange(x.shape[-1], device=x.device)\n"
                            "    return F.linear(x + pos, w, torch.zeros(w.shape[0], device=x.device))\n",
    "a_cpu_scalar": "def f(x, w):\n    return x * torch.tensor(2.0) @ w.T\n",
}


def student(name, source, names=None):
    """The student's function f, compiled as the sandbox compiles a cell (server.op_load), its lines registered."""
    file = f"<cell {name}>"
    linecache.cache[file] = (len(source), None, source.splitlines(True), file)
    ns = {"torch": torch, "F": torch.nn.functional, **(names or {})}
    exec(compile(source, file, "exec"), ns)
    return ns.get("f") or ns[name]


def run(gpu, f, item):
    x, w = gpu.tensor(torch.randn(2, 3, 4)), gpu.tensor(torch.randn(5, 4))
    with gpu.running(item):
        return f(x, w)


@pytest.fixture(scope="module")
def gpu():
    return FakeGPU()


@pytest.mark.parametrize("name", SLIPS)
def test_every_kind_of_device_slip_raises_naming_the_line_that_made_or_moved_the_tensor(gpu, name):
    source, line = SLIPS[name]
    with pytest.raises(DeviceMismatch) as raised:
        run(gpu, student(name, source), name)
    assert raised.value.student_line == (f"cell {name}", line)
    said = str(raised.value)
    assert "a tensor on cpu" in said and "(cuda, a fake GPU)" in said, said
    assert f"cell {name}, line {line} (`{source.splitlines()[line - 1].strip()}`" in said, said
    assert ("moved to the CPU" if name == "cpu_round_trip" else "made on the CPU") in said, said


@pytest.mark.parametrize("name", RIGHT)
def test_the_same_code_done_right_runs_on_the_fake_gpu(gpu, name):
    out = run(gpu, student(name, RIGHT[name]), name)
    assert out.device.type == "cuda" and tuple(out.shape) == (2, 3, 5)


def test_the_line_named_is_the_graded_items_own_call_not_the_helper_it_called(gpu):
    """causal_mask(T) without its device inside the graded item: the reason names the item's line first, and the
    helper's line after it (the caller's, never only the callee's)."""
    mask = student("mask", "def mask(T, device=None):\n    return torch.ones(T, T, device=device).triu(1).bool()\n")
    f = student("decode", "def f(x, w):\n    m = mask(x.shape[-1])\n    return x.masked_fill(m[:3], 0.0)\n",
                {"mask": mask})
    with pytest.raises(DeviceMismatch) as raised:
        run(gpu, f, "decode")
    assert raised.value.student_line == ("cell decode", 2)
    assert "by what it calls: cell mask, line 2" in str(raised.value), str(raised.value)


def test_a_module_moved_onto_the_fake_gpu_runs_there_and_a_cpu_layer_made_in_forward_does_not(gpu):
    layer = gpu.module(torch.nn.Linear(4, 5))
    assert layer.weight.device.type == "cuda" and isinstance(layer.weight, torch.nn.Parameter)
    x = gpu.tensor(torch.randn(2, 4))
    with gpu.running("layer"):
        assert layer(x).device.type == "cuda"
        with pytest.raises(DeviceMismatch):
            torch.nn.Linear(4, 5)(x)


def test_a_read_of_values_is_no_verdict(gpu):
    with pytest.raises(Exception) as raised:
        run(gpu, student("reads", "def f(x, w):\n    return x[: int(x.sum().item())]\n"), "reads")
    assert not isinstance(raised.value, DeviceMismatch)


def test_a_result_left_on_the_cpu_raises_naming_where_it_was_made(gpu):
    """...when the inputs were on the fake GPU (a tensor, a module's weights or a torch.device): with no input
    there, an answer on the CPU is right (`causal_mask(T)` without a device)."""
    f = student("returned", "def f(x, w):\n    out = torch.zeros(x.shape)\n    return out\n")
    x, w = gpu.tensor(torch.randn(2, 3, 4)), gpu.tensor(torch.randn(5, 4))
    with gpu.running("returned"):
        out = f(x, w)
    with pytest.raises(DeviceMismatch) as raised:
        gpu.check_returned((out, [out]), f, (x, w), {})
    assert "a tensor on cpu came back, not on the same device as the inputs" in str(raised.value)
    assert raised.value.student_line == ("cell returned", 2)
    with pytest.raises(DeviceMismatch):
        gpu.check_returned(out, f, (3,), {"device": torch.device("cuda")})
    with pytest.raises(DeviceMismatch):
        gpu.check_returned(out, f, (3,), {"device": "cuda"})
    layer = gpu.module(torch.nn.Linear(4, 5))
    with pytest.raises(DeviceMismatch):
        gpu.check_returned(out, layer.forward, (3,), {})
    gpu.check_returned(out, f, (3,), {})  # nothing was on the fake GPU
    kept = student("kept", "def f(x, w):\n    return torch.zeros(x.shape, device=x.device)\n")
    with gpu.running("kept"):
        gpu.check_returned(kept(x, w), kept, (x, w), {})
