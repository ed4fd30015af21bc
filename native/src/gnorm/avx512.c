/* Generic normalization at the AVX-512 level: gnorm_simd.h on the 16-lane zmm layer. */
#include "simd/avx512.h"
#include "gnorm_simd.h"
