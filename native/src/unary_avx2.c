/*
 * SynetUnaryOperation32f, AVX2: a masked head vector up to 32-byte alignment of dst,
 * 4 vectors per iteration, then single vectors, then one masked vector for the tail.
 * Results are bit-identical to unary_scalar.c.
 */
#include "vmath_avx2.h"

#include "kernels.h"
#include "tensorops.h"

#define TN_INL static inline __attribute__((always_inline))

TN_INL __m256 op_abs(__m256 x) { return tn_avx2_abs(x); }
TN_INL __m256 op_ceil(__m256 x) { return _mm256_round_ps(x, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC); }
TN_INL __m256 op_floor(__m256 x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
TN_INL __m256 op_round(__m256 x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
TN_INL __m256 op_neg(__m256 x) { return _mm256_xor_ps(x, _mm256_set1_ps(-0.0f)); }
TN_INL __m256 op_not(__m256 x) { return _mm256_xor_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(-1))); }
TN_INL __m256 op_rcp(__m256 x) { return _mm256_div_ps(_mm256_set1_ps(1.0f), x); }
TN_INL __m256 op_sqrt(__m256 x) { return _mm256_sqrt_ps(x); }
TN_INL __m256 op_rsqrt(__m256 x) { return _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_sqrt_ps(x)); }
TN_INL __m256 op_exp(__m256 x) { return tn_avx2_exp(x); }
TN_INL __m256 op_log(__m256 x) { return tn_avx2_log(x); }
TN_INL __m256 op_tanh(__m256 x) { return tn_avx2_tanh(x); }
TN_INL __m256 op_erf(__m256 x) { return tn_avx2_erf(x); }
TN_INL __m256 op_sin(__m256 x) { return tn_avx2_sin(x); }
TN_INL __m256 op_cos(__m256 x) { return tn_avx2_cos(x); }
TN_INL __m256 op_nan(__m256 x) { (void)x; return _mm256_set1_ps(NAN); }

TN_INL __m256 op_sign(__m256 x)
{
    __m256 pos = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ), _mm256_set1_ps(1.0f));
    __m256 neg = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ), _mm256_set1_ps(-1.0f));
    return _mm256_blendv_ps(_mm256_or_ps(pos, neg), _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* A masked head vector first aligns dst to 32 bytes (and src too when both share their
 * offset, as NumPy's allocations do), so the main loop does no cache-line-split access. */
#define TN_UNARY_LOOP(OP)                                                               \
    do {                                                                                \
        size_t i = (size_t)((0u - (uintptr_t)dst) & 31u) / sizeof(float);               \
        if (i > size)                                                                   \
            i = size;                                                                   \
        if (i) {                                                                        \
            __m256i m = tn_avx2_tail_mask(i);                                           \
            _mm256_maskstore_ps(dst, m, OP(_mm256_maskload_ps(src, m)));                \
        }                                                                               \
        for (; i + 4 * TN_AVX2_F <= size; i += 4 * TN_AVX2_F) {                         \
            __m256 y0 = OP(_mm256_loadu_ps(src + i + 0 * TN_AVX2_F));                   \
            __m256 y1 = OP(_mm256_loadu_ps(src + i + 1 * TN_AVX2_F));                   \
            __m256 y2 = OP(_mm256_loadu_ps(src + i + 2 * TN_AVX2_F));                   \
            __m256 y3 = OP(_mm256_loadu_ps(src + i + 3 * TN_AVX2_F));                   \
            _mm256_storeu_ps(dst + i + 0 * TN_AVX2_F, y0);                              \
            _mm256_storeu_ps(dst + i + 1 * TN_AVX2_F, y1);                              \
            _mm256_storeu_ps(dst + i + 2 * TN_AVX2_F, y2);                              \
            _mm256_storeu_ps(dst + i + 3 * TN_AVX2_F, y3);                              \
        }                                                                               \
        for (; i + TN_AVX2_F <= size; i += TN_AVX2_F)                                   \
            _mm256_storeu_ps(dst + i, OP(_mm256_loadu_ps(src + i)));                    \
        if (i < size) {                                                                 \
            __m256i m = tn_avx2_tail_mask(size - i);                                    \
            _mm256_maskstore_ps(dst + i, m, OP(_mm256_maskload_ps(src + i, m)));        \
        }                                                                               \
    } while (0)

void tn_avx2_SynetUnaryOperation32f(const float * src, size_t size, int type, float * dst)
{
    switch (type) {
    case TnSynetUnaryOperation32fAbs: TN_UNARY_LOOP(op_abs); break;
    case TnSynetUnaryOperation32fCeil: TN_UNARY_LOOP(op_ceil); break;
    case TnSynetUnaryOperation32fCos: TN_UNARY_LOOP(op_cos); break;
    case TnSynetUnaryOperation32fErf: TN_UNARY_LOOP(op_erf); break;
    case TnSynetUnaryOperation32fExp: TN_UNARY_LOOP(op_exp); break;
    case TnSynetUnaryOperation32fFloor: TN_UNARY_LOOP(op_floor); break;
    case TnSynetUnaryOperation32fLog: TN_UNARY_LOOP(op_log); break;
    case TnSynetUnaryOperation32fNeg: TN_UNARY_LOOP(op_neg); break;
    case TnSynetUnaryOperation32fNot: TN_UNARY_LOOP(op_not); break;
    case TnSynetUnaryOperation32fRcp: TN_UNARY_LOOP(op_rcp); break;
    case TnSynetUnaryOperation32fRound: TN_UNARY_LOOP(op_round); break;
    case TnSynetUnaryOperation32fRsqrt: TN_UNARY_LOOP(op_rsqrt); break;
    case TnSynetUnaryOperation32fSign: TN_UNARY_LOOP(op_sign); break;
    case TnSynetUnaryOperation32fSin: TN_UNARY_LOOP(op_sin); break;
    case TnSynetUnaryOperation32fSqrt: TN_UNARY_LOOP(op_sqrt); break;
    case TnSynetUnaryOperation32fTanh: TN_UNARY_LOOP(op_tanh); break;
    case TnSynetUnaryOperation32fZero: memset(dst, 0, size * sizeof(float)); break;
    default: TN_UNARY_LOOP(op_nan); break;
    }
}
