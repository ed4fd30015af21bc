/*
 * Generic normalization (TensorRT INormalization, DirectML MVN1), scalar level: the
 * reference of the operation sequence every level follows (see gnorm.h).
 *
 * Rows: src is (outer, segments, segmentSize); each row of n = segments * segmentSize values
 * is normalized over itself (layer norm over trailing axes, instance norm per (n, c), group
 * norm per (n, group) with per-channel parameters changing from segment to segment).
 * Columns: src is (outer, count, inner); each (outer, inner) position is normalized over
 * the count rows (a reduced block followed by kept axes: NCHW layer norm over channels).
 * Neither kernel needs scratch memory. FP16 is converted in software here, with exactly the
 * results of F16C (round to nearest even, denormals kept, NaN made quiet).
 */
#include "vmath_scalar.h"

#include "kernels.h"
#include "tensorops.h"
#include "gnorm.h"

/* ---- FP16 <-> FP32 ----------------------------------------------------------------------- */

static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0)   /* zero or denormal: m * 2^-24, exact */
        return tn_bits_f32(sign | tn_f32_bits((float)m * 0x1p-24f));
    if (e == 31)  /* infinity, or NaN made quiet */
        return tn_bits_f32(sign | 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0));
    return tn_bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

static inline uint16_t f32_to_f16(float f)
{
    uint32_t u = tn_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)                    /* NaN: quiet, the payload's top bits kept */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u)                   /* rounds to 65536 or more: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {                  /* below 2^-14: a denormal (or zero) result */
        float r = nearbyintf(tn_bits_f32(a) * 0x1p24f);   /* exact scaling, then RNE */
        return (uint16_t)(sign | (uint16_t)r);
    }
    a += 0xfffu + ((a >> 13) & 1u);         /* RNE on the 13 dropped bits; a carry bumps the exponent */
    return (uint16_t)(sign | ((a >> 13) - (112u << 10)));
}

static inline float load1(const void * p, size_t i, int type)
{
    if (type == TnTensorData32f)
        return ((const float *)p)[i];
    if (type == TnTensorData16b)
        return tn_bf16_to_f32(((const uint16_t *)p)[i]);
    return f16_to_f32(((const uint16_t *)p)[i]);
}

static inline void store1(void * p, size_t i, float v, int type)
{
    if (v != v)
        v = tn_bits_f32(TN_GN_QNAN);
    if (type == TnTensorData32f)
        ((float *)p)[i] = v;
    else if (type == TnTensorData16b)
        ((uint16_t *)p)[i] = tn_f32_to_bf16(v);
    else
        ((uint16_t *)p)[i] = f32_to_f16(v);
}

/* ---- Activations ------------------------------------------------------------------------- */

static inline float vmin(float a, float b) { return a < b ? a : b; }
static inline float vmax(float a, float b) { return a > b ? a : b; }

static float expm1_f32(float y)
{
    float u = tn_exp_f32(y);
    float um1 = u - 1.0f;
    float r = um1 * y / tn_log_f32(u);
    if (u == 1.0f)
        r = y;
    if (um1 == -1.0f)
        r = -1.0f;
    if (u == INFINITY)
        r = u;
    return r;
}

static float softplus_core(float z)
{
    float u = tn_exp_f32(-fabsf(z));
    float w = 1.0f + u;
    float l = tn_log_f32(w) * (u / (w - 1.0f));
    if (w == 1.0f)
        l = u;
    return vmax(0.0f, z) + l;
}

static float gelu_f32(float y)
{
    float yy = y * y;
    float e2 = fmaf(y, y, -yy) * 0.5f;    /* t^2 = yy / 2 + e2 exactly */
    float t2 = yy * 0.5f;
    float t = y * TN_GN_RSQRT2;
    float p = TN_GN_ERF_P5;
    p = fmaf(p, t2, TN_GN_ERF_P4);
    p = fmaf(p, t2, TN_GN_ERF_P3);
    p = fmaf(p, t2, TN_GN_ERF_P2);
    p = fmaf(p, t2, TN_GN_ERF_P1);
    p = fmaf(p, t2, TN_GN_ERF_P0);
    float small = fmaf(0.5f, t * p, 0.5f);
    float v = 1.0f / (1.0f + fabsf(t));
    float q = TN_GN_ERFC_Q8;
    q = fmaf(q, v, TN_GN_ERFC_Q7);
    q = fmaf(q, v, TN_GN_ERFC_Q6);
    q = fmaf(q, v, TN_GN_ERFC_Q5);
    q = fmaf(q, v, TN_GN_ERFC_Q4);
    q = fmaf(q, v, TN_GN_ERFC_Q3);
    q = fmaf(q, v, TN_GN_ERFC_Q2);
    q = fmaf(q, v, TN_GN_ERFC_Q1);
    q = fmaf(q, v, TN_GN_ERFC_Q0);
    float g = tn_exp_f32(-t2) * q;
    g = fmaf(-g, e2, g);
    float h = g * 0.5f;                   /* erfc(|t|) / 2 */
    if (!(t2 < TN_GN_GELU_TINY))
        h = 0.0f;
    float big = y > 0.0f ? 1.0f - h : h;
    return y * (t2 < TN_GN_GELU_SMALL ? small : big);
}

static float activate(float y, int type, const float * p)
{
    switch (type) {
    case TnActivationLinear: return fmaf(p[0], y, p[1]);
    case TnActivationRelu: return vmax(0.0f, y);
    case TnActivationLeakyRelu: return y >= 0.0f ? y : p[0] * y;
    case TnActivationParametricSoftplus: return p[0] * softplus_core(p[1] * y);
    case TnActivationElu: return y >= 0.0f ? y : p[0] * expm1_f32(y);
    case TnActivationCelu: return vmax(0.0f, y) + vmin(0.0f, p[0] * expm1_f32(y / p[0]));
    case TnActivationScaledElu: return y > 0.0f ? p[1] * y : p[1] * (p[0] * expm1_f32(y));
    case TnActivationSigmoid: return 1.0f / (1.0f + tn_exp_f32(-y));
    case TnActivationHardSigmoid: return vmax(0.0f, vmin(1.0f, fmaf(p[0], y, p[1])));
    case TnActivationTanh: return tn_tanh_f32(y);
    case TnActivationScaledTanh: return p[0] * tn_tanh_f32(p[1] * y);
    case TnActivationSoftplus: return softplus_core(p[0] * y) / p[0];
    case TnActivationSoftsign: return y / (1.0f + fabsf(y));
    case TnActivationThresholdedRelu: return y > p[0] ? y : 0.0f;
    case TnActivationShrink: return y > p[1] ? y - p[0] : (y < -p[1] ? y + p[0] : 0.0f);
    case TnActivationGelu: return gelu_f32(y);
    default: return y;
    }
}

/* ---- Reductions -------------------------------------------------------------------------- */

/* The canonical 64-lane sum (gnorm.h): lanes l, 16 + l, 32 + l, 48 + l added as
 * (0 + 1) + (2 + 3), then the 16 lanes as v_hsum does. */
static float hsum64(const float * l)
{
    float g[16];
    for (int i = 0; i < 16; ++i)
        g[i] = (l[i] + l[i + 16]) + (l[i + 32] + l[i + 48]);
    return tn_sum16(g);
}

/* Sums of y = x * p - c (x * p only when scaled) and of y^2 over the n values from element
 * `at`, in the canonical 64-lane order, block by block of TN_GN_BLOCK values whose lane sums
 * are added into lane totals. */
static void row_sums(const void * src, size_t at, size_t n, const TnGnStats * st, int type, float * s1, float * s2)
{
    float t1[64] = {0}, t2[64] = {0}, a1[64], a2[64];
    for (size_t b = 0; b < n; b += TN_GN_BLOCK) {
        const size_t bn = n - b < TN_GN_BLOCK ? n - b : TN_GN_BLOCK;
        for (int l = 0; l < 64; ++l)
            a1[l] = a2[l] = 0.0f;
        for (size_t i = 0; i < bn; ++i) {
            float x = load1(src, at + b + i, type);
            float y = (st->scaled ? x * st->p : x) - st->c;
            a1[i % 64] += y;
            a2[i % 64] = fmaf(y, y, a2[i % 64]);
        }
        for (int l = 0; l < 64; ++l)
            t1[l] += a1[l], t2[l] += a2[l];
    }
    *s1 = hsum64(t1), *s2 = hsum64(t2);
}

static float row_amax(const void * src, size_t at, size_t n, int type)
{
    float m = 0.0f;
    for (size_t i = 0; i < n; ++i)
        m = vmax(m, fabsf(load1(src, at + i, type)));
    return m;
}

/* ---- Rows ---------------------------------------------------------------------------------- */

void tn_scalar_NormalizationRows(const void * src, size_t outer, size_t segments, size_t segmentSize,
                                 const TnNormalization * norm, void * dst)
{
    const size_t n = segments * segmentSize;
    const int type = norm->type, act = norm->activation;
    const TnNormalizationParam sc = tn_gn_param(norm->scale, &tn_gn_one);
    const TnNormalizationParam bi = tn_gn_param(norm->bias, &tn_gn_zero);
    if (n == 0)
        return;
    for (size_t o = 0; o < outer; ++o) {
        const size_t base = o * n;
        TnGnStats st;
        const size_t k = tn_lead_count(n);
        float lead[16] = {0};
        for (size_t i = 0; i < k; ++i)
            lead[i] = load1(src, base + i, type);
        tn_gn_begin(&st, tn_sum16(lead) * (1.0f / (float)k), lead[0], n, norm->eps, norm->normalizeVariance);
        while (st.next != TN_GN_DONE) {
            if (st.next == TN_GN_AMAX) {
                tn_gn_amax(&st, row_amax(src, base, n, type));
            } else {
                float s1, s2;
                row_sums(src, base, n, &st, type, &s1, &s2);
                tn_gn_sums(&st, s1, s2);
            }
        }
        const float *sp = tn_gn_row(&sc, o), *bp = tn_gn_row(&bi, o);
        for (size_t j = 0; j < segments; ++j) {
            const float *s = sp + j * sc.stride, *b = bp + j * bi.stride;
            for (size_t e = 0; e < segmentSize; ++e) {
                size_t i = base + j * segmentSize + e;
                float x = load1(src, i, type);
                float d = (st.scaled ? x * st.p : x) - st.mean;
                float y = fmaf(d * st.k, s[e * sc.step], b[e * bi.step]);
                store1(dst, i, act ? activate(y, act, norm->activationParams) : y, type);
            }
        }
    }
}

/* ---- Columns ------------------------------------------------------------------------------- */

/* The statistics of positions [p0, p0 + w) of one outer item: every position runs the steps
 * of gnorm.h; a pass is made for all positions whenever any of them needs it. */
static void columns_stats(const void * src, size_t base, size_t count, size_t inner, size_t p0, size_t w,
                          const TnNormalization * norm, int type, TnGnStats * st)
{
    float l1[16][TN_GN_CHUNK], l2[16][TN_GN_CHUNK];   /* 32 KB of stack */
    const size_t L = count < 16 ? count : 16, k = tn_lead_count(count);
    for (size_t r = 0; r < k; ++r)
        for (size_t p = 0; p < w; ++p)
            l1[r][p] = load1(src, base + r * inner + p0 + p, type);
    tn_lanes_tree(l1[0], TN_GN_CHUNK, k, w);
    for (size_t p = 0; p < w; ++p)
        tn_gn_begin(&st[p], l1[0][p] * (1.0f / (float)k), load1(src, base + p0 + p, type), count, norm->eps,
                    norm->normalizeVariance);
    for (;;) {
        int sums = 0, amax = 0;
        for (size_t p = 0; p < w; ++p)
            sums |= st[p].next == TN_GN_SUMS, amax |= st[p].next == TN_GN_AMAX;
        if (!sums && !amax)
            return;
        if (amax) {
            for (size_t p = 0; p < w; ++p) {
                if (st[p].next != TN_GN_AMAX)
                    continue;
                float m = 0.0f;
                for (size_t r = 0; r < count; ++r)
                    m = vmax(m, fabsf(load1(src, base + r * inner + p0 + p, type)));
                tn_gn_amax(&st[p], m);
            }
            continue;
        }
        for (size_t r = 0; r < count; ++r) {
            for (size_t p = 0; p < w; ++p) {
                float x = load1(src, base + r * inner + p0 + p, type);
                float y = (st[p].scaled ? x * st[p].p : x) - st[p].c;
                l1[r % 16][p] = (r < 16 ? 0.0f : l1[r % 16][p]) + y;
                l2[r % 16][p] = fmaf(y, y, r < 16 ? 0.0f : l2[r % 16][p]);
            }
        }
        tn_lanes_tree(l1[0], TN_GN_CHUNK, L, w);
        tn_lanes_tree(l2[0], TN_GN_CHUNK, L, w);
        for (size_t p = 0; p < w; ++p)
            if (st[p].next == TN_GN_SUMS)
                tn_gn_sums(&st[p], l1[0][p], l2[0][p]);
    }
}

void tn_scalar_NormalizationColumns(const void * src, size_t outer, size_t count, size_t inner,
                                    const TnNormalization * norm, void * dst)
{
    const int type = norm->type, act = norm->activation;
    const TnNormalizationParam sc = tn_gn_param(norm->scale, &tn_gn_one);
    const TnNormalizationParam bi = tn_gn_param(norm->bias, &tn_gn_zero);
    TnGnStats st[TN_GN_CHUNK];
    if (count == 0 || inner == 0)
        return;
    for (size_t o = 0; o < outer; ++o) {
        const size_t base = o * count * inner;
        const float *sp = tn_gn_row(&sc, o), *bp = tn_gn_row(&bi, o);
        for (size_t p0 = 0; p0 < inner; p0 += TN_GN_CHUNK) {
            const size_t w = inner - p0 < TN_GN_CHUNK ? inner - p0 : TN_GN_CHUNK;
            columns_stats(src, base, count, inner, p0, w, norm, type, st);
            for (size_t r = 0; r < count; ++r) {
                const float *s = sp + r * sc.stride + p0 * sc.step, *b = bp + r * bi.stride + p0 * bi.step;
                for (size_t p = 0; p < w; ++p) {
                    size_t i = base + r * inner + p0 + p;
                    float x = load1(src, i, type);
                    float d = (st[p].scaled ? x * st[p].p : x) - st[p].mean;
                    float y = fmaf(d * st[p].k, s[p * sc.step], b[p * bi.step]);
                    store1(dst, i, act ? activate(y, act, norm->activationParams) : y, type);
                }
            }
        }
    }
}
