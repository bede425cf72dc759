/*
 * The dot tile: a few rows of A times a few rows of B (transposed), each output summed in
 * 16 logical lanes over the depth and halved in simd.h's order, so its bits depend on
 * nothing but its own row and column. small_sgemm.c's products of up to 32 rows run on it,
 * and so does weights.h's product of a quantized matrix's dequantized rows, which calls it
 * directly (the same bits as through cblas_sgemm, without the call's dispatch).
 */
#ifndef SEMANTIC_DOT_TILE_H
#define SEMANTIC_DOT_TILE_H
#include <math.h>

#include "simd.h"

#if SIMD_FMA
/* Tile shapes for the variant's register file: a tile's rows x cols accumulators (each a
 * block of 16 logical lanes, PARTS registers) and one row of each operand stay in
 * registers. TILE_* serve products of several rows, ROW_COLS products of one (a lone
 * decode step, where a taller tile would only repeat the row). AVX-512: 4 x 4, 16 + 5 of 32
 * zmm; AVX2: 2 x 3, 12 + 3 of 16 ymm, five loads to six multiply-adds (1 x 4 loads five to
 * four; on a Zen 3 with 16-32 rows, 2 x 3 ran 14-34% faster, 3 x 2 and 2 x 2 slower: ADR
 * 0026); NEON: 2 x 2, 16 + 3 of 32 q (not measured). Every dimension of SmolLM2's and most
 * models' matrices is a multiple of 3. The shape never changes a bit of a result: each
 * output is summed in the same lanes and halved in the same order (simd.h). */
#if defined(TILE_ROWS) && defined(TILE_COLS)
/* given at build time (a tuning experiment) */
#elif LANES == 16
#define TILE_ROWS 4
#define TILE_COLS 4
#elif LANES == 8
#define TILE_ROWS 2
#define TILE_COLS 3
#else
#define TILE_ROWS 2
#define TILE_COLS 2
#endif
#define ROW_COLS 4
_Static_assert(TILE_ROWS <= TILE_COLS, "a tile holds its rows of A and loads B's in turn");
#define MOST_COLS (TILE_COLS > ROW_COLS ? TILE_COLS : ROW_COLS)
#define MOST_DOTS (TILE_ROWS * TILE_COLS > ROW_COLS ? TILE_ROWS * TILE_COLS : ROW_COLS)

/* dots[cols * i + j] = a[i] . b[j] over k, for a tile of `rows` x `cols` (constants once
 * inlined); while at it, prefetch the next rows of B (`ahead`, or NULL) so their load from
 * memory overlaps this tile's arithmetic. */
static inline __attribute__((always_inline)) void dot_tile(
    const int rows, const int cols, int k, const float *const *a, const float *const *b,
    const float *const *ahead, float *dots) {
    vf acc[MOST_DOTS][PARTS];
    for (int t = 0; t < rows * cols; t++)
        for (int q = 0; q < PARTS; q++) acc[t][q] = splat(0.0f);
    int at = 0;
    for (; at + 16 <= k; at += 16) {
        if (ahead)
            for (int j = 0; j < cols; j++) __builtin_prefetch(ahead[j] + at);
        for (int q = 0; q < PARTS; q++) {
            vf x[TILE_ROWS]; /* A's rows held, B's loaded one at a time */
            for (int i = 0; i < rows; i++) x[i] = kept(a[i] + at + q * LANES);
            for (int j = 0; j < cols; j++) {
                vf y = kept(b[j] + at + q * LANES);
                for (int i = 0; i < rows; i++) acc[cols * i + j][q] += x[i] * y;
            }
        }
    }
    halve_each(rows * cols, acc, dots);
    for (; at < k; at++)
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < cols; j++) /* one rounding, as the lanes' sums */
                dots[cols * i + j] = fmaf(a[i][at], b[j][at], dots[cols * i + j]);
}

#endif

#endif
