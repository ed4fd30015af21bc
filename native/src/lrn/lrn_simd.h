/*
 * SynetLrnLayerCrossChannels written once against the vector layer (simd/README.md) and
 * compiled by avx512.c and avx2.c: the per-lane algorithm of scalar.c (see there) on 16
 * lanes at a time, so every level gives bit-identical results.
 * - NCHW: lanes are spatial positions. Narrow windows: a block of columns walks down the
 *   channels with the window's rows in registers, so each element is loaded once (the
 *   channel planes are rarely 64-byte aligned, and a window read from memory costs 2*half+1
 *   line-crossing loads per vector), each squared once as it enters; the sum adds the
 *   window's 2*half+1 squares in channel order.
 *   Wide windows: chunks of spatial columns with block suffix/prefix sums.
 * - NHWC: lanes are channels of one pixel for narrow windows (the pixel's squares are
 *   written into a zero-padded row, so every window is 2*half+1 unaligned loads); for
 *   wide windows 16 pixels are transposed into a channel-major tile and run through the
 *   NCHW block code.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "lrn_pow.h"
#include "tensorops.h"

#define LRN_CHUNK 512          /* spatial columns per wide-window block, at most */
#define LRN_V 2                /* column vectors per narrow-window walk: 1 leaves the chains too serial */
#define LRN_AHEAD 128          /* floats: prefetch distance of the walk along a row */
#define LRN_STACK_FLOATS 8192  /* 32 KB of stack scratch, malloc beyond */

typedef struct {
    vfloat k0, k1, k2v;
    float k2;
    int own;           /* |k2| <= LRN_POW_MAX_EXP: LRN's power (lrn_pow.h), else v_pow */
    vint K;            /* pw.K in every lane */
    vfloat a0, a1, a2, a3;
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

/* g (1 + r P(r)) of lrn_pow.h, P = a0 + a1 r + a2 r^2 + a3 r^3 */
V_INLINE vfloat lrn_series(vfloat r, vfloat g, vfloat a0, vfloat a1, vfloat a2, vfloat a3)
{
    vfloat t = v_fma(v_fma(v_fma(a3, r, a2), r, a1), r, a0);
    return v_fma(v_mul(g, r), t, g);
}

/* b^k2 for bases that all have exponent pw.K: r and g from the per-exponent tables. */
V_INLINE vfloat lrn_pow_k(vfloat b, const float * ck, const float * G, vfloat a0, vfloat a1, vfloat a2, vfloat a3)
{
    vint j = vi_srl(v_as_int(b), 20); /* v_lut8 uses the low 3 bits of j */
    vfloat r = v_fma(b, v_lut8(ck, j), v_set1(-1.0f));
    return lrn_series(r, v_lut8(G, j), a0, a1, a2, a3);
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
    vfloat g = v_mul(v_lut8(k->pw.A, j), lrn_exp2k(k->k2v, kf));
    vfloat p = lrn_series(r, g, k->a0, k->a1, k->a2, k->a3);
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

/* x b^k2 for any bases: lane by lane (own power), or v_pow */
static __attribute__((noinline)) vfloat lrn_value_lanes(vfloat x, vfloat b, LrnK * k)
{
    return v_mul(x, k->own ? lrn_pow_lanes(b, k) : v_pow(b, k->k2v, k->k2));
}

V_INLINE vfloat lrn_value(vfloat x, vfloat s, LrnK * k)
{
    vfloat b = v_fma(k->k1, s, k->k0);
    if (__builtin_expect(!k->own || !m_all(vi_eq(vi_srl(v_as_int(b), 23), k->K)), 0))
        return lrn_value_lanes(x, b, k);
    return v_mul(x, lrn_pow_k(b, k->pw.ck, k->pw.G, k->a0, k->a1, k->a2, k->a3));
}

/* What the narrow-window walk reads per vector, in locals of the walk: LrnK's address
 * reaches lrn_pow_lanes, so its fields would be reloaded after every store. */
typedef struct {
    vfloat k0, k1, a0, a1, a2, a3;
    vint K;
    float ck[8], G[8];
} LrnHot;

V_INLINE void lrn_hot(LrnHot * h, const LrnK * k)
{
    h->k0 = k->k0;
    h->k1 = k->k1;
    h->a0 = k->a0;
    h->a1 = k->a1;
    h->a2 = k->a2;
    h->a3 = k->a3;
    h->K = k->K;
    memcpy(h->ck, k->pw.ck, sizeof h->ck);
    memcpy(h->G, k->pw.G, sizeof h->G);
}

/* Narrow windows on NCHW, each element loaded and squared once: a block of LRN_V column
 * vectors (n <= 16 LRN_V lanes, `full` when n = 16 LRN_V) walks down the channels keeping
 * rows c - H .. c + H and their squares in registers (squares and adds instead of an fma
 * chain: (1,96,3025) in cache 86 -> 74 us). Rows outside the tensor read as +0, and so do
 * their squares: s + 0 = s (s >= +0), so the sum has the bits of the clipped window's. H
 * and full are constants after inlining. */
V_INLINE void lrn_column(const float * src, size_t stride, ptrdiff_t C, int H, int full, size_t n, LrnK * k,
                         float * dst)
{
    vfloat w[2 * TN_LRN_DIRECT_HALF + 1][LRN_V], sq[2 * TN_LRN_DIRECT_HALF + 1][LRN_V];
    size_t m[LRN_V];
    for (int v = 0; v < LRN_V; ++v)
        m[v] = full ? 16 : (n > 16 * (size_t)v ? n - 16 * (size_t)v : 0);
#define LRN_LOAD(p, v) (full ? v_load(p) : v_load_n(p, m[v]))
    for (int r = 0; r < 2 * H; ++r)
        for (int v = 0; v < LRN_V; ++v) {
            ptrdiff_t d = r - H;
            w[r][v] = d >= 0 && d < C ? LRN_LOAD(src + d * (ptrdiff_t)stride + 16 * v, v) : v_zero();
            sq[r][v] = v_mul(w[r][v], w[r][v]);
        }
    const int own = k->own;
    ptrdiff_t c = 0;
    while (c < C) {
        LrnHot h; /* refreshed when lrn_pow_lanes moved the tables */
        lrn_hot(&h, k);
        for (;;) {
            const float * xd = src + (c + H) * (ptrdiff_t)stride;
            float * yc = dst + c * (ptrdiff_t)stride;
            int in = c + H < C;
            /* 96-odd rows walked at once are too many streams for the hardware prefetcher
             * when the tensor comes from DRAM: fetch the lines of the block LRN_AHEAD / 32
             * blocks on, into L2 (a block's walk touches 24 KiB: prefetched into the 32 KiB
             * L1, the lines were evicted before use, and (1,96,3025) from DRAM took 1.5x) */
            v_prefetch_l2(xd + LRN_AHEAD);
            v_prefetch_l2(xd + LRN_AHEAD + 16);
            v_prefetch_l2(yc + LRN_AHEAD);
            v_prefetch_l2(yc + LRN_AHEAD + 16);
            for (int v = 0; v < LRN_V; ++v) {
                w[2 * H][v] = in ? LRN_LOAD(xd + 16 * v, v) : v_zero();
                sq[2 * H][v] = v_mul(w[2 * H][v], w[2 * H][v]);
            }
            vfloat b[LRN_V];
            vmask same = m_first(16);
            for (int v = 0; v < LRN_V; ++v) {
                vfloat s = sq[0][v]; /* = 0 + sq[0] of scalar.c: a square is never -0 */
                for (int r = 1; r <= 2 * H; ++r)
                    s = v_add(s, sq[r][v]);
                b[v] = v_fma(h.k1, s, h.k0);
                same = m_and(same, vi_eq(vi_srl(v_as_int(b[v]), 23), h.K));
            }
            int fast = own && m_all(same);
            for (int v = 0; v < LRN_V; ++v) {
                /* unconditional, so the table broadcasts leave the loop */
                vfloat y = v_mul(w[H][v], lrn_pow_k(b[v], h.ck, h.G, h.a0, h.a1, h.a2, h.a3));
                if (__builtin_expect(!fast, 0))
                    y = lrn_value_lanes(w[H][v], b[v], k);
                if (full)
                    v_store(yc + 16 * v, y);
                else
                    v_store_n(yc + 16 * v, y, m[v]);
            }
            for (int r = 0; r < 2 * H; ++r)
                for (int v = 0; v < LRN_V; ++v) {
                    w[r][v] = w[r + 1][v];
                    sq[r][v] = sq[r + 1][v];
                }
            if (++c == C || (!fast && own))
                break;
        }
    }
#undef LRN_LOAD
}

V_INLINE void lrn_direct_h(const float * src, size_t stride, ptrdiff_t C, int H, size_t n, LrnK * k, float * dst)
{
    size_t i = 0;
    for (; i + 16 * LRN_V <= n; i += 16 * LRN_V)
        lrn_column(src + i, stride, C, H, 1, 16 * LRN_V, k, dst + i);
    if (i < n)
        lrn_column(src + i, stride, C, H, 0, n - i, k, dst + i);
}

static void lrn_direct(const float * src, size_t stride, ptrdiff_t C, ptrdiff_t h, size_t n, LrnK * k, float * dst)
{
    switch (h) {
    case 0: lrn_direct_h(src, stride, C, 0, n, k, dst); break;
    case 1: lrn_direct_h(src, stride, C, 1, n, k, dst); break;
    case 2: lrn_direct_h(src, stride, C, 2, n, k, dst); break;
    case 3: lrn_direct_h(src, stride, C, 3, n, k, dst); break;
    default: lrn_direct_h(src, stride, C, 4, n, k, dst); break;
    }
}

/* Wide windows (h > TN_LRN_DIRECT_HALF): n <= W lanes; suf holds 2h rows of W floats,
 * pre one row; W is a multiple of 16. */
static void lrn_blocks(const float * src, size_t stride, ptrdiff_t C, ptrdiff_t h, size_t n, size_t W, LrnK * k,
                       float * dst, float * suf, float * pre)
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
            lrn_direct(src, spatial, C, h, spatial, &kv, dst);
        } else {
            float *suf = work, *pre = work + (size_t)(2 * h) * W;
            for (size_t s = 0; s < spatial; s += W)
                lrn_blocks(src + s, spatial, C, h, spatial - s < W ? spatial - s : W, W, &kv, dst + s, suf, pre);
        }
    } else if (direct) {
        float * sp = work; /* the squares of one pixel, half zeros before, zeros after */
        memset(sp, 0, need * sizeof(float));
        for (size_t s = 0; s < spatial; ++s) {
            const float * x = src + s * channels;
            float * y = dst + s * channels;
            for (size_t c = 0; c < channels; c += 16) {
                vfloat a = v_load_n(x + c, channels - c);
                v_store_n(sp + half + c, v_mul(a, a), channels - c);
            }
            for (size_t c = 0; c < channels; c += 16) {
                vfloat acc = v_load(sp + c);
                for (ptrdiff_t j = 1; j <= 2 * h; ++j)
                    acc = v_add(acc, v_load(sp + c + j));
                v_store_n(y + c, lrn_value(v_load_n(x + c, channels - c), acc, &kv), channels - c);
            }
        }
    } else {
        /* 16 pixels at a time, transposed: lane l of tile row c is channel c of pixel l */
        float *suf = work, *pre = suf + (size_t)(2 * h) * 16, *tin = pre + 16, *tout = tin + channels * 16;
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
