"""The experiment cache: one JSON file per training run, keyed by a hash of everything that can change it.

Thresholds are never cached, only what a run measured: they are judged again on every read, so editing
course.yaml needs no cache flush. COURSE_NO_CACHE=1 turns reading off (benchmarks, fresh measurements).
"""
import hashlib
import json
import os
import threading
from pathlib import Path

from autograder.config import ROOT

CACHE = ROOT / ".grader" / "cache"


def grader_digest(folder=ROOT / "autograder"):
    """One hash of the grader's own code (plugin, sandbox, harnesses, ...): any edit may change a training run."""
    h = hashlib.sha256()
    for path in sorted(Path(folder).rglob("*.py")):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def experiment_key(inputs):
    """The cache key of one experiment run: a hash of experiments.experiment_inputs(...)."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def cache_read(key):
    """A cached [metrics, failures], or None (missing, unreadable, or the cache turned off)."""
    if os.environ.get("COURSE_NO_CACHE") == "1":
        return None
    try:
        return json.loads((CACHE / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


def atomic_write(path, text):
    """Write whole or not at all: graders running side by side may read the same file."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}-{threading.get_ident()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def cache_write(key, value):
    CACHE.mkdir(parents=True, exist_ok=True)
    atomic_write(CACHE / f"{key}.json", json.dumps(value))
