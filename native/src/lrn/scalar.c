/*
 * SynetLrnLayerCrossChannels, scalar reference: y = x * (k0 + k1 * S)^k2, S the sum of
 * squares over channels [c - half, c + half] clipped to the tensor.
 *
 * Every lane (a spatial position in NCHW, a pixel in NHWC) is one sequence of channels,
 * handled by lrn_lane. The vector levels (lrn_simd.h) run the same per-lane operation
 * sequence on 16 lanes at once, so all levels give bit-identical results:
 * - half <= TN_LRN_DIRECT_HALF: S = the squares x_d * x_d (each rounded) added in channel
 *   order over the window (the vector levels square each element once and add: on Zen 4
 *   the multiply pipes bound LRN, and an fma chain put 2*half+1 multiplies per output there);
 * - wider windows: van Herk / Gil-Werman block sums. In channel coordinates padded by
 *   half zeros on each side, blocks of B = 2*half channels; the window of channel c is
 *   [c, c + B] (padded), the suffix of one block plus the prefix of the next, each an fma
 *   chain. O(1) work per element and no subtraction: no cancellation, and an inf or NaN
 *   input only reaches the windows that contain it (a sliding add/subtract sum would turn
 *   inf - inf into NaN for every later channel).
 * base b = fma(k1, S, k0); pow: for |k2| <= 1 and 2^-100 <= b < 2^101 LRN's own power
 * (lrn_pow.h), else tn_pow_f32, i.e. 2^(k2 log2 b) from table-driven log2/exp2 for
 * positive normal b, C's powf (C99 pow semantics, like numpy.power) for b = 0, b < 0,
 * denormal, inf, NaN: 0^(k2<0) = inf, (b<0)^(non-integer k2) = NaN, x^0 = 1, and so on.
 * Then y = x * pow (so x = 0 with an infinite pow gives NaN, as in the float64 reference).
 * S is a float sum: |x| above ~1.8e19 overflows x^2 to inf.
 */
#include <math.h>
#include <stdlib.h>

#include "vmath_scalar.h"

#include "kernels.h"
#include "lrn_pow.h"
#include "tensorops.h"

/* (1 + r)^e = 1 + sum t_i r^i, t_i = binom(e, i); P(r) = sum t_(i+1) r^i to r^3 after
 * folding the r^4..r^6 terms of P into the lower ones with Chebyshev polynomials over
 * |r| <= 1/17 (x^d ~ x^d - T_d(x) / 2^(d-1), x = 17 r). Double, rounded once. */
void tn_lrn_pow_init(LrnPow * p, float e)
{
    double t[7], b = 1.0;
    for (int i = 0; i < 7; ++i) {
        b *= ((double)e - i) / (i + 1);
        t[i] = b;
    }
    double h2 = 1.0 / (17.0 * 17.0), h4 = h2 * h2, h6 = h4 * h2;
    t[4] += t[6] * 48.0 * h2 / 32.0;
    t[2] -= t[6] * 18.0 * h4 / 32.0;
    t[0] += t[6] * h6 / 32.0;
    t[3] += t[5] * 20.0 * h2 / 16.0;
    t[1] -= t[5] * 5.0 * h4 / 16.0;
    t[2] += t[4] * h2;
    t[0] -= t[4] * h4 / 8.0;
    p->e = e;
    for (int i = 0; i < 4; ++i)
        p->a[i] = (float)t[i];
    for (int j = 0; j < 8; ++j) {
        p->c[j] = (float)(16.0 / (17 + 2 * j));
        p->A[j] = (float)pow((double)p->c[j], -(double)e);
    }
    p->K = -1;
}

/* 2^(e k) for integral |k| <= 100, |e| <= 1: e k = hi + lo exactly, hi = n + f' (n
 * nearest), 2^f from the polynomial, 2^n into the exponent field. */
static float lrn_exp2k(float e, float k)
{
    float hi = e * k, lo = fmaf(e, k, -hi);
    float n = nearbyintf(hi);
    float f = (hi - n) + lo;
    float q = LRN_EXP2_Q[5];
    for (int i = 4; i >= 0; --i)
        q = fmaf(q, f, LRN_EXP2_Q[i]);
    float y = fmaf(q, f, 1.0f);
    return tn_bits_f32(tn_f32_bits(y) + ((uint32_t)(int32_t)n << 23));
}

void tn_lrn_pow_set_k(LrnPow * p, int32_t K)
{
    int k = K - 127;
    float E = lrn_exp2k(p->e, (float)k);
    for (int j = 0; j < 8; ++j) {
        p->ck[j] = ldexpf(p->c[j], -k);
        p->G[j] = p->A[j] * E;
    }
    p->K = K;
}

float tn_lrn_pow(const LrnPow * p, float b)
{
    uint32_t u = tn_f32_bits(b);
    int32_t K = (int32_t)(u >> 23);
    if (K < LRN_K_LO || K > LRN_K_HI)
        return tn_pow_f32(b, p->e);
    uint32_t j = (u >> 20) & 7u;
    float m = tn_bits_f32((u & 0x007fffffu) | 0x3f800000u);
    float r = fmaf(m, p->c[j], -1.0f);
    float t = fmaf(fmaf(fmaf(p->a[3], r, p->a[2]), r, p->a[1]), r, p->a[0]);
    float g = p->A[j] * lrn_exp2k(p->e, (float)(K - 127));
    return fmaf(g * r, t, g);
}

/* pw: LRN's power for |k2| <= LRN_POW_MAX_EXP, NULL for tn_pow_f32. */
static inline float lrn_value(float x, float s, const float * k, const LrnPow * pw)
{
    float b = fmaf(k[1], s, k[0]);
    return x * (pw ? tn_lrn_pow(pw, b) : tn_pow_f32(b, k[2]));
}

/* One lane: channel c at x[c * stride]; suf holds 2*half floats (wide windows only). */
static void lrn_lane(const float * x, size_t stride, size_t channels, size_t half, const float * k, const LrnPow * pw,
                     float * y, float * suf)
{
    ptrdiff_t C = (ptrdiff_t)channels, h = (ptrdiff_t)half;
    if (h <= TN_LRN_DIRECT_HALF) {
        for (ptrdiff_t c = 0; c < C; ++c) {
            ptrdiff_t lo = c - h < 0 ? 0 : c - h, hi = c + h < C - 1 ? c + h : C - 1;
            float s = 0.0f;
            for (ptrdiff_t d = lo; d <= hi; ++d)
                s += x[d * stride] * x[d * stride];
            y[c * stride] = lrn_value(x[c * stride], s, k, pw);
        }
        return;
    }
    ptrdiff_t B = 2 * h;
    for (ptrdiff_t kb = 0; kb < C; kb += B) {
        float acc = 0.0f;
        for (ptrdiff_t p = kb + B - 1; p >= kb; --p) {
            ptrdiff_t d = p - h;
            if (d >= 0 && d < C)
                acc = fmaf(x[d * stride], x[d * stride], acc);
            suf[p - kb] = acc;
        }
        acc = 0.0f;
        for (ptrdiff_t p = kb + B; p < kb + 2 * B && p - B < C; ++p) {
            ptrdiff_t d = p - h, c = p - B;
            if (d >= 0 && d < C)
                acc = fmaf(x[d * stride], x[d * stride], acc);
            y[c * stride] = lrn_value(x[c * stride], suf[c - kb] + acc, k, pw);
        }
    }
}

void tn_scalar_SynetLrnLayerCrossChannels(const float * src, size_t half, size_t channels, size_t spatial,
                                          const float * k, float * dst, int format)
{
    if (channels == 0 || spatial == 0)
        return;
    if (half > channels - 1)
        half = channels - 1; /* a wider window covers the same channels */
    float * suf = NULL;
    if (half > TN_LRN_DIRECT_HALF) {
        suf = (float *)malloc(2 * half * sizeof(float));
        if (!suf) {
            for (size_t i = 0; i < channels * spatial; ++i)
                dst[i] = NAN;
            return;
        }
    }
    LrnPow pow_tables, *pw = NULL;
    if (fabsf(k[2]) <= LRN_POW_MAX_EXP) {
        tn_lrn_pow_init(&pow_tables, k[2]);
        pw = &pow_tables;
    }
    if (format == TnTensorFormatNhwc) {
        for (size_t s = 0; s < spatial; ++s)
            lrn_lane(src + s * channels, 1, channels, half, k, pw, dst + s * channels, suf);
    } else {
        for (size_t s = 0; s < spatial; ++s)
            lrn_lane(src + s, spatial, channels, half, k, pw, dst + s, suf);
    }
    free(suf);
}
