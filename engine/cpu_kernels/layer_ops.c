/* Elementwise layer pieces of a decode step on BF16 activations, one call each.

   In torch each of these is several small operators (casts, products, sums),
   and at decode sizes the per-operator cost dominates. The arithmetic is
   torch's, in float32, with the same points of rounding to bfloat16 where the
   torch code rounds (so results differ only by float32 summation order or
   exp's last bit):
   - rms_norm: y = w * bf16(x * rsqrt(mean(x^2) + eps)), optionally after
     x = bf16(x + residual) with the sum written back to the residual;
   - silu_mul: y = bf16(bf16(silu(gate)) * up) on a fused [gate | up] row;
   - hadamard: y = (x * gain) @ blockdiag(H) / sqrt(block) per row, in float32;
   - rope: NeoX or interleaved rotary on the first rot_dim values of each head. */
#include "simd_arch.h"
#include <math.h>
#include <stdint.h>

#include "simd.h"

/* Below this many values a call runs on one thread: forking costs more than it saves. */
#define PARALLEL_MIN 65536

static inline float bf16_to_f32(uint16_t v) {
    union { uint32_t u; float f; } c = {(uint32_t)v << 16};
    return c.f;
}

static inline uint16_t f32_to_bf16(float f) {
    union { float f; uint32_t u; } c = {f};
    if ((c.u & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((c.u >> 16) | 0x40); /* NaN */
    return (uint16_t)((c.u + 0x7FFF + ((c.u >> 16) & 1)) >> 16);
}

int rms_norm(const uint16_t *x, uint16_t *residual, const uint16_t *weight, float eps,
             uint16_t *out, int64_t rows, int64_t hidden, int threads) {
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) \
    if (rows * hidden >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *src = x + r * hidden;
        uint16_t *res = residual ? residual + r * hidden : 0;
        uint16_t *dst = out + r * hidden;
        __m512 squares = _mm512_setzero_ps();
        for (int64_t i = 0; i < hidden; i += 16) {
            const __mmask16 m = tail_mask(hidden - i);
            __m512 v = bf16x16_load_masked(src + i, m);
            if (res) {
                v = bf16x16_round(_mm512_add_ps(v, bf16x16_load_masked(res + i, m)));
                _mm256_mask_storeu_epi16(res + i, m, bf16x16_from(v));
            }
            squares = _mm512_fmadd_ps(v, v, squares);
        }
        const float sum = _mm512_reduce_add_ps(squares);
        const __m512 scale = _mm512_set1_ps(1.0f / sqrtf(sum / (float)hidden + eps));
        const uint16_t *values = res ? res : src;
        for (int64_t i = 0; i < hidden; i += 16) {
            const __mmask16 m = tail_mask(hidden - i);
            const __m512 normed = bf16x16_round(_mm512_mul_ps(bf16x16_load_masked(values + i, m), scale));
            const __m512 w = bf16x16_load_masked(weight + i, m);
            _mm256_mask_storeu_epi16(dst + i, m, bf16x16_from(_mm512_mul_ps(w, normed)));
        }
    }
    return 0;
}

int silu_mul(const uint16_t *gate_up, uint16_t *out, int64_t rows, int64_t width, int threads) {
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) \
    if (rows * width >= PARALLEL_MIN / 4) /* exp is dear: split sooner */
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *gate = gate_up + r * 2 * width, *up = gate + width;
        uint16_t *dst = out + r * width;
        for (int64_t i = 0; i < width; i += 16) {
            const __mmask16 m = tail_mask(width - i);
            const __m512 g = bf16x16_load_masked(gate + i, m);
            const __m512 u = bf16x16_load_masked(up + i, m);
            _mm256_mask_storeu_epi16(dst + i, m, bf16x16_from(swiglu16(g, u)));
        }
    }
    return 0;
}

static void hadamard_block(uint16_t *values, int64_t block, float norm, const float *gain) {
    __m512 v[64]; /* block <= 1024 */
    const int64_t n = block / 16;
    for (int64_t i = 0; i < n; i++) v[i] = bf16x16_load(values + 16 * i);
    if (gain)
        for (int64_t i = 0; i < n; i++) v[i] = _mm512_mul_ps(v[i], _mm512_loadu_ps(gain + 16 * i));
    hadamard_vectors(v, n);
    for (int64_t i = 0; i < n; i++)
        _mm256_storeu_si256((__m256i *)(values + 16 * i),
                            bf16x16_from(_mm512_mul_ps(v[i], _mm512_set1_ps(norm))));
}

/* The unnormalised Walsh-Hadamard butterflies on a block of fewer than 16 floats. */
static void butterflies_scalar(float *v, int64_t block) {
    for (int64_t h = 1; h < block; h *= 2)
        for (int64_t i = 0; i < block; i += 2 * h)
            for (int64_t j = i; j < i + h; j++) {
                const float a = v[j], b = v[j + h];
                v[j] = a + b;
                v[j + h] = a - b;
            }
}

static void hadamard_block_scalar(uint16_t *values, int64_t block, float norm,
                                  const float *gain) {
    float v[16];
    for (int64_t i = 0; i < block; i++) v[i] = bf16_to_f32(values[i]) * (gain ? gain[i] : 1.0f);
    butterflies_scalar(v, block);
    for (int64_t i = 0; i < block; i++) values[i] = f32_to_bf16(v[i] * norm);
}

/* rows of `dim` values (row stride `stride` elements), each split into blocks of
   `block` (a power of two, at most 1024) transformed independently; in place.
   `gain` (float32 [dim], or NULL) multiplies each column first, in float32: folding a
   norm's gain and the rotation into a weight's input columns is then one pass. */
int hadamard(uint16_t *x, int64_t rows, int64_t dim, int64_t stride, int64_t block,
             const float *gain, int threads) {
    const float norm = 1.0f / sqrtf((float)block);
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) \
    if (rows * dim >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t base = 0; base < dim; base += block) {
            if (block >= 16)
                hadamard_block(x + r * stride + base, block, norm, gain ? gain + base : NULL);
            else
                hadamard_block_scalar(x + r * stride + base, block, norm,
                                      gain ? gain + base : NULL);
        }
    return 0;
}

static void hadamard_block_f32(float *values, int64_t block, float norm, const float *gain) {
    if (block < 16) {
        for (int64_t i = 0; i < block; i++) values[i] *= gain ? gain[i] : 1.0f;
        butterflies_scalar(values, block);
        for (int64_t i = 0; i < block; i++) values[i] *= norm;
        return;
    }
    __m512 v[64]; /* block <= 1024 */
    const int64_t n = block / 16;
    for (int64_t i = 0; i < n; i++) {
        v[i] = _mm512_loadu_ps(values + 16 * i);
        if (gain) v[i] = _mm512_mul_ps(v[i], _mm512_loadu_ps(gain + 16 * i));
    }
    hadamard_vectors(v, n);
    for (int64_t i = 0; i < n; i++)
        _mm512_storeu_ps(values + 16 * i, _mm512_mul_ps(v[i], _mm512_set1_ps(norm)));
}

/* hadamard's transform on float32 rows, in place: a weight folded while it is still in
   the float32 it was loaded in, rounded once when it is cast. */
int hadamard_f32(float *x, int64_t rows, int64_t dim, int64_t stride, int64_t block,
                 const float *gain, int threads) {
    const float norm = 1.0f / sqrtf((float)block);
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) \
    if (rows * dim >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t base = 0; base < dim; base += block)
            hadamard_block_f32(x + r * stride + base, block, norm, gain ? gain + base : NULL);
    return 0;
}

/* x [tokens, heads, head_dim] bf16 with token stride `stride`; cos/sin float32
   [max_positions, rot_dim / 2]; in place. */
int rope(uint16_t *x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t stride,
         const int64_t *positions, const float *cos_table, const float *sin_table,
         int64_t rot_dim, int interleaved, int threads) {
    const int64_t half = rot_dim / 2;
#pragma omp parallel for num_threads(threads > 0 ? threads : 1) schedule(static) \
    if (tokens * heads * rot_dim >= PARALLEL_MIN)
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos_table + positions[t] * half, *s = sin_table + positions[t] * half;
        for (int64_t h = 0; h < heads; h++) {
            uint16_t *head = x + t * stride + h * head_dim;
            for (int64_t i = 0; i < half; i++) {
                const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
                const float first = bf16_to_f32(head[a]), second = bf16_to_f32(head[b]);
                head[a] = f32_to_bf16(first * c[i] - second * s[i]);
                head[b] = f32_to_bf16(second * c[i] + first * s[i]);
            }
        }
    }
    return 0;
}
