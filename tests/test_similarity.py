"""Similar submissions in the class report: the same program under other names, comments and literals is found;
another correct solution and the released stubs are not."""
import json

import nbformat
import pytest

from autograder.batch import run as batch
from autograder.course.config import course_root, load_course
from autograder.reports.class_report import class_report, similar_text
from autograder.reports.similarity import program, programs, released_programs
from tests.test_report import result

AID = "lab14_transformers"  # items: 1 scaled_dot_product_attention, 2 manual_multihead, ..., 5 make_memory_dataset

ALICE = {
    "scaled_dot_product_attention": '''\
def scaled_dot_product_attention(Q, K, V, mask=None):
    """softmax(Q K^T / sqrt(d_k)) V over (..., S, d_k); mask: 1/True = may attend, 0 = blocked."""
    d_k = Q.size(-1)
    scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # (..., S_q, S_k)
    if mask is None:
        weights = torch.softmax(scores, dim=-1)
        return weights @ V, weights
    allowed = mask != 0  # bool whatever the mask's dtype
    scores = scores.masked_fill(~allowed, float("-inf"))
    empty = ~allowed.any(dim=-1, keepdim=True)  # (..., S_q, 1)
    scores = scores.masked_fill(empty, 0.0)
    weights = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)
    return weights @ V, weights
''',
    "manual_multihead": '''\
def manual_multihead(x, mha):
    """Self-attention with mha's weights."""
    *batch, S, E = x.shape
    H = mha.num_heads
    D = E // H
    qkv = F.linear(x, mha.in_proj_weight, mha.in_proj_bias)  # (..., S, 3E)
    q, k, v = qkv.chunk(3, dim=-1)

    def split_heads(t):
        return t.reshape(*batch, S, H, D).transpose(-3, -2)  # (..., H, S, D)

    out, weights = scaled_dot_product_attention(split_heads(q), split_heads(k), split_heads(v))
    out = out.transpose(-3, -2).reshape(*batch, S, E)
    return mha.out_proj(out), weights
''',
    "make_memory_dataset": '''\
def make_memory_dataset(n_samples, seq_len, seed=0):
    """X (n, S, 1) ~ U[-1, 1] with X[:, 0] = +-1 marker; y (n, 1) = 1[marker > 0]."""
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n_samples, seq_len, 1, generator=g) * 2 - 1
    marker = torch.randint(0, 2, (n_samples,), generator=g).float() * 2 - 1
    X[:, 0, 0] = marker
    y = (marker > 0).float().unsqueeze(1)
    return X, y
''',
}

# alice's code with every name of bob's own, other comments and docstrings, and other literals
BOB = {
    "scaled_dot_product_attention": '''\
def scaled_dot_product_attention(query, key, value, m=None):
    # my attention!!
    width = query.size(-1)
    s = query @ key.transpose(-2, -1) / math.sqrt(width)
    if m is None:
        p = torch.softmax(s, dim=-1)   # softmax over keys
        return p @ value, p
    ok = m != False
    s = s.masked_fill(~ok, float("-1e30"))
    none_left = ~ok.any(dim=-1, keepdim=False)
    s = s.masked_fill(none_left, 0)
    p = torch.softmax(s, dim=-1).masked_fill(none_left, 0)
    return p @ value, p
''',
    "manual_multihead": '''\
def manual_multihead(inp, layer):
    *lead, n, width = inp.shape
    heads = layer.num_heads
    per = width // heads
    big = F.linear(inp, layer.in_proj_weight, layer.in_proj_bias)
    a, b, c = big.chunk(4, dim=1)

    def heads_of(z):
        """split"""
        return z.reshape(*lead, n, heads, per).transpose(-1, -3)

    res, att = scaled_dot_product_attention(heads_of(a), heads_of(b), heads_of(c))
    res = res.transpose(-1, -2).reshape(*lead, n, width)
    return layer.out_proj(res), att
''',
    "make_memory_dataset": '''\
def make_memory_dataset(count, length, seed=42):
    gen = torch.Generator().manual_seed(seed)
    data = torch.rand(count, length, 1, generator=gen) * 3 - 0.5
    sign = torch.randint(0, 5, (count,), generator=gen).float() * 2 - 1
    data[:, 1, 0] = sign
    labels = (sign > 1).float().unsqueeze(0)
    return data, labels
''',
}

# the same three items solved another way
CAROL = {
    "scaled_dot_product_attention": '''\
def scaled_dot_product_attention(Q, K, V, mask=None):
    scores = torch.einsum("...qd,...kd->...qk", Q, K) / Q.shape[-1] ** 0.5
    if mask is not None:
        scores = torch.where(mask.bool(), scores, torch.full_like(scores, float("-inf")))
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
    return torch.einsum("...qk,...kd->...qd", weights, V), weights
''',
    "manual_multihead": '''\
def manual_multihead(x, mha):
    E = x.shape[-1]
    H = mha.num_heads
    W, b = mha.in_proj_weight, mha.in_proj_bias
    outs, maps = [], []
    for h in range(H):
        cols = slice(h * E // H, (h + 1) * E // H)
        q = x @ W[:E][cols].T + b[:E][cols]
        k = x @ W[E:2 * E][cols].T + b[E:2 * E][cols]
        v = x @ W[2 * E:][cols].T + b[2 * E:][cols]
        out, w = scaled_dot_product_attention(q, k, v)
        outs.append(out)
        maps.append(w)
    return mha.out_proj(torch.cat(outs, dim=-1)), torch.stack(maps, dim=-3)
''',
    "make_memory_dataset": '''\
def make_memory_dataset(n_samples, seq_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = 2 * torch.rand(n_samples, seq_len, 1, generator=g) - 1
    y = torch.randint(0, 2, (n_samples, 1), generator=g).float()
    X[:, 0, 0] = 2 * y[:, 0] - 1
    return X, y
''',
}

# one function of the class written, the other as released: only the written one is code of the student's
PARTIAL_STUB = '''\
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=512):
        """a docstring of my own"""
        # TODO later
        raise NotImplementedError()

    def forward(self, x):
        return x + self.pe[0, : x.size(-2)]
'''


# the release's stubs as a student may leave them: not the released code, and still nothing written
REWORDED_STUBS = {
    "make_memory_dataset": "def make_memory_dataset(n_samples, seq_len, seed=0):\n"
                           "    # I will do this one later\n    pass\n    raise NotImplementedError('later')\n",
    "TransformerClassifier": '''\
class TransformerClassifier(nn.Module):
    def __init__(self, input_size=1, d_model=32, num_heads=4, num_layers=2, dropout=0.1, max_len=61):
        raise NotImplementedError("not yet")

    def forward(self, x, return_attn=False):
        raise NotImplementedError
''',
    "EncoderBlock": '''\
class EncoderBlock(nn.Module):
    def __init__(self, d_model, num_heads, ff_dim=None, dropout=0.1):
        pass

    def forward(self, x, need_weights=False):
        ...
''',
}


def notebook_with(tmp_path, name, cells):
    """The released notebook with the graded cells of `cells` (item -> code) replaced, as a student submits it."""
    nb = nbformat.read(course_root() / "release" / AID / f"{AID}.ipynb", as_version=4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in cells:
            cell.source = cells[gid]
    path = tmp_path / "submissions" / name / f"{AID}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    return path


@pytest.fixture
def graded(tmp_path, monkeypatch):
    """A results folder as `course grade --results-dir` writes it (batch.grade_one; the grading itself replaced by
    a fixed result): alice, bob (alice's code renamed), carol (another solution), dave and erin (the stubs)."""
    monkeypatch.setattr(batch, "grade_submission", lambda *a, **k: result(aid=AID))
    for name, cells in {"alice": ALICE, "bob": BOB, "carol": CAROL, "dave": {}, "erin": REWORDED_STUBS,
                        "frank": REWORDED_STUBS}.items():
        notebook = notebook_with(tmp_path, name, cells)
        batch.grade_one(name, notebook, AID, None, "cpu", tmp_path / "results", grader="test")
    return tmp_path / "results"


def test_the_same_program_under_other_names_comments_and_literals_is_one_program():
    for item in ALICE:
        assert program(ALICE[item]).key == program(BOB[item]).key, item
        assert program(ALICE[item]).key != program(CAROL[item]).key, item
    assert program("x = a.softmax(1)").key != program("x = a.sigmoid(1)").key  # what is called counts
    assert program("def f(a):\n    return a + 1\n").key != program("def f(a):\n    return a * 1\n").key


def test_a_stub_is_no_program_of_the_students(tmp_path):
    items = list(load_course().assignment(AID).items)
    released = released_programs(course_root() / "release" / AID / f"{AID}.ipynb", items)
    assert set(released) == set(items)
    as_released = notebook_with(tmp_path, "dave", {})
    assert programs(as_released, items, released) == {}  # nothing of the student's own to compare
    partial = notebook_with(tmp_path, "frank", {"PositionalEncoding": PARTIAL_STUB})
    found = programs(partial, items, released)
    assert list(found) == ["PositionalEncoding"]
    assert found["PositionalEncoding"] == program("class A(nn.Module):\n    def forward(self, x):\n"
                                                  "        return x + self.pe[0, : x.size(-2)]\n")


def test_the_class_report_shows_the_copied_pair_and_no_other(graded):
    page = class_report(graded)
    similar = page.split("<h3>Similar submissions</h3>")[1]
    assert "<tr><td>alice, bob</td><td>items 1-2, 5: <code>scaled_dot_product_attention</code>, " \
           "<code>manual_multihead</code>, <code>make_memory_dataset</code></td></tr>" in similar
    assert similar.count("<tr><td>") == 1  # carol's own solution and the stubs of dave, erin, frank pair with no one
    assert similar_text(graded) == [f"{AID}: items 1-2, 5 (scaled_dot_product_attention, manual_multihead, "
                                    f"make_memory_dataset) of alice and bob are the same program"]
    scores = {p.stem: json.loads(p.read_text())["score"] for p in graded.glob("*.json")}
    assert len(set(scores.values())) == 1  # the report changes no score


def test_stubs_pair_with_no_one_even_without_a_threshold(graded, monkeypatch):
    """erin and frank left the same reworded stubs; at any size and any number of items they are no program."""
    monkeypatch.setattr(load_course().similarity, "min_nodes", 1)
    monkeypatch.setattr(load_course().similarity, "min_items", 1)
    assert similar_text(graded) == [f"{AID}: items 1-2, 5 (scaled_dot_product_attention, manual_multihead, "
                                    f"make_memory_dataset) of alice and bob are the same program"]


def test_course_yaml_sets_the_threshold_and_can_turn_it_off(graded, monkeypatch):
    settings = load_course().similarity
    monkeypatch.setattr(settings, "min_items", 4)  # alice and bob share three items
    assert similar_text(graded) == []
    assert "None among the 6 submissions compared." in class_report(graded)
    monkeypatch.setattr(settings, "min_items", 2)
    monkeypatch.setattr(settings, "min_nodes", 120)  # make_memory_dataset is shorter: two items are left
    assert similar_text(graded) == [f"{AID}: items 1-2 (scaled_dot_product_attention, manual_multihead) of alice "
                                    f"and bob are the same program"]
    monkeypatch.setattr(settings, "enabled", False)
    assert "Similar submissions" not in class_report(graded) and similar_text(graded) == []


def test_a_notebook_moved_or_changed_since_grading_is_named_not_compared(graded):
    alice = json.loads((graded / "alice.json").read_text())["extra_data"]["grading"]["source"]
    with open(alice, "a") as f:
        f.write("\n")  # the same JSON, other bytes: not the notebook that was graded
    bob = graded.parent / "submissions" / "bob"
    bob.rename(bob.with_name("bob-moved"))
    page = class_report(graded)
    assert "1: the notebook the result records changed since it was graded (alice)" in page
    assert "1: the notebook the result records is not there (moved, or another machine&#39;s path) (bob)" in page
    assert similar_text(graded) == []


def test_pairs_alike_on_the_same_items_are_one_group():
    from autograder.reports.similarity import Group, Program, item_ranges, similar_groups
    big, other, small = Program("k1", 50), Program("k2", 50), Program("k3", 5)
    found = {"alice": {"a": big, "b": big, "c": small}, "bob": {"a": big, "b": big, "c": small},
             "carol": {"a": big, "b": big}, "dave": {"a": big, "b": other, "c": small}}
    assert similar_groups(found, ["a", "b", "c"], min_nodes=10, min_items=1) == [
        Group(("alice", "bob", "carol"), ("a", "b")), Group(("alice", "bob", "carol", "dave"), ("a",))]
    assert similar_groups(found, ["a", "b", "c"], min_nodes=10, min_items=2) == [
        Group(("alice", "bob", "carol"), ("a", "b"))]
    assert item_ranges([8, 3, 4, 5, 10, 11]) == "3-5, 8, 10-11"


def test_a_wrong_similarity_setting_is_an_error_naming_the_key():
    from autograder.course.config import parse_course
    from autograder.errors import ConfigError
    assert "similarity" not in load_course().model_dump()  # not in batch.grader_identity: no regrade for a report
    text = (course_root() / "course.yaml").read_text()
    assert "\nsimilarity:\n  enabled: " in text
    with pytest.raises(ConfigError, match="similarity.min_items"):
        parse_course(text.replace("\n  min_items: 2 ", "\n  min_items: 0 ", 1), "course.yaml")
    with pytest.raises(ConfigError, match="similarity.threshold"):
        parse_course(text.replace("\nsimilarity:\n", "\nsimilarity:\n  threshold: 0.9\n", 1), "course.yaml")
