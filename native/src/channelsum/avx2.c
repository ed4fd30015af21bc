/* Channel sum at the AVX2 level: channelsum_simd.h on the AVX2 vector layer. */
#include "simd/avx2.h"

#include "channelsum_simd.h"
