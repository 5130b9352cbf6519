"""The nbgrader preprocessors of autograder/integrations/nbgrader_plugin.py on small notebooks, without a kernel or a
gradebook: the repair before sanitising, the grader's scores in the test cells (as nbgrader reads them), the
feedback summary.
CourseAutograde's choice of notebook is tested in test_repair.py."""
import shutil

import nbformat
import pytest
from nbgrader.converters.base import NbGraderException
from nbgrader.utils import determine_grade

import autograder.grading.grade
from autograder.integrations.nbgrader_plugin import FeedbackSummary, RepairSubmission, TrustedGrade


def resources(**extra):
    return {"nbgrader": {"assignment": "a1", "notebook": "lab", "student": "bob"}, **extra}


@pytest.fixture
def course(tmp_path, fixture_path, monkeypatch):
    """A course root whose release of a1 is the fixture_path release.ipynb, as lab.ipynb."""
    (tmp_path / "course.yaml").write_text("course: tiny\n")
    (tmp_path / "release" / "a1").mkdir(parents=True)
    shutil.copy(fixture_path("release.ipynb"), tmp_path / "release" / "a1" / "lab.ipynb")
    monkeypatch.setenv("COURSE_ROOT", str(tmp_path))
    return tmp_path


def grade_ids(nb):
    return [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]


def test_the_repair_puts_back_a_deleted_test_cell_and_says_so(course, fixture_path, caplog):
    nb = nbformat.read(fixture_path("test_cell_deleted.ipynb"), as_version=4)
    nb.metadata["course_repairs"] = ["a note the student wrote in the metadata"]
    fixed, _ = RepairSubmission().preprocess(nb, resources(course_notes=["it was submitted as 'lab (1).ipynb'"]))
    assert grade_ids(fixed) == grade_ids(nbformat.read(course / "release" / "a1" / "lab.ipynb", as_version=4))
    notes = ["it was submitted as 'lab (1).ipynb'",
             "your notebook had no test cell for 'square'; the released one was used"]
    assert fixed.metadata["course_repairs"] == notes  # the student's own "notes" are gone
    assert [r.getMessage() for r in caplog.records if "bob" in r.getMessage()] == [f"student 'bob': {n}" for n in notes]


def test_an_intact_submission_gets_no_repair_notes(course, fixture_path):
    nb = nbformat.read(fixture_path("release.ipynb"), as_version=4)
    fixed, _ = RepairSubmission().preprocess(nb, resources())
    assert fixed.metadata["course_repairs"] == [] and fixed.cells == nb.cells


def test_without_the_release_the_repair_stops_the_student(course, fixture_path):
    (course / "release" / "a1" / "lab.ipynb").unlink()
    with pytest.raises(NbGraderException, match="release/a1/lab.ipynb is missing: run `course release a1` first"):
        RepairSubmission().preprocess(nbformat.read(fixture_path("release.ipynb"), as_version=4), resources())


RESULT = {"score": 3.0, "max_score": 5.0, "output": "", "visibility": "visible",
          "extra_data": {"assignment": "lab14_transformers", "notes": ["a TA note"]},
          "tests": [{"item": "square", "name": "square: exists", "score": 1.0, "max_score": 1.0, "output": "ok"},
                    {"item": "square", "name": "square: values", "score": 0.0, "max_score": 2.0,
                     "output": "max |square - the reference| = 3 at index (0,) (tolerance 1e-05)"},
                    {"item": "Scaler", "name": "Scaler: exists", "score": 2.0, "max_score": 2.0, "output": "ok"}]}


@pytest.fixture
def grader(monkeypatch):
    """grade_notebook replaced by one that returns RESULT and keeps what it was asked to grade."""
    asked = []

    def grade_notebook(path, aid, device="auto", **kwargs):
        asked.append((nbformat.read(path, as_version=4), aid, device))
        return {**RESULT, "extra_data": dict(RESULT["extra_data"])}
    monkeypatch.setattr(autograder.grading.grade, "grade_notebook", grade_notebook)
    return asked


def test_the_graders_scores_land_in_the_test_cells_as_nbgrader_reads_them(grader, fixture_path):
    nb = nbformat.read(fixture_path("release.ipynb"), as_version=4)
    nb.metadata["course_results"] = {"score": 99}  # a submission cannot bring a result of its own
    graded, res = TrustedGrade().preprocess(nb, resources())
    sources = [c.source for c in nbformat.read(fixture_path("release.ipynb"), as_version=4).cells]
    assert [([c.source for c in asked.cells], aid, device) for asked, aid, device in grader] == \
        [(sources, "a1", "auto")]
    cells = {gid: c for gid, c in zip(grade_ids(graded), graded.cells, strict=True)}
    assert determine_grade(cells["test_square"]) == (1.0, 3.0)  # partial credit from the cell's last value
    assert determine_grade(cells["test_Scaler"]) == (2.0, 2.0)
    printed = cells["test_square"].outputs[0]
    assert printed.name == "stdout" and printed.text.splitlines()[0] == "square: 1 / 3 points"
    assert "max |square - the reference| = 3" in printed.text
    assert cells["square"].outputs == [] and cells["setup_imports"].outputs == []
    assert graded.metadata["course_results"] == RESULT == res["course"]["results"]


def test_a_stub_scores_zero_in_its_test_cell(monkeypatch, fixture_path):
    zero = {**RESULT, "tests": [{**t, "score": 0.0} for t in RESULT["tests"]]}
    monkeypatch.setattr(autograder.grading.grade, "grade_notebook", lambda path, aid, device="auto", **kw: zero)
    graded, _ = TrustedGrade().preprocess(nbformat.read(fixture_path("release.ipynb"), as_version=4), resources())
    assert [determine_grade(c) for c in graded.cells if c.metadata.get("nbgrader", {}).get("points")] == \
        [(0.0, 3.0), (0.0, 2.0)]


def test_a_test_cell_the_grader_has_no_result_for_is_an_error_not_nbgraders_full_points(monkeypatch, fixture_path):
    """nbgrader reads a test cell without output as passed: a release whose cell course.yaml does not know must stop
    the autograde of that submission, naming the cell, not hand out its points."""
    without_scaler = {**RESULT, "tests": [t for t in RESULT["tests"] if t["item"] != "Scaler"]}
    monkeypatch.setattr(autograder.grading.grade, "grade_notebook",
                        lambda path, aid, device="auto", **kw: without_scaler)
    with pytest.raises(RuntimeError, match="no result for test cell 'test_Scaler'"):
        TrustedGrade().preprocess(nbformat.read(fixture_path("release.ipynb"), as_version=4), resources())


def test_the_repairs_come_first_in_the_output_and_the_notes(grader, fixture_path):
    nb = nbformat.read(fixture_path("release.ipynb"), as_version=4)
    nb.metadata["course_repairs"] = ["one repair", "another"]
    graded, _ = TrustedGrade().preprocess(nb, resources())
    result = graded.metadata["course_results"]
    assert result["output"] == "one repair; another"
    assert result["extra_data"]["notes"] == ["one repair", "another", "a TA note"]
    assert result["extra_data"]["repairs"] == ["one repair", "another"]
    assert "course_repairs" not in graded.metadata and "course_repairs" not in grader[0][0].metadata


def test_the_feedback_summary_escapes_what_the_students_code_printed(fixture_path):
    nb = nbformat.read(fixture_path("release.ipynb"), as_version=4)
    shouting = "<script>alert('x')</script>"
    nb.metadata["course_results"] = {**RESULT, "output": f"setup cell printed {shouting}",
                                     "tests": [{**RESULT["tests"][1], "output": "'square' returned <b>bold</b>"}]}
    _, res = FeedbackSummary().preprocess(nb, {})
    summary = str(res["course_summary"])
    assert "setup cell printed &lt;script&gt;" in summary and "<script>" not in summary
    assert "&#39;square&#39; returned &lt;b&gt;bold&lt;/b&gt;" in summary.replace("&#x27;", "&#39;")
    assert "<b>bold" not in summary and "course_results" not in nb.metadata


def test_no_result_no_summary(fixture_path):
    _, res = FeedbackSummary().preprocess(nbformat.read(fixture_path("release.ipynb"), as_version=4), {})
    assert res["course_summary"] == ""


def test_a_pregraded_result_is_taken_under_the_workers_identity_or_this_processs_when_they_are_gone(
        grader, fixture_path, tmp_path, monkeypatch, caplog):
    """The walk that scores takes a worker's result when it is the grading of these bytes by this grader. The grader
    identity comes from the workers (CourseAutograde: nbgrader imports no torch) or, when they are gone, from this
    process, as one by one; a result of another grader is graded again here."""
    import hashlib
    import json
    from concurrent.futures.process import BrokenProcessPool

    from autograder.batch import identity, results
    monkeypatch.setattr(identity, "identity_here", lambda aid, device: "this grader")
    nb = nbformat.read(fixture_path("release.ipynb"), as_version=4)
    sha = hashlib.sha256(nbformat.writes(nb).encode()).hexdigest()
    saved = {**RESULT, "extra_data": {**RESULT["extra_data"], "grading": results.grading_identity("a1", sha, None,
                                                                                                    "this grader")}}
    (tmp_path / "bob.json").write_text(json.dumps(saved))

    def broken(aid, device):
        raise BrokenProcessPool("a worker died")
    for identity_of, graded_here in [(lambda aid, device: "this grader", 0), (broken, 0),
                                     (lambda aid, device: "another grader", 1)]:
        grader.clear()
        step = TrustedGrade(results_dir=str(tmp_path))
        step.identity_of = identity_of
        _, res = step.preprocess(nbformat.read(fixture_path("release.ipynb"), as_version=4), resources())
        assert len(grader) == graded_here and res["course"]["results"]["score"] == 3.0
    assert "the workers did not give the grader identity (BrokenProcessPool: a worker died)" in caplog.text
