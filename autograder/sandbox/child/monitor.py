"""Supervision: the zygote forks a monitor per sandbox; the monitor forks the sandbox and ends it.

The zygote imports torch once; each monitor watches its sandbox and the grader's lifeline and, when either goes,
kills every process of the sandbox and removes its scratch folder.
"""
import contextlib
import json
import os
import sys
import traceback

from . import fake_gpu, helpers
from .isolation import CLONE_NEWPID, PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, enter_sandbox, enter_user_namespace, libc
from .server import Server


def serve(cfg, req_fd, resp_fd, in_pid_namespace):
    """Enter the sandbox, then answer requests until the grader closes the channel."""
    req, resp = os.fdopen(req_fd, "rb"), os.fdopen(resp_fd, "wb")
    try:
        level = enter_sandbox(cfg, in_pid_namespace)
    except Exception as e:
        resp.write(helpers.PROTOCOL.frame({"fatal": f"could not enter the sandbox: {e}"}))
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
    if cfg.get("threads"):  # set in the zygote already (its OMP_NUM_THREADS): here only where this sandbox differs
        import torch
        if torch.get_num_threads() != cfg["threads"]:
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
        with contextlib.suppress(OSError):
            os.write(status_w, f"{pid}\n".encode())
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
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
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
PRELOAD = ("matplotlib.pyplot", "IPython.display", "IPython.core.inputtransformer2", "ipywidgets", "scipy.linalg",
           "math", "random", "inspect", "types", "json", "typing", "dataclasses", "collections", "itertools",
           "functools")


def zygote(control_fd, import_path=None, grader_pid=None):
    """Import torch once, then fork a sandbox (through its monitor) per request: a sandbox starts in milliseconds.

    `import_path` is the grader's sys.path less the course's folders: started with -I, this process would
    otherwise miss packages found through PYTHONPATH or the user site. Its threads are the grader's share of the
    cores (OMP_NUM_THREADS in its environment), set in torch here so that every sandbox forks with them.
    `grader_pid`: the grader's own pid, as it gave it (grader_watch).
    """
    import signal
    import socket
    grader = grader_watch(grader_pid)
    if import_path:
        sys.path[:] = import_path
    # No PR_SET_PDEATHSIG: it fires when the *thread* that started us ends (a batch worker), not the grader.
    # The grader's end of the control socket closing (its exit, or its death) ends the loop below, and so does
    # the grader's own end (a pidfd: the socket's end may also be held by a process the grader forked); each
    # monitor watches its own lifeline: a Ctrl-C meant for the grader is not for these processes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import numpy  # noqa: E401, F401 -- imported once, shared copy-on-write
    imported = exit_with(grader)  # the imports take seconds on a busy machine: a grader that ends meanwhile ends us
    helpers.load_helpers()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch
        torch.set_num_threads(int(threads))
    os.environ["MPLBACKEND"] = "Agg"
    for name in PRELOAD:  # what notebooks' setup cells import: loaded once here instead of in every sandbox
        with contextlib.suppress(Exception):  # optional: a missing package is the notebook's own business
            __import__(name)
    fake_gpu.warm()  # the fake GPU's first use imports torch._dynamo and sympy: once here, not in every sandbox
    imported()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)       # monitors are reaped by the kernel
    sock = socket.socket(fileno=control_fd)
    # What a request's `preload` names (course.yaml's per assignment: what a student's code imports at a cost of
    # seconds, as torch.optim's first optimizer does torch._dynamo) is imported here once that sandbox has forked,
    # while no request waits: no grading waits for it, the sandboxes forked after it inherit it, and an assignment
    # that does not name it never pays for it (2 s of CPU taken from its grading on a small machine).
    later = []
    while wait_for_request(sock, grader):
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 5)
        if not msg:
            break
        cfg = json.loads(msg)
        later += [m for m in cfg.get("preload") or () if m not in sys.modules and m not in later]
        if os.fork() == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            sock.close()
            if grader is not None:
                os.close(grader)
            monitor(cfg, fds)
        for fd in fds:
            os.close(fd)
        while later and not request_waiting(sock):  # after the first fork, while no sandbox waits for one
            with contextlib.suppress(Exception):
                __import__(later.pop(0))
    # The grader has gone: nothing here needs cleaning up, and the interpreter's teardown of torch would keep this
    # process (and the grader's output pipes its parent may read to their end) a second longer.
    os._exit(0)


def grader_watch(grader_pid=None):
    """A pidfd of the grader (this process's parent), readable once it has ended; None where there is none.

    The grader's pid comes from the grader itself: a grader killed while this interpreter started (a second or more
    on a busy machine) has left it to a subreaper or init, whose pid getppid() would then give, and a watch of that
    would keep this process through all its imports (test_class_lifetime, a coordinator killed as its workers start)."""
    parent = os.getppid()
    if grader_pid is not None and parent != grader_pid:  # the grader ended before this process could look
        sys.exit(0)
    try:
        pidfd = os.pidfd_open(parent)
    except (AttributeError, OSError):
        return None
    if os.getppid() != parent:  # it ended before the pidfd was opened: the pidfd is another process's
        os.close(pidfd)
        sys.exit(0)
    return pidfd


def exit_with(grader):
    """A thread that ends this process as soon as the grader (a pidfd) ends; the function returned stops it, before
    the first fork (a sandbox must not start with a copy of it)."""
    import threading
    if grader is None:
        return lambda: None
    stop = threading.Event()

    def watch():
        import select
        while not stop.is_set():
            if select.select([grader], [], [], 0.1)[0]:
                os._exit(0)

    thread = threading.Thread(target=watch, name="course-grader-watch", daemon=True)
    thread.start()

    def stopped():
        stop.set()
        thread.join()
    return stopped


def request_waiting(sock):
    """Whether a sandbox's request is already there to read."""
    import select
    return bool(select.select([sock], [], [], 0)[0])


def wait_for_request(sock, grader):
    """Whether a request (or the socket's end) is there to read: False once the grader has ended."""
    import select
    poll = select.poll()
    poll.register(sock.fileno(), select.POLLIN)
    if grader is not None:
        poll.register(grader, select.POLLIN)
    while True:
        events = dict(poll.poll())
        if grader is not None and grader in events:
            return False
        if sock.fileno() in events:
            return True
