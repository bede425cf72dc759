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

/* A load that stays in its register (KEEP). */
static inline __attribute__((always_inline)) vf kept(const float *p) {
    vf v = load(p);
    KEEP(v);
    return v;
}

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


/* Shuffle masks of the transposing add tree: level L pairs lanes 2^(log2(LANES)-L) apart,
 * taking the blocks of that size alternately from x and y (LO) or the blocks after (HI). */
#if LANES == 16
#define LO1 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define HI1 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define LO2 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27
#define HI2 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31
#define LO3 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29
#define HI3 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31
#define LO4 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define HI4 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#elif LANES == 8
#define LO1 0, 1, 2, 3, 8, 9, 10, 11
#define HI1 4, 5, 6, 7, 12, 13, 14, 15
#define LO2 0, 1, 4, 5, 8, 9, 12, 13
#define HI2 2, 3, 6, 7, 10, 11, 14, 15
#define LO3 0, 2, 4, 6, 8, 10, 12, 14
#define HI3 1, 3, 5, 7, 9, 11, 13, 15
#else
#define LO1 0, 1, 4, 5
#define HI1 2, 3, 6, 7
#define LO2 0, 2, 4, 6
#define HI2 1, 3, 5, 7
#endif
/* The same two shuffles and one add in either compiler's spelling (clang has no
 * __builtin_shuffle, GCC before 12 no __builtin_shufflevector). */
#if defined(__clang__)
#define SHUFFLE(x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
#else
#define SHUFFLE(x, y, ...) __builtin_shuffle(x, y, (vi){__VA_ARGS__})
#endif
#define FOLD(x, y, low, high) (SHUFFLE(x, y, low) + SHUFFLE(x, y, high))

/* One register per accumulator: its 16 logical lanes' first halvings, which add whole
 * registers (lane i + lane i+8 is part 0 + part 1 with 8 lanes; with 4 lanes, parts 0 + 2
 * and 1 + 3, then those two), the order of halve(). */
static inline vf halve_parts(const vf part[PARTS]) {
#if PARTS == 1
    return part[0];
#elif PARTS == 2
    return part[0] + part[1];
#else
    return (part[0] + part[2]) + (part[1] + part[3]);
#endif
}

/* Lanes 0-3 of the result are the sums of four accumulators: a transposing add tree over
 * the register's lanes that does halve()'s adds for all four at once (the fourth-last and
 * later levels pair the tree's one register with itself). */
static inline void halve4(const vf acc[][PARTS], float out[4]) {
    vf w0 = halve_parts(acc[0]), w1 = halve_parts(acc[1]);
    vf w2 = halve_parts(acc[2]), w3 = halve_parts(acc[3]);
    vf f = FOLD(FOLD(w0, w1, LO1, HI1), FOLD(w2, w3, LO1, HI1), LO2, HI2);
#if LANES >= 8
    f = FOLD(f, f, LO3, HI3);
#endif
#if LANES == 16
    f = FOLD(f, f, LO4, HI4);
#endif
    memcpy(out, &f, 4 * sizeof(float));
}

#if LANES == 16
/* Lane i of the result is the sum of the 16 lanes of acc[i], each by halve4's tree with its
 * operands in the same order (so sixteen sums halved together are the bits of four by four). */
static inline void halve16(const vf acc[][PARTS], float out[16]) {
    vf eights[8], fours[4], twos[2];
    for (int i = 0; i < 8; i++) eights[i] = FOLD(acc[2 * i][0], acc[2 * i + 1][0], LO1, HI1);
    for (int i = 0; i < 4; i++) fours[i] = FOLD(eights[2 * i], eights[2 * i + 1], LO2, HI2);
    for (int i = 0; i < 2; i++) twos[i] = FOLD(fours[2 * i], fours[2 * i + 1], LO3, HI3);
    vf sums = FOLD(twos[0], twos[1], LO4, HI4);
    memcpy(out, &sums, sizeof sums);
}
#endif

/* sums[t] = halve(acc[t]) for every t < count: sixteen at a time where a register has 16
 * lanes (halve16), then four at a time by the tree; the last one to three go through it
 * too, repeated to fill its four. The same bits whichever way a sum goes. */
static inline __attribute__((always_inline)) void halve_each(const int count,
                                                             const vf acc[][PARTS], float *sums) {
    int t = 0;
#if LANES == 16
    for (; t + 16 <= count; t += 16) halve16(acc + t, sums + t);
#endif
    for (; t + 4 <= count; t += 4) halve4(acc + t, sums + t);
    if (t < count) {
        vf last[4][PARTS];
        float four[4];
        for (int u = 0; u < 4; u++)
            for (int q = 0; q < PARTS; q++) last[u][q] = acc[t + u % (count - t)][q];
        halve4(last, four);
        for (int u = 0; u < count - t; u++) sums[t + u] = four[u];
    }
}

#endif
