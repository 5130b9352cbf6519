"""nbgrader integration: the isolated grader's verdicts in the test cells, and a feedback page that explains them.

`nbgrader autograde` runs TrustedGrade in place of executing the notebook in a kernel (see nbgrader_config.py):
the student's code runs only in the sandbox, and each test cell's last value becomes the trusted partial score,
which nbgrader's SaveAutoGrades reads as partial credit. The whole result is kept in the autograded notebook's
metadata, where `nbgrader generate_feedback` (FeedbackSummary and templates/feedback/course_feedback.html.j2) reads it back.
"""
import tempfile
from html import escape
from pathlib import Path

import nbformat
from nbformat.v4 import new_output
from traitlets import Unicode

from nbgrader.preprocessors import NbGraderPreprocessor

from autograder.notebook import nbgrader_meta
from autograder.report import experiment_figures, item_reasons, item_summary, score_text

# course_feedback.html.j2 sits in a `feedback` folder found before nbgrader's, so it extends nbgrader's page
FEEDBACK_TEMPLATES = [str(Path(__file__).parent / "templates"),
                      str(Path(__import__("nbgrader").__file__).parent / "server_extensions" / "formgrader" / "templates")]
RESULTS_KEY = "course_results"


class TrustedGrade(NbGraderPreprocessor):
    """Grade the (sanitised) submission with the isolated grader; write each item's score and messages."""

    device = Unicode("auto", help="auto, cpu or cuda").tag(config=True)

    def preprocess(self, nb, resources):
        from autograder.grade import grade_notebook
        aid = resources["nbgrader"]["assignment"]
        with tempfile.TemporaryDirectory(prefix="course-nbgrader-") as tmp:
            path = Path(tmp) / f"{resources['nbgrader']['notebook']}.ipynb"
            nbformat.write(nb, path)
            result = grade_notebook(path, aid, device=self.device)
        by_item = item_summary(result)
        for cell in nb.cells:
            gid = nbgrader_meta(cell).get("grade_id", "")
            if cell.cell_type != "code" or not gid.startswith("test_") or gid[5:] not in by_item:
                continue
            score, max_score, lines = by_item[gid[5:]]
            head = f"{gid[5:]}: {score_text(round(score, 4))} / {score_text(max_score)} points"
            cell.outputs = [
                new_output("stream", name="stdout", text="\n".join([head, *lines]) + "\n"),
                new_output("execute_result", data={"text/plain": repr(round(score, 4))}, execution_count=None),
            ]
        nb.metadata[RESULTS_KEY] = result  # written after sanitising: the submission cannot have set it
        resources.setdefault("course", {})["results"] = result
        return nb, resources


class FeedbackSummary(NbGraderPreprocessor):
    """Put the autograded result's summary (items, reasons, experiments) where the feedback template shows it."""

    def preprocess(self, nb, resources):
        result = nb.metadata.pop(RESULTS_KEY, None)
        resources["course_summary"] = summary_html(result) if result else ""
        return nb, resources


STYLE = """<style>
.course-summary table { margin: 0.5em 0 1em 0; }
.course-summary td, .course-summary th { padding: 0.25em 0.6em; vertical-align: top; }
.course-summary .lost { color: #a94442; }
.course-summary .full { color: #3c763d; }
.student-text { white-space: pre-wrap; font-family: inherit; }
</style>"""


def summary_html(result):
    """The top of the feedback page: a row per item with its score and why points were lost, then experiments.

    Every message is escaped: it can quote what the student's code printed or returned.
    """
    by_item, reasons = item_summary(result), item_reasons(result)
    rows = []
    for item, (score, max_score, _) in by_item.items():
        why = reasons.get(item, [])
        text = ("<ul>" + "".join(f"<li><span class='student-text'>{escape(message)}</span> "
                                 f"<small>({escape(', '.join(kinds))})</small></li>" for kinds, message in why)
                + "</ul>") if why else "all checks passed"
        cls = "lost" if score < max_score else "full"
        rows.append(f"<tr><td><a href='#test_{escape(item)}'><code>{escape(item)}</code></a></td>"
                    f"<td class='{cls}'>{score_text(round(score, 2))} / {score_text(max_score)}</td><td>{text}</td></tr>")
    parts = [STYLE, "<div class='course-summary'>"]
    if result.get("output"):
        parts.append(f"<p class='lost student-text'>{escape(result['output'])}</p>")
    parts.append("<table class='table table-condensed'><tr><th>item</th><th>score</th><th>why points were lost</th></tr>"
                 + "".join(rows) + "</table>")
    figures = experiment_figures(result)
    if figures:
        lines = []
        for f in figures:
            keys = list(dict.fromkeys([*f["threshold"], *f["metrics"]]))
            measured = ", ".join(f"{escape(k)} {f['metrics'][k]:.4g}" for k in keys if k in f["metrics"]) or "not measured"
            lecture = ", ".join(f"{escape(k)} {v:g}" for k, v in f["lecture"].items()) or "-"
            needed = ", ".join(f"{escape(k)} {escape(b)}" for k, b in f["threshold"].items())
            verdict = ("<span class='full'>reached</span>" if f["passed"] else "<span class='lost'>missed</span>")
            lines.append(f"<tr><td>{escape(f['name'])}<br><small>{escape(f['description'])}</small></td>"
                         f"<td><code>{escape(f['item'])}</code></td><td>{measured}</td><td>{needed}</td>"
                         f"<td>{lecture}</td><td>{verdict} ({score_text(f['score'])} / {score_text(f['max_score'])})</td></tr>")
        parts.append("<p><b>Training experiments</b> (run by the grader with your modules):</p>"
                     "<table class='table table-condensed'><tr><th>experiment</th><th>item</th><th>measured</th>"
                     "<th>needed</th><th>lecture</th><th>result</th></tr>" + "".join(lines) + "</table>")
    parts.append("<p><small>Each item's checks are shown in full in its test cell below. Written answers are not "
                 "auto-graded; your TA reads them.</small></p></div>")
    return "\n".join(parts)
