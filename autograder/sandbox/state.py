"""Copy a module's state from a list of tensors, by registration order and shape.

The spec fixes the order in which each graded module registers its parameters and buffers, so a list of
tensors in that order is enough to move weights between the student's module and the reference's. Written
once for the grader and the student's process alike: child/helpers.py loads this file by path (it never
imports the autograder package), so it may import nothing but torch.
"""
import torch


class StateMismatch(ValueError):
    """The tensors do not fit the module's state one by one."""

    def __init__(self, module_shapes, value_shapes):
        self.module_shapes, self.value_shapes = module_shapes, value_shapes
        super().__init__(f"the module's state has shapes {module_shapes}, the tensors given have {value_shapes}")


def assign_state(module, values):
    """Copy `values` into module.state_dict() in order (device and dtype follow the module); StateMismatch on a
    misfit."""
    targets = list(module.state_dict().values())
    module_shapes, value_shapes = [tuple(t.shape) for t in targets], [tuple(v.shape) for v in values]
    if module_shapes != value_shapes:
        raise StateMismatch(module_shapes, value_shapes)
    with torch.no_grad():
        for target, value in zip(targets, values, strict=True):
            target.copy_(value.to(target.device, target.dtype))
    return module
