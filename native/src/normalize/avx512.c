/* The normalize family at the AVX-512 level: normalize_simd.h on the AVX-512 vector layer
 * (TN_NORM_AVX512: the AVX512_BF16 store of its BF16 layer norm). */
#include "simd/avx512.h"
#define TN_NORM_AVX512 1
#include "normalize_simd.h"
