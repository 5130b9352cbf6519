"""The TA's readouts without grading: the terminal table at 21 items, reasons, the pages' escaping."""
import json

from autograder.course.config import load_course
from autograder.grading.scoring import Outcome, results_json
from autograder.reports.class_report import class_report, normalised
from autograder.reports.tables import WIDTH, grade_table, lost_points, reason_lines

AID = "w8l1_attention_vision"
LONG = ("max |out - reference| = 0.0125 at batch 1, head 3, query 7, column 12 (tolerance 1e-05) on the case "
        "with a padding mask that blocks the last two keys of the second sequence, where softmax must give zero")


def result(stubbed=(), wrong=(), hostile="", aid=AID, experiments=None):
    """A result as the grader writes it (Outcome.as_test, scoring.results_json), for every item and check of
    course.yaml; `experiments`: name -> measured metrics ({} when it did not train) or None (passed with the
    lecture's figures), as experiments.run_experiment records them."""
    assignment = load_course().assignment(aid)
    outcomes = []
    for item, spec in assignment.items.items():
        for kind, points in spec.points.items():
            o = Outcome(item, kind, points)
            if item in stubbed:
                o.output = f"'{item}' is not implemented yet (it raises NotImplementedError)"
            elif item in wrong and kind == "values":
                o.output = LONG + hostile
            else:
                o.score, o.output = points, "ok"
            outcomes.append(o)
        for exp in assignment.experiments_of(item):
            if experiments is None or exp.name not in experiments:
                continue
            metrics = experiments[exp.name]
            if metrics is None:  # the lecture's figures, and each threshold's bound
                bounds = {k: b.min if b.min is not None else b.max for k, b in exp.threshold.items()}
                metrics = {**exp.lecture, **bounds}
            o = Outcome(item, f"experiment {exp.name}", exp.points)
            o.extra = {"experiment": exp.name, "seed": exp.seeds[0], "metrics": metrics}
            o.score = exp.points if metrics and not exp.failures(metrics) else 0.0
            o.output = f"{exp.description}: {'passed' if o.score else 'missed the lecture threshold'}"
            outcomes.append(o)
    return results_json(outcomes, aid=aid, notebook="x.ipynb", device="cpu", seed=0, output="", isolation="namespaces",
                        restarts=0, seconds=1.0, notes=[])


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


HOSTILE = "<script>alert(document.cookie)</script> & <b>co</b>"  # no digit: the report shows digits as #
ESCAPED = "&lt;script&gt;alert(document.cookie)&lt;/script&gt; &amp; &lt;b&gt;co&lt;/b&gt;"


def feedback_page(result):
    """nbgrader's feedback page of a notebook graded `result`, rendered as `nbgrader generate_feedback` renders it
    (nbgrader_config.py's exporter settings and FeedbackSummary; the grades nbgrader's GetGrades would add, fixed)."""
    import os

    import nbformat
    import nbgrader
    from traitlets.config.loader import PyFileConfigLoader

    from autograder.course.config import ROOT
    from autograder.integrations.nbgrader_plugin import RESULTS_KEY, CourseFeedbackExporter, FeedbackSummary
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    assert FeedbackSummary in config.GenerateFeedback.preprocessors
    assert config.GenerateFeedback.exporter_class is CourseFeedbackExporter
    config.HTMLExporter.extra_template_paths = [os.path.join(  # what nbgrader's GenerateFeedback adds
        os.path.dirname(nbgrader.__file__), "server_extensions", "formgrader", "static", "node_modules", "bootstrap",
        "dist", "css")]
    exporter = CourseFeedbackExporter(config=config)
    exporter.register_preprocessor(FeedbackSummary(), enabled=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("hello")], metadata={RESULTS_KEY: result})
    grades = {"notebook": "lab", "score": 1.0, "max_score": 2.0, "late_penalty": 0}
    return exporter.from_notebook_node(nb, resources={"nbgrader": grades})[0]


def test_student_text_is_escaped_exactly_once_on_the_feedback_page_and_in_the_class_report(tmp_path):
    """A reason and the submission's output quote what the student's code printed: text, never markup, and never
    escaped twice (the summary is rendered with autoescape, then put into nbgrader's page as it is)."""
    items = list(load_course().assignment(AID).items)
    res = result(wrong=[items[3]], hostile=HOSTILE)
    res["output"] = "the notebook printed " + HOSTILE
    page = feedback_page(res)
    summary = page[:page.index('id="notebook"')]
    assert summary.count(ESCAPED) == 2, summary  # the reason and the output, each escaped once
    assert HOSTILE not in page and "&amp;lt;" not in page and "&amp;amp;" not in page
    (tmp_path / "alice.json").write_text(json.dumps(res))
    report = class_report(tmp_path)
    # the reason twice, in the per-item table and the per-check table (check_stats.html.j2), each escaped once
    assert report.count(ESCAPED) == 2 and HOSTILE not in report and "&amp;lt;" not in report
    assert "<script" not in report  # the report has no script of its own either


def test_one_helper_puts_each_metric_beside_the_lecture_and_the_bound():
    from autograder.course.config import Bound
    from autograder.reports.tables import metric_rows
    rows = metric_rows({"acc": 0.912345, "loss": 0.5}, {"acc": 0.95, "speed": 3}, {"acc": Bound(min=0.9)})
    assert [r.name for r in rows] == ["acc", "loss", "speed"]  # the threshold's first, then measured, then lecture
    assert rows[0].text() == "acc 0.9123 (lecture 0.95) [>= 0.9]"
    assert rows[1].text() == "loss 0.5" and rows[2].text() == "speed - (lecture 3)"


def test_the_csv_keeps_a_formula_looking_name_as_text(tmp_path):
    import csv

    from autograder.reports.tables import write_csv
    items = list(load_course().assignment(AID).items)
    write_csv(tmp_path / "grades.csv", [("=HYPERLINK(\"http://x\",\"y\")", result()), ("-2+3", result()),
                                        ("alice", result())], items)
    with open(tmp_path / "grades.csv") as grades:
        names = [row[0] for row in csv.reader(grades)][1:]
    assert names == ["'=HYPERLINK(\"http://x\",\"y\")", "'-2+3", "alice"]


def test_class_report_shows_every_experiment_even_one_whose_metric_has_no_threshold(tmp_path):
    """w8l1's dae_mnist is judged on dae_beats_ae, not on its own metric dae_mse: the report crashed on it."""
    experiments = load_course().assignment(AID).experiments
    assert any(exp.metric not in exp.threshold for exp in experiments.values())  # the case this test is about
    measured = {name: None for name in experiments}
    (tmp_path / "alice.json").write_text(json.dumps(result(experiments=measured)))
    (tmp_path / "bob.json").write_text(json.dumps(result(experiments={name: {} for name in experiments})))
    page = class_report(tmp_path)
    for name, exp in experiments.items():
        if exp.graded:
            assert f"Experiment {name}</h3>" in page
            assert "reached by 1 of 2 submissions, measured for 1" in page.split(f"Experiment {name}</h3>")[1]
    dae = page.split("Experiment dae_mnist</h3>")[1].split("<h3>")[0]
    assert "passing needs dae_beats_ae &gt;= 1" in dae and "data:image/png;base64," in dae


def test_class_report_of_a_folder_of_assignments_has_one_section_each(tmp_path):
    """`course grade ... --results-dir graded/<id>/` for each assignment, then `course report graded/`."""
    lab = "lab14_transformers"
    lab_items = list(load_course().assignment(lab).items)
    for aid, names in ((AID, ["alice", "bob"]), (lab, ["alice", "carol", "dave"])):
        (tmp_path / aid).mkdir()
        for name in names:
            res = result(aid=aid, stubbed=lab_items[:1] if name == "carol" else ())
            (tmp_path / aid / f"{name}.json").write_text(json.dumps(res))
    (tmp_path / lab / "sectionB").mkdir()  # a second section of lab14 with its own alice
    (tmp_path / lab / "sectionB" / "alice.json").write_text(json.dumps(result(aid=lab, stubbed=lab_items)))
    (tmp_path / lab / ".alice.lock").write_text("")  # what a running `course grade` leaves: not a result
    retired = result(aid=lab, experiments={"memory_task": None})
    retired["extra_data"]["assignment"] = "lab13_retired"  # an assignment course.yaml no longer has
    (tmp_path / "lab13_retired.json").write_text(json.dumps(retired))
    page = class_report(tmp_path)
    sections = {part.split("</h2>")[0]: part for part in page.split("<h2>")[1:]}
    assert set(sections) == {AID, lab, "lab13_retired"}
    assert "<p>1 submissions;" in sections["lab13_retired"] and "experiments are not shown" in sections["lab13_retired"]
    assert "<p>2 submissions;" in sections[AID] and "<p>4 submissions;" in sections[lab]
    assert "1 zero." in sections[lab]  # sectionB's alice did not replace the first section's
    assert "7 graded submissions of 3 assignment(s)" in page


def test_class_report_leaves_an_items_only_result_out_of_the_totals(tmp_path):
    lab = "lab14_transformers"
    full = result(aid=lab)
    partial = dict(full, tests=[t for t in full["tests"] if t["item"] == "scaled_dot_product_attention"])
    partial.update(score=sum(t["score"] for t in partial["tests"]),
                   max_score=sum(t["max_score"] for t in partial["tests"]))
    (tmp_path / "alice.json").write_text(json.dumps(full))
    (tmp_path / "bob.json").write_text(json.dumps(partial))
    page = class_report(tmp_path)
    assert "<p>1 submissions;" in page and "1 full marks" in page
    assert "1 more graded on some items only" in page


def test_a_long_name_with_folders_keeps_its_end_in_the_table():
    """Names told apart by their folders (course grade secA/ secB/) differ at the end: that part is shown."""
    items = list(load_course().assignment(AID).items)[:3]
    rows = [("a-section-with-a-long-name/alice", result()), ("a-section-with-a-long-name/bob", result())]
    lines = grade_table(rows, items).splitlines()
    dashes = next(k for k, line in enumerate(lines) if set(line) == {"-"})
    shown = [line.split()[0] for line in lines[dashes + 1:]]
    assert len(shown) == 2 and shown[0].endswith("-name/alice") and shown[1].endswith("-name/bob"), shown
    assert all(name.startswith("~") and len(name) <= 24 for name in shown), shown


def test_class_report_shows_the_points_the_reference_restored_per_item(tmp_path):
    """course.yaml `dependencies: independent`: each regraded check records what the swap restored."""
    lab = "lab14_transformers"
    for name, restored in (("alice", {"values": 2.0, "shapes": 0.0}), ("bob", {"values": 2.0, "shapes": 1.0}),
                           ("carol", {})):
        found = result(aid=lab)
        for t in found["tests"]:
            kind = t["name"].split(": ")[1]
            if t["item"] == "manual_multihead" and kind in restored:
                t["extra_data"] = {"regraded_with": ["scaled_dot_product_attention"], "restored": restored[kind]}
        (tmp_path / f"{name}.json").write_text(json.dumps(found))
    page = class_report(tmp_path)
    row = page[page.index("<code>manual_multihead</code>"):].split("</tr>")[0]
    assert "<td>5 (2)</td>" in row, row  # 5 points over the two submissions regraded
    other = page[page.index("<code>EncoderBlock</code>"):].split("</tr>")[0]
    assert "&ndash;" in other
