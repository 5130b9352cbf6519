"""A new TA on a fresh clone: docs/TA.md's nbgrader commands, run exactly as written, grade lab14 end to end.

This is lab14's nbgrader round trip (tests/test_nbgrader_roundtrip.py runs the other two assignments'): the
gradebook's scores are `course grade`'s, and the feedback page shows the reasons and nothing hidden.

The commands and the submission layout are read from docs/TA.md, so the two cannot drift apart. The clone
is a copy of the tracked files (what `git clone` gives); this environment's `course` and `nbgrader` run in it
with the clone's own code first on the path.
"""
import csv
import json
import os
import re
import shutil
import subprocess
import sys
from html import unescape
from pathlib import Path

import nbformat
import pytest

from autograder.course.config import ROOT, load_course
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells

pytestmark = pytest.mark.grading
AID = "lab14_transformers"
HOSTILE = "<script>alert('x')</script><b>bold</b>"


def ta_section():
    """docs/TA.md's section on grading with nbgrader, up to the next section."""
    text = (ROOT / "docs" / "TA.md").read_text()
    start = text.index("## Grading with nbgrader")
    return text[start:text.index("\n## ", start)]


def ta_commands():
    """The first indented block of that section, one command per line, comments dropped."""
    lines, block = [], False
    for line in ta_section().splitlines():
        if line.startswith("    ") and line.strip():
            block = True
            lines.append(re.sub(r"\s+#\s.*$", "", line.strip()))
        elif block:
            break
    return lines


def fresh_clone(dest):
    """The repository's tracked files (committed or not), as a clone has them."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    for rel in filter(None, files.stdout.split("\0")):
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    return dest


def submissions():
    """The reference (full marks), the release (zero) and a half-done notebook whose code prints markup."""
    half = solved_sources(AID, ["scaled_dot_product_attention", "PositionalEncoding"])
    half["scaled_dot_product_attention"] = half["scaled_dot_product_attention"].replace(
        "### BEGIN SOLUTION", f"### BEGIN SOLUTION\n    print({HOSTILE!r})\n    Q = Q * 1.01", 1)
    return {"alice": with_cells(release_notebook(AID), solved_sources(AID)), "bob": release_notebook(AID),
            "carol": with_cells(release_notebook(AID), half)}


def page_text(html):
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html)))


@pytest.mark.slow
def test_ta_commands_on_a_fresh_clone(tmp_path, graded_solutions):
    commands = ta_commands()
    assert [c.split()[:2] for c in commands] == [["course", "release"], ["nbgrader", "autograde"],
                                                 ["nbgrader", "generate_feedback"], ["nbgrader", "export"],
                                                 ["course", "grade"], ["course", "report"]], commands
    assert all(AID in c or c.startswith(("course report", "nbgrader export")) for c in commands), commands
    layout = re.search(r"`(\S*submitted/<student>/<id>/<id>\.ipynb)`", ta_section()).group(1)

    clone = fresh_clone(tmp_path / "clone")
    graded_solutions[AID]  # alice's experiments are the graded solution's: the clone starts with the cache
    if (ROOT / ".grader" / "cache").is_dir():  # only a speed-up: the cache is keyed by code, config and torch
        shutil.copytree(ROOT / ".grader" / "cache", clone / ".grader" / "cache")
    subs = submissions()
    for student, nb in subs.items():
        path = clone / layout.replace("<student>", student).replace("<id>", AID)
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
    env = {**os.environ, "PYTHONPATH": str(clone), "COURSE_MNIST_DIR": str(load_course().mnist_dir),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for command in commands:
        proc = subprocess.run(command, shell=True, cwd=clone, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert "has changed" not in proc.stdout + proc.stderr, f"{command}: an honest submission warned\n{proc.stderr}"
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        if command.startswith("course release"):
            assert not subprocess.run(["diff", "-r", str(ROOT / "release"), str(clone / "release")],
                                      capture_output=True).returncode, "course release changed release/"

    from nbgrader.api import Gradebook
    total = load_course().assignment(AID).total_points
    with Gradebook(f"sqlite:///{clone}/.nbgrader/gradebook.db") as gb:
        scores = {s.student.id: s.score for s in gb.find_assignment(AID).submissions}
    assert scores["alice"] == pytest.approx(total) and scores["bob"] == 0 and 0 < scores["carol"] < total
    with open(clone / "grades.csv") as grades:
        table = {r["submission"]: float(r["score"]) for r in csv.DictReader(grades)}
    assert table == pytest.approx(scores), "nbgrader's gradebook and `course grade` disagree"
    exported = re.search(r"--to (\S+)", commands[3]).group(1)
    with open(clone / exported) as exported_csv:
        rows = list(csv.DictReader(exported_csv))
    assert {r["student_id"]: float(r["score"]) for r in rows if r["assignment"] == AID} == pytest.approx(scores)

    feedback = (clone / ".nbgrader" / "feedback" / "carol" / AID / f"{AID}.html").read_text()
    head = page_text(feedback[:feedback.index('id="notebook"')])
    assert f"{scores['carol']:g}" in head and "why points were lost" in head
    for item in load_course().assignment(AID).items:
        assert item in head, f"the summary does not name {item}"
        assert f"Checks of <code>{item}</code>" in feedback
    assert head.count("is not implemented yet") == 4  # one reason per stubbed item, not one per check
    results = re.search(r"--results-dir (\S+)", commands[4]).group(1)  # docs/TA.md's: one folder per assignment
    carol = json.loads((clone / results / "carol.json").read_text())
    lost = [t for t in carol["tests"] if t["item"] == "scaled_dot_product_attention" and t["score"] < t["max_score"]]
    assert lost, "carol's scaled Q must lose points"
    reason = re.sub(r"\s+", " ", lost[0]["output"].splitlines()[0])
    assert reason[:60] in page_text(feedback), reason  # the checker's own words, as course grade has them
    assert "Written response" not in feedback and "Score: 0.0 / 0.0" not in feedback and ">Comment<" not in feedback
    assert HOSTILE not in feedback and "<script>alert" not in feedback
    assert "&lt;script&gt;alert" in feedback  # what carol's code printed is there, as text
    assert "### BEGIN HIDDEN TESTS" not in feedback and "The hidden checks run outside" not in feedback
    assert str(clone) not in feedback and "solutions/" not in feedback
    full = (clone / ".nbgrader" / "feedback" / "alice" / AID / f"{AID}.html").read_text()
    top = page_text(full[:full.index('id="notebook"')])
    assert re.search(r"memory_task .* test_accuracy 1 test_accuracy >= 0.99 test_accuracy 0.998 reached", top), top

    report = (clone / "report.html").read_text()
    assert report.count("data:image/png;base64,") >= 3  # totals, items, the memory-task experiment
    assert "3 submissions" in report and "<script>" not in report
    assert "is not implemented yet (it raises NotImplementedError)" in report
    assert "grades.csv" not in report and (clone / "grades.csv").read_text().count("\n") == 4
