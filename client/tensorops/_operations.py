"""The operations with the names and arguments of tensorops_native, shared by every client.

A client class supplies `_call(name, arguments, timeout, metadata)` (which runs the
operation: remotely, or in-process for LocalClient; the async client returns an awaitable)
and `_open_session(arguments, timeout, metadata)`. `timeout` (seconds) and `metadata`
apply to one call; they are checked here, the same for every client, before anything runs.
"""
from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping

import numpy as np

from ._errors import ClientClosedError, invalid_argument

# gRPC metadata: keys of lowercase ASCII letters, digits and "-_.", "grpc-" reserved for
# gRPC itself; values printable ASCII, except under keys ending in "-bin" (bytes, sent
# base64-encoded).
_METADATA_KEY = re.compile(r"[0-9a-z_.-]+")
_METADATA_VALUE = re.compile(r"[\x20-\x7e]*")


def check_timeout(timeout, name: str = "timeout") -> float | None:
    """None (no deadline) or a positive finite number of seconds, as a float."""
    if timeout is None:
        return None
    if isinstance(timeout, (bool, np.bool_)) or not isinstance(timeout, numbers.Real):
        raise invalid_argument(name, f"expected a number of seconds or None, got {type(timeout).__name__} "
                                     f"{timeout!r}")
    seconds = float(timeout)
    if not (math.isfinite(seconds) and seconds > 0):
        raise invalid_argument(name, f"expected a positive finite number of seconds, got {timeout!r}")
    return seconds


def check_metadata(metadata, name: str = "metadata") -> tuple:
    """Call metadata as a tuple of (key, value) pairs: given as a mapping or as pairs, each
    key and value checked against gRPC's rules (which it would otherwise report as
    INTERNAL, or as an unpacking error)."""
    if not metadata:
        return ()
    if isinstance(metadata, Mapping):
        pairs = metadata.items()
    elif isinstance(metadata, (str, bytes)) or not hasattr(metadata, "__iter__"):
        raise invalid_argument(name, f"expected a mapping or (key, value) pairs, got {type(metadata).__name__}")
    else:
        pairs = metadata
    checked = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise invalid_argument(name, f"item {i}: expected a (key, value) pair, got {pair!r:.80}")
        checked.append(_metadatum(*pair, name=name))
    return tuple(checked)


def _metadatum(key, value, name: str) -> tuple:
    if not isinstance(key, str) or not _METADATA_KEY.fullmatch(key):
        raise invalid_argument(name, f"key {key!r:.80}: expected lowercase ASCII letters, digits, '-', '_' or '.'")
    if key.startswith("grpc-"):
        raise invalid_argument(name, f"key {key!r}: the 'grpc-' prefix is reserved for gRPC itself")
    if key.endswith("-bin"):
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise invalid_argument(name, f"key {key!r}: a '-bin' key takes bytes, got {type(value).__name__}")
        return key, bytes(value)
    if not isinstance(value, str):
        raise invalid_argument(name, f"key {key!r}: expected a str value (bytes only under keys ending in '-bin'), "
                                     f"got {type(value).__name__}")
    if not _METADATA_VALUE.fullmatch(value):
        raise invalid_argument(name, f"key {key!r}: the value must be printable ASCII (bytes: use a key ending "
                                     f"in '-bin')")
    return key, value


def _arrays(value):
    if isinstance(value, np.ndarray):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _arrays(item)


def check_out(out, arguments: dict) -> None:
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


def result_into(out, result):
    """`result` (a new array) copied into `out`, which must have its shape and dtype; the
    result itself without `out` or when it is `out` already."""
    if out is None or result is out:
        return result
    if out.dtype != result.dtype:
        raise TypeError(f"out: expected dtype {result.dtype} (the result's), got {out.dtype}")
    if out.shape != result.shape:
        raise ValueError(f"out: expected shape {result.shape} (the result's), got {out.shape}")
    np.copyto(out, result)
    return out


class Operations:
    """`out=`: the operations with one result write it into a given NumPy array instead of
    returning a new one (and return `out`). It must be a writeable C-contiguous ndarray
    overlapping no input; its shape and dtype must be the result's (remote clients check
    those when the result arrives, as only then is it known; a mismatch raises
    TypeError/ValueError naming `out`). Through shared memory, an `out` made by
    Client.shared_array receives the result from the kernel itself, without any copy.

    After close(), every method raises ClientClosedError (a ValueError: "the client is
    closed"), before looking at its arguments."""

    _closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError()

    def _begin(self, timeout, metadata) -> tuple[float | None, tuple]:
        """What every public method does first: the client must be open, and the call's
        timeout and metadata valid (returned checked)."""
        self._check_open()
        return check_timeout(timeout), check_metadata(metadata)

    def _call_into(self, name: str, arguments: dict, out, timeout, metadata):
        timeout, metadata = self._begin(timeout, metadata)
        if out is not None:
            check_out(out, arguments)
            arguments["out"] = out
        return self._call(name, arguments, timeout, metadata)

    def _session(self, arguments: dict, timeout, metadata):
        timeout, metadata = self._begin(timeout, metadata)
        return self._open_session(arguments, timeout, metadata)

    def normalize_l2(self, x, scale, *, eps=1e-10, across_spatial=False, format="nchw",
                     out=None, timeout=None, metadata=None):
        """L2 normalization with per-channel scale (SimdSynetNormalizeLayerForward)."""
        return self._call_into("normalize_l2", dict(x=x, scale=scale, eps=eps, across_spatial=across_spatial,
                                                    format=format), out, timeout, metadata)

    def layer_norm_channels(self, x, scale, shift, *, eps=1e-5, format="nchw", out=None, timeout=None, metadata=None):
        """Layer normalization across channels (SimdSynetNormalizeLayerForwardV2; 16bV2 for
        BF16 x, which gives a BF16 result)."""
        return self._call_into("layer_norm_channels", dict(x=x, scale=scale, shift=shift, eps=eps, format=format),
                               out, timeout, metadata)

    def layer_norm_spatial(self, x, scale, shift, *, eps=1e-5, format="nchw", out=None, timeout=None, metadata=None):
        """Layer normalization across spatial positions (SimdSynetNormalizeLayerForwardV3)."""
        return self._call_into("layer_norm_spatial", dict(x=x, scale=scale, shift=shift, eps=eps, format=format),
                               out, timeout, metadata)

    def channel_norm(self, x, scale, shift, *, eps=1e-5, format="nchw", out=None, timeout=None, metadata=None):
        """Channel-norm scaling (SimdSynetNormalizeLayerForwardV4)."""
        return self._call_into("channel_norm", dict(x=x, scale=scale, shift=shift, eps=eps, format=format),
                               out, timeout, metadata)

    def channel_sum(self, x, *, format="nchw", out=None, timeout=None, metadata=None):
        """Per-channel sums of a BF16 image tensor, fp32 (batch, channels)
        (SimdSynetChannelSum16b)."""
        return self._call_into("channel_sum", dict(x=x, format=format), out, timeout, metadata)

    def eltwise(self, inputs, op, weights=None, *, out=None, timeout=None, metadata=None):
        """Product, weighted sum, max or min of >= 2 fp32 arrays of one shape
        (SimdSynetEltwiseLayerForward)."""
        return self._call_into("eltwise", dict(inputs=inputs, op=op, weights=weights), out, timeout, metadata)

    def lrn_cross_channels(self, x, half, k, *, format="nchw", out=None, timeout=None, metadata=None):
        """Local response normalization across channels (SimdSynetLrnLayerCrossChannels)."""
        return self._call_into("lrn_cross_channels", dict(x=x, half=half, k=k, format=format), out, timeout, metadata)

    def shuffle(self, x0, x1, *, type, format="nchw", channels=None, timeout=None, metadata=None):
        """Channel shuffle of two tensors (SimdSynetShuffleLayerForward); returns (y0, y1)."""
        return self._call_into("shuffle", dict(x0=x0, x1=x1, type=type, format=format, channels=channels), None,
                               timeout, metadata)

    def softmax(self, x, axis=-1, *, out=None, timeout=None, metadata=None):
        """Softmax along `axis` (SimdSynetSoftmax32f, Softmax16b for BF16 x)."""
        return self._call_into("softmax", dict(x=x, axis=axis), out, timeout, metadata)

    def tiled_scale_2d(self, x, ver, hor, *, format="nchw", out=None, timeout=None, metadata=None):
        """Multiply a 4-D tensor by two tiled 2-D scales (SimdSynetTiledScale2D32f)."""
        return self._call_into("tiled_scale_2d", dict(x=x, ver=ver, hor=hor, format=format), out, timeout, metadata)

    def unary(self, x, op, *, out=None, timeout=None, metadata=None):
        """Element-wise unary operation (SimdSynetUnaryOperation32f); op by name or value."""
        return self._call_into("unary", dict(x=x, op=op), out, timeout, metadata)

    def normalize(self, x, scale=None, bias=None, *, axes, num_groups=1, eps=1e-5, normalize_variance=True,
                  activation=None, compute_dtype=None, out=None, timeout=None, metadata=None):
        """Generic normalization (TensorRT INormalization, DirectML MVN1): mean and variance
        over `axes` (indices or a TensorRT bitmask), optional groups, scale, bias and fused
        activation; FP32, FP16 or BF16 x."""
        return self._call_into("normalize", dict(x=x, scale=scale, bias=bias, axes=axes, num_groups=num_groups, eps=eps,
                                                 normalize_variance=normalize_variance, activation=activation,
                                                 compute_dtype=compute_dtype), out, timeout, metadata)

    def quantized_inner_product(self, *arrays, b_scale, a_scale, a_zero, c_scale, c_zero, bias=None,
                                trans_b=False, max_m=None, algorithm=None, timeout=None, metadata=None):
        """UINT8 x INT8 -> UINT8 matrix product with requantization
        (SimdSynetQuantizedInnerProduct*).

        With one array, `quantized_inner_product(b, ...)` opens a session like
        tensorops_native.QuantizedInnerProduct(b, ...): B is sent and packed once and
        `session.forward(a)` sends A only. With two, `quantized_inner_product(a, b, ...)`
        is the one-shot call of tensorops_native.quantized_inner_product. `max_m` (rows
        expected per forward) applies to sessions only.
        """
        self._check_open()
        params = dict(b_scale=b_scale, a_scale=a_scale, a_zero=a_zero, c_scale=c_scale, c_zero=c_zero,
                      bias=bias, trans_b=trans_b, algorithm=algorithm)
        if len(arrays) == 2:
            if max_m is not None:
                raise TypeError("max_m applies to sessions: quantized_inner_product(b, ..., max_m=...)")
            return self._call_into("quantized_inner_product", dict(a=arrays[0], b=arrays[1], **params), None,
                                   timeout, metadata)
        if len(arrays) == 1:
            return self._session(dict(b=arrays[0], max_m=max_m, **params), timeout, metadata)
        raise TypeError(f"quantized_inner_product() takes b (a session) or a, b (one call), got {len(arrays)} arrays")

    def QuantizedInnerProduct(self, b, *, b_scale, a_scale, a_zero, c_scale, c_zero, bias=None, trans_b=False,
                              max_m=1, algorithm=None, timeout=None, metadata=None):
        """A quantized inner-product session for a constant B (as
        tensorops_native.QuantizedInnerProduct): `.forward(a)`, `.info`,
        `.internal_buffer_size`, `.external_buffer_size_for(m)`, `.close()`."""
        return self._session(dict(b=b, b_scale=b_scale, a_scale=a_scale, a_zero=a_zero, c_scale=c_scale,
                                  c_zero=c_zero, bias=bias, trans_b=trans_b, max_m=max_m, algorithm=algorithm),
                             timeout, metadata)
