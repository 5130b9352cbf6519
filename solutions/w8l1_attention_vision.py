"""Reference solution: Week 8, Lecture 1, attention models in vision.

Autoencoders and their link to PCA, the seq2seq bottleneck, the alignment score functions,
attention over time-steps and over space-steps, and the modes of attention.

Dimension names used throughout:
    B  batch            T  source positions (time-steps)     d  state width
    N  images           C  channels                          H, W  feature-grid height and width
    L  annotation vectors (space-steps, L = H * W)           m  data rows (images), k  code width
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------
# 2. Autoencoders
# ---------------------------------------------------------------------------------------------

def mse_loss(x_hat, x):
    """L = mean over all elements of (x_hat - x)^2, the slide's ||x - x_hat||^2 averaged."""
    return ((x_hat - x) ** 2).mean()


class AutoEncoder(nn.Module):
    """784 -> hidden -> k -> hidden -> 784, ReLU between layers, Sigmoid on the output pixels."""

    def __init__(self, k, hidden=256):
        """Encoder maps an image to a k-number code; the decoder mirrors it back to pixels."""
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, k))
        # Sigmoid keeps reconstructions in [0, 1], the range of the pixels
        self.decoder = nn.Sequential(nn.Linear(k, hidden), nn.ReLU(), nn.Linear(hidden, 784), nn.Sigmoid())

    def forward(self, x):
        """x_hat = decoder(encoder(x)), (..., 784) -> (..., 784)."""
        return self.decoder(self.encoder(x))


# ---------------------------------------------------------------------------------------------
# 3. Denoising autoencoders
# ---------------------------------------------------------------------------------------------

def corrupt(x, sigma, generator=None):
    """x + sigma * eps with eps ~ N(0, I), same shape, device and dtype as x."""
    if sigma == 0:
        return x.clone()
    # draw where the generator lives (a CPU generator cannot fill a CUDA tensor), then move
    gen_device = generator.device if generator is not None else x.device
    eps = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=gen_device).to(x.device)
    return x + sigma * eps


# ---------------------------------------------------------------------------------------------
# 4. Undercomplete autoencoders and PCA
# ---------------------------------------------------------------------------------------------

def pca(X, k):
    """X centred (m, d): V_k = top-k right singular vectors of X / sqrt(m), err = sum_{i>k} sigma_i^2."""
    m = X.shape[0]
    # with X / sqrt(m), X^T X is the covariance and sigma_i^2 its eigenvalues
    _, S, Vh = torch.linalg.svd(X / math.sqrt(m), full_matrices=False)   # S (r,), Vh (r, d)
    V_k = Vh[:k].mT                                                     # (d, k)
    err = (S[k:] ** 2).sum()                # Eckart-Young: mean per-row error of the best rank-k fit
    return V_k, err


def projector(W):
    """Orthogonal projector onto the columns of W (..., d, k): P = W (W^T W)^-1 W^T, (..., d, d)."""
    # solve instead of an explicit inverse: same P, better conditioned
    return W @ torch.linalg.solve(W.mT @ W, W.mT)


def principal_angle_cosines(W, V):
    """cos(theta_i) between span(W) and span(V), descending: singular values of Q_W^T Q_V."""
    Q_w, _ = torch.linalg.qr(W)             # (..., d, k1) orthonormal basis of span(W)
    Q_v, _ = torch.linalg.qr(V)             # (..., d, k2)
    # rounding can push a cosine a hair above 1
    return torch.linalg.svdvals(Q_w.mT @ Q_v).clamp(max=1.0)             # (..., min(k1, k2))


class LinearAE(nn.Module):
    """x_hat = x W_e W_d: no biases, no nonlinearity; undercomplete when k < n_in (section 4 also trains k >= n_in)."""

    def __init__(self, k, n_in=784):
        """We: n_in -> k code, Wd: k -> n_in reconstruction, both bias-free."""
        super().__init__()
        self.We = nn.Linear(n_in, k, bias=False)
        self.Wd = nn.Linear(k, n_in, bias=False)

    def forward(self, x):
        """x (..., n_in) -> x_hat (..., n_in)."""
        return self.Wd(self.We(x))


def train_linear_ae(X, k, steps, lr, batch=None, seed=0):
    """Fit LinearAE(k) to X (m, n) by Adam on the mean per-row squared error; full batch if batch is None."""
    torch.manual_seed(seed)
    net = LinearAE(k, X.shape[1]).to(device=X.device, dtype=X.dtype)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        xb = X if batch is None else X[torch.randint(0, X.shape[0], (batch,), generator=gen).to(X.device)]
        # sum over pixels, mean over rows: the slide's ||X - X W_e W_d||_F^2 / m
        loss = ((net(xb) - xb) ** 2).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net


# ---------------------------------------------------------------------------------------------
# 1 and 5. The encoder of the seq2seq model
# ---------------------------------------------------------------------------------------------

class GRUEncoder(nn.Module):
    """Bidirectional GRU: h_j = [forward state; backward state] at token j, d // 2 each way."""

    def __init__(self, n_tokens, d):
        """Token embedding of width d, then a GRU with hidden d // 2 per direction."""
        super().__init__()
        self.emb = nn.Embedding(n_tokens, d)
        self.rnn = nn.GRU(d, d // 2, batch_first=True, bidirectional=True)

    def forward(self, x, lengths=None):
        """x (B, T) token ids (int64) -> (H, h_T): H (B, T, d) the state at every position, h_T (B, d) =
        [forward state at each row's last real token; backward state at its first token].

        lengths: None (every row is T real tokens), or B ints, a list or an int64 tensor, in any order (not sorted),
        each row's real tokens followed by padding. With lengths, pack the embedded rows so that padding never reaches
        a real state and the backward GRU starts at each row's own last token: nn.utils.rnn.pack_padded_sequence takes
        the lengths on the CPU whatever x's device (lengths.to("cpu")), and enforce_sorted=False takes rows in any
        order; unpack with pad_packed_sequence(..., total_length=T), so that H keeps all T columns (zeros at padding).
        The lecture's own encoder runs the GRU over the padded rows: its backward states then start from the padding,
        and differ in every padded row. The hidden tests compare H at the real positions and h_T with nn.GRU run on
        each row's real tokens alone, with rows of length 1 to T in random order and a batch of one row of one token."""
        E = self.emb(x)                                                   # (B, T, d)
        if lengths is None:
            H, h_n = self.rnn(E)                                          # h_n (2, B, d // 2)
        else:
            # packing makes the backward GRU start at each row's own last token, so padding never
            # leaks into a real state; h_n then holds exactly the two states h_T is made of
            lengths = torch.as_tensor(lengths).to("cpu", torch.int64)
            packed = nn.utils.rnn.pack_padded_sequence(E, lengths, batch_first=True, enforce_sorted=False)
            H, h_n = self.rnn(packed)
            H, _ = nn.utils.rnn.pad_packed_sequence(H, batch_first=True,
                                                    total_length=x.shape[1])  # (B, T, d), 0 on padding
        h_T = torch.cat([h_n[0], h_n[1]], dim=-1)                         # (B, d)
        return H, h_T


# ---------------------------------------------------------------------------------------------
# 7. Alignment score functions: s (..., d), H (..., T, d) -> scores (..., T)
# ---------------------------------------------------------------------------------------------

def score_dot(s, H):
    """score(s, h_t) = s^T h_t."""
    return torch.einsum("...d,...td->...t", s, H)


def score_scaled(s, H):
    """score(s, h_t) = s^T h_t / sqrt(d)."""
    return torch.einsum("...d,...td->...t", s, H) / math.sqrt(H.shape[-1])


def score_general(s, H, W_a):
    """score(s, h_t) = s^T W_a h_t with W_a (d_s, d_h)."""
    return torch.einsum("...d,de,...te->...t", s, W_a, H)


def score_cosine(s, H):
    """score(s, h_t) = s^T h_t / (|s| |h_t|), the dot product of the unit vectors."""
    dots = torch.einsum("...d,...td->...t", s, H)
    # each norm floored at 1e-8, as F.cosine_similarity does, so a zero vector scores 0, not NaN
    s_norm = s.norm(dim=-1, keepdim=True).clamp(min=1e-8)                # (..., 1)
    H_norm = H.norm(dim=-1).clamp(min=1e-8)                              # (..., T)
    return dots / (s_norm * H_norm)


def score_additive(s, H, W_a, v_a):
    """score(s, h_t) = v_a^T tanh(W_a [s; h_t]) with W_a (k, 2d), v_a (k,)."""
    d_s = s.shape[-1]
    # W_a [s; h] = W_s s + W_h h: project s once instead of once per position
    W_s, W_h = W_a[:, :d_s], W_a[:, d_s:]                                # (k, d_s), (k, d_h)
    pre = (s @ W_s.mT).unsqueeze(-2) + H @ W_h.mT                        # (..., T, k)
    return torch.tanh(pre) @ v_a                                          # (..., T)


def alpha_location(s, W_loc):
    """alpha = softmax(W_loc s) with W_loc (T, d): weights (..., T) that never look at H."""
    return torch.softmax(torch.einsum("td,...d->...t", W_loc, s), dim=-1)


# ---------------------------------------------------------------------------------------------
# 6. The attention mechanism
# ---------------------------------------------------------------------------------------------

def attention_context(scores, H, mask=None):
    """alpha = softmax_j(scores) over real positions (mask True), c = sum_j alpha_j h_j; a row with no real token
    gets zero weights and a zero context, not NaN."""
    if mask is not None:
        # the dtype's most negative number, not -inf, so a row with no real token gives no NaN
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    alpha = torch.softmax(scores, dim=-1)                                 # (..., T)
    if mask is not None:
        alpha = alpha.masked_fill(~mask, 0.0)                             # padding gets exactly 0
    c = torch.einsum("...t,...td->...d", alpha, H)                        # (..., d)
    return c, alpha


# ---------------------------------------------------------------------------------------------
# 8. From time-steps to space-steps
# ---------------------------------------------------------------------------------------------

def unroll_annotations(volume):
    """(N, C, H, W) feature volume -> (N, H*W, C) annotation vectors, row-major over the grid."""
    return volume.flatten(-2).transpose(-1, -2)                           # (N, C, L) -> (N, L, C)


def spatial_attention(s, A, W_a):
    """alpha_l = softmax_l(s^T W_a a_l) over annotations A (B, L, d); ctx = sum_l alpha_l a_l."""
    # the time-step machinery verbatim, with space-steps in place of time-steps
    return attention_context(score_general(s, A, W_a), A)


# ---------------------------------------------------------------------------------------------
# 10. Modes of attention
# ---------------------------------------------------------------------------------------------

def hard_attention(alpha):
    """One-hot at argmax_j alpha_j: all weight on a single position, same shape and dtype."""
    return F.one_hot(alpha.argmax(dim=-1), alpha.shape[-1]).to(alpha.dtype)


def local_attention(alpha, centre, D):
    """Keep alpha_j with |j - centre| <= D, zero the rest, renormalise each row to sum 1."""
    T = alpha.shape[-1]
    pos = torch.arange(T, device=alpha.device)                            # (T,)
    centre = torch.as_tensor(centre, device=alpha.device)
    keep = (pos - centre.unsqueeze(-1)).abs() <= D                        # (..., T)
    kept = alpha * keep
    # a window with no mass stays all zero instead of dividing by zero
    return kept / kept.sum(-1, keepdim=True).clamp(min=torch.finfo(alpha.dtype).tiny)


def self_attention(H):
    """Z = softmax(H H^T / sqrt(d)) H over one sequence (T, d) or a batch (..., T, d); returns (Z, A)."""
    A = torch.softmax(H @ H.mT / math.sqrt(H.shape[-1]), dim=-1)         # (..., T, T)
    return A @ H, A
