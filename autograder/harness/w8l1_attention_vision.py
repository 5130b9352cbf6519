"""Week 8, Lecture 1's experiments: autoencoders on MNIST, the linear AE vs PCA, seq2seq with and
without attention on the reverse task, "where is the red square?", and the modes of attention.

The graded parts arrive as `parts` (student side) or `ref` (grader side); nothing here implements them.
The glue models (the seq2seq decoder, the CNN of the spatial task) are lecture models, not graded items.

Dimension names: B batch, T source positions, d state width, L annotation vectors (space-steps).
"""
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# --- MNIST autoencoders (Sections 2-3) ---
N_TRAIN, N_TEST = 10000, 2000   # the lecture's subset (8,000 / 2,000 when only the test split is on disk)
K_AE = 32                       # bottleneck width
LR_AE = 2e-3
BATCH_AE = 128
SIGMA = 0.5                     # DAE training and test noise

# --- linear AE vs PCA (Section 4) ---
K_LIN = 16
LR_LIN = 1e-2                   # full-batch Adam, as in the lecture

# --- seq2seq reverse task (Sections 5-7, 10) ---
N_DIGITS = 10
PAD, SOS = N_DIGITS, N_DIGITS + 1
N_TOK = N_DIGITS + 2
D_SEQ = 32
L_TRAIN_MAX, L_TEST_MAX = 12, 16
LR_SEQ = 3e-3
BATCH_SEQ = 64
N_VAL_PER_LEN = 40              # validation sequences per length, early stopping only
N_TEST_PER_LEN = 300            # fresh test sequences per length, as in the lecture
EVAL_EVERY = 100                # steps between validations
MARGIN = 0.05                   # stop once validation clears the pass mark by this much
MODE_LENGTHS = (4, 8, 12)       # training lengths on which hard attention is compared with soft
MODE_L = 12                     # the length of the local-window sweep
D_DIAGONAL = 2                  # a "small" half-width for the window at p_t = t

# --- where is the red square? (Section 8) ---
IMG = 32
GRID = 8                        # the CNN's feature grid: 8 x 8 = 64 annotation vectors
CELLS = 4                       # the answer is one of 4 x 4 = 16 cells
D_SPATIAL = 32
N_SHAPES_TRAIN, N_SHAPES_VAL, N_SHAPES_TEST = 2000, 300, 300
LR_SPATIAL = 2e-3
BATCH_SPATIAL = 64
SPATIAL_MARGIN = 0.1
COLOR_RGB = np.array([[0.90, 0.15, 0.15], [0.15, 0.72, 0.20], [0.20, 0.35, 0.95]], np.float32)  # red, green, blue


def _seeds(seed):
    """Disjoint generator seeds for training, validation and test data."""
    return seed, 1000 + seed, 2000 + seed


def _early_target(cfg, metric, margin):
    """Validation level at which training may stop: the pass mark plus a margin; None for an upper bound."""
    bound = cfg["threshold"].get(metric, {})
    return None if bound.get("min") is None else bound["min"] + margin


def _on(device, **tensors):
    """The tensors moved to `device`, as the data dict a harness passes to its training."""
    return {k: v.to(device) for k, v in tensors.items()}


def _seeded(model, seed, device):
    """`model()` built under torch.manual_seed(seed), then moved to `device`: the same initial weights anywhere."""
    torch.manual_seed(seed)
    return model().to(device)


def _fit_steps(model, cfg, lr, batch_loss, validate, metric, margin):
    """Adam at `lr` on batch_loss(step) for cfg['steps'] steps; every EVAL_EVERY steps validate() scores the
    model in eval mode, and training stops once that clears `metric`'s pass mark by `margin`."""
    target = _early_target(cfg, metric, margin)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    history = {"loss": [], f"val_{metric}": [], "steps": 0, "stopped_early": False}
    t0 = time.perf_counter()
    for step in range(1, cfg["steps"] + 1):
        model.train()
        loss = batch_loss(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        history["steps"] = step
        if step % 10 == 0:
            history["loss"].append(round(loss.item(), 4))
        if target is not None and step % EVAL_EVERY == 0:
            model.eval()
            val = validate()
            history[f"val_{metric}"].append(val)
            if val >= target:
                history["stopped_early"] = step < cfg["steps"]
                break
    history["seconds"] = time.perf_counter() - t0
    return history


# =============================================================================================
# MNIST autoencoders
# =============================================================================================

def _mnist(device):
    """(X_train, X_test) float32 (N, 784) in [0, 1] on `device`."""
    from autograder.course.mnist import load_mnist
    X_train, _, X_test, _ = load_mnist(n_train=N_TRAIN, n_test=N_TEST)
    return X_train.to(device), X_test.to(device)


def mnist_data(ref, cfg, seed, device):
    """The training images; the test images are loaded again by `evaluate`."""
    X_train, _ = _mnist(device)
    return {"X_train": X_train}


def build_ae(parts, cfg, seed, device):
    """AutoEncoder(k = 32) with the lecture's hidden width 256."""
    return _seeded(lambda: parts.AutoEncoder(K_AE), seed, device)


def build_ae_pair(parts, cfg, seed, device):
    """A plain AE and a denoising AE of the same architecture, as one module."""
    return _seeded(lambda: nn.ModuleDict({"ae": parts.AutoEncoder(K_AE), "dae": parts.AutoEncoder(K_AE)}), seed, device)


def _fit_ae(net, X, steps, seed, corrupt=None):
    """Adam 2e-3, batch 128, MSE against the clean x; corrupt(x, gen) makes the input noisy (DAE)."""
    opt = torch.optim.Adam(net.parameters(), lr=LR_AE)
    gen = torch.Generator().manual_seed(seed)       # CPU generator: the same batches on any device
    losses, step = [], 0
    net.train()
    while step < steps:
        order = torch.randperm(X.shape[0], generator=gen).to(X.device)
        for i in range(0, X.shape[0], BATCH_AE):
            if step >= steps:
                break
            x = X[order[i:i + BATCH_AE]]
            x_in = x if corrupt is None else corrupt(x, gen)
            loss = F.mse_loss(net(x_in), x)         # the target is always the uncorrupted image
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            step += 1
    return losses


def train_ae(model, parts, data, cfg, seed):
    """Plain AE for cfg['steps'] steps (4 epochs in the lecture)."""
    t0 = time.perf_counter()
    losses = _fit_ae(model, data["X_train"], cfg["steps"], seed)
    return {"loss": losses[::10], "steps": len(losses), "seconds": time.perf_counter() - t0}


def train_ae_pair(model, parts, data, cfg, seed):
    """The plain AE on clean inputs, the DAE on inputs corrupted by parts.corrupt at sigma 0.5."""
    t0 = time.perf_counter()
    ae_losses = _fit_ae(model["ae"], data["X_train"], cfg["steps"], seed)

    def noisy(x, gen):
        return parts.corrupt(x, SIGMA, generator=gen)

    dae_losses = _fit_ae(model["dae"], data["X_train"], cfg["steps"], seed, corrupt=noisy)
    return {"ae_loss": ae_losses[::10], "dae_loss": dae_losses[::10], "steps": len(ae_losses),
            "seconds": time.perf_counter() - t0}


@torch.no_grad()
def evaluate_ae(model, ref, cfg, seed, device):
    """Test MSE on the held-out images."""
    _, X_test = _mnist(device)
    model.eval()
    return {"test_mse": F.mse_loss(model(X_test), X_test).item()}


@torch.no_grad()
def evaluate_ae_pair(model, ref, cfg, seed, device):
    """Both models on test images corrupted at sigma 0.5 (one fixed draw), MSE against the clean image."""
    _, X_test = _mnist(device)
    model.eval()
    gen = torch.Generator().manual_seed(_seeds(seed)[2])
    X_noisy = ref.corrupt(X_test, SIGMA, generator=gen)
    ae_mse = F.mse_loss(model["ae"](X_noisy), X_test).item()
    dae_mse = F.mse_loss(model["dae"](X_noisy), X_test).item()
    return {"dae_mse": dae_mse, "ae_mse": ae_mse, "dae_beats_ae": float(dae_mse < ae_mse)}


# =============================================================================================
# Linear autoencoder vs PCA
# =============================================================================================

def _centred_train(device):
    """The training images minus their per-pixel mean, (m, 784)."""
    X_train, _ = _mnist(device)
    return X_train - X_train.mean(0, keepdim=True)


def linear_data(ref, cfg, seed, device):
    """Centred training images (the condition under which the linear AE is PCA)."""
    return {"X": _centred_train(device)}


def build_linear_ae(parts, cfg, seed, device):
    """LinearAE(k = 16): the module the trained weights are moved into."""
    return _seeded(lambda: parts.LinearAE(K_LIN), seed, device)


def train_linear(model, parts, data, cfg, seed):
    """parts.train_linear_ae, full batch, then its weights into `model`."""
    t0 = time.perf_counter()
    net = parts.train_linear_ae(data["X"], K_LIN, cfg["steps"], LR_LIN, seed=seed)
    with torch.no_grad():
        model.We.weight.copy_(net.We.weight)
        model.Wd.weight.copy_(net.Wd.weight)
    return {"steps": cfg["steps"], "lr": LR_LIN, "seconds": time.perf_counter() - t0}


@torch.no_grad()
def evaluate_linear(model, ref, cfg, seed, device):
    """Against PCA of the same data, in float64: error gap, ||P_AE - P_PCA||_F, smallest principal cosine."""
    X = _centred_train("cpu").double()                           # (m, 784)
    V_k, err_pca = ref.pca(X, K_LIN)                             # (784, k), scalar
    We = model.We.weight.detach().cpu().double()                 # (k, 784)
    Wd = model.Wd.weight.detach().cpu().double()                 # (784, k): columns span the learned subspace
    err_ae = ((X - X @ We.T @ Wd.T) ** 2).sum(1).mean()
    P_ae, P_pca = ref.projector(Wd), ref.projector(V_k)
    return {"rel_error_gap": ((err_ae - err_pca) / err_pca).item(),
            "projector_distance": torch.linalg.matrix_norm(P_ae - P_pca).item(),
            "min_cosine": ref.principal_angle_cosines(Wd, V_k).min().item()}


# =============================================================================================
# Seq2seq on the reverse task
# =============================================================================================

def make_reverse_batch(n, L_min, L_max, gen):
    """n digit sequences, lengths uniform in [L_min, L_max]; target = input reversed; PAD after the end."""
    lens = torch.randint(L_min, L_max + 1, (n,), generator=gen)            # (n,)
    T = int(lens.max())
    pos = torch.arange(T)
    real = pos[None, :] < lens[:, None]                                     # (n, T)
    x = torch.randint(0, N_DIGITS, (n, T), generator=gen).masked_fill(~real, PAD)
    # target position j reads source position len - 1 - j
    src = (lens[:, None] - 1 - pos[None, :]).clamp(min=0)                   # (n, T)
    y = x.gather(1, src).masked_fill(~real, PAD)
    return x, y, lens


class Seq2Seq(nn.Module):
    """GRU encoder + GRU decoder s_t = f(s_{t-1}, y_{t-1}, c_t), s_0 = h_T; output g([s_t; c_t]).

    Without attention c_t is absent and h_T is the decoder's only link to the input.
    """

    def __init__(self, parts, d=D_SEQ, attention=True):
        super().__init__()
        self.encoder = parts.GRUEncoder(N_TOK, d)
        self.emb = nn.Embedding(N_TOK, d)
        ctx = d if attention else 0
        self.cell = nn.GRUCell(d + ctx, d)
        self.out = nn.Linear(d + ctx, N_TOK)
        self.attention = attention
        self.score_fn = parts.score_dot if attention else None
        self.context_fn = parts.attention_context if attention else None
        self.alpha_fn = None        # test-time modes (Section 10): (alpha, t) -> alpha

    def step(self, y_prev, s_prev, H, mask, t):
        """One decoder step: returns logits (B, N_TOK), s_t (B, d), alpha_t (B, T) or None."""
        e = self.emb(y_prev)                                                # (B, d)
        c = alpha = None
        if self.attention:
            c, alpha = self.context_fn(self.score_fn(s_prev, H), H, mask)  # (B, d), (B, T)
            if self.alpha_fn is not None:
                alpha = self.alpha_fn(alpha, t)
                c = torch.einsum("bt,btd->bd", alpha, H)
            e = torch.cat([e, c], dim=-1)                                   # (B, 2d)
        s = self.cell(e, s_prev)
        return self.out(s if c is None else torch.cat([s, c], dim=-1)), s, alpha

    def forward(self, x, lens, y_in):
        """Teacher forcing: y_in (B, T_out) is SOS then the targets; returns logits (B, T_out, N_TOK)."""
        H, s = self.encoder(x, lens)
        mask = x != PAD
        logits = []
        for t in range(y_in.shape[1]):
            lg, s, _ = self.step(y_in[:, t], s, H, mask, t)
            logits.append(lg)
        return torch.stack(logits, 1)

    @torch.no_grad()
    def greedy(self, x, lens, n_steps):
        """Feed back the argmax for n_steps; returns tokens (B, n_steps)."""
        H, s = self.encoder(x, lens)
        mask = x != PAD
        tok = torch.full((x.shape[0],), SOS, dtype=torch.long, device=x.device)
        out = []
        for t in range(n_steps):
            lg, s, _ = self.step(tok, s, H, mask, t)
            tok = lg.argmax(-1)
            out.append(tok)
        return torch.stack(out, 1)


def _exact(model, x, y, lens):
    """Per-sequence exact match of greedy decoding over each row's real positions, (B,) bool."""
    pred = model.greedy(x, lens, x.shape[1])
    real = y != PAD
    return ((pred == y) | ~real).all(1)


def _pad_to(x, T):
    """Right-pad token rows (n, T0) with PAD to (n, T)."""
    return F.pad(x, (0, T - x.shape[1]), value=PAD)


def reverse_data(ref, cfg, seed, device):
    """A pool of training sequences (lengths 1-12, one batch per step) and a validation set per length."""
    train_seed, val_seed, _ = _seeds(seed)
    gen = torch.Generator().manual_seed(train_seed)
    x, y, lens = make_reverse_batch(cfg["steps"] * BATCH_SEQ, 1, L_TRAIN_MAX, gen)
    gen_val = torch.Generator().manual_seed(val_seed)
    # every training length equally often, in one padded batch
    val = [make_reverse_batch(N_VAL_PER_LEN, L, L, gen_val) for L in range(1, L_TRAIN_MAX + 1)]
    x_val = torch.cat([_pad_to(v[0], L_TRAIN_MAX) for v in val])
    y_val = torch.cat([_pad_to(v[1], L_TRAIN_MAX) for v in val])
    lens_val = torch.cat([v[2] for v in val])
    return _on(device, x=x, y=y, lens=lens, x_val=x_val, y_val=y_val, lens_val=lens_val)


def build_seq2seq(parts, cfg, seed, device):
    """Encoder + decoder with dot-product attention, d = 32."""
    return _seeded(lambda: Seq2Seq(parts, attention=True), seed, device)


def build_seq2seq_plain(parts, cfg, seed, device):
    """The same encoder and decoder without attention (the bottleneck baseline)."""
    return _seeded(lambda: Seq2Seq(parts, attention=False), seed, device)


def train_seq2seq(model, parts, data, cfg, seed):
    """Adam 3e-3, batch 64, teacher forcing, cross-entropy over real tokens; validate every 100 steps."""
    x_all, y_all, lens_all = data["x"], data["y"], data["lens"]

    def batch_loss(step):
        sl = slice((step - 1) * BATCH_SEQ, step * BATCH_SEQ)
        T = int(lens_all[sl].max())
        x, y, lens = x_all[sl, :T], y_all[sl, :T], lens_all[sl]            # (B, T)
        sos = torch.full((x.shape[0], 1), SOS, dtype=torch.long, device=x.device)
        y_in = torch.cat([sos, y[:, :-1]], dim=1)                           # (B, T): SOS, y_1 .. y_{T-1}
        logits = model(x, lens, y_in)                                       # (B, T, N_TOK)
        return F.cross_entropy(logits.reshape(-1, N_TOK), y.reshape(-1), ignore_index=PAD)

    def validate():
        return _exact(model, data["x_val"], data["y_val"], data["lens_val"]).float().mean().item()

    return _fit_steps(model, cfg, LR_SEQ, batch_loss, validate, "exact_match", MARGIN)


def _test_set(L, seed, device):
    """N_TEST_PER_LEN fresh sequences of length exactly L, the same draw for every mode."""
    gen = torch.Generator().manual_seed(_seeds(seed)[2] * 100 + L)
    x, y, lens = make_reverse_batch(N_TEST_PER_LEN, L, L, gen)
    return x.to(device), y.to(device), lens.to(device)


def accuracy_by_length(model, lengths, seed, device):
    """Fraction of test sequences reversed exactly, per length."""
    return {L: _exact(model, *_test_set(L, seed, device)).float().mean().item() for L in lengths}


def evaluate_seq2seq(model, ref, cfg, seed, device):
    """Exact match, mean over training lengths 1-12, plus the held-out lengths 13-16 for the record."""
    model.eval()
    acc = accuracy_by_length(model, range(1, L_TEST_MAX + 1), seed, device)
    metrics = {"exact_match": float(np.mean([acc[L] for L in range(1, L_TRAIN_MAX + 1)]))}
    metrics.update({f"exact_match_L{L}": acc[L] for L in (4, 8, 12, 16)})
    return metrics


@torch.no_grad()
def _mean_entropy(model, L, seed, device):
    """Mean entropy (nats) of the attention weights over greedy decoding of the length-L test set."""
    seen = []
    model.alpha_fn = lambda alpha, t: seen.append(alpha) or alpha          # record, change nothing
    x, _, lens = _test_set(L, seed, device)
    model.greedy(x, lens, L)
    model.alpha_fn = None
    A = torch.stack(seen, 1)                                                # (B, L_out, L_in)
    return -(A * A.clamp(min=1e-12).log()).sum(-1).mean().item()


def evaluate_modes(model, ref, cfg, seed, device):
    """Hard attention at test time; local windows of half-width D at the argmax and at p_t = t."""
    model.eval()
    soft = accuracy_by_length(model, MODE_LENGTHS, seed, device)
    model.alpha_fn = lambda alpha, t: ref.hard_attention(alpha)
    hard = accuracy_by_length(model, MODE_LENGTHS, seed, device)
    g = soft[MODE_L]
    at_argmax, at_diagonal = {}, {}
    for D in range(MODE_L):
        model.alpha_fn = lambda alpha, t, D=D: ref.local_attention(alpha, alpha.argmax(-1), D)
        at_argmax[D] = accuracy_by_length(model, [MODE_L], seed, device)[MODE_L]
        # Luong's monotonic alignment p_t = t: the wrong prior for a reversal
        model.alpha_fn = lambda alpha, t, D=D: ref.local_attention(
            alpha, torch.full(alpha.shape[:-1], t, device=alpha.device), D)
        at_diagonal[D] = accuracy_by_length(model, [MODE_L], seed, device)[MODE_L]
    model.alpha_fn = None
    return {"hard_drop": float(np.mean([soft[L] - hard[L] for L in MODE_LENGTHS])),
            "entropy_L12": _mean_entropy(model, MODE_L, seed, device),
            "local_argmax_gap": max(abs(g - at_argmax[D]) for D in range(1, MODE_L)),
            f"local_diagonal_gap_D{D_DIAGONAL}": g - at_diagonal[D_DIAGONAL],
            "global_acc_L12": g, "hard_acc_L12": hard[MODE_L],
            "local_diagonal_acc_L12_D11": at_diagonal[MODE_L - 1]}


# =============================================================================================
# Where is the red square?
# =============================================================================================

_YS, _XS = np.mgrid[0:IMG, 0:IMG]


def _shape_mask(shape, cx, cy, r):
    """Pixels of a square (0), circle (1) or triangle (2) of radius r centred at (cx, cy)."""
    if shape == 0:
        return (np.abs(_XS - cx) <= r) & (np.abs(_YS - cy) <= r)
    if shape == 1:
        return (_XS - cx) ** 2 + (_YS - cy) ** 2 <= r * r
    widening = (_YS - (cy - r)) / (2.0 * r)                 # 0 at the apex, 1 at the base
    return (_YS >= cy - r) & (_YS <= cy + r) & (np.abs(_XS - cx) <= r * widening)


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
    train_seed, val_seed, _ = _seeds(seed)
    imgs, q, a = make_shapes(N_SHAPES_TRAIN, train_seed)
    imgs_val, q_val, a_val = make_shapes(N_SHAPES_VAL, val_seed)
    return _on(device, imgs=imgs, q=q, a=a, imgs_val=imgs_val, q_val=q_val, a_val=a_val)


def build_spatial(parts, cfg, seed, device):
    """The attention model."""
    return _seeded(lambda: SpatialModel(parts, attention=True), seed, device)


def build_pooled(parts, cfg, seed, device):
    """Same CNN and head, the grid averaged into one vector."""
    return _seeded(lambda: SpatialModel(parts, attention=False), seed, device)


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
        return spatial_accuracy(model, data["imgs_val"], data["q_val"], data["a_val"])

    return _fit_steps(model, cfg, LR_SPATIAL, batch_loss, validate, "accuracy", SPATIAL_MARGIN)


def evaluate_spatial(model, ref, cfg, seed, device):
    """Held-out accuracy on 300 fresh images x 3 questions (chance is 1/16)."""
    imgs, q, a = make_shapes(N_SHAPES_TEST, _seeds(seed)[2])
    return {"accuracy": spatial_accuracy(model, imgs.to(device), q.to(device), a.to(device))}


EXPERIMENTS = {
    "ae_mnist": dict(
        parts=["AutoEncoder"],
        data=mnist_data, build=build_ae, train=train_ae, evaluate=evaluate_ae,
    ),
    "dae_mnist": dict(
        parts=["AutoEncoder", "corrupt"],
        data=mnist_data, build=build_ae_pair, train=train_ae_pair, evaluate=evaluate_ae_pair,
    ),
    "linear_ae_pca": dict(
        parts=["LinearAE", "train_linear_ae"],
        data=linear_data, build=build_linear_ae, train=train_linear, evaluate=evaluate_linear,
    ),
    "seq2seq_attention": dict(
        parts=["GRUEncoder", "score_dot", "attention_context"],
        data=reverse_data, build=build_seq2seq, train=train_seq2seq, evaluate=evaluate_seq2seq,
    ),
    "red_square": dict(
        parts=["unroll_annotations", "spatial_attention"],
        data=shapes_data, build=build_spatial, train=train_spatial, evaluate=evaluate_spatial,
    ),
    "no_attention_baseline": dict(
        parts=["GRUEncoder"],
        data=reverse_data, build=build_seq2seq_plain, train=train_seq2seq, evaluate=evaluate_seq2seq,
    ),
    "pooled_baseline": dict(
        parts=["unroll_annotations"],
        data=shapes_data, build=build_pooled, train=train_spatial, evaluate=evaluate_spatial,
    ),
    "attention_modes": dict(
        parts=["GRUEncoder", "score_dot", "attention_context"],
        data=reverse_data, build=build_seq2seq, train=train_seq2seq, evaluate=evaluate_modes,
    ),
}
