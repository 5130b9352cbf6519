"""nbgrader's view of this repository: sources in assignments/, the release in release/, state in .nbgrader/."""
import os

from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, ClearHiddenTests, IgnorePattern,
                                    LimitOutput, SaveAutoGrades)
from nbconvert.preprocessors import ClearMetadataPreprocessor

from autograder.nbgrader_plugin import TrustedGrade

here = os.path.dirname(os.path.abspath(__file__))
state = os.path.join(here, ".nbgrader")  # git-ignored: gradebook, submissions, autograded and feedback folders

c = get_config()  # noqa: F821 -- provided by nbgrader when it loads this file
c.CourseDirectory.root = here
c.CourseDirectory.source_directory = "assignments"
c.CourseDirectory.release_directory = "release"
c.CourseDirectory.submitted_directory = os.path.join(state, "submitted")
c.CourseDirectory.autograded_directory = os.path.join(state, "autograded")
c.CourseDirectory.feedback_directory = os.path.join(state, "feedback")
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(state, "gradebook.db")
c.IncludeHeaderFooter.header = ""
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}

# The kernel students and the release use; pinned so nbgrader never picks a kernel from another machine.
c.OverwriteKernelspec.enabled = True
c.ExecutePreprocessor.kernel_name = "python3"

# Autograde: the isolated engine scores the test cells instead of running the notebook in a kernel
# (student code never runs in nbgrader's process, and a test cell's printed text cannot forge a score).
c.Autograde.autograde_preprocessors = [TrustedGrade, IgnorePattern, ClearMetadataPreprocessor, LimitOutput,
                                       SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
# Feedback shows each check's message, never the hidden-test region of a test cell.
c.GenerateFeedback.preprocessors = ["nbgrader.preprocessors.GetGrades", ClearHiddenTests,
                                    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor"]
