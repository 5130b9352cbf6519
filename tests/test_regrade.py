"""A regrade says whose grade moved and loses nothing: after a change to course.yaml, `course grade` into the same
results folder lists exactly the submissions whose score moved (old, new, per item, why), appends them to the
folder's changes.csv, and keeps each replaced result in the folder's history."""
import csv
import re

import pytest
import yaml

from autograder.batch.results import history
from autograder.cli import main
from autograder.course.config import ROOT, load_course
from tests.test_batch import notebook

pytestmark = pytest.mark.grading
AID = "lab14_transformers"
SDPA = "scaled_dot_product_attention"


def test_a_regrade_after_a_points_change_lists_exactly_whose_grade_moved_and_keeps_the_history(
        tmp_path, capsys, monkeypatch):
    subs, results = tmp_path / "subs", tmp_path / "graded"
    notebook(subs / "alice" / f"{AID}.ipynb", [SDPA])   # right: her points follow the change
    notebook(subs / "bob" / f"{AID}.ipynb")             # a stub: 0 before and after, so not listed
    args = ["grade", str(subs), "-a", AID, "--items", SDPA, "--device", "cpu", "--results-dir", str(results)]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "moved" not in first and not (results / "changes.csv").exists()  # a first grading changes nobody's

    raw = yaml.safe_load((ROOT / "course.yaml").read_text())
    before = raw["assignments"][AID]["items"][SDPA]["points"]["values"]
    raw["assignments"][AID]["items"][SDPA]["points"]["values"] = before + 1
    (tmp_path / "course.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.setenv("COURSE_CONFIG", str(tmp_path / "course.yaml"))
    assert main(args) == 0
    out = capsys.readouterr().out
    moved = out[out.index("whose grade moved"):out.index("why points were lost")]
    assert "(1;" in moved and "bob" not in moved, moved
    old = sum(yaml.safe_load((ROOT / "course.yaml").read_text())["assignments"][AID]["items"][SDPA]["points"].values())
    assert re.search(rf"alice: {old:g} -> {old + 1:g} \({SDPA} {old:g} -> {old + 1:g}\): the grader changed", moved)
    with open(results / "changes.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["submission"], r["item"], float(r["old"]), float(r["new"])) for r in rows] == [
        ("alice", SDPA, old, old + 1)]

    kept = history(results, "alice")
    assert [r["score"] for r in kept] == [old] and kept[0]["extra_data"]["grading"]["items"] == [SDPA]
    assert [r["score"] for r in history(results, "bob")] == [0.0]  # replaced too, though its score did not move

    assert main(args) == 0  # the same grading again: reused, and nothing more is listed or appended
    assert "moved" not in capsys.readouterr().out
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
