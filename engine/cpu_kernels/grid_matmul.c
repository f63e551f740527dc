/* Products with grid weights, int8 activations: y = x @ W^T on AVX-512 VNNI.

   W is stored as unsigned codes with float scales per group of 32 values along K (the
   formats: grid_formats.h), e.g. w = d * u + m for llama.cpp's Q4_1 or d * sc * u -
   dmin * mn for its Q4_K. Each row of x is quantized per group of 32 to int8 (x ~ dx *
   xq), so a group's contribution is  step * dx * sum(u * xq) + offset * dx * sum(xq):
   the first sum is exact integer arithmetic (vpdpbusd), the rest is float. The scales
   are kept as the file stores them (half, and bytes for the K-quants' 6-bit factors):
   float32 ones would be a fifth of a 4-bit weight's bytes, read on every decode step. */
#include "simd_arch.h"
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "grid_tiles.h"

/* out[M, N] = x[M, K] @ W^T (+ bias), W in format `fmt`. N is the real row count of W;
   the packed weight holds ceil(N / 16) tiles. x and out are float32 or bfloat16; the work
   is split over `threads` OpenMP threads. Returns 0, -1 when scratch memory cannot be
   had, -2 for a format unknown or one K is not whole blocks of. */
int grid_matmul(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *weight,
                const uint8_t *scales, int fmt, int64_t N, const float *bias, void *out,
                int out_bf16, int threads) {
    if (!grid_format_fits(fmt, K)) return -2;
    const int64_t groups = K / GROUP, tiles = (N + TILE - 1) / TILE;
    Int8Rows xq = {malloc((size_t)(M * K)), malloc(sizeof(float) * (size_t)(M * groups)),
                   malloc(sizeof(float) * (size_t)(M * groups)),
                   malloc(sizeof(int32_t) * (size_t)(M * groups * 2)), K};
    if (!xq.q || !xq.d || !xq.c || !xq.h) {
        free(xq.q), free(xq.d), free(xq.c), free(xq.h);
        return -1;
    }
    const int64_t w_tile = tile_bytes(fmt, groups), s_tile = tile_scale_bytes(fmt, groups);
    const int in_elem = x_bf16 ? 2 : 4, out_elem = out_bf16 ? 2 : 4;
    const int64_t row_block = grid_row_block(K);
    /* A decode step's few rows are quantized before the team starts: splitting
       them would cost a barrier (the other thread waits) for under a microsecond. */
    const int split_rows = M > SERIAL_QUANTIZE_ROWS;
    if (!split_rows)
        for (int64_t r = 0; r < M; r++)
            quantize_row((const char *)x + r * K * in_elem, x_bf16, xq, r);
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        if (split_rows) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < M; r++)
                quantize_row((const char *)x + r * K * in_elem, x_bf16, xq, r);
        }
        /* Each thread its own run of tiles, walked for one block of rows after another:
           the block's int8 rows stay in cache while the weights stream past (tiles
           outer streamed every row through each tile: 3-9% slower on AVX2). The
           quantizing loop's barrier (or none, the rows quantized before) comes first. */
        const int64_t team = omp_get_num_threads(), me = omp_get_thread_num();
        const int64_t t_lo = tiles * me / team, t_hi = tiles * (me + 1) / team;
        float acc[MAX_ROW_BLOCK * TILE];
        for (int64_t r0 = 0; r0 < M; r0 += row_block) {
            const int64_t rows = M - r0 < row_block ? M - r0 : row_block;
            for (int64_t t = t_lo; t < t_hi; t++) {
                const int64_t n0 = t * TILE;
                const __mmask16 mask =
                    N - n0 >= TILE ? 0xFFFF : (__mmask16)((1u << (N - n0)) - 1);
                const __m512 b =
                    bias ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
                tile_rows(weight + t * w_tile, scales + t * s_tile, fmt, groups,
                          rows_from(xq, r0), rows, acc);
                for (int64_t r = 0; r < rows; r++)
                    row16_store((char *)out + ((r0 + r) * N + n0) * out_elem,
                                _mm512_add_ps(_mm512_loadu_ps(acc + r * TILE), b), out_bf16, mask);
            }
        }
    }
    free(xq.q), free(xq.d), free(xq.c), free(xq.h);
    return 0;
}

/* The codes of one row n of a tile, one group: 32 values in k order, as int32. */
static inline void group_codes(const uint8_t *src, int fmt, int64_t n, __m512i *first,
                               __m512i *second) {
    /* vector j, lane n: bytes n*4 .. n*4+3 are k = 4j .. 4j+3 */
    const int32_t *v = (const int32_t *)src;
    if (fmt == GRID_U8) {
        __m128i lo = _mm_set_epi32(v[48 + n], v[32 + n], v[16 + n], v[n]);
        __m128i hi = _mm_set_epi32(v[112 + n], v[96 + n], v[80 + n], v[64 + n]);
        *first = _mm512_cvtepu8_epi32(lo);
        *second = _mm512_cvtepu8_epi32(hi);
        return;
    }
    /* vector i holds j = 2i in its low nibbles and j = 2i + 1 in its high ones */
    __m512i bytes = _mm512_cvtepu8_epi32(_mm_set_epi32(v[48 + n], v[32 + n], v[16 + n], v[n]));
    __m512i low = _mm512_and_si512(bytes, _mm512_set1_epi32(0x0F));
    __m512i high = _mm512_srli_epi32(bytes, 4);
    const __m512i a = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i b = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30,
                                        31);
    *first = _mm512_permutex2var_epi32(low, a, high);
    *second = _mm512_permutex2var_epi32(low, b, high);
    if (fmt != GRID_Q5_K && fmt != GRID_Q6_K) return;
    /* the plane's bits of value k = 4j + i: byte i of lane n, bit (j * planes) % 8 of plane
       vector (j * planes) / 8 */
    const int planes = fmt == GRID_Q5_K ? 1 : 2;
    const int32_t *p = (const int32_t *)(src + 256);
    for (int half = 0; half < 2; half++) {
        int32_t high_bits[TILE];
        for (int k = 0; k < TILE; k++) {
            const int j = (half * TILE + k) / 4, at = j * planes;
            const int32_t word = p[(at / 8) * TILE + n];
            high_bits[k] = ((word >> (8 * (k % 4) + at % 8)) & ((1 << planes) - 1)) << 4;
        }
        __m512i *codes = half ? second : first;
        *codes = _mm512_or_si512(*codes, _mm512_loadu_si512(high_bits));
    }
}

/* Row n's step, offset and (Q6_K) second step for group g, from a tile's scales. */
static inline void row_scales(const uint8_t *tile_scales, int fmt, int64_t g, int64_t n,
                              float *step, float *offset, float *step2) {
    const int64_t per = block_groups(fmt), j = g % per;
    const uint8_t *block = tile_scales + (g / per) * block_scale_bytes(fmt);
    const uint16_t *halves = (const uint16_t *)block;
    if (!is_kquant(fmt)) {
        *step = _cvtsh_ss(halves[n]), *offset = _cvtsh_ss(halves[TILE + n]), *step2 = 0.0f;
        return;
    }
    const uint8_t *sub = block + group_scales_at(fmt) + j * 32;
    const float d = _cvtsh_ss(halves[n]);
    if (fmt == GRID_Q6_K) {
        *step = d * (float)(int8_t)sub[n], *step2 = d * (float)(int8_t)sub[TILE + n];
        *offset = 0.0f;
    } else {
        *step = d * (float)sub[n], *step2 = 0.0f;
        *offset = -(_cvtsh_ss(halves[TILE + n]) * (float)sub[TILE + n]);
    }
}

/* Row n of tile t, group g, as the 32 float32 values gguf's dequantizer computes
   (products exact, then one rounding: step * u + offset, or step * (u - 32) for Q6_K). */
static inline void group_values(const uint8_t *weight, const uint8_t *scales, int fmt,
                                int64_t groups, int64_t t, int64_t g, int64_t n, __m512 *v0,
                                __m512 *v1) {
    const uint8_t *src = weight + t * tile_bytes(fmt, groups) + g * group_bytes(fmt);
    __m512i first, second;
    group_codes(src, fmt, n, &first, &second);
    float step, offset, step2;
    row_scales(scales + t * tile_scale_bytes(fmt, groups), fmt, g, n, &step, &offset, &step2);
    if (fmt == GRID_Q6_K) {
        const __m512i bias = _mm512_set1_epi32(32);
        *v0 = _mm512_mul_ps(_mm512_set1_ps(step), _mm512_cvtepi32_ps(_mm512_sub_epi32(first, bias)));
        *v1 = _mm512_mul_ps(_mm512_set1_ps(step2),
                            _mm512_cvtepi32_ps(_mm512_sub_epi32(second, bias)));
    } else {
        /* mul then add, not fused: the float32 value the checkpoint holds */
        const __m512 d = _mm512_set1_ps(step), m = _mm512_set1_ps(offset);
        *v0 = _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(first)), m);
        *v1 = _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(second)), m);
    }
}

/* W[N, K] as bfloat16, each value group_values' float32 rounded to nearest even: for
   products that run faster on BF16 matrix units (AMX) than on int8 dot products.
   Returns 0, or -2 as grid_matmul does. */
int grid_dequantize(const uint8_t *weight, const uint8_t *scales, int fmt, int64_t K, int64_t N,
                    uint16_t *out, int threads) {
    if (!grid_format_fits(fmt, K)) return -2;
    const int64_t groups = K / GROUP, tiles = (N + TILE - 1) / TILE;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t rows = N - t * TILE < TILE ? N - t * TILE : TILE;
        for (int64_t g = 0; g < groups; g++) {
            for (int64_t n = 0; n < rows; n++) {
                __m512 v0, v1;
                group_values(weight, scales, fmt, groups, t, g, n, &v0, &v1);
                uint16_t *dst = out + (t * TILE + n) * K + g * GROUP;
                _mm256_storeu_si256((__m256i *)dst, bf16x16_from(v0));
                _mm256_storeu_si256((__m256i *)(dst + TILE), bf16x16_from(v1));
            }
        }
    }
    return 0;
}

/* Rows ids[0..count) of W[N, K] into out[count, K], float32 or bfloat16 (rounded to
   nearest even): an embedding table kept in its file's blocks, looked up a few rows a
   step. Returns 0, -2 as grid_matmul does, -3 for an id outside 0..N-1. */
int grid_gather_rows(const uint8_t *weight, const uint8_t *scales, int fmt, int64_t K, int64_t N,
                     const int64_t *ids, int64_t count, void *out, int out_bf16, int threads) {
    if (!grid_format_fits(fmt, K)) return -2;
    for (int64_t i = 0; i < count; i++)
        if (ids[i] < 0 || ids[i] >= N) return -3;
    const int64_t groups = K / GROUP;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) if (count > 8)
    for (int64_t i = 0; i < count; i++) {
        const int64_t t = ids[i] / TILE, n = ids[i] % TILE;
        for (int64_t g = 0; g < groups; g++) {
            __m512 v0, v1;
            group_values(weight, scales, fmt, groups, t, g, n, &v0, &v1);
            if (out_bf16) {
                uint16_t *dst = (uint16_t *)out + i * K + g * GROUP;
                _mm256_storeu_si256((__m256i *)dst, bf16x16_from(v0));
                _mm256_storeu_si256((__m256i *)(dst + TILE), bf16x16_from(v1));
            } else {
                float *dst = (float *)out + i * K + g * GROUP;
                _mm512_storeu_ps(dst, v0);
                _mm512_storeu_ps(dst + TILE, v1);
            }
        }
    }
    return 0;
}
