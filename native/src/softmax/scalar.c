/*
 * Softmax along the count axis (SynetSoftmax32f, SynetSoftmax16b), scalar reference.
 *
 * y = exp(x - max) * (1 / sum), with sum = sum of exp(x - max) over count. The exps are
 * kept (in dst for fp32, in a scratch buffer for BF16) so each is computed once, and the
 * final pass multiplies by the reciprocal of the sum. A row (or column) whose sum is NaN
 * (it holds a NaN or +inf, or is all -inf) is filled with the default quiet NaN.
 *
 * The operation sequence is the one of softmax_simd.h (the vector levels), so FP32 and BF16
 * results are bit-identical on every level:
 *  - inner == 1 (contiguous rows): exp values are summed in 16 lanes (element i to lane
 *    i % 16, in order), reduced as v_hsum does;
 *  - 1 < inner < SM_FLAT_INNER: the slab (count x inner, contiguous) is cut into periods of
 *    P = lcm(inner, 16) elements; element i goes to lane i % P (P running sums, in order);
 *    column j's sum is lane j + lane j+inner + ... in increasing lane order;
 *  - inner >= SM_FLAT_INNER: each column (inner index) is summed sequentially over count.
 */
#include "vmath_scalar.h"

#include <stdlib.h>

#include "kernels.h"
#include "softmax_exp.h"

#define SM_COLS 16            /* columns per block when inner >= SM_FLAT_INNER */
#define SM_FLAT_INNER 16
#define SM_FLAT_MAX 240       /* lcm(inner, 16) for inner < SM_FLAT_INNER */
#define SM_STACK_FLOATS 4096  /* BF16 scratch up to this size lives on the stack */
#define SM_BF16_NAN 0x7fc0u

static inline float max_f(float a, float x) { return x > a ? x : a; }

/* exp(x - max): FP32 takes the unary exp, BF16 the cheaper one of softmax_exp.h. */
static inline float sm_exp(float d, int bf) { return bf ? sm_exp_bf16_scalar(d) : tn_exp_f32(d); }

/* Element i of fp32 (bf == 0) or BF16 (bf == 1) data. */
static inline float ld(const void * p, size_t i, int bf)
{
    return bf ? tn_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* One contiguous row: e[i] = exp(x[i] - max); returns the sum (16-lane order). */
static float row_exp(const void * src, size_t n, float * e, int bf)
{
    float mx = ld(src, 0, bf);
    for (size_t i = 1; i < n; ++i)
        mx = max_f(mx, ld(src, i, bf));
    float acc[16] = {0};
    for (size_t i = 0; i < n; ++i) {
        float v = sm_exp(ld(src, i, bf) - mx, bf);
        e[i] = v;
        acc[i & 15] += v;
    }
    return tn_sum16(acc);
}

/* A block of w <= SM_COLS columns starting at element j0 of each row; e holds the exps
 * with row stride es. sum[j] gets the column sums. */
static void cols_exp(const void * src, size_t j0, size_t count, size_t inner, size_t w, float * e, size_t es,
                     float * sum, int bf)
{
    float mx[SM_COLS];
    for (size_t j = 0; j < w; ++j)
        mx[j] = ld(src, j0 + j, bf);
    for (size_t c = 1; c < count; ++c)
        for (size_t j = 0; j < w; ++j)
            mx[j] = max_f(mx[j], ld(src, c * inner + j0 + j, bf));
    for (size_t j = 0; j < w; ++j)
        sum[j] = 0.0f;
    for (size_t c = 0; c < count; ++c)
        for (size_t j = 0; j < w; ++j) {
            float v = sm_exp(ld(src, c * inner + j0 + j, bf) - mx[j], bf);
            e[c * es + j] = v;
            sum[j] += v;
        }
}

/* Period of the flat order: lcm(inner, 16). */
static size_t flat_period(size_t inner)
{
    size_t low = inner & (~inner + 1); /* largest power of two dividing inner */
    return 16 * inner / (low < 16 ? low : 16);
}

/* 1 < inner < SM_FLAT_INNER: e[i] = exp(x[i] - max of its column); sum[j] = column sums in
 * the flat order: lane q of the period sums the elements i with i % p == q, and column j's
 * sum is lane j + lane j+inner + ... in increasing lane order. */
static void flat_exp(const void * src, size_t count, size_t inner, float * e, float * sum, int bf)
{
    size_t p = flat_period(inner), n = count * inner;
    float cm[SM_FLAT_INNER], acc[SM_FLAT_MAX] = {0};
    for (size_t j = 0; j < inner; ++j)
        cm[j] = ld(src, j, bf);
    for (size_t c = 1; c < count; ++c)
        for (size_t j = 0; j < inner; ++j)
            cm[j] = max_f(cm[j], ld(src, c * inner + j, bf));
    for (size_t i = 0; i < n; i += p)
        for (size_t q = 0; q < p && i + q < n; ++q) {
            float v = sm_exp(ld(src, i + q, bf) - cm[q % inner], bf);
            e[i + q] = v;
            acc[q] += v;
        }
    for (size_t j = 0; j < inner; ++j) {
        float s = acc[j];
        for (size_t q = j + inner; q < p; q += inner)
            s += acc[q];
        sum[j] = s;
    }
}

/* y = e * (1 / sum), or the default NaN when sum is NaN. */
static inline void put(void * dst, size_t i, float e, float sum, float r, int bf)
{
    if (bf)
        ((uint16_t *)dst)[i] = sum != sum ? SM_BF16_NAN : tn_f32_to_bf16(e * r);
    else
        ((float *)dst)[i] = sum != sum ? NAN : e * r;
}

/* e: the exps (fp32: dst itself; BF16: scratch of count * min(inner, SM_COLS) floats, or
 * count * inner when inner < SM_FLAT_INNER). */
static void softmax(const void * src, size_t outer, size_t count, size_t inner, void * dst, float * scratch, int bf)
{
    const size_t esz = bf ? 2 : 4, slab = count * inner;
    for (size_t o = 0; o < outer; ++o) {
        const char * s = (const char *)src + o * slab * esz;
        char * d = (char *)dst + o * slab * esz;
        if (inner == 1) {
            float * e = bf ? scratch : (float *)d;
            float sum = row_exp(s, count, e, bf);
            float r = 1.0f / sum;
            for (size_t i = 0; i < count; ++i)
                put(d, i, e[i], sum, r, bf);
            continue;
        }
        if (inner < SM_FLAT_INNER) {
            float * e = bf ? scratch : (float *)d;
            float sum[SM_FLAT_INNER], r[SM_FLAT_INNER];
            flat_exp(s, count, inner, e, sum, bf);
            for (size_t j = 0; j < inner; ++j)
                r[j] = 1.0f / sum[j];
            for (size_t c = 0; c < count; ++c)
                for (size_t j = 0; j < inner; ++j)
                    put(d, c * inner + j, e[c * inner + j], sum[j], r[j], bf);
            continue;
        }
        size_t es = bf ? SM_COLS : inner;
        for (size_t j = 0; j < inner; j += SM_COLS) {
            size_t w = inner - j < SM_COLS ? inner - j : SM_COLS;
            float * e = bf ? scratch : (float *)d + j;
            float sum[SM_COLS], r[SM_COLS];
            cols_exp(s, j, count, inner, w, e, es, sum, bf);
            for (size_t k = 0; k < w; ++k)
                r[k] = 1.0f / sum[k];
            for (size_t c = 0; c < count; ++c)
                for (size_t k = 0; k < w; ++k)
                    put(d, c * inner + j + k, e[c * es + k], sum[k], r[k], bf);
        }
    }
}

void tn_scalar_SynetSoftmax32f(const float * src, size_t outer, size_t count, size_t inner, float * dst)
{
    if (count == 0 || inner == 0)
        return;
    softmax(src, outer, count, inner, dst, NULL, 0);
}

void tn_scalar_SynetSoftmax16b(const uint16_t * src, size_t outer, size_t count, size_t inner, uint16_t * dst)
{
    if (count == 0 || inner == 0)
        return;
    float stack[SM_STACK_FLOATS];
    size_t need = count * (inner < SM_FLAT_INNER ? inner : SM_COLS);
    float * e = need <= SM_STACK_FLOATS ? stack : (float *)malloc(need * sizeof(float));
    if (e == NULL) {
        for (size_t i = 0, n = outer * count * inner; i < n; ++i)
            dst[i] = SM_BF16_NAN;
        return;
    }
    softmax(src, outer, count, inner, dst, e, 1);
    if (e != stack)
        free(e);
}
