/*
 * The exp of BF16 softmax, scalar form; softmax_simd.h repeats it operation for operation
 * (sm_exp_bf16), so the levels agree bit for bit.
 *
 * A BF16 result keeps 8 significant bits, so exp needs far less than fp32 accuracy: this
 * one is 2^t with t = d * log2(e), n = round(t) taken in the same FMA (adding 1.5 * 2^23
 * rounds to an integer), f = d * log2(e) - n in [-0.5, 0.5] from one more FMA, and a degree-3
 * minimax polynomial for 2^f (relative error below 7.5e-5 evaluated in fp32, plus the
 * rounding of log2(e) over the range: far inside half a BF16 ulp, and one FMA fewer than
 * degree 4). The power of two is added to the exponent field;
 * results below 2^-125 take tn_exp_tiny_f32, so gradual underflow is kept.
 */
#ifndef TN_SOFTMAX_EXP_H
#define TN_SOFTMAX_EXP_H

#include "vmath_scalar.h"

#define SM_LOG2E 1.4426950409f
#define SM_ROUND 12582912.0f /* 1.5 * 2^23: x + SM_ROUND has ulp 1 */
#define SM_EXP2_P3 5.5171668530e-02f
#define SM_EXP2_P2 2.4261112511e-01f
#define SM_EXP2_P1 6.9326096773e-01f
#define SM_EXP2_P0 9.9992805719e-01f

/* exp(d) for d <= 0 (such as x - max) or NaN. */
static inline float sm_exp_bf16_scalar(float d)
{
    if (d != d)
        return d + d;
    d = fmaxf(d, TN_EXP_MIN);
    float s = fmaf(d, SM_LOG2E, SM_ROUND);
    float n = s - SM_ROUND;
    float f = fmaf(d, SM_LOG2E, -n);
    float p = SM_EXP2_P3;
    p = fmaf(p, f, SM_EXP2_P2);
    p = fmaf(p, f, SM_EXP2_P1);
    p = fmaf(p, f, SM_EXP2_P0);
    int32_t ni = (int32_t)n;
    if (ni <= TN_EXP_TINY_N)
        return tn_exp_tiny_f32(p, ni);
    return p * tn_bits_f32((uint32_t)(ni + 127) << 23); /* exact: normal */
}

#endif
