"""The smallest failing case (issue 27): a planted mistake's failed check ends with a small case, the case read back
from the reason reproduces the failure (the planted code against the reference solution, here), a regrade gives the
same case, and a check that passes never searches."""
import ast
import re

import nbformat
import pytest
import torch
from hypothesis import strategies as st

from autograder.grading.checks import Fail
from autograder.grading.experiments import reference_parts
from autograder.grading.grade import grade_notebook
from autograder.grading.smallest_case import Search, compare, find, smallest_case
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from autograder.sandbox.grader_side import StudentRaised
from tests.planted import planted, variant_source

pytestmark = pytest.mark.grading
MARK = "; smallest failing case: "
# a budget no loaded CI machine reaches, so that a regrade compares whole searches, never cut ones
SEARCH = {"search_seconds": 40}


def tensor(v):
    """A case's value as the grader sent it: bool lists stay bool, numbers become float32 (ints are exact)."""
    if v is None or isinstance(v, (int, bool)):
        return v
    t = torch.tensor(v)
    return t if t.dtype == torch.bool else t.float()


def parse(output):
    """({name: value}, output name, expected, got) from a reason ending with the smallest failing case."""
    assert MARK in output, output
    text = output.split(MARK, 1)[1].split("\n", 1)[0]
    inputs, result = text.rsplit(": expected ", 1)
    out, expected, got = re.fullmatch(r"(\S+)=(.*), got \1=(.*)", result).groups()
    names = list(re.finditer(r"(?:^|, )([\w.]+)=", inputs))
    case = {}
    for m, nxt in zip(names, names[1:] + [None], strict=True):
        case[m.group(1)] = tensor(ast.literal_eval(inputs[m.end():nxt.start() if nxt else len(inputs)]))
    return case, out, torch.tensor(ast.literal_eval(expected)), torch.tensor(ast.literal_eval(got))


def group_of(item):
    return next(g for g, items in GROUPS.items() if item in items)


def planted_namespace(group):
    """The reference solution's names with the group's planted cells run over them: what its notebook defines."""
    rows = [row for row in CASES if row[1] in GROUPS[group]]
    ns = dict(vars(reference_parts(rows[0][0])))
    for aid, item, mistake, *_ in rows:
        exec(variant_source(aid, item, planted(aid)[item]["wrong"][mistake]), ns)
    return ns


def mha(ns, c):
    """ns's MultiHeadAttention of the case's size carrying the case's weights."""
    m = ns["MultiHeadAttention"](c["d_model"], c["h"], bias=c["bias"])
    m.load_state_dict({k: v for k, v in c.items() if k.startswith("W")})
    return m


# (aid, item, planted mistake, check, bound on every dimension, call(namespace, case) -> outputs by name)
CASES = [
    ("w8l4_transformers", "attention", "no_sqrt_scale", "values", 2,
     lambda ns, c: dict(zip("ZA", ns["attention"](c["Q"], c["K"], c["V"], mask=c["mask"]), strict=True))),
    ("w8l4_transformers", "positional_encoding", "sin_cos_swapped", "values", 2,
     lambda ns, c: {"PE": ns["positional_encoding"](c["max_len"], c["d_emb"])}),
    ("w8l4_transformers", "causal_mask", "diagonal_blocked", "values", 1,
     lambda ns, c: {"mask": ns["causal_mask"](c["T"])}),
    ("w8l4_transformers", "MultiHeadAttention", "no_output_projection", "values", 2,
     lambda ns, c: dict(zip(("out", "A"), mha(ns, c)(c["x_q"], c["x_kv"], mask=c["mask"]), strict=True))),
    ("w8l1_attention_vision", "score_scaled", "divided_by_d", "values", 2,
     lambda ns, c: {"scores": ns["score_scaled"](c["s"], c["H"])}),
    ("w8l1_attention_vision", "score_general", "W_a_transposed", "values", 2,
     lambda ns, c: {"scores": ns["score_general"](c["s"], c["H"], c["W_a"])}),
]
# One notebook per group, graded once. MultiHeadAttention calls the notebook's own (unscaled) `attention`, so its
# case is that of the submission's MultiHeadAttention as a whole, which is what a student reads it against.
GROUPS = {"w8l4": ("attention", "positional_encoding", "causal_mask", "MultiHeadAttention"),
          "w8l1": ("score_scaled", "score_general")}


def graded(tmp_path_factory, group):
    """results.json of the group's notebook (the solution with the group's planted mistakes), its items alone."""
    rows = [row for row in CASES if row[1] in GROUPS[group]]
    aid = rows[0][0]
    sources = solved_sources(aid)
    for _, item, mistake, *_ in rows:
        sources[item] = variant_source(aid, item, planted(aid)[item]["wrong"][mistake])
    path = tmp_path_factory.mktemp(group) / f"{aid}.ipynb"
    nbformat.write(with_cells(release_notebook(aid), sources), path)
    return path, grade_notebook(path, aid, items=list(GROUPS[group]), device="cpu", experiments=False, limits=SEARCH)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("COURSE_SEARCH_SECONDS", raising=False)  # tests/conftest.py turns the search off elsewhere
        yield {group: graded(tmp_path_factory, group) for group in GROUPS}


def reason(results, item, check):
    return next(t["output"] for t in results[group_of(item)][1]["tests"] if t["name"] == f"{item}: {check}")


@pytest.mark.parametrize("aid, item, mistake, check, bound, call", CASES, ids=[f"{r[1]}-{r[2]}" for r in CASES])
def test_a_planted_mistake_gets_a_small_case_that_reproduces_it(results, aid, item, mistake, check, bound, call):
    output = reason(results, item, check)
    print(output)
    case, out, expected, got = parse(output)
    for name, v in case.items():
        sizes = [v] if isinstance(v, int) and not isinstance(v, bool) and name not in ("d_model", "k") else \
            list(v.shape) if isinstance(v, torch.Tensor) and not name.startswith("W") else []
        assert all(s <= bound for s in sizes), f"{name} = {v} is larger than {bound}: {case}"
    with torch.no_grad():
        student = call(planted_namespace(group_of(item)), case)[out]
        reference = call(dict(vars(reference_parts(aid))), case)[out]
    assert student.shape != reference.shape or not torch.allclose(student.double(), reference.double(), atol=1e-4), \
        f"the planted {mistake} agrees with the reference on {case}"
    assert torch.allclose(reference.double(), expected.double(), atol=5e-3), (reference, expected)  # 3 digits shown
    assert torch.allclose(student.double(), got.double(), atol=5e-3), (student, got)


def test_a_regrade_gives_the_same_cases(results, monkeypatch):
    monkeypatch.delenv("COURSE_SEARCH_SECONDS", raising=False)
    path, first = results["w8l4"]
    again = grade_notebook(path, "w8l4_transformers", items=list(GROUPS["w8l4"]), device="cpu", experiments=False,
                           limits=SEARCH)
    before = {t["name"]: t["output"] for t in first["tests"] if MARK in t["output"]}
    after = {t["name"]: t["output"] for t in again["tests"] if MARK in t["output"]}
    assert len(before) >= 4 and before == after


class FakeStudent:
    """A student answered in this process: `answers` counts the calls a search makes."""

    def __init__(self, fn, item="fake"):
        self.fn, self.item, self.answers, self.deadline = fn, item, 0, float("inf")

    def call(self, name, *args, **kwargs):
        self.answers += 1
        return self.fn(*args, **kwargs)


def doubling_search():
    return Search(lambda draw: {"x": torch.tensor([float(draw(st.integers(-3, 3)))])},
                  lambda student, c, memo: student.call("f", c["x"]), lambda c: c["x"], ("y",))


def test_a_passing_check_never_searches():
    student = FakeStudent(lambda x: 2 * x)

    @smallest_case(doubling_search())
    def check(student):
        return None

    check(student=student)
    assert student.answers == 0


def test_a_failing_check_ends_with_the_smallest_case_and_a_budget_ends_the_search():
    student = FakeStudent(lambda x: 2 * x)

    @smallest_case(doubling_search())
    def check(student):
        raise Fail("max |y - x| = 3 at index (0,)")

    with pytest.raises(Fail) as e:
        check(student=student)
    assert str(e.value) == "max |y - x| = 3 at index (0,); smallest failing case: x=[1]: expected y=[1], got y=[2]"
    spent = FakeStudent(lambda x: 2 * x, item="spent")
    assert find(spent, doubling_search(), budget_s=0.0) == (None, "") and spent.answers == 0


def test_a_student_that_raises_on_every_small_case_keeps_the_graders_case_alone():
    def broken(x):
        raise StudentRaised("IndexError: too small")

    @smallest_case(doubling_search())
    def check(student):
        raise Fail("max |y - x| = 3 at index (0,)")

    with pytest.raises(Fail) as e:
        check(student=FakeStudent(broken))
    assert str(e.value) == "max |y - x| = 3 at index (0,)"


def test_a_missing_gradient_disagrees_only_where_one_was_due():
    assert compare(("dQ", "dK"), (torch.tensor([1.0]), torch.zeros(1)), (None, None)) == ("dQ", torch.tensor([1.0]),
                                                                                         None)
    assert compare(("dQ", "dK"), (torch.ones(1), torch.zeros(1)), (torch.ones(1), None)) is None


def test_a_right_gradient_in_self_attention_is_no_failing_case():
    """w8l4's MultiHeadAttention gradients search has two outputs (d x_q, d x_kv); in self-attention there is no
    x_kv, and a right answer there was a tuple of one, taken for a wrong one: the smallest 'failing' case it named
    (h=1, all zeros) did not fail."""
    from autograder.suites.test_w8l4_transformers import MHA_GRAD_SEARCH
    gen = torch.Generator().manual_seed(0)
    d = 2
    case = {"h": 1, "d_k": d, "B": 1, "T_q": 2, "d_model": d, "bias": False, "x_kv": None, "mask": None,
            **{f"W{n}.weight": torch.randint(-1, 2, (d, d), generator=gen).float() for n in "QKVO"},
            "x_q": torch.randint(-2, 3, (1, 2, d), generator=gen).float(),
            "d_out": torch.randint(-2, 3, (1, 2, d), generator=gen).float()}
    right = MHA_GRAD_SEARCH.oracle(case)
    assert compare(MHA_GRAD_SEARCH.outputs, right, right) is None
    wrong = (right[0] + 1, None)
    assert compare(MHA_GRAD_SEARCH.outputs, right, wrong)[0] == "dx_q"
