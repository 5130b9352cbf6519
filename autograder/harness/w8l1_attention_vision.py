"""Week 8, Lecture 1's experiments: autoencoders on MNIST, the linear AE vs PCA, seq2seq with and
without attention on the reverse task, and the modes of attention; "where is the red square?" is in
w8l1_red_square.py.

The graded parts arrive as `parts` (student side) or `ref` (grader side); nothing here implements them.
The glue models (the seq2seq decoder, the CNN of the spatial task) are lecture models, not graded items.

Dimension names: B batch, T source positions, d state width, L annotation vectors (space-steps).
"""
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .training import data_seeds, denormals_flushed, on_device, pass_marks, seeded, shuffled_rows, train_until
from .w8l1_red_square import build_pooled, build_spatial, evaluate_spatial, shapes_data, train_spatial

# --- MNIST autoencoders (Sections 2-3) ---
N_TRAIN, N_TEST = 10000, 2000   # the lecture's subset (8,000 / 2,000 when only the test split is on disk)
K_AE = 32                       # bottleneck width
LR_AE = 2e-3
BATCH_AE = 128
SIGMA = 0.5                     # DAE training and test noise

# --- linear AE vs PCA (Section 4) ---
K_LIN = 16
LR_LIN = 2e-2                   # full-batch Adam (the lecture: 1e-2 for 1,200 steps; course.yaml says why)

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
    return seeded(lambda: parts.AutoEncoder(K_AE), seed, device)


def build_ae_pair(parts, cfg, seed, device):
    """A plain AE and a denoising AE of the same architecture, as one module."""
    return seeded(lambda: nn.ModuleDict({"ae": parts.AutoEncoder(K_AE), "dae": parts.AutoEncoder(K_AE)}), seed, device)


def _fit_ae(net, X, steps, seed, corrupt=None):
    """Adam 2e-3, batch 128, MSE against the clean x; corrupt(x, gen) makes the input noisy (DAE)."""
    gen = torch.Generator().manual_seed(seed)       # CPU generator: the same batches on any device
    rows = shuffled_rows(X.shape[0], BATCH_AE, gen, X.device)

    def batch_loss(step):
        x = X[rows(step)]
        x_in = x if corrupt is None else corrupt(x, gen)
        return F.mse_loss(net(x_in), x)             # the target is always the uncorrupted image
    return train_until(net, batch_loss, steps, LR_AE, loss_every=10)


def _global_rng():
    """torch's global generators' states (CPU, and CUDA's once initialised)."""
    states = [torch.random.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states += torch.cuda.get_rng_state_all()
    return states


def reused_state(data):
    """The trained state of the run this experiment reuses (EXPERIMENTS' `reuses`), as the grader passes it in
    the data tensors reused.0, reused.1, ... (grading/shared_runs.py), or None when it did not."""
    state = []
    while f"reused.{len(state)}" in data:
        state.append(data[f"reused.{len(state)}"])
    return state or None


def load_state(module, state):
    """Copy a list of tensors (state_dict order) into `module`."""
    module.load_state_dict(dict(zip(module.state_dict(), state, strict=True)))


def train_ae(model, parts, data, cfg, seed):
    """Plain AE for cfg['steps'] steps (4 epochs in the lecture). global_rng_used: whether the student's AE drew
    from torch's global generators (dropout): such a run is never shared with dae_mnist, whose plain AE starts
    from another global state."""
    before = _global_rng()
    history = _fit_ae(model, data["X_train"], cfg["steps"], seed)
    after = _global_rng()
    history["global_rng_used"] = len(after) != len(before) or not all(map(torch.equal, before, after))
    return history


def train_ae_pair(model, parts, data, cfg, seed):
    """The plain AE on clean inputs, the DAE on inputs corrupted by parts.corrupt at sigma 0.5.

    The plain AE is ae_mnist's recipe bit for bit (built first under the same seed, same data and steps, no early
    stop): when the grader passes ae_mnist's trained state (`reuses`), it is loaded instead of trained again."""
    def noisy(x, gen):
        return parts.corrupt(x, SIGMA, generator=gen)
    state = reused_state(data)
    if state is not None:
        load_state(model["ae"], state)
        ae = {"reused": "ae_mnist", "steps": cfg["steps"]}
    else:
        ae = _fit_ae(model["ae"], data["X_train"], cfg["steps"], seed)
    dae = _fit_ae(model["dae"], data["X_train"], cfg["steps"], seed, corrupt=noisy)
    return {"steps": max(ae["steps"], dae["steps"]), "ae": ae, "dae": dae}  # each its own run of the budget


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
    gen = torch.Generator().manual_seed(data_seeds(seed)[2])
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
    return seeded(lambda: parts.LinearAE(K_LIN), seed, device)


def train_linear(model, parts, data, cfg, seed):
    """parts.train_linear_ae, full batch, then its weights into `model`."""
    t0 = time.perf_counter()
    with denormals_flushed():  # as train_until trains (training.py)
        net = parts.train_linear_ae(data["X"], K_LIN, cfg["steps"], LR_LIN, seed=seed)
    with torch.no_grad():
        model.We.weight.copy_(net.We.weight)
        model.Wd.weight.copy_(net.Wd.weight)
    return {"steps": cfg["steps"], "lr": LR_LIN, "seconds": time.perf_counter() - t0}


_pca_kept = []  # [(pca, X, k, (V_k, err))]: the grader's data is the same for every submission


def _reference_pca(ref, X, k):
    """ref.pca(X, k), computed once per process for the same function, data and k (seconds each time)."""
    for pca, X_kept, k_kept, (V_k, err) in _pca_kept:
        if pca is ref.pca and k_kept == k and X_kept.shape == X.shape and torch.equal(X_kept, X):
            return V_k.clone(), err.clone()
    V_k, err = ref.pca(X, k)
    _pca_kept[:] = [(ref.pca, X, k, (V_k.clone(), err.clone()))]
    return V_k, err


@torch.no_grad()
def evaluate_linear(model, ref, cfg, seed, device):
    """Against PCA of the same data, in float64: error gap, ||P_AE - P_PCA||_F, smallest principal cosine."""
    X = _centred_train("cpu").double()                           # (m, 784)
    V_k, err_pca = _reference_pca(ref, X, K_LIN)                 # (784, k), scalar
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
    train_seed, val_seed, _ = data_seeds(seed)
    gen = torch.Generator().manual_seed(train_seed)
    x, y, lens = make_reverse_batch(cfg["steps"] * BATCH_SEQ, 1, L_TRAIN_MAX, gen)
    gen_val = torch.Generator().manual_seed(val_seed)
    # every training length equally often, in one padded batch
    val = [make_reverse_batch(N_VAL_PER_LEN, L, L, gen_val) for L in range(1, L_TRAIN_MAX + 1)]
    x_val = torch.cat([_pad_to(v[0], L_TRAIN_MAX) for v in val])
    y_val = torch.cat([_pad_to(v[1], L_TRAIN_MAX) for v in val])
    lens_val = torch.cat([v[2] for v in val])
    return on_device(device, x=x, y=y, lens=lens, x_val=x_val, y_val=y_val, lens_val=lens_val)


def build_seq2seq(parts, cfg, seed, device):
    """Encoder + decoder with dot-product attention, d = 32."""
    return seeded(lambda: Seq2Seq(parts, attention=True), seed, device)


def build_seq2seq_plain(parts, cfg, seed, device):
    """The same encoder and decoder without attention (the bottleneck baseline)."""
    return seeded(lambda: Seq2Seq(parts, attention=False), seed, device)


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
        return {"exact_match": _exact(model, data["x_val"], data["y_val"], data["lens_val"]).float().mean().item()}

    marks = pass_marks(cfg, {"exact_match": MARGIN})
    return train_until(model, batch_loss, cfg["steps"], LR_SEQ, validate, marks, every=EVAL_EVERY, loss_every=10)


def _test_set(L, seed, device):
    """N_TEST_PER_LEN fresh sequences of length exactly L, the same draw for every mode."""
    gen = torch.Generator().manual_seed(data_seeds(seed)[2] * 100 + L)
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


EXPERIMENTS = {
    "ae_mnist": dict(
        parts=["AutoEncoder"],
        data=mnist_data, build=build_ae, train=train_ae, evaluate=evaluate_ae,
    ),
    "dae_mnist": dict(
        parts=["AutoEncoder", "corrupt"],
        data=mnist_data, build=build_ae_pair, train=train_ae_pair, evaluate=evaluate_ae_pair,
        reuses="ae_mnist",  # its plain AE is ae_mnist's model: trained once (grading/shared_runs.py)
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
    "attention_modes": dict(  # its own 1,500 steps: seq2seq_attention's early-stopped model is not enough (course.yaml)
        parts=["GRUEncoder", "score_dot", "attention_context"],
        data=reverse_data, build=build_seq2seq, train=train_seq2seq, evaluate=evaluate_modes,
    ),
}
