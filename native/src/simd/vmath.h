/*
 * Vector math written once against the layer (include simd/avx512.h or simd/avx2.h first):
 * exp, log, tanh, erf, sin, cos and LRN's pow on 16 lanes. Each function repeats its
 * scalar reference in vmath_scalar.h operation for operation (same constants, same FMAs,
 * same rounding), so all three levels return bit-identical results; docs/kernels.md gives
 * the accuracy bounds.
 */
#ifndef TN_SIMD_VMATH_H
#define TN_SIMD_VMATH_H

#include "vmath_scalar.h"

/* exp(x), as tn_exp_f32, from x already clamped to [TN_EXP_MIN, TN_EXP_MAX] (NaN kept):
 * y = exp(r) in [0.7, 1.42] and n, exp(x) = y * 2^n. */
V_INLINE vfloat v_exp_reduced_(vfloat xs, vfloat * n)
{
    *n = v_round(v_mul(xs, v_set1(TN_LOG2E)));
    vfloat r = v_fma(*n, v_set1(-TN_LN2_HI), xs);
    r = v_fma(*n, v_set1(-TN_LN2_LO), r);
    vfloat p = v_set1(TN_EXP_P0);
    p = v_fma(p, r, v_set1(TN_EXP_P1));
    p = v_fma(p, r, v_set1(TN_EXP_P2));
    p = v_fma(p, r, v_set1(TN_EXP_P3));
    p = v_fma(p, r, v_set1(TN_EXP_P4));
    p = v_fma(p, r, v_set1(TN_EXP_P5));
    return v_add(v_fma(p, v_mul(r, r), r), v_set1(1.0f));
}

/* y * 2^n without producing a denormal in any instruction (they are slow on AVX2): vectors
 * with a result below 2^-125 (n <= -126) or a NaN make the small ones as tn_exp_tiny_f32
 * does, as integers; the others add n to y's exponent field (exact: normal or
 * overflowing). */
V_INLINE vfloat v_exp_scale_(vfloat y, vfloat n)
{
    vmask normal = v_gt(n, v_set1((float)TN_EXP_TINY_N)); /* false for NaN */
    if (__builtin_expect(!m_all(normal), 0)) {
        vmask tiny = v_le(n, v_set1((float)TN_EXP_TINY_N));
        vfloat res = v_ldexp(y, v_max(n, v_set1((float)TN_EXP_TINY_N + 1.0f)));
        vfloat s = v_ldexp(y, v_add(v_min(n, v_set1((float)TN_EXP_TINY_N)), v_set1(149.0f)));
        return v_select(tiny, vi_as_float(v_to_int_round(s)), res);
    }
    return v_ldexp_normal(y, n);
}

/* exp(x), as tn_exp_f32: NaN survives the clamp (min/max with the constant first), the
 * power of two is applied with one rounding. AVX-512's vscalefps does that at full speed,
 * denormal results included (measured fastest for unary exp); AVX2 takes v_exp_scale_.
 * Same bits either way. */
V_INLINE vfloat v_exp(vfloat x)
{
    vfloat n, y = v_exp_reduced_(v_min(v_set1(TN_EXP_MAX), v_max(v_set1(TN_EXP_MIN), x)), &n);
    return V_SLOW_DENORMALS ? v_exp_scale_(y, n) : v_ldexp(y, n);
}

/* exp(x) for x <= 0 or NaN, such as x minus the max of its row (softmax): the bits of
 * v_exp on that domain without the void clamp to TN_EXP_MAX, and through v_exp_scale_ at
 * every level (inside softmax's loops that measured twice as fast as vscalefps). */
V_INLINE vfloat v_exp_nonpos(vfloat x)
{
    vfloat n, y = v_exp_reduced_(v_max(v_set1(TN_EXP_MIN), x), &n);
    return v_exp_scale_(y, n);
}

/* tn_log_core_f32 on 16 lanes: the table lookups are one permute each (AVX2: two and a
 * blend). */
V_INLINE vfloat v_log_core_(vfloat x, vfloat kadj, int adjust)
{
    vint u = v_as_int(x);
    vint t = vi_sub(u, vi_set1((int32_t)TN_LOG_OFF));
    vfloat k = vi_to_float(vi_sra(t, 23));
    if (adjust)
        k = v_add(k, kadj);
    vfloat z = vi_as_float(vi_sub(u, vi_and(t, vi_set1((int32_t)0xff800000u))));
    vint i = vi_srl(t, 19); /* v_permute reads its low 4 bits */
    vfloat r = v_fma(z, v_permute(v_load(TN_LOG_C), i), v_set1(-1.0f));
    vfloat hi = v_fma(k, v_set1(TN_LN2), v_permute(v_load(TN_LOG_L), i));
    vfloat q = v_fma(v_set1(TN_LOG_Q2), r, v_set1(TN_LOG_Q1));
    q = v_fma(q, r, v_set1(TN_LOG_Q0));
    return v_add(hi, v_fma(v_mul(r, r), q, r));
}

/* The vectors of v_log that hold denormal, zero, negative, inf or NaN lanes: denormals
 * are scaled by 2^23, the others patched. Out of line and cold, so that the common path
 * keeps its registers. */
static __attribute__((noinline, cold)) vfloat v_log_special_(vfloat x)
{
    vmask tiny = v_lt(x, v_set1(FLT_MIN));
    vfloat xs = v_select(tiny, v_mul(x, v_set1(8388608.0f)), x);
    vfloat r = v_log_core_(xs, v_keep(tiny, v_set1(-23.0f)), 1);
    r = v_select(v_eq(x, v_set1(INFINITY)), x, r);
    r = v_select(v_eq(x, v_zero()), v_set1(-INFINITY), r);
    r = v_select(v_lt(x, v_zero()), v_set1(NAN), r);
    return v_select(v_isnan(x), v_add(x, x), r);
}

/* log(x), as tn_log_f32. */
V_INLINE vfloat v_log(vfloat x)
{
    vfloat r = v_log_core_(x, v_zero(), 0);
    if (__builtin_expect(m_any(v_not_positive_normal(x)), 0))
        r = v_log_special_(x);
    return r;
}

/* min(c, |x|); NaN stays NaN (x86 min returns its second operand when either is NaN). */
V_INLINE vfloat v_absmin_(vfloat x, float c) { return v_min(v_set1(c), v_abs(x)); }

/* p (sign bit clear) with the sign of x: an OR, as the scalar references do it (one
 * operation fewer than a bit select on AVX2). */
V_INLINE vfloat v_with_sign_(vfloat p, vfloat x)
{
    return vi_as_float(vi_or(v_as_int(p), vi_and(v_as_int(x), vi_set1((int32_t)0x80000000u))));
}

V_INLINE vfloat v_tanh(vfloat x)
{
    vfloat a = v_absmin_(x, TN_TANH_MAXARG);
    vint i = vi_max(vi_sub(vi_srl(v_as_int(a), 23), vi_set1(123)), vi_zero());
    vfloat t = v_sub(a, v_lut8(TN_TANH_MID, i));
    vfloat p = v_lut8(TN_TANH_C[8], i);
    for (int k = 7; k >= 0; --k)
        p = v_fma(p, t, v_lut8(TN_TANH_C[k], i));
    return v_with_sign_(p, x);
}

V_INLINE vfloat v_erf(vfloat x)
{
    vfloat a = v_absmin_(x, TN_ERF_MAXARG);
    vfloat s = v_fma(a, v_set1(2.0f), v_set1(TN_ERF_SHIFT));
    vint i = v_as_int(s); /* v_lut8 reads its low 3 bits: round(2a) */
    vfloat t = v_fma(v_sub(s, v_set1(TN_ERF_SHIFT)), v_set1(-0.5f), a);
    vfloat p = v_lut8(TN_ERF_C[5], i);
    for (int k = 4; k >= 0; --k)
        p = v_fma(p, t, v_lut8(TN_ERF_C[k], i));
    return v_with_sign_(p, x);
}

/* Lanes of a above TN_SINCOS_BIG get (r, q) from the scalar exact reduction: the same
 * integer code as the scalar level, so the same bits. Out of line and cold: large
 * arguments are rare, and the common path keeps its registers. */
static __attribute__((noinline, cold)) void v_sincos_big_(const vfloat * a, vmask big, vfloat * r, vint * q)
{
    float aa[16], rr[16];
    int32_t qq[16];
    unsigned bits = m_bits(big);
    v_store(aa, *a);
    v_store(rr, *r);
    vi_store(qq, *q);
    for (int l = 0; l < 16; ++l)
        if (bits & (1u << l))
            rr[l] = tn_pio2_reduce_big(aa[l], &qq[l]);
    *r = v_load(rr);
    *q = vi_load(qq);
}

V_INLINE vfloat v_sincos(vfloat x, int cosine)
{
    vint sign = cosine ? vi_zero() : vi_and(v_as_int(x), vi_set1((int32_t)0x80000000u));
    vfloat a = v_abs(x);
    vfloat n = v_round(v_mul(a, v_set1(TN_2_OVER_PI)));
    vfloat r = v_fma(n, v_set1(-TN_PIO2_1), a);
    r = v_fma(n, v_set1(-TN_PIO2_2), r);
    r = v_fma(n, v_set1(-TN_PIO2_3), r);
    vint q = v_to_int_trunc(n);
    vmask big = v_gt(a, v_set1(TN_SINCOS_BIG));
    if (__builtin_expect(m_any(big), 0))
        v_sincos_big_(&a, big, &r, &q);
    q = vi_add(q, vi_set1(cosine));
    vfloat z = v_mul(r, r);
    vfloat ps = v_set1(TN_SIN_S3);
    ps = v_fma(ps, z, v_set1(TN_SIN_S2));
    ps = v_fma(ps, z, v_set1(TN_SIN_S1));
    vfloat s = v_fma(v_mul(r, z), ps, r);
    vfloat pc = v_set1(TN_COS_C3);
    pc = v_fma(pc, z, v_set1(TN_COS_C2));
    pc = v_fma(pc, z, v_set1(TN_COS_C1));
    pc = v_fma(pc, z, v_set1(-0.5f));
    vfloat c = v_fma(pc, z, v_set1(1.0f));
    vfloat y = v_select(vi_test(q, vi_set1(1)), c, s);
    vint flip = vi_and(vi_sll(q, 30), vi_set1((int32_t)0x80000000u));
    y = vi_as_float(vi_xor(v_as_int(y), vi_xor(flip, sign)));
    return v_min(v_set1(1.0f), v_max(v_set1(-1.0f), y));
}

V_INLINE vfloat v_sin(vfloat x) { return v_sincos(x, 0); }
V_INLINE vfloat v_cos(vfloat x) { return v_sincos(x, 1); }

/* tn_powpos_f32 on 16 lanes: every lane a positive normal base, |e| <= TN_POW_MAX_EXP. */
V_INLINE vfloat v_powpos(vfloat b, vfloat e)
{
    vint j = vi_srl(v_as_int(b), 20); /* v_lut8 uses its low 3 bits: the top mantissa bits */
    vfloat k;
    vfloat m = v_frexp_normal(b, &k);
    vfloat r = v_fma(m, v_lut8(TN_LOG2T_C, j), v_set1(-1.0f));
    vfloat q = v_set1(TN_LOG2T_P3);
    q = v_fma(q, r, v_set1(TN_LOG2T_P2));
    q = v_fma(q, r, v_set1(TN_LOG2T_P1));
    q = v_fma(q, r, v_set1(TN_LOG2T_P0));
    vfloat l = v_fma(r, q, v_lut8(TN_LOG2T_T, j));
    vfloat y = v_fma(e, k, v_mul(e, l));
    /* |y| <= 127 |e| < 2^19 keeps the shift below exact without tn_powpos_f32's clamp of y
     * to [-200, 200]: beyond it both give 0 or inf (v_scale_floor). */
    vfloat t8 = v_add(y, v_set1(TN_EXP2T_SHIFT));
    vfloat n = v_sub(t8, v_set1(TN_EXP2T_SHIFT)); /* y rounded to a multiple of 1/8 */
    vfloat f = v_sub(y, n);
    vint ni = v_as_int(t8); /* low 3 bits: 8 n mod 8 */
    vfloat p = v_set1(TN_EXP2T_P3);
    p = v_fma(p, f, v_set1(TN_EXP2T_P2));
    p = v_fma(p, f, v_set1(TN_EXP2T_P1));
    p = v_mul(p, f);
    vfloat t = v_lut8(TN_EXP2T_T, ni);
    return v_scale_floor(v_fma(p, t, t), n);
}

/* Lanes where v_powpos does not apply: zero, negative, denormal, inf, NaN. */
V_INLINE vmask v_pow_slow_lanes(vfloat b) { return v_not_positive_normal(b); }

/* Lanes of p whose base is not a positive normal float get C's powf. Out of line and cold,
 * so the call and its spills stay out of the callers' loops. */
static __attribute__((noinline, cold)) vfloat v_pow_fix_(vfloat b, vfloat p, vmask slow, float e)
{
    float bb[16], pp[16];
    unsigned bits = m_bits(slow);
    v_store(bb, b);
    v_store(pp, p);
    for (int l = 0; l < 16; ++l)
        if (bits & (1u << l))
            pp[l] = powf(bb[l], e);
    return v_load(pp);
}

/* tn_pow_f32 on 16 lanes for an exponent with |e| <= TN_POW_MAX_EXP (callers route larger
 * or non-finite exponents to the scalar code); ev = e in every lane. */
V_INLINE vfloat v_pow(vfloat b, vfloat ev, float e)
{
    vfloat p = v_powpos(b, ev);
    vmask slow = v_pow_slow_lanes(b);
    if (__builtin_expect(m_any(slow), 0))
        p = v_pow_fix_(b, p, slow, e);
    return p;
}

#endif
