/*
 * Quantized inner product, AVX-512 level: AVX-512 VNNI (vpdpbusd on zmm) register tiles,
 * and AMX-INT8 (tdpbusd) tile blocks for larger M when the CPU and OS offer AMX.
 *
 * vpdpbusd adds, to each int32 lane, the four products of unsigned bytes of A and signed
 * bytes of B, without saturation: exact. One lane is one column of C, so B is read from
 * the packed panels (qip.h) and A is broadcast four bytes (one quad of k) at a time.
 *
 * Blocking: rows in blocks of q->mc (the A block stays in L2 across the panels), columns
 * in panels of 32 (two zmm), k in blocks of q->kc quads (the panel's slice, kc x 128
 * bytes, stays in L1 across the row tiles of the block). A register tile is MR <= 12 rows
 * x 32 columns: 2 MR accumulators; tiles of few rows keep several accumulator sets over
 * consecutive quads (exact integer sums, so the order does not matter) to hide latency.
 * Row tiles are balanced (a block of 16 rows runs as 8 + 8, not 12 + 4).
 *
 * Only the callers in qip.c reach this file, and only when the CPU reports AVX-512 VNNI
 * (and AMX-INT8 with its OS permission for the tile code).
 */
#include "vmath_avx512.h"

#pragma GCC target("avx512vnni,amx-tile,amx-int8")

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "qip.h"

#define TN_INLINE static inline __attribute__((always_inline))
#define TN_VNNI_MR 12

typedef struct {
    const uint8_t * a;     /* row 0 of the tile at the block's first k */
    size_t lda;
    const int8_t * b;      /* panel row of the block's first quad */
    size_t nq;             /* whole quads read from A */
    size_t tail;           /* bytes of a final partial quad of A (0..3) */
    int first, last;       /* first / last K block */
    int32_t * part;        /* partial sums of the tile, rows of 32 */
    const int32_t * biasq; /* 32 values */
    const float * norm;    /* 32 values */
    int32_t czero;
    uint8_t * c;
    size_t ldc;
    __mmask16 m0, m1;      /* columns 0..15 and 16..31 present */
} Tile;

static inline uint32_t load_u32(const uint8_t * p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

TN_INLINE void requant_store(__m512i acc, __m512i bq, __m512 norm, __m512i cz, uint8_t * dst, __mmask16 m)
{
    __m512i s = _mm512_add_epi32(acc, bq);
    __m512 f = _mm512_cvt_roundepi32_ps(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    f = _mm512_mul_ps(f, norm);
    f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps(-512.0f)), _mm512_set1_ps(512.0f));
    __m512i r = _mm512_cvt_roundps_epi32(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_max_epi32(_mm512_add_epi32(r, cz), _mm512_setzero_si512());
    _mm_mask_storeu_epi8(dst, m, _mm512_cvtusepi32_epi8(r));
}

/* The register tile is written with one named variable per accumulator (x<set>_<row>_<half>)
 * rather than an array: GCC then keeps every accumulator in a register. Rows and sets
 * beyond MR and U are compiled out. */
#define TN_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

#define TN_DECL_SET(u, i) __m512i x##u##_##i##_0 = _mm512_setzero_si512(), x##u##_##i##_1 = _mm512_setzero_si512();
#define TN_DECL(i) TN_DECL_SET(0, i) TN_DECL_SET(1, i) TN_DECL_SET(2, i) TN_DECL_SET(3, i)
#define TN_LOAD_PART(i) \
    if (MR > i) { \
        x0_##i##_0 = _mm512_loadu_si512(t->part + i * 32); \
        x0_##i##_1 = _mm512_loadu_si512(t->part + i * 32 + 16); \
    }
#define TN_STEP(u, i, av_expr) \
    if (U > u && MR > i) { \
        const __m512i av = _mm512_set1_epi32((int)(av_expr)); \
        x##u##_##i##_0 = _mm512_dpbusd_epi32(x##u##_##i##_0, av, b0); \
        x##u##_##i##_1 = _mm512_dpbusd_epi32(x##u##_##i##_1, av, b1); \
    }
#define TN_STEP0(i) TN_STEP(0, i, load_u32(a + i * lda))
#define TN_STEP1(i) TN_STEP(1, i, load_u32(a + i * lda + 4))
#define TN_STEP2(i) TN_STEP(2, i, load_u32(a + i * lda + 8))
#define TN_STEP3(i) TN_STEP(3, i, load_u32(a + i * lda + 12))
#define TN_STEP_TAIL(i) TN_STEP(0, i, load_tail(a + i * lda, t->tail))
#define TN_COMBINE_SET(u, i) \
    if (U > u) { \
        x0_##i##_0 = _mm512_add_epi32(x0_##i##_0, x##u##_##i##_0); \
        x0_##i##_1 = _mm512_add_epi32(x0_##i##_1, x##u##_##i##_1); \
    }
#define TN_COMBINE(i) if (MR > i) { TN_COMBINE_SET(1, i) TN_COMBINE_SET(2, i) TN_COMBINE_SET(3, i) }
#define TN_STORE_PART(i) \
    if (MR > i) { \
        _mm512_storeu_si512(t->part + i * 32, x0_##i##_0); \
        _mm512_storeu_si512(t->part + i * 32 + 16, x0_##i##_1); \
    }
#define TN_REQUANT(i) \
    if (MR > i) { \
        requant_store(x0_##i##_0, bq0, n0, cz, t->c + i * t->ldc, t->m0); \
        if (t->m1) \
            requant_store(x0_##i##_1, bq1, n1, cz, t->c + i * t->ldc + 16, t->m1); \
    }

/* The last 1..3 bytes of a row, zero-extended (B is zero beyond K anyway). */
static inline uint32_t load_tail(const uint8_t * p, size_t n)
{
    uint32_t v = p[0];
    if (n > 1)
        v |= (uint32_t)p[1] << 8;
    if (n > 2)
        v |= (uint32_t)p[2] << 16;
    return v;
}

/* MR rows x 32 columns over one K block; U accumulator sets over consecutive quads. */
TN_INLINE void vnni_tile(const int MR, const int U, const Tile * t)
{
    TN_ROWS(TN_DECL)
    if (!t->first) {
        TN_ROWS(TN_LOAD_PART)
    }
    const uint8_t * a = t->a;
    const int8_t * b = t->b;
    const size_t lda = t->lda;
    size_t n = t->nq;
    for (; n >= (size_t)U; n -= U) {
        __m512i b0 = _mm512_loadu_si512(b), b1 = _mm512_loadu_si512(b + 64);
        TN_ROWS(TN_STEP0)
        if (U > 1) {
            b0 = _mm512_loadu_si512(b + 128);
            b1 = _mm512_loadu_si512(b + 192);
            TN_ROWS(TN_STEP1)
        }
        if (U > 2) {
            b0 = _mm512_loadu_si512(b + 256);
            b1 = _mm512_loadu_si512(b + 320);
            TN_ROWS(TN_STEP2)
        }
        if (U > 3) {
            b0 = _mm512_loadu_si512(b + 384);
            b1 = _mm512_loadu_si512(b + 448);
            TN_ROWS(TN_STEP3)
        }
        a += 4 * U;
        b += 128 * U;
    }
    for (; n > 0; --n) {
        const __m512i b0 = _mm512_loadu_si512(b), b1 = _mm512_loadu_si512(b + 64);
        TN_ROWS(TN_STEP0)
        a += 4;
        b += 128;
    }
    if (t->tail) {
        const __m512i b0 = _mm512_loadu_si512(b), b1 = _mm512_loadu_si512(b + 64);
        TN_ROWS(TN_STEP_TAIL)
    }
    TN_ROWS(TN_COMBINE)
    if (!t->last) {
        TN_ROWS(TN_STORE_PART)
        return;
    }
    const __m512i bq0 = _mm512_loadu_si512(t->biasq), bq1 = _mm512_loadu_si512(t->biasq + 16);
    const __m512 n0 = _mm512_loadu_ps(t->norm), n1 = _mm512_loadu_ps(t->norm + 16);
    const __m512i cz = _mm512_set1_epi32(t->czero);
    TN_ROWS(TN_REQUANT)
}

#define TN_VNNI_SETS(MR) ((MR) == 1 ? 4 : ((MR) <= 4 ? 2 : 1))
#define TN_VNNI_TILE(MR) \
    static void vnni_tile_##MR(const Tile * t) { vnni_tile(MR, TN_VNNI_SETS(MR), t); }
TN_VNNI_TILE(1) TN_VNNI_TILE(2) TN_VNNI_TILE(3) TN_VNNI_TILE(4) TN_VNNI_TILE(5) TN_VNNI_TILE(6)
TN_VNNI_TILE(7) TN_VNNI_TILE(8) TN_VNNI_TILE(9) TN_VNNI_TILE(10) TN_VNNI_TILE(11) TN_VNNI_TILE(12)
#undef TN_VNNI_TILE

static void (*const vnni_tiles[TN_VNNI_MR + 1])(const Tile *) = {
    NULL, vnni_tile_1, vnni_tile_2, vnni_tile_3, vnni_tile_4, vnni_tile_5, vnni_tile_6,
    vnni_tile_7, vnni_tile_8, vnni_tile_9, vnni_tile_10, vnni_tile_11, vnni_tile_12,
};

static __mmask16 cols_mask(size_t n)
{
    return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}

/* Rows [0, mb) of a block times one panel (32 columns), all K blocks. */
static void vnni_panel(const TnQip * q, size_t mb, const uint8_t * A, const int8_t * bp, const int32_t * biasq,
    const float * norm, size_t ncols, int32_t * part, uint8_t * C)
{
    const size_t K = q->K, kfull = K / 4, tail = K % 4;
    const size_t tiles = (mb + TN_VNNI_MR - 1) / TN_VNNI_MR;
    const size_t base = mb / tiles, extra = mb % tiles;
    Tile t;
    t.lda = K;
    t.biasq = biasq;
    t.norm = norm;
    t.czero = q->cZero;
    t.ldc = q->N;
    t.m0 = cols_mask(ncols);
    t.m1 = ncols > 16 ? cols_mask(ncols - 16) : 0;
    for (size_t pc = 0; pc < q->kq; pc += q->kc) {
        size_t nqb = q->kq - pc < q->kc ? q->kq - pc : q->kc;
        t.first = pc == 0;
        t.last = pc + nqb == q->kq;
        t.tail = t.last ? tail : 0;
        t.nq = t.last ? kfull - pc : nqb;
        t.b = bp + pc * TN_QIP_ROW_BYTES;
        size_t row = 0;
        for (size_t ti = 0; ti < tiles; ++ti) {
            size_t mr = base + (ti < extra);
            t.a = A + row * K + pc * 4;
            t.part = part + row * TN_QIP_PANEL;
            t.c = C + row * q->N;
            vnni_tiles[mr](&t);
            row += mr;
        }
    }
}

static void vnni_forward(const TnQip * q, size_t M, const uint8_t * A, const int8_t * B, uint8_t * buf, uint8_t * C)
{
    TnQipScratch s;
    tn_qip_scratch_layout(q, M, &s);
    int8_t * panel = (int8_t *)(buf + s.panel);
    int32_t * pbias = (int32_t *)(buf + s.pbias);
    int32_t * part = q->kq > q->kc ? (int32_t *)(buf + s.part) : NULL;
    const size_t blocks = (M + q->mc - 1) / q->mc;
    const size_t mcb = (M + blocks - 1) / blocks;
    for (size_t i0 = 0; i0 < M; i0 += mcb) {
        size_t mb = M - i0 < mcb ? M - i0 : mcb;
        for (size_t p = 0; p < q->panels; ++p) {
            size_t j0 = p * TN_QIP_PANEL, ncols = q->N - j0 < TN_QIP_PANEL ? q->N - j0 : TN_QIP_PANEL;
            const int8_t * bp;
            const int32_t * bq;
            if (q->constB) {
                bp = q->packed + p * q->kqp * TN_QIP_ROW_BYTES;
                bq = q->biasq + j0;
            } else {
                int32_t colsum[TN_QIP_PANEL];
                tn_qip_pack_panel(B, q->N, q->K, q->transB, j0, q->kqp, panel, colsum);
                tn_qip_panel_bias(q, j0, colsum, pbias);
                bp = panel;
                bq = pbias;
            }
            vnni_panel(q, mb, A + i0 * q->K, bp, bq, q->norm + j0, ncols, part, C + i0 * q->N + j0);
        }
    }
}

void tn_qip_avx512_forward(const TnQip * q, size_t M, const uint8_t * A, const int8_t * B, uint8_t * buf, uint8_t * C)
{
    vnni_forward(q, M, A, B, buf, C);
}
