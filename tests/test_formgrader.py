"""formgrader, as a TA uses it on a fresh clone: every page of a small class, its Autograde button, written answers.

A real `course formgrader` (a Jupyter server with nbgrader's formgrader and the course's extension) on 127.0.0.1, a
free port and a token, stopped by its PID. The class is four lab14 submissions, autograded first with the command as
docs/TA.md says: alice complete, bob the release, carol complete but saved under another name, dave hostile (a syntax
error, an item that kills its own process, and markup in his written answer and in a markdown cell of his own).

Every grading runs under course.yaml's `rehearsal` profile (COURSE_PROFILE, in the environment every command and
the server get): what is checked is formgrader's mechanism (its pages, the button, written grades reaching every
view), not an experiment's figure, and a complete notebook's experiments pass under the profile's bounds as under
the course's, so every expected score is still course.yaml's points. `course` names the profile on each command.
"""
import contextlib
import csv
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from html import unescape
from pathlib import Path

import nbformat
import pytest

from autograder.course import profiles
from autograder.course.config import load_course
from autograder.notebooks.examples import examples
from tests.test_ta_workflow import fresh_clone

pytestmark = pytest.mark.grading
AID = "lab14_transformers"
TOKEN = "formgrader-test-token"
SCRIPT = "<script>alert('answer')</script>"
IMG = "<img src=x onerror=\"alert('cell')\">"
PAGES = ["formgrader/manage_assignments", f"formgrader/manage_submissions/{AID}", "formgrader/gradebook",
         f"formgrader/gradebook/{AID}", f"formgrader/gradebook/{AID}/{AID}", "formgrader/manage_students"]
PROFILE = "rehearsal"
STARTS_WITHIN = 300  # seconds: a hang's end, not a measure (see Server)
STUDENT_PAGES = ["formgrader/manage_students/{s}", "formgrader/manage_students/{s}/" + AID]
API = ["formgrader/api/assignments", f"formgrader/api/submissions/{AID}", f"formgrader/api/notebooks/{AID}",
       f"formgrader/api/submitted_notebooks/{AID}/{AID}", "formgrader/api/students"]


def answered(nb, answers):
    """`nb` with its written answers `grade_id -> text` filled in."""
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    return nb


def class_of_four():
    """student -> (file name, notebook): complete with every question answered, the release (nothing answered: 0
    without a TA, as nbgrader scores an untouched answer), complete and answered under another name, hostile (one
    question answered)."""
    ex = examples(AID)
    every = {gid: f"My answer to {gid}: $d_k$ matters." for gid in load_course().assignment(AID).written}
    dave = answered(ex["broken"], {"answer_scaling": f"My answer {SCRIPT} **bold**"})
    dave.cells.insert(1, nbformat.v4.new_markdown_cell(f"a cell of my own {IMG}"))
    return {"alice": (f"{AID}.ipynb", answered(ex["complete"], every)), "bob": (f"{AID}.ipynb", ex["empty"]),
            "carol": (f"{AID} (1).ipynb", answered(examples(AID)["complete"], every)),
            "dave": (f"{AID}.ipynb", dave)}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`course formgrader` in `clone`, answering on 127.0.0.1:port; `call` sends a request with the token."""

    def __init__(self, clone, env):
        self.port = free_port()
        with open(clone / "formgrader.log", "w") as log:  # the child holds its own copy of the file
            self.proc = subprocess.Popen([str(Path(sys.executable).parent / "course"), "formgrader", "--port",
                                          str(self.port)], cwd=clone, env={**env, "JUPYTER_TOKEN": TOKEN},
                                         stdout=log, stderr=subprocess.STDOUT)
        # Until it answers, or ends: a server that died fails the test at once, with its log. The limit only ends a
        # hang: a start takes 3-10 s, and the run beside it can make that several times longer.
        deadline = time.monotonic() + STARTS_WITHIN
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if self.call("api/status", timeout=STARTS_WITHIN)[0] == 200:
                    return
            except OSError:
                pass  # not listening yet
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.3)  # ends at once if the server does
        log = (clone / "formgrader.log").read_text()[-3000:]
        raise AssertionError(f"formgrader did not answer in {STARTS_WITHIN} s (exit status {self.proc.poll()}):\n{log}")

    def call(self, path, method="GET", body=None, timeout=600):
        """(status, body text) of a request to the server."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/{path}", data=data, method=method,
                                         headers={"Authorization": f"token {TOKEN}"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def stop(self):
        """SIGTERM, and SIGKILL if it has not ended after a generous while (Jupyter's shutdown, on a busy machine)."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=STARTS_WITHIN)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"formgrader did not end in {STARTS_WITHIN} s of SIGTERM") from None


def autograded_results(clone):
    """student -> (gradebook score, the grader's isolation level) after an autograde."""
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{clone}/.nbgrader/gradebook.db") as gb:
        scores = {s.student.id: s.score for s in gb.find_assignment(AID).submissions}
    out = {}
    for student, score in scores.items():
        nb = json.loads((clone / ".nbgrader" / "autograded" / student / AID / f"{AID}.ipynb").read_text())
        out[student] = (score, nb["metadata"]["course_results"]["extra_data"]["isolation"])
    return out


@pytest.mark.slow
def test_formgrader_as_a_ta_uses_it(tmp_path):
    """The class of four released and autograded by the command (docs/TA.md), then `course formgrader`: its pages,
    its Autograde button, and written answers graded in it, read back by every view. One test: each step needs the
    last one's gradebook."""
    clone = fresh_clone(tmp_path / "clone")  # no training cache: the profile is in the grading's identity
    for student, (name, nb) in class_of_four().items():
        folder = clone / ".nbgrader" / "submitted" / student / AID
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / name)
    env = {**os.environ, "PYTHONPATH": str(clone), "COURSE_MNIST_DIR": str(load_course().mnist_dir),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           profiles.ENV: PROFILE}
    run(clone, env, f"course release {AID}", f"nbgrader autograde {AID}")
    by_command = autograded_results(clone)
    assert by_command["alice"][0] == by_command["carol"][0] == load_course().assignment(AID).total_points
    assert by_command["bob"][0] == 0 and 0 < by_command["dave"][0] < by_command["alice"][0]
    server = Server(clone, env)
    try:
        check_every_page(clone, server)
        check_the_autograde_button(clone, server, by_command)
        check_written_answers(clone, env, server)
    finally:
        server.stop()
    log = (clone / "formgrader.log").read_text()
    assert "Traceback" not in log, log[-3000:]


def run(clone, env, *commands):
    """Each command in the clone, as a TA types it; the last one's stdout. `course` says the profile is in force."""
    for command in commands:
        proc = subprocess.run(command, shell=True, cwd=clone, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        if command.startswith("course "):
            assert profiles.notice(PROFILE) in proc.stderr, f"{command}: not under the profile\n{proc.stderr[-3000:]}"
    return proc.stdout


def check_every_page(clone, server):
    """Every page and API list a TA's browser loads answers 200 without formgrader's error page; each grading page
    shows every written answer with its score box and rubric, and no student markup that runs."""
    for path in PAGES + API + [p.format(s=s) for p in STUDENT_PAGES for s in class_of_four()]:
        status, body = server.call(path)
        assert status == 200, f"{path}: HTTP {status}\n{body[-2000:]}"
        assert "formgrader encountered an error" not in body, path
    submitted = json.loads(server.call(f"formgrader/api/submitted_notebooks/{AID}/{AID}")[1])
    assert sorted(s["student"] for s in submitted) == sorted(class_of_four())
    written = load_course().assignment(AID).written
    for sub in submitted:
        status, page = server.call(f"formgrader/submissions/{sub['id']}/")
        assert status == 200, f"{sub['student']}'s grading page: HTTP {status}\n{page[-2000:]}"
        for gid, question in written.items():  # every answer with its points and its rubric, from course.yaml
            assert f'id="{gid}"' in page, f"{sub['student']}: no score box for {gid}"
            assert question.rubric[:40] in unescape(page), f"{sub['student']}: no rubric for {gid}"
        assert "<script>alert" not in page and "onerror" not in page, f"{sub['student']}: student markup runs"
        if sub["student"] == "dave":  # sanitised, not dropped: the text and harmless markup stay
            assert "My answer" in page and "<strong>bold</strong>" in page and "a cell of my own" in page


def check_the_autograde_button(clone, server, by_command):
    """The button (its API call) on each student gives the command's scores and isolation level, runs outside the
    server's process, and the server answers other requests while it grades."""
    for student in class_of_four():
        answer, answered_meanwhile = {}, 0

        def press(student=student, answer=answer):
            answer["got"] = server.call(f"formgrader/api/submission/{AID}/{student}/autograde", method="POST")
        button = threading.Thread(target=press)
        button.start()
        # Counted only if the answer came while the button was still grading; no time limit on that answer (a
        # server blocked by the grading answers after it, and is not counted): a busy machine cannot fail it.
        while button.is_alive():
            if server.call("formgrader/api/status")[0] == 200 and button.is_alive():
                answered_meanwhile += 1
            button.join(0.2)
        button.join()
        status, body = answer["got"]
        result = json.loads(body)  # nbgrader's answer: {"success", "log", "error"}
        assert status == 200 and result["success"], f"{student}: {result}"
        assert answered_meanwhile, f"{student}: no request was answered while the button graded"
        if student == "carol":  # the command's repair of a notebook under another name, said in the button's log
            assert f"submitted as '{AID} (1).ipynb'" in result["log"], result["log"][-2000:]
    assert autograded_results(clone) == by_command, "the button and `nbgrader autograde` disagree"
    maps = Path(f"/proc/{server.proc.pid}/maps").read_text()
    assert "libtorch" not in maps, "the Jupyter server loaded torch: the grader's side ran in it"


def check_written_answers(clone, env, server):
    """Written answers graded through formgrader's API (the calls its page makes) reach the gradebook, `nbgrader
    export`, the feedback page, `course grade` and `course report`, beside the automatic points."""
    written = load_course().assignment(AID).written
    total = load_course().assignment(AID).total_points
    submitted = {s["student"]: s["id"] for s in json.loads(
        server.call(f"formgrader/api/submitted_notebooks/{AID}/{AID}")[1])}

    def grade(student, gids, score):
        grades = json.loads(server.call(f"formgrader/api/grades?submission_id={submitted[student]}")[1])
        for g in grades:
            if g["name"] in gids:  # what formgrader's page sends when a TA types a score
                status, body = server.call(f"formgrader/api/grade/{g['id']}", method="PUT",
                                           body={"manual_score": score, "extra_credit": 0})
                assert status == 200, body
    grade("alice", set(written), 1.5)           # every answer: alice's written points are final
    grade("carol", set(list(written)[:2]), 2)   # two of five: carol's are pending
    alice_written = 1.5 * len(written)
    max_written = load_course().assignment(AID).written_points

    table = run(clone, env, f"nbgrader generate_feedback {AID} --force", "nbgrader export --to export.csv",
                f"course grade .nbgrader/submitted/ -a {AID} --results-dir graded/{AID}/ --csv grades.csv")
    run(clone, env, "course report graded/ -o report.html")
    rows = {line.split()[0]: line for line in table.splitlines() if line.split()[:1] and
            line.split()[0] in class_of_four()}
    assert re.search(rf"{total:g}/{total:g}\s+{alice_written:g}/{max_written:g}$", rows["alice"]), table
    assert re.search(rf"pending/{max_written:g} \(2 of 5 graded\)$", rows["carol"]), table
    assert re.search(rf"\s0/{max_written:g}$", rows["bob"]), table  # nothing answered: 0, no TA needed
    assert re.search(rf"pending/{max_written:g} \(4 of 5 graded\)$", rows["dave"]), table

    gradebook = {s["student"]: s for s in json.loads(server.call(f"formgrader/api/submissions/{AID}")[1])}
    assert gradebook["alice"]["code_score"] == total and gradebook["alice"]["written_score"] == alice_written
    assert gradebook["alice"]["max_written_score"] == max_written and gradebook["carol"]["needs_manual_grade"]

    with open(clone / "export.csv") as f:
        exported = {r["student_id"]: r for r in csv.DictReader(f)}
    alice = exported["alice"]
    assert float(alice["automatic_score"]) == total and float(alice["written_score"]) == alice_written
    assert alice["written_status"] == "graded" and float(alice["score"]) == total + alice_written
    assert exported["carol"]["written_score"] == "" and exported["carol"]["written_status"] == "pending"
    assert float(exported["carol"]["score"]) == total + 4  # nbgrader's own total: what is graded so far
    with open(clone / "grades.csv") as f:
        graded = {r["submission"]: r for r in csv.DictReader(f)}
    assert float(graded["alice"]["written_score"]) == alice_written and graded["carol"]["written_status"] == "pending"

    feedback = (clone / ".nbgrader" / "feedback" / "alice" / AID / f"{AID}.html").read_text()
    assert re.search(rf"Automatic points: {total:g}(\.0)? / {total:g}(\.0)? \(final\)", feedback)
    assert re.search(rf"Written answers: {alice_written:g}(\.0)? / {max_written:g}(\.0)? \(graded by your TA\)",
                     feedback)
    carol = (clone / ".nbgrader" / "feedback" / "carol" / AID / f"{AID}.html").read_text()
    assert f"Written answers: not graded yet ({max_written:g}.0 points; your TA grades them)" in carol
    assert carol.count("Not graded yet: 2.0 points") == 3 and carol.count("Score: 2.0 / 2.0") == 2
    dave = (clone / ".nbgrader" / "feedback" / "dave" / AID / f"{AID}.html").read_text()
    assert "<script>alert" not in dave and "onerror" not in dave and "a cell of my own" in dave

    report = re.sub(r"\s+", " ", (clone / "report.html").read_text())
    assert re.search(rf"Written answers, apart from these totals: {max_written:g} points, graded by TAs in "
                     rf"formgrader: 2 graded \(mean {alice_written / 2:.1f} of {max_written:g}\), \d+ pending",
                     report), re.findall(r"Written answers.{0,200}", report)
