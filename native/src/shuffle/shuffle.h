/*
 * Shuffle layer (ShuffleNet channel shuffle of two tensors): the part every level shares.
 * Pure copies.
 *
 * C' = (channels0 + channels1) / 2.
 * Type 0 (split): S = src0's channels then src1's; dst0 channel c = S[2c], dst1 channel
 *   c = S[2c + 1], c < C'.
 * Type 1 (interleave): src0 and src1 have C' channels each; D[2c] = src0[c],
 *   D[2c + 1] = src1[c]; dst0 = D's first channels0 channels, dst1 the next channels1.
 * NCHW copies whole spatial rows. NHWC works per pixel: with even channel counts a pair
 * (S[2c], S[2c + 1]) or (D[2c], D[2c + 1]) never straddles the two tensors, so each pixel
 * is two deinterleaves (type 0) or two interleaves (type 1). Odd channel counts (outside
 * the documented contract) take an element-by-element path that stays inside the tensors;
 * in type 1 with an odd channels0 + channels1 the last channel of dst1 has no source and is
 * left untouched. An unknown type writes nothing.
 *
 * The includer defines the two routines declared below (its scalar or vector version) and
 * calls shuffle_forward.
 */
#include "vmath_scalar.h"

#include "kernels.h"
#include "tensorops.h"

/* d[j] = s[j], j < n. */
static void copy_row(const float * s, float * d, size_t n);
/* NHWC with even channel counts: the deinterleaves (type 0) or interleaves (type 1). */
static void shuffle_nhwc(const float * src0, const float * src1, size_t channels0, size_t channels1, size_t spatial,
                         float * dst0, float * dst1, int type);

static void copy_rows_nchw(const float * src0, const float * src1, size_t channels0, size_t channels1, size_t spatial,
                           float * dst0, float * dst1, int type)
{
    size_t half = (channels0 + channels1) / 2;
    if (type == 0) {
        for (size_t j = 0; j < 2 * half; ++j) {
            const float * s = j < channels0 ? src0 + j * spatial : src1 + (j - channels0) * spatial;
            copy_row(s, (j & 1 ? dst1 : dst0) + (j / 2) * spatial, spatial);
        }
    } else {
        for (size_t j = 0; j < 2 * half && j < channels0 + channels1; ++j) {
            float * d = j < channels0 ? dst0 + j * spatial : dst1 + (j - channels0) * spatial;
            copy_row((j & 1 ? src1 : src0) + (j / 2) * spatial, d, spatial);
        }
    }
}

/* Element-by-element NHWC, valid for any channel counts. */
static void generic_nhwc(const float * src0, const float * src1, size_t channels0, size_t channels1, size_t spatial,
                         float * dst0, float * dst1, int type)
{
    size_t half = (channels0 + channels1) / 2;
    for (size_t p = 0; p < spatial; ++p) {
        if (type == 0) {
            const float *s0 = src0 + p * channels0, *s1 = src1 + p * channels1;
            for (size_t j = 0; j < 2 * half; ++j)
                (j & 1 ? dst1 : dst0)[p * half + j / 2] = j < channels0 ? s0[j] : s1[j - channels0];
        } else {
            const float *s0 = src0 + p * half, *s1 = src1 + p * half;
            for (size_t j = 0; j < 2 * half; ++j) {
                float v = (j & 1 ? s1 : s0)[j / 2];
                if (j < channels0)
                    dst0[p * channels0 + j] = v;
                else if (j - channels0 < channels1)
                    dst1[p * channels1 + j - channels0] = v;
            }
        }
    }
}

static void shuffle_forward(const float * src0, const float * src1, size_t channels0, size_t channels1, size_t spatial,
                            float * dst0, float * dst1, int format, int type)
{
    if (type != 0 && type != 1)
        return;
    if (format != TnTensorFormatNhwc)
        copy_rows_nchw(src0, src1, channels0, channels1, spatial, dst0, dst1, type);
    else if ((channels0 | channels1) & 1)
        generic_nhwc(src0, src1, channels0, channels1, spatial, dst0, dst1, type);
    else
        shuffle_nhwc(src0, src1, channels0, channels1, spatial, dst0, dst1, type);
}
