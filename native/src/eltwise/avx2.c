/* Eltwise layer at the AVX2 level: eltwise_simd.h on the AVX2 vector layer. */
#include "simd/avx2.h"

#include "eltwise_simd.h"
