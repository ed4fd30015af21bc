"""Float64 NumPy references of the seed functions, written from the seeds' pseudo-code
(the Simd Synet specification) and docs/kernels.md, never from the C kernels.

One function per seed function, named after it. Image tensors are passed in the canonical
float64 layout (batch, channels, spatial) produced by `to_bcs`; `from_bcs` turns a result
back into the API's layout. Every function computes in float64 from the exact values the
kernel receives (fp32 inputs, or BF16 decoded exactly), so the only differences to expect
from a kernel are its own fp32 rounding errors.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
F32_MAX = float(np.finfo(np.float32).max)

# Enumerations of docs/kernels.md.
ELTWISE_PRODUCT, ELTWISE_SUM, ELTWISE_MAX, ELTWISE_MIN = 0, 1, 2, 3
UNARY_NAMES = (
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
)


# ---- conversions -------------------------------------------------------------------------


def bf16_bits(a) -> np.ndarray:
    """The uint16 bit pattern of a BF16 array (ml_dtypes.bfloat16 or uint16 bits)."""
    a = np.asarray(a)
    if a.dtype == BF16:
        return a.view(np.uint16)
    if a.dtype == np.uint16:
        return a
    raise TypeError(f"not a BF16 array: {a.dtype}")


def bf16_to_f64(a) -> np.ndarray:
    """Exact decoding of BF16 bits: the fp32 whose upper half they are."""
    bits = bf16_bits(a).astype(np.uint32) << np.uint32(16)
    with np.errstate(invalid="ignore"):
        return bits.view(np.float32).astype(np.float64)


def f64_to_bf16_bits(ref) -> np.ndarray:
    """What a BF16 kernel must produce from an exact result: round to fp32, then to BF16
    (round to nearest, ties to even, by ml_dtypes)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(ref, np.float64).astype(np.float32).astype(BF16).view(np.uint16)


def as_f64(a) -> np.ndarray:
    """Float64 copy of an fp32 or BF16 array."""
    a = np.asarray(a)
    if a.dtype == BF16 or a.dtype == np.uint16:
        return bf16_to_f64(a)
    with np.errstate(invalid="ignore"):  # signalling NaNs warn when widened
        return a.astype(np.float64)


def to_bcs(x, fmt: str) -> np.ndarray:
    """An image tensor in the API layout (NCHW: (batch, channels, *spatial); NHWC:
    (batch, *spatial, channels)) as float64 (batch, channels, spatial)."""
    x = as_f64(x)
    batch = x.shape[0]
    if fmt == "nchw":
        channels = x.shape[1]
        spatial = math.prod(x.shape[2:])
        return x.reshape(batch, channels, spatial)
    channels = x.shape[-1]
    spatial = math.prod(x.shape[1:-1])
    return x.reshape(batch, spatial, channels).transpose(0, 2, 1)


def from_bcs(y: np.ndarray, shape, fmt: str) -> np.ndarray:
    """Inverse of to_bcs for a tensor of the given API shape."""
    if fmt == "nchw":
        return np.ascontiguousarray(y).reshape(shape)
    return np.ascontiguousarray(y.transpose(0, 2, 1)).reshape(shape)


def _quiet(fn):
    """NaN and infinities are legitimate inputs: no floating-point warnings from the math."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return wrapper


def _per_channel(v) -> np.ndarray:
    return np.asarray(v, np.float64)[None, :, None]


# ---- seed 000: normalize layer ------------------------------------------------------------


@_quiet
def synet_normalize_layer_forward(x, scale, eps, across_spatial):
    """SimdSynetNormalizeLayerForward (L2): dst = src * scale[c] / sqrt(sum + eps), the sum
    of squares over channels at each spatial position, or over channels and spatial
    positions of the batch item when across_spatial (eps inside the sqrt, no division by
    the element count)."""
    sq = x * x
    total = sq.sum(axis=(1, 2), keepdims=True) if across_spatial else sq.sum(axis=1, keepdims=True)
    return x * _per_channel(scale) / np.sqrt(total + float(eps))


@_quiet
def _layer_norm(x, scale, shift, eps, axis):
    count = x.shape[axis]
    mean = x.sum(axis=axis, keepdims=True) / count
    d = x - mean
    sqsum = (d * d).sum(axis=axis, keepdims=True)
    norm = 1.0 / np.sqrt(sqsum / count + float(eps))
    return d * norm * _per_channel(scale) + _per_channel(shift)


def synet_normalize_layer_forward_v2(x, scale, shift, eps):
    """SimdSynetNormalizeLayerForwardV2: layer norm across channels at each spatial
    position (mean, then centred sum of squares, eps inside the sqrt), then scale and shift
    per channel."""
    return _layer_norm(x, scale, shift, eps, axis=1)


def synet_normalize_layer_forward_v3(x, scale, shift, eps):
    """SimdSynetNormalizeLayerForwardV3: the same across the spatial positions of each
    channel."""
    return _layer_norm(x, scale, shift, eps, axis=2)


@_quiet
def synet_normalize_layer_forward_v4(x, scale, shift, eps):
    """SimdSynetNormalizeLayerForwardV4: n_c = sqrt(sum over spatial of x^2);
    norm = 1 / (mean over c of n_c + eps) (eps outside any sqrt);
    y = x * (1 + scale[c] * n_c * norm) + shift[c]."""
    channels = x.shape[1]
    n = np.sqrt((x * x).sum(axis=2))  # (batch, channels)
    norm = 1.0 / (n.sum(axis=1, keepdims=True) / channels + float(eps))
    alpha = 1.0 + np.asarray(scale, np.float64)[None, :] * n * norm
    return x * alpha[:, :, None] + _per_channel(shift)


def synet_normalize_layer_forward_16b_v2(x, scale, shift, eps):
    """SimdSynetNormalizeLayerForward16bV2: V2 on the exactly decoded BF16 input. Returns
    the exact (float64) result; the kernel's BF16 output is f64_to_bf16_bits of it."""
    return synet_normalize_layer_forward_v2(x, scale, shift, eps)


# ---- seed 003 ----------------------------------------------------------------------------


@_quiet
def synet_channel_sum_16b(x):
    """SimdSynetChannelSum16b on each batch item: sum[c] = sum over s of src[c, s]
    (x: float64 (batch, channels, spatial) decoded from BF16). Returns (batch, channels)."""
    return x.sum(axis=2)


@_quiet
def synet_eltwise_layer_forward(srcs, weights, op):
    """SimdSynetEltwiseLayerForward: src[0] combined with src[1] first, then the others in
    order; MAX and MIN propagate NaN (numpy.maximum / minimum do)."""
    s = [np.asarray(a, np.float64) for a in srcs]
    if op == ELTWISE_PRODUCT:
        d = s[0] * s[1]
        for a in s[2:]:
            d = d * a
    elif op == ELTWISE_SUM:
        w = [float(v) for v in weights]
        d = s[0] * w[0] + s[1] * w[1]
        for a, wi in zip(s[2:], w[2:], strict=True):
            d = d + a * wi
    elif op == ELTWISE_MAX:
        d = np.maximum(s[0], s[1])
        for a in s[2:]:
            d = np.maximum(d, a)
    elif op == ELTWISE_MIN:
        d = np.minimum(s[0], s[1])
        for a in s[2:]:
            d = np.minimum(d, a)
    else:
        raise ValueError(op)
    return d


@_quiet
def synet_lrn_layer_cross_channels(x, half, k):
    """SimdSynetLrnLayerCrossChannels: y = x * (k0 + k1 * S)^k2, S the sum of squares over
    channels [c - half, c + half] clipped to the tensor. x: (batch, channels, spatial)."""
    channels = x.shape[1]
    sq = x * x
    s = np.empty_like(x)
    for c in range(channels):  # a window sum (not a cumulative sum: keeps inf/NaN local)
        lo, hi = max(0, c - half), min(channels, c + half + 1)
        s[:, c, :] = sq[:, lo:hi, :].sum(axis=1)
    k0, k1, k2 = (float(v) for v in k)
    return x * np.power(k0 + k1 * s, k2)


@_quiet
def onnx_lrn(x_nchw, size, alpha, beta, bias):
    """ONNX LRN written from the ONNX operator definition (odd size), NCHW float64:
    square_sum[n, c] = sum of x[n, i]^2 for i in [c - floor((size-1)/2), c + ceil((size-1)/2)]
    clipped; y = x / (bias + alpha / size * square_sum)^beta."""
    x = np.asarray(x_nchw, np.float64)
    channels = x.shape[1]
    lo_off, hi_off = (size - 1) // 2, -(-(size - 1) // 2)
    y = np.empty_like(x)
    for c in range(channels):
        lo, hi = max(0, c - lo_off), min(channels - 1, c + hi_off)
        square_sum = (x[:, lo : hi + 1] ** 2).sum(axis=1)
        y[:, c] = x[:, c] / (bias + alpha / size * square_sum) ** beta
    return y


def synet_shuffle_layer_forward(x0, x1, channels0, channels1, type_):
    """SimdSynetShuffleLayerForward on (batch, channels, spatial) arrays (docs/kernels.md):
    type 0 splits S = concat(x0, x1) into its even (output 0) and odd (output 1) channels;
    type 1 interleaves, D[2c] = x0[c], D[2c+1] = x1[c], and splits D into channels0 and
    channels1 channels. Returns (y0, y1); any dtype (a pure copy)."""
    if type_ == 0:
        s = np.concatenate([x0, x1], axis=1)
        half = (channels0 + channels1) // 2
        return s[:, 0 : 2 * half : 2], s[:, 1 : 2 * half : 2]
    half = x0.shape[1]
    d = np.empty((x0.shape[0], 2 * half, x0.shape[2]), x0.dtype)
    d[:, 0::2] = x0
    d[:, 1::2] = x1
    return d[:, :channels0], d[:, channels0 : channels0 + channels1]


def synet_softmax_32f(x, outer, count, inner):
    """SimdSynetSoftmax32f: y = exp(x - max) / sum along count, max-subtracted. All -inf
    rows, and rows containing +inf or NaN, come out NaN (as this float64 formula gives)."""
    x = np.asarray(x, np.float64).reshape(outer, count, inner)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        m = x.max(axis=1, keepdims=True) if count else x
        e = np.exp(x - m)
        return e / e.sum(axis=1, keepdims=True)


def synet_softmax_16b(x_bits, outer, count, inner):
    """SimdSynetSoftmax16b: softmax of the exactly decoded BF16 input, exact result
    (the kernel's BF16 output is f64_to_bf16_bits of it)."""
    return synet_softmax_32f(bf16_to_f64(x_bits), outer, count, inner)


@_quiet
def synet_tiled_scale_2d_32f(x, ver, hor, fmt):
    """SimdSynetTiledScale2D32f on each batch item of a 4-D tensor:
    NCHW y[c, h, w] = x * ver[c, w] * hor[c, h]; NHWC y[h, w, c] = x * ver[w, c] * hor[h, c]."""
    x = np.asarray(x, np.float64)
    ver = np.asarray(ver, np.float64)
    hor = np.asarray(hor, np.float64)
    if fmt == "nchw":
        return x * ver[None, :, None, :] * hor[None, :, :, None]
    return x * ver[None, None, :, :] * hor[None, :, None, :]


_erf = np.frompyfunc(math.erf, 1, 1)
BITWISE_UNARY = ("abs", "neg", "not", "zero")


def unary_bitwise_f32(x, op: str) -> np.ndarray:
    """The unary ops that are bit manipulations, as fp32 (NaN payloads included, which a
    float64 detour would not keep): ABS clears the sign bit, NEG flips it, NOT inverts all
    32 bits, ZERO gives +0."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    if op == "abs":
        out = bits & np.uint32(0x7FFFFFFF)
    elif op == "neg":
        out = bits ^ np.uint32(0x80000000)
    elif op == "not":
        out = ~bits
    elif op == "zero":
        out = np.zeros_like(bits)
    else:
        raise ValueError(op)
    return out.view(np.float32)


def synet_unary_operation_32f(x, op: str) -> np.ndarray:
    """SimdSynetUnaryOperation32f as exact float64 math on the fp32 input (docs/kernels.md
    table). NOT returns the fp32 whose bits are inverted; the exact ops (ABS, NEG, NOT,
    ZERO, CEIL, FLOOR, ROUND, SQRT, RCP, SIGN) give values that round to fp32 exactly as
    IEEE fp32 arithmetic does (sqrt and division are correctly rounded after a float64
    step because 53 >= 2 * 24 + 2)."""
    x32 = np.asarray(x, np.float32)
    if op in BITWISE_UNARY:
        return unary_bitwise_f32(x32, op).astype(np.float64)
    with np.errstate(all="ignore"):  # signalling NaNs warn when widened
        x64 = x32.astype(np.float64)
        if op == "ceil":
            return np.ceil(x64)
        if op == "floor":
            return np.floor(x64)
        if op == "round":
            return np.rint(x64)
        if op == "sign":
            return np.sign(x64)
        if op == "sqrt":
            return np.sqrt(x64)
        if op == "rcp":
            return 1.0 / x64
        if op == "rsqrt":
            return 1.0 / np.sqrt(x64)
        if op == "exp":
            return np.exp(x64)
        if op == "log":
            return np.log(x64)
        if op == "tanh":
            return np.tanh(x64)
        if op == "sin":
            return np.sin(x64)
        if op == "cos":
            return np.cos(x64)
        if op == "erf":
            return _erf(x64).astype(np.float64) if x64.size else x64.copy()
    raise ValueError(f"unknown unary op {op!r}")
