/* llama.cpp's Q4_0, Q4_1, Q8_0, Q5_0 and Q5_1 blocks copied straight into the plain grid layouts
   (grid_formats.h, GRID_U4 and GRID_U8), rows at a time, with no array in between.

   engine/weights/gguf_blocks.py says what each block means and does the same in numpy
   (the reference the tests compare against, byte for byte). Doing it here matters at
   load: numpy's codes array (a byte a value), its concatenations and torch's permutes
   cost seconds and leave freed arenas behind for a file of a gigabyte, where this
   reads each block once and writes each packed byte once. */
#include "simd_arch.h"
#include <stdint.h>
#include <string.h>

#include "grid_formats.h"

enum { BLOCKS_Q4_0 = 0, BLOCKS_Q4_1 = 1, BLOCKS_Q8_0 = 2, BLOCKS_Q5_0 = 3, BLOCKS_Q5_1 = 4 };

static inline int block_has_m(int type) { return type == BLOCKS_Q4_1 || type == BLOCKS_Q5_1; }
static inline int block_has_fifth(int type) { return type == BLOCKS_Q5_0 || type == BLOCKS_Q5_1; }

static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

static inline uint16_t float_to_half(float f) {
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

static inline uint16_t read_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* A block's d and its offset m as half; returns 0 when the derived offset overflowed
   half (-8 d, -16 d or -128 d: exact whenever finite). */
static inline int file_block_scales(const uint8_t *block, int type, uint16_t *d, uint16_t *m) {
    *d = read_half(block);
    if (block_has_m(type))
        *m = read_half(block + 2);
    else
        *m = float_to_half(half_to_float(*d) * (type == BLOCKS_Q8_0   ? -128.0f
                                                : type == BLOCKS_Q5_0 ? -16.0f
                                                                      : -8.0f));
    return (*m & 0x7C00) != 0x7C00; /* exponent all ones: inf or nan */
}

/* The four 32-bit words of v into vectors 0-3 of a group, at one lane's bytes. */
static inline void store_words(uint8_t *at, __m128i v) {
    uint32_t words[4];
    _mm_storeu_si128((__m128i *)words, v);
    for (int j = 0; j < 4; j++) memcpy(at + j * 64, &words[j], 4);
}

/* 16 bits as 16 bytes, 0x10 where the bit is set: byte i takes bit i. */
static inline __m128i fifth_bits(uint32_t bits) {
    const __m128i spread = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)bits),
                                            _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    const __m128i which = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    const __m128i set = _mm_cmpeq_epi8(_mm_and_si128(spread, which), which);
    return _mm_and_si128(set, _mm_set1_epi8(0x10));
}

/* One block's codes into its group of a tile, lane `lane` (row lane of the tile): vector
   j of the group holds, at bytes 4 lane.., the codes of k = 4j..4j+3. A Q4 block's byte
   i holds code i (low nibble) and code i + 16 (high); an 8-bit weight takes the codes
   as bytes, a 4-bit one puts vectors 2v and 2v + 1 in the low and high nibbles of its
   vector v, so vector v's 4 bytes are, with A..D the block's nibble bytes 0-3 .. 12-15:
   v0 = lo A | lo B << 4, v1 = lo C | lo D << 4, v2 = hi A | hi B << 4, v3 likewise. */
static inline void block_into_group(const uint8_t *block, int type, int dst_bits, uint8_t *group,
                                    int64_t lane) {
    uint8_t *at = group + lane * 4;
    if (type == BLOCKS_Q8_0) { /* u = q + 128: flip the sign bit */
        const __m256i u =
            _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(block + 2)), _mm256_set1_epi8(-128));
        store_words(at, _mm256_castsi256_si128(u));
        store_words(at + 4 * 64, _mm256_extracti128_si256(u, 1));
        return;
    }
    const int fifth = block_has_fifth(type);
    const int start = (block_has_m(type) ? 4 : 2) + (fifth ? 4 : 0);
    const __m128i q = _mm_loadu_si128((const __m128i *)(block + start));
    const __m128i mask = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    if (fifth) { /* bit j of the 4 bytes before the nibbles: code j's fifth bit (8-bit only) */
        uint32_t bits;
        memcpy(&bits, block + start - 4, 4);
        lo = _mm_or_si128(lo, fifth_bits(bits & 0xFFFF));
        hi = _mm_or_si128(hi, fifth_bits(bits >> 16));
    }
    if (dst_bits == 8) { /* codes 0-15 are lo, 16-31 hi */
        store_words(at, lo);
        store_words(at + 4 * 64, hi);
        return;
    }
    /* lanes 0 and 2 of `low` are v0 and v1, of `high` v2 and v3 */
    const __m128i low = _mm_or_si128(lo, _mm_slli_epi16(_mm_srli_si128(lo, 4), 4));
    const __m128i high = _mm_or_si128(hi, _mm_slli_epi16(_mm_srli_si128(hi, 4), 4));
    store_words(at, _mm_unpacklo_epi64(_mm_shuffle_epi32(low, 0x08), _mm_shuffle_epi32(high, 0x08)));
}

/* Rows `row_index[0..n)` (or first_row.. when row_index is NULL) of a tensor of blocks
   (`row_bytes` a row, `groups` blocks a row) into rows dst_row0.. of a packed weight of
   `dst_bits` (4 or 8; 4-bit blocks go into an 8-bit weight as they are, u < 16 still u).
   `codes` and `scales` are the weight's whole buffers, zeroed by the caller where rows
   are padding. Returns 0; -2 for an unknown block type or an 8-bit block into a 4-bit
   weight (or a Q5 one); -3 when some derived offset overflowed half (the weight is then
   not exact). */
int gguf_grid_repack(const uint8_t *src, const int64_t *row_index, int64_t first_row, int64_t n,
                     int64_t row_bytes, int64_t groups, int type, uint8_t *codes,
                     uint16_t *scales, int64_t dst_row0, int dst_bits, int threads) {
    static const int64_t bytes_of[5] = {18, 20, 34, 22, 24};
    if (type < BLOCKS_Q4_0 || type > BLOCKS_Q5_1 || (dst_bits != 4 && dst_bits != 8)) return -2;
    if ((type == BLOCKS_Q8_0 || block_has_fifth(type)) && dst_bits == 4) return -2;
    const int64_t block_bytes = bytes_of[type];
    const int64_t fmt = dst_bits == 4 ? GRID_U4 : GRID_U8;
    const int64_t w_tile = tile_bytes(fmt, groups), s_tile = tile_scale_bytes(fmt, groups);
    int overflow = 0;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) \
    reduction(| : overflow)
    for (int64_t i = 0; i < n; i++) {
        const int64_t source = row_index ? row_index[i] : first_row + i;
        const uint8_t *row = src + source * row_bytes;
        const int64_t r = dst_row0 + i, t = r / TILE, lane = r % TILE;
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *block = row + g * block_bytes;
            uint16_t d, m;
            overflow |= !file_block_scales(block, type, &d, &m);
            block_into_group(block, type, dst_bits, codes + t * w_tile + g * group_bytes(fmt), lane);
            uint16_t *pair = (uint16_t *)((uint8_t *)scales + t * s_tile) + g * 2 * TILE;
            pair[lane] = d;
            pair[TILE + lane] = m;
        }
    }
    return overflow ? -3 : 0;
}
