/*
 * Eltwise layer, AVX2. Same operation sequence as eltwise_scalar.c (see there), so the
 * results are bit-identical: SUM uses one explicit FMA per input after the first two, and
 * MAX/MIN keep a NaN accumulator (the max/min instruction alone would drop a NaN in its
 * first operand).
 */
#include "vmath_avx2.h"

#include "kernels.h"
#include "tensorops.h"

#define TN_ELTWISE_BLOCK 2048 /* floats: 8 KB of dst stay in L1 while the inputs stream by */

/* Floats from p to the next 32-byte boundary. */
static inline size_t gap(const float * p)
{
    return ((0 - (uintptr_t)p) & 31) / sizeof(float);
}

enum { OP_PRODUCT, OP_SUM_FIRST, OP_SUM_NEXT, OP_MAX, OP_MIN };

static inline __attribute__((always_inline)) __m256 combine(int op, __m256 a, __m256 b, __m256 wa, __m256 wb)
{
    switch (op) {
    case OP_PRODUCT: return _mm256_mul_ps(a, b);
    case OP_SUM_FIRST: return _mm256_fmadd_ps(b, wb, _mm256_mul_ps(a, wa));
    case OP_SUM_NEXT: return _mm256_fmadd_ps(b, wb, a);
    case OP_MAX: return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    default: return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    }
}

/* d[j] = combine(a[j], b[j]); a may be d. */
static inline __attribute__((always_inline)) void span(int op, const float * a, const float * b, float wa, float wb,
                                                       float * d, size_t n)
{
    const __m256 va = _mm256_set1_ps(wa), vb = _mm256_set1_ps(wb);
    size_t j = gap(d) < n ? gap(d) : n;
    if (j) { /* up to the first 32-byte boundary of d: the other stores never split a line */
        __m256i m = tn_avx2_tail_mask(j);
        _mm256_maskstore_ps(d, m, combine(op, _mm256_maskload_ps(a, m), _mm256_maskload_ps(b, m), va, vb));
    }
    for (; j + 4 * TN_AVX2_F <= n; j += 4 * TN_AVX2_F) {
        __m256 r0 = combine(op, _mm256_loadu_ps(a + j + 0 * TN_AVX2_F), _mm256_loadu_ps(b + j + 0 * TN_AVX2_F), va, vb);
        __m256 r1 = combine(op, _mm256_loadu_ps(a + j + 1 * TN_AVX2_F), _mm256_loadu_ps(b + j + 1 * TN_AVX2_F), va, vb);
        __m256 r2 = combine(op, _mm256_loadu_ps(a + j + 2 * TN_AVX2_F), _mm256_loadu_ps(b + j + 2 * TN_AVX2_F), va, vb);
        __m256 r3 = combine(op, _mm256_loadu_ps(a + j + 3 * TN_AVX2_F), _mm256_loadu_ps(b + j + 3 * TN_AVX2_F), va, vb);
        _mm256_storeu_ps(d + j + 0 * TN_AVX2_F, r0);
        _mm256_storeu_ps(d + j + 1 * TN_AVX2_F, r1);
        _mm256_storeu_ps(d + j + 2 * TN_AVX2_F, r2);
        _mm256_storeu_ps(d + j + 3 * TN_AVX2_F, r3);
    }
    for (; j + TN_AVX2_F <= n; j += TN_AVX2_F)
        _mm256_storeu_ps(d + j, combine(op, _mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), va, vb));
    if (j < n) {
        __m256i m = tn_avx2_tail_mask(n - j);
        _mm256_maskstore_ps(d + j, m, combine(op, _mm256_maskload_ps(a + j, m), _mm256_maskload_ps(b + j, m), va, vb));
    }
}

static inline __attribute__((always_inline)) void run(int first, int next, float const * const * src,
                                                      const float * weight, size_t count, size_t size, float * dst)
{
    int sum = first == OP_SUM_FIRST;
    /* The first block also takes dst's unaligned head, so the others start aligned. */
    for (size_t b = 0, n = gap(dst) + TN_ELTWISE_BLOCK; b < size; b += n, n = TN_ELTWISE_BLOCK) {
        n = size - b < n ? size - b : n;
        span(first, src[0] + b, src[1] + b, sum ? weight[0] : 1.0f, sum ? weight[1] : 1.0f, dst + b, n);
        for (size_t i = 2; i < count; ++i)
            span(next, dst + b, src[i] + b, 1.0f, sum ? weight[i] : 1.0f, dst + b, n);
    }
}

void tn_avx2_SynetEltwiseLayerForward(float const * const * src, const float * weight, size_t count, size_t size,
                                      int type, float * dst)
{
    switch (count < 2 ? -1 : type) {
    case TnSynetEltwiseOperationProduct: run(OP_PRODUCT, OP_PRODUCT, src, weight, count, size, dst); return;
    case TnSynetEltwiseOperationSum:
        if (weight == NULL)
            break;
        run(OP_SUM_FIRST, OP_SUM_NEXT, src, weight, count, size, dst);
        return;
    case TnSynetEltwiseOperationMax: run(OP_MAX, OP_MAX, src, weight, count, size, dst); return;
    case TnSynetEltwiseOperationMin: run(OP_MIN, OP_MIN, src, weight, count, size, dst); return;
    default: break;
    }
    for (size_t j = 0; j < size; ++j)
        dst[j] = NAN;
}
