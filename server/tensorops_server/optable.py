"""The op table: one entry per operation served, and the generic conversion of a request into
the native function's arguments.

An entry names the operation (its RPC, request and response messages come from the wire
table tensorops.wire.OPERATIONS) and the tensorops_native function that computes it. The
request's fields are the function's arguments by name:

- Tensor fields become read-only arrays over the request bytes (codec.to_array checks the
  wire form: dtype, shape, payload length, size limit);
- enum fields become the API names ("exp", "sum", "split");
- an unset optional field, an UNSPECIFIED enum or an empty repeated field means "not
  given": the argument is left out when the function has a default, and refused as
  missing (INVALID_ARGUMENT naming the field) when it has none;
- the Format of the operation's image tensors becomes its `format` argument; any other
  tensor with a format is refused.

Messages about the wire form speak the wire's language, whatever the caller's: enum values
by their proto names and numbers ("UNARY_OP_EXP (5)"), never the Python API's positions,
and never the text of a NumPy or protobuf exception. What an operation accepts beyond that
is tensorops_native's business: its ArgumentError / ArgumentTypeError become
INVALID_ARGUMENT naming the argument.

Each entry also says how many bytes its result takes, from the native arguments and before
anything is allocated (`result`): the server reserves them, and the encoded response, in
the call's memory account (admission.py) before the kernel runs. Most results are as
large as their image tensor; channel_sum's and the quantized inner product's can be far
larger than their request.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any, Callable

import numpy as np

import tensorops_native
from tensorops.protocol import codec, dtypes, wire
from tensorops.v1 import tensor_pb2

from . import errors


@dataclass(frozen=True)
class TensorSpec:
    """What a tensor of an operation may be, for the self-description of the KServe
    endpoint (its checks are tensorops_native's): the datatypes accepted, in KServe's
    names, and the dimensions (-1: any size; None: any number of dimensions)."""

    datatypes: tuple[str, ...] = ("FP32",)
    dims: tuple[int, ...] | None = None


# Image tensors: (batch, channels, *spatial) or (batch, *spatial, channels), any number of
# spatial dimensions; tensors of "real numbers" (scales, weights) convert to FP32.
_IMAGE = TensorSpec()
_REAL_VECTOR = TensorSpec(("FP32", "FP64", "FP16", "BF16", "INT32", "INT64", "INT8", "UINT8"), (-1,))
_MATRIX = TensorSpec(("FP32",), (-1, -1))


def _nbytes(value) -> int:
    """Bytes of an array argument (of the first one of a list); 0 for anything else, which
    the kernel refuses, naming it."""
    if isinstance(value, list):
        value = value[0] if value else None
    return value.nbytes if isinstance(value, np.ndarray) else 0


def result_like(name: str) -> Callable[[dict], tuple[str, int]]:
    """A result as large as the argument `name` (same shape and dtype)."""
    return lambda kwargs: (name, _nbytes(kwargs.get(name)))


def _shuffle_result(kwargs: dict) -> tuple[str, int]:
    return "x0", _nbytes(kwargs.get("x0")) + _nbytes(kwargs.get("x1"))


def _channel_sum_result(kwargs: dict) -> tuple[str, int]:
    """(batch, channels) float32, whatever the spatial size (0 included)."""
    x = kwargs.get("x")
    if not isinstance(x, np.ndarray) or x.ndim < 2:
        return "x", 0
    channels = x.shape[-1] if kwargs.get("format") == "nhwc" else x.shape[1]
    return "x", x.shape[0] * channels * 4


def product_result(a, b, trans_b: bool) -> tuple[str, int]:
    """The quantized inner product's (M, N) uint8 result: M rows of a, N columns of b."""
    if not (isinstance(a, np.ndarray) and a.ndim == 2 and isinstance(b, np.ndarray) and b.ndim == 2):
        return "a", 0
    return "a", a.shape[0] * (b.shape[0] if trans_b else b.shape[1])


def _product_result(kwargs: dict) -> tuple[str, int]:
    return product_result(kwargs.get("a"), kwargs.get("b"), bool(kwargs.get("trans_b")))


@dataclass(frozen=True)
class Entry:
    """One served operation: the wire operation and the native callable."""

    op: wire.Operation
    native: Callable[..., Any]
    # Extra conversion of the arguments for operations the generic rules do not cover.
    adapt: Callable[[dict], dict] | None = field(default=None, compare=False)
    # The tensors (request and response fields) that are not FP32 of any shape; the first
    # datatype of a result is the one it has for the first datatype of the inputs.
    tensors: dict[str, TensorSpec] = field(default_factory=dict, compare=False)
    # (the argument that asks for it, the result's bytes) from the native arguments.
    result: Callable[[dict], tuple[str, int]] = field(default=result_like("x"), compare=False)

    def spec(self, name: str) -> TensorSpec:
        return self.tensors.get(name, _IMAGE)

    @property
    def name(self) -> str:
        return self.op.name

    @cached_property
    def defaults(self) -> frozenset[str]:
        params = inspect.signature(self.native).parameters.values()
        return frozenset(p.name for p in params if p.default is not inspect.Parameter.empty)

    @cached_property
    def parameters(self) -> frozenset[str]:
        return frozenset(inspect.signature(self.native).parameters)

    def arguments(self, decoded: codec.Decoded, max_tensor_bytes: int | None,
                  reserve: Callable[[int, str], None] | None = None) -> tuple[dict, int]:
        """The native keyword arguments of a request, and the request's format (wire enum).
        `reserve(nbytes, field)` is charged for a tensor copied out of the request."""
        kwargs = native_arguments(self.op, decoded, max_tensor_bytes, self.defaults, reserve=reserve)
        fmt = request_format(self.op, decoded)
        if fmt:
            kwargs["format"] = codec.FORMAT_NAMES[fmt]
        if self.adapt is not None:
            kwargs = self.adapt(kwargs)
        return kwargs, fmt


_TENSOR, _TENSORS, _ENUM, _REPEATED, _OPTIONAL, _PLAIN = range(6)

_DTYPE_ENUM = tensor_pb2.DataType.DESCRIPTOR
_FORMAT_ENUM = tensor_pb2.Format.DESCRIPTOR
ITEMSIZE = {d.wire: d.itemsize for d in dtypes.DTYPES}  # bytes per element of each wire dtype
# The largest array NumPy can describe: the product of its non-zero dimensions times the
# element size fits in a signed 64-bit integer (even when another dimension is 0).
MAX_DESCRIBED_BYTES = 2**63 - 1


@lru_cache(maxsize=None)
def _plan(message_class) -> tuple:
    """How each field of a request message becomes an argument: (name, kind, enum descriptor)."""
    message_codec = codec.MessageCodec(message_class)
    plan = []
    for f in message_class.DESCRIPTOR.fields:
        if f.name in message_codec.numbers:
            kind = _TENSORS if f.is_repeated else _TENSOR
        elif f.enum_type is not None:
            kind = _ENUM
        elif f.is_repeated:
            kind = _REPEATED
        else:
            kind = _OPTIONAL if f.has_presence else _PLAIN
        plan.append((f.name, kind, f.enum_type if kind == _ENUM else None))
    return tuple(plan)


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
        raise errors.invalid(name, f"{prefix}expected one of {wire.wire_choices(enum)}, "
                                   f"got {wire.wire_value(enum, number)}")
    return value


def tensor_argument(op: wire.Operation, tensor: codec.WireTensor, name: str, max_tensor_bytes: int | None,
                    image: bool, reserve: Callable[[int, str], None] | None = None) -> Any:
    """A received tensor as an array, after the checks whose failures the codec would word
    in NumPy's terms or without the wire's enum numbers."""
    if tensor.format and not image:
        fmt = wire.wire_value(_FORMAT_ENUM, tensor.format)
        if op.layout:
            several = len(op.layout) > 1
            reason = (f"only the image tensor{'s' if several else ''} {' and '.join(op.layout)} of {op.rpc} "
                      f"carr{'y' if several else 'ies'} a format")
        else:
            reason = f"{op.rpc} has no layout"
        raise errors.invalid(f"{name}.format", f"{reason}: leave it unset (FORMAT_UNSPECIFIED), got {fmt}")
    itemsize = ITEMSIZE.get(tensor.dtype)
    if itemsize is None:
        raise errors.invalid(f"{name}.dtype", f"expected one of {wire.wire_choices(_DTYPE_ENUM)}, "
                                             f"got {wire.wire_value(_DTYPE_ENUM, tensor.dtype)}")
    shape = tensor.shape
    # Without a 0 dimension the payload's length bounds the size; negative dimensions and
    # too many of them are the codec's to name.
    if 0 in shape and len(shape) <= codec.MAX_NDIM and min(shape) >= 0:
        if math.prod(filter(None, shape)) * itemsize > MAX_DESCRIBED_BYTES:
            raise errors.invalid(f"{name}.shape", f"the tensor has too many elements: {list(shape)} of "
                                 f"{_DTYPE_ENUM.values_by_number[tensor.dtype].name} describes more than 2**63 - 1 "
                                 "bytes (counting the non-zero dimensions, even when another one is 0)")
    try:
        return codec.to_array(tensor, name, max_bytes=max_tensor_bytes, reserve=reserve)
    except codec.WireError as exc:
        raise errors.from_wire(exc) from None


def native_arguments(op: wire.Operation, decoded: codec.Decoded, max_tensor_bytes: int | None,
                     defaults: frozenset[str] = frozenset(), skip: tuple[str, ...] = (),
                     reserve: Callable[[int, str], None] | None = None) -> dict:
    """The native keyword arguments of a request. A field left unset whose argument has no
    default (is not in `defaults`) is refused as missing."""
    message, tensors = decoded.message, decoded.tensors
    kwargs: dict[str, Any] = {}
    for name, kind, enum in _plan(op.request_class):
        if name in skip:
            continue
        required = name not in defaults
        if kind == _TENSOR:
            tensor = tensors.get(name)
            if tensor is None:
                if required:
                    raise missing(name, tensor=True)
                continue
            value = tensor_argument(op, tensor, name, max_tensor_bytes, name in op.layout, reserve)
        elif kind == _TENSORS:
            value = [tensor_argument(op, t, f"{name}[{i}]", max_tensor_bytes, name in op.layout, reserve)
                     for i, t in enumerate(tensors[name])]
        elif kind == _ENUM:
            value = enum_argument(enum, getattr(message, name), name, required)
        elif kind == _REPEATED:
            value = list(getattr(message, name)) or None
            if value is None and required:
                raise errors.invalid(name, f"required field `{name}` is missing (it takes at least one value)")
        elif kind == _OPTIONAL:
            value = getattr(message, name) if message.HasField(name) else None
            if value is None and required:
                raise missing(name)
        else:
            value = getattr(message, name)
        if value is None:
            continue
        kwargs[name] = value
    return kwargs


def request_format(op: wire.Operation, decoded: codec.Decoded) -> int:
    """The Format shared by the operation's image tensors (UNSPECIFIED ones agree with any)."""
    fmt, source = 0, None
    for name in op.layout:
        tensor = decoded.tensors.get(name)
        if tensor is None or not tensor.format:
            continue
        if tensor.format not in codec.FORMAT_NAMES:
            raise errors.invalid(f"{name}.format", f"expected one of {wire.wire_choices(_FORMAT_ENUM, unspecified=True)}, "
                                                   f"got {wire.wire_value(_FORMAT_ENUM, tensor.format)}")
        if fmt and tensor.format != fmt:
            raise errors.invalid(f"{name}.format", f"{tensor_pb2.Format.Name(tensor.format)} differs from "
                                 f"{source}.format {tensor_pb2.Format.Name(fmt)}")
        fmt, source = tensor.format, name
    return fmt


def _normalize_arguments(kwargs: dict) -> dict:
    """normalize(): the FusedActivation message becomes (name, *parameters)."""
    activation = kwargs.get("activation")
    if activation is not None:
        enum = activation.DESCRIPTOR.fields_by_name["type"].enum_type
        name = enum_argument(enum, activation.type, "activation.type", required=True)
        kwargs["activation"] = (name, *activation.params)
    return kwargs


def _entry(name: str, native_name: str | None = None, **kwargs) -> Entry | None:
    native = getattr(tensorops_native, native_name or name, None)
    return None if native is None else Entry(wire.OPERATIONS[name], native, **kwargs)


_QIP_BIAS = TensorSpec(("INT32", "INT64", "INT8", "UINT8"), (-1,))
_NORM_TENSORS = {"scale": _REAL_VECTOR, "shift": _REAL_VECTOR}


def build_table() -> dict[str, Entry]:
    """Every operation of the wire table that this tensorops_native provides."""
    bf16 = TensorSpec(("FP32", "BF16"))
    entries = (
        _entry("normalize_l2", tensors={"scale": _REAL_VECTOR}),
        _entry("layer_norm_channels", tensors={"x": bf16, "y": bf16, **_NORM_TENSORS}),
        _entry("layer_norm_spatial", tensors=_NORM_TENSORS),
        _entry("channel_norm", tensors=_NORM_TENSORS),
        _entry("channel_sum", tensors={"x": TensorSpec(("BF16",)), "y": _MATRIX}, result=_channel_sum_result),
        _entry("eltwise", tensors={"weights": _REAL_VECTOR}, result=result_like("inputs")),
        _entry("lrn_cross_channels", tensors={"k": TensorSpec(_REAL_VECTOR.datatypes, (3,))}),
        _entry("shuffle", result=_shuffle_result),
        _entry("softmax", tensors={"x": bf16, "y": bf16}),
        _entry("tiled_scale_2d", tensors={"x": TensorSpec(dims=(-1, -1, -1, -1)), "ver": _MATRIX, "hor": _MATRIX}),
        _entry("unary"),
        _entry("normalize", adapt=_normalize_arguments,
               tensors={"x": TensorSpec(("FP32", "FP16", "BF16")), "y": TensorSpec(("FP32", "FP16", "BF16")),
                        "scale": TensorSpec(_REAL_VECTOR.datatypes), "bias": TensorSpec(_REAL_VECTOR.datatypes)}),
        _entry("quantized_inner_product", tensors=QIP_TENSORS, result=_product_result),
    )
    return {e.name: e for e in entries if e is not None}


# The quantized inner product's tensors, one-shot and in sessions.
QIP_TENSORS = {"a": TensorSpec(("UINT8",), (-1, -1)), "b": TensorSpec(("INT8",), (-1, -1)),
               "b_scale": _REAL_VECTOR, "bias": _QIP_BIAS, "c": TensorSpec(("UINT8",), (-1, -1))}
