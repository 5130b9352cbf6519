"""The sandbox's protocol without a sandbox: every value kind through the wire both ways, its limits, forgeries."""
import ast
import importlib.util
import sys

import numpy as np
import pytest
import torch

from autograder.course.config import ROOT, Limits
from autograder.sandbox import protocol
from autograder.sandbox.grader_side import Sandbox
from autograder.sandbox.protocol import (
    MAX_ANSWER_BYTES,
    OPS,
    Fresh,
    Opaque,
    ProtocolError,
    Remote,
    Seeded,
    StudentRaised,
    from_grader,
    from_student,
    to_grader,
    to_student,
)
from autograder.sandbox.state import assign_state

CHILD = ROOT / "autograder" / "sandbox" / "child" / "__main__.py"  # loads the student's side as its own package


def on_the_wire(value, tensors):
    """(value, tensors) as the other side reads them: framed, split at the line, parsed, the blob unpacked."""
    data = protocol.frame({"value": value}, protocol.pack({k: protocol.carried(t) for k, t in tensors.items()}))
    line, rest = data.split(b"\n", 1)
    msg, size = protocol.header(line)
    assert size == len(rest)
    return msg["value"], protocol.unpack(rest)


def to_the_student(value, objects=None):
    """`value` as the student's code receives it from the grader."""
    tensors = {}
    sent, received = on_the_wire(to_student(value, tensors), tensors)
    return from_grader(sent, received, objects or {}, assign_state)


def to_the_grader(value, objects=None):
    """`value` as the grader reads it back from the student's process."""
    tensors = {}
    sent, received = on_the_wire(to_grader(value, tensors, {} if objects is None else objects), tensors)
    return from_student(sent, received)


# --- grader to student -----------------------------------------------------------------------------

def test_plain_values_arrive_as_they_are():
    assert to_the_student([None, True, 3, 2.5, "text"]) == [None, True, 3, 2.5, "text"]


def test_a_tensor_arrives_with_its_values_dtype_and_device():
    x = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    got = to_the_student(x)
    assert torch.equal(got, x) and got.dtype == torch.float64 and got.device.type == "cpu"
    assert not got.requires_grad


def test_a_tensor_marked_for_grad_arrives_requiring_grad():
    tensors = {}
    sent = to_student([torch.ones(2)], tensors)
    sent["list"][0]["grad"] = True  # what Student.grad marks
    got = from_grader(*on_the_wire(sent, tensors), {}, assign_state)
    assert got[0].requires_grad and got[0].tolist() == [1.0, 1.0]


def test_containers_keep_their_kind_and_nesting():
    got = to_the_student((1, [2, {"a": (3,), "b": []}], {}))
    assert got == (1, [2, {"a": (3,), "b": []}], {})
    assert isinstance(got, tuple) and isinstance(got[1], list) and isinstance(got[1][1]["a"], tuple)


def test_a_handle_arrives_as_the_students_own_object():
    module = torch.nn.Linear(2, 2)
    got = to_the_student({"m": Remote("h0", "Linear")}, objects={"h0": module})
    assert got["m"] is module


def test_a_seeded_generator_draws_as_a_generator_with_that_seed():
    got = to_the_student(Seeded(7))
    assert isinstance(got, torch.Generator)
    assert torch.equal(torch.rand(5, generator=got), torch.rand(5, generator=torch.Generator().manual_seed(7)))


def test_a_live_generator_is_refused():
    with pytest.raises(TypeError, match="Seeded"):
        to_student(torch.Generator(), {})


def test_dtypes_and_devices_arrive_as_torch_objects():
    assert to_the_student([torch.float16, torch.int64, torch.bool]) == [torch.float16, torch.int64, torch.bool]
    assert to_the_student(torch.device("cpu")) == torch.device("cpu")


def test_a_fresh_module_is_built_there_with_the_graders_weights():
    weight, bias = torch.arange(6.0).reshape(2, 3), torch.tensor([0.5, -0.5])
    got = to_the_student(Fresh("Linear", 3, 2, bias=True, state=[weight, bias]))
    assert isinstance(got, torch.nn.Linear) and (got.in_features, got.out_features) == (3, 2)
    assert torch.equal(got.weight.detach(), weight) and torch.equal(got.bias.detach(), bias)


# --- student to grader -----------------------------------------------------------------------------

def test_a_tensor_comes_back_with_its_dtype_and_the_device_it_was_on():
    x = torch.arange(4, dtype=torch.int32)
    got = to_the_grader(x)
    assert torch.equal(got, x) and got.dtype == torch.int32 and got.student_device == "cpu"


def test_a_tensor_that_needs_grad_comes_back_as_plain_data():
    x = torch.ones(3, requires_grad=True) * 2
    got = to_the_grader(x)
    assert got.tolist() == [2.0, 2.0, 2.0] and not got.requires_grad and got.grad_fn is None


def test_a_numpy_array_comes_back_as_a_tensor_marked_numpy():
    got = to_the_grader(np.array([[1.5, 2.5]], dtype=np.float32))
    assert got.tolist() == [[1.5, 2.5]] and got.dtype == torch.float32 and got.student_device == "numpy"


def test_containers_come_back_with_string_keys():
    assert to_the_grader((1, [2.0, None], {3: "x", "y": (True,)})) == (1, [2.0, None], {"3": "x", "y": (True,)})


def test_a_module_stays_in_the_students_process_and_comes_back_as_a_handle():
    module, objects = torch.nn.GELU(), {}
    got = to_the_grader([module], objects)
    assert isinstance(got[0], Remote) and got[0].type_name == "GELU" and repr(got[0]) == "<student GELU>"
    assert objects[got[0].handle] is module


def test_what_cannot_travel_comes_back_described():
    class Odd:
        def __repr__(self):
            return "odd\x1b[2J"

    got = to_the_grader(Odd())
    assert isinstance(got, Opaque) and repr(got) == "Odd: odd\\x1b[2J"  # the escape shown, never acted on


def test_a_repr_that_raises_is_described_anyway():
    class Hostile:
        def __repr__(self):
            raise SystemExit(1)

    assert repr(to_the_grader(Hostile())) == "Hostile: <unprintable>"


# --- limits ----------------------------------------------------------------------------------------

def test_long_strings_and_long_lists_are_cut():
    got = to_the_grader(["x" * 5000, list(range(100_010))])
    assert got[0] == "x" * 1000
    assert len(got[1]) == 100_000 and got[1][-1] == 99_999


def test_nesting_deeper_than_the_limit_is_described_not_carried():
    value = 0
    for _ in range(10):
        value = [value]
    got = to_the_grader(value)
    for _ in range(7):  # depths 0..6 are carried
        assert isinstance(got, list) and len(got) == 1
        got = got[0]
    assert isinstance(got, Opaque) and got.text == "nested too deeply"


def test_the_answer_limit_is_256_mb():
    assert MAX_ANSWER_BYTES == 256 * 2**20


# --- the wire --------------------------------------------------------------------------------------

def test_a_frame_announces_its_blob():
    data = protocol.frame({"id": 3, "ok": True}, b"abc")
    line, blob = data.split(b"\n", 1)
    assert protocol.header(line) == ({"id": 3, "ok": True, "blob": 3}, 3) and blob == b"abc"
    assert protocol.header(protocol.frame({"progress": "cell"}).rstrip(b"\n")) == ({"progress": "cell", "blob": 0}, 0)


@pytest.mark.parametrize("line", [b"not json", b"[1, 2]", b'"text"', b'{"blob": -1}', b'{"blob": "3"}',
                                  b"[" * 200_000], ids=["not_json", "a_list", "a_string", "negative_blob",
                                                        "text_blob", "nested_to_exhaustion"])
def test_a_line_that_is_not_a_message_is_refused(line):
    with pytest.raises(ProtocolError, match="not the protocol"):
        protocol.header(line)


@pytest.mark.parametrize("value, blob", [
    ({"T": "t9"}, b""),                    # a tensor the blob does not hold
    ({"dict": [1, 2]}, b""),               # a dict that is a list
    ({"tuple": 5}, b""),                   # a tuple that is a number
    ({"T": ["t0"]}, b""),                  # a key that is not a string
    ({"T": "t0"}, b"\x08\x00\x00\x00\x00\x00\x00\x00{not json"),  # safetensors bytes forged
], ids=["missing_tensor", "dict_as_list", "tuple_as_number", "unhashable_key", "forged_blob"])
def test_a_forged_answer_is_the_students_wrong_answer_not_a_grader_crash(value, blob):
    sandbox = Sandbox([], {}, Limits())  # value() reads an answer: no process needed
    with pytest.raises(StudentRaised, match="could not be read back"):
        sandbox.value({"value": value, "blob": blob})


# --- one definition for both sides -----------------------------------------------------------------

def load_child(name):
    """The student's side as its process loads it: __main__.py by path, which loads its folder as package `name`."""
    spec = importlib.util.spec_from_file_location(f"{name}_main", CHILD)
    main = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(main)
    return main.load(name)


def test_every_operation_the_grader_may_ask_has_a_handler_and_no_other():
    child = load_child("sandbox_child_for_ops_test")
    assert {name.removeprefix("op_") for name in vars(child.server.Server) if name.startswith("op_")} == set(OPS)


def test_the_student_side_loads_the_protocol_by_path_from_its_own_folder():
    child = load_child("sandbox_child_for_protocol_test")
    assert child.helpers.PROTOCOL is None
    child.helpers.load_helpers()
    assert child.helpers.PROTOCOL.__file__ == str(ROOT / "autograder" / "sandbox" / "protocol.py")
    assert child.helpers.PROTOCOL.TENSOR == "T" and child.helpers.PROTOCOL.to_grader is not protocol.to_grader
    assert child.server.helpers is child.helpers  # the server reads the same module's PROTOCOL


def test_the_student_side_is_its_own_package_not_the_graders():
    """Started as the zygote starts it (-I, from /), its modules load as the package course_child and no module of
    the grader's package is loaded (the three shared files it loads by path later: the test above)."""
    import subprocess
    import sys
    script = ("import importlib.util, sys\n"
              f"spec = importlib.util.spec_from_file_location('entry', {str(CHILD)!r})\n"
              "entry = importlib.util.module_from_spec(spec); spec.loader.exec_module(entry)\n"
              "entry.load()\n"
              "print(sorted(m for m in sys.modules if m.startswith(('autograder', 'course_'))))\n")
    out = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, cwd="/", check=True)
    loaded = ["course_child", "course_child.fake_gpu", "course_child.helpers", "course_child.isolation",
              "course_child.monitor", "course_child.server", "course_child.tripwire"]
    assert out.stdout.strip() == str(loaded), out.stdout


def test_the_protocol_imports_nothing_of_the_course():
    """The student's process loads it where no course file exists: only the standard library, torch, safetensors."""
    tree = ast.parse((ROOT / "autograder" / "sandbox" / "protocol.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported - set(sys.stdlib_module_names) == {"torch", "safetensors"}, imported
