"""Planted mistakes on a GPU grader: every planted wrong variant still loses points on its item and every correct
alternative keeps full marks with `--device cuda` (the checks run on the CPU there too, with the shapes checks' fake-GPU
run, grading/device_check.py; this says that a GPU grader changes nothing about them).

For a machine with a GPU, not CI: `python tools/device_planted.py [--device cuda]` (see tools/device_check.sh).
Prints one line per planted variant and exits 1 if any was misjudged.
"""
import argparse
import sys
import tempfile
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from autograder.course.config import load_course  # noqa: E402
from autograder.grading.grade import grade_notebook  # noqa: E402
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells  # noqa: E402
from tests.planted import planted, rounds, scores, variant_source  # noqa: E402


def grade(aid, sources, device, items=None):
    """{item: (score, max_score)} of the solution notebook with `sources` replacing its cells."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{aid}.ipynb"
        nbformat.write(with_cells(release_notebook(aid), {**solved_sources(aid), **sources}), path)
        return scores(grade_notebook(path, aid, items=items, device=device, experiments=False))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    misjudged = []
    for aid in load_course().assignments:
        for batch in rounds(aid):
            got = grade(aid, {item: variant_source(aid, item, v) for item, _, v in batch}, args.device,
                        items=[item for item, _, _ in batch])
            for item, name, _ in batch:
                score, most = got[item]
                ok = score < most
                print(f"{aid}.{item} wrong {name}: {score:g}/{most:g}" + ("" if ok else "  NOT CAUGHT"), flush=True)
                misjudged += [] if ok else [f"{aid}.{item} wrong {name}"]
        rights = {item: variant_source(aid, item, next(iter(spec["right"].values())))
                  for item, spec in planted(aid).items()}
        for item, (score, most) in grade(aid, rights, args.device).items():
            ok = score == most
            print(f"{aid}.{item} right alternative: {score:g}/{most:g}" + ("" if ok else "  LOST POINTS"), flush=True)
            misjudged += [] if ok else [f"{aid}.{item} right alternative"]
    print("misjudged on " + args.device + ": " + (", ".join(misjudged) if misjudged else "none"))
    return 1 if misjudged else 0


if __name__ == "__main__":
    sys.exit(main())
