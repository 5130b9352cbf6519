"""The grading plugin's rules (autograder/grading/plugin.py), each on a tiny suite run with pytester in this process
as a TA runs one (`pytest SUITE --submission NB`), against lab14_transformers' course.yaml entry and release.

What a rule decides is read from the session's results.json and exit code: which failures are the student's (a
checker's Fail, the student's code raising, an answer the check cannot use) and which the grader's (anything else:
exit GRADER_FAILED, no results), the points of each check, and the item rules (a stub, or an oracle named in the
cell or called while checked, zeroes the whole item; a failed `exists` or a timeout stops the item's later checks).
A session with a readable notebook starts one sandbox; the first also starts the sandbox's zygote (a few seconds,
once per run). Starting one is left to tests/test_sandbox.py, training to the end-to-end tests.
"""
import json

# Imported here, before any session: pytester drops the modules a session imported when it ends, and each session
# would import these again (~1 s each): hypothesis (its pytest plugin imports it at every session's end) and IPython
# (notebook.parse).
import hypothesis  # noqa: F401
import IPython  # noqa: F401
import pytest

from autograder.course.config import ROOT, load_course
from autograder.grading.plugin import GRADER_FAILED

AID = "lab14_transformers"
SDPA = "scaled_dot_product_attention"

HEAD = f'''
import pytest
import torch

from autograder.grading.checks import check_close, check_shape

SDPA = "{SDPA}"


def inputs(rng):
    return [torch.randn(1, 3, 4, generator=rng) for _ in range(3)]
'''


def passing(item, *kinds):
    """Tests of `item` that pass without asking the student anything."""
    return "".join(f"\n\n@pytest.mark.item({item!r}, {kind!r})\ndef test_{item}_{kind}(student):\n    pass\n"
                   for kind in kinds)


@pytest.fixture
def grade(pytester, fixture_path, monkeypatch):
    """grade(suite_source, notebook, -k expression) -> (pytester's RunResult, results.json or None)."""
    monkeypatch.setenv("COURSE_ROOT", str(ROOT))  # the package's course: course.yaml and release/
    monkeypatch.delenv("COURSE_CONFIG", raising=False)

    def run(source, notebook, keyword=SDPA):
        suite = pytester.makepyfile(test_suite=HEAD + source)
        # beside the suite: pytest finds its rootdir from the paths on the command line, and a notebook in the checkout
        # would give the session the checkout's pyproject.toml settings
        submission = pytester.path / notebook
        submission.write_bytes(fixture_path(notebook).read_bytes())
        out = pytester.path / "results.json"
        result = pytester.runpytest(suite, "--submission", submission, "--assignment", AID, "--device", "cpu",
                                    "--no-experiments", "--results-json", out, "-k", keyword, "-p", "no:cacheprovider")
        return result, (json.loads(out.read_text()) if out.exists() else None)
    return run


def by_name(results):
    return {t["name"]: (t["score"], t["max_score"], t["output"]) for t in results["tests"]}


SCORED = passing("PositionalEncoding", "values", "properties") + passing(SDPA, "properties") + '''

@pytest.mark.item(SDPA, "shapes")
def test_shapes(student, rng):
    Q, K, V = inputs(rng)
    check_shape(SDPA, V, student.call(SDPA, Q, K, V))


@pytest.mark.item(SDPA, "values")
@pytest.mark.parametrize("shift", [0.0, 1.0])
def test_values(student, rng, shift):
    Q, K, V = inputs(rng)
    student.case(f"shift {shift:g}")
    check_close(SDPA, V + shift, student.call(SDPA, Q, K, V))  # the answer is V


@pytest.mark.item(SDPA, "gradients")
def test_gradients(student, rng):
    out, weights = student.call(SDPA, *inputs(rng))  # the answer is one tensor, not a pair


@pytest.mark.item("PositionalEncoding", "shapes")
def test_pe_shapes(student):
    from autograder.sandbox.grader_side import SandboxFailure
    raise SandboxFailure("timeout", "ran out of its time limit")  # what the student proxy raises past the deadline
'''


def test_each_check_scores_its_points_and_the_students_failures_say_why(grade):
    result, results = grade(SCORED, "lab14_answers.ipynb", f"{SDPA} or PositionalEncoding")
    assert results is not None, result.stdout.str()[-3000:]
    tests = by_name(results)
    # course.yaml's items and check order, only the items -k selected
    assert list(tests) == [f"{SDPA}: exists", f"{SDPA}: shapes", f"{SDPA}: values", f"{SDPA}: gradients",
                           f"{SDPA}: properties", "PositionalEncoding: exists", "PositionalEncoding: shapes",
                           "PositionalEncoding: values",
                           "PositionalEncoding: properties"]
    assert tests[f"{SDPA}: exists"] == (1, 1, f"'{SDPA}' exists with signature (Q, K, V, mask=None)")
    assert tests[f"{SDPA}: shapes"] == (1, 1, "ok")
    # a parametrized check scores only when every case passes; the failed case is named, with what was printed
    score, max_score, output = tests[f"{SDPA}: values"]
    assert (score, max_score) == (0, 1)
    assert output.startswith(f"max |{SDPA} - the reference| = 1 at index (0, ") and \
        "(tolerance 1e-05) (case: shift 1)" in output, output
    assert output.endswith("\nprinted: called")
    values = next(t for t in results["tests"] if t["name"] == f"{SDPA}: values")
    assert values["extra_data"] == {"case": "shift 1"}
    # an answer of the wrong structure, after the student was asked: the student's zero, not the grader's failure
    score, max_score, output = tests[f"{SDPA}: gradients"]
    assert (score, max_score) == (0, 1)
    assert output.startswith(f"'{SDPA}' returned something this check cannot use (ValueError: not enough values")
    # a timeout is the student's, and the item's later checks are not run
    score, max_score, output = tests["PositionalEncoding: shapes"]
    assert (score, max_score) == (0, 1) and "ran out of its time limit" in output, output
    limit = load_course().limits_for(AID, "PositionalEncoding").item_seconds
    for kind in ("values", "properties"):
        assert tests[f"PositionalEncoding: {kind}"] == \
            (0, 1, f"not checked: 'PositionalEncoding' ran out of its {limit:g} s time limit")
    assert (results["score"], results["max_score"]) == (4, 9)
    result.assert_outcomes(passed=5, failed=3, skipped=2)
    result.stdout.fnmatch_lines([f"*{AID}: 4 / 9 points*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


RULES = (passing(SDPA, "shapes", "gradients", "properties") + passing("manual_multihead", "shapes", "values")
         + passing("PositionalEncoding", "shapes", "values", "properties")
         + passing("EncoderBlock", "values", "properties") + '''

@pytest.mark.item(SDPA, "values")
def test_values(student, rng):
    student.call(SDPA, *inputs(rng))


@pytest.mark.item("EncoderBlock", "shapes")
def test_block_shapes(student, rng):
    block = student.new("EncoderBlock", 4, 2)
    check_shape("EncoderBlock", (1, 3, 4), student.method(block, "forward", torch.randn(1, 3, 4, generator=rng)))
''')


def test_a_stub_an_oracle_used_or_a_wrong_signature_zeroes_the_whole_item(grade):
    result, results = grade(RULES, "lab14_items_zeroed.ipynb",
                            f"{SDPA} or manual_multihead or PositionalEncoding or EncoderBlock")
    assert results is not None, result.stdout.str()[-3000:]
    tests = by_name(results)
    # a check that raised NotImplementedError: every check of the item scores 0, those that passed included
    stub = f"'{SDPA}' is not implemented yet (it raises NotImplementedError)"
    assert {k: tests[f"{SDPA}: {k}"] for k in ("exists", "shapes", "values", "gradients", "properties")} == \
        {"exists": (0, 1, stub), "shapes": (0, 1, stub), "values": (0, 1, stub), "gradients": (0, 1, stub),
         "properties": (0, 1, stub)}
    # a from-scratch item whose cell names its oracle: every check 0, none of them run
    for kind in ("exists", "shapes", "values"):
        score, _, output = tests[f"manual_multihead: {kind}"]
        assert score == 0 and "'manual_multihead' uses multi_head_attention_forward; this item is written from " \
                              "scratch" in output, output
    # a signature that is not the spec's: `exists` says so, and the item's other checks are not run
    spec = "'PositionalEncoding' has parameters (d), expected (d_model, max_len=512)"
    assert tests["PositionalEncoding: exists"] == (0, 1, spec)
    for kind in ("shapes", "values", "properties"):
        assert tests[f"PositionalEncoding: {kind}"] == (0, 1, f"not checked: 'PositionalEncoding' does not match the "
                                                              f"spec: {spec}")
    # an oracle called while a check ran (reached by a computed name): every check 0, those that passed included
    used = "'EncoderBlock' uses TransformerEncoderLayer; this item is written from scratch"
    for kind in ("exists", "shapes", "values", "properties"):
        score, _, output = tests[f"EncoderBlock: {kind}"]
        assert score == 0 and output.startswith(used), output
    assert (results["score"], results["max_score"]) == (0, 18)
    result.stdout.fnmatch_lines([f"{SDPA}: 0 points, {stub}"])


@pytest.mark.parametrize("body, cause", [
    ("undefined_helper(student)", "NameError"),  # the suite's own bug
    ("torch.zeros(2, 3) @ torch.zeros(4, 5)", "RuntimeError"),  # an error a wrong answer could cause, before any answer
    ('from autograder.sandbox.grader_side import SandboxFailure\n'
     '    raise SandboxFailure("sandbox", "the grader\'s process died")',
     "SandboxFailure"),  # the grader's own side of the sandbox
], ids=["suite_bug", "error_before_asking", "grader_side_of_the_sandbox"])
def test_a_suite_that_breaks_is_a_grader_failure_and_scores_nobody(grade, body, cause):
    suite = passing(SDPA, "values", "gradients", "properties") + \
        f"\n\n@pytest.mark.item(SDPA, 'shapes')\ndef test_shapes(student):\n    {body}\n"
    result, results = grade(suite, "lab14_answers.ipynb")
    assert result.ret == GRADER_FAILED and results is None, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*grader failure: nothing was scored*",
                                 f"*the grader failed in *test_shapes*{cause}*"])


def test_a_check_course_yaml_pays_for_that_the_suite_lacks_is_a_grader_failure(grade):
    result, results = grade(passing(SDPA, "shapes", "values"), "lab14_answers.ipynb")
    assert result.ret == GRADER_FAILED and results is None, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines([f"*course.yaml gives gradients of '{SDPA}' points, but the suite has no check of it*"])


def test_an_unreadable_notebook_scores_every_check_zero_with_the_reason(grade):
    result, results = grade(passing(SDPA, "shapes", "values", "gradients", "properties"), "truncated.ipynb")
    assert result.ret != GRADER_FAILED and results is not None, result.stdout.str()[-3000:]
    assert results["output"].startswith("truncated.ipynb is not a readable notebook (JSONDecodeError")
    assert [(t["score"], t["output"]) for t in results["tests"]] == [(0, f"not checked: {results['output']}")] * 5
    assert results["max_score"] == 5 and results["extra_data"]["isolation"] == "none"  # no sandbox was started
    result.assert_outcomes(skipped=5)


@pytest.mark.parametrize("marks, says", [
    # pytest runs pytest_collection_finish after the UsageError: the plugin must not read the missing marker there
    ("", "test_suite.py::test_unmarked has no @pytest.mark.item(name, kind): every test of a suite scores one check"),
    (f"@pytest.mark.item('{SDPA}', 'experiment')",
     f"course.yaml gives no points to 'experiment' of '{SDPA}' in {AID} (exists is the plugin's own check)"),
    (f"@pytest.mark.item('{SDPA}', 'exists')", f"course.yaml gives no points to 'exists' of '{SDPA}'"),
    ("@pytest.mark.item('attention', 'values')", "course.yaml gives no points to 'values' of 'attention'"),
], ids=["unmarked", "kind_without_points", "exists", "unknown_item"])
def test_a_suite_that_does_not_fit_course_yaml_is_a_usage_error(grade, marks, says):
    suite = passing(SDPA, "shapes", "values", "gradients", "properties") + \
        f"\n\n{marks}\ndef test_unmarked(student):\n    pass\n"
    result, results = grade(suite, "lab14_answers.ipynb")
    assert result.ret == pytest.ExitCode.USAGE_ERROR and results is None
    assert says in result.stderr.str(), result.stderr.str()


def test_a_suite_needs_a_submission(pytester):
    suite = pytester.makepyfile(test_suite=HEAD + passing(SDPA, "shapes"))
    result = pytester.runpytest(suite, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "these are hidden grading checks: name the notebook to grade with --submission NOTEBOOK" in \
        result.stderr.str()
