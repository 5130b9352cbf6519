"""The harnesses' one training loop, and the pieces every harness shares (seeds, building, data, stopping).

A run takes `steps` optimiser steps at most (its budget, course.yaml's `steps`), numbered from 1. Every `every`
steps from step `first` on, `validate()` scores the model in eval mode on validation data; training stops early once
those figures (named as the experiment's metrics they estimate) clear their `marks`: each metric's pass mark plus a
margin, so that the grader's fresh test data clears the mark itself. The history it returns has the same keys in
every harness: loss, val, steps, stopped_early, hopeless, seconds.

Wrong work must not cost the most: when the grader sends the reference's validation curve for the same run
(cfg["reference"], its history's `val`) with course.yaml's rule (cfg["hopeless"]: `after`, `fraction`,
`validate_from`), a run also stops at a validation whose figures are hopeless against it (hopeless_reason), and says
why in `hopeless`; and it validates only from `validate_from` times the step where the reference cleared its marks
(validation_start): before that, a validation could stop only a run that learns faster than the reference.

Every run trains with subnormal floats flushed to zero (denormals_flushed): as a model learns, values below
float32's smallest normal number (1.2e-38) appear in its steps, and on x86 each such operand costs tens of cycles.
w8l4's transformer took 27.1 s for its 500 steps on one thread (its 100-step blocks slowing from 4.5 s to 5.7 s),
and 20.6 s flushed, the same weights bit for bit (2026-12-05): those values are too small to move a sum of normal
ones.

The sandbox loads this module beside the harness (grading/experiments.py harness_sources), so it imports nothing
of the grader's.
"""
import contextlib
import math
import time

import torch
import torch.nn as nn

from .adam import Adam


def data_seeds(seed, stride=1000):
    """Disjoint generator seeds for training, validation and test data; seed 0 trains on the lecture's own."""
    return seed, stride + seed, 2 * stride + seed


def seeded(make, seed, device):
    """make() built under torch.manual_seed(seed), then moved to `device`: the same initial weights anywhere."""
    torch.manual_seed(seed)
    return make().to(device)


def on_device(device, **tensors):
    """The tensors moved to `device`, as the data dict a harness passes to its training."""
    return {k: v.to(device) for k, v in tensors.items()}


class Marks(dict):
    """{metric: the level validation must reach to stop}, with the reference's curve and the hopeless rule of the
    run they belong to (none: a run is never stopped as hopeless)."""
    reference: list = []
    rule: dict = {}


def pass_marks(cfg, margins, cap=None):
    """{metric: the level validation must reach to stop}: course.yaml's `min` plus the margin, at most `cap`;
    a metric with no `min` (an upper bound, a figure for the record) never stops a run. The marks carry cfg's
    reference curve and hopeless rule (module doc) to train_until."""
    marks = Marks()
    for metric, margin in margins.items():
        low = cfg["threshold"].get(metric, {}).get("min")
        if low is not None:
            marks[metric] = low + margin if cap is None else min(cap, low + margin)
    marks.reference, marks.rule = list(cfg.get("reference") or []), dict(cfg.get("hopeless") or {})
    return marks


def cleared(figures, marks):
    """Whether validation's figures reach every mark (a figure missing, as when validation failed, does not)."""
    return all(metric in figures and figures[metric] >= mark for metric, mark in marks.items())


def reference_cleared_at(marks):
    """The step at which the reference's curve (sent with the marks) first cleared them, or None."""
    reference = getattr(marks, "reference", [])
    return next((v["step"] for v in reference if cleared(v, marks)), None) if marks else None


def validation_start(marks, first):
    """The first step that may validate: `first`, or `validate_from` times the reference's clearing step when that
    is later. A validation before it can stop only a run that clears the marks sooner than that (one that learns
    faster than the reference, which then trains a little longer); a hopeless stop comes later anyway."""
    cleared_at, share = reference_cleared_at(marks), getattr(marks, "rule", {}).get("validate_from", 0)
    return first if cleared_at is None or not share else max(first, math.ceil(share * cleared_at))


def hopeless_reason(figures, step, marks):
    """Why the run is hopeless at this validation, or '': the reference had cleared the marks by step / `after`,
    and every figure is below `fraction` of the reference's at its last validation up to `step`. A figure missing
    (validation failed) is never hopeless: the rule judges only what it measured."""
    reference, rule = getattr(marks, "reference", []), getattr(marks, "rule", {})
    if not reference or not rule or not marks:
        return ""
    cleared_at = reference_cleared_at(marks)
    if cleared_at is None or step < rule["after"] * cleared_at:
        return ""
    ref = [v for v in reference if v["step"] <= step][-1]
    if not all(metric in figures and figures[metric] < rule["fraction"] * ref[metric] for metric in marks):
        return ""
    shown = ", ".join(f"{m} {figures[m]:.3g} < {rule['fraction']:g} x the reference's {ref[m]:.3g}" for m in marks)
    return (f"stopped as hopeless at step {step}: {shown} (the reference cleared its stopping marks at step "
            f"{cleared_at})")


@contextlib.contextmanager
def denormals_flushed():
    """Subnormal floats read and written as zero on this thread's CPU arithmetic while inside (module doc); the
    grader's threads and a sandbox's checks keep IEEE's gradual underflow. A CPU without the switch runs as before.
    One thread per training (course.yaml's `threads`): the switch is the calling thread's, not a thread pool's."""
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def shuffled_rows(n, batch, gen, device):
    """rows(step) -> the indices of step's batch: epochs of a fresh order of the n rows, each drawn from the CPU
    generator `gen` as its epoch starts (the same batches on any device), cut into batches (an epoch's last one
    shorter)."""
    per_epoch = math.ceil(n / batch)
    order = None

    def rows(step):
        nonlocal order
        i = (step - 1) % per_epoch
        if i == 0:
            order = torch.randperm(n, generator=gen).to(device)
        return order[i * batch:(i + 1) * batch]
    return rows


def train_until(model, batch_loss, steps, lr, validate=None, marks=None, every=1, first=1, lr_scale=None,
                clip=None, loss_every=1):
    """Adam at `lr` (times lr_scale(step) when given) on batch_loss(step) for steps 1..`steps`, gradients clipped
    to norm `clip` when given; stops after the first validation whose figures clear `marks` (module doc), validating
    every `every` steps from `first` (or validation_start's later step) on.

    history: loss (every loss_every-th step's), val ([{step, figures...}]), steps (taken), stopped_early, hopeless
    (why it stopped as hopeless, or ''), seconds.
    """
    opt = Adam(model.parameters(), lr=lr)  # torch.optim.Adam's arithmetic, without torch._dynamo's import (adam.py)
    history = {"loss": [], "val": [], "steps": 0, "stopped_early": False, "hopeless": ""}
    first = validation_start(marks, first)
    t0 = time.perf_counter()
    with denormals_flushed():  # module doc
        for step in range(1, steps + 1):
            model.train()
            loss = batch_loss(step)
            opt.zero_grad()
            loss.backward()
            if clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step(lr if lr_scale is None else lr * lr_scale(step))
            history["steps"] = step
            if step % loss_every == 0:
                history["loss"].append(loss.item())
            if validate is not None and marks and step >= first and step % every == 0:
                model.eval()
                figures = validate()
                history["val"].append({"step": step, **figures})
                if cleared(figures, marks):
                    history["stopped_early"] = step < steps
                    break
                history["hopeless"] = hopeless_reason(figures, step, marks)
                if history["hopeless"]:
                    history["stopped_early"] = step < steps
                    break
    model.eval()
    history["seconds"] = time.perf_counter() - t0
    return history
