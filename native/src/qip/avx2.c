/*
 * Quantized inner product, AVX2 level. Two exact algorithms over the packed panels of
 * qip.h, with the blocking of the AVX-512 driver (rows in blocks of q->mc, panels of 32
 * columns, k in blocks of q->kc quads) and 16 ymm registers:
 *
 * - AVX-VNNI (vpdpbusd on ymm, when the CPU has it): tiles of MR <= 6 rows x 16 columns
 *   (half a panel, two ymm), like the AVX-512 tiles.
 * - Widening (any AVX2 CPU): vpmaddubsw would saturate (255 * 127 * 2 > 32767), so B is
 *   sign-extended to int16 (vpmovsxbw) and A is zero-extended to int16 once per row
 *   block; vpmaddwd then adds pairs of int16 products into int32 lanes, which cannot
 *   overflow. A quad of one column lands in two adjacent lanes (k0+k1, k2+k3); tiles of
 *   MR <= 6 rows x 8 columns keep those pairs apart and add them at the end (vphaddd).
 *
 * AVX-VNNI instructions run only when qip.c selected TN_QIP_AVX2_VNNI, which requires the
 * CPU's AVX-VNNI bit; only the AVX-VNNI tile functions are compiled for it.
 */
#include "simd/avx2.h" /* the level: AVX2, FMA, F16C */

#include <immintrin.h>
#include <string.h>

#include "qip.h"

#define TN_INLINE static inline __attribute__((always_inline))
#define TN_AVX2_MR 6

typedef struct {
    const uint8_t * a;     /* VNNI: row 0 of the tile at the block's first k */
    const int16_t * a16;   /* widening: the same, in the int16 copy of the A block */
    size_t lda;            /* elements */
    const int8_t * b;      /* panel row of the block's first quad, at the tile's columns */
    size_t nq;             /* whole quads read from A */
    size_t tail;           /* VNNI: bytes of a final partial quad (0..3) */
    int first, last;
    int32_t * part;        /* partial sums of the tile, rows of 32, at the tile's columns */
    const int32_t * biasq; /* at the tile's columns */
    const float * norm;
    int32_t czero;
    uint8_t * c;
    size_t ldc;
    size_t ncols;          /* columns of the tile present in C (1..16 or 1..8) */
} Tile;

static inline int64_t load_i64(const int16_t * p)
{
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Requantize 8 columns and store the first n (1..8) bytes. */
TN_INLINE void requant_store8(__m256i acc, const int32_t * biasq, const float * norm, __m256i cz, uint8_t * dst,
                              size_t n)
{
    __m256i s = _mm256_add_epi32(acc, _mm256_loadu_si256((const __m256i *)biasq));
    __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_loadu_ps(norm));
    f = _mm256_min_ps(_mm256_max_ps(f, _mm256_set1_ps(-512.0f)), _mm256_set1_ps(512.0f));
    /* |r| <= 767 here, so the two saturating packs clamp to [0, 255] exactly. */
    __m256i r = _mm256_add_epi32(_mm256_cvtps_epi32(f), cz);
    __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    __m128i bytes = _mm_packus_epi16(w, w);
    if (n >= 8) {
        _mm_storel_epi64((__m128i *)dst, bytes);
    } else {
        uint8_t tmp[16];
        _mm_storeu_si128((__m128i *)tmp, bytes);
        memcpy(dst, tmp, n);
    }
}

/* Register tiles use one named variable per accumulator (x<set>_<row>_<half>) so GCC
 * keeps them all in registers; rows and sets beyond MR and U are compiled out. */
#define TN_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define TN_ROWS_U(X, u) X(u, 0) X(u, 1) X(u, 2) X(u, 3) X(u, 4) X(u, 5)
#define TN_DECL_SET(u, i) __m256i x##u##_##i##_0 = _mm256_setzero_si256(), x##u##_##i##_1 = _mm256_setzero_si256();
#define TN_DECL(i) TN_DECL_SET(0, i) TN_DECL_SET(1, i) TN_DECL_SET(2, i) TN_DECL_SET(3, i)
#define TN_COMBINE_SET(u, i) \
    if (U > u) { \
        x0_##i##_0 = _mm256_add_epi32(x0_##i##_0, x##u##_##i##_0); \
        x0_##i##_1 = _mm256_add_epi32(x0_##i##_1, x##u##_##i##_1); \
    }
#define TN_COMBINE(i) \
    if (MR > i) { \
        TN_COMBINE_SET(1, i) TN_COMBINE_SET(2, i) TN_COMBINE_SET(3, i) \
    }

/* The sums of a tile over its quads, for both kinds of tile: the accumulators (partial
 * sums resumed when this is not the first K block), then U quads per round (one
 * accumulator set each), then single quads. A (an ATYPE *) is row 0 of the tile;
 * LOAD_B(off) loads b0, b1 from the panel at byte offset off; STEP(u, i) adds quad u of
 * row i. */
#define TN_TILE_QUADS(LOAD_PART, ATYPE, A, LOAD_B, STEP) \
    TN_ROWS(TN_DECL) \
    if (!t->first) { \
        TN_ROWS(LOAD_PART) \
    } \
    const ATYPE * a = (A); \
    const int8_t * b = t->b; \
    const size_t lda = t->lda; \
    size_t n = t->nq; \
    __m256i b0, b1; \
    for (; n >= (size_t)U; n -= U) { \
        LOAD_B(0) \
        TN_ROWS_U(STEP, 0) \
        if (U > 1) { \
            LOAD_B(128) \
            TN_ROWS_U(STEP, 1) \
        } \
        if (U > 2) { \
            LOAD_B(256) \
            TN_ROWS_U(STEP, 2) \
        } \
        if (U > 3) { \
            LOAD_B(384) \
            TN_ROWS_U(STEP, 3) \
        } \
        a += 4 * U; \
        b += 128 * U; \
    } \
    for (; n > 0; --n) { \
        LOAD_B(0) \
        TN_ROWS_U(STEP, 0) \
        a += 4; \
        b += 128; \
    }

/* ---- Widening tiles: MR rows x 8 columns ------------------------------------------- */

/* x<u>_<i>_0: columns 0-3 of row i as (k0+k1, k2+k3) lane pairs; x<u>_<i>_1: columns 4-7.
 * Partial sums resume as (sum, 0) pairs. */
#define TN_W_LOAD_PART(i) \
    if (MR > i) { \
        x0_##i##_0 = _mm256_cvtepu32_epi64(_mm_loadu_si128((const __m128i *)(t->part + i * 32))); \
        x0_##i##_1 = _mm256_cvtepu32_epi64(_mm_loadu_si128((const __m128i *)(t->part + i * 32 + 4))); \
    }
#define TN_W_STEP(u, i) \
    if (U > u && MR > i) { \
        const __m256i av = _mm256_set1_epi64x(load_i64(a + i * lda + 4 * u)); \
        x##u##_##i##_0 = _mm256_add_epi32(x##u##_##i##_0, _mm256_madd_epi16(av, b0)); \
        x##u##_##i##_1 = _mm256_add_epi32(x##u##_##i##_1, _mm256_madd_epi16(av, b1)); \
    }
/* hadd gives columns (0, 1, 4, 5 | 2, 3, 6, 7); the permutation restores the order. */
#define TN_W_FINISH(i) \
    if (MR > i) { \
        __m256i sums = _mm256_permute4x64_epi64(_mm256_hadd_epi32(x0_##i##_0, x0_##i##_1), 0xd8); \
        if (!t->last) \
            _mm256_storeu_si256((__m256i *)(t->part + i * 32), sums); \
        else \
            requant_store8(sums, t->biasq, t->norm, cz, t->c + i * t->ldc, t->ncols); \
    }

#define TN_LOAD_B_WIDE(off) \
    b0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + (off)))); \
    b1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + (off) + 16)));

TN_INLINE void wide_tile(const int MR, const int U, const Tile * t)
{
    TN_TILE_QUADS(TN_W_LOAD_PART, int16_t, t->a16, TN_LOAD_B_WIDE, TN_W_STEP)
    TN_ROWS(TN_COMBINE)
    const __m256i cz = _mm256_set1_epi32(t->czero);
    TN_ROWS(TN_W_FINISH)
}

#define TN_SETS(MR) ((MR) == 1 ? 4 : ((MR) <= 3 ? 2 : 1))
#define TN_WIDE_TILE(MR) \
    static void wide_tile_##MR(const Tile * t) { wide_tile(MR, TN_SETS(MR), t); }
/* clang-format off */
TN_WIDE_TILE(1) TN_WIDE_TILE(2) TN_WIDE_TILE(3) TN_WIDE_TILE(4) TN_WIDE_TILE(5) TN_WIDE_TILE(6)
/* clang-format on */
#undef TN_WIDE_TILE

/* Only the AVX-VNNI tiles are compiled for AVX-VNNI, so that no other code of this file (the
 * packing runs on every AVX2 CPU) can pick up its instructions. */
#pragma GCC push_options
#pragma GCC target("avxvnni")

/* ---- AVX-VNNI tiles: MR rows x 16 columns ------------------------------------------ */

#define TN_V_LOAD_PART(i) \
    if (MR > i) { \
        x0_##i##_0 = _mm256_loadu_si256((const __m256i *)(t->part + i * 32)); \
        x0_##i##_1 = _mm256_loadu_si256((const __m256i *)(t->part + i * 32 + 8)); \
    }
#define TN_V_ADD(u, i, av_expr) \
    if (U > u && MR > i) { \
        const __m256i av = _mm256_set1_epi32((int)(av_expr)); \
        x##u##_##i##_0 = _mm256_dpbusd_avx_epi32(x##u##_##i##_0, av, b0); \
        x##u##_##i##_1 = _mm256_dpbusd_avx_epi32(x##u##_##i##_1, av, b1); \
    }
#define TN_V_STEP(u, i) TN_V_ADD(u, i, tn_qip_load_u32(a + i * lda + 4 * u))
#define TN_V_STEP_TAIL(i) TN_V_ADD(0, i, tn_qip_load_tail(a + i * lda, t->tail))
#define TN_V_STORE_PART(i) \
    if (MR > i) { \
        _mm256_storeu_si256((__m256i *)(t->part + i * 32), x0_##i##_0); \
        _mm256_storeu_si256((__m256i *)(t->part + i * 32 + 8), x0_##i##_1); \
    }
#define TN_V_REQUANT(i) \
    if (MR > i) { \
        requant_store8(x0_##i##_0, t->biasq, t->norm, cz, t->c + i * t->ldc, t->ncols); \
        if (t->ncols > 8) \
            requant_store8(x0_##i##_1, t->biasq + 8, t->norm + 8, cz, t->c + i * t->ldc + 8, t->ncols - 8); \
    }

#define TN_LOAD_B_VNNI(off) \
    b0 = _mm256_loadu_si256((const __m256i *)(b + (off))); \
    b1 = _mm256_loadu_si256((const __m256i *)(b + (off) + 32));

TN_INLINE void vnni_tile(const int MR, const int U, const Tile * t)
{
    TN_TILE_QUADS(TN_V_LOAD_PART, uint8_t, t->a, TN_LOAD_B_VNNI, TN_V_STEP)
    if (t->tail) {
        TN_LOAD_B_VNNI(0)
        TN_ROWS(TN_V_STEP_TAIL)
    }
    TN_ROWS(TN_COMBINE)
    if (!t->last) {
        TN_ROWS(TN_V_STORE_PART)
        return;
    }
    const __m256i cz = _mm256_set1_epi32(t->czero);
    TN_ROWS(TN_V_REQUANT)
}

#define TN_VNNI_TILE(MR) \
    static void vnni_tile_##MR(const Tile * t) { vnni_tile(MR, TN_SETS(MR), t); }
/* clang-format off */
TN_VNNI_TILE(1) TN_VNNI_TILE(2) TN_VNNI_TILE(3) TN_VNNI_TILE(4) TN_VNNI_TILE(5) TN_VNNI_TILE(6)
/* clang-format on */
#undef TN_VNNI_TILE

#pragma GCC pop_options

static void (*const vnni_tiles[TN_AVX2_MR + 1])(const Tile *) = {
    NULL, vnni_tile_1, vnni_tile_2, vnni_tile_3, vnni_tile_4, vnni_tile_5, vnni_tile_6,
};
static void (*const wide_tiles[TN_AVX2_MR + 1])(const Tile *) = {
    NULL, wide_tile_1, wide_tile_2, wide_tile_3, wide_tile_4, wide_tile_5, wide_tile_6,
};

/* ---- Packing B (every SIMD algorithm; qip.c calls it only when the CPU has AVX2) ----- */

/* 32 bytes from p, or the first n (< 32) bytes zero-extended. */
static inline __m256i load_bytes(const int8_t * p, size_t n)
{
    if (n >= 32)
        return _mm256_loadu_si256((const __m256i *)p);
    int8_t tmp[32] = {0};
    memcpy(tmp, p, n);
    return _mm256_loadu_si256((const __m256i *)tmp);
}

/* B stored K x N: interleave 4 rows of 32 columns into one 128-byte panel row. */
static void pack_rows(const int8_t * B, size_t N, size_t K, size_t j0, size_t kq, int8_t * dst)
{
    const size_t cols = N - j0 < TN_QIP_PANEL ? N - j0 : TN_QIP_PANEL;
    const __m256i zero = _mm256_setzero_si256();
    for (size_t q = 0; q < kq; ++q) {
        __m256i r[4];
        for (int t = 0; t < 4; ++t) {
            size_t k = 4 * q + t;
            r[t] = k < K ? load_bytes(B + k * N + j0, cols) : zero;
        }
        __m256i t0 = _mm256_unpacklo_epi8(r[0], r[1]), t1 = _mm256_unpackhi_epi8(r[0], r[1]);
        __m256i t2 = _mm256_unpacklo_epi8(r[2], r[3]), t3 = _mm256_unpackhi_epi8(r[2], r[3]);
        /* per 128-bit lane: u0 columns 0-3 (lane 1: 16-19), u1 4-7, u2 8-11, u3 12-15 */
        __m256i u0 = _mm256_unpacklo_epi16(t0, t2), u1 = _mm256_unpackhi_epi16(t0, t2);
        __m256i u2 = _mm256_unpacklo_epi16(t1, t3), u3 = _mm256_unpackhi_epi16(t1, t3);
        int8_t * d = dst + q * TN_QIP_ROW_BYTES;
        _mm256_storeu_si256((__m256i *)d, _mm256_permute2x128_si256(u0, u1, 0x20));
        _mm256_storeu_si256((__m256i *)(d + 32), _mm256_permute2x128_si256(u2, u3, 0x20));
        _mm256_storeu_si256((__m256i *)(d + 64), _mm256_permute2x128_si256(u0, u1, 0x31));
        _mm256_storeu_si256((__m256i *)(d + 96), _mm256_permute2x128_si256(u2, u3, 0x31));
    }
}

/* B stored N x K: each column is a row of B; 8 columns x 8 quads are an 8 x 8 transpose of
 * 32-bit quads. */
static void pack_columns(const int8_t * B, size_t N, size_t K, size_t j0, size_t kq, int8_t * dst)
{
    const size_t cols = N - j0 < TN_QIP_PANEL ? N - j0 : TN_QIP_PANEL;
    for (size_t c0 = 0; c0 < cols; c0 += 8) {
        for (size_t q0 = 0; q0 < kq; q0 += 8) {
            const size_t k0 = 4 * q0, nk = K - k0 < 32 ? K - k0 : 32;
            __m256i r[8];
            for (size_t i = 0; i < 8; ++i)
                r[i] = c0 + i < cols ? load_bytes(B + (j0 + c0 + i) * K + k0, nk) : _mm256_setzero_si256();
            __m256i t[8], u[8];
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
            }
            for (int h = 0; h < 8; h += 4) {
                u[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);     /* quads 0 | 4 of 4 columns */
                u[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]); /* quads 1 | 5 */
                u[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]); /* quads 2 | 6 */
                u[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]); /* quads 3 | 7 */
            }
            const size_t nq = kq - q0 < 8 ? kq - q0 : 8;
            for (size_t j = 0; j < nq; ++j) {
                __m256i v = _mm256_permute2x128_si256(u[j & 3], u[4 + (j & 3)], j < 4 ? 0x20 : 0x31);
                _mm256_storeu_si256((__m256i *)(dst + (q0 + j) * TN_QIP_ROW_BYTES + c0 * 4), v);
            }
        }
    }
}

void tn_qip_pack_panel(const int8_t * B, size_t N, size_t K, int transB, size_t j0, size_t kqp, int8_t * dst,
                       int32_t * colsum)
{
    const size_t kq = (K + 3) / 4;
    memset(dst + kq * TN_QIP_ROW_BYTES, 0, (kqp - kq) * TN_QIP_ROW_BYTES);
    if (transB) {
        /* Columns beyond N stay zero: clear them first (cheap, whole rows). */
        if (N - j0 < TN_QIP_PANEL)
            memset(dst, 0, kq * TN_QIP_ROW_BYTES);
        pack_columns(B, N, K, j0, kq, dst);
    } else {
        pack_rows(B, N, K, j0, kq, dst);
    }
    /* Column sums from the packed rows: each 32-bit lane holds 4 bytes of one column. */
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (size_t q = 0; q < kq; ++q)
        for (int i = 0; i < 4; ++i) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(dst + q * TN_QIP_ROW_BYTES + 32 * i));
            /* |sum of 2 bytes| <= 256: vpmaddubsw cannot saturate here */
            s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v), ones16));
        }
    for (int i = 0; i < 4; ++i)
        _mm256_storeu_si256((__m256i *)(colsum + 8 * i), s[i]);
}

/* Rows of the block as int16, k padded with zeros to whole quads. */
static void widen_rows(const uint8_t * A, size_t rows, size_t K, size_t kqp, int16_t * dst)
{
    const size_t stride = 4 * kqp;
    for (size_t i = 0; i < rows; ++i) {
        const uint8_t * src = A + i * K;
        int16_t * d = dst + i * stride;
        size_t k = 0;
        for (; k + 16 <= K; k += 16)
            _mm256_storeu_si256((__m256i *)(d + k), _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(src + k))));
        for (; k < K; ++k)
            d[k] = src[k];
        for (; k < stride; ++k)
            d[k] = 0;
    }
}

/* Rows [0, mb) of a block times one panel, all K blocks. */
static void panel_tiles(const TnQip * q, size_t mb, const uint8_t * A, const int16_t * a16, const int8_t * bp,
                        const int32_t * biasq, const float * norm, size_t ncols, int32_t * part, uint8_t * C)
{
    const int wide = q->algo == TN_QIP_AVX2;
    const size_t K = q->K, kfull = K / 4, tail = K % 4;
    const size_t tiles = (mb + TN_AVX2_MR - 1) / TN_AVX2_MR;
    const size_t base = mb / tiles, extra = mb % tiles;
    const size_t width = wide ? 8 : 16; /* columns per tile */
    Tile t;
    t.czero = q->state->cZero;
    t.ldc = q->N;
    t.lda = wide ? 4 * q->kqp : K;
    /* K blocks keep a slice of the panel in L1 for the next row tiles: with one tile
     * there is no next one, and the whole of K runs at once. */
    const size_t kc = tiles > 1 ? q->kc : q->kq;
    for (size_t pc = 0; pc < q->kq; pc += kc) {
        size_t nqb = q->kq - pc < kc ? q->kq - pc : kc;
        t.first = pc == 0;
        t.last = pc + nqb == q->kq;
        if (wide) {
            t.nq = nqb; /* the int16 copy is padded to whole quads */
            t.tail = 0;
        } else {
            t.nq = t.last ? kfull - pc : nqb;
            t.tail = t.last ? tail : 0;
        }
        for (size_t j = 0; j < ncols; j += width) {
            t.b = bp + pc * TN_QIP_ROW_BYTES + 4 * j;
            t.biasq = biasq + j;
            t.norm = norm + j;
            t.ncols = ncols - j < width ? ncols - j : width;
            size_t row = 0;
            for (size_t ti = 0; ti < tiles; ++ti) {
                size_t mr = base + (ti < extra);
                t.part = part + row * TN_QIP_PANEL + j;
                t.c = C + row * q->N + j;
                if (wide) {
                    t.a16 = a16 + row * t.lda + pc * 4;
                    wide_tiles[mr](&t);
                } else {
                    t.a = A + row * K + pc * 4;
                    vnni_tiles[mr](&t);
                }
                row += mr;
            }
        }
    }
}

void tn_qip_avx2_forward(const TnQip * q, size_t M, const uint8_t * A, const int8_t * B, uint8_t * buf, uint8_t * C)
{
    TnQipScratch s;
    tn_qip_scratch_layout(q, M, &s);
    int8_t * panel = (int8_t *)(buf + s.panel);
    int32_t * pbias = (int32_t *)(buf + s.pbias);
    int32_t * part = (int32_t *)(buf + s.part); /* used only when K is blocked */
    int16_t * a16 = q->algo == TN_QIP_AVX2 ? (int16_t *)(buf + s.a16) : NULL;
    const size_t mcb = tn_qip_row_block(q, M);
    for (size_t i0 = 0; i0 < M; i0 += mcb) {
        size_t mb = M - i0 < mcb ? M - i0 : mcb;
        if (a16)
            widen_rows(A + i0 * q->K, mb, q->K, q->kqp, a16);
        for (size_t p = 0; p < q->panels; ++p) {
            size_t j0 = p * TN_QIP_PANEL, ncols = q->N - j0 < TN_QIP_PANEL ? q->N - j0 : TN_QIP_PANEL;
            const int32_t * bq;
            const int8_t * bp = tn_qip_panel(q, p, B, panel, pbias, &bq);
            panel_tiles(q, mb, A + i0 * q->K, a16, bp, bq, q->norm + j0, ncols, part, C + i0 * q->N + j0);
        }
    }
}
