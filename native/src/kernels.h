/*
 * The one list of dispatched kernels. It drives the declarations of every ISA variant,
 * the dispatch table, the public TnXxx entry points and the kernel report of info().
 * Adding a kernel is one line here plus its tn_<isa>_<Name> definitions.
 *
 * Each variant is named tn_<isa>_<Name> (tn_scalar_, tn_avx2_, tn_avx512_) and has the
 * exact signature of the public TnName in tensorops.h.
 */
#ifndef TN_KERNELS_H
#define TN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "tensorops.h"  /* parameter types (TnNormalization) */

/* K(Name, (parameters), (arguments)) */
#define TN_KERNEL_LIST(K) \
    K(SynetNormalizeLayerForward, \
      (const float * src, size_t batch, size_t channels, size_t spatial, const float * scale, const float * eps, \
       int acrossSpatial, int format, float * buf, float * dst), \
      (src, batch, channels, spatial, scale, eps, acrossSpatial, format, buf, dst)) \
    K(SynetNormalizeLayerForwardV2, \
      (const float * src, size_t batch, size_t channels, size_t spatial, const float * scale, const float * shift, \
       const float * eps, int format, float * buf, float * dst), \
      (src, batch, channels, spatial, scale, shift, eps, format, buf, dst)) \
    K(SynetNormalizeLayerForwardV3, \
      (const float * src, size_t batch, size_t channels, size_t spatial, const float * scale, const float * shift, \
       const float * eps, int format, float * buf, float * dst), \
      (src, batch, channels, spatial, scale, shift, eps, format, buf, dst)) \
    K(SynetNormalizeLayerForwardV4, \
      (const float * src, size_t batch, size_t channels, size_t spatial, const float * scale, const float * shift, \
       const float * eps, int format, float * buf, float * dst), \
      (src, batch, channels, spatial, scale, shift, eps, format, buf, dst)) \
    K(SynetNormalizeLayerForward16bV2, \
      (const uint16_t * src, size_t batch, size_t channels, size_t spatial, const float * scale, const float * shift, \
       const float * eps, int format, float * buf, uint16_t * dst), \
      (src, batch, channels, spatial, scale, shift, eps, format, buf, dst)) \
    K(SynetChannelSum16b, (const uint16_t * src, size_t channels, size_t spatial, int format, float * sum), \
      (src, channels, spatial, format, sum)) \
    K(SynetEltwiseLayerForward, \
      (float const * const * src, const float * weight, size_t count, size_t size, int type, float * dst), \
      (src, weight, count, size, type, dst)) \
    K(SynetLrnLayerCrossChannels, \
      (const float * src, size_t half, size_t channels, size_t spatial, const float * k, float * dst, int format), \
      (src, half, channels, spatial, k, dst, format)) \
    K(SynetShuffleLayerForward, \
      (const float * src0, const float * src1, size_t channels0, size_t channels1, size_t spatial, float * dst0, \
       float * dst1, int format, int type), \
      (src0, src1, channels0, channels1, spatial, dst0, dst1, format, type)) \
    K(SynetSoftmax32f, (const float * src, size_t outer, size_t count, size_t inner, float * dst), \
      (src, outer, count, inner, dst)) \
    K(SynetSoftmax16b, (const uint16_t * src, size_t outer, size_t count, size_t inner, uint16_t * dst), \
      (src, outer, count, inner, dst)) \
    K(SynetTiledScale2D32f, \
      (const float * src, size_t channels, size_t height, size_t width, int format, const float * ver, \
       const float * hor, float * dst), \
      (src, channels, height, width, format, ver, hor, dst)) \
    K(SynetUnaryOperation32f, (const float * src, size_t size, int type, float * dst), (src, size, type, dst)) \
    K(NormalizationRows, \
      (const void * src, size_t outer, size_t segments, size_t segmentSize, const TnNormalization * norm, void * dst), \
      (src, outer, segments, segmentSize, norm, dst)) \
    K(NormalizationColumns, \
      (const void * src, size_t outer, size_t count, size_t inner, const TnNormalization * norm, void * dst), \
      (src, outer, count, inner, norm, dst))

/* Declarations of every variant. Variants are weak so the dispatcher can fall back to the
 * next lower level ("best enabled ISA, else the next, else scalar") and report honestly
 * which one it chose. */
#define TN_DECLARE_VARIANTS(Name, params, args) \
    __attribute__((weak)) void tn_scalar_##Name params; \
    __attribute__((weak)) void tn_avx2_##Name params; \
    __attribute__((weak)) void tn_avx512_##Name params;
TN_KERNEL_LIST(TN_DECLARE_VARIANTS)
#undef TN_DECLARE_VARIANTS

/* Active ISA level for code that dispatches inside a context (quantized inner product). */
int TnActiveIsa(void);

#endif
