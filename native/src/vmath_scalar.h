/*
 * Scalar reference math shared by the scalar kernels. The AVX2 and AVX-512 headers
 * implement the same functions with the same operation sequence (same constants, same
 * FMAs, same rounding), so every ISA level returns bit-identical results for them.
 */
#ifndef TN_VMATH_SCALAR_H
#define TN_VMATH_SCALAR_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t tn_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float tn_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

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

/* Constants of exp (Cephes minimax polynomial, Cody-Waite split of ln 2). */
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

/* y * 2^n for n <= -126 (y in [0.7, 1.5), so the result is below 2^-125, denormal or in
 * the lowest binade): y * 2^(n + 149) is exact and normal, and rounding it to an integer
 * rounds to the grid of 2^-149 exactly as the product y * 2^n would (nearest even); the
 * integer is then the result's bit pattern. No arithmetic produces a denormal, which
 * costs a microcode assist (about 10x slower) on x86. */
#define TN_EXP_TINY_N (-126)
static inline float tn_exp_tiny_f32(float y, int32_t n)
{
    float s = y * tn_bits_f32((uint32_t)(n + 149 + 127) << 23);
    return tn_bits_f32((uint32_t)(int32_t)nearbyintf(s));
}

/* exp(x), relative error about 1 ulp; overflows to inf, gradual underflow to 0. The power
 * of two is applied in two halves (or, for results below 2^-125, by tn_exp_tiny_f32), so
 * denormal results are rounded once, correctly. */
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
    if (ni <= TN_EXP_TINY_N)
        return tn_exp_tiny_f32(y, ni);
    int32_t j1 = ni >> 1, j2 = ni - j1;
    y = y * tn_bits_f32((uint32_t)(j1 + 127) << 23);
    return y * tn_bits_f32((uint32_t)(j2 + 127) << 23);
}

/* Natural log, table-driven. x = 2^k z with z in [0.698, 1.396): t = bits(x) - TN_LOG_OFF
 * gives k (its exponent field) and the interval i of z (its top 4 mantissa bits); the 16
 * intervals are 2^19 ulps wide, and the one holding 1 is centred on 1 in value, with
 * c = 1, so that near 1 the result is r = x - 1 (exact) plus a tiny term. Elsewhere
 * c_i ~ 1/midpoint, chosen so that -log(c_i) is within 0.02 ulp of a float (the table
 * adds no rounding), and |log x| > 0.02: r = z c_i - 1 (|r| < 0.0298, one rounding),
 * log x = (k ln2 - log c_i) + (r + r^2 Q(r)). Relative error about 1 ulp; log(0) = -inf,
 * log(x < 0) = NaN, denormals scaled by 2^23 first (exact). */
#define TN_LOG_OFF 0x3f32aaabu
#define TN_LN2 0.693147180559945309f
/* Sixteen values (one vector), eight a line: kept as written. */
/* clang-format off */
static const float TN_LOG_C[16] = {
    1.401430011e+00f, 1.342685342e+00f, 1.288599133e+00f, 1.238685966e+00f, 1.192577124e+00f, 1.149671078e+00f, 1.109807611e+00f, 1.072608471e+00f,
    1.037816882e+00f, 1.000000000e+00f, 9.504835606e-01f, 8.971964717e-01f, 8.495576382e-01f, 8.067233562e-01f, 7.680038214e-01f, 7.328100801e-01f,
};
static const float TN_LOG_L[16] = { /* -log(TN_LOG_C[i]) */
    -3.374931514e-01f, -2.946715951e-01f, -2.535556853e-01f, -2.140511125e-01f, -1.761166155e-01f, -1.394758821e-01f, -1.041866764e-01f, -7.009350508e-02f,
    -3.711935505e-02f, 0.0f, 5.078441277e-02f, 1.084804088e-01f, 1.630394906e-01f, 2.147744745e-01f, 2.639605701e-01f, 3.108687103e-01f,
};
/* clang-format on */
#define TN_LOG_Q0 (-4.999999702e-01f)
#define TN_LOG_Q1 3.334794641e-01f
#define TN_LOG_Q2 (-2.501562834e-01f)

/* The table step of tn_log_f32 for a positive normal x, kadj (0 or -23) added to k. */
static inline float tn_log_core_f32(float x, float kadj)
{
    uint32_t u = tn_f32_bits(x);
    uint32_t t = u - TN_LOG_OFF;
    float k = (float)((int32_t)t >> 23) + kadj;
    float z = tn_bits_f32(u - (t & 0xff800000u));
    uint32_t i = (t >> 19) & 15u;
    float r = fmaf(z, TN_LOG_C[i], -1.0f);
    float hi = fmaf(k, TN_LN2, TN_LOG_L[i]);
    float q = fmaf(TN_LOG_Q2, r, TN_LOG_Q1);
    q = fmaf(q, r, TN_LOG_Q0);
    return hi + fmaf(r * r, q, r);
}

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
    if (x < FLT_MIN)
        return tn_log_core_f32(x * 8388608.0f, -23.0f); /* 2^23 */
    return tn_log_core_f32(x, 0.0f);
}

/* ---------------------------------------------------------------------------------------
 * Unary math (tanh, erf, sin, cos) and a table-driven pow for LRN. Like exp and log above,
 * the AVX2 and AVX-512 headers repeat these operation for operation, so all three levels
 * return bit-identical results. Helpers below give scalar code the exact semantics of the
 * vector instructions where C differs (min/max with NaN, float -> int32 overflow).
 * Coefficients are minimax fits (Lawson's algorithm in float64, rounded to float32).
 * ------------------------------------------------------------------------------------- */

/* _mm_min_ps / _mm_max_ps: the second operand when either is NaN. */
static inline float tn_minps_f32(float a, float b) { return a < b ? a : b; }
static inline float tn_maxps_f32(float a, float b) { return a > b ? a : b; }

/* _mm_cvttps_epi32: truncation; NaN and out-of-range values give INT32_MIN. */
static inline int32_t tn_cvttps_i32(float f)
{
    return (f >= -2147483648.0f && f < 2147483648.0f) ? (int32_t)f : INT32_MIN;
}

static inline float tn_abs_f32(float x) { return tn_bits_f32(tn_f32_bits(x) & 0x7fffffffu); }

/* Piecewise polynomials on 8 intervals of |x|: coefficient k of interval i is C[k][i]
 * (8-entry rows, one vector permute per coefficient), evaluated by Horner's rule in
 * t = |x| - MID[i] (exact: Sterbenz). Interval 0 has MID = 0 and C[0] = 0, so tiny
 * arguments keep full relative accuracy. */

/* tanh: intervals [0,1/8) [1/8,1/4) ... [4,8) [8,9.1] from the exponent of |x|; |x| is
 * clamped to 9.1, where tanh rounds to 1. Relative error about 2e-7. The polynomials stay
 * in [0, 1] for every float of their domain (checked exhaustively), so no final clamp. */
#define TN_TANH_MAXARG 9.1f
static const float TN_TANH_MID[8] = {0.0f, 0.1875f, 0.375f, 0.75f, 1.5f, 3.0f, 6.0f, 8.5f};
/* One line per polynomial term, one column per interval: kept as written. */
/* clang-format off */
static const float TN_TANH_C[9][8] = {
    {0.000000000e+00, 1.853332072e-01, 3.583573997e-01, 6.351489425e-01, 9.051482677e-01, 9.950547814e-01, 9.999877214e-01, 9.999999404e-01},
    {1.000000000e+00, 9.656516314e-01, 8.715800047e-01, 5.965858102e-01, 1.807066053e-01, 9.866146371e-03, 2.435725219e-05, 1.655974700e-07},
    {3.807822807e-11, -1.789672971e-01, -3.123371303e-01, -3.789208531e-01, -1.635660380e-01, -9.817649610e-03, -2.437848525e-05, -1.655976547e-07},
    {-3.333333433e-01, -2.887152731e-01, -1.785983592e-01, 4.180900380e-02, 8.781827986e-02, 6.478611380e-03, 1.710087781e-05, 1.103993981e-07},
    {4.114653507e-07, 1.131642908e-01, 1.681144536e-01, 9.975334257e-02, -2.497147769e-02, -3.172876080e-03, -8.522319149e-06, -5.519575907e-08},
    {1.333203465e-01, 9.672405571e-02, 1.866085455e-02, -6.402222067e-02, -2.688908949e-03, 1.223822939e-03, 2.651863952e-06, 2.206540373e-08},
    {2.230378886e-04, -5.962353200e-02, -6.966783106e-02, -1.052748645e-03, 7.159123663e-03, -3.790381306e-04, -8.952898725e-07, -7.380239975e-09},
    {-5.609592423e-02, -2.958391979e-02, 1.253132522e-02, 2.134902962e-02, -3.820426995e-03, 8.229516243e-05, 5.062785817e-07, 2.172978686e-09},
    {1.062851027e-02, 2.804559283e-02, 2.296861820e-02, -9.579054080e-03, 7.630899199e-04, -6.759702046e-06, -1.249420620e-07, -4.935007403e-10},
};
/* clang-format on */

static inline float tn_tanh_f32(float x)
{
    uint32_t sign = tn_f32_bits(x) & 0x80000000u;
    float a = tn_minps_f32(TN_TANH_MAXARG, tn_abs_f32(x));
    int32_t i = (int32_t)(tn_f32_bits(a) >> 23) - 123;
    i = (i < 0 ? 0 : i) & 7; /* <= 7 but for NaN (any row, the result is NaN) */
    float t = a - TN_TANH_MID[i];
    float p = TN_TANH_C[8][i];
    for (int k = 7; k >= 0; --k)
        p = fmaf(p, t, TN_TANH_C[k][i]);
    return tn_bits_f32(tn_f32_bits(p) | sign);
}

/* erf: 8 intervals of |x| centred on i/2 (i = round(2|x|), read from the low bits of
 * 2|x| + 1.5 * 2^23; interval 0 is [0, 1/4]), a quintic in t = |x| - i/2 (exact), its
 * coefficients looked up like tanh's. |x| is clamped to the float below 3.75 (so 2|x|
 * rounds to 7, not to 8), where erf is within 1.2e-7 of 1: the last interval's constant is
 * raised so that it gives exactly 1 there. Absolute error about 4e-7 (interval 0 is fitted
 * for relative error, so tiny arguments keep 2/sqrt(pi) x); the polynomials stay in [0, 1]
 * (checked over every float). */
#define TN_ERF_MAXARG 3.74999976f
#define TN_ERF_SHIFT 12582912.0f /* 1.5 * 2^23 */
/* One line per polynomial term, as for tanh: kept as written. */
/* clang-format off */
static const float TN_ERF_C[6][8] = {
    {0.000000000e+00f, 5.204995275e-01f, 8.427008390e-01f, 9.661052823e-01f, 9.953222871e-01f, 9.995930195e-01f, 9.999778867e-01f, 9.999993443e-01f},
    {1.128379107e+00f, 8.787828088e-01f, 4.151081145e-01f, 1.189300790e-01f, 2.066684887e-02f, 2.178307623e-03f, 1.392710255e-04f, 5.402187981e-06f},
    {6.983314051e-06f, -4.392836094e-01f, -4.151160121e-01f, -1.784373522e-01f, -4.133517295e-02f, -5.439623259e-03f, -4.161098041e-04f, -1.871989662e-05f},
    {-3.763317466e-01f, -1.464876533e-01f, 1.383036673e-01f, 1.387730688e-01f, 4.823772609e-02f, 8.347709663e-03f, 7.872809656e-04f, 4.201688716e-05f},
    {2.020223765e-03f, 1.784584224e-01f, 6.957469136e-02f, -4.280392081e-02f, -3.439354524e-02f, -8.882846683e-03f, -1.114491373e-03f, -7.524093962e-05f},
    {1.059560776e-01f, 7.974995300e-03f, -6.735238433e-02f, -1.544031966e-02f, 1.267653517e-02f, 6.182382349e-03f, 1.065525343e-03f, 8.956461534e-05f},
};
/* clang-format on */

static inline float tn_erf_f32(float x)
{
    uint32_t sign = tn_f32_bits(x) & 0x80000000u;
    float a = tn_minps_f32(TN_ERF_MAXARG, tn_abs_f32(x));
    float s = fmaf(a, 2.0f, TN_ERF_SHIFT);
    uint32_t i = tn_f32_bits(s) & 7u; /* for NaN any row: the result is NaN */
    float t = fmaf(s - TN_ERF_SHIFT, -0.5f, a);
    float p = TN_ERF_C[5][i];
    for (int k = 4; k >= 0; --k)
        p = fmaf(p, t, TN_ERF_C[k][i]);
    return tn_bits_f32(tn_f32_bits(p) | sign);
}

/* sin and cos: n = round(|x| * 2/pi), r = |x| - n*pi/2 by Cody-Waite with a 3-part pi/2
 * (FMA keeps each step exact but for one rounding), then the quadrant n mod 4 picks
 * +-sin(r) or +-cos(r). Cody-Waite is accurate while n is the nearest integer and n*pi/2
 * is exact enough (|x| <= 1e6); beyond TN_SINCOS_BIG, (n mod 4, r) come from
 * tn_pio2_reduce_big instead, exact for every float. inf and NaN give NaN. */
#define TN_2_OVER_PI 6.36619747e-01f
#define TN_PIO2_1 1.570796371e+00f
#define TN_PIO2_2 (-4.371138829e-08f)
#define TN_PIO2_3 (-1.776356839e-15f)
#define TN_SIN_S1 (-1.666664779e-01f)
#define TN_SIN_S2 8.331836201e-03f
#define TN_SIN_S3 (-1.947795972e-04f)
#define TN_COS_C1 4.166664183e-02f
#define TN_COS_C2 (-1.388720702e-03f)
#define TN_COS_C3 2.441985635e-05f

#define TN_SINCOS_BIG 131072.0f /* 2^17: above, the exact reduction */

/* The bits of 2/pi after the binary point, 32 to a word, behind one zero word (the
 * reduction below reads windows that start up to 31 bits before the point). */
static const uint32_t TN_2_OVER_PI_BITS[8] = {
    0x00000000u, 0xa2f9836eu, 0x4e441529u, 0xfc2757d1u, 0xf534ddc0u, 0xdb629599u, 0x3c439041u, 0xfe5163abu,
};

/* Exact argument reduction for a = |x| > TN_SINCOS_BIG (Payne-Hanek, in integers):
 * a = m 2^e with m a 24-bit integer; bits of 2/pi worth 2^2 or more after multiplying by
 * a only add multiples of 4 quadrants, so a 96-bit window W of 2/pi starting at bit e-1
 * gives a * 2/pi = m W 2^-94 mod 4, wrong by less than 2^-70 of a quadrant. The top 2 bits
 * of the 96-bit product are the quadrant, the rest the fraction, taken in [-1/2, 1/2)
 * (rounding the quadrant up when it is >= 1/2); r = fraction * pi/2. Returns r, sets *q
 * to the quadrant (mod 4). inf (and NaN) give NaN. */
static inline float tn_pio2_reduce_big(float a, int32_t * q)
{
    uint32_t u = tn_f32_bits(a);
    *q = 0;
    if (u >= 0x7f800000u)
        return a - a;
    uint32_t m = (u & 0x007fffffu) | 0x00800000u;
    int s = (int)(u >> 23) - 150 + 30; /* table bit of 2/pi bit e-1; >= 0 for a >= 2^-7 */
    const uint32_t * t = TN_2_OVER_PI_BITS + (s >> 5);
    unsigned __int128 w =
        ((unsigned __int128)t[0] << 96) | ((unsigned __int128)t[1] << 64) | ((unsigned __int128)t[2] << 32) | t[3];
    w = (w << (s & 31)) >> 32; /* the 96-bit window */
    unsigned __int128 p = w * m;
    uint64_t top = (uint64_t)(p >> 32); /* product bits 32..95: quadrant, fraction */
    int64_t f = (int64_t)(top << 2);    /* fraction - (1 if >= 1/2), in units of 2^-64 */
    *q = (int32_t)((top >> 62) + (f < 0 ? 1u : 0u));
    return (float)((double)f * (1.5707963267948966 * 0x1p-64));
}

static inline float tn_sincos_f32(float x, int cosine)
{
    uint32_t sign = cosine ? 0u : tn_f32_bits(x) & 0x80000000u;
    float a = tn_abs_f32(x);
    float n = nearbyintf(a * TN_2_OVER_PI);
    float r = fmaf(n, -TN_PIO2_1, a);
    r = fmaf(n, -TN_PIO2_2, r);
    r = fmaf(n, -TN_PIO2_3, r);
    int32_t q0 = tn_cvttps_i32(n);
    if (a > TN_SINCOS_BIG)
        r = tn_pio2_reduce_big(a, &q0);
    uint32_t q = (uint32_t)q0 + (uint32_t)cosine;
    float z = r * r;
    float ps = TN_SIN_S3;
    ps = fmaf(ps, z, TN_SIN_S2);
    ps = fmaf(ps, z, TN_SIN_S1);
    float s = fmaf(r * z, ps, r);
    float pc = TN_COS_C3;
    pc = fmaf(pc, z, TN_COS_C2);
    pc = fmaf(pc, z, TN_COS_C1);
    pc = fmaf(pc, z, -0.5f);
    float c = fmaf(pc, z, 1.0f);
    float y = (q & 1u) ? c : s;
    y = tn_bits_f32(tn_f32_bits(y) ^ ((q << 30) & 0x80000000u) ^ sign);
    return tn_minps_f32(1.0f, tn_maxps_f32(-1.0f, y));
}

static inline float tn_sin_f32(float x) { return tn_sincos_f32(x, 0); }
static inline float tn_cos_f32(float x) { return tn_sincos_f32(x, 1); }

/* pow(b, e) = 2^(e log2 b) for b a positive normal float and |e| <= TN_POW_MAX_EXP.
 * log2 b: b = 2^k m, m in [1, 2); the top 3 mantissa bits j pick c_j ~ 1/m, r = m c_j - 1
 * (|r| < 1/17), log2 m = -log2 c_j + r P(r); y = e k + e log2 m with one rounding.
 * exp2: y = n + f with n a multiple of 1/8 (|f| <= 1/16), 2^y = 2^floor(n) 2^frac(n) 2^f,
 * 2^frac(n) from an 8-entry table and 2^f a cubic. Relative error about 2e-7 + 3e-8 |y|
 * (y is a float). The power of two is applied in two halves (AVX-512: one vscalefps, the
 * same single rounding); y is clamped to [-200, 200], beyond which the result is 0 or inf
 * anyway. */
#define TN_POW_MAX_EXP 3000.0f
#define TN_EXP2T_SHIFT 1572864.0f /* 1.5 * 2^20: ulp 1/8 */
/* One table per line (eight intervals each): kept as written. */
/* clang-format off */
static const float TN_LOG2T_C[8] = {9.411764741e-01f, 8.421052694e-01f, 7.619047761e-01f, 6.956521869e-01f, 6.399999857e-01f, 5.925925970e-01f, 5.517241359e-01f, 5.161290169e-01f};
static const float TN_LOG2T_T[8] = {8.746283501e-02f, 2.479275018e-01f, 3.923173845e-01f, 5.235619545e-01f, 6.438562274e-01f, 7.548874617e-01f, 8.579810262e-01f, 9.541963339e-01f};
/* clang-format on */
#define TN_LOG2T_P0 1.442694f
#define TN_LOG2T_P1 (-0.72134566f)
#define TN_LOG2T_P2 0.482144f
#define TN_LOG2T_P3 (-0.36204576f)
/* Eight values, one line, like the tables above. */
/* clang-format off */
static const float TN_EXP2T_T[8] = {1.000000000e+00f, 1.090507746e+00f, 1.189207077e+00f, 1.296839595e+00f, 1.414213538e+00f, 1.542210817e+00f, 1.681792855e+00f, 1.834008098e+00f};
/* clang-format on */
#define TN_EXP2T_P1 0.69314724f
#define TN_EXP2T_P2 0.24025764f
#define TN_EXP2T_P3 0.05549622f

static inline float tn_powpos_f32(float b, float e)
{
    uint32_t u = tn_f32_bits(b);
    uint32_t j = (u >> 20) & 7u;
    float k = (float)((int32_t)(u >> 23) - 127);
    float m = tn_bits_f32((u & 0x007fffffu) | 0x3f800000u);
    float r = fmaf(m, TN_LOG2T_C[j], -1.0f);
    float q = TN_LOG2T_P3;
    q = fmaf(q, r, TN_LOG2T_P2);
    q = fmaf(q, r, TN_LOG2T_P1);
    q = fmaf(q, r, TN_LOG2T_P0);
    float l = fmaf(r, q, TN_LOG2T_T[j]);
    float y = fmaf(e, k, e * l); /* e k exact inside the fma: one rounding */
    y = tn_minps_f32(tn_maxps_f32(y, -200.0f), 200.0f);
    float t = y + TN_EXP2T_SHIFT; /* rounds y to a multiple of 1/8: n = t - SHIFT */
    float f = y - (t - TN_EXP2T_SHIFT);
    int32_t ni = (int32_t)(tn_f32_bits(t) - tn_f32_bits(TN_EXP2T_SHIFT)); /* 8 n */
    float p = TN_EXP2T_P3;
    p = fmaf(p, f, TN_EXP2T_P2);
    p = fmaf(p, f, TN_EXP2T_P1);
    p = p * f;
    p = fmaf(p, TN_EXP2T_T[ni & 7], TN_EXP2T_T[ni & 7]);
    int32_t h = ni >> 3;
    int32_t h1 = h >> 1, h2 = h - h1;
    p = p * tn_bits_f32((uint32_t)(h1 + 127) << 23);
    return p * tn_bits_f32((uint32_t)(h2 + 127) << 23);
}

/* True when tn_powpos_f32 applies to b (positive, normal, finite). */
static inline int tn_pow_fast_base(float b) { return b >= FLT_MIN && b <= FLT_MAX; }

/* pow for any b and e: the fast path above, C's powf for the rest (zero, negative,
 * denormal, inf and NaN bases follow C99 pow, as numpy.power does; so do huge or
 * non-finite exponents). */
static inline float tn_pow_f32(float b, float e)
{
    return tn_pow_fast_base(b) && fabsf(e) <= TN_POW_MAX_EXP ? tn_powpos_f32(b, e) : powf(b, e);
}

/* LRN across channels (lrn_*.c): windows with half <= this are summed directly, in
 * channel order; wider ones with block suffix/prefix sums (van Herk / Gil-Werman: blocks
 * of 2*half channels, each window = a suffix of one block + a prefix of the next). Every
 * level uses the same rule and order, so all levels give bit-identical results. */
#define TN_LRN_DIRECT_HALF 4

/* The number of leading values whose mean centers one-pass statistics (gnorm, the BF16
 * layer norm): the largest power of two <= min(n, 16), so their sum in the 16-lane tree and
 * its product by 1 / count are exact for a constant row. */
static inline size_t tn_lead_count(size_t n) { return n >= 16 ? 16 : n >= 8 ? 8 : n >= 4 ? 4 : n >= 2 ? 2 : 1; }

/* The sum of 16 lanes in v_hsum's fixed tree: (l + l+8), (l + l+4), then (0+2) + (1+3). */
static inline float tn_sum16(const float * a)
{
    float s[8], q[4];
    for (int l = 0; l < 8; ++l)
        s[l] = a[l] + a[l + 8];
    for (int l = 0; l < 4; ++l)
        q[l] = s[l] + s[l + 4];
    return (q[0] + q[2]) + (q[1] + q[3]);
}

/* The canonical 16-lane reduction tree across lane arrays: lane i (i < L <= 16) holds w
 * partial sums at lane + i * stride; lane 0 receives (i, i+8), then (i, i+4), then
 * (0+2) + (1+3) of each position (simd/reduce.h does the same with vectors). Absent lanes
 * are skipped: they would add +0.0f, which changes no sum. */
static inline void tn_lanes_tree(float * lane, size_t stride, size_t L, size_t w)
{
    for (size_t h = 8, n = L; h >= 1; n = n < h ? n : h, h /= 2)
        for (size_t i = 0; i < h && i + h < n; ++i)
            for (size_t p = 0; p < w; ++p)
                lane[i * stride + p] += lane[(i + h) * stride + p];
}

#endif
