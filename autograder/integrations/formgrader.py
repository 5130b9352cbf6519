"""formgrader, nbgrader's web UI, for this course: a Jupyter server extension beside nbgrader's own.

Two things change (docs/TA.md, "Grading in formgrader"):
- the grading page shows each written answer's rubric from course.yaml beside it, and every student's markdown,
  written answers included, sanitised (a <script> in an answer would run in the TA's browser, which holds a
  Jupyter token);
- the Autograde button runs `nbgrader autograde ASSIGNMENT --student STUDENT --force` in a process of its own, the
  command a TA types, with the course's autograder class, its repairs, its parallel path and its results identity.
  nbgrader's button autogrades inside the Jupyter server's process with nbgrader's plain Autograde class (the
  config's swap reaches the command only), importing the grader's side and torch there and holding the server for
  the whole grading. Here the server awaits the process and answers every other request meanwhile; autogrades run
  one at a time (they write one gradebook).

Enable it with nbgrader's formgrader (`course formgrader` does both), or in a Jupyter of your own with
`--ServerApp.jpserver_extensions=autograder.integrations.formgrader=True` or a jupyter_server_config.d file
(docs/TA.md). Jupyter loads extensions in alphabetical order, so this one's handler is added before nbgrader's and
takes the Autograde button's URL; nbgrader's exporter is replaced once every extension has loaded (formgrader sets
it while loading).
"""
import asyncio
import json
import os
import sys
from pathlib import Path

from jupyter_server.utils import url_path_join
from nbconvert.exporters import HTMLExporter
from nbgrader.server_extensions.formgrader.base import BaseApiHandler, check_notebook_dir, check_xsrf
from tornado import web
from traitlets.config import Config

from autograder.course.config import load_course
from autograder.errors import ConfigError
from autograder.integrations.nbgrader_plugin import NBGRADER_TEMPLATES
from autograder.reports.student_html import clean_student_html

COURSE_TEMPLATES = Path(__file__).parent.parent / "reports" / "templates"
AUTOGRADE_URL = r"/formgrader/api/submission/([^/]+)/([^/]+)/autograde"  # nbgrader's own (formgrader's JS posts it)
GLOB = set("*?[")  # nbgrader's --student is a glob: a student id with one of these would grade others too


class CourseFormgradeExporter(HTMLExporter):
    """formgrader's grading page: nbgrader's formgrade template, with the written answers' rubrics beside them and
    the student's markdown sanitised (autograder/reports/templates/formgrade/course_formgrade.html.j2)."""

    course_yaml = None  # the course.yaml of formgrader's course folder

    def from_notebook_node(self, nb, resources=None, **kw):
        resources = dict(resources or {})
        resources["course_written"] = self.written(resources.get("assignment_id"))
        return super().from_notebook_node(nb, resources, **kw)

    def written(self, aid):
        """grade_id -> {points, rubric} of the assignment's written answers in course.yaml (read once per server);
        {} when the course has no such assignment (the page is nbgrader's, without rubrics)."""
        try:
            return {gid: q.model_dump() for gid, q in load_course(self.course_yaml).assignment(aid).written.items()}
        except ConfigError as e:
            self.log.warning("formgrader: no rubrics for '%s': %s", aid, e)
            return {}


def course_exporter(config, root):
    """The grading page's exporter, configured as formgrader configures its own, with the course's template."""
    config = Config(config)
    config.CourseFormgradeExporter.template_name = "formgrade"
    config.CourseFormgradeExporter.template_file = "course_formgrade.html.j2"
    config.CourseFormgradeExporter.extra_template_basedirs = [str(COURSE_TEMPLATES), str(NBGRADER_TEMPLATES)]
    config.CourseFormgradeExporter.sanitize_html = True
    config.CourseFormgradeExporter.filters = {"clean_student_html": clean_student_html}
    exporter = CourseFormgradeExporter(config=config)
    exporter.course_yaml = Path(root) / "course.yaml"
    return exporter


async def autograde(root, aid, student):
    """`nbgrader autograde AID --student STUDENT --force` in the course folder `root`, as a process of its own;
    nbgrader's API answer: {"success", "log"[, "error"]}."""
    if GLOB & set(student) or GLOB & set(aid):
        return {"success": False, "error": f"'{aid}' / '{student}': nbgrader reads these as file patterns, so a "
                                           f"name with * ? or [ cannot be autograded from here; use the command"}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nbgrader", "autograde", aid, "--student", student, "--force", cwd=str(root), env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await proc.communicate()
    except asyncio.CancelledError:  # the server is stopping: the grading goes with it, as a Ctrl-C would end it
        proc.terminate()
        raise
    log = out.decode(errors="replace")
    if proc.returncode == 0:
        return {"success": True, "log": log}
    return {"success": False, "log": log,
            "error": f"nbgrader autograde exited with status {proc.returncode}; the log above says why"}


class CourseAutogradeHandler(BaseApiHandler):
    """The Autograde button: the command line's autograde, awaited (module doc)."""

    @web.authenticated
    @check_xsrf
    @check_notebook_dir
    async def post(self, assignment_id, student_id):
        lock = self.settings.setdefault("course_autograde_lock", asyncio.Lock())
        async with lock:
            result = await autograde(self.coursedir.root, assignment_id, student_id)
        self.write(json.dumps(result))  # a JSON string, as nbgrader's handler writes it (its page parses it)


def use_course_exporter(web_app):
    """Put the course's exporter where formgrader's grading page takes it (after formgrader has set its own)."""
    formgrader = web_app.settings.get("nbgrader_formgrader")
    if formgrader is not None:
        web_app.settings["nbgrader_exporter"] = course_exporter(formgrader.config, formgrader.coursedir.root)


def _jupyter_server_extension_points():
    return [{"module": "autograder.integrations.formgrader"}]


def _load_jupyter_server_extension(serverapp):
    web_app = serverapp.web_app
    web_app.add_handlers(".*$", [(url_path_join(web_app.settings["base_url"], AUTOGRADE_URL),
                                  CourseAutogradeHandler)])
    serverapp.io_loop.add_callback(use_course_exporter, web_app)
    serverapp.log.info("course formgrader: the Autograde button runs `nbgrader autograde`; rubrics from course.yaml")
