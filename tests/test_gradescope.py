"""Gradescope and Otter-Grader: the exported zip grades exactly as `course grade` does, executes none of the
student's code outside the sandbox, holds everything it needs, and the grader degrades without CAP_SYS_ADMIN."""
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from autograder.course.config import load_course
from autograder.grading.grade import grade_notebook
from autograder.integrations.gradescope import COURSE_DIR, export_gradescope, requirements
from autograder.notebooks.examples import examples, release_notebook, solved_sources, with_cells
from autograder.notebooks.identify import own_cell_ids
from autograder.sandbox.grader_side import can_isolate

pytestmark = [pytest.mark.grading, pytest.mark.slow]  # every test builds or runs an Otter grading
AID = "lab14_transformers"
SDPA = "scaled_dot_product_attention"
OTTER = Path(sys.executable).with_name("otter")


@pytest.fixture(scope="module")
def autograder_zip(tmp_path_factory):
    return export_gradescope(AID, tmp_path_factory.mktemp("export") / "autograder.zip", device="cpu")


@pytest.fixture(scope="module")
def submissions(tmp_path_factory):
    folder = tmp_path_factory.mktemp("submissions")
    made = {name: nb for name, nb in examples(AID).items() if name == "partly_right"}
    out = {}
    for name, nb in made.items():
        out[name] = folder / name / f"{AID}.ipynb"
        out[name].parent.mkdir()
        nbformat.write(nb, out[name])
    return out


def by_test(results_json):
    """name -> (score, max_score, output) of the per-check tests in a results.json (not the staff's hidden record)."""
    return {t["name"]: (t["score"], t["max_score"], t["output"]) for t in results_json["tests"]
            if t.get("visibility") != "hidden"}


def otter_run(zip_path, notebook, out_dir):
    out_dir.mkdir(parents=True, exist_ok=True)
    run = subprocess.run([str(OTTER), "run", "-a", str(zip_path), "-o", str(out_dir), str(notebook)],
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads((out_dir / "results.json").read_text())


def test_otter_run_gives_the_same_scores_and_reasons_as_course_grade(autograder_zip, submissions, tmp_path):
    """A half-done notebook (the complete and the untouched release: the rehearsal, test_gradescope_build)."""
    ours = grade_notebook(submissions["partly_right"], AID, device="cpu")
    theirs = otter_run(autograder_zip, submissions["partly_right"], tmp_path / "out")
    assert by_test(theirs) == by_test(ours)
    assert all(t["visibility"] == "visible" for t in theirs["tests"])
    assert "stdout_visibility" not in theirs or theirs["stdout_visibility"] == "hidden"
    assert 0 < sum(t["score"] for t in theirs["tests"]) < ours["max_score"]


CHEATS = '''import json, os, torch
torch.allclose = lambda *a, **k: True
for folder in ("../results", "/autograder/results", "."):
    try:
        json.dump({"score": 100, "tests": []}, open(os.path.join(folder, "results.json"), "w"))
    except OSError:
        pass
open("/tmp/otter-ran-the-student-code-%s" % os.getpid(), "w").close()
'''


def test_through_otter_a_cheating_submission_gains_nothing_and_no_student_code_runs_outside_the_sandbox(
        autograder_zip, tmp_path):
    """A wrong answer plus a notebook cell that patches torch.allclose, forges results.json and leaves a mark."""
    sources = solved_sources(AID)
    sources[SDPA] = sources[SDPA].replace("/ math.sqrt(d_k)", "", 1)
    nb = with_cells(release_notebook(AID), sources)
    nb.cells.append(nbformat.v4.new_code_cell(CHEATS))
    path = tmp_path / "cheat" / f"{AID}.ipynb"
    path.parent.mkdir()
    nbformat.write(nb, path)
    marks_before = set(Path("/tmp").glob("otter-ran-the-student-code-*"))
    theirs = otter_run(autograder_zip, path, tmp_path / "out")
    ours = grade_notebook(path, AID, device="cpu", experiments=True)
    assert by_test(theirs) == by_test(ours)
    lost = {name for name, (score, max_score, _) in by_test(theirs).items() if score < max_score}
    assert lost and all(name.startswith((SDPA, "manual_multihead")) for name in lost), lost
    assert set(Path("/tmp").glob("otter-ran-the-student-code-*")) == marks_before, \
        "Otter's kernel (or the grader) ran the student's code outside the sandbox"


def test_the_zip_holds_what_the_grader_needs(autograder_zip):
    """The course's copy, its setup steps and Otter's configuration. Running it, unpacked into /autograder's layout
    in the environment its own setup installs: tests/test_gradescope_build.py (the rehearsal)."""
    with zipfile.ZipFile(autograder_zip) as zf:
        names = set(zf.namelist())
        setup = zf.read("setup.sh").decode()
        environment = zf.read("environment.yml").decode()
        config = json.loads(zf.read("otter_config.json"))
        run_otter = zf.read("run_otter.py").decode()
    for needed in ("run_autograder", "run_otter.py", "tests/", f"{COURSE_DIR}/course.yaml",
                   f"{COURSE_DIR}/pyproject.toml", f"{COURSE_DIR}/solutions/{AID}.py",
                   f"{COURSE_DIR}/autograder/suites/test_{AID}.py", f"{COURSE_DIR}/autograder/grading/plugin.py",
                   f"{COURSE_DIR}/autograder/harness/{AID}.py", f"{COURSE_DIR}/autograder/harness/training.py",
                   f"{COURSE_DIR}/autograder/harness/adam.py",
                   f"{COURSE_DIR}/autograder/sandbox/child/__main__.py",
                   f"{COURSE_DIR}/autograder/sandbox/child/server.py",
                   f"{COURSE_DIR}/release/{AID}/{AID}.ipynb"):
        assert needed in names, needed
    assert not any("/data/mnist/" in n for n in names), "lab14's harness reads no MNIST"
    harness = {n.rsplit("/", 1)[1] for n in names if "/autograder/harness/" in n}
    # the shared loop and its optimizer, and no other assignment's harness modules
    assert harness == {"__init__.py", "adam.py", "training.py", f"{AID}.py"}, harness
    for pin in requirements():  # installed by setup.sh, the CPU build first; not PyPI's CUDA build from environment.yml
        assert pin in setup and pin not in environment
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in setup
    assert "python=3.11" in environment
    assert f"pip install -e /autograder/source/{COURSE_DIR}" in setup and "load_mnist()" not in setup
    assert "autograder.integrations.otter_plugin import run_autograder" in run_otter
    budget = load_course().gradescope.budget_seconds
    assert config["plugins"] == [{"autograder.integrations.otter_plugin.CourseGrader": {
        "assignment": AID, "device": "cpu", "budget_seconds": budget,
        "notebooks": {a: sorted(ids) for a, ids in own_cell_ids(load_course()).items()}}}]


UID_LEVEL_CASES = """
import json, sys
import nbformat
from autograder.grading.grade import grade_notebook
from tests.test_corpus import AID, LIMITS, MMD, SDPA, WRONG_SDPA, append, prepend_body, replace, solved
cases = {
    "complete": (lambda nb: None, {}),
    "forks_in_a_loop": (prepend_body(MMD, "import os\\nwhile True:\\n    os.fork()"), {"processes": 64}),
    "spawns_a_background_process": (append(MMD, "import subprocess\\n_p = subprocess.Popen(['sleep', '601'], "
                                                 "start_new_session=True)"), {}),
    "patched_torch_allclose": (lambda nb: (replace(SDPA, *WRONG_SDPA)(nb, None),
                                           append(SDPA, "torch.allclose = lambda *a, **k: True")(nb, None)), {}),
}
out = {}
for name, (edit, limits) in cases.items():
    nb = solved()
    edit(nb) if name in ("complete", "patched_torch_allclose") else edit(nb, None)
    path = sys.argv[1] + "/" + name + ".ipynb"
    nbformat.write(nb, path)
    out[name] = grade_notebook(path, AID, device="cpu", experiments=False, limits={**LIMITS, **limits})
json.dump(out, open(sys.argv[1] + "/results.json", "w"))
"""


@pytest.mark.skipif(not can_isolate() or not shutil.which("capsh"), reason="needs root and capsh")
def test_without_cap_sys_admin_the_grader_degrades_to_a_fresh_uid_and_its_limits_still_hold(tmp_path):
    """As in a Docker-default container (Gradescope, `otter grade`): no namespaces, still a fresh uid, so the
    process limit, the kill by uid and the grader's own comparisons hold; the solution keeps full marks."""
    from autograder.reports.tables import item_summary
    from tests.test_corpus import MMD, POINTS, WRONG_LOST, _cmdline
    script = tmp_path / "cases.py"
    script.write_text(UID_LEVEL_CASES)
    run = subprocess.run(["capsh", "--drop=cap_sys_admin", "--", "-c", f"{sys.executable} {script} {tmp_path}"],
                         capture_output=True, text=True, timeout=900, cwd=Path(__file__).parent.parent,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    lost = {name: {i: POINTS[i] - s for i, (s, _, _) in item_summary(r).items() if s < POINTS[i]}
            for name, r in results.items()}
    assert {name: r["extra_data"]["isolation"] for name, r in results.items()} == dict.fromkeys(results, "uid")
    assert lost == {"complete": {}, "forks_in_a_loop": {MMD: 3}, "spawns_a_background_process": {},
                    "patched_torch_allclose": {item: n for item, n in WRONG_LOST.items() if n}}
    assert "process limit" in json.dumps(results["forks_in_a_loop"])
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p) == "sleep 601"]
    assert not left, "a process the submission started outlived its grading"
