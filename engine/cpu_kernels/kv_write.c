/* Writing new tokens' K and V into the paged GQA cache, as engine/kv/pool.py does.

   FP8: code = e4m3(clamp(x / scale, -448, 448)), rounding to nearest even,
   bit for bit what torch's division, clamp and float8_e4m3fn cast give
   (tests/engine/test_cpu_kernels.py sweeps it against torch). BF16 and
   float32 caches take the values (rounded to nearest even for BF16). */
#include "simd_arch.h"
#include <stdint.h>

#include "kernels.h"
#include "simd.h"

/* 16 float32 values (already clamped to +-448, or NaN) -> e4m3 bytes. */
static inline __m128i e4m3x16(__m512 x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80));
    const __m512 a = _mm512_abs_ps(x);
    /* subnormal codes: a / 2**-9, rounded to nearest even (8 is the smallest normal) */
    const __m512i sub = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(512.0f)));
    /* normal codes: round the mantissa to 3 bits at bit 20, rebias the exponent 127 -> 7 */
    __m512i au = _mm512_castps_si512(a);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(au, 20), _mm512_set1_epi32(1));
    au = _mm512_add_epi32(au, _mm512_add_epi32(_mm512_set1_epi32(0x7FFFF), lsb));
    const __m512i exponent = _mm512_sub_epi32(_mm512_srli_epi32(au, 23), _mm512_set1_epi32(120));
    const __m512i normal = _mm512_or_si512(
        _mm512_slli_epi32(exponent, 3), _mm512_and_si512(_mm512_srli_epi32(au, 20), _mm512_set1_epi32(7)));
    const __mmask16 is_sub = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.015625f), _CMP_LT_OQ);
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512i code = _mm512_mask_mov_epi32(normal, is_sub, sub);
    code = _mm512_mask_mov_epi32(code, is_nan, _mm512_set1_epi32(0x7F));
    return _mm512_cvtepi32_epi8(_mm512_or_si512(code, sign));
}

static inline void write_row(const uint8_t *src, int in_bf16, int64_t D, uint8_t *dst, int kind,
                             float scale) {
    const int in_elem = in_bf16 ? 2 : 4;
    for (int64_t c = 0; c < D; c += 16) {
        const uint8_t *from = src + c * in_elem;
        const __m512 x = in_bf16 ? bf16x16_load(from) : _mm512_loadu_ps(from);
        if (kind == KV_FP8) {
            __m512 scaled = _mm512_div_ps(x, _mm512_set1_ps(scale));
            scaled = _mm512_min_ps(_mm512_max_ps(scaled, _mm512_set1_ps(-448.0f)), _mm512_set1_ps(448.0f));
            /* min/max drop a NaN operand: keep NaN inputs NaN, as torch's clamp does */
            scaled = _mm512_mask_mov_ps(scaled, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
            _mm_storeu_si128((__m128i *)(dst + c), e4m3x16(scaled));
        } else if (kind == KV_BF16) {
            _mm256_storeu_si256((__m256i *)(dst + 2 * c), bf16x16_from(x));
        } else {
            _mm512_storeu_ps(dst + 4 * c, x);
        }
    }
}

/* k, v [tokens, heads, D] with token strides k_stride / v_stride (elements), heads
   and D contiguous; storage [slots, 2, heads, D] of `kind`; scales [heads]
   (FP8 only). D must be a multiple of 16. */
int kv_write(const void *k, const void *v, int in_bf16, int64_t tokens, int64_t heads, int64_t D,
             int64_t k_stride, int64_t v_stride, const int64_t *slots, uint8_t *storage, int kind,
             const float *k_scale, const float *v_scale, int threads) {
    const int64_t in_elem = in_bf16 ? 2 : 4, elem = kind == KV_FLOAT32 ? 4 : kind == KV_BF16 ? 2 : 1;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) \
    if (tokens * heads * D >= 65536)
    for (int64_t t = 0; t < tokens; t++) {
        uint8_t *slot = storage + slots[t] * 2 * heads * D * elem;
        for (int64_t h = 0; h < heads; h++) {
            write_row((const uint8_t *)k + (t * k_stride + h * D) * in_elem, in_bf16, D,
                      slot + h * D * elem, kind, kind == KV_FP8 ? k_scale[h] : 1.0f);
            write_row((const uint8_t *)v + (t * v_stride + h * D) * in_elem, in_bf16, D,
                      slot + (heads + h) * D * elem, kind, kind == KV_FP8 ? v_scale[h] : 1.0f);
        }
    }
    return 0;
}

/* MLA's cache rows (engine/kv/mla_pool.py write): latent [tokens, r] and rope key
   [tokens, rope_dim], bf16 and contiguous, into storage rows [slots, r + rope_dim] of
   `kind`, FP8 with one scale for each part. r and rope_dim multiples of 16. */
int mla_write(const uint16_t *latent, const uint16_t *rope, int64_t tokens, int64_t r,
              int64_t rope_dim, const int64_t *slots, uint8_t *storage, int kind,
              float latent_scale, float rope_scale) {
    const int64_t elem = kind == KV_FLOAT32 ? 4 : kind == KV_BF16 ? 2 : 1;
    for (int64_t t = 0; t < tokens; t++) {
        uint8_t *row = storage + slots[t] * (r + rope_dim) * elem;
        write_row((const uint8_t *)(latent + t * r), 1, r, row, kind, latent_scale);
        write_row((const uint8_t *)(rope + t * rope_dim), 1, rope_dim, row + r * elem, kind,
                  rope_scale);
    }
    return 0;
}
