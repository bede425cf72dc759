/*
 * The second half of attention on the host: softmax over each query row's scores, then the
 * weighted sum of the value rows, in one pass per row while the row is in cache.
 *
 * MLX computes the scores (q @ k^T, our small-product kernel); numpy's softmax took six
 * passes over them and MLX's own p @ V reached ~40 GFLOP/s for the few-row products of a
 * decode step or a short chunk at a long context. Here each row is masked by a key range
 * [lo, hi) (causal limit, left padding), exponentiated with a vectorised exp, summed, and
 * four rows at a time meet each value row once.
 *
 * Bits: a row's result depends only on its own scores, its range and the values: it is
 * summed in 16 lanes from lo, the lanes folded in a fixed order, and the value rows are
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

#define TILE 4

/* Softmax of row[lo, hi) in place; zeros elsewhere up to `zero_to`. Returns 1/sum (0 if
 * the range is empty). */
static float softmax_row(float *row, int lo, int hi, int zero_to) {
    if (hi <= lo) {
        if (zero_to > 0) memset(row, 0, (size_t)zero_to * sizeof *row);
        return 0.0f;
    }
    int n = hi - lo, body = n - n % 16;
    float *s = row + lo;
    v16 peak16 = splat(-INFINITY);
    for (int j = 0; j < body; j += 16) peak16 = vmax(peak16, load(s + j));
    float peak = -INFINITY;
    for (int i = 0; i < 16; i++) peak = peak16[i] > peak ? peak16[i] : peak;
    for (int j = body; j < n; j++) peak = s[j] > peak ? s[j] : peak;
    v16 sum16 = splat(0.0f), top = splat(peak);
    for (int j = 0; j < body; j += 16) {
        v16 e = vexp(load(s + j) - top);
        store(s + j, e);
        sum16 += e;
    }
    float sum = fold(sum16);
    if (body < n) {
        float tail[16];
        for (int i = 0; i < 16; i++) tail[i] = body + i < n ? s[body + i] : -INFINITY;
        v16 e = vexp(load(tail) - top);
        for (int i = 0; body + i < n; i++) {
            s[body + i] = e[i];
            sum += e[i];
        }
    }
    if (lo > 0) memset(row, 0, (size_t)lo * sizeof *row);
    if (zero_to > hi) memset(row + hi, 0, (size_t)(zero_to - hi) * sizeof *row);
    return 1.0f / sum;
}

/* out[r][d:d+64] = inverse[r] * sum over j in [lo, end) of p[r][j] * V[j][d:d+64], for
 * TILE rows at once: each value row is loaded once for all four. Ranges are taken in order,
 * so the sum runs over j from lo upwards however the rows are laid out. */
static void weigh_values(float *const *p, int lo, int end, const vrange_t *ranges,
                         int n_ranges, int h, int dim, const float *inverse, float *const *out) {
    for (int d = 0; d < dim; d += 64) {
        v16 a00 = splat(0), a01 = splat(0), a02 = splat(0), a03 = splat(0);
        v16 a10 = splat(0), a11 = splat(0), a12 = splat(0), a13 = splat(0);
        v16 a20 = splat(0), a21 = splat(0), a22 = splat(0), a23 = splat(0);
        v16 a30 = splat(0), a31 = splat(0), a32 = splat(0), a33 = splat(0);
        const float *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3];
        for (const vrange_t *range = ranges; range < ranges + n_ranges; range++) {
            int from = range->start > lo ? range->start : lo;
            int to = range->end < end ? range->end : end;
            const float *at = range->base + h * range->head + d - (long)range->start * range->row;
            for (int j = from; j < to; j++) {
                const float *row = at + (long)j * range->row;
                v16 v0 = load(row), v1 = load(row + 16), v2 = load(row + 32), v3 = load(row + 48);
                v16 w = splat(p0[j]);
                a00 += w * v0, a01 += w * v1, a02 += w * v2, a03 += w * v3;
                w = splat(p1[j]);
                a10 += w * v0, a11 += w * v1, a12 += w * v2, a13 += w * v3;
                w = splat(p2[j]);
                a20 += w * v0, a21 += w * v1, a22 += w * v2, a23 += w * v3;
                w = splat(p3[j]);
                a30 += w * v0, a31 += w * v1, a32 += w * v2, a33 += w * v3;
            }
        }
        v16 acc[TILE][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13},
                            {a20, a21, a22, a23}, {a30, a31, a32, a33}};
        for (int r = 0; r < TILE; r++)
            for (int c = 0; c < 4; c++) store(out[r] + d + 16 * c, acc[r][c] * splat(inverse[r]));
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
            inverse[r] = softmax_row(p[r], lo[k], hi[k], end);
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
