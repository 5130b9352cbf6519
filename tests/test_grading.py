"""Meta-tests of the grader: the solution scores 100%, the stubs 0, planted mistakes lose points where they are."""
import nbformat
import pytest
import yaml

from autograder.course.config import load_course
from autograder.grading.grade import grade_notebook
from autograder.grading.planted import item_rules, uncaught_checks, unisolated_checks, untrained_experiments
from autograder.notebooks.build import item_cell
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from tests.planted import dependents, planted, planted_module, rounds, scores, variant_source

pytestmark = pytest.mark.grading
COURSE = load_course()
AIDS = list(COURSE.assignments)


def write(nb, path):
    nbformat.write(nb, path)
    return path


@pytest.mark.parametrize("aid", AIDS)
def test_the_reference_solution_scores_full_marks(graded_solutions, aid):
    result = graded_solutions[aid]
    lost = [f"{t['name']}: {t['output']}" for t in result["tests"] if t["score"] < t["max_score"]]
    assert not lost, "\n".join(lost)
    assert result["max_score"] == COURSE.assignment(aid).total_points
    assert result["score"] == result["max_score"]
    # the fake GPU judged every item it ran (an item it cannot judge says so in course.yaml: device_check: false)
    from autograder.grading.device_check import NO_VERDICT
    assert not [n for n in result["extra_data"]["notes"] if n.startswith(NO_VERDICT)], result["extra_data"]["notes"]


@pytest.mark.parametrize("aid", AIDS)
def test_the_untouched_release_scores_zero_with_a_reason_per_item(tmp_path, aid):
    result = grade_notebook(write(release_notebook(aid), tmp_path / f"{aid}.ipynb"), aid, device="cpu")
    assert result["score"] == 0
    assert result["max_score"] == COURSE.assignment(aid).total_points
    for t in result["tests"]:
        assert "not implemented" in t["output"] or "not run" in t["output"], t


@pytest.mark.parametrize("aid", AIDS)
def test_every_item_has_planted_mistakes_and_a_correct_alternative(aid):
    """The rules of a planted file are `course check --planted`'s (grading/planted.py RULES), in its words."""
    module = planted_module(aid)
    assert module is not None, f"tests/planted/{aid}.py is missing (`course new` writes one)"
    assert item_rules(aid, module) == []


@pytest.mark.parametrize("aid", AIDS)
def test_every_check_must_catch_some_planted_mistake(aid):
    """The planted rounds assert each mistake's exact catch set, so a check named in one cannot become a no-op
    unnoticed; a check named in none could."""
    assert uncaught_checks(aid, planted_module(aid)) == []


@pytest.mark.parametrize("aid", AIDS)
def test_every_check_is_the_only_one_to_catch_some_planted_mistake(aid):
    """A check that became a no-op would go unnoticed if the mistakes it catches were all caught elsewhere too."""
    assert unisolated_checks(aid, planted_module(aid)) == []


@pytest.mark.parametrize("aid", AIDS)
def test_correct_alternatives_keep_full_marks(tmp_path, aid):
    """All alternatives at once: correct code composes, so every item must still score in full."""
    sources = solved_sources(aid)
    for item, spec in planted(aid).items():
        name, variant = next(iter(spec["right"].items()))
        sources[item] = variant_source(aid, item, variant)
    nb = with_cells(release_notebook(aid), sources)
    result = grade_notebook(write(nb, tmp_path / f"{aid}.ipynb"), aid, device="cpu", experiments=False)
    lost = [f"{t['name']}: {t['output']}" for t in result["tests"] if t["score"] < t["max_score"]]
    assert not lost, "\n".join(lost)


ROUNDS = [(aid, k) for aid in AIDS for k in range(len(rounds(aid)))]


@pytest.mark.parametrize("aid, k", ROUNDS, ids=[f"{a}-round{k}" for a, k in ROUNDS])
def test_planted_mistakes_lose_points_on_their_item_only(tmp_path, aid, k):
    """Each planted mistake fails exactly the checks it names, each with a message naming the case; items it
    does not feed keep their points."""
    batch = rounds(aid)[k]
    deps = dependents(aid)
    sources = solved_sources(aid)
    for item, _name, variant in batch:
        sources[item] = variant_source(aid, item, variant)
    nb = with_cells(release_notebook(aid), sources)
    result = grade_notebook(write(nb, tmp_path / f"{aid}.ipynb"), aid, device="cpu", experiments=False)
    got = scores(result)
    reach = set().union(*({i} | deps[i] for i, _, _ in batch))
    report = []
    for item, name, _ in batch:
        score, max_score = got[item]
        failing = [t for t in result["tests"] if t["item"] == item and t["score"] < t["max_score"]]
        report.append(f"{item}/{name}: {score}/{max_score} " + " | ".join(t["output"][:160] for t in failing))
        assert score < max_score, f"planted mistake {item}/{name} kept full marks"
        caught = {t["name"].split(": ", 1)[1] for t in failing}
        assert caught == set(planted(aid)[item]["catches"][name]), \
            f"planted mistake {item}/{name} was caught by {sorted(caught)}: " + " | ".join(t["output"] for t in failing)
        for t in failing:
            case = t.get("extra_data", {}).get("case")
            assert case and case in t["output"], f"{item}/{name}: the reason names no case: {t['output']}"
    untouched = {i: s for i, s in got.items() if i not in reach and s[0] < s[1]}
    assert not untouched, f"items with no planted mistake lost points: {untouched}"
    print("\n" + "\n".join(report))


# --- experiments: planted code that passes its checks but cannot learn ---------------------------------

SHORT_STEPS = 20  # the planted models below cannot learn at any budget; a short run keeps CI fast
TRAINING = [(aid, name) for aid in AIDS for name in getattr(planted_module(aid), "TRAINING", {})]


def short_course(folder, aid, experiments):
    """course.yaml with these experiments cut to SHORT_STEPS on their first seed (a file COURSE_CONFIG names)."""
    raw = yaml.safe_load(COURSE.path.read_text())
    raw["data"]["mnist_dir"] = str(COURSE.mnist_dir)
    for name in experiments:
        exp = raw["assignments"][aid]["experiments"][name]
        exp["steps"], exp["seeds"] = SHORT_STEPS, exp["seeds"][:1]
    path = folder / "course.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("aid", AIDS)
def test_every_graded_experiment_has_a_planted_training_failure(aid):
    assert untrained_experiments(aid, planted_module(aid)) == []


@pytest.mark.parametrize("aid, name", TRAINING, ids=[f"{a}-{n}" for a, n in TRAINING])
def test_a_model_that_passes_its_checks_but_cannot_learn_loses_exactly_its_experiments(tmp_path, monkeypatch,
                                                                                      aid, name):
    """Every check passes; each experiment it trains fails, and says the measured figure and the bound."""
    spec = planted_module(aid).TRAINING[name]
    monkeypatch.setenv("COURSE_CONFIG", str(short_course(tmp_path, aid, spec["fails"])))
    monkeypatch.setenv("COURSE_NO_CACHE", "1")  # train now: a cached result would not test the training path
    sources = solved_sources(aid)
    sources[spec["item"]] = variant_source(aid, spec["item"], spec["variant"])
    nb = with_cells(release_notebook(aid), sources)
    items = [spec["item"], *spec.get("also", [])]
    result = grade_notebook(write(nb, tmp_path / f"{aid}.ipynb"), aid, items=items, device="cpu")
    lost = {t["name"]: t for t in result["tests"] if t["score"] < t["max_score"]}
    experiments = COURSE.assignment(aid).experiments
    assert set(lost) == {f"{experiments[e].item}: experiment {e}" for e in spec["fails"]}, \
        "\n".join(f"{n}: {t['output']}" for n, t in lost.items())
    for t in lost.values():
        exp = experiments[t["extra_data"]["experiment"]]
        metrics = t["extra_data"]["metrics"]
        misses = exp.failures(metrics)
        assert t["score"] == 0 and metrics and misses, t["output"]
        assert all(m in t["output"] for m in misses), t["output"]  # "acc = 0.51, needs >= 0.9": figure and bound
    print("\n" + "\n".join(f"{n}: {t['output']}" for n, t in lost.items()))


# --- fair partial credit -------------------------------------------------------------------------

def grade_one(tmp_path, aid, item, source):
    """The solution notebook with one item's cell replaced, graded on that item alone (no experiments)."""
    sources = solved_sources(aid)
    sources[item] = source
    path = write(with_cells(release_notebook(aid), sources), tmp_path / f"{aid}.ipynb")
    result = grade_notebook(path, aid, items=[item], device="cpu", experiments=False)
    return result["tests"], scores(result)[item]


@pytest.mark.parametrize("call", ["mha(x, x, x, need_weights=True, average_attn_weights=False)",
                                  "mha(x, x, x)"])  # the second also gets the weights' shape wrong
def test_calling_the_oracle_in_a_from_scratch_item_zeroes_the_whole_item_with_that_reason(tmp_path, call):
    source = f'def manual_multihead(x, mha):\n    """Borrowed."""\n    return {call}\n'
    tests, (score, max_score) = grade_one(tmp_path, "lab14_transformers", "manual_multihead", source)
    assert score == 0 and max_score == 4
    for t in tests:
        assert "multi_head_attention_forward" in t["output"] and "from scratch" in t["output"], t


LECTURE_PE = planted("w8l4_transformers")["positional_encoding"]["wrong"]["lecture_even_d_emb_only"]


def test_the_lectures_positional_encoding_loses_only_the_odd_d_emb_point(tmp_path):
    tests, (score, max_score) = grade_one(tmp_path, "w8l4_transformers", "positional_encoding", LECTURE_PE)
    assert (score, max_score) == (3, 4)
    failed = [t for t in tests if t["score"] < t["max_score"]]
    assert [t["name"] for t in failed] == ["positional_encoding: properties"]
    assert "odd d_emb" in failed[0]["output"], failed[0]["output"]


@pytest.mark.parametrize("aid, item", [("lab14_transformers", "scaled_dot_product_attention"),
                                       ("w8l4_transformers", "attention")])
def test_a_missing_scale_is_named_in_the_hidden_message(tmp_path, aid, item):
    from autograder.notebooks.public_checks import SCALE_MISSING
    reference = item_cell(aid, item, solved=True)
    assert "/ math.sqrt(d_k)" in reference
    tests, (score, max_score) = grade_one(tmp_path, aid, item, reference.replace("/ math.sqrt(d_k)", "", 1))
    values = next(t for t in tests if t["name"] == f"{item}: values")
    assert values["score"] == 0 and SCALE_MISSING in values["output"], values["output"]
