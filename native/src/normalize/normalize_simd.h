/*
 * Normalize layer family (seed 000), vector levels: written once against the vector layer
 * (simd/README.md), compiled by avx512.c and avx2.c. Same algorithms and work layout as
 * scalar.c (see there):
 * - Statistics along a contiguous row (V2/L2 NHWC, V3 NCHW, V4 NCHW) are computed while the
 *   row stays in L1. When the whole tensor is in cache, V2 NHWC and 16bV2 NHWC run four rows
 *   side by side so that their reduction chains overlap.
 * - Statistics across rows (V2/L2/16bV2 NCHW: across channels; V3 NHWC: across spatial
 *   positions) stream whole rows into per-position accumulators (buf, or stack arrays).
 * - The output is written as one sequential stream, row after row: interleaving several
 *   output rows measured clearly slower on large tensors.
 * - Means are x0 + sum(x - x0) / n (x0 the row's first value): exact for constant rows.
 *   One check per row of t = variance + eps (or sum of squares + eps) sends the rows out of
 *   the fp32 range to the double slow paths of normalize.h.
 * - 16bV2 keeps the canonical 16-lane order of scalar.c: one vfloat accumulator per row in
 *   NHWC (lane = channel % 16) reduced with v_hsum, and 16 lane arrays per position in NCHW
 *   reduced with the same tree.
 */
#include <float.h>
#include <stdlib.h>

#include "kernels.h"
#include "simd/prefetch.h"
#include "simd/reduce.h"
#include "normalize.h"
#include "tensorops.h"

#define F 16
#define TN_NORM_SUM_BLOCK 4096          /* long sums add partial sums of this many values */
#define TN_NORM_CHUNK 2048              /* positions per chunk of the across-rows layer norms */
#define TN_NORM_LANES_CHUNK 256         /* positions per chunk of 16bV2 NCHW (2 x 16 lane arrays) */
/* V2 NHWC runs four rows side by side (overlapping their reduction chains) when the whole
 * tensor is in cache, where the kernel is latency-bound; larger tensors are bandwidth-bound
 * and stream faster row by row (measured). */
#ifndef TN_NORM_CACHED_BYTES
#define TN_NORM_CACHED_BYTES (1024 * 1024)
#endif
/* 16bV2 NHWC: while a group of rows is written, the next group and this much beyond it are
 * prefetched (from DRAM (8,197,768) ran 10-20% faster, in cache about 5% slower; 4 to
 * 16 KiB measured alike). */
#ifndef TN_NORM_AHEAD_BYTES
#define TN_NORM_AHEAD_BYTES (4 * 1024)
#endif

/* min(n, 16) values; the other lanes read as +0 / are not written. */
V_INLINE vfloat ld(const float * p, size_t n) { return v_load_n(p, n); }
V_INLINE void st(float * p, vfloat v, size_t n) { v_store_n(p, v, n); }

/* a - b in the first min(n, 16) lanes, +0 in the others (tails of reductions). */
V_INLINE vfloat sub_n(vfloat a, vfloat b, size_t n) { return n >= F ? v_sub(a, b) : v_keep(m_first(n), v_sub(a, b)); }

/* Lanes whose t is outside [TN_NORM_TINY, FLT_MAX] (NaN included), among the first n. */
V_INLINE unsigned slow_lanes(vfloat t, size_t n)
{
    vmask ok = m_and(v_ge(t, v_set1(TN_NORM_TINY)), v_le(t, v_set1(FLT_MAX)));
    return m_bits(m_andnot(ok, m_first(n)));
}

/* min(n, floats from p to its next 64-byte boundary). NumPy data is typically only 16-byte
 * aligned: a head of this many values makes the following full-vector stores whole cache
 * lines. Only stores are aligned this way: reductions keep their lane order independent of
 * the address, so results do not depend on where the input happens to lie. */
V_INLINE size_t line_head(const void * p, size_t n)
{
    size_t h = ((size_t)0 - (size_t)(uintptr_t)p) % 64 / sizeof(float);
    return h < n ? h : n;
}

/* Heads and tails of output rows of n >= 16 values are written as full vectors that overlap
 * their neighbours (the overlap gets the same values twice): masked stores are slow on some
 * CPUs (AVX2's VMASKMOVPS on AMD made (1,4096,1024) 1.6x slower). head_n: the values the
 * head store writes (h: the values up to the line boundary); tail_at: where the last vector
 * of the row starts (i: the first value not written yet). */
V_INLINE size_t head_n(size_t h, size_t n) { return h && n >= F ? F : h; }
V_INLINE size_t tail_at(size_t i, size_t n) { return n >= F ? n - F : i; }

static void fill_nan(float * dst, size_t n)
{
    for (size_t i = 0; i < n; i += F)
        st(dst + i, v_set1(NAN), n - i);
}

/* ---- Row reductions (four accumulators) ------------------------------------------------ */

/* sum(x - x0). */
V_INLINE float row_sum_from(const float * x, size_t n, float x0)
{
    const vfloat o = v_set1(x0);
    vfloat a0 = v_zero(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 4 * F <= n; i += 4 * F) {
        a0 = v_add(a0, v_sub(v_load(x + i + 0 * F), o));
        a1 = v_add(a1, v_sub(v_load(x + i + 1 * F), o));
        a2 = v_add(a2, v_sub(v_load(x + i + 2 * F), o));
        a3 = v_add(a3, v_sub(v_load(x + i + 3 * F), o));
    }
    for (; i < n; i += F)
        a0 = v_add(a0, sub_n(ld(x + i, n - i), o, n - i));
    return v_hsum(v_add(v_add(a0, a1), v_add(a2, a3)));
}

V_INLINE float row_sum_squares(const float * x, size_t n)
{
    vfloat a0 = v_zero(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 4 * F <= n; i += 4 * F) {
        vfloat x0 = v_load(x + i + 0 * F), x1 = v_load(x + i + 1 * F);
        vfloat x2 = v_load(x + i + 2 * F), x3 = v_load(x + i + 3 * F);
        a0 = v_fma(x0, x0, a0);
        a1 = v_fma(x1, x1, a1);
        a2 = v_fma(x2, x2, a2);
        a3 = v_fma(x3, x3, a3);
    }
    for (; i < n; i += F) {
        vfloat x0 = ld(x + i, n - i);
        a0 = v_fma(x0, x0, a0);
    }
    return v_hsum(v_add(v_add(a0, a1), v_add(a2, a3)));
}

/* Long sums of squares add partial sums of TN_NORM_SUM_BLOCK values (smaller error). */
static float sum_squares(const float * x, size_t n)
{
    float total = 0.0f;
    for (size_t i = 0; i < n; i += TN_NORM_SUM_BLOCK)
        total += row_sum_squares(x + i, n - i < TN_NORM_SUM_BLOCK ? n - i : TN_NORM_SUM_BLOCK);
    return total;
}

V_INLINE float row_sum_squared_deviations(const float * x, size_t n, float mean)
{
    const vfloat m = v_set1(mean);
    vfloat a0 = v_zero(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 4 * F <= n; i += 4 * F) {
        vfloat d0 = v_sub(v_load(x + i + 0 * F), m), d1 = v_sub(v_load(x + i + 1 * F), m);
        vfloat d2 = v_sub(v_load(x + i + 2 * F), m), d3 = v_sub(v_load(x + i + 3 * F), m);
        a0 = v_fma(d0, d0, a0);
        a1 = v_fma(d1, d1, a1);
        a2 = v_fma(d2, d2, a2);
        a3 = v_fma(d3, d3, a3);
    }
    for (; i < n; i += F) {
        vfloat d = sub_n(ld(x + i, n - i), m, n - i);
        a0 = v_fma(d, d, a0);
    }
    return v_hsum(v_add(v_add(a0, a1), v_add(a2, a3)));
}

/* ---- Statistics across rows (NCHW across channels, NHWC across spatial positions) --------
 * `rows` rows of `count` positions, `stride` values apart. Whole rows are streamed into one
 * accumulator per position. */

/* acc[p] = sum over the rows r >= 1 of x[r * stride + p] - x[p], p < w: four rows at a time. */
V_INLINE void column_deviation_sums(const float * x, size_t rows, size_t stride, size_t w, float * acc)
{
    for (size_t p = 0; p < w; p += F)
        st(acc + p, v_zero(), w - p);
    size_t r = 1;
    for (; r + 4 <= rows; r += 4) {
        const float * q = x + r * stride;
        for (size_t p = 0; p < w; p += F) {
            size_t n = w - p;
            vfloat o = ld(x + p, n);
            vfloat v = v_add(v_add(v_sub(ld(q + p, n), o), v_sub(ld(q + stride + p, n), o)),
                             v_add(v_sub(ld(q + 2 * stride + p, n), o), v_sub(ld(q + 3 * stride + p, n), o)));
            st(acc + p, v_add(ld(acc + p, n), v), n);
        }
    }
    for (; r < rows; ++r) {
        const float * q = x + r * stride;
        for (size_t p = 0; p < w; p += F) {
            size_t n = w - p;
            st(acc + p, v_add(ld(acc + p, n), v_sub(ld(q + p, n), ld(x + p, n))), n);
        }
    }
}

/* acc[p] = sum over the rows of x[r * stride + p]^2, p < w: four rows at a time (a quarter
 * of the accumulator loads and stores: (1,512,1444) L2 went from 1.8 to 1.6-1.7 x memcpy),
 * the next four prefetched into L2 (four row streams are more than the hardware prefetchers
 * keep up with from DRAM: 10-15% faster there, the same in cache). */
V_INLINE void column_sum_squares(const float * x, size_t rows, size_t stride, size_t w, float * acc)
{
    size_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float * q = x + r * stride;
        const int pf = r + 8 <= rows;
        for (size_t p = 0; p < w; p += F) {
            size_t n = w - p;
            if (pf) {
                v_prefetch_l2(q + 4 * stride + p);
                v_prefetch_l2(q + 5 * stride + p);
                v_prefetch_l2(q + 6 * stride + p);
                v_prefetch_l2(q + 7 * stride + p);
            }
            vfloat x0 = ld(q + p, n), x1 = ld(q + stride + p, n), x2 = ld(q + 2 * stride + p, n),
                   x3 = ld(q + 3 * stride + p, n);
            vfloat v = v_fma(x3, x3, v_fma(x2, x2, v_fma(x1, x1, v_mul(x0, x0))));
            st(acc + p, r ? v_add(ld(acc + p, n), v) : v, n);
        }
    }
    for (; r < rows; ++r) {
        const float * q = x + r * stride;
        for (size_t p = 0; p < w; p += F) {
            size_t n = w - p;
            vfloat x0 = ld(q + p, n);
            st(acc + p, v_fma(x0, x0, r ? ld(acc + p, n) : v_zero()), n);
        }
    }
}

/* L2 normalization across channels (NCHW item): y = x * (scale[c] * k[s]); k in buf. */
static void l2_across(const float * x, size_t C, size_t S, const float * scale, float eps, float * k, float * y)
{
    const vfloat ve = v_set1(eps), one = v_set1(1.0f);
    /* Whole rows in one chunk: chunks of positions whose rows stay in L2 (64 to 736 of
     * (512, 1444)) measured 10-50% slower than two whole passes, also with the next chunk
     * prefetched or summed while this one is scaled: their short strided row segments defeat
     * the hardware prefetchers (huge pages did not help). Two passes move the item through L3
     * three times (memcpy: twice). With the prefetches of column_sum_squares and of the next
     * output row below, from DRAM about 1.2-1.45x memcpy (1.6-1.8x without them); in cache
     * 1.41-1.51x against 1.54-1.58x without them (builds alternated, order rotating). */
    for (size_t s0 = 0, w = S; s0 < S; s0 += w) {
        const float * xs = x + s0;
        float *ks = k + s0, *ys = y + s0;
        unsigned slow = 0;
        column_sum_squares(xs, C, S, w, ks);
        for (size_t s = 0; s < w; s += F) {
            vfloat t = v_add(ld(ks + s, w - s), ve);
            unsigned b = slow_lanes(t, w - s);
            st(ks + s, v_div(one, v_sqrt(t)), w - s);
            slow |= b;
            for (; b; b &= b - 1)   /* -1 marks the positions redone below (a true k is > 0) */
                ks[s + (size_t)__builtin_ctz(b)] = -1.0f;
        }
        for (size_t c = 0; c < C; ++c) {
            const float * p = xs + c * S;
            float * q = ys + c * S;
            const vfloat sc = v_set1(scale[c]);
            size_t s = line_head(q, w), h = head_n(s, w);
            if (h)
                st(q, v_mul(ld(p, h), v_mul(sc, ld(ks, h))), h);
            const int pf = c + 1 < C;
            for (; s + F <= w; s += F) {
                if (pf) /* the next output row: from DRAM, reading its lines for ownership stalls */
                    v_prefetch_l2(q + S + s);
                v_store(q + s, v_mul(v_load(p + s), v_mul(sc, v_load(ks + s))));
            }
            if (s < w) {
                size_t j = tail_at(s, w);
                st(q + j, v_mul(ld(p + j, w - j), v_mul(sc, ld(ks + j, w - j))), w - j);
            }
        }
        for (size_t s = 0; slow && s < w; ++s)
            if (ks[s] < 0.0f)
                tn_norm_slow_l2(xs + s, C, S, scale, 1, eps, ys + s);
    }
}

/* Layer norm across rows of one batch item; scale/shift per row (V2 NCHW) or per position
 * (V3 NHWC). mean (count floats) is buf. */
V_INLINE void layer_norm_across(const float * x, size_t rows, size_t count, size_t stride, const float * scale,
                                const float * shift, int perRow, float eps, float * mean, float * y)
{
    const vfloat vinv = v_set1(1.0f / (float)rows), ve = v_set1(eps), one = v_set1(1.0f);
    float norm[TN_NORM_CHUNK] __attribute__((aligned(64)));
    uint16_t bad[TN_NORM_CHUNK / F];
    for (size_t p0 = 0; p0 < count; p0 += TN_NORM_CHUNK) {
        const size_t w = count - p0 < TN_NORM_CHUNK ? count - p0 : TN_NORM_CHUNK;
        const float * xs = x + p0;
        float *ys = y + p0, *ms = mean + p0;
        /* Pass 1: means, x0 + sum(x - x0) / rows. */
        column_deviation_sums(xs, rows, stride, w, ms);
        for (size_t p = 0; p < w; p += F)
            st(ms + p, v_add(ld(xs + p, w - p), v_mul(ld(ms + p, w - p), vinv)), w - p);
        /* Pass 2: sums of squared deviations, four rows at a time (norm's padding is zero). */
        size_t r = 0;
        for (; r + 4 <= rows; r += 4) {
            const float * q = xs + r * stride;
            for (size_t p = 0; p < w; p += F) {
                size_t n = w - p;
                vfloat mu = ld(ms + p, n);
                vfloat d0 = v_sub(ld(q + p, n), mu), d1 = v_sub(ld(q + stride + p, n), mu);
                vfloat d2 = v_sub(ld(q + 2 * stride + p, n), mu), d3 = v_sub(ld(q + 3 * stride + p, n), mu);
                vfloat v = v_fma(d3, d3, v_fma(d2, d2, v_fma(d1, d1, v_mul(d0, d0))));
                v_store_aligned(norm + p, r ? v_add(v_load_aligned(norm + p), v) : v);
            }
        }
        for (; r < rows; ++r)
            for (size_t p = 0; p < w; p += F) {
                vfloat d = v_sub(ld(xs + r * stride + p, w - p), ld(ms + p, w - p));
                v_store_aligned(norm + p, v_fma(d, d, r ? v_load_aligned(norm + p) : v_zero()));
            }
        /* norm = 1 / sqrt(var + eps), times scale when scale is per position. */
        unsigned slow = 0;
        for (size_t p = 0; p < w; p += F) {
            vfloat t = v_fma(v_load_aligned(norm + p), vinv, ve);
            bad[p / F] = (uint16_t)slow_lanes(t, w - p);
            slow |= bad[p / F];
            vfloat v = v_div(one, v_sqrt(t));
            v_store_aligned(norm + p, perRow ? v : v_mul(v, ld(scale + p0 + p, w - p)));
        }
        /* Pass 3: output. */
        if (perRow) {
            for (r = 0; r < rows; ++r) {
                const float * q = xs + r * stride;
                float * o = ys + r * stride;
                const vfloat sc = v_set1(scale[r]), sh = v_set1(shift[r]);
                size_t p = 0;
                for (; p + F <= w; p += F) {
                    vfloat d = v_mul(v_sub(v_load(q + p), v_load(ms + p)), v_load_aligned(norm + p));
                    v_store(o + p, v_fma(d, sc, sh));
                }
                if (p < w) {
                    size_t j = tail_at(p, w);
                    vfloat d = v_mul(v_sub(ld(q + j, w - j), ld(ms + j, w - j)), ld(norm + j, w - j));
                    st(o + j, v_fma(d, sc, sh), w - j);
                }
            }
        } else {
            const float * sh = shift + p0;
            for (r = 0; r < rows; ++r) {
                const float * q = xs + r * stride;
                float * o = ys + r * stride;
                size_t p = 0;
                for (; p + F <= w; p += F)
                    v_store(o + p,
                            v_fma(v_sub(v_load(q + p), v_load(ms + p)), v_load_aligned(norm + p), v_load(sh + p)));
                if (p < w) {
                    size_t j = tail_at(p, w);
                    st(o + j, v_fma(v_sub(ld(q + j, w - j), ld(ms + j, w - j)), ld(norm + j, w - j), ld(sh + j, w - j)),
                       w - j);
                }
            }
        }
        /* Positions out of the fp32 range: redone in double (the input is intact). */
        for (size_t j = 0; slow && j * F < w; ++j)
            for (unsigned b = bad[j]; b; b &= b - 1) {
                size_t p = j * F + (size_t)__builtin_ctz(b);
                tn_norm_slow_layer(xs + p, rows, stride, perRow ? scale : scale + p0 + p,
                                   perRow ? shift : shift + p0 + p, perRow ? 1 : 0, eps, ys + p);
            }
    }
}

/* ---- V1: L2 normalization ---------------------------------------------------------------- */

/* y = x * (scale[c] * k), scale per element (step 1) or one value (step 0). */
V_INLINE void scale_row(const float * x, size_t n, const float * scale, size_t step, float k, float * y)
{
    const vfloat vk = v_set1(k);
    if (step == 0) {
        const vfloat a = v_set1(scale[0] * k);
        size_t i = line_head(y, n), h = head_n(i, n);
        if (h)
            st(y, v_mul(ld(x, h), a), h);
        for (; i + 2 * F <= n; i += 2 * F) {
            v_store(y + i, v_mul(v_load(x + i), a));
            v_store(y + i + F, v_mul(v_load(x + i + F), a));
        }
        for (; i + F <= n; i += F)
            v_store(y + i, v_mul(v_load(x + i), a));
        if (i < n) {
            size_t j = tail_at(i, n);
            st(y + j, v_mul(ld(x + j, n - j), a), n - j);
        }
    } else {
        size_t i = 0;
        for (; i + F <= n; i += F)
            v_store(y + i, v_mul(v_load(x + i), v_mul(v_load(scale + i), vk)));
        if (i < n) {
            size_t j = tail_at(i, n);
            st(y + j, v_mul(ld(x + j, n - j), v_mul(ld(scale + j, n - j), vk)), n - j);
        }
    }
}

void TN_ISA(SynetNormalizeLayerForward)(const float * src, size_t batch, size_t channels, size_t spatial,
                                        const float * scale, const float * eps, int acrossSpatial, int format,
                                        float * buf, float * dst)
{
    const size_t size = channels * spatial;
    const float e = eps[0];
    const int nhwc = format == TnTensorFormatNhwc;
    if (size == 0)
        return;
    if (acrossSpatial) {
        for (size_t b = 0; b < batch; ++b) {
            const float * x = src + b * size;
            float * y = dst + b * size;
            float t = sum_squares(x, size) + e, k = 1.0f / sqrtf(t);
            if (!tn_norm_fast_ok(t))
                tn_norm_slow_l2_item(x, channels, spatial, nhwc, scale, e, y);
            else if (nhwc)
                for (size_t s = 0; s < spatial; ++s)
                    scale_row(x + s * channels, channels, scale, 1, k, y + s * channels);
            else
                for (size_t c = 0; c < channels; ++c)
                    scale_row(x + c * spatial, spatial, scale + c, 0, k, y + c * spatial);
        }
    } else if (nhwc || spatial == 1) {
        for (size_t s = 0; s < batch * spatial; ++s) {
            const float * x = src + s * channels;
            float t = row_sum_squares(x, channels) + e;
            if (tn_norm_fast_ok(t))
                scale_row(x, channels, scale, 1, 1.0f / sqrtf(t), dst + s * channels);
            else
                tn_norm_slow_l2(x, channels, 1, scale, 1, e, dst + s * channels);
        }
    } else {
        float * own;
        if ((buf = tn_norm_scratch(buf, spatial, &own)) == NULL) {
            fill_nan(dst, batch * size);
            return;
        }
        for (size_t b = 0; b < batch; ++b)
            l2_across(src + b * size, channels, spatial, scale, e, buf, dst + b * size);
        free(own);
    }
}

/* ---- V2 / V3: layer normalization ------------------------------------------------------ */

/* R (<= 4) consecutive rows of n values side by side, scale/shift per element (V2 NHWC);
 * two accumulators per row. */
V_INLINE void layer_norm_rows(const float * x, size_t R, size_t n, const float * scale, const float * shift, float eps,
                              float * y)
{
    const float inv = 1.0f / (float)n;
    const size_t n2 = n - n % (2 * F);
    vfloat a[4], b[4], m[4], k[4], o[4];
    float t[4];
    for (size_t r = 0; r < R; ++r) {
        a[r] = b[r] = v_zero();
        o[r] = v_set1(x[r * n]);
    }
    size_t i = 0;
    for (; i < n2; i += 2 * F)
        for (size_t r = 0; r < R; ++r) {
            a[r] = v_add(a[r], v_sub(v_load(x + r * n + i), o[r]));
            b[r] = v_add(b[r], v_sub(v_load(x + r * n + i + F), o[r]));
        }
    for (; i < n; i += F)
        for (size_t r = 0; r < R; ++r)
            a[r] = v_add(a[r], sub_n(ld(x + r * n + i, n - i), o[r], n - i));
    for (size_t r = 0; r < R; ++r) {
        m[r] = v_set1(x[r * n] + v_hsum(v_add(a[r], b[r])) * inv);
        a[r] = b[r] = v_zero();
    }
    for (i = 0; i < n2; i += 2 * F)
        for (size_t r = 0; r < R; ++r) {
            vfloat d0 = v_sub(v_load(x + r * n + i), m[r]);
            vfloat d1 = v_sub(v_load(x + r * n + i + F), m[r]);
            a[r] = v_fma(d0, d0, a[r]);
            b[r] = v_fma(d1, d1, b[r]);
        }
    for (; i < n; i += F)
        for (size_t r = 0; r < R; ++r) {
            vfloat d = sub_n(ld(x + r * n + i, n - i), m[r], n - i);
            a[r] = v_fma(d, d, a[r]);
        }
    for (size_t r = 0; r < R; ++r) {
        t[r] = v_hsum(v_add(a[r], b[r])) * inv + eps;
        k[r] = v_set1(1.0f / sqrtf(t[r]));
    }
    /* The output is written row after row: one sequential stream. */
    for (size_t r = 0; r < R; ++r) {
        if (!tn_norm_fast_ok(t[r])) {
            tn_norm_slow_layer(x + r * n, n, 1, scale, shift, 1, eps, y + r * n);
            continue;
        }
        const float * q = x + r * n;
        float * o = y + r * n;
        for (i = 0; i + F <= n; i += F)
            v_store(o + i, v_fma(v_mul(v_sub(v_load(q + i), m[r]), k[r]), v_load(scale + i), v_load(shift + i)));
        if (i < n) {
            size_t j = tail_at(i, n);
            st(o + j, v_fma(v_mul(v_sub(ld(q + j, n - j), m[r]), k[r]), ld(scale + j, n - j), ld(shift + j, n - j)),
               n - j);
        }
    }
}

/* The statistics of one long row (four accumulators): mean and t = variance + eps. */
V_INLINE float row_stats(const float * x, size_t n, float eps, float * mean)
{
    const float inv = 1.0f / (float)n;
    *mean = x[0] + row_sum_from(x, n, x[0]) * inv;
    return row_sum_squared_deviations(x, n, *mean) * inv + eps;
}

/* One long row, scale/shift per element (V2 NHWC). */
V_INLINE void layer_norm_row(const float * x, size_t n, const float * scale, const float * shift, float eps, float * y)
{
    float mean;
    const float t = row_stats(x, n, eps, &mean);
    if (!tn_norm_fast_ok(t)) {
        tn_norm_slow_layer(x, n, 1, scale, shift, 1, eps, y);
        return;
    }
    const vfloat m = v_set1(mean), k = v_set1(1.0f / sqrtf(t));
    size_t i = line_head(y, n), h = head_n(i, n);
    if (h)
        st(y, v_fma(v_mul(v_sub(ld(x, h), m), k), ld(scale, h), ld(shift, h)), h);
    for (; i + 2 * F <= n; i += 2 * F) {
        vfloat d0 = v_mul(v_sub(v_load(x + i), m), k);
        vfloat d1 = v_mul(v_sub(v_load(x + i + F), m), k);
        v_store(y + i, v_fma(d0, v_load(scale + i), v_load(shift + i)));
        v_store(y + i + F, v_fma(d1, v_load(scale + i + F), v_load(shift + i + F)));
    }
    for (; i + F <= n; i += F)
        v_store(y + i, v_fma(v_mul(v_sub(v_load(x + i), m), k), v_load(scale + i), v_load(shift + i)));
    if (i < n) {
        size_t j = tail_at(i, n);
        st(y + j, v_fma(v_mul(v_sub(ld(x + j, n - j), m), k), ld(scale + j, n - j), ld(shift + j, n - j)), n - j);
    }
}

/* One contiguous row with one scale and shift (V3 NCHW). */
V_INLINE void layer_norm_row1(const float * x, size_t n, const float * scale, const float * shift, float eps, float * y)
{
    float mean;
    const float t = row_stats(x, n, eps, &mean);
    if (!tn_norm_fast_ok(t)) {
        tn_norm_slow_layer(x, n, 1, scale, shift, 0, eps, y);
        return;
    }
    const vfloat m = v_set1(mean), k = v_set1(1.0f / sqrtf(t));
    const vfloat sc = v_set1(scale[0]), sh = v_set1(shift[0]);
    size_t i = line_head(y, n), h = head_n(i, n);
    if (h)
        st(y, v_fma(v_mul(v_sub(ld(x, h), m), k), sc, sh), h);
    for (; i + 2 * F <= n; i += 2 * F) {
        vfloat d0 = v_mul(v_sub(v_load(x + i), m), k);
        vfloat d1 = v_mul(v_sub(v_load(x + i + F), m), k);
        v_store(y + i, v_fma(d0, sc, sh));
        v_store(y + i + F, v_fma(d1, sc, sh));
    }
    for (; i + F <= n; i += F)
        v_store(y + i, v_fma(v_mul(v_sub(v_load(x + i), m), k), sc, sh));
    if (i < n) {
        size_t j = tail_at(i, n);
        st(y + j, v_fma(v_mul(v_sub(ld(x + j, n - j), m), k), sc, sh), n - j);
    }
}

/* layer_norm_across for each of `batch` items of rows x count values (V2 NCHW: channels x
 * spatial; V3 NHWC: spatial x channels), with a scratch of count floats. */
V_INLINE void layer_norm_across_batch(const float * src, size_t batch, size_t rows, size_t count, const float * scale,
                                      const float * shift, int per_row, float e, float * buf, float * dst)
{
    const size_t size = rows * count;
    float * own;
    if ((buf = tn_norm_scratch(buf, count, &own)) == NULL) {
        fill_nan(dst, batch * size);
        return;
    }
    for (size_t b = 0; b < batch; ++b)
        layer_norm_across(src + b * size, rows, count, count, scale, shift, per_row, e, buf, dst + b * size);
    free(own);
}

void TN_ISA(SynetNormalizeLayerForwardV2)(const float * src, size_t batch, size_t channels, size_t spatial,
                                          const float * scale, const float * shift, const float * eps, int format,
                                          float * buf, float * dst)
{
    const size_t size = channels * spatial;
    const float e = eps[0];
    if (size == 0)
        return;
    if (format == TnTensorFormatNhwc || spatial == 1) {
        const size_t rows = batch * spatial;
        size_t r = 0;
        if (batch * size * sizeof(float) <= TN_NORM_CACHED_BYTES) {
            for (; r + 4 <= rows; r += 4)
                layer_norm_rows(src + r * channels, 4, channels, scale, shift, e, dst + r * channels);
            for (; r < rows; ++r)
                layer_norm_rows(src + r * channels, 1, channels, scale, shift, e, dst + r * channels);
        } else {
            for (; r < rows; ++r)
                layer_norm_row(src + r * channels, channels, scale, shift, e, dst + r * channels);
        }
    } else {
        layer_norm_across_batch(src, batch, channels, spatial, scale, shift, 1, e, buf, dst);
    }
}

void TN_ISA(SynetNormalizeLayerForwardV3)(const float * src, size_t batch, size_t channels, size_t spatial,
                                          const float * scale, const float * shift, const float * eps, int format,
                                          float * buf, float * dst)
{
    const size_t size = channels * spatial;
    const float e = eps[0];
    if (size == 0)
        return;
    if (format != TnTensorFormatNhwc || channels == 1) {
        for (size_t i = 0; i < batch * channels; ++i)
            layer_norm_row1(src + i * spatial, spatial, scale + i % channels, shift + i % channels, e,
                            dst + i * spatial);
    } else {
        layer_norm_across_batch(src, batch, spatial, channels, scale, shift, 0, e, buf, dst);
    }
}

/* ---- V4: channel norm -------------------------------------------------------------------- */

void TN_ISA(SynetNormalizeLayerForwardV4)(const float * src, size_t batch, size_t channels, size_t spatial,
                                          const float * scale, const float * shift, const float * eps, int format,
                                          float * buf, float * dst)
{
    const size_t size = channels * spatial;
    const float e = eps[0];
    const int nhwc = format == TnTensorFormatNhwc;
    float * own = NULL;
    if (size == 0)
        return;
    if ((buf = tn_norm_scratch(buf, channels, &own)) == NULL) {
        fill_nan(dst, batch * size);
        return;
    }
    for (size_t b = 0; b < batch; ++b) {
        const float * x = src + b * size;
        float * y = dst + b * size;
        if (nhwc) {
            size_t s = 0;
            for (; s + 4 <= spatial; s += 4) {
                const float * p = x + s * channels;
                for (size_t c = 0; c < channels; c += F) {
                    size_t n = channels - c;
                    vfloat x0 = ld(p + c, n), x1 = ld(p + channels + c, n);
                    vfloat x2 = ld(p + 2 * channels + c, n), x3 = ld(p + 3 * channels + c, n);
                    vfloat q = v_fma(x1, x1, v_mul(x0, x0));
                    q = v_fma(x2, x2, q);
                    q = v_fma(x3, x3, q);
                    st(buf + c, s ? v_add(ld(buf + c, n), q) : q, n);
                }
            }
            for (; s < spatial; ++s) {
                const float * p = x + s * channels;
                for (size_t c = 0; c < channels; c += F) {
                    size_t n = channels - c;
                    vfloat x0 = ld(p + c, n);
                    st(buf + c, v_fma(x0, x0, s ? ld(buf + c, n) : v_zero()), n);
                }
            }
        } else {
            for (size_t c = 0; c < channels; ++c)
                buf[c] = sum_squares(x + c * spatial, spatial);
        }
        tn_norm_v4_factors(x, channels, spatial, nhwc, scale, e, buf);
        if (nhwc) {
            for (size_t s = 0; s < spatial; ++s) {
                const float * p = x + s * channels;
                float * q = y + s * channels;
                size_t c = 0;
                for (; c + F <= channels; c += F)
                    v_store(q + c, v_fma(v_load(p + c), v_load(buf + c), v_load(shift + c)));
                if (c < channels) {
                    size_t j = tail_at(c, channels), n = channels - j;
                    st(q + j, v_fma(ld(p + j, n), ld(buf + j, n), ld(shift + j, n)), n);
                }
            }
        } else {
            for (size_t c = 0; c < channels; ++c) {
                const float * p = x + c * spatial;
                float * q = y + c * spatial;
                const vfloat a = v_set1(buf[c]), sh = v_set1(shift[c]);
                size_t s = line_head(q, spatial), h = head_n(s, spatial);
                if (h)
                    st(q, v_fma(ld(p, h), a, sh), h);
                for (; s + 2 * F <= spatial; s += 2 * F) {
                    v_store(q + s, v_fma(v_load(p + s), a, sh));
                    v_store(q + s + F, v_fma(v_load(p + s + F), a, sh));
                }
                for (; s + F <= spatial; s += F)
                    v_store(q + s, v_fma(v_load(p + s), a, sh));
                if (s < spatial) {
                    size_t j = tail_at(s, spatial);
                    st(q + j, v_fma(ld(p + j, spatial - j), a, sh), spatial - j);
                }
            }
        }
    }
    free(own);
}

/* ---- 16bV2: BF16 layer norm across channels (canonical order, see scalar.c) ------------- */

/* Channel pair (2j, 2j + 1) adds to lane j % 16: s += (x0 - c) + (x1 - c) and
 * q = fma(x1 - c, x1 - c, fma(x0 - c, x0 - c, q)). */
V_INLINE void bf16_pair_add(vfloat e, vfloat o, vfloat * s, vfloat * q)
{
    *s = v_add(*s, v_add(e, o));
    *q = v_fma(o, o, v_fma(e, e, *q));
}

/* NHWC: the sums s, q of R (<= 4) consecutive rows about their centers c. A 32-bit load
 * holds a pair of BF16 values: a shift and a mask widen both (half the work of widening
 * 16 values at a time). Each row has its own accumulators, so the rows' chains overlap.
 * x - c is taken as fma(x, 1, -c), the same single rounding: on Zen 4 the shift and the
 * adds share the add pipes, which bound this loop, while the multiply pipes had only the
 * two FMAs (in cache (8,197,768) 182 -> 175 us). */
V_INLINE void bf16_pair_sums(const uint16_t * x, size_t R, size_t n, const vfloat * c, vfloat * s, vfloat * q)
{
    const size_t pairs = n / 2, tail = pairs % F, body = pairs - tail, odd = n % 2;
    const vint hi = vi_set1(-65536); /* 0xffff0000: the odd channel */
    const vfloat one = v_set1(1.0f);
    vfloat nc[4];
    for (size_t r = 0; r < R; ++r) {
        s[r] = q[r] = v_zero();
        nc[r] = v_neg(c[r]);
    }
    for (size_t j = 0; j < body; j += F)
        for (size_t r = 0; r < R; ++r) {
            vint v = vi_load((const int32_t *)(x + r * n) + j);
            bf16_pair_add(v_fma(vi_as_float(vi_sll(v, 16)), one, nc[r]), v_fma(vi_as_float(vi_and(v, hi)), one, nc[r]),
                          s + r, q + r);
        }
    if (tail + odd)
        for (size_t r = 0; r < R; ++r) {
            const uint16_t * p = x + r * n;
            vint v = v_as_int(v_load_n((const float *)p + body, tail)); /* whole pairs only */
            vfloat e = vi_as_float(vi_sll(v, 16));
            if (odd) /* the last channel has no partner: its lane's odd value is +0 */
                e = v_select(m_andnot(m_first(tail), m_first(tail + 1)), v_set1(tn_bf16_to_f32(p[n - 1])), e);
            bf16_pair_add(v_keep(m_first(tail + odd), v_sub(e, c[r])),
                          v_keep(m_first(tail), v_sub(vi_as_float(vi_and(v, hi)), c[r])), s + r, q + r);
        }
}

/* NHWC: R (<= 4) consecutive rows of n channels. Bound by the vector units, not memory, so
 * the statistics take one pass about the center (with pair loads: 10-20% faster at AVX-512
 * than a mean pass, a variance pass and an fp32 copy of the row); a row whose center is
 * more than one standard deviation from its mean (the subtraction in the variance would
 * cancel) takes a second pass about that mean. The output is written row after row: one
 * sequential stream (writing the R rows side by side was no faster). The normalize pass
 * stores two vectors at a time (v_store2_bf16_hw: one conversion for 32 values and no
 * denormal class test, in cache 198 -> 182 us); measured no faster: an fp32 copy of the
 * row (zipped from the pairs) for that pass, R = 2 or 3, the lane sums as FMAs. The
 * normalize pass steps pf, the prefetch of the rows to come (from DRAM the statistics pass
 * would otherwise wait for them). From DRAM the time goes to reading the output's lines
 * for ownership: with them already in cache the kernel runs as fast as in cache, and
 * neither prefetching them (read or write intent) nor staging a group's rows in L1 helped. */
static void layer_norm_rows_bf16(const uint16_t * x, size_t R, size_t n, const float * scale, const float * shift,
                                 float eps, int hw, v_cursor * pf, uint16_t * y)
{
    const float inv = 1.0f / (float)n, pinv = 1.0f / (float)tn_lead_count(n);
    const size_t tail = n % F, body = n - tail;
    vfloat c[4], s[4], q[4];
    float t[4], mean[4];
    for (size_t r = 0; r < R; ++r) {
        mean[r] = v_hsum(v_load_bf16_n(x + r * n, tn_lead_count(n))) * pinv;
        c[r] = v_set1(mean[r]);
    }
    bf16_pair_sums(x, R, n, c, s, q);
    for (size_t r = 0; r < R; ++r) {
        float ms = v_hsum(s[r]) * inv, var = v_hsum(q[r]) * inv - ms * ms;
        mean[r] += ms;
        if (ms * ms > var) {
            vfloat m = v_set1(mean[r]);
            bf16_pair_sums(x + r * n, 1, n, &m, s + r, q + r);
            ms = v_hsum(s[r]) * inv;
            var = v_hsum(q[r]) * inv - ms * ms;
            mean[r] += ms;
        }
        t[r] = var + eps;
    }
    for (size_t r = 0; r < R; ++r) {
        if (!tn_norm_fast_ok(t[r])) {
            tn_norm_slow_layer_bf16(x + r * n, n, 1, scale, shift, 1, eps, y + r * n);
            continue;
        }
        const vfloat m = v_set1(mean[r]), k = v_set1(1.0f / sqrtf(t[r]));
        size_t i = 0;
        for (; i + 2 * F <= body; i += 2 * F) {
            v_cursor_step(pf);
            v_cursor_step(pf);
            vfloat d0 = v_sub(v_load_bf16(x + r * n + i), m), d1 = v_sub(v_load_bf16(x + r * n + i + F), m);
            v_store2_bf16_hw(y + r * n + i, v_fma(v_mul(d0, k), v_load(scale + i), v_load(shift + i)),
                             v_fma(v_mul(d1, k), v_load(scale + i + F), v_load(shift + i + F)), hw);
        }
        for (; i < body; i += F) {
            v_cursor_step(pf);
            vfloat d = v_sub(v_load_bf16(x + r * n + i), m);
            v_store_bf16_hw(y + r * n + i, v_fma(v_mul(d, k), v_load(scale + i), v_load(shift + i)), hw);
        }
        if (tail) {
            vfloat d = v_sub(v_load_bf16_n(x + r * n + body, tail), m);
            v_store_bf16_n(y + r * n + body, v_fma(v_mul(d, k), ld(scale + body, tail), ld(shift + body, tail)), tail);
        }
    }
}

/* NCHW, one chunk of w positions: the pair sums of every position about cen[p], reduced
 * into ls[0] and lq[0] (channel c of position p is the row c at offset p). */
static void across_pair_sums(const uint16_t * xs, size_t C, size_t S, size_t w, const float * cen,
                             float (*ls)[TN_NORM_LANES_CHUNK], float (*lq)[TN_NORM_LANES_CHUNK])
{
    const size_t half = (C + 1) / 2, L = half < 16 ? half : 16;
    for (size_t j = 0; j < half; ++j) {
        const uint16_t *xe = xs + 2 * j * S, *xo = xe + S;
        float *a = ls[j % 16], *b = lq[j % 16];
        const int paired = 2 * j + 1 < C, first = j < 16;
        /* Two rows read side by side are no stream the prefetchers follow well from DRAM
         * (25% slower than one row after the other): prefetch the pair 16 ahead. */
        if (2 * j + 33 < C) {
            v_prefetch_l2_range(xe + 32 * S, w * sizeof(uint16_t));
            v_prefetch_l2_range(xo + 32 * S, w * sizeof(uint16_t));
        }
        for (size_t p = 0; p < w; p += F) {
            const vfloat c = v_load_aligned(cen + p);
            vfloat e = v_sub(v_load_bf16_n(xe + p, w - p), c);
            vfloat o = paired ? v_sub(v_load_bf16_n(xo + p, w - p), c) : v_zero();
            vfloat s = first ? v_zero() : v_load_aligned(a + p), q = first ? v_zero() : v_load_aligned(b + p);
            bf16_pair_add(e, o, &s, &q);
            v_store_aligned(a + p, s);
            v_store_aligned(b + p, q);
        }
    }
    v_lanes_tree(ls[0], TN_NORM_LANES_CHUNK, L, w);
    v_lanes_tree(lq[0], TN_NORM_LANES_CHUNK, L, w);
}

static void layer_norm_across_bf16(const uint16_t * x, size_t C, size_t S, const float * scale, const float * shift,
                                   float eps, int hw, uint16_t * y)
{
    const size_t P = tn_lead_count(C);
    const vfloat vinv = v_set1(1.0f / (float)C), pinv = v_set1(1.0f / (float)P), ve = v_set1(eps), one = v_set1(1.0f);
    float ls[16][TN_NORM_LANES_CHUNK] __attribute__((aligned(64)));
    float lq[16][TN_NORM_LANES_CHUNK] __attribute__((aligned(64)));
    float mean[TN_NORM_LANES_CHUNK] __attribute__((aligned(64)));
    float norm[TN_NORM_LANES_CHUNK] __attribute__((aligned(64)));
    uint16_t bad[TN_NORM_LANES_CHUNK / F], redo[TN_NORM_LANES_CHUNK / F];
    for (size_t s0 = 0; s0 < S; s0 += TN_NORM_LANES_CHUNK) {
        const size_t w = S - s0 < TN_NORM_LANES_CHUNK ? S - s0 : TN_NORM_LANES_CHUNK;
        const uint16_t * xs = x + s0;
        uint16_t * ys = y + s0;
        /* The center: channels 0..P-1 through the v_hsum tree (absent lanes add +0). */
        for (size_t p = 0; p < w; p += F) {
            vfloat v[16];
            for (size_t c = 0; c < 16; ++c)
                v[c] = c < P ? v_load_bf16_n(xs + c * S + p, w - p) : v_zero();
            for (size_t h = 8; h >= 4; h /= 2)
                for (size_t i = 0; i < h; ++i)
                    v[i] = v_add(v[i], v[i + h]);
            v_store_aligned(mean + p, v_mul(v_add(v_add(v[0], v[2]), v_add(v[1], v[3])), pinv));
        }
        across_pair_sums(xs, C, S, w, mean, ls, lq);
        unsigned again = 0;
        for (size_t p = 0; p < w; p += F) {
            vfloat ms = v_mul(v_load_aligned(ls[0] + p), vinv), sq = v_mul(ms, ms);
            vfloat var = v_sub(v_mul(v_load_aligned(lq[0] + p), vinv), sq);
            redo[p / F] = (uint16_t)(m_bits(v_gt(sq, var)) & m_bits(m_first(w - p)));
            again |= redo[p / F];
            v_store_aligned(mean + p, v_add(v_load_aligned(mean + p), ms));
            v_store_aligned(norm + p, var);
        }
        if (again) { /* a second pass about the mean where the center was too far from it */
            across_pair_sums(xs, C, S, w, mean, ls, lq);
            for (size_t p = 0; p < w; p += F) {
                vfloat ms = v_mul(v_load_aligned(ls[0] + p), vinv);
                vfloat var = v_sub(v_mul(v_load_aligned(lq[0] + p), vinv), v_mul(ms, ms));
                for (unsigned b = redo[p / F]; b; b &= b - 1) {
                    int i = __builtin_ctz(b);
                    mean[p + (size_t)i] += v_lane(ms, i);
                    norm[p + (size_t)i] = v_lane(var, i);
                }
            }
        }
        unsigned slow = 0;
        for (size_t p = 0; p < w; p += F) {
            vfloat t = v_add(v_load_aligned(norm + p), ve);
            bad[p / F] = (uint16_t)slow_lanes(t, w - p);
            slow |= bad[p / F];
            v_store_aligned(norm + p, v_div(one, v_sqrt(t)));
        }
        /* The rows' next chunks are only short segments, which the hardware prefetchers
         * hardly pick up: prefetch them into L2 while this chunk is written. */
        const size_t wn = s0 + w < S ? (S - s0 - w < TN_NORM_LANES_CHUNK ? S - s0 - w : TN_NORM_LANES_CHUNK) : 0;
        for (size_t c = 0; c < C; ++c) {
            const uint16_t * q = xs + c * S;
            uint16_t * o = ys + c * S;
            const vfloat sc = v_set1(scale[c]), sh = v_set1(shift[c]);
            if (wn)
                v_prefetch_l2_range(q + w, wn * sizeof(uint16_t));
            size_t p = 0;
            for (; p + F <= w; p += F) {
                vfloat d = v_sub(v_load_bf16(q + p), v_load_aligned(mean + p));
                v_store_bf16_hw(o + p, v_fma(v_mul(d, v_load_aligned(norm + p)), sc, sh), hw);
            }
            if (p < w) {
                vfloat d = v_sub(v_load_bf16_n(q + p, w - p), v_load_aligned(mean + p));
                v_store_bf16_n(o + p, v_fma(v_mul(d, v_load_aligned(norm + p)), sc, sh), w - p);
            }
        }
        for (size_t j = 0; slow && j * F < w; ++j)
            for (unsigned b = bad[j]; b; b &= b - 1) {
                size_t p = j * F + (size_t)__builtin_ctz(b);
                tn_norm_slow_layer_bf16(xs + p, C, S, scale, shift, 1, eps, ys + p);
            }
    }
}

void TN_ISA(SynetNormalizeLayerForward16bV2)(const uint16_t * src, size_t batch, size_t channels, size_t spatial,
                                             const float * scale, const float * shift, const float * eps, int format,
                                             float * buf, uint16_t * dst)
{
    const size_t size = channels * spatial;
    const float e = eps[0];
    const int hw = v_hw_bf16();
    (void)buf; /* no scratch needed */
    if (size == 0)
        return;
    if (format == TnTensorFormatNhwc || spatial == 1) {
        /* Groups of four rows; pf prefetches from the second group on, up to the end of the
         * group after the one being written plus TN_NORM_AHEAD_BYTES. */
        const size_t rows = batch * spatial, row_bytes = channels * sizeof(uint16_t), total = rows * row_bytes;
        const char * const bytes = (const char *)src;
        v_cursor pf = {bytes + (4 * row_bytes < total ? 4 * row_bytes : total), NULL};
        for (size_t r = 0, R; r < rows; r += R) {
            R = rows - r >= 4 ? 4 : 1;
            const size_t ahead = (r + R + 4) * row_bytes + TN_NORM_AHEAD_BYTES;
            pf.end = bytes + (ahead < total ? ahead : total);
            layer_norm_rows_bf16(src + r * channels, R, channels, scale, shift, e, hw, &pf, dst + r * channels);
        }
    } else {
        for (size_t b = 0; b < batch; ++b)
            layer_norm_across_bf16(src + b * size, channels, spatial, scale, shift, e, hw, dst + b * size);
    }
}

#undef F
#undef HW_BF16
