"""A failure of the grader's own side is a grader failure (GraderError: no score, the cause named), never a
student's zero; the experiment cache never costs a result; the machine-wide locks work for every user."""
import json
import os
import shutil
import stat
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pytest
import yaml

from autograder.course.config import ROOT, course_root
from autograder.errors import GraderError
from autograder.grading import cache
from autograder.grading.cache import cache_read, cache_write
from autograder.grading.experiments import harness, harness_sources, students_training_error
from autograder.grading.grade import IN_PROCESS, grade_notebook
from autograder.grading.plugin import GRADER_FAILED, Grading, Settings
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from autograder.notebooks.kernel_client import kernel_start_lock
from tests.test_grading import short_course

pytestmark = pytest.mark.grading
LAB14, W8L1 = "lab14_transformers", "w8l1_attention_vision"
NOBODY = 65534  # another user: the tests run as root in CI


def notebook(tmp_path, aid, **cells):
    """The solved notebook of `aid`, with some cells replaced."""
    path = tmp_path / f"{aid}.ipynb"
    nbformat.write(with_cells(release_notebook(aid), {**solved_sources(aid), **cells}), path)
    return path


def short(monkeypatch, tmp_path, aid, experiment, cache=False):
    """course.yaml with the experiment cut to two steps on one seed; the cache off unless asked for."""
    path = short_course(tmp_path, aid, [experiment])
    raw = yaml.safe_load(path.read_text())
    raw["assignments"][aid]["experiments"][experiment]["steps"] = 2  # what a result is does not need a good one
    path.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("COURSE_CONFIG", str(path))
    if cache:
        monkeypatch.delenv("COURSE_NO_CACHE", raising=False)
    else:
        monkeypatch.setenv("COURSE_NO_CACHE", "1")


def experiment_test(result, name):
    return next(t for t in result["tests"] if t["name"].endswith(f"experiment {name}"))


# --- the experiments' grader side ------------------------------------------------------------------

def test_missing_mnist_is_a_grader_failure_that_names_it(tmp_path, monkeypatch):
    short(monkeypatch, tmp_path, W8L1, "ae_mnist")
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("COURSE_MNIST_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("COURSE_MNIST_DOWNLOAD", "0")  # offline
    with pytest.raises(GraderError) as failed:
        grade_notebook(notebook(tmp_path, W8L1), W8L1, items=["AutoEncoder"], device="cpu")
    message = str(failed.value)
    assert "ae_mnist" in message and "MNIST not found" in message and "COURSE_MNIST_DIR" in message, message


def test_a_harness_step_that_raises_on_the_grader_side_is_a_grader_failure(tmp_path, monkeypatch):
    short(monkeypatch, tmp_path, LAB14, "memory_task")

    def evaluate(model, ref, cfg, seed, device):
        raise RuntimeError("the harness's own evaluation broke")
    monkeypatch.setitem(harness(LAB14).EXPERIMENTS["memory_task"], "evaluate", evaluate)
    with pytest.raises(GraderError) as failed:
        grade_notebook(notebook(tmp_path, LAB14), LAB14, items=["TransformerClassifier"], device="cpu")
    message = str(failed.value)
    assert "memory_task" in message and "evaluate" in message and "own evaluation broke" in message, message


def test_the_harness_breaking_in_the_sandbox_with_no_student_frame_is_a_grader_failure(tmp_path, monkeypatch):
    short(monkeypatch, tmp_path, LAB14, "memory_task")
    source = harness_sources(LAB14)[LAB14]
    head = "def train_classifier(model, parts, data, cfg, seed):\n"
    assert head in source
    broken = source.replace(head, head + "    harness_helper_that_does_not_exist()\n", 1)
    import autograder.grading.plugin as plugin
    # what the sandbox loads: the shared training module as it is, the harness broken
    monkeypatch.setattr(plugin, "harness_sources", lambda aid: {**harness_sources(aid), aid: broken})
    with pytest.raises(GraderError) as failed:
        grade_notebook(notebook(tmp_path, LAB14), LAB14, items=["TransformerClassifier"], device="cpu")
    assert "memory_task" in str(failed.value) and "NameError" in str(failed.value), str(failed.value)


def test_a_harness_that_cannot_load_in_the_sandbox_is_a_grader_failure(tmp_path, monkeypatch):
    import autograder.grading.plugin as plugin
    monkeypatch.setattr(plugin, "harness_sources", lambda aid: {aid: "raise ImportError('no such lecture module')"})
    with pytest.raises(GraderError) as failed:
        grade_notebook(notebook(tmp_path, LAB14), LAB14, items=["scaled_dot_product_attention"], device="cpu",
                       experiments=False)
    assert "harness" in str(failed.value) and "no such lecture module" in str(failed.value), str(failed.value)


@pytest.mark.parametrize("message, students", [
    ("TypeError: forward() takes 2 positional arguments but 3 were given (cell TransformerClassifier, line 12)", True),
    ("NameError: name 'undefined' is not defined (cell AutoEncoder, line 3)", True),
    ("RuntimeError: The size of tensor a (10) must match the size of tensor b (784)", True),  # a wrong shape
    ("ValueError: optimizer got an empty parameter list", True),
    ("OutOfMemoryError: CUDA out of memory", True),
    ("wrote more than 256 MB (disk limit): OSError: [Errno 28] No space left on device", True),
    ("NameError: name 'harness_helper' is not defined", False),
    ("ImportError: cannot import name 'x' from 'torch'", False),
    ("AssertionError: ", False),
])
def test_whose_is_an_error_of_the_training_in_the_sandbox(message, students):
    assert students_training_error(message) is students


# --- the cache ------------------------------------------------------------------------------------

def places(key):
    """Every file the cache could hold `key` in (the package's, the course's and the user's folders)."""
    import platformdirs
    folders = {ROOT / ".grader" / "cache", course_root() / ".grader" / "cache",
               Path(platformdirs.user_cache_dir("attention-course")) / "experiments"}
    return [folder / f"{key}.json" for folder in folders]


def test_no_cache_writes_nothing_and_reads_nothing(monkeypatch):
    key = "test-" + uuid.uuid4().hex
    monkeypatch.setenv("COURSE_NO_CACHE", "1")
    try:
        assert cache_write(key, [{"acc": 1.0}, []]) == ""
        assert not any(p.exists() for p in places(key))
        monkeypatch.delenv("COURSE_NO_CACHE")
        assert cache_write(key, [{"acc": 1.0}, []]) == ""
        assert cache_read(key) == [{"acc": 1.0}, []]
        monkeypatch.setenv("COURSE_NO_CACHE", "1")
        assert cache_read(key) is None
    finally:
        for p in places(key):
            p.unlink(missing_ok=True)


@contextmanager
def shared_folder(mode):
    """A fresh folder under the system's temp folder that another user can reach, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="course-test-"))
    folder.chmod(mode)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def as_other_user(fn, umask=0o022):
    """fn()'s value (JSON) from a forked child running as another uid, or the text of what it raised."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as a second user")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.umask(umask)
            out = {"value": fn()}
        except BaseException as e:  # noqa: BLE001 -- reported to the parent, which asserts on it
            out = {"raised": f"{type(e).__name__}: {e}"}
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def test_a_course_cache_another_user_owns_falls_back_to_the_users_own(monkeypatch):
    """A TA who does not own the checkout: the run is stored in (and read from) their own cache folder."""
    with shared_folder(0o755) as top:
        course = top / "course"
        (course / ".grader" / "cache").mkdir(parents=True)  # root's, 0755: readable, not writable, by the TA
        (course / "course.yaml").write_text("")
        for folder in (course, course / ".grader", course / ".grader" / "cache"):
            folder.chmod(0o755)
        (top / "home").mkdir()
        os.chown(top / "home", NOBODY, NOBODY)
        monkeypatch.setenv("COURSE_ROOT", str(course))
        monkeypatch.setenv("XDG_CACHE_HOME", str(top / "home"))
        monkeypatch.delenv("COURSE_NO_CACHE", raising=False)
        got = as_other_user(lambda: [cache_write("k", [{"acc": 0.5}, []]), cache_read("k")])
        assert got == {"value": ["", [{"acc": 0.5}, []]]}, got
        assert (top / "home" / "attention-course" / "experiments" / "k.json").is_file()
        assert not (course / ".grader" / "cache" / "k.json").exists()

        (top / "roots").mkdir(mode=0o755)  # now nowhere is writable for the TA: a warning, no exception
        monkeypatch.setenv("XDG_CACHE_HOME", str(top / "roots"))
        got = as_other_user(lambda: cache_write("k2", [{"acc": 0.5}, []]))
        assert "could not be written" in got.get("value", ""), got


def test_an_unwritable_cache_keeps_the_measured_result_and_warns(tmp_path, monkeypatch, capfd):
    short(monkeypatch, tmp_path, LAB14, "memory_task", cache=True)
    (tmp_path / "file").write_text("")  # a file where the folders' parent should be: no folder can be made
    monkeypatch.setattr(cache, "cache_folders", lambda: [tmp_path / "file" / "course", tmp_path / "file" / "user"])
    result = grade_notebook(notebook(tmp_path, LAB14), LAB14, items=["TransformerClassifier"], device="cpu")
    test = experiment_test(result, "memory_task")
    assert test["extra_data"]["metrics"].get("test_accuracy") is not None, test
    assert "seed 0: test_accuracy" in test["output"], test["output"]
    warnings = [n for n in result["extra_data"]["notes"] if "experiment cache could not be written" in n]
    assert warnings and str(tmp_path / "file") in warnings[0], result["extra_data"]["notes"]
    assert "experiment cache could not be written" not in result["output"]  # the TA's note, not the student's
    assert "experiment cache could not be written" in capfd.readouterr().err


# --- the suites -----------------------------------------------------------------------------------

SUITE = '''
import pytest
import torch


@pytest.mark.item("make_memory_dataset", "shapes")
def test_shapes(student, rng):
    X, y = student.call("make_memory_dataset", 3, 5)  # an answer that is not a pair cannot be unpacked
    assert X.shape[0] == 3


@pytest.mark.item("make_memory_dataset", "properties")
def test_properties(student, rng):
    {properties}
'''


def run_suite(tmp_path, name, properties, nb):
    """One graded session of a suite written here: (exit code, the Grading)."""
    suite = tmp_path / f"test_{name}.py"
    suite.write_text(SUITE.format(properties=properties))
    grading = Grading(Settings(submission=nb, assignment=LAB14, device="cpu", items=["make_memory_dataset"],
                               experiments=False))
    return pytest.main([str(suite), *IN_PROCESS], plugins=[grading]), grading


def test_a_suite_that_raises_before_asking_the_student_is_a_grader_failure(tmp_path):
    # torch's RuntimeError is one a wrong answer can cause, but here no answer was asked for: the suite's bug
    code, grading = run_suite(tmp_path, "suite_bug", "torch.zeros(2, 3) @ torch.zeros(4, 5)",
                              notebook(tmp_path, LAB14))
    assert code == GRADER_FAILED and grading.results is None
    assert "test_properties" in grading.grader_error and "RuntimeError" in grading.grader_error, grading.grader_error


def test_an_answer_the_check_cannot_use_is_still_the_students(tmp_path):
    single = "def make_memory_dataset(n_samples, seq_len, seed=0):\n    return torch.zeros(n_samples, seq_len, 1)\n"
    code, grading = run_suite(tmp_path, "suite_answer", "pass", notebook(tmp_path, LAB14, make_memory_dataset=single))
    assert not grading.grader_error and grading.results is not None, grading.grader_error
    shapes = next(t for t in grading.results["tests"] if t["name"] == "make_memory_dataset: shapes")
    assert shapes["score"] == 0 and "returned something this check cannot use (ValueError" in shapes["output"], shapes


# --- machine-wide locks ---------------------------------------------------------------------------

def test_the_kernel_start_lock_works_for_two_users():
    """The first user's lock file (even under umask 077) is one the second user can take, and it is one lock."""
    with shared_folder(0o1777) as tmp:  # like /tmp: world-writable and sticky
        lock = tmp / "course-kernel-start.lock"

        def take(wait_s):
            with kernel_start_lock(lock, wait_s=wait_s) as held:
                return held
        assert as_other_user(lambda: take(5), umask=0o077) == {"value": True}
        assert lock.stat().st_uid == NOBODY and stat.S_IMODE(lock.stat().st_mode) & 0o004
        with kernel_start_lock(lock) as held:  # root opens the other user's file
            assert held
            assert as_other_user(lambda: take(0.3)) == {"value": False}  # excluded: the same lock
        lock.unlink()
        with kernel_start_lock(lock) as held:  # root first, the other user second: the reported case
            assert held
        assert as_other_user(lambda: take(5)) == {"value": True}


def test_a_grader_failure_has_no_score_in_the_json_and_csv_course_grade_writes(tmp_path, monkeypatch, capsys):
    """What a TA imports into a gradebook: a blank, never a 0, for a submission the grader could not grade."""
    import csv

    import autograder.grading.plugin as plugin
    from autograder import cli
    monkeypatch.setattr(plugin, "harness_sources", lambda aid: {aid: "raise ImportError('no such lecture module')"})
    nb, out, table = notebook(tmp_path, LAB14), tmp_path / "alice.json", tmp_path / "grades.csv"
    code = cli.main(["grade", str(nb), "-a", LAB14, "--items", "scaled_dot_product_attention", "--device", "cpu",
                     "--json", str(out), "--csv", str(table)])
    assert code == 3, capsys.readouterr().err
    saved = json.loads(out.read_text())
    assert saved["score"] is None and saved["extra_data"]["grader_error"], saved
    [row] = list(csv.DictReader(table.open()))
    assert row["score"] == "" and row["scaled_dot_product_attention"] == "", row
