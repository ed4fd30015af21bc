"""Generic normalization (`normalize`) at the float32 extremes, against float64 NumPy.

Layer, instance and group norms through both kernels (rows: the reduced axes last; columns:
a reduced block followed by kept axes), FP32 and, where the values exist in them, FP16 and
BF16 inputs. The suite runs once per ISA level, so every level is checked.

- A constant row (or column) gives exactly 0 after centering when eps > 0: y = bias.
- eps = 0 on a constant row: a zero variance with eps = 0 gives a normalized value of 0
  (the limit eps -> 0+), so y = bias before the activation, at every level.
- Rows of huge (1e20, near -3.3e38) or tiny (1e-30 with eps = 0) values, whose exact results
  are of order 1, give those results within the bound of test_gnorm.check (the kernel
  scales such rows by a power of two, and eps with them).
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorops_native as tn
from test_gnorm import BF16, F16, as_f64, check, plan_of

FMAX = float(np.finfo(np.float32).max)

# (name, shape, normalize() keyword arguments, the kernel the plan must use)
LAYOUTS = [
    ("layer_rows", (3, 7), dict(axes=[-1]), True),
    ("layer_rows_197", (2, 197), dict(axes=[-1]), True),
    ("layer_rows_long", (2, 4100), dict(axes=[-1]), True),
    ("instance_rows", (2, 3, 4, 5), dict(axes=[2, 3]), True),
    ("group_rows", (2, 4, 3, 5), dict(axes=[2, 3], num_groups=2), True),
    ("layer_columns", (2, 7, 5), dict(axes=[1]), False),
    ("layer_columns_197", (2, 197, 3), dict(axes=[1]), False),
    ("instance_columns", (2, 9, 3, 17), dict(axes=[0, 1]), False),
]


def params(shape, rng):
    c = shape[1]
    s = rng.uniform(0.5, 2.0, size=(1, c) + (1,) * (len(shape) - 2)).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, size=(1, c) + (1,) * (len(shape) - 2)).astype(np.float32)
    return s, b


def expected_bias(shape, b):
    return np.broadcast_to(b.astype(np.float64), shape)


@pytest.mark.parametrize("name,shape,kwargs,rows", LAYOUTS, ids=[n for n, *_ in LAYOUTS])
@pytest.mark.parametrize("value", [-1700.0, 0.1, 1.0, 3.0e-39, -3.3e38, 1.0e20, 0.0])
@pytest.mark.parametrize("eps", [1e-5, 0.0])
def test_constant_rows_give_the_bias(rng, name, shape, kwargs, rows, value, eps):
    x = np.full(shape, value, np.float32)
    s, b = params(shape, rng)
    assert plan_of(x, s, b, kwargs).rows == rows
    y = tn.normalize(x, s, b, eps=eps, **kwargs)
    np.testing.assert_array_equal(as_f64(y), expected_bias(shape, b), err_msg=f"{name} {value} eps={eps}")
    # without parameters: exactly +0 (x - mean is exactly 0)
    z = tn.normalize(x, eps=eps, **kwargs)
    assert np.all(z.view(np.uint32) == 0), f"{name} {value} eps={eps}: {z.ravel()[:4]}"


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name,shape,kwargs,rows", LAYOUTS, ids=[n for n, *_ in LAYOUTS])
@pytest.mark.parametrize("eps", [1e-5, 0.0])
def test_constant_rows_16bit(rng, dtype, name, shape, kwargs, rows, eps):
    values = [-1700.0, 0.1, 3.0e-39 if dtype == BF16 else 6e-8, -3.3e38 if dtype == BF16 else -65504.0]
    s, b = params(shape, rng)
    for value in values:
        x = np.full(shape, value, np.float32).astype(dtype)
        y = tn.normalize(x, s, b, eps=eps, **kwargs)
        want = expected_bias(shape, b).astype(np.float32).astype(dtype)
        np.testing.assert_array_equal(as_f64(y), as_f64(want), err_msg=f"{name} {value} eps={eps}")


def test_eps_zero_rule_before_the_activation(rng):
    """y = act(bias) for a constant row with eps = 0 (sigmoid(0) = 0.5 without bias)."""
    x = np.full((4, 33), 0.1, np.float32)
    y = tn.normalize(x, axes=[-1], eps=0.0, activation="sigmoid")
    assert np.all(y == np.float32(0.5))
    b = np.full(33, -2.0, np.float32)
    y = tn.normalize(x, None, b, axes=[-1], eps=0.0, activation="relu")
    assert np.all(y.view(np.uint32) == 0)


def extreme_rows(rng, shape, kind):
    """Rows whose exact normalized values are of order 1."""
    base = rng.normal(size=shape)
    if kind == "1e20":
        return (1e20 * base).astype(np.float32)
    if kind == "1e20_offset":
        return (3e20 + 1e19 * base).astype(np.float32)
    if kind == "-3.3e38":
        return np.clip(-3.3e38 + 2e36 * base, -FMAX, FMAX).astype(np.float32)
    if kind == "+-3e38":
        return np.clip(3e38 * np.sign(base) * rng.uniform(0.5, 1.0, size=shape), -FMAX, FMAX).astype(np.float32)
    if kind == "1e-30":
        return (1e-30 * base).astype(np.float32)
    if kind == "1e-42":  # denormals
        return (1e-42 * np.round(base * 4)).astype(np.float32)
    raise AssertionError(kind)


KINDS = ["1e20", "1e20_offset", "-3.3e38", "+-3e38", "1e-30", "1e-42"]


@pytest.mark.parametrize("name,shape,kwargs,rows", LAYOUTS, ids=[n for n, *_ in LAYOUTS])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("eps", [1e-5, 0.0])
def test_extreme_magnitudes_fp32(rng, name, shape, kwargs, rows, kind, eps):
    x = extreme_rows(rng, shape, kind)
    s, b = params(shape, rng)
    for act in (None, "tanh"):
        y = tn.normalize(x, s, b, eps=eps, activation=act, **kwargs)
        assert np.all(np.isfinite(y)), f"{name} {kind} eps={eps}: non-finite results"
        check(
            y,
            x,
            s,
            b,
            kwargs["axes"],
            kwargs.get("num_groups", 1),
            eps=eps,
            activation=act,
            what=f"{name} {kind} eps={eps}",
        )


@pytest.mark.parametrize("name,shape,kwargs,rows", LAYOUTS, ids=[n for n, *_ in LAYOUTS])
@pytest.mark.parametrize("kind", ["1e20", "-3.3e38", "+-3e38", "1e-30"])
def test_extreme_magnitudes_bf16(rng, name, shape, kwargs, rows, kind):
    x = extreme_rows(rng, shape, kind).astype(BF16)
    s, b = params(shape, rng)
    y = tn.normalize(x, s, b, eps=0.0, **kwargs)
    assert np.all(np.isfinite(as_f64(y)))
    check(y, x, s, b, kwargs["axes"], kwargs.get("num_groups", 1), eps=0.0, what=f"{name} {kind}")


@pytest.mark.parametrize("name,shape,kwargs,rows", LAYOUTS, ids=[n for n, *_ in LAYOUTS])
def test_extreme_magnitudes_fp16(rng, name, shape, kwargs, rows):
    """FP16's own extremes: values near +-65504 (their squares overflow fp32 sums only for long
    rows, but the sums about the first value must stay exact) and denormals with eps = 0."""
    for x in (np.clip(6e4 * rng.normal(size=shape), -65504, 65504), 6e-8 * np.round(8 * rng.normal(size=shape))):
        x = x.astype(F16)
        s, b = params(shape, rng)
        y = tn.normalize(x, s, b, eps=0.0, **kwargs)
        assert np.all(np.isfinite(as_f64(y)))
        check(y, x, s, b, kwargs["axes"], kwargs.get("num_groups", 1), eps=0.0, what=name)


@pytest.mark.parametrize("name,shape,kwargs,rows", LAYOUTS, ids=[n for n, *_ in LAYOUTS])
def test_extreme_magnitudes_without_variance_normalization(rng, name, shape, kwargs, rows):
    """normalize_variance=False: y = x - mean, finite where the exact result is."""
    x = extreme_rows(rng, shape, "-3.3e38")
    y = tn.normalize(x, eps=0.0, normalize_variance=False, **kwargs)
    assert np.all(np.isfinite(y))
    check(y, x, None, None, kwargs["axes"], kwargs.get("num_groups", 1), eps=0.0, normalize_variance=False)


def test_mixed_rows_keep_their_own_path(rng):
    """An extreme row next to ordinary ones: each row is right (the slow path is per row, per
    column position)."""
    for shape, kwargs in (((5, 40), dict(axes=[-1])), ((2, 40, 5), dict(axes=[1]))):
        x = rng.normal(size=shape).astype(np.float32)
        x[1] *= np.float32(1e20)
        x[-1] = 0.25
        y = tn.normalize(x, eps=0.0, **kwargs)
        assert np.all(np.isfinite(y))
        ok = np.ones(shape[0], bool)
        ok[-1] = False
        check(y[ok], x[ok], None, None, kwargs["axes"], eps=0.0)
        assert np.all(y[-1] == 0.0)


def test_shifted_mean_is_accurate_for_offset_rows(rng):
    """Rows with |mean| >> std: the sums about the first value keep the centered values
    accurate, where a plain sum loses them."""
    x = (1000.0 + 1e-3 * rng.normal(size=(4, 768))).astype(np.float32)
    check(tn.normalize(x, axes=[-1], eps=0.0), x, None, None, [-1], eps=0.0)
    x[:, 0] = 1010.0  # a first value far from the mean: the second pass about the mean
    check(tn.normalize(x, axes=[-1], eps=0.0), x, None, None, [-1], eps=0.0)
