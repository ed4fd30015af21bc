/*
 * Per-channel sums of a BF16 tensor in fp32 (SynetChannelSum16b): the part every level
 * shares. The includer defines the three loops declared below (its scalar or vector
 * version) and calls channelsum_forward.
 *
 * The summation order is fixed and shared by every level, so the sums agree bit for bit:
 *  - NCHW: element s of a channel goes to lane s % 64 (64 running sums, in order); the
 *    lanes are folded l + l+32, then l + l+16, then reduced by the tree of v_hsum.
 *  - NHWC with channels >= CS_SEQ_CHANNELS: sum[c] is accumulated sequentially over
 *    spatial (vectors run along channels).
 *  - NHWC with fewer channels: the flat array is cut into periods of P elements (P a
 *    multiple of channels and of 16, at least 64); element q goes to lane q % P; then
 *    sum[c] = acc[c] + acc[c + channels] + ... in increasing lane order.
 */
#include "vmath_scalar.h"

#include "kernels.h"

#define CS_SEQ_CHANNELS 64
#define CS_MAX_PERIOD (16 * (CS_SEQ_CHANNELS - 1))

/* The sum of one NCHW channel of n values. */
static float channel_nchw(const uint16_t * src, size_t n);
/* NHWC, channels >= CS_SEQ_CHANNELS. */
static void nhwc_seq(const uint16_t * src, size_t channels, size_t spatial, float * sum);
/* NHWC, fewer channels: acc[l] = the sum of the flat elements q < n with q % p == l. */
static void flat_acc(const uint16_t * src, size_t n, size_t p, float * acc);

/* Period of the flat NHWC order for channels < CS_SEQ_CHANNELS (at most CS_MAX_PERIOD). */
static size_t flat_period(size_t channels)
{
    size_t low = channels & (~channels + 1); /* largest power of two dividing channels */
    size_t p = 16 * channels / (low < 16 ? low : 16);
    while (p < 64)
        p *= 2;
    return p;
}

static void channelsum_forward(const uint16_t * src, size_t channels, size_t spatial, int format, float * sum)
{
    if (format != 1) {
        for (size_t c = 0; c < channels; ++c)
            sum[c] = channel_nchw(src + c * spatial, spatial);
        return;
    }
    if (channels >= CS_SEQ_CHANNELS) {
        nhwc_seq(src, channels, spatial, sum);
        return;
    }
    if (channels == 0)
        return;
    float acc[CS_MAX_PERIOD];
    size_t p = flat_period(channels);
    flat_acc(src, channels * spatial, p, acc);
    for (size_t c = 0; c < channels; ++c) {
        float s = acc[c];
        for (size_t q = c + channels; q < p; q += channels)
            s += acc[q];
        sum[c] = s;
    }
}
