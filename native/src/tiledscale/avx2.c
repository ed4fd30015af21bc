/* TiledScale2D at the AVX2 level: tiledscale_simd.h on the AVX2 vector layer. */
#include "simd/avx2.h"

#include "tiledscale_simd.h"
