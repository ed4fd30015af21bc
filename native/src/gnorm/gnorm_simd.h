/*
 * Generic normalization (TensorRT INormalization, DirectML MVN1), vector levels: the
 * operation sequence of gnorm/scalar.c (see gnorm.h), written once against the vector layer
 * (simd/README.md) and compiled by gnorm/avx512.c and gnorm/avx2.c. No include guard: the
 * level header comes first.
 *
 * Rows: one row at a time. The statistics take one pass over the row (sums of x - x0 and of
 * its squares, four accumulators each: the canonical 64 lanes), which brings the row into
 * L1/L2; the output pass finds it there. The statistics of the next row are computed before
 * the output of this one, and while a row is written the input TN_GN_AHEAD_BYTES further on
 * is prefetched (simd/prefetch.h), so the memory keeps streaming during the cache passes.
 * Rows that need scaling (gnorm.h) take a plain path.
 * Columns: positions in chunks of at most TN_GN_CHUNK; whole rows of a chunk are streamed
 * into 16 lane arrays (row r adds into lane r % 16), reduced with the canonical tree.
 */
#include "simd/prefetch.h"
#include "simd/reduce.h"
#include "simd/vmath.h"

#include "kernels.h"
#include "tensorops.h"
#include "gnorm.h"

#define F TN_LANES
#define INLINE static inline __attribute__((always_inline))

/* ---- Loads and stores of any type (element index i of p; _n: the first n lanes) ------------ */

INLINE vfloat ld(const void * p, size_t i, int type)
{
    if (type == TnTensorData32f)
        return v_load((const float *)p + i);
    if (type == TnTensorData16b)
        return v_load_bf16((const uint16_t *)p + i);
    return v_load_f16((const uint16_t *)p + i);
}

INLINE vfloat ldn(const void * p, size_t i, size_t n, int type)
{
    if (type == TnTensorData32f)
        return v_load_n((const float *)p + i, n);
    if (type == TnTensorData16b)
        return v_load_bf16_n((const uint16_t *)p + i, n);
    return v_load_f16_n((const uint16_t *)p + i, n);
}

INLINE vfloat canonical_nan(vfloat v) { return v_select(v_isnan(v), vi_as_float(vi_set1((int32_t)TN_GN_QNAN)), v); }

INLINE void stn(void * p, size_t i, size_t n, vfloat v, int type)
{
    v = canonical_nan(v);
    if (type == TnTensorData32f)
        v_store_n((float *)p + i, v, n);
    else if (type == TnTensorData16b)
        v_store_bf16_n((uint16_t *)p + i, v, n);
    else
        v_store_f16_n((uint16_t *)p + i, v, n);
}

/* A full vector; stream: a non-temporal store (FP32 at a 64-byte aligned address); hw:
 * v_hw_bf16(), BF16 converted by the CPU where it can (same bits). */
INLINE void st(void * p, size_t i, vfloat v, int type, int stream, int hw)
{
    v = canonical_nan(v);
    if (type == TnTensorData32f) {
        if (stream)
            v_stream((float *)p + i, v);
        else
            v_store((float *)p + i, v);
    } else if (type == TnTensorData16b) {
        v_store_bf16_hw((uint16_t *)p + i, v, hw);
    } else {
        v_store_f16((uint16_t *)p + i, v);
    }
}

/* ---- Activations (gnorm/scalar.c, operation for operation) ------------------------------- */

static vfloat expm1_v(vfloat y)
{
    const vfloat one = v_set1(1.0f);
    vfloat u = v_exp(y);
    vfloat um1 = v_sub(u, one);
    vfloat r = v_div(v_mul(um1, y), v_log(u));
    r = v_select(v_eq(u, one), y, r);
    r = v_select(v_eq(um1, v_set1(-1.0f)), v_set1(-1.0f), r);
    return v_select(v_eq(u, v_set1(INFINITY)), u, r);
}

static vfloat softplus_core_v(vfloat z)
{
    const vfloat one = v_set1(1.0f);
    vfloat u = v_exp(v_neg(v_abs(z)));
    vfloat w = v_add(one, u);
    vfloat l = v_mul(v_log(w), v_div(u, v_sub(w, one)));
    l = v_select(v_eq(w, one), u, l);
    return v_add(v_max(v_zero(), z), l);
}

static vfloat gelu_v(vfloat y)
{
    vfloat yy = v_mul(y, y);
    vfloat e2 = v_mul(v_fms(y, y, yy), v_set1(0.5f));
    vfloat t2 = v_mul(yy, v_set1(0.5f));
    vfloat t = v_mul(y, v_set1(TN_GN_RSQRT2));
    vfloat p = v_set1(TN_GN_ERF_P5);
    p = v_fma(p, t2, v_set1(TN_GN_ERF_P4));
    p = v_fma(p, t2, v_set1(TN_GN_ERF_P3));
    p = v_fma(p, t2, v_set1(TN_GN_ERF_P2));
    p = v_fma(p, t2, v_set1(TN_GN_ERF_P1));
    p = v_fma(p, t2, v_set1(TN_GN_ERF_P0));
    vfloat small = v_fma(v_set1(0.5f), v_mul(t, p), v_set1(0.5f));
    vfloat v = v_div(v_set1(1.0f), v_add(v_set1(1.0f), v_abs(t)));
    vfloat q = v_set1(TN_GN_ERFC_Q8);
    q = v_fma(q, v, v_set1(TN_GN_ERFC_Q7));
    q = v_fma(q, v, v_set1(TN_GN_ERFC_Q6));
    q = v_fma(q, v, v_set1(TN_GN_ERFC_Q5));
    q = v_fma(q, v, v_set1(TN_GN_ERFC_Q4));
    q = v_fma(q, v, v_set1(TN_GN_ERFC_Q3));
    q = v_fma(q, v, v_set1(TN_GN_ERFC_Q2));
    q = v_fma(q, v, v_set1(TN_GN_ERFC_Q1));
    q = v_fma(q, v, v_set1(TN_GN_ERFC_Q0));
    vfloat g = v_mul(v_exp(v_neg(t2)), q);
    g = v_fnma(g, e2, g);
    vfloat h = v_keep(v_lt(t2, v_set1(TN_GN_GELU_TINY)), v_mul(g, v_set1(0.5f)));
    vfloat big = v_select(v_gt(y, v_zero()), v_sub(v_set1(1.0f), h), h);
    return v_mul(y, v_select(v_lt(t2, v_set1(TN_GN_GELU_SMALL)), small, big));
}

static vfloat activate(vfloat y, int type, const float * prm)
{
    const vfloat a = v_set1(prm[0]), b = v_set1(prm[1]), zero = v_zero(), one = v_set1(1.0f);
    switch (type) {
    case TnActivationLinear: return v_fma(a, y, b);
    case TnActivationRelu: return v_max(zero, y);
    case TnActivationLeakyRelu: return v_select(v_ge(y, zero), y, v_mul(a, y));
    case TnActivationParametricSoftplus: return v_mul(a, softplus_core_v(v_mul(b, y)));
    case TnActivationElu: return v_select(v_ge(y, zero), y, v_mul(a, expm1_v(y)));
    case TnActivationCelu: return v_add(v_max(zero, y), v_min(zero, v_mul(a, expm1_v(v_div(y, a)))));
    case TnActivationScaledElu: return v_select(v_gt(y, zero), v_mul(b, y), v_mul(b, v_mul(a, expm1_v(y))));
    case TnActivationSigmoid: return v_div(one, v_add(one, v_exp(v_neg(y))));
    case TnActivationHardSigmoid: return v_max(zero, v_min(one, v_fma(a, y, b)));
    case TnActivationTanh: return v_tanh(y);
    case TnActivationScaledTanh: return v_mul(a, v_tanh(v_mul(b, y)));
    case TnActivationSoftplus: return v_div(softplus_core_v(v_mul(a, y)), a);
    case TnActivationSoftsign: return v_div(y, v_add(one, v_abs(y)));
    case TnActivationThresholdedRelu: return v_keep(v_gt(y, a), y);
    case TnActivationShrink: {
        vfloat r = v_keep(v_lt(y, v_neg(b)), v_add(y, a));
        return v_select(v_gt(y, b), v_sub(y, a), r);
    }
    case TnActivationGelu: return gelu_v(y);
    default: return y;
    }
}

/* ---- One output vector: y = act(fma((x * p - mean) * k, scale, bias)) ---------------------- */

/* The normalization of one row (or, per lane, of column positions). */
typedef struct {
    vfloat mean, k, p;
    int hw; /* v_hw_bf16() for the full-vector stores (st) */
} Norm;

/* n (<= F) values from element i; s, b: this vector's parameters (given: sstep, bstep). */
INLINE vfloat norm_vec(const void * src, size_t i, size_t n, Norm nm, int scaled, const float * s, int sstep, vfloat s0,
                       const float * b, int bstep, vfloat b0, const TnNormalization * norm, int act, int type)
{
    vfloat x = n >= F ? ld(src, i, type) : ldn(src, i, n, type);
    if (scaled)
        x = v_mul(x, nm.p);
    vfloat d = v_mul(v_sub(x, nm.mean), nm.k);
    vfloat vs = sstep ? (n >= F ? v_load(s) : v_load_n(s, n)) : s0;
    vfloat vb = bstep ? (n >= F ? v_load(b) : v_load_n(b, n)) : b0;
    vfloat y = v_fma(d, vs, vb);
    return act ? activate(y, norm->activation, norm->activationParams) : y;
}

/* ---- Rows ---------------------------------------------------------------------------------- */

/* `call` compiled once per dtype, TN_GN_TYPE a constant in each (the loads and stores fold). */
#define TN_GN_TYPED(call) \
    do { \
        if (norm->type == TnTensorData32f) { \
            enum { TN_GN_TYPE = TnTensorData32f }; \
            call; \
        } else if (norm->type == TnTensorData16b) { \
            enum { TN_GN_TYPE = TnTensorData16b }; \
            call; \
        } else { \
            enum { TN_GN_TYPE = TnTensorData16f }; \
            call; \
        } \
    } while (0)

/* Full vectors of one segment from position e while e + F <= size; returns the next e. */
INLINE size_t output_body(const void * src, void * dst, size_t at, size_t e, size_t size, const Norm * nm,
                          const float * s, size_t sstep, vfloat s0, const float * b, size_t bstep, vfloat b0,
                          v_cursor * pf, const TnNormalization * norm, int type, int act, int stream)
{
    const Norm nv = *nm;   /* in registers: the stores to dst could alias *nm */
    for (; e + F <= size; e += F) {
        v_cursor_step(pf);
        vfloat y = norm_vec(src, at + e, F, nv, 0, s + e, sstep != 0, s0, b + e, bstep != 0, b0, norm, act, type);
        st(dst, at + e, y, type, stream, nv.hw);
    }
    return e;
}

/* Values [e0, e1) of one segment: full vectors (streaming stores if `stream`, which needs
 * [e0, e1) to be whole aligned cache lines), then a partial one. */
INLINE void output_range(const void * src, void * dst, size_t at, size_t e0, size_t e1, const Norm * nm,
                         const float * s, size_t sstep, vfloat s0, const float * b, size_t bstep, vfloat b0,
                         v_cursor * pf, const TnNormalization * norm, int type, int stream)
{
    size_t e = norm->activation != TnActivationIdentity
                   ? (stream ? output_body(src, dst, at, e0, e1, nm, s, sstep, s0, b, bstep, b0, pf, norm, type, 1, 1)
                             : output_body(src, dst, at, e0, e1, nm, s, sstep, s0, b, bstep, b0, pf, norm, type, 1, 0))
                   : (stream ? output_body(src, dst, at, e0, e1, nm, s, sstep, s0, b, bstep, b0, pf, norm, type, 0, 1)
                             : output_body(src, dst, at, e0, e1, nm, s, sstep, s0, b, bstep, b0, pf, norm, type, 0, 0));
    if (e < e1)
        stn(dst, at + e, e1 - e,
            norm_vec(src, at + e, e1 - e, *nm, 0, s + e, sstep != 0, s0, b + e, bstep != 0, b0, norm, norm->activation,
                     type),
            type);
}

/* Output of one row, segment by segment, while the input further on is prefetched.
 * With `stream` (large FP32 outputs of long rows, see rows_typed) the whole 64-byte lines of each segment are written with streaming stores: no read for
 * ownership of those lines. A line is never written partly by streaming stores (that would
 * flush a partial write-combining buffer): the parts before the first and after the last
 * whole line use ordinary stores. */
INLINE void output_row(const void * src, void * dst, size_t base, v_cursor * pf, size_t segments, size_t size,
                       const Norm * nm, const float * sp, const TnNormalizationParam * sc, const float * bp,
                       const TnNormalizationParam * bi, const TnNormalization * norm, int type, int stream)
{
    const size_t es = tn_gn_size(type);
    for (size_t j = 0; j < segments; ++j) {
        const float *s = sp + j * sc->stride, *b = bp + j * bi->stride;
        const size_t at = base + j * size;
        const vfloat s0 = v_set1(s[0]), b0 = v_set1(b[0]);
        size_t e = 0;
        if (stream) {
            const uintptr_t a0 = (uintptr_t)dst + at * es, a1 = a0 + size * es;
            const uintptr_t l0 = (a0 + 63) & ~(uintptr_t)63, l1 = a1 & ~(uintptr_t)63;
            if (l1 > l0) {
                const size_t h = (l0 - a0) / es, t = (l1 - a0) / es;
                output_range(src, dst, at, 0, h, nm, s, sc->step, s0, b, bi->step, b0, pf, norm, type, 0);
                output_range(src, dst, at, h, t, nm, s, sc->step, s0, b, bi->step, b0, pf, norm, type, 1);
                e = t;
            }
        }
        output_range(src, dst, at, e, size, nm, s, sc->step, s0, b, bi->step, b0, pf, norm, type, 0);
    }
}

/* A scaled row (rare: extreme magnitudes): plain vectors, ordinary stores. */
static __attribute__((noinline)) void output_row_scaled(const void * src, void * dst, size_t base, size_t segments,
                                                        size_t size, const Norm * nm, const float * sp,
                                                        const TnNormalizationParam * sc, const float * bp,
                                                        const TnNormalizationParam * bi, const TnNormalization * norm,
                                                        int type)
{
    for (size_t j = 0; j < segments; ++j) {
        const float *s = sp + j * sc->stride, *b = bp + j * bi->stride;
        const size_t at = base + j * size;
        const vfloat s0 = v_set1(s[0]), b0 = v_set1(b[0]);
        for (size_t e = 0; e < size; e += F) {
            const size_t n = size - e < F ? size - e : F;
            stn(dst, at + e, n,
                norm_vec(src, at + e, n, *nm, 1, s + e, sc->step != 0, s0, b + e, bi->step != 0, b0, norm,
                         norm->activation, type),
                type);
        }
    }
}

/* y = x * p - c (x * p when scaled) in the first n lanes, +0 in the others. */
INLINE vfloat shifted(vfloat x, vfloat vp, vfloat vc, int scaled) { return v_sub(scaled ? v_mul(x, vp) : x, vc); }

/* Sums of y = x * p - c and of y^2 over the n values from element `at` in the canonical
 * 64-lane order (gnorm.h): element i goes to accumulator (i / 16) % 4, lane i % 16, block by
 * block of TN_GN_BLOCK values whose sums are added into totals; the totals are added as
 * (0 + 1) + (2 + 3), then the lanes as v_hsum does. */
INLINE void row_sums(const void * src, size_t at, size_t n, float c, float p, int scaled, int type, v_cursor * pf,
                     float * s1, float * s2)
{
    const vfloat vc = v_set1(c), vp = v_set1(p);
    vfloat t0 = v_zero(), t1 = t0, t2 = t0, t3 = t0, q0 = t0, q1 = t0, q2 = t0, q3 = t0;
    for (size_t b = 0; b < n; b += TN_GN_BLOCK) {
        const size_t bn = n - b < TN_GN_BLOCK ? n - b : TN_GN_BLOCK, bat = at + b;
        vfloat a0 = v_zero(), a1 = a0, a2 = a0, a3 = a0, e0 = a0, e1 = a0, e2 = a0, e3 = a0;
        size_t i = 0;
        for (; i + 4 * F <= bn; i += 4 * F) {
            v_cursor_step(pf);
            vfloat y0 = shifted(ld(src, bat + i, type), vp, vc, scaled);
            vfloat y1 = shifted(ld(src, bat + i + F, type), vp, vc, scaled);
            vfloat y2 = shifted(ld(src, bat + i + 2 * F, type), vp, vc, scaled);
            vfloat y3 = shifted(ld(src, bat + i + 3 * F, type), vp, vc, scaled);
            a0 = v_add(a0, y0), a1 = v_add(a1, y1), a2 = v_add(a2, y2), a3 = v_add(a3, y3);
            e0 = v_fma(y0, y0, e0), e1 = v_fma(y1, y1, e1), e2 = v_fma(y2, y2, e2), e3 = v_fma(y3, y3, e3);
        }
        /* The last (< 64) values: partial vectors into accumulators 0, 1, 2, 3 in turn. */
#define TN_GN_PART(a, e, j) \
    if (i + (j) * F < bn) { \
        const size_t k = bn - i - (j) * F; \
        vfloat y = v_keep(m_first(k), shifted(ldn(src, bat + i + (j) * F, k, type), vp, vc, scaled)); \
        a = v_add(a, y), e = v_fma(y, y, e); \
    }
        TN_GN_PART(a0, e0, 0)
        TN_GN_PART(a1, e1, 1)
        TN_GN_PART(a2, e2, 2)
        TN_GN_PART(a3, e3, 3)
#undef TN_GN_PART
        t0 = v_add(t0, a0), t1 = v_add(t1, a1), t2 = v_add(t2, a2), t3 = v_add(t3, a3);
        q0 = v_add(q0, e0), q1 = v_add(q1, e1), q2 = v_add(q2, e2), q3 = v_add(q3, e3);
    }
    *s1 = v_hsum(v_add(v_add(t0, t1), v_add(t2, t3)));
    *s2 = v_hsum(v_add(v_add(q0, q1), v_add(q2, q3)));
}

static __attribute__((noinline)) float row_amax(const void * src, size_t at, size_t n, int type)
{
    vfloat m = v_zero();
    for (size_t i = 0; i < n; i += F)
        m = v_max(m, v_abs(n - i >= F ? ld(src, at + i, type) : ldn(src, at + i, n - i, type)));
    return v_hmax(m);
}

/* The statistics of the row of n values from element `at` (gnorm.h). */
INLINE void row_stats(const void * src, size_t at, size_t n, const TnNormalization * norm, int type, TnGnStats * st,
                      v_cursor * pf)
{
    const size_t k = tn_lead_count(n);
    const vfloat lead = ldn(src, at, k, type);
    tn_gn_begin(st, v_hsum(lead) * (1.0f / (float)k), v_lane(lead, 0), n, norm->eps, norm->normalizeVariance);
    float s1, s2;
    row_sums(src, at, n, st->c, 1.0f, 0, type, pf, &s1, &s2);
    tn_gn_sums(st, s1, s2);
    while (st->next != TN_GN_DONE) {
        if (st->next == TN_GN_AMAX) {
            tn_gn_amax(st, row_amax(src, at, n, type));
        } else {
            if (st->scaled)
                row_sums(src, at, n, st->c, st->p, 1, type, pf, &s1, &s2);
            else
                row_sums(src, at, n, st->c, 1.0f, 0, type, pf, &s1, &s2);
            tn_gn_sums(st, s1, s2);
        }
    }
}

/* Rows one at a time, the statistics of the next row computed before the output of this one:
 * the latency of their reduction tree and square root overlaps with the output stores. While
 * a row is written, the input `ahead` elements further on is prefetched. */
INLINE void rows_typed(const void * src, size_t outer, size_t segments, size_t size, const TnNormalization * norm,
                       void * dst, int type)
{
    const TnNormalizationParam sc = tn_gn_param(norm->scale, &tn_gn_one);
    const TnNormalizationParam bi = tn_gn_param(norm->bias, &tn_gn_zero);
    const size_t es = tn_gn_size(type), n = segments * size, total = outer * n;
    const size_t ahead = n * es >= TN_GN_AHEAD_BYTES ? n : (TN_GN_AHEAD_BYTES / es + n - 1) / n * n;
    /* Streaming stores (no read for ownership of the output lines) pay off for long rows;
     * with short ones (layer norm over 768) they were slower than ordinary stores. */
    const int stream = type == TnTensorData32f && total * es >= TN_GN_STREAM_BYTES && n * es >= TN_GN_STREAM_ROW &&
                       (uintptr_t)dst % es == 0;
    const int hw = v_hw_bf16();
    TnGnStats cur, next;
    const char *const bytes = (const char *)src, *const last = bytes + total * es;
    v_cursor pf = {bytes + (ahead < total ? ahead : total) * es, bytes};
    pf.end = bytes + (ahead + n < total ? ahead + n : total) * es;
    row_stats(src, 0, n, norm, type, &cur, &pf);
    next = cur;
    for (size_t o = 0; o < outer; ++o) {
        const size_t at = o * n;
        pf.end = at + n + ahead + n <= total ? bytes + (at + n + ahead + n) * es : last;
        if (o + 1 < outer)
            row_stats(src, at + n, n, norm, type, &next, &pf);
        const Norm nm = {v_set1(cur.mean), v_set1(cur.k), v_set1(cur.p), hw};
        if (cur.scaled)
            output_row_scaled(src, dst, at, segments, size, &nm, tn_gn_row(&sc, o), &sc, tn_gn_row(&bi, o), &bi, norm,
                              type);
        else
            output_row(src, dst, at, &pf, segments, size, &nm, tn_gn_row(&sc, o), &sc, tn_gn_row(&bi, o), &bi, norm,
                       type, stream);
        cur = next;
    }
    if (stream)
        v_stream_fence();   /* the streaming stores are weakly ordered */
}

void TN_ISA(NormalizationRows)(const void * src, size_t outer, size_t segments, size_t segmentSize,
                               const TnNormalization * norm, void * dst)
{
    if (segments * segmentSize == 0)
        return;
    TN_GN_TYPED(rows_typed(src, outer, segments, segmentSize, norm, dst, TN_GN_TYPE));
}

/* ---- Columns ------------------------------------------------------------------------------- */

/* Per position of a chunk: the shift c, the scale p, and after the statistics mean and k. */
typedef struct {
    float c[TN_GN_CHUNK] __attribute__((aligned(64)));
    float p[TN_GN_CHUNK] __attribute__((aligned(64)));
    float mean[TN_GN_CHUNK] __attribute__((aligned(64)));
    float k[TN_GN_CHUNK] __attribute__((aligned(64)));
    float l1[16][TN_GN_CHUNK] __attribute__((aligned(64)));
    float l2[16][TN_GN_CHUNK] __attribute__((aligned(64)));
    TnGnStats st[TN_GN_CHUNK];
} Chunk;

/* Lane sums of y = x * p - c and y^2 over the count rows of a chunk of w positions. */
INLINE void columns_sums(const void * src, size_t base, size_t count, size_t inner, size_t p0, size_t w, Chunk * ch,
                         int scaled, int type)
{
    for (size_t r = 0; r < count; ++r) {
        float *a = ch->l1[r % 16], *e = ch->l2[r % 16];
        const size_t at = base + r * inner + p0;
        for (size_t p = 0; p < w; p += F) {
            const size_t n = w - p;
            vfloat y = n >= F ? shifted(ld(src, at + p, type), scaled ? v_load_aligned(ch->p + p) : v_zero(),
                                        v_load_aligned(ch->c + p), scaled)
                              : v_keep(m_first(n), shifted(ldn(src, at + p, n, type), v_load_aligned(ch->p + p),
                                                           v_load_aligned(ch->c + p), scaled));
            vfloat a0 = r < 16 ? v_zero() : v_load_aligned(a + p), e0 = r < 16 ? v_zero() : v_load_aligned(e + p);
            v_store_aligned(a + p, v_add(a0, y));
            v_store_aligned(e + p, v_fma(y, y, e0));
        }
    }
    const size_t L = count < 16 ? count : 16;
    v_lanes_tree(ch->l1[0], TN_GN_CHUNK, L, w);
    v_lanes_tree(ch->l2[0], TN_GN_CHUNK, L, w);
}

/* The statistics of a chunk: every position runs the steps of gnorm.h; a pass is made for
 * all positions whenever any of them needs it. */
INLINE void columns_stats(const void * src, size_t base, size_t count, size_t inner, size_t p0, size_t w, Chunk * ch,
                          const TnNormalization * norm, int type)
{
    const size_t k = tn_lead_count(count);
    for (size_t r = 0; r < k; ++r)
        for (size_t p = 0; p < w; p += F) {
            const size_t n = w - p, at = base + r * inner + p0 + p;
            v_store_aligned(ch->l1[r] + p, n >= F ? ld(src, at, type) : ldn(src, at, n, type));
        }
    for (size_t p = 0; p < w; p += F)
        v_store_aligned(ch->c + p, v_load_aligned(ch->l1[0] + p));   /* the first row */
    v_lanes_tree(ch->l1[0], TN_GN_CHUNK, k, w);
    for (size_t p = 0; p < w; p += F)
        v_store_aligned(ch->p + p, v_set1(1.0f));
    for (size_t p = 0; p < w; ++p)
        tn_gn_begin(&ch->st[p], ch->l1[0][p] * (1.0f / (float)k), ch->c[p], count, norm->eps, norm->normalizeVariance);
    for (size_t p = 0; p < w; ++p)
        ch->c[p] = ch->st[p].c;
    int scaled = 0;
    for (;;) {
        if (scaled)
            columns_sums(src, base, count, inner, p0, w, ch, 1, type);
        else
            columns_sums(src, base, count, inner, p0, w, ch, 0, type);
        int sums = 0, amax = 0;
        for (size_t p = 0; p < w; ++p) {
            TnGnStats * s = &ch->st[p];
            if (s->next == TN_GN_SUMS)
                tn_gn_sums(s, ch->l1[0][p], ch->l2[0][p]);
            amax |= s->next == TN_GN_AMAX;
        }
        if (amax) {   /* rare: extreme magnitudes, or an infinity or NaN */
            for (size_t p = 0; p < w; ++p) {
                if (ch->st[p].next != TN_GN_AMAX)
                    continue;
                vfloat m = v_zero();
                for (size_t r = 0; r < count; r += F) {
                    float t[F];
                    for (size_t l = 0; l < F; ++l)
                        t[l] = r + l < count ? v_lane(ldn(src, base + (r + l) * inner + p0 + p, 1, type), 0) : 0.0f;
                    m = v_max(m, v_abs(v_load(t)));
                }
                tn_gn_amax(&ch->st[p], v_hmax(m));
            }
            scaled = 1;
        }
        for (size_t p = 0; p < w; ++p) {
            const TnGnStats * s = &ch->st[p];
            sums |= s->next == TN_GN_SUMS;
            ch->c[p] = s->c, ch->p[p] = s->p, ch->mean[p] = s->mean, ch->k[p] = s->k;
        }
        if (!sums)
            return;
    }
}

INLINE void columns_typed(const void * src, size_t outer, size_t count, size_t inner, const TnNormalization * norm,
                          void * dst, int type)
{
    const TnNormalizationParam sc = tn_gn_param(norm->scale, &tn_gn_one);
    const TnNormalizationParam bi = tn_gn_param(norm->bias, &tn_gn_zero);
    const int act = norm->activation;
    size_t chunk = TN_GN_CHUNK_BYTES / (count * tn_gn_size(type));
    chunk = chunk >= TN_GN_CHUNK ? TN_GN_CHUNK : chunk < F ? F : chunk - chunk % F;
    Chunk ch;
    for (size_t o = 0; o < outer; ++o) {
        const size_t base = o * count * inner;
        const float *sp = tn_gn_row(&sc, o), *bp = tn_gn_row(&bi, o);
        for (size_t p0 = 0; p0 < inner; p0 += chunk) {
            const size_t w = inner - p0 < chunk ? inner - p0 : chunk;
            columns_stats(src, base, count, inner, p0, w, &ch, norm, type);
            int scaled = 0;
            for (size_t p = 0; p < w; ++p)
                scaled |= ch.st[p].scaled;
            for (size_t r = 0; r < count; ++r) {
                const float *s = sp + r * sc.stride + p0 * sc.step, *b = bp + r * bi.stride + p0 * bi.step;
                const vfloat s0 = v_set1(s[0]), b0 = v_set1(b[0]);
                const size_t at = base + r * inner + p0;
                for (size_t p = 0; p < w; p += F) {
                    const size_t n = w - p < F ? w - p : F;
                    const Norm nm = {v_load_aligned(ch.mean + p), v_load_aligned(ch.k + p), v_load_aligned(ch.p + p),
                                     0};
                    vfloat y = scaled ? norm_vec(src, at + p, n, nm, 1, s + p, sc.step != 0, s0, b + p, bi.step != 0,
                                                 b0, norm, act, type)
                                      : norm_vec(src, at + p, n, nm, 0, s + p, sc.step != 0, s0, b + p, bi.step != 0,
                                                 b0, norm, act, type);
                    stn(dst, at + p, n, y, type);
                }
            }
        }
    }
}

void TN_ISA(NormalizationColumns)(const void * src, size_t outer, size_t count, size_t inner,
                                  const TnNormalization * norm, void * dst)
{
    if (count == 0 || inner == 0)
        return;
    TN_GN_TYPED(columns_typed(src, outer, count, inner, norm, dst, TN_GN_TYPE));
}
