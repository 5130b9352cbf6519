"""course.yaml's `exchange`: where nbgrader's exchange keeps this course on a JupyterHub (docs/HUB.md).

nbgrader_config.py hands both to nbgrader (`CourseDirectory.course_id`, `Exchange.root`), so release, fetch, submit,
collect and the feedback commands need no config of their own. Several courses share one root; each has its own
folder `<root>/<course_id>`, readable only by the course's Unix group (docs/HUB.md), so that no course sees another's
assignments.
"""
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, field_validator

# nbgrader writes a submission as `<student>+<assignment>+<timestamp>` under `<root>/<course_id>/inbound`, and globs
# `*` in those names: a course id is one path component without '+', '*' or '?'
COURSE_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class Exchange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    course_id: str = Field("attention-transformers", pattern=COURSE_ID)
    root: str = "/srv/nbgrader/exchange"  # every course of the hub: world-writable with the sticky bit (1777)

    @field_validator("root")
    @classmethod
    def absolute(cls, root: str) -> str:
        if not PurePosixPath(root).is_absolute():
            raise ValueError(f"must be an absolute path such as /srv/nbgrader/exchange (got {root!r}): every "
                             f"user's server, in its own home folder, reads the same exchange")
        return root

    def students_config(self) -> str:
        """The hub's nbgrader_config.py for every user's server (docs/HUB.md: /etc/jupyter/nbgrader_config.py): the
        exchange every course of the hub shares, and the course's id in the path a student fetches to. No course id:
        the Assignment List shows each course whose exchange folder the student's groups may read."""
        return (f"c = get_config()  # noqa: F821 (course.yaml's exchange, autograder/course/exchange.py)\n"
                f"c.Exchange.root = {self.root!r}\nc.Exchange.path_includes_course = True\n")
