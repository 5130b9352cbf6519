"""Isolation: enter the sandbox, as well as the machine allows, before any student code runs.

Mount namespaces and a root of its own (build_root), a fresh uid, Landlock, seccomp, rlimits; enter_sandbox picks
and reports one of these levels.


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
import os
import platform
import sys

from . import helpers

CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWIPC, CLONE_NEWPID = 0x00020000, 0x40000000, 0x08000000, 0x20000000
PR_SET_KEEPCAPS, PR_SET_CHILD_SUBREAPER, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 8, 36, 1, 2
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
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
    # a fresh uid's group is its own number; the grader's own uid (userns) keeps its group, the only gid its user
    # namespace maps (a hub's user made with a group of another number: EINVAL otherwise)
    os.chown(root + HOME, cfg["uid"], cfg["uid"] if cfg["uid"] != os.getuid() else os.getgid())
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
        flags = MS_REMOUNT | MS_RDONLY | MS_NOSUID | (MS_NODEV if path == b"/" else 0)
        _check(lib.mount(None, path, None, flags, None), "make the root read-only")


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
        abi = helpers.LANDLOCK.abi()
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
        helpers.LANDLOCK.restrict(read=machine_files(), write=[cfg["scratch"], *devices()], version=abi)
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

