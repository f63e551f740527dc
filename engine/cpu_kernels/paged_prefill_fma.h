/* The AVX2 build's form of paged_prefill.c's two products, in float32 FMAs.

   AVX2 has no BF16 dot product. Emulating one (split each packed pair into two float32
   vectors, two FMAs) cost a shift and a mask per pair and needed 32 registers for
   the 8 x 32 block of scores the AVX-512 form keeps: GCC spilled them at every step.
   Here the packed blocks hold float32 values instead (K as [D][32 keys], V as
   [32 keys][D]; BF16 and FP8 values are exact in float32, so the products are the same
   exact float32 products), the queries are widened to float32 once per query block, and
   each product is a block of 4 rows x 16 lanes held in eight registers, fed by one
   16-lane load (two registers) and four broadcasts: the FMA units' rate on Zen 3,
   where the emulated form ran at under half of it. The sums run over the dimensions
   (or keys) one at a time, in order, where the BF16 instruction adds pairs: the
   results differ from the AVX-512 build's by float32 summation order. */
#ifndef RESIDENT_PAGED_PREFILL_FMA_H
#define RESIDENT_PAGED_PREFILL_FMA_H
#include <stdint.h>

/* Four named accumulators for each of two registers of lanes: GCC keeps an array of
   vectors on the stack, storing it back at every step of the loop. */
#define EACH4(M) M(0) M(1) M(2) M(3)

/* scores[r][k0 .. k0 + 16) = scale * q_f[r] . K[.][k0 .. k0 + 16) for four rows r (q_f
   rows D floats apart; kb: one block's keys [D][32]). */
static inline void scores_rows4(const float *q, int64_t D, const float *kb, int64_t k0,
                                float scale, float *scores) {
#define INIT(i) __m256 a##i = _mm256_setzero_ps(), b##i = a##i;
#define STEP(i)                                                                          \
    {                                                                                    \
        const __m256 x = _mm256_broadcast_ss(q + i * D + d);                             \
        a##i = _mm256_fmadd_ps(x, lo, a##i), b##i = _mm256_fmadd_ps(x, hi, b##i);        \
    }
#define STORE(i)                                                                         \
    _mm256_storeu_ps(scores + i * 32 + k0, _mm256_mul_ps(a##i, f)),                      \
        _mm256_storeu_ps(scores + i * 32 + k0 + 8, _mm256_mul_ps(b##i, f));
    EACH4(INIT)
    for (int64_t d = 0; d < D; d++) {
        const __m256 lo = _mm256_loadu_ps(kb + d * 32 + k0);
        const __m256 hi = _mm256_loadu_ps(kb + d * 32 + k0 + 8);
        EACH4(STEP)
    }
    const __m256 f = _mm256_set1_ps(scale);
    EACH4(STORE)
#undef INIT
#undef STEP
#undef STORE
}

/* scores_rows4 for one row, all 32 keys. */
static inline void scores_row1(const float *q, int64_t D, const float *kb, float scale,
                               float *scores) {
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    for (int64_t d = 0; d < D; d++) {
        const __m256 x = _mm256_broadcast_ss(q + d);
        for (int k = 0; k < 4; k++)
            a[k] = _mm256_fmadd_ps(x, _mm256_loadu_ps(kb + d * 32 + 8 * k), a[k]);
    }
    for (int k = 0; k < 4; k++)
        _mm256_storeu_ps(scores + 8 * k, _mm256_mul_ps(a[k], _mm256_set1_ps(scale)));
}

/* scores [rows][32] of `rows` float32 query rows against one K block. */
static void block_scores_fma(const float *q, int64_t rows, int64_t D, const float *kb,
                             float scale, float *scores) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4)
        for (int64_t k0 = 0; k0 < 32; k0 += 16)
            scores_rows4(q + r * D, D, kb, k0, scale, scores + r * 32);
    for (; r < rows; r++) scores_row1(q + r * D, D, kb, scale, scores + r * 32);
}

/* acc[r][c0 .. c0 + 16) = rescale[r] * acc + sum over the block's 32 keys of p[r][k] *
   V[k][c0 .. c0 + 16) for four rows (acc and p rows D and 32 floats apart). */
static inline void values_rows4(float *acc, int64_t D, int64_t c0, const float *p,
                                const float *rescale, const float *vb) {
#define INIT(i)                                                                          \
    const __m256 s##i = _mm256_set1_ps(rescale[i]);                                      \
    __m256 a##i = _mm256_mul_ps(_mm256_loadu_ps(acc + i * D + c0), s##i);                \
    __m256 b##i = _mm256_mul_ps(_mm256_loadu_ps(acc + i * D + c0 + 8), s##i);
#define STEP(i)                                                                          \
    {                                                                                    \
        const __m256 x = _mm256_broadcast_ss(p + i * 32 + k);                            \
        a##i = _mm256_fmadd_ps(x, lo, a##i), b##i = _mm256_fmadd_ps(x, hi, b##i);        \
    }
#define STORE(i)                                                                         \
    _mm256_storeu_ps(acc + i * D + c0, a##i), _mm256_storeu_ps(acc + i * D + c0 + 8, b##i);
    EACH4(INIT)
    for (int64_t k = 0; k < 32; k++) {
        const __m256 lo = _mm256_loadu_ps(vb + k * D + c0);
        const __m256 hi = _mm256_loadu_ps(vb + k * D + c0 + 8);
        EACH4(STEP)
    }
    EACH4(STORE)
#undef INIT
#undef STEP
#undef STORE
}

/* acc [rows][D] = acc * rescale + p . V for one V block [32][D]; p [rows][32] float32. */
static void block_values_fma(float *acc, int64_t rows, int64_t D, const float *p,
                             const float *rescale, const float *vb) {
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4)
        for (int64_t c0 = 0; c0 < D; c0 += 16)
            values_rows4(acc + r * D, D, c0, p + r * 32, rescale + r, vb);
    for (; r < rows; r++)
        for (int64_t c0 = 0; c0 < D; c0 += 8) {
            __m256 a =
                _mm256_mul_ps(_mm256_loadu_ps(acc + r * D + c0), _mm256_set1_ps(rescale[r]));
            for (int64_t k = 0; k < 32; k++)
                a = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * 32 + k),
                                    _mm256_loadu_ps(vb + k * D + c0), a);
            _mm256_storeu_ps(acc + r * D + c0, a);
        }
}

/* Keys [32 * block, 32 * block + 32) of one KV head as float32, K [D][32] and V [32][D];
   keys past len are zero. */
static void pack_block_fma(const uint8_t *kv, int kind, int64_t elem, int64_t kv_heads,
                           int64_t head, int64_t D, const int64_t *slots, int64_t len,
                           int64_t block, float *kb, float *vb) {
    const int64_t slot_elems = 2 * kv_heads * D;
    float k_row[256];
    for (int64_t j = 0; j < 32; j++) {
        const int64_t key = block * 32 + j;
        float *v_row = vb + j * D;
        if (key >= len) {
            for (int64_t d = 0; d < D; d++) kb[d * 32 + j] = 0.0f, v_row[d] = 0.0f;
            continue;
        }
        const uint8_t *k = kv + (slots[key] * slot_elems + head * D) * elem;
        const uint8_t *v = kv + (slots[key] * slot_elems + (kv_heads + head) * D) * elem;
        for (int64_t c = 0; c < D; c += 16) {
            _mm512_storeu_ps(k_row + c, bf16_row16_float(k + c * elem, kind));
            _mm512_storeu_ps(v_row + c, bf16_row16_float(v + c * elem, kind));
        }
        for (int64_t d = 0; d < D; d++) kb[d * 32 + j] = k_row[d];
    }
}
#endif
