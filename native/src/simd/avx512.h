/*
 * The vector layer at the AVX-512 level (F, BW, VL, DQ, with AVX2, FMA and F16C).
 *
 * A kernel family's vector code is written once, against this interface, in
 * <family>/<family>_simd.h, and compiled once per level: <family>/avx512.c includes this
 * header and then that source, <family>/avx2.c does the same with simd/avx2.h. The
 * interface, its semantics and the rules that keep every level bit-identical are described
 * in simd/README.md. Including this header compiles the rest of the file for AVX-512.
 */
#ifndef TN_SIMD_LEVEL_H
#define TN_SIMD_LEVEL_H

#pragma GCC target("avx,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "tensorops.h"
#include "vmath_scalar.h"

#define TN_ISA(Name) tn_avx512_##Name
#define TN_ISA_NAME "avx512"
#define TN_LANES 16

typedef __m512 vfloat;
typedef __m512i vint;
typedef __mmask16 vmask;

#define V_INLINE static inline __attribute__((always_inline))

/* ---- Lane masks -------------------------------------------------------------------- */

/* The first min(n, 16) lanes. */
V_INLINE vmask m_first(size_t n) { return n >= 16 ? (vmask)0xffff : (vmask)((1u << n) - 1u); }
V_INLINE vmask m_and(vmask a, vmask b) { return (vmask)(a & b); }
V_INLINE vmask m_or(vmask a, vmask b) { return (vmask)(a | b); }
V_INLINE vmask m_andnot(vmask a, vmask b) { return (vmask)(~a & b); } /* b and not a */
V_INLINE vmask m_not(vmask a) { return (vmask)~a; }
V_INLINE int m_any(vmask a) { return a != 0; }
V_INLINE int m_all(vmask a) { return a == 0xffff; }
/* Bit l set when lane l is. */
V_INLINE unsigned m_bits(vmask a) { return a; }

/* ---- Floats: memory ------------------------------------------------------------------ */

V_INLINE vfloat v_load(const float * p) { return _mm512_loadu_ps(p); }
V_INLINE vfloat v_load_aligned(const float * p) { return _mm512_load_ps(p); } /* 64-byte aligned */
V_INLINE void v_store(float * p, vfloat v) { _mm512_storeu_ps(p, v); }
V_INLINE void v_store_aligned(float * p, vfloat v) { _mm512_store_ps(p, v); }
/* Non-temporal store of a 64-byte aligned block; end the stream with v_stream_fence(). */
V_INLINE void v_stream(float * p, vfloat v) { _mm512_stream_ps(p, v); }
V_INLINE void v_stream_fence(void) { _mm_sfence(); }
/* The first min(n, 16) floats; the other lanes read as +0 and their memory is not touched. */
V_INLINE vfloat v_load_n(const float * p, size_t n)
{
    return n >= 16 ? v_load(p) : _mm512_maskz_loadu_ps(m_first(n), p);
}
V_INLINE void v_store_n(float * p, vfloat v, size_t n)
{
    if (n >= 16)
        v_store(p, v);
    else
        _mm512_mask_storeu_ps(p, m_first(n), v);
}
/* Lanes in m only (others +0 / unwritten). */
V_INLINE vfloat v_load_mask(const float * p, vmask m) { return _mm512_maskz_loadu_ps(m, p); }
V_INLINE void v_store_mask(float * p, vfloat v, vmask m) { _mm512_mask_storeu_ps(p, m, v); }

/* BF16 <-> FP32: loading is exact (one VPERMW with a zeroing mask puts value i in the high
 * half of lane i: one op where zero-extend and shift took two); storing rounds as
 * tn_f32_to_bf16 (nearest even, NaN kept quiet with its sign, denormals kept). */
V_INLINE vfloat v_bf16_bits_to_f32(__m256i b)
{
    const __m512i idx = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7, 0, 6, 0, 5, 0, 4, 0,
                                         3, 0, 2, 0, 1, 0, 0, 0);
    return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xaaaaaaaau, idx, _mm512_castsi256_si512(b)));
}
V_INLINE vfloat v_load_bf16(const uint16_t * p) { return v_bf16_bits_to_f32(_mm256_loadu_si256((const __m256i *)p)); }
V_INLINE vfloat v_load_bf16_n(const uint16_t * p, size_t n)
{
    return n >= 16 ? v_load_bf16(p) : v_bf16_bits_to_f32(_mm256_maskz_loadu_epi16(m_first(n), p));
}
V_INLINE __m256i v_f32_to_bf16_bits(vfloat v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}
V_INLINE void v_store_bf16(uint16_t * p, vfloat v) { _mm256_storeu_si256((__m256i *)p, v_f32_to_bf16_bits(v)); }
V_INLINE void v_store_bf16_n(uint16_t * p, vfloat v, size_t n)
{
    if (n >= 16)
        v_store_bf16(p, v);
    else
        _mm256_mask_storeu_epi16(p, m_first(n), v_f32_to_bf16_bits(v));
}

/* The BF16 store of a full vector on CPUs with AVX512_BF16: hw = v_hw_bf16(), read once per
 * call. One VCVTNEPS2BF16 rounds exactly as v_store_bf16 (nearest even, NaN made quiet with
 * its sign: checked over all 2^32 inputs) except that it flushes denormal inputs, so vectors
 * with a denormal lane take v_store_bf16. Inline assembly, so that the instruction needs no
 * compiler flag and is only reached when hw is set. */
V_INLINE __m256i v_bf16_hw_bits_(vfloat v)
{
    __m256i r;
    __asm__("vcvtneps2bf16 %1, %0" : "=v"(r) : "v"(v));
    return r;
}
V_INLINE int v_hw_bf16(void) { return (TnCpuFeatures() & TnCpuAvx512bf16) != 0; }
/* v_store_bf16_hw for vectors the caller knows hold no denormal lane (among the first n for
 * _n): the per-vector check is skipped. */
V_INLINE void v_store_bf16_hw_normal(uint16_t * p, vfloat v, int hw)
{
    if (hw)
        _mm256_storeu_si256((__m256i *)p, v_bf16_hw_bits_(v));
    else
        v_store_bf16(p, v);
}
V_INLINE void v_store_bf16_hw(uint16_t * p, vfloat v, int hw)
{
    v_store_bf16_hw_normal(p, v, hw && !_mm512_fpclass_ps_mask(v, 0x20)); /* 0x20: denormal */
}
V_INLINE void v_store_bf16_hw_normal_n(uint16_t * p, vfloat v, size_t n, int hw)
{
    if (hw)
        _mm256_mask_storeu_epi16(p, m_first(n), v_bf16_hw_bits_(v));
    else
        v_store_bf16_n(p, v, n);
}
/* Two vectors as 32 BF16 values at p (a first): one VCVTNE2PS2BF16 and one 64-byte store
 * (1.5 fewer cycles per 32 values than two v_store_bf16_hw on Zen 4). A normal input never
 * rounds to a +-0 word, and a flushed denormal always does, so a +-0 word in the result
 * (a +-0 or denormal input) sends both vectors to v_store_bf16: same bits, and the check is
 * one word test instead of a denormal class test per vector. */
V_INLINE void v_store2_bf16_hw(uint16_t * p, vfloat a, vfloat b, int hw)
{
    if (hw) {
        __m512i r;
        __asm__("vcvtne2ps2bf16 %2, %1, %0" : "=v"(r) : "v"(b), "v"(a)); /* a in the low half */
        if (!_mm512_testn_epi16_mask(r, _mm512_set1_epi16(0x7fff))) {
            _mm512_storeu_si512(p, r);
            return;
        }
    }
    v_store_bf16(p, a);
    v_store_bf16(p + 16, b);
}

/* FP16 <-> FP32 (IEEE half): loading is exact; storing rounds to nearest even. */
V_INLINE vfloat v_load_f16(const uint16_t * p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
V_INLINE vfloat v_load_f16_n(const uint16_t * p, size_t n)
{
    return n >= 16 ? v_load_f16(p) : _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m_first(n), p));
}
V_INLINE void v_store_f16(uint16_t * p, vfloat v)
{
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
V_INLINE void v_store_f16_n(uint16_t * p, vfloat v, size_t n)
{
    if (n >= 16)
        v_store_f16(p, v);
    else
        _mm256_mask_storeu_epi16(p, m_first(n), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* ---- Floats: arithmetic (IEEE single, one rounding each; fma rounds once) ----------- */

V_INLINE vfloat v_set1(float f) { return _mm512_set1_ps(f); }
V_INLINE vfloat v_zero(void) { return _mm512_setzero_ps(); }
V_INLINE vfloat v_add(vfloat a, vfloat b) { return _mm512_add_ps(a, b); }
V_INLINE vfloat v_sub(vfloat a, vfloat b) { return _mm512_sub_ps(a, b); }
V_INLINE vfloat v_mul(vfloat a, vfloat b) { return _mm512_mul_ps(a, b); }
V_INLINE vfloat v_div(vfloat a, vfloat b) { return _mm512_div_ps(a, b); }
V_INLINE vfloat v_fma(vfloat a, vfloat b, vfloat c) { return _mm512_fmadd_ps(a, b, c); }   /* a*b + c */
V_INLINE vfloat v_fms(vfloat a, vfloat b, vfloat c) { return _mm512_fmsub_ps(a, b, c); }   /* a*b - c */
V_INLINE vfloat v_fnma(vfloat a, vfloat b, vfloat c) { return _mm512_fnmadd_ps(a, b, c); } /* c - a*b */
/* x86 min/max: the second operand when either is NaN (tn_minps_f32 / tn_maxps_f32). */
V_INLINE vfloat v_min(vfloat a, vfloat b) { return _mm512_min_ps(a, b); }
V_INLINE vfloat v_max(vfloat a, vfloat b) { return _mm512_max_ps(a, b); }
V_INLINE vfloat v_sqrt(vfloat a) { return _mm512_sqrt_ps(a); }
V_INLINE vfloat v_and(vfloat a, vfloat b) { return _mm512_and_ps(a, b); }
V_INLINE vfloat v_or(vfloat a, vfloat b) { return _mm512_or_ps(a, b); }
V_INLINE vfloat v_xor(vfloat a, vfloat b) { return _mm512_xor_ps(a, b); }
V_INLINE vfloat v_andnot(vfloat a, vfloat b) { return _mm512_andnot_ps(a, b); } /* ~a & b */
V_INLINE vfloat v_abs(vfloat a)
{
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7fffffff)));
}
V_INLINE vfloat v_neg(vfloat a)
{
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32((int32_t)0x80000000u)));
}
/* Rounding to an integral float: nearest even, down, up, toward zero. */
V_INLINE vfloat v_round(vfloat a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
V_INLINE vfloat v_floor(vfloat a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
V_INLINE vfloat v_ceil(vfloat a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC); }
/* y * 2^n for integral n in [-252, 254], rounded once (denormal results included). */
V_INLINE vfloat v_ldexp(vfloat y, vfloat n) { return _mm512_scalef_ps(y, n); }

/* x = m * 2^e with m in [1, 2), exact, for positive finite x (denormals included); *e gets
 * e as a float. Other lanes: unspecified (callers patch them). */
V_INLINE vfloat v_frexp(vfloat x, vfloat * e)
{
    *e = _mm512_getexp_ps(x);
    return _mm512_getmant_ps(x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_zero);
}

/* y * 2^floor(n) for y in [0.5, 2), rounded once; far outside the float range it gives 0
 * or inf (one vscalefps, which floors n itself). */
V_INLINE vfloat v_scale_floor(vfloat y, vfloat n) { return _mm512_scalef_ps(y, n); }

/* ---- Floats: compare and select ------------------------------------------------------ */

V_INLINE vmask v_lt(vfloat a, vfloat b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
V_INLINE vmask v_le(vfloat a, vfloat b) { return _mm512_cmp_ps_mask(a, b, _CMP_LE_OQ); }
V_INLINE vmask v_gt(vfloat a, vfloat b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
V_INLINE vmask v_ge(vfloat a, vfloat b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
V_INLINE vmask v_eq(vfloat a, vfloat b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
V_INLINE vmask v_isnan(vfloat a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
/* m ? a : b, lane by lane. */
V_INLINE vfloat v_select(vmask m, vfloat a, vfloat b) { return _mm512_mask_blend_ps(m, b, a); }
/* a in the lanes of m, +0 elsewhere. */
V_INLINE vfloat v_keep(vmask m, vfloat a) { return _mm512_maskz_mov_ps(m, a); }

/* ---- Reductions: one fixed tree on every level (simd/hreduce.h) --------------------- */

#define V_HALF8_(op256) op256(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1))
#include "simd/hreduce.h"

/* ---- 32-bit integers ----------------------------------------------------------------- */

V_INLINE vint vi_set1(int32_t i) { return _mm512_set1_epi32(i); }
V_INLINE vint vi_zero(void) { return _mm512_setzero_si512(); }
V_INLINE vint vi_load(const int32_t * p) { return _mm512_loadu_si512(p); }
V_INLINE void vi_store(int32_t * p, vint v) { _mm512_storeu_si512(p, v); }
V_INLINE vint vi_add(vint a, vint b) { return _mm512_add_epi32(a, b); }
V_INLINE vint vi_sub(vint a, vint b) { return _mm512_sub_epi32(a, b); }
V_INLINE vint vi_mul(vint a, vint b) { return _mm512_mullo_epi32(a, b); } /* low 32 bits */
V_INLINE vint vi_and(vint a, vint b) { return _mm512_and_si512(a, b); }
V_INLINE vint vi_or(vint a, vint b) { return _mm512_or_si512(a, b); }
V_INLINE vint vi_xor(vint a, vint b) { return _mm512_xor_si512(a, b); }
V_INLINE vint vi_max(vint a, vint b) { return _mm512_max_epi32(a, b); }
V_INLINE vint vi_min(vint a, vint b) { return _mm512_min_epi32(a, b); }
#define vi_sll(a, imm) _mm512_slli_epi32((a), (imm))
#define vi_srl(a, imm) _mm512_srli_epi32((a), (imm))
#define vi_sra(a, imm) _mm512_srai_epi32((a), (imm))
V_INLINE vmask vi_eq(vint a, vint b) { return _mm512_cmpeq_epi32_mask(a, b); }
V_INLINE vmask vi_gt(vint a, vint b) { return _mm512_cmpgt_epi32_mask(a, b); }
/* Lanes where a & b is not zero. */
V_INLINE vmask vi_test(vint a, vint b) { return _mm512_test_epi32_mask(a, b); }
V_INLINE vint vi_select(vmask m, vint a, vint b) { return _mm512_mask_blend_epi32(m, b, a); }

/* Bit casts and conversions. Float -> int32: NaN and out-of-range lanes give INT32_MIN
 * (tn_cvttps_i32); vi_round rounds to nearest even. */
V_INLINE vint v_as_int(vfloat a) { return _mm512_castps_si512(a); }
V_INLINE vfloat vi_as_float(vint a) { return _mm512_castsi512_ps(a); }
V_INLINE vfloat vi_to_float(vint a) { return _mm512_cvtepi32_ps(a); }
V_INLINE vint v_to_int_trunc(vfloat a) { return _mm512_cvttps_epi32(a); }
V_INLINE vint v_to_int_round(vfloat a)
{
    return _mm512_cvt_roundps_epi32(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* table[i & 7] per lane (8-entry table; the bits of i above the lowest 3 are ignored). */
V_INLINE vfloat v_lut8(const float * table, vint i)
{
    return _mm512_permutexvar_ps(i, _mm512_broadcast_f32x8(_mm256_loadu_ps(table))); /* both halves hold the table */
}

/* ---- Prefetch ------------------------------------------------------------------------ */

V_INLINE void v_prefetch_l1(const void * p) { _mm_prefetch((const char *)p, _MM_HINT_T0); }
V_INLINE void v_prefetch_l2(const void * p) { _mm_prefetch((const char *)p, _MM_HINT_T1); }

/* ---- shuffle: even / odd lanes and interleaving --------------------------------------- */

/* Lane l = p[2l] (v_load_even) or p[2l + 1] (v_load_odd); reads p[0..31]. */
V_INLINE vfloat v_load_even(const float * p)
{
    const __m512i idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    return _mm512_permutex2var_ps(_mm512_loadu_ps(p), idx, _mm512_loadu_ps(p + 16));
}
V_INLINE vfloat v_load_odd(const float * p)
{
    const __m512i idx = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    return _mm512_permutex2var_ps(_mm512_loadu_ps(p), idx, _mm512_loadu_ps(p + 16));
}
/* a0 b0 a1 b1 .. a7 b7 (v_zip_lo) and a8 b8 .. a15 b15 (v_zip_hi). */
V_INLINE vfloat v_zip_lo(vfloat a, vfloat b)
{
    const __m512i idx = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    return _mm512_permutex2var_ps(a, idx, b);
}
V_INLINE vfloat v_zip_hi(vfloat a, vfloat b)
{
    const __m512i idx = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    return _mm512_permutex2var_ps(a, idx, b);
}

/* ---- tiled scale: lane permute --------------------------------------------------------- */

/* Lane l = t[i[l] & 15]. */
V_INLINE vfloat v_permute(vfloat t, vint i) { return _mm512_permutexvar_ps(i, t); }

/* ---- Added for the unary family (simd/vmath.h) ------------------------------------- */

/* Lanes that are not a positive normal float: zero, negative, denormal, inf or NaN (one
 * vfpclassps). */
V_INLINE vmask v_not_positive_normal(vfloat x) { return _mm512_fpclass_ps_mask(x, 0xff); }

/* v_frexp for positive normal x only (other lanes: unspecified); the same two
 * instructions here, fewer than v_frexp on AVX2, which must also scale denormals. */
V_INLINE vfloat v_frexp_normal(vfloat x, vfloat * e) { return v_frexp(x, e); }
/* Arithmetic with denormal results runs at full speed here (vscalefps included), so
 * callers need no integer detour for them (see v_exp). */
#define V_SLOW_DENORMALS 0
/* v_ldexp for y in [0.5, 2) and integral n in [-125, 128] (normal or overflowing result):
 * exact, overflow gives +inf. n is added to y's exponent field, as on AVX2: inside
 * softmax's loops that measured twice as fast as vscalefps here. */
V_INLINE vfloat v_ldexp_normal(vfloat y, vfloat n)
{
    __m512i s = _mm512_add_epi32(_mm512_castps_si512(y), _mm512_slli_epi32(_mm512_cvttps_epi32(n), 23));
    return _mm512_castsi512_ps(_mm512_min_epi32(s, _mm512_set1_epi32(0x7f800000)));
}

#endif
