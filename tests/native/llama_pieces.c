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
    weight_t w = {words, scales, biases, bits, 32, GROUPS_FLOAT32};
    dequantize_row(&w, 0, n, out);
}

/* The same with scales and biases of 16 bits (`group_type` GROUPS_FLOAT16 or _BFLOAT16). */
void pieces_dequantize_narrow(const unsigned int *words, const unsigned short *scales,
                              const unsigned short *biases, int bits, int group_type, int n,
                              float *out) {
    weight_t w = {words, scales, biases, bits, 32, group_type};
    dequantize_row(&w, 0, n, out);
}

/* float16 values the variant's widening (an instruction where there is one) gives other
 * than their bits say (NaNs compared as NaNs): 0 where all 65,536 agree. */
int pieces_float16_disagreements(void) {
    int disagree = 0;
    for (unsigned int h = 0; h < 65536; h++) {
        float ours = float16_value((unsigned short)h), bits = float16_bits_value((unsigned short)h);
        int same = ours != ours ? bits != bits : memcmp(&ours, &bits, sizeof ours) == 0;
        disagree += !same;
    }
    return disagree;
}
