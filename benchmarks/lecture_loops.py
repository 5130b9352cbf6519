"""The lecture notebooks' own training runs, as the yardstick the grader's training is measured against.

Each loop follows its lecture's recipe (model size, optimiser, learning rate, batch, steps) with the reference
solution's parts, and does nothing the notebook does not: no early stop, no validation, no evaluation.
They are written here, not taken from the harness, so that a faster harness cannot make its yardstick faster too.
On a GPU the batches are drawn on the CPU and moved over, as the notebooks do.
"""
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from autograder.grading.experiments import harness, reference_parts


def reverse_transformer(device="cpu", steps=1000):
    """Week 8, Lecture 4: d_model 64, 4 heads, d_ff 128, 2 + 2 layers; Adam 3e-3, 300-step warmup, batch 128,
    lengths 3-10."""
    ref = reference_parts("w8l4_transformers")
    torch.manual_seed(0)
    model = ref.Transformer(13, d_model=64, h=4, d_ff=128, n_enc=2, n_dec=2, pad_id=ref.PAD).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for step in range(steps):
        opt.param_groups[0]["lr"] = 3e-3 * min(1.0, (step + 1) / 300)
        src, tgt_in, tgt = (t.to(device) for t in ref.make_batch(128, 3, 10, gen)[:3])  # (B, T) each
        logits = model(src, tgt_in)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=ref.PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()


def memory_task(device="cpu", epochs=2):
    """Lab 14: TransformerClassifier defaults on 4,000 sequences of 60; Adam 1e-3, batch 64, clip 1.0, test every
    epoch."""
    ref = reference_parts("lab14_transformers")
    X, y = (t.to(device) for t in ref.make_memory_dataset(4000, 60, seed=0))
    X_test, y_test = (t.to(device) for t in ref.make_memory_dataset(1000, 60, seed=1))
    torch.manual_seed(0)
    model = ref.TransformerClassifier(max_len=61).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(X), device=device).split(64):
            loss = F.binary_cross_entropy_with_logits(model(X[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        model.eval()
        with torch.no_grad():  # the lab prints test accuracy after every epoch
            sum(((model(xb) > 0).float() == yb).sum().item()
                for xb, yb in zip(X_test.split(256), y_test.split(256), strict=True))


def attention_vision(device="cpu"):
    """Week 8, Lecture 1's graded trainings: AE 4 epochs, linear AE 1,200 full-batch steps, seq2seq 1,500,
    spatial 700."""
    ref, h = reference_parts("w8l1_attention_vision"), harness("w8l1_attention_vision")
    from autograder.course.mnist import load_mnist
    X = load_mnist(n_train=h.N_TRAIN, n_test=h.N_TEST)[0].to(device)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)

    ae = ref.AutoEncoder(32).to(device)  # Adam 2e-3, batch 128, 4 epochs
    opt = torch.optim.Adam(ae.parameters(), lr=2e-3)
    for _ in range(4):
        for idx in torch.randperm(len(X), generator=gen).to(device).split(128):
            loss = F.mse_loss(ae(X[idx]), X[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()

    ref.train_linear_ae(X - X.mean(0), 16, 1200, 1e-2)  # k = 16, full batch, Adam 1e-2

    s2s = h.Seq2Seq(ref, d=32, attention=True).to(device)  # dot attention, Adam 3e-3, batch 64, lengths 1-12
    opt = torch.optim.Adam(s2s.parameters(), lr=3e-3)
    for _ in range(1500):
        x, y, lens = (t.to(device) for t in h.make_reverse_batch(64, 1, 12, gen))
        y_in = torch.cat([torch.full((64, 1), h.SOS, device=device), y[:, :-1]], 1)
        loss = F.cross_entropy(s2s(x, lens, y_in).flatten(0, 1), y.flatten(), ignore_index=h.PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()

    # "where is the red square?": Adam 2e-3, batch 64, 700 steps
    imgs, q, a = (t.to(device) for t in h.make_shapes(h.N_SHAPES_TRAIN, 0))
    spatial = h.SpatialModel(ref, attention=True).to(device)
    opt = torch.optim.Adam(spatial.parameters(), lr=2e-3)
    for _ in range(700):
        idx, which = (torch.randint(0, n, (64,), generator=gen).to(device) for n in (len(imgs), 3))
        loss = F.cross_entropy(spatial(imgs[idx], q[idx, which])[0], a[idx, which])
        opt.zero_grad()
        loss.backward()
        opt.step()


LOOPS = {"w8l1_attention_vision": attention_vision, "w8l4_transformers": reverse_transformer,
         "lab14_transformers": memory_task}


def lecture_seconds(aid, device="cpu"):
    """Wall seconds of the assignment's lecture loop on `device`, or NaN when the course has no yardstick for it."""
    loop = LOOPS.get(aid)
    if loop is None:
        return math.nan
    t0 = time.perf_counter()
    loop(device)
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()  # the clock stops when the GPU's queued work is done, not when it is queued
    return time.perf_counter() - t0
