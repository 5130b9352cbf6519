"""What people read: per-item summaries, the grade table, CSV rows."""
import csv


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


def lost_points(result, limit=4):
    """The first few reasons for lost points, one short line each."""
    reasons = []
    for test in result["tests"]:
        if test["score"] < test["max_score"]:
            reasons.append(f"{test['name']}: {(test['output'] or '').splitlines()[0][:110] if test['output'] else ''}")
    extra = f" (+{len(reasons) - limit} more)" if len(reasons) > limit else ""
    return reasons[:limit], extra


def grade_table(rows, items):
    """A per-student, per-item table: rows are (student, result)."""
    short = {i: (i if len(i) <= 10 else i[:9] + ".") for i in items}
    head = f"{'submission':<28}" + "".join(f"{short[i]:>11}" for i in items) + f"{'total':>12}"
    lines = [head, "-" * len(head)]
    for student, result in rows:
        by_item = item_summary(result)
        cells = "".join(f"{by_item[i][0]:>7.1f}/{by_item[i][1]:<3g}" if i in by_item else f"{'-':>11}" for i in items)
        lines.append(f"{student[:27]:<28}{cells}{result['score']:>7.1f}/{result['max_score']:<4g}")
    return "\n".join(lines)


def write_csv(path, rows, items):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["submission", *items, "score", "max_score"])
        for student, result in rows:
            by_item = item_summary(result)
            w.writerow([student, *[by_item.get(i, (0, 0, []))[0] for i in items], result["score"], result["max_score"]])


def experiment_lines(aid, result):
    """One line per experiment of a graded result: measured figures beside the lecture's, the bound, the score."""
    from autograder.config import load_course
    from autograder.experiments import ExperimentResult, format_row
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
