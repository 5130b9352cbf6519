"""Where a class is graded: the one seam `course grade DIR` and the nbgrader path dispatch submissions through.

- `--workers N` (Where(workers=N)): this machine's process pool (grade_batch in autograder/batch/run.py);
  it needs nothing beyond the course's own dependencies.
- `--scheduler tcp://HOST:PORT` (or tls://, or a scheduler file): a Dask cluster that a site already runs.
- `--cluster local|slurm|pbs|k8s --jobs N [--gpus-per-job K]`: one started here through the optional extras
  (autograder/batch/clusters.py) and torn down at the end.

On a Dask cluster each task carries the notebook's bytes, their sha256, the assignment and the grader identity
(autograder/batch/task.py); this process, the coordinator, alone writes the results folder, under the same lock
and atomic write as a local batch, and takes exactly one result per submission however often Dask ran its task.
The notebooks are read one at a time as they are sent, and Dask's logs of recent messages, which would keep
up to 1,000 of them per stream, log nothing (autograder/batch/message_logs.py).
A task whose worker died while running it is run again by Dask on another worker. Dask gives up on a task
(KilledWorker) after `distributed.scheduler.allowed-failures` + 1 worker deaths (3 + 1 by default), counting the
deaths of workers it was merely waiting on; so the coordinator counts the times the grading itself started (an
event each task logs): one that started on KILLS_TO_BLAME workers that then died ends as a grader error for that
submission (never a 0), the rest of the batch goes on, and a submission Dask gave up on that had not started that
often is submitted again.
"""
import hashlib
import json
import sys
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from autograder.batch.identity import file_digest, identity_here, parts_here
from autograder.batch.results import claimed, grading_identity, held
from autograder.batch.run import failed_result, grade_batch
from autograder.errors import ConfigError

KILLS_TO_BLAME = 2  # a grading that was running on two workers that both died kills workers: a grader error
MAX_SUBMITS = 5  # however unlucky a submission is with dying neighbours, the batch ends
WORKERS_WAIT_SECONDS = 600  # a batch job's workers may sit in the queue a while before the first one starts


@dataclass
class Where:
    """The command line's choice of machines (see the module doc)."""
    workers: int = 1
    scheduler: str | None = None  # tcp://HOST:PORT, tls://HOST:PORT or a scheduler file
    cluster: str | None = None    # local, slurm, pbs or k8s
    jobs: int = 1
    gpus_per_job: int = 0

    @property
    def on_dask(self):
        return bool(self.scheduler or self.cluster)


def grade_class(submissions, aid, items=None, device="auto", where=None, results_dir=None, progress=None,
                say=None):
    """[(name, result)] in the order given, wherever `where` says; `progress` as grade_batch's; `say(line)` is
    told the cluster's scheduler and dashboard link (default: a line on stderr)."""
    where = where or Where()
    if where.scheduler and where.cluster:
        raise ConfigError(f"--scheduler {where.scheduler} attaches to a running cluster and --cluster {where.cluster} "
                          f"starts one: give one of them")
    if not where.on_dask:
        return grade_batch(submissions, aid, items=items, device=device, workers=where.workers,
                           results_dir=results_dir, progress=progress)
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    with dask_client(where, aid, say) as client:
        return grade_on_dask(client, submissions, aid, items, device, results_dir, progress,
                             resources={"GPU": 1} if where.gpus_per_job else None)


def _distributed():
    try:
        import distributed
    except ImportError as e:
        raise ConfigError("--scheduler and --cluster grade on Dask, which is not installed: "
                          "pip install 'attention-course[cluster]'") from e
    return distributed


@contextmanager
def dask_client(where, aid, say):
    """A Dask client on the cluster `where` names: attached to a running one, or one started (and closed) here."""
    distributed = _distributed()
    from autograder.batch.message_logs import NoMessageLog, forget_messages
    from autograder.batch.task import WarmWorker
    cluster = None
    if where.scheduler:
        target = where.scheduler
        on_file = "://" not in target and Path(target).expanduser().is_file()
        if "://" not in target and not on_file:
            raise ConfigError(f"--scheduler {target}: expected an address (tcp://HOST:PORT, tls://HOST:PORT) or an "
                              f"existing scheduler file (what `dask scheduler --scheduler-file FILE` wrote)")
        try:
            client = (distributed.Client(scheduler_file=str(Path(target).expanduser())) if on_file
                      else distributed.Client(target))
        except OSError as e:  # nobody listening there, or a scheduler file whose scheduler has gone
            raise ConfigError(f"the Dask scheduler at {target} did not answer ({e}): is it running (`dask scheduler`), "
                              f"and is that its address?") from None
    else:
        from autograder.batch.clusters import start_cluster
        cluster = start_cluster(where.cluster, where.jobs, where.gpus_per_job)
        client = distributed.Client(cluster)
    try:
        forget_messages(client.scheduler_comm)
        if cluster is not None:  # its scheduler runs here, or in a pod of the course's image: it can load the plugin
            install(client, NoMessageLog())
        install(client, WarmWorker([aid]))
        link = _dashboard(client)
        say(f"cluster: {client.scheduler.address}" + (f"; dashboard: {link}" if link else ""))
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def install(client, plugin, tries=3):
    """Register a plugin: a worker plugin on every worker, and on each that joins later; a scheduler plugin on the
    scheduler. A worker that dies as it reaches it gets it from the scheduler as its nanny restarts it, so the
    registration is tried again, not given up."""
    for attempt in range(1, tries + 1):
        try:
            return client.register_plugin(plugin)
        except OSError as e:  # distributed's CommClosedError: a worker, or the link to it, gone mid-registration
            if attempt == tries:
                raise ConfigError(f"the Dask cluster lost workers {tries} times while the grader was installed on them "
                                  f"({e}): look at why its workers die (their logs; memory, the batch system)") from e


def _dashboard(client):
    """The scheduler's dashboard link, when it serves one (it needs bokeh)."""
    try:
        return client.dashboard_link if "dashboard" in client.scheduler_info().get("services", {}) else ""
    except Exception:  # a link is a convenience: never a reason to stop grading
        return ""


def cluster_device(client, device):
    """'auto' settled as course.yaml's device, else on the workers (cuda where they have GPUs), so that the
    coordinator's grader identity is theirs; workers that disagree are a setting to fix, not a guess."""
    if device == "auto":
        from autograder.course.config import load_course
        device = load_course().device
    if device != "auto":
        return device
    from autograder.batch.task import resolved_device
    client.wait_for_workers(1, timeout=WORKERS_WAIT_SECONDS)
    seen = set(client.run(resolved_device, "auto").values())
    if len(seen) != 1:
        raise ConfigError(f"--device auto: the workers disagree ({', '.join(sorted(seen))}); pass --device cpu "
                          f"or --device cuda")
    return seen.pop()


def grade_on_dask(client, submissions, aid, items, device, results_dir, progress, resources=None):
    """grade_batch's contract on a Dask cluster (module doc): saved results reused, the rest graded by tasks."""
    from autograder.batch.task import grade_bytes
    device = cluster_device(client, device)
    grader, parts = identity_here(aid, device), parts_here(aid, device)
    if results_dir is not None:
        results_dir = Path(results_dir)
        results_dir.mkdir(parents=True, exist_ok=True)
    results, todo, done = {}, [], 0
    for name, notebook in submissions:
        notebook = Path(notebook)
        sha = file_digest(notebook)  # read and let go: a class's notebooks are read again one at a time, as sent
        if results_dir is not None:
            with claimed(results_dir, name) as entry:
                found = entry.without_grading(grading_identity(aid, sha, items, grader), parts, aid, notebook)
            if found is not None:
                results[name] = held(found[0])
                done += 1
                if progress:
                    progress(done, len(submissions), name, *found)
                continue
        todo.append((name, notebook))
    todo.reverse()  # popped from the end: in the order given
    in_flight, submits, run = {}, {}, uuid.uuid4().hex[:8]  # run: this batch's keys and events, not another's
    try:
        while todo or in_flight:
            slots = _slots(client) if todo else 0  # asked once a pass: a round trip to the scheduler
            while todo and len(in_flight) < slots:
                name, notebook = todo.pop()
                data = notebook.read_bytes() if notebook.is_file() else None
                sha = hashlib.sha256(data).hexdigest() if data is not None else ""  # what is sent is what is stored
                submits[name] = submits.get(name, 0) + 1
                future = client.submit(grade_bytes, name, notebook.name, data, sha, aid, items, device, grader,
                                       key=f"grade-{name}-{sha[:16]}-{run}-{submits[name]}", pure=False,
                                       resources=resources)
                in_flight[future] = name, notebook, sha  # not the bytes: Dask holds them while it must
            finished = _wait_first(in_flight)
            for future in finished:
                name, notebook, sha = in_flight.pop(future)
                if _innocent_bystander(client, future, f"grade-{name}-{sha[:16]}-{run}-", submits[name]):
                    todo.append((name, notebook))
                    continue
                result, how = _outcome(future, aid, name), "graded"
                if results_dir is not None:
                    with claimed(results_dir, name) as entry:  # stored against what is saved now: another run
                        result, how = entry.store(result, grading_identity(aid, sha, items, grader), items, notebook,
                                                  parts)
                results[name] = held(result)
                done += 1
                if progress:
                    progress(done, len(submissions), name, result, how)
    except BaseException:
        client.cancel(list(in_flight))  # an interrupted coordinator leaves no grading behind on the cluster
        raise
    return [(name, results[name]) for name, _ in submissions]


def _innocent_bystander(client, future, prefix, submits):
    """Whether Dask gave up on this task for worker deaths that its grading (started fewer than KILLS_TO_BLAME
    times) cannot have caused: it was waiting on those workers. Then it is submitted again (at most MAX_SUBMITS)."""
    from distributed.scheduler import KilledWorker

    from autograder.batch.task import STARTED
    if future.status != "error" or not isinstance(future.exception(), KilledWorker) or submits >= MAX_SUBMITS:
        return False
    started = sum(str(msg.get("key", "")).startswith(prefix) for _, msg in client.get_events(STARTED))
    return started < KILLS_TO_BLAME


def _slots(client):
    """How many gradings may be on the cluster at once: one per worker thread (at least one). No more: a task
    handed to a busy worker waits there, and if that worker dies, Dask counts the death against the waiting
    task too (distributed.scheduler.allowed-failures), though it never ran."""
    return max(1, sum(client.nthreads().values()))


def _wait_first(futures, poll_s=5):
    """The futures done, waiting until at least one is; every poll_s seconds the caller may top up (workers that
    joined since: a batch job's start from the queue)."""
    from distributed import wait
    try:
        finished = wait(list(futures), timeout=poll_s, return_when="FIRST_COMPLETED").done if futures else set()
    except TimeoutError:
        return []
    return [f for f in futures if f in finished]


def _outcome(future, aid, name):
    """The task's result, or a grader error saying why there is none (never a score of 0)."""
    from distributed.scheduler import KilledWorker

    from autograder.batch.task import GraderMismatch
    try:
        return json.loads(future.result())
    except KilledWorker as e:
        return failed_result(aid, name, f"the grader failed on this submission: every worker that ran its grading "
                                        f"died while it ran ({e}); it was not scored, rerun it")
    except GraderMismatch as e:
        return failed_result(aid, name, f"the grader failed on this submission: {e}")
    except Exception as e:  # a task's own failure (a worker's error) is this submission's grader error
        return failed_result(aid, name, f"the grader failed on this submission ({type(e).__name__}: {e}); "
                                        f"it was not scored, rerun it")
