"""nbgrader's view of this repository: sources in assignments/, the release in release/, state in .nbgrader/."""
import contextlib
import os

import nbgrader.apps.autogradeapp
from nbconvert.preprocessors import ClearMetadataPreprocessor
from nbgrader.preprocessors import (
                                    AssignLatePenalties,
                                    CheckCellMetadata,
                                    ClearHiddenTests,
                                    ClearMarkScheme,
                                    ClearOutput,
                                    ClearSolutions,
                                    ComputeChecksums,
                                    DeduplicateIds,
                                    IgnorePattern,
                                    IncludeHeaderFooter,
                                    InstantiateTests,
                                    LimitOutput,
                                    LockCells,
                                    OverwriteCells,
                                    OverwriteKernelspec,
                                    SaveCells,
)

from autograder.course.config import load_course
from autograder.integrations.nbgrader_export import CourseExportPlugin
from autograder.integrations.nbgrader_grades import SaveGrades
from autograder.integrations.nbgrader_late import CourseLatePenalty
from autograder.integrations.nbgrader_plugin import (
                                    FEEDBACK_TEMPLATES,
                                    CourseAutograde,
                                    CourseFeedbackExporter,
                                    FeedbackSummary,
                                    RepairSubmission,
                                    TrustedGrade,
)
from autograder.reports.student_html import clean_student_html

here = os.path.dirname(os.path.abspath(__file__))
state = os.path.join(here, ".nbgrader")  # git-ignored: gradebook, submissions, autograded and feedback folders
# sqlite creates the gradebook file, not its folder (a fresh clone has none); a user who cannot write the course
# still reads these settings (`course grade` looks up written points), and finds no gradebook
with contextlib.suppress(OSError):
    os.makedirs(state, exist_ok=True)

c = get_config()  # noqa: F821 -- provided by nbgrader when it loads this file
c.CourseDirectory.root = here
c.CourseDirectory.source_directory = "assignments"
c.CourseDirectory.release_directory = "release"
c.CourseDirectory.submitted_directory = os.path.join(state, "submitted")
c.CourseDirectory.autograded_directory = os.path.join(state, "autograded")
c.CourseDirectory.feedback_directory = os.path.join(state, "feedback")
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(state, "gradebook.db")
# The exchange on a JupyterHub (course.yaml's `exchange`, docs/HUB.md): release, collect and the feedback commands
# find this course in `<root>/<course_id>`; the students' servers name the course in the path they fetch to
# (`<course_id>/<assignment>/`, path_includes_course), so two courses' assignments of one name never meet.
exchange = load_course(os.path.join(here, "course.yaml")).exchange
c.CourseDirectory.course_id = exchange.course_id
c.Exchange.root = exchange.root
c.Exchange.path_includes_course = True
c.IncludeHeaderFooter.header = ""
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}

# The kernel students and the release use; pinned so nbgrader never picks a kernel from another machine.
c.OverwriteKernelspec.enabled = True
c.ExecutePreprocessor.kernel_name = "python3"

# The gradebook keeps each cell as released (hidden-test region already cleared), so the checksum nbgrader
# compares at autograde is the one the student's copy carries: an untouched test cell raises no warning.
c.GenerateAssignment.preprocessors = [IncludeHeaderFooter, InstantiateTests, LockCells, ClearSolutions, ClearOutput,
                                      CheckCellMetadata, ClearHiddenTests, ClearMarkScheme, ComputeChecksums,
                                      SaveCells, CheckCellMetadata]

# Autograde takes a submission folder's single notebook whatever its name, and stops a student it cannot grade with
# one line saying why (autograder/integrations/nbgrader_plugin.py). nbgrader has no setting for the class
# `nbgrader autograde` makes, so the app's name for it is pointed at the subclass. formgrader's Autograde button runs
# this same command, in a process of its own, through the course's extension (`course formgrader`,
# autograder/integrations/formgrader.py); nbgrader's own button would use nbgrader's Autograde inside the server.
nbgrader.apps.autogradeapp.Autograde = CourseAutograde
# The submission is repaired against the release (deleted, duplicated or edited locked cells, lost metadata) before
# nbgrader's own checks, which would otherwise score such a notebook 0; each repair is logged and in the feedback.
c.Autograde.sanitize_preprocessors = [RepairSubmission, ClearOutput, DeduplicateIds, OverwriteKernelspec,
                                      OverwriteCells, CheckCellMetadata]
# Autograde: the isolated grader (one pytest session per notebook) scores the test cells instead of running the
# notebook in a kernel (student code never runs in nbgrader's process, and a test cell's printed text cannot forge
# a score). SaveGrades is nbgrader's SaveAutoGrades keeping a TA's grade of a written answer whose text did not change
# since, and taking it off one whose text did (autograder/integrations/nbgrader_grades.py).
c.Autograde.autograde_preprocessors = [TrustedGrade, IgnorePattern, ClearMetadataPreprocessor, LimitOutput,
                                       SaveGrades, AssignLatePenalties, CheckCellMetadata]
# Feedback opens with a summary of the grade (items, reasons, experiments), shows each check's message, never the
# hidden-test region of a test cell; markdown is sanitised and written answers shown as text (never markup).
c.GenerateFeedback.preprocessors = ["nbgrader.preprocessors.GetGrades", ClearHiddenTests, FeedbackSummary,
                                    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor"]
# The page's template is set on the feedback's own exporter class: formgrader's grading page is an HTMLExporter too,
# with a template of its own (formgrade) that settings on HTMLExporter would replace.
c.GenerateFeedback.exporter_class = CourseFeedbackExporter
c.CourseFeedbackExporter.template_name = "feedback"  # nbgrader's, extended by autograder/reports/templates/feedback/
c.CourseFeedbackExporter.template_file = "course_feedback.html.j2"
c.CourseFeedbackExporter.extra_template_basedirs = FEEDBACK_TEMPLATES
c.CourseFeedbackExporter.filters = {"clean_student_html": clean_student_html}
# Every page made from a submission, the student's feedback and the TA's grading page alike: a student's markdown and
# outputs are sanitised, so that a <script> in an answer never runs in a browser (the TA's holds a Jupyter token).
c.HTMLExporter.sanitize_html = True

# `nbgrader export`: nbgrader's columns (the late penalty computed again with today's extensions), then the automatic
# and the written points apart (written: pending until a TA has graded every answer in formgrader), then each item's.
c.ExportApp.plugin_class = CourseExportPlugin

# Late submissions: `course release` sets each assignment's due time from course.yaml in the gradebook, and the penalty
# for a timestamp.txt past it is course.yaml's late policy with the student's extension (extensions.csv), on the
# automatic points, as `course grade` and `course export grades` compute it (docs/SEMESTER.md).
c.AssignLatePenalties.plugin_class = CourseLatePenalty
