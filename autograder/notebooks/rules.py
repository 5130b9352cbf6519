"""The rules cell: what the hidden tests hold every item of a notebook to, written from course.yaml by `course sync`.

One markdown cell per source notebook, right after its introduction, marked `metadata.course.generated = "rules"`:
dtypes, devices (the shapes checks' fake-GPU run, autograder/grading/device_check.py), the notebook's mask convention
beside the other notebooks' (course.yaml `mask_convention`), and the references each item may not call (its
`from_scratch` names, each shown by the first function course.yaml's `oracles` lists for it). Since `course sync`
writes it, a change to course.yaml reaches the notebook's text and cannot drift from what the grader does.
"""
from autograder.course.config import Assignment, Course, load_course

RULES = "rules"  # the cell's metadata.course.generated


def rules_markdown(aid: str, course: Course | None = None) -> str:
    """The rules cell's text for `aid`."""
    course = course or load_course()
    assignment = course.assignment(aid)
    lines = ["### Rules of the hidden tests", "",
             "*Written from the course's configuration (`course.yaml`) by `course sync`: when the grader's rules "
             "change, so does this cell.*", "",
             "* **Names and signatures** exactly as the graded cells give them: the grader imports them by name.",
             "* **dtypes.** Inputs arrive as float32 or float64: return results in the dtype of the inputs.",
             "* **Devices.** The hidden tests run your code on the CPU, then run each item's shapes check once more "
             "with every input on a fake GPU (a `cuda` device that torch's FakeTensorMode makes on any machine, "
             "with no GPU and no values). A tensor you create inside an item goes on the device of its inputs "
             "(`torch.arange(T, device=x.device)`, `torch.zeros(..., device=x.device)`): one made on the CPU, or "
             "taken there with `.cpu()`, loses the item's shapes check wherever it meets the inputs (an addition, a "
             "matrix product, a linear layer, an embedding), as it would crash on Colab's GPU, and the reason names "
             "the line that made it. The test cells run the same check (`chk.device(...)`)." + cpu_only(assignment)]
    if assignment.mask_convention:
        lines.append(f"* **Masks** in this notebook: {assignment.mask_convention}")
        others = [(other, spec.mask_convention) for other, spec in course.assignments.items()
                  if other != aid and spec.mask_convention]
        if others:
            lines.append("  The course's other notebooks say it their own way; code reused from one of them needs its "
                         "mask turned to this one's:")
            lines += [f"  * `{other}`: {text}" for other, text in others]
    forbidden = [(item, spec.from_scratch) for item, spec in assignment.items.items() if spec.from_scratch]
    if forbidden:
        lines.append("* **From scratch.** An item may not call the function it is checked against: calling it, "
                     "however reached (an alias, `torch.ops`, a SciPy or scikit-learn equivalent), scores the whole "
                     "item 0, experiments included.")
        lines += [f"  * `{item}`: " + ", ".join(f"`{shown(course, name, aid)}`" for name in names)
                  for item, names in forbidden]
    return "\n".join(lines)


def cpu_only(assignment: Assignment) -> str:
    """The sentence naming the items whose shapes check has no fake-GPU run (course.yaml `device_check: false`)."""
    items = [f"`{item}`" for item, spec in assignment.items.items() if not spec.device_check]
    return f" ({', '.join(items)}: checked on the CPU only.)" if items else ""


def shown(course: Course, name: str, aid: str) -> str:
    """A from_scratch name as students know it: the first function course.yaml's `oracles` lists for it."""
    parts = (course.oracles_for(aid).get(name) or [name])[0].split(".")
    if len(parts) > 1 and parts[-2][:1].isupper() and parts[-1][:1].islower():  # a class's method: the class
        parts = parts[:-1]
    return ".".join(parts).replace("torch.nn.functional.", "F.").replace("torch.nn.", "nn.")


def sync_rules(aid: str, nb) -> list[str]:
    """The notebook's rules cell written (inserted after the introduction when missing); ['rules'] if it changed."""
    import nbformat
    text = rules_markdown(aid)
    cell = next((c for c in nb.cells if c.metadata.get("course", {}).get("generated") == RULES), None)
    if cell is None:
        cell = nbformat.v4.new_markdown_cell(text, metadata={"course": {"generated": RULES}})
        nb.cells.insert(1, cell)
        return [RULES]
    if cell.source != text:
        cell.source = text
        return [RULES]
    return []
