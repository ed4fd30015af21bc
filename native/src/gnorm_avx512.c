/*
 * Generic normalization (TensorRT INormalization, DirectML MVN1), AVX-512 level: the
 * operation sequence of gnorm_scalar.c (see gnorm.h) with 16-lane vectors.
 *
 * Rows: one row at a time. The sums use four accumulators (the canonical 64 lanes), so a
 * row has four independent chains; the first pass brings the row into L1/L2, the variance
 * and output passes find it there. While a row is written, the input TN_GN_AHEAD_BYTES
 * further on is prefetched into L2, so the memory keeps streaming during the cache passes.
 * Outputs of TN_GN_STREAM_BYTES or more use streaming stores (no read for ownership).
 * Columns: positions in chunks of at most TN_GN_CHUNK; whole rows of a chunk are streamed
 * into 16 lane arrays (row r adds into lane r % 16), reduced with the canonical tree.
 * Tails use masked loads and stores. FP16 converts with VCVTPH2PS / VCVTPS2PH (round to
 * nearest even), BF16 with the vmath helpers.
 */
#include "vmath_avx512.h"

#include "kernels.h"
#include "tensorops.h"
#include "gnorm.h"

#define F TN_AVX512_F
#define INLINE static inline __attribute__((always_inline))

/* The prefetch cursor of the rows kernel: lines from p up to end (exclusive) are still to be
 * prefetched into L2; every pass takes a step now and then, so the memory keeps streaming
 * the next rows while the current one is reduced and written. */
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

INLINE __mmask16 lanes(size_t n)
{
    return n >= F ? (__mmask16)0xffff : tn_avx512_tail_mask(n);
}

/* ---- Loads and stores of any type (element index i of p) -------------------------------- */

INLINE __m512 ld(const void * p, size_t i, int type)
{
    if (type == TnTensorData32f)
        return _mm512_loadu_ps((const float *)p + i);
    if (type == TnTensorData16b)
        return tn_avx512_load_bf16((const uint16_t *)p + i);
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
}

INLINE __m512 ldm(const void * p, size_t i, __mmask16 m, int type)
{
    if (type == TnTensorData32f)
        return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    if (type == TnTensorData16b)
        return tn_avx512_maskz_load_bf16(m, (const uint16_t *)p + i);
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
}

/* FP32 -> BF16 bits, round to nearest even, for values whose only NaN is the canonical one
 * (which it maps to 0x7FC0, as tn_f32_to_bf16 does): no NaN handling needed. */
INLINE __m256i to_bf16(__m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16));
}

INLINE void stm(void * p, size_t i, __mmask16 m, __m512 v, int type)
{
    v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_castsi512_ps(_mm512_set1_epi32(TN_GN_QNAN)));
    if (type == TnTensorData32f)
        _mm512_mask_storeu_ps((float *)p + i, m, v);
    else if (type == TnTensorData16b)
        _mm256_mask_storeu_epi16((uint16_t *)p + i, m, to_bf16(v));
    else
        _mm256_mask_storeu_epi16((uint16_t *)p + i, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

INLINE void st(void * p, size_t i, __m512 v, int type)
{
    v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_castsi512_ps(_mm512_set1_epi32(TN_GN_QNAN)));
    if (type == TnTensorData32f)
        _mm512_storeu_ps((float *)p + i, v);
    else if (type == TnTensorData16b)
        _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), to_bf16(v));
    else
        _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* ---- Activations (gnorm_scalar.c, operation for operation) -------------------------------- */

#define SET1 _mm512_set1_ps

INLINE __m512 vabs(__m512 v) { return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff))); }
INLINE __m512 vneg(__m512 v) { return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN))); }
INLINE __mmask16 cmp(__m512 a, __m512 b, int op) { return _mm512_cmp_ps_mask(a, b, op); }

static __m512 expm1_v(__m512 y)
{
    __m512 u = tn_avx512_exp(y);
    __m512 um1 = _mm512_sub_ps(u, SET1(1.0f));
    __m512 r = _mm512_div_ps(_mm512_mul_ps(um1, y), tn_avx512_log(u));
    r = _mm512_mask_mov_ps(r, cmp(u, SET1(1.0f), _CMP_EQ_OQ), y);
    r = _mm512_mask_mov_ps(r, cmp(um1, SET1(-1.0f), _CMP_EQ_OQ), SET1(-1.0f));
    return _mm512_mask_mov_ps(r, cmp(u, SET1(INFINITY), _CMP_EQ_OQ), u);
}

static __m512 softplus_core_v(__m512 z)
{
    __m512 u = tn_avx512_exp(vneg(vabs(z)));
    __m512 w = _mm512_add_ps(SET1(1.0f), u);
    __m512 l = _mm512_mul_ps(tn_avx512_log(w), _mm512_div_ps(u, _mm512_sub_ps(w, SET1(1.0f))));
    l = _mm512_mask_mov_ps(l, cmp(w, SET1(1.0f), _CMP_EQ_OQ), u);
    return _mm512_add_ps(_mm512_max_ps(_mm512_setzero_ps(), z), l);
}

static __m512 tanh_v(__m512 y)
{
    __m512 ax = vabs(y), z = _mm512_mul_ps(y, y);
    __m512 p = SET1(TN_GN_TANH_P4);
    p = _mm512_fmadd_ps(p, z, SET1(TN_GN_TANH_P3));
    p = _mm512_fmadd_ps(p, z, SET1(TN_GN_TANH_P2));
    p = _mm512_fmadd_ps(p, z, SET1(TN_GN_TANH_P1));
    p = _mm512_fmadd_ps(p, z, SET1(TN_GN_TANH_P0));
    __m512 small = _mm512_fmadd_ps(p, _mm512_mul_ps(y, z), y);
    __m512 e = tn_avx512_exp(_mm512_add_ps(ax, ax));
    __m512 big = _mm512_sub_ps(SET1(1.0f), _mm512_div_ps(SET1(2.0f), _mm512_add_ps(e, SET1(1.0f))));
    big = _mm512_or_ps(_mm512_and_ps(big, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff))),
                       _mm512_and_ps(y, _mm512_castsi512_ps(_mm512_set1_epi32(INT32_MIN))));
    return _mm512_mask_mov_ps(big, cmp(ax, SET1(TN_GN_TANH_SMALL), _CMP_LT_OQ), small);
}

static __m512 gelu_v(__m512 y)
{
    __m512 yy = _mm512_mul_ps(y, y);
    __m512 e2 = _mm512_mul_ps(_mm512_fmsub_ps(y, y, yy), SET1(0.5f));
    __m512 t2 = _mm512_mul_ps(yy, SET1(0.5f));
    __m512 t = _mm512_mul_ps(y, SET1(TN_GN_RSQRT2));
    __m512 p = SET1(TN_GN_ERF_P5);
    p = _mm512_fmadd_ps(p, t2, SET1(TN_GN_ERF_P4));
    p = _mm512_fmadd_ps(p, t2, SET1(TN_GN_ERF_P3));
    p = _mm512_fmadd_ps(p, t2, SET1(TN_GN_ERF_P2));
    p = _mm512_fmadd_ps(p, t2, SET1(TN_GN_ERF_P1));
    p = _mm512_fmadd_ps(p, t2, SET1(TN_GN_ERF_P0));
    __m512 small = _mm512_fmadd_ps(SET1(0.5f), _mm512_mul_ps(t, p), SET1(0.5f));
    __m512 v = _mm512_div_ps(SET1(1.0f), _mm512_add_ps(SET1(1.0f), vabs(t)));
    __m512 q = SET1(TN_GN_ERFC_Q8);
    q = _mm512_fmadd_ps(q, v, SET1(TN_GN_ERFC_Q7));
    q = _mm512_fmadd_ps(q, v, SET1(TN_GN_ERFC_Q6));
    q = _mm512_fmadd_ps(q, v, SET1(TN_GN_ERFC_Q5));
    q = _mm512_fmadd_ps(q, v, SET1(TN_GN_ERFC_Q4));
    q = _mm512_fmadd_ps(q, v, SET1(TN_GN_ERFC_Q3));
    q = _mm512_fmadd_ps(q, v, SET1(TN_GN_ERFC_Q2));
    q = _mm512_fmadd_ps(q, v, SET1(TN_GN_ERFC_Q1));
    q = _mm512_fmadd_ps(q, v, SET1(TN_GN_ERFC_Q0));
    __m512 g = _mm512_mul_ps(tn_avx512_exp(vneg(t2)), q);
    g = _mm512_fnmadd_ps(g, e2, g);
    __m512 h = _mm512_maskz_mov_ps(cmp(t2, SET1(TN_GN_GELU_TINY), _CMP_LT_OQ), _mm512_mul_ps(g, SET1(0.5f)));
    __m512 big = _mm512_mask_mov_ps(h, cmp(y, _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_sub_ps(SET1(1.0f), h));
    return _mm512_mul_ps(y, _mm512_mask_mov_ps(big, cmp(t2, SET1(TN_GN_GELU_SMALL), _CMP_LT_OQ), small));
}

static __m512 activate(__m512 y, int type, const float * prm)
{
    const __m512 a = SET1(prm[0]), b = SET1(prm[1]), zero = _mm512_setzero_ps(), one = SET1(1.0f);
    switch (type) {
    case TnActivationLinear:
        return _mm512_fmadd_ps(a, y, b);
    case TnActivationRelu:
        return _mm512_max_ps(zero, y);
    case TnActivationLeakyRelu:
        return _mm512_mask_mov_ps(_mm512_mul_ps(a, y), cmp(y, zero, _CMP_GE_OQ), y);
    case TnActivationParametricSoftplus:
        return _mm512_mul_ps(a, softplus_core_v(_mm512_mul_ps(b, y)));
    case TnActivationElu:
        return _mm512_mask_mov_ps(_mm512_mul_ps(a, expm1_v(y)), cmp(y, zero, _CMP_GE_OQ), y);
    case TnActivationCelu:
        return _mm512_add_ps(_mm512_max_ps(zero, y), _mm512_min_ps(zero, _mm512_mul_ps(a, expm1_v(_mm512_div_ps(y, a)))));
    case TnActivationScaledElu:
        return _mm512_mask_mov_ps(_mm512_mul_ps(b, _mm512_mul_ps(a, expm1_v(y))), cmp(y, zero, _CMP_GT_OQ),
                                  _mm512_mul_ps(b, y));
    case TnActivationSigmoid:
        return _mm512_div_ps(one, _mm512_add_ps(one, tn_avx512_exp(vneg(y))));
    case TnActivationHardSigmoid:
        return _mm512_max_ps(zero, _mm512_min_ps(one, _mm512_fmadd_ps(a, y, b)));
    case TnActivationTanh:
        return tanh_v(y);
    case TnActivationScaledTanh:
        return _mm512_mul_ps(a, tanh_v(_mm512_mul_ps(b, y)));
    case TnActivationSoftplus:
        return _mm512_div_ps(softplus_core_v(_mm512_mul_ps(a, y)), a);
    case TnActivationSoftsign:
        return _mm512_div_ps(y, _mm512_add_ps(one, vabs(y)));
    case TnActivationThresholdedRelu:
        return _mm512_maskz_mov_ps(cmp(y, a, _CMP_GT_OQ), y);
    case TnActivationShrink: {
        __m512 r = _mm512_maskz_mov_ps(cmp(y, vneg(b), _CMP_LT_OQ), _mm512_add_ps(y, a));
        return _mm512_mask_mov_ps(r, cmp(y, b, _CMP_GT_OQ), _mm512_sub_ps(y, a));
    }
    case TnActivationGelu:
        return gelu_v(y);
    default:
        return y;
    }
}

/* ---- Rows ---------------------------------------------------------------------------------- */

/* Streaming (non-temporal) store of a full vector at a vector-aligned address. */
INLINE void st_stream(void * p, size_t i, __m512 v, int type)
{
    v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_castsi512_ps(_mm512_set1_epi32(TN_GN_QNAN)));
    if (type == TnTensorData32f)
        _mm512_stream_ps((float *)p + i, v);
    else if (type == TnTensorData16b)
        _mm256_stream_si256((__m256i *)((uint16_t *)p + i), to_bf16(v));
    else
        _mm256_stream_si256((__m256i *)((uint16_t *)p + i), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* Full vectors of one segment from position e while e + F <= size; returns the next e. */
INLINE size_t output_body(const void * src, void * dst, size_t at, size_t e, size_t size, __m512 m, __m512 vk,
                          const float * s, size_t sstep, __m512 s0, const float * b, size_t bstep, __m512 b0,
                          Cursor * pf, const TnNormalization * norm, int type, int act, int stream)
{
    for (; e + F <= size; e += F) {
        pf_step(pf);
        __m512 d = _mm512_mul_ps(_mm512_sub_ps(ld(src, at + e, type), m), vk);
        __m512 vs = sstep ? _mm512_loadu_ps(s + e) : s0, vb = bstep ? _mm512_loadu_ps(b + e) : b0;
        __m512 y = _mm512_fmadd_ps(d, vs, vb);
        if (act)
            y = activate(y, norm->activation, norm->activationParams);
        if (stream)
            st_stream(dst, at + e, y, type);
        else
            st(dst, at + e, y, type);
    }
    return e;
}

/* The n (< F) values of one segment from position e, stored with a mask. */
INLINE void output_part(const void * src, void * dst, size_t at, size_t e, size_t n, __m512 m, __m512 vk,
                        const float * s, size_t sstep, __m512 s0, const float * b, size_t bstep, __m512 b0,
                        const TnNormalization * norm, int type)
{
    const __mmask16 t = tn_avx512_tail_mask(n);
    __m512 d = _mm512_mul_ps(_mm512_sub_ps(ldm(src, at + e, t, type), m), vk);
    __m512 vs = sstep ? _mm512_maskz_loadu_ps(t, s + e) : s0, vb = bstep ? _mm512_maskz_loadu_ps(t, b + e) : b0;
    __m512 y = _mm512_fmadd_ps(d, vs, vb);
    stm(dst, at + e, t, norm->activation ? activate(y, norm->activation, norm->activationParams) : y, type);
}

/* Values [e0, e1) of one segment: full vectors (streaming stores if `stream`, which needs
 * [e0, e1) to be whole aligned cache lines), then a masked part. */
INLINE void output_range(const void * src, void * dst, size_t at, size_t e0, size_t e1, __m512 m, __m512 vk,
                         const float * s, size_t sstep, __m512 s0, const float * b, size_t bstep, __m512 b0,
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
    const __m512 m = _mm512_set1_ps(mean), vk = _mm512_set1_ps(k);
    for (size_t j = 0; j < segments; ++j) {
        const float * s = sp + j * sc->stride, * b = bp + j * bi->stride;
        const size_t at = base + j * size;
        const __m512 s0 = _mm512_set1_ps(s[0]), b0 = _mm512_set1_ps(b[0]);
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
 * goes to accumulator (i / 16) % 4, lane i % 16, block by block of TN_GN_BLOCK values whose
 * sums are added into totals; the totals are added as (0 + 1) + (2 + 3), then the lanes as
 * tn_avx512_hsum does. sq: the sum of (x - m)^2 instead. */
INLINE float row_sum(const void * src, size_t at, size_t n, __m512 m, int sq, int type, Cursor * pf)
{
    __m512 t0 = _mm512_setzero_ps(), t1 = t0, t2 = t0, t3 = t0;
    for (size_t b = 0; b < n; b += TN_GN_BLOCK) {
        const size_t bn = n - b < TN_GN_BLOCK ? n - b : TN_GN_BLOCK, bat = at + b;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        size_t i = 0;
        for (; i + 4 * F <= bn; i += 4 * F) {
            pf_step(pf);
            __m512 x0 = ld(src, bat + i, type), x1 = ld(src, bat + i + F, type);
            __m512 x2 = ld(src, bat + i + 2 * F, type), x3 = ld(src, bat + i + 3 * F, type);
            if (sq) {
                x0 = _mm512_sub_ps(x0, m), x1 = _mm512_sub_ps(x1, m), x2 = _mm512_sub_ps(x2, m), x3 = _mm512_sub_ps(x3, m);
                a0 = _mm512_fmadd_ps(x0, x0, a0), a1 = _mm512_fmadd_ps(x1, x1, a1);
                a2 = _mm512_fmadd_ps(x2, x2, a2), a3 = _mm512_fmadd_ps(x3, x3, a3);
            } else {
                a0 = _mm512_add_ps(a0, x0), a1 = _mm512_add_ps(a1, x1), a2 = _mm512_add_ps(a2, x2), a3 = _mm512_add_ps(a3, x3);
            }
        }
        /* The last (< 64) values: masked vectors into accumulators 0, 1, 2, 3 in turn. */
#define TN_GN_PART(a, j) \
        if (i + (j) * F < bn) { \
            __mmask16 t = lanes(bn - i - (j) * F); \
            __m512 x = ldm(src, bat + i + (j) * F, t, type); \
            if (sq) { \
                x = _mm512_maskz_sub_ps(t, x, m); \
                a = _mm512_fmadd_ps(x, x, a); \
            } else { \
                a = _mm512_add_ps(a, x); \
            } \
        }
        TN_GN_PART(a0, 0) TN_GN_PART(a1, 1) TN_GN_PART(a2, 2) TN_GN_PART(a3, 3)
#undef TN_GN_PART
        t0 = _mm512_add_ps(t0, a0), t1 = _mm512_add_ps(t1, a1), t2 = _mm512_add_ps(t2, a2), t3 = _mm512_add_ps(t3, a3);
    }
    return tn_avx512_hsum(_mm512_add_ps(_mm512_add_ps(t0, t1), _mm512_add_ps(t2, t3)));
}

/* Mean and k of the row of n values from element `at` (two passes: the first brings the
 * row into L1 or L2, the second finds it there). */
INLINE void row_stats(const void * src, size_t at, size_t n, const TnNormalization * norm, int type, float * mean,
                      float * k, Cursor * pf)
{
    const float inv = 1.0f / (float)n;
    *mean = row_sum(src, at, n, _mm512_setzero_ps(), 0, type, pf) * inv;
    *k = 1.0f;
    if (norm->normalizeVariance)
        *k = 1.0f / sqrtf(row_sum(src, at, n, _mm512_set1_ps(*mean), 1, type, pf) * inv + norm->eps);
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

void tn_avx512_NormalizationRows(const void * src, size_t outer, size_t segments, size_t segmentSize,
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
            _mm512_store_ps(lane[i] + p, _mm512_add_ps(_mm512_load_ps(lane[i] + p), _mm512_load_ps(lane[i + 8] + p)));
    size_t L1 = L < 8 ? L : 8;
    for (size_t i = 0; i < 4 && i + 4 < L1; ++i)
        for (size_t p = 0; p < w; p += F)
            _mm512_store_ps(lane[i] + p, _mm512_add_ps(_mm512_load_ps(lane[i] + p), _mm512_load_ps(lane[i + 4] + p)));
    size_t L2 = L1 < 4 ? L1 : 4;
    for (size_t i = 0; i < 2 && i + 2 < L2; ++i)
        for (size_t p = 0; p < w; p += F)
            _mm512_store_ps(lane[i] + p, _mm512_add_ps(_mm512_load_ps(lane[i] + p), _mm512_load_ps(lane[i + 2] + p)));
    if (L2 > 1)
        for (size_t p = 0; p < w; p += F)
            _mm512_store_ps(lane[0] + p, _mm512_add_ps(_mm512_load_ps(lane[0] + p), _mm512_load_ps(lane[1] + p)));
}

INLINE void columns_typed(const void * src, size_t outer, size_t count, size_t inner, const TnNormalization * norm,
                          void * dst, int type)
{
    const TnNormalizationParam sc = tn_gn_param(norm->scale, &tn_gn_one);
    const TnNormalizationParam bi = tn_gn_param(norm->bias, &tn_gn_zero);
    const size_t L = count < 16 ? count : 16;
    const int act = norm->activation;
    const __m512 vinv = _mm512_set1_ps(1.0f / (float)count), ve = _mm512_set1_ps(norm->eps), one = _mm512_set1_ps(1.0f);
    size_t chunk = TN_GN_CHUNK_BYTES / (count * tn_gn_size(type));
    chunk = chunk >= TN_GN_CHUNK ? TN_GN_CHUNK : chunk < F ? F : chunk - chunk % F;
    float lane[16][TN_GN_CHUNK] __attribute__((aligned(64)));
    float mean[TN_GN_CHUNK] __attribute__((aligned(64)));
    float k[TN_GN_CHUNK] __attribute__((aligned(64)));
    for (size_t o = 0; o < outer; ++o) {
        const size_t base = o * count * inner;
        const float * sp = tn_gn_row(&sc, o), * bp = tn_gn_row(&bi, o);
        for (size_t p0 = 0; p0 < inner; p0 += chunk) {
            const size_t w = inner - p0 < chunk ? inner - p0 : chunk;
            for (size_t r = 0; r < count; ++r) {
                float * a = lane[r % 16];
                const size_t at = base + r * inner + p0;
                for (size_t p = 0; p < w; p += F) {
                    __m512 v = ldm(src, at + p, lanes(w - p), type);
                    _mm512_store_ps(a + p, _mm512_add_ps(r < 16 ? _mm512_setzero_ps() : _mm512_load_ps(a + p), v));
                }
            }
            lanes_tree(lane, L, w);
            for (size_t p = 0; p < w; p += F) {
                _mm512_store_ps(mean + p, _mm512_mul_ps(_mm512_load_ps(lane[0] + p), vinv));
                _mm512_store_ps(k + p, one);
            }
            if (norm->normalizeVariance) {
                for (size_t r = 0; r < count; ++r) {
                    float * a = lane[r % 16];
                    const size_t at = base + r * inner + p0;
                    for (size_t p = 0; p < w; p += F) {
                        __mmask16 m = lanes(w - p);
                        __m512 d = _mm512_maskz_sub_ps(m, ldm(src, at + p, m, type), _mm512_load_ps(mean + p));
                        _mm512_store_ps(a + p, _mm512_fmadd_ps(d, d, r < 16 ? _mm512_setzero_ps() : _mm512_load_ps(a + p)));
                    }
                }
                lanes_tree(lane, L, w);
                for (size_t p = 0; p < w; p += F) {
                    __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_load_ps(lane[0] + p), vinv), ve);
                    _mm512_store_ps(k + p, _mm512_div_ps(one, _mm512_sqrt_ps(v)));
                }
            }
            for (size_t r = 0; r < count; ++r) {
                const float * s = sp + r * sc.stride + p0 * sc.step, * b = bp + r * bi.stride + p0 * bi.step;
                const __m512 s0 = _mm512_set1_ps(s[0]), b0 = _mm512_set1_ps(b[0]);
                const size_t at = base + r * inner + p0;
                for (size_t p = 0; p < w; p += F) {
                    __mmask16 m = lanes(w - p);
                    __m512 d = _mm512_mul_ps(_mm512_sub_ps(ldm(src, at + p, m, type), _mm512_load_ps(mean + p)),
                                             _mm512_load_ps(k + p));
                    __m512 vs = sc.step ? _mm512_maskz_loadu_ps(m, s + p) : s0;
                    __m512 vb = bi.step ? _mm512_maskz_loadu_ps(m, b + p) : b0;
                    __m512 y = _mm512_fmadd_ps(d, vs, vb);
                    stm(dst, at + p, m, act ? activate(y, act, norm->activationParams) : y, type);
                }
            }
        }
    }
}

void tn_avx512_NormalizationColumns(const void * src, size_t outer, size_t count, size_t inner,
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
