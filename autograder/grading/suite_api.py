"""What a hidden suite imports, from one module (docs/SUITES.md): checkers, the plugin's argument wrappers and the
reference, and the search for the smallest failing case.

The names live where their job is (checks.py, plugin.py, smallest_case.py); this module only gathers them, so a
suite's one import line names everything it uses.
"""
from autograder.grading.checks import (
    SCALE_MISSING,
    Fail,
    attention_oracle,
    check_close,
    check_device,
    check_number,
    check_shape,
    check_tensor,
    check_true,
    check_tuple,
    copy_state,
    dtype_name,
    first_difference,
    int_seed,
    randn,
    sinusoid_table,
    tol,
    unscaled,
    unscaled_mha,
)
from autograder.grading.plugin import Fresh, Opaque, Remote, Seeded, reference
from autograder.grading.smallest_case import (
    Search,
    attention_case,
    bool_mask,
    dim,
    function_search,
    gradient_search,
    ints,
    smallest_case,
    st,
    with_upstream,
)

__all__ = [
    # checkers: (name, ref, got), each message saying what was expected and what came back
    "Fail", "check_true", "check_tuple", "check_tensor", "check_shape", "check_device", "check_close", "check_number",
    # inputs, tolerances and state
    "randn", "int_seed", "tol", "dtype_name", "copy_state", "first_difference",
    # oracles and the named mistakes a failure is matched against
    "attention_oracle", "sinusoid_table", "SCALE_MISSING", "unscaled", "unscaled_mha",
    # the plugin: the reference solution, and how an argument or a result crosses into the sandbox
    "reference", "Fresh", "Seeded", "Remote", "Opaque",
    # the smallest failing case (Hypothesis underneath)
    "smallest_case", "Search", "function_search", "gradient_search", "with_upstream", "attention_case", "bool_mask",
    "dim", "ints", "st",
]
