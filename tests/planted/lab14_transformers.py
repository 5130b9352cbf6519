"""Planted mistakes and correct alternatives for lab14_transformers.

A tuple (old, new) edits the reference cell (one realistic slip); a string is a whole cell written differently.
"""
from tests.planted import OVERLAP_TODO, SHAPES_TODO, add_slips, attach_catches

PLANTED = {
    "scaled_dot_product_attention": {
        "wrong": {
            "no_sqrt_scale": ("/ math.sqrt(d_k)", ""),
            "softmax_over_queries": ("weights = torch.softmax(scores, dim=-1)\n        return",
                                     "weights = torch.softmax(scores, dim=-2)\n        return"),
            "mask_convention_flipped": ("scores = scores.masked_fill(~allowed, float(\"-inf\"))",
                                        "scores = scores.masked_fill(allowed, float(\"-inf\"))"),
            # a 0/1 number mask read as PyTorch's additive float attn_mask: wrong only where a mask is not bool
            "number_mask_added_to_the_scores": ("    allowed = mask != 0  # bool whatever the mask's dtype",
                                                "    if mask.dtype != torch.bool:\n"
                                                "        weights = torch.softmax(scores + mask, dim=-1)\n"
                                                "        return weights @ V, weights\n"
                                                "    allowed = mask != 0  # bool whatever the mask's dtype"),
            # the right weights, cut off from the graph (for plotting): no gradient reaches Q or K
            "weights_detached": ("weights = torch.softmax(scores, dim=-1)\n        return",
                                 "weights = torch.softmax(scores, dim=-1).detach()\n        return"),
        },
        "right": {
            "einsum_and_where": '''def scaled_dot_product_attention(Q, K, V, mask=None):
    """softmax(Q K^T / sqrt(d_k)) V with mask 1/True = may attend."""
    scores = torch.einsum("...qd,...kd->...qk", Q, K) * Q.shape[-1] ** -0.5
    if mask is not None:
        scores = torch.where(mask.bool(), scores, torch.full_like(scores, -1e30))
    weights = scores.softmax(dim=-1)
    if mask is not None:  # a query with no open key: zeros, not the uniform weights -1e30 leaves
        weights = weights * mask.bool().any(-1, keepdim=True)
    return torch.einsum("...qk,...kd->...qd", weights, V), weights
''',
        },
    },
    "manual_multihead": {
        "wrong": {
            "heads_split_without_transpose": (".transpose(-3, -2)  # (..., H, S, D)", "  # (..., H, S, D)"),
            "no_out_proj": ("return mha.out_proj(out), weights", "return out, weights"),
        },
        "right": {
            "weights_sliced_by_hand": '''def manual_multihead(x, mha):
    """Self-attention with mha's packed weights, written out."""
    B, S, E = x.shape
    H = mha.num_heads
    D = E // H
    W, b = mha.in_proj_weight, mha.in_proj_bias
    bias = (lambda i: b[i * E:(i + 1) * E]) if b is not None else (lambda i: None)
    q, k, v = (F.linear(x, W[i * E:(i + 1) * E], bias(i)).view(B, S, H, D).permute(0, 2, 1, 3) for i in range(3))
    out, weights = scaled_dot_product_attention(q, k, v)
    out = out.permute(0, 2, 1, 3).reshape(B, S, E)
    return F.linear(out, mha.out_proj.weight, mha.out_proj.bias), weights
''',
        },
    },
    "PositionalEncoding": {
        "wrong": {
            "sin_cos_swapped": ("pe[:, 0::2] = torch.sin(angle)", "pe[:, 0::2] = torch.cos(angle)"),
            "parameter_not_buffer": ('self.register_buffer("pe", pe.float().unsqueeze(0))',
                                     'self.pe = nn.Parameter(pe.float().unsqueeze(0))'),
        },
        "right": {
            "power_form": '''class PositionalEncoding(nn.Module):
    """x + sinusoidal PE."""

    def __init__(self, d_model, max_len=512):
        """The fixed table as a buffer."""
        super().__init__()
        pos = torch.arange(max_len).float()[:, None]
        i = torch.arange(0, d_model, 2).float()
        div = 10000.0 ** (i / d_model)
        pe = torch.zeros(1, max_len, d_model)
        pe[0, :, 0::2] = torch.sin(pos / div)
        pe[0, :, 1::2] = torch.cos(pos / div)[:, : d_model // 2]
        self.register_buffer("pe", pe)

    def forward(self, x):
        """Add the first S rows."""
        return x + self.pe[:, : x.size(1)]
''',
        },
    },
    "EncoderBlock": {
        "wrong": {
            "post_norm": ("h = self.norm1(x)\n", "h = x\n"),
            "relu_not_gelu": ("nn.GELU(),", "nn.ReLU(),"),
            "no_residual_on_ff": ("x = x + self.dropout(self.ff(self.norm2(x)))",
                                  "x = self.dropout(self.ff(self.norm2(x)))"),
            # a default width the shapes and values cases also use; a dropout only train mode shows
            "ff_dim_default_2x": ("ff_dim = ff_dim or 4 * d_model", "ff_dim = ff_dim or 2 * d_model"),
            "dropout_argument_ignored": ("ff_dim = ff_dim or 4 * d_model  # the usual 4x expansion\n",
                                         "ff_dim = ff_dim or 4 * d_model\n        dropout = 0.0\n"),
        },
        "right": {
            "no_ff_dropout": '''class EncoderBlock(nn.Module):
    """Pre-norm encoder block."""

    def __init__(self, d_model, num_heads, ff_dim=None, dropout=0.1):
        """Attention, two norms, a GELU feed-forward."""
        super().__init__()
        ff_dim = ff_dim if ff_dim is not None else 4 * d_model
        self.attn = nn.MultiheadAttention(d_model, num_heads, dropout=dropout, batch_first=True)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, ff_dim), nn.GELU(), nn.Linear(ff_dim, d_model))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, need_weights=False):
        """Two residual sub-layers."""
        y = self.norm1(x)
        a, w = self.attn(y, y, y, need_weights=need_weights, average_attn_weights=False)
        x = x + self.dropout(a)
        return x + self.dropout(self.ff(self.norm2(x))), w
''',
        },
    },
    "make_memory_dataset": {
        "wrong": {
            "marker_at_the_end": ("X[:, 0, 0] = marker", "X[:, -1, 0] = marker"),
            "labels_inverted": ("y = (marker > 0).float().unsqueeze(1)", "y = (marker < 0).float().unsqueeze(1)"),
        },
        "right": {
            "uniform_then_sign": '''def make_memory_dataset(n_samples, seq_len, seed=0):
    """Noise in [-1, 1] with a +-1 marker first; the label is the marker's sign."""
    gen = torch.Generator().manual_seed(seed)
    X = torch.empty(n_samples, seq_len, 1).uniform_(-1, 1, generator=gen)
    sign = torch.where(torch.rand(n_samples, generator=gen) < 0.5, -1.0, 1.0)
    X[:, 0, 0] = sign
    return X, (sign > 0).float()[:, None]
''',
        },
    },
    "TransformerClassifier": {
        "wrong": {
            "reads_last_position": ("logits = self.head(self.norm(h)[:, 0])",
                                    "logits = self.head(self.norm(h)[:, -1])"),
            "no_positional_encoding": ("h = self.pos_enc(torch.cat([cls, h], dim=1))",
                                       "h = torch.cat([cls, h], dim=1)"),
            # an embedding dropout with F.dropout, whose training defaults to True: on in eval mode too
            "dropout_on_in_eval": ("h = self.pos_enc(torch.cat([cls, h], dim=1))",
                                   "h = F.dropout(self.pos_enc(torch.cat([cls, h], dim=1)), self.blocks[0].dropout.p)"),
        },
        "right": {
            "cls_appended_by_repeat": None,  # filled below: the reference with a different but equal CLS expansion
        },
    },
}
PLANTED["TransformerClassifier"]["right"]["cls_appended_by_repeat"] = (
    "cls = self.cls_token.expand(B, -1, -1)", "cls = self.cls_token.repeat(B, 1, 1)")

# Training failures: code that passes every check of its item (values load a reference state) yet cannot learn.
# "fails" lists the experiments of the graded items that must be lost.
TRAINING = {
    "head_on_detached_cls": {
        "item": "TransformerClassifier", "fails": ["memory_task"],
        # only the head learns: the CLS token, PE projection and blocks keep their random initialisation
        "variant": ("logits = self.head(self.norm(h)[:, 0])", "logits = self.head(self.norm(h)[:, 0].detach())"),
    },
}
TRAINING_NOT_PLANTED = {}

# The checks that catch each planted mistake: exactly these fail, every other check of its item passes.
CATCHES = {
    "scaled_dot_product_attention": {
        "mask_convention_flipped": {"values", "gradients"},
        "number_mask_added_to_the_scores": {"values"},
        "no_sqrt_scale": {"values", "gradients"},
        "softmax_over_queries": {"values", "gradients"},
        "weights_detached": {"gradients"},
    },
    "manual_multihead": {
        "heads_split_without_transpose": {"shapes", "values"},
        "no_out_proj": {"values"},
    },
    "PositionalEncoding": {
        "parameter_not_buffer": {"properties"},
        "sin_cos_swapped": {"values", "properties"},
    },
    "EncoderBlock": {
        "no_residual_on_ff": {"values"},
        "post_norm": {"values"},
        "relu_not_gelu": {"values"},
        "ff_dim_default_2x": {"shapes", "values", "properties"},
        "dropout_argument_ignored": {"properties"},
    },
    "make_memory_dataset": {
        "labels_inverted": {"properties"},
        "marker_at_the_end": {"properties"},
    },
    "TransformerClassifier": {
        "dropout_on_in_eval": {"values"},
        "no_positional_encoding": {"values"},
        "reads_last_position": {"values"},
    },
}
# Shape slips: a leftover or missing dimension, or a layout the caller does not expect (see add_slips).
SHAPE_SLIPS = {
    "PositionalEncoding": {"table_without_its_batch_dim": (
        ('self.register_buffer("pe", pe.float().unsqueeze(0))', 'self.register_buffer("pe", pe.float())'),
        {"shapes", "values", "properties"})},
    "TransformerClassifier": {"logits_squeezed": (
        ("logits = self.head(self.norm(h)[:, 0])  # (B, 1)",
         "logits = self.head(self.norm(h)[:, 0]).squeeze(-1)  # (B,)"),
        {"shapes", "values"})},
    "make_memory_dataset": {"labels_without_their_column": (
        ("y = (marker > 0).float().unsqueeze(1)", "y = (marker > 0).float()"), {"shapes", "properties"})},
    "scaled_dot_product_attention": {"bmm_only_takes_3d": (
        ("scores = Q @ K.transpose(-2, -1)", "scores = torch.bmm(Q, K.transpose(1, 2))"),
        {"shapes", "values", "gradients"})},
}
add_slips(PLANTED, CATCHES, SHAPE_SLIPS)
# Device slips: a tensor made on the CPU inside the item, which crashes once the inputs are on a GPU. Only the shapes
# check's second run, with every input on a fake GPU, catches it on a CPU grader (see add_slips).
DEVICE_SLIPS = {
    # a .cpu() round trip, a CPU weight in a linear layer, a CPU index: each passes on meta, fails on the fake GPU
    "PositionalEncoding": {"table_read_on_the_cpu": (
        ("self.pe[0, :S].to(dtype=x.dtype, device=x.device)", "self.pe[0, :S].cpu().to(dtype=x.dtype)"), {"shapes"}),
                           "positions_indexed_on_the_cpu": (
        ("self.pe[0, :S].to(dtype=x.dtype, device=x.device)",
         "self.pe[0].index_select(0, torch.arange(S)).to(dtype=x.dtype)"), {"shapes"})},
    "manual_multihead": {"projection_weight_on_the_cpu": (
        ("F.linear(x, mha.in_proj_weight, mha.in_proj_bias)",
         "F.linear(x, mha.in_proj_weight.cpu(), mha.in_proj_bias)"), {"shapes"})},
    "scaled_dot_product_attention": {"scale_as_a_cpu_tensor": (  # a 1-element CPU tensor is no scalar
        ("/ math.sqrt(d_k)", "/ torch.sqrt(torch.tensor([d_k], dtype=Q.dtype))"), {"shapes"})},
}
add_slips(PLANTED, CATCHES, DEVICE_SLIPS)
# A query with no key to attend to: the -inf recipe alone gives NaN there, where the spec says zeros (see add_slips).
EDGE_SLIPS = {
    "scaled_dot_product_attention": {"no_open_key_gives_nan": (
        ("    scores = scores.masked_fill(empty, 0.0)\n"
         "    weights = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)",
         "    weights = torch.softmax(scores, dim=-1)"), {"properties"})},
}
add_slips(PLANTED, CATCHES, EDGE_SLIPS)
attach_catches(PLANTED, CATCHES)

# Checks that no planted mistake above fails on its own, and why; the meta-test wants this list to shrink.
NOT_ISOLATED = {
    ("PositionalEncoding", "values"): OVERLAP_TODO,
    ("EncoderBlock", "shapes"): SHAPES_TODO,
    ("make_memory_dataset", "shapes"): SHAPES_TODO,
    ("TransformerClassifier", "shapes"): SHAPES_TODO,
}
