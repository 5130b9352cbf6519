"""Otter-Grader plugin: the course's isolated grader scores the submission; Otter's kernel runs none of its code.

Otter executes a submission in a Jupyter kernel before its tests. `before_execution` grades the submission
file with `grade_notebook` (the sandbox, the hidden suites, the experiments) and hands Otter an empty
notebook to execute instead; `after_grading` replaces whatever Otter measured with those results, one
Otter test per check, so results.json (Gradescope's, or `otter run`'s) carries the grader's scores and
reasons and nothing else. Configured in otter_config.json by `course export gradescope`:

    {"plugins": [{"autograder.otter_plugin.CourseGrader": {"assignment": "lab14_transformers"}}]}
"""
import nbformat
from otter.plugins import AbstractOtterPlugin
from otter.test_files.abstract_test import TestCase, TestCaseResult, TestFile


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
    """Grade with the course's isolated grader (plugin config: `assignment`, optional `device`)."""

    def before_execution(self, submission):
        from autograder.grade import grade_notebook
        self.result = grade_notebook(self.submission_path, self.plugin_config["assignment"],
                                     device=self.plugin_config.get("device", "auto"))
        return nbformat.v4.new_notebook()  # what Otter's kernel executes: nothing of the student's

    def after_grading(self, results):
        results.results = {t["name"]: CheckResult(t) for t in self.result["tests"]}
        results.output = self.result["output"] or None
        results.set_plugin_data(type(self).__name__, self.result["extra_data"])
