"""Fixed start of a batch: CPU-seconds and wall time from `course grade DIR --workers N` to each worker's first
sandbox, read from /proc while the batch runs.

A worker's first sandbox is the first process its zygote's monitor forks (the student's process, before it loads
the notebook). Its CPU-seconds are the worker's and its zygote's at that moment; the coordinator's are its own
(with one worker the coordinator is the worker: its CPU-seconds are counted there).

    python benchmarks/worker_start.py [--workers 2] [--course-src DIR]

--course-src runs another checkout's grader (e.g. an export of an older commit) on the same notebooks.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from autograder.notebooks.examples import release_notebook, solved_sources, with_cells

AID = "lab14_transformers"
TICK = os.sysconf("SC_CLK_TCK")


def table():
    """{pid: (ppid, cpu seconds, cmdline)} of every process now."""
    out = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out[int(name)] = (int(stat[1]), (int(stat[11]) + int(stat[12])) / TICK, cmdline)
    return out


def children(procs, pid):
    return [p for p, (ppid, _, _) in procs.items() if ppid == pid]


def measure(folder, workers, src):
    """{worker pid: (wall s, worker+zygote CPU s)} at each worker's first sandbox, and the coordinator's CPU s."""
    env = {**os.environ, "COURSE_NO_CACHE": "1", "PYTHONPATH": src}
    t0 = time.perf_counter()
    run = subprocess.Popen([sys.executable, "-m", "autograder.cli", "grade", str(folder), "-a", AID, "--workers",
                            str(workers), "--items", "scaled_dot_product_attention", "--device", "cpu"],
                           cwd=src, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first, coordinator_cpu = {}, 0.0
    try:
        while len(first) < workers and run.poll() is None:
            procs = table()
            coordinator_cpu = procs.get(run.pid, (0, coordinator_cpu, ""))[1]
            pool = [p for p in children(procs, run.pid) if "spawn_main" in procs[p][2]] if workers > 1 else [run.pid]
            for worker in pool:
                zygotes = [z for z in children(procs, worker) if "sandbox/child" in procs[z][2]]
                sandboxes = [s for z in zygotes for m in children(procs, z) for s in children(procs, m)]
                if worker not in first and sandboxes:
                    first[worker] = (time.perf_counter() - t0, procs[worker][1] + sum(procs[z][1] for z in zygotes))
            time.sleep(0.02)
    finally:
        run.wait()
    return first, coordinator_cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--course-src", default=str(Path(__file__).resolve().parents[1]))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.workers):
            (Path(tmp) / f"student{k}").mkdir()
            nbformat.write(with_cells(release_notebook(AID), solved_sources(AID)),
                           Path(tmp) / f"student{k}" / f"{AID}.ipynb")
        first, coordinator = measure(tmp, args.workers, args.course_src)
    if args.workers > 1:
        print(f"coordinator: {coordinator:.1f} CPU-s up to the last worker's first sandbox")
    for k, (wall, cpu) in enumerate(sorted(first.values())):
        print(f"worker {k}: first sandbox after {wall:.1f} s wall, {cpu:.1f} CPU-s (worker and its zygote)")
    print("(timings on a shared machine are rough: compare runs made one after another)")


if __name__ == "__main__":
    main()
