"""The batched entry points (TnSynet...Batch, native/src/batch.c): channel_sum,
lrn_cross_channels, shuffle and tiled_scale_2d make one C call per request, which must give
exactly the bits of calling the per-item C function on each batch item in turn (NaN payloads
included). batch.c only steps from item to item, so a few shapes cover it: batches of 1 (no
step), 2 and 7, items of one value and items across a vector tail, each format, each family,
every shuffle layout; then large batches of tiny items against NumPy.
"""

import numpy as np
import pytest

import reference as ref
import tensorops_native as tn
from tn_testing import FMT_CODE, FORMATS, assert_close, assert_same_bits, c_call, image_shape, random_bits, require

# batch.c calls the dispatched per-item entry points, which the kernel tests cover at each
# level: run once, at the process's level.
pytestmark = pytest.mark.level_independent

# (batch, channels, spatial): no step, a step over one value, steps over items with
# vector tails in both dimensions.
ITEMS = ((1, 17, 5), (2, 1, 1), (7, 33, 17), (2, 16, 16))
IMAGES = [pytest.param(b, c, s, fmt, id=f"b{b}-c{c}-s{s}-{fmt}") for b, c, s in ITEMS for fmt in FORMATS]
# Tiled scale (batch, channels, height, width).
TILES = ((1, 17, 5, 1), (2, 1, 1, 1), (7, 33, 1, 17), (2, 16, 4, 4))
# Shuffle (type, channels0, channels1): the inputs of type 0, the outputs of type 1; every
# layout of the per-item tests, batch 3 (two steps of each of the four tensors' sizes).
SHUFFLES = [
    (0, 2, 2),
    (0, 16, 14),
    (0, 18, 16),
    (0, 34, 2),
    (0, 0, 18),
    (1, 2, 0),
    (1, 8, 8),
    (1, 4, 14),
    (1, 18, 16),
    (1, 0, 32),
]


def with_specials(x):
    """x with NaN, inf and -inf at the start and the end, where vector tails are."""
    flat = x.reshape(-1)
    flat[[0, -1]] = np.nan
    if flat.size > 3:
        flat[[1, -2]] = [np.inf, -np.inf]
    return x


def poisoned(shape):
    return np.full(shape, 0x7FC0DEAD, np.uint32).view(np.float32)


def image(rng, batch, channels, spatial, fmt):
    return with_specials(rng.normal(size=image_shape(batch, channels, spatial, fmt)).astype(np.float32))


@pytest.mark.parametrize("batch,channels,spatial,fmt", IMAGES)
def test_channel_sum_batch_equals_per_item(rng, batch, channels, spatial, fmt):
    require("SynetChannelSum16b")
    bits = image(rng, batch, channels, spatial, fmt).astype(ref.BF16).view(np.uint16)
    want = poisoned((batch, channels))
    for b in range(batch):
        c_call("SynetChannelSum16b", bits[b], channels, spatial, FMT_CODE[fmt], want[b])
    assert_same_bits(tn.channel_sum(bits, format=fmt), want, what=f"channel_sum batch {batch}")


@pytest.mark.parametrize("batch,channels,spatial,fmt", IMAGES)
def test_lrn_batch_equals_per_item(rng, batch, channels, spatial, fmt):
    require("SynetLrnLayerCrossChannels")
    x = image(rng, batch, channels, spatial, fmt)
    half = int(rng.integers(0, 4))
    k = np.float32([1.5, 0.1, -0.75])
    want = poisoned(x.shape)
    for b in range(batch):
        c_call("SynetLrnLayerCrossChannels", x[b], half, channels, spatial, k, want[b], FMT_CODE[fmt])
    assert_same_bits(tn.lrn_cross_channels(x, half, k, format=fmt), want, what=f"lrn batch {batch} half {half}")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("type_,c0,c1", SHUFFLES)
def test_shuffle_batch_equals_per_item(rng, type_, c0, c1, fmt, batch=3, spatial=5):
    """channels0 = c0 and channels1 = c1 are the inputs of type 0 and the outputs of type 1;
    the other side has (c0 + c1) / 2 channels in each tensor."""
    require("SynetShuffleLayerForward")
    half = (c0 + c1) // 2
    ins, outs = ((c0, c1), (half, half)) if type_ == 0 else ((half, half), (c0, c1))
    x0, x1 = (random_bits(rng, image_shape(batch, c, spatial, fmt)) for c in ins)
    y0, y1 = (poisoned(image_shape(batch, c, spatial, fmt)) for c in outs)
    for b in range(batch):
        c_call("SynetShuffleLayerForward", x0[b], x1[b], c0, c1, spatial, y0[b], y1[b], FMT_CODE[fmt], type_)
    got = tn.shuffle(x0, x1, type=type_, format=fmt, channels=(c0, c1) if type_ else None)
    for g, w, name in zip(got, (y0, y1), ("y0", "y1"), strict=True):
        assert_same_bits(g, w, what=f"shuffle type {type_} batch {batch} {name}")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("batch,channels,h,w", TILES)
def test_tiled_scale_2d_batch_equals_per_item(rng, batch, channels, h, w, fmt):
    require("SynetTiledScale2D32f")
    shape = (batch, channels, h, w) if fmt == "nchw" else (batch, h, w, channels)
    x = with_specials(rng.normal(size=shape).astype(np.float32))
    ver = rng.normal(size=(channels, w) if fmt == "nchw" else (w, channels)).astype(np.float32)
    hor = rng.normal(size=(channels, h) if fmt == "nchw" else (h, channels)).astype(np.float32)
    want = poisoned(x.shape)
    for b in range(batch):
        c_call("SynetTiledScale2D32f", x[b], channels, h, w, FMT_CODE[fmt], ver, hor, want[b])
    assert_same_bits(tn.tiled_scale_2d(x, ver, hor, format=fmt), want, what=f"tiled_scale_2d batch {batch}")


# ---- many tiny items: one C call covers them all ----------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_channel_sum_million_items(rng, fmt):
    """A sum of one value is that value, exactly."""
    require("SynetChannelSum16b")
    x = rng.normal(size=(1 << 20, 1, 1)).astype(np.float32).astype(ref.BF16)
    y = tn.channel_sum(x, format=fmt)
    np.testing.assert_array_equal(y, x.astype(np.float32).reshape(-1, 1))


@pytest.mark.parametrize("fmt", FORMATS)
def test_channel_sum_many_small_items_exact(rng, fmt):
    """Small integers sum exactly in fp32, whatever the order."""
    require("SynetChannelSum16b")
    x = rng.integers(-100, 101, size=image_shape(1 << 16, 3, 5, fmt)).astype(np.float32).astype(ref.BF16)
    y = tn.channel_sum(x, format=fmt)
    np.testing.assert_array_equal(y, ref.synet_channel_sum_16b(ref.to_bcs(x, fmt)).astype(np.float32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_lrn_many_items(rng, fmt):
    """Each item is one value: y = x * (k0 + k1 * x^2)^k2 (tolerance as in test_lrn.py)."""
    require("SynetLrnLayerCrossChannels")
    x = rng.normal(size=(1 << 18, 1, 1)).astype(np.float32)
    k = np.float32([1.5, 0.1, -0.75])
    exact = x.astype(np.float64) * (1.5 + float(k[1]) * x.astype(np.float64) ** 2) ** -0.75
    assert_close(tn.lrn_cross_channels(x, 2, k, format=fmt), exact, rtol=1e-5, atol=1e-37, what=f"lrn {fmt}")


def test_shuffle_and_tiled_scale_many_items(rng):
    require("SynetShuffleLayerForward", "SynetTiledScale2D32f")
    n = 1 << 17
    x0, x1 = rng.normal(size=(n, 2, 1)).astype(np.float32), rng.normal(size=(n, 2, 1)).astype(np.float32)
    y0, y1 = tn.shuffle(x0, x1, type=0)
    np.testing.assert_array_equal(y0, np.stack([x0[:, 0], x1[:, 0]], axis=1))
    np.testing.assert_array_equal(y1, np.stack([x0[:, 1], x1[:, 1]], axis=1))
    x = rng.normal(size=(n, 1, 1, 1)).astype(np.float32)
    np.testing.assert_array_equal(tn.tiled_scale_2d(x, [[2.0]], [[0.5]]), x)  # scaling by powers of 2: exact
