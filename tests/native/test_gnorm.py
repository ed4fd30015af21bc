"""Generic normalization (TensorRT INormalization, DirectML MVN1): tensorops_native.normalize.

- Against the seed's float64 `normalization_reference` (transcribed below), generalized with
  groups, normalize_variance and DirectML's fused activations: random ranks 1 to 8, random
  axes sets in bitmask and list form, with and without scale and bias (every broadcast
  pattern, per-group ones included), every activation, FP32/FP16/BF16. The native suite runs
  once per ISA level, so every level is checked; test_identical_across_isa_levels also
  compares the levels' bits directly.
- The seed's worked example (2, 3, 2, 2), axes = 1 << 2 | 1 << 3.
- Equivalences: NHWC channels = layer_norm_channels, NCHW spatial axes = layer_norm_spatial,
  group normalization = PyTorch's group_norm formula.
- Bad input: ValueError naming the argument.
- Direct C calls: memory outside the tensors is never touched (canaries, guard pages).

Tolerances: the kernel computes in fp32; the float64 reference differs only by the kernel's
rounding. Per element the allowed error of the normalized value (before activation) is
    |scale| * (k * dm + |z| * (rel_k + 2u)) + u * |y|
with dm = (sum_rtol(n) + 2u) * mean(|x|) the error of the mean, rel_k = 6u + sum_rtol(n) the
relative error of k = 1 / sqrt(var + eps) (4 roundings and the sum of squares), z the
normalized value. The activation is then evaluated in float64 over that interval (widened
by 2u |y| for the rounding of a scaled argument), its accuracy allowance (8 ulp, absolute
FLT_MIN) added, and both ends rounded to the output dtype: rounding being monotone, the
output must lie between them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from tensorops_native._native import ffi, lib

import reference as ref
import tensorops_native as tn
from tensorops_native import _normalize
from tn_testing import Guarded, U, assert_same_bits, call_preserving, require, sum_rtol

KERNELS = ("NormalizationRows", "NormalizationColumns")
BF16 = ref.BF16
F16 = np.dtype(np.float16)
DTYPES = {"fp32": np.dtype(np.float32), "fp16": F16, "bf16": BF16}
FLT_MIN = float(np.finfo(np.float32).tiny)
SIZES = (1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 67)


@pytest.fixture(autouse=True)
def _kernels():
    require(*KERNELS)


# ---- The seed (001): TensorRT's example reference, as written there ---------------------


def convert_axes_to_tuple(axes, num_dims):
    converted_axes = []
    for i in range(num_dims):
        ref_bit = 1 << i
        if axes & ref_bit == ref_bit:
            converted_axes.append(i)
    return tuple(converted_axes)


def normalization_reference(x, s, bias, axes, epsilon=1e-5):
    num_dims = len(x.shape)
    converted_axes = convert_axes_to_tuple(axes, num_dims)
    mean = np.mean(x, axis=converted_axes, keepdims=True)
    var = np.var(x, axis=converted_axes, keepdims=True)
    return s * (x - mean) / np.sqrt(var + epsilon) + bias


# ---- Generalized float64 reference -------------------------------------------------------


def as_f64(a):
    a = np.asarray(a)
    if a.dtype == BF16 or a.dtype == np.uint16:
        return ref.bf16_to_f64(a)
    return a.astype(np.float64)


def param64(p, shape, groups):
    """A parameter as float64 broadcast to x's shape (per-group values to their channels)."""
    if p is None:
        return None
    p = as_f64(p)
    p = p.reshape((1,) * (len(shape) - p.ndim) + p.shape)
    if groups > 1 and p.shape[1] == groups and shape[1] != groups:
        p = np.repeat(p, shape[1] // groups, axis=1)
    return np.broadcast_to(p, shape)


def reference(x, scale, bias, axes, groups=1, eps=1e-5, normalize_variance=True):
    """(y, tol): the float64 result before the activation and its allowed error."""
    x = as_f64(x)
    shape = x.shape
    axes = tuple(sorted(a % x.ndim for a in axes))
    if groups > 1:
        xs = x.reshape(shape[0], groups, shape[1] // groups, *shape[2:])
        red = tuple(sorted({a + 1 if a > 1 else a for a in axes if a != 1} | {2}))  # groups apart
    else:
        xs, red = x, axes
    n = math.prod(xs.shape[a] for a in red)
    mean = xs.mean(axis=red, keepdims=True)
    var = xs.var(axis=red, keepdims=True)
    mag = np.abs(xs).mean(axis=red, keepdims=True)
    dm = (sum_rtol(n) + 2 * U) * mag
    if normalize_variance:
        k = 1.0 / np.sqrt(var + eps)
        rel_k = 6 * U + sum_rtol(n)
    else:
        k, rel_k = np.ones_like(var), 0.0
    z = (xs - mean) * k
    dz = k * dm + np.abs(z) * (rel_k + 2 * U)
    z, dz = np.broadcast_to(z, xs.shape).reshape(shape), np.broadcast_to(dz, xs.shape).reshape(shape)
    s, b = param64(scale, shape, groups), param64(bias, shape, groups)
    y = z * (1.0 if s is None else s) + (0.0 if b is None else b)
    tol = dz * (1.0 if s is None else np.abs(s)) + U * np.abs(y)
    return y, tol


_erfc = np.frompyfunc(math.erfc, 1, 1)


def _softplus(z):
    return np.logaddexp(0.0, z)


# DirectML's fused activations in float64, from their definitions (the Activation enum's list).
ACT64 = {
    "identity": lambda y: y,
    "linear": lambda y, a, b: a * y + b,
    "relu": lambda y: np.maximum(0.0, y),
    "leaky_relu": lambda y, a: np.where(y >= 0, y, a * y),
    "parametric_softplus": lambda y, a, b: a * _softplus(b * y),
    "elu": lambda y, a: np.where(y >= 0, y, a * np.expm1(y)),
    "celu": lambda y, a: np.maximum(0.0, y) + np.minimum(0.0, a * np.expm1(y / a)),
    "scaled_elu": lambda y, a, g: np.where(y > 0, g * y, g * (a * np.expm1(y))),
    "sigmoid": lambda y: 1.0 / (1.0 + np.exp(-y)),
    "hard_sigmoid": lambda y, a, b: np.maximum(0.0, np.minimum(1.0, a * y + b)),
    "tanh": np.tanh,
    "scaled_tanh": lambda y, a, b: a * np.tanh(b * y),
    "softplus": lambda y, s: _softplus(s * y) / s,
    "softsign": lambda y: y / (1.0 + np.abs(y)),
    "thresholded_relu": lambda y, a: np.where(y > a, y, 0.0),
    "shrink": lambda y, b, t: np.where(y > t, y - b, np.where(y < -t, y + b, 0.0)),
    "gelu": lambda y: y * 0.5 * _erfc(-y / math.sqrt(2.0)).astype(np.float64),
}
assert set(ACT64) == set(tn.ACTIVATIONS)


def act_params(activation):
    """(name, float32-rounded parameters with defaults filled in) of an activation spec."""
    if activation is None:
        return "identity", ()
    name, given = (activation, ()) if isinstance(activation, str) else (activation[0], tuple(activation[1:]))
    spec = tn.ACTIVATIONS[name.lower()][1]
    values = [given[i] if i < len(given) else default for i, (_, default) in enumerate(spec)]
    return name.lower(), tuple(float(np.float32(v)) for v in values)


def expected_bounds(y, tol, activation, dtype):
    """The output range (lo, hi), in the output dtype, that a correct kernel can produce."""
    name, prm = act_params(activation)
    f = ACT64[name]
    width = tol + 2 * U * np.abs(y)
    with np.errstate(all="ignore"):
        samples = [f(y + c * width, *prm) for c in (-1.0, -0.5, 0.0, 0.5, 1.0)]
    lo, hi = np.minimum.reduce(samples), np.maximum.reduce(samples)
    acc = 8 * U * np.maximum(np.abs(lo), np.abs(hi)) + FLT_MIN
    with np.errstate(all="ignore"):
        lo = (lo - acc).astype(np.float32).astype(dtype).astype(np.float64)
        hi = (hi + acc).astype(np.float32).astype(dtype).astype(np.float64)
    return lo, hi


def check(out, x, scale, bias, axes, groups=1, eps=1e-5, normalize_variance=True, activation=None, what="y"):
    x = np.asarray(x)
    assert out.shape == x.shape and out.dtype == x.dtype, f"{what}: {out.shape} {out.dtype} for x {x.shape} {x.dtype}"
    y, tol = reference(x, scale, bias, axes, groups, eps, normalize_variance)
    dtype = BF16 if x.dtype == np.uint16 else x.dtype
    lo, hi = expected_bounds(y, tol, activation, dtype)
    got = as_f64(out)
    bad = ~((got >= lo) & (got <= hi))
    if bad.any():
        idx = np.flatnonzero(bad)[:5]
        lines = [
            f"  at {np.unravel_index(i, x.shape)}: got {got.ravel()[i]!r}, allowed [{lo.ravel()[i]!r}, "
            f"{hi.ravel()[i]!r}] (pre-activation reference {y.ravel()[i]!r} +- {tol.ravel()[i]:.3g})"
            for i in idx
        ]
        pytest.fail(
            f"{what}: {int(bad.sum())} of {out.size} elements out of bounds "
            f"(shape {x.shape}, axes {axes}, groups {groups}, activation {activation}):\n" + "\n".join(lines)
        )


# ---- Random cases ------------------------------------------------------------------------

DIM_SIZES = (1, 2, 3, 4, 5, 7, 8, 16, 17)
ACTIVATION_CHOICES = [
    None,
    "identity",
    ("linear", 0.7, -0.25),
    "relu",
    ("leaky_relu", 0.1),
    "leaky_relu",
    ("parametric_softplus", 0.8, 1.5),
    "elu",
    ("elu", 0.5),
    "celu",
    ("celu", 2.0),
    "scaled_elu",
    "sigmoid",
    "hard_sigmoid",
    ("hard_sigmoid", 0.3, 0.4),
    "tanh",
    "scaled_tanh",
    ("scaled_tanh", 1.5, 0.7),
    "softplus",
    ("softplus", 3.0),
    "softsign",
    "thresholded_relu",
    ("thresholded_relu", 0.3),
    "shrink",
    ("shrink", 0.2, 0.6),
    "gelu",
]


def random_shape(rng, ndim, limit=2500):
    while True:
        shape = tuple(int(rng.choice(DIM_SIZES)) for _ in range(ndim))
        if math.prod(shape) <= limit:
            return shape


def random_param(rng, shape, groups):
    r = rng.random()
    if r < 0.25:
        return None
    if groups > 1 and r < 0.4:
        p = (1, groups) + (1,) * (len(shape) - 2)
    else:
        p = tuple(n if rng.random() < 0.5 else 1 for n in shape)
        drop = int(rng.integers(0, len(shape) + 1)) if rng.random() < 0.3 else 0
        p = p[drop:] if all(d == 1 for d in p[:drop]) else p
    return rng.uniform(-1.5, 1.5, p).astype(np.float32)


def random_case(rng, dtype):
    ndim = int(rng.integers(1, 9))
    shape = random_shape(rng, ndim)
    axes = [i for i in range(ndim) if rng.random() < 0.5] or [int(rng.integers(0, ndim))]
    groups = 1
    if ndim >= 2 and shape[1] > 1 and rng.random() < 0.35:
        groups = int(rng.choice([g for g in range(2, shape[1] + 1) if shape[1] % g == 0]))
    form = rng.random()
    if form < 0.3:
        axes_arg = sum(1 << a for a in axes)
    elif form < 0.6:
        axes_arg = [a - ndim if rng.random() < 0.5 else a for a in axes]
    else:
        axes_arg = tuple(int(a) for a in rng.permutation(axes))
    x = rng.normal(0.3, 1.5, shape).astype(np.float32)
    if rng.random() < 0.2:
        x = x * np.float32(50.0) + np.float32(20.0)  # large mean and spread
    kwargs = dict(
        axes=axes_arg,
        num_groups=groups,
        normalize_variance=bool(rng.random() < 0.8),
        eps=float(rng.choice([1e-5, 1e-3, 0.5])),
    )
    act = ACTIVATION_CHOICES[int(rng.integers(0, len(ACTIVATION_CHOICES)))]
    if act is not None:
        kwargs["activation"] = act
    return x.astype(dtype), random_param(rng, shape, groups), random_param(rng, shape, groups), axes, kwargs


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("chunk", range(4))
def test_random_cases_against_reference(rng, dtype, chunk):
    for i in range(60):
        x, scale, bias, axes, kw = random_case(rng, DTYPES[dtype])
        kw_ref = {k: v for k, v in kw.items() if k not in ("axes", "num_groups")}
        out = tn.normalize(x, scale, bias, **kw)
        check(out, x, scale, bias, axes, kw["num_groups"], what=f"case {i} ({dtype})", **kw_ref)


def test_seed_worked_example(rng):
    """The seed's example: (2, 3, 2, 2), scale and bias (1, 3, 1, 1), axes 1 << 2 | 1 << 3."""
    input_vals = rng.random((2, 3, 2, 2))
    scale_vals = np.array([1.0, 2.0, 3.0]).reshape((1, 3, 1, 1))
    bias_vals = np.array([-3.0, -2.0, -1.0]).reshape((1, 3, 1, 1))
    axes = 1 << 2 | 1 << 3
    x = input_vals.astype(np.float32)
    expected = normalization_reference(x.astype(np.float64), scale_vals, bias_vals, axes)
    got = tn.normalize(x, scale_vals.astype(np.float32), bias_vals.astype(np.float32), axes=axes)
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=2e-6)
    assert np.array_equal(got, tn.normalize(x, scale_vals, bias_vals, axes=[2, 3]))  # float64 params, list axes
    assert np.array_equal(got, tn.normalize(x, scale_vals, bias_vals, axes=(-1, -2)))


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_rows_around_vector_widths(rng, dtype):
    """Rows (trailing axes) of every length around 8 and 16 lanes, 1 to 5 rows (tails of the
    four-row blocks), per-position and per-row parameters."""
    for n in SIZES:
        for outer in (1, 2, 3, 4, 5, 9):
            x = rng.normal(0.5, 2.0, (outer, n)).astype(DTYPES[dtype])
            s, b = rng.uniform(-2, 2, n).astype(np.float32), rng.uniform(-1, 1, (outer, 1)).astype(np.float32)
            check(tn.normalize(x, s, b, axes=[1]), x, s, b, [1], what=f"rows {outer}x{n}")
            check(tn.normalize(x, axes=[1], activation="gelu"), x, None, None, [1], activation="gelu")


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_columns_around_vector_widths(rng, dtype):
    """Columns (a reduced block followed by kept axes): every count and inner size around the
    vector widths, and more than 16 rows (all the canonical lanes)."""
    for count in (1, 3, 16, 17, 33):
        for inner in SIZES:
            x = rng.normal(-0.5, 1.5, (2, count, inner)).astype(DTYPES[dtype])
            s, b = rng.uniform(-2, 2, (count, 1)).astype(np.float32), rng.uniform(-1, 1, inner).astype(np.float32)
            check(tn.normalize(x, s, b, axes=[1]), x, s, b, [1], what=f"columns {count}x{inner}")
    x = rng.normal(size=(3, 5, 300)).astype(DTYPES[dtype])  # more positions than one chunk
    s = rng.uniform(-2, 2, (3, 5, 300)).astype(np.float32)
    check(tn.normalize(x, s, None, axes=[1], activation="tanh"), x, s, None, [1], activation="tanh")


def test_group_norm_segments_and_parameters(rng):
    """Group norm rows are segments of channels: every segment length around the vector
    widths, per-channel and per-group parameters, scalars."""
    for spatial in (1, 3, 15, 16, 17, 33):
        for groups, channels in ((2, 4), (3, 9), (4, 32), (8, 8)):
            x = rng.normal(1.0, 3.0, (2, channels, spatial)).astype(np.float32)
            per_channel = rng.uniform(-2, 2, (1, channels, 1)).astype(np.float32)
            per_group = rng.uniform(-2, 2, (1, groups, 1)).astype(np.float32)
            for s, b in (
                (per_channel, per_group),
                (per_group, None),
                (None, np.float32(0.5)),
                (per_channel, per_channel),
            ):
                check(tn.normalize(x, s, b, axes=[2], num_groups=groups), x, s, b, [2], groups)


def test_parameter_patterns_that_need_expansion(rng):
    """Parameters whose broadcast pattern is no (period, stride, step) form are expanded: one
    that varies along an outer axis but not a later kept one, along a reduced axis but not a
    later one, and mixtures."""
    x = rng.normal(size=(3, 4, 5, 6)).astype(np.float32)
    cases = [
        ((3, 1, 1, 1), [2, 3]),
        ((3, 1, 5, 1), [2, 3]),
        ((1, 4, 1, 6), [1, 2]),
        ((1, 1, 5, 1), [1, 2, 3]),
        ((3, 4, 1, 6), [3]),
        ((1, 4, 5, 1), [0, 2]),
        ((3, 1, 1, 6), [1]),
        ((1, 1, 5, 6), [0, 1, 2, 3]),
    ]
    for shape, axes in cases:
        s = rng.uniform(-2, 2, shape).astype(np.float32)
        b = rng.uniform(-1, 1, shape[::-1][:2][::-1]).astype(np.float32) if shape[-2:] != (1, 1) else None
        check(tn.normalize(x, s, b, axes=axes), x, s, b, axes, what=f"scale {shape} axes {axes}")
        check(tn.normalize(x, b, s, axes=axes), x, b, s, axes, what=f"bias {shape} axes {axes}")


def test_axes_forms_agree(rng):
    x = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
    base = tn.normalize(x, axes=[1, 3])
    for form in ((1, 3), [-3, -1], [3, 1], np.array([1, 3]), 0b1010, np.int64(10), [np.int32(1), 3]):
        assert_same_bits(tn.normalize(x, axes=form), base, what=f"axes={form!r}")


def test_activation_accuracy_fp32(rng):
    """Each activation against float64 on the kernel's own pre-activation values (the same
    call without activation gives them exactly): 8 ulp, FLT_MIN absolute."""
    x = rng.normal(0.0, 1.0, (64, 67)).astype(np.float32)
    s = rng.uniform(-12, 12, 67).astype(np.float32)
    pre = tn.normalize(x, s, None, axes=[0]).astype(np.float64)
    for spec in ACTIVATION_CHOICES + [("linear", -2.0, 3.0), ("parametric_softplus", 2.0, -0.5)]:
        name, prm = act_params(spec)
        out = tn.normalize(x, s, None, axes=[0], activation=spec).astype(np.float64)
        with np.errstate(all="ignore"):
            want = ACT64[name](pre, *prm)
            # a scaled argument (b * y) is rounded once: allow for that
            alt = [ACT64[name](pre * (1 + c * 2 * U), *prm) for c in (-1, 1)]
        lo = np.minimum.reduce([want, *alt])
        hi = np.maximum.reduce([want, *alt])
        acc = 8 * U * np.maximum(np.abs(lo), np.abs(hi)) + FLT_MIN
        bad = ~((out >= lo - acc) & (out <= hi + acc))
        assert not bad.any(), (
            f"{spec}: {int(bad.sum())} values off, e.g. y={pre[bad][:3]} got {out[bad][:3]} want {want[bad][:3]}"
        )


def test_activation_defaults_and_parameters(rng):
    x = rng.normal(size=(4, 33)).astype(np.float32)
    for name, (_, spec) in tn.ACTIVATIONS.items():
        defaults = [d for _, d in spec]
        if None in defaults:
            continue
        assert_same_bits(
            tn.normalize(x, axes=[1], activation=name),
            tn.normalize(x, axes=[1], activation=(name, *defaults)),
            what=name,
        )
        assert_same_bits(
            tn.normalize(x, axes=[1], activation=name.upper()), tn.normalize(x, axes=[1], activation=[name]), what=name
        )
    assert_same_bits(tn.normalize(x, axes=[1], activation="identity"), tn.normalize(x, axes=[1]))


def test_results_do_not_depend_on_earlier_calls():
    """Validated calls are reused by their arguments, where 0.0 and -0.0 are one key; but a
    negative value times a slope of +0.0 is -0.0, and times -0.0 is +0.0. (Found by the
    live fuzzer: the server, with another history of calls, answered other bits.)"""
    x = np.array([[-1.0, -2.0, 3.0, 0.5]], np.float32)  # normalized: the first two are negative
    for name in ("leaky_relu", "elu"):
        for first, second in ((0.0, -0.0), (-0.0, 0.0)):
            tn.normalize(x, axes=[1], activation=(name, first))
            y = tn.normalize(x, axes=[1], activation=(name, second))
            assert np.all(y[0, :2] == 0) and np.all(np.signbit(y[0, :2]) != np.signbit(second)), (name, second, y)


def test_normalize_variance_false_subtracts_the_mean(rng):
    x = rng.normal(3.0, 2.0, (5, 40)).astype(np.float32)
    s = rng.uniform(0.5, 1.5, 40).astype(np.float32)
    out = tn.normalize(x, s, None, axes=[1], normalize_variance=False)
    check(out, x, s, None, [1], normalize_variance=False)
    np.testing.assert_allclose(out, (x - x.astype(np.float64).mean(1, keepdims=True)) * s, rtol=1e-5, atol=2e-6)


def test_dtypes_of_parameters(rng):
    """scale/bias of the input's dtype, fp32, or real numbers: the same fp32 values."""
    x = rng.normal(size=(3, 16)).astype(BF16)
    s32 = rng.uniform(-2, 2, 16).astype(BF16).astype(np.float32)
    base = tn.normalize(x, s32, s32, axes=[1])
    for s in (s32.astype(BF16), s32.astype(BF16).view(np.uint16), s32.astype(np.float64), s32.tolist()):
        assert_same_bits(tn.normalize(x, s, s, axes=[1]), base)
    xh = x.astype(np.float32).astype(F16)
    sh = s32.astype(F16)
    assert_same_bits(
        tn.normalize(xh, sh, sh, axes=[1]), tn.normalize(xh, sh.astype(np.float32), sh.astype(np.float32), axes=[1])
    )
    bits = tn.normalize(x.view(np.uint16), s32, None, axes=[1])
    assert bits.dtype == np.uint16 and np.array_equal(bits, tn.normalize(x, s32, None, axes=[1]).view(np.uint16))


def test_fp16_and_bf16_rounding_is_exact_rne():
    """With scale 0 and no variance normalization the result is the bias: the output
    conversion alone, against NumPy / ml_dtypes (round to nearest even, denormals, overflow),
    for random fp32 bit patterns and the boundaries."""
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    near = rng.integers(0x33000000, 0x47900000, 1 << 16, dtype=np.uint64).astype(np.uint32) | (
        rng.integers(0, 2, 1 << 16).astype(np.uint32) << 31
    )
    special = np.array(
        [
            65504,
            65519.99,
            65520,
            65536,
            2**-24,
            2**-25,
            3 * 2**-26,
            2**-14,
            2**-14 * (1 - 2**-11),
            np.inf,
            -np.inf,
            1e-45,
            3.3895e38,
        ],
        np.float32,
    )
    b = np.concatenate([bits.view(np.float32), near.view(np.float32), special])
    for dtype in (F16, BF16):
        x = np.zeros(b.size, dtype)
        y = tn.normalize(x, np.zeros(1, np.float32), b, axes=[0], normalize_variance=False)
        with np.errstate(all="ignore"):
            want = b.astype(dtype)
        nan = np.isnan(b)
        check_bits = ~nan & (b != 0)  # a zero bias gives +0 (the sum 0 * 0 + b)
        assert_same_bits(y[check_bits], want[check_bits], what=f"{dtype} rounding")
        assert np.all(y.view(np.uint16)[nan] == (0x7E00 if dtype == F16 else 0x7FC0))


def test_special_values(rng):
    """NaN or infinity in a reduction make its results NaN (the canonical quiet NaN); a
    constant row gives the bias (variance 0), with eps = 0 too (the project's rule: a zero
    variance with eps = 0 gives a normalized value of 0, the limit eps -> 0+)."""
    x = rng.normal(size=(6, 20)).astype(np.float32)
    x[1, 3] = np.nan
    x[2, 0] = np.inf
    x[3, 19] = -np.inf
    x[4] = 2.5
    s = np.full(20, 2.0, np.float32)
    b = np.full(20, -1.0, np.float32)
    for dtype in DTYPES.values():
        xd = x.astype(dtype)
        y = tn.normalize(xd, s, b, axes=[1])
        yb = y.view(np.uint32 if dtype == np.float32 else np.uint16)
        qnan = {np.dtype(np.float32): 0x7FC00000, F16: 0x7E00, BF16: 0x7FC0}[np.dtype(dtype)]
        assert np.all(yb[1:4] == qnan), dtype
        assert np.all(as_f64(y[4]) == -1.0) and np.all(np.isfinite(as_f64(y[[0, 5]]))), dtype
        z = tn.normalize(xd, s, b, axes=[1], eps=0.0)
        assert np.all(as_f64(z[4]) == -1.0) and np.all(z.view(yb.dtype)[1:4] == qnan), dtype


def test_empty_tensors_and_size_one_axes(rng):
    for shape, axes in (((0, 3), [1]), ((2, 0, 4), [1]), ((3, 0), [0]), ((2, 4, 0), [0, 2])):
        for dtype in DTYPES.values():
            y = tn.normalize(np.zeros(shape, dtype), axes=axes)
            assert y.shape == shape and y.dtype == dtype
    x = rng.normal(size=(1, 5, 1, 1, 3)).astype(np.float32)
    check(tn.normalize(x, axes=[0, 2, 3]), x, None, None, [0, 2, 3])  # every reduced axis has size 1
    check(tn.normalize(x, axes=[1, 3]), x, None, None, [1, 3])


def test_inputs_are_not_modified(rng):
    x = rng.normal(size=(2, 4, 3, 5)).astype(np.float32)
    s, b = rng.normal(size=(1, 4, 1, 1)).astype(np.float32), rng.normal(size=(2, 1, 3, 1)).astype(np.float32)
    call_preserving(tn.normalize, x, s, b, axes=[0, 2], activation="gelu")
    call_preserving(tn.normalize, x.astype(BF16), s, b, axes=[1, 2, 3], num_groups=2)


def test_non_contiguous_inputs(rng):
    x = rng.normal(size=(6, 10)).astype(np.float32)
    s = rng.normal(size=20).astype(np.float32)[::2]
    assert_same_bits(
        tn.normalize(x[:, ::2].T, s[:6], None, axes=[0]),
        tn.normalize(np.ascontiguousarray(x[:, ::2].T), np.ascontiguousarray(s[:6]), None, axes=[0]),
    )
    assert_same_bits(tn.normalize(x.T, axes=[-1]), tn.normalize(np.ascontiguousarray(x.T), axes=[-1]))


def test_large_outputs_streaming_stores(rng):
    """Outputs of 2 MiB or more, of rows of 8 KiB or more in FP32, are written with streaming
    stores from each segment's first vector-aligned element (the prefetch cursor runs to the
    last row): rows whose starts move through every alignment, group segments, every dtype,
    and a destination that starts one element past an alignment (direct call)."""
    cases = [
        ((40, 13109), [1], 1, np.float32),
        ((2, 16, 33, 1001), [2, 3], 4, np.float16),
        ((1100, 1003), [1], 1, BF16),
        ((3, 700, 1001), [1], 1, np.float32),
    ]
    for shape, axes, groups, dtype in cases:
        x = rng.normal(0.2, 1.5, shape).astype(dtype)
        pshape = (1, shape[1]) + (1,) * (len(shape) - 2) if groups > 1 else shape[-1:]
        s, b = rng.uniform(-2, 2, pshape).astype(np.float32), rng.uniform(-1, 1, pshape).astype(np.float32)
        y = tn.normalize(x, s, b, axes=axes, num_groups=groups, activation="sigmoid")
        assert y.nbytes >= 2 << 20
        check(y, x, s, b, axes, groups, activation="sigmoid", what=f"{shape} {np.dtype(dtype).name}")
        plan = plan_of(x, s, b, dict(axes=axes, num_groups=groups))
        if plan.transpose is None and all(p is None or p[0] is None for p in plan.params):
            raw = x.view(np.uint16) if x.dtype.itemsize == 2 else x
            buf = np.zeros(raw.size + 1, raw.dtype)
            dst = buf[1:].reshape(raw.shape)  # one element past the allocation's alignment
            params = [_normalize._parameter(p, "p", x.shape, groups) for p in (s, b)]
            c_normalize(plan, x.dtype, raw, params, dst, activation="sigmoid")
            assert_same_bits(dst, y.view(raw.dtype), what=f"{shape} misaligned destination")
            assert buf[0] == 0


# ---- Equivalences -----------------------------------------------------------------------


@pytest.mark.parametrize("channels", (3, 16, 67))
def test_nhwc_channels_equal_layer_norm_channels(rng, channels):
    x = rng.normal(0.3, 1.0, (2, 5, 7, channels)).astype(np.float32)
    s, b = rng.uniform(-1.5, 1.5, channels).astype(np.float32), rng.uniform(-1, 1, channels).astype(np.float32)
    ours = tn.normalize(x, s, b, axes=[-1])
    np.testing.assert_allclose(ours, tn.layer_norm_channels(x, s, b, format="nhwc"), rtol=1e-5, atol=3e-6)
    # BF16: the same operation sequence, sums in a different fixed order: within one BF16 ulp
    xb = x.astype(BF16)
    ours, theirs = tn.normalize(xb, s, b, axes=[3]), tn.layer_norm_channels(xb, s, b, format="nhwc")
    check(ours, xb, s, b, [3])
    a, t = ours.view(np.uint16).astype(np.int32), theirs.view(np.uint16).astype(np.int32)
    assert np.all(np.abs(a - t) <= 1) or np.all(
        np.abs(as_f64(ours) - as_f64(theirs)) <= 2.0**-8 * np.abs(as_f64(theirs))
    )


@pytest.mark.parametrize("channels", (1, 8, 17))
def test_nchw_spatial_axes_equal_layer_norm_spatial(rng, channels):
    x = rng.normal(-0.4, 2.0, (3, channels, 7, 9)).astype(np.float32)
    s, b = rng.uniform(-1.5, 1.5, channels).astype(np.float32), rng.uniform(-1, 1, channels).astype(np.float32)
    ours = tn.normalize(x, s.reshape(1, -1, 1, 1), b.reshape(1, -1, 1, 1), axes=1 << 2 | 1 << 3)
    np.testing.assert_allclose(ours, tn.layer_norm_spatial(x, s, b, format="nchw"), rtol=1e-5, atol=3e-6)


def torch_group_norm_formula(x, groups, weight, bias, eps):
    """torch.nn.functional.group_norm as its documentation defines it, in float64."""
    n, c = x.shape[:2]
    xg = x.astype(np.float64).reshape(n, groups, -1)
    mean = xg.mean(-1, keepdims=True)
    var = xg.var(-1, keepdims=True)
    y = ((xg - mean) / np.sqrt(var + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return y * weight.reshape(shape) + bias.reshape(shape)


@pytest.mark.parametrize("shape,groups", [((2, 8, 5, 5), 4), ((3, 6, 7), 3), ((1, 32, 4, 4, 2), 8), ((2, 4), 2)])
def test_group_norm_equals_pytorch_formula(rng, shape, groups):
    x = rng.normal(0.5, 2.0, shape).astype(np.float32)
    w, b = rng.uniform(-1.5, 1.5, shape[1]).astype(np.float32), rng.uniform(-1, 1, shape[1]).astype(np.float32)
    pshape = (1, shape[1]) + (1,) * (len(shape) - 2)
    spatial = list(range(2, len(shape)))
    ours = tn.normalize(x, w.reshape(pshape), b.reshape(pshape), axes=spatial or [1], num_groups=groups)
    np.testing.assert_allclose(ours, torch_group_norm_formula(x, groups, w, b, 1e-5), rtol=2e-5, atol=5e-6)
    try:
        import torch
    except ImportError:
        return
    want = torch.nn.functional.group_norm(torch.from_numpy(x), groups, torch.from_numpy(w), torch.from_numpy(b), 1e-5)
    np.testing.assert_allclose(ours, want.numpy(), rtol=2e-5, atol=5e-6)


# ---- Bad input --------------------------------------------------------------------------

X4 = np.zeros((2, 6, 3, 3), np.float32)
BAD = [
    (dict(axes=[4]), "axes"),
    (dict(axes=[-5]), "axes"),
    (dict(axes=[1, 1]), "axes"),
    (dict(axes=[1, -3]), "axes"),
    (dict(axes=[]), "axes"),
    (dict(axes=0), "axes"),
    (dict(axes=1 << 4), "axes"),
    (dict(axes=-1), "axes"),
    (dict(axes=None), "axes"),
    (dict(axes=[1.0]), "axes"),
    (dict(axes="1"), "axes"),
    (dict(axes=True), "axes"),
    (dict(axes=[2], num_groups=4), "num_groups"),
    (dict(axes=[2], num_groups=0), "num_groups"),
    (dict(axes=[2], num_groups=2.0), "num_groups"),
    (dict(axes=[2], scale=np.ones(4, np.float32)), "scale"),
    (dict(axes=[2], bias=np.ones((2, 1, 1, 1, 1))), "bias"),
    (dict(axes=[2], scale=np.ones((1, 3, 1, 1), np.float32)), "scale"),
    (dict(axes=[2], num_groups=3, scale=np.ones((1, 2, 1, 1))), "scale"),
    (dict(axes=[2], bias=np.ones(3, bool)), "bias"),
    (dict(axes=[2], scale=np.ones(3, complex)), "scale"),
    (dict(axes=[2], activation="swish"), "activation"),
    (dict(axes=[2], activation=("relu", 1.0)), "activation"),
    (dict(axes=[2], activation="linear"), "activation"),
    (dict(axes=[2], activation=("linear", 1.0)), "activation"),
    (dict(axes=[2], activation=("elu", 1.0, 2.0)), "activation"),
    (dict(axes=[2], activation=("elu", "a")), "activation"),
    (dict(axes=[2], activation=("elu", np.inf)), "activation"),
    (dict(axes=[2], activation=3), "activation"),
    (dict(axes=[2], activation=("softplus", 0.5)), "activation"),
    (dict(axes=[2], activation=("celu", 0.0)), "activation"),
    (dict(axes=[2], compute_dtype="float16"), "compute_dtype"),
    (dict(axes=[2], compute_dtype=np.float64), "compute_dtype"),
    (dict(axes=[2], eps=-1.0), "eps"),
    (dict(axes=[2], eps=np.nan), "eps"),
    (dict(axes=[2], eps="small"), "eps"),
    (dict(axes=[2], normalize_variance=1), "normalize_variance"),
]


@pytest.mark.parametrize("kwargs,field", BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD)])
def test_bad_arguments_raise_value_error_naming_the_field(kwargs, field):
    kwargs = dict(kwargs)
    scale, bias = kwargs.pop("scale", None), kwargs.pop("bias", None)
    with pytest.raises(ValueError) as err:
        tn.normalize(X4, scale, bias, **kwargs)
    assert err.value.argument == field, str(err.value)
    assert str(err.value).startswith(f"{field}: ")


@pytest.mark.parametrize(
    "x,why",
    [
        (np.zeros((2, 3), np.float64), "dtype"),
        (np.zeros((2, 3), np.int32), "dtype"),
        (np.zeros(3, bool), "dtype"),
        (np.float32(1.0), "rank 0"),
        (np.zeros((1,) * 9, np.float32), "rank 9"),
        ("abc", "not numeric"),
    ],
)
def test_bad_inputs_raise_value_error(x, why):
    with pytest.raises(ValueError) as err:
        tn.normalize(x, axes=[0])
    assert err.value.argument == "x", why


def test_group_norm_needs_rank_two():
    with pytest.raises(ValueError) as err:
        tn.normalize(np.zeros(4, np.float32), axes=[0], num_groups=2)
    assert err.value.argument == "num_groups"


def test_accepted_limits(rng):
    x = rng.normal(size=(2,) * 8).astype(np.float32)
    check(tn.normalize(x, axes=0xFF), x, None, None, list(range(8)))
    check(tn.normalize(x, axes=[0, 2, 4, 6]), x, None, None, [0, 2, 4, 6])
    assert tn.normalize(x, axes=[1], compute_dtype="float32").shape == x.shape
    assert tn.normalize(x, axes=[1], compute_dtype=np.float32).shape == x.shape


# ---- Identical bits on every ISA level ----------------------------------------------------

ISA_SCRIPT = """
import ml_dtypes
for key in sorted(k for k in inputs if k.endswith("_x")):
    name = key[:-2]
    x = inputs[key]
    if int(inputs[name + "_bf16"]):
        x = x.view(ml_dtypes.bfloat16)
    s = inputs.get(name + "_s")
    axes = [int(a) for a in inputs[name + "_axes"]]
    act = str(inputs[name + "_act"]) or None
    eps = float(inputs[name + "_eps"]) if name + "_eps" in inputs else 1e-5
    y = tn.normalize(x, s, None, axes=axes, num_groups=int(inputs[name + "_g"]), activation=act, eps=eps)
    outputs[name] = y.view(np.uint32 if y.dtype.itemsize == 4 else np.uint16)
"""


def isa_inputs():
    rng = np.random.default_rng(20261122)
    inputs = {}
    shapes = [
        ((5, 67), [1], 1),
        ((3, 33, 17), [1], 1),
        ((2, 8, 15, 3), [2, 3], 4),
        ((4, 17, 9), [0, 2], 1),
        ((2, 16, 31), [2], 1),
        ((3, 5, 2, 7), [0, 1, 3], 1),
        ((2, 64, 49), [2], 8),
        ((1, 3, 300), [0], 1),
        ((9, 61447), [1], 1),
    ]  # 2.1 MiB in fp32: the prefetch cursor to the end
    acts = [""] + list(tn.ACTIVATIONS)
    i = 0
    for dtype in DTYPES.values():
        for j, (shape, axes, groups) in enumerate(shapes):
            for act in acts[j % 3 :: 3]:
                if act in ("linear", "parametric_softplus"):
                    continue
                x = rng.normal(0.2, 2.0, shape).astype(np.float32)
                if i % 4 == 0:
                    x.reshape(-1)[[1, -2]] = [np.nan, np.inf]
                x = x.astype(dtype)
                key = f"n{i:03d}"
                inputs[key + "_x"] = x.view(np.uint16) if dtype == BF16 else x
                inputs[key + "_bf16"] = np.array(dtype == BF16)
                inputs[key + "_s"] = rng.uniform(-3, 3, shape[-1]).astype(np.float32)
                inputs[key + "_axes"] = np.array(axes)
                inputs[key + "_g"] = np.array(groups)
                inputs[key + "_act"] = np.array(act)
                i += 1
    # Rows (and column positions) at the float32 extremes: constant, huge, tiny, an outlier
    # first value (the second statistics pass), NaN; with eps 1e-5 and 0.
    for dtype in (np.float32, BF16):
        for shape, axes in (((8, 200), [1]), ((2, 8, 33), [1])):
            x = rng.normal(0.2, 2.0, (8, 200)).astype(np.float32)
            x[1] = -1700.0
            x[2] *= np.float32(1e20)
            x[3] = np.float32(-3.3e38) + np.float32(1e36) * x[3]
            x[4] *= np.float32(1e-30)
            x[5, 0] = 1e4
            x[6] = 0.1
            x[7, 5] = np.nan
            x = (
                np.ascontiguousarray(x.reshape(8, 2, 100).transpose(1, 0, 2)).reshape(2, 8, 100)[:, :, :33]
                if len(shape) == 3
                else x
            )
            x = x.astype(dtype)
            for eps in (1e-5, 0.0):
                key = f"n{i:03d}"
                inputs[key + "_x"] = x.view(np.uint16) if dtype == BF16 else x
                inputs[key + "_bf16"] = np.array(dtype == BF16)
                inputs[key + "_s"] = rng.uniform(-3, 3, shape[-1]).astype(np.float32)
                inputs[key + "_axes"] = np.array(axes)
                inputs[key + "_g"] = np.array(1)
                inputs[key + "_act"] = np.array("")
                inputs[key + "_eps"] = np.array(eps)
                i += 1
    return inputs


@pytest.mark.level_independent  # runs the two levels it compares
@pytest.mark.parametrize("a,b", [("scalar", "avx2"), ("scalar", "avx512"), ("avx2", "avx512")])
def test_identical_across_isa_levels(isa_runner, a, b):
    inputs = isa_inputs()
    ya = isa_runner.run("gnorm", a, ISA_SCRIPT, inputs)
    yb = isa_runner.run("gnorm", b, ISA_SCRIPT, inputs)
    assert ya.keys() == yb.keys() and len(ya) > 40
    for name in sorted(ya):
        assert_same_bits(yb[name], ya[name], what=f"{name} at {b} vs {a}")


# ---- Direct C calls: memory outside the tensors is never touched ----------------------------


def direct_cases():
    """(name, x, scale, bias, kwargs) whose plans need no expansion or transposition: the
    C call sees exactly the user's arrays."""
    rng = np.random.default_rng(11)
    out = []
    for dname, dtype in DTYPES.items():
        for shape, axes, groups, sshape, bshape in [
            ((3, 17), [1], 1, (17,), None),
            ((5, 7), [1], 1, None, (5, 1)),
            ((2, 8, 4, 5), [2, 3], 4, (1, 8, 1, 1), (1, 4, 1, 1)),
            ((2, 33, 9), [1], 1, (33, 1), (9,)),
            ((1, 17, 31), [1], 1, (1, 17, 31), None),
            ((4, 3, 16), [0], 1, (4, 1, 1), (3, 16)),
            ((1, 1), [0, 1], 1, (1,), (1, 1)),
            ((6, 64), [1], 1, (64,), (6, 1)),
        ]:
            x = rng.normal(size=shape).astype(dtype)
            s = None if sshape is None else rng.uniform(-2, 2, sshape).astype(np.float32)
            b = None if bshape is None else rng.uniform(-1, 1, bshape).astype(np.float32)
            out.append((f"{dname}-{shape}-{axes}", x, s, b, dict(axes=axes, num_groups=groups, activation="elu")))
    # outputs of 2 MiB or more: the prefetch cursor up to the last row
    for dname, shape in (("fp32", (9, 61447)), ("bf16", (3, 6, 61447))):
        x = rng.normal(size=shape).astype(DTYPES[dname])
        s = rng.uniform(-2, 2, shape[-1:]).astype(np.float32)
        out.append((f"{dname}-{shape}-large", x, s, None, dict(axes=[-1], num_groups=1, activation="elu")))
    return out


def plan_of(x, s, b, kwargs):
    groups = kwargs.get("num_groups", 1)
    reduced = frozenset(a % x.ndim for a in kwargs["axes"])
    pshapes = tuple(None if p is None else _normalize._parameter(p, "p", x.shape, groups).shape for p in (s, b))
    return _normalize._plan(x.shape, reduced, groups, pshapes)


TYPE_CODES = {np.dtype(np.float32): 0, BF16: 7, F16: 8}


def c_normalize(plan, dtype, x, params, dst, activation="elu"):
    """Call the plan's kernel on the given memory (x, dst: arrays of raw elements; params:
    arrays or None) for data of `dtype`."""
    norm = ffi.new("TnNormalization *")
    norm.type = TYPE_CODES[np.dtype(dtype)]
    norm.eps = 1e-5
    norm.normalizeVariance = 1
    norm.activation, norm.activationParams = _normalize.activation_spec(activation)
    keep = []
    for arr, spec, c in zip(params, plan.params, (norm.scale, norm.bias), strict=True):
        if arr is not None:
            assert spec[0] is None
            _, c.period, c.outerStride, c.stride, c.step = spec
            c.data = p = ffi.from_buffer("float[]", arr)
            keep.append(p)
    kernel = lib.TnNormalizationRows if plan.rows else lib.TnNormalizationColumns
    kernel(ffi.from_buffer(x), *plan.dims, norm, ffi.from_buffer(dst))


def test_c_calls_stay_inside_guarded_memory():
    for name, x, s, b, kw in direct_cases():
        plan = plan_of(x, s, b, kw)
        assert plan.transpose is None
        raw = x.view(np.uint16) if x.dtype.itemsize == 2 else x
        gx = Guarded(raw)
        gp = [None if p is None else Guarded(_normalize._parameter(p, "p", x.shape, kw["num_groups"])) for p in (s, b)]
        gy = Guarded(shape=x.shape, dtype=raw.dtype)
        c_normalize(plan, x.dtype, gx.arr, [None if g is None else g.arr for g in gp], gy.arr)
        gx.assert_unchanged(f"{name} x")
        for g in gp:
            if g is not None:
                g.assert_unchanged(f"{name} parameter")
        gy.assert_guards(f"{name} y")
        gy.assert_no_poison_left(f"{name} y")
        assert_same_bits(gy.arr, tn.normalize(x, s, b, **kw).view(raw.dtype), what=name)


GUARD_SCRIPT = """
import numpy as np, tensorops_native as tn, test_gnorm as t
from guard_page_probe import fenced
for name, x, s, b, kw in t.direct_cases():
    plan = t.plan_of(x, s, b, kw)
    raw = x.view(np.uint16) if x.dtype.itemsize == 2 else x
    want = tn.normalize(x, s, b, **kw).view(raw.dtype)
    params = [None if p is None else tn._normalize._parameter(p, "p", x.shape, kw["num_groups"]) for p in (s, b)]
    for where in ("tail", "head"):
        print(name, where, flush=True)
        fx = fenced(raw, where)
        fp = [None if p is None else fenced(p, where) for p in params]
        fy = fenced(np.zeros_like(raw), where)
        t.c_normalize(plan, x.dtype, fx, fp, fy)
        assert np.array_equal(fy.view(np.uint8), want.view(np.uint8)), name
print("OK", flush=True)
"""


def test_c_calls_stay_inside_guard_pages(isolated):
    proc = isolated(GUARD_SCRIPT, memory_limit=None, TENSOROPS_ISA=tn.isa())
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines and lines[-1] == "OK", (
        f"crashed or failed ({proc.returncode}) after '{lines[-1] if lines else '?'}':\n{proc.stderr[-2000:]}"
    )
