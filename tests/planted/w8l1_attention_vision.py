"""Planted mistakes and correct alternatives for w8l1_attention_vision.

A tuple (old, new) edits the reference cell (one realistic slip); a string is a whole cell written differently.
"""
from tests.planted import OVERLAP_TODO, SHAPES_TODO, add_slips, attach_catches

PLANTED = {
    "mse_loss": {
        "wrong": {
            "sum_not_mean": ("return ((x_hat - x) ** 2).mean()", "return ((x_hat - x) ** 2).sum()"),
            "sum_over_pixels_mean_over_rows": ("return ((x_hat - x) ** 2).mean()",
                                               "return ((x_hat - x) ** 2).sum(-1).mean()"),
            "mean_absolute_error": ("return ((x_hat - x) ** 2).mean()", "return (x_hat - x).abs().mean()"),
            "through_a_python_float": ("return ((x_hat - x) ** 2).mean()",
                                       "return torch.tensor(((x_hat - x) ** 2).mean().item())"),
            # the right number, cut off from the graph: only the gradients check can see it
            "detached": ("return ((x_hat - x) ** 2).mean()", "return ((x_hat - x) ** 2).mean().detach()"),
        },
        "right": {
            "dot_product": '''def mse_loss(x_hat, x):
    """Mean of the squared differences over every element."""
    diff = (x_hat - x).reshape(-1)
    return diff @ diff / diff.numel()
''',
        },
    },
    "AutoEncoder": {
        "wrong": {
            "no_sigmoid": (", nn.Linear(hidden, 784), nn.Sigmoid())", ", nn.Linear(hidden, 784))"),
            "relu_on_the_code": ("nn.ReLU(), nn.Linear(hidden, k))", "nn.ReLU(), nn.Linear(hidden, k), nn.ReLU())"),
            "no_relu_in_decoder": ("nn.Sequential(nn.Linear(k, hidden), nn.ReLU(), nn.Linear(hidden, 784)",
                                   "nn.Sequential(nn.Linear(k, hidden), nn.Linear(hidden, 784)"),
            "hidden_width_ignored": ("def __init__(self, k, hidden=256):\n",
                                     "def __init__(self, k, hidden=256):\n        hidden = 256\n"),
        },
        "right": {
            "named_layers_sigmoid_in_forward": '''class AutoEncoder(nn.Module):
    """784 -> hidden -> k -> hidden -> 784, ReLU between layers, Sigmoid on the output pixels."""

    def __init__(self, k, hidden=256):
        """Named layers; the Sigmoid is applied in forward."""
        super().__init__()
        from collections import OrderedDict
        self.encoder = nn.Sequential(OrderedDict(fc1=nn.Linear(784, hidden), act1=nn.ReLU(),
                                                 code=nn.Linear(hidden, k)))
        self.decoder = nn.Sequential(OrderedDict(fc2=nn.Linear(k, hidden), act2=nn.ReLU(),
                                                 out=nn.Linear(hidden, 784)))

    def forward(self, x):
        """Pixels in (0, 1)."""
        z = self.encoder(x)
        return torch.sigmoid(self.decoder(z))
''',
        },
    },
    "corrupt": {
        "wrong": {
            "variance_not_std": ("return x + sigma * eps", "return x + sigma ** 2 * eps"),
            "uniform_noise": ("eps = torch.randn(x.shape,", "eps = torch.rand(x.shape,"),
            "clipped_to_pixel_range": ("return x + sigma * eps", "return (x + sigma * eps).clamp(0, 1)"),
            "generator_ignored": ("eps = torch.randn(x.shape, generator=generator, dtype=x.dtype, "
                                  "device=gen_device).to(x.device)",
                                  "eps = torch.randn_like(x)"),
            "one_draw_per_image": ("eps = torch.randn(x.shape,", "eps = torch.randn(x.shape[:-1] + (1,),"),
        },
        "right": {
            "cpu_draw_then_move": '''def corrupt(x, sigma, generator=None):
    """x + sigma * eps with eps ~ N(0, I)."""
    noise = torch.randn(x.shape, generator=generator, dtype=x.dtype)
    return x + sigma * noise.to(x.device)
''',
        },
    },
    "pca": {
        "wrong": {
            "no_sqrt_m": ("torch.linalg.svd(X / math.sqrt(m), full_matrices=False)",
                          "torch.linalg.svd(X, full_matrices=False)"),
            "rows_of_Vh_not_columns": ("V_k = Vh[:k].mT", "V_k = Vh[:k]"),
            "err_not_squared": ("err = (S[k:] ** 2).sum()", "err = S[k:].sum()"),
            "left_singular_vectors": '''def pca(X, k):
    """Top-k directions by SVD."""
    m = X.shape[0]
    U, S, Vh = torch.linalg.svd(X / math.sqrt(m), full_matrices=False)
    return U[:, :k], (S[k:] ** 2).sum()
''',
            "eigh_ascending_order": '''def pca(X, k):
    """Covariance eigenvectors: eigh sorts ascending, so the top k are the last k columns."""
    C = X.mT @ X / X.shape[0]
    evals, evecs = torch.linalg.eigh(C)
    return evecs[:, -k:], evals[:-k].clamp(min=0).sum()
''',
            "sample_covariance": '''def pca(X, k):
    """SVD of X / sqrt(m - 1), the unbiased covariance."""
    _, S, Vh = torch.linalg.svd(X / math.sqrt(X.shape[0] - 1), full_matrices=False)
    return Vh[:k].mT, (S[k:] ** 2).sum()
''',
        },
        "right": {
            "covariance_eigh_flipped": '''def pca(X, k):
    """Eigen-decomposition of the covariance X^T X / m, largest eigenvalues first."""
    m = X.shape[0]
    evals, evecs = torch.linalg.eigh(X.mT @ X / m)
    evals, evecs = evals.flip(0), evecs.flip(-1)
    return evecs[:, :k], evals[k:].clamp(min=0).sum()
''',
        },
    },
    "projector": {
        "wrong": {
            "assumes_orthonormal_columns": ("return W @ torch.linalg.solve(W.mT @ W, W.mT)", "return W @ W.mT"),
            "unit_columns_only": ("return W @ torch.linalg.solve(W.mT @ W, W.mT)",
                                  "Wn = W / W.norm(dim=-2, keepdim=True)\n    return Wn @ Wn.mT"),
            "T_not_mT": ("return W @ torch.linalg.solve(W.mT @ W, W.mT)",
                         "return W @ torch.linalg.inv(W.T @ W) @ W.T"),
        },
        "right": {
            "pseudo_inverse": '''def projector(W):
    """P = W W^+, the pseudo-inverse form of W (W^T W)^-1 W^T."""
    return W @ torch.linalg.pinv(W)
''',
        },
    },
    "principal_angle_cosines": {
        "wrong": {
            "no_orthonormalisation": ("return torch.linalg.svdvals(Q_w.mT @ Q_v).clamp(max=1.0)",
                                      "return torch.linalg.svdvals(W.mT @ V).clamp(max=1.0)"),
            "ascending": ("return torch.linalg.svdvals(Q_w.mT @ Q_v).clamp(max=1.0)",
                          "return torch.linalg.svdvals(Q_w.mT @ Q_v).clamp(max=1.0).flip(-1)"),
            "angles_not_cosines": ("return torch.linalg.svdvals(Q_w.mT @ Q_v).clamp(max=1.0)",
                                   "return torch.arccos(torch.linalg.svdvals(Q_w.mT @ Q_v).clamp(max=1.0))"),
        },
        "right": {
            "svd_bases": '''def principal_angle_cosines(W, V):
    """Orthonormal bases from the SVD, then the singular values of their cross product."""
    U_w = torch.linalg.svd(W, full_matrices=False).U
    U_v = torch.linalg.svd(V, full_matrices=False).U
    c = torch.linalg.svd(U_w.mT @ U_v).S
    return torch.minimum(c, torch.ones_like(c))
''',
        },
    },
    "LinearAE": {
        "wrong": {
            "with_biases": ("nn.Linear(n_in, k, bias=False)", "nn.Linear(n_in, k)"),
            "tied_decoder": ("return self.Wd(self.We(x))", "return self.We(x) @ self.We.weight"),
            "relu_on_the_code": ("return self.Wd(self.We(x))", "return self.Wd(torch.relu(self.We(x)))"),
        },
        "right": {
            "explicit_matmuls": '''class LinearAE(nn.Module):
    """x_hat = x W_e^T W_d^T, no biases."""

    def __init__(self, k, n_in=784):
        """Two bias-free linear maps."""
        super().__init__()
        self.We = nn.Linear(n_in, k, bias=False)
        self.Wd = nn.Linear(k, n_in, bias=False)

    def forward(self, x):
        """Encode then decode, written as matrix products."""
        return x @ self.We.weight.mT @ self.Wd.weight.mT
''',
        },
    },
    "train_linear_ae": {
        "wrong": {
            "default_input_width": ("net = LinearAE(k, X.shape[1])", "net = LinearAE(k)"),
            "seed_ignored": ("    torch.manual_seed(seed)\n", ""),
            "no_optimiser_step": ("        opt.step()\n", ""),
            "dtype_not_followed": (".to(device=X.device, dtype=X.dtype)", ".to(X.device)"),
            "returns_the_losses_too": '''def train_linear_ae(X, k, steps, lr, batch=None, seed=0):
    """Adam on the mean per-row squared error; returns the model and its loss curve."""
    torch.manual_seed(seed)
    net = LinearAE(k, X.shape[1]).to(X)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = ((net(X) - X) ** 2).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return net, losses
''',
        },
        "right": {
            "randint_on_device": '''def train_linear_ae(X, k, steps, lr, batch=None, seed=0):
    """Adam on ||x - x_hat||^2 averaged over rows; minibatches drawn on X's device."""
    torch.manual_seed(seed)
    net = LinearAE(k, n_in=X.shape[1]).to(X)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    for step in range(steps):
        if batch is None:
            xb = X
        else:
            xb = X[torch.randint(0, X.shape[0], (batch,), device=X.device)]
        loss = (net(xb) - xb).pow(2).sum(dim=1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net
''',
        },
    },
    "GRUEncoder": {
        "wrong": {
            "lengths_ignored": ("if lengths is None:", "if True:"),
            "h_n_reshaped_without_transpose": ("h_T = torch.cat([h_n[0], h_n[1]], dim=-1)",
                                               "h_T = h_n.reshape(x.shape[0], -1)"),
            "last_column_of_H": ("h_T = torch.cat([h_n[0], h_n[1]], dim=-1)", "h_T = H[:, -1]"),
            "hidden_d_each_way": ("nn.GRU(d, d // 2,", "nn.GRU(d, d,"),
        },
        "right": {
            "h_T_gathered_from_H": '''class GRUEncoder(nn.Module):
    """Bidirectional GRU encoder."""

    def __init__(self, n_tokens, d):
        """Embedding, then a GRU with d // 2 units each way."""
        super().__init__()
        self.emb = nn.Embedding(n_tokens, d)
        self.rnn = nn.GRU(d, d // 2, batch_first=True, bidirectional=True)
        self.half = d // 2

    def forward(self, x, lengths=None):
        """Always packed; h_T read out of H: forward half at the last real token, backward half at token 0."""
        B, T = x.shape
        if lengths is None:
            lengths = torch.full((B,), T, dtype=torch.long)
        lengths = torch.as_tensor(lengths).cpu().long()
        packed = nn.utils.rnn.pack_padded_sequence(self.emb(x), lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        H, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=T)
        rows = torch.arange(B, device=x.device)
        last = (lengths - 1).to(x.device)
        h_T = torch.cat([H[rows, last, :self.half], H[:, 0, self.half:]], dim=-1)
        return H, h_T
''',
        },
    },
    "score_dot": {
        "wrong": {
            "squeeze_everything": '''def score_dot(s, H):
    """s^T h_t for every t."""
    return torch.bmm(H, s.unsqueeze(-1)).squeeze()
''',
            "summed_over_positions": '''def score_dot(s, H):
    """s^T h_t for every t."""
    return (s.unsqueeze(-2) * H).sum(-2)
''',
            "matmul_broadcasts_the_batch": '''def score_dot(s, H):
    """s^T h_t for every t."""
    return s @ H.mT
''',
        },
        "right": {
            "broadcast_product": '''def score_dot(s, H):
    """s^T h_t for every t."""
    return (H * s.unsqueeze(-2)).sum(-1)
''',
        },
    },
    "score_scaled": {
        "wrong": {
            "divided_by_d": ("/ math.sqrt(H.shape[-1])", "/ H.shape[-1]"),
            "sqrt_of_T": ("/ math.sqrt(H.shape[-1])", "/ math.sqrt(H.shape[-2])"),
        },
        "right": {
            "bmm": '''def score_scaled(s, H):
    """s^T h_t / sqrt(d)."""
    return torch.bmm(H, s.unsqueeze(-1)).squeeze(-1) * s.shape[-1] ** -0.5
''',
        },
    },
    "score_general": {
        "wrong": {
            "W_a_transposed": ('"...d,de,...te->...t"', '"...d,ed,...te->...t"'),
            "W_a_forgotten": ('torch.einsum("...d,de,...te->...t", s, W_a, H)',
                              'torch.einsum("...d,...td->...t", s, H)'),
        },
        "right": {
            "project_s_first": '''def score_general(s, H, W_a):
    """s^T W_a h_t: project s once, then dot with every h_t."""
    return (H @ (s @ W_a).unsqueeze(-1)).squeeze(-1)
''',
        },
    },
    "score_cosine": {
        "wrong": {
            "only_H_normalised": ("return dots / (s_norm * H_norm)", "return dots / H_norm"),
            "no_zero_guard": ('''def score_cosine(s, H):
    """Cosine of the angle between s and each h_t."""
    dots = torch.einsum("...d,...td->...t", s, H)
    return dots / (s.norm(dim=-1, keepdim=True) * H.norm(dim=-1))
'''),
            "normalised_over_positions": ("H_norm = H.norm(dim=-1).clamp(min=1e-8)",
                                          "H_norm = H.norm(dim=(-2, -1)).unsqueeze(-1).clamp(min=1e-8)"),
        },
        "right": {
            "normalize_then_dot": '''def score_cosine(s, H):
    """Dot product of the L2-normalised vectors."""
    return torch.einsum("...d,...td->...t", F.normalize(s, dim=-1), F.normalize(H, dim=-1))
''',
        },
    },
    "score_additive": {
        "wrong": {
            "halves_of_W_a_swapped": ("W_s, W_h = W_a[:, :d_s], W_a[:, d_s:]", "W_h, W_s = W_a[:, :d_s], W_a[:, d_s:]"),
            "no_tanh": ("return torch.tanh(pre) @ v_a", "return pre @ v_a"),
            "relu_not_tanh": ("return torch.tanh(pre) @ v_a", "return torch.relu(pre) @ v_a"),
        },
        "right": {
            "explicit_concatenation": '''def score_additive(s, H, W_a, v_a):
    """v_a^T tanh(W_a [s; h_t]) with the pair built explicitly."""
    pair = torch.cat([s.unsqueeze(-2).expand(*H.shape[:-1], s.shape[-1]), H], dim=-1)
    return torch.tanh(pair @ W_a.mT) @ v_a
''',
        },
    },
    "alpha_location": {
        "wrong": {
            "no_softmax": ('return torch.softmax(torch.einsum("td,...d->...t", W_loc, s), dim=-1)',
                           'return torch.einsum("td,...d->...t", W_loc, s)'),
            "softmax_over_the_batch": ('torch.einsum("td,...d->...t", W_loc, s), dim=-1)',
                                       'torch.einsum("td,...d->...t", W_loc, s), dim=0)'),
            "naive_exponential": '''def alpha_location(s, W_loc):
    """softmax(W_loc s), written out."""
    e = torch.exp(s @ W_loc.mT)
    return e / e.sum(-1, keepdim=True)
''',
        },
        "right": {
            "functional_softmax": '''def alpha_location(s, W_loc):
    """softmax(W_loc s) over the T positions."""
    return F.softmax(s @ W_loc.mT, dim=-1)
''',
        },
    },
    "attention_context": {
        "wrong": {
            "mask_flipped": ("scores = scores.masked_fill(~mask,", "scores = scores.masked_fill(mask,"),
            "zeroed_but_not_renormalised": ("scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)",
                                            "pass"),
            "softmax_over_the_batch": ("alpha = torch.softmax(scores, dim=-1)", "alpha = torch.softmax(scores, dim=0)"),
            "scores_detached": ("alpha = torch.softmax(scores, dim=-1)",
                                "alpha = torch.softmax(scores.detach(), dim=-1)"),
            "naive_exponential": '''def attention_context(scores, H, mask=None):
    """exp / sum over the real positions."""
    e = torch.exp(scores)
    if mask is not None:
        e = e * mask
    alpha = e / e.sum(-1, keepdim=True)
    return (alpha.unsqueeze(-1) * H).sum(-2), alpha
''',
        },
        "right": {
            "minus_infinity": '''def attention_context(scores, H, mask=None):
    """Padded scores set to -inf, softmax, weighted sum."""
    if mask is not None:
        scores = scores.masked_fill(~mask.bool(), float("-inf"))
    alpha = scores.softmax(-1).nan_to_num(0.0)  # a row with no real token: 0/0 -> zeros
    c = (alpha.unsqueeze(-1) * H).sum(-2)
    return c, alpha
''',
        },
    },
    "unroll_annotations": {
        "wrong": {
            "reshape_without_permute": ("return volume.flatten(-2).transpose(-1, -2)",
                                        "return volume.reshape(volume.shape[0], -1, volume.shape[1])"),
            "column_major": ("return volume.flatten(-2).transpose(-1, -2)",
                             "return volume.transpose(-1, -2).flatten(-2).transpose(-1, -2)"),
            "channels_not_last": ("return volume.flatten(-2).transpose(-1, -2)", "return volume.flatten(-2)"),
        },
        "right": {
            "permute_reshape": '''def unroll_annotations(volume):
    """(N, C, H, W) -> (N, H*W, C): channels last, then the grid flattened row by row."""
    N, C, Hh, W = volume.shape
    return volume.permute(0, 2, 3, 1).reshape(N, Hh * W, C)
''',
        },
    },
    "spatial_attention": {
        "wrong": {
            "W_a_transposed": ("score_general(s, A, W_a)", "score_general(s, A, W_a.mT)"),
            "scaled_by_sqrt_d": ("score_general(s, A, W_a), A)",
                                 "score_general(s, A, W_a) / math.sqrt(A.shape[-1]), A)"),
            "averaged_annotations": '''def spatial_attention(s, A, W_a):
    """Weights from the scores, but the context is the plain average."""
    alpha = torch.softmax(torch.einsum("bd,de,ble->bl", s, W_a, A), dim=-1)
    return A.mean(1), alpha
''',
        },
        "right": {
            "einsum_from_scratch": '''def spatial_attention(s, A, W_a):
    """softmax_l(s^T W_a a_l), then the weighted sum of the annotations."""
    e = torch.einsum("bd,de,ble->bl", s, W_a, A)
    alpha = torch.softmax(e, dim=-1)
    return torch.einsum("bl,bld->bd", alpha, A), alpha
''',
        },
    },
    "hard_attention": {
        "wrong": {
            "integer_one_hot": ("return F.one_hot(alpha.argmax(dim=-1), alpha.shape[-1]).to(alpha.dtype)",
                                "return F.one_hot(alpha.argmax(dim=-1), alpha.shape[-1])"),
            "global_max": ("return F.one_hot(alpha.argmax(dim=-1), alpha.shape[-1]).to(alpha.dtype)",
                           "return (alpha == alpha.max()).to(alpha.dtype)"),
            "argmax_over_the_batch": ("alpha.argmax(dim=-1)", "alpha.argmax(dim=0)"),
        },
        "right": {
            "scatter": '''def hard_attention(alpha):
    """All the weight on the argmax."""
    return torch.zeros_like(alpha).scatter_(-1, alpha.argmax(-1, keepdim=True), 1.0)
''',
        },
    },
    "local_attention": {
        "wrong": {
            "strict_window": ("keep = (pos - centre.unsqueeze(-1)).abs() <= D",
                              "keep = (pos - centre.unsqueeze(-1)).abs() < D"),
            "not_renormalised": ("return kept / kept.sum(-1, keepdim=True).clamp(min=torch.finfo(alpha.dtype).tiny)",
                                 "return kept"),
            "first_centre_for_every_row": ("keep = (pos - centre.unsqueeze(-1)).abs() <= D",
                                           "keep = (pos - centre.reshape(-1)[0]).abs() <= D"),
            "half_open_window": ("keep = (pos - centre.unsqueeze(-1)).abs() <= D",
                                 "keep = (pos >= centre.unsqueeze(-1) - D) & (pos < centre.unsqueeze(-1) + D)"),
        },
        "right": {
            "bounds_and_where": '''def local_attention(alpha, centre, D):
    """Zero everything outside [centre - D, centre + D], renormalise."""
    pos = torch.arange(alpha.shape[-1], device=alpha.device)
    c = torch.as_tensor(centre, device=alpha.device).unsqueeze(-1)
    keep = (pos >= c - D) & (pos <= c + D)
    kept = torch.where(keep, alpha, torch.zeros_like(alpha))
    return kept / kept.sum(-1, keepdim=True)
''',
        },
    },
    "self_attention": {
        "wrong": {
            "no_sqrt_d": ("/ math.sqrt(H.shape[-1])", ""),
            "T_not_mT": ("H @ H.mT", "H @ H.T"),
            "softmax_over_queries": ("dim=-1)         # (..., T, T)", "dim=-2)         # (..., T, T)"),
        },
        "right": {
            "einsum": '''def self_attention(H):
    """Z = softmax(H H^T / sqrt(d)) H."""
    A = torch.einsum("...id,...jd->...ij", H, H).div(H.shape[-1] ** 0.5).softmax(-1)
    return torch.einsum("...ij,...jd->...id", A, H), A
''',
        },
    },
}

# Training failures: code that passes every check of its item (the checks load a reference state into a model,
# or call a function on fixed inputs) yet cannot learn in the experiment, so it must lose the experiment's points.
# "fails" lists the experiments of the graded items that must be lost.
TRAINING = {
    "ae_zero_init": {
        "item": "AutoEncoder", "fails": ["ae_mnist"],
        # zero weights: every hidden unit is 0, so only the last bias gets a gradient (it learns the mean image)
        "variant": ("nn.Linear(hidden, 784), nn.Sigmoid())\n",
                    "nn.Linear(hidden, 784), nn.Sigmoid())\n"
                    "        for m in self.modules():  # start from zeros: the same every run\n"
                    "            if isinstance(m, nn.Linear):\n"
                    "                nn.init.zeros_(m.weight)\n"
                    "                nn.init.zeros_(m.bias)\n"),
    },
    "linear_ae_in_mini_batches": {
        "item": "train_linear_ae", "fails": ["linear_ae_pca"],
        # mini-batches when the spec says full batch: near enough on the check's small problem, but the noise
        # keeps it off PCA's subspace on MNIST
        "variant": ("    gen = torch.Generator().manual_seed(seed)\n",
                    "    gen = torch.Generator().manual_seed(seed)\n"
                    "    batch = batch or 64  # mini-batches by default\n"),
    },
    "spatial_attention_without_graph": {
        "item": "spatial_attention", "fails": ["red_square"],
        # no gradient reaches W_a, the CNN or the question's embedding: only the head learns
        "variant": '''def spatial_attention(s, A, W_a):
    """alpha_l = softmax_l(s^T W_a a_l) over annotations A (B, L, d); ctx = sum_l alpha_l a_l."""
    with torch.no_grad():  # a weighted look-up, nothing to learn here
        return attention_context(score_general(s, A, W_a), A)
''',
    },
}
# corrupt and attention_context are pure functions whose checks cover their whole contract, so no honest slip
# passes them and still trains differently: these two are traps that only the experiment's training batches spring
# (their checks never use 128 images or 64 sequences), planted to prove the two experiments are judged at all.
TRAINING["corrupt_skipped_on_training_batches"] = {
    "item": "corrupt", "fails": ["dae_mnist"],
    # no noise on the DAE's batches of 128: the DAE trains exactly as the plain AE does and cannot beat it
    "variant": ("    if sigma == 0:\n", "    if sigma == 0 or x.shape[0] == 128:\n"),
}
TRAINING["uniform_weights_on_training_batches"] = {
    "item": "attention_context", "fails": ["seq2seq_attention"],
    # every real position weighs the same on the batches of 64 the decoder learns from: it never learns to attend
    "variant": ("    if mask is not None:\n        # the dtype's most negative",
                "    if scores.shape[0] == 64:\n        scores = torch.zeros_like(scores)\n"
                "    if mask is not None:\n        # the dtype's most negative"),
}
TRAINING_NOT_PLANTED = {}

# The checks that catch each planted mistake: exactly these fail, every other check of its item passes.
CATCHES = {
    "mse_loss": {
        "mean_absolute_error": {"values", "gradients"},
        "sum_not_mean": {"values", "gradients"},
        "sum_over_pixels_mean_over_rows": {"values", "gradients"},
        "through_a_python_float": {"shapes", "gradients"},
        "detached": {"gradients"},
    },
    "AutoEncoder": {
        "hidden_width_ignored": {"shapes", "values"},
        "no_relu_in_decoder": {"values"},
        "no_sigmoid": {"values"},
        "relu_on_the_code": {"values"},
    },
    "corrupt": {
        "clipped_to_pixel_range": {"values", "properties"},
        "generator_ignored": {"properties"},
        "one_draw_per_image": {"values"},
        "uniform_noise": {"values"},
        "variance_not_std": {"values"},
    },
    "pca": {
        "eigh_ascending_order": {"values"},
        "err_not_squared": {"values"},
        "left_singular_vectors": {"shapes", "values"},
        "no_sqrt_m": {"values"},
        "rows_of_Vh_not_columns": {"shapes", "values"},
        "sample_covariance": {"values"},
    },
    "projector": {
        "T_not_mT": {"shapes", "values", "properties"},
        "assumes_orthonormal_columns": {"values", "properties"},
        "unit_columns_only": {"values", "properties"},
    },
    "principal_angle_cosines": {
        "angles_not_cosines": {"values"},
        "ascending": {"values"},
        "no_orthonormalisation": {"values"},
    },
    "LinearAE": {
        "relu_on_the_code": {"values"},
        "tied_decoder": {"values"},
        "with_biases": {"shapes", "values"},
    },
    "train_linear_ae": {
        "default_input_width": {"shapes"},
        "dtype_not_followed": {"shapes"},
        "no_optimiser_step": {"shapes"},
        "returns_the_losses_too": {"shapes"},
        "seed_ignored": {"shapes"},
    },
    "GRUEncoder": {
        "h_n_reshaped_without_transpose": {"values"},
        "hidden_d_each_way": {"shapes", "values"},
        "last_column_of_H": {"values"},
        "lengths_ignored": {"values"},
    },
    "score_dot": {
        "matmul_broadcasts_the_batch": {"shapes", "values"},
        "squeeze_everything": {"shapes", "values"},
        "summed_over_positions": {"shapes", "values"},
    },
    "score_scaled": {
        "divided_by_d": {"values"},
        "sqrt_of_T": {"values"},
    },
    "score_general": {
        "W_a_forgotten": {"values"},
        "W_a_transposed": {"values"},
    },
    "score_cosine": {
        "no_zero_guard": {"values"},
        "normalised_over_positions": {"values"},
        "only_H_normalised": {"values"},
    },
    "score_additive": {
        "halves_of_W_a_swapped": {"values"},
        "no_tanh": {"values"},
        "relu_not_tanh": {"values"},
    },
    "alpha_location": {
        "naive_exponential": {"properties"},
        "no_softmax": {"values", "properties"},
        "softmax_over_the_batch": {"values", "properties"},
    },
    "attention_context": {
        "mask_flipped": {"values", "gradients", "properties"},
        "naive_exponential": {"values", "properties"},
        "scores_detached": {"gradients"},
        "softmax_over_the_batch": {"values", "gradients", "properties"},
        "zeroed_but_not_renormalised": {"values", "gradients", "properties"},
    },
    "unroll_annotations": {
        "channels_not_last": {"shapes", "values"},
        "column_major": {"values"},
        "reshape_without_permute": {"values"},
    },
    "spatial_attention": {
        "W_a_transposed": {"values"},
        "averaged_annotations": {"values"},
        "scaled_by_sqrt_d": {"values"},
    },
    "hard_attention": {
        "argmax_over_the_batch": {"shapes", "values"},
        "global_max": {"values"},
        "integer_one_hot": {"shapes", "values"},
    },
    "local_attention": {
        "first_centre_for_every_row": {"values", "properties"},
        "half_open_window": {"values", "properties"},
        "not_renormalised": {"values", "properties"},
        "strict_window": {"values", "properties"},
    },
    "self_attention": {
        "T_not_mT": {"shapes", "values"},
        "no_sqrt_d": {"values"},
        "softmax_over_queries": {"values"},
    },
}
# Shape slips: a leftover dimension, a dtype or a layout the caller does not expect (see add_slips).
SHAPE_SLIPS = {
    "alpha_location": {"kept_a_dim_for_bmm": (
        ('W_loc, s), dim=-1)', 'W_loc, s), dim=-1).unsqueeze(-2)  # (B, 1, T) for bmm'),
        {"shapes", "values", "properties"})},
    "attention_context": {"context_kept_as_a_row": (
        ("return c, alpha", "return c.unsqueeze(-2), alpha  # (B, 1, d), as bmm gives it"),
        {"shapes", "values", "gradients", "properties"})},
    "corrupt": {"noise_in_float64": (("dtype=x.dtype, device=gen_device)", "dtype=torch.float64, device=gen_device)"),
                                     {"shapes", "values", "properties"})},
    "local_attention": {"weights_made_float32": (("kept = alpha * keep", "kept = alpha.float() * keep"),
                                                 {"shapes", "properties"})},
    "principal_angle_cosines": {"cosines_as_a_diagonal_matrix": (
        ("return torch.linalg.svdvals(Q_w.mT @ Q_v).clamp(max=1.0)",
         "return torch.diag_embed(torch.linalg.svdvals(Q_w.mT @ Q_v).clamp(max=1.0))"), {"shapes", "values"})},
    "score_additive": {"v_a_as_a_column": (
        ("return torch.tanh(pre) @ v_a", "return torch.tanh(pre) @ v_a.unsqueeze(-1)"), {"shapes", "values"})},
    "score_cosine": {"norms_keep_their_dim": (
        ("H_norm = H.norm(dim=-1).clamp", "H_norm = H.norm(dim=-1, keepdim=True).clamp"), {"shapes", "values"})},
    "score_general": {"bmm_result_not_squeezed": (
        ('return torch.einsum("...d,de,...te->...t", s, W_a, H)',
         'return torch.einsum("...d,de,...te->...t", s, W_a, H).unsqueeze(-1)  # (B, T, 1), as bmm gives it'),
        {"shapes", "values"})},
    "score_scaled": {"bmm_result_not_squeezed": (
        ('return torch.einsum("...d,...td->...t", s, H) / math.sqrt(H.shape[-1])',
         'return (torch.einsum("...d,...td->...t", s, H) / math.sqrt(H.shape[-1])).unsqueeze(-1)  # (B, T, 1)'),
        {"shapes", "values"})},
    "spatial_attention": {"context_kept_as_a_row": (
        ("return attention_context(score_general(s, A, W_a), A)",
         "c, alpha = attention_context(score_general(s, A, W_a), A)\n    return c.unsqueeze(1), alpha  # (B, 1, d)"),
        {"shapes", "values"})},
}
add_slips(PLANTED, CATCHES, SHAPE_SLIPS)
# Device slips: a tensor made on the CPU inside the item, which crashes once the inputs are on a GPU. Only the shapes
# check's second run, with every input on a fake GPU, catches it on a CPU grader (see add_slips).
DEVICE_SLIPS = {
    # a .cpu() round trip, a CPU tensor in a matrix product, a CPU index: each passes on meta, fails on the fake GPU
    "score_cosine": {"norms_taken_to_the_cpu": (
        ("H_norm = H.norm(dim=-1).clamp(min=1e-8)", "H_norm = H.norm(dim=-1).cpu().clamp(min=1e-8)"), {"shapes"})},
    "score_additive": {"v_a_on_the_cpu": (
        ("return torch.tanh(pre) @ v_a", "return torch.tanh(pre) @ v_a.cpu()"), {"shapes"})},
    "unroll_annotations": {"index_made_on_the_cpu": (
        ("return volume.flatten(-2).transpose(-1, -2)",
         "return volume.flatten(-2).index_select(-1, torch.arange(volume.shape[-2] * volume.shape[-1]))"
         ".transpose(-1, -2)"), {"shapes"})},
    "local_attention": {"positions_on_the_cpu": (  # torch.arange(T) without a device is on the CPU
        ("pos = torch.arange(T, device=alpha.device)", "pos = torch.arange(T)"), {"shapes"})},
}
add_slips(PLANTED, CATCHES, DEVICE_SLIPS)
# A query with no key to attend to: the -inf recipe alone gives NaN there, where the spec says zeros (see add_slips).
EDGE_SLIPS = {
    "attention_context": {"no_real_token_gives_uniform_weights": (
        ("        alpha = alpha.masked_fill(~mask, 0.0)", "        pass"), {"properties"})},
}
add_slips(PLANTED, CATCHES, EDGE_SLIPS)
attach_catches(PLANTED, CATCHES)

# Checks that no planted mistake above fails on its own, and why; the meta-test wants this list to shrink.
NOT_ISOLATED = {
    ("mse_loss", "shapes"): SHAPES_TODO,
    ("mse_loss", "values"): "a loss with wrong values has wrong gradients too, unless it is off by a constant, "
                            "which no student writes",
    ("AutoEncoder", "shapes"): SHAPES_TODO,
    ("corrupt", "shapes"): SHAPES_TODO,
    ("pca", "shapes"): SHAPES_TODO,
    ("projector", "shapes"): SHAPES_TODO,
    ("projector", "values"): OVERLAP_TODO,
    ("projector", "properties"): OVERLAP_TODO,
    ("principal_angle_cosines", "shapes"): SHAPES_TODO,
    ("LinearAE", "shapes"): SHAPES_TODO,
    ("GRUEncoder", "shapes"): SHAPES_TODO,
    ("score_dot", "shapes"): SHAPES_TODO,
    ("score_dot", "values"): OVERLAP_TODO,
    ("score_scaled", "shapes"): SHAPES_TODO,
    ("score_general", "shapes"): SHAPES_TODO,
    ("alpha_location", "shapes"): SHAPES_TODO,
    ("alpha_location", "values"): OVERLAP_TODO,
    ("attention_context", "shapes"): SHAPES_TODO,
    ("attention_context", "values"): OVERLAP_TODO,
    ("spatial_attention", "shapes"): SHAPES_TODO,
    ("hard_attention", "shapes"): SHAPES_TODO,
    ("local_attention", "values"): OVERLAP_TODO,
    ("local_attention", "properties"): OVERLAP_TODO,
    ("self_attention", "shapes"): SHAPES_TODO,
}
