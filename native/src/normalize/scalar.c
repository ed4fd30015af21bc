/*
 * Normalize layer family (seed 000), scalar level: L2 normalization (V1), layer norm across
 * channels (V2, and its BF16 twin 16bV2), layer norm across spatial positions (V3) and
 * channel norm (V4), NCHW and NHWC. The vector levels (normalize_simd.h) follow the same
 * layout. This file also holds the double-precision slow paths of every level
 * (normalize.h): rows whose fp32 statistics leave the normal range.
 *
 * Work layout:
 * - Statistics along a contiguous row (V2/L2 NHWC, V3 NCHW, V4 NCHW) are computed row by
 *   row while the row stays in L1 between its passes.
 * - Statistics across rows (V2/L2/16bV2 NCHW across channels, V3/V4 NHWC across spatial
 *   positions) stream whole rows into one accumulator per position, never gathering one
 *   value per row. The mean (or the L2 factor) per position is kept in buf; a second
 *   per-position array (the norm) is on the stack, so positions are taken in chunks of at
 *   most TN_NORM_CHUNK.
 * Scratch (buf): L2 NCHW without acrossSpatial and V2 NCHW use `spatial` floats, V3 NHWC and
 * V4 `channels` floats; the rest need none. A NULL buf is replaced by a malloc'ed one; if
 * that fails, dst is filled with NaN.
 *
 * Mean and variance are multiplied by 1/count. The FP32 layer norms take the mean of a row
 * as x0 + sum(x - x0) / count with x0 its first value (exact for a constant row, so centered
 * values are exactly 0) and the variance as the mean of the squared deviations from the
 * mean (two passes), never E[x^2] - E[x]^2; the BF16 layer norm (below) takes one pass. A
 * row whose t = variance + eps (or sum of squares + eps) is outside [TN_NORM_TINY, FLT_MAX]
 * is redone in double (normalize.h).
 *
 * 16bV2 (BF16) gives bit-identical results on every ISA level (and in both formats for the
 * same data: NCHW takes the channels at a fixed spatial position exactly as NHWC). Its
 * statistics are one pass over y = x - c, c the center (the mean of the first P values, P
 * the largest power of two <= min(channels, 16): exact for a constant row). The channels
 * go in pairs (2j, 2j + 1), a missing partner (odd channels) being y = +0.0f: pair j adds
 * to lane j % 16 as s += y_2j + y_2j+1 and q = fma(y_2j+1, y_2j+1, fma(y_2j, y_2j, q)),
 * each lane in increasing j from +0.0f, and the 16 lanes (and the P values of the center,
 * the other lanes +0.0f) are reduced as v_hsum does: lanes i + (i + 8), then i + (i + 4),
 * then (0 + 2) + (1 + 3). Lanes without any pair would only add +0.0f, which leaves every
 * such sum unchanged (a lane sum started at +0.0f and rounded to nearest is never -0.0f),
 * so code may skip those additions. The sequence, identical on every level:
 *     c    = sum(first P) * (1 / P);  s, q the pair sums about c
 *     ms   = s * (1 / channels);  var = q * (1 / channels) - ms * ms;  mean = c + ms
 *     if ms * ms > var (c more than one standard deviation from the mean: the variance
 *     cancelled): s, q again about mean, ms and var as above, mean = mean + ms
 *     t    = var + eps; outside [TN_NORM_TINY, FLT_MAX]: the row is tn_norm_slow_layer_bf16
 *            (double), on every level
 *     norm = 1 / sqrt(t);  d = x - mean
 *     y    = bf16(fma(d * norm, scale[c], shift[c]))
 */
#include "vmath_scalar.h"

#include <math.h>
#include <stdlib.h>

#include "kernels.h"
#include "normalize.h"
#include "tensorops.h"

#define TN_NORM_CHUNK 2048        /* positions per chunk at most (stack array) */
#define TN_NORM_SUM_BLOCK 4096    /* long sums add partial sums of this many values */

static void fill_nan(float * dst, size_t n)
{
    for (size_t i = 0; i < n; ++i)
        dst[i] = NAN;
}

/* Sums use 8 interleaved partial sums (like the vector levels' lanes), which is both faster
 * and more accurate than one running sum. */
static float sum_from(const float * x, size_t n, float x0)
{
    float a[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j)
            a[j] += x[i + j] - x0;
    for (; i < n; ++i)
        a[i % 8] += x[i] - x0;
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

static float block_sum_squares(const float * x, size_t n)
{
    float a[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j)
            a[j] += x[i + j] * x[i + j];
    for (; i < n; ++i)
        a[i % 8] += x[i] * x[i];
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

/* Long sums of squares add partial sums of TN_NORM_SUM_BLOCK values (smaller error). */
static float sum_squares_of(const float * x, size_t n)
{
    float total = 0.0f;
    for (size_t i = 0; i < n; i += TN_NORM_SUM_BLOCK)
        total += block_sum_squares(x + i, n - i < TN_NORM_SUM_BLOCK ? n - i : TN_NORM_SUM_BLOCK);
    return total;
}

static float sum_squared_deviations(const float * x, size_t n, float mean)
{
    float a[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) {
            float d = x[i + j] - mean;
            a[j] += d * d;
        }
    for (; i < n; ++i) {
        float d = x[i] - mean;
        a[i % 8] += d * d;
    }
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

/* ---- V1: L2 normalization ------------------------------------------------------------ */

/* NCHW, one batch item, across channels at each position: k[s] accumulates in buf. */
static void l2_nchw(const float * x, size_t C, size_t S, const float * scale, float eps, float * k, float * y)
{
    for (size_t s = 0; s < S; ++s)
        k[s] = 0.0f;
    for (size_t c = 0; c < C; ++c)
        for (size_t s = 0; s < S; ++s)
            k[s] += x[c * S + s] * x[c * S + s];
    int slow = 0;
    for (size_t s = 0; s < S; ++s) {
        float t = k[s] + eps;
        slow |= !tn_norm_fast_ok(t);
        k[s] = tn_norm_fast_ok(t) ? 1.0f / sqrtf(t) : -1.0f; /* -1: redone below */
    }
    for (size_t c = 0; c < C; ++c)
        for (size_t s = 0; s < S; ++s)
            y[c * S + s] = x[c * S + s] * (scale[c] * k[s]);
    for (size_t s = 0; slow && s < S; ++s)
        if (k[s] < 0.0f)
            tn_norm_slow_l2(x + s, C, S, scale, 1, eps, y + s);
}

void tn_scalar_SynetNormalizeLayerForward(const float * src, size_t batch, size_t channels, size_t spatial,
                                          const float * scale, const float * eps, int acrossSpatial, int format,
                                          float * buf, float * dst)
{
    const size_t size = channels * spatial;
    const float e = eps[0];
    const int nhwc = format == TnTensorFormatNhwc;
    float * own = NULL;
    if (size == 0)
        return;
    if (!acrossSpatial && !nhwc && (buf = tn_norm_scratch(buf, spatial, &own)) == NULL) {
        fill_nan(dst, batch * size);
        return;
    }
    for (size_t b = 0; b < batch; ++b) {
        const float * x = src + b * size;
        float * y = dst + b * size;
        if (acrossSpatial) {
            float t = sum_squares_of(x, size) + e, k = 1.0f / sqrtf(t);
            if (!tn_norm_fast_ok(t))
                tn_norm_slow_l2_item(x, channels, spatial, nhwc, scale, e, y);
            else if (nhwc)
                for (size_t s = 0; s < spatial; ++s)
                    for (size_t c = 0; c < channels; ++c)
                        y[s * channels + c] = x[s * channels + c] * (scale[c] * k);
            else
                for (size_t c = 0; c < channels; ++c)
                    for (size_t s = 0; s < spatial; ++s)
                        y[c * spatial + s] = x[c * spatial + s] * (scale[c] * k);
        } else if (nhwc) {
            for (size_t s = 0; s < spatial; ++s) {
                const float * xr = x + s * channels;
                float * yr = y + s * channels;
                float t = sum_squares_of(xr, channels) + e, k = 1.0f / sqrtf(t);
                if (!tn_norm_fast_ok(t)) {
                    tn_norm_slow_l2(xr, channels, 1, scale, 1, e, yr);
                    continue;
                }
                for (size_t c = 0; c < channels; ++c)
                    yr[c] = xr[c] * (scale[c] * k);
            }
        } else {
            l2_nchw(x, channels, spatial, scale, e, buf, y);
        }
    }
    free(own);
}

/* ---- V2 / V3: layer normalization ---------------------------------------------------- */

/* One contiguous row of n values; scale and shift advance with the row (step 1) or are one
 * value for the whole row (step 0). */
static void layer_norm_row(const float * x, size_t n, const float * scale, const float * shift, size_t step, float eps,
                           float * y)
{
    const float inv = 1.0f / (float)n;
    float mean = x[0] + sum_from(x, n, x[0]) * inv;
    float t = sum_squared_deviations(x, n, mean) * inv + eps, norm = 1.0f / sqrtf(t);
    if (!tn_norm_fast_ok(t)) {
        tn_norm_slow_layer(x, n, 1, scale, shift, step, eps, y);
        return;
    }
    for (size_t i = 0; i < n; ++i)
        y[i] = (x[i] - mean) * norm * scale[i * step] + shift[i * step];
}

/* Layer norm across `rows` rows of `count` positions (row stride `stride`): the statistics
 * of position p run over x[r * stride + p]. Used by V2 NCHW (rows = channels, positions =
 * spatial, scale/shift per row) and V3 NHWC (rows = spatial, positions = channels,
 * scale/shift per position). mean has `count` floats. */
static void layer_norm_across(const float * x, size_t rows, size_t count, size_t stride, const float * scale,
                              const float * shift, int perRow, float eps, float * mean, float * y)
{
    const float inv = 1.0f / (float)rows;
    const size_t W = TN_NORM_CHUNK;
    float norm[TN_NORM_CHUNK];
    for (size_t p0 = 0; p0 < count; p0 += W) {
        size_t w = count - p0 < W ? count - p0 : W;
        const float * xs = x + p0;
        float *ys = y + p0, *m = mean + p0;
        for (size_t p = 0; p < w; ++p)
            m[p] = 0.0f;
        /* Deviations from row 0, four rows at a time: shorter running sums, smaller error. */
        size_t r = 1;
        for (; r + 4 <= rows; r += 4) {
            const float * q = xs + r * stride;
            for (size_t p = 0; p < w; ++p)
                m[p] += ((q[p] - xs[p]) + (q[stride + p] - xs[p])) +
                        ((q[2 * stride + p] - xs[p]) + (q[3 * stride + p] - xs[p]));
        }
        for (; r < rows; ++r)
            for (size_t p = 0; p < w; ++p)
                m[p] += xs[r * stride + p] - xs[p];
        for (size_t p = 0; p < w; ++p) {
            m[p] = xs[p] + m[p] * inv;
            norm[p] = 0.0f;
        }
        for (r = 0; r + 4 <= rows; r += 4) {
            const float * q = xs + r * stride;
            for (size_t p = 0; p < w; ++p) {
                float d0 = q[p] - m[p], d1 = q[stride + p] - m[p];
                float d2 = q[2 * stride + p] - m[p], d3 = q[3 * stride + p] - m[p];
                norm[p] += (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3);
            }
        }
        for (; r < rows; ++r)
            for (size_t p = 0; p < w; ++p) {
                float d = xs[r * stride + p] - m[p];
                norm[p] += d * d;
            }
        int slow = 0;
        for (size_t p = 0; p < w; ++p) {
            float t = norm[p] * inv + eps;
            slow |= !tn_norm_fast_ok(t);
            norm[p] = tn_norm_fast_ok(t) ? 1.0f / sqrtf(t) : -1.0f; /* -1: redone below */
        }
        for (r = 0; r < rows; ++r) {
            const float * sc = perRow ? scale + r : scale + p0;
            const float * sh = perRow ? shift + r : shift + p0;
            size_t step = perRow ? 0 : 1;
            for (size_t p = 0; p < w; ++p)
                ys[r * stride + p] = (xs[r * stride + p] - m[p]) * norm[p] * sc[p * step] + sh[p * step];
        }
        for (size_t p = 0; slow && p < w; ++p)
            if (norm[p] < 0.0f)
                tn_norm_slow_layer(xs + p, rows, stride, perRow ? scale : scale + p0 + p,
                                   perRow ? shift : shift + p0 + p, perRow ? 1 : 0, eps, ys + p);
    }
}

void tn_scalar_SynetNormalizeLayerForwardV2(const float * src, size_t batch, size_t channels, size_t spatial,
                                            const float * scale, const float * shift, const float * eps, int format,
                                            float * buf, float * dst)
{
    const size_t size = channels * spatial;
    const float e = eps[0];
    const int nhwc = format == TnTensorFormatNhwc;
    float * own = NULL;
    if (size == 0)
        return;
    if (!nhwc && (buf = tn_norm_scratch(buf, spatial, &own)) == NULL) {
        fill_nan(dst, batch * size);
        return;
    }
    for (size_t b = 0; b < batch; ++b) {
        const float * x = src + b * size;
        float * y = dst + b * size;
        if (nhwc)
            for (size_t s = 0; s < spatial; ++s)
                layer_norm_row(x + s * channels, channels, scale, shift, 1, e, y + s * channels);
        else
            layer_norm_across(x, channels, spatial, spatial, scale, shift, 1, e, buf, y);
    }
    free(own);
}

void tn_scalar_SynetNormalizeLayerForwardV3(const float * src, size_t batch, size_t channels, size_t spatial,
                                            const float * scale, const float * shift, const float * eps, int format,
                                            float * buf, float * dst)
{
    const size_t size = channels * spatial;
    const float e = eps[0];
    const int nhwc = format == TnTensorFormatNhwc;
    float * own = NULL;
    if (size == 0)
        return;
    if (nhwc && (buf = tn_norm_scratch(buf, channels, &own)) == NULL) {
        fill_nan(dst, batch * size);
        return;
    }
    for (size_t b = 0; b < batch; ++b) {
        const float * x = src + b * size;
        float * y = dst + b * size;
        if (nhwc)
            layer_norm_across(x, spatial, channels, channels, scale, shift, 0, e, buf, y);
        else
            for (size_t c = 0; c < channels; ++c)
                layer_norm_row(x + c * spatial, spatial, scale + c, shift + c, 0, e, y + c * spatial);
    }
    free(own);
}

/* ---- V4: channel norm ----------------------------------------------------------------- */

void tn_scalar_SynetNormalizeLayerForwardV4(const float * src, size_t batch, size_t channels, size_t spatial,
                                            const float * scale, const float * shift, const float * eps, int format,
                                            float * buf, float * dst)
{
    const size_t size = channels * spatial;
    const float e = eps[0];
    const int nhwc = format == TnTensorFormatNhwc;
    float * own = NULL;
    if (size == 0)
        return;
    if ((buf = tn_norm_scratch(buf, channels, &own)) == NULL) {
        fill_nan(dst, batch * size);
        return;
    }
    for (size_t b = 0; b < batch; ++b) {
        const float * x = src + b * size;
        float * y = dst + b * size;
        if (nhwc) {
            for (size_t c = 0; c < channels; ++c)
                buf[c] = 0.0f;
            size_t s = 0;
            for (; s + 4 <= spatial; s += 4) {
                const float * q = x + s * channels;
                for (size_t c = 0; c < channels; ++c) {
                    float x0 = q[c], x1 = q[channels + c], x2 = q[2 * channels + c], x3 = q[3 * channels + c];
                    buf[c] += (x0 * x0 + x1 * x1) + (x2 * x2 + x3 * x3);
                }
            }
            for (; s < spatial; ++s)
                for (size_t c = 0; c < channels; ++c)
                    buf[c] += x[s * channels + c] * x[s * channels + c];
        } else {
            for (size_t c = 0; c < channels; ++c)
                buf[c] = sum_squares_of(x + c * spatial, spatial);
        }
        tn_norm_v4_factors(x, channels, spatial, nhwc, scale, e, buf);
        if (nhwc)
            for (size_t s = 0; s < spatial; ++s)
                for (size_t c = 0; c < channels; ++c)
                    y[s * channels + c] = x[s * channels + c] * buf[c] + shift[c];
        else
            for (size_t c = 0; c < channels; ++c)
                for (size_t s = 0; s < spatial; ++s)
                    y[c * spatial + s] = x[c * spatial + s] * buf[c] + shift[c];
    }
    free(own);
}

/* ---- 16bV2: BF16 layer norm across channels (canonical order, see the top) ----------- */

/* The sums of the pairs (2j, 2j + 1) of the n values x[i * stride] about c: pair j adds to
 * lane j % 16, a missing partner (odd n) being +0; the lanes reduce as v_hsum does. */
static void bf16_pair_sums(const uint16_t * x, size_t n, size_t stride, float c, float * s, float * q)
{
    float ls[16] = {0}, lq[16] = {0};
    for (size_t j = 0; 2 * j < n; ++j) {
        float e = tn_bf16_to_f32(x[2 * j * stride]) - c;
        float o = 2 * j + 1 < n ? tn_bf16_to_f32(x[(2 * j + 1) * stride]) - c : 0.0f;
        ls[j % 16] += e + o;
        lq[j % 16] = fmaf(o, o, fmaf(e, e, lq[j % 16]));
    }
    *s = tn_sum16(ls);
    *q = tn_sum16(lq);
}

/* One row of n channels, `stride` apart (1 in NHWC, spatial in NCHW: the same bits). */
static void layer_norm_bf16(const uint16_t * x, size_t n, size_t stride, const float * scale, const float * shift,
                            float eps, uint16_t * y)
{
    const size_t P = tn_lead_count(n);
    const float inv = 1.0f / (float)n;
    float first[16] = {0}, s, q;
    for (size_t i = 0; i < P; ++i)
        first[i] = tn_bf16_to_f32(x[i * stride]);
    float mean = tn_sum16(first) * (1.0f / (float)P);
    bf16_pair_sums(x, n, stride, mean, &s, &q);
    float ms = s * inv, var = q * inv - ms * ms;
    mean += ms;
    if (ms * ms > var) {
        bf16_pair_sums(x, n, stride, mean, &s, &q);
        ms = s * inv;
        var = q * inv - ms * ms;
        mean += ms;
    }
    const float t = var + eps, norm = 1.0f / sqrtf(t);
    if (!tn_norm_fast_ok(t)) {
        tn_norm_slow_layer_bf16(x, n, stride, scale, shift, 1, eps, y);
        return;
    }
    for (size_t c = 0; c < n; ++c) {
        float d = tn_bf16_to_f32(x[c * stride]) - mean;
        y[c * stride] = tn_f32_to_bf16(fmaf(d * norm, scale[c], shift[c]));
    }
}

void tn_scalar_SynetNormalizeLayerForward16bV2(const uint16_t * src, size_t batch, size_t channels, size_t spatial,
                                               const float * scale, const float * shift, const float * eps, int format,
                                               float * buf, uint16_t * dst)
{
    const size_t size = channels * spatial;
    const float e = eps[0];
    const int nhwc = format == TnTensorFormatNhwc;
    (void)buf; /* no scratch needed */
    if (size == 0)
        return;
    for (size_t b = 0; b < batch; ++b) {
        const uint16_t * x = src + b * size;
        uint16_t * y = dst + b * size;
        for (size_t s = 0; s < spatial; ++s)
            if (nhwc)
                layer_norm_bf16(x + s * channels, channels, 1, scale, shift, e, y + s * channels);
            else
                layer_norm_bf16(x + s, channels, spatial, scale, shift, e, y + s);
    }
}

/* ---- Slow paths of every level (normalize.h): double precision ------------------- */

/* Element i of a float or BF16 row. */
static double elem(const void * x, int bf16, size_t i)
{
    return bf16 ? (double)tn_bf16_to_f32(((const uint16_t *)x)[i]) : (double)((const float *)x)[i];
}

/* Mean (x0 + sum(x - x0) / n: exact for a constant row) and 1 / sqrt(variance + eps), 0 for
 * a zero variance with eps = 0 (y = shift). */
static void slow_stats(const void * x, int bf16, size_t n, size_t stride, float eps, double * mean, double * norm)
{
    const double x0 = elem(x, bf16, 0);
    double s = 0.0, q = 0.0;
    for (size_t i = 0; i < n; ++i)
        s += elem(x, bf16, i * stride) - x0;
    *mean = x0 + s / (double)n;
    for (size_t i = 0; i < n; ++i) {
        double d = elem(x, bf16, i * stride) - *mean;
        q += d * d;
    }
    double t = q / (double)n + (double)eps;
    *norm = t == 0.0 ? 0.0 : 1.0 / sqrt(t);
}

void tn_norm_slow_layer(const float * x, size_t n, size_t stride, const float * scale, const float * shift,
                        size_t pstep, float eps, float * y)
{
    double mean, norm;
    slow_stats(x, 0, n, stride, eps, &mean, &norm);
    for (size_t i = 0; i < n; ++i)
        y[i * stride] = (float)((x[i * stride] - mean) * norm * scale[i * pstep] + shift[i * pstep]);
}

void tn_norm_slow_layer_bf16(const uint16_t * x, size_t n, size_t stride, const float * scale, const float * shift,
                             size_t pstep, float eps, uint16_t * y)
{
    double mean, norm;
    slow_stats(x, 1, n, stride, eps, &mean, &norm);
    for (size_t i = 0; i < n; ++i)
        y[i * stride] =
            tn_f32_to_bf16((float)((elem(x, 1, i * stride) - mean) * norm * scale[i * pstep] + shift[i * pstep]));
}

static double slow_sum_squares(const float * x, size_t n, size_t stride)
{
    double q = 0.0;
    for (size_t i = 0; i < n; ++i)
        q += (double)x[i * stride] * x[i * stride];
    return q;
}

/* 1 / sqrt(q + eps); 0 for an all-zero row with eps = 0 (y = 0). */
static double slow_l2_factor(double q, float eps)
{
    double t = q + (double)eps;
    return t == 0.0 ? 0.0 : 1.0 / sqrt(t);
}

void tn_norm_slow_l2(const float * x, size_t n, size_t stride, const float * scale, size_t pstep, float eps, float * y)
{
    const double k = slow_l2_factor(slow_sum_squares(x, n, stride), eps);
    for (size_t i = 0; i < n; ++i)
        y[i * stride] = (float)(x[i * stride] * k * scale[i * pstep]);
}

void tn_norm_slow_l2_item(const float * x, size_t channels, size_t spatial, int nhwc, const float * scale, float eps,
                          float * y)
{
    const size_t size = channels * spatial;
    const double k = slow_l2_factor(slow_sum_squares(x, size, 1), eps);
    for (size_t i = 0; i < size; ++i)
        y[i] = (float)(x[i] * k * scale[nhwc ? i % channels : i / spatial]);
}

/* n_c in double: from the fp32 sum when it is in range, else summed again in double. */
static double v4_norm(const float * x, size_t c, size_t channels, size_t spatial, int nhwc, float sum)
{
    if (tn_norm_fast_ok(sum))
        return sqrt((double)sum);
    return sqrt(nhwc ? slow_sum_squares(x + c, spatial, channels) : slow_sum_squares(x + c * spatial, spatial, 1));
}

void tn_norm_v4_factors(const float * x, size_t channels, size_t spatial, int nhwc, const float * scale, float eps,
                        float * buf)
{
    double total = 0.0;
    for (size_t c = 0; c < channels; ++c)
        total += v4_norm(x, c, channels, spatial, nhwc, buf[c]);
    const double den = total / (double)channels + (double)eps;
    for (size_t c = 0; c < channels; ++c) {
        double n = v4_norm(x, c, channels, spatial, nhwc, buf[c]);
        buf[c] = den == 0.0 ? 1.0f : (float)(1.0 + scale[c] * n / den);
    }
}
