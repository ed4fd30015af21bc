/*
 * Eltwise layer against the vector layer (simd/README.md); the operation sequence and the
 * blocking are in eltwise.h, shared with scalar.c, so every level is bit-identical to it:
 * SUM uses one explicit FMA per input after the first two, and MAX/MIN keep a NaN
 * accumulator (the max/min instruction alone would drop a NaN in its first operand).
 */
#include "eltwise.h"

/* Floats from p to the next 64-byte boundary. */
static inline size_t gap(const float * p) { return ((0 - (uintptr_t)p) & 63) / sizeof(float); }

static inline __attribute__((always_inline)) vfloat combine(int op, vfloat a, vfloat b, vfloat wa, vfloat wb)
{
    switch (op) {
    case OP_PRODUCT: return v_mul(a, b);
    case OP_SUM_FIRST: return v_fma(b, wb, v_mul(a, wa));
    case OP_SUM_NEXT: return v_fma(b, wb, a);
    case OP_MAX: return v_select(v_isnan(a), a, v_max(a, b));
    default: return v_select(v_isnan(a), a, v_min(a, b));
    }
}

static inline __attribute__((always_inline)) void span(int op, const float * a, const float * b, float wa, float wb,
                                                       float * d, size_t n)
{
    const vfloat va = v_set1(wa), vb = v_set1(wb);
    size_t j = gap(d) < n ? gap(d) : n;
    if (j) /* up to the first 64-byte boundary of d: the other stores never split a line */
        v_store_n(d, combine(op, v_load_n(a, j), v_load_n(b, j), va, vb), j);
    for (; j + 4 * TN_LANES <= n; j += 4 * TN_LANES) {
        vfloat r0 = combine(op, v_load(a + j + 0 * TN_LANES), v_load(b + j + 0 * TN_LANES), va, vb);
        vfloat r1 = combine(op, v_load(a + j + 1 * TN_LANES), v_load(b + j + 1 * TN_LANES), va, vb);
        vfloat r2 = combine(op, v_load(a + j + 2 * TN_LANES), v_load(b + j + 2 * TN_LANES), va, vb);
        vfloat r3 = combine(op, v_load(a + j + 3 * TN_LANES), v_load(b + j + 3 * TN_LANES), va, vb);
        v_store(d + j + 0 * TN_LANES, r0);
        v_store(d + j + 1 * TN_LANES, r1);
        v_store(d + j + 2 * TN_LANES, r2);
        v_store(d + j + 3 * TN_LANES, r3);
    }
    for (; j + TN_LANES <= n; j += TN_LANES)
        v_store(d + j, combine(op, v_load(a + j), v_load(b + j), va, vb));
    if (j < n)
        v_store_n(d + j, combine(op, v_load_n(a + j, n - j), v_load_n(b + j, n - j), va, vb), n - j);
}

void TN_ISA(SynetEltwiseLayerForward)(float const * const * src, const float * weight, size_t count, size_t size,
                                      int type, float * dst)
{
    /* The first block also takes dst's unaligned head, so the others start on a line. */
    eltwise_forward(src, weight, count, size, type, dst, gap(dst));
}
