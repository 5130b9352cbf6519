"""The harness's training flushes subnormal floats to zero while it trains, and only then (harness/training.py)."""
import pytest
import torch
import torch.nn as nn

from autograder.harness.training import denormals_flushed, train_until

SUBNORMAL = 1e-39  # below float32's smallest normal number, 1.18e-38


def survives():
    """Whether a subnormal float32 survives a multiplication by one on this thread."""
    return (torch.tensor([SUBNORMAL]) * 1.0).item() != 0.0


@pytest.fixture(autouse=True)
def _cpu_can_flush():
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero switch")
    torch.set_flush_denormal(False)


def test_train_until_flushes_subnormals_in_every_step_and_restores_ieee_arithmetic_after():
    seen = []
    model = nn.Linear(2, 1)

    def batch_loss(step):
        seen.append(survives())
        return model(torch.ones(1, 2)).pow(2).sum()

    assert survives(), "a subnormal is flushed before any training"
    train_until(model, batch_loss, steps=3, lr=1e-3)
    assert seen == [False, False, False], f"a subnormal survived inside the training steps: {seen}"
    assert survives(), "the flush outlived the training"


def test_the_flush_is_undone_when_a_training_step_raises():
    def batch_loss(step):
        raise ValueError("the student's forward failed")

    with pytest.raises(ValueError, match="forward failed"):
        train_until(nn.Linear(2, 1), batch_loss, steps=3, lr=1e-3)
    assert survives(), "a failed training left subnormals flushed"


def test_a_thread_already_running_keeps_ieee_arithmetic_while_another_trains():
    """The switch is the calling thread's: the grader's checks, in their thread, are not flushed by a reference
    training in another."""
    import threading
    go, other = threading.Event(), []

    def check():
        go.wait(10)
        other.append(survives())
    thread = threading.Thread(target=check)
    thread.start()
    with denormals_flushed():
        inside = survives()
        go.set()
        thread.join()
    assert not inside, "the flush is not on inside denormals_flushed"
    assert other == [True], "a thread that was already running had its subnormals flushed"
