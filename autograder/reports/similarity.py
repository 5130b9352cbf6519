"""Similar submissions: graded cells that are one program once names, comments and literals are stripped.

For a TA to look at in the class report; nothing here changes a score. Code that is unwritten (a function that
only raises NotImplementedError, as released) is left out, and code shorter than `min_nodes` is not compared:
short items come out the same by necessity.
"""
import ast
import hashlib
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

from autograder.notebooks.cells import load_student_code, parse

LITERAL = ast.Constant(value="#")  # every literal, f-strings and negative numbers included, becomes this one


@dataclass(frozen=True)
class Program:
    """One item's code, normalised: `key` is equal for the same program; `size` counts its syntax nodes."""
    key: str
    size: int


@dataclass(frozen=True)
class Group:
    """Submissions whose code is the same program for each of `items` (in the assignment's order)."""
    names: tuple
    items: tuple


class Normalise(ast.NodeTransformer):
    """Names renamed in order of first use (v0, v1, ...), every literal made one, docstrings and unwritten code
    dropped (comments are not in the syntax tree). Attribute names (`.softmax`, `.transpose`) and imported modules
    stay: they are what the program calls."""

    def __init__(self):
        self.names = {}

    def rename(self, name):
        return None if name is None else self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node):
        return ast.Name(id=self.rename(node.id), ctx=node.ctx)

    def visit_arg(self, node):
        self.generic_visit(node)
        node.arg = self.rename(node.arg)
        return node

    def visit_keyword(self, node):
        self.generic_visit(node)
        node.arg = self.rename(node.arg)
        return node

    def visit_alias(self, node):
        node.asname = self.rename(node.asname)
        return node

    def visit_ExceptHandler(self, node):
        node.name = self.rename(node.name)
        return self.generic_visit(node)

    def visit_Global(self, node):
        node.names = [self.rename(n) for n in node.names]
        return node

    visit_Nonlocal = visit_Global

    def visit_Constant(self, node):
        return LITERAL

    def visit_JoinedStr(self, node):
        return LITERAL

    def visit_UnaryOp(self, node):
        """-1 is a literal as 1 is (Python parses it as minus 1)."""
        if isinstance(node.op, (ast.USub, ast.UAdd)) and isinstance(node.operand, ast.Constant):
            return LITERAL
        return self.generic_visit(node)

    def define(self, node):
        node.name = self.rename(node.name)
        node.body = [s for s in node.body if not is_docstring(s)]
        if isinstance(node, ast.ClassDef):
            node.body = [s for s in node.body if not is_unwritten(s)]
        return self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = define

    def visit_Module(self, node):
        node.body = [s for s in node.body if not is_docstring(s) and not is_unwritten(s)]
        return self.generic_visit(node)


def is_docstring(stmt):
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def is_unwritten(stmt):
    """A function whose body (docstring, `pass` and `...` aside) is empty or only `raise NotImplementedError`: the
    release's stub, or a stub emptied."""
    if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    body = [s for s in stmt.body if not (is_docstring(s) or isinstance(s, ast.Pass) or is_ellipsis(s))]
    return not body or (len(body) == 1 and isinstance(body[0], ast.Raise)
                        and raised_name(body[0]) == "NotImplementedError")


def is_ellipsis(stmt):
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and stmt.value.value is Ellipsis


def raised_name(node):
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return exc.id if isinstance(exc, ast.Name) else None


def program(source):
    """The cell's Program, or None when it does not parse."""
    tree = parse(source)
    if tree is None:
        return None
    tree = Normalise().visit(tree)
    dump = ast.dump(tree, annotate_fields=False)
    return Program(hashlib.sha256(dump.encode()).hexdigest(), sum(1 for _ in ast.walk(tree)))


def programs(notebook, items, released):
    """item -> Program for each graded cell of the notebook that parses and is not the released cell's code
    (`released`: item -> Program of the release)."""
    code = load_student_code(notebook, items)
    out = {}
    for item in items:
        source = code.source_of(item) if item not in code.problems else None
        found = program(source) if source is not None else None
        if found is not None and (item not in released or found.key != released[item].key):
            out[item] = found
    return out


def released_programs(path, items):
    """item -> Program of the released notebook's cells (the stubs); {} when there is no release to compare with."""
    return programs(path, items, {}) if Path(path).is_file() else {}


def graded_notebook(result):
    """The notebook a saved result graded, from its `extra_data.grading` (batch.grade_one records the path and the
    sha256 of its bytes): (path, '') or (None, why it cannot be read as graded)."""
    grading = (result.get("extra_data") or {}).get("grading") or {}
    path = Path(grading["source"]) if grading.get("source") else None
    if path is None:
        return None, "the result records no notebook (graded without --results-dir)"
    if not path.is_file():
        return None, "the notebook the result records is not there (moved, or another machine's path)"
    # batch.file_digest's hash; not imported from there, so that the report needs none of the grader's imports
    if hashlib.sha256(path.read_bytes()).hexdigest() != grading.get("submission"):
        return None, "the notebook the result records changed since it was graded"
    return path, ""


def compare(rows, items, released, min_nodes, min_items):
    """(groups, skipped) for one assignment's (name, result) rows: skipped is why -> the names whose code was not
    read for that reason."""
    found, skipped = {}, {}
    for name, result in rows:
        path, why = graded_notebook(result)
        if path is None:
            skipped.setdefault(why, []).append(name)
        else:
            found[name] = programs(path, items, released)
    return similar_groups(found, items, min_nodes, min_items), skipped


def similar_groups(found, items, min_nodes, min_items):
    """Groups of submissions that share at least `min_items` items of at least `min_nodes` nodes each.

    found: name -> item -> Program. Pairs sharing exactly the same items are merged into one group (sameness per
    item is transitive, so a group's members are pairwise the same on its items); larger shared sets first.
    """
    shared = {}  # (a, b) -> the items on which a and b are the same program
    for item in items:
        alike = {}
        for name in sorted(found):
            if item in found[name] and found[name][item].size >= min_nodes:
                alike.setdefault(found[name][item].key, []).append(name)
        for names in alike.values():
            for pair in combinations(names, 2):
                shared.setdefault(pair, []).append(item)
    by_items = {}
    for pair, same in shared.items():
        if len(same) >= min_items:
            by_items.setdefault(tuple(same), []).append(pair)
    groups = [Group(tuple(sorted(names)), same) for same, pairs in by_items.items() for names in components(pairs)]
    return sorted(groups, key=lambda g: (-len(g.items), g.names))


def components(pairs):
    """The connected components of an undirected graph given by its edges, each a set of nodes."""
    groups = []
    for a, b in pairs:
        touching = [g for g in groups if a in g or b in g]
        merged = set().union({a, b}, *touching)
        groups = [g for g in groups if g not in touching] + [merged]
    return groups


def item_ranges(numbers):
    """'3-5, 8' from [3, 4, 5, 8]."""
    runs = []
    for n in sorted(numbers):
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)
