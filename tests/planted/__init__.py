"""Planted mistakes per assignment (one module each) and what they share: the catch sets' wiring and the reasons
a check is not isolated yet."""

# Why a check is not isolated yet (a reason, not an excuse: each is work left).
SHAPES_TODO = ("no planted mistake yet breaks only shape, dtype or device: the values check compares shapes too, so it "
               "takes a case only the shapes check has (a dtype or size the values cases lack; a device, on CUDA only)")
OVERLAP_TODO = "every planted mistake so far that breaks this check also breaks another check of the item"


def attach_catches(planted, catches):
    """Record in each item's entry the checks that must catch each of its planted mistakes."""
    for item, sets in catches.items():
        planted[item]["catches"] = sets
