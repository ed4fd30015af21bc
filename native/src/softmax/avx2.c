/* Softmax at the AVX2 level: softmax_simd.h on the vector layer. */
#include "simd/avx2.h"

#include "softmax_simd.h"
