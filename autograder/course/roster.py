"""The class roster: a CSV with a `student` column (the submission's folder name, nbgrader's student id) and the
LMS's own identity columns, so that a TA can start from the LMS's gradebook export (Canvas: Student, ID, SIS User
ID, SIS Login ID, Section; Moodle: the user-key column, e.g. email)."""
import csv
import io
import re
from collections.abc import Sequence
from pathlib import Path

from autograder.errors import ConfigError


def read_roster(path: str | Path, needs: Sequence[str] = ()) -> list[dict[str, str]]:
    """[row dict] in file order; every column of `needs` must be there; a duplicate or empty student is an error
    naming the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # the LMS's export may start with a byte-order mark
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the roster ({e.strerror})") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    columns = reader.fieldnames or []
    missing = [c for c in ("student", *needs) if c not in columns]
    if missing:
        raise ConfigError(f"{path}: line 1: no column {', '.join(missing)} (the columns are: "
                          f"{', '.join(columns) or 'none'})")
    rows: list[dict[str, str]] = []
    seen: dict[str, int] = {}
    for line, row in enumerate(reader, 2):
        student = (row["student"] or "").strip()
        if not student:
            raise ConfigError(f"{path}: line {line}: student is empty")
        if student in seen:
            raise ConfigError(f"{path}: line {line}: student {student!r} is listed twice (line {seen[student]})")
        seen[student] = line
        rows.append({**row, "student": student})
    return rows


def student_of(name: str) -> str:
    """The student id (nbgrader's, the roster's) of a submission's name in a table or results folder: secA/alice,
    and alice~2, a second notebook of alice's folder, are alice."""
    return re.sub(r"~\d+$", "", name.rsplit("/", 1)[-1])
