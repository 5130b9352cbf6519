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
    """softmax(Q K^T / sqrt(d_k)) V over (..., S, d_k); mask: 1/True = may attend, 0 = blocked. A query that may
    attend to no key gets zero weights and a zero output, not NaN."""
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
    """Self-attention Concat(head_1..head_H) W_O, head_i = Attention(x W_i^Q, x W_i^K, x W_i^V), with mha's weights."""
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
        """Tabulate PE for positions 0 .. max_len - 1 once; it is fixed, not learned."""
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
        """(..., S, E) -> x + PE[:S]."""
        S = x.size(-2)
        return x + self.pe[0, :S].to(dtype=x.dtype, device=x.device)  # (S, E) broadcasts over ...


class EncoderBlock(nn.Module):
    """Pre-norm block: x + Drop(MHA(LN1(x))), then x + Drop(FF(LN2(x))), FF = Linear-GELU-Linear."""

    def __init__(self, d_model, num_heads, ff_dim=None, dropout=0.1):
        """Self-attention and a position-wise feed-forward net, each with its own LayerNorm."""
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
        """(B, S, E) -> ((B, S, E), per-head weights (B, H, S, S) or None)."""
        # pre-norm: the residual path x stays un-normalised, which keeps deep stacks stable
        h = self.norm1(x)
        attn_out, weights = self.attn(h, h, h, need_weights=need_weights,
                                      average_attn_weights=False)  # Q = K = V = h
        x = x + self.dropout(attn_out)
        x = x + self.dropout(self.ff(self.norm2(x)))
        return x, (weights if need_weights else None)


def make_memory_dataset(n_samples, seq_len, seed=0):
    """X (n, S, 1) ~ U[-1, 1] with X[:, 0] = +-1 marker; y (n, 1) = 1[marker > 0]."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n_samples, seq_len, 1, generator=g) * 2 - 1  # (n, S, 1) noise in [-1, 1)
    marker = torch.randint(0, 2, (n_samples,), generator=g).float() * 2 - 1  # (n,) in {-1, +1}
    X[:, 0, 0] = marker  # only the first step carries the label; the rest is distraction
    y = (marker > 0).float().unsqueeze(1)  # (n, 1)
    return X, y


class TransformerClassifier(nn.Module):
    """Logit from a learned [CLS] token read out after encoder blocks over [CLS; x W_in + b] + PE."""

    def __init__(self, input_size=1, d_model=32, num_heads=4, num_layers=2, dropout=0.1, max_len=61):
        """Input projection, CLS token, PE for max_len positions (CLS included), blocks, final LN, head."""
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
        """(B, S, input_size) -> logits (B, 1) [, per-layer weights, each (B, H, S+1, S+1)]."""
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
