"""Which assignment a notebook is, from what it says itself: its cells' nbgrader grade ids (a graded cell's id, an
item, its test cell or a written answer, that belongs to one assignment of course.yaml only) or, when no cell says,
its file name `<id>.ipynb`. A notebook that says it is another assignment's is never graded as this one
(batch/submissions.py, the nbgrader plugin, the Gradescope zip's run); one that says nothing (stripped metadata,
another name) is graded, and repaired, as the assignment asked for."""
from pathlib import Path

from autograder.notebooks.cells import nbgrader_meta, read_notebook


def own_cell_ids(course):
    """assignment -> the grade ids of its graded cells that no other assignment of the course has (what not_of reads;
    the Gradescope zip, which holds one assignment, carries them in otter_config.json)."""
    ids = {aid: {*a.items, *(f"test_{i}" for i in a.items), *a.written} for aid, a in course.assignments.items()}
    return {aid: mine - set().union(*(other for o, other in ids.items() if o != aid)) for aid, mine in ids.items()}


def not_of(path, aid, own):
    """Why the notebook at `path` is not `aid`'s, as a phrase ("whose cells are lab14_transformers's"), or None
    when nothing in it says so (unreadable, no cell of any assignment's own, cells of `aid` among others') or `aid`
    is not the course's. `own`: own_cell_ids of the course."""
    if aid not in own:  # an assignment the course does not know: nothing to tell it from
        return None
    nb, _ = read_notebook(path)
    if nb is not None:
        ids = {grade_id for cell in nb["cells"] if isinstance(cell, dict) and isinstance(cell.get("metadata", {}), dict)
               and isinstance(grade_id := nbgrader_meta(cell).get("grade_id"), str)}  # a list or a dict says nothing
        says = sorted(a for a, theirs in own.items() if set(theirs) & ids)
        if aid in says:
            return None
        if says:
            return f"whose cells are {' and '.join(says)}'s"
    stem = Path(path).stem
    if stem != aid and stem in own:
        return f"named {stem}.ipynb"
    return None
