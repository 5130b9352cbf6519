"""The course summary at the top of nbgrader's feedback page: items, reasons for lost points, experiments, and the
earlier gradings of the notebook."""
from markupsafe import Markup

from autograder.reports.tables import experiment_figures, item_reasons, item_summary, metric_rows, render_html


def summary_html(result):
    """The summary as HTML (markupsafe.Markup), rendered with autoescape: every message is escaped once, since it
    can quote what the student's code printed or returned. course_feedback.html.j2 puts it in the page as it is."""
    reasons = item_reasons(result)
    rows = [{"item": item, "score": round(score, 2), "max_score": max_score, "lost": score < max_score,
             "reasons": reasons.get(item, [])}
            for item, (score, max_score, _) in item_summary(result).items()]
    repairs, output = (result.get("extra_data") or {}).get("repairs") or [], result.get("output") or ""
    if repairs and output.startswith("; ".join(repairs)):  # each repair of the notebook on a line of its own
        output = "\n".join([*repairs, output[len("; ".join(repairs)):].lstrip("; ")]).strip()
    experiments = [{**f, "metric_rows": metric_rows(f["metrics"], f["lecture"], f["threshold"])}
                   for f in experiment_figures(result)]
    # Markup: HTML already, so that a template with autoescape on would not escape it a second time
    history = (result.get("extra_data") or {}).get("history") or []  # the gradings this one replaced (batch/results)
    return Markup(render_html("feedback_summary.html.j2", output=output, rows=rows, experiments=experiments,
                              history=history, score=result.get("score"), max_score=result.get("max_score")))
