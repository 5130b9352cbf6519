"""The main job end to end: build the release, make example submissions, grade them, print the table."""
import shutil
import time

from autograder.batch.run import grade_batch
from autograder.course.config import course_root, load_course
from autograder.notebooks.build import ReleaseError, release
from autograder.notebooks.examples import write_examples
from autograder.reports.tables import experiment_lines, grade_table, reason_lines


def demo(device="auto", workers=2):
    """Release -> examples -> grade -> table, for every assignment, in the course's build/demo; 0 when all ran."""
    course = load_course()
    out = course_root() / "build" / "demo"
    t0 = time.time()
    failures = []
    shutil.rmtree(out / "results", ignore_errors=True)  # a fresh grading every run (the experiment cache stays)
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
        rows = grade_batch(subs, aid, device=device, workers=workers, results_dir=out / "results" / aid)
        print(grade_table(rows, list(assignment.items)))
        for name, result in rows:
            print("\n".join(f"  {line}" for line in reason_lines(name, result, width=118)))
        failures += [f"{aid}/{name}: {result['output']}" for name, result in rows
                     if result.get("extra_data", {}).get("grader_error")]
        complete = dict(rows)["complete"]
        print("  experiments of the complete submission (measured by the grader's loop, lecture figure beside):")
        print("\n".join(f"    {line}" for line in experiment_lines(aid, complete)))
        print(f"  graded in {time.time() - t1:.0f} s\n", flush=True)
    print(f"Demo finished in {time.time() - t0:.0f} s. Results (results.json per submission): {out / 'results'}")
    if failures:
        print("The grader itself failed on: " + "; ".join(failures))
        return 3
    return 0
