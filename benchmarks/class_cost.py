"""The warm cost of one graded submission of each assignment: the figures docs/CLUSTER.md's cost model uses.

For each assignment, in a fresh process each (so that each peak is its own): `course grade --workers 1` of the
release alone (the grader's start: torch, the zygote, the data; nothing trains) and of the release plus one complete
submission (a program of its own: it trains every graded experiment; the reference's curves come from the cache, as
on a TA's machine after the first grading). The difference is one warm grading: CPU-seconds of the whole process
tree (every thread of every process) and wall seconds. Peak memory is the largest single process of the tree (the
grader, or a sandbox while it trains), from the kernel's accounting of the processes waited for.

    python benchmarks/class_cost.py [ID ...] [--device cuda]
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from autograder.course.config import load_course
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells

ROOT = Path(__file__).resolve().parents[1]
MEASURE = r"""
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
wall = time.perf_counter() - t0
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"code": code, "wall": wall, "cpu": r.ru_utime + r.ru_stime, "peak_mb": r.ru_maxrss / 1024}))
"""


def measured(paths, aid, device):
    """{code, wall, cpu, peak_mb} of one `course grade --workers 1` in a process of its own."""
    argv = [sys.executable, "-m", "autograder.cli", "grade", *map(str, paths), "-a", aid, "--device", device,
            "--workers", "1"]
    out = subprocess.run([sys.executable, "-c", MEASURE, *argv], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ids", nargs="*")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    run = f"{int(time.time())}"
    with tempfile.TemporaryDirectory(prefix="class-cost-") as tmp:
        tmp = Path(tmp)
        for aid in args.ids or list(load_course().assignments):
            release = tmp / aid / "release" / f"{aid}.ipynb"
            complete = tmp / aid / "complete" / f"{aid}.ipynb"
            for path in (release, complete):
                path.parent.mkdir(parents=True)
            nbformat.write(release_notebook(aid), release)
            cells = {item: f"{source}\n_submission = {run!r}\n" for item, source in solved_sources(aid).items()}
            nbformat.write(with_cells(release_notebook(aid), cells), complete)
            measured([release], aid, args.device)  # the page cache and the reference's curves, not counted
            start = measured([release], aid, args.device)
            both = measured([release, complete], aid, args.device)
            print(f"{aid}: one warm grading {both['cpu'] - start['cpu']:.1f} CPU-s, "
                  f"{both['wall'] - start['wall']:.1f} s wall; the grader's start {start['cpu']:.1f} CPU-s, "
                  f"{start['wall']:.1f} s wall; peak {both['peak_mb']:.0f} MB (start alone {start['peak_mb']:.0f} MB); "
                  f"exit {both['code']}", flush=True)


if __name__ == "__main__":
    main()
