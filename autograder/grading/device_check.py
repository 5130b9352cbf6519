"""The device check: the same grade on a CPU grader and a GPU grader.

A tensor an item creates on the CPU (`torch.arange(T)`, `causal_mask(T)` without its device) works while every
input is on the CPU and crashes once the inputs are on a GPU. So every grader runs each item's `shapes` check twice:
once as the suite wrote it, on the CPU, and once with every tensor the check sends (and every module it builds) on
torch's `meta` device, which every machine has. A meta tensor has a shape, a dtype and a device but no data, and
mixing it with a CPU tensor raises as mixing a CUDA one does (`Tensor on device cpu is not on the expected device
meta!`), so a device bug loses that item's shapes check, and only it, on any grader. What comes back from meta has
no values (protocol.carried sends zeros in their place): the meta run checks shapes, dtypes and devices only, which
is all a shapes check looks at.

The checks themselves (values, gradients, properties) run on the CPU on every grader, so that no score depends on the
grader's hardware; experiments train on the grader's device (`--device`, CUDA where there is one).

Meta is a partial stand-in, measured (torch 2.14): element-wise ops, cat, stack, masked_fill and where refuse a CPU
tensor beside a meta one, as on CUDA, which covers the usual device slips (a mask, positions or offsets made on the
CPU); matmul, linear, bmm, embedding and index ops do not check there, and a CPU tensor meeting a meta one in them
passes. A 0-dim CPU tensor is a scalar on both. In the meta run only an error that mixes devices counts
(MIXED_DEVICES); any other error of the student's code there (an op without a meta kernel, `.item()`, a shape that
depends on values) is no verdict, and the run passes, since the CPU run of the same cases judged everything else.
An item whose checks cannot run on meta at all (they read values after training) sets `device_check: false` in
course.yaml with the reason beside it, and keeps its shapes check on the CPU only.
"""
import pytest

from autograder.course.config import load_course
from autograder.notebooks.public_checks import MIXED_DEVICES
from autograder.sandbox.grader_side import StudentRaised

CHECKS_DEVICE = "cpu"    # where values, gradients and properties are checked, on every grader
OTHER_DEVICE = "meta"    # where the shapes check runs a second time
ON_OTHER_DEVICE = (f"every input on torch's {OTHER_DEVICE} device, a GPU's stand-in on every grader: a tensor the item "
                   f"creates goes on its inputs' device (device=x.device)")


class DeviceCheck:
    """Parametrizes each shapes check of an item with `device_check` on: the CPU, then meta (module doc)."""

    def pytest_generate_tests(self, metafunc):
        marker = metafunc.definition.get_closest_marker("item")
        if marker is None or marker.args[1] != "shapes" or "student" not in metafunc.fixturenames:
            return
        aid = metafunc.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
        course = load_course()
        spec = course.assignments[aid].items.get(marker.args[0]) if aid in course.assignments else None
        if spec is not None and spec.device_check:
            metafunc.parametrize("student", [CHECKS_DEVICE, OTHER_DEVICE], indirect=True,
                                 ids=[CHECKS_DEVICE, OTHER_DEVICE])


    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem):
        """The meta run judges devices only: an error of the student's code there that is no mixing of devices (an
        op meta cannot run, `.item()`, data-dependent shapes) passes, since the CPU run of the same cases judged the
        rest."""
        try:
            return (yield)
        except StudentRaised as e:
            if placement_of(pyfuncitem) != OTHER_DEVICE or MIXED_DEVICES.search(str(e)):
                raise
            return True


def placement_of(test) -> str:
    """The device a collected test's student runs on."""
    callspec = getattr(test, "callspec", None)
    return callspec.params.get("student", CHECKS_DEVICE) if callspec else CHECKS_DEVICE


def placement(request: pytest.FixtureRequest) -> str:
    """The device a test's student runs on: the parametrized one, else the CPU."""
    return getattr(request, "param", CHECKS_DEVICE)
