"""Per-check statistics on a class whose answers are known (tests/synthetic_class.py): the pass rates are the counts
it was built with, and the planted broken and toothless checks are flagged, no other; the grader's own reasons and
a crowded threshold are flagged too; `course stats`, `course report --json` and the report show the same numbers.
Nothing here grades: the results are written as the grader writes them."""
import json
import math

import pytest

from autograder import cli
from autograder.course.config import load_course
from autograder.grading.scoring import zero_reason
from autograder.reports.check_stats import (
    CROWDED,
    FAILS_GOOD,
    GRADERS_REASON,
    TOOTHLESS,
    UNATTEMPTED,
    ZEROED,
    item_status,
)
from autograder.reports.class_stats import assignment_stats, stats_lines
from autograder.reports.results_folder import load_results
from autograder.sandbox.protocol import SandboxFailure
from tests import synthetic_class
from tests.synthetic_class import AID, BROKEN, BROKEN_BY, REFERENCE, build_class, catches, student_result

N = 80
PLANTED_FLAGS = {(FAILS_GOOD, f"{BROKEN[0]}: {BROKEN[1]}"),
                 (TOOTHLESS, f"{synthetic_class.TOOTHLESS[0]}: {synthetic_class.TOOTHLESS[1]}")}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    folder = tmp_path_factory.mktemp("class")
    built = build_class(folder, N)
    return folder, built, assignment_stats(AID, load_results(folder))


def rewrite(folder, change):
    """Apply change(name, result) to every results.json under folder, in name order."""
    for path in sorted(folder.glob("*.json")):
        result = json.loads(path.read_text())
        change(path.stem, result)
        path.write_text(json.dumps(result))


def test_pass_rates_are_the_built_counts_and_only_the_planted_checks_are_flagged(synthetic):
    _, built, stats = synthetic
    assert stats.submissions == N and stats.partial == 0
    assert {(c.item, c.kind) for c in stats.checks} == set(built.attempted)
    for c in stats.checks:
        key = (c.item, c.kind)
        assert (c.attempted, c.judged, c.failed) == (built.attempted[key], built.attempted[key], built.failed[key]), key
        assert c.pass_rate == (built.attempted[key] - built.failed[key]) / built.attempted[key]
        assert c.upper == math.ceil(0.27 * c.judged)
    for item in stats.items:
        assert item.attempted == sum(choices[item.item] != "stub" for choices in built.choices.values())
    assert {(f.flag, f.subject) for f in stats.flags} == PLANTED_FLAGS
    broken = next(f for f in stats.flags if f.flag == FAILS_GOOD)
    assert BROKEN_BY in broken.evidence  # its most frequent failing reason names the alternative it refuses
    toothless = next(f for f in stats.flags if f.flag == TOOTHLESS)
    assert f"course check {AID} --mutations" in toothless.hint


def test_the_same_class_without_the_planted_checks_flags_nothing(tmp_path):
    built = build_class(tmp_path, N, distrusted=False)
    stats = assignment_stats(AID, load_results(tmp_path))
    assert stats.flags == []
    assert all(c.failed == built.failed[(c.item, c.kind)] for c in stats.checks)


def test_attempted_and_judged_follow_the_graders_own_words(tmp_path):
    """A stub and a deleted cell are not attempted; an item zeroed as a whole (an oracle called) is attempted but
    not judged check by check; a check skipped after the item's exists check failed is not judged either."""
    items = list(load_course().assignment(AID).items)
    sdpa, multihead, classifier = "scaled_dot_product_attention", "manual_multihead", "TransformerClassifier"
    table = catches(AID)
    for k in range(12):
        result = student_result({item: "stub" if (k, item) == (0, sdpa) else REFERENCE for item in items}, table)
        (tmp_path / f"s{k:02d}.json").write_text(json.dumps(result))
    deleted = (f"not checked: no cell with grade_id '{multihead}' in the notebook, and no cell defines '{multihead}' "
               f"(was the graded cell deleted?)")
    oracle = zero_reason(multihead, "multi_head_attention_forward", False)
    spec = f"'{classifier}' has parameters (d), expected (d_model, max_len=512)"

    def change(name, result):
        for t in result["tests"]:
            if t["item"] == multihead and name in ("s01", "s02"):
                t.update(score=0.0, status="failed", output=deleted if name == "s01" else oracle)
            elif t["item"] == classifier and name == "s03":
                kind = t["name"].split(": ")[1]
                t.update(score=0.0, status="failed", output=spec if kind == "exists" else
                         f"not run: '{classifier}' must exist and be implemented first" if kind.startswith("exp")
                         else f"not checked: '{classifier}' does not match the spec: {spec}")
        result["score"] = sum(t["score"] for t in result["tests"])
    rewrite(tmp_path, change)
    stats = assignment_stats(AID, load_results(tmp_path))
    by_item = {i.item: i for i in stats.items}
    assert (by_item[sdpa].attempted, by_item[multihead].attempted, by_item[multihead].zeroed) == (11, 11, 1)
    checks = {c.name: c for c in stats.checks}
    assert (checks[f"{multihead}: values"].attempted, checks[f"{multihead}: values"].judged) == (11, 10)
    assert (checks[f"{classifier}: exists"].judged, checks[f"{classifier}: exists"].failed) == (12, 1)
    assert (checks[f"{classifier}: shapes"].judged, checks[f"{classifier}: shapes"].failed) == (11, 0)
    assert checks[f"{classifier}: experiment memory_task"].judged == 11
    # the words are the grader's own (scoring.zero_reason), not copies that could drift
    tests = [{"name": f"{sdpa}: values", "output": zero_reason(sdpa, "", True)}]
    assert item_status(sdpa, tests) == UNATTEMPTED
    assert item_status(sdpa, [{"name": f"{sdpa}: values", "output": zero_reason(sdpa, "", False, "x")}]) == ZEROED


def test_a_check_whose_failures_are_mostly_time_limits_is_flagged_as_the_graders(tmp_path):
    build_class(tmp_path, N)
    item, timed_out = "EncoderBlock", []
    limit = SandboxFailure("timeout", "did not finish within 60 s (time limit)")  # as plugin.judge words it

    def change(name, result):
        for t in result["tests"]:
            if t["name"] == f"{item}: values" and t["score"] < t["max_score"] and len(timed_out) < 9 \
                    and "NotImplementedError" not in t["output"]:  # a stub is no failure of the check
                t["output"] = f"'{item}' {limit} on case: EncoderBlock(32, 4)"
                timed_out.append(name)
    rewrite(tmp_path, change)
    stats = assignment_stats(AID, load_results(tmp_path))
    values = next(c for c in stats.checks if c.name == f"{item}: values")
    assert values.grader_reason == ("time limit", 9) and values.failed < 18
    flags = {(f.flag, f.subject): f for f in stats.flags}
    assert set(flags) == PLANTED_FLAGS | {(GRADERS_REASON, f"{item}: values")}
    assert f"9 of its {values.failed} failures are a time limit" in flags[(GRADERS_REASON, f"{item}: values")].evidence


def test_figures_crowding_the_threshold_are_flagged_with_how_many_each_side(tmp_path):
    build_class(tmp_path, N)
    exp = load_course().assignment(AID).experiments["memory_task"]  # test_accuracy >= 0.99, lecture 0.998
    moved = {"under": 0, "over": 0}

    def change(name, result):
        for t in result["tests"]:
            metrics = t.get("extra_data", {}).get("metrics")
            if metrics and t["score"] == t["max_score"] and int(name[-3:]) % 2:
                side = "under" if int(name[-3:]) % 4 == 1 else "over"
                metrics[exp.metric] = 0.9895 if side == "under" else 0.9905  # the band is 0.99 +- 0.002
                t["score"] = 0.0 if side == "under" else t["score"]
                moved[side] += 1
        result["score"] = sum(t["score"] for t in result["tests"])
    rewrite(tmp_path, change)
    stats = assignment_stats(AID, load_results(tmp_path))
    metric = stats.experiments[0].metrics[0]
    assert (metric.under, metric.over) == (moved["under"], moved["over"]) and min(moved.values()) > 5
    crowded = [f for f in stats.flags if f.flag == CROWDED]
    assert [f.subject for f in crowded] == ["experiment memory_task"]
    assert f"{moved['under']} just missing it, {moved['over']} just holding it" in crowded[0].evidence


def test_the_references_figures_come_from_the_experiment_cache(synthetic, tmp_path, monkeypatch):
    from autograder.grading import cache
    from autograder.grading.experiments import ExperimentResult
    from autograder.reports.experiment_stats import remember_reference
    folder = synthetic[0]
    monkeypatch.setattr(cache, "cache_folders", lambda: [tmp_path])  # an empty cache of this test's own
    monkeypatch.setattr(cache, "shipped_folders", lambda: [])
    before = assignment_stats(AID, load_results(folder))
    assert before.experiments[0].metrics[0].reference == {}  # nothing cached: the plot and the table say so
    assert any("reference none in the cache" in line for line in stats_lines(before))
    remember_reference(AID, ExperimentResult(AID, "memory_task", {"test_accuracy": 0.9971}, [], 12.0, 0), "cpu")
    stats = assignment_stats(AID, load_results(folder))
    assert stats.experiments[0].metrics[0].reference == {0: 0.9971}
    assert any("reference seed 0 0.9971" in line for line in stats_lines(stats))


def test_course_stats_and_report_json_print_the_same_numbers(synthetic, tmp_path, capsys):
    folder, built, stats = synthetic
    assert cli.main(["stats", str(folder), "-a", AID]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 120 for line in lines)
    for k, c in enumerate(stats.checks, 1):
        row = next(line for line in lines if line.startswith(f"{k:>3} {c.name}"))
        rate = f"{(built.attempted[(c.item, c.kind)] - built.failed[(c.item, c.kind)]) / c.judged:.0%}"
        assert row.split()[-4:-2] == [str(c.judged), rate], row
    assert sum(line.startswith("  ") and ": nobody fails it:" in line for line in lines) == 1
    page, out = tmp_path / "report.html", tmp_path / "stats.json"
    assert cli.main(["report", str(folder), "-o", str(page), "--json", str(out)]) == 0
    found = json.loads(out.read_text())
    assert [s["aid"] for s in found] == [AID]
    for c in found[0]["checks"]:
        key = (c["item"], c["kind"])
        assert (c["judged"], c["failed"]) == (built.attempted[key], built.failed[key])
    assert {(f["flag"], f["subject"]) for f in found[0]["flags"]} == PLANTED_FLAGS
    html = page.read_text()
    section = html.split("Per check: what the class missed")[1]
    assert "Flagged (2)" in section and section.count("class='flagged'") == 2
    assert "data:image/png;base64," in html.split("Experiment memory_task</h3>")[1]


def test_course_stats_names_the_assignments_it_found_when_asked_for_another(synthetic, capsys):
    folder, _, _ = synthetic
    assert cli.main(["stats", str(folder), "-a", "w8l4_transformers"]) == 2
    assert f"assignments found: {AID}" in capsys.readouterr().err


def test_discrimination_is_the_point_biserial_and_each_way_to_fail_good_submissions_is_flagged():
    from autograder.reports.check_stats import CheckStat, check_flags, point_biserial
    assert point_biserial([1, 1, 0, 0], [3, 3, 1, 1]) == pytest.approx(1.0)
    assert point_biserial([1, 0, 1, 0], [1, 3, 2, 2]) == pytest.approx(-1 / math.sqrt(2))
    assert point_biserial([1, 1, 1], [1, 2, 3]) is None  # nobody failed: it says nothing
    settings = load_course().statistics
    worse = CheckStat("item", "values", 1, attempted=40, judged=40, passed=30, discrimination=-0.3, upper=11,
                      upper_failed=1)
    nobody = CheckStat("item", "gradients", 1, attempted=40, judged=40, passed=0, upper=11, upper_failed=11)
    fine = CheckStat("item", "shapes", 1, attempted=40, judged=40, passed=30, discrimination=0.4, upper=11,
                     upper_failed=1)
    flags = check_flags(AID, [worse, nobody, fine], settings)
    assert [(f.flag, f.subject) for f in flags] == [(FAILS_GOOD, "item: values"), (FAILS_GOOD, "item: gradients")]
    assert "passing goes with doing worse" in flags[0].evidence and "none of the 40" in flags[1].evidence
