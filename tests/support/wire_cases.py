"""The decoders of the codec against protobuf's own parser, shared by test_codec_agreement.py
and the fuzz target tests/fuzz/fuzz_codec.py.

`check(codec, raw)` decodes `raw` with both paths of MessageCodec (the in-place walk of the
wire format used for large messages, and the protobuf runtime used for small ones) and with
`message_class.FromString`, and fails with an AssertionError unless the three agree: all
refuse the bytes (the codec with a WireError, protobuf with a DecodeError), or all accept
them with equal results (every non-Tensor field, unknown fields included, and every Tensor's
shape, dtype, format and data). It then runs `to_array` on every decoded tensor of both paths,
which must give the same array or the same WireError. Any other exception propagates.

Also here: a writer of raw wire format that can say what encoders never do (overlong and
over-64-bit varints, groups, wrong wire types), and the hand-written cases.
"""

from __future__ import annotations

import google.protobuf
from google.protobuf.message import DecodeError

from tensorops.protocol import codec
from tensorops.protocol.codec import MessageCodec, WireError, to_array
from tensorops.v1 import tensorops_pb2

_SERVICE = tensorops_pb2.DESCRIPTOR.services_by_name["TensorOps"]
# Every request and response message of the service, in the order of the methods.
MESSAGE_CLASSES = list(
    dict.fromkeys(getattr(tensorops_pb2, t.name) for m in _SERVICE.methods for t in (m.input_type, m.output_type))
)
CODECS = {cls: MessageCodec(cls) for cls in MESSAGE_CLASSES}
MAX_BYTES = 1 << 20

VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5


# ---------------------------------------------------------------------------------------
# Writing the wire format


def varint(value: int, overlong: int = 0) -> bytes:
    """A varint of any non-negative value (past 64 bits it is longer than protobuf reads;
    bits past the 64th of a 10-byte one are dropped), `overlong` redundant bytes added.
    Negative values: their 64-bit two's complement, as protobuf writes int64."""
    if value < 0:
        value += 1 << 64
    groups = []
    while True:
        groups.append(value & 0x7F)
        value >>= 7
        if not value:
            break
    groups += [0] * overlong
    return bytes([g | 0x80 for g in groups[:-1]] + [groups[-1]])


def key(number: int, wire_type: int, overlong: int = 0) -> bytes:
    return varint((number << 3) | wire_type, overlong)


def field(
    number: int, wire_type: int, value: bytes | int = b"", *, key_overlong: int = 0, len_overlong: int = 0
) -> bytes:
    """One field: ints are varints, bytes are the value as is (LEN: the body; groups: the
    fields, the end key added)."""
    head = key(number, wire_type, key_overlong)
    if wire_type == VARINT:
        return head + varint(value)
    if wire_type == LEN:
        return head + varint(len(value), len_overlong) + value
    if wire_type == SGROUP:
        return head + value + key(number, EGROUP)
    return head + value


def tensor(*, shape=(), dtype=None, fmt=None, data=None, packed=True) -> bytes:
    """A Tensor body written the plain way."""
    parts = []
    if shape:
        parts.append(
            field(1, LEN, b"".join(varint(d) for d in shape))
            if packed
            else b"".join(field(1, VARINT, d) for d in shape)
        )
    if dtype is not None:
        parts.append(field(2, VARINT, dtype))
    if fmt is not None:
        parts.append(field(3, VARINT, fmt))
    if data is not None:
        parts.append(field(4, LEN, data))
    return b"".join(parts)


def encode(message_codec: MessageCodec, message, tensors: dict, *, in_place: bool) -> bytes:
    """message_codec.encode with the encoder chosen whatever the size: in place (payloads padded to
    be aligned, as large messages are written) or through protobuf (as small ones are)."""
    saved = codec.SMALL_MESSAGE
    codec.SMALL_MESSAGE = -1 if in_place else 1 << 62
    try:
        return message_codec.encode(message, tensors)
    finally:
        codec.SMALL_MESSAGE = saved


def groups(depth: int, number: int = 5) -> bytes:
    """`depth` unknown groups nested in each other."""
    return key(number, SGROUP) * depth + key(number, EGROUP) * depth


# ---------------------------------------------------------------------------------------
# The check


def _tensor(t) -> tuple:
    return list(t.shape), t.dtype, t.format, bytes(t.data)


def _without_tensors(codec: MessageCodec, message) -> bytes:
    message = type(message).FromString(message.SerializeToString())
    for name in codec.numbers:
        message.ClearField(name)
    return message.SerializeToString(deterministic=True)


def _array_or_error(t, name: str):
    try:
        arr = to_array(t, name, max_bytes=MAX_BYTES)
    except WireError as exc:
        return "error", exc.field, exc.code, exc.message
    return "array", arr.dtype.str, arr.shape, arr.tobytes()


def _arrays(decoded) -> list:
    out = []
    for name, value in sorted(decoded.tensors.items()):
        items = value if isinstance(value, list) else [value]
        out += [(name, i, _array_or_error(t, f"{name}[{i}]")) for i, t in enumerate(items)]
    return out


def check(codec: MessageCodec, raw: bytes) -> bool:
    """Asserts that both decoders of `codec` agree with protobuf on `raw` (see the module
    docstring); True if the message was accepted."""
    cls = codec.message_class
    try:
        reference = cls.FromString(raw)
    except DecodeError:
        reference = None
    arrays = []
    for path in (codec.decode_in_place, codec.decode_with_protobuf):
        try:
            decoded = path(raw)
        except WireError:
            assert reference is None, f"{path.__name__} refused a {cls.__name__} protobuf accepts: {raw!r}"
            continue
        assert reference is not None, f"{path.__name__} accepted a {cls.__name__} protobuf refuses: {raw!r}"
        assert decoded.nbytes == len(raw)
        for name in codec.numbers:
            if name in codec.repeated:
                got = [_tensor(t) for t in decoded.tensors[name]]
                want = [_tensor(t) for t in getattr(reference, name)]
            else:
                got = _tensor(decoded.tensors[name]) if name in decoded.tensors else None
                want = _tensor(getattr(reference, name)) if reference.HasField(name) else None
            assert got == want, f"{path.__name__}: {cls.__name__}.{name} is {got}, protobuf: {want}; {raw!r}"
        got, want = _without_tensors(codec, decoded.message), _without_tensors(codec, reference)
        assert got == want, f"{path.__name__}: other fields {got!r}, protobuf: {want!r}; {raw!r}"
        arrays.append(_arrays(decoded))
    if arrays:
        assert arrays[0] == arrays[1], f"to_array differs between the paths: {arrays}; {raw!r}"
    return reference is not None


# ---------------------------------------------------------------------------------------
# Hand-written cases: (label, message class, raw bytes, accepted by protobuf)

_P = tensorops_pb2
_FP32 = dict(shape=[2], dtype=1, data=bytes(8))
_X = tensor(**_FP32)


def _x(body: bytes) -> bytes:
    return field(1, LEN, body)


# Both runtimes are supported, and the codec follows the one it runs on where they differ:
# protobuf 6 reads a length prefix of any varint length (up to 10 bytes) where protobuf 7
# refuses one longer than 5 bytes, and refuses a field number 0 within a group, where
# protobuf 7 skips groups without looking.
_PROTOBUF_6 = int(google.protobuf.__version__.split(".")[0]) < 7


CASES = [
    # enums: protobuf keeps the low 32 bits of the varint (int32)
    ("dtype 2**32 + 1 is FP32", _P.SoftmaxRequest, _x(tensor(shape=[2], dtype=2**32 + 1, data=bytes(8))), True),
    ("dtype 2**31 is negative", _P.SoftmaxRequest, _x(tensor(shape=[2], dtype=2**31, data=bytes(8))), True),
    ("dtype -1 (10 bytes)", _P.SoftmaxRequest, _x(tensor(dtype=-1)), True),
    (
        "dtype with bits past the 64th",
        _P.SoftmaxRequest,
        _x(tensor(shape=[2], dtype=1 | 0x7F << 63, data=bytes(8))),
        True,
    ),
    ("format 2**32 + 2 is NHWC", _P.SoftmaxRequest, _x(tensor(**_FP32, fmt=2**32 + 2)), True),
    ("op of 10 bytes", _P.EltwiseRequest, field(2, VARINT, 2 | 1 << 66), True),
    ("axis past 64 bits", _P.SoftmaxRequest, field(2, VARINT, 1 << 69), True),
    # overlong varints, keys and lengths
    (
        "overlong dtype",
        _P.SoftmaxRequest,
        _x(field(1, LEN, varint(2)) + key(2, VARINT) + varint(1, 3) + field(4, LEN, bytes(8))),
        True,
    ),
    ("11-byte dtype", _P.SoftmaxRequest, _x(key(2, VARINT) + varint(1, 10)), False),
    ("11-byte unknown varint in a tensor", _P.SoftmaxRequest, _x(key(9, VARINT) + varint(1, 10)), False),
    ("11-byte dimension, packed", _P.SoftmaxRequest, _x(field(1, LEN, varint(2, 10))), False),
    (
        "overlong dimension, packed",
        _P.SoftmaxRequest,
        _x(field(1, LEN, varint(2, 9)) + field(2, VARINT, 1) + field(4, LEN, bytes(8))),
        True,
    ),
    ("5-byte key", _P.SoftmaxRequest, field(1, LEN, _X, key_overlong=4), True),
    ("6-byte key", _P.SoftmaxRequest, field(1, LEN, _X, key_overlong=5), False),
    ("6-byte key in a tensor", _P.SoftmaxRequest, _x(field(2, VARINT, 1, key_overlong=5)), False),
    ("key above 32 bits", _P.SoftmaxRequest, varint(1 << 32 | 1 << 3 | LEN) + varint(0), False),
    ("largest field number", _P.SoftmaxRequest, field((1 << 29) - 1, VARINT, 1) + _x(_X), True),
    ("5-byte length", _P.SoftmaxRequest, field(1, LEN, _X, len_overlong=4), True),
    ("6-byte length", _P.SoftmaxRequest, field(1, LEN, _X, len_overlong=5), _PROTOBUF_6),
    ("6-byte length in a tensor", _P.SoftmaxRequest, _x(field(4, LEN, bytes(8), len_overlong=5)), _PROTOBUF_6),
    ("10-byte length in a tensor", _P.SoftmaxRequest, _x(field(4, LEN, bytes(8), len_overlong=9)), _PROTOBUF_6),
    ("11-byte length in a tensor", _P.SoftmaxRequest, _x(field(4, LEN, bytes(8), len_overlong=10)), False),
    ("field number 0", _P.SoftmaxRequest, field(0, VARINT, 1), False),
    ("field number 0 in a tensor", _P.SoftmaxRequest, _x(field(0, VARINT, 1)), False),
    ("wire type 6", _P.SoftmaxRequest, key(5, 6), False),
    ("wire type 7 in a tensor", _P.SoftmaxRequest, _x(key(5, 7)), False),
    # groups
    ("unknown group", _P.SoftmaxRequest, field(5, SGROUP, field(1, VARINT, 7) + field(2, LEN, b"ab")) + _x(_X), True),
    ("unknown group in a tensor", _P.SoftmaxRequest, _x(field(9, SGROUP, field(4, LEN, b"zz")) + _X), True),
    ("field number 0 in a group", _P.SoftmaxRequest, field(5, SGROUP, field(0, VARINT, 1)), not _PROTOBUF_6),
    (
        "field number 0 in a nested group in a tensor",
        _P.SoftmaxRequest,
        _x(field(9, SGROUP, field(8, SGROUP, field(0, VARINT, 1))) + _X),
        not _PROTOBUF_6,
    ),
    (
        "nested groups",
        _P.EltwiseRequest,
        field(9, SGROUP, field(8, SGROUP, field(1, I64, bytes(8))) + field(7, I32, bytes(4))),
        True,
    ),
    ("group with the number of a Tensor field", _P.SoftmaxRequest, field(1, SGROUP, field(2, VARINT, 1)), True),
    ("group with the number of shape", _P.SoftmaxRequest, _x(field(1, SGROUP, field(1, VARINT, 3)) + _X), True),
    ("mismatched end of group", _P.SoftmaxRequest, key(5, SGROUP) + key(6, EGROUP), False),
    ("unterminated group", _P.SoftmaxRequest, key(5, SGROUP) + field(1, VARINT, 1), False),
    ("end of group alone", _P.SoftmaxRequest, key(5, EGROUP), False),
    ("end of group alone in a tensor", _P.SoftmaxRequest, _x(key(5, EGROUP)), False),
    ("end of group past the tensor", _P.SoftmaxRequest, _x(key(5, SGROUP)) + key(5, EGROUP), False),
    ("100 nested groups", _P.SoftmaxRequest, groups(100), True),
    ("101 nested groups", _P.SoftmaxRequest, groups(101), False),
    ("99 nested groups in a tensor", _P.SoftmaxRequest, _x(groups(99)), True),
    ("100 nested groups in a tensor", _P.SoftmaxRequest, _x(groups(100)), False),
    # a singular Tensor given in several chunks merges; repeated ones do not
    (
        "tensor in chunks",
        _P.SoftmaxRequest,
        _x(tensor(shape=[2])) + _x(tensor(shape=[3], dtype=5)) + _x(tensor(data=bytes(range(6)))),
        True,
    ),
    (
        "tensor chunks around a wrong wire type",
        _P.SoftmaxRequest,
        _x(tensor(shape=[2], dtype=5)) + field(1, VARINT, 9) + _x(tensor(data=b"ab")),
        True,
    ),
    (
        "repeated tensors",
        _P.EltwiseRequest,
        field(1, LEN, _X) + field(1, LEN, tensor(shape=[1])) + field(1, LEN, b""),
        True,
    ),
    ("empty tensor", _P.TiledScale2DRequest, field(2, LEN, b""), True),
    # shape: packed, unpacked, mixed, negative
    ("unpacked shape", _P.SoftmaxRequest, _x(tensor(shape=[2, 3], dtype=5, data=bytes(6), packed=False)), True),
    (
        "packed and unpacked dimensions",
        _P.SoftmaxRequest,
        _x(
            field(1, VARINT, 2)
            + field(1, LEN, varint(3) + varint(1))
            + field(1, VARINT, 1)
            + field(2, VARINT, 4)
            + field(4, LEN, bytes(6))
        ),
        True,
    ),
    ("empty packed shape", _P.SoftmaxRequest, _x(field(1, LEN, b"") + field(2, VARINT, 4)), True),
    ("negative dimensions", _P.SoftmaxRequest, _x(tensor(shape=[-1, 3], dtype=1)) + _x(field(1, VARINT, -5)), True),
    ("most negative dimension", _P.SoftmaxRequest, _x(tensor(shape=[-(1 << 63)], dtype=1)), True),
    ("truncated packed shape", _P.SoftmaxRequest, _x(field(1, LEN, b"\x80")), False),
    # singular scalars repeated: the last wins
    (
        "dtype twice",
        _P.SoftmaxRequest,
        _x(field(2, VARINT, 5) + field(1, LEN, varint(2)) + field(4, LEN, b"ab") + field(2, VARINT, 4)),
        True,
    ),
    ("format set then zero", _P.SoftmaxRequest, _x(_X + field(3, VARINT, 2) + field(3, VARINT, 0)), True),
    ("axis twice", _P.SoftmaxRequest, field(2, VARINT, 3) + _x(_X) + field(2, VARINT, -2), True),
    (
        "data twice",
        _P.SoftmaxRequest,
        _x(field(4, LEN, b"first") + tensor(shape=[2], dtype=1) + field(4, LEN, bytes(8))),
        True,
    ),
    ("data in another chunk", _P.SoftmaxRequest, _x(_X) + _x(field(4, LEN, bytes(4))), True),
    # unknown fields in a Tensor
    (
        "unknown fields in a tensor",
        _P.SoftmaxRequest,
        _x(field(15, LEN, bytes(14)) + field(5, VARINT, 1) + field(6, I64, bytes(8)) + field(7, I32, bytes(4)) + _X),
        True,
    ),
    # wire types other than the declared one: unknown fields
    ("Tensor field as varint", _P.SoftmaxRequest, field(1, VARINT, 1) + field(2, VARINT, 1), True),
    ("Tensor field as fixed32", _P.NormalizeL2Request, field(2, I32, bytes(4)) + _x(_X), True),
    ("Tensor field as fixed64", _P.EltwiseRequest, field(1, I64, bytes(8)) + field(1, LEN, _X), True),
    ("shape as fixed64", _P.SoftmaxRequest, _x(field(1, I64, bytes(8)) + _X), True),
    ("dtype as bytes", _P.SoftmaxRequest, _x(field(2, LEN, b"\x01") + _X), True),
    ("data as varint", _P.SoftmaxRequest, _x(tensor(shape=[0], dtype=1) + field(4, VARINT, 7)), True),
    ("format as fixed32", _P.SoftmaxRequest, _x(_X + field(3, I32, b"\x02\0\0\0")), True),
    ("axis as bytes", _P.SoftmaxRequest, field(2, LEN, b"\x05") + _x(_X), True),
    # truncated messages
    ("truncated length", _P.SoftmaxRequest, _x(_X)[:-1], False),
    ("truncated tensor", _P.SoftmaxRequest, field(1, LEN, _X)[:4], False),
    ("truncated fixed64", _P.SoftmaxRequest, field(9, I64, bytes(7)), False),
    ("truncated fixed32 in a tensor", _P.SoftmaxRequest, _x(field(9, I32, bytes(3))), False),
    ("truncated varint", _P.SoftmaxRequest, key(2, VARINT) + b"\x80", False),
    ("truncated key", _P.SoftmaxRequest, b"\x80", False),
    ("a tensor longer than the message", _P.SoftmaxRequest, key(1, LEN) + varint(100) + _X, False),
    (
        "a field longer than its tensor",
        _P.SoftmaxRequest,
        _x(key(4, LEN) + varint(9) + bytes(8)) + field(9, LEN, bytes(2)),
        False,
    ),
    # the other fields go through protobuf on both paths
    ("strings", _P.QuantizedInnerProductForwardRequest, field(1, LEN, "séance".encode()) + field(2, LEN, _X), True),
    ("invalid UTF-8", _P.QuantizedInnerProductForwardRequest, field(1, LEN, b"\xff") + field(2, LEN, _X), False),
    (
        "a message field",
        _P.NormalizeRequest,
        field(8, LEN, field(1, VARINT, 3) + field(2, LEN, bytes(16))) + _x(_X),
        True,
    ),
    ("a broken message field", _P.NormalizeRequest, field(8, LEN, key(1, VARINT)) + _x(_X), False),
    (
        "packed and unpacked int64s",
        _P.ShuffleRequest,
        field(4, LEN, varint(1) + varint(-2)) + field(4, VARINT, 3),
        True,
    ),
]
