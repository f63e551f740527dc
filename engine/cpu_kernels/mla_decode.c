/* Decode attention for multi-head latent attention (DeepSeek V3, Kimi K2.x):
   one query token per sequence over the latent pool, absorbed.

   A cached row is [c (r values) | k_rope (rope values)], one per token and
   layer, shared by all heads (engine/kv/mla_pool.py). Head h folds W_UK[h]
   (its first nope rows of kv_b_proj) into the query, q_lat = W_UK[h]^T
   q_nope[h], attends over the rows as over one KV head r + rope wide, and
   maps the result, still in latent space, through W_UV[h] (its other v
   rows). torch spends ~5 ms a Kimi layer on this (SDPA and two einsums, on
   slow paths at these small shapes); here it is three passes in one parallel
   region:

   1. the queries, per (sequence, head): q_lat and q_rope with the softmax
      scale and the rows' dequant factors folded in;
   2. attention, per (sequence, block of heads): SPAN positions at a time,
      each row decoded to float32 once for all the block's heads, then an
      online softmax (on AVX2 with the heads in the vector lanes instead:
      mla_attend_lanes.c);
   3. the output, per (sequence, head): out = W_UV[h] o_lat.

   W_UK and W_UV come either from a dense kv_b_proj (bf16 or float32, the
   latent's rotation folded in) or as grid weights the way a GGUF file holds
   them (attn_k_b: W_UK[h]^T, r rows of nope; attn_v_b: W_UV[h], v rows of r),
   multiplied by the int8 grid kernel's tiles (grid_tiles.h) with the latent's
   norm gain and Hadamard rotation applied to the r-wide vectors at run time:
   a quarter of the bytes for a Q4 file, read once per step.

   Sums are float32 throughout (the grid products' int8 ones exact); only the
   output is rounded to the activations' dtype. FP8 rows are e4m3 bytes read as the half holding
   value * 2**-8; the latent and rope factors carry the scales and the 2**8,
   exactly the factors pool.gather returns. */
#include "simd_arch.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "grid_tiles.h"
#include "kernels.h"
#include "mla_attend.h"
#include "simd.h"

/* Where W_UK and W_UV come from. Dense: kv_b [H * (nope + v), r], per head nope key rows
   then v value rows, elements of the activations' dtype. Grid: k_b [H * r rows of nope]
   and v_b [H * v rows of r] in grid formats; the stored latent is s = H (c / g) for the
   true latent c (gain g, Hadamard H in blocks of `block`; none when gain is NULL and
   block 0), so q_lat = H (g * W_UK^T q_nope) and out = W_UV (g * H o_lat). */
struct mla_maps {
    const char *kv_b;
    const uint8_t *kb_codes, *kb_scales, *vb_codes, *vb_scales;
    int kb_fmt, vb_fmt;
    const float *gain;
    int64_t block;
};

/* 16 activations or weights (float32 or bf16), masked-off lanes zero and not read. */
static inline __m512 act_load(const char *src, int bf16, __mmask16 m) {
    return bf16 ? bf16x16_load_masked(src, m) : _mm512_maskz_loadu_ps(m, src);
}

/* dst[0, lat_w) = lat_mul * W_UK^T q_nope, dst[lat_w, width) = rope_mul * q_rope; the
   padding is zero. wk: the head's nope rows of r values. qf: nope floats of scratch. */
static void absorb_query(const struct mla_shape *s, const char *qn, const char *qr, int bf16,
                         const char *wk, float lat_mul, float rope_mul, float *qf, float *dst) {
    const int64_t elem = bf16 ? 2 : 4;
    for (int64_t n = 0; n < s->nope; n += 16)
        _mm512_storeu_ps(qf + n, act_load(qn + n * elem, bf16, lanes(s->nope - n)));
    for (int64_t c0 = 0; c0 < s->lat_w; c0 += 64) {
        __mmask16 m[4];
        __m512 acc[4];
        for (int k = 0; k < 4; k++) m[k] = lanes(s->r - c0 - 16 * k), acc[k] = _mm512_setzero_ps();
        for (int64_t n = 0; n < s->nope; n++) {
            const __m512 q = _mm512_set1_ps(qf[n]);
            const char *w = wk + (n * s->r + c0) * elem;
            for (int k = 0; k < 4; k++)
                acc[k] = _mm512_fmadd_ps(q, act_load(w + 16 * k * elem, bf16, m[k]), acc[k]);
        }
        for (int k = 0; k < 4; k++)
            _mm512_storeu_ps(dst + c0 + 16 * k, _mm512_mul_ps(acc[k], _mm512_set1_ps(lat_mul)));
    }
    for (int64_t i = 0; i < s->width - s->lat_w; i += 16) {
        const __m512 q = act_load(qr + i * elem, bf16, lanes(s->rope - i));
        _mm512_storeu_ps(dst + s->lat_w + i, _mm512_mul_ps(q, _mm512_set1_ps(rope_mul)));
    }
}

#ifndef RESIDENT_AVX2
/* Rows whose score sums one pass keeps in registers: all 16 in AVX-512's 32 registers. */
enum { SCORE_ROWS = SPAN, ACC_VECTORS = 4 };

/* Lane i = q . tile row i, over the padded width. */
static inline __m512 tile_scores(const float *q, const float *tile, int64_t width) {
    __m512 part[SPAN];
    for (int i0 = 0; i0 < SPAN; i0 += SCORE_ROWS) {
        __m512 sums[SCORE_ROWS];
        for (int i = 0; i < SCORE_ROWS; i++) sums[i] = _mm512_setzero_ps();
        for (int64_t c = 0; c < width; c += 16) {
            const __m512 qc = _mm512_loadu_ps(q + c);
            for (int i = 0; i < SCORE_ROWS; i++)
                sums[i] =
                    _mm512_fmadd_ps(qc, _mm512_loadu_ps(tile + (i0 + i) * width + c), sums[i]);
        }
        for (int i = 0; i < SCORE_ROWS; i++) part[i0 + i] = sums[i];
    }
    return reduce16(part);
}

/* acc[g] = alpha[g] * acc[g] + sum over the tile's first n rows of p[g][i] * latent_i, for
   GS heads, with ACC_VECTORS vectors of each head's accumulator in registers. */
#define DEFINE_ACCUMULATE(GS)                                                                          \
    static void accumulate_##GS(float *acc, const float *alpha, const float *p, const float *tile,     \
                                int64_t n, int64_t width, int64_t lat_w) {                             \
        for (int64_t c0 = 0; c0 < lat_w; c0 += 16 * ACC_VECTORS) {                                     \
            __m512 a[GS][ACC_VECTORS];                                                                 \
            for (int g = 0; g < GS; g++)                                                               \
                for (int k = 0; k < ACC_VECTORS; k++)                                                  \
                    a[g][k] = _mm512_mul_ps(_mm512_loadu_ps(acc + g * lat_w + c0 + 16 * k),            \
                                            _mm512_set1_ps(alpha[g]));                                 \
            for (int64_t i = 0; i < n; i++) {                                                          \
                __m512 x[ACC_VECTORS];                                                                 \
                for (int k = 0; k < ACC_VECTORS; k++)                                                  \
                    x[k] = _mm512_loadu_ps(tile + i * width + c0 + 16 * k);                            \
                for (int g = 0; g < GS; g++) {                                                         \
                    const __m512 pg = _mm512_set1_ps(p[g * SPAN + i]);                                 \
                    for (int k = 0; k < ACC_VECTORS; k++) a[g][k] = _mm512_fmadd_ps(pg, x[k], a[g][k]);\
                }                                                                                      \
            }                                                                                          \
            for (int g = 0; g < GS; g++)                                                               \
                for (int k = 0; k < ACC_VECTORS; k++)                                                  \
                    _mm512_storeu_ps(acc + g * lat_w + c0 + 16 * k, a[g][k]);                          \
        }                                                                                              \
    }

DEFINE_ACCUMULATE(1)
DEFINE_ACCUMULATE(2)
DEFINE_ACCUMULATE(3)
DEFINE_ACCUMULATE(4)

typedef void (*accumulate_fn)(float *, const float *, const float *, const float *, int64_t,
                              int64_t, int64_t);
static const accumulate_fn ACCUMULATE[4] = {accumulate_1, accumulate_2, accumulate_3, accumulate_4};

/* One sequence's len rows against `heads` absorbed queries [heads][width] ->
   o_lat [heads][lat_w] = latent_factor * softmax . latents. */
static void attend(const struct mla_shape *s, const float *queries, int64_t heads,
                   const uint8_t *rows, int kind, const int64_t *slots, int64_t len,
                   float latent_factor, const struct mla_scratch *w, float *o_lat) {
    const int64_t width = s->width, lat_w = s->lat_w;
    float *top = w->stats, *total = w->stats + heads, *alpha = w->stats + 2 * heads;
    for (int64_t g = 0; g < heads; g++) {
        top[g] = -INFINITY, total[g] = 0.0f;
        for (int64_t c = 0; c < lat_w; c += 16)
            _mm512_storeu_ps(w->acc + g * lat_w + c, _mm512_setzero_ps());
    }
    for (int64_t j0 = 0; j0 < len; j0 += SPAN) {
        const int64_t n = len - j0 < SPAN ? len - j0 : SPAN;
        decode_tile(s, rows, kind, slots + j0, n, w->tile);
        /* Rows n.. of the tile hold an earlier tile's (finite) values: their scores are
           masked here and the accumulation never reads them. */
        const __mmask16 valid = tail_mask(n);
        for (int64_t g = 0; g < heads; g++) {
            const __m512 sc = _mm512_mask_blend_ps(
                valid, _mm512_set1_ps(-INFINITY), tile_scores(queries + g * width, w->tile, width));
            const float new_top = fmaxf(top[g], _mm512_reduce_max_ps(sc));
            const __m512 e =
                _mm512_maskz_mov_ps(valid, exp512(_mm512_sub_ps(sc, _mm512_set1_ps(new_top))));
            alpha[g] = expf(top[g] - new_top); /* 0 on the first tile */
            total[g] = total[g] * alpha[g] + _mm512_reduce_add_ps(e);
            top[g] = new_top;
            _mm512_storeu_ps(w->p + g * SPAN, e);
        }
        for (int64_t g0 = 0; g0 < heads; g0 += 4) {
            const int64_t gs = heads - g0 < 4 ? heads - g0 : 4;
            ACCUMULATE[gs - 1](w->acc + g0 * lat_w, alpha + g0, w->p + g0 * SPAN, w->tile, n, width,
                               lat_w);
        }
    }
    for (int64_t g = 0; g < heads; g++) {
        const __m512 norm = _mm512_set1_ps(total[g] > 0.0f ? latent_factor / total[g] : 0.0f);
        for (int64_t c = 0; c < lat_w; c += 16)
            _mm512_storeu_ps(o_lat + g * lat_w + c,
                             _mm512_mul_ps(_mm512_loadu_ps(w->acc + g * lat_w + c), norm));
    }
}

#endif

/* The attention pass: heads in lanes on AVX2 (mla_attend_lanes.c), the row form above on
   AVX-512. */
#ifdef RESIDENT_AVX2
#define ATTEND mla_attend_lanes
enum { LANES_FORM = 1 };
#else
#define ATTEND attend
enum { LANES_FORM = 0 };
#endif

/* out[0, v) = W_UV o_lat, 16 rows of W_UV at a time; wv: the head's v rows of r values. */
static void expand_output(const struct mla_shape *s, const float *o_lat, const char *wv, int bf16,
                          char *out) {
    const int64_t elem = bf16 ? 2 : 4;
    for (int64_t v0 = 0; v0 < s->v; v0 += 16) {
        __m512 part[16];
        const char *w[16];
        for (int i = 0; i < 16; i++) {
            part[i] = _mm512_setzero_ps();
            /* past the last row: repeat it (a valid read, its lane is not stored) */
            w[i] = wv + (v0 + i < s->v ? v0 + i : s->v - 1) * s->r * elem;
        }
        for (int64_t c = 0; c < s->r; c += 16) {
            const __mmask16 m = lanes(s->r - c);
            const __m512 oc = _mm512_loadu_ps(o_lat + c);
            for (int i = 0; i < 16; i++)
                part[i] = _mm512_fmadd_ps(act_load(w[i] + c * elem, bf16, m), oc, part[i]);
        }
        row16_store(out + v0 * elem, reduce16(part), bf16, tail_mask(s->v - v0));
    }
}

/* x[0, r) from the stored latent's space to the true one's, or back (the same
   operations: the transform is its own inverse and the gain a diagonal): times the
   gain, then the normalised Hadamard blocks (query side); the blocks, then the gain
   (output side). */
static void latent_rotate(const struct mla_shape *s, const struct mla_maps *m, float *x,
                          int gain_first) {
    if (gain_first && m->gain)
        for (int64_t c = 0; c < s->r; c += 16)
            _mm512_storeu_ps(x + c, _mm512_mul_ps(_mm512_loadu_ps(x + c), _mm512_loadu_ps(m->gain + c)));
    if (m->block) {
        const __m512 norm = _mm512_set1_ps(1.0f / sqrtf((float)m->block));
        __m512 v[64]; /* block <= 1024 */
        const int64_t n = m->block / 16;
        for (int64_t base = 0; base < s->r; base += m->block) {
            for (int64_t i = 0; i < n; i++) v[i] = _mm512_loadu_ps(x + base + 16 * i);
            hadamard_vectors(v, n);
            for (int64_t i = 0; i < n; i++)
                _mm512_storeu_ps(x + base + 16 * i, _mm512_mul_ps(v[i], norm));
        }
    }
    if (!gain_first && m->gain)
        for (int64_t c = 0; c < s->r; c += 16)
            _mm512_storeu_ps(x + c, _mm512_mul_ps(_mm512_loadu_ps(x + c), _mm512_loadu_ps(m->gain + c)));
}

/* absorb_query through grid weights: q_nope quantized to int8 (x, K = nope), head h's r
   rows of k_b, then the gain and rotation; the same layout of dst. */
static void absorb_query_grid(const struct mla_shape *s, const struct mla_maps *m, int64_t h,
                              const char *qn, const char *qr, int bf16, float lat_mul,
                              float rope_mul, Int8Rows x, float *dst) {
    const int64_t elem = bf16 ? 2 : 4, groups = s->nope / GROUP;
    const int64_t w_tile = tile_bytes(m->kb_fmt, groups);
    const int64_t s_tile = tile_scale_bytes(m->kb_fmt, groups), first = h * s->r / TILE;
    quantize_row(qn, bf16, x, 0);
    for (int64_t t = 0; t < s->r / TILE; t++)
        tile_rows(m->kb_codes + (first + t) * w_tile, m->kb_scales + (first + t) * s_tile,
                  m->kb_fmt, groups, x, 1, dst + t * TILE);
    latent_rotate(s, m, dst, 1);
    for (int64_t c = 0; c < s->lat_w; c += 16)
        _mm512_storeu_ps(dst + c, _mm512_maskz_mul_ps(lanes(s->r - c), _mm512_loadu_ps(dst + c),
                                                      _mm512_set1_ps(lat_mul)));
    for (int64_t i = 0; i < s->width - s->lat_w; i += 16) {
        const __m512 q = act_load(qr + i * elem, bf16, lanes(s->rope - i));
        _mm512_storeu_ps(dst + s->lat_w + i, _mm512_mul_ps(q, _mm512_set1_ps(rope_mul)));
    }
}

/* expand_output through grid weights: o_lat (changed in place) back to the true latent's
   space, quantized to int8 (x, K = r), times head h's v rows of v_b. */
static void expand_output_grid(const struct mla_shape *s, const struct mla_maps *m, int64_t h,
                               float *o_lat, Int8Rows x, int bf16, char *out) {
    const int64_t elem = bf16 ? 2 : 4, groups = s->r / GROUP;
    const int64_t w_tile = tile_bytes(m->vb_fmt, groups);
    const int64_t s_tile = tile_scale_bytes(m->vb_fmt, groups), first = h * s->v / TILE;
    latent_rotate(s, m, o_lat, 0);
    quantize_row(o_lat, 0, x, 0);
    for (int64_t t = 0; t < s->v / TILE; t++) {
        float acc[TILE];
        tile_rows(m->vb_codes + (first + t) * w_tile, m->vb_scales + (first + t) * s_tile,
                  m->vb_fmt, groups, x, 1, acc);
        row16_store(out + t * TILE * elem, _mm512_loadu_ps(acc), bf16, 0xFFFF);
    }
}

/* One thread's int8 rows for the grid products: one row of up to K values. */
static Int8Rows int8_row(int64_t K) {
    const int64_t groups = K / GROUP;
    return (Int8Rows){malloc((size_t)K), malloc(sizeof(float) * (size_t)groups),
                      malloc(sizeof(float) * (size_t)groups),
                      malloc(sizeof(int32_t) * (size_t)(2 * groups)), K};
}

/* The decode step through either kind of weights (the entries below say the shapes). */
static int mla_run(const struct mla_maps *m, const void *q_nope, const void *q_rope,
                   int64_t nope_stride_b, int64_t nope_stride_h, int64_t rope_stride_b,
                   int64_t rope_stride_h, int bf16, const uint8_t *rows, int kv_kind,
                   const int64_t *slots, const int64_t *lens, int64_t B, int64_t L, int64_t H,
                   int64_t nope, int64_t rope, int64_t v, int64_t r, float latent_factor,
                   float rope_factor, float softmax_scale, void *out, int threads) {
    if (B == 0 || H == 0) return 0;
    const int team = threads > 0 ? threads : 1;
    const int64_t elem = bf16 ? 2 : 4, lat_w = (r + 63) / 64 * 64;
    const struct mla_shape s = {H, nope, rope, v, r, lat_w, lat_w + (rope + 15) / 16 * 16};
    /* Up to MAX_BLOCK heads a block, more blocks when there are fewer sequences than
       threads: one sequence's 16 heads still spread over the team. */
    int64_t blocks = (H + MAX_BLOCK - 1) / MAX_BLOCK;
    const int64_t spread = (team + B - 1) / B;
    if (blocks < spread) blocks = spread < H ? spread : H;
    const int64_t block = (H + blocks - 1) / blocks;
    blocks = (H + block - 1) / block;
    float *queries = malloc(sizeof(float) * (size_t)(B * H * s.width));
    float *latents = malloc(sizeof(float) * (size_t)(B * H * lat_w));
    if (!queries || !latents) {
        free(queries), free(latents);
        return -1;
    }
    const char *weights = m->kv_b;
    const int grid = weights == NULL;
    int failed = 0;
#pragma omp parallel num_threads(team)
    {
        float *qf = malloc(sizeof(float) * (size_t)((nope + 15) / 16 * 16));
        /* grid products: q_nope's int8 row (K = nope), then o_lat's (K = r) in the same buffers */
        Int8Rows xq = int8_row(grid ? (nope > r ? nope : r) : 0), xo = xq;
        xq.K = nope, xo.K = r;
        struct mla_scratch w = {
            calloc((size_t)(SPAN * s.width), sizeof(float)),
            malloc(sizeof(float) * (size_t)(MAX_BLOCK * lat_w)),
            malloc(sizeof(float) * (size_t)(MAX_BLOCK * SPAN)),
            malloc(sizeof(float) * (size_t)(3 * MAX_BLOCK)),
            malloc(sizeof(float) * (size_t)(LANES_FORM ? MAX_BLOCK * s.width : 1)),
            malloc(sizeof(float) * (size_t)(LANES_FORM ? MAX_BLOCK * SPAN : 1)),
        };
        if (!qf || !w.tile || !w.acc || !w.p || !w.stats || !w.queries || !w.scores ||
            (grid && (!xq.q || !xq.d || !xq.c || !xq.h))) {
#pragma omp atomic write
            failed = 1;
        }
        /* Head-major, so a thread's tasks share W_UK[h] while it is in cache. */
#pragma omp for schedule(static)
        for (int64_t task = 0; task < H * B; task++) {
            if (failed) continue;
            const int64_t h = task / B, b = task % B;
            const char *qn = (const char *)q_nope + (b * nope_stride_b + h * nope_stride_h) * elem;
            const char *qr = (const char *)q_rope + (b * rope_stride_b + h * rope_stride_h) * elem;
            float *dst = queries + (b * H + h) * s.width;
            const float lat_mul = softmax_scale * latent_factor;
            if (grid)
                absorb_query_grid(&s, m, h, qn, qr, bf16, lat_mul, softmax_scale * rope_factor,
                                  xq, dst);
            else
                absorb_query(&s, qn, qr, bf16, weights + h * (nope + v) * r * elem, lat_mul,
                             softmax_scale * rope_factor, qf, dst);
        }
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < B * blocks; task++) {
            if (failed) continue;
            const int64_t b = task / blocks, h0 = task % blocks * block;
            const int64_t heads = H - h0 < block ? H - h0 : block;
            ATTEND(&s, queries + (b * H + h0) * s.width, heads, rows, kv_kind, slots + b * L,
                   lens[b], latent_factor, &w, latents + (b * H + h0) * lat_w);
        }
#pragma omp for schedule(static)
        for (int64_t task = 0; task < H * B; task++) {
            if (failed) continue;
            const int64_t h = task / B, b = task % B;
            float *o_lat = latents + (b * H + h) * lat_w;
            char *dst = (char *)out + (b * H + h) * v * elem;
            if (grid)
                expand_output_grid(&s, m, h, o_lat, xo, bf16, dst);
            else
                expand_output(&s, o_lat, weights + (h * (nope + v) + nope) * r * elem, bf16, dst);
        }
        free(qf), free(w.tile), free(w.acc), free(w.p), free(w.stats), free(w.queries);
        free(w.scores);
        free(xq.q), free(xq.d), free(xq.c), free(xq.h);
    }
    free(queries), free(latents);
    return failed ? -1 : 0;
}

/* q_nope [B, H, nope] and q_rope [B, H, rope] with the given element strides (the last
   dimension contiguous); kv_b [H * (nope + v), r]; q, kv_b and out [B, H, v] all bf16
   (bf16 = 1) or all float32. rows: one layer's pool [slots, r + rope] of kind kv_kind;
   slots [B, L], row b valid up to lens[b]. Returns 0, or -1 without memory. */
int mla_decode(const void *q_nope, const void *q_rope, int64_t nope_stride_b, int64_t nope_stride_h,
               int64_t rope_stride_b, int64_t rope_stride_h, int bf16, const void *kv_b,
               const uint8_t *rows, int kv_kind, const int64_t *slots, const int64_t *lens,
               int64_t B, int64_t L, int64_t H, int64_t nope, int64_t rope, int64_t v, int64_t r,
               float latent_factor, float rope_factor, float softmax_scale, void *out,
               int threads) {
    const struct mla_maps m = {.kv_b = kv_b};
    return mla_run(&m, q_nope, q_rope, nope_stride_b, nope_stride_h, rope_stride_b, rope_stride_h,
                   bf16, rows, kv_kind, slots, lens, B, L, H, nope, rope, v, r, latent_factor,
                   rope_factor, softmax_scale, out, threads);
}

/* mla_decode with grid weights: k_b [H * r rows, nope] in format kb_fmt, v_b [H * v rows,
   r] in vb_fmt, each head's rows whole tiles (r and v multiples of 16, nope and r whole
   blocks of their formats); gain [r] float32 or NULL; block: the rotation's Hadamard
   block (a power of two, 16 to 1024, dividing r) or 0. Returns 0, -1 without memory, -2
   for a shape or format the grid products do not take. */
int mla_decode_grid(const void *q_nope, const void *q_rope, int64_t nope_stride_b,
                    int64_t nope_stride_h, int64_t rope_stride_b, int64_t rope_stride_h, int bf16,
                    const uint8_t *kb_codes, const uint8_t *kb_scales, int kb_fmt,
                    const uint8_t *vb_codes, const uint8_t *vb_scales, int vb_fmt,
                    const float *gain, int64_t block, const uint8_t *rows, int kv_kind,
                    const int64_t *slots, const int64_t *lens, int64_t B, int64_t L, int64_t H,
                    int64_t nope, int64_t rope, int64_t v, int64_t r, float latent_factor,
                    float rope_factor, float softmax_scale, void *out, int threads) {
    if (r % TILE || v % TILE || !grid_format_fits(kb_fmt, nope) || !grid_format_fits(vb_fmt, r) ||
        (block && (block < 16 || block > 1024 || (block & (block - 1)) || r % block)))
        return -2;
    const struct mla_maps m = {NULL, kb_codes, kb_scales, vb_codes, vb_scales,
                               kb_fmt, vb_fmt, gain, block};
    return mla_run(&m, q_nope, q_rope, nope_stride_b, nope_stride_h, rope_stride_b, rope_stride_h,
                   bf16, rows, kv_kind, slots, lens, B, L, H, nope, rope, v, r, latent_factor,
                   rope_factor, softmax_scale, out, threads);
}
