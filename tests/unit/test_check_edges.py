"""`course check`'s one-point rule (autograder/apps/check_edges.py): every assignment's edge cases beyond the lecture
are each caught by one check of their own worth one point; one declared inside a values check is named."""
from autograder.apps import check_edges
from autograder.course.config import load_course


def test_every_assignments_edge_cases_are_checks_of_their_own_worth_one_point():
    course = load_course()
    for aid, assignment in course.assignments.items():
        assert check_edges.edge_case_problems(aid, assignment) == [], aid


def test_an_edge_case_inside_a_values_check_is_named(monkeypatch):
    aid = "lab14_transformers"
    declared = {"scaled_dot_product_attention": {"no_open_key_gives_nan": (None, {"values"})}}
    monkeypatch.setattr("autograder.grading.planted.planted_file", lambda aid, name="PLANTED": declared)
    problems = check_edges.edge_case_problems(aid, load_course().assignment(aid))
    assert len(problems) == 1 and "'scaled_dot_product_attention/no_open_key_gives_nan' is caught by ['values']" \
        in problems[0], problems
