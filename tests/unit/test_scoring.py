"""autograder/grading/scoring.py: check seeds, how a (item, kind) folds its tests into one score, the item rules'
reasons, the from-scratch scan, the tripwire table and results.json's shape."""
from types import SimpleNamespace

import pytest
import torch

from autograder.course.config import parse_course
from autograder.errors import ConfigError
from autograder.grading.scoring import Outcome, results_json, scratch_violation, seed_for, tripwire_table, zero_reason

COURSE = """
course: tiny
data: {mnist_dir: .}
seed: 1
oracles:
  softmax: [torch.softmax, torch.nn.functional.softmax]
  mse_loss: [torch.nn.functional.mse_loss]
  unused: [torch.exp]
assignments:
  a1:
    title: t
    lecture: l
    notebook: a1.ipynb
    items:
      attend: {signature: "(x)", from_scratch: [softmax], points: {exists: 1, values: 2}}
      fit: {signature: "(x)", from_scratch: [mse_loss, softmax], points: {exists: 1}}
      plain: {signature: "(x)", points: {exists: 1}}
    experiments:
      trains: {item: attend, points: 2, description: d, metric: acc, threshold: {acc: {min: 0.5}}, steps: 1, seeds: [0]}
      other: {item: plain, points: 1, description: d, metric: acc, threshold: {acc: {min: 0.5}}, steps: 1, seeds: [0]}
"""


def test_a_checks_seed_is_fixed_per_course_seed_item_and_kind():
    seed = seed_for(8128, "lab14", "attention", "values")
    assert seed == seed_for(8128, "lab14", "attention", "values") and 0 <= seed < 2**32
    others = {seed_for(8129, "lab14", "attention", "values"), seed_for(8128, "lab14", "attention", "shapes"),
              seed_for(8128, "lab14", "attend", "values"), seed_for(8128, "w8l4", "attention", "values")}
    assert seed not in others and len(others) == 4


def test_an_outcome_scores_its_points_only_when_every_test_passes():
    outcome = Outcome("attend", "values", 2)
    outcome.add(True, "ok", 0.5)
    assert (outcome.score, outcome.output) == (2.0, "ok")
    outcome.add(False, "max |attend - the reference| = 0.1", 0.25, case="batch 2")
    outcome.add(False, "a later failure", 0.25, case="batch 3")
    outcome.add(True, "ok", 1.0)  # a later pass gives nothing back
    assert (outcome.score, outcome.output, outcome.seconds) == (0.0, "max |attend - the reference| = 0.1", 2.0)
    assert outcome.extra == {"case": "batch 2"}


def test_an_outcome_is_one_test_of_results_json():
    failed = Outcome("attend", "values", 2)
    failed.add(False, "wrong", 0.12345, case="batch 2")
    assert failed.as_test() == {"item": "attend", "name": "attend: values", "score": 0.0, "max_score": 2.0,
                                "status": "failed", "output": "wrong", "visibility": "visible", "seconds": 0.123,
                                "extra_data": {"case": "batch 2"}}
    passed = Outcome("attend", "exists", 1)
    passed.add(True, "ok", 0.0)
    assert passed.as_test()["status"] == "passed" and "extra_data" not in passed.as_test()
    assert Outcome("attend", "shapes", 1).as_test()["status"] == "failed"  # no test ran: no points


def test_the_scratch_scan_finds_an_oracle_named_in_code_only():
    spec = SimpleNamespace(from_scratch=["softmax", "mse_loss"])
    assert scratch_violation(spec, "import torch\ny = torch.softmax(x, -1)") == "softmax"
    assert scratch_violation(spec, "from torch.nn.functional import mse_loss as L") == "mse_loss"
    assert scratch_violation(spec, "# not torch.softmax\ny = 'softmax'\ndef f(x):\n    return x") == ""
    assert scratch_violation(spec, None) == ""  # no cell
    assert scratch_violation(SimpleNamespace(from_scratch=[]), "torch.softmax(x, -1)") == ""


def test_the_tripwire_table_covers_the_from_scratch_items_only():
    course = parse_course(COURSE, "course.yaml")
    assert tripwire_table(course, course.assignment("a1")) == {
        "oracles": {"mse_loss": ["torch.nn.functional.mse_loss"],
                    "softmax": ["torch.softmax", "torch.nn.functional.softmax"]},
        "scratch": {"attend": ["softmax"], "fit": ["mse_loss", "softmax"]},
        "experiments": {"trains": "attend"}}


def test_an_oracle_named_as_the_students_own_function_counts_only_as_the_library_one():
    """NormMLP, from scratch against layer_norm, calls the student's own `layer_norm` item: never blamed for that;
    F.layer_norm, or importing it, is the oracle."""
    spec, own = SimpleNamespace(from_scratch=["layer_norm"]), ["layer_norm", "NormMLP"]
    mine = "class NormMLP:\n    def forward(self, x):\n        return layer_norm(x, self.w, self.b)\n"
    assert scratch_violation(spec, mine, own) == ""
    assert scratch_violation(spec, mine.replace("layer_norm(", "F.layer_norm("), own) == "layer_norm"
    assert scratch_violation(spec, "from torch.nn.functional import layer_norm\n" + mine, own) == "layer_norm"
    assert scratch_violation(spec, mine) == "layer_norm"  # no such item of its own: the bare name is the oracle


def test_an_assignments_own_oracles_extend_the_shared_table():
    own = "    oracles:\n      layer_norm: [torch.nn.functional.layer_norm]\n"
    text = COURSE.replace("    experiments:\n      trains:", own + "    experiments:\n      trains:")
    text = text.replace("plain: {signature: \"(x)\",", "plain: {signature: \"(x)\", from_scratch: [layer_norm],")
    course = parse_course(text, "course.yaml")
    table = tripwire_table(course, course.assignment("a1"))
    assert table["oracles"]["layer_norm"] == ["torch.nn.functional.layer_norm"] and table["scratch"]["plain"]
    assert course.oracles_for("a1")["softmax"] == ["torch.softmax", "torch.nn.functional.softmax"]
    assert "oracles" not in parse_course(COURSE, "course.yaml").assignment("a1").model_dump()  # no identity change
    with pytest.raises(ConfigError, match="from_scratch names layer_norm, which neither the assignment's"):
        parse_course(text.replace("      layer_norm: [torch.nn.functional.layer_norm]\n", "      other: [torch.exp]\n"),
                     "course.yaml")


def test_an_oracle_used_zeroes_the_item_before_a_stub_does():
    used = zero_reason("attend", "softmax", True)
    assert used.startswith("'attend' uses softmax; this item is written from scratch") and "whole item scores 0" in used
    assert zero_reason("attend", "", True) == "'attend' is not implemented yet (it raises NotImplementedError)"
    assert zero_reason("attend", "", False) == ""


def test_results_json_adds_up_the_tests_and_records_the_grading(tmp_path):
    a, b = Outcome("attend", "exists", 1), Outcome("attend", "values", 2)
    a.add(True, "ok", 0.1)
    b.add(False, "wrong", 0.2)
    result = results_json([a, b], aid="a1", notebook=tmp_path / "alice" / "a1.ipynb", device="cpu", seed=8128,
                          output="a note", isolation=None, restarts=2, seconds=3.14159, notes=["a note"])
    assert (result["score"], result["max_score"], result["output"], result["visibility"]) == \
        (1.0, 3.0, "a note", "visible")
    assert result["tests"] == [a.as_test(), b.as_test()]
    extra = result["extra_data"]
    keys = ("assignment", "notebook", "device", "seed", "isolation", "restarts", "seconds", "notes")
    assert {k: extra[k] for k in keys} == {"assignment": "a1", "notebook": "a1.ipynb", "device": "cpu", "seed": 8128,
                                           "isolation": "none", "restarts": 2, "seconds": 3.14, "notes": ["a note"]}
    assert extra["versions"]["torch"] == torch.__version__ and extra["versions"]["autograder"]


@pytest.mark.parametrize("scores, total", [((0.5, 0.25), 0.75), ((1 / 3, 1 / 3), 0.6667)])
def test_the_total_is_rounded_to_four_places(scores, total):
    outcomes = []
    for k, score in enumerate(scores):
        o = Outcome("x", f"kind{k}", 1)
        o.score = score  # a partial score, as an experiment's outcome may carry
        outcomes.append(o)
    result = results_json(outcomes, aid="a1", notebook="a1.ipynb", device="cpu", seed=0, output="", isolation="uid",
                          restarts=0, seconds=0, notes=[])
    assert result["score"] == total and result["extra_data"]["isolation"] == "uid"


def test_a_stub_raised_in_another_items_cell_is_that_items():
    """The sandbox's description names the cell whose frame raised: another item's stub is never this item's."""
    items = {"attention": None, "MultiHeadAttention": None}
    theirs = Outcome("MultiHeadAttention", "values", 2)
    said = theirs.raised("MultiHeadAttention", "NotImplementedError:  (cell attention, line 3)", items)
    assert not theirs.not_implemented and theirs.not_implemented_in == "attention"
    assert "the error is in 'attention', which 'MultiHeadAttention' calls" in said
    own = Outcome("MultiHeadAttention", "values", 2)
    assert own.raised("MultiHeadAttention", "NotImplementedError:  (cell MultiHeadAttention, line 9)", items) == ""
    assert own.not_implemented and not own.not_implemented_in
    other = Outcome("MultiHeadAttention", "values", 2)  # another error in another item: named, not a stub
    assert "'attention'" in other.raised("MultiHeadAttention", "ValueError: no (cell attention, line 3)", items)
    assert not other.not_implemented and not other.not_implemented_in
    assert zero_reason("MultiHeadAttention", "", False, "attention") == (
        "'MultiHeadAttention' calls 'attention', which is not implemented yet, so 'MultiHeadAttention' could not be "
        "checked (the whole item scores 0)")


def test_a_device_mix_met_in_another_items_cell_points_back_at_the_caller():
    """The op that meets two devices is often not where the stray tensor was made (a mask made on the CPU by the
    caller reaches `attention`), so the reason does not send the student to the callee alone."""
    items = {"attention": None, "Transformer": None}
    outcome = Outcome("Transformer", "shapes", 1)
    said = outcome.raised("Transformer", "RuntimeError: Tensor on device meta is not on the expected device cpu! "
                                         "(cell attention, line 9)", items)
    assert said == ("; 'attention' was handed a tensor on another device: look where 'Transformer' and what it calls "
                    "make tensors")
    assert "see that item" not in said and not outcome.not_implemented_in
