/*
 * A prefetch cursor for row kernels that read their input in two passes (statistics, then
 * output): while one stretch is written from the caches, the input further on is prefetched
 * into L2, so reading from DRAM overlaps with the work instead of stalling the next
 * statistics pass. Written once against the vector layer (include simd/avx512.h or
 * simd/avx2.h first).
 */
#ifndef TN_SIMD_PREFETCH_H
#define TN_SIMD_PREFETCH_H

/* Lines from p up to end (exclusive) are still to be prefetched; the kernel moves end
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
