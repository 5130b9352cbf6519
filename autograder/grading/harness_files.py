"""Which files make an assignment's harness, read as text (no torch): what the sandbox loads and what it trains on.

Light on purpose: the coordinator of a batch says which MNIST it grades with (data_source_of) without importing
torch, which only the workers that grade import.
"""
import ast
import functools
from pathlib import Path

from autograder.grading.cache import PACKAGE


def harness_sources(aid, package=PACKAGE):
    """{module name: source} of what the sandbox loads as the assignment's harness, in load order: the harness
    modules it imports (`from .training import ...`) before it, its own (named by the assignment's id) last."""
    sources = {}

    def add(name):
        if name in sources:
            return
        source = (Path(package) / "harness" / f"{name}.py").read_text()
        for module in harness_imports(source):
            add(module)
        sources[name] = source
    add(aid)
    return sources


@functools.lru_cache(maxsize=64)
def harness_imports(source):
    """The harness modules a harness module's source imports (`from .training import ...`), in order."""
    return [node.module for node in ast.parse(source).body if isinstance(node, ast.ImportFrom) and node.level == 1]


def data_source_of(aid, named_folder=None):
    """Where the assignment's training data comes from, when that can vary: MNIST's download, IDX folder or test
    split alone ('' for the harnesses that make their own data). `named_folder`: the folder to name instead of the
    one read (where a copy of it will be read: the Gradescope zip's)."""
    if "load_mnist" not in harness_sources(aid)[aid]:
        return ""
    from autograder.course.mnist import data_source
    kind, folder = data_source()
    return f"mnist {kind} {named_folder or folder}"
