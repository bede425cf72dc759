/* The host pass's elementwise steps (static in llama_pass.c), exported for kernel_digest.c. */
#include "llama_pass.c"

void pieces_rms_norm(const float *x, const float *weight, float *out, int rows, int n) {
    rms_norm(x, weight, out, rows, n, 1e-5f);
}

void pieces_swiglu(float *gate, const float *up, long n) { swiglu(gate, up, n); }

void pieces_rope(float *row, int heads, int dim, int traditional, const float *cos_,
                 const float *sin_) {
    rope_row(row, heads, dim, traditional, cos_, sin_);
}

/* One row of a 4- or 8-bit weight (groups of 32), or of a bfloat16 one, dequantized
 * (weights.h). */
void pieces_dequantize(const unsigned int *words, const float *scales, const float *biases,
                       int bits, int n, float *out) {
    weight_t w = {words, scales, biases, bits, 32};
    dequantize_row(&w, 0, n, out);
}
