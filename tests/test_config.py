"""course.yaml: validation names the key and the file; the solutions match the graded API it lists."""
import importlib
import inspect

import pytest

from autograder.course.config import (
    ROOT,
    Bound,
    course_root,
    load_course,
    parse_course,
    released_notebook,
)
from autograder.course.solutions_import import CourseSolutions
from autograder.errors import ConfigError
from autograder.grading.checks import Fail, check_signature

COURSE = load_course()
TEXT = (ROOT / "course.yaml").read_text()


def test_course_yaml_loads_with_the_lectures_assignments_first():
    assert list(COURSE.assignments)[:3] == ["w8l1_attention_vision", "w8l4_transformers", "lab14_transformers"]
    for a in COURSE.assignments.values():  # a fourth (course new) is held to the same, with no edit here
        assert a.total_points > 0 and (ROOT / a.notebook).parent.name == a.id
        assert (ROOT / "solutions" / f"{a.id}.py").is_file()


@pytest.mark.parametrize("bad, key", [
    (TEXT.replace("device: auto", "device: tpu"), "device"),
    (TEXT.replace("  item_seconds: 60", "  item_seconds: -1"), "limits.item_seconds"),
    (TEXT.replace("  output_kb: 64", "  output_kb: 64\n  colour: blue"), "limits.colour"),
    (TEXT.replace("threshold: {test_mse: {max: 0.025}}", "threshold: {test_mse: {}}"),
     "assignments.w8l1_attention_vision.experiments.ae_mnist.threshold.test_mse"),
    (TEXT.replace("item: AutoEncoder", "item: AutoEncoderr"), "assignments.w8l1_attention_vision"),
    (TEXT.replace("points: {exists: 1, shapes: 1, values: 1, gradients: 1}",
                  "points: {exists: 1, shapes: 1, value: 1, gradients: 1}", 1),
     "assignments.w8l1_attention_vision.items.mse_loss.points.value"),
    (TEXT.replace("  upper_fraction: 0.27", "  upper_fraction: 1.5"), "statistics.upper_fraction"),
    (TEXT.replace("    time limit: '\\(time limit\\)'", "    time limit: '(time limit'"),
     "statistics.grader_reasons"),
])
def test_a_wrong_key_or_value_names_the_key_and_the_file(bad, key):
    with pytest.raises(ConfigError) as err:
        parse_course(bad, "/x/course.yaml")
    assert "/x/course.yaml" in str(err.value) and key in str(err.value), str(err.value)


@pytest.mark.parametrize("override, key", [
    ("memory_mb: 0", "assignments.w8l1_attention_vision.items.AutoEncoder.limits.memory_mb"),
    ("item_seconds: -5", "assignments.w8l1_attention_vision.items.AutoEncoder.limits.item_seconds"),
    ("allow_unisolated: true", "assignments.w8l1_attention_vision.items.AutoEncoder.limits.allow_unisolated"),
])
def test_an_items_limits_are_the_courses_limits_with_their_bounds(override, key):
    """An item overrides any of `limits` but allow_unisolated, each within the course-wide field's bounds."""
    item = '        signature: "(k, hidden=256)"\n'
    assert item in TEXT
    with pytest.raises(ConfigError, match=key):
        parse_course(TEXT.replace(item, item + f"        limits: {{{override}}}\n", 1), "/x/course.yaml")
    fine = parse_course(TEXT.replace(item, item + "        limits: {memory_mb: 99, processes: 7}\n", 1), "c.yaml")
    limits = fine.limits_for("w8l1_attention_vision", "AutoEncoder")
    assert (limits.memory_mb, limits.processes, limits.item_seconds) == (99, 7, COURSE.limits.item_seconds)


def test_not_yaml_is_a_clear_error():
    with pytest.raises(ConfigError, match="course.yaml: not valid YAML"):
        parse_course("a: [1, 2", "course.yaml")


def signature_info(obj, methods):
    """What the sandbox reports for an object, computed locally (same format)."""
    def params(f, drop_self):
        ps = list(inspect.signature(f).parameters.values())[(1 if drop_self else 0):]
        return [[p.name, str(p.kind), "" if p.default is p.empty else repr(p.default)] for p in ps]
    if isinstance(obj, type):
        return {"kind": "class", "params": params(obj.__init__, True),
                "methods": {m: params(getattr(obj, m), True) for m in methods if hasattr(obj, m)}}
    return {"kind": "function", "params": params(obj, False)}


ITEMS = [(aid, item) for aid, a in COURSE.assignments.items() for item in a.items]


@pytest.mark.parametrize("aid, item", ITEMS, ids=[f"{a}.{i}" for a, i in ITEMS])
def test_reference_has_every_item_with_the_listed_signature(aid, item):
    module = importlib.import_module(f"solutions.{aid}")
    spec = COURSE.assignment(aid).items[item]
    assert hasattr(module, item), f"solutions.{aid} has no '{item}'"
    obj = getattr(module, item)
    check_signature(item, spec.signature, signature_info(obj, spec.methods), spec.methods)


def test_signature_check_rejects_renamed_and_reordered_parameters():
    def attention(Q, K, V, masks=None):
        pass

    def reordered(K, Q, V, mask=None):
        pass

    def extra_required(Q, K, V, mask=None, scale=None, *, temperature):
        pass
    for fn in (attention, reordered, extra_required):
        with pytest.raises(Fail):
            check_signature("attention", "(Q, K, V, mask=None)", signature_info(fn, {}))

    def extra_optional(Q, K, V, mask=None, dropout=0.0):
        pass
    check_signature("attention", "(Q, K, V, mask=None)", signature_info(extra_optional, {}))


# --- experiment thresholds: the judgement that decides an experiment's points --------------------------

def experiment(threshold):
    return parse_course(TEXT, "course.yaml").assignment("w8l1_attention_vision").experiments["ae_mnist"] \
        .model_copy(update={"threshold": {k: Bound(**b) for k, b in threshold.items()}})


@pytest.mark.parametrize("bound, value, holds", [
    ({"min": 0.9}, 0.95, True), ({"min": 0.9}, 0.9, True), ({"min": 0.9}, 0.8999, False),
    ({"max": 0.025}, 0.02, True), ({"max": 0.025}, 0.025, True), ({"max": 0.025}, 0.0251, False),
    ({"min": 0.1, "max": 0.2}, 0.15, True), ({"min": 0.1, "max": 0.2}, 0.1, True),
    ({"min": 0.1, "max": 0.2}, 0.2, True),
    ({"min": 0.1, "max": 0.2}, 0.05, False), ({"min": 0.1, "max": 0.2}, 0.25, False),
    ({"min": 0.9}, float("nan"), False), ({"max": 0.025}, float("nan"), False),
    ({"min": 0.9}, float("inf"), True), ({"max": 0.025}, float("inf"), False), ({"min": 0.9}, -float("inf"), False),
])
def test_a_bound_holds_on_its_side_only_and_never_for_nan(bound, value, holds):
    assert Bound(**bound).holds(value) is holds
    failures = experiment({"acc": bound}).failures({"acc": value})
    if holds:
        assert failures == []
    else:  # the sentence names the metric, the measured value and the bound
        assert len(failures) == 1 and failures[0].startswith(f"acc = {value:.4g}, needs ")
        assert str(Bound(**bound)) in failures[0]


def test_every_threshold_is_judged_and_a_missing_metric_fails():
    exp = experiment({"a": {"min": 0.5}, "b": {"max": 0.1}})
    assert exp.failures({"a": 0.6, "b": 0.05}) == []
    assert exp.failures({"a": 0.6, "b": 0.05, "extra": 99.0}) == []   # figures without a bound are only shown
    assert exp.failures({"a": 0.4, "b": 0.05}) == ["a = 0.4, needs >= 0.5"]
    assert exp.failures({"a": 0.6, "b": 0.2}) == ["b = 0.2, needs <= 0.1"]
    assert exp.failures({"a": 0.4, "b": 0.2}) == ["a = 0.4, needs >= 0.5", "b = 0.2, needs <= 0.1"]
    assert exp.failures({"a": 0.6}) == ["metric 'b' was not measured"]
    assert exp.failures({}) == ["metric 'a' was not measured", "metric 'b' was not measured"]


def test_the_configured_thresholds_fail_just_outside_and_pass_on_the_bound():
    for a in COURSE.assignments.values():
        for exp in a.experiments.values():
            on = {k: (b.min if b.min is not None else b.max) for k, b in exp.threshold.items()}
            assert exp.failures(on) == [], exp.name
            for key, b in exp.threshold.items():
                outside = b.min - 1e-6 if b.min is not None else b.max + 1e-6
                assert len(exp.failures({**on, key: outside})) == 1, (exp.name, key)


# --- where the course is: course_root() ----------------------------------------------------------------

def test_the_course_root_is_course_root_env_else_the_nearest_course_yaml_above_the_working_folder(tmp_path,
                                                                                                  monkeypatch):
    (tmp_path / "course.yaml").write_text(TEXT)
    (tmp_path / "section" / "alice").mkdir(parents=True)
    monkeypatch.delenv("COURSE_ROOT", raising=False)
    monkeypatch.chdir(tmp_path / "section" / "alice")
    assert course_root() == tmp_path.resolve()
    monkeypatch.setenv("COURSE_ROOT", str(ROOT))
    assert course_root() == ROOT
    monkeypatch.setenv("COURSE_ROOT", str(tmp_path / "section"))
    with pytest.raises(ConfigError, match="no course.yaml there"):
        course_root()


def test_a_missing_release_names_its_path_and_the_command_that_makes_it(tmp_path, monkeypatch):
    (tmp_path / "course.yaml").write_text(TEXT)
    monkeypatch.setenv("COURSE_ROOT", str(tmp_path))
    with pytest.raises(ConfigError) as e:
        released_notebook("lab14_transformers")
    assert str(tmp_path / "release" / "lab14_transformers" / "lab14_transformers.ipynb") in str(e.value)
    assert "course release lab14_transformers" in str(e.value)


def test_solutions_are_the_course_roots_when_it_has_them_else_the_installed_package(tmp_path, monkeypatch):
    (tmp_path / "course.yaml").write_text(TEXT)
    monkeypatch.setenv("COURSE_ROOT", str(tmp_path))
    assert CourseSolutions().find_spec("solutions") is None  # no solutions/ there: the package's are imported
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "__init__.py").write_text("")
    spec = CourseSolutions().find_spec("solutions")
    assert spec.origin == str(tmp_path / "solutions" / "__init__.py")
    assert list(spec.submodule_search_locations) == [str(tmp_path / "solutions")]
    assert CourseSolutions().find_spec("solutions_extra") is None and CourseSolutions().find_spec("autograder") is None


def test_the_type_checkers_limit_overrides_are_limits_fields():
    """config.py spells LimitOverrides' fields out for the type checker (the runtime model is built from Limits):
    the two lists cannot drift."""
    import ast

    from autograder.course import config
    with open(config.__file__) as source:
        tree = ast.parse(source.read())
    spelled = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "LimitOverrides")
    fields = {s.target.id: ast.unparse(s.annotation) for s in spelled.body if isinstance(s, ast.AnnAssign)}
    expected = {name: f"{f.annotation.__name__} | None" for name, f in config.Limits.model_fields.items()
                if name not in config.COURSE_WIDE}
    assert fields == expected
    assert set(config.LimitOverrides.model_fields) == set(expected)


def test_a_profile_changes_every_experiment_before_validation_and_an_unknown_one_is_named(monkeypatch):
    """COURSE_PROFILE=rehearsal: each experiment trains course.yaml's profile steps on its first seed, its bounds met
    by any figure but kept on their side; the figures of the course stay as they are without it."""
    from autograder.batch.identity import grader_parts
    plain = COURSE.assignment("w8l4_transformers").experiments["reverse_transformer"]
    parts = grader_parts("lab14_transformers", "cpu")
    monkeypatch.setenv("COURSE_PROFILE", "rehearsal")
    rehearsed = load_course()
    rehearsed_parts = grader_parts("lab14_transformers", "cpu")  # a rehearsed result is never another grading's
    assert {name for name in parts if parts[name] != rehearsed_parts[name]} == {"assignment"}
    for aid, assignment in rehearsed.assignments.items():
        for name, exp in assignment.experiments.items():
            before = COURSE.assignment(aid).experiments[name]
            assert (exp.steps, exp.seeds) == (5, before.seeds[:1]), (aid, name)
            assert set(exp.threshold) == set(before.threshold)
            for metric, bound in exp.threshold.items():
                assert (bound.min is None) == (before.threshold[metric].min is None), (aid, name, metric, bound)
                assert all(bound.holds(figure) for figure in (-1e3, 0.0, 0.5, 1e3)), (aid, name, metric, bound)
    assert plain.steps == 1000 and len(plain.seeds) > 1  # the course's own, read without the profile
    monkeypatch.setenv("COURSE_PROFILE", "nope")
    with pytest.raises(ConfigError, match="COURSE_PROFILE=nope: no such profile .*rehearsal"):
        load_course()
    monkeypatch.delenv("COURSE_PROFILE")
    assert load_course().assignment("w8l4_transformers").experiments["reverse_transformer"].steps == 1000
