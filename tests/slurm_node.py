"""A real single-node Slurm on this machine, as dask-jobqueue's own CI runs one: munged, slurmctld and slurmd
on 127.0.0.1, each with its files in one folder, nothing written to /etc; the Slurm commands reach it through
SLURM_CONF. Only root can run slurmd (it starts jobs as their users); without root or without Slurm and munge
installed (Debian: `apt-get install slurm-wlm munge`), `why_not()` says why a test must skip."""
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
NODE = "course-node"
PARTITION = "grading"


def why_not():
    """Why a single-node Slurm cannot start here, or None."""
    missing = [d for d in (*DAEMONS, "squeue", "sbatch") if not shutil.which(d, path=f"{os.environ['PATH']}:/usr/sbin")]
    if missing:
        return f"Slurm or munge is not installed ({', '.join(missing)} not found): apt-get install slurm-wlm munge"
    if os.geteuid() != 0:
        return "slurmd starts jobs as their users, so a single-node Slurm needs root"
    return None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _which(name):
    return shutil.which(name, path=f"{os.environ['PATH']}:/usr/sbin")


class SlurmNode:
    """munged, slurmctld and slurmd started in `folder`; `env` is what a login node's shell sets to reach them."""

    def __init__(self, folder, cpus=2, memory_mb=8000):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o755)  # munged refuses a folder that others can write to
        self.conf = self.folder / "slurm.conf"
        self.socket = self.folder / "munge.socket"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs = []
        key = self.folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        for sub in ("state", "spool", "logs"):
            (self.folder / sub).mkdir(exist_ok=True)
        self.conf.write_text(self._config(cpus, memory_mb))
        try:
            self._start(key)
        except BaseException:
            self.close()
            raise

    def _config(self, cpus, memory_mb):
        f = self.folder
        host = socket.gethostname().split(".")[0]
        return "\n".join([
            "ClusterName=course-test",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            "SlurmUser=root", "SlurmdUser=root",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={f / 'state'}", f"SlurmdSpoolDir={f / 'spool'}",
            f"SlurmctldPidFile={f / 'slurmctld.pid'}", f"SlurmdPidFile={f / 'slurmd.pid'}",
            f"SlurmctldLogFile={f / 'logs' / 'slurmctld.log'}", f"SlurmdLogFile={f / 'logs' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none", "ReturnToService=2", "SchedulerType=sched/backfill",
            "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0", "KillWait=5", "MinJobAge=5",
            f"NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname={host} CPUs={cpus} RealMemory={memory_mb} "
            "State=UNKNOWN",
            f"PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
            ""])

    def _daemon(self, *argv):
        with open(self.folder / "logs" / f"{Path(argv[0]).name}.out", "w") as log:  # the daemon keeps its copy
            self.procs.append(subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True))

    def _start(self, key):
        f = self.folder
        self._daemon(_which("munged"), "--foreground", "--force", f"--socket={self.socket}", f"--key-file={key}",
                     f"--pid-file={f / 'munged.pid'}", f"--log-file={f / 'logs' / 'munged.log'}",
                     f"--seed-file={f / 'munge.seed'}")
        self._until(lambda: self.socket.exists(), "munged did not open its socket")
        self._daemon(_which("slurmctld"), "-D", "-i")
        self._daemon(_which("slurmd"), "-D", "-N", NODE)
        self._until(self.idle, "the node did not come up idle")

    def _until(self, ready, what, seconds=60):
        deadline = time.monotonic() + seconds
        while not ready():
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}"
                                 for p in sorted((self.folder / "logs").iterdir()))
                raise RuntimeError(f"{what} ({', '.join(dead) or 'timed out'}):\n{logs}")
            time.sleep(0.3)

    def run(self, *argv):
        """A Slurm command's output, as a login node's shell would get it."""
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30).stdout

    def idle(self):
        return self.run("sinfo", "-h", "-N", "-o", "%T").strip() in ("idle", "mixed")

    def jobs(self):
        """[(job id, name, state)] of the jobs Slurm still holds."""
        out = self.run("squeue", "-h", "-o", "%i %j %T")
        return [tuple(line.split()) for line in out.splitlines() if line.strip()]

    def close(self):
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
