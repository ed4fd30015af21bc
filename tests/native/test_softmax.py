"""softmax (seed 003: Softmax32f, Softmax16b) against the float64 reference: every count of
the channel list, with the softmax axis first, in the middle and last, inner == 1 and
inner > 1, count == 1, and the special rows of docs/kernels.md.

Tolerance per element (fp32, u = 2^-24): the kernel computes exp(fl(x - max)), and fl(x -
max) carries an absolute error up to u * |x - max|, which exp turns into that relative
error; exp itself is within 4e-7 (docs/kernels.md), the division adds u, and the row sum an
error of sum_rtol(count). rtol = 16u + u * |x - max| + sum_rtol(count); atol = 8 fp32
denormal steps (results that underflow into the denormal range lose relative accuracy).
BF16 takes its own cheaper exp (relative error up to BF16_EXP_RTOL, docs/kernels.md), which
enters each element and its row sum: rtol grows by 2 * BF16_EXP_RTOL. Results are
bit-exact against the exact result rounded to fp32 then BF16, except where that fp32
tolerance reaches a rounding boundary (there within 1 BF16 ulp).
"""

import numpy as np
import pytest

import reference as ref
import tensorops_native as tn
from tn_testing import (
    CHANNELS,
    F32_TINY,
    U,
    assert_bf16_where_math_allows,
    assert_close,
    assert_same_bits,
    call_preserving,
    require,
    sum_rtol,
)

INNER_DIMS = {1: (1,), 5: (5,), 16: (4, 4), 49: (7, 7)}
LAYOUTS = ["last-outer1", "last-outer3"] + [f"{where}-inner{i}" for where in ("first", "middle") for i in INNER_DIMS]


def case(count, layout):
    """(shape, axis) for a count and a layout name."""
    if layout == "last-outer1":
        return (count,), -1
    if layout == "last-outer3":
        return (3, count), 1
    where, inner = layout.split("-inner")
    dims = INNER_DIMS[int(inner)]
    if where == "first":
        return (count, *dims), 0
    return (3, count, *dims), -1 - len(dims)


CASES = [pytest.param(*case(c, layout), id=f"count{c}-{layout}") for c in CHANNELS for layout in LAYOUTS]
LARGE_CASES = [
    pytest.param((2, 3136), -1, id="count3136-last"),
    pytest.param((1, 67, 56, 56), 1, id="count67-inner3136"),
    pytest.param((3136, 33), 0, id="count3136-first-inner33"),
]


def split(shape, axis):
    axis %= len(shape)
    return int(np.prod(shape[:axis])), shape[axis], int(np.prod(shape[axis + 1 :]))


BF16_EXP_RTOL = 7.5e-5  # the BF16 exp's bound, docs/kernels.md (Softmax)


def tolerance(x64, shape, axis, exp_rtol=0.0):
    """Elementwise rtol (see the module docstring) for inputs x64 (float64, API shape)."""
    outer, count, inner = split(shape, axis)
    x3 = x64.reshape(outer, count, inner)
    with np.errstate(invalid="ignore"):
        dist = np.nan_to_num(np.abs(x3 - x3.max(axis=1, keepdims=True)), nan=0.0, posinf=0.0)
    return (16 * U + 2 * exp_rtol + U * dist + sum_rtol(count)).reshape(shape)


def exact_softmax(x64, shape, axis):
    return ref.synet_softmax_32f(x64, *split(shape, axis)).reshape(shape)


def check_f32(x, axis):
    require("SynetSoftmax32f")
    y = call_preserving(tn.softmax, x, axis=axis)
    assert y.dtype == np.float32 and y.shape == x.shape
    x64 = x.astype(np.float64)
    assert_close(
        y,
        exact_softmax(x64, x.shape, axis),
        rtol=tolerance(x64, x.shape, axis),
        atol=8 * F32_TINY,
        what=f"softmax fp32 shape {x.shape} axis {axis}",
    )
    return y


def check_bf16(x, axis):
    require("SynetSoftmax16b")
    y = call_preserving(tn.softmax, x, axis=axis)
    assert y.dtype == x.dtype and y.shape == x.shape
    x64 = ref.as_f64(x)
    assert_bf16_where_math_allows(
        y,
        exact_softmax(x64, x.shape, axis),
        rtol=tolerance(x64, x.shape, axis, BF16_EXP_RTOL),
        atol=8 * F32_TINY,
        what=f"softmax BF16 shape {x.shape} axis {axis}",
        min_exact=0.75,
    )  # the exp's 7.5e-5 makes about 8% of results ambiguous
    return y


@pytest.mark.parametrize("shape,axis", CASES + LARGE_CASES)
def test_softmax_f32(rng, shape, axis):
    check_f32((rng.normal(size=shape) * 4).astype(np.float32), axis)


@pytest.mark.parametrize("shape,axis", CASES + LARGE_CASES)
def test_softmax_bf16(rng, shape, axis):
    check_bf16((rng.normal(size=shape) * 4).astype(np.float32).astype(ref.BF16), axis)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("shape,axis", [((7, 67), -1), ((3, 33, 5), 1), ((17, 16), 0)])
def test_softmax_wide_range_underflows_gracefully(rng, dtype, shape, axis):
    """Spread 30: many terms underflow to denormals or zero; no NaN, sums stay right."""
    x = (rng.normal(size=shape) * 30).astype(np.float32)
    y = check_f32(x, axis) if dtype == "f32" else check_bf16(x.astype(ref.BF16), axis)
    assert not np.isnan(ref.as_f64(y)).any()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_softmax_shift_invariance_on_huge_values(dtype):
    """Max-subtracted: inputs near FLT_MAX (the exp of which overflows) are fine."""
    x = np.array([[3.0e38, 3.0e38 - 2.0e31, 1.0], [-3.0e38, -3.0e38, -3.0e38]], np.float32)
    exact = exact_softmax(x.astype(np.float64), x.shape, -1)
    if dtype == "f32":
        check_f32(x, -1)
    else:
        xb = x.astype(ref.BF16)
        check_bf16(xb, -1)
        exact = exact_softmax(ref.as_f64(xb), x.shape, -1)
    assert np.isfinite(exact).all()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("count,inner", [(1, 1), (1, 16), (7, 1), (16, 1), (33, 5), (17, 17)])
def test_softmax_special_rows(rng, dtype, count, inner):
    """docs/kernels.md: all -inf rows give NaN; rows with +inf or NaN give NaN; -inf entries of
    an otherwise finite row give 0; other rows are unaffected."""
    x = (rng.normal(size=(6, count, inner)) * 3).astype(np.float32)
    pos = rng.integers(0, count, size=inner)
    cols = np.arange(inner)
    x[0] = -np.inf
    x[1, pos, cols] = np.inf
    x[2, pos, cols] = np.nan
    x[3, pos, cols] = -np.inf  # row 3 stays finite unless count == 1
    x[4, pos, cols] = np.inf
    x[4, (pos + 1) % count, cols] = -np.inf
    y = check_f32(x, 1).astype(np.float64) if dtype == "f32" else ref.as_f64(check_bf16(x.astype(ref.BF16), 1))
    assert np.isnan(y[:3]).all() and np.isnan(y[4]).all()
    if count > 1:
        assert (y[3, pos, cols] == 0).all() and np.isfinite(y[3]).all()
    assert np.isfinite(y[5]).all()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("shape,axis", [((5, 1), -1), ((4, 1, 17), 1), ((1, 33), 0), ((1,), 0)])
def test_softmax_count_one_is_exactly_one(rng, dtype, shape, axis):
    x = (rng.normal(size=shape) * 1e30).astype(np.float32)
    if dtype == "f32":
        require("SynetSoftmax32f")
        y = tn.softmax(x, axis=axis)
        assert (y == 1.0).all()
    else:
        require("SynetSoftmax16b")
        y = tn.softmax(x.astype(ref.BF16), axis=axis)
        assert (y.view(np.uint16) == 0x3F80).all()


def test_softmax_axis_aliases_agree(rng):
    require("SynetSoftmax32f")
    x = rng.normal(size=(3, 17, 5)).astype(np.float32)
    assert_same_bits(tn.softmax(x, axis=1), tn.softmax(x, axis=-2))
    assert_same_bits(tn.softmax(x), tn.softmax(x, axis=2))


def test_softmax_uint16_bits_give_uint16(rng):
    require("SynetSoftmax16b")
    x = (rng.normal(size=(3, 33, 5)) * 4).astype(np.float32).astype(ref.BF16)
    y16 = call_preserving(tn.softmax, x.view(np.uint16), axis=1)
    assert y16.dtype == np.uint16
    assert_same_bits(y16, tn.softmax(x, axis=1).view(np.uint16))


def test_softmax_bf16_rows_sum_to_one(rng):
    """A sanity check independent of the reference: BF16 probabilities sum to 1 within the
    rounding of count BF16 values (2^-8 relative each)."""
    require("SynetSoftmax16b")
    x = (rng.normal(size=(64, 67)) * 2).astype(np.float32).astype(ref.BF16)
    s = ref.as_f64(tn.softmax(x)).sum(axis=-1)
    np.testing.assert_allclose(s, 1.0, atol=2.0**-8)


def bf16_ulps(y, exact):
    """|y - exact| in BF16 ulps of exact (denormals: the fixed step 2^-133)."""
    got = ref.bf16_to_f64(ref.bf16_bits(y))
    mag = np.maximum(np.abs(exact), 2.0**-126)
    return np.abs(got - exact) / 2.0 ** (np.floor(np.log2(mag)) - 7)


@pytest.mark.parametrize("scale", [0.5, 4.0, 30.0, 300.0])
def test_softmax_bf16_within_one_ulp(rng, scale):
    """The documented BF16 bound: every result within 1 BF16 ulp of the exact softmax (in
    practice within 0.5 ulp plus the exp's error, so only results next to a rounding tie
    differ from the correctly rounded value). Rows of every tail length 1..16 beside full
    vectors, ties (integer inputs), and wide rows whose small results are BF16 denormals."""
    require("SynetSoftmax16b")
    counts = list(range(1, 34)) + [197, 256, 300]
    worst = 0.0
    for count in counts:
        x = rng.normal(size=(48, count)) * scale
        x[:8] = np.round(x[:8] / 4)  # ties: few distinct values per row
        xb = x.astype(np.float32).astype(ref.BF16)
        y = tn.softmax(xb, axis=1)
        exact = exact_softmax(ref.as_f64(xb), xb.shape, 1)
        worst = max(worst, float(bf16_ulps(y, exact).max()))
    assert worst <= 1.0, f"BF16 softmax off by {worst} ulp"


def test_softmax_bf16_denormal_results_within_one_ulp():
    """Results that land in BF16's denormal range (down to 2^-133) and below."""
    require("SynetSoftmax16b")
    d = np.arange(0.0, 105.0, 0.375)
    x = np.zeros((3, d.size + 1))
    x[0, 1:] = -d
    x[1, 1:] = -d[::-1] + 20.0
    x[2, 1:] = np.linspace(-110.0, 0.0, d.size)
    xb = x.astype(np.float32).astype(ref.BF16)
    y = tn.softmax(xb, axis=1)
    exact = exact_softmax(ref.as_f64(xb), xb.shape, 1)
    assert (ref.as_f64(y)[exact < 2.0**-126] > 0).any()  # denormal results are produced
    assert bf16_ulps(y, exact).max() <= 1.0
