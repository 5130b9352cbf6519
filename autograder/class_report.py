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
    """(name, result) for each results file under the folder, at any depth (one folder per assignment or section:
    the name is the path below `folder`, secA/alice); files that are not results, and grader failures, are
    skipped."""
    folder = Path(folder)
    rows = []
    for path in sorted(folder.rglob("*.json")):
        rel = path.relative_to(folder)
        if rel.name.startswith(".") or ".ipynb_checkpoints" in rel.parts:  # Jupyter's copies, not results
            continue
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(result, dict) and isinstance(result.get("tests"), list) \
                and {"score", "max_score"} <= set(result) and not result.get("extra_data", {}).get("grader_error"):
            rows.append((rel.with_suffix("").as_posix(), result))
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


def experiment_figure(exp, found):
    """One histogram per metric that matters (the experiment's own and each with a threshold), each with its
    threshold and the lecture's figure where course.yaml gives them."""
    import matplotlib.pyplot as plt
    metrics = [m for m in dict.fromkeys([exp.metric, *exp.threshold])
               if any(m in f["metrics"] for f in found)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics) + 1, 2.6), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        values = [f["metrics"][metric] for f in found if metric in f["metrics"]]
        ax.hist(values, bins=min(20, max(5, len(values))), color="C1")
        bound = exp.threshold.get(metric)
        for side in ("min", "max"):
            if bound is not None and getattr(bound, side) is not None:
                ax.axvline(getattr(bound, side), color="C3", ls="--", label=f"threshold {bound}")
        if metric in exp.lecture:
            ax.axvline(exp.lecture[metric], color="k", ls=":", label=f"lecture {exp.lecture[metric]:g}")
        ax.set_xlabel(metric)
        ax.set_ylabel("submissions")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
    fig.suptitle(f"experiment {exp.name}")
    return figure_png(fig)


def assignment_section(aid, rows):
    """The report's part for one assignment: totals, items, reasons, experiments."""
    summaries = {name: item_summary(result) for name, result in rows}
    items = list(dict.fromkeys(item for s in summaries.values() for item in s))
    maxima = [max(s[i][1] for s in summaries.values() if i in s) for i in items]
    means = [sum(s[i][0] for s in summaries.values() if i in s) / max(1, sum(i in s for s in summaries.values()))
             for i in items]
    max_total = max(r["max_score"] for _, r in rows)
    whole = [(n, r) for n, r in rows if r["max_score"] >= max_total]  # an --items result is not a total
    totals = sorted(r["score"] for _, r in whole)
    median = totals[len(totals) // 2]
    partial = len(rows) - len(whole)
    out = [f"<h2>{escape(aid)}</h2>",
           f"<p>{len(whole)} submissions; mean {sum(totals) / len(totals):.1f}, median {score_text(median)} of "
           f"{score_text(max_total)}; {sum(t >= max_total for t in totals)} full marks, "
           f"{sum(t == 0 for t in totals)} zero."
           + (f" {partial} more graded on some items only (course grade --items): in the items' means, not in "
              f"the totals." if partial else "") + "</p>",
           totals_figure(whole, max_total), items_figure(items, means, maxima)]

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
    out += experiment_sections(aid, rows)
    return "\n".join(out)


def experiment_sections(aid, rows):
    """Per experiment of course.yaml found in the results: what passing needs, how many did, the metrics' spread."""
    from autograder.config import load_course
    course = load_course()
    if aid not in course.assignments:
        return [f"<p>{escape(aid)} is not in {escape(str(course.path))}: its experiments are not shown.</p>"]
    experiments = course.assignment(aid).experiments
    by_exp = {}
    for _, result in rows:
        for f in experiment_figures(result):
            by_exp.setdefault(f["name"], []).append(f)
    out = []
    for name, found in by_exp.items():
        exp = experiments[name]
        needs = "; ".join(f"{k} {b}" for k, b in exp.threshold.items())
        measured = sum(bool(f["metrics"]) for f in found)
        out.append(f"<h3>Experiment {escape(name)}</h3><p>{escape(exp.description)}: passing needs "
                   f"{escape(needs)}; reached by {sum(f['passed'] for f in found)} of {len(found)} submissions, "
                   f"measured for {measured} (the others did not train).</p>")
        if measured:
            out.append(experiment_figure(exp, found))
    return out


STYLE = """<style>
body { font-family: sans-serif; max-width: 1100px; margin: 1em auto; }
table { border-collapse: collapse; margin-bottom: 1em; }
td, th { border: 1px solid #ccc; padding: 0.3em 0.6em; vertical-align: top; text-align: left; }
.text { white-space: pre-wrap; }
img { display: block; margin: 0.5em 0; }
</style>"""


def class_report(folder):
    """The whole report as one HTML string, one section per assignment found (a folder of one assignment's
    results, or of one folder per assignment); every name and message from a submission is escaped."""
    import matplotlib
    matplotlib.use("Agg")
    rows = load_results(folder)
    if not rows:
        raise ValueError(f"no results.json files in {folder} or the folders below it")
    by_aid = {}
    for name, result in rows:
        by_aid.setdefault(result.get("extra_data", {}).get("assignment", "?"), []).append((name, result))
    sections = [assignment_section(aid, by_aid[aid]) for aid in sorted(by_aid)]
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Class report</title>" + STYLE + "</head><body>"
            f"<h1>Class report</h1><p>{len(rows)} graded submissions of {len(by_aid)} assignment(s) from "
            f"{escape(str(folder))}.</p>" + "\n".join(sections) + "</body></html>")
