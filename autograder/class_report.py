"""The TA's class view: one HTML page from a folder of results.json files (`course grade --results-dir`)."""
import base64
import io
import json
import re
from collections import Counter
from html import escape
from pathlib import Path

from autograder.report import experiment_figures, item_reasons, item_summary, score_text

NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")  # not digits of a name
TOP_REASONS = 5


def load_results(folder):
    """(name, result) for each results file in the folder, by name; files that are not results are skipped."""
    rows = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(result, dict) and "tests" in result and "score" in result:
            rows.append((path.stem, result))
    return rows


def normalised(reason):
    """A reason with its numbers replaced by '#', so that the same mistake with other figures counts once."""
    return NUMBER.sub("#", reason)


def figure_png(fig):
    """A matplotlib figure as an <img> with the PNG inline (base64): the report is one self-contained file."""
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return f"<img alt='figure' src='data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}'>"


def totals_figure(rows, max_score):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.hist([r["score"] for _, r in rows], bins=min(20, max(5, len(rows))), range=(0, max_score or 1), color="C0")
    ax.set_xlabel(f"total score (of {max_score:g})")
    ax.set_ylabel("submissions")
    ax.set_title("distribution of totals")
    return figure_png(fig)


def items_figure(items, means, maxima):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(items) + 1.2))
    ys = range(len(items))
    ax.barh(ys, maxima, color="#dddddd", label="points")
    ax.barh(ys, means, color="C2", label="class mean")
    ax.set_yticks(list(ys), items)
    ax.invert_yaxis()
    ax.set_xlabel("points")
    ax.legend(loc="lower right")
    ax.set_title("mean score per item")
    return figure_png(fig)


def experiment_figure(name, metric, values, bound, lecture):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 2.6))
    ax.hist(values, bins=min(20, max(5, len(values))), color="C1")
    for side in ("min", "max"):
        if getattr(bound, side) is not None:
            ax.axvline(getattr(bound, side), color="C3", ls="--", label=f"threshold {bound}")
    if lecture is not None:
        ax.axvline(lecture, color="k", ls=":", label=f"lecture {lecture:g}")
    ax.set_xlabel(metric)
    ax.set_ylabel("submissions")
    ax.set_title(f"experiment {name}")
    ax.legend(loc="best", fontsize=8)
    return figure_png(fig)


def assignment_section(aid, rows):
    """The report's part for one assignment: totals, items, reasons, experiments."""
    summaries = {name: item_summary(result) for name, result in rows}
    items = list(dict.fromkeys(item for s in summaries.values() for item in s))
    maxima = [max(s[i][1] for s in summaries.values() if i in s) for i in items]
    means = [sum(s[i][0] for s in summaries.values() if i in s) / max(1, sum(i in s for s in summaries.values()))
             for i in items]
    max_total = max(r["max_score"] for _, r in rows)
    totals = sorted(r["score"] for _, r in rows)
    median = totals[len(totals) // 2]
    out = [f"<h2>{escape(aid)}</h2>",
           f"<p>{len(rows)} submissions; mean {sum(totals) / len(totals):.1f}, median {score_text(median)} of "
           f"{score_text(max_total)}; {sum(t >= max_total for t in totals)} full marks, "
           f"{sum(t == 0 for t in totals)} zero.</p>",
           totals_figure(rows, max_total), items_figure(items, means, maxima)]

    counts = {item: Counter() for item in items}
    for _, result in rows:
        for item, found in item_reasons(result).items():
            for _, message in found:
                counts.setdefault(item, Counter())[normalised(message)] += 1
    table = []
    for item, mean, top in zip(items, means, maxima):
        common = counts.get(item, Counter()).most_common(TOP_REASONS)
        reasons = "".join(f"<li><b>{n}</b> &times; <span class='text'>{escape(r)}</span></li>" for r, n in common)
        table.append(f"<tr><td><code>{escape(item)}</code></td><td>{mean:.2f} / {score_text(top)}</td>"
                     f"<td>{'<ul>' + reasons + '</ul>' if reasons else 'no points lost'}</td></tr>")
    out.append("<h3>Per item: mean score and the most common reasons for lost points</h3>"
               "<p><small>Numbers in reasons are shown as # so that the same mistake counts once.</small></p>"
               "<table><tr><th>item</th><th>mean</th><th>most common reasons (submissions)</th></tr>"
               + "".join(table) + "</table>")

    from autograder.config import load_course
    experiments = load_course().assignment(aid).experiments if aid in load_course().assignments else {}
    by_exp = {}
    for name, result in rows:
        for f in experiment_figures(result):
            by_exp.setdefault(f["name"], []).append(f)
    for exp_name, found in by_exp.items():
        exp = experiments[exp_name]
        values = [f["metrics"][exp.metric] for f in found if exp.metric in f["metrics"]]
        reached = sum(f["passed"] for f in found)
        out.append(f"<h3>Experiment {escape(exp_name)}</h3><p>{escape(exp.description)}: {escape(exp.metric)} "
                   f"needs {escape(str(exp.threshold.get(exp.metric, '')))}; reached by {reached} of {len(found)} "
                   f"submissions, measured for {len(values)} (the others did not train).</p>")
        if values:
            out.append(experiment_figure(exp_name, exp.metric, values, exp.threshold.get(exp.metric),
                                         exp.lecture.get(exp.metric)))
    return "\n".join(out)


STYLE = """<style>
body { font-family: sans-serif; max-width: 1100px; margin: 1em auto; }
table { border-collapse: collapse; margin-bottom: 1em; }
td, th { border: 1px solid #ccc; padding: 0.3em 0.6em; vertical-align: top; text-align: left; }
.text { white-space: pre-wrap; }
img { display: block; margin: 0.5em 0; }
</style>"""


def class_report(folder):
    """The whole report as one HTML string; every name and message from a submission is escaped."""
    import matplotlib
    matplotlib.use("Agg")
    rows = load_results(folder)
    if not rows:
        raise ValueError(f"no results.json files in {folder}")
    by_aid = {}
    for name, result in rows:
        by_aid.setdefault(result.get("extra_data", {}).get("assignment", "?"), []).append((name, result))
    sections = [assignment_section(aid, part) for aid, part in by_aid.items()]
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Class report</title>" + STYLE + "</head><body>"
            f"<h1>Class report</h1><p>{len(rows)} graded submissions from {escape(str(folder))}.</p>"
            + "\n".join(sections) + "</body></html>")
