"""The corpus and the lifecycle tests at the levels CI's own run (root, `namespaces`) does not reach.

Each level gets one grader process: a pytest run of tests/test_corpus.py's cases (AT_EVERY_LEVEL: all but three
that spin a core to their time limit, whose path another case takes; less PYTHON_ONLY, whose outcome no level's
walls can change: CI's own run grades those) and tests/test_lifecycle.py, made as
tests/test_isolation_levels.py makes its levels (as_user) and told through COURSE_TEST_ISOLATION which level every
grading must report. One pytest process per level: torch is imported once
and one zygote serves every corpus case (the lifecycle tests start graders of their own: that is what they test).
"""
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from autograder.course.config import ROOT
from autograder.sandbox.grader_side import can_isolate
from tests import test_lifecycle
from tests.first_run import require_open
from tests.test_corpus import AT_EVERY_LEVEL, CORPUS
from tests.test_isolation_levels import as_user

pytestmark = [pytest.mark.grading, pytest.mark.slow,
              pytest.mark.skipif(not can_isolate(), reason="making the levels needs root")]
# Ordinary users of their own (not test_isolation_levels' two): at `landlock` the process limit counts the user's
# own processes, which another test's grader of the same user, running beside this one, would move.
USERNS_USER, LANDLOCK_USER = 65532, 65531
# The three levels' runs took 158 s together in the test command's run of 1627d94, and 508 s on two cores shared
# with other runs (benchmarks/RESULTS.md): run_as's 600 s was within reach. A run past this is a hang.
HANGS_AFTER = 1800
# The cases whose student code asks nothing of the machine that the levels wall off differently (the notebook's
# shape, wrong values, Python-level patches, what the grader's own scans find): no level's walls can change their
# outcome, and the path they take through the sandbox (a cell run, an exception or a value sent back) is taken at
# every level by the cases kept there: syntax_error_in_graded_cell, exception_at_call_time, wrong_shape,
# patched_torch_allclose, patched_torch_testing_and_numpy_testing, calls_the_oracle_through_getattr. CI's run
# grades them; they are not graded at the other levels again (#60: half the cases, the cheap half).
PYTHON_ONLY = {
    "exception_at_definition", "graded_cell_deleted", "graded_cell_duplicated_later_wins",
    "graded_cell_moved_to_the_end", "graded_cell_renamed", "graded_cell_turned_into_markdown", "notebook_renamed",
    "kernelspec_from_another_machine", "wrong_signature", "wrong_return_type", "wrong_dtype", "nan_output",
    "inf_output", "long_sleep_in_a_setup_cell", "sys_exit_in_a_graded_cell", "patched_pytest_and_unittest",
    "patched_builtins", "fake_grader_module_in_sys_modules", "hard_coded_public_check_outputs",
    "calls_the_oracle_in_a_from_scratch_item", "stores_the_oracle_under_a_built_name_while_loading",
    "imports_the_oracle_with_importlib_while_loading", "calls_the_oracle_through_torch_C",
    "calls_the_oracle_through_torch_ops", "forged_score_in_a_test_cell", "prints_a_fake_score",
    "mutates_the_grader_inputs_in_place", "prints_markup_and_terminal_escapes"}
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
    cases = [name for name in AT_EVERY_LEVEL if name not in PYTHON_ONLY]
    return [f"tests/test_corpus.py::test_corpus_case[{name}]" for name in cases] + \
        [f"tests/test_lifecycle.py::{name}" for name in dir(test_lifecycle) if name.startswith("test_")]


def test_the_cases_left_to_ci_s_level_are_cases_and_none_is_isolated():
    """PYTHON_ONLY names cases that run at every level otherwise, none of them isolated (those are what the levels
    are tested for)."""
    params = {p.id: p for p in CORPUS}
    assert set(AT_EVERY_LEVEL) >= PYTHON_ONLY, PYTHON_ONLY - set(AT_EVERY_LEVEL)
    assert not [name for name in PYTHON_ONLY if params[name].marks], "an isolated case must run at every level"


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
           "COURSE_TEST_DURATIONS": str((home / "tmp" if uid else folder) / "durations.json"),
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
    argv, env = as_user(uid, command, folder, {"homes": {uid: home}}, wrap, env=env)
    run = subprocess.run(argv, capture_output=True, text=True, timeout=HANGS_AFTER, cwd=ROOT, env=env)
    out = run.stdout + run.stderr
    summary = out.strip().splitlines()[-1] if out.strip() else ""
    all_passed = re.fullmatch(rf"=* ?{len(tests)} passed(, \d+ warnings?)? in .*", summary)  # none skipped
    return run.returncode == 0 and bool(all_passed), out


def test_the_corpus_and_the_lifecycle_at_every_level(tmp):
    """The three levels at once, each its own grader process and users: their waits on time limits and sleeps
    overlap (one after another they held a test worker for 145 s, mostly waiting)."""
    levels = ["uid", "userns", "landlock"] if shutil.which("capsh") else ["userns", "landlock"]
    tests = node_ids_at_every_level()
    # an ordinary user's level fails at once where it cannot enter the clone, not after the others' gradings
    require_open([Path(sys.executable).parent, ROOT, tmp], Path(os.path.realpath(sys.executable)).parents[3], "nobody")
    with ThreadPoolExecutor(len(levels)) as pool:
        runs = dict(zip(levels, pool.map(lambda level: run_level(level, tmp, tests), levels), strict=True))
    failed = {level: out[-4000:] for level, (passed, out) in runs.items() if not passed}
    assert not failed, "\n".join(f"--- at {level}:\n{out}" for level, out in failed.items())
