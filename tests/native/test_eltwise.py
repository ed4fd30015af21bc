"""eltwise (seed 003: EltwiseLayerForward): product, weighted sum, max and min of 2 to 5
fp32 inputs, sizes around the vector widths and tails.

Tolerances (u = 2^-24): product: each of the count - 1 multiplications rounds once,
rtol = count * u. Sum: each product and addition rounds once (an FMA rounds less), so the
absolute error is below 2 * count * u * sum_i |w_i * x_i|. Max and min are exact (one of the
inputs), and propagate NaN (docs/kernels.md).
"""

import numpy as np
import pytest

import reference as ref
import tensorops_native as tn
from tn_testing import F32_TINY, U, assert_close, assert_same_bits, call_preserving, require

OPS = {"product": ref.ELTWISE_PRODUCT, "sum": ref.ELTWISE_SUM, "max": ref.ELTWISE_MAX, "min": ref.ELTWISE_MIN}
SIZES = (1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 64, 67, 3136, 3 * 3136 + 5)


def shape_of(size):
    # a few multi-dimensional shapes: only the element count matters to the kernel
    return {3136: (1, 16, 14, 14), 64: (4, 16), 67: (67, 1)}.get(size, (size,))


def check(op, inputs, weights=None, default_weights=False):
    require("SynetEltwiseLayerForward")
    n = len(inputs)
    if op == "sum" and default_weights:
        y = call_preserving(tn.eltwise, inputs, op)
        weights = np.ones(n, np.float32)
    else:
        y = call_preserving(tn.eltwise, inputs, op, weights=weights)
    assert y.dtype == np.float32 and y.shape == inputs[0].shape
    exact = ref.synet_eltwise_layer_forward(inputs, weights, OPS[op])
    if op == "product":
        assert_close(y, exact, rtol=n * U, atol=F32_TINY, what=f"eltwise product of {n}")
    elif op == "sum":
        with np.errstate(invalid="ignore", over="ignore"):
            magnitude = sum(np.abs(a.astype(np.float64) * float(w)) for a, w in zip(inputs, weights, strict=True))
        assert_close(
            y,
            exact,
            rtol=0.0,
            atol=2 * n * U * np.nan_to_num(magnitude, posinf=0.0) + F32_TINY,
            what=f"eltwise sum of {n}",
        )
    else:
        assert_close(y, exact, rtol=0.0, atol=0.0, what=f"eltwise {op} of {n}")
    return y


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("count", [2, 3, 4, 5])
@pytest.mark.parametrize("op", list(OPS))
def test_eltwise(rng, op, count, size):
    inputs = [rng.normal(size=shape_of(size)).astype(np.float32) for _ in range(count)]
    weights = rng.uniform(-2.0, 2.0, count).astype(np.float32) if op == "sum" else None
    check(op, inputs, weights)


@pytest.mark.parametrize("count", [2, 3, 5])
def test_eltwise_sum_default_weights_are_ones(rng, count):
    inputs = [rng.normal(size=(3, 33)).astype(np.float32) for _ in range(count)]
    y = check("sum", inputs, default_weights=True)
    assert_same_bits(y, tn.eltwise(inputs, "sum", weights=[1.0] * count))


def test_eltwise_op_by_enum_value(rng):
    require("SynetEltwiseLayerForward")
    inputs = [rng.normal(size=17).astype(np.float32) for _ in range(3)]
    for name, value in OPS.items():
        assert_same_bits(tn.eltwise(inputs, value), tn.eltwise(inputs, name))


@pytest.mark.parametrize("size", [1, 7, 16, 17, 67])
@pytest.mark.parametrize("op", ["max", "min"])
def test_eltwise_max_min_propagate_nan(rng, op, size):
    """NaN in any input, at any position (first input, second, last, several), gives NaN,
    whatever the other values (including +-inf)."""
    count = 4
    inputs = [rng.normal(size=size).astype(np.float32) for _ in range(count)]
    marks = {}
    for k, j in enumerate(rng.permutation(size)[: min(size, 6)]):
        which = [0, 1, count - 1, 2, 0, 1][k]
        inputs[which][j] = np.nan
        marks[int(j)] = which
        other = (which + 1) % count
        inputs[other][j] = np.inf if op == "max" else -np.inf
    y = check(op, inputs)
    for j in marks:
        assert np.isnan(y[j]), f"{op}: NaN in inputs[{marks[j]}] at {j} was dropped"


@pytest.mark.parametrize("op", list(OPS))
def test_eltwise_infinities(rng, op):
    inputs = [rng.normal(size=33).astype(np.float32) for _ in range(3)]
    inputs[0][:4] = [np.inf, -np.inf, np.inf, 0.0]
    inputs[1][:4] = [-np.inf, -np.inf, 0.0, np.inf]
    check(op, inputs, rng.uniform(0.5, 2, 3).astype(np.float32) if op == "sum" else None)


@pytest.mark.parametrize("op", list(OPS))
def test_eltwise_inputs_may_alias(rng, op):
    """The same array given several times."""
    a = rng.normal(size=67).astype(np.float32)
    b = rng.normal(size=67).astype(np.float32)
    check(op, [a, a, b, a], np.float32([0.5, -1, 2, 0.25]) if op == "sum" else None)
