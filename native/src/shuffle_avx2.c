/*
 * Shuffle layer, AVX2. Same copies as shuffle_scalar.c (see there for the layout):
 * NCHW copies spatial rows; NHWC deinterleaves or interleaves each pixel's channels with
 * in-lane shuffles. Stores are 32-byte aligned where possible (see gap).
 */
#include "vmath_avx2.h"

#include "kernels.h"
#include "tensorops.h"

#define F TN_AVX2_F

/* Floats from p to the next 32-byte boundary. The routines below store whole vectors at
 * 32-byte aligned addresses wherever they can, so no store splits a cache line (NumPy
 * arrays are only 16-byte aligned). */
static inline size_t gap(const float * p)
{
    return ((0 - (uintptr_t)p) & 31) / sizeof(float);
}

static inline void copy(const float * s, float * d, size_t n)
{
    size_t j = gap(d) < n ? gap(d) : n;
    if (j) {
        __m256i m = tn_avx2_tail_mask(j);
        _mm256_maskstore_ps(d, m, _mm256_maskload_ps(s, m));
    }
    for (; j + 4 * F <= n; j += 4 * F) {
        __m256 v0 = _mm256_loadu_ps(s + j + 0 * F), v1 = _mm256_loadu_ps(s + j + 1 * F);
        __m256 v2 = _mm256_loadu_ps(s + j + 2 * F), v3 = _mm256_loadu_ps(s + j + 3 * F);
        _mm256_storeu_ps(d + j + 0 * F, v0);
        _mm256_storeu_ps(d + j + 1 * F, v1);
        _mm256_storeu_ps(d + j + 2 * F, v2);
        _mm256_storeu_ps(d + j + 3 * F, v3);
    }
    for (; j + F <= n; j += F)
        _mm256_storeu_ps(d + j, _mm256_loadu_ps(s + j));
    if (j < n) {
        __m256i m = tn_avx2_tail_mask(n - j);
        _mm256_maskstore_ps(d + j, m, _mm256_maskload_ps(s + j, m));
    }
}

static void copy_rows_nchw(const float * src0, const float * src1, size_t channels0, size_t channels1,
                           size_t spatial, float * dst0, float * dst1, int type)
{
    size_t half = (channels0 + channels1) / 2;
    if (type == 0) {
        for (size_t j = 0; j < 2 * half; ++j) {
            const float * s = j < channels0 ? src0 + j * spatial : src1 + (j - channels0) * spatial;
            copy(s, (j & 1 ? dst1 : dst0) + (j / 2) * spatial, spatial);
        }
    } else {
        for (size_t j = 0; j < 2 * half && j < channels0 + channels1; ++j) {
            float * d = j < channels0 ? dst0 + j * spatial : dst1 + (j - channels0) * spatial;
            copy((j & 1 ? src1 : src0) + (j / 2) * spatial, d, spatial);
        }
    }
}

/* d[k] = s[2k + odd], k < r < 8. */
static inline void pick_part(const float * s, size_t r, int odd, float * d)
{
    size_t n = 2 * r;
    __m256 v0 = _mm256_maskload_ps(s, tn_avx2_tail_mask(n < F ? n : F));
    __m256 v1 = _mm256_maskload_ps(s + F, tn_avx2_tail_mask(n > F ? n - F : 0));
    __m256 v = odd ? _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(3, 1, 3, 1)) : _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(2, 0, 2, 0));
    v = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), _MM_SHUFFLE(3, 1, 2, 0)));
    _mm256_maskstore_ps(d, tn_avx2_tail_mask(r), v);
}

/* Whole vectors of pick: d[k + i] = s[2(k + i) + odd], i < F. The halves are loaded as
 * (s0..s3 | s8..s11) and (s4..s7 | s12..s15), so one in-lane shuffle puts the evens (or
 * odds) in order. */
static inline void pick_vec(const float * s, size_t k, int odd, float * d)
{
    s += 2 * k;
    __m256 v0 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(s)), _mm_loadu_ps(s + 8), 1);
    __m256 v1 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(s + 4)), _mm_loadu_ps(s + 12), 1);
    _mm256_storeu_ps(d + k, odd ? _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(3, 1, 3, 1)) : _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(2, 0, 2, 0)));
}

/* d[k] = s[2k + odd], k < n. A row of at least F pairs starts and ends with a whole
 * (unaligned, overlapping) vector; the vectors between are stored aligned. */
static inline void pick(const float * s, size_t n, int odd, float * d)
{
    if (n < F) {
        pick_part(s, n, odd, d);
        return;
    }
    pick_vec(s, 0, odd, d);
    size_t k = gap(d) ? gap(d) : F;
    for (; k + F <= n; k += F)
        pick_vec(s, k, odd, d);
    if (k < n)
        pick_vec(s, n - F, odd, d);
}

/* a0 b0 .. a3 b3 and a4 b4 .. a7 b7. */
static inline void zip8(__m256 a, __m256 b, __m256 * lo, __m256 * hi)
{
    __m256 l = _mm256_unpacklo_ps(a, b); /* a0 b0 a1 b1 | a4 b4 a5 b5 */
    __m256 h = _mm256_unpackhi_ps(a, b); /* a2 b2 a3 b3 | a6 b6 a7 b7 */
    *lo = _mm256_permute2f128_ps(l, h, 0x20);
    *hi = _mm256_permute2f128_ps(l, h, 0x31);
}

/* d[2k] = a[k], d[2k + 1] = b[k], k < r < 8. */
static inline void zip_part(const float * a, const float * b, size_t r, float * d)
{
    size_t n = 2 * r;
    __m256i m = tn_avx2_tail_mask(r);
    __m256 lo, hi;
    zip8(_mm256_maskload_ps(a, m), _mm256_maskload_ps(b, m), &lo, &hi);
    _mm256_maskstore_ps(d, tn_avx2_tail_mask(n < F ? n : F), lo);
    if (n > F)
        _mm256_maskstore_ps(d + F, tn_avx2_tail_mask(n - F), hi);
}

/* d[2k] = a[k], d[2k + 1] = b[k], k < n: a masked head up to d's first 32-byte boundary
 * (when d is 8-byte aligned, so the boundary falls on a pair), whole vectors, a masked
 * tail. */
static inline void zip(const float * a, const float * b, size_t n, float * d)
{
    __m256 lo, hi;
    size_t g = gap(d), k = g & 1 ? 0 : g / 2 < n ? g / 2 : n;
    if (k)
        zip_part(a, b, k, d);
    for (; k + F <= n; k += F) {
        zip8(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), &lo, &hi);
        _mm256_storeu_ps(d + 2 * k, lo);
        _mm256_storeu_ps(d + 2 * k + F, hi);
    }
    if (k < n)
        zip_part(a + k, b + k, n - k, d + 2 * k);
}

void tn_avx2_SynetShuffleLayerForward(const float * src0, const float * src1, size_t channels0, size_t channels1,
                                      size_t spatial, float * dst0, float * dst1, int format, int type)
{
    if (type != 0 && type != 1)
        return;
    if (format != TnTensorFormatNhwc) {
        copy_rows_nchw(src0, src1, channels0, channels1, spatial, dst0, dst1, type);
        return;
    }
    if ((channels0 | channels1) & 1) { /* outside the contract: the plain element path */
        tn_scalar_SynetShuffleLayerForward(src0, src1, channels0, channels1, spatial, dst0, dst1, format, type);
        return;
    }
    size_t half = (channels0 + channels1) / 2, h0 = channels0 / 2, h1 = channels1 / 2;
    /* Same pass structure as the AVX-512 level: one output row at a time. */
    if (type == 0) {
        for (size_t p = 0; p < spatial; ++p) {
            pick(src0 + p * channels0, h0, 0, dst0 + p * half);
            pick(src0 + p * channels0, h0, 1, dst1 + p * half);
        }
        for (size_t p = 0; p < spatial; ++p) {
            pick(src1 + p * channels1, h1, 0, dst0 + p * half + h0);
            pick(src1 + p * channels1, h1, 1, dst1 + p * half + h0);
        }
    } else {
        for (size_t p = 0; p < spatial; ++p)
            zip(src0 + p * half, src1 + p * half, h0, dst0 + p * channels0);
        for (size_t p = 0; p < spatial; ++p)
            zip(src0 + p * half + h0, src1 + p * half + h0, h1, dst1 + p * channels1);
    }
}
