/*
 * Shuffle layer, AVX-512. Same copies as shuffle_scalar.c (see there for the layout):
 * NCHW copies spatial rows; NHWC deinterleaves or interleaves each pixel's channels with
 * two-source permutes. Stores are line-aligned where possible (see gap).
 */
#include "vmath_avx512.h"

#include "kernels.h"
#include "tensorops.h"

#define F TN_AVX512_F

/* Floats from p to the next 64-byte boundary. The routines below store whole vectors at
 * line-aligned addresses wherever they can: a store that splits a cache line costs about
 * twice as much, and NumPy arrays are only 16-byte aligned. */
static inline size_t gap(const float * p)
{
    return ((0 - (uintptr_t)p) & 63) / sizeof(float);
}

static inline void copy(const float * s, float * d, size_t n)
{
    size_t j = gap(d) < n ? gap(d) : n;
    if (j) {
        __mmask16 m = tn_avx512_tail_mask(j);
        _mm512_mask_storeu_ps(d, m, _mm512_maskz_loadu_ps(m, s));
    }
    for (; j + 4 * F <= n; j += 4 * F) {
        __m512 v0 = _mm512_loadu_ps(s + j + 0 * F), v1 = _mm512_loadu_ps(s + j + 1 * F);
        __m512 v2 = _mm512_loadu_ps(s + j + 2 * F), v3 = _mm512_loadu_ps(s + j + 3 * F);
        _mm512_storeu_ps(d + j + 0 * F, v0);
        _mm512_storeu_ps(d + j + 1 * F, v1);
        _mm512_storeu_ps(d + j + 2 * F, v2);
        _mm512_storeu_ps(d + j + 3 * F, v3);
    }
    for (; j + F <= n; j += F)
        _mm512_storeu_ps(d + j, _mm512_loadu_ps(s + j));
    if (j < n) {
        __mmask16 m = tn_avx512_tail_mask(n - j);
        _mm512_mask_storeu_ps(d + j, m, _mm512_maskz_loadu_ps(m, s + j));
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

/* d[k] = s[2k + parity], k < r < 16; idx selects the parity (see pick). */
static inline void pick_part(const float * s, size_t r, __m512i idx, float * d)
{
    size_t n = 2 * r;
    __m512 v0 = _mm512_maskz_loadu_ps(tn_avx512_tail_mask(n < F ? n : F), s);
    __m512 v1 = _mm512_maskz_loadu_ps(tn_avx512_tail_mask(n > F ? n - F : 0), s + F);
    _mm512_mask_storeu_ps(d, tn_avx512_tail_mask(r), _mm512_permutex2var_ps(v0, idx, v1));
}

/* Whole vectors of pick: d[k + i] = s[2(k + i) + parity], i < F. */
static inline void pick_vec(const float * s, size_t k, __m512i idx, float * d)
{
    _mm512_storeu_ps(d + k, _mm512_permutex2var_ps(_mm512_loadu_ps(s + 2 * k), idx, _mm512_loadu_ps(s + 2 * k + F)));
}

/* d[k] = s[2k + parity], k < n. A row of at least F pairs starts and ends with a whole
 * (unaligned, overlapping) vector; the vectors between are stored aligned. */
static inline void pick(const float * s, size_t n, __m512i idx, float * d)
{
    if (n < F) {
        pick_part(s, n, idx, d);
        return;
    }
    pick_vec(s, 0, idx, d);
    size_t k = gap(d) ? gap(d) : F;
    for (; k + F <= n; k += F)
        pick_vec(s, k, idx, d);
    if (k < n)
        pick_vec(s, n - F, idx, d);
}

/* d[2k] = a[k], d[2k + 1] = b[k], k < r < 16. */
static inline void zip_part(const float * a, const float * b, size_t r, __m512i lo, __m512i hi, float * d)
{
    size_t n = 2 * r;
    __mmask16 m = tn_avx512_tail_mask(r);
    __m512 va = _mm512_maskz_loadu_ps(m, a), vb = _mm512_maskz_loadu_ps(m, b);
    _mm512_mask_storeu_ps(d, tn_avx512_tail_mask(n < F ? n : F), _mm512_permutex2var_ps(va, lo, vb));
    if (n > F)
        _mm512_mask_storeu_ps(d + F, tn_avx512_tail_mask(n - F), _mm512_permutex2var_ps(va, hi, vb));
}

/* d[2k] = a[k], d[2k + 1] = b[k], k < n: a masked head up to d's first line boundary
 * (when d is 8-byte aligned, so the boundary falls on a pair), whole vectors, a masked
 * tail. (Unlike pick, this measured faster than overlapping whole vectors at the ends.) */
static inline void zip(const float * a, const float * b, size_t n, float * d)
{
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    size_t g = gap(d), k = g & 1 ? 0 : g / 2 < n ? g / 2 : n; /* an odd gap cannot be aligned */
    if (k)
        zip_part(a, b, k, lo, hi, d);
    for (; k + F <= n; k += F) {
        __m512 va = _mm512_loadu_ps(a + k), vb = _mm512_loadu_ps(b + k);
        _mm512_storeu_ps(d + 2 * k, _mm512_permutex2var_ps(va, lo, vb));
        _mm512_storeu_ps(d + 2 * k + F, _mm512_permutex2var_ps(va, hi, vb));
    }
    if (k < n)
        zip_part(a + k, b + k, n - k, lo, hi, d + 2 * k);
}

void tn_avx512_SynetShuffleLayerForward(const float * src0, const float * src1, size_t channels0, size_t channels1,
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
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    size_t half = (channels0 + channels1) / 2, h0 = channels0 / 2, h1 = channels1 / 2;
    /* Type 0: one pass over the pixels per input; type 1: one per output. Each pixel
     * writes one output row at a time: interleaving stores to two outputs measured
     * slower, while re-reading the input row from L1 is cheap. */
    if (type == 0) {
        for (size_t p = 0; p < spatial; ++p) {
            pick(src0 + p * channels0, h0, even, dst0 + p * half);
            pick(src0 + p * channels0, h0, odd, dst1 + p * half);
        }
        for (size_t p = 0; p < spatial; ++p) {
            pick(src1 + p * channels1, h1, even, dst0 + p * half + h0);
            pick(src1 + p * channels1, h1, odd, dst1 + p * half + h0);
        }
    } else {
        for (size_t p = 0; p < spatial; ++p)
            zip(src0 + p * half, src1 + p * half, h0, dst0 + p * channels0);
        for (size_t p = 0; p < spatial; ++p)
            zip(src0 + p * half + h0, src1 + p * half + h0, h1, dst1 + p * channels1);
    }
}
