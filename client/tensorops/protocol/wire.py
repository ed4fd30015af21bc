"""The operations as RPCs: which method serves each Python function, and how call arguments
become a request message (and a response message becomes the result).

Shared by the client and the server. The mapping is generic: a request field has the name
of the Python argument it carries. Tensor fields hold arrays; enum fields hold the names
of the Python API ("exp", "sum", "split"); optional scalar fields left unset mean the argument's
default; the `format` argument travels as the Format of the operation's image tensors.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

import numpy as np

from . import codec
from .codec import WireError
from ..v1 import tensor_pb2, tensorops_pb2

TENSOR, TENSORS, ENUM, SCALAR, REPEATED, MESSAGE = range(6)  # kinds of request fields

SERVICE = tensorops_pb2.DESCRIPTOR.services_by_name["TensorOps"]
SERVICE_NAME = SERVICE.full_name

# Both sides default to the same message size limit, so what one sends the other accepts.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Longest name a caller chooses (models, shared-memory regions, inputs, outputs, parameters,
# request ids) and longest string value of a request parameter: the server keeps some of them
# and echoes them in its replies.
MAX_NAME_CHARS = 256


def method_path(rpc: str) -> str:
    return f"/{SERVICE_NAME}/{rpc}"


def message_class(descriptor):
    return getattr(tensorops_pb2, descriptor.name)


@dataclass(frozen=True)
class Operation:
    """One operation of tensorops_native as an RPC of tensorops.v1.TensorOps."""

    name: str                         # the Python function (tensorops_native.<name>)
    rpc: str                          # the method of the service
    layout: tuple[str, ...] = ()      # image tensors whose Format is the `format` argument
    image_outputs: bool = True        # outputs carry the input layout (else no format)
    # Client side: arguments the generic rules do not cover, turned into their wire form.
    adapt: Callable[[dict], dict] | None = field(default=None, compare=False)

    @cached_property
    def method(self):
        return SERVICE.methods_by_name[self.rpc]

    @cached_property
    def request_class(self):
        return message_class(self.method.input_type)

    @cached_property
    def response_class(self):
        return message_class(self.method.output_type)

    @cached_property
    def request_codec(self) -> codec.MessageCodec:
        return codec.MessageCodec(self.request_class)

    @cached_property
    def response_codec(self) -> codec.MessageCodec:
        return codec.MessageCodec(self.response_class)

    @cached_property
    def request_plan(self) -> dict[str, tuple[int, Any]]:
        """How each argument is encoded: name -> (kind, detail), computed once."""
        plan = {}
        message_codec = self.request_codec
        for f in self.request_class.DESCRIPTOR.fields:
            if f.name in message_codec.numbers:
                plan[f.name] = (TENSORS if f.is_repeated else TENSOR, f.name in self.layout)
            elif f.enum_type is not None:
                plan[f.name] = (ENUM, f.enum_type)
            elif f.message_type is not None:
                plan[f.name] = (MESSAGE, f)
            else:
                plan[f.name] = (REPEATED if f.is_repeated else SCALAR, f)
        return plan

    @cached_property
    def response_fields(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.response_class.DESCRIPTOR.fields)

    @property
    def path(self) -> str:
        return method_path(self.rpc)


def _normalize_arguments(arguments: dict) -> dict:
    """normalize(): a TensorRT bitmask int travels as the indices of its bits, the activation
    (None, a name or (name, *parameters)) as a FusedActivation message, compute_dtype as the
    dtype's name."""
    args = dict(arguments)
    axes = args.get("axes")
    if isinstance(axes, numbers.Integral) and not isinstance(axes, (bool, np.bool_)):
        mask = int(axes)
        if mask < 0:
            raise WireError("axes", f"a bitmask must be non-negative, got {mask}")
        args["axes"] = [i for i in range(mask.bit_length()) if mask >> i & 1]
    if args.get("axes") is not None and not isinstance(args["axes"], (str, bytes)) and \
            hasattr(args["axes"], "__len__") and len(args["axes"]) == 0:
        raise WireError("axes", "the set of axes is empty")
    activation = args.get("activation")
    if activation is not None:
        if isinstance(activation, str):
            name, params = activation, []
        elif isinstance(activation, (tuple, list)) and activation and isinstance(activation[0], str):
            name, params = activation[0], list(activation[1:])
        else:
            raise WireError("activation", f"expected None, a name or (name, *parameters), got {activation!r}")
        message = tensorops_pb2.FusedActivation(
            type=encode_enum(tensorops_pb2.Activation.DESCRIPTOR, name, "activation"))
        for p in params:
            if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real):
                raise WireError("activation", f"parameters must be real numbers, got {p!r}")
            message.params.append(float(p))
        args["activation"] = message
    dtype = args.get("compute_dtype")
    if dtype is not None and not isinstance(dtype, str):
        try:
            args["compute_dtype"] = np.dtype(dtype).name
        except TypeError:
            raise WireError("compute_dtype", f"expected a dtype or its name, got {dtype!r}") from None
    return args


# The stateless operations, in the order of the README's table.
OPERATIONS = {op.name: op for op in (
    Operation("normalize_l2", "NormalizeL2", layout=("x",)),
    Operation("layer_norm_channels", "LayerNormChannels", layout=("x",)),
    Operation("layer_norm_spatial", "LayerNormSpatial", layout=("x",)),
    Operation("channel_norm", "ChannelNorm", layout=("x",)),
    Operation("channel_sum", "ChannelSum", layout=("x",), image_outputs=False),
    Operation("eltwise", "Eltwise"),
    Operation("lrn_cross_channels", "LrnCrossChannels", layout=("x",)),
    Operation("shuffle", "Shuffle", layout=("x0", "x1")),
    Operation("softmax", "Softmax"),
    Operation("tiled_scale_2d", "TiledScale2D", layout=("x",)),
    Operation("unary", "Unary"),
    Operation("normalize", "Normalize", adapt=_normalize_arguments),
    Operation("quantized_inner_product", "QuantizedInnerProduct"),
)}

# The quantized inner-product session RPCs take the arguments of its constructor and forward().
CREATE_SESSION = Operation("QuantizedInnerProduct", "CreateQuantizedInnerProduct")
FORWARD_SESSION = Operation("QuantizedInnerProduct.forward", "QuantizedInnerProductForward")


# ---------------------------------------------------------------------------------------
# Enumerations: proto enum <-> the names (and Simd integer values) of the Python API

def _enum_prefix(enum_descriptor) -> str:
    unspecified = enum_descriptor.values_by_number[0].name
    return unspecified[: -len("UNSPECIFIED")]


_ENUM_NAMES: dict[str, dict[int, str]] = {}


def enum_names(enum_descriptor) -> dict[int, str]:
    """Wire number -> API name ('exp'), without the UNSPECIFIED value."""
    names = _ENUM_NAMES.get(enum_descriptor.full_name)
    if names is None:
        prefix = _enum_prefix(enum_descriptor)
        names = _ENUM_NAMES[enum_descriptor.full_name] = {
            v.number: v.name[len(prefix):].lower() for v in enum_descriptor.values if v.number}
    return names


def encode_enum(enum_descriptor, value, name: str) -> int:
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


def decode_enum(enum_descriptor, number: int) -> str | None:
    """The API name of a wire number; None for UNSPECIFIED or a number this side does not
    know (the operation then reports the argument as missing or invalid)."""
    return enum_names(enum_descriptor).get(number)


def wire_choices(enum_descriptor, *, unspecified: bool = False) -> str:
    """The values of a proto enum as the wire knows them, for messages sent to callers of
    any language: "UNARY_OP_ABS (1), UNARY_OP_CEIL (2), ..." (without UNSPECIFIED unless
    asked)."""
    return ", ".join(f"{v.name} ({v.number})" for v in enum_descriptor.values if unspecified or v.number)


def wire_value(enum_descriptor, number: int) -> str:
    """A received enum number as a message shows it: "0 (UNARY_OP_UNSPECIFIED)" or "99"."""
    value = enum_descriptor.values_by_number.get(number)
    return f"{number} ({value.name})" if value is not None else str(number)


def encode_format(value) -> int:
    if isinstance(value, str) and value.lower() in codec.FORMATS:
        return codec.FORMATS[value.lower()]
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)) and int(value) in (0, 1):
        return (tensor_pb2.FORMAT_NCHW, tensor_pb2.FORMAT_NHWC)[int(value)]
    raise WireError("format", f"expected one of 'nchw' (0), 'nhwc' (1), got {value!r}")


# ---------------------------------------------------------------------------------------
# Client side: arguments -> request bytes, response bytes -> result

@dataclass
class Request:
    data: bytes
    bf16_bits: bool  # some input was uint16 holding BF16 bits: BF16 results come back as uint16


def _sequence(value, name: str) -> list:
    if isinstance(value, (str, bytes)):
        raise WireError(name, f"expected a sequence, got {type(value).__name__}")
    try:
        return list(value)
    except TypeError:
        raise WireError(name, f"expected a sequence, got {type(value).__name__}") from None


def build_request(op: Operation, arguments: dict[str, Any]) -> Request:
    """Encode call arguments (None = the default) as the request of `op`."""
    if op.adapt is not None:
        arguments = op.adapt(arguments)
    plan = op.request_plan
    fmt_value = arguments.get("format")
    fmt = encode_format(fmt_value) if fmt_value is not None else 0
    message = op.request_class()
    tensors: dict[str, Any] = {}
    bits = False
    for name, value in arguments.items():
        if value is None or name == "format":
            continue
        kind, detail = plan[name]
        if kind == TENSOR:
            arr, code = codec.wire_array(value, name)
            tensors[name] = (arr, code, fmt if detail else 0)
            bits = bits or _is_bits(value)
        elif kind == TENSORS:
            items = _sequence(value, name)
            if len(items) > codec.MAX_OPERANDS:  # the server would refuse them: said before encoding
                raise codec.too_many_operands(name, len(items))
            tensors[name] = [codec.encode_tensor(v, f"{name}[{i}]", fmt if detail else 0)
                             for i, v in enumerate(items)]
            bits = bits or any(_is_bits(v) for v in items)
        elif kind == ENUM:
            setattr(message, name, encode_enum(detail, value, name))
        elif kind == MESSAGE:
            getattr(message, name).CopyFrom(value)
        else:
            values = _sequence(value, name) if kind == REPEATED else (value,)
            if detail.type != detail.TYPE_BOOL and any(isinstance(v, (bool, np.bool_)) for v in values):
                raise WireError(name, f"expected {_type_name(detail)}, got a bool")  # as the operation would say
            try:
                if kind == REPEATED:
                    getattr(message, name).extend(values)
                else:
                    setattr(message, name, value)
            except (TypeError, ValueError) as exc:
                raise WireError(name, f"cannot be sent as {_type_name(detail)}: {exc}") from None
    return Request(op.request_codec.encode(message, tensors), bits)


_UINT16 = np.dtype(np.uint16)


def _is_bits(value) -> bool:
    dtype = getattr(value, "dtype", None)
    return dtype is not None and dtype == _UINT16


def _type_name(f) -> str:
    names = {f.TYPE_DOUBLE: "a real number", f.TYPE_INT64: "an integer", f.TYPE_BOOL: "a bool",
             f.TYPE_STRING: "a string"}
    kind = names.get(f.type, "a value")
    return f"a sequence of {kind.split(' ', 1)[1]}s" if f.is_repeated else kind


def decode_response(op: Operation, raw: bytes, bf16_bits: bool = False):
    """The result of `op`: one array, or a tuple when the response has several tensors.
    Arrays are new and writable, as in-process results are."""
    decoded = op.response_codec.decode(raw)
    results = []
    for name in op.response_fields:
        tensor = decoded.tensors.get(name)
        if tensor is None:
            raise WireError(name, "missing from the response")
        arr = codec.to_array(tensor, name).copy()
        if bf16_bits and tensor.dtype == tensor_pb2.DATA_TYPE_BF16:
            arr = arr.view(np.uint16)
        results.append(arr)
    return results[0] if len(results) == 1 else tuple(results)
