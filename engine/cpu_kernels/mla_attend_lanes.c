/* MLA decode attention with the heads in the vector lanes: the AVX2 build's form of
   mla_decode.c's attention pass.

   Every head of a sequence attends over the same cached rows, so the pass is two small
   matrix products per tile of SPAN rows, scores = tile . Q^T and acc += P . tile, with
   16 heads across two 8-lane registers. Each stored value is broadcast once from the
   decoded tile and multiplied into all 16 heads' sums; no sum is ever reduced across
   lanes, and the softmax's running max and sum are per-lane operations.

   The row form mla_decode.c keeps for AVX-512 (a head's query against 16 rows, the rows'
   sums in lanes) reads 16 floats of the tile for every 16 multiply-adds; the 36 KB tile
   does not stay in L1, so on AVX2 that form ran at about half of the FMA units' rate
   (27 of 51 G multiply-adds a second a core). Here a 4 x 16 block of sums stays in eight
   registers while a query row (two loads) and four broadcasts feed eight FMAs, which
   measured at the units' rate.

   Lanes past `heads` hold zero queries: their scores are 0 and nothing reads their sums. */
#include "simd_arch.h"

#ifdef RESIDENT_AVX2
#include <math.h>
#include <stdint.h>

#include "mla_attend.h"

/* scores[i][0..16) = sum over c of tile[i][c] * queries[c][0..16), four rows. */
static inline void score_rows4(const float *queries, const float *tile, int64_t width,
                               float *scores) {
    const float *t0 = tile, *t1 = tile + width, *t2 = tile + 2 * width, *t3 = tile + 3 * width;
    __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
    for (int64_t c = 0; c < width; c++) {
        const __m256 lo = _mm256_loadu_ps(queries + c * MAX_BLOCK);
        const __m256 hi = _mm256_loadu_ps(queries + c * MAX_BLOCK + 8);
        __m256 x = _mm256_broadcast_ss(t0 + c);
        a0 = _mm256_fmadd_ps(x, lo, a0), b0 = _mm256_fmadd_ps(x, hi, b0);
        x = _mm256_broadcast_ss(t1 + c);
        a1 = _mm256_fmadd_ps(x, lo, a1), b1 = _mm256_fmadd_ps(x, hi, b1);
        x = _mm256_broadcast_ss(t2 + c);
        a2 = _mm256_fmadd_ps(x, lo, a2), b2 = _mm256_fmadd_ps(x, hi, b2);
        x = _mm256_broadcast_ss(t3 + c);
        a3 = _mm256_fmadd_ps(x, lo, a3), b3 = _mm256_fmadd_ps(x, hi, b3);
    }
    _mm256_storeu_ps(scores, a0), _mm256_storeu_ps(scores + 8, b0);
    _mm256_storeu_ps(scores + 16, a1), _mm256_storeu_ps(scores + 24, b1);
    _mm256_storeu_ps(scores + 32, a2), _mm256_storeu_ps(scores + 40, b2);
    _mm256_storeu_ps(scores + 48, a3), _mm256_storeu_ps(scores + 56, b3);
}

/* acc[c][0..16) = alpha * acc[c] + sum over the first n rows of tile[i][c] * p[i][0..16),
   columns c0..c0+4 (acc points at column c0). */
static inline void accumulate_cols4(float *acc, const float *alpha, const float *p,
                                    const float *tile, int64_t c0, int64_t n, int64_t width) {
    const __m256 al = _mm256_loadu_ps(alpha), ah = _mm256_loadu_ps(alpha + 8);
    __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc), al);
    __m256 b0 = _mm256_mul_ps(_mm256_loadu_ps(acc + 8), ah);
    __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(acc + 16), al);
    __m256 b1 = _mm256_mul_ps(_mm256_loadu_ps(acc + 24), ah);
    __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(acc + 32), al);
    __m256 b2 = _mm256_mul_ps(_mm256_loadu_ps(acc + 40), ah);
    __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(acc + 48), al);
    __m256 b3 = _mm256_mul_ps(_mm256_loadu_ps(acc + 56), ah);
    for (int64_t i = 0; i < n; i++) {
        const __m256 lo = _mm256_loadu_ps(p + i * MAX_BLOCK);
        const __m256 hi = _mm256_loadu_ps(p + i * MAX_BLOCK + 8);
        const float *row = tile + i * width + c0;
        __m256 x = _mm256_broadcast_ss(row);
        a0 = _mm256_fmadd_ps(x, lo, a0), b0 = _mm256_fmadd_ps(x, hi, b0);
        x = _mm256_broadcast_ss(row + 1);
        a1 = _mm256_fmadd_ps(x, lo, a1), b1 = _mm256_fmadd_ps(x, hi, b1);
        x = _mm256_broadcast_ss(row + 2);
        a2 = _mm256_fmadd_ps(x, lo, a2), b2 = _mm256_fmadd_ps(x, hi, b2);
        x = _mm256_broadcast_ss(row + 3);
        a3 = _mm256_fmadd_ps(x, lo, a3), b3 = _mm256_fmadd_ps(x, hi, b3);
    }
    _mm256_storeu_ps(acc, a0), _mm256_storeu_ps(acc + 8, b0);
    _mm256_storeu_ps(acc + 16, a1), _mm256_storeu_ps(acc + 24, b1);
    _mm256_storeu_ps(acc + 32, a2), _mm256_storeu_ps(acc + 40, b2);
    _mm256_storeu_ps(acc + 48, a3), _mm256_storeu_ps(acc + 56, b3);
}

/* Eight named accumulators: GCC keeps an array of vectors on the stack, storing it back
   at every step of the loop. */
#define EACH8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)

/* score_rows4 for up to 8 heads (one register of lanes), eight rows. */
static inline void score_rows8_narrow(const float *queries, const float *tile, int64_t width,
                                      float *scores) {
#define INIT(i) __m256 a##i = _mm256_setzero_ps();
#define STEP(i) a##i = _mm256_fmadd_ps(_mm256_broadcast_ss(tile + i * width + c), q, a##i);
#define STORE(i) _mm256_storeu_ps(scores + i * MAX_BLOCK, a##i);
    EACH8(INIT)
    for (int64_t c = 0; c < width; c++) {
        const __m256 q = _mm256_loadu_ps(queries + c * MAX_BLOCK);
        EACH8(STEP)
    }
    EACH8(STORE)
#undef INIT
#undef STEP
#undef STORE
}

/* accumulate_cols4 for up to 8 heads, eight columns. */
static inline void accumulate_cols8_narrow(float *acc, const float *alpha, const float *p,
                                           const float *tile, int64_t c0, int64_t n,
                                           int64_t width) {
#define INIT(k) __m256 a##k = _mm256_mul_ps(_mm256_loadu_ps(acc + k * MAX_BLOCK), al);
#define STEP(k) a##k = _mm256_fmadd_ps(_mm256_broadcast_ss(row + k), pi, a##k);
#define STORE(k) _mm256_storeu_ps(acc + k * MAX_BLOCK, a##k);
    const __m256 al = _mm256_loadu_ps(alpha);
    EACH8(INIT)
    for (int64_t i = 0; i < n; i++) {
        const __m256 pi = _mm256_loadu_ps(p + i * MAX_BLOCK);
        const float *row = tile + i * width + c0;
        EACH8(STEP)
    }
    EACH8(STORE)
#undef INIT
#undef STEP
#undef STORE
}

void mla_attend_lanes(const struct mla_shape *s, const float *queries, int64_t heads,
                      const uint8_t *rows, int kind, const int64_t *slots, int64_t len,
                      float latent_factor, const struct mla_scratch *w, float *o_lat) {
    const int64_t width = s->width, lat_w = s->lat_w;
    float *qt = w->queries, *acc = w->acc, *alpha = w->stats;
    const int narrow = heads <= 8; /* one register of lanes holds them */
    for (int64_t c = 0; c < width; c++)
        for (int64_t g = 0; g < MAX_BLOCK; g++)
            qt[c * MAX_BLOCK + g] = g < heads ? queries[g * width + c] : 0.0f;
    for (int64_t c = 0; c < lat_w * MAX_BLOCK; c += 16)
        _mm512_storeu_ps(acc + c, _mm512_setzero_ps());
    /* exp512 clamps its argument at -87, so the first tile's rescale of the empty
       running sums is a tiny factor of zeros: zero. */
    __m512 top = _mm512_set1_ps(-INFINITY), total = _mm512_setzero_ps();
    for (int64_t j0 = 0; j0 < len; j0 += SPAN) {
        const int64_t n = len - j0 < SPAN ? len - j0 : SPAN;
        decode_tile(s, rows, kind, slots + j0, n, w->tile);
        /* Rows n.. of the tile hold an earlier tile's (finite) values: their scores are
           not read. */
        for (int64_t i0 = 0; i0 < n; i0 += narrow ? 8 : 4)
            (narrow ? score_rows8_narrow : score_rows4)(qt, w->tile + i0 * width, width,
                                                        w->scores + i0 * MAX_BLOCK);
        __m512 new_top = top;
        for (int64_t i = 0; i < n; i++)
            new_top = _mm512_max_ps(new_top, _mm512_loadu_ps(w->scores + i * MAX_BLOCK));
        const __m512 rescale = exp512(_mm512_sub_ps(top, new_top));
        __m512 sum = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i++) {
            const __m512 e =
                exp512(_mm512_sub_ps(_mm512_loadu_ps(w->scores + i * MAX_BLOCK), new_top));
            _mm512_storeu_ps(w->p + i * MAX_BLOCK, e);
            sum = _mm512_add_ps(sum, e);
        }
        total = _mm512_fmadd_ps(total, rescale, sum);
        top = new_top;
        _mm512_storeu_ps(alpha, rescale);
        if (narrow)
            for (int64_t c0 = 0; c0 < lat_w; c0 += 8)
                accumulate_cols8_narrow(acc + c0 * MAX_BLOCK, alpha, w->p, w->tile, c0, n, width);
        else
            for (int64_t c0 = 0; c0 < lat_w; c0 += 4)
                accumulate_cols4(acc + c0 * MAX_BLOCK, alpha, w->p, w->tile, c0, n, width);
    }
    float norm[MAX_BLOCK], sums[MAX_BLOCK];
    _mm512_storeu_ps(sums, total);
    for (int64_t g = 0; g < heads; g++) norm[g] = sums[g] > 0.0f ? latent_factor / sums[g] : 0.0f;
    for (int64_t g = 0; g < heads; g++)
        for (int64_t c = 0; c < lat_w; c++) o_lat[g * lat_w + c] = acc[c * MAX_BLOCK + g] * norm[g];
}
#endif
