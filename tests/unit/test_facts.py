"""A fact states the figure course.yaml gives, never another: a format's precision grows to keep it, and a format
that cannot keep it is refused, naming the fact."""
import pytest

from autograder.course.config import load_course
from autograder.errors import ConfigError
from autograder.notebooks.facts import filled, rendered, stale_facts

LAB, KEY = "lab14_transformers", "experiments.memory_task.threshold.test_accuracy.min"


@pytest.fixture
def lab():
    assignment = load_course().assignment(LAB).model_copy(deep=True)
    assignment.experiments["memory_task"].threshold["test_accuracy"].min = 0.985
    return assignment


@pytest.mark.parametrize("spec, text", [(".0%", "98.5%"), (".1%", "98.5%"), (".2%", "98.50%"), (".2f", "0.985"),
                                        (".4f", "0.9850"), (None, "0.985"), (".0e", "9.85e-01")])
def test_a_format_keeps_the_figures_precision(lab, spec, text):
    assert rendered(lab, KEY, spec) == text


def test_a_format_that_cannot_keep_it_is_refused_naming_the_fact(lab):
    with pytest.raises(ConfigError, match=rf"fact '{KEY}\|\.2g' shows 0\.985 as '0\.98', another value"):
        rendered(lab, KEY, ".2g")


def test_a_figure_stated_twice_in_one_text_is_one_stale_fact(lab):
    text = f"pass mark <!--fact {KEY}|.0%-->99%<!--/fact-->, again <!--fact {KEY}|.0%-->99%<!--/fact-->"
    assert stale_facts(lab, text) == [f"'99%' where course.yaml gives '98.5%' ({KEY})"]
    assert stale_facts(lab, filled(lab, text)) == []
