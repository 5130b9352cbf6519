"""The lecture's experiments: one harness, run with the reference parts here or the student's in the sandbox.

Graded runs train in the sandbox with the student's parts (the harness's own loop, the grader's data) and are
evaluated here, with the trained weights copied into the reference architecture.

Whose failure is it? The student's item is scored only from the student's behaviour:
- the harness's grader-side steps (data, build and evaluate with the reference's parts) failing is the grader's
  failure (GraderError: no score, the cause named), MNIST missing included; so is the cache's, which never
  costs a result (a warning instead);
- evaluate failing on weights that training left non-finite is the student's (nothing else makes them so);
- the training process killed from outside (SIGKILL with no limit of the grader's hit: a host's OOM killer, an
  administrator) is nobody's yet: it is run again once, and only the same kill twice counts against the
  submission (grading is deterministic, so a student's own kill repeats); both are said in the result;
- an exception while the harness trains in the sandbox on the student's parts is the student's when its
  traceback has a frame in the student's cells (`<cell ...>`), when it is a limit biting, or when it is of a kind
  a wrong part's answer can cause in the harness's own code (a wrong shape or type: the plugin's UNUSABLE, and
  torch's own errors); any other exception there (NameError, ImportError, AssertionError, ...) with no frame of
  the student's is the harness's, hence the grader's. A student who breaks the harness's own names (deleting a
  builtin) therefore gets a grader failure that a TA sees, never a silent score.

Wrong work must not cost the most (course.yaml's `experiments:`): the student's run gets the reference's validation
curve for the same seed and device (reference_curve, computed once and cached) and stops when its figures are
hopeless against it (harness/training.py); the next seed is tried only when the last one came close.
"""
import builtins
import contextlib
import hashlib
import importlib
import inspect
import json
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from autograder.course.config import load_course
from autograder.errors import UNUSABLE, GraderError
from autograder.grading import shared_runs
from autograder.grading.cache import (
    PACKAGE,
    cache_read,
    cache_write,
    code_digest,
    code_fingerprint,
    experiment_key,
    libraries,
)
from autograder.grading.harness_files import data_source_of, harness_imports, harness_sources  # noqa: F401
from autograder.grading.scoring import CELL_FRAME, Outcome
from autograder.notebooks.cells import fingerprint
from autograder.sandbox.grader_side import SandboxFailure, StudentRaised
from autograder.sandbox.state import StateMismatch, assign_state


def harness(aid):
    """The assignment's harness module (autograder/harness/<id>.py)."""
    return importlib.import_module(f"autograder.harness.{aid}")


# What an experiment's training run depends on, besides its harness (harness_sources): the sandbox (the grader's
# side and the student's), the course's data and configuration code, the fault kinds and the code here that drives
# it (the shared runs' memo among it). Not the reports, batches, integrations or the rest of grading: editing them
# keeps every cached run.
EXPERIMENT_CODE = ("errors.py", "course", "sandbox", "grading/experiments.py", "grading/harness_files.py",
                   "grading/shared_runs.py")
# What the reference's curve depends on, besides its harness: it trains here, in the grader's process, never in a
# sandbox, so neither the sandbox's code nor the shared runs' nor course.yaml's parsing (its cfg is keyed itself) is
# any part of it; MNIST's loader and the code here that trains it are. Editing the rest keeps every curve, the ones
# committed in .grader/curves included (apps/curves.py).
CURVE_CODE = ("course/mnist.py", "grading/experiments.py", "grading/harness_files.py")
# What a saved result depends on, besides the assignment's suite and harness: all of grading and what it runs on.
GRADING_CODE = ("errors.py", "course", "sandbox", "notebooks", "grading")


def harness_digest(aid, package=PACKAGE):
    """One hash of the harness modules the sandbox loads for `aid`, comments left out."""
    return hashlib.sha256(json.dumps({k: code_fingerprint(v) for k, v in harness_sources(aid, package).items()},
                                     sort_keys=True).encode()).hexdigest()


def experiment_code(aid, package=PACKAGE):
    """Hashes of the code an experiment's run depends on (EXPERIMENT_CODE, its harness), comments left out."""
    return {"grader": code_digest(EXPERIMENT_CODE, package), "harness": harness_digest(aid, package)}


def grading_code(aid, package=PACKAGE):
    """Hashes of the code a grade depends on (GRADING_CODE, the assignment's suite, its harness), comments left out."""
    return {"grader": code_digest(GRADING_CODE + (f"suites/test_{aid}.py",), package),
            "harness": harness_digest(aid, package)}


def solution_fingerprint(aid):
    """The reference solution's code, comments left out."""
    return code_fingerprint(inspect.getsource(importlib.import_module(f"solutions.{aid}")))


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


def run_reference(aid, name, device="cpu", seed=None):
    """Train and evaluate one experiment with the reference parts; try the configured seeds in order."""
    exp = load_course().assignment(aid).experiments[name]
    spec = harness(aid).EXPERIMENTS[name]
    ref, device = reference_parts(aid), resolve_device(device)
    result = ExperimentResult(aid, name)
    for s in ([seed] if seed is not None else exp.seeds):
        t0 = time.perf_counter()
        model, history = _reference_training(aid, name, s, device, ref)
        model.eval()
        metrics = spec["evaluate"](model, ref, exp.cfg, s, device)
        result = ExperimentResult(aid, name, metrics, exp.failures(metrics),
                                  time.perf_counter() - t0, s, history or {})
        if result.passed:
            break
    return result


def _reference_training(aid, name, seed, device, ref):
    """(model, history): one experiment trained with the reference parts; the run it reuses (grading/shared_runs.py)
    is trained first when this process holds none, and a run another experiment reuses is kept."""
    course, experiments = load_course().assignment(aid), harness(aid).EXPERIMENTS
    exp, spec = course.experiments[name], experiments[name]
    reused = shared_runs.reused_here(course, name, spec)
    held = None
    if reused:  # trained first when this process has not (kept unless its run may not be shared)
        identity = _reference_identity(aid, course.experiments[reused], seed, device)
        if shared_runs.kept(identity) is None:
            _reference_training(aid, reused, seed, device, ref)
        held = shared_runs.kept(identity)
    torch.manual_seed(seed)
    data = spec["data"](ref, exp.cfg, seed, device)
    if held is not None:
        data.update(shared_runs.as_data(held[0]))
    model = spec["build"](ref, exp.cfg, seed, device)
    history = spec["train"](model, ref, data, exp.cfg, seed)
    if shared_runs.is_reused(experiments, name):
        shared_runs.keep(_reference_identity(aid, exp, seed, device), shared_runs.state_of(model), history)
    return model, history


def _reference_identity(aid, exp, seed, device):
    """What a reference run's trained state depends on (experiment_inputs, with the solution for the cells)."""
    return experiment_key({"reference": solution_fingerprint(aid), "code": experiment_code(aid), "cfg": exp.run_cfg,
                           "name": exp.name, "seed": seed, "device": device, "threads": torch.get_num_threads(),
                           "data": data_source_of(aid)})


# --- the reference's validation curve, which a student's run is judged hopeless against --------------------

_CURVES = {}  # key -> curve: once per process, also when the cache is off
# The curve's run uses one CPU thread whatever the machine: the same curve everywhere, and on a loaded machine two
# spinning OpenMP threads made this one training over five times slower (a 25-minute grading here).
CURVE_THREADS = 1


def validates_against_marks(spec):
    """Whether the experiment's training stops on validation marks (harness/training.py pass_marks): only such a
    run has a reference curve to be judged against."""
    return "pass_marks" in inspect.getsource(spec["train"])


def has_curve(aid, exp):
    """Whether grading judges the experiment's runs against a reference curve: graded, and stopping on marks."""
    return exp.graded and validates_against_marks(harness(aid).EXPERIMENTS[exp.name])


def curve_key(aid, exp, seed, device, data=None, package=PACKAGE):
    """The cache key of the reference's curve: everything that changes it. `data`: the data source where the curve
    will be read (the Gradescope zip's), when not this process's (data_source_of); `package`: the grader's folder
    whose code counts (tests pass a copy)."""
    code = {"grader": code_digest(CURVE_CODE, package), "harness": harness_digest(aid, package)}
    return experiment_key({"reference curve": exp.name, "code": code,
                           "solutions": solution_fingerprint(aid), "cfg": exp.run_cfg, "seed": seed, "device": device,
                           "libraries": curve_libraries(), "data": data_source_of(aid) if data is None else data,
                           "threads": CURVE_THREADS})


def curve_libraries():
    """The library versions a reference curve is keyed with: releases, not builds or patches. A curve only judges
    whether a run is hopeless (every figure under half the reference's), which no build of one torch release
    (PyPI's +cu130, the CPU index's +cpu) and no patch of NumPy or Python moves; so a Gradescope container, which
    installs its own builds, reads the curves the export shipped (integrations/gradescope.py)."""
    versions = libraries()
    return {"torch": versions["torch"].split("+")[0], "numpy": ".".join(versions["numpy"].split(".")[:2]),
            "python": ".".join(versions["python"].split(".")[:2])}


def reference_curve(aid, exp, seed, device):
    """The reference's validation curve ([{step, figures...}], its training history's `val`) for this experiment,
    seed and device: computed once per process and kept in the training cache, never once per submission."""
    if not has_curve(aid, exp):
        return []
    key = curve_key(aid, exp, seed, device)
    if key not in _CURVES:
        curve = cache_read(key)
        if curve is None:
            threads = torch.get_num_threads()
            torch.set_num_threads(CURVE_THREADS)
            try:
                curve = reference_history(aid, exp, seed, device).get("val", [])
            finally:
                torch.set_num_threads(threads)
            cache_write(key, curve)  # a failed write prints its warning; the next process trains it again
        _CURVES[key] = curve
    return _CURVES[key]


def reference_history(aid, exp, seed, device):
    """The reference's training history for this seed, as run_reference trains it (not evaluated: only its curve is
    wanted); each step that fails is the grader's, named."""
    spec, ref = harness(aid).EXPERIMENTS[exp.name], reference_parts(aid)
    torch.manual_seed(seed)
    data = _grader_step(exp, "data", spec["data"], ref, exp.cfg, seed, device)
    model = _grader_step(exp, "build", spec["build"], ref, exp.cfg, seed, device)
    return _grader_step(exp, "reference training", spec["train"], model, ref, data, exp.cfg, seed) or {}


def with_stop(failures, run):
    """The run's failures, with why it stopped as hopeless after them: a stop explains a miss, it is never one
    (a run stopped as hopeless whose figures still pass, passes)."""
    return failures + [run["hopeless"]] if failures and run.get("hopeless") else failures


def untried_seeds(exp, seed, metrics, run, close):
    """'' when the next seed is worth trying after this miss, else the line that says why it is not (course.yaml's
    `experiments.close`): a run stopped as hopeless, or with no figures (a crash, a limit), is never close."""
    rest = exp.seeds[exp.seeds.index(seed) + 1:]
    if not rest:
        return ""
    why = ("it was stopped as hopeless" if run.get("hopeless") else
           "it gave no figures" if metrics is None else
           "" if exp.came_close(metrics, close) else
           f"it missed a bound by more than {close:g} of the bound (course.yaml: experiments.close)")
    return why and f"seed {', '.join(map(str, rest))} not tried: seed {seed} did not come close ({why})"


def experiment_inputs(code, aid, exp, seed, device, threads, watched=None, package=PACKAGE):
    """Everything that can change one experiment's result and nothing else: the student's cells and the grader's
    code (experiment_code: what the run executes), each as it runs (not as laid out or commented), the reference
    solution, the experiment's course.yaml section, seed, device, library versions, the data's source, the
    sandbox's CPU threads and the oracles watched while it trains (course.yaml's `oracles`, through
    scoring.tripwire_table). `package`: the grader's folder whose code counts (tests pass a copy)."""
    data = data_source_of(aid)
    return {"cells": [[c.grade_id, fingerprint(c.source)] for c in code.cells], "code": experiment_code(aid, package),
            "solutions": solution_fingerprint(aid), "cfg": exp.run_cfg,
            "seed": seed, "device": device, "libraries": libraries(), "data": data,
            "threads": threads,  # the sandbox's: a worker's share, or one grading's (grader_side.Sandbox)
            "watched": watched}


# The grader's side of an experiment (data, the reference's curve, evaluation: the global RNG, torch's thread count
# and the shared runs' memo) runs one experiment, or one test of the session, at a time; only the sandboxes' work
# overlaps when a session runs several at once (grading/ahead.py). run_experiment holds it, _train lets go of it
# while a sandbox loads or trains; the session's thread holds it through each test but while it waits for a run.
# It also keeps Python 3.11's ast.parse to one thread at a time (its AST constructor's recursion count is shared
# between threads: "SystemError: AST constructor recursion depth mismatch"), for the cells' fingerprints here and
# pytest's own parsing when it reports a failure. Reentrant: a thread that holds it for a test may run an
# experiment (regrade.py).
GRADER_SIDE = threading.RLock()


@contextlib.contextmanager
def in_the_sandbox():
    """Let other threads' grader side run while this one waits for its sandbox or for another run (the caller
    holds GRADER_SIDE)."""
    GRADER_SIDE.release()
    try:
        yield
    finally:
        GRADER_SIDE.acquire()


def run_experiment(course, aid, exp, code, sandbox, device, why="", notes=None):
    """Train in the sandbox with the student's parts, evaluate here with the reference's; next seed on a miss.

    `why`: the reason it cannot run (its item is zeroed, or does not exist), which becomes its output. Raises
    GraderError when the grader's side fails; a cache that cannot be written adds a warning to `notes` (a list).
    Safe to call from several threads at once, each with its own sandbox (GRADER_SIDE).
    """
    with GRADER_SIDE:
        return _run_experiment(course, aid, exp, code, sandbox, device, why, notes)


def _run_experiment(course, aid, exp, code, sandbox, device, why, notes):
    outcome = Outcome(exp.item, f"experiment {exp.name}", exp.points)
    if why or sandbox is None:
        outcome.output = why or f"not run: '{exp.item}' must exist and be implemented first"
        return outcome
    spec, ref = harness(aid).EXPERIMENTS[exp.name], reference_parts(aid)
    limits = course.limits_for(aid, exp.item)
    lines, t0, trained = [], time.monotonic(), []
    for seed in exp.seeds:
        key = experiment_key(experiment_inputs(code, aid, exp, seed, device, sandbox.threads,
                                                     getattr(sandbox, "tripwire", None)))
        cached = cache_read(key)
        if cached is not None:
            metrics, failures, run = (cached + [{}])[:3]
            if metrics is not None:  # thresholds are judged now: course.yaml may have changed since
                failures = with_stop(exp.failures(metrics), run)
        else:
            run = {}
            metrics, failures = _train_and_evaluate(aid, spec, exp, sandbox, ref, seed, device, limits, notes,
                                                    _sharing(course, aid, exp, code, seed, device, sandbox, key), run)
            if metrics is not None or failures and "time limit" not in failures[0]:
                warning = cache_write(key, [metrics, failures, run])
                if warning and notes is not None and warning not in notes:
                    notes.append(warning)
        shown = ", ".join(f"{k} {v:.4g}" + (f" (lecture {exp.lecture[k]:g})" if k in exp.lecture else "")
                          for k, v in (metrics or {}).items() if isinstance(v, (int, float)))
        lines.append(f"seed {seed}: {shown or 'no metrics'}" + ("" if not failures else " -- " + "; ".join(failures)))
        trained.append({"seed": seed, **run, "metrics": metrics or {}, "passed": metrics is not None and not failures})
        outcome.extra = {"experiment": exp.name, "seed": seed, "metrics": metrics or {}, "trained": trained}
        if metrics is not None and not failures:
            outcome.score = outcome.max_score
            break
        untried = untried_seeds(exp, seed, metrics, run, course.experiments.close)
        if untried:
            lines.append(untried)
            break
    outcome.seconds = time.monotonic() - t0
    verdict = "passed" if outcome.score else "missed the lecture's threshold"
    outcome.output = f"{exp.description}: {verdict}\n" + "\n".join(lines)
    return outcome


def _grader_step(exp, step, fn, *args):
    """One of the harness's steps run here with the reference's parts: whatever it raises is the grader's."""
    try:
        return fn(*args)
    except Exception as e:
        raise GraderError(f"experiment {exp.name}: the grader's {step} step ({fn.__module__}.{fn.__qualname__}) "
                          f"raised {type(e).__name__}: {e}") from e


STUDENT_FRAME = CELL_FRAME  # where child/server.py's describe puts a student's frame
LIMITS = ("wrote more than", "started more than")         # the sandbox's disk and process limits biting


def students_training_error(message):
    """Whether the error the harness's training in the sandbox reported is the student's doing (module doc)."""
    if STUDENT_FRAME.search(message) or message.startswith(LIMITS):
        return True
    name = message.split(":", 1)[0].strip()
    kind = getattr(builtins, name, None)
    if not (isinstance(kind, type) and issubclass(kind, BaseException)):
        return True  # torch's own errors (OutOfMemoryError, a linalg error): raised by what the parts gave it
    return issubclass(kind, UNUSABLE + (MemoryError,))


def _finite(tensors):
    return all(torch.isfinite(t).all() for t in tensors if t.is_floating_point() or t.is_complex())


def killed_from_outside(failure):
    """Whether the sandbox's process died of a SIGKILL that none of the grader's limits sent (those are raised as
    timeout or memory, after the grader ended the sandbox itself): a host's OOM killer, an administrator."""
    return failure.kind == "crash" and "killed by signal SIGKILL" in str(failure)


def _sharing(course, aid, exp, code, seed, device, sandbox, key):
    """(keep_as, reused_key) for grading/shared_runs.py: the identity to keep this run's trained state under (its
    experiment key, when another experiment reuses it), and that of the run it reuses: that run's own experiment
    key with the same cells (None when it reuses none)."""
    experiments = harness(aid).EXPERIMENTS
    keep_as = key if shared_runs.is_reused(experiments, exp.name) else None
    assignment = course.assignment(aid)
    reused = shared_runs.reused_here(assignment, exp.name, experiments[exp.name])
    if reused is None:
        return keep_as, None
    other = assignment.experiments[reused]
    return keep_as, experiment_key(experiment_inputs(code, aid, other, seed, device, sandbox.threads,
                                                     getattr(sandbox, "tripwire", None)))


def _train_and_evaluate(aid, spec, exp, sandbox, ref, seed, device, limits, notes=None, sharing=None, run=None):
    """Train in the sandbox (with the kept run it reuses, if any: grading/shared_runs.py), evaluate here:
    (metrics, failures); `run` (a dict) gets the steps the training took and why it stopped as hopeless ('' when
    it did not)."""
    run = {} if run is None else run
    keep_as, reused_key = sharing or (None, None)
    held = shared_runs.kept(reused_key)
    result, failures = _train(aid, spec, exp, sandbox, ref, seed, device, limits, notes,
                              shared_runs.as_data(held[0]) if held is not None else {})
    if failures:
        return None, failures
    trained, history = result
    run.update(steps=history.get("steps"), hopeless=str(history.get("hopeless") or ""))
    model = _grader_step(exp, "build", spec["build"], ref, exp.cfg, seed, device)
    expected = len(model.state_dict())
    if not isinstance(trained, list) or not all(isinstance(t, torch.Tensor) for t in trained):
        trained = []  # nothing that could be a model's state came back
    try:
        assign_state(model, trained)
    except StateMismatch:
        return None, ["the trained model's parameters do not have the reference architecture's shapes "
                      f"({len(trained)} tensors, expected {expected})"]
    shared_runs.keep(keep_as, trained, history)
    model.eval()
    if _finite(trained):
        metrics = _grader_step(exp, "evaluate", spec["evaluate"], model, ref, exp.cfg, seed, device)
        return metrics, with_stop(exp.failures(metrics), run)
    try:  # nan or inf weights, which only the student's training makes: NaN metrics miss every threshold
        metrics = spec["evaluate"](model, ref, exp.cfg, seed, device)
    except Exception as e:
        return None, with_stop([f"training left weights that are not finite (nan or inf); evaluating them raised "
                                f"{type(e).__name__}"], run)
    return metrics, with_stop(exp.failures(metrics), run)


def _train(aid, spec, exp, sandbox, ref, seed, device, limits, notes, extra=None):
    """((state tensors, history), []) from the harness's training in the sandbox, or (None, failures); `extra`:
    data tensors added to the experiment's own (a kept state it reuses)."""
    try:
        with in_the_sandbox():
            sandbox.ensure()
    except SandboxFailure as e:
        if e.kind == "sandbox":  # before any student code ran
            raise GraderError(f"experiment {exp.name}: the sandbox could not be restarted: {e}") from e
        return None, [f"the notebook's code could not be reloaded for training: {e}"]
    except StudentRaised as e:
        return None, [f"the notebook's code could not be reloaded for training: {e}"]
    cfg = {**exp.cfg, "reference": reference_curve(aid, exp, seed, device)}
    torch.manual_seed(seed)
    data = {**_grader_step(exp, "data", spec["data"], ref, exp.cfg, seed, device), **(extra or {})}
    for attempt in (1, 2):
        try:
            with in_the_sandbox():
                answer = sandbox.request("experiment", limits.experiment_seconds, tensors=data, module=aid,
                                         name=exp.name, cfg=cfg, seed=seed, device=device)
            history = answer.get("history") if isinstance(answer.get("history"), dict) else {}
            trained = sandbox.value(answer), history
            break
        except StudentRaised as e:
            if not students_training_error(str(e)):
                raise GraderError(f"experiment {exp.name}: the harness's training raised {e}, with no frame of the "
                                  f"student's code (autograder/harness/{aid}.py)") from e
            return None, [f"training raised {e}"]
        except SandboxFailure as e:
            if e.kind == "sandbox":
                raise GraderError(f"experiment {exp.name}: the sandbox failed: {e}") from e
            if not killed_from_outside(e):
                return None, [f"training {e}"]
            if attempt == 2:
                return None, [f"training {e}, twice: no limit of the grader's was hit, and the same kill on a rerun "
                              f"counts against the submission"]
            if notes is not None:
                notes.append(f"experiment {exp.name} (seed {seed}): the training process was killed from outside "
                             f"(SIGKILL, no limit of the grader's hit, as a host's OOM killer or an administrator "
                             f"does) and was run again")
            try:
                with in_the_sandbox():
                    sandbox.ensure()
            except (SandboxFailure, StudentRaised) as e:
                if getattr(e, "kind", "") == "sandbox":
                    raise GraderError(f"experiment {exp.name}: the sandbox could not be restarted: {e}") from e
                return None, [f"the notebook's code could not be reloaded for training: {e}"]
    return trained, []
