"""The harnesses' Adam (autograder/harness/adam.py) steps as torch.optim.Adam does, bit for bit, without
torch._dynamo's import."""
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from autograder.course.config import ROOT
from autograder.harness.adam import Adam


def trained(make_optimizer, steps=60, lr_scale=None, clip=None, idle_layer_every=0):
    """The parameters of a small MLP after `steps` full-batch steps with the optimizer make_optimizer(params) gives;
    idle_layer_every: the last layer gets no gradient on every such step (as an unused head)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
    head = nn.Linear(16, 1)
    params = list(model.parameters()) + list(head.parameters())
    opt = make_optimizer(params)
    gen = torch.Generator().manual_seed(1)
    X, y = torch.randn(64, 6, generator=gen), torch.randn(64, 1, generator=gen)
    for step in range(1, steps + 1):
        idle = idle_layer_every and step % idle_layer_every == 0
        out = model(X).mean(dim=1, keepdim=True) if idle else head(model(X))
        loss = ((out - y) ** 2).mean()
        for p in params:
            p.grad = None
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(params, clip)
        scale = lr_scale(step) if lr_scale else 1.0
        if isinstance(opt, Adam):
            opt.step(1e-2 * scale)
        else:
            for group in opt.param_groups:
                group["lr"] = 1e-2 * scale
            opt.step()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize("variant", [
    {},
    {"lr_scale": lambda step: min(1.0, step / 10)},
    {"clip": 0.1},
    {"idle_layer_every": 3},
], ids=["plain", "warmup", "clipped", "a-layer-without-gradient"])
def test_the_harness_adam_gives_torch_optim_adams_weights_bit_for_bit(variant):
    ours = trained(lambda params: Adam(params, lr=1e-2), **variant)
    theirs = trained(lambda params: torch.optim.Adam(params, lr=1e-2, foreach=False), **variant)
    for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert torch.equal(a, b), f"parameter {k} differs by up to {(a - b).abs().max().item():.3g}"


def test_a_plain_sgd_step_is_not_adam():
    """The comparison above can fail: plain SGD's weights are not Adam's."""
    ours = trained(lambda params: Adam(params, lr=1e-2))
    sgd = trained(lambda params: torch.optim.SGD(params, lr=1e-2))
    assert not all(torch.equal(a, b) for a, b in zip(ours, sgd, strict=True))


TRAIN_ONCE = '''
import sys, torch
from autograder.harness.training import train_until
model = torch.nn.Linear(4, 1)
X = torch.randn(32, 4)
history = train_until(model, lambda step: ((model(X) - 1) ** 2).mean(), 5, 1e-2, clip=1.0)
print(history["steps"], "torch._dynamo" in sys.modules)
'''


def test_the_harness_loop_trains_without_importing_torch_dynamo():
    out = subprocess.run([sys.executable, "-c", TRAIN_ONCE], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["5", "False"], out.stdout
