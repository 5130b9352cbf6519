"""`course check`: every assignment passes, and each kind of inconsistency an author makes is one line naming it;
a figure changed in course.yaml reaches every place the notebook states it through `course sync`."""
import re
import shutil

import nbformat
import pytest
import yaml

from autograder import cli
from autograder.course.config import ROOT, load_course
from autograder.notebooks.facts import MARKED

LAB = "lab14_transformers"


def test_course_check_passes_for_every_assignment(capsys):
    assert cli.main(["check"]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert all(f"{aid}: ok" in out for aid in load_course().assignments), out


def course_copy(dest, edit):
    """The course as an author's clone has it (course.yaml changed by `edit(raw)`), its solutions, notebooks and
    release."""
    raw = yaml.safe_load((ROOT / "course.yaml").read_text())
    raw["data"]["mnist_dir"] = str(load_course().mnist_dir)
    edit(raw)
    dest.mkdir()
    (dest / "course.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    shutil.copy(ROOT / "nbgrader_config.py", dest)
    for folder in ("assignments", "solutions", "release"):
        shutil.copytree(ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def checked(course, monkeypatch, capsys, *args):
    monkeypatch.setenv("COURSE_ROOT", str(course))
    code = cli.main(["check", *args])
    return code, [line for line in capsys.readouterr().out.splitlines() if not line.startswith("check:")]


def lab(raw):
    return raw["assignments"][LAB]


@pytest.mark.parametrize("edit, says", [
    (lambda raw: lab(raw)["items"]["PositionalEncoding"].update(signature="(d_model, max_len=512, base=10000)"),
     "lab14_transformers: solutions/lab14_transformers.py: 'PositionalEncoding' has parameters (d_model, max_len), "
     "expected (d_model, max_len=512, base=10000) (course.yaml's signature)"),
    (lambda raw: lab(raw)["items"]["make_memory_dataset"]["points"].update(values=1),
     "lab14_transformers: 'make_memory_dataset' has values points in course.yaml, but no check in "
     "test_lab14_transformers.py (@pytest.mark.item(\"make_memory_dataset\", \"values\"))"),
    (lambda raw: lab(raw)["experiments"]["memory_task"].update(threshold={"test_acc": {"min": 0.99}}),
     "lab14_transformers: experiment 'memory_task' names metric 'test_acc', which "
     "autograder/harness/lab14_transformers.py never writes"),
])
def test_an_inconsistency_is_one_line_naming_it(tmp_path, monkeypatch, capsys, edit, says):
    code, lines = checked(course_copy(tmp_path / "course", edit), monkeypatch, capsys, LAB)
    assert code == 1 and says in lines, lines


@pytest.mark.parametrize("mark, percent", [(0.97, "97%"), (0.985, "98.5%")])  # 98.5%: never rounded into 98%
def test_a_changed_pass_mark_is_stale_until_synced_then_stated_everywhere(tmp_path, monkeypatch, capsys, mark,
                                                                           percent):
    def lower(raw):
        lab(raw)["experiments"]["memory_task"]["threshold"]["test_accuracy"]["min"] = mark
    course = course_copy(tmp_path / "course", lower)
    source = course / "assignments" / LAB / f"{LAB}.ipynb"
    said = [m for cell in nbformat.read(source, as_version=4).cells for m in MARKED.finditer(cell.source)]
    assert len(said) >= 3 and {m["text"] for m in said if "test_accuracy" in m["key"]} <= {"99%", "0.99", "99"}
    code, lines = checked(course, monkeypatch, capsys, LAB)
    assert code == 1
    assert f"{LAB}: the source notebook says '99%' where course.yaml gives '{percent}' " \
           f"(experiments.memory_task.threshold.test_accuracy.min): run `course sync {LAB}`" in lines, lines
    assert any("the source notebook is out of date in facts" in line for line in lines), lines
    assert any(line.startswith(f"{LAB}: cell ") and f"'99%' where course.yaml gives '{percent}'" in line
               and line.endswith(f"(run `course release {LAB}`)") for line in lines), lines
    assert len(lines) == len(set(lines)), lines  # a cell stating the mark twice is one problem

    assert cli.main(["sync", LAB]) == 0
    code, lines = checked(course, monkeypatch, capsys, LAB)
    assert code == 1 and any(line.startswith(f"{LAB}: the release is older than the source notebook (facts, ")
                             for line in lines), lines
    assert cli.main(["release", LAB]) == 0
    capsys.readouterr()
    for path in (source, course / "release" / LAB / f"{LAB}.ipynb"):
        cells = nbformat.read(path, as_version=4).cells
        text = "\n".join(cell.source for cell in cells)
        assert f"PASS_MARK = {mark}" in text and "0.99" not in text and "99%" not in text, path
        stated = [m["text"] for cell in cells for m in MARKED.finditer(cell.source) if "test_accuracy.min" in m["key"]]
        assert stated and set(stated) <= {percent, str(mark)}, (path, stated)
    code, lines = checked(course, monkeypatch, capsys, LAB)
    assert code == 0 and lines == [f"{LAB}: ok"], lines


# --- the slower stages: planted mistakes, mutations, seeds ---------------------------------------------------------

def test_a_planted_mistake_that_costs_points_on_an_item_it_does_not_feed_is_named(tmp_path, monkeypatch, capsys):
    course = course_copy(tmp_path / "course", lambda raw: None)
    (course / "tests" / "planted").mkdir(parents=True)
    (course / "tests" / "planted" / f"{LAB}.py").write_text(
        '"""One planted mistake: a stray global in PositionalEncoding\'s cell shadows the `math` that '
        'scaled_dot_product_attention, an item it does not feed, uses."""\n'
        'PLANTED = {"PositionalEncoding": {"wrong": {"stray_global": ("class PositionalEncoding", '
        '"math = None\\n\\n\\nclass PositionalEncoding")}, "right": {}}}\n')
    code, lines = checked(course, monkeypatch, capsys, LAB, "--planted")
    assert code == 1
    assert f"{LAB}: planted mistake 'PositionalEncoding/stray_global' costs points on "  \
           f"'scaled_dot_product_attention', which does not use 'PositionalEncoding'" in lines, lines
    assert f"{LAB}: tests/planted/{LAB}.py: 'EncoderBlock' needs two planted mistakes " \
           f"(PLANTED['EncoderBlock']['wrong'])" in lines, lines
    assert f"{LAB}: tests/planted/{LAB}.py: graded experiments without a planted training failure: " \
           f"['memory_task']" in lines, lines  # the same rule, in the same words, as tests/test_grading.py's
    assert not [line for line in lines if "keeps full marks" in line], lines  # its own item uses math too


def test_a_check_that_no_mutation_of_the_reference_fails_is_named(monkeypatch):
    from autograder.apps.check_deep import mutation_problems
    from autograder.grading.suite_files import suite_checks
    assignment, item = load_course().assignment(LAB), "make_memory_dataset"
    said = f"{LAB}: '{item}: properties' fails for none of the 4 mutations"
    assert not [p for p in mutation_problems(LAB, assignment, 4, items=[item]) if p.startswith(said)]
    module, checks = suite_checks(LAB)
    for name in checks[(item, "properties")]:  # the check made a no-op, as a careless edit of the suite would
        def does_nothing(student, rng):
            pass
        does_nothing.pytestmark = getattr(module, name).pytestmark
        monkeypatch.setattr(module, name, does_nothing)
    problems = mutation_problems(LAB, assignment, 4, items=[item])
    assert [p for p in problems if p.startswith(said)], problems


def test_a_threshold_cleared_by_less_than_the_minimum_margin_is_named(tmp_path, monkeypatch, capsys):
    def demanding(raw):
        raw["experiments"]["min_margin"] = 0.5
    code, lines = checked(course_copy(tmp_path / "course", demanding), monkeypatch, capsys, LAB, "--seeds", "1")
    assert code == 1 and len(lines) == 1, lines
    assert re.fullmatch(rf"{LAB}: experiment 'memory_task': the reference's test_accuracy is 0\.99\d* on seed 0, "
                        r"\+0\.0\d+ from its bound \(>= 0\.99\); course\.yaml asks at least 0\.5 "
                        r"\(experiments\.min_margin\)|.* is 1 on seed 0, \+0\.01 from .*", lines[0]), lines


def test_course_experiments_shows_every_seed_and_names_one_the_reference_misses(tmp_path, monkeypatch, capsys):
    def tiny(raw):  # 20 steps: test accuracy about 0.51 on seed 0 and 0.48 on seed 1, so a bar at 0.5 splits them
        lab(raw)["experiments"]["memory_task"].update(steps=20, threshold={"test_accuracy": {"max": 0.5}})
    monkeypatch.setenv("COURSE_ROOT", str(course_copy(tmp_path / "course", tiny)))
    code = cli.main(["experiments", LAB])
    out, err = capsys.readouterr()
    rows = [line for line in out.splitlines() if line.startswith(f"{LAB}.memory_task")]
    assert [re.search(r"seed (\d)\] (ok|MISSED)", row).groups() for row in rows] == [("0", "MISSED"), ("1", "ok")], out
    assert code == 1 and f"error: {LAB}.memory_task: the reference misses on seed 0 (test_accuracy = " in err, err
    assert f"`course check {LAB} --seeds N`" in err and "seed 1" not in err, err
