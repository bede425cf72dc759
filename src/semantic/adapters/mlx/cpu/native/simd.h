/*
 * Float vectors of the CPU's own width and the few operations our kernels share: the one
 * source of every kernel variant (docs/adr/0026-one-kernel-source-for-every-cpu.md).
 *
 * A vf is one register in GCC's and clang's vector extensions: 16 floats with AVX-512, 8
 * with AVX2, 4 with NEON (and the SSE2 baseline). Sums run in blocks of 16 logical lanes
 * (PARTS registers) and fold in a fixed order, and every variant contracts a * b + c into
 * one rounding (AVX-512, AVX2 + FMA and NEON all do; the scalar tails use fmaf), so a
 * kernel gives the same bits on every variant: only the tile shapes, chosen for each
 * variant's register count, differ. Wider logical vectors than a register would be simpler
 * to write, but GCC keeps a vector wider than the target's registers in memory, and AVX2
 * ran our products 2-3x slower that way. Included by each kernel's source; the build key
 * covers this file too (native_build.py).
 */
#ifndef SEMANTIC_SIMD_H
#define SEMANTIC_SIMD_H
#include <string.h>

/* The variant this file was built as (native_build.py asks for one with its flags). */
#if defined(SIMD_FORCE_BASELINE)
#define SIMD_VARIANT "baseline" /* asked for by name (SEMANTIC_CPU_VARIANT=baseline) */
#define SIMD_FMA 0
#define LANES 4
#elif defined(__AVX512F__) && defined(__FMA__)
#define SIMD_VARIANT "avx512"
#define SIMD_FMA 1
#define LANES 16
#elif defined(__AVX2__) && defined(__FMA__)
#define SIMD_VARIANT "avx2"
#define SIMD_FMA 1
#define LANES 8
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define SIMD_VARIANT "neon"
#define SIMD_FMA 1
#define LANES 4
#else
#define SIMD_VARIANT "baseline" /* no fused multiply-add: the small kernels stay off */
#define SIMD_FMA 0
#define LANES 4
#endif

/* Registers in a block of 16 logical lanes. */
#define PARTS (16 / LANES)

typedef float vf __attribute__((vector_size(4 * LANES), aligned(4))); /* unaligned loads */
typedef int vi __attribute__((vector_size(4 * LANES)));

/* Every lane x, spelled out: one broadcast (a loop over the lanes became sixteen masked
 * ones with gcc, and (vf){0} + x turns -0.0 into +0.0). */
#define X4(x) x, x, x, x
#if LANES == 16
#define X_LANES(x) X4(x), X4(x), X4(x), X4(x)
#elif LANES == 8
#define X_LANES(x) X4(x), X4(x)
#else
#define X_LANES(x) X4(x)
#endif
static inline vf splat(float x) { return (vf){X_LANES(x)}; }
static inline vi splat_int(int x) { return (vi){X_LANES(x)}; }

static inline vf load(const float *p) { return *(const vf *)p; }

/* Keeps a loaded value in a register: without it GCC folds the load into every
 * multiply-add that uses the value (a 2 x 3 tile then loaded A's rows three times over and
 * ran no faster than 1 x 4 on a Zen 3; ADR 0026). An empty asm the value passes through. */
#if defined(__AVX512F__)
#define KEEP(v) __asm__("" : "+v"(v))
#elif defined(__AVX__)
#define KEEP(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define KEEP(v) __asm__("" : "+w"(v))
#else
#define KEEP(v) ((void)0)
#endif

static inline void store(float *p, vf x) { *(vf *)p = x; }

static inline vf vmax(vf a, vf b) {
    vi take_a = a > b;
    return (vf)((take_a & (vi)a) | (~take_a & (vi)b));
}

/* e^x for x <= 0 (scores minus their maximum); below -87 it returns ~1e-38, not 0. */
static inline vf vexp(vf x) {
    x = vmax(x, splat(-87.0f));
    vf t = x * splat(1.44269504088896341f);
    vi n = __builtin_convertvector(t, vi); /* toward zero: n = ceil(t) for t <= 0 */
    vf y = (t - __builtin_convertvector(n, vf)) * splat(0.693147180559945309f); /* (-ln2, 0] */
    vf p = splat(1.0f / 40320.0f);
    p = p * y + splat(1.0f / 5040.0f);
    p = p * y + splat(1.0f / 720.0f);
    p = p * y + splat(1.0f / 120.0f);
    p = p * y + splat(1.0f / 24.0f);
    p = p * y + splat(1.0f / 6.0f);
    p = p * y + splat(0.5f);
    p = p * y + splat(1.0f);
    p = p * y + splat(1.0f);
    vi bits = (n + 127) << 23;
    vf scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* The 16 logical lanes of a block summed one after the other, lane 0 first. */
static inline float fold(const vf part[PARTS]) {
    float total = 0.0f;
    for (int p = 0; p < PARTS; p++)
        for (int i = 0; i < LANES; i++) total += part[p][i];
    return total;
}

/* The 16 logical lanes of a block summed by halving: lane i + lane i+8, then i + i+4,
 * i + i+2, i + i+1 (the small products' order, small_sgemm.c). */
static inline float halve(const vf part[PARTS]) {
    float h[16];
    memcpy(h, part, sizeof h);
    for (int width = 8; width > 0; width /= 2)
        for (int i = 0; i < width; i++) h[i] = h[i] + h[i + width];
    return h[0];
}

#endif
