"""lrn_cross_channels (seed 003: LrnLayerCrossChannels), y = x * (k0 + k1 * S)^k2, S the sum of
squares over the clipped channel window: channels 1..67, half 0, 1, 2, 5, both formats, and
the ONNX LRN mapping of docs/kernels.md.

Tolerance: S sums at most 2 * half + 1 squares (half <= 4: each square rounded, then added, at
most 4 * half + 1 = 17 roundings; wider windows: fma chains, < 11u + sum_rtol at half 5), the
base k0 + k1 * S adds 2u, and the power (exp of k2 * log of the base in fp32) adds its argument's
rounding (|k2 * log(base)| <= 3 here, about 3u) and the 4e-7 of exp. The result is within
1e-5 relative of the exact value; it is proportional to x, so no absolute term.
"""

import numpy as np
import pytest

import reference as ref
import tensorops_native as tn
from tn_testing import CHANNELS, FORMATS, assert_close, call_preserving, f32, image_shape, require

HALVES = (0, 1, 2, 5)
SPATIAL_CYCLE = (1, 5, 16, 49)
RTOL = 1e-5


def k_for(rng, half):
    k0 = rng.uniform(0.5, 2.0)
    k1 = rng.uniform(0.05, 1.0) / (2 * half + 1)
    k2 = rng.choice([-0.75, -0.5, -1.0, 0.3, -0.25])
    return np.array([k0, k1, k2], np.float32)


def check(x, half, k, fmt):
    require("SynetLrnLayerCrossChannels")
    y = call_preserving(tn.lrn_cross_channels, x, half, k, format=fmt)
    assert y.dtype == np.float32 and y.shape == x.shape
    exact = ref.from_bcs(ref.synet_lrn_layer_cross_channels(ref.to_bcs(x, fmt), half, k), x.shape, fmt)
    assert_close(y, exact, rtol=RTOL, atol=1e-37, what=f"lrn half={half} k={k.tolist()} {fmt}")
    return y


CASES = [
    pytest.param(c, h, SPATIAL_CYCLE[(i + j) % 4], 1 + 2 * ((i + j) % 2), id=f"c{c}-half{h}")
    for i, c in enumerate(CHANNELS)
    for j, h in enumerate(HALVES)
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels,half,spatial,batch", CASES)
def test_lrn(rng, fmt, channels, half, spatial, batch):
    x = f32(rng, image_shape(batch, channels, spatial, fmt), scale=2.0)
    check(x, half, k_for(rng, half), fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels,half", [(67, 2), (16, 5), (3, 1)])
def test_lrn_large_spatial(rng, fmt, channels, half):
    x = f32(rng, image_shape(1, channels, 3136, fmt))
    check(x, half, k_for(rng, half), fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels,half", [(1, 3), (7, 7), (7, 100), (17, 2**40)])
def test_lrn_window_wider_than_tensor(rng, fmt, channels, half):
    """Any half >= 0 works: a window wider than the tensor covers every channel."""
    x = f32(rng, image_shape(2, channels, 5, fmt))
    check(x, half, k_for(rng, 5), fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "size,alpha,beta,bias",
    [(1, 1e-4, 0.75, 1.0), (3, 0.5, 0.75, 2.0), (5, 1e-4, 0.75, 1.0), (5, 2.0, 0.5, 1.0), (11, 0.3, 1.0, 0.5)],
)
def test_lrn_onnx_mapping(rng, fmt, size, alpha, beta, bias):
    """ONNX LRN (size, alpha, beta, bias) through the docs/kernels.md mapping half = (size-1)/2,
    k = (bias, alpha / size, -beta), against ONNX's own formula."""
    require("SynetLrnLayerCrossChannels")
    shape = image_shape(2, 17, 16, fmt)
    x = f32(rng, shape, scale=3.0)
    k = np.array([bias, alpha / size, -beta], np.float32)
    y = tn.lrn_cross_channels(x, (size - 1) // 2, k, format=fmt)
    nchw = ref.to_bcs(x, fmt)
    # the kernel receives k in fp32: the ONNX formula with those fp32 values
    exact = ref.onnx_lrn(nchw, size, float(k[1]) * size, -float(k[2]), float(k[0]))
    assert_close(y, ref.from_bcs(exact, shape, fmt), rtol=RTOL, atol=1e-37, what=f"ONNX LRN size {size}")


@pytest.mark.parametrize(
    "k",
    [(1.0, 1e-4 / 5, -0.75), [2, 3, -1], (0.1, 0.3, 0.7), [1e-40, 0.5, -0.25], (2.0**128 - 2.0**104, 1e-30, -0.5)],
    ids=["alexnet", "ints", "inexact", "denormal-k0", "float32-max"],
)
def test_lrn_k_as_numbers(rng, k):
    """k given as Python numbers (checked without NumPy) gives the bits k as a float32 array
    gives, for values that round in float32, a denormal and the largest float32."""
    require("SynetLrnLayerCrossChannels")
    x = f32(rng, image_shape(2, 9, 7, "nchw"), scale=3.0)
    k32 = np.array(k, np.float32)
    assert np.all(np.isfinite(k32))
    y = tn.lrn_cross_channels(x, 2, k)
    assert np.array_equal(y.view(np.uint32), tn.lrn_cross_channels(x, 2, k32).view(np.uint32))
    check(x, 2, k32, "nchw")


@pytest.mark.parametrize("fmt", FORMATS)
def test_lrn_nan_inf(rng, fmt):
    x = f32(rng, image_shape(1, 17, 5, fmt))
    flat = x.reshape(-1)
    flat[3], flat[40], flat[-1] = np.nan, np.inf, -np.inf
    check(x, 2, np.float32([1.0, 0.1, -0.75]), fmt)


def lrn_power_inputs(rng, n=1 << 16):
    """x with |x| from 2^-52 to 2^52, so b = x^2 (half 0, k = (0, 1, k2)) spans LRN's own power
    range 2^-100 <= b < 2^101 and beyond it. First half sorted by magnitude (runs of one
    exponent: the per-exponent tables), second half shuffled (mixed exponents per vector)."""
    mag = np.exp2(rng.uniform(-52, 52, n))
    x = (mag * rng.choice([-1.0, 1.0], n)).astype(np.float32)
    x[: n // 2] = x[np.argsort(np.abs(x[: n // 2]))]
    return x


@pytest.mark.parametrize("k2", [-0.75, -0.5, -1.0, 1.0, 0.3, -0.999, 0.0, -1.5])
def test_lrn_power_accuracy(rng, k2):
    """docs/kernels.md: LRN's own power (|k2| <= 1, 2^-100 <= b < 2^101) is within 2.4e-7 of
    b^k2 (measured), so y within 3.5e-7; other bases and |k2| > 1 take the table pow
    (2e-7 + 3e-8 |k2 log2 b|)."""
    require("SynetLrnLayerCrossChannels")
    x = lrn_power_inputs(rng)
    k = np.float32([0.0, 1.0, k2])
    y = tn.lrn_cross_channels(x.reshape(1, 1, -1), 0, k, format="nchw").reshape(-1)
    b = (x.astype(np.float64) ** 2).astype(np.float32).astype(np.float64)  # S = x^2 rounded once
    exact = x * b ** np.float64(np.float32(k2))
    pw = np.abs(exact / x)
    # the power and y both normal floats (the power is a float before it meets x)
    normal = (np.abs(exact) >= 2.0**-126) & (np.abs(exact) < 2.0**128) & (pw >= 2.0**-126) & (pw < 2.0**128)
    own = (b >= 2.0**-100) & (b < 2.0**101) & (abs(k2) <= 1) & normal
    rel = np.abs(y / exact - 1)
    assert rel[own].max(initial=0) <= 3.5e-7, f"own power: worst {rel[own].max()}"
    other = ~own & (b >= 2.0**-126) & normal
    bound = 5e-7 + 4e-8 * np.abs(k2 * np.log2(b[other]))  # "about", plus the rounding of y
    assert (rel[other] <= bound).all(), f"table pow: worst {rel[other].max()}"
