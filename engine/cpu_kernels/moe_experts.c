/* A MoE layer's routed experts on grid weights, for all tokens, in one call.

   The module path (engine/layers/moe.py run_experts) loops over the experts in
   Python, each a gather, two grid products, SwiGLU and a scatter: at one decode
   token and 8 experts that is 9 OpenMP regions and the Python between them,
   which cost as much again as the products (bench/cpu_kernels.py moe_experts).
   Here, as llama.cpp's mul_mat_id does it, the (token, slot) pairs are grouped
   by expert, each token's activations are quantized to int8 once, and one
   parallel region runs
   - by (expert, group of 32 intermediate columns): that expert's gate and up
     tiles for all its tokens, SwiGLU, and the int8 quantization of the result
     (one group is exactly what quantizing needs, so no barrier before the down
     product);
   - by tile of 16 output columns: every selected expert's down tile, weighted
     and summed per token in float32, rounded to bfloat16 once.
   Each selected expert's weights are read once, whatever its token count.

   Rounding: gate, up and SwiGLU round to bfloat16 where the module path rounds
   (the grid product's bf16 output, silu_mul), so the down product sees the same
   int8 activations and sums the same floats. The module path then rounds each
   expert's output, its weighted value and each index_add_ to bfloat16; this
   sums in float32 and rounds once, which is closer to the exact sum
   (tests/engine/test_cpu_moe_experts.py bounds the difference). */
#include <stdlib.h>
#include <string.h>

#include "grid_tiles.h"

/* One routed expert's packed weights: gate_up [2 * I, H] (gate rows, then up rows)
   and down [H, I], in grid_matmul.c's layout. */
typedef struct {
    const uint8_t *gate_up_codes;
    const uint16_t *gate_up_scales; /* IEEE half */
    const uint8_t *down_codes;
    const uint16_t *down_scales; /* IEEE half */
} MoeExpert;

/* Gate and up tiles 2j, 2j + 1 of one expert for `rows` pairs, then SwiGLU and
   int8 quantization of intermediate group j of each pair. */
static void gate_up_group(const MoeExpert *ex, int bits, int64_t H, int64_t I, int64_t j,
                          const int8_t *xq, const float *dx, const float *cx, int64_t rows,
                          int8_t *aq, float *adx, float *acx) {
    const int64_t hg = H / GROUP, ig = I / GROUP, w_tile = tile_bytes(bits, hg);
    const int64_t scale_tile = hg * 2 * TILE, up = I / TILE;
    const int64_t tiles[4] = {2 * j, 2 * j + 1, up + 2 * j, up + 2 * j + 1};
    float acc[4][ROW_BLOCK * TILE];
    for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK) {
        const int64_t n = rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK;
        for (int i = 0; i < 4; i++)
            tile_rows(ex->gate_up_codes + tiles[i] * w_tile,
                      ex->gate_up_scales + tiles[i] * scale_tile, bits, hg, xq + r0 * H,
                      dx + r0 * hg, cx + r0 * hg, H, n, acc[i]);
        for (int64_t r = 0; r < n; r++) {
            float act[GROUP];
            for (int h = 0; h < 2; h++) {
                const __m512 g = bf16x16_round(_mm512_loadu_ps(acc[h] + r * TILE));
                const __m512 u = bf16x16_round(_mm512_loadu_ps(acc[2 + h] + r * TILE));
                _mm512_storeu_ps(act + h * TILE, bf16x16_round(swiglu16(g, u)));
            }
            const int64_t p = r0 + r;
            quantize_group(act, 0, aq + p * I + j * GROUP, adx + p * ig + j, acx + p * ig + j);
        }
    }
}

/* Pair q's copy of its token's int8 row and group scales: each expert's rows side by
   side, as the tile loop reads them. */
static inline void gather_pair(int64_t q, const int64_t *token, int64_t H, const int8_t *xq,
                               const float *dx, const float *cx, int8_t *pq, float *pdx,
                               float *pcx) {
    const int64_t hg = H / GROUP, t = token[q];
    memcpy(pq + q * H, xq + t * H, (size_t)H);
    memcpy(pdx + q * hg, dx + t * hg, sizeof(float) * hg);
    memcpy(pcx + q * hg, cx + t * hg, sizeof(float) * hg);
}

/* out[T, H] (bf16) = sum over t's k slots of weight * expert(x_t), expert = down(SwiGLU(
   gate_up(x_t))). x [T, H] bf16; ids [T, k] in 0..E-1 and weights [T, k] float32;
   experts [E]. H and I are multiples of 32. Returns 0, -1 when scratch memory cannot
   be had, -2 for an expert id outside 0..E-1 (out is then unwritten). */
int moe_experts(const uint16_t *x, int64_t T, int64_t H, int64_t I, const int64_t *ids,
                const float *weights, int64_t k, const MoeExpert *experts, int64_t E,
                int gate_up_bits, int down_bits, uint16_t *out, int threads) {
    const int64_t P = T * k, hg = H / GROUP, ig = I / GROUP;
    for (int64_t p = 0; p < P; p++)
        if (ids[p] < 0 || ids[p] >= E) return -2;
    /* Scratch in three blocks, by element type. */
    int64_t *index = calloc((size_t)(3 * E + 1 + P), sizeof(int64_t));
    float *floats = malloc(sizeof(float) * (size_t)(P + T * H + 2 * (T + P) * hg + 2 * P * ig));
    int8_t *bytes = malloc((size_t)(T * H + P * H + P * I));
    if (!index || !floats || !bytes) {
        free(index), free(floats), free(bytes);
        return -1;
    }
    int64_t *start = index, *next = start + E + 1, *active = next + E, *token = active + E;
    float *pair_weight = floats, *sum = pair_weight + P;
    float *dx = sum + T * H, *cx = dx + T * hg, *pdx = cx + T * hg, *pcx = pdx + P * hg;
    float *adx = pcx + P * hg, *acx = adx + P * ig;
    int8_t *xq = bytes, *pq = xq + T * H, *aq = pq + P * H;
    /* Pairs grouped by expert, in (token, slot) order within one: a counting sort. */
    for (int64_t p = 0; p < P; p++) start[ids[p] + 1]++;
    int64_t A = 0;
    for (int64_t e = 0; e < E; e++) {
        if (start[e + 1]) active[A++] = e;
        next[e] = start[e];
        start[e + 1] += start[e];
    }
    for (int64_t p = 0; p < P; p++) {
        const int64_t q = next[ids[p]]++;
        token[q] = p / k;
        pair_weight[q] = weights[p];
    }
    const int64_t down_tile = tile_bytes(down_bits, ig), down_scales = ig * 2 * TILE;
    /* A decode step's few tokens are quantized and gathered before the team starts,
       as in grid_matmul.c: two barriers fewer. */
    const int split_rows = T > SERIAL_QUANTIZE_ROWS;
    if (!split_rows) {
        for (int64_t t = 0; t < T; t++)
            quantize_row(x + t * H, 1, H, xq + t * H, dx + t * hg, cx + t * hg);
        for (int64_t q = 0; q < P; q++) gather_pair(q, token, H, xq, dx, cx, pq, pdx, pcx);
    }
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        if (split_rows) {
#pragma omp for schedule(static)
            for (int64_t t = 0; t < T; t++)
                quantize_row(x + t * H, 1, H, xq + t * H, dx + t * hg, cx + t * hg);
#pragma omp for schedule(static)
            for (int64_t q = 0; q < P; q++) gather_pair(q, token, H, xq, dx, cx, pq, pdx, pcx);
        }
        /* Experts differ in token count, so items differ in cost: hand them out as
           threads free up. */
#pragma omp for schedule(dynamic)
        for (int64_t item = 0; item < A * ig; item++) {
            const int64_t e = active[item / ig], s = start[e];
            gate_up_group(experts + e, gate_up_bits, H, I, item % ig, pq + s * H, pdx + s * hg,
                          pcx + s * hg, start[e + 1] - s, aq + s * I, adx + s * ig, acx + s * ig);
        }
        /* A tile's 16 columns belong to one thread: it sums over the experts unraced. */
#pragma omp for schedule(static)
        for (int64_t n = 0; n < H / TILE; n++) {
            float acc[ROW_BLOCK * TILE];
            for (int64_t t = 0; t < T; t++)
                _mm512_storeu_ps(sum + t * H + n * TILE, _mm512_setzero_ps());
            for (int64_t a = 0; a < A; a++) {
                const MoeExpert *ex = experts + active[a];
                const int64_t s = start[active[a]], rows = start[active[a] + 1] - s;
                for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK) {
                    const int64_t m = rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK, p0 = s + r0;
                    tile_rows(ex->down_codes + n * down_tile, ex->down_scales + n * down_scales,
                              down_bits, ig, aq + p0 * I, adx + p0 * ig, acx + p0 * ig, I, m, acc);
                    for (int64_t r = 0; r < m; r++) {
                        float *dst = sum + token[p0 + r] * H + n * TILE;
                        const __m512 w = _mm512_set1_ps(pair_weight[p0 + r]);
                        _mm512_storeu_ps(dst, _mm512_fmadd_ps(w, _mm512_loadu_ps(acc + r * TILE),
                                                              _mm512_loadu_ps(dst)));
                    }
                }
            }
            for (int64_t t = 0; t < T; t++)
                _mm256_storeu_si256((__m256i *)(out + t * H + n * TILE),
                                    bf16x16_from(_mm512_loadu_ps(sum + t * H + n * TILE)));
        }
    }
    free(index), free(floats), free(bytes);
    return 0;
}
