"""A mistake costs points once (course.yaml `dependencies`): the graph, the reference standing in, and what a
submission scores with a mistake planted at the base of the longest chains, under `independent` and `cascade`."""
import ast
import inspect
import json

import nbformat
import pytest
import yaml

from autograder.course.config import load_course, parse_course
from autograder.errors import ConfigError
from autograder.grading.dependencies import closure, experiment_uses, reference_source, standin_cell, uses
from autograder.grading.experiments import harness
from autograder.grading.grade import grade_notebook
from autograder.grading.suite_files import suite_checks
from autograder.notebooks.cells import names_used
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from tests.planted import dependents, planted, scores, variant_source

COURSE = load_course()
TEXT = COURSE.path.read_text()
AIDS = list(COURSE.assignments)

# The graph as the reference code has it today: a change to a solution that adds or drops a call shows here first.
GRAPH = {
    "w8l1_attention_vision": {"train_linear_ae": {"LinearAE"},
                              "spatial_attention": {"score_general", "attention_context"}},
    "w8l4_transformers": {"MultiHeadAttention": {"attention"}, "EncoderLayer": {"MultiHeadAttention", "FeedForward"},
                          "DecoderLayer": {"MultiHeadAttention", "FeedForward", "causal_mask"},
                          "Transformer": {"EncoderLayer", "DecoderLayer", "positional_encoding", "causal_mask"},
                          "greedy_decode": {"Transformer"}},
    "lab14_transformers": {"manual_multihead": {"scaled_dot_product_attention"},
                           "TransformerClassifier": {"EncoderBlock", "PositionalEncoding"}},
}


# --- course.yaml ---------------------------------------------------------------------------------

@pytest.mark.parametrize("old, new, key", [
    ("dependencies: independent\n\n", "dependencies: sometimes\n\n", "dependencies"),
    ("    title: \"Self-attention and transformers\"\n",
     "    title: \"Self-attention and transformers\"\n    dependencies: both\n",
     "assignments.w8l4_transformers.dependencies"),
    ("        checked_with: [Transformer]", "        checked_with: [Transformerr]", "checked_with"),
    ("        checked_with: [Transformer]", "        checked_with: [greedy_decode]", "checked_with"),
])
def test_dependencies_and_checked_with_are_validated(old, new, key):
    assert old in TEXT
    with pytest.raises(ConfigError, match=key) as err:
        parse_course(TEXT.replace(old, new, 1), "/x/course.yaml")
    assert "/x/course.yaml" in str(err.value)


def test_an_experiment_then_its_assignment_then_the_course_decide():
    assert COURSE.dependencies == "independent"
    text = TEXT.replace("    title: \"Self-attention and transformers\"\n",
                        "    title: \"Self-attention and transformers\"\n    dependencies: cascade\n", 1)
    course = parse_course(text, "c.yaml")
    assert course.dependencies_for("w8l4_transformers") == "cascade"
    assert course.dependencies_for("lab14_transformers") == "independent"
    # the experiments say `independent` themselves in course.yaml
    assert course.dependencies_for("w8l4_transformers", "no_causal_mask") == "independent"
    for aid, a in COURSE.assignments.items():
        for name, exp in a.experiments.items():
            assert exp.dependencies or not exp.graded, f"{aid}.{name}: course.yaml must say its policy"


# --- the graph -----------------------------------------------------------------------------------

@pytest.mark.parametrize("aid", AIDS)
def test_the_graph_is_the_reference_codes_and_points_back_in_course_order(aid):
    assignment = COURSE.assignment(aid)
    graph = uses(aid, assignment)
    if aid in GRAPH:  # pinned for the lectures' assignments; a new one (course new) is held to the order alone
        assert {i: used for i, used in graph.items() if used} == GRAPH[aid]
    order = list(assignment.items)
    for item, used in graph.items():  # a regrade needs the items it may swap graded first
        assert all(order.index(u) < order.index(item) for u in used), (item, used)


def suite_code(module, name):
    """The syntax trees of a suite's test function and of the suite's own functions it reaches."""
    trees, todo = {}, [name]
    while todo:
        fn = todo.pop()
        if fn in trees or not inspect.isfunction(getattr(module, fn, None)) or \
                getattr(module, fn).__module__ != module.__name__:
            continue
        trees[fn] = ast.parse(inspect.getsource(getattr(module, fn)).lstrip())
        todo += [n.id for n in ast.walk(trees[fn]) if isinstance(n, ast.Name)]
    return list(trees.values())


def items_named(trees, items):
    """The items a suite's code asks the student's process for by name: student.new("Transformer"), .call(...)."""
    return {n.args[0].value for tree in trees for n in ast.walk(tree) if isinstance(n, ast.Call) and n.args
            and isinstance(n.args[0], ast.Constant) and n.args[0].value in items}


@pytest.mark.parametrize("aid", AIDS)
def test_every_item_a_suite_hands_the_students_code_of_is_in_the_graph(aid):
    """A check that builds or calls another item of the student's (student.new("Transformer")) depends on it: the
    graph must say so (the reference code, or `checked_with`), or a mistake there would cost this item too; and
    `checked_with` says nothing the suite does not do."""
    assignment = COURSE.assignment(aid)
    graph = uses(aid, assignment)
    module, checks = suite_checks(aid)
    named = {}
    for (item, _), names in checks.items():
        for name in names:
            named.setdefault(item, set()).update(items_named(suite_code(module, name), assignment.items) - {item})
    for item, spec in assignment.items.items():
        assert named.get(item, set()) <= graph[item], f"{aid}.{item}'s checks use {sorted(named[item] - graph[item])}"
        assert set(spec.checked_with) <= named.get(item, set()), f"{aid}.{item}: checked_with, but no check uses it"


@pytest.mark.parametrize("aid", AIDS)
def test_an_experiment_may_swap_what_its_training_runs_but_never_its_own_item(aid):
    assignment = COURSE.assignment(aid)
    graph = uses(aid, assignment)
    for name, exp in assignment.experiments.items():
        if not exp.graded:
            continue
        swappable = experiment_uses(aid, assignment, exp, graph, harness(aid))
        assert exp.item not in swappable
        parts = set(harness(aid).EXPERIMENTS[name]["parts"])
        assert swappable == (parts | closure(graph, parts)) - {exp.item}
    w8l4 = COURSE.assignment("w8l4_transformers")
    assert experiment_uses("w8l4_transformers", w8l4, w8l4.experiments["reverse_transformer"], uses(
        "w8l4_transformers", w8l4), harness("w8l4_transformers")) == {
        "attention", "MultiHeadAttention", "FeedForward", "EncoderLayer", "DecoderLayer", "positional_encoding",
        "causal_mask", "greedy_decode"}


def test_the_standin_holds_the_swapped_items_and_what_they_need_only():
    alone = reference_source("w8l4_transformers", ["attention"])
    assert "def attention(" in alone and "class MultiHeadAttention" not in alone
    mha = reference_source("w8l4_transformers", ["MultiHeadAttention"])
    assert "def attention(" in mha and "class EncoderLayer" not in mha  # its own call of attention is the reference's
    decode = reference_source("w8l4_transformers", ["greedy_decode"])
    assert "BOS, EOS, PAD = 10, 11, 12" in decode and "class Transformer" not in decode
    cell = standin_cell("w8l4_transformers", {"attention"}, 0)
    bound = [t.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign) for t in node.targets
             if isinstance(t, ast.Name)]
    assert bound == ["__course_reference", "attention"]  # only the swapped name changes in the student's namespace


@pytest.mark.parametrize("aid", AIDS)
def test_a_standin_calls_no_oracle_its_dependent_is_watched_for(aid):
    """A swapped-in reference runs inside the dependent's checks, where its from-scratch oracles are watched."""
    assignment = COURSE.assignment(aid)
    for item, used in uses(aid, assignment).items():
        oracles = COURSE.oracles_for(aid)
        watched = {p.rsplit(".", 1)[-1] for n in assignment.items[item].from_scratch for p in oracles[n]}
        for u in used:
            assert not (names_used(reference_source(aid, [u])) & watched), (item, u)


# --- grading with planted mistakes ---------------------------------------------------------------

def course_file(folder, dependencies):
    """course.yaml with `dependencies` set course-wide and on every experiment (a file COURSE_CONFIG names)."""
    raw = yaml.safe_load(TEXT)
    raw["data"]["mnist_dir"] = str(COURSE.mnist_dir)
    raw["dependencies"] = dependencies
    for a in raw["assignments"].values():
        for exp in a.get("experiments", {}).values():
            exp["dependencies"] = dependencies
    path = folder / "course.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def grade(tmp_path, aid, sources, items, experiments=False, stubs=()):
    """The solution with `sources` replacing some items' cells and `stubs` left as released; graded on `items`."""
    solved = {i: s for i, s in solved_sources(aid).items() if i not in stubs}
    nb = with_cells(release_notebook(aid), {**solved, **sources})
    path = tmp_path / f"{aid}.ipynb"
    nbformat.write(nb, path)
    return grade_notebook(path, aid, items=items, device="cpu", experiments=experiments)


def lost(result):
    return {t["name"]: t["max_score"] - t["score"] for t in result["tests"] if t["score"] < t["max_score"]}


def note_of(name):
    return f"graded with the reference `{name}`, since yours failed its checks (see that item)"


PLANTS = [("w8l4_transformers", "attention", "no_sqrt_scale"),
          ("w8l4_transformers", "MultiHeadAttention", "split_without_transpose"),
          ("lab14_transformers", "scaled_dot_product_attention", "no_sqrt_scale"),
          ("lab14_transformers", "EncoderBlock", "post_norm"),
          ("w8l1_attention_vision", "attention_context", "softmax_over_the_batch"),
          ("w8l1_attention_vision", "score_general", "W_a_transposed")]


@pytest.mark.grading
@pytest.mark.parametrize("aid, item, mistake", PLANTS, ids=[f"{i}-{m}" for _, i, m in PLANTS])
def test_a_mistake_at_the_base_of_a_chain_costs_its_own_items_points_only(tmp_path, monkeypatch, aid, item, mistake):
    """Graded on the item and every item built on it: only the item's own checks lose points, each item built on
    it says once per check that it was graded with the reference; under cascade they lose points as before."""
    source = variant_source(aid, item, planted(aid)[item]["wrong"][mistake])
    items = [i for i in COURSE.assignment(aid).items if i == item or i in dependents(aid)[item]]
    result = grade(tmp_path, aid, {item: source}, items)
    own = {f"{item}: {k}" for k in planted(aid)[item]["catches"][mistake]}
    assert set(lost(result)) == own, json.dumps(lost(result))
    assert sum(lost(result).values()) == sum(COURSE.assignment(aid).items[item].points[k.split(": ")[1]] for k in own)
    for t in result["tests"]:
        if t["item"] == item:
            assert "graded with the reference" not in t["output"], t
        else:
            assert note_of(item) in t["output"].splitlines()[-1] or "graded with the reference" not in t["output"], t
    regraded = {t["item"] for t in result["tests"] if "regraded_with" in t.get("extra_data", {})}
    assert regraded and regraded <= dependents(aid)[item]
    assert sum(t["extra_data"]["restored"] for t in result["tests"] if t["item"] in regraded) > 0

    monkeypatch.setenv("COURSE_CONFIG", str(course_file(tmp_path, "cascade")))
    cascade = grade(tmp_path, aid, {item: source}, items)
    assert set(lost(cascade)) > own  # today's: the items built on it lose points too
    assert not any("regraded_with" in t.get("extra_data", {}) or "graded with the reference" in t["output"]
                   for t in cascade["tests"])
    print(f"\n{aid} {item}/{mistake}: independent {result['score']:g}/{result['max_score']:g}, "
          f"cascade {cascade['score']:g}/{cascade['max_score']:g}")


LAB = "lab14_transformers"
SDPA, MMH = "scaled_dot_product_attention", "manual_multihead"


@pytest.mark.grading
def test_a_stub_it_calls_is_the_stubs_never_the_callers(tmp_path, monkeypatch):
    """The stub's NotImplementedError, raised inside the dependency, is reported as the dependency's: the caller
    is regraded (independent), or zeroed saying whose stub it met (cascade), never 'not implemented' itself."""
    result = grade(tmp_path, LAB, {}, [SDPA, MMH], stubs=[SDPA])
    got = scores(result)
    assert got[SDPA] == (0, 5) and got[MMH] == (4, 4)
    assert all(note_of(SDPA) in t["output"] for t in result["tests"] if t["item"] == MMH)

    # its own mistake as well: the regrade fails on values too, with the first run's message, whose it is
    wrong = variant_source(LAB, MMH, planted(LAB)[MMH]["wrong"]["no_out_proj"])
    both = grade(tmp_path, LAB, {MMH: wrong}, [SDPA, MMH], stubs=[SDPA])
    values = next(t for t in both["tests"] if t["name"] == f"{MMH}: values")
    assert scores(both)[MMH] == (2, 4) and values["score"] == 0
    assert f"the error is in '{SDPA}', which '{MMH}' calls" in values["output"], values["output"]
    assert "with the reference in place as well" in values["output"] and note_of(SDPA) in values["output"]
    assert not any("'manual_multihead' is not implemented" in t["output"] for t in both["tests"])

    # graded alone, nothing can stand in for the stub it met: 0, saying whose stub it is
    alone = grade(tmp_path, LAB, {}, [MMH], stubs=[SDPA])
    assert scores(alone)[MMH] == (0, 4)
    assert all(f"'{MMH}' calls '{SDPA}', which is not implemented yet" in t["output"] for t in alone["tests"])

    monkeypatch.setenv("COURSE_CONFIG", str(course_file(tmp_path, "cascade")))
    cascade = grade(tmp_path, LAB, {}, [SDPA, MMH], stubs=[SDPA])
    assert scores(cascade)[MMH] == (0, 4)  # today's score, with the right reason
    for t in (t for t in cascade["tests"] if t["item"] == MMH):
        assert f"'{MMH}' calls '{SDPA}', which is not implemented yet" in t["output"], t["output"]


# --- a cheat cannot gain from a swap ---------------------------------------------------------------

W8 = "w8l4_transformers"
REFERENCE_DOCSTRING = "Z = softmax(Q K^T / sqrt(d_k)) V over (..., T, d_k); mask is bool with True = blocked."
CHEAT = {
    # broken on purpose: the helper whose reference the cheat hopes to be handed
    "causal_mask": 'def causal_mask(T, device=None):\n    """Broken on purpose."""\n    raise ValueError("no")\n',
    # tries to reach the reference attention through the broken helper's swapped-in reference
    "attention": '''def attention(Q, K, V, mask=None):
    """Whatever the helper's reference can reach."""
    helper = globals().get("causal_mask")
    found = getattr(helper, "__globals__", {}).get("attention")
    if found is not None and found is not attention:
        return found(Q, K, V, mask)
    causal_mask(Q.shape[-2])
''',
    # breaks nothing of its own; while regraded next to the reference attention, leaks it out and stashes it
    "MultiHeadAttention": None,
    # a later item that scores only if the stash survived the regrade
    "mha_cost": '''def mha_cost(d_model, h, d_k, T):
    """Right only with the stash."""
    import torch
    if getattr(torch, "_stashed_reference", None) is None:
        return 0, 0
    return 3 * d_model * h * d_k + h * d_k * d_model, h * T * T * d_k
''',
}
LEAK = '''
import sys as _sys, torch as _torch
_reference = globals()["attention"]
if getattr(_reference, "__module__", "") == "reference":
    _torch._stashed_reference = _reference
    print(_reference.__doc__)
    print(_reference.__doc__, file=_sys.stderr)
'''


@pytest.mark.grading
def test_a_cheat_that_breaks_a_helper_to_get_the_reference_gains_nothing(tmp_path):
    mha = solved_sources(W8, ["MultiHeadAttention"])["MultiHeadAttention"]
    init = '        super().__init__()\n'
    assert init in mha
    sources = {**CHEAT, "MultiHeadAttention": mha.replace(init, init + "".join(
        "        " + line + "\n" for line in LEAK.strip().splitlines()), 1)}
    result = grade(tmp_path, W8, sources, ["attention", "MultiHeadAttention", "causal_mask", "mha_cost"])
    got = scores(result)
    assert got["attention"] == (1, 6)  # no edge from attention to causal_mask: never regraded, only `exists` left
    assert got["mha_cost"] == (1, 2)   # the stash died with the regrade's own sandbox
    assert got["MultiHeadAttention"] == (5, 5)  # its own code is right: the legitimate regrade
    assert got["causal_mask"][0] == 1
    assert REFERENCE_DOCSTRING not in json.dumps(result)  # nothing printed or raised next to the reference got out
    assert not any("reference" in t["output"] for t in result["tests"] if t["item"] != "MultiHeadAttention")


# --- experiments ---------------------------------------------------------------------------------------

@pytest.mark.grading
@pytest.mark.experiment
@pytest.mark.slow
def test_an_experiment_trains_with_the_reference_of_a_part_that_failed_its_checks(tmp_path, monkeypatch):
    """EncoderBlock left as the stub: the classifier's checks and its memory-task training are graded with the
    reference block; the student's classifier is what trains. Under the rehearsal profile (5 steps, any figure
    meets the bounds): what is tested is which block trains, not the figure; a training that met the stub
    would raise NotImplementedError and score 0 at any budget."""
    monkeypatch.setenv("COURSE_NO_CACHE", "1")
    monkeypatch.setenv("COURSE_PROFILE", "rehearsal")
    result = grade(tmp_path, LAB, {}, ["EncoderBlock", "TransformerClassifier"], experiments=True,
                   stubs=["EncoderBlock"])
    got = scores(result)
    assert got["EncoderBlock"][0] == 0 and got["TransformerClassifier"] == (7, 7), json.dumps(result["tests"])
    exp = next(t for t in result["tests"] if t["name"] == "TransformerClassifier: experiment memory_task")
    assert note_of("EncoderBlock") in exp["output"] and exp["extra_data"]["restored"] == 4
    assert [run["steps"] for run in exp["extra_data"]["trained"]] == [5], exp["extra_data"]  # the profile held


@pytest.mark.grading
def test_a_dependency_graded_in_an_earlier_session_of_the_budget_still_has_its_reference_stand_in(tmp_path):
    """Gradescope's path grades in several sessions when the worst cases do not fit one (grade_within_budget): the
    manual_multihead of a notebook whose attention lacks its scale is graded in a second session, and regraded."""
    from autograder.integrations.otter_plugin import grade_within_budget, load_seconds, worst_seconds
    limits = {"item_seconds": 100}
    nb = with_cells(release_notebook(LAB), {**solved_sources(LAB), SDPA: variant_source(
        LAB, SDPA, planted(LAB)[SDPA]["wrong"]["no_sqrt_scale"])})
    path = tmp_path / f"{LAB}.ipynb"
    nbformat.write(nb, path)
    assert worst_seconds(COURSE, LAB, SDPA, limits, experiments=False) == 100
    budget = load_seconds(COURSE, LAB, limits) + 199  # the first session fits attention only
    result = grade_within_budget(path, LAB, budget, device="cpu", limits=limits, experiments=False)
    assert result["extra_data"]["sessions"] >= 2
    got = scores(result)
    sdpa = COURSE.assignment(LAB).items[SDPA].points  # the missing scale loses values and gradients, as weighed there
    lost = sdpa["values"] + sdpa["gradients"]
    assert got[SDPA] == (sum(sdpa.values()) - lost, sum(sdpa.values())) and got[MMH] == (4, 4), \
        json.dumps(result["tests"])
    assert all(note_of(SDPA) in t["output"] for t in result["tests"] if t["item"] == MMH)


def test_the_note_names_the_reference_in_one_line():
    from autograder.grading.dependencies import note
    assert note({"scaled_dot_product_attention"}) == note_of("scaled_dot_product_attention")
    assert note({"b", "a"}) == ("graded with the reference `a` and `b`, since yours failed their checks "
                                "(see those items)")
