/*
 * Scalar reference math shared by the scalar kernels. The AVX2 and AVX-512 headers
 * implement the same functions with the same operation sequence (same constants, same
 * FMAs, same rounding), so every ISA level returns bit-identical results for them.
 */
#ifndef TN_VMATH_SCALAR_H
#define TN_VMATH_SCALAR_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t tn_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float tn_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* BF16 -> FP32 is exact. */
static inline float tn_bf16_to_f32(uint16_t b) { return tn_bits_f32((uint32_t)b << 16); }

/* FP32 -> BF16: round to nearest, ties to even; NaN stays a quiet NaN with its sign;
 * overflow goes to infinity; denormals are kept. */
static inline uint16_t tn_f32_to_bf16(float f)
{
    uint32_t u = tn_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Constants of exp and log (Cephes minimax polynomials, Cody-Waite split of ln 2). */
#define TN_LOG2E 1.44269504088896341f
#define TN_LN2_HI 0.693359375f
#define TN_LN2_LO (-2.12194440e-4f)
#define TN_EXP_P0 1.9875691500e-4f
#define TN_EXP_P1 1.3981999507e-3f
#define TN_EXP_P2 8.3334519073e-3f
#define TN_EXP_P3 4.1665795894e-2f
#define TN_EXP_P4 1.6666665459e-1f
#define TN_EXP_P5 5.0000001201e-1f
#define TN_EXP_MIN (-104.0f) /* below: result rounds to +0 */
#define TN_EXP_MAX 89.0f     /* above: result overflows to +inf */
#define TN_LOG_P0 7.0376836292e-2f
#define TN_LOG_P1 (-1.1514610310e-1f)
#define TN_LOG_P2 1.1676998740e-1f
#define TN_LOG_P3 (-1.2420140846e-1f)
#define TN_LOG_P4 1.4249322787e-1f
#define TN_LOG_P5 (-1.6668057665e-1f)
#define TN_LOG_P6 2.0000714765e-1f
#define TN_LOG_P7 (-2.4999993993e-1f)
#define TN_LOG_P8 3.3333331174e-1f
#define TN_SQRTHF 0.707106781186547524f

/* exp(x), relative error about 1 ulp; overflows to inf, gradual underflow to 0. The power
 * of two is applied in two halves so denormal results are rounded once, correctly. */
static inline float tn_exp_f32(float x)
{
    if (x != x)
        return x + x;
    x = fminf(fmaxf(x, TN_EXP_MIN), TN_EXP_MAX);
    float n = nearbyintf(x * TN_LOG2E);
    float r = fmaf(n, -TN_LN2_HI, x);
    r = fmaf(n, -TN_LN2_LO, r);
    float p = TN_EXP_P0;
    p = fmaf(p, r, TN_EXP_P1);
    p = fmaf(p, r, TN_EXP_P2);
    p = fmaf(p, r, TN_EXP_P3);
    p = fmaf(p, r, TN_EXP_P4);
    p = fmaf(p, r, TN_EXP_P5);
    float y = fmaf(p, r * r, r) + 1.0f;
    int32_t ni = (int32_t)n;
    int32_t j1 = ni >> 1, j2 = ni - j1;
    y = y * tn_bits_f32((uint32_t)(j1 + 127) << 23);
    return y * tn_bits_f32((uint32_t)(j2 + 127) << 23);
}

/* Natural log, relative error about 1 ulp; log(0) = -inf, log(x < 0) = NaN, denormals
 * handled exactly. */
static inline float tn_log_f32(float x)
{
    if (x != x)
        return x + x;
    if (x < 0.0f)
        return NAN;
    if (x == 0.0f)
        return -INFINITY;
    if (x == INFINITY)
        return x;
    float e_adjust = 0.0f;
    if (x < FLT_MIN) {
        x *= 8388608.0f; /* 2^23 */
        e_adjust = -23.0f;
    }
    uint32_t u = tn_f32_bits(x);
    float e = (float)((int32_t)(u >> 23) - 126) + e_adjust;
    float m = tn_bits_f32((u & 0x007fffffu) | 0x3f000000u); /* [0.5, 1) */
    if (m < TN_SQRTHF) {
        e = e - 1.0f;
        m = m + m - 1.0f;
    } else {
        m = m - 1.0f;
    }
    float z = m * m;
    float p = TN_LOG_P0;
    p = fmaf(p, m, TN_LOG_P1);
    p = fmaf(p, m, TN_LOG_P2);
    p = fmaf(p, m, TN_LOG_P3);
    p = fmaf(p, m, TN_LOG_P4);
    p = fmaf(p, m, TN_LOG_P5);
    p = fmaf(p, m, TN_LOG_P6);
    p = fmaf(p, m, TN_LOG_P7);
    p = fmaf(p, m, TN_LOG_P8);
    float y = p * m * z;
    y = fmaf(e, TN_LN2_LO, y);
    y = fmaf(z, -0.5f, y);
    float r = m + y;
    return fmaf(e, TN_LN2_HI, r);
}

#endif
