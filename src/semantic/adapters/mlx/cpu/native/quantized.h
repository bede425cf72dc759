/*
 * MLX's group-wise affine 4- and 8-bit weights, as our kernels read them: the words
 * unpacked into vector lanes and dequantized with mx.dequantize's roundings. See
 * docs/adr/0031-quantized-weights-on-the-host.md.
 */
#ifndef SEMANTIC_QUANTIZED_H
#define SEMANTIC_QUANTIZED_H
#include <string.h>

#include "simd.h"

enum { WEIGHT_FLOAT32 = 0, WEIGHT_Q8 = 8, WEIGHT_Q4 = 4 };

typedef struct {
    const void *data;             /* float [out][in], or uint32 words [out][in * bits / 32] */
    const float *scales, *biases; /* [out][in / group], quantized formats only */
    int kind, group;              /* a WEIGHT_ value; inputs per scale (a multiple of 16) */
} weight_t;

typedef unsigned int vwords __attribute__((vector_size(4 * LANES)));

static inline vi constant_ints(const int values[LANES]) {
    vi v;
    memcpy(&v, values, sizeof v);
    return v;
}

/* Lane i of a register of the words at `row`, word `word[i]`, shifted down `shift[i]` bits,
 * masked to `mask`. The words are broadcast and blended, never shuffled as bytes: gcc made
 * sixteen scalar moves of a byte shuffle or of a widening of bytes. */
static inline vi unpacked(const unsigned char *row, const int word[LANES], const int shift[LANES],
                          int mask) {
    unsigned int words[4];
    memcpy(words, row, sizeof words[0] * (size_t)(word[LANES - 1] + 1));
    vi taken = splat_int(0);
    for (int w = 0; w <= word[LANES - 1]; w++) {
        vi here = constant_ints(word) == splat_int(w);
        taken |= splat_int((int)words[w]) & here;
    }
    return (vi)((vwords)taken >> (vwords)constant_ints(shift)) & splat_int(mask);
}

/* x86 widens bytes to ints in one instruction; gcc 12 makes sixteen scalar moves of the
 * same widening spelled as __builtin_convertvector, so here (only) the intrinsics. 4-bit
 * values: each byte's two halves side by side (low half first), then widened; the high
 * bits left in a lane are masked off by the caller. */
#if LANES == 16 && defined(__AVX512F__)
#include <immintrin.h>
#define WIDEN_BYTES 1
static inline vi widened_bytes(const unsigned char *at) {
    return (vi)_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)at));
}
static inline vi widened_nibbles(const unsigned char *at) {
    __m128i bytes = _mm_loadl_epi64((const __m128i *)at);
    return (vi)_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, _mm_srli_epi16(bytes, 4)));
}
#elif LANES == 8 && defined(__AVX2__)
#include <immintrin.h>
#define WIDEN_BYTES 1
static inline vi widened_bytes(const unsigned char *at) {
    return (vi)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)at));
}
static inline vi widened_nibbles(const unsigned char *at) {
    int four;
    memcpy(&four, at, sizeof four);
    __m128i bytes = _mm_cvtsi32_si128(four);
    return (vi)_mm256_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, _mm_srli_epi16(bytes, 4)));
}
#else
#define WIDEN_BYTES 0
#endif

/* The quantized values at inputs [at, at + LANES) of a row (a multiple of LANES): four
 * 8-bit or eight 4-bit values to a word, low bits first. */
static inline vi quantized_ints(const unsigned char *row, int kind, int at) {
#if LANES == 16
    static const int q8_word[16] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
    static const int q4_word[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    static const int q8_shift[16] = {0, 8, 16, 24, 0, 8, 16, 24, 0, 8, 16, 24, 0, 8, 16, 24};
    static const int q4_shift[16] = {0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28};
#elif LANES == 8
    static const int q8_word[8] = {0, 0, 0, 0, 1, 1, 1, 1}, q4_word[8] = {0};
    static const int q8_shift[8] = {0, 8, 16, 24, 0, 8, 16, 24};
    static const int q4_shift[8] = {0, 4, 8, 12, 16, 20, 24, 28};
#else
    static const int q8_word[4] = {0}, q4_word[4] = {0};
    static const int q8_shift[4] = {0, 8, 16, 24};
    static const int q4_shift[4] = {0, 4, 8, 12}; /* plus 16 in a word's second half */
#endif
    vi q;
    if (kind == WEIGHT_Q8) {
#if WIDEN_BYTES
        return widened_bytes(row + at);
#endif
        q = unpacked(row + at, q8_word, q8_shift, 255);
    } else {
#if WIDEN_BYTES
        return widened_nibbles(row + at / 2) & splat_int(15);
#endif
#if LANES == 4
        int half = at % 8 * 4; /* a register is half a word here */
        q = unpacked(row + at / 8 * 4, q4_word, q4_shift, 15 << half);
        q = (vi)((vwords)q >> (vwords)splat_int(half));
#else
        q = unpacked(row + at / 2, q4_word, q4_shift, 15);
#endif
    }
    return q;
}

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

/* The dequantized weights at inputs [at, at + LANES) of a row. */
static inline vf weights_at(const unsigned char *row, int kind, int at, const group_decoder_t *d) {
#if TABLE_LOOKUP
    if (kind == WEIGHT_Q4) return __builtin_shuffle(d->table, quantized_ints(row, kind, at));
#endif
    return dequantized(__builtin_convertvector(quantized_ints(row, kind, at), vf), d->scale,
                       d->bias);
}

/* One row of `n` inputs dequantized. */
static void dequantize_row(const weight_t *w, long row, int n, float *out) {
    int groups = n / w->group;
    const unsigned char *packed = (const unsigned char *)w->data + row * (long)n * w->kind / 8;
    const float *scales = w->scales + row * groups, *biases = w->biases + row * groups;
    for (int g = 0; g < groups; g++) {
        group_decoder_t d = group_decoder(scales[g], biases[g]);
        for (int at = g * w->group; at < (g + 1) * w->group; at += LANES)
            store(out + at, weights_at(packed, w->kind, at, &d));
    }
}

#endif
