/* Several activation rows against one tile of grid codes on AVX2 (included by grid_tiles.h,
   which holds the one-row form and the formats' arithmetic).

   AVX2 has 16 vector registers: a group's codes alone are 16 of them, so taking one row at
   a time (group_row) reloads all 16 from the stack for every row with its sums spilled
   around them: a Q4_K prefill product ran at 64 G multiply-adds a second on one Zen 3
   core. Here a block of rows walks the code vectors once, each vector multiplied by every
   row of the block before the next, the rows' 16-bit sums held in registers (2 a row):
   78-81 G. The integer sums are exact and each row's float steps are group_row's, in its
   order, so every row's result is the bits the one-row form gives. */
#ifndef RESIDENT_GRID_TILES_AVX2_H
#define RESIDENT_GRID_TILES_AVX2_H
#ifdef RESIDENT_AVX2

/* Rows taken through the code vectors together: 4 rows' sums are 8 registers, and with
   the code vector's two and the broadcast activation, 11 of the 16. */
#define BLOCK_ROWS 4

/* The 32-bit sums of one row over vectors j0..j0 + n - 1 (two registers of 8 lanes). */
typedef struct {
    __m256i lo, hi;
} RowSums;

/* Sums of `rows` (a constant up to BLOCK_ROWS) rows over vectors j0..j0 + n - 1 of codes
   c (lo at 2j, hi at 2j + 1), added in 16 bits as narrow_sum does (so n is bounded as
   there) and widened once. Named accumulators: GCC keeps arrays of vectors in memory.
   The first vector's products start the sums, outside the loop (starting from zeros, or
   the first step inside the loop, measured 20% slower for Q6_K's spans of two). */
ALWAYS_INLINE void block_span(const __m256i *c, const int32_t *const xr[BLOCK_ROWS], int rows,
                              int j0, int n, RowSums out[BLOCK_ROWS]) {
    __m256i l0, h0, l1 = _mm256_setzero_si256(), h1 = l1, l2 = l1, h2 = l1, l3 = l1, h3 = l1;
#define START(sum, product) (product)
#define ROW_PRODUCTS(i, combine)                                                         \
    if (rows > i) {                                                                      \
        const __m256i x = _mm256_set1_epi32(xr[i][j]);                                   \
        l##i = combine(l##i, _mm256_maddubs_epi16(a, x));                                \
        h##i = combine(h##i, _mm256_maddubs_epi16(b, x));                                \
    }
#define EACH_ROW(M, combine) M(0, combine) M(1, combine) M(2, combine) M(3, combine)
    {
        const int j = j0;
        const __m256i a = c[2 * j], b = c[2 * j + 1];
        EACH_ROW(ROW_PRODUCTS, START)
    }
    for (int j = j0 + 1; j < j0 + n; j++) {
        const __m256i a = c[2 * j], b = c[2 * j + 1];
        EACH_ROW(ROW_PRODUCTS, _mm256_add_epi16)
        /* in this order: GCC's reassociation otherwise makes every product first and
           keeps them on the stack until a tree of adds sums them */
        __asm__("" : "+x"(l0), "+x"(h0), "+x"(l1), "+x"(h1), "+x"(l2), "+x"(h2), "+x"(l3),
                "+x"(h3));
    }
    const __m256i ones = _mm256_set1_epi16(1);
#define ROW_SUMS(i, unused)                                                              \
    if (rows > i) out[i] = (RowSums){_mm256_madd_epi16(l##i, ones), _mm256_madd_epi16(h##i, ones)};
    EACH_ROW(ROW_SUMS, -)
#undef START
#undef ROW_PRODUCTS
#undef EACH_ROW
#undef ROW_SUMS
}

ALWAYS_INLINE RowSums sums_add(RowSums a, RowSums b) {
    return (RowSums){_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)};
}

/* acc (one row's 16 floats) + sums * step * dx: one of group_row's float steps. */
ALWAYS_INLINE void add_term(RowSums sums, __m512 step, float dx, float *acc) {
    const __m512i p = {sums.lo, sums.hi};
    const __m512 a = _mm512_loadu_ps(acc);
    const __m512 scale = _mm512_mul_ps(step, _mm512_set1_ps(dx));
    _mm512_storeu_ps(acc, _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, a));
}

/* Q6_K's codes are q + 32: sum((q + 32) x) - 32 sum(x), exact in int32. */
ALWAYS_INLINE RowSums lifted(RowSums s, int32_t x_sum) {
    const __m256i lift = _mm256_set1_epi32(32 * x_sum);
    return (RowSums){_mm256_sub_epi32(s.lo, lift), _mm256_sub_epi32(s.hi, lift)};
}

/* Rows r0..r0 + rows - 1 (rows a constant up to BLOCK_ROWS) of x times one group's codes
   c, added into their rows of acc. The spans are narrow_sum's for the format; each row's
   float steps are group_row's, in its order. */
ALWAYS_INLINE void block_group(int fmt, const __m256i *c, GroupScales s, Int8Rows x, int64_t r0,
                               int rows, int64_t g, float *acc) {
    const int32_t *xr[BLOCK_ROWS];
    for (int r = 0; r < BLOCK_ROWS; r++)
        xr[r] = (const int32_t *)(x.q + (r0 + (r < rows ? r : 0)) * x.K + g * GROUP);
    const int64_t groups = x.K / GROUP;
    RowSums sums[BLOCK_ROWS], part[BLOCK_ROWS];
    if (fmt == GRID_Q6_K) {
        for (int half = 0; half < 2; half++) {
            block_span(c, xr, rows, 4 * half, 2, sums);
            block_span(c, xr, rows, 4 * half + 2, 2, part);
            for (int r = 0; r < rows; r++) {
                const int64_t i = (r0 + r) * groups + g;
                add_term(lifted(sums_add(sums[r], part[r]), x.h[2 * i + half]),
                         half ? s.step2 : s.step, x.d[i], acc + (r0 + r) * TILE);
            }
        }
        return;
    }
    if (fmt == GRID_Q5_K) {
        block_span(c, xr, rows, 0, 4, sums);
        block_span(c, xr, rows, 4, 4, part);
        for (int r = 0; r < rows; r++) sums[r] = sums_add(sums[r], part[r]);
    } else {
        block_span(c, xr, rows, 0, 8, sums);
    }
    for (int r = 0; r < rows; r++) {
        const int64_t i = (r0 + r) * groups + g;
        float *row_acc = acc + (r0 + r) * TILE;
        add_term(sums[r], s.step, x.d[i], row_acc);
        _mm512_storeu_ps(row_acc, _mm512_fmadd_ps(s.offset, _mm512_set1_ps(x.c[i]),
                                                  _mm512_loadu_ps(row_acc)));
    }
}

/* tile_pass's step for one group and 2 or more rows of a format whose codes are below
   128 (not GRID_U8): 4 rows at a time, or 2 for 5- and 6-bit codes, whose two or four
   spans need registers of their own. */
ALWAYS_INLINE void group_rows_blocked(int fmt, const __m512i w[8], GroupScales s, Int8Rows x,
                                      int64_t rows, int64_t g, float *acc) {
    __m256i c[16];
    for (int v = 0; v < 8; v++) c[2 * v] = w[v].lo, c[2 * v + 1] = w[v].hi;
    if (fmt == GRID_Q5_K || fmt == GRID_Q6_K) {
        for (int64_t r0 = 0; r0 < rows - 1; r0 += 2) block_group(fmt, c, s, x, r0, 2, g, acc);
        if (rows % 2) block_group(fmt, c, s, x, rows - 1, 1, g, acc);
        return;
    }
    const int64_t whole = rows / BLOCK_ROWS * BLOCK_ROWS;
    for (int64_t r0 = 0; r0 < whole; r0 += BLOCK_ROWS)
        block_group(fmt, c, s, x, r0, BLOCK_ROWS, g, acc);
    switch (rows - whole) {
    case 3: block_group(fmt, c, s, x, whole, 3, g, acc); break;
    case 2: block_group(fmt, c, s, x, whole, 2, g, acc); break;
    case 1: block_group(fmt, c, s, x, whole, 1, g, acc); break;
    }
}

#endif
#endif
