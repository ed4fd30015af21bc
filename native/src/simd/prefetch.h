/*
 * Software prefetch beyond single lines, written once against the vector layer (include
 * simd/avx512.h or simd/avx2.h first): for access patterns the hardware prefetchers do not
 * follow from DRAM (short strided segments, two-pass rows).
 */
#ifndef TN_SIMD_PREFETCH_H
#define TN_SIMD_PREFETCH_H

/* Prefetch into L2 the cache lines of [p, p + bytes), bytes > 0, all inside the tensor. */
V_INLINE void v_prefetch_l2_range(const void * p, size_t bytes)
{
    const char * c = (const char *)p;
    for (size_t i = 0; i < bytes; i += 64)
        v_prefetch_l2(c + i);
    v_prefetch_l2(c + bytes - 1);
}

/* A cursor for row kernels that read their input in two passes (statistics, then output):
 * while one stretch is written from the caches, the input further on is prefetched into L2,
 * so reading from DRAM overlaps with the work instead of stalling the next statistics pass.
 * Lines from p up to end (exclusive) are still to be prefetched; the kernel moves end
 * forward as it reads and calls v_cursor_step now and then (one line per call). */
typedef struct {
    const char * p;
    const char * end;
} v_cursor;

V_INLINE void v_cursor_step(v_cursor * c)
{
    if (c->p < c->end) {
        v_prefetch_l2(c->p);
        c->p += 64;
    }
}

#endif
