"""Otter-Grader plugin: the course's isolated grader scores the submission; Otter's kernel runs none of its code.

Otter executes a submission in a Jupyter kernel before its tests. `before_execution` grades the submission
file with `grade_notebook` (the sandbox, the hidden suites, the experiments) and hands Otter an empty
notebook to execute instead; `after_grading` replaces whatever Otter measured with those results, one
Otter test per check, so results.json (Gradescope's, or `otter run`'s) carries the grader's scores and
reasons and nothing else. Configured in otter_config.json by `course export gradescope`:

    {"plugins": [{"autograder.integrations.otter_plugin.CourseGrader": {"assignment": "lab14_transformers",
                                                           "budget_seconds": 1080}}]}

The zip's run_otter.py calls `run_autograder`, not Otter's main directly, so that every run leaves a
results.json: an upload that is not one readable notebook of this assignment's gets a message naming the
`<id>.ipynb` to submit (before Otter, which would crash reading it, or grade another assignment's notebook as
this one), a grader failure one saying the staff must regrade, each with the cause in a hidden test; and the
grader's record (isolation level, versions, seeds, timings), which Otter's to_gradescope_dict drops, goes into the
top-level `extra_data` and a hidden test, both kept by Gradescope and shown to the staff only. With
`budget_seconds`, grading starts no item whose worst case would end past it (`grade_within_budget`), so
results.json is written before Gradescope's timeout.
"""
import json
import math
import os
import time
import traceback
from pathlib import Path

import nbformat
from otter.plugins import AbstractOtterPlugin
from otter.test_files.abstract_test import TestCase, TestCaseResult, TestFile

from autograder.errors import ConfigError, GraderError
from autograder.notebooks.cells import read_notebook
from autograder.notebooks.identify import not_of

STAFF_TEST = "Grader record (staff only)"


class CheckResult(TestFile):
    """One check of the course grader (an item's `shapes`, an experiment, ...) as an Otter test file."""

    def __init__(self, test):
        case = TestCase(test["name"], None, hidden=False, points=test["max_score"], success_message=None,
                        failure_message=None)
        super().__init__(test["name"], "", [case], all_or_nothing=False)
        self.test_case_results = [TestCaseResult(case, test["output"], test["score"] >= test["max_score"])]
        self.update_score(test["score"])
        self.output = test["output"]

    def summary(self, public_only=False):
        return self.output

    @classmethod
    def from_file(cls, path):
        raise NotImplementedError("built from the course grader's results, never read from a file")

    @classmethod
    def from_metadata(cls, s, path):
        raise NotImplementedError("built from the course grader's results, never read from metadata")

    def run(self, global_environment):
        raise NotImplementedError("the course grader has already run this check in its sandbox")


class CourseGrader(AbstractOtterPlugin):
    """Grade with the course's isolated grader (plugin config: `assignment`, optional `device`, `budget_seconds`;
    `notebooks`: every assignment's own grade ids, which tell another assignment's notebook)."""

    record = None  # the last grading's extra_data, for run_autograder (Otter's results.json drops it)

    def before_execution(self, submission):
        aid = self.plugin_config["assignment"]
        # run_autograder told Gradescope's uploads already; `otter run -a ZIP NOTEBOOK` comes here directly
        other = another_assignments(self.submission_path, aid, self.plugin_config.get("notebooks"))
        if other:
            self.result = {"tests": [{"name": "Not graded", "score": 0, "max_score": 0, "output": other}],
                           "output": other, "extra_data": {"assignment": aid, "not_graded": "the upload"}}
            type(self).record = self.result["extra_data"]
            return nbformat.v4.new_notebook()
        threads = cgroup_cpus()
        if threads:  # the grader's own torch too: the host's core count is not the container's share
            import torch
            torch.set_num_threads(threads)
        # the zip's course.yaml (its assignment, its `gradescope:` limits), also where `otter run` imports this
        # checkout's package: on Gradescope it is the installed package's own
        zipped = Path(self.submission_path).parent.parent / "source" / "course" / "course.yaml"
        before = os.environ.get("COURSE_CONFIG")
        if zipped.is_file():
            os.environ["COURSE_CONFIG"] = str(zipped)
        try:
            self.result = grade_within_budget(self.submission_path, aid,
                                              self.plugin_config.get("budget_seconds"),
                                              device=self.plugin_config.get("device", "auto"), threads=threads)
        finally:
            os.environ.pop("COURSE_CONFIG", None) if before is None else os.environ.update(COURSE_CONFIG=before)
        type(self).record = staff_record(self.result, threads)
        return nbformat.v4.new_notebook()  # what Otter's kernel executes: nothing of the student's

    def after_grading(self, results):
        results.results = {t["name"]: CheckResult(t) for t in self.result["tests"]}
        results.output = self.result["output"] or None
        results.set_plugin_data(type(self).__name__, self.result["extra_data"])


def staff_record(result, threads):
    """What the staff need to trust a grade, beyond the scores: the grader's extra_data, the CPU threads, each
    item's seconds and each experiment's measured metrics and seed (Otter keeps none of the per-test data)."""
    seconds = {}
    for t in result["tests"]:
        seconds[t["item"]] = round(seconds.get(t["item"], 0) + t.get("seconds", 0), 3)
    experiments = {t["name"]: t["extra_data"] for t in result["tests"] if ": experiment " in t["name"]
                   and t.get("extra_data")}
    return {**result["extra_data"], "threads": threads, "item_seconds": seconds, "experiments": experiments}


def cgroup_cpus():
    """The CPUs the container's quota allows (cgroup v2 cpu.max, v1 cfs quota), rounded up; None without a quota."""
    for quota_file, period_file in (("/sys/fs/cgroup/cpu.max", None),
                                    ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us")):
        try:
            fields = Path(quota_file).read_text().split()
            quota, period = fields[0], fields[1] if period_file is None else Path(period_file).read_text().strip()
        except (OSError, IndexError):
            continue
        if quota in ("max", "-1"):
            return None
        return max(1, min(math.ceil(int(quota) / int(period)), os.cpu_count() or 1))
    return None


def worst_seconds(course, aid, item, limits=None, experiments=True):
    """The longest one item can take: its checks' limit plus every seed of its experiments at their limit."""
    lim = course.limits_for(aid, item).model_copy(update=limits or {})
    exps = course.assignment(aid).experiments_of(item) if experiments else []
    return lim.item_seconds + sum(lim.experiment_seconds * len(e.seeds) for e in exps)


def load_seconds(course, aid, limits=None):
    """The longest the notebook's load can take (sandbox.Sandbox._load_cells's limit, over the cells it loads: the
    release's setup and graded cells)."""
    from autograder.course.config import released_notebook
    from autograder.notebooks.cells import extract
    nb = nbformat.read(released_notebook(aid), as_version=4)
    cells = len(extract(nb, list(course.assignment(aid).items)).cells)
    return course.limits.model_copy(update=limits or {}).setup_seconds * max(1, cells // 4 + 1)


def grade_within_budget(path, aid, budget_seconds=None, device="auto", threads=None, limits=None, experiments=True):
    """grade_notebook, in as few sessions as fit: each starts only the items whose worst case still fits the budget
    (in the assignment's order), so a slow submission is scored on what ran and told why the rest did not."""
    from autograder.course.config import load_course
    from autograder.grading.grade import grade_notebook
    from autograder.grading.scoring import Outcome
    kw = dict(device=device, threads=threads, limits=limits, experiments=experiments)
    if budget_seconds is None:
        return grade_notebook(path, aid, **kw)
    course, t0 = load_course(), time.monotonic()
    load, left, parts, failed = load_seconds(course, aid, limits), list(course.assignment(aid).items), [], set()
    while left:
        room, batch = budget_seconds - (time.monotonic() - t0) - load, []
        for item in left:
            cost = worst_seconds(course, aid, item, limits, experiments)
            if cost <= room:
                batch.append(item)
                room -= cost
        if not batch:
            break
        # an item's failed dependency graded in an earlier session still has its reference stand in (regrade.py)
        parts.append(grade_notebook(path, aid, items=batch, failed_elsewhere=failed, budget_end=t0 + budget_seconds,
                                    **kw))
        failed |= {t["item"] for t in parts[-1]["tests"]
                   if t["score"] < t["max_score"] and not t["name"].split(": ", 1)[1].startswith("experiment")}
        left = [item for item in left if item not in batch]
    skipped = []
    for item in left:
        reason = (f"not run: this item may take up to {worst_seconds(course, aid, item, limits, experiments):g} s, "
                  f"more than was left of the autograder's time budget ({budget_seconds:g} s) once the rest had "
                  f"run (slow or hanging code elsewhere in the notebook uses it up)")
        kinds = [*course.assignment(aid).items[item].points.items(),
                 *((f"experiment {e.name}", e.points) for e in course.assignment(aid).experiments_of(item))]
        for kind, points in kinds:
            outcome = Outcome(item, kind, points)
            outcome.output = reason
            skipped.append(outcome.as_test())
    return merge_results(parts, skipped, course.assignment(aid), time.monotonic() - t0, budget_seconds)


def merge_results(parts, skipped, assignment, seconds, budget_seconds):
    """One results.json from the sessions' (in the assignment's item order) and the items not run."""
    if not parts:
        raise GraderError(f"the time budget ({budget_seconds:g} s) fits not even one item: raise "
                           f"gradescope.budget_seconds or lower gradescope.limits in course.yaml")
    order = {item: i for i, item in enumerate(assignment.items)}
    tests = sorted([t for p in parts for t in p["tests"]] + skipped, key=lambda t: order[t["item"]])
    result = {**parts[0], "tests": tests, "score": round(sum(t["score"] for t in tests), 4),
              "max_score": sum(t["max_score"] for t in tests)}
    outputs = [p["output"] for p in parts if p["output"]]
    result["output"] = "\n".join(dict.fromkeys(outputs))
    notes = [n for p in parts for n in p["extra_data"].get("notes", [])]
    result["extra_data"] = {**parts[0]["extra_data"], "notes": list(dict.fromkeys(notes)),
                            "seconds": round(seconds, 2), "sessions": len(parts),
                            "budget_seconds": budget_seconds, "not_run": sorted({t["item"] for t in skipped})}
    return result


def submit_hint(aid):
    return (f"Submit {aid}.ipynb, the notebook itself: in Jupyter or Colab, File > Download > Download .ipynb, "
            f"then upload that one file.")


def upload_problem(folder, aid, own=None):
    """Why the upload in `folder` cannot be graded, for the student to fix ('' for one readable notebook of `aid`'s,
    or one that says nothing of whose it is). `own`: every assignment's own grade ids (otter_config's `notebooks`),
    which tell another assignment's notebook."""
    found = sorted(Path(folder).iterdir()) if Path(folder).is_dir() else []
    notebooks = [p for p in found if p.is_file() and p.suffix == ".ipynb"]
    names = ", ".join(p.name + "/" * p.is_dir() for p in found) or "nothing"
    if len(notebooks) == 1:
        problem = read_notebook(notebooks[0])[1]
        if problem:
            return f"{problem}: it may be cut short or saved as something else. {submit_hint(aid)}"
        return another_assignments(notebooks[0], aid, own)
    if notebooks:
        return f"Your upload holds {len(notebooks)} notebooks ({names}); one is graded. {submit_hint(aid)}"
    if any(p.suffix == ".py" for p in found):
        return (f"You uploaded {names}: a Python file, and this assignment is graded from its notebook. "
                f"{submit_hint(aid)}")
    if any(p.is_dir() for p in found):
        return f"Your upload is a folder ({names}), not the notebook itself. {submit_hint(aid)}"
    return f"Your upload has no notebook (it holds {names}). {submit_hint(aid)}"


def another_assignments(notebook, aid, own):
    """Why `notebook` is not graded as `aid`, for the student, where it says it is another assignment's ('' where
    not). `own`: every assignment's own grade ids (otter_config's `notebooks`; None in a zip built before them)."""
    other = not_of(notebook, aid, own or {})
    return (f"Your upload, {Path(notebook).name}, is a notebook {other}, not {aid}'s: nothing was graded. "
            f"{submit_hint(aid)}") if other else ""


def staff_test(record):
    """A Gradescope test only the staff see (visibility hidden), carrying the grader's record."""
    return {"name": STAFF_TEST, "score": 0, "max_score": 0, "visibility": "hidden",
            "output": json.dumps(record, indent=1, default=str)}


def not_graded(message, record):
    """results.json for a submission the grader did not score: 0, the message, the record for the staff."""
    return {"score": 0, "output": message, "tests": [{"name": "Not graded", "score": 0, "max_score": 0,
                                                      "output": message, "visibility": "visible"},
                                                     staff_test(record)], "extra_data": record}


def apply_lateness(result, root, aid):
    """The course's late policy on a graded results.json: the submission time and the user's own due date (an
    extension granted on Gradescope) from `root`/submission_metadata.json, the due time and policy from the zip's
    course.yaml. A penalty is a test of its own (`Late submission`, negative points) and the top-level score is the
    final one, as `course grade` and nbgrader compute it; the raw score and the time stay in extra_data."""
    from autograder.course.config import load_course
    from autograder.course.submission_times import from_gradescope, iso
    from autograder.reports.final_grade import final_grade
    from autograder.reports.tables import cents, score_text
    meta = root / "submission_metadata.json"
    zipped = root / "source" / "course" / "course.yaml"
    course = load_course(zipped if zipped.is_file() else None)
    try:
        submitted, extension = from_gradescope(meta) if meta.is_file() else (None, 0.0)
    except ConfigError:  # no created_at (a local `otter run`), or a file Gradescope did not write: on time
        submitted, extension = None, 0.0
    raw = round(sum(t["score"] for t in result["tests"]), 4)
    grade = final_grade(course, aid, "", raw, submitted, {("", aid): extension})
    result["extra_data"].update(submitted_at=iso(submitted), raw_score=raw, lateness=grade.lateness.text(),
                                extension_days=extension)
    penalty = cents(raw) - cents(grade.final)  # to the cent, as every export: raw - penalty = final
    if penalty:
        result["tests"].append({"name": "Late submission", "score": -float(penalty), "max_score": 0,
                                "visibility": "visible", "output": f"{grade.lateness.text()} (due "
                                f"{grade.lateness.due.isoformat()}): {score_text(raw)} points become "
                                f"{score_text(grade.final)}"})
    result["score"] = float(cents(grade.final))


def run_autograder(autograder_dir="/autograder"):
    """Otter's run_autograder, with a results.json whatever happens (the zip's run_otter.py calls this)."""
    from otter.run.run_autograder import main
    root = Path(autograder_dir)
    out = root / "results" / "results.json"
    config = json.loads((root / "source" / "otter_config.json").read_text())
    plugin = config["plugins"][0]["autograder.integrations.otter_plugin.CourseGrader"]
    aid = plugin["assignment"]
    CourseGrader.record, t0 = None, time.monotonic()
    try:
        problem = upload_problem(root / "submission", aid, plugin.get("notebooks"))
        if problem:
            result = not_graded(problem, {"assignment": aid, "not_graded": "the upload", "cause": problem})
        else:
            main(str(root))
            if CourseGrader.record is None:
                raise GraderError("Otter finished without running the course's plugin (otter_config.json)")
            result = json.loads(out.read_text())
            result["extra_data"] = CourseGrader.record
            apply_lateness(result, root, aid)
            result["tests"].append(staff_test(CourseGrader.record))
    except Exception as e:
        cause = "".join(traceback.format_exception(e))
        print(cause, flush=True)  # the build's log too
        result = not_graded("The autograder failed while grading this submission: this is not a problem with your "
                            "notebook, and your 0 here is not a grade. The course staff must fix it and regrade "
                            "(no need to resubmit).",
                            {"assignment": aid, "not_graded": "grader failure", "cause": cause,
                             "seconds": round(time.monotonic() - t0, 2)})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return result
