/*
 * The value side of native/softmax_pv.c, for other kernels that call it (llama_pass.c).
 */
#ifndef SEMANTIC_SOFTMAX_PV_H
#define SEMANTIC_SOFTMAX_PV_H

/* Value rows [start, end) of one sequence: row j of kv head h is at
 * base + h * head + (j - start) * row (floats). */
typedef struct {
    int start, end;
    const float *base;
    long head, row;
} vrange_t;

typedef void (*softmax_pv_ranges_fn)(int batch, int kv_heads, int rows, int span, int dim,
                                     float *scores, const vrange_t *ranges, int n_ranges,
                                     const int *lo, const int *hi, int rows_per_range,
                                     float *out);

#endif
