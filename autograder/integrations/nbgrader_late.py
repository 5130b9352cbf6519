"""nbgrader's late penalty from course.yaml: the due time `course release` sets in the gradebook, and this plugin.

nbgrader's AssignLatePenalties asks its plugin for a notebook's penalty when the submission's timestamp.txt is past
the gradebook's due date. Here the penalty is the course's (course/lateness.py): the policy of course.yaml and the
student's extension in extensions.csv, on the automatic points only (written answers are graded later, in
formgrader), so that the gradebook, the feedback page and `nbgrader export` give the score `course grade` gives.
nbgrader keeps the penalty it computed at autograde; `nbgrader export` (nbgrader_export.py) computes it again from
the same times, so an extension granted since shows there at once.
"""
from datetime import UTC, timedelta

from nbgrader.plugins import LateSubmissionPlugin

from autograder.course.config import load_course
from autograder.course.extensions import read_extensions
from autograder.reports.final_grade import final_grade
from autograder.reports.written import automatic_of_submission


class CourseLatePenalty(LateSubmissionPlugin):
    """The course's late policy for nbgrader's AssignLatePenalties (its parent, which knows the assignment)."""

    def late_submission_penalty(self, student_id, score, total_seconds_late):
        aid = self.parent.assignment_id
        submission = self.parent.gradebook.find_submission(aid, student_id)
        penalty = course_penalty(aid, student_id, submission)
        self.log.info("student '%s': %s late: a penalty of %g points (course.yaml's late policy)", student_id,
                      timedelta(seconds=total_seconds_late), penalty)
        return penalty


def course_penalty(aid, student, submission):
    """The points off `submission` (nbgrader's SubmittedAssignment) for lateness: its automatic points less their
    final score for its timestamp, course.yaml's due time and policy, and the student's extension."""
    automatic, _ = automatic_of_submission(submission)
    when = submission.timestamp.replace(tzinfo=UTC) if submission.timestamp else None
    return final_grade(load_course(), aid, student, automatic, when, read_extensions()).penalty
