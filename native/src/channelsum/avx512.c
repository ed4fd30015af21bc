/* Channel sum at the AVX-512 level: channelsum_simd.h on the AVX-512 vector layer. */
#include "simd/avx512.h"

#include "channelsum_simd.h"
