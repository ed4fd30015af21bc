"""channel_sum (seed 003: ChannelSum16b per batch item): fp32 sums of a BF16 tensor per
channel, both formats, the full channels x spatial grid.

Tolerance: the sum is accumulated in fp32; its error relative to the sum of magnitudes is
below sum_rtol(spatial) (see tn_testing), plus 8u for the final reductions of vector lanes.
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
    assert_close,
    assert_same_bits,
    bf16,
    call_preserving,
    checkerboard_batch,
    image_shape,
    require,
    sum_rtol,
)

GRID = [
    pytest.param(c, s, checkerboard_batch(i, j), id=f"c{c}-s{s}-b{checkerboard_batch(i, j)}")
    for i, c in enumerate(CHANNELS)
    for j, s in enumerate(SPATIALS)
]


def check(x, fmt):
    require("SynetChannelSum16b")
    batch, channels, spatial = ref.to_bcs(x, fmt).shape
    y = call_preserving(tn.channel_sum, x, format=fmt)
    assert y.dtype == np.float32 and y.shape == (batch, channels)
    xb = ref.to_bcs(x, fmt)
    exact = ref.synet_channel_sum_16b(xb)
    with np.errstate(invalid="ignore"):
        magnitude = np.abs(xb).sum(axis=2)
    assert_close(
        y,
        exact,
        rtol=0.0,
        atol=(8 * U + sum_rtol(spatial)) * np.nan_to_num(magnitude, posinf=0.0),
        what=f"channel_sum {fmt}",
    )
    return y


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels,spatial,batch", GRID)
def test_channel_sum(rng, fmt, channels, spatial, batch):
    check(bf16(rng, image_shape(batch, channels, spatial, fmt), loc=0.5), fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_channel_sum_exact_for_small_integers(rng, fmt):
    """Integers of BF16 sum exactly in fp32 (below 2^24): no tolerance needed."""
    require("SynetChannelSum16b")
    shape = image_shape(3, 33, 3136, fmt)
    x = rng.integers(-100, 101, size=shape).astype(np.float32).astype(ref.BF16)
    y = tn.channel_sum(x, format=fmt)
    np.testing.assert_array_equal(y, ref.synet_channel_sum_16b(ref.to_bcs(x, fmt)).astype(np.float32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_channel_sum_uint16_bits(rng, fmt):
    require("SynetChannelSum16b")
    x = bf16(rng, image_shape(2, 17, 49, fmt))
    y = call_preserving(tn.channel_sum, x.view(np.uint16), format=fmt)
    assert y.dtype == np.float32
    assert_same_bits(y, tn.channel_sum(x, format=fmt))


@pytest.mark.parametrize("fmt", FORMATS)
def test_channel_sum_nan_inf(rng, fmt):
    x = bf16(rng, image_shape(2, 17, 16, fmt))
    bits = x.view(np.uint16).reshape(-1)
    bits[0], bits[50], bits[51], bits[-1] = 0x7FC0, 0x7F80, 0xFF80, 0x7F80
    check(x, fmt)
