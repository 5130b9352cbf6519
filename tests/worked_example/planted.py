"""Planted mistakes and correct alternatives for w9l1_vit (tests/test_grading.py grades each).

A tuple (old, new) edits the reference cell (one realistic slip); a string is a whole cell.
"""
from tests.planted import SHAPES_TODO, attach_catches

PLANTED = {
    "patchify": {
        "wrong": {
            "channels_last_in_a_patch": ("x.permute(0, 2, 3, 1, 4, 5)", "x.permute(0, 2, 3, 4, 5, 1)"),
            "patch_and_pixel_axes_swapped": (".reshape(B, -1, C * P * P)", ".reshape(B, C * P * P, -1)"),
        },
        "right": {
            "by_unfold": '''def patchify(images, P):
    """(B, C, H, W) -> (B, N, C*P*P) with torch's unfold."""
    return torch.nn.functional.unfold(images, P, stride=P).transpose(1, 2)
''',
        },
    },
    "PatchClassifier": {
        "wrong": {
            "no_positions": (" + self.pos ", " "),
            "head_on_every_patch": (".mean(1))", ")"),
        },
        "right": {
            "sum_over_count": (".mean(1))", ".sum(1) / h.shape[1])"),
        },
    },
}

# The checks that catch each planted mistake: exactly these fail, every other check passes.
CATCHES = {
    "patchify": {"channels_last_in_a_patch": {"values"}, "patch_and_pixel_axes_swapped": {"shapes", "values"}},
    "PatchClassifier": {"no_positions": {"values"}, "head_on_every_patch": {"shapes", "values"}},
}
attach_catches(PLANTED, CATCHES)

# Checks that no planted mistake above fails on its own, and why.
NOT_ISOLATED = {("patchify", "shapes"): SHAPES_TODO, ("PatchClassifier", "shapes"): SHAPES_TODO}

# Training failures: code that passes every check of its item, yet cannot learn ("fails": the experiments lost).
TRAINING = {
    "patch_shuffle_on_the_batch_axis": {  # meant as augmentation over the patches (dim 1); in training mode only
        "item": "PatchClassifier", "fails": ["mnist_vit"],
        "variant": ("        return self.head(", "        if self.training:\n"
                    "            h = h[torch.randperm(h.shape[0], device=h.device)]\n        return self.head("),
    },
}
