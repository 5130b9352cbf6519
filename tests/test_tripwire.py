"""The from-scratch rule at run time: the oracles course.yaml lists are watched at the functions themselves.

A from-scratch item that reaches its oracle by any path (a built name, importlib, an alias stored while the
notebook loads, torch._C or torch.ops, a SciPy or scikit-learn equivalent) scores 0 with the from-scratch reason;
the grader's own harness using the same functions while it trains the student's parts costs the student nothing.
The lab14 paths are cases of tests/test_corpus.py; here: the table itself, the sandbox's side of the watch, and
w8l1's SciPy and scikit-learn equivalents graded end to end.
"""
import importlib
import importlib.util
import time

import nbformat
import pytest
import torch

from autograder.course.config import ROOT, Limits, load_course, parse_course
from autograder.errors import ConfigError
from autograder.grading.experiments import students_training_error
from autograder.grading.grade import grade_notebook
from autograder.grading.scoring import tripwire_table
from autograder.grading.student import Student
from autograder.notebooks.cells import Cell
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from autograder.reports.tables import item_summary
from autograder.sandbox.grader_side import Sandbox, StudentRaised

LIMITS = Limits(setup_seconds=60, item_seconds=30, experiment_seconds=60)
BUILT = "getattr(F, 'scaled_dot_' + 'product_attention')"  # no oracle name in the code: the static scan sees nothing


def sandbox_tripwire():
    """autograder/sandbox/child/tripwire.py as the student's process loads it: by path, as part of its own package."""
    spec = importlib.util.spec_from_file_location("sandbox_child_main",
                                                  ROOT / "autograder" / "sandbox" / "child" / "__main__.py")
    main = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(main)  # not run as __main__: it only defines load()
    return main.load("sandbox_child_under_test").tripwire


def imported(path):
    """Import the longest module prefix of a dotted path (what a student's `import` would do)."""
    parts = path.split(".")
    for k in range(len(parts) - 1, 0, -1):
        try:
            return importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
    raise AssertionError(f"no module of {path} imports")


# --- the table ------------------------------------------------------------------------------------

def test_every_path_course_yaml_lists_is_a_function_the_sandbox_can_watch():
    """A path that no longer resolves (a renamed private function, a new torch) would watch nothing, silently."""
    child, course = sandbox_tripwire(), load_course()
    wire = child.Tripwire(torch)
    assert course.oracles, "course.yaml has no oracles table"
    tables = [course.oracles] + [a.oracles for a in course.assignments.values()]  # the shared one, each's own
    for name, paths in ((name, paths) for table in tables for name, paths in table.items()):
        for path in paths:
            imported(path)
            found = child.resolve(path)
            assert found is not None, f"oracles.{name}: {path} does not resolve"
            assert wire.kind(found[2]) in ("function", "op", "builtin"), \
                f"oracles.{name}: {path} is a {type(found[2]).__name__}, which the sandbox cannot watch"


def test_every_from_scratch_name_must_be_in_the_oracles_table():
    text = (ROOT / "course.yaml").read_text()
    assert "  subspace_angles:\n    - scipy.linalg.subspace_angles\n" in text
    with pytest.raises(ConfigError, match=r"principal_angle_cosines\.from_scratch names subspace_angles"):
        parse_course(text.replace("  subspace_angles:\n    - scipy.linalg.subspace_angles\n", ""), "course.yaml")
    with pytest.raises(ConfigError, match=r"oracles: .*subspace_angles: needs a list of dotted paths"):
        parse_course(text.replace("    - scipy.linalg.subspace_angles\n", "    - subspace_angles\n"), "course.yaml")


def test_the_table_sent_to_the_sandbox_holds_only_the_assignments_oracles():
    course = load_course()
    table = tripwire_table(course, course.assignment("w8l1_attention_vision"))
    assert table["scratch"]["pca"] == ["PCA"] and "sklearn.decomposition.PCA.fit" in table["oracles"]["PCA"]
    assert "TransformerEncoderLayer" not in table["oracles"]  # a w8l4 and lab14 oracle
    assert table["experiments"] == {"seq2seq_attention": "attention_context"}  # the only from-scratch item trained


# --- the sandbox's side ------------------------------------------------------------------------------

SETUP = "import math\nimport torch\nimport torch.nn.functional as F\n"
HONEST = '''
def attention(Q, K, V):
    w = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1)), -1)
    return w @ V
'''
# The oracle under a built name, stored while the cell loads: before the first check, and before any watch
# that replaces the attribute only while a check runs.
CHEAT = f'''_attn = {BUILT}
def attention(Q, K, V):
    return _attn(Q, K, V)
'''
HARNESS = '''
import torch
import torch.nn.functional as F

def build(parts, cfg, seed, device):
    return torch.nn.Linear(4, 4)

def train(model, parts, data, cfg, seed):
    q = torch.randn(2, 3, 4)
    baseline = torch.nn.MultiheadAttention(4, 1, batch_first=True)
    baseline(q, q, q)                           # the grader's own use of both oracles: never the student's
    F.scaled_dot_product_attention(q, q, q)
    parts.attention(q, q, q)                    # the student's item, trained
    return {}

EXPERIMENTS = {"trains_attention": {"build": build, "train": train}}
'''
TABLE = {"oracles": {"scaled_dot_product_attention": ["torch.nn.functional.scaled_dot_product_attention",
                                                      "torch._C._nn.scaled_dot_product_attention"],
                     "MultiheadAttention": ["torch.nn.MultiheadAttention.forward"],
                     "subspace_angles": ["scipy.linalg.subspace_angles"],
                     "PCA": ["sklearn.decomposition.PCA.fit"]},
         "scratch": {"attention": ["scaled_dot_product_attention", "MultiheadAttention"],
                     "angles": ["subspace_angles"], "pca": ["PCA"]},
         "experiments": {"trains_attention": "attention"}}


def sandbox(attention, *more):
    sb = Sandbox([Cell("setup_a", SETUP, 0), Cell("attention", attention, 1),
                  *[Cell(gid, src, k + 2) for k, (gid, src) in enumerate(more)]], {"fake": HARNESS}, LIMITS)
    sb.start()
    return sb


def student(sb, item, watch=None):
    return Student(sb, item, "cpu", time.monotonic() + 30, watch=TABLE["scratch"].get(item, []) if watch is None
                   else watch, tripwire=TABLE)


def train(sb):
    return sb.request("experiment", 60, module="fake", name="trains_attention", cfg={}, seed=0, device="cpu")


@pytest.mark.grading
def test_an_alias_stored_while_loading_is_seen_in_a_check_and_while_training():
    sb = sandbox(CHEAT)
    try:
        q = torch.randn(2, 3, 4)
        you = student(sb, "attention")
        out = you.call("attention", q, q, q)
        assert torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(q, q, q), atol=1e-6)
        assert you.oracle_calls == {"scaled_dot_product_attention"}
        with pytest.raises(StudentRaised, match=r"'attention' uses scaled_dot_product_attention while training; "
                                                r"this item is written from scratch.*\(cell attention, line 3\)$") as e:
            train(sb)
        assert students_training_error(str(e.value))  # the experiment scores it as the student's, with this reason
    finally:
        sb.kill()


@pytest.mark.grading
def test_the_harness_may_use_the_oracles_while_it_trains_an_honest_item():
    sb = sandbox(HONEST, ("other", f"def other(q):\n    return {BUILT}(q, q, q)\n"))
    try:
        q = torch.randn(2, 3, 4)
        you = student(sb, "attention")
        you.call("attention", q, q, q)
        assert you.oracle_calls == set()
        assert train(sb)["ok"]  # the harness's nn.MultiheadAttention and F.scaled_dot_product_attention
        # calls count only while a from-scratch item is checked, and only against the oracles it may not use
        unwatched = student(sb, "other", watch=[])
        unwatched.call("other", q)
        assert unwatched.oracle_calls == set()
    finally:
        sb.kill()


@pytest.mark.grading
def test_scipy_and_sklearn_equivalents_are_watched_including_a_module_imported_inside_the_item():
    angles = ("angles", "from scipy import linalg as _la\n_sa = getattr(_la, 'subspace' + '_angles')\n"
                        "def angles(A, B):\n    return torch.as_tensor(_sa(A.numpy(), B.numpy()))\n")
    pca = ("pca", "import importlib\ndef pca(X, k):\n"
                  "    est = getattr(importlib.import_module('sklearn.decomposition'), 'P' + 'CA')\n"
                  "    return torch.as_tensor(est(n_components=k).fit(X.numpy()).components_)\n")
    sb = sandbox(HONEST, angles, pca)
    try:
        a, b = torch.randn(6, 2, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64)
        you = student(sb, "angles")
        you.call("angles", a, b)
        assert you.oracle_calls == {"subspace_angles"}
        you = student(sb, "pca")
        X = torch.randn(20, 5, dtype=torch.float64)
        you.call("pca", X, 2)  # sklearn.decomposition was not loaded when this call began: watched from the next
        you.call("pca", X, 2)
        assert you.oracle_calls == {"PCA"}
    finally:
        sb.kill()


# --- graded end to end: w8l1's SciPy and scikit-learn oracles ---------------------------------------

W8L1, PAC = "w8l1_attention_vision", "principal_angle_cosines"
SCIPY_ANGLES = '''import numpy as _np
from scipy import linalg as _la
_angles = getattr(_la, 'subspace' + '_angles')  # stored while the notebook loads, under a built name

'''
SKLEARN_PCA = '''import importlib
_estimator = getattr(importlib.import_module('sklearn.decomposition'), 'P' + 'CA')

'''


def w8l1_cheats():
    """The solved pca and principal_angle_cosines, each also calling its oracle's SciPy or scikit-learn form."""
    src = solved_sources(W8L1)
    begin = "    ### BEGIN SOLUTION\n"
    angles = src[PAC].replace(begin, begin + "    if W.dim() == 2:\n        th = _angles(W.detach().double().cpu()"
                                             ".numpy(), V.detach().double().cpu().numpy())\n        return torch."
                                             "as_tensor(_np.cos(th), dtype=W.dtype).sort(descending=True).values\n", 1)
    fit = "    _estimator(n_components=k).fit(X.detach().double().cpu().numpy())\n"
    pca = src["pca"].replace(begin, begin + fit, 1)
    assert angles != src[PAC] and pca != src["pca"]
    return {**src, PAC: SCIPY_ANGLES + angles, "pca": SKLEARN_PCA + pca}


@pytest.mark.grading
@pytest.mark.parametrize("sources, lost", [(solved_sources, {}), (w8l1_cheats, {"pca": 4, PAC: 4})],
                         ids=["from_scratch", "scipy_and_sklearn"])
def test_a_numpy_or_scipy_equivalent_of_the_oracle_zeroes_the_item(tmp_path, sources, lost):
    path = tmp_path / f"{W8L1}.ipynb"
    nbformat.write(with_cells(release_notebook(W8L1), sources(W8L1) if sources is solved_sources else sources()),
                   path)
    result = grade_notebook(path, W8L1, items=["pca", PAC], device="cpu", experiments=False)
    scores = {item: (score, full) for item, (score, full, _) in item_summary(result).items()}
    assert scores == {item: (4 - lost.get(item, 0), 4) for item in ("pca", PAC)}, result["tests"]
    oracle = {"pca": "PCA", PAC: "subspace_angles"}
    for t in result["tests"]:
        if t["item"] in lost:
            assert f"'{t['item']}' uses {oracle[t['item']]}; this item is written from scratch" in t["output"], t
