"""One source of truth: graded cells are written from solutions/, solved or stubbed, and the release verified."""
import ast
import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import nbformat

from autograder.course.config import course_root, load_course
from autograder.errors import ConfigError
from autograder.notebooks.cells import nbgrader_meta
from autograder.notebooks.facts import stale_facts, sync_facts
from autograder.notebooks.kernel_client import kernel_start_lock
from autograder.notebooks.rules import sync_rules

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
PUBLIC_CHECKS = Path(__file__).resolve().with_name("public_checks.py")  # the setup cell `setup_checks`: the package's


def points_said(item):
    """The pattern of a test cell's `PublicChecks('item', points=P`: what the cell tells students (group 2: P)."""
    return re.compile(r"PublicChecks\(\s*(['\"])" + re.escape(item) + r"\1\s*,\s*points=([0-9.]+)")


class ReleaseError(Exception):
    """The release is unsafe or incomplete; the message lists every problem."""


def _has_docstring(node):
    return (node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
            and isinstance(node.body[0].value.value, str))


def _regions(node, lines, solved, out, indent=""):
    """Lines of a def/class with each function body replaced by a (filled or empty) solution region."""
    header_end = node.body[0].end_lineno if _has_docstring(node) else node.body[0].lineno - 1
    start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
    out.extend(lines[start - 1:header_end])
    if isinstance(node, ast.ClassDef):
        cursor = header_end
        for stmt in node.body[1 if _has_docstring(node) else 0:]:
            stmt_start = stmt.decorator_list[0].lineno if getattr(stmt, "decorator_list", None) else stmt.lineno
            out.extend(lines[cursor:stmt_start - 1])
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                _regions(stmt, lines, solved, out)
            else:
                out.extend(lines[stmt_start - 1:stmt.end_lineno])
            cursor = stmt.end_lineno
        return
    body = lines[header_end:node.end_lineno]
    pad = " " * (node.col_offset + 4)
    out.append(pad + BEGIN)
    if solved:
        out.extend(body)
    out.append(pad + END)


def item_cell(aid, item, solved):
    """The graded cell for `item`: signature and docstring from solutions/, the body solved or left empty."""
    module = importlib.import_module(f"solutions.{aid}")
    obj = getattr(module, item)
    source = textwrap.dedent(inspect.getsource(obj))
    lines = source.splitlines()
    node = ast.parse(source).body[0]
    out = []
    _regions(node, lines, solved, out)
    return "\n".join(out).rstrip() + "\n"


def notebook_path(aid, root=None):
    """The nbgrader source notebook of `aid` in the course (course_root() unless `root` is given)."""
    return Path(root or course_root()) / "assignments" / aid / f"{aid}.ipynb"


def graded_cells(nb, items):
    for cell in nb.cells:
        gid = nbgrader_meta(cell).get("grade_id")
        if gid in items and cell.cell_type == "code":
            yield gid, cell


def sync(aid, write=True):
    """Rewrite the source notebook's graded cells from solutions/, test-cell points and written answers' points from
    course.yaml, its rules cell (notebooks/rules.py) and its facts (notebooks/facts.py); the cells that changed."""
    assignment = load_course().assignment(aid)
    path = notebook_path(aid)
    nb = nbformat.read(path, as_version=4)
    changed = []
    for gid, cell in graded_cells(nb, assignment.items):
        text = item_cell(aid, gid, solved=False).rstrip("\n")
        if cell.source != text:
            cell.source = text
            changed.append(gid)
    changed += sync_written(aid, nb)
    changed += sync_rules(aid, nb)
    changed += sync_facts(aid, nb)
    for cell in nb.cells:
        meta = nbgrader_meta(cell)
        gid = meta.get("grade_id", "")
        if gid == "setup_checks" and cell.source != PUBLIC_CHECKS.read_text().rstrip("\n"):
            cell.source = PUBLIC_CHECKS.read_text().rstrip("\n")
            changed.append(gid)
        if gid.startswith("test_") and gid[5:] in assignment.items:
            points = assignment.item_points(gid[5:])
            text = points_said(gid[5:]).sub(f"PublicChecks('{gid[5:]}', points={points:g}", cell.source)
            if meta.get("points") != points or text != cell.source:
                meta["points"], cell.source = points, text
                changed.append(gid)
    if changed and write:
        nbformat.write(nb, path)
    return changed


def written_line(points):
    """What the question tells students of its written answer's points (the last line of the question's cell)."""
    if not points:
        return "*Written answer: not graded (0 points); your TA may still read it.*"
    return f"*Written answer: {points:g} point{'' if points == 1 else 's'}, graded by your TA.*"


WRITTEN_LINE = re.compile(r"^\*Written answer: [^\n]*\*$", re.M)


def written_cells(nb):
    """(index, cell) of every written answer: a markdown cell whose grade_id starts with answer_."""
    return [(i, cell) for i, cell in enumerate(nb.cells)
            if cell.cell_type == "markdown" and nbgrader_meta(cell).get("grade_id", "").startswith("answer_")]


def question_cell(nb, index):
    """The question a written answer answers: the nearest markdown cell above it that is not an nbgrader cell."""
    for cell in reversed(nb.cells[:index]):
        if cell.cell_type == "markdown" and not nbgrader_meta(cell):
            return cell
    return None


def sync_written(aid, nb):
    """Each written answer made a manually graded cell worth course.yaml's points, and its question's last line
    saying them; the grade_ids that changed. An answer cell course.yaml does not list, or the reverse, is an error."""
    written = load_course().assignment(aid).written
    cells = written_cells(nb)
    found = [nbgrader_meta(cell)["grade_id"] for _, cell in cells]
    unlisted, missing = sorted(set(found) - set(written)), sorted(set(written) - set(found))
    if unlisted or missing:
        raise ConfigError("; ".join(filter(None, [
            unlisted and f"{aid}: written answers without points in course.yaml's `written:`: {', '.join(unlisted)}",
            missing and f"{aid}: course.yaml's `written:` names cells the notebook does not have: {', '.join(missing)}"
        ])))
    changed = []
    for index, cell in cells:
        meta = nbgrader_meta(cell)
        points = written[meta["grade_id"]].points
        question = question_cell(nb, index)
        if question is None:
            raise ConfigError(f"{aid}: written answer '{meta['grade_id']}' has no question (a markdown cell) above it")
        line = written_line(points)
        text = WRITTEN_LINE.sub(line, question.source) if WRITTEN_LINE.search(question.source) \
            else question.source.rstrip("\n") + "\n\n" + line
        wanted = {"grade": True, "solution": True, "points": points, "locked": False}
        if text != question.source or any(meta.get(k) != v for k, v in wanted.items()):
            meta.update(wanted)
            question.source = text
            changed.append(meta["grade_id"])
    return changed


def solve(aid, out_dir=None):
    """The instructor's solution notebook: the source with every region filled from solutions/."""
    assignment = load_course().assignment(aid)
    nb = nbformat.read(notebook_path(aid), as_version=4)
    for gid, cell in graded_cells(nb, assignment.items):
        cell.source = item_cell(aid, gid, solved=True).rstrip("\n")
    out_dir = Path(out_dir or course_root() / "build" / "solved" / aid)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{aid}.ipynb"
    nbformat.write(nb, path)
    return path


def execute(path, timeout=900, allow_errors=False, env=None):
    """Run a notebook top to bottom in a real Jupyter kernel; returns the executed notebook."""
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
                            resources={"metadata": {"path": str(Path(path).parent)}})
    # the offline MNIST folder is the course's setting; the notebooks read it from this variable
    env = {**os.environ, "MPLBACKEND": "Agg", **(env or {})}
    env.setdefault("COURSE_MNIST_DIR", str(load_course().mnist_dir))
    # jupyter_client picks free ports, then the kernel binds them: two kernels starting at once on this machine
    # (parallel tests, two instructors) can pick the same ports and one waits on the other's replies
    # (jupyter_client#487). So kernels start one at a time, each until it answers; execute() then reuses it.
    client.km = client.create_kernel_manager()
    # its waits re-poll: a zmq poll can miss the wake-up for a reply already on the socket (kernel_client.py)
    client.km.client_class = "autograder.notebooks.kernel_client.RepollingKernelClient"
    with kernel_start_lock():  # shared by every user of the machine: the ports are the machine's
        run_sync(client.async_start_new_kernel)(env=env)
        run_sync(client.async_start_new_kernel_client)()
    client.execute()
    return nb


# The scratch course folder runs the course's own nbgrader_config.py (one set of nbgrader settings), with
# its folders moved into the scratch folder; the gradebook is the course's (registered for autograde) or a
# scratch one when the release goes elsewhere (a test's or the demo's copy).
NBGRADER_CONFIG = """
course_config = {repo_config!r}  # run as nbgrader runs it, with its own __file__: it reads course.yaml beside it
exec(compile(open(course_config).read(), course_config, "exec"), {{**globals(), "__file__": course_config}})
c.CourseDirectory.root = {root!r}
c.CourseDirectory.source_directory = "source"
c.CourseDirectory.release_directory = "release"
c.CourseDirectory.db_url = {db_url!r}
"""


def nbgrader_config(root=None):
    """The course's nbgrader_config.py (nbgrader reads it from the folder it runs in: the course root)."""
    path = Path(root or course_root()) / "nbgrader_config.py"
    if not path.is_file():
        raise ConfigError(f"{path} is missing: it holds nbgrader's settings for the course (copy it from the course's "
                          f"repository)")
    return path


def gradebook_url(root=None):
    """The gradebook that the course's nbgrader_config.py names (where `nbgrader autograde` run there looks)."""
    from traitlets.config.loader import PyFileConfigLoader
    path = nbgrader_config(root)
    return PyFileConfigLoader(path.name, path=str(path.parent)).load_config().CourseDirectory.db_url


def run_nbgrader(args, cwd):
    """`nbgrader ARGS` with this environment's tools on PATH (nbgrader shells out to alembic)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([sys.executable, "-m", "nbgrader", *args, "--log-level=WARN"], cwd=cwd, env=env,
                          capture_output=True, text=True)


def generate(aids, out_root, db_url=None):
    """nbgrader generate_assignment on the source notebooks in a scratch course folder; its release/ to out_root.

    With `db_url` the assignments (their cells, points and checksums) are registered in that gradebook, which is
    what `nbgrader autograde` needs; without, the scratch folder's own gradebook is thrown away.
    """
    work = Path(tempfile.mkdtemp(prefix="course-release-"))
    (work / "nbgrader_config.py").write_text(NBGRADER_CONFIG.format(
        repo_config=str(nbgrader_config()), root=str(work), db_url=db_url or f"sqlite:///{work}/gradebook.db"))
    for aid in aids:
        (work / "source" / aid).mkdir(parents=True)
        shutil.copy(notebook_path(aid), work / "source" / aid / f"{aid}.ipynb")
        proc = run_nbgrader(["generate_assignment", aid, "--force"], cwd=work)
        if proc.returncode != 0:
            raise ReleaseError(f"nbgrader generate_assignment {aid} failed:\n"
                               f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    for aid in aids:
        dest = Path(out_root) / aid
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(work / "release" / aid, dest)
    shutil.rmtree(work, ignore_errors=True)


def release(aids=None, out_root=None):
    """Sync, generate and verify the student release; raises ReleaseError listing every problem.

    The course's own release (no out_root: release/ at the course root) also registers the assignments in its
    nbgrader gradebook.
    """
    course = load_course()
    aids = list(aids or course.assignments)
    for aid in aids:
        sync(aid)
    db_url = None if out_root else gradebook_url()
    out_root = Path(out_root or course_root() / "release")
    generate(aids, out_root, db_url)
    if db_url:
        set_due_dates(aids, db_url)
    problems = []
    for aid in aids:
        problems += verify(aid, out_root / aid)
    if problems:
        raise ReleaseError("the release is not safe to publish:\n  " + "\n  ".join(problems))
    return [out_root / aid / f"{aid}.ipynb" for aid in aids]


def set_due_dates(aids, db_url):
    """Each assignment's due time from course.yaml in nbgrader's gradebook (UTC, as nbgrader keeps it; none where
    course.yaml has none), so that `nbgrader autograde` counts the same seconds late as `course grade`."""
    from datetime import UTC

    from nbgrader.api import Gradebook
    course = load_course()
    with Gradebook(db_url, course.exchange.course_id) as gb:  # the course id nbgrader's own commands give it
        for aid in aids:
            due = course.assignment(aid).due
            gb.update_or_create_assignment(aid, duedate=due.astimezone(UTC).replace(tzinfo=None) if due else None)


def solution_lines(aid):
    """Significant lines of the reference bodies that the source notebook does not show anywhere else."""
    assignment = load_course().assignment(aid)
    source = nbformat.read(notebook_path(aid), as_version=4)
    public = {line.strip() for cell in source.cells if nbgrader_meta(cell).get("grade_id") not in assignment.items
              for line in cell.source.splitlines()}
    lines = set()
    for item in assignment.items:
        solved = item_cell(aid, item, solved=True).splitlines()
        stub = set(item_cell(aid, item, solved=False).splitlines())
        for line in solved:
            text = line.strip()
            if line not in stub and len(text) >= 12 and not text.startswith("#") and text not in public:
                lines.add(text)
    return lines


def release_behind(aid, folder):
    """The source notebook's cells that the release at `folder` does not show as they are now (the release was
    made before a change to the source): '' when it is up to date, else a line naming them. Cells are matched by
    id, which nbgrader keeps; a solution cell is compared by nothing (its stub is verify's), a test cell up to its
    hidden region, which nbgrader drops."""
    source = nbformat.read(notebook_path(aid), as_version=4)
    released = {cell.get("id"): cell for cell in nbformat.read(Path(folder) / f"{aid}.ipynb", as_version=4).cells}
    behind = []
    for index, cell in enumerate(source.cells):
        shown = released.get(cell.get("id"))
        if nbgrader_meta(cell).get("solution") and shown is not None:
            continue
        if shown is None or shown.source.rstrip() != cell.source.split(HIDDEN_BEGIN)[0].rstrip():
            behind.append(nbgrader_meta(cell).get("grade_id") or cell.metadata.get("course", {}).get("generated")
                          or f"cell {index}")
    if not behind:
        return ""
    return (f"{aid}: the release is older than the source notebook ({', '.join(behind[:6])}"
            f"{f' and {len(behind) - 6} more' if len(behind) > 6 else ''})")


def verify(aid, folder):
    """Problems with one assignment's release folder (empty list: safe)."""
    assignment = load_course().assignment(aid)
    folder = Path(folder)
    problems = []
    expected = f"{aid}.ipynb"
    extra = sorted(p.name for p in folder.iterdir() if p.name != expected) if folder.is_dir() else []
    if extra:
        problems.append(f"{aid}: extra files in the release: {', '.join(extra)}")
    path = folder / expected
    if not path.exists():
        return problems + [f"{aid}: {expected} is missing from the release"]
    nb = nbformat.read(path, as_version=4)
    secrets = solution_lines(aid)
    seen = {}
    for index, cell in enumerate(nb.cells):
        meta = nbgrader_meta(cell)
        gid = meta.get("grade_id")
        if gid:
            if gid in seen:
                problems.append(f"{aid}: grade_id '{gid}' is used by cells {seen[gid]} and {index}")
            seen[gid] = index
        text = cell.source
        for line in text.splitlines():
            if line.strip() in secrets:
                problems.append(f"{aid}: cell {index} ({gid or cell.cell_type}) contains a line of the reference "
                                f"solution: {line.strip()[:80]!r}")
        if cell.cell_type == "markdown":
            problems += [f"{aid}: cell {index} says {said}" for said in stale_facts(assignment, text)]
        if HIDDEN_BEGIN in text or HIDDEN_END in text or BEGIN in text:
            problems.append(f"{aid}: cell {index} ({gid}) still has a solution or hidden-test region")
        if re.search(r"\b(import|from)\s+(solutions|autograder)\b|solutions/|autograder/", text):
            problems.append(f"{aid}: cell {index} ({gid or cell.cell_type}) refers to the hidden solutions or the "
                            f"autograder's internals")
    for item in assignment.items:
        if item not in seen:
            problems.append(f"{aid}: graded item '{item}' has no stub cell")
        elif "NotImplementedError" not in nb.cells[seen[item]].source:
            problems.append(f"{aid}: the cell of '{item}' is not a stub (no NotImplementedError)")
        test = f"test_{item}"
        if test not in seen:
            problems.append(f"{aid}: graded item '{item}' has no test cell '{test}'")
        else:
            points = nbgrader_meta(nb.cells[seen[test]]).get("points")
            if points != assignment.item_points(item):
                problems.append(f"{aid}: '{test}' is worth {points} points, course.yaml says "
                                f"{assignment.item_points(item)}")
            said = [float(m.group(2)) for m in points_said(item).finditer(nb.cells[seen[test]].source)]
            if said != [assignment.item_points(item)]:
                problems.append(f"{aid}: '{test}' tells students {said or 'no'} points "
                                f"(PublicChecks('{item}', points=...)), course.yaml says "
                                f"{assignment.item_points(item)}")
    written = assignment.written
    for index, cell in written_cells(nb):
        gid = nbgrader_meta(cell)["grade_id"]
        points, question = nbgrader_meta(cell).get("points"), question_cell(nb, index)
        if gid not in written:
            problems.append(f"{aid}: written answer '{gid}' is not in course.yaml's `written:` (run `course sync`)")
        elif points != written[gid].points or not nbgrader_meta(cell).get("grade"):
            problems.append(f"{aid}: written answer '{gid}' is worth {points} points, course.yaml says "
                            f"{written[gid].points:g}")
        elif question is None or written_line(points) not in question.source:
            problems.append(f"{aid}: the question of '{gid}' does not tell students its {points:g} points "
                            f"(run `course sync`)")
    for gid in sorted(set(written) - seen.keys()):
        problems.append(f"{aid}: course.yaml's written answer '{gid}' has no cell in the release")
    if "setup_checks" not in seen or nb.cells[seen["setup_checks"]].source != PUBLIC_CHECKS.read_text().rstrip("\n"):
        problems.append(f"{aid}: the setup cell 'setup_checks' is not the course's public-check helper "
                        f"(run `course sync`)")
    return problems

