"""A TA's pytest settings are not the grader's: `PYTEST_ADDOPTS=--color=yes` (which CI services and many shells
set), PYTEST_PLUGINS, and a pytest.ini and conftest.py above the course and its submissions change no grade, on
`course grade` and `nbgrader autograde` alike (every grading ended as a grader error with a USAGE_ERROR before); and
a grading session that cannot start names pytest's own error, not only its exit code."""
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.course.config import load_course
from autograder.errors import GraderError
from autograder.grading import grade
from autograder.grading.grade import grade_notebook
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from tests.test_ta_workflow import fresh_clone

pytestmark = pytest.mark.grading
AID = "lab14_transformers"
SDPA = "scaled_dot_product_attention"  # the cheapest item to grade: no experiment
HOSTILE_INI = "[pytest]\naddopts = --color=yes -p no:python --strict-config\nrequired_plugins = pytest-not-installed\n"
HOSTILE_CONFTEST = "raise RuntimeError('a conftest.py of the TA: the grader never loads it')\n"
HOSTILE_PLUGIN = "raise RuntimeError('a pytest plugin of the TA: the grader never loads it')\n"


def hostile(folder):
    """A pytest.ini, a conftest.py and a plugin module that would each stop any pytest session they reach."""
    (folder / "pytest.ini").write_text(HOSTILE_INI)
    (folder / "conftest.py").write_text(HOSTILE_CONFTEST)
    (folder / "plugins").mkdir()
    (folder / "plugins" / "ta_plugin.py").write_text(HOSTILE_PLUGIN)
    return {"PYTEST_ADDOPTS": "--color=yes", "PYTEST_PLUGINS": "ta_plugin"}


def sdpa_only(path):
    """A lab14 submission at path with scaled_dot_product_attention written, the rest left as released."""
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(with_cells(release_notebook(AID), solved_sources(AID, [SDPA])), path)
    return path


def test_the_callers_pytest_settings_change_no_grade_and_are_left_as_they_were(tmp_path, monkeypatch):
    for name, value in hostile(tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    monkeypatch.chdir(tmp_path)  # the TA's folder, with its pytest.ini and conftest.py
    before = dict(os.environ)
    result = grade_notebook(sdpa_only(tmp_path / "alice" / f"{AID}.ipynb"), AID, items=[SDPA], device="cpu")
    points = load_course().assignment(AID).item_points(SDPA)
    assert (result["score"], result["max_score"]) == (points, points)
    assert dict(os.environ) == before  # the TA's settings are theirs again once the grading is done


def test_a_session_that_cannot_start_names_pytests_error(tmp_path, monkeypatch):
    suite = tmp_path / "test_broken.py"  # a suite with a test that scores no item: the suite's bug, not the student's
    suite.write_text("def test_unmarked():\n    pass\n")
    monkeypatch.setattr(grade, "suite_path", lambda aid: suite)
    with pytest.raises(GraderError, match=r"^the grading session ended \(USAGE_ERROR\) without results: no test "
                                          r"marked @pytest.mark.item\(name, kind\) was collected") as e:
        grade_notebook(sdpa_only(tmp_path / f"{AID}.ipynb"), AID, items=[SDPA], device="cpu")
    assert "\n" not in str(e.value)  # the cause is the one line a TA reads (batch/run.py failed_result)


@pytest.mark.slow
def test_course_grade_and_nbgrader_autograde_grade_as_without_the_tas_settings(tmp_path):
    """A fresh clone with a hostile pytest.ini and conftest.py at its root (above the hidden suites and
    .nbgrader/submitted/), the TA's PYTEST_ADDOPTS and PYTEST_PLUGINS set: both paths give the grade that a
    grading without them gives."""
    clone = fresh_clone(tmp_path / "clone")
    settings = hostile(clone)
    notebook = sdpa_only(clone / ".nbgrader" / "submitted" / "alice" / AID / f"{AID}.ipynb")
    expected = grade_notebook(notebook, AID, device="cpu")["score"]  # here: no such settings
    assert expected == load_course().assignment(AID).item_points(SDPA)
    env = {**os.environ, **settings, "PYTHONPATH": f"{clone}{os.pathsep}{clone / 'plugins'}",
           "COURSE_MNIST_DIR": str(load_course().mnist_dir),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for command in (f"course release {AID}", f"nbgrader autograde {AID}",
                    f"course grade .nbgrader/submitted/ -a {AID} --device cpu --csv grades.csv"):
        proc = subprocess.run(command, shell=True, cwd=clone, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert "grader error" not in proc.stdout + proc.stderr, f"{command}\n{proc.stderr[-3000:]}"
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{clone}/.nbgrader/gradebook.db") as gb:
        assert gb.find_submission(AID, "alice").score == expected
    rows = (clone / "grades.csv").read_text().splitlines()
    assert rows[1].split(",")[0] == "alice" and float(dict(zip(rows[0].split(","), rows[1].split(","),
                                                                   strict=True))["score"]) == expected
