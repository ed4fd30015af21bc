/*
 * Softmax along the count axis (SynetSoftmax32f, SynetSoftmax16b), AVX-512.
 * Same operation sequence as softmax_scalar.c (see there): BF16 results are bit-identical.
 *
 * inner == 1: a row is contiguous; three passes over it while it sits in L1 (max; exp,
 *   stored, and summed in one 16-lane accumulator; scale by 1 / sum), masked tails. Rows
 *   of up to 64 stay in registers; rows shorter than 16 go 16 at a time, one per lane.
 * 1 < inner < SM_FLAT_INNER: the contiguous slab is walked in periods of lcm(inner, 16)
 *   elements with one accumulator per lane of the period.
 * inner >= SM_FLAT_INNER: vectors run along inner; a block of up to four vectors of columns
 *   is walked over count with stride inner, one sequential sum per column.
 */
#include "vmath_avx512.h"

#include <stdlib.h>

#include "kernels.h"

#define SM_INLINE static inline __attribute__((always_inline))
#define SM_STACK_FLOATS 4096 /* BF16 scratch up to this size lives on the stack */
#define SM_BF16_NAN 0x7fc0u
#define SM_FLAT_INNER 16
#define SM_FLAT_MAX 240 /* lcm(inner, 16) for inner < SM_FLAT_INNER */

/* Element access for fp32 (bf == 0) or BF16 (bf == 1) data; i counts elements. */
SM_INLINE __m512 ld(const void * p, size_t i, int bf)
{
    return bf ? tn_avx512_load_bf16((const uint16_t *)p + i) : _mm512_loadu_ps((const float *)p + i);
}

SM_INLINE __m512 ldm(const void * p, size_t i, __mmask16 m, int bf)
{
    return bf ? tn_avx512_maskz_load_bf16(m, (const uint16_t *)p + i) : _mm512_maskz_loadu_ps(m, (const float *)p + i);
}

SM_INLINE void st(void * p, size_t i, __m512 v, int bf)
{
    if (bf)
        tn_avx512_store_bf16((uint16_t *)p + i, v);
    else
        _mm512_storeu_ps((float *)p + i, v);
}

SM_INLINE void stm(void * p, size_t i, __mmask16 m, __m512 v, int bf)
{
    if (bf)
        tn_avx512_mask_store_bf16((uint16_t *)p + i, m, v);
    else
        _mm512_mask_storeu_ps((float *)p + i, m, v);
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

/* exp(x) for x <= 0 or NaN (x - max over a row), bit for bit what tn_avx512_exp returns on
 * that domain, with fewer instructions and no slow microcode assists:
 *  - the clamp to TN_EXP_MAX is void there; vmaxps(c, x) returns x when x is NaN, so a NaN
 *    goes through the polynomial and comes out NaN (its payload does not matter: such rows
 *    become the default NaN);
 *  - VSCALEFPS rounds y * 2^n once, as the two-step scaling of tn_avx512_exp does;
 *  - results below FLT_MIN (n <= -126) would make the scaling underflow, which costs a
 *    microcode assist of about a hundred cycles per instruction: those lanes take instead
 *    y * 2^(n + 149) (exact, at least 0.35) rounded to an integer, ties to even, which is
 *    the result in units of the smallest denormal, i.e. its bit pattern. */
SM_INLINE __m512 exp_nonpos(__m512 x)
{
    __m512 xs = _mm512_max_ps(_mm512_set1_ps(TN_EXP_MIN), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xs, _mm512_set1_ps(TN_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-TN_LN2_HI), xs);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-TN_LN2_LO), r);
    __m512 p = _mm512_set1_ps(TN_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TN_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TN_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TN_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TN_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(TN_EXP_P5));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512 res = _mm512_scalef_ps(y, _mm512_max_ps(n, _mm512_set1_ps(-125.0f)));
    __mmask16 tiny = _mm512_cmp_ps_mask(n, _mm512_set1_ps(-126.0f), _CMP_LE_OQ);
    if (tiny) {
        __m512 k = _mm512_add_ps(_mm512_min_ps(n, _mm512_set1_ps(-126.0f)), _mm512_set1_ps(149.0f));
        __m512i d = _mm512_cvt_roundps_epi32(_mm512_scalef_ps(y, k), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        res = _mm512_mask_mov_ps(res, tiny, _mm512_castsi512_ps(d));
    }
    return res;
}

/* ---- inner == 1 ---- */

SM_INLINE float row_max(const void * src, size_t n, int bf)
{
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        m0 = _mm512_max_ps(m0, ld(src, i, bf));
        m1 = _mm512_max_ps(m1, ld(src, i + 16, bf));
        m2 = _mm512_max_ps(m2, ld(src, i + 32, bf));
        m3 = _mm512_max_ps(m3, ld(src, i + 48, bf));
    }
    for (; i + 16 <= n; i += 16)
        m0 = _mm512_max_ps(m0, ld(src, i, bf));
    if (i < n) {
        __mmask16 m = tn_avx512_tail_mask(n - i);
        m1 = _mm512_mask_max_ps(m1, m, m1, ldm(src, i, m, bf));
    }
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
}

/* e[i] = exp(x[i] - mx); returns their sum, element i in lane i % 16. */
SM_INLINE float row_exp(const void * src, size_t n, float mx, float * e, int bf)
{
    __m512 m = _mm512_set1_ps(mx), acc = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512 e0 = exp_nonpos(_mm512_sub_ps(ld(src, i, bf), m));
        __m512 e1 = exp_nonpos(_mm512_sub_ps(ld(src, i + 16, bf), m));
        __m512 e2 = exp_nonpos(_mm512_sub_ps(ld(src, i + 32, bf), m));
        __m512 e3 = exp_nonpos(_mm512_sub_ps(ld(src, i + 48, bf), m));
        _mm512_storeu_ps(e + i, e0);
        _mm512_storeu_ps(e + i + 16, e1);
        _mm512_storeu_ps(e + i + 32, e2);
        _mm512_storeu_ps(e + i + 48, e3);
        acc = _mm512_add_ps(acc, e0);
        acc = _mm512_add_ps(acc, e1);
        acc = _mm512_add_ps(acc, e2);
        acc = _mm512_add_ps(acc, e3);
    }
    for (; i + 16 <= n; i += 16) {
        __m512 e0 = exp_nonpos(_mm512_sub_ps(ld(src, i, bf), m));
        _mm512_storeu_ps(e + i, e0);
        acc = _mm512_add_ps(acc, e0);
    }
    if (i < n) { /* the lanes past the row read as max: exp(0), kept out of the sum */
        __mmask16 k = tn_avx512_tail_mask(n - i);
        __m512 e0 = exp_nonpos(_mm512_sub_ps(_mm512_mask_blend_ps(k, m, ldm(src, i, k, bf)), m));
        _mm512_mask_storeu_ps(e + i, k, e0);
        acc = _mm512_mask_add_ps(acc, k, acc, e0);
    }
    return tn_avx512_hsum(acc);
}

/* dst[i] = e[i] * (1 / sum); e may be dst itself (fp32). */
SM_INLINE void row_scale(const float * e, size_t n, float sum, void * dst, int bf)
{
    if (sum != sum) {
        fill_nan(dst, n, bf);
        return;
    }
    __m512 r = _mm512_set1_ps(1.0f / sum);
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512 y0 = _mm512_mul_ps(_mm512_loadu_ps(e + i), r);
        __m512 y1 = _mm512_mul_ps(_mm512_loadu_ps(e + i + 16), r);
        __m512 y2 = _mm512_mul_ps(_mm512_loadu_ps(e + i + 32), r);
        __m512 y3 = _mm512_mul_ps(_mm512_loadu_ps(e + i + 48), r);
        st(dst, i, y0, bf);
        st(dst, i + 16, y1, bf);
        st(dst, i + 32, y2, bf);
        st(dst, i + 48, y3, bf);
    }
    for (; i + 16 <= n; i += 16)
        st(dst, i, _mm512_mul_ps(_mm512_loadu_ps(e + i), r), bf);
    if (i < n) {
        __mmask16 k = tn_avx512_tail_mask(n - i);
        stm(dst, i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, e + i), r), bf);
    }
}

/* A short row (n <= 16 * V, V = 1..SM_REG_V a constant after inlining) kept in
 * registers: one read and one write per element. The same operations as row_max /
 * row_exp / row_scale without the loops and the stores and reloads of the exps. The last
 * vector holds the remaining lanes (mask lm); its other lanes are zero in the sum, as in
 * the 16-lane order. No lane of a row whose sum is not NaN can be NaN, so the BF16 store
 * skips the NaN fixup of tn_avx512_f32_to_bf16 (same bits otherwise). */
#define SM_REG_V 16

SM_INLINE __m256i bf16_nonan(__m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

SM_INLINE void row_short(const void * src, void * dst, int V, __mmask16 lm, int bf)
{
    __m512 x[SM_REG_V];
    for (int v = 0; v < V - 1; ++v)
        x[v] = ld(src, 16 * v, bf);
    x[V - 1] = _mm512_mask_blend_ps(lm, _mm512_set1_ps(-INFINITY), ldm(src, 16 * (V - 1), lm, bf));
    __m512 m0 = x[0], m1 = V > 1 ? x[1] : x[0];
    for (int v = 2; v < V; v += 2) {
        m0 = _mm512_max_ps(m0, x[v]);
        if (v + 1 < V)
            m1 = _mm512_max_ps(m1, x[v + 1]);
    }
    __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(_mm512_max_ps(m0, m1)));
    x[V - 1] = _mm512_mask_blend_ps(lm, m, x[V - 1]); /* exp(0) past the row, kept out of the sum */
    __m512 acc = _mm512_setzero_ps();
    for (int v = 0; v < V; ++v) {
        x[v] = exp_nonpos(_mm512_sub_ps(x[v], m));
        if (v == V - 1)
            x[v] = _mm512_maskz_mov_ps(lm, x[v]);
        acc = _mm512_add_ps(acc, x[v]);
    }
    float sum = tn_avx512_hsum(acc);
    if (sum != sum) {
        fill_nan(dst, 16 * (size_t)(V - 1) + (size_t)__builtin_popcount(lm), bf);
        return;
    }
    __m512 r = _mm512_set1_ps(1.0f / sum);
    for (int v = 0; v < V - 1; ++v) {
        if (bf)
            _mm256_storeu_si256((__m256i *)((uint16_t *)dst + 16 * v), bf16_nonan(_mm512_mul_ps(x[v], r)));
        else
            _mm512_storeu_ps((float *)dst + 16 * v, _mm512_mul_ps(x[v], r));
    }
    if (bf)
        _mm256_mask_storeu_epi16((uint16_t *)dst + 16 * (V - 1), lm, bf16_nonan(_mm512_mul_ps(x[V - 1], r)));
    else
        _mm512_mask_storeu_ps((float *)dst + 16 * (V - 1), lm, _mm512_mul_ps(x[V - 1], r));
}

#define SM_ROW_CASE(V) \
    case V: \
        for (; o < outer; ++o, s += count * esz, d += count * esz) \
            row_short(s, d, V, lm, bf); \
        break;

/* Sixteen short rows (count <= SM_ROWS_MAX < 16) at once. The reductions run one row per
 * lane on gathered columns; the exps and the scaling run on the contiguous block, with the
 * row's max and 1 / sum brought to each element by a permutation (pidx[k] holds the row of
 * each lane of vector k). The sum follows the 16-lane order of a row: lane l holds element
 * l, absent lanes are zero, then the tree of tn_avx512_hsum. BF16 rows are widened to fp32
 * in buf first. */
#define SM_ROWS_MAX 15

SM_INLINE void rows16(const void * src, size_t count, void * dst, const __m512i * pidx, float * buf, int bf)
{
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)count));
    const float * x = (const float *)src;
    float * e = (float *)dst;
    if (bf) {
        for (size_t k = 0; k < count; ++k)
            _mm512_store_ps(buf + 16 * k, ld(src, 16 * k, 1));
        x = e = buf;
    }
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (size_t c = 0; c < count; ++c)
        mx = _mm512_max_ps(mx, _mm512_i32gather_ps(idx, x + c, 4));
    for (size_t k = 0; k < count; ++k) {
        __m512 v = _mm512_loadu_ps(x + 16 * k);
        _mm512_storeu_ps(e + 16 * k, exp_nonpos(_mm512_sub_ps(v, _mm512_permutexvar_ps(pidx[k], mx))));
    }
    __m512 a[16];
    for (size_t l = 0; l < 16; ++l)
        a[l] = l < count ? _mm512_i32gather_ps(idx, e + l, 4) : _mm512_setzero_ps();
    for (int l = 0; l < 8; ++l)
        a[l] = _mm512_add_ps(a[l], a[l + 8]);
    for (int l = 0; l < 4; ++l)
        a[l] = _mm512_add_ps(a[l], a[l + 4]);
    __m512 sum = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
    __m512 r = _mm512_div_ps(_mm512_set1_ps(1.0f), sum); /* NaN for the NaN rows */
    const __m512 qnan = _mm512_set1_ps(NAN);
    if (_mm512_cmp_ps_mask(sum, sum, _CMP_UNORD_Q)) {
        for (size_t k = 0; k < count; ++k) {
            __m512 rk = _mm512_permutexvar_ps(pidx[k], r);
            __m512 y = _mm512_mul_ps(_mm512_loadu_ps(e + 16 * k), rk);
            st(dst, 16 * k, _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(rk, rk, _CMP_UNORD_Q), qnan), bf);
        }
    } else {
        for (size_t k = 0; k < count; ++k)
            st(dst, 16 * k, _mm512_mul_ps(_mm512_loadu_ps(e + 16 * k), _mm512_permutexvar_ps(pidx[k], r)), bf);
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

/* The slab (count x inner, contiguous) in periods of p = 16 * PV elements; lane q of the
 * period accumulates elements i with i % p == q. PV is a constant after inlining for the
 * common PV == 1 (inner 2, 4, 8). e may be dst itself (fp32). */
SM_INLINE void flat(const void * src, size_t count, size_t inner, size_t PV, float * e, void * dst, int bf)
{
    const size_t n = count * inner, p = 16 * PV;
    float lane[SM_FLAT_MAX] __attribute__((aligned(64)));
    float pat[SM_FLAT_MAX] __attribute__((aligned(64)));
    float cs[SM_FLAT_INNER];
    __m512 a[SM_FLAT_MAX / 16];
    size_t i, k;
    /* max of each column (order-free) */
    for (k = 0; k < PV; ++k)
        a[k] = _mm512_set1_ps(-INFINITY);
    for (i = 0; i + p <= n; i += p)
        for (k = 0; k < PV; ++k)
            a[k] = _mm512_max_ps(a[k], ld(src, i + 16 * k, bf));
    for (k = 0; i + 16 * k < n; ++k) {
        size_t r = n - i - 16 * k;
        __mmask16 m = tn_avx512_tail_mask(r < 16 ? r : 16);
        a[k] = _mm512_mask_max_ps(a[k], m, a[k], ldm(src, i + 16 * k, m, bf));
    }
    for (k = 0; k < PV; ++k)
        _mm512_store_ps(lane + 16 * k, a[k]);
    for (size_t j = 0; j < inner; ++j) {
        float v = lane[j];
        for (size_t q = j + inner; q < p; q += inner)
            v = lane[q] > v ? lane[q] : v;
        cs[j] = v;
    }
    for (size_t q = 0; q < p; ++q)
        pat[q] = cs[q % inner];
    /* exps and their sums per lane */
    for (k = 0; k < PV; ++k)
        a[k] = _mm512_setzero_ps();
    for (i = 0; i + p <= n; i += p)
        for (k = 0; k < PV; ++k) {
            __m512 x = exp_nonpos(_mm512_sub_ps(ld(src, i + 16 * k, bf), _mm512_load_ps(pat + 16 * k)));
            _mm512_storeu_ps(e + i + 16 * k, x);
            a[k] = _mm512_add_ps(a[k], x);
        }
    for (k = 0; i + 16 * k < n; ++k) {
        size_t r = n - i - 16 * k;
        __mmask16 m = tn_avx512_tail_mask(r < 16 ? r : 16);
        __m512 x = exp_nonpos(_mm512_sub_ps(ldm(src, i + 16 * k, m, bf), _mm512_load_ps(pat + 16 * k)));
        _mm512_mask_storeu_ps(e + i + 16 * k, m, x);
        a[k] = _mm512_mask_add_ps(a[k], m, a[k], x);
    }
    for (k = 0; k < PV; ++k)
        _mm512_store_ps(lane + 16 * k, a[k]);
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
        for (k = 0; k < PV; ++k)
            st(dst, i + 16 * k, _mm512_mul_ps(_mm512_loadu_ps(e + i + 16 * k), _mm512_load_ps(pat + 16 * k)), bf);
    for (k = 0; i + 16 * k < n; ++k) {
        size_t r = n - i - 16 * k;
        __mmask16 m = tn_avx512_tail_mask(r < 16 ? r : 16);
        stm(dst, i + 16 * k, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, e + i + 16 * k), _mm512_load_ps(pat + 16 * k)), bf);
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

/* V (1..4, a constant after inlining) vectors of columns, the last one masked by lm.
 * src and dst point at the block's first column of row 0; e (row stride es) gets the exps
 * and may be dst itself (fp32). */
SM_INLINE void cols(const void * src, size_t count, size_t inner, int V, __mmask16 lm, float * e, size_t es,
                    void * dst, int bf)
{
    __m512 mx[4], s[4], r[4];
    __mmask16 k[4], nan[4];
    for (int v = 0; v < V; ++v) {
        k[v] = v == V - 1 ? lm : (__mmask16)0xffff;
        mx[v] = ldm(src, 16 * v, k[v], bf);
        s[v] = _mm512_setzero_ps();
    }
    for (size_t c = 1; c < count; ++c)
        for (int v = 0; v < V; ++v)
            mx[v] = _mm512_max_ps(mx[v], ldm(src, c * inner + 16 * v, k[v], bf));
    for (size_t c = 0; c < count; ++c)
        for (int v = 0; v < V; ++v) {
            __m512 x = exp_nonpos(_mm512_sub_ps(ldm(src, c * inner + 16 * v, k[v], bf), mx[v]));
            _mm512_mask_storeu_ps(e + c * es + 16 * v, k[v], x);
            s[v] = _mm512_add_ps(s[v], x);
        }
    for (int v = 0; v < V; ++v) {
        r[v] = _mm512_div_ps(_mm512_set1_ps(1.0f), s[v]);
        nan[v] = _mm512_cmp_ps_mask(s[v], s[v], _CMP_UNORD_Q);
    }
    const __m512 qnan = _mm512_set1_ps(NAN);
    for (size_t c = 0; c < count; ++c)
        for (int v = 0; v < V; ++v) {
            __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(k[v], e + c * es + 16 * v), r[v]);
            stm(dst, c * inner + 16 * v, k[v], _mm512_mask_mov_ps(y, nan[v], qnan), bf);
        }
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
    const size_t bv = block_vectors(count), bw = 16 * bv;
    if (inner == 1 && count <= 16 * SM_REG_V) {
        size_t v = (count + 15) / 16, o = 0;
        __mmask16 lm = tn_avx512_tail_mask(count - 16 * (v - 1));
        const char * s = (const char *)src;
        char * d = (char *)dst;
        if (count <= SM_ROWS_MAX && outer >= 16) {
            __m512i pidx[SM_ROWS_MAX];
            float buf[16 * SM_ROWS_MAX] __attribute__((aligned(64)));
            for (size_t k = 0; k < count; ++k) {
                __m512i q = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32((int)(16 * k)));
                pidx[k] = _mm512_cvttps_epi32(_mm512_div_round_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps((float)count),
                                                                  _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC));
            }
            for (; o + 16 <= outer; o += 16, s += 16 * count * esz, d += 16 * count * esz)
                rows16(s, count, d, pidx, buf, bf);
        }
        switch (v) {
        SM_ROW_CASE(1) SM_ROW_CASE(2) SM_ROW_CASE(3) SM_ROW_CASE(4)
        SM_ROW_CASE(5) SM_ROW_CASE(6) SM_ROW_CASE(7) SM_ROW_CASE(8)
        SM_ROW_CASE(9) SM_ROW_CASE(10) SM_ROW_CASE(11) SM_ROW_CASE(12)
        SM_ROW_CASE(13) SM_ROW_CASE(14) SM_ROW_CASE(15) default: SM_ROW_CASE(16)
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
            size_t pv = flat_period(inner) / 16;
            if (pv == 1)
                flat(s, count, inner, 1, e, d, bf);
            else
                flat(s, count, inner, pv, e, d, bf);
            continue;
        }
        size_t es = bf ? (inner < bw ? inner : bw) : inner;
        size_t j = 0;
        for (; j + bw <= inner; j += bw) {
            float * e = bf ? scratch : (float *)d + j;
            if (bv == 4)
                cols(s + j * esz, count, inner, 4, 0xffff, e, es, d + j * esz, bf);
            else if (bv == 2)
                cols(s + j * esz, count, inner, 2, 0xffff, e, es, d + j * esz, bf);
            else
                cols(s + j * esz, count, inner, 1, 0xffff, e, es, d + j * esz, bf);
        }
        if (j < inner) {
            size_t rest = inner - j, v = (rest + 15) / 16;
            __mmask16 lm = tn_avx512_tail_mask(rest - 16 * (v - 1));
            float * e = bf ? scratch : (float *)d + j;
            if (v == 4)
                cols(s + j * esz, count, inner, 4, lm, e, es, d + j * esz, bf);
            else if (v == 3)
                cols(s + j * esz, count, inner, 3, lm, e, es, d + j * esz, bf);
            else if (v == 2)
                cols(s + j * esz, count, inner, 2, lm, e, es, d + j * esz, bf);
            else
                cols(s + j * esz, count, inner, 1, lm, e, es, d + j * esz, bf);
        }
    }
}

void tn_avx512_SynetSoftmax32f(const float * src, size_t outer, size_t count, size_t inner, float * dst)
{
    if (count == 0 || inner == 0)
        return;
    softmax(src, outer, count, inner, dst, NULL, 0);
}

void tn_avx512_SynetSoftmax16b(const uint16_t * src, size_t outer, size_t count, size_t inner, uint16_t * dst)
{
    if (count == 0 || inner == 0)
        return;
    float stack[SM_STACK_FLOATS];
    size_t bw = 16 * block_vectors(count);
    size_t need = count * (inner < bw ? inner : bw); /* also count * inner when inner < SM_FLAT_INNER */
    float * e = need <= SM_STACK_FLOATS ? stack : (float *)malloc(need * sizeof(float));
    if (e == NULL) {
        fill_nan(dst, outer * count * inner, 1);
        return;
    }
    softmax(src, outer, count, inner, dst, e, 1);
    if (e != stack)
        free(e);
}
