/*
 * Shuffle layer against the vector layer (simd/README.md). Same copies as scalar.c (the
 * layout is in shuffle.h): NCHW copies spatial rows; NHWC deinterleaves or interleaves
 * each pixel's channels. Stores are line-aligned where possible (see gap).
 */
#include "shuffle.h"

#define F TN_LANES

/* Floats from p to the next 64-byte boundary. The routines below store whole vectors at
 * line-aligned addresses wherever they can: a store that splits a cache line costs about
 * twice as much, and NumPy arrays are only 16-byte aligned. */
static inline size_t gap(const float * p) { return ((0 - (uintptr_t)p) & 63) / sizeof(float); }

static void copy_row(const float * s, float * d, size_t n)
{
    size_t j = gap(d) < n ? gap(d) : n;
    if (j)
        v_store_n(d, v_load_n(s, j), j);
    for (; j + 4 * F <= n; j += 4 * F) {
        vfloat v0 = v_load(s + j + 0 * F), v1 = v_load(s + j + 1 * F);
        vfloat v2 = v_load(s + j + 2 * F), v3 = v_load(s + j + 3 * F);
        v_store(d + j + 0 * F, v0);
        v_store(d + j + 1 * F, v1);
        v_store(d + j + 2 * F, v2);
        v_store(d + j + 3 * F, v3);
    }
    for (; j + F <= n; j += F)
        v_store(d + j, v_load(s + j));
    if (j < n)
        v_store_n(d + j, v_load_n(s + j, n - j), n - j);
}

/* Lane l = s[2l + odd]; reads s[0..31]. */
static inline vfloat pick_load(const float * s, int odd) { return odd ? v_load_odd(s) : v_load_even(s); }

/* d[k] = s[2k + odd], k < r < F: the 2r floats go through a zeroed copy. */
static inline void pick_part(const float * s, size_t r, int odd, float * d)
{
    float t[2 * F];
    size_t n = 2 * r;
    v_store(t, v_load_n(s, n));
    v_store(t + F, n > F ? v_load_n(s + F, n - F) : v_zero());
    v_store_n(d, pick_load(t, odd), r);
}

/* d[k] = s[2k + odd], k < n. A row of at least F pairs starts and ends with a whole
 * (unaligned, overlapping) vector; the vectors between are stored aligned. */
static inline void pick(const float * s, size_t n, int odd, float * d)
{
    if (n < F) {
        pick_part(s, n, odd, d);
        return;
    }
    v_store(d, pick_load(s, odd));
    size_t k = gap(d) ? gap(d) : F;
    for (; k + F <= n; k += F)
        v_store(d + k, pick_load(s + 2 * k, odd));
    if (k < n)
        v_store(d + n - F, pick_load(s + 2 * (n - F), odd));
}

/* d[2k] = a[k], d[2k + 1] = b[k], k < r < F. */
static inline void zip_part(const float * a, const float * b, size_t r, float * d)
{
    size_t n = 2 * r;
    vfloat va = v_load_n(a, r), vb = v_load_n(b, r);
    v_store_n(d, v_zip_lo(va, vb), n);
    if (n > F)
        v_store_n(d + F, v_zip_hi(va, vb), n - F);
}

/* d[2k] = a[k], d[2k + 1] = b[k], k < n: a masked head up to d's first line boundary
 * (when d is 8-byte aligned, so the boundary falls on a pair), whole vectors, a masked
 * tail. (Unlike pick, this measured faster than overlapping whole vectors at the ends.) */
static inline void zip(const float * a, const float * b, size_t n, float * d)
{
    size_t g = gap(d), k = g & 1 ? 0 : g / 2 < n ? g / 2 : n; /* an odd gap cannot be aligned */
    if (k)
        zip_part(a, b, k, d);
    for (; k + F <= n; k += F) {
        vfloat va = v_load(a + k), vb = v_load(b + k);
        v_store(d + 2 * k, v_zip_lo(va, vb));
        v_store(d + 2 * k + F, v_zip_hi(va, vb));
    }
    if (k < n)
        zip_part(a + k, b + k, n - k, d + 2 * k);
}

static void shuffle_nhwc(const float * src0, const float * src1, size_t channels0, size_t channels1, size_t spatial,
                         float * dst0, float * dst1, int type)
{
    size_t half = (channels0 + channels1) / 2, h0 = channels0 / 2, h1 = channels1 / 2;
    /* Type 0: one pass over the pixels per input; type 1: one per output. Each pixel
     * writes one output row at a time: interleaving stores to two outputs measured
     * slower, while re-reading the input row from L1 is cheap. */
    if (type == 0) {
        for (size_t p = 0; p < spatial; ++p) {
            pick(src0 + p * channels0, h0, 0, dst0 + p * half);
            pick(src0 + p * channels0, h0, 1, dst1 + p * half);
        }
        for (size_t p = 0; p < spatial; ++p) {
            pick(src1 + p * channels1, h1, 0, dst0 + p * half + h0);
            pick(src1 + p * channels1, h1, 1, dst1 + p * half + h0);
        }
    } else {
        for (size_t p = 0; p < spatial; ++p)
            zip(src0 + p * half, src1 + p * half, h0, dst0 + p * channels0);
        for (size_t p = 0; p < spatial; ++p)
            zip(src0 + p * half + h0, src1 + p * half + h0, h1, dst1 + p * channels1);
    }
}

void TN_ISA(SynetShuffleLayerForward)(const float * src0, const float * src1, size_t channels0, size_t channels1,
                                      size_t spatial, float * dst0, float * dst1, int format, int type)
{
    shuffle_forward(src0, src1, channels0, channels1, spatial, dst0, dst1, format, type);
}
