"""Planted mistakes per assignment (one module each) and what they share: the catch sets' wiring and the reasons
a check is not isolated yet."""

# Why a check is not isolated yet (a reason, not an excuse: each is work left).
SHAPES_TODO = ("covered but not isolated: its shape slip (SHAPE_SLIPS) breaks the values check too, which compares shapes "
               "as well, so isolating it takes a case only the shapes check has (a dtype or size the values cases lack; "
               "a device, on CUDA only)")
OVERLAP_TODO = "every planted mistake so far that breaks this check also breaks another check of the item"


def attach_catches(planted, catches):
    """Record in each item's entry the checks that must catch each of its planted mistakes."""
    for item, sets in catches.items():
        planted[item]["catches"] = sets


def add_shape_slips(planted, catches, slips):
    """Add each item's shape slip, {item: {name: (variant, kinds)}}, to its planted mistakes and their catch sets.

    Every shapes check gets at least one mistake it must catch: the planted rounds assert the exact set of checks
    that fail, so a shapes check that did nothing would show there even where values catches the slip as well.
    """
    for item, named in slips.items():
        for name, (variant, kinds) in named.items():
            planted[item]["wrong"][name] = variant
            catches[item][name] = set(kinds)
