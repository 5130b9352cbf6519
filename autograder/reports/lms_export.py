"""Grades an LMS imports: every assignment of a class in one file, `course export grades`.

A student's grade on an assignment is its final automatic score, the raw one cut by the late policy for the
submission time and the student's extension (reports/final_grade.py), plus the written answers' points (graded in
formgrader; pending ones count 0, and the command names them). The late policy cuts the automatic points only, on
every path: nbgrader records its penalty when it autogrades, before any written answer is graded.

The roster (course/roster.py) gives the rows, in its order: a roster student without a submission gets an empty
cell, never a 0; a submission without a roster row is listed loudly, never dropped silently. Every text cell is
guarded against spreadsheet formulas.

- canvas: Canvas's gradebook import: `Student,ID,SIS User ID,SIS Login ID,Section,<title> (<id>)...`, then the
  `Points Possible` row;
- moodle: one user-key column (the roster's `email`, `username` or `idnumber`: --moodle-key) and one per
  assignment, named by its title;
- csv: one row per student, per assignment its items' points, raw, lateness, penalty, written and final.

Every figure is exact to the cent (tables.cents: as many decimals as it has, at most two), and every row adds up:
raw + written - penalty = final (written: 0 while pending).
"""
import csv
import io
from typing import NamedTuple

from autograder.course.roster import student_of
from autograder.errors import ConfigError
from autograder.reports.tables import as_cell, cents, item_summary, penalty_text, score_text

CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
LMS = ("canvas", "moodle", "csv")


class Grade(NamedTuple):
    """One student's grade on one assignment, as exported."""
    result: dict
    final: object        # reports/final_grade.FinalGrade of the automatic score
    written: object      # reports/written.WrittenGrade or None (the assignment has no written answers)

    @property
    def value(self) -> float:
        """The grade exported: the final automatic points and the written ones, each to the cent (tables.cents)."""
        return float(cents(self.final.final) + cents(self.written.score or 0 if self.written else 0))


def class_grades(rows_by_aid, say):
    """aid -> student -> Grade, from each assignment's results ((name, result)); `say(line)` for what a TA must
    know: written answers still pending. Two results for one student on one assignment (secA/alice and secB/alice,
    alice and alice~2) are a ConfigError naming both."""
    from autograder.course.config import load_course
    from autograder.course.extensions import read_extensions
    from autograder.reports.final_grade import final_grade, submitted_at
    from autograder.reports.written import written_grades
    course, extensions = load_course(), read_extensions()
    twice = [f"{student} on {aid} ({', '.join(names)})" for aid, rows in rows_by_aid.items()
             for student, names in results_by_student(rows).items() if len(names) > 1]
    if twice:  # which one is the grade is the TA's call, never the first one found
        raise ConfigError(f"two results for one student: {'; '.join(twice)}; keep the one that is the student's "
                          f"submission in the results folder (move the other out) and export again (nothing was "
                          f"written)")
    out = {}
    for aid, rows in rows_by_aid.items():
        by_student = {student_of(name): (name, result) for name, result in rows}
        written = written_grades(aid, set(by_student))
        pending = sorted(s for s, w in written.items() if w.pending)
        if pending:
            say(f"{aid}: written answers still pending for {len(pending)} ({', '.join(pending[:8])}"
                f"{', ...' if len(pending) > 8 else ''}): counted 0 here; grade them in formgrader and export again")
        out[aid] = {}
        for student, (_, result) in by_student.items():
            out[aid][student] = Grade(result, final_grade(course, aid, student, result["score"],
                                                          submitted_at(result), extensions), written.get(student))
    return out


def results_by_student(rows):
    """student -> the names of their results in `rows` ((name, result)), sorted."""
    found = {}
    for name, _ in rows:
        found.setdefault(student_of(name), []).append(name)
    return {student: sorted(names) for student, names in found.items()}


def export_table(lms, grades, roster, moodle_key="email"):
    """The export's rows (header first) for `lms`, one per roster student in roster order."""
    from autograder.course.config import load_course
    course = load_course()
    aids = list(grades)
    possible = {aid: course.assignment(aid).total_points + course.assignment(aid).written_points for aid in aids}

    def cell(aid, student):
        grade = grades[aid].get(student)
        return "" if grade is None else score_text(grade.value)
    if lms == "canvas":
        head = [*CANVAS_COLUMNS, *[f"{course.assignment(a).title} ({a})" for a in aids]]
        points = ["    Points Possible", *[""] * (len(CANVAS_COLUMNS) - 1), *[score_text(possible[a]) for a in aids]]
        return [head, points, *[[as_cell(r.get(c) or "") for c in CANVAS_COLUMNS] + [cell(a, r["student"])
                                                                                   for a in aids] for r in roster]]
    if lms == "moodle":
        head = [moodle_key, *[course.assignment(a).title for a in aids]]
        return [head, *[[as_cell(r.get(moodle_key) or "")] + [cell(a, r["student"]) for a in aids] for r in roster]]
    items = {aid: list(course.assignment(aid).items) for aid in aids}
    head = ["student"]
    for aid in aids:
        head += [f"{aid}:{i}" for i in items[aid]]
        head += [f"{aid}:{k}" for k in ("raw", "written", "submitted_at", "lateness", "penalty", "final")]
    table = [head]
    for r in roster:
        line = [as_cell(r["student"])]
        for aid in aids:
            grade = grades[aid].get(r["student"])
            if grade is None:
                line += [""] * (len(items[aid]) + 6)
                continue
            by_item = item_summary(grade.result)
            late = grade.final.lateness
            line += [score_text(by_item[i][0]) if i in by_item else "" for i in items[aid]]
            line += [score_text(grade.result["score"]),
                     "" if grade.written is None or grade.written.pending else score_text(grade.written.score),
                     late.submitted.isoformat() if late.submitted else "", late.text(),
                     penalty_text(grade.result["score"], grade.final.final), score_text(grade.value)]
        table.append(line)
    return table


def csv_text(table):
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(table)
    return out.getvalue()
