"""`course check`'s device rule: the test cell of every item whose shapes check runs again on the fake GPU at grading
(course.yaml `device_check`, grading/device_check.py) has a public device check, `chk.device(...)`, so that a device
slip the grade will cost fails in the notebook first, on the student's own machine, GPU or not."""
import nbformat

from autograder.course.config import Assignment
from autograder.notebooks.cells import nbgrader_meta


def device_check_problems(aid: str, assignment: Assignment) -> list[str]:
    """One line per item checked on the fake GPU whose test cell calls no `.device(...)`."""
    from autograder.apps.new import TODO
    from autograder.notebooks.build import notebook_path
    path = notebook_path(aid)
    if not path.is_file():
        return []  # the notebook stage says so
    cells = {nbgrader_meta(c).get("grade_id"): c.source for c in nbformat.read(path, as_version=4).cells}
    # a test cell still to write (TODO(course new)) is listed as such by the first stage
    missing = [item for item, spec in assignment.items.items() if "shapes" in spec.points and spec.device_check
               and ".device(" not in cells.get(f"test_{item}", "") and TODO not in cells.get(f"test_{item}", "")]
    return [f"{aid}: the test cell of '{item}' has no public device check (`chk.device(...)`), but its shapes check "
            f"runs on the fake GPU at grading: add one, or set `device_check: false` in course.yaml with the reason"
            for item in missing]
