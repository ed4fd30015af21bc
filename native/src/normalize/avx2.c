/* The normalize family at the AVX2 level: normalize_simd.h on the AVX2 vector layer. */
#include "simd/avx2.h"
#include "normalize_simd.h"
