"""Nothing of a batch outlives its coordinator: SIGTERM or SIGKILL to `course grade DIR --workers 2` while its
sandboxes run leaves no pool worker, zygote, monitor or sandbox alive 10 s later, at every isolation level this
machine can make (tests/test_isolation_levels.py makes them: root with and without CAP_SYS_ADMIN, an ordinary user
with and without user namespaces, and no isolation at all with --allow-unisolated). The README's nbgrader path on
all cores (`nbgrader autograde` with CourseAutograde.workers=2) starts the same pool: `kill PID` to nbgrader leaves
nothing of it either.

The coordinator is started below a launcher that is a child subreaper (PR_SET_CHILD_SUBREAPER): whatever the
batch leaves behind, however it detached itself (setsid, a double fork, a sandbox's own process), is reparented
to the launcher, so "nothing left" is "no process below the launcher", not only "none of the pids seen".
"""
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from autograder.course.config import ROOT, load_course
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from autograder.sandbox.grader_side import can_isolate
from tests.test_isolation_levels import CHILD_MAIN, CLI_WITHOUT, LONER, NOBODY, as_user, targets  # noqa: F401

pytestmark = [pytest.mark.grading, pytest.mark.slow,
              pytest.mark.skipif(not can_isolate(), reason="making the levels needs root")]
AID = "lab14_transformers"
SUBMISSIONS = 3  # two graded at once, one waiting: the kill comes while both workers' sandboxes run
GONE_WITHIN_SECONDS = 10  # the deadline the coordinator's end sets for everything it started
START_SECONDS = 600  # a loaded machine: workers import torch, zygotes start, notebooks load
BEGIN = "    ### BEGIN SOLUTION\n"
# How long the first item waits: within its time limit (course.yaml's item_seconds), so that its sandbox is not
# ended and restarted while the test waits for the other worker's
WAIT_SECONDS = load_course().limits.item_seconds - 10

# Sets itself as a child subreaper, starts the command, then reaps whatever comes back to it until killed.
LAUNCHER = r'''
import ctypes, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
subprocess.Popen(sys.argv[1:])
while True:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        time.sleep(0.05)
'''

LEVELS = {  # level: (uid, wrap, how the coordinator is started, extra arguments)
    "namespaces": (0, (), "cli", []),
    "uid": (0, ("capsh", "--drop=cap_sys_admin", "--", "-c", '"$0" "$@"'), "cli", []),
    "userns": (NOBODY, (), "cli", []),
    "landlock": (LONER, (), "no-userns", []),
    "process": (NOBODY, (), "no-landlock", ["--allow-unisolated"]),
}


def table():
    """{pid: (ppid, start time, state, cmdline)} of every process now."""
    out = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out[int(name)] = (int(stat[1]), stat[19], stat[0], cmdline)
    return out


def below(root, procs):
    """The live (not zombie) processes whose ancestors include `root`."""
    children = {}
    for pid, (ppid, *_rest) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if procs[pid][2] != "Z":
            found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def alive(recorded):
    """Those of the recorded (pid, start time) still running (the same process: its start time unchanged)."""
    procs = table()
    return [pid for pid, start in recorded if pid in procs and procs[pid][1] == start and procs[pid][2] != "Z"]


def left_after(launcher, recorded):
    """{pid: command line} of what is still running GONE_WITHIN_SECONDS after the coordinator was signalled: of the
    recorded (pid, start time), and anything still below the launcher."""
    signalled = time.monotonic()
    while time.monotonic() - signalled < GONE_WITHIN_SECONDS and (alive(recorded) or below(launcher.pid, table())):
        time.sleep(0.2)
    procs = table()
    return {pid: procs[pid][3] for pid in set(alive(recorded)) | set(below(launcher.pid, procs)) if pid in procs}


COURSE_GRADE = (" grade ", f" -a {AID} ")  # what the coordinator's command line holds: `course grade`'s
NBGRADER = (" nbgrader autograde ",)  # and `nbgrader autograde`'s


def sandboxes_running(launcher, procs, marks=COURSE_GRADE):
    """The coordinator's pid (its command line holds `marks`) and how many sandboxes run (children of a monitor:
    the zygote's forks)."""
    tree = below(launcher, procs)
    coordinator = next((p for p in tree if procs[p][3].startswith(sys.executable)
                        and all(mark in procs[p][3] for mark in marks)), None)
    child = [p for p in tree if CHILD_MAIN in procs[p][3]]
    monitors = [p for p in child if procs[p][0] in child]
    return coordinator, sum(procs[p][0] in monitors for p in tree)


def waiting_sources():
    """The complete notebook whose first graded item waits in the student's code when its checks call it: a
    sandbox stays running (a monitor's child, in the checks, past the 2 s before the kill) as a training one
    would, without spending a core until the kill (a trained notebook cost each case some 5 CPU-s more)."""
    sources = solved_sources(AID)
    first = next(iter(load_course().assignment(AID).items))
    assert BEGIN in sources[first], first
    sources[first] = sources[first].replace(BEGIN, f"{BEGIN}    import time\n    time.sleep({WAIT_SECONDS})\n", 1)
    return sources


def write_batch(folder):
    sources = waiting_sources()
    for k in range(SUBMISSIONS):
        (folder / f"student{k}").mkdir(parents=True)
        nbformat.write(with_cells(release_notebook(AID), sources), folder / f"student{k}" / f"{AID}.ipynb")
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def start_batch(level, targets, tmp):  # noqa: F811 -- the fixture imported above
    """The launcher running `course grade BATCH --workers 2` at `level`."""
    uid, wrap, how, extra = LEVELS[level]
    batch = tmp / "batch"
    write_batch(batch)
    args = ["grade", str(batch), "-a", AID, "--workers", "2", "--device", "cpu", *extra]
    if how == "cli":
        command = [sys.executable, "-m", "autograder.cli", *args]
    else:
        script = tmp / "cli_without.py"
        script.write_text(CLI_WITHOUT)
        script.chmod(0o644)
        command = [sys.executable, str(script), CHILD_MAIN, how, *args]
    argv, env = as_user(uid, command, tmp, targets, wrap, env={"COURSE_NO_CACHE": "1"})
    launcher = tmp / "launcher.py"
    launcher.write_text(LAUNCHER)
    return subprocess.Popen([sys.executable, str(launcher), *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def stop(launcher):
    """The launcher and anything still below it: killed, so that a failing test leaves nothing running."""
    for pid in below(launcher.pid, table()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    launcher.kill()
    return launcher.communicate(timeout=30)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("level", list(LEVELS))
def test_nothing_of_a_batch_outlives_its_coordinator(level, sig, targets, tmp):  # noqa: F811
    if LEVELS[level][1] and not shutil.which("capsh"):
        pytest.skip("needs capsh")
    kill_in_the_middle(level, sig, targets, tmp)


def test_a_closed_terminal_ends_the_batch_as_a_kill_does(targets, tmp):  # noqa: F811
    """SIGHUP (the terminal a TA started the batch from, closed) is a SIGTERM."""
    kill_in_the_middle("namespaces", signal.SIGHUP, targets, tmp)


def kill_in_the_middle(level, sig, targets, tmp):  # noqa: F811
    """`course grade BATCH --workers 2` at `level`, sent `sig` once two sandboxes run: nothing of it is left
    GONE_WITHIN_SECONDS later; interrupted (not killed), it says so."""
    launcher = start_batch(level, targets, tmp)
    try:
        kill_once_two_sandboxes_run(launcher, sig)
    finally:
        _out, err = stop(launcher)
    if sig != signal.SIGKILL:
        assert "interrupted" in err, err[-3000:]


def kill_once_two_sandboxes_run(launcher, sig, marks=COURSE_GRADE):
    """Send `sig` to the coordinator below `launcher` (its command line holds `marks`) once two sandboxes have run
    for 2 s, its two pool workers beside them; nothing of it may be left GONE_WITHIN_SECONDS later."""
    deadline = time.monotonic() + START_SECONDS
    while True:
        procs = table()
        coordinator, running = sandboxes_running(launcher.pid, procs, marks)
        if coordinator and running >= 2:
            break
        assert launcher.poll() is None and time.monotonic() < deadline, \
            f"the batch never had two sandboxes running: {stop(launcher)[1][-3000:]}"
        assert coordinator is None or procs.get(coordinator, (0, 0, "Z"))[2] != "Z", \
            f"the coordinator ended before its sandboxes ran: {stop(launcher)[1][-3000:]}"
        time.sleep(0.5)
    time.sleep(2)  # the sandboxes are loading the notebooks or training
    procs = table()
    tree = below(launcher.pid, procs)
    recorded = [(pid, procs[pid][1]) for pid in tree]
    kinds = {"workers": sum("spawn_main" in procs[p][3] for p in tree),
             "zygotes and monitors": sum(CHILD_MAIN in procs[p][3] for p in tree)}
    assert kinds["workers"] == 2 and kinds["zygotes and monitors"] >= 4, (kinds, [procs[p][3] for p in tree])
    os.kill(coordinator, sig)
    left = left_after(launcher, recorded)
    assert not left, f"{len(left)} of the batch's {len(recorded)} processes outlived its coordinator by " \
                     f"{GONE_WITHIN_SECONDS} s after {sig.name}: {json.dumps(left, indent=1)}"


def test_nothing_of_an_nbgrader_autograde_on_all_cores_outlives_it(tmp_path):
    """The README's nbgrader path grading on all cores (CourseAutograde.workers=2), stopped as a TA stops it,
    `kill PID`, while its sandboxes run: nbgrader takes SIGTERM as its end, and the pool workers it started, their
    zygote and sandboxes go with it."""
    from autograder.notebooks.build import run_nbgrader
    from tests.test_nbgrader_roundtrip import CONFIG
    root = tmp_path / "course"
    shutil.copytree(ROOT / "assignments" / AID, root / "source" / AID)
    (root / "nbgrader_config.py").write_text(CONFIG.format(repo_config=str(ROOT / "nbgrader_config.py"),
                                                           root=str(root)))
    generated = run_nbgrader(["generate_assignment", AID, "--force"], root)
    assert generated.returncode == 0, generated.stderr[-3000:]
    write_batch(root / "submitted")
    for student in (root / "submitted").iterdir():  # nbgrader's layout: submitted/<student>/<assignment>/
        notebook = student / f"{AID}.ipynb"
        (student / AID).mkdir()
        notebook.rename(student / AID / notebook.name)
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    env = {**os.environ, "COURSE_NO_CACHE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    launcher = subprocess.Popen([sys.executable, str(script), sys.executable, "-m", "nbgrader", "autograde", AID,
                                 "--CourseAutograde.workers=2", "--log-level=WARN"], cwd=root, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        kill_once_two_sandboxes_run(launcher, signal.SIGTERM, NBGRADER)
    finally:
        stop(launcher)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_coordinator_killed_while_its_workers_start_leaves_none(sig, targets, tmp):  # noqa: F811
    """Killed the moment its pool workers exist, before they have imported anything: a spawned worker reaches
    its watch a second or more later (a fresh interpreter and its imports), when its parent is already init."""
    launcher = start_batch("namespaces", targets, tmp)
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            procs = table()
            tree = below(launcher.pid, procs)
            coordinator, _ = sandboxes_running(launcher.pid, procs)
            if coordinator and sum("spawn_main" in procs[p][3] for p in tree) == 2:
                break
            assert launcher.poll() is None and time.monotonic() < deadline, \
                f"the batch never started its workers: {stop(launcher)[1][-3000:]}"
            time.sleep(0.01)
        os.kill(coordinator, sig)
        left = left_after(launcher, [(pid, procs[pid][1]) for pid in tree])
        assert not left, f"{len(left)} processes outlived a coordinator {sig.name}ed while its workers started: " \
                         f"{json.dumps(left, indent=1)}"
    finally:
        stop(launcher)
