"""A TA's written grades through every later autograde, on a fresh clone with nbgrader's real gradebook and commands:
formgrader's Autograde button (the function its handler awaits, which runs the command), `nbgrader autograde
--force` and `course regrade`. alice's answers are graded once and keep their grade throughout; bob rewrites one
answer after it was graded, and that answer alone is pending again. The four outputs then agree on both: the
feedback page, the gradebook, `nbgrader export` and `course export grades`.

Both notebooks solve one cheap item and train nothing, so that each grading is seconds: the written answers are what
is tested. autograder/integrations/nbgrader_grades.py is the step under test; tests/unit/test_written_grades_kept.py
covers its rules one by one.
"""
import asyncio
import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.course.config import load_course
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from tests.test_formgrader import answered
from tests.test_ta_workflow import fresh_clone

pytestmark = [pytest.mark.grading, pytest.mark.slow]
AID = "lab14_transformers"
ITEM = "scaled_dot_product_attention"  # the one item solved: its checks only, no training
COMMENTS = {"alice": "Clear, but say why the scaling keeps the softmax from saturating.", "bob": "Right."}
SCORES = {"alice": 1.5, "bob": 2.0}
CHANGED = "answer_scaling"  # the answer bob rewrites after it was graded


def notebook(student, rewritten=False):
    """The release with ITEM solved and every written answer given (bob's CHANGED one rewritten when asked)."""
    answers = {gid: f"{student}'s answer to {gid}: $\\sqrt{{d_k}}$ keeps the logits' variance at 1."
               for gid in load_course().assignment(AID).written}
    if rewritten:
        answers[CHANGED] += " And without it the softmax saturates, so its gradients vanish."
    return answered(with_cells(release_notebook(AID), solved_sources(AID, [ITEM])), answers)


def submit(clone, student, nb):
    folder = clone / ".nbgrader" / "submitted" / student / AID
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / f"{AID}.ipynb")


def run(clone, *commands):
    """Each command in the clone, as a TA types it; the last one's output (stdout and stderr)."""
    for command in commands:
        proc = subprocess.run(command, shell=True, cwd=clone, capture_output=True, text=True)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def ta_grades(clone, student):
    """Every written answer of `student` graded and commented as formgrader's boxes send it (its API handlers)."""
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{clone}/.nbgrader/gradebook.db") as gb:
        for gid in load_course().assignment(AID).written:
            grade = gb.find_grade(gid, AID, AID, student)
            grade.manual_score, grade.extra_credit = SCORES[student], None
            grade.needs_manual_grade = False
            gb.find_comment(gid, AID, AID, student).manual_comment = f"{COMMENTS[student]} ({gid})"
        gb.db.commit()


def gradebook(clone):
    """student -> (nbgrader's total, the written answers' points or None when pending, the answers pending,
    {answer: (manual score, the TA's comment)})."""
    from nbgrader.api import Gradebook

    from autograder.reports.written import written_of_submission
    out = {}
    with Gradebook(f"sqlite:///{clone}/.nbgrader/gradebook.db") as gb:
        for sub in gb.find_assignment(AID).submissions:
            nb = gb.find_submission_notebook(AID, AID, sub.student.id)
            comments = {c.name: c.manual_comment for c in nb.comments}
            out[sub.student.id] = (sub.score, written_of_submission(sub).score,
                                   sorted(g.name for g in nb.grades if g.needs_manual_grade),
                                   {g.name: (g.manual_score, comments.get(g.name)) for g in nb.grades
                                    if g.name.startswith("answer_")})
    return out


def test_a_written_grade_outlives_every_autograde_and_a_changed_answer_is_pending_everywhere(tmp_path, monkeypatch):
    clone = fresh_clone(tmp_path / "clone")
    monkeypatch.setenv("PYTHONPATH", str(clone))
    monkeypatch.setenv("COURSE_MNIST_DIR", str(load_course().mnist_dir))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    (clone / "roster.csv").write_text("student,email\nalice,alice@x.edu\nbob,bob@x.edu\n")
    for student in COMMENTS:
        submit(clone, student, notebook(student))
    run(clone, f"course release {AID}", f"nbgrader autograde {AID}")
    written = load_course().assignment(AID).written
    assert {s: g[2] for s, g in gradebook(clone).items()} == {s: sorted(written) for s in COMMENTS}  # to grade
    for student in COMMENTS:
        ta_grades(clone, student)
    graded = gradebook(clone)
    automatic = load_course().assignment(AID).item_points(ITEM)
    alice_written, max_written = SCORES["alice"] * len(written), load_course().assignment(AID).written_points
    assert graded["alice"][:3] == (automatic + alice_written, alice_written, [])

    # formgrader's Autograde button on alice: what its handler awaits, the command in a process of its own
    from autograder.integrations.formgrader import autograde
    pressed = asyncio.run(autograde(clone, AID, "alice"))
    assert pressed["success"], pressed.get("log", "")[-3000:]
    assert gradebook(clone)["alice"] == graded["alice"]

    # bob rewrites one graded answer and submits again; the class is autograded again by the command
    submit(clone, "bob", notebook("bob", rewritten=True))
    log = run(clone, f"nbgrader autograde {AID} --force")
    assert f"student 'bob': {CHANGED}: the answer changed since a TA graded it; the TA's grade (2 points, comment " \
           f"'{COMMENTS['bob']} ({CHANGED})') is taken off" in log, log[-3000:]
    assert "student 'alice': answer_" not in log, log[-3000:]  # alice's grades stay, without a word
    after = gradebook(clone)
    assert after["alice"] == graded["alice"]
    bob_written = SCORES["bob"] * (len(written) - 1)  # what is graded of bob's answers now
    assert after["bob"][:3] == (automatic + bob_written, None, [CHANGED])
    assert after["bob"][3][CHANGED] == (None, None)
    assert all(after["bob"][3][g] == graded["bob"][3][g] for g in written if g != CHANGED)

    # `course grade`, then `course regrade` (it reads the gradebook, writes nothing there), then every output
    run(clone, f"course grade .nbgrader/submitted/ -a {AID} --results-dir graded/{AID}/")
    table = run(clone, f"course regrade graded/{AID}/ -a {AID}")
    rows = {line.split()[0]: line for line in table.splitlines() if line.split()[:1] in (["alice"], ["bob"])}
    assert re.search(rf"\s{alice_written:g}/{max_written:g}(\s|$)", rows["alice"]), table
    assert re.search(rf"\spending/{max_written:g} \(4 of 5 graded\)", rows["bob"]), table
    assert gradebook(clone) == after
    run(clone, f"nbgrader generate_feedback {AID} --force", "nbgrader export --to export.csv",
        "course export grades graded/ --roster roster.csv --lms csv -o course.csv")

    with open(clone / "export.csv") as f:
        exported = {r["student_id"]: r for r in csv.DictReader(f)}
    with open(clone / "course.csv") as f:
        course = {r["student"]: r for r in csv.DictReader(f)}
    feedback = {s: re.sub(r"\s+", " ", (clone / ".nbgrader" / "feedback" / s / AID / f"{AID}.html").read_text())
                for s in COMMENTS}
    # alice: graded, 7.5 of 10, in all four
    assert (float(exported["alice"]["written_score"]), exported["alice"]["written_status"]) == (alice_written,
                                                                                                 "graded")
    assert float(exported["alice"]["score"]) == after["alice"][0] == automatic + alice_written
    assert float(course["alice"][f"{AID}:written"]) == alice_written
    assert float(course["alice"][f"{AID}:final"]) == automatic + alice_written
    assert f"Written answers: {alice_written:g} / {max_written:g}.0 (graded by your TA)" in feedback["alice"]
    assert f"{AID}: {float(automatic + alice_written)} / " in feedback["alice"]
    assert feedback["alice"].count(f"Score: {SCORES['alice']:g} / 2.0") == len(written)
    assert all(f"{COMMENTS['alice']} ({gid})" in feedback["alice"] for gid in written)
    # bob: pending in all four, the rewritten answer without its old score or comment, the others still graded
    assert (exported["bob"]["written_score"], exported["bob"]["written_status"]) == ("", "pending")
    assert float(exported["bob"]["score"]) == after["bob"][0]  # nbgrader's total: what is graded so far
    assert course["bob"][f"{AID}:written"] == "" and float(course["bob"][f"{AID}:final"]) == automatic
    assert f"Written answers: not graded yet ({max_written:g}.0 points; your TA grades them)" in feedback["bob"]
    assert feedback["bob"].count("Not graded yet: 2.0 points") == 1
    assert feedback["bob"].count(f"Score: {SCORES['bob']:g}.0 / 2.0") == len(written) - 1
    assert f"({CHANGED})" not in feedback["bob"] and f"{COMMENTS['bob']} (answer_explorations)" in feedback["bob"]
    assert "saturates, so its gradients vanish" in feedback["bob"]  # the feedback shows the new text
