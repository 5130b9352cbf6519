"""Extensions: more days for one student on one assignment, in the course folder's `extensions.csv`.

The file is the TA's, kept beside course.yaml but out of git (.gitignore): `student,assignment,days`, one row per
extension. `course extend STUDENT ASSIGNMENT --days N` writes it (0 removes the row); a TA may edit it by hand, and
a bad row is one line naming the file, the line and the field. Read whenever a grade is read (course/lateness.py).
"""
import csv
import os
import tempfile
from collections.abc import Collection
from pathlib import Path

from autograder.course.config import course_root, load_course
from autograder.errors import ConfigError

FILE = "extensions.csv"
COLUMNS = ["student", "assignment", "days"]


def extensions_path() -> Path:
    return course_root() / FILE


def read_extensions(path: str | Path | None = None) -> dict[tuple[str, str], float]:
    """(student, assignment) -> extra days; {} when the file does not exist."""
    path = Path(path or extensions_path())
    if not path.is_file():
        return {}
    course = load_course()
    out: dict[tuple[str, str], float] = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"{path}: line 1: no column {', '.join(missing)} (the columns are "
                              f"{','.join(COLUMNS)})")
        for line, row in enumerate(reader, 2):
            student, aid = (row["student"] or "").strip(), (row["assignment"] or "").strip()
            if not student:
                raise ConfigError(f"{path}: line {line}: student is empty")
            if aid not in course.assignments:
                raise ConfigError(f"{path}: line {line}: assignment {aid!r} is not in {course.path} (known: "
                                  f"{', '.join(course.assignments)})")
            try:
                days = float(row["days"])
            except (TypeError, ValueError):
                raise ConfigError(f"{path}: line {line}: days {row['days']!r} is not a number") from None
            if not 0 <= days <= 366:
                raise ConfigError(f"{path}: line {line}: days {days:g} is outside 0-366")
            if (student, aid) in out:
                raise ConfigError(f"{path}: line {line}: {student} already has an extension on {aid} (line above)")
            out[student, aid] = days
    return out


def extend(student: str, aid: str, days: float, known_students: Collection[str],
           path: str | Path | None = None) -> dict[tuple[str, str], float]:
    """Give `student` `days` more on `aid` (0: none), replacing their extension there; the file is rewritten whole
    or not at all. `known_students`: the students this course has (a typo is an error, not a silent extension)."""
    path = Path(path or extensions_path())
    course = load_course()
    if aid not in course.assignments:
        raise ConfigError(f"no assignment {aid!r} in {course.path} (known: {', '.join(course.assignments)})")
    if student not in known_students:
        raise ConfigError(f"no student {student!r} in this course (known: {len(known_students)} students from the "
                          f"roster, nbgrader's gradebook and .nbgrader/submitted/; give --roster FILE for others)")
    if not 0 <= days <= 366:
        raise ConfigError(f"--days {days:g}: an extension is 0 to 366 days")
    rows = read_extensions(path)
    rows.pop((student, aid), None)
    if days:
        rows[student, aid] = days
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".extensions-", suffix=".csv")
    with os.fdopen(fd, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for (s, a), d in sorted(rows.items()):
            w.writerow([s, a, f"{d:g}"])
    os.replace(tmp, path)
    return rows
