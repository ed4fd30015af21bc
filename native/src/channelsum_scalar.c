/*
 * Per-channel sums of a BF16 tensor in fp32 (SynetChannelSum16b), scalar reference.
 *
 * The summation order is fixed and shared by every ISA level, so the sums agree bit for
 * bit across levels:
 *  - NCHW: element s of a channel goes to lane s % 64 (64 running sums, in order); the
 *    lanes are folded l + l+32, then l + l+16, then reduced by the tree of tn_avx512_hsum.
 *  - NHWC with channels >= CS_SEQ_CHANNELS: sum[c] is accumulated sequentially over
 *    spatial, as the seed's loop does (vectors run along channels).
 *  - NHWC with fewer channels: the flat array is cut into periods of P elements (P a
 *    multiple of channels and of 16, at least 64); element q goes to lane q % P; then
 *    sum[c] = acc[c] + acc[c + channels] + ... in increasing lane order.
 */
#include "vmath_scalar.h"

#include "kernels.h"

#define CS_SEQ_CHANNELS 64
#define CS_MAX_PERIOD (16 * (CS_SEQ_CHANNELS - 1))

/* The fixed reduction tree of tn_avx512_hsum. */
static float sum16(const float * a)
{
    float s[8], q[4];
    for (int l = 0; l < 8; ++l)
        s[l] = a[l] + a[l + 8];
    for (int l = 0; l < 4; ++l)
        q[l] = s[l] + s[l + 4];
    return (q[0] + q[2]) + (q[1] + q[3]);
}

static float sum64(const float * a)
{
    float b[32], c[16];
    for (int l = 0; l < 32; ++l)
        b[l] = a[l] + a[l + 32];
    for (int l = 0; l < 16; ++l)
        c[l] = b[l] + b[l + 16];
    return sum16(c);
}

static float channel_nchw(const uint16_t * src, size_t n)
{
    float acc[64] = {0};
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int l = 0; l < 64; ++l)
            acc[l] += tn_bf16_to_f32(src[i + l]);
    for (int l = 0; i + l < n; ++l)
        acc[l] += tn_bf16_to_f32(src[i + l]);
    return sum64(acc);
}

/* Period of the flat NHWC order for channels < CS_SEQ_CHANNELS (at most CS_MAX_PERIOD). */
static size_t flat_period(size_t channels)
{
    size_t low = channels & (~channels + 1); /* largest power of two dividing channels */
    size_t p = 16 * channels / (low < 16 ? low : 16);
    while (p < 64)
        p *= 2;
    return p;
}

static void flat_reduce(const float * acc, size_t period, size_t channels, float * sum)
{
    for (size_t c = 0; c < channels; ++c) {
        float s = acc[c];
        for (size_t q = c + channels; q < period; q += channels)
            s += acc[q];
        sum[c] = s;
    }
}

void tn_scalar_SynetChannelSum16b(const uint16_t * src, size_t channels, size_t spatial, int format, float * sum)
{
    if (format != 1) {
        for (size_t c = 0; c < channels; ++c)
            sum[c] = channel_nchw(src + c * spatial, spatial);
        return;
    }
    if (channels >= CS_SEQ_CHANNELS) {
        for (size_t c = 0; c < channels; ++c)
            sum[c] = 0.0f;
        for (size_t s = 0; s < spatial; ++s)
            for (size_t c = 0; c < channels; ++c)
                sum[c] += tn_bf16_to_f32(src[s * channels + c]);
        return;
    }
    if (channels == 0)
        return;
    float acc[CS_MAX_PERIOD] = {0};
    size_t p = flat_period(channels), n = channels * spatial, i = 0;
    for (; i + p <= n; i += p)
        for (size_t l = 0; l < p; ++l)
            acc[l] += tn_bf16_to_f32(src[i + l]);
    for (size_t l = 0; i + l < n; ++l)
        acc[l] += tn_bf16_to_f32(src[i + l]);
    flat_reduce(acc, p, channels, sum);
}
