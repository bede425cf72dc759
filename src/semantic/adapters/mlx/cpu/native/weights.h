/*
 * A weight matrix in the format the model file keeps it, multiplied by a few activation
 * rows: float32, bfloat16, or MLX's group-wise affine 8-bit and 4-bit (weights packed into
 * uint32 words, low bits first; a float32 scale and bias per group of `group` inputs). See
 * docs/adr/0031-quantized-weights-on-the-host.md.
 *
 * Up to 32 activation rows (decode steps, the host pass), a quantized product either
 * dequantizes 16 weights at a time in registers and meets every row there (a few rows), or
 * dequantizes a tile's worth of output rows into per-thread scratch and multiplies them
 * with our small-product kernel's dot tiles (dot_tile.h); the first keeps weights out of
 * memory, the second keeps the dequantized rows in L1 for many activation rows (a 4 MB
 * block there ran 16 rows 1.6x slower). Both sum as that kernel does, so an
 * output element is the same bits as the float32 product over the dequantized matrix,
 * whatever the number of rows or their place in a batch; and dequantization rounds as
 * mx.dequantize does (q * scale, then + bias, two roundings), so a 4-bit model here
 * computes what its float32 dequantized copy computes. More rows: see blocked_product.
 * Memory read per weight: 0.5 byte (4-bit), 1 byte (8-bit) or 2 (bfloat16) instead of 4;
 * bfloat16 "dequantizes" to its float32 widening, exactly.
 */
#ifndef SEMANTIC_WEIGHTS_H
#define SEMANTIC_WEIGHTS_H
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

#include "dot_tile.h"
#include "helper.h"
#include "scratch.h"
#include "quantized.h"
#include "simd.h"

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                         const float *, int, float, float *, int);
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
enum { KERNEL_ROWS = 32 }; /* the matmul kernel's batch-invariant reach (small_sgemm.c) */
/* Output rows the scratch path dequantizes at a time: one dot tile's columns, which then
 * stay in L1 while every activation row meets them. Sixteen rows of SmolLM2's matrices
 * were 37-98 KB of float32, past a 32-48 KB L1: a tile's columns ran sixteen 4-bit rows'
 * products 0.85-0.92x the time on AVX-512 (four rows a unit) and 0.78-0.85x on AVX2
 * (three), 8-bit and bfloat16 alike (one thread, ADR 0031). Without the FMA kernels, 16
 * for OpenBLAS. */
#if SIMD_FMA
enum { DEQUANTIZED_ROWS = TILE_COLS };
#else
enum { DEQUANTIZED_ROWS = 16 };
#endif
/* Packed bytes of the next unit the scratch path asks for at most: four rows of a
 * 4,096-wide bfloat16 matrix would be 32 KB (asking 16 rows ahead instead of the next
 * unit's ran even). */
enum { AHEAD_BYTES = 16384 };
/* Output rows a thread claims at a time when dequantizing a block for OpenBLAS. */
enum { BLOCK_CHUNK = 16 };

static sgemm_fn sgemm(void) {
    static sgemm_fn found;
    if (found == NULL) found = (sgemm_fn)dlsym(RTLD_DEFAULT, "cblas_sgemm");
    return found;
}

typedef struct {
    const weight_t *w;
    const float *x;
    float *y;
    int rows, in, out;
    float beta;
    int failed;
} weight_task_t;

static inline __attribute__((always_inline)) void prefetch_rows(const weight_t *w, int kind,
                                                                long row_bytes, int groups,
                                                                long first, int n) {
    const unsigned char *packed = (const unsigned char *)w->data + first * row_bytes;
    for (long at = 0; at < n * row_bytes; at += 64) __builtin_prefetch(packed + at);
    if (kind == WEIGHT_BF16) return; /* no scales */
    long bytes = group_value_bytes(w->group_type);
    const char *scales = (const char *)w->scales + first * groups * bytes;
    const char *biases = (const char *)w->biases + first * groups * bytes;
    for (long at = 0; at < n * groups * bytes; at += 64) {
        __builtin_prefetch(scales + at);
        __builtin_prefetch(biases + at);
    }
}

/* y[:, first:first + n] = x @ dense^T (+ beta y): the dot tiles small_sgemm.c would run
 * for this product (its rows are more than one, its columns fewer than the lane tiles
 * take; at a depth up to 128 it holds A's row instead, the same sums in the same order),
 * called here without cblas_sgemm's dispatch and without asking for the next
 * columns ahead (they were just written, and sit in L1). The same bits; without the
 * kernels (no FMA), OpenBLAS's product. */
static void dense_product(const weight_task_t *t, const float *dense, int first, int n) {
#if SIMD_FMA
    for (int col = 0; col < n; col += TILE_COLS) {
        const float *b[TILE_COLS], *a[TILE_ROWS];
        for (int j = 0; j < TILE_COLS; j++) b[j] = dense + (long)(col + j < n ? col + j : col) * t->in;
        for (int row = 0; row < t->rows; row += TILE_ROWS) {
            for (int i = 0; i < TILE_ROWS; i++)
                a[i] = t->x + (long)(row + i < t->rows ? row + i : row) * t->in;
            float dots[TILE_ROWS * TILE_COLS];
            dot_tile(TILE_ROWS, TILE_COLS, t->in, a, b, NULL, dots);
            for (int i = 0; i < TILE_ROWS && row + i < t->rows; i++)
                for (int j = 0; j < TILE_COLS && col + j < n; j++) {
                    float *out = t->y + (long)(row + i) * t->out + first + col + j;
                    float sum = dots[TILE_COLS * i + j];
                    *out = t->beta == 0.0f ? sum : sum + t->beta * *out;
                }
        }
    }
#else
    sgemm()(ROW_MAJOR, NO_TRANS, TRANS, t->rows, n, t->in, 1.0f, t->x, t->in, dense, t->in,
            t->beta, t->y + first, t->out);
#endif
}

/* How far ahead a tile asks for the weights it will read: 4 KB (rows of 1,152 bfloat16
 * bytes ran a 49,152-row head 1.4x faster than at 16 rows ahead; one VM, ADR 0031). */
enum { PREFETCH_BYTES = 4096 };

/* A product's row geometry, worked out once per span rather than with two divisions in
 * every tile (q8 products of one and two rows 0.95-0.97x the time; ADR 0010). */
typedef struct {
    int group, groups;
    long row_bytes, ahead; /* ahead: output rows PREFETCH_BYTES cover */
} rows_shape_t;

static inline rows_shape_t rows_shape(const weight_task_t *t, int kind) {
    rows_shape_t s;
    s.group = group_inputs(t->w, kind, t->in);
    s.groups = t->in / s.group;
    s.row_bytes = (long)t->in * kind / 8;
    s.ahead = (PREFETCH_BYTES + s.row_bytes - 1) / s.row_bytes;
    return s;
}

/* Up to KERNEL_ROWS rows: DEQUANTIZED_ROWS output rows at a time dequantized into scratch
 * (it stays in L1 while every row meets it), the next unit's weights asked for meanwhile
 * (`perf` had the dequantization waiting on memory; 16 rows of a 4-bit 1,536 x 576
 * product 0.96x the time, one AVX-512 VM, ADR 0031). */
static void weight_units(const void *context, int from, int to) {
    weight_task_t *t = (weight_task_t *)context;
    float *dense = scratch((size_t)DEQUANTIZED_ROWS * t->in);
    if (dense == NULL) {
        t->failed = 1;
        return;
    }
    rows_shape_t shape = rows_shape(t, t->w->kind);
    /* the next unit's rows, as many as AHEAD_BYTES hold (wide rows: not all of them) */
    long fit = AHEAD_BYTES / shape.row_bytes;
    int ahead = fit < 1 ? 1 : fit < DEQUANTIZED_ROWS ? (int)fit : DEQUANTIZED_ROWS;
    for (int unit = from; unit < to; unit++) {
        int first = unit * DEQUANTIZED_ROWS;
        int n = t->out - first < DEQUANTIZED_ROWS ? t->out - first : DEQUANTIZED_ROWS;
        int next = t->out - first - n < ahead ? t->out - first - n : ahead;
        prefetch_rows(t->w, t->w->kind, shape.row_bytes, shape.groups, first + n, next);
        for (int o = 0; o < n; o++) dequantize_row(t->w, first + o, t->in, dense + (long)o * t->in);
        dense_product(t, dense, first, n);
    }
}

/* Up to FUSED_ROWS activation rows: each 16 weights are dequantized in registers and met
 * by every row there, nothing written back. The sums are the small kernel's (16 logical
 * lanes over the depth, halved in simd.h's order, then the bias), so the bits are those of
 * the dequantize-then-multiply path above; `rows` is a constant once inlined. A lane's sum
 * is one chain of fused multiply-adds, each waiting for the last (4 cycles), so with few
 * activation rows `cols` output rows go together: their chains are independent, and an
 * output element's sum is the same whatever its neighbours. */
enum { FUSED_ROWS = 8, FUSED_COLS = 4, FUSED_CHUNKS = 8 };
/* Rows up to which the fused loop runs, by format; from there on the scratch path, which
 * dequantizes each weight once for all rows. A fused 32-input 4-bit step keeps its bytes
 * and the group's table beside every row's accumulator and activations, so its decoding
 * stops hiding behind the multiply-adds first; bfloat16 decodes by a shift, last. AVX-512
 * has 32 registers of 16 lanes (PARTS 1), AVX2 16 of 8 (PARTS 2: from 3 rows on the
 * compiler reads the activations as memory operands of the multiply-adds). Measured with
 * the scratch path at a tile's columns a unit (one thread, 30 SmolLM2-shaped layers from
 * memory, scratch against fused; Zen 5, ADR 0031): AVX-512 4-bit 5 rows 1.04-1.05x the
 * time, 6 rows 0.94-0.99x (with 16-row units); 8-bit 6 rows 1.00-1.03x, 7 rows
 * 0.79-0.89x; bfloat16 6 rows 0.94-1.14x, 8 rows 0.86-0.94x; AVX2 4-bit 5 rows
 * 1.04-1.06x, 6 rows 0.80-0.81x; 8-bit 6 rows 0.99-1.10x; bfloat16 6 rows 1.16x. (Four
 * rows fill a 4 x 4 tile exactly, and there AVX-512's 4-bit scratch path was 0.82-0.93x:
 * one count among the fused ones, not taken.) NEON (32 of 4, PARTS 4) keeps 2: not
 * measured on a NEON CPU. Needs the FMA. */
static inline int fused_reach(int kind) {
#ifdef FUSED_REACH /* given at build time: a tuning experiment, for every format */
    (void)kind;
    return FUSED_REACH;
#else
    if (!SIMD_FMA) return 0;
    if (LANES == 16) return kind == WEIGHT_Q4 ? 5 : kind == WEIGHT_Q8 ? 6 : 7;
    if (LANES == 8) return kind == WEIGHT_Q4 ? 5 : 6;
    return 2;
#endif
}

static inline __attribute__((always_inline)) void fused_tile(const int rows, const int cols,
                                                             const int kind,
                                                             const weight_task_t *t,
                                                             const rows_shape_t *shape, int o) {
    const weight_t *w = t->w;
    int group = shape->group, groups = shape->groups;
    long row_bytes = shape->row_bytes, ahead = shape->ahead;
    if ((long)o + cols + ahead <= t->out)
        prefetch_rows(w, kind, row_bytes, groups, (long)o + ahead, cols);
    const unsigned char *packed = (const unsigned char *)w->data + o * row_bytes;
    vf acc[FUSED_COLS][FUSED_ROWS][PARTS];
    for (int c = 0; c < cols; c++)
        for (int i = 0; i < rows; i++)
            for (int q = 0; q < PARTS; q++) acc[c][i][q] = splat(0.0f);
    float room[FUSED_COLS][2 * GROUP_BLOCK];
    const float *xs[FUSED_ROWS]; /* one pointer a row (gcc had run out of registers) */
    for (int i = 0; i < rows; i++) xs[i] = t->x + (long)i * t->in;
    /* 4-bit: 32 inputs a step, two weights from each byte, read once (quantized.h). 16
     * lanes keep a step's bytes in a register; 8 lanes read them again for the high nibbles
     * (kept, they spilled). One-row products 0.78-0.83x the time of MLX's order (one
     * thread); a decode step of one sequence 0.86-0.90x (AVX-512), AVX2 even (ADR 0031). */
    const int step = kind == WEIGHT_Q4 ? 32 : 16, keep = LANES == 16;
    for (int first = 0; first < groups; first += GROUP_BLOCK) {
        int count = groups - first < GROUP_BLOCK ? groups - first : GROUP_BLOCK;
        for (int c = 0; c < cols && kind != WEIGHT_BF16; c++)
            groups_into(w, (long)o + c, groups, first, count, room[c]);
        /* bfloat16 has no groups, but its loop keeps the frame that holds them: with `room`
         * optimized away one bfloat16 stream's step ran 1.05-1.08x the time (in one
         * process, alternated; a layout effect, ADR 0031) */
        if (kind == WEIGHT_BF16) __asm__ volatile("" : : "r"(&room[0][0]));
        for (int g = first; g < first + count; g++) {
            group_decoder_t d[FUSED_COLS];
            for (int c = 0; c < cols; c++) d[c] = decoder_at(room[c], kind, g - first);
            for (int at = g * group; at < (g + 1) * group; at += step) {
                vi kept_bytes[FUSED_COLS][PARTS];
                for (int c = 0; c < cols && step == 32 && keep; c++)
                    for (int q = 0; q < PARTS; q++)
                        kept_bytes[c][q] = paired_bytes(packed + c * row_bytes, at, q);
                for (int h = 0; h < step / 16; h++)
                    for (int q = 0; q < PARTS; q++) {
                        int in = at + 16 * h + q * LANES;
                        vf x[FUSED_ROWS];
                        for (int i = 0; i < rows; i++) x[i] = load(xs[i] + in);
                        for (int c = 0; c < cols; c++) {
                            const unsigned char *row = packed + c * row_bytes;
                            vf weights = step == 16 ? weights_at(row, kind, in, &d[c])
                                         : keep ? paired_weights(kept_bytes[c][q], h, &d[c])
                                                : paired_weights(paired_bytes(row, at, q), h, &d[c]);
                            for (int i = 0; i < rows; i++) acc[c][i][q] += x[i] * weights;
                        }
                    }
            }
        }
    }
    vf flat[FUSED_COLS * FUSED_ROWS][PARTS]; /* summed by the tree, four at a time */
    float sums[FUSED_COLS * FUSED_ROWS];
    for (int c = 0; c < cols; c++)
        for (int i = 0; i < rows; i++)
            for (int q = 0; q < PARTS; q++) flat[c * rows + i][q] = acc[c][i][q];
    halve_each(rows * cols, flat, sums);
    for (int c = 0; c < cols; c++)
        for (int i = 0; i < rows; i++) {
            float sum = sums[c * rows + i], *out = t->y + (long)i * t->out + o + c;
            *out = t->beta == 0.0f ? sum : sum + t->beta * *out;
        }
}

/* The fewest output rows a claim takes: an eighth of them (claims of 16 rows throughout
 * interleaved the two threads' reads and halved the rate of a 49,152-row head; since
 * claims shrink to their least only at the end, 16 rows at least read even). */
static int fused_chunk(int units) {
    int chunk = units / FUSED_CHUNKS / 16 * 16;
    return chunk < 16 ? 16 : chunk;
}

/* Output rows [from, to): `cols` at a time, the rest one by one. */
static inline __attribute__((always_inline)) void fused_span(const int rows, const int cols,
                                                             const int kind,
                                                             const weight_task_t *t, int from,
                                                             int to) {
    rows_shape_t shape = rows_shape(t, kind);
    int o = from;
    for (; o + cols <= to; o += cols) fused_tile(rows, cols, kind, t, &shape, o);
    for (; o < to; o++) fused_tile(rows, 1, kind, t, &shape, o);
}

/* Accumulator registers a tile may take: 8 of AVX-512's 32 and of AVX2's 16, 16 of NEON's
 * 32 (the rest hold the rows, the weights and their decoders). One row on AVX2 takes 4:
 * with 8, four output rows' scales and biases (8 more registers) did not fit beside them,
 * and two output rows at a time ran a 49,152-row 8-bit head 1.4-1.7x faster (Zen 3). Two
 * 4-bit rows too (their 32-input steps spilled with two output rows: 1.24x the time, one
 * output row 0.94-0.99x; 8-bit rows kept two: one was 1.10x). */
#define TILE_ACCUMULATORS(rows, kind) \
    (LANES == 4 ? 16 : LANES == 8 && ((rows) == 1 || ((rows) == 2 && (kind) == WEIGHT_Q4)) ? 4 : 8)
#define TILE_FIT(rows, kind) (TILE_ACCUMULATORS(rows, kind) / ((rows) * PARTS))
#define FUSED_TILE_COLS(rows, kind) \
    (TILE_FIT(rows, kind) >= FUSED_COLS ? FUSED_COLS : TILE_FIT(rows, kind) ? TILE_FIT(rows, kind) : 1)

/* The loop compiled for each row count and format; fewer rows, more output rows at once. */
#define FUSED_CASES(kind)                                                                  \
    switch (t->rows) {                                                                     \
    case 1: fused_span(1, FUSED_TILE_COLS(1, kind), kind, t, from, to); break;                         \
    case 2: fused_span(2, FUSED_TILE_COLS(2, kind), kind, t, from, to); break;                         \
    case 3: fused_span(3, FUSED_TILE_COLS(3, kind), kind, t, from, to); break;                         \
    case 4: fused_span(4, FUSED_TILE_COLS(4, kind), kind, t, from, to); break;                         \
    case 5: fused_span(5, FUSED_TILE_COLS(5, kind), kind, t, from, to); break;                         \
    case 6: fused_span(6, FUSED_TILE_COLS(6, kind), kind, t, from, to); break;                         \
    case 7: fused_span(7, FUSED_TILE_COLS(7, kind), kind, t, from, to); break;                         \
    default: fused_span(8, FUSED_TILE_COLS(8, kind), kind, t, from, to); break;                        \
    }

static void fused_units(const void *context, int from, int to) {
    const weight_task_t *t = context;
    if (t->w->kind == WEIGHT_Q4) {
        FUSED_CASES(WEIGHT_Q4)
    } else if (t->w->kind == WEIGHT_Q8) {
        FUSED_CASES(WEIGHT_Q8)
    } else {
        FUSED_CASES(WEIGHT_BF16)
    }
}

/* More rows than our kernel's reach (a prompt chunk on MLX's graph): 4 MB of output rows
 * at a time dequantized by our two threads, then one product of every row by the block
 * through cblas_sgemm, which for so many rows is OpenBLAS's, as a float32 model's chunk
 * is. Such a chunk's bits depend on its rows, as a float32 chunk's do; chunk boundaries
 * depend only on the prompt (ADR 0009). */
enum { BLOCK_BYTES = 4 << 20 };

typedef struct {
    const weight_t *w;
    float *dense;
    int first, in;
} dequantize_task_t;

static void dequantize_units(const void *context, int from, int to) {
    const dequantize_task_t *t = context;
    for (int o = from; o < to; o++)
        dequantize_row(t->w, t->first + o, t->in, t->dense + (long)o * t->in);
}

static int blocked_product(const weight_task_t *t) {
    int block = (int)(BLOCK_BYTES / ((size_t)t->in * sizeof(float))) / 16 * 16;
    block = block < 16 ? 16 : block;
    float *dense = scratch((size_t)block * t->in);
    if (dense == NULL) return -1;
    parallel_fn parallel = shared_helper();
    for (int first = 0; first < t->out; first += block) {
        int n = t->out - first < block ? t->out - first : block;
        dequantize_task_t task = {t->w, dense, first, t->in};
        if (parallel != NULL)
            parallel(dequantize_units, &task, n, BLOCK_CHUNK);
        else
            dequantize_units(&task, 0, n);
        sgemm()(ROW_MAJOR, NO_TRANS, TRANS, t->rows, n, t->in, 1.0f, t->x, t->in, dense, t->in,
                t->beta, t->y + first, t->out);
    }
    return 0;
}

/* y = x @ w^T (+ bias) for `rows` rows: x [rows][in], y [rows][out]. With a bias, as MLX's
 * addmm does it on the CPU: y filled with the bias, then one product with beta 1, so the
 * bias is added where MLX adds it. Returns 0, or -1 if scratch memory ran out. */
static int weight_product(const float *x, const weight_t *w, const float *bias, float *y,
                          int rows, int in, int out) {
    if (rows <= 0) return 0;
    if (bias != NULL)
        for (int r = 0; r < rows; r++) memcpy(y + (long)r * out, bias, out * sizeof(float));
    float beta = bias != NULL ? 1.0f : 0.0f;
    if (w->kind == WEIGHT_FLOAT32) {
        sgemm()(ROW_MAJOR, NO_TRANS, TRANS, rows, out, in, 1.0f, x, in, w->data, in, beta, y, out);
        return 0;
    }
    weight_task_t task = {w, x, y, rows, in, out, beta, 0};
    if (rows > KERNEL_ROWS) return blocked_product(&task);
    int fused = rows <= fused_reach(w->kind);
    int units = fused ? out : (out + DEQUANTIZED_ROWS - 1) / DEQUANTIZED_ROWS;
    work_fn work = fused ? fused_units : weight_units;
    parallel_fn parallel = shared_helper();
    if (parallel != NULL && units > 1)
        parallel(work, &task, units, fused ? fused_chunk(units) : 1);
    else
        work(&task, 0, units);
    return task.failed ? -1 : 0;
}

#endif
