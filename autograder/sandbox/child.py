"""The student's side of the sandbox: a standalone script run as its own process, never imported.

It enters the sandbox before it reads any student code, then answers the grader's requests: run the
notebook's cells, call an item on tensors the grader sent, construct a module, return its state, train a
harness experiment. Nothing here decides a score: the grader compares what comes back with its own reference.

Every message is one JSON line, followed by `blob` bytes of safetensors when it carries tensors, on pipes
the grader created: the grader never opens a path the student can name, so nothing the student leaves on
disk (a FIFO, a symlink, a huge file) can make the grader wait or write where it should not. The messages,
the tags values travel under and their limits are sandbox_protocol.py's, the one definition both sides load.

In four parts: the files loaded by path, isolation, supervision (zygote and monitors), the request server;
then the from-scratch tripwire the server arms around the student's code.

Isolation, the best the machine allows (the grader reports which in `extra_data.isolation`):
  namespaces  root with CAP_SYS_ADMIN: a PID namespace (the sandbox is its init: when it dies, every process
              it started dies with it), no network, and a root of its own holding only the system's programs
              and libraries and the Python environment (read only), a fresh /proc, and a size-limited tmpfs
              (/tmp, /var/tmp, /dev/shm) as the only writable place; a fresh uid; process and file-size limits.
  userns      not root, where the kernel lets anyone make a user namespace: the same PID, mount, network and
              IPC namespaces and the same root as `namespaces`, built inside a user namespace that maps only
              the grader's own uid (no fresh uid to kill by: the PID namespace ends it all).
  uid         root without CAP_SYS_ADMIN (Docker's default): a fresh uid with its process and file-size limits,
              killed as a whole by uid; Landlock lets it read only the system, the Python environment and a
              few machine files, write only its scratch folder, and neither connect nor bind over TCP.
              (`uid-only` when the kernel has no Landlock: the machine's files as that uid finds them.)
  landlock    not root and no user namespace allowed (Docker's seccomp profile, Ubuntu 24.04's AppArmor rule):
              the grader's own uid under the same Landlock rules, in a session whose processes the monitor
              (their subreaper) kills; Landlock's signal scope keeps it from signalling anything outside it.
  process     none of these: a plain child process in its own session. The grader refuses to use it unless
              the TA allowed it (`course grade --allow-unisolated`, or `limits.allow_unisolated` in course.yaml).
At every level a seccomp filter forbids new user namespaces (see forbid_user_namespaces).
"""
import ctypes
import errno
import json
import os
import platform
import sys
import traceback

# ==============================================================================================================
# The files loaded by path.
# Loaded in the zygote, before any sandbox exists: the sandbox's root (or Landlock) shows no course
# file, and this script imports no autograder package.
# ==============================================================================================================


STATE = None     # autograder/sandbox/state.py: weights by order and shape, the grader's one copy
LANDLOCK = None  # autograder/sandbox/landlock.py: Landlock's calls
PROTOCOL = None  # autograder/sandbox/protocol.py: the messages and the value codec, the grader's own
HELPERS = {"STATE": "state.py", "LANDLOCK": "landlock.py", "PROTOCOL": "protocol.py"}


def load_helpers():
    """The grader's one copy-by-order-and-shape (state.py), its Landlock calls (landlock.py) and the protocol
    (sandbox_protocol.py), as modules of their own, from this script's folder: it imports no autograder package."""
    import importlib.util
    for name, file in HELPERS.items():
        spec = importlib.util.spec_from_file_location(f"course_{name.lower()}", os.path.join(os.path.dirname(__file__), file))
        globals()[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


# ==============================================================================================================
# Part 1. Isolation: enter the sandbox, as well as the machine allows, before any student code runs.
# Mount namespaces and a root of its own (build_root), a fresh uid, Landlock, seccomp, rlimits: the levels
# the module's docstring lists. enter_sandbox picks and reports one.
# ==============================================================================================================


CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWIPC, CLONE_NEWPID = 0x00020000, 0x40000000, 0x08000000, 0x20000000
PR_SET_KEEPCAPS, PR_SET_CHILD_SUBREAPER, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 8, 36, 1, 2
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 1, 22, 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# What programs and libraries read from /etc; nothing else of the machine's configuration is visible.
ETC = ("passwd", "group", "nsswitch.conf", "hosts", "host.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
       "localtime", "timezone", "fonts", "alternatives", "ssl", "ca-certificates", "mime.types", "matplotlibrc")
DEVICES = ("null", "zero", "full", "random", "urandom")
HOME = "/tmp/home"


def libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(result, what):
    if result != 0:
        raise OSError(ctypes.get_errno(), f"could not {what}")


def bind(lib, source, target, writable=False, dev=False, recursive=True):
    """Mount `source` at `target` (made as a file or folder to match), read only unless asked."""
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _check(lib.mount(source.encode(), target.encode(), None, MS_BIND | (MS_REC if recursive else 0), None),
           f"mount {source}")
    if not writable:
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (0 if dev else MS_NODEV)
        # In a user namespace the source's own nosuid/nodev/noexec (a /tmp mounted noexec) are locked: keep them
        flags |= os.statvfs(target).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
        _check(lib.mount(None, target.encode(), None, flags, None), f"make {source} read-only")


def python_dirs():
    """The Python environment the grader runs in, resolved: its prefixes, the interpreter's own folder, the
    import path it handed the zygote (PYTHONPATH, the user site, .pth entries; the course's folders left out)
    and LD_LIBRARY_PATH; only the outermost of nested ones."""
    dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                                          os.path.dirname(sys.executable),
                                          os.path.dirname(os.path.realpath(sys.executable)), *sys.path) if p}
    dirs |= {os.path.realpath(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p}
    outer = sorted(d for d in dirs if os.path.exists(d) and d != "/")
    return [d for d in outer if not any(d != o and d.startswith(o.rstrip("/") + "/") for o in outer)]


def machine_files():
    """What the sandbox may read of the machine when Landlock, not a root of its own, is the wall."""
    return [f"/{d}" for d in SYSTEM_DIRS] + [f"/etc/{n}" for n in ETC] + ["/proc", "/sys"] + python_dirs()


def devices():
    """The device files the sandbox may use (write and ioctl too: /dev/null, CUDA's)."""
    return [f"/dev/{n}" for n in DEVICES + gpu_devices()]


def gpu_devices():
    """CUDA's device files, when there are any."""
    return tuple(n for n in os.listdir("/dev") if n.startswith("nvidia"))


def build_root(lib, cfg):
    """Mount the sandbox's whole world at cfg['scratch'] and make it the root: an allowlist, not a denylist."""
    root = cfg["scratch"]
    _check(lib.mount(b"tmpfs", root.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=2m,mode=0755"), "make the root")
    for name in SYSTEM_DIRS:
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), f"{root}/{name}")
        elif os.path.isdir(host):
            bind(lib, host, root + host)
    for name in ETC:
        if os.path.exists("/etc/" + name):
            bind(lib, "/etc/" + name, f"{root}/etc/{name}")
    os.makedirs(root + "/dev", exist_ok=True)
    _check(lib.mount(b"tmpfs", f"{root}/dev".encode(), b"tmpfs", MS_NOSUID, b"size=64k,mode=0755"), "make /dev")
    for name in DEVICES + gpu_devices():
        if os.path.exists("/dev/" + name):
            bind(lib, "/dev/" + name, f"{root}/dev/{name}", writable=True, dev=True)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    os.makedirs(root + "/proc")
    _check(lib.mount(b"proc", f"{root}/proc".encode(), b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
    if os.path.isdir("/sys"):  # devices and CPUs for torch and CUDA; not what is mounted below it (cgroups, debugfs)
        try:
            bind(lib, "/sys", root + "/sys", recursive=False)
        except OSError as e:  # in a user namespace /sys's submounts are locked to it: a sysfs of our own instead
            if e.errno != errno.EINVAL:
                raise
            _check(lib.mount(b"sysfs", f"{root}/sys".encode(), b"sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                             None), "mount /sys")
    # The only writable place: one tmpfs of disk_mb, seen at /tmp, /var/tmp and /dev/shm.
    os.makedirs(root + "/tmp")
    _check(lib.mount(b"tmpfs", f"{root}/tmp".encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                     f"size={cfg['disk_mb']}m,mode=1777".encode()), "make /tmp")
    for alias in ("/var/tmp", "/dev/shm"):
        bind(lib, root + "/tmp", root + alias, writable=True)
    os.makedirs(root + HOME, mode=0o700)
    os.chown(root + HOME, cfg["uid"], cfg["uid"])
    # Last, so that an environment under /tmp, /var/tmp or /dev/shm (a clone in /tmp) sits on top of the tmpfs,
    # not under it: its mount points are empty folders in the tmpfs, read-only mounts over them
    for path in python_dirs():
        if not path.startswith(tuple(f"/{d}/" for d in SYSTEM_DIRS)):
            bind(lib, path, root + path)
    os.chdir(root)
    _check(lib.syscall(SYS_PIVOT_ROOT[platform.machine()], b".", b"."), "pivot into the sandbox's root")
    _check(lib.umount2(b".", MNT_DETACH), "leave the machine's root")
    os.chdir("/")
    for path in (b"/", b"/dev"):
        _check(lib.mount(None, path, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | (MS_NODEV if path == b"/" else 0), None),
               "make the root read-only")


# (audit arch, clone, unshare, clone3, open_by_handle_at) per machine, for the seccomp filter below
SECCOMP_ARCH = {"x86_64": (0xC000003E, 56, 272, 435, 304), "aarch64": (0xC00000B7, 220, 97, 435, 265)}
CLONE_NEWUSER = 0x10000000


def forbid_user_namespaces(lib):
    """A seccomp filter: no new user namespace (unshare or clone with CLONE_NEWUSER), no clone3, no x32 calls,
    no open_by_handle_at (a file by inode number, past every path: with CAP_DAC_READ_SEARCH, which the uid
    level may keep, it is the classic way out of a container).

    Inside a user namespace of its own an unprivileged process may mount a tmpfs of any size: memory that
    neither the disk limit nor the memory limit (which counts processes) would see. clone3 passes its flags
    in memory a filter cannot read, so it answers ENOSYS and the C library falls back to clone.
    """
    import struct
    if platform.machine() not in SECCOMP_ARCH:
        return False
    arch, clone, unshare, clone3, by_handle = SECCOMP_ARCH[platform.machine()]
    allow, enosys, eperm = 0x7FFF0000, 0x00050000 | errno.ENOSYS, 0x00050000 | errno.EPERM
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    program = [
        (ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, allow),       # 0-2  another ABI: not ours to judge
        (ld, 0, 0, 0), (jge, 0, 1, 0x40000000), (ret, 0, 0, enosys),  # 3-5  x32 calls
        (jeq, 0, 1, clone3), (ret, 0, 0, enosys),                     # 6-7
        (jeq, 0, 1, by_handle), (ret, 0, 0, eperm),                   # 8-9
        (jeq, 1, 0, unshare), (jeq, 0, 3, clone),                     # 10-11
        (ld, 0, 0, 16), (jset, 0, 1, CLONE_NEWUSER), (ret, 0, 0, eperm),  # 12-14 flags are args[0]
        (ret, 0, 0, allow),                                           # 15
    ]
    code = b"".join(struct.pack("HBBI", *insn) for insn in program)
    buf = ctypes.create_string_buffer(code)
    fprog = struct.pack("HxxxxxxP", len(program), ctypes.addressof(buf))
    _check(lib.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0), "install the seccomp filter")
    return True


def enter_sandbox(cfg, in_pid_namespace):
    """Isolate this process as well as the machine allows, drop to the sandbox's uid; returns the level.

    Sets cfg["isolate"] to what the request loop needs to know: every process this one can signal is the
    sandbox's own (a fresh uid, a PID namespace, or Landlock's signal scope), so kill(-1) ends only strays,
    and RLIMIT_NPROC counts only the sandbox's processes.
    """
    import resource
    import signal
    level, lib, fresh_uid, abi = "process", libc(), cfg["isolate"], 0
    if in_pid_namespace and lib.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC) == 0:
        _check(lib.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make the mounts private")
        build_root(lib, cfg)
        level = "namespaces" if fresh_uid else "userns"
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    file_bytes = cfg["disk_mb"] * 2**20
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file past the limit fails to grow (EFBIG), nothing dies
    walled = level in ("namespaces", "userns")
    if not walled and (fresh_uid or cfg.get("contain")):
        abi = LANDLOCK.abi()
    if fresh_uid:
        resource.setrlimit(resource.RLIMIT_NPROC, (cfg["processes"], cfg["processes"]))  # counts this uid only
        # A fresh uid cannot walk into a 0700 home holding the interpreter (pyenv under /root): keep only the
        # right to read and search (or, in Docker, which lacks it, DAC_OVERRIDE), where Landlock then allows
        # nothing but the environment and the system, and only its scratch folder for writing
        search = not walled and abi > 0 and not all(others_can_reach(d) for d in python_dirs()) and search_right()
        if search:
            _check(lib.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), "keep capabilities")
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
        if search:
            set_capabilities(lib, search)
        level = level if walled else "uid"
    elif cfg.get("userns"):  # the grader's own uid in a user namespace of its own: processes of the namespace
        resource.setrlimit(resource.RLIMIT_NPROC, (cfg["processes"], cfg["processes"]))
        set_capabilities(lib, 0)  # it was all-powerful in there: building the root was the last use
    _check(lib.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")
    forbid_user_namespaces(lib)
    if abi:
        LANDLOCK.restrict(read=machine_files(), write=[cfg["scratch"], *devices()], version=abi)
    elif level == "uid":
        level = "uid-only"
    if abi and not fresh_uid:
        level = "landlock"
        tasks = tasks_of_uid(os.getuid())  # the grader's own uid: its processes count against the limit too
        resource.setrlimit(resource.RLIMIT_NPROC, (tasks + cfg["processes"],) * 2)
    cfg["isolate"] = fresh_uid or level == "userns" or (level == "landlock" and abi >= 6)
    home = HOME if walled else cfg["scratch"]
    os.chdir(home)
    os.environ["HOME"] = home
    if not walled:  # the machine's /tmp is out of reach: temporary files go to the scratch folder
        os.environ["TMPDIR"] = home
        import tempfile
        tempfile.tempdir = None  # gettempdir() cached the zygote's /tmp: torch's inductor asks it for its cache
    return level


def others_can_reach(path):
    """Whether any uid may read `path` (every folder above it searchable by others, and it readable)."""
    parts = os.path.realpath(path).split("/")
    try:
        above = all(os.stat("/".join(parts[:k]) or "/").st_mode & 0o001 for k in range(1, len(parts)))
        return above and bool(os.stat(path).st_mode & 0o004)
    except OSError:
        return False


def search_right():
    """The capability mask that lets a process read and search any folder, among those it has; 0 if none."""
    with open("/proc/self/status") as f:
        permitted = int(next(line.split()[1] for line in f if line.startswith("CapPrm:")), 16)
    for cap in (CAP_DAC_READ_SEARCH, CAP_DAC_OVERRIDE):
        if permitted & (1 << cap):
            return 1 << cap
    return 0


def set_capabilities(lib, mask):
    """Effective and permitted capabilities exactly `mask` (capset, version 3), none inheritable."""
    import struct
    header = ctypes.create_string_buffer(struct.pack("Ii", 0x20080522, 0))
    data = ctypes.create_string_buffer(struct.pack("6I", mask & 0xFFFFFFFF, mask & 0xFFFFFFFF, 0,
                                                   mask >> 32, mask >> 32, 0))
    _check(lib.capset(header, data), "set the capabilities")


def tasks_of_uid(uid):
    """Threads of `uid`'s processes (what RLIMIT_NPROC counts)."""
    total = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    total += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                pass
    return total


def enter_user_namespace():
    """A user namespace mapping only our own uid and gid, with a PID namespace it owns; False where not allowed."""
    uid, gid, lib = os.getuid(), os.getgid(), libc()
    if lib.unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0:
        return False
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    return True


# ==============================================================================================================
# Part 2. Supervision: the zygote forks a monitor per sandbox; the monitor forks the sandbox and ends it.
# The zygote imports torch once; each monitor watches its sandbox and the grader's lifeline and, when either
# goes, kills every process of the sandbox and removes its scratch folder.
# ==============================================================================================================


def serve(cfg, req_fd, resp_fd, in_pid_namespace):
    """Enter the sandbox, then answer requests until the grader closes the channel."""
    req, resp = os.fdopen(req_fd, "rb"), os.fdopen(resp_fd, "wb")
    try:
        level = enter_sandbox(cfg, in_pid_namespace)
    except Exception as e:
        resp.write(PROTOCOL.frame({"fatal": f"could not enter the sandbox: {e}"}))
        resp.flush()
        return
    Server(req, resp, cfg, level).serve()


def sandbox_process(cfg, fds, in_pid_namespace):
    """In a fresh fork: own session, dies with its monitor, the output pipe as stdout and stderr."""
    req_r, resp_w, out_w, status_w, life_r = fds
    os.close(status_w)
    os.close(life_r)
    os.setsid()
    libc().prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    try:  # out of memory, the kernel kills the student's process first, never the grader (raising needs no right)
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    os.close(out_w)
    os.environ.clear()
    os.environ.update(cfg["env"])
    if cfg.get("threads"):  # the grader's share of the cores for this sandbox (torch was imported before)
        import torch
        torch.set_num_threads(cfg["threads"])
    import faulthandler
    faulthandler.enable()
    try:
        serve(cfg, req_r, resp_w, in_pid_namespace)
    finally:
        sys.stdout.flush()
        os._exit(0)


def kill_uid(uid):
    """SIGKILL every process of `uid` at once: kill(-1) from a process of that uid reaches them all, forks too."""
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                os.kill(-1, 9)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)


def remove_scratch(path):
    """Remove the scratch folder; while the dead sandbox's mount namespace is being torn down (after its last
    process, not with it) the folder is still a mount point there and cannot go: try again for up to a second."""
    import shutil
    import time
    for _ in range(50):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
        time.sleep(0.02)


def kill_children():
    """SIGKILL every process below this one (a subreaper: the sandbox's orphans come back to it) until none is left."""
    me = os.getpid()
    while True:
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        os.kill(int(name), 9)
            except (OSError, IndexError, ValueError):
                pass
        try:
            os.waitpid(-1, 0)  # one gone; any children it had are ours now, and killed in the next round
        except ChildProcessError:
            return


def monitor(cfg, fds):
    """Start the sandbox, watch it and the grader; when either goes, end every process of the sandbox.

    The grader holds the only write end of the lifeline: its EOF (the grader closed the sandbox, or died in
    any way, SIGKILL included) means kill. The monitor is the sandbox's parent, so the pid it signals is
    never someone else's. Its status line (the sandbox's wait status) comes after everything is gone.
    """
    import select
    import signal
    req_r, resp_w, out_w, status_w, life_r = fds
    try:
        if cfg["isolate"]:
            in_pid_namespace = libc().unshare(CLONE_NEWPID) == 0
        else:
            in_pid_namespace = cfg["userns"] = bool(cfg.get("contain")) and enter_user_namespace()
        subreaper = not in_pid_namespace and not cfg["isolate"]
        if subreaper:  # what the sandbox starts and leaves comes back to us, not to init: see kill_children
            libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        pid = os.fork()
    except BaseException:  # noqa: BLE001 -- never back into the zygote's loop: the grader reads the cause on stderr
        traceback.print_exc()
        os._exit(1)
    if pid == 0:
        sandbox_process(cfg, fds, in_pid_namespace)
    for fd in (req_r, resp_w, out_w):
        os.close(fd)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a grader gone is seen on the lifeline, not as a signal
    status = None
    try:
        try:
            os.write(status_w, f"{pid}\n".encode())
        except OSError:
            pass
        try:
            ended = os.pidfd_open(pid)
        except (AttributeError, OSError):
            ended = None
        poll = select.poll()
        poll.register(life_r, select.POLLIN)
        if ended is not None:
            poll.register(ended, select.POLLIN)
        while status is None:
            events = dict(poll.poll(None if ended is not None else 100))
            if life_r in events:
                os.kill(pid, signal.SIGKILL)  # not reaped yet: still ours
                poll.unregister(life_r)
            if ended is None or ended in events:
                done, wait_status = os.waitpid(pid, 0 if ended is not None else os.WNOHANG)
                if done:
                    status = wait_status
    finally:
        if status is None:  # the monitor itself failed: the sandbox goes with it
            os.kill(pid, signal.SIGKILL)
            status = os.waitpid(pid, 0)[1]
        if not in_pid_namespace:  # a PID namespace died with its init; otherwise end the rest here
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
            if cfg["isolate"]:
                kill_uid(cfg["uid"])
            if subreaper:
                kill_children()
        remove_scratch(cfg["scratch"])
        try:
            os.write(status_w, f"{status}\n".encode())
        finally:
            os._exit(0)


# Not torchvision: the notebooks import it only to download MNIST (never inside a sandbox), and it costs 1.7 s of
# CPU (it pulls in torch._dynamo) for every grader process that starts a zygote.
PRELOAD = ("matplotlib.pyplot", "IPython.display", "IPython.core.inputtransformer2", "ipywidgets", "scipy.linalg", "math",
           "random", "inspect", "types", "json", "typing", "dataclasses", "collections", "itertools", "functools")


def zygote(control_fd, import_path=None):
    """Import torch once, then fork a sandbox (through its monitor) per request: a sandbox starts in milliseconds.

    `import_path` is the grader's sys.path less the course's folders: started with -I, this process would
    otherwise miss packages found through PYTHONPATH or the user site.
    """
    import signal
    import socket
    if import_path:
        sys.path[:] = import_path
    # No PR_SET_PDEATHSIG: it fires when the *thread* that started us ends (a batch worker), not the grader.
    # The grader's end of the control socket closing (its exit, or its death) is what ends the loop below,
    # and each monitor watches its own lifeline: a Ctrl-C meant for the grader is not for these processes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import numpy  # noqa: E401, F401 -- imported once, shared copy-on-write
    load_helpers()
    os.environ["MPLBACKEND"] = "Agg"
    for name in PRELOAD:  # what notebooks' setup cells import: loaded once here instead of in every sandbox
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 -- optional: a missing package is the notebook's own business
            pass
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)       # monitors are reaped by the kernel
    sock = socket.socket(fileno=control_fd)
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 5)
        if not msg:
            return
        cfg = json.loads(msg)
        if os.fork() == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            sock.close()
            monitor(cfg, fds)
        for fd in fds:
            os.close(fd)


# ==============================================================================================================
# Part 3. The request server: answer the grader's requests with the student's code.
# Messages and values as sandbox_protocol.py defines them (PROTOCOL); each request's exceptions, output and
# stray processes end with its answer.
# ==============================================================================================================


class StudentError(Exception):
    pass


def as_python(source):
    """A notebook cell as plain Python: IPython's magics and shell escapes become get_ipython() calls."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return source
    return TransformerManager().transform_cell(source)


class QuietShell:
    """What get_ipython() returns while grading: magics (%matplotlib, !pip install) do nothing."""

    def run_line_magic(self, *args, **kwargs):
        return None

    run_cell_magic = system = getoutput = run_line_magic

    def __getattr__(self, name):
        return self.run_line_magic


QUIET_SHELL = QuietShell()


import builtins  # noqa: E402

_BUILTINS = dict(builtins.__dict__)


def restore_builtins():
    """Undo whatever the student's code did to builtins before the protocol's own code runs again."""
    if builtins.__dict__ != _BUILTINS:
        builtins.__dict__.clear()
        builtins.__dict__.update(_BUILTINS)


class Server:
    """Answers the grader's requests in the sandbox, one at a time, until the grader closes the channel.

    A request (sandbox_protocol.OPS) is answered by its method op_<op>, which returns the answer's fields, with
    its tensors as safetensors bytes under "_blob". Whatever the student's code does (raise, exit, fill the
    disk, fork) the answer says so and the server goes on; the processes it started end with the request. What
    the student's code returns that cannot travel (its modules) stays here in `objects`, sent by handle.
    """

    def __init__(self, req, resp, cfg, level):
        import torch
        self.torch, self.cfg, self.level = torch, cfg, level
        self.req, self.resp = req, resp
        self.pid = os.getpid()
        self.ns = {"__name__": "__main__"}
        self.objects = {}
        self.harness = {}
        self.tripwire = Tripwire(torch)
        self.tripwire.configure(cfg.get("tripwire"))  # given with the sandbox: watched before any cell loads
        self.blob = b""

    # --- transport -------------------------------------------------------------------------------
    def send(self, msg, blob=b""):
        """One message (sandbox_protocol.frame); a process the student forked never speaks for the sandbox."""
        if os.getpid() != self.pid:
            os._exit(0)
        self.resp.write(PROTOCOL.frame(msg, blob))
        self.resp.flush()

    def receive(self):
        """The grader's next request (its tensors' bytes kept in self.blob); None when the grader closed."""
        line = self.req.readline()
        if not line:
            return None
        msg, size = PROTOCOL.header(line)
        self.blob = self.req.read(size) if size else b""
        return msg

    def serve(self):
        self.send({"ready": True, "pid": self.pid, "isolation": self.level})
        while (msg := self.receive()) is not None:
            answer, blob = self.answer(msg)
            self.flush_output()  # what the request printed is read with its answer, not one request later
            self.send(answer, blob)
            self.end_strays()

    def answer(self, msg):
        """(answer, blob) for one request: the student's exception, or a limit it reached, is an answer too."""
        try:
            self.tripwire.configure(msg.get("tripwire"), self.ns)
            out = getattr(self, "op_" + msg["op"])(msg)
            blob = out.pop("_blob", b"")
            return {"id": msg["id"], "ok": True, **out}, blob
        except StudentError as e:
            return {"id": msg["id"], "ok": False, "error": str(e)}, b""
        except BaseException as e:  # noqa: BLE001 -- student code may raise anything, SystemExit included
            restore_builtins()
            error, restart = self.limit_reached(e)
            return {"id": msg["id"], "ok": False, "restart": restart,
                    "error": error or describe(e, student_frames_only=True)}, b""

    # --- limits ----------------------------------------------------------------------------------
    @staticmethod
    def flush_output():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 -- the student may have replaced or closed them
                pass

    def limit_reached(self, e):
        """(reason, restart?) when the exception is the sandbox's disk or process limit biting."""
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            return f"wrote more than {self.cfg['disk_mb']} MB (disk limit): {describe(e, True)}", True
        if isinstance(e, BlockingIOError) and e.errno == errno.EAGAIN and self.cfg["isolate"]:
            return (f"started more than {self.cfg['processes']} processes and threads (process limit): "
                    f"{describe(e, True)}"), False
        return "", False

    def end_strays(self):
        """Processes the student's code started during a request end with it (a fresh uid: all are the student's)."""
        if not self.cfg["isolate"]:
            return
        try:
            os.kill(-1, 9)  # every process of this uid (of this PID namespace) but this one, forks in flight too
        except OSError:
            pass
        # Reap what was killed (as a namespace's init, orphans too): a zombie still counts against the process
        # limit, and one killed a moment ago is not a zombie yet. Bounded: something that will not die in a second
        # is left to the next request's reaping.
        import time
        deadline = time.monotonic() + 1.0
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.002)
            except ChildProcessError:
                break

    # --- values (sandbox_protocol's codec) -------------------------------------------------------
    def load_tensors(self):
        return PROTOCOL.unpack(self.blob)

    def decode(self, v, tensors):
        return PROTOCOL.from_grader(v, tensors, self.objects, self.assign_state)

    def arguments(self, msg, tensors):
        """(args, kwargs) of a call or a construction, decoded."""
        return (self.decode({PROTOCOL.LIST: msg.get("args", [])}, tensors),
                self.decode({PROTOCOL.DICT: msg.get("kwargs", {})}, tensors))

    def reply(self, value, msg):
        tensors = {}
        enc = PROTOCOL.to_grader(value, tensors, self.objects)
        return {"value": enc, "_blob": PROTOCOL.pack(tensors)}

    def assign_state(self, module, values):
        try:
            STATE.assign_state(module, values)
        except STATE.StateMismatch as e:
            raise StudentError(f"parameters and buffers have shapes {e.module_shapes}, expected {e.value_shapes}") from None

    def target(self, msg):
        """What a request names: a module by handle (or one of its methods), else a name of the notebook's."""
        if "handle" in msg:
            obj = self.objects[msg["handle"]]
            return getattr(obj, msg["method"]) if msg.get("method") else obj
        if msg["name"] not in self.ns:
            raise StudentError(f"'{msg['name']}' is not defined")
        return self.ns[msg["name"]]

    # --- operations ------------------------------------------------------------------------------
    def op_load(self, msg):
        """Run the setup and graded cells in order; one failing cell costs only what depends on it."""
        results = []
        self.ns.setdefault("get_ipython", lambda: QUIET_SHELL)
        for grade_id, source in msg["cells"]:
            self.send({"progress": grade_id})
            try:
                exec(compile(as_python(source), f"<cell {grade_id}>", "exec"), self.ns)
                restore_builtins()
                results.append([grade_id, ""])
            except BaseException as e:  # noqa: BLE001
                restore_builtins()
                results.append([grade_id, describe(e, student_frames_only=True)])
            self.flush_output()
        return {"cells": results}

    def op_call(self, msg):
        """Call a function or method of the student's on the grader's arguments (and backward, with `grad`)."""
        torch = self.torch
        tensors = self.load_tensors()
        fn = self.target(msg)
        args, kwargs = self.arguments(msg, tensors)
        torch.manual_seed(msg.get("seed", 0))
        try:
            grad = msg.get("grad")
            with self.tripwire.checking(msg.get("watch", [])) as watched:  # a student's backward counts too
                with torch.enable_grad() if grad else torch.no_grad():
                    value = fn(*args, **kwargs)
                    if grad:
                        value = self.backward(value, args, grad, tensors)
        finally:
            restore_builtins()
        return self.watched_reply(value, msg, watched)

    def backward(self, value, args, grad, tensors):
        """d(sum_i <out_i, upstream_i>)/d(args[j]) for the requested args, next to the outputs."""
        torch = self.torch
        outs = value if isinstance(value, (tuple, list)) else (value,)
        pairs = [(o, tensors[u]) for o, u in zip(outs, grad["upstream"]) if u is not None]
        for o, _ in pairs:
            if not isinstance(o, torch.Tensor) or not o.requires_grad:
                raise StudentError("the output does not carry a gradient (was it detached, or computed under no_grad?)")
        total = sum((o * u.to(o.device, o.dtype)).sum() for o, u in pairs)
        inputs = [args[j] for j in grad["wrt"]]
        grads = torch.autograd.grad(total, inputs, allow_unused=True)
        return (value, tuple(grads))

    def op_new(self, msg):
        """An instance of the student's class, built on the grader's arguments and seed, kept by handle."""
        torch = self.torch
        tensors = self.load_tensors()
        cls = self.target(msg)
        args, kwargs = self.arguments(msg, tensors)
        torch.manual_seed(msg.get("seed", 0))
        try:
            with self.tripwire.checking(msg.get("watch", [])) as watched:
                obj = cls(*args, **kwargs)
        finally:
            restore_builtins()
        if isinstance(obj, torch.nn.Module):
            obj = obj.to(msg.get("device", "cpu"))
        return self.watched_reply(obj, msg, watched)

    def watched_reply(self, value, msg, watched):
        """The reply to a check's request, with the oracles the student's code called while it ran."""
        out = self.reply(value, msg)
        out["oracle_calls"] = sorted(watched.seen)
        return out

    def op_state(self, msg):
        """A module's state_dict(): its tensors in order, and their names."""
        obj = self.objects[msg["handle"]]
        items = list(obj.state_dict().items())
        out = self.reply([t for _, t in items], msg)
        out["names"] = [k for k, _ in items]
        return out

    def op_load_state(self, msg):
        """Copy the grader's tensors into a module's state, by order and shape."""
        tensors = self.load_tensors()
        self.assign_state(self.objects[msg["handle"]], [tensors[k] for k in msg["keys"]])
        return {"value": None}

    def op_attr(self, msg):
        """An attribute of a module or of a name of the notebook's."""
        obj = self.target(msg)
        missing = object()
        value = getattr(obj, msg["attr"], missing)
        if value is missing:
            raise StudentError(f"has no attribute '{msg['attr']}'")
        return self.reply(value, msg)

    def op_signature(self, msg):
        """The parameters of a function, or of a class's __init__, and of the listed methods."""
        import inspect
        obj = self.target(msg)
        info = {"kind": "class" if isinstance(obj, type) else ("function" if callable(obj) else type(obj).__name__)}

        def params(f, drop_self):
            try:
                sig = inspect.signature(f)
            except (TypeError, ValueError):
                return None
            ps = list(sig.parameters.values())[(1 if drop_self else 0):]
            return [[p.name, str(p.kind), "" if p.default is p.empty else repr(p.default)] for p in ps]
        if info["kind"] == "class":
            info["params"] = params(obj.__init__, True)
            info["methods"] = {m: params(getattr(obj, m), True) if callable(getattr(obj, m, None)) else None
                               for m in msg.get("methods", [])}
        elif info["kind"] == "function":
            info["params"] = params(obj, False)
        return {"value": info}

    def op_harness(self, msg):
        """Load a harness module's source (the lecture's models and training loops) as a module."""
        import types
        mod = types.ModuleType(msg["module"])
        exec(compile(msg["source"], f"<harness {msg['module']}>", "exec"), mod.__dict__)
        self.harness[msg["module"]] = mod
        return {"value": None}

    def op_experiment(self, msg):
        """Build the experiment's model from the student's items and train it with the harness loop."""
        import types
        torch = self.torch
        spec = self.harness[msg["module"]].EXPERIMENTS[msg["name"]]
        parts = types.SimpleNamespace(**{k: v for k, v in self.ns.items() if not k.startswith("__")})
        data = {k: v.to(msg["device"]) for k, v in self.load_tensors().items()}
        torch.manual_seed(msg["seed"])
        with self.tripwire.training(msg["name"]) as watched:
            model = spec["build"](parts, msg["cfg"], msg["seed"], msg["device"])
            try:
                history = spec["train"](model, parts, data, msg["cfg"], msg["seed"])
            finally:
                restore_builtins()
        if watched.seen:  # in describe()'s form, "(cell X, line N)" last: the grader reads it as the student's error
            oracle, (item, line) = min(watched.seen.items())
            raise StudentError(f"'{item}' uses {oracle} while training; this item is written from scratch, so the "
                               f"oracle it is compared with may not be called (cell {item}, line {line})")
        out = self.reply(list(model.state_dict().values()), msg)
        out["history"] = json.loads(json.dumps(history, default=float)) if history else {}
        return out


def describe(e, student_frames_only=False):
    """'ValueError: message (cell attention, line 7)': the error and where in the student's code."""
    try:
        frames = traceback.extract_tb(e.__traceback__)
        where = [f for f in frames if f.filename.startswith("<cell ")] if student_frames_only else frames
        loc = ""
        if where:
            f = where[-1]
            loc = f" ({f.filename[1:-1]}, line {f.lineno})"
        elif isinstance(e, SyntaxError) and e.filename:
            loc = f" ({e.filename.strip('<>')}, line {e.lineno})"
        msg = PROTOCOL.safe_repr(e.args[0]) if len(e.args) == 1 and not isinstance(e.args[0], str) else str(e)
        return f"{type(e).__name__}: {msg[:300]}{loc}"
    except BaseException:  # noqa: BLE001
        return "an exception that could not be described"


# ==============================================================================================================
# Part 4. The from-scratch rule at run time: the oracles course.yaml names, watched where they live.
# See Tripwire.
# ==============================================================================================================


class Tripwire:
    """The from-scratch rule at run time: the oracles course.yaml names, watched at the functions themselves.

    The grader sends the table (oracle name -> dotted paths; this script reads no course file). A path is
    watched once its module is loaded (one the student imports later, from the next request on):
    - a Python function (F.mse_loss, nn.MultiheadAttention.forward, scipy's subspace_angles, PCA.fit) is patched
      in place, its code object swapped, so every reference to it reaches the watch: aliases the student's cells
      stored while loading, getattr with a built name, importlib, a subclass's super() call;
    - a built-in (torch's C functions: F.scaled_dot_product_attention is torch._C._nn's) is replaced where its
      module holds it, and while a check calls the student's code a TorchFunctionMode matches it by identity
      however it was reached (a stored alias, torch._C, torch.ops.aten's packets and overloads).
    Calls count only while the grader asks: during a check's call (`checking`) every call of an oracle the
    item may not use is the item's; during an experiment's training (`training`) only the calls made while a
    frame of the item's own cell is on the stack, so the harness's own code (a baseline's nn.MultiheadAttention,
    a loss) never counts. The mode is left out of training: it would tax every torch call of every step.
    """

    def __init__(self, torch):
        self.torch = torch
        self.oracles, self.scratch, self.experiments = {}, {}, {}
        self.pending = []      # (oracle, path) not resolved yet
        self.names = {}        # id(watched object) -> the oracles it stands for (a path may be listed under two)
        self.builtins = {}     # id(built-in or op) -> those names: what the TorchFunctionMode matches
        self.keep = []         # the objects behind those ids, alive as long as their ids are used
        self.standins = {}     # id(built-in) -> the Python stand-in put where its modules hold it
        self.armed = None      # None, or the names that count now and the item whose frames must be on the stack
        self.seen = {}         # oracle -> (item, line) of the first call that counted
        self.mode = None

    def configure(self, table, namespace=None):
        """Take the table ({"oracles", "scratch", "experiments"}) once, and watch what is loaded by now."""
        first = bool(table) and not self.oracles
        if first:
            self.oracles = {name: list(paths) for name, paths in table.get("oracles", {}).items()}
            self.scratch = {item: set(names) for item, names in table.get("scratch", {}).items()}
            self.experiments = dict(table.get("experiments", {}))
            self.pending = [(name, path) for name, paths in self.oracles.items() for path in paths]
        if self.pending:
            self.pending = [(name, path) for name, path in self.pending if not self.watch(name, path)]
        if first and namespace:
            self.adopt(namespace)

    def adopt(self, namespace):
        """The table came after the notebook loaded: the built-ins its cells stored (`_f = getattr(F, ...)`, a
        default argument, a closure, a class attribute) are swapped for their stand-ins, so training sees them too.
        Checks need none of this: the TorchFunctionMode matches the built-in itself."""
        import types

        def swap(v):
            return self.standins.get(id(v), v)

        def adopt_function(f):
            if isinstance(f, types.FunctionType) and f.__code__.co_filename.startswith("<cell "):
                if f.__defaults__:
                    f.__defaults__ = tuple(swap(v) for v in f.__defaults__)
                if f.__kwdefaults__:
                    f.__kwdefaults__ = {k: swap(v) for k, v in f.__kwdefaults__.items()}
                for cell in f.__closure__ or ():
                    try:
                        cell.cell_contents = swap(cell.cell_contents)
                    except ValueError:  # an empty cell
                        pass
        for key, value in list(namespace.items()):
            namespace[key] = swap(value)
            adopt_function(value)
            if isinstance(value, type) and value.__module__ == "__main__":
                for attr, v in list(vars(value).items()):
                    adopt_function(v)
                    if id(v) in self.standins:
                        setattr(value, attr, swap(v))

    def watch(self, name, path):
        """Watch one dotted path; False while its module is not loaded yet."""
        try:
            found = resolve(path)
            if found is None:
                return False
            owner, attr, obj = found
            kind = self.kind(obj)
            if kind == "stand-in":  # put there for another path: watch its built-in
                obj, kind = obj._course_oracle, "builtin"
            if id(obj) in self.names:
                self.names[id(obj)].add(name)
            elif kind == "function":
                self.patch(self.named(obj, name), obj)
            elif kind == "op":
                names = self.named(obj, name)
                for overload in [obj] + [getattr(obj, o) for o in obj.overloads()]:
                    self.builtins[id(overload)], _ = names, self.keep.append(overload)
            elif kind == "builtin":
                self.builtins[id(obj)] = self.named(obj, name)
            if id(obj) in self.builtins and isinstance(owner, type(sys)) and vars(owner).get(attr) is obj:
                setattr(owner, attr, self.standins.setdefault(id(obj), self.wrapper(self.names[id(obj)], obj)))
        except Exception:  # noqa: BLE001 -- an unwatchable path is skipped (tests/test_tripwire.py checks them all)
            pass
        return True

    def kind(self, obj):
        """How an object is watched: function (patched in place), builtin or op (matched by the mode), or None."""
        import types
        if isinstance(obj, types.FunctionType):
            return "stand-in" if "_course_oracle" in vars(obj) else "function"
        if isinstance(obj, self.torch._ops.OpOverloadPacket):
            return "op"
        return "builtin" if isinstance(obj, types.BuiltinFunctionType) else None

    def named(self, obj, name):
        self.keep.append(obj)
        self.names[id(obj)] = names = {name}
        return names

    def patch(self, names, fn):
        """Swap the function's code for a trampoline into `enter`, in place: every reference to it is watched."""
        import functools
        import types
        original = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        original.__kwdefaults__, original.__qualname__ = fn.__kwdefaults__, fn.__qualname__
        fn.__code__ = trampoline(len(fn.__code__.co_freevars))  # the same closure: the count must match
        fn.__defaults__, fn.__kwdefaults__ = None, {"_course_oracle": functools.partial(self.enter, names, original)}

    def wrapper(self, names, builtin):
        """A Python stand-in for a built-in, put where its module holds it (what training lookups find)."""
        def oracle(*args, **kwargs):
            return self.enter(names, builtin, args, kwargs)
        oracle._course_oracle = builtin
        oracle.__name__ = oracle.__qualname__ = getattr(builtin, "__name__", "oracle")
        oracle.__doc__ = getattr(builtin, "__doc__", None)
        return oracle

    def enter(self, names, original, args, kwargs):
        if self.armed is not None:
            self.hit(names)
        return original(*args, **kwargs)

    def hit(self, names):
        """Record a call of an oracle standing for `names` if it counts now (see the class's docstring)."""
        counted, item = self.armed
        for name in names & counted - self.seen.keys():
            if item is None:
                self.seen[name] = (None, 0)
                continue
            frame = sys._getframe(1)
            while frame is not None:  # the innermost frame of the item's own cell: the line that reached the oracle
                if frame.f_code.co_filename == f"<cell {item}>":
                    self.seen[name] = (item, frame.f_lineno)
                    break
                frame = frame.f_back

    def mode_class(self):
        wire = self

        class Watch(self.torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None, _id=id):  # the student may patch builtins
                names = wire.builtins.get(_id(func))
                if names is not None and wire.armed is not None:
                    wire.hit(names)
                return func(*args, **(kwargs or {}))
        return Watch

    def checking(self, watch):
        """A context: the student's item is called by a check; returns the names seen via `.seen`."""
        self.configure(None)
        names = set(watch)
        if names and self.mode is None:
            self.mode = self.mode_class()
        return Armed(self, names, None, self.mode() if names else None)

    def training(self, experiment):
        """A context: the harness trains the experiment's item with the student's parts."""
        self.configure(None)
        item = self.experiments.get(experiment)
        return Armed(self, self.scratch.get(item, set()), item or "", None)


class Armed:
    """Arm a Tripwire (and enter its TorchFunctionMode) for one request; `seen` holds what counted."""

    def __init__(self, wire, names, item, mode):
        self.wire, self.names, self.item, self.mode = wire, names, item, mode
        self.seen = {}

    def __enter__(self):
        self.wire.seen = self.seen
        self.wire.armed = (self.names, self.item) if self.names else None
        if self.mode is not None:
            self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.wire.armed = None
        if self.mode is not None:
            self.mode.__exit__(*exc)
        return False


def resolve(path):
    """(owner, attribute, object) for a dotted path under a module already loaded, else None; never imports."""
    parts = path.split(".")
    for k in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:k]))
        if module is not None:
            break
    else:
        return None
    owner = module
    for k, part in enumerate(parts[k:], start=k):
        if sys.modules.get(getattr(owner, "__name__", None)) is owner and part not in vars(owner):
            return None  # a submodule not imported yet (a module's lazy __getattr__ would import it)
        obj = getattr(owner, part)
        if k == len(parts) - 1:
            return owner, part, obj
        owner = obj


_TRAMPOLINES = {}


def trampoline(free):
    """The code of `def oracle(*args, _course_oracle, **kwargs): return _course_oracle(args, kwargs)`, with
    `free` free variables (never read) so that it fits a function whose closure has that many cells."""
    if free not in _TRAMPOLINES:
        cells = "".join(f"    _c{i} = None\n" for i in range(free))
        unread = f"        if False:\n            ({', '.join(f'_c{i}' for i in range(free))},)\n" if free else ""
        source = (f"def outer():\n{cells}    def oracle(*args, _course_oracle=None, **kwargs):\n{unread}"
                  f"        return _course_oracle(args, kwargs)\n    return oracle\n")
        namespace = {}
        exec(compile(source, "<oracle watch>", "exec"), namespace)
        _TRAMPOLINES[free] = namespace["outer"]().__code__
    return _TRAMPOLINES[free]


if __name__ == "__main__":
    zygote(int(sys.argv[1]), json.loads(sys.argv[2]) if len(sys.argv) > 2 else None)
