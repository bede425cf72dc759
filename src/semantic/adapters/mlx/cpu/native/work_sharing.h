/*
 * One helper thread beside the thread that calls our kernels, sharing a product's columns
 * (or any range of units) by work stealing: `share` offers the work, and both threads
 * claim runs of chunks until none are left. If the helper is slow to wake (or its core is
 * busy with another thread) the caller simply claims more; it only ever waits for a claim
 * the helper is in the middle of (a quarter of what was left when it claimed, at most). A
 * column is computed the same way by either thread, so the split never changes a result.
 * Included by small_sgemm.c, which exports `share` to our other kernels as
 * semantic_parallel_for (helper.h finds it): a process never runs more than one extra
 * compute thread of ours. See docs/adr/0010-small-batch-matmul-kernel.md.
 */
#ifndef SEMANTIC_WORK_SHARING_H
#define SEMANTIC_WORK_SHARING_H
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* A spin-wait hint: x86's pause, arm64's yield, nothing elsewhere (the loop still works). */
#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

/* How long a helper spins for the next offer before it sleeps in the kernel. */
enum { SPIN_NS = 200000 };

typedef void (*work_fn)(const void *context, int from, int to);

typedef struct {
    work_fn work;
    const void *context;
    int total, chunk;     /* units, and the fewest a claim takes */
    atomic_int next;      /* the first unclaimed unit */
    atomic_int let_go;    /* set by the helper after its last access to this job */
} job_t;

static struct {
    _Atomic(job_t *) offered;
    atomic_int posted;
    atomic_flag busy;
    pthread_once_t once;
    int running;
} helper = {.busy = ATOMIC_FLAG_INIT, .once = PTHREAD_ONCE_INIT};

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Each claim takes a quarter of the units left (whole chunks, one at least): long runs
 * while much is left, so that each thread reads its part of a matrix as one stream, and
 * single chunks at the end, so that neither waits long for the other. Claims of one
 * chunk throughout interleaved the threads' reads (a 49,152-row head at half the rate);
 * sixteen 4-bit or float32 decode rows 0.96-0.98x the time with these (AVX-512; AVX2 and
 * one row even; in one process, alternated). */
static void claim_chunks(job_t *job) {
    for (int from = atomic_load(&job->next); from < job->total;) {
        int size = (job->total - from) / 4 / job->chunk * job->chunk;
        int to = from + (size > job->chunk ? size : job->chunk);
        to = to < job->total ? to : job->total;
        if (atomic_compare_exchange_weak(&job->next, &from, to)) { /* else `from` reloaded */
            job->work(job->context, from, to);
            from = atomic_load(&job->next);
        }
    }
}

/* Spin a little (products come back to back within a step), then sleep in the kernel. */
static void await_post(int seen) {
    long long deadline = now_ns() + SPIN_NS;
    for (int spins = 0; atomic_load_explicit(&helper.posted, memory_order_acquire) == seen;) {
        if (++spins % 256 != 0) {
            CPU_RELAX();
        } else if (now_ns() > deadline) {
            syscall(SYS_futex, &helper.posted, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
        }
    }
}

static void *helper_main(void *unused) {
    (void)unused;
    for (int seen = 0;;) {
        await_post(seen);
        seen = atomic_load_explicit(&helper.posted, memory_order_acquire);
        job_t *job = atomic_exchange(&helper.offered, NULL);
        if (job == NULL) continue; /* the caller finished it alone */
        claim_chunks(job);
        atomic_store_explicit(&job->let_go, 1, memory_order_release);
    }
    return NULL;
}

/* A forked child has no helper thread: it computes alone. */
static void forget_helper(void) { helper.running = 0; }

/* The CPU the helper is kept on (-1: anywhere). Python puts it beside OpenBLAS's worker
 * thread: both only ever help the one thread that calls sgemm, never at the same time, and
 * on two cores three busy threads left the caller with half a core whenever the scheduler
 * gave OpenBLAS's spinning worker a core of its own (a 26-token pass at 4,178 positions
 * took 145 or 225 ms, depending on that placement). */
static atomic_int helper_cpu = -1;
static pthread_t helper_thread;

static void apply_helper_cpu(void) {
    int cpu = atomic_load(&helper_cpu);
    if (cpu < 0 || !helper.running) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(helper_thread, sizeof set, &set);
}

/* A helper on the caller's only CPU would take turns with it, spinning in its turns: one
 * stream's decode ran 9.3-9.7 tokens/s with it and 11.7-12.1 without (SmolLM2 float32,
 * `taskset -c 0` on a 2-core Zen 3). */
static int second_cpu_allowed(void) {
    cpu_set_t set;
    return sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) >= 2;
}

static void start_helper(void) {
    if (!second_cpu_allowed()) return;
    helper.running = pthread_create(&helper_thread, NULL, helper_main, NULL) == 0;
    if (helper.running) {
        pthread_setname_np(helper_thread, "sgemm-helper"); /* as top and /proc show it */
        pthread_detach(helper_thread);
        pthread_atfork(NULL, NULL, forget_helper);
        apply_helper_cpu();
    }
}

/* Python calls this once it knows where OpenBLAS's worker runs; the helper still starts
 * on first use (and moves there now if it already runs). */
void semantic_set_helper_cpu(int cpu) {
    atomic_store(&helper_cpu, cpu);
    apply_helper_cpu();
}

/* Whether callers may use the helper: off while two threads of work run side by side
 * (a decode step beside a prompt's slice), each then on a core of its own. */
static atomic_int helper_enabled = 1;

void semantic_set_helper_enabled(int enabled) { atomic_store(&helper_enabled, enabled); }

/* Units [0, total) in chunks on the calling thread and the helper, if the helper is free
 * (MLX may call from more than one stream thread); otherwise on the calling thread alone. */
static void share(work_fn work, const void *context, int total, int chunk) {
    pthread_once(&helper.once, start_helper);
    if (!atomic_load_explicit(&helper_enabled, memory_order_relaxed) || !helper.running ||
        atomic_flag_test_and_set(&helper.busy)) {
        work(context, 0, total);
        return;
    }
    job_t job = {.work = work, .context = context, .total = total, .chunk = chunk};
    atomic_init(&job.next, 0);
    atomic_init(&job.let_go, 0);
    atomic_store_explicit(&helper.offered, &job, memory_order_release);
    atomic_fetch_add_explicit(&helper.posted, 1, memory_order_release);
    syscall(SYS_futex, &helper.posted, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    claim_chunks(&job);
    job_t *still_offered = &job;
    if (!atomic_compare_exchange_strong(&helper.offered, &still_offered, NULL)) {
        /* the helper took the job: wait until it has finished its last chunk */
        for (int spins = 0; !atomic_load_explicit(&job.let_go, memory_order_acquire);)
            if (++spins % 1024 == 0) sched_yield(); else CPU_RELAX();
    }
    atomic_flag_clear(&helper.busy);
}

#endif
