"""Issue 61's promise, graded on this CPU-only machine: every planted device slip (a tensor made on the CPU, a .cpu()
round trip, a CPU tensor in a matrix product or linear layer, a CPU index or embedding) loses its item's shapes check
on the fake GPU, with a reason naming the device and the student's line, and no other item loses anything; following
the lecture on an edge case beyond it costs exactly one point, in every assignment."""
import nbformat
import pytest

from autograder.course.config import load_course
from autograder.grading.grade import grade_notebook
from autograder.grading.planted import packed
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from tests.planted import dependents, planted_module, scores, variant_source

pytestmark = pytest.mark.grading
AIDS = list(load_course().assignments)
SHIPPED = ("w8l1_attention_vision", "w8l4_transformers", "lab14_transformers")  # the course's own three


def table(aid, name):
    """The planted file's DEVICE_SLIPS or EDGE_SLIPS: optional for an assignment an author adds (tests/handwritten/
    plants its device slips among its wrong variants), required of the course's own (below)."""
    return getattr(planted_module(aid), name, None) or {}


@pytest.mark.parametrize("aid", SHIPPED)
def test_each_of_the_courses_own_assignments_plants_device_slips_and_an_edge_case(aid):
    assert table(aid, "DEVICE_SLIPS"), f"{aid} plants no device slip (tests/planted/{aid}.py DEVICE_SLIPS)"
    assert table(aid, "EDGE_SLIPS"), f"{aid} declares no edge case beyond the lecture (EDGE_SLIPS)"


def graded(tmp_path, aid, batch, items=None):
    """The solution notebook with each (item, name, variant) of `batch` planted, graded without experiments."""
    sources = solved_sources(aid)
    for item, _, variant in batch:
        sources[item] = variant_source(aid, item, variant)
    path = tmp_path / f"{aid}.ipynb"
    nbformat.write(with_cells(release_notebook(aid), sources), path)
    return grade_notebook(path, aid, items=items, device="cpu", experiments=False)


@pytest.mark.parametrize("aid", [aid for aid in AIDS if table(aid, "DEVICE_SLIPS")])
def test_every_device_slip_loses_its_shapes_check_naming_the_device_and_its_line_and_nothing_else(tmp_path, aid):
    slips = [(item, name, variant) for item, named in table(aid, "DEVICE_SLIPS").items()
             for name, (variant, _) in named.items()]
    kinds = {"cpu()": 0, "made": 0}
    deps = dependents(aid)
    for k, batch in enumerate(packed(aid, slips)):
        (tmp_path / str(k)).mkdir()
        result = graded(tmp_path / str(k), aid, batch)
        for item, name, _ in batch:
            failing = [t for t in result["tests"] if t["item"] == item and t["score"] < t["max_score"]]
            assert [t["name"] for t in failing] == [f"{item}: shapes"], (name, failing)
            reason = failing[0]["output"]
            assert "a tensor on cpu" in reason and "(cuda, a fake GPU)" in reason, (name, reason)
            assert f"(cell {item}, line " in reason, (name, reason)  # the slipped item's own line, not a callee's
            kinds["cpu()" if "moved to the CPU" in reason else "made"] += 1
        reach = set().union(*({item} | deps[item] for item, _, _ in batch))
        hurt = {i: s for i, s in scores(result).items() if i not in reach and s[0] < s[1]}
        assert not hurt, f"items with no device slip lost points: {hurt}"
    assert kinds["cpu()"] and kinds["made"], kinds  # both ways a tensor strays: made there, or moved there


@pytest.mark.parametrize("aid", [aid for aid in AIDS if table(aid, "EDGE_SLIPS")])
def test_following_the_lecture_on_an_edge_case_costs_exactly_one_point(tmp_path, aid):
    edges = [(item, name, variant, kinds) for item, named in table(aid, "EDGE_SLIPS").items()
             for name, (variant, kinds) in named.items()]
    for k, (item, name, variant, kinds) in enumerate(edges):
        (tmp_path / str(k)).mkdir()
        result = graded(tmp_path / str(k), aid, [(item, name, variant)], items=[item])
        score, max_score = scores(result)[item]
        failing = [t["name"] for t in result["tests"] if t["score"] < t["max_score"]]
        assert max_score - score == 1 and failing == [f"{item}: {kind}" for kind in kinds], (name, failing)
