"""Grading on a Dask cluster: started as a user starts one (`dask scheduler`, `dask worker` on 127.0.0.1), the
same scores and CSV as `--workers 1`; a worker killed mid-grading loses nothing and doubles nothing; a submission
that kills every worker running it is a grader error while the rest is graded; the Slurm, PBS and Kubernetes job
specifications carry the GPU request and the thread settings; a worker with another grader refuses a task; a
stopped worker dies with its parent."""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest

from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from tests.planted import planted, variant_source
from tests.test_batch import stable

pytest.importorskip("distributed")
pytestmark = pytest.mark.grading
AID = "lab14_transformers"
ITEM = "scaled_dot_product_attention"  # the cheapest item to grade: no experiment
ROOT = Path(__file__).resolve().parent.parent


def make_class(folder):
    """complete, empty and one planted mistake of ITEM: three submissions, a folder each."""
    wrong = solved_sources(AID)
    wrong[ITEM] = variant_source(AID, ITEM, next(iter(planted(AID)[ITEM]["wrong"].values())))
    for name, nb in [("complete", with_cells(release_notebook(AID), solved_sources(AID))),
                     ("empty", release_notebook(AID)), ("wrong", with_cells(release_notebook(AID), wrong))]:
        (folder / name).mkdir(parents=True)
        nbformat.write(nb, folder / name / f"{AID}.ipynb")
    return folder


def course_grade(*args, timeout=1200):
    return subprocess.run([sys.executable, "-m", "autograder.cli", "grade", *map(str, args), "-a", AID,
                           "--items", ITEM, "--device", "cpu"], capture_output=True, text=True, timeout=timeout)


class DaskCluster:
    """`dask scheduler` and `dask worker --nworkers 2` as subprocesses on 127.0.0.1, as a user starts them."""

    def __init__(self, folder, worker_env=None, scheduler_env=None, preload=None):
        self.folder, self.file = folder, folder / "scheduler.json"
        # one task per worker thread at a time (docs/CLUSTER.md): a dying worker is blamed for its own grading only
        env = {**os.environ, "PYTHONPATH": str(ROOT), "DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": "1.0"}
        with open(folder / "scheduler.log", "w") as log:  # the scheduler holds its own copy of the file
            self.procs = [subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1",
                                            "--port", "0", "--no-dashboard", "--scheduler-file", str(self.file)],
                                           env={**env, **(scheduler_env or {})}, cwd=folder,
                                           stdout=subprocess.DEVNULL, stderr=log)]
        while not self.file.exists():
            assert self.procs[0].poll() is None, (folder / "scheduler.log").read_text()
            time.sleep(0.2)
        with open(folder / "workers.log", "w") as log:
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "dask", "worker", "--scheduler-file", str(self.file), "--nworkers", "2",
                 "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard",
                 *(["--preload", str(preload)] if preload else [])],
                env={**env, "COURSE_WORKER_THREADS": "1", **(worker_env or {})}, cwd=folder,
                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True))

    def close(self):
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM) if proc is self.procs[-1] else proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    return graded_serially(tmp_path_factory.mktemp("serial"))


def graded_serially(tmp):
    """The class graded with --workers 1: (submissions folder, CSV text, results)."""
    subs = make_class(tmp / "subs")
    done = course_grade(subs, "--workers", "1", "--csv", tmp / "s.csv", "--json", tmp / "s.json")
    assert done.returncode == 0, done.stderr
    return subs, (tmp / "s.csv").read_text(), json.loads((tmp / "s.json").read_text())


@pytest.mark.slow
def test_grading_through_a_running_dask_cluster_gives_the_same_scores_and_csv(serial, tmp_path):
    subs, csv, results = serial
    cluster = DaskCluster(tmp_path)
    try:
        done = course_grade(subs, "--scheduler", cluster.file, "--csv", tmp_path / "d.csv", "--json",
                            tmp_path / "d.json", "--results-dir", tmp_path / "r")
    finally:
        cluster.close()
    assert done.returncode == 0, done.stderr
    assert "cluster: tcp://127.0.0.1:" in done.stderr
    assert (tmp_path / "d.csv").read_text() == csv
    assert stable(json.loads((tmp_path / "d.json").read_text())) == stable(results)
    assert sorted(p.name for p in (tmp_path / "r").glob("*.json")) == ["complete.json", "empty.json", "wrong.json"]


@pytest.mark.slow
def test_a_killed_worker_loses_and_doubles_nothing_and_a_worker_killer_is_a_grader_error(serial, tmp_path):
    """One worker dies a quarter of a second into grading `complete`: Dask runs it again elsewhere, and `complete`
    ends with one result, the undisturbed score. Every worker grading `poison` dies a second into it: after
    allowed-failures (2 here) it is a grader error with no score, and the others are graded; a grading that was
    only waiting on a dying worker is submitted again (scheduler.py's _innocent_bystander), never blamed."""
    subs, csv, results = serial
    poison = solved_sources(AID)  # complete, but still running a minute into its grading: the killer's target
    poison[ITEM] = f"import time\ntime.sleep(60)\n{poison[ITEM]}"
    (subs.parent / "with_poison" / "poison").mkdir(parents=True)
    nbformat.write(with_cells(release_notebook(AID), poison), subs.parent / "with_poison" / "poison" / f"{AID}.ipynb")
    for name in ("complete", "empty", "wrong"):
        shutil.copytree(subs / name, subs.parent / "with_poison" / name)
    cluster = DaskCluster(tmp_path, preload=Path(__file__).with_name("dask_killer.py"),
                          scheduler_env={"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "2"},
                          worker_env={"COURSE_TEST_KILL_ONCE": "complete", "COURSE_TEST_KILL_ALWAYS": "poison",
                                      "COURSE_TEST_KILL_MARKS": str(tmp_path)})
    try:
        done = course_grade(subs.parent / "with_poison", "--scheduler", cluster.file, "--csv", tmp_path / "d.csv",
                            "--json", tmp_path / "d.json", "--results-dir", tmp_path / "r")
    finally:
        cluster.close()
    assert (tmp_path / "complete").exists(), "the worker grading `complete` was never killed"
    assert done.returncode == 3, done.stderr  # a grader failure: poison was not scored
    died = r"grader error, 1 of 4 not scored \(poison\): .*every worker that ran its grading died"
    assert re.search(died, done.stderr), done.stderr
    graded = {r["submission"]: r for r in json.loads((tmp_path / "d.json").read_text())}
    poison = graded.pop("poison")
    assert poison["score"] is None and poison["extra_data"]["grader_error"]
    assert "every worker that ran its grading died while it ran" in poison["output"]
    by_name = {r["submission"]: r for r in results}
    assert {n: stable([r])[0] for n, r in graded.items()} == {n: stable([r])[0] for n, r in by_name.items()}
    assert sorted(p.name for p in (tmp_path / "r").glob("*.json")) == ["complete.json", "empty.json", "wrong.json"]
    reported = [line.split("] ", 1)[1].split(":")[0] for line in done.stderr.splitlines() if line.startswith("[")]
    assert sorted(reported) == ["complete", "empty", "poison", "wrong"]  # one result each, none twice


# A worker's process below a parent that then dies: its pid, once it is ready, and it sleeps (as a grading does)
ORPHAN = """
import subprocess, sys, time
code = ("import sys, time\\n"
        "if sys.argv[1] == 'dies': from autograder.batch.task import die_with_parent; die_with_parent()\\n"
        "print('ready', flush=True); time.sleep(600)")
worker = subprocess.Popen([sys.executable, "-c", code, sys.argv[1]], stdout=subprocess.PIPE, text=True)
worker.stdout.readline()
print(worker.pid, flush=True)
time.sleep(600)
"""


def orphaned_while_stopped(how):
    """The pid of a worker SIGSTOPped and then left by its parent's SIGKILL, 3 s after, or None if it is gone."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN, how], stdout=subprocess.PIPE, text=True, env=env)
    worker = int(parent.stdout.readline())
    os.kill(worker, signal.SIGSTOP)  # a hang: none of its threads runs, Dask's watch of the parent included
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return None  # dead, not yet reaped by whoever adopted it
        except FileNotFoundError:
            return None
        time.sleep(0.1)
    return worker


def test_a_stopped_worker_dies_with_its_parent():
    """task.die_with_parent: the kernel SIGKILLs a worker whose parent (the coordinator, a nanny) dies, though it is
    stopped; without it the stopped worker stays, which is what a killed coordinator used to leave behind."""
    kept = orphaned_while_stopped("stays")
    assert kept is not None, "a stopped process without the death signal should outlive its parent"
    os.kill(kept, signal.SIGKILL)
    assert orphaned_while_stopped("dies") is None, "the stopped worker outlived its parent"


def test_a_worker_with_another_grader_refuses_the_task(tmp_path):
    from autograder.batch.task import GraderMismatch, grade_bytes
    data = nbformat.writes(release_notebook(AID)).encode()
    with pytest.raises(GraderMismatch, match="grader identity .* the coordinator 000000000000: install the same"):
        grade_bytes("alice", f"{AID}.ipynb", data, hashlib.sha256(data).hexdigest(), AID, [ITEM], "cpu", "0" * 64)
    with pytest.raises(ValueError, match="arrived with sha256"):
        grade_bytes("alice", f"{AID}.ipynb", data, "f" * 64, AID, [ITEM], "cpu", "0" * 64)


def test_a_scheduler_that_does_not_answer_is_one_line_naming_it(tmp_path):
    """Nobody listening at the address, or a scheduler file whose scheduler has gone: exit 2, one line, no
    traceback."""
    gone = tmp_path / "scheduler.json"
    gone.write_text(json.dumps({"type": "Scheduler", "address": "tcp://127.0.0.1:9", "services": {}, "workers": {}}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"}
    for target in ("tcp://127.0.0.1:9", gone):
        done = subprocess.run([sys.executable, "-m", "autograder.cli", "grade", str(tmp_path), "-a", AID,
                               "--scheduler", str(target)], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 2, done.stderr[-2000:]
        assert f"the Dask scheduler at {target} did not answer" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("kind", ["slurm", "pbs"])
def test_batch_job_scripts_ask_for_the_gpus_and_set_the_threads(kind):
    pytest.importorskip("dask_jobqueue")
    from autograder.batch.clusters import render
    script = render(kind, jobs=3, gpus=2, threads=4)
    assert ("#SBATCH --gres=gpu:2" in script and "#SBATCH --cpus-per-task=8" in script) if kind == "slurm" else \
        "#PBS -l select=1:ncpus=8:mem=16gb:ngpus=2" in script
    assert "walltime=02:00:00" in script or "#SBATCH -t 02:00:00" in script
    for line in ("export COURSE_WORKER_THREADS=4", "export OMP_NUM_THREADS=4", "export OMP_WAIT_POLICY=PASSIVE"):
        assert line in script
    worker = next(line for line in script.splitlines() if "dask_worker" in line)
    assert "--nthreads 1" in worker and "--nworkers 2" in worker and "--resources GPU=1" in worker
    assert "gpu" not in render(kind, jobs=3, gpus=0, threads=4).lower()


def test_the_kubernetes_cluster_asks_each_worker_pod_for_a_gpu_and_sets_the_threads(monkeypatch):
    import yaml

    from autograder.batch.clusters import render
    monkeypatch.setenv("DASK_COURSE__IMAGE", "registry.example.edu/course:2026")
    import dask
    dask.config.refresh()
    spec = yaml.safe_load(render("k8s", jobs=5, gpus=1, threads=4))
    worker = spec["spec"]["worker"]
    assert worker["replicas"] == 5
    container = worker["spec"]["containers"][0]
    assert container["image"] == "registry.example.edu/course:2026"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert {"name": "COURSE_WORKER_THREADS", "value": "4"} in container["env"]
    assert container["args"][-4:] == ["--nthreads", "1", "--resources", "GPU=1"]
    scheduler = spec["spec"]["scheduler"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in scheduler["resources"]["limits"]
    try:  # the same layout as dask-kubernetes' own template, where the k8s extra is installed
        from dask_kubernetes.operator import make_cluster_spec
    except ImportError:
        return
    theirs = make_cluster_spec("course-grader", image="registry.example.edu/course:2026", n_workers=5)
    assert spec["apiVersion"] == theirs["apiVersion"] and spec["kind"] == theirs["kind"]
    assert spec["spec"].keys() == theirs["spec"].keys()
    assert spec["spec"]["scheduler"]["service"] == theirs["spec"]["scheduler"]["service"]
    for part in ("worker", "scheduler"):
        ours, template = (s["spec"][part]["spec"]["containers"][0] for s in (spec, theirs))
        assert ours.keys() >= template.keys() - {"env", "resources"} and ours["ports"] == template["ports"]


def kill_training(monkeypatch, times):
    """SIGKILL the student's process half a second into each of its first `times` training requests, from outside
    (no limit of the grader's involved), as a host's OOM killer would. Returns the list of kills done. Under the
    course's own budget, not the rehearsal profile: a rehearsal's 5 steps can end before the kill lands (its whole
    experiment request took 0.96 s wall on a machine loaded six times over its cores, so less than half a second on
    an idle one), and the kill would then miss the training it is about."""
    from autograder.sandbox.grader_side import Sandbox
    request, kills = Sandbox.request, []

    def killed_while_training(self, op, *args, **kwargs):
        if op == "experiment" and len(kills) < times:
            kills.append(self.proc)
            threading.Timer(0.5, os.kill, (self.proc, signal.SIGKILL)).start()
        return request(self, op, *args, **kwargs)
    monkeypatch.setattr(Sandbox, "request", killed_while_training)
    monkeypatch.setenv("COURSE_NO_CACHE", "1")  # a cached run would not train
    return kills


@pytest.mark.slow
def test_a_training_killed_once_from_outside_is_run_again_and_scored_as_usual(monkeypatch, tmp_path):
    from autograder.grading.grade import grade_notebook
    path = tmp_path / f"{AID}.ipynb"
    nbformat.write(with_cells(release_notebook(AID), solved_sources(AID)), path)
    kills = kill_training(monkeypatch, times=1)
    result = grade_notebook(path, AID, items=["TransformerClassifier"], device="cpu")
    assert len(kills) == 1
    assert result["score"] == result["max_score"] > 0, result["output"]
    assert any("killed from outside (SIGKILL" in note and "run again" in note for note in result["extra_data"]["notes"])


@pytest.mark.slow
def test_the_same_kill_twice_counts_against_the_submission_and_says_so(monkeypatch, tmp_path):
    from autograder.grading.grade import grade_notebook
    path = tmp_path / f"{AID}.ipynb"
    nbformat.write(with_cells(release_notebook(AID), solved_sources(AID)), path)
    kill_training(monkeypatch, times=99)
    result = grade_notebook(path, AID, items=["TransformerClassifier"], device="cpu")
    experiment = next(t for t in result["tests"] if t["name"].startswith("TransformerClassifier") and
                      "experiment" in t["name"])
    assert experiment["score"] == 0
    assert "killed by signal SIGKILL), twice: no limit of the grader's was hit" in experiment["output"]


def gradebook(root):
    """{student: (total, [(cell, auto score)])} from an nbgrader gradebook."""
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{root}/gradebook.db") as gb:
        return {s.student.id: (s.score, sorted((g.name, g.auto_score) for nb in s.notebooks for g in nb.grades))
                for s in gb.find_assignment(AID).submissions}


@pytest.mark.slow
def test_nbgrader_pregraded_on_the_cluster_writes_the_gradebook_of_the_serial_run(tmp_path, monkeypatch):
    """The TA's parallel nbgrader path (docs/CLUSTER.md): nbgrader writes the notebooks it would grade
    (CollectForGrading), `course grade --scheduler` grades them on the cluster into a results folder, and
    `nbgrader autograde` with TrustedGrade.results_dir takes those results: the gradebook of a serial autograde.
    Under the rehearsal profile (the path is what is tested, not alice's figure: her experiment trains 5 steps
    instead of two seeds' runs), set before anything starts, so that nbgrader, `course grade` and the cluster's
    workers all grade under it (a worker without it would refuse the coordinator's tasks: another grader)."""
    from autograder.notebooks.build import run_nbgrader
    from tests.test_nbgrader_roundtrip import CONFIG, half_done
    monkeypatch.setenv("COURSE_PROFILE", "rehearsal")
    serial, parallel = tmp_path / "serial", tmp_path / "parallel"
    (serial / "source").mkdir(parents=True)
    shutil.copytree(ROOT / "assignments" / AID, serial / "source" / AID)
    (serial / "nbgrader_config.py").write_text(CONFIG.format(repo_config=str(ROOT / "nbgrader_config.py"),
                                                             root=str(serial)))
    proc = run_nbgrader(["generate_assignment", AID, "--force"], serial)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for student, nb in {"alice": with_cells(release_notebook(AID), solved_sources(AID)), "bob": release_notebook(AID),
                        "carol": half_done(AID)[0]}.items():
        (serial / "submitted" / student / AID).mkdir(parents=True)
        nbformat.write(nb, serial / "submitted" / student / AID / f"{AID}.ipynb")
    shutil.copytree(serial, parallel)
    (parallel / "nbgrader_config.py").write_text(CONFIG.format(repo_config=str(ROOT / "nbgrader_config.py"),
                                                               root=str(parallel)))

    proc = run_nbgrader(["autograde", AID, "--force"], serial)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    pending, pregraded = tmp_path / "pending", tmp_path / "pregraded"
    collect = run_nbgrader(["autograde", AID, "--force", f"--CollectForGrading.folder={pending}",
                            "--Autograde.autograde_preprocessors=autograder.integrations.nbgrader_plugin.CollectForGrading"],
                           parallel)
    assert collect.returncode == 0, collect.stdout + collect.stderr
    assert all(score == 0 for score, _ in gradebook(parallel).values())  # nothing scored by the first pass
    assert sorted(p.parent.name for p in pending.glob(f"*/{AID}.ipynb")) == ["alice", "bob", "carol"]
    cluster = DaskCluster(tmp_path)
    try:
        done = subprocess.run([sys.executable, "-m", "autograder.cli", "grade", str(pending), "-a", AID, "--device",
                               "cpu", "--scheduler", str(cluster.file), "--results-dir", str(pregraded)],
                              capture_output=True, text=True, timeout=1200)
    finally:
        cluster.close()
    assert done.returncode == 0, done.stderr
    assert "course: profile `rehearsal`" in done.stderr
    proc = run_nbgrader(["autograde", AID, "--force", f"--TrustedGrade.results_dir={pregraded}"], parallel)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "graded here" not in proc.stdout + proc.stderr  # every student's result came from the cluster
    assert gradebook(parallel) == gradebook(serial)
    assert gradebook(serial)["alice"][0] > gradebook(serial)["carol"][0] > 0 == gradebook(serial)["bob"][0]
