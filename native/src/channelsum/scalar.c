/*
 * Per-channel sums of a BF16 tensor in fp32 (SynetChannelSum16b), scalar reference. The
 * summation order every level follows is in channelsum.h.
 */
#include "channelsum.h"

/* The fixed reduction tree of v_hsum. */
static float channel_nchw(const uint16_t * src, size_t n)
{
    float acc[64] = {0}, b[32], c[16];
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int l = 0; l < 64; ++l)
            acc[l] += tn_bf16_to_f32(src[i + l]);
    for (int l = 0; i + l < n; ++l)
        acc[l] += tn_bf16_to_f32(src[i + l]);
    for (int l = 0; l < 32; ++l)
        b[l] = acc[l] + acc[l + 32];
    for (int l = 0; l < 16; ++l)
        c[l] = b[l] + b[l + 16];
    return tn_sum16(c);
}

static void nhwc_seq(const uint16_t * src, size_t channels, size_t spatial, float * sum)
{
    for (size_t c = 0; c < channels; ++c)
        sum[c] = 0.0f;
    for (size_t s = 0; s < spatial; ++s)
        for (size_t c = 0; c < channels; ++c)
            sum[c] += tn_bf16_to_f32(src[s * channels + c]);
}

static void flat_acc(const uint16_t * src, size_t n, size_t p, float * acc)
{
    size_t i = 0;
    for (size_t l = 0; l < p; ++l)
        acc[l] = 0.0f;
    for (; i + p <= n; i += p)
        for (size_t l = 0; l < p; ++l)
            acc[l] += tn_bf16_to_f32(src[i + l]);
    for (size_t l = 0; i + l < n; ++l)
        acc[l] += tn_bf16_to_f32(src[i + l]);
}

void tn_scalar_SynetChannelSum16b(const uint16_t * src, size_t channels, size_t spatial, int format, float * sum)
{
    channelsum_forward(src, channels, spatial, format, sum);
}
