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

static inline __m256 tn_avx2_log_general(__m256 x)
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

/* log: vectors of positive normal floats take tn_log_f32's operation sequence without the
 * denormal and special-value handling; other vectors go through tn_avx2_log_general.
 * Bit-identical to tn_log_f32 for every input. */
static inline __m256 tn_avx2_log(__m256 x)
{
    __m256 normal = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(FLT_MIN), _CMP_GE_OQ),
                                  _mm256_cmp_ps(x, _mm256_set1_ps(FLT_MAX), _CMP_LE_OQ));
    if (__builtin_expect(_mm256_movemask_ps(normal) != 0xff, 0))
        return tn_avx2_log_general(x);
    __m256i u = _mm256_castps_si256(x);
    __m256 e = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(u, 23), _mm256_set1_epi32(126)));
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
    return _mm256_fmadd_ps(e, _mm256_set1_ps(TN_LN2_HI), _mm256_add_ps(m, y));
}

/* exp: tn_exp_f32's operation sequence, with a NaN-preserving clamp (constant first in
 * min/max) instead of a final NaN blend. Bit-identical to tn_exp_f32 for every input. */
static inline __m256 tn_avx2_exp(__m256 x)
{
    __m256 xs = _mm256_min_ps(_mm256_set1_ps(TN_EXP_MAX), _mm256_max_ps(_mm256_set1_ps(TN_EXP_MIN), x));
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
    return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(j2, bias), 23)));
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

/* ---------------------------------------------------------------------------------------
 * Unary math and LRN pow: operation-for-operation copies of the scalar functions (see
 * vmath_scalar.h), bit-identical to them. 8-entry tables are looked up with vpermps.
 * ------------------------------------------------------------------------------------- */

static inline __m256 tn_avx2_abs(__m256 x)
{
    return _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}

static inline __m256 tn_avx2_sign_bit(__m256 x)
{
    return _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32((int32_t)0x80000000u)));
}

static inline __m256 tn_avx2_lut8(const float * table, __m256i i)
{
    return _mm256_permutevar8x32_ps(_mm256_loadu_ps(table), i);
}

static inline __m256 tn_avx2_tanh(__m256 x)
{
    __m256 sign = tn_avx2_sign_bit(x);
    __m256 a = _mm256_min_ps(_mm256_set1_ps(TN_TANH_MAXARG), tn_avx2_abs(x));
    __m256i i = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(a), 23), _mm256_set1_epi32(123));
    i = _mm256_max_epi32(i, _mm256_setzero_si256());
    __m256 t = _mm256_sub_ps(a, tn_avx2_lut8(TN_TANH_MID, i));
    __m256 p = tn_avx2_lut8(TN_TANH_C[8], i);
    for (int k = 7; k >= 0; --k)
        p = _mm256_fmadd_ps(p, t, tn_avx2_lut8(TN_TANH_C[k], i));
    return _mm256_or_ps(p, sign);
}

static inline __m256 tn_avx2_erf(__m256 x)
{
    __m256 sign = tn_avx2_sign_bit(x);
    __m256 a = _mm256_min_ps(_mm256_set1_ps(TN_ERF_MAXARG), tn_avx2_abs(x));
    __m256i i = _mm256_cvttps_epi32(_mm256_mul_ps(a, _mm256_set1_ps(2.0f)));
    __m256 t = _mm256_sub_ps(a, tn_avx2_lut8(TN_ERF_MID, i));
    __m256 p = tn_avx2_lut8(TN_ERF_C[6], i);
    for (int k = 5; k >= 0; --k)
        p = _mm256_fmadd_ps(p, t, tn_avx2_lut8(TN_ERF_C[k], i));
    return _mm256_or_ps(p, sign);
}

static inline __m256 tn_avx2_sincos(__m256 x, int cosine)
{
    __m256 sign = cosine ? _mm256_setzero_ps() : tn_avx2_sign_bit(x);
    __m256 a = tn_avx2_abs(x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(a, _mm256_set1_ps(TN_2_OVER_PI)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-TN_PIO2_1), a);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-TN_PIO2_2), r);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-TN_PIO2_3), r);
    __m256i q = _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(cosine));
    __m256 z = _mm256_mul_ps(r, r);
    __m256 ps = _mm256_set1_ps(TN_SIN_S3);
    ps = _mm256_fmadd_ps(ps, z, _mm256_set1_ps(TN_SIN_S2));
    ps = _mm256_fmadd_ps(ps, z, _mm256_set1_ps(TN_SIN_S1));
    __m256 s = _mm256_fmadd_ps(_mm256_mul_ps(r, z), ps, r);
    __m256 pc = _mm256_set1_ps(TN_COS_C3);
    pc = _mm256_fmadd_ps(pc, z, _mm256_set1_ps(TN_COS_C2));
    pc = _mm256_fmadd_ps(pc, z, _mm256_set1_ps(TN_COS_C1));
    pc = _mm256_fmadd_ps(pc, z, _mm256_set1_ps(-0.5f));
    __m256 c = _mm256_fmadd_ps(pc, z, _mm256_set1_ps(1.0f));
    __m256 y = _mm256_blendv_ps(s, c, _mm256_castsi256_ps(_mm256_slli_epi32(q, 31)));
    __m256 flip = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(q, 30), _mm256_set1_epi32((int32_t)0x80000000u)));
    y = _mm256_xor_ps(_mm256_xor_ps(y, flip), sign);
    return _mm256_min_ps(_mm256_set1_ps(1.0f), _mm256_max_ps(_mm256_set1_ps(-1.0f), y));
}

static inline __m256 tn_avx2_sin(__m256 x) { return tn_avx2_sincos(x, 0); }
static inline __m256 tn_avx2_cos(__m256 x) { return tn_avx2_sincos(x, 1); }

/* tn_powpos_f32 on 8 lanes (every lane a positive normal base, |e| <= TN_POW_MAX_EXP). */
static inline __m256 tn_avx2_powpos(__m256 b, __m256 e)
{
    __m256i u = _mm256_castps_si256(b);
    __m256i j = _mm256_srli_epi32(u, 20); /* vpermps reads the low 3 bits */
    __m256 k = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(u, 23), _mm256_set1_epi32(127)));
    __m256 m = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(u, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x3f800000)));
    __m256 r = _mm256_fmadd_ps(m, tn_avx2_lut8(TN_LOG2T_C, j), _mm256_set1_ps(-1.0f));
    __m256 q = _mm256_set1_ps(TN_LOG2T_P3);
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(TN_LOG2T_P2));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(TN_LOG2T_P1));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(TN_LOG2T_P0));
    __m256 l = _mm256_fmadd_ps(r, q, tn_avx2_lut8(TN_LOG2T_T, j));
    __m256 y = _mm256_fmadd_ps(e, k, _mm256_mul_ps(e, l));
    y = _mm256_min_ps(_mm256_max_ps(y, _mm256_set1_ps(-200.0f)), _mm256_set1_ps(200.0f));
    __m256 t8 = _mm256_add_ps(y, _mm256_set1_ps(TN_EXP2T_SHIFT));
    __m256 f = _mm256_sub_ps(y, _mm256_sub_ps(t8, _mm256_set1_ps(TN_EXP2T_SHIFT)));
    __m256i ni = _mm256_sub_epi32(_mm256_castps_si256(t8), _mm256_castps_si256(_mm256_set1_ps(TN_EXP2T_SHIFT)));
    __m256 p = _mm256_set1_ps(TN_EXP2T_P3);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(TN_EXP2T_P2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(TN_EXP2T_P1));
    p = _mm256_mul_ps(p, f);
    __m256 t = tn_avx2_lut8(TN_EXP2T_T, ni);
    p = _mm256_fmadd_ps(p, t, t);
    __m256i h = _mm256_srai_epi32(ni, 3);
    __m256i h1 = _mm256_srai_epi32(h, 1);
    __m256i h2 = _mm256_sub_epi32(h, h1);
    __m256i bias = _mm256_set1_epi32(127);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h1, bias), 23)));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h2, bias), 23)));
}

/* Lanes where tn_powpos_f32 does not apply (tn_pow_fast_base false), as a movemask. */
static inline int tn_avx2_pow_slow_lanes(__m256 b)
{
    __m256 ok = _mm256_and_ps(_mm256_cmp_ps(b, _mm256_set1_ps(FLT_MIN), _CMP_GE_OQ),
                              _mm256_cmp_ps(b, _mm256_set1_ps(FLT_MAX), _CMP_LE_OQ));
    return _mm256_movemask_ps(ok) ^ 0xff;
}

/* Lanes of p whose base is not a positive normal float get C's powf. Out of line and
 * cold, so the call and its register spills stay out of the callers' loops. */
static __attribute__((noinline, cold)) __m256 tn_avx2_pow_fix(__m256 b, __m256 p, int slow, float e)
{
    float bb[8], pp[8];
    _mm256_storeu_ps(bb, b);
    _mm256_storeu_ps(pp, p);
    for (int l = 0; l < 8; ++l)
        if (slow & (1 << l))
            pp[l] = powf(bb[l], e);
    return _mm256_loadu_ps(pp);
}

/* tn_pow_f32 on 8 lanes for an exponent with |e| <= TN_POW_MAX_EXP (callers route
 * larger or non-finite exponents to the scalar code); ev = e in every lane. */
static inline __m256 tn_avx2_pow(__m256 b, __m256 ev, float e)
{
    __m256 p = tn_avx2_powpos(b, ev);
    int slow = tn_avx2_pow_slow_lanes(b);
    if (__builtin_expect(slow != 0, 0))
        p = tn_avx2_pow_fix(b, p, slow, e);
    return p;
}

#endif
