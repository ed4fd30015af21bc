"""Helpers of the native test suite: shape grids, tolerance checks with readable failure
reports, BF16 "bit-exact where the math allows" checks, the unary accuracy rules of
docs/kernels.md, and direct C calls with canary-guarded memory.

Tolerances: u = 2^-24 is the unit roundoff of fp32. A float64 reference differs from an
fp32 kernel only by the kernel's own rounding, so every bound below is a multiple of u or of
the rounding-error growth of an fp32 sum (see sum_rtol).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from tensorops_native._native import ffi, lib

import reference as ref
import tensorops_native as tn
from tensorops_native._info import ISA_NAMES

U = 2.0**-24  # fp32 unit roundoff
F32_TINY = 2.0**-149  # the smallest fp32 denormal: spacing of the denormal range
F32_MAX = float(np.finfo(np.float32).max)

# Shapes around the vector widths (8 lanes AVX2, 16 lanes AVX-512) and their tails.
CHANNELS = (1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 64, 67)
SPATIALS = (1, 5, 16, 49, 3136)
BATCHES = (1, 3)
# Spatial sizes as spatial dimensions: one or two of them, like real images.
SPATIAL_DIMS = {1: (1, 1), 5: (5,), 16: (4, 4), 49: (7, 7), 3136: (56, 56)}
FORMATS = ("nchw", "nhwc")
FMT_CODE = {"nchw": 0, "nhwc": 1}
LEVELS = ISA_NAMES  # scalar, avx2, avx512


def random_bits(rng, shape):
    """Random fp32 bit patterns: every exponent, denormals, infinities and NaN payloads."""
    return rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32).view(np.float32)


def kernel_levels() -> list[str]:
    """The levels a kernel test runs at: the one TENSOROPS_ISA asks for, else every level
    this CPU supports."""
    if os.environ.get("TENSOROPS_ISA"):
        return [tn.isa()]
    return list(LEVELS[: lib.TnSupportedIsa() + 1])


def checkerboard_batch(i: int, j: int) -> int:
    """Batch size for grid cell (i, j): both sizes appear in every row and column of a
    channels x spatial grid at half the cost of running both everywhere."""
    return BATCHES[(i + j) % 2]


def image_shape(batch: int, channels: int, spatial: int, fmt: str) -> tuple[int, ...]:
    dims = SPATIAL_DIMS.get(spatial, (spatial,))
    return (batch, channels, *dims) if fmt == "nchw" else (batch, *dims, channels)


def sum_rtol(n: int) -> float:
    """Relative error (to the sum of magnitudes) allowed for an fp32 sum of n terms. The
    rounding error of a sequential fp32 sum behaves like a random walk of standard
    deviation about u * sqrt(n / 3) relative to the running magnitudes; 2e-7 * sqrt(n) is
    about 6 of them. The worst case n * u would be too loose to catch a dropped element."""
    return 2e-7 * math.sqrt(max(n, 1))


# ---- kernel availability ------------------------------------------------------------------


def require(*kernels: str) -> None:
    """Fail before calling a kernel this build lacks (calling it would crash the process
    instead of reporting which kernel is missing)."""
    report = tn.kernels()
    missing = [k for k in kernels if report.get(k, "missing") == "missing"]
    if missing:
        pytest.fail(f"kernel missing from this build: {', '.join(missing)}")


# ---- value checks -------------------------------------------------------------------------


def _fmt_index(shape, flat):
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def assert_close(actual, expected, *, rtol, atol, what="result", show=5):
    """|actual - expected| <= atol + rtol * |expected| elementwise (rtol and atol may be
    arrays broadcastable to the shape); NaN exactly where expected is NaN; infinities
    equal. The failure message lists the worst elements."""
    actual = np.asarray(actual)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != expected {expected.shape}"
    a = actual.astype(np.float64) if actual.dtype != ref.BF16 else ref.as_f64(actual)
    with np.errstate(invalid="ignore", over="ignore"):
        tol = np.broadcast_to(np.asarray(atol, np.float64) + np.asarray(rtol, np.float64) * np.abs(expected), a.shape)
        err = np.abs(a - expected)
        nan_a, nan_e = np.isnan(a), np.isnan(expected)
        inf_e = np.isinf(expected)
        bad = (nan_a != nan_e) | (inf_e & (a != expected)) | (~nan_e & ~inf_e & ~(err <= tol))
    if bad.any():
        idx = np.flatnonzero(bad)
        ratio = np.where(bad, np.nan_to_num(err / np.where(tol > 0, tol, 1e-300), nan=np.inf, posinf=np.inf), 0).ravel()
        worst = idx[np.argsort(-ratio[idx])][:show]
        lines = [
            f"  at {_fmt_index(a.shape, i)}: got {a.ravel()[i]!r}, expected {expected.ravel()[i]!r}, "
            f"allowed error {tol.ravel()[i]:.3g}"
            for i in worst
        ]
        pytest.fail(
            f"{what}: {idx.size} of {a.size} elements out of tolerance "
            f"(rtol={np.max(rtol):.3g}, atol={np.max(atol):.3g}):\n" + "\n".join(lines)
        )


def assert_same_bits(actual, expected, what="result", show=5):
    """Bit-for-bit equality (NaN payloads and signed zeros included)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype.itemsize == expected.dtype.itemsize, f"{what}: dtype {actual.dtype} vs {expected.dtype}"
    utype = {2: np.uint16, 4: np.uint32, 8: np.uint64}[actual.dtype.itemsize]
    ab, eb = actual.view(utype), expected.view(utype)
    bad = ab != eb
    if bad.any():
        idx = np.flatnonzero(bad)[:show]
        width = 2 * actual.dtype.itemsize
        lines = [
            f"  at {_fmt_index(actual.shape, i)}: got 0x{int(ab.ravel()[i]):0{width}x}, "
            f"expected 0x{int(eb.ravel()[i]):0{width}x}"
            for i in idx
        ]
        pytest.fail(f"{what}: {int(bad.sum())} of {actual.size} elements differ bitwise:\n" + "\n".join(lines))


def assert_bf16_where_math_allows(actual, exact, *, rtol, atol, what="BF16 result", min_exact=0.9):
    """A BF16 kernel output against the exact (float64) result.

    The expected bits are those of rounding `exact` to fp32, then to BF16. The kernel's own
    fp32 value may differ from exact by up to atol + rtol * |exact| (the op's fp32
    tolerance, plus 4 fp32 ulps); wherever that interval holds no BF16 rounding boundary,
    the output must be exactly the expected bits. Where it does (the interval rounds to two
    BF16 values), the output must be one of those two, i.e. within 1 BF16 ulp. NaN must be
    NaN (payload not compared here; the cross-ISA test compares NaN bits). At least
    `min_exact` of the elements must be in the exact class, so the check cannot go vacuous.
    """
    bits = ref.bf16_bits(np.asarray(actual))
    exact = np.asarray(exact, np.float64)
    assert bits.shape == exact.shape, f"{what}: shape {bits.shape} != {exact.shape}"
    expected = ref.f64_to_bf16_bits(exact)
    with np.errstate(invalid="ignore", over="ignore"):
        e32 = exact.astype(np.float32)
        tol = (
            np.asarray(atol, np.float64)
            + np.asarray(rtol, np.float64) * np.abs(exact)
            + 4.0 * np.spacing(np.abs(e32)).astype(np.float64)
        )
        lo_bits = ref.f64_to_bf16_bits(exact - tol)
        hi_bits = ref.f64_to_bf16_bits(exact + tol)
    got = ref.bf16_to_f64(bits)
    lo, hi = ref.bf16_to_f64(lo_bits), ref.bf16_to_f64(hi_bits)
    nan_e = np.isnan(exact)
    finite = ~nan_e
    unambiguous = finite & (lo_bits == hi_bits)
    zero = finite & ~unambiguous & (lo == 0) & (hi == 0)  # only the sign of a zero is open
    ambiguous = finite & ~unambiguous & ~zero
    bad = (
        (nan_e & ~np.isnan(got))
        | (unambiguous & (bits != expected))
        | (zero & (got != 0))
        | (ambiguous & ~((got >= lo) & (got <= hi)))
    )
    if bad.any():
        idx = np.flatnonzero(bad)[:5]
        lines = [
            f"  at {_fmt_index(bits.shape, i)}: got 0x{int(bits.ravel()[i]):04x} ({got.ravel()[i]!r}), "
            f"expected 0x{int(expected.ravel()[i]):04x} (exact {exact.ravel()[i]!r}, "
            f"{'within 1 BF16 ulp allowed' if ambiguous.ravel()[i] else 'bit-exact required'})"
            for i in idx
        ]
        pytest.fail(f"{what}: {int(bad.sum())} of {bits.size} elements wrong:\n" + "\n".join(lines))
    if finite.sum() >= 20:
        share = (unambiguous.sum() + zero.sum()) / finite.sum()
        assert share >= min_exact, (
            f"{what}: only {share:.1%} of elements could be checked bit-exactly (tolerance too loose?)"
        )


# ---- inputs are never modified ------------------------------------------------------------


def _arrays(obj):
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _arrays(o)


def call_preserving(fn, *args, **kwargs):
    """Call fn and assert it modified none of the arrays among its arguments (bitwise)."""
    arrays = list(_arrays(list(args) + list(kwargs.values())))
    copies = [a.copy() for a in arrays]
    result = fn(*args, **kwargs)
    for i, (a, c) in enumerate(zip(arrays, copies, strict=True)):
        assert_same_bits(a, c, what=f"input array #{i} after {getattr(fn, '__name__', fn)}")
    return result


# ---- random data ------------------------------------------------------------------------


def f32(rng, shape, loc=0.0, scale=1.0):
    return rng.normal(loc, scale, size=shape).astype(np.float32)


def bf16(rng, shape, loc=0.0, scale=1.0):
    return rng.normal(loc, scale, size=shape).astype(np.float32).astype(ref.BF16)


def params(rng, channels):
    """Per-channel scale (magnitudes 0.5..1.5, both signs) and shift in [-1, 1], fp32."""
    scale = (rng.uniform(0.5, 1.5, channels) * rng.choice([-1.0, 1.0], channels)).astype(np.float32)
    shift = rng.uniform(-1.0, 1.0, channels).astype(np.float32)
    return scale, shift


# ---- unary accuracy rules (docs/kernels.md) -----------------------------------------------------

UNARY_OPS = ref.UNARY_NAMES
BITWISE_OPS = ("abs", "neg", "not", "zero")  # compared bit for bit, NaN included
IEEE_EXACT_OPS = ("ceil", "floor", "round", "sqrt", "rcp")  # bit for bit except NaN payloads
EXACT_OPS = BITWISE_OPS + IEEE_EXACT_OPS + ("sign",)
# rtol / atol of the table; atol_min is the fp32 denormal spacing (a relative bound cannot
# hold below it); xmax limits where a bound applies.
UNARY_BOUNDS = {
    "exp": dict(rtol=4e-7, atol=F32_TINY),
    "log": dict(rtol=4e-7, atol=1e-7),  # max(): the absolute bound only matters near x = 1
    "tanh": dict(rtol=4e-7, atol=F32_TINY),
    "rsqrt": dict(rtol=2.0**-22, atol=F32_TINY),
    "erf": dict(rtol=0.0, atol=1e-6),
    "sin": dict(rtol=0.0, atol=2e-6),
    "cos": dict(rtol=0.0, atol=2e-6),
}
SPECIAL_VALUES = np.array(
    [
        0.0,
        -0.0,
        np.inf,
        -np.inf,
        np.nan,
        1e-45,
        -1e-45,
        F32_MAX,
        -F32_MAX,
        1.0,
        -1.0,
        0.5,
        -0.5,
        1.5,
        -1.5,
        2.5,
        -2.5,
        1.1754944e-38,
        8388607.5,
        8388608.0,
        16777217.0,
        -8388609.5,
        88.72284,
        88.7,
        -87.3,
        -103.9,
        -104.5,
        3.14159265,
        1.5707964,
        1e5,
        -1e5,
        4.0,
        0.25,
    ],
    np.float32,
)


def unary_tolerance(op, ref64):
    b = UNARY_BOUNDS[op]
    if op == "log":
        return np.maximum(b["rtol"] * np.abs(ref64), b["atol"])
    return b["atol"] + b["rtol"] * np.abs(ref64)


def unary_checked_mask(op, x):
    """Elements the accuracy rule covers: all, unless the op's bound sets an xmax."""
    x = np.asarray(x, np.float32)
    xmax = UNARY_BOUNDS.get(op, {}).get("xmax")
    if xmax is None:
        return np.ones(x.shape, bool)
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(x) | (np.abs(x) <= xmax)


def unary_violations(op, x, y):
    """Boolean mask of the elements of y = unary(x, op) that break the docs/kernels.md rule,
    and the float64 reference used."""
    x = np.asarray(x, np.float32)
    y = np.asarray(y, np.float32)
    if op in BITWISE_OPS:
        exp_bits = ref.unary_bitwise_f32(x, op).view(np.uint32)
        with np.errstate(invalid="ignore"):
            return y.view(np.uint32) != exp_bits, exp_bits.view(np.float32).astype(np.float64)
    r = ref.synet_unary_operation_32f(x, op)
    with np.errstate(invalid="ignore", over="ignore"):
        y64 = y.astype(np.float64)
        nan_r, nan_y = np.isnan(r), np.isnan(y64)
        if op in IEEE_EXACT_OPS:
            same = r.astype(np.float32).view(np.uint32) == y.view(np.uint32)
            return (nan_r != nan_y) | (~nan_r & ~same), r
        if op == "sign":
            return (nan_r != nan_y) | (~nan_r & (y64 != r)), r
        tol = unary_tolerance(op, r)
        err = np.abs(y64 - r)
        inf_r = np.isinf(r)
        near_overflow = (
            ~inf_r
            & (np.abs(r) >= F32_MAX * (1.0 - UNARY_BOUNDS[op]["rtol"]))
            & np.isinf(y64)
            & (np.sign(y64) == np.sign(r))
        )
        ok = (nan_r & nan_y) | (inf_r & (y64 == r)) | (~nan_r & ~inf_r & (err <= tol)) | near_overflow
        return ~ok & unary_checked_mask(op, x), r


def assert_unary_accurate(op, x, y, what=None):
    bad, r = unary_violations(op, x, y)
    if bad.any():
        idx = np.flatnonzero(bad)
        x32 = np.asarray(x, np.float32).ravel()
        y32 = np.asarray(y, np.float32).ravel()
        lines = [
            f"  x={x32[i]!r} (0x{int(x32[i : i + 1].view(np.uint32)[0]):08x}): got {y32[i]!r} "
            f"(0x{int(y32[i : i + 1].view(np.uint32)[0]):08x}), reference {r.ravel()[i]!r}"
            for i in idx[:6]
        ]
        pytest.fail(
            f"{what or op}: {idx.size} of {x32.size} results break the docs/kernels.md bound:\n" + "\n".join(lines)
        )


def unary_inputs(op, rng, n=1 << 20):
    """n inputs for op: a quarter random fp32 bit patterns (every exponent, denormals, inf,
    NaN), a quarter log-uniform magnitudes of both signs over the whole fp32 range, half from
    the op's meaningful ranges; the special values come first."""
    q = n // 4
    bits = rng.integers(0, 2**32, size=q, dtype=np.uint64).astype(np.uint32).view(np.float32)
    logu = (np.exp2(rng.uniform(-149.0, 128.0, q)) * rng.choice([-1.0, 1.0], q)).astype(np.float32)
    h = n - 2 * q

    def uni(lo, hi, k):
        return rng.uniform(lo, hi, k)

    k = h // 4
    if op == "exp":
        parts = [uni(-104.0, 89.0, 2 * k), uni(-5.0, 5.0, k), uni(-1e-3, 1e-3, h - 3 * k)]
    elif op == "log":
        parts = [uni(0.0, 4.0, 2 * k), 1.0 + uni(-0.02, 0.02, k), np.exp2(uni(-149.0, 128.0, h - 3 * k))]
    elif op in ("sin", "cos"):
        # plus near multiples of pi/2, where the argument reduction is hardest
        r = h - 3 * k
        near = rng.integers(-63000, 63000, r) * (np.pi / 2) * (1.0 + uni(-1e-7, 1e-7, r))
        parts = [uni(-1e5, 1e5, k), uni(-10.0, 10.0, k), rng.integers(-63000, 63000, k) * (np.pi / 2), near]
    elif op == "tanh":
        parts = [
            uni(-12.0, 12.0, 2 * k),
            uni(-1.0, 1.0, k),
            np.exp2(uni(-149.0, -1.0, h - 3 * k)) * rng.choice([-1.0, 1.0], h - 3 * k),
        ]
    elif op == "erf":
        parts = [
            uni(-6.0, 6.0, 2 * k),
            uni(-1.0, 1.0, k),
            np.exp2(uni(-149.0, 0.0, h - 3 * k)) * rng.choice([-1.0, 1.0], h - 3 * k),
        ]
    elif op in ("rsqrt", "sqrt", "rcp"):
        parts = [uni(0.0, 16.0, 2 * k), np.exp2(uni(-149.0, 128.0, k)), -np.exp2(uni(-149.0, 128.0, h - 3 * k))]
    else:  # abs, neg, not, zero, sign, ceil, floor, round: halves (ties), small and large
        halves = rng.integers(-(2**24), 2**24, k) + 0.5
        parts = [uni(-10.0, 10.0, k), halves, uni(-(2.0**24), 2.0**24, k), uni(-1e30, 1e30, h - 3 * k)]
    with np.errstate(over="ignore"):
        mixed = np.concatenate([np.asarray(p, np.float64).astype(np.float32) for p in parts])
    x = np.concatenate([SPECIAL_VALUES, bits, logu, mixed[:h]])
    return x


# ---- direct C calls with canary-guarded memory -------------------------------------------

GUARD = 17  # odd: also leaves the data misaligned for vector loads
CANARY = {
    np.dtype(np.float32): np.uint32(0x7FA5A5A5),  # signalling NaNs: never computed
    np.dtype(np.uint16): np.uint16(0x7FA5),
}
POISON = {
    np.dtype(np.float32): np.uint32(0x7FC0DEAD),  # quiet NaN with a payload
    np.dtype(np.uint16): np.uint16(0xFFFF),
}


class Guarded:
    """A contiguous array (`.arr`) with GUARD canary elements on each side."""

    def __init__(self, values=None, *, shape=None, dtype=np.float32, fill="poison"):
        if values is not None:
            values = np.asarray(values)
            dtype, shape = values.dtype, values.shape
        dtype = np.dtype(dtype)
        if dtype == ref.BF16:
            dtype = np.dtype(np.uint16)
            values = None if values is None else values.view(np.uint16)
        self.dtype = dtype
        n = math.prod(shape)
        utype = np.uint32 if dtype.itemsize == 4 else np.uint16
        self.full = np.empty(n + 2 * GUARD, dtype)
        self.full.view(utype)[:] = CANARY[dtype]
        self.arr = self.full[GUARD : GUARD + n].reshape(shape)
        if values is not None:
            self.arr[...] = values
        elif fill == "poison":
            self.arr.view(utype)[...] = POISON[dtype]
        self.original = self.arr.copy()

    @property
    def bits(self):
        return self.arr.view(np.uint32 if self.dtype.itemsize == 4 else np.uint16)

    def assert_guards(self, what):
        utype = np.uint32 if self.dtype.itemsize == 4 else np.uint16
        full = self.full.view(utype)
        before, after = full[:GUARD], full[-GUARD:]
        assert (before == CANARY[self.dtype]).all(), f"{what}: wrote before the start of the array"
        assert (after == CANARY[self.dtype]).all(), f"{what}: wrote past the end of the array"

    def assert_unchanged(self, what):
        self.assert_guards(what)
        assert_same_bits(self.arr, self.original, what=f"{what} (an input) was modified")

    def assert_no_poison_left(self, what):
        """Every element was written: no poison pattern remains (outputs that legitimately
        are NaN never carry this payload)."""
        left = self.bits == POISON[self.dtype]
        assert not left.any(), f"{what}: {int(left.sum())} of {left.size} elements never written"


def c_call(kernel: str, *args):
    """Call lib.Tn<kernel> with NumPy arrays (float32 / uint16 -> pointers), Guarded
    objects, None (NULL), lists of arrays (pointer arrays) and plain integers."""
    keep = []

    def conv(a):
        if a is None:
            return ffi.NULL
        if isinstance(a, Guarded):
            a = a.arr
        if isinstance(a, np.ndarray):
            ctype = {np.dtype(np.float32): "float[]", np.dtype(np.uint16): "uint16_t[]"}[a.dtype]
            p = ffi.from_buffer(ctype, a)
            keep.append(p)
            return p
        if isinstance(a, list):
            p = ffi.new("float *[]", [conv(b) for b in a])
            keep.append(p)
            return p
        return a

    getattr(lib, "Tn" + kernel)(*[conv(a) for a in args])


def scratch_floats(kernel: str, fmt: str, channels: int, spatial: int, across: bool = False) -> int:
    """The largest scratch a kernel may need (docs/kernels.md and the seeds): spatial floats for
    L2 in NCHW without acrossSpatial and for V2 in NCHW; channels for V3 in NHWC, V4 and
    16bV2; none otherwise."""
    if kernel == "SynetNormalizeLayerForward":
        return spatial if fmt == "nchw" and not across else 0
    if kernel == "SynetNormalizeLayerForwardV2":
        return spatial if fmt == "nchw" else 0
    if kernel == "SynetNormalizeLayerForwardV3":
        return channels if fmt == "nhwc" else 0
    if kernel in ("SynetNormalizeLayerForwardV4", "SynetNormalizeLayerForward16bV2"):
        return channels
    raise ValueError(kernel)
