/*
 * Per-channel sums of a BF16 tensor in fp32 (SynetChannelSum16b), AVX-512.
 * Same summation order as channelsum_scalar.c (see there): the sums agree bit for bit.
 */
#include "vmath_avx512.h"

#include "kernels.h"

#define CS_INLINE static inline __attribute__((always_inline))
#define CS_SEQ_CHANNELS 64
#define CS_MAX_PERIOD (16 * (CS_SEQ_CHANNELS - 1))
#define CS_ROWS 8 /* NHWC rows added to a channel vector per load/store of sum */

/* NCHW: four accumulators = the 64 lanes, folded (0+2) + (1+3), then the 16-lane tree. */
static float channel_nchw(const uint16_t * src, size_t n)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_add_ps(a0, tn_avx512_load_bf16(src + i));
        a1 = _mm512_add_ps(a1, tn_avx512_load_bf16(src + i + 16));
        a2 = _mm512_add_ps(a2, tn_avx512_load_bf16(src + i + 32));
        a3 = _mm512_add_ps(a3, tn_avx512_load_bf16(src + i + 48));
    }
    if (i < n) {
        size_t r = n - i;
        a0 = _mm512_add_ps(a0, tn_avx512_maskz_load_bf16(tn_avx512_tail_mask(r < 16 ? r : 16), src + i));
        if (r > 16)
            a1 = _mm512_add_ps(a1, tn_avx512_maskz_load_bf16(tn_avx512_tail_mask(r < 32 ? r - 16 : 16), src + i + 16));
        if (r > 32)
            a2 = _mm512_add_ps(a2, tn_avx512_maskz_load_bf16(tn_avx512_tail_mask(r < 48 ? r - 32 : 16), src + i + 32));
        if (r > 48)
            a3 = _mm512_add_ps(a3, tn_avx512_maskz_load_bf16(tn_avx512_tail_mask(r - 48), src + i + 48));
    }
    return tn_avx512_hsum(_mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3)));
}

/* NHWC, channels >= CS_SEQ_CHANNELS: sequential over spatial, vectors along channels. */
static void nhwc_seq(const uint16_t * src, size_t channels, size_t spatial, float * sum)
{
    size_t c = 0;
    for (; c + 16 <= channels; c += 16)
        _mm512_storeu_ps(sum + c, _mm512_setzero_ps());
    __mmask16 tk = tn_avx512_tail_mask(channels - c);
    if (tk)
        _mm512_mask_storeu_ps(sum + c, tk, _mm512_setzero_ps());
    for (size_t s = 0; s < spatial; s += CS_ROWS) {
        size_t rows = spatial - s < CS_ROWS ? spatial - s : CS_ROWS;
        const uint16_t * p = src + s * channels;
        for (c = 0; c + 16 <= channels; c += 16) {
            __m512 a = _mm512_loadu_ps(sum + c);
            if (rows == CS_ROWS) {
                for (size_t r = 0; r < CS_ROWS; ++r)
                    a = _mm512_add_ps(a, tn_avx512_load_bf16(p + r * channels + c));
            } else {
                for (size_t r = 0; r < rows; ++r)
                    a = _mm512_add_ps(a, tn_avx512_load_bf16(p + r * channels + c));
            }
            _mm512_storeu_ps(sum + c, a);
        }
        if (tk) {
            __m512 a = _mm512_maskz_loadu_ps(tk, sum + c);
            for (size_t r = 0; r < rows; ++r)
                a = _mm512_add_ps(a, tn_avx512_maskz_load_bf16(tk, p + r * channels + c));
            _mm512_mask_storeu_ps(sum + c, tk, a);
        }
    }
}

/* NHWC, few channels: lane q % (16 * V) of the flat array; V accumulators in registers
 * (V a constant after inlining) or, for V == 0, in memory (pv vectors). */
CS_INLINE void flat_acc(const uint16_t * src, size_t n, int V, size_t pv, float * acc)
{
    const size_t p = 16 * (V ? (size_t)V : pv);
    size_t i = 0;
    if (V) {
        __m512 a[8];
        for (int k = 0; k < V; ++k)
            a[k] = _mm512_setzero_ps();
        for (; i + p <= n; i += p)
            for (int k = 0; k < V; ++k)
                a[k] = _mm512_add_ps(a[k], tn_avx512_load_bf16(src + i + 16 * k));
        for (int k = 0; k < V; ++k)
            _mm512_storeu_ps(acc + 16 * k, a[k]);
    } else {
        for (size_t k = 0; k < pv; ++k)
            _mm512_storeu_ps(acc + 16 * k, _mm512_setzero_ps());
        for (; i + p <= n; i += p)
            for (size_t k = 0; k < pv; ++k)
                _mm512_storeu_ps(acc + 16 * k, _mm512_add_ps(_mm512_loadu_ps(acc + 16 * k), tn_avx512_load_bf16(src + i + 16 * k)));
    }
    for (size_t k = 0; i + 16 * k < n; ++k) {
        size_t r = n - i - 16 * k;
        __mmask16 m = tn_avx512_tail_mask(r < 16 ? r : 16);
        _mm512_storeu_ps(acc + 16 * k, _mm512_add_ps(_mm512_loadu_ps(acc + 16 * k), tn_avx512_maskz_load_bf16(m, src + i + 16 * k)));
    }
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

void tn_avx512_SynetChannelSum16b(const uint16_t * src, size_t channels, size_t spatial, int format, float * sum)
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
    switch (p / 16) {
    case 4: flat_acc(src, n, 4, 4, acc); break;
    case 5: flat_acc(src, n, 5, 5, acc); break;
    case 6: flat_acc(src, n, 6, 6, acc); break;
    case 7: flat_acc(src, n, 7, 7, acc); break;
    default: flat_acc(src, n, 0, p / 16, acc); break;
    }
    flat_reduce(acc, p, channels, sum);
}
