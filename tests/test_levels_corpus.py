"""The corpus and the lifecycle tests at the levels CI's own run (root, `namespaces`) does not reach.

Each level gets one grader process: a pytest run of tests/test_corpus.py's cases (AT_EVERY_LEVEL: all but three
that spin a core to their time limit, whose path another case takes) and tests/test_lifecycle.py, made as
tests/test_isolation_levels.py makes its levels (run_as) and told through COURSE_TEST_ISOLATION which level every
grading must report. One pytest process per level: torch is imported once
and one zygote serves every corpus case (the lifecycle tests start graders of their own: that is what they test).
"""
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from autograder.course.config import ROOT
from autograder.sandbox.grader_side import can_isolate
from tests import test_lifecycle
from tests.test_corpus import AT_EVERY_LEVEL
from tests.test_isolation_levels import run_as

pytestmark = [pytest.mark.grading, pytest.mark.slow,
              pytest.mark.skipif(not can_isolate(), reason="making the levels needs root")]
# Ordinary users of their own (not test_isolation_levels' two): at `landlock` the process limit counts the user's
# own processes, which another test's grader of the same user, running beside this one, would move.
USERNS_USER, LANDLOCK_USER = 65532, 65531
NO_USERNS = r'''
import importlib.util, os, sys
# As Docker's default seccomp profile: no new user namespace for this process and all it starts
s = importlib.util.spec_from_file_location("child_main", sys.argv.pop(1))  # the student's side
entry = importlib.util.module_from_spec(s)
s.loader.exec_module(entry)
child = entry.load().isolation
lib = child.libc()
assert lib.prctl(child.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
child.forbid_user_namespaces(lib)
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
'''


def node_ids_at_every_level():
    return [f"tests/test_corpus.py::test_corpus_case[{name}]" for name in AT_EVERY_LEVEL] + \
        [f"tests/test_lifecycle.py::{name}" for name in dir(test_lifecycle) if name.startswith("test_")]


def home_of(uid, folder):
    """A 0700 home of `uid`'s own, holding its temporary folder (where its sandboxes' scratch folders go)."""
    home = folder / f"home-{uid}"
    (home / "tmp").mkdir(parents=True)
    for path in (home, home / "tmp"):
        os.chown(path, uid, uid)
        path.chmod(0o700)
    return home


def run_level(level, folder, tests):
    """`tests` run by one pytest process at `level`: (whether it ran them all and they passed, its output)."""
    uid = {"uid": 0, "userns": USERNS_USER, "landlock": LANDLOCK_USER}[level]
    home = Path.home() if uid == 0 else home_of(uid, folder)
    env = {"COURSE_TEST_ISOLATION": level, "PYTHONDONTWRITEBYTECODE": "1",
           **{k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ}}
    if uid:
        env["TMPDIR"] = str(home / "tmp")
    command = [sys.executable, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider",
               "--basetemp", str((home / "tmp" if uid else folder) / "basetemp")]
    wrap = ()
    if level == "uid":
        wrap = ("capsh", "--drop=cap_sys_admin", "--", "-c", '"$0" "$@"')
    elif level == "landlock":
        script = folder / "no_userns.py"
        script.write_text(NO_USERNS)
        script.chmod(0o644)
        child = ROOT / "autograder" / "sandbox" / "child" / "__main__.py"
        command = [sys.executable, str(script), str(child), *command[1:]]
    run = run_as(uid, command, folder, {"homes": {uid: home}}, wrap, env=env)
    out = run.stdout + run.stderr
    summary = out.strip().splitlines()[-1] if out.strip() else ""
    all_passed = re.fullmatch(rf"=* ?{len(tests)} passed(, \d+ warnings?)? in .*", summary)  # none skipped
    return run.returncode == 0 and bool(all_passed), out


def test_the_corpus_and_the_lifecycle_at_every_level(tmp):
    """The three levels at once, each its own grader process and users: their waits on time limits and sleeps
    overlap (one after another they held a test worker for 145 s, mostly waiting)."""
    levels = ["uid", "userns", "landlock"] if shutil.which("capsh") else ["userns", "landlock"]
    tests = node_ids_at_every_level()
    with ThreadPoolExecutor(len(levels)) as pool:
        runs = dict(zip(levels, pool.map(lambda level: run_level(level, tmp, tests), levels), strict=True))
    failed = {level: out[-4000:] for level, (passed, out) in runs.items() if not passed}
    assert not failed, "\n".join(f"--- at {level}:\n{out}" for level, out in failed.items())
