/*
 * Normalize layer family (seed 000), AVX-512 level. Same work layout as
 * normalize_scalar.c (see there: rows in L1, reductions across rows streamed in L2-sized
 * chunks with per-position accumulators in buf). 16bV2 follows the canonical 16-lane order
 * described there: one __m512 accumulator holds the 16 lanes (NHWC), or 16 stack arrays hold
 * them for 16 positions per vector (NCHW); both reduce with the tn_avx512_hsum tree.
 */
#include "vmath_avx512.h"

#include <stdlib.h>

#include "kernels.h"
#include "tensorops.h"

#define F TN_AVX512_F
#define TN_NORM_CHUNK 1024
#ifndef TN_NORM_CHUNK_BYTES
#define TN_NORM_CHUNK_BYTES (512 * 1024)
#endif
#ifndef TN_NORM_PREFETCH_ROWS
#define TN_NORM_PREFETCH_ROWS 16 /* pass 1 of a chunk prefetches this many rows ahead */
#endif
#define TN_NORM_LANES_CHUNK 256
#define TN_NORM_SUM_BLOCK 4096

#define INLINE static inline __attribute__((always_inline))

static size_t chunk_width(size_t count, size_t rows, size_t elem, size_t limit)
{
    size_t w = TN_NORM_CHUNK_BYTES / (rows * elem);
    w = w < 64 ? 64 : w > limit ? limit : w & ~(size_t)15;
    if (count <= w)
        return count;
    size_t n = (count + w - 1) / w;
    return ((count + n - 1) / n + 15) & ~(size_t)15;
}

/* Mask of min(n, 16) lanes. */
INLINE __mmask16 lanes(size_t n)
{
    return n >= F ? (__mmask16)0xffff : tn_avx512_tail_mask(n);
}

INLINE __m512 load(const float * p, __mmask16 k) { return _mm512_maskz_loadu_ps(k, p); }
INLINE void store(float * p, __mmask16 k, __m512 v) { _mm512_mask_storeu_ps(p, k, v); }

/* Prefetch the cache lines of [p, p + bytes) (software prefetch never faults; the range is
 * kept inside the tensor all the same). */
INLINE void prefetch_l1(const float * p, size_t n)
{
    const char * c = (const char *)p;
    for (size_t i = 0; i < n * sizeof(float); i += 64)
        _mm_prefetch(c + i, _MM_HINT_T0);
    _mm_prefetch(c + n * sizeof(float) - 1, _MM_HINT_T0);
}

INLINE void prefetch_l2(const float * p, size_t n)
{
    const char * c = (const char *)p;
    for (size_t i = 0; i < n * sizeof(float); i += 64)
        _mm_prefetch(c + i, _MM_HINT_T1);
    _mm_prefetch(c + n * sizeof(float) - 1, _MM_HINT_T1);
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

/* ---- V1: L2 normalization ---------------------------------------------------------------- */

/* y = x * (scale[c] * k), scale per element (step 1) or one value (step 0). */
INLINE void scale_row(const float * x, size_t n, const float * scale, size_t step, float k, float * y)
{
    const __m512 vk = _mm512_set1_ps(k);
    if (step == 0) {
        const __m512 a = _mm512_set1_ps(scale[0] * k);
        size_t i = 0;
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

/* NCHW, one batch item, across channels at each position: k accumulates in buf. */
static void l2_nchw(const float * x, size_t C, size_t S, const float * scale, float eps, float * k, float * y)
{
    const size_t W = chunk_width(S, C, sizeof(float), TN_NORM_CHUNK);
    const __m512 ve = _mm512_set1_ps(eps), one = _mm512_set1_ps(1.0f);
    for (size_t s0 = 0; s0 < S; s0 += W) {
        const size_t w = S - s0 < W ? S - s0 : W;
        const float * xs = x + s0;
        float * ys = y + s0, * ks = k + s0;
        size_t c = 0;
        for (; c + 4 <= C; c += 4) {
            const float * p = xs + c * S;
            for (size_t j = c + TN_NORM_PREFETCH_ROWS; j < c + TN_NORM_PREFETCH_ROWS + 4 && j < C; ++j)
                prefetch_l1(xs + j * S, w);
            for (size_t s = 0; s < w; s += F) {
                __mmask16 m = lanes(w - s);
                __m512 x0 = load(p + s, m), x1 = load(p + S + s, m);
                __m512 x2 = load(p + 2 * S + s, m), x3 = load(p + 3 * S + s, m);
                __m512 a = c ? load(ks + s, m) : _mm512_setzero_ps();
                __m512 q = _mm512_fmadd_ps(x1, x1, _mm512_mul_ps(x0, x0));
                q = _mm512_fmadd_ps(x2, x2, q);
                q = _mm512_fmadd_ps(x3, x3, q);
                store(ks + s, m, _mm512_add_ps(a, q));
            }
        }
        for (; c < C; ++c) {
            const float * p = xs + c * S;
            for (size_t s = 0; s < w; s += F) {
                __mmask16 m = lanes(w - s);
                __m512 x0 = load(p + s, m);
                __m512 a = c ? load(ks + s, m) : _mm512_setzero_ps();
                store(ks + s, m, _mm512_fmadd_ps(x0, x0, a));
            }
        }
        for (size_t s = 0; s < w; s += F) {
            __mmask16 m = lanes(w - s);
            store(ks + s, m, _mm512_div_ps(one, _mm512_sqrt_ps(_mm512_add_ps(load(ks + s, m), ve))));
        }
        const size_t wn = s0 + w >= S ? 0 : S - s0 - w < W ? S - s0 - w : W;
        for (c = 0; c < C; ++c) {
            const float * p = xs + c * S;
            float * q = ys + c * S;
            const __m512 sc = _mm512_set1_ps(scale[c]);
            if (wn)
                prefetch_l2(p + w, wn);
            size_t s = 0;
            for (; s + F <= w; s += F)
                _mm512_storeu_ps(q + s, _mm512_mul_ps(_mm512_loadu_ps(p + s), _mm512_mul_ps(sc, _mm512_loadu_ps(ks + s))));
            if (s < w) {
                __mmask16 m = lanes(w - s);
                store(q + s, m, _mm512_mul_ps(load(p + s, m), _mm512_mul_ps(sc, load(ks + s, m))));
            }
        }
    }
}

void tn_avx512_SynetNormalizeLayerForward(const float * src, size_t batch, size_t channels, size_t spatial,
                                          const float * scale, const float * eps, int acrossSpatial, int format,
                                          float * buf, float * dst)
{
    const size_t size = channels * spatial;
    const float e = eps[0];
    const int nhwc = format == TnTensorFormatNhwc;
    float * own = NULL;
    if (size == 0)
        return;
    if (!acrossSpatial && !nhwc && buf == NULL) {
        if ((own = malloc(spatial * sizeof(float))) == NULL) {
            fill_nan(dst, batch * size);
            return;
        }
        buf = own;
    }
    for (size_t b = 0; b < batch; ++b) {
        const float * x = src + b * size;
        float * y = dst + b * size;
        if (acrossSpatial) {
            float k = 1.0f / sqrtf(sum_squares(x, size) + e);
            if (nhwc)
                for (size_t s = 0; s < spatial; ++s)
                    scale_row(x + s * channels, channels, scale, 1, k, y + s * channels);
            else
                for (size_t c = 0; c < channels; ++c)
                    scale_row(x + c * spatial, spatial, scale + c, 0, k, y + c * spatial);
        } else if (nhwc) {
            for (size_t s = 0; s < spatial; ++s) {
                const float * xr = x + s * channels;
                float k = 1.0f / sqrtf(row_sum_squares(xr, channels) + e);
                scale_row(xr, channels, scale, 1, k, y + s * channels);
            }
        } else {
            l2_nchw(x, channels, spatial, scale, e, buf, y);
        }
    }
    free(own);
}

/* ---- V2 / V3: layer normalization ------------------------------------------------------ */

/* One contiguous row: scale/shift per element (V2 NHWC). */
INLINE void layer_norm_row(const float * x, size_t n, const float * scale, const float * shift, float eps, float * y)
{
    const float inv = 1.0f / (float)n;
    const float mean = row_sum(x, n) * inv;
    const float norm = 1.0f / sqrtf(row_sum_squared_deviations(x, n, mean) * inv + eps);
    const __m512 m = _mm512_set1_ps(mean), k = _mm512_set1_ps(norm);
    size_t i = 0;
    for (; i + 2 * F <= n; i += 2 * F) {
        __m512 d0 = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), m), k);
        __m512 d1 = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i + F), m), k);
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(d0, _mm512_loadu_ps(scale + i), _mm512_loadu_ps(shift + i)));
        _mm512_storeu_ps(y + i + F, _mm512_fmadd_ps(d1, _mm512_loadu_ps(scale + i + F), _mm512_loadu_ps(shift + i + F)));
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
    size_t i = 0;
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

/* Layer norm across `rows` rows (stride `stride`) of `count` positions each; see the scalar
 * file. mean (count floats) is the caller's scratch; scale/shift per row (perRow, V2 NCHW)
 * or per position (V3 NHWC). */
static void layer_norm_across(const float * x, size_t rows, size_t count, size_t stride, const float * scale,
                              const float * shift, int perRow, float eps, float * mean, float * y)
{
    const float inv = 1.0f / (float)rows;
    const size_t W = chunk_width(count, rows, sizeof(float), TN_NORM_CHUNK);
    const __m512 vinv = _mm512_set1_ps(inv), ve = _mm512_set1_ps(eps), one = _mm512_set1_ps(1.0f);
    float norm[TN_NORM_CHUNK] __attribute__((aligned(64)));
    for (size_t p0 = 0; p0 < count; p0 += W) {
        const size_t w = count - p0 < W ? count - p0 : W;
        const float * xs = x + p0;
        float * ys = y + p0, * ms = mean + p0;
        /* Pass 1: sums, four rows at a time. */
        size_t r = 0;
        for (; r + 4 <= rows; r += 4) {
            const float * p = xs + r * stride;
            for (size_t j = r + TN_NORM_PREFETCH_ROWS; j < r + TN_NORM_PREFETCH_ROWS + 4 && j < rows; ++j)
                prefetch_l1(xs + j * stride, w);
            for (size_t s = 0; s < w; s += F) {
                __mmask16 m = lanes(w - s);
                __m512 q = _mm512_add_ps(_mm512_add_ps(load(p + s, m), load(p + stride + s, m)),
                                         _mm512_add_ps(load(p + 2 * stride + s, m), load(p + 3 * stride + s, m)));
                store(ms + s, m, r ? _mm512_add_ps(load(ms + s, m), q) : q);
            }
        }
        for (; r < rows; ++r) {
            const float * p = xs + r * stride;
            for (size_t s = 0; s < w; s += F) {
                __mmask16 m = lanes(w - s);
                __m512 q = load(p + s, m);
                store(ms + s, m, r ? _mm512_add_ps(load(ms + s, m), q) : q);
            }
        }
        for (size_t s = 0; s < w; s += F) {
            __mmask16 m = lanes(w - s);
            store(ms + s, m, _mm512_mul_ps(load(ms + s, m), vinv));
        }
        /* Pass 2: squared deviations. */
        for (r = 0; r + 4 <= rows; r += 4) {
            const float * p = xs + r * stride;
            for (size_t s = 0; s < w; s += F) {
                __mmask16 m = lanes(w - s);
                __m512 mu = load(ms + s, m);
                __m512 d0 = _mm512_sub_ps(load(p + s, m), mu), d1 = _mm512_sub_ps(load(p + stride + s, m), mu);
                __m512 d2 = _mm512_sub_ps(load(p + 2 * stride + s, m), mu), d3 = _mm512_sub_ps(load(p + 3 * stride + s, m), mu);
                __m512 q = _mm512_fmadd_ps(d1, d1, _mm512_mul_ps(d0, d0));
                q = _mm512_fmadd_ps(d2, d2, q);
                q = _mm512_fmadd_ps(d3, d3, q);
                _mm512_store_ps(norm + s, r ? _mm512_add_ps(_mm512_load_ps(norm + s), q) : q);
            }
        }
        for (; r < rows; ++r) {
            const float * p = xs + r * stride;
            for (size_t s = 0; s < w; s += F) {
                __mmask16 m = lanes(w - s);
                __m512 d = _mm512_sub_ps(load(p + s, m), load(ms + s, m));
                _mm512_store_ps(norm + s, _mm512_fmadd_ps(d, d, r ? _mm512_load_ps(norm + s) : _mm512_setzero_ps()));
            }
        }
        for (size_t s = 0; s < w; s += F) {
            __m512 v = _mm512_fmadd_ps(_mm512_load_ps(norm + s), vinv, ve);
            _mm512_store_ps(norm + s, _mm512_div_ps(one, _mm512_sqrt_ps(v)));
        }
        /* Pass 3: output, while the next chunk is prefetched into L2. */
        const size_t wn = p0 + w >= count ? 0 : count - p0 - w < W ? count - p0 - w : W;
        if (perRow) {
            for (r = 0; r < rows; ++r) {
                const float * p = xs + r * stride;
                float * q = ys + r * stride;
                if (wn)
                    prefetch_l2(p + w, wn);
                const __m512 sc = _mm512_set1_ps(scale[r]), sh = _mm512_set1_ps(shift[r]);
                size_t s = 0;
                for (; s + F <= w; s += F) {
                    __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(p + s), _mm512_loadu_ps(ms + s)), _mm512_load_ps(norm + s));
                    _mm512_storeu_ps(q + s, _mm512_fmadd_ps(d, sc, sh));
                }
                if (s < w) {
                    __mmask16 m = lanes(w - s);
                    __m512 d = _mm512_mul_ps(_mm512_sub_ps(load(p + s, m), load(ms + s, m)), _mm512_load_ps(norm + s));
                    store(q + s, m, _mm512_fmadd_ps(d, sc, sh));
                }
            }
        } else {
            const float * sc = scale + p0, * sh = shift + p0;
            for (r = 0; r < rows; ++r) {
                const float * p = xs + r * stride;
                float * q = ys + r * stride;
                if (wn)
                    prefetch_l2(p + w, wn);
                for (size_t s = 0; s < w; s += F) {
                    __mmask16 m = lanes(w - s);
                    __m512 d = _mm512_mul_ps(_mm512_sub_ps(load(p + s, m), load(ms + s, m)), _mm512_load_ps(norm + s));
                    store(q + s, m, _mm512_fmadd_ps(d, load(sc + s, m), load(sh + s, m)));
                }
            }
        }
    }
}

void tn_avx512_SynetNormalizeLayerForwardV2(const float * src, size_t batch, size_t channels, size_t spatial,
                                            const float * scale, const float * shift, const float * eps, int format,
                                            float * buf, float * dst)
{
    const size_t size = channels * spatial;
    const float e = eps[0];
    const int nhwc = format == TnTensorFormatNhwc;
    float * own = NULL;
    if (size == 0)
        return;
    if (!nhwc && buf == NULL) {
        if ((own = malloc(spatial * sizeof(float))) == NULL) {
            fill_nan(dst, batch * size);
            return;
        }
        buf = own;
    }
    for (size_t b = 0; b < batch; ++b) {
        const float * x = src + b * size;
        float * y = dst + b * size;
        if (nhwc)
            for (size_t s = 0; s < spatial; ++s)
                layer_norm_row(x + s * channels, channels, scale, shift, e, y + s * channels);
        else
            layer_norm_across(x, channels, spatial, spatial, scale, shift, 1, e, buf, y);
    }
    free(own);
}

void tn_avx512_SynetNormalizeLayerForwardV3(const float * src, size_t batch, size_t channels, size_t spatial,
                                            const float * scale, const float * shift, const float * eps, int format,
                                            float * buf, float * dst)
{
    const size_t size = channels * spatial;
    const float e = eps[0];
    const int nhwc = format == TnTensorFormatNhwc;
    float * own = NULL;
    if (size == 0)
        return;
    if (nhwc && buf == NULL) {
        if ((own = malloc(channels * sizeof(float))) == NULL) {
            fill_nan(dst, batch * size);
            return;
        }
        buf = own;
    }
    for (size_t b = 0; b < batch; ++b) {
        const float * x = src + b * size;
        float * y = dst + b * size;
        if (nhwc)
            layer_norm_across(x, spatial, channels, channels, scale, shift, 0, e, buf, y);
        else
            for (size_t c = 0; c < channels; ++c)
                layer_norm_row1(x + c * spatial, spatial, scale[c], shift[c], e, y + c * spatial);
    }
    free(own);
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
                size_t s = 0;
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

/* NHWC: R (<= 4) consecutive rows of n channels at once. Each row has its own accumulator
 * (channel c is lane c % 16), so the serial canonical chains of the rows overlap. The BF16
 * row stays in L1 and is converted again in each pass. */
INLINE void layer_norm_rows_bf16(const uint16_t * x, size_t R, size_t n, const float * scale, const float * shift,
                                 float eps, uint16_t * y)
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
    for (size_t i = 0; i < body; i += F) {
        __m512 sc = _mm512_loadu_ps(scale + i), sh = _mm512_loadu_ps(shift + i);
        for (size_t r = 0; r < R; ++r) {
            __m512 d = _mm512_sub_ps(tn_avx512_load_bf16(x + r * n + i), m[r]);
            tn_avx512_store_bf16(y + r * n + i, _mm512_fmadd_ps(_mm512_mul_ps(d, k[r]), sc, sh));
        }
    }
    if (tail) {
        __m512 sc = load(scale + body, tail), sh = load(shift + body, tail);
        for (size_t r = 0; r < R; ++r) {
            __m512 d = _mm512_sub_ps(tn_avx512_maskz_load_bf16(tail, x + r * n + body), m[r]);
            tn_avx512_mask_store_bf16(y + r * n + body, tail, _mm512_fmadd_ps(_mm512_mul_ps(d, k[r]), sc, sh));
        }
    }
}

/* In-place tree over lanes 0..L-1 of w positions (see lanes_sum_rows in the scalar file). */
static void lanes_sum_rows(float (*lane)[TN_NORM_LANES_CHUNK], size_t L, size_t w)
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

/* NCHW, one batch item. The stack arrays are processed in whole vectors (W and the array
 * size are multiples of 16); positions past w hold zeros derived from masked loads. */
static void layer_norm_nchw_bf16(const uint16_t * x, size_t C, size_t S, const float * scale, const float * shift,
                                 float eps, uint16_t * y)
{
    const float inv = 1.0f / (float)C;
    const size_t L = C < 16 ? C : 16;
    const size_t W = chunk_width(S, C, sizeof(uint16_t), TN_NORM_LANES_CHUNK);
    const __m512 vinv = _mm512_set1_ps(inv), ve = _mm512_set1_ps(eps), one = _mm512_set1_ps(1.0f);
    float lane[16][TN_NORM_LANES_CHUNK] __attribute__((aligned(64)));
    float mean[TN_NORM_LANES_CHUNK] __attribute__((aligned(64)));
    float norm[TN_NORM_LANES_CHUNK] __attribute__((aligned(64)));
    for (size_t s0 = 0; s0 < S; s0 += W) {
        const size_t w = S - s0 < W ? S - s0 : W;
        const uint16_t * xs = x + s0;
        uint16_t * ys = y + s0;
        for (size_t c = 0; c < C; ++c) {
            float * a = lane[c % 16];
            const uint16_t * p = xs + c * S;
            for (size_t s = 0; s < w; s += F) {
                __m512 v = tn_avx512_maskz_load_bf16(lanes(w - s), p + s);
                _mm512_store_ps(a + s, _mm512_add_ps(c < 16 ? _mm512_setzero_ps() : _mm512_load_ps(a + s), v));
            }
        }
        lanes_sum_rows(lane, L, w);
        for (size_t s = 0; s < w; s += F)
            _mm512_store_ps(mean + s, _mm512_mul_ps(_mm512_load_ps(lane[0] + s), vinv));
        for (size_t c = 0; c < C; ++c) {
            float * a = lane[c % 16];
            const uint16_t * p = xs + c * S;
            for (size_t s = 0; s < w; s += F) {
                __m512 d = _mm512_sub_ps(tn_avx512_maskz_load_bf16(lanes(w - s), p + s), _mm512_load_ps(mean + s));
                _mm512_store_ps(a + s, _mm512_fmadd_ps(d, d, c < 16 ? _mm512_setzero_ps() : _mm512_load_ps(a + s)));
            }
        }
        lanes_sum_rows(lane, L, w);
        for (size_t s = 0; s < w; s += F) {
            __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_load_ps(lane[0] + s), vinv), ve);
            _mm512_store_ps(norm + s, _mm512_div_ps(one, _mm512_sqrt_ps(v)));
        }
        for (size_t c = 0; c < C; ++c) {
            const uint16_t * p = xs + c * S;
            uint16_t * q = ys + c * S;
            const __m512 sc = _mm512_set1_ps(scale[c]), sh = _mm512_set1_ps(shift[c]);
            size_t s = 0;
            for (; s + F <= w; s += F) {
                __m512 d = _mm512_sub_ps(tn_avx512_load_bf16(p + s), _mm512_load_ps(mean + s));
                tn_avx512_store_bf16(q + s, _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_load_ps(norm + s)), sc, sh));
            }
            if (s < w) {
                __mmask16 k = tn_avx512_tail_mask(w - s);
                __m512 d = _mm512_sub_ps(tn_avx512_maskz_load_bf16(k, p + s), _mm512_load_ps(mean + s));
                tn_avx512_mask_store_bf16(q + s, k, _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_load_ps(norm + s)), sc, sh));
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
    const int nhwc = format == TnTensorFormatNhwc;
    (void)buf; /* no scratch needed */
    if (size == 0)
        return;
    if (nhwc) {
        size_t rows = batch * spatial, r = 0;
        for (; r + 4 <= rows; r += 4)
            layer_norm_rows_bf16(src + r * channels, 4, channels, scale, shift, e, dst + r * channels);
        for (; r < rows; ++r)
            layer_norm_rows_bf16(src + r * channels, 1, channels, scale, shift, e, dst + r * channels);
        return;
    }
    for (size_t b = 0; b < batch; ++b)
        layer_norm_nchw_bf16(src + b * size, channels, spatial, scale, shift, e, dst + b * size);
}
