"""Written answers' points beside the automatic ones: TAs grade them in formgrader, so nbgrader's gradebook has them.

The automatic points (checks and experiments) are final when the grader has run. A student's written points are
`pending` until a TA has graded every written answer of that submission in formgrader (an answer left as released
is 0 without a TA, as nbgrader scores it). A TA's grade stays through later autogrades while the answer's text is
the one graded, and an answer changed since is pending again (integrations/nbgrader_grades.py keeps the gradebook
so). Extra credit a TA gives in formgrader counts here, on any cell; a TA's override of an autograded cell changes
nbgrader's own total only, never the grader's automatic points.
"""
from pathlib import Path
from typing import NamedTuple


class WrittenGrade(NamedTuple):
    score: float | None  # None: pending (some answer not graded yet)
    max_score: float
    graded: int          # the written answers graded so far
    answers: int         # the written answers of the assignment

    @property
    def pending(self) -> bool:
        return self.score is None

    def text(self) -> str:
        """'7/10', or 'pending/10' (with how many are graded so far when some are)."""
        if not self.pending:
            return f"{self.score:g}/{self.max_score:g}"
        so_far = f" ({self.graded} of {self.answers} graded)" if self.graded else ""
        return f"pending/{self.max_score:g}{so_far}"


def written_grades(aid, students, db_url=None):
    """student id -> WrittenGrade for `aid`, from nbgrader's gradebook (the course's, as its nbgrader_config.py
    names it, unless `db_url`); {} when the assignment has no written points. A student the gradebook does not
    know, or no gradebook at all, is pending."""
    from autograder.course.config import load_course
    assignment = load_course().assignment(aid)
    if not assignment.written_points:
        return {}
    answers, total = len(assignment.written), assignment.written_points
    found = _from_gradebook(db_url, aid, set(students))
    return {s: found.get(s, WrittenGrade(None, total, 0, answers)) for s in students}


def gradebook_students():
    """The student ids of the course's nbgrader gradebook (none where there is none)."""
    gb = _gradebook()
    if gb is None:
        return set()
    with gb:
        return {s.id for s in gb.students}


def _gradebook(db_url=None):
    """nbgrader's Gradebook of the course (as its nbgrader_config.py names it) or of `db_url`; None where there is
    none: nbgrader was never run there (no empty gradebook is made), or the course folder has no nbgrader settings."""
    from autograder.errors import ConfigError
    if db_url is None:
        try:
            db_url = course_gradebook_url()
        except ConfigError:
            return None
    if db_url.startswith("sqlite:///") and not Path(db_url[len("sqlite:///"):]).is_file():
        return None
    from nbgrader.api import Gradebook
    return Gradebook(db_url)


URLS = Path("memo") / "gradebook-urls.json"  # in a cache folder: the gradebook a nbgrader_config.py names, by its
# path and text (memo/, apart from the runs' entries at the folder's top)


def course_gradebook_url():
    """The gradebook the course's nbgrader_config.py names (notebooks/build.py gradebook_url), remembered in the
    cache folder by the file's path and text. Reading it executes the file, which imports all of nbgrader (0.9 CPU-s
    of every `course grade`, most of them to find there is no gradebook); what it names is a function of its path
    and text, unless it reads the environment: such a file is read every time."""
    import hashlib
    import json

    from autograder.grading.cache import atomic_write, cache_folders, cache_off
    from autograder.notebooks.build import gradebook_url, nbgrader_config
    path = nbgrader_config()
    text = path.read_bytes()
    if cache_off() or b"environ" in text or b"getenv" in text:
        return gradebook_url()
    key = hashlib.sha256(str(path.resolve()).encode() + b"\0" + text).hexdigest()
    for folder in cache_folders():
        try:
            url = json.loads((folder / URLS).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(url, str):
            return url
    url = gradebook_url()
    for folder in cache_folders():  # the first folder that takes it; none costs the next run the reading
        try:
            (folder / URLS).parent.mkdir(parents=True, exist_ok=True)
            atomic_write(folder / URLS, json.dumps({key: url}))
            break
        except OSError:
            continue
    return url


def _from_gradebook(db_url, aid, students):
    """student -> WrittenGrade of those the gradebook has a submission of."""
    gb = _gradebook(db_url)
    if gb is None:
        return {}
    from nbgrader.api import MissingEntry
    out = {}
    with gb:
        for student in students:
            try:
                out[student] = written_of_submission(gb.find_submission(aid, student))
            except MissingEntry:
                continue
    return out


def written_of_submission(submission):
    """The WrittenGrade of one of nbgrader's SubmittedAssignments: its `answer_*` cells, and the extra credit of
    every cell."""
    grades = [g for nb in submission.notebooks for g in nb.grades]
    written = [g for g in grades if g.name.startswith("answer_")]
    graded = sum(not g.needs_manual_grade for g in written)
    # nbgrader's Grade.score already holds a cell's extra credit: the TA's score (else the automatic one) is taken
    # apart from it, so that extra credit counts once, as in nbgrader's own total
    score = sum(_given(g) for g in written) + sum(g.extra_credit or 0.0 for g in grades)
    return WrittenGrade(score if graded == len(written) else None, sum(g.max_score for g in written), graded,
                        len(written))


def _given(grade):
    """A written answer's points without its extra credit: the TA's score, else nbgrader's automatic one (0 for an
    answer left as released)."""
    return grade.manual_score if grade.manual_score is not None else grade.auto_score or 0.0


def automatic_of_submission(submission):
    """The grader's points in one of nbgrader's SubmittedAssignments (every cell but the written answers, as the
    grader scored it, whatever a TA overrode): (score, max_score)."""
    grades = [g for nb in submission.notebooks for g in nb.grades if not g.name.startswith("answer_")]
    return sum(g.auto_score or 0.0 for g in grades), sum(g.max_score for g in grades)
