"""Which notebooks are submissions of an assignment, and each one's name (its student, told apart where needed).

Only a notebook of the assignment asked for is graded as it: under nbgrader's layout,
`<student>/<assignment>/<notebook>` (`.nbgrader/submitted/`, `autograded/`), the assignment's folder is the
student's submission of it and another assignment's folder never is; and a notebook that says it is another
assignment's (notebooks/identify.py: its cells, else its name) is left out wherever it is. What is left out is
reported, never dropped silently.
"""
from pathlib import Path

from autograder.course.config import load_course
from autograder.notebooks.identify import not_of, own_cell_ids


def find_submissions(paths, aid, say=None):
    """(name, notebook) of `aid` for each argument: a notebook, or a folder searched for notebooks.

    In a folder, the first level names the student, but a folder named after an assignment of the course is that
    assignment's: the folder above it names the student (nbgrader's `<student>/<assignment>/`), or, first in the
    folder given, it holds the student's notebook (the folder given is the student's) or the class's folders
    (`<assignment>/<student>/`). A notebook named <aid>.ipynb takes its folder's name. Names are never empty and
    are unique: a name found twice is told apart by the folders above it (secA/alice, secB/alice), the same folder
    twice by ~2. `say(line)` is told of the notebooks found that are not `aid`'s (in another assignment's folder,
    or saying they are another assignment's): one line per reason, naming them (left_out_lines).
    """
    course = load_course()
    skipped = []
    found = []  # (origin: the path that names the submission, notebook)
    for arg in map(Path, paths):
        if arg.is_file():
            found.append((arg, arg))
            continue
        notebooks = sorted(p for p in arg.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        for nb in notebooks:
            origin, folder = _origin(arg, nb.relative_to(arg), course.assignments)
            if folder not in (None, aid):
                skipped.append((nb, f"in {folder}'s folder"))
                continue
            found.append((origin, nb))
        if not notebooks:
            found.append((arg, arg))  # reported as unreadable, never silently dropped
    kept, own = [], own_cell_ids(course)
    for origin, nb in found:
        why = not_of(nb, aid, own) if nb.is_file() else None
        if why:
            skipped.append((nb, why))
        else:
            kept.append((origin, nb))
    for line in left_out_lines(skipped, aid) if say else ():
        say(line)
    labels = [_label_parts(origin, aid) for origin, _ in kept]
    names = _distinct(labels)
    return list(zip(names, (nb for _, nb in kept), strict=True))


def _origin(arg, rel, assignments):
    """(the path that names the notebook at `arg`/`rel`, the assignment whose folder holds it or None)."""
    folders = rel.parts[:-1]
    at = next((k for k, part in enumerate(folders) if part in assignments), None)
    if at is None:  # the first level names the student
        return (arg / folders[0] if folders else arg / rel), None
    if at == 0:  # the student's folder was given (<assignment>/<notebook>), or the class's (<assignment>/<student>/)
        return (arg if len(folders) == 1 else arg / folders[0] / folders[1]), folders[0]
    return arg.joinpath(*folders[:at]), folders[at]  # nbgrader's <student>/<assignment>/


def left_out_lines(skipped, aid, limit=3):
    """One line per reason for the notebooks find_submissions left out, naming the first few."""
    by_why = {}
    for nb, why in skipped:
        by_why.setdefault(why, []).append(str(nb))
    return [f"not graded as {aid}: {len(nbs)} notebook{'s' if len(nbs) > 1 else ''} {why}: {', '.join(nbs[:limit])}"
            + (f" and {len(nbs) - limit} more" if len(nbs) > limit else "") for why, nbs in by_why.items()]


def _label_parts(origin, aid):
    """The resolved path naming a submission, as parts ending in its name: a cwd-relative 'x.ipynb' has a folder."""
    origin = origin.resolve()  # Path('lab14.ipynb').parent.name is '': the folder's real name is wanted
    if origin.name == f"{aid}.ipynb":
        origin = origin.parent
    parts = [p for p in origin.parts if p != origin.anchor] or ["submission"]
    parts[-1] = parts[-1][:-len(".ipynb")] if parts[-1].endswith(".ipynb") else parts[-1]
    return parts


def _distinct(labels):
    """Each label's last part, with as many folders above it as it takes to tell apart names found twice;
    the same path twice (two notebooks in one student's folder, or one file given twice) gets name~2."""
    names = [parts[-1] for parts in labels]
    for name in set(names):
        group = [k for k, n in enumerate(names) if n == name]
        distinct = len({tuple(labels[k]) for k in group})
        for depth in range(1, max(len(labels[k]) for k in group) + 1):
            shown = {k: "/".join(labels[k][-depth:]) for k in group}
            if len(set(shown.values())) == distinct:
                break
        for k in group:
            names[k] = shown[k]
    seen = {}
    for k, name in enumerate(names):
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            names[k] = f"{name}~{seen[name]}"
    return names


