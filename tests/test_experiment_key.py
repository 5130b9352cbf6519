"""The experiment cache key and a saved result's identity: what a result depends on changes them, nothing else.

An experiment's key covers its harness, the reference solution, its course.yaml section, the code its run executes
(experiments.EXPERIMENT_CODE) and the library versions; a saved result's identity
(batch.identity.grader_identity) the grading code (experiments.GRADING_CODE, the suite, the harness). Code counts as it
runs: a comment or a docstring edited keeps both, and so does any edit to a report, an integration or the CLI.
"""
import shutil
from types import SimpleNamespace

import pytest

from autograder.course.config import ROOT, load_course
from autograder.grading.cache import PACKAGE, code_fingerprint, experiment_key
from autograder.grading.experiments import experiment_inputs, grading_code, harness_sources
from autograder.notebooks.cells import Cell

AID = "w8l1_attention_vision"
COURSE = load_course()
EXP = COURSE.assignment(AID).experiments["ae_mnist"]


def code(source="def f(x):\n    return x + 1\n"):
    return SimpleNamespace(cells=[Cell("setup_imports", "import torch\n", 0), Cell("AutoEncoder", source, 1)])


def test_the_key_covers_every_input_that_can_change_a_run():
    inputs = experiment_inputs(code(), AID, EXP, 0, "cpu", 1)
    assert set(inputs) == {"cells", "code", "solutions", "cfg", "seed", "device", "libraries", "data", "threads",
                           "watched"}
    assert set(inputs["code"]) == {"grader", "harness"} and set(inputs["libraries"]) == {"torch", "numpy", "python"}
    assert inputs["data"].startswith("mnist ")  # this harness trains on MNIST, whose source may differ
    assert isinstance(inputs["threads"], int) and inputs["threads"] >= 1
    assert experiment_inputs(code(), "w8l4_transformers", EXP, 0, "cpu", None)["data"] == ""


@pytest.mark.parametrize("field, other", [
    ("cells", [["AutoEncoder", "something else"]]), ("code", {"grader": "0" * 64}), ("solutions", "0" * 64),
    ("cfg", {**EXP.cfg, "steps": EXP.steps + 1}), ("seed", 1), ("device", "cuda"), ("libraries", {"torch": "0.0.0"}),
    ("data", "mnist test split /x"), ("threads", 999), ("watched", {"oracles": {}}),
])
def test_changing_any_input_changes_the_key(field, other):
    inputs = experiment_inputs(code(), AID, EXP, 0, "cpu", 3)
    assert experiment_key({**inputs, field: other}) != experiment_key(inputs)


def test_a_thresholds_min_reaches_the_key_and_its_max_does_not():
    """A `min` also stops training (harness/training.py pass_marks): a new one trains again. A `max` only judges the
    figures, which a cached run has judged again by the new bound: changing it retrains nothing."""
    from autograder.course.config import Bound
    base = experiment_key(experiment_inputs(code(), AID, EXP, 0, "cpu", 3))
    judged = EXP.model_copy(update={"threshold": {"test_mse": Bound(max=0.001)}})
    stops = COURSE.assignment("lab14_transformers").experiments["memory_task"]
    raised = stops.model_copy(update={"threshold": {"test_accuracy": Bound(min=0.999)}})
    assert EXP.threshold["test_mse"].max != 0.001 and experiment_key(experiment_inputs(code(), AID, judged, 0, "cpu",
                                                                                       3)) == base
    assert experiment_key(experiment_inputs(code(), "lab14_transformers", raised, 0, "cpu", 3)) != experiment_key(
        experiment_inputs(code(), "lab14_transformers", stops, 0, "cpu", 3))


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


def test_a_code_fingerprint_is_the_code_not_its_comments_or_docstrings():
    source = 'def f(x):\n    """Doc."""\n    return x + 1  # why\n'
    assert code_fingerprint(source) == code_fingerprint('def f(x):\n    """Other words."""\n\n    return x + 1\n')
    assert code_fingerprint(source) == code_fingerprint("def f(x):\n    return x + 1\n")
    assert code_fingerprint(source) != code_fingerprint("def f(x):\n    return x + 2\n")
    assert code_fingerprint(source) != code_fingerprint("def g(x):\n    return x + 1\n")


# --- what each depends on, with the package's files edited (a copy of it) ---------------------------------------

@pytest.fixture
def package(tmp_path):
    copy = tmp_path / "autograder"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def keys(package):
    """Every experiment's key (seed 0) and every assignment's grading code, computed from `package`'s files."""
    out = {}
    for aid, assignment in COURSE.assignments.items():
        for name, exp in assignment.experiments.items():
            out[f"{aid}/{name}"] = experiment_key(experiment_inputs(code(), aid, exp, 0, "cpu", 1, package=package))
        out[aid] = grading_code(aid, package)
    return out


def edit(path, old, new):
    text = path.read_text()
    assert old in text, f"{path}: '{old}' is not there to edit"
    path.write_text(text.replace(old, new, 1))


def test_the_copy_gives_the_same_keys(package):
    assert keys(package) == keys(PACKAGE)


def test_a_comment_or_docstring_edited_anywhere_keeps_every_key_and_identity(package):
    base = keys(package)
    edit(package / "reports" / "tables.py", '"""', '"""A docstring edited. ')
    (package / "reports" / "tables.py").write_text((package / "reports" / "tables.py").read_text() + "\n# a comment\n")
    edit(package / "harness" / "training.py", "import math\n", "import math  # a comment\n")
    edit(package / "grading" / "experiments.py", '"""', '"""Reworded. ')
    assert keys(package) == base


def test_report_integration_and_cli_code_reach_no_key_or_identity(package):
    base = keys(package)
    for name in ("reports/tables.py", "integrations/gradescope.py", "apps/demo.py", "apps/grade.py", "cli.py",
                 "batch/run.py"):
        (package / name).write_text((package / name).read_text() + "\nEDITED = 1\n")
    assert keys(package) == base


def test_editing_the_harness_changes_its_experiments_keys_and_its_identity(package):
    base = keys(package)
    edit(package / "harness" / "w8l1_red_square.py", "EVAL_EVERY = 100", "EVAL_EVERY = 50")
    after = keys(package)
    changed = {k for k in base if after[k] != base[k]}
    assert changed == {f"{AID}/{n}" for n in COURSE.assignment(AID).experiments} | {AID}, changed
    edit(package / "harness" / "training.py", "every=1, first=1", "every=2, first=1")  # shared by every harness
    assert all(keys(package)[k] != after[k] for k in base)


def test_grading_code_changes_the_identity_and_only_training_code_the_experiment_keys(package):
    base = keys(package)
    edit(package / "grading" / "scoring.py", "\nimport ", "\nEDITED = 1\nimport ")
    after = keys(package)
    assert all(after[aid] != base[aid] for aid in COURSE.assignments)  # every saved result is graded again
    assert all(after[k] == base[k] for k in base if "/" in k)            # no experiment trains again
    edit(package / "sandbox" / "child" / "server.py", "\nimport ", "\nEDITED = 1\nimport ")
    assert all(keys(package)[k] != after[k] for k in base)


def test_the_sandbox_is_sent_the_harness_it_imports():
    """The harness's own module last, after the harness modules it imports (the shared loop and its optimizer first)."""
    assert list(harness_sources(AID)) == ["adam", "training", "w8l1_red_square", AID]
    assert list(harness_sources("lab14_transformers")) == ["adam", "training", "lab14_transformers"]
    assert harness_sources(AID)[AID] == (ROOT / "autograder" / "harness" / f"{AID}.py").read_text()


def test_a_reused_run_is_found_by_its_own_key_and_never_with_a_reference_standing_in():
    """dae_mnist looks for ae_mnist's trained AE under ae_mnist's key with the same cells (grading/shared_runs.py):
    a regrade with the reference AutoEncoder bound after the student's cells has another key, so it trains its
    own plain AE instead of reusing the student's."""
    from autograder.grading.dependencies import standin_cell
    from autograder.grading.experiments import _sharing
    dae = COURSE.assignment(AID).experiments["dae_mnist"]
    sandbox = SimpleNamespace(threads=1, tripwire=None)
    own = code()
    ae_key = experiment_key(experiment_inputs(own, AID, EXP, 0, "cpu", 1))
    assert _sharing(COURSE, AID, EXP, own, 0, "cpu", sandbox, ae_key) == (ae_key, None)  # kept under its key
    assert _sharing(COURSE, AID, dae, own, 0, "cpu", sandbox, "dae's key") == (None, ae_key)
    swapped = SimpleNamespace(cells=[*own.cells, standin_cell(AID, {"AutoEncoder"}, len(own.cells))])
    assert _sharing(COURSE, AID, dae, swapped, 0, "cpu", sandbox, "key")[1] != ae_key
    assert _sharing(COURSE, AID, dae, own, 1, "cpu", sandbox, "key")[1] != ae_key  # nor another seed's
