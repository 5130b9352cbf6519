"""The grader's own life: nothing of a sandbox outlives a killed grader, an interrupted batch keeps what is done
and leaves nothing running, and two graders sharing one results folder lose or corrupt nothing.

At every level that isolates (tests/test_levels_corpus.py runs these at the others): where the grader is root
its sandboxes have uids of their own; elsewhere their processes are the grader's user's own, and what must hold
is that nothing of the grader's process tree outlives it.
"""
import json
import signal
import time
from pathlib import Path

import nbformat
import pytest

from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from autograder.sandbox.grader_side import SCRATCH_DIR, UID_BASE, UID_SPAN, can_isolate, descendants, processes
from tests.test_batch import course_grade, stable
from tests.test_corpus import ISOLATES, LEVEL

pytestmark = [pytest.mark.grading, pytest.mark.skipif(not ISOLATES, reason="needs a level that isolates")]
AID = "lab14_transformers"
MMD = "make_memory_dataset"
ITEMS = f"scaled_dot_product_attention,{MMD}"


def sandbox_uids(pids):
    return {uid for uid in pids.values() if UID_BASE <= uid < UID_BASE + UID_SPAN}


def wait_until(condition, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def named(pids, name):
    """Those of `pids` whose process name is `name`: the submissions here name theirs, since below root they are
    the grader's user's own and only the name tells them from the grader's."""
    found = set()
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                found.add(pid)
        except OSError:
            pass
    return found


def scratch_folders(uids, since):
    """The sandbox scratch folders made since `since` (a set of them), of these uids where sandboxes have uids of
    their own (each folder is chowned to its sandbox's: other graders running at the same time, a parallel test
    run's included, have their own); without, all of them (a level's run grades one notebook at a time)."""
    found = set()
    for folder in Path(SCRATCH_DIR).glob("course-sandbox-*"):  # where Sandbox.start makes them
        try:
            if folder not in since and (not uids or folder.stat().st_uid in uids):
                found.add(folder)
        except FileNotFoundError:  # removed while we looked
            pass
    return found


def notebook(path, **bodies):
    """The solved lab14 notebook with item cells replaced."""
    sources = solved_sources(AID)
    sources.update(bodies)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(with_cells(release_notebook(AID), sources), path)
    return path


SPINNER, LOADING = "course-spinner", "course-loading"  # the names the submissions give their processes
SPINS_WITH_A_CHILD = ("import ctypes, os\n\ndef make_memory_dataset(n_samples, seq_len, seed=0):\n"
                      f"    ctypes.CDLL(None).prctl(15, {SPINNER.encode()!r}, 0, 0, 0)  # PR_SET_NAME\n"
                      "    if os.fork() == 0:\n        while True:\n            pass\n"
                      "    while True:\n        pass\n")


def test_nothing_of_the_sandbox_outlives_a_grader_killed_with_sigkill(tmp_path):
    path = notebook(tmp_path / "spinner" / f"{AID}.ipynb", **{MMD: SPINS_WITH_A_CHILD})
    before = scratch_folders(set(), set())
    grader = course_grade([str(path), "-a", AID, "--items", MMD, "--device", "cpu"])
    try:
        # the student's two spinning processes: the sandbox's and its child
        assert wait_until(lambda: len(named(descendants(grader.pid), SPINNER)) >= 2, 120), \
            "the submission's processes never started"
        tree = descendants(grader.pid)
        uids = sandbox_uids(tree)
        spinners = {tree[pid] for pid in named(tree, SPINNER)}
        assert spinners <= uids if can_isolate() else not uids, "sandbox uids where the grader is root, and only there"
        grader.kill()  # SIGKILL: no handler, no finally, no atexit of the grader runs
        grader.wait()
        gone = wait_until(lambda: not (set(tree) & set(processes())), 20)
        left = {pid: uid for pid, (_, uid) in processes().items() if pid in tree or uid in uids}
        assert gone and not left, f"left running after the grader died: {left}"
        assert wait_until(lambda: not scratch_folders(uids, before), 10), "a scratch folder was left behind"
    finally:
        if grader.poll() is None:
            grader.kill()


@pytest.mark.slow
def test_an_interrupted_batch_keeps_what_is_done_and_two_graders_finish_it_together(tmp_path):
    subs = tmp_path / "subs"
    notebook(subs / "a_complete" / f"{AID}.ipynb")
    slow = solved_sources(AID, [MMD])[MMD] + (  # loading takes a while, and says so by its name
        f"\nimport ctypes, time\nctypes.CDLL(None).prctl(15, {LOADING.encode()!r}, 0, 0, 0)\ntime.sleep(6)\n")
    notebook(subs / "b_slow_to_load" / f"{AID}.ipynb", **{MMD: slow})
    notebook(subs / "c_complete" / f"{AID}.ipynb")
    common = [str(subs), "-a", AID, "--items", ITEMS, "--device", "cpu"]
    results = tmp_path / "results"

    before = scratch_folders(set(), set())
    run = course_grade(common + ["--results-dir", str(results)])
    assert wait_until(lambda: (results / "a_complete.json").exists() or run.poll() is not None, 300)
    assert wait_until(lambda: named(descendants(run.pid), LOADING) or run.poll() is not None, 60)
    tree = descendants(run.pid)
    run.send_signal(signal.SIGTERM)  # while b is loading
    out, err = run.communicate(timeout=60)
    assert run.returncode == 130, err[-2000:]
    assert "interrupted" in err and "a rerun grades the rest" in err
    assert sorted(p.name for p in results.iterdir()) == ["a_complete.json"], "only finished results are kept"
    assert wait_until(lambda: not (set(tree) & set(processes())), 20), "a sandbox outlived the interrupted batch"
    uids = sandbox_uids(tree)
    assert bool(uids) == can_isolate(), "sandbox uids where the grader is root, and only there"
    assert wait_until(lambda: not scratch_folders(uids, before), 10), "a scratch folder was left behind"
    if LEVEL:  # at the other levels the interruption is what differs; the results folder is the grader's own code
        assert json.loads((results / "a_complete.json").read_text())["extra_data"]["isolation"] == LEVEL
        return

    kept = (results / "a_complete.json").read_text()
    twins = [course_grade(common + ["--results-dir", str(results), "--json", str(tmp_path / f"twin{k}.json")])
             for k in (1, 2)]
    for twin in twins:
        out, err = twin.communicate(timeout=600)
        assert twin.returncode == 0, err[-2000:]
    assert (results / "a_complete.json").read_text() == kept, "a finished result was graded again"
    assert sorted(p.name for p in results.iterdir()) == ["a_complete.json", "b_slow_to_load.json",
                                                         "c_complete.json"], "no lock or temporary files left"
    first, second = (json.loads((tmp_path / f"twin{k}.json").read_text()) for k in (1, 2))
    assert stable(first) == stable(second)
    # every notebook is the reference's (b's only slower to load): what an uninterrupted run gives, which
    # tests/test_batch.py's killed batch compares result by result
    assert [r["submission"] for r in first] == ["a_complete", "b_slow_to_load", "c_complete"]
    assert all(r["score"] == r["max_score"] > 0 for r in first)
