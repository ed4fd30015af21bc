/*
 * LRN's own power b^e for |e| <= LRN_POW_MAX_EXP (every LRN in practice: beta in [0, 1]).
 * For a base with biased exponent K in [LRN_K_LO, LRN_K_HI] (2^-100 <= b < 2^101):
 *   b = 2^k m, m in [1, 2), j the top 3 bits of m, c_j = 16 / (17 + 2j) ~ 1 / m,
 *   r = fma(m, c_j, -1) (|r| <= 1/17),
 *   b^e = 2^(e k) c_j^-e (1 + r)^e,
 * with (1 + r)^e = 1 + r P(r), P the binomial series of e to r^4 with the r^5 and r^6
 * terms folded in over |r| <= 1/17 (Chebyshev economization), and g = c_j^-e 2^(e k)
 * from a per-call table times an exact-argument exp2. Operation sequence (scalar.c); g r
 * is formed beside P's Horner chain, so no multiply follows it:
 *   t = fma(fma(fma(a3, r, a2), r, a1), r, a0);  g = A_j * E(k);  b^e = fma(g * r, t, g).
 * Other bases (0, negative, denormal, tiny, huge, inf, NaN) and larger |e| take the
 * shared tn_pow_f32 / v_pow. All lanes of one call share e, so the tables are set once
 * per call; when a vector's bases share one K, ck_j = c_j 2^-k (exact) gives r = fma(b,
 * ck_j, -1), the same r, and G_j = A_j E(k) the same g: one table lookup each and no
 * exponent work (lrn_simd.h).
 */
#ifndef TN_LRN_POW_H
#define TN_LRN_POW_H

#include <stdint.h>

#define LRN_POW_MAX_EXP 1.0f
#define LRN_K_LO 27
#define LRN_K_HI 227

/* 2^f = 1 + f Q(f) on |f| <= 1/2 (relative error 2e-9 before rounding). */
static const float LRN_EXP2_Q[6] = {6.931471825e-01f, 2.402264774e-01f, 5.550332367e-02f,
                                    9.618436918e-03f, 1.339899725e-03f, 1.535362244e-04f};

typedef struct {
    float e;
    float a[4];  /* P(r) = a0 + a1 r + a2 r^2 + a3 r^3 */
    float c[8];  /* c_j */
    float A[8];  /* c_j^-e, rounded once */
    int32_t K;   /* biased exponent the two tables below are for; -1 for none */
    float ck[8]; /* c_j 2^-k */
    float G[8];  /* A_j E(k) */
} LrnPow;

/* Defined once in scalar.c, so every level uses the same tables. */
void tn_lrn_pow_init(LrnPow * p, float e);
void tn_lrn_pow_set_k(LrnPow * p, int32_t K);
float tn_lrn_pow(const LrnPow * p, float b);

#endif
