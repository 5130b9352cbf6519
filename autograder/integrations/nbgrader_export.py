"""`nbgrader export` for this course: nbgrader's columns, the automatic and the written points apart, each item's.

nbgrader's own CSV has one total per student and assignment. Here `score` is still nbgrader's total less the late
penalty (what an LMS imports), the penalty computed from the submission's timestamp, course.yaml's late policy and
today's extensions (nbgrader_late.py), and beside it the grader's automatic points (the penalty is on these) and the
written answers' (graded by TAs in formgrader; blank and `pending` until every answer is graded): reports/written.py.
Written with the csv module, every text cell guarded against spreadsheet formulas (nbgrader's own writes names
unquoted), and every score to the cent as `course export grades` writes it (reports/tables.py score_text; nbgrader's
own writes the float unrounded), the row adding up: raw_score - late_submission_penalty = score.
"""
import csv

from nbgrader.api import MissingEntry
from nbgrader.plugins.export import ExportPlugin

from autograder.course.config import load_course
from autograder.integrations.nbgrader_late import course_penalty
from autograder.reports.tables import as_cell, penalty_text, score_text
from autograder.reports.written import automatic_of_submission, written_of_submission

COLUMNS = ["assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email", "raw_score",
           "late_submission_penalty", "score", "max_score", "automatic_score", "automatic_max_score", "written_score",
           "written_max_score", "written_status"]


class CourseExportPlugin(ExportPlugin):
    """nbgrader's CSV with the automatic and written points apart (module doc); `--assignment`, `--student` and
    `--to` as nbgrader's."""

    def export(self, gradebook):
        dest = self.to or "grades.csv"
        assignments, students = [str(a) for a in self.assignment], [str(s) for s in self.student]
        self.log.info("Exporting grades to %s", dest)
        chosen = [a for a in gradebook.assignments if not assignments or a.name in assignments]
        # one column per test cell of the assignments exported (`item:<name>`, the grader's points), blank elsewhere
        items = list(dict.fromkeys(c.name[len("test_"):] for a in chosen for nb in a.notebooks for c in nb.grade_cells
                                   if c.name.startswith("test_")))
        with open(dest, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow([*COLUMNS, *(f"item:{i}" for i in items)])
            for assignment in chosen:
                for student in gradebook.students:
                    if students and student.id not in students:
                        continue
                    row = [as_cell(assignment.name), assignment.duedate or "", *self.submitted(
                        gradebook, assignment, student)]
                    out.writerow([*row, *self.item_points(gradebook, assignment, student, items)])

    @staticmethod
    def item_points(gradebook, assignment, student, items):
        """The grader's points on each item (its test cell's), blank for an item of another assignment or no
        submission."""
        try:
            sub = gradebook.find_submission(assignment.name, student.id)
        except MissingEntry:
            return [""] * len(items)
        scored = {g.name[len("test_"):]: g.auto_score or 0.0 for nb in sub.notebooks for g in nb.grades
                  if g.name.startswith("test_")}
        return [score_text(scored[i]) if i in scored else "" for i in items]

    @staticmethod
    def submitted(gradebook, assignment, student):
        """The row's cells from `timestamp` on; a student with no submission: 0 as nbgrader writes it, written
        blank."""
        names = [as_cell(str(v or "")) for v in (student.id, student.last_name, student.first_name, student.email)]
        try:
            sub = gradebook.find_submission(assignment.name, student.id)
        except MissingEntry:
            return ["", *names, 0.0, 0.0, 0.0, assignment.max_score, 0.0, "", "", "", "not submitted"]
        automatic, automatic_max = automatic_of_submission(sub)
        written = written_of_submission(sub)
        # the course's penalty for this timestamp and today's extensions (nbgrader's stored one dates from autograde)
        penalty = course_penalty(assignment.name, student.id, sub) if assignment.name in load_course().assignments \
            else sub.late_submission_penalty
        score = max(0.0, sub.score - penalty)
        return [sub.timestamp or "", *names, score_text(sub.score), penalty_text(sub.score, score), score_text(score),
                score_text(assignment.max_score), score_text(automatic), score_text(automatic_max),
                "" if written.pending else score_text(written.score), score_text(written.max_score),
                "pending" if written.pending else "graded"]
