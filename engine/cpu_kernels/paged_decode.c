/* Decode attention over the paged KV cache: one query token per sequence.

   Reads K and V in place from the pages (float32, bfloat16, or FP8 e4m3
   bytes) instead of gathering and converting the whole context first, as
   the torch path must. Per sequence and KV head: the scores of its group of
   query heads against every context position, a softmax in float32, then the
   weighted sum of V rows.

   Layer storage: [slots, 2, kv_heads, head_dim], K then V per slot. An FP8
   byte is read as the IEEE half holding value * 2**-8 (engine/kv/quant.py);
   the caller's K and V factors carry the scale and the 2**8. */
#include "simd_arch.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"
#include "simd.h"

static inline __m512 load_row16(const uint8_t *src, int kind) {
    if (kind == KV_FLOAT32) return _mm512_loadu_ps(src);
    if (kind == KV_BF16) return bf16x16_load(src);
    __m256i bits = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)src));
    bits = _mm256_and_si256(_mm256_slli_epi16(bits, 7), _mm256_set1_epi16((short)0xBF80));
    return _mm512_cvtph_ps(bits);
}


static void softmax_rows(float *scores, int64_t rows, int64_t len, float *totals) {
    for (int64_t g = 0; g < rows; g++) {
        float *row = scores + g * len;
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        for (int64_t l = 0; l < len; l += 16)
            vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail_mask(len - l), row + l));
        const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
        __m512 vsum = _mm512_setzero_ps();
        for (int64_t l = 0; l < len; l += 16) {
            const __mmask16 m = tail_mask(len - l);
            __m512 p = _mm512_maskz_mov_ps(m, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + l), top)));
            _mm512_mask_storeu_ps(row + l, m, p);
            vsum = _mm512_add_ps(vsum, p);
        }
        totals[g] = _mm512_reduce_add_ps(vsum);
    }
}

/* One sequence, one KV head: out[g] for its `group` query heads, any head_dim
   that is a multiple of 16 (the fixed forms below take 64 and 128). */
static void attend(const float *q, int64_t group, int64_t D, const uint8_t *kv, int kind,
                   int64_t elem, int64_t kv_heads, int64_t head, const int64_t *slots,
                   int64_t len, float v_factor, float *scores, float *acc, float *totals,
                   void *out, int out_bf16) {
    const int64_t chunks = D / 16, slot_elems = 2 * kv_heads * D;
    for (int64_t l = 0; l < len; l++) {
        const uint8_t *k = kv + (slots[l] * slot_elems + head * D) * elem;
        __m512 krow[16];
        for (int64_t c = 0; c < chunks; c++) krow[c] = load_row16(k + c * 16 * elem, kind);
        for (int64_t g = 0; g < group; g++) {
            __m512 s = _mm512_setzero_ps();
            for (int64_t c = 0; c < chunks; c++)
                s = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * D + c * 16), krow[c], s);
            scores[g * len + l] = _mm512_reduce_add_ps(s);
        }
    }
    softmax_rows(scores, group, len, totals);
    for (int64_t i = 0; i < group * D; i += 16) _mm512_storeu_ps(acc + i, _mm512_setzero_ps());
    for (int64_t l = 0; l < len; l++) {
        const uint8_t *v = kv + (slots[l] * slot_elems + (kv_heads + head) * D) * elem;
        __m512 vrow[16];
        for (int64_t c = 0; c < chunks; c++) vrow[c] = load_row16(v + c * 16 * elem, kind);
        for (int64_t g = 0; g < group; g++) {
            const __m512 p = _mm512_set1_ps(scores[g * len + l]);
            for (int64_t c = 0; c < chunks; c++) {
                float *a = acc + g * D + c * 16;
                _mm512_storeu_ps(a, _mm512_fmadd_ps(p, vrow[c], _mm512_loadu_ps(a)));
            }
        }
    }
    const int out_elem = out_bf16 ? 2 : 4;
    for (int64_t g = 0; g < group; g++) {
        const __m512 norm = _mm512_set1_ps(v_factor / totals[g]);
        for (int64_t c = 0; c < chunks; c++)
            row16_store((char *)out + (g * D + c * 16) * out_elem,
                        _mm512_mul_ps(_mm512_loadu_ps(acc + g * D + c * 16), norm), out_bf16, 0xFFFF);
    }
}

/* Up to 4 query heads of one KV head, head_dim = 16 * CH, with the queries and
   the output accumulators in registers. */
#define DEFINE_ATTEND_FIXED(GS, CH)                                                                  \
    static void attend_##GS##_##CH(const float *q, const uint8_t *kv, int kind, int64_t elem,        \
                                   int64_t kv_heads, int64_t head, const int64_t *slots,             \
                                   int64_t len, float v_factor, float *scores, float *totals,        \
                                   void *out, int out_bf16) {                                        \
        const int64_t D = 16 * CH, slot_elems = 2 * kv_heads * D;                                    \
        __m512 qv[GS][CH];                                                                           \
        for (int g = 0; g < GS; g++)                                                                 \
            for (int c = 0; c < CH; c++) qv[g][c] = _mm512_loadu_ps(q + g * D + c * 16);            \
        for (int64_t l0 = 0; l0 < len; l0 += 16) {                                                   \
            const int64_t n = len - l0 < 16 ? len - l0 : 16;                                         \
            __m512 part[GS][16];                                                                     \
            for (int64_t i = 0; i < 16; i++) {                                                       \
                if (i >= n) {                                                                        \
                    for (int g = 0; g < GS; g++) part[g][i] = _mm512_setzero_ps();                   \
                    continue;                                                                        \
                }                                                                                    \
                const uint8_t *k = kv + (slots[l0 + i] * slot_elems + head * D) * elem;              \
                __m512 s[GS];                                                                        \
                for (int g = 0; g < GS; g++) s[g] = _mm512_setzero_ps();                             \
                for (int c = 0; c < CH; c++) {                                                       \
                    const __m512 kc = load_row16(k + c * 16 * elem, kind);                           \
                    for (int g = 0; g < GS; g++) s[g] = _mm512_fmadd_ps(qv[g][c], kc, s[g]);         \
                }                                                                                    \
                for (int g = 0; g < GS; g++) part[g][i] = s[g];                                      \
            }                                                                                        \
            for (int g = 0; g < GS; g++)                                                             \
                _mm512_mask_storeu_ps(scores + g * len + l0, tail_mask(n), reduce16(part[g]));       \
        }                                                                                            \
        softmax_rows(scores, GS, len, totals);                                                       \
        __m512 acc[GS][CH];                                                                          \
        for (int g = 0; g < GS; g++)                                                                 \
            for (int c = 0; c < CH; c++) acc[g][c] = _mm512_setzero_ps();                            \
        for (int64_t l = 0; l < len; l++) {                                                          \
            const uint8_t *v = kv + (slots[l] * slot_elems + (kv_heads + head) * D) * elem;          \
            __m512 p[GS];                                                                            \
            for (int g = 0; g < GS; g++) p[g] = _mm512_set1_ps(scores[g * len + l]);                 \
            for (int c = 0; c < CH; c++) {                                                           \
                const __m512 vc = load_row16(v + c * 16 * elem, kind);                               \
                for (int g = 0; g < GS; g++) acc[g][c] = _mm512_fmadd_ps(p[g], vc, acc[g][c]);       \
            }                                                                                        \
        }                                                                                            \
        const int out_elem = out_bf16 ? 2 : 4;                                                       \
        for (int g = 0; g < GS; g++) {                                                               \
            const __m512 norm = _mm512_set1_ps(v_factor / totals[g]);                                \
            for (int c = 0; c < CH; c++)                                                             \
                row16_store((char *)out + (g * D + c * 16) * out_elem,                               \
                            _mm512_mul_ps(acc[g][c], norm), out_bf16, 0xFFFF);                               \
        }                                                                                            \
    }

DEFINE_ATTEND_FIXED(1, 4)
DEFINE_ATTEND_FIXED(2, 4)
DEFINE_ATTEND_FIXED(3, 4)
DEFINE_ATTEND_FIXED(4, 4)
DEFINE_ATTEND_FIXED(1, 8)
DEFINE_ATTEND_FIXED(2, 8)
DEFINE_ATTEND_FIXED(3, 8)
DEFINE_ATTEND_FIXED(4, 8)

typedef void (*attend_fixed_fn)(const float *, const uint8_t *, int, int64_t, int64_t, int64_t,
                                const int64_t *, int64_t, float, float *, float *, void *, int);
static const attend_fixed_fn ATTEND_FIXED[2][4] = {
    {attend_1_4, attend_2_4, attend_3_4, attend_4_4},
    {attend_1_8, attend_2_8, attend_3_8, attend_4_8},
};

/* q [B, Hq, D], out [B, Hq, D]; slots [B, L] (row b valid up to lens[b]);
   k_factor/v_factor [Hkv]; kv_kind 0 float32, 1 bf16, 2 fp8 bytes.
   D must be a multiple of 16, at most 256; a sequence needs lens[b] >= 1. Returns 0, or -1 without memory. */
int paged_decode(const void *q, int q_bf16, const uint8_t *kv, int kv_kind, const int64_t *slots,
                 const int64_t *lens, int64_t B, int64_t L, int64_t Hq, int64_t Hkv, int64_t D,
                 const float *k_factor, const float *v_factor, float softmax_scale, void *out,
                 int out_bf16, int threads) {
    const int64_t group = Hq / Hkv, elem = kv_kind == KV_FLOAT32 ? 4 : kv_kind == KV_BF16 ? 2 : 1;
    const int q_elem = q_bf16 ? 2 : 4, out_elem = out_bf16 ? 2 : 4;
    int failed = 0;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        float *scores = malloc(sizeof(float) * (size_t)(group * (L > 0 ? L : 1)));
        float *qf = malloc(sizeof(float) * (size_t)(group * D));
        float *acc = malloc(sizeof(float) * (size_t)(group * D));
        float *totals = malloc(sizeof(float) * (size_t)group);
        if (!scores || !qf || !acc || !totals) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < B * Hkv; task++) {
            if (failed) continue;
            const int64_t b = task / Hkv, h = task % Hkv;
            const float qscale = softmax_scale * k_factor[h];
            for (int64_t g = 0; g < group; g++)
                for (int64_t c = 0; c < D / 16; c++) {
                    const char *src = (const char *)q + ((b * Hq + h * group + g) * D + c * 16) * q_elem;
                    _mm512_storeu_ps(qf + g * D + c * 16,
                                     _mm512_mul_ps(row16_load(src, q_bf16), _mm512_set1_ps(qscale)));
                }
            char *dst = (char *)out + (b * Hq + h * group) * D * out_elem;
            if (D == 64 || D == 128) {
                /* query heads four at a time, queries and accumulators in registers */
                for (int64_t g0 = 0; g0 < group; g0 += 4) {
                    const int64_t gs = group - g0 < 4 ? group - g0 : 4;
                    ATTEND_FIXED[D == 128][gs - 1](qf + g0 * D, kv, kv_kind, elem, Hkv, h,
                                                   slots + b * L, lens[b], v_factor[h], scores,
                                                   totals, dst + g0 * D * out_elem, out_bf16);
                }
            } else {
                attend(qf, group, D, kv, kv_kind, elem, Hkv, h, slots + b * L, lens[b],
                       v_factor[h], scores, acc, totals, dst, out_bf16);
            }
        }
        free(scores), free(qf), free(acc), free(totals);
    }
    return failed ? -1 : 0;
}
