/*
 * kernels/cpu/pool.c — a small persistent pthread pool for data-parallel kernels.
 *
 * A decode step dispatches a few hundred short jobs (one per matmul / attention op), so a job
 * launch must cost far less than a microsecond-scale kernel: workers spin on a generation counter
 * for a while after each job and only then sleep on a condition variable. The caller takes part.
 *
 * Work is cut into chunks (contiguous ranges, fixed by n, grain and the thread count, so results
 * never depend on scheduling). Each thread owns a contiguous run of them and claims its own in
 * order, so what it reads is one stream (a matmul's rows are consecutive in memory: interleaving
 * two threads' chunks of one run cost a decode step 3-9% here); a thread that runs out takes
 * the others' unclaimed chunks. Claiming rather than
 * a static split matters on a shared machine: when a worker is descheduled, the caller (or
 * another worker) takes its chunks instead of the whole step waiting a time slice for it.
 *
 * Each run's claim counter packs (job generation << 32 | next chunk) and is advanced by
 * compare-and-swap, so a worker that wakes late can never claim a chunk of a newer job with an
 * older job's descriptor; descriptors alternate between two slots by generation parity for the
 * same reason.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kernels.h"

#define POOL_SPIN_ITERS 100000 /* default; OROCHI_POOL_SPIN overrides (0: sleep at once) */
#define POOL_CHUNKS_PER_THREAD 4
#define POOL_MAX_THREADS 64

typedef struct {
    kpool_fn fn;
    void *arg;
    int64_t n, chunks;
} pool_job;

struct kpool {
    int n_threads;
    long spin; /* iterations a worker spins for the next job before it sleeps */
    int chunks_per_thread;
    pthread_t *threads;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_uint generation;     /* bumped once per job */
    struct {
        _Alignas(64) atomic_uint_fast64_t next; /* generation << 32 | next chunk of this run */
    } claim[POOL_MAX_THREADS];
    atomic_long done;           /* chunks finished in the current job */
    atomic_int sleepers;
    atomic_bool stop;
    pool_job jobs[2]; /* by generation parity */
};

typedef struct {
    kpool *pool;
    int index;
} pool_worker_arg;

/* Thread t's run of chunks: [chunks * t / T, chunks * (t + 1) / T). */
static int64_t pool_run_end(const kpool *p, const pool_job *job, int t)
{
    return job->chunks * (t + 1) / p->n_threads;
}

/* Claim and run chunks of generation gen until none is left: this thread's own run first, then
 * the others' leftovers. */
static void pool_work(kpool *p, unsigned gen, int thread)
{
    const pool_job *job = &p->jobs[gen & 1];
    for (int k = 0; k < p->n_threads; k++) {
        int owner = (thread + k) % p->n_threads;
        atomic_uint_fast64_t *next = &p->claim[owner].next;
        int64_t end = pool_run_end(p, job, owner);
        for (;;) {
            uint64_t cur = atomic_load_explicit(next, memory_order_acquire);
            if ((unsigned)(cur >> 32) != gen)
                return;
            int64_t c = (int64_t)(cur & 0xffffffffu);
            if (c >= end)
                break;
            if (!atomic_compare_exchange_weak_explicit(next, &cur, cur + 1, memory_order_acq_rel,
                                                       memory_order_acquire))
                continue;
            int64_t b = job->n * c / job->chunks, e = job->n * (c + 1) / job->chunks;
            if (e > b)
                job->fn(job->arg, b, e, thread);
            atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel);
        }
    }
}

static void *pool_worker(void *argp)
{
    pool_worker_arg a = *(pool_worker_arg *)argp;
    free(argp);
    kpool *p = a.pool;
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop)) {
            if (++spins < p->spin)
                continue;
            pthread_mutex_lock(&p->lock);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->lock);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->lock);
            spins = 0;
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = gen;
        pool_work(p, gen, a.index);
    }
}

kpool *kpool_new(int n_threads)
{
    if (n_threads < 1)
        n_threads = 1;
    if (n_threads > POOL_MAX_THREADS)
        n_threads = POOL_MAX_THREADS;
    kpool *p = NULL;
    if (posix_memalign((void **)&p, 64, sizeof *p)) /* the claim counters' cache lines */
        return NULL;
    memset(p, 0, sizeof *p);
    p->n_threads = n_threads;
    const char *spin = getenv("OROCHI_POOL_SPIN");
    p->spin = spin && *spin ? atol(spin) : POOL_SPIN_ITERS;
    const char *ch = getenv("OROCHI_POOL_CHUNKS");
    p->chunks_per_thread = ch && atoi(ch) > 0 ? atoi(ch) : POOL_CHUNKS_PER_THREAD;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        pool_worker_arg *a = malloc(sizeof *a);
        if (!a ||
            (a->pool = p, a->index = i, pthread_create(&p->threads[i], NULL, pool_worker, a))) {
            free(a);
            p->n_threads = i; /* keep the threads we have */
            break;
        }
    }
    return p;
}

void kpool_destroy(kpool **pool)
{
    kpool *p = *pool;
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 1; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    free(p->threads);
    free(p);
    *pool = NULL;
}

int kpool_threads(const kpool *pool)
{
    return pool ? pool->n_threads : 1;
}

void kpool_run(kpool *p, int64_t n, int64_t grain, kpool_fn fn, void *arg)
{
    if (n <= 0)
        return;
    if (!p || p->n_threads == 1 || (grain > 0 && n <= grain)) {
        fn(arg, 0, n, 0);
        return;
    }
    int64_t chunks = (int64_t)p->n_threads * p->chunks_per_thread;
    if (grain > 0 && (n + grain - 1) / grain < chunks)
        chunks = (n + grain - 1) / grain;
    if (chunks > n)
        chunks = n;
    unsigned gen = atomic_load(&p->generation) + 1;
    p->jobs[gen & 1] = (pool_job){fn, arg, n, chunks};
    atomic_store(&p->done, 0);
    for (int t = 0; t < p->n_threads; t++)
        atomic_store(&p->claim[t].next,
                     (uint64_t)gen << 32 | (uint64_t)(chunks * t / p->n_threads));
    atomic_store(&p->generation, gen); /* seq_cst: ordered before the sleepers check */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
    }
    pool_work(p, gen, 0);
    int spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < chunks)
        if (++spins > 1000) {
            sched_yield();
            spins = 0;
        }
}
