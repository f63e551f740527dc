/* The AVX-512 operations the CPU kernels use, built from AVX2, FMA and F16C, for CPUs
   without AVX-512 (AMD Zen 2 and 3, Intel's client cores): the same C sources compile
   against this header (library.py's AVX2 build, -DRESIDENT_AVX2) and run there.

   A 512-bit vector is a pair of 256-bit ones (lanes 0-7, 8-15); a mask stays the 16-bit
   integer AVX-512 uses. Every operation gives what its AVX-512 namesake gives, lane for
   lane, integer results exactly: vpdpbusd's u8 x s8 products are summed in 16-bit pairs
   by vpmaddwd, which cannot saturate (vpmaddubsw could, for 8-bit codes). Masked loads
   never touch memory outside the mask, as AVX-512's do not. Only horizontal reductions
   may sum in another order. The names are redirected by macros after immintrin.h, so
   the kernels' sources are unchanged. */
#ifndef RESIDENT_AVX512_ON_AVX2_H
#define RESIDENT_AVX512_ON_AVX2_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    __m256 lo, hi;
} r512;
typedef struct {
    __m256i lo, hi;
} r512i;

#define E2 static inline __attribute__((always_inline))

/* ---- masks: bit i of a 16-bit mask <-> lane i all ones ---- */
E2 __m256i e2_mask8(unsigned bits) {
    const __m256i pick = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)(bits & 0xFF)), pick),
                              pick);
}
E2 __mmask16 e2_bits(__m256 lo, __m256 hi) {
    return (__mmask16)((unsigned)_mm256_movemask_ps(lo) | ((unsigned)_mm256_movemask_ps(hi) << 8));
}
#define e2_mlo(k) e2_mask8((unsigned)(k))
#define e2_mhi(k) e2_mask8((unsigned)(k) >> 8)
E2 __m256 e2_blend(__m256 no, __m256 yes, __m256i m) {
    return _mm256_blendv_ps(no, yes, _mm256_castsi256_ps(m));
}

/* ---- construction, loads and stores ---- */
E2 r512 e2_setzero_ps(void) { return (r512){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
E2 r512i e2_setzero_si512(void) {
    return (r512i){_mm256_setzero_si256(), _mm256_setzero_si256()};
}
E2 r512 e2_set1_ps(float v) { return (r512){_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
E2 r512i e2_set1_epi32(int v) { return (r512i){_mm256_set1_epi32(v), _mm256_set1_epi32(v)}; }
E2 r512i e2_set1_epi16(short v) { return (r512i){_mm256_set1_epi16(v), _mm256_set1_epi16(v)}; }
E2 r512i e2_set1_epi8(char v) { return (r512i){_mm256_set1_epi8(v), _mm256_set1_epi8(v)}; }
E2 r512i e2_setr_epi32(int a0, int a1, int a2, int a3, int a4, int a5, int a6, int a7, int a8,
                       int a9, int a10, int a11, int a12, int a13, int a14, int a15) {
    return (r512i){_mm256_setr_epi32(a0, a1, a2, a3, a4, a5, a6, a7),
                   _mm256_setr_epi32(a8, a9, a10, a11, a12, a13, a14, a15)};
}
E2 r512i e2_set_epi32(int a15, int a14, int a13, int a12, int a11, int a10, int a9, int a8,
                      int a7, int a6, int a5, int a4, int a3, int a2, int a1, int a0) {
    return e2_setr_epi32(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15);
}
E2 r512 e2_loadu_ps(const void *p) {
    return (r512){_mm256_loadu_ps((const float *)p), _mm256_loadu_ps((const float *)p + 8)};
}
E2 void e2_storeu_ps(void *p, r512 v) {
    _mm256_storeu_ps((float *)p, v.lo);
    _mm256_storeu_ps((float *)p + 8, v.hi);
}
E2 r512i e2_loadu_si512(const void *p) {
    return (r512i){_mm256_loadu_si256((const __m256i *)p),
                   _mm256_loadu_si256((const __m256i *)p + 1)};
}
E2 void e2_storeu_si512(void *p, r512i v) {
    _mm256_storeu_si256((__m256i *)p, v.lo);
    _mm256_storeu_si256((__m256i *)p + 1, v.hi);
}
E2 r512 e2_maskz_loadu_ps(__mmask16 k, const void *p) {
    if (k == 0xFFFF) return e2_loadu_ps(p);
    const float *f = (const float *)p;
    return (r512){_mm256_maskload_ps(f, e2_mlo(k)), _mm256_maskload_ps(f + 8, e2_mhi(k))};
}
E2 r512 e2_mask_loadu_ps(r512 src, __mmask16 k, const void *p) {
    const r512 v = e2_maskz_loadu_ps(k, p);
    return (r512){e2_blend(src.lo, v.lo, e2_mlo(k)), e2_blend(src.hi, v.hi, e2_mhi(k))};
}
E2 void e2_mask_storeu_ps(void *p, __mmask16 k, r512 v) {
    float *f = (float *)p;
    _mm256_maskstore_ps(f, e2_mlo(k), v.lo);
    _mm256_maskstore_ps(f + 8, e2_mhi(k), v.hi);
}
/* Byte and 16-bit element masks have no AVX2 instruction: the elements go one by one. */
E2 __m256i e2_256_maskz_loadu_epi16(__mmask16 k, const void *p) {
    if (k == 0xFFFF) return _mm256_loadu_si256((const __m256i *)p);
    uint16_t v[16] = {0};
    for (int i = 0; i < 16; i++)
        if (k >> i & 1) memcpy(&v[i], (const uint16_t *)p + i, 2);
    return _mm256_loadu_si256((const __m256i *)v);
}
E2 void e2_256_mask_storeu_epi16(void *p, __mmask16 k, __m256i v) {
    if (k == 0xFFFF) {
        _mm256_storeu_si256((__m256i *)p, v);
        return;
    }
    uint16_t s[16];
    _mm256_storeu_si256((__m256i *)s, v);
    for (int i = 0; i < 16; i++)
        if (k >> i & 1) memcpy((uint16_t *)p + i, &s[i], 2);
}
E2 __m256i e2_256_maskz_loadu_epi8(__mmask32 k, const void *p) {
    if (k == 0xFFFFFFFFu) return _mm256_loadu_si256((const __m256i *)p);
    uint8_t v[32] = {0};
    for (int i = 0; i < 32; i++)
        if (k >> i & 1) v[i] = ((const uint8_t *)p)[i];
    return _mm256_loadu_si256((const __m256i *)v);
}
E2 __m128i e2_128_maskz_loadu_epi8(__mmask16 k, const void *p) {
    if (k == 0xFFFF) return _mm_loadu_si128((const __m128i *)p);
    uint8_t v[16] = {0};
    for (int i = 0; i < 16; i++)
        if (k >> i & 1) v[i] = ((const uint8_t *)p)[i];
    return _mm_loadu_si128((const __m128i *)v);
}

/* ---- casts ---- */
E2 r512 e2_castsi512_ps(r512i v) {
    return (r512){_mm256_castsi256_ps(v.lo), _mm256_castsi256_ps(v.hi)};
}
E2 r512i e2_castps_si512(r512 v) {
    return (r512i){_mm256_castps_si256(v.lo), _mm256_castps_si256(v.hi)};
}
E2 __m256i e2_castsi512_si256(r512i v) { return v.lo; }
#define e2_extracti64x4_epi64(v, i) ((i) ? (v).hi : (v).lo)

/* ---- float arithmetic, lane by lane ---- */
#define E2_PS2(name, op)                                                                 \
    E2 r512 name(r512 a, r512 b) { return (r512){op(a.lo, b.lo), op(a.hi, b.hi)}; }
E2_PS2(e2_add_ps, _mm256_add_ps)
E2_PS2(e2_sub_ps, _mm256_sub_ps)
E2_PS2(e2_mul_ps, _mm256_mul_ps)
E2_PS2(e2_div_ps, _mm256_div_ps)
E2_PS2(e2_max_ps, _mm256_max_ps)
E2_PS2(e2_min_ps, _mm256_min_ps)
E2_PS2(e2_unpacklo_ps, _mm256_unpacklo_ps)
E2_PS2(e2_unpackhi_ps, _mm256_unpackhi_ps)
E2 r512 e2_fmadd_ps(r512 a, r512 b, r512 c) {
    return (r512){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
E2 r512 e2_fnmadd_ps(r512 a, r512 b, r512 c) {
    return (r512){_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
E2 r512 e2_fmsub_ps(r512 a, r512 b, r512 c) {
    return (r512){_mm256_fmsub_ps(a.lo, b.lo, c.lo), _mm256_fmsub_ps(a.hi, b.hi, c.hi)};
}
E2 r512 e2_abs_ps(r512 a) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    return (r512){_mm256_and_ps(a.lo, magnitude), _mm256_and_ps(a.hi, magnitude)};
}
#define e2_roundscale_ps(a, mode)                                                         \
    ((r512){_mm256_round_ps((a).lo, (mode)), _mm256_round_ps((a).hi, (mode))})
/* a * 2^n for integral n whose 2^n is a normal float (the kernels' exp clamps to +-87). */
E2 r512 e2_scalef_ps(r512 a, r512 n) {
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 lo = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.lo), bias), 23));
    const __m256 hi = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.hi), bias), 23));
    return (r512){_mm256_mul_ps(a.lo, lo), _mm256_mul_ps(a.hi, hi)};
}
#define e2_cmp_ps_mask(a, b, pred)                                                        \
    e2_bits(_mm256_cmp_ps((a).lo, (b).lo, (pred)), _mm256_cmp_ps((a).hi, (b).hi, (pred)))
#define e2_shuffle_ps(a, b, imm)                                                          \
    ((r512){_mm256_shuffle_ps((a).lo, (b).lo, (imm)), _mm256_shuffle_ps((a).hi, (b).hi, (imm))})

/* ---- masked float moves ---- */
E2 r512 e2_mask_mov_ps(r512 src, __mmask16 k, r512 a) {
    return (r512){e2_blend(src.lo, a.lo, e2_mlo(k)), e2_blend(src.hi, a.hi, e2_mhi(k))};
}
E2 r512 e2_maskz_mov_ps(__mmask16 k, r512 a) { return e2_mask_mov_ps(e2_setzero_ps(), k, a); }
E2 r512 e2_mask_blend_ps(__mmask16 k, r512 a, r512 b) { return e2_mask_mov_ps(a, k, b); }
E2 r512 e2_maskz_mul_ps(__mmask16 k, r512 a, r512 b) {
    return e2_maskz_mov_ps(k, e2_mul_ps(a, b));
}
E2 r512 e2_mask_sub_ps(r512 src, __mmask16 k, r512 a, r512 b) {
    return e2_mask_mov_ps(src, k, e2_sub_ps(a, b));
}

/* ---- integer arithmetic and logic ---- */
#define E2_SI2(name, op)                                                                 \
    E2 r512i name(r512i a, r512i b) { return (r512i){op(a.lo, b.lo), op(a.hi, b.hi)}; }
E2_SI2(e2_add_epi32, _mm256_add_epi32)
E2_SI2(e2_sub_epi32, _mm256_sub_epi32)
E2_SI2(e2_and_si512, _mm256_and_si256)
E2_SI2(e2_or_si512, _mm256_or_si256)
E2_SI2(e2_xor_si512, _mm256_xor_si256)
#define e2_srli_epi32(a, n) ((r512i){_mm256_srli_epi32((a).lo, (n)), _mm256_srli_epi32((a).hi, (n))})
#define e2_slli_epi32(a, n) ((r512i){_mm256_slli_epi32((a).lo, (n)), _mm256_slli_epi32((a).hi, (n))})
#define e2_srli_epi16(a, n) ((r512i){_mm256_srli_epi16((a).lo, (n)), _mm256_srli_epi16((a).hi, (n))})
#define e2_slli_epi16(a, n) ((r512i){_mm256_slli_epi16((a).lo, (n)), _mm256_slli_epi16((a).hi, (n))})
E2 r512i e2_mask_mov_epi32(r512i src, __mmask16 k, r512i a) {
    return (r512i){_mm256_blendv_epi8(src.lo, a.lo, e2_mlo(k)),
                   _mm256_blendv_epi8(src.hi, a.hi, e2_mhi(k))};
}
E2 __mmask16 e2_test_epi32_mask(r512i a, r512i b) {
    const __m256i zero = _mm256_setzero_si256();
    const __m256i lo = _mm256_cmpeq_epi32(_mm256_and_si256(a.lo, b.lo), zero);
    const __m256i hi = _mm256_cmpeq_epi32(_mm256_and_si256(a.hi, b.hi), zero);
    return (__mmask16)~e2_bits(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi));
}
/* (a & b) | c, bitwise: the only truth table (0xEA) the kernels ask vpternlogd for. */
#define e2_ternarylogic_epi32(a, b, c, imm)                                              \
    (__extension__({                                                                      \
        _Static_assert((imm) == 0xEA, "only (a & b) | c is built for AVX2");             \
        e2_or_si512(e2_and_si512((a), (b)), (c));                                        \
    }))
/* vpdpbusd: acc + sums of 4 products of unsigned bytes of a with signed bytes of b, exact:
   the bytes widen to 16 bits (even and odd bytes apart) and vpmaddwd adds pairs in int32. */
E2 __m256i e2_dpbusd256(__m256i acc, __m256i a, __m256i b) {
    const __m256i low = _mm256_set1_epi16(0x00FF);
    const __m256i a_even = _mm256_and_si256(a, low), a_odd = _mm256_srli_epi16(a, 8);
    const __m256i b_even = _mm256_srai_epi16(_mm256_slli_epi16(b, 8), 8);
    const __m256i b_odd = _mm256_srai_epi16(b, 8);
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(a_even, b_even));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a_odd, b_odd));
}
E2 r512i e2_dpbusd_epi32(r512i acc, r512i a, r512i b) {
    return (r512i){e2_dpbusd256(acc.lo, a.lo, b.lo), e2_dpbusd256(acc.hi, a.hi, b.hi)};
}

/* ---- conversions ---- */
E2 r512 e2_cvtepi32_ps(r512i a) { return (r512){_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
E2 r512i e2_cvtps_epi32(r512 a) {
    return (r512i){_mm256_cvtps_epi32(a.lo), _mm256_cvtps_epi32(a.hi)};
}
E2 r512 e2_cvtph_ps(__m256i h) {
    return (r512){_mm256_cvtph_ps(_mm256_castsi256_si128(h)),
                  _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
}
E2 r512i e2_cvtepu16_epi32(__m256i a) {
    return (r512i){_mm256_cvtepu16_epi32(_mm256_castsi256_si128(a)),
                   _mm256_cvtepu16_epi32(_mm256_extracti128_si256(a, 1))};
}
E2 r512i e2_cvtepu8_epi32(__m128i a) {
    return (r512i){_mm256_cvtepu8_epi32(a), _mm256_cvtepu8_epi32(_mm_srli_si128(a, 8))};
}
E2 r512i e2_cvtepi8_epi32(__m128i a) {
    return (r512i){_mm256_cvtepi8_epi32(a), _mm256_cvtepi8_epi32(_mm_srli_si128(a, 8))};
}
E2 r512i e2_cvtepi8_epi16(__m256i a) {
    return (r512i){_mm256_cvtepi8_epi16(_mm256_castsi256_si128(a)),
                   _mm256_cvtepi8_epi16(_mm256_extracti128_si256(a, 1))};
}
/* 16 int32 -> int16 or int8: truncated (the low bits kept) or, for sepi8, saturated. */
E2 __m256i e2_cvtepi32_epi16(r512i a) {
    const __m256i low = _mm256_set1_epi32(0xFFFF);
    const __m256i lo = _mm256_and_si256(a.lo, low), hi = _mm256_and_si256(a.hi, low);
    const __m128i first = _mm_packus_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
    const __m128i second = _mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
    return _mm256_set_m128i(second, first);
}
E2 __m128i e2_cvtepi32_epi8(r512i a) {
    const __m256i low = _mm256_set1_epi32(0xFF);
    const __m256i lo = _mm256_and_si256(a.lo, low), hi = _mm256_and_si256(a.hi, low);
    const __m128i first = _mm_packus_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
    const __m128i second = _mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
    return _mm_packus_epi16(first, second);
}
E2 __m128i e2_cvtsepi32_epi8(r512i a) {
    const __m128i first = _mm_packs_epi32(_mm256_castsi256_si128(a.lo), _mm256_extracti128_si256(a.lo, 1));
    const __m128i second = _mm_packs_epi32(_mm256_castsi256_si128(a.hi), _mm256_extracti128_si256(a.hi, 1));
    return _mm_packs_epi16(first, second);
}

/* ---- permutations across the 16 lanes ---- */
/* 128-bit lane q (0-3) of a. */
#define e2_quarter_ps(a, q)                                                               \
    ((q) == 0   ? _mm256_castps256_ps128((a).lo)                                          \
     : (q) == 1 ? _mm256_extractf128_ps((a).lo, 1)                                        \
     : (q) == 2 ? _mm256_castps256_ps128((a).hi)                                          \
                : _mm256_extractf128_ps((a).hi, 1))
#define e2_shuffle_f32x4(a, b, imm)                                                       \
    ((r512){_mm256_set_m128(e2_quarter_ps((a), ((imm) >> 2) & 3), e2_quarter_ps((a), (imm) & 3)), \
            _mm256_set_m128(e2_quarter_ps((b), ((imm) >> 6) & 3),                         \
                            e2_quarter_ps((b), ((imm) >> 4) & 3))})
/* One 8-lane half of a 16-lane permutation: lane i takes lo[idx & 7] or hi[idx & 7] by
   bit 3 of idx. */
E2 __m256 e2_pick16(__m256 lo, __m256 hi, __m256i idx) {
    const __m256 from_lo = _mm256_permutevar8x32_ps(lo, idx);
    const __m256 from_hi = _mm256_permutevar8x32_ps(hi, idx);
    const __m256i upper = _mm256_slli_epi32(idx, 28); /* bit 3 to the sign */
    return _mm256_blendv_ps(from_lo, from_hi, _mm256_castsi256_ps(upper));
}
E2 r512 e2_permutexvar_ps(r512i idx, r512 a) {
    return (r512){e2_pick16(a.lo, a.hi, idx.lo), e2_pick16(a.lo, a.hi, idx.hi)};
}
E2 __m256i e2_pick32(r512i a, r512i b, __m256i idx) {
    const __m256 from_a = e2_pick16(_mm256_castsi256_ps(a.lo), _mm256_castsi256_ps(a.hi), idx);
    const __m256 from_b = e2_pick16(_mm256_castsi256_ps(b.lo), _mm256_castsi256_ps(b.hi), idx);
    const __m256i second = _mm256_slli_epi32(idx, 27); /* bit 4 to the sign */
    return _mm256_castps_si256(_mm256_blendv_ps(from_a, from_b, _mm256_castsi256_ps(second)));
}
E2 r512i e2_permutex2var_epi32(r512i a, r512i idx, r512i b) {
    return (r512i){e2_pick32(a, b, idx.lo), e2_pick32(a, b, idx.hi)};
}

/* ---- horizontal reductions ---- */
E2 float e2_reduce_add_ps(r512 a) {
    __m256 s = _mm256_add_ps(a.lo, a.hi);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
E2 float e2_reduce_max_ps(r512 a) {
    __m256 s = _mm256_max_ps(a.lo, a.hi);
    __m128 q = _mm_max_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    q = _mm_max_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
E2 int e2_reduce_add_epi32(r512i a) {
    __m256i s = _mm256_add_epi32(a.lo, a.hi);
    __m128i q = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0x4E));
    q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 0xB1));
    return _mm_cvtsi128_si32(q);
}

/* ---- the kernels' names, redirected ---- */
/* (#undef first: GCC defines some of them as macros itself) */
#undef __m512
#define __m512 r512
#undef __m512i
#define __m512i r512i
#undef _mm512_setzero_ps
#define _mm512_setzero_ps e2_setzero_ps
#undef _mm512_setzero_si512
#define _mm512_setzero_si512 e2_setzero_si512
#undef _mm512_set1_ps
#define _mm512_set1_ps e2_set1_ps
#undef _mm512_set1_epi32
#define _mm512_set1_epi32 e2_set1_epi32
#undef _mm512_set1_epi16
#define _mm512_set1_epi16 e2_set1_epi16
#undef _mm512_set1_epi8
#define _mm512_set1_epi8 e2_set1_epi8
#undef _mm512_setr_epi32
#define _mm512_setr_epi32 e2_setr_epi32
#undef _mm512_set_epi32
#define _mm512_set_epi32 e2_set_epi32
#undef _mm512_loadu_ps
#define _mm512_loadu_ps e2_loadu_ps
#undef _mm512_storeu_ps
#define _mm512_storeu_ps e2_storeu_ps
#undef _mm512_loadu_si512
#define _mm512_loadu_si512 e2_loadu_si512
#undef _mm512_storeu_si512
#define _mm512_storeu_si512 e2_storeu_si512
#undef _mm512_maskz_loadu_ps
#define _mm512_maskz_loadu_ps e2_maskz_loadu_ps
#undef _mm512_mask_loadu_ps
#define _mm512_mask_loadu_ps e2_mask_loadu_ps
#undef _mm512_mask_storeu_ps
#define _mm512_mask_storeu_ps e2_mask_storeu_ps
#undef _mm256_maskz_loadu_epi16
#define _mm256_maskz_loadu_epi16 e2_256_maskz_loadu_epi16
#undef _mm256_mask_storeu_epi16
#define _mm256_mask_storeu_epi16 e2_256_mask_storeu_epi16
#undef _mm256_maskz_loadu_epi8
#define _mm256_maskz_loadu_epi8 e2_256_maskz_loadu_epi8
#undef _mm_maskz_loadu_epi8
#define _mm_maskz_loadu_epi8 e2_128_maskz_loadu_epi8
#undef _mm512_castsi512_ps
#define _mm512_castsi512_ps e2_castsi512_ps
#undef _mm512_castps_si512
#define _mm512_castps_si512 e2_castps_si512
#undef _mm512_castsi512_si256
#define _mm512_castsi512_si256 e2_castsi512_si256
#undef _mm512_extracti64x4_epi64
#define _mm512_extracti64x4_epi64 e2_extracti64x4_epi64
#undef _mm512_add_ps
#define _mm512_add_ps e2_add_ps
#undef _mm512_sub_ps
#define _mm512_sub_ps e2_sub_ps
#undef _mm512_mul_ps
#define _mm512_mul_ps e2_mul_ps
#undef _mm512_div_ps
#define _mm512_div_ps e2_div_ps
#undef _mm512_max_ps
#define _mm512_max_ps e2_max_ps
#undef _mm512_min_ps
#define _mm512_min_ps e2_min_ps
#undef _mm512_unpacklo_ps
#define _mm512_unpacklo_ps e2_unpacklo_ps
#undef _mm512_unpackhi_ps
#define _mm512_unpackhi_ps e2_unpackhi_ps
#undef _mm512_fmadd_ps
#define _mm512_fmadd_ps e2_fmadd_ps
#undef _mm512_fnmadd_ps
#define _mm512_fnmadd_ps e2_fnmadd_ps
#undef _mm512_fmsub_ps
#define _mm512_fmsub_ps e2_fmsub_ps
#undef _mm512_abs_ps
#define _mm512_abs_ps e2_abs_ps
#undef _mm512_roundscale_ps
#define _mm512_roundscale_ps e2_roundscale_ps
#undef _mm512_scalef_ps
#define _mm512_scalef_ps e2_scalef_ps
#undef _mm512_cmp_ps_mask
#define _mm512_cmp_ps_mask e2_cmp_ps_mask
#undef _mm512_shuffle_ps
#define _mm512_shuffle_ps e2_shuffle_ps
#undef _mm512_mask_mov_ps
#define _mm512_mask_mov_ps e2_mask_mov_ps
#undef _mm512_maskz_mov_ps
#define _mm512_maskz_mov_ps e2_maskz_mov_ps
#undef _mm512_mask_blend_ps
#define _mm512_mask_blend_ps e2_mask_blend_ps
#undef _mm512_maskz_mul_ps
#define _mm512_maskz_mul_ps e2_maskz_mul_ps
#undef _mm512_mask_sub_ps
#define _mm512_mask_sub_ps e2_mask_sub_ps
#undef _mm512_add_epi32
#define _mm512_add_epi32 e2_add_epi32
#undef _mm512_sub_epi32
#define _mm512_sub_epi32 e2_sub_epi32
#undef _mm512_and_si512
#define _mm512_and_si512 e2_and_si512
#undef _mm512_or_si512
#define _mm512_or_si512 e2_or_si512
#undef _mm512_xor_si512
#define _mm512_xor_si512 e2_xor_si512
#undef _mm512_srli_epi32
#define _mm512_srli_epi32 e2_srli_epi32
#undef _mm512_slli_epi32
#define _mm512_slli_epi32 e2_slli_epi32
#undef _mm512_srli_epi16
#define _mm512_srli_epi16 e2_srli_epi16
#undef _mm512_slli_epi16
#define _mm512_slli_epi16 e2_slli_epi16
#undef _mm512_mask_mov_epi32
#define _mm512_mask_mov_epi32 e2_mask_mov_epi32
#undef _mm512_test_epi32_mask
#define _mm512_test_epi32_mask e2_test_epi32_mask
#undef _mm512_ternarylogic_epi32
#define _mm512_ternarylogic_epi32 e2_ternarylogic_epi32
#undef _mm512_dpbusd_epi32
#define _mm512_dpbusd_epi32 e2_dpbusd_epi32
#undef _mm512_cvtepi32_ps
#define _mm512_cvtepi32_ps e2_cvtepi32_ps
#undef _mm512_cvtps_epi32
#define _mm512_cvtps_epi32 e2_cvtps_epi32
#undef _mm512_cvtph_ps
#define _mm512_cvtph_ps e2_cvtph_ps
#undef _mm512_cvtepu16_epi32
#define _mm512_cvtepu16_epi32 e2_cvtepu16_epi32
#undef _mm512_cvtepu8_epi32
#define _mm512_cvtepu8_epi32 e2_cvtepu8_epi32
#undef _mm512_cvtepi8_epi32
#define _mm512_cvtepi8_epi32 e2_cvtepi8_epi32
#undef _mm512_cvtepi8_epi16
#define _mm512_cvtepi8_epi16 e2_cvtepi8_epi16
#undef _mm512_cvtepi32_epi16
#define _mm512_cvtepi32_epi16 e2_cvtepi32_epi16
#undef _mm512_cvtepi32_epi8
#define _mm512_cvtepi32_epi8 e2_cvtepi32_epi8
#undef _mm512_cvtsepi32_epi8
#define _mm512_cvtsepi32_epi8 e2_cvtsepi32_epi8
#undef _mm512_shuffle_f32x4
#define _mm512_shuffle_f32x4 e2_shuffle_f32x4
#undef _mm512_permutexvar_ps
#define _mm512_permutexvar_ps e2_permutexvar_ps
#undef _mm512_permutex2var_epi32
#define _mm512_permutex2var_epi32 e2_permutex2var_epi32
#undef _mm512_reduce_add_ps
#define _mm512_reduce_add_ps e2_reduce_add_ps
#undef _mm512_reduce_max_ps
#define _mm512_reduce_max_ps e2_reduce_max_ps
#undef _mm512_reduce_add_epi32
#define _mm512_reduce_add_epi32 e2_reduce_add_epi32
#endif
