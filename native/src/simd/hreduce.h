/*
 * The horizontal reductions and lane access, shared by both vector levels. Each layer
 * defines V_HALF8_(op256), its first step (lanes (i, i+8) of v into eight), and includes
 * this file after v_store; the rest of the tree is common: (i, i+4), then (0+2) + (1+3).
 * v_hmax / v_hmin take the same tree with x86 max / min (a NaN lane may or may not win:
 * callers that care test for NaN).
 */
#define V_HREDUCE_(op256, op128, op_ss) \
    __m256 s = V_HALF8_(op256); \
    __m128 q = op128(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)); \
    q = op128(q, _mm_movehl_ps(q, q)); \
    q = op_ss(q, _mm_movehdup_ps(q)); \
    return _mm_cvtss_f32(q)
V_INLINE float v_hsum(vfloat v) { V_HREDUCE_(_mm256_add_ps, _mm_add_ps, _mm_add_ss); }
V_INLINE float v_hmax(vfloat v) { V_HREDUCE_(_mm256_max_ps, _mm_max_ps, _mm_max_ss); }
V_INLINE float v_hmin(vfloat v) { V_HREDUCE_(_mm256_min_ps, _mm_min_ps, _mm_min_ss); }
#undef V_HREDUCE_
#undef V_HALF8_

/* Lane l. */
V_INLINE float v_lane(vfloat v, int l)
{
    float t[16];
    v_store(t, v);
    return t[l];
}
