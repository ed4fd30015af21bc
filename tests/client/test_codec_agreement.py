"""The two decoders of the codec (the in-place walk of the wire format that large messages
take, and the protobuf runtime that small ones take) decode every input exactly as protobuf
does: both refuse it, or both give the same message and tensors (wire_cases.check).

Inputs: the hand-written cases of wire_cases, messages generated from random field lists
(all wire types, groups, overlong and over-64-bit varints, wire types that differ from the
declared ones, repeated and split fields, unknown fields), and valid messages, as both
encoders write them, then truncated or mutated."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorops.protocol import codec, dtypes
from tensorops.protocol.codec import MessageCodec, encode_tensor
from tensorops.v1 import tensorops_pb2 as pb
from wire_cases import (
    CASES,
    CODECS,
    EGROUP,
    I32,
    I64,
    LEN,
    MESSAGE_CLASSES,
    SGROUP,
    VARINT,
    check,
    encode,
    field,
    key,
    varint,
)

# Deterministic (CI runs the same examples every time; tests/fuzz explores further) and
# with no example database left in the tree. Generating an example costs far more than
# checking it, so each generated message is also checked truncated at several points.
SETTINGS = settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("label,cls,raw,accepted", CASES, ids=[c[0] for c in CASES])
def test_hand_written_case(label, cls, raw, accepted):
    assert check(CODECS[cls], raw) == accepted


def test_huge_enum_decodes_as_protobuf_reads_it():
    raw = {c[0]: c[2] for c in CASES}["dtype 2**32 + 1 is FP32"]
    decoded = MessageCodec(pb.SoftmaxRequest).decode_in_place(raw)
    assert decoded.tensors["x"].dtype == 1
    assert codec.to_array(decoded.tensors["x"], "x").dtype == np.float32


def test_large_messages_take_the_in_place_path():
    """Padded past SMALL_MESSAGE with an unknown field, the hand-written cases still agree,
    and decode() itself takes the in-place path (payloads are views of the message)."""
    message_codec = CODECS[pb.SoftmaxRequest]
    pad = field(99, LEN, bytes(codec.SMALL_MESSAGE))
    for label, cls, raw, accepted in CASES:
        if cls is pb.SoftmaxRequest:
            assert check(message_codec, pad + raw) == accepted, label
            x = message_codec.decode(pad + raw).tensors.get("x") if accepted else None
            if x is not None and len(x.data):
                assert isinstance(x.data, memoryview), label


def check_truncated(codec, raw: bytes, cuts: int = 8) -> None:
    """check() on raw and on `cuts` prefixes of it, evenly spaced."""
    for i in range(cuts + 1):
        check(codec, raw[: len(raw) - len(raw) * i // (cuts + 1)])


# ---------------------------------------------------------------------------------------
# Messages from random field lists

# Varint values: small, any 64-bit, past 64 bits (10 bytes: protobuf drops the extra bits),
# the int32 boundaries of enums.
values = st.one_of(
    st.integers(0, 300),
    st.integers(0, (1 << 64) - 1),
    st.integers(1 << 64, (1 << 70) - 1),
    st.sampled_from([1 << 31, (1 << 32) + 1, (1 << 32) + 2, 1 << 63, (1 << 64) - 1, -2 + (1 << 64)]),
)
dims = st.one_of(st.integers(0, 5), values, st.integers(-(1 << 63), -1))
# Hypothesis favours the ends of a sampled list: rare choices go in the middle.
numbers = st.sampled_from([1, 2, 3, 4, 5, 15, 16, 99, (1 << 29) - 1, 6, 7, 8, 9, 10, 11, 12, 1, 2])
wire_types = st.sampled_from([VARINT] * 8 + [LEN] * 6 + [I64, I32, SGROUP, I64, I32, SGROUP] + [LEN] * 6 + [VARINT] * 4)
# What protobuf refuses, drawn only for "broken" messages: a field number 0, wire types 6
# and 7, an end group without its start, keys or lengths of 6 bytes, varints of 11.
bad_numbers = st.sampled_from([1, 2, 0, 5, 99])
bad_wire_types = st.sampled_from([VARINT, LEN, EGROUP, 6, 7, SGROUP, LEN, VARINT])


@st.composite
def a_varint(draw, value=values, broken=False) -> bytes:
    """A varint, sometimes with redundant bytes (past 10 bytes only when broken)."""
    return _overlong(varint(draw(value)), draw(st.sampled_from([0] * 6 + [1, 2, 9, 4] + [0] * 6)), 10, broken)


def _overlong(raw: bytes, extra: int, limit: int, broken: bool) -> bytes:
    """A varint with `extra` redundant bytes, at most `limit` bytes long unless broken."""
    if not broken:
        extra = min(extra, limit - len(raw))
    return raw if extra <= 0 else raw[:-1] + bytes([raw[-1] | 0x80]) + b"\x80" * (extra - 1) + b"\x00"


@st.composite
def fields(draw, depth: int = 2, tensor_numbers=(), max_fields: int = 6, broken=False) -> bytes:
    """A list of fields: any number with any wire type; LEN bodies are bytes, nested field
    lists or Tensors (for the numbers in tensor_numbers); groups hold field lists."""
    out = []
    for _ in range(draw(st.integers(0, max_fields))):
        if tensor_numbers and draw(st.booleans()):
            number = draw(st.sampled_from(tensor_numbers))
        else:
            number = draw(bad_numbers if broken and draw(st.booleans()) else numbers)
        wire_type = draw(bad_wire_types if broken and draw(st.booleans()) else wire_types)
        head = _overlong(key(number, wire_type), draw(st.sampled_from([0] * 8 + [1, 4, 5] + [0] * 8)), 5, broken)
        if wire_type == VARINT:
            out.append(head + draw(a_varint(broken=broken)))
        elif wire_type == LEN:
            if number in tensor_numbers:
                body = draw(tensors(broken))
            elif depth and draw(st.booleans()):
                body = draw(fields(depth - 1, broken=broken))
            else:
                body = draw(st.binary(max_size=24))
            length = _overlong(varint(len(body)), draw(st.sampled_from([0] * 6 + [1, 5, 4] + [0] * 6)), 5, broken)
            out.append(head + length + body)
        elif wire_type in (I64, I32):
            size = 8 if wire_type == I64 else 4
            out.append(head + draw(st.binary(min_size=size, max_size=size)))
        elif wire_type == SGROUP:
            inner = draw(fields(depth - 1, broken=broken)) if depth else b""
            end = number if not broken or draw(st.integers(0, 3)) else draw(numbers)
            out.append(head + inner + key(end, EGROUP))
        else:  # an end group without its start, wire types 6 and 7
            out.append(head)
    return b"".join(out)


@st.composite
def tensors(draw, broken=False) -> bytes:
    """A Tensor body: often a consistent one (shape, dtype and data agree), then fields of
    its own kinds (shape packed or not, dtype, format, data), then anything."""
    parts = []
    if draw(st.booleans()):
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        dtype = draw(st.integers(1, 8))
        nbytes = int(np.prod(shape)) * dtypes.BY_WIRE[dtype].itemsize
        parts.append(
            field(1, LEN, b"".join(varint(d) for d in shape))
            + field(2, VARINT, dtype)
            + field(4, LEN, bytes(range(nbytes)))
        )
    for kind in draw(st.lists(st.sampled_from(["packed", "unpacked", "dtype", "format", "data", "other"]), max_size=4)):
        if kind == "packed":
            body = b"".join(draw(st.lists(a_varint(dims, broken), max_size=4)))
            parts.append(field(1, LEN, body))
        elif kind == "unpacked":
            parts.append(key(1, VARINT) + draw(a_varint(dims, broken)))
        elif kind in ("dtype", "format"):
            parts.append(
                key(2 if kind == "dtype" else 3, VARINT) + draw(a_varint(st.one_of(st.integers(0, 9), values), broken))
            )
        elif kind == "data":
            parts.append(field(4, LEN, draw(st.binary(max_size=48))))
        else:
            parts.append(draw(fields(depth=1, max_fields=1, broken=broken)))
    return b"".join(parts)


@st.composite
def messages(draw):
    """A message of random fields, one in four broken (with something protobuf refuses)."""
    cls = draw(st.sampled_from(MESSAGE_CLASSES))
    codec = CODECS[cls]
    broken = draw(st.integers(0, 3)) == 1
    return codec, draw(fields(depth=2, tensor_numbers=tuple(codec.tensor_fields), max_fields=6, broken=broken))


@SETTINGS
@given(messages())
def test_random_field_lists(message):
    check_truncated(*message)


# ---------------------------------------------------------------------------------------
# Valid messages, truncated or mutated


@st.composite
def valid_messages(draw):
    """A message with tensors as the client and server write it (the in-place encoder with
    padded, aligned payloads, or the protobuf one) plus some of its other fields."""
    cls = draw(st.sampled_from([c for c in MESSAGE_CLASSES if CODECS[c].tensor_fields]))
    codec = CODECS[cls]
    dtype = draw(st.sampled_from([np.float32, np.uint16, np.int8, np.float64]))
    tensors = {}
    for name in codec.numbers:
        arrays = [
            np.arange(draw(st.integers(0, 12)), dtype=dtype).reshape(draw(st.sampled_from([(-1,), (1, -1)])))
            for _ in range(draw(st.integers(1, 3)) if name in codec.repeated else 1)
        ]
        encoded = [encode_tensor(a, name, draw(st.integers(0, 2))) for a in arrays]
        tensors[name] = encoded if name in codec.repeated else encoded[0]
    raw = encode(codec, None, tensors, in_place=draw(st.booleans()))
    return codec, raw + draw(fields(depth=1, max_fields=2))


@st.composite
def mutated(draw):
    codec, raw = draw(valid_messages())
    for _ in range(draw(st.integers(1, 3))):
        pos = draw(st.integers(0, len(raw)))
        op = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "duplicate"]))
        if op == "truncate":
            raw = raw[:pos]
        elif op == "flip" and pos < len(raw):
            raw = raw[:pos] + bytes([raw[pos] ^ draw(st.integers(1, 255))]) + raw[pos + 1 :]
        elif op == "insert":
            raw = raw[:pos] + draw(st.one_of(st.binary(min_size=1, max_size=4), a_varint())) + raw[pos:]
        elif op == "delete":
            raw = raw[:pos] + raw[pos + draw(st.integers(1, 4)) :]
        elif op == "duplicate":
            end = draw(st.integers(pos, len(raw)))
            raw = raw[:end] + raw[pos:end] + raw[end:]
    return codec, raw


@SETTINGS
@given(valid_messages())
def test_valid_and_truncated_messages(message):
    check_truncated(*message)


@SETTINGS
@given(mutated())
def test_mutated_messages(message):
    check(*message)
