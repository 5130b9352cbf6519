"""A cache folder shared by several copies of a course (a TA team, a cluster's nodes, the test run's clones):
$COURSE_CACHE_DIR, else course.yaml's `cache_dir`, read and written before the course's own .grader/cache, with keys
that do not name where a course lives (autograder/grading/cache.py, harness_files.py data_source_of)."""
import json
import os
import shutil
from types import SimpleNamespace

import pytest
import yaml

from autograder.course.config import ROOT, load_course
from autograder.grading import cache, experiments
from autograder.grading.cache import cache_folders, cache_read, cache_write, experiment_key, shared_folder
from autograder.grading.experiments import curve_key, experiment_inputs
from autograder.notebooks.examples import write_solution
from tests.first_run import shorten

W8L1, LAB14 = "w8l1_attention_vision", "lab14_transformers"


def course_copy(folder, release=()):
    """A course in `folder`: course.yaml, MNIST's files and the named assignments' release, copied."""
    folder.mkdir(parents=True)
    shutil.copy2(ROOT / "course.yaml", folder / "course.yaml")
    shutil.copytree(load_course().mnist_dir, folder / "data" / "mnist")
    for aid in release:
        shutil.copytree(ROOT / "release" / aid, folder / "release" / aid)
    return folder


@pytest.fixture
def courses(tmp_path, monkeypatch):
    """Two copies of the course and a shared folder named in COURSE_CACHE_DIR; the cache on."""
    monkeypatch.delenv("COURSE_NO_CACHE", raising=False)
    monkeypatch.delenv("COURSE_CONFIG", raising=False)
    monkeypatch.delenv("COURSE_MNIST_DIR", raising=False)
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path / "shared"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user"))
    return SimpleNamespace(a=course_copy(tmp_path / "a", [LAB14]), b=course_copy(tmp_path / "b", [LAB14]),
                           shared=tmp_path / "shared")


def test_a_run_is_written_to_the_shared_folder_first_and_another_copy_reads_it(courses, monkeypatch):
    monkeypatch.setenv("COURSE_ROOT", str(courses.a))
    assert cache_folders()[:2] == [courses.shared, courses.a / ".grader" / "cache"]
    assert cache_write("k", [{"acc": 0.5}, []]) == ""
    assert json.loads((courses.shared / "k.json").read_text()) == [{"acc": 0.5}, []]
    assert not (courses.a / ".grader" / "cache" / "k.json").exists()
    monkeypatch.setenv("COURSE_ROOT", str(courses.b))
    assert cache_read("k") == [{"acc": 0.5}, []]
    monkeypatch.setenv("COURSE_NO_CACHE", "1")  # off: neither read nor written, the shared folder included
    assert cache_read("k") is None and cache_write("k2", [{"acc": 1.0}, []]) == ""
    assert not (courses.shared / "k2.json").exists()


def test_course_yaml_names_the_shared_folder_relative_to_itself_and_the_setting_overrides_it(courses, monkeypatch):
    monkeypatch.setenv("COURSE_ROOT", str(courses.a))
    monkeypatch.delenv("COURSE_CACHE_DIR")
    assert shared_folder() is None and cache_folders()[0] == courses.a / ".grader" / "cache"  # the default: none
    raw = yaml.safe_load((courses.a / "course.yaml").read_text())
    raw["cache_dir"] = "../team-cache"
    (courses.a / "course.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    assert shared_folder() == courses.a.parent / "team-cache"
    monkeypatch.setenv("COURSE_CACHE_DIR", str(courses.shared))
    assert shared_folder() == courses.shared

    from autograder.integrations.gradescope import zip_course_yaml  # a container's cache is its own
    zipped = yaml.safe_load(zip_course_yaml(load_course(courses.a / "course.yaml"), LAB14))
    assert "cache_dir" not in zipped and list(zipped["assignments"]) == [LAB14]


def test_a_shared_folder_that_cannot_be_written_costs_nothing_the_course_keeps_the_run(courses, monkeypatch, capfd):
    """A file where the shared folder should be (no folder can be made there, for root too): the run is stored in
    the course's own folder, with no warning, and read from there."""
    (courses.shared.parent / "file").write_text("")
    monkeypatch.setenv("COURSE_CACHE_DIR", str(courses.shared.parent / "file" / "cache"))
    monkeypatch.setenv("COURSE_ROOT", str(courses.a))
    assert cache_write("k", [{"acc": 0.5}, []]) == ""
    assert (courses.a / ".grader" / "cache" / "k.json").is_file() and cache_read("k") == [{"acc": 0.5}, []]
    assert "warning" not in capfd.readouterr().err


def test_the_keys_of_an_mnist_experiment_name_the_datas_content_not_the_course_folder(courses, monkeypatch):
    """w8l1's run and curve keys in two copies of the course (each with its own copy of MNIST's files) are the
    same and name neither folder; the same files with one byte changed give other keys."""
    course = load_course()
    exp = course.assignment(W8L1).experiments["ae_mnist"]
    code = SimpleNamespace(cells=[])

    def keys():
        inputs = experiment_inputs(code, W8L1, exp, 0, "cpu", 1)
        return experiment_key(inputs), curve_key(W8L1, exp, 0, "cpu"), json.dumps(inputs)
    monkeypatch.setenv("COURSE_ROOT", str(courses.a))
    run_a, curve_a, inputs_a = keys()
    monkeypatch.setenv("COURSE_ROOT", str(courses.b))
    run_b, curve_b, inputs_b = keys()
    assert (run_a, curve_a) == (run_b, curve_b)
    assert str(courses.a) not in inputs_a and str(courses.b) not in inputs_b, inputs_b

    images = courses.b / "data" / "mnist" / "t10k-images-idx3-ubyte.gz"
    data = bytearray(images.read_bytes())
    data[-1] ^= 1
    images.write_bytes(bytes(data))
    stat = images.stat()  # a later file's time, as a replaced file has: the digests are memoized by it
    os.utime(images, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    run_changed, curve_changed, _ = keys()
    assert run_changed != run_b and curve_changed != curve_b


@pytest.mark.grading
def test_a_second_copy_of_the_course_grades_from_the_first_ones_training(courses, monkeypatch, tmp_path):
    """lab14's complete notebook graded in one copy of a short course, then in another: the second trains nothing
    (the experiments' training spied on) and scores what the first did, from the shared folder alone (neither
    copy's .grader/cache holds a run)."""
    from autograder.grading.grade import grade_notebook
    trained, train_and_evaluate = [], experiments._train_and_evaluate
    monkeypatch.setattr(experiments, "_train_and_evaluate",
                        lambda *args, **kwargs: trained.append(args[2].name) or train_and_evaluate(*args, **kwargs))
    results = {}
    for name, course in (("a", courses.a), ("b", courses.b)):
        shorten(course)
        monkeypatch.setenv("COURSE_ROOT", str(course))
        (tmp_path / f"submission-{name}").mkdir()
        notebook = write_solution(LAB14, tmp_path / f"submission-{name}")
        results[name] = grade_notebook(notebook, LAB14, items=["TransformerClassifier"], device="cpu")
        results[name]["trained"] = list(trained)

    assert results["a"]["trained"], "the first copy trained nothing: the shared folder was not empty"
    assert results["b"]["trained"] == results["a"]["trained"], "the second copy trained again"
    assert results["b"]["score"] == results["a"]["score"] > 0
    assert [t["output"] for t in results["b"]["tests"]] == [t["output"] for t in results["a"]["tests"]]
    assert any(courses.shared.glob("*.json"))
    assert not list((courses.a / ".grader").rglob("*.json")) and not list((courses.b / ".grader").rglob("*.json"))
    assert cache.shared_folder() == courses.shared
