"""Arguments of the Python API <-> tensorops.v1 messages, for every operation of the table
(tensorops.protocol.table), shared by the client and the server.

The mapping is generic: a request field has the name of the Python argument it carries.
Tensor fields hold arrays; enum fields hold the names of the Python API ("exp", "sum",
"split"); optional scalar fields left unset mean the argument's default; the `format`
argument travels as the Format of the operation's image tensors. `attribute_value` is the
one place that checks and canonicalizes a non-tensor argument, for the client's encoder and
for the KServe endpoint's parameters alike.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from ..v1 import tensor_pb2
from . import codec, dtypes
from .codec import WireError
from .table import (  # noqa: F401
    CREATE_SESSION,
    FORWARD_SESSION,
    OPERATIONS,
    SERVICE,
    SERVICE_NAME,
    Field,
    Kind,
    Operation,
    message_class,
    method_path,
)

# Both sides default to the same message size limit, so what one sends the other accepts.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Longest name a caller chooses (models, shared-memory regions, inputs, outputs, parameters,
# request ids) and longest string value of a request parameter: the server keeps some of them
# and echoes them in its replies.
MAX_NAME_CHARS = 256


# ---------------------------------------------------------------------------------------
# Enumerations: proto enum <-> the names (and Simd integer values) of the Python API


def _enum_prefix(enum_descriptor: EnumDescriptor) -> str:
    unspecified: str = enum_descriptor.values_by_number[0].name
    return unspecified[: -len("UNSPECIFIED")]


_ENUM_NAMES: dict[str, dict[int, str]] = {}


def enum_names(enum_descriptor: EnumDescriptor) -> dict[int, str]:
    """Wire number -> API name ('exp'), without the UNSPECIFIED value."""
    names = _ENUM_NAMES.get(enum_descriptor.full_name)
    if names is None:
        prefix = _enum_prefix(enum_descriptor)
        names = _ENUM_NAMES[enum_descriptor.full_name] = {
            v.number: v.name[len(prefix) :].lower() for v in enum_descriptor.values if v.number
        }
    return names


def encode_enum(enum_descriptor: EnumDescriptor, value: object, name: str) -> int:
    """An API value (a name, case-insensitive, or the Simd integer value, which is the
    position in the enum) as the wire number."""
    names = enum_names(enum_descriptor)
    if isinstance(value, str):
        for number, api_name in names.items():
            if api_name == value.lower():
                return number
    elif isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        ordered = sorted(names)
        if 0 <= int(value) < len(ordered):
            return ordered[int(value)]
    allowed = ", ".join(f"'{n}' ({i})" for i, n in enumerate(names[k] for k in sorted(names)))
    raise WireError(name, f"expected one of {allowed}, got {value!r}")


def decode_enum(enum_descriptor: EnumDescriptor, number: int) -> str | None:
    """The API name of a wire number; None for UNSPECIFIED or a number this side does not
    know (the operation then reports the argument as missing or invalid)."""
    return enum_names(enum_descriptor).get(number)


def wire_choices(enum_descriptor: EnumDescriptor, *, unspecified: bool = False) -> str:
    """The values of a proto enum as the wire knows them, for messages sent to callers of
    any language: "UNARY_OP_ABS (1), UNARY_OP_CEIL (2), ..." (without UNSPECIFIED unless
    asked)."""
    return ", ".join(f"{v.name} ({v.number})" for v in enum_descriptor.values if unspecified or v.number)


def wire_value(enum_descriptor: EnumDescriptor, number: int) -> str:
    """A received enum number as a message shows it: "0 (UNARY_OP_UNSPECIFIED)" or "99"."""
    value = enum_descriptor.values_by_number.get(number)
    return f"{number} ({value.name})" if value is not None else str(number)


def encode_format(value: object) -> int:
    """A `format` of the Python API (a name, case-insensitive, or its position in the
    format table) as the wire's Format."""
    codes = list(dtypes.FORMATS.values())
    if isinstance(value, str) and value.lower() in dtypes.FORMATS:
        return dtypes.FORMATS[value.lower()]
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)) and 0 <= int(value) < len(codes):
        return codes[int(value)]
    allowed = ", ".join(f"'{name}' ({i})" for i, name in enumerate(dtypes.FORMATS))
    raise WireError("format", f"expected one of {allowed}, got {value!r}")


# ---------------------------------------------------------------------------------------
# Client side: arguments -> request bytes, response bytes -> result


@dataclass
class Request:
    data: bytes
    bf16_bits: bool  # some input was uint16 holding BF16 bits: BF16 results come back as uint16


def _sequence(value: Any, name: str) -> list[Any]:
    if isinstance(value, (str, bytes)):
        raise WireError(name, f"expected a sequence, got {type(value).__name__}")
    try:
        return list(value)
    except TypeError:
        raise WireError(name, f"expected a sequence, got {type(value).__name__}") from None


def _activation(value: Any, enum_descriptor: EnumDescriptor) -> tuple[str | float, ...]:
    """normalize's activation: a name or (name, *parameters), as (api name, *floats)."""
    if isinstance(value, str):
        name, params = value, []
    elif isinstance(value, (tuple, list)) and value and isinstance(value[0], str):
        name, params = value[0], list(value[1:])
    else:
        raise WireError("activation", f"expected None, a name or (name, *parameters), got {value!r}")
    api_name = enum_names(enum_descriptor)[encode_enum(enum_descriptor, name, "activation")]
    for p in params:
        if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real):
            raise WireError("activation", f"parameters must be real numbers, got {p!r}")
    return (api_name, *(float(p) for p in params))


def attribute_value(op: Operation, name: str, value: Any) -> Any:
    """A non-tensor argument as the native function takes it, checked against its field:
    an enum as its API name, a structured value as its tuple, a repeated field as a list,
    a number of the field's type. WireError names the argument when it cannot be one."""
    return set_attribute(op.request_class(), op, name, value)


def set_attribute(message: Message, op: Operation, name: str, value: Any) -> Any:
    """attribute_value's check and canonical value, also set into the request `message`
    (protobuf's setters do the range and type checks)."""
    f = op.field(name)
    if name in op.canonical:
        value = op.canonical[name](value)
    if f.kind is Kind.ENUM:
        number = encode_enum(f.enum, value, name)
        setattr(message, name, number)
        return enum_names(f.enum)[number]
    if f.kind is Kind.MESSAGE:
        sub = getattr(message, name)
        enum = sub.DESCRIPTOR.fields_by_name["type"].enum_type
        canonical = _activation(value, enum)
        sub.type = encode_enum(enum, canonical[0], name)
        sub.params.extend(canonical[1:])
        return canonical
    d = f.descriptor
    values = _sequence(value, name) if f.kind is Kind.REPEATED else [value]
    if d.type != d.TYPE_BOOL and any(isinstance(v, (bool, np.bool_)) for v in values):
        raise WireError(name, f"expected {_type_name(d)}, got a bool")  # as the operation would say
    try:
        if f.kind is Kind.REPEATED:
            getattr(message, name).extend(values)
            return list(getattr(message, name))
        setattr(message, name, value)
        return getattr(message, name)
    except (TypeError, ValueError) as exc:
        raise WireError(name, f"cannot be sent as {_type_name(d)}: {exc}") from None


def build_request(op: Operation, arguments: dict[str, Any]) -> Request:
    """Encode call arguments (None = the default) as the request of `op`."""
    fmt_value = arguments.get("format")
    fmt = encode_format(fmt_value) if fmt_value is not None else 0
    message = op.request_class()
    tensors: dict[str, Any] = {}
    bits = False
    for name, value in arguments.items():
        if value is None or name == "format":
            continue
        f = op.field(name)
        if f.kind is Kind.TENSOR:
            arr, code = codec.wire_array(value, name)
            tensors[name] = (arr, code, fmt if f.image else 0)
            bits = bits or _is_bits(value)
        elif f.kind is Kind.TENSORS:
            items = _sequence(value, name)
            if len(items) > codec.MAX_OPERANDS:  # the server would refuse them: said before encoding
                raise codec.too_many_operands(name, len(items))
            tensors[name] = [codec.encode_tensor(v, f"{name}[{i}]", fmt if f.image else 0) for i, v in enumerate(items)]
            bits = bits or any(_is_bits(v) for v in items)
        else:
            set_attribute(message, op, name, value)
    return Request(op.request_codec.encode(message, tensors), bits)


_UINT16 = np.dtype(np.uint16)


def _is_bits(value: object) -> bool:
    dtype = getattr(value, "dtype", None)
    return dtype is not None and dtype == _UINT16


def _type_name(f: FieldDescriptor) -> str:
    names = {
        f.TYPE_DOUBLE: "a real number",
        f.TYPE_INT64: "an integer",
        f.TYPE_BOOL: "a bool",
        f.TYPE_STRING: "a string",
    }
    kind = names.get(f.type, "a value")
    return f"a sequence of {kind.split(' ', 1)[1]}s" if f.is_repeated else kind


def decode_response(op: Operation, raw: bytes, bf16_bits: bool = False) -> np.ndarray | tuple[np.ndarray, ...]:
    """The result of `op`: one array, or a tuple when the response has several tensors.
    Arrays are new and writable, as in-process results are."""
    decoded = op.response_codec.decode(raw)
    results = []
    for name in op.outputs:
        tensor = decoded.tensors.get(name)
        if tensor is None:
            raise WireError(name, "missing from the response")
        arr = codec.to_array(tensor, name).copy()
        if bf16_bits and tensor.dtype == tensor_pb2.DATA_TYPE_BF16:
            arr = arr.view(np.uint16)
        results.append(arr)
    return results[0] if len(results) == 1 else tuple(results)
