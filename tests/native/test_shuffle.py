"""shuffle (seed 003: ShuffleLayerForward), type 0 (split even and odd channels of the
concatenation) and type 1 (interleave, then split at channels0): pure copies, so outputs
must be bit-identical to the reference, NaN payloads included."""

import math

import numpy as np
import pytest

import reference as ref
import tensorops_native as tn
from tn_testing import FORMATS, SPATIALS, assert_same_bits, call_preserving, image_shape, random_bits, require

TYPE0_PAIRS = [(2, 2), (2, 4), (8, 8), (16, 16), (16, 18), (30, 34), (64, 66), (0, 2), (6, 0)]
TYPE1_HALVES = (1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 64, 67)


def from_api(a, fmt):
    """(batch, channels, spatial) view of an API tensor, keeping the dtype (bits)."""
    b = a.shape[0]
    if fmt == "nchw":
        return a.reshape(b, a.shape[1], math.prod(a.shape[2:]))
    return np.moveaxis(a.reshape(b, math.prod(a.shape[1:-1]), a.shape[-1]), 2, 1)


def check(x0, x1, type_, fmt, channels=None):
    require("SynetShuffleLayerForward")
    y0, y1 = call_preserving(tn.shuffle, x0, x1, type=type_, format=fmt, channels=channels)
    c0, c1 = (x0.shape[1], x1.shape[1]) if fmt == "nchw" else (x0.shape[-1], x1.shape[-1])
    if type_ == 1:
        c0, c1 = channels if channels is not None else (c0, c0)
    e0, e1 = ref.synet_shuffle_layer_forward(
        from_api(x0, fmt).view(np.uint32), from_api(x1, fmt).view(np.uint32), c0, c1, type_
    )
    for y, e, name in ((y0, e0, "y0"), (y1, e1, "y1")):
        assert y.dtype == np.float32
        assert_same_bits(from_api(y, fmt).view(np.uint32), e, what=f"shuffle type {type_} {fmt} {name}")
    return y0, y1


@pytest.mark.parametrize("spatial", SPATIALS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("c0,c1", TYPE0_PAIRS)
def test_shuffle_split(rng, c0, c1, fmt, spatial):
    batch = 3 if (c0 + spatial) % 2 else 1
    x0 = random_bits(rng, image_shape(batch, c0, spatial, fmt))
    x1 = random_bits(rng, image_shape(batch, c1, spatial, fmt))
    y0, y1 = check(x0, x1, 0, fmt)
    half = (c0 + c1) // 2
    assert y0.shape == y1.shape == image_shape(batch, half, spatial, fmt)


def type1_channels(half, variant):
    if variant == "default":
        return None
    if variant == "unequal":
        return (half - 1, half + 1) if half % 2 else (half - 2, half + 2) if half >= 2 else (0, 2)
    return (0, 2 * half) if variant == "all-second" else (2 * half, 0)


# the default (equal halves) needs an even input channel count (odd ones: test_arguments)
TYPE1_CASES = [
    pytest.param(h, v, id=f"{h}-{v}")
    for h in TYPE1_HALVES
    for v in ("default", "unequal")
    if not (v == "default" and h % 2)
]


@pytest.mark.parametrize("spatial", [1, 5, 16, 49])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("half,variant", TYPE1_CASES)
def test_shuffle_interleave(rng, half, variant, fmt, spatial):
    channels = type1_channels(half, variant)
    batch = 3 if (half + spatial) % 2 else 1
    x0 = random_bits(rng, image_shape(batch, half, spatial, fmt))
    x1 = random_bits(rng, image_shape(batch, half, spatial, fmt))
    y0, y1 = check(x0, x1, 1, fmt, channels)
    c0, c1 = channels or (half, half)
    assert y0.shape == image_shape(batch, c0, spatial, fmt) and y1.shape == image_shape(batch, c1, spatial, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("variant", ["all-second", "all-first"])
def test_shuffle_interleave_empty_output(rng, fmt, variant):
    half = 5
    x0 = random_bits(rng, image_shape(2, half, 16, fmt))
    x1 = random_bits(rng, image_shape(2, half, 16, fmt))
    check(x0, x1, 1, fmt, type1_channels(half, variant))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("c0,c1,spatial", [(2, 4, 3136), (64, 66, 49), (16, 18, 1)])
def test_shuffle_round_trip(rng, fmt, c0, c1, spatial):
    """Type 1 with channels = (channels0, channels1) undoes type 0."""
    require("SynetShuffleLayerForward")
    x0 = random_bits(rng, image_shape(2, c0, spatial, fmt))
    x1 = random_bits(rng, image_shape(2, c1, spatial, fmt))
    y0, y1 = tn.shuffle(x0, x1, type=0, format=fmt)
    z0, z1 = tn.shuffle(y0, y1, type=1, format=fmt, channels=(c0, c1))
    assert_same_bits(z0, x0)
    assert_same_bits(z1, x1)


def test_shuffle_type_by_name(rng):
    require("SynetShuffleLayerForward")
    x0 = random_bits(rng, (2, 4, 5))
    x1 = random_bits(rng, (2, 6, 5))
    for a, b in zip(tn.shuffle(x0, x1, type="split"), tn.shuffle(x0, x1, type=0), strict=True):
        assert_same_bits(a, b)
