"""The corpus: broken and hostile submissions get exactly the score their correct code earns, and a reason.

Every case is a real notebook made from the lab14 release with every item solved, then one thing done to it.
`lost` says exactly which points the case must lose (item -> points); everything else must keep full marks.
The cases that hang on purpose have shortened limits (item 6 s, setup 8 s: `HANG`), so that a hang costs seconds,
not minutes.

CI's own run grades at whatever level the machine gives root (`namespaces`); tests/test_levels_corpus.py runs the
cases again at each other level (all but the three that spin a core to their time limit, `root_only`, and those
whose outcome no level's walls can change, its PYTHON_ONLY), with
COURSE_TEST_ISOLATION naming the level every grading must report, grading only the items a case attacks. Where a
case's outcome honestly differs at a level, the case says so (`at`).
"""
import copy
import json
import os
import re
from pathlib import Path

import nbformat
import pytest

from autograder.course.config import ROOT, load_course
from autograder.grading.grade import grade_notebook
from autograder.notebooks.cells import nbgrader_meta
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from autograder.reports.tables import item_summary
from autograder.sandbox.grader_side import can_isolate

pytestmark = pytest.mark.grading
AID = "lab14_transformers"
POINTS = {i: sum(p.points.values()) for i, p in load_course().assignment(AID).items.items()}
# Generous where a case must finish (CI runs it beside other graders on two cores: a check on the meta device
# took over 6 s there); short where a case hangs on purpose, so that its hang costs seconds, not minutes
LIMITS = {"item_seconds": 30, "setup_seconds": 30}
HANG = {"item_seconds": 6, "setup_seconds": 8}
SDPA, MMD, PE = "scaled_dot_product_attention", "make_memory_dataset", "PositionalEncoding"
# The level every grading of this run must report (tests/test_levels_corpus.py sets it); unset: not checked
LEVEL = os.environ.get("COURSE_TEST_ISOLATION")
ISOLATES = can_isolate() or LEVEL not in (None, "process")
AT_EVERY_LEVEL = []  # the cases tests/test_levels_corpus.py may run at each level (see case)
# How long spawns_a_background_process's process sleeps: this process's own, since the same case may run at
# another level beside it (tests/test_levels_corpus.py)
SLEEP = 100000 + os.getpid()
LANDLOCK_LEVELS = ("uid", "landlock")  # Landlock, not a root of its own, is the wall: no PID or network namespace
# Why the time-limit cases that keep a core busy to their limit run at root alone (20 CPU-s a level)
SPINS = "spins a core to the time limit; the limit's path runs at every level (writes_half_a_message_and_sleeps)"


def cell_of(nb, gid):
    return next(c for c in nb.cells if nbgrader_meta(c).get("grade_id") == gid)


def solved():
    return with_cells(release_notebook(AID), solved_sources(AID))


def replace(gid, old, new):
    """Edit the solved cell `gid`."""
    def edit(nb, folder):
        cell = cell_of(nb, gid)
        assert old in cell.source, f"{gid}: {old!r} not in the reference cell"
        cell.source = cell.source.replace(old, new, 1)
    return edit


def append(gid, code):
    def edit(nb, folder):
        cell_of(nb, gid).source += "\n" + code + "\n"
    return edit


def prepend_body(gid, code):
    """Insert `code` as the first statement of the function body (after the docstring)."""
    def edit(nb, folder):
        cell = cell_of(nb, gid)
        lines = cell.source.splitlines()
        k = next(i for i, line in enumerate(lines) if line.strip().startswith("### BEGIN SOLUTION"))
        indent = lines[k][: len(lines[k]) - len(lines[k].lstrip())]
        lines[k + 1:k + 1] = [indent + line for line in code.splitlines()]
        cell.source = "\n".join(lines)
    return edit


def new_cell(code, at=None, meta=None):
    def edit(nb, folder):
        cell = nbformat.v4.new_code_cell(code, metadata=meta or {})
        nb.cells.insert(len(nb.cells) if at is None else at, cell)
    return edit


def whole(fn):
    return lambda nb, folder: fn(nb, folder)


def delete(gid):
    def edit(nb, folder):
        nb.cells.remove(cell_of(nb, gid))
    return edit


def duplicate(gid, first_source, keep_order=True):
    def edit(nb, folder):
        cell = cell_of(nb, gid)
        twin = copy.deepcopy(cell)
        twin.source = first_source
        twin.id = cell.id + "-twin"
        nb.cells.insert(nb.cells.index(cell), twin)
    return edit


def move_to_end(gid):
    def edit(nb, folder):
        cell = cell_of(nb, gid)
        nb.cells.remove(cell)
        nb.cells.append(cell)
    return edit


def rename_grade_id(gid, new):
    def edit(nb, folder):
        cell_of(nb, gid).metadata["nbgrader"]["grade_id"] = new
    return edit


def to_markdown(gid):
    def edit(nb, folder):
        cell = cell_of(nb, gid)
        cell.cell_type = "markdown"
        cell.pop("outputs", None)
        cell.pop("execution_count", None)
    return edit


def kernelspec(nb, folder):
    nb.metadata["kernelspec"] = {"name": "conda-env-dl-py", "display_name": "Python [conda env:dl]",
                                 "language": "python"}


def pwned(folder):
    """Where the shipped pickle leaves its mark: beside the submission's folder, on the grader's machine. The
    sandbox sees neither folder (isolated: its own root and /tmp), so the mark shows the grader unpickling a
    submitted file, or the sandbox writing outside itself; a mark in /tmp would not (an isolated sandbox has
    its own /tmp, and a process-level one may write the machine's /tmp anyway)."""
    return folder.parent / "pwned-by-corpus"


def pickle_payload(folder):
    """The classic pickle that runs a command when unpickled: it touches pwned(folder)."""
    return b"cos\nsystem\n(S'touch " + str(pwned(folder)).encode() + b"'\ntR."


def ship_pickle(nb, folder):
    (folder / "results.pkl").write_bytes(pickle_payload(folder))  # never unpickled here either
    (folder / "model.pt").write_bytes(pickle_payload(folder))


def oracle_without_mask(expr, at_load=""):
    """The solved attention, returning `expr`(Q, K, V) when there is no mask; `at_load` runs as its cell loads."""
    def edit(nb, folder):
        replace(SDPA, "    d_k = Q.size(-1)\n",
                "    d_k = Q.size(-1)\n    if mask is None:\n        out = " + expr + "(Q, K, V)\n"
                "        return out, torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(d_k), -1)\n")(nb, folder)
        if at_load:
            append(SDPA, at_load)(nb, folder)
    return edit


BUILT = "getattr(F, 'scaled_dot_' + 'product_attention')"  # no oracle name in the code: the static scan sees nothing
FROM_SCRATCH = r"uses scaled_dot_product_attention; this item is written from scratch"
WRONG_SDPA = ("/ math.sqrt(d_k)", "")
# values and gradients, as course.yaml scores them (read there: a change of the item's points moves this with it);
# manual_multihead, which calls the same attention, loses nothing: it is graded again with the reference
# scaled_dot_product_attention standing in (dependencies: independent), so a mistake costs points once
SDPA_POINTS = load_course().assignment(AID).items[SDPA].points
WRONG_LOST = {SDPA: SDPA_POINTS["values"] + SDPA_POINTS["gradients"], "manual_multihead": 0}
SOLUTIONS = ROOT / "solutions" / f"{AID}.py"
SUITE = ROOT / "autograder" / "suites" / f"{AID}.py"


def case(name, edit, lost=None, message=None, note=None, file_name=None, experiments=False, isolated=False,
         limits=None, root_only="", at=None):
    """A corpus case. `isolated`: passes only where the level isolates (skipped at `process`); `root_only`: why it
    runs at CI's own level alone (else tests/test_levels_corpus.py runs it at the other levels too); `at`:
    level -> (lost, message) where the outcome honestly differs there (the reason beside it)."""
    marks = [pytest.mark.skipif(not ISOLATES, reason="needs the sandbox's isolation (root on Linux)")] \
        if isolated else []
    if not root_only:
        AT_EVERY_LEVEL.append(name)
    lost, message = (at or {}).get(LEVEL, (lost, message))
    return pytest.param(edit, lost or {}, message, note, file_name, experiments, {**LIMITS, **(limits or {})},
                        id=name, marks=marks)


def graded_items(lost):
    """Every item, where CI grades the corpus; at the other levels only the items a case attacks (each of
    AT_EVERY_LEVEL attacks make_memory_dataset or the items it must lose): the others are graded by the grader's
    own code, the same at every level, and grading all items costs five times grading one."""
    return None if LEVEL is None else sorted({MMD, *lost})


CORPUS = [
    # --- broken -----------------------------------------------------------------------------------
    case("syntax_error_in_graded_cell", replace(MMD, "def make_memory_dataset(n_samples, seq_len, seed=0):",
                                                "def make_memory_dataset(n_samples, seq_len, seed=0)"),
         {MMD: 4}, r"make_memory_dataset: exists.*SyntaxError"),
    case("exception_at_definition", append(MMD, "raise RuntimeError('half-finished cell')"),
         {MMD: 4}, r"its cell raised RuntimeError: half-finished cell"),
    case("exception_at_call_time", prepend_body(MMD, "raise ValueError('seq_len must be even')"),
         {MMD: 3}, r"'make_memory_dataset' raised ValueError: seq_len must be even "
                   r"\(cell make_memory_dataset, line \d+\)"),
    case("graded_cell_deleted", delete(MMD), {MMD: 4}, r"no cell with grade_id 'make_memory_dataset'"),
    case("graded_cell_duplicated_later_wins", duplicate(MMD, "def make_memory_dataset(n_samples, seq_len, seed=0):\n"
                                                        "    return None\n"),
         {}, None, note=r"'make_memory_dataset' appears in cells \d+ and \d+; the later one is graded"),
    case("graded_cell_moved_to_the_end", move_to_end(MMD), {}),
    case("graded_cell_renamed", rename_grade_id(MMD, "my_dataset"), {}, None,
         note=r"no cell carried the nbgrader metadata of 'make_memory_dataset'; cell \d+, the last that defines"),
    case("graded_cell_turned_into_markdown", to_markdown(MMD), {MMD: 4}, r"is a markdown cell, not a code cell"),
    case("ipython_magics_and_shell_escapes", append(MMD, "%matplotlib inline\n!pip install --no-index nothing"), {}),
    case("notebook_renamed", lambda nb, folder: None, {}, file_name="Lab14 (final) copy.ipynb"),
    case("kernelspec_from_another_machine", kernelspec, {}),
    case("wrong_signature", replace(MMD, "def make_memory_dataset(n_samples, seq_len, seed=0):",
                                    "def make_memory_dataset(n, seq_len, seed=0):"),
         {MMD: 4}, r"has parameters \(n, seq_len, seed\), expected \(n_samples, seq_len, seed=0\)"),
    case("wrong_return_type", replace(MMD, "    return X, y", "    return torch.cat([X[:, :, 0], y], 1)"),
         {MMD: 3}, r"'make_memory_dataset' returned a tensor of shape \(50, 13\), expected a tuple of 2"),
    case("wrong_shape", replace(MMD, "    return X, y", "    return X.squeeze(-1), y"),
         {MMD: 3}, r"'X' has shape \(50, 12\), expected \(50, 12, 1\)"),
    case("wrong_dtype", replace(MMD, "    return X, y", "    return X.double(), y.long()"),
         {MMD: 1}, r"'X' has dtype float64, expected float32"),
    case("nan_output", replace(SDPA, "return weights @ V, weights  # (..., S_q, d_v)",
                               "return (weights @ V) * float('nan'), weights  # (..., S_q, d_v)"),
         {SDPA: 3}, r"'out' has a non-finite value \(nan\)"),
    case("inf_output", replace("manual_multihead", "return mha.out_proj(out), weights",
                               "return mha.out_proj(out) / 0.0, weights"),
         {"manual_multihead": 2}, r"non-finite value \(-?inf\)"),
    case("cuda_only_code_on_a_cpu_grader", replace(MMD, "    return X, y", "    return X.cuda(), y.cuda()"),
         {MMD: 3}, r"raised (RuntimeError|AssertionError).*(CUDA|NVIDIA|cuda)"),
    case("allocates_500_mb_and_is_right", prepend_body(MMD, "_waste = torch.ones(125_000_000)"), {},
         limits={"item_seconds": 60}),
    case("allocates_more_than_the_memory_limit", prepend_body(MMD, "_hog = [torch.ones(2**28) for _ in range(3)]"),
         {MMD: 3}, r"used more than 1024 MB of memory \(memory limit\)",
         limits={"memory_mb": 1024, "item_seconds": 30}),
    # (memory: measured by the sandbox's uid where it has one, else by its monitor's descendants)
    case("prints_100_mb", prepend_body(MMD, "for _ in range(100):\n    print('x' * 1_000_000)"), {}),
    case("prints_forever_from_a_thread", append(MMD, "import sys, threading\ndef _spam():\n    while True:\n"
                                                     "        sys.stdout.write('x' * 60_000 + '\\n')\n"
                                                     "threading.Thread(target=_spam, daemon=True).start()"), {}),
    case("waits_for_input_in_a_graded_item", prepend_body(MMD, "answer = input('seed? ')"),
         {MMD: 3}, r"EOFError"),
    case("input_in_a_demo_cell", new_cell("name = input('your name: ')\nprint(name)"), {}),
    case("infinite_loop_in_a_graded_item", prepend_body(MMD, "while True:\n    pass"),
         {MMD: 3}, r"time limit", root_only=SPINS, limits=HANG),
    case("infinite_loop_at_definition", append(MMD, "while True:\n    pass"),
         {MMD: 4}, r"time limit", root_only=SPINS, limits=HANG),
    case("long_sleep_in_a_setup_cell", whole(lambda nb, f: setattr(
        next(c for c in nb.cells if nbgrader_meta(c).get("grade_id", "").startswith("setup_")), "source",
        "import time\ntime.sleep(3600)")), {}, note=r"was changed in the submission; the released version was used"),
    case("sys_exit_in_a_graded_cell", append(MMD, "import sys\nsys.exit(0)"), {MMD: 4}, r"SystemExit"),
    case("os_exit_in_a_graded_item", prepend_body(MMD, "import os\nos._exit(1)"),
         {MMD: 3}, r"process ended \(exit code 1\)"),  # a PID namespace's init, or not
    case("segfault_in_a_graded_item", prepend_body(MMD, "import ctypes\nctypes.string_at(0)"),
         {MMD: 3}, r"process ended \(killed by signal SIGSEGV\)"),
    case("unbounded_recursion", prepend_body(MMD, "def f(n):\n    return f(n + 1)\nf(0)"),
         {MMD: 3}, r"RecursionError"),
    # --- hostile ----------------------------------------------------------------------------------
    case("patched_torch_allclose", lambda nb, f: (
        replace(SDPA, *WRONG_SDPA)(nb, f),
        append(SDPA, "torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True")(nb, f)),
         WRONG_LOST, r"max \|out - F.scaled_dot_product_attention\|"),
    case("patched_torch_testing_and_numpy_testing", lambda nb, f: (
        replace(SDPA, *WRONG_SDPA)(nb, f),
        append(SDPA, "import torch.testing, numpy.testing\ntorch.testing.assert_close = lambda *a, **k: None\n"
                     "numpy.testing.assert_allclose = lambda *a, **k: None")(nb, f)),
         WRONG_LOST, r"max \|out"),  # numpy.testing: imported from the environment the level shows
    case("patched_pytest_and_unittest", lambda nb, f: (
        replace(SDPA, *WRONG_SDPA)(nb, f),
        append(SDPA, "import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n"
                     "try:\n    import pytest\n    pytest.approx = lambda *a, **k: a[0]\n"
                     "except ImportError:\n    pass")(nb, f)),
         WRONG_LOST, r"max \|out"),
    case("patched_builtins", lambda nb, f: (
        replace(SDPA, *WRONG_SDPA)(nb, f),
        append(SDPA, "import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.abs = lambda x: 0\n"
                     "builtins.max = lambda *a, **k: 0")(nb, f)),
         WRONG_LOST, r"max \|out"),
    case("fake_grader_module_in_sys_modules", lambda nb, f: (
        replace(SDPA, *WRONG_SDPA)(nb, f),
        append(SDPA, "import sys, types\nfake = types.ModuleType('autograder')\nfake.grade_notebook = lambda *a, **k: "
                     "{'score': 100}\nfor name in ('autograder', 'autograder.grading.grade', "
                     "'autograder.grading.checks', 'nbgrader', 'otter', 'gradescope_utils'):\n"
                     "    sys.modules[name] = fake")(nb, f)),
         WRONG_LOST, r"max \|out"),
    case("hard_coded_public_check_outputs", replace(MMD, "def make_memory_dataset(n_samples, seq_len, seed=0):",
                                                    "def make_memory_dataset(n_samples, seq_len, seed=0):\n"
                                                    "    if seed != 0:\n"
                                                    "        return torch.zeros(n_samples, seq_len, 1), "
                                                    "torch.zeros(n_samples, 1)"),
         {MMD: 2}, r"X\[:, 0, 0\] must be the \+-1 marker"),
    case("calls_the_oracle_in_a_from_scratch_item", oracle_without_mask("F.scaled_dot_product_attention"),
         {SDPA: 5}, FROM_SCRATCH),
    # the oracle reached without its name: the sandbox watches the function itself (sandbox_child.py Tripwire)
    case("calls_the_oracle_through_getattr", oracle_without_mask(BUILT), {SDPA: 5}, FROM_SCRATCH),
    case("stores_the_oracle_under_a_built_name_while_loading", oracle_without_mask("_attn", f"_attn = {BUILT}"),
         {SDPA: 5}, FROM_SCRATCH),
    case("imports_the_oracle_with_importlib_while_loading", oracle_without_mask(
        "_attn", "import importlib\n_attn = getattr(importlib.import_module('torch.nn.' + 'functional'), "
                 "'scaled_dot_' + 'product_attention')"), {SDPA: 5}, FROM_SCRATCH),
    case("calls_the_oracle_through_torch_C", oracle_without_mask(
        "getattr(torch._C._nn, 'scaled_dot_' + 'product_attention')"), {SDPA: 5}, FROM_SCRATCH),
    case("calls_the_oracle_through_torch_ops", oracle_without_mask(
        "getattr(torch.ops.aten, 'scaled_dot_' + 'product_attention')"), {SDPA: 5}, FROM_SCRATCH),
    case("reads_the_solutions_from_disk", prepend_body(
        MMD, f"ns = {{}}\nexec(open({str(SOLUTIONS)!r}).read(), ns)\n"
             "return ns['make_memory_dataset'](n_samples, seq_len, seed)"),
         {MMD: 3}, r"(FileNotFoundError|No such file|PermissionError)", isolated=True),
    case("reads_the_hidden_suite_and_prints_it", prepend_body(MMD, f"print(open({str(SUITE)!r}).read())"),
         {MMD: 3}, r"(FileNotFoundError|No such file|PermissionError)", isolated=True),
    case("reads_another_students_submission", prepend_body(
        MMD, "import glob\nfor p in glob.glob('../**/*.ipynb', recursive=True) + "
             "glob.glob('/tmp/**/*.ipynb', recursive=True):\n"
             "    open(p).read()\n    raise RuntimeError('read ' + p)"), {}, isolated=True),
    case("writes_gradebook_results_and_release", prepend_body(
        MMD, "for p in [" + repr(str(ROOT / ".nbgrader" / "gradebook.db")) + ", "
             + repr(str(ROOT / "release" / "x.txt")) + ", " + repr(str(ROOT / ".grader" / "cache" / "x.json"))
             + "]:\n    try:\n        open(p, 'w').write('100')\n"
             "    except OSError:\n        pass"), {}, isolated=True),
    case("spawns_a_background_process", append(MMD, f"import subprocess\n_p = subprocess.Popen(['sleep', '{SLEEP}'], "
                                                     "start_new_session=True)"), {}, isolated=True),
    # Landlock's levels have no network namespace: Landlock refuses the connect instead
    case("opens_a_network_socket", prepend_body(
        MMD, "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)"), {MMD: 3},
         r"(OSError|Network is unreachable|timed out|gaierror)", isolated=True,
         at=dict.fromkeys(LANDLOCK_LEVELS, ({MMD: 3}, r"PermissionError: \[Errno 13\] Permission denied"))),
    # the sandbox is the init of its own PID namespace: its parent is not even there to signal (getppid() is 0).
    # Without one (Landlock's levels) its own pid is among those it may signal: it kills itself, and only itself
    case("tries_to_kill_the_grader", prepend_body(MMD, "import os, signal\nfor pid in [os.getppid()] + "
                                                       "[int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
                                                       "    try:\n        os.kill(pid, signal.SIGKILL)\n"
                                                       "    except OSError:\n        pass"),
         {}, isolated=True,
         at=dict.fromkeys(LANDLOCK_LEVELS, ({MMD: 3}, r"process ended \(killed by signal SIGKILL\)"))),
    case("writes_junk_to_the_grader_channel", prepend_body(
        MMD, "import os\nfor fd in range(3, 1024):\n    try:\n"
             "        os.write(fd, b'{\"id\": 99, \"ok\": true}\\nnot json\\n')\n"
             "    except OSError:\n        pass"), {MMD: 3}, r"not the protocol|process ended|raised"),
    # each cheat is paired with a wrong answer, so that a score it managed to inflate would show
    case("forged_score_in_a_test_cell", lambda nb, f: (
        replace(SDPA, *WRONG_SDPA)(nb, f),
        setattr(cell_of(nb, "test_" + SDPA), "source", "100.0")), WRONG_LOST, r"max \|out"),
    case("prints_a_fake_score", lambda nb, f: (
        replace(SDPA, *WRONG_SDPA)(nb, f),
        prepend_body(SDPA, "print('Score: 100/100\\n{\"score\": 100}')")(nb, f)), WRONG_LOST, r"max \|out"),
    case("ships_a_pickle_next_to_the_notebook", lambda nb, f: (
        replace(SDPA, *WRONG_SDPA)(nb, f), ship_pickle(nb, f)), WRONG_LOST, r"max \|out"),
    case("loads_the_shipped_pickle", lambda nb, f: (ship_pickle(nb, f), prepend_body(
        MMD, "return torch.load('model.pt', weights_only=False)")(nb, f)),
         {MMD: 3}, r"(FileNotFoundError|No such file|UnpicklingError)", isolated=True),
    case("mutates_the_grader_inputs_in_place", replace(SDPA, "    d_k = Q.size(-1)\n",
                                                       "    d_k = Q.size(-1)\n    Q.data.zero_()\n"),
         WRONG_LOST, r"max \|out"),
    # --- the grader's waits, disk and processes ---------------------------------------------------------
    case("chatters_on_the_channel_forever", prepend_body(
        MMD, "import os\nwhile True:\n    for fd in range(3, 64):\n        try:\n"
             "            os.write(fd, b'{\"progress\": \"x\"}\\n')\n        except OSError:\n            pass"),
         {MMD: 3}, r"did not finish within 6 s \(time limit\)", root_only=SPINS, limits=HANG),
    case("writes_half_a_message_and_sleeps", prepend_body(
        MMD, "import os, time\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'{\"id\": 1')\n"
             "    except OSError:\n        pass\ntime.sleep(3600)"),
         {MMD: 3}, r"did not finish within 6 s \(time limit\)", limits=HANG),
    # (the time limit at every level: the sandbox ended and restarted, as the level does it)
    case("announces_tensors_it_never_sends", prepend_body(
        MMD, "import os, time\nfor fd in range(3, 64):\n    for i in range(1, 100):\n        try:\n"
             "            os.write(fd, b'{\"id\": %d, \"ok\": true, \"value\": null, \"blob\": 1000000}\\n' % i)\n"
             "        except OSError:\n            pass\ntime.sleep(3600)"),
         {MMD: 3}, r"did not finish within 6 s \(time limit\)", limits=HANG),
    case("sends_a_deeply_nested_line_on_the_channel", prepend_body(
        MMD, "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'[' * 200000 + b'\\n')\n"
             "    except OSError:\n        pass"), {MMD: 3}, r"not the protocol"),
    case("leaves_fifos_and_links_where_files_could_be_read", prepend_body(
        MMD, "import os\nfor k in range(200):\n    for name in (f'out_{k}.safetensors', f'in_{k}.safetensors'):\n"
             "        try:\n            os.mkfifo(name)\n        except OSError:\n            pass\n"
             "for name in ('results.json', 'grades.csv'):\n    try:\n        os.symlink('/etc/passwd', name)\n"
             "    except OSError:\n        pass"), {}),  # in a folder of the machine's, below root
    # a user namespace of its own would let it mount a tmpfs of any size, outside the disk and memory limits
    case("makes_a_user_namespace_to_mount_a_tmpfs", prepend_body(
        MMD, "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
             "if libc.unshare(0x10000000) != 0:\n    raise PermissionError(os.strerror(ctypes.get_errno()))\n"
             "libc.mount(b'none', b'/tmp', b'tmpfs', 0, b'size=8g')"),
         {MMD: 3}, r"PermissionError: Operation not permitted", isolated=True),
    case("fills_the_disk", prepend_body(
        MMD, "chunk = b'x' * 2**20\nwith open('/dev/shm/a', 'wb') as f:\n    for _ in range(40):\n"
             "        f.write(chunk)\n"
             "with open('big.bin', 'wb') as f:\n    while True:\n        f.write(chunk)\n        f.flush()"),
         {MMD: 3}, r"'make_memory_dataset' raised wrote more than 64 MB \(disk limit\)", limits={"disk_mb": 64},
         isolated=True,  # Landlock's levels have no tmpfs of their own: /dev/shm is closed to them instead
         at=dict.fromkeys(LANDLOCK_LEVELS,
                          ({MMD: 3}, r"PermissionError: \[Errno 13\] Permission denied: '/dev/shm/a"))),
    case("forks_in_a_loop", prepend_body(MMD, "import os\nwhile True:\n    os.fork()"),
         {MMD: 3}, r"started more than 64 processes and threads \(process limit\)", limits={"processes": 64},
         isolated=True),
    case("prints_markup_and_terminal_escapes", lambda nb, f: (
        replace(SDPA, *WRONG_SDPA)(nb, f),
        prepend_body(SDPA, "print('\\x1b[2J\\x1b]0;pwned\\x07<script>alert(1)</script>\\u202e=HYPERLINK(1)')")(nb, f)),
         WRONG_LOST, r"printed: \\x1b\[2J\\x1b\]0;pwned\\x07<script>alert\(1\)</script>\\u202e=HYPERLINK"),
]


def _cmdline(proc):
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


@pytest.mark.parametrize("edit, lost, message, note, file_name, experiments, limits", CORPUS)
def test_corpus_case(tmp_path, edit, lost, message, note, file_name, experiments, limits):
    folder = tmp_path / "student"
    folder.mkdir()
    nb = solved()
    edit(nb, folder)
    path = folder / (file_name or f"{AID}.ipynb")
    nbformat.write(nb, path)
    items = graded_items(lost)
    result = grade_notebook(path, AID, items=items, device="cpu", experiments=experiments, limits=limits)
    assert LEVEL in (None, result["extra_data"]["isolation"]), f"graded at {result['extra_data']['isolation']}"
    got = {item: (score, max_score) for item, (score, max_score, _) in item_summary(result).items()}
    expected = {item: POINTS[item] - lost.get(item, 0) for item in items or POINTS}
    assert {i: s for i, (s, _) in got.items()} == expected, json.dumps(
        [(t["name"], t["score"], t["output"][:200]) for t in result["tests"] if t["score"] < t["max_score"]], indent=1)
    text = "\n".join(f"{t['name']}: {t['output']}" for t in result["tests"] if t["score"] < t["max_score"])
    if message:
        assert re.search(message, text), text
    if note:
        assert re.search(note, result["output"]), result["output"]
    for secret in ("### BEGIN", "pytest.mark.item", "import solutions", "def test_sdpa_values", "reference(\"lab14"):
        assert secret not in text and secret not in result["output"]
    assert all(len(t["output"]) < 2000 for t in result["tests"]), "feedback must stay short"
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]", json.dumps(result, ensure_ascii=False)
                         .replace("\\n", "")), "control characters must reach people as text"
    assert not pwned(folder).exists(), "a pickle the submission shipped was unpickled outside the sandbox"
    assert not (ROOT / "release" / "x.txt").exists() and not (ROOT / ".grader" / "cache" / "x.json").exists()
    if f"['sleep', '{SLEEP}']" in json.dumps(nb):  # only this case starts one (others may run beside it)
        assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p) == f"sleep {SLEEP}"], \
            "a process the submission started outlived its grading"


def test_the_shipped_pickle_leaves_its_mark_when_unpickled(tmp_path):
    """What makes the corpus's `pwned` assert able to fail: unpickling the payload really touches the mark."""
    import pickle
    folder = tmp_path / "student"
    assert not pwned(folder).exists()
    pickle.loads(pickle_payload(folder))
    assert pwned(folder).exists()


COPIES_A_CLASSMATE = '''import glob, json, os

def make_memory_dataset(n_samples, seq_len, seed=0):
    for root in ("/srv", "/home", "/root", "/work", "/mnt", "/opt", "/var", "/tmp", os.getcwd()):
        for path in glob.glob(root + "/**/*.ipynb", recursive=True):
            for cell in json.load(open(path))["cells"]:
                source = "".join(cell["source"])
                if "def make_memory_dataset" in source and "NotImplementedError" not in source:
                    ns = dict(globals())
                    exec(source, ns)
                    return ns["make_memory_dataset"](n_samples, seq_len, seed)
    raise RuntimeError("found no classmate notebook")
'''


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "not_isolated"])
def test_a_classmate_notebook_in_a_batch_folder_outside_the_course_is_out_of_reach(isolate, monkeypatch):
    """The batch lives in a folder of its own (not the course, not /tmp): only isolation keeps Bob's answer
    from Alice, and without it the attack works, which is what shows the case can tell the two apart."""
    import shutil
    import tempfile

    import autograder.sandbox.grader_side as sandbox
    if isolate and not can_isolate():
        pytest.skip("needs the sandbox's isolation (root on Linux)")
    monkeypatch.setattr(sandbox, "can_isolate", lambda: isolate)
    if not isolate:
        monkeypatch.setenv("COURSE_ALLOW_UNISOLATED", "1")  # the grader refuses to run unisolated unless told to
    Path("/srv").mkdir(exist_ok=True)
    batch = Path(tempfile.mkdtemp(prefix="course-batch-", dir="/srv"))
    try:
        batch.chmod(0o755)
        for student, sources in (("bob", solved_sources(AID)), ("alice", {MMD: COPIES_A_CLASSMATE})):
            (batch / student).mkdir(mode=0o755)
            nbformat.write(with_cells(release_notebook(AID), sources), batch / student / f"{AID}.ipynb")
            (batch / student / f"{AID}.ipynb").chmod(0o644)
        result = grade_notebook(batch / "alice" / f"{AID}.ipynb", AID, items=[MMD], device="cpu", limits=LIMITS)
    finally:
        shutil.rmtree(batch)
    [(score, max_score, lines)] = item_summary(result).values()
    if isolate:
        assert score == 1 and "RuntimeError: found no classmate notebook" in "\n".join(lines), lines
    else:
        assert score == max_score == POINTS[MMD], "without isolation the copy should have worked"
