/*
 * Quantized inner product (seed 004): the context shared by qip.c (creation, parameters,
 * packing, dispatch) and the per-ISA drivers in scalar.c, avx2.c, avx512.c. The drivers'
 * inner loops are per level by nature (widening multiply-adds, VNNI, AMX); what they
 * share (the row blocks, the panels of B, reading A) is here.
 *
 * What every algorithm computes (docs/kernels.md):
 *   acc[i][j]  = sum_k A[i][k] * B[k][j]                  exact, int32
 *   bias'[j]   = (bias[j] or 0) - aZero * sum_k B[k][j]   int32 (computed in int64)
 *   norm[j]    = (aScale * bScale[j]) / cScale            fp32, in that order
 *   C[i][j]    = clamp(rne(float(acc + bias'[j]) * norm[j]) + cZero, 0, 255)
 * float() is the int32 -> fp32 conversion (round to nearest even), the product is one
 * fp32 multiply, rne() rounds to nearest, ties to even. Every path performs this exact
 * sequence, so every ISA level gives bit-identical results.
 *
 * Exactness limits (documented in tensorops.h, checked by the Python layer):
 *   K <= TN_QIP_K_MAX, so that |acc| <= 255 * 128 * K fits in int32, and
 *   |bias[j]| <= INT32_MAX - 32640 * K, so that bias'[j] and acc + bias'[j] fit too.
 *
 * Packed B ("panels"), used by every SIMD algorithm: the columns are cut into panels of
 * TN_QIP_PANEL = 32; panel p holds columns 32p .. 32p+31 as `kqp` rows of 128 bytes, row q
 * holding, for each of the 32 columns c, the four bytes B[4q .. 4q+3][32p + c] (the
 * vpdpbusd / tdpbusd operand layout: 4 consecutive k of one column per 32-bit lane).
 * Columns >= N and rows k >= K are zero. kqp = ceil(K / 4), rounded up to a multiple of
 * 16 when AMX may run (a B tile is 16 such rows).
 */
#ifndef TN_QIP_H
#define TN_QIP_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define TN_QIP_PANEL 32
#define TN_QIP_ROW_BYTES (4 * TN_QIP_PANEL)
#define TN_QIP_K_MAX 65793 /* floor((2^31 - 1) / (255 * 128)) */
/* Packed B larger than this is assumed not to stay in L2 between calls: the drivers then
 * prefetch the next panel while working on one. */
#define TN_QIP_L2_B_BYTES ((size_t)1 << 20)

typedef enum {
    TN_QIP_SCALAR = 0,
    TN_QIP_AVX2 = 1,        /* AVX2 widening multiply-adds (vpmovsxbw + vpmaddwd) */
    TN_QIP_AVX2_VNNI = 2,   /* AVX-VNNI vpdpbusd on ymm */
    TN_QIP_AVX512_VNNI = 3, /* AVX-512 VNNI vpdpbusd on zmm */
    TN_QIP_AMX = 4          /* AMX-INT8 tdpbusd, with AVX-512 VNNI for small M */
} TnQipAlgo;

/* The state block of a context: this header, then norm, bias and bias' (npad values each)
 * and, with constant B, packed B, each at a 64-byte boundary. One allocation of the
 * context, or with constant B memory the caller placed (PlaceState). Init writes the layout
 * fields, SetParams the scalars and the arrays, then `ready`, last. A context attached to
 * the block (possibly in another process mapping the same memory) only reads it: hence
 * fixed-size fields and no pointers. Bump TN_QIP_STATE_VERSION with any change to this
 * header, to the order of the arrays or to the packed layout. */
#define TN_QIP_STATE_MAGIC 0x50514e54u /* "TNQP" in memory */
#define TN_QIP_STATE_VERSION 1u

typedef struct {
    uint32_t magic;
    uint32_t version;
    uint64_t size; /* bytes of the whole block */
    uint64_t N, K;
    uint32_t transB, hasBias;
    uint32_t algo; /* TnQipAlgo */
    uint32_t kqp;  /* rows of a packed panel */
    float aScale, cScale;
    uint8_t aZero, cZero;
    uint8_t unused[2];
    uint32_t ready; /* 1 once SetParams filled the block: stored with release, read with acquire */
} TnQipState;
_Static_assert(sizeof(TnQipState) == 64, "the state header fills one 64-byte line");

typedef struct TnQip {
    void (*release)(void *); /* first member: TnRelease calls it */
    size_t M, N, K;
    int transB, constB, hasBias;
    int algo;               /* TnQipAlgo */
    int attached;           /* the state block is another context's: read only */
    size_t kq;              /* ceil(K / 4): quads of k */
    size_t kqp;             /* rows of a packed panel (kq, or kq rounded up to 16 for AMX) */
    size_t panels;          /* ceil(N / 32) */
    size_t npad;            /* panels * 32 */
    size_t kc;              /* K block of the vector tiles, in quads */
    size_t mc;              /* M block, in rows */
    size_t amx_kc;          /* AMX: K block, in quads (a multiple of 16) */
    size_t amx_min_m;       /* AMX: Forward with M >= this uses tiles, below it VNNI */
    TnQipState * state;     /* start of the state block: header, scalars, ready */
    float * norm;           /* npad, zero beyond N */
    int32_t * bias;         /* npad: bias or 0 (needed again when B arrives per Forward) */
    int32_t * biasq;        /* npad: bias' = bias - aZero * colsum (constB only) */
    int8_t * packed;        /* constB: packed panels (SIMD) or B transposed, N x K (scalar) */
    void * mem;             /* the state block when the context allocated it, else NULL */
    size_t internal;        /* bytes held by the context (the state block only when in mem) */
    char info[320];
} TnQip;

/* Scratch layout of one Forward of `M` rows (offsets into buf, 64-byte aligned). */
typedef struct {
    size_t panel;   /* constB = false: one packed panel, kqp * 128 bytes */
    size_t pbias;   /* constB = false: bias' of that panel, 32 int32 */
    size_t part;    /* K blocking: int32 partial sums, mc x 32 */
    size_t a16;     /* AVX2 widening: A block as int16, mc x 4kqp */
    size_t apack;   /* AMX: the A block in tile order, mc x 4 kqp bytes */
    size_t total;
} TnQipScratch;

void tn_qip_scratch_layout(const TnQip * q, size_t M, TnQipScratch * s);

/* One panel of B (columns j0 .. j0+31) packed as described above, plus each column's sum
 * over k (0 for columns >= N). Defined in avx2.c: call it only when the CPU has AVX2
 * (every algorithm but scalar). */
void tn_qip_pack_panel(const int8_t * B, size_t N, size_t K, int transB, size_t j0, size_t kqp, int8_t * dst,
                       int32_t * colsum);

/* bias'[c] for the 32 columns of panel starting at j0, from their column sums. */
static inline void tn_qip_panel_bias(const TnQip * q, size_t j0, const int32_t * colsum, int32_t * dst)
{
    for (size_t c = 0; c < TN_QIP_PANEL; ++c)
        dst[c] = (int32_t)((int64_t)q->bias[j0 + c] - (int64_t)q->state->aZero * colsum[c]);
}

/* The scalar requantization every path reproduces. */
static inline uint8_t tn_qip_requantize(int32_t acc, int32_t biasq, float norm, int32_t cZero)
{
    int32_t s = (int32_t)((uint32_t)acc + (uint32_t)biasq);
    float f = (float)s * norm;
    /* Clamp before converting: beyond +-512 the result clamps to 0 or 255 anyway. */
    f = f < -512.0f ? -512.0f : (f > 512.0f ? 512.0f : f);
    int32_t r = (int32_t)lrintf(f) + cZero;
    return (uint8_t)(r < 0 ? 0 : (r > 255 ? 255 : r));
}

/* Four bytes of A (one quad of k) as one 32-bit lane value. */
static inline uint32_t tn_qip_load_u32(const uint8_t * p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The last 1..3 bytes of a row, zero-extended (B is zero beyond K anyway). */
static inline uint32_t tn_qip_load_tail(const uint8_t * p, size_t n)
{
    uint32_t v = p[0];
    if (n > 1)
        v |= (uint32_t)p[1] << 8;
    if (n > 2)
        v |= (uint32_t)p[2] << 16;
    return v;
}

/* Rows per block of a Forward of M rows: blocks of at most q->mc rows, balanced. */
static inline size_t tn_qip_row_block(const TnQip * q, size_t M)
{
    const size_t blocks = (M + q->mc - 1) / q->mc;
    return (M + blocks - 1) / blocks;
}

/* Panel p of B and the bias' of its columns: the ones packed at SetParams (constB), or B
 * packed now into panel and pbias (scratch). */
static inline const int8_t * tn_qip_panel(const TnQip * q, size_t p, const int8_t * B, int8_t * panel, int32_t * pbias,
                                          const int32_t ** biasq)
{
    const size_t j0 = p * TN_QIP_PANEL;
    if (q->constB) {
        *biasq = q->biasq + j0;
        return q->packed + p * q->kqp * TN_QIP_ROW_BYTES;
    }
    int32_t colsum[TN_QIP_PANEL];
    tn_qip_pack_panel(B, q->N, q->K, q->transB, j0, q->kqp, panel, colsum);
    tn_qip_panel_bias(q, j0, colsum, pbias);
    *biasq = pbias;
    return panel;
}

/* Drivers: C[0 .. M) = A[0 .. M) x B. B is the per-call matrix when constB = false (else
 * unused); buf is scratch laid out by tn_qip_scratch_layout for this M. */
void tn_qip_scalar_forward(const TnQip * q, size_t M, const uint8_t * A, const int8_t * B, uint8_t * buf, uint8_t * C);
void tn_qip_avx2_forward(const TnQip * q, size_t M, const uint8_t * A, const int8_t * B, uint8_t * buf, uint8_t * C);
void tn_qip_avx512_forward(const TnQip * q, size_t M, const uint8_t * A, const int8_t * B, uint8_t * buf, uint8_t * C);

/* AMX availability: CPU bits, OS state and the Linux permission request (idempotent). */
int tn_qip_amx_usable(void);

#endif
