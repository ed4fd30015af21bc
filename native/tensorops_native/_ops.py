"""The operations of tensorops_native: validate, allocate, call C.

Each function checks every argument (see _checks), allocates its result with np.empty (or
writes it into `out=`, an array of exactly the result's shape and dtype; shuffle takes a
pair) and any scratch the kernel needs (so C
never allocates), and passes NumPy memory to C with
ffi.from_buffer: no copies. cffi releases the GIL during each kernel call, so threads
calling these functions run in parallel.
"""

from __future__ import annotations

import math

import numpy as np

from . import _checks as ck
from ._native import ffi, lib

UNARY_OPS = {
    "abs": 0,
    "ceil": 1,
    "cos": 2,
    "erf": 3,
    "exp": 4,
    "floor": 5,
    "log": 6,
    "neg": 7,
    "not": 8,
    "rcp": 9,
    "round": 10,
    "rsqrt": 11,
    "sign": 12,
    "sin": 13,
    "sqrt": 14,
    "tanh": 15,
    "zero": 16,
}
ELTWISE_OPS = {"product": 0, "sum": 1, "max": 2, "min": 3}


def _f32_ptr(arr):
    return ffi.from_buffer("float[]", arr)


def _bf16_ptr(arr):
    """BF16 data (ml_dtypes.bfloat16 or uint16 bits, contiguous) as the uint16_t * the C API
    takes: the array's own buffer, whatever its dtype (a uint16 view first took 10 us more
    from cold caches)."""
    return ffi.from_buffer("uint16_t[]", arr)


def _eps_ptr(eps: float):
    return ffi.new("float *", eps)


def _image(x, fmt, name="x"):
    x = ck.f32_tensor(x, name)
    batch, channels, spatial = ck.image_dims(x, name, fmt)
    return x, batch, channels, spatial


def _per_channel(value, name, x, fmt, channels):
    channels_if_other_format = x.shape[-1] if fmt == 0 else x.shape[1]
    return ck.f32_params(value, name, (channels,), other_format=(fmt, (channels_if_other_format,)))


def normalize_l2(x, scale, *, eps=1e-10, across_spatial=False, format="nchw", out=None):
    """L2 normalization with per-channel scale (SimdSynetNormalizeLayerForward):
    y = x * scale[c] / sqrt(sum(x^2) + eps), the sum over channels at each spatial position,
    or over channels and spatial positions of each batch item when across_spatial."""
    fmt = ck.tensor_format(format)
    x, batch, channels, spatial = _image(x, fmt)
    scale = _per_channel(scale, "scale", x, fmt, channels)
    eps = ck.finite_float(eps, "eps", minimum=0.0)
    across = ck.boolean(across_spatial, "across_spatial")
    y = ck.output(out, x.shape, x.dtype, (x, scale))
    if x.size:
        buf = np.empty(max(spatial, channels, 1), np.float32)
        lib.TnSynetNormalizeLayerForward(
            _f32_ptr(x),
            batch,
            channels,
            spatial,
            _f32_ptr(scale),
            _eps_ptr(eps),
            int(across),
            fmt,
            _f32_ptr(buf),
            _f32_ptr(y),
        )
    return y


def _layer_norm(kernel, x, scale, shift, eps, format, out, *, bf16=False):
    """The normalize-layer kernels V2 / V3 / V4 / 16bV2 share one signature."""
    fmt = ck.tensor_format(format)
    x = ck.bf16_tensor(x, "x") if bf16 else ck.f32_tensor(x, "x")
    batch, channels, spatial = ck.image_dims(x, "x", fmt)
    scale = _per_channel(scale, "scale", x, fmt, channels)
    shift = _per_channel(shift, "shift", x, fmt, channels)
    eps = ck.finite_float(eps, "eps", minimum=0.0)
    y = ck.output(out, x.shape, x.dtype, (x, scale, shift))
    if x.size:
        data_ptr = _bf16_ptr if bf16 else _f32_ptr
        # the BF16 kernel takes no scratch: no allocation (one costs 15 us from cold caches)
        buf = ffi.NULL if bf16 else _f32_ptr(np.empty(max(spatial, channels, 1), np.float32))
        kernel(
            data_ptr(x),
            batch,
            channels,
            spatial,
            _f32_ptr(scale),
            _f32_ptr(shift),
            _eps_ptr(eps),
            fmt,
            buf,
            data_ptr(y),
        )
    return y


def layer_norm_channels(x, scale, shift, *, eps=1e-5, format="nchw", out=None):
    """Layer normalization across channels at each spatial position, then per-channel scale
    and shift (SimdSynetNormalizeLayerForwardV2; ...Forward16bV2 for BF16 x, which returns
    BF16 in the dtype it was given: ml_dtypes.bfloat16 or uint16 bits)."""
    if ck.is_bf16(x):
        return _layer_norm(lib.TnSynetNormalizeLayerForward16bV2, x, scale, shift, eps, format, out, bf16=True)
    return _layer_norm(lib.TnSynetNormalizeLayerForwardV2, x, scale, shift, eps, format, out)


def layer_norm_spatial(x, scale, shift, *, eps=1e-5, format="nchw", out=None):
    """Layer normalization across spatial positions of each channel, then per-channel scale
    and shift (SimdSynetNormalizeLayerForwardV3)."""
    return _layer_norm(lib.TnSynetNormalizeLayerForwardV3, x, scale, shift, eps, format, out)


def channel_norm(x, scale, shift, *, eps=1e-5, format="nchw", out=None):
    """Channel-norm scaling (SimdSynetNormalizeLayerForwardV4): n_c = ||x[:, c, :]||_2,
    y = x * (1 + scale[c] * n_c / (mean_c(n_c) + eps)) + shift[c]."""
    return _layer_norm(lib.TnSynetNormalizeLayerForwardV4, x, scale, shift, eps, format, out)


def channel_sum(x, *, format="nchw", out=None):
    """Per-channel sums of a BF16 image tensor, in fp32, shape (batch, channels)
    (SimdSynetChannelSum16b applied to each batch item, in one batched C call)."""
    fmt = ck.tensor_format(format)
    x = ck.bf16_tensor(x, "x")
    batch, channels, spatial = ck.image_dims(x, "x", fmt)
    if out is None:
        y = np.zeros((batch, channels), np.float32)
    else:
        y = ck.output(out, (batch, channels), np.dtype(np.float32), (x,))
        y.fill(0)  # the sums of an empty spatial size
    if x.size:
        lib.TnSynetChannelSum16bBatch(_bf16_ptr(x), batch, channels, spatial, fmt, _f32_ptr(y))
    return y


def eltwise(inputs, op, weights=None, *, out=None):
    """Element-wise product, weighted sum, max or min of >= 2 float32 arrays of one shape
    (SimdSynetEltwiseLayerForward). weights (one per input) apply to 'sum' only and
    default to ones."""
    op = ck.choice(op, "op", ELTWISE_OPS)
    items = ck.sequence(inputs, "inputs")
    if len(items) < 2:
        raise ck.ArgumentError("inputs", f"expected at least 2 arrays, got {len(items)}")
    arrays = [ck.f32_tensor(a, f"inputs[{i}]") for i, a in enumerate(items)]
    for i, a in enumerate(arrays[1:], start=1):
        if a.shape != arrays[0].shape:
            raise ck.ArgumentError(f"inputs[{i}]", f"expected shape {arrays[0].shape} like inputs[0], got {a.shape}")
    if op == ELTWISE_OPS["sum"]:
        w = np.ones(len(arrays), np.float32) if weights is None else ck.f32_params(weights, "weights", (len(arrays),))
    elif weights is not None:
        raise ck.ArgumentError("weights", "only the 'sum' operation takes weights")
    else:
        w = None
    y = ck.output(out, arrays[0].shape, arrays[0].dtype, arrays)
    if y.size:
        keep = [_f32_ptr(a) for a in arrays]
        src = ffi.new("float *[]", keep)
        lib.TnSynetEltwiseLayerForward(
            src, _f32_ptr(w) if w is not None else ffi.NULL, len(arrays), y.size, op, _f32_ptr(y)
        )
    return y


def lrn_cross_channels(x, half, k, *, format="nchw", out=None):
    """Local response normalization across channels (SimdSynetLrnLayerCrossChannels):
    y = x * (k0 + k1 * S)^k2, S the sum of squares over channels [c - half, c + half]."""
    fmt = ck.tensor_format(format)
    x, batch, channels, spatial = _image(x, fmt)
    half = ck.integer(half, "half", minimum=0)
    k = _lrn_k(k)
    half = min(half, channels)  # a wider window covers the same channels
    y = ck.output(out, x.shape, x.dtype, (x,))
    if x.size:
        lib.TnSynetLrnLayerCrossChannelsBatch(_f32_ptr(x), batch, half, channels, spatial, k, _f32_ptr(y), fmt)
    return y


def _lrn_k(k):
    """(k0, k1, k2) as the float[3] the kernel takes: three real numbers, finite in float32.
    The usual form, a tuple or list of three Python numbers, is checked without NumPy: from
    cold caches NumPy's conversion and isfinite on three values took about 90 us, more than
    the whole kernel's setup. Anything else, and any value this rejects, takes the general
    path, which gives the errors."""
    if type(k) in (tuple, list) and len(k) == 3 and all(type(v) in (float, int) for v in k):
        try:
            values = [float(v) for v in k]
        except OverflowError:  # an int beyond any float
            values = []
        # NaN fails the comparison, so it goes to the general path too
        if values and all(abs(v) < ck.FLOAT32_ROUNDS_TO_INF for v in values):
            return ffi.new("float[3]", values)
    arr = ck.f32_params(k, "k", (3,))
    if not np.all(np.isfinite(arr)):
        raise ck.ArgumentError("k", f"must be finite, got {arr.tolist()}")
    return _f32_ptr(arr)


def _with_channels(shape, fmt, channels):
    shape = list(shape)
    shape[1 if fmt == 0 else -1] = channels
    return tuple(shape)


def _spatial_shape(shape, fmt):
    return tuple(shape[2:]) if fmt == 0 else tuple(shape[1:-1])


def shuffle(x0, x1, *, type, format="nchw", channels=None, out=None):
    """ShuffleNet channel shuffle of two tensors (SimdSynetShuffleLayerForward); returns
    (y0, y1), written into `out` = (y0, y1) when given. type 0 splits the even and odd
    channels of concat(x0, x1); type 1 interleaves x0 and x1 and splits the result into
    channels = (channels0, channels1) (default: equal halves)."""
    fmt = ck.tensor_format(format)
    kind = ck.choice(type, "type", {"split": 0, "interleave": 1})
    x0, b0, c0, s0 = _image(x0, fmt, "x0")
    x1, b1, c1, s1 = _image(x1, fmt, "x1")
    if b1 != b0:
        raise ck.ArgumentError("x1", f"expected batch {b0} like x0, got {b1}")
    if x1.ndim != x0.ndim or _spatial_shape(x1.shape, fmt) != _spatial_shape(x0.shape, fmt):
        raise ck.ArgumentError(
            "x1", f"expected spatial dimensions {_spatial_shape(x0.shape, fmt)} like x0, got shape {x1.shape}"
        )
    if kind == 0:
        if channels is not None:
            raise ck.ArgumentError("channels", "only type 'interleave' takes output channel counts")
        for name, c in (("x0", c0), ("x1", c1)):
            if c % 2:
                raise ck.ArgumentError(name, f"type 'split' needs an even channel count, got {c}")
        channels0, channels1 = c0, c1
        half = (c0 + c1) // 2
        out0 = out1 = _with_channels(x0.shape, fmt, half)
    else:
        if c0 != c1:
            raise ck.ArgumentError("x1", f"type 'interleave' needs inputs with equal channel counts, got {c0} and {c1}")
        total = 2 * c0
        if channels is None:
            channels0 = channels1 = c0
        else:
            pair = ck.sequence(channels, "channels")
            if len(pair) != 2:
                raise ck.ArgumentError("channels", f"expected (channels0, channels1), got {channels!r}")
            channels0 = ck.integer(pair[0], "channels[0]", minimum=0)
            channels1 = ck.integer(pair[1], "channels[1]", minimum=0)
            if channels0 + channels1 != total:
                raise ck.ArgumentError(
                    "channels", f"must add up to {total} (twice the input channels), got {channels0} + {channels1}"
                )
        for name, c in (("channels[0]", channels0), ("channels[1]", channels1)):
            if c % 2:
                raise ck.ArgumentError(name, f"type 'interleave' needs even output channel counts, got {c}")
        out0 = _with_channels(x0.shape, fmt, channels0)
        out1 = _with_channels(x0.shape, fmt, channels1)
    y0, y1 = ck.output_pair(out, (out0, out1), np.dtype(np.float32), (x0, x1))
    if b0 and s0 and (channels0 + channels1):
        lib.TnSynetShuffleLayerForwardBatch(
            _f32_ptr(x0), _f32_ptr(x1), b0, channels0, channels1, s0, _f32_ptr(y0), _f32_ptr(y1), fmt, kind
        )
    return y0, y1


def softmax(x, axis=-1, *, out=None):
    """Softmax along `axis` (SimdSynetSoftmax32f, or Softmax16b for BF16 x)."""
    bf16 = ck.is_bf16(x)
    x = ck.bf16_tensor(x, "x") if bf16 else ck.f32_tensor(x, "x")
    if x.ndim < 1:
        raise ck.ArgumentError("x", "expected at least 1 dimension, got a scalar")
    ax = ck.axis_index(axis, x.ndim)
    outer = math.prod(x.shape[:ax])
    count = x.shape[ax]
    inner = math.prod(x.shape[ax + 1 :])
    y = ck.output(out, x.shape, x.dtype, (x,))
    if x.size:
        if bf16:
            lib.TnSynetSoftmax16b(_bf16_ptr(x), outer, count, inner, _bf16_ptr(y))
        else:
            lib.TnSynetSoftmax32f(_f32_ptr(x), outer, count, inner, _f32_ptr(y))
    return y


def tiled_scale_2d(x, ver, hor, *, format="nchw", out=None):
    """Multiply a 4-D tensor by two tiled 2-D scales (SimdSynetTiledScale2D32f per batch
    item, in one batched C call): NCHW y = x * ver[c, w] * hor[c, h];
    NHWC y = x * ver[w, c] * hor[h, c]."""
    fmt = ck.tensor_format(format)
    x = ck.f32_tensor(x, "x")
    if x.ndim != 4:
        raise ck.ArgumentError("x", f"expected 4 dimensions ({'NCHW' if fmt == 0 else 'NHWC'}), got shape {x.shape}")
    # ver is (channels, width) for NCHW and (width, channels) for NHWC, hor the same with
    # height; each format's expectation, to say when the other one explains a shape.
    d1, d2, d3 = x.shape[1:]
    ver_shapes, hor_shapes = ((d1, d3), (d2, d3)), ((d1, d2), (d1, d3))
    ver = ck.f32_params(ver, "ver", ver_shapes[fmt], other_format=(fmt, ver_shapes[1 - fmt]))
    hor = ck.f32_params(hor, "hor", hor_shapes[fmt], other_format=(fmt, hor_shapes[1 - fmt]))
    if fmt == 0:
        batch, channels, height, width = x.shape
    else:
        batch, height, width, channels = x.shape
    y = ck.output(out, x.shape, x.dtype, (x, ver, hor))
    if x.size:
        lib.TnSynetTiledScale2D32fBatch(
            _f32_ptr(x), batch, channels, height, width, fmt, _f32_ptr(ver), _f32_ptr(hor), _f32_ptr(y)
        )
    return y


def unary(x, op, *, out=None):
    """Element-wise unary operation (SimdSynetUnaryOperation32f); op is a name of
    UNARY_OPS ('exp', 'rsqrt', ...) or its enum value."""
    op = ck.choice(op, "op", UNARY_OPS)
    x = ck.f32_tensor(x, "x")
    y = ck.output(out, x.shape, x.dtype, (x,))
    if x.size:
        lib.TnSynetUnaryOperation32f(_f32_ptr(x), x.size, op, _f32_ptr(y))
    return y
