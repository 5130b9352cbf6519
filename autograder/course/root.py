"""The course being graded: its folder (course.yaml, release/, the grader's cache), found from where the TA works."""
import os
from pathlib import Path

from autograder.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]  # the package's own checkout (or site-packages): its code, not the course


def course_root() -> Path:
    """The course being graded: $COURSE_ROOT (`course --course DIR` sets it), else the nearest folder at or above the
    working folder that holds course.yaml, else the package's own checkout.

    The course (course.yaml, release/, the grader's cache) is where the TA works, not where the package was
    installed: a non-editable install or a second clone grades its own course.
    """
    named = os.environ.get("COURSE_ROOT")
    if named:
        root = Path(named).expanduser().resolve()
        if not (root / "course.yaml").is_file():
            raise ConfigError(f"COURSE_ROOT={named}: no course.yaml there")
        return root
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "course.yaml").is_file():
            return folder
    if (ROOT / "course.yaml").is_file():
        return ROOT
    raise ConfigError(f"no course.yaml in {here} or any folder above it: run from the course's folder, "
                      f"or name it with --course DIR (or COURSE_ROOT)")
