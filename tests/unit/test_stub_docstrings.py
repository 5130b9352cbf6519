"""The stubs' docstrings (written into the notebooks by `course sync` from solutions/): every graded function and
method says what it does, and every one that takes a mask says this notebook's convention and where the other
notebooks differ (issue #52: one idea, three conventions, fixed by the graded API)."""
import importlib
import inspect
import re

import pytest

from autograder.course.config import load_course

COURSE = load_course()
SHORT = {aid: aid.split("_")[0] for aid in COURSE.assignments}  # w8l1, w8l4, lab14: what the notebooks call them


def graded_callables(aid):
    """(label, signature, function) of every graded function, class constructor and listed method."""
    module = importlib.import_module(f"solutions.{aid}")
    for name, item in COURSE.assignment(aid).items.items():
        obj = getattr(module, name)
        yield name, item.signature, obj
        for method, signature in item.methods.items():
            yield f"{name}.{method}", signature, getattr(obj, method)


CALLABLES = [(aid, label, signature, obj) for aid in COURSE.assignments
             for label, signature, obj in graded_callables(aid)]


@pytest.mark.parametrize("aid, label, signature, obj", CALLABLES, ids=[f"{a}.{n}" for a, n, _, _ in CALLABLES])
def test_every_graded_callable_has_a_docstring(aid, label, signature, obj):
    assert (inspect.getdoc(obj) or "").strip(), f"{aid}: '{label}' has no docstring, so its stub says nothing"


MASKED = [(aid, label, obj) for aid, label, signature, obj in CALLABLES if re.search(r"mask=", signature)]


def test_the_three_notebooks_have_masked_items():
    assert {aid for aid, _, _ in MASKED} == set(COURSE.assignments), MASKED


@pytest.mark.parametrize("aid, label, obj", MASKED, ids=[f"{a}.{n}" for a, n, _ in MASKED])
def test_a_masked_items_docstring_names_the_other_notebooks_conventions(aid, label, obj):
    doc = inspect.getdoc(obj)
    others = [SHORT[other] for other in COURSE.assignments if other != aid]
    missing = [other for other in others if other not in doc]
    assert not missing, f"{aid}: '{label}' takes a mask, but its docstring does not say how {missing} differ"
    assert re.search(r"True|1\b", doc), f"{aid}: '{label}' takes a mask, but its docstring states no convention"
