/* Every decoder layer of a DeepSeek V3 / Kimi K2 model (MLA attention, a MoE or dense
   feed-forward) for one decode step, in one call.

   The same kernels, in the same order and with the same rounding points, as the
   per-module CPU path (engine/models/deepseek_v3.py MLAAttention, SparseMoE's C layer,
   GatedMLP, PreNormDecoderLayer): input norm; the fused q_a/kv_a product; q_a's norm and
   the q_b product; the latent's norm and rotation; rotary on q_rope and k_rope and their
   rotation; the latent row written to the pool; absorbed attention (W_UK/W_UV as grid
   weights or a dense kv_b_proj); the o product; residual add and norm; the MoE layer
   (moe_block.c) or the dense MLP; residual add. What it removes is the Python between
   them, about half of a Kimi-shaped decode step at one row. */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

typedef struct {
    const uint16_t *input_norm, *post_norm, *q_a_norm, *kv_a_norm; /* bf16 */
    GridWeightRef qkv_a, q_b, o; /* fused [q_a | latent | k_rope] rows, q [H * (nope + rope)] */
    GridWeightRef k_b, v_b;      /* W_UK^T and W_UV per head; k_b.codes NULL: kv_b below */
    const uint16_t *kv_b;        /* dense kv_b_proj [H * (nope + v), r] bf16 */
    const float *gain;           /* the latent's gain (rotated cache), or NULL */
    uint8_t *rows;               /* this layer's latent pool [slots, r + rope] */
    float latent_scale, rope_scale, latent_factor, rope_factor; /* FP8 write / read */
    const MoeRouting *routing;   /* a MoE layer, or NULL: a dense MLP */
    const MoeExpert *experts;
    int64_t gate_up_format, down_format, expert_intermediate;
    GridWeightRef gate_up, down; /* the dense MLP, or the shared expert (codes NULL: none) */
} MLADecodeLayer;

typedef struct {
    int64_t hidden, heads, q_lora, nope, rope, v, r;
    int64_t latent_block, rope_block, interleaved, kv_kind;
    const float *cos, *sin; /* float32 [max_positions, rope / 2] */
    float eps, softmax_scale;
} MLADecodeModel;

/* One step's buffers, T rows each. */
typedef struct {
    uint16_t *h, *fused, *q_a, *q_a_n, *q, *latent, *latent_n, *k_rope, *attn, *o, *gu, *act;
} Scratch;

static int product(const GridWeightRef *w, const uint16_t *x, int64_t rows, int64_t k,
                   uint16_t *out, int threads) {
    return grid_matmul(x, 1, rows, k, w->codes, w->scales, (int)w->format, w->rows, w->bias, out,
                       1, threads);
}

/* Columns [from, from + n) of rows [T, width] -> contiguous [T, n]. */
static void columns(const uint16_t *src, int64_t width, int64_t from, int64_t n, int64_t T,
                    uint16_t *dst) {
    for (int64_t t = 0; t < T; t++) memcpy(dst + t * n, src + t * width + from, sizeof(uint16_t) * n);
}

static int attention(const MLADecodeModel *m, const MLADecodeLayer *ly, const Scratch *s,
                     int64_t T, const int64_t *positions, const int64_t *slot_mapping,
                     const int64_t *context_slots, int64_t L, const int64_t *lens, int threads) {
    const int64_t H = m->heads, head = m->nope + m->rope, width = m->q_lora + m->r + m->rope;
    int status = product(&ly->qkv_a, s->h, T, m->hidden, s->fused, threads);
    columns(s->fused, width, 0, m->q_lora, T, s->q_a);
    rms_norm(s->q_a, NULL, ly->q_a_norm, m->eps, s->q_a_n, T, m->q_lora, threads);
    status |= product(&ly->q_b, s->q_a_n, T, m->q_lora, s->q, threads);
    columns(s->fused, width, m->q_lora, m->r, T, s->latent);
    rms_norm(s->latent, NULL, ly->kv_a_norm, m->eps, s->latent_n, T, m->r, threads);
    if (m->latent_block) hadamard(s->latent_n, T, m->r, m->r, m->latent_block, NULL, threads);
    columns(s->fused, width, m->q_lora + m->r, m->rope, T, s->k_rope);
    rope(s->q + m->nope, T, H, head, H * head, positions, m->cos, m->sin, m->rope,
         (int)m->interleaved, threads);
    rope(s->k_rope, T, 1, m->rope, m->rope, positions, m->cos, m->sin, m->rope,
         (int)m->interleaved, threads);
    if (m->rope_block) {
        hadamard(s->q + m->nope, T * H, m->rope, head, m->rope_block, NULL, threads);
        hadamard(s->k_rope, T, m->rope, m->rope, m->rope_block, NULL, threads);
    }
    mla_write(s->latent_n, s->k_rope, T, m->r, m->rope, slot_mapping, ly->rows, (int)m->kv_kind,
              ly->latent_scale, ly->rope_scale);
    if (ly->k_b.codes)
        status |= mla_decode_grid(s->q, s->q + m->nope, H * head, head, H * head, head, 1,
                                  ly->k_b.codes, ly->k_b.scales, (int)ly->k_b.format,
                                  ly->v_b.codes, ly->v_b.scales, (int)ly->v_b.format, ly->gain,
                                  m->latent_block, ly->rows, (int)m->kv_kind, context_slots, lens,
                                  T, L, H, m->nope, m->rope, m->v, m->r, ly->latent_factor,
                                  ly->rope_factor, m->softmax_scale, s->attn, threads);
    else
        status |= mla_decode(s->q, s->q + m->nope, H * head, head, H * head, head, 1, ly->kv_b,
                             ly->rows, (int)m->kv_kind, context_slots, lens, T, L, H, m->nope,
                             m->rope, m->v, m->r, ly->latent_factor, ly->rope_factor,
                             m->softmax_scale, s->attn, threads);
    status |= product(&ly->o, s->attn, T, H * m->v, s->o, threads);
    return status;
}

static int feed_forward(const MLADecodeModel *m, const MLADecodeLayer *ly, const Scratch *s,
                        int64_t T, int threads) {
    const int has_mlp = ly->gate_up.codes != NULL;
    const int64_t I = ly->gate_up.rows / 2;
    if (ly->routing)
        return moe_block(ly->routing, s->h, T, m->hidden, ly->expert_intermediate, ly->experts,
                         (int)ly->gate_up_format, (int)ly->down_format,
                         has_mlp ? &ly->gate_up : NULL, has_mlp ? &ly->down : NULL, I, s->o,
                         threads);
    int status = product(&ly->gate_up, s->h, T, m->hidden, s->gu, threads);
    silu_mul(s->gu, s->act, T, I, threads);
    return status | product(&ly->down, s->act, T, I, s->o, threads);
}

/* x [tokens, hidden] bf16: the residual stream, updated in place through all layers.
   mlp_width: the widest dense MLP's intermediate size (its scratch). Returns 0, or -1 when
   scratch memory cannot be had or a kernel refuses (the caller treats it as fatal). */
int decode_mla_layers(const MLADecodeModel *m, const MLADecodeLayer *layers, int64_t count,
                      uint16_t *x, int64_t T, const int64_t *positions,
                      const int64_t *slot_mapping, const int64_t *context_slots, int64_t L,
                      const int64_t *lens, int64_t mlp_width, int threads) {
    const int64_t width = m->q_lora + m->r + m->rope, q_width = m->heads * (m->nope + m->rope);
    const int64_t sizes[12] = {m->hidden, width,         m->q_lora, m->q_lora,
                               q_width,   m->r,          m->r,      m->rope,
                               m->heads * m->v, m->hidden, 2 * mlp_width, mlp_width};
    uint16_t *buffers[12];
    int status = 0;
    for (int i = 0; i < 12; i++) {
        buffers[i] = malloc(sizeof(uint16_t) * (size_t)(T * (sizes[i] > 0 ? sizes[i] : 1)));
        if (!buffers[i]) status = -1;
    }
    const Scratch s = {buffers[0], buffers[1], buffers[2], buffers[3], buffers[4],  buffers[5],
                       buffers[6], buffers[7], buffers[8], buffers[9], buffers[10], buffers[11]};
    for (int64_t l = 0; l < count && status == 0; l++) {
        const MLADecodeLayer *ly = layers + l;
        rms_norm(x, NULL, ly->input_norm, m->eps, s.h, T, m->hidden, threads);
        status |= attention(m, ly, &s, T, positions, slot_mapping, context_slots, L, lens, threads);
        rms_norm(s.o, x, ly->post_norm, m->eps, s.h, T, m->hidden, threads);
        status |= feed_forward(m, ly, &s, T, threads);
        bf16_add_into(x, s.o, T * m->hidden);
    }
    for (int i = 0; i < 12; i++) free(buffers[i]);
    return status ? -1 : 0;
}
