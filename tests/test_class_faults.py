"""A class on `--cluster local` meeting every fault of issue #54 at once, at a size CI affords (the 300-submission
run is benchmarks/class_faults.py, its figures in benchmarks/RESULTS.md): workers SIGKILLed at random moments, one
SIGSTOPped (a hang the scheduler's worker-ttl ends), and the coordinator SIGKILLed halfway. Nothing of the killed
coordinator is alive 10 s later (its workers die with it, stopped or not: autograder/batch/task.py
die_with_parent), the same command run again grades only what has no result, and every submission ends with
exactly one result, the one an undisturbed `--workers 2` run gives."""
import json
import random

import nbformat
import pytest

from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from tests.class_faults import LAB, Coordinator, killed_halfway_and_rerun, make_class
from tests.test_batch import stable

pytest.importorskip("distributed")
pytestmark = [pytest.mark.grading, pytest.mark.slow]
ITEM = "scaled_dot_product_attention"  # graded alone: no training, so that a class fits in CI
SIZE, SLOW = 10, 2  # every kind of make_class's mix (its tenth is broken); SLOW more sleep 3 s as they load: a
# worker surely busy when the killer looks
TTL = {"DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": "10s"}  # the hang ended in seconds, not two minutes
BLOWS = 4  # a kill, the hang, two more kills: each costs a worker's warm-up, which CI pays in CPU


def results(log):
    return {r["submission"]: r for r in stable(json.loads(log.with_suffix(".json").read_text()))}


def test_dying_and_hanging_workers_and_a_killed_coordinator_end_with_the_undisturbed_results(tmp_path):
    folder = tmp_path / "class"
    kinds = make_class(folder, SIZE, "ci", endless=False)
    for k in range(SLOW):
        sleepy = solved_sources(LAB)
        sleepy[ITEM] = f"import time\ntime.sleep(3)\n{sleepy[ITEM]}\n_submission = 'slow{k}'\n"
        (folder / f"slow{k}").mkdir()
        nbformat.write(with_cells(release_notebook(LAB), sleepy), folder / f"slow{k}" / f"{LAB}.ipynb")
    assert {"complete", "partly", "release"} <= set(kinds.values()) and len(set(kinds.values())) >= 4, kinds
    items = ["--items", ITEM]
    undisturbed = Coordinator(folder, LAB, tmp_path / "pool-r", ["--workers", "2", *items], tmp_path / "pool.err")
    assert undisturbed.wait() == 0, (tmp_path / "pool.err").read_text()[-3000:]
    report = killed_halfway_and_rerun(folder, LAB, tmp_path / "r", ["--cluster", "local", "--jobs", "2"],
                                      tmp_path / "faults", random.Random(0), every=(2, 4), halfway=(SIZE + SLOW) // 2,
                                      more=items, env={**undisturbed.env, **TTL}, kills_first=1, most=BLOWS)
    log = (tmp_path / "faults2.err").read_text()[-3000:]
    assert report.left == [], f"alive 10 s after the coordinator's death: {report.left}"
    assert report.code == 0, log
    signals = [sig for _, _, sig in report.blows]
    assert "SIGKILL" in signals and signals.count("SIGSTOP") == 1, report.blows
    assert report.rewritten == [] and report.reused == report.saved > 0, report
    assert report.graded == SIZE + SLOW - report.saved, report
    assert results(tmp_path / "faults2.err") == results(tmp_path / "pool.err")
