"""Planted mistakes per assignment (one module each) and what reads them: a variant's cell, the rounds they are
graded in (tests/test_grading.py, tools/device_planted.py, tools/mutate_checks.py), the catch sets' wiring and the
reasons a check is not isolated yet."""
import importlib

from autograder.grading.planted import dependents, packed, variant_source  # noqa: F401 (the meta-tests' helpers)
from autograder.reports.tables import item_summary

# Why a check is not isolated yet (a reason, not an excuse: each is work left).
SHAPES_TODO = ("covered but not isolated: its shape slip (SHAPE_SLIPS) breaks the values check too, which compares "
               "shapes as well, so isolating it takes a case only the shapes check has (a dtype or size the values "
               "cases lack; a device slip, DEVICE_SLIPS, where the item makes a tensor of its own)")
OVERLAP_TODO = "every planted mistake so far that breaks this check also breaks another check of the item"


def attach_catches(planted, catches):
    """Record in each item's entry the checks that must catch each of its planted mistakes."""
    for item, sets in catches.items():
        planted[item]["catches"] = sets


def add_slips(planted, catches, slips):
    """Add each item's slips, {item: {name: (variant, kinds)}}, to its planted mistakes and their catch sets: a
    shape slip, or a device slip (a tensor made on the CPU inside the item: only the shapes check's run on a
    fake GPU catches it, grading/device_check.py).

    Every shapes check gets at least one mistake it must catch: the planted rounds assert the exact set of checks
    that fail, so a shapes check that did nothing would show there even where values catches the slip as well.
    """
    for item, named in slips.items():
        for name, (variant, kinds) in named.items():
            planted[item]["wrong"][name] = variant
            catches[item][name] = set(kinds)


def scores(result):
    """{item: (score, max_score)} of one results.json."""
    return {item: (s, m) for item, (s, m, _) in item_summary(result).items()}


def planted_module(aid):
    """tests/planted/<aid>.py, or None when the assignment has none yet."""
    try:
        return importlib.import_module(f"tests.planted.{aid}")
    except ModuleNotFoundError:
        return None  # test_every_item_has_planted_mistakes_and_a_correct_alternative reports it


def planted(aid):
    """The assignment's PLANTED: {item: {"wrong": {name: variant}, "right": {...}, "catches": {name: kinds}}}."""
    return getattr(planted_module(aid), "PLANTED", {})


def rounds(aid):
    """Planted wrong variants packed into rounds in which no item uses another (grading/planted.py packed)."""
    return packed(aid, [(item, name, v) for item, spec in planted(aid).items() for name, v in spec["wrong"].items()])
