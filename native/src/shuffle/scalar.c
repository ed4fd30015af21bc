/*
 * Shuffle layer (ShuffleNet channel shuffle of two tensors), scalar reference. The layout
 * and the paths every level shares are in shuffle.h.
 */
#include "shuffle.h"

static void copy_row(const float * s, float * d, size_t n) { memcpy(d, s, n * sizeof(float)); }

/* even[k] = s[2k], odd[k] = s[2k + 1], k < pairs. */
static inline void deinterleave(const float * s, size_t pairs, float * even, float * odd)
{
    for (size_t k = 0; k < pairs; ++k) {
        even[k] = s[2 * k];
        odd[k] = s[2 * k + 1];
    }
}

/* d[2k] = a[k], d[2k + 1] = b[k], k < pairs. */
static inline void interleave(const float * a, const float * b, size_t pairs, float * d)
{
    for (size_t k = 0; k < pairs; ++k) {
        d[2 * k] = a[k];
        d[2 * k + 1] = b[k];
    }
}

static void shuffle_nhwc(const float * src0, const float * src1, size_t channels0, size_t channels1, size_t spatial,
                         float * dst0, float * dst1, int type)
{
    size_t half = (channels0 + channels1) / 2, h0 = channels0 / 2, h1 = channels1 / 2;
    for (size_t p = 0; p < spatial; ++p) {
        if (type == 0) {
            float *d0 = dst0 + p * half, *d1 = dst1 + p * half;
            deinterleave(src0 + p * channels0, h0, d0, d1);
            deinterleave(src1 + p * channels1, h1, d0 + h0, d1 + h0);
        } else {
            const float *s0 = src0 + p * half, *s1 = src1 + p * half;
            interleave(s0, s1, h0, dst0 + p * channels0);
            interleave(s0 + h0, s1 + h0, h1, dst1 + p * channels1);
        }
    }
}

void tn_scalar_SynetShuffleLayerForward(const float * src0, const float * src1, size_t channels0, size_t channels1,
                                        size_t spatial, float * dst0, float * dst1, int format, int type)
{
    shuffle_forward(src0, src1, channels0, channels1, spatial, dst0, dst1, format, type);
}
