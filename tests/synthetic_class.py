"""A class whose answers are known, written as the grader writes results (scoring.Outcome, scoring.results_json),
for the per-check statistics (tests/test_check_stats.py, benchmarks/check_stats.py).

Each student's notebook is put together item by item from what the meta-tests grade (tests/planted/<id>.py): the
stub of the release, one of the planted mistakes (its checks fail exactly as its catch set says), a correct
alternative or the reference (every check passes). A weaker student leaves more stubs and makes more mistakes, as a
class does. Two checks are planted to be distrusted: BROKEN fails a correct alternative (BROKEN_BY), and TOOTHLESS
catches nothing (taken out of every catch set, so a mistake only it caught now passes). Every count the class was
built with is kept (Built), for the statistics to be compared with.
"""
import json
import random
from collections import Counter
from dataclasses import dataclass, field

from autograder.course.config import load_course
from autograder.grading.scoring import Outcome, results_json, zero_reason
from tests.planted import planted

AID = "lab14_transformers"
BROKEN = ("PositionalEncoding", "values")
BROKEN_BY = "power_form"            # a correct alternative the broken check refuses
TOOTHLESS = ("EncoderBlock", "properties")
TRAINING = {"TransformerClassifier": {"head_on_detached_cls"}}  # checks pass, the experiment is missed
REFERENCE = "reference"


@dataclass
class Built:
    """What the class was built with: per (item, kind), the submissions that attempted the item and those that
    failed the check; per submission, each item's choice."""
    attempted: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)
    choices: dict = field(default_factory=dict)    # name -> {item: 'stub' | variant | REFERENCE}


def catches(aid=AID, distrusted=True):
    """item -> {variant: the checks it fails}: the planted mistakes' catch sets and none for a right answer; with
    `distrusted`, TOOTHLESS taken out of each catch set and BROKEN added to BROKEN_BY's (a correct alternative the
    broken check fails)."""
    out = {}
    toothless, broken = (TOOTHLESS, BROKEN) if distrusted else ((None, None), (None, None))
    for item, spec in planted(aid).items():
        out[item] = {name: set(kinds) - ({toothless[1]} if item == toothless[0] else set())
                     for name, kinds in spec["catches"].items()}
        out[item].update({name: {broken[1]} if (item, name) == (broken[0], BROKEN_BY) else set()
                          for name in [REFERENCE, *spec["right"]]})
        out[item].update({name: set() for name in TRAINING.get(item, ())})
    return out


def class_choices(n, aid=AID):
    """[{item: choice}] of n students (0 the weakest): per item a stub, a planted mistake or a right answer, drawn
    with odds that improve with the student's rank; an item's mistakes and right answers are handed out in turn,
    so that every one of them is met."""
    spec = planted(aid)
    turns = Counter()
    out = []
    for student in range(n):
        ability, rng = student / max(1, n - 1), random.Random(f"{aid}/{student}")
        choices = {}
        for item, found in spec.items():
            u = rng.random()
            weak = 1 - ability
            kind = "stub" if u < 0.3 * weak else "wrong" if u < 0.3 * weak + 0.7 * weak ** 2 else "right"
            pool = {"stub": ["stub"], "wrong": [*found["wrong"], *TRAINING.get(item, ())],
                    "right": [REFERENCE, *found["right"]]}[kind]
            choices[item] = pool[turns[(item, kind)] % len(pool)]
            turns[(item, kind)] += 1
        out.append(choices)
    return out


def student_result(choices, table, aid=AID, student=0):
    """The results.json the grader writes for a notebook of these choices (module doc); `table`: catches()."""
    assignment = load_course().assignment(aid)
    outcomes = []
    for item, spec in assignment.items.items():
        choice = choices[item]
        for kind, points in spec.points.items():
            o = Outcome(item, kind, points)
            if choice == "stub":  # plugin.finish_item: every check of a stub scores 0 with one reason
                o.score, o.output = 0.0, zero_reason(item, "", True)
            elif kind in table[item][choice]:
                figure = 0.01 * (1 + student % 9)  # figures vary; the reason, normalised, does not
                o.add(False, f"'{item}' {kind}: max |out - reference| = {figure:.4g} (tolerance 1e-05) on the "
                             f"case of {choice}", 0.01, case=f"{choice}, x (2, {3 + student % 4}, 8)")
            else:
                o.add(True, "ok" if kind != "exists" else f"'{item}' exists with signature {spec.signature}", 0.01)
            outcomes.append(o)
        outcomes += [experiment_outcome(exp, choice, table[item], student)
                     for exp in assignment.experiments_of(item) if exp.graded]
    return results_json(outcomes, aid=aid, notebook=f"{aid}.ipynb", device="cpu", seed=0, output="",
                        isolation="namespaces", restarts=0, seconds=1.0, notes=[])


def experiment_outcome(exp, choice, item_catches, student):
    """The experiment as experiments.run_experiment records it: a stub does not train; a right item clears every
    bound by far (the lecture's figures, give or take); a wrong one misses each by far."""
    o = Outcome(exp.item, f"experiment {exp.name}", exp.points)
    if choice == "stub":
        o.output = zero_reason(exp.item, "", True)
        return o
    learns = not item_catches[choice] and choice not in TRAINING.get(exp.item, ())
    metrics = {m: figure(exp, m, learns, student) for m in dict.fromkeys([exp.metric, *exp.threshold])}
    failures = exp.failures(metrics)
    o.extra = {"experiment": exp.name, "seed": exp.seeds[0], "metrics": metrics,
               "trained": [{"seed": exp.seeds[0], "steps": exp.steps, "hopeless": ""}]}
    o.score = 0.0 if failures else exp.points
    shown = ", ".join(f"{k} {v:.4g}" + (f" (lecture {exp.lecture[k]:g})" if k in exp.lecture else "")
                      for k, v in metrics.items())
    o.output = (f"{exp.description}: {'passed' if not failures else 'missed the lecture' + chr(39) + 's threshold'}"
                f"\nseed {exp.seeds[0]}: {shown}" + (" -- " + "; ".join(failures) if failures else ""))
    return o


def figure(exp, metric, learns, student):
    """A student's figure of one metric: the lecture's give or take when the model learns, else far on the bound's
    wrong side (twice the lecture's, for a metric without a bound; 1 or 0 for an indicator)."""
    bound = exp.threshold.get(metric)
    if bound and metric not in exp.lecture:  # a bound with no lecture's figure is an indicator's: dae_beats_ae
        return float(learns)
    base = exp.lecture.get(metric, 1.0)
    if learns:  # up to 30% of the way to the bound: far outside its crowding band (a quarter of the way)
        edge = bound and (bound.min if bound.min is not None else bound.max)
        return base + (edge - base) * 0.1 * (student % 4) if bound else base * (1 - 0.01 * (student % 4))
    if bound is None:
        return 2 * base
    return (bound.min * (0.5 + 0.01 * (student % 10)) if bound.min is not None
            else bound.max * (2 + 0.1 * (student % 10)))


def build_class(folder, n, aid=AID, distrusted=True):
    """Write n students' results.json under `folder` (student000.json, ...); what they were built with.
    `distrusted`: with the broken and the toothless check planted (catches)."""
    built, table = Built(), catches(aid, distrusted)
    assignment = load_course().assignment(aid)
    folder.mkdir(parents=True, exist_ok=True)
    for student, choices in enumerate(class_choices(n, aid)):
        name = f"student{student:03d}"
        built.choices[name] = choices
        (folder / f"{name}.json").write_text(json.dumps(student_result(choices, table, aid, student)))
        for item, choice in choices.items():
            kinds = [*assignment.items[item].points, *(f"experiment {e.name}" for e in assignment.experiments_of(item)
                                                       if e.graded)]
            for kind in kinds if choice != "stub" else ():
                built.attempted[(item, kind)] += 1
                learns = not table[item][choice] and choice not in TRAINING.get(item, ())
                built.failed[(item, kind)] += (kind in table[item][choice] if not kind.startswith("experiment")
                                               else not learns)
    return built
