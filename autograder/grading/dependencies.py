"""A mistake costs points once: which graded items each item uses, and the reference that stands in for one.

The graph is read from the code, so that it cannot drift from it: an item uses the graded items its reference
code names (the solved cell, autograder/notebooks/build.py item_cell) and those course.yaml's `checked_with` says its
checks hand the student's code of; an experiment uses the parts its harness lists (EXPERIMENTS[name]["parts"]) and
what they use. Never the student's code: a submission cannot add an edge to get a reference it did not earn.

Under `dependencies: independent` (course.yaml), an item whose checks failed while an item it uses had failed
its own checks is graded again in a sandbox of its own, where the reference of each failed item stands in, and
keeps the better result (autograder/grading/plugin.py). The stand-in is the reference's definitions of those items
and what they need from the solution module (its imports and helpers), nothing more, run in a namespace of its
own: only the failed names are bound in the student's namespace. The student's code in that sandbox could read
those definitions (nothing in one Python process is hidden from another part of it), so nothing that sandbox
prints reaches the student, and it is ended with the regrade (nothing it kept serves a later item).
"""
from __future__ import annotations

import ast
import importlib
import inspect

from autograder.notebooks.build import item_cell
from autograder.notebooks.cells import Cell, names_used

STANDIN_CELL = "reference_standin"  # the grade_id of the cell that binds the references in the student's namespace


def uses(aid, assignment):
    """{item: the other graded items it uses directly} (module doc)."""
    items = set(assignment.items)
    return {item: ((names_used(item_cell(aid, item, solved=True)) or set()) & items) - {item}
            | set(spec.checked_with) for item, spec in assignment.items.items()}


def closure(graph, roots):
    """Every item reachable from `roots` through `graph` (the roots themselves not included unless reached)."""
    found, frontier = set(), set(roots)
    while frontier:
        frontier = set().union(*(graph.get(i, set()) for i in frontier)) - found
        found |= frontier
    return found


def experiment_uses(aid, assignment, exp, graph, harness):
    """The items an experiment's training runs of the student's: its harness's parts and what they use, but never
    its own item (a swap would grade the reference's training instead of the student's)."""
    parts = set(harness.EXPERIMENTS[exp.name].get("parts", [])) & set(assignment.items)
    return (parts | closure(graph, parts)) - {exp.item}


def note(swapped):
    """The one line a regraded item's feedback carries."""
    names = sorted(swapped)
    if len(names) == 1:
        return f"graded with the reference `{names[0]}`, since yours failed its checks (see that item)"
    listed = ", ".join(f"`{n}`" for n in names[:-1]) + f" and `{names[-1]}`"
    return f"graded with the reference {listed}, since yours failed their checks (see those items)"


def reference_source(aid, names):
    """The solution module's imports and the top-level definitions `names` need, in the module's order."""
    module = importlib.import_module(f"solutions.{aid}")
    source = inspect.getsource(module)
    tree = ast.parse(source)
    defined = {}  # top-level name -> its statement
    for node in tree.body:
        for name in _defines(node):
            defined[name] = node
    needed, frontier = set(), set(names)
    while frontier:
        needed |= frontier
        frontier = {n for f in frontier if f in defined
                    for n in (names_used(ast.get_source_segment(source, defined[f])) or set())} & set(defined)
        frontier -= needed
    keep = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
            or any(n in needed for n in _defines(node))]
    return "\n\n".join(_segment(source, node) for node in keep) + "\n"


def _defines(node):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


def _segment(source, node):
    """A statement's source with its decorators."""
    lines = source.splitlines()
    start = node.decorator_list[0].lineno if getattr(node, "decorator_list", None) else node.lineno
    return "\n".join(lines[start - 1:node.end_lineno])


def standin_cell(aid, swapped, index):
    """The cell, loaded after the student's, that binds the reference of each swapped item in their namespace.

    The references run in a namespace of their own (the solution module's imports, not whatever the student's
    names are), so the only names that change in the student's namespace are the swapped items'.
    """
    names = sorted(swapped)
    source = (f"__course_reference = {{'__name__': 'reference'}}\n"
              f"exec(compile({reference_source(aid, names)!r}, '<reference>', 'exec'), __course_reference)\n"
              + "".join(f"{n} = __course_reference[{n!r}]\n" for n in names)
              + "del __course_reference\n")
    return Cell(grade_id=STANDIN_CELL, source=source, index=index)
