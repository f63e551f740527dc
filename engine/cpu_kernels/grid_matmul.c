/* Products with grid weights, int8 activations: y = x @ W^T on AVX-512 VNNI.

   W is stored as unsigned codes per group of 32 values along K:
   w = d * u + m, with u in 0..15 (packed two per byte) or 0..255.
   Each row of x is quantized per group of 32 to int8 (x ~ dx * xq), so a
   group's contribution is  d * dx * sum(u * xq) + m * dx * sum(xq):
   the first sum is exact integer arithmetic (vpdpbusd), the rest is float.

   Weight layout, per tile of 16 output rows and per group, 8 vectors of 64
   bytes; vector j holds, in lane n, the codes of k = 4j..4j+3 of row n.
   With 4-bit codes vectors 2j and 2j+1 share one 64-byte vector (low and
   high nibbles). Scales: per tile and group, 16 d then 16 m, as IEEE half
   floats: a Q4_1/Q8_0 file stores them so (the packer keeps a weight only
   where they are exact in half), and float32 scales would be a fifth of a
   4-bit weight's bytes, read on every decode step. */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "grid_tiles.h"

/* out[M, N] = x[M, K] @ W^T (+ bias). N is the real row count of W; the packed
   weight holds ceil(N / 16) tiles. x and out are float32 or bfloat16; the work
   is split over `threads` OpenMP threads. Returns
   0, or -1 when scratch memory cannot be had. */
int grid_matmul(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *weight,
                const uint16_t *scales, int bits, int64_t N, const float *bias, void *out,
                int out_bf16, int threads) {
    const int64_t groups = K / GROUP, tiles = (N + TILE - 1) / TILE;
    int8_t *xq = malloc((size_t)(M * K));
    float *dx = malloc(sizeof(float) * (size_t)(M * groups));
    float *cx = malloc(sizeof(float) * (size_t)(M * groups));
    if (!xq || !dx || !cx) {
        free(xq), free(dx), free(cx);
        return -1;
    }
    const int64_t w_tile = tile_bytes(bits, groups);
    const int in_elem = x_bf16 ? 2 : 4, out_elem = out_bf16 ? 2 : 4;
    /* A decode step's few rows are quantized before the team starts: splitting
       them would cost a barrier (the other thread waits) for under a microsecond. */
    const int split_rows = M > SERIAL_QUANTIZE_ROWS;
    if (!split_rows)
        for (int64_t r = 0; r < M; r++)
            quantize_row((const char *)x + r * K * in_elem, x_bf16, K, xq + r * K, dx + r * groups,
                         cx + r * groups);
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        if (split_rows) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < M; r++)
                quantize_row((const char *)x + r * K * in_elem, x_bf16, K, xq + r * K,
                             dx + r * groups, cx + r * groups);
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            float acc[ROW_BLOCK * TILE];
            const int64_t n0 = t * TILE;
            const __mmask16 mask = N - n0 >= TILE ? 0xFFFF : (__mmask16)((1u << (N - n0)) - 1);
            const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
            for (int64_t r0 = 0; r0 < M; r0 += ROW_BLOCK) {
                const int64_t rows = M - r0 < ROW_BLOCK ? M - r0 : ROW_BLOCK;
                tile_rows(weight + t * w_tile, scales + t * groups * 2 * TILE, bits, groups,
                          xq + r0 * K, dx + r0 * groups, cx + r0 * groups, K, rows, acc);
                for (int64_t r = 0; r < rows; r++)
                    row16_store((char *)out + ((r0 + r) * N + n0) * out_elem,
                            _mm512_add_ps(_mm512_loadu_ps(acc + r * TILE), b), out_bf16, mask);
            }
        }
    }
    free(xq), free(dx), free(cx);
    return 0;
}

/* The codes of one row n of a tile, one group: 32 values in k order, as int32. */
static inline void group_codes(const uint8_t *src, int bits, int64_t n, __m512i *first,
                               __m512i *second) {
    if (bits == 8) {
        /* vector j, lane n: bytes n*4 .. n*4+3 are k = 4j .. 4j+3 */
        const int32_t *v = (const int32_t *)src;
        __m128i lo = _mm_set_epi32(v[48 + n], v[32 + n], v[16 + n], v[n]);
        __m128i hi = _mm_set_epi32(v[112 + n], v[96 + n], v[80 + n], v[64 + n]);
        *first = _mm512_cvtepu8_epi32(lo);
        *second = _mm512_cvtepu8_epi32(hi);
        return;
    }
    /* vector i holds j = 2i in its low nibbles and j = 2i + 1 in its high ones */
    const int32_t *v = (const int32_t *)src;
    __m512i bytes = _mm512_cvtepu8_epi32(_mm_set_epi32(v[48 + n], v[32 + n], v[16 + n], v[n]));
    __m512i low = _mm512_and_si512(bytes, _mm512_set1_epi32(0x0F));
    __m512i high = _mm512_srli_epi32(bytes, 4);
    const __m512i a = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i b = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30,
                                        31);
    *first = _mm512_permutex2var_epi32(low, a, high);
    *second = _mm512_permutex2var_epi32(low, b, high);
}

/* W[N, K] as bfloat16 (d * u + m in float32, rounded to nearest even): for products
   that run faster on BF16 matrix units (AMX) than on int8 dot products. */
int grid_dequantize(const uint8_t *weight, const uint16_t *scales, int bits, int64_t K, int64_t N,
                    uint16_t *out, int threads) {
    const int64_t groups = K / GROUP, tiles = (N + TILE - 1) / TILE;
    const int64_t group_bytes = bits == 4 ? 256 : 512;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t rows = N - t * TILE < TILE ? N - t * TILE : TILE;
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *src = weight + (t * groups + g) * group_bytes;
            const uint16_t *d = scales + (t * groups + g) * 2 * TILE, *m = d + TILE;
            for (int64_t n = 0; n < rows; n++) {
                __m512i first, second;
                group_codes(src, bits, n, &first, &second);
                const __m512 dn = _mm512_set1_ps(_cvtsh_ss(d[n]));
                const __m512 mn = _mm512_set1_ps(_cvtsh_ss(m[n]));
                uint16_t *dst = out + (t * TILE + n) * K + g * GROUP;
                /* mul then add, not fused: the float32 value the checkpoint holds */
                __m512 v0 = _mm512_add_ps(_mm512_mul_ps(dn, _mm512_cvtepi32_ps(first)), mn);
                __m512 v1 = _mm512_add_ps(_mm512_mul_ps(dn, _mm512_cvtepi32_ps(second)), mn);
                _mm256_storeu_si256((__m256i *)dst, bf16x16_from(v0));
                _mm256_storeu_si256((__m256i *)(dst + TILE), bf16x16_from(v1));
            }
        }
    }
    return 0;
}
