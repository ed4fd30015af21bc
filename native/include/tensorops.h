/*
 * tensorops C API: the one header that declares every public function.
 *
 * Names and parameters mirror the Simd library's Synet functions (SimdSynetXxx ->
 * TnSynetXxx), so the seeds' pseudo-code maps one to one. The build script feeds this
 * file to cffi's cdef after dropping preprocessor lines, so keep declarations plain C.
 *
 * Kernels trust their arguments: the Python layer (tensorops_native) validates every
 * shape, length, enum and pointer before calling. Every kernel is reentrant and never
 * touches memory outside the tensors it is given.
 */
#ifndef TENSOROPS_H
#define TENSOROPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { TnTensorFormatNchw = 0, TnTensorFormatNhwc = 1 } TnTensorFormatType;

typedef enum {
    TnTensorData32f = 0,
    TnTensorData32i = 1,
    TnTensorData8i = 2,
    TnTensorData8u = 3,
    TnTensorData16b = 7,
    TnTensorData16f = 8
} TnTensorDataType;

typedef enum {
    TnSynetEltwiseOperationProduct = 0,
    TnSynetEltwiseOperationSum = 1,
    TnSynetEltwiseOperationMax = 2,
    TnSynetEltwiseOperationMin = 3
} TnSynetEltwiseOperationType;

typedef enum {
    TnSynetUnaryOperation32fAbs = 0,
    TnSynetUnaryOperation32fCeil = 1,
    TnSynetUnaryOperation32fCos = 2,
    TnSynetUnaryOperation32fErf = 3,
    TnSynetUnaryOperation32fExp = 4,
    TnSynetUnaryOperation32fFloor = 5,
    TnSynetUnaryOperation32fLog = 6,
    TnSynetUnaryOperation32fNeg = 7,
    TnSynetUnaryOperation32fNot = 8,
    TnSynetUnaryOperation32fRcp = 9,
    TnSynetUnaryOperation32fRound = 10,
    TnSynetUnaryOperation32fRsqrt = 11,
    TnSynetUnaryOperation32fSign = 12,
    TnSynetUnaryOperation32fSin = 13,
    TnSynetUnaryOperation32fSqrt = 14,
    TnSynetUnaryOperation32fTanh = 15,
    TnSynetUnaryOperation32fZero = 16
} TnSynetUnaryOperation32fType;

/* ISA levels, lowest to highest. */
typedef enum {
    TnIsaScalar = 0,
    TnIsaAvx2 = 1,   /* AVX2 + FMA + F16C */
    TnIsaAvx512 = 2  /* AVX-512 F, BW, VL, DQ */
} TnIsaLevel;

/* CPU features as bits of TnCpuFeatures(). */
typedef enum {
    TnCpuSse41 = 1,
    TnCpuAvx = 2,
    TnCpuAvx2 = 4,
    TnCpuFma = 8,
    TnCpuF16c = 16,
    TnCpuAvx512f = 32,
    TnCpuAvx512bw = 64,
    TnCpuAvx512vl = 128,
    TnCpuAvx512dq = 256,
    TnCpuAvx512vnni = 512,
    TnCpuAvx512bf16 = 1024,
    TnCpuAvx512fp16 = 2048,
    TnCpuAvxVnni = 4096,
    TnCpuOsAvx = 8192,
    TnCpuOsAvx512 = 16384
} TnCpuFeature;

/* ---- Dispatch ---------------------------------------------------------------------- */

/* Active ISA level (TnIsaLevel): the best the CPU and OS support, capped by the
 * environment variable TENSOROPS_ISA=scalar|avx2|avx512, resolved once at load. */
int TnActiveIsa(void);
/* Best level this CPU and OS could run, ignoring TENSOROPS_ISA. */
int TnSupportedIsa(void);
/* For tests only: re-resolve every kernel at `level` (TnIsaLevel), which the CPU must
 * support; TnActiveIsa() reports it afterwards. Returns 0, or -1 (nothing changed) for a
 * level outside scalar..TnSupportedIsa(). Call it only while no kernel runs in any thread.
 * A QuantizedInnerProduct context keeps the implementation chosen when it was made. */
int TnSetIsaForTesting(int level);
/* Detected CPU features, a bitwise OR of TnCpuFeature values. */
uint64_t TnCpuFeatures(void);
/* The dispatch table: kernel names and the ISA level each one resolved to. */
size_t TnKernelCount(void);
const char * TnKernelName(size_t index);
int TnKernelIsa(size_t index);

/* ---- Normalize layer (seed 000) ---------------------------------------------------- */

void TnSynetNormalizeLayerForward(const float * src, size_t batch, size_t channels, size_t spatial, const float * scale,
                                  const float * eps, int acrossSpatial, int format, float * buf, float * dst);

void TnSynetNormalizeLayerForwardV2(const float * src, size_t batch, size_t channels, size_t spatial,
                                    const float * scale, const float * shift, const float * eps, int format,
                                    float * buf, float * dst);

void TnSynetNormalizeLayerForwardV3(const float * src, size_t batch, size_t channels, size_t spatial,
                                    const float * scale, const float * shift, const float * eps, int format,
                                    float * buf, float * dst);

void TnSynetNormalizeLayerForwardV4(const float * src, size_t batch, size_t channels, size_t spatial,
                                    const float * scale, const float * shift, const float * eps, int format,
                                    float * buf, float * dst);

void TnSynetNormalizeLayerForward16bV2(const uint16_t * src, size_t batch, size_t channels, size_t spatial,
                                       const float * scale, const float * shift, const float * eps, int format,
                                       float * buf, uint16_t * dst);

/* ---- Other Synet functions (seed 003) ---------------------------------------------- */

void TnSynetChannelSum16b(const uint16_t * src, size_t channels, size_t spatial, int format, float * sum);

void TnSynetEltwiseLayerForward(float const * const * src, const float * weight, size_t count, size_t size, int type,
                                float * dst);

void TnSynetLrnLayerCrossChannels(const float * src, size_t half, size_t channels, size_t spatial, const float * k,
                                  float * dst, int format);

void TnSynetShuffleLayerForward(const float * src0, const float * src1, size_t channels0, size_t channels1,
                                size_t spatial, float * dst0, float * dst1, int format, int type);

void TnSynetSoftmax32f(const float * src, size_t outer, size_t count, size_t inner, float * dst);

void TnSynetSoftmax16b(const uint16_t * src, size_t outer, size_t count, size_t inner, uint16_t * dst);

void TnSynetTiledScale2D32f(const float * src, size_t channels, size_t height, size_t width, int format,
                            const float * ver, const float * hor, float * dst);

void TnSynetUnaryOperation32f(const float * src, size_t size, int type, float * dst);

/* ---- Batched forms (tensorops extension) -------------------------------------------- */
/*
 * The functions above whose Simd signature takes one batch item, over `batch` contiguous
 * items in one call: the result is exactly that of calling the per-item function on each
 * item in turn (same bits at every ISA level). sum is batch x channels. Shuffle items hold
 * channels0 and channels1 channels (inputs of type 0, outputs of type 1) and
 * (channels0 + channels1) / 2 on the other side.
 */
void TnSynetChannelSum16bBatch(const uint16_t * src, size_t batch, size_t channels, size_t spatial, int format,
                               float * sum);

void TnSynetLrnLayerCrossChannelsBatch(const float * src, size_t batch, size_t half, size_t channels, size_t spatial,
                                       const float * k, float * dst, int format);

void TnSynetShuffleLayerForwardBatch(const float * src0, const float * src1, size_t batch, size_t channels0,
                                     size_t channels1, size_t spatial, float * dst0, float * dst1, int format,
                                     int type);

void TnSynetTiledScale2D32fBatch(const float * src, size_t batch, size_t channels, size_t height, size_t width,
                                 int format, const float * ver, const float * hor, float * dst);

/* ---- Quantized inner product (seed 004) -------------------------------------------- */
/*
 * C = requantize(A x B) for A UINT8 (M x K), B INT8 (K x N, or N x K when transB) and
 * C UINT8 (M x N), through a context: Init once with the sizes and types, SetParams once
 * with the quantization parameters (and B when constB), then Forward many times, then
 * TnRelease. Semantics (docs/kernels.md): exact int32 accumulation on every ISA level,
 *   bias'[j] = (bias[j] or 0) - aZero * sum_k B[k][j],  norm[j] = (aScale * bScale[j]) / cScale
 *   C[i][j]  = clamp(rne(float(sum_k A[i][k] * B[k][j] + bias'[j]) * norm[j]) + cZero, 0, 255)
 * with norm in fp32 and rne() rounding to nearest, ties to even (the default MXCSR mode).
 *
 * Limits for exactness (the caller checks them; the Python layer does):
 *   1 <= K <= 65793, so the int32 accumulator cannot overflow;
 *   |bias[j]| <= 2147483647 - 32640 * K, so bias' and the biased sum fit in int32;
 *   norm[j] finite (scales finite, cScale nonzero).
 *
 * A context is immutable after SetParams: any number of threads may run Forward on it at
 * once, each with its own buf (or NULL).
 */

/* Algorithms of TnSynetQuantizedInnerProductInitAlgorithm. Auto picks the best one the
 * CPU supports under the TENSOROPS_ISA cap; the others request one explicitly. */
typedef enum {
    TnQipAlgorithmAuto = -1,
    TnQipAlgorithmScalar = 0,     /* reference loops */
    TnQipAlgorithmAvx2 = 1,       /* AVX2 widening multiply-adds (vpmovsxbw + vpmaddwd) */
    TnQipAlgorithmAvx2Vnni = 2,   /* AVX-VNNI vpdpbusd, ymm */
    TnQipAlgorithmAvx512Vnni = 3, /* AVX-512 VNNI vpdpbusd, zmm */
    TnQipAlgorithmAmx = 4         /* AMX-INT8 tdpbusd tiles; AVX-512 VNNI for small M */
} TnQipAlgorithm;

/* A context, or NULL for unsupported arguments (types other than UINT8 x INT8 -> UINT8,
 * M, N or K zero, K > 65793) or a failed allocation. M is the number of rows Forward
 * runs; ForwardRows accepts any other. Release it with TnRelease. */
void * TnSynetQuantizedInnerProductInit(size_t M, size_t N, size_t K, TnTensorDataType typeA, TnTensorDataType typeB,
                                        TnTensorDataType typeC, int transB, int constB, int bias);

/* The same, with an explicit algorithm (TnQipAlgorithm); NULL when the CPU, the OS or the
 * TENSOROPS_ISA cap does not allow it. Init is this function with TnQipAlgorithmAuto. */
void * TnSynetQuantizedInnerProductInitAlgorithm(size_t M, size_t N, size_t K, TnTensorDataType typeA,
                                                 TnTensorDataType typeB, TnTensorDataType typeC, int transB, int constB,
                                                 int bias, int algorithm);

/* Bytes held by the context: its own part, plus its state block (packed B, bias', scales)
 * unless that block is the caller's (PlaceState, Attach). */
size_t TnSynetQuantizedInnerProductInternalBufferSize(const void * context);

/* Bytes of buf a Forward of the initialized M needs (0: buf is not used). */
size_t TnSynetQuantizedInnerProductExternalBufferSize(const void * context);

/* Bytes of buf a ForwardRows of M rows needs. It grows with M only up to an internal row
 * block, so the size for a large M serves every smaller one. */
size_t TnSynetQuantizedInnerProductExternalBufferSizeRows(const void * context, size_t M);

/* The implementation selected: ISA, algorithm and blocking. */
const char * TnSynetQuantizedInnerProductInfo(const void * context);

/* Scales and zero points (aScale, aZero, cScale, cZero: one value each; bScale: N values),
 * bias (N values, or NULL for none) and, when constB, B (packed here once; may be NULL
 * otherwise). Call once, before any Forward. */
void TnSynetQuantizedInnerProductSetParams(void * context, const float * aScale, const uint8_t * aZero,
                                           const int8_t * b, const float * bScale, const int32_t * bias,
                                           const float * cScale, const uint8_t * cZero);

/* N, K and transB of the context (0 for NULL). */
void TnSynetQuantizedInnerProductShape(const void * context, size_t * N, size_t * K, int * transB);

/*
 * State in the caller's memory (constB contexts). The state block holds everything
 * SetParams computes (scales, zero points, bias', packed B) behind a small header that
 * describes it (magic, layout version, N, K, transB, bias, algorithm, a ready flag stored
 * last). One context fills it in memory the caller provides, for example a shared mapping
 * of a file; other contexts, in the same process or in any process mapping the same memory,
 * attach to it without packing B again and compute bit-identical results.
 */

/* Bytes of the context's state block. */
size_t TnSynetQuantizedInnerProductStateSize(const void * context);

/* Moves the context's state block, before SetParams, to `state`: 64-byte aligned, `size` ==
 * StateSize bytes, kept alive by the caller until the context is released (TnRelease does
 * not free it). SetParams then fills it. Returns 0, or -1 (nothing changed) for a NULL or
 * misaligned state, a wrong size, a context without constB, already filled or attached. */
int TnSynetQuantizedInnerProductPlaceState(void * context, void * state, size_t size);

/* What TnSynetQuantizedInnerProductCheckState finds in a state block. */
typedef enum {
    TnQipStateOk = 0,
    TnQipStateMisaligned = 1, /* NULL, or not 64-byte aligned */
    TnQipStateBadSize = 2,    /* size is not the block's size (truncated, or more) */
    TnQipStateBadMagic = 3,   /* not a state block */
    TnQipStateBadVersion = 4, /* made by a build with another layout */
    TnQipStateNotReady = 5,   /* SetParams has not filled it (yet) */
    TnQipStateCorrupt = 6,    /* header fields out of range or inconsistent */
    TnQipStateUnavailable = 7 /* its algorithm is not allowed here: CPU, OS or the TENSOROPS_ISA cap */
} TnQipStateStatus;

/* Whether `size` bytes at `state` are a filled state block this process can attach to
 * (TnQipStateStatus). Reads only. */
int TnSynetQuantizedInnerProductCheckState(const void * state, size_t size);

/* A new context for Forward of M rows over a filled state block (CheckState == Ok, else
 * NULL; NULL also for M == 0 or a failed allocation). It reads the block and never writes
 * it (SetParams does nothing); the block must outlive the context and not change.
 * TnRelease frees the context only. */
void * TnSynetQuantizedInnerProductAttach(const void * state, size_t size, size_t M);

/* C (M x N) from A (M x K) for the initialized M. B: the INT8 matrix when constB is false
 * (ignored, may be NULL, otherwise). buf: ExternalBufferSize bytes, or NULL to let the
 * call allocate its own (if that allocation fails, C is filled with zeros). */
void TnSynetQuantizedInnerProductForward(void * context, const uint8_t * A, const uint8_t * B, uint8_t * buf,
                                         uint8_t * C);

/* Forward for any M >= 1 rows (tensorops extension); buf holds ExternalBufferSizeRows(M)
 * bytes or is NULL. */
void TnSynetQuantizedInnerProductForwardRows(void * context, size_t M, const uint8_t * A, const uint8_t * B,
                                             uint8_t * buf, uint8_t * C);

/* Releases a context made by any TnXxxInit function (NULL is ignored). */
void TnRelease(void * context);

/* ---- Generic normalization (TensorRT / DirectML) ----------------------------------- */

/* Fused activations, applied after scale and bias (DirectML DML_ACTIVATION_*, in the order of
 * the Activation enum of proto/tensorops/v1). Parameters in TnNormalization.activationParams, in DirectML's order. */
typedef enum {
    TnActivationIdentity = 0,
    TnActivationLinear = 1,              /* alpha * y + beta */
    TnActivationRelu = 2,
    TnActivationLeakyRelu = 3,           /* alpha */
    TnActivationParametricSoftplus = 4,  /* alpha, beta: alpha * ln(1 + exp(beta * y)) */
    TnActivationElu = 5,                 /* alpha */
    TnActivationCelu = 6,                /* alpha */
    TnActivationScaledElu = 7,           /* alpha, gamma */
    TnActivationSigmoid = 8,
    TnActivationHardSigmoid = 9,         /* alpha, beta */
    TnActivationTanh = 10,
    TnActivationScaledTanh = 11,         /* alpha, beta: alpha * tanh(beta * y) */
    TnActivationSoftplus = 12,           /* steepness: ln(1 + exp(s * y)) / s */
    TnActivationSoftsign = 13,
    TnActivationThresholdedRelu = 14,    /* alpha */
    TnActivationShrink = 15,             /* bias, threshold */
    TnActivationGelu = 16
} TnActivationType;

/* Where the scale (or bias) value of an element is: data[(o % period) * outerStride +
 * j * stride + s * step], with o the row (rows kernel) or outer index (columns kernel), j the
 * segment (rows) or the reduced index (columns), s the position in the contiguous run
 * (segment, or inner index). step is 0 (one value for the whole run) or 1. data NULL: the
 * parameter is absent (scale 1, bias 0). */
typedef struct {
    const float * data;
    size_t period;
    size_t outerStride;
    size_t stride;
    size_t step;
} TnNormalizationParam;

typedef struct {
    int type;                 /* TnTensorData32f, 16f or 16b: both src and dst */
    float eps;
    int normalizeVariance;    /* 0: y = (x - mean) * scale + bias */
    int activation;           /* TnActivationType */
    float activationParams[2];
    TnNormalizationParam scale;
    TnNormalizationParam bias;
} TnNormalization;

/* Rows: src is (outer, segments, segmentSize), each row of segments * segmentSize values is
 * normalized over itself; the parameters may change from segment to segment (group norm's
 * channels). Columns: src is (outer, count, inner), normalized over count for each (outer,
 * inner). y = act((x - mean) / sqrt(var + eps) * scale + bias), mean and population variance
 * in fp32 in a fixed order, so every ISA level gives bit-identical results; a NaN result is
 * the quiet NaN 0x7FC00000 (BF16 0x7FC0, FP16 0x7E00). */
void TnNormalizationRows(const void * src, size_t outer, size_t segments, size_t segmentSize,
                         const TnNormalization * norm, void * dst);

void TnNormalizationColumns(const void * src, size_t outer, size_t count, size_t inner, const TnNormalization * norm,
                            void * dst);

/* ---- Guarded shared mappings (native/src/guard.c) ---------------------------------- */

/* Maps `size` bytes of the file `fd` from its start (shared, read and write) and guards the
 * mapping: a SIGBUS inside it (the file shrank under it) replaces the whole mapping with
 * zero pages and marks it broken instead of killing the process; SIGBUS elsewhere goes to
 * the handler there was before. Returns the mapping's slot (>= 0) and its address in
 * *address, or -errno (-ENOSPC: every slot is taken; -ENOTSUP: the handler cannot be
 * installed, nothing is mapped). */
int TnGuardedMap(int fd, size_t size, void ** address);

/* 1 once a fault inside the mapping of `slot` was caught: it then holds zeros, not the
 * file, and whatever was computed from it or written into it since is void. */
int TnGuardedBroken(int slot);

/* Unmaps the mapping of `slot` and frees the slot. Nothing may use the mapping anymore. */
void TnGuardedUnmap(int slot);

#ifdef __cplusplus
}
#endif

#endif
