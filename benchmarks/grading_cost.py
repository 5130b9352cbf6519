"""Grading cost: wall time to grade each reference solution, per item, against the bare compute of the same work.

Bare compute = the same hidden checks run in-process against the reference (no sandbox, no process,
no serialisation) plus the same training runs done directly with the harness. Lecture = the lecture notebook's
own training runs (benchmarks/lecture_loops.py): grading a complete submission should cost no more than the
lecture's training does. All three are measured in this one run, so the ratios are meaningful on a shared, noisy
machine; absolute seconds are not.

    python benchmarks/grading_cost.py [ID ...] [--no-experiments] [--no-bare] [--device cuda] [--partly-right]

--device moves the graded run's and the lecture's training there; the bare column stays on the CPU (its checks
are the suites' own CPU cases). --partly-right also grades the demo's partly-right submission (half the items
solved, one with its typical mistake, the rest stubs) and sets each item's time beside the complete one's with the
smallest-failing-case searches it ran (autograder/grading/smallest_case.py): a failing item may cost at most the search
budget more; the complete submission runs none.
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import torch
from lecture_loops import lecture_seconds

from autograder.course.config import CHECK_ORDER, load_course
from autograder.grading import smallest_case
from autograder.grading.experiments import reference_parts, run_reference
from autograder.grading.scoring import seed_for
from autograder.grading.suite_files import suite_checks
from autograder.notebooks.examples import examples, release_notebook, solved_sources, with_cells
from autograder.sandbox.grader_side import Fresh, Remote, Seeded
from autograder.sandbox.state import assign_state


class LocalStudent:
    """The suite's view of a student, answered by the reference in this process (the bare compute)."""

    def __init__(self, ref, seed):
        self.ref, self.seed, self.device, self.label = ref, seed, "cpu", ""

    def case(self, label):
        self.label = label

    def _local(self, v):
        if isinstance(v, Seeded):
            return torch.Generator().manual_seed(v.seed)
        if isinstance(v, Fresh):
            mod = getattr(torch.nn, v.cls)(*v.args, **v.kwargs)
            with torch.no_grad():
                for t, s in zip(mod.state_dict().values(), v.state, strict=True):
                    t.copy_(s)
            return mod
        if isinstance(v, Remote):
            return v.obj
        if isinstance(v, (list, tuple)):
            return type(v)(self._local(x) for x in v)
        if isinstance(v, dict):
            return {k: self._local(x) for k, x in v.items()}
        return v

    def _wrap(self, v):
        if isinstance(v, torch.nn.Module):
            r = Remote("local", type(v).__name__)
            r.obj = v
            return r
        if isinstance(v, torch.Tensor):
            v = v.detach().clone()
            v.student_device = "cpu"
            return v
        if isinstance(v, (list, tuple)):
            return type(v)(self._wrap(x) for x in v)
        if isinstance(v, dict):
            return {k: self._wrap(x) for k, x in v.items()}
        return v

    def call(self, name, *args, **kwargs):
        torch.manual_seed(self.seed)
        fn = name.obj if isinstance(name, Remote) else getattr(self.ref, name)
        with torch.no_grad():
            return self._wrap(fn(*self._local(args), **self._local(kwargs)))

    def method(self, obj, method, *args, **kwargs):
        torch.manual_seed(self.seed)
        with torch.no_grad():
            return self._wrap(getattr(obj.obj, method)(*self._local(args), **self._local(kwargs)))

    def grad(self, name, args, wrt, upstream, method=None, **kwargs):
        args = [a.clone().requires_grad_(True) if j in wrt else a for j, a in enumerate(self._local(list(args)))]
        fn = getattr(name.obj, method) if isinstance(name, Remote) else getattr(self.ref, name)
        out = fn(*args, **self._local(kwargs))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        total = sum((o * u).sum() for o, u in zip(outs, upstream, strict=False) if u is not None)
        grads = torch.autograd.grad(total, [args[j] for j in wrt], allow_unused=True)
        return self._wrap(out), self._wrap(tuple(grads))

    def new(self, name, *args, **kwargs):
        torch.manual_seed(self.seed)
        return self._wrap(getattr(self.ref, name)(*self._local(args), **self._local(kwargs)))

    def state(self, obj):
        return {k: v.detach().clone() for k, v in obj.obj.state_dict().items()}

    def load_state(self, obj, tensors):
        assign_state(obj.obj, list(tensors))

    def attr(self, target, attr):
        return self._wrap(getattr(target.obj if isinstance(target, Remote) else getattr(self.ref, target), attr))

    def signature(self, name, methods=()):
        return {}


def bare(aid, with_experiments):
    """item -> seconds for the checks run in-process, plus the experiments run directly."""
    course = load_course()
    assignment, ref = course.assignment(aid), reference_parts(aid)
    module, checks = suite_checks(aid)
    out = {}
    for item, spec in assignment.items.items():
        t0 = time.perf_counter()
        for kind in CHECK_ORDER:
            for name in checks.get((item, kind), []) if kind in spec.points else []:
                seed = seed_for(course.seed, aid, item, kind)
                getattr(module, name)(LocalStudent(ref, seed), torch.Generator().manual_seed(seed))
        if with_experiments:
            for exp in assignment.experiments_of(item):
                run_reference(aid, exp.name, device="cpu")
        out[item] = time.perf_counter() - t0
    return out


def graded(aid, with_experiments, device="cpu", nb=None):
    """item -> seconds the real grader spent (sandbox and all), from results.json's per-test times; the wall time;
    and the smallest-case searches run. `nb`: the notebook to grade (default: the complete solution)."""
    from autograder.grading.grade import grade_notebook
    complete = nb is None
    searches_before = len(smallest_case.SEARCHES)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{aid}.ipynb"
        nbformat.write(with_cells(release_notebook(aid), solved_sources(aid)) if complete else nb, path)
        t0 = time.perf_counter()
        result = grade_notebook(path, aid, device=device, experiments=with_experiments)
        wall = time.perf_counter() - t0
    per_item = {}
    for t in result["tests"]:
        per_item[t["item"]] = per_item.get(t["item"], 0.0) + t["seconds"]
    assert not complete or result["score"] == result["max_score"], "the reference must score full marks"
    return per_item, wall, smallest_case.SEARCHES[searches_before:]


def print_partly_right(aid, complete, searches, with_exp, device):
    """The partly-right submission's items beside the complete one's, with each item's search seconds."""
    per_item, wall, found = graded(aid, with_exp, device, examples(aid)["partly_right"])
    spent = {}
    for item, seconds, _ in found:
        spent[item] = spent.get(item, 0.0) + seconds
    print(f"  partly right: graded in {wall:.1f} s wall; searches {len(found)} (budget "
          f"{smallest_case.BUDGET_S:g} s per item); the complete submission ran {len(searches)}")
    print(f"  {'item':<30}{'complete s':>11}{'partly s':>10}{'search s':>10}{'extra / budget':>16}")
    for item in per_item:
        c, p, s = complete.get(item, float("nan")), per_item[item], spent.get(item, 0.0)
        print(f"  {item:<30}{c:>11.2f}{p:>10.2f}{s:>10.2f}{(p - c) / smallest_case.BUDGET_S:>16.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("ids", nargs="*")
    parser.add_argument("--no-experiments", action="store_true")
    parser.add_argument("--no-bare", action="store_true", help="skip the in-process column (it doubles the run)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda: where the graded and the lecture's training run")
    parser.add_argument("--partly-right", action="store_true",
                        help="also grade the demo's partly-right submission: the cost of the smallest-case searches")
    args = parser.parse_args()
    os.environ["COURSE_NO_CACHE"] = "1"  # measure the training, not the cache
    with_exp = not args.no_experiments
    rows = []
    for aid in args.ids or load_course().assignments:
        per_item_bare = {} if args.no_bare else bare(aid, with_exp)
        per_item_graded, wall, searches = graded(aid, with_exp, args.device)
        lecture = lecture_seconds(aid, args.device) if with_exp else float("nan")
        total_bare = sum(per_item_bare.values()) if per_item_bare else float("nan")
        print(f"\n{aid}: graded in {wall:.1f} s wall, bare compute {total_bare:.1f} s, lecture {lecture:.1f} s")
        print(f"  {'item':<30}{'graded s':>10}{'bare s':>10}{'ratio':>8}")
        for item in per_item_graded:
            g, b = per_item_graded[item], per_item_bare.get(item, float("nan"))
            print(f"  {item:<30}{g:>10.2f}{b:>10.2f}{(g / b if b > 0 else float('nan')):>8.1f}")
        if args.partly_right:
            print_partly_right(aid, per_item_graded, searches, with_exp, args.device)
        rows.append((aid, wall, total_bare, lecture))
    print(f"\n{'assignment':<26}{'graded s':>10}{'bare s':>10}{'ratio':>8}{'lecture s':>11}{'graded / lecture':>18}")
    for aid, wall, b, lec in rows:
        print(f"{aid:<26}{wall:>10.1f}{b:>10.1f}{wall / b:>8.2f}{lec:>11.1f}{wall / lec:>18.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
