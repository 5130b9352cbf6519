"""The clusters `course grade --cluster KIND --jobs N [--gpus-per-job K]` starts, through Dask's own adapters.

- local: a distributed.LocalCluster on this machine, bound to 127.0.0.1 only (nobody else can reach a scheduler
  that runs whatever it is sent), one grading at a time per worker, the cores split between the workers.
- slurm, pbs: dask-jobqueue (the `slurm` extra) submits N batch jobs, each running K workers (one per GPU, each
  claiming its own CUDA_VISIBLE_DEVICES: autograder/batch/task.py claim_gpu), or one worker without GPUs.
  The site's queue, account, memory and walltime come from dask-jobqueue's own configuration
  (~/.config/dask/jobqueue.yaml, jobqueue.slurm.* / jobqueue.pbs.*); what it leaves unset gets the defaults below.
- k8s: dask-kubernetes' operator (the `k8s` extra; the operator installed in the Kubernetes cluster) runs a
  DaskCluster of N worker pods, K GPUs each (K=1: one worker per GPU); the image with the course installed is
  dask's `course.image` setting (DASK_COURSE__IMAGE). `render("k8s", ...)` is the resource, for `kubectl apply`.

Every worker grades one submission at a time (`--nthreads 1`: pytest is not thread-safe), with its CPU threads
set explicitly (COURSE_WORKER_THREADS; Dask's nanny would leave OMP_NUM_THREADS=1), and, with GPUs, advertises
the resource GPU=1 that each task asks for.
"""
from autograder.errors import ConfigError

KINDS = ("local", "slurm", "pbs", "k8s")
THREADS_PER_WORKER = 4  # CPU threads of each grading on a batch or pod worker (a GPU's training needs few);
# dask's course.threads setting (DASK_COURSE__THREADS) changes it
MEMORY_PER_WORKER_GB = 8  # a grading's sandbox stays under course.yaml's memory limit; the grader beside it
WALLTIME = "02:00:00"  # longer than one grading (course.yaml's limits): a worker's job never ends mid-grading;
# dask's course.walltime overrides it (jobqueue's own default, 30 min, is not taken: it can be shorter)
NAME = "course-grader"


# The scheduler hands a worker only the tasks it can run now (one: --nthreads 1), never a queue of its own: when a
# worker dies, only the grading it was running is counted against (distributed.scheduler.allowed-failures), and
# not the innocent ones queued behind it; and nothing to steal.
SCHEDULER_CONFIG = {"distributed.scheduler.worker-saturation": 1.0, "distributed.scheduler.work-stealing": False}
# Defaults a site's own Dask configuration overrides:
# - a worker silent for two minutes hangs (stopped, swapped to death: its event loop heartbeats every half second, as
#   the grading runs in a thread and the student's code in a sandbox), so its nanny restarts it and its grading runs
#   elsewhere, where Dask's default would wait five minutes;
# - Dask's own watches poll less often: the coordinator holds the scheduler (and, with --cluster local, the nannies),
#   whose 20 ms event-loop ticks, 100 ms memory checks and 500 ms system samples took 3.6% of a core on a 2-core
#   machine, and each worker profiles its threads every 10 ms, which a grading does not need: a grading is a
#   minute, not a task of milliseconds (benchmarks/RESULTS.md, "A class on Dask with faults").
SCHEDULER_DEFAULTS = {"distributed.scheduler.worker-ttl": "120s", "distributed.admin.tick.interval": "1s",
                      "distributed.admin.system-monitor.interval": "5s",
                      "distributed.worker.memory.monitor-interval": "1s",
                      "distributed.worker.profile.enabled": False}


def nested(settings):
    """{"a.b.c": v} as Dask's nested configuration {"a": {"b": {"c": v}}}."""
    tree = {}
    for key, value in settings.items():
        *path, last = key.split(".")
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return tree


def scheduler_env():
    """The scheduler's settings as the environment of a scheduler started elsewhere (a pod): DASK_A__B_C is a.b-c."""
    return {f"DASK_{key.upper().replace('.', '__').replace('-', '_')}": str(value)
            for key, value in {**SCHEDULER_CONFIG, **SCHEDULER_DEFAULTS}.items()}


def worker_env(threads):
    """What each worker's environment sets: its grading's CPU threads, and the math libraries' to match."""
    return {"COURSE_WORKER_THREADS": str(threads), "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "OMP_WAIT_POLICY": "PASSIVE"}


def worker_args(gpus, threads_flag=True):
    """The `dask worker` flags of a grading worker (dask-jobqueue sets --nthreads itself: cores / processes)."""
    return [*(["--nthreads", "1"] if threads_flag else []), *(["--resources", "GPU=1"] if gpus else [])]


def _jobqueue(kind):
    try:
        import dask_jobqueue
    except ImportError as e:
        raise ConfigError(f"--cluster {kind} starts its workers with dask-jobqueue, which is not installed: "
                          f"pip install 'attention-course[slurm]'") from e
    return dask_jobqueue


def jobqueue_cluster(kind, gpus=0, threads=THREADS_PER_WORKER, **more):
    """A dask-jobqueue cluster (no job submitted until it is scaled): one job runs max(1, gpus) workers."""
    import dask
    jobqueue = _jobqueue(kind)
    workers = max(1, gpus)
    site = lambda key: dask.config.get(f"jobqueue.{kind}.{key}", None)  # noqa: E731
    cores = threads * workers
    memory = site("memory") or f"{MEMORY_PER_WORKER_GB * workers}GB"
    env = worker_env(threads)
    # cores=workers: Dask's threads per worker are cores/processes, and a worker grades one submission at a time;
    # the CPUs the job asks for are the gradings' threads (job_cpu, resource_spec)
    options = dict(cores=workers, processes=workers, memory=memory, name=NAME, job_name=NAME,
                   walltime=dask.config.get("course.walltime", None) or WALLTIME,
                   job_script_prologue=[*(site("job-script-prologue") or []),
                                        *(f"export {k}={v}" for k, v in env.items())],
                   worker_extra_args=[*(site("worker-extra-args") or []), *worker_args(gpus, threads_flag=False)],
                   **more)
    if kind == "slurm":
        options["job_cpu"] = site("job-cpu") or cores
        options["job_extra_directives"] = [*(site("job-extra-directives") or []),
                                           *([f"--gres=gpu:{gpus}"] if gpus else [])]
        return jobqueue.SLURMCluster(**options)
    if kind == "pbs":
        mem = memory.lower().replace("gib", "gb")
        options["resource_spec"] = site("resource-spec") or (
            f"select=1:ncpus={cores}:mem={mem}" + (f":ngpus={gpus}" if gpus else ""))
        return jobqueue.PBSCluster(**options)
    raise ConfigError(f"--cluster {kind}: expected one of {', '.join(KINDS)}")


def kubernetes_spec(jobs, gpus=1, threads=THREADS_PER_WORKER, image=None):
    """The DaskCluster resource (dask-kubernetes' operator, kubernetes.dask.org/v1; the layout of its
    make_cluster_spec) of `jobs` worker pods with `gpus` GPUs each; the scheduler pod gets no GPU. Written here,
    not by dask-kubernetes (200 MB with the Kubernetes clients), so that rendering it needs no extra."""
    import dask
    image = image or dask.config.get("course.image", None)
    if not image:
        raise ConfigError("--cluster k8s: the image with the course installed is not set: set dask's course.image "
                          "(DASK_COURSE__IMAGE=registry/course:TAG, or course: {image: ...} in ~/.config/dask/)")
    limits = {"cpu": str(threads), "memory": f"{MEMORY_PER_WORKER_GB}Gi",
              **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    env = lambda values: [{"name": k, "value": v} for k, v in values.items()]  # noqa: E731
    worker = {"name": "worker", "image": image,
              "args": ["dask", "worker", "--name", "$(DASK_WORKER_NAME)", "--dashboard", "--dashboard-address", "8788",
                       *worker_args(gpus)],
              "env": env(worker_env(threads)), "resources": {"requests": dict(limits), "limits": dict(limits)},
              "ports": [{"name": "http-dashboard", "containerPort": 8788, "protocol": "TCP"}]}
    health = {"httpGet": {"port": "http-dashboard", "path": "/health"}}
    scheduler = {"name": "scheduler", "image": image, "args": ["dask", "scheduler", "--host", "0.0.0.0"],
                 "env": env(scheduler_env()),
                 "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}},
                 "ports": [{"name": "tcp-comm", "containerPort": 8786, "protocol": "TCP"},
                           {"name": "http-dashboard", "containerPort": 8787, "protocol": "TCP"}],
                 "readinessProbe": {**health, "initialDelaySeconds": 0, "periodSeconds": 1, "timeoutSeconds": 300},
                 "livenessProbe": {**health, "initialDelaySeconds": 15, "periodSeconds": 20}}
    service = {"type": "ClusterIP", "selector": {"dask.org/cluster-name": NAME, "dask.org/component": "scheduler"},
               "ports": [{"name": "tcp-comm", "protocol": "TCP", "port": 8786, "targetPort": "tcp-comm"},
                         {"name": "http-dashboard", "protocol": "TCP", "port": 8787, "targetPort": "http-dashboard"}]}
    return {"apiVersion": "kubernetes.dask.org/v1", "kind": "DaskCluster", "metadata": {"name": NAME},
            "spec": {"idleTimeout": 0, "worker": {"replicas": jobs, "spec": {"containers": [worker]}},
                     "scheduler": {"spec": {"containers": [scheduler]}, "service": service}}}


def render(kind, jobs=1, gpus=0, threads=THREADS_PER_WORKER):
    """The job specification `--cluster kind` submits, as text: a batch job script, or the DaskCluster YAML."""
    if kind == "k8s":
        import yaml
        return yaml.safe_dump(kubernetes_spec(jobs, gpus, threads), sort_keys=False)
    loopback = {"scheduler_options": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}}
    with jobqueue_cluster(kind, gpus, threads, **loopback) as cluster:  # its scheduler starts, and closes here
        return cluster.job_script()


def start_cluster(kind, jobs=1, gpus=0):
    """A started cluster of `jobs` jobs (or pods, or local workers); the caller closes it."""
    import dask
    dask.config.set(SCHEDULER_CONFIG)  # the scheduler of local and jobqueue clusters runs in this process
    dask.config.update_defaults(nested(SCHEDULER_DEFAULTS))  # replaces Dask's default only, never the site's setting
    if kind == "local":
        return local_cluster(jobs)
    threads = int(dask.config.get("course.threads", None) or THREADS_PER_WORKER)  # DASK_COURSE__THREADS=2
    if kind == "k8s":
        try:
            from dask_kubernetes.operator import KubeCluster
        except ImportError as e:
            raise ConfigError("--cluster k8s starts its workers with dask-kubernetes' operator, which is not "
                              "installed: pip install 'attention-course[k8s]'") from e
        return KubeCluster(custom_cluster_spec=kubernetes_spec(jobs, gpus, threads))
    cluster = jobqueue_cluster(kind, gpus, threads)
    cluster.scale(jobs=jobs)
    return cluster


def local_cluster(workers):
    """A LocalCluster of `workers` grading workers on 127.0.0.1 only, the cores split between them."""
    import os

    from distributed import LocalCluster

    from autograder.sandbox.grader_side import threads_per_worker
    threads = threads_per_worker(workers)
    os.environ.update(worker_env(threads))  # the nanny passes this process's environment to its workers
    return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                        dashboard_address="127.0.0.1:0", scheduler_port=0)
