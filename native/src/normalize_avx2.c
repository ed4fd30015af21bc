/*
 * Normalize layer family (seed 000), AVX2 level. Same work layout as normalize_scalar.c
 * (see there: rows in L1, reductions across rows streamed in L2-sized chunks with
 * per-position accumulators in buf). 16bV2 follows the canonical 16-lane order described
 * there: two __m256 accumulators hold lanes 0-7 and 8-15 (NHWC), reduced as
 * tn_avx2_hsum(lo + hi), which is the tn_avx512_hsum tree; for NCHW 16 stack arrays hold the
 * lanes of 8 positions per vector. Tails use masked loads/stores, or a small stack copy for
 * BF16.
 */
#include "vmath_avx2.h"

#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "tensorops.h"

#define F TN_AVX2_F
#define TN_NORM_CHUNK 1024
#define TN_NORM_CHUNK_BYTES (512 * 1024)
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

/* Loads and stores of min(n, 8) floats (n >= 1); masked lanes read as zero. */
INLINE __m256 load(const float * p, size_t n)
{
    return n >= F ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, tn_avx2_tail_mask(n));
}

INLINE void store(float * p, size_t n, __m256 v)
{
    if (n >= F)
        _mm256_storeu_ps(p, v);
    else
        _mm256_maskstore_ps(p, tn_avx2_tail_mask(n), v);
}

/* x - m in the first min(n, 8) lanes, +0.0f in the others. */
INLINE __m256 deviation(const float * p, size_t n, __m256 m)
{
    if (n >= F)
        return _mm256_sub_ps(_mm256_loadu_ps(p), m);
    __m256i k = tn_avx2_tail_mask(n);
    return _mm256_and_ps(_mm256_sub_ps(_mm256_maskload_ps(p, k), m), _mm256_castsi256_ps(k));
}

INLINE __m256 load_bf16(const uint16_t * p, size_t n)
{
    if (n >= F)
        return tn_avx2_load_bf16(p);
    uint16_t t[F] = {0};
    memcpy(t, p, n * sizeof(uint16_t));
    return tn_avx2_load_bf16(t);
}

INLINE void store_bf16(uint16_t * p, size_t n, __m256 v)
{
    if (n >= F) {
        tn_avx2_store_bf16(p, v);
    } else {
        uint16_t t[F];
        tn_avx2_store_bf16(t, v);
        memcpy(p, t, n * sizeof(uint16_t));
    }
}

static void fill_nan(float * dst, size_t n)
{
    for (size_t i = 0; i < n; i += F)
        store(dst + i, n - i, _mm256_set1_ps(NAN));
}

/* ---- Row reductions (four accumulators) ------------------------------------------------ */

INLINE float row_sum(const float * x, size_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 4 * F <= n; i += 4 * F) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i + 0 * F));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 1 * F));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + i + 2 * F));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + i + 3 * F));
    }
    for (; i < n; i += F)
        a0 = _mm256_add_ps(a0, load(x + i, n - i));
    return tn_avx2_hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

INLINE float row_sum_squares(const float * x, size_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 4 * F <= n; i += 4 * F) {
        __m256 x0 = _mm256_loadu_ps(x + i + 0 * F), x1 = _mm256_loadu_ps(x + i + 1 * F);
        __m256 x2 = _mm256_loadu_ps(x + i + 2 * F), x3 = _mm256_loadu_ps(x + i + 3 * F);
        a0 = _mm256_fmadd_ps(x0, x0, a0);
        a1 = _mm256_fmadd_ps(x1, x1, a1);
        a2 = _mm256_fmadd_ps(x2, x2, a2);
        a3 = _mm256_fmadd_ps(x3, x3, a3);
    }
    for (; i < n; i += F) {
        __m256 x0 = load(x + i, n - i);
        a0 = _mm256_fmadd_ps(x0, x0, a0);
    }
    return tn_avx2_hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

static float sum_squares(const float * x, size_t n)
{
    float total = 0.0f;
    for (size_t i = 0; i < n; i += TN_NORM_SUM_BLOCK)
        total += row_sum_squares(x + i, n - i < TN_NORM_SUM_BLOCK ? n - i : TN_NORM_SUM_BLOCK);
    return total;
}

INLINE float row_sum_squared_deviations(const float * x, size_t n, float mean)
{
    const __m256 m = _mm256_set1_ps(mean);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 4 * F <= n; i += 4 * F) {
        __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 0 * F), m);
        __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 1 * F), m);
        __m256 d2 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 2 * F), m);
        __m256 d3 = _mm256_sub_ps(_mm256_loadu_ps(x + i + 3 * F), m);
        a0 = _mm256_fmadd_ps(d0, d0, a0);
        a1 = _mm256_fmadd_ps(d1, d1, a1);
        a2 = _mm256_fmadd_ps(d2, d2, a2);
        a3 = _mm256_fmadd_ps(d3, d3, a3);
    }
    for (; i < n; i += F) {
        __m256 d = deviation(x + i, n - i, m);
        a0 = _mm256_fmadd_ps(d, d, a0);
    }
    return tn_avx2_hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

/* ---- V1: L2 normalization ---------------------------------------------------------------- */

/* y = x * (scale[c] * k), scale per element (step 1) or one value (step 0). */
INLINE void scale_row(const float * x, size_t n, const float * scale, size_t step, float k, float * y)
{
    if (step == 0) {
        const __m256 a = _mm256_set1_ps(scale[0] * k);
        size_t i = 0;
        for (; i + 2 * F <= n; i += 2 * F) {
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), a));
            _mm256_storeu_ps(y + i + F, _mm256_mul_ps(_mm256_loadu_ps(x + i + F), a));
        }
        for (; i < n; i += F)
            store(y + i, n - i, _mm256_mul_ps(load(x + i, n - i), a));
    } else {
        const __m256 vk = _mm256_set1_ps(k);
        size_t i = 0;
        for (; i + F <= n; i += F)
            _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_mul_ps(_mm256_loadu_ps(scale + i), vk)));
        if (i < n)
            store(y + i, n - i, _mm256_mul_ps(load(x + i, n - i), _mm256_mul_ps(load(scale + i, n - i), vk)));
    }
}

static void l2_nchw(const float * x, size_t C, size_t S, const float * scale, float eps, float * k, float * y)
{
    const size_t W = chunk_width(S, C, sizeof(float), TN_NORM_CHUNK);
    const __m256 ve = _mm256_set1_ps(eps), one = _mm256_set1_ps(1.0f);
    for (size_t s0 = 0; s0 < S; s0 += W) {
        const size_t w = S - s0 < W ? S - s0 : W;
        const float * xs = x + s0;
        float * ys = y + s0, * ks = k + s0;
        size_t c = 0;
        for (; c + 4 <= C; c += 4) {
            const float * p = xs + c * S;
            for (size_t s = 0; s < w; s += F) {
                size_t n = w - s;
                __m256 x0 = load(p + s, n), x1 = load(p + S + s, n);
                __m256 x2 = load(p + 2 * S + s, n), x3 = load(p + 3 * S + s, n);
                __m256 q = _mm256_fmadd_ps(x1, x1, _mm256_mul_ps(x0, x0));
                q = _mm256_fmadd_ps(x2, x2, q);
                q = _mm256_fmadd_ps(x3, x3, q);
                store(ks + s, n, c ? _mm256_add_ps(load(ks + s, n), q) : q);
            }
        }
        for (; c < C; ++c) {
            const float * p = xs + c * S;
            for (size_t s = 0; s < w; s += F) {
                size_t n = w - s;
                __m256 x0 = load(p + s, n);
                store(ks + s, n, _mm256_fmadd_ps(x0, x0, c ? load(ks + s, n) : _mm256_setzero_ps()));
            }
        }
        for (size_t s = 0; s < w; s += F)
            store(ks + s, w - s, _mm256_div_ps(one, _mm256_sqrt_ps(_mm256_add_ps(load(ks + s, w - s), ve))));
        for (c = 0; c < C; ++c) {
            const float * p = xs + c * S;
            float * q = ys + c * S;
            const __m256 sc = _mm256_set1_ps(scale[c]);
            size_t s = 0;
            for (; s + F <= w; s += F)
                _mm256_storeu_ps(q + s, _mm256_mul_ps(_mm256_loadu_ps(p + s), _mm256_mul_ps(sc, _mm256_loadu_ps(ks + s))));
            if (s < w)
                store(q + s, w - s, _mm256_mul_ps(load(p + s, w - s), _mm256_mul_ps(sc, load(ks + s, w - s))));
        }
    }
}

void tn_avx2_SynetNormalizeLayerForward(const float * src, size_t batch, size_t channels, size_t spatial,
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

INLINE void layer_norm_row(const float * x, size_t n, const float * scale, const float * shift, float eps, float * y)
{
    const float inv = 1.0f / (float)n;
    const float mean = row_sum(x, n) * inv;
    const float norm = 1.0f / sqrtf(row_sum_squared_deviations(x, n, mean) * inv + eps);
    const __m256 m = _mm256_set1_ps(mean), k = _mm256_set1_ps(norm);
    size_t i = 0;
    for (; i + 2 * F <= n; i += 2 * F) {
        __m256 d0 = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), m), k);
        __m256 d1 = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i + F), m), k);
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(d0, _mm256_loadu_ps(scale + i), _mm256_loadu_ps(shift + i)));
        _mm256_storeu_ps(y + i + F, _mm256_fmadd_ps(d1, _mm256_loadu_ps(scale + i + F), _mm256_loadu_ps(shift + i + F)));
    }
    for (; i < n; i += F) {
        size_t t = n - i;
        __m256 d = _mm256_mul_ps(_mm256_sub_ps(load(x + i, t), m), k);
        store(y + i, t, _mm256_fmadd_ps(d, load(scale + i, t), load(shift + i, t)));
    }
}

INLINE void layer_norm_row1(const float * x, size_t n, float scale, float shift, float eps, float * y)
{
    const float inv = 1.0f / (float)n;
    const float mean = row_sum(x, n) * inv;
    const float norm = 1.0f / sqrtf(row_sum_squared_deviations(x, n, mean) * inv + eps);
    const __m256 m = _mm256_set1_ps(mean), k = _mm256_set1_ps(norm);
    const __m256 sc = _mm256_set1_ps(scale), sh = _mm256_set1_ps(shift);
    size_t i = 0;
    for (; i + 2 * F <= n; i += 2 * F) {
        __m256 d0 = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), m), k);
        __m256 d1 = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i + F), m), k);
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(d0, sc, sh));
        _mm256_storeu_ps(y + i + F, _mm256_fmadd_ps(d1, sc, sh));
    }
    for (; i < n; i += F)
        store(y + i, n - i, _mm256_fmadd_ps(_mm256_mul_ps(_mm256_sub_ps(load(x + i, n - i), m), k), sc, sh));
}

static void layer_norm_across(const float * x, size_t rows, size_t count, size_t stride, const float * scale,
                              const float * shift, int perRow, float eps, float * mean, float * y)
{
    const float inv = 1.0f / (float)rows;
    const size_t W = chunk_width(count, rows, sizeof(float), TN_NORM_CHUNK);
    const __m256 vinv = _mm256_set1_ps(inv), ve = _mm256_set1_ps(eps), one = _mm256_set1_ps(1.0f);
    float norm[TN_NORM_CHUNK] __attribute__((aligned(32)));
    for (size_t p0 = 0; p0 < count; p0 += W) {
        const size_t w = count - p0 < W ? count - p0 : W;
        const float * xs = x + p0;
        float * ys = y + p0, * ms = mean + p0;
        size_t r = 0;
        for (; r + 4 <= rows; r += 4) {
            const float * p = xs + r * stride;
            for (size_t s = 0; s < w; s += F) {
                size_t n = w - s;
                __m256 q = _mm256_add_ps(_mm256_add_ps(load(p + s, n), load(p + stride + s, n)),
                                         _mm256_add_ps(load(p + 2 * stride + s, n), load(p + 3 * stride + s, n)));
                store(ms + s, n, r ? _mm256_add_ps(load(ms + s, n), q) : q);
            }
        }
        for (; r < rows; ++r) {
            const float * p = xs + r * stride;
            for (size_t s = 0; s < w; s += F) {
                size_t n = w - s;
                __m256 q = load(p + s, n);
                store(ms + s, n, r ? _mm256_add_ps(load(ms + s, n), q) : q);
            }
        }
        for (size_t s = 0; s < w; s += F)
            store(ms + s, w - s, _mm256_mul_ps(load(ms + s, w - s), vinv));
        for (r = 0; r + 4 <= rows; r += 4) {
            const float * p = xs + r * stride;
            for (size_t s = 0; s < w; s += F) {
                size_t n = w - s;
                __m256 mu = load(ms + s, n);
                __m256 d0 = _mm256_sub_ps(load(p + s, n), mu), d1 = _mm256_sub_ps(load(p + stride + s, n), mu);
                __m256 d2 = _mm256_sub_ps(load(p + 2 * stride + s, n), mu), d3 = _mm256_sub_ps(load(p + 3 * stride + s, n), mu);
                __m256 q = _mm256_fmadd_ps(d1, d1, _mm256_mul_ps(d0, d0));
                q = _mm256_fmadd_ps(d2, d2, q);
                q = _mm256_fmadd_ps(d3, d3, q);
                _mm256_store_ps(norm + s, r ? _mm256_add_ps(_mm256_load_ps(norm + s), q) : q);
            }
        }
        for (; r < rows; ++r) {
            const float * p = xs + r * stride;
            for (size_t s = 0; s < w; s += F) {
                size_t n = w - s;
                __m256 d = _mm256_sub_ps(load(p + s, n), load(ms + s, n));
                _mm256_store_ps(norm + s, _mm256_fmadd_ps(d, d, r ? _mm256_load_ps(norm + s) : _mm256_setzero_ps()));
            }
        }
        for (size_t s = 0; s < w; s += F) {
            __m256 v = _mm256_fmadd_ps(_mm256_load_ps(norm + s), vinv, ve);
            _mm256_store_ps(norm + s, _mm256_div_ps(one, _mm256_sqrt_ps(v)));
        }
        if (perRow) {
            for (r = 0; r < rows; ++r) {
                const float * p = xs + r * stride;
                float * q = ys + r * stride;
                const __m256 sc = _mm256_set1_ps(scale[r]), sh = _mm256_set1_ps(shift[r]);
                size_t s = 0;
                for (; s + F <= w; s += F) {
                    __m256 d = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(p + s), _mm256_loadu_ps(ms + s)), _mm256_load_ps(norm + s));
                    _mm256_storeu_ps(q + s, _mm256_fmadd_ps(d, sc, sh));
                }
                if (s < w) {
                    size_t n = w - s;
                    __m256 d = _mm256_mul_ps(_mm256_sub_ps(load(p + s, n), load(ms + s, n)), _mm256_load_ps(norm + s));
                    store(q + s, n, _mm256_fmadd_ps(d, sc, sh));
                }
            }
        } else {
            const float * sc = scale + p0, * sh = shift + p0;
            for (r = 0; r < rows; ++r) {
                const float * p = xs + r * stride;
                float * q = ys + r * stride;
                size_t s = 0;
                for (; s + F <= w; s += F) {
                    __m256 d = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(p + s), _mm256_loadu_ps(ms + s)), _mm256_load_ps(norm + s));
                    _mm256_storeu_ps(q + s, _mm256_fmadd_ps(d, _mm256_loadu_ps(sc + s), _mm256_loadu_ps(sh + s)));
                }
                if (s < w) {
                    size_t n = w - s;
                    __m256 d = _mm256_mul_ps(_mm256_sub_ps(load(p + s, n), load(ms + s, n)), _mm256_load_ps(norm + s));
                    store(q + s, n, _mm256_fmadd_ps(d, load(sc + s, n), load(sh + s, n)));
                }
            }
        }
    }
}

void tn_avx2_SynetNormalizeLayerForwardV2(const float * src, size_t batch, size_t channels, size_t spatial,
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

void tn_avx2_SynetNormalizeLayerForwardV3(const float * src, size_t batch, size_t channels, size_t spatial,
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

void tn_avx2_SynetNormalizeLayerForwardV4(const float * src, size_t batch, size_t channels, size_t spatial,
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
                    size_t n = channels - c;
                    __m256 x0 = load(p + c, n), x1 = load(p + channels + c, n);
                    __m256 x2 = load(p + 2 * channels + c, n), x3 = load(p + 3 * channels + c, n);
                    __m256 q = _mm256_fmadd_ps(x1, x1, _mm256_mul_ps(x0, x0));
                    q = _mm256_fmadd_ps(x2, x2, q);
                    q = _mm256_fmadd_ps(x3, x3, q);
                    store(buf + c, n, s ? _mm256_add_ps(load(buf + c, n), q) : q);
                }
            }
            for (; s < spatial; ++s) {
                const float * p = x + s * channels;
                for (size_t c = 0; c < channels; c += F) {
                    size_t n = channels - c;
                    __m256 x0 = load(p + c, n);
                    store(buf + c, n, _mm256_fmadd_ps(x0, x0, s ? load(buf + c, n) : _mm256_setzero_ps()));
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
                size_t c = 0;
                for (; c + F <= channels; c += F)
                    _mm256_storeu_ps(q + c, _mm256_fmadd_ps(_mm256_loadu_ps(p + c), _mm256_loadu_ps(buf + c), _mm256_loadu_ps(shift + c)));
                if (c < channels) {
                    size_t n = channels - c;
                    store(q + c, n, _mm256_fmadd_ps(load(p + c, n), load(buf + c, n), load(shift + c, n)));
                }
            }
        } else {
            for (size_t c = 0; c < channels; ++c) {
                const float * p = x + c * spatial;
                float * q = y + c * spatial;
                const __m256 a = _mm256_set1_ps(buf[c]), sh = _mm256_set1_ps(shift[c]);
                size_t s = 0;
                for (; s + 2 * F <= spatial; s += 2 * F) {
                    _mm256_storeu_ps(q + s, _mm256_fmadd_ps(_mm256_loadu_ps(p + s), a, sh));
                    _mm256_storeu_ps(q + s + F, _mm256_fmadd_ps(_mm256_loadu_ps(p + s + F), a, sh));
                }
                for (; s < spatial; s += F)
                    store(q + s, spatial - s, _mm256_fmadd_ps(load(p + s, spatial - s), a, sh));
            }
        }
    }
    free(own);
}

/* ---- 16bV2: BF16 layer norm across channels (canonical order, see normalize_scalar.c) -- */

/* NHWC: R (<= 4) consecutive rows of n channels at once, each with its own accumulators
 * (lo: lanes 0-7, hi: lanes 8-15 of channel c % 16), so the serial canonical chains of the
 * rows overlap. The BF16 row stays in L1 and is converted again in each pass. */
INLINE void layer_norm_rows_bf16(const uint16_t * x, size_t R, size_t n, const float * scale, const float * shift,
                                 float eps, uint16_t * y)
{
    const float inv = 1.0f / (float)n;
    const __m256 zero = _mm256_setzero_ps();
    const size_t body = n - n % (2 * F), t = n % (2 * F); /* tail: t0 lanes in lo, t1 in hi */
    const size_t t0 = t < F ? t : F, t1 = t - t0;
    __m256 lo[4], hi[4], m[4], k[4];
    for (size_t r = 0; r < R; ++r)
        lo[r] = hi[r] = zero;
    for (size_t i = 0; i < body; i += 2 * F)
        for (size_t r = 0; r < R; ++r) {
            lo[r] = _mm256_add_ps(lo[r], tn_avx2_load_bf16(x + r * n + i));
            hi[r] = _mm256_add_ps(hi[r], tn_avx2_load_bf16(x + r * n + i + F));
        }
    if (t)
        for (size_t r = 0; r < R; ++r) {
            lo[r] = _mm256_add_ps(lo[r], load_bf16(x + r * n + body, t0));
            hi[r] = _mm256_add_ps(hi[r], t1 ? load_bf16(x + r * n + body + F, t1) : zero);
        }
    for (size_t r = 0; r < R; ++r) {
        m[r] = _mm256_set1_ps(tn_avx2_hsum(_mm256_add_ps(lo[r], hi[r])) * inv);
        lo[r] = hi[r] = zero;
    }
    for (size_t i = 0; i < body; i += 2 * F)
        for (size_t r = 0; r < R; ++r) {
            __m256 d0 = _mm256_sub_ps(tn_avx2_load_bf16(x + r * n + i), m[r]);
            __m256 d1 = _mm256_sub_ps(tn_avx2_load_bf16(x + r * n + i + F), m[r]);
            lo[r] = _mm256_fmadd_ps(d0, d0, lo[r]);
            hi[r] = _mm256_fmadd_ps(d1, d1, hi[r]);
        }
    if (t) {
        const __m256 k0 = t0 < F ? _mm256_castsi256_ps(tn_avx2_tail_mask(t0)) : _mm256_castsi256_ps(_mm256_set1_epi32(-1));
        const __m256 k1 = t1 ? _mm256_castsi256_ps(tn_avx2_tail_mask(t1)) : zero;
        for (size_t r = 0; r < R; ++r) {
            __m256 d0 = _mm256_and_ps(_mm256_sub_ps(load_bf16(x + r * n + body, t0), m[r]), k0);
            __m256 d1 = t1 ? _mm256_and_ps(_mm256_sub_ps(load_bf16(x + r * n + body + F, t1), m[r]), k1) : zero;
            lo[r] = _mm256_fmadd_ps(d0, d0, lo[r]);
            hi[r] = _mm256_fmadd_ps(d1, d1, hi[r]);
        }
    }
    for (size_t r = 0; r < R; ++r)
        k[r] = _mm256_set1_ps(1.0f / sqrtf(tn_avx2_hsum(_mm256_add_ps(lo[r], hi[r])) * inv + eps));
    size_t i = 0;
    for (; i + F <= n; i += F) {
        __m256 sc = _mm256_loadu_ps(scale + i), sh = _mm256_loadu_ps(shift + i);
        for (size_t r = 0; r < R; ++r) {
            __m256 d = _mm256_sub_ps(tn_avx2_load_bf16(x + r * n + i), m[r]);
            tn_avx2_store_bf16(y + r * n + i, _mm256_fmadd_ps(_mm256_mul_ps(d, k[r]), sc, sh));
        }
    }
    if (i < n) {
        __m256 sc = load(scale + i, n - i), sh = load(shift + i, n - i);
        for (size_t r = 0; r < R; ++r) {
            __m256 d = _mm256_sub_ps(load_bf16(x + r * n + i, n - i), m[r]);
            store_bf16(y + r * n + i, n - i, _mm256_fmadd_ps(_mm256_mul_ps(d, k[r]), sc, sh));
        }
    }
}

static void lanes_sum_rows(float (*lane)[TN_NORM_LANES_CHUNK], size_t L, size_t w)
{
    for (size_t i = 0; i < 8 && i + 8 < L; ++i)
        for (size_t p = 0; p < w; p += F)
            _mm256_store_ps(lane[i] + p, _mm256_add_ps(_mm256_load_ps(lane[i] + p), _mm256_load_ps(lane[i + 8] + p)));
    size_t L1 = L < 8 ? L : 8;
    for (size_t i = 0; i < 4 && i + 4 < L1; ++i)
        for (size_t p = 0; p < w; p += F)
            _mm256_store_ps(lane[i] + p, _mm256_add_ps(_mm256_load_ps(lane[i] + p), _mm256_load_ps(lane[i + 4] + p)));
    size_t L2 = L1 < 4 ? L1 : 4;
    for (size_t i = 0; i < 2 && i + 2 < L2; ++i)
        for (size_t p = 0; p < w; p += F)
            _mm256_store_ps(lane[i] + p, _mm256_add_ps(_mm256_load_ps(lane[i] + p), _mm256_load_ps(lane[i + 2] + p)));
    if (L2 > 1)
        for (size_t p = 0; p < w; p += F)
            _mm256_store_ps(lane[0] + p, _mm256_add_ps(_mm256_load_ps(lane[0] + p), _mm256_load_ps(lane[1] + p)));
}

/* NCHW, one batch item; stack arrays in whole vectors, positions past w hold zeros derived
 * from zero-padded loads. */
static void layer_norm_nchw_bf16(const uint16_t * x, size_t C, size_t S, const float * scale, const float * shift,
                                 float eps, uint16_t * y)
{
    const float inv = 1.0f / (float)C;
    const size_t L = C < 16 ? C : 16;
    const size_t W = chunk_width(S, C, sizeof(uint16_t), TN_NORM_LANES_CHUNK);
    const __m256 vinv = _mm256_set1_ps(inv), ve = _mm256_set1_ps(eps), one = _mm256_set1_ps(1.0f);
    float lane[16][TN_NORM_LANES_CHUNK] __attribute__((aligned(32)));
    float mean[TN_NORM_LANES_CHUNK] __attribute__((aligned(32)));
    float norm[TN_NORM_LANES_CHUNK] __attribute__((aligned(32)));
    for (size_t s0 = 0; s0 < S; s0 += W) {
        const size_t w = S - s0 < W ? S - s0 : W;
        const uint16_t * xs = x + s0;
        uint16_t * ys = y + s0;
        for (size_t c = 0; c < C; ++c) {
            float * a = lane[c % 16];
            const uint16_t * p = xs + c * S;
            for (size_t s = 0; s < w; s += F) {
                __m256 v = load_bf16(p + s, w - s);
                _mm256_store_ps(a + s, _mm256_add_ps(c < 16 ? _mm256_setzero_ps() : _mm256_load_ps(a + s), v));
            }
        }
        lanes_sum_rows(lane, L, w);
        for (size_t s = 0; s < w; s += F)
            _mm256_store_ps(mean + s, _mm256_mul_ps(_mm256_load_ps(lane[0] + s), vinv));
        for (size_t c = 0; c < C; ++c) {
            float * a = lane[c % 16];
            const uint16_t * p = xs + c * S;
            for (size_t s = 0; s < w; s += F) {
                __m256 d = _mm256_sub_ps(load_bf16(p + s, w - s), _mm256_load_ps(mean + s));
                _mm256_store_ps(a + s, _mm256_fmadd_ps(d, d, c < 16 ? _mm256_setzero_ps() : _mm256_load_ps(a + s)));
            }
        }
        lanes_sum_rows(lane, L, w);
        for (size_t s = 0; s < w; s += F) {
            __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_load_ps(lane[0] + s), vinv), ve);
            _mm256_store_ps(norm + s, _mm256_div_ps(one, _mm256_sqrt_ps(v)));
        }
        for (size_t c = 0; c < C; ++c) {
            const uint16_t * p = xs + c * S;
            uint16_t * q = ys + c * S;
            const __m256 sc = _mm256_set1_ps(scale[c]), sh = _mm256_set1_ps(shift[c]);
            size_t s = 0;
            for (; s + F <= w; s += F) {
                __m256 d = _mm256_sub_ps(tn_avx2_load_bf16(p + s), _mm256_load_ps(mean + s));
                tn_avx2_store_bf16(q + s, _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_load_ps(norm + s)), sc, sh));
            }
            if (s < w) {
                __m256 d = _mm256_sub_ps(load_bf16(p + s, w - s), _mm256_load_ps(mean + s));
                store_bf16(q + s, w - s, _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_load_ps(norm + s)), sc, sh));
            }
        }
    }
}

void tn_avx2_SynetNormalizeLayerForward16bV2(const uint16_t * src, size_t batch, size_t channels, size_t spatial,
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
