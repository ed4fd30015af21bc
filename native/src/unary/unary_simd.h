/*
 * SynetUnaryOperation32f on the vector layer (simd/README.md), compiled once per level by
 * unary/avx512.c and unary/avx2.c. A masked head vector aligns dst to 64 bytes, then 4
 * vectors per iteration, single vectors, and one masked vector for the tail. Each op is
 * the operation sequence of unary/scalar.c (the math from simd/vmath.h), so every level
 * gives bit-identical results.
 */
#include "simd/vmath.h"

#include "kernels.h"
#include "tensorops.h"

V_INLINE vfloat un_abs(vfloat x) { return v_abs(x); }
V_INLINE vfloat un_ceil(vfloat x) { return v_ceil(x); }
V_INLINE vfloat un_floor(vfloat x) { return v_floor(x); }
V_INLINE vfloat un_round(vfloat x) { return v_round(x); }
V_INLINE vfloat un_neg(vfloat x) { return v_neg(x); }
V_INLINE vfloat un_not(vfloat x) { return vi_as_float(vi_xor(v_as_int(x), vi_set1(-1))); }
V_INLINE vfloat un_rcp(vfloat x) { return v_div(v_set1(1.0f), x); }
V_INLINE vfloat un_sqrt(vfloat x) { return v_sqrt(x); }
V_INLINE vfloat un_rsqrt(vfloat x) { return v_div(v_set1(1.0f), v_sqrt(x)); }
V_INLINE vfloat un_exp(vfloat x) { return v_exp(x); }
V_INLINE vfloat un_log(vfloat x) { return v_log(x); }
V_INLINE vfloat un_tanh(vfloat x) { return v_tanh(x); }
V_INLINE vfloat un_erf(vfloat x) { return v_erf(x); }
V_INLINE vfloat un_sin(vfloat x) { return v_sin(x); }
V_INLINE vfloat un_cos(vfloat x) { return v_cos(x); }
V_INLINE vfloat un_nan(vfloat x)
{
    (void)x;
    return v_set1(NAN);
}

/* -1, 0 or +1; sign(+-0) = +0; NaN stays NaN (quieted, as x + x). */
V_INLINE vfloat un_sign(vfloat x)
{
    vfloat y = v_select(v_gt(x, v_zero()), v_set1(1.0f), v_keep(v_lt(x, v_zero()), v_set1(-1.0f)));
    return v_select(v_isnan(x), v_add(x, x), y);
}

/* Outputs of at least this many floats (2 MiB, beyond any L2) are written with
 * non-temporal stores: the main loop's dst is 64-byte aligned, and streaming skips the
 * read-for-ownership of every output line. */
#define UN_STREAM_MIN ((size_t)1 << 19)

/* The head vector aligns dst to 64 bytes (and src too when both share their offset, as
 * NumPy's allocations do), so the main loop does no cache-line-split access. STORE is
 * v_store or v_stream (the latter only when dst is float-aligned). */
#define UN_LOOP(OP, STORE) \
    do { \
        size_t i = (size_t)((0u - (uintptr_t)dst) & 63u) / sizeof(float); \
        if (i > size) \
            i = size; \
        if (i) \
            v_store_n(dst, OP(v_load_n(src, i)), i); \
        for (; i + 4 * TN_LANES <= size; i += 4 * TN_LANES) { \
            vfloat y0 = OP(v_load(src + i + 0 * TN_LANES)); \
            vfloat y1 = OP(v_load(src + i + 1 * TN_LANES)); \
            vfloat y2 = OP(v_load(src + i + 2 * TN_LANES)); \
            vfloat y3 = OP(v_load(src + i + 3 * TN_LANES)); \
            STORE(dst + i + 0 * TN_LANES, y0); \
            STORE(dst + i + 1 * TN_LANES, y1); \
            STORE(dst + i + 2 * TN_LANES, y2); \
            STORE(dst + i + 3 * TN_LANES, y3); \
        } \
        for (; i + TN_LANES <= size; i += TN_LANES) \
            STORE(dst + i, OP(v_load(src + i))); \
        if (i < size) \
            v_store_n(dst + i, OP(v_load_n(src + i, size - i)), size - i); \
    } while (0)

#define UN_RUN(OP) \
    do { \
        if (size >= UN_STREAM_MIN && ((uintptr_t)dst & 3u) == 0) { \
            UN_LOOP(OP, v_stream); \
            v_stream_fence(); \
        } else { \
            UN_LOOP(OP, v_store); \
        } \
    } while (0)

void TN_ISA(SynetUnaryOperation32f)(const float * src, size_t size, int type, float * dst)
{
    switch (type) {
    case TnSynetUnaryOperation32fAbs: UN_RUN(un_abs); break;
    case TnSynetUnaryOperation32fCeil: UN_RUN(un_ceil); break;
    case TnSynetUnaryOperation32fCos: UN_RUN(un_cos); break;
    case TnSynetUnaryOperation32fErf: UN_RUN(un_erf); break;
    case TnSynetUnaryOperation32fExp: UN_RUN(un_exp); break;
    case TnSynetUnaryOperation32fFloor: UN_RUN(un_floor); break;
    case TnSynetUnaryOperation32fLog: UN_RUN(un_log); break;
    case TnSynetUnaryOperation32fNeg: UN_RUN(un_neg); break;
    case TnSynetUnaryOperation32fNot: UN_RUN(un_not); break;
    case TnSynetUnaryOperation32fRcp: UN_RUN(un_rcp); break;
    case TnSynetUnaryOperation32fRound: UN_RUN(un_round); break;
    case TnSynetUnaryOperation32fRsqrt: UN_RUN(un_rsqrt); break;
    case TnSynetUnaryOperation32fSign: UN_RUN(un_sign); break;
    case TnSynetUnaryOperation32fSin: UN_RUN(un_sin); break;
    case TnSynetUnaryOperation32fSqrt: UN_RUN(un_sqrt); break;
    case TnSynetUnaryOperation32fTanh: UN_RUN(un_tanh); break;
    case TnSynetUnaryOperation32fZero: memset(dst, 0, size * sizeof(float)); break;
    default: UN_RUN(un_nan); break;
    }
}
