/*
 * Eltwise layer (product, weighted sum, max, min of count >= 2 arrays), scalar reference.
 * The operation sequence and the blocking are in eltwise.h.
 */
#include "vmath_scalar.h"

#include "eltwise.h"

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

static inline __attribute__((always_inline)) void span(int op, const float * a, const float * b, float wa, float wb,
                                                       float * d, size_t n)
{
    for (size_t j = 0; j < n; ++j)
        d[j] = combine(op, a[j], b[j], wa, wb);
}

void tn_scalar_SynetEltwiseLayerForward(float const * const * src, const float * weight, size_t count, size_t size,
                                        int type, float * dst)
{
    eltwise_forward(src, weight, count, size, type, dst, 0);
}
