"""The served operations: each row of the operation table (tensorops.protocol.table) bound
to its tensorops_native callable, and the generic conversion of a request into that
callable's keyword arguments.

The request's fields are the function's arguments by name:

- Tensor fields become read-only arrays over the request bytes (codec.to_array checks the
  wire form: dtype, shape, payload length, size limit);
- enum fields become the API names ("exp", "sum", "split"), a message field (normalize's
  activation) its (name, *parameters) tuple;
- an unset optional field, an UNSPECIFIED enum or an empty repeated field means "not
  given": the argument is left out when the table gives it a default, and refused as
  missing (INVALID_ARGUMENT naming the field) when it has none;
- the Format of the operation's image tensors becomes its `format` argument; any other
  tensor with a format is refused.

Messages about the wire form speak the wire's language, whatever the caller's: enum values
by their proto names and numbers ("UNARY_OP_EXP (5)"), never the Python API's positions,
and never the text of a NumPy or protobuf exception. What an operation accepts beyond that
is tensorops_native's business: its ArgumentError / ArgumentTypeError become
INVALID_ARGUMENT naming the argument.

The table's `result_shapes` says how many bytes a result takes, from the native arguments
and before anything is allocated: the server reserves them, and the encoded response, in
the call's memory account (admission.py) before the kernel runs.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import tensorops_native
from tensorops.protocol import codec, dtypes, table, wire
from tensorops.protocol.table import Kind
from tensorops.v1 import tensor_pb2

from . import errors


@dataclass(frozen=True)
class Entry:
    """One served operation: its row of the table and the native callable."""

    op: table.Operation
    native: Callable[..., Any]

    @property
    def name(self) -> str:
        return self.op.name

    @cached_property
    def parameters(self) -> frozenset[str]:
        return frozenset(inspect.signature(self.native).parameters)

    def arguments(
        self, decoded: codec.Decoded, max_tensor_bytes: int | None, reserve: Callable[[int, str], None] | None = None
    ) -> tuple[dict, int]:
        """The native keyword arguments of a request, and the request's format (wire enum).
        `reserve(nbytes, field)` is charged for a tensor copied out of the request."""
        kwargs = native_arguments(self.op, decoded, max_tensor_bytes, reserve=reserve)
        fmt = request_format(self.op, decoded)
        if fmt:
            kwargs["format"] = dtypes.FORMAT_NAMES[fmt]
        return kwargs, fmt


_DTYPE_ENUM = tensor_pb2.DataType.DESCRIPTOR
_FORMAT_ENUM = tensor_pb2.Format.DESCRIPTOR
# The largest array NumPy can describe: the product of its non-zero dimensions times the
# element size fits in a signed 64-bit integer (even when another dimension is 0).
MAX_DESCRIBED_BYTES = 2**63 - 1


def missing(name: str, tensor: bool = False) -> errors.Failure:
    what = "tensor" if tensor else "field"
    return errors.invalid(name, f"required {what} `{name}` is missing")


def enum_argument(enum, number: int, name: str, required: bool) -> str | None:
    """The API name of a received enum number; None for UNSPECIFIED when the argument has a
    default. INVALID_ARGUMENT, in the wire's terms, for a number the enum does not define
    and for UNSPECIFIED when the argument is required."""
    value = wire.enum_names(enum).get(number)
    if value is None and (number or required):
        prefix = "required: " if not number else ""
        raise errors.invalid(
            name, f"{prefix}expected one of {wire.wire_choices(enum)}, got {wire.wire_value(enum, number)}"
        )
    return value


def tensor_argument(
    op: table.Operation,
    tensor: codec.WireTensor,
    name: str,
    max_tensor_bytes: int | None,
    image: bool,
    reserve: Callable[[int, str], None] | None = None,
) -> Any:
    """A received tensor as an array, after the checks whose failures the codec would word
    in NumPy's terms or without the wire's enum numbers."""
    if tensor.format and not image:
        fmt = wire.wire_value(_FORMAT_ENUM, tensor.format)
        if op.layout:
            several = len(op.layout) > 1
            reason = (
                f"only the image tensor{'s' if several else ''} {' and '.join(op.layout)} of {op.rpc} "
                f"carr{'y' if several else 'ies'} a format"
            )
        else:
            reason = f"{op.rpc} has no layout"
        raise errors.invalid(f"{name}.format", f"{reason}: leave it unset (FORMAT_UNSPECIFIED), got {fmt}")
    row = dtypes.BY_WIRE.get(tensor.dtype)
    if row is None:
        raise errors.invalid(
            f"{name}.dtype",
            f"expected one of {wire.wire_choices(_DTYPE_ENUM)}, got {wire.wire_value(_DTYPE_ENUM, tensor.dtype)}",
        )
    shape = tensor.shape
    # Without a 0 dimension the payload's length bounds the size; negative dimensions and
    # too many of them are the codec's to name.
    described = 0 in shape and len(shape) <= codec.MAX_NDIM and min(shape) >= 0
    if described and math.prod(filter(None, shape)) * row.itemsize > MAX_DESCRIBED_BYTES:
        raise errors.invalid(
            f"{name}.shape",
            f"the tensor has too many elements: {list(shape)} of "
            f"{_DTYPE_ENUM.values_by_number[tensor.dtype].name} describes more than 2**63 - 1 "
            "bytes (counting the non-zero dimensions, even when another one is 0)",
        )
    try:
        return codec.to_array(tensor, name, max_bytes=max_tensor_bytes, reserve=reserve)
    except codec.WireError as exc:
        raise errors.from_wire(exc) from None


def native_arguments(
    op: table.Operation,
    decoded: codec.Decoded,
    max_tensor_bytes: int | None,
    skip: tuple[str, ...] = (),
    reserve: Callable[[int, str], None] | None = None,
) -> dict:
    """The native keyword arguments of a request. A field left unset whose argument has no
    default in the table is refused as missing. Attributes the request gives already
    converted (decoded.attributes) are taken as they are."""
    message, tensors, given = decoded.message, decoded.tensors, decoded.attributes
    kwargs: dict[str, Any] = {}
    for f in op.fields:
        name, kind, required = f.name, f.kind, f.required
        if name in skip:
            continue
        if name in given:
            kwargs[name] = given[name]
            continue
        if kind is Kind.TENSOR:
            tensor = tensors.get(name)
            if tensor is None:
                if required:
                    raise missing(name, tensor=True)
                continue
            value = tensor_argument(op, tensor, name, max_tensor_bytes, f.image, reserve)
        elif kind is Kind.TENSORS:
            value = [
                tensor_argument(op, t, f"{name}[{i}]", max_tensor_bytes, f.image, reserve)
                for i, t in enumerate(tensors[name])
            ]
        elif kind is Kind.ENUM:
            value = enum_argument(f.enum, getattr(message, name), name, required)
        elif kind is Kind.MESSAGE:
            value = _structured_argument(message, name) if message.HasField(name) else None
            if value is None and required:
                raise missing(name)
        elif kind is Kind.REPEATED:
            value = list(getattr(message, name)) or None
            if value is None and required:
                raise errors.invalid(name, f"required field `{name}` is missing (it takes at least one value)")
        elif f.has_presence:
            value = getattr(message, name) if message.HasField(name) else None
            if value is None and required:
                raise missing(name)
        else:
            value = getattr(message, name)
        if value is None:
            continue
        kwargs[name] = value
    return kwargs


def _structured_argument(message, name: str) -> tuple:
    """A message field of (type, params), normalize's FusedActivation: (name, *parameters)."""
    sub = getattr(message, name)
    enum = sub.DESCRIPTOR.fields_by_name["type"].enum_type
    return (enum_argument(enum, sub.type, f"{name}.type", required=True), *sub.params)


def request_format(op: table.Operation, decoded: codec.Decoded) -> int:
    """The Format shared by the operation's image tensors (UNSPECIFIED ones agree with any)."""
    fmt, source = 0, None
    for name in op.layout:
        tensor = decoded.tensors.get(name)
        if tensor is None or not tensor.format:
            continue
        if tensor.format not in dtypes.FORMAT_NAMES:
            choices = wire.wire_choices(_FORMAT_ENUM, unspecified=True)
            raise errors.invalid(
                f"{name}.format", f"expected one of {choices}, got {wire.wire_value(_FORMAT_ENUM, tensor.format)}"
            )
        if fmt and tensor.format != fmt:
            raise errors.invalid(
                f"{name}.format",
                f"{tensor_pb2.Format.Name(tensor.format)} differs from {source}.format {tensor_pb2.Format.Name(fmt)}",
            )
        fmt, source = tensor.format, name
    return fmt


def build_table() -> dict[str, Entry]:
    """Every operation of the table that this tensorops_native provides."""
    entries = {}
    for name, op in table.OPERATIONS.items():
        native = getattr(tensorops_native, op.native_name, None)
        if native is not None:
            entries[name] = Entry(op, native)
    return entries
