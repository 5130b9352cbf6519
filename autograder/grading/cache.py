"""The experiment cache: one JSON file per training run, keyed by a hash of everything that can change it.

Thresholds are never cached, only what a run measured: they are judged again on every read, so editing
course.yaml needs no cache flush. COURSE_NO_CACHE=1 turns it off, reading and writing (benchmarks, fresh
measurements). A run is stored in the shared cache folder when one is set ($COURSE_CACHE_DIR, else course.yaml's
`cache_dir`: a TA team's or a cluster's folder on a shared filesystem, so that a run trained by one is trained by
none of the others), else in the course's `.grader/cache` when the user can write there, else in the user's own
cache folder (a TA who does not own the checkout, a read-only one): the first of them that takes it. It is read
from all three, and from the course's `.grader/curves` (SHIPPED), which is read and never written: `course export
gradescope` puts the reference's validation curves there, so that a fresh container per submission trains none. A
cache that cannot be written costs the next run its training, never this run's result: cache_write says so and
returns. Beside the runs, the folder's memo/ keeps each module's code fingerprint by its source's hash
(FINGERPRINTS): a function of the text alone.
"""
import ast
import contextlib
import functools
import hashlib
import json
import os
import platform
import sys
import threading
from pathlib import Path

import platformdirs

from autograder.course.config import ROOT, course_root, load_course
from autograder.errors import ConfigError

PACKAGE = ROOT / "autograder"
SHIPPED = Path(".grader") / "curves"  # under the course: entries shipped with it, read and never written
SETTING = "COURSE_CACHE_DIR"  # environment variable: the shared cache folder; course.yaml's cache_dir is the default


# In a cache folder's memo/ (apart from the runs' entries, which are <key>.json at its top): sha256 of a module's
# source -> its code_fingerprint
FINGERPRINTS = Path("memo") / "fingerprints.json"
MEMO_ENTRIES = 4096  # past this many (edits add entries, none goes), the memo starts again
_memo, _memo_lock = None, threading.Lock()


def code_fingerprint(source):
    """sha256 of a module's code as Python runs it: its syntax tree without docstrings, so that editing a comment,
    a docstring or the layout keeps it. Memoized by the source's own sha256 (code_fingerprints)."""
    return code_fingerprints([source])[0]


def code_fingerprints(sources):
    """code_fingerprint of each source. Parsing and dumping a module's syntax tree is the grader identity's cost
    (0.3 CPU-s of each `course grade` process for the grading code's modules), and the result is a function of the
    source's text alone, so it is kept in the cache folder (FINGERPRINTS) by the text's sha256: a process parses
    only a module edited since the last one did. The cache off (COURSE_NO_CACHE=1), every process parses."""
    global _memo
    digests = [hashlib.sha256(source.encode()).hexdigest() for source in sources]
    with _memo_lock:
        if _memo is None:
            _memo = _read_memo()
        new = {d: _syntax_fingerprint(s) for d, s in zip(digests, sources, strict=True) if d not in _memo}
        _memo.update(new)
        if new and not cache_off():
            _write_memo(_memo if len(_memo) <= MEMO_ENTRIES else new)
        return [_memo[d] for d in digests]


def _read_memo():
    if cache_off():
        return {}
    for folder in cache_folders():
        try:
            memo = json.loads((folder / FINGERPRINTS).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(memo, dict):
            return {k: v for k, v in memo.items() if isinstance(v, str) and len(v) == 64}
    return {}


def _write_memo(memo):
    """The memo saved in the first cache folder that takes it; a folder that cannot be written costs the next
    process its parsing, nothing else (no warning: no result depends on it)."""
    for folder in cache_folders():
        try:
            (folder / FINGERPRINTS).parent.mkdir(parents=True, exist_ok=True)
            atomic_write(folder / FINGERPRINTS, json.dumps(memo))
            return
        except OSError:
            continue


@functools.lru_cache(maxsize=512)
def _syntax_fingerprint(source):
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


def code_digest(paths, package=PACKAGE):
    """One hash of the Python code at `paths` under `package` (a folder: every .py below it), by path and
    code_fingerprint."""
    files = []
    for name in paths:
        path = Path(package) / name
        files += [file for file in (sorted(path.rglob("*.py")) if path.is_dir() else [path])
                  if "__pycache__" not in file.parts]
    h = hashlib.sha256()
    for file, fingerprint in zip(files, code_fingerprints([file.read_text() for file in files]), strict=True):
        h.update(file.relative_to(package).as_posix().encode() + b"\0" + fingerprint.encode())
    return h.hexdigest()


def libraries():
    """The versions of what the code runs on: a new torch, NumPy or Python may change a figure."""
    import numpy
    import torch
    return {"torch": torch.__version__, "numpy": numpy.__version__, "python": platform.python_version()}


def experiment_key(inputs):
    """The cache key of one experiment run: a hash of experiments.experiment_inputs(...)."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def cache_off():
    return os.environ.get("COURSE_NO_CACHE") == "1"


def cache_folders():
    """Where runs are cached, first choice first: the shared folder (shared_folder) when one is set, the course's
    .grader/cache, then the user's cache folder."""
    folders = [folder] if (folder := shared_folder()) else []
    with contextlib.suppress(ConfigError):  # no course folder to hand: the user's folder still caches
        folders.append(course_root() / ".grader" / "cache")
    return folders + [Path(platformdirs.user_cache_dir("attention-course")) / "experiments"]


def shared_folder():
    """The cache folder several users or machines share, or None: $COURSE_CACHE_DIR (SETTING), else course.yaml's
    `cache_dir` (relative to course.yaml). Every key is free of where a course lives (its data by content:
    harness_files.data_source_of), so courses in different folders find each other's runs there."""
    if os.environ.get(SETTING):
        return Path(os.environ[SETTING]).expanduser()
    try:
        course = load_course()
    except (ConfigError, OSError):  # no course to hand, or one that does not load: none shared
        return None
    if not course.cache_dir:
        return None
    folder = Path(course.cache_dir).expanduser()
    return folder if folder.is_absolute() else (course.path.parent / folder).resolve()


def shipped_folders():
    """The course's read-only layer (SHIPPED), none when no course folder is to hand."""
    with contextlib.suppress(ConfigError):
        return [course_root() / SHIPPED]
    return []


def cache_read(key):
    """A cached entry (a run's [metrics, failures, run], a reference curve), or None (missing, unreadable, or the
    cache turned off): from the folders it is written to, then the shipped layer."""
    if cache_off():
        return None
    for folder in cache_folders() + shipped_folders():
        try:
            return json.loads((folder / f"{key}.json").read_text())
        except (OSError, ValueError):
            continue
    return None


def atomic_write(path, text):
    """Write whole or not at all: graders running side by side may read the same file."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}-{threading.get_ident()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # no half-written file left behind; the caller sees the first error
            tmp.unlink()
        raise


def cache_write(key, value):
    """Store one run's [metrics, failures]: '' once stored (or the cache is off), else the warning it printed."""
    if cache_off():
        return ""
    tried = []
    for folder in cache_folders():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write(folder / f"{key}.json", json.dumps(value))
            return ""
        except OSError as e:
            tried.append(f"{folder}: {e.strerror or e}")
    warning = f"the experiment cache could not be written ({'; '.join(tried)}): the next grading trains again"
    print(f"warning: {warning}", file=sys.stderr)
    return warning
