"""What `course new` writes beside course.yaml and the notebook (apps/new.py): the hidden suite, the harness and the
planted mistakes, each a skeleton whose places to write are marked TODO(course new), on lines of their own, so the
files are ruff-clean whatever the names (line length 120)."""
import textwrap
from dataclasses import dataclass, field

TODO = "TODO(course new)"


@dataclass
class Found:
    """A graded item as the reference module defines it."""
    name: str
    signature: str
    methods: dict[str, str] = field(default_factory=dict)

    @property
    def is_class(self) -> bool:
        return self.name[:1].isupper()


def comment(indent: int, text: str) -> list[str]:
    """`text` as comment lines at `indent` spaces, wrapped at the line length (120) however long its names."""
    return [" " * indent + "# " + line for line in textwrap.wrap(text, 118 - indent, break_long_words=False)]


def suite(aid: str, items: list[Found], oracles: dict[str, list[str]] | None = None) -> str:
    """The hidden suite: per item, the cases to list and a shapes and a values check against the reference.
    `oracles`: item -> the functions a from-scratch item may not call, which its values check is compared with."""
    out = [f'"""Hidden checks of {aid}. PYTEST_DONT_REWRITE"""',
           f"# {TODO}: say in the docstring which oracle each item is compared with", "",
           "import pytest", "import torch", "",
           "from autograder.grading.suite_api import (", "    check_close,", "    check_tensor,", "    copy_state,",
           "    randn,  # noqa: F401 (for the cases)", "    reference,", "    tol,", ")",
           "", f'ref = reference("{aid}")']
    for item in items:
        name, cases = item.name, f"{item.name.lower()}_cases"
        against = comment(8, f"{TODO}: compare with {', '.join((oracles or {})[name])}, which it may not call") \
            if (oracles or {}).get(name) else []
        out += ["", "", f"# --- {name} {'-' * max(3, 112 - len(name))}", "", f"def {cases}(rng):"]
        if item.is_class:
            out += ['    """(label, constructor arguments, forward arguments) of the cases its checks run."""',
                    *comment(4, f"{TODO}: the cases {name} is checked on (shapes, dtypes, edge cases)"),
                    *comment(4, f"{name}{item.signature}, forward{item.methods.get('forward', '(x)')}; e.g."),
                    "    # yield \"d 8, x (2, 5, 8)\", (8,), (randn(rng, 2, 5, 8),)",
                    "    yield from ()", "", "",
                    f'@pytest.mark.item("{name}", "shapes")',
                    f"def test_{name.lower()}_shapes(student, rng):",
                    f"    for label, init, args in {cases}(rng):",
                    "        student.case(label)",
                    f'        model = student.new("{name}", *init)',
                    f"        expected = ref.{name}(*init).eval()(*args)",
                    '        student.method(model, "eval")',
                    '        got = student.method(model, "forward", *args)',
                    '        check_tensor("forward", expected, got, device=student.device)', "", "",
                    f'@pytest.mark.item("{name}", "values")',
                    f"def test_{name.lower()}_values(student, rng):",
                    f"    for label, init, args in {cases}(rng):",
                    "        student.case(label)",
                    f'        model = student.new("{name}", *init)',
                    '        student.method(model, "eval")',
                    "        # none left at its init",
                    "        weights = [randn(rng, *t.shape) / 4 if t.is_floating_point() else t",
                    "                   for t in student.state(model).values()]",
                    "        student.load_state(model, weights)",
                    f"        # {TODO}: a PyTorch module doing the same job, where one does", *against,
                    f"        oracle = ref.{name}(*init).eval()",
                    f'        copy_state("{name}", weights, oracle)',
                    "        with torch.no_grad():",
                    "            expected = oracle(*args)",
                    '        got = student.method(model, "forward", *args)',
                    '        check_close("forward", expected, got, atol=tol(student, args[0].dtype),',
                    '                    oracle="the reference with your weights", case=label)']
        else:
            out += ['    """(label, arguments) of the cases its checks run."""',
                    *comment(4, f"{TODO}: the cases {name} is checked on (shapes, dtypes, edge cases)"),
                    *comment(4, f"{name}{item.signature}; e.g."),
                    "    # yield \"x (2, 5) float64\", (randn(rng, 2, 5, dtype=torch.float64),)",
                    "    yield from ()", "", "",
                    f'@pytest.mark.item("{name}", "shapes")',
                    f"def test_{name}_shapes(student, rng):",
                    f"    for label, args in {cases}(rng):",
                    "        student.case(label)",
                    f"        expected = ref.{name}(*args)",
                    f'        got = student.call("{name}", *args)',
                    f'        check_tensor("{name}", expected, got, device=student.device)', "", "",
                    f'@pytest.mark.item("{name}", "values")',
                    f"def test_{name}_values(student, rng):",
                    f"    for label, args in {cases}(rng):",
                    "        student.case(label)",
                    f"        # {TODO}: a PyTorch oracle where one does the same job", *against,
                    f"        expected = ref.{name}(*args)",
                    f'        got = student.call("{name}", *args)',
                    "        atol = tol(student, args[0].dtype)",
                    f'        check_close("{name}", expected, got, atol=atol,',
                    '                    oracle="the reference solution", case=label)']
    return "\n".join(out) + "\n"


def harness(aid: str, experiments: dict[str, str]) -> str:
    """The grader's own training loop for each experiment: data, model, training with early stop (validating every
    VAL_EVERY steps), evaluation."""
    out = [f'"""The graded training runs of {aid}: the grader\'s own data, loop and evaluation around the student\'s',
           'parts (`parts`: the student\'s module in the sandbox; `ref`: the reference, for data)."""',
           "import torch", "import torch.nn.functional as F", "",
           "from .training import data_seeds, pass_marks, seeded, shuffled_rows, train_until", "",
           f"# {TODO}: the lecture's recipe",
           "BATCH, LR = 64, 1e-3",
           "VAL_EVERY = 25  # steps between validations: each costs a pass over the validation data"]
    for name, item in experiments.items():
        out += ["", "", f"def {name}_data(ref, cfg, seed, device):",
                '    """Training and validation data on `device`, from the run\'s own seeds."""',
                "    train_seed, val_seed, _ = data_seeds(seed)  # apart from the test data's",
                f"    # {TODO}: X, y, X_val, y_val from these seeds",
                '    raise NotImplementedError(f"the data, from seeds {train_seed} and {val_seed}")',
                "", "",
                f"def {name}_model(parts, cfg, seed, device):",
                f'    """The student\'s {item}, built from `seed` on `device`."""',
                f"    # {TODO}: its constructor arguments",
                f"    return seeded(lambda: parts.{item}(), seed, device)", "", "",
                f"def {name}_train(model, parts, data, cfg, seed):",
                '    """Adam, batch BATCH; validates every VAL_EVERY steps and stops once the marks are cleared."""',
                "    X, y = data['X'], data['y']",
                "    rows = shuffled_rows(X.size(0), BATCH, torch.Generator().manual_seed(seed), X.device)",
                "", "    def batch_loss(step):",
                "        idx = rows(step)",
                f"        # {TODO}: the lecture's loss",
                "        return F.cross_entropy(model(X[idx]), y[idx])",
                "", "    def validate():",
                '        X_val, y_val = data["X_val"], data["y_val"]',
                f'        return {{"score": {name}_score(model, X_val, y_val)}}',
                "", '    marks = pass_marks(cfg, {"score": 0.01})  # stop with a margin over the pass mark',
                '    return train_until(model, batch_loss, cfg["steps"], LR, validate, marks, every=VAL_EVERY)', "", "",
                "@torch.no_grad()", f"def {name}_score(model, X, y):",
                f'    """The metric course.yaml names for {name}."""',
                f"    # {TODO}: the score of model on (X, y)",
                '    raise NotImplementedError("the score")', "", "",
                f"def {name}_evaluate(model, ref, cfg, seed, device):",
                '    """The figures course.yaml judges, on data the training never saw."""',
                "    _, _, test_seed = data_seeds(seed)",
                f"    # {TODO}: the score on test data from this seed",
                '    raise NotImplementedError(f"the test score, from seed {test_seed}")']
    out += ["", "", "EXPERIMENTS = {"]
    for name, item in experiments.items():
        out += [f'    "{name}": dict(', f'        parts=["{item}"],', f"        data={name}_data,",
                f"        build={name}_model,", f"        train={name}_train,", f"        evaluate={name}_evaluate,",
                "    ),"]
    return "\n".join(out + ["}"]) + "\n"


def planted(aid: str, items: list[Found], experiments: dict[str, str]) -> str:
    """The meta-tests' planted mistakes: per item two typical ones and a correct alternative, a shapes check each
    isolates or a reason in NOT_ISOLATED, and per graded experiment a training failure, all to be written."""
    out = [f'"""Planted mistakes and correct alternatives for {aid} (tests/test_grading.py grades each, and',
           "`course check --planted` holds this file to the same rules).", "",
           "A tuple (old, new) edits the reference cell (one realistic slip); a string is a whole cell.", '"""',
           "from tests.planted import attach_catches", "",
           "# why a shapes check is not isolated yet (NOT_ISOLATED below)",
           'NOT_YET = ("no mistake above fails only the shapes check: a wrong shape breaks the values check too, "',
           '           "which compares shapes as well; a tensor made on the CPU inside the item (only the shapes "',
           '           "check\'s run on torch\'s meta device sees it) or a dtype no values case has isolates it")',
           "",
           "PLANTED = {"]
    for item in items:
        out += [f'    "{item.name}": {{',
                '        "wrong": {',
                *comment(12, f"{TODO}: two mistakes students make in `{item.name}`, one that only its shapes "
                             f"check catches (a tensor made on the CPU, torch.zeros(n) without device=; a wrong "
                             f"dtype), or a reason in NOT_ISOLATED below"),
                '            # "name": ("text of the reference cell", "the text as a student gets it wrong"),',
                "        },",
                '        "right": {',
                f"            # {TODO}: a correct alternative written another way",
                '            # "name": ("text of the reference cell", "the same done otherwise"),',
                "        },", "    },"]
    out += ["}", "", "# The checks that catch each planted mistake: exactly these fail, every other check passes.",
            "CATCHES = {"]
    for item in items:
        out += [*comment(4, f"{TODO}: each mistake's checks of `{item.name}`, \"name\": {{\"values\"}}"),
                f'    "{item.name}": {{}},']
    out += ["}", "attach_catches(PLANTED, CATCHES)", "",
            "# Checks that no planted mistake above fails on its own, and why (a reason, not an excuse: each is work",
            "# left); drop an entry once a mistake isolates its check.", "NOT_ISOLATED = {"]
    for item in items:
        out += [f"    # {TODO}: a mistake only this check catches, or keep this line and its reason",
                f'    ("{item.name}", "shapes"): NOT_YET,']
    out += ["}", "", "# Training failures: code that passes every check of its item, yet cannot learn (\"fails\": the",
            "# experiments it loses).", "TRAINING = {"]
    for name, item in experiments.items():
        out += [*comment(4, f"{TODO}: a `{item}` that passes its checks but cannot learn in `{name}` (a "
                               f"detached layer, a shuffle over the batch in training mode)"),
                '    # "name": {', f'    #     "item": "{item}",', f'    #     "fails": ["{name}"],',
                '    #     "variant": ("text of the reference cell", "the text as a student gets it wrong"),',
                "    # },"]
    return "\n".join(out + ["}"]) + "\n"
