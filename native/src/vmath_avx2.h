/*
 * AVX2 vector math. Including this header compiles the rest of the file for
 * AVX2 + FMA + F16C (the "avx2" ISA level); include it first in every *_avx2.c file.
 * Functions mirror vmath_scalar.h operation for operation: results are bit-identical.
 */
#ifndef TN_VMATH_AVX2_H
#define TN_VMATH_AVX2_H

#pragma GCC target("avx,avx2,fma,f16c")

#include <immintrin.h>
#include <stdint.h>

#include "vmath_scalar.h"

#define TN_AVX2_F 8 /* floats per vector */

/* Mask for the first n (< 8) lanes, for _mm256_maskload_ps / _mm256_maskstore_ps. */
static inline __m256i tn_avx2_tail_mask(size_t n)
{
    static const int32_t lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(lanes + 8 - n));
}

/* 8 BF16 -> 8 FP32. */
static inline __m256 tn_avx2_bf16_to_f32(__m128i b)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
}

static inline __m256 tn_avx2_load_bf16(const uint16_t * p)
{
    return tn_avx2_bf16_to_f32(_mm_loadu_si128((const __m128i *)p));
}

/* 8 FP32 -> 8 BF16, same rounding as tn_f32_to_bf16. */
static inline __m128i tn_avx2_f32_to_bf16(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    r = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(quiet), nan));
    r = _mm256_srli_epi32(r, 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

static inline void tn_avx2_store_bf16(uint16_t * p, __m256 v)
{
    _mm_storeu_si128((__m128i *)p, tn_avx2_f32_to_bf16(v));
}

static inline __m256 tn_avx2_exp(__m256 x)
{
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 xs = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(TN_EXP_MIN)), _mm256_set1_ps(TN_EXP_MAX));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xs, _mm256_set1_ps(TN_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-TN_LN2_HI), xs);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-TN_LN2_LO), r);
    __m256 p = _mm256_set1_ps(TN_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TN_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TN_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TN_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TN_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TN_EXP_P5));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i ni = _mm256_cvttps_epi32(n);
    __m256i j1 = _mm256_srai_epi32(ni, 1);
    __m256i j2 = _mm256_sub_epi32(ni, j1);
    __m256i bias = _mm256_set1_epi32(127);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(j1, bias), 23)));
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(j2, bias), 23)));
    return _mm256_blendv_ps(y, _mm256_add_ps(x, x), nan);
}

static inline __m256 tn_avx2_log(__m256 x)
{
    const __m256 zero = _mm256_setzero_ps();
    __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(FLT_MIN), _CMP_LT_OQ);
    __m256 xs = _mm256_blendv_ps(x, _mm256_mul_ps(x, _mm256_set1_ps(8388608.0f)), tiny);
    __m256 e_adjust = _mm256_and_ps(tiny, _mm256_set1_ps(-23.0f));
    __m256i u = _mm256_castps_si256(xs);
    __m256 e = _mm256_add_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(u, 23), _mm256_set1_epi32(126))), e_adjust);
    __m256 m = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(u, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x3f000000)));
    __m256 small = _mm256_cmp_ps(m, _mm256_set1_ps(TN_SQRTHF), _CMP_LT_OQ);
    e = _mm256_sub_ps(e, _mm256_and_ps(small, _mm256_set1_ps(1.0f)));
    m = _mm256_sub_ps(_mm256_add_ps(m, _mm256_and_ps(small, m)), _mm256_set1_ps(1.0f));
    __m256 z = _mm256_mul_ps(m, m);
    __m256 p = _mm256_set1_ps(TN_LOG_P0);
    p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(TN_LOG_P1));
    p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(TN_LOG_P2));
    p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(TN_LOG_P3));
    p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(TN_LOG_P4));
    p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(TN_LOG_P5));
    p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(TN_LOG_P6));
    p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(TN_LOG_P7));
    p = _mm256_fmadd_ps(p, m, _mm256_set1_ps(TN_LOG_P8));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, m), z);
    y = _mm256_fmadd_ps(e, _mm256_set1_ps(TN_LN2_LO), y);
    y = _mm256_fmadd_ps(z, _mm256_set1_ps(-0.5f), y);
    __m256 r = _mm256_fmadd_ps(e, _mm256_set1_ps(TN_LN2_HI), _mm256_add_ps(m, y));
    /* Special values, in the scalar reference's order of precedence. */
    r = _mm256_blendv_ps(r, x, _mm256_cmp_ps(x, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ));
    r = _mm256_blendv_ps(r, _mm256_set1_ps(-INFINITY), _mm256_cmp_ps(x, zero, _CMP_EQ_OQ));
    r = _mm256_blendv_ps(r, _mm256_set1_ps(NAN), _mm256_cmp_ps(x, zero, _CMP_LT_OQ));
    return _mm256_blendv_ps(r, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* Horizontal sum in a fixed order: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). */
static inline float tn_avx2_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float tn_avx2_hmax(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif
