"""Budgets from the thresholds (course.yaml's `experiments:`): the hopeless rule a run stops on, and when a second
seed is worth trying."""
import pytest
import torch
import torch.nn as nn

from autograder.course.config import parse_course
from autograder.errors import ConfigError
from autograder.grading.experiments import untried_seeds, with_stop
from autograder.harness.training import Marks, hopeless_reason, pass_marks, train_until, validation_start

COURSE = """
course: tiny
data: {mnist_dir: .}
seed: 1
experiments: {hopeless_after: 1.5, hopeless_fraction: 0.5, close: 0.2}
assignments:
  a1:
    title: t
    lecture: l
    notebook: a1.ipynb
    items:
      fit: {signature: "(x)", points: {exists: 1}}
    experiments:
      learns: {item: fit, points: 2, description: d, metric: acc, threshold: {acc: {min: 0.8}, loss: {max: 0.5}},
               steps: 10, seeds: [0, 1, 2]}
      late: {item: fit, points: 1, description: d, metric: acc, threshold: {acc: {min: 0.8}}, steps: 10, seeds: [0],
             hopeless_after: 3, validate_from: 1}
"""
# the reference clears acc's mark (0.8 + 0.1) at step 4
REFERENCE = [{"step": 2, "acc": 0.5}, {"step": 4, "acc": 0.95}]


def experiments(text=COURSE):
    return parse_course(text, "course.yaml").assignment("a1").experiments


def marks(cfg, reference=REFERENCE):
    return pass_marks({**cfg, "reference": reference}, {"acc": 0.1})


def test_the_course_rule_reaches_every_experiments_cfg_and_an_experiment_may_wait_longer():
    exps = experiments()
    assert exps["learns"].cfg["hopeless"] == {"after": 1.5, "fraction": 0.5, "validate_from": 0.5}
    assert exps["late"].cfg["hopeless"] == {"after": 3, "fraction": 0.5, "validate_from": 1}
    assert experiments(COURSE.replace("experiments: {hopeless_after: 1.5, hopeless_fraction: 0.5, close: 0.2}\n",
                                      ""))["learns"].cfg["hopeless"] == {"after": 1.0, "fraction": 0.5,
                                                                         "validate_from": 0.5}


@pytest.mark.parametrize("bad", ["hopeless_after: 0.5", "hopeless_fraction: 1.5", "close: -1", "validate_from: 2",
                                 "patience: 2"])
def test_a_wrong_rule_is_a_config_error_naming_the_key(bad):
    key = bad.split(":")[0]
    with pytest.raises(ConfigError, match=key):
        experiments(COURSE.replace("{hopeless_after: 1.5, hopeless_fraction: 0.5, close: 0.2}", f"{{{bad}}}"))


def test_a_run_is_hopeless_only_past_after_times_the_references_clearing_step_and_below_the_fraction():
    m = marks(experiments()["learns"].cfg)
    assert isinstance(m, Marks) and m == {"acc": pytest.approx(0.9)}
    assert hopeless_reason({"acc": 0.1}, 5, m) == ""        # 5 < 1.5 x 4: too early to judge
    reason = hopeless_reason({"acc": 0.1}, 6, m)
    assert reason.startswith("stopped as hopeless at step 6: acc 0.1 < 0.5 x the reference's 0.95"), reason
    assert "the reference cleared its stopping marks at step 4" in reason
    assert hopeless_reason({"acc": 0.5}, 6, m) == ""        # half the reference's 0.95 or more: still learning
    assert hopeless_reason({"error": "ValueError"}, 6, m) == ""  # validation failed: nothing to judge
    assert hopeless_reason({"acc": 0.1}, 6, marks(experiments()["learns"].cfg, [])) == ""  # no curve sent
    assert hopeless_reason({"acc": 0.1}, 9, marks(experiments()["late"].cfg)) == ""  # this one waits to 3 x 4


def test_train_until_stops_a_model_that_cannot_learn_and_says_why():
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    x = torch.randn(16, 2)

    def batch_loss(step):
        return (model(x) ** 2).mean()

    m = marks(experiments()["learns"].cfg)
    history = train_until(model, batch_loss, 10, 1e-2, validate=lambda: {"acc": 0.2}, marks=m)
    assert history["steps"] == 6 and history["stopped_early"], history
    assert history["hopeless"].startswith("stopped as hopeless at step 6"), history
    learning = train_until(model, batch_loss, 10, 1e-2, validate=lambda: {"acc": 0.6}, marks=m)
    assert learning["steps"] == 10 and not learning["hopeless"] and not learning["stopped_early"], learning


@pytest.mark.parametrize("metrics, close", [
    ({"acc": 0.7, "loss": 0.3}, True),     # 0.7 >= 0.8 - 0.2 x 0.8
    ({"acc": 0.63, "loss": 0.3}, False),
    ({"acc": 0.9, "loss": 0.6}, True),     # 0.6 <= 0.5 + 0.2 x 0.5
    ({"acc": 0.9, "loss": 0.61}, False),
    ({"acc": 0.9}, False),                 # a figure not measured is not close
    (None, False),
])
def test_a_miss_is_close_when_every_figure_is_within_close_times_its_bound(metrics, close):
    assert experiments()["learns"].came_close(metrics, 0.2) is close


def test_the_next_seed_is_tried_only_after_a_close_miss_and_the_output_says_why_not():
    exp = experiments()["learns"]
    assert untried_seeds(exp, 0, {"acc": 0.7, "loss": 0.3}, {}, 0.2) == ""
    assert untried_seeds(exp, 0, {"acc": 0.7, "loss": 0.3}, {"hopeless": "stopped as hopeless at step 6"}, 0.2) == \
        "seed 1, 2 not tried: seed 0 did not come close (it was stopped as hopeless)"
    assert untried_seeds(exp, 1, None, {}, 0.2) == "seed 2 not tried: seed 1 did not come close (it gave no figures)"
    assert "missed a bound by more than 0.2 of the bound (course.yaml: experiments.close)" in \
        untried_seeds(exp, 0, {"acc": 0.1, "loss": 0.3}, {}, 0.2)
    assert untried_seeds(exp, 2, None, {}, 0.2) == ""      # the last seed: nothing left to try


def test_a_hopeless_stop_explains_a_miss_and_never_fails_figures_that_pass():
    run = {"hopeless": "stopped as hopeless at step 6"}
    assert with_stop(["acc = 0.1, needs >= 0.8"], run) == ["acc = 0.1, needs >= 0.8", "stopped as hopeless at step 6"]
    assert with_stop([], run) == []
    assert with_stop(["acc = 0.1, needs >= 0.8"], {}) == ["acc = 0.1, needs >= 0.8"]


def test_a_run_validates_from_half_the_references_clearing_step_and_still_stops_there():
    """The reference cleared at step 4: validations start at 2 (0.5 x 4), not at 1; without a curve, or with
    validate_from 0, they start at `first`. A run that learns as the reference does still stops where it did."""
    cfg = experiments()["learns"].cfg
    assert validation_start(marks(cfg), 1) == 2 and validation_start(marks(cfg), 3) == 3
    assert validation_start(marks(cfg, []), 1) == 1
    assert validation_start(marks({**cfg, "hopeless": {**cfg["hopeless"], "validate_from": 0}}), 1) == 1
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    x = torch.randn(16, 2)
    asked = []

    def validate():
        asked.append(len(asked))
        return {"acc": 0.95 if len(asked) >= 3 else 0.5}  # clears at its third validation

    history = train_until(model, lambda step: (model(x) ** 2).mean(), 10, 1e-2, validate, marks(cfg))
    assert [v["step"] for v in history["val"]] == [2, 3, 4] and history["steps"] == 4, history
