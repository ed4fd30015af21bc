/*
 * Generic normalization (TensorRT INormalization, DirectML MVN1): what the scalar reference
 * (gnorm/scalar.c) and the vector levels (gnorm/gnorm_simd.h, compiled by gnorm/avx2.c and
 * gnorm/avx512.c) share. Include after the level's header.
 *
 * Every level computes the same fp32 values with the same operation sequence, so results
 * are bit-identical on every level and for every dtype:
 *   - statistics (tn_gn_sums below, the same steps for a row and for a column position):
 *     one pass over y = x - c, c the mean of the first 16 (or 8, 4, 2, 1) values of the row
 *     (a sum exact for a constant row: c is then that value), summing y and y^2 (fma); with
 *     m1 = sum(y) / n, var = sum(y^2) / n - m1^2 and mean = c + m1. A constant row has y = 0,
 *     so its mean is exact and its centered values are exactly 0. When c is far from the
 *     mean (m1^2 > var, the sum of squares would cancel), a second pass about that mean
 *     gives d = x - mean: mean += sum(d) / n, var = sum(d^2) / n - (sum(d) / n)^2;
 *   - rows whose sums overflow (|x| beyond ~1e18) or whose variance is below 2^-100 with
 *     eps below 2^-76 (squares that underflow) are scaled by p = 2^s, the power of two that
 *     puts max|x| in [1, 2) (s within [-126, 127]), and eps by p^2: x * p is exact, so the
 *     result is that of exact arithmetic on the row, rounded as for an ordinary row. A row
 *     holding an infinity or a NaN gives NaN everywhere;
 *   - sums use fixed lane orders. Rows: 64 lanes, element i of the row goes to lane i % 64
 *     (four 16-lane accumulators, so that one row has four independent chains), in blocks of
 *     TN_GN_BLOCK elements whose lane sums are added, block after block, into lane totals;
 *     totals l, 16 + l, 32 + l, 48 + l are added as (0 + 1) + (2 + 3), then the 16 lanes are
 *     reduced as v_hsum does (i + (i + 8), then i + (i + 4), then (0 + 2) + (1 + 3)). Columns:
 *     for each position, row r goes to lane r % 16, reduced with the same 16-lane tree. Each
 *     lane adds its elements in increasing order starting from +0.0f; a lane started at +0.0f
 *     and rounded to nearest is never -0.0f, so adding +0.0f (masked tails, absent lanes) or
 *     skipping it gives the same sum;
 *   - k = 1 / sqrt(var + eps), and k = 0 when var + eps == 0 (eps = 0 on a constant row: the
 *     normalized value is 0, the limit eps -> 0+); without variance normalization k = 1 / p;
 *   - y = act(fma(((x * p) - mean) * k, scale, bias)) (an absent scale is 1, an absent bias
 *     +0; x * p only for scaled rows);
 *   - a NaN result becomes the quiet NaN 0x7FC00000 (the payload of a NaN would otherwise
 *     depend on the order in which the compiler puts the operands of a commutative operation),
 *     then the value is rounded once to the output dtype (RNE; FP16 and BF16 keep denormals).
 * The activations are written with add, sub, mul, div, sqrt, fma, compare-and-select,
 * tn_exp_f32, tn_log_f32 and tn_tanh_f32 only (bit-identical on every level); selects mirror
 * the vector instructions: min(a, b) = a < b ? a : b and max(a, b) = a > b ? a : b (MINPS /
 * MAXPS, which return b when either is NaN).
 */
#ifndef TN_GNORM_H
#define TN_GNORM_H

#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "tensorops.h"

/* Rows kernel: while a row is written, the input this far ahead (at least one row) is
 * prefetched. From DRAM, layer norm (8,197,768) ran 10-20% faster one row (3 KiB) ahead
 * than 16 KiB ahead, 4 and 8 KiB in between (measured on Zen 4; in cache no difference). */
#ifndef TN_GN_AHEAD_BYTES
#define TN_GN_AHEAD_BYTES (2 * 1024)
#endif
/* Rows kernel: long row sums are taken block by block of this many values (a multiple of 64),
 * the blocks' lane sums added into lane totals: a smaller rounding error than one running sum
 * per lane. Rows up to this long are one block. */
#define TN_GN_BLOCK 4096
/* Columns kernel: positions per chunk at most (16 lane arrays on the stack), and the bytes a
 * chunk of all the rows should not exceed (so its later passes read it from L2). */
#define TN_GN_CHUNK 256
#define TN_GN_CHUNK_BYTES (512 * 1024)

/* FP32 outputs at least this large, of rows at least TN_GN_STREAM_ROW bytes long, are
 * written with streaming stores by the rows kernel of the vector levels. */
#ifndef TN_GN_STREAM_BYTES
#define TN_GN_STREAM_BYTES (2 * 1024 * 1024)
#endif
#ifndef TN_GN_STREAM_ROW
#define TN_GN_STREAM_ROW (8 * 1024)
#endif

#define TN_GN_QNAN 0x7fc00000u

/* Polynomials: weighted least-squares fits (relative error, iterated towards minimax) made
 * with NumPy against float64 references; errors below are measured in fp32 with FMA Horner.
 * GELU: y * Phi(y), Phi(y) = (1 + erf(t)) / 2 with t = y / sqrt(2).
 * erf(t) = t P(t^2) for t^2 < 0.765625 (|t| < 0.875; 3 ulp);
 * erfc(|t|) = exp(-t^2) Q(1 / (1 + |t|)) above (3.6 ulp for Q), with t^2 = y * y / 2 taken
 * exactly (its rounding error fed back into the exponential), so Phi of a negative y keeps
 * its relative accuracy where 1 + erf(t) would cancel. */
#define TN_GN_RSQRT2 0.707106781f
#define TN_GN_GELU_SMALL 0.765625f
#define TN_GN_GELU_TINY 104.0f          /* t^2 at or above: exp(-t^2) is 0 */
#define TN_GN_ERF_P0 1.12837911f
#define TN_GN_ERF_P1 -0.376125515f
#define TN_GN_ERF_P2 0.112824567f
#define TN_GN_ERF_P3 -0.0267915092f
#define TN_GN_ERF_P4 0.00503224088f
#define TN_GN_ERF_P5 -0.000620353734f
#define TN_GN_ERFC_Q0 7.1262989e-06f
#define TN_GN_ERFC_Q1 0.563868344f
#define TN_GN_ERFC_Q2 0.57032913f
#define TN_GN_ERFC_Q3 0.216978878f
#define TN_GN_ERFC_Q4 0.137618259f
#define TN_GN_ERFC_Q5 -2.38163543f
#define TN_GN_ERFC_Q6 3.79692292f
#define TN_GN_ERFC_Q7 -2.59040642f
#define TN_GN_ERFC_Q8 0.68434757f

/* Other shared helpers of the activations:
 *   expm1(y): u = exp(y); (u - 1) * y / log(u), except y when u == 1, -1 when u - 1 == -1,
 *             +inf when u == +inf (Kahan's formula: a few ulp everywhere);
 *   log1p(u), 0 <= u <= 1: w = 1 + u; log(w) * (u / (w - 1)), or u when w == 1;
 *   softplus core sp(z) = max(0, z) + log1p(exp(-|z|)). */

/* An absent parameter reads as this one value for every element. */
static const float tn_gn_one = 1.0f;
static const float tn_gn_zero = 0.0f;

static inline TnNormalizationParam tn_gn_param(TnNormalizationParam p, const float * absent)
{
    if (p.data == NULL) {
        TnNormalizationParam q = {absent, 1, 0, 0, 0};
        return q;
    }
    if (p.period == 0)
        p.period = 1;
    return p;
}

/* The parameters of row (or outer item) o. */
static inline const float * tn_gn_row(const TnNormalizationParam * p, size_t o)
{
    return p->data + (o % p->period) * p->outerStride;
}

static inline size_t tn_gn_size(int type) { return type == TnTensorData32f ? 4 : 2; }

/* ---- Statistics of one row (or column position): the steps every level takes ------------ */

/* Below this variance, with eps below TN_GN_TINY_EPS, the squares may have underflowed: the
 * row is scaled up. Above TN_GN_TINY_EPS, eps hides any such variance (var < eps * 2^-24). */
#define TN_GN_TINY_VAR 0x1p-100f
#define TN_GN_TINY_EPS 0x1p-76f

/* What the caller does next: a pass summing y = x * p - c and y^2 (p only when scaled), a
 * pass taking max|x|, or nothing (mean, k and p are final). */
enum { TN_GN_SUMS, TN_GN_AMAX, TN_GN_DONE };

typedef struct {
    float x0;       /* the first value of the row */
    float c;        /* the shift of the next sums pass */
    float p;        /* the scale of x (1 unless scaled) */
    float eps;      /* eps * p^2 */
    float inv;      /* 1 / n */
    float mean, var, k;
    int nv;         /* normalize the variance */
    int scaled;
    int second;     /* the next sums pass is the second one, about the mean */
    int next;
} TnGnStats;

static inline void tn_gn_finish(TnGnStats * s)
{
    const float v = s->var + s->eps;
    s->k = !s->nv ? 1.0f / s->p : v == 0.0f ? 0.0f : 1.0f / sqrtf(v);
    s->next = TN_GN_DONE;
}

/* c0: the mean of the tn_lead_count(n) first values (summed with the 16-lane tree), x0: the
 * first value (the shift of a scaled row). */
static inline void tn_gn_begin(TnGnStats * s, float c0, float x0, size_t n, float eps, int nv)
{
    s->x0 = x0, s->c = c0, s->p = 1.0f, s->eps = eps, s->inv = 1.0f / (float)n;
    s->mean = 0.0f, s->var = 0.0f, s->k = 1.0f;
    s->nv = nv, s->scaled = 0, s->second = 0, s->next = TN_GN_SUMS;
}

/* The sums of the pass just made: s1 = sum(y), s2 = sum(y^2). */
static inline void tn_gn_sums(TnGnStats * s, float s1, float s2)
{
    const float m1 = s1 * s->inv, v = fmaf(-m1, m1, s2 * s->inv);
    if (!s->second) {
        if (!s->scaled && !(fabsf(s1) <= FLT_MAX && s2 <= FLT_MAX)) {
            s->next = TN_GN_AMAX;   /* overflow, or an infinity or NaN in the row */
            return;
        }
        s->mean = s->c + m1, s->var = v;
        if (!(m1 * m1 <= v)) {      /* c far from the mean: sum(y^2) / n - m1^2 cancels */
            s->c = s->mean, s->second = 1;
            return;
        }
    } else {
        s->mean += m1, s->var = v < 0.0f ? 0.0f : v, s->second = 0;
    }
    if (!s->scaled && s->nv && s->var < TN_GN_TINY_VAR && s->eps < TN_GN_TINY_EPS) {
        s->next = TN_GN_AMAX;
        return;
    }
    tn_gn_finish(s);
}

/* max|x| of the row (any value when the row holds a NaN, whose sums then stay NaN). */
static inline void tn_gn_amax(TnGnStats * s, float amax)
{
    int e;
    if (!(amax <= FLT_MAX)) {
        s->mean = s->var = NAN;
        tn_gn_finish(s);
        return;
    }
    frexpf(amax, &e);               /* amax in [2^(e-1), 2^e) */
    int sc = 1 - e;
    sc = sc < -126 ? -126 : sc > 127 ? 127 : sc;
    s->p = ldexpf(1.0f, sc);
    s->eps = (float)ldexp((double)s->eps, 2 * sc);   /* eps * p^2, rounded once */
    s->c = s->x0 * s->p, s->scaled = 1, s->second = 0, s->next = TN_GN_SUMS;
}

#endif
