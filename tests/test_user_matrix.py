"""What users run, on each assignment: the verbs of README.md and docs/, in their cheap forms, where no other test
runs them.

What tests/ covers, verb x assignment (this file adds the cells marked *here*):

| verb                            | w8l1_attention_vision   | w8l4_transformers       | lab14_transformers           |
|---------------------------------|-------------------------|-------------------------|------------------------------|
| course grade NOTEBOOK           | here                    | here                    | test_lifecycle               |
| course grade FOLDER, --items    | here                    | here                    | test_batch, test_lifecycle   |
| --results-dir rerun, --csv      | here                    | here                    | test_batch, test_ta_workflow |
| --workers N                     | here                    | here                    | test_batch                   |
| course report                   | here (+ experiment)     | here                    | test_ta_workflow             |
| pytest SUITE --submission NB    | here                    | here                    | test_pytest_plugin           |
| course release (CLI, gradebook) | test_course_root        | test_course_root        | test_course_root             |
| nbgrader generate_assignment    | test_course_root        | test_course_root        | test_course_root             |
| export gradescope + otter run   | here                    | here                    | test_gradescope              |
| nbgrader autograde, feedback    | test_nbgrader_roundtrip | test_nbgrader_roundtrip | test_ta_workflow             |
| nbgrader export                 | test_nbgrader_roundtrip | test_nbgrader_roundtrip | test_ta_workflow             |
| course experiments (CLI)        | here (one, short)       | here (one, short)       | here (one, short)            |
| experiments, reference          | test_reference_w8l1     | test_grading            | test_grading                 |

Measured (2 cores, busy): `--workers 2` adds ~5 s of CPU per spawned worker (torch and a sandbox zygote);
`course release` runs nbgrader, 7-11 s; an export with `otter run`, 15-25 s; `course experiments` at 5 steps, < 1 s.

Cheap forms: one or two items per assignment (`--items`), an experiment cut to a few steps by a test-only
course.yaml (COURSE_CONFIG), the verbs called in this process (cli.main, pytest.main: the same code as the
commands, without a fresh interpreter importing torch) except `otter run`, which is its own program.
"""
import csv
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
import yaml

from autograder import cli
from autograder.course.config import ROOT, load_course
from autograder.grading.suite_files import suite_path
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells

pytestmark = pytest.mark.grading
COURSE = load_course()
# the items each case grades: cheap checks, and for w8l1 an experiment whose lecture metric has no threshold
ITEMS = {"w8l1_attention_vision": ["local_attention", "corrupt"], "w8l4_transformers": ["mha_cost"]}
W8L1 = "w8l1_attention_vision"
MATRIX = list(ITEMS)
SHORT_STEPS = 5
OTTER = Path(sys.executable).with_name("otter")


def short_course(folder, experiments, reachable=False):
    """course.yaml with only these experiments, each cut to SHORT_STEPS on its first seed (for COURSE_CONFIG);
    `reachable`: their thresholds lowered to what any measurement meets, so that the reference passes."""
    raw = yaml.safe_load(COURSE.path.read_text())
    raw["data"]["mnist_dir"] = str(COURSE.mnist_dir)
    for aid, assignment in raw["assignments"].items():
        kept = {n: e for n, e in assignment.get("experiments", {}).items() if (aid, n) in experiments}
        for exp in kept.values():
            exp["steps"], exp["seeds"] = SHORT_STEPS, exp["seeds"][:1]
            if reachable:
                exp["threshold"] = {metric: {"min": -1e30} for metric in exp["threshold"]}
        assignment["experiments"] = kept
    path = folder / "course.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def submissions(folder, aid):
    """folder/<student>/<aid>.ipynb: the reference (complete) and the release untouched (empty)."""
    paths = {}
    for student, nb in (("complete", with_cells(release_notebook(aid), solved_sources(aid))),
                        ("empty", release_notebook(aid))):
        paths[student] = folder / student / f"{aid}.ipynb"
        paths[student].parent.mkdir(parents=True)
        nbformat.write(nb, paths[student])
    return paths


def course(capsys, *args):
    """`course ARGS` (cli.main): exit code and what it printed."""
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def without_timings(result):
    result = json.loads(json.dumps(result))
    result["extra_data"].pop("seconds", None)
    result["extra_data"].pop("grading", None)  # the results folder's own bookkeeping
    for test in result["tests"]:
        test.pop("seconds", None)
    return result


@pytest.fixture
def quick_experiments(tmp_path, monkeypatch):
    """Only w8l1's dae_mnist (dae_mse: a metric with a lecture figure and no threshold), a few steps; cached, so
    that it trains once and the later gradings of the same notebook read it."""
    monkeypatch.setenv("COURSE_CONFIG", str(short_course(tmp_path, {(W8L1, "dae_mnist")}, reachable=True)))


@pytest.mark.parametrize("aid", MATRIX)
def test_course_grade_a_folder_rerun_csv_a_notebook_the_pytest_command_and_report(
        tmp_path, capsys, quick_experiments, aid):
    items, assignment = ITEMS[aid], COURSE.assignment(aid)
    full = sum(assignment.item_points(i) for i in items)
    subs = submissions(tmp_path / "submitted", aid)
    results, table = tmp_path / "graded", tmp_path / "grades.csv"
    args = [tmp_path / "submitted", "-a", aid, "--items", ",".join(items), "--device", "cpu", "--results-dir", results]

    code, out, err = course(capsys, "grade", *args, "--csv", table, "--workers", 2)  # two spawned grader processes
    assert code == 0, out + err
    with open(table) as grades:
        rows = {r["submission"]: r for r in csv.DictReader(grades)}
    assert {n: float(r["score"]) for n, r in rows.items()} == {"complete": full, "empty": 0}, out
    assert all(float(r["max_score"]) == full for r in rows.values())
    assert all(float(rows["complete"][i]) == assignment.item_points(i) for i in items), rows
    saved = {p.stem: json.loads(p.read_text()) for p in results.glob("*.json")}
    assert set(saved) == {"complete", "empty"}

    code, out, err = course(capsys, "grade", *args, "--csv", tmp_path / "again.csv")  # the rerun: nothing regraded
    assert code == 0 and "0 graded, 2 reused" in out, out + err
    assert (tmp_path / "again.csv").read_text() == table.read_text()

    one = tmp_path / "one.json"
    code, out, err = course(capsys, "grade", subs["complete"], "-a", aid, "--items", ",".join(items), "--device", "cpu",
                            "--json", one)
    assert code == 0, out + err
    a, b = without_timings(json.loads(one.read_text()))["extra_data"], without_timings(saved["complete"])["extra_data"]
    assert a == b, json.dumps({k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)})[:3000]
    assert without_timings(json.loads(one.read_text())) == without_timings(saved["complete"])

    # the TA's pytest command on the same notebook (the entry-point plugin, pytest's own options)
    session = tmp_path / "session.json"
    keyword = " or ".join(items)
    code = pytest.main([str(suite_path(aid)), "--submission", str(subs["complete"]), "--device", "cpu", "-k", keyword,
                        "--results-json", str(session), "-p", "no:cacheprovider", "-p", "no:timeout", "-o", "addopts=",
                        "-q"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert f"{aid}: {full:g} / {full:g} points" in out
    assert without_timings(json.loads(session.read_text())) == without_timings(saved["complete"])

    page = tmp_path / "report.html"
    code, out, err = course(capsys, "report", results, "-o", page)
    assert code == 0, out + err
    html = page.read_text()
    assert "2 submissions" in html and all(i in html for i in items)
    for exp in (e for i in items for e in assignment.experiments_of(i)):
        assert f"Experiment {exp.name}" in html and "measured for 1 " in html, f"{exp.name} is not in the report"


@pytest.mark.slow
@pytest.mark.parametrize("aid", MATRIX)
def test_export_gradescope_and_otter_run(tmp_path, capsys, monkeypatch, aid):
    """The zip holds the assignment's suite, harness, release and course.yaml, and MNIST where it reads it (w8l1
    alone); `otter run` on the untouched release gives one visible test per check of course.yaml, each with no
    points.

    Under a test-only course.yaml with the assignment's experiments cut to SHORT_STEPS on their first seed: the
    export ships the reference's curves, which it trains for every seed the graded solution did not reach (two
    full-budget trainings on w8l4, a minute), and what is in them is checked in tests/test_gradescope_curves.py."""
    short = short_course(tmp_path, {(aid, name) for name in COURSE.assignment(aid).experiments})
    monkeypatch.setenv("COURSE_CONFIG", str(short))
    zip_path = tmp_path / "autograder.zip"
    code, out, err = course(capsys, "export", "gradescope", aid, "-o", zip_path, "--device", "cpu")
    assert code == 0, out + err
    with zipfile.ZipFile(zip_path) as zf:
        names = set(zf.namelist())
        exported = yaml.safe_load(zf.read("course/course.yaml"))
        assert zf.read(f"course/release/{aid}/{aid}.ipynb") == (ROOT / "release" / aid / f"{aid}.ipynb").read_bytes()
    assert exported["assignments"][aid] == yaml.safe_load(short.read_text())["assignments"][aid]  # the one in effect
    for needed in (f"autograder/suites/test_{aid}.py", f"autograder/harness/{aid}.py", f"solutions/{aid}.py"):
        assert f"course/{needed}" in names, needed
    reads_mnist = "load_mnist" in (ROOT / "autograder" / "harness" / f"{aid}.py").read_text()
    assert reads_mnist == (aid == W8L1)
    assert any(n.startswith("course/data/mnist/t10k-images") for n in names) == reads_mnist
    if reads_mnist:
        assert exported["data"]["mnist_dir"] == "data/mnist"

    empty = tmp_path / "empty" / f"{aid}.ipynb"
    empty.parent.mkdir()
    nbformat.write(release_notebook(aid), empty)
    (tmp_path / "out").mkdir()
    monkeypatch.delenv("COURSE_CONFIG")  # `otter run` grades with the zip's own course.yaml, as Gradescope does
    run = subprocess.run([str(OTTER), "run", "-a", str(zip_path), "-o", str(tmp_path / "out"), str(empty)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    theirs = json.loads((tmp_path / "out" / "results.json").read_text())
    assignment = COURSE.assignment(aid)
    checks = [f"{i}: {k}" for i, spec in assignment.items.items() for k in spec.points] + \
             [f"{e.item}: experiment {e.name}" for e in assignment.experiments.values() if e.graded]
    assert sorted(t["name"] for t in theirs["tests"]) == sorted(checks)
    assert sum(t["max_score"] for t in theirs["tests"]) == pytest.approx(assignment.total_points)
    assert all(t["score"] == 0 and t["output"] and t["visibility"] == "visible" for t in theirs["tests"])


@pytest.mark.parametrize("aid, name", [(W8L1, "ae_mnist"), ("w8l4_transformers", "reverse_transformer"),
                                       ("lab14_transformers", "memory_task")])
def test_course_experiments_runs_the_reference_and_prints_each_row(tmp_path, monkeypatch, capsys, aid, name):
    """`course experiments ID` with a course.yaml of one experiment cut to a few steps: its row, beside the
    lecture's figure and the threshold, and exit 1 when the short run misses the threshold (it does)."""
    monkeypatch.setenv("COURSE_CONFIG", str(short_course(tmp_path, {(aid, name)})))
    monkeypatch.setenv("COURSE_NO_CACHE", "1")
    code, out, err = course(capsys, "experiments", aid)
    exp = COURSE.assignment(aid).experiments[name]
    [row] = [line for line in out.splitlines() if line.startswith(f"{aid}.{name}")]
    assert f"(lecture {exp.lecture[exp.metric]:g})" in row and f"[{exp.threshold[exp.metric]}]" in row, row
    assert code == 1 and "MISSED" in row, out + err
