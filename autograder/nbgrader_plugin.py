"""nbgrader integration: a preprocessor that writes the isolated grader's verdicts into the test cells.

`nbgrader autograde` runs it in place of executing the notebook in a kernel (see nbgrader_config.py): the
student's code runs only in the sandbox, and each test cell's last value becomes the trusted partial score,
which nbgrader's SaveAutoGrades reads as partial credit.
"""
import tempfile
from pathlib import Path

import nbformat
from nbformat.v4 import new_output
from traitlets import Unicode

from nbgrader.preprocessors import NbGraderPreprocessor

from autograder.notebook import nbgrader_meta
from autograder.report import item_summary


class TrustedGrade(NbGraderPreprocessor):
    """Grade the (sanitised) submission with the isolated engine; write each item's score and messages."""

    device = Unicode("auto", help="auto, cpu or cuda").tag(config=True)

    def preprocess(self, nb, resources):
        from autograder.engine import grade_notebook
        aid = resources["nbgrader"]["assignment"]
        with tempfile.TemporaryDirectory(prefix="course-nbgrader-") as tmp:
            path = Path(tmp) / f"{resources['nbgrader']['notebook']}.ipynb"
            nbformat.write(nb, path)
            result = grade_notebook(path, aid, device=self.device)
        by_item = item_summary(result)
        for cell in nb.cells:
            gid = nbgrader_meta(cell).get("grade_id", "")
            if cell.cell_type != "code" or not gid.startswith("test_") or gid[5:] not in by_item:
                continue
            score, max_score, lines = by_item[gid[5:]]
            cell.outputs = [
                new_output("stream", name="stdout", text="\n".join(lines) + "\n"),
                new_output("execute_result", data={"text/plain": repr(round(score, 4))}, execution_count=None),
            ]
        resources.setdefault("course", {})["results"] = result
        return nb, resources
