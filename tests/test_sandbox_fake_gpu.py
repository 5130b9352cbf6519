"""The fake GPU leaves a forked sandbox's CPU gradients alone (autograder/sandbox/child/fake_gpu.py: warm,
settle_autograd).

Entering torch's FakeTensorMode on a machine without a GPU installs a no-op CUDA device guard for good; torch's
autograd engine then starts 8 device threads at the process's first backward pass, and in a sandbox forked from the
zygote those threads race to rebuild the intra-op thread pool the fork left behind ("Invalid thread pool!", SIGABRT,
or SIGSEGV): 1 sandbox of 8 to 1 of 300 in a loop of w8l1's mse_loss gradients. Those threads are what is checked
here: they are there or not on every run, where the crash they cause comes only now and then. Without a GPU the
engine needs none of them.
"""
import time

import pytest
import torch

from autograder.course.config import Limits
from autograder.grading.student import Student
from autograder.notebooks.cells import Cell
from autograder.sandbox.grader_side import Sandbox

pytestmark = pytest.mark.grading
LIMITS = Limits(setup_seconds=60, item_seconds=20, experiment_seconds=60, memory_mb=1500, output_kb=4)
CELL = '''
import os
import torch
def mse(x_hat, x):
    return ((x_hat - x) ** 2).mean()
def threads():
    return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
'''


def student(sb, device):
    return Student(sb, "mse", device, time.monotonic() + 20)


def cpu_gradients(sb):
    """d/dx_hat of the mean squared error, on the CPU, checked against the formula."""
    x_hat, x = torch.randn(5, 7), torch.randn(5, 7)
    _, (grad,) = student(sb, "cpu").grad("mse", (x_hat, x), wrt=[0], upstream=[torch.tensor(1.0)])
    torch.testing.assert_close(grad, 2 * (x_hat - x) / x.numel())


def autograd_device_threads(sb):
    return [t for t in student(sb, "cpu").call("threads") if t.startswith("pt_autograd")]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a real GPU gets its own autograd thread: one, rightly")
@pytest.mark.parametrize("fake_first", [False, True], ids=["zygote_only", "fake_gpu_first"])
def test_no_autograd_device_threads_in_a_sandbox_after_the_fake_gpu(fake_first):
    """zygote_only: what the zygote did before the fork (fake_gpu.warm imports, and enters no fake mode);
    fake_gpu_first: the sandbox's own fake GPU, used before its first CPU backward pass (FakeGPU settles the engine
    first). Either way the CPU gradients are right and no autograd device thread was started."""
    with Sandbox([Cell("setup_mse", CELL, 0)], {}, LIMITS) as sb:
        if fake_first:
            answer = student(sb, "cuda").call("mse", torch.randn(5, 7), torch.randn(5, 7))
            assert tuple(answer.shape) == ()
        cpu_gradients(sb)
        assert autograd_device_threads(sb) == []
