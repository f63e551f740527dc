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
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "grid_tiles.h"
#include "kernels.h"

/* Gate and up tiles 2j, 2j + 1 of one expert for `rows` pairs, then SwiGLU and
   int8 quantization of intermediate group j of each pair. */
static void gate_up_group(const MoeExpert *ex, int fmt, int64_t I, int64_t j, Int8Rows x,
                          int64_t rows, Int8Rows act) {
    const int64_t hg = x.K / GROUP, w_tile = tile_bytes(fmt, hg);
    const int64_t scale_tile = tile_scale_bytes(fmt, hg), up = I / TILE;
    const int64_t tiles[4] = {2 * j, 2 * j + 1, up + 2 * j, up + 2 * j + 1};
    float acc[4][ROW_BLOCK * TILE];
    for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK) {
        const int64_t n = rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK;
        for (int i = 0; i < 4; i++)
            tile_rows(ex->gate_up_codes + tiles[i] * w_tile,
                      ex->gate_up_scales + tiles[i] * scale_tile, fmt, hg, rows_from(x, r0), n,
                      acc[i]);
        for (int64_t r = 0; r < n; r++) {
            float values[GROUP];
            for (int h = 0; h < 2; h++) {
                const __m512 g = bf16x16_round(_mm512_loadu_ps(acc[h] + r * TILE));
                const __m512 u = bf16x16_round(_mm512_loadu_ps(acc[2 + h] + r * TILE));
                _mm512_storeu_ps(values + h * TILE, bf16x16_round(swiglu16(g, u)));
            }
            quantize_group(values, 0, act, r0 + r, j);
        }
    }
}

/* Item `item` of the gate/up pass: expert active[item / ig], its group item % ig, for
   the expert's pairs (rows start[e] .. start[e + 1] of pq and aq). */
static void gate_up_item(int64_t item, int64_t ig, const int64_t *active, const int64_t *start,
                         const MoeExpert *experts, int fmt, int64_t I, Int8Rows pq, Int8Rows aq) {
    const int64_t e = active[item / ig], s = start[e];
    gate_up_group(experts + e, fmt, I, item % ig, rows_from(pq, s), start[e + 1] - s,
                  rows_from(aq, s));
}

/* Reading an expert's tile costs about what multiplying it by this many rows does (a
   decode step's few rows per expert leave the weights' reads the larger part). */
enum { TILE_READ_ROWS = 4 };

/* The first gate/up item (expert active[a]'s items are a * ig .. a * ig + ig - 1) before
   which the items cost at least `share`, each its expert's rows plus TILE_READ_ROWS. */
static int64_t item_boundary(int64_t A, int64_t ig, const int64_t *active, const int64_t *start,
                             int64_t share) {
    int64_t cost = 0;
    for (int64_t item = 0; item < A * ig; item++) {
        if (cost >= share) return item;
        const int64_t e = active[item / ig];
        cost += start[e + 1] - start[e] + TILE_READ_ROWS;
    }
    return A * ig;
}

/* Pair q's copy of its token's int8 row and group sums: each expert's rows side by
   side, as the tile loop reads them. */
static inline void gather_pair(int64_t q, const int64_t *token, Int8Rows x, Int8Rows pairs) {
    const Int8Rows from = rows_from(x, token[q]), to = rows_from(pairs, q);
    const int64_t groups = x.K / GROUP;
    memcpy(to.q, from.q, (size_t)x.K);
    memcpy(to.d, from.d, sizeof(float) * groups);
    memcpy(to.c, from.c, sizeof(float) * groups);
    memcpy(to.h, from.h, sizeof(int32_t) * groups * 2);
}

/* n int8 rows of K values from scratch blocks by element type, each cursor moved past
   what the rows take. */
static Int8Rows carve_rows(int64_t n, int64_t K, int8_t **values, float **floats,
                           int32_t **halves) {
    const int64_t groups = K / GROUP;
    const Int8Rows rows = {*values, *floats, *floats + n * groups, *halves, K};
    *values += n * K, *floats += 2 * n * groups, *halves += 2 * n * groups;
    return rows;
}

/* out[T, H] (bf16) = sum over t's k slots of weight * expert(x_t), expert = down(SwiGLU(
   gate_up(x_t))). x [T, H] bf16; ids [T, k] in 0..E-1 and weights [T, k] float32;
   experts [E], gate_up in format gate_up_fmt and down in down_fmt (grid_formats.h).
   H and I are multiples of 32 (of 256 for a K-quant format). Returns 0, -1 when scratch
   memory cannot be had, -2 for an expert id outside 0..E-1 or a format the shapes do not
   fit (out is then unwritten). */
int moe_experts(const uint16_t *x, int64_t T, int64_t H, int64_t I, const int64_t *ids,
                const float *weights, int64_t k, const MoeExpert *experts, int64_t E,
                int gate_up_fmt, int down_fmt, uint16_t *out, int threads) {
    const int64_t P = T * k, hg = H / GROUP, ig = I / GROUP;
    if (!grid_format_fits(gate_up_fmt, H) || !grid_format_fits(down_fmt, I)) return -2;
    for (int64_t p = 0; p < P; p++)
        if (ids[p] < 0 || ids[p] >= E) return -2;
    /* Scratch in four blocks, by element type. */
    int64_t *index = calloc((size_t)(3 * E + 1 + P), sizeof(int64_t));
    float *floats = malloc(sizeof(float) * (size_t)(P + T * H + 2 * (T + P) * hg + 2 * P * ig));
    int32_t *sums = malloc(sizeof(int32_t) * (size_t)(2 * (T + P) * hg + 2 * P * ig));
    int8_t *bytes = malloc((size_t)(T * H + P * H + P * I));
    if (!index || !floats || !sums || !bytes) {
        free(index), free(floats), free(sums), free(bytes);
        return -1;
    }
    int64_t *start = index, *next = start + E + 1, *active = next + E, *token = active + E;
    float *pair_weight = floats, *sum = pair_weight + P, *group_floats = sum + T * H;
    int8_t *values = bytes;
    int32_t *halves = sums;
    /* tokens' rows, pairs' copies of them, and pairs' intermediate activations */
    const Int8Rows xq = carve_rows(T, H, &values, &group_floats, &halves);
    const Int8Rows pq = carve_rows(P, H, &values, &group_floats, &halves);
    const Int8Rows aq = carve_rows(P, I, &values, &group_floats, &halves);
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
    const int64_t total_cost = (P + A * TILE_READ_ROWS) * ig; /* of all gate/up items */
    const int64_t down_tile = tile_bytes(down_fmt, ig);
    const int64_t down_scales = tile_scale_bytes(down_fmt, ig);
    /* A decode step's few tokens are quantized and gathered before the team starts,
       as in grid_matmul.c: two barriers fewer. */
    const int split_rows = T > SERIAL_QUANTIZE_ROWS;
    if (!split_rows) {
        for (int64_t t = 0; t < T; t++) quantize_row(x + t * H, 1, xq, t);
        for (int64_t q = 0; q < P; q++) gather_pair(q, token, xq, pq);
    }
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        const int team = omp_get_num_threads(), tid = omp_get_thread_num();
        if (split_rows) {
#pragma omp for schedule(static)
            for (int64_t t = 0; t < T; t++) quantize_row(x + t * H, 1, xq, t);
#pragma omp for schedule(static)
            for (int64_t q = 0; q < P; q++) gather_pair(q, token, xq, pq);
        }
        /* Each thread takes one run of the items, the runs of equal cost, so its reads go
           on through each expert's weights in order (the hardware prefetchers follow one
           stream) rather than interleaving with the other thread's item by item. */
        const int64_t first = item_boundary(A, ig, active, start, total_cost * tid / team);
        const int64_t last = item_boundary(A, ig, active, start, total_cost * (tid + 1) / team);
        for (int64_t item = first; item < last; item++)
            gate_up_item(item, ig, active, start, experts, gate_up_fmt, I, pq, aq);
#pragma omp barrier
        /* A run of output tiles belongs to each thread: it sums over the experts unraced,
           and walks the experts outer, so its reads of each expert's down weights are one
           stream (tile by tile, every expert's tile n was a stream of a few KB). The sums
           per token and tile still run over the experts in order. */
        const int64_t tiles = H / TILE, n0 = tiles * tid / team, n1 = tiles * (tid + 1) / team;
        float acc[ROW_BLOCK * TILE];
        for (int64_t t = 0; t < T; t++)
            for (int64_t n = n0; n < n1; n++)
                _mm512_storeu_ps(sum + t * H + n * TILE, _mm512_setzero_ps());
        for (int64_t a = 0; a < A; a++) {
            const MoeExpert *ex = experts + active[a];
            const int64_t s = start[active[a]], rows = start[active[a] + 1] - s;
            for (int64_t n = n0; n < n1; n++)
                for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK) {
                    const int64_t m = rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK, p0 = s + r0;
                    tile_rows(ex->down_codes + n * down_tile, ex->down_scales + n * down_scales,
                              down_fmt, ig, rows_from(aq, p0), m, acc);
                    for (int64_t r = 0; r < m; r++) {
                        float *dst = sum + token[p0 + r] * H + n * TILE;
                        const __m512 w = _mm512_set1_ps(pair_weight[p0 + r]);
                        _mm512_storeu_ps(dst, _mm512_fmadd_ps(w, _mm512_loadu_ps(acc + r * TILE),
                                                              _mm512_loadu_ps(dst)));
                    }
                }
        }
        for (int64_t t = 0; t < T; t++)
            for (int64_t n = n0; n < n1; n++)
                _mm256_storeu_si256((__m256i *)(out + t * H + n * TILE),
                                    bf16x16_from(_mm512_loadu_ps(sum + t * H + n * TILE)));
    }
    free(index), free(floats), free(sums), free(bytes);
    return 0;
}
