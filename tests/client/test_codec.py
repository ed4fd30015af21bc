"""The codec: arrays <-> Tensor fields, interoperable with standard protobuf, validating the
wire form and naming the field."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tensorops.protocol import codec
from tensorops.protocol.codec import MessageCodec, WireError, encode_tensor, to_array
from tensorops.v1 import tensor_pb2
from tensorops.v1 import tensorops_pb2 as pb

DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16, np.uint8, np.int8, np.int32, np.float64, np.int64]


@pytest.fixture(params=["in-place", "protobuf"], autouse=True)
def path(request, monkeypatch):
    """Both paths of the codec: large messages (payloads used in place) and small ones
    (the protobuf runtime). The threshold decides which one a size takes."""
    monkeypatch.setattr(codec, "SMALL_MESSAGE", 0 if request.param == "in-place" else 1 << 30)
    return request.param


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (3, 0, 2), (2, 3, 5), (1, 1, 1, 1, 33)])
def test_round_trip_is_exact(dtype, shape, path):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 100).astype(dtype)
    message_codec = MessageCodec(pb.SoftmaxRequest)
    raw = message_codec.encode(pb.SoftmaxRequest(axis=-1), {"x": encode_tensor(x, "x", tensor_pb2.FORMAT_NHWC)})
    decoded = message_codec.decode(raw)
    y = to_array(decoded.tensors["x"], "x")
    assert y.dtype == x.dtype and y.shape == x.shape and y.tobytes() == x.tobytes()
    assert decoded.message.axis == -1 and decoded.tensors["x"].format == tensor_pb2.FORMAT_NHWC
    assert y.flags.aligned and not y.flags.writeable  # a view of the received bytes
    if x.size and path == "in-place":
        assert np.shares_memory(y, np.frombuffer(raw, np.uint8))
    # what any protobuf implementation reads
    std = pb.SoftmaxRequest.FromString(raw)
    assert list(std.x.shape) == list(shape) and std.x.data == x.tobytes()


@pytest.mark.parametrize("path", ["in-place"], indirect=True)  # the protobuf path copies the payload out
def test_payloads_start_aligned_whatever_precedes_them(path):
    message_codec = MessageCodec(pb.EltwiseRequest)
    for n in range(0, 300, 7):
        inputs = [np.arange(n + i, dtype=np.float32) for i in range(3)]
        raw = message_codec.encode(pb.EltwiseRequest(op=n % 5), {"inputs": [encode_tensor(a, "a") for a in inputs]})
        decoded = message_codec.decode(raw)
        base = np.frombuffer(raw, np.uint8).ctypes.data
        for t, a in zip(decoded.tensors["inputs"], inputs, strict=True):
            arr = to_array(t, "inputs")
            assert np.array_equal(arr, a)
            if a.size:
                assert (arr.ctypes.data - base) % codec.ALIGNMENT == 0


def test_decodes_what_standard_protobuf_writes():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    msg = pb.EltwiseRequest(
        inputs=[codec.from_array(x, format=1), codec.from_array(x * 2)],
        op=2,
        weights=codec.from_array(np.ones(2, np.float32)),
    )
    decoded = MessageCodec(pb.EltwiseRequest).decode(msg.SerializeToString())
    assert decoded.message.op == 2
    arrays = [to_array(t, "x") for t in decoded.tensors["inputs"]]
    assert np.array_equal(arrays[0], x) and np.array_equal(arrays[1], x * 2)
    assert np.array_equal(to_array(decoded.tensors["weights"], "weights"), np.ones(2))


def test_unpacked_shape_and_split_messages_merge_like_protobuf():
    t = tensor_pb2.Tensor(dtype=tensor_pb2.DATA_TYPE_INT8, data=b"\x01\x02\x03\x04\x05\x06")
    first = pb.SoftmaxRequest(x=tensor_pb2.Tensor(shape=[2])).SerializeToString()
    # an unpacked dimension (field 1, varint) followed by the rest of the tensor in a second occurrence
    unpacked = bytes([0x0A, 0x02, 0x08, 0x03])
    rest = pb.SoftmaxRequest(x=t).SerializeToString()
    decoded = MessageCodec(pb.SoftmaxRequest).decode(first + unpacked + rest)
    arr = to_array(decoded.tensors["x"], "x")
    assert arr.shape == (2, 3) and arr.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert pb.SoftmaxRequest.FromString(first + unpacked + rest).x.shape == [2, 3]


def test_misaligned_payload_is_copied_not_refused():
    x = np.arange(5, dtype=np.float32)
    raw = pb.SoftmaxRequest(x=codec.from_array(x)).SerializeToString()  # standard layout: unaligned
    copies = []
    arr = to_array(
        MessageCodec(pb.SoftmaxRequest).decode(raw).tensors["x"],
        "x",
        reserve=lambda nbytes, name: copies.append((nbytes, name)),
    )
    assert arr.flags.aligned and np.array_equal(arr, x)
    # a copy (this decoding path's payload is misaligned) is announced before it is made: the
    # server charges it to the call
    assert copies == ([(x.nbytes, "x")] if arr.flags.owndata else [])


def _tensor(**fields):
    return codec.WireTensor(**fields)


@pytest.mark.parametrize(
    "tensor,field,code",
    [
        (_tensor(shape=[2], dtype=0, data=b"\0" * 8), "x.dtype", "INVALID_ARGUMENT"),
        (_tensor(shape=[2], dtype=99, data=b"\0" * 8), "x.dtype", "INVALID_ARGUMENT"),
        (_tensor(shape=[2, -1], dtype=1, data=b""), "x.shape", "INVALID_ARGUMENT"),
        (_tensor(shape=[1] * 33, dtype=1, data=b"\0" * 4), "x.shape", "INVALID_ARGUMENT"),
        (_tensor(shape=[3], dtype=1, data=b"\0" * 11), "x.data", "INVALID_ARGUMENT"),
        (_tensor(shape=[3], dtype=1, data=b"\0" * 16), "x.data", "INVALID_ARGUMENT"),
        (_tensor(shape=[], dtype=2, data=b""), "x.data", "INVALID_ARGUMENT"),
        (_tensor(shape=[1 << 20, 1 << 20], dtype=1, data=b""), "x", "RESOURCE_EXHAUSTED"),
    ],
)
def test_wire_errors_name_the_field(tensor, field, code):
    with pytest.raises(WireError) as err:
        to_array(tensor, "x", max_bytes=1 << 30)
    assert err.value.field == field and err.value.code == code


def test_limit_applies_to_declared_size():
    t = _tensor(shape=[300], dtype=1, data=b"\0" * 1200)
    assert to_array(t, "x", max_bytes=1200).shape == (300,)
    with pytest.raises(WireError) as err:
        to_array(t, "inputs[2]", max_bytes=1199)
    assert err.value.field == "inputs[2]" and err.value.code == "RESOURCE_EXHAUSTED"


def test_malformed_message_is_a_wire_error():
    message_codec = MessageCodec(pb.SoftmaxRequest)
    for raw in [b"\x0a\x05\x01", b"\x0a", b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", b"\x10\x80"]:
        with pytest.raises(WireError):
            message_codec.decode(raw)


def test_encoding_normalizes_layout_and_byte_order():
    x = np.arange(12, dtype=">f4").reshape(3, 4).T  # big-endian, not contiguous
    arr, code, _ = encode_tensor(x, "x")
    assert code == tensor_pb2.DATA_TYPE_FP32 and arr.dtype == np.dtype("<f4") and arr.flags.c_contiguous
    assert np.array_equal(arr, x)
    _, code, _ = encode_tensor(np.zeros(2, np.uint16), "x")
    assert code == tensor_pb2.DATA_TYPE_BF16
    _, code, _ = encode_tensor([1.5, 2.0], "k")
    assert code == tensor_pb2.DATA_TYPE_FP64


@pytest.mark.parametrize("value", [np.zeros(2, np.complex64), np.zeros(2, bool), np.zeros(2, np.uint32), ["a"]])
def test_unsupported_dtypes_are_refused_by_name(value):
    with pytest.raises(WireError) as err:
        encode_tensor(value, "weights")
    assert err.value.field == "weights"
