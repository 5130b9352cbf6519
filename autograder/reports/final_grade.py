"""A result's final score: its raw automatic score cut for lateness (course/lateness.py) by course.yaml's policy
and the student's extension, computed whenever it is read, never stored. The raw score and the submission time
are the result's (extra_data.grading.submitted_at, in a results folder); the policy and the extensions are read
now, so a new extension or a changed policy moves the final score without grading anything again."""
from typing import NamedTuple

from autograder.course.lateness import Lateness, lateness
from autograder.course.roster import student_of
from autograder.course.submission_times import from_iso


class FinalGrade(NamedTuple):
    raw: float
    lateness: Lateness
    final: float

    @property
    def penalty(self) -> float:
        return round(self.raw - self.final, 4)


def final_grade(course, aid, student, raw, submitted_at, extensions):
    """The FinalGrade of `raw` points submitted at `submitted_at` (aware, or None) by `student` on `aid`."""
    late = lateness(submitted_at, course.assignment(aid).due, course.late_policy(aid),
                    extensions.get((student, aid), 0.0))
    return FinalGrade(raw, late, late.final(raw))


def final_grades(aid, rows, extensions=None, times=None):
    """name -> FinalGrade of each scored result in `rows` ((name, result)); `times`: name -> submission time (else
    each result's own, submitted_at); extensions: course/extensions.py's, read from the course's file when not
    given."""
    from autograder.course.config import load_course
    from autograder.course.extensions import read_extensions
    from autograder.reports.tables import not_scored
    course = load_course()
    extensions = read_extensions() if extensions is None else extensions
    return {name: final_grade(course, aid, student_of(name), result["score"],
                              times.get(name) if times is not None else submitted_at(result), extensions)
            for name, result in rows if not not_scored(result)}


def submitted_at(result):
    """When a saved result's submission was made (batch/results.py record_submission_times), or None."""
    return from_iso((result.get("extra_data", {}).get("grading") or {}).get("submitted_at"))
