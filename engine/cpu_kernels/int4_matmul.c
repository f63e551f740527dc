/* Products with INT4 group-quantized weights, in the checkpoint's bytes: y = x @ W^T.

   The weight is compressed-tensors' pack-quantized form (Kimi K2-Thinking,
   K2.5 and K2.6 routed experts): int32 words of eight 4-bit codes along K,
   the first in the low nibble, code = value + 8, and BF16 scales per group
   of `group` values (a multiple of 32 that divides K); w = (code - 8) *
   scale. Int4GroupMethod repacks it once at load, on CPU, into tiles of 16
   rows: each 16-row block of the words [N, K/8] and of the scales
   [N, K/group] is transposed in place, so word c (or group g) of a tile's
   16 rows is one 64-byte (32-byte) vector, lane n for row n. That is the
   same bytes in another order; N is a multiple of 16.

   Lanes are output rows, as in grid_matmul.c. The low nibbles of word c are
   the codes of k = 8c, 8c + 2, 8c + 4, 8c + 6 and the high nibbles those of
   the odd k; two treatments of the activations:

   - int8 (VNNI), as grid_matmul.c: each row of x is quantized per group of
     32 to int8 (dx = amax / 127) and stored per group as its 16 even values,
     then its 16 odd ones, so one vpdpbusd takes 4 activation bytes,
     broadcast, against 16 rows' codes. A group contributes
     scale * dx * (sum(code * xq) - 8 * sum(xq)); the integer sums are exact
     and -8 * sum(xq) seeds the integer accumulator.
   - float: w = (code - 8) * scale is exact in float32 (a 4-bit integer times
     a BF16 scale) and multiplies x in float32 (BF16 x widened once), so the
     result differs from torch's dequantize-then-matmul by float32 summation
     order only. */
#include "simd_arch.h"
#include <stdint.h>
#include <stdlib.h>

#include "simd.h"

#define TILE 16     /* output rows per tile: one 16-wide vector */
#define ROW_BLOCK 8 /* activation rows whose accumulators stay in registers */

/* One row of x: per group of 32, the values of even k then those of odd k. */
static const int32_t EVEN[16] = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};

/* int8: xq[K] in that order, seed[g] = -8 * sum(xq of group g), dx[g] = amax / 127. */
static void prepare_int8_row(const void *x, int bf16, int64_t K, int8_t *xq, int32_t *seed,
                             float *dx) {
    const int elem = bf16 ? 2 : 4;
    const __m512i even = _mm512_loadu_si512(EVEN), odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (int64_t g = 0; g < K / 32; g++) {
        const char *src = (const char *)x + 32 * g * elem;
        const __m512 a = row16_load(src, bf16), b = row16_load(src + 16 * elem, bf16);
        const float m = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
        const __m512 inv = _mm512_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
        const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv));
        const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
        const __m512i q_even = _mm512_permutex2var_epi32(qa, even, qb);
        const __m512i q_odd = _mm512_permutex2var_epi32(qa, odd, qb);
        _mm_storeu_si128((__m128i *)(xq + 32 * g), _mm512_cvtsepi32_epi8(q_even));
        _mm_storeu_si128((__m128i *)(xq + 32 * g + 16), _mm512_cvtsepi32_epi8(q_odd));
        seed[g] = -8 * _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
        dx[g] = m / 127.0f;
    }
}

/* int8: acc[r] (lane n: output row n of the tile) = `rows` activation rows times one
   tile; words [K/8][16], scales [K/group][16]. */
static inline __attribute__((always_inline)) void tile_int8(
    const int32_t *words, const uint16_t *scales, const int32_t *scale_of, const int8_t *xq,
    const int32_t *seed, const float *dx, int64_t K, const int rows, __m512 *acc) {
    const int64_t subgroups = K / 32;
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < subgroups; g++) {
        __m512i lo[4], hi[4];
        for (int w = 0; w < 4; w++) {
            const __m512i v = _mm512_loadu_si512(words + 16 * (4 * g + w));
            lo[w] = _mm512_and_si512(v, low);
            hi[w] = _mm512_and_si512(_mm512_srli_epi32(v, 4), low);
        }
        const __m512 d = bf16x16_load(scales + 16 * scale_of[g]);
        for (int r = 0; r < rows; r++) {
            const int32_t *xr = (const int32_t *)(xq + r * K + 32 * g);
            __m512i dot = _mm512_set1_epi32(seed[r * subgroups + g]);
            for (int w = 0; w < 4; w++) {
                dot = dpbusd_small(dot, lo[w], _mm512_set1_epi32(xr[w])); /* nibbles */
                dot = dpbusd_small(dot, hi[w], _mm512_set1_epi32(xr[4 + w]));
            }
            const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(dx[r * subgroups + g]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r]);
        }
    }
}

/* float: the same with float32 rows of x (row stride K) and exact float32 weights. */
static inline __attribute__((always_inline)) void tile_float(const int32_t *words,
                                                             const uint16_t *scales,
                                                             const int32_t *scale_of,
                                                             const float *x, int64_t K,
                                                             const int rows, __m512 *acc) {
    const __m512i low = _mm512_set1_epi32(0x0F);
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t c = 0; c < K / 8; c++) {
        const __m512i v = _mm512_loadu_si512(words + 16 * c);
        const __m512 s = bf16x16_load(scales + 16 * scale_of[c / 4]);
        const __m512 s8 = _mm512_mul_ps(s, _mm512_set1_ps(8.0f));
        for (int p = 0; p < 8; p++) {
            /* code * s - 8 * s rounds once, and (code - 8) * s is a float32: exact */
            const __m512i code = _mm512_and_si512(_mm512_srli_epi32(v, 4 * p), low);
            const __m512 w = _mm512_fmsub_ps(_mm512_cvtepi32_ps(code), s, s8);
            for (int r = 0; r < rows; r++)
                acc[r] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[r * K + 8 * c + p]), acc[r]);
        }
    }
}

/* Constant row counts, so the accumulators live in registers. */
#define ROWS_CASES(CALL)        \
    switch (rows) {             \
    case 1: CALL(1); break;     \
    case 2: CALL(2); break;     \
    case 3: CALL(3); break;     \
    case 4: CALL(4); break;     \
    case 5: CALL(5); break;     \
    case 6: CALL(6); break;     \
    case 7: CALL(7); break;     \
    default: CALL(8); break;    \
    }

static void block_int8(const int32_t *words, const uint16_t *scales, const int32_t *scale_of,
                       const int8_t *xq, const int32_t *seed, const float *dx, int64_t K,
                       int rows, __m512 *acc) {
#define CALL(n) tile_int8(words, scales, scale_of, xq, seed, dx, K, n, acc)
    ROWS_CASES(CALL)
#undef CALL
}

static void block_float(const int32_t *words, const uint16_t *scales, const int32_t *scale_of,
                        const float *x, int64_t K, int rows, __m512 *acc) {
#define CALL(n) tile_float(words, scales, scale_of, x, K, n, acc)
    ROWS_CASES(CALL)
#undef CALL
}

/* out[M, N] = x[M, K] @ W^T (+ bias), W tiled as described above. x and out are
   float32 or bfloat16; int8 chooses the activation treatment. Returns 0, -1 when
   scratch memory cannot be had, -2 for a group that is not a multiple of 32 or
   does not divide K, or N not a multiple of 16. */
int int4_matmul(const void *x, int x_bf16, int64_t M, int64_t K, const int32_t *packed,
                const uint16_t *scales, int64_t group, int64_t N, const float *bias, void *out,
                int out_bf16, int int8, int threads) {
    if (group <= 0 || group % 32 || K % group || N % TILE) return -2;
    const int64_t subgroups = K / 32, groups = K / group;
    /* int8: xq, then seed and dx per group of 32; float: BF16 rows widened. */
    const int scratch = int8 || x_bf16;
    const size_t row_bytes = int8 ? (size_t)K + 8 * (size_t)subgroups : 4 * (size_t)K;
    char *xp = scratch ? malloc(row_bytes * (size_t)M) : 0;
    int32_t *scale_of = malloc(sizeof(int32_t) * (size_t)subgroups);
    if ((scratch && !xp) || !scale_of) {
        free(xp), free(scale_of);
        return -1;
    }
    for (int64_t g = 0; g < subgroups; g++) scale_of[g] = (int32_t)(g / (group / 32));
    int8_t *xq = (int8_t *)xp;
    int32_t *seed = (int32_t *)(xp + (size_t)(M * K));
    float *dx = (float *)(seed + M * subgroups);
    const float *xf = x_bf16 ? (const float *)xp : (const float *)x;
    const int in_elem = x_bf16 ? 2 : 4, out_elem = out_bf16 ? 2 : 4;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < M; r++) {
            const void *row = (const char *)x + r * K * in_elem;
            if (int8)
                prepare_int8_row(row, x_bf16, K, xq + r * K, seed + r * subgroups, dx + r * subgroups);
            else if (x_bf16)
                for (int64_t k = 0; k < K; k += 16)
                    _mm512_storeu_ps((float *)xp + r * K + k, bf16x16_load((const uint16_t *)row + k));
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < N / TILE; t++) {
            const int32_t *words = packed + t * TILE * (K / 8);
            const uint16_t *tile_scales = scales + t * TILE * groups;
            const __m512 b = bias ? _mm512_loadu_ps(bias + t * TILE) : _mm512_setzero_ps();
            for (int64_t r0 = 0; r0 < M; r0 += ROW_BLOCK) {
                const int rows = (int)(M - r0 < ROW_BLOCK ? M - r0 : ROW_BLOCK);
                __m512 acc[ROW_BLOCK];
                if (int8)
                    block_int8(words, tile_scales, scale_of, xq + r0 * K, seed + r0 * subgroups,
                               dx + r0 * subgroups, K, rows, acc);
                else
                    block_float(words, tile_scales, scale_of, xf + r0 * K, K, rows, acc);
                for (int r = 0; r < rows; r++)
                    row16_store((char *)out + ((r0 + r) * N + t * TILE) * out_elem,
                                _mm512_add_ps(acc[r], b), out_bf16, 0xFFFF);
            }
        }
    }
    free(xp), free(scale_of);
    return 0;
}
