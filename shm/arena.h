/*
 * shm/arena — the shared-memory arena of a process group, its region table, and the
 * synchronisation that lives in it (barriers, seqlocked draft rings).
 *
 * The coordinator creates one POSIX shared-memory object per group (mode 0600, name derived from
 * the group id) and lays out named regions; workers and speculators attach by name and find
 * regions by name. Nothing inside the arena is a pointer: the header and region table hold
 * offsets only, so every process may map it at a different address. A generation counter in the
 * header changes whenever the coordinator re-creates the layout, so an attacher can tell a stale
 * view. The header also records the creator's pid: that is how the next `up` tells an arena left
 * behind by a crashed group (creator dead, or header unreadable) from one still in use (creator
 * alive), without any lock file. Names are "/NAME": a leading '/', no other '/', at most 200
 * characters. Regions are 64-byte aligned, zero-filled, named uniquely (< 32 printable ASCII
 * characters).
 */
#ifndef OROCHI_ARENA_H
#define OROCHI_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ARENA_MAGIC 0x4f524f4348494131ull /* "OROCHIA1" */
/* 2: drafts are trees (parent indices); 3: the KV cache is head-major; 4: a draft ring slot and a
 * hidden state per sequence slot; 5: the llama block's lend table (the rows a slot reads from
 * another's) */
#define ARENA_LAYOUT_VERSION 5
#define ARENA_MAX_REGIONS 32
#define ARENA_NAME_LEN 32

typedef struct {
    char name[ARENA_NAME_LEN]; /* NUL-terminated */
    uint64_t offset;           /* from the start of the arena, 64-byte aligned */
    uint64_t size;
} arena_region;

typedef struct {
    uint64_t magic;
    uint32_t layout_version;
    uint32_t n_regions;
    uint64_t total_size;
    uint64_t generation; /* atomically updated */
    uint64_t creator_pid;
    arena_region regions[ARENA_MAX_REGIONS];
} arena_header;

typedef struct arena arena;

/* A region to lay out at creation. */
typedef struct {
    const char *name;
    uint64_t size;
} arena_spec;

/* Create the arena `name` (e.g. "/orochi-<group>") with the given regions (0..ARENA_MAX_REGIONS,
 * each of nonzero size), zero-filled, mode 0600.
 * An existing object of that name is an error unless `replace_stale`: then it is inspected, and
 * unlinked and replaced if its creator is dead or its header is garbage; if its creator is alive
 * the call fails with "arena /NAME is in use by pid P". NULL with a one-line err on failure. */
arena *arena_create(const char *name, const arena_spec *specs, int n_specs, bool replace_stale,
                    char *err, size_t errlen);
/* Attach to an existing arena; checks magic, layout version, total size against the object's
 * size and every region's bounds, alignment and name. */
arena *arena_attach(const char *name, char *err, size_t errlen);
/* Unmap, close (and, in the creating process, not a fork()ed copy, unlink) and free; nulls *a. */
void arena_destroy(arena **a);
/* Remove a named arena left behind by a crashed group (creator dead, or header garbage); returns
 * true if one was removed. An arena whose creator is alive is left alone. */
bool arena_unlink_stale(const char *name);

const arena_header *arena_header_of(const arena *a);
void *arena_base(const arena *a);
uint64_t arena_size(const arena *a);
const char *arena_name(const arena *a);
/* The region's memory, or NULL if absent; *size (if not NULL) gets its size. Looks in this
 * process's validated copy of the region table, never in the shared header. */
void *arena_region_find(const arena *a, const char *name, uint64_t *size);
/* 1 at creation; bumped atomically (acquire/release) by whoever changes the layout's meaning. */
uint64_t arena_generation(const arena *a);
void arena_bump_generation(arena *a);

/* ===== barrier: atomics + futex, spin first, with a timeout ===== */

/* Lives inside a region (all fields 0 is a valid, unconfigured state). */
typedef struct {
    uint32_t parties; /* participants per round */
    uint32_t arrived; /* in the current round */
    uint32_t round;   /* incremented when a round completes; futex word */
    uint32_t broken;  /* set when a round was abandoned (timeout); futex wakers see it */
    uint32_t sleepers; /* waiters in (or entering) the futex wait: a round's end wakes only them */
} arena_barrier;

/* (Re)configure for `parties` participants and clear `broken`; call only while nobody waits. */
void arena_barrier_init(arena_barrier *b, uint32_t parties);
/* Wait for all parties. Returns 0 when the round completed, -1 on timeout (the barrier is then
 * marked broken and every waiter returns -1 until arena_barrier_init is called again), so a dead
 * peer never hangs the others. Spins `spin` iterations before sleeping on the futex.
 * timeout_ms < 0 waits without limit. An unconfigured barrier (parties 0) returns -1. */
int arena_barrier_wait(arena_barrier *b, int timeout_ms, int spin);
/* Wait for all parties with no fixed timeout: after `spin` iterations, sleep on the futex in
 * slices of slice_ms and call keep_waiting(arg) after each slice that did not end the round; when
 * it returns false the round is abandoned (broken, -1) as on a timeout. A waiter can so stay
 * responsive (note it is alive, notice that the group is gone) however long a slow peer takes. */
int arena_barrier_wait_while(arena_barrier *b, int spin, int slice_ms, bool (*keep_waiting)(void *),
                             void *arg);
/* Abandon the current round from outside (the coordinator, when it sees a party die): every
 * waiter returns -1 now, and later waits too until arena_barrier_init. */
void arena_barrier_break(arena_barrier *b);

/* ===== draft ring: one per speculator, seqlocked slots ===== */

#define ARENA_DRAFT_MAX 64

typedef struct {
    uint32_t seq;        /* seqlock: odd while being written */
    uint32_t n;          /* tokens in the draft */
    uint64_t request_id; /* which sequence the draft is for */
    uint64_t ctx_len;    /* committed context length the draft continues */
    int32_t last_token;  /* the last committed token it assumed */
    int32_t tokens[ARENA_DRAFT_MAX];
    float conf[ARENA_DRAFT_MAX];     /* the drafter's probability of each token */
    int32_t parent[ARENA_DRAFT_MAX]; /* tree: index of the parent draft token, -1 = a child of
                                      * the last committed token; a chain has parent[i] = i - 1 */
} arena_draft;

typedef struct {
    uint32_t n_slots;
    uint32_t head;       /* next slot to write (monotonic; slot = head % n_slots) */
    arena_draft slots[]; /* n_slots entries */
} arena_draft_ring;

size_t arena_draft_ring_bytes(uint32_t n_slots);
void arena_draft_ring_init(arena_draft_ring *r, uint32_t n_slots);
/* Publish a draft (one writer per ring); `head` advances after the slot is complete, so slot
 * (head - 1) % n_slots is the newest finished draft. d->seq is ignored and d->n is clamped to
 * ARENA_DRAFT_MAX. Returns the slot index written, or UINT32_MAX for an unconfigured ring. */
uint32_t arena_draft_ring_put(arena_draft_ring *r, const arena_draft *d);
/* Copy slot i out consistently; false if it was being written (retry later), is empty, or lies
 * past the ring's slots. cap is the slot count the reader laid the ring out with: the count
 * stored in the ring is shared memory its writer could have corrupted, so a slot must be below
 * both. out->seq gets the slot's (even) version; tokens and conf past out->n are zero. */
bool arena_draft_ring_get(const arena_draft_ring *r, uint32_t cap, uint32_t slot, arena_draft *out);

#endif
