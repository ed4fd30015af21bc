/* Generic normalization at the AVX2 level: gnorm_simd.h on the layer's two ymm halves. */
#include "simd/avx2.h"
#include "gnorm_simd.h"
