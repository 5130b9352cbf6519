"""`course doctor`: a preflight before a deadline, on one screen. What grading will use on this machine (isolation,
MNIST, device, experiment cache, versions), then the reference solutions graded as a submission is, with each
experiment's figure beside its threshold. Exit 0 only when all is well; each problem is one `FIX` line.
"""
import importlib.metadata
import os
import re
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager

import torch

from autograder.course.config import course_root, load_course
from autograder.course.mnist import data_source, describe_source, download_wanted, missing_message
from autograder.errors import ConfigError, GraderError, setup_problem
from autograder.grading.cache import cache_folders, cache_off
from autograder.grading.experiments import resolve_device
from autograder.grading.grade import grade_notebook
from autograder.notebooks.examples import write_solution
from autograder.reports.tables import lost_points
from autograder.sandbox.grader_side import Sandbox, SandboxFailure, StudentRaised, unisolated_allowed

# level -> (why grading gets it, what a higher level would need); the levels are sandbox/child/isolation.py's
LEVELS = {
    "namespaces": ("root with CAP_SYS_ADMIN: PID, mount and network namespaces, a root holding only the system and "
                   "the Python environment, a fresh uid", ""),
    "userns": ("not root, and ordinary users may make user namespaces: the same namespaces and root under the "
               "grader's own uid", "namespaces: grade as root"),
    "uid": ("root without CAP_SYS_ADMIN (a container's default): a fresh uid, Landlock walls off files and TCP",
            "namespaces: CAP_SYS_ADMIN (docker run --cap-add SYS_ADMIN, or grade outside the container)"),
    "uid-only": ("root without CAP_SYS_ADMIN, and the kernel has no Landlock: a fresh uid, files as that uid "
                 "finds them", "uid: a kernel with Landlock (5.13+, 'landlock' in /sys/kernel/security/lsm); "
                 "namespaces: CAP_SYS_ADMIN"),
    "landlock": ("not root, and user namespaces are refused (a seccomp profile, AppArmor): the grader's own uid "
                 "under Landlock", "userns: allow unprivileged user namespaces (Ubuntu 24.04: sysctl "
                 "kernel.apparmor_restrict_unprivileged_userns=0); namespaces: grade as root"),
    "process": ("neither root, user namespaces nor Landlock: nothing isolates the student's code",
                "landlock: a kernel with Landlock; userns: unprivileged user namespaces; namespaces: grade as root"),
}
PINNED = ("torch", "nbgrader", "otter-grader")
LOW_DISK_MB = 100    # below this, a batch's results and the cache may not fit
TIGHT = 0.1          # an experiment's margin under this share of its bound is shown as tight


class Findings:
    """What the doctor prints: a line per item as it is found, and each problem as a FIX line (each once)."""

    def __init__(self):
        self.problems = []

    def item(self, label, text):
        print(f"{label:<11} {text}", flush=True)

    def assignment(self, aid, text):
        print(f"  {aid:<22} {text}", flush=True)

    def fix(self, text):
        if text not in self.problems:
            self.problems.append(text)
            print(f"FIX         {text}", flush=True)


def doctor(quick=False, device="auto", aids=None):
    """Check the machine and grade the reference solutions of `aids` (all when none; without their experiments when
    `quick`)."""
    t0 = time.monotonic()
    course = load_course()
    unknown = [aid for aid in aids or () if aid not in course.assignments]
    if unknown:
        raise ConfigError(f"not in course.yaml: {', '.join(unknown)} (it has {', '.join(course.assignments)})")
    found = Findings()
    print(f"course doctor: {course_root()} ({course.path})", flush=True)
    isolated = check_isolation(found, course)
    check_mnist(found)
    device = check_device(found, course, device)
    check_cache(found)
    check_versions(found)
    if not isolated:
        found.item("references", "not graded: the sandbox cannot start (the isolation FIX above first)")
    elif device:
        grade_references(found, course, device, quick, aids or list(course.assignments))
    took = f"{time.monotonic() - t0:.0f} s"
    if found.problems:
        print(f"doctor: {len(found.problems)} problem(s), each a FIX line above ({took})")
        return 1
    print(f"doctor: all well ({took}{', experiments skipped: --quick' if quick else ''})")
    return 0


def check_isolation(found, course):
    """Start one empty sandbox, as grading does, and read the level it got; whether a sandbox can start."""
    limits = course.limits_for(next(iter(course.assignments)))
    sandbox = Sandbox([], {}, limits)
    try:
        with sandbox:
            level = sandbox.isolation
    except (SandboxFailure, StudentRaised) as e:
        found.item("isolation", "none: the sandbox could not start")
        found.fix(str(setup_problem(e) or f"the sandbox could not be started: {e}"))
        return False
    why, higher = LEVELS.get(level, ("a level this doctor does not know", "see autograder/sandbox/child/isolation.py"))
    allowed = " (allowed: --allow-unisolated / limits.allow_unisolated)" if level == "process" and \
        unisolated_allowed(limits) else ""
    found.item("isolation", f"{level}{allowed}: {why}; " + (f"a higher level needs {higher}" if higher else
                                                             "the highest level"))
    return True


def check_mnist(found):
    line = describe_source()
    if line:
        found.item("MNIST", line.removeprefix("MNIST: "))
        return
    kind, folder = data_source()
    found.item("MNIST", f"none in {folder}")
    found.fix(missing_message(folder, download_wanted()))


def check_device(found, course, asked):
    """The device the grader's models run on, described; None when the one asked for is not there."""
    asked = asked if asked != "auto" else course.device
    try:
        device = resolve_device(asked)
    except RuntimeError as e:
        found.item("device", f"{asked}: not available")
        found.fix(f"{e}: set device: auto (or cpu) in course.yaml, or pass --device cpu")
        return None
    if device == "cuda":
        found.item("device", f"cuda: {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda}; asked: {asked})")
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        gpu = "" if torch.cuda.is_available() else "; torch sees no GPU"
        found.item("device", f"cpu: {cores} cores, torch uses {torch.get_num_threads()} threads (asked: {asked}{gpu})")
    return device


def check_cache(found):
    """Where experiment runs are stored (the first writable of cache.cache_folders) and its free space."""
    if cache_off():
        found.item("cache", "off (COURSE_NO_CACHE=1): every grading trains its experiments")
        return
    tried = []
    for folder in cache_folders():
        problem = unwritable(folder)
        if problem:
            tried.append(f"{folder}: {problem}")
            continue
        free_mb = shutil.disk_usage(folder).free / 2**20
        others = [str(f) for f in cache_folders() if f != folder]
        found.item("cache", f"{folder}: writable, {free_mb / 1024:.1f} GB free"
                   + (f" (also read: {', '.join(others)})" if others else ""))
        if free_mb < LOW_DISK_MB:
            found.fix(f"only {free_mb:.0f} MB free where the experiment cache and results go ({folder}): free some")
        return
    found.item("cache", "not writable: " + "; ".join(tried))
    course_cache, user_cache = cache_folders()[0], cache_folders()[-1]
    found.fix(f"the experiment cache cannot be written ({'; '.join(tried)}): every grading trains again; make "
              f"{course_cache.parent} writable, or set XDG_CACHE_HOME to a writable folder "
              f"(now {user_cache.parents[1]})")


def unwritable(folder):
    """'' when a file can be made in `folder` (made if missing), else why not."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".doctor-"):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return ""


def check_versions(found):
    pins = course_pins()
    shown = []
    for name in PINNED:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            shown.append(f"{name} missing")
            found.fix(f"{name} is not installed in {os.path.dirname(os.path.dirname(os.__file__))}: pip install -e .")
            continue
        shown.append(f"{name} {version}")
        if name in pins and version != pins[name]:
            found.fix(f"{name} {version} is installed, the course pins {pins[name]}: pip install {name}=={pins[name]}")
    found.item("versions", ", ".join(shown) + f" (Python {'.'.join(map(str, sys.version_info[:3]))})")


def course_pins():
    """name -> version for the package's `==` requirements (pyproject.toml), when it is installed."""
    try:
        requires = importlib.metadata.requires("attention-course") or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    pins = (re.fullmatch(r"([A-Za-z0-9_.-]+)==([^;\s]+)", r.strip()) for r in requires)
    return {m.group(1): m.group(2) for m in pins if m}


def grade_references(found, course, device, quick, aids):
    """Each assignment's reference solution graded as a submission: its time, full marks or not, and for every
    experiment its figures beside the thresholds (trained now: the cache is neither read nor written)."""
    print("reference solutions, graded in the sandbox" + (" without experiments (--quick):" if quick else
          " with their experiments, trained now (the cache is left out):"), flush=True)
    with tempfile.TemporaryDirectory(prefix="course-doctor-") as folder, no_cache():
        for aid in aids:
            assignment, t0 = course.assignment(aid), time.monotonic()
            try:
                result = grade_notebook(write_solution(aid, folder), aid, device=device, experiments=not quick)
            except GraderError as e:
                found.assignment(aid, f"grader error after {time.monotonic() - t0:.0f} s")
                found.fix(str(setup_problem(e) or f"{aid}: the grader failed on the reference solution: {e}"))
                continue
            score, top = result["score"], result["max_score"]
            found.assignment(aid, f"{score:g}/{top:g} in {time.monotonic() - t0:.0f} s")
            if score < top:
                reasons, _ = lost_points(result, limit=1)
                found.fix(f"{aid}: the reference solution (solutions/{aid}.py) scores {score:g}/{top:g} "
                          f"({reasons[0]}): the grader, course.yaml or the release disagree with it "
                          f"(course sync, course release)")
            for test in result["tests"]:
                if "experiment" in test.get("extra_data", {}):
                    experiment_margin(found, aid, assignment.experiments[test["extra_data"]["experiment"]], test,
                                      course.limits_for(aid, test["item"]).experiment_seconds)


def experiment_margin(found, aid, exp, test, limit_s):
    """A line per seed grading trained: each thresholded metric measured, its bound and the margin to it; the time
    beside its limit. A seed the reference missed is a FIX even when a later one passed: a student's run may land on
    it; the seeds after a pass are not trained (`course experiments` trains every one)."""
    trained = test["extra_data"].get("trained") or [{"seed": test["extra_data"].get("seed"),
                                                     "metrics": test["extra_data"].get("metrics") or {}}]
    untried = exp.seeds[len(trained):] if test["score"] else []
    for k, run in enumerate(trained, 1):
        verdict = "" if run.get("passed", test["score"] >= test["max_score"]) else " MISSED"
        last = (f", {test.get('seconds', 0):.0f} s of its {limit_s:g} s limit (every seed)" + (
            f"; seed {', '.join(map(str, untried))} not trained (a pass ends grading; `course experiments {aid}` "
            f"trains every seed)" if untried else "")) if k == len(trained) else ""
        print(f"    {exp.name:<20} {figures(exp, run.get('metrics') or {})}; seed {run.get('seed')}{verdict}{last}",
              flush=True)
    missed = [run for run in trained if not run.get("passed", True)]
    if test["score"] < test["max_score"]:
        found.fix(f"{aid}.{exp.name}: the reference solution misses its threshold ({test['output'].splitlines()[-1]}): "
                  f"loosen assignments.{aid}.experiments.{exp.name}.threshold in course.yaml, or check the harness")
    elif missed:
        seeds = ", ".join(str(run["seed"]) for run in missed)
        found.fix(f"{aid}.{exp.name}: the reference solution misses on seed {seeds} and passes on seed "
                  f"{trained[-1]['seed']}: a student graded on that seed can lose the points; tune the recipe with "
                  f"`course check {aid} --seeds N`")


def figures(exp, metrics):
    """Each thresholded metric measured, its bound and the margin to it (TIGHT under TIGHT of the bound)."""
    parts = []
    for metric, bound in exp.threshold.items():
        value = metrics.get(metric)
        if not isinstance(value, (int, float)):
            parts.append(f"{metric} not measured [{bound}]")
            continue
        margin = min(m for m in (value - bound.min if bound.min is not None else None,
                                 bound.max - value if bound.max is not None else None) if m is not None)
        scale = max(abs(b) for b in (bound.min, bound.max) if b is not None) or 1.0
        tight = " TIGHT" if 0 <= margin < TIGHT * scale else ""
        parts.append(f"{metric} {value:.4g} [{bound}] margin {margin:+.3g}{tight}")
    return ", ".join(parts)


@contextmanager
def no_cache():
    """The experiment cache off while the doctor grades: its figures and times are this machine's, now."""
    before = os.environ.get("COURSE_NO_CACHE")
    os.environ["COURSE_NO_CACHE"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["COURSE_NO_CACHE"]
        else:
            os.environ["COURSE_NO_CACHE"] = before
