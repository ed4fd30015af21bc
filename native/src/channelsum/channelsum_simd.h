/*
 * Per-channel sums of a BF16 tensor in fp32 (SynetChannelSum16b) against the vector layer
 * (simd/README.md). The summation order is the one of channelsum.h, shared with scalar.c:
 * the sums agree bit for bit with it.
 */
#include "channelsum.h"

#define CS_INLINE static inline __attribute__((always_inline))
#define CS_ROWS 8 /* NHWC rows added to a channel vector per load/store of sum */

/* NCHW: four accumulators = the 64 lanes, folded (0+2) + (1+3), then the 16-lane tree. */
static float channel_nchw(const uint16_t * src, size_t n)
{
    vfloat a0 = v_zero(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = v_add(a0, v_load_bf16(src + i));
        a1 = v_add(a1, v_load_bf16(src + i + 16));
        a2 = v_add(a2, v_load_bf16(src + i + 32));
        a3 = v_add(a3, v_load_bf16(src + i + 48));
    }
    if (i < n) {
        size_t r = n - i;
        a0 = v_add(a0, v_load_bf16_n(src + i, r));
        if (r > 16)
            a1 = v_add(a1, v_load_bf16_n(src + i + 16, r - 16));
        if (r > 32)
            a2 = v_add(a2, v_load_bf16_n(src + i + 32, r - 32));
        if (r > 48)
            a3 = v_add(a3, v_load_bf16_n(src + i + 48, r - 48));
    }
    return v_hsum(v_add(v_add(a0, a2), v_add(a1, a3)));
}

static void nhwc_seq(const uint16_t * src, size_t channels, size_t spatial, float * sum)
{
    size_t c = 0, tail = channels % 16;
    for (; c + 16 <= channels; c += 16)
        v_store(sum + c, v_zero());
    if (tail)
        v_store_n(sum + c, v_zero(), tail);
    for (size_t s = 0; s < spatial; s += CS_ROWS) {
        size_t rows = spatial - s < CS_ROWS ? spatial - s : CS_ROWS;
        const uint16_t * p = src + s * channels;
        for (c = 0; c + 16 <= channels; c += 16) {
            vfloat a = v_load(sum + c);
            if (rows == CS_ROWS) {
                for (size_t r = 0; r < CS_ROWS; ++r)
                    a = v_add(a, v_load_bf16(p + r * channels + c));
            } else {
                for (size_t r = 0; r < rows; ++r)
                    a = v_add(a, v_load_bf16(p + r * channels + c));
            }
            v_store(sum + c, a);
        }
        if (tail) {
            vfloat a = v_load_n(sum + c, tail);
            for (size_t r = 0; r < rows; ++r)
                a = v_add(a, v_load_bf16_n(p + r * channels + c, tail));
            v_store_n(sum + c, a, tail);
        }
    }
}

/* Lane q % (16 * V) of the flat array; V accumulators in registers (V a constant after
 * inlining) or, for V == 0, in memory (pv vectors). */
CS_INLINE void flat_acc_v(const uint16_t * src, size_t n, int V, size_t pv, float * acc)
{
    const size_t p = 16 * (V ? (size_t)V : pv);
    size_t i = 0;
    if (V) {
        vfloat a[8];
        for (int k = 0; k < V; ++k)
            a[k] = v_zero();
        for (; i + p <= n; i += p)
            for (int k = 0; k < V; ++k)
                a[k] = v_add(a[k], v_load_bf16(src + i + 16 * k));
        for (int k = 0; k < V; ++k)
            v_store(acc + 16 * k, a[k]);
    } else {
        for (size_t k = 0; k < pv; ++k)
            v_store(acc + 16 * k, v_zero());
        for (; i + p <= n; i += p)
            for (size_t k = 0; k < pv; ++k)
                v_store(acc + 16 * k, v_add(v_load(acc + 16 * k), v_load_bf16(src + i + 16 * k)));
    }
    for (size_t k = 0; i + 16 * k < n; ++k)
        v_store(acc + 16 * k, v_add(v_load(acc + 16 * k), v_load_bf16_n(src + i + 16 * k, n - i - 16 * k)));
}

static void flat_acc(const uint16_t * src, size_t n, size_t p, float * acc)
{
    switch (p / 16) {
    case 4: flat_acc_v(src, n, 4, 4, acc); break;
    case 5: flat_acc_v(src, n, 5, 5, acc); break;
    case 6: flat_acc_v(src, n, 6, 6, acc); break;
    case 7: flat_acc_v(src, n, 7, 7, acc); break;
    default: flat_acc_v(src, n, 0, p / 16, acc); break;
    }
}

void TN_ISA(SynetChannelSum16b)(const uint16_t * src, size_t channels, size_t spatial, int format, float * sum)
{
    channelsum_forward(src, channels, spatial, format, sum);
}
