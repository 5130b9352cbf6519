"""`course doctor`, the real command on a fresh copy of the repository: well as root and as an ordinary user, and
one FIX line per problem (no MNIST, an unwritable cache, no isolation to be had), exit 1 then.

Each run grades the three reference solutions (`--quick`: without their experiments, about a minute on two
cores); the full form runs once, as root and offline, under COURSE_PROFILE=rehearsal (each experiment a few steps on
its first seed, bounds any figure meets).
"""
import re
import sys

import pytest

from autograder.course.config import load_course
from autograder.sandbox.grader_side import can_isolate
from tests.first_run import REHEARSAL, course, course_as_user, ensure_user, fresh_clone, remove_user, user_home
from tests.test_isolation_levels import CLI_WITHOUT

pytestmark = [pytest.mark.grading, pytest.mark.slow]
AIDS = list(load_course().assignments)
ITEMS = ("isolation", "MNIST", "device", "cache", "versions")


@pytest.fixture
def clone(tmp):
    return fresh_clone(tmp)


@pytest.fixture
def user():
    if not can_isolate():
        pytest.skip("making an ordinary user needs root")
    yield ensure_user()
    remove_user()


def screen(run):
    """label -> the doctor's line, and its FIX lines."""
    lines = run.stdout.splitlines()
    items = {line.split()[0]: line for line in lines if line.split()[:1] and line.split()[0] in ITEMS + tuple(AIDS)}
    return items, [line for line in lines if line.startswith("FIX ")]


def well(run, level):
    """A quick doctor that found nothing wrong: every item shown, each assignment's reference at full marks."""
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    items, fixes = screen(run)
    assert not fixes and "Traceback" not in run.stdout + run.stderr
    assert set(items) == set(ITEMS + tuple(AIDS)), run.stdout
    assert items["isolation"].split()[1].rstrip(":") == level
    assert "test split" in items["MNIST"] and "data/mnist" in items["MNIST"]
    assert re.search(r"torch \S+, nbgrader \S+, otter-grader \S+", items["versions"])
    assert re.search(r"writable, [\d.]+ GB free", items["cache"])
    for aid in AIDS:
        score, top = re.search(r"(\S+)/(\S+) in \d+ s", items[aid]).groups()
        assert score == top, items[aid]
    assert "all well" in run.stdout.splitlines()[-1]
    return items


def test_quick_is_well_as_an_ordinary_user(clone, user, tmp):
    """The user can read the copy, not write it: the cache is its own (HOME), the level user namespaces."""
    home = user_home(tmp, user)
    items = well(course_as_user(clone, home, "doctor", "--quick", "--device", "cpu"), "userns")
    assert "a higher level needs namespaces: grade as root" in items["isolation"]
    assert str(home) in items["cache"].split(": writable")[0]


def test_no_mnist_and_an_unwritable_cache_are_one_fix_line_each(clone, tmp):
    """.grader/cache a file (the course's cache folder cannot be made; .grader holds the committed curves), the
    user's cache folder under a file too."""
    (clone / ".grader" / "cache").write_text("not a folder")
    (tmp / "empty").mkdir()
    run = course(clone, "doctor", "--quick", "--device", "cpu",
                 env={"COURSE_MNIST_DIR": str(tmp / "empty"), "XDG_CACHE_HOME": str(clone / ".grader" / "cache" / "x")})
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    items, fixes = screen(run)
    assert len(fixes) == 2, run.stdout
    mnist, cache = fixes
    assert "MNIST not found" in mnist and str(tmp / "empty") in mnist and "set COURSE_MNIST_DIR" in mnist
    assert "experiment cache cannot be written" in cache and "XDG_CACHE_HOME" in cache
    assert items["MNIST"].startswith("MNIST") and "not writable" in items["cache"]
    assert all(f"{aid}" in items for aid in AIDS), "the references are still graded: the rest is checked too"
    assert "2 problem(s)" in run.stdout.splitlines()[-1] and "Traceback" not in run.stdout + run.stderr


def test_a_machine_that_isolates_nothing_is_one_fix_line(clone, user, tmp):
    """An ordinary user whose user namespaces and Landlock are refused (seccomp, as tests/test_isolation_levels
    makes it): level `process`, which grading refuses; the fix names what would give a level."""
    home = user_home(tmp, user)
    script = tmp / "no_landlock.py"
    script.write_text(CLI_WITHOUT)
    script.chmod(0o644)
    child_main = clone / "autograder" / "sandbox" / "child" / "__main__.py"
    program = (sys.executable, str(script), str(child_main), "no-landlock")
    run = course_as_user(clone, home, "doctor", "--quick", "--device", "cpu", program=program)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    items, fixes = screen(run)
    assert len(fixes) == 1, run.stdout
    assert "no isolation for the student's code" in fixes[0] and "--allow-unisolated" in fixes[0]
    assert "grade as root" in fixes[0] and "user namespaces" in fixes[0]
    assert "not graded" in run.stdout and not any(aid in items for aid in AIDS)


def test_the_full_form_is_well_on_a_fresh_clone_as_root_and_shows_each_experiment_s_margin(clone):
    """Offline, as root: the highest level, the course's own cache. (`--quick` on a fresh clone, the same screen
    less the experiments, is the ordinary user's test: one run as root grades the references once, not twice.)"""
    run = course(clone, "doctor", "--device", "cpu", network=False, env=REHEARSAL)
    assert "profile `rehearsal`" in run.stderr, run.stderr[-2000:]  # the profile reached the command
    items = well(run, "namespaces")
    assert "the highest level" in items["isolation"] and str(clone / ".grader" / "cache") in items["cache"]
    graded = [name for aid in AIDS for name, exp in load_course().assignment(aid).experiments.items() if exp.graded]
    shown = {line.split()[0]: line for line in run.stdout.splitlines() if line.startswith("    ")}
    assert set(shown) == set(graded), run.stdout
    for _name, line in shown.items():
        assert re.search(r"\[(>= -1e\+30|<= 1e\+30)\] margin \+", line), line  # the profile keeps each bound's side
        assert re.search(r"\d+ s of its \d+ s limit", line), line
