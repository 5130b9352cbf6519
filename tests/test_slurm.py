"""Grading through a real Slurm (tests/slurm_node.py: munged, slurmctld and slurmd on this machine), as a TA on a
login node would: `course grade --cluster slurm --jobs 2` submits two batch jobs that appear in `squeue`, run the
gradings, and are gone at the end, with the same scores and CSV as `--workers 1`. A coordinator killed mid-class
leaves nothing in `squeue` once its workers notice (dask-jobqueue's death timeout), and the same command run again
grades only what has no result. Skipped, saying why, where Slurm and munge are not installed or this is not root."""
import json
import shutil
import signal
import subprocess
import sys
import threading
import time

import nbformat
import pytest

from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from tests.slurm_node import SlurmNode, why_not
from tests.test_batch import stable
from tests.test_cluster import AID, ITEM, graded_serially

pytest.importorskip("dask_jobqueue")
pytestmark = [pytest.mark.grading, pytest.mark.slow,
              pytest.mark.skipif(why_not() is not None, reason=f"no single-node Slurm here: {why_not()}")]
SLOW_SECONDS = 12  # the submission still grading when the coordinator is killed (the rerun waits for it too)


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    return graded_serially(tmp_path_factory.mktemp("serial"))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    node = SlurmNode(tmp_path_factory.mktemp("slurm"))
    yield node
    node.close()


class Watch:
    """Every job `squeue` shows while the block runs, once a second: {job id: set of states}."""

    def __init__(self, node):
        self.node, self.seen, self.stop = node, {}, threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self.stop.wait(1):
            for job, name, state in self.node.jobs():
                self.seen.setdefault((job, name), set()).add(state)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def course_grade(node, folder, results, cwd, wait=True):
    """`course grade --cluster slurm --jobs 2` as a login node's shell runs it: SLURM_CONF reaches the Slurm, the
    site's dask-jobqueue settings (here: one CPU and 2 GB a job, for a two-core node, and workers that end their job
    15 s after they lose the scheduler, where jobqueue's default waits 60 s) come from the environment."""
    env = {**node.env, "DASK_COURSE__THREADS": "1", "DASK_JOBQUEUE__SLURM__MEMORY": "2GB",
           "DASK_JOBQUEUE__SLURM__DEATH_TIMEOUT": "15"}
    argv = [sys.executable, "-m", "autograder.cli", "grade", str(folder), "-a", AID, "--items", ITEM, "--device",
            "cpu", "--cluster", "slurm", "--jobs", "2", "--results-dir", str(results), "--csv", str(cwd / "c.csv"),
            "--json", str(cwd / "c.json")]
    if wait:
        return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    return subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def no_jobs_within(node, seconds):
    deadline = time.monotonic() + seconds
    while node.jobs() and time.monotonic() < deadline:
        time.sleep(1)
    return node.jobs()


def test_a_class_graded_through_slurm_jobs_has_the_workers_1_scores_and_leaves_no_job(slurm, serial, tmp_path):
    subs, csv, results = serial
    with Watch(slurm) as watch:
        done = course_grade(slurm, subs, tmp_path / "r", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    ran = {job for (job, name), states in watch.seen.items() if name == "course-grader" and "RUNNING" in states}
    assert len(ran) == 2, f"expected two course-grader jobs running in squeue, saw {watch.seen}"
    assert (tmp_path / "c.csv").read_text() == csv
    assert stable(json.loads((tmp_path / "c.json").read_text())) == stable(results)
    assert no_jobs_within(slurm, 30) == []  # the coordinator cancelled its jobs as it closed
    assert sorted(p.name for p in tmp_path.glob("slurm-*.out")) == sorted(f"slurm-{j}.out" for j in ran)


def test_a_killed_coordinator_leaves_no_job_and_its_rerun_grades_only_what_has_no_result(slurm, serial, tmp_path):
    subs, csv, results = serial
    folder = tmp_path / "class"
    shutil.copytree(subs, folder)
    slow = solved_sources(AID)  # still grading when the coordinator dies
    slow[ITEM] = f"import time\ntime.sleep({SLOW_SECONDS})\n{slow[ITEM]}"
    (folder / "slow").mkdir()
    nbformat.write(with_cells(release_notebook(AID), slow), folder / "slow" / f"{AID}.ipynb")
    first = course_grade(slurm, folder, tmp_path / "r", tmp_path, wait=False)
    deadline = time.monotonic() + 600
    while len(list((tmp_path / "r").glob("*.json"))) < 2 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert first.poll() is None, "the first run ended before the kill"
    first.send_signal(signal.SIGKILL)  # no goodbye: its scheduler, and the jobs' only link to it, die at once
    first.wait()
    # read after the kill: the quick three may finish within one poll, and nothing is saved once the coordinator is
    # gone; the slow one is still grading
    kept = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (tmp_path / "r").glob("*.json")}
    assert len(kept) >= 2 and "slow.json" not in kept, f"the first run should be killed with two or three results " \
                                                        f"saved and the slow one grading: {sorted(kept)}"
    # its workers lose their scheduler and end their jobs themselves (dask-jobqueue's death timeout, 15 s here)
    assert no_jobs_within(slurm, 120) == [], "the killed coordinator's jobs stayed in squeue"
    again = course_grade(slurm, folder, tmp_path / "r", tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (tmp_path / "r").glob("*.json")
            if p.name in kept} == kept, "a result saved by the first run was written again"
    graded = {r["submission"]: r for r in json.loads((tmp_path / "c.json").read_text())}
    assert sorted(graded) == ["complete", "empty", "slow", "wrong"]
    by_name = {r["submission"]: r for r in results}
    assert graded["slow"]["score"] == by_name["complete"]["score"]
    for name in ("complete", "empty", "wrong"):
        assert graded[name]["score"] == by_name[name]["score"], name
    assert f"{len(kept)} reused" in again.stdout, again.stdout[-2000:]
    assert no_jobs_within(slurm, 30) == []
