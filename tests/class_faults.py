"""The faults a class meets on a Dask cluster, for tests/test_class_faults.py and benchmarks/class_faults.py:
`course grade` run as a TA runs it and watched from outside (Coordinator), a killer that SIGKILLs busy workers at
random moments and SIGSTOPs one (Killer), and what of a killed coordinator is still alive (left_behind). Not part of
the grader."""
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import psutil

from autograder.course.config import load_course
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells

ROOT = Path(__file__).resolve().parents[1]
LAB = "lab14_transformers"
LEFT_AFTER = 10  # seconds after the coordinator's death by which nothing of it may be left
ENV = {**{k: v for k, v in os.environ.items() if k != "COURSE_NO_CACHE"}, "PYTHONPATH": str(ROOT)}


def program(sources, tag):
    """The cells with a statement of their own: a program no other submission is."""
    return {item: f"{source}\n_submission = {tag!r}\n" for item, source in sources.items()}


def make_class(folder, size, run, endless=True):
    """`size` lab14 submissions under folder/studentNNN/ (see the module doc; `endless`: one of them): {name: kind}."""
    items = list(load_course().assignment(LAB).items)
    solved, release = solved_sources(LAB), release_notebook(LAB)
    broken = ["syntax", "raises", "not-json", "empty"]
    kinds = {}
    for k in range(size):
        name, tag = f"student{k:04d}", f"{run}-{k}"
        path = folder / name / f"{LAB}.ipynb"
        path.parent.mkdir(parents=True)
        share = k % 10
        if endless and k == size // 2:
            kind, cells = "endless", program(solved, tag)
            first = items[0]
            cells[first] = re.sub(r"(def \w+\([^)]*\)[^:]*:)", r"\1\n    while True:\n        pass", cells[first],
                                  count=1)
        elif share < 4:
            kind, cells = "complete", program(solved, tag)
        elif share < 7:
            kind, cells = "partly", program({i: solved[i] for i in items[:1 + k % (len(items) - 1)]}, tag)
        elif share < 9:
            kind, cells = "release", None
        else:
            kind = broken[(k // 10) % len(broken)]
            cells = program(solved, tag)
            if kind == "syntax":
                cells[items[1]] = cells[items[1]].replace("def ", "def (", 1)
            elif kind == "raises":
                cells[items[0]] += "\nraise RuntimeError('a bug of the student at load')\n"
        kinds[name] = kind
        if kind == "not-json":
            path.write_text(nbformat.writes(with_cells(release, cells))[: 5000])
        elif kind == "empty":
            path.write_bytes(b"")
        else:
            nbformat.write(with_cells(release, cells) if cells else release, path)
    return kinds


class Coordinator:
    """`course grade` as a TA starts it, its own CPU and peak memory sampled (/proc: not its children's), and
    every process of its tree seen while it ran."""

    def __init__(self, folder, aid, results, flags, log, env=None):
        self.log, self.started = Path(log), time.time()
        argv = [sys.executable, "-m", "autograder.cli", "grade", str(folder), "-a", aid, "--device", "cpu",
                "--results-dir", str(results), "--json", str(Path(log).with_suffix(".json")), *flags]
        self.env = env or ENV
        with open(self.log, "w") as err, open(Path(log).with_suffix(".out"), "w") as out:
            # its own process group, as a shell starts a command: a group that has lost its leader and holds a
            # stopped worker gets SIGHUP from the kernel, which must not reach the next coordinator
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=out, stderr=err,
                                         start_new_session=True)
        self.cpu, self.peak_kb, self.tree = 0.0, 0, {}
        self.sampler = threading.Thread(target=self._sample, daemon=True)
        self.sampler.start()

    def _sample(self):
        me = psutil.Process(self.proc.pid)
        while self.proc.poll() is None:
            try:
                times = me.cpu_times()
                self.cpu = times.user + times.system
                status = Path(f"/proc/{self.proc.pid}/status").read_text()
                self.peak_kb = int(re.search(r"VmHWM:\s+(\d+)", status).group(1))
                self._look(me)
            except (psutil.Error, OSError, AttributeError):
                pass
            time.sleep(0.2)

    def _look(self, me):
        for child in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                self.tree.setdefault(child.pid, child.create_time())

    def wait(self):
        code = self.proc.wait()
        self.sampler.join()
        self.wall = time.time() - self.started
        return code

    def kill(self):
        """SIGKILL, after a last look at its tree (a sandbox forked since the sampler's last look is in it)."""
        with contextlib.suppress(psutil.Error):  # it may have ended on its own
            self._look(psutil.Process(self.proc.pid))
        self.proc.send_signal(signal.SIGKILL)
        return self.wait()

    def scheduler(self, timeout=300):
        """The address `course grade` printed for its cluster."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            found = re.search(r"cluster: (tcp://[\d.]+:\d+)", self.log.read_text())
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                raise RuntimeError(f"course grade ended before its cluster started:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)
        raise RuntimeError("no cluster address in 5 minutes")


def name_of(key):
    return str(key)[len("grade-"):].rsplit("-", 3)[0]


class Killer(threading.Thread):
    """SIGKILLs a busy worker of the coordinator's cluster at random moments, `every` (low, high) seconds apart, and
    SIGSTOPs one once, after `kills_first` kills (a hang: the scheduler's worker-ttl ends it). It never strikes a
    worker whose grading was hit already (`hit`, shared between the runs of one class): a grading hit twice is
    the blame path (autograder/batch/scheduler.py KILLS_TO_BLAME), which tests/test_cluster.py covers. With `most`,
    it stops once that many gradings of the class are hit (each blow costs a worker's restart and warm-up)."""

    def __init__(self, coordinator, rng, hit, every, stop_one=True, kills_first=2, most=None):
        super().__init__(daemon=True)
        self.coordinator, self.rng, self.hit, self.every = coordinator, rng, hit, every
        self.stop_one, self.kills_first, self.most = stop_one, kills_first, most
        self.blows, self.done, self.stopped = [], threading.Event(), set()

    def run(self):
        from distributed import Client
        try:
            client = Client(self.coordinator.scheduler(), timeout=60)
        except Exception as e:
            print(f"killer: no cluster to attack ({e})", flush=True)
            return
        pids = {}
        try:
            while not self.done.wait(self.rng.uniform(*self.every)):
                if self.most is not None and len(self.hit) >= self.most:
                    break
                processing = client.processing()
                new = [a for a in processing if a not in pids and a not in self.stopped]
                if new:
                    pids.update(client.run(os.getpid, workers=new))
                busy = [(a, keys[0]) for a, keys in processing.items()
                        if keys and a not in self.stopped and a in pids and name_of(keys[0]) not in self.hit]
                if not busy:
                    continue
                address, key = self.rng.choice(busy)
                hang = self.stop_one and not self.stopped and len(self.blows) >= self.kills_first
                self.hit.add(name_of(key))
                try:
                    os.kill(pids[address], signal.SIGSTOP if hang else signal.SIGKILL)
                except ProcessLookupError:  # it died since it was listed: the grading it ran is struck already
                    continue
                if hang:
                    self.stopped.add(address)
                self.blows.append((time.time(), name_of(key), "SIGSTOP" if hang else "SIGKILL"))
        except Exception:  # the coordinator, and its scheduler, gone: the blows so far stand
            pass
        finally:
            client.close(timeout=5)


def left_behind(coordinator):
    """The coordinator's processes still alive: one of its tree as last seen (the same pid, started at the same
    moment), one of its session (a worker the sampler never saw), or a descendant of either. Scoped to this one
    coordinator, since other tests' graders run beside it under xdist."""
    tree = coordinator.tree
    alive = []
    for p in psutil.process_iter(["pid", "create_time", "cmdline"]):
        try:
            line = p
            while line is not None and line.pid > 1:
                if tree.get(line.pid) == line.create_time() or os.getsid(line.pid) == coordinator.proc.pid:
                    alive.append(f"{p.pid} {' '.join(p.info['cmdline'] or [])[:100]}")
                    break
                line = line.parent()
        except (psutil.Error, OSError):
            continue
    return alive


def gone_within(coordinator, seconds):
    """What is left of a dead coordinator `seconds` after its death (left_behind), or nothing, as soon as nothing
    is: a process of its tree cannot come back, so once none is alive none will be."""
    deadline = time.monotonic() + seconds
    left = left_behind(coordinator)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)  # the kernel ends them (die_with_parent): no event of theirs to wait on from here
        left = left_behind(coordinator)
    return left


@dataclass
class Faults:
    """What killed_halfway_and_rerun saw."""
    saved: int            # results on disk when the coordinator was killed
    killed_after: float   # seconds into the first run
    left: list            # processes still alive LEFT_AFTER seconds after the kill (gone_within)
    code: int             # the rerun's exit status
    wall: float           # both runs' seconds
    blows: list           # (seconds since the first start, submission, signal)
    rewritten: list       # first-run results the rerun wrote again
    graded: int           # what the rerun graded, and reused, by its own count
    reused: int


def killed_halfway_and_rerun(folder, aid, results, flags, logs, rng, every, halfway, more=(), env=None,
                             kills_first=2, most=None):
    """`course grade` of `folder` with `flags` while a Killer strikes; SIGKILLed once `halfway` results are saved,
    what is left of it LEFT_AFTER seconds later noted; then the same command again, struck too, to its end.
    Logs: `logs`1.err/.out/.json and `logs`2.*."""
    hit = set()
    first = Coordinator(folder, aid, results, [*flags, *more], f"{logs}1.err", env)
    killer = Killer(first, rng, hit, every, kills_first=kills_first, most=most)
    killer.start()
    while len(list(Path(results).glob("*.json"))) < halfway and first.proc.poll() is None:
        time.sleep(0.2)
    saved = {p.name: p.stat().st_mtime_ns for p in Path(results).glob("*.json")}
    killed_after = time.time() - first.started
    first.kill()
    killer.done.set()
    killer.join()
    left = gone_within(first, LEFT_AFTER)
    second = Coordinator(folder, aid, results, [*flags, *more], f"{logs}2.err", env)
    again = Killer(second, rng, hit, every, stop_one=not killer.stopped, kills_first=0, most=most)
    again.start()
    code = second.wait()
    again.done.set()
    again.join()
    counts = re.search(r"(\d+) graded, (\d+) reused", Path(f"{logs}2.out").read_text())
    return Faults(len(saved), killed_after, left, code, time.time() - first.started,
                  [(t - first.started, name, sig) for t, name, sig in killer.blows + again.blows],
                  [n for n, mtime in saved.items() if (Path(results) / n).stat().st_mtime_ns != mtime],
                  int(counts.group(1)) if counts else -1, int(counts.group(2)) if counts else -1)
