/*
 * shm/barrier.c — a cross-process barrier that lives inside the arena: atomics plus a futex,
 * spinning first, with a timeout so that a dead peer breaks the barrier instead of hanging it.
 *
 * Why not a pthread barrier: a process-shared pthread_barrier_t has no timeout, so one crashed
 * worker would hang the whole group, and it always sleeps in the kernel, which costs tens of
 * microseconds per round where a verification step has a few barriers and a budget of a few
 * milliseconds.
 *
 * How: each waiter reads `round`, then arrives with an atomic fetch-add on `arrived`. The round
 * cannot complete before that read, since it needs this waiter's arrival, so `round` read first is
 * the round being waited for (generation style: the same parties may come back at once for the
 * next round). The last arriver resets `arrived`, increments `round` (release) and FUTEX_WAKEs
 * everyone. The others spin on `round` for `spin` iterations, which is the fast path when all
 * parties are running (yielding now and then, for groups with more processes than cores), and then
 * FUTEX_WAIT on it until it changes or the timeout passes; the timeout counts from the end of the
 * spin. The futex
 * ops are the shared (non-PRIVATE) ones: the word is in a MAP_SHARED mapping that other processes
 * map at other addresses, and the kernel keys shared futexes by the backing page.
 *
 * Ordering: a party's writes before its arrival are released by its fetch-add, gathered by the
 * chain of fetch-adds up to the last arriver, and released again by its increment of `round`,
 * which every waiter acquires; so anything written before the barrier is visible after it.
 *
 * Timeout: the waiter that times out sets `broken` and then increments `round` too, so that
 * sleepers (whose futex word has now changed) wake and cannot miss it; a waiter that sees `round`
 * change looks at `broken` (written before the increment) to tell completion from breakage. Once
 * broken, every wait returns -1 at once until arena_barrier_init reconfigures the barrier.
 *
 * Waiting without a fixed timeout (arena_barrier_wait_while): a fixed timeout ties how long a
 * healthy party waits to how slow its slowest peer may be, and a party that breaks the barrier
 * because a peer is slow makes the group fail a step that would have finished. The workers
 * instead wait in slices and ask after each one whether to go on (their coordinator is still
 * there, they are not stopping); the coordinator, which sees who is dead, breaks the barrier
 * itself when a party dies.
 */
#include <limits.h>
#include <linux/futex.h>
#include <stdbool.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shm/arena.h"

/* Spinning yields the CPU this often (in spin iterations). When a group has more processes than
 * cores, a pure spinner holds the core that the last arriver needs until the scheduler preempts it
 * (measured: ~500 us per round for 3 processes on 2 cores, ~4 us with a yield every 32 spins);
 * when every party has its own core, sched_yield returns at once and costs almost nothing. */
#define BARRIER_YIELD_EVERY 32

static void barrier_futex_wait(uint32_t *word, uint32_t expected, const struct timespec *rel)
{
    /* EAGAIN (word already changed), EINTR and ETIMEDOUT all send the caller back to re-check */
    syscall(SYS_futex, word, FUTEX_WAIT, expected, rel, NULL, 0);
}

static void barrier_futex_wake_all(uint32_t *word)
{
    syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static inline void barrier_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static int64_t barrier_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Abandon the current round: mark broken, then change the futex word and wake every sleeper. */
static int barrier_break(arena_barrier *b)
{
    __atomic_store_n(&b->broken, 1, __ATOMIC_RELEASE);
    __atomic_fetch_add(&b->round, 1, __ATOMIC_RELEASE);
    barrier_futex_wake_all(&b->round);
    return -1;
}

void arena_barrier_break(arena_barrier *b)
{
    barrier_break(b);
}

/* `round` moved on: completed, unless it moved because the barrier broke. */
static int barrier_released(const arena_barrier *b)
{
    return __atomic_load_n(&b->broken, __ATOMIC_ACQUIRE) ? -1 : 0;
}

void arena_barrier_init(arena_barrier *b, uint32_t parties)
{
    /* `round` keeps counting: a late waker from before the re-init must still see it move */
    __atomic_store_n(&b->arrived, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&b->parties, parties, __ATOMIC_RELAXED);
    __atomic_store_n(&b->sleepers, 0, __ATOMIC_RELAXED); /* a sleeper killed mid-wait left its 1 */
    __atomic_store_n(&b->broken, 0, __ATOMIC_RELEASE);
}

/* The wait itself: spin, then sleep on the futex until the round moves, the timeout passes
 * (timeout_ms >= 0) or keep_waiting (if given, asked after every slice of slice_ms) says to give
 * up; the last two abandon the round. */
static int barrier_wait(arena_barrier *b, int timeout_ms, int spin, int slice_ms,
                        bool (*keep_waiting)(void *), void *arg)
{
    if (__atomic_load_n(&b->broken, __ATOMIC_ACQUIRE))
        return -1;
    uint32_t parties = __atomic_load_n(&b->parties, __ATOMIC_RELAXED);
    if (parties == 0)
        return -1;
    uint32_t round = __atomic_load_n(&b->round, __ATOMIC_ACQUIRE);
    uint32_t arrived = __atomic_add_fetch(&b->arrived, 1, __ATOMIC_ACQ_REL);
    if (arrived > parties)
        return barrier_break(b); /* more waiters than parties: the group is confused, stop it */
    if (arrived == parties) {
        /* nobody touches `arrived` again until they see the new round, which orders this reset */
        __atomic_store_n(&b->arrived, 0, __ATOMIC_RELAXED);
        /* the futex wake is a system call: only when someone sleeps (or is about to). Both sides
         * store then load in sequential consistency, so either this load sees the sleeper's
         * count or the sleeper's re-check sees the new round (and the futex wait refuses a
         * stale round anyway) */
        __atomic_fetch_add(&b->round, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&b->sleepers, __ATOMIC_SEQ_CST))
            barrier_futex_wake_all(&b->round);
        return 0;
    }

    for (int i = 0; i < spin; i++) {
        if (__atomic_load_n(&b->round, __ATOMIC_ACQUIRE) != round)
            return barrier_released(b);
        if ((i + 1) % BARRIER_YIELD_EVERY == 0)
            sched_yield();
        else
            barrier_cpu_relax();
    }

    const int64_t slice_ns = (int64_t)(slice_ms > 0 ? slice_ms : 100) * 1000000;
    const int64_t deadline = timeout_ms < 0 ? 0 : barrier_now_ns() + (int64_t)timeout_ms * 1000000;
    for (;;) {
        if (__atomic_load_n(&b->round, __ATOMIC_ACQUIRE) != round)
            return barrier_released(b);
        struct timespec rel, *relp = NULL;
        int64_t left = keep_waiting ? slice_ns : -1;
        if (timeout_ms >= 0) {
            int64_t to_deadline = deadline - barrier_now_ns();
            if (to_deadline <= 0)
                break;
            if (left < 0 || to_deadline < left)
                left = to_deadline;
        }
        if (left >= 0) {
            rel.tv_sec = (time_t)(left / 1000000000);
            rel.tv_nsec = (long)(left % 1000000000);
            relp = &rel;
        }
        __atomic_fetch_add(&b->sleepers, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&b->round, __ATOMIC_SEQ_CST) == round)
            barrier_futex_wait(&b->round, round, relp);
        __atomic_fetch_sub(&b->sleepers, 1, __ATOMIC_SEQ_CST);
        if (keep_waiting && __atomic_load_n(&b->round, __ATOMIC_ACQUIRE) == round &&
            !keep_waiting(arg))
            break;
    }
    /* last look: the round may have completed just as the time ran out */
    if (__atomic_load_n(&b->round, __ATOMIC_ACQUIRE) != round)
        return barrier_released(b);
    return barrier_break(b);
}

int arena_barrier_wait(arena_barrier *b, int timeout_ms, int spin)
{
    return barrier_wait(b, timeout_ms, spin, 0, NULL, NULL);
}

int arena_barrier_wait_while(arena_barrier *b, int spin, int slice_ms, bool (*keep_waiting)(void *),
                             void *arg)
{
    return barrier_wait(b, -1, spin, slice_ms, keep_waiting, arg);
}
