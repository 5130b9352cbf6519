"""A points-only regrade (batch/rescore.py): taken only when course.yaml's points are all that moved, scoring each
saved check as it was graded, all or nothing, with the new points; anything else is graded again."""
import pytest

from autograder.batch.rescore import RESCORED, rescorable, rescored
from autograder.batch.results import grading_identity
from autograder.course.config import load_course

AID, SDPA = "lab14_transformers", "scaled_dot_product_attention"
PARTS = {"code": "c", "solutions": "s", "course": "k", "assignment": "a", "points": "p1", "release": "r",
         "libraries": "l", "device": "d", "data": "m"}


def saved_result(parts=PARTS, items=(SDPA,), sha="abc"):
    """A saved result of SDPA's checks, its values check failed, graded by the grader of `parts`."""
    points = load_course().assignment(AID).items[SDPA].points
    tests = [{"item": SDPA, "name": f"{SDPA}: {kind}", "score": 0.0 if kind == "values" else p, "max_score": p,
              "status": "failed" if kind == "values" else "passed", "output": ""} for kind, p in points.items()]
    grading = {**grading_identity(AID, sha, list(items), "old grader"), "parts": parts}
    return {"score": sum(t["score"] for t in tests), "max_score": sum(points.values()), "tests": tests,
            "extra_data": {"grading": grading, "notes": []}}


@pytest.mark.parametrize("moved, same", [({"points": "p2"}, True), ({"points": "p2", "code": "c2"}, False),
                                          ({"code": "c2"}, False), ({"assignment": "a2", "points": "p2"}, False),
                                          ({}, False)])
def test_only_a_change_of_points_alone_is_rescored(moved, same):
    identity = grading_identity(AID, "abc", [SDPA], "new grader")
    assert rescorable(saved_result(), identity, {**PARTS, **moved}) is same


def test_another_notebook_other_items_or_a_result_without_parts_is_graded_again():
    now = {**PARTS, "points": "p2"}
    assert not rescorable(saved_result(sha="other"), grading_identity(AID, "abc", [SDPA], "g"), now)
    assert not rescorable(saved_result(), grading_identity(AID, "abc", None, "g"), now)
    assert not rescorable(saved_result(parts={}), grading_identity(AID, "abc", [SDPA], "g"), now)


def test_each_check_scores_its_new_points_as_it_was_graded_all_or_nothing(monkeypatch):
    assignment = load_course().assignment(AID)
    points = dict(assignment.items[SDPA].points)
    monkeypatch.setitem(assignment.items[SDPA].points, "values", points["values"] + 3)
    monkeypatch.setitem(assignment.items[SDPA].points, "shapes", points["shapes"] + 1)
    result = rescored(saved_result(), AID)
    by_kind = {t["name"].split(": ")[1]: (t["score"], t["max_score"]) for t in result["tests"]}
    assert by_kind["values"] == (0.0, points["values"] + 3)  # failed: none of its new points
    assert by_kind["shapes"] == (points["shapes"] + 1, points["shapes"] + 1)
    assert result["max_score"] == sum(points.values()) + 4
    assert result["score"] == sum(points.values()) - points["values"] + 1
    assert result["extra_data"]["notes"] == [RESCORED] and "grading" not in result["extra_data"]


def test_a_check_that_has_no_points_now_is_no_rescore(monkeypatch):
    saved = saved_result()
    monkeypatch.delitem(load_course().assignment(AID).items[SDPA].points, "gradients")
    assert rescored(saved, AID) is None
