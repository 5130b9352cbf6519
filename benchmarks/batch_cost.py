"""Batch cost: a class's submissions graded with 1 and with N worker processes, against the lecture's own run.

Four complete lab14 submissions (cache off) through `course grade`, once per worker count, and the lecture's
two-epoch memory-task loop (benchmarks/lecture_loops.py), all in this one run, so the per-submission ratio to the
lecture is comparable on a shared machine. The goal (issue #11): <= 0.8x the lecture's run per submission.

    python benchmarks/batch_cost.py [--submissions 4] [--workers 1 2] [--device cuda]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from lecture_loops import lecture_seconds

from autograder.notebooks.examples import release_notebook, solved_sources, with_cells

AID = "lab14_transformers"


def batch_seconds(folder, workers, device="cpu"):
    """Wall time of `course grade` over the folder (a fresh process, as a TA runs it)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autograder.cli", "grade", str(folder), "-a", AID, "--device", device,
                    "--workers", str(workers)],
                   check=True, capture_output=True, env={**os.environ, "COURSE_NO_CACHE": "1"})
    return time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=4)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--device", default="cpu", help="cpu or cuda: where the graded and the lecture's training run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.submissions):  # identical code, so each trains in full (the cache is off)
            (Path(tmp) / f"student{k}").mkdir()
            nbformat.write(with_cells(release_notebook(AID), solved_sources(AID)),
                           Path(tmp) / f"student{k}" / f"{AID}.ipynb")
        lecture = lecture_seconds(AID, args.device)
        print(f"lecture's own run ({AID}): {lecture:.1f} s")
        print(f"{'workers':>7} {'batch s':>8} {'per submission s':>17} {'/ lecture':>9}")
        for workers in args.workers:
            wall = batch_seconds(tmp, workers, args.device)
            per = wall / args.submissions
            print(f"{workers:>7} {wall:>8.1f} {per:>17.1f} {per / lecture:>9.2f}")


if __name__ == "__main__":
    main()
