"""Batches: results saved as each submission finishes, a killed batch resumes to the same results, any order,
any number of workers; one bad submission never stops the rest; a saved result is reused only for the same
grading, and every submission has a name of its own."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from autograder.batch.run import grade_batch
from autograder.batch.submissions import find_submissions
from autograder.cli import main
from autograder.course.config import ROOT, load_course
from autograder.notebooks.examples import release_notebook, solved_sources, with_cells
from tests.planted import planted, variant_source

pytestmark = pytest.mark.grading
AID = "lab14_transformers"
ITEMS = "scaled_dot_product_attention,PositionalEncoding,make_memory_dataset"
SDPA = "scaled_dot_product_attention"  # the cheapest item to grade: no experiment
PROGRESS = re.compile(r"^\[\d+/\d+\] (.+): \S+/\S+(?: \((reused|merged)\))? \(\d+ s\)$")


def make_batch(folder, n=14):
    """n submissions: complete, empty, planted mistakes of the graded items (as many as fit), a broken file, and
    correct variants up to n."""
    subs = [("complete", with_cells(release_notebook(AID), solved_sources(AID))), ("empty", release_notebook(AID))]
    mistakes = [(item, name, variant) for item in ITEMS.split(",")
                for name, variant in planted(AID)[item]["wrong"].items()]
    for item, name, variant in mistakes[:n - 3]:
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
    """A results file without its wall-clock fields (audit data that differs run to run by nature) and the results
    folder's own bookkeeping (extra_data.grading: written only with --results-dir)."""
    def strip(r):
        r = json.loads(json.dumps(r))
        r.get("extra_data", {}).pop("seconds", None)
        r.get("extra_data", {}).pop("grading", None)
        for t in r.get("tests", []):
            t.pop("seconds", None)
        return r
    return [strip(r) for r in results]


def course_grade(args, **popen):
    return subprocess.Popen([sys.executable, "-m", "autograder.cli", "grade", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


@pytest.mark.slow
def test_killed_batch_resumes_to_the_same_results_as_an_uninterrupted_run(tmp_path):
    """The whole batch graded by one worker in order, and again by two workers killed halfway and resumed: the
    same results, so neither the order, the number of workers nor grading a submission again moves a score."""
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
    progress = [PROGRESS.match(line) for line in err.splitlines() if line.startswith("[")]
    assert len(progress) == 14 and all(progress), err[-2000:]
    reused = {m.group(1) for m in progress if m.group(2) == "reused"}
    assert reused == {name[:-len(".json")] for name in done_before}  # what was saved is reused, the rest graded
    marked = [name for name, cells in table_rows(out) if cells[-1] == "reused"]  # the table says which
    assert len(marked) == len(reused) and all(any(r.startswith(m.rstrip("~")) for r in reused) for m in marked)

    whole_results = json.loads((tmp_path / "whole.json").read_text())
    resumed_results = json.loads((tmp_path / "resumed.json").read_text())
    assert stable(resumed_results) == stable(whole_results)
    by_name = {r["submission"]: r for r in whole_results}
    assert by_name["complete"]["score"] == by_name["complete"]["max_score"] > 0
    assert by_name["empty"]["score"] == 0
    assert by_name["not_a_notebook"]["score"] == 0 and "not a readable notebook" in by_name["not_a_notebook"]["output"]
    assert "not_a_notebook" in out  # the table lists every submission, broken ones included


def test_a_grader_failure_is_reported_as_such_and_retried_not_scored_zero(tmp_path, monkeypatch):
    """When the sandbox cannot start (the machine's fault), nobody gets a zero: the result says the grader
    failed, nothing is saved, and the next run grades the submission."""
    import autograder.grading.plugin
    from autograder.sandbox.grader_side import SandboxFailure
    subs = [(n, p) for n, p in find_submissions([make_batch(tmp_path / "subs", n=3)], AID) if n == "complete"]
    real_start = autograder.grading.plugin.Sandbox.start

    def broken(self):
        raise SandboxFailure("sandbox", "could not enter the sandbox: (simulated)")
    monkeypatch.setattr(autograder.grading.plugin.Sandbox, "start", broken)
    [(name, result)] = grade_batch(subs, AID, items=ITEMS.split(","), device="cpu", results_dir=tmp_path / "r")
    assert result["extra_data"]["grader_error"] and "sandbox could not be started" in result["output"]
    assert not list((tmp_path / "r").glob("*.json")), "a grader failure must not be kept as a result"

    monkeypatch.setattr(autograder.grading.plugin.Sandbox, "start", real_start)
    [(name, result)] = grade_batch(subs, AID, items=ITEMS.split(","), device="cpu", results_dir=tmp_path / "r")
    assert result["score"] == result["max_score"] > 0 and (tmp_path / "r" / f"{name}.json").exists()


def table_rows(out):
    """[(submission, its cells)] from `course grade`'s table (one block of columns: a few items)."""
    lines = out.split("\n\n", 2)[1].splitlines()
    assert lines[0].startswith("submission") and set(lines[1]) == {"-"}, out[:500]
    return [(line.split()[0], line.split()[1:]) for line in lines[2:]]


def notebook(path, solved=()):
    """A lab14 submission at path with `solved` items written (the reference's code), the others left as stubs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(with_cells(release_notebook(AID), solved_sources(AID, list(solved)) if solved else {}), path)
    return path


def graded(subs, items, results_dir, aid=AID):
    """[(result, how)] of grade_batch on CPU, how: graded, reused or merged."""
    how = {}
    rows = grade_batch(subs, aid, items=items, device="cpu", results_dir=results_dir,
                       progress=lambda done, total, name, result, got: how.__setitem__(name, got))
    return [(result, how[name]) for name, result in rows]


def points(item, aid=AID):
    return load_course().assignment(aid).item_points(item)


def test_a_full_run_never_reuses_a_partial_result_and_an_items_run_regrades_into_the_full_one(tmp_path):
    assignment = load_course().assignment(AID)
    subs, r = [("alice", notebook(tmp_path / "alice.ipynb", [SDPA]))], tmp_path / "r"
    [(partial, how)] = graded(subs, [SDPA], r)
    assert (partial["score"], partial["max_score"], how) == (points(SDPA), points(SDPA), "graded")

    [(full, how)] = graded(subs, None, r)
    assert how == "graded" and {t["item"] for t in full["tests"]} == set(assignment.items)
    assert (full["score"], full["max_score"]) == (points(SDPA), assignment.total_points)
    [(again, how)] = graded(subs, None, r)
    assert how == "reused" and again == full

    # an item lost to something outside the submission (a busy machine's time limit): `--items` regrades it
    saved = json.loads((r / "alice.json").read_text())
    for test in saved["tests"]:
        if test["item"] == SDPA:
            saved["score"] -= test["score"]
            test["score"], test["output"] = 0.0, "did not finish within 60 s (time limit)"
    (r / "alice.json").write_text(json.dumps(saved))
    [(fixed, how)] = graded(subs, [SDPA], r)
    assert how == "merged" and (fixed["score"], fixed["max_score"]) == (points(SDPA), assignment.total_points)
    assert [t for t in fixed["tests"] if t["item"] != SDPA] == [t for t in saved["tests"] if t["item"] != SDPA]
    assert json.loads((r / "alice.json").read_text()) == fixed
    [(again, how)] = graded(subs, None, r)  # still a full result of this notebook: a full run takes it
    assert how == "reused" and again == fixed


def test_a_results_folder_reused_for_another_assignment_grades_again(tmp_path):
    w8l1 = "w8l1_attention_vision"
    w8_nb = tmp_path / w8l1 / "complete" / f"{w8l1}.ipynb"
    w8_nb.parent.mkdir(parents=True)
    nbformat.write(with_cells(release_notebook(w8l1), solved_sources(w8l1, ["score_dot"])), w8_nb)
    notebook(tmp_path / AID / "complete" / f"{AID}.ipynb", [SDPA])
    r = tmp_path / "graded"
    [(w8, _)] = graded(find_submissions([tmp_path / w8l1], w8l1), ["score_dot"], r, aid=w8l1)
    [(lab, how)] = graded(find_submissions([tmp_path / AID], AID), [SDPA], r)
    assert w8["score"] == points("score_dot", w8l1) and w8["extra_data"]["assignment"] == w8l1
    assert how == "graded" and lab["extra_data"]["assignment"] == AID
    assert {t["item"] for t in lab["tests"]} == {SDPA} and lab["score"] == points(SDPA)

    # docs/TA.md's layout, one folder per assignment: `course report graded/` has a section for each
    for aid, result in ((w8l1, w8), (AID, lab)):
        (r / aid).mkdir()
        (r / aid / "complete.json").write_text(json.dumps(result))
    (r / "complete.json").unlink()
    assert main(["report", str(r), "-o", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    assert [part.split("</h2>")[0] for part in page.split("<h2>")[1:]] == [AID, w8l1]


def test_two_sections_with_an_alice_each_are_graded_and_shown_apart(tmp_path, capsys):
    sec_a, sec_b = tmp_path / "secA", tmp_path / "secB"
    notebook(sec_a / "alice" / f"{AID}.ipynb", [SDPA])
    notebook(sec_b / "alice" / f"{AID}.ipynb")  # an empty notebook
    r = tmp_path / "r"
    [(a, _)] = graded(find_submissions([sec_a], AID), [SDPA], r)  # two runs, one folder: each alice her own score
    [(b, how)] = graded(find_submissions([sec_b], AID), [SDPA], r)
    assert a["score"] == points(SDPA) and (b["score"], how) == (0, "graded")

    args = ["grade", str(sec_a), str(sec_b), "-a", AID, "--items", SDPA, "--device", "cpu", "--results-dir", str(r)]
    assert main(args) == 0
    rows = dict(table_rows(capsys.readouterr().out))
    assert rows == {"secA/alice": [f"{points(SDPA):g}", f"{points(SDPA):g}/{points(SDPA):g}"],
                    "secB/alice": ["0", f"0/{points(SDPA):g}"]}
    assert (r / "secA" / "alice.json").exists() and (r / "secB" / "alice.json").exists()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert {name: cells[-1] for name, cells in table_rows(out)} == {"secA/alice": "reused",
                                                                           "secB/alice": "reused"}
    assert "0 graded, 2 reused, 0 rescored, 0 merged" in out


def test_a_notebook_graded_from_its_own_folder_is_named_after_it(tmp_path, monkeypatch):
    bob = notebook(tmp_path / "bob" / f"{AID}.ipynb", [SDPA])
    carol = notebook(tmp_path / "carol" / f"{AID}.ipynb")  # an empty notebook
    out = tmp_path / "out"
    monkeypatch.chdir(bob.parent)
    assert find_submissions([f"{AID}.ipynb"], AID) == [("bob", Path(f"{AID}.ipynb"))]
    assert find_submissions(["."], AID) == [("bob", Path(".") / f"{AID}.ipynb")]
    [(b, _)] = graded(find_submissions([f"{AID}.ipynb"], AID), [SDPA], out)
    monkeypatch.chdir(carol.parent)
    [(c, how)] = graded(find_submissions([f"{AID}.ipynb"], AID), [SDPA], out)
    assert b["score"] == points(SDPA) and (c["score"], how) == (0, "graded")
    assert sorted(p.name for p in out.glob("*.json")) == ["bob.json", "carol.json"]


def test_names_are_unique_and_tell_apart_what_was_found_twice(tmp_path):
    for folder in ("2024/secA/alice", "2025/secA/alice", "secB/bob"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / f"{AID}.ipynb").write_text("{}")
    (tmp_path / "secB" / "bob" / "draft.ipynb").write_text("{}")  # two notebooks in one student's folder
    names = [name for name, _ in find_submissions([tmp_path / "2024/secA", tmp_path / "2025/secA", tmp_path / "secB"],
                                                            AID)]
    assert names == ["2024/secA/alice", "2025/secA/alice", "bob", "bob~2"]


W8L4 = "w8l4_transformers"


def released(path, aid):
    """`aid`'s notebook as released (nothing done) at path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(release_notebook(aid), path)


def test_a_folder_holding_two_assignments_gives_each_only_its_own_notebooks(tmp_path):
    """nbgrader's submitted/<student>/<assignment>/ once the class has submitted two assignments (alice both, bob
    lab14 only, carol lab14's notebook in w8l4's folder), and a folder of notebooks per student (dave's holds
    both): each assignment gets its own notebooks, under the student's name, and the rest is said, never graded."""
    sub, flat = tmp_path / "submitted", tmp_path / "flat"
    notebook(sub / "alice" / AID / f"{AID}.ipynb")
    released(sub / "alice" / W8L4 / f"{W8L4}.ipynb", W8L4)
    notebook(sub / "bob" / AID / f"{AID}.ipynb")
    notebook(sub / "carol" / W8L4 / f"{W8L4}.ipynb")  # the wrong notebook, under this assignment's name
    notebook(flat / "dave" / f"{AID}.ipynb")
    released(flat / "dave" / f"{W8L4}.ipynb", W8L4)
    said = []
    assert find_submissions([sub], AID, say=said.append) == [("alice", sub / "alice" / AID / f"{AID}.ipynb"),
                                                             ("bob", sub / "bob" / AID / f"{AID}.ipynb")]
    assert said == [f"not graded as {AID}: 2 notebooks in {W8L4}'s folder: {sub / 'alice' / W8L4 / W8L4}.ipynb, "
                    f"{sub / 'carol' / W8L4 / W8L4}.ipynb"]
    said.clear()
    assert find_submissions([sub], W8L4, say=said.append) == [("alice", sub / "alice" / W8L4 / f"{W8L4}.ipynb")]
    assert said == [f"not graded as {W8L4}: 2 notebooks in {AID}'s folder: {sub / 'alice' / AID / AID}.ipynb, "
                    f"{sub / 'bob' / AID / AID}.ipynb",
                    f"not graded as {W8L4}: 1 notebook whose cells are {AID}'s: {sub / 'carol' / W8L4 / W8L4}.ipynb"]
    assert find_submissions([sub / "alice"], W8L4) == [("alice", sub / "alice" / W8L4 / f"{W8L4}.ipynb")]
    for aid in (AID, W8L4):
        assert find_submissions([flat], aid) == [("dave", flat / "dave" / f"{aid}.ipynb")]


def test_a_notebook_whose_grade_ids_are_not_names_is_found_and_does_not_stop_the_others(tmp_path):
    """A cell's nbgrader grade_id that is a list or a dict (an editor's or a student's doing) says nothing of whose
    the notebook is: it is graded as the assignment asked for, as a stripped one is, and the folder's other
    notebooks are found too (it once raised TypeError: unhashable, for the whole batch)."""
    sub = tmp_path / "submitted"
    notebook(sub / "alice" / f"{AID}.ipynb")
    odd = nbformat.read(sub / "alice" / f"{AID}.ipynb", as_version=4)
    odd.cells[0].metadata["nbgrader"] = {"grade_id": ["scaled_dot_product_attention"]}
    odd.cells[1].metadata["nbgrader"] = {"grade_id": {"id": W8L4}}
    (sub / "bob").mkdir()
    nbformat.write(odd, sub / "bob" / f"{AID}.ipynb")
    assert find_submissions([sub], AID) == [("alice", sub / "alice" / f"{AID}.ipynb"),
                                            ("bob", sub / "bob" / f"{AID}.ipynb")]


def test_course_grade_of_a_folder_holding_two_assignments_grades_each_student_once(tmp_path, capsys):
    sub = tmp_path / "submitted"
    notebook(sub / "alice" / AID / f"{AID}.ipynb", [SDPA])
    released(sub / "alice" / W8L4 / f"{W8L4}.ipynb", W8L4)
    notebook(sub / "bob" / AID / f"{AID}.ipynb")
    assert main(["grade", str(sub), "-a", AID, "--items", SDPA, "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert dict(table_rows(out)) == {"alice": [f"{points(SDPA):g}", f"{points(SDPA):g}/{points(SDPA):g}"],
                                     "bob": ["0", f"0/{points(SDPA):g}"]}
    assert f"not graded as {AID}: 1 notebook in {W8L4}'s folder: {sub / 'alice' / W8L4 / W8L4}.ipynb" in err, err


# `course grade` as a TA runs it, then which modules the coordinator (this process) had loaded. Guarded by
# __main__, as a TA's script would be (the batch's spawned workers do not run it).
MODULES_PROBE = r'''
import json, sys
if __name__ == "__main__":
    from autograder.cli import main
    rc = main(sys.argv[1:])
    print(json.dumps({m: m in sys.modules for m in ("torch", "pytest", "autograder.grading.plugin")}))
    sys.exit(rc)
'''


def test_the_coordinator_of_a_batch_imports_no_torch_and_its_workers_compute_the_grader_identity(tmp_path):
    """With --workers 2 the process that only dispatches imports neither torch nor pytest nor the grader (the
    workers grade, and compute the grader identity a results folder needs: the same as this process's)."""
    from autograder.batch.identity import grader_identity
    for k in range(2):
        folder = tmp_path / "subs" / f"s{k}"
        folder.mkdir(parents=True)
        nbformat.write(with_cells(release_notebook(AID), solved_sources(AID)), folder / f"{AID}.ipynb")
    probe = tmp_path / "probe.py"
    probe.write_text(MODULES_PROBE)
    run = subprocess.run([sys.executable, str(probe), "grade", str(tmp_path / "subs"), "-a", AID, "--items", SDPA,
                          "--device", "cpu", "--workers", "2", "--results-dir", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"torch": False, "pytest": False,
                                                              "autograder.grading.plugin": False}
    saved = [json.loads((tmp_path / "r" / f"s{k}.json").read_text()) for k in range(2)]
    assert [r["score"] for r in saved] == [r["max_score"] for r in saved]
    assert {r["extra_data"]["grading"]["grader"] for r in saved} == {grader_identity(AID, "cpu")}


# A coordinator's main module with work of its own at the top (as `nbgrader`'s imports its whole app): each run of
# it leaves a line in MARKS.
HEAVY_MAIN = r'''
import os, sys
with open(os.environ["MARKS"], "a") as marks:
    marks.write(f"{os.getpid()}\n")
if __name__ == "__main__":
    from autograder.batch.run import worker_pool
    with worker_pool(2, "cpu") as pool:  # both workers start at once, and have ended when it closes
        print(pool.executor.submit(os.getpid).result() != os.getpid())
'''


def test_a_pools_workers_do_not_run_the_coordinators_main_module(tmp_path):
    """A spawned process runs its parent's __main__ first; a pool worker does not (worker.spawn_context): only the
    coordinator left its mark."""
    script, marks = tmp_path / "coordinator.py", tmp_path / "marks"
    script.write_text(HEAVY_MAIN)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "MARKS": str(marks)})
    assert run.returncode == 0 and run.stdout.split() == ["True"], run.stderr[-3000:]
    assert len(marks.read_text().split()) == 1, f"the main module ran in {marks.read_text().split()}"


ZYGOTE_PROBE = r'''
import os
from autograder.course.config import load_course
from autograder.sandbox.grader_side import Sandbox
from autograder.sandbox.zygote import CHILD, ZYGOTE


def zygote_of(pid):
    """The zygote a sandbox forked from: its oldest ancestor running child/__main__.py (its monitor is a fork too)."""
    found = None
    while pid > 1:
        if str(CHILD).encode() in open(f"/proc/{pid}/cmdline", "rb").read():
            found = pid
        pid = int(next(l for l in open(f"/proc/{pid}/status") if l.startswith("PPid:")).split()[1])
    return found


def zygote_here():
    """(this worker's pid, whether its sandboxes fork from another process's zygote, the zygote of a sandbox it
    starts)."""
    with Sandbox([], {}, load_course().limits) as sb:
        return os.getpid(), ZYGOTE.shared, zygote_of(sb.proc)
'''
SHARED_ZYGOTE = r'''
import os
from autograder.batch.run import worker_pool
from autograder.sandbox.zygote import ZYGOTE
import zygote_probe

def each_worker(pool):
    seen = {}
    for _ in range(40):  # until both workers have answered
        worker, shared, zygote = pool.executor.submit(zygote_probe.zygote_here).result()
        seen[worker] = (shared, zygote)
        if len(seen) == 2:
            return seen
    raise SystemExit("one worker took every task")

if __name__ == "__main__":
    with worker_pool(2, "cpu") as pool:
        print(ZYGOTE.proc.pid, sorted(set(each_worker(pool).values())))
        ZYGOTE.proc.kill()  # the coordinator's zygote dies: each worker starts one of its own
        ZYGOTE.proc.wait()
        print(sorted(set(each_worker(pool).values())))
'''


def test_a_pools_workers_fork_their_sandboxes_from_the_coordinators_zygote(tmp_path):
    """One zygote for the pool (its imports, 2.5 s of CPU, paid once, not once per worker): both workers' sandboxes
    fork from the coordinator's; when it dies, each worker's next sandbox comes from a zygote of the worker's own."""
    (tmp_path / "zygote_probe.py").write_text(ZYGOTE_PROBE)
    (tmp_path / "coordinator.py").write_text(SHARED_ZYGOTE)
    run = subprocess.run([sys.executable, str(tmp_path / "coordinator.py")], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    assert run.returncode == 0, run.stderr[-3000:]
    first, after = run.stdout.splitlines()
    zygote, shared = first.split(" ", 1)
    assert shared == f"[(True, {zygote})]", f"the coordinator's zygote is {zygote}; the workers used {shared}"
    owns = eval(after)  # noqa: S307 -- our own script's printed list
    assert len(owns) == 2 and all(not shared and pid != int(zygote) for shared, pid in owns), after


def test_a_process_that_grades_under_two_course_files_has_the_identity_of_each(tmp_path, monkeypatch):
    """The grader identity a process keeps (identity_here: a worker grades many) is the course's it grades under:
    switching COURSE_CONFIG in the same process (a test, a long-lived worker) gives the other course's identity,
    the one a fresh process computes, not the first one's (a rerun would regrade what it should reuse)."""
    from autograder.batch.identity import grader_identity, identity_here
    first = identity_here(AID, "cpu")
    other = tmp_path / "course.yaml"
    other.write_text(Path(load_course().path).read_text().replace("\nseed: ", "\nseed: 1", 1))  # 8128 -> 18128
    monkeypatch.setenv("COURSE_CONFIG", str(other))
    assert load_course().seed == 18128
    assert identity_here(AID, "cpu") == grader_identity(AID, "cpu") != first


@pytest.mark.slow
@pytest.mark.experiment
def test_a_notebook_gets_the_same_points_with_one_and_with_two_threads(tmp_path, monkeypatch):
    """However many cores a machine gives each sandbox (the threads of --workers), a grade does not move: the
    complete notebook, its experiment trained afresh at 1 and at 2 threads, scores the same in every test."""
    from autograder.grading.grade import grade_notebook
    monkeypatch.setenv("COURSE_NO_CACHE", "1")  # both train: the cache would hand one the other's run
    notebook = tmp_path / f"{AID}.ipynb"
    nbformat.write(with_cells(release_notebook(AID), solved_sources(AID)), notebook)
    runs = {threads: grade_notebook(notebook, AID, device="cpu", threads=threads) for threads in (2, 1)}
    points = {threads: [(t["name"], t["score"]) for t in r["tests"]] for threads, r in runs.items()}
    assert points[1] == points[2]
    assert runs[1]["score"] == runs[2]["score"] == runs[1]["max_score"] > 0
    trained = {threads: [t for t in r["tests"] if t["item"] == "TransformerClassifier" and "memory_task" in t["name"]]
               for threads, r in runs.items()}
    assert all(trained.values()), "the experiment's test is in both results"
