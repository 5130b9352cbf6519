"""The semester's rules without grading: the late policy's arithmetic, due times, submission times, extensions,
rosters and the LMS exports, and a clear one-line error for every bad input, with nothing written."""
import csv
import json
import shutil
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from autograder.cli import main
from autograder.course.config import ROOT, LatePolicy, parse_course
from autograder.course.extensions import extend, read_extensions
from autograder.course.lateness import lateness
from autograder.course.roster import read_roster, student_of
from autograder.course.submission_times import from_csv, from_gradescope, from_timestamp_file
from autograder.errors import ConfigError

AID = "lab14_transformers"
DUE = datetime(2026, 12, 12, 23, 59, tzinfo=UTC)
POLICY = LatePolicy(grace_minutes=15, percent_per_day=10, floor_percent=50, close_days=7)


@pytest.mark.parametrize("after, days, off, status", [
    (timedelta(minutes=-5), 0, 0, "on time"),
    (timedelta(0), 0, 0, "on time"),
    (timedelta(minutes=15), 0, 0, "in grace"),              # the grace period's last second still counts
    (timedelta(minutes=16), 1, 10, "late"),                 # past grace: a started day, counted from the due time
    (timedelta(hours=25), 2, 20, "late"),
    (timedelta(days=6, hours=1), 7, 50, "late"),            # 70% capped by the floor: half the raw score stays
    (timedelta(days=7, seconds=1), 8, 100, "closed"),       # past the close: 0
])
def test_the_late_policys_arithmetic(after, days, off, status):
    late = lateness(DUE + after, DUE, POLICY)
    assert (late.days, late.percent_off, late.status) == (days, off, status)
    assert late.final(29) == pytest.approx(29 * (1 - off / 100))


def test_an_extension_moves_the_due_time_and_missing_times_are_on_time_and_say_so():
    assert lateness(DUE + timedelta(hours=25), DUE, POLICY, extension_days=2).status == "on time"
    assert lateness(DUE + timedelta(hours=25), DUE, POLICY, extension_days=1).days == 1
    assert lateness(None, DUE, POLICY).text() == "on time (no submission time)"
    assert lateness(DUE + timedelta(days=3), None, POLICY).text() == "no due date"
    assert lateness(DUE + timedelta(hours=25), DUE, POLICY).text() == "2 days late: -20%"


def course_text(**replace):
    text = (ROOT / "course.yaml").read_text()
    for old, new in replace.items():
        assert old in text or old == "", old
        text = text.replace(old, new, 1)
    return text


LAB14 = "  lab14_transformers:\n"


@pytest.mark.parametrize("insert, says", [
    (f'{LAB14}    due: "2026-12-12T23:59:00"\n', "has no UTC offset"),
    (f'{LAB14}    due: "next friday"\n', "is not an ISO 8601 time"),
    (f"{LAB14}    late: {{percent_per_day: 120}}\n", "late.percent_per_day"),
    (f"{LAB14}    late: {{floor_percent: -1}}\n", "late.floor_percent"),
])
def test_a_bad_due_time_or_policy_is_one_error_naming_the_key(insert, says):
    with pytest.raises(ConfigError, match=says) as e:
        parse_course(course_text(**{LAB14: insert}), "course.yaml")
    assert "lab14_transformers" in str(e.value) and len(str(e.value).splitlines()) == 1


def test_a_due_time_keeps_its_offset_and_an_assignment_overrides_the_courses_policy():
    raw = yaml.safe_load(course_text(**{LAB14: f'{LAB14}    due: 2026-12-12T23:59:00+05:30\n'
                                               f'    late: {{percent_per_day: 25}}\n'}))
    raw["late"] = {"grace_minutes": 10, "percent_per_day": 5}
    course = parse_course(yaml.safe_dump(raw), "course.yaml")
    assert course.assignment(AID).due == datetime(2026, 12, 12, 18, 29, tzinfo=UTC)
    assert course.late_policy(AID) == LatePolicy(grace_minutes=10, percent_per_day=25)
    assert course.late_policy("w8l4_transformers") == LatePolicy(grace_minutes=10, percent_per_day=5)


@pytest.mark.parametrize("text, expected", [
    ("2026-12-13 19:29:00.123456 UTC", datetime(2026, 12, 13, 19, 29, 0, 123456, tzinfo=UTC)),  # nbgrader collect
    ("2026-12-13 19:29:00", datetime(2026, 12, 13, 19, 29, tzinfo=UTC)),                    # zip_collect, no zone
    ("2026-12-14T00:59:00+05:30", datetime(2026, 12, 13, 19, 29, tzinfo=UTC)),
])
def test_timestamp_txt_reads_as_nbgrader_reads_it(tmp_path, text, expected):
    (tmp_path / "timestamp.txt").write_text(text + "\n")
    assert from_timestamp_file(tmp_path) == expected
    assert from_timestamp_file(tmp_path / "none") is None  # no file: no time (on time)


@pytest.mark.parametrize("text, says", [("yesterday-ish", "is not a time"), ("", "empty")])
def test_a_timestamp_txt_that_does_not_parse_is_one_line_naming_it(tmp_path, text, says):
    (tmp_path / "timestamp.txt").write_text(text)
    with pytest.raises(ConfigError, match=says) as e:
        from_timestamp_file(tmp_path)
    assert str(tmp_path / "timestamp.txt") in str(e.value) and "\n" not in str(e.value)


def test_gradescope_metadata_gives_the_time_and_a_users_later_due_date_as_an_extension(tmp_path):
    meta = {"created_at": "2026-12-13T19:29:00.000000+00:00",
            "assignment": {"due_date": "2026-12-12T18:29:00.000000+00:00"},
            "users": [{"name": "A", "assignment": {"due_date": "2026-12-14T18:29:00.000000+00:00"}},
                      {"name": "B", "assignment": {"due_date": "2026-12-12T18:29:00.000000+00:00"}}]}
    (tmp_path / "m.json").write_text(json.dumps(meta))
    assert from_gradescope(tmp_path / "m.json") == (datetime(2026, 12, 13, 19, 29, tzinfo=UTC), 2.0)
    (tmp_path / "m.json").write_text(json.dumps({"created_at": "2026-12-13T19:29:00Z"}))
    assert from_gradescope(tmp_path / "m.json")[1] == 0.0


def test_submission_times_from_a_csv_and_its_errors_name_the_line(tmp_path):
    path = tmp_path / "times.csv"
    path.write_text("submission,submitted_at\nalice,2026-12-13T19:29:00+00:00\n")
    assert from_csv(path) == {"alice": datetime(2026, 12, 13, 19, 29, tzinfo=UTC)}
    path.write_text("submission,submitted_at\nalice,2026-12-13T19:29:00+00:00\nalice,2026-12-14T00:00:00+00:00\n")
    with pytest.raises(ConfigError, match="line 3: submission 'alice' is listed twice"):
        from_csv(path)
    path.write_text("name,when\n")
    with pytest.raises(ConfigError, match="line 1: no column submission, submitted_at"):
        from_csv(path)


@pytest.fixture
def course_folder(tmp_path, monkeypatch):
    """A course folder of its own (course.yaml, nbgrader's settings): its extensions.csv is this test's."""
    folder = tmp_path / "course"
    folder.mkdir()
    shutil.copy(ROOT / "course.yaml", folder / "course.yaml")
    shutil.copy(ROOT / "nbgrader_config.py", folder / "nbgrader_config.py")
    monkeypatch.setenv("COURSE_ROOT", str(folder))
    monkeypatch.delenv("COURSE_CONFIG", raising=False)
    return folder


def test_extend_writes_replaces_and_removes_an_extension(course_folder):
    path = course_folder / "extensions.csv"
    extend("alice", AID, 2, {"alice", "bob"})
    extend("bob", AID, 1.5, {"alice", "bob"})
    extend("alice", AID, 3, {"alice", "bob"})
    assert read_extensions(path) == {("alice", AID): 3.0, ("bob", AID): 1.5}
    extend("bob", AID, 0, {"alice", "bob"})
    assert read_extensions(path) == {("alice", AID): 3.0}


@pytest.mark.parametrize("args, says", [
    (["extend", "mallory", AID, "--days", "2"], "no student 'mallory' in this course"),
    (["extend", "alice", "lab99", "--days", "2"], "no assignment 'lab99'"),
    (["extend", "alice", AID, "--days", "-1"], "an extension is 0 to 366 days"),
])
def test_a_bad_extension_is_one_line_and_the_file_is_unchanged(course_folder, capsys, args, says):
    roster = course_folder / "roster.csv"
    roster.write_text("student\nalice\n")
    assert main(["extend", "alice", AID, "--days", "1", "--roster", str(roster)]) == 0
    before = (course_folder / "extensions.csv").read_bytes()
    capsys.readouterr()
    assert main([*args, "--roster", str(roster)]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert (course_folder / "extensions.csv").read_bytes() == before


@pytest.mark.parametrize("text, says", [
    ("student,assignment,days\nalice,lab99,1\n", "line 2: assignment 'lab99' is not in"),
    ("student,assignment,days\nalice,lab14_transformers,lots\n", "line 2: days 'lots' is not a number"),
    ("student,assignment,days\nalice,lab14_transformers,1\nalice,lab14_transformers,2\n", "line 3: alice already"),
    ("student,days\nalice,1\n", "line 1: no column assignment"),
])
def test_a_hand_edited_extensions_csv_is_read_with_errors_naming_line_and_field(course_folder, text, says):
    (course_folder / "extensions.csv").write_text(text)
    with pytest.raises(ConfigError, match=says):
        read_extensions()


def test_a_roster_names_its_missing_column_and_duplicate_student(tmp_path):
    path = tmp_path / "roster.csv"
    path.write_text("\ufeffstudent,email\nalice,a@x.edu\nbob,b@x.edu\n")  # the LMS's byte-order mark is fine
    assert [r["email"] for r in read_roster(path, ["email"])] == ["a@x.edu", "b@x.edu"]
    with pytest.raises(ConfigError, match="line 1: no column SIS User ID"):
        read_roster(path, ["SIS User ID"])
    path.write_text("student,email\nalice,a@x.edu\nalice,c@x.edu\n")
    with pytest.raises(ConfigError, match=r"line 3: student 'alice' is listed twice \(line 2\)"):
        read_roster(path)
    assert student_of("secA/alice") == student_of("alice~2") == "alice"


def results_folder(folder, scores, submitted):
    """lab14 results as `course grade --results-dir` saves them: name -> raw score, and a submission time."""
    from tests.test_report import result
    folder.mkdir(parents=True)
    for name, score in scores.items():
        res = result(stubbed=[] if score else list(load_items()))
        res["score"] = float(score)
        res["extra_data"]["assignment"] = AID
        res["extra_data"]["grading"] = {"submitted_at": submitted.get(name)}  # as course grade records it
        (folder / f"{name}.json").write_text(json.dumps(res))
    return folder


def load_items():
    from autograder.course.config import load_course
    return load_course().assignment(AID).items


CANVAS_ROSTER = ("student,Student,ID,SIS User ID,SIS Login ID,Section,email\n"
                 "alice,\"Liddell, Alice\",101,s101,alice,A,alice@x.edu\n"
                 "bob,=HYPERLINK(\"x\"),102,s102,bob,A,bob@x.edu\n"
                 "carol,Carol,103,s103,carol,B,carol@x.edu\n")


def due_course(course_folder):
    """The folder's lab14 due on 2026-12-12 at 23:59 UTC, late work losing 10% a started day down to half."""
    raw = yaml.safe_load((course_folder / "course.yaml").read_text())
    raw["late"] = {"percent_per_day": 10, "floor_percent": 50}
    raw["assignments"][AID]["due"] = "2026-12-12T23:59:00+00:00"
    (course_folder / "course.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))


def test_the_canvas_and_moodle_exports_read_back_to_their_documented_layout(course_folder, tmp_path):
    due_course(course_folder)
    graded = results_folder(tmp_path / "graded" / AID, {"alice": 29, "bob": 20},
                            {"alice": "2026-12-12T20:00:00+00:00", "bob": "2026-12-14T01:00:00+00:00"})
    (tmp_path / "roster.csv").write_text(CANVAS_ROSTER)
    out = tmp_path / "canvas.csv"
    assert main(["export", "grades", str(graded.parent), "--roster", str(tmp_path / "roster.csv"), "--lms", "canvas",
                 "-o", str(out)]) == 0
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
                       "Attention and transformers (lab) (lab14_transformers)"]
    assert rows[1] == ["    Points Possible", "", "", "", "", "39"]  # 29 automatic + 10 written
    assert rows[2] == ["Liddell, Alice", "101", "s101", "alice", "A", "29"]
    assert rows[3] == ["'=HYPERLINK(\"x\")", "102", "s102", "bob", "A", "16"]  # 2 days late: 20% off; no formula
    assert rows[4] == ["Carol", "103", "s103", "carol", "B", ""]  # no submission: empty, not 0
    out = tmp_path / "moodle.csv"
    assert main(["export", "grades", str(graded.parent), "--roster", str(tmp_path / "roster.csv"), "--lms", "moodle",
                 "-o", str(out)]) == 0
    assert list(csv.reader(out.open())) == [["email", "Attention and transformers (lab)"], ["alice@x.edu", "29"],
                                            ["bob@x.edu", "16"], ["carol@x.edu", ""]]


def test_an_extension_granted_after_grading_changes_the_export_and_grades_nothing(course_folder, tmp_path,
                                                                                  monkeypatch):
    from autograder.sandbox.grader_side import Sandbox
    started = []
    monkeypatch.setattr(Sandbox, "start", lambda self: started.append(self))  # counted, never run
    due_course(course_folder)
    graded = results_folder(tmp_path / "graded" / AID, {"bob": 20}, {"bob": "2026-12-14T01:00:00+00:00"})
    (tmp_path / "roster.csv").write_text("student,email\nbob,bob@x.edu\n")
    out = tmp_path / "all.csv"
    args = ["export", "grades", str(graded.parent), "--roster", str(tmp_path / "roster.csv"), "--lms", "csv", "-o",
            str(out)]
    assert main(args) == 0
    assert next(csv.DictReader(out.open()))[f"{AID}:final"] == "16"
    before = {p: p.read_bytes() for p in graded.iterdir()}
    assert main(["extend", "bob", AID, "--days", "2", "--roster", str(tmp_path / "roster.csv")]) == 0
    assert main(args) == 0
    row = next(csv.DictReader(out.open()))
    assert (row[f"{AID}:raw"], row[f"{AID}:lateness"], row[f"{AID}:final"]) == ("20", "on time", "20")
    assert {p: p.read_bytes() for p in graded.iterdir()} == before  # the results are as graded: nothing regraded
    assert started == []  # and no sandbox started


@pytest.mark.parametrize("roster, says", [
    ("student,email\nalice,a@x.edu\nalice,b@x.edu\n", "line 3: student 'alice' is listed twice"),
    ("name,email\nalice,a@x.edu\n", "line 1: no column student"),
    ("student,email\ncarol,c@x.edu\n", "no row for 1 students with results: alice"),
])
def test_a_bad_roster_is_one_line_and_nothing_is_written(course_folder, tmp_path, capsys, roster, says):
    graded = results_folder(tmp_path / "graded" / AID, {"alice": 29}, {})
    (tmp_path / "roster.csv").write_text(roster)
    out = tmp_path / "moodle.csv"
    assert main(["export", "grades", str(graded.parent), "--roster", str(tmp_path / "roster.csv"), "--lms", "moodle",
                 "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_a_timestamp_that_does_not_parse_stops_course_grade_before_it_grades_anything(tmp_path, capsys):
    folder = tmp_path / "subs" / "alice"
    folder.mkdir(parents=True)
    shutil.copy(ROOT / "release" / AID / f"{AID}.ipynb", folder / f"{AID}.ipynb")
    (folder / "timestamp.txt").write_text("the day before yesterday")
    assert main(["grade", str(tmp_path / "subs"), "-a", AID, "--results-dir", str(tmp_path / "graded")]) == 2
    err = capsys.readouterr().err.strip()
    assert str(folder / "timestamp.txt") in err and "is not a time" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "graded").exists()


def test_a_result_of_some_items_only_is_no_grade_to_export(course_folder, tmp_path, capsys):
    graded = results_folder(tmp_path / "graded" / AID, {"alice": 5}, {})
    partial = json.loads((graded / "alice.json").read_text())
    partial["max_score"] = 5.0  # as `course grade --items scaled_dot_product_attention` saves it
    (graded / "alice.json").write_text(json.dumps(partial))
    (tmp_path / "roster.csv").write_text("student,email\nalice,a@x.edu\n")
    out = tmp_path / "moodle.csv"
    assert main(["export", "grades", str(graded.parent), "--roster", str(tmp_path / "roster.csv"), "--lms", "moodle",
                 "-o", str(out)]) == 2
    assert "graded on some items only (course grade --items): lab14_transformers/alice" in capsys.readouterr().err
    assert not out.exists()


def test_two_results_of_one_student_stop_the_export_naming_both(course_folder, tmp_path, capsys):
    """alice~2 (a second notebook of alice's folder) and secA/alice, secB/alice: which one is alice's grade is the
    TA's call, never the first one found."""
    graded = results_folder(tmp_path / "graded" / AID, {"alice": 29, "alice~2": 0, "bob": 20}, {})
    (tmp_path / "roster.csv").write_text("student,email\nalice,a@x.edu\nbob,b@x.edu\n")
    out = tmp_path / "moodle.csv"
    args = ["export", "grades", str(graded.parent), "--roster", str(tmp_path / "roster.csv"), "--lms", "moodle",
            "-o", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert f"two results for one student: alice on {AID} ({AID}/alice, {AID}/alice~2)" in err, err
    assert len(err.splitlines()) == 1 and not out.exists()
    (graded / "alice~2.json").unlink()  # the TA keeps the one that is alice's: the export goes through
    assert main(args) == 0
    assert list(csv.reader(out.open()))[1] == ["a@x.edu", "29"]


# 29 raw points a started day late at 15% a day: 24.65, the penalty 4.35 (issue 59: exported as 24.6 and 4.3)
LATE_BY_A_DAY = {"alice": "2026-12-13T01:00:00+00:00"}


def fifteen_percent_course(course_folder):
    raw = yaml.safe_load((course_folder / "course.yaml").read_text())
    raw["late"] = {"percent_per_day": 15}
    raw["assignments"][AID]["due"] = "2026-12-12T23:59:00+00:00"
    (course_folder / "course.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))


def test_a_final_score_of_24_65_is_exported_to_the_cent_by_every_lms_export(course_folder, tmp_path):
    fifteen_percent_course(course_folder)
    graded = results_folder(tmp_path / "graded" / AID, {"alice": 29}, LATE_BY_A_DAY)
    (tmp_path / "roster.csv").write_text(CANVAS_ROSTER)
    exported = {}
    for lms in ("canvas", "moodle", "csv"):
        out = tmp_path / f"{lms}.csv"
        assert main(["export", "grades", str(graded.parent), "--roster", str(tmp_path / "roster.csv"), "--lms", lms,
                     "-o", str(out)]) == 0
        exported[lms] = list(csv.reader(out.open()))
    assert exported["canvas"][2][-1] == "24.65" and exported["moodle"][1] == ["alice@x.edu", "24.65"]
    row = dict(zip(exported["csv"][0], exported["csv"][1], strict=True))
    assert (row[f"{AID}:raw"], row[f"{AID}:penalty"], row[f"{AID}:final"]) == ("29", "4.35", "24.65")
    assert row[f"{AID}:lateness"] == "1 day late: -15%"


def test_a_final_score_of_24_65_is_exported_to_the_cent_by_course_grade_csv(course_folder, tmp_path):
    from autograder.reports.final_grade import final_grades
    from autograder.reports.tables import write_csv
    from tests.test_report import result
    fifteen_percent_course(course_folder)
    rows = [("alice", result(aid=AID, experiments=dict.fromkeys(load_course_here().assignment(AID).experiments)))]
    finals = final_grades(AID, rows, times={"alice": datetime(2026, 12, 13, 1, tzinfo=UTC)})
    write_csv(tmp_path / "grades.csv", rows, list(load_items()), finals=finals)
    [row] = list(csv.DictReader((tmp_path / "grades.csv").open()))
    assert (row["score"], row["penalty"], row["final_score"]) == ("29", "4.35", "24.65")


def test_a_final_score_of_24_65_is_exported_to_the_cent_by_nbgrader_export(course_folder, tmp_path, monkeypatch):
    import os
    import sys

    from nbgrader.api import Gradebook

    from autograder.integrations.nbgrader_export import CourseExportPlugin
    fifteen_percent_course(course_folder)
    # a new gradebook runs nbgrader's migrations with this environment's alembic, as `nbgrader` finds it
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}")
    assignment = load_course_here().assignment(AID)
    with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gb:
        gb.add_assignment(AID, duedate=datetime(2026, 12, 12, 23, 59))
        gb.update_or_create_notebook(AID, AID)
        for item in assignment.items:
            gb.update_or_create_grade_cell(f"test_{item}", AID, AID, max_score=assignment.item_points(item),
                                           cell_type="code")
        gb.add_student("alice")
        gb.add_submission(AID, "alice", timestamp=datetime(2026, 12, 13, 1))  # nbgrader's: naive UTC
        for item in assignment.items:  # every check passed: 29 automatic points
            grade = gb.find_grade(f"test_{item}", AID, AID, "alice")
            grade.auto_score = assignment.item_points(item)
        gb.db.commit()
        CourseExportPlugin(to=str(tmp_path / "nbgrader.csv")).export(gb)
    [row] = list(csv.DictReader((tmp_path / "nbgrader.csv").open()))
    assert (row["raw_score"], row["late_submission_penalty"], row["score"]) == ("29", "4.35", "24.65")


def test_a_final_score_of_24_65_is_exported_to_the_cent_to_gradescope(course_folder, tmp_path):
    from autograder.integrations.otter_plugin import apply_lateness
    fifteen_percent_course(course_folder)
    (tmp_path / "submission_metadata.json").write_text(json.dumps({
        "created_at": LATE_BY_A_DAY["alice"], "users": [{"name": "alice"}]}))
    graded = {"tests": [{"name": "all", "score": 29.0, "max_score": 29.0}], "extra_data": {}}
    apply_lateness(graded, tmp_path, AID)
    [late] = [t for t in graded["tests"] if t["name"] == "Late submission"]
    assert (graded["score"], late["score"]) == (24.65, -4.35)
    assert json.loads(json.dumps(graded))["score"] == 24.65 and "29 points become 24.65" in late["output"]


def load_course_here():
    from autograder.course.config import load_course
    return load_course()
