/* The int8-activation grid product's building blocks (weight layouts: grid_formats.h),
   shared by the kernels that multiply grid weights: the plain product and its BF16
   expansion (grid_matmul.c) and the MoE layer's experts (moe_experts.c), so all of them
   read every format alike and round and sum alike. */
#ifndef RESIDENT_GRID_TILES_H
#define RESIDENT_GRID_TILES_H
#include "simd_arch.h"
#include <stdint.h>

#include "grid_formats.h"
#include "simd.h"

#define ROW_BLOCK 16
/* The most rows grid_row_block hands out (a caller's accumulators: 4 KB). */
#define MAX_ROW_BLOCK 64

/* Activation rows a plain product takes through one tile at a time. On AVX2 each group's
   codes are unpacked once a block (grid_tiles_avx2.h), so more rows spread that work:
   as many as keep the block's int8 rows within 64 KB (two L1 caches' worth; past that
   the rows come from L2 and more of them measured no faster). */
static inline int64_t grid_row_block(int64_t K) {
#ifdef RESIDENT_AVX2
    int64_t rows = 65536 / K / 4 * 4;
    return rows < ROW_BLOCK ? ROW_BLOCK : rows > MAX_ROW_BLOCK ? MAX_ROW_BLOCK : rows;
#else
    (void)K;
    return ROW_BLOCK;
#endif
}
/* Up to this many activation rows are quantized before the OpenMP team starts. */
#define SERIAL_QUANTIZE_ROWS 4

/* Rows of activations quantized to int8 per group of 32 (x ~ d * q): q [rows, K]; per
   group d = amax / 127 and c = d * sum(q) [rows, K / 32]; and h [rows, K / 32, 2], the
   integer sums of q over the group's two halves of 16, for formats whose scales change
   every 16 values (Q6_K; llama.cpp's block_q8_K keeps them as bsums). */
typedef struct {
    int8_t *q;
    float *d, *c;
    int32_t *h;
    int64_t K;
} Int8Rows;

/* The same rows from row r on. */
static inline Int8Rows rows_from(Int8Rows x, int64_t r) {
    const int64_t groups = x.K / GROUP;
    return (Int8Rows){x.q + r * x.K, x.d + r * groups, x.c + r * groups, x.h + r * groups * 2,
                      x.K};
}

/* One group of 32 values (float32 or bfloat16 at src) into row r, group g of x. */
static inline void quantize_group(const void *src, int bf16, Int8Rows x, int64_t r, int64_t g) {
    const int elem = bf16 ? 2 : 4;
    const int64_t i = r * (x.K / GROUP) + g;
    __m512 a = row16_load(src, bf16);
    __m512 b = row16_load((const char *)src + TILE * elem, bf16);
    __m512 amax = _mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b));
    float m = _mm512_reduce_max_ps(amax);
    float inv = m > 0.0f ? 127.0f / m : 0.0f;
    __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(inv)));
    __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(inv)));
    int8_t *q = x.q + r * x.K + g * GROUP;
    _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(q + TILE), _mm512_cvtsepi32_epi8(qb));
    x.h[2 * i] = _mm512_reduce_add_epi32(qa);
    x.h[2 * i + 1] = _mm512_reduce_add_epi32(qb);
    x.d[i] = m / 127.0f;
    x.c[i] = x.d[i] * (float)(x.h[2 * i] + x.h[2 * i + 1]);
}

/* Row r of x from K float32 or bfloat16 values. */
static inline void quantize_row(const void *src, int bf16, Int8Rows x, int64_t r) {
    const int elem = bf16 ? 2 : 4;
    for (int64_t g = 0; g < x.K / GROUP; g++)
        quantize_group((const char *)src + g * GROUP * elem, bf16, x, r, g);
}

/* vpdpbusd of a tile's codes: `small` (a constant) when the format's codes are below 128,
   which the AVX2 build multiplies in two instructions instead of six (simd_arch.h). */
#define DPBUSD_CODES(small, acc, w, x)                                                    \
    ((small) ? dpbusd_small((acc), (w), (x)) : _mm512_dpbusd_epi32((acc), (w), (x)))

#ifdef RESIDENT_AVX2
/* Vectors j0..j0 + n - 1 of a group's codes times their activations, summed, on AVX2:
   vpmaddubsw's pair sums are added in 16 bits before one vpmaddwd widens them (a
   vpmaddwd and an add fewer per vector than dpbusd_small). Exact while the sum stays
   inside int16: n * 2 * 128 * (the largest code) <= 32767, so n = 8 for 4-bit codes
   (30720), 4 for 5-bit ones (31744), 2 for Q6_K's 6-bit ones (32256). */
ALWAYS_INLINE __m512i narrow_sum(const __m512i w[8], const int32_t *xr, int j0, int n) {
    const __m256i x0 = _mm256_set1_epi32(xr[j0]);
    __m256i lo = _mm256_maddubs_epi16(w[j0].lo, x0), hi = _mm256_maddubs_epi16(w[j0].hi, x0);
    for (int j = j0 + 1; j < j0 + n; j++) {
        const __m256i xj = _mm256_set1_epi32(xr[j]);
        lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(w[j].lo, xj));
        hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(w[j].hi, xj));
    }
    const __m256i ones = _mm256_set1_epi16(1);
    return (__m512i){_mm256_madd_epi16(lo, ones), _mm256_madd_epi16(hi, ones)};
}
#endif

/* sum over k of one group of the tile's codes (format fmt) times one row's int8
   activations. */
ALWAYS_INLINE __m512i group_dot(int fmt, const __m512i w[8], const int32_t *xr) {
    const int small = fmt != GRID_U8;
#ifdef RESIDENT_AVX2
    if (fmt == GRID_U4 || fmt == GRID_Q4_K) return narrow_sum(w, xr, 0, 8);
    if (fmt == GRID_Q5_K)
        return _mm512_add_epi32(narrow_sum(w, xr, 0, 4), narrow_sum(w, xr, 4, 4));
#endif
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (int j = 0; j < 8; j += 2) {
        s0 = DPBUSD_CODES(small, s0, w[j], _mm512_set1_epi32(xr[j]));
        s1 = DPBUSD_CODES(small, s1, w[j + 1], _mm512_set1_epi32(xr[j + 1]));
    }
    return _mm512_add_epi32(s0, s1);
}

/* The same sum over the group's first 16 values (vectors 0..3) and its last 16. */
ALWAYS_INLINE void group_dot_halves(const __m512i w[8], const int32_t *xr, __m512i *first,
                                    __m512i *second) {
#ifdef RESIDENT_AVX2
    *first = _mm512_add_epi32(narrow_sum(w, xr, 0, 2), narrow_sum(w, xr, 2, 2));
    *second = _mm512_add_epi32(narrow_sum(w, xr, 4, 2), narrow_sum(w, xr, 6, 2));
    return;
#endif
    __m512i s[4];
    for (int i = 0; i < 4; i++) s[i] = _mm512_setzero_si512();
    for (int j = 0; j < 4; j += 2)
        for (int half = 0; half < 2; half++) {
            const int v = 4 * half + j;
            /* Q6_K's codes are below 64 */
            s[2 * half] = dpbusd_small(s[2 * half], w[v], _mm512_set1_epi32(xr[v]));
            s[2 * half + 1] = dpbusd_small(s[2 * half + 1], w[v + 1], _mm512_set1_epi32(xr[v + 1]));
        }
    *first = _mm512_add_epi32(s[0], s[1]);
    *second = _mm512_add_epi32(s[2], s[3]);
}

/* a + row r's share of group g: its codes w scaled by s, times the row's activations. */
ALWAYS_INLINE __m512 group_row(int fmt, const __m512i w[8], GroupScales s, Int8Rows x, int64_t r,
                               int64_t g, __m512 a) {
    const int64_t i = r * (x.K / GROUP) + g;
    const int32_t *xr = (const int32_t *)(x.q + r * x.K + g * GROUP);
    const __m512 dx = _mm512_set1_ps(x.d[i]);
    if (fmt == GRID_Q6_K) {
        __m512i first, second;
        group_dot_halves(w, xr, &first, &second);
        /* the codes are q + 32: sum((q + 32) x) - 32 sum(x), exact in int32 */
        first = _mm512_sub_epi32(first, _mm512_set1_epi32(32 * x.h[2 * i]));
        second = _mm512_sub_epi32(second, _mm512_set1_epi32(32 * x.h[2 * i + 1]));
        a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(first), _mm512_mul_ps(s.step, dx), a);
        return _mm512_fmadd_ps(_mm512_cvtepi32_ps(second), _mm512_mul_ps(s.step2, dx), a);
    }
    const __m512 prod = _mm512_cvtepi32_ps(group_dot(fmt, w, xr));
    a = _mm512_fmadd_ps(prod, _mm512_mul_ps(s.step, dx), a);
    return _mm512_fmadd_ps(s.offset, _mm512_set1_ps(x.c[i]), a);
}

#include "grid_tiles_avx2.h"

/* A decode step's product streams its weights once, at the memory's pace: a group's codes
   are asked for CODES_AHEAD bytes before they are used (the next tile's near a tile's end:
   tiles lie one after another). The hardware's stream prefetchers stop at each 4 KiB page,
   where the product waited. On a 0.85B Llama's Q4_K_M decode step (Zen 4, 2 threads, one
   process alternating builds): one stream 1.09-1.12x with 4 KiB ahead (1 KiB 1.06, 8 KiB
   1.09, 16 KiB 1.07), 16 at once 1.13x, a 2,048-token prefill 1.00x (its row blocks reuse
   each tile from cache). A prefetch past the weights' end faults nothing. */
#define CODES_AHEAD 4096
ALWAYS_INLINE void prefetch_codes(const char *codes, int64_t bytes) {
    for (int64_t c = 0; c < bytes; c += 64) _mm_prefetch(codes + c, _MM_HINT_T0);
}

/* acc[r][16] = rows 0..rows of x times one tile of 16 weight rows in format fmt. One row
   (a decode step) keeps its accumulator in a register; more go through acc every group.
   The same operations in the same order either way, so a row's result does not depend
   on how many rows run. */
ALWAYS_INLINE void tile_pass(int fmt, const uint8_t *tile, const uint8_t *scales, int64_t groups,
                             Int8Rows x, int64_t rows, float *acc) {
    const int64_t per = block_groups(fmt), code_bytes = group_bytes(fmt);
    const int64_t scale_bytes = block_scale_bytes(fmt);
    __m512 one = _mm512_setzero_ps();
    if (rows > 1)
        for (int64_t r = 0; r < rows; r++) _mm512_storeu_ps(acc + r * TILE, _mm512_setzero_ps());
    for (int64_t b = 0; b < groups / per; b++) {
        const uint8_t *block = scales + b * scale_bytes;
        const BlockScales bs = block_scales(fmt, block);
        for (int64_t j = 0; j < per; j++) {
            const int64_t g = b * per + j;
            __m512i w[8];
            prefetch_codes((const char *)tile + g * code_bytes + CODES_AHEAD, code_bytes);
            group_vectors(fmt, tile + g * code_bytes, w);
            const GroupScales s = group_scales(fmt, bs, block, j);
            if (rows == 1) {
                one = group_row(fmt, w, s, x, 0, g, one);
                continue;
            }
#ifdef RESIDENT_AVX2
            if (fmt != GRID_U8) {  /* the same steps, rows in blocks (grid_tiles_avx2.h) */
                group_rows_blocked(fmt, w, s, x, rows, g, acc);
                continue;
            }
#endif
            for (int64_t r = 0; r < rows; r++)
                _mm512_storeu_ps(acc + r * TILE,
                                 group_row(fmt, w, s, x, r, g, _mm512_loadu_ps(acc + r * TILE)));
        }
    }
    if (rows == 1) _mm512_storeu_ps(acc, one);
}

/* tile_pass with the one-row case compiled apart (its test leaves the group loop). */
ALWAYS_INLINE void tile_rows_as(int fmt, const uint8_t *tile, const uint8_t *scales,
                                int64_t groups, Int8Rows x, int64_t rows, float *acc) {
    if (rows == 1)
        tile_pass(fmt, tile, scales, groups, x, 1, acc);
    else
        tile_pass(fmt, tile, scales, groups, x, rows, acc);
}

/* tile_rows_as compiled once per format, so no format test runs per group. */
static inline void tile_rows(const uint8_t *tile, const uint8_t *scales, int fmt, int64_t groups,
                             Int8Rows x, int64_t rows, float *acc) {
    switch (fmt) {
    case GRID_U4: tile_rows_as(GRID_U4, tile, scales, groups, x, rows, acc); break;
    case GRID_U8: tile_rows_as(GRID_U8, tile, scales, groups, x, rows, acc); break;
    case GRID_Q4_K: tile_rows_as(GRID_Q4_K, tile, scales, groups, x, rows, acc); break;
    case GRID_Q5_K: tile_rows_as(GRID_Q5_K, tile, scales, groups, x, rows, acc); break;
    case GRID_Q6_K: tile_rows_as(GRID_Q6_K, tile, scales, groups, x, rows, acc); break;
    }
}
#endif
