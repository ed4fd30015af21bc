"""The op table against tensorops_native and the wire contract: every native argument is
reachable over the wire under its own name, and the clients have the same signatures."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

import tensorops
import tensorops_native as tn
from tensorops._operations import Operations
from tensorops.protocol import codec, wire
from tensorops.v1 import tensorops_pb2 as pb
from tensorops_server import errors, optable

TABLE = optable.build_table()
CLIENT_ONLY = {"timeout", "metadata", "self"}
# Not a wire field: the array a result is written into (the server passes it for shared memory).
NATIVE_ONLY = {"out"}


def test_table_serves_every_native_operation_of_the_wire_table():
    for name in wire.OPERATIONS:
        assert (name in TABLE) == hasattr(tn, name), name
    for name in tn.OPERATIONS:
        assert name in wire.OPERATIONS or name == "normalize", f"{name} has no RPC"


@pytest.mark.parametrize("name", sorted(TABLE))
def test_request_fields_are_the_native_arguments(name):
    entry = TABLE[name]
    fields = {f.name for f in entry.op.request_class.DESCRIPTOR.fields}
    native = set(inspect.signature(entry.native).parameters) - NATIVE_ONLY
    if entry.op.layout:
        assert "format" in native
        fields.add("format")
    assert fields == native
    for tensor in entry.op.layout:
        assert tensor in entry.op.request_codec.numbers


@pytest.mark.parametrize("name", sorted(wire.OPERATIONS))
def test_client_methods_have_the_native_signature(name):
    client = inspect.signature(getattr(Operations, name)).parameters
    native = inspect.signature(getattr(tn, name)).parameters
    if name == "quantized_inner_product":  # (a, b) one-shot or (b) session: see its docstring
        client = {k: v for k, v in client.items() if k not in ("arrays", "max_m")}
        native = {k: v for k, v in native.items() if k not in ("a", "b")}
    client = {k: (v.kind, v.default) for k, v in client.items() if k not in CLIENT_ONLY}
    # out= too (the clients copy a result into it), but for shuffle's pair of results
    native = {k: (v.kind, v.default) for k, v in native.items() if not (k == "out" and name == "shuffle")}
    assert client == native


def test_session_constructor_has_the_native_signature():
    client = inspect.signature(Operations.QuantizedInnerProduct).parameters
    # state=: the memory the server gives a session's context, not an argument of the call
    native = {k: v for k, v in inspect.signature(tn.QuantizedInnerProduct).parameters.items() if k != "state"}
    assert {k: (v.kind, v.default) for k, v in client.items() if k not in CLIENT_ONLY} == {
        k: (v.kind, v.default) for k, v in native.items()
    }
    fields = {f.name for f in pb.CreateQuantizedInnerProductRequest.DESCRIPTOR.fields}
    assert fields == set(native)


def test_enums_match_the_native_names_and_values():
    unary = wire.enum_names(pb.UnaryOp.DESCRIPTOR)
    assert [unary[k] for k in sorted(unary)] == sorted(tn.UNARY_OPS, key=tn.UNARY_OPS.get)
    eltwise = wire.enum_names(pb.EltwiseOp.DESCRIPTOR)
    assert [eltwise[k] for k in sorted(eltwise)] == sorted(tn.ELTWISE_OPS, key=tn.ELTWISE_OPS.get)
    assert wire.enum_names(pb.ShuffleType.DESCRIPTOR) == {1: "split", 2: "interleave"}
    for name, value in tn.UNARY_OPS.items():
        assert wire.encode_enum(pb.UnaryOp.DESCRIPTOR, name, "op") == wire.encode_enum(
            pb.UnaryOp.DESCRIPTOR, value, "op"
        )


def _decoded(op, message, tensors=None):
    raw = op.request_codec.encode(message, tensors or {})
    return op.request_codec.decode(raw)


def test_unset_fields_take_the_native_defaults():
    entry = TABLE["softmax"]
    x = codec.encode_tensor(np.zeros(3, np.float32), "x")
    kwargs, fmt = entry.arguments(_decoded(entry.op, pb.SoftmaxRequest(), {"x": x}), None)
    assert list(kwargs) == ["x"] and fmt == 0  # axis: the native default
    entry = TABLE["shuffle"]
    decoded = _decoded(
        entry.op,
        pb.ShuffleRequest(type=pb.SHUFFLE_TYPE_SPLIT),
        {"x0": codec.encode_tensor([[1.0]], "x0", 2), "x1": codec.encode_tensor([[1.0]], "x1")},
    )
    kwargs, fmt = entry.arguments(decoded, None)
    assert kwargs["type"] == "split" and "channels" not in kwargs
    assert kwargs["format"] == "nhwc" and fmt == 2


def _required_fields():
    """(operation, field) for every request field whose native argument has no default."""
    cases = [
        (name, f.name)
        for name, entry in sorted(TABLE.items())
        for f in entry.op.request_class.DESCRIPTOR.fields
        if f.name not in entry.op.defaults and not (f.is_repeated and f.message_type)
    ]  # eltwise's inputs: []
    if hasattr(tn, "QuantizedInnerProduct"):
        create = optable.Entry(wire.CREATE_SESSION, tn.QuantizedInnerProduct)
        cases += [
            ("session", f.name) for f in create.op.request_class.DESCRIPTOR.fields if f.name not in create.op.defaults
        ]
    return cases


@pytest.mark.parametrize("name,field", _required_fields())
def test_every_unset_required_field_is_refused_by_name(name, field):
    """Left unset, a field without a default is INVALID_ARGUMENT naming it, in the wire's
    terms (never the native function's reaction to None)."""
    entry = TABLE[name] if name != "session" else optable.Entry(wire.CREATE_SESSION, tn.QuantizedInnerProduct)
    # the row as if every other argument had a default
    names = [f.name for f in entry.op.request_class.DESCRIPTOR.fields]
    only = dataclasses.replace(entry.op, signature="*, " + ", ".join(n if n == field else f"{n}=None" for n in names))
    with pytest.raises(errors.Failure) as err:
        optable.native_arguments(only, _decoded(only, only.request_class()), None)
    assert err.value.field == field and err.value.code.name == "INVALID_ARGUMENT"
    f = entry.op.request_class.DESCRIPTOR.fields_by_name[field]
    if f.enum_type is not None:
        assert err.value.message.startswith("required: expected one of ") and "(1)" in err.value.message
        assert err.value.message.endswith(f"got 0 ({f.enum_type.values_by_number[0].name})")
    elif f.message_type is not None:
        assert err.value.message == f"required tensor `{field}` is missing"
    else:
        assert err.value.message.startswith(f"required field `{field}` is missing")
    assert field in {f.name for f in entry.op.request_class.DESCRIPTOR.fields}


@pytest.mark.parametrize("enum,number", [(pb.UnaryOp, 99), (pb.EltwiseOp, 5), (pb.ShuffleType, 3), (pb.Activation, 18)])
def test_unknown_enum_numbers_are_refused_in_wire_terms(enum, number):
    with pytest.raises(errors.Failure) as err:
        optable.enum_argument(enum.DESCRIPTOR, number, "op", required=False)
    listed = ", ".join(f"{v.name} ({v.number})" for v in enum.DESCRIPTOR.values if v.number)
    assert err.value.message == f"expected one of {listed}, got {number}"
    assert optable.enum_argument(enum.DESCRIPTOR, 0, "op", required=False) is None  # has a default: not given


def test_layout_tensors_must_agree_on_the_format():
    entry = TABLE["shuffle"]
    decoded = _decoded(
        entry.op,
        pb.ShuffleRequest(type=1),
        {"x0": codec.encode_tensor([[1.0]], "x0", 1), "x1": codec.encode_tensor([[1.0]], "x1", 2)},
    )
    with pytest.raises(Exception) as err:
        entry.arguments(decoded, None)
    assert err.value.field == "x1.format"


def test_public_names():
    assert {"Client", "LocalClient", "TensorOpsError", "InvalidArgumentError", "NotFoundError"} <= set(
        tensorops.__all__
    )
