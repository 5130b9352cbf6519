"""The sandbox holds: hidden files, no network, time and memory limits, capped output, nothing outlives it."""
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from autograder.course.config import ROOT, Limits
from autograder.grading.student import Student
from autograder.notebooks.cells import Cell
from autograder.sandbox.grader_side import Sandbox, SandboxFailure, StudentRaised, can_isolate

pytestmark = pytest.mark.grading
LIMITS = Limits(setup_seconds=60, item_seconds=20, experiment_seconds=60, memory_mb=1500, output_kb=4)


def sandbox_of(*cells, limits=LIMITS, **kwargs):
    """A sandbox over these (grade_id, source) cells, not started: `with sandbox_of(...) as sb:` starts and ends it."""
    return Sandbox([Cell(gid, src, k) for k, (gid, src) in enumerate(cells)], {}, limits, **kwargs)


def ask(sb, name, *args, seconds=10):
    return Student(sb, name, "cpu", time.monotonic() + seconds).call(name, *args)


@pytest.fixture(scope="module")
def probe():
    with sandbox_of(("setup_probe", PROBE)) as sb:
        yield sb


PROBE = '''
import os, socket
def can_read(path):
    try:
        open(path, "rb").read(1)
        return True
    except OSError:
        return False
def listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []
def connect(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False
def write(path):
    try:
        open(path, "w").write("x")
        return True
    except OSError:
        return False
def whoami():
    return os.getuid()
'''


@pytest.mark.skipif(not can_isolate(), reason="isolation needs root on Linux")
def test_solutions_suites_and_course_files_are_invisible(probe):
    assert probe.isolation == "namespaces"
    for path in ["solutions/w8l4_transformers.py", "autograder/suites/w8l4_transformers.py", "course.yaml",
                 "autograder/grading/grade.py", ".git/HEAD", "assignments"]:
        assert ask(probe, "can_read", str(ROOT / path)) is False, path
    assert ask(probe, "listing", str(ROOT / "solutions")) == []
    assert ask(probe, "whoami") != 0


@pytest.mark.skipif(not can_isolate(), reason="isolation needs root on Linux")
def test_no_writes_outside_its_own_scratch_space(probe):
    assert ask(probe, "write", str(ROOT / "release" / "x.txt")) is False
    assert ask(probe, "write", "/etc/course-sandbox-test") is False
    assert ask(probe, "write", "/usr/course-sandbox-test") is False
    assert ask(probe, "write", "scratch.txt") is True
    assert ask(probe, "write", "/tmp/scratch.txt") is True


@pytest.fixture
def host_secrets(tmp_path):
    """A listener on the host's loopback and files outside the sandbox's allowlist, all open to anyone."""
    import socket
    server = socket.create_server(("127.0.0.1", 0))
    server.listen(8)
    places = [ROOT / ".grader", tmp_path, Path("/srv"), Path.home()]
    files = []
    for place in places:
        place.mkdir(parents=True, exist_ok=True)
        secret = place / f"course-sandbox-secret-{os.getpid()}.txt"
        secret.write_text("secret")
        secret.chmod(0o644)
        files.append(secret)
    for folder in {tmp_path, *tmp_path.parents}:  # pytest makes its tmp folders 0700; let any uid walk in
        if str(folder).startswith("/tmp/"):
            folder.chmod(0o755)
    yield server.getsockname()[1], files
    server.close()
    for secret in files:
        secret.unlink(missing_ok=True)


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "not_isolated"])
def test_the_host_network_and_files_are_out_of_reach_only_when_isolated(host_secrets, isolate, monkeypatch):
    """The same probes, once isolated and once not: the test itself can tell the two apart."""
    import autograder.sandbox.grader_side as sandbox
    if isolate and not can_isolate():
        pytest.skip("isolation needs root on Linux")
    monkeypatch.setattr(sandbox, "can_isolate", lambda: isolate)
    monkeypatch.setenv("COURSE_ALLOW_UNISOLATED", "1")
    port, files = host_secrets
    with sandbox_of(("setup_probe", PROBE)) as sb:
        reachable = ask(sb, "connect", "127.0.0.1", port)
        readable = [ask(sb, "can_read", str(f)) for f in files]
        assert (reachable, readable) == ((False, [False] * len(files)) if isolate else (True, [True] * len(files)))


def test_out_of_memory_the_kernel_picks_the_students_process_not_the_grader():
    with sandbox_of(("f", "def f():\n    return open('/proc/self/oom_score_adj').read().strip()\n")) as sb:
        assert ask(sb, "f") == "1000"
        assert Path("/proc/self/oom_score_adj").read_text().strip() != "1000"  # the grader keeps its own


def test_an_endless_call_is_stopped_at_its_deadline_and_the_next_call_works():
    with sandbox_of(("spin", "def spin():\n    while True:\n        pass\n"),
                    ("ok", "def ok():\n    return 7\n")) as sb:
        t0 = time.monotonic()
        with pytest.raises(SandboxFailure, match="time limit") as e:
            ask(sb, "spin", seconds=2)
        assert e.value.kind == "timeout" and time.monotonic() - t0 < 10
        sb.ensure()
        assert ask(sb, "ok") == 7
        assert sb.restarts == 1


def test_a_first_start_through_ensure_is_no_restart():
    """An experiment's own sandbox is first started by its training's ensure(): results.json's `restarts` counts
    only a process started again after one ended."""
    sb = sandbox_of(("ok", "def ok():\n    return 7\n"))
    try:
        sb.ensure()
        assert ask(sb, "ok") == 7 and sb.restarts == 0
        sb.kill()
        sb.ensure()
        assert ask(sb, "ok") == 7 and sb.restarts == 1
    finally:
        sb.kill()


def test_a_memory_blow_up_is_killed_with_a_message():
    with sandbox_of(("hog", "import torch\ndef hog():\n    x = torch.ones(600, 2**20)\n    y = x + 1\n    return 0\n"),
                    limits=LIMITS.model_copy(update={"memory_mb": 1200})) as sb:
        with pytest.raises(SandboxFailure, match="memory limit") as e:
            ask(sb, "hog", seconds=30)
        assert e.value.kind == "memory"


@pytest.mark.parametrize("body, words", [
    ("import os\n    os._exit(3)", "exit code 3"),
    ("import sys\n    sys.exit(0)", "SystemExit"),
    ("import ctypes\n    ctypes.string_at(0)", "SIGSEGV"),
])
def test_exits_and_crashes_are_reported_not_fatal(body, words):
    with sandbox_of(("boom", f"def boom():\n    {body}\n")) as sb, \
            pytest.raises((SandboxFailure, StudentRaised), match=words):
        ask(sb, "boom")


def test_printed_output_is_cut_at_the_limit():
    with sandbox_of(("noisy", "def noisy():\n    for _ in range(20000):\n        print('x' * 1000)\n"
                              "    return 1\n")) as sb:
        assert ask(sb, "noisy", seconds=30) == 1
        text = sb.output()
        assert len(text) < 6000 and "more bytes of output cut" in text


def sleepers(argument):
    """(pid, start time) of the machine's live `sleep <argument>` processes, seen from outside any sandbox."""
    from autograder.sandbox.grader_side import processes
    found = []
    for pid in processes():
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", argument.encode()]:
                found.append((pid, started_at(pid)))
        except (OSError, IndexError, ValueError):
            pass
    return found


def started_at(pid):
    """When `pid` started (clock ticks since boot): with the pid, names one process, never a later reuse."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def running(pid, start):
    """Whether the process `pid` that started at `start` still runs (a zombie runs nothing)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[19]) == start


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "not_isolated"])
def test_a_background_process_does_not_outlive_the_sandbox(isolate, monkeypatch):
    """The student's own `sleep`, in a session of its own, still running when its call passes the deadline: the
    sandbox is ended mid-request (no end-of-request cleanup ran), and that very process must be gone with it."""
    import threading

    import autograder.sandbox.grader_side as sandbox
    if isolate and not can_isolate():
        pytest.skip("isolation needs root on Linux")
    monkeypatch.setattr(sandbox, "can_isolate", lambda: isolate)
    monkeypatch.setenv("COURSE_ALLOW_UNISOLATED", "1")
    argument = f"{600 + os.getpid() % 1000}.{time.time_ns() % 1000:03d}"  # this test's own sleeper, not another's
    src = ("import subprocess, time\ndef spawn(s):\n"
           "    subprocess.Popen(['sleep', s], start_new_session=True)\n    time.sleep(60)\n")
    found, failures = [], []

    def call(sb):
        try:
            ask(sb, "spawn", argument, seconds=4)
        except SandboxFailure as e:
            failures.append(e)
    try:
        with sandbox_of(("spawn", src)) as sb:
            caller = threading.Thread(target=call, args=(sb,))
            caller.start()
            deadline = time.monotonic() + 4
            while not found and time.monotonic() < deadline:
                found = sleepers(argument)
                time.sleep(0.05)
            caller.join()
            assert found, "the background process should have been running during the call"
            assert [e.kind for e in failures] == ["timeout"], failures  # the sandbox was ended at the deadline
        deadline = time.monotonic() + 2
        while any(running(*p) for p in found) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(running(*p) for p in found), f"the student's background process {found} outlived the sandbox"
    finally:
        for pid, start in found:  # a survivor is this test's to clean up
            if running(pid, start):
                os.kill(pid, 9)


def test_a_sandbox_that_isolates_nothing_is_refused_unless_allowed(monkeypatch):
    """The process level (no fresh uid, no namespaces, no Landlock) is a grader failure naming the way out."""
    import autograder.sandbox.grader_side as sandbox
    monkeypatch.setattr(sandbox, "can_isolate", lambda: False)
    monkeypatch.setattr(sandbox, "can_contain", lambda: False)
    monkeypatch.delenv("COURSE_ALLOW_UNISOLATED", raising=False)
    with pytest.raises(SandboxFailure, match="--allow-unisolated") as e, sandbox_of(("setup_a", "x = 1")):
        pass
    assert e.value.kind == "sandbox"
    with sandbox_of(("setup_a", "x = 1"), limits=LIMITS.model_copy(update={"allow_unisolated": True})) as sb:
        assert sb.isolation == "process"


def test_a_hanging_setup_cell_is_skipped_and_the_rest_loads():
    with sandbox_of(("setup_hang", "import time\ntime.sleep(1000)\n"), ("ok", "def ok():\n    return 3\n"),
                    limits=LIMITS.model_copy(update={"setup_seconds": 3})) as sb:
        assert "setup_hang" in sb.load_errors and "time limit" in sb.load_errors["setup_hang"]
        assert ask(sb, "ok") == 3


def test_a_hanging_cell_costs_its_own_limit_not_the_whole_notebooks():
    """Nine quick cells, then one that hangs: it is stopped at setup_seconds (2 s), not at the load's whole
    budget (2 s times a quarter of the ten cells, rounded up: 6 s)."""
    quick = [(f"quick{k}", f"def quick{k}():\n    return {k}\n") for k in range(9)]
    with sandbox_of(*quick, ("hang", "while True:\n    pass\n"),
                    limits=LIMITS.model_copy(update={"setup_seconds": 2})) as sb:
        assert "within 2 s (time limit)" in sb.load_errors["hang"], sb.load_errors
        assert ask(sb, "quick8") == 8


def test_input_gets_end_of_file_instead_of_waiting():
    with sandbox_of(("ask_user", "def ask_user():\n    return input('name? ')\n")) as sb, \
            pytest.raises(StudentRaised, match="EOFError"):
        ask(sb, "ask_user")


def test_tensors_come_back_as_data_with_their_device_and_dtype():
    with sandbox_of(("double", "def double(x):\n    return x * 2, {'n': 3}\n")) as sb:
        x = torch.arange(6, dtype=torch.float64).reshape(2, 3)
        out, extra = ask(sb, "double", x)
        assert torch.equal(out, x * 2) and out.dtype == torch.float64 and out.student_device == "cpu"
        assert extra == {"n": 3}


def test_a_state_dict_longer_than_a_screen_comes_back_whole():
    """A 2 + 2 layer Transformer has 89 state tensors: none may be dropped on the way back."""
    with sandbox_of(("many", "import torch\n"
                             "def many():\n    return [torch.full((2,), float(i)) for i in range(150)]\n")) as sb:
        out = ask(sb, "many")
        assert len(out) == 150 and out[-1].tolist() == [149.0, 149.0]


def test_a_sandbox_starts_after_the_thread_that_started_the_zygote_has_ended():
    """Batch workers are threads: the zygote must outlive the one that happened to start it."""
    import threading

    from autograder.sandbox.grader_side import ZYGOTE
    first = sandbox_of(("setup_a", "x = 1"))
    worker = threading.Thread(target=first.start)
    worker.start()
    worker.join()
    assert first.proc is not None, "the sandbox did not start"
    first.kill()
    zygote = ZYGOTE.proc
    time.sleep(0.5)
    assert zygote.poll() is None, "the zygote died with the thread that started it"
    t0 = time.monotonic()
    with sandbox_of(("setup_a", "x = 2")) as sb:
        assert Student(sb, "x", "cpu", time.monotonic() + 10).attr("x", "real") == 2
    assert time.monotonic() - t0 < 60


def test_a_dead_zygote_is_replaced_at_the_next_start():
    from autograder.sandbox.grader_side import ZYGOTE
    with sandbox_of(("setup_a", "x = 1")):
        pass
    ZYGOTE.proc.kill()  # not yet reaped: the next start finds it dead, or fails to send and starts another
    with sandbox_of(("setup_a", "x = 3")) as sb:
        assert Student(sb, "x", "cpu", time.monotonic() + 10).attr("x", "real") == 3


def test_two_sandboxes_never_share_a_uid(monkeypatch):
    """The kill is by uid, so each sandbox leases its own: even when every pick starts at the same place."""
    import autograder.sandbox.accounting as accounting
    monkeypatch.setattr(accounting.time, "monotonic_ns", lambda: 0)
    leases = [accounting.lease_uid() for _ in range(20)]
    try:
        assert len({uid for uid, _ in leases}) == 20
    finally:
        for _, lease in leases:
            lease.close()
    uid, lease = accounting.lease_uid()
    lease.close()
    assert uid == leases[0][0], "a released uid is free again"


def test_a_sandbox_abandoned_from_another_thread_ends_its_request_and_never_starts_again():
    """grading/ahead.py's close(): a session that ended early ends the experiments still training beside it. The
    thread waiting on the sandbox gets a failure at once (not at its deadline), and a restart is refused."""
    import threading
    failures = []

    def call(sb):
        try:
            ask(sb, "nap", seconds=120)
        except SandboxFailure as e:
            failures.append(e)
    with sandbox_of(("nap", "import time\ndef nap():\n    time.sleep(600)\n")) as sb:
        caller = threading.Thread(target=call, args=(sb,))
        caller.start()
        caller.join(1)
        sb.abandon()
        caller.join(30)
        assert not caller.is_alive(), "the call went on after its sandbox was abandoned"
        assert len(failures) == 1 and failures[0].kind != "timeout", failures
        with pytest.raises(SandboxFailure, match="the grading it was for has ended"):
            sb.ensure()


def test_parallel_sandboxes_get_their_share_of_the_cores():
    """With several submissions graded at once each sandbox runs torch on its share of the cores, at most
    course.yaml's `threads`."""
    from autograder.course.config import load_course
    from autograder.sandbox.grader_side import threads_per_worker
    cores, most = len(os.sched_getaffinity(0)), load_course().threads
    assert threads_per_worker(1) == min(most, cores), "one worker gets its share explicitly"
    assert threads_per_worker(2) == max(1, min(most, cores // 2))
    assert threads_per_worker(4 * cores) == 1
    from autograder.sandbox.zygote import experiments_at_once
    for workers in (1, 2, 4 * cores):  # the experiments a grading trains at once fill its share, never more
        share = max(1, cores // workers)
        assert experiments_at_once(workers) * threads_per_worker(workers) in range(share - most + 1, share + 1)
    with sandbox_of(("setup_t", "import os, torch\ndef threads():\n"
                                "    return torch.get_num_threads(), int(os.environ['OMP_NUM_THREADS'])\n"),
                    threads=1) as sb:
        assert ask(sb, "threads") == (1, 1)


def test_the_zygote_sets_its_thread_count_before_any_sandbox_forks(monkeypatch):
    """A zygote started with a thread count (a warm worker's share) sets it in torch itself, before any sandbox
    forks: its sandboxes run with it, and the zygote's environment says it too (libgomp reads it once)."""
    import autograder.sandbox.grader_side as sandbox
    import autograder.sandbox.zygote as zygote
    monkeypatch.setattr(sandbox, "ZYGOTE", zygote.Zygote())
    sandbox.ZYGOTE.ensure_started(1)
    try:
        with sandbox_of(("setup_t", "import torch\ndef threads():\n    return torch.get_num_threads()\n")) as sb:
            assert ask(sb, "threads") == 1
        environ = Path(f"/proc/{sandbox.ZYGOTE.proc.pid}/environ").read_bytes().split(b"\0")
        assert b"OMP_NUM_THREADS=1" in environ and b"MKL_NUM_THREADS=1" in environ, environ
    finally:
        sandbox.ZYGOTE.proc.kill()


def test_a_sandbox_given_no_thread_count_runs_one_gradings_share_not_torchs_one_per_core(monkeypatch):
    """nbgrader's one-by-one path, Gradescope and the doctor grade with no worker's share (grade_notebook): their
    sandboxes, and the zygote the first one starts, still run course.yaml's `threads`, so that a notebook trains
    the same bits on every path (torch's default, one thread per core, is 2 here against the course's 1)."""
    import autograder.sandbox.grader_side as sandbox
    import autograder.sandbox.zygote as zygote
    monkeypatch.setattr(sandbox, "ZYGOTE", zygote.Zygote())
    share = sandbox.threads_per_worker(1)
    try:
        with sandbox_of(("setup_t", "import torch\ndef threads():\n    return torch.get_num_threads()\n")) as sb:
            assert sb.threads == share and ask(sb, "threads") == share, f"expected {share} threads"
        environ = Path(f"/proc/{sandbox.ZYGOTE.proc.pid}/environ").read_bytes().split(b"\0")
        assert f"OMP_NUM_THREADS={share}".encode() in environ, environ
    finally:
        sandbox.ZYGOTE.proc.kill()


ORPHANED_ZYGOTE = r'''
import os, sys, time
from autograder.sandbox.zygote import ZYGOTE
ZYGOTE.ensure_started(1)
if os.fork() == 0:  # a process forked from the grader holds the grader's end of the control socket too
    time.sleep(120)
    os._exit(0)
print(ZYGOTE.proc.pid, flush=True)
time.sleep(120)
'''


def test_a_zygote_ends_with_its_grader_even_when_another_process_holds_the_grader_end_of_its_socket(tmp_path):
    """The grader SIGKILLed while a process it forked keeps its end of the control socket open: the zygote still
    sees its grader end (a pidfd of its parent) and exits, rather than idling for as long as that fork lives."""
    with grader_and_zygote(tmp_path, ORPHANED_ZYGOTE) as (grader, zygote):
        time.sleep(1)
        assert running(*zygote), "the zygote should run while its grader does"
        grader.kill()
        grader.wait()
        assert gone_within(zygote, 60), "the zygote outlived its grader"  # its loop, after torch, notices


STARTING_ZYGOTE = r'''
import time
from autograder.sandbox.zygote import ZYGOTE
ZYGOTE.ensure_started(1)
print(ZYGOTE.proc.pid, flush=True)
time.sleep(120)
'''
IMPORTS_SECONDS = 1.5  # a zygote's imports (torch, matplotlib, IPython) take 3 s or more, 5 s on a busy machine


def test_a_zygote_ends_with_its_grader_while_it_is_still_importing(tmp_path):
    """The grader SIGKILLed the moment its zygote has started: the zygote ends at once (a thread watches the grader
    while it imports), not seconds later when its imports are done and its loop sees the socket closed."""
    with grader_and_zygote(tmp_path, STARTING_ZYGOTE) as (grader, zygote):
        time.sleep(0.3)  # its own interpreter up, the watch started, torch being imported
        grader.kill()
        grader.wait()
        assert gone_within(zygote, IMPORTS_SECONDS), \
            f"the zygote was still running {IMPORTS_SECONDS} s after its grader's end"


@contextlib.contextmanager
def grader_and_zygote(tmp_path, script_text):
    """(the grader process running `script_text`, its zygote's (pid, start time) as the script prints it); the
    grader's whole session killed at the end."""
    script = tmp_path / "grader.py"
    script.write_text(script_text)
    grader = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    try:
        zygote = int(grader.stdout.readline())
        yield grader, (zygote, started_at(zygote))
    finally:
        with contextlib.suppress(OSError):
            os.killpg(grader.pid, signal.SIGKILL)


def gone_within(process, seconds):
    """Whether `process` ((pid, start time)) has ended within `seconds`."""
    deadline = time.monotonic() + seconds
    while running(*process) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not running(*process)


def test_the_zygote_loads_what_a_training_may_import_only_after_its_first_sandbox(monkeypatch):
    """What an assignment names in course.yaml's `preload` (torch._dynamo, about 2 s of CPU, imported by torch.optim's
    first optimizer) is not on a grading's way: a new zygote's first sandbox forks without it, and the zygote loads it
    once while it waits, when a sandbox's assignment names it, so that a sandbox forked later has it before its
    notebook asks for anything; sandboxes that do not name it never cost the zygote its import. (torch._dynamo itself
    is now loaded before the first sandbox: the fake GPU of every grading's shapes checks imports it, fake_gpu.warm;
    a stdlib module nobody imports stands in for a preload here.)"""
    import autograder.sandbox.grader_side as sandbox
    import autograder.sandbox.zygote as zygote
    monkeypatch.setattr(sandbox, "ZYGOTE", zygote.Zygote())
    check = ("setup_m", "import sys\ndef loaded(name):\n    return name in sys.modules\n")
    named = "xml.dom.minidom"
    try:
        with sandbox_of(check) as sb:  # lab14's and w8l4's sandboxes name nothing
            assert ask(sb, "loaded", named) is False
            assert ask(sb, "loaded", "torch._dynamo") is True  # the fake GPU's, in every sandbox from the start
        with sandbox_of(check) as sb:  # a second one, after the zygote has waited: it imported nothing meanwhile
            assert ask(sb, "loaded", named) is False
        with sandbox_of(check, preload=[named]) as sb:
            assert ask(sb, "loaded", named) is False
        with sandbox_of(check) as sb:  # forked once the zygote is done with its import
            assert ask(sb, "loaded", named) is True
            assert ask(sb, "loaded", "a_module_nobody_imports") is False
    finally:
        sandbox.ZYGOTE.proc.kill()


def test_the_zygote_and_its_sandboxes_hold_nothing_of_the_graders_output(monkeypatch):
    """A caller that reads `course grade`'s output to its end (a TA's script, subprocess.run) waits for every process
    that holds it: the zygote (which may outlive the grader by a moment) holds neither the grader's stdout nor its
    stderr, and nor does any sandbox forked from it (each has its own output pipe as both)."""
    import autograder.sandbox.grader_side as sandbox
    import autograder.sandbox.zygote as zygote
    monkeypatch.setattr(sandbox, "ZYGOTE", zygote.Zygote())
    ours = {os.fstat(fd)[:2] for fd in (1, 2)}  # (inode, device) of this process's stdout and stderr
    try:
        with sandbox_of(("setup_m", "x = 1\n")):
            held = {os.stat(f"/proc/{sandbox.ZYGOTE.proc.pid}/fd/{fd}")[:2] for fd in (1, 2)}
            assert not held & ours, "the zygote holds the grader's stdout or stderr"
    finally:
        sandbox.ZYGOTE.proc.kill()


def test_openmp_threads_wait_passively_from_the_zygotes_start():
    """libgomp reads OMP_WAIT_POLICY once, when the zygote's torch loads it: the zygote's own environment (not only
    each sandbox's) says PASSIVE, so its threads sleep instead of spinning against a busy machine's other work."""
    from autograder.sandbox.zygote import ZYGOTE
    with sandbox_of(("setup_w", "import os\ndef policy():\n    return os.environ.get('OMP_WAIT_POLICY')\n")) as sb:
        assert ask(sb, "policy") == "PASSIVE"
        environ = Path(f"/proc/{ZYGOTE.proc.pid}/environ").read_bytes().split(b"\0")
    assert b"OMP_WAIT_POLICY=PASSIVE" in environ


def test_a_sandbox_that_cannot_start_names_the_cause(monkeypatch):
    """The zygote's own error (here: numpy not on its import path) is in the grader's message, not just
    'could not be started'."""
    import autograder.sandbox.grader_side as sandbox
    import autograder.sandbox.zygote as zygote
    monkeypatch.setattr(sandbox, "ZYGOTE", zygote.Zygote())
    monkeypatch.setattr(zygote, "import_path", lambda: ["/nonexistent-course-path"])
    try:
        with pytest.raises(SandboxFailure, match="ModuleNotFoundError: No module named 'numpy'") as e, \
                sandbox_of(("setup_a", "x = 1")):
            pass
        assert e.value.kind == "sandbox"
    finally:
        if sandbox.ZYGOTE.proc is not None:
            sandbox.ZYGOTE.proc.kill()
