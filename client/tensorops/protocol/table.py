"""The operation table: one row per operation, carrying every fact about it that more than
one layer needs. Everything else is derived from these rows:

- the client methods' wire form (tensorops.protocol.wire encodes arguments and decodes
  results by the row's fields);
- the server's tensorops.v1 handlers (one per row), its native calls (`native`), the
  memory it reserves before a kernel runs (`result_shapes`), and where the call runs
  (`offload`, `row_split`);
- the KServe models and their metadata (inputs with `spec`, attributes with `defaults`
  and `notes`), and the in-process client;
- the docs' tables of operations (a test compares them with the rows).

The request message of a row's RPC (proto/tensorops/v1) holds one field per argument of
the Python API, under the same name: that is what makes the rest generic. Its fields are
classified once here (`Field`, `Kind`). Adding an operation means a row here, a native
function and its tests, and its messages in the .proto.
"""

from __future__ import annotations

import ast
import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, cast

import numpy as np
from google.protobuf.descriptor import Descriptor, EnumDescriptor, MethodDescriptor
from google.protobuf.message import Message

from ..v1 import tensorops_pb2
from . import codec

SERVICE = tensorops_pb2.DESCRIPTOR.services_by_name["TensorOps"]
SERVICE_NAME = SERVICE.full_name


def method_path(rpc: str) -> str:
    return f"/{SERVICE_NAME}/{rpc}"


def message_class(descriptor: Descriptor) -> type[Message]:
    return cast(type[Message], getattr(tensorops_pb2, descriptor.name))


class Kind(enum.Enum):
    """How a request field carries its argument."""

    TENSOR = "tensor"  # one array
    TENSORS = "tensors"  # a list of arrays (eltwise's operands)
    ENUM = "enum"  # a name of the Python API ("exp"), a proto enum on the wire
    MESSAGE = "message"  # a structured value (normalize's activation)
    REPEATED = "repeated"  # a list of numbers
    SCALAR = "scalar"  # one number, bool or string


@dataclass(frozen=True)
class Field:
    """One argument of an operation as its request carries it."""

    name: str
    kind: Kind
    descriptor: Any  # the protobuf FieldDescriptor
    image: bool = False  # an image tensor: its Format is the `format` argument
    default: Any = None  # the Python API's default (None: none, or None itself)
    required: bool = True  # no default: leaving it out is an error

    @property
    def enum(self) -> EnumDescriptor:
        """An ENUM field's enum."""
        return cast(EnumDescriptor, self.descriptor.enum_type)

    @property
    def has_presence(self) -> bool:
        return cast(bool, self.descriptor.has_presence)

    @property
    def is_tensor(self) -> bool:
        return self.kind in (Kind.TENSOR, Kind.TENSORS)


@dataclass(frozen=True)
class TensorSpec:
    """What a tensor of an operation may be, for self-descriptions (the checks themselves
    are tensorops_native's): the datatypes accepted, in KServe's names (the first one
    is the result's for the first datatype of the inputs), and the dimensions (-1: any
    size; None: any number of dimensions)."""

    datatypes: tuple[str, ...] = ("FP32",)
    dims: tuple[int, ...] | None = None


# Image tensors: (batch, channels, *spatial) or (batch, *spatial, channels), any number of
# spatial dimensions; tensors of "real numbers" (scales, weights) convert to FP32.
IMAGE = TensorSpec()
REAL_VECTOR = TensorSpec(("FP32", "FP64", "FP16", "BF16", "INT32", "INT64", "INT8", "UINT8"), (-1,))
MATRIX = TensorSpec(("FP32",), (-1, -1))
BF16_IMAGE = TensorSpec(("FP32", "BF16"))
NORM_TENSORS = {"scale": REAL_VECTOR, "shift": REAL_VECTOR}
QIP_TENSORS = {
    "a": TensorSpec(("UINT8",), (-1, -1)),
    "b": TensorSpec(("INT8",), (-1, -1)),
    "b_scale": REAL_VECTOR,
    "bias": TensorSpec(("INT32", "INT64", "INT8", "UINT8"), (-1,)),
    "c": TensorSpec(("UINT8",), (-1, -1)),
}

# ---------------------------------------------------------------------------------------
# Result shapes, from the native keyword arguments and before anything runs. A shape the
# kernel would refuse gives None: the kernel then names the argument.

Shapes = list[tuple[tuple[int, ...], np.dtype[Any]]]
# The native keyword arguments of a call.
Arguments = Mapping[str, Any]
_F32 = np.dtype(np.float32)


def _array(kwargs: Arguments, name: str) -> np.ndarray | None:
    value = kwargs.get(name)
    if isinstance(value, list):  # eltwise's operands: the result is shaped like the first
        value = value[0] if value else None
    return value if isinstance(value, np.ndarray) else None


def like(*names: str) -> Callable[[Arguments], Shapes | None]:
    """One result per named argument, of its shape and dtype."""

    def shapes(kwargs: Arguments) -> Shapes | None:
        arrays = [_array(kwargs, name) for name in names]
        if any(a is None for a in arrays):
            return None
        return [(a.shape, a.dtype) for a in arrays if a is not None]

    return shapes


def _channel_sum_shapes(kwargs: Arguments) -> Shapes | None:
    """(batch, channels) float32, whatever the spatial size (0 included)."""
    x = _array(kwargs, "x")
    if x is None or x.ndim < 2:
        return None
    channels = x.shape[-1] if kwargs.get("format") == "nhwc" else x.shape[1]
    return [((x.shape[0], channels), _F32)]


def _product_shapes(kwargs: Arguments) -> Shapes | None:
    """The quantized inner product's (M, N) uint8 result: M rows of a, N columns of b."""
    a, b = kwargs.get("a"), kwargs.get("b")
    if not (isinstance(a, np.ndarray) and a.ndim == 2 and isinstance(b, np.ndarray) and b.ndim == 2):
        return None
    return [((a.shape[0], b.shape[0] if kwargs.get("trans_b") else b.shape[1]), np.dtype(np.uint8))]


# ---------------------------------------------------------------------------------------
# Attribute values that the generic rules (by field type) do not canonicalize


def _axes(value: Any) -> Any:
    """normalize's axes: a TensorRT bitmask int is the set of its bits."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        mask = int(value)
        if mask < 0:
            raise codec.WireError("axes", f"a bitmask must be non-negative, got {mask}")
        value = [i for i in range(mask.bit_length()) if mask >> i & 1]
    if not isinstance(value, (str, bytes)) and hasattr(value, "__len__") and len(value) == 0:
        raise codec.WireError("axes", "the set of axes is empty")
    return value


def _dtype_name(value: Any) -> Any:
    """normalize's compute_dtype: a NumPy dtype or its name travels as the name."""
    if value is None or isinstance(value, str):
        return value
    try:
        return np.dtype(value).name
    except TypeError:
        raise codec.WireError("compute_dtype", f"expected a dtype or its name, got {value!r}") from None


# ---------------------------------------------------------------------------------------
# The rows


class _Required:
    """The default of a parameter that has none."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()


@dataclass(frozen=True)
class Operation:
    """One operation of tensorops_native as an RPC of tensorops.v1.TensorOps."""

    name: str  # the Python API's name
    rpc: str  # the method of the service
    # The Python API's parameters, as written in its signature: their order, which are
    # keyword-only, and every default. The native function and the clients' methods have
    # exactly these (plus out=, timeout=, metadata=); a test holds them to it.
    signature: str
    native: str = ""  # tensorops_native's callable (default: name)
    layout: tuple[str, ...] = ()  # image tensors whose Format is the `format` argument
    image_outputs: bool = True  # outputs carry the input layout (else no format)
    tensors: Mapping[str, TensorSpec] = field(default_factory=dict)  # those not IMAGE
    result_shapes: Callable[[Arguments], Shapes | None] = field(default=like("x"), compare=False)
    offload: bool = False  # never on the event loop: costs more than its bytes
    row_split: str = ""  # result rows depend on the same rows of this input
    # Attributes whose API values need more than their field type's rules, before encoding.
    canonical: Mapping[str, Callable[[Any], Any]] = field(default_factory=dict, compare=False)
    notes: Mapping[str, str] = field(default_factory=dict)  # extra words in self-descriptions
    kernel: str = ""  # the C kernels it runs (for the docs)
    summary: str = ""  # what a reader of the docs' table must know

    @cached_property
    def parameters(self) -> tuple[tuple[str, bool, Any], ...]:
        """(name, keyword-only, default) of each parameter of `signature`, in order;
        REQUIRED for a parameter without a default."""
        args = ast.parse(f"def f({self.signature}): pass").body[0].args  # type: ignore[attr-defined]
        positional = [(a.arg, False) for a in args.args]
        keyword = [(a.arg, True) for a in args.kwonlyargs]
        defaults = [REQUIRED] * (len(args.args) - len(args.defaults)) + [ast.literal_eval(d) for d in args.defaults]
        defaults += [REQUIRED if d is None else ast.literal_eval(d) for d in args.kw_defaults]
        return tuple((name, kw, default) for (name, kw), default in zip(positional + keyword, defaults, strict=True))

    @cached_property
    def defaults(self) -> dict[str, Any]:
        """The optional parameters and their defaults."""
        return {name: default for name, _, default in self.parameters if default is not REQUIRED}

    @cached_property
    def arguments(self) -> tuple[str, ...]:
        """The Python API's parameters, in the order of its signature."""
        return tuple(name for name, _, _ in self.parameters)

    @property
    def native_name(self) -> str:
        return self.native or self.name

    @cached_property
    def method(self) -> MethodDescriptor:
        return SERVICE.methods_by_name[self.rpc]

    @cached_property
    def request_class(self) -> type[Message]:
        return message_class(self.method.input_type)

    @cached_property
    def response_class(self) -> type[Message]:
        return message_class(self.method.output_type)

    @cached_property
    def request_codec(self) -> codec.MessageCodec:
        return codec.MessageCodec(self.request_class)

    @cached_property
    def response_codec(self) -> codec.MessageCodec:
        return codec.MessageCodec(self.response_class)

    @property
    def path(self) -> str:
        return method_path(self.rpc)

    @cached_property
    def fields(self) -> tuple[Field, ...]:
        """The request's fields, classified: the one classifier every layer uses."""
        tensor_numbers = self.request_codec.numbers
        out = []
        for f in self.request_class.DESCRIPTOR.fields:
            if f.name in tensor_numbers:
                kind = Kind.TENSORS if f.is_repeated else Kind.TENSOR
            elif f.enum_type is not None:
                kind = Kind.ENUM
            elif f.message_type is not None:
                kind = Kind.MESSAGE
            else:
                kind = Kind.REPEATED if f.is_repeated else Kind.SCALAR
            out.append(
                Field(
                    f.name,
                    kind,
                    f,
                    image=f.name in self.layout,
                    default=self.defaults.get(f.name),
                    required=f.name not in self.defaults,
                )
            )
        return tuple(out)

    @cached_property
    def fields_by_name(self) -> dict[str, Field]:
        return {f.name: f for f in self.fields}

    def field(self, name: str) -> Field:
        return self.fields_by_name[name]

    @cached_property
    def inputs(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if f.is_tensor)

    @cached_property
    def attributes(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if not f.is_tensor)

    @cached_property
    def outputs(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.response_class.DESCRIPTOR.fields)

    def spec(self, name: str) -> TensorSpec:
        return self.tensors.get(name, IMAGE)

    def result_bytes(self, kwargs: Arguments) -> tuple[str, int]:
        """(the argument that asks for it, the bytes of the results) from the native
        arguments; 0 when the kernel will refuse them."""
        shapes = self.result_shapes(kwargs)
        nbytes = 0 if shapes is None else sum(math.prod(s) * d.itemsize for s, d in shapes)
        return self.inputs[0].name, nbytes


_NORM = 'scale, shift, *, eps=1e-5, format="nchw"'
_PRODUCT = "b_scale, a_scale, a_zero, c_scale, c_zero, bias=None, trans_b=False"

# The stateless operations, in the order of the docs' tables.
OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        Operation(
            "normalize_l2",
            "NormalizeL2",
            'x, scale, *, eps=1e-10, across_spatial=False, format="nchw"',
            layout=("x",),
            tensors={"scale": REAL_VECTOR},
            kernel="SimdSynetNormalizeLayerForward",
            summary="x fp32, scale (channels,)",
        ),
        Operation(
            "layer_norm_channels",
            "LayerNormChannels",
            f"x, {_NORM}",
            layout=("x",),
            tensors={"x": BF16_IMAGE, "y": BF16_IMAGE, **NORM_TENSORS},
            kernel="SimdSynetNormalizeLayerForwardV2, ...Forward16bV2 for BF16 x",
            summary="BF16 result for BF16 x",
        ),
        Operation(
            "layer_norm_spatial",
            "LayerNormSpatial",
            f"x, {_NORM}",
            layout=("x",),
            tensors=NORM_TENSORS,
            kernel="SimdSynetNormalizeLayerForwardV3",
        ),
        Operation(
            "channel_norm",
            "ChannelNorm",
            f"x, {_NORM}",
            layout=("x",),
            tensors=NORM_TENSORS,
            kernel="SimdSynetNormalizeLayerForwardV4",
        ),
        Operation(
            "channel_sum",
            "ChannelSum",
            'x, *, format="nchw"',
            layout=("x",),
            image_outputs=False,
            tensors={"x": TensorSpec(("BF16",)), "y": MATRIX},
            result_shapes=_channel_sum_shapes,
            kernel="SimdSynetChannelSum16b",
            summary="x BF16; fp32 `(batch, channels)`",
        ),
        Operation(
            "eltwise",
            "Eltwise",
            "inputs, op, weights=None",
            tensors={"weights": REAL_VECTOR},
            result_shapes=like("inputs"),
            kernel="SimdSynetEltwiseLayerForward",
            summary=">= 2 fp32 arrays; `product`, `sum`, `max`, `min`",
        ),
        Operation(
            "lrn_cross_channels",
            "LrnCrossChannels",
            'x, half, k, *, format="nchw"',
            layout=("x",),
            tensors={"k": TensorSpec(REAL_VECTOR.datatypes, (3,))},
            kernel="SimdSynetLrnLayerCrossChannels",
            summary="k = (k0, k1, k2)",
        ),
        Operation(
            "shuffle",
            "Shuffle",
            'x0, x1, *, type, format="nchw", channels=None',
            layout=("x0", "x1"),
            result_shapes=like("x0", "x1"),
            kernel="SimdSynetShuffleLayerForward",
            summary="returns (y0, y1)",
        ),
        Operation(
            "softmax",
            "Softmax",
            "x, axis=-1",
            tensors={"x": BF16_IMAGE, "y": BF16_IMAGE},
            kernel="SimdSynetSoftmax32f / Softmax16b",
            summary="fp32 or BF16",
        ),
        Operation(
            "tiled_scale_2d",
            "TiledScale2D",
            'x, ver, hor, *, format="nchw"',
            layout=("x",),
            tensors={"x": TensorSpec(dims=(-1, -1, -1, -1)), "ver": MATRIX, "hor": MATRIX},
            kernel="SimdSynetTiledScale2D32f",
            summary="x 4-D",
        ),
        Operation(
            "unary",
            "Unary",
            "x, op",
            kernel="SimdSynetUnaryOperation32f",
            summary='17 ops by name (`"exp"`, `"rsqrt"`, ...) or value',
        ),
        Operation(
            "normalize",
            "Normalize",
            "x, scale=None, bias=None, *, axes, num_groups=1, eps=1e-5, normalize_variance=True, "
            "activation=None, compute_dtype=None",
            tensors={
                "x": TensorSpec(("FP32", "FP16", "BF16")),
                "y": TensorSpec(("FP32", "FP16", "BF16")),
                "scale": TensorSpec(REAL_VECTOR.datatypes),
                "bias": TensorSpec(REAL_VECTOR.datatypes),
            },
            canonical={"axes": _axes, "compute_dtype": _dtype_name},
            notes={"axes": "or an int64 bitmask of the axes"},
            kernel="TensorRT INormalization, DirectML MVN1",
            summary="any axes (list or TensorRT bitmask), group norm, optional broadcast scale/bias, "
            "DirectML fused activations; fp32, fp16, BF16",
        ),
        Operation(
            "quantized_inner_product",
            "QuantizedInnerProduct",
            f"a, b, *, {_PRODUCT}, algorithm=None",
            tensors=QIP_TENSORS,
            result_shapes=_product_shapes,
            offload=True,
            row_split="a",
            kernel="SimdSynetQuantizedInnerProduct*",
            summary="UINT8 x INT8 -> UINT8, one shot",
        ),
    )
}

# The quantized inner-product session RPCs take the arguments of its constructor and forward().
CREATE_SESSION = Operation(
    "QuantizedInnerProduct",
    "CreateQuantizedInnerProduct",
    f"b, *, {_PRODUCT}, max_m=1, algorithm=None",
    tensors=QIP_TENSORS,
)
FORWARD_SESSION = Operation(
    "QuantizedInnerProduct.forward", "QuantizedInnerProductForward", "a", native="forward", tensors=QIP_TENSORS
)
