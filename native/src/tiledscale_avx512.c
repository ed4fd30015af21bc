/*
 * TiledScale2D, AVX-512. Same products as tiledscale_scalar.c, (x * ver) * hor, so the
 * results are bit-identical. In place (src == dst) is allowed.
 *
 * Rows at least a vector wide are processed row by row (NCHW: a row of W with one hor
 * factor; NHWC: a pixel of C with a row of hor). Narrow rows would waste most of each
 * vector on masked tails, so they are processed as one flat stream instead:
 *   NCHW, W < 16: a channel's H * W elements in periods of 16 rows = W vectors; vector j of
 *     a period needs ver[(16j + l) % W] and hor[row0 + (16j + l) / W] in lane l, both
 *     permuted from one register (ver of the channel, hor of the 16 rows).
 *   NHWC, C < 16: a row's W * C elements; ver is already contiguous for the whole row and
 *     hor repeats with period C, so vector j mod C uses hor[(16j + l) % C].
 */
#include "vmath_avx512.h"

#include "kernels.h"
#include "tensorops.h"

#define F TN_AVX512_F

/* mod[j] lane l = (F*j + l) % period, div[j] lane l = (F*j + l) / period, j < period. */
static void make_indices(size_t period, __m512i * mod, __m512i * div)
{
    int32_t m[F], d[F];
    for (size_t j = 0; j < period; ++j) {
        for (size_t l = 0; l < F; ++l) {
            m[l] = (int32_t)((F * j + l) % period);
            d[l] = (int32_t)((F * j + l) / period);
        }
        mod[j] = _mm512_loadu_si512(m);
        if (div)
            div[j] = _mm512_loadu_si512(d);
    }
}

static inline __m512 scale(__m512 x, __m512 v, __m512 h)
{
    return _mm512_mul_ps(_mm512_mul_ps(x, v), h);
}

/* y[i] = (x[i] * v[i]) * h[i], n elements. */
static inline void scale_row(const float * x, const float * v, const float * h, float * y, size_t n)
{
    size_t i = 0;
    for (; i + 2 * F <= n; i += 2 * F) {
        __m512 r0 = scale(_mm512_loadu_ps(x + i), _mm512_loadu_ps(v + i), _mm512_loadu_ps(h + i));
        __m512 r1 = scale(_mm512_loadu_ps(x + i + F), _mm512_loadu_ps(v + i + F), _mm512_loadu_ps(h + i + F));
        _mm512_storeu_ps(y + i, r0);
        _mm512_storeu_ps(y + i + F, r1);
    }
    for (; i + F <= n; i += F)
        _mm512_storeu_ps(y + i, scale(_mm512_loadu_ps(x + i), _mm512_loadu_ps(v + i), _mm512_loadu_ps(h + i)));
    if (i < n) {
        __mmask16 m = tn_avx512_tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, scale(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, v + i),
                                              _mm512_maskz_loadu_ps(m, h + i)));
    }
}

/* y[i] = (x[i] * v[i]) * k, n elements. */
static inline void scale_row_k(const float * x, const float * v, float k, float * y, size_t n)
{
    const __m512 h = _mm512_set1_ps(k);
    size_t i = 0;
    for (; i + 2 * F <= n; i += 2 * F) {
        __m512 r0 = scale(_mm512_loadu_ps(x + i), _mm512_loadu_ps(v + i), h);
        __m512 r1 = scale(_mm512_loadu_ps(x + i + F), _mm512_loadu_ps(v + i + F), h);
        _mm512_storeu_ps(y + i, r0);
        _mm512_storeu_ps(y + i + F, r1);
    }
    for (; i + F <= n; i += F)
        _mm512_storeu_ps(y + i, scale(_mm512_loadu_ps(x + i), _mm512_loadu_ps(v + i), h));
    if (i < n) {
        __mmask16 m = tn_avx512_tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, scale(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, v + i), h));
    }
}

static void nchw_narrow(const float * src, size_t channels, size_t height, size_t width, const float * ver,
                        const float * hor, float * dst)
{
    __m512i col[F], row[F];
    __m512 vt[F];
    make_indices(width, col, row);
    size_t total = height * width;
    for (size_t c = 0; c < channels; ++c) {
        const float * x = src + c * total, * hc = hor + c * height;
        float * y = dst + c * total;
        __m512 vv = _mm512_maskz_loadu_ps(tn_avx512_tail_mask(width), ver + c * width);
        for (size_t j = 0; j < width; ++j)
            vt[j] = _mm512_permutexvar_ps(col[j], vv);
        for (size_t r = 0, e = 0; e < total; r += F) {
            size_t rows = height - r < F ? height - r : F;
            __m512 hv = _mm512_maskz_loadu_ps(tn_avx512_tail_mask(rows), hc + r);
            for (size_t j = 0; j < width && e < total; ++j, e += F) {
                __m512 h = _mm512_permutexvar_ps(row[j], hv);
                if (e + F <= total) {
                    _mm512_storeu_ps(y + e, scale(_mm512_loadu_ps(x + e), vt[j], h));
                } else {
                    __mmask16 m = tn_avx512_tail_mask(total - e);
                    _mm512_mask_storeu_ps(y + e, m, scale(_mm512_maskz_loadu_ps(m, x + e), vt[j], h));
                }
            }
        }
    }
}

static void nhwc_narrow(const float * src, size_t channels, size_t height, size_t width, const float * ver,
                        const float * hor, float * dst)
{
    __m512i chan[F];
    __m512 ht[F];
    make_indices(channels, chan, NULL);
    size_t n = width * channels;
    for (size_t h = 0; h < height; ++h) {
        const float * x = src + h * n;
        float * y = dst + h * n;
        __m512 hv = _mm512_maskz_loadu_ps(tn_avx512_tail_mask(channels), hor + h * channels);
        for (size_t j = 0; j < channels; ++j)
            ht[j] = _mm512_permutexvar_ps(chan[j], hv);
        size_t i = 0, j = 0;
        for (; i + F <= n; i += F) {
            _mm512_storeu_ps(y + i, scale(_mm512_loadu_ps(x + i), _mm512_loadu_ps(ver + i), ht[j]));
            j = j + 1 == channels ? 0 : j + 1;
        }
        if (i < n) {
            __mmask16 m = tn_avx512_tail_mask(n - i);
            _mm512_mask_storeu_ps(y + i, m, scale(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, ver + i), ht[j]));
        }
    }
}

void tn_avx512_SynetTiledScale2D32f(const float * src, size_t channels, size_t height, size_t width, int format,
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
