"""Which files make an assignment's harness, read as text (no torch): what the sandbox loads and what it trains on.

Light on purpose: the coordinator of a batch says which MNIST it grades with (data_source_of) without importing
torch, which only the workers that grade import.
"""
import ast
import functools
import hashlib
import os
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


def data_source_of(aid):
    """Which training data the assignment's harness reads, when that can vary: MNIST's kind (download, IDX folder or
    test split alone) and a sha256 of the IDX files read, never the folder they are in, so that a copy of the course
    (a clone, a TA's checkout, the Gradescope zip's copy of its files) keys its runs as the original does and finds
    them in a shared cache ('' for the harnesses that make their own data)."""
    if "load_mnist" not in harness_sources(aid)[aid]:
        return ""
    from autograder.course.mnist import data_source, source_files
    kind, folder = data_source()
    return f"mnist {kind} {files_digest(source_files(kind, folder))}"


_digests: dict = {}  # (path, size, mtime) -> the file's sha256: each file read once per process while unchanged


def files_digest(paths):
    """One sha256 of the files' contents, each with its name (a file in another split's place is other data)."""
    h = hashlib.sha256()
    for path in paths:
        h.update(Path(path).name.encode() + b"\0" + file_digest(path).encode())
    return h.hexdigest()


def file_digest(path):
    """sha256 of a file's bytes, memoized by its path, size and modification time (a replaced file is read again)."""
    stat = os.stat(path)
    key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _digests:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _digests[key] = h.hexdigest()
    return _digests[key]
