"""A real nbgrader round trip per assignment: generate, autograde three submissions, feedback, export.

lab14's is docs/TA.md's own TA commands on a fresh clone (tests/test_ta_workflow.py), so it is not repeated here.

The course directory is a temporary copy configured by the repository's own nbgrader_config.py (with its
folders moved into the temporary directory), so TAs' `nbgrader autograde` is exactly what runs here.

The gradings that autograde run under COURSE_PROFILE=rehearsal (set in this process, so that nbgrader, its workers,
the Dask cluster's workers and their sandboxes inherit it): each experiment trains 5 steps on its first seed with
bounds any figure meets, so the complete notebook still scores every point. What is tested is nbgrader's round trip
(scores, outputs, feedback, export), not the figures: the references' full budgets are tests/test_reference_*'s.
"""
import csv
import re
import shutil
from html import unescape
from pathlib import Path

import nbformat
import pytest

from autograder.course.config import ROOT, load_course
from autograder.grading.grade import grade_notebook
from autograder.notebooks.build import HIDDEN_BEGIN, run_nbgrader
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells

pytestmark = pytest.mark.grading
COURSE = load_course()
CONFIG = """
course_config = {repo_config!r}  # run with its own __file__, as nbgrader runs it: it reads course.yaml beside it
exec(compile(open(course_config).read(), course_config, "exec"), {{**globals(), "__file__": course_config}})
c.CourseDirectory.root = {root!r}
c.CourseDirectory.source_directory = "source"
c.CourseDirectory.release_directory = "release"
c.CourseDirectory.submitted_directory = "submitted"
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"
c.CourseDirectory.db_url = "sqlite:///{root}/gradebook.db"
c.TrustedGrade.device = "cpu"
"""


def half_done(aid):
    """Some items right (those without a training experiment, to keep CI quick), one with a planted mistake."""
    from tests.planted import planted, variant_source
    assignment = COURSE.assignment(aid)
    cheap = [i for i in assignment.items if not assignment.experiments_of(i)]
    right = cheap[: max(2, len(cheap) // 2)]
    sources = solved_sources(aid, right)
    wrong_item = right[0]
    name, variant = next(iter(planted(aid)[wrong_item]["wrong"].items()))
    sources[wrong_item] = variant_source(aid, wrong_item, variant)
    return with_cells(release_notebook(aid), sources), wrong_item


def gradebook_scores(root, aid):
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{root}/gradebook.db") as gb:
        return {s.student.id: s.score for s in gb.find_assignment(aid).submissions}


@pytest.mark.slow
@pytest.mark.parametrize("aid", [a for a in COURSE.assignments if a != "lab14_transformers"])  # lab14: TA workflow
def test_generate_autograde_feedback_export(tmp_path, monkeypatch, aid):
    monkeypatch.setenv("COURSE_PROFILE", "rehearsal")  # reaches run_nbgrader's nbgrader and grade_notebook below
    root = tmp_path / "course"
    (root / "source").mkdir(parents=True)
    shutil.copytree(ROOT / "assignments" / aid, root / "source" / aid)
    (root / "nbgrader_config.py").write_text(CONFIG.format(repo_config=str(ROOT / "nbgrader_config.py"),
                                                           root=str(root)))
    proc = run_nbgrader(["generate_assignment", aid, "--force"], root)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    half, wrong_item = half_done(aid)
    submissions = {"alice": with_cells(release_notebook(aid), solved_sources(aid)),
                   "bob": release_notebook(aid),
                   "carol": half}
    for student, nb in submissions.items():
        folder = root / "submitted" / student / aid
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{aid}.ipynb")
    proc = run_nbgrader(["autograde", aid, "--force"], root)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    total = COURSE.assignment(aid).total_points
    course_grade = grade_notebook(root / "submitted" / "carol" / aid / f"{aid}.ipynb", aid, device="cpu")
    scores = gradebook_scores(root, aid)
    assert scores["alice"] == pytest.approx(total)
    assert scores["bob"] == 0
    assert scores["carol"] == pytest.approx(course_grade["score"])
    assert 0 < scores["carol"] < total

    proc = run_nbgrader(["generate_feedback", aid, "--force"], root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    html = (root / "feedback" / "carol" / aid / f"{aid}.html").read_text()
    text = re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html)))  # what a student reads on the page
    failing = [t for t in course_grade["tests"] if t["item"] == wrong_item and t["score"] < t["max_score"]]
    assert failing, "the planted mistake must lose points"
    first_line = re.sub(r"\s+", " ", failing[0]["output"].splitlines()[0])
    assert first_line[:60] in text, first_line
    assert HIDDEN_BEGIN not in html and "The hidden checks run outside" not in html
    assert "import solutions" not in html and "pytest.mark.item" not in html and "def test_" not in html

    proc = run_nbgrader(["export", "--to", str(tmp_path / "grades.csv")], root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(tmp_path / "grades.csv") as grades:
        rows = list(csv.DictReader(grades))
    assert sorted(r["student_id"] for r in rows) == ["alice", "bob", "carol"]
    by_student = {r["student_id"]: float(r["score"]) for r in rows}
    assert by_student == pytest.approx(scores)


def autograded_outputs(root, aid, student):
    """The text each test cell of the student's autograded notebook shows."""
    nb = nbformat.read(root / "autograded" / student / aid / f"{aid}.ipynb", as_version=4)
    return {c.metadata.get("nbgrader", {}).get("grade_id"): [o.get("text", o.get("data")) for o in c.outputs]
            for c in nb.cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")}


@pytest.fixture(scope="module")
def generated_lab14(tmp_path_factory):
    """lab14's nbgrader course after `nbgrader generate_assignment` (its release and gradebook), made once for this
    module's tests: each autogrades in a copy of its own (copy_of), as a course generated anew would."""
    root = tmp_path_factory.mktemp("generated") / "course"
    (root / "source").mkdir(parents=True)
    shutil.copytree(ROOT / "assignments" / "lab14_transformers", root / "source" / "lab14_transformers")
    copy_of(root, root)
    proc = run_nbgrader(["generate_assignment", "lab14_transformers", "--force"], root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def copy_of(generated, root):
    """The generated course copied to `root`, its nbgrader_config.py naming `root` (its folders, its gradebook)."""
    if root != generated:
        shutil.copytree(generated, root)
    (root / "nbgrader_config.py").write_text(CONFIG.format(repo_config=str(ROOT / "nbgrader_config.py"),
                                                           root=str(root)))
    return root


# `nbgrader` as a TA runs it, then which modules its process had loaded (the workers grade: it only dispatches).
NBGRADER_PROBE = r'''
import atexit, json, sys
if __name__ == "__main__":
    atexit.register(lambda: print("modules: " + json.dumps({m: m in sys.modules for m in ("torch", "pytest")})))
    from nbgrader.apps.nbgraderapp import main
    main()
'''


@pytest.mark.slow
def test_autograde_on_all_cores_or_a_dask_cluster_writes_the_gradebook_of_one_by_one(tmp_path, monkeypatch,
                                                                                     generated_lab14):
    """`nbgrader autograde` grades the class at once (CourseAutograde.workers, or CourseAutograde.scheduler: a
    running Dask cluster) and writes what one-by-one writes: the same scores, the same test-cell outputs; a student
    it cannot grade is reported by all, and costs no other. On this machine's workers nbgrader's own process imports
    neither torch nor pytest (its workers grade, and compute the grader identity it checks their results with)."""
    import os
    import subprocess
    import sys

    from tests.test_cluster import DaskCluster
    aid = "lab14_transformers"
    half, _ = half_done(aid)
    monkeypatch.setenv("COURSE_PROFILE", "rehearsal")  # in `env` below, and the Dask cluster's (os.environ)
    (tmp_path / "dask").mkdir()
    cluster = DaskCluster(tmp_path / "dask")
    logs, roots = {}, {}
    runs = {2: ["--CourseAutograde.workers=2"], "dask": [f"--CourseAutograde.scheduler={cluster.file}"],
            1: ["--CourseAutograde.workers=1"]}
    try:
        for workers, option in runs.items():
            root = roots[workers] = copy_of(generated_lab14, tmp_path / f"course{workers}")
            for student, nb in {"alice": with_cells(release_notebook(aid), solved_sources(aid)),
                                "bob": release_notebook(aid), "carol": half}.items():
                (root / "submitted" / student / aid).mkdir(parents=True)
                nbformat.write(nb, root / "submitted" / student / aid / f"{aid}.ipynb")
            dave = root / "submitted" / "dave" / aid  # two notebooks, neither under the released name: not graded
            dave.mkdir(parents=True)
            for name in ("draft.ipynb", "final.ipynb"):
                nbformat.write(half, dave / name)
            env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
            probe = tmp_path / "nbgrader_probe.py"
            probe.write_text(NBGRADER_PROBE)
            nbgrader = [str(probe)] if workers == 2 else ["-m", "nbgrader"]
            proc = subprocess.run([sys.executable, *nbgrader, "autograde", aid, "--force", *option], cwd=root,
                                  env=env, capture_output=True, text=True)
            if workers == "dask":
                cluster.close()  # its two workers' cores back for the one-by-one run
            logs[workers] = proc.stdout + proc.stderr
            assert proc.returncode != 0 and "student 'dave': not graded" in logs[workers], logs[workers][-3000:]
    finally:
        cluster.close()
    for parallel in (2, "dask"):  # graded at once, taken by nbgrader
        assert logs[parallel].count("pre-graded result taken") == 3, logs[parallel][-3000:]
    assert 'modules: {"torch": false, "pytest": false}' in logs[2], logs[2][-3000:]
    assert "on the cluster at " in logs["dask"] and "cluster: tcp://127.0.0.1:" in logs["dask"], logs["dask"][-3000:]
    assert "pre-graded result taken" not in logs[1] and "at once" not in logs[1]
    scores = gradebook_scores(roots[1], aid)
    assert scores["alice"] == pytest.approx(COURSE.assignment(aid).total_points) and scores["bob"] == 0
    for parallel in (2, "dask"):
        assert gradebook_scores(roots[parallel], aid) == scores, parallel
        for student in ("alice", "bob", "carol"):
            assert autograded_outputs(roots[parallel], aid, student) == autograded_outputs(roots[1], aid, student), \
                (parallel, student)
    # one student's assignment (`--student`, formgrader's Autograde button) starts no pool, whatever the workers
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "autograde", aid, "--student", "carol", "--force",
                           "--CourseAutograde.workers=2"], cwd=roots[2], env=env, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "at once" not in log and "pre-graded result taken" not in log, log[-3000:]
    assert gradebook_scores(roots[2], aid)["carol"] == scores["carol"]


def test_autograde_on_a_cluster_that_does_not_answer_is_one_line_and_scores_nobody(tmp_path, generated_lab14):
    """`--CourseAutograde.scheduler` naming a cluster nobody runs: nbgrader stops with the one line naming it, no
    traceback, no autograded notebook left (the collecting walk's copies removed) and no grade in the gradebook."""
    import os
    import subprocess
    import sys
    aid = "lab14_transformers"
    root = copy_of(generated_lab14, tmp_path / "course")
    for student in ("alice", "bob"):
        (root / "submitted" / student / aid).mkdir(parents=True)
        nbformat.write(with_cells(release_notebook(aid), solved_sources(aid)),
                       root / "submitted" / student / aid / f"{aid}.ipynb")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"}
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "autograde", aid,
                           "--CourseAutograde.scheduler=tcp://127.0.0.1:9"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "the Dask scheduler at tcp://127.0.0.1:9 did not answer" in log, log[-3000:]
    assert "Traceback" not in log and "pre-graded result taken" not in log, log[-3000:]
    assert not list((root / "autograded").rglob("*.ipynb")), "a notebook was autograded"
    assert not any(gradebook_scores(root, aid).values()), gradebook_scores(root, aid)
