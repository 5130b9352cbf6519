"""Landlock through ctypes: a process gives up every file and TCP access but the ones it lists, for good.

Standalone (standard library only): the sandbox's child loads it by path before it enters the sandbox, as it
does state.py. Our own three system calls rather than the `landlock` package: the child may import nothing
outside the standard library and torch, and the calls are a few lines; what changes between kernels is the ABI
version, which is read here and decides what is asked for.
"""
import ctypes
import os
import struct

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446  # the same on x86_64 and aarch64
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}  # every fs right of each ABI
FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV  # what a rule on a file may hold
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1                                          # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1                              # ABI 6


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def abi():
    """The kernel's Landlock ABI version; 0 when it has none (not built, not enabled, or a seccomp filter says no)."""
    try:
        version = _libc().syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), CREATE_RULESET_VERSION)
    except (OSError, AttributeError):
        return 0
    return max(version, 0)


def fs_rights(version):
    return FS_BY_ABI[max(v for v in FS_BY_ABI if v <= version)]


def restrict(read=(), write=(), version=None):
    """Confine this process (and what it starts): read and execute `read`, everything in `write`, nothing else on
    the file system; no TCP bind or connect (ABI 4); no signals or abstract sockets out of the domain (ABI 6).

    Needs no_new_privs (or CAP_SYS_ADMIN). Returns the ABI it used, 0 when the kernel has no Landlock. Paths
    that do not exist are skipped; any other failure raises OSError with the errno.
    """
    version = abi() if version is None else version
    if version < 1:
        return 0
    lib, handled = _libc(), fs_rights(version)
    net = NET_BIND_TCP | NET_CONNECT_TCP if version >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if version >= 6 else 0
    attr = struct.pack("QQQ", handled, net, scoped)[:8 if version < 4 else 16 if version < 6 else 24]
    ruleset = lib.syscall(SYS_CREATE_RULESET, attr, ctypes.c_size_t(len(attr)), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "could not create a Landlock ruleset")
    try:
        for paths, rights in ((read, FS_EXECUTE | FS_READ_FILE | FS_READ_DIR), (write, handled)):
            for path in paths:
                _allow(lib, ruleset, path, rights & handled)
        # no rule for any port: with the TCP rights handled, every bind and connect is refused
        if lib.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: restrict_self needs it
            raise OSError(ctypes.get_errno(), "could not set no_new_privs")
        if lib.syscall(SYS_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "could not enforce the Landlock ruleset")
    finally:
        os.close(ruleset)
    return version


def _allow(lib, ruleset, path, rights):
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not os.path.isdir(path):
            rights &= FILE_ONLY
        rule = struct.pack("=Qi", rights, fd)  # landlock_path_beneath_attr is packed: 12 bytes
        if lib.syscall(SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, rule, 0) != 0:
            raise OSError(ctypes.get_errno(), f"could not allow {path} in the Landlock ruleset")
    finally:
        os.close(fd)
