"""Where the CPU-seconds of one warm grading go: the grader's phases and the sandboxes', per assignment.

For each assignment, one `course grade --workers 1 --results-dir TMP` of the release (stubs: the grader's start,
nothing trains) and then of a complete submission (a program of its own: every experiment trains; the reference's
curves come from the cache, filled first by a grading of another complete submission that is not counted), in one
fresh process, as `benchmarks/class_cost.py` takes a warm grading. CPU-seconds, never wall time, so that a machine
shared with other work still gives the figures:

- the total is the kernel's count for a cgroup (v1 cpuacct, or v2) made for the command: every process it forks,
  the zygote and the sandboxes the zygote forks included (they are no children the command waits for, so
  getrusage(RUSAGE_CHILDREN) misses them; /proc/stat's busy time counts the other users of the machine). Without
  a cgroup to make (not root), the total is left out.
- each phase is timed in the grader process itself (time.process_time at each boundary: the grader's threads
  together) and, for the sandboxes, by each sandbox process's own utime+stime (/proc/PID/stat) read at the same
  boundaries and just before it is ended. The checks' sandbox is charged to the test running; an experiment's
  sandbox (its notebook load, then its training) to the experiments.
- `unattributed` is the cgroup's total less every counted phase: the monitors, the sandboxes' last instants, the
  zygote's forks after its last read.

    python benchmarks/grading_profile.py [ID ...] [--cprofile N] [--no-warm-up] [--json FILE] [--root DIR]
                                         [--fresh [--untrained]]

--root DIR profiles the grader of another checkout (an old commit's `git worktree add --detach`), its own release
and solutions, with this script's timers: what a phase was called there and no longer exists is left untimed
(at 95d4ef2: the grader identity's module and the results store, charged to the grading around them).

--fresh profiles the first grading of a fresh checkout instead: the complete submission alone (no warm-up, no
release first) in a copy of the course with no training cache (class_speed.py's fresh_checkout), reading the
committed reference curves (.grader/curves), or with --untrained none of them, so that it trains them first.

--cprofile N also prints the grader process's N costliest functions (cProfile, the main thread: it slows what it
measures, so its run is a separate one and its seconds are not the table's).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")
START = "start: interpreter, imports, zygote request, course.yaml, submissions"
AFTER = "after the gradings: submission times, written grades, the table"


def pid_cpu(pid):
    """utime + stime of a live process, in seconds; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


# --- the measured process (--child) ------------------------------------------------------------------

class Ledger:
    """CPU-seconds charged to (submission, phase): the grader's own and the sandboxes'. A stack of phases: each
    boundary charges what was spent since the last to the phase in effect."""

    def __init__(self):
        self.charges = {}  # submission -> phase -> [grader s, sandbox s]
        self.stack, self.submission = [START], ""
        self.last = time.process_time()
        self.sandboxes = {}  # id(Sandbox) -> [pid, CPU read last, experiment?]
        self.experiment_sandboxes = {}  # id(Sandbox) -> its experiment's name
        self.naming = ""  # the experiment whose run is being started (ahead.Experiments.start)
        self.t0 = time.monotonic()
        self.trainings = []  # per experiment run: [submission, name, CPU-s of its sandbox, wall from, wall to]
        self.scores = {}  # submission -> [score, max_score, the tests that lost points]

    def charge(self, phase, grader=0.0, sandbox=0.0):
        row = self.charges.setdefault(self.submission, {}).setdefault(phase, [0.0, 0.0])
        row[0] += grader
        row[1] += sandbox

    def boundary(self):
        now = time.process_time()
        self.charge(self.stack[-1], grader=now - self.last)
        self.last = now
        for entry in self.sandboxes.values():
            if not entry[2]:
                self.read_sandbox(entry, self.stack[-1])

    def read_sandbox(self, entry, phase):
        cpu = pid_cpu(entry[0])
        if cpu is not None:
            self.charge(phase, sandbox=cpu - entry[1])
            entry[1] = cpu

    def push(self, phase):
        self.boundary()
        self.stack.append(phase)

    def pop(self):
        self.boundary()
        self.stack.pop()

    def phase(self, name):
        ledger = self

        class Phase:
            def __enter__(self):
                ledger.push(name)

            def __exit__(self, *exc):
                ledger.pop()
        return Phase()


def test_phase(item):
    """The phase a test of the session is charged to: its check kind (a shapes check's meta run apart)."""
    if getattr(item, "experiment", None) is not None:
        return "experiments: the grader's side (data, reference curve, evaluation), waiting"
    marker = item.get_closest_marker("item")
    kind = marker.args[1] if marker else "other tests"
    if "[meta]" in item.nodeid:
        return f"check {kind}: the device run (meta)"
    return f"check {kind}"


def instrument(ledger):
    """Wrap the grader's phases (module doc) in this process: nothing of the grader changes but these timers."""
    import importlib

    import pytest

    from autograder.batch import run
    from autograder.grading import ahead
    from autograder.sandbox import grader_side

    def module(name):  # None where an older checkout (--root) has no such module
        try:
            return importlib.import_module(name)
        except ImportError:
            return None
    identity, results = module("autograder.batch.identity"), module("autograder.batch.results")

    def wrapped(owner, name, phase):
        original = getattr(owner, name, None)
        if original is None:  # an older checkout's grader (--root): the phase is charged to the one around it
            return

        def timed(*args, **kwargs):
            with ledger.phase(phase):
                return original(*args, **kwargs)
        setattr(owner, name, timed)

    def grade_one(name, *args, **kwargs):
        ledger.boundary()
        ledger.submission = name
        ledger.last = time.process_time()
        with ledger.phase("results folder and identity (grade_one, outside the session)"):
            out = original_grade_one(name, *args, **kwargs)
        ledger.scores[name] = [out[0].get("score"), out[0].get("max_score"),
                               [t["name"] for t in out[0].get("tests", []) if t["score"] < t["max_score"]]]
        ledger.boundary()
        ledger.submission = ""
        ledger.stack[-1] = AFTER
        return out
    original_grade_one = run.grade_one
    run.grade_one = grade_one
    wrapped(identity or run, "grader_parts" if identity else "grader_identity",
            "identity: grader_parts (hashing the grader)")
    wrapped(run, "file_digest", "identity: the notebook's sha256")
    wrapped(getattr(results, "Entry", None), "without_grading", "results folder: the saved result read")
    wrapped(getattr(results, "Entry", None), "store", "results folder: the result stored")
    wrapped(run, "grade_submission" if hasattr(run, "grade_submission") else "_grade",
            "session: pytest's collection, setup and teardown")

    original_sandbox, original_run_start = ahead.Experiments.sandbox, ahead.Experiments.start

    def experiment_sandbox(self):
        sandbox = original_sandbox(self)
        if sandbox is not None:
            ledger.experiment_sandboxes[id(sandbox)] = ledger.naming
        return sandbox
    ahead.Experiments.sandbox = experiment_sandbox

    def run_start(self, exp, why):  # its sandbox is made in this call, in this thread
        ledger.naming = exp.name
        return original_run_start(self, exp, why)
    ahead.Experiments.start = run_start

    original_start, original_kill = grader_side.Sandbox.start, grader_side.Sandbox.kill

    def start(self):
        experiment = id(self) in ledger.experiment_sandboxes
        if experiment:
            original_start(self)
        else:
            with ledger.phase("notebook execution: the checks' sandbox started, the cells run"):
                original_start(self)
        cpu = pid_cpu(self.proc) or 0.0
        ledger.sandboxes[id(self)] = [self.proc, cpu, experiment]
        if experiment:
            ledger.trainings.append([ledger.submission, ledger.experiment_sandboxes[id(self)], -cpu,
                                     time.monotonic() - ledger.t0, None])
        ledger.charge("experiments: the notebook run in each experiment's sandbox" if experiment else
                      "notebook execution: the checks' sandbox started, the cells run", sandbox=cpu)

    def kill(self):
        entry = ledger.sandboxes.pop(id(self), None)
        if entry is not None and entry[0] == self.proc:
            ledger.read_sandbox(entry, "experiments: the student's training (its sandbox)" if entry[2] else
                                ledger.stack[-1])
            if entry[2]:
                run = next(r for r in reversed(ledger.trainings) if r[1] == ledger.experiment_sandboxes[id(self)])
                run[2] += entry[1]
                run[4] = time.monotonic() - ledger.t0
        return original_kill(self)
    grader_side.Sandbox.start, grader_side.Sandbox.kill = start, kill

    class TestPhases:
        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_protocol(self, item, nextitem):
            with ledger.phase(test_phase(item)):
                yield

    original_main = pytest.main

    def main(args, plugins=()):
        return original_main(args, plugins=[*plugins, TestPhases()])
    pytest.main = main


def child(argv):
    """The measured `course grade` (module doc), its ledger written as JSON to argv[-1]."""
    ledger = Ledger()
    *grade_args, out, top = argv
    profiler = None
    if int(top):
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    from autograder import cli
    instrument(ledger)
    code = cli.main(["grade", *grade_args])
    ledger.boundary()
    from autograder.sandbox.zygote import ZYGOTE
    zygote = pid_cpu(ZYGOTE.proc.pid) if ZYGOTE.proc is not None else None
    if profiler is not None:
        import pstats
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(int(top))
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(int(top))
    Path(out).write_text(json.dumps({"code": code, "charges": ledger.charges, "zygote": zygote, "scores": ledger.scores,
                                     "trainings": ledger.trainings,
                                     "grader": time.process_time()}))
    sys.stdout.flush()
    os._exit(0 if code in (0, 1) else code)


# --- the measuring process -----------------------------------------------------------------------------

def cgroup():
    """(a fresh cgroup's folder, the file its member pids go in, a reader of its CPU-seconds), or None."""
    name = f"grading-profile-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    for base, read in ((Path("/sys/fs/cgroup/cpuacct"), lambda d: int((d / "cpuacct.usage").read_text()) / 1e9),
                       (Path("/sys/fs/cgroup"), lambda d: int((d / "cpu.stat").read_text().split()[1]) / 1e6)):
        try:
            folder = base / name
            folder.mkdir()
        except OSError:
            continue
        return folder, folder / "cgroup.procs", read
    return None


def cgroup_removed(group):
    """Remove a cgroup() once its last process (a zygote ending after its grader) is gone."""
    while True:
        try:
            group[0].rmdir()
            return
        except OSError:
            time.sleep(0.2)


def measured(aid, notebooks, results_dir, top=0, root=ROOT):
    """(the child's ledger, the cgroup's CPU-seconds or None, its stderr) of one profiled `course grade` of the
    checkout at `root` (its grader first on the path, the zygote's and sandboxes' too)."""
    out = Path(results_dir).parent / "ledger.json"
    group = cgroup()

    def join():
        if group is not None:
            group[1].write_text(str(os.getpid()))
    argv = [sys.executable, __file__, "--child", *map(str, notebooks), "-a", aid, "--workers", "1", "--results-dir",
            str(results_dir), str(out), str(top)]
    env = {k: v for k, v in os.environ.items() if k != "COURSE_NO_CACHE"}
    if Path(root) != ROOT:
        env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, preexec_fn=join)
    total = None
    if group is not None:
        total = group[2](group[0])
        cgroup_removed(group)
    if not out.is_file():
        sys.exit(f"{aid}: the profiled grading failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text()), total, proc.stderr


def write_submission(folder, aid, tag):
    import nbformat

    from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
    path = Path(folder) / tag / f"{aid}.ipynb"
    path.parent.mkdir(parents=True)
    if tag == "release":
        nbformat.write(release_notebook(aid), path)
    else:
        cells = {item: f"{source}\n_submission = {tag + uuid.uuid4().hex[:8]!r}\n"
                 for item, source in solved_sources(aid).items()}
        nbformat.write(with_cells(release_notebook(aid), cells), path)
    return path


def report(aid, ledger, total):
    """Print the phases of the warm grading (the complete submission) beside the first (the release's, which pays
    the grader's first-time costs: its identity, pytest's first session); (warm CPU-s, the cgroup's total)."""
    charges = ledger["charges"]
    complete, release = charges.get("complete", {}), charges.get("release", {})
    score, max_score, lost = ledger["scores"]["complete"]
    if lost:  # a check that timed out on a loaded machine, say: what did not run is missing from the profile
        print(f"\n{aid}: WARNING: the complete submission scored {score}/{max_score}, losing {', '.join(lost)}: "
              f"the phases below miss what those tests' items did not run")
    print(f"\n{aid}: CPU-seconds of each phase, the warm grading (a complete submission) and the first (the release)")
    print(f"  {'phase':<76}{'warm: grader':>13}{'sandbox':>9}{'first: grader':>15}{'sandbox':>9}")
    for phase in sorted(set(complete) | set(release), key=lambda p: (-sum(complete.get(p, [0, 0])), p)):
        g, s = complete.get(phase, [0.0, 0.0])
        fg, fs = release.get(phase, [0.0, 0.0])
        print(f"  {phase:<76}{g:>13.2f}{s:>9.2f}{fg:>15.2f}{fs:>9.2f}")
    for submission, name, cpu, start, end in ledger.get("trainings", []):
        if submission == "complete":
            print(f"  of which {name}'s sandbox (its notebook, its training): {cpu:.2f} CPU-s, wall +{start:.1f} s to "
                  f"+{'?' if end is None else f'{end:.1f}'} s of the command")
    warm = sum(g + s for g, s in complete.values())
    outside = charges.get("", {})
    first = sum(g + s for g, s in release.values())
    counted = warm + first + sum(g for g, _ in outside.values()) + (ledger["zygote"] or 0.0)
    print(f"  the warm grading: {warm:.2f}; the first: {first:.2f}; the grader process's "
          + "; ".join(f"{phase}: {g:.2f}" for phase, (g, _) in outside.items())
          + f"; the zygote (torch's import, forking): {ledger['zygote'] or float('nan'):.2f}")
    if total is not None:
        print(f"  the command's total (cgroup): {total:.2f}; unattributed (monitors, the sandboxes' last instants): "
              f"{total - counted:.2f}")
    return warm, total


def main():
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ids", nargs="*")
    parser.add_argument("--cprofile", type=int, default=0, metavar="N",
                        help="also print the grader's N costliest functions (a separate, slower run)")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="the reference's curves are in the cache already (an earlier run's warm-up)")
    parser.add_argument("--json", help="also append each assignment's ledger to this file, a JSON line each")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the checkout whose grader, release and solutions to profile (default: this one)")
    parser.add_argument("--fresh", action="store_true",
                        help="the first grading of a fresh checkout: the complete submission alone, no cache but the "
                             "committed curves")
    parser.add_argument("--untrained", action="store_true", help="with --fresh: without the committed curves")
    args = parser.parse_args()
    root = args.root.resolve()
    sys.path.insert(0, str(root))
    os.chdir(root)  # its course.yaml, release and solutions (config.course_root: the working folder's course)
    from autograder.course.config import load_course
    summary = []
    for aid in args.ids or list(load_course().assignments):
        with tempfile.TemporaryDirectory(prefix="grading-profile-") as tmp:
            tmp = Path(tmp)
            if args.fresh:  # the measured process's course: a fresh checkout's
                from class_speed import fresh_checkout
                env = fresh_checkout(tmp / "checkout", shipped=not args.untrained, root=root)
                os.environ.update(COURSE_ROOT=env["COURSE_ROOT"], XDG_CACHE_HOME=env["XDG_CACHE_HOME"])
                os.environ.pop("COURSE_CACHE_DIR", None)
            elif not args.no_warm_up:  # the reference's curves into the cache
                warm_up = write_submission(tmp / "warm-up", aid, "warm-up")
                measured(aid, [warm_up], tmp / "warm-up" / "results", root=root)
            tags = ("complete",) if args.fresh else ("release", "complete")
            notebooks = [write_submission(tmp / "run", aid, tag) for tag in tags]
            ledger, total = measured(aid, notebooks, tmp / "run" / "results", root=root)[:2]
            summary.append((aid, *report(aid, ledger, total)))
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps({"assignment": aid, "ledger": ledger, "total": total}) + "\n")
            if args.cprofile:
                again = [write_submission(tmp / "profiled", aid, tag) for tag in ("release", "complete")]
                print(measured(aid, again, tmp / "profiled" / "results", args.cprofile, root)[2][-20000:])
    print("\n| assignment | one warm grading, CPU-s (counted) | the command's total, CPU-s (cgroup) |\n|---|---|---|")
    for aid, warm, total in summary:
        print(f"| {aid} | {warm:.1f} | {'n/a' if total is None else f'{total:.1f}'} |")


if __name__ == "__main__":
    main()
