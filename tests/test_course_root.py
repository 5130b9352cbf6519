"""The course is found wherever the package is installed: course.yaml, release/, solutions/ and nbgrader's settings
come from the course folder (the working folder, `course --course DIR` or COURSE_ROOT), the grader's own code from
the package, and a missing release is an error naming it, never a silently skipped setup-cell restore."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from autograder import cli
from autograder.course.config import ROOT, load_course
from autograder.errors import GraderError
from autograder.grading.grade import grade_notebook
from autograder.notebooks.build import gradebook_url
from autograder.notebooks.cells import nbgrader_meta
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from tests.test_release import normalised

pytestmark = pytest.mark.grading
AID = "lab14_transformers"
ITEM = "PositionalEncoding"          # no experiment: a few seconds to grade
COURSE = Path(sys.executable).with_name("course")
# `python -m autograder.cli` as a user runs it, saying first where the package was imported from
CLI = "import sys, autograder.cli\nprint('package:', autograder.__file__)\nsys.exit(autograder.cli.main(sys.argv[1:]))"


def course_copy(dest, points=None, release=True, solutions=None, experiments=True):
    """A course folder as a TA's second clone has it: course.yaml (ITEM's points changed, or the experiments
    left out), nbgrader's settings, the release (unless not), and solutions/ when given as {module: source}."""
    raw = yaml.safe_load((ROOT / "course.yaml").read_text())
    raw["data"]["mnist_dir"] = str(load_course().mnist_dir)  # its relative default is relative to the checkout
    raw["assignments"][AID]["items"][ITEM]["points"].update(points or {})
    if not experiments:
        raw["assignments"][AID]["experiments"] = {}
    dest.mkdir(parents=True)
    (dest / "course.yaml").write_text(yaml.safe_dump(raw))
    shutil.copy(ROOT / "nbgrader_config.py", dest)
    if release:
        shutil.copytree(ROOT / "release" / AID, dest / "release" / AID)
    for name, source in (solutions or {}).items():
        (dest / "solutions").mkdir(exist_ok=True)
        (dest / "solutions" / f"{name}.py").write_text(source)
    return dest


def solved_with_edited_setup(path):
    """The reference solution with its imports cell emptied: only the released setup cell makes it run."""
    nb = with_cells(release_notebook(AID), solved_sources(AID))
    cell = next(c for c in nb.cells if nbgrader_meta(c).get("grade_id") == "setup_imports")
    cell.source = "import torch  # the rest of the imports deleted by the student"
    nbformat.write(nb, path)
    return path


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("COURSE_ROOT", "COURSE_CONFIG", "PYTHONPATH")}
    return {**env, **extra}


def by_kind(result):
    return {t["name"].split(": ", 1)[1]: t for t in result["tests"] if t["item"] == ITEM}


@pytest.mark.slow
def test_a_non_editable_install_grades_the_course_of_the_working_folder_with_its_released_setup_cells(tmp_path):
    """The package in a site folder of its own (as `pip install .` puts it), the course's files in the working
    folder: it grades, and the student's edited setup cell is replaced by the released one."""
    site = tmp_path / "site"
    for package in ("autograder", "solutions"):
        shutil.copytree(ROOT / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    course = course_copy(tmp_path / "course")
    nb, out = solved_with_edited_setup(tmp_path / "alice.ipynb"), tmp_path / "alice.json"
    proc = subprocess.run([sys.executable, "-c", CLI, "grade", str(nb), "-a", AID, "--items", ITEM, "--device", "cpu",
                           "--json", str(out)], cwd=course, env=clean_env(PYTHONPATH=str(site)),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"package: {site / 'autograder'}" in proc.stdout, proc.stdout[:500]
    result = json.loads(out.read_text())
    assert result["score"] == result["max_score"] == load_course().assignment(AID).item_points(ITEM), result["output"]
    assert "setup cell 'setup_imports' was changed in the submission; the released version was used" \
        in result["output"], result["output"]

    # COURSE_CONFIG alone (no course folder at or above the working folder): no release to trust, so no grade
    proc = subprocess.run([sys.executable, "-c", CLI, "grade", str(nb), "-a", AID, "--items", ITEM, "--device", "cpu",
                           "--json", str(tmp_path / "again.json")], cwd=tmp_path,
                          env=clean_env(PYTHONPATH=str(site), COURSE_CONFIG=str(course / "course.yaml")),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]  # the setup's error, before any grading
    assert "no course.yaml" in proc.stderr and "--course" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.slow
def test_a_second_clone_grades_with_its_own_course_yaml_and_solutions(tmp_path):
    """Run from the clone with the environment's `course` (installed from another checkout): the clone's
    course.yaml (no experiment) and the clone's reference solution (its classifier reads the last position, not
    CLS) decide the grade of the checkout's reference."""
    item, reference = "TransformerClassifier", (ROOT / "solutions" / f"{AID}.py").read_text()
    cls, last = "self.head(self.norm(h)[:, 0])", "self.head(self.norm(h)[:, -1])"
    assert reference.count(cls) == 1
    clone = course_copy(tmp_path / "clone", experiments=False,
                        solutions={"__init__": "", AID: reference.replace(cls, last)})
    nb, out = solved_with_edited_setup(tmp_path / "alice.ipynb"), tmp_path / "alice.json"
    proc = subprocess.run([str(COURSE), "grade", str(nb), "-a", AID, "--items", item, "--device", "cpu",
                           "--json", str(out)], cwd=clone, env=clean_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    checks = {t["name"].split(": ", 1)[1]: t for t in result["tests"]}
    assert sorted(checks) == ["exists", "shapes", "values"], list(checks)  # the clone's course.yaml: no experiment
    assert checks["values"]["score"] == 0 and checks["shapes"]["score"] == checks["shapes"]["max_score"], \
        checks["values"]["output"]                                              # the clone's reference


def test_course_option_names_the_course_from_anywhere(tmp_path, monkeypatch, capsys):
    """`course --course DIR` from a folder inside another course: DIR's course.yaml decides the points."""
    clone = course_copy(tmp_path / "clone", points={"values": 3})
    nb, out = solved_with_edited_setup(tmp_path / "alice.ipynb"), tmp_path / "alice.json"
    monkeypatch.setenv("COURSE_ROOT", str(ROOT))  # main() sets it: this way undone after the test
    monkeypatch.delenv("COURSE_CONFIG", raising=False)
    monkeypatch.chdir(ROOT)  # the working folder is another course, which --course overrides
    args = ["grade", str(nb), "-a", AID, "--items", ITEM, "--device", "cpu", "--json", str(out)]
    assert cli.main(["--course", str(clone), *args]) == 0, capsys.readouterr().err[-3000:]
    checks = by_kind(json.loads(out.read_text()))
    assert checks["values"]["max_score"] == 3 and checks["values"]["score"] == 3, checks["values"]
    assert os.environ["COURSE_ROOT"] == str(clone)  # what batch workers and nbgrader's processes inherit

    assert cli.main(["--course", str(tmp_path), *args]) == 2
    assert f"COURSE_ROOT={tmp_path}: no course.yaml there" in capsys.readouterr().err


def test_a_missing_release_is_an_error_naming_it_never_a_skipped_restore(tmp_path, monkeypatch, capsys):
    clone = course_copy(tmp_path / "clone", release=False)
    nb, out = solved_with_edited_setup(tmp_path / "alice.ipynb"), tmp_path / "alice.json"
    monkeypatch.setenv("COURSE_ROOT", str(ROOT))  # main() sets it: this way undone after the test
    monkeypatch.delenv("COURSE_CONFIG", raising=False)
    code = cli.main(["--course", str(clone), "grade", str(nb), "-a", AID, "--items", ITEM, "--device", "cpu",
                     "--json", str(out)])
    err = capsys.readouterr().err
    missing = clone / "release" / AID / f"{AID}.ipynb"
    assert code == 2 and str(missing) in err and f"course release {AID}" in err, err[-3000:]  # once, before grading
    monkeypatch.setenv("COURSE_ROOT", str(clone))  # nbgrader's and Otter's path: the grading session itself stops
    with pytest.raises(GraderError) as failed:
        grade_notebook(nb, AID, items=[ITEM], device="cpu", experiments=False)
    assert str(missing) in str(failed.value) and f"course release {AID}" in str(failed.value), str(failed.value)

    assert cli.main(["--course", str(clone), "export", "gradescope", AID, "-o", str(tmp_path / "a.zip")]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and f"course release {AID}" in err and not (tmp_path / "a.zip").exists(), err


def test_nbgrader_settings_of_a_second_clone_are_its_own(tmp_path, monkeypatch):
    """nbgrader reads nbgrader_config.py from the folder it runs in; its folders follow that file, and `course
    release` registers assignments in the gradebook that file names."""
    from traitlets.config.loader import PyFileConfigLoader
    clone = course_copy(tmp_path / "clone")
    config = PyFileConfigLoader("nbgrader_config.py", path=str(clone)).load_config().CourseDirectory
    state = clone / ".nbgrader"
    assert config.root == str(clone) and config.db_url == f"sqlite:///{state / 'gradebook.db'}"
    assert {config.submitted_directory, config.autograded_directory, config.feedback_directory} == \
        {str(state / "submitted"), str(state / "autograded"), str(state / "feedback")}
    monkeypatch.setenv("COURSE_ROOT", str(clone))
    assert gradebook_url() == config.db_url


@pytest.mark.slow
@pytest.mark.parametrize("aid", list(load_course().assignments))
def test_course_release_in_a_second_clone_writes_its_release_and_registers_in_its_gradebook(tmp_path, monkeypatch,
                                                                                              capsys, aid):
    """`course --course CLONE release ID`: the clone's assignments/ and nbgrader settings make the clone's release/
    and gradebook; the checkout's release is left alone, and it is what the release verb makes now (nothing else
    in its folder): the committed release is up to date."""
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "assignments" / aid, clone / "assignments" / aid)
    for name in ("course.yaml", "nbgrader_config.py"):
        shutil.copy(ROOT / name, clone)
    released = ROOT / "release" / aid / f"{aid}.ipynb"
    before = released.stat().st_mtime_ns
    monkeypatch.setenv("COURSE_ROOT", str(ROOT))  # main() sets it: this way undone after the test
    assert cli.main(["--course", str(clone), "release", aid]) == 0, capsys.readouterr().err[-3000:]
    assert normalised(clone / "release" / aid / f"{aid}.ipynb") == normalised(released), \
        f"release/{aid} is out of date: run `course release {aid}`"
    assert sorted(p.name for p in released.parent.iterdir()) == [f"{aid}.ipynb"]
    assert released.stat().st_mtime_ns == before, "the checkout's release was rewritten"
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{clone / '.nbgrader' / 'gradebook.db'}") as gb:
        assert [n.name for n in gb.find_assignment(aid).notebooks] == [aid]
