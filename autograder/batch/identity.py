"""The grader identity: one hash of everything besides the submission that decides its grade, kept in parts.

A saved result is reused when its grading identity (batch/results.py) is this run's. The identity is a hash of named
parts, and each result keeps the parts' own hashes (`extra_data.grading.parts`), so that a regrade can say which part
moved (batch/changes.py) and, when only course.yaml's points moved, score the saved checks again without running
anything (batch/rescore.py).

  code       the grading code (experiments.grading_code: grading, the sandbox, the course's code, the suite, the
             harness; comments left out; not reports, integrations, the apps or the batch's dispatching)
  solutions  the reference solution
  course     course.yaml's course-wide settings (not the late policy: applied when a grade is read)
  assignment course.yaml's settings of the assignment, its points left out (not `due`, `late` or `written`)
  points     the points of each item's checks and of each experiment
  release    the release notebook's setup cells (its prose, stated points and public checks grade nothing)
  libraries  the library versions
  device     cpu or cuda
  data       MNIST's source

The sandbox's CPU thread count is left out: it is how the machine is shared (`--workers`), and a resumed batch may
use another.
"""
import hashlib
import json
from pathlib import Path

from autograder.course.config import course_root, load_course
from autograder.grading.cache import libraries

POINTS = "points"  # the part a points-only change moves (batch/rescore.py)
PARTS = {"code": "the grading code", "solutions": "a reference solution",
         "course": "course.yaml's course-wide settings", "assignment": "course.yaml's settings of the assignment",
         POINTS: "course.yaml's points", "release": "the release's setup cells", "libraries": "a library version",
         "device": "the device", "data": "the data"}  # the parts as a TA reads them
_identities = {}  # (assignment, device, course.yaml, course root) -> (grader_identity, parts), once per process


def grader_parts(aid, device="auto"):
    """{part: sha256 of it} for the module doc's parts of (assignment, device)."""
    from autograder.grading.experiments import data_source_of, grading_code, resolve_device, solution_fingerprint
    course = load_course()
    assignment = course.assignment(aid)
    released = course_root() / "release" / aid / f"{aid}.ipynb"
    shape = assignment.model_dump(mode="json")
    for item in shape["items"].values():
        item["points"] = sorted(item["points"])  # which checks run, not what they are worth
    for exp in shape["experiments"].values():
        exp["points"] = exp["points"] > 0  # whether it is graded
    parts = {"code": grading_code(aid), "solutions": solution_fingerprint(aid),
             "course": course.model_dump(mode="json", exclude={"path", "assignments"}), "assignment": shape,
             POINTS: {"items": {i: spec.points for i, spec in assignment.items.items()},
                      "experiments": {e: spec.points for e, spec in assignment.experiments.items()}},
             "release": release_code(released), "libraries": libraries(),
             "device": device if device in ("cpu", "cuda") else resolve_device(course.device),
             "data": data_source_of(aid)}
    return {name: digest(value) for name, value in parts.items()}


def grader_identity(aid, device="auto"):
    """The hash of grader_parts: what a saved result's `grader` must equal to be reused."""
    return identity_of(grader_parts(aid, device))


def identity_of(parts):
    return digest(parts)


def identity_here(aid, device):
    """This process's grader identity for (assignment, device), computed once per course (a worker grades many; a
    process that grades under two course.yaml files, or two course folders, has one for each)."""
    return _here(aid, device)[0]


def parts_here(aid, device):
    """This process's grader_parts for (assignment, device), computed with identity_here's."""
    return _here(aid, device)[1]


def _here(aid, device):
    key = (aid, device, str(load_course().path), str(course_root()))
    if key not in _identities:
        parts = grader_parts(aid, device)
        _identities[key] = identity_of(parts), parts
    return _identities[key]


def release_code(path):
    """What of the release notebook grading reads: its setup cells, which replace the submission's
    (notebooks/cells.py restore_setup_cells); [] for no release. The rest (prose, stated points, public checks)
    grades nothing."""
    from autograder.notebooks.cells import load_student_code
    if not Path(path).is_file():
        return []
    return [[cell.grade_id, cell.source] for cell in load_student_code(path, []).cells]


def file_digest(path):
    """sha256 of a file's bytes; '' for what is not a file (a folder without a notebook is graded as unreadable)."""
    path = Path(path)
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""


def digest(value):
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def what_moved(before, now):
    """Why a grading differs from an earlier one, from their identities (batch/results.py grading_identity), naming
    the grader's parts that moved where both kept them."""
    before, now = before or {}, now or {}
    reasons = []
    if before.get("submission") != now.get("submission"):
        reasons.append("the notebook changed")
    if before.get("grader") != now.get("grader"):
        old, new = before.get("parts") or {}, now.get("parts") or {}
        moved = [PARTS.get(part, part) for part in new if part in old and old[part] != new[part]]
        reasons.append(f"the grader changed: {', '.join(moved)}" if moved and set(old) == set(new) else
                       "the grader changed (its code, a solution, course.yaml, the release, a library, the device "
                       "or the data)")
    if before.get("items") != now.get("items"):
        reasons.append("other items were graded")
    return "; ".join(reasons) or "graded again with the same grader: a check's outcome differed"
