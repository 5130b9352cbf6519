"""What the first-run tests share (tests/test_first_run.py, tests/test_doctor.py): a fresh copy of the repository
with nothing beside it, the real `course` command run in it (as root, or as an ordinary user), a short course."""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from autograder.course import profiles
from autograder.course.config import ROOT

COURSE = Path(sys.executable).with_name("course")  # the environment's console script, as a TA runs it
USER = "coursedoc"  # the ordinary user the tests make (useradd) and remove
# course.yaml's rehearsal profile (autograder/course/profiles.py), for course()'s env: the short course of the tests
# that run the real command (first run, doctor), each experiment a few steps on its first seed with bounds any
# figure meets, in every grading's identity, with no edit to the clone's course.yaml
REHEARSAL = {profiles.ENV: "rehearsal"}


def fresh_clone(folder):
    """The repository's files as a clone has them (tracked and new ones, nothing ignored: no .grader cache, no
    build/), from the working tree, in `folder`/course, readable by every user."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    clone = Path(folder) / "course"
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    for path in [Path(folder), *clone.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    clone.chmod(0o755)
    return clone


def shorten(clone):
    """The clone's course.yaml with the rehearsal profile written into it (profiles.apply, the one mechanism): for
    tests/test_shared_cache.py, whose clones are graded in process, not through course() and REHEARSAL."""
    path = clone / "course.yaml"
    path.write_text(yaml.safe_dump(profiles.apply(yaml.safe_load(path.read_text()), "rehearsal", path)))


def course(clone, *args, env=None, network=True, timeout=1500):
    """`course ARGS` run in the clone as root, its code the clone's (PYTHONPATH); without a network when asked."""
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "PYTHONPATH": str(clone),
           "COURSE_SEARCH_SECONDS": "0", **(env or {})}
    command = [str(COURSE), *args] if network else ["unshare", "--net", str(COURSE), *args]
    return subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)


def ensure_user():
    """The ordinary user's uid, made with useradd if missing."""
    if subprocess.run(["id", "-u", USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/bin/sh", USER],
                       check=True)
    return int(subprocess.run(["id", "-u", USER], capture_output=True, text=True, check=True).stdout)


def remove_user():
    subprocess.run(["userdel", USER], capture_output=True)


def course_as_user(clone, home, *args, program=(str(COURSE),), env=None, timeout=1500):
    """`course ARGS` as the ordinary user (runuser), HOME a folder of its own. The interpreter lives under the 0700
    /root: the command runs in a private mount namespace where /root is an empty tmpfs with only the Python
    installation bound back (nothing on the machine changes). `program`: what runs `course` (a wrapper script)."""
    pyenv = Path(os.path.realpath(sys.executable)).parents[3]  # /root/.pyenv/versions/3.11.7/bin/python3.11
    require_open([Path(sys.executable).parent, Path(clone)], pyenv, USER)
    stage = Path(tempfile.mkdtemp(dir=home.parent))
    mounts = (f"mount --bind {pyenv} {stage} && mount -t tmpfs -o mode=0755 tmpfs /root && mkdir -p {pyenv} && "
              f"mount --move {stage} {pyenv} && exec runuser -u {USER} -- \"$@\"")
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(clone), "COURSE_SEARCH_SECONDS": "0",
           **(env or {})}
    command = ["env", *(f"{k}={v}" for k, v in env.items()), *program, *args]
    try:
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", mounts, "sh", *command],
                              cwd=clone, capture_output=True, text=True, timeout=timeout)
    finally:
        stage.rmdir()


def closed_folder(paths, pyenv):
    """The first folder above `paths` that others may not enter (no o+x), said with its mode, or None: a clone in
    such a folder fails at once, naming it, instead of the ordinary user's command waiting out a timeout (#60).
    The Python installation (`pyenv`) is bound back into the user's view, so its folders do not count."""
    for path in paths:
        for folder in [path, *path.parents]:
            if folder == pyenv or pyenv in folder.parents or folder in pyenv.parents:
                continue
            mode = folder.stat().st_mode
            if not mode & 0o001:
                return f"{folder} is mode {oct(mode & 0o777)}, so others cannot enter it (it needs o+x)"
    return None


def require_open(paths, pyenv, user):
    """Fail at once, naming the folder and its mode, where `user` could not reach `paths` (closed_folder)."""
    closed = closed_folder(paths, pyenv)
    if closed:
        raise AssertionError(f"the ordinary user {user} cannot run the course here: {closed}. Clone the repository "
                             "where every user may enter each folder above it (not under mktemp -d or a 0700 home)")


def user_home(folder, uid):
    home = Path(folder) / "home"
    home.mkdir(mode=0o700)
    os.chown(home, uid, uid)
    return home
