/*
 * Short products with A's row held in registers (attention's scores: each query row against
 * every key of one head), for small_sgemm.c, which includes this where its product_t and
 * put_tile are defined.
 */
#ifndef SEMANTIC_HELD_ROWS_H
#define SEMANTIC_HELD_ROWS_H

/* Attention scores multiply each query row by every key, over one head (k = 64 in most
 * small models). There a tile's loop runs four steps and its reduction and stores cost as
 * much again. For k up to HELD_STEPS blocks of 16 the row of A stays in registers while
 * the rows of B go past, HELD_BLOCK of them at a time so they come from L1 for every row
 * of A: same lanes, same order, same bits as dot_tile (scores 32 x 4,178 x 64 on a Zen 3,
 * one thread: ADR 0026). */
#define HELD_STEPS (8 / PARTS) /* A's row in 8 registers: k <= 64 (AVX2), 128 (AVX-512) */
enum { HELD_BLOCK = 64 };

/* Rows of B a held row meets at once: sixteen on AVX-512, their sums halved together
 * (halve_each's halve16: 15 folds for sixteen sums against 20 by four, and sixteen key
 * rows read side by side); four elsewhere. */
#if LANES == 16
#define HELD_COLS 16
#else
#define HELD_COLS 4
#endif

/* dots[j] = x . b[j] for `cols` (4 or HELD_COLS) rows of B, b[j] = b + j * stride; x is
 * `steps` blocks of 16 lanes. */
static inline __attribute__((always_inline)) void dot_held(const int steps, const int cols,
                                                           const vf x[][PARTS], const float *b,
                                                           const long stride, float *dots) {
    vf acc[HELD_COLS][PARTS];
    for (int j = 0; j < cols; j++)
        for (int q = 0; q < PARTS; q++) acc[j][q] = splat(0.0f);
    for (int s = 0; s < steps; s++)
        for (int q = 0; q < PARTS; q++)
            for (int j = 0; j < cols; j++)
                acc[j][q] += x[s][q] * load(b + j * stride + 16 * s + q * LANES);
    halve_each(cols, acc, dots); /* sixteen together on AVX-512 */
}

static inline __attribute__((always_inline)) void held_columns_by(
    const int steps, const product_t *p, int from, int to) {
    for (int start = from; start < to; start += HELD_BLOCK) {
        int end = start + HELD_BLOCK < to ? start + HELD_BLOCK : to;
        for (int row = 0; row < p->m; row++) {
            const float *a = p->a + (size_t)row * p->lda;
            vf x[HELD_STEPS][PARTS];
            for (int s = 0; s < steps; s++)
                for (int q = 0; q < PARTS; q++) x[s][q] = load(a + 16 * s + q * LANES);
            int col = start;
            if (p->ldb == 16 * steps) /* rows of B side by side (keys of one head): one
                                       * pointer, constant offsets */
                for (; col + HELD_COLS <= end; col += HELD_COLS) {
                    float dots[HELD_COLS];
                    dot_held(steps, HELD_COLS, x, p->b + (size_t)col * p->ldb, 16 * steps, dots);
                    put_tile(p, row, col, 1, HELD_COLS, end, dots);
                }
            for (; col < end; col += 4) {
                float dots[4];
                const float *b = p->b + (size_t)col * p->ldb;
                switch (end - col) { /* the last one to three rows: halve_each fills the four */
                case 1: dot_held(steps, 1, x, b, p->ldb, dots); break;
                case 2: dot_held(steps, 2, x, b, p->ldb, dots); break;
                case 3: dot_held(steps, 3, x, b, p->ldb, dots); break;
                default: dot_held(steps, 4, x, b, p->ldb, dots);
                }
                put_tile(p, row, col, 1, 4, end, dots);
            }
        }
    }
}

/* B transposed with k a multiple of 16 and at most HELD_STEPS blocks (held_fits). */
static void held_columns(const product_t *p, int from, int to) {
    switch (p->k / 16) {
    case 1: held_columns_by(1, p, from, to); break;
    case 2: held_columns_by(2, p, from, to); break;
#if HELD_STEPS >= 4
    case 3: held_columns_by(3, p, from, to); break;
    case 4: held_columns_by(4, p, from, to); break;
#endif
#if HELD_STEPS >= 8
    case 5: held_columns_by(5, p, from, to); break;
    case 6: held_columns_by(6, p, from, to); break;
    case 7: held_columns_by(7, p, from, to); break;
    case 8: held_columns_by(8, p, from, to); break;
#endif
    default: dot_columns(p, from, to);
    }
}

static int held_fits(int k) { return k % 16 == 0 && k / 16 <= HELD_STEPS; }

#endif
