/*
 * SynetUnaryOperation32f, scalar reference. Each operation maps every element on its own;
 * the math functions come from vmath_scalar.h, which unary_simd.h reproduces bit for
 * bit, so all three levels give identical results. An unknown type fills dst with NaN.
 */
#include "vmath_scalar.h"

#include "kernels.h"
#include "tensorops.h"

#define TN_UNARY_MAP(EXPR) \
    do { \
        for (size_t i = 0; i < size; ++i) { \
            float x = src[i]; \
            dst[i] = (EXPR); \
        } \
    } while (0)

static inline float tn_not_f32(float x) { return tn_bits_f32(~tn_f32_bits(x)); }
static inline float tn_neg_f32(float x) { return tn_bits_f32(tn_f32_bits(x) ^ 0x80000000u); }
static inline float tn_rsqrt_f32(float x) { return 1.0f / sqrtf(x); }
/* ceilf/floorf may return a signaling NaN unchanged; vroundps quiets it. */
static inline float tn_ceil_f32(float x) { return x != x ? x + x : ceilf(x); }
static inline float tn_floor_f32(float x) { return x != x ? x + x : floorf(x); }

/* -1, 0 or +1; sign(+-0) = +0; NaN stays NaN. */
static inline float tn_sign_f32(float x)
{
    if (x > 0.0f)
        return 1.0f;
    if (x < 0.0f)
        return -1.0f;
    return x == 0.0f ? 0.0f : x + x;
}

void tn_scalar_SynetUnaryOperation32f(const float * src, size_t size, int type, float * dst)
{
    switch (type) {
    case TnSynetUnaryOperation32fAbs: TN_UNARY_MAP(tn_abs_f32(x)); break;
    case TnSynetUnaryOperation32fCeil: TN_UNARY_MAP(tn_ceil_f32(x)); break;
    case TnSynetUnaryOperation32fCos: TN_UNARY_MAP(tn_cos_f32(x)); break;
    case TnSynetUnaryOperation32fErf: TN_UNARY_MAP(tn_erf_f32(x)); break;
    case TnSynetUnaryOperation32fExp: TN_UNARY_MAP(tn_exp_f32(x)); break;
    case TnSynetUnaryOperation32fFloor: TN_UNARY_MAP(tn_floor_f32(x)); break;
    case TnSynetUnaryOperation32fLog: TN_UNARY_MAP(tn_log_f32(x)); break;
    case TnSynetUnaryOperation32fNeg: TN_UNARY_MAP(tn_neg_f32(x)); break;
    case TnSynetUnaryOperation32fNot: TN_UNARY_MAP(tn_not_f32(x)); break;
    case TnSynetUnaryOperation32fRcp: TN_UNARY_MAP(1.0f / x); break;
    case TnSynetUnaryOperation32fRound: TN_UNARY_MAP(nearbyintf(x)); break;
    case TnSynetUnaryOperation32fRsqrt: TN_UNARY_MAP(tn_rsqrt_f32(x)); break;
    case TnSynetUnaryOperation32fSign: TN_UNARY_MAP(tn_sign_f32(x)); break;
    case TnSynetUnaryOperation32fSin: TN_UNARY_MAP(tn_sin_f32(x)); break;
    case TnSynetUnaryOperation32fSqrt: TN_UNARY_MAP(sqrtf(x)); break;
    case TnSynetUnaryOperation32fTanh: TN_UNARY_MAP(tn_tanh_f32(x)); break;
    case TnSynetUnaryOperation32fZero: memset(dst, 0, size * sizeof(float)); break;
    default: TN_UNARY_MAP(((void)x, NAN)); break;
    }
}
