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
    """L = mean over all elements of (x_hat - x)^2, the slide's ||x - x_hat||^2 averaged.

    x_hat, x: one shape (any, (1,) included), float32 or float64. Returns a 0-dim tensor (shape ()) in their dtype and
    on their device, equal to F.mse_loss(x_hat, x), with gradients reaching both arguments. From scratch:
    F.mse_loss (and nn.MSELoss, which calls it) is the oracle, not a tool."""
    return ((x_hat - x) ** 2).mean()


class AutoEncoder(nn.Module):
    """784 -> hidden -> k -> hidden -> 784, ReLU between layers, Sigmoid on the output pixels."""

    def __init__(self, k, hidden=256):
        """Encoder maps an image to a k-number code; the decoder mirrors it back to pixels.

        self.encoder = Linear(784, hidden), ReLU, Linear(hidden, k): the code is its output, with no activation.
        self.decoder = Linear(k, hidden), ReLU, Linear(hidden, 784), Sigmoid. Two nn.Modules under these names (an
        nn.Sequential each, say), Linear layers with biases and no other parameters: the hidden tests count the
        parameters, copy them in this order into a reference, and call encoder and decoder on their own."""
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, k))
        # Sigmoid keeps reconstructions in [0, 1], the range of the pixels
        self.decoder = nn.Sequential(nn.Linear(k, hidden), nn.ReLU(), nn.Linear(hidden, 784), nn.Sigmoid())

    def forward(self, x):
        """x_hat = decoder(encoder(x)), (..., 784) -> (..., 784).

        x (B, 784) float32 pixels in [0, 1]; x_hat in x's dtype and on its device, every value inside (0, 1)."""
        return self.decoder(self.encoder(x))


# ---------------------------------------------------------------------------------------------
# 3. Denoising autoencoders
# ---------------------------------------------------------------------------------------------

def corrupt(x, sigma, generator=None):
    """x + sigma * eps with eps ~ N(0, I), same shape, device and dtype as x.

    x any shape, float32 or float64; sigma a float >= 0, and sigma = 0 returns x's values exactly. eps is a fresh
    standard normal draw for every element, independent of x's values (x and x + 1 with one seed get the same eps).
    generator: None (torch's global generator) or a torch.Generator, which may live on the CPU while x is elsewhere:
    draw eps on the generator's device, then move it to x's. The hidden tests check the noise's statistics (mean 0,
    std 1, Gaussian tails, distinct values) and that generators seeded alike give the same noise, others not."""
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
    """X centred (m, d): V_k = top-k right singular vectors of X / sqrt(m), err = sum_{i>k} sigma_i^2.

    X (m, d) float32 or float64, already centred, m < d allowed; 1 <= k <= min(m, d) (k = d: err = 0). Returns
    (V_k, err): V_k (d, k) in X's dtype and on its device, orthonormal columns in decreasing order of singular value
    (signs are free: the checks compare V_k V_k^T); err a 0-dim tensor (a float is accepted), the mean over rows of
    ||x - x V_k V_k^T||^2. From scratch with torch.linalg.svd: sklearn's PCA and torch.pca_lowrank are oracles."""
    m = X.shape[0]
    # with X / sqrt(m), X^T X is the covariance and sigma_i^2 its eigenvalues
    _, S, Vh = torch.linalg.svd(X / math.sqrt(m), full_matrices=False)   # S (r,), Vh (r, d)
    V_k = Vh[:k].mT                                                     # (d, k)
    err = (S[k:] ** 2).sum()                # Eckart-Young: mean per-row error of the best rank-k fit
    return V_k, err


def projector(W):
    """Orthogonal projector onto the columns of W (..., d, k): P = W (W^T W)^-1 W^T, (..., d, d).

    W float32 or float64, zero or more leading dims, of full column rank but not orthonormal (the hidden tests:
    singular values 0.1 to 10, k = 1, k = d). Returns P (..., d, d) in W's dtype and on its device: symmetric,
    idempotent, P W = W, trace k, the same for any other basis W R of span(W). Prefer torch.linalg.solve to an explicit
    inverse."""
    # solve instead of an explicit inverse: same P, better conditioned
    return W @ torch.linalg.solve(W.mT @ W, W.mT)


def principal_angle_cosines(W, V):
    """cos(theta_i) between span(W) and span(V), descending: singular values of Q_W^T Q_V.

    W (..., d, k1), V (..., d, k2), float32 or float64, full column rank, not orthonormal (Q_W, Q_V: orthonormal bases
    of their spans). Returns (..., min(k1, k2)) in W's dtype and on its device, in descending order, each in [0, 1]:
    all 1 for one subspace in two bases (clamp rounding above 1), all 0 for orthogonal ones. Checked against
    cos(scipy.linalg.subspace_angles(W, V)), an oracle, not a tool."""
    Q_w, _ = torch.linalg.qr(W)             # (..., d, k1) orthonormal basis of span(W)
    Q_v, _ = torch.linalg.qr(V)             # (..., d, k2)
    # rounding can push a cosine a hair above 1
    return torch.linalg.svdvals(Q_w.mT @ Q_v).clamp(max=1.0)             # (..., min(k1, k2))


class LinearAE(nn.Module):
    """x_hat = x W_e W_d: no biases, no nonlinearity; undercomplete when k < n_in (section 4 also trains k >= n_in)."""

    def __init__(self, k, n_in=784):
        """We: n_in -> k code, Wd: k -> n_in reconstruction, both bias-free.

        self.We = nn.Linear(n_in, k, bias=False) (weight (k, n_in)) and self.Wd = nn.Linear(k, n_in, bias=False)
        (weight (n_in, k)): the model's only parameters and buffers. Any k >= 1, k >= n_in included."""
        super().__init__()
        self.We = nn.Linear(n_in, k, bias=False)
        self.Wd = nn.Linear(k, n_in, bias=False)

    def forward(self, x):
        """x (..., n_in) -> x_hat (..., n_in) = Wd(We(x)), x We.weight^T Wd.weight^T, in x's dtype and device."""
        return self.Wd(self.We(x))


def train_linear_ae(X, k, steps, lr, batch=None, seed=0):
    """Fit LinearAE(k) to X (m, n) by Adam on the mean per-row squared error; full batch if batch is None.

    X (m, n) float32 or float64 on any device, centred by the caller. torch.manual_seed(seed) first, so that the seed
    fixes the initial weights (one seed twice: the same weights; seeds 0 and 1: different ones); then LinearAE(k, n)
    on X's device and in X's dtype, and `steps` steps of torch.optim.Adam at lr on (1/rows) sum_i ||x_i - x_hat_i||^2
    over the step's rows: all m, or `batch` rows drawn at random each step. Returns the trained LinearAE. The hidden
    tests train 150 steps at lr 0.03, full batch and batch=25, and expect 90% of what PCA's rank-k fit captures."""
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
        """Token embedding of width d, then a GRU with hidden d // 2 per direction.

        d even. Parameters: an nn.Embedding(n_tokens, d) and exactly those of nn.GRU(d, d // 2, batch_first=True,
        bidirectional=True), in its order: the hidden tests copy them into one (GRUEncoder(12, 32): 5,184)."""
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
    """score(s, h_t) = s^T h_t.

    s (..., d), H (..., T, d) with the same leading dims (the tests: s (B, d), H (B, T, d), B = 1 and T = 1 included,
    float32 and float64) -> scores (..., T) in s's dtype and on its device."""
    return torch.einsum("...d,...td->...t", s, H)


def score_scaled(s, H):
    """score(s, h_t) = s^T h_t / sqrt(d).

    s (..., d), H (..., T, d) -> (..., T) in s's dtype and device, d = H.shape[-1]. Same argmax as score_dot; a result
    sqrt(d) too large is the missing scale."""
    return torch.einsum("...d,...td->...t", s, H) / math.sqrt(H.shape[-1])


def score_general(s, H, W_a):
    """score(s, h_t) = s^T W_a h_t with W_a (d_s, d_h).

    s (..., d_s), H (..., T, d_h) -> (..., T) in s's dtype and device. W_a is not symmetric in the tests: s multiplies
    it from the left (s^T W_a^T h_t is wrong); W_a = I gives score_dot."""
    return torch.einsum("...d,de,...te->...t", s, W_a, H)


def score_cosine(s, H):
    """score(s, h_t) = s^T h_t / (|s| |h_t|), the dot product of the unit vectors.

    s (..., d), H (..., T, d) -> (..., T) in [-1, 1], in s's dtype and device. Matches F.cosine_similarity, which
    floors each norm at 1e-8: an all-zero h_t scores 0, not NaN. Rescaling (1e3 s, 1e-3 H) changes nothing."""
    dots = torch.einsum("...d,...td->...t", s, H)
    # each norm floored at 1e-8, as F.cosine_similarity does, so a zero vector scores 0, not NaN
    s_norm = s.norm(dim=-1, keepdim=True).clamp(min=1e-8)                # (..., 1)
    H_norm = H.norm(dim=-1).clamp(min=1e-8)                              # (..., T)
    return dots / (s_norm * H_norm)


def score_additive(s, H, W_a, v_a):
    """score(s, h_t) = v_a^T tanh(W_a [s; h_t]) with W_a (k, 2d), v_a (k,).

    s (..., d), H (..., T, d) -> (..., T) in s's dtype and device. [s; h_t] puts s first: W_a's first d columns act on
    s, its last d on h_t. k is free (the tests use k = 2d + 3, so W_a's two axes cannot be confused)."""
    d_s = s.shape[-1]
    # W_a [s; h] = W_s s + W_h h: project s once instead of once per position
    W_s, W_h = W_a[:, :d_s], W_a[:, d_s:]                                # (k, d_s), (k, d_h)
    pre = (s @ W_s.mT).unsqueeze(-2) + H @ W_h.mT                        # (..., T, k)
    return torch.tanh(pre) @ v_a                                          # (..., T)


def alpha_location(s, W_loc):
    """alpha = softmax(W_loc s) with W_loc (T, d): weights (..., T) that never look at H.

    s (..., d) -> alpha (..., T) in s's dtype and device, a distribution over the T positions, position t scored by
    row t of W_loc (T = 1: all ones). Scores reach 1e3 in the tests: torch.softmax, not exp / sum, which overflows."""
    return torch.softmax(torch.einsum("td,...d->...t", W_loc, s), dim=-1)


# ---------------------------------------------------------------------------------------------
# 6. The attention mechanism
# ---------------------------------------------------------------------------------------------

def attention_context(scores, H, mask=None):
    """alpha = softmax_j(scores) over real positions (mask True), c = sum_j alpha_j h_j; a row with no real token
    gets zero weights and a zero context, not NaN.

    scores (B, T), H (B, T, d), float32 or float64 (any leading dims: (..., T), (..., T, d)). Returns (c, alpha): c
    (B, d) in H's dtype and on its device, alpha (B, T) like scores, each row summing to 1 over its real positions.
    mask: None (all positions real) or bool (B, T), True at a real token, False at padding, anywhere in a row (not only
    at its end). Padding gets exactly 0 weight whatever its score and state hold: fill its scores with
    torch.finfo(scores.dtype).min, not -inf (an all-padding row would give NaN), and zero them after the softmax. A row
    whose mask is all False (every key is padding) returns 0 in alpha and c. Scores of +500 must not overflow
    (torch.softmax, not exp / sum); gradients w.r.t. scores and H are checked; F.scaled_dot_product_attention and
    nn.MultiheadAttention are the oracles, not tools. The other notebooks differ: w8l4's `attention` takes a bool mask
    with True = blocked key, filled with -inf; lab14's `scaled_dot_product_attention` takes 1/True = may attend."""
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
    """(N, C, H, W) feature volume -> (N, H*W, C) annotation vectors, row-major over the grid.

    Annotation l = i * W + j is volume[n, :, i, j], the C features of grid cell (i, j), in volume's dtype and device;
    values are only moved (compared exactly). H != W, C = 1 and W = 1 are tested: a bare reshape of (N, C, H, W) to
    (N, H*W, C) mixes channels with cells."""
    return volume.flatten(-2).transpose(-1, -2)                           # (N, C, L) -> (N, L, C)


def spatial_attention(s, A, W_a):
    """alpha_l = softmax_l(s^T W_a a_l) over annotations A (B, L, d); ctx = sum_l alpha_l a_l.

    s (B, d) the query, W_a (d, d), not symmetric (s^T W_a a_l, as in score_general); float32 or float64. Returns
    (ctx, alpha): ctx (B, d), alpha (B, L), in s's dtype and device. No mask: every location is real. Reuse
    score_general and attention_context."""
    # the time-step machinery verbatim, with space-steps in place of time-steps
    return attention_context(score_general(s, A, W_a), A)


# ---------------------------------------------------------------------------------------------
# 10. Modes of attention
# ---------------------------------------------------------------------------------------------

def hard_attention(alpha):
    """One-hot at argmax_j alpha_j: all weight on a single position, same shape and dtype.

    alpha (..., T), float32 or float64, any number of leading dims -> exact 0s and one 1 per row, at the argmax over
    the last axis (T = 1: a 1), in alpha's dtype and on its device (F.one_hot returns int64)."""
    return F.one_hot(alpha.argmax(dim=-1), alpha.shape[-1]).to(alpha.dtype)


def local_attention(alpha, centre, D):
    """Keep alpha_j with |j - centre| <= D, zero the rest, renormalise each row to sum 1.

    alpha (..., T) float32 or float64, rows of weights; centre (...,) int64 on alpha's device, one position per row;
    D an int >= 0. Returns (..., T) in alpha's dtype and device: exactly 0 outside the window (cut at the ends, centre
    0 or T - 1), inside it alpha divided by the row's kept mass (no new softmax). D = 0 at the argmax is
    hard_attention, D >= T - 1 gives alpha back; a row whose window holds no mass stays 0 (no 0 / 0). Positions j
    made inside go on alpha's device."""
    T = alpha.shape[-1]
    pos = torch.arange(T, device=alpha.device)                            # (T,)
    centre = torch.as_tensor(centre, device=alpha.device)
    keep = (pos - centre.unsqueeze(-1)).abs() <= D                        # (..., T)
    kept = alpha * keep
    # a window with no mass stays all zero instead of dividing by zero
    return kept / kept.sum(-1, keepdim=True).clamp(min=torch.finfo(alpha.dtype).tiny)


def self_attention(H):
    """Z = softmax(H H^T / sqrt(d)) H over one sequence (T, d) or a batch (..., T, d); returns (Z, A).

    H float32 or float64, T = 1 included -> Z like H, A (..., T, T) with row i the weights of position i over all j
    (rows sum to 1), in H's dtype and device. Equals nn.MultiheadAttention with one head, identity projections and no
    bias, an oracle (as is F.scaled_dot_product_attention), not a tool; a missing 1/sqrt(d) is the usual mistake."""
    A = torch.softmax(H @ H.mT / math.sqrt(H.shape[-1]), dim=-1)         # (..., T, T)
    return A @ H, A
