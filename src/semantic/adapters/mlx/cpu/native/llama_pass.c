/*
 * A whole llama forward pass on the host for a few rows (decode steps, prompt rides, a
 * returning agent's short new suffix). See docs/adr/0013-host-pass-for-small-passes.md.
 *
 * Run through MLX, a pass of 26 rows spent ~50 of its ~100 ms outside the weight products:
 * about 25 small ops a layer, each scheduled on MLX's stream thread, with MLX's scalar
 * exp (12 ns a value here) in SwiGLU and RoPE, and one host round trip a layer for the
 * attention kernel. Here each layer is: RMS norm, the q/k/v products (with their biases:
 * Qwen2), each head's RMS norm on queries and keys (Qwen3), RoPE, the new keys
 * and values written into the caches' buffers, scores, softmax and values (our softmax_pv
 * kernel), the output product, the residual, RMS norm, gate and up products, SwiGLU, the
 * down product, the residual. The products go through cblas_sgemm, which for up to 32 rows
 * is our batch-invariant kernel (small_sgemm.c); the elementwise steps are
 * vector loops (simd.h), sums in 16 logical lanes.
 *
 * Bits: every step works row by row (a row's norm, RoPE and SwiGLU never see another row),
 * the products are batch-invariant up to 32 rows (scores too: they are taken 32 query rows
 * at a time), and attention is per sequence. So a row gets the same bits alone, batched,
 * beside a prompt chunk, and whether its keys lie in one buffer or in a restored prefix's
 * blocks.
 *
 * Layout: x [rows][hidden], rows ordered group by group, batch-major then position. A
 * group's caches are per layer, [batch][kv_heads][cap][head_dim] with strides in floats.
 * A group may also have a prefix of `prefix` positions held in segments (blocks restored
 * from disk, not yet copied into a cache); the cache's own positions follow it. The new
 * rows are written in the cache at [write_at, write_at + length), and row (b, t) attends
 * to positions [lo[b], prefix + write_at + t + 1); its RoPE position is pos[b] + t.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "helper.h"
#include "scratch.h"
#include "simd.h"
#include "softmax_pv.h"
#include "weights.h"

typedef struct {
    const float *attn_norm, *mlp_norm;
    weight_t wq, wk, wv, wo, wg, wu, wd; /* [out][in], as the model file keeps them */
    const float *bq, *bk, *bv, *bo, *bg, *bu, *bd; /* [out] biases (Qwen2's q/k/v), or NULL */
    const float *q_norm, *k_norm; /* [head_dim] per-head RMS norms before RoPE (Qwen3), or NULL */
} layer_t;

typedef struct {
    int layers, hidden, heads, kv_heads, head_dim, inter;
    int traditional; /* RoPE on neighbouring pairs (GGUF's layout), else on the two halves */
    float eps, scale;
    const float *inv_freq; /* [head_dim / 2] RoPE frequencies (Llama 3's scaled ones too) */
    const layer_t *layer;
    const float *final_norm;
    softmax_pv_ranges_fn softmax_pv;
} model_t;

/* Positions held outside the cache: a restored prefix's blocks, read straight from the
 * buffers their files were read into (rows of head_dim floats, one after the other). */
typedef struct {
    const float *keys, *values;
    int length;
    long k_head, v_head; /* floats from one kv head's rows to the next's */
} segment_t;

typedef struct {
    int batch, length, write_at;
    const int *lo;  /* [batch] first key each sequence attends to (its left padding) */
    const int *pos; /* [batch] RoPE position of each sequence's first new row */
    float *const *keys, *const *values; /* [layers] */
    long k_strides[3], v_strides[3];    /* batch, head, position; in floats */
    int prefix;                         /* positions in segments, before the cache's own */
    int n_segments;
    const segment_t *const *segments; /* [layers][n_segments]; a group of one sequence */
} group_t;

static void rms_norm(const float *x, const float *weight, float *out, int rows, int n, float eps) {
    int body = n - n % 16;
    for (int r = 0; r < rows; r++) {
        const float *row = x + (long)r * n;
        vf sum16[PARTS];
        for (int q = 0; q < PARTS; q++) sum16[q] = splat(0.0f);
        for (int j = 0; j < body; j += 16)
            for (int q = 0; q < PARTS; q++) {
                vf v = load(row + j + q * LANES);
                sum16[q] += v * v;
            }
        float sum = fold(sum16);
        for (int j = body; j < n; j++) sum = fmaf(row[j], row[j], sum);
        float inverse = 1.0f / sqrtf(sum / (float)n + eps);
        float *dest = out + (long)r * n;
        for (int j = 0; j < n; j++) dest[j] = row[j] * inverse * weight[j];
    }
}

static void add_into(float *x, const float *y, long n) {
    for (long j = 0; j < n; j++) x[j] += y[j];
}

/* gate = silu(gate) * up, with silu(g) = g * sigmoid(g) and e^-|g| from vexp (x <= 0). */
static inline vf swiglu_lanes(vf g, vf up) {
    vi negative = g < splat(0.0f);
    vf e = vexp((vf)((vi)g | (vi)splat(-0.0f))); /* e^-|g|: the sign bit set */
    vf one = splat(1.0f);
    vf numerator = (vf)((negative & (vi)e) | (~negative & (vi)one));
    return g * (numerator / (one + e)) * up;
}

/* The tail past the last full register goes through the same lanes, padded: an element's
 * bits never depend on where the register boundaries fall (the variant's width). */
static void swiglu(float *gate, const float *up, long n) {
    long body = n - n % LANES;
    for (long j = 0; j < body; j += LANES) store(gate + j, swiglu_lanes(load(gate + j), load(up + j)));
    if (body < n) {
        float g[LANES] = {0}, u[LANES] = {0};
        memcpy(g, gate + body, (size_t)(n - body) * sizeof *g);
        memcpy(u, up + body, (size_t)(n - body) * sizeof *u);
        store(g, swiglu_lanes(load(g), load(u)));
        memcpy(gate + body, g, (size_t)(n - body) * sizeof *g);
    }
}

/* SwiGLU over many values (a prompt chunk's MLP on MLX's graph, whose exp is scalar),
 * shared with our helper thread in runs of whole registers. Each value's bits are those of
 * the pass's own SwiGLU, wherever the runs end. */
enum { SWIGLU_RUN = 16384 };

typedef struct {
    float *gate;
    const float *up;
    long n;
} swiglu_task_t;

static void swiglu_runs(const void *context, int from, int to) {
    const swiglu_task_t *t = context;
    long start = (long)from * SWIGLU_RUN, end = (long)to * SWIGLU_RUN;
    swiglu(t->gate + start, t->up + start, (end < t->n ? end : t->n) - start);
}

void semantic_swiglu(float *gate, const float *up, long n) {
    swiglu_task_t task = {gate, up, n};
    int runs = (int)((n + SWIGLU_RUN - 1) / SWIGLU_RUN);
    parallel_fn parallel = shared_helper();
    if (parallel != NULL && runs > 1)
        parallel(swiglu_runs, &task, runs, 1);
    else
        swiglu_runs(&task, 0, runs);
}

/* Rotate each head's pairs (a, b) -> (a cos - b sin, a sin + b cos), as MLX's RoPE does:
 * pairs of neighbours (traditional) or of the two halves' i-th elements. */
static void rope_row(float *row, int heads, int dim, int traditional, const float *cos_,
                     const float *sin_) {
    int half = dim / 2, step = traditional ? 2 : 1, other = traditional ? 1 : half;
    for (int h = 0; h < heads; h++) {
        float *head = row + h * dim;
        for (int i = 0; i < half; i++) {
            float *a = head + i * step, *b = a + other;
            float x = *a, y = *b;
            /* one rounding each, spelled out: contraction is the compiler's choice */
            *a = fmaf(x, cos_[i], -(y * sin_[i]));
            *b = fmaf(x, sin_[i], y * cos_[i]);
        }
    }
}

/* scores[r][0:n] = q[r] . keys[0:n] for up to 32 query rows: within our kernel's reach, so a
 * score's bits do not depend on how many rows share its product or on whether its keys lie
 * in one buffer or in several. Called from the units below, while the helper thread runs
 * the other units, so each product runs on the thread that calls it. */
static void scores_of(const float *q, int rows, int dim, const float *keys, int key_stride,
                      int n, float *scores, int span) {
    if (n > 0)
        sgemm()(ROW_MAJOR, NO_TRANS, TRANS, rows, n, dim, 1.0f, q, dim, keys, key_stride, 0.0f,
                scores, span);
}


typedef struct {
    const model_t *m;
    const group_t *g;
    int layer;
    const float *grouped;
    float *scores;
    int q_rows, span, blocks;
} scores_task_t;

/* Units [from, to): one (sequence, kv head, block of 32 query rows) each, over every
 * segment of the prefix and then the cache's own positions. */
static void score_units(const void *context, int from, int to) {
    const scores_task_t *t = context;
    const model_t *m = t->m;
    const group_t *g = t->g;
    int dim = m->head_dim;
    for (int unit = from; unit < to; unit++) {
        int pair = unit / t->blocks, r = unit % t->blocks * KERNEL_ROWS;
        int b = pair / m->kv_heads, h = pair % m->kv_heads;
        int rows = t->q_rows - r < KERNEL_ROWS ? t->q_rows - r : KERNEL_ROWS;
        const float *q = t->grouped + ((long)pair * t->q_rows + r) * dim;
        float *s = t->scores + ((long)pair * t->q_rows + r) * t->span;
        const segment_t *segment = g->n_segments ? g->segments[t->layer] : NULL;
        for (int i = 0, at = 0; i < g->n_segments; at += segment[i].length, i++)
            scores_of(q, rows, dim, segment[i].keys + h * segment[i].k_head, dim,
                      segment[i].length, s + at, t->span);
        const float *keys = g->keys[t->layer] + b * g->k_strides[0] + h * g->k_strides[1];
        scores_of(q, rows, dim, keys, (int)g->k_strides[2], g->write_at + g->length,
                  s + g->prefix, t->span);
    }
}

typedef struct {
    const model_t *m;
    float *q, *k, *v, *mixed; /* [rows][...] for the whole pass */
    const float *cos_, *sin_;  /* [rows][head_dim / 2] */
} layer_io_t;

/* RoPE, the cache write and attention for one group's rows (starting at row r0); -1 if
 * its scratch could not be had. */
static int attend_group(const layer_io_t *io, const group_t *g, int layer, int r0) {
    const model_t *m = io->m;
    int dim = m->head_dim, per_kv = m->heads / m->kv_heads, half = dim / 2;
    int q_width = m->heads * dim, kv_width = m->kv_heads * dim, length = g->length;
    int span = g->prefix + g->write_at + length, q_rows = per_kv * length;
    float *keys = g->keys[layer], *values = g->values[layer];
    for (int b = 0; b < g->batch; b++)
        for (int t = 0; t < length; t++) {
            int row = r0 + b * length + t;
            const float *c = io->cos_ + (long)row * half, *s = io->sin_ + (long)row * half;
            rope_row(io->q + (long)row * q_width, m->heads, dim, m->traditional, c, s);
            rope_row(io->k + (long)row * kv_width, m->kv_heads, dim, m->traditional, c, s);
            for (int h = 0; h < m->kv_heads; h++) {
                long at = b * g->k_strides[0] + h * g->k_strides[1];
                long vat = b * g->v_strides[0] + h * g->v_strides[1];
                memcpy(keys + at + (long)(g->write_at + t) * g->k_strides[2],
                       io->k + (long)row * kv_width + h * dim, dim * sizeof(float));
                memcpy(values + vat + (long)(g->write_at + t) * g->v_strides[2],
                       io->v + (long)row * kv_width + h * dim, dim * sizeof(float));
            }
        }
    long pairs = (long)g->batch * m->kv_heads;
    float *grouped = scratch((size_t)(pairs * q_rows * dim * 2 + pairs * q_rows * span) +
                             (size_t)2 * g->batch * length);
    if (grouped == NULL) return -1;
    float *out = grouped + pairs * q_rows * dim, *scores = out + pairs * q_rows * dim;
    int *lo = (int *)(scores + pairs * q_rows * span), *hi = lo + g->batch * length;
    for (int b = 0; b < g->batch; b++)
        for (int t = 0; t < length; t++) {
            lo[b * length + t] = g->lo[b];
            hi[b * length + t] = g->prefix + g->write_at + t + 1;
            const float *q = io->q + (long)(r0 + b * length + t) * q_width;
            for (int h = 0; h < m->heads; h++) {
                int kv = h / per_kv, within = h % per_kv;
                float *dest = grouped + (((long)b * m->kv_heads + kv) * q_rows +
                                         (long)within * length + t) * dim;
                for (int d = 0; d < dim; d++) dest[d] = q[h * dim + d] * m->scale;
            }
        }
    int blocks = (q_rows + KERNEL_ROWS - 1) / KERNEL_ROWS;
    scores_task_t task = {m, g, layer, grouped, scores, q_rows, span, blocks};
    int units = g->batch * m->kv_heads * blocks;
    parallel_fn parallel = shared_helper();
    if (parallel != NULL && units > 1)
        parallel(score_units, &task, units, 1);
    else
        score_units(&task, 0, units);
    int n_ranges = g->n_segments + 1;
    vrange_t *ranges = malloc(sizeof(vrange_t) * (size_t)(g->batch * n_ranges));
    if (ranges == NULL) return -1;
    for (int b = 0; b < g->batch; b++) {
        vrange_t *r = ranges + (long)b * n_ranges;
        for (int i = 0, at = 0; i < g->n_segments; at += g->segments[layer][i].length, i++) {
            const segment_t *segment = &g->segments[layer][i];
            r[i] = (vrange_t){at, at + segment->length, segment->values, segment->v_head, dim};
        }
        r[g->n_segments] = (vrange_t){g->prefix, span, values + b * g->v_strides[0],
                                      g->v_strides[1], g->v_strides[2]};
    }
    m->softmax_pv(g->batch, m->kv_heads, q_rows, span, dim, scores, ranges, n_ranges, lo, hi,
                  length, out);
    free(ranges);
    for (int b = 0; b < g->batch; b++)
        for (int t = 0; t < length; t++) {
            float *dest = io->mixed + (long)(r0 + b * length + t) * q_width;
            for (int h = 0; h < m->heads; h++) {
                int kv = h / per_kv, within = h % per_kv;
                const float *src = out + (((long)b * m->kv_heads + kv) * q_rows +
                                          (long)within * length + t) * dim;
                memcpy(dest + h * dim, src, dim * sizeof(float));
            }
        }
    return 0;
}

/* The buffers of one pass beyond layer_io_t's: [rows][hidden] and [rows][inter]. */
typedef struct {
    float *h, *delta, *gate, *up;
} body_io_t;

/* One layer for all rows; 0, or -1 if scratch memory ran out. */
static int one_layer(const layer_io_t *io, const body_io_t *b, int l, int n_groups,
                     const group_t *groups, int rows, float *x) {
    const model_t *m = io->m;
    const layer_t *w = &m->layer[l];
    int n = m->hidden, q_width = m->heads * m->head_dim, kv_width = m->kv_heads * m->head_dim;
    int failed = 0;
    rms_norm(x, w->attn_norm, b->h, rows, n, m->eps);
    failed |= weight_product(b->h, &w->wq, w->bq, io->q, rows, n, q_width);
    failed |= weight_product(b->h, &w->wk, w->bk, io->k, rows, n, kv_width);
    failed |= weight_product(b->h, &w->wv, w->bv, io->v, rows, n, kv_width);
    if (w->q_norm != NULL) { /* every head of every row is a row of head_dim here */
        rms_norm(io->q, w->q_norm, io->q, rows * m->heads, m->head_dim, m->eps);
        rms_norm(io->k, w->k_norm, io->k, rows * m->kv_heads, m->head_dim, m->eps);
    }
    for (int gi = 0, r0 = 0; gi < n_groups; r0 += groups[gi].batch * groups[gi].length, gi++)
        failed |= attend_group(io, &groups[gi], l, r0);
    failed |= weight_product(io->mixed, &w->wo, w->bo, b->delta, rows, q_width, n);
    add_into(x, b->delta, (long)rows * n);
    rms_norm(x, w->mlp_norm, b->h, rows, n, m->eps);
    failed |= weight_product(b->h, &w->wg, w->bg, b->gate, rows, n, m->inter);
    failed |= weight_product(b->h, &w->wu, w->bu, b->up, rows, n, m->inter);
    swiglu(b->gate, b->up, (long)rows * m->inter);
    failed |= weight_product(b->gate, &w->wd, w->bd, b->delta, rows, m->inter, n);
    add_into(x, b->delta, (long)rows * n);
    return failed ? -1 : 0;
}

/* Returns 0 when done; -1 if cblas_sgemm cannot be found or memory ran out (then the
 * caches may hold some of this pass's keys past their offsets, which nothing reads). */
int semantic_llama_pass(const model_t *m, int n_groups, const group_t *groups, int rows,
                        float *x) {
    if (sgemm() == NULL) return -1;
    int n = m->hidden, half = m->head_dim / 2;
    int q_width = m->heads * m->head_dim, kv_width = m->kv_heads * m->head_dim;
    size_t per_row = (size_t)n * 2 + q_width * 2 + kv_width * 2 + (size_t)m->inter * 2 + half * 2;
    float *work = malloc(per_row * rows * sizeof(float));
    if (work == NULL) return -1;
    float *h = work, *q = h + (long)rows * n, *k = q + (long)rows * q_width;
    float *v = k + (long)rows * kv_width, *mixed = v + (long)rows * kv_width;
    float *gate = mixed + (long)rows * q_width, *up = gate + (long)rows * m->inter;
    float *cos_ = up + (long)rows * m->inter, *sin_ = cos_ + (long)rows * half;
    float *delta = sin_ + (long)rows * half;
    for (int gi = 0, row = 0; gi < n_groups; gi++)
        for (int b = 0; b < groups[gi].batch; b++)
            for (int t = 0; t < groups[gi].length; t++, row++)
                for (int i = 0; i < half; i++) {
                    float angle = (float)(groups[gi].pos[b] + t) * m->inv_freq[i];
                    cos_[(long)row * half + i] = (float)cos(angle);
                    sin_[(long)row * half + i] = (float)sin(angle);
                }
    layer_io_t io = {m, q, k, v, mixed, cos_, sin_};
    body_io_t body = {h, delta, gate, up};
    for (int l = 0; l < m->layers; l++)
        if (one_layer(&io, &body, l, n_groups, groups, rows, x) != 0) {
            free(work);
            return -1;
        }
    rms_norm(x, m->final_norm, x, rows, n, m->eps);
    free(work);
    return 0;
}

/* y = x @ w^T for a weight outside the layers (a quantized output head), on the same
 * kernels as the pass; 0, or -1 as semantic_llama_pass. */
int semantic_weight_product(const weight_t *w, const float *x, const float *bias, float *y,
                            int rows, int in, int out) {
    if (sgemm() == NULL) return -1;
    return weight_product(x, w, bias, y, rows, in, out);
}

/* Rows `ids[0 .. n)` of a 4/8-bit or bfloat16 table (an embedding) dequantized into
 * out[n][in], as mx.dequantize rounds them: a pass's input rows without MLX's graph. */
void semantic_dequantize_rows(const weight_t *w, const long long *ids, int n, int in,
                              float *out) {
    for (int i = 0; i < n; i++) dequantize_row(w, (long)ids[i], in, out + (long)i * in);
}
