/* SynetUnaryOperation32f at the AVX-512 level: the shared source on the vector layer. */
#include "simd/avx512.h"
#include "unary_simd.h"
