/*
 * Eltwise layer (product, weighted sum, max, min of count >= 2 arrays), scalar reference.
 *
 * The operation sequence every ISA level follows, element by element:
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
#include "vmath_scalar.h"

#include "kernels.h"
#include "tensorops.h"

#define TN_ELTWISE_BLOCK 2048

enum { OP_PRODUCT, OP_SUM_FIRST, OP_SUM_NEXT, OP_MAX, OP_MIN };

static inline __attribute__((always_inline)) float combine(int op, float a, float b, float wa, float wb)
{
    switch (op) {
    case OP_PRODUCT: return a * b;
    case OP_SUM_FIRST: return fmaf(b, wb, a * wa);
    case OP_SUM_NEXT: return fmaf(b, wb, a);
    case OP_MAX: return a != a ? a : (a > b ? a : b);
    default: return a != a ? a : (a < b ? a : b);
    }
}

/* d[j] = combine(a[j], b[j]); a may be d. */
static inline __attribute__((always_inline)) void span(int op, const float * a, const float * b, float wa, float wb,
                                                       float * d, size_t n)
{
    for (size_t j = 0; j < n; ++j)
        d[j] = combine(op, a[j], b[j], wa, wb);
}

static inline __attribute__((always_inline)) void run(int first, int next, float const * const * src,
                                                      const float * weight, size_t count, size_t size, float * dst)
{
    int sum = first == OP_SUM_FIRST;
    for (size_t b = 0; b < size; b += TN_ELTWISE_BLOCK) {
        size_t n = size - b < TN_ELTWISE_BLOCK ? size - b : TN_ELTWISE_BLOCK;
        span(first, src[0] + b, src[1] + b, sum ? weight[0] : 1.0f, sum ? weight[1] : 1.0f, dst + b, n);
        for (size_t i = 2; i < count; ++i)
            span(next, dst + b, src[i] + b, 1.0f, sum ? weight[i] : 1.0f, dst + b, n);
    }
}

void tn_scalar_SynetEltwiseLayerForward(float const * const * src, const float * weight, size_t count, size_t size,
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
