/*
 * kernels/cpu/pool.c — a small persistent pthread pool for data-parallel kernels.
 *
 * A decode step dispatches a few hundred short jobs (one per matmul / attention op), so a job
 * launch must cost far less than a microsecond-scale kernel: workers spin on a generation counter
 * for a while after each job and only then sleep on a condition variable. The caller takes part as
 * thread 0. Work is split statically into one contiguous chunk per thread, so a given n and thread
 * count always produce the same chunks.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels/cpu/kernels.h"

#define POOL_SPIN_ITERS 200000

struct kpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_uint generation; /* bumped once per job */
    atomic_int pending;     /* workers still running the current job */
    atomic_int sleepers;
    atomic_bool stop;
    /* the current job */
    kpool_fn fn;
    void *arg;
    int64_t n, grain;
};

typedef struct {
    kpool *pool;
    int index;
} pool_worker_arg;

static void pool_chunk(const kpool *p, int thread, int64_t *begin, int64_t *end)
{
    int64_t chunks = p->n_threads;
    if (p->grain > 0 && (p->n + p->grain - 1) / p->grain < chunks)
        chunks = (p->n + p->grain - 1) / p->grain;
    if (thread >= chunks) {
        *begin = *end = 0;
        return;
    }
    *begin = p->n * thread / chunks;
    *end = p->n * (thread + 1) / chunks;
}

static void pool_do_chunk(kpool *p, int thread)
{
    int64_t b, e;
    pool_chunk(p, thread, &b, &e);
    if (e > b)
        p->fn(p->arg, b, e, thread);
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
            if (++spins < POOL_SPIN_ITERS)
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
        pool_do_chunk(p, a.index);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    }
}

kpool *kpool_new(int n_threads)
{
    if (n_threads < 1)
        n_threads = 1;
    kpool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        pool_worker_arg *a = malloc(sizeof *a);
        if (!a || (a->pool = p, a->index = i, pthread_create(&p->threads[i], NULL, pool_worker, a))) {
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
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->grain = grain;
    atomic_store(&p->pending, p->n_threads - 1);
    atomic_fetch_add(&p->generation, 1); /* seq_cst: ordered before the sleepers check */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
    }
    pool_do_chunk(p, 0);
    int spins = 0;
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0)
        if (++spins > 1000) {
            sched_yield();
            spins = 0;
        }
}
