"""course.yaml: validation names the key and the file; the solutions match the graded API it lists."""
import importlib
import inspect

import pytest

from autograder.checks import Fail, check_signature
from autograder.config import ConfigError, load_course, parse_course, ROOT

COURSE = load_course()
TEXT = (ROOT / "course.yaml").read_text()


def test_course_yaml_loads_with_three_assignments():
    assert list(COURSE.assignments) == ["w8l1_attention_vision", "w8l4_transformers", "lab14_transformers"]
    for a in COURSE.assignments.values():
        assert a.total_points > 0 and (ROOT / a.notebook).parent.name == a.id


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
])
def test_a_wrong_key_or_value_names_the_key_and_the_file(bad, key):
    with pytest.raises(ConfigError) as err:
        parse_course(bad, "/x/course.yaml")
    assert "/x/course.yaml" in str(err.value) and key in str(err.value), str(err.value)


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
