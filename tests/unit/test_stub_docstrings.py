"""The stubs' docstrings (written into the notebooks by `course sync` from solutions/): every graded function and
method says what it does, and every one that takes a mask says its notebook's convention and where the others
differ (issue #52: one idea, three conventions, fixed by the graded API). The rule is `course check`'s
(apps/check.py docstring_problems), so it holds for any assignment that check passes."""
import importlib
from types import SimpleNamespace

import pytest

from autograder.apps.check import MASKED, docstring_problems, graded_callables
from autograder.course.config import load_course

COURSE = load_course()
LECTURES = ("w8l1_attention_vision", "w8l4_transformers", "lab14_transformers")  # the three the issue fixed


@pytest.mark.parametrize("aid", list(COURSE.assignments))
def test_every_graded_callable_has_a_docstring_and_a_masked_one_names_the_conventions(aid):
    assert docstring_problems(aid, importlib.import_module(f"solutions.{aid}")) == []


def masked(aid):
    return [(label, obj) for label, signature, obj in graded_callables(aid, importlib.import_module(f"solutions.{aid}"))
            if MASKED.search(signature)]


@pytest.mark.parametrize("aid", [aid for aid in LECTURES if aid in COURSE.assignments])
def test_each_lectures_masked_items_name_the_other_lectures_conventions(aid):
    """The three lectures' notebooks each have masked items, and each names both others (not only the earlier)."""
    assert masked(aid), f"{aid}: no graded item takes a mask"
    for label, obj in masked(aid):
        missing = [other.split("_")[0] for other in LECTURES if other != aid and other.split("_")[0] not in obj.__doc__]
        assert not missing, f"{aid}: '{label}' takes a mask, but its docstring does not say how {missing} differ"


def test_a_masked_item_that_names_no_earlier_convention_or_none_of_its_own_is_named():
    def scaled_dot_product_attention(Q, K, V, mask=None):
        """Attention with a mask."""
    module = SimpleNamespace(scaled_dot_product_attention=scaled_dot_product_attention)
    said = docstring_problems("lab14_transformers", module)
    assert said == ["'scaled_dot_product_attention' takes a mask, but its docstring does not say how ['w8l1', 'w8l4'] "
                    "differ", "'scaled_dot_product_attention' takes a mask, but its docstring states no convention"]
    scaled_dot_product_attention.__doc__ = "mask: True where a query may attend (w8l1 and w8l4: 1 where blocked)."
    assert docstring_problems("lab14_transformers", module) == []
