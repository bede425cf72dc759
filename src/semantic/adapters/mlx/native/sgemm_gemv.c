/*
 * cblas_sgemm for MLX that sends matrix-times-vector products to cblas_sgemv.
 *
 * MLX's CPU backend calls cblas_sgemm for every float32 matmul, including decode steps where
 * the activation has one row. OpenBLAS's sgemm packs the whole weight matrix first, so a
 * one-row product reads and writes the weights (~10 ms for SmolLM2's 113 MB output head on
 * a 2-core x86 machine) where sgemv only reads them (~3.4 ms). Loaded with RTLD_GLOBAL
 * before OpenBLAS and MLX, this symbol wins; everything with more than GEMV_MAX_ROWS
 * rows goes to OpenBLAS's own sgemm unchanged. See docs/adr/0004-fast-blas-on-linux.md.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
enum { GEMV_MAX_ROWS = 3 };

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

void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    resolve(); /* never fails here: the library is only made global once it resolved */
    if (order == ROW_MAJOR && m <= GEMV_MAX_ROWS && real_sgemv) {
        for (int row = 0; row < m; row++) {
            const float *x = trans_a == NO_TRANS ? a + (size_t)row * lda : a + row;
            int incx = trans_a == NO_TRANS ? 1 : lda;
            float *y = c + (size_t)row * ldc;
            if (trans_b == NO_TRANS) /* y = B^T x, B is k x n */
                real_sgemv(ROW_MAJOR, TRANS, k, n, alpha, b, ldb, x, incx, beta, y, 1);
            else /* y = B x, B is n x k */
                real_sgemv(ROW_MAJOR, NO_TRANS, n, k, alpha, b, ldb, x, incx, beta, y, 1);
        }
        return;
    }
    real_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
