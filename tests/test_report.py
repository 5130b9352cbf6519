"""The TA's readouts without grading: the terminal table at 21 items, reasons, the class report's escaping."""
import json

from autograder.class_report import class_report, normalised
from autograder.config import load_course
from autograder.scoring import Outcome
from autograder.report import WIDTH, grade_table, lost_points, reason_lines

AID = "w8l1_attention_vision"
LONG = ("max |out - reference| = 0.0125 at batch 1, head 3, query 7, column 12 (tolerance 1e-05) on the case "
        "with a padding mask that blocks the last two keys of the second sequence, where softmax must give zero")


def result(stubbed=(), wrong=(), hostile=""):
    """A result in grade_notebook's format (Outcome.as_test), for every item and check of course.yaml."""
    assignment = load_course().assignment(AID)
    tests = []
    for item, spec in assignment.items.items():
        for kind, points in spec.points.items():
            o = Outcome(item, kind, points)
            if item in stubbed:
                o.output = f"'{item}' is not implemented yet (it raises NotImplementedError)"
            elif item in wrong and kind == "values":
                o.output = LONG + hostile
            else:
                o.score, o.output = points, "ok"
            tests.append(o.as_test())
    return {"score": sum(t["score"] for t in tests), "max_score": sum(t["max_score"] for t in tests), "output": "",
            "visibility": "visible", "tests": tests, "extra_data": {"assignment": AID, "notebook": "x.ipynb"}}


def test_table_of_21_items_fits_120_columns():
    items = list(load_course().assignment(AID).items)
    assert len(items) == 21
    rows = [("a-student-with-a-very-long-name-indeed", result(stubbed=items[:3], wrong=items[3:5])),
            ("bob", result())]
    table = grade_table(rows, items)
    assert all(len(line) <= WIDTH for line in table.splitlines()), max(table.splitlines(), key=len)
    for k, item in enumerate(items, 1):
        assert f"#{k} {item}" in table.replace("\n       ", " ")  # the legend names every column
    assert f"{rows[1][1]['score']:g}/{rows[1][1]['max_score']:g}" in table


def test_reasons_wrap_not_cut_and_a_stub_is_one_reason():
    items = list(load_course().assignment(AID).items)
    res = result(stubbed=[items[0]], wrong=[items[1]])
    lines = reason_lines("carol", res, limit=10)
    assert all(len(line) <= WIDTH for line in lines)
    text = " ".join(line.strip() for line in lines)
    assert LONG in text  # every word is there, wrapped
    assert text.count("is not implemented yet") == 1
    reasons, extra = lost_points(res, limit=1)
    assert len(reasons) == 1 and extra == "+1 more"


def test_class_report_escapes_and_groups(tmp_path):
    items = list(load_course().assignment(AID).items)
    for k in range(3):
        res = result(wrong=[items[0]], hostile="<script>alert(1)</script>" if k == 0 else "")
        res["tests"][2]["output"] = res["tests"][2]["output"].replace("0.0125", f"0.0{k + 3}")
        (tmp_path / f"<img src=x onerror=alert(1)>{k}.json").write_text(json.dumps(res))
    (tmp_path / "notes.json").write_text("[1, 2]")  # not a result: skipped
    page = class_report(tmp_path)
    assert "<script>" not in page and "<img src=x" not in page
    assert "3 graded submissions" in page and page.count("data:image/png;base64,") == 2
    assert normalised("max 0.0125 at batch 1 (tolerance 1e-05)") == "max # at batch # (tolerance #)"
    assert normalised("'conv2d' of lab14") == "'conv2d' of lab14"
    assert "<b>2</b> &times;" in page and "<b>1</b> &times;" in page  # two alike, one with a script tail


def test_the_csv_keeps_a_formula_looking_name_as_text(tmp_path):
    import csv
    from autograder.report import write_csv
    items = list(load_course().assignment(AID).items)
    write_csv(tmp_path / "grades.csv", [("=HYPERLINK(\"http://x\",\"y\")", result()), ("-2+3", result()),
                                        ("alice", result())], items)
    names = [row[0] for row in csv.reader(open(tmp_path / "grades.csv"))][1:]
    assert names == ["'=HYPERLINK(\"http://x\",\"y\")", "'-2+3", "alice"]
