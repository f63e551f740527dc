/* The kernels' entry points, for the ones that compose them (decode_layers.c). */
#ifndef RESIDENT_KERNELS_H
#define RESIDENT_KERNELS_H
#include <stdint.h>

/* How a KV cache stores its values. */
enum { KV_FLOAT32 = 0, KV_BF16 = 1, KV_FP8 = 2 };

/* One grid weight (grid_formats.h) as a composing kernel passes it to grid_matmul. */
typedef struct {
    const uint8_t *codes;
    const uint8_t *scales;
    const float *bias; /* float32 or NULL */
    int64_t rows;
    int64_t format; /* grid_formats.h */
} GridWeightRef;

/* One routed expert's packed weights: gate_up [2 * I, H] (gate rows, then up rows)
   and down [H, I], in the layouts of grid_formats.h. */
typedef struct {
    const uint8_t *gate_up_codes;
    const uint8_t *gate_up_scales;
    const uint8_t *down_codes;
    const uint8_t *down_scales;
} MoeExpert;

int grid_matmul(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *weight,
                const uint8_t *scales, int fmt, int64_t N, const float *bias, void *out,
                int out_bf16, int threads);
int paged_decode(const void *q, int q_bf16, const uint8_t *kv, int kv_kind, const int64_t *slots,
                 const int64_t *lens, int64_t B, int64_t L, int64_t Hq, int64_t Hkv, int64_t D,
                 const float *k_factor, const float *v_factor, float softmax_scale, void *out,
                 int out_bf16, int threads);
int kv_write(const void *k, const void *v, int in_bf16, int64_t tokens, int64_t heads, int64_t D,
             int64_t k_stride, int64_t v_stride, const int64_t *slots, uint8_t *storage, int kind,
             const float *k_scale, const float *v_scale, int threads);
int mla_decode(const void *q_nope, const void *q_rope, int64_t nope_stride_b, int64_t nope_stride_h,
               int64_t rope_stride_b, int64_t rope_stride_h, int bf16, const void *kv_b,
               const uint8_t *rows, int kv_kind, const int64_t *slots, const int64_t *lens,
               int64_t B, int64_t L, int64_t H, int64_t nope, int64_t rope, int64_t v, int64_t r,
               float latent_factor, float rope_factor, float softmax_scale, void *out, int threads);
/* engine/layers/moe_routing.py's RoutingConfig, with the router's weights (moe_block.c). */
typedef struct {
    int64_t experts, top_k, groups, top_groups;
    int64_t scoring, ranking, normalize;
    float scaling;
    const float *router; /* [experts, hidden] float32 */
    const float *bias;   /* [experts] float32 (the correction bias), or NULL */
} MoeRouting;

int moe_block(const MoeRouting *r, const uint16_t *x, int64_t T, int64_t H, int64_t I,
              const MoeExpert *experts, int gate_up_fmt, int down_fmt,
              const GridWeightRef *shared_gate_up, const GridWeightRef *shared_down, int64_t S,
              uint16_t *out, int threads);
int mla_decode_grid(const void *q_nope, const void *q_rope, int64_t nope_stride_b,
                    int64_t nope_stride_h, int64_t rope_stride_b, int64_t rope_stride_h, int bf16,
                    const uint8_t *kb_codes, const uint8_t *kb_scales, int kb_fmt,
                    const uint8_t *vb_codes, const uint8_t *vb_scales, int vb_fmt,
                    const float *gain, int64_t block, const uint8_t *rows, int kv_kind,
                    const int64_t *slots, const int64_t *lens, int64_t B, int64_t L, int64_t H,
                    int64_t nope, int64_t rope, int64_t v, int64_t r, float latent_factor,
                    float rope_factor, float softmax_scale, void *out, int threads);
int mla_write(const uint16_t *latent, const uint16_t *rope, int64_t tokens, int64_t r,
              int64_t rope_dim, const int64_t *slots, uint8_t *storage, int kind,
              float latent_scale, float rope_scale);
int moe_experts(const uint16_t *x, int64_t T, int64_t H, int64_t I, const int64_t *ids,
                const float *weights, int64_t k, const MoeExpert *experts, int64_t E,
                int gate_up_fmt, int down_fmt, uint16_t *out, int threads);
int rms_norm(const uint16_t *x, uint16_t *residual, const uint16_t *weight, float eps,
             uint16_t *out, int64_t rows, int64_t hidden, int threads);
int silu_mul(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t width, int threads);
int hadamard(uint16_t *x, int64_t rows, int64_t dim, int64_t stride, int64_t block,
             const float *gain, int threads);
int hadamard_f32(float *x, int64_t rows, int64_t dim, int64_t stride, int64_t block,
                 const float *gain, int threads);
int rope(uint16_t *x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t stride,
         const int64_t *positions, const float *cos_table, const float *sin_table, int64_t rot_dim,
         int interleaved, int threads);
#endif
