"""Seed 000, the normalize layer: normalize_l2 (V1), layer_norm_channels (V2, and 16bV2 for
BF16), layer_norm_spatial (V3), channel_norm (V4), against the float64 references, on the
full channels x spatial grid in both formats (batch 1 and 3 in a checkerboard over it).

Tolerances (fp32 arithmetic, u = 2^-24):
- L2: y = x * scale / sqrt(sum of squares + eps) is relative-error stable: a few u for the
  sqrt, division and products plus half the sum's relative error, sum_rtol(n) with n the
  number of squares summed. rtol = 1e-6 + sum_rtol(n), no atol (y is proportional to x).
- Layer norms (V2, V3): the mean's rounding error becomes an absolute error of x - mean of
  up to (a few u + sum_rtol(n)) * max|x|, which the output receives multiplied by
  norm * |scale| (norm = 1 / sqrt(var + eps) reaches 1 / sqrt(eps) for rows of tiny variance:
  that is the problem's conditioning, not slack); the variance's error becomes a relative
  one. rtol = 1e-5 + sum_rtol(n); atol = 1e-5 * max|y| + (16u + sum_rtol(n)) * max|x| *
  norm * |scale| per row.
- V4 (no subtraction): rtol = atol / max|y| = 1e-5 + sum_rtol(spatial) + sum_rtol(channels).
- BF16 (16bV2): bit-exact against the exact result rounded to fp32 then BF16, except where
  the kernel's fp32 error (rtol = 32u + sum_rtol(channels), atol = that times
  (max|x| * norm * |scale| + |shift|) of the row) can reach a rounding boundary: there
  within 1 BF16 ulp.
"""

import numpy as np
import pytest

import reference as ref
import tensorops_native as tn
from tn_testing import (
    CHANNELS,
    FORMATS,
    SPATIALS,
    U,
    assert_bf16_where_math_allows,
    assert_close,
    assert_same_bits,
    bf16,
    call_preserving,
    checkerboard_batch,
    f32,
    image_shape,
    params,
    require,
    sum_rtol,
)

GRID = [
    pytest.param(c, s, checkerboard_batch(i, j), id=f"c{c}-s{s}-b{checkerboard_batch(i, j)}")
    for i, c in enumerate(CHANNELS)
    for j, s in enumerate(SPATIALS)
]
SMALL_GRID = [
    pytest.param(c, s, b, id=f"c{c}-s{s}-b{b}")
    for c, s, b in [(1, 1, 1), (3, 5, 3), (8, 16, 1), (17, 49, 3), (67, 5, 1), (16, 3136, 1)]
]


def _magnitude(exact):
    finite = np.abs(exact[np.isfinite(exact)])
    return float(finite.max()) if finite.size else 0.0


def ln_tol(n):
    return 1e-5 + sum_rtol(n)


def ln_sensitivity(x_bcs, scale, shift, eps, axis):
    """max|x| * norm * |scale| + |shift| per row (float64, (batch, channels, spatial)):
    what an absolute error of x - mean, relative to max|x|, becomes in the output."""
    with np.errstate(invalid="ignore", over="ignore"):
        mean = x_bcs.mean(axis=axis, keepdims=True)
        var = ((x_bcs - mean) ** 2).mean(axis=axis, keepdims=True)
        norm = 1.0 / np.sqrt(var + float(eps))
        mag = np.abs(x_bcs).max(axis=axis, keepdims=True)
        return (
            mag * norm * np.abs(scale.astype(np.float64))[None, :, None]
            + np.abs(shift.astype(np.float64))[None, :, None]
        )


# ---- normalize_l2 ---------------------------------------------------------------------------


def check_l2(rng, fmt, channels, spatial, batch, across, *, x=None, eps=1e-10, scale=None):
    require("SynetNormalizeLayerForward")
    shape = image_shape(batch, channels, spatial, fmt)
    x = f32(rng, shape) if x is None else x
    scale = params(rng, channels)[0] if scale is None else scale
    y = call_preserving(tn.normalize_l2, x, scale, eps=eps, across_spatial=across, format=fmt)
    assert y.dtype == np.float32 and y.shape == shape
    exact = ref.from_bcs(
        ref.synet_normalize_layer_forward(ref.to_bcs(x, fmt), scale, np.float32(eps), across), shape, fmt
    )
    n = channels * (spatial if across else 1)
    assert_close(y, exact, rtol=1e-6 + sum_rtol(n), atol=0.0, what=f"normalize_l2 {fmt} across={across}")
    return y


@pytest.mark.parametrize("across", [False, True], ids=["per-position", "across"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels,spatial,batch", GRID)
def test_normalize_l2(rng, fmt, channels, spatial, batch, across):
    check_l2(rng, fmt, channels, spatial, batch, across)


@pytest.mark.parametrize("across", [False, True], ids=["per-position", "across"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_normalize_l2_eps_is_inside_the_sqrt(rng, fmt, across):
    """Small inputs, so that eps matters: sqrt(sum + eps), not sqrt(sum) + eps."""
    shape = image_shape(2, 16, 5, fmt)
    x = f32(rng, shape, scale=1e-3)
    check_l2(rng, fmt, 16, 5, 2, across, x=x, eps=1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
def test_normalize_l2_zero_input_gives_zero(rng, fmt):
    shape = image_shape(1, 5, 16, fmt)
    y = check_l2(rng, fmt, 5, 16, 1, False, x=np.zeros(shape, np.float32))
    assert not y.any()


# ---- layer norms ------------------------------------------------------------------------------

LAYER_NORMS = {
    # name: (API function, reference, kernel, reduction count of (channels, spatial))
    "v2": (
        tn.layer_norm_channels,
        ref.synet_normalize_layer_forward_v2,
        "SynetNormalizeLayerForwardV2",
        lambda c, s: c,
    ),
    "v3": (tn.layer_norm_spatial, ref.synet_normalize_layer_forward_v3, "SynetNormalizeLayerForwardV3", lambda c, s: s),
    "v4": (tn.channel_norm, ref.synet_normalize_layer_forward_v4, "SynetNormalizeLayerForwardV4", lambda c, s: c * s),
}


def check_layer_norm(rng, kind, fmt, channels, spatial, batch, *, x=None, eps=1e-5):
    fn, reference, kernel, count = LAYER_NORMS[kind]
    require(kernel)
    shape = image_shape(batch, channels, spatial, fmt)
    x = f32(rng, shape, loc=0.3) if x is None else x
    scale, shift = params(rng, channels)
    y = call_preserving(fn, x, scale, shift, eps=eps, format=fmt)
    assert y.dtype == np.float32 and y.shape == shape
    x_bcs = ref.to_bcs(x, fmt)
    exact = ref.from_bcs(reference(x_bcs, scale, shift, np.float32(eps)), shape, fmt)
    if kind == "v4":
        tol = ln_tol(spatial) + sum_rtol(channels)
        atol = tol * _magnitude(exact)
    else:
        n = count(channels, spatial)
        tol = ln_tol(n)
        sens = ln_sensitivity(x_bcs, scale, shift, np.float32(eps), axis=1 if kind == "v2" else 2)
        # n == 1: the mean is the element itself, exactly (sum of one term times 1/1)
        d_err = (16 * U + sum_rtol(n)) if n > 1 else 0.0
        atol = 1e-5 * _magnitude(exact) + d_err * ref.from_bcs(np.broadcast_to(sens, x_bcs.shape), shape, fmt)
    assert_close(y, exact, rtol=tol, atol=atol, what=f"{fn.__name__} {fmt}")
    return y


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels,spatial,batch", GRID)
def test_layer_norm_channels(rng, fmt, channels, spatial, batch):
    check_layer_norm(rng, "v2", fmt, channels, spatial, batch)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels,spatial,batch", GRID)
def test_layer_norm_spatial(rng, fmt, channels, spatial, batch):
    check_layer_norm(rng, "v3", fmt, channels, spatial, batch)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels,spatial,batch", GRID)
def test_channel_norm(rng, fmt, channels, spatial, batch):
    check_layer_norm(rng, "v4", fmt, channels, spatial, batch)


@pytest.mark.parametrize("kind", ["v2", "v3", "v4"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_eps_placement(rng, kind, fmt):
    """Inputs of 1e-3: eps = 1e-5 dominates the variance (V2, V3: inside the sqrt) and
    shifts the mean channel norm (V4: outside any sqrt, eps = 1e-3 there)."""
    shape = image_shape(2, 16, 49, fmt)
    check_layer_norm(rng, kind, fmt, 16, 49, 2, x=f32(rng, shape, scale=1e-3), eps=1e-3 if kind == "v4" else 1e-5)


@pytest.mark.parametrize("kind,channels,spatial", [("v2", 67, 49), ("v2", 17, 5), ("v3", 3, 196), ("v3", 5, 49)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_layer_norm_large_offset(rng, kind, fmt, channels, spatial):
    """Mean 1000, deviation 1: the two-pass formula of the seeds (subtract the mean, then sum
    squares) keeps an error of about sum_rtol(n) * 1000 (the tolerance's max|x| term); the
    one-pass E[x^2] - mean^2 would lose most digits of the variance."""
    shape = image_shape(1, channels, spatial, fmt)
    check_layer_norm(rng, kind, fmt, channels, spatial, 1, x=f32(rng, shape, loc=1000.0))


@pytest.mark.parametrize("kind", ["v2", "v3"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_layer_norm_of_constant_gives_shift(rng, kind, fmt):
    """Zero variance: eps keeps the norm finite and y = shift (0.5: a value whose mean is
    exact; the tolerance's max|x| * norm term allows for kernels that fold the mean into
    the shift)."""
    shape = image_shape(2, 8, 16, fmt)
    y = check_layer_norm(rng, kind, fmt, 8, 16, 2, x=np.full(shape, 0.5, np.float32))
    assert np.isfinite(y).all()


@pytest.mark.parametrize("kind", ["l2", "v2", "v3", "v4"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_nan_and_inf_propagate_like_the_reference(rng, kind, fmt):
    """NaN and infinities: no crash, and NaN exactly where the float64 formula gives NaN
    (the rows, channels or batch items they reach), finite values elsewhere."""
    shape = image_shape(3, 17, 16, fmt)
    x = f32(rng, shape)
    flat = x.reshape(-1)
    flat[5], flat[100], flat[-7] = np.nan, np.inf, -np.inf
    if kind == "l2":
        for across in (False, True):
            check_l2(rng, fmt, 17, 16, 3, across, x=x)
    else:
        check_layer_norm(rng, kind, fmt, 17, 16, 3, x=x)


# ---- BF16 layer norm (16bV2) ----------------------------------------------------------------


def check_layer_norm_bf16(rng, fmt, channels, spatial, batch, *, x=None, eps=1e-5):
    require("SynetNormalizeLayerForward16bV2")
    shape = image_shape(batch, channels, spatial, fmt)
    x = bf16(rng, shape, loc=0.3) if x is None else x
    scale, shift = params(rng, channels)
    y = call_preserving(tn.layer_norm_channels, x, scale, shift, eps=eps, format=fmt)
    assert y.dtype == x.dtype and y.shape == shape
    x_bcs = ref.to_bcs(x, fmt)
    exact = ref.from_bcs(ref.synet_normalize_layer_forward_16b_v2(x_bcs, scale, shift, np.float32(eps)), shape, fmt)
    rtol = 32 * U + sum_rtol(channels)
    if channels > 1:
        sens = np.broadcast_to(ln_sensitivity(x_bcs, scale, shift, np.float32(eps), axis=1), x_bcs.shape)
    else:  # the mean is exact: y = 0 * norm * scale + shift, only the shift's magnitude counts
        sens = np.broadcast_to(np.abs(shift.astype(np.float64))[None, :, None], x_bcs.shape)
    assert_bf16_where_math_allows(
        y, exact, rtol=rtol, atol=rtol * ref.from_bcs(sens, shape, fmt), what=f"layer_norm_channels BF16 {fmt}"
    )
    return y


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels,spatial,batch", GRID)
def test_layer_norm_channels_bf16(rng, fmt, channels, spatial, batch):
    check_layer_norm_bf16(rng, fmt, channels, spatial, batch)


@pytest.mark.parametrize("fmt", FORMATS)
def test_layer_norm_channels_bf16_eps_placement(rng, fmt):
    shape = image_shape(2, 16, 49, fmt)
    check_layer_norm_bf16(rng, fmt, 16, 49, 2, x=bf16(rng, shape, scale=1e-3))


@pytest.mark.parametrize("fmt", FORMATS)
def test_layer_norm_channels_bf16_nan_inf(rng, fmt):
    shape = image_shape(2, 17, 5, fmt)
    x = bf16(rng, shape)
    bits = x.view(np.uint16).reshape(-1)
    bits[3], bits[40], bits[-2] = 0x7FC0, 0x7F80, 0xFF80  # NaN, +inf, -inf
    check_layer_norm_bf16(rng, fmt, 17, 5, 2, x=x)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels,spatial,batch", SMALL_GRID)
def test_layer_norm_channels_uint16_bits_give_uint16(rng, fmt, channels, spatial, batch):
    require("SynetNormalizeLayerForward16bV2")
    shape = image_shape(batch, channels, spatial, fmt)
    x = bf16(rng, shape)
    scale, shift = params(rng, channels)
    y_bf16 = tn.layer_norm_channels(x, scale, shift, format=fmt)
    y_u16 = call_preserving(tn.layer_norm_channels, x.view(np.uint16), scale, shift, format=fmt)
    assert y_u16.dtype == np.uint16 and y_u16.shape == shape
    assert_same_bits(y_u16, y_bf16.view(np.uint16))


@pytest.mark.parametrize("fmt", FORMATS)
def test_layer_norm_channels_bf16_denormal_and_tiny_outputs(rng, fmt):
    """Outputs down in the denormal range must stay denormal BF16 (docs/kernels.md: denormals are
    kept): shift tiny, scale tiny."""
    require("SynetNormalizeLayerForward16bV2")
    shape = image_shape(1, 16, 5, fmt)
    x = bf16(rng, shape)
    scale = np.full(16, 1e-39, np.float32)
    shift = np.zeros(16, np.float32)
    y = tn.layer_norm_channels(x, scale, shift, format=fmt)
    exact = ref.from_bcs(
        ref.synet_normalize_layer_forward_16b_v2(ref.to_bcs(x, fmt), scale, shift, np.float32(1e-5)), shape, fmt
    )
    got = ref.bf16_to_f64(y)
    assert (np.abs(got) > 0).mean() > 0.9, "denormal results were flushed to zero"
    np.testing.assert_allclose(got, exact, rtol=2.0**-7, atol=2.0**-133)


def test_layer_norm_channels_bf16_zero_and_denormal_outputs_in_vector_pairs(rng):
    """NHWC rows of 80 channels are written 32 values at a time (two vectors, one conversion
    at AVX-512 with AVX512_BF16): a pair holding a denormal or a +-0 output among normal ones
    must keep the denormal (no flush to zero) and the sign of each zero, as the reference."""
    require("SynetNormalizeLayerForward16bV2")
    channels = 80
    x = bf16(rng, image_shape(4, channels, 3, "nhwc"))
    scale = rng.uniform(0.5, 1.5, channels).astype(np.float32)
    shift = rng.uniform(-1, 1, channels).astype(np.float32)
    scale[[1, 33, 70]] = 1e-39  # denormal outputs (shift 0 below)
    scale[[5, 40]] = 0.0  # +-0 outputs: 0 * y + (+-0)
    shift[[1, 33, 70, 5]] = 0.0
    shift[40] = -0.0
    y = tn.layer_norm_channels(x, scale, shift, format="nhwc")
    exact = ref.from_bcs(
        ref.synet_normalize_layer_forward_16b_v2(ref.to_bcs(x, "nhwc"), scale, shift, np.float32(1e-5)), x.shape, "nhwc"
    )
    got = ref.bf16_to_f64(y)
    tiny = got[..., [1, 33, 70]]
    assert (np.abs(tiny) > 0).all() and (np.abs(tiny) < 2.0**-126).all(), "denormal results were flushed"
    assert (got[..., [5, 40]] == 0).all()
    np.testing.assert_array_equal(np.signbit(got[..., 40]), np.signbit(exact[..., 40]))
    np.testing.assert_allclose(got, exact, rtol=2.0**-7, atol=2.0**-133)


@pytest.mark.parametrize("fmt", FORMATS)
def test_layer_norm_channels_bf16_long_rows(rng, fmt):
    """More channels than the vector levels' fp32 row copy holds (1024): rows converted in
    each pass instead."""
    check_layer_norm_bf16(rng, fmt, 1100, 5, 2)
