"""Facts written once: the figures a student reads in a notebook (a pass mark, a step budget, an item's points) come
from course.yaml through `course sync`, so that changing course.yaml changes every place they are read.

In markdown a fact is marked where it stands, and `course sync` rewrites the text between the marks:

    pass mark <!--fact experiments.memory_task.threshold.test_accuracy.min|.0%-->99%<!--/fact--> test accuracy

HTML comments render as nothing (Jupyter, Colab, nbgrader's feedback), so the student reads "pass mark 99% test
accuracy". The key is a path into the assignment's section of course.yaml, `points.ITEM` (an item's points, its
experiments' included) or `total_points`; after `|` comes a Python format spec, whose precision is the least shown:
a figure is never rounded into another value (0.985 with `.0%` is 98.5%), and a spec that cannot state it is refused.

In code a fact is a constant of the facts cell (`metadata.course.generated = "facts"`), which `course sync` writes
from the assignment's `facts:` in course.yaml (NAME: key), so that a demo trains to the grader's own pass mark.
"""
import re
from typing import Any

from autograder.course.config import Assignment, load_course
from autograder.errors import ConfigError

FACTS = "facts"  # the facts cell's metadata.course.generated
MARKED = re.compile(r"<!--fact (?P<key>[^|>]+?)(?:\|(?P<spec>[^>]*?))?-->(?P<text>.*?)<!--/fact-->", re.S)
SETUP_CELL = "setup_imports"  # a new facts cell goes right after this setup cell (else after the first code cell)


def value_of(assignment: Assignment, key: str) -> Any:
    """The value a fact's key names in the assignment's section of course.yaml; ConfigError naming a bad key."""
    if key == "total_points":
        return assignment.total_points
    if key.startswith("points."):
        item = key.removeprefix("points.")
        if item not in assignment.items:
            raise ConfigError(f"{assignment.id}: fact '{key}': no item '{item}' in course.yaml")
        return assignment.item_points(item)
    value: Any = assignment
    for part in key.split("."):
        found = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
        if found is None:
            raise ConfigError(f"{assignment.id}: fact '{key}': course.yaml has no '{part}' there")
        value = found
    if not isinstance(value, (int, float, str)):
        raise ConfigError(f"{assignment.id}: fact '{key}' is {type(value).__name__}, not a number or text")
    return value


def rendered(assignment: Assignment, key: str, spec: str | None) -> str:
    """A fact as the student reads it: 99%, 750, 0.99 (`spec`, a format spec; `g` when none). A spec's precision is
    the least it shows: a figure it would round into another value gets the digits it needs (0.985 with `.0%` is
    98.5%), and a spec that cannot show it exactly (`d`, a `g` precision) is a ConfigError naming the fact."""
    value = value_of(assignment, key.strip())
    if not spec:  # `g` where it is exact (1 rather than 1.0), else every digit: no precision was asked for
        return format(value, "g") if isinstance(value, float) and float(format(value, "g")) == value else str(value)
    try:
        text = format(value, spec)
    except ValueError as e:
        raise ConfigError(f"{assignment.id}: fact '{key}|{spec}': {e}") from None
    if isinstance(value, (str, bool)) or read_back(text) == (exact := read_back(repr(value))):
        return text
    widened = WIDENABLE.fullmatch(spec)
    for digits in range(int(widened["digits"]) + 1, MOST_DIGITS + 1) if widened else ():
        text = format(value, f"{widened['head']}.{digits}{widened['type']}")
        if read_back(text) == exact:
            return text
    raise ConfigError(f"{assignment.id}: fact '{key}|{spec}' shows {value!r} as '{format(value, spec)}', another "
                      f"value: give it a format that keeps the figure's precision (`.1%`, `.3f`, or none)")


# a spec whose precision can grow: fixed point, percent and exponent notation
WIDENABLE = re.compile(r"(?P<head>[^.]*)\.(?P<digits>\d+)(?P<type>[f%eE])")
MOST_DIGITS = 12


def read_back(text: str) -> float | None:
    """The number a rendered fact states (98.5% is 0.985), rounded to MOST_DIGITS significant digits; None when it
    states none."""
    try:
        number = float(text.replace(",", "").replace("_", "").strip().removesuffix("%"))
    except ValueError:
        return None
    return float(f"{number / 100 if text.strip().endswith('%') else number:.{MOST_DIGITS}g}")


def filled(assignment: Assignment, text: str) -> str:
    """The markdown with every marked fact rewritten from course.yaml."""
    return MARKED.sub(lambda m: f"<!--fact {m['key']}{'|' + m['spec'] if m['spec'] is not None else ''}-->"
                                f"{rendered(assignment, m['key'], m['spec'])}<!--/fact-->", text)


def stale_facts(assignment: Assignment, text: str) -> list[str]:
    """'says X where course.yaml gives Y' for each marked fact of `text` that is out of date."""
    said = [f"'{m['text']}' where course.yaml gives '{now}' ({m['key'].strip()})" for m in MARKED.finditer(text)
            if (now := rendered(assignment, m["key"], m["spec"])) != m["text"]]
    return list(dict.fromkeys(said))  # a figure stated twice in one text is one problem


def facts_code(assignment: Assignment) -> str:
    """The facts cell's code: one constant per entry of the assignment's `facts:`."""
    lines = ["# The graded run's figures, written from course.yaml by `course sync`: the demos below use them, so they",
             "# match what the grader holds your code to. Edit course.yaml, not this cell."]
    lines += [f"{name} = {value_of(assignment, key)!r}  # {key}" for name, key in assignment.facts.items()]
    return "\n".join(lines)


def sync_facts(aid: str, nb) -> list[str]:
    """Every marked fact of the notebook's markdown and its facts cell written from course.yaml; the cells that
    changed, as 'facts' (the cell) and 'markdown N' (the N-th cell, from 0)."""
    import nbformat
    assignment = load_course().assignment(aid)
    changed = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and "<!--fact " in cell.source:
            text = filled(assignment, cell.source)
            if text != cell.source:
                cell.source = text
                changed.append(f"markdown {index}")
    cell = next((c for c in nb.cells if c.metadata.get("course", {}).get("generated") == FACTS), None)
    if not assignment.facts:
        if cell is not None:
            nb.cells.remove(cell)
            changed.append(FACTS)
        return changed
    code = facts_code(assignment)
    if cell is None:
        after = next((i for i, c in enumerate(nb.cells)
                      if c.metadata.get("nbgrader", {}).get("grade_id") == SETUP_CELL),
                     next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), len(nb.cells) - 1))
        nb.cells.insert(after + 1, nbformat.v4.new_code_cell(code, metadata={"course": {"generated": FACTS}}))
        changed.append(FACTS)
    elif cell.source != code:
        cell.source = code
        changed.append(FACTS)
    return changed
