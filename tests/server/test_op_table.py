"""The op table against tensorops_native and the wire contract: every native argument is
reachable over the wire under its own name, and the clients have the same signatures."""
from __future__ import annotations

import inspect

import pytest

import tensorops
import tensorops_native as tn
from tensorops import _codec, _wire
from tensorops._operations import Operations
from tensorops.v1 import tensorops_pb2 as pb
from tensorops_server import optable

TABLE = optable.build_table()
CLIENT_ONLY = {"timeout", "metadata", "self"}


def test_table_serves_every_native_operation_of_the_wire_table():
    for name, op in _wire.OPERATIONS.items():
        assert (name in TABLE) == hasattr(tn, name), name
    for name in tn.OPERATIONS:
        assert name in _wire.OPERATIONS or name == "normalize", f"{name} has no RPC"


@pytest.mark.parametrize("name", sorted(TABLE))
def test_request_fields_are_the_native_arguments(name):
    entry = TABLE[name]
    fields = {f.name for f in entry.op.request_class.DESCRIPTOR.fields}
    native = set(inspect.signature(entry.native).parameters)
    if entry.op.layout:
        assert "format" in native
        fields.add("format")
    assert fields == native
    for tensor in entry.op.layout:
        assert tensor in entry.op.request_codec.numbers


@pytest.mark.parametrize("name", sorted(_wire.OPERATIONS))
def test_client_methods_have_the_native_signature(name):
    if not hasattr(tn, name):
        pytest.skip(f"tensorops_native.{name} is not in this build")
    client = inspect.signature(getattr(Operations, name)).parameters
    native = inspect.signature(getattr(tn, name)).parameters
    if name == "quantized_inner_product":  # (a, b) one-shot or (b) session: see its docstring
        client = {k: v for k, v in client.items() if k not in ("arrays", "max_m")}
        native = {k: v for k, v in native.items() if k not in ("a", "b")}
    client = {k: (v.kind, v.default) for k, v in client.items() if k not in CLIENT_ONLY}
    native = {k: (v.kind, v.default) for k, v in native.items()}
    assert client == native


def test_session_constructor_has_the_native_signature():
    if not hasattr(tn, "QuantizedInnerProduct"):
        pytest.skip("tensorops_native.QuantizedInnerProduct is not in this build")
    client = inspect.signature(Operations.QuantizedInnerProduct).parameters
    native = inspect.signature(tn.QuantizedInnerProduct).parameters
    assert {k: (v.kind, v.default) for k, v in client.items() if k not in CLIENT_ONLY} == \
        {k: (v.kind, v.default) for k, v in native.items()}
    fields = {f.name for f in pb.CreateQuantizedInnerProductRequest.DESCRIPTOR.fields}
    assert fields == set(native)


def test_enums_match_the_native_names_and_values():
    unary = _wire.enum_names(pb.UnaryOp.DESCRIPTOR)
    assert [unary[k] for k in sorted(unary)] == sorted(tn.UNARY_OPS, key=tn.UNARY_OPS.get)
    eltwise = _wire.enum_names(pb.EltwiseOp.DESCRIPTOR)
    assert [eltwise[k] for k in sorted(eltwise)] == sorted(tn.ELTWISE_OPS, key=tn.ELTWISE_OPS.get)
    assert _wire.enum_names(pb.ShuffleType.DESCRIPTOR) == {1: "split", 2: "interleave"}
    for name, value in tn.UNARY_OPS.items():
        assert _wire.encode_enum(pb.UnaryOp.DESCRIPTOR, name, "op") == _wire.encode_enum(pb.UnaryOp.DESCRIPTOR, value, "op")


def _decoded(op, message, tensors=None):
    raw = op.request_codec.encode(message, tensors or {})
    return op.request_codec.decode(raw)


def test_unset_fields_fall_back_to_native_defaults_or_none():
    entry = TABLE["softmax"] if "softmax" in TABLE else None
    if entry is None:
        pytest.skip("softmax not in this build")
    kwargs, fmt = entry.arguments(_decoded(entry.op, pb.SoftmaxRequest()), None)
    assert kwargs == {"x": None} and fmt == 0  # x required: None lets native name it; axis default
    entry = TABLE["shuffle"]
    decoded = _decoded(entry.op, pb.ShuffleRequest(), {"x0": _codec.encode_tensor([[1.0]], "x0", 2)})
    kwargs, fmt = entry.arguments(decoded, None)
    assert kwargs["type"] is None and "channels" not in kwargs and kwargs["x1"] is None
    assert kwargs["format"] == "nhwc" and fmt == 2


def test_layout_tensors_must_agree_on_the_format():
    entry = TABLE["shuffle"]
    decoded = _decoded(entry.op, pb.ShuffleRequest(), {"x0": _codec.encode_tensor([[1.0]], "x0", 1),
                                                       "x1": _codec.encode_tensor([[1.0]], "x1", 2)})
    with pytest.raises(Exception) as err:
        entry.arguments(decoded, None)
    assert err.value.field == "x1.format"


def test_public_names():
    assert {"Client", "LocalClient", "TensorOpsError", "InvalidArgumentError", "NotFoundError"} <= set(tensorops.__all__)
