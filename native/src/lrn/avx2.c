/* LRN at the AVX2 level: lrn_simd.h on the vector layer. */
#include "simd/avx2.h"
#include "simd/vmath.h"

#include "lrn_simd.h"
