/* Shuffle layer at the AVX2 level: shuffle_simd.h on the AVX2 vector layer. */
#include "simd/avx2.h"

#include "shuffle_simd.h"
