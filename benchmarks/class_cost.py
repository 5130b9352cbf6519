"""The warm cost of one graded submission of each assignment: the figures docs/CLUSTER.md's cost model uses.

For each assignment, in a fresh process each (so that each peak is its own): `course grade --workers 1` of the
release alone (the grader's start: torch, the zygote, the data; nothing trains) and of the release plus one complete
submission (a program of its own: it trains every graded experiment; the reference's curves come from the cache, as
on a TA's machine after the first grading). The difference is one warm grading: CPU-seconds of the whole process
machine (/proc/stat's busy time: every process, the sandboxes the zygote forks included, so run it on an idle
machine) and wall seconds. Peak memory is the machine's memory in use above what it was before the command
(/proc/meminfo, sampled every 0.1 s): the grader, its zygote and the sandbox training, together.

    python benchmarks/class_cost.py [ID ...] [--device cuda]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from autograder.course.config import load_course
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def busy_seconds():
    """The machine's busy CPU-seconds since boot (user, nice, system, irq, softirq, steal)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return (sum(fields[:3]) + sum(fields[5:8])) / TICK


def used_mb():
    info = dict(line.split(":") for line in Path("/proc/meminfo").read_text().splitlines())
    return (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) / 1024


def measured(paths, aid, device):
    """{code, wall, cpu, peak_mb} of one `course grade --workers 1` (module doc)."""
    argv = [sys.executable, "-m", "autograder.cli", "grade", *map(str, paths), "-a", aid, "--device", device,
            "--workers", "1"]
    before, idle, t0 = busy_seconds(), used_mb(), time.perf_counter()
    proc, peak = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), 0.0
    while proc.poll() is None:
        peak = max(peak, used_mb() - idle)
        time.sleep(0.1)
    return {"code": proc.returncode, "wall": time.perf_counter() - t0, "cpu": busy_seconds() - before,
            "peak_mb": peak}


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
                  f"{start['wall']:.1f} s wall; peak {both['peak_mb']:.0f} MB above idle (start alone "
                  f"{start['peak_mb']:.0f} MB); "
                  f"exit {both['code']}", flush=True)


if __name__ == "__main__":
    main()
