/* AVX-512 helpers shared by the CPU kernels. */
#ifndef RESIDENT_SIMD_H
#define RESIDENT_SIMD_H
#include "simd_arch.h"
#include <stdint.h>

/* 16 bfloat16 values -> float32. */
static inline __m512 bf16x16_load(const void *src) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)src));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* float32 -> bfloat16, round to nearest even (torch's cast, NaN aside). */
static inline __m256i bf16x16_from(__m512 v) {
    __m512i bits = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    bits = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16));
}

static inline __m512 bf16x16_round(__m512 v) {
    __m512i wide = _mm512_cvtepu16_epi32(bf16x16_from(v));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* exp(x), Cephes' expf polynomial (relative error ~1e-7), inputs clamped to +-87. */
static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(87.0f)), _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

/* SwiGLU of 16 (gate, up) pairs: bf16(silu(g)) * u, silu rounded to bfloat16 as torch
   rounds it to the activations' dtype; the caller rounds the product. */
static inline __m512 swiglu16(__m512 g, __m512 u) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 act = bf16x16_round(_mm512_div_ps(g, _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
    return _mm512_mul_ps(act, u);
}

/* 16 bfloat16 values under a mask (masked-off lanes read as zero) -> float32. */
static inline __m512 bf16x16_load_masked(const void *src, __mmask16 m) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* 16 values of float32 or bfloat16 -> float32, and back under a mask. */
static inline __m512 row16_load(const void *src, int bf16) {
    return bf16 ? bf16x16_load(src) : _mm512_loadu_ps(src);
}

static inline void row16_store(void *dst, __m512 v, int bf16, __mmask16 mask) {
    if (bf16)
        _mm256_mask_storeu_epi16(dst, mask, bf16x16_from(v));
    else
        _mm512_mask_storeu_ps(dst, mask, v);
}

static inline __mmask16 tail_mask(int64_t remaining) {
    return remaining >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << remaining) - 1);
}

/* lane i of the result = the sum of the 16 lanes of a[i] (a transposing tree:
   15 adds and 30 shuffles for 16 sums, where 16 separate reductions take ~100). */
static inline __m512 reduce16(const __m512 *a) {
    __m512 b[8], c[4], e[2];
    for (int k = 0; k < 8; k++)
        b[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * k], a[2 * k + 1], 0xEE));
    for (int k = 0; k < 4; k++)
        c[k] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * k], b[2 * k + 1], 0xDD));
    for (int k = 0; k < 2; k++)
        e[k] = _mm512_add_ps(_mm512_unpacklo_ps(c[2 * k], c[2 * k + 1]),
                             _mm512_unpackhi_ps(c[2 * k], c[2 * k + 1]));
    const __m512 g = _mm512_add_ps(_mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_ps(e[0], e[1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* lane 4j + t of g holds source 4t + j */
    const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(order, g);
}
/* x[0, n) = bf16(x + y), bfloat16 vectors: a residual add rounded once. */
static inline void bf16_add_into(uint16_t *x, const uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask(n - i);
        const __m512 a = bf16x16_load_masked(x + i, m);
        const __m512 b = bf16x16_load_masked(y + i, m);
        _mm256_mask_storeu_epi16(x + i, m, bf16x16_from(_mm512_add_ps(a, b)));
    }
}

/* One stage of the transform inside a 16-lane vector: lanes j and j^h become
   (a + b, a - b), as t + sign * x with t the partner lane. */
static inline __m512 butterfly_in_vector(__m512 x, int h) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512 partner = _mm512_permutexvar_ps(_mm512_xor_si512(lane, _mm512_set1_epi32(h)), x);
    const __mmask16 high = _mm512_test_epi32_mask(lane, _mm512_set1_epi32(h));
    return _mm512_mask_sub_ps(_mm512_add_ps(partner, x), high, partner, x);
}

/* The Walsh-Hadamard transform (Sylvester order, unnormalised) of the 16 * n values
   in v[0..n), n a power of two: the stages inside each vector, then across them. */
static inline void hadamard_vectors(__m512 *v, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        for (int h = 1; h < 16; h *= 2) v[i] = butterfly_in_vector(v[i], h);
    for (int64_t h = 1; h < n; h *= 2)
        for (int64_t i = 0; i < n; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                const __m512 a = v[j], b = v[j + h];
                v[j] = _mm512_add_ps(a, b);
                v[j + h] = _mm512_sub_ps(a, b);
            }
}
#endif
