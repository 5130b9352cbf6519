"""Whose processes are the sandbox's and how much memory they hold: uid leases and /proc accounting.

A sandbox at a fresh uid is killed and measured by that uid, so each leases its own; without one, its processes
are those under its monitor (descendants). Memory is read from /proc: cheap resident sizes first, proportional
sizes only when those are past the limit.
"""
import contextlib
import fcntl
import os
import tempfile
import time
from pathlib import Path

from autograder.sandbox.protocol import SandboxFailure

UID_BASE, UID_SPAN = 200000, 50000
# One flock per uid in use, shared on purpose by every root grader of the machine (they lease from one range):
# under /run, which only root may write, where there is one, so no other user can plant it or its files
UID_LEASES = Path("/run" if os.access("/run", os.W_OK) else tempfile.gettempdir()) / "course-sandbox-uids"


def lease_uid():
    """(uid, lease): a uid no live process has, held by an flock for the sandbox's life.

    The lease is what keeps two graders (or two batch workers) from picking the same uid at the same moment:
    the sandbox is killed by uid, so a shared uid would let one grader kill another's student.
    """
    UID_LEASES.mkdir(mode=0o700, exist_ok=True)
    st = UID_LEASES.lstat()
    if not UID_LEASES.is_dir() or UID_LEASES.is_symlink() or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise SandboxFailure("sandbox", f"{UID_LEASES} is not a folder of this user's alone: remove it")
    used = uids_in_use()
    start = (os.getpid() * 7919 + time.monotonic_ns()) % UID_SPAN
    for k in range(UID_SPAN):
        uid = UID_BASE + (start + k) % UID_SPAN
        if uid in used:
            continue
        lease = os.fdopen(os.open(UID_LEASES / str(uid), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600), "w")
        try:
            fcntl.flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lease.close()
            continue
        if uid in uids_in_use():  # started by a grader between our /proc scan and the lease
            lease.close()
            continue
        return uid, lease
    raise SandboxFailure("sandbox", "no free uid for the sandbox")


def uids_in_use():
    """The uids of every process of the machine, zombies included (their uid is not free yet)."""
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                out.add(d.stat().st_uid)
    return out


def parent(pid):
    """The parent of `pid` (`pid` itself when it cannot be read)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return pid


# The memory watch runs these every POLL_SECONDS (channel.py) while a student's code runs, on a machine that may
# hold a thousand processes (a shared JupyterHub server): a read of every process's stat there cost 50-70 ms a poll,
# most of a core taken from the training it watches. So a uid's processes are found by one stat() per process and
# a read only of the few that match, and a tree's by the kernel's children lists from its root down.

def pids_of_uid(uid):
    """Live (not zombie) processes owned by `uid`."""
    owned = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{name}").st_uid == uid and _state(name) not in ("Z", None):
                    owned.append(int(name))
    return owned


def _state(pid):
    """The process's state letter (R, S, Z, ...), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def processes():
    """pid -> (ppid, uid) of every live (not zombie) process."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
                if stat[0] != "Z":
                    out[int(d.name)] = (int(stat[1]), d.stat().st_uid)
    return out


def descendants(root):
    """pid -> uid of the live processes under `root` (a grader's zygote, monitors, sandboxes, the student's)."""
    found = _children_below(root)
    if found is None:  # a kernel without /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN): scan every process
        procs, found, frontier = processes(), set(), {root}
        while frontier:
            frontier = {pid for pid, (ppid, _) in procs.items() if ppid in frontier} - found
            found |= frontier
        return {pid: procs[pid][1] for pid in found}
    out = {}
    for pid in found:
        with contextlib.suppress(OSError):
            uid = os.stat(f"/proc/{pid}").st_uid
            if _state(pid) not in ("Z", None):
                out[pid] = uid
    return out


def _children_below(root):
    """Every pid below `root` by the kernel's per-thread children lists; None where the kernel has none."""
    found, frontier = set(), [root]
    while frontier:
        pid = frontier.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # gone meanwhile
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    children = [int(c) for c in f.read().split()]
            except FileNotFoundError:
                if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                    continue  # the thread ended
                return None
            except OSError:
                continue
            for child in children:
                if child not in found:
                    found.add(child)
                    frontier.append(child)
    return found


def resident_bytes(pids):
    """Resident set size of `pids`, from statm (cheap: no page-table walk); never less than memory_bytes."""
    total, page = 0, os.sysconf("SC_PAGE_SIZE")
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
    return total


def memory_bytes(pids):
    """Proportional set size of `pids`: pages shared between them (a fork's, the zygote's) counted once."""
    total = 0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
            key = "Pss:"
        except OSError:
            try:
                text, key = Path(f"/proc/{pid}/status").read_text(), "VmRSS:"
            except OSError:
                continue
        for line in text.splitlines():
            if line.startswith(key):
                total += int(line.split()[1]) * 1024
                break
    return total


def over_memory(pids, limit):
    """Whether `pids` hold more than `limit` bytes.

    PSS walks every page table (ms per poll, which slowed a 2-thread training by 10%): only when the resident
    sizes, which count shared pages once per process, add up to more than the limit.
    """
    return resident_bytes(pids) > limit and memory_bytes(pids) > limit
