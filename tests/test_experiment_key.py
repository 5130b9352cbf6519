"""The experiment cache key: everything that can change a training result changes it; layout does not."""
import shutil
from types import SimpleNamespace

import pytest

from autograder.course.config import ROOT, load_course
from autograder.grading.cache import experiment_key, grader_digest
from autograder.grading.experiments import experiment_inputs
from autograder.notebooks.cells import Cell

AID = "w8l1_attention_vision"
EXP = load_course().assignment(AID).experiments["ae_mnist"]


def code(source="def f(x):\n    return x + 1\n"):
    return SimpleNamespace(cells=[Cell("setup_imports", "import torch\n", 0), Cell("AutoEncoder", source, 1)])


def test_the_key_covers_every_input_that_can_change_a_run():
    inputs = experiment_inputs(code(), AID, EXP, 0, "cpu", None)
    assert set(inputs) == {"cells", "grader", "solutions", "cfg", "seed", "device", "torch", "data", "threads",
                           "watched"}
    assert inputs["data"].startswith("mnist ")  # this harness trains on MNIST, whose source may differ
    assert isinstance(inputs["threads"], int) and inputs["threads"] >= 1
    assert experiment_inputs(code(), "w8l4_transformers", EXP, 0, "cpu", None)["data"] == ""


@pytest.mark.parametrize("field, other", [
    ("cells", [["AutoEncoder", "something else"]]), ("grader", "0" * 64), ("solutions", "def g(): pass"),
    ("cfg", {**EXP.cfg, "steps": EXP.steps + 1}), ("seed", 1), ("device", "cuda"), ("torch", "0.0.0"),
    ("data", "mnist test split /x"), ("threads", 999), ("watched", {"oracles": {}}),
])
def test_changing_any_input_changes_the_key(field, other):
    inputs = experiment_inputs(code(), AID, EXP, 0, "cpu", 3)
    assert experiment_key({**inputs, field: other}) != experiment_key(inputs)


def test_the_sandbox_threads_and_the_code_reach_the_key():
    base = experiment_key(experiment_inputs(code(), AID, EXP, 0, "cpu", 3))
    assert experiment_key(experiment_inputs(code(), AID, EXP, 0, "cpu", 4)) != base
    assert experiment_key(experiment_inputs(code("def f(x):\n    return x + 2\n"), AID, EXP, 0, "cpu", 3)) != base
    # comments and layout do not change what runs
    same = "def f(x):\n    # one more\n    return x + 1\n\n"
    assert experiment_key(experiment_inputs(code(same), AID, EXP, 0, "cpu", 3)) == base


def test_the_watched_oracles_reach_the_key():
    """A course.yaml that watches one more path for the item may make a cached training run a violation."""
    base = experiment_key(experiment_inputs(code(), AID, EXP, 0, "cpu", 3, {"oracles": {"mse_loss": ["a.b"]}}))
    more = {"oracles": {"mse_loss": ["a.b", "a.c"]}}
    assert experiment_key(experiment_inputs(code(), AID, EXP, 0, "cpu", 3, more)) != base


def test_editing_any_grader_file_changes_its_digest(tmp_path):
    copy = tmp_path / "autograder"
    shutil.copytree(ROOT / "autograder", copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert grader_digest(copy) == grader_digest()
    for name in ("pytest_plugin.py", "sandbox_child.py", "harness/w8l1_attention_vision.py"):
        path = copy / name
        before = path.read_text()
        path.write_text(before + "\n# edited\n")
        assert grader_digest(copy) != grader_digest(), name
        path.write_text(before)
