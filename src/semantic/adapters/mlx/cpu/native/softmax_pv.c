/*
 * The second half of attention on the host: softmax over each query row's scores, then the
 * weighted sum of the value rows, in one pass per row while the row is in cache.
 *
 * MLX computes the scores (q @ k^T, our small-product kernel); numpy's softmax took six
 * passes over them and MLX's own p @ V reached ~40 GFLOP/s for the few-row products of a
 * decode step or a short chunk at a long context. Here each row is masked by a key range
 * [lo, hi) (causal limit, left padding), exponentiated with a vectorised exp, summed, and
 * a tile of rows (four, six on AVX2) meets each value row once.
 *
 * Bits: a row's result depends only on its own scores, its range and the values: it is
 * summed in 16 logical lanes from lo, the lanes folded in a fixed order, and the value rows are
 * accumulated from lo in order. Rows sharing a tile only share loads (a row past its own
 * hi adds exact zeros), so a row gets the same bits alone, batched, or in any chunk.
 *
 * Layout: scores [batch][kv_heads][rows][span] contiguous, softmaxed in place;
 * values [batch][kv_heads][span][dim] with strides in floats, dim contiguous, or, through
 * semantic_softmax_pv_ranges, each sequence's positions as ranges of rows that lie apart
 * (a restored prefix's blocks, then the cache's own buffer: see llama_pass.c);
 * lo/hi [batch][rows]; out [batch][kv_heads][rows][dim] contiguous; dim % 64 == 0.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "helper.h"
#include "simd.h"
#include "softmax_pv.h"

/* Softmax of row[lo, hi) in place; zeros elsewhere up to `zero_to` (the whole span, so a
 * row's probabilities do not depend on which rows share its tile). Returns 1/sum (0 if the
 * range is empty). */
static float softmax_row(float *row, int lo, int hi, int zero_to) {
    if (hi <= lo) {
        if (zero_to > 0) memset(row, 0, (size_t)zero_to * sizeof *row);
        return 0.0f;
    }
    int n = hi - lo, body = n - n % 16;
    float *s = row + lo;
    vf peaks[PARTS];
    for (int q = 0; q < PARTS; q++) peaks[q] = splat(-INFINITY);
    for (int j = 0; j < body; j += 16)
        for (int q = 0; q < PARTS; q++) peaks[q] = vmax(peaks[q], load(s + j + q * LANES));
    float peak = -INFINITY;
    for (int q = 0; q < PARTS; q++)
        for (int i = 0; i < LANES; i++) peak = peaks[q][i] > peak ? peaks[q][i] : peak;
    for (int j = body; j < n; j++) peak = s[j] > peak ? s[j] : peak;
    vf sums[PARTS], top = splat(peak);
    for (int q = 0; q < PARTS; q++) sums[q] = splat(0.0f);
    for (int j = 0; j < body; j += 16)
        for (int q = 0; q < PARTS; q++) {
            vf e = vexp(load(s + j + q * LANES) - top);
            store(s + j + q * LANES, e);
            sums[q] += e;
        }
    float sum = fold(sums);
    if (body < n) {
        float tail[16];
        for (int i = 0; i < 16; i++) tail[i] = body + i < n ? s[body + i] : -INFINITY;
        for (int q = 0; q < PARTS; q++) store(tail + q * LANES, vexp(load(tail + q * LANES) - top));
        for (int i = 0; body + i < n; i++) {
            s[body + i] = tail[i];
            sum += tail[i];
        }
    }
    if (lo > 0) memset(row, 0, (size_t)lo * sizeof *row);
    if (zero_to > hi) memset(row + hi, 0, (size_t)(zero_to - hi) * sizeof *row);
    return 1.0f / sum;
}

/* A tile: TILE query rows meet each value row once, PV_COLS registers of its columns at a
 * time, the TILE x PV_COLS accumulators in registers (AVX-512: 16 of 32 zmm; AVX2: 12 of 16
 * ymm; NEON: 16 of 32 q). Each output still sums over j in order, so the shape never
 * changes a bit. AVX2 takes six rows: on a Zen 3 (2 cores, 78 query rows over 4,178
 * positions, one layer) softmax and values took 2.84 ms against 3.50 ms with four, the
 * value rows being read from L3 once per tile. */
#if LANES == 16
#define TILE 4
#define PV_COLS 4
#elif LANES == 8
#define TILE 6
#define PV_COLS 2
#else
#define TILE 4
#define PV_COLS 4
#endif

/* out[r][d:d+LANES*PV_COLS] = inverse[r] * sum over j in [lo, end) of p[r][j] * V[j][...],
 * for TILE rows at once: each value row is loaded once for all of them. Ranges are taken
 * in order, so the sum runs over j from lo upwards however the rows are laid out. */
static void weigh_values(float *const *p, int lo, int end, const vrange_t *ranges,
                         int n_ranges, int h, int dim, const float *inverse, float *const *out) {
    for (int d = 0; d < dim; d += LANES * PV_COLS) {
        vf acc[TILE][PV_COLS];
        for (int r = 0; r < TILE; r++)
            for (int c = 0; c < PV_COLS; c++) acc[r][c] = splat(0.0f);
        for (const vrange_t *range = ranges; range < ranges + n_ranges; range++) {
            int from = range->start > lo ? range->start : lo;
            int to = range->end < end ? range->end : end;
            const float *at = range->base + h * range->head + d - (long)range->start * range->row;
            for (int j = from; j < to; j++) {
                const float *row = at + (long)j * range->row;
                vf v[PV_COLS];
                for (int c = 0; c < PV_COLS; c++) v[c] = load(row + LANES * c);
                for (int r = 0; r < TILE; r++) {
                    vf w = splat(p[r][j]);
                    for (int c = 0; c < PV_COLS; c++) acc[r][c] += w * v[c];
                }
            }
        }
        for (int r = 0; r < TILE; r++)
            for (int c = 0; c < PV_COLS; c++)
                store(out[r] + d + LANES * c, acc[r][c] * splat(inverse[r]));
    }
}

typedef struct {
    int kv_heads, rows, span, dim, rows_per_range, tiles;
    float *scores;
    const vrange_t *ranges; /* [batch][n_ranges] */
    int n_ranges;
    const int *lo, *hi;
    float *out;
} task_t;

/* Tiles [from, to) of all (sequence, kv head) pairs; each tile is computed by one thread,
 * so how the tiles are shared never changes a bit. */
static void run_tiles(const void *context, int from, int to) {
    const task_t *t = context;
    float spare[TILE][256]; /* outputs of the stand-in rows that fill a short tile */
    for (int unit = from; unit < to; unit++) {
        int pair = unit / t->tiles, r0 = unit % t->tiles * TILE;
        int b = pair / t->kv_heads, h = pair % t->kv_heads;
        float *block = t->scores + (long)pair * t->rows * t->span;
        const vrange_t *ranges = t->ranges + (long)b * t->n_ranges;
        float *dest = t->out + (long)pair * t->rows * t->dim;
        const int *lo = t->lo + (long)b * t->rows_per_range, *hi = t->hi + (long)b * t->rows_per_range;
        int count = t->rows - r0 < TILE ? t->rows - r0 : TILE;
        int start = t->span, end = 0;
        for (int r = 0; r < count; r++) {
            int k = (r0 + r) % t->rows_per_range;
            start = lo[k] < start ? lo[k] : start;
            end = hi[k] > end ? hi[k] : end;
        }
        float *p[TILE], *o[TILE], inverse[TILE];
        for (int r = 0; r < count; r++) {
            int k = (r0 + r) % t->rows_per_range;
            p[r] = block + (long)(r0 + r) * t->span;
            o[r] = dest + (long)(r0 + r) * t->dim;
            inverse[r] = softmax_row(p[r], lo[k], hi[k], t->span);
        }
        if (end <= start) {
            for (int r = 0; r < count; r++) memset(o[r], 0, (size_t)t->dim * sizeof(float));
            continue;
        }
        for (int r = count; r < TILE; r++) { /* repeat row 0; its copies go nowhere */
            p[r] = p[0];
            inverse[r] = inverse[0];
            o[r] = t->dim <= 256 ? spare[r] : o[0];
        }
        weigh_values(p, start, end, ranges, t->n_ranges, h, t->dim, inverse, o);
    }
}


enum { MIN_SHARED_WORK = 1 << 16 }; /* score elements below which one thread is quicker */

int semantic_softmax_pv_ready(void) { return 1; }

void semantic_softmax_pv_ranges(int batch, int kv_heads, int rows, int span, int dim,
                                float *scores, const vrange_t *ranges, int n_ranges,
                                const int *lo, const int *hi, int rows_per_range, float *out) {
    /* rows_per_range: query rows of one kv head share ranges in blocks of `length` (the
     * group's heads repeat the same positions): range index = row % rows_per_range. */
    if (dim % 64 != 0) return;
    task_t task = {kv_heads, rows, span, dim, rows_per_range, (rows + TILE - 1) / TILE,
                   scores, ranges, n_ranges, lo, hi, out};
    int units = batch * kv_heads * task.tiles;
    parallel_fn parallel = shared_helper();
    if (parallel != NULL && (long)batch * kv_heads * rows * span >= MIN_SHARED_WORK && units > 1)
        parallel(run_tiles, &task, units, 1);
    else
        run_tiles(&task, 0, units);
}

enum { MAX_BATCH = 256 };

void semantic_softmax_pv(int batch, int kv_heads, int rows, int span, int dim, float *scores,
                         const float *values, long v_batch, long v_head, long v_row,
                         const int *lo, const int *hi, int rows_per_range, float *out) {
    vrange_t ranges[MAX_BATCH];
    for (int b0 = 0; b0 < batch; b0 += MAX_BATCH) {
        int n = batch - b0 < MAX_BATCH ? batch - b0 : MAX_BATCH;
        for (int b = 0; b < n; b++)
            ranges[b] = (vrange_t){0, span, values + (long)(b0 + b) * v_batch, v_head, v_row};
        semantic_softmax_pv_ranges(n, kv_heads, rows, span, dim,
                                   scores + (long)b0 * kv_heads * rows * span, ranges, 1,
                                   lo + (long)b0 * rows_per_range, hi + (long)b0 * rows_per_range,
                                   rows_per_range, out + (long)b0 * kv_heads * rows * dim);
    }
}
