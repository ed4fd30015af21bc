/* The normalize family at the AVX-512 level: normalize_simd.h on the AVX-512 vector layer. */
#include "simd/avx512.h"
#include "normalize_simd.h"
