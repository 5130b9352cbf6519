"""Planted mistakes and correct alternatives for w8l4_transformers.

A tuple (old, new) edits the reference cell (one realistic slip); a string is a whole cell written differently.
Wrong variants of the layers and the Transformer are chosen so that the model still runs end to end: greedy_decode
is graded on the student's own Transformer, and it must not lose points for a mistake elsewhere.
"""
from tests.planted import OVERLAP_TODO, SHAPES_TODO, add_slips, attach_catches

PLANTED = {
    "attention": {
        "wrong": {
            "no_sqrt_scale": ("scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)", "scores = Q @ K.transpose(-2, -1)"),
            "scaled_by_d_k": ("/ math.sqrt(d_k)", "/ d_k"),
            "softmax_over_queries": ("A = torch.softmax(scores, dim=-1)", "A = torch.softmax(scores, dim=-2)"),
            "mask_convention_flipped": ('scores = scores.masked_fill(mask, float("-inf"))',
                                        'scores = scores.masked_fill(~mask, float("-inf"))'),
            # right values, but no gradient reaches Q or K: only the gradients check can see it
            "weights_detached": ("A = torch.softmax(scores, dim=-1)  #",
                                 "A = torch.softmax(scores, dim=-1).detach()  #"),
        },
        "right": {
            "einsum_and_stable_softmax": '''def attention(Q, K, V, mask=None):
    """softmax(Q K^T / sqrt(d_k)) V with mask True = blocked; the softmax written out."""
    scores = torch.einsum("...qd,...kd->...qk", Q, K) * Q.shape[-1] ** -0.5
    if mask is not None:
        scores = torch.where(mask, torch.finfo(scores.dtype).min, scores)
    scores = scores - scores.amax(dim=-1, keepdim=True)
    e = scores.exp()
    A = e / e.sum(dim=-1, keepdim=True)
    if mask is not None:  # a query with every key blocked: zeros, not the uniform weights finfo.min leaves
        A = torch.where(mask.all(-1, keepdim=True), 0.0, A)
    return torch.einsum("...qk,...kd->...qd", A, V), A
''',
        },
    },
    "MultiHeadAttention": {
        "wrong": {
            "split_without_transpose": ("x = x.reshape(*x.shape[:-1], self.h, self.d_k)  # (..., T, h, d_k)\n"
                                        "        return x.transpose(-3, -2)",
                                        "return x.reshape(*x.shape[:-2], self.h, x.shape[-2], self.d_k)"),
            "no_output_projection": ("return self.WO(z), A", "return z, A"),
            "x_kv_ignored": ("x_kv = x_q if x_kv is None else x_kv", "x_kv = x_q"),
            # right values, but no gradient flows back through the keys
            "keys_detached": ("k = self.split_heads(self.WK(x_kv))", "k = self.split_heads(self.WK(x_kv)).detach()"),
        },
        "right": {
            "split_and_stack": '''class MultiHeadAttention(nn.Module):
    """h heads side by side; heads cut out with split/stack and put back with cat."""

    def __init__(self, d_model=512, h=8, bias=True):
        """Four d_model x d_model projections."""
        super().__init__()
        self.h = h
        self.d_k = d_model // h
        self.WQ = nn.Linear(d_model, d_model, bias=bias)
        self.WK = nn.Linear(d_model, d_model, bias=bias)
        self.WV = nn.Linear(d_model, d_model, bias=bias)
        self.WO = nn.Linear(d_model, d_model, bias=bias)

    def split_heads(self, x):
        """(..., T, d_model) -> (..., h, T, d_k)."""
        return torch.stack(x.split(self.d_k, dim=-1), dim=-3)

    def forward(self, x_q, x_kv=None, mask=None):
        """Concatenated heads projected by W^O, and the per-head weights."""
        if x_kv is None:
            x_kv = x_q
        q, k, v = self.split_heads(self.WQ(x_q)), self.split_heads(self.WK(x_kv)), self.split_heads(self.WV(x_kv))
        if mask is not None and mask.dim() == 3:
            mask = mask[:, None]
        z, A = attention(q, k, v, mask)
        return self.WO(torch.cat(z.unbind(dim=-3), dim=-1)), A
''',
        },
    },
    "positional_encoding": {
        "wrong": {
            "sin_cos_swapped": ("pe[:, 0::2] = torch.sin(angle)\n    pe[:, 1::2] = torch.cos(",
                                "pe[:, 0::2] = torch.cos(angle)\n    pe[:, 1::2] = torch.sin("),
            "exponent_i_not_2i": ("angle = pos / torch.pow(10000.0, two_i / d_emb)",
                                  "angle = pos / torch.pow(10000.0, two_i / 2 / d_emb)"),
            "float32_then_cast": '''def positional_encoding(max_len, d_emb, dtype=torch.float32):
    """The PyTorch-tutorial table, always computed in float32."""
    pos = torch.arange(max_len).float()[:, None]
    div = torch.exp(torch.arange(0, d_emb, 2).float() * (-math.log(10000.0) / d_emb))
    pe = torch.zeros(max_len, d_emb)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div[: d_emb // 2])
    return pe.to(dtype)
''',
            # the lecture's own code: right for every even d_emb, one column short for an odd one
            "lecture_even_d_emb_only": '''def positional_encoding(max_len, d_emb, dtype=torch.float32):
    """Sines in the even columns, cosines in the odd ones, as the lecture writes it."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    div = 10000 ** (torch.arange(0, d_emb, 2, dtype=torch.float64) / d_emb)
    pe = torch.zeros(max_len, d_emb, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos / div)
    pe[:, 1::2] = torch.cos(pos / div)
    return pe.to(dtype)
''',
        },
        "right": {
            "exp_log_interleaved": '''def positional_encoding(max_len, d_emb, dtype=torch.float32):
    """Frequencies by exp/log in float64, sin and cos interleaved by stacking."""
    pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    freqs = torch.exp(-math.log(10000.0) * torch.arange(0, d_emb, 2, dtype=torch.float64) / d_emb)
    angles = pos * freqs
    pe = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)[:, :d_emb]
    return pe.to(dtype)
''',
        },
    },
    "offset_matrix": {
        "wrong": {
            "rotation_transposed": ("M[even, even + 1] = s\n    M[even + 1, even] = -s",
                                    "M[even, even + 1] = -s\n    M[even + 1, even] = s"),
            "frequency_index_i": ("torch.arange(0, d_emb, 2, dtype=torch.float64) / d_emb",
                                  "torch.arange(0, d_emb // 2, dtype=torch.float64) / d_emb"),
            "float32_matrix": ("    return M\n", "    return M.float()\n"),
        },
        "right": {
            "block_diag_of_rotations": '''def offset_matrix(k, d_emb):
    """One 2x2 rotation per (sin, cos) pair, assembled with torch.block_diag."""
    blocks = []
    for i in range(0, d_emb, 2):
        w = 1.0 / 10000.0 ** (i / d_emb)
        c, s = math.cos(w * k), math.sin(w * k)
        blocks.append(torch.tensor([[c, s], [-s, c]], dtype=torch.float64))
    return torch.block_diag(*blocks)
''',
        },
    },
    "causal_mask": {
        "wrong": {
            "diagonal_blocked": ("diagonal=1)", "diagonal=0)"),
            "may_attend_convention": ("torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), diagonal=1)",
                                      "torch.tril(torch.ones(T, T, dtype=torch.bool, device=device))"),
            "blocks_the_past": ("torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), diagonal=1)",
                                "torch.tril(torch.ones(T, T, dtype=torch.bool, device=device), diagonal=-1)"),
        },
        "right": {
            "arange_comparison": '''def causal_mask(T, device=None):
    """Key index greater than query index: blocked."""
    idx = torch.arange(T, device=device)
    return idx[None, :] > idx[:, None]
''',
        },
    },
    "FeedForward": {
        "wrong": {
            "gelu_not_relu": ("return self.lin2(F.relu(self.lin1(x)))", "return self.lin2(F.gelu(self.lin1(x)))"),
            "relu_after_lin2_too": ("return self.lin2(F.relu(self.lin1(x)))",
                                    "return F.relu(self.lin2(F.relu(self.lin1(x))))"),
            "no_activation": ("return self.lin2(F.relu(self.lin1(x)))", "return self.lin2(self.lin1(x))"),
        },
        "right": {
            "clamp": '''class FeedForward(nn.Module):
    """Two linear maps with max(0, .) between."""

    def __init__(self, d_model, d_ff):
        """d_model -> d_ff -> d_model."""
        super().__init__()
        self.lin1 = nn.Linear(d_model, d_ff)
        self.lin2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        """Position-wise."""
        h = self.lin1(x).clamp(min=0)
        return self.lin2(h)
''',
        },
    },
    "EncoderLayer": {
        "wrong": {
            "pre_norm": '''class EncoderLayer(nn.Module):
    """Pre-norm by mistake: x + SubLayer(LayerNorm(x))."""

    def __init__(self, d_model=512, h=8, d_ff=2048):
        """Attention, feed-forward, two norms."""
        super().__init__()
        self.attn = MultiHeadAttention(d_model, h)
        self.ff = FeedForward(d_model, d_ff)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, x, mask=None):
        """Normalise before each sublayer."""
        a, A = self.attn(self.norm1(x), mask=mask)
        x = x + a
        return x + self.ff(self.norm2(x)), A
''',
            "no_residual_around_ff": ("return self.norm2(x + self.ff(x)), A", "return self.norm2(self.ff(x)), A"),
            "mask_ignored": ("a, A = self.attn(x, mask=mask)", "a, A = self.attn(x)"),
            # right values, but the feed-forward sub-layer passes no gradient back to its input
            "ff_input_detached": ("return self.norm2(x + self.ff(x)), A",
                                  "return self.norm2(x + self.ff(x.detach())), A"),
        },
        "right": {
            "explicit_kv_and_sum_order": '''class EncoderLayer(nn.Module):
    """Post-norm: LayerNorm(SubLayer(x) + x), twice."""

    def __init__(self, d_model=512, h=8, d_ff=2048):
        """Self-attention, feed-forward, a LayerNorm after each."""
        super().__init__()
        self.attn = MultiHeadAttention(d_model=d_model, h=h)
        self.ff = FeedForward(d_model, d_ff)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, x, mask=None):
        """Keys and values passed explicitly."""
        attn_out, weights = self.attn(x, x, mask)
        x = self.norm1(attn_out + x)
        x = self.norm2(self.ff(x) + x)
        return x, weights
''',
        },
    },
    "DecoderLayer": {
        "wrong": {
            "cross_attends_to_itself": ("c, A_cross = self.cross_attn(y, memory, mask=memory_mask)",
                                        "c, A_cross = self.cross_attn(y, mask=memory_mask)"),
            "memory_mask_ignored": ("c, A_cross = self.cross_attn(y, memory, mask=memory_mask)",
                                    "c, A_cross = self.cross_attn(y, memory)"),
            "pre_norm_feed_forward": ("return self.norm3(y + self.ff(y)), A_self, A_cross",
                                      "return y + self.ff(self.norm3(y)), A_self, A_cross"),
        },
        "right": {
            "keyword_arguments": '''class DecoderLayer(nn.Module):
    """Masked self-attention, attention over the memory, feed-forward; LayerNorm after each residual."""

    def __init__(self, d_model=512, h=8, d_ff=2048):
        """Three sublayers and their norms."""
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, h)
        self.cross_attn = MultiHeadAttention(d_model, h)
        self.ff = FeedForward(d_model, d_ff)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, y, memory, causal_mask=None, memory_mask=None):
        """Queries from the decoder throughout; keys and values from y, then from memory."""
        sa, A_self = self.self_attn(y, x_kv=y, mask=causal_mask)
        y = self.norm1(sa + y)
        ca, A_cross = self.cross_attn(x_q=y, x_kv=memory, mask=memory_mask)
        y = self.norm2(ca + y)
        return self.norm3(self.ff(y) + y), A_self, A_cross
''',
        },
    },
    "Transformer": {
        "wrong": {
            "no_sqrt_d_model": ("return emb(tokens) * math.sqrt(self.d_model) + self.pe_scale * self.pe[:T]",
                                "return emb(tokens) + self.pe_scale * self.pe[:T]"),
            "padding_not_masked_in_cross_attention": ("y, A_self, A_cross = layer(y, memory, mask, pad)",
                                                      "y, A_self, A_cross = layer(y, memory, mask)"),
            "use_causal_mask_ignored": ("mask = causal_mask(T, device=tgt_in.device) if self.use_causal_mask else None",
                                 "mask = causal_mask(T, device=tgt_in.device)"),
        },
        "right": {
            "dict_state": '''class Transformer(nn.Module):
    """Encoder-decoder transformer; the encoder's state travels as a dict."""

    def __init__(self, vocab, d_model=64, h=4, d_ff=128, n_enc=2, n_dec=2, max_len=64, pad_id=None):
        """Embeddings, the PE buffer, both stacks, the read-out."""
        super().__init__()
        self.d_model = d_model
        self.pad_id = pad_id
        self.src_emb = nn.Embedding(vocab, d_model)
        self.tgt_emb = nn.Embedding(vocab, d_model)
        self.register_buffer("pe", positional_encoding(max_len, d_model))
        self.encoder = nn.ModuleList(EncoderLayer(d_model, h, d_ff) for _ in range(n_enc))
        self.decoder = nn.ModuleList(DecoderLayer(d_model, h, d_ff) for _ in range(n_dec))
        self.out = nn.Linear(d_model, vocab)
        self.use_causal_mask = True
        self.pe_scale = 1.0

    def encode(self, src):
        """{'memory': (B, S, d), 'pad': (B, 1, 1, S) or None}."""
        pad = None if self.pad_id is None else (src == self.pad_id).unsqueeze(1).unsqueeze(2)
        x = self.src_emb(src) * self.d_model ** 0.5 + self.pe_scale * self.pe.narrow(0, 0, src.size(1))
        for layer in self.encoder:
            x = layer(x, pad)[0]
        return {"memory": x, "pad": pad}

    def decode(self, tgt_in, state):
        """Logits (B, T, vocab)."""
        T = tgt_in.size(1)
        mask = causal_mask(T, tgt_in.device) if self.use_causal_mask else None
        y = self.tgt_emb(tgt_in) * self.d_model ** 0.5 + self.pe_scale * self.pe.narrow(0, 0, T)
        for layer in self.decoder:
            y = layer(y, state["memory"], causal_mask=mask, memory_mask=state["pad"])[0]
        return self.out(y)

    def forward(self, src, tgt_in):
        """Teacher forcing."""
        return self.decode(tgt_in, self.encode(src))
''',
        },
    },
    "make_batch": {
        "wrong": {
            "target_not_reversed": ("reversed_digits = digits.gather(1, (L - 1 - pos).clamp(min=0))",
                                    "reversed_digits = digits"),
            "eos_left_in_tgt_in": ("    tgt_in = torch.where(pos <= L, tgt_in, pad)\n", ""),
            "global_rng_for_lengths": ("lens = torch.randint(L_min, L_max + 1, (B,), generator=gen)",
                                       "lens = torch.randint(L_min, L_max + 1, (B,))"),
            "L_max_never_drawn": ("lens = torch.randint(L_min, L_max + 1,", "lens = torch.randint(L_min, L_max,"),
        },
        "right": {
            "row_by_row": '''def make_batch(B, L_min, L_max, gen):
    """Built one row at a time."""
    lens = torch.randint(L_min, L_max + 1, (B,), generator=gen)
    T = int(lens.max()) + 1
    src = torch.full((B, T), PAD, dtype=torch.long)
    tgt = torch.full((B, T), PAD, dtype=torch.long)
    tgt_in = torch.full((B, T), PAD, dtype=torch.long)
    for b in range(B):
        L = int(lens[b])
        d = torch.randint(0, N_DIGITS, (L,), generator=gen)
        src[b, :L], src[b, L] = d, EOS
        tgt[b, :L], tgt[b, L] = d.flip(0), EOS
        tgt_in[b, 0] = BOS
        tgt_in[b, 1:L + 1] = tgt[b, :L]
    return src, tgt_in, tgt, lens
''',
        },
    },
    "greedy_decode": {
        "wrong": {
            "bos_returned": ("return ys[:, 1:]", "return ys"),
            "reads_the_first_position": ("model.decode(ys, state)[:, -1]", "model.decode(ys, state)[:, 0]"),
            "starts_from_eos": ("ys = torch.full((src.shape[0], 1), BOS,", "ys = torch.full((src.shape[0], 1), EOS,"),
        },
        "right": {
            "forward_and_list": '''def greedy_decode(model, src, n_steps):
    """Teacher-forced forward on the growing prefix; tokens collected in a list."""
    ys = src.new_full((src.size(0), 1), BOS)
    out = []
    with torch.no_grad():
        for _ in range(n_steps):
            nxt = model(src, ys)[:, -1, :].argmax(-1)
            out.append(nxt)
            ys = torch.cat([ys, nxt[:, None]], dim=1)
    return torch.stack(out, dim=1)
''',
        },
    },
    "mha_cost": {
        "wrong": {
            "no_output_projection": ("params = 3 * d_model * h * d_k + h * d_k * d_model",
                                     "params = 3 * d_model * h * d_k"),
            "scores_with_d_model": ("score_flops = h * T * T * d_k", "score_flops = h * T * T * d_model"),
            "assumes_h_d_k_is_d_model": ("params = 3 * d_model * h * d_k + h * d_k * d_model",
                                         "params = 4 * d_model * d_model"),
        },
        "right": {
            "factored": '''def mha_cost(d_model, h, d_k, T):
    """Four projections of h d_k x d_model; h score matrices of T^2 dot products of length d_k."""
    width = h * d_k
    return 4 * width * d_model, width * T ** 2
''',
        },
    },
}

# Training failures: code that passes every check of its item (values load a reference state) yet cannot learn.
# "fails" lists the experiments of the graded items that must be lost.
TRAINING = {
    "readout_on_detached_decoder": {
        "item": "Transformer", "also": ["causal_mask"], "fails": ["reverse_transformer", "no_causal_mask"],
        # only the read-out learns: embeddings, encoder and decoder keep their random initialisation
        "variant": ("        return self.out(y)\n",
                    "        return self.out(y.detach())  # no graph to keep past here\n"),
    },
}
# no_causal_mask trains the student's Transformer with use_causal_mask = False: causal_mask is not called in it,
# so no causal_mask that passes its checks can fail it; the Transformer above fails it (graded with causal_mask).
TRAINING_NOT_PLANTED = {}

# The checks that catch each planted mistake: exactly these fail, every other check of its item passes.
CATCHES = {
    "attention": {
        "mask_convention_flipped": {"values", "gradients", "properties"},
        "weights_detached": {"gradients"},
        "no_sqrt_scale": {"values", "gradients", "properties"},
        "scaled_by_d_k": {"values", "gradients", "properties"},
        "softmax_over_queries": {"values", "gradients", "properties"},
    },
    "MultiHeadAttention": {
        "no_output_projection": {"values", "gradients"},
        "split_without_transpose": {"values", "gradients"},
        "x_kv_ignored": {"shapes", "values", "gradients"},
        "keys_detached": {"gradients"},
    },
    "positional_encoding": {  # a wrong formula shows in the odd-d_emb table (properties) as well
        "exponent_i_not_2i": {"values", "properties"},
        "float32_then_cast": {"values", "properties"},
        "sin_cos_swapped": {"values", "properties"},
        "lecture_even_d_emb_only": {"properties"},
    },
    "offset_matrix": {
        "float32_matrix": {"shapes", "values", "properties"},
        "frequency_index_i": {"values"},
        "rotation_transposed": {"values"},
    },
    "causal_mask": {
        "blocks_the_past": {"values"},
        "diagonal_blocked": {"values"},
        "may_attend_convention": {"values"},
    },
    "FeedForward": {
        "gelu_not_relu": {"values"},
        "no_activation": {"values"},
        "relu_after_lin2_too": {"values"},
    },
    "EncoderLayer": {
        "mask_ignored": {"values", "gradients"},
        "no_residual_around_ff": {"values", "gradients"},
        "pre_norm": {"values", "gradients"},
        "ff_input_detached": {"gradients"},
    },
    "DecoderLayer": {
        "cross_attends_to_itself": {"shapes", "values", "properties"},
        "memory_mask_ignored": {"values", "properties"},
        "pre_norm_feed_forward": {"values"},
    },
    "Transformer": {
        "no_sqrt_d_model": {"values"},
        "padding_not_masked_in_cross_attention": {"values"},
        "use_causal_mask_ignored": {"values"},
    },
    "make_batch": {
        "L_max_never_drawn": {"shapes", "properties"},
        "eos_left_in_tgt_in": {"properties"},
        "global_rng_for_lengths": {"properties"},
        "target_not_reversed": {"properties"},
    },
    "greedy_decode": {
        "bos_returned": {"shapes", "values"},
        "reads_the_first_position": {"values"},
        "starts_from_eos": {"values"},
    },
    "mha_cost": {
        "assumes_h_d_k_is_d_model": {"values"},
        "no_output_projection": {"values"},
        "scores_with_d_model": {"values"},
    },
}
# Shape slips: a leftover dimension or a layout the caller does not expect (see add_slips).
SHAPE_SLIPS = {
    "EncoderLayer": {"weights_averaged_over_heads": (
        ("return self.norm2(x + self.ff(x)), A",
         "return self.norm2(x + self.ff(x)), A.mean(1)  # (B, T, T), as nn.MultiheadAttention returns"),
        {"shapes", "values"})},
    "FeedForward": {"tokens_flattened_and_left_so": (
        ("return self.lin2(F.relu(self.lin1(x)))",
         "x = x.reshape(-1, x.shape[-1])  # (B * T, d_model)\n        return self.lin2(F.relu(self.lin1(x)))"),
        {"shapes", "values"})},
    "Transformer": {"logits_transposed_for_cross_entropy": (
        ("return self.out(y)", "return self.out(y).transpose(1, 2)  # (B, V, T), as F.cross_entropy wants"),
        {"shapes", "values"})},
    "attention": {"weights_with_a_head_dim": (("return A @ V, A", "return A @ V, A.unsqueeze(-3)"),
                                              {"shapes", "values", "properties"})},
    "causal_mask": {"with_a_batch_dim": (("torch.ones(T, T,", "torch.ones(1, T, T,"), {"shapes", "values"})},
    "positional_encoding": {"with_a_batch_dim": (
        ("return pe.to(dtype)", "return pe.unsqueeze(0).to(dtype)  # (1, max_len, d_emb) broadcasts over the batch"),
        {"shapes", "values", "properties"})},
}
add_slips(PLANTED, CATCHES, SHAPE_SLIPS)
# Device slips: a tensor made on the CPU inside the item, which crashes once the inputs are on a GPU. Only the shapes
# check's second run, with every input on a fake GPU, catches it on a CPU grader (see add_slips).
DEVICE_SLIPS = {
    # a CPU BOS column fed to an embedding, a .cpu() round trip, a CPU weight in a linear layer: each passes on meta,
    # fails on the fake GPU
    "greedy_decode": {"bos_column_on_the_cpu": (
        ("BOS, dtype=torch.long, device=src.device)", "BOS, dtype=torch.long)"), {"shapes"}),
                      "next_token_taken_to_the_cpu": (
        ("argmax(dim=-1, keepdim=True)", "argmax(dim=-1, keepdim=True).cpu()"), {"shapes"})},
    "MultiHeadAttention": {"output_weight_on_the_cpu": (
        ("return self.WO(z), A", "return F.linear(z, self.WO.weight.cpu(), self.WO.bias), A"), {"shapes"})},
    "Transformer": {"causal_mask_on_the_cpu": (  # causal_mask(T) without its device makes the mask on the CPU
        ("mask = causal_mask(T, device=tgt_in.device)", "mask = causal_mask(T)"), {"shapes"})},
    "causal_mask": {"device_ignored": (  # the mask is made on the CPU whatever device it is asked for
        ("dtype=torch.bool, device=device)", "dtype=torch.bool)"), {"shapes"})},
}
add_slips(PLANTED, CATCHES, DEVICE_SLIPS)
# A query with no key to attend to: the -inf recipe alone gives NaN there, where the spec says zeros (see add_slips).
EDGE_SLIPS = {
    "attention": {"no_open_key_gives_nan": (
        ("        A = A.masked_fill(mask.all(dim=-1, keepdim=True), 0.0)", "        pass"), {"properties"})},
}
add_slips(PLANTED, CATCHES, EDGE_SLIPS)
attach_catches(PLANTED, CATCHES)

# Checks that no planted mistake above fails on its own, and why; the meta-test wants this list to shrink.
NOT_ISOLATED = {
    ("attention", "shapes"): SHAPES_TODO,
    ("attention", "values"): OVERLAP_TODO,
    ("MultiHeadAttention", "values"): OVERLAP_TODO,
    ("positional_encoding", "shapes"): SHAPES_TODO,
    ("positional_encoding", "values"): "a wrong formula is wrong for odd widths too, so the odd-d_emb properties "
                                       "check fails with it; only an odd-only slip would leave values alone",
    ("offset_matrix", "shapes"): SHAPES_TODO,
    ("offset_matrix", "properties"): OVERLAP_TODO,
    ("FeedForward", "shapes"): SHAPES_TODO,
    ("EncoderLayer", "shapes"): SHAPES_TODO,
    ("EncoderLayer", "values"): OVERLAP_TODO,
    ("DecoderLayer", "shapes"): SHAPES_TODO,
    ("DecoderLayer", "properties"): OVERLAP_TODO,
    ("make_batch", "shapes"): SHAPES_TODO,
}
