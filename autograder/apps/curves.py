"""`course curves`: the reference's validation curves written into the course's `.grader/curves`, committed with it.

A grading judges a student's run hopeless against the reference's validation curve (grading/experiments.py
reference_curve), which the first grading on a machine trains, one thread, before the student's run, when no cache
holds it: on a fresh checkout of two cores that doubled the first w8l4 grading (issue #62's `fresh` row). A curve is
a function of what its key names (the experiment's course.yaml entry, the solutions, the grading code, the torch
release and NumPy's and Python's minor versions, the data, one thread, the device), not of the machine that trained
it, so it is trained once here and read by every checkout from the cache's read-only layer (cache.SHIPPED), as the
Gradescope zip ships it. A checkout whose key differs (another torch release, an edited harness, solution or
experiment) finds none of them and trains its own, as before: run this again and commit `.grader/curves` after
such a change (docs/DEVELOPING.md); a test (tests/test_shipped_curves.py) says when they are behind.

Curves on the CPU only: a GPU grader keys its own. MNIST's curves (w8l1) are keyed by the content of the files
read (data_source_of), so a checkout reading the repository's data/mnist reads them; one that downloads MNIST, or
reads another folder, keys its own. `index.json` beside them says which file is which (assignment, experiment,
seed, libraries): read by people and by the test, never by grading.
"""
import json
from pathlib import Path

from autograder.course.config import course_root, load_course

DEVICE = "cpu"
INDEX = "index.json"


def current_curves(ids=None):
    """{key: (assignment, experiment, seed)} of every curve a grading on the CPU here would read, for the
    assignments `ids` (default all)."""
    from autograder.grading.experiments import curve_key, has_curve
    course, out = load_course(), {}
    for aid in ids or course.assignments:
        for exp in course.assignment(aid).experiments.values():
            if has_curve(aid, exp):
                for seed in exp.seeds:
                    out[curve_key(aid, exp, seed, DEVICE)] = (aid, exp.name, seed)
    return out


def ship_curves(ids=None) -> int:
    """Train (or read from this machine's cache) every current curve and write it into `.grader/curves`; with no
    `ids`, remove the files no current key names (an older harness's, another torch release's). 0."""
    from autograder.grading.cache import SHIPPED, atomic_write
    from autograder.grading.experiments import curve_libraries, reference_curve
    course, folder = load_course(), course_root() / SHIPPED
    folder.mkdir(parents=True, exist_ok=True)
    index = read_index(folder)
    wanted = current_curves(ids)
    for key, (aid, name, seed) in wanted.items():
        path = folder / f"{key}.json"
        text = json.dumps(reference_curve(aid, course.assignment(aid).experiments[name], seed, DEVICE))
        same = path.is_file() and path.read_text() == text
        if not same:
            atomic_write(path, text)
        index[key] = {"assignment": aid, "experiment": name, "seed": seed, "device": DEVICE,
                      "libraries": curve_libraries()}
        print(f"{aid}.{name} seed {seed}: {path.relative_to(course_root())} {'unchanged' if same else 'written'}")
    if not ids:
        for path in sorted(folder.glob("*.json")):
            if path.name != INDEX and path.stem not in wanted:
                path.unlink()
                index.pop(path.stem, None)
                print(f"removed {path.relative_to(course_root())}: no current curve's key")
        index = {k: v for k, v in index.items() if k in wanted}
    atomic_write(folder / INDEX, json.dumps(dict(sorted(index.items())), indent=1) + "\n")
    print(f"{len(wanted)} curves in {folder.relative_to(course_root())}: commit them; a checkout with the same "
          f"grading code, solutions and library releases trains none of them")
    return 0


def read_index(folder: Path) -> dict:
    """The shipped curves' index ({} when there is none or it is unreadable: it is rebuilt)."""
    try:
        index = json.loads((folder / INDEX).read_text())
    except (OSError, ValueError):
        return {}
    return index if isinstance(index, dict) else {}
