"""A new lecture is a first-class assignment (issue #63): an assignment written by hand from docs/AUTHORING.md alone
(a from-scratch function, a module using it, a second module, one MNIST experiment; tests/handwritten/), added to a
copy of the course through `course new` with no shared file edited, taken to `course check --full` ok, then holds
for the whole project: the unit layer and every test that selects its id pass in the copy.

Slow by design (it grades, trains and runs the meta-tests on a fourth assignment); the model and budget are tiny."""
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from tests.test_new_assignment import copy_of_the_course, course

pytestmark = [pytest.mark.grading, pytest.mark.slow]
AID = "w9l2_normalization"
HERE = Path(__file__).parent / "handwritten"
WHOLE = {"suite.py": f"autograder/suites/test_{AID}.py", "harness.py": f"autograder/harness/{AID}.py",
         "planted.py": f"tests/planted/{AID}.py"}
NEW = ["new", AID, "--experiment", "mnist_normmlp:NormMLP", "--from-scratch",
       "layer_norm=torch.nn.functional.layer_norm", "--from-scratch", "NormMLP=layer_norm"]


def typed_over(text, edits):
    """course.yaml with each placeholder line of the assignment's section replaced by what the author typed."""
    lines = text.split("\n")
    section = lines.index(f"  {AID}:")
    for placeholder, new in edits:
        at = lines.index(placeholder, section)
        lines[at:at + 1] = new.split("\n")
    return "\n".join(lines)


def shared_files(root):
    """{path: bytes} of every file outside the new assignment's own."""
    own = {f"solutions/{AID}.py", f"assignments/{AID}/{AID}.ipynb", f"release/{AID}/{AID}.ipynb", "course.yaml",
           *WHOLE.values()}
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and ".nbgrader" not in p.parts
            and p.relative_to(root).as_posix() not in own}


def pytest_in(copy, *args, timeout=3000):
    """pytest ARGS in the copy, every process it starts (nbgrader's included) importing the copy's package."""
    env = {**os.environ, "PYTHONPATH": str(copy)}
    proc = subprocess.run([sys.executable, "-m", "pytest", *args, "-q", "-p", "no:cacheprovider", "-n", "0"],
                          cwd=copy, capture_output=True, text=True, timeout=timeout, env=env)
    return proc.returncode, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_a_hand_written_assignment_checked_full_holds_for_the_unit_layer_and_every_test_of_its_id(tmp_path):
    copy = copy_of_the_course(tmp_path / "course")
    before = shared_files(copy)
    (copy / "solutions" / f"{AID}.py").write_text((HERE / "solution.py").read_text())
    out = course(NEW, copy).stdout
    assert f"{AID}: 3 items (layer_norm, RMSNorm, NormMLP), experiments mnist_normmlp, from scratch layer_norm, " \
           f"NormMLP" in out, out
    section = yaml.safe_load((copy / "course.yaml").read_text())["assignments"][AID]
    assert section["oracles"] == {"layer_norm": ["torch.nn.functional.layer_norm"]}  # its own, not the shared one
    assert section["items"]["NormMLP"]["from_scratch"] == ["layer_norm"]
    assert "layer_norm" not in yaml.safe_load((copy / "course.yaml").read_text())["oracles"]

    # the author's work, from the docs: placeholders typed over, the suite, harness and planted file written
    edits = yaml.safe_load((HERE / "edits.yaml").read_text())
    (copy / "course.yaml").write_text(typed_over((copy / "course.yaml").read_text(), edits["course.yaml"]))
    for mine, theirs in WHOLE.items():
        (copy / theirs).write_text((HERE / mine).read_text())
    notebook = copy / "assignments" / AID / f"{AID}.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    for placeholder, new in edits["notebook"]:
        cell = next(c for c in nb.cells if placeholder in c.source)
        cell.source = "\n".join(new if placeholder in line else line for line in cell.source.split("\n"))
    nbformat.write(nb, notebook)
    course(["sync", AID], copy)
    course(["release", AID], copy)
    assert shared_files(copy) == before, "an author edited a shared file"

    # `course check --full`: ok, the planted rules, mutations and seeds included. Four mutations of each item's
    # reference, not --full's eight: each check must still fail for one of them, and each is a grading (half the
    # stage's cost); tests/test_check.py holds the stage to naming a check that no mutation fails
    proc = course(["check", AID, "--full", "--mutations", "4"], copy, check=False)
    assert proc.returncode == 0 and f"{AID}: ok" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]

    # the project holds for it: the unit layer, and every test that selects its id
    code, said = pytest_in(copy, "tests/unit")
    assert code == 0, said
    code, said = pytest_in(copy, "tests", "-k", AID, "--deselect", "tests/test_handwritten_assignment.py")
    assert code == 0, said
    ran = re.search(r"(\d+) passed", said)
    assert ran and int(ran[1]) >= 20, said  # the meta-tests' rounds, the release's and the graph's tests at least
