"""The README's main command as a newcomer meets it: `course demo` in a fresh copy of the repository with nothing
beside it (no ../shared) and no network, and the same with MNIST missing.

Both runs are under COURSE_PROFILE=rehearsal (course.yaml's profiles: each experiment 5 steps on its first seed,
bounds any figure meets): the pipeline is the demo's own, its trainings take seconds. The full-length demo is the
README's command; its figures are course.yaml's.
"""
import re

import pytest

from autograder.course.config import load_course
from tests.first_run import REHEARSAL, course, fresh_clone

pytestmark = [pytest.mark.grading, pytest.mark.slow]
AIDS = list(load_course().assignments)


def test_the_main_command_grades_every_assignment_offline_then_a_missing_mnist_is_one_line_with_its_fix(tmp):
    """One copy for both runs (a copy and its release cost half a run): the second, under the same profile, finds
    the first's cached trainings, as a newcomer's second run would, and fails only where MNIST is needed."""
    clone = fresh_clone(tmp)
    assert not (clone.parent / "shared").exists()
    run = course(clone, "demo", "--device", "cpu", network=False, env=REHEARSAL)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "profile `rehearsal`" in run.stderr, run.stderr[-2000:]  # the profile reached the command
    assert f"MNIST: the 10,000-image test split in {clone / 'data' / 'mnist'}" in run.stdout
    assert "Traceback" not in out and "grader error" not in run.stdout
    for aid in AIDS:
        assert f"2. {aid}: example submissions" in run.stdout
    # the complete submission's total in each assignment's table (a wide table is printed in blocks of columns, the
    # total in the last): full marks, since the rehearsal's thresholds are met by any run
    assert len(re.findall(r"^complete\b.*\s(\d+)/\1\s*$", run.stdout, re.MULTILINE)) == len(AIDS), run.stdout

    (tmp / "empty").mkdir()
    run = course(clone, "demo", "--device", "cpu", network=False,
                 env={**REHEARSAL, "COURSE_MNIST_DIR": str(tmp / "empty")})
    out = run.stdout + run.stderr
    assert run.returncode == 3, out[-4000:]
    assert "Traceback" not in out
    assert "grader error" in run.stdout
    causes = [line for line in out.splitlines() if "MNIST not found" in line]
    assert len(causes) == 1, "\n".join(causes)  # once for the batch, not once per submission
    assert str(tmp / "empty") in causes[0] and "COURSE_MNIST_DIR" in causes[0]
    assert re.search(r"grader-errors\.log", out), "the line names the log file holding the tracebacks"
