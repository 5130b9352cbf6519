"""Planted mistakes and correct alternatives for w9l2_normalization (tests/test_grading.py grades each, and
`course check --planted` holds this file to the same rules).

A tuple (old, new) edits the reference cell (one realistic slip); a string is a whole cell.
"""
from tests.planted import attach_catches

PLANTED = {
    "layer_norm": {
        "wrong": {
            "unbiased_variance": ("correction=0", "correction=1"),
            "no_weight_and_bias": (" * weight + bias", ""),
            "ones_on_the_cpu": (" * weight + bias", " * (weight * torch.ones(x.shape[-1])) + bias"),
        },
        "right": {
            "variance_by_hand": ("x.var(-1, keepdim=True, correction=0)", "((x - mean) ** 2).mean(-1, keepdim=True)"),
        },
    },
    "RMSNorm": {
        "wrong": {
            "no_root": ("torch.rsqrt(", "torch.reciprocal("),
            "sum_not_mean": (".mean(-1, keepdim=True)", ".sum(-1, keepdim=True)"),
            "ones_on_the_cpu": ("* self.weight", "* (self.weight * torch.ones(x.shape[-1]))"),
        },
        "right": {
            "divide_by_the_root": ("x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)",
                                   "x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps)"),
        },
    },
    "NormMLP": {
        "wrong": {
            "no_relu": ("torch.relu(h)", "h"),
            "no_normalization": ("h = layer_norm(self.fc1(x.flatten(1)), self.weight, self.bias)",
                                 "h = self.fc1(x.flatten(1)) * self.weight + self.bias"),
            "zeros_on_the_cpu": ("return self.fc2(torch.relu(h))", "return self.fc2(torch.relu(h)) + torch.zeros(10)"),
        },
        "right": {
            "relu_as_clamp": ("torch.relu(h)", "h.clamp(min=0)"),
        },
    },
}

# The checks that catch each planted mistake: exactly these fail, every other check passes. A tensor made on the CPU
# inside the item is caught by the shapes check's second run, on the fake GPU (torch's FakeTensorMode as cuda), alone.
CATCHES = {
    "layer_norm": {"unbiased_variance": {"values"}, "no_weight_and_bias": {"values"}, "ones_on_the_cpu": {"shapes"}},
    "RMSNorm": {"no_root": {"values"}, "sum_not_mean": {"values"}, "ones_on_the_cpu": {"shapes"}},
    "NormMLP": {"no_relu": {"values"}, "no_normalization": {"values"}, "zeros_on_the_cpu": {"shapes"}},
}
attach_catches(PLANTED, CATCHES)

# Checks that no planted mistake above fails on its own, and why: none left.
NOT_ISOLATED: dict = {}

# Training failures: code that passes every check of its item, yet cannot learn ("fails": the experiments lost).
TRAINING = {
    "shuffle_on_the_batch_axis": {  # meant as noise over the hidden units; in training mode only
        "item": "NormMLP", "fails": ["mnist_normmlp"],
        "variant": ("        return self.fc2(", "        if self.training:\n"
                    "            h = h[torch.randperm(h.shape[0], device=h.device)]\n        return self.fc2("),
    },
}
