/*
 * Products of 16 or 32 activation rows by a transposed weight matrix, with A packed
 * lane-major: the same bits as small_sgemm.c's dot tiles, 0.81-0.94x their time.
 *
 * A dot tile sums each output in 16 logical lanes, lane l adding a[i][16 s + l] * b[j][16 s
 * + l] over s in order, and halves the 16 lanes in a fixed tree (simd.h). For lane l alone
 * that is a plain product of depth k / 16, so it can be vectorized across A's rows instead
 * of along the depth: A packed so that two registers hold lane l of 16 rows at one step,
 * each weight broadcast and met by all 16 rows at once, the lanes' partial sums then
 * halved as whole registers, lane l + lane l + 8 first. No output sees another operation
 * or order, so batched == alone holds as before. The dot tile loads two rows of A and three
 * of B per six multiply-adds (AVX2); here two loads of A and six broadcasts of B feed
 * twelve. Zen 3, 16 rows, both threads, weights from memory: SmolLM2's layer products in
 * 0.81-0.94x the dot tiles' time (ADR 0010).
 */
#ifndef SEMANTIC_LANE_TILES_H
#define SEMANTIC_LANE_TILES_H
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "simd.h"

/* AVX2 only for now: the variant it was measured on (a block of 16 rows is two registers
 * of 8; AVX-512 and NEON keep their dot tiles until measured on their CPUs). */
#if LANES == 8
#define LANE_TILES 1

/* A product's rows go in whole blocks of 16 (the caller asks for no other counts); a tile multiplies every block by 6
 * rows of B: 12 accumulators of AVX2's 16 ymm, the rest hold a step's rows and a broadcast
 * weight. Blocks of 8 by 12 rows of B (one load of A and twelve broadcasts per twelve
 * multiply-adds) ran 1.3-2.1x the dot tiles' time (Zen 3, ADR 0010). The depth runs in
 * chunks of up to LANE_CHUNK steps of 16: the tile's part of B for a chunk (13.5 KB) stays
 * in L1 while the 16 lanes go over it, each lane's sums parked in memory between chunks
 * (stored and loaded, never rounded); chunks of 8 and 16 steps ran 1.1-1.3x the time of 36
 * (in L1, one thread), 96 at k = 1,536 1.4x (B's part then overflows L1). */
#ifndef LANE_CHUNK /* given at build time: a tuning experiment */
#define LANE_CHUNK 36
#endif
#ifndef LANE_LOCALITY /* the next tile's rows of B asked for into L2 (1) or L1 (3) */
#define LANE_LOCALITY 1
#endif
enum { LANE_BLOCK = 16, LANE_VECS = 2, LANE_COLS = 6, LANE_MAX_BLOCKS = 2 };

/* Floats the packed copy of `m` rows (whole blocks: a multiple of 16) of depth `k` takes. */
static size_t lane_packed_floats(int m, int k) { return (size_t)m * (size_t)(k / 16 * 16); }

/* r[c][i] = r[i][c]: the usual three rounds of AVX shuffles (pairs, quads, halves). */
static inline void transpose8(vf r[8]) {
    vf t[8], q[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = SHUFFLE(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = SHUFFLE(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4)
        for (int h = 0; h < 2; h++) {
            q[i + 2 * h] = SHUFFLE(t[i + h], t[i + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            q[i + 2 * h + 1] = SHUFFLE(t[i + h], t[i + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        }
    for (int c = 0; c < 4; c++) {
        r[c] = SHUFFLE(q[c], q[c + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        r[c + 4] = SHUFFLE(q[c], q[c + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    }
}

/* A block's ap[(l * steps + s) * 16 + i] = a[row0 + i][16 s + l], for one step s: its
 * 16 x 16 piece of A transposed 8 x 8 at a time. */
static void lane_pack_step(const float *a, int lda, int row0, int s, int steps, float *ap) {
    for (int rows = 0; rows < LANE_BLOCK; rows += 8)
        for (int lanes = 0; lanes < 16; lanes += 8) {
            vf r[8];
            for (int i = 0; i < 8; i++)
                r[i] = load(a + (size_t)(row0 + rows + i) * lda + 16 * s + lanes);
            transpose8(r);
            for (int c = 0; c < 8; c++)
                store(ap + ((size_t)(lanes + c) * steps + s) * LANE_BLOCK + rows, r[c]);
        }
}

/* A packed lane-major, block after block (see lane_pack_step). */
static void lane_pack(const float *a, int lda, int m, int k, float *ap) {
    int steps = k / 16;
    for (int row0 = 0; row0 < m; row0 += LANE_BLOCK)
        for (int s = 0; s < steps; s++)
            lane_pack_step(a, lda, row0, s, steps, ap + (size_t)row0 * 16 * steps);
}

/* acc[j][r] += lane l of `count` steps: ap at (block, l, first step), b[j] at its lane. */
static inline __attribute__((always_inline)) void lane_steps(
    int count, const float *ap, const float *const *b, vf acc[LANE_COLS][LANE_VECS]) {
    for (int s = 0; s < count; s++) {
        vf x[LANE_VECS];
        for (int r = 0; r < LANE_VECS; r++) x[r] = kept(ap + LANE_BLOCK * s + r * LANES);
        for (int j = 0; j < LANE_COLS; j++) {
            vf y = splat(b[j][16 * s]);
            for (int r = 0; r < LANE_VECS; r++) acc[j][r] += x[r] * y;
        }
    }
}

/* One lane's pass over one chunk, its sums carried in `part`. */
static inline __attribute__((always_inline)) void lane_pass(
    int count, int first, const float *ap, const float *const *b, int at,
    vf part[LANE_COLS][LANE_VECS]) {
    vf acc[LANE_COLS][LANE_VECS];
    for (int j = 0; j < LANE_COLS; j++)
        for (int r = 0; r < LANE_VECS; r++) acc[j][r] = first ? splat(0.0f) : part[j][r];
    const float *bl[LANE_COLS];
    for (int j = 0; j < LANE_COLS; j++) bl[j] = b[j] + at;
    lane_steps(count, ap, bl, acc);
    for (int j = 0; j < LANE_COLS; j++)
        for (int r = 0; r < LANE_VECS; r++) part[j][r] = acc[j][r];
}

/* Asks for the next tile's rows of B a share at a time, spread evenly over this tile's
 * lane passes (counted, not divided: a division per pass was a tenth of its time), so
 * their loads from memory overlap all of this tile's arithmetic. */
typedef struct {
    const float *const *rows; /* NULL: nothing to ask for */
    int count, lines, row, line; /* rows, lines per row; the next line to ask for */
    int per_pass, passes, credit;
} lane_prefetch_t;

static inline void lane_prefetch_share(lane_prefetch_t *f) {
    if (f->rows == NULL) return;
    for (f->credit += f->per_pass; f->credit >= f->passes && f->row < f->count;
         f->credit -= f->passes) {
        __builtin_prefetch(f->rows[f->row] + 16 * f->line, 0, LANE_LOCALITY);
        if (++f->line == f->lines) f->line = 0, f->row++;
    }
}

/* sums[i * LANE_COLS + j] = a[i] . b[j] over k (k >= 16) for the product's `m` rows (a
 * multiple of 16; packed in `ap`, and in place in `a` for the depth past the last 16),
 * halved as dot_tile halves; `next` (or NULL): the rows of B the next tile reads. */
static void lane_tile(const float *ap, const float *a, int lda, int m, int k,
                      const float *const *b, const float *const *next, float *sums) {
    int steps = k / 16, blocks = m / LANE_BLOCK;
    int chunks = (steps + LANE_CHUNK - 1) / LANE_CHUNK, chunk = (steps + chunks - 1) / chunks;
    lane_prefetch_t ahead = {next, LANE_COLS, steps, 0, 0, LANE_COLS * steps, chunks * blocks * 16, 0};
    vf part[LANE_MAX_BLOCKS][16][LANE_COLS][LANE_VECS];
    for (int s0 = 0; s0 < steps; s0 += chunk) {
        int count = steps - s0 < chunk ? steps - s0 : chunk;
        for (int blk = 0; blk < blocks; blk++)
            for (int l = 0; l < 16; l++) {
                lane_prefetch_share(&ahead);
                const float *at = ap + (((size_t)blk * 16 + l) * steps + s0) * LANE_BLOCK;
                lane_pass(count, s0 == 0, at, b, 16 * s0 + l, part[blk][l]);
            }
    }
    for (int blk = 0; blk < blocks; blk++) {
        vf(*lanes)[LANE_COLS][LANE_VECS] = part[blk];
        for (int half = 8; half > 0; half /= 2) /* simd.h's halve(): lane l + lane l + 8 first */
            for (int l = 0; l < half; l++)
                for (int j = 0; j < LANE_COLS; j++)
                    for (int r = 0; r < LANE_VECS; r++)
                        lanes[l][j][r] = lanes[l][j][r] + lanes[l + half][j][r];
        for (int j = 0; j < LANE_COLS; j++) {
            float column[LANE_BLOCK];
            memcpy(column, lanes[0][j], sizeof column);
            for (int i = 0; i < LANE_BLOCK; i++)
                sums[(blk * LANE_BLOCK + i) * LANE_COLS + j] = column[i];
        }
    }
    for (int at = steps * 16; at < k; at++) /* the depth past the last 16, one rounding each */
        for (int i = 0; i < m; i++)
            for (int j = 0; j < LANE_COLS; j++)
                sums[i * LANE_COLS + j] =
                    fmaf(a[(size_t)i * lda + at], b[j][at], sums[i * LANE_COLS + j]);
}
#else
#define LANE_TILES 0
#endif

#endif
