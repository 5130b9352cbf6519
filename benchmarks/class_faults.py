"""A class on Dask with faults (issue #54): a lab14 class graded through `course grade --cluster local --jobs 2`,
undisturbed and with workers dying, one hanging and the coordinator killed, against the process pool.

The class (make_class): SIZE submissions, each a program of its own (a statement of its own in every graded cell:
the training cache never has another's run), 40% complete (they train), 30% partly done (one to all-but-one items),
20% the release, 10% broken (a syntax error, a cell raising at load, a file that is not JSON, an empty file, and
one endless function, which runs into the item's time limit).

Rows (each in this one run, the machine's drift shared):
  pool     `--workers 2`, the process pool: the reference scores and the yardstick of the wall time
  dask     `--cluster local --jobs 2` undisturbed: wall / pool's (goal <= 1.1), the same scores; the coordinator's
           CPU per submission (its own process: our loop, Dask's scheduler and the nannies) and its peak memory;
           per submission, a result's delay from the task's end on its worker to its file in the results folder
           (a worker preload, benchmarks/task_ends.py, writes the end)
  faults   the same command while a killer SIGKILLs a busy worker at random moments (every 15-45 s) and SIGSTOPs
           one (a hang, which the scheduler's worker-ttl ends); halfway the coordinator is SIGKILLed, nothing of
           it may be left 10 s later, and the same command is run again: every submission ends with exactly one
           result, the pool's scores, and no result of the first run is written again. The killer hits each
           submission's grading at most once: a grading hit twice is the blame path (scheduler.py KILLS_TO_BLAME),
           which tests/test_cluster.py covers
  memory   the coordinator's peak memory and CPU over MEMORY release notebooks and ten times as many (goal: peak
           grows < 10%, marginal CPU <= 20 ms a submission)

Between rows the training cache is put back to what the warm-up left (the reference's curves), so that every row
trains every submission.

    python benchmarks/class_faults.py [--size 300] [--rows pool dask faults memory] [--memory 300]
"""
import argparse
import json
import logging
import random
import sys
import tempfile
import time
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' fault helpers, run from anywhere
from autograder.notebooks.examples import release_notebook  # noqa: E402
from tests.class_faults import (  # noqa: E402
    ENV,
    LAB,
    LEFT_AFTER,
    ROOT,
    Coordinator,
    killed_halfway_and_rerun,
    make_class,
    name_of,
)
from tests.test_batch import stable  # noqa: E402

CACHE = ROOT / ".grader" / "cache"
KILL_EVERY = (15, 45)   # seconds between the killer's blows: at least one a minute
DASK = ["--cluster", "local", "--jobs", "2"]


def release_class(folder, size):
    """`size` copies of the release notebook (the memory row)."""
    data = nbformat.writes(release_notebook(LAB))
    for k in range(size):
        (folder / f"student{k:05d}").mkdir(parents=True)
        (folder / f"student{k:05d}" / f"{LAB}.ipynb").write_text(data)


def reset_cache(kept):
    """The training cache back to what the warm-up left."""
    for path in CACHE.glob("*.json"):
        if path.name not in kept:
            path.unlink()


def results_of(log):
    return {r["submission"]: r for r in stable(json.loads(Path(log).with_suffix(".json").read_text()))}


def task_delays(ends_file, results):
    """Seconds from each task's end on its worker to its result file's time (the last end of each submission)."""
    ends = {}
    for line in Path(ends_file).read_text().splitlines():
        key, when = line.split("\t")
        ends[name_of(key)] = max(ends.get(name_of(key), 0.0), float(when))
    return sorted((results / f"{name}.json").stat().st_mtime - t for name, t in ends.items()
                  if (results / f"{name}.json").exists())


def main():
    rows = ["pool", "dask", "faults", "memory"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=300)
    parser.add_argument("--rows", nargs="+", choices=rows, default=rows)
    parser.add_argument("--memory", type=int, default=300, help="the memory row's smaller class (and 10x it)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.getLogger("distributed").setLevel(logging.CRITICAL)  # the killer's client as its cluster dies
    run, rng = f"{int(time.time())}", random.Random(args.seed)
    say = lambda line: print(line, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="class-faults-") as tmp:
        tmp = Path(tmp)
        kinds = make_class(tmp / "class", args.size, run)
        say(f"class: {args.size} lab14 submissions: " + ", ".join(
            f"{sum(k == kind for k in kinds.values())} {kind}" for kind in dict.fromkeys(kinds.values())))
        warm = Coordinator(tmp / "class" / "student0000", LAB, tmp / "warm-r", ["--workers", "1"], tmp / "warm.err")
        warm.wait()  # the reference curves into the cache, as on a TA's machine (not timed)
        kept = {p.name for p in CACHE.glob("*.json")}
        pool, pool_wall = None, float("nan")
        if {"pool", "dask", "faults"} & set(args.rows):
            c = Coordinator(tmp / "class", LAB, tmp / "pool-r", ["--workers", "2"], tmp / "pool.err")
            code = c.wait()
            pool, pool_wall = results_of(tmp / "pool.err"), c.wall
            say(f"pool: {c.wall:.0f} s (exit {code}), {len(pool)} results")
            reset_cache(kept)
        if "dask" in args.rows:
            ends = tmp / "ends.tsv"
            env = {**ENV, "COURSE_BENCH_TASK_ENDS": str(ends),
                   "DASK_DISTRIBUTED__WORKER__PRELOAD": json.dumps([str(ROOT / "benchmarks" / "task_ends.py")])}
            c = Coordinator(tmp / "class", LAB, tmp / "dask-r", DASK, tmp / "dask.err", env)
            code = c.wait()
            same = results_of(tmp / "dask.err") == pool
            delays = task_delays(ends, tmp / "dask-r")
            say(f"dask: {c.wall:.0f} s (exit {code}), {c.wall / pool_wall:.2f}x the pool; same scores: {same}; "
                f"coordinator CPU {c.cpu:.1f} s ({1000 * c.cpu / args.size:.1f} ms a submission), peak "
                f"{c.peak_kb / 1024:.0f} MB; task end to file: median {1000 * delays[len(delays) // 2]:.0f} ms, "
                f"max {1000 * delays[-1]:.0f} ms over {len(delays)}")
            reset_cache(kept)
        if "faults" in args.rows:
            faults(tmp, args.size, pool, rng, say)
            reset_cache(kept)
        if "memory" in args.rows:
            figures = []
            for n in (args.memory, 10 * args.memory):
                release_class(tmp / f"release{n}", n)
                c = Coordinator(tmp / f"release{n}", LAB, tmp / f"mem{n}-r", DASK,
                                tmp / f"mem{n}.err")
                code = c.wait()
                figures.append((n, c.cpu, c.peak_kb, c.wall))
                say(f"memory: {n} release notebooks: {c.wall:.0f} s (exit {code}), coordinator CPU {c.cpu:.1f} s, "
                    f"peak {c.peak_kb / 1024:.0f} MB")
            (small, cpu0, peak0, _), (large, cpu1, peak1, _) = figures
            say(f"memory: peak grows {100 * (peak1 - peak0) / peak0:.1f}% from {small} to {large}; marginal "
                f"coordinator CPU {1000 * (cpu1 - cpu0) / (large - small):.1f} ms a submission")


def faults(tmp, size, pool, rng, say):
    report = killed_halfway_and_rerun(tmp / "class", LAB, tmp / "faults-r", DASK, tmp / "faults", rng, KILL_EVERY,
                                      size // 2)
    final = results_of(tmp / "faults2.err")
    differ = sorted(n for n in pool if final.get(n) != pool[n])
    gaps = [b[0] - a[0] for a, b in zip(report.blows, report.blows[1:], strict=False)]
    say(f"faults: coordinator SIGKILLed {report.killed_after:.0f} s in, with {report.saved} results saved; "
        f"{LEFT_AFTER} s later left: {report.left or 'nothing'}")
    say(f"faults: rerun exit {report.code}, {report.wall:.0f} s in all; {len(report.blows)} blows "
        f"({sum(b[2] == 'SIGSTOP' for b in report.blows)} SIGSTOP), longest gap {max(gaps, default=0):.0f} s; "
        f"{len(final)} results, {len(differ)} differ from the pool's {differ[:5]}; first run's results written "
        f"again: {len(report.rewritten)}; rerun: {report.graded} graded, {report.reused} reused")
    say("faults: blows: " + "; ".join(f"{t:.0f}s {name} {sig}" for t, name, sig in report.blows))


if __name__ == "__main__":
    main()
