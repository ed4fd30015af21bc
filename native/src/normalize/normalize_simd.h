/*
 * Normalize layer family (seed 000), AVX-512 level: same algorithms and work layout as
 * normalize_scalar.c (see there).
 * - Statistics along a contiguous row (V2/L2 NHWC, V3 NCHW, V4 NCHW) are computed while the
 *   row stays in L1. When the whole tensor is in cache, V2 NHWC runs four rows side by side
 *   so that their reduction chains overlap.
 * - Statistics across rows (V2/L2/16bV2 NCHW: across channels; V3 NHWC: across spatial
 *   positions) stream whole rows into per-position accumulators (buf, or stack arrays).
 * - The output is always written as one sequential stream, row after row: interleaving
 *   several output rows measured clearly slower on large tensors.
 * - 16bV2 keeps the canonical 16-lane order: one __m512 accumulator per row in NHWC (lane =
 *   channel % 16) reduced with tn_avx512_hsum, and 16 lane arrays per position in NCHW
 *   reduced with the same tree.
 */
#include "vmath_avx512.h"

#include <stdlib.h>

#include "kernels.h"
#include "tensorops.h"

#define F TN_AVX512_F
#define TN_NORM_SUM_BLOCK 4096          /* long sums add partial sums of this many values */
/* V2 NHWC runs four rows side by side (overlapping their reduction chains) when the whole
 * tensor is in cache, where the kernel is latency-bound; larger tensors are bandwidth-bound
 * and stream faster row by row (measured). */
#ifndef TN_NORM_CACHED_BYTES
#define TN_NORM_CACHED_BYTES (1024 * 1024)
#endif

#define INLINE static inline __attribute__((always_inline))

/* Mask of min(n, 16) lanes. */
INLINE __mmask16 lanes(size_t n)
{
    return n >= F ? (__mmask16)0xffff : tn_avx512_tail_mask(n);
}

INLINE __m512 load(const float * p, __mmask16 k) { return _mm512_maskz_loadu_ps(k, p); }
INLINE void store(float * p, __mmask16 k, __m512 v) { _mm512_mask_storeu_ps(p, k, v); }

/* min(n, floats from p to its next 64-byte boundary). NumPy data is typically only 16-byte
 * aligned: a masked head of this many values makes the following full-vector stores whole
 * cache lines (a 64-byte store across two lines costs about twice as much). Only stores are
 * aligned this way: reductions keep their lane order independent of the address, so results
 * do not depend on where the input happens to lie. */
INLINE size_t line_head(const void * p, size_t n)
{
    size_t h = ((size_t)0 - (size_t)(uintptr_t)p) % 64 / sizeof(float);
    return h < n ? h : n;
}

/* Prefetch into L2 the cache lines of [p, p + bytes), bytes > 0, all inside the tensor. */
INLINE void prefetch_l2(const void * p, size_t bytes)
{
    const char * c = (const char *)p;
    for (size_t i = 0; i < bytes; i += 64)
        _mm_prefetch(c + i, _MM_HINT_T1);
    _mm_prefetch(c + bytes - 1, _MM_HINT_T1);
}

static void fill_nan(float * dst, size_t n)
{
    for (size_t i = 0; i < n; i += F)
        store(dst + i, lanes(n - i), _mm512_set1_ps(NAN));
}

/* ---- Row reductions (four accumulators) ------------------------------------------------ */

INLINE float row_sum(const float * x, size_t n)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 4 * F <= n; i += 4 * F) {
        a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i + 0 * F));
        a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + i + 1 * F));
        a2 = _mm512_add_ps(a2, _mm512_loadu_ps(x + i + 2 * F));
        a3 = _mm512_add_ps(a3, _mm512_loadu_ps(x + i + 3 * F));
    }
    for (; i < n; i += F)
        a0 = _mm512_add_ps(a0, load(x + i, lanes(n - i)));
    return tn_avx512_hsum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

INLINE float row_sum_squares(const float * x, size_t n)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 4 * F <= n; i += 4 * F) {
        __m512 x0 = _mm512_loadu_ps(x + i + 0 * F), x1 = _mm512_loadu_ps(x + i + 1 * F);
        __m512 x2 = _mm512_loadu_ps(x + i + 2 * F), x3 = _mm512_loadu_ps(x + i + 3 * F);
        a0 = _mm512_fmadd_ps(x0, x0, a0);
        a1 = _mm512_fmadd_ps(x1, x1, a1);
        a2 = _mm512_fmadd_ps(x2, x2, a2);
        a3 = _mm512_fmadd_ps(x3, x3, a3);
    }
    for (; i < n; i += F) {
        __m512 x0 = load(x + i, lanes(n - i));
        a0 = _mm512_fmadd_ps(x0, x0, a0);
    }
    return tn_avx512_hsum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* Long sums of squares add partial sums of TN_NORM_SUM_BLOCK values (smaller error). */
static float sum_squares(const float * x, size_t n)
{
    float total = 0.0f;
    for (size_t i = 0; i < n; i += TN_NORM_SUM_BLOCK)
        total += row_sum_squares(x + i, n - i < TN_NORM_SUM_BLOCK ? n - i : TN_NORM_SUM_BLOCK);
    return total;
}

INLINE float row_sum_squared_deviations(const float * x, size_t n, float mean)
{
    const __m512 m = _mm512_set1_ps(mean);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 4 * F <= n; i += 4 * F) {
        __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(x + i + 0 * F), m);
        __m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(x + i + 1 * F), m);
        __m512 d2 = _mm512_sub_ps(_mm512_loadu_ps(x + i + 2 * F), m);
        __m512 d3 = _mm512_sub_ps(_mm512_loadu_ps(x + i + 3 * F), m);
        a0 = _mm512_fmadd_ps(d0, d0, a0);
        a1 = _mm512_fmadd_ps(d1, d1, a1);
        a2 = _mm512_fmadd_ps(d2, d2, a2);
        a3 = _mm512_fmadd_ps(d3, d3, a3);
    }
    for (; i < n; i += F) {
        __mmask16 k = lanes(n - i);
        __m512 d = _mm512_maskz_sub_ps(k, load(x + i, k), m);
        a0 = _mm512_fmadd_ps(d, d, a0);
    }
    return tn_avx512_hsum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* ---- Statistics across rows (NCHW across channels, NHWC across spatial positions) --------
 * `rows` rows of `count` positions, `stride` values apart (NCHW: channels x spatial; NHWC:
 * spatial x channels). Whole rows are streamed, four at a time, into one accumulator per
 * position in buf; a second per-position array (the norm) is on the stack, so positions are
 * taken in chunks of at most TN_NORM_CHUNK (long enough to stream well). */

#define TN_NORM_CHUNK 2048

/* acc[p] = sum over the rows of f(x[r * stride + p]), p < w; f = identity or square. Sums run
 * four rows at a time, sums of squares (one FMA per value) one row at a time: measured
 * fastest for each. */
INLINE void column_sums(const float * x, size_t rows, size_t stride, size_t w, int square, float * acc)
{
    size_t r = 0;
    for (; !square && r + 4 <= rows; r += 4) {
        const float * q = x + r * stride;
        for (size_t p = 0; p < w; p += F) {
            __mmask16 m = lanes(w - p);
            __m512 x0 = load(q + p, m), x1 = load(q + stride + p, m);
            __m512 x2 = load(q + 2 * stride + p, m), x3 = load(q + 3 * stride + p, m);
            __m512 v = _mm512_add_ps(_mm512_add_ps(x0, x1), _mm512_add_ps(x2, x3));
            store(acc + p, m, r ? _mm512_add_ps(load(acc + p, m), v) : v);
        }
    }
    for (; r < rows; ++r) {
        const float * q = x + r * stride;
        for (size_t p = 0; p < w; p += F) {
            __mmask16 m = lanes(w - p);
            __m512 x0 = load(q + p, m);
            __m512 a = r ? load(acc + p, m) : _mm512_setzero_ps();
            store(acc + p, m, square ? _mm512_fmadd_ps(x0, x0, a) : _mm512_add_ps(a, x0));
        }
    }
}

/* L2 normalization across channels (NCHW item): y = x * (scale[c] * k[s]); k in buf. Taking
 * the positions in chunks whose rows stay in L2 (with the next chunk prefetched) measured
 * slower here than two whole passes. */
static void l2_across(const float * x, size_t C, size_t S, const float * scale, float eps, float * k, float * y)
{
    const __m512 ve = _mm512_set1_ps(eps), one = _mm512_set1_ps(1.0f);
    for (size_t s0 = 0, w = S; s0 < S; s0 += w) {
        float * ks = k + s0;
        column_sums(x + s0, C, S, w, 1, ks);
        for (size_t s = 0; s < w; s += F) {
            __mmask16 m = lanes(w - s);
            store(ks + s, m, _mm512_div_ps(one, _mm512_sqrt_ps(_mm512_add_ps(load(ks + s, m), ve))));
        }
        for (size_t c = 0; c < C; ++c) {
            const float * p = x + c * S + s0;
            float * q = y + c * S + s0;
            const __m512 sc = _mm512_set1_ps(scale[c]);
            size_t s = line_head(q, w);
            if (s) {
                __mmask16 m = tn_avx512_tail_mask(s);
                store(q, m, _mm512_mul_ps(load(p, m), _mm512_mul_ps(sc, load(ks, m))));
            }
            for (; s + F <= w; s += F)
                _mm512_store_ps(q + s, _mm512_mul_ps(_mm512_loadu_ps(p + s), _mm512_mul_ps(sc, _mm512_loadu_ps(ks + s))));
            if (s < w) {
                __mmask16 m = lanes(w - s);
                store(q + s, m, _mm512_mul_ps(load(p + s, m), _mm512_mul_ps(sc, load(ks + s, m))));
            }
        }
    }
}

/* Layer norm across rows of one batch item; scale/shift per row (V2 NCHW) or per position
 * (V3 NHWC). mean (count floats) is buf. */
INLINE void layer_norm_across(const float * x, size_t rows, size_t count, size_t stride, const float * scale,
                              const float * shift, int perRow, float eps, float * mean, float * y)
{
    const __m512 vinv = _mm512_set1_ps(1.0f / (float)rows), ve = _mm512_set1_ps(eps), one = _mm512_set1_ps(1.0f);
    float norm[TN_NORM_CHUNK] __attribute__((aligned(64)));
    for (size_t p0 = 0; p0 < count; p0 += TN_NORM_CHUNK) {
        const size_t w = count - p0 < TN_NORM_CHUNK ? count - p0 : TN_NORM_CHUNK;
        const float * xs = x + p0;
        float * ys = y + p0, * ms = mean + p0;
        /* Pass 1: means. */
        column_sums(xs, rows, stride, w, 0, ms);
        for (size_t p = 0; p < w; p += F) {
            __mmask16 m = lanes(w - p);
            store(ms + p, m, _mm512_mul_ps(load(ms + p, m), vinv));
        }
        /* Pass 2: sums of squared deviations, four rows at a time (norm's padding is zero). */
        size_t r = 0;
        for (; r + 4 <= rows; r += 4) {
            const float * q = xs + r * stride;
            for (size_t p = 0; p < w; p += F) {
                __mmask16 m = lanes(w - p);
                __m512 mu = load(ms + p, m);
                __m512 d0 = _mm512_sub_ps(load(q + p, m), mu), d1 = _mm512_sub_ps(load(q + stride + p, m), mu);
                __m512 d2 = _mm512_sub_ps(load(q + 2 * stride + p, m), mu), d3 = _mm512_sub_ps(load(q + 3 * stride + p, m), mu);
                __m512 v = _mm512_fmadd_ps(d3, d3, _mm512_fmadd_ps(d2, d2, _mm512_fmadd_ps(d1, d1, _mm512_mul_ps(d0, d0))));
                _mm512_store_ps(norm + p, r ? _mm512_add_ps(_mm512_load_ps(norm + p), v) : v);
            }
        }
        for (; r < rows; ++r)
            for (size_t p = 0; p < w; p += F) {
                __mmask16 m = lanes(w - p);
                __m512 d = _mm512_sub_ps(load(xs + r * stride + p, m), load(ms + p, m));
                _mm512_store_ps(norm + p, _mm512_fmadd_ps(d, d, r ? _mm512_load_ps(norm + p) : _mm512_setzero_ps()));
            }
        /* norm = 1 / sqrt(var + eps), times scale when scale is per position. */
        for (size_t p = 0; p < w; p += F) {
            __m512 v = _mm512_div_ps(one, _mm512_sqrt_ps(_mm512_fmadd_ps(_mm512_load_ps(norm + p), vinv, ve)));
            _mm512_store_ps(norm + p, perRow ? v : _mm512_mul_ps(v, load(scale + p0 + p, lanes(w - p))));
        }
        /* Pass 3: output. */
        if (perRow) {
            for (r = 0; r < rows; ++r) {
                const float * q = xs + r * stride;
                float * o = ys + r * stride;
                const __m512 sc = _mm512_set1_ps(scale[r]), sh = _mm512_set1_ps(shift[r]);
                size_t p = 0;
                for (; p + F <= w; p += F) {
                    __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(q + p), _mm512_loadu_ps(ms + p)), _mm512_load_ps(norm + p));
                    _mm512_storeu_ps(o + p, _mm512_fmadd_ps(d, sc, sh));
                }
                if (p < w) {
                    __mmask16 m = lanes(w - p);
                    __m512 d = _mm512_mul_ps(_mm512_sub_ps(load(q + p, m), load(ms + p, m)), _mm512_load_ps(norm + p));
                    store(o + p, m, _mm512_fmadd_ps(d, sc, sh));
                }
            }
        } else {
            /* One row at a time: the output is written as one sequential stream. */
            const float * sh = shift + p0;
            for (r = 0; r < rows; ++r)
                for (size_t p = 0; p < w; p += F) {
                    __mmask16 m = lanes(w - p);
                    __m512 d = _mm512_sub_ps(load(xs + r * stride + p, m), load(ms + p, m));
                    store(ys + r * stride + p, m, _mm512_fmadd_ps(d, _mm512_load_ps(norm + p), load(sh + p, m)));
                }
        }
    }
}

/* ---- V1: L2 normalization ---------------------------------------------------------------- */

/* y = x * (scale[c] * k), scale per element (step 1) or one value (step 0). */
INLINE void scale_row(const float * x, size_t n, const float * scale, size_t step, float k, float * y)
{
    const __m512 vk = _mm512_set1_ps(k);
    if (step == 0) {
        const __m512 a = _mm512_set1_ps(scale[0] * k);
        size_t i = line_head(y, n);
        if (i)
            store(y, tn_avx512_tail_mask(i), _mm512_mul_ps(load(x, tn_avx512_tail_mask(i)), a));
        for (; i + 2 * F <= n; i += 2 * F) {
            _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), a));
            _mm512_storeu_ps(y + i + F, _mm512_mul_ps(_mm512_loadu_ps(x + i + F), a));
        }
        for (; i < n; i += F) {
            __mmask16 m = lanes(n - i);
            store(y + i, m, _mm512_mul_ps(load(x + i, m), a));
        }
    } else {
        for (size_t i = 0; i < n; i += F) {
            __mmask16 m = lanes(n - i);
            store(y + i, m, _mm512_mul_ps(load(x + i, m), _mm512_mul_ps(load(scale + i, m), vk)));
        }
    }
}

void tn_avx512_SynetNormalizeLayerForward(const float * src, size_t batch, size_t channels, size_t spatial,
                                          const float * scale, const float * eps, int acrossSpatial, int format,
                                          float * buf, float * dst)
{
    const size_t size = channels * spatial;
    const float e = eps[0];
    if (size == 0)
        return;
    if (acrossSpatial) {
        for (size_t b = 0; b < batch; ++b) {
            const float * x = src + b * size;
            float * y = dst + b * size;
            float k = 1.0f / sqrtf(sum_squares(x, size) + e);
            if (format == TnTensorFormatNhwc)
                for (size_t s = 0; s < spatial; ++s)
                    scale_row(x + s * channels, channels, scale, 1, k, y + s * channels);
            else
                for (size_t c = 0; c < channels; ++c)
                    scale_row(x + c * spatial, spatial, scale + c, 0, k, y + c * spatial);
        }
    } else if (format == TnTensorFormatNhwc || spatial == 1) {
        for (size_t s = 0; s < batch * spatial; ++s) {
            const float * x = src + s * channels;
            float k = 1.0f / sqrtf(row_sum_squares(x, channels) + e);
            scale_row(x, channels, scale, 1, k, dst + s * channels);
        }
    } else {
        float * own = buf ? NULL : malloc(spatial * sizeof(float));
        if (!buf && !own) {
            fill_nan(dst, batch * size);
            return;
        }
        for (size_t b = 0; b < batch; ++b)
            l2_across(src + b * size, channels, spatial, scale, e, buf ? buf : own, dst + b * size);
        free(own);
    }
}

/* ---- V2 / V3: layer normalization ------------------------------------------------------ */

/* R (<= 4) consecutive rows of n values side by side, scale/shift per element (V2 NHWC);
 * two accumulators per row. */
INLINE void layer_norm_rows(const float * x, size_t R, size_t n, const float * scale, const float * shift, float eps,
                            float * y)
{
    const float inv = 1.0f / (float)n;
    const size_t n2 = n - n % (2 * F);
    __m512 a[4], b[4], m[4], k[4];
    for (size_t r = 0; r < R; ++r)
        a[r] = b[r] = _mm512_setzero_ps();
    size_t i = 0;
    for (; i < n2; i += 2 * F)
        for (size_t r = 0; r < R; ++r) {
            a[r] = _mm512_add_ps(a[r], _mm512_loadu_ps(x + r * n + i));
            b[r] = _mm512_add_ps(b[r], _mm512_loadu_ps(x + r * n + i + F));
        }
    for (; i < n; i += F) {
        __mmask16 t = lanes(n - i);
        for (size_t r = 0; r < R; ++r)
            a[r] = _mm512_add_ps(a[r], load(x + r * n + i, t));
    }
    for (size_t r = 0; r < R; ++r) {
        m[r] = _mm512_set1_ps(tn_avx512_hsum(_mm512_add_ps(a[r], b[r])) * inv);
        a[r] = b[r] = _mm512_setzero_ps();
    }
    for (i = 0; i < n2; i += 2 * F)
        for (size_t r = 0; r < R; ++r) {
            __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(x + r * n + i), m[r]);
            __m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(x + r * n + i + F), m[r]);
            a[r] = _mm512_fmadd_ps(d0, d0, a[r]);
            b[r] = _mm512_fmadd_ps(d1, d1, b[r]);
        }
    for (; i < n; i += F) {
        __mmask16 t = lanes(n - i);
        for (size_t r = 0; r < R; ++r) {
            __m512 d = _mm512_maskz_sub_ps(t, load(x + r * n + i, t), m[r]);
            a[r] = _mm512_fmadd_ps(d, d, a[r]);
        }
    }
    for (size_t r = 0; r < R; ++r)
        k[r] = _mm512_set1_ps(1.0f / sqrtf(tn_avx512_hsum(_mm512_add_ps(a[r], b[r])) * inv + eps));
    /* The output is written row after row: one sequential stream. */
    for (size_t r = 0; r < R; ++r)
        for (i = 0; i < n; i += F) {
            __mmask16 t = lanes(n - i);
            __m512 d = _mm512_mul_ps(_mm512_sub_ps(load(x + r * n + i, t), m[r]), k[r]);
            store(y + r * n + i, t, _mm512_fmadd_ps(d, load(scale + i, t), load(shift + i, t)));
        }
}

/* One long row, four accumulators, scale/shift per element (V2 NHWC). */
INLINE void layer_norm_row(const float * x, size_t n, const float * scale, const float * shift, float eps, float * y)
{
    const float inv = 1.0f / (float)n;
    const float mean = row_sum(x, n) * inv;
    const float norm = 1.0f / sqrtf(row_sum_squared_deviations(x, n, mean) * inv + eps);
    const __m512 m = _mm512_set1_ps(mean), k = _mm512_set1_ps(norm);
    size_t i = line_head(y, n);
    if (i) {
        __mmask16 t = tn_avx512_tail_mask(i);
        __m512 d = _mm512_mul_ps(_mm512_sub_ps(load(x, t), m), k);
        store(y, t, _mm512_fmadd_ps(d, load(scale, t), load(shift, t)));
    }
    for (; i + 2 * F <= n; i += 2 * F) {
        __m512 d0 = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), m), k);
        __m512 d1 = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i + F), m), k);
        _mm512_store_ps(y + i, _mm512_fmadd_ps(d0, _mm512_loadu_ps(scale + i), _mm512_loadu_ps(shift + i)));
        _mm512_store_ps(y + i + F, _mm512_fmadd_ps(d1, _mm512_loadu_ps(scale + i + F), _mm512_loadu_ps(shift + i + F)));
    }
    for (; i < n; i += F) {
        __mmask16 t = lanes(n - i);
        __m512 d = _mm512_mul_ps(_mm512_sub_ps(load(x + i, t), m), k);
        store(y + i, t, _mm512_fmadd_ps(d, load(scale + i, t), load(shift + i, t)));
    }
}

/* One contiguous row with one scale and shift (V3 NCHW). */
INLINE void layer_norm_row1(const float * x, size_t n, float scale, float shift, float eps, float * y)
{
    const float inv = 1.0f / (float)n;
    const float mean = row_sum(x, n) * inv;
    const float norm = 1.0f / sqrtf(row_sum_squared_deviations(x, n, mean) * inv + eps);
    const __m512 m = _mm512_set1_ps(mean), k = _mm512_set1_ps(norm);
    const __m512 sc = _mm512_set1_ps(scale), sh = _mm512_set1_ps(shift);
    size_t i = line_head(y, n);
    if (i) {
        __mmask16 t = tn_avx512_tail_mask(i);
        store(y, t, _mm512_fmadd_ps(_mm512_mul_ps(_mm512_sub_ps(load(x, t), m), k), sc, sh));
    }
    for (; i + 2 * F <= n; i += 2 * F) {
        __m512 d0 = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), m), k);
        __m512 d1 = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i + F), m), k);
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(d0, sc, sh));
        _mm512_storeu_ps(y + i + F, _mm512_fmadd_ps(d1, sc, sh));
    }
    for (; i < n; i += F) {
        __mmask16 t = lanes(n - i);
        store(y + i, t, _mm512_fmadd_ps(_mm512_mul_ps(_mm512_sub_ps(load(x + i, t), m), k), sc, sh));
    }
}

void tn_avx512_SynetNormalizeLayerForwardV2(const float * src, size_t batch, size_t channels, size_t spatial,
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
        float * own = buf ? NULL : malloc(spatial * sizeof(float));
        if (!buf && !own) {
            fill_nan(dst, batch * size);
            return;
        }
        for (size_t b = 0; b < batch; ++b)
            layer_norm_across(src + b * size, channels, spatial, spatial, scale, shift, 1, e, buf ? buf : own, dst + b * size);
        free(own);
    }
}

void tn_avx512_SynetNormalizeLayerForwardV3(const float * src, size_t batch, size_t channels, size_t spatial,
                                            const float * scale, const float * shift, const float * eps, int format,
                                            float * buf, float * dst)
{
    const size_t size = channels * spatial;
    const float e = eps[0];
    if (size == 0)
        return;
    if (format != TnTensorFormatNhwc || channels == 1) {
        for (size_t i = 0; i < batch * channels; ++i)
            layer_norm_row1(src + i * spatial, spatial, scale[i % channels], shift[i % channels], e, dst + i * spatial);
    } else {
        float * own = buf ? NULL : malloc(channels * sizeof(float));
        if (!buf && !own) {
            fill_nan(dst, batch * size);
            return;
        }
        for (size_t b = 0; b < batch; ++b)
            layer_norm_across(src + b * size, spatial, channels, channels, scale, shift, 0, e, buf ? buf : own, dst + b * size);
        free(own);
    }
}

/* ---- V4: channel norm -------------------------------------------------------------------- */

void tn_avx512_SynetNormalizeLayerForwardV4(const float * src, size_t batch, size_t channels, size_t spatial,
                                            const float * scale, const float * shift, const float * eps, int format,
                                            float * buf, float * dst)
{
    const size_t size = channels * spatial;
    const float e = eps[0], inv = 1.0f / (float)channels;
    const int nhwc = format == TnTensorFormatNhwc;
    float * own = NULL;
    if (size == 0)
        return;
    if (buf == NULL) {
        if ((own = malloc(channels * sizeof(float))) == NULL) {
            fill_nan(dst, batch * size);
            return;
        }
        buf = own;
    }
    for (size_t b = 0; b < batch; ++b) {
        const float * x = src + b * size;
        float * y = dst + b * size;
        if (nhwc) {
            size_t s = 0;
            for (; s + 4 <= spatial; s += 4) {
                const float * p = x + s * channels;
                for (size_t c = 0; c < channels; c += F) {
                    __mmask16 m = lanes(channels - c);
                    __m512 x0 = load(p + c, m), x1 = load(p + channels + c, m);
                    __m512 x2 = load(p + 2 * channels + c, m), x3 = load(p + 3 * channels + c, m);
                    __m512 q = _mm512_fmadd_ps(x1, x1, _mm512_mul_ps(x0, x0));
                    q = _mm512_fmadd_ps(x2, x2, q);
                    q = _mm512_fmadd_ps(x3, x3, q);
                    store(buf + c, m, s ? _mm512_add_ps(load(buf + c, m), q) : q);
                }
            }
            for (; s < spatial; ++s) {
                const float * p = x + s * channels;
                for (size_t c = 0; c < channels; c += F) {
                    __mmask16 m = lanes(channels - c);
                    __m512 x0 = load(p + c, m);
                    store(buf + c, m, _mm512_fmadd_ps(x0, x0, s ? load(buf + c, m) : _mm512_setzero_ps()));
                }
            }
        } else {
            for (size_t c = 0; c < channels; ++c)
                buf[c] = sum_squares(x + c * spatial, spatial);
        }
        float sum = 0.0f;
        for (size_t c = 0; c < channels; ++c) {
            buf[c] = sqrtf(buf[c]);
            sum += buf[c];
        }
        const float norm = 1.0f / (sum * inv + e);
        for (size_t c = 0; c < channels; ++c)
            buf[c] = 1.0f + scale[c] * buf[c] * norm;
        if (nhwc) {
            for (size_t s = 0; s < spatial; ++s) {
                const float * p = x + s * channels;
                float * q = y + s * channels;
                for (size_t c = 0; c < channels; c += F) {
                    __mmask16 m = lanes(channels - c);
                    store(q + c, m, _mm512_fmadd_ps(load(p + c, m), load(buf + c, m), load(shift + c, m)));
                }
            }
        } else {
            for (size_t c = 0; c < channels; ++c) {
                const float * p = x + c * spatial;
                float * q = y + c * spatial;
                const __m512 a = _mm512_set1_ps(buf[c]), sh = _mm512_set1_ps(shift[c]);
                size_t s = line_head(q, spatial);
                if (s) {
                    __mmask16 m = tn_avx512_tail_mask(s);
                    store(q, m, _mm512_fmadd_ps(load(p, m), a, sh));
                }
                for (; s + 2 * F <= spatial; s += 2 * F) {
                    _mm512_storeu_ps(q + s, _mm512_fmadd_ps(_mm512_loadu_ps(p + s), a, sh));
                    _mm512_storeu_ps(q + s + F, _mm512_fmadd_ps(_mm512_loadu_ps(p + s + F), a, sh));
                }
                for (; s < spatial; s += F) {
                    __mmask16 m = lanes(spatial - s);
                    store(q + s, m, _mm512_fmadd_ps(load(p + s, m), a, sh));
                }
            }
        }
    }
    free(own);
}

/* ---- 16bV2: BF16 layer norm across channels (canonical order, see normalize_scalar.c) -- */

/* fp32 -> bf16 of 16 lanes. hw (the CPU has AVX512_BF16, checked once per call): one
 * VCVTNEPS2BF16, which rounds exactly as tn_avx512_f32_to_bf16 (to nearest even, NaN made
 * quiet with its sign: checked over all 2^32 inputs) except that it flushes denormal inputs
 * to zero, so vectors with any denormal lane take the integer sequence. Written as inline
 * assembly so that the instruction is only ever reached when hw is set. */
INLINE __m256i to_bf16(__m512 v, int hw)
{
    if (hw && !_mm512_fpclass_ps_mask(v, 0x20)) {
        __m256i r;
        __asm__("vcvtneps2bf16 %1, %0" : "=v"(r) : "v"(v));
        return r;
    }
    return tn_avx512_f32_to_bf16(v);
}

INLINE void store_bf16(uint16_t * p, __m512 v, int hw) { _mm256_storeu_si256((__m256i *)p, to_bf16(v, hw)); }

INLINE void mask_store_bf16(uint16_t * p, __mmask16 m, __m512 v, int hw) { _mm256_mask_storeu_epi16(p, m, to_bf16(v, hw)); }

/* NHWC: R (<= 4) consecutive rows of n channels at once. Each row has its own accumulator
 * (channel c is lane c % 16), so the serial canonical chains of the rows overlap. The BF16
 * row stays in L1 and is converted again in each pass. */
INLINE void layer_norm_rows_bf16(const uint16_t * x, size_t R, size_t n, const float * scale, const float * shift,
                                 float eps, int hw, uint16_t * y)
{
    const float inv = 1.0f / (float)n;
    const __mmask16 tail = tn_avx512_tail_mask(n % F);
    const size_t body = n - n % F;
    __m512 a[4], m[4], k[4];
    for (size_t r = 0; r < R; ++r)
        a[r] = _mm512_setzero_ps();
    for (size_t i = 0; i < body; i += F)
        for (size_t r = 0; r < R; ++r)
            a[r] = _mm512_add_ps(a[r], tn_avx512_load_bf16(x + r * n + i));
    if (tail)
        for (size_t r = 0; r < R; ++r)
            a[r] = _mm512_add_ps(a[r], tn_avx512_maskz_load_bf16(tail, x + r * n + body));
    for (size_t r = 0; r < R; ++r) {
        m[r] = _mm512_set1_ps(tn_avx512_hsum(a[r]) * inv);
        a[r] = _mm512_setzero_ps();
    }
    for (size_t i = 0; i < body; i += F)
        for (size_t r = 0; r < R; ++r) {
            __m512 d = _mm512_sub_ps(tn_avx512_load_bf16(x + r * n + i), m[r]);
            a[r] = _mm512_fmadd_ps(d, d, a[r]);
        }
    if (tail)
        for (size_t r = 0; r < R; ++r) {
            __m512 d = _mm512_maskz_sub_ps(tail, tn_avx512_maskz_load_bf16(tail, x + r * n + body), m[r]);
            a[r] = _mm512_fmadd_ps(d, d, a[r]);
        }
    for (size_t r = 0; r < R; ++r)
        k[r] = _mm512_set1_ps(1.0f / sqrtf(tn_avx512_hsum(a[r]) * inv + eps));
    /* The output is written row after row: one sequential stream. */
    for (size_t r = 0; r < R; ++r) {
        for (size_t i = 0; i < body; i += F) {
            __m512 d = _mm512_sub_ps(tn_avx512_load_bf16(x + r * n + i), m[r]);
            store_bf16(y + r * n + i, _mm512_fmadd_ps(_mm512_mul_ps(d, k[r]), _mm512_loadu_ps(scale + i), _mm512_loadu_ps(shift + i)), hw);
        }
        if (tail) {
            __m512 d = _mm512_sub_ps(tn_avx512_maskz_load_bf16(tail, x + r * n + body), m[r]);
            mask_store_bf16(y + r * n + body, tail, _mm512_fmadd_ps(_mm512_mul_ps(d, k[r]), load(scale + body, tail), load(shift + body, tail)), hw);
        }
    }
}

/* NCHW: rows streamed as in layer_norm_across, with the canonical lanes: for every position,
 * channel c adds into lane[c % 16] (16 stack arrays of TN_NORM_LANES_CHUNK positions, so the
 * positions are taken in chunks of that many). */
#define TN_NORM_LANES_CHUNK 256

/* lane[c % 16][p] (+)= x[c * S + p] for one channel c: the first 16 channels start the lanes. */
INLINE void lanes_add(const uint16_t * x, size_t c, size_t w, float (*lane)[TN_NORM_LANES_CHUNK])
{
    float * a = lane[c % 16];
    for (size_t p = 0; p < w; p += F) {
        __m512 v = tn_avx512_maskz_load_bf16(lanes(w - p), x + p);
        _mm512_store_ps(a + p, _mm512_add_ps(c < 16 ? _mm512_setzero_ps() : _mm512_load_ps(a + p), v));
    }
}

/* In-place tree over the lanes 0..L-1 (L = min(channels, 16)) of w positions: lane[0] gets the
 * sum. Absent lanes are skipped: they would add +0.0f, which changes no lane sum. */
static void lanes_tree(float (*lane)[TN_NORM_LANES_CHUNK], size_t L, size_t w)
{
    for (size_t i = 0; i < 8 && i + 8 < L; ++i)
        for (size_t p = 0; p < w; p += F)
            _mm512_store_ps(lane[i] + p, _mm512_add_ps(_mm512_load_ps(lane[i] + p), _mm512_load_ps(lane[i + 8] + p)));
    size_t L1 = L < 8 ? L : 8;
    for (size_t i = 0; i < 4 && i + 4 < L1; ++i)
        for (size_t p = 0; p < w; p += F)
            _mm512_store_ps(lane[i] + p, _mm512_add_ps(_mm512_load_ps(lane[i] + p), _mm512_load_ps(lane[i + 4] + p)));
    size_t L2 = L1 < 4 ? L1 : 4;
    for (size_t i = 0; i < 2 && i + 2 < L2; ++i)
        for (size_t p = 0; p < w; p += F)
            _mm512_store_ps(lane[i] + p, _mm512_add_ps(_mm512_load_ps(lane[i] + p), _mm512_load_ps(lane[i + 2] + p)));
    if (L2 > 1)
        for (size_t p = 0; p < w; p += F)
            _mm512_store_ps(lane[0] + p, _mm512_add_ps(_mm512_load_ps(lane[0] + p), _mm512_load_ps(lane[1] + p)));
}

static void layer_norm_across_bf16(const uint16_t * x, size_t C, size_t S, const float * scale, const float * shift,
                                   float eps, int hw, uint16_t * y)
{
    const size_t L = C < 16 ? C : 16;
    const __m512 vinv = _mm512_set1_ps(1.0f / (float)C), ve = _mm512_set1_ps(eps), one = _mm512_set1_ps(1.0f);
    float lane[16][TN_NORM_LANES_CHUNK] __attribute__((aligned(64)));
    float mean[TN_NORM_LANES_CHUNK] __attribute__((aligned(64)));
    float norm[TN_NORM_LANES_CHUNK] __attribute__((aligned(64)));
    for (size_t s0 = 0; s0 < S; s0 += TN_NORM_LANES_CHUNK) {
        const size_t w = S - s0 < TN_NORM_LANES_CHUNK ? S - s0 : TN_NORM_LANES_CHUNK;
        const uint16_t * xs = x + s0;
        uint16_t * ys = y + s0;
        for (size_t c = 0; c < C; ++c)
            lanes_add(xs + c * S, c, w, lane);
        lanes_tree(lane, L, w);
        for (size_t p = 0; p < w; p += F)
            _mm512_store_ps(mean + p, _mm512_mul_ps(_mm512_load_ps(lane[0] + p), vinv));
        for (size_t c = 0; c < C; ++c) {
            float * a = lane[c % 16];
            for (size_t p = 0; p < w; p += F) {
                __m512 d = _mm512_sub_ps(tn_avx512_maskz_load_bf16(lanes(w - p), xs + c * S + p), _mm512_load_ps(mean + p));
                _mm512_store_ps(a + p, _mm512_fmadd_ps(d, d, c < 16 ? _mm512_setzero_ps() : _mm512_load_ps(a + p)));
            }
        }
        lanes_tree(lane, L, w);
        for (size_t p = 0; p < w; p += F) {
            __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_load_ps(lane[0] + p), vinv), ve);
            _mm512_store_ps(norm + p, _mm512_div_ps(one, _mm512_sqrt_ps(v)));
        }
        /* The rows' next chunks are only short segments, which the hardware prefetchers
         * hardly pick up: prefetch them into L2 while this chunk is written. */
        const size_t wn = s0 + w < S ? (S - s0 - w < TN_NORM_LANES_CHUNK ? S - s0 - w : TN_NORM_LANES_CHUNK) : 0;
        for (size_t c = 0; c < C; ++c) {
            const uint16_t * q = xs + c * S;
            uint16_t * o = ys + c * S;
            const __m512 sc = _mm512_set1_ps(scale[c]), sh = _mm512_set1_ps(shift[c]);
            if (wn)
                prefetch_l2(q + w, wn * sizeof(uint16_t));
            size_t p = 0;
            for (; p + F <= w; p += F) {
                __m512 d = _mm512_sub_ps(tn_avx512_load_bf16(q + p), _mm512_load_ps(mean + p));
                store_bf16(o + p, _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_load_ps(norm + p)), sc, sh), hw);
            }
            if (p < w) {
                __mmask16 m = lanes(w - p);
                __m512 d = _mm512_sub_ps(tn_avx512_maskz_load_bf16(m, q + p), _mm512_load_ps(mean + p));
                mask_store_bf16(o + p, m, _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_load_ps(norm + p)), sc, sh), hw);
            }
        }
    }
}

void tn_avx512_SynetNormalizeLayerForward16bV2(const uint16_t * src, size_t batch, size_t channels, size_t spatial,
                                               const float * scale, const float * shift, const float * eps,
                                               int format, float * buf, uint16_t * dst)
{
    const size_t size = channels * spatial;
    const float e = eps[0];
    (void)buf; /* no scratch needed */
    const int hw = (TnCpuFeatures() & TnCpuAvx512bf16) != 0;
    if (size == 0)
        return;
    if (format == TnTensorFormatNhwc || spatial == 1) {
        size_t rows = batch * spatial, r = 0;
        for (; r + 4 <= rows; r += 4)
            layer_norm_rows_bf16(src + r * channels, 4, channels, scale, shift, e, hw, dst + r * channels);
        for (; r < rows; ++r)
            layer_norm_rows_bf16(src + r * channels, 1, channels, scale, shift, e, hw, dst + r * channels);
    } else {
        for (size_t b = 0; b < batch; ++b)
            layer_norm_across_bf16(src + b * size, channels, spatial, scale, shift, e, hw, dst + b * size);
    }
}
