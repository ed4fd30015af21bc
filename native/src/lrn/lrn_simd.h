/*
 * SynetLrnLayerCrossChannels written once against the vector layer (simd/README.md) and
 * compiled by avx512.c and avx2.c: the per-lane algorithm of scalar.c (see there) on 16
 * lanes at a time, so every level gives bit-identical results.
 * - NCHW: lanes are spatial positions. The tensor is walked in chunks of spatial columns
 *   so the rows of one channel window stay in L1; narrow windows are summed directly
 *   (2*half+1 fma per vector), wide ones with block suffix/prefix sums.
 * - NHWC: lanes are channels of one pixel for narrow windows (the pixel is copied into a
 *   zero-padded row, so every window is 2*half+1 unaligned loads); for wide windows 16
 *   pixels are transposed into a channel-major tile and run through the NCHW block code.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "lrn_pow.h"
#include "tensorops.h"

#define LRN_CHUNK 512          /* spatial columns per NCHW chunk, direct path */
#define LRN_STACK_FLOATS 8192  /* 32 KB of stack scratch, malloc beyond */

typedef struct {
    vfloat k0, k1, k2v;
    float k2;
    int own;           /* |k2| <= LRN_POW_MAX_EXP: LRN's power (lrn_pow.h), else v_pow */
    vint K;            /* pw.K in every lane */
    vfloat a0, a1, a2, a3, ev;
    LrnPow pw;
} LrnK;

/* 2^(e k) on 16 lanes: lrn_exp2k of scalar.c. */
V_INLINE vfloat lrn_exp2k(vfloat e, vfloat k)
{
    vfloat hi = v_mul(e, k), lo = v_fms(e, k, hi);
    vfloat n = v_round(hi);
    vfloat f = v_add(v_sub(hi, n), lo);
    vfloat q = v_set1(LRN_EXP2_Q[5]);
    for (int i = 4; i >= 0; --i)
        q = v_fma(q, f, v_set1(LRN_EXP2_Q[i]));
    return v_ldexp_normal(v_fma(q, f, v_set1(1.0f)), n);
}

/* q = r P(r) of lrn_pow.h */
V_INLINE vfloat lrn_rp(vfloat r, LrnK * k)
{
    vfloat q = v_fma(k->a3, r, k->a2);
    q = v_fma(q, r, k->a1);
    q = v_fma(q, r, k->a0);
    return v_mul(q, r);
}

/* tn_lrn_pow lane by lane, for vectors whose bases do not all have exponent pw.K; when
 * they share another one in range, the tables move to it (the next vectors of a plane
 * usually share it too). */
static __attribute__((noinline)) vfloat lrn_pow_lanes(vfloat b, LrnK * k)
{
    vint u = v_as_int(b);
    vint K = vi_srl(u, 23), j = vi_srl(u, 20); /* v_lut8 uses the low 3 bits of j */
    vfloat kf;
    vfloat m = v_frexp_normal(b, &kf);
    vfloat r = v_fma(m, v_lut8(k->pw.c, j), v_set1(-1.0f));
    vfloat g = v_mul(v_lut8(k->pw.A, j), lrn_exp2k(k->ev, kf));
    vfloat p = v_fma(lrn_rp(r, k), g, g);
    vmask out = m_or(vi_gt(vi_set1(LRN_K_LO), K), vi_gt(K, vi_set1(LRN_K_HI)));
    if (m_any(out))
        return v_select(out, v_pow(b, k->k2v, k->k2), p);
    int32_t K0 = (int32_t)(tn_f32_bits(v_lane(b, 0)) >> 23);
    if (m_all(vi_eq(K, vi_set1(K0)))) {
        tn_lrn_pow_set_k(&k->pw, K0);
        k->K = vi_set1(K0);
    }
    return p;
}

V_INLINE vfloat lrn_value(vfloat x, vfloat s, LrnK * k)
{
    vfloat b = v_fma(k->k1, s, k->k0);
    if (!k->own)
        return v_mul(x, v_pow(b, k->k2v, k->k2));
    vint u = v_as_int(b);
    if (__builtin_expect(!m_all(vi_eq(vi_srl(u, 23), k->K)), 0))
        return v_mul(x, lrn_pow_lanes(b, k));
    /* every base has exponent pw.K: r and g from the per-exponent tables */
    vint j = vi_srl(u, 20);
    vfloat r = v_fma(b, v_lut8(k->pw.ck, j), v_set1(-1.0f));
    vfloat g = v_lut8(k->pw.G, j);
    return v_mul(x, v_fma(lrn_rp(r, k), g, g));
}

/* Sum of squares of rows d0 .. d0 + W - 1 (W a constant after inlining) at lane i; the
 * first min(n, 16) lanes are read. */
V_INLINE vfloat window_sum(const float * src, size_t stride, ptrdiff_t d0, int W, size_t i, size_t n)
{
    vfloat s = v_zero();
    for (int w = 0; w < W; ++w) {
        vfloat a = v_load_n(src + (d0 + w) * (ptrdiff_t)stride + i, n);
        s = v_fma(a, a, s);
    }
    return s;
}

/* Channel c of a narrow window: n lanes, rows lo .. lo + W - 1 (W = hi - lo + 1; a
 * constant after inlining for the interior channels). */
V_INLINE void lrn_channel(const float * src, size_t stride, ptrdiff_t c, ptrdiff_t lo, int W, size_t n,
                          LrnK * k, float * dst)
{
    const float * xc = src + c * (ptrdiff_t)stride;
    float * yc = dst + c * (ptrdiff_t)stride;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        vfloat s0 = window_sum(src, stride, lo, W, i, 16);
        vfloat s1 = window_sum(src, stride, lo, W, i + 16, 16);
        v_store(yc + i, lrn_value(v_load(xc + i), s0, k));
        v_store(yc + i + 16, lrn_value(v_load(xc + i + 16), s1, k));
    }
    for (; i < n; i += 16) {
        vfloat s0 = window_sum(src, stride, lo, W, i, n - i);
        v_store_n(yc + i, lrn_value(v_load_n(xc + i, n - i), s0, k), n - i);
    }
}

/* Narrow windows: n lanes starting at src, channel rows `stride` floats apart; H = h is a
 * constant after inlining, so the interior channels run an unrolled window. */
V_INLINE void lrn_direct_h(const float * src, size_t stride, ptrdiff_t C, ptrdiff_t H, size_t n, LrnK * k,
                           float * dst)
{
    for (ptrdiff_t c = 0; c < C; ++c) {
        ptrdiff_t lo = c - H < 0 ? 0 : c - H, hi = c + H < C - 1 ? c + H : C - 1;
        if (hi - lo == 2 * H)
            lrn_channel(src, stride, c, lo, (int)(2 * H + 1), n, k, dst);
        else
            lrn_channel(src, stride, c, lo, (int)(hi - lo + 1), n, k, dst);
    }
}

static void lrn_direct(const float * src, size_t stride, ptrdiff_t C, ptrdiff_t h, size_t n, LrnK * k,
                       float * dst)
{
    switch (h) {
    case 0: lrn_direct_h(src, stride, C, 0, n, k, dst); break;
    case 1: lrn_direct_h(src, stride, C, 1, n, k, dst); break;
    case 2: lrn_direct_h(src, stride, C, 2, n, k, dst); break;
    case 3: lrn_direct_h(src, stride, C, 3, n, k, dst); break;
    case 4: lrn_direct_h(src, stride, C, 4, n, k, dst); break;
    default: lrn_direct_h(src, stride, C, h, n, k, dst); break;
    }
}

/* Wide windows (h > TN_LRN_DIRECT_HALF): n <= W lanes; suf holds 2h rows of W floats,
 * pre one row; W is a multiple of 16. */
static void lrn_blocks(const float * src, size_t stride, ptrdiff_t C, ptrdiff_t h, size_t n, size_t W,
                       LrnK * k, float * dst, float * suf, float * pre)
{
    ptrdiff_t B = 2 * h;
    for (ptrdiff_t kb = 0; kb < C; kb += B) {
        for (ptrdiff_t p = kb + B - 1; p >= kb; --p) {
            ptrdiff_t d = p - h;
            float * row = suf + (size_t)(p - kb) * W;
            int last = p == kb + B - 1, valid = d >= 0 && d < C;
            const float * xd = valid ? src + d * (ptrdiff_t)stride : src;
            for (size_t i = 0; i < n; i += 16) {
                vfloat acc = last ? v_zero() : v_load(row + W + i);
                if (valid) {
                    vfloat a = v_load_n(xd + i, n - i);
                    acc = v_fma(a, a, acc);
                }
                v_store(row + i, acc);
            }
        }
        for (ptrdiff_t p = kb + B; p < kb + 2 * B && p - B < C; ++p) {
            ptrdiff_t d = p - h, c = p - B;
            int first = p == kb + B, valid = d >= 0 && d < C;
            const float * xd = valid ? src + d * (ptrdiff_t)stride : src;
            const float * xc = src + c * (ptrdiff_t)stride;
            const float * sc = suf + (size_t)(c - kb) * W;
            float * yc = dst + c * (ptrdiff_t)stride;
            for (size_t i = 0; i < n; i += 16) {
                vfloat acc = first ? v_zero() : v_load(pre + i);
                if (valid) {
                    vfloat a = v_load_n(xd + i, n - i);
                    acc = v_fma(a, a, acc);
                }
                v_store(pre + i, acc);
                vfloat s = v_add(v_load(sc + i), acc);
                v_store_n(yc + i, lrn_value(v_load_n(xc + i, n - i), s, k), n - i);
            }
        }
    }
}

static size_t block_width(ptrdiff_t h)
{
    size_t w = (size_t)(4096 / (2 * h)) / 16 * 16;
    return w < 16 ? 16 : (w > LRN_CHUNK ? LRN_CHUNK : w);
}

void TN_ISA(SynetLrnLayerCrossChannels)(const float * src, size_t half, size_t channels, size_t spatial,
                                        const float * k, float * dst, int format)
{
    if (channels == 0 || spatial == 0)
        return;
    if (half > channels - 1)
        half = channels - 1;
    ptrdiff_t C = (ptrdiff_t)channels, h = (ptrdiff_t)half;
    if (!(fabsf(k[2]) <= TN_POW_MAX_EXP)) { /* huge or non-finite exponent: powf throughout */
        tn_scalar_SynetLrnLayerCrossChannels(src, half, channels, spatial, k, dst, format);
        return;
    }
    LrnK kv;
    kv.k0 = v_set1(k[0]);
    kv.k1 = v_set1(k[1]);
    kv.k2v = v_set1(k[2]);
    kv.k2 = k[2];
    kv.own = fabsf(k[2]) <= LRN_POW_MAX_EXP;
    tn_lrn_pow_init(&kv.pw, k[2]);
    kv.K = vi_set1(kv.pw.K);
    kv.a0 = v_set1(kv.pw.a[0]);
    kv.a1 = v_set1(kv.pw.a[1]);
    kv.a2 = v_set1(kv.pw.a[2]);
    kv.a3 = v_set1(kv.pw.a[3]);
    kv.ev = kv.k2v;
    int nhwc = format == TnTensorFormatNhwc;
    int direct = h <= TN_LRN_DIRECT_HALF;

    size_t W = direct ? 0 : (nhwc ? 16 : block_width(h));
    size_t need;
    if (direct)
        need = nhwc ? channels + 2 * half + 16 : 0;
    else
        need = (size_t)(2 * h) * W + W + (nhwc ? 2 * channels * 16 : 0);
    float stack[LRN_STACK_FLOATS];
    float * work = stack;
    if (need > LRN_STACK_FLOATS) {
        work = (float *)malloc(need * sizeof(float));
        if (!work) {
            for (size_t i = 0; i < channels * spatial; ++i)
                dst[i] = NAN;
            return;
        }
    }

    if (!nhwc) {
        if (direct) {
            for (size_t s = 0; s < spatial; s += LRN_CHUNK)
                lrn_direct(src + s, spatial, C, h, spatial - s < LRN_CHUNK ? spatial - s : LRN_CHUNK, &kv, dst + s);
        } else {
            float * suf = work, * pre = work + (size_t)(2 * h) * W;
            for (size_t s = 0; s < spatial; s += W)
                lrn_blocks(src + s, spatial, C, h, spatial - s < W ? spatial - s : W, W, &kv, dst + s, suf, pre);
        }
    } else if (direct) {
        float * xp = work;
        memset(xp, 0, need * sizeof(float));
        for (size_t s = 0; s < spatial; ++s) {
            const float * x = src + s * channels;
            float * y = dst + s * channels;
            memcpy(xp + half, x, channels * sizeof(float));
            for (size_t c = 0; c < channels; c += 16) {
                vfloat acc = v_zero();
                for (ptrdiff_t j = 0; j <= 2 * h; ++j) {
                    vfloat a = v_load(xp + c + j);
                    acc = v_fma(a, a, acc);
                }
                v_store_n(y + c, lrn_value(v_load_n(x + c, channels - c), acc, &kv), channels - c);
            }
        }
    } else {
        /* 16 pixels at a time, transposed: lane l of tile row c is channel c of pixel l */
        float * suf = work, * pre = suf + (size_t)(2 * h) * 16, * tin = pre + 16, * tout = tin + channels * 16;
        for (size_t s = 0; s < spatial; s += 16) {
            size_t n = spatial - s < 16 ? spatial - s : 16;
            const float * x = src + s * channels;
            float * y = dst + s * channels;
            for (size_t l = 0; l < 16; ++l)
                for (size_t c = 0; c < channels; ++c)
                    tin[c * 16 + l] = l < n ? x[l * channels + c] : 0.0f;
            lrn_blocks(tin, 16, C, h, n, 16, &kv, tout, suf, pre);
            for (size_t l = 0; l < n; ++l)
                for (size_t c = 0; c < channels; ++c)
                    y[l * channels + c] = tout[c * 16 + l];
        }
    }
    if (work != stack)
        free(work);
}
