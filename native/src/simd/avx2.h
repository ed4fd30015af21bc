/*
 * The vector layer at the AVX2 level (AVX2, FMA, F16C): the interface of simd/avx512.h with
 * the same 16 lanes, held as two 8-lane halves (lanes 0-7 in .lo, 8-15 in .hi). Every
 * operation is the AVX-512 one applied to each half, so code written against the layer
 * computes the same bits on both levels (simd/README.md). Including this header compiles
 * the rest of the file for AVX2.
 */
#ifndef TN_SIMD_LEVEL_H
#define TN_SIMD_LEVEL_H

#pragma GCC target("avx,avx2,fma,f16c")

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "vmath_scalar.h"

#define TN_ISA(Name) tn_avx2_##Name
#define TN_ISA_NAME "avx2"
#define TN_LANES 16

typedef struct {
    __m256 lo, hi;
} vfloat;
typedef struct {
    __m256i lo, hi;
} vint;
typedef struct {
    __m256 lo, hi;
} vmask; /* all-ones lanes are set */

#define V_INLINE static inline __attribute__((always_inline))

/* Apply a 256-bit operation to both halves. */
#define V2_(T, op, a, b) ((T){op((a).lo, (b).lo), op((a).hi, (b).hi)})
#define V1_(T, op, a) ((T){op((a).lo), op((a).hi)})

/* Mask of the first n (<= 8) lanes of one half, as maskload/maskstore take it. */
V_INLINE __m256i v_half_mask_(size_t n)
{
    static const int32_t lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(lanes + 8 - n));
}

/* ---- Lane masks -------------------------------------------------------------------- */

V_INLINE vmask m_first(size_t n)
{
    if (n >= 16) {
        __m256 ones = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
        return (vmask){ones, ones};
    }
    return (vmask){_mm256_castsi256_ps(v_half_mask_(n >= 8 ? 8 : n)),
                   _mm256_castsi256_ps(v_half_mask_(n > 8 ? n - 8 : 0))};
}
V_INLINE vmask m_and(vmask a, vmask b) { return V2_(vmask, _mm256_and_ps, a, b); }
V_INLINE vmask m_or(vmask a, vmask b) { return V2_(vmask, _mm256_or_ps, a, b); }
V_INLINE vmask m_andnot(vmask a, vmask b) { return V2_(vmask, _mm256_andnot_ps, a, b); }
V_INLINE vmask m_not(vmask a)
{
    __m256 ones = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    return (vmask){_mm256_xor_ps(a.lo, ones), _mm256_xor_ps(a.hi, ones)};
}
V_INLINE unsigned m_bits(vmask a)
{
    return (unsigned)_mm256_movemask_ps(a.lo) | ((unsigned)_mm256_movemask_ps(a.hi) << 8);
}
V_INLINE int m_any(vmask a) { return !_mm256_testz_ps(_mm256_or_ps(a.lo, a.hi), _mm256_or_ps(a.lo, a.hi)); }
V_INLINE int m_all(vmask a) { return m_bits(a) == 0xffffu; }

/* ---- Floats: memory ------------------------------------------------------------------ */

V_INLINE vfloat v_load(const float * p) { return (vfloat){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
V_INLINE vfloat v_load_aligned(const float * p) { return (vfloat){_mm256_load_ps(p), _mm256_load_ps(p + 8)}; }
V_INLINE void v_store(float * p, vfloat v)
{
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
V_INLINE void v_store_aligned(float * p, vfloat v)
{
    _mm256_store_ps(p, v.lo);
    _mm256_store_ps(p + 8, v.hi);
}
V_INLINE void v_stream(float * p, vfloat v)
{
    _mm256_stream_ps(p, v.lo);
    _mm256_stream_ps(p + 8, v.hi);
}
V_INLINE void v_stream_fence(void) { _mm_sfence(); }
V_INLINE vfloat v_load_mask(const float * p, vmask m)
{
    return (vfloat){_mm256_maskload_ps(p, _mm256_castps_si256(m.lo)),
                    _mm256_maskload_ps(p + 8, _mm256_castps_si256(m.hi))};
}
V_INLINE void v_store_mask(float * p, vfloat v, vmask m)
{
    _mm256_maskstore_ps(p, _mm256_castps_si256(m.lo), v.lo);
    _mm256_maskstore_ps(p + 8, _mm256_castps_si256(m.hi), v.hi);
}
V_INLINE vfloat v_load_n(const float * p, size_t n) { return n >= 16 ? v_load(p) : v_load_mask(p, m_first(n)); }
V_INLINE void v_store_n(float * p, vfloat v, size_t n)
{
    if (n >= 16)
        v_store(p, v);
    else
        v_store_mask(p, v, m_first(n));
}

/* BF16 and FP16: 16 values of 2 bytes; tails go through a small zeroed stack copy. */
V_INLINE __m256 v_bf16_half_(__m128i b) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16)); }
V_INLINE vfloat v_load_bf16(const uint16_t * p)
{
    return (vfloat){v_bf16_half_(_mm_loadu_si128((const __m128i *)p)),
                    v_bf16_half_(_mm_loadu_si128((const __m128i *)(p + 8)))};
}
V_INLINE vfloat v_load_bf16_n(const uint16_t * p, size_t n)
{
    if (n >= 16)
        return v_load_bf16(p);
    uint16_t t[16] = {0};
    memcpy(t, p, n * sizeof(uint16_t));
    return v_load_bf16(t);
}
V_INLINE __m128i v_f32_to_bf16_half_(__m256 v)
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
V_INLINE void v_store_bf16(uint16_t * p, vfloat v)
{
    _mm_storeu_si128((__m128i *)p, v_f32_to_bf16_half_(v.lo));
    _mm_storeu_si128((__m128i *)(p + 8), v_f32_to_bf16_half_(v.hi));
}
V_INLINE void v_store_bf16_n(uint16_t * p, vfloat v, size_t n)
{
    if (n >= 16) {
        v_store_bf16(p, v);
    } else {
        uint16_t t[16];
        v_store_bf16(t, v);
        memcpy(p, t, n * sizeof(uint16_t));
    }
}
/* No BF16 conversion instruction at this level (see simd/avx512.h). */
V_INLINE int v_hw_bf16(void) { return 0; }
V_INLINE void v_store_bf16_hw(uint16_t * p, vfloat v, int hw)
{
    (void)hw;
    v_store_bf16(p, v);
}
V_INLINE void v_store_bf16_hw_normal(uint16_t * p, vfloat v, int hw)
{
    (void)hw;
    v_store_bf16(p, v);
}
V_INLINE void v_store_bf16_hw_normal_n(uint16_t * p, vfloat v, size_t n, int hw)
{
    (void)hw;
    v_store_bf16_n(p, v, n);
}
V_INLINE void v_store2_bf16_hw(uint16_t * p, vfloat a, vfloat b, int hw)
{
    (void)hw;
    v_store_bf16(p, a);
    v_store_bf16(p + 16, b);
}
V_INLINE vfloat v_load_f16(const uint16_t * p)
{
    return (vfloat){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
                    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)))};
}
V_INLINE vfloat v_load_f16_n(const uint16_t * p, size_t n)
{
    if (n >= 16)
        return v_load_f16(p);
    uint16_t t[16] = {0};
    memcpy(t, p, n * sizeof(uint16_t));
    return v_load_f16(t);
}
V_INLINE void v_store_f16(uint16_t * p, vfloat v)
{
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm_storeu_si128((__m128i *)(p + 8), _mm256_cvtps_ph(v.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
V_INLINE void v_store_f16_n(uint16_t * p, vfloat v, size_t n)
{
    if (n >= 16) {
        v_store_f16(p, v);
    } else {
        uint16_t t[16];
        v_store_f16(t, v);
        memcpy(p, t, n * sizeof(uint16_t));
    }
}

/* ---- Floats: arithmetic ---------------------------------------------------------------- */

V_INLINE vfloat v_set1(float f) { return (vfloat){_mm256_set1_ps(f), _mm256_set1_ps(f)}; }
V_INLINE vfloat v_zero(void) { return (vfloat){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
V_INLINE vfloat v_add(vfloat a, vfloat b) { return V2_(vfloat, _mm256_add_ps, a, b); }
V_INLINE vfloat v_sub(vfloat a, vfloat b) { return V2_(vfloat, _mm256_sub_ps, a, b); }
V_INLINE vfloat v_mul(vfloat a, vfloat b) { return V2_(vfloat, _mm256_mul_ps, a, b); }
V_INLINE vfloat v_div(vfloat a, vfloat b) { return V2_(vfloat, _mm256_div_ps, a, b); }
V_INLINE vfloat v_fma(vfloat a, vfloat b, vfloat c)
{
    return (vfloat){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
V_INLINE vfloat v_fms(vfloat a, vfloat b, vfloat c)
{
    return (vfloat){_mm256_fmsub_ps(a.lo, b.lo, c.lo), _mm256_fmsub_ps(a.hi, b.hi, c.hi)};
}
V_INLINE vfloat v_fnma(vfloat a, vfloat b, vfloat c)
{
    return (vfloat){_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
V_INLINE vfloat v_min(vfloat a, vfloat b) { return V2_(vfloat, _mm256_min_ps, a, b); }
V_INLINE vfloat v_max(vfloat a, vfloat b) { return V2_(vfloat, _mm256_max_ps, a, b); }
V_INLINE vfloat v_sqrt(vfloat a) { return V1_(vfloat, _mm256_sqrt_ps, a); }
V_INLINE vfloat v_and(vfloat a, vfloat b) { return V2_(vfloat, _mm256_and_ps, a, b); }
V_INLINE vfloat v_or(vfloat a, vfloat b) { return V2_(vfloat, _mm256_or_ps, a, b); }
V_INLINE vfloat v_xor(vfloat a, vfloat b) { return V2_(vfloat, _mm256_xor_ps, a, b); }
V_INLINE vfloat v_andnot(vfloat a, vfloat b) { return V2_(vfloat, _mm256_andnot_ps, a, b); }
V_INLINE vfloat v_abs(vfloat a)
{
    return v_and(a, (vfloat){_mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)),
                             _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))});
}
V_INLINE vfloat v_neg(vfloat a) { return v_xor(a, v_set1(-0.0f)); }
#define V_ROUND_(mode) \
    ((vfloat){_mm256_round_ps(a.lo, (mode) | _MM_FROUND_NO_EXC), _mm256_round_ps(a.hi, (mode) | _MM_FROUND_NO_EXC)})
V_INLINE vfloat v_round(vfloat a) { return V_ROUND_(_MM_FROUND_TO_NEAREST_INT); }
V_INLINE vfloat v_floor(vfloat a) { return V_ROUND_(_MM_FROUND_TO_NEG_INF); }
V_INLINE vfloat v_ceil(vfloat a) { return V_ROUND_(_MM_FROUND_TO_POS_INF); }
#undef V_ROUND_

/* ---- Floats: compare and select ------------------------------------------------------ */

#define V_CMP_(pred) ((vmask){_mm256_cmp_ps(a.lo, b.lo, (pred)), _mm256_cmp_ps(a.hi, b.hi, (pred))})
V_INLINE vmask v_lt(vfloat a, vfloat b) { return V_CMP_(_CMP_LT_OQ); }
V_INLINE vmask v_le(vfloat a, vfloat b) { return V_CMP_(_CMP_LE_OQ); }
V_INLINE vmask v_gt(vfloat a, vfloat b) { return V_CMP_(_CMP_GT_OQ); }
V_INLINE vmask v_ge(vfloat a, vfloat b) { return V_CMP_(_CMP_GE_OQ); }
V_INLINE vmask v_eq(vfloat a, vfloat b) { return V_CMP_(_CMP_EQ_OQ); }
#undef V_CMP_
V_INLINE vmask v_isnan(vfloat a)
{
    return (vmask){_mm256_cmp_ps(a.lo, a.lo, _CMP_UNORD_Q), _mm256_cmp_ps(a.hi, a.hi, _CMP_UNORD_Q)};
}
V_INLINE vfloat v_select(vmask m, vfloat a, vfloat b)
{
    return (vfloat){_mm256_blendv_ps(b.lo, a.lo, m.lo), _mm256_blendv_ps(b.hi, a.hi, m.hi)};
}
V_INLINE vfloat v_keep(vmask m, vfloat a) { return (vfloat){_mm256_and_ps(m.lo, a.lo), _mm256_and_ps(m.hi, a.hi)}; }

/* ---- Reductions: the tree of simd/hreduce.h, its first step over the two halves ------ */

#define V_HALF8_(op256) op256(v.lo, v.hi)
#include "simd/hreduce.h"

/* ---- 32-bit integers ----------------------------------------------------------------- */

V_INLINE vint vi_set1(int32_t i) { return (vint){_mm256_set1_epi32(i), _mm256_set1_epi32(i)}; }
V_INLINE vint vi_zero(void) { return (vint){_mm256_setzero_si256(), _mm256_setzero_si256()}; }
V_INLINE vint vi_load(const int32_t * p)
{
    return (vint){_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)(p + 8))};
}
V_INLINE void vi_store(int32_t * p, vint v)
{
    _mm256_storeu_si256((__m256i *)p, v.lo);
    _mm256_storeu_si256((__m256i *)(p + 8), v.hi);
}
V_INLINE vint vi_add(vint a, vint b) { return V2_(vint, _mm256_add_epi32, a, b); }
V_INLINE vint vi_sub(vint a, vint b) { return V2_(vint, _mm256_sub_epi32, a, b); }
V_INLINE vint vi_mul(vint a, vint b) { return V2_(vint, _mm256_mullo_epi32, a, b); }
V_INLINE vint vi_and(vint a, vint b) { return V2_(vint, _mm256_and_si256, a, b); }
V_INLINE vint vi_or(vint a, vint b) { return V2_(vint, _mm256_or_si256, a, b); }
V_INLINE vint vi_xor(vint a, vint b) { return V2_(vint, _mm256_xor_si256, a, b); }
V_INLINE vint vi_max(vint a, vint b) { return V2_(vint, _mm256_max_epi32, a, b); }
V_INLINE vint vi_min(vint a, vint b) { return V2_(vint, _mm256_min_epi32, a, b); }
#define vi_sll(a, imm) ((vint){_mm256_slli_epi32((a).lo, (imm)), _mm256_slli_epi32((a).hi, (imm))})
#define vi_srl(a, imm) ((vint){_mm256_srli_epi32((a).lo, (imm)), _mm256_srli_epi32((a).hi, (imm))})
#define vi_sra(a, imm) ((vint){_mm256_srai_epi32((a).lo, (imm)), _mm256_srai_epi32((a).hi, (imm))})
V_INLINE vmask vi_eq(vint a, vint b)
{
    return (vmask){_mm256_castsi256_ps(_mm256_cmpeq_epi32(a.lo, b.lo)),
                   _mm256_castsi256_ps(_mm256_cmpeq_epi32(a.hi, b.hi))};
}
V_INLINE vmask vi_gt(vint a, vint b)
{
    return (vmask){_mm256_castsi256_ps(_mm256_cmpgt_epi32(a.lo, b.lo)),
                   _mm256_castsi256_ps(_mm256_cmpgt_epi32(a.hi, b.hi))};
}
V_INLINE vmask vi_test(vint a, vint b) { return m_not(vi_eq(vi_and(a, b), vi_zero())); }
V_INLINE vint vi_select(vmask m, vint a, vint b)
{
    return (vint){_mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(b.lo), _mm256_castsi256_ps(a.lo), m.lo)),
                  _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(b.hi), _mm256_castsi256_ps(a.hi), m.hi))};
}

V_INLINE vint v_as_int(vfloat a) { return (vint){_mm256_castps_si256(a.lo), _mm256_castps_si256(a.hi)}; }
V_INLINE vfloat vi_as_float(vint a) { return (vfloat){_mm256_castsi256_ps(a.lo), _mm256_castsi256_ps(a.hi)}; }
V_INLINE vfloat vi_to_float(vint a) { return V1_(vfloat, _mm256_cvtepi32_ps, a); }
V_INLINE vint v_to_int_trunc(vfloat a) { return V1_(vint, _mm256_cvttps_epi32, a); }
/* Rounds to nearest even (the MXCSR default, which tensorops never changes). */
V_INLINE vint v_to_int_round(vfloat a) { return V1_(vint, _mm256_cvtps_epi32, a); }

/* y * 2^n, n integral in [-252, 254], rounded once: two exact powers of two, as
 * tn_exp_f32 applies them (the first product is exact, the second rounds). */
V_INLINE vfloat v_ldexp(vfloat y, vfloat n)
{
    vint ni = v_to_int_trunc(n);
    vint h1 = vi_sra(ni, 1), h2 = vi_sub(ni, h1);
    vfloat p1 = vi_as_float(vi_sll(vi_add(h1, vi_set1(127)), 23));
    vfloat p2 = vi_as_float(vi_sll(vi_add(h2, vi_set1(127)), 23));
    return v_mul(v_mul(y, p1), p2);
}

/* x = m * 2^e, m in [1, 2): denormals are first scaled by 2^23 (exact). */
V_INLINE vfloat v_frexp(vfloat x, vfloat * e)
{
    vmask tiny = v_lt(x, v_set1(FLT_MIN));
    vfloat xs = v_select(tiny, v_mul(x, v_set1(8388608.0f)), x);
    vint u = v_as_int(xs);
    *e = v_add(vi_to_float(vi_sub(vi_srl(u, 23), vi_set1(127))), v_keep(tiny, v_set1(-23.0f)));
    return vi_as_float(vi_or(vi_and(u, vi_set1(0x007fffff)), vi_set1(0x3f800000)));
}

/* y * 2^floor(n) for y in [0.5, 2), rounded once; n is clamped to [-200, 200], beyond
 * which the result is 0 or inf anyway (the semantics of AVX-512's vscalefps there). */
V_INLINE vfloat v_scale_floor(vfloat y, vfloat n)
{
    return v_ldexp(y, v_floor(v_min(v_max(n, v_set1(-200.0f)), v_set1(200.0f))));
}

V_INLINE vfloat v_lut8(const float * table, vint i)
{
    __m256 t = _mm256_loadu_ps(table);
    return (vfloat){_mm256_permutevar8x32_ps(t, i.lo), _mm256_permutevar8x32_ps(t, i.hi)};
}

/* ---- Prefetch ------------------------------------------------------------------------ */

V_INLINE void v_prefetch_l1(const void * p) { _mm_prefetch((const char *)p, _MM_HINT_T0); }
V_INLINE void v_prefetch_l2(const void * p) { _mm_prefetch((const char *)p, _MM_HINT_T1); }

/* ---- Added for the unary family (simd/vmath.h) ------------------------------------- */

/* v_frexp for positive normal x only (other lanes: unspecified): the exponent and
 * mantissa fields, without v_frexp's scaling of denormals. */
V_INLINE vfloat v_frexp_normal(vfloat x, vfloat * e)
{
    vint u = v_as_int(x);
    *e = vi_to_float(vi_sub(vi_srl(u, 23), vi_set1(127)));
    return vi_as_float(vi_or(vi_and(u, vi_set1(0x007fffff)), vi_set1(0x3f800000)));
}
/* A multiply with a denormal result takes a microcode assist here (about 10x slower):
 * callers that can meet many such lanes detour through integers (see v_exp). */
#define V_SLOW_DENORMALS 1
/* v_ldexp for y in [0.5, 2) and integral n in [-125, 128] (normal or overflowing result):
 * exact, overflow gives +inf. n is added to y's exponent field; sums at or above the
 * bits of +inf (y >= 1, n = 128) become +inf. */
V_INLINE vfloat v_ldexp_normal(vfloat y, vfloat n)
{
    vint s = vi_add(v_as_int(y), vi_sll(v_to_int_trunc(n), 23));
    return vi_as_float(vi_min(s, vi_set1(0x7f800000)));
}

#undef V1_
#undef V2_

/* ---- shuffle: even / odd lanes and interleaving --------------------------------------- */

/* One half of v_load_even / v_load_odd from p[0..15]: the 128-bit quarters are loaded as
 * (p0..p3 | p8..p11) and (p4..p7 | p12..p15), so one in-lane shuffle puts them in order. */
V_INLINE __m256 v_half_pick_(const float * p, int odd)
{
    __m256 v0 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(p)), _mm_loadu_ps(p + 8), 1);
    __m256 v1 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(p + 4)), _mm_loadu_ps(p + 12), 1);
    return odd ? _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(3, 1, 3, 1))
               : _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(2, 0, 2, 0));
}
V_INLINE vfloat v_load_even(const float * p) { return (vfloat){v_half_pick_(p, 0), v_half_pick_(p + 16, 0)}; }
V_INLINE vfloat v_load_odd(const float * p) { return (vfloat){v_half_pick_(p, 1), v_half_pick_(p + 16, 1)}; }
/* Interleave of two 8-lane halves: a0 b0 .. a7 b7 as two halves. */
V_INLINE vfloat v_zip_half_(__m256 a, __m256 b)
{
    __m256 l = _mm256_unpacklo_ps(a, b); /* a0 b0 a1 b1 | a4 b4 a5 b5 */
    __m256 h = _mm256_unpackhi_ps(a, b); /* a2 b2 a3 b3 | a6 b6 a7 b7 */
    return (vfloat){_mm256_permute2f128_ps(l, h, 0x20), _mm256_permute2f128_ps(l, h, 0x31)};
}
V_INLINE vfloat v_zip_lo(vfloat a, vfloat b) { return v_zip_half_(a.lo, b.lo); }
V_INLINE vfloat v_zip_hi(vfloat a, vfloat b) { return v_zip_half_(a.hi, b.hi); }

/* ---- tiled scale: lane permute --------------------------------------------------------- */

/* Lane l = t[i[l] & 15]: each half permutes both halves of t and keeps the one bit 3 of
 * the index names. */
V_INLINE __m256 v_permute_half_(vfloat t, __m256i i)
{
    __m256 hi = _mm256_castsi256_ps(_mm256_slli_epi32(i, 28)); /* bit 3 -> sign */
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(t.lo, i), _mm256_permutevar8x32_ps(t.hi, i), hi);
}
V_INLINE vfloat v_permute(vfloat t, vint i) { return (vfloat){v_permute_half_(t, i.lo), v_permute_half_(t, i.hi)}; }

/* Lanes that are not a positive normal float: zero, negative, denormal, inf or NaN. */
V_INLINE vmask v_not_positive_normal(vfloat x)
{
    return m_not(m_and(v_ge(x, v_set1(FLT_MIN)), v_le(x, v_set1(FLT_MAX))));
}

#endif
