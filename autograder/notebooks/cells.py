"""Find a submission's code by nbgrader cell metadata (setup and graded cells), else by the names a cell defines."""
import ast
import json
from dataclasses import dataclass, field
from pathlib import Path

MAX_NOTEBOOK_BYTES = 50 * 1024 * 1024


@dataclass
class Cell:
    grade_id: str
    source: str
    index: int        # position in the notebook, for messages only


@dataclass
class StudentCode:
    """What the grader loads from one notebook: setup and graded cells in notebook order."""
    cells: list = field(default_factory=list)
    problems: dict = field(default_factory=dict)   # item -> why its cell is unusable
    notes: list = field(default_factory=list)      # things a TA should know (duplicates, renamed file, ...)
    error: str = ""                                # the notebook as a whole could not be read

    def source_of(self, item):
        for cell in reversed(self.cells):
            if cell.grade_id == item:
                return cell.source
        return None


def nbgrader_meta(cell):
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


def cell_source(cell):
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def read_notebook(path):
    """The notebook's JSON, or an error message a student can act on."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_NOTEBOOK_BYTES:
            return None, (f"{path.name} is {path.stat().st_size // 2**20} MB; "
                          f"notebooks over {MAX_NOTEBOOK_BYTES // 2**20} MB are not graded")
        nb = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError) as e:
        if path.is_file() and path.suffix != ".ipynb":  # a .py export or a screenshot: say what to send instead
            return None, (f"{path.name} is not a notebook: submit the .ipynb file itself (in Jupyter or Colab: "
                          f"File > Download > Download .ipynb)")
        return None, f"{path.name} is not a readable notebook ({type(e).__name__}: {str(e)[:200]})"
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        return None, f"{path.name} is not a Jupyter notebook (no list of cells)"
    return nb, ""


def extract(nb, items, setup_prefix="setup_"):
    """The setup and graded code cells of `nb`, tolerant of reordered, added and duplicated cells."""
    code = StudentCode()
    seen = {}
    for index, cell in enumerate(nb.get("cells", [])):
        if not isinstance(cell, dict):
            continue
        grade_id = str(nbgrader_meta(cell).get("grade_id", ""))
        if not (grade_id in items or grade_id.startswith(setup_prefix)):
            continue
        if cell.get("cell_type") != "code":
            code.problems[grade_id] = f"the cell for '{grade_id}' is a {cell.get('cell_type')} cell, not a code cell"
            continue
        if grade_id in seen:
            code.notes.append(f"'{grade_id}' appears in cells {seen[grade_id]} and {index}; the later one is graded, "
                              f"as a notebook run top to bottom would define it")
        seen[grade_id] = index
        code.cells.append(Cell(grade_id, cell_source(cell), index))
    for item in items:
        if item in seen or item in code.problems:
            continue
        found = last_definition(nb.get("cells", []), item, setup_prefix)
        if found is None:
            code.problems[item] = (f"no cell with grade_id '{item}' in the notebook, and no cell defines '{item}' "
                                   f"(was the graded cell deleted?)")
            continue
        index, source = found
        code.notes.append(by_name_note(item, index))
        at = next((k for k, c in enumerate(code.cells) if c.index > index), len(code.cells))  # keep notebook order
        code.cells.insert(at, Cell(item, source, index))
    return code


def by_name_note(item, index):
    """The note for an item found by the name it defines (course grade and the nbgrader repair say the same)."""
    return (f"no cell carried the nbgrader metadata of '{item}'; cell {index}, the last that "
            f"defines '{item}', was graded")


def last_definition(cells, name, setup_prefix="setup_"):
    """(index, source) of the last code cell defining `name` at top level, as a run top to bottom leaves it; None."""
    found = None
    for index, cell in enumerate(cells):
        if (isinstance(cell, dict) and cell.get("cell_type") == "code"
                and not str(nbgrader_meta(cell).get("grade_id", "")).startswith(setup_prefix)
                and name in defined_names(cell_source(cell))):
            found = (index, cell_source(cell))
    return found


def load_student_code(path, items):
    """StudentCode for the notebook at `path` (a missing or broken file gives `error`)."""
    nb, error = read_notebook(path)
    if nb is None:
        return StudentCode(error=error, problems={i: error for i in items})
    return extract(nb, items)


def parse(source):
    """The cell's syntax tree, with %magics and !shell lines read as Python; None if it does not parse."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        source = TransformerManager().transform_cell(source)
    except ImportError:
        pass
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def defined_names(source):
    """The names a cell binds at top level: def, class, assignment and import targets (empty if it does not parse).

    Bodies of functions and classes do not count (their names are local); top-level if/for/with/try blocks do.
    """
    tree = parse(source)
    names = set()

    def targets(node):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                targets(elt)
        elif isinstance(node, ast.Starred):
            targets(node.value)

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                continue  # what its body binds is local to it
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    targets(target)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
                targets(node.target)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name.split(".")[0]) for a in node.names if a.name != "*")
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
            for block in ("body", "orelse", "finalbody"):  # if, for, while, with, try run at top level too
                visit(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                visit(handler.body)

    visit(tree.body if tree is not None else [])
    return names


def fingerprint(source):
    """What the cell's code does, for caching: comments, blank lines and layout do not count."""
    tree = parse(source)
    return ast.dump(tree) if tree is not None else source


def names_used(source, bare=True):
    """Every bare name and attribute name in `source` (for the from-scratch rule); None if it does not parse.
    `bare=False`: the attribute names and imported names only."""
    tree = parse(source)
    if tree is None:
        return None
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and bare:
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.update(node.name.split(".") + ([node.asname] if node.asname else []))
    return names


def restore_setup_cells(code, released):
    """Setup cells are locked: grade with the released version of each, whatever the submission did to them."""
    if code.error or not Path(released).exists():
        return
    trusted = {c.grade_id: c.source for c in load_student_code(released, []).cells}
    for cell in code.cells:
        if cell.grade_id in trusted and cell.source != trusted[cell.grade_id]:
            code.notes.append(f"setup cell '{cell.grade_id}' was changed in the submission; "
                              "the released version was used")
            cell.source = trusted[cell.grade_id]
    previous = None  # a missing setup cell goes back right after the setup cell that precedes it in the release
    for gid, source in trusted.items():
        at = next((k for k, c in enumerate(code.cells) if c.grade_id == gid), None)
        if at is None:
            code.notes.append(f"setup cell '{gid}' was missing from the submission; the released version was used")
            at = 0 if previous is None else next(k for k, c in enumerate(code.cells) if c.grade_id == previous) + 1
            code.cells.insert(at, Cell(gid, source, -1))
        previous = gid
    # a cell posing as a setup cell that the release does not have is the student's code, not setup
    code.cells = [c for c in code.cells if not c.grade_id.startswith("setup_") or c.grade_id in trusted]

