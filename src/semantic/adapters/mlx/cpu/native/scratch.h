/*
 * Scratch memory that grows and is kept, one buffer per calling thread (the engine's, pass
 * after pass, and the helper's), freed when that thread exits. A caller holds it only
 * while it computes: nothing it calls may ask for scratch in the meantime.
 */
#ifndef SEMANTIC_SCRATCH_H
#define SEMANTIC_SCRATCH_H
#include <pthread.h>
#include <stdlib.h>

typedef struct {
    float *buffer;
    size_t held;
} scratch_t;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void free_scratch(void *held) {
    scratch_t *s = held;
    free(s->buffer);
    free(s);
}

static void make_scratch_key(void) { pthread_key_create(&scratch_key, free_scratch); }

/* `floats` floats, 64-byte aligned; NULL if the memory could not be had. */
static float *scratch(size_t floats) {
    pthread_once(&scratch_once, make_scratch_key);
    scratch_t *s = pthread_getspecific(scratch_key);
    if (s == NULL) {
        s = calloc(1, sizeof *s);
        if (s == NULL || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (floats > s->held) {
        free(s->buffer);
        s->buffer = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        s->held = s->buffer != NULL ? floats : 0;
    }
    return s->buffer;
}

#endif
