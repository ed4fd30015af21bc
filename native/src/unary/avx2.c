/* SynetUnaryOperation32f at the AVX2 level: the shared source on the vector layer. */
#include "simd/avx2.h"
#include "unary_simd.h"
