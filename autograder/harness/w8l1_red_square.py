"""Week 8, Lecture 1, Section 8: "where is the red square?" -- a CNN's grid of annotation vectors, a question that
attends over it (SpatialModel with the graded spatial_attention), and the baseline that pools the grid instead.

The graded parts arrive as `parts` (student side) or `ref` (grader side); nothing here implements them.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .training import data_seeds, on_device, pass_marks, seeded, train_until

IMG = 32
GRID = 8                        # the CNN's feature grid: 8 x 8 = 64 annotation vectors
CELLS = 4                       # the answer is one of 4 x 4 = 16 cells
D_SPATIAL = 32
N_SHAPES_TRAIN, N_SHAPES_VAL, N_SHAPES_TEST = 2000, 300, 300
LR_SPATIAL = 2e-3
BATCH_SPATIAL = 64
SPATIAL_MARGIN = 0.1
COLOR_RGB = np.array([[0.90, 0.15, 0.15], [0.15, 0.72, 0.20], [0.20, 0.35, 0.95]], np.float32)  # red, green, blue
EVAL_EVERY = 100                # steps between validations



_YS, _XS = np.mgrid[0:IMG, 0:IMG]


def _shape_mask(shape, cx, cy, r):
    """Pixels of a square (0), circle (1) or triangle (2) of radius r centred at (cx, cy)."""
    if shape == 0:
        return (np.abs(_XS - cx) <= r) & (np.abs(_YS - cy) <= r)
    if shape == 1:
        return (_XS - cx) ** 2 + (_YS - cy) ** 2 <= r * r
    widening = (_YS - (cy - r)) / (2.0 * r)                 # 0 at the apex, 1 at the base
    return (cy - r <= _YS) & (cy + r >= _YS) & (np.abs(_XS - cx) <= r * widening)


def make_shapes(n, seed):
    """n images, each with one red, one green, one blue shape that do not overlap.

    Returns images (n, 3, 32, 32) float32, queries (n, 3) in 0..8 (= 3 * colour + shape, one per
    object) and answers (n, 3): the 4 x 4 cell, row-major, that holds each object's centre.
    """
    rng = np.random.default_rng(seed)
    imgs = np.empty((n, 3, IMG, IMG), np.float32)
    queries = np.empty((n, 3), np.int64)
    answers = np.empty((n, 3), np.int64)
    for i in range(n):
        img = 0.85 + rng.normal(0, 0.02, (IMG, IMG, 3)).astype(np.float32)   # light, slightly noisy background
        placed = []
        for colour in range(3):
            while True:
                r = rng.uniform(3, 5)
                cx, cy = rng.uniform(r + 1, IMG - r - 1), rng.uniform(r + 1, IMG - r - 1)
                if all((cx - px) ** 2 + (cy - py) ** 2 > (r + pr + 2) ** 2 for px, py, pr in placed):
                    break
            shape = int(rng.integers(0, 3))
            img[_shape_mask(shape, cx, cy, r)] = COLOR_RGB[colour] + rng.normal(0, 0.03, 3)
            placed.append((cx, cy, r))
            queries[i, colour] = 3 * colour + shape
            answers[i, colour] = int(cy // (IMG / CELLS)) * CELLS + int(cx // (IMG / CELLS))
        imgs[i] = np.clip(img, 0, 1).transpose(2, 0, 1)                     # (H, W, 3) -> (3, H, W)
    return torch.from_numpy(imgs), torch.from_numpy(queries), torch.from_numpy(answers)


_shapes_kept = {}  # (n, seed) -> make_shapes(n, seed): the grader's data, the same for every submission


def kept_shapes(n, seed):
    """make_shapes(n, seed), drawn once per process (seconds each time); every call gets its own copies."""
    if (n, seed) not in _shapes_kept:
        _shapes_kept[(n, seed)] = make_shapes(n, seed)
    return tuple(t.clone() for t in _shapes_kept[(n, seed)])


class SpatialModel(nn.Module):
    """CNN -> 8 x 8 grid of annotation vectors (+ x, y channels); the question s attends over the grid
    with general attention; a head reads the cell from [ctx; s]. attention=False averages the grid instead."""

    def __init__(self, parts, d=D_SPATIAL, attention=True):
        super().__init__()
        self.cnn = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),     # 32 -> 16
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),    # 16 -> 8
            nn.Conv2d(32, d - 2, 3, padding=1), nn.ReLU())
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, GRID), torch.linspace(-1, 1, GRID), indexing="ij")
        # coordinates as channels: a location can then be read out of an annotation vector
        self.register_buffer("coords", torch.stack([xs, ys])[None])        # (1, 2, GRID, GRID)
        self.q_emb = nn.Embedding(9, d)                                     # (colour, shape) -> s
        self.Wa = nn.Linear(d, d, bias=False)                               # its weight is W_a of s^T W_a a_l
        self.head = nn.Sequential(nn.Linear(2 * d, 64), nn.ReLU(), nn.Linear(64, CELLS * CELLS))
        self.attention = attention
        self.unroll = parts.unroll_annotations
        self.attend = parts.spatial_attention if attention else None

    def annotations(self, img):
        """Images (B, 3, 32, 32) -> annotation vectors A (B, L, d)."""
        f = self.cnn(img)                                                    # (B, d - 2, 8, 8)
        f = torch.cat([f, self.coords.expand(f.shape[0], -1, -1, -1)], 1)    # (B, d, 8, 8)
        return self.unroll(f)                                                # (B, 64, d)

    def forward(self, img, query):
        """Logits over the 16 cells (B, 16) and the attention map alpha (B, 64) or None."""
        A = self.annotations(img)
        s = self.q_emb(query)                                                # (B, d)
        if self.attention:
            ctx, alpha = self.attend(s, A, self.Wa.weight)
        else:
            ctx, alpha = A.mean(1), None                                     # one pooled vector: no grid left
        return self.head(torch.cat([ctx, s], dim=-1)), alpha


def shapes_data(ref, cfg, seed, device):
    """2,000 training images and 300 validation images, three questions each."""
    train_seed, val_seed, _ = data_seeds(seed)
    imgs, q, a = kept_shapes(N_SHAPES_TRAIN, train_seed)
    imgs_val, q_val, a_val = kept_shapes(N_SHAPES_VAL, val_seed)
    return on_device(device, imgs=imgs, q=q, a=a, imgs_val=imgs_val, q_val=q_val, a_val=a_val)


def build_spatial(parts, cfg, seed, device):
    """The attention model."""
    return seeded(lambda: SpatialModel(parts, attention=True), seed, device)


def build_pooled(parts, cfg, seed, device):
    """Same CNN and head, the grid averaged into one vector."""
    return seeded(lambda: SpatialModel(parts, attention=False), seed, device)


@torch.no_grad()
def spatial_accuracy(model, imgs, q, a):
    """Accuracy over every (image, question) pair."""
    model.eval()
    hits = [(model(imgs, q[:, j])[0].argmax(-1) == a[:, j]).float().mean().item() for j in range(3)]
    return float(np.mean(hits))


def train_spatial(model, parts, data, cfg, seed):
    """Adam 2e-3, batch 64 random (image, question) pairs, cross-entropy over the 16 cells."""
    imgs, q, a = data["imgs"], data["q"], data["a"]
    gen = torch.Generator().manual_seed(seed)

    def batch_loss(step):
        idx = torch.randint(0, imgs.shape[0], (BATCH_SPATIAL,), generator=gen).to(imgs.device)
        which = torch.randint(0, 3, (BATCH_SPATIAL,), generator=gen).to(imgs.device)
        logits, _ = model(imgs[idx], q[idx, which])                         # (B, 16)
        return F.cross_entropy(logits, a[idx, which])

    def validate():
        return {"accuracy": spatial_accuracy(model, data["imgs_val"], data["q_val"], data["a_val"])}

    marks = pass_marks(cfg, {"accuracy": SPATIAL_MARGIN})
    return train_until(model, batch_loss, cfg["steps"], LR_SPATIAL, validate, marks, every=EVAL_EVERY, loss_every=10)


def evaluate_spatial(model, ref, cfg, seed, device):
    """Held-out accuracy on 300 fresh images x 3 questions (chance is 1/16)."""
    imgs, q, a = kept_shapes(N_SHAPES_TEST, data_seeds(seed)[2])
    return {"accuracy": spatial_accuracy(model, imgs.to(device), q.to(device), a.to(device))}
