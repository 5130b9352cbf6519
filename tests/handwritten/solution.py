"""Normalization layers: layer normalization written from scratch, RMSNorm, and an MNIST classifier that normalizes
with the student's own layer_norm."""
import torch
import torch.nn as nn


def layer_norm(x, weight, bias, eps=1e-5):
    """Layer normalization over the last dimension, written from scratch.

    x: (..., D), float32 or float64; weight, bias: (D,). Returns a tensor of x's shape, dtype and device:
    (x - mean) / sqrt(var + eps) * weight + bias, with the mean and the biased variance over the last dimension.
    Do not call torch.nn.functional.layer_norm or nn.LayerNorm: your function is compared with them.
    """
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True, correction=0)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


class RMSNorm(nn.Module):
    """Root-mean-square normalization over the last dimension: x / sqrt(mean(x ** 2) + eps) * weight.

    d: the size of the last dimension; `weight`, a learnt (d,) parameter, starts at ones.
    """

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        """x: (..., d) -> (..., d), in x's dtype and on its device."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class NormMLP(nn.Module):
    """An MNIST classifier: flatten, Linear(784, hidden), your layer_norm (with a learnt weight, ones, and bias,
    zeros, in that order after the first layer's), ReLU, Linear(hidden, 10).
    """

    def __init__(self, hidden=64):
        super().__init__()
        self.fc1 = nn.Linear(784, hidden)
        self.weight = nn.Parameter(torch.ones(hidden))
        self.bias = nn.Parameter(torch.zeros(hidden))
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        """Images (B, 1, 28, 28) -> logits (B, 10)."""
        h = layer_norm(self.fc1(x.flatten(1)), self.weight, self.bias)
        return self.fc2(torch.relu(h))
