"""The reference's validation curves committed in .grader/curves (`course curves`, autograder/apps/curves.py): a
fresh checkout's first grading reads them from the cache's read-only layer and trains no reference (issue #62's
`fresh` row)."""
import json
import shutil

import pytest

from autograder.apps.curves import INDEX, current_curves, read_index
from autograder.course.config import ROOT, load_course
from autograder.grading import experiments
from autograder.grading.cache import PACKAGE, SHIPPED

FOLDER = ROOT / SHIPPED


def committed_libraries():
    """The library releases the committed curves were trained with (one set for all of them)."""
    index = read_index(FOLDER)
    releases = {json.dumps(entry["libraries"], sort_keys=True) for entry in index.values()}
    assert len(releases) == 1, f"{FOLDER / INDEX}: curves of {len(releases)} sets of library releases: run " \
                               f"`course curves` and commit .grader/curves"
    return json.loads(releases.pop())


def test_the_committed_curves_are_the_ones_a_grading_here_would_read(monkeypatch):
    """Keyed with the library releases they were trained with, the keys of every curve a grading on the CPU would
    read are the committed files, and no other file is there: editing a harness, a solution, an experiment's
    course.yaml entry or experiments.CURVE_CODE fails this until `course curves` is run again and committed."""
    monkeypatch.setattr(experiments, "curve_libraries", committed_libraries)
    current, index = current_curves(), read_index(FOLDER)
    files = {path.stem for path in FOLDER.glob("*.json") if path.name != INDEX}
    shipped = {entry["assignment"] for entry in index.values()}
    # an assignment none of whose curves is committed (a new lecture, `course new`) trains them at its first
    # grading, as before #62: shipping them is a speed-up the author chooses (docs/AUTHORING.md), not a rule
    stale, missing = sorted(files - set(current)), sorted(f"{aid}.{name} seed {seed}"
                                                          for key, (aid, name, seed) in current.items()
                                                          if key not in files and aid in shipped)
    assert not stale and not missing, f"run `course curves` and commit .grader/curves: {len(stale)} stale " \
                                      f"files {stale}, curves missing: {missing}"
    assert shipped >= {"w8l1_attention_vision", "w8l4_transformers", "lab14_transformers"}  # MNIST's w8l1 too
    for key, (aid, name, seed) in current.items():
        assert (index[key]["assignment"], index[key]["experiment"], index[key]["seed"]) == (aid, name, seed)
        steps = [point["step"] for point in json.loads((FOLDER / f"{key}.json").read_text())]
        assert steps and steps == sorted(steps), f"{key}.json ({aid}.{name} seed {seed}): steps {steps}"


@pytest.mark.parametrize("aid, name", [("lab14_transformers", "memory_task"), ("w8l4_transformers", "no_causal_mask")])
def test_a_fresh_checkout_reads_the_committed_curve_and_trains_no_reference(tmp_path, monkeypatch, aid, name):
    """A course folder as a clone has it (course.yaml, the committed curves, no .grader/cache) and an empty user
    cache: reference_curve gives the committed curve for seeds 0 and 1, and the reference is never trained."""
    course = tmp_path / "course"
    shutil.copytree(FOLDER, course / SHIPPED)
    shutil.copy(ROOT / "course.yaml", course / "course.yaml")
    for variable in ("COURSE_NO_CACHE", "COURSE_CONFIG"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("COURSE_ROOT", str(course))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    monkeypatch.setattr(experiments, "curve_libraries", committed_libraries)
    monkeypatch.setattr(experiments, "_CURVES", {})  # a fresh process: nothing held

    def trained(*args):
        raise AssertionError(f"the reference was trained for {args}")
    monkeypatch.setattr(experiments, "reference_history", trained)
    exp = load_course().assignment(aid).experiments[name]
    for seed in (0, 1):
        key = experiments.curve_key(aid, exp, seed, "cpu")
        committed = json.loads((course / SHIPPED / f"{key}.json").read_text())
        assert committed and experiments.reference_curve(aid, exp, seed, "cpu") == committed
    assert not (course / ".grader" / "cache").exists() or not any((course / ".grader" / "cache").glob("*.json"))


def test_a_curves_key_follows_the_code_that_trains_the_reference_not_the_sandboxs(tmp_path):
    """The reference's curve trains in the grader's process: an edit of the sandbox (the student's side included) or
    of course.yaml's parsing keeps every curve's key, so the committed curves stay current; an edit of the harness or
    of the code that trains it (experiments.CURVE_CODE) changes them."""
    package = tmp_path / "autograder"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    course = load_course()
    experiments_with_curves = [(aid, exp) for aid, assignment in course.assignments.items()
                               for exp in assignment.experiments.values() if experiments.has_curve(aid, exp)]

    def keys():
        return [experiments.curve_key(aid, exp, 0, "cpu", package=package) for aid, exp in experiments_with_curves]
    base = keys()
    assert len(base) >= 4
    assert base == [experiments.curve_key(aid, exp, 0, "cpu") for aid, exp in experiments_with_curves]  # the copy
    for name in ("sandbox/grader_side.py", "sandbox/child/server.py", "course/config.py", "grading/shared_runs.py"):
        (package / name).write_text((package / name).read_text() + "\nEDITED = 1\n")
    assert keys() == base
    (package / "grading" / "experiments.py").write_text((package / "grading" / "experiments.py").read_text()
                                                        + "\nEDITED = 1\n")
    after = keys()
    assert all(a != b for a, b in zip(after, base, strict=True))
    (package / "harness" / "lab14_transformers.py").write_text(
        (package / "harness" / "lab14_transformers.py").read_text() + "\nEDITED = 1\n")
    assert [a != b for a, b in zip(keys(), after, strict=True)] == [aid == "lab14_transformers"
                                                                    for aid, _ in experiments_with_curves]
