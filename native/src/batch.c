/*
 * Batched entry points (tensorops extension) for the Synet functions whose Simd signature
 * takes one batch item: one C call per request instead of one per item. Each item goes
 * through the public dispatched entry point, so a batch gives exactly the bits of per-item
 * calls at every ISA level; items are contiguous, one after the other.
 */
#include "tensorops.h"

void TnSynetChannelSum16bBatch(const uint16_t * src, size_t batch, size_t channels, size_t spatial, int format,
                               float * sum)
{
    size_t size = channels * spatial;
    for (size_t b = 0; b < batch; ++b)
        TnSynetChannelSum16b(src + b * size, channels, spatial, format, sum + b * channels);
}

void TnSynetLrnLayerCrossChannelsBatch(const float * src, size_t batch, size_t half, size_t channels, size_t spatial,
                                       const float * k, float * dst, int format)
{
    size_t size = channels * spatial;
    for (size_t b = 0; b < batch; ++b)
        TnSynetLrnLayerCrossChannels(src + b * size, half, channels, spatial, k, dst + b * size, format);
}

void TnSynetShuffleLayerForwardBatch(const float * src0, const float * src1, size_t batch, size_t channels0,
                                     size_t channels1, size_t spatial, float * dst0, float * dst1, int format, int type)
{
    if (type != 0 && type != 1)
        return;  /* like the per-item function: an unknown type writes nothing */
    /* channels0 and channels1 count the inputs of type 0 and the outputs of type 1; the
     * other side has (channels0 + channels1) / 2 channels in each tensor. */
    size_t half = (channels0 + channels1) / 2 * spatial, size0 = channels0 * spatial, size1 = channels1 * spatial;
    size_t src0Size = type == 0 ? size0 : half, src1Size = type == 0 ? size1 : half;
    size_t dst0Size = type == 0 ? half : size0, dst1Size = type == 0 ? half : size1;
    for (size_t b = 0; b < batch; ++b)
        TnSynetShuffleLayerForward(src0 + b * src0Size, src1 + b * src1Size, channels0, channels1, spatial,
                                   dst0 + b * dst0Size, dst1 + b * dst1Size, format, type);
}

void TnSynetTiledScale2D32fBatch(const float * src, size_t batch, size_t channels, size_t height, size_t width,
                                 int format, const float * ver, const float * hor, float * dst)
{
    size_t size = channels * height * width;
    for (size_t b = 0; b < batch; ++b)
        TnSynetTiledScale2D32f(src + b * size, channels, height, width, format, ver, hor, dst + b * size);
}
