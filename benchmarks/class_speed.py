"""Class speed: what grading a class costs, each figure a ratio to the lecture's own training measured in this run.

These machines are shared and their speed drifts, so nothing here is an absolute time: each row is timed beside
its yardstick in the same run (the lecture notebook's own training loop, benchmarks/lecture_loops.py, measured
before and after the rows and averaged), and the ratio is the figure. The rows (issue #37's table; the goals are
issue #62's, which tightened #37's, and the last column says whether each is met):

  batch      4 complete lab14 submissions through `course grade DIR --workers 2` (and --workers 1): wall per
             submission / the lab's two-epoch loop                                          goal <= 0.4x at 2
  class      12 complete lab14 submissions, `--workers 2`: the same ratio over a batch three times as long, where
             the workers' start counts a third as much per submission (no goal: the steady state a class
             approaches)
  lab14      one `course grade` of a complete lab14 notebook / the same loop                goal <= 0.9x
  w8l4       one `course grade` of a complete w8l4 notebook / the lecture's 1000 steps      goal <= 0.7x
  fresh      the first w8l4 `course grade` on a fresh checkout (a copy of the course's tracked files, the
             committed .grader/curves among them, no training cache: fresh_checkout) / the lecture's 1000 steps
                                                                                            goal <= 1.2x
  untrained  the same with no cache at all, shipped curves included (COURSE_NO_CACHE=1): the reference's curves
             trained first, as where the committed ones are out of date (docs/DEVELOPING.md)  (no goal)
  frozen     a w8l4 notebook whose Transformer cannot learn (output layer frozen at zero) / the complete one
                                                                                            goal <= 1.5x
  hog        one lab14 `course grade` beside a busy process (one core spinning) / the same grading idle
                                                                                            goal <= 2.5x
  nbgrader   8 lab14 submissions through `nbgrader autograde` (the README's path, all cores) / the same with
             CourseAutograde.workers=1 (one after another), the same gradebook asserted     goal <= 0.6x
             (each twice, in the order all cores, one by one, one by one, all cores: the machine's drift over the
             four runs cancels out of the ratio of the sums). A mixed class: 3 complete notebooks, 3 with two
             items done, 2 of the release (only the complete ones train)
  nbgrader-complete
             the same with 8 complete notebooks (every one trains)                          goal <= 0.6x
  nbgrader-class
             the mixed class five times as large, 40 notebooks (no goal: where the nbgrader path goes as the
             start of its workers and its collecting walk count less per notebook)
  start      the CPU-seconds of a grader's fixed start: `course grade` of the release (stubs, nothing trains),
             with 1 worker and with 2 (per worker)

Every grading is a fresh process, as a TA runs it, and every submission trains: each is a distinct program (a
statement of its own in every graded cell, so the training cache never has its runs). The cache stays on, as a
TA's does, for what is the course's and not the submission's: the reference's validation curves that a hopeless
run is judged against (grading/experiments.py), computed by a warm-up grading of each assignment, not timed, as
the first grading on a machine computes them.

    python benchmarks/class_speed.py [--rows batch class lab14 w8l4 fresh untrained frozen hog nbgrader
                                             nbgrader-complete
                                             nbgrader-class start]

After any change to grading (docs/DEVELOPING.md) run it on a quiet machine, and `benchmarks/grading_profile.py` on
any: the profile's CPU-seconds say which phase moved, these ratios whether the goals still hold.
                                     [--device cuda]
"""
import argparse
import multiprocessing
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import nbformat
from lecture_loops import lecture_seconds

from autograder.notebooks.examples import release_notebook, solved_sources, with_cells

ROOT = Path(__file__).resolve().parents[1]
ENV = {**{k: v for k, v in os.environ.items() if k != "COURSE_NO_CACHE"}, "PYTHONPATH": str(ROOT)}
LAB, W8L4 = "lab14_transformers", "w8l4_transformers"
# the w8l4 Transformer with its output layer frozen at zero: every logit 0, nothing can be learnt
FROZEN = ("self.out = nn.Linear(d_model, vocab)",
          "self.out = nn.Linear(d_model, vocab)\n        nn.init.zeros_(self.out.weight)\n"
          "        nn.init.zeros_(self.out.bias)\n        self.out.requires_grad_(False)")


def write(folder, name, aid, sources=None):
    """A submission `name` of `aid` (the release with `sources` filled in) under folder/name/<aid>.ipynb."""
    path = Path(folder) / name / f"{aid}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(with_cells(release_notebook(aid), sources) if sources else release_notebook(aid), path)
    return path


RUN = uuid.uuid4().hex[:8]  # this run's submissions are programs no earlier run graded (its results are cached)


def solved(aid, tag, items=None):
    """The reference's cells (of `items`), each with a statement of its own: a program no other submission is."""
    return {item: f"{source}\n_submission = {RUN + tag!r}\n" for item, source in solved_sources(aid, items).items()}


def frozen_sources():
    sources = solved(W8L4, "frozen")
    assert FROZEN[0] in sources["Transformer"], "the reference Transformer's output layer is not where it was"
    sources["Transformer"] = sources["Transformer"].replace(*FROZEN)
    return sources


def fresh_checkout(folder, shipped=True, root=ROOT):
    """The environment of a `course grade` in a course folder as a fresh clone of `root` has it: course.yaml, the
    release, the data and (`shipped`) the committed reference curves (.grader/curves), no training cache of the
    course's or the user's."""
    folder, root = Path(folder), Path(root)
    for name in ("course.yaml", "release", "data", *([".grader/curves"] if shipped else [])):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        if (root / name).exists():
            (shutil.copytree if (root / name).is_dir() else shutil.copy)(root / name, folder / name)
    env = {k: v for k, v in ENV.items() if k != "COURSE_CACHE_DIR"}  # no shared cache folder either
    return {**env, "COURSE_ROOT": str(folder), "XDG_CACHE_HOME": str(folder / "user-cache")}


def timed(command, cwd=ROOT, env=ENV):
    """(wall seconds, CPU seconds of the command's whole process tree) of a command that must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):  # 1: some submission lost points, which is what the rows grade
        sys.exit(f"{' '.join(map(str, command))} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def course_grade(paths, aid, workers=1, device="cpu", env=ENV):
    return timed([sys.executable, "-m", "autograder.cli", "grade", *map(str, paths), "-a", aid, "--device", device,
                  "--workers", str(workers)], env=env)


def hog():
    """One core kept busy until killed."""
    while True:
        pass


def nbgrader_class(tmp, n, workers, tag="", complete=False):
    """(wall, scores) of `nbgrader autograde` over n lab14 submissions (mixed, or all `complete`) in a fresh copy of
    the course."""
    course = Path(tmp) / f"course-{workers}{tag}"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    for rel in filter(None, files.stdout.split("\0")):
        if (ROOT / rel).is_file():
            (course / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, course / rel)
    if (ROOT / ".grader" / "cache").is_dir():  # the warm-up's reference curves, as on the machine of a TA
        shutil.copytree(ROOT / ".grader" / "cache", course / ".grader" / "cache")
    for k in range(n):
        kinds = [solved(LAB, f"nb{k}"), solved(LAB, f"nb{k}", ["scaled_dot_product_attention", "PositionalEncoding"])]
        write(course / ".nbgrader" / "submitted" / f"student{k}", LAB, LAB, kinds[0] if complete else
              (kinds + [None])[k % 3])
    env = {**ENV, "PYTHONPATH": str(course), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    timed(["course", "release", LAB], cwd=course, env=env)
    wall, _ = timed(["nbgrader", "autograde", LAB, f"--CourseAutograde.workers={workers}"], cwd=course, env=env)
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course}/.nbgrader/gradebook.db") as gb:
        scores = {s.student.id: s.score for s in gb.find_assignment(LAB).submissions}
    return wall, scores


def main():
    rows = ["batch", "class", "lab14", "w8l4", "fresh", "untrained", "frozen", "hog", "nbgrader", "nbgrader-complete",
            "nbgrader-class", "start"]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", choices=rows, default=rows)
    parser.add_argument("--device", default="cpu", help="cpu or cuda: where the graded and the lecture's training run")
    args = parser.parse_args()
    lectures = {LAB: [], W8L4: []}
    want_w8l4 = {"w8l4", "fresh", "untrained", "frozen"} & set(args.rows)
    for aid in lectures:  # only the yardsticks a row divides by
        if (aid == LAB and {"batch", "class", "lab14"} & set(args.rows)) or \
                (aid == W8L4 and {"w8l4", "fresh", "untrained"} & set(args.rows)):
            lectures[aid].append(lecture_seconds(aid, args.device))
    figures = []  # (row, seconds, per: an assignment whose lecture divides it, or seconds, goal, detail)

    def say(row, seconds, per, goal, detail):
        figures.append((row, seconds, per, goal, detail))
        print(f"{row:<9} {detail}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for aid in (LAB, W8L4) if want_w8l4 else (LAB,):  # the reference curves, into the cache (not timed)
            course_grade([write(tmp / "warm-up", "warm-up", aid, solved(aid, "warm-up"))], aid, 1, args.device)
        complete_lab = write(tmp / "one", "complete", LAB, solved(LAB, "complete"))
        complete_w8l4 = write(tmp / "one", "complete", W8L4, solved(W8L4, "complete"))
        if "batch" in args.rows:
            for k in range(4):
                write(tmp / "batch", f"student{k}", LAB, solved(LAB, f"batch{k}"))
            two, _ = course_grade([tmp / "batch"], LAB, 2, args.device)
            for k in range(4):  # the same class again, one worker: other programs, so that each trains again
                write(tmp / "batch1", f"student{k}", LAB, solved(LAB, f"batch1-{k}"))
            one, _ = course_grade([tmp / "batch1"], LAB, 1, args.device)
            say("batch", two / 4, LAB, "<= 0.4",
                f"4 lab14: {two:.1f} s at --workers 2, {one:.1f} s at 1 ({one / two:.2f}x faster)")
        if "class" in args.rows:
            for k in range(12):
                write(tmp / "class", f"student{k}", LAB, solved(LAB, f"class{k}"))
            wall, _ = course_grade([tmp / "class"], LAB, 2, args.device)
            say("class", wall / 12, LAB, "-", f"12 lab14: {wall:.1f} s at --workers 2")
        idle = None
        if {"lab14", "hog"} & set(args.rows):
            idle, _ = course_grade([complete_lab], LAB, 1, args.device)
            say("lab14", idle, LAB, "<= 0.9", f"one lab14: {idle:.1f} s")
        if want_w8l4:
            complete, _ = course_grade([complete_w8l4], W8L4, 1, args.device)
            say("w8l4", complete, W8L4, "<= 0.7", f"one w8l4: {complete:.1f} s")
            if "fresh" in args.rows:  # another program, in a fresh checkout: the committed curves, no cache
                fresh, _ = course_grade([write(tmp / "fresh", "fresh", W8L4, solved(W8L4, "fresh"))], W8L4, 1,
                                        args.device, fresh_checkout(tmp / "checkout"))
                say("fresh", fresh, W8L4, "<= 1.2", f"the first w8l4 on a fresh checkout: {fresh:.1f} s")
            if "untrained" in args.rows:  # no cache at all: the reference's curves train first
                untrained, _ = course_grade([write(tmp / "untrained", "untrained", W8L4, solved(W8L4, "untrained"))],
                                            W8L4, 1, args.device, {**ENV, "COURSE_NO_CACHE": "1"})
                say("untrained", untrained, W8L4, "-", f"the first w8l4 with no curve to read: {untrained:.1f} s")
            if "frozen" in args.rows:
                frozen, _ = course_grade([write(tmp / "frozen", "frozen", W8L4, frozen_sources())], W8L4, 1,
                                         args.device)
                say("frozen", frozen, complete, "<= 1.5",
                    f"frozen w8l4: {frozen:.1f} s, the complete one {complete:.1f} s")
        if "hog" in args.rows:
            busy = multiprocessing.Process(target=hog, daemon=True)
            busy.start()
            try:
                beside, _ = course_grade([write(tmp / "hog", "hog", LAB, solved(LAB, "hog"))], LAB, 1, args.device)
            finally:
                busy.kill()
            say("hog", beside, idle, "<= 2.5", f"lab14 beside one spinning core: {beside:.1f} s, idle {idle:.1f} s")
        for row, n, complete, goal in (("nbgrader", 8, False, "<= 0.6"), ("nbgrader-complete", 8, True, "<= 0.6"),
                                       ("nbgrader-class", 40, False, "-")):
            if row not in args.rows:
                continue
            # all cores, one by one, one by one, all cores: the machine's drift over the four runs cancels out
            walls, gradebooks = {0: [], 1: []}, []
            for k, workers in enumerate((0, 1, 1, 0)):
                wall, scores = nbgrader_class(tmp, n, workers, f"-{row}-{k}", complete)
                walls[workers].append(wall)
                gradebooks.append(scores)
            assert all(g == gradebooks[0] for g in gradebooks), f"the gradebooks differ: {gradebooks}"
            parallel, serial = (sum(walls[w]) / 2 for w in (0, 1))
            say(row, parallel, serial, goal,
                f"{n} {'complete' if complete else 'mixed'} lab14 through nbgrader: {parallel:.1f} s on all cores, "
                f"{serial:.1f} s one by one (means of {', '.join(f'{w:.1f}' for w in walls[0])} and "
                f"{', '.join(f'{w:.1f}' for w in walls[1])} s, run all-one-one-all); same gradebook")
        if "start" in args.rows:
            for k in range(2):
                write(tmp / "stubs", f"student{k}", LAB)
            _, cpu_one = course_grade([tmp / "stubs" / "student0"], LAB, 1, args.device)
            _, cpu_two = course_grade([tmp / "stubs"], LAB, 2, args.device)
            print(f"start     CPU-seconds of fixed start: {cpu_one:.1f} s for one `course grade` of the release; "
                  f"{cpu_two / 2:.1f} s per worker at --workers 2 (two release notebooks)", flush=True)
    for aid in lectures:  # the yardstick again at the end: the machine's drift shows in the spread
        if lectures[aid]:
            lectures[aid].append(lecture_seconds(aid, args.device))
            print(f"lecture   {aid}: {', '.join(f'{s:.1f}' for s in lectures[aid])} s (start, end)")
    print("\n| row | ratio | goal | met | measured |\n|---|---|---|---|---|")
    for row, seconds, per, goal, detail in figures:
        base = sum(lectures[per]) / len(lectures[per]) if isinstance(per, str) else per
        against = f"; lecture {base:.1f} s" if isinstance(per, str) else ""
        met = "-" if goal == "-" else "yes" if seconds / base <= float(goal.split()[-1]) else "NO"
        print(f"| {row} | {seconds / base:.2f}x | {goal} | {met} | {detail}{against} |")


if __name__ == "__main__":
    main()
