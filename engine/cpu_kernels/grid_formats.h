/* What a grid weight's bytes mean, per format (the packers: engine/cpu_kernels/grid_matmul.py
   and kquant_pack.py). Every format keeps, per tile of 16 output rows and per group of 32
   values along K, the codes as 8 vectors of 64 bytes: vector j holds, in lane n, the codes
   of k = 4j..4j+3 of row n (the order vpdpbusd multiplies). What differs is how codes are
   stored and what scales them:

   - GRID_U4, GRID_U8 (llama.cpp's Q4_0, Q4_1, Q8_0 and float32 grids): w = d * u + m per
     group, u in 0..15 (vectors 2i and 2i + 1 in the low and high nibbles of one 64-byte
     vector) or 0..255. Scales per tile and group: 16 d then 16 m, IEEE half.
   - GRID_Q4_K, GRID_Q5_K: super-blocks of 8 groups, w = d * sc * u - dmin * mn, with d and
     dmin half per super-block and sc, mn 6-bit per group. The products d * sc and dmin * mn
     are exact in float32 (11 by 6 significant bits) but not in half, so the scales keep the
     factors: per tile and super-block 16 d and 16 dmin (half), then per group 16 sc and 16
     mn (bytes), multiplied here. Codes: the 4-bit nibbles; Q5_K's fifth bits follow each
     group's nibbles as one 64-byte plane (bit j of byte b: vector j, byte b).
   - GRID_Q6_K: w = d * sc * (u - 32), sc int8 per 16 values, u 6-bit. Scales per tile and
     super-block: 16 d (half), then per group 16 sc of its first 16 values and 16 of its
     last 16 (int8). Codes: the nibbles, then bits 4-5 as a 128-byte plane: vector j's at
     bits 2 (j % 4) of plane vector j / 4.

   Bits a weight, scales included: U4 5, U8 9, Q4_K 4.625, Q5_K 5.625, Q6_K 6.5625. */
#ifndef RESIDENT_GRID_FORMATS_H
#define RESIDENT_GRID_FORMATS_H
#include "simd_arch.h"
#include <stdint.h>

#define GROUP 32
#define TILE 16
/* Groups of 32 in a K-quant super-block of 256 values. */
#define SUPER_GROUPS 8
#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Plain grids are named by their code width, K-quant layouts by ggml's type numbers. */
enum { GRID_U4 = 4, GRID_U8 = 8, GRID_Q4_K = 12, GRID_Q5_K = 13, GRID_Q6_K = 14 };

ALWAYS_INLINE int is_kquant(int fmt) {
    return fmt == GRID_Q4_K || fmt == GRID_Q5_K || fmt == GRID_Q6_K;
}

/* Whether a row of K values is whole groups (whole super-blocks) of a known format. */
static inline int grid_format_fits(int fmt, int64_t K) {
    if (fmt == GRID_U4 || fmt == GRID_U8) return K % GROUP == 0;
    return is_kquant(fmt) && K % (GROUP * SUPER_GROUPS) == 0;
}

/* Bytes of one group's codes in a tile (16 rows x 32 values). */
ALWAYS_INLINE int64_t group_bytes(int fmt) {
    return fmt == GRID_U8 ? 512 : fmt == GRID_Q5_K ? 320 : fmt == GRID_Q6_K ? 384 : 256;
}

/* Groups that share a block of scales, and the bytes of such a block in a tile. */
ALWAYS_INLINE int64_t block_groups(int fmt) { return is_kquant(fmt) ? SUPER_GROUPS : 1; }

ALWAYS_INLINE int64_t block_scale_bytes(int fmt) {
    if (fmt == GRID_Q6_K) return 32 + SUPER_GROUPS * 32;
    return is_kquant(fmt) ? 64 + SUPER_GROUPS * 32 : 64;
}

/* Where a block's per-group scales start. */
ALWAYS_INLINE int64_t group_scales_at(int fmt) { return fmt == GRID_Q6_K ? 32 : 64; }

static inline int64_t tile_bytes(int fmt, int64_t groups) { return groups * group_bytes(fmt); }

static inline int64_t tile_scale_bytes(int fmt, int64_t groups) {
    return groups / block_groups(fmt) * block_scale_bytes(fmt);
}

/* (v & mask) | w, bytewise: vpternlog's truth table for (a & b) | c. */
ALWAYS_INLINE __m512i or_masked(__m512i v, __m512i mask, __m512i w) {
    return _mm512_ternarylogic_epi32(v, mask, w, 0xEA);
}

/* 64 bytes into a register, once: GCC folds a load into every instruction that reads
   it (the and and the shift of a nibble vector, a plane's shifts), which reads the same
   bytes two to eight times and costs a 4-bit product from cache about 6% (Q5_K 10%). */
ALWAYS_INLINE __m512i load_once(const uint8_t *src) {
    __m512i v = _mm512_loadu_si512(src);
#ifdef RESIDENT_AVX2
    __asm__("" : "+x"(v.lo), "+x"(v.hi));
#else
    __asm__("" : "+v"(v));
#endif
    return v;
}

/* One group's codes of a tile as 8 vectors of unsigned bytes (vector j, lane n: the
   codes of k = 4j..4j+3 of row n). Shifting 16-bit lanes by at most 4 keeps a byte's
   bits 4-5 from its own byte, so the planes' bits move into place two lanes at a time. */
ALWAYS_INLINE void group_vectors(int fmt, const uint8_t *src, __m512i w[8]) {
    if (fmt == GRID_U8) {
        for (int j = 0; j < 8; j++) w[j] = _mm512_loadu_si512(src + 64 * j);
        return;
    }
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 4; j++) {
        const __m512i v = load_once(src + 64 * j);
        w[2 * j] = _mm512_and_si512(v, low);
        w[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
    if (fmt == GRID_Q5_K) {
        const __m512i p = load_once(src + 256), bit = _mm512_set1_epi8(0x10);
        w[0] = or_masked(_mm512_slli_epi16(p, 4), bit, w[0]);
        w[1] = or_masked(_mm512_slli_epi16(p, 3), bit, w[1]);
        w[2] = or_masked(_mm512_slli_epi16(p, 2), bit, w[2]);
        w[3] = or_masked(_mm512_slli_epi16(p, 1), bit, w[3]);
        w[4] = or_masked(p, bit, w[4]);
        w[5] = or_masked(_mm512_srli_epi16(p, 1), bit, w[5]);
        w[6] = or_masked(_mm512_srli_epi16(p, 2), bit, w[6]);
        w[7] = or_masked(_mm512_srli_epi16(p, 3), bit, w[7]);
    } else if (fmt == GRID_Q6_K) {
        const __m512i bits = _mm512_set1_epi8(0x30);
        for (int h = 0; h < 2; h++) {
            const __m512i p = load_once(src + 256 + 64 * h);
            w[4 * h] = or_masked(_mm512_slli_epi16(p, 4), bits, w[4 * h]);
            w[4 * h + 1] = or_masked(_mm512_slli_epi16(p, 2), bits, w[4 * h + 1]);
            w[4 * h + 2] = or_masked(p, bits, w[4 * h + 2]);
            w[4 * h + 3] = or_masked(_mm512_srli_epi16(p, 2), bits, w[4 * h + 3]);
        }
    }
}

/* A K-quant super-block's per-row factors, 16 rows: d, and -dmin (Q4_K, Q5_K). */
typedef struct {
    __m512 d, neg_dmin;
} BlockScales;

/* What one group's codes are multiplied by, 16 rows: w = step * u + offset, or for Q6_K
   step over the first 16 values and step2 over the last 16 (offset -32 step: grid_tiles.h
   subtracts it in the integers). */
typedef struct {
    __m512 step, offset, step2;
} GroupScales;

ALWAYS_INLINE __m512 half16(const uint8_t *src) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)src));
}

ALWAYS_INLINE __m512 unsigned16(const uint8_t *src) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)src)));
}

ALWAYS_INLINE __m512 signed16(const uint8_t *src) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)src)));
}

ALWAYS_INLINE BlockScales block_scales(int fmt, const uint8_t *block) {
    BlockScales s = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    if (is_kquant(fmt)) s.d = half16(block);
    if (fmt == GRID_Q4_K || fmt == GRID_Q5_K)
        s.neg_dmin = _mm512_sub_ps(_mm512_setzero_ps(), half16(block + 32));
    return s;
}

/* Group j of a block whose scales start at `block`. Every product here is exact. */
ALWAYS_INLINE GroupScales group_scales(int fmt, BlockScales b, const uint8_t *block, int64_t j) {
    GroupScales s = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    if (!is_kquant(fmt)) {
        s.step = half16(block);
        s.offset = half16(block + 32);
        return s;
    }
    const uint8_t *sub = block + group_scales_at(fmt) + j * 32;
    if (fmt == GRID_Q6_K) {
        s.step = _mm512_mul_ps(b.d, signed16(sub));
        s.step2 = _mm512_mul_ps(b.d, signed16(sub + TILE));
    } else {
        s.step = _mm512_mul_ps(b.d, unsigned16(sub));
        s.offset = _mm512_mul_ps(b.neg_dmin, unsigned16(sub + TILE));
    }
    return s;
}
#endif
