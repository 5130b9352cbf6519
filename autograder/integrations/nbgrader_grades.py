"""nbgrader's SaveAutoGrades, keeping a TA's grade of a written answer through every later autograde.

nbgrader's SaveAutoGrades flags each cell with a manual score as needing manual grading again at every autograde (the
Autograde button, `nbgrader autograde --force`): an answer a TA graded would then be pending in every view that
reads the flag (reports/written.py), while nbgrader's own total still counted its score. Here a manually graded
answer (a solution cell that is a grade cell: the course's written answers) is judged by its text instead:

- its text is the one of the last autograde (nbgrader's compute_checksum over the cell, after nbgrader's
  sanitising): the TA graded this very text in formgrader, which shows the autograded notebook, so the TA's score,
  comment and extra credit stay and the answer is graded;
- its text changed: the TA's grade is of another text, so it is taken off (one line in the log, and kept in the
  gradebook's `course_answer` table, `replaced`) and the answer is pending, with no score, in every view.

Each autograde records each answer's checksum in that table, keyed by nbgrader's grade id: after any autograde, a
manual score in the gradebook is the grade of the text recorded. An answer graded before this table existed has no
record, so its text cannot be vouched for: it is pending again, its grade kept in the table and said in the log.
Every path that writes the gradebook runs this step: the command, formgrader's Autograde button (which runs the
command) and nbgrader's own button (the same configured preprocessors); `course grade` and `course regrade` only
read the gradebook.
"""
import json
from datetime import UTC, datetime

from nbgrader import utils
from nbgrader.api import MissingEntry
from nbgrader.preprocessors import SaveAutoGrades
from sqlalchemy import Column, MetaData, String, Table, Text, select

TABLES = MetaData()
ANSWERS = Table(
    "course_answer", TABLES,
    Column("grade_id", String(32), primary_key=True),   # nbgrader's Grade.id: one student's one answer
    Column("checksum", String(32), nullable=False),     # the answer's text at the last autograde
    Column("replaced", Text, nullable=False),           # JSON list: the TA's grades taken off, each with its text's
)


class SaveGrades(SaveAutoGrades):
    """nbgrader's SaveAutoGrades, then each manually graded answer kept graded or made pending by its text (module
    doc). In nbgrader_config.py's Autograde.autograde_preprocessors in place of SaveAutoGrades."""

    def _add_score(self, cell, resources):
        super()._add_score(cell, resources)
        if not utils.is_solution(cell):  # an autograded cell: nbgrader's own rule (a TA's override is reviewed again)
            return
        where = (cell.metadata.nbgrader["grade_id"], self.notebook_id, self.assignment_id, self.student_id)
        grade = self.gradebook.find_grade(*where)
        try:
            comment = self.gradebook.find_comment(*where)
        except MissingEntry:  # nbgrader makes one for every solution cell; without it there is no comment to keep
            comment = None
        note = keep_or_release(self.gradebook, grade, comment, utils.compute_checksum(cell))
        if note:
            self.log.warning("student '%s': %s", self.student_id, note)


def keep_or_release(gradebook, grade, comment, checksum):
    """Keep `grade` and `comment` (nbgrader's Grade and Comment of a manually graded answer, just autograded) when a
    TA graded the text whose checksum is `checksum`, else take the TA's grade off and leave the answer pending;
    record `checksum` as the answer's. A line for the log when a grade was taken off, else None."""
    db = gradebook.db
    TABLES.create_all(db.connection(), checkfirst=True)
    row = db.execute(select(ANSWERS).where(ANSWERS.c.grade_id == grade.id)).first()
    marks = {"manual_score": grade.manual_score, "extra_credit": grade.extra_credit,
             "manual_comment": comment.manual_comment if comment is not None else None}
    replaced = json.loads(row.replaced) if row is not None else []
    note = None
    if row is not None and row.checksum == checksum:
        if grade.manual_score is not None:  # SaveAutoGrades flagged it because it has a manual score
            grade.needs_manual_grade = False
    # a TA's marks: a score, or extra credit or a comment that says something (formgrader sends 0 extra credit)
    elif marks["manual_score"] is not None or marks["extra_credit"] or marks["manual_comment"]:
        replaced.append({**marks, "checksum": row.checksum if row is not None else None,
                         "replaced_at": datetime.now(UTC).isoformat(timespec="seconds")})
        grade.manual_score = grade.extra_credit = None
        if comment is not None:
            comment.manual_comment = None
        grade.needs_manual_grade = grade.auto_score is None
        why = "changed since a TA graded it" if row is not None else "graded before its text was recorded"
        note = (f"{grade.name}: the answer {why}; the TA's grade ({_marks_text(marks)}) is taken off and kept in the "
                f"gradebook's {ANSWERS.name} table: grade it again in formgrader")
    if row is None:
        db.execute(ANSWERS.insert().values(grade_id=grade.id, checksum=checksum, replaced=json.dumps(replaced)))
    else:
        db.execute(ANSWERS.update().where(ANSWERS.c.grade_id == grade.id).values(checksum=checksum,
                                                                                 replaced=json.dumps(replaced)))
    db.commit()
    return note


def _marks_text(marks):
    parts = [f"{marks['manual_score']:g} points" if marks["manual_score"] is not None else "no score"]
    if marks["extra_credit"]:
        parts.append(f"{marks['extra_credit']:+g} extra credit")
    if marks["manual_comment"]:
        parts.append(f"comment {marks['manual_comment']!r}")
    return ", ".join(parts)
