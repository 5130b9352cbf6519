"""How long a class's per-check statistics take: `course stats` and `course report --json` on a results folder of N
synthetic submissions (tests/synthetic_class.py: results.json written as the grader writes them, from the planted
mistakes, the correct alternatives and the reference), nothing graded.

Each command runs as a program of its own, as a TA runs it: the wall time includes Python's start and the imports
(torch's among them, for the cache keys of the reference's figures); CPU time is the command's own (its children's
rusage). The in-process figure is the statistics alone (reading the folder and computing), imports done.

    python benchmarks/check_stats.py [-n 1000] [-a ID ...]
"""
import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.synthetic_class import build_class  # noqa: E402

COURSE = [sys.executable, "-m", "autograder.cli"]


def timed(command):
    """(wall seconds, CPU seconds) of one command, run to its end; its output is checked, not shown."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def in_process(folder, aid):
    """Seconds to read the folder and compute its statistics in this process (imports and course.yaml warm)."""
    from autograder.reports.class_stats import assignment_stats
    from autograder.reports.results_folder import load_results
    assignment_stats(aid, load_results(folder)[:5])  # imports, course.yaml, the cache keys' first computation
    t0 = time.perf_counter()
    stats = assignment_stats(aid, load_results(folder))
    return time.perf_counter() - t0, stats


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000, help="submissions in the class (default 1000)")
    parser.add_argument("-a", "--assignment", action="append", help="default: lab14_transformers and "
                        "w8l1_attention_vision (21 items, the largest results)")
    args = parser.parse_args()
    for aid in args.assignment or ["lab14_transformers", "w8l1_attention_vision"]:
        with tempfile.TemporaryDirectory(prefix="course-stats-bench-") as tmp:
            folder = Path(tmp) / aid
            t0 = time.perf_counter()
            build_class(folder, args.n, aid)
            size = sum(p.stat().st_size for p in folder.glob("*.json")) / 1e6
            print(f"{aid}: {args.n} results, {size:.1f} MB, written in {time.perf_counter() - t0:.1f} s", flush=True)
            seconds, stats = in_process(folder, aid)
            print(f"  statistics in process: {seconds:.2f} s ({len(stats.checks)} checks, {len(stats.flags)} flagged)")
            wall, cpu = timed([*COURSE, "stats", str(folder), "-a", aid])
            print(f"  course stats DIR -a {aid}: {wall:.2f} s wall, {cpu:.2f} CPU-s", flush=True)
            page, out = Path(tmp) / "report.html", Path(tmp) / "stats.json"
            wall, cpu = timed([*COURSE, "report", str(folder), "-o", str(page), "--json", str(out)])
            print(f"  course report DIR --json FILE (the whole page, its plots and the JSON): {wall:.2f} s wall, "
                  f"{cpu:.2f} CPU-s", flush=True)


if __name__ == "__main__":
    main()
