"""What `course new` writes holds what the meta-tests and NOTEBOOKS.md ask, and is ruff-clean whatever the names: a
place for a shapes-only mistake and a NOT_ISOLATED reason per item, a TRAINING place per experiment, validation every
VAL_EVERY steps, test cells ending with the hidden-tests region, a closing self_check() cell."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.apps.new import HIDDEN_TESTS, notebook
from autograder.apps.new_files import TODO, Found, harness, planted, suite
from autograder.course.config import ROOT

LONG_ITEM = "NormalizedMultiLayerPerceptronClassifierForMnistDigits"
LONG_RUN = "mnist_normalized_multi_layer_perceptron_classifier_experiment"
ITEMS = [Found("layer_norm_written_from_scratch_over_the_last_dimension", "(x, weight, bias, eps=1e-05)"),
         Found(LONG_ITEM, "(hidden=64)", {"forward": "(x)"})]


def ruff():
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed here")
    return found


def test_the_written_files_are_ruff_clean_whatever_the_names(tmp_path):
    files = {"suites/test_w9l2_long.py": suite("w9l2_long", ITEMS, {ITEMS[0].name: ["torch.nn.functional.layer_norm"]}),
             "harness/w9l2_long.py": harness("w9l2_long", {LONG_RUN: LONG_ITEM}),
             "planted/w9l2_long.py": planted("w9l2_long", ITEMS, {LONG_RUN: LONG_ITEM})}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    proc = subprocess.run([ruff(), "check", "--config", str(ROOT / "pyproject.toml"), "--no-cache", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_planted_file_and_harness_leave_room_for_what_the_meta_tests_ask():
    text = planted("w9l2_long", ITEMS, {LONG_RUN: LONG_ITEM})
    scope: dict = {}
    exec(compile(text.replace("from tests.planted import attach_catches", "attach_catches = lambda p, c: None"),
                 "planted", "exec"), scope)
    assert set(scope["NOT_ISOLATED"]) == {(item.name, "shapes") for item in ITEMS}
    assert all(len(reason) > 40 for reason in scope["NOT_ISOLATED"].values())  # a reason, not a placeholder word
    assert scope["TRAINING"] == {} and f'"fails": ["{LONG_RUN}"]' in text and TODO in text.split("TRAINING")[-1]
    assert "only its shapes" in text.replace("\n", " ").replace("#", "").replace("  ", " ")
    assert "every=VAL_EVERY" in harness("w9l2_long", {LONG_RUN: LONG_ITEM})


def test_the_notebook_ends_each_test_cell_with_the_hidden_region_and_closes_with_self_check():
    nb = notebook("w9l2_long", ITEMS, "import torch")
    tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith("test_")]
    assert len(tests) == len(ITEMS) and all(c.source.endswith(HIDDEN_TESTS) for c in tests)
    assert nb.cells[-1].source == "self_check()" and "nbgrader" not in nb.cells[-1].metadata
    assert nb.cells[-2].source.startswith("## Self-check")
    setup = next(c.source for c in nb.cells if c.source.startswith("## 0. Setup"))
    assert not any(word in setup for word in ("two", "three")), setup  # sync may add a facts cell: count none
