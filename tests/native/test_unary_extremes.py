"""unary at the float32 extremes (issue 12), against float64 NumPy at every ISA level:

- sin and cos over the whole float32 range (the exact argument reduction beyond 2^17):
  listed large values, random magnitudes up to FLT_MAX, every binade, the floats nearest
  to multiples of pi/2 (where the reduced argument is tiny);
- exp through the underflow range, where results are denormal (made as integers, no
  denormal arithmetic): within the bound plus half a denormal step;
- every math op bit-identical across the three levels on these inputs.
"""

import numpy as np
import pytest

import tensorops_native as tn
from tn_testing import F32_MAX, F32_TINY, assert_same_bits, require

KERNEL = "SynetUnaryOperation32f"
SINCOS_ABS = 2e-6  # docs/kernels.md, every finite x

LARGE = np.float32(
    [
        2421170506825728.0,
        1e5,
        131072.0,
        131072.01,
        2e5,
        1e6,
        4e6,
        16777216.0,
        1e7,
        1e8,
        1e9,
        1e10,
        1e12,
        1e15,
        1e20,
        1e25,
        1e30,
        1e35,
        1e38,
        3e38,
        3.4e38,
        F32_MAX,
        2.0**100,
        2.0**127,
        1.2e31,
        8.7e37,
    ]
)


# Floats whose sine is closest to 0 in their stretch of binades (found by a sweep over every
# float from 2^16 up): the reduced argument is as small as it gets for float32.
HARDEST = np.float32(
    [
        210065.734375,
        63885804.0,
        14752201728.0,
        3045577981952.0,
        809954126594048.0,
        2.8789536870262374e17,
        6.573585957505309e19,
        1.6971221846494808e22,
        2.5976405245006593e24,
        7.421093412453546e26,
        3.0916715677811608e29,
        7.292468789110186e31,
        1.754623158684049e34,
        3.1249311300442165e36,
    ]
)


def sincos_ref(x, op):
    return getattr(np, op)(np.asarray(x, np.float32).astype(np.float64))


def assert_sincos_close(x, y, op):
    x = np.asarray(x, np.float32)
    r = sincos_ref(x, op)
    err = np.abs(y.astype(np.float64) - r)
    bad = ~(err <= SINCOS_ABS)
    assert not bad.any(), f"{op}: {int(bad.sum())} of {x.size} beyond {SINCOS_ABS}, e.g. " + ", ".join(
        f"x={x[i]!r}: got {y[i]!r}, want {r[i]!r}" for i in np.flatnonzero(bad)[:4]
    )


def multiples_of_half_pi(k):
    """The floats on both sides of k * pi/2, for large integers k."""
    v = (k.astype(np.float64) * (np.pi / 2)).astype(np.float32)
    return np.concatenate([v, np.nextafter(v, np.float32(np.inf)), np.nextafter(v, np.float32(0))])


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_sin_cos_of_large_values(op):
    require(KERNEL)
    x = np.concatenate([LARGE, -LARGE])
    y = tn.unary(x, op)
    assert_sincos_close(x, y, op)


def test_sin_of_1e10_is_right():
    require(KERNEL)
    y = tn.unary(np.float32([1e10, -1e10]), "sin")
    assert abs(float(y[0]) - np.sin(np.float64(np.float32(1e10)))) <= SINCOS_ABS
    assert y[1] == -y[0]


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_sin_cos_random_magnitudes_up_to_flt_max(rng, op):
    require(KERNEL)
    n = 1 << 18
    x = (np.exp2(rng.uniform(16.0, 128.0, n)) * rng.choice([-1.0, 1.0], n)).astype(np.float32)
    x = x[np.isfinite(x)]
    assert_sincos_close(x, tn.unary(x, op), op)


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_sin_cos_every_binade(rng, op):
    """A few hundred random floats of every binade from 2^-126 to 2^127, both signs,
    and every float of the binades around the switch to the exact reduction."""
    require(KERNEL)
    exps = np.repeat(np.arange(1, 255, dtype=np.uint32), 512)
    bits = (exps << 23) | rng.integers(0, 1 << 23, exps.size, dtype=np.uint32)
    bits |= rng.integers(0, 2, exps.size, dtype=np.uint32) << 31
    around = np.arange(0x47FF0000, 0x48010000, dtype=np.uint32)  # 130944 .. 132096
    x = np.concatenate([bits, around]).view(np.float32)
    assert_sincos_close(x, tn.unary(x, op), op)


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_sin_cos_near_multiples_of_half_pi(rng, op):
    """Where the reduced argument is smallest: cancellation must not lose the result."""
    require(KERNEL)
    k = np.concatenate([rng.integers(1 << 17, 1 << 40, 4096), np.int64([1 << 52, 3 << 60, 10**18])])
    x = np.concatenate([multiples_of_half_pi(k.astype(np.float64)), HARDEST])
    assert_sincos_close(x, tn.unary(x, op), op)


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_sin_cos_of_inf_and_nan_are_nan(op):
    require(KERNEL)
    x = np.float32([np.inf, -np.inf, np.nan, 1e10, -np.inf, 3e38] * 4)
    y = tn.unary(x, op)
    assert np.isnan(y[~np.isfinite(x)]).all() and np.isfinite(y[np.isfinite(x)]).all()


def test_exp_underflow_range_is_accurate():
    """exp on [-110, -80]: normal, lowest-binade, denormal and zero results. The float64
    reference rounded to float32 is exact to half a denormal step, so the result must be
    within the relative bound plus that half step (below 2^-125: correctly rounded up to
    the polynomial's error)."""
    require(KERNEL)
    x = np.concatenate(
        [
            np.linspace(-110.0, -80.0, 200003, dtype=np.float32),
            np.float32([-87.33654, -87.33655, -103.27893, -103.97208, -103.972084, -104.0, -104.5]),
        ]
    )
    y = tn.unary(x, "exp")
    r = np.exp(x.astype(np.float64))
    err = np.abs(y.astype(np.float64) - r)
    bad = err > 4e-7 * r + 0.5 * F32_TINY + 1e-7 * F32_TINY
    assert not bad.any(), [(x[i], y[i], r[i]) for i in np.flatnonzero(bad)[:4]]
    ys = y[np.argsort(x)].astype(np.float64)
    assert (ys[1:] >= ys[:-1]).all()  # monotone through the switch to the integer path
    assert (y[x <= -104.0] == 0).all() and (y[x > -103.0] > 0).all()


EXTREME_SCRIPT = """
for op in ("exp", "log", "tanh", "erf", "sin", "cos"):
    outputs[op] = tn.unary(inputs["x"], op)
"""


def extreme_inputs():
    rng = np.random.default_rng(12)
    bits = rng.integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(np.float32)
    big = (np.exp2(rng.uniform(16.0, 128.0, 1 << 14)) * rng.choice([-1.0, 1.0], 1 << 14)).astype(np.float32)
    under = np.linspace(-110.0, -80.0, 1 << 14, dtype=np.float32)
    special = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, F32_MAX, -F32_MAX, 1e-45, 1e10, -1e10, 131072.0])
    return {"x": np.concatenate([special, bits, big, under, LARGE, -LARGE])}


@pytest.mark.level_independent  # runs the two levels it compares
@pytest.mark.parametrize(
    "a,b",
    [("scalar", "avx2"), ("scalar", "avx512"), ("avx2", "avx512")],
    ids=["scalar-vs-avx2", "scalar-vs-avx512", "avx2-vs-avx512"],
)
def test_math_ops_bit_identical_across_levels_at_extremes(isa_runner, a, b):
    require(KERNEL)
    inputs = extreme_inputs()
    ya = isa_runner.run("unary-extremes", a, EXTREME_SCRIPT, inputs)
    yb = isa_runner.run("unary-extremes", b, EXTREME_SCRIPT, inputs)
    for op in ("exp", "log", "tanh", "erf", "sin", "cos"):
        p, q = ya[op], yb[op]
        nan = np.isnan(p) & np.isnan(q)
        assert_same_bits(
            np.where(nan, 0, p).astype(np.float32), np.where(nan, 0, q).astype(np.float32), what=f"{op} {a} vs {b}"
        )
