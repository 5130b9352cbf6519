"""When a submission was made, from where each path has it; never the grader's clock, never a file's mtime.

- nbgrader: `timestamp.txt` beside the collected notebook, in `nbgrader collect`'s format (`2026-12-05 18:22:13.123456
  UTC`) or `nbgrader zip_collect`'s (ISO 8601), read as nbgrader reads it (utils.parse_utc: a time without a zone is
  UTC), so that both paths count the same seconds late;
- Gradescope: `submission_metadata.json`'s `created_at`, and the due date Gradescope gives each user (an extension
  granted there);
- `course grade`: the same `timestamp.txt`, or `--submitted-at FILE`, a CSV of `submission,submitted_at`.

Every time is returned timezone-aware (UTC). A file that does not parse is one line naming it: ConfigError.
"""
import csv
import json
from datetime import UTC, datetime
from pathlib import Path

from autograder.errors import ConfigError

TIMESTAMP = "timestamp.txt"


def parse_time(text: object, where: object) -> datetime:
    """`text` as an aware UTC time, as nbgrader parses a timestamp; `where` names the file and field in the error."""
    from nbgrader.utils import parse_utc
    text = str(text).strip()
    try:
        parsed = parse_utc(text)
    except (ValueError, OverflowError, TypeError):
        raise ConfigError(f"{where}: {text[:60]!r} is not a time (e.g. 2026-12-05 18:22:13 UTC or "
                          f"2026-12-05T23:59:00+05:30)") from None
    return parsed.replace(tzinfo=UTC)


def from_timestamp_file(folder: str | Path) -> datetime | None:
    """The time in `folder`/timestamp.txt (nbgrader's collect or zip_collect), or None when there is none."""
    path = Path(folder) / TIMESTAMP
    if not path.is_file():
        return None
    text = path.read_text(errors="replace").strip()
    if not text:
        raise ConfigError(f"{path}: empty; write the submission time or remove the file (then it counts as on time)")
    return parse_time(text, path)


def from_csv(path: str | Path) -> dict[str, datetime]:
    """submission -> time, from a CSV with the columns `submission` and `submitted_at`."""
    path = Path(path)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"submission", "submitted_at"} - set(reader.fieldnames or [])
        if missing:
            raise ConfigError(f"{path}: line 1: no column {', '.join(sorted(missing))} (the columns are "
                              f"submission,submitted_at)")
        times: dict[str, datetime] = {}
        for line, row in enumerate(reader, 2):
            name = (row["submission"] or "").strip()
            if name in times:
                raise ConfigError(f"{path}: line {line}: submission {name!r} is listed twice")
            times[name] = parse_time(row["submitted_at"] or "", f"{path}: line {line}: submitted_at")
    return times


def from_gradescope(path: str | Path) -> tuple[datetime, float]:
    """(created_at, extension days) from Gradescope's `submission_metadata.json`: a user's own due date later than
    the assignment's is an extension granted on Gradescope (the longest of a group's counts)."""
    path = Path(path)
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not readable JSON ({e})") from None
    if "created_at" not in meta:
        raise ConfigError(f"{path}: no created_at")
    created = parse_time(meta["created_at"], f"{path}: created_at")
    due = (meta.get("assignment") or {}).get("due_date")
    if not due:
        return created, 0.0
    due = parse_time(due, f"{path}: assignment.due_date")
    own = [parse_time(u["assignment"]["due_date"], f"{path}: users[{k}].assignment.due_date")
           for k, u in enumerate(meta.get("users") or [])
           if isinstance(u, dict) and (u.get("assignment") or {}).get("due_date")]
    return created, max([0.0] + [(d - due).total_seconds() / 86400 for d in own])


def iso(when: datetime | None) -> str | None:
    """A time as results and exports keep it: ISO 8601 in UTC, or None."""
    return when.astimezone(UTC).isoformat() if when else None


def from_iso(text: str | None) -> datetime | None:
    """A time kept by iso()."""
    return datetime.fromisoformat(text) if text else None
