/*
 * The matmul kernel's helper thread (small_sgemm.c exports semantic_parallel_for; that
 * library is loaded globally before MLX), for our other kernels: the process never has
 * more than one extra compute thread of ours. NULL when it is not loaded: then everything
 * runs on the calling thread.
 */
#ifndef SEMANTIC_HELPER_H
#define SEMANTIC_HELPER_H
#include <dlfcn.h>

typedef void (*work_fn)(const void *context, int from, int to);
typedef void (*parallel_fn)(work_fn work, const void *context, int total, int chunk);

static parallel_fn shared_helper(void) {
    static parallel_fn found;
    static int looked;
    if (!looked) {
        found = (parallel_fn)dlsym(RTLD_DEFAULT, "semantic_parallel_for");
        looked = 1;
    }
    return found;
}

#endif
