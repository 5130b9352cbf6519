"""autograder/notebooks/cells.py: reading a submission, finding its cells by metadata or by name, what a cell
defines and uses, and the released setup cells (test_repair.py has the by-name lookup on stripped notebooks)."""
import json

import pytest

from autograder.notebooks import cells as notebook
from autograder.notebooks.cells import (
    defined_names,
    extract,
    fingerprint,
    load_student_code,
    names_used,
    read_notebook,
    restore_setup_cells,
)


def test_a_notebook_reads_as_its_json(fixture_path):
    nb, error = read_notebook(fixture_path("release.ipynb"))
    assert error == "" and nb == json.loads(fixture_path("release.ipynb").read_text())


@pytest.mark.parametrize("name, says", [
    ("truncated.ipynb", "truncated.ipynb is not a readable notebook (JSONDecodeError: "),
    ("no_cells.ipynb", "no_cells.ipynb is not a Jupyter notebook (no list of cells)"),
])
def test_an_unreadable_notebook_says_why(fixture_path, name, says):
    nb, error = read_notebook(fixture_path(name))
    assert nb is None and error.startswith(says), error


def test_a_missing_or_oversized_notebook_says_why(tmp_path, fixture_path, monkeypatch):
    nb, error = read_notebook(tmp_path / "gone.ipynb")
    assert nb is None and error.startswith("gone.ipynb is not a readable notebook (FileNotFoundError"), error
    monkeypatch.setattr(notebook, "MAX_NOTEBOOK_BYTES", 1024 * 1024)
    big = tmp_path / "big.ipynb"
    big.write_bytes(fixture_path("release.ipynb").read_bytes().replace(b"# A tiny assignment", b"#" * 3 * 2**20))
    assert read_notebook(big) == (None, "big.ipynb is 3 MB; notebooks over 1 MB are not graded")


def test_an_unreadable_notebook_leaves_every_item_with_its_reason(fixture_path):
    code = load_student_code(fixture_path("truncated.ipynb"), ["square", "Scaler"])
    assert code.cells == [] and "not a readable notebook" in code.error
    assert code.problems == {"square": code.error, "Scaler": code.error}


def test_extract_takes_setup_and_graded_cells_by_grade_id_in_notebook_order(fixture_path):
    code = load_student_code(fixture_path("release.ipynb"), ["square", "Scaler"])
    assert [(c.grade_id, c.index) for c in code.cells] == [("setup_imports", 1), ("square", 2), ("Scaler", 4)]
    assert code.source_of("Scaler") == "class Scaler:\n    pass" and code.source_of("cube") is None
    assert code.problems == {} and code.notes == []
    only = load_student_code(fixture_path("release.ipynb"), ["Scaler"])  # test cells and other items are not taken
    assert [c.grade_id for c in only.cells] == ["setup_imports", "Scaler"]


def test_of_a_graded_cell_found_twice_the_later_is_graded_with_a_note(fixture_path):
    code = load_student_code(fixture_path("graded_cell_twice.ipynb"), ["square"])
    assert code.source_of("square") == "def square(x):\n    return x * x"
    assert code.notes == ["'square' appears in cells 1 and 3; the later one is graded, as a notebook run top to "
                          "bottom would define it"]


def test_a_graded_cell_that_is_not_code_is_a_problem_not_a_search_by_name(fixture_path):
    code = load_student_code(fixture_path("graded_cell_is_markdown.ipynb"), ["square"])
    assert code.problems == {"square": "the cell for 'square' is a markdown cell, not a code cell"}
    assert code.cells == []


def test_extract_skips_cells_that_are_not_objects():
    nb = {"cells": ["not a cell", {"cell_type": "code", "source": ["x = 1\n", "def f():\n    pass"],
                                   "metadata": {"nbgrader": {"grade_id": "f"}}}]}
    code = extract(nb, ["f"])
    assert [(c.grade_id, c.index, c.source) for c in code.cells] == [("f", 1, "x = 1\ndef f():\n    pass")]


def test_setup_cells_are_the_released_ones_whatever_the_submission_did(fixture_path):
    code = load_student_code(fixture_path("setup_cells_tampered.ipynb"), ["square"])
    restore_setup_cells(code, fixture_path("release.ipynb"))
    # the edited setup cell is the release's; a cell posing as setup is dropped, so its `square` is not graded
    assert [(c.grade_id, c.source) for c in code.cells] == [("setup_imports", "import math\nSEED = 0"),
                                                            ("square", "def square(x):\n    return x * x")]
    assert code.notes == ["setup cell 'setup_imports' was changed in the submission; the released version was used"]


def test_a_deleted_setup_cell_comes_back_first(fixture_path):
    code = load_student_code(fixture_path("graded_cell_is_markdown.ipynb"), [])
    restore_setup_cells(code, fixture_path("release.ipynb"))
    assert [c.grade_id for c in code.cells] == ["setup_imports"]
    assert code.notes == ["setup cell 'setup_imports' was missing from the submission; the released version was used"]


def test_without_a_readable_submission_or_release_nothing_is_restored(fixture_path, tmp_path):
    code = load_student_code(fixture_path("truncated.ipynb"), ["square"])
    restore_setup_cells(code, fixture_path("release.ipynb"))
    assert code.cells == [] and code.notes == []
    code = load_student_code(fixture_path("setup_cells_tampered.ipynb"), ["square"])
    restore_setup_cells(code, tmp_path / "no_release.ipynb")
    assert code.notes == [] and code.cells[0].source.endswith("# my own seed")


@pytest.mark.parametrize("source, names", [
    ("with open('f') as (a, b):\n    c = 1\n", {"a", "b", "c"}),
    ("for i, *rest in []:\n    pass\nelse:\n    e = 0\n", {"i", "rest", "e"}),
    ("try:\n    import numpy as np\nexcept ImportError:\n    np = None\nfinally:\n    done = True\n", {"np", "done"}),
    ("total += 1\nlimit: int = 3\nasync def go():\n    inner = 1\n", {"total", "limit", "go"}),
    ("from torch import *\nimport os.path\n", {"os"}),
    ("while False:\n    w = 1\n", {"w"}),
])
def test_defined_names_are_the_top_level_bindings(source, names):
    assert defined_names(source) == names


def test_magics_and_shell_lines_do_not_stop_a_cell_from_parsing():
    assert defined_names("%matplotlib inline\n!pip list\ndef f():\n    pass\n") == {"f"}


def test_fingerprint_ignores_comments_and_layout_only():
    plain = "def f(x):\n    return x * 2\n"
    assert fingerprint(plain) == fingerprint("# doubles\ndef f( x ):\n\n    return x*2  # twice\n")
    assert fingerprint(plain) != fingerprint("def f(x):\n    return x * 3\n")
    assert fingerprint("def broken(:") == "def broken(:"  # no tree: the text itself


def test_names_used_counts_code_not_comments_or_strings():
    used = names_used("import torch.nn.functional as F\n# F.scaled_dot_product_attention\n"
                      "y = F.softmax(x, -1)\nnote = 'mse_loss'\n")
    assert {"torch", "nn", "functional", "F", "softmax", "x", "y"} <= used
    assert "scaled_dot_product_attention" not in used and "mse_loss" not in used
    assert names_used("def broken(:") is None
