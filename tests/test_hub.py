"""A semester lived through on a real JupyterHub (tests/hub_node.py): a TA and three students, real Unix users who
log in with their passwords, each with a server the hub started as them; nbgrader's exchange as course.yaml sets it.

Two assignments are released one after the other through formgrader's API; the students fetch, work (the complete
notebook, one partly done, the empty release), save and submit through the Assignment List's API (alice twice, bob
late); the TA collects, autogrades, grades a written answer in formgrader, autogrades again with its Autograde button,
releases feedback; each student fetches it and reads the score; the grades go to Canvas. Every figure is computed from
course.yaml's points and late policy and compared exactly on every path: the gradebook, `nbgrader export`,
`course grade`, `course export grades --lms canvas` and the student's own feedback. A student cannot read another's
submission or feedback or the course's hidden files, and a student of another course sees none of this one's.

Grading is the cost: every grading runs under course.yaml's `rehearsal` profile (COURSE_PROFILE, in the spawned
servers' environment and the TA's commands'; `course` names it on each), which trains the complete lab14's experiment
a few steps with bounds any figure meets. What is checked is the hub's mechanism, not an experiment's figure: under
the profile a complete notebook's experiments still score their full points, so every expected figure is still
course.yaml's. bob's partly done notebook leaves out the item that trains, and the second assignment's submissions are
the empty release.
"""
import csv
import io
import json
import os
import re
import shutil
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import nbformat
import pytest
import yaml

from autograder.course import profiles
from autograder.course.config import ROOT, load_course
from autograder.notebooks.examples import examples, release_notebook, solved_sources, with_cells
from tests.hub_node import Browser, Hub, OpenedPython, Users, as_user, why_not
from tests.test_ta_workflow import fresh_clone

pytestmark = [pytest.mark.grading, pytest.mark.slow,
              pytest.mark.skipif(why_not() is not None, reason=f"no JupyterHub with real users here: {why_not()}")]
FIRST, SECOND = "lab14_transformers", "w8l4_transformers"
COURSE_ID = "rehearsal-course"
POLICY = {"grace_minutes": 15, "percent_per_day": 10, "floor_percent": 50, "close_days": 7}
LEFT_OUT = "TransformerClassifier"  # bob's partly done notebook: the item that trains, left as released
ANSWER = "answer_scaling"           # alice's written answer, which the TA grades in formgrader
PROFILE = {profiles.ENV: "rehearsal"}  # every grading's: the TA's commands and the servers the hub spawns


def expected_finals(due):
    """student -> assignment -> final grade, from course.yaml's points and POLICY: what every path must give."""
    a = load_course().assignment(FIRST)
    late_days = -(-(datetime.now(UTC) - due) // timedelta(days=1))  # started days; bob submits within the hour
    cut = min(late_days * POLICY["percent_per_day"], 100 - POLICY["floor_percent"]) / 100
    return {"alice": {FIRST: a.total_points + a.written[ANSWER].points, SECOND: 0.0},
            "bob": {FIRST: round((a.total_points - a.item_points(LEFT_OUT)) * (1 - cut), 2), SECOND: 0.0},
            "carol": {FIRST: 0.0}}


def course_for(ta, group, home, exchange_root, due):
    """The TA's course: a fresh clone in their 0700 home, course.yaml's exchange, due time and late policy set."""
    course = fresh_clone(home / "course")
    raw = yaml.safe_load((course / "course.yaml").read_text())
    raw["exchange"] = {"course_id": COURSE_ID, "root": str(exchange_root)}
    raw["late"], raw["assignments"][FIRST]["due"] = POLICY, due.isoformat()
    (course / "course.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    subprocess.run(["chown", "-R", f"{ta}:{group}", str(course)], check=True)
    return course


def exchange_for(folder, ta, group, other_group):
    """docs/HUB.md's exchange: the root 1777; this course's folder the TA's, group the course, 2750; another
    course's folder beside it, with an assignment released, readable by its own group only."""
    root = folder / "exchange"
    root.mkdir()
    os.chmod(root, 0o1777)
    ours = root / COURSE_ID
    ours.mkdir()
    shutil.chown(ours, ta, group)
    os.chmod(ours, 0o2750)
    theirs = root / "other-course" / "outbound" / "secret_lab"
    theirs.mkdir(parents=True)
    (theirs / "secret_lab.ipynb").write_text(nbformat.writes(nbformat.v4.new_notebook()))
    for path in (theirs, theirs.parent, theirs.parent.parent):
        shutil.chown(path, "root", other_group)
    os.chmod(root / "other-course", 0o2750)
    return root


@pytest.fixture
def semester(tmp):
    users, opened = Users(tmp / "homes"), OpenedPython(ROOT)
    hub = None
    try:
        group, other_group = users.group("crs"), users.group("oth")
        names = {"ta": users.user("ta", [group]), **{s: users.user(s, [group]) for s in ("alice", "bob", "carol")},
                 "dave": users.user("dave", [other_group])}  # dave: a student of the other course
        due = (datetime.now(UTC) - timedelta(hours=24, minutes=30)).replace(microsecond=0)
        exchange = exchange_for(tmp, names["ta"], group, other_group)
        course = course_for(names["ta"], group, users.homes / names["ta"], exchange, due)
        students_config = tmp / "students-jupyter"
        students_config.mkdir()
        exchange_settings = load_course(course / "course.yaml").exchange
        (students_config / "nbgrader_config.py").write_text(exchange_settings.students_config())
        os.chmod(students_config, 0o755)
        opened.check(names["alice"])
        pointer = users.homes / names["ta"] / ".jupyter" / "nbgrader_config.py"  # docs/HUB.md: formgrader's course
        pointer.parent.mkdir()
        pointer.write_text(f"c = get_config()  # noqa: F821\nload_subconfig({str(course / 'nbgrader_config.py')!r})\n")
        subprocess.run(["chown", "-R", names["ta"], str(pointer.parent)], check=True)
        hub = Hub(tmp / "hub", list(names.values()), [names["ta"]], students_config, env=PROFILE)
        yield {"hub": hub, "users": users, "names": names, "course": course, "exchange": exchange, "due": due,
               "tmp": tmp}
    finally:
        if hub is not None:
            hub.close()
        users.remove()
        opened.close()


class Person:
    """A user of the hub, logged in through PAM, with their own API token (their server: `Hub.start`)."""

    def __init__(self, hub, name, password):
        self.hub, self.name = hub, name
        assert "/hub/login" not in hub.login(name, password), f"{name} could not log in with their password"
        self.token = hub.token_of(name)

    def call(self, path, method="GET", body=None):
        return self.hub.api(f"/user/{self.name}/{path}", method, body, token=self.token)


def ta_run(ta, course, *argv):
    """A command of the TA's in the course, under the profile (`course` says so on stderr: checked here)."""
    proc = as_user(ta, *argv, cwd=course, env={"COURSE_ROOT": str(course), **PROFILE})
    if argv[0] == "course":
        assert profiles.notice(PROFILE[profiles.ENV]) in proc.stderr, (argv, proc.stderr[-3000:])
    return proc


def test_a_semester_on_a_real_jupyterhub(semester):
    started = last = time.monotonic()

    def lap(phase):  # each phase's seconds, for benchmarks/RESULTS.md
        nonlocal last
        print(f"rehearsal: {phase}: {time.monotonic() - last:.0f} s", flush=True)
        last = time.monotonic()
    hub, names, course, exchange = semester["hub"], semester["names"], semester["course"], semester["exchange"]
    ta_name = names["ta"]
    people = {role: Person(hub, name, semester["users"].passwords[name]) for role, name in names.items()}
    hub.start(*names.values())
    ta, students = people["ta"], {s: people[s] for s in ("alice", "bob", "carol")}
    lap("five logins through PAM and five servers started")
    complete = examples(FIRST)["complete"]
    for cell in complete.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == ANSWER:
            cell.source = "Scores grow as sqrt(d_k): dividing by it keeps the softmax out of saturation."
    partly = with_cells(release_notebook(FIRST), solved_sources(FIRST, [i for i in load_course().assignment(
        FIRST).items if i != LEFT_OUT]))
    work = {FIRST: {"alice": [release_notebook(FIRST), complete], "bob": [partly], "carol": [release_notebook(FIRST)]},
            SECOND: {"alice": [release_notebook(SECOND)], "bob": [release_notebook(SECOND)]}}

    for aid in (FIRST, SECOND):  # released one after the other; each student's work submitted before the next
        ta_run(ta_name, course, "course", "release", aid)
        succeeded(ta.call(f"formgrader/api/assignment/{aid}/release", "POST", {}))
        for student, notebooks in work[aid].items():
            person = students[student]
            courses = person.call("courses")
            assert courses["value"] == [COURSE_ID], courses  # never the other course's
            listed = person.call(f"assignments?course_id={COURSE_ID}")["value"]
            assert [a["assignment_id"] for a in listed if a["status"] == "released"] == [aid], listed
            person.call("assignments/fetch", "POST", {"course_id": COURSE_ID, "assignment_id": aid})
            for nb in notebooks:  # saved as the notebook page saves it, then submitted
                person.call(f"api/contents/{COURSE_ID}/{aid}/{aid}.ipynb", "PUT",
                            {"type": "notebook", "format": "json", "content": json.loads(nbformat.writes(nb))})
                answer = person.call("assignments/submit", "POST", {"course_id": COURSE_ID, "assignment_id": aid})
                assert answer.get("success", True), answer
    lap("two releases, fetches, saves and submissions")
    dave = people["dave"].call("courses")["value"]
    assert COURSE_ID not in dave and not people["dave"].call(f"assignments?course_id={COURSE_ID}")["value"]

    # the TA collects, gives alice and carol two more days (bob stays late), autogrades, grades alice's written
    # answer and autogrades her again with formgrader's Autograde button
    alice, bob, carol = (names[s] for s in ("alice", "bob", "carol"))
    for aid in (FIRST, SECOND):
        succeeded(ta.call(f"formgrader/api/assignment/{aid}/collect", "POST", {}))
    for student in (alice, carol):
        ta_run(ta_name, course, "course", "extend", student, FIRST, "--days", "2")
    for aid in (FIRST, SECOND):
        ta_run(ta_name, course, "nbgrader", "autograde", aid)
    lap("collect and nbgrader autograde (5 submissions)")
    notebook_id = next(s["id"] for s in ta.call(f"formgrader/api/submitted_notebooks/{FIRST}/{FIRST}")
                       if s["student"] == alice)
    grade = next(g for g in ta.call(f"formgrader/api/grades?submission_id={notebook_id}") if g["name"] == ANSWER)
    ta.call(f"formgrader/api/grade/{grade['id']}", "PUT", {"manual_score": load_course().assignment(
        FIRST).written[ANSWER].points})
    succeeded(ta.call(f"formgrader/api/submission/{FIRST}/{alice}/autograde", "POST", {}))
    assert rehearsed(course, alice), "the TA's server graded without the profile the hub spawned it with"
    lap("a written grade and the Autograde button")
    for aid in (FIRST, SECOND):
        succeeded(ta.call(f"formgrader/api/assignment/{aid}/generate_feedback", "POST", {}))
        succeeded(ta.call(f"formgrader/api/assignment/{aid}/release_feedback", "POST", {}))

    expected = {names[s]: grades for s, grades in expected_finals(semester["due"]).items()}
    # each student fetches the feedback and reads the score on it
    feedback_scores = {}
    for student, person in students.items():
        for aid in expected[names[student]]:
            person.call("assignments/fetch_feedback", "POST", {"course_id": COURSE_ID, "assignment_id": aid})
            folder = person.call(f"api/contents/{COURSE_ID}/{aid}/feedback")["content"]
            assert len(folder) == 1, folder  # one submission's feedback: the last one (alice's second)
            page = person.call(f"api/contents/{quote(folder[0]['path'])}/{aid}.html?content=1&type=file&format=text")
            feedback_scores.setdefault(person.name, {})[aid] = page_score(page["content"])
    lap("feedback generated, released, fetched and read")
    pages = browse(hub, semester["users"].passwords, ta_name, alice, semester["tmp"])
    lap("two pages in Chromium")
    # every path's figure
    ta_run(ta_name, course, "nbgrader", "export", "--to", "nbgrader.csv")
    with open(course / "nbgrader.csv") as f:
        by_nbgrader = {}
        for row in csv.DictReader(f):
            if row["timestamp"]:
                by_nbgrader.setdefault(row["student_id"], {})[row["assignment"]] = float(row["score"])
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course}/.nbgrader/gradebook.db", COURSE_ID) as gb:
        by_gradebook = {s.student.id: {} for a in (FIRST, SECOND) for s in gb.find_assignment(a).submissions}
        for aid in (FIRST, SECOND):
            for s in gb.find_assignment(aid).submissions:
                by_gradebook[s.student.id][aid] = round(s.score - s.late_submission_penalty, 2)
    by_course_grade = {}
    for aid in (FIRST, SECOND):
        ta_run(ta_name, course, "course", "grade", ".nbgrader/submitted/", "-a", aid, "--results-dir",
               f"graded/{aid}/", "--csv", f"grades-{aid}.csv", "--workers", "2")
        with open(course / f"grades-{aid}.csv") as f:
            for row in csv.DictReader(f):
                final = row.get("final_score") or row["score"]  # an assignment without a due time has no lateness
                by_course_grade.setdefault(row["submission"], {})[aid] = round(
                    float(final) + float(row.get("written_score") or 0), 2)
    roster = "student,Student,ID,SIS User ID,SIS Login ID,Section\n" + "".join(
        f"{n},{n.title()},{i},{i},{n},A\n" for i, n in enumerate((alice, bob, carol), 1))
    (course / "roster.csv").write_text(roster)
    ta_run(ta_name, course, "course", "export", "grades", "graded/", "--roster", "roster.csv", "--lms", "canvas",
           "-o", "canvas.csv")
    by_canvas = canvas_grades(course / "canvas.csv")
    lap("nbgrader export, course grade, course export grades")
    assert by_gradebook == expected
    assert by_nbgrader == expected
    assert feedback_scores == expected
    # `course grade .nbgrader/submitted/ -a ID` grades only <student>/ID/ (not alice's and bob's other assignment as
    # `alice~2`, `bob~2`), and alice's written grade is not pending again after the Autograde button (her 2 written
    # points: without SaveGrades her lab14 read 29)
    assert by_course_grade == expected
    assert by_canvas == expected
    assert pages["formgrader"].count("does not exist") == 0, pages["formgrader"]  # no exchange warning

    # what a student cannot read: another's submission and feedback, the course's hidden files
    inbound, outbound_feedback = exchange / COURSE_ID / "inbound", exchange / COURSE_ID / "feedback"
    for path in (inbound, outbound_feedback, course / "solutions", course / ".nbgrader" / "gradebook.db",
                 course / ".nbgrader" / "submitted" / alice, Path(f"/proc/{os.getpid()}/environ"),
                 Path(semester["users"].homes / alice / COURSE_ID)):
        # a folder is listed, a file read: `ls` of a file needs no right to read it (/proc/PID/environ is 0400)
        denied = as_user(bob, "ls" if path.is_dir() else "head", *([] if path.is_dir() else ["-c", "1"]), str(path),
                         check=False)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, (path, denied.stdout)
    assert as_user(names["dave"], "ls", str(exchange / COURSE_ID), check=False).returncode != 0

    lap("what a student cannot read")
    print(f"rehearsal: {time.monotonic() - started:.0f} s in all after the hub started")


def browse(hub, passwords, ta, student, folder):
    """One page of each in headless Chromium, after logging in with the hub's form: formgrader's assignments as the
    TA sees them, and the Assignment List (the Nbgrader menu of the student's file page) once it has listed the
    course's two assignments. The pages' text."""
    pages = {}
    for user, url, menu, shows in ((ta, f"/user/{ta}/formgrader/manage_assignments", None, (FIRST, SECOND)),
                                   (student, f"/user/{student}/tree", ("Nbgrader", "Assignment List"),
                                    (COURSE_ID, FIRST, SECOND))):
        browser = Browser(folder / f"browser-{user}")
        try:
            browser.log_in(hub, user, passwords[user])
            browser.open(hub.url + url)
            if menu:
                browser.menu(*menu)
            browser.wait_for(" && ".join(f"document.body.innerText.includes({json.dumps(s)})" for s in shows),
                             f"{url} did not show {', '.join(shows)}")
            pages["formgrader" if user == ta else "assignment list"] = browser.text()
        finally:
            browser.close()
    return pages


def rehearsed(course, student):
    """Whether `student`'s autograded lab14 trained its experiments as course.yaml's profile says (its steps)."""
    steps = yaml.safe_load((course / "course.yaml").read_text())["profiles"][PROFILE[profiles.ENV]]["experiments"][
        "steps"]
    nb = json.loads((course / ".nbgrader" / "autograded" / student / FIRST / f"{FIRST}.ipynb").read_text())
    trained = [run for t in nb["metadata"]["course_results"]["tests"]
               for run in t.get("extra_data", {}).get("trained", [])]
    return bool(trained) and all(run["steps"] == steps for run in trained)


def succeeded(answer):
    """formgrader's answer to an action: {"success": true, ...}, else the log it returned, in the failure."""
    assert answer.get("success"), json.dumps(answer, indent=1)[-4000:]
    return answer


def page_score(html):
    """The grade a feedback page shows at its top, "<notebook>: X / Y points" (the late penalty already off)."""
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))
    found = re.search(r": ([\d.]+) / ([\d.]+) points", text)
    assert found, text[:2000]
    return float(found.group(1))


def canvas_grades(path):
    """student (their SIS login) -> assignment -> the grade Canvas imports; empty cells left out."""
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    columns = {c: re.search(r"\((\w+)\)$", c).group(1) for c in rows[0] if re.search(r"\((\w+)\)$", c)}
    return {r["SIS Login ID"]: {aid: float(r[c]) for c, aid in columns.items() if r[c]}
            for r in rows if r["Student"] != "Points Possible" and r["SIS Login ID"]}
