"""The Gradescope zip ships the reference's validation curves: a fresh container per submission trains no
reference (autograder/integrations/gradescope.py reference_curves, grading/cache.py's read-only layer)."""
import json
import os
import zipfile

import nbformat
import pytest
import yaml

from autograder.course.config import load_course
from autograder.grading import experiments
from autograder.grading.cache import SHIPPED
from autograder.integrations.gradescope import COURSE_DIR, ZIP_MNIST, export_gradescope
from autograder.integrations.otter_plugin import run_autograder
from autograder.notebooks.examples import examples

CURVES = f"{COURSE_DIR}/{SHIPPED.as_posix()}/"


def short_course(folder, aid, steps):
    """course.yaml with `aid` alone, each experiment cut to `steps` (by name), every seed kept (COURSE_CONFIG)."""
    raw = yaml.safe_load(load_course().path.read_text())
    raw["data"]["mnist_dir"] = str(load_course().mnist_dir)
    raw["assignments"] = {aid: raw["assignments"][aid]}
    for name, exp in raw["assignments"][aid]["experiments"].items():
        exp["steps"] = steps[name]
    path = folder / "course.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def shipped(zip_path):
    """{key: curve} of the zip's read-only cache layer."""
    with zipfile.ZipFile(zip_path) as zf:
        return {n[len(CURVES):].removesuffix(".json"): json.loads(zf.read(n)) for n in zf.namelist()
                if n.startswith(CURVES) and n.endswith(".json")}


@pytest.fixture
def written_curves(monkeypatch):
    """[(key, curve)] of every curve reference_curve computes from now on (none from this process's memo)."""
    monkeypatch.setattr(experiments, "_CURVES", {})
    written, cache_write = [], experiments.cache_write

    def spy(key, value):
        written.append((key, value))
        return cache_write(key, value)
    monkeypatch.setattr(experiments, "cache_write", spy)
    return written


@pytest.mark.slow  # exports (Otter's generate) and trains four short curves
def test_the_zip_ships_each_graded_experiments_curve_for_every_seed_keyed_as_reference_curve_keys_it(
        tmp_path, monkeypatch, capsys, written_curves):
    """w8l4: reverse_transformer and no_causal_mask validate against marks, on seeds 0 and 1; gru_baseline is
    ungraded. The zip holds exactly the curves reference_curve computed and keyed on the CPU in this checkout."""
    aid = "w8l4_transformers"
    monkeypatch.setenv("COURSE_CONFIG", str(short_course(
        tmp_path, aid, {"reverse_transformer": 150, "no_causal_mask": 40, "gru_baseline": 5})))
    monkeypatch.setenv("COURSE_NO_CACHE", "1")  # every curve computed now, none read from an earlier run
    zip_path = export_gradescope(aid, tmp_path / "autograder.zip", device="cpu")

    in_zip = shipped(zip_path)
    assert len(written_curves) == 4, [k for k, _ in written_curves]
    assert in_zip == dict(written_curves)
    assert all(curve and all("step" in v for v in curve) for curve in in_zip.values()), in_zip
    out = capsys.readouterr().out
    assert "reference curves: 4 (reverse_transformer seeds 0, 1; no_causal_mask seeds 0, 1)" in out, out


@pytest.mark.grading
@pytest.mark.slow
def test_a_grading_in_the_container_with_the_shipped_curves_and_an_empty_cache_trains_no_reference(
        tmp_path, monkeypatch):
    """lab14 exported, unpacked as Gradescope does, graded by the zip's Otter plugin with a fresh HOME and user
    cache and the course copy's own .grader/cache empty: the curve is asked for, and reference_history (the reference's
    training) is never called."""
    aid = "lab14_transformers"
    monkeypatch.setenv("COURSE_CONFIG", str(short_course(tmp_path, aid, {"memory_task": 32})))
    monkeypatch.setenv("COURSE_NO_CACHE", "1")
    zip_path = export_gradescope(aid, tmp_path / "autograder.zip", device="cpu")
    keys = set(shipped(zip_path))
    assert len(keys) == 2

    root = tmp_path / "autograder"  # /autograder's layout: the zip in source/, one submission
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(root / "source")
    for folder in ("submission", "results", "home", "user-cache"):
        (root / folder).mkdir()
    (root / "submission_metadata.json").write_text("{}")
    nbformat.write(examples(aid)["complete"], root / "submission" / f"{aid}.ipynb")
    course = root / "source" / COURSE_DIR
    for name in ("COURSE_NO_CACHE", "COURSE_CONFIG"):  # the plugin names the zip's course.yaml itself
        monkeypatch.delenv(name)
    monkeypatch.delenv("COURSE_CACHE_DIR", raising=False)  # a container has no shared cache (the test run's)
    monkeypatch.setenv("COURSE_ROOT", str(course))  # the course found in the zip's copy, as the container's install
    monkeypatch.setenv("HOME", str(root / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(root / "user-cache"))
    monkeypatch.setattr(experiments, "_CURVES", {})  # a fresh process: nothing held from the export
    asked, trained = [], []
    reference_curve, reference_history = experiments.reference_curve, experiments.reference_history
    monkeypatch.setattr(experiments, "reference_curve", lambda *args: asked.append(args[2:]) or reference_curve(*args))
    monkeypatch.setattr(experiments, "reference_history",
                        lambda *args: trained.append(args[2:]) or reference_history(*args))

    run_autograder(str(root))

    result = json.loads((root / "results" / "results.json").read_text())
    memory_task = [t for t in result["tests"] if t["name"].endswith("experiment memory_task")]
    assert memory_task and "seed 0:" in memory_task[0]["output"], result["tests"]  # its run was judged
    assert asked and all(device == "cpu" for _, device in asked), asked  # the curve was wanted, for each seed run
    assert trained == [], f"the reference was trained for (seed, device) {trained}"
    cached = {p.stem for folder in (course / ".grader" / "cache", root / "user-cache") for p in folder.rglob("*.json")}
    assert not keys & cached


def test_an_mnist_assignments_curves_are_keyed_by_the_datas_content_which_the_container_reads_too(tmp_path,
                                                                                                  monkeypatch):
    """w8l1 reads MNIST, so its curves' keys name the data: the zip's course files laid out in another folder (as
    /autograder/source/course) give the key the export predicts, which is this checkout's (the files' content, not
    their folder); the same files with one byte changed give another."""
    from autograder.grading.harness_files import data_source_of
    from autograder.integrations.gradescope import course_files, zip_data_source
    aid = "w8l1_attention_vision"
    predicted, here, folder = zip_data_source(aid, load_course()), data_source_of(aid), str(load_course().mnist_dir)
    container = tmp_path / "autograder" / "source"
    for name, data in course_files(aid):
        (container / name).parent.mkdir(parents=True, exist_ok=True)
        (container / name).write_bytes(data)
    monkeypatch.setenv("COURSE_CONFIG", str(container / COURSE_DIR / "course.yaml"))
    there = data_source_of(aid)
    assert there.startswith("mnist test split "), there
    assert predicted == there == here
    assert folder not in here and str(container) not in there, (here, there)

    labels = container / COURSE_DIR / ZIP_MNIST / "t10k-labels-idx1-ubyte.gz"
    data = bytearray(labels.read_bytes())
    data[-1] ^= 1
    labels.write_bytes(bytes(data))
    stat = labels.stat()  # a later file's time, as a replaced file has: the digests are memoized by it
    os.utime(labels, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert data_source_of(aid).startswith("mnist test split ") and data_source_of(aid) != there


def test_a_curve_is_keyed_by_library_releases_not_builds(monkeypatch):
    """PyPI's torch (+cu130) on the exporter's machine and the CPU index's (+cpu) in the container, another NumPy
    or Python patch: the same curve key; another torch release or NumPy minor version: another."""
    exp = load_course().assignment("lab14_transformers").experiments["memory_task"]

    def key_with(torch, numpy, python):
        monkeypatch.setattr(experiments, "libraries", lambda: {"torch": torch, "numpy": numpy, "python": python})
        return experiments.curve_key("lab14_transformers", exp, 0, "cpu")
    exporter = key_with("2.14.1+cu130", "2.4.6", "3.11.7")
    assert key_with("2.14.1+cpu", "2.4.1", "3.11.14") == exporter
    assert key_with("2.15.0+cpu", "2.4.6", "3.11.7") != exporter
    assert key_with("2.14.1+cu130", "2.5.0", "3.11.7") != exporter
