"""The `course` command: one verb per job over the shared core (grade, regrade, report, stats, solve, sync, release,
export, extend, experiments, curves, formgrader, demo, doctor)."""
import argparse
import atexit
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from autograder.apps.grade import cmd_grade, cmd_regrade
from autograder.course import profiles
from autograder.course.config import course_root, load_course
from autograder.errors import ConfigError


def cmd_sync(args):
    from autograder.notebooks.build import sync
    for aid in args.ids or load_course().assignments:
        changed = sync(aid)
        print(f"{aid}: {'rewrote ' + ', '.join(changed) if changed else 'in sync with solutions/ and course.yaml'}")
    return 0


def cmd_solve(args):
    from autograder.notebooks.build import execute, solve
    for aid in args.ids or load_course().assignments:
        path = solve(aid, args.out)
        print(f"{aid}: solution notebook at {path}")
        if args.execute:
            t0 = time.time()
            execute(path)
            print(f"{aid}: executed top to bottom in {time.time() - t0:.0f} s without an error")
    return 0


def cmd_release(args):
    from autograder.notebooks.build import ReleaseError, release
    try:
        paths = release(args.ids or None)
    except ReleaseError as e:
        print(str(e), file=sys.stderr)
        return 1
    for p in paths:
        print(f"released and verified: {p}")
    return 0


def cmd_experiments(args):
    from autograder.apps.experiments import experiments
    return experiments(args.ids, args.device)


def cmd_curves(args):
    from autograder.apps.curves import ship_curves
    return ship_curves(args.ids)


def cmd_export(args):
    from autograder.integrations.gradescope import export_gradescope
    path = export_gradescope(args.id, args.output, device=args.device)
    print(f"{args.id}: Gradescope autograder at {path} (upload it as the assignment's autograder, or try it here: "
          f"otter run -a {path} SUBMISSION.ipynb)")
    if args.check is None:
        return 0
    from autograder.course.config import released_notebook
    from autograder.integrations.gradescope_check import check
    return check(path, args.check or [released_notebook(args.id)], venv=args.venv)


def cmd_export_grades(args):
    from autograder.apps.semester import export_grades
    return export_grades(args.results_dirs, args.roster, args.lms, args.output, args.moodle_key)


def cmd_extend(args):
    from autograder.apps.semester import extend_deadline
    return extend_deadline(args.student, args.id, args.days, args.roster)


def cmd_report(args):
    from autograder.reports.class_report import class_report, similar_text
    stats = []
    try:
        page = class_report(args.results_dir, stats)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    Path(args.out).write_text(page)
    for line in similar_text(args.results_dir):
        print(line)
    print(f"class report written to {args.out}")
    if args.json:
        Path(args.json).write_text(json.dumps([s.as_json() for s in stats], indent=1))
        print(f"per-check and per-experiment statistics written to {args.json}")
    return 0


def cmd_stats(args):
    from autograder.reports.class_stats import folder_stats, stats_lines
    print("\n\n".join("\n".join(stats_lines(s)) for s in folder_stats(args.results_dir, args.assignment)))
    return 0


def cmd_formgrader(args):
    from autograder.apps.formgrader import formgrader
    return formgrader(args.ip, args.port)


def cmd_demo(args):
    from autograder.apps.demo import demo
    return demo(device=args.device, workers=args.workers, debug=args.debug)


def cmd_doctor(args):
    from autograder.apps.doctor import doctor
    return doctor(quick=args.quick, device=args.device, aids=args.assignments)


def cmd_new(args):
    from autograder.apps.new import new
    return new(args.assignment, args.experiment, args.from_scratch)


def cmd_check(args):
    from autograder.apps.check import check
    full = args.full
    return check(args.assignments, grade=args.grade or full, planted=args.planted or full,
                 mutations=args.mutations or (8 if full else 0), seeds=args.seeds or (4 if full else 0))


def add_device(parser, default):
    parser.add_argument("--device", default=default, choices=["auto", "cpu", "cuda"],
                        help=f"where the grader's models run; auto: course.yaml's device, and where that is auto "
                             f"too, cuda when torch sees a GPU, else cpu (default {default})")


def add_debug(parser):
    parser.add_argument("-v", "--debug", action="store_true",
                        help="also print the tracebacks of grader failures (always written to the log file that "
                             "the failure's line names)")


def add_grading_options(g):
    """The options `course grade` and `course regrade` share."""
    g.add_argument("--assignment", "-a", required=True,
                   help="the assignment's id in course.yaml, e.g. lab14_transformers")
    g.add_argument("--items", help="comma-separated items to (re)grade; default all")
    add_device(g, "auto")
    g.add_argument("--workers", type=int, default=1, help="submissions graded at once, each in a worker process "
                   "with its share of the cores (default 1)")
    g.add_argument("--scheduler", metavar="ADDRESS_OR_FILE", help="grade on a running Dask cluster: tcp://HOST:PORT, "
                   "tls://HOST:PORT or a scheduler file (docs/CLUSTER.md)")
    g.add_argument("--cluster", choices=["local", "slurm", "pbs", "k8s"], help="start a Dask cluster for this "
                   "batch and tear it down at the end (local: this machine, 127.0.0.1 only)")
    g.add_argument("--jobs", type=int, default=1, help="--cluster's batch jobs, pods or local workers")
    g.add_argument("--gpus-per-job", type=int, default=0, help="--cluster's GPUs per job: one worker per GPU")
    g.add_argument("--json", help="write results.json (one notebook) or a JSON list (several)")
    g.add_argument("--csv", help="write one row per submission")
    g.add_argument("--submitted-at", metavar="CSV", help="submission times, a CSV of submission,submitted_at (ISO "
                   "8601); default: nbgrader's timestamp.txt beside each notebook, else none (on time)")
    g.add_argument("--reasons", type=int, default=4, help="lost-point reasons shown per submission")
    g.add_argument("--allow-unisolated", action="store_true",
                   help="grade even where the sandbox can isolate nothing (a trusted class only)")
    add_debug(g)


def build_parser():
    """The `course` command's parser: a subparser per verb, each option with its help line."""
    parser = argparse.ArgumentParser(prog="course", description=__doc__)
    parser.add_argument("--course", metavar="DIR", help="the course folder (course.yaml, release/, assignments/): "
                        "default $COURSE_ROOT, else the nearest folder at or above the working folder with course.yaml")
    parser.add_argument("--profile", metavar="NAME", help="grade under course.yaml's profiles.NAME (rehearsal: a few "
                        "steps of training, bounds any figure meets; a dry run): default $COURSE_PROFILE")
    sub = parser.add_subparsers(dest="verb", required=True)

    g = sub.add_parser("grade", help="grade submitted notebooks with the isolated grader")
    g.add_argument("paths", nargs="+", metavar="NOTEBOOK_OR_DIR",
                   help="notebooks, or folders searched for them (a folder's first level names the student)")
    add_grading_options(g)
    g.add_argument("--results-dir", help="save each result here as it finishes; a rerun reuses a saved result only "
                   "when it is the same grading (assignment, notebook content, items, grader), rescores it when only "
                   "course.yaml's points moved, and an --items run regrades those items into the saved result")
    g.set_defaults(run=cmd_grade)

    g = sub.add_parser("regrade", help="grade a results folder's submissions again after a change (course.yaml, a "
                                       "suite, a solution): only what the change touches, listing whose grade moved")
    g.add_argument("results_dir", metavar="RESULTS_DIR", help="what `course grade --results-dir` wrote: each "
                   "result names the notebook it graded")
    add_grading_options(g)
    g.set_defaults(run=cmd_regrade)

    s = sub.add_parser("report", help="the class's view as one HTML page, from a folder of results.json files")
    s.add_argument("results_dir", metavar="RESULTS_DIR", help="what `course grade --results-dir` wrote")
    s.add_argument("-o", "--out", default="report.html", help="the HTML file to write (default report.html)")
    s.add_argument("--json", metavar="FILE", help="also write each assignment's per-check and per-experiment "
                   "statistics (those of `course stats`) as JSON, for scripts")
    s.set_defaults(run=cmd_report)

    s = sub.add_parser("stats", help="per check of one assignment: attempted, pass rate, discrimination, the "
                                     "failing reasons, and the checks and experiments to distrust (docs/TA.md)")
    s.add_argument("results_dir", metavar="RESULTS_DIR", help="what `course grade --results-dir` wrote")
    s.add_argument("--assignment", "-a", required=True, help="the assignment's id in course.yaml")
    s.set_defaults(run=cmd_stats)

    s = sub.add_parser("sync",
                       help="rewrite source notebooks' graded cells from solutions/ and points from course.yaml")
    s.add_argument("ids", nargs="*", metavar="ID", help="assignments to sync (default all)")
    s.set_defaults(run=cmd_sync)

    s = sub.add_parser("solve", help="build the instructor's solution notebooks from solutions/")
    s.add_argument("ids", nargs="*", metavar="ID", help="assignments to solve (default all)")
    s.add_argument("--out", help="output folder (default build/solved/ID)")
    s.add_argument("--execute", action="store_true", help="run the notebook top to bottom in a kernel")
    s.set_defaults(run=cmd_solve)

    s = sub.add_parser("release", help="regenerate release/ with nbgrader and verify nothing hidden leaked")
    s.add_argument("ids", nargs="*", metavar="ID", help="assignments to release (default all)")
    s.set_defaults(run=cmd_release)

    s = sub.add_parser("experiments", help="run the lectures' experiments with the reference solutions, each seed; "
                                           "exit 1 naming any seed the reference misses")
    s.add_argument("ids", nargs="*", metavar="ID", help="assignments whose experiments run (default all)")
    add_device(s, "cpu")
    s.set_defaults(run=cmd_experiments)

    s = sub.add_parser("curves", help="write the reference's validation curves into .grader/curves, to commit: a "
                                      "fresh checkout's first grading then trains none (docs/DEVELOPING.md)")
    s.add_argument("ids", nargs="*", metavar="ID", help="assignments whose curves to write (default all, and the "
                                                        "files no current curve's key names are removed)")
    s.set_defaults(run=cmd_curves)

    export = sub.add_parser("export", help="a Gradescope autograder zip, or the class's grades for an LMS")
    targets = export.add_subparsers(dest="target", required=True, help="grades (for an LMS) or gradescope (a zip)")
    s = targets.add_parser("grades", help="every assignment's final grades in one file an LMS imports (Canvas, "
                                          "Moodle) or a CSV with every part of each grade")
    s.add_argument("results_dirs", nargs="+", metavar="RESULTS_DIR", help="what `course grade --results-dir` wrote "
                   "(one folder per assignment, or a folder of them)")
    s.add_argument("--roster", required=True, help="a CSV with a `student` column (the submission folder's name) "
                   "and the LMS's own identity columns (Canvas: Student, ID, SIS User ID, SIS Login ID, Section)")
    s.add_argument("--lms", required=True, choices=["canvas", "moodle", "csv"], help="the file's format")
    s.add_argument("--moodle-key", default="email", choices=["email", "username", "idnumber"],
                   help="moodle: the roster's column Moodle matches users by (default email)")
    s.add_argument("-o", "--output", required=True, help="the file to write")
    s.set_defaults(run=cmd_export_grades)

    s = targets.add_parser("gradescope", help="build a Gradescope autograder zip (Otter-Grader) for one assignment")
    s.add_argument("id", metavar="ID", help="the assignment's id in course.yaml")
    s.add_argument("-o", "--output", default="autograder.zip", help="the zip to write (default autograder.zip)")
    add_device(s, "auto")
    s.add_argument("--check", nargs="*", metavar="SUBMISSION", default=None,
                   help="then grade these (default: the release) with the zip as Gradescope builds it: a fresh "
                        "environment from its requirements, an /autograder-like root, no CAP_SYS_ADMIN")
    s.add_argument("--venv", help="--check's environment: built here if missing, reused if present")
    s.set_defaults(run=cmd_export)

    s = sub.add_parser("extend", help="give a student more days on an assignment (extensions.csv, out of git)")
    s.add_argument("student", metavar="STUDENT", help="the student's id (their submission folder's name)")
    s.add_argument("id", metavar="ID", help="the assignment's id in course.yaml")
    s.add_argument("--days", type=float, required=True, help="days after the due time (0 removes the extension)")
    s.add_argument("--roster", help="a roster CSV (a `student` column) naming students beyond nbgrader's gradebook "
                   "and .nbgrader/submitted/")
    s.set_defaults(run=cmd_extend)

    s = sub.add_parser("formgrader", help="open nbgrader's formgrader for this course: grade written answers, "
                                          "comment, give extra credit, autograde one student (docs/TA.md)")
    s.add_argument("--port", type=int, default=8888, help="the port to listen on (default 8888; the next free one "
                   "if it is taken)")
    s.add_argument("--ip", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine "
                   "only; reach it from yours with `ssh -L 8888:127.0.0.1:8888 HOST`)")
    s.set_defaults(run=cmd_formgrader)

    s = sub.add_parser("demo", help="release, example submissions, grading and the grade table, end to end")
    add_device(s, "auto")
    s.add_argument("--workers", type=int, default=2, help="submissions graded at once (default 2)")
    add_debug(s)
    s.set_defaults(run=cmd_demo)

    s = sub.add_parser("new", help="scaffold a new assignment from its reference module, solutions/ID.py: "
                                   "course.yaml, notebook, hidden suite, harness, planted mistakes")
    s.add_argument("assignment", metavar="ID", help="the new assignment's id (solutions/ID.py must exist)")
    s.add_argument("--experiment", action="append", default=[], metavar="NAME:ITEM",
                   help="a graded training run of ITEM (repeatable): course.yaml entry and harness skeleton")
    s.add_argument("--from-scratch", action="append", default=[], metavar="ITEM=ORACLE",
                   help="ITEM is written from scratch: calling ORACLE (a function's dotted path, or a name of "
                        "course.yaml's oracles:) scores it 0 (repeatable; written to the assignment's own oracles:)")
    s.set_defaults(run=cmd_new)

    s = sub.add_parser("check", help="is an assignment safe to hand out: solution, suite, harness, notebook and "
                                     "release agree with course.yaml (one line per problem)")
    s.add_argument("assignments", nargs="*", metavar="ID", help="the assignments to check (default: all)")
    s.add_argument("--grade", action="store_true", help="also grade the reference solution (full marks) and the "
                   "release (0), without experiments: about a minute per assignment")
    s.add_argument("--planted", action="store_true", help="grade each planted mistake (tests/planted/ID.py): it "
                   "must lose points on its own item, by the checks named, and on no other")
    s.add_argument("--mutations", type=int, default=0, metavar="N", help="grade up to N small edits of each item's "
                   "reference cell; a check none of them fails is reported")
    s.add_argument("--seeds", type=int, default=0, metavar="N", help="train every graded experiment with the "
                   "reference on seeds 0..N-1: each bound cleared by experiments.min_margin")
    s.add_argument("--full", action="store_true", help="all of the above: --grade --planted --mutations 8 --seeds 4")
    s.set_defaults(run=cmd_check)

    s = sub.add_parser("doctor", help="check this machine before grading: isolation, MNIST, device, cache, versions, "
                                      "and the reference solutions graded with their experiments' margins")
    s.add_argument("assignments", nargs="*", metavar="ID", help="the assignments whose references are graded "
                   "(default: all)")
    s.add_argument("--quick", action="store_true", help="grade the reference solutions without their experiments "
                   "(no training): seconds instead of minutes")
    add_device(s, "auto")
    s.set_defaults(run=cmd_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    # before anything loads torch (and with it libgomp): the grader's own threads wait passively, as its sandboxes'
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # a TA's kill and a closed terminal are a Ctrl-C: what is done is kept, batch workers and sandboxes are ended
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGHUP, signal.default_int_handler)
    args = build_parser().parse_args(argv)
    try:
        if args.course:  # in the environment, so that batch workers and nbgrader's processes grade the same course
            os.environ["COURSE_ROOT"] = str(Path(args.course).expanduser().resolve())
            course_root()  # a folder without course.yaml: an error naming it, before the verb starts
        if args.profile is not None:  # likewise in the environment, for the same processes
            os.environ[profiles.ENV] = args.profile
        if profiles.chosen():
            load_course()  # an unknown profile: an error naming the ones there are, before the verb starts
            print(profiles.notice(profiles.chosen()), file=sys.stderr)
        return args.run(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # `course grade` says what was kept; other verbs have nothing half-done to keep
        print("interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """`course` as a program: main's exit status, without the interpreter's teardown of torch (about 0.6 s at the
    end of every grading, after the results are written) where no thread but daemons is left to wait for; atexit's
    work (flushes, temporary folders) is done first, as multiprocessing's forked children end."""
    code = main()
    if any(not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)  # the interpreter's shutdown waits for them
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
