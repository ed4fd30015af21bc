/*
 * TiledScale2D, AVX2. Same products as tiledscale_scalar.c, (x * ver) * hor, so the
 * results are bit-identical. In place (src == dst) is allowed.
 *
 * Rows at least a vector wide are processed row by row (NCHW: a row of W with one hor
 * factor; NHWC: a pixel of C with a row of hor). Narrow rows would waste most of each
 * vector on masked tails, so they are processed as one flat stream instead:
 *   NCHW, W < 8: a channel's H * W elements in periods of 8 rows = W vectors; vector j of
 *     a period needs ver[(8j + l) % W] and hor[row0 + (8j + l) / W] in lane l, both
 *     permuted from one register (ver of the channel, hor of the 8 rows).
 *   NHWC, C < 8: a row's W * C elements; ver is already contiguous for the whole row and
 *     hor repeats with period C, so vector j mod C uses hor[(8j + l) % C].
 */
#include "vmath_avx2.h"

#include "kernels.h"
#include "tensorops.h"

#define F TN_AVX2_F

/* mod[j] lane l = (F*j + l) % period, div[j] lane l = (F*j + l) / period, j < period. */
static void make_indices(size_t period, __m256i * mod, __m256i * div)
{
    int32_t m[F], d[F];
    for (size_t j = 0; j < period; ++j) {
        for (size_t l = 0; l < F; ++l) {
            m[l] = (int32_t)((F * j + l) % period);
            d[l] = (int32_t)((F * j + l) / period);
        }
        mod[j] = _mm256_loadu_si256((const __m256i *)m);
        if (div)
            div[j] = _mm256_loadu_si256((const __m256i *)d);
    }
}

static inline __m256 scale(__m256 x, __m256 v, __m256 h)
{
    return _mm256_mul_ps(_mm256_mul_ps(x, v), h);
}

/* y[i] = (x[i] * v[i]) * h[i], n elements. */
static inline void scale_row(const float * x, const float * v, const float * h, float * y, size_t n)
{
    size_t i = 0;
    for (; i + 2 * F <= n; i += 2 * F) {
        __m256 r0 = scale(_mm256_loadu_ps(x + i), _mm256_loadu_ps(v + i), _mm256_loadu_ps(h + i));
        __m256 r1 = scale(_mm256_loadu_ps(x + i + F), _mm256_loadu_ps(v + i + F), _mm256_loadu_ps(h + i + F));
        _mm256_storeu_ps(y + i, r0);
        _mm256_storeu_ps(y + i + F, r1);
    }
    for (; i + F <= n; i += F)
        _mm256_storeu_ps(y + i, scale(_mm256_loadu_ps(x + i), _mm256_loadu_ps(v + i), _mm256_loadu_ps(h + i)));
    if (i < n) {
        __m256i m = tn_avx2_tail_mask(n - i);
        _mm256_maskstore_ps(y + i, m, scale(_mm256_maskload_ps(x + i, m), _mm256_maskload_ps(v + i, m),
                                            _mm256_maskload_ps(h + i, m)));
    }
}

/* y[i] = (x[i] * v[i]) * k, n elements. */
static inline void scale_row_k(const float * x, const float * v, float k, float * y, size_t n)
{
    const __m256 h = _mm256_set1_ps(k);
    size_t i = 0;
    for (; i + 2 * F <= n; i += 2 * F) {
        __m256 r0 = scale(_mm256_loadu_ps(x + i), _mm256_loadu_ps(v + i), h);
        __m256 r1 = scale(_mm256_loadu_ps(x + i + F), _mm256_loadu_ps(v + i + F), h);
        _mm256_storeu_ps(y + i, r0);
        _mm256_storeu_ps(y + i + F, r1);
    }
    for (; i + F <= n; i += F)
        _mm256_storeu_ps(y + i, scale(_mm256_loadu_ps(x + i), _mm256_loadu_ps(v + i), h));
    if (i < n) {
        __m256i m = tn_avx2_tail_mask(n - i);
        _mm256_maskstore_ps(y + i, m, scale(_mm256_maskload_ps(x + i, m), _mm256_maskload_ps(v + i, m), h));
    }
}

static void nchw_narrow(const float * src, size_t channels, size_t height, size_t width, const float * ver,
                        const float * hor, float * dst)
{
    __m256i col[F], row[F];
    __m256 vt[F];
    make_indices(width, col, row);
    size_t total = height * width;
    for (size_t c = 0; c < channels; ++c) {
        const float * x = src + c * total, * hc = hor + c * height;
        float * y = dst + c * total;
        __m256 vv = _mm256_maskload_ps(ver + c * width, tn_avx2_tail_mask(width));
        for (size_t j = 0; j < width; ++j)
            vt[j] = _mm256_permutevar8x32_ps(vv, col[j]);
        for (size_t r = 0, e = 0; e < total; r += F) {
            size_t rows = height - r < F ? height - r : F;
            __m256 hv = _mm256_maskload_ps(hc + r, tn_avx2_tail_mask(rows));
            for (size_t j = 0; j < width && e < total; ++j, e += F) {
                __m256 h = _mm256_permutevar8x32_ps(hv, row[j]);
                if (e + F <= total) {
                    _mm256_storeu_ps(y + e, scale(_mm256_loadu_ps(x + e), vt[j], h));
                } else {
                    __m256i m = tn_avx2_tail_mask(total - e);
                    _mm256_maskstore_ps(y + e, m, scale(_mm256_maskload_ps(x + e, m), vt[j], h));
                }
            }
        }
    }
}

static void nhwc_narrow(const float * src, size_t channels, size_t height, size_t width, const float * ver,
                        const float * hor, float * dst)
{
    __m256i chan[F];
    __m256 ht[F];
    make_indices(channels, chan, NULL);
    size_t n = width * channels;
    for (size_t h = 0; h < height; ++h) {
        const float * x = src + h * n;
        float * y = dst + h * n;
        __m256 hv = _mm256_maskload_ps(hor + h * channels, tn_avx2_tail_mask(channels));
        for (size_t j = 0; j < channels; ++j)
            ht[j] = _mm256_permutevar8x32_ps(hv, chan[j]);
        size_t i = 0, j = 0;
        for (; i + F <= n; i += F) {
            _mm256_storeu_ps(y + i, scale(_mm256_loadu_ps(x + i), _mm256_loadu_ps(ver + i), ht[j]));
            j = j + 1 == channels ? 0 : j + 1;
        }
        if (i < n) {
            __m256i m = tn_avx2_tail_mask(n - i);
            _mm256_maskstore_ps(y + i, m, scale(_mm256_maskload_ps(x + i, m), _mm256_maskload_ps(ver + i, m), ht[j]));
        }
    }
}

void tn_avx2_SynetTiledScale2D32f(const float * src, size_t channels, size_t height, size_t width, int format,
                                  const float * ver, const float * hor, float * dst)
{
    if (channels == 0 || height == 0 || width == 0)
        return;
    if (format == TnTensorFormatNhwc) {
        if (channels < F) {
            nhwc_narrow(src, channels, height, width, ver, hor, dst);
            return;
        }
        for (size_t h = 0; h < height; ++h)
            for (size_t w = 0; w < width; ++w) {
                size_t o = (h * width + w) * channels;
                scale_row(src + o, ver + w * channels, hor + h * channels, dst + o, channels);
            }
    } else {
        if (width < F) {
            nchw_narrow(src, channels, height, width, ver, hor, dst);
            return;
        }
        for (size_t c = 0; c < channels; ++c)
            for (size_t h = 0; h < height; ++h) {
                size_t o = (c * height + h) * width;
                scale_row_k(src + o, ver + c * width, hor[c * height + h], dst + o, width);
            }
    }
}
