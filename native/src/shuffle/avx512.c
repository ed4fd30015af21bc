/* Shuffle layer at the AVX-512 level: shuffle_simd.h on the AVX-512 vector layer. */
#include "simd/avx512.h"

#include "shuffle_simd.h"
