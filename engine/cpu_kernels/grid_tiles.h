/* The int8-activation grid product's building blocks (layout: grid_matmul.c), shared by
   the kernels that multiply grid weights: the plain product and the MoE layer's experts
   (moe_experts.c), so both round and sum alike. */
#ifndef RESIDENT_GRID_TILES_H
#define RESIDENT_GRID_TILES_H
#include <immintrin.h>
#include <stdint.h>

#include "simd.h"

#define GROUP 32
#define TILE 16
#define ROW_BLOCK 16
/* Up to this many activation rows are quantized before the OpenMP team starts. */
#define SERIAL_QUANTIZE_ROWS 4

/* One group of 32 values (float32 or bfloat16 at src): xq int8, *dx = amax / 127,
   *cx = dx * sum(xq). */
static inline void quantize_group(const void *src, int bf16, int8_t *xq, float *dx, float *cx) {
    const int elem = bf16 ? 2 : 4;
    __m512 a = row16_load(src, bf16);
    __m512 b = row16_load((const char *)src + TILE * elem, bf16);
    __m512 amax = _mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b));
    float m = _mm512_reduce_max_ps(amax);
    float inv = m > 0.0f ? 127.0f / m : 0.0f;
    __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(inv)));
    __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(inv)));
    _mm_storeu_si128((__m128i *)xq, _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(xq + TILE), _mm512_cvtsepi32_epi8(qb));
    int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
    *dx = m / 127.0f;
    *cx = *dx * (float)sum;
}

/* One row: xq[k] int8, dx[g] and cx[g] per group. */
static inline void quantize_row(const void *x, int bf16, int64_t K, int8_t *xq, float *dx,
                                float *cx) {
    const int elem = bf16 ? 2 : 4;
    for (int64_t g = 0; g < K / GROUP; g++)
        quantize_group((const char *)x + g * GROUP * elem, bf16, xq + g * GROUP, dx + g, cx + g);
}

/* One group's codes of a tile as 8 vectors of unsigned bytes (vector j, lane n: the
   codes of k = 4j..4j+3 of row n). */
static inline void group_vectors(const uint8_t *src, int bits, __m512i w[8]) {
    if (bits == 4) {
        const __m512i low = _mm512_set1_epi8(0x0F);
        for (int j = 0; j < 4; j++) {
            __m512i v = _mm512_loadu_si512(src + 64 * j);
            w[2 * j] = _mm512_and_si512(v, low);
            w[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
    } else {
        for (int j = 0; j < 8; j++) w[j] = _mm512_loadu_si512(src + 64 * j);
    }
}

/* sum over k of one group of the tile's codes times one row's int8 activations. */
static inline __m512 group_dot(const __m512i w[8], const int32_t *xr) {
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (int j = 0; j < 8; j += 2) {
        s0 = _mm512_dpbusd_epi32(s0, w[j], _mm512_set1_epi32(xr[j]));
        s1 = _mm512_dpbusd_epi32(s1, w[j + 1], _mm512_set1_epi32(xr[j + 1]));
    }
    return _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
}

/* acc[16] = one row of x times one tile: a decode step's case. The same operations in
   the same order as tile_rows (so a row's result does not depend on how many rows run),
   with the accumulator kept in a register instead of going through memory every group. */
static inline void tile_one_row(const uint8_t *tile, const uint16_t *scales, int bits,
                                int64_t groups, const int8_t *xq, const float *dx, const float *cx,
                                float *acc) {
    const int64_t group_bytes = bits == 4 ? 256 : 512;
    __m512 a = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m512i w[8];
        group_vectors(tile + g * group_bytes, bits, w);
        const __m256i *halves = (const __m256i *)(scales + g * 2 * TILE);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(halves));
        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(halves + 1));
        const __m512 prod = group_dot(w, (const int32_t *)(xq + g * GROUP));
        a = _mm512_fmadd_ps(prod, _mm512_mul_ps(d, _mm512_set1_ps(dx[g])), a);
        a = _mm512_fmadd_ps(m, _mm512_set1_ps(cx[g]), a);
    }
    _mm512_storeu_ps(acc, a);
}

/* acc[r][16] = rows r0..r0+rows of x times one tile of 16 weight rows. */
static inline void tile_rows(const uint8_t *tile, const uint16_t *scales, int bits, int64_t groups,
                             const int8_t *xq, const float *dx, const float *cx, int64_t K,
                             int64_t rows, float *acc) {
    if (rows == 1) {
        tile_one_row(tile, scales, bits, groups, xq, dx, cx, acc);
        return;
    }
    const int64_t group_bytes = bits == 4 ? 256 : 512;
    for (int64_t r = 0; r < rows; r++) _mm512_storeu_ps(acc + r * TILE, _mm512_setzero_ps());
    for (int64_t g = 0; g < groups; g++) {
        __m512i w[8];
        group_vectors(tile + g * group_bytes, bits, w);
        const __m256i *halves = (const __m256i *)(scales + g * 2 * TILE);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(halves));
        const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(halves + 1));
        for (int64_t r = 0; r < rows; r++) {
            const __m512 prod = group_dot(w, (const int32_t *)(xq + r * K + g * GROUP));
            __m512 a = _mm512_loadu_ps(acc + r * TILE);
            a = _mm512_fmadd_ps(prod, _mm512_mul_ps(d, _mm512_set1_ps(dx[r * groups + g])), a);
            a = _mm512_fmadd_ps(m, _mm512_set1_ps(cx[r * groups + g]), a);
            _mm512_storeu_ps(acc + r * TILE, a);
        }
    }
}

/* Bytes of one tile of 16 weight rows over K = groups * 32. */
static inline int64_t tile_bytes(int bits, int64_t groups) {
    return groups * (bits == 4 ? 256 : 512);
}
#endif
