"""One fixture, three paths, one grade: four lab14 submissions late in four ways give the policy's final scores
through `course grade` + `course export grades`, through `nbgrader autograde` + `nbgrader export`, and through the
Gradescope zip's grading with the matching submission_metadata.json.

The course is a fresh clone with a due time and a late policy in its course.yaml: grace 15 minutes, 10% per started
day, half the raw score kept at least, closed after 7 days. The four are the complete notebook (29 points):
on time, inside the grace period, 25 hours late (2 started days: 23.2), and 25 hours late with a 2-day extension
(on time: 29); Gradescope's extension is the user's own due date in its metadata.

Every grading runs under COURSE_PROFILE=rehearsal (set in this process: `run`'s commands and the Gradescope grading
here inherit it): the experiment trains 5 steps with a bound any figure meets, so the complete notebook still has its
29 raw points, and what is tested is the late policy's arithmetic on them along the three paths.
"""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from autograder.course.config import load_course
from autograder.notebooks.examples import examples
from tests.test_ta_workflow import fresh_clone

pytestmark = [pytest.mark.grading, pytest.mark.slow]
AID = "lab14_transformers"
DUE = "2026-12-12T23:59:00+05:30"  # 18:29 UTC
SUBMITTED = {"ontime": "2026-12-12 18:00:00.000000 UTC", "grace": "2026-12-12 18:39:00.000000 UTC",
             "late": "2026-12-13 19:29:00.000000 UTC", "extended": "2026-12-13 19:29:00.000000 UTC"}
EXPECTED = {"ontime": 29, "grace": 29, "late": 23.2, "extended": 29}  # the policy's arithmetic on 29 raw points
POLICY = {"grace_minutes": 15, "percent_per_day": 10, "floor_percent": 50, "close_days": 7}


def semester_clone(tmp_path):
    clone = fresh_clone(tmp_path / "clone")
    raw = yaml.safe_load((clone / "course.yaml").read_text())
    raw["late"], raw["assignments"][AID]["due"] = POLICY, DUE
    (clone / "course.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    (clone / "roster.csv").write_text("student,email\n" + "".join(f"{s},{s}@x.edu\n" for s in SUBMITTED))
    return clone


def place(folder):
    """The four submissions as nbgrader's collect leaves them: <student>/<aid>/<aid>.ipynb and timestamp.txt."""
    complete = examples(AID)["complete"]
    for student, when in SUBMITTED.items():
        dest = folder / student / AID
        dest.mkdir(parents=True)
        nbformat.write(complete, dest / f"{AID}.ipynb")
        (dest / "timestamp.txt").write_text(when)


def run(clone, *commands):
    env = {**os.environ, "PYTHONPATH": str(clone), "COURSE_MNIST_DIR": str(load_course().mnist_dir),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for command in commands:
        proc = subprocess.run(command, shell=True, cwd=clone, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_one_fixture_three_paths_one_grade(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "rehearsal")
    clone = semester_clone(tmp_path)
    place(clone / ".nbgrader" / "submitted")
    run(clone, f"course release {AID}", f"course extend extended {AID} --days 2 --roster roster.csv")

    # 1. course grade + course export grades
    run(clone, f"course grade .nbgrader/submitted/ -a {AID} --results-dir graded/{AID}/",
        "course export grades graded/ --roster roster.csv --lms csv -o course.csv")
    with open(clone / "course.csv") as f:
        by_course = {r["student"]: float(r[f"{AID}:final"]) for r in csv.DictReader(f)}
    assert by_course == pytest.approx(EXPECTED)

    # 2. nbgrader autograde + nbgrader export
    run(clone, f"nbgrader autograde {AID}", "nbgrader export --to nbgrader.csv")
    with open(clone / "nbgrader.csv") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert {s: float(r["score"]) for s, r in rows.items()} == pytest.approx(EXPECTED)
    assert rows["late"]["duedate"].startswith("2026-12-12 18:29:00")  # course release set it, in UTC
    assignment = load_course().assignment(AID)
    assert {i: float(rows["late"][f"item:{i}"]) for i in assignment.items} == {  # each item's points, raw
        i: assignment.item_points(i) for i in assignment.items}
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{clone}/.nbgrader/gradebook.db") as gb:  # what nbgrader stored at autograde
        stored = {s.student.id: s.score - s.late_submission_penalty for s in gb.find_assignment(AID).submissions}
    assert stored == pytest.approx(EXPECTED)

    # 3. the Gradescope zip's grading (run_autograder, as its run_otter.py calls it), with the matching metadata
    from autograder.integrations.otter_plugin import run_autograder
    from tests.test_gradescope_build import autograder_root
    monkeypatch.setenv("COURSE_CONFIG", str(clone / "course.yaml"))  # the zip's course.yaml: the clone's
    by_gradescope = {}
    for student, when in SUBMITTED.items():
        root = autograder_root(tmp_path / "gradescope" / student, examples(AID)["complete"])
        user_due = "2026-12-14T18:29:00+00:00" if student == "extended" else "2026-12-12T18:29:00+00:00"
        (root / "submission_metadata.json").write_text(json.dumps({
            "created_at": when.replace(" UTC", "+00:00"), "assignment": {"due_date": "2026-12-12T18:29:00+00:00"},
            "users": [{"name": student, "assignment": {"due_date": user_due}}]}))
        result = run_autograder(str(root))
        by_gradescope[student] = result["score"]
        if student == "late":
            late = [t for t in result["tests"] if t["name"] == "Late submission"]
            assert late and late[0]["score"] == pytest.approx(-5.8) and "2 days late: -20%" in late[0]["output"]
    assert by_gradescope == pytest.approx(EXPECTED)
