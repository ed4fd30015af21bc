/*
 * TiledScale2D, scalar reference: every element is multiplied by a per-(channel, column)
 * and a per-(channel, row) factor, in the order (x * ver) * hor on every ISA level.
 *   NCHW: y[c, h, w] = x[c, h, w] * ver[c * W + w] * hor[c * H + h]
 *   NHWC: y[h, w, c] = x[h, w, c] * ver[w * C + c] * hor[h * C + c]
 * src == dst (in place) is allowed: each element is read before it is written.
 */
#include "vmath_scalar.h"

#include "kernels.h"
#include "tensorops.h"

void tn_scalar_SynetTiledScale2D32f(const float * src, size_t channels, size_t height, size_t width, int format,
                                    const float * ver, const float * hor, float * dst)
{
    if (format == TnTensorFormatNhwc) {
        for (size_t h = 0; h < height; ++h) {
            const float * hr = hor + h * channels;
            for (size_t w = 0; w < width; ++w) {
                const float *x = src + (h * width + w) * channels, *v = ver + w * channels;
                float * y = dst + (h * width + w) * channels;
                for (size_t c = 0; c < channels; ++c)
                    y[c] = x[c] * v[c] * hr[c];
            }
        }
    } else {
        for (size_t c = 0; c < channels; ++c) {
            const float * v = ver + c * width;
            for (size_t h = 0; h < height; ++h) {
                const float * x = src + (c * height + h) * width;
                float * y = dst + (c * height + h) * width;
                float k = hor[c * height + h];
                for (size_t w = 0; w < width; ++w)
                    y[w] = x[w] * v[w] * k;
            }
        }
    }
}
