/* Eltwise layer at the AVX-512 level: eltwise_simd.h on the AVX-512 vector layer. */
#include "simd/avx512.h"

#include "eltwise_simd.h"
