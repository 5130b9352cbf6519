"""Repair a submitted notebook's structure against the release, before nbgrader's own checks see it.

What students do to notebooks that nbgrader alone grades as 0 (or with an item's points gone):
- cells that lost their nbgrader metadata (an editor stripped it) get it back from the released cell they
  match: locked cells (setup, tests) by their source, graded cells by the name they define (the last cell that
  defines it, as a run top to bottom leaves it, and as `course grade` finds it), written answers by the released
  prompt right above them;
- a cell duplicated by copy/paste keeps one copy: a locked cell's extra copies go, a graded cell's earlier
  copies lose the metadata (the last one is graded, as `course grade` grades it);
- a locked cell deleted, or its source or points edited, is the released one again.
Each repair is one line of the notes returned, for the TA's log and the student's feedback.
"""
import copy
import uuid

from autograder.notebooks.cells import by_name_note, cell_source, defined_names, last_definition, nbgrader_meta


def grade_id(cell):
    return str(nbgrader_meta(cell).get("grade_id", ""))


def kind_of(meta):
    """'setup' or 'test' (locked cells), 'answer' (a written answer) or 'item' (a graded code cell)."""
    if meta.get("locked") and not meta.get("solution"):
        return "test" if meta.get("grade") else "setup"
    return "answer" if meta.get("cell_type") == "markdown" else "item"


def same_source(a, b):
    return a.get("cell_type") == b.get("cell_type") and cell_source(a).strip() == cell_source(b).strip()


def repair(nb, released):
    """(a repaired copy of `nb`, [one line per repair]); `released` is the release's notebook (nbformat v4 both)."""
    nb, notes = copy.deepcopy(nb), []
    trusted = {grade_id(c): c for c in released.cells if grade_id(c)}
    restore_metadata(nb, released, notes)
    drop_duplicates(nb, trusted, notes)
    restore_missing(nb, released, notes)
    restore_locked(nb, trusted, notes)
    return nb, notes


def restore_metadata(nb, released, notes):
    """Give the cells without nbgrader metadata that of the released cell they match (one note for all but items)."""
    have = {grade_id(c) for c in nb.cells}
    bare = {k for k, c in enumerate(nb.cells) if not nbgrader_meta(c)}
    restored = []

    def claim(k, cell):
        nb.cells[k].setdefault("metadata", {})["nbgrader"] = copy.deepcopy(nbgrader_meta(cell))
        bare.discard(k)
        have.add(grade_id(cell))

    missing = [(at, c) for at, c in enumerate(released.cells) if grade_id(c) and grade_id(c) not in have]
    # locked cells first, by source: a test cell's lines must never pass for the item they test
    for _, cell in missing:
        if kind_of(nbgrader_meta(cell)) in ("setup", "test"):
            k = next((k for k in sorted(bare) if same_source(nb.cells[k], cell)), None)
            if k is not None:
                claim(k, cell)
                restored.append(grade_id(cell))
    for _, cell in missing:
        name = grade_id(cell)
        if kind_of(nbgrader_meta(cell)) == "item" and name in defined_names(cell_source(cell)):
            found = last_definition([c if k in bare else {} for k, c in enumerate(nb.cells)], name)
            if found is not None:
                claim(found[0], cell)
                notes.append(by_name_note(name, found[0]))
    for at, cell in missing:
        prompt = released.cells[at - 1] if at else None
        if kind_of(nbgrader_meta(cell)) != "answer" or prompt is None or not cell_source(prompt).strip():
            continue
        k = next((k for k, c in enumerate(nb.cells[:-1]) if same_source(c, prompt)), None)
        if k is not None and k + 1 in bare and nb.cells[k + 1].get("cell_type") == cell.get("cell_type"):
            claim(k + 1, cell)
            restored.append(grade_id(cell))
    if restored:
        kinds = [kind_of(nbgrader_meta(cell)) for _, cell in missing if grade_id(cell) in restored]
        counts = ", ".join(f"{kinds.count(k)} {k}" for k in ("setup", "test", "answer") if k in kinds)
        notes.append(f"{len(restored)} cells had lost their nbgrader metadata ({counts}); it was restored from the "
                     f"released notebook, matching each cell by its source or by the prompt above it")


def drop_duplicates(nb, trusted, notes):
    """One cell per grade_id: a locked cell's extra copies go, a graded cell's earlier copies lose the metadata."""
    where = {}
    for k, cell in enumerate(nb.cells):
        if grade_id(cell) in trusted:
            where.setdefault(grade_id(cell), []).append(k)
    drop = set()
    for gid, places in where.items():
        if len(places) < 2:
            continue
        cells = ", ".join(map(str, places))
        kind = kind_of(nbgrader_meta(trusted[gid]))
        if kind in ("setup", "test"):
            drop.update(places[1:])
            notes.append(f"{kind} cell '{gid}' appeared {len(places)} times (cells {cells}); one copy was kept")
        else:
            for k in places[:-1]:
                del nb.cells[k]["metadata"]["nbgrader"]
            notes.append(f"'{gid}' appeared in cells {cells}; the last one was graded, as a notebook run top to "
                         f"bottom would define it")
    nb.cells = [c for k, c in enumerate(nb.cells) if k not in drop]


def restore_missing(nb, released, notes):
    """Put back each locked cell and written answer the notebook lacks, after the cell that precedes it in the
    release."""
    for at, cell in enumerate(released.cells):
        gid = grade_id(cell)
        kind = kind_of(nbgrader_meta(cell)) if gid else None
        if kind not in ("setup", "test", "answer") or any(grade_id(c) == gid for c in nb.cells):
            continue
        nb.cells.insert(position_after(nb, released.cells[:at]), fresh(cell, nb))
        notes.append({"test": f"your notebook had no test cell for '{gid.removeprefix('test_')}'; the released one "
                              f"was used",
                      "setup": f"setup cell '{gid}' was missing from the notebook; the released one was used",
                      "answer": f"the written answer '{gid}' was not found in the notebook; an empty answer cell "
                                f"was put back"}[kind])


def position_after(nb, before):
    """Where a cell goes in `nb`: right after the nearest of the released cells `before` it that `nb` has."""
    for prior in reversed(before):
        gid = grade_id(prior)
        for k in range(len(nb.cells) - 1, -1, -1):
            if (grade_id(nb.cells[k]) == gid if gid else
                    (not grade_id(nb.cells[k]) and cell_source(prior).strip() and same_source(nb.cells[k], prior))):
                return k + 1
    return 0


def fresh(cell, nb):
    """A copy of a released cell for `nb`: no outputs, and a cell id `nb` does not use yet."""
    cell = copy.deepcopy(cell)
    if cell.get("cell_type") == "code":
        cell["outputs"], cell["execution_count"] = [], None
    if "id" in cell and any(c.get("id") == cell["id"] for c in nb.cells):
        cell["id"] = uuid.uuid4().hex[:8]
    return cell


def restore_locked(nb, trusted, notes):
    """A locked cell whose source or metadata was edited, or a graded cell whose points were, is the released one."""
    for k, cell in enumerate(nb.cells):
        gid = grade_id(cell)
        if gid not in trusted:
            continue
        good, meta = trusted[gid], nbgrader_meta(cell)
        good_meta = nbgrader_meta(good)
        if "points" in good_meta and meta.get("points") != good_meta["points"]:
            notes.append(f"cell '{gid}' had its points changed to {number(meta.get('points'))}; the released "
                         f"{number(good_meta['points'])} were used")
            meta["points"] = good_meta["points"]
        if kind_of(good_meta) not in ("setup", "test"):
            continue
        if cell.get("cell_type") != good.get("cell_type") or cell_source(cell).strip() != cell_source(good).strip():
            notes.append(f"{kind_of(good_meta)} cell '{gid}' was edited; the released one was used")
            nb.cells[k] = fresh(good, nb)
            if "id" in cell:
                nb.cells[k]["id"] = cell["id"]
        elif meta != good_meta:
            notes.append(f"the nbgrader metadata of {kind_of(good_meta)} cell '{gid}' was edited; the released "
                         f"metadata was used")
            cell["metadata"]["nbgrader"] = copy.deepcopy(good_meta)


def number(value):
    return f"{value:g}" if isinstance(value, (int, float)) else repr(value)
