/*
 * The second half of attention on the host: softmax over each query row's scores, then the
 * weighted sum of the value rows, in one pass per row while the row is in cache.
 *
 * MLX computes the scores (q @ k^T, our small-product kernel); numpy's softmax took six
 * passes over them and MLX's own p @ V reached ~40 GFLOP/s for the few-row products of a
 * decode step or a short chunk at a long context. Here each row is masked by a key range
 * [lo, hi) (causal limit, left padding), exponentiated with a vectorised exp, summed, and
 * a tile of rows (four, six on AVX2; three for a decode step's heads) meets each value row
 * once; a few tiles meet a block of value rows in turn, so a long context's values come
 * from L2, not from memory once per tile.
 *
 * Bits: a row's result depends only on its own scores, its range and the values: it is
 * summed in 16 logical lanes from lo, the lanes folded in a fixed order, and the value rows are
 * accumulated from lo in order. Rows sharing a tile only share loads (a row past its own
 * hi adds exact zeros), so a row gets the same bits alone, batched, or in any chunk, and
 * whatever the tile's shape or where the blocks end.
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
/* A tile of up to NARROW rows takes NARROW x NARROW_COLS: a decode step's three query
 * heads of one kv head (SmolLM2, most GQA models) with no stand-in rows, and on AVX2 each
 * value row read in two passes instead of four. On a Zen 3 (AVX2, 30 layers' values,
 * ours alone in a loop): one step at 4,178 positions 8.2-13.0 ms against 19.7-23.5, 16
 * sequences' steps at 600 20.2-20.4 ms against 35.3-37.5. */
#ifndef NARROW /* given at build time: a tuning experiment */
#define NARROW 3
#define NARROW_COLS 4
#endif
#define MOST_COLS (PV_COLS > NARROW_COLS ? PV_COLS : NARROW_COLS)
_Static_assert(NARROW <= TILE, "a narrow tile is the first rows of a tile");

/* Whether a tile's value row stays in registers beside its sums and the weight: then it is
 * loaded once, not once per row as a memory operand of each multiply-add (AVX-512's 4 x 4:
 * 8 loads to 16 multiply-adds instead of 20; softmax and values of a 512-row chunk at
 * 4,096 positions 0.55-0.70x the time on a Zen 5). AVX2's six-row tile holds it (15 of 16
 * registers; 0.97-1.00x), its narrow 3 x 4 does not (17): there the compiler's memory
 * operands stay. Registers by instruction set: 32 with AVX-512 (any lane width) and on
 * arm64, 16 on other x86. */
#if defined(__AVX512F__) || defined(__aarch64__)
#define VECTOR_REGISTERS 32
#else
#define VECTOR_REGISTERS 16
#endif
#define HOLDS_ROW(rows, cols) ((rows) * (cols) + (cols) + 1 <= VECTOR_REGISTERS)

/* acc[r][d] += sum over j in [lo, end) of p[r][j] * V[j][d] for `rows` rows at once, each
 * value row loaded once for all of them, `cols` registers of its columns at a time; acc
 * [rows][dim] carries the sums from one block of positions to the next (a float32 store
 * and load: exact). Ranges are taken in order, so each sum runs over j from lo upwards
 * however the rows are laid out and wherever the blocks end. */
static inline __attribute__((always_inline)) void weigh_values_by(
    const int rows, const int cols, float *const *p, int lo, int end, const vrange_t *ranges,
    int n_ranges, int h, int dim, float *acc) {
    for (int d = 0; d < dim; d += LANES * cols) {
        vf sum[TILE][MOST_COLS];
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) sum[r][c] = load(acc + r * dim + d + LANES * c);
        for (const vrange_t *range = ranges; range < ranges + n_ranges; range++) {
            int from = range->start > lo ? range->start : lo;
            int to = range->end < end ? range->end : end;
            const float *at = range->base + h * range->head + d - (long)range->start * range->row;
            for (int j = from; j < to; j++) {
                const float *row = at + (long)j * range->row;
                vf v[MOST_COLS];
                for (int c = 0; c < cols; c++)
                    v[c] = HOLDS_ROW(rows, cols) ? kept(row + LANES * c) : load(row + LANES * c);
                for (int r = 0; r < rows; r++) {
                    vf w = splat(p[r][j]);
                    for (int c = 0; c < cols; c++) sum[r][c] += w * v[c];
                }
            }
        }
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) store(acc + r * dim + d + LANES * c, sum[r][c]);
    }
}

/* A tile of up to NARROW rows (a decode step's query heads of one kv head) takes the
 * narrow shape: no stand-in rows, each value row read in fewer passes. Not inlined into
 * run_tiles: there GCC kept run_tiles' integers in vector registers and spilled two of
 * the tile's sums to the stack inside the loop over value rows. */
static __attribute__((noinline)) void weigh_values(int count, float *const *p, int lo,
                                                   int end, const vrange_t *ranges,
                                                   int n_ranges, int h, int dim, float *acc) {
    if (count <= NARROW)
        weigh_values_by(NARROW, NARROW_COLS, p, lo, end, ranges, n_ranges, h, dim, acc);
    else
        weigh_values_by(TILE, PV_COLS, p, lo, end, ranges, n_ranges, h, dim, acc);
}

/* A unit is up to GROUP_TILES tiles of one (sequence, kv head) pair (fewer where their
 * sums would not fit ACC_FLOATS: head_dim above 256), which meet the values a block of
 * BLOCK_ROWS positions at a time: the block (64 KB at head_dim 64) stays in L2 while every
 * tile reads it, where a tile at a time read all of a long context's values from L3 or
 * memory once per tile. Four tiles a unit keep both threads busy at a short chunk: 78
 * rows of one kv head (26 rows of SmolLM2's three query heads each) are four units. */
enum { GROUP_TILES = 4, BLOCK_ROWS = 256, ACC_FLOATS = GROUP_TILES * TILE * 256 };

typedef struct {
    int kv_heads, rows, span, dim, rows_per_range, tiles, group, groups;
    float *scores;
    const vrange_t *ranges; /* [batch][n_ranges] */
    int n_ranges;
    const int *lo, *hi;
    float *out;
} task_t;

/* One tile's rows softmaxed in place: their probabilities, 1/sums and outputs (a short
 * tile's stand-ins repeat row 0's probabilities; their sums are never stored), and the
 * span of positions they read. */
typedef struct {
    float *p[TILE], *o[TILE], inverse[TILE];
    int count, start, end;
} tile_t;

static void open_tile(const task_t *t, int pair, int r0, tile_t *tile) {
    int b = pair / t->kv_heads;
    float *block = t->scores + (long)pair * t->rows * t->span;
    float *dest = t->out + (long)pair * t->rows * t->dim;
    const int *lo = t->lo + (long)b * t->rows_per_range, *hi = t->hi + (long)b * t->rows_per_range;
    tile->count = t->rows - r0 < TILE ? t->rows - r0 : TILE;
    tile->start = t->span, tile->end = 0;
    for (int r = 0; r < tile->count; r++) {
        int k = (r0 + r) % t->rows_per_range;
        tile->start = lo[k] < tile->start ? lo[k] : tile->start;
        tile->end = hi[k] > tile->end ? hi[k] : tile->end;
        tile->p[r] = block + (long)(r0 + r) * t->span;
        tile->o[r] = dest + (long)(r0 + r) * t->dim;
        tile->inverse[r] = softmax_row(tile->p[r], lo[k], hi[k], t->span);
    }
    for (int r = tile->count; r < TILE; r++) tile->p[r] = tile->p[0];
}

/* Units [from, to): softmax every row of the unit's tiles, then their values block by
 * block; each tile is computed by one thread, so how the units are shared never changes
 * a bit. */
static void run_tiles(const void *context, int from, int to) {
    const task_t *t = context;
    float acc[ACC_FLOATS]; /* [group][TILE][dim] */
    tile_t tiles[GROUP_TILES];
    long per_tile = (long)TILE * t->dim;
    for (int unit = from; unit < to; unit++) {
        int pair = unit / t->groups, first = unit % t->groups * t->group;
        int b = pair / t->kv_heads, h = pair % t->kv_heads, n = 0, start = t->span, end = 0;
        const vrange_t *ranges = t->ranges + (long)b * t->n_ranges;
        for (; n < t->group && first + n < t->tiles; n++) {
            open_tile(t, pair, (first + n) * TILE, &tiles[n]);
            memset(acc + n * per_tile, 0, (size_t)per_tile * sizeof(float));
            start = tiles[n].start < start ? tiles[n].start : start;
            end = tiles[n].end > end ? tiles[n].end : end;
        }
        int block = n > 1 ? BLOCK_ROWS : end - start; /* a lone tile: one pass */
        for (int at = start; at < end; at += block)
            for (int i = 0; i < n; i++) {
                int lo = at > tiles[i].start ? at : tiles[i].start;
                int stop = at + block < tiles[i].end ? at + block : tiles[i].end;
                if (lo < stop)
                    weigh_values(tiles[i].count, tiles[i].p, lo, stop, ranges, t->n_ranges,
                                 h, t->dim, acc + i * per_tile);
            }
        for (int i = 0; i < n; i++)
            for (int r = 0; r < tiles[i].count; r++)
                for (int d = 0; d < t->dim; d += LANES)
                    store(tiles[i].o[r] + d, load(acc + i * per_tile + r * t->dim + d) *
                                                 splat(tiles[i].inverse[r]));
    }
}

/* Score elements below which one thread computes the call alone. 1 << 16 left sixteen
 * streams' decode steps below ~450 positions on one thread while the helper spun (ADR 0008,
 * amendment of 2026-12-02); the helper has just shared the scores' products then. */
enum { MIN_SHARED_WORK = 1 << 13 };

int semantic_softmax_pv_ready(void) { return 1; }

void semantic_softmax_pv_ranges(int batch, int kv_heads, int rows, int span, int dim,
                                float *scores, const vrange_t *ranges, int n_ranges,
                                const int *lo, const int *hi, int rows_per_range, float *out) {
    /* rows_per_range: query rows of one kv head share ranges in blocks of `length` (the
     * group's heads repeat the same positions): range index = row % rows_per_range. */
    if (dim % 64 != 0 || dim > ACC_FLOATS / TILE) return;
    int tiles = (rows + TILE - 1) / TILE, fits = ACC_FLOATS / (TILE * dim);
    int group = fits < GROUP_TILES ? fits : GROUP_TILES, groups = (tiles + group - 1) / group;
    task_t task = {kv_heads, rows, span, dim, rows_per_range, tiles, group, groups,
                   scores, ranges, n_ranges, lo, hi, out};
    int units = batch * kv_heads * groups;
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
