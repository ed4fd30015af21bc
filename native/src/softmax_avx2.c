/*
 * Softmax along the count axis (SynetSoftmax32f, SynetSoftmax16b), AVX2 + FMA.
 * Same operation sequence as softmax_scalar.c (see there): BF16 results are bit-identical.
 *
 * inner == 1: a row is contiguous; three passes over it while it sits in L1 (max; exp,
 *   stored, and summed in two accumulators holding the lanes 0-7 and 8-15 of the
 *   canonical 16-lane order; scale by 1 / sum). Rows of up to 32 stay in registers.
 * 1 < inner < SM_FLAT_INNER: the contiguous slab is walked in periods of lcm(inner, 16)
 *   elements with one accumulator per lane of the period.
 * inner >= SM_FLAT_INNER: vectors run along inner; a block of up to four vectors of columns
 *   is walked over count with stride inner, one sequential sum per column.
 */
#include "vmath_avx2.h"

#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define SM_INLINE static inline __attribute__((always_inline))
#define SM_STACK_FLOATS 4096 /* BF16 scratch up to this size lives on the stack */
#define SM_BF16_NAN 0x7fc0u
#define SM_FLAT_INNER 16
#define SM_FLAT_MAX 240 /* lcm(inner, 16) for inner < SM_FLAT_INNER */

/* Element access for fp32 (bf == 0) or BF16 (bf == 1) data; i counts elements. The "n"
 * forms touch only the first n (< 8) elements; the other lanes read as 0. */
SM_INLINE __m256 ld(const void * p, size_t i, int bf)
{
    return bf ? tn_avx2_load_bf16((const uint16_t *)p + i) : _mm256_loadu_ps((const float *)p + i);
}

SM_INLINE __m256 ldn(const void * p, size_t i, size_t n, int bf)
{
    if (bf) {
        uint16_t t[8] = {0};
        memcpy(t, (const uint16_t *)p + i, n * sizeof(uint16_t));
        return tn_avx2_load_bf16(t);
    }
    return _mm256_maskload_ps((const float *)p + i, tn_avx2_tail_mask(n));
}

SM_INLINE void st(void * p, size_t i, __m256 v, int bf)
{
    if (bf)
        tn_avx2_store_bf16((uint16_t *)p + i, v);
    else
        _mm256_storeu_ps((float *)p + i, v);
}

SM_INLINE void stn(void * p, size_t i, size_t n, __m256 v, int bf)
{
    if (bf) {
        uint16_t t[8];
        tn_avx2_store_bf16(t, v);
        memcpy((uint16_t *)p + i, t, n * sizeof(uint16_t));
    } else {
        _mm256_maskstore_ps((float *)p + i, tn_avx2_tail_mask(n), v);
    }
}

SM_INLINE void fill_nan(void * p, size_t n, int bf)
{
    for (size_t i = 0; i < n; ++i) {
        if (bf)
            ((uint16_t *)p)[i] = SM_BF16_NAN;
        else
            ((float *)p)[i] = NAN;
    }
}

/* exp(x) for x <= 0 or NaN (x - max over a row), bit for bit what tn_avx2_exp returns on
 * that domain, with fewer instructions and no slow microcode assists:
 *  - the clamp to TN_EXP_MAX is void there; vmaxps(c, x) returns x when x is NaN, so a NaN
 *    goes through and comes out NaN (its payload does not matter: such rows become the
 *    default NaN);
 *  - results below FLT_MIN (n <= -126) would make the scaling underflow, which costs a
 *    microcode assist of about a hundred cycles per instruction: the scaling runs with
 *    n clamped to -125, and those lanes take instead y * 2^(n + 149) (exact, at least 0.35)
 *    rounded to an integer, ties to even, which is the result in units of the smallest
 *    denormal, i.e. its bit pattern. */
SM_INLINE __m256 exp_nonpos(__m256 x)
{
    __m256 xs = _mm256_max_ps(_mm256_set1_ps(TN_EXP_MIN), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xs, _mm256_set1_ps(TN_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-TN_LN2_HI), xs);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-TN_LN2_LO), r);
    __m256 p = _mm256_set1_ps(TN_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TN_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TN_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TN_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TN_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(TN_EXP_P5));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i ni = _mm256_cvttps_epi32(_mm256_max_ps(n, _mm256_set1_ps(-125.0f)));
    __m256i j1 = _mm256_srai_epi32(ni, 1);
    __m256i j2 = _mm256_sub_epi32(ni, j1);
    __m256i bias = _mm256_set1_epi32(127);
    __m256 res = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(j1, bias), 23)));
    res = _mm256_mul_ps(res, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(j2, bias), 23)));
    __m256 tiny = _mm256_cmp_ps(n, _mm256_set1_ps(-126.0f), _CMP_LE_OQ);
    if (!_mm256_testz_ps(tiny, tiny)) {
        __m256i k = _mm256_cvttps_epi32(_mm256_min_ps(n, _mm256_set1_ps(-126.0f)));
        __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(149 + 127)), 23));
        __m256 t = _mm256_round_ps(_mm256_mul_ps(y, scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        res = _mm256_blendv_ps(res, _mm256_castsi256_ps(_mm256_cvtps_epi32(t)), tiny);
    }
    return res;
}

/* ---- inner == 1 ---- */

SM_INLINE float row_max(const void * src, size_t n, int bf)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm256_max_ps(m0, ld(src, i, bf));
        m1 = _mm256_max_ps(m1, ld(src, i + 8, bf));
        m2 = _mm256_max_ps(m2, ld(src, i + 16, bf));
        m3 = _mm256_max_ps(m3, ld(src, i + 24, bf));
    }
    for (; i + 8 <= n; i += 8)
        m0 = _mm256_max_ps(m0, ld(src, i, bf));
    if (i < n) {
        __m256 k = _mm256_castsi256_ps(tn_avx2_tail_mask(n - i));
        m1 = _mm256_max_ps(m1, _mm256_blendv_ps(ninf, ldn(src, i, n - i, bf), k));
    }
    return tn_avx2_hmax(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
}

/* e[i] = exp(x[i] - mx); returns their sum, element i in lane i % 16 (lo: lanes 0-7,
 * hi: lanes 8-15). */
SM_INLINE float row_exp(const void * src, size_t n, float mx, float * e, int bf)
{
    const __m256 m = _mm256_set1_ps(mx);
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 e0 = exp_nonpos(_mm256_sub_ps(ld(src, i, bf), m));
        __m256 e1 = exp_nonpos(_mm256_sub_ps(ld(src, i + 8, bf), m));
        __m256 e2 = exp_nonpos(_mm256_sub_ps(ld(src, i + 16, bf), m));
        __m256 e3 = exp_nonpos(_mm256_sub_ps(ld(src, i + 24, bf), m));
        _mm256_storeu_ps(e + i, e0);
        _mm256_storeu_ps(e + i + 8, e1);
        _mm256_storeu_ps(e + i + 16, e2);
        _mm256_storeu_ps(e + i + 24, e3);
        lo = _mm256_add_ps(lo, e0);
        hi = _mm256_add_ps(hi, e1);
        lo = _mm256_add_ps(lo, e2);
        hi = _mm256_add_ps(hi, e3);
    }
    if (i + 16 <= n) {
        __m256 e0 = exp_nonpos(_mm256_sub_ps(ld(src, i, bf), m));
        __m256 e1 = exp_nonpos(_mm256_sub_ps(ld(src, i + 8, bf), m));
        _mm256_storeu_ps(e + i, e0);
        _mm256_storeu_ps(e + i + 8, e1);
        lo = _mm256_add_ps(lo, e0);
        hi = _mm256_add_ps(hi, e1);
        i += 16;
    }
    if (i + 8 <= n) {
        __m256 e0 = exp_nonpos(_mm256_sub_ps(ld(src, i, bf), m));
        _mm256_storeu_ps(e + i, e0);
        lo = _mm256_add_ps(lo, e0);
        i += 8;
        if (i < n) { /* lanes 8.. of the last 16 */
            __m256i k = tn_avx2_tail_mask(n - i);
            __m256 e1 = exp_nonpos(_mm256_sub_ps(_mm256_blendv_ps(m, ldn(src, i, n - i, bf), _mm256_castsi256_ps(k)), m));
            _mm256_maskstore_ps(e + i, k, e1);
            hi = _mm256_add_ps(hi, _mm256_and_ps(e1, _mm256_castsi256_ps(k)));
        }
    } else if (i < n) {
        __m256i k = tn_avx2_tail_mask(n - i);
        __m256 e0 = exp_nonpos(_mm256_sub_ps(_mm256_blendv_ps(m, ldn(src, i, n - i, bf), _mm256_castsi256_ps(k)), m));
        _mm256_maskstore_ps(e + i, k, e0);
        lo = _mm256_add_ps(lo, _mm256_and_ps(e0, _mm256_castsi256_ps(k)));
    }
    return tn_avx2_hsum(_mm256_add_ps(lo, hi));
}

/* dst[i] = e[i] * (1 / sum); e may be dst itself (fp32). */
SM_INLINE void row_scale(const float * e, size_t n, float sum, void * dst, int bf)
{
    if (sum != sum) {
        fill_nan(dst, n, bf);
        return;
    }
    const __m256 r = _mm256_set1_ps(1.0f / sum);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 y0 = _mm256_mul_ps(_mm256_loadu_ps(e + i), r);
        __m256 y1 = _mm256_mul_ps(_mm256_loadu_ps(e + i + 8), r);
        __m256 y2 = _mm256_mul_ps(_mm256_loadu_ps(e + i + 16), r);
        __m256 y3 = _mm256_mul_ps(_mm256_loadu_ps(e + i + 24), r);
        st(dst, i, y0, bf);
        st(dst, i + 8, y1, bf);
        st(dst, i + 16, y2, bf);
        st(dst, i + 24, y3, bf);
    }
    for (; i + 8 <= n; i += 8)
        st(dst, i, _mm256_mul_ps(_mm256_loadu_ps(e + i), r), bf);
    if (i < n)
        stn(dst, i, n - i, _mm256_mul_ps(_mm256_maskload_ps(e + i, tn_avx2_tail_mask(n - i)), r), bf);
}

/* A short row (n <= 8 * V, V = 1..4 a constant after inlining) kept in registers: the
 * same operations as row_max / row_exp / row_scale without the loops and the stores and
 * reloads of the exps. The last vector holds ln (1..8) elements; its other lanes are zero
 * in the sum. Vectors 0, 2 hold lanes 0-7 of the 16-lane order, vectors 1, 3 lanes 8-15. */
SM_INLINE void row_short(const void * src, void * dst, int V, size_t ln, int bf)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const __m256 lk = _mm256_castsi256_ps(tn_avx2_tail_mask(ln & 7));
    __m256 x[4], e[4];
    for (int v = 0; v < V - 1; ++v)
        x[v] = ld(src, 8 * v, bf);
    if (ln == 8)
        x[V - 1] = ld(src, 8 * (V - 1), bf);
    else
        x[V - 1] = _mm256_blendv_ps(ninf, ldn(src, 8 * (V - 1), ln, bf), lk);
    __m256 m = x[0];
    for (int v = 1; v < V; ++v)
        m = _mm256_max_ps(m, x[v]);
    m = _mm256_set1_ps(tn_avx2_hmax(m));
    if (ln != 8) /* exp(0) past the row, kept out of the sum */
        x[V - 1] = _mm256_blendv_ps(m, x[V - 1], lk);
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int v = 0; v < V; ++v) {
        e[v] = exp_nonpos(_mm256_sub_ps(x[v], m));
        if (v == V - 1 && ln != 8)
            e[v] = _mm256_and_ps(e[v], lk);
        if (v & 1)
            hi = _mm256_add_ps(hi, e[v]);
        else
            lo = _mm256_add_ps(lo, e[v]);
    }
    float sum = tn_avx2_hsum(_mm256_add_ps(lo, hi));
    if (sum != sum) {
        fill_nan(dst, 8 * (V - 1) + ln, bf);
        return;
    }
    __m256 r = _mm256_set1_ps(1.0f / sum);
    for (int v = 0; v < V - 1; ++v)
        st(dst, 8 * v, _mm256_mul_ps(e[v], r), bf);
    if (ln == 8)
        st(dst, 8 * (V - 1), _mm256_mul_ps(e[V - 1], r), bf);
    else
        stn(dst, 8 * (V - 1), ln, _mm256_mul_ps(e[V - 1], r), bf);
}

/* Eight short rows (count <= SM_ROWS_MAX < 16) at once. The reductions run one row per
 * lane on gathered columns; the exps and the scaling run on the contiguous block, with the
 * row's max and 1 / sum brought to each element by a permutation (pidx[k] holds the row of
 * each lane of vector k). The sum follows the 16-lane order of a row: lane l holds element
 * l, absent lanes are zero, then the tree of tn_avx2_hsum / tn_avx512_hsum. BF16 rows are
 * widened to fp32 in buf first. */
#define SM_ROWS_MAX 15

SM_INLINE void rows8(const void * src, size_t count, void * dst, const __m256i * pidx, float * buf, int bf)
{
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)count));
    const float * x = (const float *)src;
    float * e = (float *)dst;
    if (bf) {
        for (size_t k = 0; k < count; ++k)
            _mm256_store_ps(buf + 8 * k, ld(src, 8 * k, 1));
        x = e = buf;
    }
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (size_t c = 0; c < count; ++c)
        mx = _mm256_max_ps(mx, _mm256_i32gather_ps(x + c, idx, 4));
    for (size_t k = 0; k < count; ++k) {
        __m256 v = _mm256_loadu_ps(x + 8 * k);
        _mm256_storeu_ps(e + 8 * k, exp_nonpos(_mm256_sub_ps(v, _mm256_permutevar8x32_ps(mx, pidx[k]))));
    }
    __m256 a[16];
    for (size_t l = 0; l < 16; ++l)
        a[l] = l < count ? _mm256_i32gather_ps(e + l, idx, 4) : _mm256_setzero_ps();
    for (int l = 0; l < 8; ++l)
        a[l] = _mm256_add_ps(a[l], a[l + 8]);
    for (int l = 0; l < 4; ++l)
        a[l] = _mm256_add_ps(a[l], a[l + 4]);
    __m256 sum = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
    __m256 r = _mm256_div_ps(_mm256_set1_ps(1.0f), sum); /* NaN for the NaN rows */
    __m256 nan = _mm256_cmp_ps(sum, sum, _CMP_UNORD_Q);
    if (!_mm256_testz_ps(nan, nan)) {
        const __m256 qnan = _mm256_set1_ps(NAN);
        for (size_t k = 0; k < count; ++k) {
            __m256 rk = _mm256_permutevar8x32_ps(r, pidx[k]);
            __m256 y = _mm256_mul_ps(_mm256_loadu_ps(e + 8 * k), rk);
            st(dst, 8 * k, _mm256_blendv_ps(y, qnan, _mm256_cmp_ps(rk, rk, _CMP_UNORD_Q)), bf);
        }
    } else {
        for (size_t k = 0; k < count; ++k)
            st(dst, 8 * k, _mm256_mul_ps(_mm256_loadu_ps(e + 8 * k), _mm256_permutevar8x32_ps(r, pidx[k])), bf);
    }
}

/* ---- 1 < inner < SM_FLAT_INNER ---- */

static size_t flat_period(size_t inner)
{
    size_t low = inner & (~inner + 1);
    return 16 * inner / (low < 16 ? low : 16);
}

static void flat_column_sums(const float * acc, size_t inner, size_t p, float * sum)
{
    for (size_t j = 0; j < inner; ++j) {
        float s = acc[j];
        for (size_t q = j + inner; q < p; q += inner)
            s += acc[q];
        sum[j] = s;
    }
}

/* The slab (count x inner, contiguous) in periods of p = 8 * NV elements; lane q of the
 * period accumulates elements i with i % p == q. NV is a constant after inlining for the
 * common NV == 2 (inner 2, 4, 8). e may be dst itself (fp32). */
SM_INLINE void flat(const void * src, size_t count, size_t inner, size_t NV, float * e, void * dst, int bf)
{
    const size_t n = count * inner, p = 8 * NV;
    float lane[SM_FLAT_MAX] __attribute__((aligned(32)));
    float pat[SM_FLAT_MAX] __attribute__((aligned(32)));
    float cs[SM_FLAT_INNER];
    __m256 a[SM_FLAT_MAX / 8];
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    size_t i, k;
    /* max of each column (order-free) */
    for (k = 0; k < NV; ++k)
        a[k] = ninf;
    for (i = 0; i + p <= n; i += p)
        for (k = 0; k < NV; ++k)
            a[k] = _mm256_max_ps(a[k], ld(src, i + 8 * k, bf));
    for (k = 0; i + 8 * k < n; ++k) {
        size_t r = n - i - 8 * k;
        if (r >= 8)
            a[k] = _mm256_max_ps(a[k], ld(src, i + 8 * k, bf));
        else
            a[k] = _mm256_max_ps(a[k], _mm256_blendv_ps(ninf, ldn(src, i + 8 * k, r, bf), _mm256_castsi256_ps(tn_avx2_tail_mask(r))));
    }
    for (k = 0; k < NV; ++k)
        _mm256_store_ps(lane + 8 * k, a[k]);
    for (size_t j = 0; j < inner; ++j) {
        float v = lane[j];
        for (size_t q = j + inner; q < p; q += inner)
            v = lane[q] > v ? lane[q] : v;
        cs[j] = v;
    }
    for (size_t q = 0; q < p; ++q)
        pat[q] = cs[q % inner];
    /* exps and their sums per lane */
    for (k = 0; k < NV; ++k)
        a[k] = _mm256_setzero_ps();
    for (i = 0; i + p <= n; i += p)
        for (k = 0; k < NV; ++k) {
            __m256 x = exp_nonpos(_mm256_sub_ps(ld(src, i + 8 * k, bf), _mm256_load_ps(pat + 8 * k)));
            _mm256_storeu_ps(e + i + 8 * k, x);
            a[k] = _mm256_add_ps(a[k], x);
        }
    for (k = 0; i + 8 * k < n; ++k) {
        size_t r = n - i - 8 * k;
        if (r >= 8) {
            __m256 x = exp_nonpos(_mm256_sub_ps(ld(src, i + 8 * k, bf), _mm256_load_ps(pat + 8 * k)));
            _mm256_storeu_ps(e + i + 8 * k, x);
            a[k] = _mm256_add_ps(a[k], x);
        } else {
            __m256i m = tn_avx2_tail_mask(r);
            __m256 x = exp_nonpos(_mm256_sub_ps(ldn(src, i + 8 * k, r, bf), _mm256_load_ps(pat + 8 * k)));
            _mm256_maskstore_ps(e + i + 8 * k, m, x);
            a[k] = _mm256_add_ps(a[k], _mm256_and_ps(x, _mm256_castsi256_ps(m)));
        }
    }
    for (k = 0; k < NV; ++k)
        _mm256_store_ps(lane + 8 * k, a[k]);
    flat_column_sums(lane, inner, p, cs);
    int any_nan = 0;
    for (size_t j = 0; j < inner; ++j) {
        any_nan |= cs[j] != cs[j];
        cs[j] = 1.0f / cs[j];
    }
    for (size_t q = 0; q < p; ++q)
        pat[q] = cs[q % inner];
    /* scale */
    for (i = 0; i + p <= n; i += p)
        for (k = 0; k < NV; ++k)
            st(dst, i + 8 * k, _mm256_mul_ps(_mm256_loadu_ps(e + i + 8 * k), _mm256_load_ps(pat + 8 * k)), bf);
    for (k = 0; i + 8 * k < n; ++k) {
        size_t r = n - i - 8 * k;
        if (r >= 8)
            st(dst, i + 8 * k, _mm256_mul_ps(_mm256_loadu_ps(e + i + 8 * k), _mm256_load_ps(pat + 8 * k)), bf);
        else
            stn(dst, i + 8 * k, r, _mm256_mul_ps(_mm256_maskload_ps(e + i + 8 * k, tn_avx2_tail_mask(r)), _mm256_load_ps(pat + 8 * k)), bf);
    }
    if (any_nan)
        for (size_t j = 0; j < inner; ++j)
            if (cs[j] != cs[j])
                for (size_t c = 0; c < count; ++c) {
                    if (bf)
                        ((uint16_t *)dst)[c * inner + j] = SM_BF16_NAN;
                    else
                        ((float *)dst)[c * inner + j] = NAN;
                }
}

/* ---- inner >= SM_FLAT_INNER ---- */

/* V (1..4, a constant after inlining) vectors of columns, the last one holding ln (1..8)
 * columns. src and dst point at the block's first column of row 0; e (row stride es) gets
 * the exps and may be dst itself (fp32). */
SM_INLINE void cols(const void * src, size_t count, size_t inner, int V, size_t ln, float * e, size_t es,
                    void * dst, int bf)
{
    __m256 mx[4], s[4], r[4], nan[4];
    const __m256i lk = tn_avx2_tail_mask(ln & 7);
#define SM_FULL(v) ((v) < V - 1 || ln == 8)
#define SM_LD(i, v) (SM_FULL(v) ? ld(src, (i) + 8 * (v), bf) : ldn(src, (i) + 8 * (v), ln, bf))
    for (int v = 0; v < V; ++v) {
        mx[v] = SM_LD(0, v);
        s[v] = _mm256_setzero_ps();
    }
    for (size_t c = 1; c < count; ++c)
        for (int v = 0; v < V; ++v)
            mx[v] = _mm256_max_ps(mx[v], SM_LD(c * inner, v));
    for (size_t c = 0; c < count; ++c)
        for (int v = 0; v < V; ++v) {
            __m256 x = exp_nonpos(_mm256_sub_ps(SM_LD(c * inner, v), mx[v]));
            if (SM_FULL(v))
                _mm256_storeu_ps(e + c * es + 8 * v, x);
            else
                _mm256_maskstore_ps(e + c * es + 8 * v, lk, x);
            s[v] = _mm256_add_ps(s[v], x);
        }
    for (int v = 0; v < V; ++v) {
        r[v] = _mm256_div_ps(_mm256_set1_ps(1.0f), s[v]);
        nan[v] = _mm256_cmp_ps(s[v], s[v], _CMP_UNORD_Q);
    }
    const __m256 qnan = _mm256_set1_ps(NAN);
    for (size_t c = 0; c < count; ++c)
        for (int v = 0; v < V; ++v) {
            const float * pe = e + c * es + 8 * v;
            size_t i = c * inner + 8 * v;
            if (SM_FULL(v)) {
                __m256 y = _mm256_mul_ps(_mm256_loadu_ps(pe), r[v]);
                st(dst, i, _mm256_blendv_ps(y, qnan, nan[v]), bf);
            } else {
                __m256 y = _mm256_mul_ps(_mm256_maskload_ps(pe, lk), r[v]);
                stn(dst, i, ln, _mm256_blendv_ps(y, qnan, nan[v]), bf);
            }
        }
#undef SM_LD
#undef SM_FULL
}

/* Vectors per column block: keep the block's rows (src, dst, exps) in L2. */
static size_t block_vectors(size_t count)
{
    return count <= 1024 ? 4 : count <= 2048 ? 2 : 1;
}

SM_INLINE void softmax(const void * src, size_t outer, size_t count, size_t inner, void * dst, float * scratch,
                       int bf)
{
    const size_t esz = bf ? 2 : 4, slab = count * inner;
    const size_t bv = block_vectors(count), bw = 8 * bv;
    if (inner == 1 && count <= 32) {
        size_t v = (count + 7) / 8, ln = count - 8 * (v - 1), o = 0;
        const char * s = (const char *)src;
        char * d = (char *)dst;
        if (count <= SM_ROWS_MAX && outer >= 8) {
            __m256i pidx[SM_ROWS_MAX];
            float buf[8 * SM_ROWS_MAX] __attribute__((aligned(32)));
            for (size_t k = 0; k < count; ++k)
                for (int l = 0; l < 8; ++l)
                    ((int32_t *)&pidx[k])[l] = (int32_t)((8 * k + (size_t)l) / count);
            for (; o + 8 <= outer; o += 8, s += 8 * count * esz, d += 8 * count * esz)
                rows8(s, count, d, pidx, buf, bf);
        }
        for (; o < outer; ++o, s += count * esz, d += count * esz) {
            if (v == 1)
                row_short(s, d, 1, ln, bf);
            else if (v == 2)
                row_short(s, d, 2, ln, bf);
            else if (v == 3)
                row_short(s, d, 3, ln, bf);
            else
                row_short(s, d, 4, ln, bf);
        }
        return;
    }
    for (size_t o = 0; o < outer; ++o) {
        const char * s = (const char *)src + o * slab * esz;
        char * d = (char *)dst + o * slab * esz;
        if (inner == 1) {
            float * e = bf ? scratch : (float *)d;
            row_scale(e, count, row_exp(s, count, row_max(s, count, bf), e, bf), d, bf);
            continue;
        }
        if (inner < SM_FLAT_INNER) {
            float * e = bf ? scratch : (float *)d;
            size_t nv = flat_period(inner) / 8;
            if (nv == 2)
                flat(s, count, inner, 2, e, d, bf);
            else
                flat(s, count, inner, nv, e, d, bf);
            continue;
        }
        size_t es = bf ? (inner < bw ? inner : bw) : inner;
        size_t j = 0;
        for (; j + bw <= inner; j += bw) {
            float * e = bf ? scratch : (float *)d + j;
            if (bv == 4)
                cols(s + j * esz, count, inner, 4, 8, e, es, d + j * esz, bf);
            else if (bv == 2)
                cols(s + j * esz, count, inner, 2, 8, e, es, d + j * esz, bf);
            else
                cols(s + j * esz, count, inner, 1, 8, e, es, d + j * esz, bf);
        }
        if (j < inner) {
            size_t rest = inner - j, v = (rest + 7) / 8, ln = rest - 8 * (v - 1);
            float * e = bf ? scratch : (float *)d + j;
            if (v == 4)
                cols(s + j * esz, count, inner, 4, ln, e, es, d + j * esz, bf);
            else if (v == 3)
                cols(s + j * esz, count, inner, 3, ln, e, es, d + j * esz, bf);
            else if (v == 2)
                cols(s + j * esz, count, inner, 2, ln, e, es, d + j * esz, bf);
            else
                cols(s + j * esz, count, inner, 1, ln, e, es, d + j * esz, bf);
        }
    }
}

void tn_avx2_SynetSoftmax32f(const float * src, size_t outer, size_t count, size_t inner, float * dst)
{
    if (count == 0 || inner == 0)
        return;
    softmax(src, outer, count, inner, dst, NULL, 0);
}

void tn_avx2_SynetSoftmax16b(const uint16_t * src, size_t outer, size_t count, size_t inner, uint16_t * dst)
{
    if (count == 0 || inner == 0)
        return;
    float stack[SM_STACK_FLOATS];
    size_t bw = 8 * block_vectors(count);
    size_t need = count * (inner < SM_FLAT_INNER ? inner : inner < bw ? inner : bw);
    float * e = need <= SM_STACK_FLOATS ? stack : (float *)malloc(need * sizeof(float));
    if (e == NULL) {
        fill_nan(dst, outer * count * inner, 1);
        return;
    }
    softmax(src, outer, count, inner, dst, e, 1);
    if (e != stack)
        free(e);
}
