"""The Gradescope zip as Gradescope builds it: a complete environment, only the assignment, a results.json for
every upload and failure, the grader's record for the staff, the time budget, and the rehearsal
(`course export gradescope ID --check`) end to end."""
import ast
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import nbformat
import pytest
from packaging.requirements import Requirement

from autograder.course.config import ROOT, load_course, parse_course
from autograder.grading.grade import grade_notebook
from autograder.integrations.gradescope import COURSE_DIR, course_files, otter_config, requirements
from autograder.integrations.otter_plugin import (
    STAFF_TEST,
    CourseGrader,
    load_seconds,
    run_autograder,
    upload_problem,
    worst_seconds,
)
from autograder.notebooks.examples import examples
from tests.test_notebook_shapes import without_metadata

AID = "lab14_transformers"
PLUGIN = "autograder.integrations.otter_plugin.CourseGrader"
LAST = "TransformerClassifier"  # lab14's last item, the one with the experiment


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure():
    """Distribution names (normalised) that `pip install course` brings: pyproject's dependencies, no extras."""
    return closure(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def closure(requirements):
    """Distribution names (normalised) that pip installs for `requirements`, as this environment has them."""
    todo = [Requirement(r) for r in requirements]
    seen = set()
    while todo:
        req = todo.pop()
        if norm(req.name) in seen:
            continue
        seen.add(norm(req.name))
        for dep in map(Requirement, md.requires(req.name) or []):  # its own, and those of the extras asked for
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in ("", *req.extras)):
                todo.append(dep)
    return seen


# The optional extras `cluster`, `slurm` and `k8s` (pyproject.toml): Dask and its deployers, imported only where a
# class is graded on a cluster; Gradescope grades one submission per container and never installs them.
CLUSTER_EXTRAS = {"distributed", "dask", "dask_jobqueue", "dask_kubernetes"}
# Modules of the Dask path alone, which import distributed at their top: a worker's side (only a worker, where
# distributed runs it, imports it) and the coordinator's message logs (imported inside dask_client)
DASK_ONLY = {"autograder/batch/task.py", "autograder/batch/message_logs.py"}


def test_everything_the_grader_imports_is_a_runtime_dependency_of_the_course():
    """Gradescope's setup installs the course without extras: pytest in `[test]` alone failed every submission."""
    extras = (ROOT / "pyproject.toml").read_text()
    assert all(name.replace("_", "-") in extras for name in CLUSTER_EXTRAS), "CLUSTER_EXTRAS must be extras"
    owners = md.packages_distributions()
    closure = runtime_closure()
    missing = {}
    for path in [*(ROOT / "autograder").rglob("*.py"), *(ROOT / "solutions").glob("*.py")]:
        tree = ast.parse(path.read_text())
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("autograder", "solutions"):
                    continue
                dists = {norm(d) for d in owners.get(top, [])}
                dask_only = path.relative_to(ROOT).as_posix() in DASK_ONLY
                if top in CLUSTER_EXTRAS and (id(node) not in top_level or dask_only):
                    continue  # `--scheduler`/`--cluster` alone import it, inside the function that needs it
                if not dists & closure:
                    missing.setdefault(top, set()).add(path.relative_to(ROOT).as_posix())
    assert not missing, f"imported by the grader but not a runtime dependency of the course: {missing}"


def test_the_zip_holds_its_assignment_alone_with_the_gradescope_limits():
    files = dict(course_files(AID))
    others = set(load_course().assignments) - {AID}
    leaked = [name for name in files if any(other in name for other in others)]
    assert not leaked, leaked
    for needed in (f"autograder/suites/test_{AID}.py", f"autograder/harness/{AID}.py", f"solutions/{AID}.py",
                   f"release/{AID}/{AID}.ipynb"):
        assert f"{COURSE_DIR}/{needed}" in files, needed
    assert not any("/data/mnist/" in name for name in files), "lab14 reads no MNIST"
    zipped = parse_course(files[f"{COURSE_DIR}/course.yaml"].decode(), "zip course.yaml")
    profile = load_course().gradescope
    assert list(zipped.assignments) == [AID]
    assert zipped.assignment(AID).total_points == load_course().assignment(AID).total_points
    assert {k: getattr(zipped.limits, k) for k in profile.limits.model_dump(exclude_none=True)} == \
        profile.limits.model_dump(exclude_none=True)
    assert profile.limits.memory_mb < profile.container_memory_mb


def test_the_profile_fits_the_timeout_it_recommends():
    """The budget leaves Otter its minute; the worst case of any one item fits the budget after the load."""
    course = load_course()
    gs = course.gradescope
    assert gs.budget_seconds <= gs.timeout_minutes * 60 - 60
    for aid in course.assignments:
        limits = gs.limits.model_dump(exclude_none=True)
        worst = max(worst_seconds(course, aid, item, limits) for item in course.assignment(aid).items)
        assert load_seconds(course, aid, limits) + worst <= gs.budget_seconds, aid


@pytest.mark.parametrize("upload, expected", [
    ({"lab14_transformers.py": "def f(): pass\n"}, "a Python file"),
    ({"lab14_transformers.ipynb": '{"cells": [{"cell_type": "code", "sou'}, "not a readable notebook"),
    ({"work/lab14_transformers.ipynb": "{}"}, "is a folder"),
    ({"a.ipynb": "{}", "b.ipynb": "{}"}, "2 notebooks"),
    ({}, "has no notebook"),
])
def test_an_upload_that_is_not_one_readable_notebook_is_told_to_submit_the_ipynb(tmp_path, upload, expected):
    for name, text in upload.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    message = upload_problem(tmp_path, AID)
    assert expected in message and f"Submit {AID}.ipynb" in message, message


def test_a_readable_notebook_is_no_upload_problem(tmp_path):
    nbformat.write(examples(AID)["empty"], tmp_path / f"{AID}.ipynb")
    (tmp_path / "notes.txt").write_text("extra files do not matter")
    assert upload_problem(tmp_path, AID) == ""


OTHER = "w8l4_transformers"  # another assignment of the course, whose notebook a student uploads to lab14


def write_upload(folder, name, notebook):
    folder.mkdir(parents=True)
    nbformat.write(notebook, folder / name)
    return folder


def test_another_assignments_notebook_is_not_graded_as_this_one_and_the_upload_says_whose_it_is(tmp_path):
    """The zip holds lab14 alone but knows every assignment's own cells (otter_config's `notebooks`): w8l4's
    notebook, under its own name, lab14's or any other, is not graded as lab14, and the student reads whose it is
    and what to submit; lab14's own notebook with its metadata stripped, under another name, still is graded."""
    own = otter_config(AID)["plugins"][0][PLUGIN]["notebooks"]
    assert set(own) == set(load_course().assignments) and all(own.values()), own
    for name in (f"{OTHER}.ipynb", f"{AID}.ipynb", "homework.ipynb"):
        folder = write_upload(tmp_path / name, name, examples(OTHER)["complete"])
        message = upload_problem(folder, AID, own)
        assert f"Your upload, {name}, is a notebook whose cells are {OTHER}'s, not {AID}'s: nothing was graded" \
               in message and f"Submit {AID}.ipynb" in message, message
    stripped = without_metadata(examples(AID)["complete"])
    named = write_upload(tmp_path / "named", f"{OTHER}.ipynb", stripped)
    assert f"is a notebook named {OTHER}.ipynb, not {AID}'s" in upload_problem(named, AID, own)
    assert upload_problem(write_upload(tmp_path / "mine", "homework.ipynb", stripped), AID, own) == ""
    assert upload_problem(write_upload(tmp_path / "own", f"{AID}.ipynb", examples(AID)["empty"]), AID, own) == ""


def test_another_assignments_upload_gets_results_json_with_no_grade_and_the_reason(tmp_path):
    """Through the zip's entry point: results.json scores it 0 as not graded, says whose notebook it is, and
    keeps the cause for the staff; no grading ran (no grader record)."""
    root = autograder_root(tmp_path, examples(OTHER)["complete"])
    result = run_autograder(str(root))
    assert json.loads((root / "results" / "results.json").read_text()) == result
    visible, hidden = by_visibility(result)
    assert result["score"] == 0 and list(visible) == ["Not graded"], result
    assert f"whose cells are {OTHER}'s, not {AID}'s" in result["output"] and f"Submit {AID}.ipynb" in result["output"]
    assert result["extra_data"]["not_graded"] == "the upload" and "seed" not in result["extra_data"]
    assert [t["name"] for t in hidden] == [STAFF_TEST]


def test_otter_run_on_the_zip_does_not_grade_another_assignments_notebook_either(tmp_path):
    """`otter run -a ZIP NOTEBOOK` (the try-it-here command of `course export gradescope`) calls the plugin without
    run_autograder: the plugin itself runs no grading and gives the same reason."""
    path = write_upload(tmp_path / "upload", f"{AID}.ipynb", examples(OTHER)["complete"]) / f"{AID}.ipynb"
    plugin = CourseGrader(str(path), {}, otter_config(AID, "cpu")["plugins"][0][PLUGIN])
    executed = plugin.before_execution(None)
    assert executed.cells == [] and [t["name"] for t in plugin.result["tests"]] == ["Not graded"]
    assert f"whose cells are {OTHER}'s, not {AID}'s" in plugin.result["output"], plugin.result
    assert CourseGrader.record == {"assignment": AID, "not_graded": "the upload"}


def autograder_root(tmp_path, notebook, aid=AID, budget=None):
    """/autograder's layout for the checkout's package: the zip's otter_config.json and one submission."""
    root = tmp_path / "autograder"
    for folder in ("source/tests", "submission", "results"):
        (root / folder).mkdir(parents=True)
    (root / "source" / "otter_config.json").write_text(json.dumps(otter_config(aid, "cpu", budget)))
    (root / "submission_metadata.json").write_text("{}")
    nbformat.write(notebook, root / "submission" / f"{AID}.ipynb")
    return root


def by_visibility(result):
    return {t["name"]: t for t in result["tests"] if t.get("visibility") != "hidden"}, \
        [t for t in result["tests"] if t.get("visibility") == "hidden"]


@pytest.mark.grading
def test_a_grader_failure_still_writes_results_json_saying_the_staff_must_regrade(tmp_path):
    root = autograder_root(tmp_path, examples(AID)["empty"], aid="no_such_assignment")
    run_autograder(str(root))
    result = json.loads((root / "results" / "results.json").read_text())
    visible, hidden = by_visibility(result)
    assert result["score"] == 0 and "must fix it and regrade" in result["output"]
    assert [t["name"] for t in hidden] == [STAFF_TEST] and "no_such_assignment" in hidden[0]["output"]
    assert "no_such_assignment" not in json.dumps(visible), "the cause is for the staff, not the student"


@pytest.mark.grading
@pytest.mark.slow
def test_a_submission_past_the_time_budget_gets_results_json_with_its_points_and_why_the_rest_did_not_run(
        tmp_path):
    """The budget fits every item but the last (its experiment's worst case): graded by Otter with the course's
    plugin, results.json has the other items' full points, the last item's checks at 0 with the reason, and the
    grader's record (isolation, versions, seed, timings) in a hidden test and the top-level extra_data."""
    course = load_course()
    items = list(course.assignment(AID).items)
    assert items[-1] == LAST
    fits = load_seconds(course, AID) + sum(worst_seconds(course, AID, item) for item in items[:-1])
    assert worst_seconds(course, AID, LAST) > 30
    root = autograder_root(tmp_path, examples(AID)["complete"], budget=fits + 30)
    t0 = time.monotonic()
    run_autograder(str(root))
    assert time.monotonic() - t0 < fits + 30
    result = json.loads((root / "results" / "results.json").read_text())
    visible, hidden = by_visibility(result)
    last = {name: t for name, t in visible.items() if name.startswith(f"{LAST}:")}
    assert last and all(t["score"] == 0 and "time budget" in t["output"] for t in last.values()), last
    assert any(name.startswith(f"{LAST}: experiment") for name in last)
    others = [t for name, t in visible.items() if name not in last]
    assert others and all(t["score"] == t["max_score"] > 0 for t in others)
    assert sum(t["max_score"] for t in visible.values()) == course.assignment(AID).total_points
    record = result["extra_data"]
    assert record["not_run"] == [LAST] and record["isolation"] not in ("", None, "none")
    assert {"versions", "seed", "seconds"} <= set(record)
    assert [t["name"] for t in hidden] == [STAFF_TEST] and json.loads(hidden[0]["output"]) == record


REUSE_VENV = os.environ.get("COURSE_REHEARSAL")  # a folder: the rehearsal's environment, built there once, reused


def environment_with_the_pins_in(zip_path, venv, log):
    """The zip's fresh environment (its Python, no system site-packages), built by the rehearsal's own step
    (gradescope_check.build_venv: environment.yml's pip packages, by pip), with setup.sh's pins (torch,
    torchvision) and their dependencies put in first as hard links to this environment's installed files: the
    README's install took the same pins from the same indexes that the rehearsal's pip reaches, and unpacking
    them again (PyPI's torch with its CUDA libraries, 6.3 GB) cost 61 CPU-s where this costs 29 (benchmarks/
    RESULTS.md). Only the pins' closure is linked, so a package the zip's requirements miss is missing here too;
    pip finds the pins met and installs everything else itself, the course's own requirements in setup.sh's
    steps. On another filesystem than this environment's, the files are copied (no unpacking either)."""
    from autograder.integrations.gradescope_check import build_venv, pip_packages
    python, _ = pip_packages(zip_path)
    subprocess.run([shutil.which(f"python{python}"), "-m", "venv", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    own = {norm(d.metadata["Name"]) for d in md.distributions(path=[str(site)])}  # pip, setuptools: venv's, left
    for name in closure(requirements()) - own:
        dist = md.distribution(name)
        for file in dist.files or []:
            source, target = Path(dist.locate_file(file)), site / file
            # not its console scripts (../../bin: their first line names this environment's python)
            if file.parts[0] != ".." and source.is_file() and not target.exists():  # (a namespace's __init__)
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(source, target)
                except OSError:  # another filesystem: a copy, which is still no unpacking
                    shutil.copy2(source, target)
    return build_venv(zip_path, venv, log)


@pytest.mark.grading
@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("python3.11"), reason="the zip's environment wants Python 3.11")
def test_the_rehearsal_builds_the_zip_as_gradescope_does_and_grades_three_uploads(tmp_path, graded_solutions):
    """CI's run of `course export gradescope lab14_transformers --check`
    (autograder/integrations/gradescope_check.py): one fresh environment from the zip's requirements (the pins
    linked in: environment_with_the_pins_in), three uploads each in its own /autograder-like root. On an idle
    2-core machine it was about 105 s of CPU in 150 s, 75 of them building the environment with pip alone
    (COURSE_REHEARSAL=DIR keeps one there for local iteration). The untouched release gets `course grade`'s
    reasons word for word (the half-done notebook's comparison is tests/test_gradescope.py's)."""
    from autograder.integrations.gradescope import export_gradescope
    from autograder.integrations.gradescope_check import rehearse
    zip_path = export_gradescope(AID, tmp_path / "autograder.zip", device="cpu")
    uploads = {}
    for name in ("complete", "empty"):
        uploads[name] = tmp_path / name / f"{AID}.ipynb"
        uploads[name].parent.mkdir()
        nbformat.write(examples(AID)[name], uploads[name])
    uploads["py"] = tmp_path / "py" / f"{AID}.py"
    uploads["py"].parent.mkdir()
    uploads["py"].write_text("def scaled_dot_product_attention(Q, K, V, mask=None):\n    return Q\n")
    t0 = time.monotonic()
    venv = REUSE_VENV or tmp_path / "venv"
    if not REUSE_VENV:
        with open(tmp_path / "venv.log", "w") as log:
            environment_with_the_pins_in(zip_path, venv, log)
    try:
        results = rehearse(zip_path, list(uploads.values()), work=tmp_path / "rehearsal", venv=venv)
    finally:
        if not REUSE_VENV:
            shutil.rmtree(venv, ignore_errors=True)
    print(f"rehearsal: {time.monotonic() - t0:.0f} s")
    got = {name: results[str(path)] for name, path in uploads.items()}
    total = load_course().assignment(AID).total_points
    complete, hidden = by_visibility(got["complete"])
    assert sum(t["score"] for t in complete.values()) == sum(t["max_score"] for t in complete.values()) == total
    assert any("experiment memory_task" in name and t["score"] > 0 for name, t in complete.items())
    assert [t["name"] for t in hidden] == [STAFF_TEST] and got["complete"]["extra_data"]["sessions"] == 1
    # the same checks and points as `course grade` in this checkout (its own training, its own environment)
    assert {name: (t["score"], t["max_score"]) for name, t in complete.items()} == \
        {t["name"]: (t["score"], t["max_score"]) for t in graded_solutions[AID]["tests"]}
    expected_level = "uid" if os.geteuid() == 0 and shutil.which("capsh") else None
    level = got["complete"]["extra_data"]["isolation"]
    assert level == expected_level if expected_level else level not in ("none", None)
    empty, _ = by_visibility(got["empty"])
    assert sum(t["score"] for t in empty.values()) == 0 and sum(t["max_score"] for t in empty.values()) == total
    ours = grade_notebook(uploads["empty"], AID, device="cpu")  # the untouched release: course grade's reasons
    assert {name: (t["score"], t["max_score"], t["output"]) for name, t in empty.items()} == \
        {t["name"]: (t["score"], t["max_score"], t["output"]) for t in ours["tests"]}
    assert got["py"]["score"] == 0 and f"Submit {AID}.ipynb" in got["py"]["output"]
