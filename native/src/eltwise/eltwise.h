/*
 * Eltwise layer: the part every level shares. The includer defines span (declared below,
 * the level's vector or scalar loop) and calls eltwise_forward, which walks dst in blocks
 * and dispatches on the type.
 *
 * The operation sequence, element by element (the same on every level, so the results are
 * bit-identical):
 *   PRODUCT: d = s0 * s1, then d = d * si
 *   SUM:     d = fma(s1, w1, s0 * w0), then d = fma(si, wi, d)
 *   MAX/MIN: d = op(s0, s1), then d = op(d, si), where op(a, b) = a if a is NaN, else
 *            (a > b ? a : b) for MAX, (a < b ? a : b) for MIN. That is the x86 max/min
 *            instruction (which returns b when either is NaN) plus a fix-up for a NaN a,
 *            so a NaN in any input propagates and the result is always one of the inputs.
 * The output is produced in blocks (TN_ELTWISE_BLOCK floats) and every input is applied to
 * a block while it is still in L1, so dst goes through memory once whatever the count.
 * Invalid arguments (count < 2, unknown type, SUM without weights) fill dst with NaN.
 */
#include "kernels.h"
#include "tensorops.h"

#define TN_ELTWISE_BLOCK 2048 /* floats: 8 KB of dst stay in L1 while the inputs stream by */

enum { OP_PRODUCT, OP_SUM_FIRST, OP_SUM_NEXT, OP_MAX, OP_MIN };

/* d[j] = op(a[j] * wa, b[j] * wb) as above, j < n; a may be d. Defined by the includer. */
static inline __attribute__((always_inline)) void span(int op, const float * a, const float * b, float wa, float wb,
                                                       float * d, size_t n);

/* head: floats before the first block boundary the caller wants (the first block takes
 * them on top of TN_ELTWISE_BLOCK, so the other blocks start where the caller likes). */
static inline __attribute__((always_inline)) void eltwise_run(int first, int next, float const * const * src,
                                                              const float * weight, size_t count, size_t size,
                                                              float * dst, size_t head)
{
    int sum = first == OP_SUM_FIRST;
    for (size_t b = 0, n = head + TN_ELTWISE_BLOCK; b < size; b += n, n = TN_ELTWISE_BLOCK) {
        n = size - b < n ? size - b : n;
        span(first, src[0] + b, src[1] + b, sum ? weight[0] : 1.0f, sum ? weight[1] : 1.0f, dst + b, n);
        for (size_t i = 2; i < count; ++i)
            span(next, dst + b, src[i] + b, 1.0f, sum ? weight[i] : 1.0f, dst + b, n);
    }
}

static inline __attribute__((always_inline)) void eltwise_forward(float const * const * src, const float * weight,
                                                                  size_t count, size_t size, int type, float * dst,
                                                                  size_t head)
{
    switch (count < 2 ? -1 : type) {
    case TnSynetEltwiseOperationProduct:
        eltwise_run(OP_PRODUCT, OP_PRODUCT, src, weight, count, size, dst, head);
        return;
    case TnSynetEltwiseOperationSum:
        if (weight == NULL)
            break;
        eltwise_run(OP_SUM_FIRST, OP_SUM_NEXT, src, weight, count, size, dst, head);
        return;
    case TnSynetEltwiseOperationMax: eltwise_run(OP_MAX, OP_MAX, src, weight, count, size, dst, head); return;
    case TnSynetEltwiseOperationMin: eltwise_run(OP_MIN, OP_MIN, src, weight, count, size, dst, head); return;
    default: break;
    }
    for (size_t j = 0; j < size; ++j)
        dst[j] = NAN;
}
