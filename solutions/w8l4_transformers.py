"""Reference solution for Week 8, Lecture 4: self-attention and transformers.

Dimension names used throughout:
    B    batch                       h     number of heads
    T    sequence length             d_k   width of one head, d_model / h
    T_q  query positions             d     model width (d_model), also d_emb for the PE table
    T_k  key/value positions         V     vocabulary size
    S    source (memory) positions   d_v   width of one value vector (d_k inside MultiHeadAttention)
"""
import math

import numpy as np  # noqa: F401  (part of the contract's allowed imports)
import torch
import torch.nn as nn
import torch.nn.functional as F

# --- setup: given to students in a setup cell ---
# Tokens of the reverse task: the ten digits are their own ids.
N_DIGITS = 10
BOS, EOS, PAD = 10, 11, 12
VOCAB = 13
# --- end of setup ---


def attention(Q, K, V, mask=None):
    """Z = softmax(Q K^T / sqrt(d_k)) V over (..., T, d_k); mask is bool with True = blocked. A query whose every key
    is blocked gets a zero row of A and of Z, not NaN.

    Q (..., T_q, d_k), K (..., T_k, d_k), V (..., T_k, d_v), float32 or float64, zero or more leading dims; T_q may
    differ from T_k and d_v from d_k. Returns (Z, A): Z (..., T_q, d_v) and the weights A (..., T_q, T_k), each row
    summing to 1, in the inputs' dtype and on their device (a tensor made inside goes on Q.device). Tensor operations
    only: F.scaled_dot_product_attention is the oracle, not a tool.
    mask: None, or bool with True where a key is blocked, of any shape that broadcasts to (..., T_q, T_k): the (T, T)
    causal mask, a (B, 1, 1, T_k) padding mask, a (T_q, T_k) mask broadcast over batch and heads. Blocked scores become
    -inf before the softmax, so a blocked key's weight is exactly 0; a query whose every key is blocked would get
    softmax(all -inf) = 0/0 = NaN, and must get zeros instead (as SDPA's output does). The other notebooks differ:
    w8l1's `attention_context` takes True at a real token and False at padding and fills with finfo.min; lab14's
    `scaled_dot_product_attention` takes 1/True = may attend (so does SDPA's bool attn_mask: it gets ~mask here).
    The hidden checks compare Z, A and dQ, dK, dV with SDPA (float64 to 1e-10), unbatched (9, 16) inputs included, and
    test an all-blocked query row, the causal mask's no-look-ahead and permutation equivariance without a mask."""
    d_k = Q.shape[-1]
    scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # (..., T_q, T_k)
    if mask is not None:
        # -inf becomes an exact 0 weight after the softmax, so blocked keys contribute nothing
        scores = scores.masked_fill(mask, float("-inf"))
    A = torch.softmax(scores, dim=-1)  # (..., T_q, T_k), rows sum to 1
    if mask is not None:
        # a query whose every key is blocked attends to nothing (as SDPA does) instead of giving NaN
        A = A.masked_fill(mask.all(dim=-1, keepdim=True), 0.0)
    return A @ V, A


class MultiHeadAttention(nn.Module):
    """h heads of scaled dot-product attention side by side, concatenated and projected by W^O."""

    def __init__(self, d_model=512, h=8, bias=True):
        """The four d_model x d_model projections; head i owns columns i*d_k:(i+1)*d_k of W^Q, W^K, W^V.

        Stores self.h = h and self.d_k = d_model // h (h divides d_model), then registers self.WQ, self.WK, self.WV,
        self.WO, in that order, each nn.Linear(d_model, d_model, bias=bias); bias=False leaves no bias anywhere. The
        hidden checks read these names, and map them onto nn.MultiheadAttention (in_proj = cat(WQ, WK, WV),
        out_proj = WO)."""
        super().__init__()
        assert d_model % h == 0, "d_model must split evenly across the heads"
        self.h, self.d_k = h, d_model // h
        self.WQ = nn.Linear(d_model, d_model, bias=bias)
        self.WK = nn.Linear(d_model, d_model, bias=bias)
        self.WV = nn.Linear(d_model, d_model, bias=bias)
        self.WO = nn.Linear(d_model, d_model, bias=bias)

    def split_heads(self, x):
        """(..., T, d_model) -> (..., h, T, d_k): one slice of width d_k per head.

        Head i takes features i*d_k:(i+1)*d_k of the last axis, as nn.MultiheadAttention splits them; values are only
        moved, so the hidden check compares them exactly, e.g. (B, T, d_model) -> (B, h, T, d_k)."""
        x = x.reshape(*x.shape[:-1], self.h, self.d_k)  # (..., T, h, d_k)
        return x.transpose(-3, -2)  # (..., h, T, d_k)

    def forward(self, x_q, x_kv=None, mask=None):
        """Concat_i(attention(x_q W^Q_i, x_kv W^K_i, x_kv W^V_i)) W^O; returns (out, A (..., h, T_q, T_k)).

        x_q (B, T_q, d_model) gives the queries, x_kv (B, T_k, d_model) the keys and values; x_kv None is
        self-attention (x_kv = x_q). float32, or float64 after module.double(). Returns out (B, T_q, d_model) and
        every head's weights A (B, h, T_q, T_k), not averaged over heads. Uses your `attention`.
        mask as in `attention`: None or bool, True = blocked key, broadcasting to (B, h, T_q, T_k): a (T_q, T_k)
        causal mask, a (B, 1, 1, T_k) padding mask, a per-head (B, h, T_q, T_k) one; a (B, T_q, T_k) mask is the same
        for every head and needs a head axis at -3. w8l1 and lab14 differ (True = real token; 1/True = may attend),
        see `attention`. Must match nn.MultiheadAttention(d_model, h, bias=bias, batch_first=True) with the weights
        mapped across, called with the mask expanded to (B * h, T_q, T_k) as attn_mask (its bool convention is this
        one) and average_attn_weights=False: out, A, and the gradients w.r.t. x_q and x_kv."""
        x_kv = x_q if x_kv is None else x_kv
        q = self.split_heads(self.WQ(x_q))  # (B, h, T_q, d_k)
        k = self.split_heads(self.WK(x_kv))  # (B, h, T_k, d_k)
        v = self.split_heads(self.WV(x_kv))  # (B, h, T_k, d_k)
        if mask is not None and mask.dim() == x_q.dim():
            # a (B, T_q, T_k) mask is the same for every head: give it a head axis to broadcast over
            mask = mask.unsqueeze(-3)  # (B, 1, T_q, T_k)
        z, A = attention(q, k, v, mask)  # z: (B, h, T_q, d_k)
        z = z.transpose(-3, -2)  # (B, T_q, h, d_k)
        z = z.reshape(*z.shape[:-2], self.h * self.d_k)  # (B, T_q, d_model): heads concatenated
        return self.WO(z), A


def positional_encoding(max_len, d_emb, dtype=torch.float32):
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)); shape (max_len, d_emb).

    Rows pos = 0..max_len-1, d = d_emb; returned in `dtype` (float32 by default, or float64) on the CPU. Compute the
    angles in float64 and convert once at the end: the hidden checks hold a float64 table to 1e-9 and a float32 one
    to 3e-5 against the formula in float64. An odd d_emb has one sine column more than cosines: the last column is a
    sine with no partner (a hidden check of its own). max_len = 1 gives the one row [0, 1, 0, 1, ...]."""
    # computed in float64 and rounded once at the end, so float32 tables are exact to rounding
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_emb, 2, dtype=torch.float64)  # (ceil(d/2),) the even column indices
    angle = pos / torch.pow(10000.0, two_i / d_emb)  # (max_len, ceil(d/2))
    pe = torch.zeros(max_len, d_emb, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_emb // 2])  # an odd d_emb has one sine column more
    return pe.to(dtype)


def offset_matrix(k, d_emb):
    """Block-diagonal M_k (float64) with 2x2 blocks [[cos wk, sin wk], [-sin wk, cos wk]]: PE[pos+k] = M_k PE[pos].

    d_emb even (2 included); k any int: 0 gives the identity, a negative k shifts back. Block i sits at rows and
    columns 2i, 2i+1 with w_i = 10000^(-2i/d_emb), zeros elsewhere. Returns (d_emb, d_emb) float64, computed in
    float64 (a float32 matrix is off by ~1e-7). PE[pos] is a column here, so for a table of rows
    PE[pos + k] = PE[pos] @ M_k.T. The hidden checks hold M_k to 1e-9 against the formula and test it as an exact
    rotation to 1e-12: M_0 = I, zero outside the blocks, M_k M_k^T = I, each block's determinant 1 (no reflection),
    and M_a M_b = M_(a+b) to 1e-9."""
    assert d_emb % 2 == 0, "the offset identity needs sine and cosine columns in pairs"
    omega = torch.pow(10000.0, -torch.arange(0, d_emb, 2, dtype=torch.float64) / d_emb)  # (d/2,)
    c, s = torch.cos(omega * k), torch.sin(omega * k)  # (d/2,) each
    even = torch.arange(0, d_emb, 2)  # row/column of each block's sine entry
    M = torch.zeros(d_emb, d_emb, dtype=torch.float64)
    # angle addition: sin w(p+k) = cos(wk) sin(wp) + sin(wk) cos(wp), cos w(p+k) = -sin(wk) sin(wp) + cos(wk) cos(wp)
    M[even, even] = c
    M[even, even + 1] = s
    M[even + 1, even] = -s
    M[even + 1, even + 1] = c
    return M


def causal_mask(T, device=None):
    """(T, T) bool, True strictly above the diagonal: query t may not see keys after t.

    mask[t, j] is True (blocked, the convention of `attention`) exactly where j > t; T = 1 gives [[False]]. Made on
    `device`: None is torch's default, the CPU; the Transformer passes its inputs' device, and a hidden check asks
    for the meta device."""
    return torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), diagonal=1)


class FeedForward(nn.Module):
    """Position-wise network lin2(ReLU(lin1(x))), the same at every position."""

    def __init__(self, d_model, d_ff):
        """d_model -> d_ff -> d_model.

        Registers self.lin1 = nn.Linear(d_model, d_ff), then self.lin2 = nn.Linear(d_ff, d_model), and no other
        weights (d_ff may equal d_model)."""
        super().__init__()
        self.lin1 = nn.Linear(d_model, d_ff)
        self.lin2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        """(..., d_model) -> (..., d_model).

        lin2(ReLU(lin1(x))) for any leading dims, a single (d_model,) vector included: each position on its own, with
        the same weights."""
        return self.lin2(F.relu(self.lin1(x)))


class EncoderLayer(nn.Module):
    """Post-norm encoder layer: x = LayerNorm(x + SelfAttn(x)), then LayerNorm(x + FF(x))."""

    def __init__(self, d_model=512, h=8, d_ff=2048):
        """One self-attention sublayer and one feed-forward sublayer, each with its LayerNorm.

        Registers, in this order, self.attn = MultiHeadAttention(d_model, h), self.ff = FeedForward(d_model, d_ff),
        self.norm1 and self.norm2 = nn.LayerNorm(d_model); no dropout."""
        super().__init__()
        self.attn = MultiHeadAttention(d_model, h)
        self.ff = FeedForward(d_model, d_ff)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, x, mask=None):
        """(B, T, d_model) -> (y (B, T, d_model), A (B, h, T, T)); mask True = blocked key.

        x1 = norm1(x + attn(x)), y = norm2(x1 + ff(x1)) (post-norm); A is the self-attention's per-head weights.
        mask as in `attention`: None or bool, True = blocked, broadcasting to (B, h, T, T): a (B, 1, 1, T) padding
        mask or the (T, T) causal one; w8l1 (True = real token) and lab14 (1/True = may attend) differ, see
        `attention`. A padded position is still a query: its rows of y and A hold ordinary values, not zeros. Must
        match nn.TransformerEncoderLayer(d_model, h, d_ff, dropout=0, batch_first=True) carrying the same weights
        (in training mode: its fused inference path zeroes padded rows), in y, A and the gradient w.r.t. x."""
        a, A = self.attn(x, mask=mask)
        x = self.norm1(x + a)  # the residual needs the sublayer to keep d_model
        return self.norm2(x + self.ff(x)), A


class DecoderLayer(nn.Module):
    """Post-norm decoder layer: masked self-attention, attention over the memory, feed-forward."""

    def __init__(self, d_model=512, h=8, d_ff=2048):
        """Two attention sublayers and one feed-forward sublayer, each with its LayerNorm.

        Registers, in this order, self.self_attn and self.cross_attn (MultiHeadAttention(d_model, h) each),
        self.ff = FeedForward(d_model, d_ff), self.norm1, self.norm2, self.norm3 (nn.LayerNorm(d_model))."""
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, h)
        self.cross_attn = MultiHeadAttention(d_model, h)
        self.ff = FeedForward(d_model, d_ff)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)

    def forward(self, y, memory, causal_mask=None, memory_mask=None):
        """y (B, T, d), memory (B, S, d) -> (y (B, T, d), A_self (B, h, T, T), A_cross (B, h, T, S)).

        y1 = norm1(y + self_attn(y)), y2 = norm2(y1 + cross_attn(y1, memory)), out = norm3(y2 + ff(y2)): A_cross's
        queries are y1. Both masks as in `attention`, None or bool with True = blocked (w8l1 and lab14 differ, see
        `attention`): causal_mask (a tensor; it shadows the function here) broadcasts to (B, h, T, T), usually the
        (T, T) causal mask; memory_mask to (B, h, T, S), a (B, 1, 1, S) source-padding mask or a (T, S) one. None
        masks nothing: the layer builds no causal mask of its own. A blocked memory position gets exactly 0 in A_cross
        and cannot change the output. Must match nn.TransformerDecoderLayer(d_model, h, d_ff, dropout=0,
        batch_first=True) carrying the same weights, called with tgt_mask and memory_mask."""
        a, A_self = self.self_attn(y, mask=causal_mask)
        y = self.norm1(y + a)
        # queries come from the decoder, keys and values from the encoder's output
        c, A_cross = self.cross_attn(y, memory, mask=memory_mask)
        y = self.norm2(y + c)
        return self.norm3(y + self.ff(y)), A_self, A_cross


class Transformer(nn.Module):
    """Encoder-decoder transformer: embeddings * sqrt(d) + PE, n_enc encoder and n_dec decoder layers, logits."""

    def __init__(self, vocab, d_model=64, h=4, d_ff=128, n_enc=2, n_dec=2, max_len=64, pad_id=None):
        """Separate source/target embeddings, a fixed PE buffer, the two stacks and the output projection.

        Stores self.d_model and self.pad_id, then registers, in this order: self.src_emb and self.tgt_emb
        (nn.Embedding(vocab, d_model)), the buffer self.pe = positional_encoding(max_len, d_model) (register_buffer:
        it follows .to(device) and is not trained), self.encoder (nn.ModuleList of n_enc EncoderLayer(d_model, h,
        d_ff)), self.decoder (of n_dec DecoderLayer), self.out = nn.Linear(d_model, vocab). The hidden checks load
        weights by these names, else by this order. Then self.use_causal_mask = True, self.pe_scale = 1.0 and
        self.maps = {} (the attention matrices of the last pass)."""
        super().__init__()
        self.d_model, self.pad_id = d_model, pad_id
        self.src_emb = nn.Embedding(vocab, d_model)
        self.tgt_emb = nn.Embedding(vocab, d_model)
        self.register_buffer("pe", positional_encoding(max_len, d_model))  # (max_len, d_model), not trained
        self.encoder = nn.ModuleList([EncoderLayer(d_model, h, d_ff) for _ in range(n_enc)])
        self.decoder = nn.ModuleList([DecoderLayer(d_model, h, d_ff) for _ in range(n_dec)])
        self.out = nn.Linear(d_model, vocab)
        # switches for the experiments: decoder without the causal mask, PE scaled at test time
        self.use_causal_mask = True
        self.pe_scale = 1.0
        self.maps = {}  # every attention matrix of the last pass, for inspection

    def embed(self, emb, tokens):
        """emb(tokens) * sqrt(d_model) + pe_scale * PE[:T]: (B, T) -> (B, T, d_model).

        tokens int64 with T <= max_len; every row gets the same PE rows 0..T-1, scaled by the current pe_scale."""
        T = tokens.shape[-1]
        # the sqrt(d_model) keeps the learned embedding from being swamped by the unit-size PE
        return emb(tokens) * math.sqrt(self.d_model) + self.pe_scale * self.pe[:T]

    def encode(self, src):
        """src (B, S) -> state (memory (B, S, d_model), key mask (B, 1, 1, S) or None).

        The key mask is True where src == pad_id (None when pad_id is None), made from src, so on its device; every
        encoder layer gets it as its mask. Return the state as plain tensors, a tuple, so that
        decode(tgt_in, encode(src)) equals forward(src, tgt_in). Stores each layer's A (B, h, S, S) in the list
        self.maps['enc']."""
        pad = None
        if self.pad_id is not None:
            pad = (src == self.pad_id)[:, None, None, :]  # (B, 1, 1, S): same for every head and query
        x = self.embed(self.src_emb, src)
        self.maps["enc"] = []
        for layer in self.encoder:
            x, A = layer(x, mask=pad)
            self.maps["enc"].append(A)
        return x, pad

    def decode(self, tgt_in, state):
        """tgt_in (B, T) and the encoder's state -> logits (B, T, vocab).

        Self-attention gets causal_mask(T) on tgt_in's device while self.use_causal_mask is True (no mask when it is
        False); cross-attention gets the state's key mask as memory_mask. Target PAD tokens are not masked (the loss
        ignores them). Stores each layer's A_self (B, h, T, T) and A_cross (B, h, T, S) in the lists
        self.maps['dec_self'] and self.maps['cross']."""
        memory, pad = state
        T = tgt_in.shape[-1]
        mask = causal_mask(T, device=tgt_in.device) if self.use_causal_mask else None
        y = self.embed(self.tgt_emb, tgt_in)
        self.maps["dec_self"], self.maps["cross"] = [], []
        for layer in self.decoder:
            y, A_self, A_cross = layer(y, memory, mask, pad)
            self.maps["dec_self"].append(A_self)
            self.maps["cross"].append(A_cross)
        return self.out(y)

    def forward(self, src, tgt_in):
        """Teacher-forced pass: logits (B, T, vocab) for every target position at once.

        decode(tgt_in, encode(src)); src (B, S) and tgt_in (B, T) int64, S and T independent. The hidden checks compare
        the logits with the reference carrying your weights: padded sources with pad_id, pad_id None, and
        pe_scale = 0.5 with use_causal_mask = False set after construction."""
        return self.decode(tgt_in, self.encode(src))


def make_batch(B, L_min, L_max, gen):
    """Reverse task: src = d_1..d_L EOS PAD..., tgt = d_L..d_1 EOS PAD..., tgt_in = BOS tgt[:-1] (PAD after EOS).

    Returns (src, tgt_in, tgt, lens), all int64 on the CPU: src, tgt_in, tgt (B, T) with T = max(lens) + 1, and lens
    (B,). Lengths are uniform on L_min..L_max, both ends included (L_min = L_max and L_min = 1 allowed), digits uniform
    on 0..9. A row of length L: tgt_in = BOS, d_L..d_1, then PAD to the end (its EOS is never an input). Every random
    number comes from `gen`, none from the global RNG: the same seed gives the same batch."""
    lens = torch.randint(L_min, L_max + 1, (B,), generator=gen)  # (B,)
    T = int(lens.max()) + 1  # the longest row plus its EOS
    pos = torch.arange(T)[None, :]  # (1, T)
    L = lens[:, None]  # (B, 1)
    digits = torch.randint(0, N_DIGITS, (B, T), generator=gen)  # (B, T), only the first L of a row are used
    is_digit = pos < L  # (B, T)
    is_eos = pos == L  # (B, T)
    pad = torch.full((B, T), PAD, dtype=torch.long)
    eos = torch.full((B, T), EOS, dtype=torch.long)
    src = torch.where(is_digit, digits, torch.where(is_eos, eos, pad))
    # output position j copies source position L - 1 - j (clamped where the row has no digit)
    reversed_digits = digits.gather(1, (L - 1 - pos).clamp(min=0))  # (B, T)
    tgt = torch.where(is_digit, reversed_digits, torch.where(is_eos, eos, pad))
    # teacher forcing: position j reads tgt[j - 1], BOS at 0; everything after the EOS slot is PAD
    tgt_in = torch.cat([torch.full((B, 1), BOS, dtype=torch.long), tgt[:, :-1]], dim=1)  # (B, T)
    tgt_in = torch.where(pos <= L, tgt_in, pad)
    return src, tgt_in, tgt, lens


def greedy_decode(model, src, n_steps):
    """Start from BOS, append argmax_v p(v | prefix, src) n_steps times; returns (B, n_steps) without BOS.

    model: anything with encode(src) -> state and decode(tgt_in, state) -> logits (B, t, vocab) (your Transformer,
    the GRU baseline); src (B, S) int64. Encode once; each step decodes the whole prefix so far, a (B, t) int64 tensor
    that starts as a BOS column made on src's device, and appends the argmax of its last position's logits. No stop
    at EOS: exactly n_steps tokens (n_steps = 1, B = 1 included). Returns int64 (B, n_steps) on src's device, built
    under torch.no_grad() (no graph)."""
    with torch.no_grad():
        state = model.encode(src)
        ys = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)  # (B, 1)
        for _ in range(n_steps):
            # no cache: the whole prefix is re-run and only the newest position's logits are used
            nxt = model.decode(ys, state)[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
            ys = torch.cat([ys, nxt], dim=1)  # (B, t + 1)
    return ys[:, 1:]


def mha_cost(d_model, h, d_k, T):
    """(parameters 3 d h d_k + h d_k d without biases, Q K^T multiply-adds h T^2 d_k).

    d = d_model, and d_k need not be d_model / h. Returns the pair (params, score_flops), Python ints for int inputs,
    checked exactly."""
    params = 3 * d_model * h * d_k + h * d_k * d_model  # W^Q, W^K, W^V, then W^O
    score_flops = h * T * T * d_k  # one T x T score matrix per head, d_k products per entry
    return params, score_flops
