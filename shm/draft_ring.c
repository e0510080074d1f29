/*
 * shm/draft_ring.c — a speculator's ring of drafts in the arena, one seqlock per slot.
 *
 * Why a seqlock: the speculator publishes drafts continuously and the coordinator picks up the
 * newest one when a step begins. Neither may wait for the other (a speculator that stalls must
 * not stall verification, and the reverse), and the reader needs a whole draft, never half of an
 * old one and half of a new one. A seqlock gives the writer a wait-free publish and the reader a
 * copy that is either consistent or reported as torn, so it can retry or take another slot.
 *
 * How: each slot has a sequence number, 0 while never written, odd while being written. The
 * writer makes it odd, issues a release fence, copies the payload, then stores the next even
 * value (release) and only then advances `head`, so (head - 1) % n_slots is always a finished
 * draft. The reader loads seq (acquire), copies the payload, issues an acquire fence and loads seq
 * again: equal and even means no write overlapped the copy (if the copy saw any byte of a newer
 * write, the fences make that write's odd seq visible to the second load).
 *
 * The payload is copied field by field with relaxed atomic loads and stores rather than memcpy:
 * reads that race with a write are the normal case here, and relaxed atomics make that race
 * defined C11 while compiling to the same plain moves. Only the first n tokens and
 * confidences are copied, since drafts are usually much shorter than ARENA_DRAFT_MAX.
 *
 * One writer per ring (its speculator); any number of readers.
 */
#include <stddef.h>
#include <string.h>

#include "shm/arena.h"

/* Copy header fields and the first n tokens/confidences/parents; either side may be shared memory.
 */
static void ring_copy_payload(arena_draft *dst, const arena_draft *src, uint32_t n)
{
    __atomic_store_n(&dst->request_id, __atomic_load_n(&src->request_id, __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
    __atomic_store_n(&dst->ctx_len, __atomic_load_n(&src->ctx_len, __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
    __atomic_store_n(&dst->last_token, __atomic_load_n(&src->last_token, __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
    for (uint32_t i = 0; i < n; i++) {
        __atomic_store_n(&dst->tokens[i], __atomic_load_n(&src->tokens[i], __ATOMIC_RELAXED),
                         __ATOMIC_RELAXED);
        __atomic_store_n(&dst->parent[i], __atomic_load_n(&src->parent[i], __ATOMIC_RELAXED),
                         __ATOMIC_RELAXED);
        float c;
        __atomic_load(&src->conf[i], &c, __ATOMIC_RELAXED);
        __atomic_store(&dst->conf[i], &c, __ATOMIC_RELAXED);
    }
}

size_t arena_draft_ring_bytes(uint32_t n_slots)
{
    return offsetof(arena_draft_ring, slots) + (size_t)n_slots * sizeof(arena_draft);
}

void arena_draft_ring_init(arena_draft_ring *r, uint32_t n_slots)
{
    memset(r->slots, 0, (size_t)n_slots * sizeof(arena_draft));
    __atomic_store_n(&r->head, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&r->n_slots, n_slots, __ATOMIC_RELEASE);
}

uint32_t arena_draft_ring_put(arena_draft_ring *r, const arena_draft *d)
{
    uint32_t n_slots = __atomic_load_n(&r->n_slots, __ATOMIC_ACQUIRE);
    if (n_slots == 0)
        return UINT32_MAX;
    uint32_t head =
        __atomic_load_n(&r->head, __ATOMIC_RELAXED); /* single writer: nobody else moves it */
    uint32_t slot = head % n_slots;
    arena_draft *s = &r->slots[slot];
    uint32_t n = d->n < ARENA_DRAFT_MAX ? d->n : ARENA_DRAFT_MAX;

    /* odd while writing; a seq left odd by a writer that died mid-write steps by 2 to stay odd */
    uint32_t seq = __atomic_load_n(&s->seq, __ATOMIC_RELAXED);
    uint32_t writing = seq + 1 + (seq & 1);
    uint32_t done = writing + 1 != 0 ? writing + 1 : 2; /* 0 means never written: skip it on wrap */
    __atomic_store_n(&s->seq, writing, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&s->n, n, __ATOMIC_RELAXED);
    ring_copy_payload(s, d, n);
    __atomic_store_n(&s->seq, done, __ATOMIC_RELEASE);

    __atomic_fetch_add(&r->head, 1, __ATOMIC_RELEASE);
    return slot;
}

bool arena_draft_ring_get(const arena_draft_ring *r, uint32_t cap, uint32_t slot, arena_draft *out)
{
    if (slot >= cap || slot >= __atomic_load_n(&r->n_slots, __ATOMIC_ACQUIRE))
        return false;
    const arena_draft *s = &r->slots[slot];
    uint32_t before = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
    if (before == 0 || (before & 1))
        return false;
    uint32_t n = __atomic_load_n(&s->n, __ATOMIC_RELAXED);
    if (n > ARENA_DRAFT_MAX)
        n = ARENA_DRAFT_MAX; /* only a torn read can see this; the seq check below rejects it */
    ring_copy_payload(out, s, n);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&s->seq, __ATOMIC_RELAXED) != before)
        return false;
    out->seq = before;
    out->n = n;
    memset(out->tokens + n, 0, (ARENA_DRAFT_MAX - n) * sizeof out->tokens[0]);
    memset(out->conf + n, 0, (ARENA_DRAFT_MAX - n) * sizeof out->conf[0]);
    memset(out->parent + n, 0, (ARENA_DRAFT_MAX - n) * sizeof out->parent[0]);
    return true;
}
