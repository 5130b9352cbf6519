"""autograder/grading/checks.py: every checker passes the right answer and fails a wrong one with a message that
says what was expected and what came back, its arguments in the order (name, ref, got)."""
import math
from types import SimpleNamespace

import pytest
import torch

from autograder.grading.checks import (
    SCALE_MISSING,
    Fail,
    attention_oracle,
    check_close,
    check_device,
    check_number,
    check_shape,
    check_signature,
    check_tensor,
    check_true,
    check_tuple,
    copy_state,
    int_seed,
    parse_signature,
    randn,
    sinusoid_table,
    tol,
)
from autograder.sandbox.grader_side import Opaque, Remote


def fails(fn, *args, **kwargs):
    """The message of the Fail that fn(*args, **kwargs) raises."""
    with pytest.raises(Fail) as caught:
        fn(*args, **kwargs)
    return str(caught.value)


def on(device, t):
    """`t` as an answer the sandbox says was on `device` (the codec marks each tensor that comes back)."""
    t.student_device = device
    return t


# --- structure: tuples, tensors, shapes, dtypes, devices ------------------------------------------

def test_check_true_fails_with_its_message_only_when_false():
    check_true(1 == 1, "never shown")
    assert fails(check_true, False, "the weights do not sum to 1") == "the weights do not sum to 1"


def test_check_tuple_takes_a_tuple_or_list_of_the_length_and_names_what_came_back():
    pair = (torch.zeros(1), torch.ones(1))
    assert check_tuple("attention", 2, pair) is pair
    assert check_tuple("attention", 2, list(pair)) == list(pair)
    assert fails(check_tuple, "attention", 2, torch.zeros(3, 4)) == \
        "'attention' returned a tensor of shape (3, 4), expected a tuple of 2"
    assert fails(check_tuple, "attention", 2, (1, 2, 3)) == \
        "'attention' returned tuple (1, 2, 3), expected a tuple of 2"


def test_check_tensor_passes_ref_shape_and_dtype():
    ref = torch.zeros(2, 3)
    check_tensor("out", ref, torch.ones(2, 3))
    check_tensor("out", ref, torch.ones(2, 3, dtype=torch.float64), dtype=False)


def test_check_tensor_says_the_expected_shape_when_no_tensor_came_back():
    assert fails(check_tensor, "out", torch.zeros(2, 3), [[0.0] * 3] * 2) == \
        "'out' is list [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], expected a tensor of shape (2, 3)"
    assert fails(check_tensor, "out", torch.zeros(2, 3), None) == \
        "'out' is NoneType None, expected a tensor of shape (2, 3)"
    # what could not come back as data is described as the student's code made it
    assert fails(check_tensor, "out", torch.zeros(2, 3), Remote(1, "Linear")) == \
        "'out' is <student Linear>, expected a tensor of shape (2, 3)"
    assert fails(check_tensor, "out", torch.zeros(2, 3), Opaque("<generator object f>")) == \
        "'out' is <generator object f>, expected a tensor of shape (2, 3)"


def test_check_tensor_reads_got_and_ref_in_that_order():
    # the dtype message proves the order: what came back is `got`, what was expected is `ref`
    assert fails(check_tensor, "out", torch.zeros(2, dtype=torch.float32), torch.zeros(2, dtype=torch.float64)) == \
        "'out' has dtype float64, expected float32"
    assert fails(check_tensor, "out", torch.zeros(2, 3), torch.zeros(3, 2)) == "'out' has shape (3, 2), expected (2, 3)"


def test_check_shape_takes_a_tensor_or_a_shape_as_ref():
    check_shape("out", (4, 5), torch.zeros(4, 5))
    check_shape("out", torch.zeros(4, 5), torch.zeros(4, 5))
    assert fails(check_shape, "out", (4, 5), torch.zeros(5, 4)) == "'out' has shape (5, 4), expected (4, 5)"
    assert fails(check_shape, "out", torch.zeros(4), torch.zeros(4, 1)) == "'out' has shape (4, 1), expected (4,)"


def test_check_device_compares_the_device_type_the_answer_was_on():
    check_device("out", "cuda", on("cuda:0", torch.zeros(1)))  # the index does not count
    check_device("out", "cpu", torch.zeros(1))  # an answer without a mark was on the CPU
    assert fails(check_device, "out", "cuda", on("cpu", torch.zeros(1))) == \
        "'out' is on cpu, expected cuda (the input's device)"
    assert fails(check_tensor, "out", torch.zeros(1), on("cpu", torch.zeros(1)), device="cuda:0") == \
        "'out' is on cpu, expected cuda:0 (the input's device)"


# --- values ----------------------------------------------------------------------------------------

def test_check_close_passes_within_the_absolute_and_the_relative_tolerance():
    ref = torch.tensor([1.0, 1000.0])
    check_close("out", ref, ref + torch.tensor([0.5e-5, 0.0]))
    check_close("out", ref, ref + torch.tensor([0.0, 5e-3]), atol=1e-5, rtol=1e-5)  # 5e-3 <= 1e-5 + 1e-5 * 1000
    assert "max |out - the reference| = 0.02" in fails(check_close, "out", ref, ref + torch.tensor([0.0, 2e-2]))


def test_check_close_names_the_gap_the_worst_entry_and_the_tolerance():
    ref = torch.zeros(2, 3)
    got = ref.clone()
    got[1, 2], got[0, 0] = 0.5, 0.1
    message = fails(check_close, "attention", ref, got, atol=1e-4)
    assert message.startswith("max |attention - the reference| = 0.5 at index (1, 2) (tolerance 0.0001)"), message


def test_check_close_names_the_oracle_the_dims_and_the_case():
    ref, got = torch.zeros(2, 3), torch.zeros(2, 3)
    got[1, 2] = 1.0
    message = fails(check_close, "out", ref, got, oracle="F.scaled_dot_product_attention", dims=("batch", "query"),
                    case="with a mask")
    assert message.startswith("max |out - F.scaled_dot_product_attention| = 1 at batch 1, query 2 (tolerance 1e-05), "
                              "with a mask"), message
    # a dim named None is left out of the position
    assert "= 1 at query 2 (" in fails(check_close, "out", ref, got, dims=(None, "query"))


def test_check_close_checks_the_shape_before_the_values():
    assert fails(check_close, "out", torch.zeros(2, 3), torch.zeros(3)) == "'out' has shape (3,), expected (2, 3)"


def test_check_close_reports_a_non_finite_answer_where_the_reference_is_finite():
    got = torch.zeros(2, 2)
    got[0, 1] = float("nan")
    assert fails(check_close, "out", torch.zeros(2, 2), got, dims=("row", "col")) == \
        "'out' has a non-finite value (nan) at row 0, col 1"
    got[0, 1] = float("-inf")
    assert fails(check_close, "out", torch.zeros(2, 2), got, case="case 3").startswith(
        "'out' has a non-finite value (-inf) at index (0, 1), case 3")


def test_check_close_accepts_infinities_where_the_reference_has_the_same_ones():
    ref = torch.tensor([float("-inf"), 1.0])
    check_close("scores", ref, ref.clone())
    assert "max |scores" in fails(check_close, "scores", ref, torch.tensor([float("inf"), 1.0]))


def test_check_close_names_the_known_mistake_the_answer_reproduces():
    Q = randn(torch.Generator().manual_seed(0), 2, 5, 8)
    ref, _ = attention_oracle(Q, Q, Q)
    unscaled_answer, _ = attention_oracle(Q * math.sqrt(8), Q, Q)  # attention without the 1/sqrt(d_k) scale
    mistakes = {SCALE_MISSING: unscaled_answer}
    assert fails(check_close, "out", ref, unscaled_answer, mistakes=mistakes).endswith(f": {SCALE_MISSING}")
    other = fails(check_close, "out", ref, ref + 1, mistakes=mistakes)
    assert SCALE_MISSING not in other and other.endswith("(tolerance 1e-05)"), other


def test_check_number_takes_ints_floats_and_one_element_tensors():
    check_number("loss", 2.0, 2)
    check_number("loss", 2.0, 2.0 + 1e-7)
    check_number("loss", 1e6, 1e6 + 0.5)  # the tolerance is relative past 1
    check_number("loss", 0.25, torch.tensor([0.25]))
    assert fails(check_number, "loss", 1.0, 0.5) == "'loss' is 0.5, expected 1"
    assert fails(check_number, "loss", 1e6, 1e6 + 5) == "'loss' is 1000005, expected 1000000"  # 5 > 1e-6 * 1e6
    assert fails(check_number, "loss", 1.0, True) == "'loss' is bool True, expected a number"
    assert fails(check_number, "loss", 1.0, torch.zeros(2)) == "'loss' is a tensor of shape (2,), expected a number"
    assert fails(check_number, "loss", 1.0, "1.0") == "'loss' is str 1.0, expected a number"


# --- signatures ----------------------------------------------------------------------------------

def params(**spec):
    """The sandbox's answer for a function's parameters (sandbox_child's op_signature): [name, kind, default repr]."""
    return [[name, kind, default] for name, (kind, default) in spec.items()]


P, VAR, KW = "POSITIONAL_OR_KEYWORD", "VAR_POSITIONAL", "VAR_KEYWORD"


def function(**spec):
    return {"kind": "function", "params": params(**spec)}


def test_parse_signature_reads_names_and_defaults():
    assert parse_signature("(Q, K, V, mask=None)") == [("Q", None), ("K", None), ("V", None), ("mask", "None")]
    assert parse_signature("( )") == []


def test_check_signature_passes_the_spec_and_extra_optional_parameters():
    check_signature("attention", "(Q, K, V, mask=None)", function(Q=(P, ""), K=(P, ""), V=(P, ""), mask=(P, "None")))
    check_signature("attention", "(Q, K, V)", function(Q=(P, ""), K=(P, ""), V=(P, ""), scale=(P, "1.0")))
    check_signature("attention", "(Q, K, V)", function(Q=(P, ""), args=(VAR, ""), kwargs=(KW, "")))


def test_check_signature_says_the_parameters_it_got_and_the_spec():
    got = function(Q=(P, ""), V=(P, ""), K=(P, ""))
    assert fails(check_signature, "attention", "(Q, K, V)", got) == \
        "'attention' has parameters (Q, V, K), expected (Q, K, V)"
    got = function(Q=(P, ""), K=(P, ""), V=(P, ""), scale=(P, ""))
    assert fails(check_signature, "attention", "(Q, K, V)", got) == \
        "'attention' has extra required parameters (scale); only optional ones may be added to (Q, K, V)"


def test_check_signature_needs_a_function_or_class_and_its_methods():
    assert fails(check_signature, "f", "(x)", {"kind": "int"}) == "'f' is not a function or class (it is int)"
    assert fails(check_signature, "f", "(x)", None) == "'f' is not a function or class (it is None)"
    assert fails(check_signature, "f", "(x)", {"kind": "function", "params": None}) == \
        "the signature of 'f' cannot be read"
    block = {"kind": "class", "params": params(d=(P, "")), "methods": {"forward": params(y=(P, ""))}}
    check_signature("Block", "(d)", {**block, "methods": {"forward": params(x=(P, ""))}}, {"forward": "(x)"})
    assert fails(check_signature, "Block", "(d)", block, {"forward": "(x)"}) == \
        "'Block.forward' has parameters (y), expected (x)"
    assert fails(check_signature, "Block", "(d)", {**block, "methods": {}}, {"forward": "(x)"}) == \
        "'Block' has no method 'forward'"


# --- shared inputs, state and oracles --------------------------------------------------------------

def test_tol_is_tight_for_float64_and_looser_on_cuda():
    cpu, cuda = SimpleNamespace(device="cpu"), SimpleNamespace(device="cuda")  # where the student's code runs
    assert tol(cpu, torch.float64) == tol(cuda, torch.float64) == 1e-10
    assert tol(cpu, torch.float32) == 1e-5
    assert tol(cuda, torch.float32) == 1e-3


def test_inputs_come_from_the_checks_generator_only():
    a = randn(torch.Generator().manual_seed(3), 2, 3)
    torch.rand(10)  # drawing from the global generator must not matter
    b = randn(torch.Generator().manual_seed(3), 2, 3)
    assert torch.equal(a, b) and a.dtype == torch.float32 and a.shape == (2, 3)
    assert randn(torch.Generator().manual_seed(3), 2, dtype=torch.float64).dtype == torch.float64
    seeds = {int_seed(torch.Generator().manual_seed(s)) for s in range(5)}
    assert len(seeds) == 5 and all(0 <= s < 2**31 - 1 for s in seeds)
    assert int_seed(torch.Generator().manual_seed(1)) == int_seed(torch.Generator().manual_seed(1))


def test_copy_state_fills_a_module_by_order_and_shape():
    module = torch.nn.Linear(3, 2)
    weight, bias = torch.arange(6.0).reshape(2, 3), torch.tensor([7.0, 8.0])
    copy_state("Linear", [weight, bias], module)
    assert torch.equal(module.weight.detach(), weight) and torch.equal(module.bias.detach(), bias)


def test_copy_state_names_the_first_tensor_that_differs_even_in_a_short_list():
    message = fails(copy_state, "EncoderBlock", [torch.zeros(2, 3)], torch.nn.Linear(3, 2), "WQ, WK, WV, WO")
    assert message == "EncoderBlock has 1 parameter tensor, expected 2; tensor 1 has shape none, expected (2,) " \
                      "(WQ, WK, WV, WO)", message


def test_copy_state_points_at_the_first_differing_tensor_of_a_long_list():
    module = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(5)])  # 10 tensors
    tensors = [p.detach().clone() for p in module.parameters()]
    tensors[3] = torch.zeros(4)
    message = fails(copy_state, "Stack", tensors, module)
    assert message == "Stack has 10 parameter tensors, expected 10; tensor 3 has shape (4,), expected (2,)", message


def test_attention_oracle_is_softmax_of_scaled_scores_with_either_mask_convention():
    g = torch.Generator().manual_seed(0)
    Q, K, V = (randn(g, *shape, dtype=torch.float64) for shape in ((1, 3, 4), (1, 5, 4), (1, 5, 2)))
    scores = torch.einsum("bqd,bkd->bqk", Q, K) / 2.0  # sqrt(d_k) = 2
    out, weights = attention_oracle(Q, K, V)
    assert torch.allclose(weights, scores.softmax(-1)) and torch.allclose(out, weights @ V)
    allowed = torch.tensor([True, True, False, True, False])  # True = may attend
    _, weights = attention_oracle(Q, K, V, mask=allowed)
    assert torch.all(weights[..., ~allowed] == 0)
    assert torch.allclose(weights.sum(-1), torch.ones(1, 3, dtype=torch.float64))
    out_blocked, weights_blocked = attention_oracle(Q, K, V, mask=~allowed, blocked=True)  # True = blocked (w8l4)
    assert torch.equal(weights_blocked, weights) and torch.allclose(out_blocked, weights @ V)


def test_sinusoid_table_follows_the_formula():
    pe = sinusoid_table(3, 4)
    assert pe.dtype == torch.float64 and pe.shape == (3, 4)
    assert torch.equal(pe[0], torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64))
    expected = [math.sin(2), math.cos(2), math.sin(2 / 100), math.cos(2 / 100)]  # 10000^(2/4) = 100
    assert torch.allclose(pe[2], torch.tensor(expected, dtype=torch.float64))
