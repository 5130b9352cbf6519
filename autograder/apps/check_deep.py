"""`course check`'s slower stages (`--planted`, `--mutations N`, `--seeds N`, all three with `--full`): is each check
of an assignment able to fail, on its own item only, and does the reference clear its thresholds with room to spare?

  - planted: each planted mistake (tests/planted/<id>.py) loses points on its item, by the checks the file names,
    and on no item outside the ones that use it; each correct alternative keeps full marks;
  - mutations: up to N small edits of each item's reference cell (an operator swapped, a constant moved, a sign
    dropped) are graded; a check that none of them fails is reported: it would pass wrong code of that kind too;
  - seeds: every graded experiment trained with the reference on seeds 0..N-1, each bound cleared by at least
    course.yaml's `experiments.min_margin`, in at most half its time limit.
"""
import ast
import tempfile
from pathlib import Path

import nbformat

from autograder.course.config import Assignment, load_course


def graded(aid: str, sources: dict[str, str], items: list[str] | None = None) -> dict[str, dict[str, bool]]:
    """The release with these cells replaced (the rest solved), graded without experiments: {item: {kind: passed}}."""
    from autograder.grading.grade import grade_notebook
    from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
    with tempfile.TemporaryDirectory(prefix="course-check-") as folder:
        path = Path(folder) / f"{aid}.ipynb"
        nbformat.write(with_cells(release_notebook(aid), {**solved_sources(aid), **sources}), path)
        result = grade_notebook(path, aid, items=items, device="cpu", experiments=False)
    out: dict[str, dict[str, bool]] = {}
    for test in result["tests"]:
        if "experiment" not in test.get("extra_data", {}):
            out.setdefault(test["item"], {})[test["name"].split(": ", 1)[1]] = test["score"] >= test["max_score"]
    return out


def planted_problems(aid: str, assignment: Assignment) -> list[str]:
    from autograder.grading.planted import RULES, dependents, packed, planted_module, variant_source
    module = planted_module(aid)
    if module is None:
        return [f"{aid}: no planted mistakes: tests/planted/{aid}.py is missing (`course new` writes one)"]
    spec = getattr(module, "PLANTED", {})
    problems = [f"{aid}: tests/planted/{aid}.py: {problem}" for rule in RULES for problem in rule(aid, module)]
    deps = dependents(aid)
    for kind in ("wrong", "right"):
        for batch in packed(aid, [(i, n, v) for i, s in spec.items() for n, v in s.get(kind, {}).items()]):
            scores = graded(aid, {item: variant_source(aid, item, v) for item, _, v in batch})
            for item, name, _ in batch:
                failed = {k for k, ok in scores.get(item, {}).items() if not ok}
                said = set(spec[item].get("catches", {}).get(name, failed)) if kind == "wrong" else set()
                if kind == "wrong" and not failed:
                    problems.append(f"{aid}: planted mistake '{item}/{name}' keeps full marks: no check of "
                                    f"'{item}' catches it")
                elif failed != said:
                    problems.append(f"{aid}: {'planted mistake' if kind == 'wrong' else 'correct alternative'} "
                                    f"'{item}/{name}' fails {sorted(failed) or 'nothing'} of '{item}', where "
                                    f"tests/planted/{aid}.py says {sorted(said) or 'nothing'}")
            reach = set().union(*({item} | deps[item] for item, _, _ in batch))
            hurt = sorted(i for i, kinds in scores.items() if i not in reach and not all(kinds.values()))
            for item, name, v in batch if hurt else []:  # rare: find which of the round did it
                alone = graded(aid, {item: variant_source(aid, item, v)})
                for other in hurt:
                    if other not in {item} | deps[item] and not all(alone.get(other, {}).values()):
                        problems.append(f"{aid}: {'planted mistake' if kind == 'wrong' else 'correct alternative'}"
                                        f" '{item}/{name}' costs points on '{other}', which does not use '{item}'")
    return problems


class Mutants(ast.NodeTransformer):
    """Every small edit of one kind at one place: the `target`-th candidate node is changed, the rest kept."""
    SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.Lt: ast.LtE,
             ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}

    def __init__(self, target: int = -1):
        self.target, self.seen, self.done = target, 0, ""

    def hit(self) -> bool:
        self.seen += 1
        return self.seen - 1 == self.target

    def visit_Expr(self, node):  # a docstring is no code to mutate
        return node if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str) else \
            self.generic_visit(node)

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if type(node.op) in self.SWAPS and self.hit():
            self.done = f"{type(node.op).__name__} -> {self.SWAPS[type(node.op)].__name__}"
            node.op = self.SWAPS[type(node.op)]()
        return node

    def visit_Compare(self, node):
        self.generic_visit(node)
        if type(node.ops[0]) in self.SWAPS and self.hit():
            self.done = f"{type(node.ops[0]).__name__} -> {self.SWAPS[type(node.ops[0])].__name__}"
            node.ops[0] = self.SWAPS[type(node.ops[0])]()
        return node

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.USub) and self.hit():
            self.done = "a minus sign dropped"
            return node.operand
        return node

    def visit_Constant(self, node):
        if type(node.value) in (int, float) and self.hit():
            moved = node.value + 1 if isinstance(node.value, int) else node.value * 2 or 1.0
            self.done = f"{node.value!r} -> {moved!r}"
            return ast.copy_location(ast.Constant(moved), node)
        return node


def mutants(source: str, limit: int) -> list[tuple[str, str]]:
    """Up to `limit` (description, source) edits of a cell, spread over its candidate places."""
    counter = Mutants()
    counter.visit(ast.parse(source))
    places = list(range(counter.seen))
    if len(places) > limit:
        places = [places[round(k * (len(places) - 1) / max(limit - 1, 1))] for k in range(limit)]
    out = []
    for target in places:
        edit = Mutants(target)
        tree = edit.visit(ast.parse(source))
        mutated = ast.unparse(ast.fix_missing_locations(tree))
        if edit.done and mutated != ast.unparse(ast.parse(source)):
            out.append((edit.done, mutated + "\n"))
    return out


def mutation_problems(aid: str, assignment: Assignment, limit: int, items: list[str] | None = None) -> list[str]:
    """The checks that no mutant of their item's reference cell fails."""
    from autograder.grading.planted import packed
    from autograder.notebooks.build import item_cell
    made = {item: mutants(item_cell(aid, item, solved=True), limit) for item in items or assignment.items}
    failed: dict[str, set[str]] = {item: set() for item in made}
    kinds: dict[str, set[str]] = {}
    for batch in packed(aid, [(item, what, source) for item, found in made.items() for what, source in found]):
        scores = graded(aid, {item: source for item, _, source in batch}, items=items)
        for item, _, _ in batch:
            kinds.setdefault(item, set()).update(scores.get(item, {}))
            failed[item] |= {k for k, ok in scores.get(item, {}).items() if not ok}
    return [f"{aid}: '{item}: {kind}' fails for none of the {len(made[item])} mutations of the reference's "
            f"'{item}' (an operator swapped, a constant moved, a sign dropped): it may pass wrong code too"
            for item in made for kind in sorted(kinds.get(item, set()) - failed[item] - {"exists"})]


def seed_problems(aid: str, assignment: Assignment, seeds: int) -> list[str]:
    """Each graded experiment's bounds cleared by the reference with course.yaml's minimum margin, on seeds 0..N-1."""
    from autograder.grading.experiments import run_reference
    from autograder.reports.experiment_stats import remember_reference
    course = load_course()
    margin, problems = course.experiments.min_margin, []
    for name, exp in assignment.experiments.items():
        limit = course.limits_for(aid, exp.item).experiment_seconds if exp.item else None
        for seed in range(seeds) if exp.graded else ():
            run = run_reference(aid, name, seed=seed)
            remember_reference(aid, run, "cpu")  # run_reference's device: the class report's plot shows it
            metrics = run.metrics
            if limit and run.seconds > limit / 2:  # a loaded grader, or a slower one, would run out of time
                problems.append(f"{aid}: experiment '{name}' took the reference {run.seconds:.0f} s on seed {seed}, "
                                f"more than half its {limit:g} s limit (limits.experiment_seconds)")
            for key, bound in exp.threshold.items():
                value = metrics.get(key)
                if value is None:
                    problems.append(f"{aid}: experiment '{name}' measured no '{key}' on seed {seed}")
                    continue
                room = min(value - bound.min if bound.min is not None else float("inf"),
                           bound.max - value if bound.max is not None else float("inf"))
                wanted, said = ((exp.min_margin[key], f"its min_margin.{key}") if key in exp.min_margin
                                else (margin, "experiments.min_margin"))
                if room < wanted:
                    problems.append(f"{aid}: experiment '{name}': the reference's {key} is {value:.4g} on seed "
                                    f"{seed}, {room:+.3g} from its bound ({bound}); course.yaml asks at least "
                                    f"{wanted:g} ({said})")
    return problems
