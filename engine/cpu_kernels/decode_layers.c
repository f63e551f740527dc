/* Every decoder layer of a Llama-family model for one decode step, in one call, and
   of the GLM-4.5 family (per-head q/k norms, MoE feed-forward layers).

   The same kernels, in the same order and with the same rounding points, as
   the per-module CPU path (engine/layers/cpu_fused.py): norm, qkv product,
   q/k norms, rotary, Hadamard rotation, K/V write, paged attention, rotation
   back, o product, residual add + norm, gate/up product, SwiGLU, down product
   (or the MoE layer's C call, moe_block.c), residual add. What it removes is
   the Python between them: at 16 decode rows of a 135M model that was a
   quarter of a step. */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

typedef struct {
    const uint16_t *input_norm, *post_norm; /* bf16 [hidden] */
    const uint16_t *q_norm, *k_norm;        /* bf16 [head_dim] per-head norms, or NULL */
    GridWeightRef qkv[3];                   /* one grid, or q, k and v (qkv_parts of them) */
    GridWeightRef o, gate_up, down;         /* gate_up/down: the dense MLP or the shared
                                               expert (codes NULL: none) */
    const MoeRouting *routing;              /* a MoE layer, or NULL: a dense MLP */
    const MoeExpert *experts;
    int64_t gate_up_format, down_format, expert_intermediate;
    uint8_t *kv;                            /* this layer's [slots, 2, kv_heads, head_dim] */
    const float *k_scale, *v_scale;         /* write scales [kv_heads] */
    const float *k_factor, *v_factor;       /* read factors [kv_heads] */
    int64_t qkv_parts;                      /* 1, or 3 where no one grid holds q, k and v */
} DecodeLayer;

typedef struct {
    int64_t hidden, q_heads, kv_heads, head_dim, intermediate, rot_dim, interleaved,
        hadamard_block, kv_kind;
    const float *cos, *sin; /* float32 [max_positions, rot_dim / 2] */
    float eps, softmax_scale;
} DecodeModel;

static int product(const GridWeightRef *w, const uint16_t *x, int64_t rows, int64_t k, uint16_t *out,
                   int threads) {
    return grid_matmul(x, 1, rows, k, w->codes, w->scales, (int)w->format, w->rows, w->bias, out,
                       1, threads);
}

/* The qkv rows [tokens, width]: one product, or one per part (a Q4_K_M file's Q6_K v
   beside Q4_K q and k), each into its columns. A part's product quantizes the same
   input rows the same way, so the values are those of one joined product. */
static int qkv_product(const DecodeLayer *ly, const uint16_t *h, int64_t tokens, int64_t H,
                       int64_t width, uint16_t *qkv, uint16_t *part, int threads) {
    if (ly->qkv_parts <= 1) return product(&ly->qkv[0], h, tokens, H, qkv, threads);
    int status = 0;
    int64_t column = 0;
    for (int64_t p = 0; p < ly->qkv_parts; p++) {
        const GridWeightRef *w = &ly->qkv[p];
        /* One row is written in place; more go through scratch to be interleaved. */
        status |= product(w, h, tokens, H, tokens == 1 ? qkv + column : part, threads);
        if (tokens > 1)
            for (int64_t t = 0; t < tokens; t++)
                memcpy(qkv + t * width + column, part + t * w->rows, sizeof(uint16_t) * w->rows);
        column += w->rows;
    }
    return status;
}

/* x [tokens, hidden] bf16: the residual stream, updated in place through all layers.
   Returns 0, or -1 when scratch memory cannot be had (x is then unchanged only if
   the first allocation failed; the caller treats -1 as fatal). */
int decode_layers(const DecodeModel *m, const DecodeLayer *layers, int64_t count, uint16_t *x,
                  int64_t tokens, const int64_t *positions, const int64_t *slot_mapping,
                  const int64_t *context_slots, int64_t context_len, const int64_t *lens,
                  int threads) {
    const int64_t H = m->hidden, D = m->head_dim, Hq = m->q_heads, Hkv = m->kv_heads;
    const int64_t width = (Hq + 2 * Hkv) * D, qd = Hq * D, I = m->intermediate;
    uint16_t *h = malloc(sizeof(uint16_t) * tokens * H);
    uint16_t *qkv = malloc(sizeof(uint16_t) * tokens * width);
    uint16_t *q = malloc(sizeof(uint16_t) * tokens * qd);
    uint16_t *attn = malloc(sizeof(uint16_t) * tokens * qd);
    uint16_t *o = malloc(sizeof(uint16_t) * tokens * H);
    uint16_t *gu = malloc(sizeof(uint16_t) * tokens * 2 * I);
    uint16_t *act = malloc(sizeof(uint16_t) * tokens * I);
    uint16_t *part = malloc(sizeof(uint16_t) * tokens * width);
    int status = (h && qkv && q && attn && o && gu && act && part) ? 0 : -1;
    for (int64_t l = 0; l < count && status == 0; l++) {
        const DecodeLayer *ly = layers + l;
        rms_norm(x, NULL, ly->input_norm, m->eps, h, tokens, H, threads);
        status |= qkv_product(ly, h, tokens, H, width, qkv, part, threads);
        if (ly->q_norm) /* each head over its own D values, in place (read before written) */
            for (int64_t t = 0; t < tokens; t++) {
                rms_norm(qkv + t * width, NULL, ly->q_norm, m->eps, qkv + t * width, Hq, D, 1);
                rms_norm(qkv + t * width + qd, NULL, ly->k_norm, m->eps, qkv + t * width + qd,
                         Hkv, D, 1);
            }
        rope(qkv, tokens, Hq + Hkv, D, width, positions, m->cos, m->sin, m->rot_dim,
             (int)m->interleaved, threads);
        if (m->hadamard_block) hadamard(qkv, tokens, width, width, m->hadamard_block, NULL, threads);
        kv_write(qkv + qd, qkv + qd + Hkv * D, 1, tokens, Hkv, D, width, width, slot_mapping, ly->kv,
                 (int)m->kv_kind, ly->k_scale, ly->v_scale, threads);
        for (int64_t t = 0; t < tokens; t++) memcpy(q + t * qd, qkv + t * width, sizeof(uint16_t) * qd);
        status |= paged_decode(q, 1, ly->kv, (int)m->kv_kind, context_slots, lens, tokens, context_len,
                               Hq, Hkv, D, ly->k_factor, ly->v_factor, m->softmax_scale, attn, 1,
                               threads);
        if (m->hadamard_block) hadamard(attn, tokens, qd, qd, m->hadamard_block, NULL, threads);
        status |= product(&ly->o, attn, tokens, qd, o, threads);
        rms_norm(o, x, ly->post_norm, m->eps, h, tokens, H, threads);
        if (ly->routing) {
            const int shared = ly->gate_up.codes != NULL;
            status |= moe_block(ly->routing, h, tokens, H, ly->expert_intermediate, ly->experts,
                                (int)ly->gate_up_format, (int)ly->down_format,
                                shared ? &ly->gate_up : NULL, shared ? &ly->down : NULL,
                                ly->gate_up.rows / 2, o, threads);
        } else {
            status |= product(&ly->gate_up, h, tokens, H, gu, threads);
            silu_mul(gu, act, tokens, ly->gate_up.rows / 2, threads);
            status |= product(&ly->down, act, tokens, ly->gate_up.rows / 2, o, threads);
        }
        bf16_add_into(x, o, tokens * H);
    }
    free(h), free(qkv), free(q), free(attn), free(o), free(gu), free(act), free(part);
    return status ? -1 : 0;
}
