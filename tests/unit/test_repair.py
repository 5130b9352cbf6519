"""autograder/notebooks/repair.py and the by-name lookup of autograder/notebooks/cells.py on small in-memory
notebooks (no sandbox)."""
import copy
from types import SimpleNamespace

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from autograder.grading.scoring import scratch_violation
from autograder.notebooks.cells import defined_names, extract, restore_setup_cells
from autograder.notebooks.repair import repair

SQUARE = "def square(x):\n    return x * x\n"
SCALER = "class Scaler:\n    def __init__(self, k):\n        self.k = k\n"


def meta(gid, kind, points=None):
    m = {"grade_id": gid, "schema_version": 3, "task": False, "cell_type": "markdown" if kind == "answer" else "code",
         "locked": kind in ("setup", "test"), "solution": kind in ("item", "answer"),
         "grade": kind in ("test", "answer")}
    if points is not None:
        m["points"] = points
    return {"nbgrader": m}


def release():
    return new_notebook(cells=[
        new_markdown_cell("# A tiny assignment"),
        new_code_cell("import math\nSEED = 0", metadata=meta("setup_imports", "setup")),
        new_markdown_cell("### Task 1: square"),
        new_code_cell("def square(x):\n    raise NotImplementedError()", metadata=meta("square", "item")),
        new_code_cell("assert square(3) == 9", metadata=meta("test_square", "test", 3.0)),
        new_markdown_cell("**Your answer.** Why square?"),
        new_markdown_cell("YOUR ANSWER HERE", metadata=meta("answer_why", "answer", 0)),
        new_code_cell("class Scaler:\n    pass", metadata=meta("Scaler", "item")),
        new_code_cell("assert Scaler(2).k == 2", metadata=meta("test_Scaler", "test", 2.0)),
    ])


def solved():
    nb = release()
    nb.cells[3].source, nb.cells[6].source, nb.cells[7].source = SQUARE, "Because.", SCALER
    return nb


def ids(nb):
    return [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]


def test_an_untouched_notebook_is_left_as_it_is():
    nb = solved()
    fixed, notes = repair(nb, release())
    assert notes == [] and fixed == nb


def test_a_deleted_test_cell_comes_back_below_its_item_with_a_note():
    nb = solved()
    del nb.cells[4]
    fixed, notes = repair(nb, release())
    assert ids(fixed) == ids(release())
    assert fixed.cells[4].source == release().cells[4].source and fixed.cells[3].source == SQUARE
    assert notes == ["your notebook had no test cell for 'square'; the released one was used"]


def test_a_duplicated_test_cell_is_kept_once():
    nb = solved()
    nb.cells.insert(5, copy.deepcopy(nb.cells[4]))
    fixed, notes = repair(nb, release())
    assert ids(fixed) == ids(release())
    assert notes == ["test cell 'test_square' appeared 2 times (cells 4, 5); one copy was kept"]


def test_of_a_duplicated_graded_cell_the_last_is_graded_and_the_earlier_stays_as_plain_code():
    nb = solved()
    nb.cells.insert(4, new_code_cell("def square(x):\n    return x ** 2", metadata=copy.deepcopy(nb.cells[3].metadata)))
    fixed, notes = repair(nb, release())
    assert "nbgrader" not in fixed.cells[3].metadata and fixed.cells[3].source == SQUARE
    assert ids(fixed)[4] == "square" and fixed.cells[4].source.endswith("x ** 2")
    assert notes == ["'square' appeared in cells 3, 4; the last one was graded, as a notebook run top to bottom "
                     "would define it"]


def test_stripped_metadata_comes_back_from_the_cells_definitions_sources_and_prompts():
    nb = solved()
    for cell in nb.cells:
        cell.metadata = {}
    nb.cells.insert(8, new_code_cell("print(square(2))  # uses it, defines nothing"))
    nb.cells.append(new_code_cell("def square(x):\n    return x * x * 1"))  # redefined later: this one runs last
    fixed, notes = repair(nb, release())
    assert [i for i in ids(fixed) if i] == [i for i in ids(release()) if i and i != "square"] + ["square"]
    graded = {c.metadata["nbgrader"]["grade_id"]: c for c in fixed.cells if "nbgrader" in c.metadata}
    assert graded["square"].source.endswith("x * x * 1") and graded["Scaler"].source == SCALER
    assert graded["answer_why"].source == "Because."  # the student's answer, found below its prompt
    assert graded["test_square"].metadata["nbgrader"] == release().cells[4].metadata["nbgrader"]
    assert notes[0].startswith("no cell carried the nbgrader metadata of 'square'") and "cell 10" in notes[0]
    assert notes[1].startswith("no cell carried the nbgrader metadata of 'Scaler'") and "cell 7" in notes[1]
    assert notes[2].startswith("4 cells had lost their nbgrader metadata (1 setup, 2 test, 1 answer)")
    assert len(notes) == 3


def test_edited_points_and_an_edited_test_cell_are_the_released_ones_again():
    nb = solved()
    nb.cells[4].metadata["nbgrader"]["points"] = 40
    nb.cells[8].source = "assert True  # all points, please"
    fixed, notes = repair(nb, release())
    assert fixed.cells[4].metadata["nbgrader"]["points"] == 3.0 and fixed.cells[8].source == release().cells[8].source
    assert notes == ["cell 'test_square' had its points changed to 40; the released 3 were used",
                     "test cell 'test_Scaler' was edited; the released one was used"]


def test_a_cell_defines_its_top_level_names_only():
    source = ("import torch.nn as nn\nfrom math import pi, tau as t\nclass A:\n    inner = 1\ndef f():\n    local = 2\n"
              "x, (y, *z) = 1, (2, 3)\nif True:\n    k = 1\nobj.attr = 3\n%matplotlib inline\n")
    assert defined_names(source) == {"nn", "pi", "t", "A", "f", "x", "y", "z", "k"}
    assert defined_names("def broken(:") == set()



def test_course_grade_finds_an_item_by_the_name_it_defines_in_the_last_cell_that_defines_it():
    nb = solved()
    for cell in nb.cells:
        cell.metadata = {}
    nb.cells.append(new_code_cell("def square(x):\n    return x * x * 1"))
    code = extract(nb, ["square", "Scaler", "cube"])
    assert code.source_of("square").endswith("x * x * 1") and code.source_of("Scaler") == SCALER
    assert [c.index for c in code.cells] == [7, 9]  # notebook order, as the sandbox runs them
    assert code.notes == ["no cell carried the nbgrader metadata of 'square'; cell 9, the last "
                          "that defines 'square', was graded",
                          "no cell carried the nbgrader metadata of 'Scaler'; cell 7, the last "
                          "that defines 'Scaler', was graded"]
    assert "no cell defines 'cube'" in code.problems["cube"] and set(code.problems) == {"cube"}


def test_a_cell_with_its_grade_id_wins_over_a_later_definition_and_setup_cells_never_count():
    nb = solved()
    nb.cells.append(new_code_cell("def square(x):\n    return 0"))
    assert extract(nb, ["square"]).source_of("square") == SQUARE and extract(nb, ["square"]).notes == []
    nb = solved()
    nb.cells[3].metadata = {}
    nb.cells[1].source += "\ndef square(x):\n    return -1"  # a setup cell is the release's, never the student's
    assert extract(nb, ["square"]).source_of("square") == SQUARE


def test_by_name_the_setup_cells_are_still_restored_and_the_from_scratch_scan_still_applies(tmp_path):
    released = tmp_path / "release.ipynb"
    nbformat.write(release(), released)
    nb = solved()
    for cell in nb.cells:
        cell.metadata = {}
    nb.cells[3].source = "def square(x):\n    return torch.softmax(x, 0)"
    code = extract(nb, ["square", "Scaler"])
    restore_setup_cells(code, released)
    assert [c.grade_id for c in code.cells] == ["setup_imports", "square", "Scaler"]
    assert code.cells[0].source == release().cells[1].source
    assert scratch_violation(SimpleNamespace(from_scratch=("softmax",)), code.source_of("square")) == "softmax"


def test_the_feedback_page_shows_each_repair_on_a_line_of_its_own():
    from autograder.reports.feedback import summary_html
    result = {"output": "one; two; setup cell 'setup_x' was changed", "tests": [],
              "extra_data": {"assignment": "lab14_transformers", "repairs": ["one", "two"]}}
    assert "<p class='lost student-text'>one\ntwo\nsetup cell &#39;setup_x&#39; was changed</p>" in summary_html(result)


def autograde_in(root, *names, content=None, aid="a1", released="lab"):
    """nbgrader's converter as `nbgrader autograde` makes it, for bob's submission of `names` to `aid` (notebook
    `released`)."""
    from nbgrader.coursedir import CourseDirectory

    from autograder.integrations.nbgrader_plugin import CourseAutograde
    folder = root / "submitted" / "bob" / aid
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_text(content if content is not None else nbformat.writes(solved()))
    converter = CourseAutograde(coursedir=CourseDirectory(root=str(root), submitted_directory="submitted"))
    converter.notebooks, converter.file_notes = sorted(str(folder / n) for n in names), {}
    converter.released_names = lambda aid: [released]  # what the gradebook says (the nbgrader test reads a real one)
    return converter, folder


def test_a_lone_notebook_of_another_name_is_graded_under_the_released_name_and_says_so(tmp_path):
    converter, folder = autograde_in(tmp_path, "lab (1).ipynb")
    assert converter.take_notebooks("a1", "bob") == [str(folder / "lab.ipynb")]
    assert (folder / "lab (1).ipynb").read_text() == (folder / "lab.ipynb").read_text()  # a copy: the original stays
    assert converter.file_notes == {
        "lab": ["the notebook was submitted as 'lab (1).ipynb'; it was graded as lab.ipynb"]}


def test_two_notebooks_of_other_names_or_a_broken_file_stop_the_student_with_the_cause(tmp_path):
    from nbgrader.converters.base import NbGraderException
    converter, folder = autograde_in(tmp_path / "two", "draft.ipynb", "final.ipynb")
    with pytest.raises(NbGraderException,
                       match=r"student 'bob': not graded: 2 notebooks .*\(draft.ipynb, final.ipynb\) "
                             r"and none named lab.ipynb"):
        converter.take_notebooks("a1", "bob")
    converter, folder = autograde_in(tmp_path / "broken", "lab.ipynb", content="{not json")
    with pytest.raises(NbGraderException, match=r"student 'bob': not graded: lab.ipynb is not a readable notebook"):
        converter.take_notebooks("a1", "bob")


def test_another_assignments_notebook_in_this_ones_folder_stops_the_student_and_is_not_repaired(tmp_path):
    """bob put lab14's notebook in w8l4's folder, under lab14's name or w8l4's: never graded (nor repaired) as
    w8l4; his own w8l4 notebook, under any name, is."""
    from nbgrader.converters.base import NbGraderException

    from autograder.notebooks.examples import release_notebook
    w8l4, lab14 = "w8l4_transformers", "lab14_transformers"
    for name in (f"{lab14}.ipynb", f"{w8l4}.ipynb"):
        converter, folder = autograde_in(tmp_path / name, name, content=nbformat.writes(release_notebook(lab14)),
                                         aid=w8l4, released=w8l4)
        with pytest.raises(NbGraderException, match=rf"student 'bob': not graded as {w8l4}: {w8l4}.ipynb is a "
                                                    rf"notebook whose cells are {lab14}'s"):
            converter.take_notebooks(w8l4, "bob")
    converter, folder = autograde_in(tmp_path / "own", "mine.ipynb", content=nbformat.writes(release_notebook(w8l4)),
                                     aid=w8l4, released=w8l4)
    assert converter.take_notebooks(w8l4, "bob") == [str(folder / f"{w8l4}.ipynb")]


def test_a_file_that_is_not_a_notebook_says_to_submit_the_ipynb(tmp_path):
    from autograder.notebooks.cells import read_notebook
    py = tmp_path / "lab14_transformers.py"
    py.write_text("def attention(Q, K, V):\n    return V\n")
    nb, error = read_notebook(py)
    assert nb is None and "lab14_transformers.py is not a notebook: submit the .ipynb" in error, error
    cut = tmp_path / "lab14_transformers.ipynb"
    cut.write_text('{"cells": [')
    assert "is not a readable notebook (JSONDecodeError" in read_notebook(cut)[1]
