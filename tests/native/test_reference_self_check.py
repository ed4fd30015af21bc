"""The references themselves: each vectorized reference against a literal, loop-by-loop
transcription of its seed's pseudo-code (float64, tiny shapes), so an error in reference.py
cannot silently agree with an error in a kernel. No kernel is called here."""

import math

import numpy as np
import pytest

import reference as ref
from tn_testing import SPECIAL_VALUES, UNARY_OPS, unary_checked_mask, unary_inputs, unary_tolerance, unary_violations

# No kernel runs here: run once, at the process's level.
pytestmark = pytest.mark.level_independent


def seed_l2_nhwc(src, scale, eps, across):
    b_, s_, c_ = src.shape
    dst = np.empty_like(src)
    for b in range(b_):
        if across:
            total = sum(src[b, s, c] ** 2 for s in range(s_) for c in range(c_))
        for s in range(s_):
            if not across:
                total = 0.0
                for c in range(c_):
                    total += src[b, s, c] ** 2
            for c in range(c_):
                dst[b, s, c] = src[b, s, c] * scale[c] / math.sqrt(total + eps)
    return dst


def seed_v2_nhwc(src, scale, shift, eps):
    b_, s_, c_ = src.shape
    dst = np.empty_like(src)
    for b in range(b_):
        for s in range(s_):
            total = 0.0
            for c in range(c_):
                total += src[b, s, c]
            mean = total / c_
            for c in range(c_):
                dst[b, s, c] = src[b, s, c] - mean
            sqsum = 0.0
            for c in range(c_):
                sqsum += dst[b, s, c] ** 2
            norm = 1 / math.sqrt(sqsum / c_ + eps)
            for c in range(c_):
                dst[b, s, c] = dst[b, s, c] * norm * scale[c] + shift[c]
    return dst


def seed_v3_nchw(src, scale, shift, eps):
    b_, c_, s_ = src.shape
    dst = np.empty_like(src)
    for b in range(b_):
        for c in range(c_):
            total = 0.0
            for s in range(s_):
                total += src[b, c, s]
            mean = total / s_
            for s in range(s_):
                dst[b, c, s] = src[b, c, s] - mean
            sqsum = 0.0
            for s in range(s_):
                sqsum += dst[b, c, s] ** 2
            norm = 1 / math.sqrt(sqsum / s_ + eps)
            for s in range(s_):
                dst[b, c, s] = dst[b, c, s] * norm * scale[c] + shift[c]
    return dst


def seed_v4_nchw(src, scale, shift, eps):
    b_, c_, s_ = src.shape
    dst = np.empty_like(src)
    buf = [0.0] * c_
    for b in range(b_):
        total = 0.0
        for c in range(c_):
            sqsum = 0.0
            for s in range(s_):
                sqsum += src[b, c, s] ** 2
            buf[c] = math.sqrt(sqsum)
            total += buf[c]
        norm = 1 / (total / c_ + eps)
        for c in range(c_):
            buf[c] = 1 + scale[c] * buf[c] * norm
            for s in range(s_):
                dst[b, c, s] = src[b, c, s] * buf[c] + shift[c]
    return dst


@pytest.mark.parametrize("across", [False, True])
def test_l2_reference_matches_seed_loops(rng, across):
    x = rng.normal(size=(2, 5, 3))  # NHWC (b, s, c)
    scale = rng.normal(size=3)
    want = seed_l2_nhwc(x, scale, 1e-3, across)
    got = ref.synet_normalize_layer_forward(x.transpose(0, 2, 1), scale, 1e-3, across).transpose(0, 2, 1)
    np.testing.assert_allclose(got, want, rtol=1e-13)


def test_v2_reference_matches_seed_loops(rng):
    x = rng.normal(size=(2, 4, 5)) + 0.5
    scale, shift = rng.normal(size=5), rng.normal(size=5)
    want = seed_v2_nhwc(x, scale, shift, 1e-2)
    got = ref.synet_normalize_layer_forward_v2(x.transpose(0, 2, 1), scale, shift, 1e-2).transpose(0, 2, 1)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


def test_v3_reference_matches_seed_loops(rng):
    x = rng.normal(size=(2, 3, 7)) - 0.3
    scale, shift = rng.normal(size=3), rng.normal(size=3)
    np.testing.assert_allclose(
        ref.synet_normalize_layer_forward_v3(x, scale, shift, 1e-2),
        seed_v3_nchw(x, scale, shift, 1e-2),
        rtol=1e-12,
        atol=1e-13,
    )


def test_v4_reference_matches_seed_loops(rng):
    x = rng.normal(size=(2, 3, 7))
    scale, shift = rng.normal(size=3), rng.normal(size=3)
    np.testing.assert_allclose(
        ref.synet_normalize_layer_forward_v4(x, scale, shift, 1e-2),
        seed_v4_nchw(x, scale, shift, 1e-2),
        rtol=1e-12,
        atol=1e-13,
    )


def test_bcs_round_trip_both_formats(rng):
    x = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
    for fmt in ("nchw", "nhwc"):
        bcs = ref.to_bcs(x, fmt)
        assert bcs.shape == ((2, 3, 20) if fmt == "nchw" else (2, 5, 12))
        np.testing.assert_array_equal(ref.from_bcs(bcs, x.shape, fmt), x)
    # NHWC: channel c of spatial position (h, w) is x[b, h, w, c]
    assert ref.to_bcs(x, "nhwc")[1, 2, 2 * 4 + 1] == x[1, 2, 1, 2]


def test_channel_sum_reference_matches_seed_loops(rng):
    x = rng.normal(size=(3, 6)).astype(np.float32).astype(ref.BF16)  # (channels, spatial), NCHW
    want = [sum(float(x[c, s]) for s in range(6)) for c in range(3)]
    np.testing.assert_allclose(ref.synet_channel_sum_16b(ref.bf16_to_f64(x)[None])[0], want, rtol=1e-15)
    # NHWC: src[s * channels + c]
    flat = x.T.copy().ravel()
    want_nhwc = [sum(float(flat[s * 3 + c]) for s in range(6)) for c in range(3)]
    got = ref.synet_channel_sum_16b(ref.to_bcs(x.T[None], "nhwc"))[0]
    np.testing.assert_allclose(got, want_nhwc, rtol=1e-15)


@pytest.mark.parametrize("op", [0, 1, 2, 3])
def test_eltwise_reference_matches_seed_loops(rng, op):
    srcs = [rng.normal(size=9) for _ in range(4)]
    srcs[2][3] = np.nan
    w = rng.normal(size=4)
    dst = [0.0] * 9
    # Max / Min written out, NaN-propagating as docs/kernels.md requires
    fns = {
        0: lambda a, b: a * b,
        2: lambda a, b: a if (a != a or a > b) else b,
        3: lambda a, b: a if (a != a or a < b) else b,
    }
    for j in range(9):
        if op == 1:
            dst[j] = srcs[0][j] * w[0] + srcs[1][j] * w[1]
        else:
            dst[j] = fns[op](srcs[0][j], srcs[1][j])
    for i in range(2, 4):
        for j in range(9):
            dst[j] = dst[j] + srcs[i][j] * w[i] if op == 1 else fns[op](dst[j], srcs[i][j])
    np.testing.assert_allclose(ref.synet_eltwise_layer_forward(srcs, w, op), dst, rtol=1e-15)
    assert np.isnan(ref.synet_eltwise_layer_forward(srcs, w, op)[3])


@pytest.mark.parametrize("half", [0, 1, 2, 5])
def test_lrn_reference_matches_seed_loops(rng, half):
    channels, spatial = 7, 3
    src = rng.normal(size=channels * spatial)
    k = (1.5, 0.3, -0.75)
    dst = np.empty_like(src)
    for c in range(channels):
        for s in range(spatial):
            lo, hi = max(0, c - half), min(channels, c + half + 1)
            total = 0.0
            for i in range(lo, hi):
                total += src[i * spatial + s] ** 2
            dst[c * spatial + s] = src[c * spatial + s] * (k[0] + total * k[1]) ** k[2]
    got = ref.synet_lrn_layer_cross_channels(src.reshape(1, channels, spatial), half, k)
    np.testing.assert_allclose(got.ravel(), dst, rtol=1e-14)


@pytest.mark.parametrize("size", [1, 3, 5])
def test_onnx_lrn_mapping_of_kernels_md(rng, size):
    x = rng.normal(size=(2, 7, 3))
    alpha, beta, bias = 0.3, 0.75, 2.0
    onnx = ref.onnx_lrn(x, size, alpha, beta, bias)
    mapped = ref.synet_lrn_layer_cross_channels(x, (size - 1) // 2, (bias, alpha / size, -beta))
    np.testing.assert_allclose(mapped, onnx, rtol=1e-14)


def test_shuffle_reference_types_are_inverse(rng):
    x0 = rng.normal(size=(2, 4, 5))
    x1 = rng.normal(size=(2, 6, 5))
    y0, y1 = ref.synet_shuffle_layer_forward(x0, x1, 4, 6, 0)
    assert y0.shape == y1.shape == (2, 5, 5)
    s = np.concatenate([x0, x1], axis=1)
    for c in range(5):
        np.testing.assert_array_equal(y0[:, c], s[:, 2 * c])
        np.testing.assert_array_equal(y1[:, c], s[:, 2 * c + 1])
    z0, z1 = ref.synet_shuffle_layer_forward(y0, y1, 4, 6, 1)
    np.testing.assert_array_equal(z0, x0)
    np.testing.assert_array_equal(z1, x1)


def test_softmax_reference_matches_seed_loops(rng):
    outer, count, inner = 2, 5, 3
    src = rng.normal(size=outer * count * inner) * 4
    dst = np.empty_like(src)
    for o in range(outer):
        for i in range(inner):
            idx = [(o * count + c) * inner + i for c in range(count)]
            m = max(src[j] for j in idx)
            total = sum(math.exp(src[j] - m) for j in idx)
            for j in idx:
                dst[j] = math.exp(src[j] - m) / total
    np.testing.assert_allclose(ref.synet_softmax_32f(src, outer, count, inner).ravel(), dst, rtol=1e-14)


def test_softmax_reference_special_rows():
    x = np.array([[-np.inf, -np.inf], [np.inf, 0.0], [np.nan, 0.0], [-np.inf, 0.0], [5.0, 5.0]])
    y = ref.synet_softmax_32f(x, 5, 2, 1)[:, :, 0]
    assert np.isnan(y[:3]).all()
    np.testing.assert_array_equal(y[3:], [[0.0, 1.0], [0.5, 0.5]])


@pytest.mark.parametrize("fmt", ["nchw", "nhwc"])
def test_tiled_scale_reference_matches_seed_loops(rng, fmt):
    c_, h_, w_ = 3, 4, 5
    x = rng.normal(size=(c_, h_, w_) if fmt == "nchw" else (h_, w_, c_))
    ver = rng.normal(size=(c_, w_) if fmt == "nchw" else (w_, c_))
    hor = rng.normal(size=(c_, h_) if fmt == "nchw" else (h_, c_))
    src, v, hh = x.ravel(), ver.ravel(), hor.ravel()
    dst = np.empty_like(src)
    for c in range(c_):
        for y in range(h_):
            for xx in range(w_):
                if fmt == "nchw":
                    i = (c * h_ + y) * w_ + xx
                    dst[i] = src[i] * v[c * w_ + xx] * hh[c * h_ + y]
                else:
                    i = (y * w_ + xx) * c_ + c
                    dst[i] = src[i] * v[xx * c_ + c] * hh[y * c_ + c]
    got = ref.synet_tiled_scale_2d_32f(x[None], ver, hor, fmt)[0]
    np.testing.assert_allclose(got.ravel(), dst, rtol=1e-15)


def test_bf16_helpers():
    bits = np.array([0x3F80, 0xBF80, 0x7F80, 0x0001, 0x7FC0], np.uint16)
    v = ref.bf16_to_f64(bits)
    assert v[0] == 1.0 and v[1] == -1.0 and v[2] == np.inf and v[3] == 2.0**-133 and np.isnan(v[4])
    # round to nearest, ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7
    exact = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, 3.5e38, 1e-40])
    np.testing.assert_array_equal(ref.f64_to_bf16_bits(exact), [0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x0001])
    assert ref.f64_to_bf16_bits(np.array([np.nan]))[0] & 0x7FC0 == 0x7FC0


def test_unary_reference_exact_ops():
    x = np.array([-0.0, 0.0, -0.5, 0.5, 1.5, 2.5, -2.5, 1e-45, np.inf, 4.0], np.float32)
    np.testing.assert_array_equal(ref.synet_unary_operation_32f(x, "round"), np.rint(x))
    assert np.signbit(ref.synet_unary_operation_32f(x, "ceil")[2])  # ceil(-0.5) = -0
    assert ref.unary_bitwise_f32(x, "not").view(np.uint32)[1] == 0xFFFFFFFF
    assert ref.unary_bitwise_f32(x, "abs").view(np.uint32)[0] == 0
    assert ref.synet_unary_operation_32f(x, "rsqrt")[0] == -np.inf
    assert ref.synet_unary_operation_32f(x, "rcp")[7] > np.finfo(np.float32).max
    assert ref.synet_unary_operation_32f(x, "sqrt")[9] == 2.0
    np.testing.assert_allclose(
        ref.synet_unary_operation_32f(np.float32([0.5, -2]), "erf"), [math.erf(0.5), math.erf(-2.0)], rtol=1e-15
    )


@pytest.mark.parametrize("op", UNARY_OPS)
def test_unary_checker_accepts_float32_math_and_rejects_errors(rng, op):
    """The accuracy checker against a correctly rounded fp32 implementation (the reference
    rounded to fp32): accepted; and against that with errors planted: rejected."""
    x = unary_inputs(op, rng, n=1 << 14)
    assert x.size >= 1 << 14 and x[: SPECIAL_VALUES.size].tobytes() == SPECIAL_VALUES.tobytes()
    if op in ("abs", "neg", "not", "zero"):
        good = ref.unary_bitwise_f32(x, op)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            good = ref.synet_unary_operation_32f(x, op).astype(np.float32)
    bad, _ = unary_violations(op, x, good)
    assert not bad.any(), (x[bad][:5], good[bad][:5])
    # plant errors on finite results: a flipped low mantissa bit is an error for the exact
    # ops; for the approximate ones an error twice the bound
    finite = np.flatnonzero(
        np.isfinite(good) & (np.abs(good) > 1e-3) & (np.abs(good) < 1e30) & unary_checked_mask(op, x)
    )
    pick = finite[:: max(1, finite.size // 50)][:50]
    wrong = good.copy()
    if op in ("abs", "neg", "not", "zero", "ceil", "floor", "round", "sqrt", "rcp", "sign"):
        wrong.view(np.uint32)[pick] ^= np.uint32(1)
    else:
        r = ref.synet_unary_operation_32f(x[pick], op)
        wrong[pick] = (r + 2.5 * unary_tolerance(op, r) + 1e-7 * np.abs(r)).astype(np.float32)
    bad, _ = unary_violations(op, x, wrong)
    assert bad[pick].sum() >= 0.9 * pick.size
    # NaN where NaN is due
    nan_in = np.isnan(x)
    if op not in ("zero", "not"):
        wrong2 = good.copy()
        wrong2[nan_in] = 0.0
        assert unary_violations(op, x, wrong2)[0][nan_in].all()
