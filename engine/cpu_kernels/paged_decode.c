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

#include "grid_formats.h" /* ALWAYS_INLINE */
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

/* Rows this many positions ahead are fetched while the current ones are used: a
   decode step streams its weights through the caches, so the pages are cold, and one
   head's rows are scattered (a slot holds every head's K and V) where the hardware
   prefetchers do not follow. */
#define PREFETCH_AHEAD 16
static inline void prefetch_row(const uint8_t *row, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch((const char *)row + b, _MM_HINT_T0);
}

/* Up to 4 query heads of one KV head, head_dim = 16 * CH, K and V stored as `kind`:
   each (GS, CH, kind) is its own function below, the loops unrolled and the load's
   conversion chosen at compile time. Register use is kept to what AVX2 has (16 ymm,
   so 8 of the emulated 16-lane vectors): at head_dim 128 the queries are read from L1
   as memory operands, and the weighted sum of V runs one 16-lane chunk at a time over
   a block of positions whose V rows stay in L1, its GS accumulators in registers.
   Holding every query chunk and every accumulator in registers spilled them to the
   stack on each step (a load and a store per FMA). */
#define PV_BLOCK 32
ALWAYS_INLINE void attend_fixed(
    const int GS, const int CH, const int kind, const float *q, const uint8_t *kv,
    int64_t kv_heads, int64_t head, const int64_t *slots, int64_t len, float v_factor,
    float *scores, float *totals, void *out, int out_bf16) {
    const int64_t D = 16 * CH, elem = kind == KV_FLOAT32 ? 4 : kind == KV_BF16 ? 2 : 1;
    const int64_t row_bytes = D * elem, slot_bytes = 2 * kv_heads * row_bytes;
    const uint8_t *k_base = kv + head * row_bytes, *v_base = kv + (kv_heads + head) * row_bytes;
    /* At head_dim 64 the queries stay in registers, as before (measured 15% faster there);
       at 128 they do not fit and are read from L1. */
    __m512 qv[4][4];
    if (CH <= 4)
        for (int g = 0; g < GS; g++)
            for (int c = 0; c < CH; c++) qv[g][c] = _mm512_loadu_ps(q + g * D + c * 16);
    for (int64_t l0 = 0; l0 < len; l0 += 16) {
        const int64_t n = len - l0 < 16 ? len - l0 : 16;
        __m512 part[4][16];
        for (int64_t i = 0; i < 16; i++) {
            __m512 s[4];
            for (int g = 0; g < GS; g++) s[g] = _mm512_setzero_ps();
            if (i < n) {
                if (l0 + i + PREFETCH_AHEAD < len)
                    prefetch_row(k_base + slots[l0 + i + PREFETCH_AHEAD] * slot_bytes, row_bytes);
                const uint8_t *k = k_base + slots[l0 + i] * slot_bytes;
                for (int c = 0; c < CH; c++) {
                    const __m512 kc = load_row16(k + c * 16 * elem, kind);
                    for (int g = 0; g < GS; g++) {
                        /* c & 3: in range in the CH = 8 forms too, where this arm is
                           compiled out */
                        const __m512 qc =
                            CH <= 4 ? qv[g][c & 3] : _mm512_loadu_ps(q + g * D + c * 16);
                        s[g] = _mm512_fmadd_ps(qc, kc, s[g]);
                    }
                }
            }
            for (int g = 0; g < GS; g++) part[g][i] = s[g];
        }
        for (int g = 0; g < GS; g++)
            _mm512_mask_storeu_ps(scores + g * len + l0, tail_mask(n), reduce16(part[g]));
    }
    softmax_rows(scores, GS, len, totals);
    float acc_rows[4 * 16 * 8];
    for (int64_t l0 = 0; l0 < len; l0 += PV_BLOCK) {
        const int64_t n = len - l0 < PV_BLOCK ? len - l0 : PV_BLOCK;
        const uint8_t *rows[PV_BLOCK];
        for (int64_t i = 0; i < n; i++) {
            rows[i] = v_base + slots[l0 + i] * slot_bytes;
            if (l0 + i + PV_BLOCK < len)
                prefetch_row(v_base + slots[l0 + i + PV_BLOCK] * slot_bytes, row_bytes);
        }
        for (int c = 0; c < CH; c++) {
            __m512 acc[4];
            for (int g = 0; g < GS; g++)
                acc[g] = l0 ? _mm512_loadu_ps(acc_rows + g * D + c * 16) : _mm512_setzero_ps();
            for (int64_t i = 0; i < n; i++) {
                const __m512 vc = load_row16(rows[i] + c * 16 * elem, kind);
                for (int g = 0; g < GS; g++)
                    acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(scores[g * len + l0 + i]), vc, acc[g]);
            }
            for (int g = 0; g < GS; g++) _mm512_storeu_ps(acc_rows + g * D + c * 16, acc[g]);
        }
    }
    const int out_elem = out_bf16 ? 2 : 4;
    for (int g = 0; g < GS; g++) {
        const __m512 norm = _mm512_set1_ps(v_factor / totals[g]);
        for (int c = 0; c < CH; c++)
            row16_store((char *)out + (g * D + c * 16) * out_elem,
                        _mm512_mul_ps(_mm512_loadu_ps(acc_rows + g * D + c * 16), norm), out_bf16,
                        0xFFFF);
    }
}

typedef void (*attend_fixed_fn)(const float *, const uint8_t *, int64_t, int64_t, const int64_t *,
                                int64_t, float, float *, float *, void *, int);
#define ATTEND_FORM(GS, CH, KIND)                                                                \
    static void attend_##GS##_##CH##_##KIND(const float *q, const uint8_t *kv, int64_t kv_heads, \
                                            int64_t head, const int64_t *slots, int64_t len,     \
                                            float v_factor, float *scores, float *totals,        \
                                            void *out, int out_bf16) {                           \
        attend_fixed(GS, CH, KIND, q, kv, kv_heads, head, slots, len, v_factor, scores, totals,  \
                     out, out_bf16);                                                             \
    }
#define ATTEND_FORMS(CH, KIND) \
    ATTEND_FORM(1, CH, KIND) ATTEND_FORM(2, CH, KIND) ATTEND_FORM(3, CH, KIND) ATTEND_FORM(4, CH, KIND)
ATTEND_FORMS(4, 0)
ATTEND_FORMS(4, 1)
ATTEND_FORMS(4, 2)
ATTEND_FORMS(8, 0)
ATTEND_FORMS(8, 1)
ATTEND_FORMS(8, 2)
#define ATTEND_ROW(CH, KIND) \
    {attend_1_##CH##_##KIND, attend_2_##CH##_##KIND, attend_3_##CH##_##KIND, attend_4_##CH##_##KIND}
/* [head_dim 128][kind][group size - 1] */
static const attend_fixed_fn ATTEND_FIXED[2][3][4] = {
    {ATTEND_ROW(4, 0), ATTEND_ROW(4, 1), ATTEND_ROW(4, 2)},
    {ATTEND_ROW(8, 0), ATTEND_ROW(8, 1), ATTEND_ROW(8, 2)},
};

/* q [B, Hq, D], out [B, Hq, D]; slots [B, L] (row b valid up to lens[b]);
   k_factor/v_factor [Hkv]; kv_kind 0 float32, 1 bf16, 2 fp8 bytes.
   D must be a multiple of 16, at most 256; a sequence needs lens[b] >= 1. Returns 0, or -1 without memory. */
int paged_decode(const void *q, int q_bf16, const uint8_t *kv, int kv_kind, const int64_t *slots,
                 const int64_t *lens, int64_t B, int64_t L, int64_t Hq, int64_t Hkv, int64_t D,
                 const float *k_factor, const float *v_factor, float softmax_scale, void *out,
                 int out_bf16, int threads) {
    /* any other kind reads FP8 bytes, as it always has */
    const int kind = kv_kind == KV_FLOAT32 || kv_kind == KV_BF16 ? kv_kind : KV_FP8;
    const int64_t group = Hq / Hkv, elem = kind == KV_FLOAT32 ? 4 : kind == KV_BF16 ? 2 : 1;
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
                    ATTEND_FIXED[D == 128][kind][gs - 1](qf + g0 * D, kv, Hkv, h, slots + b * L,
                                                            lens[b], v_factor[h], scores, totals,
                                                            dst + g0 * D * out_elem, out_bf16);
                }
            } else {
                attend(qf, group, D, kv, kind, elem, Hkv, h, slots + b * L, lens[b],
                       v_factor[h], scores, acc, totals, dst, out_bf16);
            }
        }
        free(scores), free(qf), free(acc), free(totals);
    }
    return failed ? -1 : 0;
}
