"""`course check`'s device rule (autograder/apps/check_device.py): an item checked on the fake GPU at grading whose
test cell has no public device check is named; the course's own notebooks have none."""
import nbformat

from autograder.apps import check_device
from autograder.course.config import load_course
from autograder.notebooks.build import notebook_path
from autograder.notebooks.cells import nbgrader_meta

AID, ITEM = "w8l4_transformers", "greedy_decode"


def test_every_item_checked_on_the_fake_gpu_has_a_public_device_check():
    course = load_course()
    assert [p for aid, a in course.assignments.items() for p in check_device.device_check_problems(aid, a)] == []


def test_a_test_cell_without_its_device_check_is_named(tmp_path, monkeypatch):
    nb = nbformat.read(notebook_path(AID), as_version=4)
    cell = next(c for c in nb.cells if nbgrader_meta(c).get("grade_id") == f"test_{ITEM}")
    cell.source = "\n".join(line for line in cell.source.splitlines() if ".device(" not in line)
    nbformat.write(nb, tmp_path / f"{AID}.ipynb")
    monkeypatch.setattr("autograder.notebooks.build.notebook_path", lambda aid: tmp_path / f"{aid}.ipynb")
    problems = check_device.device_check_problems(AID, load_course().assignment(AID))
    assert len(problems) == 1 and f"the test cell of '{ITEM}' has no public device check" in problems[0], problems
