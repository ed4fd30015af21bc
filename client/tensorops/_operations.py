"""The operations with the names and arguments of tensorops_native, shared by every client.

A client class supplies `_call(name, arguments, timeout, metadata)` (which runs the
operation: remotely, or in-process for LocalClient; the async client returns an awaitable)
and `_open_session(arguments, timeout, metadata)`. `timeout` (seconds) and `metadata`
apply to one call; they are checked here, the same for every client, before anything runs.

The types of the arguments and results are declared here once for every client:
Operations is generic over what its methods return (the blocking clients return arrays,
the asyncio client awaitables of the same arrays).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, Literal, TypeAlias, TypeVar, cast, overload

import numpy as np
import numpy.typing as npt

from ._errors import ClientClosedError, invalid_argument

# The closed sets of names the Python API takes (the wire's enums and image formats, in
# their order there; tests/client/test_typing.py checks that they are the protocol's).
Format: TypeAlias = Literal["nchw", "nhwc"]
EltwiseOp: TypeAlias = Literal["product", "sum", "max", "min"]
ShuffleType: TypeAlias = Literal["split", "interleave"]
UnaryOp: TypeAlias = Literal[
    "abs",
    "ceil",
    "cos",
    "erf",
    "exp",
    "floor",
    "log",
    "neg",
    "not",
    "rcp",
    "round",
    "rsqrt",
    "sign",
    "sin",
    "sqrt",
    "tanh",
    "zero",
]
ActivationName: TypeAlias = Literal[
    "identity",
    "linear",
    "relu",
    "leaky_relu",
    "parametric_softplus",
    "elu",
    "celu",
    "scaled_elu",
    "sigmoid",
    "hard_sigmoid",
    "tanh",
    "scaled_tanh",
    "softplus",
    "softsign",
    "thresholded_relu",
    "shrink",
    "gelu",
]
# Numbers: Python's or NumPy's scalars.
Real: TypeAlias = "float | np.floating[Any] | np.integer[Any]"
Integer: TypeAlias = "int | np.integer[Any]"
# normalize's fused activation: a name, or (name, *parameters) with at most two parameters.
Activation: TypeAlias = (
    ActivationName | tuple[ActivationName] | tuple[ActivationName, Real] | tuple[ActivationName, Real, Real]
)
Algorithm: TypeAlias = Literal["scalar", "avx2", "avx2-vnni", "avx512-vnni", "amx"]
ComputeDType: TypeAlias = "Literal['float32'] | type[np.float32] | np.dtype[np.float32]"

# Results: new arrays of a known dtype. Operations whose result has x's dtype give float32,
# float16, uint16 (BF16 bits in, BF16 bits out) or ml_dtypes.bfloat16, which has no static
# type of its own (a NumPy scalar type whose item is a float).
Float32Array: TypeAlias = "np.ndarray[tuple[int, ...], np.dtype[np.float32]]"
FloatArray: TypeAlias = "np.ndarray[tuple[int, ...], np.dtype[np.float32 | np.float16 | np.uint16 | np.generic[float]]]"
UInt8Array: TypeAlias = "np.ndarray[tuple[int, ...], np.dtype[np.uint8]]"
Float32Pair: TypeAlias = "tuple[Float32Array, Float32Array]"
Scalar = TypeVar("Scalar", bound=np.generic)
# An array of a dtype chosen by the caller (Client.shared_array), by its scalar type or its
# dtype; or by name: one of the datatypes tensors travel in (or uint16 for BF16 bits).
ArrayOf: TypeAlias = "np.ndarray[tuple[int, ...], np.dtype[Scalar]]"
DTypeChoice: TypeAlias = "type[np.generic] | np.dtype[np.generic] | str"
NamedArray: TypeAlias = (
    "np.ndarray[tuple[int, ...], np.dtype[np.float32 | np.float16 | np.generic[float] | np.uint8 "
    "| np.int8 | np.int32 | np.int64 | np.float64 | np.uint16]]"
)
Shape: TypeAlias = "int | Iterable[int]"
# Tensor arguments (any shape) and the array-likes of parameters such as scale and shift.
Float32Input: TypeAlias = "npt.NDArray[np.float32]"
FloatInput: TypeAlias = "npt.NDArray[np.float32 | np.float16 | np.uint16 | np.generic[float]]"
UInt8Input: TypeAlias = "npt.NDArray[np.uint8]"
Int8Input: TypeAlias = "npt.NDArray[np.int8]"
Values: TypeAlias = npt.ArrayLike
Timeout: TypeAlias = "float | None"
# Call metadata as given: a mapping or (key, value) pairs; bytes only under "-bin" keys.
Metadata: TypeAlias = "Mapping[str, str | bytes] | Iterable[tuple[str, str | bytes]] | None"
# Call metadata once checked.
Pairs: TypeAlias = "tuple[tuple[str, str | bytes], ...]"

# What the methods of a client return: its results (arrays, or awaitables of arrays), and
# the session quantized_inner_product(b) opens.
F32 = TypeVar("F32", covariant=True)
Floats = TypeVar("Floats", covariant=True)
Pair = TypeVar("Pair", covariant=True)
U8 = TypeVar("U8", covariant=True)
Session = TypeVar("Session", covariant=True)

# gRPC metadata: keys of lowercase ASCII letters, digits and "-_.", "grpc-" reserved for
# gRPC itself; values printable ASCII, except under keys ending in "-bin" (bytes, sent
# base64-encoded).
_METADATA_KEY = re.compile(r"[0-9a-z_.-]+")
_METADATA_VALUE = re.compile(r"[\x20-\x7e]*")


def check_timeout(timeout: object, name: str = "timeout") -> float | None:
    """None (no deadline) or a positive finite number of seconds, as a float."""
    if timeout is None:
        return None
    if isinstance(timeout, (bool, np.bool_)) or not isinstance(timeout, numbers.Real):
        raise invalid_argument(name, f"expected a number of seconds or None, got {type(timeout).__name__} {timeout!r}")
    seconds = float(timeout)
    if not (math.isfinite(seconds) and seconds > 0):
        raise invalid_argument(name, f"expected a positive finite number of seconds, got {timeout!r}")
    return seconds


def check_metadata(metadata: object, name: str = "metadata") -> Pairs:
    """Call metadata as a tuple of (key, value) pairs: given as a mapping or as pairs, each
    key and value checked against gRPC's rules (which it would otherwise report as
    INTERNAL, or as an unpacking error)."""
    if not metadata:
        return ()
    pairs: Iterable[object]
    if isinstance(metadata, Mapping):
        pairs = metadata.items()
    elif isinstance(metadata, (str, bytes)) or not hasattr(metadata, "__iter__"):
        raise invalid_argument(name, f"expected a mapping or (key, value) pairs, got {type(metadata).__name__}")
    else:
        pairs = cast(Iterable[object], metadata)
    checked = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise invalid_argument(name, f"item {i}: expected a (key, value) pair, got {pair!r:.80}")
        checked.append(_metadatum(pair[0], pair[1], name=name))
    return tuple(checked)


def _metadatum(key: object, value: object, name: str) -> tuple[str, str | bytes]:
    if not isinstance(key, str) or not _METADATA_KEY.fullmatch(key):
        raise invalid_argument(name, f"key {key!r:.80}: expected lowercase ASCII letters, digits, '-', '_' or '.'")
    if key.startswith("grpc-"):
        raise invalid_argument(name, f"key {key!r}: the 'grpc-' prefix is reserved for gRPC itself")
    if key.endswith("-bin"):
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise invalid_argument(name, f"key {key!r}: a '-bin' key takes bytes, got {type(value).__name__}")
        return key, bytes(value)
    if not isinstance(value, str):
        raise invalid_argument(
            name,
            f"key {key!r}: expected a str value (bytes only under keys ending in '-bin'), got {type(value).__name__}",
        )
    if not _METADATA_VALUE.fullmatch(value):
        raise invalid_argument(
            name, f"key {key!r}: the value must be printable ASCII (bytes: use a key ending in '-bin')"
        )
    return key, value


def _arrays(value: object) -> Iterator[np.ndarray]:
    if isinstance(value, np.ndarray):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _arrays(item)


def check_out(out: object, arguments: Mapping[str, object]) -> None:
    """What can be checked of `out` before the result is known: a writeable, C-contiguous
    ndarray in native byte order that overlaps no input."""
    if type(out) is not np.ndarray:
        raise TypeError(f"out: expected a numpy.ndarray, got {type(out).__name__}")
    if not (out.flags.c_contiguous and out.flags.aligned and out.flags.writeable and out.dtype.isnative):
        raise ValueError("out: expected a writeable, aligned, C-contiguous array in native byte order")
    for value in arguments.values():
        for arr in _arrays(value):
            if np.may_share_memory(out, arr):
                raise ValueError("out: must not overlap an input")


def result_into(out: np.ndarray | None, result: object) -> object:
    """`result` (a new array) copied into `out`, which must have its shape and dtype; the
    result itself without `out` or when it is `out` already."""
    if out is None or result is out:
        return result
    result = cast(np.ndarray, result)  # a call with `out` has one result
    if out.dtype != result.dtype:
        raise TypeError(f"out: expected dtype {result.dtype} (the result's), got {out.dtype}")
    if out.shape != result.shape:
        raise ValueError(f"out: expected shape {result.shape} (the result's), got {out.shape}")
    np.copyto(out, result)
    return out


class Operations(Generic[F32, Floats, Pair, U8, Session]):
    """`out=`: the operations with one result write it into a given NumPy array instead of
    returning a new one (and return `out`). It must be a writeable C-contiguous ndarray
    overlapping no input; its shape and dtype must be the result's (remote clients check
    those when the result arrives, as only then is it known; a mismatch raises
    TypeError/ValueError naming `out`). Through shared memory, an `out` made by
    Client.shared_array receives the result from the kernel itself, without any copy.

    After close(), every method raises ClientClosedError (a ValueError: "the client is
    closed"), before looking at its arguments.

    Type parameters: what a client's methods return for a float32 result (F32), a result
    of x's dtype (Floats), shuffle's pair (Pair), a uint8 result (U8), and the session
    quantized_inner_product(b) opens (Session)."""

    _closed = False

    def _call(self, name: str, arguments: dict[str, object], timeout: float | None, metadata: Pairs) -> object:
        """Run the operation `name` (a client's own way: remotely or in-process)."""
        raise NotImplementedError

    def _open_session(self, arguments: dict[str, object], timeout: float | None, metadata: Pairs) -> Session:
        raise NotImplementedError

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError()

    def _begin(self, timeout: object, metadata: object) -> tuple[float | None, Pairs]:
        """What every public method does first: the client must be open, and the call's
        timeout and metadata valid (returned checked)."""
        self._check_open()
        return check_timeout(timeout), check_metadata(metadata)

    def _call_into(
        self, name: str, arguments: dict[str, object], out: object, timeout: object, metadata: object
    ) -> object:
        checked_timeout, checked_metadata = self._begin(timeout, metadata)
        if out is not None:
            check_out(out, arguments)
            arguments["out"] = out
        return self._call(name, arguments, checked_timeout, checked_metadata)

    def _session(self, arguments: dict[str, object], timeout: object, metadata: object) -> Session:
        checked_timeout, checked_metadata = self._begin(timeout, metadata)
        return self._open_session(arguments, checked_timeout, checked_metadata)

    def normalize_l2(
        self,
        x: Float32Input,
        scale: Values,
        *,
        eps: Real = 1e-10,
        across_spatial: bool = False,
        format: Format = "nchw",
        out: Float32Input | None = None,
        timeout: Timeout = None,
        metadata: Metadata = None,
    ) -> F32:
        """L2 normalization with per-channel scale (SimdSynetNormalizeLayerForward)."""
        return cast(
            F32,
            self._call_into(
                "normalize_l2",
                dict(x=x, scale=scale, eps=eps, across_spatial=across_spatial, format=format),
                out,
                timeout,
                metadata,
            ),
        )

    def layer_norm_channels(
        self,
        x: FloatInput,
        scale: Values,
        shift: Values,
        *,
        eps: Real = 1e-5,
        format: Format = "nchw",
        out: FloatInput | None = None,
        timeout: Timeout = None,
        metadata: Metadata = None,
    ) -> Floats:
        """Layer normalization across channels (SimdSynetNormalizeLayerForwardV2; 16bV2 for
        BF16 x, which gives a BF16 result)."""
        return cast(
            Floats,
            self._call_into(
                "layer_norm_channels",
                dict(x=x, scale=scale, shift=shift, eps=eps, format=format),
                out,
                timeout,
                metadata,
            ),
        )

    def layer_norm_spatial(
        self,
        x: Float32Input,
        scale: Values,
        shift: Values,
        *,
        eps: Real = 1e-5,
        format: Format = "nchw",
        out: Float32Input | None = None,
        timeout: Timeout = None,
        metadata: Metadata = None,
    ) -> F32:
        """Layer normalization across spatial positions (SimdSynetNormalizeLayerForwardV3)."""
        return cast(
            F32,
            self._call_into(
                "layer_norm_spatial",
                dict(x=x, scale=scale, shift=shift, eps=eps, format=format),
                out,
                timeout,
                metadata,
            ),
        )

    def channel_norm(
        self,
        x: Float32Input,
        scale: Values,
        shift: Values,
        *,
        eps: Real = 1e-5,
        format: Format = "nchw",
        out: Float32Input | None = None,
        timeout: Timeout = None,
        metadata: Metadata = None,
    ) -> F32:
        """Channel-norm scaling (SimdSynetNormalizeLayerForwardV4)."""
        return cast(
            F32,
            self._call_into(
                "channel_norm", dict(x=x, scale=scale, shift=shift, eps=eps, format=format), out, timeout, metadata
            ),
        )

    def channel_sum(
        self,
        x: FloatInput,
        *,
        format: Format = "nchw",
        out: Float32Input | None = None,
        timeout: Timeout = None,
        metadata: Metadata = None,
    ) -> F32:
        """Per-channel sums of a BF16 image tensor, fp32 (batch, channels)
        (SimdSynetChannelSum16b)."""
        return cast(F32, self._call_into("channel_sum", dict(x=x, format=format), out, timeout, metadata))

    def eltwise(
        self,
        inputs: Sequence[Float32Input],
        op: EltwiseOp | int,
        weights: Values | None = None,
        *,
        out: Float32Input | None = None,
        timeout: Timeout = None,
        metadata: Metadata = None,
    ) -> F32:
        """Product, weighted sum, max or min of >= 2 fp32 arrays of one shape
        (SimdSynetEltwiseLayerForward)."""
        return cast(
            F32, self._call_into("eltwise", dict(inputs=inputs, op=op, weights=weights), out, timeout, metadata)
        )

    def lrn_cross_channels(
        self,
        x: Float32Input,
        half: Integer,
        k: Values,
        *,
        format: Format = "nchw",
        out: Float32Input | None = None,
        timeout: Timeout = None,
        metadata: Metadata = None,
    ) -> F32:
        """Local response normalization across channels (SimdSynetLrnLayerCrossChannels)."""
        return cast(
            F32, self._call_into("lrn_cross_channels", dict(x=x, half=half, k=k, format=format), out, timeout, metadata)
        )

    def shuffle(
        self,
        x0: Float32Input,
        x1: Float32Input,
        *,
        type: ShuffleType | int,
        format: Format = "nchw",
        channels: Sequence[Integer] | None = None,
        timeout: Timeout = None,
        metadata: Metadata = None,
    ) -> Pair:
        """Channel shuffle of two tensors (SimdSynetShuffleLayerForward); returns (y0, y1)."""
        return cast(
            Pair,
            self._call_into(
                "shuffle", dict(x0=x0, x1=x1, type=type, format=format, channels=channels), None, timeout, metadata
            ),
        )

    def softmax(
        self,
        x: FloatInput,
        axis: Integer = -1,
        *,
        out: FloatInput | None = None,
        timeout: Timeout = None,
        metadata: Metadata = None,
    ) -> Floats:
        """Softmax along `axis` (SimdSynetSoftmax32f, Softmax16b for BF16 x)."""
        return cast(Floats, self._call_into("softmax", dict(x=x, axis=axis), out, timeout, metadata))

    def tiled_scale_2d(
        self,
        x: Float32Input,
        ver: Values,
        hor: Values,
        *,
        format: Format = "nchw",
        out: Float32Input | None = None,
        timeout: Timeout = None,
        metadata: Metadata = None,
    ) -> F32:
        """Multiply a 4-D tensor by two tiled 2-D scales (SimdSynetTiledScale2D32f)."""
        return cast(
            F32, self._call_into("tiled_scale_2d", dict(x=x, ver=ver, hor=hor, format=format), out, timeout, metadata)
        )

    def unary(
        self,
        x: Float32Input,
        op: UnaryOp | int,
        *,
        out: Float32Input | None = None,
        timeout: Timeout = None,
        metadata: Metadata = None,
    ) -> F32:
        """Element-wise unary operation (SimdSynetUnaryOperation32f); op by name or value."""
        return cast(F32, self._call_into("unary", dict(x=x, op=op), out, timeout, metadata))

    def normalize(
        self,
        x: FloatInput,
        scale: Values | None = None,
        bias: Values | None = None,
        *,
        axes: Integer | Sequence[Integer],
        num_groups: Integer = 1,
        eps: Real = 1e-5,
        normalize_variance: bool = True,
        activation: Activation | None = None,
        compute_dtype: ComputeDType | None = None,
        out: FloatInput | None = None,
        timeout: Timeout = None,
        metadata: Metadata = None,
    ) -> Floats:
        """Generic normalization (TensorRT INormalization, DirectML MVN1): mean and variance
        over `axes` (indices or a TensorRT bitmask), optional groups, scale, bias and fused
        activation; FP32, FP16 or BF16 x."""
        return cast(
            Floats,
            self._call_into(
                "normalize",
                dict(
                    x=x,
                    scale=scale,
                    bias=bias,
                    axes=axes,
                    num_groups=num_groups,
                    eps=eps,
                    normalize_variance=normalize_variance,
                    activation=activation,
                    compute_dtype=compute_dtype,
                ),
                out,
                timeout,
                metadata,
            ),
        )

    @overload
    def quantized_inner_product(
        self,
        b: Int8Input,
        /,
        *,
        b_scale: Values,
        a_scale: Real,
        a_zero: Integer,
        c_scale: Real,
        c_zero: Integer,
        bias: Values | None = None,
        trans_b: bool = False,
        max_m: Integer | None = None,
        algorithm: Algorithm | None = None,
        timeout: Timeout = None,
        metadata: Metadata = None,
    ) -> Session: ...

    @overload
    def quantized_inner_product(
        self,
        a: UInt8Input,
        b: Int8Input,
        /,
        *,
        b_scale: Values,
        a_scale: Real,
        a_zero: Integer,
        c_scale: Real,
        c_zero: Integer,
        bias: Values | None = None,
        trans_b: bool = False,
        max_m: None = None,
        algorithm: Algorithm | None = None,
        timeout: Timeout = None,
        metadata: Metadata = None,
    ) -> U8: ...

    def quantized_inner_product(
        self,
        *arrays: UInt8Input | Int8Input,
        b_scale: Values,
        a_scale: Real,
        a_zero: Integer,
        c_scale: Real,
        c_zero: Integer,
        bias: Values | None = None,
        trans_b: bool = False,
        max_m: Integer | None = None,
        algorithm: Algorithm | None = None,
        timeout: Timeout = None,
        metadata: Metadata = None,
    ) -> Session | U8:
        """UINT8 x INT8 -> UINT8 matrix product with requantization
        (SimdSynetQuantizedInnerProduct*).

        With one array, `quantized_inner_product(b, ...)` opens a session like
        tensorops_native.QuantizedInnerProduct(b, ...): B is sent and packed once and
        `session.forward(a)` sends A only. With two, `quantized_inner_product(a, b, ...)`
        is the one-shot call of tensorops_native.quantized_inner_product. `max_m` (rows
        expected per forward) applies to sessions only.
        """
        self._check_open()
        params: dict[str, object] = dict(
            b_scale=b_scale,
            a_scale=a_scale,
            a_zero=a_zero,
            c_scale=c_scale,
            c_zero=c_zero,
            bias=bias,
            trans_b=trans_b,
            algorithm=algorithm,
        )
        if len(arrays) == 2:
            if max_m is not None:
                raise TypeError("max_m applies to sessions: quantized_inner_product(b, ..., max_m=...)")
            return cast(
                U8,
                self._call_into(
                    "quantized_inner_product", dict(a=arrays[0], b=arrays[1], **params), None, timeout, metadata
                ),
            )
        if len(arrays) == 1:
            return self._session(dict(b=arrays[0], max_m=max_m, **params), timeout, metadata)
        raise TypeError(f"quantized_inner_product() takes b (a session) or a, b (one call), got {len(arrays)} arrays")

    def QuantizedInnerProduct(
        self,
        b: Int8Input,
        *,
        b_scale: Values,
        a_scale: Real,
        a_zero: Integer,
        c_scale: Real,
        c_zero: Integer,
        bias: Values | None = None,
        trans_b: bool = False,
        max_m: Integer = 1,
        algorithm: Algorithm | None = None,
        timeout: Timeout = None,
        metadata: Metadata = None,
    ) -> Session:
        """A quantized inner-product session for a constant B (as
        tensorops_native.QuantizedInnerProduct): `.forward(a)`, `.info`,
        `.internal_buffer_size`, `.external_buffer_size_for(m)`, `.close()`."""
        return self._session(
            dict(
                b=b,
                b_scale=b_scale,
                a_scale=a_scale,
                a_zero=a_zero,
                c_scale=c_scale,
                c_zero=c_zero,
                bias=bias,
                trans_b=trans_b,
                max_m=max_m,
                algorithm=algorithm,
            ),
            timeout,
            metadata,
        )
