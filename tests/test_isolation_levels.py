"""Every isolation level this machine can produce, attacked the same way, next to the same attack unisolated.

CI runs as root, so each level is made here: root itself (`namespaces`), root without CAP_SYS_ADMIN through capsh
(`uid`), an ordinary user (`userns`), and an ordinary user whose grader runs under a seccomp filter that refuses
new user namespaces, as Docker's default profile does (`landlock`). Each run drives the Sandbox class directly
in a grader process of that kind (no full grading) and also starts one sandbox forced to the `process` level:
there the same attacks must work, which is what shows each probe can tell.

The ordinary user is `nobody`. Its interpreter lives in /root/.pyenv and /root is 0700: rather than loosen
/root on the machine, its grader runs in a private mount namespace where /root is an empty tmpfs (0755) with
only .pyenv bound back in; nothing outside that one process tree changes, and nothing is left behind if the
test dies. The grader's home is then a 0700 folder of that user's own.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from autograder.course.config import ROOT
from autograder.sandbox.grader_side import can_isolate
from tests.first_run import require_open

pytestmark = [pytest.mark.grading, pytest.mark.slow,  # each starts a grader and its zygote: torch imported twice
              pytest.mark.skipif(not can_isolate(), reason="making the levels needs root")]
NOBODY = 65534
# A second ordinary user for the landlock level, whose process limit counts the user's own processes: another
# test's grader running as nobody at the same time (xdist) must not move it.
LONER = 65533
USERS = (NOBODY, LONER)
AID = "lab14_transformers"

PROBE_CELL = r'''
import ctypes, os, socket, subprocess, time
def can_read(path):
    try:
        open(path, "rb").read(1)
        return True
    except OSError:
        return False
def connect(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False
def imports(name):
    __import__(name)
    return True
def bomb(marker):
    """Forks until refused (at most 200), each child in a session of its own (out of the process group)."""
    n = 0
    for _ in range(200):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            os.setsid()
            ctypes.CDLL(None).prctl(15, marker.encode(), 0, 0, 0)  # PR_SET_NAME: what the test looks for
            while True:
                time.sleep(1)
        n += 1
    return n
def background(seconds):
    subprocess.Popen(["sleep", str(seconds)], start_new_session=True)
    return True
def disk(total_mb):
    """MB written in 1 MB files (each under the per-file limit) until refused or total_mb."""
    for k in range(total_mb):
        try:
            with open(f"fill{k}", "wb") as f:
                f.write(b"x" * 2**20)
        except OSError:
            return k
    return total_mb
'''

GRADER = r'''
import json, os, sys, time
from pathlib import Path
spec = json.loads(sys.argv[1])
if spec.get("no_userns"):  # as Docker's default seccomp profile: no new user namespace for this grader
    import importlib.util
    s = importlib.util.spec_from_file_location("child_main", spec["child"])  # the student's side
    entry = importlib.util.module_from_spec(s)
    s.loader.exec_module(entry)
    child = entry.load().isolation
    lib = child.libc()
    lib.prctl(child.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    child.forbid_user_namespaces(lib)
import autograder.sandbox.grader_side as sandbox
from autograder.course.config import Limits
from autograder.notebooks.cells import Cell
from autograder.grading.student import Student

LIMITS = Limits(setup_seconds=120, item_seconds=30, experiment_seconds=60, memory_mb=3000, output_kb=16,
                disk_mb=8, processes=64)


def processes_named(name):
    """Live processes (zombies are dead: nothing of them runs) named `name` or running `sleep name`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if comm == name or argv[:2] == [b"sleep", name.encode()]:
            found.append(int(pid))
    return found


def probe(forced_process):
    if forced_process:  # the same grader with isolation switched off
        sandbox.can_isolate = sandbox.can_contain = lambda: False
        os.environ["COURSE_ALLOW_UNISOLATED"] = "1"
    tag = "u" if forced_process else "i"
    sb = sandbox.Sandbox([Cell("setup_probe", spec["cell"], 0)], {}, LIMITS)
    sb.start()
    ask = lambda name, *args: Student(sb, name, "cpu", time.monotonic() + 30).call(name, *args)
    out = {"level": sb.isolation, "reads": {k: ask("can_read", p) for k, p in spec["files"].items()},
           "connect": ask("connect", spec["port"]), "wave": ask("imports", "wave")}
    seconds = str(spec["seconds"] + (1 if forced_process else 0))
    ask("background", seconds)
    time.sleep(0.3)
    out["background_outlived_item"] = bool(processes_named(seconds))
    if not forced_process:  # a fork bomb without any limit is not something to run on the CI machine
        marker = "cbomb" + tag + str(os.getpid())
        out["forks"] = ask("bomb", marker)
        time.sleep(0.3)
        out["bomb_outlived_item"] = len(processes_named(marker))
    out["disk_mb_written"] = ask("disk", 3 * LIMITS.disk_mb)
    sb.kill()
    time.sleep(0.3)
    out["background_outlived_sandbox"] = bool(processes_named(seconds))
    for pid in processes_named(seconds):  # the unisolated case's leftovers: ours to clean up
        os.kill(pid, 9)
    return out


print(json.dumps({"isolated": probe(False), "unisolated": probe(True)}))
'''


@pytest.fixture(scope="module")
def targets():
    """What a student must not reach, all open to the user who grades: the course's solutions, a classmate's
    notebook in a batch folder outside the course, a file in the grader's home, a loopback listener."""
    batch = Path(tempfile.mkdtemp(prefix="course-iso-batch-", dir="/srv" if os.access("/srv", os.W_OK) else "/var/tmp"))
    homes = {0: Path.home(), **{uid: Path(tempfile.mkdtemp(prefix="course-iso-home-")) for uid in USERS}}
    server = socket.create_server(("127.0.0.1", 0))
    server.listen(64)
    try:
        batch.chmod(0o755)
        (batch / "bob").mkdir(mode=0o755)
        classmate = batch / "bob" / f"{AID}.ipynb"
        classmate.write_text("{}")
        classmate.chmod(0o644)
        for uid in USERS:
            os.chown(homes[uid], uid, uid)
            homes[uid].chmod(0o700)
        secrets = {}
        for uid, home in homes.items():
            secrets[uid] = home / f"course-iso-secret-{os.getpid()}"
            secrets[uid].write_text("secret")
            os.chown(secrets[uid], uid, uid)
            secrets[uid].chmod(0o600)
        yield {"solutions": ROOT / "solutions" / f"{AID}.py", "classmate": classmate, "secrets": secrets,
               "homes": homes, "port": server.getsockname()[1]}
    finally:
        server.close()
        shutil.rmtree(batch, ignore_errors=True)
        for uid in USERS:
            shutil.rmtree(homes[uid], ignore_errors=True)
        (Path.home() / f"course-iso-secret-{os.getpid()}").unlink(missing_ok=True)


def run_grader(targets, uid, tmp, wrap=(), no_userns=False):
    """The GRADER script in a process of the kind asked for; its JSON answer."""
    files = {"solutions": str(targets["solutions"]), "classmate": str(targets["classmate"]),
             "home": str(targets["secrets"][uid])}
    spec = {"cell": PROBE_CELL, "files": files, "port": targets["port"], "no_userns": no_userns,
            "seconds": 7000 + os.getpid() % 1000 * 2 + 2 * len(wrap) + no_userns * 7,
            "child": str(ROOT / "autograder" / "sandbox" / "child" / "__main__.py")}
    script = tmp / "grader.py"
    script.write_text(GRADER)
    script.chmod(0o644)
    run = run_as(uid, [sys.executable, str(script), json.dumps(spec)], tmp, targets, wrap)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def run_as(uid, command, tmp, targets, wrap=(), env=None):
    """`command` as `uid`, from the course's folder, with the user's home as HOME (and `env` besides)."""
    argv, env = as_user(uid, command, tmp, targets, wrap, env)
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


def as_user(uid, command, tmp, targets, wrap=(), env=None):
    """(argv, environment) that run `command` as `uid` (run_as's; started from the course's folder): for an
    ordinary user, /root as an empty 0755 tmpfs with only .pyenv bound back, then the drop to the user."""
    env = {"PATH": os.environ["PATH"], "HOME": str(targets["homes"][uid]), "PYTHONPATH": str(ROOT), **(env or {})}
    if uid != 0:
        pyenv = Path(os.path.realpath(sys.executable)).parents[3]  # /root/.pyenv/versions/3.11.7/bin/python
        require_open([Path(sys.executable).parent, ROOT, Path(tmp)], pyenv, f"uid {uid}")
        stage = Path(tempfile.mkdtemp(dir=tmp))
        mounts = (f"mount --bind {pyenv} {stage} && mount -t tmpfs -o mode=0755 tmpfs /root && "
                  f"mkdir -p {pyenv} && mount --move {stage} {pyenv} && exec setpriv --reuid={uid} "
                  f"--regid={uid} --clear-groups -- \"$@\"")
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mounts, "sh", *command]
    return [*wrap, *command], env


def check(result, level, disk_cap):
    isolated, unisolated = result["isolated"], result["unisolated"]
    # without isolation every attack works: the probes can tell
    assert unisolated["level"] == "process"
    assert unisolated["reads"] == {"solutions": True, "classmate": True, "home": True}, unisolated
    assert unisolated["connect"] is True
    assert unisolated["background_outlived_item"] is True
    assert unisolated["disk_mb_written"] == 24, "the probe writes past the disk cap where nothing stops it"
    # isolated, none of them does
    assert isolated["level"] == level
    assert isolated["reads"] == {"solutions": False, "classmate": False, "home": False}, isolated
    assert isolated["connect"] is False
    assert isolated["wave"] is True, "a standard module the zygote had not imported must still load"
    assert not isolated["background_outlived_item"] and not isolated["background_outlived_sandbox"]
    assert 0 < isolated["forks"] <= 64, "the process limit bounds the fork bomb"
    assert isolated["bomb_outlived_item"] == 0
    assert isolated["disk_mb_written"] <= 8 if disk_cap else isolated["disk_mb_written"] == 24


def test_root_with_namespaces(targets, tmp):
    check(run_grader(targets, 0, tmp=tmp), "namespaces", disk_cap=True)


@pytest.mark.skipif(not shutil.which("capsh"), reason="needs capsh")
def test_root_without_cap_sys_admin(targets, tmp):
    """Docker's default: a fresh uid, with Landlock walling off what is world-readable (and the 0700 /root
    holding the interpreter still usable for imports)."""
    result = run_grader(targets, 0, wrap=("capsh", "--drop=cap_sys_admin", "--", "-c", '"$0" "$@"'), tmp=tmp)
    check(result, "uid", disk_cap=False)


def test_an_ordinary_user_with_user_namespaces(targets, tmp):
    check(run_grader(targets, NOBODY, tmp=tmp), "userns", disk_cap=True)


def test_an_ordinary_user_without_user_namespaces(targets, tmp):
    check(run_grader(targets, LONER, no_userns=True, tmp=tmp), "landlock", disk_cap=False)


ENV_GRADER = r'''
import json, sys, time
import autograder.sandbox.grader_side as sandbox
from autograder.course.config import Limits
from autograder.notebooks.cells import Cell
from autograder.grading.student import Student
cell = ("import shm_module, var_tmp_module, wave, torch\ndef found():\n"
        "    return [shm_module.X, var_tmp_module.X, sys.prefix]\nimport sys\n")
sb = sandbox.Sandbox([Cell("setup_env", cell, 0)], {}, Limits(setup_seconds=120, disk_mb=8))
sb.start()
try:
    found = None if sb.load_errors else Student(sb, "found", "cpu", time.monotonic() + 30).call("found")
    print(json.dumps({"level": sb.isolation, "load_errors": sb.load_errors, "found": found}))
finally:
    sb.kill()
'''


def test_an_environment_under_tmp_var_tmp_and_dev_shm_is_seen_inside_the_sandbox(tmp):
    """A venv in /tmp (a fresh clone's), packages through PYTHONPATH from /dev/shm and /var/tmp, and an
    LD_LIBRARY_PATH in /tmp: the sandbox's own tmpfs at those places must neither break its start (it did:
    'File exists') nor hide them (ModuleNotFoundError)."""
    venv = tmp / "clone" / ".venv"
    subprocess.run([os.path.join(sys.base_prefix, "bin", "python3"), "-m", "venv", "--without-pip", str(venv)],
                   check=True)
    places = [Path(tempfile.mkdtemp(prefix="course-iso-", dir=d)) for d in ("/dev/shm", "/var/tmp")]
    try:
        for place, name in zip(places, ("shm_module", "var_tmp_module"), strict=True):
            place.chmod(0o755)
            (place / f"{name}.py").write_text(f"X = {name!r}\n")
        site = Path(sys.prefix, "lib", f"python{sys.version_info.major}.{sys.version_info.minor}", "site-packages")
        (tmp / "lib").mkdir()
        env = {"PATH": os.environ["PATH"], "HOME": str(Path.home()), "LD_LIBRARY_PATH": str(tmp / "lib"),
               "PYTHONPATH": ":".join([str(ROOT), str(site), *map(str, places)])}
        script = tmp / "env_grader.py"
        script.write_text(ENV_GRADER)
        run = subprocess.run([str(venv / "bin" / "python"), str(script)], capture_output=True, text=True,
                             timeout=600, cwd=ROOT, env=env)
    finally:
        for place in places:
            shutil.rmtree(place, ignore_errors=True)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["level"] == "namespaces" and out["load_errors"] == {}, out
    assert out["found"] == ["shm_module", "var_tmp_module", str(venv)]


# `course` in a grader refused what the sandbox's isolation needs: `python SCRIPT CHILD_MAIN WHAT course-args`, WHAT
# `no-userns` (a seccomp filter refusing new user namespaces, as Docker's default profile: the landlock level) or
# `no-landlock` (that, and ENOSYS for Landlock's three calls, a kernel without it: nothing isolates). Guarded by
# __main__, as a TA's script would be (the batch's spawned workers do not run it: they inherit the filters).
CLI_WITHOUT = r'''
import ctypes, importlib.util, struct, sys
if __name__ == "__main__":
    s = importlib.util.spec_from_file_location("child_main", sys.argv.pop(1))  # the student's side
    entry = importlib.util.module_from_spec(s)
    s.loader.exec_module(entry)
    child = entry.load().isolation
    what = sys.argv.pop(1)
    lib = ctypes.CDLL(None, use_errno=True)
    assert lib.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS: what a filter needs
    if what == "no-landlock":
        prog = [(0x20, 0, 0, 0), (0x35, 0, 3, 444), (0x35, 2, 0, 447), (0x06, 0, 0, 0x00050000 | 38),
                (0x06, 0, 0, 0x7FFF0000), (0x06, 0, 0, 0x7FFF0000)]
        code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in prog))
        fprog = struct.pack("HxxxxxxP", len(prog), ctypes.addressof(code))
        assert lib.prctl(22, 2, ctypes.c_char_p(fprog), 0, 0) == 0
    child.forbid_user_namespaces(lib)
    sys.argv = ["course", *sys.argv[1:]]
    from autograder.cli import main
    sys.exit(main())
'''
CHILD_MAIN = str(ROOT / "autograder" / "sandbox" / "child" / "__main__.py")


def test_course_grade_refuses_a_machine_that_isolates_nothing(targets, tmp):
    """An ordinary user with neither user namespaces nor Landlock: `course grade` is a grader failure (exit 3)
    whose one line names what is missing and how to allow it; --allow-unisolated grades, at `process`."""
    import nbformat

    from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
    notebook = tmp / "alice.ipynb"
    nbformat.write(with_cells(release_notebook(AID), solved_sources(AID)), notebook)
    notebook.chmod(0o644)
    script = tmp / "no_landlock.py"
    script.write_text(CLI_WITHOUT)
    script.chmod(0o644)
    runs = []
    for extra in ([], ["--allow-unisolated"]):
        args = ["grade", str(notebook), "-a", AID, "--items", "scaled_dot_product_attention", "--device", "cpu",
                "--json", str(targets["homes"][NOBODY] / f"result{len(runs)}.json"), *extra]
        runs.append(run_as(NOBODY, [sys.executable, str(script), CHILD_MAIN, "no-landlock", *args], tmp, targets))
    refused, allowed = runs
    assert refused.returncode == 3, refused.stderr[-2000:]
    assert "no isolation for the student's code" in refused.stderr and "--allow-unisolated" in refused.stderr
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert json.loads((targets["homes"][NOBODY] / "result1.json").read_text())["extra_data"]["isolation"] == "process"
