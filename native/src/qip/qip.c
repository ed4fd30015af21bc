/*
 * Quantized inner product (seed 004): the context. Init picks the algorithm once (from
 * TnActiveIsa() and the CPU feature bits), SetParams precomputes norm and bias' and packs
 * a constant B into the context's state block, Forward runs the selected driver. The state
 * block is the context's own allocation, memory the caller placed (PlaceState), or another
 * context's filled block it attached to (Attach). See qip.h for the math, the packed layout
 * and the state block, tensorops.h for the contract.
 */
#include <cpuid.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "tensorops.h"
#include "kernels.h"
#include "qip.h"

#define TN_QIP_ALIGN 64
#define TN_QIP_DIM_MAX ((size_t)1 << 40) /* bound of M and N */

static size_t align_up(size_t n) { return (n + TN_QIP_ALIGN - 1) & ~(size_t)(TN_QIP_ALIGN - 1); }
static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* ---- AMX availability -------------------------------------------------------------- */

#define TN_ARCH_REQ_XCOMP_PERM 0x1023
#define TN_XFEATURE_XTILEDATA 18

static int g_amx_usable;
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;

static void detect_amx(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return;
    if (!(d & (1u << 24)) || !(d & (1u << 25))) /* AMX-TILE, AMX-INT8 */
        return;
    __cpuid(1, a, b, c, d);
    if (!(c & (1u << 27))) /* OSXSAVE */
        return;
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if (((lo >> 17) & 3u) != 3u) /* XTILECFG and XTILEDATA enabled by the OS */
        return;
    if (!__get_cpuid_count(0x1d, 0, &a, &b, &c, &d) || a < 1) /* palette 1 */
        return;
#if defined(__linux__) && defined(SYS_arch_prctl)
    /* Linux hands out the tile data state on request, per process. Without it, the first
     * tile instruction would fault. */
    g_amx_usable = syscall(SYS_arch_prctl, TN_ARCH_REQ_XCOMP_PERM, TN_XFEATURE_XTILEDATA) == 0;
#endif
}

/* Detected once per process (the permission request is a system call), then only read:
 * like the dispatch table. */
int tn_qip_amx_usable(void)
{
    pthread_once(&g_amx_once, detect_amx);
    return g_amx_usable;
}

/* ---- Scratch ----------------------------------------------------------------------- */

void tn_qip_scratch_layout(const TnQip * q, size_t M, TnQipScratch * s)
{
    size_t mc = min_size(M, q->mc), at = 0;
    memset(s, 0, sizeof(*s));
    if (q->algo == TN_QIP_SCALAR) {
        /* constB = false with B stored K x N: one column gathered contiguously. */
        if (!q->constB && !q->transB) {
            s->panel = at;
            at += align_up(q->K);
        }
        s->total = at;
        return;
    }
    if (!q->constB) {
        s->panel = at;
        at += align_up(q->kqp * TN_QIP_ROW_BYTES);
        s->pbias = at;
        at += align_up(TN_QIP_PANEL * sizeof(int32_t));
    }
    const int amx = q->algo == TN_QIP_AMX && M >= q->amx_min_m;
    /* The vector tiles block K only when several row tiles share a panel slice. */
    const size_t tile_rows = q->algo == TN_QIP_AVX2 || q->algo == TN_QIP_AVX2_VNNI ? 6 : 12;
    if ((q->kq > q->kc && M > tile_rows) || amx) {
        /* int32 sums of a row block x panel (the AMX tiles are stored there too, rows
         * rounded up to whole tiles). */
        s->part = at;
        at += align_up((amx ? (mc + 15) & ~(size_t)15 : mc) * TN_QIP_PANEL * sizeof(int32_t));
    }
    if (q->algo == TN_QIP_AVX2) {
        s->a16 = at;
        at += align_up(mc * q->kqp * 4 * sizeof(int16_t));
    }
    if (amx) {
        s->apack = at;
        at += align_up(((mc + 15) & ~(size_t)15) * q->kqp * 4);
    }
    s->total = at;
}

/* ---- Context ----------------------------------------------------------------------- */

static void qip_release(void * context)
{
    TnQip * q = (TnQip *)context;
    free(q->mem);
    free(q);
}

void TnRelease(void * context)
{
    if (context != NULL) {
        void (*release)(void *) = *(void (**)(void *))context;
        release(context);
    }
}

static int algorithm_allowed(int algo)
{
    int isa = TnActiveIsa();
    uint64_t f = TnCpuFeatures();
    switch (algo) {
    case TN_QIP_SCALAR: return 1;
    case TN_QIP_AVX2: return isa >= TnIsaAvx2;
    case TN_QIP_AVX2_VNNI: return isa >= TnIsaAvx2 && (f & TnCpuAvxVnni);
    case TN_QIP_AVX512_VNNI: return isa >= TnIsaAvx512 && (f & TnCpuAvx512vnni);
    case TN_QIP_AMX: return isa >= TnIsaAvx512 && (f & TnCpuAvx512vnni) && tn_qip_amx_usable();
    default: return 0;
    }
}

static int best_algorithm(void)
{
    static const int order[] = {TN_QIP_AMX, TN_QIP_AVX512_VNNI, TN_QIP_AVX2_VNNI, TN_QIP_AVX2};
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); ++i)
        if (algorithm_allowed(order[i]))
            return order[i];
    return TN_QIP_SCALAR;
}

static void describe(TnQip * q)
{
    const char * b = q->constB ? "B packed once" : "B packed per panel each Forward";
    switch (q->algo) {
    case TN_QIP_SCALAR:
        snprintf(q->info, sizeof(q->info), "scalar: reference loops, int32 accumulation%s",
                 q->constB ? ", B stored transposed" : "");
        break;
    case TN_QIP_AVX2:
    case TN_QIP_AVX2_VNNI:
    case TN_QIP_AVX512_VNNI: {
        static const char * const tiles[] = {
            [TN_QIP_AVX2] = "avx2: vpmovsxbw+vpmaddwd widening (exact), 6x8",
            [TN_QIP_AVX2_VNNI] = "avx2-vnni: AVX-VNNI vpdpbusd ymm, 6x16",
            [TN_QIP_AVX512_VNNI] = "avx512-vnni: vpdpbusd zmm, 12x32",
        };
        snprintf(q->info, sizeof(q->info), "%s register tiles, M block %zu, K block %zu, %s", tiles[q->algo], q->mc,
                 4 * q->kc, b);
        break;
    }
    case TN_QIP_AMX:
        snprintf(q->info, sizeof(q->info),
                 "avx512-amx: AMX-INT8 tdpbusd, 32x32 tile blocks, K block %zu, for M >= %zu; avx512-vnni vpdpbusd "
                 "12x32 register tiles for smaller M and a last M %% 16 < %zu rows; M block %zu, %s",
                 4 * q->amx_kc, q->amx_min_m, q->amx_min_m, q->mc, b);
        break;
    }
}

/* The sizes and blocking of a context for these arguments (everything but its state). */
static void set_layout(TnQip * q, size_t M, size_t N, size_t K, int transB, int constB, int hasBias, int algo)
{
    q->release = qip_release;
    q->M = M;
    q->N = N;
    q->K = K;
    q->transB = transB != 0;
    q->constB = constB != 0;
    q->hasBias = hasBias != 0;
    q->algo = algo;
    q->kq = (K + 3) / 4;
    q->kqp = algo == TN_QIP_AMX ? (q->kq + 15) & ~(size_t)15 : q->kq;
    q->panels = (N + TN_QIP_PANEL - 1) / TN_QIP_PANEL;
    q->npad = q->panels * TN_QIP_PANEL;
    q->amx_min_m = 8;
    switch (algo) {
    case TN_QIP_AVX2:
        q->kc = 256;
        /* The int16 copy of an A block (mc x 8 kq bytes) stays within 256 KB. */
        q->mc = min_size(240, (256 * 1024) / (8 * q->kq) / 6 * 6);
        if (q->mc < 6)
            q->mc = 6;
        break;
    case TN_QIP_AVX2_VNNI:
        q->kc = 256;
        q->mc = 240;
        break;
    default:
        q->kc = 512;
        q->mc = 240;
        break;
    }
    if (algo == TN_QIP_AMX) {
        q->mc = 256; /* a multiple of 32, the rows of a tile block */
        /* The tile blocks run K whole up to 4096 (measured faster than K blocks of 1024,
         * whose int32 sums make a round trip through memory); beyond it, blocks of 4096 k
         * keep a panel's slice (128 KB) in L2 for the next row blocks. */
        q->amx_kc = q->kqp <= 1024 ? q->kqp : 1024;
    }
}

static size_t state_vector_bytes(const TnQip * q) { return align_up(q->npad * sizeof(int32_t)); }

/* Bytes of the state block (qip.h): header, norm, bias, bias', packed B. */
static size_t state_size(const TnQip * q)
{
    size_t packed = 0;
    if (q->constB)
        packed = q->algo == TN_QIP_SCALAR ? q->N * q->K : q->panels * q->kqp * TN_QIP_ROW_BYTES;
    return align_up(sizeof(TnQipState)) + 3 * state_vector_bytes(q) + align_up(packed);
}

/* Points the context's arrays into the state block at `base`. */
static void bind_state(TnQip * q, uint8_t * base)
{
    const size_t vec = state_vector_bytes(q), at = align_up(sizeof(TnQipState));
    q->state = (TnQipState *)base;
    q->norm = (float *)(base + at);
    q->bias = (int32_t *)(base + at + vec);
    q->biasq = (int32_t *)(base + at + 2 * vec);
    q->packed = q->constB ? (int8_t *)(base + at + 3 * vec) : NULL;
}

/* A new state block at `base`: the header describing the context, not ready, and the
 * vectors zero (norm and bias' stay zero beyond N, where the drivers read whole panels). */
static void init_state(TnQip * q, uint8_t * base)
{
    memset(base, 0, align_up(sizeof(TnQipState)) + 3 * state_vector_bytes(q));
    bind_state(q, base);
    TnQipState * s = q->state;
    s->magic = TN_QIP_STATE_MAGIC;
    s->version = TN_QIP_STATE_VERSION;
    s->size = state_size(q);
    s->N = q->N;
    s->K = q->K;
    s->transB = (uint32_t)q->transB;
    s->hasBias = (uint32_t)q->hasBias;
    s->algo = (uint32_t)q->algo;
    s->kqp = (uint32_t)q->kqp;
}

void * TnSynetQuantizedInnerProductInitAlgorithm(size_t M, size_t N, size_t K, TnTensorDataType typeA,
                                                 TnTensorDataType typeB, TnTensorDataType typeC, int transB, int constB,
                                                 int bias, int algorithm)
{
    if (typeA != TnTensorData8u || typeB != TnTensorData8i || typeC != TnTensorData8u)
        return NULL;
    if (M == 0 || N == 0 || K == 0 || K > TN_QIP_K_MAX || N > TN_QIP_DIM_MAX || M > TN_QIP_DIM_MAX)
        return NULL;
    int algo = algorithm == TnQipAlgorithmAuto ? best_algorithm() : algorithm;
    if (!algorithm_allowed(algo))
        return NULL;

    TnQip * q = (TnQip *)calloc(1, sizeof(TnQip));
    if (q == NULL)
        return NULL;
    set_layout(q, M, N, K, transB, constB, bias, algo);
    const size_t total = state_size(q);
    q->mem = aligned_alloc(TN_QIP_ALIGN, total);
    if (q->mem == NULL) {
        free(q);
        return NULL;
    }
    init_state(q, (uint8_t *)q->mem);
    q->internal = sizeof(TnQip) + total;
    describe(q);
    return q;
}

void * TnSynetQuantizedInnerProductInit(size_t M, size_t N, size_t K, TnTensorDataType typeA, TnTensorDataType typeB,
                                        TnTensorDataType typeC, int transB, int constB, int bias)
{
    return TnSynetQuantizedInnerProductInitAlgorithm(M, N, K, typeA, typeB, typeC, transB, constB, bias,
                                                     TnQipAlgorithmAuto);
}

size_t TnSynetQuantizedInnerProductInternalBufferSize(const void * context)
{
    return context ? ((const TnQip *)context)->internal : 0;
}

size_t TnSynetQuantizedInnerProductExternalBufferSizeRows(const void * context, size_t M)
{
    if (context == NULL || M == 0)
        return 0;
    TnQipScratch s;
    tn_qip_scratch_layout((const TnQip *)context, M, &s);
    return s.total;
}

size_t TnSynetQuantizedInnerProductExternalBufferSize(const void * context)
{
    return context ? TnSynetQuantizedInnerProductExternalBufferSizeRows(context, ((const TnQip *)context)->M) : 0;
}

const char * TnSynetQuantizedInnerProductInfo(const void * context)
{
    return context ? ((const TnQip *)context)->info : "";
}

void TnSynetQuantizedInnerProductShape(const void * context, size_t * N, size_t * K, int * transB)
{
    const TnQip * q = (const TnQip *)context;
    *N = q ? q->N : 0;
    *K = q ? q->K : 0;
    *transB = q ? q->transB : 0;
}

size_t TnSynetQuantizedInnerProductStateSize(const void * context)
{
    return context ? state_size((const TnQip *)context) : 0;
}

static int is_aligned(const void * p) { return ((uintptr_t)p & (TN_QIP_ALIGN - 1)) == 0; }

int TnSynetQuantizedInnerProductPlaceState(void * context, void * state, size_t size)
{
    TnQip * q = (TnQip *)context;
    if (q == NULL || state == NULL || !is_aligned(state) || !q->constB || q->attached ||
        __atomic_load_n(&q->state->ready, __ATOMIC_ACQUIRE) || size != state_size(q))
        return -1;
    free(q->mem);
    q->mem = NULL;
    init_state(q, (uint8_t *)state);
    q->internal = sizeof(TnQip);
    return 0;
}

int TnSynetQuantizedInnerProductCheckState(const void * state, size_t size)
{
    if (state == NULL || !is_aligned(state))
        return TnQipStateMisaligned;
    const TnQipState * s = (const TnQipState *)state;
    if (size < sizeof(TnQipState))
        return TnQipStateBadSize;
    if (s->magic != TN_QIP_STATE_MAGIC)
        return TnQipStateBadMagic;
    if (s->version != TN_QIP_STATE_VERSION)
        return TnQipStateBadVersion;
    /* Acquire: what SetParams wrote before `ready` is visible from here on. */
    if (__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE) != 1)
        return TnQipStateNotReady;
    if (s->size != size)
        return TnQipStateBadSize;
    if (s->N == 0 || s->N > TN_QIP_DIM_MAX || s->K == 0 || s->K > TN_QIP_K_MAX || s->transB > 1 || s->hasBias > 1 ||
        s->algo > TN_QIP_AMX)
        return TnQipStateCorrupt;
    /* The layout fields must be the ones this build derives from N, K and the algorithm. */
    TnQip layout;
    memset(&layout, 0, sizeof(layout));
    set_layout(&layout, 1, (size_t)s->N, (size_t)s->K, (int)s->transB, 1, (int)s->hasBias, (int)s->algo);
    if (layout.kqp != s->kqp || state_size(&layout) != size)
        return TnQipStateCorrupt;
    if (!algorithm_allowed((int)s->algo))
        return TnQipStateUnavailable;
    return TnQipStateOk;
}

void * TnSynetQuantizedInnerProductAttach(const void * state, size_t size, size_t M)
{
    if (M == 0 || M > TN_QIP_DIM_MAX || TnSynetQuantizedInnerProductCheckState(state, size) != TnQipStateOk)
        return NULL;
    const TnQipState * s = (const TnQipState *)state;
    TnQip * q = (TnQip *)calloc(1, sizeof(TnQip));
    if (q == NULL)
        return NULL;
    set_layout(q, M, (size_t)s->N, (size_t)s->K, (int)s->transB, 1, (int)s->hasBias, (int)s->algo);
    /* Never written through: SetParams returns at once on an attached context. */
    bind_state(q, (uint8_t *)(uintptr_t)state);
    q->attached = 1;
    q->internal = sizeof(TnQip);
    describe(q);
    return q;
}

void TnSynetQuantizedInnerProductSetParams(void * context, const float * aScale, const uint8_t * aZero,
                                           const int8_t * b, const float * bScale, const int32_t * bias,
                                           const float * cScale, const uint8_t * cZero)
{
    TnQip * q = (TnQip *)context;
    if (q == NULL || q->attached)
        return;
    TnQipState * s = q->state;
    s->aScale = *aScale;
    s->aZero = *aZero;
    s->cScale = *cScale;
    s->cZero = *cZero;
    for (size_t j = 0; j < q->N; ++j) {
        float ab = s->aScale * bScale[j];
        q->norm[j] = ab / s->cScale;
        q->bias[j] = (q->hasBias && bias != NULL) ? bias[j] : 0;
    }
    if (q->constB && b == NULL)
        return; /* not ready: Forward gives zeros */
    if (q->constB) {
        int32_t colsum[TN_QIP_PANEL];
        if (q->algo == TN_QIP_SCALAR) {
            /* Transposed (N x K) so each column is contiguous. */
            for (size_t j = 0; j < q->N; ++j) {
                int8_t * dst = q->packed + j * q->K;
                int32_t sum = 0;
                for (size_t k = 0; k < q->K; ++k) {
                    dst[k] = q->transB ? b[j * q->K + k] : b[k * q->N + j];
                    sum += dst[k];
                }
                q->biasq[j] = (int32_t)((int64_t)q->bias[j] - (int64_t)s->aZero * sum);
            }
        } else {
            for (size_t p = 0; p < q->panels; ++p) {
                size_t j0 = p * TN_QIP_PANEL;
                tn_qip_pack_panel(b, q->N, q->K, q->transB, j0, q->kqp, q->packed + p * q->kqp * TN_QIP_ROW_BYTES,
                                  colsum);
                tn_qip_panel_bias(q, j0, colsum, q->biasq + j0);
            }
        }
    }
    /* Last: a context attaching to the block (CheckState) reads it only after this. */
    __atomic_store_n(&s->ready, 1, __ATOMIC_RELEASE);
}

void TnSynetQuantizedInnerProductForwardRows(void * context, size_t M, const uint8_t * A, const uint8_t * B,
                                             uint8_t * buf, uint8_t * C)
{
    const TnQip * q = (const TnQip *)context;
    if (q == NULL || M == 0)
        return;
    if (!__atomic_load_n(&q->state->ready, __ATOMIC_ACQUIRE) || (!q->constB && B == NULL)) {
        memset(C, 0, M * q->N);
        return;
    }
    void * own = NULL;
    if (buf == NULL) {
        size_t size = TnSynetQuantizedInnerProductExternalBufferSizeRows(q, M);
        if (size) {
            own = aligned_alloc(TN_QIP_ALIGN, size);
            if (own == NULL) {
                memset(C, 0, M * q->N);
                return;
            }
            buf = (uint8_t *)own;
        }
    }
    const int8_t * b = (const int8_t *)B;
    switch (q->algo) {
    case TN_QIP_SCALAR: tn_qip_scalar_forward(q, M, A, b, buf, C); break;
    case TN_QIP_AVX2:
    case TN_QIP_AVX2_VNNI: tn_qip_avx2_forward(q, M, A, b, buf, C); break;
    default: tn_qip_avx512_forward(q, M, A, b, buf, C); break;
    }
    free(own);
}

void TnSynetQuantizedInnerProductForward(void * context, const uint8_t * A, const uint8_t * B, uint8_t * buf,
                                         uint8_t * C)
{
    if (context != NULL)
        TnSynetQuantizedInnerProductForwardRows(context, ((const TnQip *)context)->M, A, B, buf, C);
}
