"""`course check`'s one-point rule: an edge case beyond the lecture's code (the query with no open key, T = 1, an odd
d_emb) is a check of its own worth one point, never a case inside a `values` (or `shapes`, `gradients`) check, where
following the lecture would cost every point of that check. Each assignment's tests/planted/<id>.py names its edge
cases in EDGE_SLIPS, {item: {name: (variant, kinds)}}: the lecture's code on that case and the checks that must catch
it; this rule reads those declarations, and the planted rounds (tests/test_grading.py, `course check --planted`)
prove that exactly those checks fail."""
from autograder.course.config import Assignment

NOT_FOR_EDGES = ("shapes", "values", "gradients")  # the lecture's own cases: following the lecture passes them


def edge_case_problems(aid: str, assignment: Assignment) -> list[str]:
    """One line per edge case caught anywhere but one check of its own worth one point (an assignment whose lecture
    leaves no edge case declares none)."""
    from autograder.grading.planted import planted_file
    edges = planted_file(aid, name="EDGE_SLIPS") or {}
    problems = []
    for item, named in edges.items():
        points = assignment.items[item].points if item in assignment.items else {}
        for name, (_, kinds) in named.items():
            kinds = sorted(kinds)
            if len(kinds) != 1 or kinds[0] in NOT_FOR_EDGES or points.get(kinds[0]) != 1:
                problems.append(f"{aid}: the edge case '{item}/{name}' is caught by {kinds} "
                                f"(points {[points.get(k) for k in kinds]}), expected one check of its own worth 1 "
                                f"point, not {' or '.join(NOT_FOR_EDGES)}: move the case out into a `properties` "
                                f"check worth 1 in course.yaml")
    return problems
