/* Products with FP8 (e4m3) block-scaled weights as checkpoints store them: y = x @ W^T.

   The weight is DeepSeek-V3 / Kimi K2's form, read in place: e4m3 bytes
   [N, K] and a grid of float32 scales [ceil(N / scale_rows), blocks], one
   row of column-block scales per `scale_rows` weight rows: row n reads
   scale row n / scale_rows. Fp8BlockMethod passes the checkpoint's grid
   (scale_rows = the block's rows, 128) or, for a layer whose rows do not
   start on the checkpoint's blocks, one scale row per weight row
   (scale_rows = 1). Column 0 sits at `col_offset` inside its block of
   `block_cols`, so a tensor-parallel slice that starts inside a block keeps
   its own scales.

   Each row is dequantized 32 values at a time, in registers, by the bit
   trick of engine/kv/quant.py `fp8_bits_to_half`: sign-extend the byte to
   16 bits, shift left by 7 and clear bit 14, which gives the float16 of
   value * 2**-8 exactly (subnormals included); vcvtph2ps widens it and the
   product with scale * 256 is the very float32 weight torch's
   dequantization computes. Two weight rows share each load of x and up to
   eight rows of x each dequantized weight, with float32 accumulators in
   registers, so the result differs from dequantize-then-matmul only by
   float32 summation order. BF16 x is widened to float32 once per call.
   (Eight rows use every register; with more, the weights are dequantized
   once per eight, and Fp8BlockMethod prefers fp8_block_dequantize, below,
   with torch's GEMM.) */
#include "simd_arch.h"
#include <stdint.h>
#include <stdlib.h>

#include "simd.h"

#define TILE 16   /* output rows per task: one masked 16-wide store per activation row */
#define WROWS 2   /* weight rows per pass over K */
#define XROWS 8   /* activation rows per pass over K */

/* Where a chunk of 32 columns finds its scales: block `first`, and from lane
   `split` on (split < 32) the next block, where a block ends inside the chunk. */
typedef struct {
    int32_t first, split;
} Chunk;

/* 32 (or the n < 32 left) weights of one row, times their blocks' scales, as float32. */
static inline void weights32(const uint8_t *src, int64_t n, const float *row_scales, Chunk c,
                             __m512 *w0, __m512 *w1) {
    const __m256i bytes = n >= 32 ? _mm256_loadu_si256((const __m256i *)src)
                                  : _mm256_maskz_loadu_epi8((__mmask32)((1u << n) - 1), src);
    __m512i half = _mm512_slli_epi16(_mm512_cvtepi8_epi16(bytes), 7);
    half = _mm512_and_si512(half, _mm512_set1_epi16((short)0xBF80));
    __m512 s0 = _mm512_set1_ps(row_scales[c.first] * 256.0f), s1 = s0;
    if (c.split < 32) {
        const __m512 next = _mm512_set1_ps(row_scales[c.first + 1] * 256.0f);
        const uint32_t from = ~0u << c.split;
        s0 = _mm512_mask_blend_ps((__mmask16)from, s0, next);
        s1 = _mm512_mask_blend_ps((__mmask16)(from >> 16), s1, next);
    }
    *w0 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(half)), s0);
    *w1 = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(half, 1)), s1);
}

static int valid_blocks(int64_t K, int64_t blocks, int64_t col_offset, int64_t block_cols,
                        int64_t scale_rows) {
    return block_cols >= 32 && scale_rows >= 1 && col_offset >= 0 && col_offset < block_cols &&
           (col_offset + K - 1) / block_cols + 1 == blocks;
}

/* Each chunk of 32 columns' Chunk (the same for every row), or NULL without memory. */
static Chunk *make_chunks(int64_t K, int64_t blocks, int64_t col_offset, int64_t block_cols) {
    const int64_t count = (K + 31) / 32;
    Chunk *chunks = malloc(sizeof(Chunk) * (size_t)count);
    if (!chunks) return 0;
    for (int64_t c = 0; c < count; c++) {
        const int64_t first = (32 * c + col_offset) / block_cols;
        const int64_t next = (first + 1) * block_cols - col_offset - 32 * c; /* lane of the next block */
        chunks[c].first = (int32_t)first;
        /* Past K the weights are zero; the next block's scale is read only where it exists. */
        chunks[c].split = (int32_t)(next < 32 && first + 1 < blocks ? next : 32);
    }
    return chunks;
}

/* res[m * TILE + i] = weight row i (of `wrows` <= WROWS; its scales at scales[i]) times
   activation row m (of xrows). */
static inline __attribute__((always_inline)) void pass_fp8(const uint8_t *w,
                                                           const float *const *scales,
                                                           const Chunk *chunks, int wrows,
                                                           const float *x, int64_t K,
                                                           const int xrows, float *res) {
    __m512 acc[WROWS][XROWS];
    for (int i = 0; i < WROWS; i++)
        for (int m = 0; m < xrows; m++) acc[i][m] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 32) {
        const int64_t n = K - k;
        __m512 w0[WROWS], w1[WROWS];
        for (int i = 0; i < WROWS; i++) {
            if (i < wrows)
                weights32(w + i * K + k, n, scales[i], chunks[k / 32], &w0[i], &w1[i]);
            else
                w0[i] = w1[i] = _mm512_setzero_ps();
        }
        const __mmask16 m0 = tail_mask(n), m1 = n > 16 ? tail_mask(n - 16) : 0;
        for (int m = 0; m < xrows; m++) {
            const __m512 x0 = _mm512_maskz_loadu_ps(m0, x + m * K + k);
            const __m512 x1 = _mm512_maskz_loadu_ps(m1, x + m * K + k + 16);
            for (int i = 0; i < WROWS; i++) {
                acc[i][m] = _mm512_fmadd_ps(w0[i], x0, acc[i][m]);
                acc[i][m] = _mm512_fmadd_ps(w1[i], x1, acc[i][m]);
            }
        }
    }
    for (int i = 0; i < wrows; i++)
        for (int m = 0; m < xrows; m++) res[m * TILE + i] = _mm512_reduce_add_ps(acc[i][m]);
}

static void block_fp8(const uint8_t *w, const float *const *scales, const Chunk *chunks,
                      int wrows, const float *x, int64_t K, int xrows, float *res) {
    /* Constant row counts, so the accumulators live in registers. */
#define CALL(n) pass_fp8(w, scales, chunks, wrows, x, K, n, res)
    switch (xrows) {
    case 1: CALL(1); break;
    case 2: CALL(2); break;
    case 3: CALL(3); break;
    case 4: CALL(4); break;
    case 5: CALL(5); break;
    case 6: CALL(6); break;
    case 7: CALL(7); break;
    default: CALL(8); break;
    }
#undef CALL
}

/* out[M, N] = x[M, K] @ W^T (+ bias). x and out are float32 or bfloat16; scales
   [ceil(N / scale_rows), blocks]. Returns 0, -1 when scratch memory cannot be had,
   -2 for a block layout that does not cover K, blocks narrower than 32 columns or
   scale_rows < 1. */
int fp8_block_matmul(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *weight,
                     const float *scales, int64_t blocks, int64_t col_offset,
                     int64_t block_cols, int64_t scale_rows, int64_t N, const float *bias,
                     void *out, int out_bf16, int threads) {
    if (!valid_blocks(K, blocks, col_offset, block_cols, scale_rows)) return -2;
    const int64_t tiles = (N + TILE - 1) / TILE;
    Chunk *chunks = make_chunks(K, blocks, col_offset, block_cols);
    float *widened = x_bf16 ? malloc(sizeof(float) * (size_t)(M * K)) : 0;
    if (!chunks || (x_bf16 && !widened)) {
        free(chunks), free(widened);
        return -1;
    }
    const float *xf = widened ? widened : (const float *)x;
    const int out_elem = out_bf16 ? 2 : 4;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        if (widened) {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < M; r++)
                for (int64_t k = 0; k < K; k += 16) {
                    const __mmask16 m = tail_mask(K - k);
                    _mm512_mask_storeu_ps(widened + r * K + k, m,
                                          bf16x16_load_masked((const uint16_t *)x + r * K + k, m));
                }
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            float res[XROWS * TILE] = {0};
            const int64_t n0 = t * TILE, count = N - n0 < TILE ? N - n0 : TILE;
            const __mmask16 mask = tail_mask(N - n0);
            const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
            for (int64_t r0 = 0; r0 < M; r0 += XROWS) {
                const int xrows = (int)(M - r0 < XROWS ? M - r0 : XROWS);
                for (int64_t i = 0; i < count; i += WROWS) {
                    const uint8_t *w = weight + (n0 + i) * K;
                    const int wrows = (int)(count - i < WROWS ? count - i : WROWS);
                    const float *sc[WROWS];
                    for (int j = 0; j < WROWS; j++)
                        sc[j] = scales + (n0 + i + (j < wrows ? j : 0)) / scale_rows * blocks;
                    block_fp8(w, sc, chunks, wrows, xf + r0 * K, K, xrows, res + i);
                }
                for (int r = 0; r < xrows; r++)
                    row16_store((char *)out + ((r0 + r) * N + n0) * out_elem,
                                _mm512_add_ps(_mm512_maskz_loadu_ps(mask, res + r * TILE), b),
                                out_bf16, mask);
            }
        }
    }
    free(chunks), free(widened);
    return 0;
}

/* out[rows, K] = the weights as float32 or bfloat16 (rounded once, to nearest even):
   torch's dequantization value for value, for the row chunks that long prompts
   multiply with torch's own GEMM. Returns 0, -1 without memory, -2 as above. */
int fp8_block_dequantize(const uint8_t *weight, const float *scales, int64_t rows, int64_t K,
                         int64_t blocks, int64_t col_offset, int64_t block_cols,
                         int64_t scale_rows, void *out, int out_bf16, int threads) {
    if (!valid_blocks(K, blocks, col_offset, block_cols, scale_rows)) return -2;
    Chunk *chunks = make_chunks(K, blocks, col_offset, block_cols);
    if (!chunks) return -1;
    const int out_elem = out_bf16 ? 2 : 4;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static)
    for (int64_t n = 0; n < rows; n++) {
        char *dst = (char *)out + n * K * out_elem;
        for (int64_t k = 0; k < K; k += 32) {
            __m512 w0, w1;
            weights32(weight + n * K + k, K - k, scales + n / scale_rows * blocks, chunks[k / 32],
                      &w0, &w1);
            row16_store(dst + k * out_elem, w0, out_bf16, tail_mask(K - k));
            if (K - k > 16) row16_store(dst + (k + 16) * out_elem, w1, out_bf16, tail_mask(K - k - 16));
        }
    }
    free(chunks);
    return 0;
}
