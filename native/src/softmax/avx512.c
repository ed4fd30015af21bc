/* Softmax at the AVX-512 level: softmax_simd.h on the vector layer. */
#include "simd/avx512.h"

#include "softmax_simd.h"
