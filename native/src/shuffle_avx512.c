/*
 * Shuffle layer, AVX-512. Same copies as shuffle_scalar.c (see there for the layout):
 * NCHW copies spatial rows with full vectors and a masked tail; NHWC deinterleaves or
 * interleaves each pixel's channels with two-source permutes, masked at the row end.
 */
#include "vmath_avx512.h"

#include "kernels.h"
#include "tensorops.h"

#define F TN_AVX512_F

static inline void copy(const float * s, float * d, size_t n)
{
    size_t j = 0;
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

/* even[k] = s[2k], odd[k] = s[2k + 1], k < pairs. */
static inline void deinterleave(const float * s, size_t pairs, float * even, float * odd)
{
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    size_t k = 0;
    for (; k + F <= pairs; k += F) {
        __m512 v0 = _mm512_loadu_ps(s + 2 * k), v1 = _mm512_loadu_ps(s + 2 * k + F);
        _mm512_storeu_ps(even + k, _mm512_permutex2var_ps(v0, ie, v1));
        _mm512_storeu_ps(odd + k, _mm512_permutex2var_ps(v0, io, v1));
    }
    if (k < pairs) {
        size_t r = pairs - k, n = 2 * r;
        __mmask16 m = tn_avx512_tail_mask(r);
        __m512 v0 = _mm512_maskz_loadu_ps(tn_avx512_tail_mask(n < F ? n : F), s + 2 * k);
        __m512 v1 = _mm512_maskz_loadu_ps(tn_avx512_tail_mask(n > F ? n - F : 0), s + 2 * k + F);
        _mm512_mask_storeu_ps(even + k, m, _mm512_permutex2var_ps(v0, ie, v1));
        _mm512_mask_storeu_ps(odd + k, m, _mm512_permutex2var_ps(v0, io, v1));
    }
}

/* d[2k] = a[k], d[2k + 1] = b[k], k < pairs. */
static inline void interleave(const float * a, const float * b, size_t pairs, float * d)
{
    const __m512i il = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i ih = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    size_t k = 0;
    for (; k + F <= pairs; k += F) {
        __m512 va = _mm512_loadu_ps(a + k), vb = _mm512_loadu_ps(b + k);
        _mm512_storeu_ps(d + 2 * k, _mm512_permutex2var_ps(va, il, vb));
        _mm512_storeu_ps(d + 2 * k + F, _mm512_permutex2var_ps(va, ih, vb));
    }
    if (k < pairs) {
        size_t r = pairs - k, n = 2 * r;
        __mmask16 m = tn_avx512_tail_mask(r);
        __m512 va = _mm512_maskz_loadu_ps(m, a + k), vb = _mm512_maskz_loadu_ps(m, b + k);
        _mm512_mask_storeu_ps(d + 2 * k, tn_avx512_tail_mask(n < F ? n : F), _mm512_permutex2var_ps(va, il, vb));
        _mm512_mask_storeu_ps(d + 2 * k + F, tn_avx512_tail_mask(n > F ? n - F : 0), _mm512_permutex2var_ps(va, ih, vb));
    }
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
