/*
 * Reductions across arrays, written once against the vector layer (include simd/avx512.h
 * or simd/avx2.h first).
 */
#ifndef TN_SIMD_REDUCE_H
#define TN_SIMD_REDUCE_H

/* tn_lanes_tree (vmath_scalar.h) with vectors: lane i (i < L <= 16) holds w partial sums at
 * lane + i * stride, 64-byte aligned with stride a multiple of 16; whole vectors are added,
 * so the arrays must have room up to w rounded up to 16. Same sums, same order. */
static void v_lanes_tree(float * lane, size_t stride, size_t L, size_t w)
{
    for (size_t h = 8, n = L; h >= 1; n = n < h ? n : h, h /= 2)
        for (size_t i = 0; i < h && i + h < n; ++i)
            for (size_t p = 0; p < w; p += TN_LANES)
                v_store_aligned(lane + i * stride + p, v_add(v_load_aligned(lane + i * stride + p),
                                                             v_load_aligned(lane + (i + h) * stride + p)));
}

#endif
