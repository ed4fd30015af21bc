/*
 * TiledScale2D, AVX2. Same products as tiledscale_scalar.c, (x * ver) * hor, so the
 * results are bit-identical. In place (src == dst) is allowed: every vector is loaded
 * before it is stored and no vector re-reads an element already stored.
 *
 * Same structure as tiledscale_avx512.c with 8-float vectors stored at 32-byte aligned
 * addresses (so no store splits a cache line), masked parts at the ends:
 *   NCHW, W >= 8: one stream over all rows; a vector straddling two rows takes its
 *     factors from both (join).
 *   NCHW, W < 8: per channel; a vector starting at column phase f needs
 *     ver[(f + l) % W] and hor[row + (f + l) / W] in lane l, permuted from registers.
 *   NHWC, C <= 1024: per image row; ver is contiguous along the row and hor repeats with
 *     period C, read from a copy of the hor row extended by 7 values.
 *   NHWC, C > 1024: one stream over all pixels, joining at pixel boundaries.
 */
#include "vmath_avx2.h"

#include "kernels.h"
#include "tensorops.h"

#define F TN_AVX2_F

/* Floats from p to the next 32-byte boundary. */
static inline size_t gap(const float * p)
{
    return ((0 - (uintptr_t)p) & 31) / sizeof(float);
}

static inline __m256 scale(__m256 x, __m256 v, __m256 h)
{
    return _mm256_mul_ps(_mm256_mul_ps(x, v), h);
}

/* Lanes [0, lo) from a[0, lo), lanes [lo, F) from b[0, F - lo); 0 < lo < F. */
static inline __m256 join(const float * a, size_t lo, const float * b)
{
    __m256i idx = _mm256_sub_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)lo));
    __m256 vb = _mm256_permutevar8x32_ps(_mm256_maskload_ps(b, tn_avx2_tail_mask(F - lo)), idx); /* b[l - lo] */
    __m256i m = tn_avx2_tail_mask(lo);
    return _mm256_blendv_ps(vb, _mm256_maskload_ps(a, m), _mm256_castsi256_ps(m));
}

/* NCHW, W >= F: rows g = c * H + h of W floats, factors ver + c * W and hor[g]. */
static void nchw_wide(const float * src, size_t channels, size_t height, size_t width, const float * ver,
                      const float * hor, float * dst)
{
    size_t rows = channels * height, s = gap(dst); /* s: first column of the row still to do */
    if (s) {
        __m256i m = tn_avx2_tail_mask(s);
        _mm256_maskstore_ps(dst, m, scale(_mm256_maskload_ps(src, m), _mm256_maskload_ps(ver, m), _mm256_set1_ps(hor[0])));
    }
    const float * v = ver;
    for (size_t g = 0, h = 0; g < rows; ++g) {
        const float * x = src + g * width;
        float * y = dst + g * width;
        const __m256 k = _mm256_set1_ps(hor[g]);
        size_t col = s;
        for (; col + 2 * F <= width; col += 2 * F) {
            __m256 r0 = scale(_mm256_loadu_ps(x + col), _mm256_loadu_ps(v + col), k);
            __m256 r1 = scale(_mm256_loadu_ps(x + col + F), _mm256_loadu_ps(v + col + F), k);
            _mm256_storeu_ps(y + col, r0);
            _mm256_storeu_ps(y + col + F, r1);
        }
        if (col + F <= width) {
            _mm256_storeu_ps(y + col, scale(_mm256_loadu_ps(x + col), _mm256_loadu_ps(v + col), k));
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
            __m256i m = tn_avx2_tail_mask(lo);
            if (g + 1 < rows) {
                __m256 kk = _mm256_blendv_ps(_mm256_set1_ps(hor[g + 1]), k, _mm256_castsi256_ps(m));
                _mm256_storeu_ps(y + col, scale(_mm256_loadu_ps(x + col), join(v + col, lo, vn), kk));
                s = F - lo;
            } else {
                _mm256_maskstore_ps(y + col, m, scale(_mm256_maskload_ps(x + col, m), _mm256_maskload_ps(v + col, m), k));
            }
        }
        v = vn;
    }
}

/* NHWC, C > TN_TILED_ROW: pixels p = h * W + w of C floats, factors ver + w * C and
 * hor + h * C. */
static void nhwc_wide(const float * src, size_t channels, size_t height, size_t width, const float * ver,
                      const float * hor, float * dst)
{
    size_t pixels = height * width, s = gap(dst);
    if (s) {
        __m256i m = tn_avx2_tail_mask(s);
        _mm256_maskstore_ps(dst, m, scale(_mm256_maskload_ps(src, m), _mm256_maskload_ps(ver, m), _mm256_maskload_ps(hor, m)));
    }
    const float * v = ver, * hr = hor;
    for (size_t p = 0, w = 0; p < pixels; ++p) {
        const float * x = src + p * channels;
        float * y = dst + p * channels;
        size_t col = s;
        for (; col + F <= channels; col += F)
            _mm256_storeu_ps(y + col, scale(_mm256_loadu_ps(x + col), _mm256_loadu_ps(v + col), _mm256_loadu_ps(hr + col)));
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
                _mm256_storeu_ps(y + col, scale(_mm256_loadu_ps(x + col), join(v + col, lo, vn), join(hr + col, lo, hn)));
                s = F - lo;
            } else {
                __m256i m = tn_avx2_tail_mask(lo);
                _mm256_maskstore_ps(y + col, m, scale(_mm256_maskload_ps(x + col, m), _mm256_maskload_ps(v + col, m),
                                                      _mm256_maskload_ps(hr + col, m)));
            }
        }
        v = vn;
        hr = hn;
    }
}

/* NCHW, W < F: per channel, a masked head up to dst's 32-byte boundary, whole vectors, a
 * masked tail. */
static void nchw_narrow(const float * src, size_t channels, size_t height, size_t width, const float * ver,
                        const float * hor, float * dst)
{
    __m256i col[F], row[F];
    __m256 vt[F];
    for (size_t f = 0; f < width; ++f) {
        int32_t tc[F], tr[F];
        for (size_t l = 0; l < F; ++l) {
            tc[l] = (int32_t)((f + l) % width);
            tr[l] = (int32_t)((f + l) / width); /* < F */
        }
        col[f] = _mm256_loadu_si256((const __m256i *)tc);
        row[f] = _mm256_loadu_si256((const __m256i *)tr);
    }
    size_t total = height * width, step = F % width, rstep = F / width;
    for (size_t c = 0; c < channels; ++c) {
        const float * x = src + c * total, * hc = hor + c * height;
        float * y = dst + c * total;
        __m256 vv = _mm256_maskload_ps(ver + c * width, tn_avx2_tail_mask(width));
        for (size_t f = 0; f < width; ++f)
            vt[f] = _mm256_permutevar8x32_ps(vv, col[f]);
        size_t e = gap(y) < total ? gap(y) : total, f = 0, r = 0;
        if (e) {
            __m256i m = tn_avx2_tail_mask(e);
            __m256 hv = _mm256_maskload_ps(hc, tn_avx2_tail_mask(height < F ? height : F));
            _mm256_maskstore_ps(y, m, scale(_mm256_maskload_ps(x, m), vt[0], _mm256_permutevar8x32_ps(hv, row[0])));
            f = e % width;
            r = e / width;
        }
        for (; e + F <= total; e += F) {
            __m256 hv = r + F <= height ? _mm256_loadu_ps(hc + r) : _mm256_maskload_ps(hc + r, tn_avx2_tail_mask(height - r));
            _mm256_storeu_ps(y + e, scale(_mm256_loadu_ps(x + e), vt[f], _mm256_permutevar8x32_ps(hv, row[f])));
            f += step;
            r += rstep;
            if (f >= width) {
                f -= width;
                r += 1;
            }
        }
        if (e < total) {
            __m256i m = tn_avx2_tail_mask(total - e);
            __m256 hv = _mm256_maskload_ps(hc + r, tn_avx2_tail_mask(height - r < F ? height - r : F));
            _mm256_maskstore_ps(y + e, m, scale(_mm256_maskload_ps(x + e, m), vt[f], _mm256_permutevar8x32_ps(hv, row[f])));
        }
    }
}

/* NHWC, C <= TN_TILED_ROW: per image row of W * C floats, whose ver factors are
 * contiguous (ver[w * C + c]) and whose hor factors repeat with period C. The hor row is
 * first copied to t with its first F - 1 values repeated after it, so the factors of any
 * vector are one unaligned load at t + (channel phase). A masked head up to dst's 32-byte
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
            __m256i m = tn_avx2_tail_mask(i);
            _mm256_maskstore_ps(y, m, scale(_mm256_maskload_ps(x, m), _mm256_maskload_ps(ver, m), _mm256_loadu_ps(t)));
        }
        for (; i + 2 * F <= n; i += 2 * F) {
            size_t f1 = f + step;
            f1 -= f1 >= channels ? channels : 0;
            __m256 r0 = scale(_mm256_loadu_ps(x + i), _mm256_loadu_ps(ver + i), _mm256_loadu_ps(t + f));
            __m256 r1 = scale(_mm256_loadu_ps(x + i + F), _mm256_loadu_ps(ver + i + F), _mm256_loadu_ps(t + f1));
            _mm256_storeu_ps(y + i, r0);
            _mm256_storeu_ps(y + i + F, r1);
            f = f1 + step;
            f -= f >= channels ? channels : 0;
        }
        if (i + F <= n) {
            _mm256_storeu_ps(y + i, scale(_mm256_loadu_ps(x + i), _mm256_loadu_ps(ver + i), _mm256_loadu_ps(t + f)));
            i += F;
            f += step;
            f -= f >= channels ? channels : 0;
        }
        if (i < n) {
            __m256i m = tn_avx2_tail_mask(n - i);
            _mm256_maskstore_ps(y + i, m, scale(_mm256_maskload_ps(x + i, m), _mm256_maskload_ps(ver + i, m), _mm256_loadu_ps(t + f)));
        }
    }
}

void tn_avx2_SynetTiledScale2D32f(const float * src, size_t channels, size_t height, size_t width, int format,
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
