"""Where the test command's CPU-seconds go, process by process: the test command run with every Python process of
this environment recording its own CPU-seconds as it ends, summed by kind of process and by test file, beside the
kernel's total for the whole run.

    python benchmarks/suite_processes.py [--keep FILE] [--top N] [-- PYTEST_ARGS ...]   (default: -n auto)
    python benchmarks/suite_processes.py --read FILE [--top N]     (the tables of a log kept before)

How: a .pth file in this environment's site-packages imports a recorder in every Python process that starts,
those started with -I (the zygote) included, and is removed at the end whatever happens. As a process ends (at
exit, or through os._exit, which the zygote, its sandboxes' monitors and the pool's workers end with) the recorder
appends one line: its pid, its parent as it started (a zygote outlives its grader), argv, the test it belongs to
(PYTEST_CURRENT_TEST, which whatever a test starts inherits) and its CPU-seconds (getrusage's user+system; a forked
process counts from its fork). A process with no test of its own takes its nearest recorded ancestor's.

Not recorded: a process killed by a signal, what runs behind a sandbox's walls (it may not write the log: the
student's code, the checks' calls, the trainings), and whatever is not Python (the hub's proxy, Slurm, Chromium).
They are the kernel's total (a cgroup made for the run, as grading_profile.py makes: root only) less what was
recorded. Every process of this environment writes the log while the run lasts: run it in a clone with its own
environment, not beside other work in this one.
"""
import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from grading_profile import ROOT, cgroup, cgroup_removed

RECORDER = "_course_suite_processes"
RECORDER_SOURCE = '''"""suite_processes.py's recorder: this process's CPU-seconds, appended to LOG as it ends."""
import atexit, os, resource, sys, time
LOG = {log!r}
_state = {{"started": time.time(), "parent": os.getppid(), "recorded": None, "forked": False}}


def record():
    if _state["recorded"] == os.getpid():
        return
    _state["recorded"] = os.getpid()
    try:
        import json
        usage = resource.getrusage(resource.RUSAGE_SELF)
        line = json.dumps({{"pid": os.getpid(), "ppid": _state["parent"], "argv": [str(a)[:160] for a in sys.argv[:4]],
                           "test": os.environ.get("PYTEST_CURRENT_TEST"), "forked": _state["forked"],
                           "xdist_worker": sys.argv == ["-c"] and "PYTEST_XDIST_WORKER" in os.environ
                           and "_pytest.config" in sys.modules,
                           "cpu": round(usage.ru_utime + usage.ru_stime, 3),
                           "wall": round(time.time() - _state["started"], 2)}})
        fd = os.open(LOG, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, (line + "\\n").encode())
        finally:
            os.close(fd)
    except Exception:  # a sandbox's walls, a closed log: this process is simply not counted
        pass


def _forked():
    _state.update(started=time.time(), parent=os.getppid(), recorded=None, forked=True)


def _exit(code, _exit=os._exit):
    record()
    _exit(code)


atexit.register(record)
os.register_at_fork(after_in_child=_forked)
os._exit = _exit
'''


@contextlib.contextmanager
def installed(log):
    """The recorder's two files in this environment's site-packages while the block runs, removed on leaving."""
    site = Path(sysconfig.get_path("purelib"))
    module, pth = site / f"{RECORDER}.py", site / f"{RECORDER}.pth"
    try:
        module.write_text(RECORDER_SOURCE.format(log=str(log)))
        pth.write_text(f"import {RECORDER}\n")
    except OSError as e:
        module.unlink(missing_ok=True)
        sys.exit(f"the recorder cannot go into {site} ({e.strerror}): run it as the environment's owner")
    try:
        yield
    finally:
        pth.unlink(missing_ok=True)
        module.unlink(missing_ok=True)


def run(pytest_args, log):
    """The test command with the recorder installed, in a cgroup where one can be made: (its exit code, the
    kernel's CPU-seconds for it or None, its wall seconds)."""
    group = cgroup()
    start = time.monotonic()
    with installed(log):
        proc = subprocess.run([sys.executable, "-m", "pytest", *pytest_args], cwd=ROOT,
                              preexec_fn=(lambda: group[1].write_text(str(os.getpid()))) if group else None)
    wall = time.monotonic() - start
    total = None
    if group is not None:
        total = group[2](group[0])
        cgroup_removed(group)
    return proc.returncode, total, wall


def kind(record):
    """What a process was: the zygote, a sandbox's monitor, a pytest worker, `course grade`, `nbgrader autograde`..."""
    argv = record["argv"] or [""]
    first, rest = argv[0], argv[1:]
    if rest[:1] == ["--profile"]:  # `course --profile NAME VERB`
        rest = rest[2:]
    verb = rest[0] if rest and not rest[0].startswith("-") else ""
    if first.endswith("sandbox/child/__main__.py"):
        return "sandbox monitor (forked)" if record["forked"] else "zygote"
    if first.endswith("pytest/__main__.py"):
        return "pytest (nested run)" if record["test"] else "pytest (the session: collection, xdist's controller)"
    if record["xdist_worker"]:
        return "pytest worker (the tests run in it)"
    if "ipykernel_launcher" in " ".join(argv):
        return "ipykernel"
    for suffix, name in (("/course", "course"), ("autograder/cli.py", "course"), ("/nbgrader", "nbgrader"),
                         ("nbgrader/__main__.py", "nbgrader")):
        if first.endswith(suffix):
            return f"{name} {verb}".strip()
    return Path(first).name or "?"


def test_of(record, by_pid):
    """The test a process belongs to: its own PYTEST_CURRENT_TEST or its nearest recorded ancestor's."""
    seen = set()
    while record is not None and record["pid"] not in seen:
        if record["test"]:
            return record["test"].rsplit(" (", 1)[0]
        seen.add(record["pid"])
        record = by_pid.get(record["ppid"])
    return None


def report(log, total=None, wall=None, top=30):
    records = [json.loads(line) for line in Path(log).read_text().splitlines() if line.strip()]
    by_pid = {}
    for r in records:
        by_pid.setdefault(r["pid"], r)
    recorded = sum(r["cpu"] for r in records)
    print(f"{len(records)} Python processes recorded, {recorded:.0f} CPU-s" +
          (f"; the kernel's total for the run {total:.0f} CPU-s, unrecorded (sandboxed code, killed processes, not "
           f"Python) {total - recorded:.0f}" if total is not None else "") +
          (f"; {wall:.0f} s of wall time" if wall is not None else ""))
    kinds, counts = collections.Counter(), collections.Counter()
    files = collections.defaultdict(collections.Counter)
    for r in records:
        k = kind(r)
        kinds[k] += r["cpu"]
        counts[k] += 1
        if k != "pytest worker (the tests run in it)":
            files[(test_of(r, by_pid) or "(no test: a session fixture, or an orphan)").split("::")[0]][k] += r["cpu"]
    print("\n| kind of process | CPU-s | processes | CPU-s each |\n|---|---|---|---|")
    for k, cpu in kinds.most_common(top):
        print(f"| {k} | {cpu:.0f} | {counts[k]} | {cpu / counts[k]:.2f} |")
    print("\n| test file | CPU-s in processes it started | the costliest kinds |\n|---|---|---|")
    for f, ks in sorted(files.items(), key=lambda kv: -sum(kv[1].values()))[:top]:
        print(f"| {f} | {sum(ks.values()):.0f} | " + ", ".join(f"{k} {c:.0f}" for k, c in ks.most_common(3)) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", help="keep the log in FILE (JSON lines)")
    parser.add_argument("--read", help="print the tables of a kept log, running nothing")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("pytest_args", nargs="*", default=["-n", "auto"])
    args = parser.parse_args()
    if args.read:
        return report(args.read, top=args.top)
    if sys.prefix == sys.base_prefix:
        sys.exit("run it with the course's environment's Python (.venv/bin/python): the recorder goes into the "
                 "environment that runs the tests")
    if args.keep:
        log = Path(args.keep).resolve()
    else:
        folder = Path(tempfile.mkdtemp(prefix="suite-processes-"))
        folder.chmod(0o755)  # the tests' ordinary users write it too
        log = folder / "log.jsonl"
    log.write_text("")
    log.chmod(0o666)
    code, total, wall = run(args.pytest_args, log)
    report(log, total, wall, args.top)
    sys.exit(code)


if __name__ == "__main__":
    main()
