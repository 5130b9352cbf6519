"""The release: in sync with solutions/ and course.yaml, its checks catch leaks, and it runs as students run it."""
import copy
import json
import os
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from autograder.course.config import ROOT, load_course
from autograder.course.profiles import ENV as PROFILE_ENV
from autograder.errors import ConfigError
from autograder.notebooks.build import (
    BEGIN,
    HIDDEN_BEGIN,
    WRITTEN_LINE,
    item_cell,
    solve,
    sync,
    sync_written,
    verify,
)
from autograder.notebooks.cells import nbgrader_meta
from tests.test_public_checks import table

COURSE = load_course()
AIDS = list(COURSE.assignments)


def normalised(path):
    """A notebook's JSON with its keys sorted, to compare two notebooks as nbgrader wrote them."""
    return json.dumps(json.loads(Path(path).read_text()), sort_keys=True, indent=1)


def execute(path, timeout, allow_errors=False, quick=False):
    """build.execute in a fresh Python process, as `course solve` and a student's Jupyter run it.

    `quick` sets COURSE_QUICK_RUN=1 in the kernel: every cell runs, the demos train for a few steps only.
    (The stalls once blamed on running in an xdist worker were the missed wake-up that kernel_client.py guards
    against; a fresh process also keeps earlier tests' event loops and signal handlers out of the run.)
    """
    import subprocess
    import sys
    out = path.with_name(path.stem + ".executed.ipynb")
    code = ("import sys, nbformat; from autograder.notebooks.build import execute; "
            "nbformat.write(execute(sys.argv[1], timeout=int(sys.argv[3]), allow_errors=sys.argv[4] == '1'), "
            "sys.argv[2])")
    proc = subprocess.run([sys.executable, "-c", code, str(path), str(out), str(timeout), str(int(allow_errors))],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout * 3,
                          env={**os.environ, "COURSE_QUICK_RUN": "1" if quick else "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return nbformat.read(out, as_version=4)


def self_check_rows(nb, aid):
    """The self-check table printed by the notebook's last code cell, checked against the notebook and course.yaml:
    one row per test cell in notebook order with the item's points, and the total; returns {item: status}."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[-1].source.strip() == "self_check()", "the last code cell should be the self-check"
    outputs = code[-1].get("outputs", [])
    assert not [o for o in outputs if o.get("output_type") == "error"], outputs
    rows = table("".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream"))
    tests = [nbgrader_meta(c)["grade_id"][5:] for c in code if nbgrader_meta(c).get("grade_id", "").startswith("test_")]
    assignment = COURSE.assignment(aid)
    assert [(item, points) for item, _, points in rows[:-1]] == [
        (item, f"{assignment.item_points(item):g}") for item in tests], rows
    assert sorted(tests) == sorted(assignment.items)
    assert rows[-1][0] == "total" and rows[-1][2] == f"{assignment.total_points:g}", rows[-1]
    return {item: status for item, status, _ in rows[:-1]}


@pytest.mark.parametrize("aid", AIDS)
def test_source_notebooks_are_in_sync_with_solutions_and_course_yaml(aid):
    assert sync(aid, write=False) == [], f"run `course sync {aid}`: graded cells or points are out of date"


@pytest.mark.parametrize("where", ["assignments", "release"])
@pytest.mark.parametrize("aid", AIDS)
def test_every_written_question_is_a_manually_graded_cell_worth_its_points_in_course_yaml(aid, where):
    """Every `answer_*` cell of the source and of the release, and only those, is a written answer of course.yaml,
    manually graded (grade and solution, unlocked) and worth its points there, and its question says so."""
    nb = nbformat.read(ROOT / where / aid / f"{aid}.ipynb", as_version=4)
    written = COURSE.assignment(aid).written
    answers = {nbgrader_meta(c)["grade_id"]: (k, c) for k, c in enumerate(nb.cells)
               if nbgrader_meta(c).get("grade_id", "").startswith("answer_")}
    assert sorted(answers) == sorted(written), f"{aid}: the notebook's written answers and course.yaml's"
    for gid, (index, answer) in answers.items():
        meta = nbgrader_meta(answer)
        assert answer.cell_type == "markdown" and meta["grade"] and meta["solution"] and not meta["locked"], gid
        assert meta["points"] == written[gid].points, f"{gid}: {meta['points']} points, course.yaml says " \
                                                      f"{written[gid].points}"
        question = next(c for c in reversed(nb.cells[:index]) if c.cell_type == "markdown" and not nbgrader_meta(c))
        points = written[gid].points
        assert f"*Written answer: {points:g} point" in question.source, f"{gid}: the question hides its points"


def test_sync_names_a_written_answer_course_yaml_does_not_list(tmp_path, monkeypatch):
    """An `answer_*` cell without points in course.yaml, and a listed answer without a cell, are one error each
    naming them, before anything is written."""
    aid = "lab14_transformers"
    text = (ROOT / "course.yaml").read_text()
    gone = first_written(aid)
    start = text.index(f"      {gone}:")
    end = text.index("      answer_", start + 1)
    config = tmp_path / "course.yaml"
    config.write_text(text[:start] + text[end:])
    monkeypatch.setenv("COURSE_CONFIG", str(config))
    nb = nbformat.read(ROOT / "assignments" / aid / f"{aid}.ipynb", as_version=4)
    with pytest.raises(ConfigError, match=f"without points in course.yaml's `written:`: {gone}"):
        sync_written(aid, nb)
    other = list(COURSE.assignment(aid).written)[1]
    nb.cells.remove(cell(nb, gone))
    nb.cells.remove(cell(nb, other))
    with pytest.raises(ConfigError, match=f"names cells the notebook does not have: {other}"):
        sync_written(aid, nb)


def test_the_rules_cell_follows_a_forbidden_reference_added_in_course_yaml(tmp_path, monkeypatch):
    """The rules cell is what `course sync` writes from course.yaml (the committed notebook already carries it), and
    a reference that course.yaml newly forbids an item reaches the cell's text at the next sync."""
    import yaml

    from autograder.notebooks.rules import RULES, sync_rules
    aid, item = "w8l1_attention_vision", "attention_context"
    nb = nbformat.read(ROOT / "assignments" / aid / f"{aid}.ipynb", as_version=4)
    assert sync_rules(aid, nb) == []
    raw = yaml.safe_load((ROOT / "course.yaml").read_text())
    raw["assignments"][aid]["items"][item]["from_scratch"].append("mse_loss")
    (tmp_path / "course.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.setenv("COURSE_CONFIG", str(tmp_path / "course.yaml"))
    assert sync_rules(aid, nb) == [RULES]
    rules = next(c.source for c in nb.cells if c.metadata.get("course", {}).get("generated") == RULES)
    assert f"* `{item}`: `F.scaled_dot_product_attention`, `nn.MultiheadAttention`, `F.mse_loss`\n" in rules, rules


# That the committed release is what `course release` makes now: tests/test_course_root.py, per assignment.
@pytest.mark.parametrize("aid", AIDS)
def test_the_committed_release_passes_every_check(aid):
    assert verify(aid, ROOT / "release" / aid) == []


def leaked_copy(tmp_path, aid, damage):
    folder = tmp_path / aid
    shutil.copytree(ROOT / "release" / aid, folder)
    path = folder / f"{aid}.ipynb"
    nb = nbformat.read(path, as_version=4)
    damage(nb, folder)
    nbformat.write(nb, path)
    return folder


def cell(nb, gid):
    return next(c for c in nb.cells if nbgrader_meta(c).get("grade_id") == gid)


def first_written(aid):
    return next(iter(COURSE.assignment(aid).written))


def first_solution_line(aid, item):
    stub = set(item_cell(aid, item, solved=False).splitlines())
    return next(line for line in item_cell(aid, item, solved=True).splitlines()
                if line not in stub and len(line.strip()) > 20 and not line.strip().startswith("#"))


DAMAGES = {
    "a solution line in a demo cell": (
        lambda aid: lambda nb, f: nb.cells.insert(3, nbformat.v4.new_code_cell(
            first_solution_line(aid, list(COURSE.assignment(aid).items)[0]).strip())),
        "contains a line of the reference solution"),
    "a solution line left in the stub": (
        lambda aid: lambda nb, f: setattr(cell(nb, list(COURSE.assignment(aid).items)[-1]), "source",
                                          cell(nb, list(COURSE.assignment(aid).items)[-1]).source + "\n"
                                          + first_solution_line(aid, list(COURSE.assignment(aid).items)[-1])),
        "contains a line of the reference solution"),
    "a hidden-test region": (
        lambda aid: lambda nb, f: setattr(cell(nb, "test_" + list(COURSE.assignment(aid).items)[0]), "source",
                                          HIDDEN_BEGIN + "\nassert True\n"),
        "still has a solution or hidden-test region"),
    "an import of the hidden package": (
        lambda aid: lambda nb, f: nb.cells.append(nbformat.v4.new_code_cell("from solutions import *")),
        "refers to the hidden solutions"),
    "an extra file": (
        lambda aid: lambda nb, f: (f / "answers.py").write_text("x = 1\n"),
        "extra files in the release: answers.py"),
    "a duplicated grade_id": (
        lambda aid: lambda nb, f: nb.cells.append(copy.deepcopy(cell(nb, list(COURSE.assignment(aid).items)[0]))),
        "is used by cells"),
    "points that disagree with course.yaml": (
        lambda aid: lambda nb, f: cell(nb, "test_" + list(COURSE.assignment(aid).items)[0]).metadata["nbgrader"]
        .__setitem__("points", 99),
        "course.yaml says"),
    "points in a test cell's text that disagree with course.yaml": (
        lambda aid: lambda nb, f: setattr(cell(nb, "test_" + list(COURSE.assignment(aid).items)[0]), "source",
                                          re.sub(r"points=[0-9.]+", "points=99", cell(
                                              nb, "test_" + list(COURSE.assignment(aid).items)[0]).source)),
        "tells students [99.0] points"),
    "an edited public-check helper": (
        lambda aid: lambda nb, f: setattr(cell(nb, "setup_checks"), "source",
                                          cell(nb, "setup_checks").source.replace("max(10 * atol", "max(atol")),
        "is not the course's public-check helper"),
    "a written answer worth other points than course.yaml's": (
        lambda aid: lambda nb, f: cell(nb, first_written(aid)).metadata["nbgrader"].__setitem__("points", 0),
        "course.yaml says"),
    "a question that does not say its written answer's points": (
        lambda aid: lambda nb, f: [setattr(c, "source", WRITTEN_LINE.sub("", c.source)) for c in nb.cells
                                   if c.cell_type == "markdown"],
        "does not tell students its"),
    "a missing written answer": (
        lambda aid: lambda nb, f: nb.cells.remove(cell(nb, first_written(aid))),
        "has no cell in the release"),
    "a missing stub": (
        lambda aid: lambda nb, f: nb.cells.remove(cell(nb, list(COURSE.assignment(aid).items)[-1])),
        "has no stub cell"),
    "a missing test cell": (
        lambda aid: lambda nb, f: nb.cells.remove(cell(nb, "test_" + list(COURSE.assignment(aid).items)[-1])),
        "has no test cell"),
}


WRITTEN_DAMAGES = {"a written answer worth other points than course.yaml's",
                   "a question that does not say its written answer's points", "a missing written answer"}
LEAKS = [(aid, damage) for damage in DAMAGES for aid in AIDS  # a written answer's damage: where there is one
         if damage not in WRITTEN_DAMAGES or COURSE.assignment(aid).written]


@pytest.mark.parametrize("aid, damage", LEAKS, ids=[f"{aid}-{damage}" for aid, damage in LEAKS])
def test_release_checks_fail_loudly_on_a_leak(tmp_path, aid, damage):
    make, words = DAMAGES[damage]
    problems = verify(aid, leaked_copy(tmp_path, aid, make(aid)))
    assert any(words in p for p in problems), problems


@pytest.mark.parametrize("aid", AIDS)
def test_the_release_runs_top_to_bottom_raising_only_not_implemented(tmp_path, aid):
    path = tmp_path / f"{aid}.ipynb"
    shutil.copy(ROOT / "release" / aid / f"{aid}.ipynb", path)
    nb = execute(path, timeout=600, allow_errors=True)
    errors = [(k, o.get("ename"), o.get("evalue", "")[:120]) for k, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors, "the stubs should raise"
    assert {e for _, e, _ in errors} == {"NotImplementedError"}, [e for e in errors if e[1] != "NotImplementedError"]
    statuses = self_check_rows(nb, aid)
    assert set(statuses.values()) == {"not started"}, statuses


def device_slips(aid):
    from tests.planted import planted_module
    return getattr(planted_module(aid), "DEVICE_SLIPS", None)


@pytest.mark.parametrize("aid", [aid for aid in AIDS if device_slips(aid)])  # those that plant one
def test_every_planted_device_slip_fails_its_items_public_device_check_on_a_cpu(tmp_path, aid):
    """Every device slip of the assignment (tests/planted DEVICE_SLIPS: a tensor made on the CPU, a .cpu() round trip,
    a CPU tensor in a matrix product or linear layer, a CPU index or embedding) in the solved notebook, run in one
    kernel on this CPU-only machine: the locked setup (and the facts), the items and their test cells pass; then, slip
    by slip, the slipped item's cell, its test cell (which must fail, in its device check on the fake GPU, naming the
    lines the CPU tensor went through) and the item's right cell again. The lecture's demonstrations are left out (on
    w8l1 they train for half a minute)."""
    from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
    from tests.planted import variant_source
    slips = [(item, name, variant) for item, named in device_slips(aid).items()
             for name, (variant, _) in named.items()]
    nb = with_cells(release_notebook(aid), solved_sources(aid))
    nb.cells = [c for c in nb.cells if c.cell_type == "code"
                and (nbgrader_meta(c).get("grade_id") or c.metadata.get("course", {}).get("generated") == "facts")]
    by_id = {nbgrader_meta(c).get("grade_id"): c for c in nb.cells}
    expected = []
    for item, name, variant in slips:
        nb.cells += [nbformat.v4.new_code_cell(source) for source in
                     (variant_source(aid, item, variant), by_id[f"test_{item}"].source, by_id[item].source)]
        expected.append((len(nb.cells) - 2, item, name))
    nbformat.write(nb, tmp_path / f"{aid}.ipynb")
    executed = execute(tmp_path / f"{aid}.ipynb", timeout=600, allow_errors=True, quick=True)
    errors = {k: (o["ename"], o["evalue"]) for k, c in enumerate(executed.cells) if c.cell_type == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"}
    assert sorted(errors) == [k for k, _, _ in expected], (errors, expected)
    for k, item, name in expected:
        ename, message = errors[k]
        assert ename == "AssertionError", (name, message)
        assert re.match(rf"{item}: public check \d+ failed: .* with every input on a fake GPU \(cuda\)", message), \
            (name, message)
        assert ("found at least two devices" in message and re.search(r"through: +\S+\(\), line \d+: ", message)) \
            or "output 0 on cpu" in message, (name, message)


@pytest.mark.slow
@pytest.mark.parametrize("aid", AIDS)
def test_course_solve_builds_a_notebook_that_runs_and_scores_full_marks(tmp_path, monkeypatch, aid):
    """The instructor's copy `course solve` writes runs top to bottom, its self-check passes every item, and the
    grader gives it full marks. Graded under COURSE_PROFILE=rehearsal: what this test proves is that the solved
    copy (its regions kept, filled) is graded as the complete submission is, every check passing; that the
    reference's experiments meet course.yaml's real thresholds at full budget is tests/test_grading.py's (the
    graded_solutions fixture), and training them here again cost a minute and a half of CPU alone."""
    from autograder.grading.grade import grade_notebook
    path = solve(aid, tmp_path)
    text = path.read_text()
    assert BEGIN in text  # the instructor's copy keeps the regions, filled
    executed = execute(path, timeout=1200, quick=True)  # every cell with the reference; the demos' figures are
    # the lecture's only at full budget (`course solve --execute`), which CI does not wait for
    outputs = json.dumps([c.get("outputs", []) for c in executed.cells])
    assert "NotImplementedError" not in outputs and '"output_type": "error"' not in outputs
    # every item passes all its public checks in the self-check: as many as its own test cell counted
    texts = "".join(o.get("text", "") for c in executed.cells
                    if nbgrader_meta(c).get("grade_id", "").startswith("test_") for o in c.get("outputs", []))
    counted = dict(re.findall(r"^(\w+): public checks passed \((\d+)/\2\)", texts, re.MULTILINE))
    assert self_check_rows(executed, aid) == {item: f"all {n} passed" for item, n in counted.items()}
    monkeypatch.setenv(PROFILE_ENV, "rehearsal")  # each experiment 5 steps on its first seed, bounds any figure meets
    result = grade_notebook(path, aid, device="cpu")
    lost = [f"{t['name']}: {t['output']}" for t in result["tests"] if t["score"] < t["max_score"]]
    assert result["score"] == result["max_score"] == COURSE.assignment(aid).total_points, lost
    trained = [run for t in result["tests"] for run in t.get("extra_data", {}).get("trained", [])]
    assert trained and all(run["steps"] <= 5 for run in trained), trained  # the rehearsal was in force
