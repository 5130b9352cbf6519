"""grading/shared_runs.py: trained states kept per process under their run's identity, handed on as data."""
import torch

from autograder.grading import shared_runs
from autograder.harness.w8l1_attention_vision import EXPERIMENTS, reused_state


def test_a_kept_state_is_a_copy_and_comes_back_as_the_data_the_harness_reads():
    shared_runs.forget()
    state = [torch.arange(3.0), torch.ones(2, 2)]
    shared_runs.keep("run", state, {"steps": 5})
    state[0].zero_()  # the trainer's model moves on: the kept copy does not
    held, history = shared_runs.kept("run")
    assert torch.equal(held[0], torch.arange(3.0)) and history == {"steps": 5}
    back = reused_state({"X_train": torch.zeros(1), **shared_runs.as_data(held)})
    assert len(back) == 2 and all(a is b for a, b in zip(back, held, strict=True))
    assert reused_state({"X_train": torch.zeros(1)}) is None
    assert shared_runs.kept("another run") is None and shared_runs.kept(None) is None


def test_the_oldest_state_goes_first_and_a_run_that_drew_global_random_numbers_is_never_kept():
    shared_runs.forget()
    for i in range(shared_runs.KEPT + 2):
        shared_runs.keep(f"run {i}", [torch.zeros(1)], {})
    assert shared_runs.kept("run 0") is None and shared_runs.kept("run 1") is None
    assert shared_runs.kept(f"run {shared_runs.KEPT + 1}") is not None
    shared_runs.keep("dropout", [torch.zeros(1)], {"global_rng_used": True})
    assert shared_runs.kept("dropout") is None
    shared_runs.forget()


def test_w8l1_declares_what_it_reuses():
    """dae_mnist trains its DAE beside ae_mnist's AE; attention_modes trains its own model (course.yaml says why)."""
    assert shared_runs.reused_name(EXPERIMENTS["dae_mnist"]) == "ae_mnist"
    assert shared_runs.reused_name(EXPERIMENTS["attention_modes"]) is None
    assert shared_runs.is_reused(EXPERIMENTS, "ae_mnist") and not shared_runs.is_reused(EXPERIMENTS, "red_square")
    assert shared_runs.reused_name(EXPERIMENTS["ae_mnist"]) is None


def test_a_run_is_reused_only_when_course_yaml_configures_it_with_the_same_steps():
    """A course.yaml that drops ae_mnist, or cuts only one of the two, trains dae_mnist's plain AE itself."""
    from autograder.course.config import load_course
    assignment = load_course().assignment("w8l1_attention_vision")
    spec = EXPERIMENTS["dae_mnist"]
    assert shared_runs.reused_here(assignment, "dae_mnist", spec) == "ae_mnist"
    without = assignment.model_copy(update={"experiments": {
        n: e for n, e in assignment.experiments.items() if n != "ae_mnist"}})
    assert shared_runs.reused_here(without, "dae_mnist", spec) is None
    ae = assignment.experiments["ae_mnist"]
    cut = ae.model_copy(update={"steps": ae.steps - 1})
    shorter = assignment.model_copy(update={"experiments": {**assignment.experiments, "ae_mnist": cut}})
    assert shorter.experiments["ae_mnist"].cfg["steps"] == ae.steps - 1
    assert shared_runs.reused_here(shorter, "dae_mnist", spec) is None
