/* TiledScale2D at the AVX-512 level: tiledscale_simd.h on the AVX-512 vector layer. */
#include "simd/avx512.h"

#include "tiledscale_simd.h"
