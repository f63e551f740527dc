/* What mla_decode.c's attention pass shares with its AVX2 form (mla_attend_lanes.c):
   the shape, the per-thread scratch, and the decoding of cached rows into a tile. */
#ifndef RESIDENT_MLA_ATTEND_H
#define RESIDENT_MLA_ATTEND_H
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

/* SPAN rows at a time; up to MAX_BLOCK heads share each decoded tile. Fetching
   and decoding a row costs about what one head's work on it does, so the more
   heads share it the better, though 16 heads' accumulators (2 KB each for Kimi)
   and the tile (36 KB) spill L1: measured 15% faster than blocks of 8 at 4k rows,
   40% faster than blocks of 4. */
enum { SPAN = 16, MAX_BLOCK = 16 };

/* Scratch rows are padded: the latent part to a multiple of 64 (the
   accumulation runs over 4 vectors at a time), the rope part to 16. */
struct mla_shape {
    int64_t H, nope, rope, v, r;
    int64_t lat_w, width; /* padded latent part; padded whole row */
};

/* Per-thread scratch of the attention pass (sized for MAX_BLOCK heads). */
struct mla_scratch {
    float *tile;    /* [SPAN][width] decoded rows */
    float *acc;     /* [MAX_BLOCK][lat_w]; the AVX2 form: [lat_w][MAX_BLOCK] */
    float *p;       /* [MAX_BLOCK][SPAN] this tile's weights; AVX2: [SPAN][MAX_BLOCK] */
    float *stats;   /* [3][MAX_BLOCK]: running max, running sum, this tile's rescale */
    float *queries; /* AVX2: [width][MAX_BLOCK] the block's queries, heads in lanes */
    float *scores;  /* AVX2: [SPAN][MAX_BLOCK] */
};

static inline __mmask16 lanes(int64_t remaining) {
    return remaining <= 0 ? 0 : tail_mask(remaining);
}

/* 16 stored row values (float32, bf16 or e4m3 bytes), masked-off lanes zero. FP8
   bytes are read as the half holding value * 2**-8 (the caller's factors carry 2**8). */
static inline __m512 row_load(const uint8_t *src, int kind, __mmask16 m) {
    if (kind == KV_FLOAT32) return _mm512_maskz_loadu_ps(m, src);
    if (kind == KV_BF16) return bf16x16_load_masked(src, m);
    __m256i bits = _mm256_cvtepi8_epi16(_mm_maskz_loadu_epi8(m, src));
    bits = _mm256_and_si256(_mm256_slli_epi16(bits, 7), _mm256_set1_epi16((short)0xBF80));
    return _mm512_cvtph_ps(bits);
}

/* 16 e4m3 bytes -> float32 as row_load reads them, without a mask. */
static inline __m512 fp8x16_load(const uint8_t *src) {
    __m256i bits = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)src));
    bits = _mm256_and_si256(_mm256_slli_epi16(bits, 7), _mm256_set1_epi16((short)0xBF80));
    return _mm512_cvtph_ps(bits);
}

/* tile[i] (width floats, the padding zero) = cached row slots[i], for i < n. FP8 rows
   whose parts are whole vectors (Kimi's, DeepSeek's) take a loop with no mask and no
   test of the kind per vector. */
static inline void decode_tile(const struct mla_shape *s, const uint8_t *rows, int kind,
                               const int64_t *slots, int64_t n, float *tile) {
    const int64_t elem = kind == KV_FLOAT32 ? 4 : kind == KV_BF16 ? 2 : 1;
    const int64_t row_elems = s->r + s->rope, lat_w = s->lat_w;
    if (kind == KV_FP8 && s->r == lat_w && s->lat_w + s->rope == s->width) {
        for (int64_t i = 0; i < n; i++) {
            const uint8_t *src = rows + slots[i] * row_elems;
            float *dst = tile + i * s->width;
            for (int64_t c = 0; c < row_elems; c += 16)
                _mm512_storeu_ps(dst + c, fp8x16_load(src + c));
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *src = rows + slots[i] * row_elems * elem;
        float *dst = tile + i * s->width;
        for (int64_t c = 0; c < lat_w; c += 16)
            _mm512_storeu_ps(dst + c, row_load(src + c * elem, kind, lanes(s->r - c)));
        for (int64_t c = 0; c < s->width - lat_w; c += 16)
            _mm512_storeu_ps(dst + lat_w + c,
                             row_load(src + (s->r + c) * elem, kind, lanes(s->rope - c)));
    }
}

/* One sequence's len rows against `heads` (<= MAX_BLOCK) absorbed queries
   [heads][width] -> o_lat [heads][lat_w] = latent_factor * softmax . latents. */
void mla_attend_lanes(const struct mla_shape *s, const float *queries, int64_t heads,
                      const uint8_t *rows, int kind, const int64_t *slots, int64_t len,
                      float latent_factor, const struct mla_scratch *w, float *o_lat);
#endif
