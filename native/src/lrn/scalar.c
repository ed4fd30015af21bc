/*
 * SynetLrnLayerCrossChannels, scalar reference: y = x * (k0 + k1 * S)^k2, S the sum of
 * squares over channels [c - half, c + half] clipped to the tensor.
 *
 * Every lane (a spatial position in NCHW, a pixel in NHWC) is one sequence of channels,
 * handled by lrn_lane. The vector levels (lrn_simd.h) run the same per-lane operation
 * sequence on 16 lanes at once, so all levels give bit-identical results:
 * - half <= TN_LRN_DIRECT_HALF: S = fma chain over the window in channel order;
 * - wider windows: van Herk / Gil-Werman block sums. In channel coordinates padded by
 *   half zeros on each side, blocks of B = 2*half channels; the window of channel c is
 *   [c, c + B] (padded), the suffix of one block plus the prefix of the next, each an fma
 *   chain. O(1) work per element and no subtraction: no cancellation, and an inf or NaN
 *   input only reaches the windows that contain it (a sliding add/subtract sum would turn
 *   inf - inf into NaN for every later channel).
 * base b = fma(k1, S, k0); pow: tn_pow_f32, i.e. 2^(k2 log2 b) from table-driven log2/exp2
 * for positive normal b, C's powf (C99 pow semantics, like numpy.power) for b = 0, b < 0,
 * denormal, inf, NaN: 0^(k2<0) = inf, (b<0)^(non-integer k2) = NaN, x^0 = 1, and so on.
 * Then y = x * pow (so x = 0 with an infinite pow gives NaN, as in the float64 reference).
 * S is a float sum: |x| above ~1.8e19 overflows x^2 to inf.
 */
#include <stdlib.h>

#include "vmath_scalar.h"

#include "kernels.h"
#include "tensorops.h"

static inline float lrn_value(float x, float s, const float * k)
{
    return x * tn_pow_f32(fmaf(k[1], s, k[0]), k[2]);
}

/* One lane: channel c at x[c * stride]; suf holds 2*half floats (wide windows only). */
static void lrn_lane(const float * x, size_t stride, size_t channels, size_t half, const float * k,
                     float * y, float * suf)
{
    ptrdiff_t C = (ptrdiff_t)channels, h = (ptrdiff_t)half;
    if (h <= TN_LRN_DIRECT_HALF) {
        for (ptrdiff_t c = 0; c < C; ++c) {
            ptrdiff_t lo = c - h < 0 ? 0 : c - h, hi = c + h < C - 1 ? c + h : C - 1;
            float s = 0.0f;
            for (ptrdiff_t d = lo; d <= hi; ++d)
                s = fmaf(x[d * stride], x[d * stride], s);
            y[c * stride] = lrn_value(x[c * stride], s, k);
        }
        return;
    }
    ptrdiff_t B = 2 * h;
    for (ptrdiff_t kb = 0; kb < C; kb += B) {
        float acc = 0.0f;
        for (ptrdiff_t p = kb + B - 1; p >= kb; --p) {
            ptrdiff_t d = p - h;
            if (d >= 0 && d < C)
                acc = fmaf(x[d * stride], x[d * stride], acc);
            suf[p - kb] = acc;
        }
        acc = 0.0f;
        for (ptrdiff_t p = kb + B; p < kb + 2 * B && p - B < C; ++p) {
            ptrdiff_t d = p - h, c = p - B;
            if (d >= 0 && d < C)
                acc = fmaf(x[d * stride], x[d * stride], acc);
            y[c * stride] = lrn_value(x[c * stride], suf[c - kb] + acc, k);
        }
    }
}

void tn_scalar_SynetLrnLayerCrossChannels(const float * src, size_t half, size_t channels, size_t spatial,
                                          const float * k, float * dst, int format)
{
    if (channels == 0 || spatial == 0)
        return;
    if (half > channels - 1)
        half = channels - 1; /* a wider window covers the same channels */
    float * suf = NULL;
    if (half > TN_LRN_DIRECT_HALF) {
        suf = (float *)malloc(2 * half * sizeof(float));
        if (!suf) {
            for (size_t i = 0; i < channels * spatial; ++i)
                dst[i] = NAN;
            return;
        }
    }
    if (format == TnTensorFormatNhwc) {
        for (size_t s = 0; s < spatial; ++s)
            lrn_lane(src + s * channels, 1, channels, half, k, dst + s * channels, suf);
    } else {
        for (size_t s = 0; s < spatial; ++s)
            lrn_lane(src + s, spatial, channels, half, k, dst + s, suf);
    }
    free(suf);
}
