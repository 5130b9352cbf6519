"""A TA's grade of a written answer through later autogrades (autograder/integrations/nbgrader_grades.py), on a real
nbgrader gradebook with one answer cell, as nbgrader's autograde saves it: kept while the text is the one graded,
taken off and pending when it changed, never brought back for another text. The whole path (the command, the
Autograde button, `course regrade`, the four outputs) is tests/test_written_regrade.py."""
import logging
import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook
from nbgrader.preprocessors import SaveAutoGrades
from nbgrader.utils import compute_checksum

from autograder.integrations.nbgrader_grades import SaveGrades
from autograder.reports.written import written_of_submission

RELEASED = "YOUR ANSWER HERE"
META = {"grade": True, "solution": True, "locked": False, "points": 2.0, "grade_id": "answer_x", "schema_version": 3}


def answer(text):
    cell = nbformat.v4.new_markdown_cell(text, metadata={"nbgrader": dict(META)})
    cell.metadata.nbgrader["checksum"] = compute_checksum(nbformat.v4.new_markdown_cell(
        RELEASED, metadata={"nbgrader": dict(META)}))  # as OverwriteCells leaves it: the release's
    return cell


@pytest.fixture
def gradebook(tmp_path, monkeypatch):
    """A gradebook with assignment a1, notebook lab, one written answer worth 2 points, and bob's submission."""
    # nbgrader stamps a new gradebook's version with its `alembic` command, beside this Python
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    url = f"sqlite:///{tmp_path}/gradebook.db"
    released = answer(RELEASED)
    with Gradebook(url) as gb:
        gb.add_assignment("a1")
        gb.add_notebook("lab", "a1")
        gb.add_grade_cell("answer_x", "lab", "a1", max_score=2.0, cell_type="markdown")
        gb.add_solution_cell("answer_x", "lab", "a1")
        gb.add_source_cell("answer_x", "lab", "a1", cell_type="markdown", locked=False, source=RELEASED,
                           checksum=compute_checksum(released))
        gb.add_student("bob")
        gb.add_submission("a1", "bob")
    return url


def autograde(url, text, saver=SaveGrades):
    """nbgrader's autograde step that saves grades, on bob's notebook with `text` as his answer."""
    nb = nbformat.v4.new_notebook(cells=[answer(text)])
    saver().preprocess(nb, {"nbgrader": {"notebook": "lab", "assignment": "a1", "student": "bob", "db_url": url}})


def ta_grades(url, score, comment):
    """What formgrader's grade and comment boxes send (its API handlers' code)."""
    with Gradebook(url) as gb:
        grade = gb.find_grade("answer_x", "lab", "a1", "bob")
        grade.manual_score, grade.extra_credit = score, 0.5
        grade.needs_manual_grade = False
        gb.find_comment("answer_x", "lab", "a1", "bob").manual_comment = comment
        gb.db.commit()


def state(url):
    """(manual score, extra credit, the TA's comment, needs manual grade, the course's written points or None when
    pending, nbgrader's total)."""
    with Gradebook(url) as gb:
        grade = gb.find_grade("answer_x", "lab", "a1", "bob")
        comment = gb.find_comment("answer_x", "lab", "a1", "bob")
        submission = gb.find_submission("a1", "bob")
        return (grade.manual_score, grade.extra_credit, comment.manual_comment, grade.needs_manual_grade,
                written_of_submission(submission).score, submission.score)


def test_nbgraders_own_step_makes_a_graded_answer_pending_again(gradebook):
    """What the course's step replaces: nbgrader's SaveAutoGrades flags the graded answer, and the course's views
    (pending) and nbgrader's total (1.5 + 0.5 counted) disagree."""
    autograde(gradebook, "attention is quadratic", SaveAutoGrades)
    ta_grades(gradebook, 1.5, "right, but say why")
    autograde(gradebook, "attention is quadratic", SaveAutoGrades)
    assert state(gradebook) == (1.5, 0.5, "right, but say why", True, None, 2.0)


def test_a_graded_answer_keeps_its_grade_while_its_text_is_the_one_graded(gradebook):
    autograde(gradebook, "attention is quadratic")
    assert state(gradebook) == (None, None, None, True, None, 0.0)  # written, not graded yet
    ta_grades(gradebook, 1.5, "right, but say why")
    for _ in range(2):
        autograde(gradebook, "attention is quadratic")
        assert state(gradebook) == (1.5, 0.5, "right, but say why", False, 2.0, 2.0)


def test_a_changed_answer_is_pending_and_its_old_grade_never_comes_back(gradebook, caplog):
    autograde(gradebook, "attention is quadratic")
    ta_grades(gradebook, 1.5, "right, but say why")
    with caplog.at_level(logging.WARNING):
        autograde(gradebook, "attention is quadratic in the sequence length")
    assert state(gradebook) == (None, None, None, True, None, 0.0)
    said = [r.getMessage() for r in caplog.records if "answer_x" in r.getMessage()]
    assert said == ["student 'bob': answer_x: the answer changed since a TA graded it; the TA's grade (1.5 points, "
                    "+0.5 extra credit, comment 'right, but say why') is taken off and kept in the gradebook's "
                    "course_answer table: grade it again in formgrader"]
    autograde(gradebook, "attention is quadratic in the sequence length")  # the same new text: still pending
    assert state(gradebook) == (None, None, None, True, None, 0.0)
    ta_grades(gradebook, 2.0, "yes")  # graded again, then kept
    autograde(gradebook, "attention is quadratic in the sequence length")
    assert state(gradebook) == (2.0, 0.5, "yes", False, 2.5, 2.5)
    autograde(gradebook, "attention is quadratic")  # back to the first text, graded 1.5 once: that grade stays off
    assert state(gradebook) == (None, None, None, True, None, 0.0)
    with Gradebook(gradebook) as gb:
        from sqlalchemy import text
        replaced = gb.db.execute(text("SELECT replaced FROM course_answer")).scalar_one()
    assert '"manual_score": 1.5' in replaced and '"manual_score": 2.0' in replaced


def test_an_answer_put_back_as_released_scores_0_as_nbgrader_scores_it(gradebook):
    autograde(gradebook, "attention is quadratic")
    ta_grades(gradebook, 1.5, "right")
    autograde(gradebook, RELEASED)
    assert state(gradebook) == (None, None, None, False, 0.0, 0.0)


def test_a_grade_given_before_its_text_was_recorded_is_pending_and_said(gradebook, caplog):
    """A gradebook graded before the course recorded answers' texts: nothing vouches for the text graded."""
    autograde(gradebook, "attention is quadratic", SaveAutoGrades)
    ta_grades(gradebook, 1.5, "right")
    with caplog.at_level(logging.WARNING):
        autograde(gradebook, "attention is quadratic")
    assert state(gradebook) == (None, None, None, True, None, 0.0)
    assert any("answer_x: the answer graded before its text was recorded; the TA's grade (1.5 points" in
               r.getMessage() for r in caplog.records)
