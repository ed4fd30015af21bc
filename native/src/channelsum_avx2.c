/*
 * Per-channel sums of a BF16 tensor in fp32 (SynetChannelSum16b), AVX2.
 * Same summation order as channelsum_scalar.c (see there): the sums agree bit for bit.
 */
#include "vmath_avx2.h"

#include <string.h>

#include "kernels.h"

#define CS_INLINE static inline __attribute__((always_inline))
#define CS_SEQ_CHANNELS 64
#define CS_MAX_PERIOD (16 * (CS_SEQ_CHANNELS - 1))
#define CS_ROWS 8 /* NHWC rows added to a channel vector per load/store of sum */

CS_INLINE void add64(__m256 * a, const uint16_t * p)
{
    for (int k = 0; k < 8; ++k)
        a[k] = _mm256_add_ps(a[k], tn_avx2_load_bf16(p + 8 * k));
}

/* NCHW: eight accumulators = the 64 lanes, folded l + l+32, l + l+16, l + l+8, then the
 * tree of tn_avx2_hsum. */
static float channel_nchw(const uint16_t * src, size_t n)
{
    __m256 a[8];
    for (int k = 0; k < 8; ++k)
        a[k] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        add64(a, src + i);
    if (i < n) {
        uint16_t t[64] = {0};
        memcpy(t, src + i, (n - i) * sizeof(uint16_t));
        add64(a, t);
    }
    __m256 b0 = _mm256_add_ps(a[0], a[4]), b1 = _mm256_add_ps(a[1], a[5]);
    __m256 b2 = _mm256_add_ps(a[2], a[6]), b3 = _mm256_add_ps(a[3], a[7]);
    __m256 c0 = _mm256_add_ps(b0, b2), c1 = _mm256_add_ps(b1, b3);
    return tn_avx2_hsum(_mm256_add_ps(c0, c1));
}

/* NHWC, channels >= CS_SEQ_CHANNELS: sequential over spatial, vectors along channels
 * (the last channels % 8 in scalar code, in the same order). */
static void nhwc_seq(const uint16_t * src, size_t channels, size_t spatial, float * sum)
{
    size_t cv = channels & ~(size_t)7;
    for (size_t c = 0; c < channels; ++c)
        sum[c] = 0.0f;
    for (size_t s = 0; s < spatial; s += CS_ROWS) {
        size_t rows = spatial - s < CS_ROWS ? spatial - s : CS_ROWS;
        const uint16_t * p = src + s * channels;
        for (size_t c = 0; c < cv; c += 8) {
            __m256 a = _mm256_loadu_ps(sum + c);
            if (rows == CS_ROWS) {
                for (size_t r = 0; r < CS_ROWS; ++r)
                    a = _mm256_add_ps(a, tn_avx2_load_bf16(p + r * channels + c));
            } else {
                for (size_t r = 0; r < rows; ++r)
                    a = _mm256_add_ps(a, tn_avx2_load_bf16(p + r * channels + c));
            }
            _mm256_storeu_ps(sum + c, a);
        }
        for (size_t c = cv; c < channels; ++c) {
            float a = sum[c];
            for (size_t r = 0; r < rows; ++r)
                a += tn_bf16_to_f32(p[r * channels + c]);
            sum[c] = a;
        }
    }
}

/* NHWC, few channels: lane q % p of the flat array (p = 8 * nv floats); with nv == 8 the
 * accumulators stay in registers, otherwise in acc. */
CS_INLINE void flat_acc(const uint16_t * src, size_t n, size_t nv, float * acc)
{
    const size_t p = 8 * nv;
    size_t i = 0;
    if (nv == 8) {
        __m256 a[8];
        for (int k = 0; k < 8; ++k)
            a[k] = _mm256_setzero_ps();
        for (; i + 64 <= n; i += 64)
            add64(a, src + i);
        for (int k = 0; k < 8; ++k)
            _mm256_storeu_ps(acc + 8 * k, a[k]);
    } else {
        for (size_t k = 0; k < nv; ++k)
            _mm256_storeu_ps(acc + 8 * k, _mm256_setzero_ps());
        for (; i + p <= n; i += p)
            for (size_t k = 0; k < nv; ++k)
                _mm256_storeu_ps(acc + 8 * k, _mm256_add_ps(_mm256_loadu_ps(acc + 8 * k), tn_avx2_load_bf16(src + i + 8 * k)));
    }
    for (size_t l = 0; i + l < n; ++l)
        acc[l] += tn_bf16_to_f32(src[i + l]);
}

static size_t flat_period(size_t channels)
{
    size_t low = channels & (~channels + 1);
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

void tn_avx2_SynetChannelSum16b(const uint16_t * src, size_t channels, size_t spatial, int format, float * sum)
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
    size_t p = flat_period(channels), n = channels * spatial;
    if (p == 64)
        flat_acc(src, n, 8, acc);
    else
        flat_acc(src, n, p / 8, acc);
    flat_reduce(acc, p, channels, sum);
}
