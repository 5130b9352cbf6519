"""The TA's class view: one HTML page from a folder of results.json files (`course grade --results-dir`)."""
from collections import Counter

# load_results and normalised are read from here too (apps/semester.py, the tests): the folder's, re-exported
from autograder.reports.class_stats import assignment_stats
from autograder.reports.experiment_stats import with_figure
from autograder.reports.results_folder import by_assignment, figure_png, load_results, normalised  # noqa: F401
from autograder.reports.tables import (
    experiment_figures,
    item_reasons,
    item_summary,
    metric_rows,
    render_html,
    restored_points,
)

TOP_REASONS = 5


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


def assignment_section(aid, rows):
    """The report's part for one assignment (class_report.html.j2): totals, items, reasons, experiments, similar
    submissions."""
    stats = assignment_stats(aid, rows)  # per check and per experiment (class_stats.py): its own part of the page
    summaries = {name: item_summary(result) for name, result in rows}
    items = items_of(summaries.values())
    maxima = [max(s[i][1] for s in summaries.values() if i in s) for i in items]
    means = [sum(s[i][0] for s in summaries.values() if i in s) / max(1, sum(i in s for s in summaries.values()))
             for i in items]
    max_total = max(r["max_score"] for _, r in rows)
    whole = [(n, r) for n, r in rows if r["max_score"] >= max_total]  # an --items result is not a total
    totals = sorted(r["score"] for _, r in whole)
    counts = {item: Counter() for item in items}
    restored = {item: [0.0, 0] for item in items}  # points the reference standing in restored, and in how many
    for _, result in rows:
        for item, points in restored_points(result).items():
            restored.setdefault(item, [0.0, 0])[0] += points
            restored[item][1] += 1
    for _, result in rows:
        for item, found in item_reasons(result).items():
            for _, message in found:
                counts.setdefault(item, Counter())[normalised(message)] += 1
    return {"aid": aid, "whole": len(whole), "partial": len(rows) - len(whole), "mean": sum(totals) / len(totals),
            "median": totals[len(totals) // 2], "max_total": max_total, "full": sum(t >= max_total for t in totals),
            "zero": sum(t == 0 for t in totals),
            "figures": [totals_figure(whole, max_total), items_figure(items, means, maxima)],
            "items": [{"item": item, "mean": mean, "top": top, "reasons": counts[item].most_common(TOP_REASONS),
                       "restored": restored[item][0], "regraded": restored[item][1]}
                      for item, mean, top in zip(items, means, maxima, strict=True)],
            **experiment_sections(aid, rows, stats.experiments), "similar": similar_section(aid, rows),
            "written": written_section(aid, whole), "stats": stats}


def written_section(aid, rows):
    """The written answers beside the automatic totals (reports/written.py): their points, how many submissions a
    TA has graded in formgrader and their mean; None where the assignment has none (or course.yaml lacks it)."""
    from autograder.course.config import load_course
    from autograder.course.roster import student_of
    from autograder.reports.written import written_grades
    if aid not in load_course().assignments:
        return None
    found = written_grades(aid, {student_of(name) for name, _ in rows})
    if not found:
        return None
    grades = [found[student_of(name)] for name, _ in rows]
    graded = [g.score for g in grades if not g.pending]
    return {"points": load_course().assignment(aid).written_points, "graded": len(graded),
            "pending": len(grades) - len(graded), "mean": sum(graded) / len(graded) if graded else None}


def items_of(summaries):
    """The items of the assignment's results (item_summary of each), in the order the results give them."""
    return list(dict.fromkeys(item for s in summaries for item in s))


def experiment_sections(aid, rows, found_stats=()):
    """Per experiment of course.yaml found in the results: what passing needs, how many did, the plot of its figures
    against the threshold (experiment_stats.with_figure, from `found_stats`); or the course.yaml that does not know
    the assignment."""
    from autograder.course.config import load_course
    course = load_course()
    if aid not in course.assignments:
        return {"experiments": [], "unknown_in": str(course.path)}
    experiments = course.assignment(aid).experiments
    plots = {e.name: e for e in found_stats}
    by_exp = {}
    for _, result in rows:
        for f in experiment_figures(result):
            by_exp.setdefault(f["name"], []).append(f)
    out = []
    for name, found in by_exp.items():
        exp = experiments[name]
        measured = sum(bool(f["metrics"]) for f in found)
        out.append({"name": name, "description": exp.description, "measured": measured, "found": len(found),
                    "passed": sum(f["passed"] for f in found),
                    "needs": metric_rows({}, {}, found[0]["threshold"]),
                    "figure": with_figure(plots[name]).figure if measured and name in plots else None})
    return {"experiments": out, "unknown_in": None}


def similar_section(aid, rows):
    """The groups of similar submissions (autograder/reports/similarity.py), as course.yaml's `similarity` asks, items
    numbered as in the per-item table; None when it is off."""
    from autograder.course.config import course_root, load_course
    from autograder.reports.similarity import compare, item_ranges, released_programs
    settings = load_course().similarity
    if not settings.enabled:
        return None
    items = items_of(item_summary(result) for _, result in rows)
    released = released_programs(course_root() / "release" / aid / f"{aid}.ipynb", items)
    groups, skipped = compare(rows, items, released, settings.min_nodes, settings.min_items)
    number = {item: k for k, item in enumerate(items, 1)}
    return {"settings": settings, "compared": len(rows) - sum(map(len, skipped.values())), "skipped": skipped,
            "groups": [{"names": g.names, "numbers": item_ranges(number[i] for i in g.items), "items": g.items}
                       for g in groups]}


def similar_text(folder):
    """The similar groups of the results under `folder` as terminal lines (for `course report` to print):
    'aid: items 3-5 (a, b, c) of alice and bob are the same program'."""
    lines = []
    for aid, rows in by_assignment(load_results(folder)).items():
        similar = similar_section(aid, rows)
        for g in similar["groups"] if similar else []:
            lines.append(f"{aid}: items {g['numbers']} ({', '.join(g['items'])}) of {and_list(g['names'])} are the "
                         f"same program")
    return lines


def and_list(names):
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def class_report(folder, stats=None):
    """The whole report as one HTML string, one section per assignment found (a folder of one assignment's results,
    or of one folder per assignment); rendered with autoescape, so every name and message from a submission is
    escaped. `stats`, a list, gets each assignment's statistics (class_stats.AssignmentStats) as the page shows them."""
    import matplotlib
    matplotlib.use("Agg")
    from autograder.course.config import load_course
    rows = load_results(folder)
    if not rows:
        raise ValueError(f"no results.json files in {folder} or the folders below it")
    sections = [assignment_section(aid, found) for aid, found in by_assignment(rows).items()]
    if stats is not None:
        stats.extend(section["stats"] for section in sections)
    return render_html("class_report.html.j2", folder=str(folder), count=len(rows), sections=sections,
                       settings=load_course().statistics)

