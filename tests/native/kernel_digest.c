/*
 * Our kernels on fixed inputs, every output's bytes to standard output: built for each
 * variant (and for arm64, run under qemu-user) by tests/integration/test_kernel_digest.py,
 * which holds the outputs equal bit for bit (ADR 0026). Linked with small_sgemm.c,
 * softmax_pv.c and llama_pieces.c; no BLAS behind the shim, so only products of up to 32
 * rows (our kernels) are asked for.
 */
#include <stdio.h>
#include <stdlib.h>

void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);
void semantic_softmax_pv(int batch, int kv_heads, int rows, int span, int dim, float *scores,
                         const float *values, long v_batch, long v_head, long v_row,
                         const int *lo, const int *hi, int rows_per_range, float *out);
void pieces_rms_norm(const float *x, const float *weight, float *out, int rows, int n);
void pieces_swiglu(float *gate, const float *up, long n);
void pieces_rope(float *row, int heads, int dim, int traditional, const float *cos_,
                 const float *sin_);
void pieces_dequantize(const unsigned int *words, const float *scales, const float *biases,
                       int bits, int n, float *out);
void pieces_dequantize_narrow(const unsigned int *words, const unsigned short *scales,
                              const unsigned short *biases, int bits, int group_type, int n,
                              float *out);
int pieces_float16_disagreements(void);
const char *semantic_kernel_variant(void);

static unsigned long long state = 88172645463325252ULL;

static float uniform(void) { /* xorshift64 in [-1, 1) */
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return (float)((state >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

static float *randoms(long n) {
    float *out = malloc((size_t)n * sizeof *out);
    for (long i = 0; i < n; i++) out[i] = uniform();
    return out;
}

static void emit(const float *x, long n) { fwrite(x, sizeof *x, (size_t)n, stdout); }

static void products(void) {
    static const int rows[] = {1, 2, 4, 5, 16, 17, 32}, depths[] = {576, 577, 70, 64, 32};
    for (int d = 0; d < 5; d++) /* 64 and 32: rows of A held in registers (small_sgemm.c) */
        for (int r = 0; r < 7; r++) {
            int m = rows[r], n = 301, k = depths[d];
            float *a = randoms((long)m * k), *b = randoms((long)n * k), *c = randoms((long)m * n);
            cblas_sgemm(101, 111, 112, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n); /* A B^T */
            emit(c, (long)m * n);
            float *plain = randoms((long)k * n);
            cblas_sgemm(101, 111, 111, m, n, k, 0.5f, a, k, plain, n, 1.0f, c, n); /* A B */
            emit(c, (long)m * n);
            free(a), free(b), free(c), free(plain);
        }
}

/* Softmax and values for `rows` query rows of two kv heads over `span` positions, row r
 * reading [lo[r % 5], hi[r % 5]). */
static void attention_case(int rows, int span, int dim, const int lo[5], const int hi[5]) {
    int kv_heads = 2, from[64], to[64];
    for (int r = 0; r < rows; r++) from[r] = lo[r % 5], to[r] = hi[r % 5];
    float *scores = randoms((long)kv_heads * rows * span);
    float *values = randoms((long)kv_heads * span * dim);
    float *out = malloc(sizeof(float) * (size_t)kv_heads * rows * dim);
    semantic_softmax_pv(1, kv_heads, rows, span, dim, scores, values, 0, (long)span * dim, dim,
                        from, to, rows, out);
    emit(scores, (long)kv_heads * rows * span);
    emit(out, (long)kv_heads * rows * dim);
    free(scores), free(values), free(out);
}

static void attention(void) {
    attention_case(5, 83, 128, (int[]){0, 3, 0, 17, 1}, (int[]){83, 60, 1, 83, 82});
    /* many tiles a unit, and blocks of positions: a chunk's rows over a longer context */
    attention_case(59, 700, 64, (int[]){0, 0, 5, 300, 0}, (int[]){700, 257, 699, 560, 1});
    /* a decode step's few rows: the narrow tile */
    attention_case(3, 700, 64, (int[]){0, 9, 0, 0, 0}, (int[]){700, 700, 444, 0, 0});
    attention_case(1, 300, 128, (int[]){2, 0, 0, 0, 0}, (int[]){300, 0, 0, 0, 0});
}

static void elementwise(void) {
    int n = 583; /* a tail past the 16-lane blocks */
    float *x = randoms(3L * n), *w = randoms(n), *out = malloc(sizeof(float) * 3 * (size_t)n);
    pieces_rms_norm(x, w, out, 3, n);
    emit(out, 3L * n);
    float *gate = randoms(1547), *up = randoms(1547);
    for (int i = 0; i < 1547; i++) gate[i] *= 12.0f; /* both signs, large and small */
    pieces_swiglu(gate, up, 1547);
    emit(gate, 1547);
    free(x), free(w), free(out), free(gate), free(up);
    for (int traditional = 0; traditional < 2; traditional++) {
        float *row = randoms(3 * 64), *cos_ = randoms(32), *sin_ = randoms(32);
        pieces_rope(row, 3, 64, traditional, cos_, sin_);
        emit(row, 3 * 64);
        free(row), free(cos_), free(sin_);
    }
}

/* Every 4- and 8-bit value in every lane position, at scales and biases of both signs;
 * and bfloat16 widened. */
static void dequantization(void) {
    enum { N = 576 };
    unsigned int words[N / 2]; /* enough for bfloat16 */
    for (int i = 0; i < N / 2; i++) {
        uniform(); /* the generator's next state: its bits are the word */
        words[i] = (unsigned int)(state >> 16);
    }
    float *scales = randoms(N / 32), *biases = randoms(N / 32), out[N];
    for (int bits = 4; bits <= 16; bits *= 2) {
        pieces_dequantize(words, scales, biases, bits, N, out);
        emit(out, N);
    }
    free(scales), free(biases);
    /* scales and biases of 16 bits, float16 and bfloat16 (1 and 2): any sign, exponents up
     * to 2 (bit 14 clear), zeros and subnormals among them */
    unsigned short narrow[2][N / 32];
    for (int i = 0; i < N / 32; i++)
        for (int k = 0; k < 2; k++) {
            uniform();
            narrow[k][i] = (unsigned short)(state >> 48) & 0xbfff;
        }
    for (int type = 1; type <= 2; type++)
        for (int bits = 4; bits <= 8; bits *= 2) {
            pieces_dequantize_narrow(words, narrow[0], narrow[1], bits, type, N, out);
            emit(out, N);
        }
}

int main(void) {
    fprintf(stderr, "%s\n", semantic_kernel_variant());
    products();
    attention();
    elementwise();
    dequantization();
    int disagree = pieces_float16_disagreements();
    if (disagree) fprintf(stderr, "float16 widening disagrees with its bits %d times\n", disagree);
    return disagree != 0;
}
