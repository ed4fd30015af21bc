/* LRN at the AVX-512 level: lrn_simd.h on the vector layer. */
#include "simd/avx512.h"
#include "simd/vmath.h"

#include "lrn_simd.h"
