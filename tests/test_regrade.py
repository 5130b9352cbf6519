"""A regrade says whose grade moved and loses nothing: after a change to course.yaml, `course regrade RESULTS_DIR` (or
`course grade` into the same results folder) lists exactly the submissions whose score moved (old, new, per item,
why), appends them to the folder's changes.csv, and keeps each replaced result in the folder's history."""
import csv
import json
import re

import pytest
import yaml

from autograder.batch.rescore import RESCORED
from autograder.batch.results import history
from autograder.cli import main
from autograder.course.config import ROOT, load_course
from autograder.reports.feedback import summary_html
from tests.test_batch import notebook

pytestmark = pytest.mark.grading
AID = "lab14_transformers"
SDPA = "scaled_dot_product_attention"


def test_a_regrade_after_a_points_change_lists_exactly_whose_grade_moved_runs_nothing_and_keeps_the_history(
        tmp_path, capsys, monkeypatch):
    """Only course.yaml's points moved: each saved result is scored again from its checks' outcomes (batch/rescore.py)
    and no notebook is graded, the grading step replaced by one that fails the test."""
    from autograder.batch import run
    subs, results = tmp_path / "subs", tmp_path / "graded"
    notebook(subs / "alice" / f"{AID}.ipynb", [SDPA])   # right: her points follow the change
    notebook(subs / "bob" / f"{AID}.ipynb")             # a stub: 0 before and after, so not listed
    args = ["grade", str(subs), "-a", AID, "--items", SDPA, "--device", "cpu", "--results-dir", str(results)]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "whose grade moved" not in first and not (results / "changes.csv").exists()  # a first grading: nobody

    raw = yaml.safe_load((ROOT / "course.yaml").read_text())
    before = raw["assignments"][AID]["items"][SDPA]["points"]["values"]
    raw["assignments"][AID]["items"][SDPA]["points"]["values"] = before + 1
    (tmp_path / "course.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.setenv("COURSE_CONFIG", str(tmp_path / "course.yaml"))
    graded = []
    monkeypatch.setattr(run, "grade_submission", lambda *a, **k: graded.append(a) or pytest.fail("points graded"))
    regrade = ["regrade", str(results), "-a", AID, "--items", SDPA, "--device", "cpu"]
    assert main(regrade) == 0  # the notebooks the results name, graded again into their folder
    out = capsys.readouterr().out
    assert graded == [] and "2 rescored" in out, out
    moved = out[out.index("whose grade moved"):out.index("why points were lost")]
    assert "(1;" in moved and "bob" not in moved, moved
    old = sum(yaml.safe_load((ROOT / "course.yaml").read_text())["assignments"][AID]["items"][SDPA]["points"].values())
    assert re.search(rf"alice: {old:g} -> {old + 1:g} \({SDPA} {old:g} -> {old + 1:g}\): the grader changed: "
                     rf"course.yaml's points$", moved, re.M), moved
    with open(results / "changes.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["submission"], r["item"], float(r["old"]), float(r["new"]), r["why"]) for r in rows] == [
        ("alice", SDPA, old, old + 1, "the grader changed: course.yaml's points")]

    kept = history(results, "alice")
    assert [r["score"] for r in kept] == [old] and kept[0]["extra_data"]["grading"]["items"] == [SDPA]
    assert [r["score"] for r in history(results, "bob")] == [0.0]  # replaced too, though its score did not move
    now = json.loads((results / "alice.json").read_text())
    assert now["max_score"] == old + 1 and RESCORED in now["extra_data"]["notes"]
    assert [(h["score"], h["why"]) for h in now["extra_data"]["history"]] == [
        (old, "the grader changed: course.yaml's points")]
    page = re.sub(r"\s+", " ", summary_html(now))  # the student's feedback page shows the history
    when = re.escape(kept[0]["extra_data"]["grading"]["graded_at"])
    assert re.search(rf"<td>{when}</td><td>{old:g} / \d+</td><td>the grader changed: course.yaml&#39;s points</td>"
                     rf".*<td>now</td><td>{old + 1:g} / ", page), page

    assert main(regrade) == 0  # the same grading again: reused, and nothing more is listed or appended
    assert "whose grade moved" not in capsys.readouterr().out
    with open(results / "changes.csv") as f:
        assert len(list(csv.DictReader(f))) == 1


def test_new_points_or_a_new_max_threshold_regrade_from_the_cached_figures_and_train_nothing(
        tmp_path, capsys, monkeypatch):
    """An experiment's points, and a `max` bound (it only judges the figures), are not in the key of its cached runs
    (grading/experiments.py): the regrade re-judges the figures it has and trains nothing."""
    import nbformat

    from autograder.grading import experiments
    from autograder.notebooks.examples import examples
    aid, item, exp = "w8l1_attention_vision", "AutoEncoder", "ae_mnist"
    subs, results = tmp_path / "subs", tmp_path / "graded"
    (subs / "alice").mkdir(parents=True)
    nbformat.write(examples(aid)["complete"], subs / "alice" / f"{aid}.ipynb")
    args = ["grade", str(subs), "-a", aid, "--items", item, "--device", "cpu", "--results-dir", str(results)]
    assert main(args) == 0  # trains ae_mnist, or finds it in the training cache
    capsys.readouterr()
    trained = []
    monkeypatch.setattr(experiments, "_train_and_evaluate", lambda *a, **k: trained.append(a) or (None, ["no"]))

    raw = yaml.safe_load((ROOT / "course.yaml").read_text())
    raw["data"]["mnist_dir"] = str(load_course().mnist_dir)  # the same MNIST from the copy's folder: the same runs
    checks = sum(raw["assignments"][aid]["items"][item]["points"].values())
    points = raw["assignments"][aid]["experiments"][exp]["points"]
    for step, (change, old, new) in enumerate((
            (lambda e: e.update(points=points + 1), checks + points, checks + points + 1),
            (lambda e: e["threshold"]["test_mse"].update(max=1e-6), checks + points + 1, checks))):
        change(raw["assignments"][aid]["experiments"][exp])
        config = tmp_path / f"course-{step}.yaml"  # a file of its own: a course.yaml is read once per path
        config.write_text(yaml.safe_dump(raw, sort_keys=False))
        monkeypatch.setenv("COURSE_CONFIG", str(config))
        assert main(args) == 0
        out = capsys.readouterr().out
        assert re.search(rf"alice: {old:g} -> {new:g} \({item} {old:g} -> {new:g}\)", out), out[-2000:]
    assert trained == [], "a regrade after new points or a new max bound trained an experiment"


def test_a_regrade_names_a_notebook_that_is_gone_and_a_folder_with_nothing_to_regrade(tmp_path, capsys):
    """Nothing to grade again is one line and exit status 2; a result whose notebook is gone is named and kept."""
    results = tmp_path / "graded"
    assert main(["regrade", str(results), "-a", AID]) == 2
    assert capsys.readouterr().err.strip() == f"error: {results}: no such results folder"
    (results / "secA").mkdir(parents=True)
    gone = tmp_path / "subs" / "alice" / f"{AID}.ipynb"
    kept = {"score": 1.0, "max_score": 5.0, "tests": [],
            "extra_data": {"grading": {"assignment": AID, "source": str(gone)}}}
    (results / "secA" / "alice.json").write_text(json.dumps(kept))
    assert main(["regrade", str(results), "-a", AID]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"secA/alice: its notebook {gone} is gone; its saved result is kept as it is",
                   f"error: {results}: no result of {AID} names a notebook that is still there"]
    assert json.loads((results / "secA" / "alice.json").read_text()) == kept
