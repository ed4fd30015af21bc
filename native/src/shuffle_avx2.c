/*
 * Shuffle layer, AVX2. Same copies as shuffle_scalar.c (see there for the layout):
 * NCHW copies spatial rows with full vectors and a masked tail; NHWC deinterleaves or
 * interleaves each pixel's channels with in-lane shuffles plus a cross-lane permute,
 * masked at the row end.
 */
#include "vmath_avx2.h"

#include "kernels.h"
#include "tensorops.h"

#define F TN_AVX2_F

static inline void copy(const float * s, float * d, size_t n)
{
    size_t j = 0;
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

/* Evens and odds of s[0..15], each in order. */
static inline void split8(__m256 v0, __m256 v1, __m256 * even, __m256 * odd)
{
    __m256 e = _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(2, 0, 2, 0)); /* 0 2 8 10 | 4 6 12 14 */
    __m256 o = _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(3, 1, 3, 1));
    *even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
    *odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
}

/* even[k] = s[2k], odd[k] = s[2k + 1], k < pairs. */
static inline void deinterleave(const float * s, size_t pairs, float * even, float * odd)
{
    __m256 e, o;
    size_t k = 0;
    for (; k + F <= pairs; k += F) {
        split8(_mm256_loadu_ps(s + 2 * k), _mm256_loadu_ps(s + 2 * k + F), &e, &o);
        _mm256_storeu_ps(even + k, e);
        _mm256_storeu_ps(odd + k, o);
    }
    if (k < pairs) {
        size_t r = pairs - k, n = 2 * r;
        __m256i m = tn_avx2_tail_mask(r);
        __m256 v0 = _mm256_maskload_ps(s + 2 * k, tn_avx2_tail_mask(n < F ? n : F));
        __m256 v1 = _mm256_maskload_ps(s + 2 * k + F, tn_avx2_tail_mask(n > F ? n - F : 0));
        split8(v0, v1, &e, &o);
        _mm256_maskstore_ps(even + k, m, e);
        _mm256_maskstore_ps(odd + k, m, o);
    }
}

/* a0 b0 .. a3 b3 and a4 b4 .. a7 b7. */
static inline void zip8(__m256 a, __m256 b, __m256 * lo, __m256 * hi)
{
    __m256 l = _mm256_unpacklo_ps(a, b); /* a0 b0 a1 b1 | a4 b4 a5 b5 */
    __m256 h = _mm256_unpackhi_ps(a, b); /* a2 b2 a3 b3 | a6 b6 a7 b7 */
    *lo = _mm256_permute2f128_ps(l, h, 0x20);
    *hi = _mm256_permute2f128_ps(l, h, 0x31);
}

/* d[2k] = a[k], d[2k + 1] = b[k], k < pairs. */
static inline void interleave(const float * a, const float * b, size_t pairs, float * d)
{
    __m256 lo, hi;
    size_t k = 0;
    for (; k + F <= pairs; k += F) {
        zip8(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), &lo, &hi);
        _mm256_storeu_ps(d + 2 * k, lo);
        _mm256_storeu_ps(d + 2 * k + F, hi);
    }
    if (k < pairs) {
        size_t r = pairs - k, n = 2 * r;
        __m256i m = tn_avx2_tail_mask(r);
        zip8(_mm256_maskload_ps(a + k, m), _mm256_maskload_ps(b + k, m), &lo, &hi);
        _mm256_maskstore_ps(d + 2 * k, tn_avx2_tail_mask(n < F ? n : F), lo);
        _mm256_maskstore_ps(d + 2 * k + F, tn_avx2_tail_mask(n > F ? n - F : 0), hi);
    }
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
    for (size_t p = 0; p < spatial; ++p) {
        if (type == 0) {
            float * d0 = dst0 + p * half, * d1 = dst1 + p * half;
            deinterleave(src0 + p * channels0, h0, d0, d1);
            deinterleave(src1 + p * channels1, h1, d0 + h0, d1 + h0);
        } else {
            const float * s0 = src0 + p * half, * s1 = src1 + p * half;
            interleave(s0, s1, h0, dst0 + p * channels0);
            interleave(s0 + h0, s1 + h0, h1, dst1 + p * channels1);
        }
    }
}
