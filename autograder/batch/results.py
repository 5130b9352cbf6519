"""The results folder (`--results-dir`): one result per submission name, every path writing through here.

`course grade` on this machine's workers (batch/run.py), on a Dask cluster (batch/scheduler.py) and nbgrader's
parallel autograde read and write a submission's result only through `claimed(folder, name)`: under a lock, so that
runs sharing a folder grade each submission once. A saved result is reused only when it is the same grading: the
identity stored in its `extra_data.grading` (assignment, sha256 of the notebook's bytes, items requested,
grader_identity, batch/identity.py) must equal this run's; one whose grader differs in course.yaml's points alone is
scored again from its saved checks, running nothing (batch/rescore.py). An `--items` run into a folder holding the
submission's full result by the same grader merges those items into it; anything else is graded afresh.

Nothing is overwritten: a result replaced by a new grading is kept in `.history/<name>/<graded_at>.json`, and the new
result carries a summary of it (`extra_data.grading.previous`: when, by which grading, its score and each item's), so
that a regrade says whose grade moved (batch/changes.py) and the history stays; `extra_data.history` lists every
grading it replaced (when, the score, why it was replaced), which the student's feedback page shows.
"""
import fcntl
import json
import os
import sys
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from autograder.grading.cache import atomic_write

HISTORY = ".history"


@contextmanager
def claimed(results_dir, name):
    """`name`'s entry in the results folder, locked until the block ends: .saved, .store(...)."""
    out = result_path(results_dir, name)
    with result_lock(lock_path(out)):
        yield Entry(out)


class Entry:
    """One submission's place in the results folder, held under its lock (claimed)."""

    def __init__(self, out):
        self.out = out

    @property
    def saved(self):
        """The saved result, or {} (none, unreadable, or not a result)."""
        return read_result(self.out)

    def store(self, result, identity, items, notebook, parts=None):
        """(result, how) after saving a fresh result: merged into the saved one for an --items run by the same
        grader, else replacing it, the saved one kept in the history; a grader failure is not saved (the next run
        retries). `parts`: the grader's (batch/identity.py), kept beside the identity."""
        return stored(self.out, result, self.saved, identity, items, notebook, parts)

    def without_grading(self, identity, parts, aid, notebook):
        """(result, how) when the saved result serves without a sandbox: 'reused' when it is this grading,
        'rescored' when only course.yaml's points moved since (batch/rescore.py; stored as a grading is, the
        earlier result kept in the history); None when the submission is to be graded."""
        from autograder.batch.rescore import rescorable, rescored
        saved = self.saved
        if same_grading(saved, identity):
            return saved, "reused"
        if rescorable(saved, identity, parts) and (result := rescored(saved, aid)) is not None:
            return stored(self.out, result, saved, identity, None, notebook, parts)[0], "rescored"
        return None


def history(results_dir, name):
    """`name`'s earlier results, oldest first (what each regrade replaced)."""
    out = Path(results_dir) / f"{name}.json"
    folder = out.parent / HISTORY / out.stem
    return [r for p in sorted(folder.glob("*.json")) if (r := read_result(p))]


def saved_sources(results_dir, aid):
    """([(name, notebook)] to grade again, [(name, notebook)] gone): the notebook each of `aid`'s results in the
    folder graded (its extra_data.grading.source), under the name it is saved as (secA/alice)."""
    folder, found, gone = Path(results_dir), [], []
    if not folder.is_dir():
        from autograder.errors import ConfigError
        raise ConfigError(f"{results_dir}: no such results folder")
    for path in sorted(folder.rglob("*.json")):
        if HISTORY in path.relative_to(folder).parts:
            continue
        grading = read_result(path).get("extra_data", {}).get("grading") or {}
        if grading.get("assignment") != aid or not grading.get("source"):
            continue
        name = path.relative_to(folder).with_suffix("").as_posix()
        (found if Path(grading["source"]).exists() else gone).append((name, Path(grading["source"])))
    return found, gone


def grading_identity(aid, submission, items, grader):
    """What makes two gradings the same: assignment, the notebook's sha256, the items asked for, the grader."""
    return {"assignment": aid, "submission": submission, "items": sorted(items) if items else None, "grader": grader}


def result_path(results_dir, name):
    """Where the results folder keeps `name`'s result (its folder made: a name told apart by folders, secA/alice)."""
    out = Path(results_dir) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def lock_path(out):
    return out.parent / f".{out.name[:-len('.json')]}.lock"


def same_grading(saved, identity):
    """Whether the saved result is this grading's (then it is reused as it is)."""
    same = saved.get("extra_data", {}).get("grading") or {}
    return bool(saved) and all(same.get(k, "") == identity[k] for k in identity)


def stored(out, result, saved, identity, items, notebook, parts=None):
    """(result, how) after saving a fresh result at `out` (the caller holds its lock): merged into the saved one
    for an --items run by the same grader, else replacing it; a grader failure is not saved (the next run retries)."""
    if result.get("extra_data", {}).get("grader_error"):
        return result, "graded"
    same = saved.get("extra_data", {}).get("grading") or {}
    by_same_grader = all(same.get(k, "") == identity[k] for k in ("assignment", "submission", "grader"))
    how, identity = "graded", dict(identity)
    if items and by_same_grader and saved.get("tests"):
        result, how = merged(saved, result, items), "merged"
        identity["items"] = None if same["items"] is None else sorted(set(same["items"]) | set(items))
    elif saved and same.get("source") not in (None, str(Path(notebook).resolve())):
        name = out.name[:-len(".json")]
        print(f"{out}: held the result of {same['source']}, another notebook named {name}; replaced by "
              f"{Path(notebook).resolve()} (grade sections into separate folders to keep both)", file=sys.stderr)
    # the folder's bookkeeping, beside the identity: where from, when, and the grading this one replaced
    grading = {**identity, "source": str(Path(notebook).resolve()),
               "graded_at": datetime.now(UTC).isoformat(timespec="seconds")}
    if parts:
        grading["parts"] = parts
    extra = result.setdefault("extra_data", {})
    if saved.get("tests"):  # kept, never overwritten: the history, and what the regrade changed
        keep(out, saved)
        grading["previous"] = summary(saved)
        extra["history"] = [*saved.get("extra_data", {}).get("history", []), replaced(saved, grading)]
    extra["grading"] = grading
    atomic_write(out, json.dumps(result, indent=1))
    return result, how


def replaced(saved, grading):
    """The history's line for a result that `grading` replaced (the feedback page shows them): when, its score, why."""
    from autograder.batch.identity import what_moved
    before = saved.get("extra_data", {}).get("grading") or {}
    return {"graded_at": graded_at(saved), "score": saved.get("score"), "max_score": saved.get("max_score"),
            "why": what_moved(before, grading)}


def keep(out, saved):
    """The replaced result, whole, in the history: .history/<name>/<when it was graded>.json."""
    folder = out.parent / HISTORY / out.stem  # secA/alice's beside it: secA/.history/alice
    folder.mkdir(parents=True, exist_ok=True)
    when = (graded_at(saved) or "before-history").replace(":", "")
    path, n = folder / f"{when}.json", 1
    while path.exists():
        n += 1
        path = folder / f"{when}-{n}.json"
    atomic_write(path, json.dumps(saved, indent=1))


def summary(result):
    """What a regrade compares: the score, each item's, when and by which grading (its identity)."""
    items = {}
    for test in result.get("tests", []):
        items[test["item"]] = round(items.get(test["item"], 0.0) + test["score"], 4)
    grading = {k: v for k, v in (result.get("extra_data", {}).get("grading") or {}).items() if k != "previous"}
    return {"score": result.get("score"), "max_score": result.get("max_score"), "items": items,
            "graded_at": graded_at(result), "grading": grading}


def graded_at(result):
    """When a result was stored in the folder (None for one stored before the folder kept it)."""
    return (result.get("extra_data", {}).get("grading") or {}).get("graded_at")


def previous(result):
    """The summary of the grading `result` replaced in its folder, or None."""
    return (result.get("extra_data", {}).get("grading") or {}).get("previous")


def record_submission_times(rows, times, results_dir):
    """Each scored result of `rows` ((name, result)) saved in the results folder given its submission time (`times`:
    name -> aware time or None) as extra_data.grading.submitted_at: the raw score stays as graded, and the final score
    is computed from it and the time whenever it is read (reports/final_grade.py)."""
    from autograder.course.submission_times import iso
    for name, result in rows:
        grading = result.get("extra_data", {}).get("grading")
        if grading is None:  # a grader failure: not saved
            continue
        grading["submitted_at"] = iso(times.get(name))
        with claimed(results_dir, name) as entry:
            saved = entry.saved
            same = saved and {k: v for k, v in saved["extra_data"]["grading"].items() if k != "submitted_at"} == \
                {k: v for k, v in grading.items() if k != "submitted_at"}
            if same and saved["extra_data"]["grading"].get("submitted_at") != grading["submitted_at"]:
                saved["extra_data"]["grading"]["submitted_at"] = grading["submitted_at"]
                atomic_write(entry.out, json.dumps(saved, indent=1))


def held(result):
    """The result as a coordinator keeps it until the class's table is printed, every string interned: the texts a
    class repeats (test names, keys, the same reason for the same mistake) are held once, not once per submission,
    so that its memory grows with what differs between submissions, not with the class."""
    if isinstance(result, dict):
        return {sys.intern(key): held(value) for key, value in result.items()}
    if isinstance(result, list):
        return [held(value) for value in result]
    return sys.intern(result) if isinstance(result, str) else result


def read_result(path):
    """The saved result at path, or {} (none, unreadable, or not a result)."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) and isinstance(saved.get("tests"), list) else {}


def merged(saved, fresh, items):
    """The saved result with the tests of `items` replaced by the fresh grading's (in the saved order of items),
    its totals recomputed; the rest of the fresh result (notes, versions) describes this run."""
    fresh_tests = {}
    for test in fresh["tests"]:
        fresh_tests.setdefault(test["item"], []).append(test)
    order = list(dict.fromkeys([t["item"] for t in saved["tests"]] + list(fresh_tests)))
    tests = [t for item in order
             for t in (fresh_tests.get(item, []) if item in items else
                       [t for t in saved["tests"] if t["item"] == item])]
    extra = {**fresh.get("extra_data", {}), "regraded": sorted(items)}
    return {**fresh, "score": round(sum(t["score"] for t in tests), 4), "max_score": sum(t["max_score"] for t in tests),
            "tests": tests, "extra_data": extra}


@contextmanager
def result_lock(path):
    """An flock on `path`, removed when released: two graders sharing a results folder wait for each other.

    The holder unlinks the file before unlocking; a waiter that then gets the lock on the unlinked file
    sees that the path no longer names what it holds, and tries again.
    """
    while True:
        lock = open(path, "a")  # noqa: SIM115 -- held until the caller is done: closed below
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if os.fstat(lock.fileno()).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        lock.close()
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        lock.close()


