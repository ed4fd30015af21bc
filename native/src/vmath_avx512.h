/*
 * AVX-512 vector math. Including this header compiles the rest of the file for
 * AVX-512 F/BW/VL/DQ (plus AVX2, FMA, F16C): the "avx512" ISA level. Include it first in
 * every *_avx512.c file. Functions mirror vmath_scalar.h operation for operation, so
 * results are bit-identical to the scalar and AVX2 levels.
 */
#ifndef TN_VMATH_AVX512_H
#define TN_VMATH_AVX512_H

#pragma GCC target("avx,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")

#include <immintrin.h>
#include <stdint.h>

#include "vmath_scalar.h"

#define TN_AVX512_F 16 /* floats per vector */

/* Mask of the first n lanes (n <= 16). */
static inline __mmask16 tn_avx512_tail_mask(size_t n)
{
    return (__mmask16)((1u << n) - 1u);
}

/* 16 BF16 -> 16 FP32 (masked lanes read nothing and give 0). */
static inline __m512 tn_avx512_load_bf16(const uint16_t * p)
{
    __m256i b = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

static inline __m512 tn_avx512_maskz_load_bf16(__mmask16 m, const uint16_t * p)
{
    __m256i b = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

/* 16 FP32 -> 16 BF16, same rounding as tn_f32_to_bf16 (an integer sequence rather than
 * VCVTNEPS2BF16, which flushes denormals). */
static inline __m256i tn_avx512_f32_to_bf16(__m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

static inline void tn_avx512_store_bf16(uint16_t * p, __m512 v)
{
    _mm256_storeu_si256((__m256i *)p, tn_avx512_f32_to_bf16(v));
}

static inline void tn_avx512_mask_store_bf16(uint16_t * p, __mmask16 m, __m512 v)
{
    _mm256_mask_storeu_epi16(p, m, tn_avx512_f32_to_bf16(v));
}

/* exp: tn_exp_f32's operation sequence up to the power of two, which one vscalefps applies
 * with the same single rounding; NaN survives the clamp (min/max with the constant first).
 * Bit-identical to tn_exp_f32 and tn_avx2_exp for every input (checked over all 2^32
 * floats). */
static inline __m512 tn_avx512_exp(__m512 x)
{
    __m512 xs = _mm512_min_ps(_mm512_set1_ps(TN_EXP_MAX), _mm512_max_ps(_mm512_set1_ps(TN_EXP_MIN), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xs, _mm512_set1_ps(TN_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-TN_LN2_HI), xs);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-TN_LN2_LO), r);
    __m512 p = _mm512_set1_ps(TN_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TN_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TN_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TN_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TN_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TN_EXP_P5));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}

/* log: vgetexpps / vgetmantps give the exponent and mantissa (denormals included), the
 * same e and m as tn_log_f32's bit manipulation, exactly; zero, negative, inf and NaN lanes
 * are patched afterwards (only in vectors that hold any). Bit-identical to tn_log_f32 and
 * tn_avx2_log for every input (checked over all 2^32 floats). */
static inline __m512 tn_avx512_log(__m512 x)
{
    __mmask16 special = _mm512_fpclass_ps_mask(x, 0xdf); /* NaN, +-0, +-inf, x < 0 */
    __m512 e0 = _mm512_getexp_ps(x);
    __m512 mm = _mm512_getmant_ps(x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_zero); /* [1, 2) */
    __mmask16 big = _mm512_cmp_ps_mask(mm, _mm512_set1_ps(2.0f * TN_SQRTHF), _CMP_GE_OQ);
    __m512 e = _mm512_mask_add_ps(e0, big, e0, _mm512_set1_ps(1.0f));
    __m512 m = _mm512_sub_ps(_mm512_mask_mul_ps(mm, big, mm, _mm512_set1_ps(0.5f)), _mm512_set1_ps(1.0f));
    __m512 z = _mm512_mul_ps(m, m);
    __m512 p = _mm512_set1_ps(TN_LOG_P0);
    p = _mm512_fmadd_ps(p, m, _mm512_set1_ps(TN_LOG_P1));
    p = _mm512_fmadd_ps(p, m, _mm512_set1_ps(TN_LOG_P2));
    p = _mm512_fmadd_ps(p, m, _mm512_set1_ps(TN_LOG_P3));
    p = _mm512_fmadd_ps(p, m, _mm512_set1_ps(TN_LOG_P4));
    p = _mm512_fmadd_ps(p, m, _mm512_set1_ps(TN_LOG_P5));
    p = _mm512_fmadd_ps(p, m, _mm512_set1_ps(TN_LOG_P6));
    p = _mm512_fmadd_ps(p, m, _mm512_set1_ps(TN_LOG_P7));
    p = _mm512_fmadd_ps(p, m, _mm512_set1_ps(TN_LOG_P8));
    __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, m), z);
    y = _mm512_fmadd_ps(e, _mm512_set1_ps(TN_LN2_LO), y);
    y = _mm512_fmadd_ps(z, _mm512_set1_ps(-0.5f), y);
    __m512 r = _mm512_fmadd_ps(e, _mm512_set1_ps(TN_LN2_HI), _mm512_add_ps(m, y));
    if (special) { /* getexp gives -inf for +-0, +inf for +inf, NaN for NaN */
        r = _mm512_mask_mov_ps(r, special, e0);
        r = _mm512_mask_mov_ps(r, _mm512_fpclass_ps_mask(x, 0x50), _mm512_set1_ps(NAN)); /* x < 0 */
    }
    return r;
}

/* Horizontal sum in the same fixed tree as tn_avx2_hsum applied to (lo256 + hi256). */
static inline float tn_avx512_hsum(__m512 v)
{
    __m256 s = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

static inline float tn_avx512_hmax(__m512 v)
{
    return _mm512_reduce_max_ps(v);
}

/* ---------------------------------------------------------------------------------------
 * Unary math and LRN pow: operation-for-operation copies of the scalar functions (see
 * vmath_scalar.h), bit-identical to them. 8-entry tables are broadcast to both halves of
 * a register, so vpermps may ignore bit 3 of the index.
 * ------------------------------------------------------------------------------------- */

static inline __m512 tn_avx512_abs(__m512 x)
{
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
}

static inline __m512i tn_avx512_sign_bit(__m512 x)
{
    return _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int32_t)0x80000000u));
}

static inline __m512 tn_avx512_lut8(const float * table, __m512i i)
{
    return _mm512_permutexvar_ps(i, _mm512_broadcast_f32x8(_mm256_loadu_ps(table)));
}

/* min(c, |x|); NaN stays NaN (vminps returns its second operand when either is NaN;
 * vrangeps would not do: it drops a quiet NaN). */
static inline __m512 tn_avx512_absmin(__m512 x, float c)
{
    return _mm512_min_ps(_mm512_set1_ps(c), tn_avx512_abs(x));
}

/* |p| with the sign of x (p >= +0 here), in one vpternlogd: bit select. */
static inline __m512 tn_avx512_with_sign(__m512 p, __m512 x)
{
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(p), _mm512_castps_si512(x),
                                                         _mm512_set1_epi32((int32_t)0x80000000u), 0xd8));
}

static inline __m512 tn_avx512_tanh(__m512 x)
{
    __m512 a = tn_avx512_absmin(x, TN_TANH_MAXARG);
    __m512i i = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(a), 23), _mm512_set1_epi32(123));
    i = _mm512_max_epi32(i, _mm512_setzero_si512());
    __m512 t = _mm512_sub_ps(a, tn_avx512_lut8(TN_TANH_MID, i));
    __m512 p = tn_avx512_lut8(TN_TANH_C[8], i);
    for (int k = 7; k >= 0; --k)
        p = _mm512_fmadd_ps(p, t, tn_avx512_lut8(TN_TANH_C[k], i));
    return tn_avx512_with_sign(p, x);
}

static inline __m512 tn_avx512_erf(__m512 x)
{
    __m512 a = tn_avx512_absmin(x, TN_ERF_MAXARG);
    __m512i i = _mm512_cvttps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(2.0f)));
    __m512 t = _mm512_sub_ps(a, tn_avx512_lut8(TN_ERF_MID, i));
    __m512 p = tn_avx512_lut8(TN_ERF_C[6], i);
    for (int k = 5; k >= 0; --k)
        p = _mm512_fmadd_ps(p, t, tn_avx512_lut8(TN_ERF_C[k], i));
    return tn_avx512_with_sign(p, x);
}

static inline __m512 tn_avx512_sincos(__m512 x, int cosine)
{
    __m512i sign = cosine ? _mm512_setzero_si512() : tn_avx512_sign_bit(x);
    __m512 a = tn_avx512_abs(x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(a, _mm512_set1_ps(TN_2_OVER_PI)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-TN_PIO2_1), a);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-TN_PIO2_2), r);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-TN_PIO2_3), r);
    __m512i q = _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(cosine));
    __m512 z = _mm512_mul_ps(r, r);
    __m512 ps = _mm512_set1_ps(TN_SIN_S3);
    ps = _mm512_fmadd_ps(ps, z, _mm512_set1_ps(TN_SIN_S2));
    ps = _mm512_fmadd_ps(ps, z, _mm512_set1_ps(TN_SIN_S1));
    __m512 s = _mm512_fmadd_ps(_mm512_mul_ps(r, z), ps, r);
    __m512 pc = _mm512_set1_ps(TN_COS_C3);
    pc = _mm512_fmadd_ps(pc, z, _mm512_set1_ps(TN_COS_C2));
    pc = _mm512_fmadd_ps(pc, z, _mm512_set1_ps(TN_COS_C1));
    pc = _mm512_fmadd_ps(pc, z, _mm512_set1_ps(-0.5f));
    __m512 c = _mm512_fmadd_ps(pc, z, _mm512_set1_ps(1.0f));
    __m512 y = _mm512_mask_mov_ps(s, _mm512_test_epi32_mask(q, _mm512_set1_epi32(1)), c);
    __m512i flip = _mm512_and_si512(_mm512_slli_epi32(q, 30), _mm512_set1_epi32((int32_t)0x80000000u));
    y = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(y), flip, sign, 0x96)); /* xor3 */
    return _mm512_min_ps(_mm512_set1_ps(1.0f), _mm512_max_ps(_mm512_set1_ps(-1.0f), y));
}

static inline __m512 tn_avx512_sin(__m512 x) { return tn_avx512_sincos(x, 0); }
static inline __m512 tn_avx512_cos(__m512 x) { return tn_avx512_sincos(x, 1); }

/* tn_powpos_f32 on 16 lanes (every lane a positive normal base, |e| <= TN_POW_MAX_EXP).
 * vgetexpps / vgetmantps give k and m; vscalefps applies 2^floor(n) with one rounding.
 * No clamp of y is needed: |y| <= 127 |e| < 2^19 keeps the rounding shift exact, and
 * vscalefps saturates to 0 or inf as the clamped scalar code does. */
static inline __m512 tn_avx512_powpos(__m512 b, __m512 e)
{
    __m512i j = _mm512_srli_epi32(_mm512_castps_si512(b), 20);
    __m512 k = _mm512_getexp_ps(b);
    __m512 m = _mm512_getmant_ps(b, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_zero);
    __m512 r = _mm512_fmadd_ps(m, tn_avx512_lut8(TN_LOG2T_C, j), _mm512_set1_ps(-1.0f));
    __m512 q = _mm512_set1_ps(TN_LOG2T_P3);
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(TN_LOG2T_P2));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(TN_LOG2T_P1));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(TN_LOG2T_P0));
    __m512 l = _mm512_fmadd_ps(r, q, tn_avx512_lut8(TN_LOG2T_T, j));
    __m512 y = _mm512_fmadd_ps(e, k, _mm512_mul_ps(e, l));
    __m512 t8 = _mm512_add_ps(y, _mm512_set1_ps(TN_EXP2T_SHIFT));
    __m512 n = _mm512_sub_ps(t8, _mm512_set1_ps(TN_EXP2T_SHIFT));
    __m512 f = _mm512_sub_ps(y, n);
    __m512i ni = _mm512_castps_si512(t8); /* low 3 bits: 8 n mod 8 */
    __m512 p = _mm512_set1_ps(TN_EXP2T_P3);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(TN_EXP2T_P2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(TN_EXP2T_P1));
    p = _mm512_mul_ps(p, f);
    __m512 t = tn_avx512_lut8(TN_EXP2T_T, ni);
    return _mm512_scalef_ps(_mm512_fmadd_ps(p, t, t), n);
}

/* Lanes where tn_powpos_f32 does not apply: zero, negative, denormal, inf, NaN. */
static inline __mmask16 tn_avx512_pow_slow_lanes(__m512 b)
{
    return _mm512_fpclass_ps_mask(b, 0xff);
}

/* Lanes of p whose base is not a positive normal float get C's powf. Out of line and
 * cold, so the call and its register spills stay out of the callers' loops. */
static __attribute__((noinline, cold)) __m512 tn_avx512_pow_fix(__m512 b, __m512 p, __mmask16 slow, float e)
{
    float bb[16], pp[16];
    _mm512_storeu_ps(bb, b);
    _mm512_storeu_ps(pp, p);
    for (int l = 0; l < 16; ++l)
        if (slow & (1 << l))
            pp[l] = powf(bb[l], e);
    return _mm512_loadu_ps(pp);
}

/* tn_pow_f32 on 16 lanes for an exponent with |e| <= TN_POW_MAX_EXP (callers route
 * larger or non-finite exponents to the scalar code); ev = e in every lane. */
static inline __m512 tn_avx512_pow(__m512 b, __m512 ev, float e)
{
    __m512 p = tn_avx512_powpos(b, ev);
    __mmask16 slow = tn_avx512_pow_slow_lanes(b);
    if (__builtin_expect(slow != 0, 0))
        p = tn_avx512_pow_fix(b, p, slow, e);
    return p;
}

#endif
