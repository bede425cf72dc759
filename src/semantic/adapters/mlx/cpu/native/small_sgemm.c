/*
 * cblas_sgemm for MLX with our own kernels for products of a few rows (decode steps).
 *
 * MLX's CPU backend calls cblas_sgemm for every float32 matmul. A decode step multiplies
 * one row per sequence by every weight matrix; OpenBLAS's sgemm packs the whole weight
 * matrix first and, below about 32 rows, runs no faster with 16 rows than with 4: on a
 * 2-core x86 machine SmolLM2's 211 matrices took 52 ms for one row and 67 ms for 16.
 * Weight streaming is the floor (538 MB a step): the kernels here read each weight row
 * once per call and keep the few activation rows in L1, so 16 rows cost 39 ms and one row
 * 20 ms. See docs/adr/0010-small-batch-matmul-kernel.md.
 *
 * Loaded with RTLD_GLOBAL before OpenBLAS and MLX, this cblas_sgemm wins. It handles:
 *   row-major, A not transposed, m <= SMALL_MAX_ROWS:
 *     B transposed (x @ W^T: every linear layer, attention scores)  -> dot-product tiles
 *       (AVX2, 16 or 32 rows, 64+ columns: the same sums in lane tiles, lane_tiles.h)
 *     B plain (probabilities @ V)                                   -> broadcast tiles
 *   more rows, B transposed, where Python asks (semantic_set_prompt_products) -> dot tiles
 * and passes everything else to OpenBLAS's sgemm unchanged. Built for a CPU without fused
 * multiply-add (x86 before AVX2) it keeps the older behaviour: up to three rows go to
 * OpenBLAS's sgemv. Every variant (AVX-512, AVX2 + FMA, NEON) runs the same source
 * (simd.h), with a tile shape of its own.
 *
 * Every output element is computed by the same instruction sequence whatever the number
 * of rows, the row's position and the thread split, so a sequence's products are the same
 * bits alone and batched.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "simd.h"
#include "dot_tile.h"
#include "lane_tiles.h"
#include "scratch.h"

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
enum { GEMV_MAX_ROWS = 3, SMALL_MAX_ROWS = 32 };
/* Columns a thread claims at a time: 48 for the dot tiles (a multiple of 2, 3 and 4
 * columns: no short tile but the product's last), 64 for the broadcast tiles' blocks. */
enum { DOT_CHUNK = 48, BROADCAST_CHUNK = 64 };

#ifndef BLAS_TARGET
#define BLAS_TARGET "libopenblas.so.0"
#endif

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                         const float *, int, float, float *, int);
typedef void (*sgemv_fn)(int, int, int, int, float, const float *, int, const float *, int,
                         float, float *, int);

static sgemm_fn real_sgemm;
static sgemv_fn real_sgemv;

static int resolve(void) {
    if (real_sgemm) return 1;
    void *lib = dlopen(BLAS_TARGET, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return 0;
    real_sgemv = (sgemv_fn)dlsym(lib, "cblas_sgemv");
    real_sgemm = (sgemm_fn)dlsym(lib, "cblas_sgemm");
    return real_sgemm != NULL;
}

/* Python checks this before promoting the library to the global scope. */
int semantic_blas_shim_ready(void) { return resolve() && real_sgemv != NULL; }

/* One product C = alpha * A B(^T) + beta * C, row-major, A not transposed. */
typedef struct product product_t;
struct product {
    int m, n, k, lda, ldb, ldc;
    float alpha, beta;
    const float *a, *b;
    float *c;
    void (*columns)(const product_t *, int, int); /* computes columns [from, to) */
    int chunk; /* columns a thread claims at a time (a multiple of the tile's) */
    const float *packed; /* A packed lane-major (lane_tiles.h), for lane_columns */
};

static void put(const product_t *p, int row, int col, float sum) {
    float *out = p->c + (size_t)row * p->ldc + col;
    float value = p->alpha * sum;
    *out = p->beta == 0.0f ? value : value + p->beta * *out;
}

/* put() for `rows` x `cols` sums (row-major in `sums`), clipped to the product. A plain
 * product (alpha 1, beta 0: every product MLX asks for) copies each row: the same bits,
 * and at a short k, as in attention scores, the per-element stores were a fifth of the
 * time (AVX2, 32 x 4,178 x 64). */
static inline __attribute__((always_inline)) void put_tile(
    const product_t *p, int row, int col, const int rows, const int cols, int to,
    const float *sums) {
    int keep_rows = p->m - row < rows ? p->m - row : rows;
    int keep_cols = to - col < cols ? to - col : cols;
    for (int i = 0; i < keep_rows; i++) {
        float *out = p->c + (size_t)(row + i) * p->ldc + col;
        if (p->alpha == 1.0f && p->beta == 0.0f) {
            if (keep_cols == cols) /* a constant size: a register move, not a call */
                memcpy(out, sums + cols * i, (size_t)cols * sizeof(float));
            else
                memcpy(out, sums + cols * i, (size_t)keep_cols * sizeof(float));
            continue;
        }
        for (int j = 0; j < keep_cols; j++) put(p, row + i, col + j, sums[cols * i + j]);
    }
}

/* Three-row-or-fewer products through sgemv: the fallback without AVX-512. */
static void gemv_rows(int trans_b, const product_t *p) {
    for (int row = 0; row < p->m; row++) {
        const float *x = p->a + (size_t)row * p->lda;
        float *y = p->c + (size_t)row * p->ldc;
        if (trans_b == NO_TRANS) /* y = B^T x, B is k x n */
            real_sgemv(ROW_MAJOR, TRANS, p->k, p->n, p->alpha, p->b, p->ldb, x, 1, p->beta, y, 1);
        else /* y = B x, B is n x k */
            real_sgemv(ROW_MAJOR, NO_TRANS, p->n, p->k, p->alpha, p->b, p->ldb, x, 1, p->beta, y, 1);
    }
}

#if SIMD_FMA
#define HAVE_KERNELS 1

/* Row `i` of a matrix with `rows` rows, clamped: a short tile repeats its first row and
 * the extra results are dropped. */
static const float *row_of(const float *base, int ld, int i, int rows, int first) {
    return base + (size_t)(i < rows ? i : first) * ld;
}

/* The share of the next `cols` rows of B that tile `tile` of `tiles` asks for ahead:
 * spread over all the tiles, the loads from memory overlap the whole group's arithmetic
 * instead of bunching into its first tile (16 rows of SmolLM2's products on a Zen 3, both
 * cores, weights from memory: 60-65 -> 76-80 GFLOP/s with the 2 x 3 tile; ADR 0026). */
static inline __attribute__((always_inline)) void prefetch_share(
    const int cols, const float *const *next, int k, int tile, int tiles) {
    int lines_per_row = (k + 15) / 16, lines = cols * lines_per_row;
    int line = tile * lines / tiles, end = (tile + 1) * lines / tiles;
    int row = line / lines_per_row, at = line % lines_per_row; /* then counted, not divided */
    for (; line < end; line++) {
        __builtin_prefetch(next[row] + 16 * at);
        if (++at == lines_per_row) {
            at = 0;
            row++;
        }
    }
}

/* C[:, from:to] for B transposed (n x k): each `cols` rows of B are read from memory once
 * and multiplied with every row of A, `rows` at a time, while the next `cols` rows are
 * fetched (by the tiles' shares, or within the one tile's loop). */
static inline __attribute__((always_inline)) void dot_columns_by(
    const int rows, const int cols, const product_t *p, int from, int to) {
    int tiles = (p->m + rows - 1) / rows;
    for (int col = from; col < to; col += cols) {
        const float *b[MOST_COLS], *next[MOST_COLS];
        for (int j = 0; j < cols; j++) {
            b[j] = row_of(p->b, p->ldb, col + j, to, col);
            next[j] = row_of(p->b, p->ldb, col + cols + j, to, col);
        }
        int more = col + cols < to;
        for (int row = 0; row < p->m; row += rows) {
            const float *a[TILE_ROWS];
            for (int i = 0; i < rows; i++) a[i] = row_of(p->a, p->lda, row + i, p->m, row);
            if (more && tiles > 1) prefetch_share(cols, next, p->k, row / rows, tiles);
            float dots[MOST_DOTS];
            dot_tile(rows, cols, p->k, a, b, more && tiles == 1 ? next : NULL, dots);
            put_tile(p, row, col, rows, cols, to, dots);
        }
    }
}

static void dot_columns(const product_t *p, int from, int to) {
    dot_columns_by(TILE_ROWS, TILE_COLS, p, from, to);
}

static void dot_columns_one_row(const product_t *p, int from, int to) {
    dot_columns_by(1, ROW_COLS, p, from, to);
}

/* ---- many rows: A packed lane-major (lane_tiles.h) --------------------------------- */
#if LANE_TILES
_Static_assert(DOT_CHUNK % LANE_COLS == 0, "a thread's columns are whole lane tiles");
_Static_assert(SMALL_MAX_ROWS <= LANE_BLOCK * LANE_MAX_BLOCKS, "lane tiles reach every row");

static void lane_columns(const product_t *p, int from, int to) {
    for (int col = from; col < to; col += LANE_COLS) {
        const float *b[LANE_COLS], *next[LANE_COLS];
        for (int j = 0; j < LANE_COLS; j++) {
            b[j] = row_of(p->b, p->ldb, col + j, to, col);
            next[j] = row_of(p->b, p->ldb, col + LANE_COLS + j, to, col);
        }
        float sums[LANE_BLOCK * LANE_MAX_BLOCKS * LANE_COLS];
        lane_tile(p->packed, p->a, p->lda, p->m, p->k, b, col + LANE_COLS < to ? next : NULL,
                  sums);
        put_tile(p, 0, col, p->m, LANE_COLS, to, sums);
    }
}

/* Products the lane tiles do faster than the dot tiles: whole blocks of 16 rows (with
 * padding they lost: 12 rows 1.27x the dot tiles' time, 15 rows 1.09x, 25 rows 1.06x), and
 * enough columns to repay packing A (16 dequantized rows of a 4-bit matrix at a time ran
 * 1.15-1.25x; Zen 3, ADR 0010). */
enum { LANE_MIN_COLUMNS = 64 };

static int lane_fits(const product_t *p) {
    return p->m % LANE_BLOCK == 0 && p->k >= 16 && p->n >= LANE_MIN_COLUMNS;
}

/* The lane tiles' columns for this product, with A packed in this thread's scratch; NULL
 * (the dot tiles) where they do no better, or without memory for the packed copy. */
static void (*lane_ready(product_t *p))(const product_t *, int, int) {
    float *packed = lane_fits(p) ? scratch(lane_packed_floats(p->m, p->k)) : NULL;
    if (packed == NULL) return NULL;
    lane_pack(p->a, p->lda, p->m, p->k, packed);
    p->packed = packed;
    return lane_columns;
}
#else
static void (*lane_ready(product_t *p))(const product_t *, int, int) {
    (void)p;
    return NULL;
}
#endif

/* ---- short rows: A's row held in registers (held_rows.h) ------------------------- */
#include "held_rows.h"

/* C[row, from:to] for plain B (k x n), 64 columns at a time: sum over k of a[row][k] times
 * row k of B, each output summed in order of k. */
static void broadcast_columns(const product_t *p, int from, int to) {
    enum { REGS = 64 / LANES };
    for (int row = 0; row < p->m; row++) {
        const float *a = p->a + (size_t)row * p->lda;
        int col = from;
        for (; col + 64 <= to; col += 64) {
            vf acc[REGS];
            for (int r = 0; r < REGS; r++) acc[r] = splat(0.0f);
            for (int at = 0; at < p->k; at++) {
                const float *b = p->b + (size_t)at * p->ldb + col;
                vf x = splat(a[at]);
                for (int r = 0; r < REGS; r++) acc[r] += x * load(b + r * LANES);
            }
            float sums[64];
            memcpy(sums, acc, sizeof sums);
            put_tile(p, row, col, 1, 64, to, sums);
        }
        for (; col < to; col++) {
            float sum = 0.0f;
            for (int at = 0; at < p->k; at++) sum = fmaf(a[at], p->b[(size_t)at * p->ldb + col], sum);
            put(p, row, col, sum);
        }
    }
}

/* ---- one helper thread, sharing the columns by work stealing (work_sharing.h) ------ */
#include "work_sharing.h"

/* Two threads pay off once B is a few hundred KB (reading it is most of the time) or the
 * arithmetic is large. */
enum { MIN_THREADED_B = 1 << 16, MIN_THREADED_WORK = 1 << 20 };

static void product_columns(const void *context, int from, int to) {
    const product_t *p = context;
    p->columns(p, from, to);
}

/* Two threads when it is worth it. */
static void run(const product_t *p) {
    long long b_size = (long long)p->n * p->k, work = b_size * p->m;
    if ((b_size < MIN_THREADED_B && work < MIN_THREADED_WORK) || p->n < 2 * p->chunk) {
        p->columns(p, 0, p->n);
        return;
    }
    share(product_columns, p, p->n, p->chunk);
}

/* ---- products past SMALL_MAX_ROWS ---------------------------------------------------
 * A prompt's products (x @ W^T, more rows than a decode step) are OpenBLAS's, unless
 * Python asks for ours: where OpenBLAS runs a narrower core than this build's variant
 * (Haswell's AVX2 kernels, set by a machine's profile on an AVX-512 CPU), the dot tiles
 * compute a 256-row chunk's products over depth 576 in 0.48-0.74x OpenBLAS's time (ADR
 * 0004). Attention's scores (a depth the held rows take) stay OpenBLAS's: there ours ran
 * 1.5-2x slower. The dot tiles also give each row the bits it gets alone. */
static atomic_int prompt_products;

void semantic_set_prompt_products(int ours) { atomic_store(&prompt_products, ours); }

int semantic_prompt_products(void) { return atomic_load(&prompt_products); }

static int prompt_rows_ours(int trans_b, int k) {
    int asked = atomic_load_explicit(&prompt_products, memory_order_relaxed);
    return asked && trans_b == TRANS && !held_fits(k);
}

/* The same helper for our other kernels (native/softmax_pv.c finds this with dlsym), so
 * the process never has more than one extra compute thread of ours. */
void semantic_parallel_for(work_fn work, const void *context, int total, int chunk) {
    share(work, context, total, chunk);
}
#else
#define HAVE_KERNELS 0
void semantic_set_helper_cpu(int cpu) { (void)cpu; } /* no helper without the kernels */
void semantic_set_helper_enabled(int enabled) { (void)enabled; }
void semantic_set_prompt_products(int ours) { (void)ours; } /* OpenBLAS's: no kernels */
int semantic_prompt_products(void) { return 0; }
#endif

/* Python reads these to say which products run here, and if not, why. */
int semantic_blas_small_kernels(void) { return HAVE_KERNELS; }

const char *semantic_kernel_variant(void) { return SIMD_VARIANT; }

const char *semantic_blas_compiler(void) {
#if defined(__clang__)
    return "clang " __clang_version__;
#elif defined(__GNUC__)
    return "gcc " __VERSION__;
#else
    return "an unknown C compiler";
#endif
}

void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    resolve(); /* never fails here: the library is only made global once it resolved */
    if (order == ROW_MAJOR && trans_a == NO_TRANS && m > 0 && n > 0 && k > 0) {
        product_t p = {m, n, k, lda, ldb, ldc, alpha, beta, a, b, c, NULL, DOT_CHUNK, NULL};
#if HAVE_KERNELS
        if (m > SMALL_MAX_ROWS && prompt_rows_ours(trans_b, k)) {
            p.columns = dot_columns;
            run(&p);
            return;
        }
        if (m <= SMALL_MAX_ROWS) {
            if (trans_b == NO_TRANS) p.chunk = BROADCAST_CHUNK;
            p.columns = trans_b == NO_TRANS ? broadcast_columns
                        : held_fits(k)     ? held_columns
                        : m == 1           ? dot_columns_one_row
                                           : lane_ready(&p);
            if (p.columns == NULL) p.columns = dot_columns;
            run(&p);
            return;
        }
#endif
        if (m <= GEMV_MAX_ROWS && real_sgemv) {
            gemv_rows(trans_b, &p);
            return;
        }
    }
    real_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
