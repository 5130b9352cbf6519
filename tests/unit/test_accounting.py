"""The memory watch's process lists: the cheap walks find what a scan of every process finds."""
import os
import subprocess
import time
from pathlib import Path

from autograder.sandbox.accounting import descendants, pids_of_uid, processes


def scanned_descendants(root):
    """pid -> uid below `root` by a scan of every process's stat (what the walk replaces)."""
    procs, found, frontier = processes(), set(), {root}
    while frontier:
        frontier = {pid for pid, (ppid, _) in procs.items() if ppid in frontier} - found
        found |= frontier
    return {pid: procs[pid][1] for pid in found}


def test_the_children_walk_finds_the_tree_a_scan_finds():
    # a tree three deep with a zombie in it: sh -> (sleep, sh -> sleep), and a child that exited unreaped
    tree = subprocess.Popen(["sh", "-c", "sleep 30 & sh -c 'sleep 30' & wait"])
    zombie = subprocess.Popen(["true"])
    try:
        while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            time.sleep(0.01)
        # the tree is whole once its inner sh has started its sleep (counted below the tree itself: the test's
        # process may have other children, an xdist worker's from earlier tests, which come and go)
        for _ in range(200):
            if len(scanned_descendants(tree.pid)) == 3:
                break
            time.sleep(0.05)
        for _ in range(20):  # another child of this process may start or end between the two reads
            walked, scanned = descendants(os.getpid()), scanned_descendants(os.getpid())
            if walked == scanned:
                break
        assert walked == scanned
        assert tree.pid in walked and set(scanned_descendants(tree.pid)) <= set(walked)
        assert zombie.pid not in walked, "an exited, unreaped child holds no memory: not the sandbox's"
    finally:
        tree.kill()
        tree.wait()
        zombie.wait()


def test_a_uids_processes_are_those_a_scan_finds():
    uid = os.getuid()
    for _ in range(20):  # processes come and go between the two reads: equal in one of a few tries
        walked = sorted(pids_of_uid(uid))
        if walked == sorted(pid for pid, (_, owner) in processes().items() if owner == uid):
            break
    else:
        raise AssertionError(f"pids_of_uid({uid}) and a scan of every process disagree: {walked}")
    assert os.getpid() in walked
    assert pids_of_uid(2**31 - 2) == [], "no process has that uid"
