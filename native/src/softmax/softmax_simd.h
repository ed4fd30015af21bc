/*
 * Softmax along the count axis (SynetSoftmax32f, SynetSoftmax16b), written once against the
 * vector layer (simd/README.md) and compiled by avx512.c and avx2.c. It follows the
 * operation sequence of scalar.c (see there), so FP32 and BF16 results are bit-identical
 * on every level. BF16 takes the cheaper exp of softmax_exp.h (docs/kernels.md).
 *
 * inner == 1: a row is contiguous. Rows of up to 16 * SM_REG_V elements are read once into
 *   registers (max, exp and 16-lane sum, scale), BF16 ones two at a time; longer ones take
 *   three passes while the row sits in L1 (max; exp, kept and summed; scale by 1 / sum).
 *   Runs of at least 16 rows shorter than 16 are transposed so that each lane holds one row.
 * 1 < inner < SM_FLAT_INNER: the contiguous slab is walked in periods of lcm(inner, 16)
 *   elements with one accumulator per lane of the period.
 * inner >= SM_FLAT_INNER: vectors run along inner; a block of up to four vectors of columns
 *   is walked over count with stride inner, one sequential sum per column.
 */
#include <stdlib.h>

#include "kernels.h"
#include "simd/vmath.h"
#include "softmax_exp.h"

#define SM_STACK_FLOATS 4096 /* BF16 scratch up to this size lives on the stack */
#define SM_BF16_NAN 0x7fc0u
#define SM_FLAT_INNER 16
#define SM_FLAT_MAX 240 /* lcm(inner, 16) for inner < SM_FLAT_INNER */
#define SM_REG_V 16     /* rows of up to 16 * SM_REG_V elements stay in registers */
#define SM_ROWS_MAX 15  /* rows this short go 16 at a time, one per lane */

/* Element i of fp32 (bf == 0) or BF16 (bf == 1) data; the _n forms touch the first
 * min(n, 16) elements only (the other lanes read as +0). */
V_INLINE vfloat sm_ld(const void * p, size_t i, int bf)
{
    return bf ? v_load_bf16((const uint16_t *)p + i) : v_load((const float *)p + i);
}

V_INLINE vfloat sm_ld_n(const void * p, size_t i, size_t n, int bf)
{
    return bf ? v_load_bf16_n((const uint16_t *)p + i, n) : v_load_n((const float *)p + i, n);
}

/* hw = v_hw_bf16(), read once per call. */
V_INLINE void sm_st(void * p, size_t i, vfloat v, int bf, int hw)
{
    if (bf)
        v_store_bf16_hw((uint16_t *)p + i, v, hw);
    else
        v_store((float *)p + i, v);
}

V_INLINE void sm_st_n(void * p, size_t i, vfloat v, size_t n, int bf, int hw)
{
    if (bf && n >= 16)
        v_store_bf16_hw((uint16_t *)p + i, v, hw);
    else if (bf)
        v_store_bf16_n((uint16_t *)p + i, v, n);
    else
        v_store_n((float *)p + i, v, n);
}

/* The steps of sm_exp_bf16_scalar (softmax_exp.h) up to the polynomial: s = d log2(e) +
 * SM_ROUND (n = round(d log2(e)) in its low bits), p = 2^f. */
V_INLINE vfloat sm_exp2_frac(vfloat d, vfloat * s)
{
    *s = v_fma(d, v_set1(SM_LOG2E), v_set1(SM_ROUND));
    vfloat f = v_fms(d, v_set1(SM_LOG2E), v_sub(*s, v_set1(SM_ROUND)));
    vfloat p = v_set1(SM_EXP2_P3);
    p = v_fma(p, f, v_set1(SM_EXP2_P2));
    p = v_fma(p, f, v_set1(SM_EXP2_P1));
    return v_fma(p, f, v_set1(SM_EXP2_P0));
}

/* sm_exp_bf16_scalar, operation for operation. */
V_INLINE vfloat sm_exp_bf16(vfloat d)
{
    vfloat s, p = sm_exp2_frac(v_max(v_set1(TN_EXP_MIN), d), &s); /* NaN kept */
    vfloat n = v_sub(s, v_set1(SM_ROUND));
    if (__builtin_expect(!m_all(v_gt(n, v_set1((float)TN_EXP_TINY_N))), 0))
        return v_exp_scale_(p, n); /* tiny results or NaN */
    return vi_as_float(vi_add(v_as_int(p), vi_sll(v_as_int(s), 23))); /* s's low bits hold n */
}

/* sm_exp_bf16 for d in [-SM_FAST_SPAN, 0] (or NaN from BF16 data), where its clamp and
 * its test for tiny results are void: n >= -115. A NaN d (from BF16 data: low 16 bits
 * zero) leaves s's low 9 bits zero, so p stays NaN. */
#define SM_FAST_SPAN 80.0f
V_INLINE vfloat sm_exp_bf16_near(vfloat d)
{
    vfloat s, p = sm_exp2_frac(d, &s);
    return vi_as_float(vi_add(v_as_int(p), vi_sll(v_as_int(s), 23)));
}

/* exp(d) for d <= 0 or NaN: FP32 keeps v_exp_nonpos, BF16 the cheaper sm_exp_bf16. */
V_INLINE vfloat sm_exp(vfloat d, int bf) { return bf ? sm_exp_bf16(d) : v_exp_nonpos(d); }

static void sm_fill_nan(void * p, size_t n, int bf)
{
    for (size_t i = 0; i < n; ++i) {
        if (bf)
            ((uint16_t *)p)[i] = SM_BF16_NAN;
        else
            ((float *)p)[i] = NAN;
    }
}

/* ---- inner == 1 ---- */

static inline float row_max(const void * src, size_t n, int bf)
{
    vfloat m0 = v_set1(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        m0 = v_max(m0, sm_ld(src, i, bf));
        m1 = v_max(m1, sm_ld(src, i + 16, bf));
        m2 = v_max(m2, sm_ld(src, i + 32, bf));
        m3 = v_max(m3, sm_ld(src, i + 48, bf));
    }
    for (; i + 16 <= n; i += 16)
        m0 = v_max(m0, sm_ld(src, i, bf));
    if (i < n)
        m1 = v_max(m1, v_select(m_first(n - i), sm_ld_n(src, i, n - i, bf), v_set1(-INFINITY)));
    return v_hmax(v_max(v_max(m0, m1), v_max(m2, m3)));
}

/* e[i] = exp(x[i] - mx); returns their sum, element i in lane i % 16. */
static inline float row_exp(const void * src, size_t n, float mx, float * e, int bf)
{
    vfloat m = v_set1(mx), acc = v_zero();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        vfloat x = sm_exp(v_sub(sm_ld(src, i, bf), m), bf);
        v_store(e + i, x);
        acc = v_add(acc, x);
    }
    if (i < n) { /* the lanes past the row read as max: exp(0), kept out of the sum */
        vmask k = m_first(n - i);
        vfloat x = sm_exp(v_sub(v_select(k, sm_ld_n(src, i, n - i, bf), m), m), bf);
        v_store_n(e + i, x, n - i);
        acc = v_add(acc, v_keep(k, x));
    }
    return v_hsum(acc);
}

/* dst[i] = e[i] * (1 / sum); e may be dst itself (fp32). */
static inline void row_scale(const float * e, size_t n, float sum, void * dst, int bf, int hw)
{
    if (sum != sum) {
        sm_fill_nan(dst, n, bf);
        return;
    }
    vfloat r = v_set1(1.0f / sum);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        sm_st(dst, i, v_mul(v_load(e + i), r), bf, hw);
    if (i < n)
        sm_st_n(dst, i, v_mul(v_load_n(e + i, n - i), r), n - i, bf, hw);
}

/* R (1 or 2) short rows of n <= 16 * V elements each (V = 1..SM_REG_V; R and V constants
 * after inlining), row r at src + r * rs bytes, kept in registers: one read and one write
 * per element, the operations of row_max / row_exp / row_scale. Two rows go in lockstep so
 * that one row's reduction trees and division overlap the other's vector work. The last
 * vector holds ln (1..16) elements; its other lanes are zero in the sum. */
V_INLINE void row_short(const char * src, char * dst, size_t rs, int R, int V, size_t ln, int bf, int hw)
{
    vfloat x[2][SM_REG_V], m[2], acc[2];
    float sum[2];
    int fast = bf;
    vmask lm = m_first(ln);
    for (int r = 0; r < R; ++r) {
        const char * s = src + r * rs;
        for (int v = 0; v < V - 1; ++v)
            x[r][v] = sm_ld(s, 16 * (size_t)v, bf);
        x[r][V - 1] = v_select(lm, sm_ld_n(s, 16 * (size_t)(V - 1), ln, bf), v_set1(-INFINITY));
    }
    for (int r = 0; r < R; ++r) {
        vfloat m0 = x[r][0], m1 = V > 1 ? x[r][1] : x[r][0];
        for (int v = 2; v < V; v += 2) {
            m0 = v_max(m0, x[r][v]);
            if (v + 1 < V)
                m1 = v_max(m1, x[r][v + 1]);
        }
        float mx = v_hmax(v_max(m0, m1));
        m[r] = v_set1(mx);
        if (bf) { /* the row's span decides whether the exps may skip their range checks */
            vfloat n0 = v_select(lm, x[r][V - 1], v_set1(INFINITY));
            for (int v = 0; v < V - 1; ++v)
                n0 = v_min(n0, x[r][v]);
            fast &= mx - v_hmin(n0) <= SM_FAST_SPAN;
        }
        x[r][V - 1] = v_select(lm, x[r][V - 1], m[r]); /* exp(0) past the row, kept out of the sum */
    }
    for (int r = 0; r < R; ++r)
        acc[r] = v_zero();
    for (int v = 0; v < V; ++v)
        for (int r = 0; r < R; ++r) {
            vfloat d = v_sub(x[r][v], m[r]);
            x[r][v] = fast ? sm_exp_bf16_near(d) : sm_exp(d, bf);
            if (v == V - 1)
                x[r][v] = v_keep(lm, x[r][v]);
            acc[r] = v_add(acc[r], x[r][v]);
        }
    for (int r = 0; r < R; ++r)
        sum[r] = v_hsum(acc[r]);
    for (int r = 0; r < R; ++r) {
        char * d = dst + r * rs;
        if (sum[r] != sum[r]) {
            sm_fill_nan(d, 16 * (size_t)(V - 1) + ln, bf);
            continue;
        }
        vfloat k = v_set1(1.0f / sum[r]);
        if (fast) { /* results near e^-SM_FAST_SPAN / 256 or above, > 2^-126: no denormal */
            for (int v = 0; v < V - 1; ++v)
                v_store_bf16_hw_normal((uint16_t *)d + 16 * v, v_mul(x[r][v], k), hw);
            v_store_bf16_hw_normal_n((uint16_t *)d + 16 * (V - 1), v_mul(x[r][V - 1], k), ln, hw);
            continue;
        }
        for (int v = 0; v < V - 1; ++v)
            sm_st(d, 16 * (size_t)v, v_mul(x[r][v], k), bf, hw);
        sm_st_n(d, 16 * (size_t)(V - 1), v_mul(x[r][V - 1], k), ln, bf, hw);
    }
}

/* Pairs for BF16 only: FP32 rows measured slower in pairs (more live registers). */
#define SM_ROW_CASE(V) \
    case V: \
        for (; bf && o + 2 <= outer; o += 2, s += 2 * rs, d += 2 * rs) \
            row_short(s, d, rs, 2, V, ln, bf, hw); \
        for (; o < outer; ++o, s += rs, d += rs) \
            row_short(s, d, rs, 1, V, ln, bf, hw); \
        break;

/* Sixteen rows of count <= SM_ROWS_MAX elements at once, transposed into t (element c of
 * row l in lane l of vector c): the max, the exps and the scaling run on whole vectors, and
 * the 16-lane order of a row (element c in lane c, absent lanes zero, then the tree of
 * v_hsum) becomes the same tree across the vectors. */
static inline void rows16(const void * src, size_t count, void * dst, int bf, int hw)
{
    float t[16 * SM_ROWS_MAX];
    uint16_t tb[16 * SM_ROWS_MAX];
    vfloat e[16];
    for (size_t l = 0; l < 16; ++l)
        for (size_t c = 0; c < count; ++c)
            t[16 * c + l] =
                bf ? tn_bf16_to_f32(((const uint16_t *)src)[l * count + c]) : ((const float *)src)[l * count + c];
    vfloat mx = v_set1(-INFINITY);
    for (size_t c = 0; c < count; ++c)
        mx = v_max(mx, v_load(t + 16 * c));
    for (size_t c = 0; c < 16; ++c)
        e[c] = c < count ? sm_exp(v_sub(v_load(t + 16 * c), mx), bf) : v_zero();
    vfloat a[8];
    for (int l = 0; l < 8; ++l)
        a[l] = v_add(e[l], e[l + 8]);
    for (int l = 0; l < 4; ++l)
        a[l] = v_add(a[l], a[l + 4]);
    vfloat sum = v_add(v_add(a[0], a[2]), v_add(a[1], a[3]));
    vfloat r = v_div(v_set1(1.0f), sum);
    vmask nan = v_isnan(sum);
    for (size_t c = 0; c < count; ++c) {
        vfloat y = v_select(nan, v_set1(NAN), v_mul(e[c], r));
        if (bf)
            v_store_bf16_hw(tb + 16 * c, y, hw);
        else
            v_store(t + 16 * c, y);
    }
    for (size_t l = 0; l < 16; ++l)
        for (size_t c = 0; c < count; ++c) {
            if (bf)
                ((uint16_t *)dst)[l * count + c] = tb[16 * c + l];
            else
                ((float *)dst)[l * count + c] = t[16 * c + l];
        }
}

/* ---- 1 < inner < SM_FLAT_INNER ---- */

static size_t flat_period(size_t inner)
{
    size_t low = inner & (~inner + 1); /* largest power of two dividing inner */
    return 16 * inner / (low < 16 ? low : 16);
}

/* The slab (count x inner, contiguous) in periods of p = 16 * PV elements; lane q of the
 * period accumulates the elements i with i % p == q, in order. PV is a constant after
 * inlining for the common PV == 1 (inner 2, 4, 8). e may be dst itself (fp32). */
V_INLINE void flat(const void * src, size_t count, size_t inner, size_t PV, float * e, void * dst, int bf, int hw)
{
    const size_t n = count * inner, p = 16 * PV;
    float lane[SM_FLAT_MAX], pat[SM_FLAT_MAX], cs[SM_FLAT_INNER];
    vfloat a[SM_FLAT_MAX / 16];
    size_t i, k;
    /* max of each column (order-free) */
    for (k = 0; k < PV; ++k)
        a[k] = v_set1(-INFINITY);
    for (i = 0; i + p <= n; i += p)
        for (k = 0; k < PV; ++k)
            a[k] = v_max(a[k], sm_ld(src, i + 16 * k, bf));
    for (k = 0; k < PV && i + 16 * k < n; ++k) {
        size_t r = n - i - 16 * k;
        a[k] = v_max(a[k], v_select(m_first(r), sm_ld_n(src, i + 16 * k, r, bf), v_set1(-INFINITY)));
    }
    for (k = 0; k < PV; ++k)
        v_store(lane + 16 * k, a[k]);
    for (size_t j = 0; j < inner; ++j) {
        float v = lane[j];
        for (size_t q = j + inner; q < p; q += inner)
            v = lane[q] > v ? lane[q] : v;
        cs[j] = v;
    }
    for (size_t q = 0; q < p; ++q)
        pat[q] = cs[q % inner];
    /* exps and their sums per lane */
    for (k = 0; k < PV; ++k)
        a[k] = v_zero();
    for (i = 0; i + p <= n; i += p)
        for (k = 0; k < PV; ++k) {
            vfloat x = sm_exp(v_sub(sm_ld(src, i + 16 * k, bf), v_load(pat + 16 * k)), bf);
            v_store(e + i + 16 * k, x);
            a[k] = v_add(a[k], x);
        }
    for (k = 0; k < PV && i + 16 * k < n; ++k) {
        size_t r = n - i - 16 * k;
        vfloat x = sm_exp(v_sub(sm_ld_n(src, i + 16 * k, r, bf), v_load(pat + 16 * k)), bf);
        v_store_n(e + i + 16 * k, x, r);
        a[k] = v_add(a[k], v_keep(m_first(r), x));
    }
    for (k = 0; k < PV; ++k)
        v_store(lane + 16 * k, a[k]);
    /* column sums from the period's lanes, in increasing lane order */
    int any_nan = 0;
    for (size_t j = 0; j < inner; ++j) {
        float s = lane[j];
        for (size_t q = j + inner; q < p; q += inner)
            s += lane[q];
        any_nan |= s != s;
        cs[j] = 1.0f / s;
    }
    for (size_t q = 0; q < p; ++q)
        pat[q] = cs[q % inner];
    /* scale */
    for (i = 0; i + p <= n; i += p)
        for (k = 0; k < PV; ++k)
            sm_st(dst, i + 16 * k, v_mul(v_load(e + i + 16 * k), v_load(pat + 16 * k)), bf, hw);
    for (k = 0; k < PV && i + 16 * k < n; ++k) {
        size_t r = n - i - 16 * k;
        sm_st_n(dst, i + 16 * k, v_mul(v_load_n(e + i + 16 * k, r), v_load(pat + 16 * k)), r, bf, hw);
    }
    if (any_nan)
        for (size_t j = 0; j < inner; ++j)
            if (cs[j] != cs[j])
                for (size_t c = 0; c < count; ++c) {
                    if (bf)
                        ((uint16_t *)dst)[c * inner + j] = SM_BF16_NAN;
                    else
                        ((float *)dst)[c * inner + j] = NAN;
                }
}

/* ---- inner >= SM_FLAT_INNER ---- */

/* V (1..4, a constant after inlining) vectors of columns, the last one holding ln (1..16)
 * columns. src and dst point at the block's first column of row 0; e (row stride es) gets
 * the exps and may be dst itself (fp32). */
V_INLINE void cols(const void * src, size_t count, size_t inner, int V, size_t ln, float * e, size_t es, void * dst,
                   int bf, int hw)
{
    vfloat mx[4], s[4], r[4];
    vmask nan[4];
    size_t w[4];
    for (int v = 0; v < V; ++v) {
        w[v] = v == V - 1 ? ln : 16;
        mx[v] = sm_ld_n(src, 16 * (size_t)v, w[v], bf);
        s[v] = v_zero();
    }
    for (size_t c = 1; c < count; ++c)
        for (int v = 0; v < V; ++v)
            mx[v] = v_max(mx[v], sm_ld_n(src, c * inner + 16 * (size_t)v, w[v], bf));
    for (size_t c = 0; c < count; ++c)
        for (int v = 0; v < V; ++v) {
            vfloat x = sm_exp(v_sub(sm_ld_n(src, c * inner + 16 * (size_t)v, w[v], bf), mx[v]), bf);
            v_store_n(e + c * es + 16 * (size_t)v, x, w[v]);
            s[v] = v_add(s[v], x);
        }
    for (int v = 0; v < V; ++v) {
        r[v] = v_div(v_set1(1.0f), s[v]);
        nan[v] = v_isnan(s[v]);
    }
    for (size_t c = 0; c < count; ++c)
        for (int v = 0; v < V; ++v) {
            vfloat y = v_mul(v_load_n(e + c * es + 16 * (size_t)v, w[v]), r[v]);
            sm_st_n(dst, c * inner + 16 * (size_t)v, v_select(nan[v], v_set1(NAN), y), w[v], bf, hw);
        }
}

/* Vectors per column block: keep the block's rows (src, dst, exps) in L2. */
static size_t block_vectors(size_t count) { return count <= 1024 ? 4 : count <= 2048 ? 2 : 1; }

V_INLINE void softmax(const void * src, size_t outer, size_t count, size_t inner, void * dst, float * scratch, int bf,
                      int hw)
{
    const size_t esz = bf ? 2 : 4, slab = count * inner;
    const size_t bv = block_vectors(count), bw = 16 * bv;
    if (inner == 1 && count <= 16 * SM_REG_V) {
        size_t v = (count + 15) / 16, ln = count - 16 * (v - 1), o = 0;
        const char * s = (const char *)src;
        char * d = (char *)dst;
        const size_t rs = count * esz;
        if (count <= SM_ROWS_MAX)
            for (; o + 16 <= outer; o += 16, s += 16 * count * esz, d += 16 * count * esz)
                rows16(s, count, d, bf, hw);
        /* Sixteen cases, four a line. */
        /* clang-format off */
        switch (v) {
        SM_ROW_CASE(1) SM_ROW_CASE(2) SM_ROW_CASE(3) SM_ROW_CASE(4)
        SM_ROW_CASE(5) SM_ROW_CASE(6) SM_ROW_CASE(7) SM_ROW_CASE(8)
        SM_ROW_CASE(9) SM_ROW_CASE(10) SM_ROW_CASE(11) SM_ROW_CASE(12)
        SM_ROW_CASE(13) SM_ROW_CASE(14) SM_ROW_CASE(15) default: SM_ROW_CASE(16)
        }
        /* clang-format on */
        return;
    }
    for (size_t o = 0; o < outer; ++o) {
        const char * s = (const char *)src + o * slab * esz;
        char * d = (char *)dst + o * slab * esz;
        if (inner == 1) {
            float * e = bf ? scratch : (float *)d;
            row_scale(e, count, row_exp(s, count, row_max(s, count, bf), e, bf), d, bf, hw);
            continue;
        }
        if (inner < SM_FLAT_INNER) {
            float * e = bf ? scratch : (float *)d;
            size_t pv = flat_period(inner) / 16;
            if (pv == 1)
                flat(s, count, inner, 1, e, d, bf, hw);
            else
                flat(s, count, inner, pv, e, d, bf, hw);
            continue;
        }
        size_t es = bf ? (inner < bw ? inner : bw) : inner;
        size_t j = 0;
        for (; j + bw <= inner; j += bw) {
            float * e = bf ? scratch : (float *)d + j;
            if (bv == 4)
                cols(s + j * esz, count, inner, 4, 16, e, es, d + j * esz, bf, hw);
            else if (bv == 2)
                cols(s + j * esz, count, inner, 2, 16, e, es, d + j * esz, bf, hw);
            else
                cols(s + j * esz, count, inner, 1, 16, e, es, d + j * esz, bf, hw);
        }
        if (j < inner) {
            size_t rest = inner - j, v = (rest + 15) / 16, ln = rest - 16 * (v - 1);
            float * e = bf ? scratch : (float *)d + j;
            if (v == 4)
                cols(s + j * esz, count, inner, 4, ln, e, es, d + j * esz, bf, hw);
            else if (v == 3)
                cols(s + j * esz, count, inner, 3, ln, e, es, d + j * esz, bf, hw);
            else if (v == 2)
                cols(s + j * esz, count, inner, 2, ln, e, es, d + j * esz, bf, hw);
            else
                cols(s + j * esz, count, inner, 1, ln, e, es, d + j * esz, bf, hw);
        }
    }
}

void TN_ISA(SynetSoftmax32f)(const float * src, size_t outer, size_t count, size_t inner, float * dst)
{
    if (count == 0 || inner == 0)
        return;
    softmax(src, outer, count, inner, dst, NULL, 0, 0);
}

void TN_ISA(SynetSoftmax16b)(const uint16_t * src, size_t outer, size_t count, size_t inner, uint16_t * dst)
{
    if (count == 0 || inner == 0)
        return;
    float stack[SM_STACK_FLOATS];
    size_t bw = 16 * block_vectors(count);
    size_t need = count * (inner < bw ? inner : bw); /* also count * inner when inner < SM_FLAT_INNER */
    float * e = need <= SM_STACK_FLOATS ? stack : (float *)malloc(need * sizeof(float));
    if (e == NULL) {
        sm_fill_nan(dst, outer * count * inner, 1);
        return;
    }
    softmax(src, outer, count, inner, dst, e, 1, v_hw_bf16());
    if (e != stack)
        free(e);
}
