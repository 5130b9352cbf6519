"""Batches: results saved as each submission finishes, a killed batch resumes to the same results, any order,
any number of workers; one bad submission never stops the rest."""
import json
import os
import signal
import subprocess
import sys
import time

import nbformat
import pytest

from autograder.batch import find_submissions, grade_batch
from autograder.examples import release_notebook, solved_sources, with_cells
from tests.test_grading import planted, variant_source

pytestmark = pytest.mark.grading
AID = "lab14_transformers"
ITEMS = "scaled_dot_product_attention,PositionalEncoding,make_memory_dataset"


def make_batch(folder, n=14):
    """At least n submissions: complete, empty, each planted mistake of the graded items (11), a broken file,
    and correct variants up to n."""
    subs = [("complete", with_cells(release_notebook(AID), solved_sources(AID))), ("empty", release_notebook(AID))]
    for item in ITEMS.split(","):
        for name, variant in planted(AID)[item]["wrong"].items():
            sources = solved_sources(AID)
            sources[item] = variant_source(AID, item, variant)
            subs.append((f"{item}-{name}", with_cells(release_notebook(AID), sources)))
    k = 0
    while len(subs) < n - 1:
        sources = solved_sources(AID)
        sources["make_memory_dataset"] = sources["make_memory_dataset"].replace("seed=0", f"seed={k}", 1)
        subs.append((f"variant{k}", with_cells(release_notebook(AID), sources)))
        k += 1
    for name, nb in subs:
        (folder / name).mkdir(parents=True)
        nbformat.write(nb, folder / name / f"{AID}.ipynb")
    (folder / "not_a_notebook").mkdir()
    (folder / "not_a_notebook" / f"{AID}.ipynb").write_text("{ this is not json")
    (folder / "empty_folder").mkdir()
    return folder


def stable(results):
    """A results file without its wall-clock fields (audit data that differs run to run by nature)."""
    def strip(r):
        r = json.loads(json.dumps(r))
        r.get("extra_data", {}).pop("seconds", None)
        for t in r.get("tests", []):
            t.pop("seconds", None)
        return r
    return [strip(r) for r in results]


def course_grade(args, **popen):
    return subprocess.Popen([sys.executable, "-m", "autograder.cli", "grade", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


@pytest.mark.slow
def test_killed_batch_resumes_to_the_same_results_as_an_uninterrupted_run(tmp_path):
    subs = make_batch(tmp_path / "subs")
    assert len(find_submissions([subs], AID)) == 14
    common = [str(subs), "-a", AID, "--items", ITEMS, "--device", "cpu"]

    whole = course_grade(common + ["--results-dir", str(tmp_path / "r1"), "--json", str(tmp_path / "whole.json")])
    out, err = whole.communicate(timeout=1800)
    assert whole.returncode == 0, err[-2000:]

    run = course_grade(common + ["--results-dir", str(tmp_path / "r2"), "--workers", "2"], start_new_session=True)
    deadline = time.monotonic() + 900
    while len(list((tmp_path / "r2").glob("*.json"))) < 6 and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.2)
    os.killpg(run.pid, signal.SIGKILL)  # halfway, mid-submission: no cleanup runs
    run.wait()
    done_before = {p.name: p.read_text() for p in (tmp_path / "r2").glob("*.json")}
    assert 0 < len(done_before) < 14, "the batch should have been stopped halfway"

    again = course_grade(common + ["--results-dir", str(tmp_path / "r2"), "--workers", "2",
                                   "--json", str(tmp_path / "resumed.json")])
    out, err = again.communicate(timeout=1800)
    assert again.returncode == 0, err[-2000:]
    for name, text in done_before.items():  # earlier results are kept as they were, not regraded
        assert (tmp_path / "r2" / name).read_text() == text
    graded_again = [line for line in err.splitlines() if line.startswith("[")]
    assert len(graded_again) == 14

    whole_results = json.loads((tmp_path / "whole.json").read_text())
    resumed_results = json.loads((tmp_path / "resumed.json").read_text())
    assert stable(resumed_results) == stable(whole_results)
    by_name = {r["submission"]: r for r in whole_results}
    assert by_name["complete"]["score"] == by_name["complete"]["max_score"] > 0
    assert by_name["empty"]["score"] == 0
    assert by_name["not_a_notebook"]["score"] == 0 and "not a readable notebook" in by_name["not_a_notebook"]["output"]
    assert "not_a_notebook" in out  # the table lists every submission, broken ones included


@pytest.mark.slow
def test_scores_do_not_depend_on_order_workers_or_repetition(tmp_path):
    subs = find_submissions([make_batch(tmp_path / "subs", n=8)], AID)
    items = ITEMS.split(",")
    first = dict(grade_batch(subs, AID, items=items, device="cpu", workers=1))
    again = dict(grade_batch(subs[::-1], AID, items=items, device="cpu", workers=2))  # worker processes, reversed
    assert stable([again[n] for n, _ in subs]) == stable([first[n] for n, _ in subs])
    name, path = subs[0]
    from autograder.grade import grade_notebook
    scores = {grade_notebook(path, AID, items=items, device="cpu")["score"] for _ in range(3)}
    assert scores == {first[name]["score"]}


def test_a_grader_failure_is_reported_as_such_and_retried_not_scored_zero(tmp_path, monkeypatch):
    """When the sandbox cannot start (the machine's fault), nobody gets a zero: the result says the grader
    failed, nothing is saved, and the next run grades the submission."""
    import autograder.pytest_plugin
    from autograder.sandbox import SandboxFailure
    subs = [(n, p) for n, p in find_submissions([make_batch(tmp_path / "subs", n=3)], AID) if n == "complete"]
    real_start = autograder.pytest_plugin.Sandbox.start

    def broken(self):
        raise SandboxFailure("sandbox", "could not enter the sandbox: (simulated)")
    monkeypatch.setattr(autograder.pytest_plugin.Sandbox, "start", broken)
    [(name, result)] = grade_batch(subs, AID, items=ITEMS.split(","), device="cpu", results_dir=tmp_path / "r")
    assert result["extra_data"]["grader_error"] and "sandbox could not be started" in result["output"]
    assert not list((tmp_path / "r").glob("*.json")), "a grader failure must not be kept as a result"

    monkeypatch.setattr(autograder.pytest_plugin.Sandbox, "start", real_start)
    [(name, result)] = grade_batch(subs, AID, items=ITEMS.split(","), device="cpu", results_dir=tmp_path / "r")
    assert result["score"] == result["max_score"] > 0 and (tmp_path / "r" / f"{name}.json").exists()
