"""The lecture's experiments: one harness, run with the reference parts here or the student's in the sandbox."""
import importlib
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from autograder.config import load_course


def harness(aid):
    """The assignment's harness module (autograder/harness/<id>.py)."""
    return importlib.import_module(f"autograder.harness.{aid}")


def reference_parts(aid):
    """The reference solution's graded items, as the attributes of one namespace."""
    module = importlib.import_module(f"solutions.{aid}")
    return SimpleNamespace(**{k: getattr(module, k) for k in dir(module) if not k.startswith("__")})


def resolve_device(device):
    """auto -> cuda when present, else cpu."""
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda asked for, but torch.cuda.is_available() is False on this machine")
    return device


@dataclass
class ExperimentResult:
    assignment: str
    name: str
    metrics: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)
    seconds: float = 0.0
    seed: int = 0
    history: dict = field(default_factory=dict)

    @property
    def passed(self):
        return not self.failures


def move_state(source, target):
    """Copy parameters and buffers across by registration order and shape; error on any mismatch."""
    src, dst = list(source.state_dict().items()), list(target.state_dict().items())
    if [tuple(v.shape) for _, v in src] != [tuple(v.shape) for _, v in dst]:
        raise ValueError("state has shapes " + str([tuple(v.shape) for _, v in src])
                         + ", expected " + str([tuple(v.shape) for _, v in dst]))
    with torch.no_grad():
        for (_, s), (_, d) in zip(src, dst):
            d.copy_(s)


def run_reference(aid, name, device="cpu", seed=None):
    """Train and evaluate one experiment with the reference parts; try the configured seeds in order."""
    exp = load_course().assignment(aid).experiments[name]
    spec = harness(aid).EXPERIMENTS[name]
    ref, device = reference_parts(aid), resolve_device(device)
    result = ExperimentResult(aid, name)
    for s in ([seed] if seed is not None else exp.seeds):
        t0 = time.perf_counter()
        torch.manual_seed(s)
        data = spec["data"](ref, exp.cfg, s, device)
        model = spec["build"](ref, exp.cfg, s, device)
        history = spec["train"](model, ref, data, exp.cfg, s)
        model.eval()
        metrics = spec["evaluate"](model, ref, exp.cfg, s, device)
        result = ExperimentResult(aid, name, metrics, exp.failures(metrics),
                                  time.perf_counter() - t0, s, history or {})
        if result.passed:
            break
    return result


def format_row(exp, result):
    """One line of the experiments table: measured beside the lecture's figure and the threshold."""
    parts = []
    for key, value in result.metrics.items():
        if isinstance(value, (int, float)):
            lec = f" (lecture {exp.lecture[key]:g})" if key in exp.lecture else ""
            bound = f" [{exp.threshold[key]}]" if key in exp.threshold else ""
            parts.append(f"{key} {value:.4g}{lec}{bound}")
    verdict = "ok" if result.passed else "MISSED: " + "; ".join(result.failures)
    return (f"{result.assignment}.{result.name:<22} {', '.join(parts)}  "
            f"[{result.seconds:.1f} s, seed {result.seed}] {verdict}")
