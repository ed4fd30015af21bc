/*
 * SynetUnaryOperation32f, AVX-512: a masked head vector up to 64-byte alignment of dst,
 * 4 vectors per iteration, then single vectors, then one masked vector for the tail.
 * Results are bit-identical to unary_scalar.c.
 */
#include "vmath_avx512.h"

#include "kernels.h"
#include "tensorops.h"

#define TN_INL static inline __attribute__((always_inline))

TN_INL __m512 op_abs(__m512 x) { return tn_avx512_abs(x); }
TN_INL __m512 op_ceil(__m512 x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC); }
TN_INL __m512 op_floor(__m512 x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
TN_INL __m512 op_round(__m512 x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
TN_INL __m512 op_neg(__m512 x)
{
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int32_t)0x80000000u)));
}
TN_INL __m512 op_not(__m512 x) { return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(x), _mm512_castps_si512(x), _mm512_castps_si512(x), 0x55)); }
TN_INL __m512 op_rcp(__m512 x) { return _mm512_div_ps(_mm512_set1_ps(1.0f), x); }
TN_INL __m512 op_sqrt(__m512 x) { return _mm512_sqrt_ps(x); }
TN_INL __m512 op_rsqrt(__m512 x) { return _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_sqrt_ps(x)); }
TN_INL __m512 op_exp(__m512 x) { return tn_avx512_exp(x); }
TN_INL __m512 op_log(__m512 x) { return tn_avx512_log(x); }
TN_INL __m512 op_tanh(__m512 x) { return tn_avx512_tanh(x); }
TN_INL __m512 op_erf(__m512 x) { return tn_avx512_erf(x); }
TN_INL __m512 op_sin(__m512 x) { return tn_avx512_sin(x); }
TN_INL __m512 op_cos(__m512 x) { return tn_avx512_cos(x); }
TN_INL __m512 op_nan(__m512 x) { (void)x; return _mm512_set1_ps(NAN); }

TN_INL __m512 op_sign(__m512 x)
{
    __m512 y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_set1_ps(1.0f));
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_set1_ps(-1.0f));
    return _mm512_mask_add_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x, x);
}

/* A masked head vector first aligns dst to 64 bytes (and src too when both share their
 * offset, as NumPy's allocations do), so the main loop does no cache-line-split access. */
#define TN_UNARY_LOOP(OP)                                                               \
    do {                                                                                \
        size_t i = (size_t)((0u - (uintptr_t)dst) & 63u) / sizeof(float);               \
        if (i > size)                                                                   \
            i = size;                                                                   \
        if (i) {                                                                        \
            __mmask16 m = tn_avx512_tail_mask(i);                                       \
            _mm512_mask_storeu_ps(dst, m, OP(_mm512_maskz_loadu_ps(m, src)));           \
        }                                                                               \
        for (; i + 4 * TN_AVX512_F <= size; i += 4 * TN_AVX512_F) {                     \
            __m512 y0 = OP(_mm512_loadu_ps(src + i + 0 * TN_AVX512_F));                 \
            __m512 y1 = OP(_mm512_loadu_ps(src + i + 1 * TN_AVX512_F));                 \
            __m512 y2 = OP(_mm512_loadu_ps(src + i + 2 * TN_AVX512_F));                 \
            __m512 y3 = OP(_mm512_loadu_ps(src + i + 3 * TN_AVX512_F));                 \
            _mm512_storeu_ps(dst + i + 0 * TN_AVX512_F, y0);                            \
            _mm512_storeu_ps(dst + i + 1 * TN_AVX512_F, y1);                            \
            _mm512_storeu_ps(dst + i + 2 * TN_AVX512_F, y2);                            \
            _mm512_storeu_ps(dst + i + 3 * TN_AVX512_F, y3);                            \
        }                                                                               \
        for (; i + TN_AVX512_F <= size; i += TN_AVX512_F)                               \
            _mm512_storeu_ps(dst + i, OP(_mm512_loadu_ps(src + i)));                    \
        if (i < size) {                                                                 \
            __mmask16 m = tn_avx512_tail_mask(size - i);                                \
            _mm512_mask_storeu_ps(dst + i, m, OP(_mm512_maskz_loadu_ps(m, src + i)));   \
        }                                                                               \
    } while (0)

/* Large outputs (beyond any L2) are written with non-temporal stores: the main loop's dst
 * is 64-byte aligned, and streaming skips the read-for-ownership of every output line. */
#define TN_UNARY_STREAM_MIN (1u << 19) /* floats: 2 MiB of output */

#define TN_UNARY_LOOP_STREAM(OP)                                                        \
    do {                                                                                \
        size_t i = (size_t)((0u - (uintptr_t)dst) & 63u) / sizeof(float);               \
        if (i) {                                                                        \
            __mmask16 m = tn_avx512_tail_mask(i);                                       \
            _mm512_mask_storeu_ps(dst, m, OP(_mm512_maskz_loadu_ps(m, src)));           \
        }                                                                               \
        for (; i + 4 * TN_AVX512_F <= size; i += 4 * TN_AVX512_F) {                     \
            __m512 y0 = OP(_mm512_loadu_ps(src + i + 0 * TN_AVX512_F));                 \
            __m512 y1 = OP(_mm512_loadu_ps(src + i + 1 * TN_AVX512_F));                 \
            __m512 y2 = OP(_mm512_loadu_ps(src + i + 2 * TN_AVX512_F));                 \
            __m512 y3 = OP(_mm512_loadu_ps(src + i + 3 * TN_AVX512_F));                 \
            _mm512_stream_ps(dst + i + 0 * TN_AVX512_F, y0);                            \
            _mm512_stream_ps(dst + i + 1 * TN_AVX512_F, y1);                            \
            _mm512_stream_ps(dst + i + 2 * TN_AVX512_F, y2);                            \
            _mm512_stream_ps(dst + i + 3 * TN_AVX512_F, y3);                            \
        }                                                                               \
        _mm_sfence();                                                                   \
        for (; i + TN_AVX512_F <= size; i += TN_AVX512_F)                               \
            _mm512_storeu_ps(dst + i, OP(_mm512_loadu_ps(src + i)));                    \
        if (i < size) {                                                                 \
            __mmask16 m = tn_avx512_tail_mask(size - i);                                \
            _mm512_mask_storeu_ps(dst + i, m, OP(_mm512_maskz_loadu_ps(m, src + i)));   \
        }                                                                               \
    } while (0)

/* Every op: streaming stores for large outputs, regular ones otherwise. */
#define TN_UNARY(OP)                                                                    \
    do {                                                                                \
        if (size >= TN_UNARY_STREAM_MIN && ((uintptr_t)dst & 3u) == 0)                  \
            TN_UNARY_LOOP_STREAM(OP);                                                   \
        else                                                                            \
            TN_UNARY_LOOP(OP);                                                          \
    } while (0)

void tn_avx512_SynetUnaryOperation32f(const float * src, size_t size, int type, float * dst)
{
    switch (type) {
    case TnSynetUnaryOperation32fAbs: TN_UNARY(op_abs); break;
    case TnSynetUnaryOperation32fCeil: TN_UNARY(op_ceil); break;
    case TnSynetUnaryOperation32fCos: TN_UNARY(op_cos); break;
    case TnSynetUnaryOperation32fErf: TN_UNARY(op_erf); break;
    case TnSynetUnaryOperation32fExp: TN_UNARY(op_exp); break;
    case TnSynetUnaryOperation32fFloor: TN_UNARY(op_floor); break;
    case TnSynetUnaryOperation32fLog: TN_UNARY(op_log); break;
    case TnSynetUnaryOperation32fNeg: TN_UNARY(op_neg); break;
    case TnSynetUnaryOperation32fNot: TN_UNARY(op_not); break;
    case TnSynetUnaryOperation32fRcp: TN_UNARY(op_rcp); break;
    case TnSynetUnaryOperation32fRound: TN_UNARY(op_round); break;
    case TnSynetUnaryOperation32fRsqrt: TN_UNARY(op_rsqrt); break;
    case TnSynetUnaryOperation32fSign: TN_UNARY(op_sign); break;
    case TnSynetUnaryOperation32fSin: TN_UNARY(op_sin); break;
    case TnSynetUnaryOperation32fSqrt: TN_UNARY(op_sqrt); break;
    case TnSynetUnaryOperation32fTanh: TN_UNARY(op_tanh); break;
    case TnSynetUnaryOperation32fZero: memset(dst, 0, size * sizeof(float)); break;
    default: TN_UNARY(op_nan); break;
    }
}
