"""The main job end to end: build the release, make example submissions, grade them, print the table."""
import shutil
import sys
import time

from autograder.batch.run import grade_batch, write_error_log
from autograder.course.config import course_root, load_course
from autograder.course.mnist import describe_source
from autograder.notebooks.build import ReleaseError, release
from autograder.notebooks.examples import write_examples
from autograder.reports.tables import experiment_lines, grade_table, grader_error_lines, not_scored, reason_lines


def demo(device="auto", workers=2, debug=False):
    """Release -> examples -> grade -> table, for every assignment, in the course's build/demo; 0 when all ran,
    3 when the grader failed on a submission (one line per cause; the tracebacks in the results' log file, and on
    stderr too with `debug`)."""
    course = load_course()
    out = course_root() / "build" / "demo"
    t0 = time.time()
    failed = False
    shutil.rmtree(out / "results", ignore_errors=True)  # a fresh grading every run (the experiment cache stays)
    print(describe_source() or "MNIST: none found (each experiment that trains on it is a grader error, below)",
          flush=True)
    print("1. Building the student release with nbgrader and checking it for leaks ...", flush=True)
    try:
        release(out_root=out / "release")
    except ReleaseError as e:
        print(e)
        return 1
    print(f"   release verified ({time.time() - t0:.0f} s)\n")
    for aid, assignment in course.assignments.items():
        print(f"2. {aid}: example submissions (complete, empty, partly right, broken), graded in the sandbox",
              flush=True)
        subs = write_examples(aid, out / "submissions" / aid, release_root=out / "release")
        t1 = time.time()
        results = out / "results" / aid
        rows = grade_batch(subs, aid, device=device, workers=workers, results_dir=results)
        print(grade_table(rows, list(assignment.items)))
        for line in (line for name, result in rows for line in reason_lines(name, result, width=118)):
            print(f"  {line}")
        log = write_error_log(rows, results)
        if log is not None:
            failed = True
            if debug:
                print(log.read_text(), file=sys.stderr)
            print("\n".join(f"  {line}" for line in grader_error_lines(rows, log)), flush=True)
        complete = dict(rows)["complete"]
        if not not_scored(complete):
            print("  experiments of the complete submission (measured by the grader's loop, lecture figure beside):")
            print("\n".join(f"    {line}" for line in experiment_lines(aid, complete)))
        print(f"  graded in {time.time() - t1:.0f} s\n", flush=True)
    print(f"Demo finished in {time.time() - t0:.0f} s. Results (results.json per submission): {out / 'results'}")
    if failed:
        print("The grader failed on some submissions (the lines above say why and how to fix it): exit status 3")
        return 3
    return 0
