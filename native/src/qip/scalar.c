/*
 * Quantized inner product, scalar reference: for each column j, bias'[j] and then one
 * exact int32 dot product per row, requantized by tn_qip_requantize (qip.h), the sequence
 * every SIMD path reproduces.
 */
#include "vmath_scalar.h"

#include "qip.h"

static int32_t dot_u8s8(const uint8_t * a, const int8_t * b, size_t K)
{
    int32_t sum = 0;
    for (size_t k = 0; k < K; ++k)
        sum += (int32_t)a[k] * (int32_t)b[k];
    return sum;
}

void tn_qip_scalar_forward(const TnQip * q, size_t M, const uint8_t * A, const int8_t * B, uint8_t * buf, uint8_t * C)
{
    const size_t N = q->N, K = q->K;
    const int32_t cZero = q->state->cZero;
    TnQipScratch s;
    tn_qip_scratch_layout(q, M, &s);
    for (size_t j = 0; j < N; ++j) {
        const int8_t * col;
        int32_t biasq;
        if (q->constB) {
            col = q->packed + j * K;
            biasq = q->biasq[j];
        } else {
            if (q->transB) {
                col = B + j * K;
            } else {
                int8_t * gathered = (int8_t *)(buf + s.panel);
                for (size_t k = 0; k < K; ++k)
                    gathered[k] = B[k * N + j];
                col = gathered;
            }
            int32_t sum = 0;
            for (size_t k = 0; k < K; ++k)
                sum += col[k];
            biasq = (int32_t)((int64_t)q->bias[j] - (int64_t)q->state->aZero * sum);
        }
        const float norm = q->norm[j];
        for (size_t i = 0; i < M; ++i)
            C[i * N + j] = tn_qip_requantize(dot_u8s8(A + i * K, col, K), biasq, norm, cZero);
    }
}
