"""Example submissions made from the release: complete, empty, partly right, broken (demo and meta-tests)."""
import copy
from pathlib import Path

import nbformat

from autograder.course.config import load_course, released_notebook
from autograder.notebooks.build import item_cell
from autograder.notebooks.cells import nbgrader_meta


def release_notebook(aid, release_root=None):
    """The student's notebook: from `release_root`, else the course's release/ (an error naming it when missing)."""
    path = Path(release_root) / aid / f"{aid}.ipynb" if release_root else released_notebook(aid)
    return nbformat.read(path, as_version=4)


def with_cells(nb, sources):
    """A copy of `nb` whose graded cells `item -> source` are replaced."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        gid = nbgrader_meta(cell).get("grade_id")
        if gid in sources:
            cell.source = sources[gid]
    return nb


def solved_sources(aid, items=None):
    assignment = load_course().assignment(aid)
    return {i: item_cell(aid, i, solved=True) for i in (items or assignment.items)}


def write_solution(aid, folder):
    """folder/<aid>.ipynb: the release with every graded cell the reference's (the complete submission)."""
    path = Path(folder) / f"{aid}.ipynb"
    nbformat.write(with_cells(release_notebook(aid), solved_sources(aid)), path)
    return path


def mutate(aid, item, old, new):
    """The reference cell of `item` with one piece of text changed (a planted mistake)."""
    source = item_cell(aid, item, solved=True)
    if old not in source:
        raise ValueError(f"{aid}.{item}: '{old}' is not in the reference cell; update the planted mistake")
    return source.replace(old, new, 1)


def examples(aid, release_root=None):
    """name -> notebook for the demo's four kinds of submission."""
    assignment = load_course().assignment(aid)
    base = release_notebook(aid, release_root)
    items = list(assignment.items)
    half = items[: (len(items) + 1) // 2]
    partial = solved_sources(aid, half)
    mistake = assignment.demo_mistake  # course.yaml's; without one, half done and nothing wrong
    if mistake:
        partial[mistake.item] = mutate(aid, mistake.item, mistake.reference, mistake.wrong)
    broken = solved_sources(aid)
    broken[items[0]] = broken[items[0]].replace("):", ")", 1)                 # a syntax error
    broken[items[-1]] = broken[items[-1]] + "\nimport os\nos._exit(3)\n"      # kills its own process
    return {
        "complete": with_cells(base, solved_sources(aid)),
        "empty": base,
        "partly_right": with_cells(base, partial),
        "broken": with_cells(base, broken),
    }


def write_examples(aid, folder, release_root=None):
    """Write the example submissions as folder/<name>/<aid>.ipynb; returns [(name, path)]."""
    out = []
    for name, nb in examples(aid, release_root).items():
        path = Path(folder) / name / f"{aid}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
        out.append((name, path))
    return out
