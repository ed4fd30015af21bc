/*
 * What the normalize family's scalar reference and vector source share: the scratch of the
 * Simd signatures, and the rows the fast fp32 path cannot take (the float32 extremes).
 *
 * Every level computes a row's statistics in fp32 and then checks one number per row, the
 * value under the square root (t = variance + eps, or sum of squares + eps). When t is not
 * in [TN_NORM_TINY, FLT_MAX] (a sum or a square overflowed, squares underflowed, zero
 * variance with eps = 0, or the row holds inf / NaN), the row is redone by one of these
 * functions, in double (the squares of any floats, and their sums, are normal doubles).
 * They are compiled once, in normalize/scalar.c, and called by every level, so the slow
 * path gives the same bits everywhere (which the BF16 kernel promises).
 *
 * Rule: zero variance with eps = 0 gives a normalized value of 0 (y = shift, the limit
 * eps -> 0+); an all-zero L2 row with eps = 0 gives 0; channel norm with every n_c = 0 and
 * eps = 0 takes n_c / mean(n) as 0.
 */
#ifndef TN_NORMALIZE_H
#define TN_NORMALIZE_H

#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* The scratch of n floats a kernel's `buf` provides: buf itself, else a block of its own,
 * also stored in *own for the caller to free. NULL only when that allocation fails (the
 * kernels then fill dst with NaN). */
static inline float * tn_norm_scratch(float * buf, size_t n, float ** own)
{
    *own = buf ? NULL : (float *)malloc(n * sizeof(float));
    return buf ? buf : *own;
}

/* Below this, squares that underflowed (or a zero variance with eps = 0) may dominate t. */
#define TN_NORM_TINY 0x1p-100f

static inline int tn_norm_fast_ok(float t) { return t >= TN_NORM_TINY && t <= FLT_MAX; }

/* Layer norm of one row of n values, `stride` apart; scale[i * pstep], shift[i * pstep]. */
void tn_norm_slow_layer(const float * x, size_t n, size_t stride, const float * scale, const float * shift,
                        size_t pstep, float eps, float * y);
void tn_norm_slow_layer_bf16(const uint16_t * x, size_t n, size_t stride, const float * scale, const float * shift,
                             size_t pstep, float eps, uint16_t * y);
/* L2 normalization of one row (per position: across channels). */
void tn_norm_slow_l2(const float * x, size_t n, size_t stride, const float * scale, size_t pstep, float eps, float * y);
/* L2 normalization of one whole batch item (acrossSpatial). */
void tn_norm_slow_l2_item(const float * x, size_t channels, size_t spatial, int nhwc, const float * scale, float eps,
                          float * y);
/* Channel norm: buf[c] holds the fp32 sum of squares of channel c; replaces it with the
 * factor 1 + scale[c] * n_c / (mean(n) + eps), redoing in double the channels whose fp32
 * sum is out of range. Shared by every level. */
void tn_norm_v4_factors(const float * x, size_t channels, size_t spatial, int nhwc, const float * scale, float eps,
                        float * buf);

#endif
