/* Prefill attention over the paged KV cache: many query tokens per sequence,
   causal over the whole context (a cached prefix plus this step's tokens).

   torch's CPU SDPA runs its flash kernel in float32 arithmetic and, with the
   explicit mask a chunk over a cached prefix needs, cannot skip the blocks
   above the diagonal. This kernel uses AVX-512 BF16 dot products (32
   multiply-adds an instruction, float32 sums) for both products (the AVX2 build:
   float32 FMAs over float32 copies of the same values, paged_prefill_fma.h):

   1. For one sequence and KV head, the context's K and V rows are read from
      the pages once (BF16, or FP8 bytes, whose values are exact in BF16) and
      packed for the dot-product instruction: K as [block][D/2][32 keys] pairs
      of dimensions, V as [block][16][D] pairs of keys (AVX2: float32, K as
      [block][D][32 keys], V as [block][32 keys][D]).
   2. Query blocks of 16 tokens (all query heads of the KV head: a token's
      group of heads shares every K/V block) walk the key blocks up to their
      last token's position with an online softmax in float32. The
      probabilities are rounded to BF16 for the V product, as torch's BF16
      flash kernel does.

   Queries and output are BF16 [T, Hq, D]; a sequence's queries are the last
   q_lens[b] positions of its context. K and V factors carry the FP8 scales. */
#ifndef RESIDENT_AVX2
#pragma GCC target("avx512bf16")
#endif
#include "simd_arch.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

enum { KEYS = 32, QUERY_BLOCK = 16 };
#ifdef RESIDENT_AVX2
enum { FMA_FORM = 1 };
#else
enum { FMA_FORM = 0 };
#endif

/* 16 stored values (BF16 or FP8 bytes) -> float32 (both exact in BF16 and float32). */
static inline __m512 bf16_row16_float(const uint8_t *src, int kind) {
    if (kind == KV_BF16) return bf16x16_load(src);
    __m256i bits = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)src));
    bits = _mm256_and_si256(_mm256_slli_epi16(bits, 7), _mm256_set1_epi16((short)0xBF80));
    return _mm512_cvtph_ps(bits);
}

/* The products: the AVX2 build's float32 FMA form (paged_prefill_fma.h), or AVX-512 BF16
   dot products of packed pairs. */
#ifdef RESIDENT_AVX2
#include "paged_prefill_fma.h"
#else
static inline __m512 dot(__m512 acc, uint32_t pair, __m512i packed) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32((int)pair), (__m512bh)packed);
}

/* 16 stored values (BF16 or FP8 bytes) -> their BF16 bits. FP8 values are
   exact in BF16, so only the representation changes. */
static inline __m256i load_bf16_row16(const uint8_t *src, int kind) {
    if (kind == KV_BF16) return _mm256_loadu_si256((const __m256i *)src);
    return bf16x16_from(bf16_row16_float(src, kind));
}

/* Pack keys [16 * block, 16 * block + 16) of one KV head; keys past len are zero. */
static void pack_block(const uint8_t *kv, int kind, int64_t elem, int64_t kv_heads, int64_t head,
                       int64_t D, const int64_t *slots, int64_t len, int64_t block,
                       uint32_t *k_packed, uint32_t *v_packed) {
    const int64_t slot_elems = 2 * kv_heads * D;
    uint16_t k_row[256], v_rows[KEYS][256];
    for (int64_t j = 0; j < KEYS; j++) {
        const int64_t key = block * KEYS + j;
        if (key >= len) {
            memset(k_row, 0, sizeof(uint16_t) * D);
            memset(v_rows[j], 0, sizeof(uint16_t) * D);
        } else {
            const uint8_t *k = kv + (slots[key] * slot_elems + head * D) * elem;
            const uint8_t *v = kv + (slots[key] * slot_elems + (kv_heads + head) * D) * elem;
            for (int64_t c = 0; c < D; c += 16) {
                _mm256_storeu_si256((__m256i *)(k_row + c), load_bf16_row16(k + c * elem, kind));
                _mm256_storeu_si256((__m256i *)(v_rows[j] + c), load_bf16_row16(v + c * elem, kind));
            }
        }
        const uint32_t *k_pairs = (const uint32_t *)k_row;
        for (int64_t p = 0; p < D / 2; p++) k_packed[p * KEYS + j] = k_pairs[p];
    }
    for (int64_t p = 0; p < KEYS / 2; p++)
        for (int64_t d = 0; d < D; d++)
            v_packed[p * D + d] = (uint32_t)v_rows[2 * p][d] | (uint32_t)v_rows[2 * p + 1][d] << 16;
}

/* Scores of `rows` query rows (BF16 pairs) against one packed K block of 32 keys. */
static void block_scores(const uint32_t *const *q_rows, int64_t rows, int64_t D,
                         const uint32_t *k_packed, float scale, float *scores) {
    const __m512 factor = _mm512_set1_ps(scale);
    int64_t r = 0;
    for (; r + 8 <= rows; r += 8) {
        __m512 lo[8], hi[8];
        for (int i = 0; i < 8; i++) lo[i] = hi[i] = _mm512_setzero_ps();
        for (int64_t p = 0; p < D / 2; p++) {
            const __m512i k0 = _mm512_loadu_si512(k_packed + p * KEYS);
            const __m512i k1 = _mm512_loadu_si512(k_packed + p * KEYS + 16);
            for (int i = 0; i < 8; i++) {
                const uint32_t pair = q_rows[r + i][p];
                lo[i] = dot(lo[i], pair, k0);
                hi[i] = dot(hi[i], pair, k1);
            }
        }
        for (int i = 0; i < 8; i++) {
            _mm512_storeu_ps(scores + (r + i) * KEYS, _mm512_mul_ps(lo[i], factor));
            _mm512_storeu_ps(scores + (r + i) * KEYS + 16, _mm512_mul_ps(hi[i], factor));
        }
    }
    for (; r < rows; r++) {
        __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
        for (int64_t p = 0; p < D / 2; p++) {
            lo = dot(lo, q_rows[r][p], _mm512_loadu_si512(k_packed + p * KEYS));
            hi = dot(hi, q_rows[r][p], _mm512_loadu_si512(k_packed + p * KEYS + 16));
        }
        _mm512_storeu_ps(scores + r * KEYS, _mm512_mul_ps(lo, factor));
        _mm512_storeu_ps(scores + r * KEYS + 16, _mm512_mul_ps(hi, factor));
    }
}

/* acc[r] = acc[r] * rescale[r] + probs[r] . V for one packed V block. */
static void block_values(float *acc, int64_t rows, int64_t D, const uint32_t *probs,
                         const float *rescale, const uint32_t *v_packed) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        int64_t c = 0;
        for (; c + 64 <= D; c += 64) {
            __m512 o[4][4];
            for (int i = 0; i < 4; i++)
                for (int k = 0; k < 4; k++)
                    o[i][k] = _mm512_mul_ps(_mm512_loadu_ps(acc + (r + i) * D + c + 16 * k),
                                            _mm512_set1_ps(rescale[r + i]));
            for (int64_t p = 0; p < KEYS / 2; p++) {
                for (int k = 0; k < 4; k++) {
                    const __m512i v = _mm512_loadu_si512(v_packed + p * D + c + 16 * k);
                    for (int i = 0; i < 4; i++) o[i][k] = dot(o[i][k], probs[(r + i) * (KEYS / 2) + p], v);
                }
            }
            for (int i = 0; i < 4; i++)
                for (int k = 0; k < 4; k++) _mm512_storeu_ps(acc + (r + i) * D + c + 16 * k, o[i][k]);
        }
        for (; c < D; c += 16)
            for (int i = 0; i < 4; i++) {
                __m512 o = _mm512_mul_ps(_mm512_loadu_ps(acc + (r + i) * D + c),
                                         _mm512_set1_ps(rescale[r + i]));
                for (int64_t p = 0; p < KEYS / 2; p++)
                    o = dot(o, probs[(r + i) * (KEYS / 2) + p], _mm512_loadu_si512(v_packed + p * D + c));
                _mm512_storeu_ps(acc + (r + i) * D + c, o);
            }
    }
    for (; r < rows; r++)
        for (int64_t c = 0; c < D; c += 16) {
            __m512 o = _mm512_mul_ps(_mm512_loadu_ps(acc + r * D + c), _mm512_set1_ps(rescale[r]));
            for (int64_t p = 0; p < KEYS / 2; p++)
                o = dot(o, probs[r * (KEYS / 2) + p], _mm512_loadu_si512(v_packed + p * D + c));
            _mm512_storeu_ps(acc + r * D + c, o);
        }
}

#endif

typedef struct {
    float *scores, *acc, *top, *total, *rescale;
    uint32_t *probs;
    const uint32_t **q_rows;
    float *q_f, *probs_f; /* AVX2: the block's queries and probabilities in float32 */
} Scratch;

/* One block of query tokens of one sequence and KV head. */
static void attend_block(const uint16_t *q, uint16_t *out, int64_t Hq, int64_t group, int64_t D,
                         int64_t head, int64_t first, int64_t tokens, int64_t first_pos,
                         const uint32_t *k_packed, const uint32_t *v_packed, float scale,
                         float v_factor, const Scratch *s) {
    const int64_t rows = tokens * group;
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t g = 0; g < group; g++) {
            const int64_t r = t * group + g;
            s->q_rows[r] = (const uint32_t *)(q + ((first + t) * Hq + head * group + g) * D);
            s->top[r] = -INFINITY;
            s->total[r] = 0.0f;
        }
    memset(s->acc, 0, sizeof(float) * rows * D);
#ifdef RESIDENT_AVX2
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < D; c += 16)
            _mm512_storeu_ps(s->q_f + r * D + c, bf16x16_load(s->q_rows[r] + c / 2));
#endif
    const int64_t last_pos = first_pos + tokens - 1, blocks = last_pos / KEYS + 1;
    for (int64_t b = 0; b < blocks; b++) {
#ifdef RESIDENT_AVX2
        const float *kb = (const float *)k_packed + b * D * KEYS;
        const float *vb = (const float *)v_packed + b * KEYS * D;
        block_scores_fma(s->q_f, rows, D, kb, scale, s->scores);
#else
        const uint32_t *kb = k_packed + b * (D / 2) * KEYS, *vb = v_packed + b * (KEYS / 2) * D;
        block_scores(s->q_rows, rows, D, kb, scale, s->scores);
#endif
        for (int64_t r = 0; r < rows; r++) {
            const int64_t pos = first_pos + r / group, visible = pos - b * KEYS + 1;
            const __mmask16 m0 = tail_mask(visible > 0 ? visible : 0);
            const __mmask16 m1 = tail_mask(visible > 16 ? visible - 16 : 0);
            const __m512 x0 = _mm512_loadu_ps(s->scores + r * KEYS);
            const __m512 x1 = _mm512_loadu_ps(s->scores + r * KEYS + 16);
            const __m512 both = _mm512_max_ps(_mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), m0, x0),
                                              _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), m1, x1));
            const float top = fmaxf(s->top[r], _mm512_reduce_max_ps(both));
            const __m512 shift = _mm512_set1_ps(top);
            const __m512 p0 = _mm512_maskz_mov_ps(m0, exp512(_mm512_sub_ps(x0, shift)));
            const __m512 p1 = _mm512_maskz_mov_ps(m1, exp512(_mm512_sub_ps(x1, shift)));
            const float rescale = m0 ? expf(s->top[r] - top) : 1.0f;
            s->total[r] = s->total[r] * rescale + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
            s->top[r] = top;
            s->rescale[r] = rescale;
#ifdef RESIDENT_AVX2
            _mm512_storeu_ps(s->probs_f + r * KEYS, bf16x16_round(p0));
            _mm512_storeu_ps(s->probs_f + r * KEYS + 16, bf16x16_round(p1));
        }
        block_values_fma(s->acc, rows, D, s->probs_f, s->rescale, vb);
#else
            _mm256_storeu_si256((__m256i *)(s->probs + r * (KEYS / 2)), bf16x16_from(p0));
            _mm256_storeu_si256((__m256i *)(s->probs + r * (KEYS / 2) + 8), bf16x16_from(p1));
        }
        block_values(s->acc, rows, D, s->probs, s->rescale, vb);
#endif
    }
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t g = 0; g < group; g++) {
            const int64_t r = t * group + g;
            const __m512 norm = _mm512_set1_ps(v_factor / s->total[r]);
            uint16_t *dst = out + ((first + t) * Hq + head * group + g) * D;
            for (int64_t c = 0; c < D; c += 16)
                row16_store(dst + c, _mm512_mul_ps(_mm512_loadu_ps(s->acc + r * D + c), norm), 1,
                            0xFFFF);
        }
}

/* q, out [T, Hq, D] BF16, sequence b's queries at rows q_starts[b] .. + q_lens[b]; slots
   [B, L] (row b valid up to lens[b] >= q_lens[b]); k_factor/v_factor [Hkv]; kv_kind 1
   BF16 or 2 FP8 bytes. D a multiple of 16, at most 256. Returns 0; -1 without memory;
   -2 when the CPU lacks AVX-512 BF16. */
int paged_prefill(const uint16_t *q, const uint8_t *kv, int kv_kind, const int64_t *slots,
                  const int64_t *lens, const int64_t *q_starts, const int64_t *q_lens, int64_t B,
                  int64_t L, int64_t Hq, int64_t Hkv, int64_t D, const float *k_factor,
                  const float *v_factor, float softmax_scale, uint16_t *out, int threads) {
#ifndef RESIDENT_AVX2
    if (!__builtin_cpu_supports("avx512bf16")) return -2;
#endif
    const int64_t group = Hq / Hkv, elem = kv_kind == KV_BF16 ? 2 : 1;
    const int64_t max_blocks = (L + KEYS - 1) / KEYS, rows = QUERY_BLOCK * group;
    /* 32-bit words a block: BF16 pairs, or on AVX2 float32 values */
    const int64_t block_words = FMA_FORM ? KEYS * D : KEYS * D / 2;
    uint32_t *k_packed = malloc(sizeof(uint32_t) * (size_t)(max_blocks * block_words + 1));
    uint32_t *v_packed = malloc(sizeof(uint32_t) * (size_t)(max_blocks * block_words + 1));
    int failed = !k_packed || !v_packed;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        Scratch s = {
            .scores = malloc(sizeof(float) * (size_t)(rows * KEYS)),
            .acc = malloc(sizeof(float) * (size_t)(rows * D)),
            .top = malloc(sizeof(float) * (size_t)rows),
            .total = malloc(sizeof(float) * (size_t)rows),
            .rescale = malloc(sizeof(float) * (size_t)rows),
            .probs = malloc(sizeof(uint32_t) * (size_t)(rows * KEYS / 2)),
            .q_rows = malloc(sizeof(uint32_t *) * (size_t)rows),
            .q_f = malloc(sizeof(float) * (size_t)(FMA_FORM ? rows * D : 1)),
            .probs_f = malloc(sizeof(float) * (size_t)(FMA_FORM ? rows * KEYS : 1)),
        };
        if (!s.scores || !s.acc || !s.top || !s.total || !s.rescale || !s.probs || !s.q_rows ||
            !s.q_f || !s.probs_f) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        for (int64_t task = 0; task < B * Hkv && !failed; task++) {
            const int64_t b = task / Hkv, h = task % Hkv, len = lens[b];
            const int64_t blocks = (len + KEYS - 1) / KEYS;
            const int64_t query_blocks = (q_lens[b] + QUERY_BLOCK - 1) / QUERY_BLOCK;
#pragma omp for schedule(static)
            for (int64_t block = 0; block < blocks; block++)
#ifdef RESIDENT_AVX2
                pack_block_fma(kv, kv_kind, elem, Hkv, h, D, slots + b * L, len, block,
                               (float *)k_packed + block * block_words,
                               (float *)v_packed + block * block_words);
#else
                pack_block(kv, kv_kind, elem, Hkv, h, D, slots + b * L, len, block,
                           k_packed + block * block_words, v_packed + block * block_words);
#endif
            /* the last query blocks see the most keys: hand them out first */
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < query_blocks; i++) {
                const int64_t qb = query_blocks - 1 - i, first = qb * QUERY_BLOCK;
                const int64_t tokens = q_lens[b] - first < QUERY_BLOCK ? q_lens[b] - first : QUERY_BLOCK;
                attend_block(q, out, Hq, group, D, h, q_starts[b] + first, tokens,
                             len - q_lens[b] + first, k_packed, v_packed,
                             softmax_scale * k_factor[h], v_factor[h], &s);
            }
        }
        free(s.scores), free(s.acc), free(s.top), free(s.total), free(s.rescale), free(s.probs);
        free(s.q_rows), free(s.q_f), free(s.probs_f);
    }
    free(k_packed), free(v_packed);
    return failed ? -1 : 0;
}
