"""A fourth assignment, the way an instructor adds one (docs/AUTHORING.md): the reference module first, then `course
new`, then what `course check` lists, in a copy of the course. The author's work is tests/worked_example/: the
reference (solution.py), what they typed over the placeholders (edits.yaml) and the suite, harness and planted
mistakes as they ended. The copy is checked and graded as the course's own assignments are: `course check`, the
release, and the meta-tests of tests/test_grading.py (reference full marks, the release 0, each planted mistake on
its own item, a model that cannot learn losing its experiment)."""
import difflib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autograder.course.config import ROOT

pytestmark = pytest.mark.grading
AID = "w9l1_vit"
EXAMPLE = Path(__file__).parent / "worked_example"
WHOLE = {"suite.py": f"autograder/suites/test_{AID}.py", "harness.py": f"autograder/harness/{AID}.py",
         "planted.py": f"tests/planted/{AID}.py"}
MAX_FILES, MAX_LINES = 6, 300   # issue #53: for two function items and one experiment


def course(args, cwd, check=True):
    """`course ARGS` as the author runs it in their copy (its own package, not this checkout's)."""
    proc = subprocess.run([sys.executable, "-m", "autograder.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def copy_of_the_course(dest):
    """The checkout's files as git sees them (tracked, the release included, and new ones not ignored)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(source.read_bytes())
    return dest


def typed_over(text, edits):
    """course.yaml with each placeholder line of the new assignment's section replaced by what the author typed;
    (text, lines typed)."""
    lines, typed = text.split("\n"), 0
    section = lines.index(f"  {AID}:")
    for placeholder, new in edits:
        at = lines.index(placeholder, section)
        lines[at:at + 1] = new.split("\n")
        typed += len(new.split("\n"))
    return "\n".join(lines), typed


def added_lines(before, after):
    """Lines of `after` that are not `before`'s (what the author wrote into a scaffolded file)."""
    return sum(1 for line in difflib.ndiff(before.splitlines(), after.splitlines())
               if line.startswith("+ ") and line[2:].strip())


def test_a_fourth_assignment_from_its_reference_to_graded(tmp_path):
    import nbformat
    copy = copy_of_the_course(tmp_path / "course")
    (copy / "solutions" / f"{AID}.py").write_text((EXAMPLE / "solution.py").read_text())
    out = course(["new", AID, "--experiment", "mnist_vit:PatchClassifier"], copy).stdout
    assert f"{AID}: 2 items (patchify, PatchClassifier), experiments mnist_vit" in out, out

    # 1. what is left to write: one line per placeholder, exit 1, never a traceback
    proc = course(["check", AID], copy, check=False)
    todo = [line for line in proc.stdout.splitlines() if line.startswith(f"{AID}: ")]
    placeholders = sum(path.read_text().count("TODO(course new)") for path in
                       [copy / "course.yaml", *(copy / p for p in WHOLE.values())])
    cells = nbformat.read(copy / "assignments" / AID / f"{AID}.ipynb", as_version=4).cells
    placeholders += sum(cell.source.count("TODO(course new)") for cell in cells) - 1  # the title: course.yaml's
    assert proc.returncode == 1 and len(todo) == placeholders + 1, proc.stdout
    assert todo[-1] == f"{AID}: no release yet: run `course release {AID}`", todo[-1]

    # 2. the author's work, counted: files touched and lines written outside the notebook's prose
    edits = yaml.safe_load((EXAMPLE / "edits.yaml").read_text())
    written = {"solutions": len((EXAMPLE / "solution.py").read_text().splitlines())}
    text, written["course.yaml"] = typed_over((copy / "course.yaml").read_text(), edits["course.yaml"])
    (copy / "course.yaml").write_text(text)
    for mine, theirs in WHOLE.items():
        written[mine] = added_lines((copy / theirs).read_text(), (EXAMPLE / mine).read_text())
        (copy / theirs).write_text((EXAMPLE / mine).read_text())
    notebook = copy / "assignments" / AID / f"{AID}.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    for placeholder, new in edits["notebook"]:
        cell = next(c for c in nb.cells if placeholder in c.source)
        cell.source = "\n".join(new if placeholder in line else line for line in cell.source.split("\n"))
        if cell.cell_type == "code":  # the public checks count; the prose does not
            written["notebook"] = written.get("notebook", 0) + len(new.splitlines())
    nbformat.write(nb, notebook)
    lines = sum(written.values())
    assert len(written) <= MAX_FILES and lines <= MAX_LINES, written
    said = re.search(r"wrote (\d+) files and (\d+) lines", (ROOT / "docs" / "AUTHORING.md").read_text())
    assert said and (int(said[1]), int(said[2])) == (len(written), lines), (written, lines)

    # 3. checked and released: nothing left (the grading `course check --grade` would add, reference full marks and
    # release 0, is the meta-tests' below)
    course(["sync", AID], copy)
    course(["release", AID], copy)
    out = course(["check", AID], copy).stdout
    assert f"{AID}: ok" in out, out

    # 4. the meta-tests, on the new assignment: reference full marks, the release 0, planted mistakes on their own
    # items, correct alternatives, training
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_grading.py", "-k", AID, "-q", "-x",
                           "-p", "no:cacheprovider", "-n", "0"], cwd=copy, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed[1]) >= 10, proc.stdout[-2000:]
