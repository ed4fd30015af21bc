"""The normalize layer at the float32 extremes (issue 12, part 3), at every ISA level the
suite runs, against the float64 references of reference.py with the bounds of
test_normalize.py (docs/kernels.md, "Normalize at the extremes"):

- constant rows give exactly y = shift after centering (the mean of a constant row is
  exact), with eps > 0 and with eps = 0 (zero variance and eps = 0: the normalized value
  is 0, the limit eps -> 0+); an all-zero L2 row with eps = 0 gives 0;
- rows whose squares or sums overflow (values around 1e20, near -3.3e38, or of both signs
  near the float32 maximum) or underflow (1e-40, eps = 0) give the finite, accurate result
  of the exact formula instead of 0, inf or NaN;
- an extreme row does not disturb its neighbours (each test mixes extreme and ordinary
  rows where the layout allows).
"""

import numpy as np
import pytest

import reference as ref
import tensorops_native as tn
from test_normalize import check_l2, check_layer_norm, check_layer_norm_bf16
from tn_testing import FORMATS, image_shape, params, require

LAYER_KINDS = ["v2", "v3"]
API = {"v2": tn.layer_norm_channels, "v3": tn.layer_norm_spatial, "v4": tn.channel_norm}
KERNEL = {
    "v2": "SynetNormalizeLayerForwardV2",
    "v3": "SynetNormalizeLayerForwardV3",
    "v4": "SynetNormalizeLayerForwardV4",
}
# (channels, spatial): rows shorter and longer than one vector, in both layouts
SHAPES = [(7, 5), (17, 49), (67, 3), (3, 67)]
SHAPE_IDS = [f"c{c}-s{s}" for c, s in SHAPES]


def extreme(rng, shape, magnitude, loc=0.3):
    """Normal values (loc, spread 1) times magnitude, in float32 (finite)."""
    x = (rng.normal(loc, 1.0, shape) * magnitude).astype(np.float32)
    assert np.isfinite(x).all()
    return x


def expected_shift(shape, fmt, shift):
    bcs = np.broadcast_to(
        np.asarray(shift, np.float32)[None, :, None],
        (shape[0], len(shift), int(np.prod(shape)) // shape[0] // len(shift)),
    )
    return ref.from_bcs(np.ascontiguousarray(bcs), shape, fmt).astype(np.float32)


# ---- constant rows ------------------------------------------------------------------------


@pytest.mark.parametrize("value", [-1700.0, 0.1, 1.0, 3.3e38, -1e-40, 0.0])
@pytest.mark.parametrize("eps", [1e-5, 0.0], ids=["eps1e-5", "eps0"])
@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_layer_norm_of_constant_rows_is_exactly_shift(rng, fmt, kind, eps, value):
    """7 channels of -1700 with eps = 1e-5 gave 0.0386 (the inexact mean times 1/sqrt(eps));
    eps = 0 gave -1 or NaN. The mean of a constant row is now exact, so y = shift exactly."""
    require(KERNEL[kind])
    shape = image_shape(2, 7, 5, fmt)
    x = np.full(shape, value, np.float32)
    scale, shift = params(rng, 7)
    y = API[kind](x, scale, shift, eps=eps, format=fmt)
    np.testing.assert_array_equal(y, expected_shift(shape, fmt, shift))


@pytest.mark.parametrize("value", [-1700.0, 0.1, 1.0, 3.3e38, 0.0])
@pytest.mark.parametrize("eps", [1e-5, 0.0], ids=["eps1e-5", "eps0"])
@pytest.mark.parametrize("channels", [7, 33])
@pytest.mark.parametrize("fmt", FORMATS)
def test_layer_norm_bf16_of_constant_rows_is_exactly_shift(rng, fmt, channels, eps, value):
    require("SynetNormalizeLayerForward16bV2")
    shape = image_shape(2, channels, 5, fmt)
    x = np.full(shape, value, np.float32).astype(ref.BF16)
    scale, shift = params(rng, channels)
    y = tn.layer_norm_channels(x, scale, shift, eps=eps, format=fmt)
    np.testing.assert_array_equal(y.view(np.uint16), expected_shift(shape, fmt, shift).astype(ref.BF16).view(np.uint16))


@pytest.mark.parametrize("eps", [1e-5, 0.0], ids=["eps1e-5", "eps0"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_channel_norm_of_zero_input_is_shift(rng, fmt, eps):
    """All channel norms zero: with eps = 0 the ratio n_c / mean(n) is taken as 0 (the same
    rule), so y = x + shift = shift."""
    require(KERNEL["v4"])
    shape = image_shape(2, 7, 5, fmt)
    scale, shift = params(rng, 7)
    y = tn.channel_norm(np.zeros(shape, np.float32), scale, shift, eps=eps, format=fmt)
    np.testing.assert_array_equal(y, expected_shift(shape, fmt, shift))


@pytest.mark.parametrize("across", [False, True], ids=["per-position", "across"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_normalize_l2_of_zero_with_eps_zero_is_zero(rng, fmt, across):
    require("SynetNormalizeLayerForward")
    shape = image_shape(2, 7, 5, fmt)
    y = tn.normalize_l2(np.zeros(shape, np.float32), params(rng, 7)[0], eps=0.0, across_spatial=across, format=fmt)
    np.testing.assert_array_equal(y, np.zeros(shape, np.float32))


# ---- overflow and underflow -----------------------------------------------------------------


def mixed(rng, shape, magnitude, fmt, kind):
    """Extreme values in the rows of half the batch items, ordinary ones in the others (a
    batch item holds whole rows of every layout); batch 2."""
    x = extreme(rng, shape, magnitude)
    ordinary = extreme(rng, shape, 1.0)
    x[0] = ordinary[0]
    return x


MAGNITUDES = {"1e20": 1e20, "1e-40": 1e-40, "1e-20": 1e-20, "1e36": 1e36}


@pytest.mark.parametrize("mag", list(MAGNITUDES))
@pytest.mark.parametrize("eps", [1e-5, 0.0], ids=["eps1e-5", "eps0"])
@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels,spatial", SHAPES, ids=SHAPE_IDS)
def test_layer_norm_of_huge_and_tiny_rows(rng, fmt, kind, eps, mag, channels, spatial):
    """Values around 1e20 gave 0 (the variance overflowed); 1e-40 with eps = 0 lost the
    variance to underflow."""
    shape = image_shape(2, channels, spatial, fmt)
    x = mixed(rng, shape, MAGNITUDES[mag], fmt, kind)
    y = check_layer_norm(rng, kind, fmt, channels, spatial, 2, x=x, eps=eps)
    assert np.isfinite(y).all()


@pytest.mark.parametrize("kind", LAYER_KINDS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels,spatial", SHAPES, ids=SHAPE_IDS)
def test_layer_norm_near_the_float32_maximum(rng, fmt, kind, channels, spatial):
    """Values near -3.3e38 gave NaN (the sum overflowed); values of both signs near the
    maximum make even x - mean overflow float32."""
    shape = image_shape(2, channels, spatial, fmt)
    near = (-3.3e38 + rng.normal(0.0, 1e36, shape)).astype(np.float32)
    y = check_layer_norm(rng, kind, fmt, channels, spatial, 2, x=near)
    assert np.isfinite(y).all()
    both = (np.sign(rng.normal(size=shape)) * rng.uniform(3.0e38, 3.4e38, shape)).astype(np.float32)
    y = check_layer_norm(rng, kind, fmt, channels, spatial, 2, x=both)
    assert np.isfinite(y).all()


@pytest.mark.parametrize("mag", ["1e20", "1e-40", "-3.3e38"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels,spatial", [(7, 5), (33, 16)], ids=["c7-s5", "c33-s16"])
def test_layer_norm_bf16_extremes(rng, fmt, mag, channels, spatial):
    shape = image_shape(2, channels, spatial, fmt)
    if mag == "-3.3e38":  # a wide spread, so that BF16's 8 bits leave results to check exactly
        x = (-3.3e38 * rng.uniform(0.3, 1.0, shape)).astype(np.float32)
    else:
        x = mixed(rng, shape, float(mag), fmt, "v2")
    y = check_layer_norm_bf16(rng, fmt, channels, spatial, 2, x=x.astype(ref.BF16), eps=0.0 if mag == "1e-40" else 1e-5)
    assert np.isfinite(ref.bf16_to_f64(y)).all()


@pytest.mark.parametrize("mag", ["1e20", "1e-40", "3.3e38", "1e-20"])
@pytest.mark.parametrize("across", [False, True], ids=["per-position", "across"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels,spatial", SHAPES, ids=SHAPE_IDS)
def test_normalize_l2_of_huge_and_tiny_values(rng, fmt, across, mag, channels, spatial):
    """1e20 gave 0 (the sum of squares overflowed), 1e-40 with eps = 0 gave inf."""
    shape = image_shape(2, channels, spatial, fmt)
    if mag == "3.3e38":
        x = (np.sign(rng.normal(size=shape)) * rng.uniform(1e38, 3.3e38, shape)).astype(np.float32)
    else:
        x = mixed(rng, shape, float(mag), fmt, "l2")
    y = check_l2(rng, fmt, channels, spatial, 2, across, x=x, eps=0.0)
    assert np.isfinite(y).all()


@pytest.mark.parametrize("mag", ["1e20", "1e-30", "-3.3e38"])
@pytest.mark.parametrize("eps", [1e-5, 0.0], ids=["eps1e-5", "eps0"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels,spatial", SHAPES, ids=SHAPE_IDS)
def test_channel_norm_of_huge_and_tiny_values(rng, fmt, eps, mag, channels, spatial):
    """1e20 gave NaN (inf / inf of the channel norms)."""
    shape = image_shape(2, channels, spatial, fmt)
    if mag == "-3.3e38":
        x = (-3.3e38 + rng.normal(0.0, 1e36, shape)).astype(np.float32)
        # x * (1 + scale * n_c / mean(n)) must stay finite: |scale| * n_c / mean(n) < ~0.03
        require(KERNEL["v4"])
        scale, shift = params(rng, channels)
        y = tn.channel_norm(x, scale * 0.01 / channels, shift, eps=eps, format=fmt)
        exact = ref.from_bcs(
            ref.synet_normalize_layer_forward_v4(
                ref.to_bcs(x, fmt), scale * np.float32(0.01 / channels), shift, np.float32(eps)
            ),
            shape,
            fmt,
        )
        assert np.isfinite(y).all()
        np.testing.assert_allclose(y, exact, rtol=1e-5, atol=0)
        return
    x = mixed(rng, shape, float(mag), fmt, "v4")
    y = check_layer_norm(rng, "v4", fmt, channels, spatial, 2, x=x, eps=eps)
    assert np.isfinite(y).all()
