/*
 * 16-lane float vectors (AVX-512 where built with -march=native; GCC splits them otherwise)
 * and the few operations our kernels share. Included by each kernel's source; the build
 * key covers this file too (native_build.py).
 */
#ifndef SEMANTIC_SIMD_H
#define SEMANTIC_SIMD_H
#include <string.h>

typedef float v16 __attribute__((vector_size(64), aligned(4))); /* unaligned loads */
typedef int i16 __attribute__((vector_size(64)));

static inline v16 splat(float x) { return (v16){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

static inline v16 load(const float *p) { return *(const v16 *)p; }

static inline void store(float *p, v16 x) { *(v16 *)p = x; }

static inline v16 vmax(v16 a, v16 b) {
    i16 take_a = a > b;
    return (v16)((take_a & (i16)a) | (~take_a & (i16)b));
}

/* e^x for x <= 0 (scores minus their maximum); below -87 it returns ~1e-38, not 0. */
static inline v16 vexp(v16 x) {
    x = vmax(x, splat(-87.0f));
    v16 t = x * splat(1.44269504088896341f);
    i16 n = __builtin_convertvector(t, i16); /* toward zero: n = ceil(t) for t <= 0 */
    v16 y = (t - __builtin_convertvector(n, v16)) * splat(0.693147180559945309f); /* (-ln2, 0] */
    v16 p = splat(1.0f / 40320.0f);
    p = p * y + splat(1.0f / 5040.0f);
    p = p * y + splat(1.0f / 720.0f);
    p = p * y + splat(1.0f / 120.0f);
    p = p * y + splat(1.0f / 24.0f);
    p = p * y + splat(1.0f / 6.0f);
    p = p * y + splat(0.5f);
    p = p * y + splat(1.0f);
    p = p * y + splat(1.0f);
    i16 bits = (n + 127) << 23;
    v16 scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static inline float fold(v16 x) {
    float total = 0.0f;
    for (int i = 0; i < 16; i++) total += x[i];
    return total;
}

#endif
