"""Example submissions made from the release: complete, empty, partly right, broken (demo and meta-tests)."""
import ast
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
    """The reference cell of `item` with one piece of its code changed (a planted mistake): the first `old` outside
    the docstrings, which may quote the same code (`nn.GRU(d, d // 2, ...)`) and are no part of what runs."""
    source = item_cell(aid, item, solved=True)
    quoted = docstring_spans(source)
    at = next((k for k in _occurrences(source, old) if not any(a <= k < b for a, b in quoted)), -1)
    if at < 0:
        raise ValueError(f"{aid}.{item}: '{old}' is not in the reference cell's code; update the planted mistake")
    return source[:at] + new + source[at + len(old):]


def _occurrences(text, part):
    at = text.find(part)
    while at >= 0:
        yield at
        at = text.find(part, at + 1)


def docstring_spans(source):
    """(start, end) character offsets of every docstring in the source."""
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    spans = []
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            doc = body[0]
            spans.append((starts[doc.lineno - 1] + doc.col_offset, starts[doc.end_lineno - 1] + doc.end_col_offset))
    return spans


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
