"""Experiments trained side by side (grading/ahead.py): the same results as one after the other, each run in a
sandbox of its own, started without waiting for the one before."""
import threading
import time
from pathlib import Path

import nbformat
import pytest
import yaml

from autograder.course.config import load_course
from autograder.grading import ahead
from autograder.grading.grade import grade_notebook
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from tests.planted import planted, variant_source

pytestmark = [pytest.mark.grading, pytest.mark.experiment]
AID = "w8l4_transformers"  # two graded experiments, both after every check
# Short runs on one seed: each misses its threshold, and the planted mistake's item is regraded with the reference.
# What is checked is the mechanism (order, overlap, sandboxes, equal results), not a figure: a second seed (tried when
# the first came close) and more steps only add training to both gradings.
STEPS = 10


def short_course(folder):
    """course.yaml with w8l4's experiments cut to STEPS steps on their first seed (a file COURSE_CONFIG names)."""
    course = load_course()
    raw = yaml.safe_load(Path(course.path).read_text())
    raw["data"]["mnist_dir"] = str(course.mnist_dir)
    for exp in raw["assignments"][AID]["experiments"].values():
        exp["steps"], exp["seeds"] = STEPS, exp["seeds"][:1]
    path = folder / "course.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))  # the experiments in their order
    return path


def without_times(result):
    """The results without their wall-clock fields, which differ run to run by nature."""
    result = {k: v for k, v in result.items() if k != "execution_time"}
    result["tests"] = [{k: v for k, v in t.items() if k != "seconds"} for t in result["tests"]]
    result["extra_data"] = {k: v for k, v in result.get("extra_data", {}).items() if k != "seconds"}
    return result


@pytest.mark.slow
def test_experiments_trained_side_by_side_grade_as_they_do_one_after_the_other(tmp_path, monkeypatch):
    """A submission with a planted mistake in `attention` (its checks fail, so each experiment is also regraded
    with the reference's attention): graded with its experiments one at a time and two at a time, every test
    has the same score and output; side by side, the second run starts while the first is still training, and
    every run has a sandbox of its own."""
    monkeypatch.setenv("COURSE_CONFIG", str(short_course(tmp_path)))
    monkeypatch.setenv("COURSE_NO_CACHE", "1")  # both gradings train: the cache would hand one the other's runs
    sources = solved_sources(AID)
    sources["attention"] = variant_source(AID, "attention", next(iter(planted(AID)["attention"]["wrong"].values())))
    notebook = tmp_path / f"{AID}.ipynb"
    nbformat.write(with_cells(release_notebook(AID), sources), notebook)

    assignment = load_course().assignment(AID)
    order = [name for name, exp in assignment.experiments.items() if exp.graded]  # the session's: course.yaml's
    runs, second_started, overlapped = [], threading.Event(), []
    run_experiment = ahead.run_experiment

    def watched(course, aid, exp, code, sandbox, device, why="", notes=None):
        runs.append((exp.name, sandbox))
        if exp.name == order[1]:
            second_started.set()
        if exp.name == order[0] and at_once == 2:  # hold the first run until the second has started beside it
            overlapped.append(second_started.wait(120))
        return run_experiment(course, aid, exp, code, sandbox, device, why=why, notes=notes)
    monkeypatch.setattr(ahead, "run_experiment", watched)

    results = {}
    for at_once in (1, 2):
        runs.clear()
        results[at_once] = grade_notebook(notebook, AID, device="cpu", threads=1, experiments_at_once=at_once)
        assert [name for name, _ in runs] == order, f"at {at_once}: the experiments ran as {runs}"
        sandboxes = [sandbox for _, sandbox in runs]
        assert None not in sandboxes and len({id(s) for s in sandboxes}) == len(sandboxes), sandboxes
    assert overlapped == [True], "the second experiment waited for the first to finish"
    assert without_times(results[1]) == without_times(results[2])
    lost = {t["name"] for t in results[1]["tests"] if t["score"] < t["max_score"]}
    assert any(name.startswith("attention:") for name in lost), lost
    assert {"Transformer: experiment reverse_transformer", "causal_mask: experiment no_causal_mask"} <= lost, lost


@pytest.mark.slow
def test_a_run_started_beside_the_checks_is_dropped_when_they_leave_its_item_not_ready(tmp_path, monkeypatch):
    """The session's first experiment (reverse_transformer) starts as the notebook loads, before its item's checks;
    when they fail its `exists` check (a wrong signature), its sandbox is ended and the outcome is the one it has
    one at a time: not run."""
    monkeypatch.setenv("COURSE_CONFIG", str(short_course(tmp_path)))
    monkeypatch.setenv("COURSE_NO_CACHE", "1")
    sources = solved_sources(AID)
    sources["Transformer"] = sources["Transformer"].replace("max_len=64, pad_id=None)", "max_len=64, pad=None)")
    notebook = tmp_path / f"{AID}.ipynb"
    nbformat.write(with_cells(release_notebook(AID), sources), notebook)
    runs, dropped, run_experiment = [], [], ahead.run_experiment

    def watched(course, aid, exp, code, sandbox, device, why="", notes=None):
        runs.append((exp.name, sandbox))
        if exp.name == "reverse_transformer" and sandbox is not None:  # the early run: held until it is dropped
            deadline = time.monotonic() + 120
            while not sandbox.abandoned and time.monotonic() < deadline:
                time.sleep(0.05)
            dropped.append(sandbox.abandoned)
        return run_experiment(course, aid, exp, code, sandbox, device, why=why, notes=notes)
    monkeypatch.setattr(ahead, "run_experiment", watched)

    results = {at_once: grade_notebook(notebook, AID, device="cpu", threads=1, experiments_at_once=at_once)
               for at_once in (1, 2)}
    assert without_times(results[1]) == without_times(results[2])
    assert dropped == [True], f"reverse_transformer's early run was not started, or not dropped: {runs}"
    test = next(t for t in results[2]["tests"] if t["name"] == "Transformer: experiment reverse_transformer")
    assert test["score"] == 0 and "must exist and be implemented first" in test["output"], test
