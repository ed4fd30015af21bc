/*
 * Generic normalization (TensorRT INormalization, DirectML MVN1), AVX-512 level: the
 * operation sequence of gnorm_scalar.c (see gnorm.h) with 16-lane vectors.
 *
 * Rows: TN_GN_ROWS rows at a time; each row has one accumulator (lane i % 16 of the
 * canonical order is the vector lane), so the rows' serial reduction chains overlap. The
 * first pass streams the rows from memory; the variance and output passes find them in
 * L1/L2. The output is written row after row (one sequential stream).
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

INLINE void stm(void * p, size_t i, __mmask16 m, __m512 v, int type)
{
    v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_castsi512_ps(_mm512_set1_epi32(TN_GN_QNAN)));
    if (type == TnTensorData32f)
        _mm512_mask_storeu_ps((float *)p + i, m, v);
    else if (type == TnTensorData16b)
        tn_avx512_mask_store_bf16((uint16_t *)p + i, m, v);
    else
        _mm256_mask_storeu_epi16((uint16_t *)p + i, m, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

INLINE void st(void * p, size_t i, __m512 v, int type)
{
    v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_castsi512_ps(_mm512_set1_epi32(TN_GN_QNAN)));
    if (type == TnTensorData32f)
        _mm512_storeu_ps((float *)p + i, v);
    else if (type == TnTensorData16b)
        tn_avx512_store_bf16((uint16_t *)p + i, v);
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

/* Output of one row: y = act(fma((x - mean) * k, scale, bias)), segment by segment, while the
 * row at element `next` (the same row of the next block, or this row) is prefetched into L2,
 * so that the memory streams the next rows while this one is written. */
INLINE void output_row(const void * src, void * dst, size_t base, size_t next, size_t segments, size_t size, float mean,
                       float k, const float * sp, const TnNormalizationParam * sc, const float * bp,
                       const TnNormalizationParam * bi, const TnNormalization * norm, int type)
{
    const size_t es = tn_gn_size(type);
    const char * pf = (const char *)src + next * es;
    const __m512 m = _mm512_set1_ps(mean), vk = _mm512_set1_ps(k);
    const int act = norm->activation;
    const size_t body = size - size % F;
    const __mmask16 tail = tn_avx512_tail_mask(size % F);
    for (size_t j = 0; j < segments; ++j) {
        const float * s = sp + j * sc->stride, * b = bp + j * bi->stride;
        const size_t at = base + j * size;
        const __m512 s0 = _mm512_set1_ps(s[0]), b0 = _mm512_set1_ps(b[0]);
        size_t e = 0;
        if (act == TnActivationIdentity) {
            for (; e < body; e += F) {
                _mm_prefetch(pf + (j * size + e) * es, _MM_HINT_T1);
                __m512 d = _mm512_mul_ps(_mm512_sub_ps(ld(src, at + e, type), m), vk);
                __m512 vs = sc->step ? _mm512_loadu_ps(s + e) : s0, vb = bi->step ? _mm512_loadu_ps(b + e) : b0;
                st(dst, at + e, _mm512_fmadd_ps(d, vs, vb), type);
            }
        } else {
            for (; e < body; e += F) {
                _mm_prefetch(pf + (j * size + e) * es, _MM_HINT_T1);
                __m512 d = _mm512_mul_ps(_mm512_sub_ps(ld(src, at + e, type), m), vk);
                __m512 vs = sc->step ? _mm512_loadu_ps(s + e) : s0, vb = bi->step ? _mm512_loadu_ps(b + e) : b0;
                st(dst, at + e, activate(_mm512_fmadd_ps(d, vs, vb), act, norm->activationParams), type);
            }
        }
        if (tail) {
            __m512 d = _mm512_mul_ps(_mm512_sub_ps(ldm(src, at + e, tail, type), m), vk);
            __m512 vs = sc->step ? _mm512_maskz_loadu_ps(tail, s + e) : s0;
            __m512 vb = bi->step ? _mm512_maskz_loadu_ps(tail, b + e) : b0;
            __m512 y = _mm512_fmadd_ps(d, vs, vb);
            stm(dst, at + e, tail, act ? activate(y, act, norm->activationParams) : y, type);
        }
    }
}

/* R (<= TN_GN_ROWS) rows starting at row o. */
INLINE void rows_block(const void * src, size_t o, size_t R, size_t outer, size_t segments, size_t size,
                       const TnNormalizationParam * sc, const TnNormalizationParam * bi,
                       const TnNormalization * norm, void * dst, int type)
{
    const size_t n = segments * size, body = n - n % F;
    const __mmask16 tail = tn_avx512_tail_mask(n % F);
    const float inv = 1.0f / (float)n;
    __m512 a[TN_GN_ROWS];
    float mean[TN_GN_ROWS], k[TN_GN_ROWS];
    for (size_t r = 0; r < R; ++r)
        a[r] = _mm512_setzero_ps();
    for (size_t i = 0; i < body; i += F)
        for (size_t r = 0; r < R; ++r)
            a[r] = _mm512_add_ps(a[r], ld(src, (o + r) * n + i, type));
    if (tail)
        for (size_t r = 0; r < R; ++r)
            a[r] = _mm512_add_ps(a[r], ldm(src, (o + r) * n + body, tail, type));
    for (size_t r = 0; r < R; ++r) {
        mean[r] = tn_avx512_hsum(a[r]) * inv;
        k[r] = 1.0f;
    }
    if (norm->normalizeVariance) {
        __m512 m[TN_GN_ROWS];
        for (size_t r = 0; r < R; ++r) {
            a[r] = _mm512_setzero_ps();
            m[r] = _mm512_set1_ps(mean[r]);
        }
        for (size_t i = 0; i < body; i += F)
            for (size_t r = 0; r < R; ++r) {
                __m512 d = _mm512_sub_ps(ld(src, (o + r) * n + i, type), m[r]);
                a[r] = _mm512_fmadd_ps(d, d, a[r]);
            }
        if (tail)
            for (size_t r = 0; r < R; ++r) {
                __m512 d = _mm512_maskz_sub_ps(tail, ldm(src, (o + r) * n + body, tail, type), m[r]);
                a[r] = _mm512_fmadd_ps(d, d, a[r]);
            }
        for (size_t r = 0; r < R; ++r)
            k[r] = 1.0f / sqrtf(tn_avx512_hsum(a[r]) * inv + norm->eps);
    }
    for (size_t r = 0; r < R; ++r)
        output_row(src, dst, (o + r) * n, (o + r + R < outer ? o + r + R : o + r) * n, segments, size, mean[r], k[r],
                   tn_gn_row(sc, o + r), sc,
                   tn_gn_row(bi, o + r), bi, norm, type);
}

INLINE void rows_typed(const void * src, size_t outer, size_t segments, size_t size, const TnNormalization * norm,
                       void * dst, int type)
{
    const TnNormalizationParam sc = tn_gn_param(norm->scale, &tn_gn_one);
    const TnNormalizationParam bi = tn_gn_param(norm->bias, &tn_gn_zero);
    size_t o = 0;
    for (; o + TN_GN_ROWS <= outer; o += TN_GN_ROWS)
        rows_block(src, o, TN_GN_ROWS, outer, segments, size, &sc, &bi, norm, dst, type);
    for (; o < outer; ++o)
        rows_block(src, o, 1, outer, segments, size, &sc, &bi, norm, dst, type);
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
