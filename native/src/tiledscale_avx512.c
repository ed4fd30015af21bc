/*
 * TiledScale2D, AVX-512. Same products as tiledscale_scalar.c, (x * ver) * hor, so the
 * results are bit-identical. In place (src == dst) is allowed: every vector is loaded
 * before it is stored and no vector re-reads an element already stored.
 *
 * Stores go to whole 64-byte lines of dst wherever possible (a store that splits a cache
 * line costs about twice as much, and NumPy arrays are only 16-byte aligned), with masked
 * parts at the ends:
 *   NCHW, W >= 16: one stream over all rows, so a vector may straddle two rows and then
 *     takes its factors from both (join).
 *   NCHW, W < 16: per channel; a vector starting at column phase f needs
 *     ver[(f + l) % W] and hor[row + (f + l) / W] in lane l, permuted from registers.
 *   NHWC, C <= 1024: per image row; ver is contiguous along the row and hor repeats with
 *     period C, read from a copy of the hor row extended by 15 values.
 *   NHWC, C > 1024: one stream over all pixels, joining at pixel boundaries.
 */
#include "vmath_avx512.h"

#include "kernels.h"
#include "tensorops.h"

#define F TN_AVX512_F

/* Floats from p to the next 64-byte boundary. */
static inline size_t gap(const float * p)
{
    return ((0 - (uintptr_t)p) & 63) / sizeof(float);
}

static inline __m512 scale(__m512 x, __m512 v, __m512 h)
{
    return _mm512_mul_ps(_mm512_mul_ps(x, v), h);
}

static inline __m512i lanes(void)
{
    return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

/* Lanes [0, lo) from a[0, lo), lanes [lo, F) from b[0, F - lo); 0 < lo < F. */
static inline __m512 join(const float * a, size_t lo, const float * b)
{
    __mmask16 m = tn_avx512_tail_mask(lo);
    __m512i idx = _mm512_sub_epi32(lanes(), _mm512_set1_epi32((int)lo)); /* lane l: b[l - lo] */
    __m512 vb = _mm512_maskz_loadu_ps(tn_avx512_tail_mask(F - lo), b);
    return _mm512_mask_permutexvar_ps(_mm512_maskz_loadu_ps(m, a), (__mmask16)~m, idx, vb);
}

/* NCHW, W >= F: rows g = c * H + h of W floats, factors ver + c * W and hor[g]. */
static void nchw_wide(const float * src, size_t channels, size_t height, size_t width, const float * ver,
                      const float * hor, float * dst)
{
    size_t rows = channels * height, s = gap(dst); /* s: first column of the row still to do */
    if (s) {
        __mmask16 m = tn_avx512_tail_mask(s);
        _mm512_mask_storeu_ps(dst, m, scale(_mm512_maskz_loadu_ps(m, src), _mm512_maskz_loadu_ps(m, ver),
                                            _mm512_set1_ps(hor[0])));
    }
    const float * v = ver;
    for (size_t g = 0, h = 0; g < rows; ++g) {
        const float * x = src + g * width;
        float * y = dst + g * width;
        const __m512 k = _mm512_set1_ps(hor[g]);
        size_t col = s;
        for (; col + 2 * F <= width; col += 2 * F) {
            __m512 r0 = scale(_mm512_loadu_ps(x + col), _mm512_loadu_ps(v + col), k);
            __m512 r1 = scale(_mm512_loadu_ps(x + col + F), _mm512_loadu_ps(v + col + F), k);
            _mm512_storeu_ps(y + col, r0);
            _mm512_storeu_ps(y + col + F, r1);
        }
        if (col + F <= width) {
            _mm512_storeu_ps(y + col, scale(_mm512_loadu_ps(x + col), _mm512_loadu_ps(v + col), k));
            col += F;
        }
        const float * vn = v; /* ver row of row g + 1 */
        if (++h == height) {
            h = 0;
            vn = v + width;
        }
        s = 0;
        if (col < width) {
            size_t lo = width - col;
            __mmask16 m = tn_avx512_tail_mask(lo);
            if (g + 1 < rows) {
                __m512 kk = _mm512_mask_blend_ps(m, _mm512_set1_ps(hor[g + 1]), k);
                _mm512_storeu_ps(y + col, scale(_mm512_loadu_ps(x + col), join(v + col, lo, vn), kk));
                s = F - lo;
            } else {
                _mm512_mask_storeu_ps(y + col, m, scale(_mm512_maskz_loadu_ps(m, x + col), _mm512_maskz_loadu_ps(m, v + col), k));
            }
        }
        v = vn;
    }
}

/* NHWC, C >= F: pixels p = h * W + w of C floats, factors ver + w * C and hor + h * C. */
static void nhwc_wide(const float * src, size_t channels, size_t height, size_t width, const float * ver,
                      const float * hor, float * dst)
{
    size_t pixels = height * width, s = gap(dst);
    if (s) {
        __mmask16 m = tn_avx512_tail_mask(s);
        _mm512_mask_storeu_ps(dst, m, scale(_mm512_maskz_loadu_ps(m, src), _mm512_maskz_loadu_ps(m, ver),
                                            _mm512_maskz_loadu_ps(m, hor)));
    }
    const float * v = ver, * hr = hor;
    for (size_t p = 0, w = 0; p < pixels; ++p) {
        const float * x = src + p * channels;
        float * y = dst + p * channels;
        size_t col = s;
        for (; col + F <= channels; col += F)
            _mm512_storeu_ps(y + col, scale(_mm512_loadu_ps(x + col), _mm512_loadu_ps(v + col), _mm512_loadu_ps(hr + col)));
        const float * vn = v + channels, * hn = hr; /* factors of pixel p + 1 */
        if (++w == width) {
            w = 0;
            vn = ver;
            hn = hr + channels;
        }
        s = 0;
        if (col < channels) {
            size_t lo = channels - col;
            if (p + 1 < pixels) {
                _mm512_storeu_ps(y + col, scale(_mm512_loadu_ps(x + col), join(v + col, lo, vn), join(hr + col, lo, hn)));
                s = F - lo;
            } else {
                __mmask16 m = tn_avx512_tail_mask(lo);
                _mm512_mask_storeu_ps(y + col, m, scale(_mm512_maskz_loadu_ps(m, x + col), _mm512_maskz_loadu_ps(m, v + col),
                                                        _mm512_maskz_loadu_ps(m, hr + col)));
            }
        }
        v = vn;
        hr = hn;
    }
}

/* NCHW, W < F: per channel, a masked head up to dst's line boundary, whole vectors, a
 * masked tail. */
static void nchw_narrow(const float * src, size_t channels, size_t height, size_t width, const float * ver,
                        const float * hor, float * dst)
{
    __m512i col[F], row[F];
    __m512 vt[F];
    for (size_t f = 0; f < width; ++f) {
        int32_t tc[F], tr[F];
        for (size_t l = 0; l < F; ++l) {
            tc[l] = (int32_t)((f + l) % width);
            tr[l] = (int32_t)((f + l) / width); /* < F */
        }
        col[f] = _mm512_loadu_si512(tc);
        row[f] = _mm512_loadu_si512(tr);
    }
    size_t total = height * width, step = F % width, rstep = F / width;
    for (size_t c = 0; c < channels; ++c) {
        const float * x = src + c * total, * hc = hor + c * height;
        float * y = dst + c * total;
        __m512 vv = _mm512_maskz_loadu_ps(tn_avx512_tail_mask(width), ver + c * width);
        for (size_t f = 0; f < width; ++f)
            vt[f] = _mm512_permutexvar_ps(col[f], vv);
        size_t e = gap(y) < total ? gap(y) : total, f = 0, r = 0;
        if (e) {
            __mmask16 m = tn_avx512_tail_mask(e);
            __m512 hv = _mm512_maskz_loadu_ps(tn_avx512_tail_mask(height < F ? height : F), hc);
            _mm512_mask_storeu_ps(y, m, scale(_mm512_maskz_loadu_ps(m, x), vt[0], _mm512_permutexvar_ps(row[0], hv)));
            f = e % width;
            r = e / width;
        }
        for (; e + F <= total; e += F) {
            __m512 hv = r + F <= height ? _mm512_loadu_ps(hc + r) : _mm512_maskz_loadu_ps(tn_avx512_tail_mask(height - r), hc + r);
            _mm512_storeu_ps(y + e, scale(_mm512_loadu_ps(x + e), vt[f], _mm512_permutexvar_ps(row[f], hv)));
            f += step;
            r += rstep;
            if (f >= width) {
                f -= width;
                r += 1;
            }
        }
        if (e < total) {
            __mmask16 m = tn_avx512_tail_mask(total - e);
            __m512 hv = _mm512_maskz_loadu_ps(tn_avx512_tail_mask(height - r < F ? height - r : F), hc + r);
            _mm512_mask_storeu_ps(y + e, m, scale(_mm512_maskz_loadu_ps(m, x + e), vt[f], _mm512_permutexvar_ps(row[f], hv)));
        }
    }
}

/* NHWC, C <= TN_TILED_ROW: per image row of W * C floats, whose ver factors are
 * contiguous (ver[w * C + c]) and whose hor factors repeat with period C. The hor row is
 * first written to t with its first F - 1 values repeated after it, so the factors of any
 * vector are one unaligned load at t + (channel phase). A masked head up to dst's line
 * boundary, whole vectors, a masked tail. */
#define TN_TILED_ROW 1024
static void nhwc_rows(const float * src, size_t channels, size_t height, size_t width, const float * ver,
                      const float * hor, float * dst)
{
    float t[TN_TILED_ROW + F - 1];
    size_t n = width * channels, step = F % channels;
    for (size_t h = 0; h < height; ++h) {
        const float * x = src + h * n, * hr = hor + h * channels;
        float * y = dst + h * n;
        for (size_t j = 0; j < channels; ++j)
            t[j] = hr[j];
        for (size_t j = channels; j < channels + F - 1; ++j)
            t[j] = t[j - channels];
        size_t i = gap(y) < n ? gap(y) : n, f = i % channels;
        if (i) {
            __mmask16 m = tn_avx512_tail_mask(i);
            _mm512_mask_storeu_ps(y, m, scale(_mm512_maskz_loadu_ps(m, x), _mm512_maskz_loadu_ps(m, ver), _mm512_loadu_ps(t)));
        }
        for (; i + 2 * F <= n; i += 2 * F) {
            size_t f1 = f + step;
            f1 -= f1 >= channels ? channels : 0;
            __m512 r0 = scale(_mm512_loadu_ps(x + i), _mm512_loadu_ps(ver + i), _mm512_loadu_ps(t + f));
            __m512 r1 = scale(_mm512_loadu_ps(x + i + F), _mm512_loadu_ps(ver + i + F), _mm512_loadu_ps(t + f1));
            _mm512_storeu_ps(y + i, r0);
            _mm512_storeu_ps(y + i + F, r1);
            f = f1 + step;
            f -= f >= channels ? channels : 0;
        }
        if (i + F <= n) {
            _mm512_storeu_ps(y + i, scale(_mm512_loadu_ps(x + i), _mm512_loadu_ps(ver + i), _mm512_loadu_ps(t + f)));
            i += F;
            f += step;
            f -= f >= channels ? channels : 0;
        }
        if (i < n) {
            __mmask16 m = tn_avx512_tail_mask(n - i);
            _mm512_mask_storeu_ps(y + i, m, scale(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, ver + i), _mm512_loadu_ps(t + f)));
        }
    }
}

void tn_avx512_SynetTiledScale2D32f(const float * src, size_t channels, size_t height, size_t width, int format,
                                    const float * ver, const float * hor, float * dst)
{
    if (channels == 0 || height == 0 || width == 0)
        return;
    if (format == TnTensorFormatNhwc) {
        if (channels <= TN_TILED_ROW)
            nhwc_rows(src, channels, height, width, ver, hor, dst);
        else
            nhwc_wide(src, channels, height, width, ver, hor, dst);
    } else {
        if (width < F)
            nchw_narrow(src, channels, height, width, ver, hor, dst);
        else
            nchw_wide(src, channels, height, width, ver, hor, dst);
    }
}
