"""The codec's counts: operands (MAX_OPERANDS) on both decode paths and in the client's
encoder, and the fields the in-place decoder walks (MAX_FIELDS), refused before the objects
they would cost are built, in time bounded by the limits rather than the message's size."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tensorops.protocol import codec, wire
from tensorops.protocol.codec import MAX_FIELDS, MAX_OPERANDS, MessageCodec, WireError
from tensorops.v1 import tensor_pb2
from tensorops.v1 import tensorops_pb2 as pb

ELTWISE = MessageCodec(pb.EltwiseRequest)
SOFTMAX = MessageCodec(pb.SoftmaxRequest)


def eltwise(operands: int, values: int = 0) -> bytes:
    """An EltwiseRequest of `operands` FP32 tensors of `values` elements each."""
    return pb.EltwiseRequest(
        inputs=[codec.from_array(np.zeros(values, np.float32))] * operands, op=pb.ELTWISE_OP_SUM
    ).SerializeToString()


@pytest.mark.parametrize("values", [0, 16])  # 16: large enough for the in-place path
@pytest.mark.parametrize("path", ["decode_in_place", "decode_with_protobuf"])
def test_operands_up_to_the_limit(path, values):
    decoded = getattr(ELTWISE, path)(eltwise(MAX_OPERANDS, values))
    assert len(decoded.tensors["inputs"]) == MAX_OPERANDS
    with pytest.raises(WireError) as info:
        getattr(ELTWISE, path)(eltwise(MAX_OPERANDS + 1, values))
    assert (info.value.field, info.value.message, info.value.code) == (
        "inputs",
        f"at most {MAX_OPERANDS} tensors (the limit), got more",
        "INVALID_ARGUMENT",
    )


def test_millions_of_empty_operands_are_refused_at_once():
    raw = eltwise(10**6)  # 7 MB
    start = time.perf_counter()
    with pytest.raises(WireError, match="at most 1024 tensors"):
        ELTWISE.decode(raw)
    assert time.perf_counter() - start < 0.5


def test_the_client_refuses_operands_beyond_the_limit_before_encoding():
    operands = [np.zeros(1, np.float32)] * (MAX_OPERANDS + 1)
    with pytest.raises(WireError) as info:
        wire.build_request(wire.OPERATIONS["eltwise"], {"inputs": operands, "op": "sum"})
    assert info.value.field == "inputs" and info.value.message.endswith(f"got {MAX_OPERANDS + 1}")
    assert len(wire.build_request(wire.OPERATIONS["eltwise"], {"inputs": operands[1:], "op": "sum"}).data)


def length_delimited(number: int, body: bytes) -> bytes:
    return codec._tag(number, 2) + codec._varint(len(body)) + body


@pytest.mark.parametrize(
    "label, raw",
    [
        ("unknown fields", b"\x78\x00" * (MAX_FIELDS + 1)),
        ("fields of a group", b"\x7b" + b"\x08\x00" * MAX_FIELDS + b"\x7c"),
        ("packed dimensions", length_delimited(1, length_delimited(1, b"\x01" * MAX_FIELDS))),
        ("unpacked dimensions", length_delimited(1, b"\x08\x01" * MAX_FIELDS)),
    ],
)
def test_the_in_place_walk_stops_at_the_field_limit(label, raw):
    with pytest.raises(WireError) as info:
        SOFTMAX.decode_in_place(raw)
    assert info.value.field == "message" and f"more than {MAX_FIELDS} fields" in info.value.message, label


def test_fields_within_the_limit_decode_as_protobuf_does():
    x = tensor_pb2.Tensor(shape=[2], dtype=tensor_pb2.DATA_TYPE_FP32, data=bytes(8)).SerializeToString()
    raw = b"\x78\x00" * (MAX_FIELDS - 8) + length_delimited(1, x)
    decoded = SOFTMAX.decode_in_place(raw)
    assert decoded.tensors["x"].shape == [2] and bytes(decoded.tensors["x"].data) == bytes(8)
    assert decoded.message == pb.SoftmaxRequest.FromString(raw.replace(length_delimited(1, x), b""))


def test_split_field_keeps_the_other_fields_in_runs():
    raw = b"\x08\x01" + length_delimited(7, b"abc") + b"\x10\x02\x18\x03" + length_delimited(7, b"de") + b"\x20\x04"
    parts, found = codec.split_field(raw, 7)
    rest = b"".join(parts)
    assert rest == b"\x08\x01\x10\x02\x18\x03\x20\x04" and [bytes(f) for f in found] == [b"abc", b"de"]
    with pytest.raises(WireError, match="more than"):
        codec.split_field(b"\x08\x01" * (MAX_FIELDS + 1), 7)
