"""unary (seed 003: UnaryOperation32f), all 17 operations, against the accuracy rules of
docs/kernels.md measured over more than a million inputs per op (random bit patterns, log-uniform
magnitudes over the whole fp32 range, the op's meaningful ranges) plus the special values
(+0, -0, +inf, -inf, NaN, 1e-45, FLT_MAX, -FLT_MAX, ties of rounding...), float64 NumPy
(math.erf for ERF) as the reference. The rules and the input mix live in tn_testing.
"""

import numpy as np
import pytest

import reference as ref
import tensorops_native as tn
from tn_testing import (
    CHANNELS,
    EXACT_OPS,
    F32_MAX,
    UNARY_BOUNDS,
    UNARY_OPS,
    assert_same_bits,
    assert_unary_accurate,
    call_preserving,
    require,
    unary_inputs,
)

KERNEL = "SynetUnaryOperation32f"


@pytest.mark.parametrize("op", UNARY_OPS)
def test_unary_accuracy_over_a_million_inputs(rng, op):
    require(KERNEL)
    x = unary_inputs(op, rng)
    assert x.size > 1_000_000
    y = call_preserving(tn.unary, x, op)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert_unary_accurate(op, x, y)


@pytest.mark.parametrize("op", UNARY_OPS)
def test_unary_sizes_and_misaligned_tails(rng, op):
    """Every size of the channel list, starting 1 to 3 floats past an aligned address (the
    kernel must use unaligned loads and handle the tail) and a 2-D shape."""
    require(KERNEL)
    pool = unary_inputs(op, rng, n=1 << 12)
    for i, n in enumerate(CHANNELS + (3136,)):
        off = 1 + i % 3
        x = pool[off : off + n] if n + off <= pool.size else np.resize(pool, n)
        y = tn.unary(x, op)
        assert_unary_accurate(op, x, y, what=f"{op} size {n} offset {off}")
    x2 = pool[: 17 * 33].reshape(17, 33)
    y2 = tn.unary(x2, op)
    assert y2.shape == (17, 33)
    assert_same_bits(y2.ravel(), tn.unary(x2.ravel(), op))


@pytest.mark.parametrize("op", [o for o in UNARY_OPS if o not in ("zero", "not")])
def test_unary_nan_in_gives_nan_out(op):
    require(KERNEL)
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7FC0DEAD, 0x7F800001, 0xFFBFFFFF, 0x7FFFFFFF], np.uint32)
    x = np.resize(nans, 37).view(np.float32)
    y = tn.unary(x, op)
    assert np.isnan(y).all(), f"{op}: NaN input gave {y[~np.isnan(y)][:4]}"


def test_unary_zero_and_not_of_nan():
    require(KERNEL)
    x = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0x00000000, 0x80000000], np.uint32).view(np.float32)
    assert (tn.unary(x, "zero").view(np.uint32) == 0).all()
    assert_same_bits(tn.unary(x, "not").view(np.uint32), ~x.view(np.uint32))


# (op, input, expected) with expected compared bit for bit (NaN: any NaN)
SPECIAL_CASES = [
    ("exp", -np.inf, 0.0),
    ("exp", np.inf, np.inf),
    ("exp", 0.0, 1.0),
    ("exp", -0.0, 1.0),
    ("exp", 89.0, np.inf),
    ("exp", -104.0, 0.0),
    ("exp", F32_MAX, np.inf),
    ("exp", -F32_MAX, 0.0),
    ("log", 0.0, -np.inf),
    ("log", -0.0, -np.inf),
    ("log", -1.0, np.nan),
    ("log", np.inf, np.inf),
    ("log", 1.0, 0.0),
    ("log", -np.inf, np.nan),
    ("rsqrt", 0.0, np.inf),
    ("rsqrt", np.inf, 0.0),
    ("rsqrt", -1.0, np.nan),
    ("rsqrt", 4.0, 0.5),
    ("sqrt", -0.0, -0.0),
    ("sqrt", -1.0, np.nan),
    ("sqrt", np.inf, np.inf),
    ("sqrt", 1e-45, float(np.sqrt(np.float32(1e-45)))),
    ("rcp", 0.0, np.inf),
    ("rcp", -0.0, -np.inf),
    ("rcp", np.inf, 0.0),
    ("rcp", -np.inf, -0.0),
    ("rcp", 1e-45, np.inf),
    ("tanh", np.inf, 1.0),
    ("tanh", -np.inf, -1.0),
    ("tanh", 0.0, 0.0),
    ("tanh", 20.0, 1.0),
    ("erf", np.inf, 1.0),
    ("erf", -np.inf, -1.0),
    ("erf", 0.0, 0.0),
    ("erf", 10.0, 1.0),
    ("sin", np.inf, np.nan),
    ("sin", -np.inf, np.nan),
    ("sin", 0.0, 0.0),
    ("cos", np.inf, np.nan),
    ("cos", 0.0, 1.0),
    ("round", 0.5, 0.0),
    ("round", 1.5, 2.0),
    ("round", 2.5, 2.0),
    ("round", -2.5, -2.0),
    ("round", -0.5, -0.0),
    ("round", 8388609.0, 8388609.0),
    ("round", 8388607.5, 8388608.0),
    ("round", F32_MAX, F32_MAX),
    ("round", np.inf, np.inf),
    ("round", 1e-45, 0.0),
    ("ceil", -0.5, -0.0),
    ("ceil", 0.2, 1.0),
    ("ceil", -F32_MAX, -F32_MAX),
    ("ceil", 1e-45, 1.0),
    ("floor", -0.5, -1.0),
    ("floor", 0.7, 0.0),
    ("floor", -1e-45, -1.0),
    ("floor", np.inf, np.inf),
    ("sign", -0.0, 0.0),
    ("sign", 0.0, 0.0),
    ("sign", 1e-45, 1.0),
    ("sign", -1e-45, -1.0),
    ("sign", -np.inf, -1.0),
    ("sign", F32_MAX, 1.0),
    ("abs", -0.0, 0.0),
    ("abs", -np.inf, np.inf),
    ("neg", 0.0, -0.0),
    ("neg", -F32_MAX, F32_MAX),
    ("zero", -np.inf, 0.0),
    ("zero", np.nan, 0.0),
]


@pytest.mark.parametrize("op,x,expected", SPECIAL_CASES, ids=[f"{o}({x})" for o, x, _ in SPECIAL_CASES])
def test_unary_special_values(op, x, expected):
    """Exact where docs/kernels.md makes them exact: the exact ops, infinities, NaN, and the
    saturated values of the approximate ops at +-inf and +-FLT_MAX; elsewhere the
    approximate ops are held to their accuracy bound."""
    require(KERNEL)
    xs = np.full(19, x, np.float32)  # 19: a vector and a tail
    y = tn.unary(xs, op)
    if np.isnan(expected):
        assert np.isnan(y).all(), f"{op}({x}) = {y[0]}, expected NaN"
    elif op == "sign":
        assert (y == expected).all(), f"{op}({x}) = {y[0]}, expected {expected}"
    elif op in UNARY_BOUNDS and np.isfinite(expected) and abs(x) < F32_MAX:
        assert_unary_accurate(op, xs, y, what=f"{op}({x})")
    else:
        want = np.full(19, expected, np.float32)
        assert_same_bits(y, want, what=f"{op}({x})")


def test_unary_exp_underflows_through_denormals():
    """exp goes gradually to 0 through the denormals (no flush to zero, no garbage)."""
    require(KERNEL)
    x = np.linspace(-87.0, -104.0, 4097, dtype=np.float32)
    y = tn.unary(x, "exp")
    assert_unary_accurate("exp", x, y)
    assert (np.diff(y.astype(np.float64)) <= 0).all() and y[0] > 1e-38 and 0 < y[-200] < 1e-38


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_unary_sin_cos_accurate_and_in_range_for_huge_inputs(rng, op):
    """The accuracy bound holds for every finite float (exact argument reduction beyond
    2^17; more in test_unary_extremes.py), and the result stays in [-1, 1]."""
    require(KERNEL)
    x = (np.exp2(rng.uniform(16.6, 128.0, 1 << 16)) * rng.choice([-1.0, 1.0], 1 << 16)).astype(np.float32)
    x = np.concatenate([x[np.isfinite(x)], np.float32([F32_MAX, -F32_MAX, 1e5, 3e38])])
    y = tn.unary(x, op)
    assert np.isfinite(y).all() and (np.abs(y) <= 1.0).all(), (
        f"{op}: {x[~(np.abs(y) <= 1.0)][:4]} -> {y[~(np.abs(y) <= 1.0)][:4]}"
    )
    assert_unary_accurate(op, x, y)


def test_unary_op_by_enum_value_and_case(rng):
    require(KERNEL)
    x = unary_inputs("exp", rng, n=1 << 10)
    for value, name in enumerate(UNARY_OPS):
        want = tn.unary(x, name)
        assert_same_bits(tn.unary(x, value), want, what=f"op {value}")
        assert_same_bits(tn.unary(x, name.upper()), want, what=f"op {name.upper()}")


@pytest.mark.parametrize("op", EXACT_OPS)
def test_unary_exact_ops_do_not_depend_on_position(rng, op):
    """An element's result does not depend on where it sits (vector body or tail)."""
    require(KERNEL)
    x = unary_inputs(op, rng, n=1 << 10)[:1000]
    whole = tn.unary(x, op)
    for start in (0, 1, 5, 13, 16, 17):
        assert_same_bits(tn.unary(x[start : start + 37], op), whole[start : start + 37], what=f"{op} from {start}")


def test_reference_rounding_table_is_numpy_rint():
    """The ROUND reference is numpy.rint (ties to even) over the whole float range."""
    x = np.float32([0.5, 1.5, 2.5, -0.5, -1.5, 4194304.5, 8388607.5, 1e10])
    np.testing.assert_array_equal(ref.synet_unary_operation_32f(x, "round"), np.rint(x.astype(np.float64)))
