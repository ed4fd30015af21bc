"""NumPy arrays <-> tensorops.v1 messages, shared by the client and the server.

Messages are standard protobuf (any gRPC client can speak to the server), but large Tensor
payloads bypass the protobuf runtime, which copies big `bytes` fields several times (and
slowly):

- decoding walks the serialized message, takes each Tensor's `data` as a memoryview of the
  received bytes and wraps it with np.frombuffer (no copy); the other fields go through the
  protobuf runtime as usual;
- encoding writes the other fields with the protobuf runtime and appends each Tensor field
  by hand, so an array's memory is copied once, straight into the outgoing message. A
  Tensor's payload starts 16-byte aligned within the message (padded with the unknown field
  15 of Tensor, which every protobuf parser skips), so the receiving side can use it in
  place.

Messages up to SMALL_MESSAGE bytes take the plain protobuf path, which is faster for them.

The codec validates the wire form of every tensor (known dtype, non-negative dimensions,
payload length equal to shape x element size, size limits) and names the offending field
("x.data", "inputs[1].shape"). Checking what an operation accepts is not its business.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from google.protobuf.message import Message

from ..v1 import tensor_pb2
from . import dtypes

MAX_NDIM = 32
# Most tensors in a repeated Tensor field (eltwise's operands), whichever path decodes the
# message: each costs objects of its own, even when empty (a few bytes on the wire).
MAX_OPERANDS = 1024
# Most fields (at any depth: the message's, its tensors', its groups') and packed shape
# dimensions the in-place decoder walks in one message. Every one costs Python work;
# a message within the limit takes a few tens of milliseconds at most.
MAX_FIELDS = 65536
TOO_MANY_FIELDS = f"more than {MAX_FIELDS} fields and shape dimensions in all (the limit)"
ALIGNMENT = 16
# Up to this size the protobuf runtime (C) is faster than walking the message in Python;
# above it, its copies of the payload cost more.
SMALL_MESSAGE = 32 * 1024

INVALID_ARGUMENT = "INVALID_ARGUMENT"
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"


class WireError(Exception):
    """A tensor or message that cannot be decoded or encoded. `code` is the gRPC status
    name it maps to, `field` the offending field."""

    def __init__(self, field: str, message: str, code: str = INVALID_ARGUMENT):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.code = code


class TooManyFields(WireError):
    """A message of more than MAX_FIELDS fields and shape dimensions: refused as it is,
    before the protobuf runtime builds an object for each."""

    def __init__(self) -> None:
        super().__init__("message", TOO_MANY_FIELDS)


def wire_dtype_names() -> list[str]:
    return [d.name for d in dtypes.DTYPES]


# ---------------------------------------------------------------------------------------
# Arrays


@dataclass
class WireTensor:
    """A Tensor as received: payload not yet interpreted."""

    shape: list[int] = field(default_factory=list)
    dtype: int = 0
    format: int = 0
    data: bytes | memoryview = b""


def to_array(
    t: WireTensor, name: str, *, max_bytes: int | None = None, reserve: Callable[[int, str], None] | None = None
) -> np.ndarray:
    """Validate a received tensor and view it as an array (read-only, no copy unless the
    payload is misaligned for its element type; `reserve(nbytes, name)` is told of such a
    copy before it is made)."""
    row = dtypes.BY_WIRE.get(t.dtype)
    if row is None:
        allowed = ", ".join(tensor_pb2.DataType.Name(c) for c in dtypes.BY_WIRE)
        raise WireError(f"{name}.dtype", f"expected one of {allowed}, got {t.dtype}")
    dtype = row.numpy
    shape = t.shape
    if len(shape) > MAX_NDIM:
        raise WireError(f"{name}.shape", f"at most {MAX_NDIM} dimensions, got {len(shape)}")
    if shape and min(shape) < 0:
        raise WireError(f"{name}.shape", f"dimensions must be non-negative, got {list(shape)}")
    nbytes = math.prod(shape) * dtype.itemsize
    if max_bytes is not None and nbytes > max_bytes:
        raise WireError(name, f"{nbytes} bytes exceed the limit of {max_bytes} bytes per tensor", RESOURCE_EXHAUSTED)
    if len(t.data) != nbytes:
        raise WireError(
            f"{name}.data",
            f"expected {nbytes} bytes for shape {list(t.shape)} of "
            f"{tensor_pb2.DataType.Name(t.dtype)}, got {len(t.data)}",
        )
    try:
        arr = np.frombuffer(t.data, dtype).reshape(shape)
    except ValueError as exc:  # dimensions numpy cannot represent
        raise WireError(f"{name}.shape", str(exc)) from None
    if not arr.flags.aligned:
        if reserve is not None:
            reserve(nbytes, name)
        arr = arr.copy()
    return arr


def wire_array(value: object, name: str) -> tuple[np.ndarray, int]:
    """An array in wire form (C-contiguous, little-endian) and its wire dtype."""
    arr = value if isinstance(value, np.ndarray) else np.asarray(value)
    dtype = arr.dtype
    if dtype.byteorder == ">":
        dtype = dtype.newbyteorder("<")
        arr = arr.astype(dtype, order="C")  # one copy makes it little-endian and contiguous
    code = dtypes.WIRE_OF_NUMPY.get(dtype)
    if code is None:
        raise WireError(
            name,
            f"dtype {arr.dtype} cannot be sent; supported: {', '.join(wire_dtype_names())} "
            "(and uint16 holding BF16 bits)",
        )
    return (arr if arr.flags.c_contiguous else arr.copy(order="C")), code


def from_array(value: object, name: str = "tensor", *, format: int = 0) -> tensor_pb2.Tensor:
    """A protobuf Tensor holding a copy of the array (for callers that want messages; the
    RPC paths use MessageCodec, which avoids the intermediate copies)."""
    arr, code = wire_array(value, name)
    return tensor_pb2.Tensor(
        shape=arr.shape,
        dtype=cast(tensor_pb2.DataType, code),
        format=cast(tensor_pb2.Format, format),
        data=_payload(arr).tobytes(),
    )


def _payload(arr: np.ndarray) -> memoryview:
    return memoryview(arr.reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # ndarray is a buffer


# ---------------------------------------------------------------------------------------
# Protobuf wire format (https://protobuf.dev/programming-guides/encoding/)

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_T_SHAPE, _T_DTYPE, _T_FORMAT, _T_DATA, _T_PAD = 1, 2, 3, 4, 15
_SHAPE_KEY, _DTYPE_KEY, _FORMAT_KEY, _DATA_KEY = (
    bytes(((n << 3) | w,)) for n, w in ((_T_SHAPE, _LEN), (_T_DTYPE, _VARINT), (_T_FORMAT, _VARINT), (_T_DATA, _LEN))
)


_SMALL_VARINTS = [bytes((i,)) for i in range(128)]


def _varint(value: int) -> bytes:
    if 0 <= value < 128:
        return _SMALL_VARINTS[value]
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(number: int, wire_type: int) -> bytes:
    return _varint((number << 3) | wire_type)


def _varint_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


# Padding fields of every size the alignment can need (none is 1 byte long).
_PADS = {
    size: b"" if size == 0 else _tag(_T_PAD, _LEN) + _varint(size - 2) + bytes(size - 2)
    for size in range(2 * ALIGNMENT + 2)
    if size != 1
}


# What the protobuf runtime (upb) refuses, the in-place decoder refuses too, so that both
# paths decode every message the same way: a varint longer than 10 bytes (bits past the
# 64th are dropped, as protobuf does), a field key longer than 5 bytes or above 32 bits, a
# field number 0 (within a group only if _ZERO_IN_GROUPS), a length longer than
# _MAX_LENGTH_BYTES, wire types 6 and 7, an end-group key without its start, and messages
# and groups nested deeper than _MAX_DEPTH.
_SGROUP, _EGROUP = 3, 4
_MAX_DEPTH = 100


# A serialized message: as received, or a view of part of one.
Buffer = bytes | memoryview


def _runtime_reads(raw: bytes) -> bool:
    """Whether the installed protobuf runtime parses `raw` as a Tensor. Protobuf 6 and 7
    (both supported) differ on two points the in-place decoder must follow."""
    try:
        tensor_pb2.Tensor.FromString(raw)
    except Exception:  # google.protobuf.message.DecodeError
        return False
    return True


# The longest length prefix: 5 bytes under protobuf 7, any varint (10 bytes) under protobuf 6.
_MAX_LENGTH_BYTES = 10 if _runtime_reads(b"\x22\x80\x80\x80\x80\x80\x00") else 5  # data: a 6-byte length 0
# A field number 0 within a group: protobuf 7 skips groups without looking, protobuf 6
# refuses it.
_ZERO_IN_GROUPS = _runtime_reads(b"\x2b\x00\x00\x2c")  # group 5 holding field 0 (varint 0)


def _read_varint(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    if pos < end and buf[pos] < 0x80:  # the common case: one byte
        return buf[pos], pos + 1
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise WireError("message", "malformed varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7


def _signed(value: int) -> int:
    """A varint as int64."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _int32(value: int) -> int:
    """A varint as int32 (and enum): protobuf keeps the low 32 bits."""
    return ((value & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000


def _read_key(buf: Buffer, pos: int, end: int) -> tuple[int, int, int]:
    """(field number, wire type, position after the key)."""
    key = buf[pos]
    if key < 0x80:
        pos += 1
    else:
        start = pos
        key, pos = _read_varint(buf, pos, end)
        if pos - start > 5 or key > 0xFFFFFFFF:
            raise WireError("message", "malformed field key")
    return key >> 3, key & 7, pos


def _skip_value(buf: Buffer, pos: int, end: int, wire_type: int) -> tuple[int, int]:
    """(start of the value, end of the field) of a field other than a group."""
    if wire_type == _LEN:
        length, value = _read_varint(buf, pos, end)
        if value - pos > _MAX_LENGTH_BYTES or length >= 0x7FFFFFFF:
            raise WireError("message", "malformed length")
        stop = value + length
    elif wire_type == _VARINT:
        value, stop = pos, _read_varint(buf, pos, end)[1]
    elif wire_type == _I64:
        value, stop = pos, pos + 8
    elif wire_type == _I32:
        value, stop = pos, pos + 4
    elif wire_type == _EGROUP:
        raise WireError("message", "end of a group that was not started")
    else:
        raise WireError("message", f"unsupported wire type {wire_type}")
    if stop > end:
        raise WireError("message", "truncated message")
    return value, stop


class _Budget:
    """What is left of MAX_FIELDS for one message."""

    __slots__ = ("left",)

    def __init__(self) -> None:
        self.left = MAX_FIELDS


def _skip_group(buf: Buffer, pos: int, end: int, number: int, depth: int, budget: _Budget) -> int:
    """The end of the group `number` whose fields start at pos (groups nest: at most
    `depth` deep)."""
    open_groups = [number]
    while open_groups:
        if len(open_groups) > depth:
            raise WireError("message", "groups nested too deep")
        if pos >= end:
            raise WireError("message", "truncated message")
        budget.left -= 1
        if budget.left < 0:
            raise TooManyFields()
        number, wire_type, pos = _read_key(buf, pos, end)
        if not number and not _ZERO_IN_GROUPS:
            raise WireError("message", "field number 0")
        if wire_type == _SGROUP:
            open_groups.append(number)
        elif wire_type == _EGROUP:
            if open_groups.pop() != number:
                raise WireError("message", "mismatched end of group")
        else:
            pos = _skip_value(buf, pos, end, wire_type)[1]
    return pos


def _fields(
    buf: Buffer, pos: int, end: int, budget: _Budget, depth: int = _MAX_DEPTH
) -> Iterator[tuple[int, int, int, int, int]]:
    """(number, wire type, start of the field, start of its value, end of the field) of
    each field of a message in which protobuf allows `depth` more levels of nesting; an
    unknown group is one field. Each field, and each field of a group, spends `budget`."""
    while pos < end:
        budget.left -= 1
        if budget.left < 0:
            raise TooManyFields()
        start = pos
        key = buf[pos]
        if 8 <= key < 0x80:  # the common case: a one-byte key
            number, wire_type, pos = key >> 3, key & 7, pos + 1
        else:
            number, wire_type, pos = _read_key(buf, pos, end)
            if not number:
                raise WireError("message", "field number 0")
        # The common cases inline (a call costs more than the rest of the loop): a length
        # or a varint value of one byte.
        if wire_type == _LEN and pos < end and buf[pos] < 0x80:
            value = pos + 1
            pos = value + buf[pos]
            if pos > end:
                raise WireError("message", "truncated message")
        elif wire_type == _VARINT and pos < end and buf[pos] < 0x80:
            value = pos
            pos += 1
        elif wire_type == _SGROUP:
            value, pos = pos, _skip_group(buf, pos, end, number, depth, budget)
        else:
            value, pos = _skip_value(buf, pos, end, wire_type)
        yield number, wire_type, start, value, pos


def _parse_tensor(view: memoryview, pos: int, end: int, budget: _Budget, into: WireTensor | None = None) -> WireTensor:
    t = into or WireTensor()  # a repeated occurrence of a singular field merges, as in protobuf
    # Fields of another wire type than their declared one are unknown fields to protobuf:
    # skipped here.
    for number, wire_type, _, value, stop in _fields(view, pos, end, budget, _MAX_DEPTH - 1):
        if number == _T_DATA and wire_type == _LEN:
            t.data = view[value:stop]
        elif number == _T_SHAPE:
            if wire_type == _LEN:  # packed
                shape = t.shape
                while value < stop:
                    budget.left -= 1
                    if budget.left < 0:
                        raise TooManyFields()
                    dim, value = _read_varint(view, value, stop)
                    shape.append(dim if dim < 1 << 63 else dim - (1 << 64))
            elif wire_type == _VARINT:
                t.shape.append(_signed(_read_varint(view, value, stop)[0]))
        elif number == _T_DTYPE and wire_type == _VARINT:
            t.dtype = _int32(_read_varint(view, value, stop)[0])
        elif number == _T_FORMAT and wire_type == _VARINT:
            t.format = _int32(_read_varint(view, value, stop)[0])
    return t


def _tensor_fields(arr: np.ndarray, code: int, fmt: int, number: int, offset: int) -> list[bytes | memoryview]:
    """The parts of one Tensor field whose first byte lands at `offset` in the message,
    padded so the payload starts ALIGNMENT-aligned."""
    head = []
    if arr.ndim:
        dims = b"".join([_varint(d) for d in arr.shape])
        head += [_SHAPE_KEY, _varint(len(dims)), dims]
    if code:
        head += [_DTYPE_KEY, _varint(code)]
    if fmt:
        head += [_FORMAT_KEY, _varint(fmt)]
    nbytes = arr.nbytes
    head += [_DATA_KEY, _varint(nbytes)]
    head_bytes = b"".join(head)
    tag = _tag(number, _LEN)
    fixed = len(head_bytes) + nbytes
    before_payload = offset + len(tag) + len(head_bytes)
    # The padding depends on the size of the body length's varint, which depends on the
    # padding: take the first consistent pair (in practice the first one tried).
    pad = b""
    for size in range(_varint_size(fixed), 11):
        for extra in (0, ALIGNMENT):
            want = (-(before_payload + size)) % ALIGNMENT + extra
            if want == 1:
                want += ALIGNMENT  # the smallest padding field is 2 bytes
            if _varint_size(fixed + want) == size:
                pad = _PADS[want]
                break
        else:
            continue
        break
    # The padding (an unknown field) goes first in the Tensor, the data key last.
    parts: list[bytes | memoryview] = [b"".join((tag, _varint(fixed + len(pad)), pad, head_bytes))]
    if nbytes:
        parts.append(_payload(arr))
    return parts


def split_field(raw: bytes, number: int) -> tuple[list[memoryview], list[memoryview]]:
    """The message without the top-level length-delimited field `number` (for the protobuf
    runtime), and the occurrences of that field, all as views of `raw` (no copy: a caller
    checks the size of the rest before it joins it)."""
    view = memoryview(raw)
    found, rest = [], []
    kept = 0  # the start of the fields kept since the last one taken out
    for n, wire_type, start, value, stop in _fields(view, 0, len(view), _Budget()):
        if n == number and wire_type == _LEN:
            found.append(view[value:stop])
            rest.append(view[kept:start])
            kept = stop
    rest.append(view[kept:])
    return rest, found


def check_fields(raw: bytes) -> None:
    """Refuse a message of more than MAX_FIELDS fields (at the top level and in groups)
    before the protobuf runtime builds an object for each."""
    view = memoryview(raw)
    for _ in _fields(view, 0, len(view), _Budget()):
        pass


def field_header(number: int, nbytes: int) -> bytes:
    """The tag and length of a length-delimited field of `nbytes`."""
    return _tag(number, _LEN) + _varint(nbytes)


def bytes_field(number: int, payload: memoryview) -> list[bytes | memoryview]:
    """The parts of a length-delimited field holding `payload` (joined with one copy)."""
    return [field_header(number, payload.nbytes), payload]


def array_bytes(arr: np.ndarray) -> memoryview:
    """The elements of an array in wire form (C order, little-endian) as bytes, no copy."""
    return _payload(arr)


# ---------------------------------------------------------------------------------------
# Messages


@dataclass
class Decoded:
    """A received message: `message` holds every field except the Tensor ones, which are
    in `tensors` by field name (a list for repeated fields)."""

    message: Any  # an instance of the codec's message class
    tensors: dict[str, Any]  # a WireTensor, or a list of them for a repeated field
    nbytes: int = 0
    # Arguments an endpoint with parameters of its own (KServe) has already made canonical
    # (tensorops.protocol.wire.attribute_value): they stand for the message's fields.
    attributes: dict[str, Any] = field(default_factory=dict)


class MessageCodec:
    """Serializer and deserializer of one message type whose Tensor fields (singular or
    repeated, at the top level) are handled without the protobuf runtime when they are
    large. Small messages go through the protobuf runtime, which is faster for them."""

    def __init__(self, message_class: type[Message]):
        self.message_class = message_class
        self.tensor_fields: dict[int, tuple[str, bool]] = {}  # number -> (name, repeated)
        for f in message_class.DESCRIPTOR.fields:
            if f.message_type is not None and f.message_type.full_name == tensor_pb2.Tensor.DESCRIPTOR.full_name:
                self.tensor_fields[f.number] = (f.name, f.is_repeated)
        self.numbers = {name: number for number, (name, _) in self.tensor_fields.items()}
        self.repeated = frozenset(name for name, rep in self.tensor_fields.values() if rep)
        self.singular = tuple(name for name, rep in self.tensor_fields.values() if not rep)

    def decode(self, raw: bytes) -> Decoded:
        return self.decode_with_protobuf(raw) if len(raw) <= SMALL_MESSAGE else self.decode_in_place(raw)

    def decode_in_place(self, raw: bytes) -> Decoded:
        """The large-message path: Tensor fields read from the wire format, their payloads
        views of `raw`; the other fields parsed by the protobuf runtime. Decodes every input
        exactly as decode_with_protobuf does, and refuses what it refuses."""
        if not self.tensor_fields:  # nothing to read in place (and protobuf's rules for
            return self.decode_with_protobuf(raw)  # messages without fields differ)
        view = memoryview(raw)
        tensors: dict[str, Any] = {name: [] for name in self.repeated}
        rest = []
        kept = 0  # the start of the other fields since the last Tensor field
        budget = _Budget()
        for number, wire_type, start, value, stop in _fields(view, 0, len(view), budget):
            spec = self.tensor_fields.get(number)
            if spec is None or wire_type != _LEN:
                continue
            rest.append(view[kept:start])
            kept = stop
            name, repeated = spec
            if repeated:
                operands = tensors[name]
                if len(operands) == MAX_OPERANDS:
                    raise too_many_operands(name)
                operands.append(_parse_tensor(view, value, stop, budget))
            else:
                tensors[name] = _parse_tensor(view, value, stop, budget, tensors.get(name))
        rest.append(view[kept:])
        return Decoded(self._parse(b"".join(rest)), tensors, len(raw))

    def _parse(self, raw: bytes) -> Message:
        try:
            return self.message_class.FromString(raw)
        except Exception as exc:  # google.protobuf.message.DecodeError
            raise WireError("message", f"cannot parse {self.message_class.DESCRIPTOR.name}: {exc}") from None

    def decode_with_protobuf(self, raw: bytes) -> Decoded:
        """The small-message path: the whole message parsed by the protobuf runtime
        (`message` then holds the Tensor fields too)."""
        message = self._parse(raw)
        tensors: dict[str, Any] = {}
        for name in self.singular:
            if message.HasField(name):
                t = getattr(message, name)
                # shape[:] is a list, built faster than list(shape) by the protobuf runtime
                tensors[name] = WireTensor(t.shape[:], t.dtype, t.format, t.data)
        for name in self.repeated:
            operands = getattr(message, name)
            if len(operands) > MAX_OPERANDS:
                raise too_many_operands(name)
            tensors[name] = [WireTensor(t.shape[:], t.dtype, t.format, t.data) for t in operands]
        return Decoded(message, tensors, len(raw))

    def encode(self, message: Message | None = None, tensors: dict[str, Any] | None = None) -> bytes:
        """`tensors` maps field names to (array in wire form, wire dtype, format) triples,
        or lists of them for repeated fields."""
        if not tensors:
            return message.SerializeToString() if message is not None else b""
        triples = [(name, t) for name, value in tensors.items() for t in (value if name in self.repeated else (value,))]
        if sum(t[0].nbytes for _, t in triples) <= SMALL_MESSAGE:
            message = message if message is not None else self.message_class()
            for name, (arr, code, fmt) in triples:
                t = getattr(message, name).add() if name in self.repeated else getattr(message, name)
                if arr.ndim:
                    t.shape.extend(arr.shape)
                t.dtype = code
                if fmt:
                    t.format = fmt
                t.data = arr.tobytes()
            return message.SerializeToString()
        head = message.SerializeToString() if message is not None else b""
        parts: list[bytes | memoryview] = [head]
        offset = len(head)
        for name, (arr, code, fmt) in triples:
            field_parts = _tensor_fields(arr, code, fmt, self.numbers[name], offset)
            offset += sum(len(p) if isinstance(p, bytes) else p.nbytes for p in field_parts)
            parts.extend(field_parts)
        return b"".join(parts)


def too_many_operands(name: str, count: int | None = None) -> WireError:
    """The refusal of more than MAX_OPERANDS tensors in the repeated field `name` (`count`
    when known; a decoder stops counting at the limit)."""
    return WireError(name, f"at most {MAX_OPERANDS} tensors (the limit), got {'more' if count is None else count}")


def encode_tensor(value: object, name: str, fmt: int = 0) -> tuple[np.ndarray, int, int]:
    """The (array, wire dtype, format) triple MessageCodec.encode takes."""
    arr, code = wire_array(value, name)
    return arr, code, fmt
