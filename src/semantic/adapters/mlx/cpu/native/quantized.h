/*
 * MLX's group-wise affine 4- and 8-bit weights and bfloat16 weights, as our kernels read
 * them: the words unpacked into vector lanes and dequantized with mx.dequantize's
 * roundings, or bfloat16 widened (exactly: its bits are a float32's upper half). See
 * docs/adr/0031-quantized-weights-on-the-host.md.
 *
 * 4-bit weights are read in pair order, not MLX's: in every 32 inputs of a row, byte j
 * holds input j in its low nibble and input j + 16 in its high one (the layout of a
 * GGUF's Q4 blocks; host_weights.py rearranges MLX's words so at load). Sixteen bytes
 * widened a byte a lane are then two vectors of weights in input order, each byte read
 * once, where MLX's order (inputs 2j and 2j + 1 in byte j) needs a shuffle per vector.
 */
#ifndef SEMANTIC_QUANTIZED_H
#define SEMANTIC_QUANTIZED_H
#include <string.h>

#include "simd.h"

enum { WEIGHT_FLOAT32 = 0, WEIGHT_Q8 = 8, WEIGHT_Q4 = 4, WEIGHT_BF16 = 16 };

/* How a quantized matrix keeps its scales and biases: as the model file has them (a
 * GGUF's are float16, a bfloat16 model's bfloat16), each widened to float32 exactly as it
 * is read, so no float32 copy of them is held (a sixth of a 4-bit matrix's bytes). */
enum { GROUPS_FLOAT32 = 0, GROUPS_FLOAT16 = 1, GROUPS_BFLOAT16 = 2 };

typedef struct {
    const void *data; /* float [out][in]; uint16 bfloat16 [out][in]; or, quantized, uint32
                         words [out][in * bits / 32] */
    const void *scales, *biases; /* [out][in / group], quantized formats only, of `group_type` */
    int kind, group; /* a WEIGHT_ value (bits a weight, float32 aside); inputs per scale (a
                        multiple of 16), quantized formats only */
    int group_type; /* a GROUPS_ value: the scales' and biases' type */
} weight_t;

/* A float16's value as a float32 (exact: every float16 is one), from its bits: what the
 * instruction computes where there is one (tests/native holds the two equal). */
static inline float float16_bits_value(unsigned short half) {
    unsigned int sign = (unsigned int)(half & 0x8000u) << 16, exponent = (half >> 10) & 0x1fu;
    unsigned int mantissa = half & 0x3ffu, bits;
    if (exponent == 0x1fu) {
        bits = sign | 0x7f800000u | mantissa << 13; /* infinity or NaN */
    } else if (exponent != 0) {
        bits = sign | (exponent + 112) << 23 | mantissa << 13;
    } else { /* zero or subnormal: mantissa x 2^-24, a power of two times an int */
        float magnitude = (float)mantissa * 0x1p-24f;
        memcpy(&bits, &magnitude, sizeof bits);
        bits |= sign;
    }
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

#if defined(__F16C__)
#include <immintrin.h>
static inline float float16_value(unsigned short half) { return _cvtsh_ss(half); }
#elif defined(__aarch64__)
static inline float float16_value(unsigned short half) {
    __fp16 value;
    memcpy(&value, &half, sizeof value);
    return (float)value;
}
#else
static inline float float16_value(unsigned short half) { return float16_bits_value(half); }
#endif

/* Groups a row's scales and biases are widened for at a time (on the stack). */
enum { GROUP_BLOCK = 64 };

/* `count` entries of 16-bit scales or biases from `at`, widened into `out`: float16 by the
 * vector conversion where there is one (per entry, it cost 1.3x the time of sixteen 4-bit
 * rows' products), bfloat16 by a shift. */
static inline void widen_groups(const void *values, int type, long at, int count, float *out) {
    const unsigned short *halves = (const unsigned short *)values + at;
    int i = 0;
#if defined(__AVX512F__) && defined(__F16C__)
    for (; type == GROUPS_FLOAT16 && i + 16 <= count; i += 16)
        _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(halves + i))));
#elif defined(__F16C__)
    for (; type == GROUPS_FLOAT16 && i + 8 <= count; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(halves + i))));
#endif
    for (; i < count; i++) {
        unsigned int bits = (unsigned int)halves[i] << 16; /* bfloat16: a float32's upper half */
        float value;
        memcpy(&value, &bits, sizeof value);
        out[i] = type == GROUPS_FLOAT16 ? float16_value(halves[i]) : value;
    }
}

/* A row's scales and biases for groups [first, first + count) as float32 in `room` (2 x
 * GROUP_BLOCK floats: the scales, then the biases), whatever type the file keeps them in:
 * read from fixed places on the stack, they take no registers for pointers (a 4-bit row's
 * product 0.81-0.90x the time of reading them through a pointer a row, one thread, ADR
 * 0031). Quantized formats only. */
static inline void groups_into(const weight_t *w, long row, int groups, int first, int count,
                               float *room) {
    long at = row * groups + first;
    if (w->group_type == GROUPS_FLOAT32) {
        memcpy(room, (const float *)w->scales + at, count * sizeof(float));
        memcpy(room + GROUP_BLOCK, (const float *)w->biases + at, count * sizeof(float));
        return;
    }
    widen_groups(w->scales, w->group_type, at, count, room);
    widen_groups(w->biases, w->group_type, at, count, room + GROUP_BLOCK);
}

/* Bytes an entry of scales or biases takes. */
static inline long group_value_bytes(int type) { return type == GROUPS_FLOAT32 ? 4 : 2; }

/* LANES bytes from `row + at`, one a lane (8-bit weights; 4-bit ones' bytes in pair
 * order), and bfloat16 halves widened. x86 widens bytes to ints in one instruction (gcc 12
 * makes sixteen scalar moves of the same widening spelled as __builtin_convertvector or as
 * a byte shuffle), so there, and only there, the intrinsics; with four lanes a register is
 * one word. */
#if LANES == 16 && defined(__AVX512F__)
#include <immintrin.h>
static inline vi byte_lanes(const unsigned char *row, int at) {
    return (vi)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(row + at)));
}
static inline vi bfloat16_lanes(const unsigned char *row, int at) {
    __m256i halves = _mm256_loadu_si256((const __m256i *)(row + 2 * (long)at));
    return (vi)_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16);
}
#elif LANES == 8 && defined(__AVX2__)
#include <immintrin.h>
static inline vi byte_lanes(const unsigned char *row, int at) {
    return (vi)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + at)));
}
static inline vi bfloat16_lanes(const unsigned char *row, int at) {
    __m128i halves = _mm_loadu_si128((const __m128i *)(row + 2 * (long)at));
    return (vi)_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16);
}
#elif LANES == 4
typedef unsigned int vwords __attribute__((vector_size(4 * LANES)));

static inline vi byte_lanes(const unsigned char *row, int at) {
    unsigned int word;
    memcpy(&word, row + at, sizeof word);
    return (vi)((vwords)splat_int((int)word) >> (vwords){0, 8, 16, 24}) & splat_int(255);
}
typedef unsigned short vhalves __attribute__((vector_size(2 * LANES)));

static inline vi bfloat16_lanes(const unsigned char *row, int at) {
    vhalves halves;
    memcpy(&halves, row + 2 * (long)at, sizeof halves);
    return (vi)(__builtin_convertvector(halves, vwords) << 16);
}
#else
#error "a vector width simd.h does not make"
#endif

/* q * scale rounded, then + bias rounded, as mx.dequantize computes them: the empty asm
 * hides the product from the compiler, which would otherwise fuse the two into one
 * rounding (gcc contracts across statements). */
#if defined(__x86_64__) || defined(__i386__)
#define ROUNDED(v) __asm__("" : "+v"(v))
#elif defined(__aarch64__)
#define ROUNDED(v) __asm__("" : "+w"(v))
#else
#error "name the vector register constraint of this architecture"
#endif
static inline vf dequantized(vf q, vf scale, vf bias) {
    vf scaled = q * scale;
    ROUNDED(scaled);
    return scaled + bias;
}

/* One group's scale and bias, and with gcc on 16 lanes its sixteen 4-bit values already
 * dequantized: a lookup (one permute) instead of the arithmetic, the same bits. */
typedef struct {
    vf scale, bias, table;
} group_decoder_t;

#if LANES == 16 && defined(__GNUC__) && !defined(__clang__)
#define TABLE_LOOKUP 1
#else
#define TABLE_LOOKUP 0
#endif

static inline group_decoder_t group_decoder(float scale, float bias) {
    group_decoder_t d = {splat(scale), splat(bias), splat(0.0f)};
#if TABLE_LOOKUP
    static const float levels[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    d.table = dequantized(load(levels), d.scale, d.bias);
#endif
    return d;
}

/* Part `q` of the 16 bytes of a 4-bit row (pair order) that hold inputs [at, at + 32),
 * `at` a multiple of 32, a byte a lane: inputs at + q LANES + i in their low nibbles,
 * at + 16 + q LANES + i in their high ones. */
static inline vi paired_bytes(const unsigned char *row, int at, int q) {
    return byte_lanes(row, (at >> 1) + q * LANES);
}

/* Those bytes' low (`high` 0) or high nibbles, dequantized. */
static inline vf paired_weights(vi bytes, int high, const group_decoder_t *d) {
#if TABLE_LOOKUP
    /* the shuffle reads an index's low four bits: no mask */
    return __builtin_shuffle(d->table, high ? bytes >> 4 : bytes);
#else
    vi nibbles = high ? bytes >> 4 : bytes & splat_int(15); /* bytes are 0-255 */
    return dequantized(__builtin_convertvector(nibbles, vf), d->scale, d->bias);
#endif
}

/* The dequantized weights at inputs [at, at + LANES) of an 8-bit or bfloat16 row (`d`
 * unused for bfloat16); 4-bit rows go 32 inputs at a time (`paired_bytes`). */
static inline vf weights_at(const unsigned char *row, int kind, int at, const group_decoder_t *d) {
    if (kind == WEIGHT_BF16) return (vf)bfloat16_lanes(row, at);
    return dequantized(__builtin_convertvector(byte_lanes(row, at), vf), d->scale, d->bias);
}

/* Group `g` of a block `groups_into` filled; none for bfloat16 weights. */
static inline group_decoder_t decoder_at(const float *room, int kind, int g) {
    if (kind == WEIGHT_BF16) return (group_decoder_t){splat(0.0f), splat(0.0f), splat(0.0f)};
    return group_decoder(room[g], room[GROUP_BLOCK + g]);
}

/* Inputs a group: bfloat16 rows are one group. */
static inline int group_inputs(const weight_t *w, int kind, int n) {
    return kind == WEIGHT_BF16 ? n : w->group;
}

/* One row of `n` inputs (a multiple of 16; of 32 for 4-bit) dequantized, in input order. */
static void dequantize_row(const weight_t *w, long row, int n, float *out) {
    int group = group_inputs(w, w->kind, n), groups = n / group;
    const unsigned char *packed = (const unsigned char *)w->data + row * (long)n * w->kind / 8;
    float room[2 * GROUP_BLOCK];
    for (int first = 0; first < groups; first += GROUP_BLOCK) {
        int count = groups - first < GROUP_BLOCK ? groups - first : GROUP_BLOCK;
        if (w->kind != WEIGHT_BF16) groups_into(w, row, groups, first, count, room);
        for (int g = first; g < first + count; g++) {
            group_decoder_t d = decoder_at(room, w->kind, g - first);
            if (w->kind == WEIGHT_Q4) { /* each byte read once for its two inputs */
                for (int at = g * group; at < (g + 1) * group; at += 32)
                    for (int q = 0; q < PARTS; q++) {
                        vi bytes = paired_bytes(packed, at, q);
                        store(out + at + q * LANES, paired_weights(bytes, 0, &d));
                        store(out + at + 16 + q * LANES, paired_weights(bytes, 1, &d));
                    }
                continue;
            }
            for (int at = g * group; at < (g + 1) * group; at += LANES)
                store(out + at, weights_at(packed, w->kind, at, &d));
        }
    }
}

#endif
