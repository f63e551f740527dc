/* The kernels' one way to the vector intrinsics: AVX-512 itself, or in the AVX2 build
   (-DRESIDENT_AVX2, library.py) the same operations made of AVX2 (avx512_on_avx2.h). */
#ifndef RESIDENT_SIMD_ARCH_H
#define RESIDENT_SIMD_ARCH_H
#include <immintrin.h>
#ifdef RESIDENT_AVX2
#include "avx512_on_avx2.h"
/* vpdpbusd where every unsigned byte of a is below 128: vpmaddubsw's pair sums cannot
   saturate then (2 * 127 * 128 < 32768), so two instructions give the exact sums. */
static inline __attribute__((always_inline)) __m256i e2_dpbusd_small256(__m256i acc, __m256i a,
                                                                       __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b),
                                                   _mm256_set1_epi16(1)));
}
#define dpbusd_small(acc, a, b)                                                           \
    ((r512i){e2_dpbusd_small256((acc).lo, (a).lo, (b).lo),                                \
             e2_dpbusd_small256((acc).hi, (a).hi, (b).hi)})
#else
#define dpbusd_small(acc, a, b) _mm512_dpbusd_epi32((acc), (a), (b))
#endif
#endif
