"""Does a complete submission fit Gradescope's container? Wall time and peak memory on one core under a memory cap.

Each assignment's complete submission (release + reference bodies) is graded by `course grade` pinned to one
core (`taskset -c 0`) inside a memory cgroup of `--memory-mb` (cgroup v1 or v2, as root; without one the cap
is not applied and says so), training cache off, with the limits its Gradescope zip grades with (the course.yaml
`course export gradescope` writes: the `gradescope:` profile; `--course-limits` for the course's own). The
worst case (the load's limit plus every item's and every seed's limit) is printed beside the profile's budget.
Peak memory is the cgroup's own high-water mark (what a container's limit sees) and the largest sum of the
process tree's proportional set sizes seen in 0.25 s polls.

    python benchmarks/gradescope_fit.py [ID ...] [--memory-mb 3072] [--core 0]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from autograder.course.config import load_course
from autograder.integrations.gradescope import zip_course_yaml
from autograder.integrations.otter_plugin import load_seconds, worst_seconds
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from autograder.sandbox.grader_side import descendants, memory_bytes


def make_cgroup(name, memory_mb):
    """(folder, peak file) of a new memory cgroup capped at memory_mb, or (None, None) where none can be made."""
    for base, limit, peak in (("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.max_usage_in_bytes"),
                              ("/sys/fs/cgroup", "memory.max", "memory.peak")):
        folder = Path(base) / name
        try:
            folder.mkdir()
            (folder / limit).write_text(str(memory_mb * 2**20))
            return folder, folder / peak
        except OSError:
            continue
    return None, None


def measure(aid, memory_mb, core, folder, profile=True):
    nb = folder / aid / f"{aid}.ipynb"
    nb.parent.mkdir()
    env = {**os.environ, "COURSE_NO_CACHE": "1"}
    if profile:  # the zip's course.yaml; MNIST stays where the course has it
        config = folder / aid / "course.yaml"
        config.write_text(zip_course_yaml(load_course(), aid))
        env.update(COURSE_CONFIG=str(config), COURSE_MNIST_DIR=str(load_course().mnist_dir))
    nbformat.write(with_cells(release_notebook(aid), solved_sources(aid)), nb)
    cgroup, peak_file = make_cgroup(f"course-fit-{os.getpid()}-{aid}", memory_mb)
    enter = f"echo $$ > {cgroup / 'cgroup.procs'}; " if cgroup else ""
    cmd = (f"{enter}exec taskset -c {core} {sys.executable} -m autograder.cli grade {nb} -a {aid} "
           f"--device cpu --json {folder / (aid + '.json')}")
    t0, peak_pss = time.monotonic(), 0
    run = subprocess.Popen(["sh", "-c", cmd], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while run.poll() is None:
        peak_pss = max(peak_pss, memory_bytes([run.pid, *descendants(run.pid)]))
        time.sleep(0.25)
    wall = time.monotonic() - t0
    err = run.stderr.read()
    peak_cgroup = int(peak_file.read_text()) if peak_file else None
    for _ in range(50):  # the zygote and monitors leave a moment after the grader
        try:
            cgroup and cgroup.rmdir()
            break
        except OSError:
            time.sleep(0.2)
    if run.returncode != 0:
        return {"aid": aid, "error": err[-500:]}
    result = json.loads((folder / f"{aid}.json").read_text())
    return {"aid": aid, "wall_s": wall, "peak_pss_mb": peak_pss / 2**20,
            "peak_cgroup_mb": peak_cgroup / 2**20 if peak_cgroup else None, "capped": bool(cgroup),
            "score": f"{result['score']:g}/{result['max_score']:g}"}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("ids", nargs="*")
    parser.add_argument("--memory-mb", type=int, default=3072)
    parser.add_argument("--core", type=int, default=0)
    parser.add_argument("--course-limits", action="store_true", help="the course's limits, not the gradescope profile")
    args = parser.parse_args()
    course = load_course()
    ids = args.ids or list(course.assignments)
    limits = None if args.course_limits else course.gradescope.limits.model_dump(exclude_none=True)
    print(f"one core (cpu {args.core}), memory cap {args.memory_mb} MB, cache off, "
          f"{'course limits' if args.course_limits else 'gradescope profile'}; "
          f"budget {course.gradescope.budget_seconds:g} s")
    print(f"{'assignment':<26}{'wall s':>9}{'peak MB (cgroup)':>18}{'peak MB (PSS)':>15}{'score':>10}{'worst s':>9}")
    with tempfile.TemporaryDirectory(prefix="course-fit-") as tmp:
        for aid in ids:
            row = measure(aid, args.memory_mb, args.core, Path(tmp), profile=not args.course_limits)
            worst = load_seconds(course, aid, limits) + sum(worst_seconds(course, aid, i, limits)
                                                           for i in course.assignment(aid).items)
            if "error" in row:
                print(f"{aid:<26} failed: {row['error']}")
                continue
            cg = f"{row['peak_cgroup_mb']:.0f}" if row["peak_cgroup_mb"] else "n/a (no cgroup)"
            print(f"{aid:<26}{row['wall_s']:>9.1f}{cg:>18}{row['peak_pss_mb']:>15.0f}{row['score']:>10}{worst:>9.0f}",
                  flush=True)


if __name__ == "__main__":
    main()
