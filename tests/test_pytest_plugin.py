"""A hidden suite is a pytest suite: the TA's pytest command and `course grade` give the same results, pytest's
own options work on it, and a broken suite fails the session instead of scoring anyone."""
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.course.config import ROOT, load_course
from autograder.grading.plugin import GRADER_FAILED, GRADING, Grading, Settings, grading_of
from autograder.grading.scoring import Outcome, results_json
from autograder.grading.suite_files import suite_path
from autograder.notebooks.examples import write_examples

pytest_plugins = ["pytester"]
AID = "lab14_transformers"
SUITE = str(suite_path(AID).relative_to(ROOT))
RESULT = dict(aid=AID, notebook="x.ipynb", device="cpu", seed=0, output="", isolation="uid", restarts=0,
              seconds=1.0, notes=[])


# --- the plugin's own parts, no sandbox --------------------------------------------------------------

def test_settings_and_results_json_take_keywords_only():
    with pytest.raises(TypeError):
        Settings(Path("x.ipynb"), AID)
    with pytest.raises(TypeError):
        results_json([], AID, "x.ipynb", "cpu", 0, "", "uid", 0, 1.0, [])
    assert Settings(submission=Path("x.ipynb"), assignment=AID).device == "auto"


def test_a_gradings_state_exists_before_its_suite_is_collected():
    grading = Grading(Settings(submission=Path("x.ipynb")))
    assert (grading.course, grading.assignment, grading.aid, grading.device, grading.code) == (None,) * 5
    assert grading.wanted == [] and grading.notes == [] and grading.results is None


def test_the_session_is_kept_in_the_config_stash(pytester, monkeypatch):
    """grade_notebook's Grading and the one --submission makes are both found in config.stash, not by a scan."""
    given = Grading(Settings(submission=Path("x.ipynb")))
    pytester.plugins.append(given)
    config = pytester.parseconfigure("-p", "autograder.grading.plugin")
    monkeypatch.setattr(config.pluginmanager, "get_plugins", lambda: pytest.fail("grading_of scanned the plugins"))
    assert config.stash[GRADING] is given and grading_of(config) is given

    pytester.plugins.remove(given)
    made = pytester.parseconfigure("-p", "autograder.grading.plugin", "--submission", "alice.ipynb",
                                   "--assignment", AID, "--results-json", "out.json", "--no-experiments")
    grading = grading_of(made)
    assert isinstance(grading, Grading) and grading is not given
    assert grading.settings == Settings(submission=Path("alice.ipynb"), assignment=AID, experiments=False,
                                        results_json=Path("out.json"))
    assert grading_of(pytester.parseconfigure("-p", "autograder.grading.plugin")) is None


def test_results_json_reports_the_installed_packages_version(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "9.8.7" if name == "attention-course" else pytest.fail(name))
    result = results_json([Outcome("f", "values", 2)], **RESULT)
    assert result["extra_data"]["versions"]["autograder"] == "9.8.7"
    assert (result["score"], result["max_score"]) == (0, 2.0)


def test_results_json_says_unknown_when_the_package_is_not_installed(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert results_json([], **RESULT)["extra_data"]["versions"]["autograder"] == "unknown"


# --- whole sessions, the sandbox included: the TA's command in a subprocess once (the first test), the other
# sessions in this process (pytester: the same plugin and options, without another interpreter importing torch)


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    return dict(write_examples(AID, tmp_path_factory.mktemp("examples")))


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=900)


def session(pytester, *args):
    """`pytest ARGS` run in this process from pytester's folder: (exit code, stdout, stderr). The warnings left
    out are this process's alone: the modules the plugin would rewrite are imported here already, and the inner
    session leaves pytest-timeout (its `timeout` option unknown then) to the outer one, whose alarm it would reset."""
    done = pytester.runpytest_inprocess(*map(str, args), "-p", "no:cacheprovider", "-p", "no:timeout",
                                        "-o", "addopts=", "-W", "ignore::pytest.PytestAssertRewriteWarning",
                                        "-W", "ignore::pytest.PytestConfigWarning")
    return int(done.ret), done.stdout.str(), done.stderr.str()


def without_timings(result):
    result = json.loads(json.dumps(result))
    result["extra_data"].pop("seconds")
    for test in result["tests"]:
        test.pop("seconds")
    return result


@pytest.mark.grading
@pytest.mark.slow
def test_the_pytest_session_and_course_grade_give_the_same_results(examples, tmp_path, monkeypatch, pytester):
    """For the complete, the untouched release and a half-done notebook (experiments on). The TA's command runs in
    an interpreter of its own for the complete notebook, the one that trains; the other two sessions run in this
    process (`session`: the same plugin, suite and options, without another interpreter importing torch). All
    under COURSE_PROFILE=rehearsal (`course grade` and the TA's pytest inherit it): the experiment trains 5 steps,
    and it is the two paths' agreement that is tested, not its figure (tests/test_reference_*: the full budget)."""
    monkeypatch.setenv("COURSE_PROFILE", "rehearsal")
    folder = tmp_path / "subs"
    for name in ("complete", "empty", "partly_right"):
        (folder / name).mkdir(parents=True)
        (folder / name / f"{AID}.ipynb").write_bytes(examples[name].read_bytes())
    graded = run("-m", "autograder.cli", "grade", str(folder), "-a", AID, "--device", "cpu",
                 "--json", str(tmp_path / "course.json"))
    assert graded.returncode == 0, graded.stderr[-3000:]
    by_course = {r.pop("submission"): r for r in json.loads((tmp_path / "course.json").read_text())}
    for name in ("complete", "empty", "partly_right"):
        out = tmp_path / f"{name}.json"
        options = [SUITE, "--submission", folder / name / f"{AID}.ipynb", "--device", "cpu", "--results-json", out,
                   "-v"]
        if name == "complete":
            ta = run("-m", "pytest", *map(str, options), "-p", "no:cacheprovider", "-o", "addopts=")
            code, stdout = ta.returncode, ta.stdout
        else:
            code, stdout, _ = session(pytester, ROOT / SUITE, *options[1:])
        assert code == (0 if name == "complete" else 1), stdout[-3000:]
        ours = json.loads(out.read_text())
        assert without_timings(ours) == without_timings(by_course[name]), name
        assert f"{AID}: {ours['score']:g} / {ours['max_score']:g} points" in stdout
        # one line per check: every check of course.yaml is a test, the experiment included, and a shapes check two
        # (on the CPU, then on the fake GPU: grading/device_check.py); a node id is relative to the session's folder
        lines = [line for line in stdout.splitlines() if re.match(rf"\S*{re.escape(SUITE)}::", line)]
        assignment = load_course().assignment(AID)
        checks = sum(len(spec.points) for spec in assignment.items.values()) + len(assignment.experiments)
        on_fake_gpu = sum("shapes" in spec.points and spec.device_check for spec in assignment.items.values())
        assert len(ours["tests"]) == checks and len(lines) == checks + on_fake_gpu, stdout[-3000:]
        assert sum("_shapes[fake_cuda] " in line for line in lines) == on_fake_gpu, stdout[-3000:]


@pytest.mark.grading
@pytest.mark.slow
def test_pytest_options_select_stop_and_report(examples, tmp_path, pytester):
    out, junit = tmp_path / "r.json", tmp_path / "junit.xml"
    code, stdout, _ = session(pytester, suite_path(AID), "--submission", examples["partly_right"], "--device", "cpu",
                              "--no-experiments", "-k", "PositionalEncoding", "--results-json", out, "--junitxml",
                              junit, "-v")
    result = json.loads(out.read_text())
    assert {t["item"] for t in result["tests"]} == {"PositionalEncoding"}, result["tests"]
    assert [t["name"].split(": ")[1] for t in result["tests"]] == ["exists", "shapes", "values", "properties"]
    assert stdout.count("PASSED") + stdout.count("FAILED") == 5, stdout[-3000:]  # shapes twice: cpu, meta
    assert 'tests="5"' in junit.read_text()

    code, stdout, _ = session(pytester, suite_path(AID), "--submission", examples["empty"], "--device", "cpu",
                              "--no-experiments", "-x")
    assert code == 1 and "stopping after 1 failures" in stdout, stdout[-3000:]


@pytest.mark.grading
def test_failure_messages_are_the_checkers_never_the_suites_source(examples, tmp_path, pytester):
    out = tmp_path / "r.json"
    _, stdout, _ = session(pytester, suite_path(AID), "--submission", examples["partly_right"], "--device", "cpu",
                           "--no-experiments", "--results-json", out)
    failures = stdout.split("= FAILURES =")[1].split("short test summary")[0]
    assert "max |" in failures  # a checker's message, with the numbers
    for leak in ("def test_", "check_close(", "Traceback", "assert ", str(ROOT)):
        assert leak not in failures, leak
    for test in json.loads(out.read_text())["tests"]:
        assert str(ROOT) not in test["output"] and "Traceback" not in test["output"], test


@pytest.mark.grading
def test_a_suite_that_breaks_fails_the_session_and_scores_nobody(examples, tmp_path, pytester):
    broken = pytester.makepyfile(test_broken_suite="import pytest\n\n\n"
                                 "@pytest.mark.item('scaled_dot_product_attention', 'shapes')\n"
                                 "def test_shapes(student, rng):\n    undefined_helper(student)\n")
    out = tmp_path / "r.json"
    code, stdout, _ = session(pytester, broken, "--submission", examples["complete"], "--assignment", AID,
                              "--device", "cpu", "--no-experiments", "--results-json", out)
    assert code == GRADER_FAILED, stdout[-3000:]
    assert "grader failure: nothing was scored" in stdout and "NameError" in stdout
    assert not out.exists()


@pytest.mark.grading
def test_a_suite_needs_a_submission(pytester):
    code, _, stderr = session(pytester, suite_path(AID))
    assert code == pytest.ExitCode.USAGE_ERROR
    assert "--submission NOTEBOOK" in stderr
