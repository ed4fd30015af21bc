"""tiled_scale_2d (seed 003: TiledScale2D32f per batch item): y = x * ver * hor with ver
indexed by (channel, column) and hor by (channel, row), both formats, channels x spatial grid.

Tolerance: two fp32 multiplications round twice: |error| <= 2u(1 + u) |y|, rtol = 2.5u.
"""

import numpy as np
import pytest

import reference as ref
import tensorops_native as tn
from tn_testing import (
    CHANNELS,
    F32_TINY,
    FORMATS,
    SPATIALS,
    Guarded,
    U,
    assert_close,
    assert_same_bits,
    c_call,
    call_preserving,
    checkerboard_batch,
    f32,
    require,
)

HW = {1: (1, 1), 5: (1, 5), 16: (4, 4), 49: (7, 7), 3136: (56, 56)}
GRID = [
    pytest.param(c, s, checkerboard_batch(i, j), id=f"c{c}-s{s}-b{checkerboard_batch(i, j)}")
    for i, c in enumerate(CHANNELS)
    for j, s in enumerate(SPATIALS)
]


def make(rng, batch, channels, h, w, fmt):
    if fmt == "nchw":
        shape, vshape, hshape = (batch, channels, h, w), (channels, w), (channels, h)
    else:
        shape, vshape, hshape = (batch, h, w, channels), (w, channels), (h, channels)
    return f32(rng, shape), f32(rng, vshape, loc=1.0, scale=0.5), f32(rng, hshape, loc=1.0, scale=0.5)


def check(x, ver, hor, fmt):
    require("SynetTiledScale2D32f")
    y = call_preserving(tn.tiled_scale_2d, x, ver, hor, format=fmt)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert_close(
        y, ref.synet_tiled_scale_2d_32f(x, ver, hor, fmt), rtol=2.5 * U, atol=F32_TINY, what=f"tiled_scale_2d {fmt}"
    )
    return y


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels,spatial,batch", GRID)
def test_tiled_scale_2d(rng, fmt, channels, spatial, batch):
    check(*make(rng, batch, channels, *HW[spatial], fmt), fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("h,w", [(5, 1), (3, 17), (17, 3), (2, 33), (3, 8), (5, 12), (40, 9), (2, 15), (4, 16)])
def test_tiled_scale_2d_non_square(rng, fmt, h, w):
    """Widths below one vector of 16 take the permuted-factor path in NCHW, at every level;
    16 and wider stream the rows, a vector straddling two rows (or two channels)."""
    check(*make(rng, 2, 7, h, w, fmt), fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_tiled_scale_2d_nan_inf(rng, fmt):
    x, ver, hor = make(rng, 1, 17, 4, 5, fmt)
    x.reshape(-1)[[0, 9, 30]] = [np.nan, np.inf, -np.inf]
    ver.reshape(-1)[3] = 0.0
    check(x, ver, hor, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("channels,h,w", [(1, 1, 1), (3, 7, 7), (17, 4, 4), (67, 5, 3)])
def test_tiled_scale_2d_in_place(rng, fmt, channels, h, w):
    """The seed allows dst == src: the C function in place gives the out-of-place result."""
    require("SynetTiledScale2D32f")
    x, ver, hor = make(rng, 1, channels, h, w, fmt)
    want = tn.tiled_scale_2d(x, ver, hor, format=fmt)
    buf = Guarded(x[0])
    c_call("SynetTiledScale2D32f", buf, channels, h, w, {"nchw": 0, "nhwc": 1}[fmt], ver, hor, buf)
    buf.assert_guards("in-place tiled_scale_2d")
    assert_same_bits(buf.arr, want[0])
