"""Wrong work must not cost the most (course.yaml's `experiments:`): a model that cannot learn stops as hopeless
against the reference's validation curve, its second seed is not tried, and it still loses the experiment."""
import nbformat
import pytest

from autograder.course.config import load_course
from autograder.grading.grade import grade_notebook
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from tests.planted import variant_source

pytestmark = pytest.mark.grading
AID = "w8l4_transformers"
ITEMS = ["Transformer", "causal_mask"]  # the items whose experiments train the student's Transformer
# the output layer frozen at zero: every logit is 0 whatever the rest learns (the example)
FROZEN_OUTPUT = ("        self.out = nn.Linear(d_model, vocab)\n",
                 "        self.out = nn.Linear(d_model, vocab)\n"
                 "        nn.init.zeros_(self.out.weight)\n"
                 "        nn.init.zeros_(self.out.bias)\n"
                 "        self.out.requires_grad_(False)  # frozen: it never learns\n")


def experiments_of(result):
    """Experiment name -> its test, of a grading's result."""
    return {t["extra_data"]["experiment"]: t for t in result["tests"] if "experiment" in t.get("extra_data", {})}


def graded(tmp_path, name, sources):
    path = tmp_path / f"{name}.ipynb"
    nbformat.write(with_cells(release_notebook(AID), sources), path)
    return experiments_of(grade_notebook(path, AID, items=ITEMS, device="cpu"))


def steps_trained(experiments):
    """The training steps of every seed every experiment ran (the grading's cost, without its fixed start)."""
    return sum(run["steps"] for t in experiments.values() for run in t["extra_data"]["trained"])


def test_a_transformer_that_cannot_learn_costs_at_most_1_5x_the_complete_one_and_loses_with_the_reason(
        tmp_path, graded_solutions):
    sources = solved_sources(AID)
    sources["Transformer"] = variant_source(AID, "Transformer", FROZEN_OUTPUT)
    frozen = graded(tmp_path, "frozen", sources)  # a program of its own: no cached run, it trains now
    # the complete submission's runs of the same experiments, as the graded solution trained them (each run's steps
    # are recorded with it, so a run read back from the cache counts what it cost when it trained)
    complete = {name: t for name, t in experiments_of(graded_solutions[AID]).items() if name in frozen}
    assert complete.keys() == frozen.keys() and complete, (complete.keys(), frozen.keys())

    assert all(t["score"] == t["max_score"] for t in complete.values()), {n: t["output"] for n, t in complete.items()}
    reverse = frozen["reverse_transformer"]
    assert reverse["score"] == 0, reverse["output"]
    assert "stopped as hopeless at step" in reverse["output"], reverse["output"]
    assert [run["seed"] for run in reverse["extra_data"]["trained"]] == [0]  # a hopeless run is not close
    assert "seed 1 not tried: seed 0 did not come close (it was stopped as hopeless)" in reverse["output"]
    exp = load_course().assignment(AID).experiments["reverse_transformer"]
    assert reverse["extra_data"]["trained"][0]["steps"] < exp.steps
    print(f"\ntraining steps: complete {steps_trained(complete)}, frozen {steps_trained(frozen)}")
    for which, experiments in (("complete", complete), ("frozen", frozen)):
        for name, t in experiments.items():
            print(which, name, t["extra_data"]["trained"], t["output"].splitlines()[-1])
    assert steps_trained(frozen) <= 1.5 * steps_trained(complete)


def test_the_reference_curve_is_trained_once_and_then_read_back(tmp_path, monkeypatch):
    """Once per process (a memo) and once per machine (the training cache): never a reference training per
    submission."""
    from autograder.grading import experiments
    from tests.test_grading import short_course
    lab = "lab14_transformers"
    monkeypatch.setenv("COURSE_CONFIG", str(short_course(tmp_path, lab, ["memory_task"])))  # 20 steps: 1 validation
    monkeypatch.delenv("COURSE_NO_CACHE", raising=False)
    monkeypatch.setattr("autograder.grading.cache.cache_folders", lambda: [tmp_path / "cache"])
    monkeypatch.setattr(experiments, "_CURVES", {})
    exp = load_course().assignment(lab).experiments["memory_task"]
    curve = experiments.reference_curve(lab, exp, 0, "cpu")
    assert [v["step"] for v in curve] == [16] and 0 <= curve[0]["test_accuracy"] <= 1
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1

    def no_training(*args):
        raise AssertionError("the reference trained again")
    monkeypatch.setitem(experiments.harness(lab).EXPERIMENTS["memory_task"], "data", no_training)
    assert experiments.reference_curve(lab, exp, 0, "cpu") == curve      # the memo
    monkeypatch.setattr(experiments, "_CURVES", {})
    assert experiments.reference_curve(lab, exp, 0, "cpu") == curve      # another process: the cache
