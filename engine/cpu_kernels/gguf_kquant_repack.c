/* llama.cpp's K-quant super-blocks (Q4_K, Q5_K, Q6_K) copied straight from the mapped
   file into the kernel's K-quant layouts (grid_formats.h GRID_Q4_K, GRID_Q5_K, GRID_Q6_K),
   rows at a time, with no array in between.

   engine/weights/gguf_kquants.py says what each block holds and, with kquant_pack.py,
   does the same in numpy and torch (the reference the tests compare against, byte for
   byte). That path spreads every code over a byte of its own and permutes it by tile:
   several seconds and about twice the file's bytes of temporaries at load for a Q4_K_M
   file of a gigabyte, where this reads each block once and writes each packed byte once.

   Per super-block of a row (256 values, 8 groups of 32), lane n = the row's place in its
   tile of 16: the codes go into the tile's group vectors at bytes 4n..4n+3 (nibbles, then
   Q5_K's fifth-bit plane or Q6_K's two planes of bits 4-5), the factors into the tile's
   super-block of scales at the lane's byte or half. */
#include <stdint.h>
#include <string.h>

#include "grid_formats.h"

enum { KQ_Q4_K = 0, KQ_Q5_K = 1, KQ_Q6_K = 2 };

static const int64_t kquant_block_bytes[3] = {144, 176, 210};
static const int kquant_grid[3] = {GRID_Q4_K, GRID_Q5_K, GRID_Q6_K};

/* Q4_K's and Q5_K's 12 bytes -> eight 6-bit scales and eight 6-bit mins. */
static void scales_and_mins(const uint8_t *packed, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = packed[j] & 0x3F;
        mn[j] = packed[4 + j] & 0x3F;
        sc[4 + j] = (packed[8 + j] & 0x0F) | (uint8_t)((packed[j] >> 6) << 4);
        mn[4 + j] = (packed[8 + j] >> 4) | (uint8_t)((packed[4 + j] >> 6) << 4);
    }
}

static inline uint32_t word_at(const uint8_t *p) {
    uint32_t w;
    memcpy(&w, p, 4);
    return w;
}

static inline void word_to(uint8_t *p, uint32_t w) { memcpy(p, &w, 4); }

/* A group's nibble vectors at lane bytes `at`: vector v's 4 bytes hold codes 8v + b (low
   nibble) and 8v + 4 + b (high). `base` is the file's 32 bytes of nibbles the group shares
   with its neighbour, `high` whether the group's codes are their high nibbles. Four bytes
   at a time: the codes of one vector are four consecutive file bytes. */
static inline void nibbles_into_tile(const uint8_t *base, int high, uint8_t *at) {
    for (int v = 0; v < 4; v++) {
        const uint32_t lo = word_at(base + 8 * v), hi = word_at(base + 8 * v + 4);
        const uint32_t w = high ? ((lo >> 4) & 0x0F0F0F0Fu) | (hi & 0xF0F0F0F0u)
                                : (lo & 0x0F0F0F0Fu) | ((hi & 0x0F0F0F0Fu) << 4);
        word_to(at + v * 64, w);
    }
}

/* One super-block's codes into the tile's group vectors at lane `lane` (`groups` the
   tile's first group of the super-block): nibbles, then Q5_K's plane (bit j of byte b:
   the fifth bit of code 4j + b) or Q6_K's two (bits 2i of plane p, byte b: bits 4-5 of
   code 4 (4p + i) + b). */
static void codes_into_tile(const uint8_t *block, int type, int fmt, uint8_t *groups,
                            int64_t lane) {
    const int64_t step = group_bytes(fmt);
    if (type == KQ_Q6_K) { /* ql 128 bytes, qh 64: group 4h + c from ql half h, qh half h */
        for (int h = 0; h < 2; h++)
            for (int c = 0; c < 4; c++) {
                uint8_t *at = groups + (4 * h + c) * step + lane * 4;
                nibbles_into_tile(block + h * 64 + (c % 2) * 32, c >= 2, at);
                for (int p = 0; p < 2; p++) {
                    uint32_t w = 0;
                    for (int i = 0; i < 4; i++)
                        w |= ((word_at(block + 128 + h * 32 + 16 * p + 4 * i) >> (2 * c)) &
                              0x03030303u)
                             << (2 * i);
                    word_to(at + 256 + p * 64, w);
                }
            }
        return;
    }
    const uint8_t *qs = block + (type == KQ_Q5_K ? 48 : 16), *qh = block + 16;
    for (int g = 0; g < SUPER_GROUPS; g++) {
        uint8_t *at = groups + g * step + lane * 4;
        nibbles_into_tile(qs + (g / 2) * 32, g % 2, at);
        if (type == KQ_Q5_K) {
            uint32_t w = 0;
            for (int j = 0; j < 8; j++) w |= ((word_at(qh + 4 * j) >> g) & 0x01010101u) << j;
            word_to(at + 256, w);
        }
    }
}

/* The super-block's factors into its tile's block of scales at lane `lane`. */
static void factors_into_tile(const uint8_t *block, int type, uint8_t *scales, int64_t lane) {
    uint16_t *halves = (uint16_t *)scales;
    if (type == KQ_Q6_K) {
        memcpy(&halves[lane], block + 208, 2);
        for (int q = 0; q < 16; q++) scales[32 + q * TILE + lane] = block[192 + q];
        return;
    }
    memcpy(&halves[lane], block, 2);             /* d */
    memcpy(&halves[TILE + lane], block + 2, 2); /* dmin */
    uint8_t sc[8], mn[8];
    scales_and_mins(block + 4, sc, mn);
    for (int g = 0; g < SUPER_GROUPS; g++) {
        scales[64 + g * 32 + lane] = sc[g];
        scales[64 + g * 32 + TILE + lane] = mn[g];
    }
}

/* Rows `row_index[0..n)` (or first_row.. when row_index is NULL) of a tensor of K-quant
   super-blocks (`row_bytes` a row, `supers` super-blocks a row) into rows dst_row0.. of a
   packed weight of the type's layout. `codes` and `scales` are the weight's whole buffers,
   zeroed by the caller where rows are padding. Returns 0, or -2 for an unknown type. */
int gguf_kquant_repack(const uint8_t *src, const int64_t *row_index, int64_t first_row, int64_t n,
                       int64_t row_bytes, int64_t supers, int type, uint8_t *codes,
                       uint8_t *scales, int64_t dst_row0, int threads) {
    if (type < KQ_Q4_K || type > KQ_Q6_K) return -2;
    const int fmt = kquant_grid[type];
    const int64_t block_bytes = kquant_block_bytes[type], groups = supers * SUPER_GROUPS;
    const int64_t w_tile = tile_bytes(fmt, groups), s_tile = tile_scale_bytes(fmt, groups);
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const int64_t source = row_index ? row_index[i] : first_row + i;
        const uint8_t *row = src + source * row_bytes;
        const int64_t r = dst_row0 + i, t = r / TILE, lane = r % TILE;
        for (int64_t s = 0; s < supers; s++) {
            const uint8_t *block = row + s * block_bytes;
            codes_into_tile(block, type, fmt, codes + t * w_tile + s * SUPER_GROUPS * group_bytes(fmt),
                            lane);
            factors_into_tile(block, type, scales + t * s_tile + s * block_scale_bytes(fmt), lane);
        }
    }
    return 0;
}
