"""`course experiments [ID ...]`: every experiment trained with the reference on each of its seeds, a line per
seed with its figures beside the lecture's and the threshold. A graded run may land on any seed, so a seed the
reference misses fails the command, named; `course check ID --seeds N` is where a recipe is tuned."""
import sys

from autograder.course.config import load_course


def experiments(ids=None, device="cpu") -> int:
    """0 when the reference clears every threshold on every seed, else 1 with a line per missed seed on stderr."""
    from autograder.grading.experiments import run_reference
    from autograder.reports.experiment_stats import remember_reference
    from autograder.reports.tables import format_row
    course = load_course()
    missed = []
    for aid in ids or course.assignments:
        for name, exp in course.assignment(aid).experiments.items():
            for seed in exp.seeds:
                result = run_reference(aid, name, device=device, seed=seed)
                remember_reference(aid, result, device)  # the class report's plot shows it beside the class's
                print(format_row(exp, result), flush=True)
                if not result.passed:
                    missed.append((aid, name, seed, "; ".join(result.failures)))
    for aid, name, seed, why in missed:
        print(f"error: {aid}.{name}: the reference misses on seed {seed} ({why}); grading may train any of its "
              f"seeds: tune the recipe (steps, threshold, seeds) with `course check {aid} --seeds N`",
              file=sys.stderr)
    return 1 if missed else 0
