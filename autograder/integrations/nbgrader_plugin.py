"""nbgrader integration: the isolated grader's verdicts in the test cells, and a feedback page that explains them.

`nbgrader autograde` runs TrustedGrade in place of executing the notebook in a kernel (see nbgrader_config.py):
the student's code runs only in the sandbox, and each test cell's last value becomes the trusted partial score,
which nbgrader's SaveAutoGrades reads as partial credit. The whole result is kept in the autograded notebook's
metadata, where `nbgrader generate_feedback` (FeedbackSummary and templates/feedback/course_feedback.html.j2) reads
it back.

Before nbgrader's own sanitising, CourseAutograde takes a submission folder's single notebook whatever its name
and RepairSubmission repairs the notebook against the release (autograder/notebooks/repair.py): what nbgrader alone
would grade as 0 is graded, each repair one line in the log and in the student's feedback; what cannot be repaired
stops that student with one line saying why, before the gradebook has a score for it.

In parallel: `nbgrader autograde` walks the class twice (CourseAutograde.workers, default all cores; one student's
one assignment, as formgrader's Autograde button asks, is graded one by one on this machine). The first
walk has CollectForGrading as its only autograde step: it writes each sanitised notebook as TrustedGrade would grade
it, and scores nothing. This machine's workers (batch/run.py worker_pool, `course grade`'s) grade each one the
moment it is written, into a results folder, so that the class is graded while nbgrader is still walking it;
CourseAutograde.scheduler grades them on a running Dask cluster instead, once the first walk is done
(batch/scheduler.py grade_class). The second walk begins at once: its TrustedGrade waits for each student's grading
to end and takes the result whose identity (the graded bytes' sha256, the whole assignment, the grader) is this
grading's, and grades any other itself. On this machine's workers nbgrader's process imports no torch: they grade,
and one of them computes the grader identity it checks their results with (its own: they are its children). The
gradebook is written by nbgrader alone, as in a serial run. The same three steps also run by hand
(docs/CLUSTER.md).
"""
import filecmp
import logging
import shutil
import tempfile
from contextlib import contextmanager, nullcontext, suppress
from pathlib import Path

import nbformat
from nbconvert.exporters import HTMLExporter
from nbformat.v4 import new_output
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.converters import Autograde
from nbgrader.converters.base import NbGraderException
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Integer, Unicode

from autograder.course.config import course_root, load_course
from autograder.errors import ConfigError
from autograder.notebooks.cells import nbgrader_meta, read_notebook
from autograder.notebooks.identify import not_of, own_cell_ids
from autograder.notebooks.repair import repair
from autograder.reports.feedback import summary_html
from autograder.reports.tables import item_summary, score_text

# course_feedback.html.j2 sits in a `feedback` folder found before nbgrader's, so it extends nbgrader's page
NBGRADER_TEMPLATES = Path(__import__("nbgrader").__file__).parent / "server_extensions" / "formgrader" / "templates"
FEEDBACK_TEMPLATES = [str(Path(__file__).parent.parent / "reports" / "templates"), str(NBGRADER_TEMPLATES)]
RESULTS_KEY = "course_results"
REPAIRS_KEY = "course_repairs"  # the repairs' notes, from sanitising (RepairSubmission) to grading (TrustedGrade)


class CourseAutograde(Autograde):
    """nbgrader's Autograde, taking a submission folder's single notebook whatever its name (a browser saves
    `lab14_transformers (1).ipynb`), stopping a student loudly, before the gradebook has a score, when it
    cannot tell which notebook to grade or cannot read it, and grading the class on all cores (module doc)."""

    workers = Integer(0, help="submissions graded at once before nbgrader writes the gradebook (0: one per core; "
                      "1: one after another, inside nbgrader's walk)").tag(config=True)
    scheduler = Unicode("", help="grade the class on this running Dask cluster instead of this machine's cores: "
                        "tcp://HOST:PORT, tls://HOST:PORT or a scheduler file (docs/CLUSTER.md)").tag(config=True)
    _stage = None          # None: nbgrader's own walk; "collect": the first walk of a parallel run; "take": the second
    _pregraded_dir = None  # the second walk's results folder
    _collected = ()        # (assignment, student) the first walk took up
    _pool = None           # this machine's WorkerPool, grading what the first walk writes
    _pregrading = None     # (assignment, student) -> the future of its grading (in _pool, or on the cluster)
    _graded_dir = None     # the results folder of the walk that scores (<assignment>/<student>.json)
    _released_names = None  # assignment -> its notebooks' names in the gradebook (released_names)

    def convert_notebooks(self):
        """nbgrader's walk; with several workers or a cluster, a collecting walk, the class graded at once, and the
        walk that scores taking each student's result as it is done (module doc)."""
        from autograder.batch.run import worker_pool
        from autograder.batch.scheduler import Where
        where = Where(scheduler=self.scheduler) if self.scheduler else Where(workers=self.workers or _cores())
        by_hand = self.config.TrustedGrade.get("results_dir") or \
            not any(_is(pp, TrustedGrade) for pp in self.autograde_preprocessors)  # docs/CLUSTER.md's steps 1 and 3
        if (where.workers <= 1 and not where.on_dask) or by_hand or (self._one_submission() and not where.on_dask):
            return super().convert_notebooks()
        device = self.config.TrustedGrade.get("device", "auto")
        # this machine's workers grade each notebook the moment the collecting walk has written it; a cluster
        # grades the class once that walk is done, while the walk that scores takes each result as it comes
        pool = nullcontext() if where.on_dask else worker_pool(where.workers, device)
        with tempfile.TemporaryDirectory(prefix="course-nbgrader-") as tmp, pool as self._pool:
            pending, graded = Path(tmp) / "pending", Path(tmp) / "graded"
            self._graded_dir = graded
            self._pregrading = {}
            # a student the collecting walk cannot take fails again, and is reported, in the walk that scores
            with self._walk("collect", pending), suppress(NbGraderException):
                super().convert_notebooks()
            if where.on_dask:
                self.pregrade_on_dask(pending, graded, where, device)
            else:
                for aid in sorted({aid for aid, _ in self._pregrading}):
                    self.log.info("grading %d submissions of %s, %d at once",
                                  sum(a == aid for a, _ in self._pregrading), aid, where.workers)
            with self._walk("take", graded):
                return super().convert_notebooks()

    def _one_submission(self):
        """One assignment of one student was asked for (`--student S`, formgrader's Autograde button): graded in this
        process, as one by one, instead of starting a pool whose every worker imports torch for one notebook."""
        names = (self.coursedir.assignment_id, self.coursedir.student_id)
        return all(name and not any(c in name for c in "*?[") for name in names)

    def collected(self, aid, student, notebook):
        """The collecting walk wrote `student`'s notebook: grade it now on this machine's workers, into the
        results folder of the walk that scores (a student's first notebook; any other is graded in that walk)."""
        if self._pool is not None and (aid, student) not in self._pregrading:
            self._pregrading[aid, student] = self._pool.submit(student, notebook, aid,
                                                               results_dir=self._graded_dir / aid)

    def wait_for_pregrading(self, aid, student):
        """Until `student`'s grading on this machine's workers or the cluster has ended (its result saved, or
        none)."""
        future = (self._pregrading or {}).get((aid, student))
        if future is None:
            return
        try:
            future.result()
        except Exception as e:  # a worker that died, a cluster gone: this student is graded in the walk
            self.log.warning("student '%s': grading at once failed (%s: %s)", student, type(e).__name__, e)

    @contextmanager
    def _walk(self, stage, folder):
        """One walk; the collecting one says nothing (its repairs and the students it cannot take are said once,
        by the walk that scores, as in a one-by-one run)."""
        self._stage, self._pregraded_dir = stage, folder
        level = self.log.level
        if stage == "collect":
            self._collected = set()
            self.log.setLevel(logging.CRITICAL + 1)
        try:
            yield
        finally:
            self._stage, self._pregraded_dir = None, None
            self.log.setLevel(level)

    def pregrade_on_dask(self, pending, graded, where, device):
        """Grade the collected notebooks on the Dask cluster `where` names, in a thread, each student's grading a
        future in _pregrading; return once the cluster has answered. One that does not answer is one line, nobody is
        scored and the first walk's copies are removed; one that fails later leaves its students to the walk."""
        import threading
        from concurrent.futures import Future
        self._pregrading = {key: Future() for key in self._collected}
        answered, failed = threading.Event(), []

        def said(line):  # the cluster's scheduler and dashboard: it has answered
            self.log.info(line)
            answered.set()

        def graded_one(aid, student):
            future = self._pregrading.get((aid, student))
            if future is not None and not future.done():
                future.set_result(None)

        def grade():
            try:
                self.pregrade(pending, graded, where, device, said, graded_one)
            except BaseException as e:
                failed.append(e)
            finally:
                answered.set()
                for future in self._pregrading.values():
                    if not future.done():
                        future.set_exception(failed[0] if failed else RuntimeError("the cluster returned no result"))

        threading.Thread(target=grade, name="course-dask-grading", daemon=True).start()
        answered.wait()
        if failed and isinstance(failed[0], ConfigError):
            self.log.error(str(failed[0]))
            for aid, student in self._collected:  # the first walk's ungraded copies, as nbgrader removes a failure's
                shutil.rmtree(self._format_dest(aid, student), ignore_errors=True)
            raise NbGraderException(str(failed[0])) from None

    def pregrade(self, pending, graded, where, device, say, graded_one):
        """Grade every collected notebook on the Dask cluster `where` names, `course grade`'s way, into
        `graded`/<assignment>; `graded_one(assignment, student)` as each is done."""
        from autograder.batch.scheduler import grade_class
        from autograder.batch.submissions import find_submissions
        for aid in sorted({aid for aid, _ in self._collected}):
            written = sorted(p for student in {s for a, s in self._collected if a == aid}
                             if (p := pending / aid / student).is_dir())
            subs = find_submissions(written, aid, say=self.log.warning)
            if not subs:
                continue
            self.log.info("grading %d submissions of %s on the cluster at %s", len(subs), aid, where.scheduler)

            def progress(done, total, name, result, how, aid=aid):
                self.log.info("[%d/%d] %s: %s/%s", done, total, name, result["score"], result["max_score"])
                graded_one(aid, name)
            grade_class(subs, aid, device=device, where=where, results_dir=graded / aid, progress=progress, say=say)

    def init_destination(self, assignment_id, student_id):
        """The second walk takes up exactly the students the first one did (their collected copy replaced): those
        graded at once, and those the first walk could not take, so that they fail, and are reported, again."""
        if self._stage != "take":
            wanted = super().init_destination(assignment_id, student_id)
            if wanted and self._stage == "collect":
                self._collected.add((assignment_id, student_id))
            return wanted
        if (assignment_id, student_id) not in self._collected:
            return False
        dest = Path(self._format_dest(assignment_id, student_id))
        if self.coursedir.notebook_id == "*":  # as --force would, without its warning: this copy is our own
            shutil.rmtree(dest, ignore_errors=True)
            # nbconvert's writer makes its folder only when the folder changes: a class of one (`--student S`, the
            # Autograde button) writes to the folder the collecting walk last wrote to, just removed
            dest.mkdir(parents=True)
        for notebook in self.notebooks:
            (dest / f"{Path(notebook).stem}{self.exporter.file_extension}").unlink(missing_ok=True)
        return True

    def _init_preprocessors(self):
        if self._sanitizing or self._stage is None:
            return super()._init_preprocessors()
        self.exporter._preprocessors = []
        if self._stage == "collect":
            folder = self._pregraded_dir / self._current_assignment
            collect = CollectForGrading(folder=str(folder), parent=self)
            collect.written = self.collected
            self.exporter.register_preprocessor(collect, enabled=True)
            return
        super()._init_preprocessors()
        for pp in self.exporter._preprocessors:
            if isinstance(pp, TrustedGrade) and not pp.results_dir:
                pp.results_dir = str(self._pregraded_dir / self._current_assignment)
                pp.wait_for = self.wait_for_pregrading
                if self._pool is not None:
                    pp.identity_of = self._pool.identity

    def init_assignment(self, assignment_id, student_id):
        self.file_notes = {}
        self._current_assignment = assignment_id
        self.notebooks = self.take_notebooks(assignment_id, student_id)
        super().init_assignment(assignment_id, student_id)

    def init_single_notebook_resources(self, notebook_filename):
        resources = super().init_single_notebook_resources(notebook_filename)
        resources["course_notes"] = getattr(self, "file_notes", {}).get(resources["nbgrader"]["notebook"], [])
        return resources

    def released_names(self, aid):
        """The assignment's notebooks as the gradebook knows them; None when it does not know the assignment. Read
        once per run (autograde changes no assignment), not once per student and walk."""
        if self._released_names is None:
            self._released_names = {}
        if aid not in self._released_names:
            with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gb:
                try:
                    self._released_names[aid] = sorted(n.name for n in gb.find_assignment(aid).notebooks)
                except MissingEntry:
                    self._released_names[aid] = None
        return self._released_names[aid]

    def take_notebooks(self, aid, student):
        """The student's notebooks under their released names; a lone one of another name is copied to its name."""
        expected = self.released_names(aid)
        if expected is None:
            return self.notebooks  # nbgrader says so itself
        found = {Path(p).stem: p for p in self.notebooks if Path(p).stem in expected}
        others = [p for p in self.notebooks if Path(p).stem not in expected]
        missing = [n for n in expected if n not in found]
        folder = Path(self._format_source(aid, student))
        if len(missing) == 1 and len(others) == 1:
            # a copy, not a rename: the student's file stays as submitted, and a rerun finds the same pair
            target = folder / f"{missing[0]}.ipynb"
            shutil.copy2(others[0], target)
            found[missing[0]] = str(target)
        elif missing and others:
            self.stop(f"student '{student}': not graded: {len(others)} notebooks in {folder} "
                      f"({', '.join(Path(p).name for p in others)}) and none named {missing[0]}.ipynb, so which one "
                      f"to grade is unclear; keep the one to grade as {missing[0]}.ipynb and autograde again")
        for p in others:
            name = next((n for n, q in found.items() if filecmp.cmp(p, q, shallow=False)), None)
            if name is None:
                self.log.warning("student '%s': %s is not a notebook of %s and was not graded",
                                 student, Path(p).name, aid)
                continue
            self.file_notes.setdefault(name, []).append(
                f"the notebook was submitted as '{Path(p).name}'; it was graded as {name}.ipynb")
        for _name, path in found.items():
            nb, error = read_notebook(path)
            if nb is None:
                self.stop(f"student '{student}': not graded: {error}")
            other = not_of(path, aid, own_cell_ids(load_course()))
            if other:  # never graded as this assignment, nor repaired into it
                self.stop(f"student '{student}': not graded as {aid}: {Path(path).name} is a notebook {other}; "
                          f"put {aid}'s own notebook in {folder} and autograde again")
        return sorted(found.values())

    def stop(self, message):
        self.log.error(message)
        raise NbGraderException(message)


def _is(pp, cls):
    """Whether a preprocessor as configured (a class, or its dotted name) is `cls`."""
    return pp is cls or pp == f"{cls.__module__}.{cls.__name__}"


def _cores():
    from autograder.sandbox.zygote import cpu_cores  # not the grader's side, which imports torch
    return cpu_cores()


class RepairSubmission(NbGraderPreprocessor):
    """Repair the submission against the released notebook (autograder/notebooks/repair.py), first of the
    sanitising steps."""

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        released = course_root() / "release" / info["assignment"] / f"{info['notebook']}.ipynb"
        if not released.is_file():  # the course's set-up, not the student's doing: stop, score nothing
            raise NbGraderException(f"{released} is missing: run `course release {info['assignment']}` first")
        nb, notes = repair(nb, nbformat.read(released, as_version=4))
        notes = [*resources.get("course_notes", []), *notes]
        for note in notes:
            self.log.warning("student '%s': %s", info["student"], note)
        nb.metadata[REPAIRS_KEY] = notes  # always set: a submission cannot slip in notes of its own
        return nb, resources


class TrustedGrade(NbGraderPreprocessor):
    """Grade the (sanitised) submission with the isolated grader; write each item's score and messages."""

    device = Unicode("auto", help="auto, cpu or cuda").tag(config=True)

    results_dir = Unicode("", help="a folder of results pre-graded in parallel (`course grade PENDING --results-dir "
                          "DIR` after a CollectForGrading pass): a student's result there is used when it graded these "
                          "very bytes with this grader, else the notebook is graded here").tag(config=True)
    wait_for = None  # (assignment, student) -> None once that student's grading at once has ended (CourseAutograde)
    # (assignment, device) -> the grader identity: CourseAutograde's workers' (so that nbgrader imports no torch)
    identity_of = None

    def preprocess(self, nb, resources):
        aid = resources["nbgrader"]["assignment"]
        repairs = nb.metadata.pop(REPAIRS_KEY, None)
        repairs = [str(n) for n in repairs] if isinstance(repairs, list) else []
        graded = nbformat.writes(nb).encode()  # what is graded: the sanitised notebook, the repairs' notes left out
        result = self.pregraded(aid, resources["nbgrader"]["student"], graded)
        if result is None:
            from autograder.grading.grade import grade_notebook
            with tempfile.TemporaryDirectory(prefix="course-nbgrader-") as tmp:
                path = Path(tmp) / f"{resources['nbgrader']['notebook']}.ipynb"
                path.write_bytes(graded)  # as CollectForGrading writes it: the same bytes, the same result
                result = grade_notebook(path, aid, device=self.device)
        if repairs:  # results.json's `output` and notes say them as `course grade` says its own; the page, one a line
            result["extra_data"]["notes"] = repairs + list(result["extra_data"].get("notes") or [])
            result["extra_data"]["repairs"] = repairs
            result["output"] = "; ".join(filter(None, ["; ".join(repairs), result["output"]]))
        by_item = item_summary(result)
        for cell in nb.cells:
            gid = nbgrader_meta(cell).get("grade_id", "")
            if cell.cell_type != "code" or not gid.startswith("test_"):
                continue
            if gid[5:] not in by_item:  # nbgrader would give a test cell with no output its full points
                raise RuntimeError(f"the grader has no result for test cell '{gid}' ({aid} in course.yaml has no item "
                                   f"{gid[5:]!r}): the release and course.yaml disagree; nothing was graded")
            score, max_score, lines = by_item[gid[5:]]
            head = f"{gid[5:]}: {score_text(round(score, 4))} / {score_text(max_score)} points"
            cell.outputs = [
                new_output("stream", name="stdout", text="\n".join([head, *lines]) + "\n"),
                new_output("execute_result", data={"text/plain": repr(round(score, 4))}, execution_count=None),
            ]
        nb.metadata[RESULTS_KEY] = result  # written after sanitising: the submission cannot have set it
        resources.setdefault("course", {})["results"] = result
        return nb, resources


    def pregraded(self, aid, student, graded):
        """The student's result in results_dir when it is the grading of `graded` (same bytes, whole assignment, the
        same grader identity), without its bookkeeping; None otherwise."""
        if not self.results_dir:
            return None
        import hashlib
        if self.wait_for is not None:
            self.wait_for(aid, student)

        from autograder.batch.identity import identity_here
        from autograder.batch.results import grading_identity, read_result, same_grading
        saved = read_result(Path(self.results_dir) / f"{student}.json")
        grader = None
        if self.identity_of is not None:
            try:
                grader = self.identity_of(aid, self.device)
            except Exception as e:  # the workers are gone (one died): this process computes it, as one by one
                self.log.warning("student '%s': the workers did not give the grader identity (%s: %s); computed "
                                 "here", student, type(e).__name__, e)
        identity = grading_identity(aid, hashlib.sha256(graded).hexdigest(), None,
                                    grader or identity_here(aid, self.device))
        if not same_grading(saved, identity):
            self.log.warning("student '%s': %s in %s; graded here", student, "the result is not this notebook's "
                             "grading by this grader" if saved else "no pre-graded result", self.results_dir)
            return None
        saved["extra_data"].pop("grading")
        self.log.info("student '%s': pre-graded result taken from %s", student, self.results_dir)
        return saved


class CollectForGrading(NbGraderPreprocessor):
    """The first pass of a parallel nbgrader autograde: write each sanitised notebook, as TrustedGrade would grade
    it, to `folder`/<student>/<notebook>.ipynb and score nothing (the only autograde preprocessor of that pass).
    `course grade folder --results-dir DIR` then grades them on all cores or a cluster, and a second
    `nbgrader autograde --force` with TrustedGrade.results_dir=DIR writes the gradebook from those results."""

    folder = Unicode("", help="where the notebooks to grade are written").tag(config=True)
    written = None  # (assignment, student, path) -> None, told of each notebook written (CourseAutograde.collected)

    def preprocess(self, nb, resources):
        if not self.folder:
            raise NbGraderException("CollectForGrading.folder is not set: name the folder the notebooks go to")
        nb.metadata.pop(REPAIRS_KEY, None)
        info = resources["nbgrader"]
        out = Path(self.folder) / info["student"] / f"{info['notebook']}.ipynb"  # graded under TrustedGrade's name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(nbformat.writes(nb).encode())
        if self.written is not None:
            self.written(info["assignment"], info["student"], out)
        return nb, resources


class CourseFeedbackExporter(HTMLExporter):
    """The feedback page's exporter (`GenerateFeedback.exporter_class`): its template settings in nbgrader_config.py
    name this class, never HTMLExporter, whose settings formgrader's grading page shares."""


class FeedbackSummary(NbGraderPreprocessor):
    """Put the autograded result's summary (items, reasons, experiments) where the feedback template shows it, and
    the written answers' points beside the automatic ones, read from the gradebook as every view reads them
    (reports/written.py); each answer a TA has not graded yet is marked so (`course_pending`)."""

    def preprocess(self, nb, resources):
        from autograder.reports.written import written_of_submission
        result = nb.metadata.pop(RESULTS_KEY, None)
        resources["course_summary"] = summary_html(result) if result else ""
        info = resources.get("nbgrader", {})
        written = None
        if "db_url" in info:  # nbgrader's generate_feedback (GetGrades before this step has read the same gradebook)
            with Gradebook(info["db_url"]) as gb:
                submission = gb.find_submission(info["assignment"], info["student"])
                written = written_of_submission(submission)
                pending = {g.name for g in gb.find_submission_notebook(info["notebook"], info["assignment"],
                                                                         info["student"]).grades
                           if g.needs_manual_grade}
            for cell in nb.cells:
                if nbgrader_meta(cell).get("grade_id") in pending:
                    nbgrader_meta(cell)["course_pending"] = True
        automatic = result["score"] if result else 0
        # what else makes nbgrader's total (extra credit is in the written points, the late penalty has a line of its
        # own): a TA's override of an autograded cell
        other = info.get("score", automatic) + (info.get("late_penalty") or 0) - automatic \
            - (written.score or 0 if written else 0)
        resources["course_split"] = {
            "automatic": (automatic, result["max_score"]) if result else None,
            "written": (written.score, written.max_score) if written and written.max_score else None,
            "other": round(other, 4) if written and not written.pending and abs(other) > 1e-6 else 0}
        return nb, resources
