"""Lateness: the final score from the raw one, the submission time, the due time, the late policy and an extension.

Applied whenever a grade is read (a table, an export, nbgrader's gradebook), never while grading: a result keeps
its raw score and submission time, so a new extension or policy changes the final score without a sandbox.

The rule, with d = the due time plus the student's extension and t = the submission time:
  1. no due time, or no submission time: on time (the table says which);
  2. t <= d: on time; t <= d + grace: on time, said as within the grace period;
  3. t > d + close_days: closed, the final score is 0 (the submission is still graded: its raw score stays);
  4. otherwise days = the started days after d, ceil((t - d) / 1 day), and
     off = min(days * percent_per_day, 100 - floor_percent) percent of the raw score.
"""
import math
from datetime import datetime, timedelta
from typing import NamedTuple

from autograder.course.config import LatePolicy

DAY = timedelta(days=1)


class Lateness(NamedTuple):
    status: str                # on time | in grace | late | closed | no due date | no submission time
    days: int                  # started days after the (extended) due time; 0 when on time
    percent_off: float         # of the raw score: 0 on time, 100 closed
    due: datetime | None       # the due time with the extension
    submitted: datetime | None

    def final(self, raw: float) -> float:
        """The score after the penalty, rounded as the grader rounds points."""
        return round(raw * (1 - self.percent_off / 100), 4)

    def text(self) -> str:
        """One phrase for a table: 'on time', '2 days late: -20%', 'closed (9 days late): 0'."""
        days = f"{self.days} day{'' if self.days == 1 else 's'} late"
        return {"late": f"{days}: -{self.percent_off:g}%", "closed": f"closed ({days}): 0",
                "in grace": "on time (grace)",
                "no submission time": "on time (no submission time)"}.get(self.status, self.status)


def lateness(submitted: datetime | None, due: datetime | None, policy: LatePolicy,
             extension_days: float = 0) -> Lateness:
    """How late `submitted` is for `due` under `policy`, with `extension_days` more for this student (module doc)."""
    if due is None:
        return Lateness("no due date", 0, 0.0, None, submitted)
    due = due + timedelta(days=extension_days)
    if submitted is None:
        return Lateness("no submission time", 0, 0.0, due, None)
    late_by = submitted - due
    if late_by <= timedelta(0):
        return Lateness("on time", 0, 0.0, due, submitted)
    if late_by <= timedelta(minutes=policy.grace_minutes):
        return Lateness("in grace", 0, 0.0, due, submitted)
    days = math.ceil(late_by / DAY)
    if policy.close_days is not None and late_by > timedelta(days=policy.close_days):
        return Lateness("closed", days, 100.0, due, submitted)
    off = min(days * policy.percent_per_day, 100 - policy.floor_percent)
    return Lateness("late", days, off, due, submitted)
