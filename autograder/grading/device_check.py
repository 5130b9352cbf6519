"""The device check: the same grade on a CPU grader and a GPU grader.

A tensor an item creates on the CPU (`torch.arange(T)`, `causal_mask(T)` without its device, a weight taken to the
CPU with `.cpu()`) works while every input is on the CPU and crashes once the inputs are on a GPU. So every grader
runs each item's `shapes` check twice: once as the suite wrote it, on the CPU, and once with every tensor the check
sends (and every module it builds) on a fake GPU: a CUDA device that exists only as torch's FakeTensorMode
(autograder/sandbox/child/fake_gpu.py), on every grader, with or without a GPU, so no score depends on the hardware. A
fake `cuda` tensor has a shape, a dtype and a device but no data, and carries CUDA's device rules: an element-wise op,
`cat`, `masked_fill`, a matrix product, `F.linear`, `bmm`, an embedding or `gather` that meets a CPU tensor raises
(measured, torch 2.14.1), and so does a result left on the CPU; the reason names the line of the graded item's own
cell that made that tensor or moved it to the CPU (and the helper's line, when that line called one that made it),
never only the function it was handed to. A 0-dim CPU tensor is a scalar, as on CUDA. A CPU tensor that an index
of a CUDA tensor uses passes, as on CUDA; a CPU tensor indexed by a CUDA index passes too, where CUDA would raise
(a gap of the fake kernels). What comes back from the fake GPU has no values (protocol.carried sends zeros in their
place): that run checks shapes, dtypes and devices only, which is all a shapes check looks at.

The run is the item's shapes check's (its main cases), not every check's: a device slip costs that one point, as a
mistake is counted once, and the values, gradients and properties cases are not run a second time.

It replaces a run on torch's meta device, which let a `.cpu()` round trip ("Cannot copy out of meta tensor": no
verdict) and a CPU tensor in a matrix product, linear layer, embedding or index through (meta checks no devices
there). The checks themselves (values, gradients, properties) run on the CPU on every grader; experiments train on
the grader's device (`--device`, CUDA where there is one).

In the fake run only an error that mixes devices counts (MIXED_DEVICES); any other error of the student's code there
(an op without a fake kernel, `.item()`, a shape that depends on values, a backward pass, which needs a CUDA driver)
is no verdict, and the run passes, since the CPU run of the same cases judged everything else. An item whose shapes
check cannot run there at all (it reads values: a trained model's error, packing's lengths), or that takes no tensor
(sizes, a seed), sets `device_check: false` in course.yaml with the reason beside it, and keeps its shapes check on the
CPU only; an item the fake GPU gave no verdict on gets a note for the TA (DeviceCheck.notes), and the reference may
have none (tests/test_grading.py).
"""
import pytest

from autograder.course.config import load_course
from autograder.notebooks.public_checks import MIXED_DEVICES
from autograder.sandbox.grader_side import StudentRaised

CHECKS_DEVICE = "cpu"    # where values, gradients and properties are checked, on every grader
OTHER_DEVICE = "cuda"    # where the shapes check runs a second time: a fake GPU (sandbox/child/fake_gpu.py)
NO_VERDICT = "no verdict on devices: the fake GPU could not run"  # a TA note's words (DeviceCheck.notes)
ON_OTHER_DEVICE = ("every input on a fake GPU (cuda, torch's FakeTensorMode, on every grader): a tensor the item "
                   "creates goes on its inputs' device (device=x.device)")


class DeviceCheck:
    """Parametrizes each shapes check of an item with `device_check` on: the CPU, then the fake GPU (module doc).

    `notes` (the session's notes for the TA) gets a line for each item whose fake run gave no verdict, with the
    error that stopped it: on the reference solution, such an item belongs in course.yaml with `device_check: false`
    and that reason (tests/test_grading.py holds the references to it)."""

    def __init__(self, notes=None):
        self.notes = notes if notes is not None else []

    def pytest_generate_tests(self, metafunc):
        marker = metafunc.definition.get_closest_marker("item")
        if marker is None or marker.args[1] != "shapes" or "student" not in metafunc.fixturenames:
            return
        aid = metafunc.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
        course = load_course()
        spec = course.assignments[aid].items.get(marker.args[0]) if aid in course.assignments else None
        if spec is not None and spec.device_check:
            metafunc.parametrize("student", [CHECKS_DEVICE, OTHER_DEVICE], indirect=True,
                                 ids=[CHECKS_DEVICE, "fake_cuda"])


    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem):
        """The fake GPU's run judges devices only: an error of the student's code there that is no mixing of devices
        (an op without a fake kernel, `.item()`, data-dependent shapes) passes, since the CPU run of the same cases
        judged the rest."""
        try:
            return (yield)
        except StudentRaised as e:
            if placement_of(pyfuncitem) != OTHER_DEVICE or MIXED_DEVICES.search(str(e)):
                raise
            item = pyfuncitem.get_closest_marker("item").args[0]
            self.notes.append(f"{NO_VERDICT} '{item}' ({str(e).splitlines()[0][:160]})")
            return True


def placement_of(test) -> str:
    """The device a collected test's student runs on."""
    callspec = getattr(test, "callspec", None)
    return callspec.params.get("student", CHECKS_DEVICE) if callspec else CHECKS_DEVICE


def placement(request: pytest.FixtureRequest) -> str:
    """The device a test's student runs on: the parametrized one, else the CPU."""
    return getattr(request, "param", CHECKS_DEVICE)
