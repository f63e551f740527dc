/* A MoE layer for a few rows (decode steps) in one call: the router, the routing, the
   routed experts (moe_experts.c) and the shared expert.

   The module path (engine/layers/moe.py SparseMoE) spends a dozen torch calls on the
   router and the routing, three more on the shared expert and one on the sum, each
   with Python between: at one decode row that is more time than the experts' own
   products. Here the same steps run in C:

   - router logits in float32 (x widened from bf16, 16-lane sums: the order differs
     from torch's product by float32 rounding only);
   - scores (sigmoid or softmax), the correction bias for choosing, grouped top-k
     (groups ranked by their two best or their best), the top-k experts in descending
     order of choice as torch.topk gives them, weights from the unbiased scores,
     renormalised (the same 1e-20) and scaled (engine/layers/moe_routing.py);
   - the routed experts: moe_experts, as the module path calls it;
   - the shared expert: gate/up product, SwiGLU, down product, each rounded to bf16
     where the module path rounds, then the bf16 sum of the two parts. */
#include <math.h>
#include <stdlib.h>

#include "kernels.h"
#include "simd.h"

enum { SCORE_SIGMOID = 0, SCORE_SOFTMAX = 1 };
enum { RANK_NONE = 0, RANK_TOP2_SUM = 1, RANK_MAX = 2 };

/* x . router[e] over `hidden` values, x bf16. */
static float router_logit(const MoeRouting *r, const uint16_t *x, int64_t hidden, int64_t e) {
    const float *w = r->router + e * hidden;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < hidden; i += 16) {
        const __mmask16 m = tail_mask(hidden - i);
        acc = _mm512_fmadd_ps(bf16x16_load_masked(x + i, m), _mm512_maskz_loadu_ps(m, w + i), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* The index of the largest value of v[0, n) that `taken` does not mark (first on ties). */
static int64_t best_free(const float *v, const unsigned char *taken, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

/* One row's expert ids [top_k] and weights [top_k] from its logits; scratch holds
   3 * experts + groups floats and experts + groups bytes. */
static void route_row(const MoeRouting *r, float *logits, int64_t *ids, float *weights,
                      float *scratch, unsigned char *taken) {
    const int64_t E = r->experts, G = r->groups, per = E / G;
    float *scores = scratch, *choice = scratch + E, *group_score = scratch + 2 * E;
    if (r->scoring == SCORE_SIGMOID) {
        for (int64_t e = 0; e < E; e++) scores[e] = 1.0f / (1.0f + expf(-logits[e]));
    } else {
        float top = -INFINITY, total = 0.0f;
        for (int64_t e = 0; e < E; e++) top = fmaxf(top, logits[e]);
        for (int64_t e = 0; e < E; e++) total += scores[e] = expf(logits[e] - top);
        for (int64_t e = 0; e < E; e++) scores[e] /= total;
    }
    for (int64_t e = 0; e < E; e++) choice[e] = scores[e] + (r->bias ? r->bias[e] : 0.0f);
    if (r->ranking != RANK_NONE && G > 1) {
        for (int64_t g = 0; g < G; g++) {
            const float *c = choice + g * per;
            float first = -INFINITY, second = -INFINITY;
            for (int64_t i = 0; i < per; i++) {
                if (c[i] > first) second = first, first = c[i];
                else if (c[i] > second) second = c[i];
            }
            group_score[g] = r->ranking == RANK_TOP2_SUM ? first + second : first;
        }
        unsigned char *kept = taken + E;
        for (int64_t g = 0; g < G; g++) kept[g] = 0;
        for (int64_t n = 0; n < r->top_groups; n++) kept[best_free(group_score, kept, G)] = 1;
        for (int64_t e = 0; e < E; e++)
            if (!kept[e / per]) choice[e] = -INFINITY;
    }
    for (int64_t e = 0; e < E; e++) taken[e] = 0;
    float total = 0.0f;
    for (int64_t k = 0; k < r->top_k; k++) {
        const int64_t e = best_free(choice, taken, E);
        taken[e] = 1, ids[k] = e, weights[k] = scores[e];
        total += scores[e];
    }
    for (int64_t k = 0; k < r->top_k; k++)
        weights[k] = (r->normalize ? weights[k] / (total + 1e-20f) : weights[k]) * r->scaling;
}

/* ids [T, top_k] and weights [T, top_k] for rows x [T, hidden] bf16. The router's
   logits are split over the threads: its float32 weights (experts x hidden, 320 KiB
   for 64 experts of 1280) are read from memory once a step, which on one core took as
   long as a tenth of the layer's experts. Returns 0, or -1 without memory. */
int moe_route(const MoeRouting *r, const uint16_t *x, int64_t T, int64_t hidden, int64_t *ids,
              float *weights, int threads) {
    const int64_t E = r->experts;
    float *logits = malloc(sizeof(float) * (size_t)(T * E));
    float *scratch = malloc(sizeof(float) * (size_t)(3 * E + r->groups));
    unsigned char *taken = malloc((size_t)(E + r->groups));
    if (!logits || !scratch || !taken) {
        free(logits), free(scratch), free(taken);
        return -1;
    }
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static)
    for (int64_t i = 0; i < T * E; i++)
        logits[i] = router_logit(r, x + (i / E) * hidden, hidden, i % E);
    for (int64_t t = 0; t < T; t++)
        route_row(r, logits + t * E, ids + t * r->top_k, weights + t * r->top_k, scratch, taken);
    free(logits), free(scratch), free(taken);
    return 0;
}

/* out [T, H] bf16 = the MoE layer of rows x [T, H] bf16: routed experts [E] (moe_experts'
   layout, intermediate I) plus, unless shared_gate_up is NULL, the shared expert
   (gate_up [2 * S, H], down [H, S]). Returns 0, -1 without memory, -2 for a format or
   shape the products do not take. */
int moe_block(const MoeRouting *r, const uint16_t *x, int64_t T, int64_t H, int64_t I,
              const MoeExpert *experts, int gate_up_fmt, int down_fmt,
              const GridWeightRef *shared_gate_up, const GridWeightRef *shared_down, int64_t S,
              uint16_t *out, int threads) {
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(T * r->top_k));
    float *weights = malloc(sizeof(float) * (size_t)(T * r->top_k));
    uint16_t *gu = shared_gate_up ? malloc(sizeof(uint16_t) * (size_t)(T * 2 * S)) : NULL;
    uint16_t *act = shared_gate_up ? malloc(sizeof(uint16_t) * (size_t)(T * S)) : NULL;
    uint16_t *shared = shared_gate_up ? malloc(sizeof(uint16_t) * (size_t)(T * H)) : NULL;
    int status = ids && weights && (!shared_gate_up || (gu && act && shared)) ? 0 : -1;
    if (status == 0) status = moe_route(r, x, T, H, ids, weights, threads);
    if (status == 0)
        status = moe_experts(x, T, H, I, ids, weights, r->top_k, experts, r->experts,
                             gate_up_fmt, down_fmt, out, threads);
    if (status == 0 && shared_gate_up) {
        status = grid_matmul(x, 1, T, H, shared_gate_up->codes, shared_gate_up->scales,
                             (int)shared_gate_up->format, 2 * S, shared_gate_up->bias, gu, 1,
                             threads);
        if (status == 0) silu_mul(gu, act, T, S, threads);
        if (status == 0)
            status = grid_matmul(act, 1, T, S, shared_down->codes, shared_down->scales,
                                 (int)shared_down->format, H, shared_down->bias, shared, 1,
                                 threads);
        if (status == 0) bf16_add_into(out, shared, T * H);
    }
    free(ids), free(weights), free(gu), free(act), free(shared);
    return status;
}
