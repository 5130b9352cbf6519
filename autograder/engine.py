"""Grade one notebook: load its code in the sandbox, run each item's checks and experiments, score them.

The references, comparisons and verdicts live here, in the grader's process; the student's code runs only
in the sandbox and sends back plain data.
"""
import hashlib
import os
import importlib
import inspect
import json
import platform
import threading
import time
from pathlib import Path

import torch

import autograder
from autograder.checks import Fail, check_signature
from autograder.config import CHECK_ORDER, ROOT, load_course
from autograder.experiments import harness, reference_parts, resolve_device
from autograder.notebook import Cell, fingerprint, load_student_code, names_used
from autograder.sandbox import Remote, Sandbox, SandboxFailure, StudentRaised, encode

CACHE = ROOT / ".grader" / "cache"
NOT_IMPLEMENTED = "NotImplementedError"


class GraderError(Exception):
    """The grader itself could not grade (not the submission's doing): report it, score nothing, rerun."""


def seed_for(*parts):
    """A check's input seed: fresh per course seed, item and check, the same every run."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:4], "big")


class Registry:
    """A suite's checks: (item, kind) -> function(student, generator)."""

    def __init__(self):
        self.checks = {}

    def check(self, item, kind):
        assert kind in CHECK_ORDER and kind != "exists", kind

        def add(fn):
            self.checks[(item, kind)] = fn
            return fn
        return add


class Student:
    """The student's namespace, seen from the grader: every call crosses into the sandbox."""

    def __init__(self, sandbox, item, device, deadline, watch=(), limit_s=None):
        self.sandbox, self.item, self.device = sandbox, item, device
        self.deadline, self.watch, self.label = deadline, list(watch), ""
        self.limit_s = limit_s  # the item's whole time limit, which a timeout names
        self.oracle_calls = set()
        self.seed = 0

    def case(self, label):
        """Name the case being checked; failure messages end with it."""
        self.label = label

    def _left(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise SandboxFailure("timeout", "ran out of its time limit")
        return left

    def _ask(self, op, fields, args=(), kwargs=None, raw=False):
        tensors = {}
        fields = dict(fields)
        if args or kwargs:
            fields["args"] = encode(list(args), tensors, self.device)["list"]
            fields["kwargs"] = encode(dict(kwargs or {}), tensors, self.device)["dict"]
        answer = self.sandbox.request(op, self._left(), tensors=tensors, limit_s=self.limit_s, seed=self.seed, **fields)
        self.oracle_calls.update(answer.get("oracle_calls", []))
        return answer if raw else self.sandbox.value(answer)

    def _target(self, target):
        return {"handle": target.handle} if isinstance(target, Remote) else {"name": target}

    def call(self, name, *args, **kwargs):
        """name(*args, **kwargs) in the student's process; tensors are sent to self.device."""
        return self._ask("call", {**self._target(name), "watch": self.watch}, args, kwargs)

    def method(self, obj, method, *args, **kwargs):
        return self._ask("call", {"handle": obj.handle, "method": method, "watch": self.watch}, args, kwargs)

    def grad(self, name, args, wrt, upstream, method=None, **kwargs):
        """(outputs, grads of sum <out_i, upstream_i> w.r.t. args[j] for j in wrt)."""
        tensors = {}
        enc_args = encode(list(args), tensors, self.device)["list"]
        for j in wrt:
            enc_args[j]["grad"] = True
        ups = []
        for k, u in enumerate(upstream):
            if u is None:
                ups.append(None)
            else:
                tensors[f"u{k}"] = u
                ups.append(f"u{k}")
        fields = {"args": enc_args, "kwargs": encode(dict(kwargs), tensors, self.device)["dict"],
                  "grad": {"wrt": list(wrt), "upstream": ups}, "watch": self.watch}
        fields.update({"handle": name.handle, "method": method} if isinstance(name, Remote) else {"name": name})
        answer = self.sandbox.request("call", self._left(), tensors=tensors, limit_s=self.limit_s, seed=self.seed,
                                      **fields)
        self.oracle_calls.update(answer.get("oracle_calls", []))
        return self.sandbox.value(answer)

    def new(self, name, *args, **kwargs):
        """An instance of the student's class, built with the grader's seed on self.device."""
        obj = self._ask("new", {"name": name, "device": self.device}, args, kwargs)
        if not isinstance(obj, Remote):
            raise Fail(f"'{name}(...)' gave {obj!r}, expected a torch.nn.Module")
        return obj

    def state(self, obj):
        """The module's state_dict() as a dict name -> tensor, in registration order."""
        answer = self._ask("state", {"handle": obj.handle}, raw=True)
        return dict(zip(answer.get("names", []), self.sandbox.value(answer)))

    def load_state(self, obj, tensors):
        """Copy tensors into the module's state_dict() entries, by order and shape."""
        named = {f"p{k}": t for k, t in enumerate(tensors)}
        self.sandbox.request("load_state", self._left(), tensors=named, limit_s=self.limit_s, handle=obj.handle,
                             keys=list(named))

    def attr(self, target, attr):
        return self._ask("attr", {**self._target(target), "attr": attr})

    def signature(self, name, methods=()):
        return self._ask("signature", {"name": name, "methods": list(methods)})


class Outcome:
    """One check's result in the shape results.json wants."""

    def __init__(self, item, kind, max_score):
        self.item, self.kind, self.max_score = item, kind, float(max_score)
        self.score, self.output, self.seconds = 0.0, "", 0.0
        self.not_implemented = False
        self.extra = {}   # a failed check's case; an experiment's measured metrics and the seed that gave them

    def as_test(self):
        test = {"item": self.item, "name": f"{self.item}: {self.kind}", "score": self.score,
                "max_score": self.max_score, "status": "passed" if self.score >= self.max_score else "failed",
                "output": self.output, "visibility": "visible", "seconds": round(self.seconds, 3)}
        if self.extra:
            test["extra_data"] = self.extra
        return test


def load_suite(aid):
    return importlib.import_module(f"autograder.suites.{aid}").CHECKS


def harness_sources(aid):
    return {aid: inspect.getsource(harness(aid))}


def grade_notebook(path, aid, items=None, device="auto", log=None, experiments=True, limits=None, threads=None):
    """results.json for one notebook (a dict), never raising for anything the submission did.

    Raises GraderError when the grader's own machinery fails (the sandbox cannot start), so that no one is
    given a zero for it.

    `limits` overrides course.yaml's limits for this run (a dict, e.g. {"item_seconds": 5}); `threads` caps the
    student's process's CPU threads (set when several submissions are graded at once).
    """
    course = load_course()
    if limits:
        course = course.model_copy(update={"limits": course.limits.model_copy(update=limits)})
    assignment = course.assignment(aid)
    device = resolve_device(device if device != "auto" else course.device)
    wanted = [i for i in assignment.items if items is None or i in items]
    t0 = time.monotonic()
    code = load_student_code(path, list(assignment.items))
    restore_setup_cells(code, aid)
    notes = list(code.notes)
    outcomes, sandbox, isolation = [], None, None
    if not code.error:
        sandbox = Sandbox(code.cells, harness_sources(aid), course.limits_for(aid), device=device, threads=threads)
        try:
            try:
                sandbox.start()
            except SandboxFailure as e:
                if e.kind != "sandbox":
                    raise
                sandbox.close()
                sandbox.start()  # the grader's own process failed to start: once more before blaming anyone
        except SandboxFailure as e:
            sandbox.close()
            if e.kind == "sandbox":  # before any student code ran: the grader's failure, never a student's zero
                raise GraderError(f"the sandbox could not be started on this machine: {e}") from e
            code.error = f"the notebook's code could not be loaded: {e}"
            sandbox = None
        except StudentRaised as e:
            code.error = f"the notebook's code could not be loaded: {e}"
            sandbox.close()
            sandbox = None
    try:
        ref = reference_parts(aid)
        suite = load_suite(aid)
        for item in wanted:
            if log:
                log(item)
            outcomes += grade_item(course, assignment, item, code, sandbox, suite, ref, device, experiments)
    finally:
        if sandbox is not None:
            notes += [f"setup cell '{g}' {e}" for g, e in sandbox.load_errors.items()
                      if g.startswith("setup_")]
            isolation = sandbox.isolation
            sandbox.close()
    tests = [o.as_test() for o in outcomes]
    return {
        "score": round(sum(t["score"] for t in tests), 4),
        "max_score": sum(t["max_score"] for t in tests),
        "output": code.error or ("; ".join(notes) if notes else ""),
        "visibility": "visible",
        "tests": tests,
        "extra_data": {"assignment": aid, "notebook": Path(path).name, "device": device, "seed": course.seed,
                       "isolation": isolation or "none",
                       "restarts": sandbox.restarts if sandbox else 0, "seconds": round(time.monotonic() - t0, 2),
                       "versions": {"torch": torch.__version__, "python": platform.python_version(),
                                    "autograder": getattr(autograder, "__version__", "0.1.0")},
                       "notes": notes},
    }


def restore_setup_cells(code, aid):
    """Setup cells are locked: grade with the released version of each, whatever the submission did to them."""
    released = ROOT / "release" / aid / f"{aid}.ipynb"
    if code.error or not released.exists():
        return
    trusted = {c.grade_id: c.source for c in load_student_code(released, []).cells}
    for cell in code.cells:
        if cell.grade_id in trusted and cell.source != trusted[cell.grade_id]:
            code.notes.append(f"setup cell '{cell.grade_id}' was changed in the submission; the released version was used")
            cell.source = trusted[cell.grade_id]
    previous = None  # a missing setup cell goes back right after the setup cell that precedes it in the release
    for gid, source in trusted.items():
        at = next((k for k, c in enumerate(code.cells) if c.grade_id == gid), None)
        if at is None:
            code.notes.append(f"setup cell '{gid}' was missing from the submission; the released version was used")
            at = 0 if previous is None else next(k for k, c in enumerate(code.cells) if c.grade_id == previous) + 1
            code.cells.insert(at, Cell(gid, source, -1))
        previous = gid
    # a cell posing as a setup cell that the release does not have is the student's code, not setup
    code.cells = [c for c in code.cells if not c.grade_id.startswith("setup_") or c.grade_id in trusted]


def grade_item(course, assignment, item, code, sandbox, suite, ref, device, experiments=True):
    """Every check of one item, in the configured order, then the experiments it trains."""
    aid, spec = assignment.id, assignment.items[item]
    limits = course.limits_for(aid, item)
    kinds = [k for k in CHECK_ORDER if k in spec.points]
    outcomes = [Outcome(item, k, spec.points[k]) for k in kinds]
    problem = code.problems.get(item) or code.error
    if not problem and sandbox is not None:
        err = sandbox.load_errors.get(item)
        if err:
            problem = f"its cell {err}"
    from_scratch_hit = scratch_violation(item, spec, code.source_of(item))
    oracle_calls = set()  # what the tripwire saw in any check: one forbidden call anywhere zeroes the item
    deadline = time.monotonic() + limits.item_seconds
    for outcome in outcomes:
        if not problem and sandbox is not None:
            t0 = time.monotonic()
            try:  # restarting after an earlier item's crash is the grader's time, not this item's
                sandbox.ensure()
            except (SandboxFailure, StudentRaised) as e:
                problem = f"the notebook's code could not be reloaded: {e}"
            deadline += time.monotonic() - t0
        if problem:
            outcome.output = f"not checked: {problem}"
            continue
        student = Student(sandbox, item, device, deadline, watch=spec.from_scratch, limit_s=limits.item_seconds)
        student.seed = seed_for(course.seed, aid, item, outcome.kind)
        t0 = time.monotonic()
        try:
            if outcome.kind == "exists":
                info = student.signature(item, methods=list(spec.methods))
                check_signature(item, spec.signature, info, spec.methods)
            else:
                fn = suite.checks.get((item, outcome.kind))
                if fn is None:
                    raise Fail(f"no {outcome.kind} check is defined for '{item}' (grader configuration)")
                generator = torch.Generator().manual_seed(student.seed)
                fn(student, generator)
            outcome.score = outcome.max_score
            outcome.output = "ok" if outcome.kind != "exists" else f"'{item}' exists with signature {spec.signature}"
        except Fail as e:
            outcome.output = str(e) + (f" (case: {student.label})" if student.label and student.label not in str(e) else "")
            if outcome.kind == "exists":
                problem = f"'{item}' does not match the spec: {e}"
        except StudentRaised as e:
            msg = str(e)
            outcome.not_implemented = msg.startswith(NOT_IMPLEMENTED)
            outcome.output = f"'{item}' raised {msg}" + (f" on case: {student.label}" if student.label else "")
        except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError, RuntimeError) as e:
            # what came back has the wrong structure for the check (say, a tensor where a pair was due)
            outcome.output = (f"'{item}' returned something this check cannot use ({type(e).__name__}: "
                              f"{str(e)[:150]})" + (f" on case: {student.label}" if student.label else ""))
        except SandboxFailure as e:
            outcome.output = f"'{item}' {e}" + (f" on case: {student.label}" if student.label else "")
            problem = f"an earlier check {e.kind}: {e}" if e.kind in ("timeout", "memory") else ""
            if e.kind == "timeout":
                problem = f"'{item}' ran out of its {limits.item_seconds:g} s time limit"
        outcome.seconds = time.monotonic() - t0
        if outcome.score < outcome.max_score and student.label:
            outcome.extra["case"] = student.label  # the case it failed on, which its message names
        oracle_calls |= student.oracle_calls
        extra = sandbox.output() if sandbox is not None and sandbox.proc is not None else ""
        if extra.strip() and outcome.score < outcome.max_score:
            outcome.output += "\nprinted: " + extra.strip()[-400:]
    used = from_scratch_hit or min(oracle_calls, default="")
    # a from-scratch item that calls its oracle has shown nothing of its own, whatever else passed or failed
    zeroed = (f"'{item}' uses {used}; this item is written from scratch, so the PyTorch oracle it is "
              f"compared with may not be called (the whole item scores 0)") if used else ""
    if not zeroed and any(o.not_implemented for o in outcomes):
        zeroed = f"'{item}' is not implemented yet (it raises NotImplementedError)"
    for o in outcomes if zeroed else []:
        o.score, o.output = 0.0, zeroed
    exists_ok = outcomes and outcomes[0].kind == "exists" and outcomes[0].score > 0
    for exp in assignment.experiments_of(item) if experiments else []:
        outcomes.append(run_experiment(course, assignment, exp, code, sandbox, ref, device,
                                       runnable=exists_ok and not zeroed, why=zeroed))
    return outcomes


def scratch_violation(item, spec, source):
    """The oracle name a from-scratch item's cell mentions in code (comments and strings don't count)."""
    if not spec.from_scratch or source is None:
        return ""
    names = names_used(source) or set()
    for oracle in spec.from_scratch:
        if oracle in names:
            return oracle
    return ""


def grader_digest(folder=ROOT / "autograder"):
    """One hash of the grader's own code (engine, sandbox, harnesses, ...): any edit may change a training run."""
    h = hashlib.sha256()
    for path in sorted(Path(folder).rglob("*.py")):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def experiment_inputs(code, aid, exp, seed, device, threads):
    """Everything that can change one experiment's result: the code as it runs (not as laid out), the grader,
    harness, solutions, config, seed, device, torch, the data's source and the sandbox's CPU threads."""
    data = ""
    if "load_mnist" in harness_sources(aid)[aid]:  # only the MNIST harness reads data that may come two ways
        from autograder.mnist import data_source
        kind, folder = data_source()
        data = f"mnist {kind} {folder}"
    return {"cells": [[c.grade_id, fingerprint(c.source)] for c in code.cells], "grader": grader_digest(),
            "solutions": inspect.getsource(importlib.import_module(f"solutions.{aid}")), "cfg": exp.cfg,
            "seed": seed, "device": device, "torch": torch.__version__, "data": data,
            "threads": threads or torch.get_num_threads()}  # the sandbox forks from a process with our default


def experiment_key(inputs):
    """The cache key of one experiment run: a hash of experiment_inputs(...)."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def cache_read(key):
    """A cached [metrics, failures], or None (missing, unreadable, or the cache turned off)."""
    if os.environ.get("COURSE_NO_CACHE") == "1":
        return None
    try:
        return json.loads((CACHE / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


def atomic_write(path, text):
    """Write whole or not at all: graders (and their threads) running side by side may read the same file."""
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}-{threading.get_ident()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def cache_write(key, value):
    CACHE.mkdir(parents=True, exist_ok=True)
    atomic_write(CACHE / f"{key}.json", json.dumps(value))


def run_experiment(course, assignment, exp, code, sandbox, ref, device, runnable=True, why=""):
    """Train in the sandbox with the student's parts, evaluate here with the reference's; second seed on a miss."""
    outcome = Outcome(exp.item, f"experiment {exp.name}", exp.points)
    if not runnable or sandbox is None:
        outcome.output = why or f"not run: '{exp.item}' must exist and be implemented first"  # why: the item's own reason
        return outcome
    spec = harness(assignment.id).EXPERIMENTS[exp.name]
    limits = course.limits_for(assignment.id, exp.item)
    lines, t0 = [], time.monotonic()
    for seed in exp.seeds:
        key = experiment_key(experiment_inputs(code, assignment.id, exp, seed, device, sandbox.threads))
        cached = cache_read(key)
        if cached is not None:
            metrics, failures = cached
            if metrics is not None:  # thresholds are judged now: course.yaml may have changed since
                failures = exp.failures(metrics)
        else:
            metrics, failures = _train_and_evaluate(spec, exp, sandbox, ref, seed, device, limits)
            if metrics is not None or failures and "time limit" not in failures[0]:
                cache_write(key, [metrics, failures])
        shown = ", ".join(f"{k} {v:.4g}" + (f" (lecture {exp.lecture[k]:g})" if k in exp.lecture else "")
                          for k, v in (metrics or {}).items() if isinstance(v, (int, float)))
        lines.append(f"seed {seed}: {shown or 'no metrics'}" + ("" if not failures else " -- " + "; ".join(failures)))
        outcome.extra = {"experiment": exp.name, "seed": seed, "metrics": metrics or {}}
        if metrics is not None and not failures:
            outcome.score = outcome.max_score
            break
    outcome.seconds = time.monotonic() - t0
    verdict = "passed" if outcome.score else "missed the lecture's threshold"
    outcome.output = f"{exp.description}: {verdict}\n" + "\n".join(lines)
    return outcome


def _train_and_evaluate(spec, exp, sandbox, ref, seed, device, limits):
    try:
        sandbox.ensure()
        torch.manual_seed(seed)
        data = spec["data"](ref, exp.cfg, seed, device)
        answer = sandbox.request("experiment", limits.experiment_seconds, tensors=data, module=exp_module(exp, sandbox),
                                 name=exp.name, cfg=exp.cfg, seed=seed, device=device)
        trained = sandbox.value(answer)
        model = spec["build"](ref, exp.cfg, seed, device)
        targets = list(model.state_dict().values())
        if not isinstance(trained, list) or [tuple(getattr(t, "shape", ())) for t in trained] != \
                [tuple(t.shape) for t in targets]:
            return None, ["the trained model's parameters do not have the reference architecture's shapes "
                          f"({len(trained) if isinstance(trained, list) else 0} tensors, expected {len(targets)})"]
        with torch.no_grad():
            for t, s in zip(targets, trained):
                t.copy_(s.to(t.device, t.dtype))
        model.eval()
        metrics = spec["evaluate"](model, ref, exp.cfg, seed, device)
        return metrics, exp.failures(metrics)
    except StudentRaised as e:
        return None, [f"training raised {e}"]
    except SandboxFailure as e:
        return None, [f"training {e}"]


def exp_module(exp, sandbox):
    return next(iter(sandbox.harness_sources))
