"""A regrade for points alone: when course.yaml's points are all that moved since a result was graded, the result's
saved check outcomes are scored again with the new points, and nothing runs (no sandbox, no notebook, no training).

A check is all or nothing (grading/scoring.py Outcome: a passed check scores its points, a failed one none, and the
rules that zero a whole item leave its checks failed), so a saved outcome and the new points give the grade that a
full grading would. Which part of the grader moved comes from the parts each result keeps (batch/identity.py).
"""
from autograder.batch.identity import POINTS
from autograder.course.config import load_course

RESCORED = "rescored with course.yaml's new points from the checks' saved outcomes; nothing was run again"


def rescorable(saved, identity, parts):
    """Whether `saved` is this grading but for the points: the same assignment, notebook and items, graded by a
    grader whose parts differ in the points alone."""
    grading = saved.get("extra_data", {}).get("grading") or {}
    before = grading.get("parts") or {}
    if not saved.get("tests") or not parts or set(before) != set(parts):
        return False
    if any(grading.get(key, "") != identity[key] for key in ("assignment", "submission", "items")):
        return False
    return [part for part in parts if before[part] != parts[part]] == [POINTS]


def rescored(saved, aid):
    """`saved` with each check worth its points in course.yaml now, passed checks scoring them all and failed ones
    none; None when one of its checks has no points now (then it is graded again)."""
    assignment = load_course().assignment(aid)
    worth = {f"{item}: {kind}": points for item, spec in assignment.items.items()
             for kind, points in spec.points.items()}
    worth |= {f"{exp.item}: experiment {name}": exp.points for name, exp in assignment.experiments.items()
              if exp.graded}
    tests = []
    for test in saved["tests"]:
        if test.get("name") not in worth:
            return None
        points = float(worth[test["name"]])
        tests.append({**test, "max_score": points, "score": points if test.get("status") == "passed" else 0.0})
    extra = {key: value for key, value in saved.get("extra_data", {}).items() if key != "grading"}
    extra["notes"] = [note for note in extra.get("notes", []) if note != RESCORED] + [RESCORED]
    return {**saved, "score": round(sum(t["score"] for t in tests), 4),
            "max_score": round(sum(t["max_score"] for t in tests), 4), "tests": tests, "extra_data": extra}
