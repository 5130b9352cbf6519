"""Reference solution for Lab 14: Attention and transformers.

Dimension names used throughout:
    B  batch size            S  sequence length (S_q queries, S_k keys)
    E  model width (d_model) H  number of heads
    D  width of one head, E // H (d_k in the attention formula)
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def scaled_dot_product_attention(Q, K, V, mask=None):
    """softmax(Q K^T / sqrt(d_k)) V over (..., S, d_k); mask: 1/True = may attend, 0/False = blocked.

    Q (..., S_q, d_k), K (..., S_k, d_k), V (..., S_k, d_v), float32 or float64, with zero or more leading batch dims
    (none, (B,) or (B, H)) -> (out, weights): out (..., S_q, d_v), weights (..., S_q, S_k) with rows summing to 1,
    both in Q's dtype and on Q's device (so is any tensor you create). torch.softmax copes with large scores.
    mask: None, or bool, 0/1 float or 0/1 integer, broadcasting against the scores (..., S_q, S_k): a causal
    (S_q, S_k) tril, a padding (B, 1, 1, S_k). A blocked score becomes -inf before the softmax, so its weight is
    exactly 0. A query whose mask row is all 0 (no key open) gets zero weights and a zero output, not NaN: the -inf
    recipe alone gives 0/0 there. The other notebooks differ: w8l4's `attention` takes a bool mask with True = blocked
    key (filled with -inf); w8l1's `attention_context` takes True at a real token, False at padding (filled with
    finfo.min). Hidden checks: unbatched, (B, S, d) and (B, H, S, d) inputs, S_q != S_k, d_v != d_k, float64, the
    all-blocked row, and gradients w.r.t. Q, K and V."""
    d_k = Q.size(-1)
    scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # (..., S_q, S_k)
    if mask is None:
        weights = torch.softmax(scores, dim=-1)
        return weights @ V, weights
    allowed = mask != 0  # bool whatever the mask's dtype; broadcasts against scores
    # a blocked key gets score -inf, i.e. exactly zero weight after the softmax
    scores = scores.masked_fill(~allowed, float("-inf"))
    # a query with no key left would give 0/0 = NaN; give it zero weights instead
    # (PyTorch's fused attention does the same) while keeping gradients finite
    empty = ~allowed.any(dim=-1, keepdim=True)  # (..., S_q, 1)
    scores = scores.masked_fill(empty, 0.0)
    weights = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)  # rows sum to 1 (or 0)
    return weights @ V, weights  # (..., S_q, d_v), (..., S_q, S_k)


def manual_multihead(x, mha):
    """Self-attention Concat(head_1..head_H) W_O, head_i = Attention(x W_i^Q, x W_i^K, x W_i^V), with mha's weights.

    x (..., S, E) (the checks send (B, S, E), float32); mha = nn.MultiheadAttention(E, H, batch_first=True), no
    dropout, no mask -> (out (..., S, E), weights (..., H, S, S)), the per-head weights that
    mha(x, x, x, average_attn_weights=False) returns, in x's dtype and on x's device. W^Q, W^K, W^V are rows 0:E,
    E:2E, 2E:3E of mha.in_proj_weight (3E, E), applied as x W^T + b with mha.in_proj_bias (3E,); head h owns columns
    h*D:(h+1)*D, D = E // H (H = mha.num_heads); concatenate the heads back in that order, then apply mha.out_proj.
    mha may be built with bias=False: in_proj_bias and out_proj.bias are then None. Attend with your
    scaled_dot_product_attention; calling mha(...) runs F.multi_head_attention_forward, which zeroes the item.
    The hidden checks use (E, H) = (16, 4), (24, 3) without biases, (8, 1) and (32, 8)."""
    *batch, S, E = x.shape
    H = mha.num_heads
    D = E // H
    # PyTorch packs W_Q, W_K, W_V as one (3E, E) matrix, applied as x @ W^T
    qkv = F.linear(x, mha.in_proj_weight, mha.in_proj_bias)  # (..., S, 3E)
    q, k, v = qkv.chunk(3, dim=-1)  # each (..., S, E)

    def split_heads(t):
        """(..., S, E) -> (..., H, S, D): head h owns columns h*D .. (h+1)*D - 1."""
        return t.reshape(*batch, S, H, D).transpose(-3, -2)  # (..., H, S, D)

    out, weights = scaled_dot_product_attention(split_heads(q), split_heads(k), split_heads(v))
    out = out.transpose(-3, -2).reshape(*batch, S, E)  # (..., S, H*D): heads concatenated
    return mha.out_proj(out), weights  # (..., S, E), (..., H, S, S)


class PositionalEncoding(nn.Module):
    """x + PE with PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d))."""

    def __init__(self, d_model, max_len=512):
        """Tabulate PE for positions 0 .. max_len - 1 once; it is fixed, not learned.

        Store it as self.register_buffer("pe", table) with table (1, max_len, d_model), float32: a buffer moves with
        .to(device) (the hidden shapes check moves the module to the meta device and reads pe there) and is saved in
        the state_dict (the classifier's weights are copied by state_dict order and shape, pe included); the module
        has no parameters. Column 2i holds the sine, 2i + 1 the cosine of the same frequency; checked against the
        formula in float64 to 1e-4 for (d_model, max_len) = (16, 50), (32, 512), (6, 20), and sin^2 + cos^2 = 1 for
        each pair."""
        super().__init__()
        # work in float64 so the stored float32 table is correctly rounded
        position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
        # 10000^(-2i/d) for i = 0 .. ceil(d/2) - 1, via exp/log for range safety
        inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64)
                             * (-math.log(10000.0) / d_model))  # (ceil(d/2),)
        angle = position * inv_freq  # (max_len, ceil(d/2))
        pe = torch.zeros(max_len, d_model, dtype=torch.float64)
        pe[:, 0::2] = torch.sin(angle)
        pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])  # odd d_model has one cos column fewer
        # a buffer: moves with .to() and is saved in the state dict, but the optimiser never sees it
        self.register_buffer("pe", pe.float().unsqueeze(0))  # (1, max_len, E)

    def forward(self, x):
        """(..., S, E) -> x + PE[:S].

        S <= max_len; PE[:S] (S, E) broadcasts over the leading dims. The result has x's shape, dtype (float32 or
        float64) and device: a float64 table added to float32 x would come out float64."""
        S = x.size(-2)
        return x + self.pe[0, :S].to(dtype=x.dtype, device=x.device)  # (S, E) broadcasts over ...


class EncoderBlock(nn.Module):
    """Pre-norm block: x + Drop(MHA(LN1(x))), then x + Drop(FF(LN2(x))), FF = Linear-GELU-Linear."""

    def __init__(self, d_model, num_heads, ff_dim=None, dropout=0.1):
        """Self-attention and a position-wise feed-forward net, each with its own LayerNorm.

        Attributes, registered in this order (EncoderBlock's checks read its weights by these names; the
        classifier's checks and memory-task run copy them by state_dict order and shape):
        attn = nn.MultiheadAttention(d_model, num_heads, dropout=dropout, batch_first=True);
        norm1, norm2 = nn.LayerNorm(d_model); ff = nn.Sequential(nn.Linear(d_model, ff_dim), nn.GELU() (exact, not
        tanh), nn.Dropout(dropout), nn.Linear(ff_dim, d_model)), exactly two Linear layers, ff_dim = 4 * d_model when
        None; dropout = nn.Dropout(dropout). EncoderBlock(32, 4) has 12,704 parameters."""
        super().__init__()
        ff_dim = ff_dim or 4 * d_model  # the usual 4x expansion
        self.attn = nn.MultiheadAttention(d_model, num_heads, dropout=dropout, batch_first=True)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        # dropout on the hidden activations sits inside ff, as in nn.TransformerEncoderLayer
        self.ff = nn.Sequential(
            nn.Linear(d_model, ff_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(ff_dim, d_model),
        )
        self.dropout = nn.Dropout(dropout)  # on each sub-layer's output, before the residual add

    def forward(self, x, need_weights=False):
        """(B, S, E) -> ((B, S, E), per-head weights (B, H, S, S) or None).

        x <- x + dropout(attn(h, h, h)) with h = norm1(x), then x <- x + dropout(ff(norm2(x))): pre-norm, the
        residual path is never normalised. In eval mode this equals nn.TransformerEncoderLayer(norm_first=True,
        activation="gelu", batch_first=True) with the same weights (calling it zeroes the item). need_weights=True:
        self.attn's weights with average_attn_weights=False; need_weights=False: the second entry is None. Dropout
        acts in train mode only: two train-mode passes at dropout 0.5 differ, two eval-mode passes agree."""
        # pre-norm: the residual path x stays un-normalised, which keeps deep stacks stable
        h = self.norm1(x)
        attn_out, weights = self.attn(h, h, h, need_weights=need_weights,
                                      average_attn_weights=False)  # Q = K = V = h
        x = x + self.dropout(attn_out)
        x = x + self.dropout(self.ff(self.norm2(x)))
        return x, (weights if need_weights else None)


def make_memory_dataset(n_samples, seq_len, seed=0):
    """X (n, S, 1) ~ U[-1, 1] with X[:, 0] = +-1 marker; y (n, 1) = 1[marker > 0].

    Returns (X, y), both float32 on the CPU, drawn from a private torch.Generator seeded with seed: the same seed
    gives the same data, another seed different data. Markers +1 and -1 equally likely; X[:, 1:] uniform on
    [-1, 1] (mean 0, variance 1/3); y is 1.0 exactly where the marker is +1. The hidden checks test these
    properties on 2,000 sequences, not particular values; draw the noise first and the markers second to
    reproduce Lab 11's sets."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n_samples, seq_len, 1, generator=g) * 2 - 1  # (n, S, 1) noise in [-1, 1)
    marker = torch.randint(0, 2, (n_samples,), generator=g).float() * 2 - 1  # (n,) in {-1, +1}
    X[:, 0, 0] = marker  # only the first step carries the label; the rest is distraction
    y = (marker > 0).float().unsqueeze(1)  # (n, 1)
    return X, y


class TransformerClassifier(nn.Module):
    """Logit from a learned [CLS] token read out after encoder blocks over [CLS; x W_in + b] + PE."""

    def __init__(self, input_size=1, d_model=32, num_heads=4, num_layers=2, dropout=0.1, max_len=61):
        """Input projection, CLS token, PE for max_len positions (CLS included), blocks, final LN, head.

        Attributes, registered in this order: input_proj = nn.Linear(input_size, d_model); cls_token =
        nn.Parameter (1, 1, d_model), initialised small (normal, std 0.02); pos_enc = PositionalEncoding(d_model,
        max_len=max_len); blocks = nn.ModuleList of num_layers EncoderBlock(d_model, num_heads, dropout=dropout);
        norm = nn.LayerNorm(d_model); head = nn.Linear(d_model, 1). Nothing else with state: the hidden checks, and
        the memory-task run after training, copy your weights into the reference model by state_dict order and shape
        (cls_token, input_proj, pos_enc.pe, blocks, norm, head). The defaults give 25,601 parameters (pe is a
        buffer); the graded run builds TransformerClassifier(dropout=0.0, max_len=61)."""
        super().__init__()
        self.input_proj = nn.Linear(input_size, d_model)
        # one learned vector shared by all sequences: a slot that gathers evidence to classify from
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model))
        self.pos_enc = PositionalEncoding(d_model, max_len=max_len)
        self.blocks = nn.ModuleList(
            [EncoderBlock(d_model, num_heads, dropout=dropout) for _ in range(num_layers)])
        self.norm = nn.LayerNorm(d_model)  # pre-norm blocks leave the last output un-normalised
        self.head = nn.Linear(d_model, 1)
        nn.init.normal_(self.cls_token, std=0.02)

    def forward(self, x, return_attn=False):
        """(B, S, input_size) -> logits (B, 1) [, per-layer weights, each (B, H, S+1, S+1)].

        [cls_token; input_proj(x)] (B, S+1, E), CLS at position 0 (S+1 <= max_len), + PE, the blocks, then norm;
        the logit is head of position 0 alone. return_attn=False: the logits tensor alone; True: the pair
        (logits, attentions), attentions a list (not a tuple) of one per-head weight tensor per block. Tensors you
        create go on x's device (the hidden shapes check runs on the meta device). Checked against the reference
        carrying your weights, dropout 0, eval mode: the defaults with S = 60; d_model 16, 2 heads, 3 layers, S = 20."""
        B = x.size(0)
        h = self.input_proj(x)  # (B, S, E)
        cls = self.cls_token.expand(B, -1, -1)  # (B, 1, E)
        h = self.pos_enc(torch.cat([cls, h], dim=1))  # (B, S+1, E): CLS at position 0
        attentions = []
        for block in self.blocks:
            h, weights = block(h, need_weights=return_attn)
            if return_attn:
                attentions.append(weights)  # (B, H, S+1, S+1)
        logits = self.head(self.norm(h)[:, 0])  # (B, 1): only the CLS position is read
        return (logits, attentions) if return_attn else logits
