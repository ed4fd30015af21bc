/*
 * Softmax along the count axis (SynetSoftmax32f, SynetSoftmax16b), scalar reference.
 *
 * y = exp(x - max) * (1 / sum), with sum = sum of exp(x - max) over count. The exps are
 * kept (in dst for fp32, in a scratch buffer for BF16) so each is computed once, and the
 * final pass multiplies by the reciprocal of the sum. A row (or column) whose sum is NaN
 * (it holds a NaN or +inf, or is all -inf) is filled with the default quiet NaN.
 *
 * The operation sequence is the one of the AVX2 and AVX-512 variants, so BF16 results are
 * bit-identical on every level:
 *  - inner == 1 (contiguous rows): exp values are summed in 16 lanes (element i to lane
 *    i % 16, in order), reduced as tn_avx512_hsum does;
 *  - 1 < inner < SM_FLAT_INNER: the slab (count x inner, contiguous) is cut into periods of
 *    P = lcm(inner, 16) elements; element i goes to lane i % P (P running sums, in order);
 *    column j's sum is lane j + lane j+inner + ... in increasing lane order;
 *  - inner >= SM_FLAT_INNER: each column (inner index) is summed sequentially over count.
 */
#include "vmath_scalar.h"

#include <stdlib.h>

#include "kernels.h"

#define SM_COLS 16            /* columns per block when inner >= SM_FLAT_INNER */
#define SM_FLAT_INNER 16
#define SM_FLAT_MAX 240       /* lcm(inner, 16) for inner < SM_FLAT_INNER */
#define SM_STACK_FLOATS 4096  /* BF16 scratch up to this size lives on the stack */
#define SM_BF16_NAN 0x7fc0u

/* The fixed reduction tree of tn_avx512_hsum: (l + l+8), (l + l+4), then (0+2) + (1+3). */
static float sum16(const float * a)
{
    float s[8], q[4];
    for (int l = 0; l < 8; ++l)
        s[l] = a[l] + a[l + 8];
    for (int l = 0; l < 4; ++l)
        q[l] = s[l] + s[l + 4];
    return (q[0] + q[2]) + (q[1] + q[3]);
}

static inline float max_f(float a, float x) { return x > a ? x : a; }

/* One contiguous row: e[i] = exp(x[i] - max); returns the sum (16-lane order). */
static float row_exp_f32(const float * src, size_t n, float * e)
{
    float mx = src[0];
    for (size_t i = 1; i < n; ++i)
        mx = max_f(mx, src[i]);
    float acc[16] = {0};
    for (size_t i = 0; i < n; ++i) {
        float v = tn_exp_f32(src[i] - mx);
        e[i] = v;
        acc[i & 15] += v;
    }
    return sum16(acc);
}

static float row_exp_bf16(const uint16_t * src, size_t n, float * e)
{
    float mx = tn_bf16_to_f32(src[0]);
    for (size_t i = 1; i < n; ++i)
        mx = max_f(mx, tn_bf16_to_f32(src[i]));
    float acc[16] = {0};
    for (size_t i = 0; i < n; ++i) {
        float v = tn_exp_f32(tn_bf16_to_f32(src[i]) - mx);
        e[i] = v;
        acc[i & 15] += v;
    }
    return sum16(acc);
}

/* A block of w <= SM_COLS columns; e holds the exps with row stride es. sum[j] gets the
 * column sums. */
static void cols_exp_f32(const float * src, size_t count, size_t inner, size_t w, float * e, size_t es,
                         float * sum)
{
    float mx[SM_COLS];
    for (size_t j = 0; j < w; ++j)
        mx[j] = src[j];
    for (size_t c = 1; c < count; ++c)
        for (size_t j = 0; j < w; ++j)
            mx[j] = max_f(mx[j], src[c * inner + j]);
    for (size_t j = 0; j < w; ++j)
        sum[j] = 0.0f;
    for (size_t c = 0; c < count; ++c)
        for (size_t j = 0; j < w; ++j) {
            float v = tn_exp_f32(src[c * inner + j] - mx[j]);
            e[c * es + j] = v;
            sum[j] += v;
        }
}

static void cols_exp_bf16(const uint16_t * src, size_t count, size_t inner, size_t w, float * e, size_t es,
                          float * sum)
{
    float mx[SM_COLS];
    for (size_t j = 0; j < w; ++j)
        mx[j] = tn_bf16_to_f32(src[j]);
    for (size_t c = 1; c < count; ++c)
        for (size_t j = 0; j < w; ++j)
            mx[j] = max_f(mx[j], tn_bf16_to_f32(src[c * inner + j]));
    for (size_t j = 0; j < w; ++j)
        sum[j] = 0.0f;
    for (size_t c = 0; c < count; ++c)
        for (size_t j = 0; j < w; ++j) {
            float v = tn_exp_f32(tn_bf16_to_f32(src[c * inner + j]) - mx[j]);
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

/* A per-column value repeated over one period: pat[q] = cm[q % inner]. */
static void flat_pattern(const float * cm, size_t inner, size_t p, float * pat)
{
    for (size_t q = 0; q < p; ++q)
        pat[q] = cm[q % inner];
}

/* Column sums from the period's lanes, in increasing lane order. */
static void flat_column_sums(const float * acc, size_t inner, size_t p, float * sum)
{
    for (size_t j = 0; j < inner; ++j) {
        float s = acc[j];
        for (size_t q = j + inner; q < p; q += inner)
            s += acc[q];
        sum[j] = s;
    }
}

/* 1 < inner < SM_FLAT_INNER: e[i] = exp(x[i] - max of its column); sum[j] = column sums in
 * the flat order. */
static void flat_exp_f32(const float * src, size_t count, size_t inner, float * e, float * sum)
{
    size_t p = flat_period(inner), n = count * inner;
    float cm[SM_FLAT_INNER], pat[SM_FLAT_MAX], acc[SM_FLAT_MAX] = {0};
    for (size_t j = 0; j < inner; ++j)
        cm[j] = src[j];
    for (size_t c = 1; c < count; ++c)
        for (size_t j = 0; j < inner; ++j)
            cm[j] = max_f(cm[j], src[c * inner + j]);
    flat_pattern(cm, inner, p, pat);
    for (size_t i = 0; i < n; i += p)
        for (size_t q = 0; q < p && i + q < n; ++q) {
            float v = tn_exp_f32(src[i + q] - pat[q]);
            e[i + q] = v;
            acc[q] += v;
        }
    flat_column_sums(acc, inner, p, sum);
}

static void flat_exp_bf16(const uint16_t * src, size_t count, size_t inner, float * e, float * sum)
{
    size_t p = flat_period(inner), n = count * inner;
    float cm[SM_FLAT_INNER], pat[SM_FLAT_MAX], acc[SM_FLAT_MAX] = {0};
    for (size_t j = 0; j < inner; ++j)
        cm[j] = tn_bf16_to_f32(src[j]);
    for (size_t c = 1; c < count; ++c)
        for (size_t j = 0; j < inner; ++j)
            cm[j] = max_f(cm[j], tn_bf16_to_f32(src[c * inner + j]));
    flat_pattern(cm, inner, p, pat);
    for (size_t i = 0; i < n; i += p)
        for (size_t q = 0; q < p && i + q < n; ++q) {
            float v = tn_exp_f32(tn_bf16_to_f32(src[i + q]) - pat[q]);
            e[i + q] = v;
            acc[q] += v;
        }
    flat_column_sums(acc, inner, p, sum);
}

void tn_scalar_SynetSoftmax32f(const float * src, size_t outer, size_t count, size_t inner, float * dst)
{
    if (count == 0 || inner == 0)
        return;
    for (size_t o = 0; o < outer; ++o, src += count * inner, dst += count * inner) {
        if (inner == 1) {
            float sum = row_exp_f32(src, count, dst);
            float r = 1.0f / sum;
            for (size_t i = 0; i < count; ++i)
                dst[i] = sum != sum ? NAN : dst[i] * r;
            continue;
        }
        if (inner < SM_FLAT_INNER) {
            float sum[SM_FLAT_INNER], r[SM_FLAT_INNER];
            flat_exp_f32(src, count, inner, dst, sum);
            for (size_t j = 0; j < inner; ++j)
                r[j] = 1.0f / sum[j];
            for (size_t c = 0; c < count; ++c)
                for (size_t j = 0; j < inner; ++j) {
                    float * y = dst + c * inner + j;
                    *y = sum[j] != sum[j] ? NAN : *y * r[j];
                }
            continue;
        }
        for (size_t j = 0; j < inner; j += SM_COLS) {
            size_t w = inner - j < SM_COLS ? inner - j : SM_COLS;
            float sum[SM_COLS], r[SM_COLS];
            cols_exp_f32(src + j, count, inner, w, dst + j, inner, sum);
            for (size_t k = 0; k < w; ++k)
                r[k] = 1.0f / sum[k];
            for (size_t c = 0; c < count; ++c)
                for (size_t k = 0; k < w; ++k) {
                    float * y = dst + c * inner + j + k;
                    *y = sum[k] != sum[k] ? NAN : *y * r[k];
                }
        }
    }
}

void tn_scalar_SynetSoftmax16b(const uint16_t * src, size_t outer, size_t count, size_t inner, uint16_t * dst)
{
    if (count == 0 || inner == 0)
        return;
    float stack[SM_STACK_FLOATS];
    size_t es = inner < SM_COLS ? inner : SM_COLS; /* scratch row stride when inner > 1 */
    size_t need = inner < SM_FLAT_INNER ? count * inner : count * es;
    float * e = need <= SM_STACK_FLOATS ? stack : (float *)malloc(need * sizeof(float));
    if (e == NULL) {
        for (size_t i = 0, n = outer * count * inner; i < n; ++i)
            dst[i] = SM_BF16_NAN;
        return;
    }
    for (size_t o = 0; o < outer; ++o, src += count * inner, dst += count * inner) {
        if (inner == 1) {
            float sum = row_exp_bf16(src, count, e);
            float r = 1.0f / sum;
            for (size_t i = 0; i < count; ++i)
                dst[i] = sum != sum ? SM_BF16_NAN : tn_f32_to_bf16(e[i] * r);
            continue;
        }
        if (inner < SM_FLAT_INNER) {
            float sum[SM_FLAT_INNER], r[SM_FLAT_INNER];
            flat_exp_bf16(src, count, inner, e, sum);
            for (size_t j = 0; j < inner; ++j)
                r[j] = 1.0f / sum[j];
            for (size_t c = 0; c < count; ++c)
                for (size_t j = 0; j < inner; ++j) {
                    size_t i = c * inner + j;
                    dst[i] = sum[j] != sum[j] ? SM_BF16_NAN : tn_f32_to_bf16(e[i] * r[j]);
                }
            continue;
        }
        for (size_t j = 0; j < inner; j += SM_COLS) {
            size_t w = inner - j < SM_COLS ? inner - j : SM_COLS;
            float sum[SM_COLS], r[SM_COLS];
            cols_exp_bf16(src + j, count, inner, w, e, es, sum);
            for (size_t k = 0; k < w; ++k)
                r[k] = 1.0f / sum[k];
            for (size_t c = 0; c < count; ++c)
                for (size_t k = 0; k < w; ++k)
                    dst[c * inner + j + k] = sum[k] != sum[k] ? SM_BF16_NAN : tn_f32_to_bf16(e[c * es + k] * r[k]);
        }
    }
    if (e != stack)
        free(e);
}
