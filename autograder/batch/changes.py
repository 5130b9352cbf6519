"""What a regrade changed: exactly the submissions whose score moved, old and new, per item, and why.

A result graded into a results folder that held an earlier grading of the same submission carries that grading's
summary (batch/results.py: `extra_data.grading.previous`); the earlier result itself stays in the folder's history.
`course grade --results-dir` prints the moves and appends them to the folder's changes.csv, so nobody's grade
changes silently.
"""
import csv
from pathlib import Path
from typing import NamedTuple

from autograder.batch.identity import what_moved as why
from autograder.batch.results import graded_at
from autograder.batch.results import previous as previous_of
from autograder.reports.tables import as_cell, item_summary, score_text

CHANGES = "changes.csv"
COLUMNS = ["graded_at", "submission", "item", "old", "new", "why"]


class Change(NamedTuple):
    name: str
    old: float
    new: float
    items: dict      # item -> (old, new), the items whose points moved
    why: str
    graded_at: str


def changes(rows):
    """A Change for each result of `rows` ((name, result)) whose score, or an item's, moved since its previous
    grading; results without one (first gradings, reused ones) have none."""
    out = []
    for name, result in rows:
        extra = result.get("extra_data", {})
        previous = previous_of(result)
        if not previous or extra.get("grader_error"):
            continue
        now = {item: score for item, (score, _, _) in item_summary(result).items()}
        moved = {item: (previous["items"].get(item, 0.0), now.get(item, 0.0))
                 for item in dict.fromkeys([*previous["items"], *now])
                 if round(previous["items"].get(item, 0.0) - now.get(item, 0.0), 4)}
        if moved or round((previous.get("score") or 0) - result["score"], 4):
            out.append(Change(name, previous.get("score") or 0.0, result["score"], moved,
                              why(previous.get("grading"), extra.get("grading")), graded_at(result) or ""))
    return out


def change_lines(found):
    """One line per moved submission: 'alice: 23.2 -> 25 (attention 3 -> 5): the grader changed (...)'."""
    return [f"{c.name}: {score_text(c.old)} -> {score_text(c.new)} ("
            + ", ".join(f"{item} {score_text(a)} -> {score_text(b)}" for item, (a, b) in c.items.items())
            + f"): {c.why}" for c in found]


def append_changes(results_dir, found):
    """Append the moves to the results folder's changes.csv (written with its header the first time)."""
    path = Path(results_dir) / CHANGES
    new = not path.is_file()
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(COLUMNS)
        for c in found:
            for item, (a, b) in (c.items or {"(total)": (c.old, c.new)}).items():
                w.writerow([c.graded_at, as_cell(c.name), item, a, b, c.why])
    return path
