"""What people read: per-item summaries and reasons, the grade table, CSV rows, the experiments' figures, HTML."""
import csv
import textwrap
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import NamedTuple

WIDTH = 120  # the terminal table's width
GRADER_ERROR = "grader error"  # the grade table's total for a submission the grader failed on
TEMPLATES = Path(__file__).parent / "templates" / "report"
CENT = Decimal("0.01")


def item_summary(result):
    """item -> (score, max_score, message lines) from one results.json."""
    out = {}
    for test in result["tests"]:
        score, max_score, lines = out.get(test["item"], (0.0, 0.0, []))
        mark = "ok  " if test["score"] >= test["max_score"] else "LOST"
        first, *rest = (test["output"] or "").splitlines() or [""]
        lines = lines + [f"{mark} {test['name']} ({test['score']:g}/{test['max_score']:g}): {first}"] + \
            [f"     {r}" for r in rest[:8]]
        out[test["item"]] = (score + test["score"], max_score + test["max_score"], lines)
    return out


def restored_points(result):
    """item -> the points the reference standing in for a failed dependency restored (course.yaml `dependencies`),
    for the items that were regraded with it."""
    out = {}
    for test in result["tests"]:
        extra = test.get("extra_data", {})
        if "restored" in extra:
            out[test["item"]] = out.get(test["item"], 0.0) + extra["restored"]
    return out


def check_kind(test):
    """'values' from the test name 'item: values'."""
    return test["name"].split(": ", 1)[-1]


def item_reasons(result):
    """item -> its distinct reasons for lost points, in check order; checks failing alike give one reason.

    A reason is the check's message without the student's printed text (the feedback shows that in full);
    an experiment's reason keeps its measured figures.
    """
    out = {}
    for test in result["tests"]:
        if test["score"] >= test["max_score"]:
            continue
        lines = [line for line in (test["output"] or "no message").splitlines() if line.strip()]
        printed = next((k for k, line in enumerate(lines) if line.startswith("printed: ")), len(lines))
        message = "; ".join(lines[:printed] if "extra_data" in test else lines[:min(printed, 1)]) or "no message"
        reasons = out.setdefault(test["item"], {})
        reasons.setdefault(message, []).append(check_kind(test))
    return {item: [(kinds, message) for message, kinds in reasons.items()] for item, reasons in out.items()}


def lost_points(result, limit=4):
    """The first few reasons for lost points, one per item and message: ['item (kinds): message'], and '+N more'."""
    reasons = [f"{item} ({', '.join(kinds)}): {message}"
               for item, found in item_reasons(result).items() for kinds, message in found]
    extra = f"+{len(reasons) - limit} more" if len(reasons) > limit else ""
    return reasons[:limit], extra


def cents(value) -> Decimal:
    """Points to the cent, as every table, page and export gives them: the decimal the float stands for (its
    shortest repr: 29 * 0.85 is 24.65, not 24.6499...) rounded half up, as formgrader shows scores
    (roundToPrecision(x, 2)). nbgrader 0.9.6's own `nbgrader export` writes str() of the float, unrounded."""
    return Decimal(repr(float(value))).quantize(CENT, rounding=ROUND_HALF_UP)


def score_text(value) -> str:
    """Points as shown and exported: to the cent, with the decimals it has and no more (24.65, 24.6, 29)."""
    text = f"{cents(value):f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def penalty_text(raw, final) -> str:
    """The points a penalty took, as the difference of the two figures shown (each to the cent), so that every
    row adds up: raw - penalty = final, to the cent."""
    return score_text(cents(raw) - cents(final))


def grade_table(rows, items, points=None, width=WIDTH, marks=None, columns=(), notes=()):
    """Per-student scores under numbered item columns, with a legend; blocks of columns so no line exceeds width.

    rows are (student, result); points maps item -> its maximum (taken from the results when not given); marks
    maps a student to a word shown after the total (how `course grade --results-dir` got it: reused, merged);
    columns are (header, {student: text}) shown after the total (the written answers, lateness, the final score),
    and notes the lines under the table that say what they mean. A submission the grader failed on reads `grader
    error` in place of its scores (grader_error_lines says why).
    """
    if points is None:
        points = {}
        for _, result in rows:
            for item, (_, max_score, _) in item_summary(result).items():
                points.setdefault(item, max_score)
    marks = {s: m for s, m in (marks or {}).items() if m}
    name_w = min(24, max([len("submission")] + [len(s) for s, _ in rows])) + 2
    col_w, total_w = 6, 14
    mark_w = max([len(m) + 2 for m in marks.values()], default=0)
    widths = [max([len(head)] + [len(t) for t in texts.values()]) + 2 for head, texts in columns]
    per_block = max(1, (width - name_w - total_w - sum(widths) - mark_w) // col_w)
    legend = [f"#{k} {item} ({score_text(points[item])})" if item in points else f"#{k} {item}"
              for k, item in enumerate(items, 1)]
    # no-break spaces inside an entry, so that a line breaks only between entries
    lines = [line.replace("\xa0", " ") for line in textwrap.wrap(
        "items: " + "   ".join(e.replace(" ", "\xa0") for e in legend), width, subsequent_indent="       ",
        break_long_words=True, break_on_hyphens=False)]
    summaries = {student: item_summary(result) for student, result in rows}
    for start in range(0, len(items), per_block):
        block = list(enumerate(items, 1))[start:start + per_block]
        last = start + per_block >= len(items)
        head = f"{'submission':<{name_w}}" + "".join(f"{'#' + str(k):>{col_w}}" for k, _ in block)
        head += (f"{'total':>{total_w}}" + "".join(f"{h:>{w}}" for (h, _), w in zip(columns, widths, strict=True))
                 if last else "")
        lines += ["", head, "-" * len(head)]
        for student, result in rows:
            name = student if len(student) <= name_w - 2 else (  # a name with folders keeps its end: ~secA/alice
                "~" + student[-(name_w - 3):] if "/" in student else student[:name_w - 3] + "~")
            by_item = summaries[student]
            if not_scored(result):  # nothing was scored: no '-' per item and no 0/0 that would read as a grade
                cells, total = " " * col_w * len(block), GRADER_ERROR if last else ""
            else:
                cells = "".join(f"{score_text(by_item[i][0]) if i in by_item else '-':>{col_w}}" for _, i in block)
                total = f"{score_text(result['score'])}/{score_text(result['max_score'])}" if last else ""
            mark = f"  {marks[student]}" if last and student in marks else ""
            said = "".join(f"{texts.get(student, ''):>{w}}" for (_, texts), w in zip(columns, widths, strict=True)) \
                if last else ""
            lines.append(f"{name:<{name_w}}{cells}{total:>{total_w if last else 0}}{said}{mark}")
    for note in notes:
        lines += ["", textwrap.fill(note, width)]
    return "\n".join(lines)


def reason_lines(name, result, limit=4, width=WIDTH):
    """The submission's reasons for lost points, each wrapped (never cut) to width under the submission's name;
    none for a grader failure (nothing was lost: grader_error_lines names its cause once for the batch)."""
    if not_scored(result):
        return []
    out = []
    if result.get("output"):
        out += textwrap.wrap(f"{name}: {result['output']}", width, subsequent_indent="    ")
    reasons, extra = lost_points(result, limit)
    for reason in reasons + ([extra] if extra else []):
        out += textwrap.wrap(f"{name}: {reason}", width, subsequent_indent="    ", break_on_hyphens=False)
    return out


def grader_error_lines(rows, log=None):
    """One line per distinct cause of the batch's grader failures: the submissions it hit, what failed, why and
    the fix, and `log`, the file holding the tracebacks."""
    causes = {}
    for name, result in rows:
        if not_scored(result):
            data = result["extra_data"]
            cause = data.get("cause") or result["output"].splitlines()[0]
            causes.setdefault((cause, data.get("setup")), []).append(name)
    lines = []
    for (cause, setup), names in causes.items():
        hint = "" if setup else "; a failure of the grader itself: rerun, and report it with the traceback if it stays"
        lines.append(f"{GRADER_ERROR}, {len(names)} of {len(rows)} not scored ({', '.join(names)}): {cause}{hint}"
                     + (f" [tracebacks: {log}]" if log else ""))
    return lines


def write_csv(path, rows, items, written=None, finals=None):
    """One row per submission: each item's points, the automatic score and maximum; with `finals` (name ->
    FinalGrade), the submission time, its lateness, the penalty and the final score; with `written` (name ->
    WrittenGrade), the written answers' score (blank while pending), maximum and status."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["submission", *items, "score", "max_score",
                    *(["submitted_at", "lateness", "penalty", "final_score"] if finals else []),
                    *(["written_score", "written_max_score", "written_status"] if written else [])])
        for student, result in rows:
            said, final = (written or {}).get(student), (finals or {}).get(student)
            tail = ([] if not finals else ["", "", "", ""] if final is None else
                    [final.lateness.submitted.isoformat() if final.lateness.submitted else "", final.lateness.text(),
                     penalty_text(final.raw, final.final), score_text(final.final)])
            tail += ([] if not written else ["", "", ""] if said is None else
                     ["" if said.pending else score_text(said.score), score_text(said.max_score),
                      "pending" if said.pending else "graded"])
            if not_scored(result):  # blank, never a 0 a gradebook import would take for a grade
                w.writerow([as_cell(student), *[""] * len(items), "", "", *tail])
                continue
            by_item = item_summary(result)
            w.writerow([as_cell(student), *[score_text(by_item.get(i, (0, 0, []))[0]) for i in items],
                        score_text(result["score"]), score_text(result["max_score"]), *tail])


def not_scored(result):
    """A result the grader itself failed on (batch.failed_result): it carries no score, only the cause."""
    return bool(result.get("extra_data", {}).get("grader_error"))


def as_cell(text):
    """A spreadsheet cell that stays text: a leading =, +, -, @ or tab would make it a formula (OWASP CSV injection)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def experiment_figures(result):
    """One dict per experiment of a graded result: its name and item, the measured metrics, the lecture's
    figures and the thresholds (as text), passed or not, and the points."""
    from autograder.course.config import load_course
    aid = result["extra_data"]["assignment"]
    experiments = load_course().assignment(aid).experiments
    out = []
    for test in result["tests"]:
        data = test.get("extra_data", {})
        if "experiment" in data and data["experiment"] in experiments:
            exp = experiments[data["experiment"]]
            metrics = {k: v for k, v in (data.get("metrics") or {}).items() if isinstance(v, (int, float))}
            out.append({"name": exp.name, "item": test["item"], "description": exp.description, "metrics": metrics,
                        "lecture": dict(exp.lecture), "threshold": {k: str(b) for k, b in exp.threshold.items()},
                        "bounds": exp.threshold, "passed": test["score"] >= test["max_score"],
                        "score": test["score"], "max_score": test["max_score"], "seed": data.get("seed")})
    return out


def experiment_lines(aid, result):
    """One line per experiment of a graded result: measured figures beside the lecture's, the bound, the score."""
    from autograder.course.config import load_course
    from autograder.grading.experiments import ExperimentResult
    assignment = load_course().assignment(aid)
    lines = []
    for test in result["tests"]:
        data = test.get("extra_data", {})
        if "experiment" in data:
            exp = assignment.experiments[data["experiment"]]
            row = ExperimentResult(aid, exp.name, data["metrics"], exp.failures(data["metrics"]),
                                   test["seconds"], data["seed"])
            lines.append(f"{format_row(exp, row)} (graded: {test['score']:g}/{test['max_score']:g})")
    return lines


class MetricRow(NamedTuple):
    """One metric of an experiment as text: measured (4 significant digits), the lecture's figure, the bound;
    '' where there is none."""
    name: str
    measured: str
    lecture: str
    bound: str

    def text(self):
        """'test_mse 0.0191 (lecture 0.0191) [<= 0.025]': the measurement beside the lecture's and the bound."""
        return (f"{self.name} {self.measured or '-'}" + (f" (lecture {self.lecture})" if self.lecture else "")
                + (f" [{self.bound}]" if self.bound else ""))


def metric_rows(metrics, lecture, threshold):
    """A MetricRow per metric of the threshold, the measurement or the lecture (in that order of first mention)."""
    names = dict.fromkeys([*threshold, *metrics, *lecture])
    return [MetricRow(name, f"{metrics[name]:.4g}" if isinstance(metrics.get(name), (int, float)) else "",
                      f"{lecture[name]:g}" if name in lecture else "",
                      str(threshold[name]) if name in threshold else "")
            for name in names]


def format_row(exp, result):
    """One line of the experiments table: measured beside the lecture's figure and the threshold."""
    parts = [r.text() for r in metric_rows(result.metrics, exp.lecture, exp.threshold) if r.measured]
    verdict = "ok" if result.passed else "MISSED: " + "; ".join(result.failures)
    return (f"{result.assignment}.{result.name:<22} {', '.join(parts)}  "
            f"[{result.seconds:.1f} s, seed {result.seed}] {verdict}")


def render_html(template, **context):
    """A page or fragment from templates/report/ as a str, rendered with autoescape on: every value is escaped once,
    where it is put in the page; what is already HTML (markupsafe.Markup) is kept as it is."""
    import jinja2
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["score"] = score_text
    return env.get_template(template).render(**context)
