/*
 * Generic normalization (TensorRT INormalization, DirectML MVN1), AVX2 level: the work
 * layout of gnorm_avx512.c with 8-lane vectors. The canonical 64 lanes of a row sum are
 * eight __m256 accumulators, the 16 lanes of a column sum two (see gnorm.h). Tails: masked
 * loads and stores for FP32, a small zero-padded stack copy for FP16 and BF16. FP16 converts
 * with F16C (VCVTPH2PS / VCVTPS2PH, round to nearest even).
 */
#include "vmath_avx2.h"

#include <string.h>

#include "kernels.h"
#include "tensorops.h"
#include "gnorm.h"

#define F TN_AVX2_F
#define INLINE static inline __attribute__((always_inline))

/* The prefetch cursor of the rows kernel (see gnorm_avx512.c). */
typedef struct {
    const char * p;
    const char * end;
} Cursor;

INLINE void pf_step(Cursor * c)
{
    if (c->p < c->end) {
        _mm_prefetch(c->p, _MM_HINT_T1);
        c->p += 64;
    }
}

/* ---- Loads and stores of any type (element index i of p; n lanes, the others read 0) ---- */

INLINE __m256 from16(__m128i h, int type)
{
    return type == TnTensorData16b ? tn_avx2_bf16_to_f32(h) : _mm256_cvtph_ps(h);
}

/* FP32 -> BF16 bits (round to nearest even) or FP16 (F16C), for values whose only NaN is the
 * canonical one: BF16 then needs no NaN handling (0x7FC00000 rounds to 0x7FC0, as
 * tn_f32_to_bf16 gives). */
INLINE __m128i to16(__m256 v, int type)
{
    if (type != TnTensorData16b)
        return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

INLINE __m256 ld(const void * p, size_t i, int type)
{
    if (type == TnTensorData32f)
        return _mm256_loadu_ps((const float *)p + i);
    return from16(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)), type);
}

INLINE __m256 ldn(const void * p, size_t i, size_t n, int type)
{
    if (n >= F)
        return ld(p, i, type);
    if (type == TnTensorData32f)
        return _mm256_maskload_ps((const float *)p + i, tn_avx2_tail_mask(n));
    uint16_t t[F] = {0};
    memcpy(t, (const uint16_t *)p + i, n * sizeof(uint16_t));
    return from16(_mm_loadu_si128((const __m128i *)t), type);
}

INLINE __m256 canonical_nan(__m256 v)
{
    return _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(TN_GN_QNAN)), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

INLINE void st(void * p, size_t i, __m256 v, int type)
{
    v = canonical_nan(v);
    if (type == TnTensorData32f)
        _mm256_storeu_ps((float *)p + i, v);
    else
        _mm_storeu_si128((__m128i *)((uint16_t *)p + i), to16(v, type));
}

INLINE void stn(void * p, size_t i, size_t n, __m256 v, int type)
{
    if (n >= F) {
        st(p, i, v, type);
        return;
    }
    v = canonical_nan(v);
    if (type == TnTensorData32f) {
        _mm256_maskstore_ps((float *)p + i, tn_avx2_tail_mask(n), v);
        return;
    }
    uint16_t t[F];
    _mm_storeu_si128((__m128i *)t, to16(v, type));
    memcpy((uint16_t *)p + i, t, n * sizeof(uint16_t));
}

/* Parameters: n (< 8) values, the others 0. */
INLINE __m256 ldpn(const float * p, size_t n)
{
    return n >= F ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, tn_avx2_tail_mask(n));
}

/* a - b in the first n lanes, +0.0f in the others. */
INLINE __m256 maskz_sub(size_t n, __m256 a, __m256 b)
{
    __m256 d = _mm256_sub_ps(a, b);
    return n >= F ? d : _mm256_and_ps(d, _mm256_castsi256_ps(tn_avx2_tail_mask(n)));
}

/* ---- Activations (gnorm_scalar.c, operation for operation) -------------------------------- */

#define SET1 _mm256_set1_ps

INLINE __m256 vabs(__m256 v) { return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
INLINE __m256 vneg(__m256 v) { return _mm256_xor_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN))); }
INLINE __m256 cmp_lt(__m256 a, __m256 b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
INLINE __m256 cmp_gt(__m256 a, __m256 b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
INLINE __m256 cmp_ge(__m256 a, __m256 b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
INLINE __m256 cmp_eq(__m256 a, __m256 b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
/* mask ? b : a */
INLINE __m256 sel(__m256 a, __m256 b, __m256 mask) { return _mm256_blendv_ps(a, b, mask); }

static __m256 expm1_v(__m256 y)
{
    __m256 u = tn_avx2_exp(y);
    __m256 um1 = _mm256_sub_ps(u, SET1(1.0f));
    __m256 r = _mm256_div_ps(_mm256_mul_ps(um1, y), tn_avx2_log(u));
    r = sel(r, y, cmp_eq(u, SET1(1.0f)));
    r = sel(r, SET1(-1.0f), cmp_eq(um1, SET1(-1.0f)));
    return sel(r, u, cmp_eq(u, SET1(INFINITY)));
}

static __m256 softplus_core_v(__m256 z)
{
    __m256 u = tn_avx2_exp(vneg(vabs(z)));
    __m256 w = _mm256_add_ps(SET1(1.0f), u);
    __m256 l = _mm256_mul_ps(tn_avx2_log(w), _mm256_div_ps(u, _mm256_sub_ps(w, SET1(1.0f))));
    l = sel(l, u, cmp_eq(w, SET1(1.0f)));
    return _mm256_add_ps(_mm256_max_ps(_mm256_setzero_ps(), z), l);
}

static __m256 tanh_v(__m256 y)
{
    __m256 ax = vabs(y), z = _mm256_mul_ps(y, y);
    __m256 p = SET1(TN_GN_TANH_P4);
    p = _mm256_fmadd_ps(p, z, SET1(TN_GN_TANH_P3));
    p = _mm256_fmadd_ps(p, z, SET1(TN_GN_TANH_P2));
    p = _mm256_fmadd_ps(p, z, SET1(TN_GN_TANH_P1));
    p = _mm256_fmadd_ps(p, z, SET1(TN_GN_TANH_P0));
    __m256 small = _mm256_fmadd_ps(p, _mm256_mul_ps(y, z), y);
    __m256 e = tn_avx2_exp(_mm256_add_ps(ax, ax));
    __m256 big = _mm256_sub_ps(SET1(1.0f), _mm256_div_ps(SET1(2.0f), _mm256_add_ps(e, SET1(1.0f))));
    big = _mm256_or_ps(vabs(big), _mm256_and_ps(y, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN))));
    return sel(big, small, cmp_lt(ax, SET1(TN_GN_TANH_SMALL)));
}

static __m256 gelu_v(__m256 y)
{
    __m256 yy = _mm256_mul_ps(y, y);
    __m256 e2 = _mm256_mul_ps(_mm256_fmsub_ps(y, y, yy), SET1(0.5f));
    __m256 t2 = _mm256_mul_ps(yy, SET1(0.5f));
    __m256 t = _mm256_mul_ps(y, SET1(TN_GN_RSQRT2));
    __m256 p = SET1(TN_GN_ERF_P5);
    p = _mm256_fmadd_ps(p, t2, SET1(TN_GN_ERF_P4));
    p = _mm256_fmadd_ps(p, t2, SET1(TN_GN_ERF_P3));
    p = _mm256_fmadd_ps(p, t2, SET1(TN_GN_ERF_P2));
    p = _mm256_fmadd_ps(p, t2, SET1(TN_GN_ERF_P1));
    p = _mm256_fmadd_ps(p, t2, SET1(TN_GN_ERF_P0));
    __m256 small = _mm256_fmadd_ps(SET1(0.5f), _mm256_mul_ps(t, p), SET1(0.5f));
    __m256 v = _mm256_div_ps(SET1(1.0f), _mm256_add_ps(SET1(1.0f), vabs(t)));
    __m256 q = SET1(TN_GN_ERFC_Q8);
    q = _mm256_fmadd_ps(q, v, SET1(TN_GN_ERFC_Q7));
    q = _mm256_fmadd_ps(q, v, SET1(TN_GN_ERFC_Q6));
    q = _mm256_fmadd_ps(q, v, SET1(TN_GN_ERFC_Q5));
    q = _mm256_fmadd_ps(q, v, SET1(TN_GN_ERFC_Q4));
    q = _mm256_fmadd_ps(q, v, SET1(TN_GN_ERFC_Q3));
    q = _mm256_fmadd_ps(q, v, SET1(TN_GN_ERFC_Q2));
    q = _mm256_fmadd_ps(q, v, SET1(TN_GN_ERFC_Q1));
    q = _mm256_fmadd_ps(q, v, SET1(TN_GN_ERFC_Q0));
    __m256 g = _mm256_mul_ps(tn_avx2_exp(vneg(t2)), q);
    g = _mm256_fnmadd_ps(g, e2, g);
    __m256 h = _mm256_and_ps(_mm256_mul_ps(g, SET1(0.5f)), cmp_lt(t2, SET1(TN_GN_GELU_TINY)));
    __m256 big = sel(h, _mm256_sub_ps(SET1(1.0f), h), cmp_gt(y, _mm256_setzero_ps()));
    return _mm256_mul_ps(y, sel(big, small, cmp_lt(t2, SET1(TN_GN_GELU_SMALL))));
}

static __m256 activate(__m256 y, int type, const float * prm)
{
    const __m256 a = SET1(prm[0]), b = SET1(prm[1]), zero = _mm256_setzero_ps(), one = SET1(1.0f);
    switch (type) {
    case TnActivationLinear:
        return _mm256_fmadd_ps(a, y, b);
    case TnActivationRelu:
        return _mm256_max_ps(zero, y);
    case TnActivationLeakyRelu:
        return sel(_mm256_mul_ps(a, y), y, cmp_ge(y, zero));
    case TnActivationParametricSoftplus:
        return _mm256_mul_ps(a, softplus_core_v(_mm256_mul_ps(b, y)));
    case TnActivationElu:
        return sel(_mm256_mul_ps(a, expm1_v(y)), y, cmp_ge(y, zero));
    case TnActivationCelu:
        return _mm256_add_ps(_mm256_max_ps(zero, y), _mm256_min_ps(zero, _mm256_mul_ps(a, expm1_v(_mm256_div_ps(y, a)))));
    case TnActivationScaledElu:
        return sel(_mm256_mul_ps(b, _mm256_mul_ps(a, expm1_v(y))), _mm256_mul_ps(b, y), cmp_gt(y, zero));
    case TnActivationSigmoid:
        return _mm256_div_ps(one, _mm256_add_ps(one, tn_avx2_exp(vneg(y))));
    case TnActivationHardSigmoid:
        return _mm256_max_ps(zero, _mm256_min_ps(one, _mm256_fmadd_ps(a, y, b)));
    case TnActivationTanh:
        return tanh_v(y);
    case TnActivationScaledTanh:
        return _mm256_mul_ps(a, tanh_v(_mm256_mul_ps(b, y)));
    case TnActivationSoftplus:
        return _mm256_div_ps(softplus_core_v(_mm256_mul_ps(a, y)), a);
    case TnActivationSoftsign:
        return _mm256_div_ps(y, _mm256_add_ps(one, vabs(y)));
    case TnActivationThresholdedRelu:
        return _mm256_and_ps(y, cmp_gt(y, a));
    case TnActivationShrink: {
        __m256 r = _mm256_and_ps(_mm256_add_ps(y, a), cmp_lt(y, vneg(b)));
        return sel(r, _mm256_sub_ps(y, a), cmp_gt(y, b));
    }
    case TnActivationGelu:
        return gelu_v(y);
    default:
        return y;
    }
}

/* ---- Rows ---------------------------------------------------------------------------------- */

/* Streaming (non-temporal) store of a full vector at a vector-aligned address. */
INLINE void st_stream(void * p, size_t i, __m256 v, int type)
{
    v = canonical_nan(v);
    if (type == TnTensorData32f)
        _mm256_stream_ps((float *)p + i, v);
    else
        _mm_stream_si128((__m128i *)((uint16_t *)p + i), to16(v, type));
}

/* Full vectors of one segment from position e while e + F <= size; returns the next e. */
INLINE size_t output_body(const void * src, void * dst, size_t at, size_t e, size_t size, __m256 m, __m256 vk,
                          const float * s, size_t sstep, __m256 s0, const float * b, size_t bstep, __m256 b0,
                          Cursor * pf, const TnNormalization * norm, int type, int act, int stream)
{
    for (; e + F <= size; e += F) {
        pf_step(pf);
        __m256 d = _mm256_mul_ps(_mm256_sub_ps(ld(src, at + e, type), m), vk);
        __m256 vs = sstep ? _mm256_loadu_ps(s + e) : s0, vb = bstep ? _mm256_loadu_ps(b + e) : b0;
        __m256 y = _mm256_fmadd_ps(d, vs, vb);
        if (act)
            y = activate(y, norm->activation, norm->activationParams);
        if (stream)
            st_stream(dst, at + e, y, type);
        else
            st(dst, at + e, y, type);
    }
    return e;
}

/* The n (< F) values of one segment from position e. */
INLINE void output_part(const void * src, void * dst, size_t at, size_t e, size_t n, __m256 m, __m256 vk,
                        const float * s, size_t sstep, __m256 s0, const float * b, size_t bstep, __m256 b0,
                        const TnNormalization * norm, int type)
{
    __m256 d = _mm256_mul_ps(_mm256_sub_ps(ldn(src, at + e, n, type), m), vk);
    __m256 vs = sstep ? ldpn(s + e, n) : s0, vb = bstep ? ldpn(b + e, n) : b0;
    __m256 y = _mm256_fmadd_ps(d, vs, vb);
    stn(dst, at + e, n, norm->activation ? activate(y, norm->activation, norm->activationParams) : y, type);
}

/* Values [e0, e1) of one segment: full vectors (streaming stores if `stream`, which needs
 * [e0, e1) to be whole aligned cache lines), then a masked part. */
INLINE void output_range(const void * src, void * dst, size_t at, size_t e0, size_t e1, __m256 m, __m256 vk,
                         const float * s, size_t sstep, __m256 s0, const float * b, size_t bstep, __m256 b0,
                         Cursor * pf, const TnNormalization * norm, int type, int stream)
{
    size_t e = norm->activation != TnActivationIdentity
        ? (stream ? output_body(src, dst, at, e0, e1, m, vk, s, sstep, s0, b, bstep, b0, pf, norm, type, 1, 1)
                  : output_body(src, dst, at, e0, e1, m, vk, s, sstep, s0, b, bstep, b0, pf, norm, type, 1, 0))
        : (stream ? output_body(src, dst, at, e0, e1, m, vk, s, sstep, s0, b, bstep, b0, pf, norm, type, 0, 1)
                  : output_body(src, dst, at, e0, e1, m, vk, s, sstep, s0, b, bstep, b0, pf, norm, type, 0, 0));
    if (e < e1)
        output_part(src, dst, at, e, e1 - e, m, vk, s, sstep, s0, b, bstep, b0, norm, type);
}

/* Output of one row: y = act(fma((x - mean) * k, scale, bias)), segment by segment, while the
 * row at element `next` (further on in the input) is prefetched into L2. With `stream`
 * (large outputs, which leave the cache before anyone reads them) the whole 64-byte lines of
 * each segment are written with streaming stores: no read for ownership of those lines. A
 * line is never written partly by streaming stores (that would flush a partial
 * write-combining buffer): the parts before the first and after the last whole line use
 * ordinary stores. */
INLINE void output_row(const void * src, void * dst, size_t base, Cursor * pf, size_t segments, size_t size, float mean,
                       float k, const float * sp, const TnNormalizationParam * sc, const float * bp,
                       const TnNormalizationParam * bi, const TnNormalization * norm, int type, int stream)
{
    const size_t es = tn_gn_size(type);
    const __m256 m = _mm256_set1_ps(mean), vk = _mm256_set1_ps(k);
    for (size_t j = 0; j < segments; ++j) {
        const float * s = sp + j * sc->stride, * b = bp + j * bi->stride;
        const size_t at = base + j * size;
        const __m256 s0 = _mm256_set1_ps(s[0]), b0 = _mm256_set1_ps(b[0]);
        size_t e = 0;
        if (stream) {
            const uintptr_t a0 = (uintptr_t)dst + at * es, a1 = a0 + size * es;
            const uintptr_t l0 = (a0 + 63) & ~(uintptr_t)63, l1 = a1 & ~(uintptr_t)63;
            if (l1 > l0) {
                const size_t h = (l0 - a0) / es, t = (l1 - a0) / es;
                output_range(src, dst, at, 0, h, m, vk, s, sc->step, s0, b, bi->step, b0, pf, norm, type, 0);
                output_range(src, dst, at, h, t, m, vk, s, sc->step, s0, b, bi->step, b0, pf, norm, type, 1);
                e = t;
            }
        }
        output_range(src, dst, at, e, size, m, vk, s, sc->step, s0, b, bi->step, b0, pf, norm, type, 0);
    }
}

/* Sum of the n values from element `at` in the canonical 64-lane order (gnorm.h): element i
 * goes to accumulator (i / 16) % 4, lane i % 16, which here is the __m256 a[2q + (i / 8) % 2]
 * for q = (i / 16) % 4, block by block of TN_GN_BLOCK values whose sums are added into
 * totals; the groups are added as (0 + 1) + (2 + 3), then the 16 lanes as
 * tn_avx2_hsum(lanes 0-7 + lanes 8-15). sq: the sum of (x - m)^2 instead. */
INLINE float row_sum(const void * src, size_t at, size_t n, __m256 m, int sq, int type, Cursor * pf)
{
    float tot[8 * F] __attribute__((aligned(32)));   /* the block totals (touched once a block) */
    for (int j = 0; j < 8; ++j)
        _mm256_store_ps(tot + j * F, _mm256_setzero_ps());
    for (size_t b = 0; b < n; b += TN_GN_BLOCK) {
        const size_t bn = n - b < TN_GN_BLOCK ? n - b : TN_GN_BLOCK, bat = at + b;
        __m256 a[8];
        for (int j = 0; j < 8; ++j)
            a[j] = _mm256_setzero_ps();
        size_t i = 0;
        for (; i + 8 * F <= bn; i += 8 * F) {
            pf_step(pf);
            for (int j = 0; j < 8; ++j) {
                __m256 x = ld(src, bat + i + j * F, type);
                if (sq) {
                    x = _mm256_sub_ps(x, m);
                    a[j] = _mm256_fmadd_ps(x, x, a[j]);
                } else {
                    a[j] = _mm256_add_ps(a[j], x);
                }
            }
        }
        /* The last (< 64) values: vectors of up to 8 into a[0], a[1], ... in turn (written out so
         * that a[] stays in registers). */
#define TN_GN_PART(j) \
        if (i + (j) * F < bn) { \
            size_t c = bn - i - (j) * F < F ? bn - i - (j) * F : F; \
            __m256 x = ldn(src, bat + i + (j) * F, c, type); \
            if (sq) { \
                x = maskz_sub(c, x, m); \
                a[j] = _mm256_fmadd_ps(x, x, a[j]); \
            } else { \
                a[j] = _mm256_add_ps(a[j], x); \
            } \
        }
        TN_GN_PART(0) TN_GN_PART(1) TN_GN_PART(2) TN_GN_PART(3) TN_GN_PART(4) TN_GN_PART(5) TN_GN_PART(6) TN_GN_PART(7)
#undef TN_GN_PART
        for (int j = 0; j < 8; ++j)
            _mm256_store_ps(tot + j * F, _mm256_add_ps(_mm256_load_ps(tot + j * F), a[j]));
    }
    __m256 t[8];
    for (int j = 0; j < 8; ++j)
        t[j] = _mm256_load_ps(tot + j * F);
    __m256 lo = _mm256_add_ps(_mm256_add_ps(t[0], t[2]), _mm256_add_ps(t[4], t[6]));
    __m256 hi = _mm256_add_ps(_mm256_add_ps(t[1], t[3]), _mm256_add_ps(t[5], t[7]));
    return tn_avx2_hsum(_mm256_add_ps(lo, hi));
}

/* Mean and k of the row of n values from element `at` (two passes: the first brings the
 * row into L1 or L2, the second finds it there). */
INLINE void row_stats(const void * src, size_t at, size_t n, const TnNormalization * norm, int type, float * mean,
                      float * k, Cursor * pf)
{
    const float inv = 1.0f / (float)n;
    *mean = row_sum(src, at, n, _mm256_setzero_ps(), 0, type, pf) * inv;
    *k = 1.0f;
    if (norm->normalizeVariance)
        *k = 1.0f / sqrtf(row_sum(src, at, n, _mm256_set1_ps(*mean), 1, type, pf) * inv + norm->eps);
}

/* Rows one at a time, the statistics of the next row computed before the output of this one:
 * the latency of their reduction tree and square root overlaps with the output stores. While
 * a row is written, the input `ahead` elements further on is prefetched into L2. */
INLINE void rows_typed(const void * src, size_t outer, size_t segments, size_t size, const TnNormalization * norm,
                       void * dst, int type)
{
    const TnNormalizationParam sc = tn_gn_param(norm->scale, &tn_gn_one);
    const TnNormalizationParam bi = tn_gn_param(norm->bias, &tn_gn_zero);
    const size_t es = tn_gn_size(type), n = segments * size, total = outer * n;
    const int stream = total * es >= TN_GN_STREAM_BYTES && (uintptr_t)dst % es == 0;
    const size_t ahead = n * es >= TN_GN_AHEAD_BYTES ? n : (TN_GN_AHEAD_BYTES / es + n - 1) / n * n;
    float mean, k, next_mean = 0.0f, next_k = 0.0f;
    const char * const bytes = (const char *)src, * const last = bytes + total * es;
    Cursor pf = {bytes + (ahead < total ? ahead : total) * es, bytes};
    pf.end = bytes + (ahead + n < total ? ahead + n : total) * es;
    row_stats(src, 0, n, norm, type, &mean, &k, &pf);
    for (size_t o = 0; o < outer; ++o) {
        const size_t at = o * n;
        pf.end = at + n + ahead + n <= total ? bytes + (at + n + ahead + n) * es : last;
        if (o + 1 < outer)
            row_stats(src, at + n, n, norm, type, &next_mean, &next_k, &pf);
        output_row(src, dst, at, &pf, segments, size, mean, k, tn_gn_row(&sc, o), &sc, tn_gn_row(&bi, o), &bi, norm,
                   type, stream);
        mean = next_mean, k = next_k;
    }
    if (stream)
        _mm_sfence();   /* the streaming stores are weakly ordered */
}

void tn_avx2_NormalizationRows(const void * src, size_t outer, size_t segments, size_t segmentSize,
                               const TnNormalization * norm, void * dst)
{
    if (segments * segmentSize == 0)
        return;
    if (norm->type == TnTensorData32f)
        rows_typed(src, outer, segments, segmentSize, norm, dst, TnTensorData32f);
    else if (norm->type == TnTensorData16b)
        rows_typed(src, outer, segments, segmentSize, norm, dst, TnTensorData16b);
    else
        rows_typed(src, outer, segments, segmentSize, norm, dst, TnTensorData16f);
}

/* ---- Columns ------------------------------------------------------------------------------- */

static void lanes_tree(float (*lane)[TN_GN_CHUNK], size_t L, size_t w)
{
    for (size_t i = 0; i < 8 && i + 8 < L; ++i)
        for (size_t p = 0; p < w; p += F)
            _mm256_store_ps(lane[i] + p, _mm256_add_ps(_mm256_load_ps(lane[i] + p), _mm256_load_ps(lane[i + 8] + p)));
    size_t L1 = L < 8 ? L : 8;
    for (size_t i = 0; i < 4 && i + 4 < L1; ++i)
        for (size_t p = 0; p < w; p += F)
            _mm256_store_ps(lane[i] + p, _mm256_add_ps(_mm256_load_ps(lane[i] + p), _mm256_load_ps(lane[i + 4] + p)));
    size_t L2 = L1 < 4 ? L1 : 4;
    for (size_t i = 0; i < 2 && i + 2 < L2; ++i)
        for (size_t p = 0; p < w; p += F)
            _mm256_store_ps(lane[i] + p, _mm256_add_ps(_mm256_load_ps(lane[i] + p), _mm256_load_ps(lane[i + 2] + p)));
    if (L2 > 1)
        for (size_t p = 0; p < w; p += F)
            _mm256_store_ps(lane[0] + p, _mm256_add_ps(_mm256_load_ps(lane[0] + p), _mm256_load_ps(lane[1] + p)));
}

INLINE void columns_typed(const void * src, size_t outer, size_t count, size_t inner, const TnNormalization * norm,
                          void * dst, int type)
{
    const TnNormalizationParam sc = tn_gn_param(norm->scale, &tn_gn_one);
    const TnNormalizationParam bi = tn_gn_param(norm->bias, &tn_gn_zero);
    const size_t L = count < 16 ? count : 16;
    const int act = norm->activation;
    const __m256 vinv = _mm256_set1_ps(1.0f / (float)count), ve = _mm256_set1_ps(norm->eps), one = _mm256_set1_ps(1.0f);
    size_t chunk = TN_GN_CHUNK_BYTES / (count * tn_gn_size(type));
    chunk = chunk >= TN_GN_CHUNK ? TN_GN_CHUNK : chunk < F ? F : chunk - chunk % F;
    float lane[16][TN_GN_CHUNK] __attribute__((aligned(32)));
    float mean[TN_GN_CHUNK] __attribute__((aligned(32)));
    float k[TN_GN_CHUNK] __attribute__((aligned(32)));
    for (size_t o = 0; o < outer; ++o) {
        const size_t base = o * count * inner;
        const float * sp = tn_gn_row(&sc, o), * bp = tn_gn_row(&bi, o);
        for (size_t p0 = 0; p0 < inner; p0 += chunk) {
            const size_t w = inner - p0 < chunk ? inner - p0 : chunk;
            for (size_t r = 0; r < count; ++r) {
                float * a = lane[r % 16];
                const size_t at = base + r * inner + p0;
                for (size_t p = 0; p < w; p += F) {
                    __m256 v = ldn(src, at + p, w - p, type);
                    _mm256_store_ps(a + p, _mm256_add_ps(r < 16 ? _mm256_setzero_ps() : _mm256_load_ps(a + p), v));
                }
            }
            lanes_tree(lane, L, w);
            for (size_t p = 0; p < w; p += F) {
                _mm256_store_ps(mean + p, _mm256_mul_ps(_mm256_load_ps(lane[0] + p), vinv));
                _mm256_store_ps(k + p, one);
            }
            if (norm->normalizeVariance) {
                for (size_t r = 0; r < count; ++r) {
                    float * a = lane[r % 16];
                    const size_t at = base + r * inner + p0;
                    for (size_t p = 0; p < w; p += F) {
                        __m256 d = maskz_sub(w - p, ldn(src, at + p, w - p, type), _mm256_load_ps(mean + p));
                        _mm256_store_ps(a + p, _mm256_fmadd_ps(d, d, r < 16 ? _mm256_setzero_ps() : _mm256_load_ps(a + p)));
                    }
                }
                lanes_tree(lane, L, w);
                for (size_t p = 0; p < w; p += F) {
                    __m256 v = _mm256_add_ps(_mm256_mul_ps(_mm256_load_ps(lane[0] + p), vinv), ve);
                    _mm256_store_ps(k + p, _mm256_div_ps(one, _mm256_sqrt_ps(v)));
                }
            }
            for (size_t r = 0; r < count; ++r) {
                const float * s = sp + r * sc.stride + p0 * sc.step, * b = bp + r * bi.stride + p0 * bi.step;
                const __m256 s0 = _mm256_set1_ps(s[0]), b0 = _mm256_set1_ps(b[0]);
                const size_t at = base + r * inner + p0;
                for (size_t p = 0; p < w; p += F) {
                    const size_t n = w - p;
                    __m256 d = _mm256_mul_ps(_mm256_sub_ps(ldn(src, at + p, n, type), _mm256_load_ps(mean + p)),
                                             _mm256_load_ps(k + p));
                    __m256 vs = sc.step ? ldpn(s + p, n) : s0, vb = bi.step ? ldpn(b + p, n) : b0;
                    __m256 y = _mm256_fmadd_ps(d, vs, vb);
                    stn(dst, at + p, n, act ? activate(y, act, norm->activationParams) : y, type);
                }
            }
        }
    }
}

void tn_avx2_NormalizationColumns(const void * src, size_t outer, size_t count, size_t inner,
                                  const TnNormalization * norm, void * dst)
{
    if (count == 0 || inner == 0)
        return;
    if (norm->type == TnTensorData32f)
        columns_typed(src, outer, count, inner, norm, dst, TnTensorData32f);
    else if (norm->type == TnTensorData16b)
        columns_typed(src, outer, count, inner, norm, dst, TnTensorData16b);
    else
        columns_typed(src, outer, count, inner, norm, dst, TnTensorData16f);
}
