"""`course grade` and `course regrade`: grade notebooks in the sandbox, print the table and the reasons."""
import json
import os
import sys
from pathlib import Path

from autograder.course.config import load_course, released_notebook
from autograder.errors import ConfigError


def cmd_regrade(args):
    """`course grade` of the notebooks a results folder's results name, into that folder (results/saved_sources)."""
    from autograder.batch.results import saved_sources
    subs, missing = saved_sources(args.results_dir, args.assignment)
    for name, source in missing:
        print(f"{name}: its notebook {source} is gone; its saved result is kept as it is", file=sys.stderr)
    if not subs:
        raise ConfigError(f"{args.results_dir}: no result of {args.assignment} names a notebook that is still there")
    return cmd_grade(args, subs)


def cmd_grade(args, subs=None):
    """`course grade`: `subs` ((name, notebook)) when the caller found them (regrade), else args.paths'."""
    if args.allow_unisolated:  # read by the sandbox, in this process and in batch workers alike
        os.environ["COURSE_ALLOW_UNISOLATED"] = "1"
    import textwrap

    from autograder.apps.progress import progress_reporter
    from autograder.batch.changes import append_changes, change_lines, changes
    from autograder.batch.results import HISTORY, record_submission_times
    from autograder.batch.scheduler import Where, grade_class
    from autograder.batch.submissions import find_submissions
    from autograder.course.extensions import FILE as EXTENSIONS
    from autograder.reports.final_grade import final_grades
    from autograder.reports.tables import grade_table, not_scored, reason_lines, score_text, write_csv
    course = load_course()
    assignment = course.assignment(args.assignment)
    items = args.items.split(",") if args.items else None
    unknown = [i for i in items or [] if i not in assignment.items]
    if unknown:
        raise ConfigError(f"--items: {', '.join(unknown)} not in {args.assignment} "
                          f"(known: {', '.join(assignment.items)})")
    released_notebook(args.assignment)  # a missing release is one clear error, not a grader failure per notebook
    subs = subs or find_submissions(args.paths, args.assignment, say=lambda line: print(line, file=sys.stderr))
    times = submission_times(subs, args.submitted_at)  # a time that does not parse stops here, before any grading
    if args.workers <= 1 and not (args.scheduler or args.cluster):
        from autograder.batch.worker import start_zygote
        from autograder.sandbox.zygote import threads_per_worker
        start_zygote(threads_per_worker(1))  # it imports torch on another core while this process imports the grader
    print_mnist_source(args.assignment)
    how = {}
    try:
        with progress_reporter(len(subs)) as progress:
            def noted(done, total, name, result, got):
                how[name] = got
                progress(done, total, name, result, got)
            where = Where(workers=args.workers, scheduler=args.scheduler, cluster=args.cluster, jobs=args.jobs,
                          gpus_per_job=args.gpus_per_job)
            rows = grade_class(subs, args.assignment, items=items, device=args.device, where=where,
                               results_dir=args.results_dir, progress=noted)
    except KeyboardInterrupt:
        kept = (f"; the finished results are in {args.results_dir}, and a rerun grades the rest"
                if args.results_dir else "")
        print(f"interrupted: the submissions being graded were stopped and not scored{kept}", file=sys.stderr)
        return 130
    if args.results_dir:
        record_submission_times(rows, times, args.results_dir)
    shown = items or list(assignment.items)
    marks = {name: got for name, got in how.items() if got != "graded"}
    written = written_of(args.assignment, rows) if not items else None
    finals = final_grades(args.assignment, rows, times=times) if assignment.due and not items else None
    columns, notes = [], []
    if finals:
        columns += [("late", {n: f.lateness.text() for n, f in finals.items()}),
                    ("final", {n: score_text(f.final) for n, f in finals.items()})]
        notes.append(f"late: against {args.assignment}'s due time {assignment.due.isoformat()} and each student's "
                     f"extension ({EXTENSIONS}); final: the total after the late policy of course.yaml. A submission "
                     f"without a time (timestamp.txt beside it, or --submitted-at) counts as on time.")
    if written:
        columns.append(("written", {name: w.text() for name, w in written.items()}))
        notes.append("total: the automatic points (checks and experiments), final. written: the written answers, "
                     "which TAs grade in formgrader; pending until every answer is graded (docs/TA.md). Neither is "
                     "in the other.")
    print(grade_table(rows, shown, {i: assignment.item_points(i) for i in shown}, marks=marks, columns=columns,
                      notes=notes))
    if marks:
        kinds = ("graded", "reused", "rescored", "merged")
        counts = ", ".join(f"{sum(got == k for got in how.values())} {k}" for k in kinds)
        print("\n" + textwrap.fill(f"{counts}. reused: the result saved in {args.results_dir} by the same grading "
                                   f"(assignment, notebook content, items, grader); rescored: only course.yaml's "
                                   f"points moved since, so the saved checks' outcomes were scored again, running "
                                   f"nothing; merged: the items asked for regraded into the saved result, whose "
                                   f"total is shown.", 120))
    moved = changes([(n, r) for n, r in rows if how.get(n) != "reused"]) if args.results_dir else []
    if moved:
        print(f"\nwhose grade moved since its last grading ({len(moved)}; the earlier results are in "
              f"{Path(args.results_dir) / HISTORY}):")
        print("\n".join(textwrap.fill(line, 120, subsequent_indent="    ") for line in change_lines(moved)))
        print(f"(appended to {append_changes(args.results_dir, moved)})")
    reasons = [line for name, result in rows for line in reason_lines(name, result, limit=args.reasons)]
    if reasons:
        print("\nwhy points were lost:")
        print("\n".join(reasons))
    if args.json:  # a grader failure's score is null: nothing was scored
        saved = [(n, {**r, "score": None, "max_score": None} if not_scored(r) else r) for n, r in rows]
        payload = saved[0][1] if len(saved) == 1 else [{"submission": n, **r} for n, r in saved]
        with open(args.json, "w") as out:  # written as encoded: a class's results are never one string
            json.dump(payload, out, indent=1)
    if args.csv:
        write_csv(args.csv, rows, shown, written, finals)
    if report_grader_errors(rows, args.results_dir, args.debug):
        rerun = "; with --results-dir only these are graded again" if args.results_dir else ""
        print(f"fix the cause, then rerun the submissions not scored{rerun}", file=sys.stderr)
        return 3
    return 0


def submission_times(subs, csv_path=None):
    """name -> submission time of each (name, notebook): from the CSV when given (a name it lacks has none), else
    from nbgrader's timestamp.txt beside the notebook (none there: None, on time)."""
    from autograder.course.submission_times import from_csv, from_timestamp_file
    if csv_path:
        listed = from_csv(csv_path)
        return {name: listed.get(name) for name, _ in subs}
    return {name: from_timestamp_file(Path(notebook).parent) if Path(notebook).is_file() else None
            for name, notebook in subs}


def written_of(aid, rows):
    """Each submission's written answers (reports/written.py) by the name in `rows`, from nbgrader's gradebook."""
    from autograder.course.roster import student_of
    from autograder.reports.written import written_grades
    found = written_grades(aid, {student_of(name) for name, _ in rows})
    return {name: found[student_of(name)] for name, _ in rows} if found else None


def report_grader_errors(rows, log_folder, debug=False):
    """The batch's grader failures, one line per cause on stderr, their tracebacks in a log file the line names
    (and on stderr too with -v); whether there were any."""
    from autograder.batch.run import write_error_log
    from autograder.reports.tables import grader_error_lines
    log = write_error_log(rows, log_folder)
    if log is None:
        return False
    if debug:
        print(log.read_text(), file=sys.stderr)
    print("\n".join(grader_error_lines(rows, log)), file=sys.stderr)
    return True


def print_mnist_source(aid):
    """Which MNIST the assignment's experiments train on, once, when they use it and it is there (a missing one
    is the grader failure's line)."""
    from autograder.course.mnist import describe_source
    from autograder.grading.harness_files import data_source_of
    line = describe_source() if data_source_of(aid) else None
    if line:
        print(line, flush=True)
