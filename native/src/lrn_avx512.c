/*
 * SynetLrnLayerCrossChannels, AVX-512. Same per-lane algorithm as lrn_scalar.c (see
 * there), on 16 lanes at a time, so the results are bit-identical to the scalar level.
 * - NCHW: lanes are spatial positions. The tensor is walked in chunks of spatial columns
 *   so the rows of one channel window stay in L1; narrow windows are summed directly
 *   (2*half+1 fma per vector), wide ones with block suffix/prefix sums.
 * - NHWC: lanes are channels of one pixel for narrow windows (the pixel is copied into a
 *   zero-padded row, so every window is 2*half+1 unaligned loads); for wide windows 16
 *   pixels are gathered into a channel-major tile and run through the NCHW block code.
 */
#include <stdlib.h>

#include "vmath_avx512.h"

#include "kernels.h"
#include "tensorops.h"

#define TN_INL static inline __attribute__((always_inline))
#define F TN_AVX512_F
#define LRN_CHUNK 512          /* spatial columns per NCHW chunk, direct path */
#define LRN_STACK_FLOATS 8192  /* 32 KB of stack scratch, malloc beyond */

typedef struct {
    __m512 k0, k1, k2v;
    float k2;
} LrnK;

TN_INL __mmask16 lane_mask(size_t left) { return left >= F ? (__mmask16)0xffff : tn_avx512_tail_mask(left); }

TN_INL __m512 lrn_value(__m512 x, __m512 s, const LrnK * k)
{
    return _mm512_mul_ps(x, tn_avx512_pow(_mm512_fmadd_ps(k->k1, s, k->k0), k->k2v, k->k2));
}

/* Sum of squares of rows d0 .. d0 + W - 1 (W a constant after inlining) at lane i. */
TN_INL __m512 window_sum(const float * src, size_t stride, ptrdiff_t d0, int W, size_t i, __mmask16 m)
{
    __m512 s = _mm512_setzero_ps();
    for (int w = 0; w < W; ++w) {
        __m512 a = _mm512_maskz_loadu_ps(m, src + (d0 + w) * stride + i);
        s = _mm512_fmadd_ps(a, a, s);
    }
    return s;
}

/* Channel c of a narrow window: n lanes, rows lo .. lo + W - 1 (W = hi - lo + 1; a
 * constant after inlining for the interior channels). */
TN_INL void lrn_channel(const float * src, size_t stride, ptrdiff_t c, ptrdiff_t lo, int W, size_t n,
                        const LrnK * k, float * dst)
{
    const float * xc = src + c * stride;
    float * yc = dst + c * stride;
    size_t i = 0;
    for (; i + 2 * F <= n; i += 2 * F) {
        __m512 s0 = window_sum(src, stride, lo, W, i, 0xffff);
        __m512 s1 = window_sum(src, stride, lo, W, i + F, 0xffff);
        _mm512_storeu_ps(yc + i, lrn_value(_mm512_loadu_ps(xc + i), s0, k));
        _mm512_storeu_ps(yc + i + F, lrn_value(_mm512_loadu_ps(xc + i + F), s1, k));
    }
    for (; i < n; i += F) {
        __mmask16 m = lane_mask(n - i);
        __m512 s0 = window_sum(src, stride, lo, W, i, m);
        _mm512_mask_storeu_ps(yc + i, m, lrn_value(_mm512_maskz_loadu_ps(m, xc + i), s0, k));
    }
}

/* Narrow windows: n lanes starting at src, channel rows `stride` floats apart; H = h is a
 * constant after inlining, so the interior channels run an unrolled window. */
TN_INL void lrn_direct_h(const float * src, size_t stride, ptrdiff_t C, ptrdiff_t H, size_t n, const LrnK * k,
                         float * dst)
{
    for (ptrdiff_t c = 0; c < C; ++c) {
        ptrdiff_t lo = c - H < 0 ? 0 : c - H, hi = c + H < C - 1 ? c + H : C - 1;
        if (hi - lo == 2 * H)
            lrn_channel(src, stride, c, lo, (int)(2 * H + 1), n, k, dst);
        else
            lrn_channel(src, stride, c, lo, (int)(hi - lo + 1), n, k, dst);
    }
}

static void lrn_direct(const float * src, size_t stride, ptrdiff_t C, ptrdiff_t h, size_t n, const LrnK * k,
                       float * dst)
{
    switch (h) {
    case 0: lrn_direct_h(src, stride, C, 0, n, k, dst); break;
    case 1: lrn_direct_h(src, stride, C, 1, n, k, dst); break;
    case 2: lrn_direct_h(src, stride, C, 2, n, k, dst); break;
    case 3: lrn_direct_h(src, stride, C, 3, n, k, dst); break;
    case 4: lrn_direct_h(src, stride, C, 4, n, k, dst); break;
    default: lrn_direct_h(src, stride, C, h, n, k, dst); break;
    }
}

/* Wide windows (h > TN_LRN_DIRECT_HALF): n <= W lanes; suf holds 2h rows of W floats,
 * pre one row; W is a multiple of 16. */
static void lrn_blocks(const float * src, size_t stride, ptrdiff_t C, ptrdiff_t h, size_t n, size_t W,
                       const LrnK * k, float * dst, float * suf, float * pre)
{
    ptrdiff_t B = 2 * h;
    for (ptrdiff_t kb = 0; kb < C; kb += B) {
        for (ptrdiff_t p = kb + B - 1; p >= kb; --p) {
            ptrdiff_t d = p - h;
            float * row = suf + (size_t)(p - kb) * W;
            int last = p == kb + B - 1, valid = d >= 0 && d < C;
            const float * xd = valid ? src + d * stride : src;
            for (size_t i = 0; i < n; i += F) {
                __m512 acc = last ? _mm512_setzero_ps() : _mm512_loadu_ps(row + W + i);
                if (valid) {
                    __m512 a = _mm512_maskz_loadu_ps(lane_mask(n - i), xd + i);
                    acc = _mm512_fmadd_ps(a, a, acc);
                }
                _mm512_storeu_ps(row + i, acc);
            }
        }
        for (ptrdiff_t p = kb + B; p < kb + 2 * B && p - B < C; ++p) {
            ptrdiff_t d = p - h, c = p - B;
            int first = p == kb + B, valid = d >= 0 && d < C;
            const float * xd = valid ? src + d * stride : src;
            const float * xc = src + c * stride;
            const float * sc = suf + (size_t)(c - kb) * W;
            float * yc = dst + c * stride;
            for (size_t i = 0; i < n; i += F) {
                __mmask16 m = lane_mask(n - i);
                __m512 acc = first ? _mm512_setzero_ps() : _mm512_loadu_ps(pre + i);
                if (valid) {
                    __m512 a = _mm512_maskz_loadu_ps(m, xd + i);
                    acc = _mm512_fmadd_ps(a, a, acc);
                }
                _mm512_storeu_ps(pre + i, acc);
                __m512 s = _mm512_add_ps(_mm512_loadu_ps(sc + i), acc);
                _mm512_mask_storeu_ps(yc + i, m, lrn_value(_mm512_maskz_loadu_ps(m, xc + i), s, k));
            }
        }
    }
}

static size_t block_width(ptrdiff_t h)
{
    size_t w = (size_t)(4096 / (2 * h)) / F * F;
    return w < F ? F : (w > LRN_CHUNK ? LRN_CHUNK : w);
}

void tn_avx512_SynetLrnLayerCrossChannels(const float * src, size_t half, size_t channels, size_t spatial,
                                          const float * k, float * dst, int format)
{
    if (channels == 0 || spatial == 0)
        return;
    if (half > channels - 1)
        half = channels - 1;
    ptrdiff_t C = (ptrdiff_t)channels, h = (ptrdiff_t)half;
    if (!(fabsf(k[2]) <= TN_POW_MAX_EXP)) { /* huge or non-finite exponent: powf throughout */
        tn_scalar_SynetLrnLayerCrossChannels(src, half, channels, spatial, k, dst, format);
        return;
    }
    LrnK kv = {_mm512_set1_ps(k[0]), _mm512_set1_ps(k[1]), _mm512_set1_ps(k[2]), k[2]};
    int nhwc = format == TnTensorFormatNhwc;
    int direct = h <= TN_LRN_DIRECT_HALF;

    size_t W = direct ? 0 : (nhwc ? F : block_width(h));
    size_t need;
    if (direct)
        need = nhwc ? channels + 2 * half + F : 0;
    else
        need = (size_t)(2 * h) * W + W + (nhwc ? 2 * channels * F : 0);
    float stack[LRN_STACK_FLOATS];
    float * work = stack;
    if (need > LRN_STACK_FLOATS) {
        work = (float *)malloc(need * sizeof(float));
        if (!work) {
            for (size_t i = 0; i < channels * spatial; ++i)
                dst[i] = NAN;
            return;
        }
    }

    if (!nhwc) {
        if (direct) {
            for (size_t s = 0; s < spatial; s += LRN_CHUNK)
                lrn_direct(src + s, spatial, C, h, spatial - s < LRN_CHUNK ? spatial - s : LRN_CHUNK, &kv, dst + s);
        } else {
            float * suf = work, * pre = work + (size_t)(2 * h) * W;
            for (size_t s = 0; s < spatial; s += W)
                lrn_blocks(src + s, spatial, C, h, spatial - s < W ? spatial - s : W, W, &kv, dst + s, suf, pre);
        }
    } else if (direct) {
        float * xp = work;
        memset(xp, 0, need * sizeof(float));
        for (size_t s = 0; s < spatial; ++s) {
            const float * x = src + s * channels;
            float * y = dst + s * channels;
            for (size_t c = 0; c < channels; c += F) {
                __mmask16 m = lane_mask(channels - c);
                _mm512_mask_storeu_ps(xp + half + c, m, _mm512_maskz_loadu_ps(m, x + c));
            }
            for (size_t c = 0; c < channels; c += F) {
                __mmask16 m = lane_mask(channels - c);
                __m512 acc = _mm512_setzero_ps();
                for (ptrdiff_t j = 0; j <= 2 * h; ++j) {
                    __m512 a = _mm512_loadu_ps(xp + c + j);
                    acc = _mm512_fmadd_ps(a, a, acc);
                }
                _mm512_mask_storeu_ps(y + c, m, lrn_value(_mm512_maskz_loadu_ps(m, x + c), acc, &kv));
            }
        }
    } else {
        float * suf = work, * pre = suf + (size_t)(2 * h) * F, * tin = pre + F, * tout = tin + channels * F;
        __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32((int32_t)channels));
        for (size_t s = 0; s < spatial; s += F) {
            size_t n = spatial - s < F ? spatial - s : F;
            __mmask16 m = lane_mask(n);
            const float * x = src + s * channels;
            float * y = dst + s * channels;
            for (size_t c = 0; c < channels; ++c)
                _mm512_storeu_ps(tin + c * F, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, x + c, 4));
            lrn_blocks(tin, F, C, h, n, F, &kv, tout, suf, pre);
            for (size_t c = 0; c < channels; ++c)
                _mm512_mask_i32scatter_ps(y + c, m, idx, _mm512_loadu_ps(tout + c * F), 4);
        }
    }
    if (work != stack)
        free(work);
}
