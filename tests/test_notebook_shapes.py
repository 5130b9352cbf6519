"""A complete lab14 notebook changed as students change notebooks grades in full, with a note saying what was done.

The shapes (issue 28): a test cell deleted, a test cell duplicated by copy/paste, the file saved under a browser's
download name, every cell's metadata stripped by an editor, a test cell's points edited. nbgrader alone scored most
of them 0; here the real `nbgrader autograde` and `nbgrader export` grade them all in one run (one student each),
and `course grade` and `otter run` grade the metadata-less and the renamed notebook. A submission that cannot be
repaired (two notebooks, neither under the released name) stops with one line naming the student and the cause.

Every grading runs under COURSE_PROFILE=rehearsal (set in this process: nbgrader, `course grade`, the Gradescope
export and `otter run` inherit it, and the zip's course.yaml keeps its `profiles:`): the experiment trains 5 steps
with a bound any figure meets, so a complete notebook still scores every point. What is tested is the repair of each
shape, not the figure: the reference's full budget is tests/test_reference_lab14_transformers.py's.
"""
import copy
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from html import unescape
from pathlib import Path

import nbformat
import pytest

from autograder.course.config import ROOT, load_course
from autograder.notebooks.build import run_nbgrader
from autograder.notebooks.cells import nbgrader_meta
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from tests.test_nbgrader_roundtrip import CONFIG, gradebook_scores

pytestmark = [pytest.mark.grading, pytest.mark.slow]
AID = "lab14_transformers"
TOTAL = load_course().assignment(AID).total_points
TEST_CELL = "test_TransformerClassifier"
RENAMED = f"{AID} (1).ipynb"


def complete():
    return with_cells(release_notebook(AID), solved_sources(AID))


def without_metadata(nb):
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        cell.metadata = {}
    return nb


def shapes():
    """student -> (file name, notebook, a piece of the note its grading must carry; '' for the control)."""
    deleted, duplicated, points = complete(), complete(), complete()
    deleted.cells = [c for c in deleted.cells if nbgrader_meta(c).get("grade_id") != TEST_CELL]
    at = next(k for k, c in enumerate(duplicated.cells) if nbgrader_meta(c).get("grade_id") == TEST_CELL)
    duplicated.cells.insert(at + 1, copy.deepcopy(duplicated.cells[at]))
    duplicated.cells[at + 1].id = "pasted"  # Jupyter gives a pasted cell an id of its own
    next(c for c in points.cells if nbgrader_meta(c).get("grade_id") == TEST_CELL).metadata.nbgrader.points = 40
    return {"control": (f"{AID}.ipynb", complete(), ""),
            "deleted": (f"{AID}.ipynb", deleted, "no test cell for 'TransformerClassifier'; the released one was used"),
            "duplicated": (f"{AID}.ipynb", duplicated, f"'{TEST_CELL}' appeared 2 times"),
            "renamed": (RENAMED, complete(), f"submitted as '{RENAMED}'; it was graded as {AID}.ipynb"),
            "stripped": (f"{AID}.ipynb", without_metadata(complete()),
                         "no cell carried the nbgrader metadata of 'TransformerClassifier'"),
            "points": (f"{AID}.ipynb", points, f"'{TEST_CELL}' had its points changed to 40; the released 7 were used")}


def page_text(html):
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html)))


def test_nbgrader_grades_every_shape_in_full_with_its_note(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "rehearsal")
    started = time.monotonic()
    root = tmp_path / "course"
    (root / "source").mkdir(parents=True)
    shutil.copytree(ROOT / "assignments" / AID, root / "source" / AID)
    (root / "nbgrader_config.py").write_text(CONFIG.format(repo_config=str(ROOT / "nbgrader_config.py"),
                                                           root=str(root)))
    proc = run_nbgrader(["generate_assignment", AID, "--force"], root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    students = shapes()
    for student, (name, nb, _) in students.items():
        (root / "submitted" / student / AID).mkdir(parents=True)
        nbformat.write(nb, root / "submitted" / student / AID / name)
    for name in ("draft.ipynb", "final.ipynb"):  # which one to grade? not for the grader to guess
        (root / "submitted" / "dana" / AID).mkdir(parents=True, exist_ok=True)
        nbformat.write(complete(), root / "submitted" / "dana" / AID / name)

    t0 = time.monotonic()
    proc = run_nbgrader(["autograde", AID, "--force"], root)
    autograde_s = time.monotonic() - t0
    log = (proc.stdout + proc.stderr).splitlines()
    assert proc.returncode == 1, "dana's submission cannot be graded: autograde must say so"
    cause = [line for line in log if "ERROR" in line and "student 'dana': not graded: 2 notebooks" in line]
    assert len(cause) == 1 and "(draft.ipynb, final.ipynb) and none named" in cause[0], log[-30:]
    scores = gradebook_scores(root, AID)
    assert "dana" not in scores, "an ungraded submission must not sit in the gradebook as a score"
    assert scores == pytest.approx({student: TOTAL for student in students}), "\n".join(log[-40:])
    for student, (_, _, note) in students.items():
        said = [line for line in log if f"student '{student}'" in line]
        assert any(note in line for line in said) if note else said == [], (student, said)
    assert (root / "submitted" / "renamed" / AID / RENAMED).exists(), "the student's file is left as submitted"

    proc = run_nbgrader(["generate_feedback", AID, "--force"], root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for student, (_, _, note) in students.items():
        html = (root / "feedback" / student / AID / f"{AID}.html").read_text()
        head = page_text(html[:html.index('id="notebook"')])
        assert (note in head) if note else ("was used" not in head and "was graded" not in head), (student, head[:600])

    proc = run_nbgrader(["export", "--to", str(tmp_path / "grades.csv")], root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(tmp_path / "grades.csv") as grades:
        rows = {r["student_id"]: float(r["score"]) for r in csv.DictReader(grades)}
    assert rows == pytest.approx({student: TOTAL for student in students})
    print(f"\nnbgrader shapes: autograde of {len(students) + 1} students {autograde_s:.0f} s, "
          f"the whole test {time.monotonic() - started:.0f} s")


def test_course_grade_and_otter_grade_metadata_less_and_renamed_notebooks_in_full(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "rehearsal")
    from autograder.integrations.gradescope import export_gradescope
    from tests.test_gradescope import otter_run
    started = time.monotonic()
    folder = tmp_path / "submissions"
    notebooks = {"stripped": folder / "erin" / f"{AID}.ipynb", "renamed": folder / "frank" / RENAMED}
    made = shapes()
    for shape, path in notebooks.items():
        path.parent.mkdir(parents=True)
        nbformat.write(made[shape][1], path)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([str(Path(sys.executable).with_name("course")), "grade", str(folder), "-a", AID, "--device",
                           "cpu", "--json", str(tmp_path / "grades.json")], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ours = {Path(r["extra_data"]["notebook"]).name: r for r in json.loads((tmp_path / "grades.json").read_text())}
    assert sorted(ours) == sorted(p.name for p in notebooks.values()), sorted(ours)
    zip_path = export_gradescope(AID, tmp_path / "autograder.zip", device="cpu")
    for shape, path in notebooks.items():
        assert ours[path.name]["score"] == pytest.approx(TOTAL), (shape, ours[path.name].get("output"))
    # Otter on the metadata-less one only: a renamed file is no news to Otter, which is handed the file itself
    # (and each Otter run trains memory_task again, in the zip's own course folder)
    path, note = notebooks["stripped"], made["stripped"][2]
    theirs = otter_run(zip_path, path, tmp_path / "otter-stripped")
    assert sum(t["score"] for t in theirs["tests"]) == pytest.approx(TOTAL), theirs.get("output")  # Gradescope adds
    assert [(t["name"], t["score"]) for t in theirs["tests"]] == \
        [(t["name"], t["score"]) for t in ours[path.name]["tests"]]
    assert note and note in ours[path.name]["output"] and note in theirs["output"], theirs["output"]
    print(f"\ncourse grade + otter run, metadata-less and renamed: {time.monotonic() - started:.0f} s")
