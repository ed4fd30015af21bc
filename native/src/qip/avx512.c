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
 * Row tiles are balanced (a block of 16 rows runs as 8 + 8, not 12 + 4). While the first
 * row tile of a block works on a panel, it prefetches the next panel into L2 when B is
 * unlikely to be there already.
 *
 * Only the callers in qip.c reach this file, and only when the CPU reports AVX-512 VNNI
 * (and AMX-INT8 with its OS permission for the tile code).
 */
#include "simd/avx512.h" /* the level: AVX-512 F, BW, VL, DQ */

#pragma GCC target("avx512vnni,amx-tile,amx-int8")

#include <immintrin.h>
#include <stdint.h>
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
    const int8_t * pf;     /* the next panel's rows to prefetch (two lines per quad), or NULL */
} Tile;

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
#define TN_ROWS_U(X, u) \
    X(u, 0) X(u, 1) X(u, 2) X(u, 3) X(u, 4) X(u, 5) X(u, 6) X(u, 7) X(u, 8) X(u, 9) X(u, 10) X(u, 11)

#define TN_DECL_SET(u, i) __m512i x##u##_##i##_0 = _mm512_setzero_si512(), x##u##_##i##_1 = _mm512_setzero_si512();
#define TN_DECL(i) TN_DECL_SET(0, i) TN_DECL_SET(1, i) TN_DECL_SET(2, i) TN_DECL_SET(3, i)
#define TN_LOAD_PART(i) \
    if (MR > i) { \
        x0_##i##_0 = _mm512_loadu_si512(t->part + i * 32); \
        x0_##i##_1 = _mm512_loadu_si512(t->part + i * 32 + 16); \
    }
#define TN_ADD(u, i, av_expr) \
    if (U > u && MR > i) { \
        const __m512i av = _mm512_set1_epi32((int)(av_expr)); \
        x##u##_##i##_0 = _mm512_dpbusd_epi32(x##u##_##i##_0, av, b0); \
        x##u##_##i##_1 = _mm512_dpbusd_epi32(x##u##_##i##_1, av, b1); \
    }
#define TN_STEP(u, i) TN_ADD(u, i, tn_qip_load_u32(a + i * lda + 4 * u))
#define TN_STEP_TAIL(i) TN_ADD(0, i, tn_qip_load_tail(a + i * lda, t->tail))
#define TN_COMBINE_SET(u, i) \
    if (U > u) { \
        x0_##i##_0 = _mm512_add_epi32(x0_##i##_0, x##u##_##i##_0); \
        x0_##i##_1 = _mm512_add_epi32(x0_##i##_1, x##u##_##i##_1); \
    }
#define TN_COMBINE(i) \
    if (MR > i) { \
        TN_COMBINE_SET(1, i) TN_COMBINE_SET(2, i) TN_COMBINE_SET(3, i) \
    }
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

/* MR rows x 32 columns over one K block; U accumulator sets over consecutive quads. */
TN_INLINE void vnni_tile(const int MR, const int U, const Tile * t)
{
    TN_ROWS(TN_DECL)
    if (!t->first) {
        TN_ROWS(TN_LOAD_PART)
    }
    const uint8_t * a = t->a;
    const int8_t * b = t->b;
    const int8_t * pf = t->pf;
    const size_t lda = t->lda;
    size_t n = t->nq;
    for (; n >= (size_t)U; n -= U) {
        if (pf) {
            for (int l = 0; l < 2 * U; ++l)
                _mm_prefetch((const char *)pf + 64 * l, _MM_HINT_T1);
            pf += 128 * U;
        }
        __m512i b0 = _mm512_loadu_si512(b), b1 = _mm512_loadu_si512(b + 64);
        TN_ROWS_U(TN_STEP, 0)
        if (U > 1) {
            b0 = _mm512_loadu_si512(b + 128);
            b1 = _mm512_loadu_si512(b + 192);
            TN_ROWS_U(TN_STEP, 1)
        }
        if (U > 2) {
            b0 = _mm512_loadu_si512(b + 256);
            b1 = _mm512_loadu_si512(b + 320);
            TN_ROWS_U(TN_STEP, 2)
        }
        if (U > 3) {
            b0 = _mm512_loadu_si512(b + 384);
            b1 = _mm512_loadu_si512(b + 448);
            TN_ROWS_U(TN_STEP, 3)
        }
        a += 4 * U;
        b += 128 * U;
    }
    for (; n > 0; --n) {
        const __m512i b0 = _mm512_loadu_si512(b), b1 = _mm512_loadu_si512(b + 64);
        TN_ROWS_U(TN_STEP, 0)
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
/* clang-format off */
TN_VNNI_TILE(1) TN_VNNI_TILE(2) TN_VNNI_TILE(3) TN_VNNI_TILE(4) TN_VNNI_TILE(5) TN_VNNI_TILE(6)
TN_VNNI_TILE(7) TN_VNNI_TILE(8) TN_VNNI_TILE(9) TN_VNNI_TILE(10) TN_VNNI_TILE(11) TN_VNNI_TILE(12)
/* clang-format on */
#undef TN_VNNI_TILE

static void (*const vnni_tiles[TN_VNNI_MR + 1])(const Tile *) = {
    NULL,        vnni_tile_1, vnni_tile_2, vnni_tile_3,  vnni_tile_4,  vnni_tile_5,  vnni_tile_6,
    vnni_tile_7, vnni_tile_8, vnni_tile_9, vnni_tile_10, vnni_tile_11, vnni_tile_12,
};

static __mmask16 cols_mask(size_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }

/* Rows [0, mb) of a block times one panel (32 columns), all K blocks. */
static void vnni_panel(const TnQip * q, size_t mb, const uint8_t * A, const int8_t * bp, const int8_t * next,
                       const int32_t * biasq, const float * norm, size_t ncols, int32_t * part, uint8_t * C)
{
    const size_t K = q->K, kfull = K / 4, tail = K % 4;
    const size_t tiles = (mb + TN_VNNI_MR - 1) / TN_VNNI_MR;
    const size_t base = mb / tiles, extra = mb % tiles;
    Tile t;
    t.lda = K;
    t.biasq = biasq;
    t.norm = norm;
    t.czero = q->state->cZero;
    t.ldc = q->N;
    t.m0 = cols_mask(ncols);
    t.m1 = ncols > 16 ? cols_mask(ncols - 16) : 0;
    /* K blocks keep a slice of the panel in L1 for the next row tiles: with one tile
     * there is no next one, and the whole of K runs at once. */
    const size_t kc = tiles > 1 ? q->kc : q->kq;
    for (size_t pc = 0; pc < q->kq; pc += kc) {
        size_t nqb = q->kq - pc < kc ? q->kq - pc : kc;
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
            /* The first row tile fetches the next panel's slice of this K block into L2. */
            t.pf = ti == 0 && next ? next + pc * TN_QIP_ROW_BYTES : NULL;
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
    int32_t * part = (int32_t *)(buf + s.part); /* used only when K is blocked */
    const size_t mcb = tn_qip_row_block(q, M);
    /* Prefetch B when it cannot stay in L2 between calls, or when there are rows enough
     * to hide the prefetches (see amx_forward). */
    const int prefetch = q->constB && (q->panels * q->kqp * TN_QIP_ROW_BYTES > TN_QIP_L2_B_BYTES || M >= 32);
    for (size_t i0 = 0; i0 < M; i0 += mcb) {
        size_t mb = M - i0 < mcb ? M - i0 : mcb;
        for (size_t p = 0; p < q->panels; ++p) {
            size_t j0 = p * TN_QIP_PANEL, ncols = q->N - j0 < TN_QIP_PANEL ? q->N - j0 : TN_QIP_PANEL;
            const int32_t * bq;
            const int8_t * bp = tn_qip_panel(q, p, B, panel, pbias, &bq);
            const int8_t * next = prefetch && p + 1 < q->panels ? bp + q->kqp * TN_QIP_ROW_BYTES : NULL;
            vnni_panel(q, mb, A + i0 * q->K, bp, next, bq, q->norm + j0, ncols, part, C + i0 * q->N + j0);
        }
    }
}

/* ---- AMX-INT8 ------------------------------------------------------------------------
 * Eight tile registers of 16 rows x 64 bytes. A 32 x 32 block keeps its int32 sums in
 * tmm0-3 (16 x 16 each), two A tiles (16 rows x 64 k) in tmm4-5 and two B tiles (16 quads
 * x 16 columns, read straight from a packed panel with a 128-byte stride: its two halves)
 * in tmm6-7. A group of 16 rows alone (a 16 x 32 block) has only two sums, so it double-
 * buffers A and B across steps instead (tmm2-3, tmm4-7) to keep two steps in flight.
 * tdpbusd, like vpdpbusd, adds exact u8 x s8 products into int32: no saturation.
 *
 * The A block is first copied into tile order: for each group of 16 rows and each 64 k,
 * the 16 x 64 bytes of one tile, contiguous, k padded with zeros to 4 kqp (where B is zero
 * too) and a last partial group padded with zero rows. Every tile load then reads 1 KB in
 * sequence and no load leaves A. Rows run in blocks of 32, the last one of 16 if need be.
 *
 * Sums go through `part` (rows of 32 int32): between K blocks, and before requantization,
 * which is software-pipelined: the rows of one block are requantized a few per step while
 * the tiles of the next block multiply. When packed B does not fit in L2, the first row
 * block of each panel prefetches B a few steps ahead (tile loads alone stream it slowly). */

typedef struct {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

static void amx_configure(void)
{
    TileConfig cfg __attribute__((aligned(64)));
    memset(&cfg, 0, sizeof(cfg));
    cfg.palette = 1;
    for (int i = 0; i < 8; ++i) {
        cfg.colsb[i] = 64;
        cfg.rows[i] = 16;
    }
    _tile_loadconfig(&cfg);
}

/* Requantization still to do: rows of 32 int32 sums (in `part`) of one panel. */
typedef struct {
    const int32_t * part;
    size_t rows;
    int32_t biasq[TN_QIP_PANEL]; /* a copy: with constB = false the panel's bias' is rewritten */
    const float * norm;
    uint8_t * c;
    size_t ldc;
    __mmask16 m0, m1;
    int32_t czero;
} Pending;

static void pending_set(Pending * e, const TnQip * q, const int32_t * part, size_t rows, const int32_t * biasq,
                        size_t j0, uint8_t * C)
{
    const size_t ncols = q->N - j0 < TN_QIP_PANEL ? q->N - j0 : TN_QIP_PANEL;
    e->part = part;
    e->rows = rows;
    memcpy(e->biasq, biasq, sizeof(e->biasq));
    e->norm = q->norm + j0;
    e->c = C;
    e->ldc = q->N;
    e->m0 = cols_mask(ncols);
    e->m1 = ncols > 16 ? cols_mask(ncols - 16) : 0;
    e->czero = q->state->cZero;
}

/* Up to n of the pending rows. */
TN_INLINE void pending_run(Pending * e, size_t n)
{
    if (!e->rows)
        return;
    const __m512i b0 = _mm512_loadu_si512(e->biasq), b1 = _mm512_loadu_si512(e->biasq + 16);
    const __m512 n0 = _mm512_loadu_ps(e->norm), n1 = _mm512_loadu_ps(e->norm + 16);
    const __m512i cz = _mm512_set1_epi32(e->czero);
    for (; n && e->rows; --n, --e->rows) {
        requant_store(_mm512_loadu_si512(e->part), b0, n0, cz, e->c, e->m0);
        if (e->m1)
            requant_store(_mm512_loadu_si512(e->part + 16), b1, n1, cz, e->c + 16, e->m1);
        e->part += 32;
        e->c += e->ldc;
    }
}

#define TN_AMX_PENDING_PER_STEP 2

/* Stream prefetch of B when it comes from L3 or memory: the 2 KB of B a step reads,
 * TN_AMX_PREFETCH_AHEAD bytes further on (the panels follow one another in memory). */
#define TN_AMX_PREFETCH_AHEAD 4096

typedef struct {
    const int8_t * end; /* end of packed B; NULL: no prefetch */
} Prefetch;

TN_INLINE void prefetch_step(const Prefetch * f, const int8_t * b)
{
    const int8_t * p = b + TN_AMX_PREFETCH_AHEAD;
    if (f->end && p + 16 * TN_QIP_ROW_BYTES <= f->end)
        for (int i = 0; i < 16 * TN_QIP_ROW_BYTES / 64; ++i)
            _mm_prefetch((const char *)p + 64 * i, _MM_HINT_T0);
}

/* 32 rows x 32 columns, `steps` x 64 k. a: the A tiles of the first 16 rows (1 KB per
 * step), a + a_next those of the next 16; part: 32 rows of 32 int32, loaded unless
 * `first`, stored at the end (after the pending rows, which may be the same ones). */
static void amx_block32(const uint8_t * a, size_t a_next, const int8_t * b, size_t steps, int first, int32_t * part,
                        Pending * e, Prefetch f)
{
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_loadd(0, part, 128);
        _tile_loadd(1, part + 16, 128);
        _tile_loadd(2, part + 16 * 32, 128);
        _tile_loadd(3, part + 16 * 32 + 16, 128);
    }
    for (size_t s = 0; s < steps; ++s) {
        prefetch_step(&f, b);
        _tile_loadd(4, a, 64);
        _tile_loadd(6, b, 128);
        _tile_loadd(7, b + 64, 128);
        _tile_dpbusd(0, 4, 6);
        _tile_loadd(5, a + a_next, 64);
        _tile_dpbusd(1, 4, 7);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
        a += 1024;
        b += 16 * TN_QIP_ROW_BYTES;
        pending_run(e, TN_AMX_PENDING_PER_STEP);
    }
    pending_run(e, SIZE_MAX);
    _tile_stored(0, part, 128);
    _tile_stored(1, part + 16, 128);
    _tile_stored(2, part + 16 * 32, 128);
    _tile_stored(3, part + 16 * 32 + 16, 128);
}

/* 16 rows x 32 columns: sums in tmm0-1, A in tmm2 / tmm3 and B in tmm4-5 / tmm6-7 on
 * alternate steps. */
static void amx_block16(const uint8_t * a, const int8_t * b, size_t steps, int first, int32_t * part, Pending * e,
                        Prefetch f)
{
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
    } else {
        _tile_loadd(0, part, 128);
        _tile_loadd(1, part + 16, 128);
    }
    size_t s = 0;
    for (; s + 2 <= steps; s += 2) {
        prefetch_step(&f, b);
        prefetch_step(&f, b + 16 * TN_QIP_ROW_BYTES);
        _tile_loadd(2, a, 64);
        _tile_loadd(4, b, 128);
        _tile_loadd(5, b + 64, 128);
        _tile_dpbusd(0, 2, 4);
        _tile_dpbusd(1, 2, 5);
        _tile_loadd(3, a + 1024, 64);
        _tile_loadd(6, b + 16 * TN_QIP_ROW_BYTES, 128);
        _tile_loadd(7, b + 16 * TN_QIP_ROW_BYTES + 64, 128);
        _tile_dpbusd(0, 3, 6);
        _tile_dpbusd(1, 3, 7);
        a += 2048;
        b += 32 * TN_QIP_ROW_BYTES;
        pending_run(e, 2 * TN_AMX_PENDING_PER_STEP);
    }
    if (s < steps) {
        _tile_loadd(2, a, 64);
        _tile_loadd(4, b, 128);
        _tile_loadd(5, b + 64, 128);
        _tile_dpbusd(0, 2, 4);
        _tile_dpbusd(1, 2, 5);
    }
    pending_run(e, SIZE_MAX);
    _tile_stored(0, part, 128);
    _tile_stored(1, part + 16, 128);
}

/* Rows [0, rows) of A in tile order (see above), zero rows up to a multiple of 16. */
static void amx_pack_a(const uint8_t * A, size_t rows, size_t K, size_t kqp, uint8_t * dst)
{
    const size_t steps = kqp / 16, kfull = K / 64, rest = K % 64;
    const size_t padded = (rows + 15) & ~(size_t)15;
    for (size_t g = 0; g < padded; g += 16) {
        for (size_t r = 0; r < 16; ++r) {
            uint8_t * d = dst + g * 4 * kqp + r * 64;
            size_t s = 0;
            if (g + r < rows) {
                const uint8_t * src = A + (g + r) * K;
                for (; s < kfull; ++s)
                    _mm512_storeu_si512(d + s * 1024, _mm512_loadu_si512(src + s * 64));
                if (rest) {
                    __m512i v = _mm512_maskz_loadu_epi8(((__mmask64)1 << rest) - 1, src + s * 64);
                    _mm512_storeu_si512(d + s++ * 1024, v);
                }
            }
            for (; s < steps; ++s)
                _mm512_storeu_si512(d + s * 1024, _mm512_setzero_si512());
        }
    }
}

/* Rows [0, M) on the tiles (a last partial group of 16 computes zero rows). */
static void amx_forward(const TnQip * q, size_t M, const uint8_t * A, const int8_t * B, uint8_t * buf, uint8_t * C)
{
    TnQipScratch s;
    tn_qip_scratch_layout(q, M, &s);
    int8_t * panel = (int8_t *)(buf + s.panel);
    int32_t * pbias = (int32_t *)(buf + s.pbias);
    int32_t * part = (int32_t *)(buf + s.part);
    uint8_t * apack = buf + s.apack;
    const size_t K = q->K, kqp = q->kqp, group = 16 * 4 * kqp;
    /* Prefetch B when it cannot stay in L2 from one call to the next, or when the blocks
     * have rows enough to hide the prefetches (a B that fits in L2 may still have been
     * evicted by other work between calls; for a lone group of 16 rows the prefetches
     * would cost more than they save when it was not). */
    const size_t b_bytes = q->panels * kqp * TN_QIP_ROW_BYTES;
    const int prefetch = q->constB && (b_bytes > TN_QIP_L2_B_BYTES || M >= 32);
    const int8_t * b_end = prefetch ? q->packed + b_bytes : NULL;
    Pending e;
    e.rows = 0;
    amx_configure();
    for (size_t i0 = 0; i0 < M; i0 += q->mc) {
        const size_t mb = M - i0 < q->mc ? M - i0 : q->mc;
        const size_t mt = (mb + 15) & ~(size_t)15; /* rows on the tiles */
        amx_pack_a(A + i0 * K, mb, K, kqp, apack);
        /* K blocks keep a slice of the panel in L1 for the next row blocks: with a single
         * block the whole of K runs at once. */
        const size_t kc = mt > 32 ? q->amx_kc : kqp;
        for (size_t p = 0; p < q->panels; ++p) {
            const size_t j0 = p * TN_QIP_PANEL;
            const int32_t * bq;
            const int8_t * bp = tn_qip_panel(q, p, B, panel, pbias, &bq);
            for (size_t pc = 0; pc < kqp; pc += kc) {
                const size_t steps = (kqp - pc < kc ? kqp - pc : kc) / 16;
                const int first = pc == 0, last = pc + 16 * steps == kqp;
                const int8_t * b = bp + pc * TN_QIP_ROW_BYTES;
                /* The first row block reads this slice of B from L3 or memory: it
                 * prefetches ahead; the next ones find it in cache. */
                Prefetch f = {b_end};
                for (size_t r = 0; r < mt; r += 32) {
                    const uint8_t * a = apack + (r / 16) * group + pc * 64;
                    if (mt - r >= 32)
                        amx_block32(a, group, b, steps, first, part + r * 32, &e, f);
                    else
                        amx_block16(a, b, steps, first, part + r * 32, &e, f);
                    f.end = NULL;
                    if (last) {
                        const size_t rows = mb - r < 32 ? mb - r : 32;
                        pending_set(&e, q, part + r * 32, rows, bq, j0, C + (i0 + r) * q->N + j0);
                    }
                }
            }
        }
    }
    pending_run(&e, SIZE_MAX);
    _tile_release();
}

void tn_qip_avx512_forward(const TnQip * q, size_t M, const uint8_t * A, const int8_t * B, uint8_t * buf, uint8_t * C)
{
    if (q->algo == TN_QIP_AMX && M >= q->amx_min_m) {
        /* Up to amx_min_m - 1 last rows are cheaper on the vector tiles than as a padded
         * group of 16. */
        const size_t rest = M % 16, mt = rest >= q->amx_min_m ? M : M - rest;
        amx_forward(q, mt, A, B, buf, C);
        if (mt < M)
            vnni_forward(q, M - mt, A + mt * q->K, B, buf, C + mt * q->N);
        return;
    }
    vnni_forward(q, M, A, B, buf, C);
}
