"""The grader's own life: nothing of a sandbox outlives a killed grader, an interrupted batch keeps what is done
and leaves nothing running, and two graders sharing one results folder lose or corrupt nothing."""
import json
import signal
import time
from pathlib import Path

import nbformat
import pytest

from autograder.examples import release_notebook, solved_sources, with_cells
from autograder.sandbox import SCRATCH_DIR, UID_BASE, UID_SPAN, can_isolate, descendants, processes
from tests.test_batch import course_grade, stable

pytestmark = [pytest.mark.grading, pytest.mark.skipif(not can_isolate(), reason="sandbox uids need root")]
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


def scratch_folders(uids):
    """The sandbox scratch folders of these uids (each is chowned to its sandbox's uid): other graders running
    at the same time, a parallel test run's included, have their own."""
    found = set()
    for folder in Path(SCRATCH_DIR).glob("course-sandbox-*"):  # where Sandbox.start makes them
        try:
            if folder.stat().st_uid in uids:
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


SPINS_WITH_A_CHILD = ("import os\n\ndef make_memory_dataset(n_samples, seq_len, seed=0):\n"
                      "    if os.fork() == 0:\n        while True:\n            pass\n"
                      "    while True:\n        pass\n")


def test_nothing_of_the_sandbox_outlives_a_grader_killed_with_sigkill(tmp_path):
    path = notebook(tmp_path / "spinner" / f"{AID}.ipynb", **{MMD: SPINS_WITH_A_CHILD})
    grader = course_grade([str(path), "-a", AID, "--items", MMD, "--device", "cpu"])
    try:
        # the student's two spinning processes: the sandbox's and its child, both of a sandbox uid
        assert wait_until(lambda: len([u for u in descendants(grader.pid).values()
                                       if UID_BASE <= u < UID_BASE + UID_SPAN]) >= 2, 120), \
            "the submission's processes never started"
        tree = descendants(grader.pid)
        uids = sandbox_uids(tree)
        grader.kill()  # SIGKILL: no handler, no finally, no atexit of the grader runs
        grader.wait()
        gone = wait_until(lambda: not (set(tree) & set(processes())), 20)
        left = {pid: uid for pid, (_, uid) in processes().items() if pid in tree or uid in uids}
        assert gone and not left, f"left running after the grader died: {left}"
        assert wait_until(lambda: not scratch_folders(uids), 10), "a scratch folder was left behind"
    finally:
        if grader.poll() is None:
            grader.kill()


@pytest.mark.slow
def test_an_interrupted_batch_keeps_what_is_done_and_two_graders_finish_it_together(tmp_path):
    subs = tmp_path / "subs"
    notebook(subs / "a_complete" / f"{AID}.ipynb")
    slow = solved_sources(AID, [MMD])[MMD] + "\nimport time\ntime.sleep(6)\n"  # loading takes a while
    notebook(subs / "b_slow_to_load" / f"{AID}.ipynb", **{MMD: slow})
    notebook(subs / "c_complete" / f"{AID}.ipynb")
    common = [str(subs), "-a", AID, "--items", ITEMS, "--device", "cpu"]
    results = tmp_path / "results"

    run = course_grade(common + ["--results-dir", str(results)])
    assert wait_until(lambda: (results / "a_complete.json").exists() or run.poll() is not None, 300)
    assert wait_until(lambda: sandbox_uids(descendants(run.pid)) or run.poll() is not None, 60)
    tree = descendants(run.pid)
    run.send_signal(signal.SIGTERM)  # while b is loading
    out, err = run.communicate(timeout=60)
    assert run.returncode == 130, err[-2000:]
    assert "interrupted" in err and "a rerun grades the rest" in err
    assert sorted(p.name for p in results.iterdir()) == ["a_complete.json"], "only finished results are kept"
    assert wait_until(lambda: not (set(tree) & set(processes())), 20), "a sandbox outlived the interrupted batch"
    uids = sandbox_uids(tree)
    assert uids and wait_until(lambda: not scratch_folders(uids), 10), "a scratch folder was left behind"

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

    whole = course_grade(common + ["--json", str(tmp_path / "whole.json")])
    out, err = whole.communicate(timeout=600)
    assert whole.returncode == 0, err[-2000:]
    assert stable(first) == stable(json.loads((tmp_path / "whole.json").read_text()))
    assert all(r["score"] == r["max_score"] > 0 for r in first)
