"""`course doctor` shows the figure of each seed grading trained the reference on, and a seed it missed is a FIX even
when a later seed passed (a student graded on that seed could lose the points)."""
from autograder.apps.doctor import Findings, experiment_margin
from autograder.course.config import load_course

LAB = "lab14_transformers"


def graded(*runs):
    """An experiment's test as results.json holds it, trained on `runs` ((seed, test_accuracy, passed), ...)."""
    trained = [{"seed": seed, "steps": 80, "metrics": {"test_accuracy": value}, "passed": ok}
               for seed, value, ok in runs]
    return {"item": "TransformerClassifier", "score": 4.0 if runs[-1][2] else 0.0, "max_score": 4.0, "seconds": 9.0,
            "output": "memory task: passed", "extra_data": {"experiment": "memory_task", "seed": runs[-1][0],
                                                            "metrics": trained[-1]["metrics"], "trained": trained}}


def test_a_seed_the_reference_missed_is_shown_and_named_though_the_next_passed(capsys):
    found, exp = Findings(), load_course().assignment(LAB).experiments["memory_task"]
    experiment_margin(found, LAB, exp, graded((0, 0.9495, False), (1, 0.9955, True)), 150)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("    memory_task")]
    assert len(lines) == 2 and "test_accuracy 0.9495 [>= 0.99]" in lines[0] and lines[0].endswith("seed 0 MISSED")
    assert "test_accuracy 0.9955" in lines[1] and "seed 1, 9 s of its 150 s limit" in lines[1], lines
    assert len(found.problems) == 1 and "misses on seed 0 and passes on seed 1" in found.problems[0], found.problems
    assert f"`course check {LAB} --seeds N`" in found.problems[0]


def test_a_first_seed_that_passes_says_which_seeds_were_not_trained(capsys):
    found, exp = Findings(), load_course().assignment(LAB).experiments["memory_task"]
    experiment_margin(found, LAB, exp, graded((0, 1.0, True)), 150)
    out = capsys.readouterr().out
    assert "seed 1 not trained" in out and f"`course experiments {LAB}`" in out and not found.problems, out
