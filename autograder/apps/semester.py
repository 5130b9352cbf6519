"""`course export grades` and `course extend`: a class's final grades for the LMS, and a student's extension.

Both read the course folder as it is now (course.yaml's due times and late policy, extensions.csv, the results
folders, nbgrader's gradebook for the written answers) and grade nothing: docs/SEMESTER.md.
"""
import sys
from pathlib import Path

from autograder.course.config import course_root, load_course
from autograder.course.extensions import extend, extensions_path
from autograder.course.roster import read_roster, student_of
from autograder.errors import ConfigError
from autograder.grading.cache import atomic_write
from autograder.reports.class_report import by_assignment, load_results
from autograder.reports.lms_export import CANVAS_COLUMNS, class_grades, csv_text, export_table
from autograder.reports.written import gradebook_students


def export_grades(results_dirs, roster_path, lms, output, moodle_key="email"):
    """Every assignment's grades in `results_dirs` for `lms`, one row per roster student, in `output`: written
    whole, or not at all when something is wrong (a ConfigError saying what)."""
    needs = {"canvas": CANVAS_COLUMNS, "moodle": [moodle_key], "csv": []}[lms]
    roster = read_roster(roster_path, needs)
    rows = [row for folder in results_dirs for row in load_results(folder)]
    if not rows:
        raise ConfigError(f"no results in {', '.join(map(str, results_dirs))} (what `course grade --results-dir` "
                          f"writes)")
    unknown = sorted(set(by_assignment(rows)) - set(load_course().assignments))  # before reading their points
    if unknown:
        raise ConfigError(f"results of {', '.join(unknown)}, which course.yaml does not have")
    course = load_course()
    partial = sorted(name for name, r in rows
                     if r["max_score"] < course.assignment(r["extra_data"]["assignment"]).total_points)
    if partial:  # an --items result's score is not the assignment's grade
        raise ConfigError(f"graded on some items only (course grade --items): {', '.join(partial)}; grade them "
                          f"whole into the same folder first (nothing was written)")
    missing = sorted({student_of(name) for name, _ in rows} - {r["student"] for r in roster})
    if missing:  # never a file that silently lacks someone who submitted
        raise ConfigError(f"{roster_path}: no row for {len(missing)} students with results: {', '.join(missing)}; "
                          f"add them with their LMS identity (nothing was written)")
    grades = class_grades(by_assignment(rows), lambda line: print(line, file=sys.stderr))
    atomic_write(Path(output), csv_text(export_table(lms, grades, roster, moodle_key)))
    print(f"{lms} grades of {len(roster)} students on {', '.join(grades)} written to {output}")
    return 0


def extend_deadline(student, aid, days, roster_path=None):
    """`course extend`: `days` more for `student` on `aid` in extensions.csv (0 removes it)."""
    rows = extend(student, aid, days, known_students(roster_path))
    now = rows.get((student, aid))
    said = f"{now:g} more day{'' if now == 1 else 's'}" if now else "no extension"
    print(f"{student} on {aid}: {said} ({extensions_path()})")
    return 0


def known_students(roster_path=None):
    """The course's students: the roster's, nbgrader's gradebook's, and .nbgrader/submitted/'s folder names."""
    known = {r["student"] for r in read_roster(roster_path)} if roster_path else set()
    submitted = course_root() / ".nbgrader" / "submitted"
    known |= {p.name for p in submitted.iterdir() if p.is_dir()} if submitted.is_dir() else set()
    return known | gradebook_students()
