/*
 * shm/arena — the shared-memory arena of a process group, its region table, and the
 * synchronisation that lives in it (barriers, seqlocked draft rings).
 *
 * The coordinator creates one POSIX shared-memory object per group (mode 0600, name derived from
 * the group id) and lays out named regions; workers and speculators attach by name and find
 * regions by name. Nothing inside the arena is a pointer: the header and region table hold
 * offsets only, so every process may map it at a different address. A generation counter in the
 * header changes whenever the coordinator re-creates the layout, so an attacher can tell a stale
 * view. A lock file in the run directory holding the creator's pid lets the next `up` detect and
 * remove an arena left behind by a crashed group.
 */
#ifndef OROCHI_ARENA_H
#define OROCHI_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ARENA_MAGIC 0x4f524f4348494131ull /* "OROCHIA1" */
#define ARENA_LAYOUT_VERSION 1
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
    uint64_t generation;    /* atomically updated */
    uint64_t creator_pid;
    arena_region regions[ARENA_MAX_REGIONS];
} arena_header;

typedef struct arena arena;

/* A region to lay out at creation. */
typedef struct {
    const char *name;
    uint64_t size;
} arena_spec;

/* Create the arena `name` (e.g. "/orochi-<group>") with the given regions, zero-filled. An
 * existing object of that name is an error unless `replace_stale` (then it is unlinked first).
 * NULL with a one-line err on failure. */
arena *arena_create(const char *name, const arena_spec *specs, int n_specs, bool replace_stale,
                    char *err, size_t errlen);
/* Attach to an existing arena; checks magic, layout version and size. */
arena *arena_attach(const char *name, char *err, size_t errlen);
/* Unmap (and, for the creator, unlink) and free; nulls *a. */
void arena_destroy(arena **a);
/* Remove a named arena left behind by a crashed group; returns true if one was removed. */
bool arena_unlink_stale(const char *name);

const arena_header *arena_header_of(const arena *a);
void *arena_base(const arena *a);
uint64_t arena_size(const arena *a);
const char *arena_name(const arena *a);
/* The region's memory, or NULL if absent; *size (if not NULL) gets its size. */
void *arena_region_find(const arena *a, const char *name, uint64_t *size);
uint64_t arena_generation(const arena *a);
void arena_bump_generation(arena *a);

/* ===== barrier: atomics + futex, spin first, with a timeout ===== */

/* Lives inside a region (all fields 0 is a valid, unconfigured state). */
typedef struct {
    uint32_t parties;  /* participants per round */
    uint32_t arrived;  /* in the current round */
    uint32_t round;    /* incremented when a round completes; futex word */
    uint32_t broken;   /* set when a round was abandoned (timeout); futex wakers see it */
} arena_barrier;

void arena_barrier_init(arena_barrier *b, uint32_t parties);
/* Wait for all parties. Returns 0 when the round completed, -1 on timeout (the barrier is then
 * marked broken and every waiter returns -1 until arena_barrier_init is called again), so a dead
 * peer never hangs the others. Spins `spin` iterations before sleeping on the futex. */
int arena_barrier_wait(arena_barrier *b, int timeout_ms, int spin);

/* ===== draft ring: one per speculator, seqlocked slots ===== */

#define ARENA_DRAFT_MAX 64

typedef struct {
    uint32_t seq;         /* seqlock: odd while being written */
    uint32_t n;           /* tokens in the draft */
    uint64_t request_id;  /* which sequence the draft is for */
    uint64_t ctx_len;     /* committed context length the draft continues */
    int32_t last_token;   /* the last committed token it assumed */
    int32_t tokens[ARENA_DRAFT_MAX];
    float conf[ARENA_DRAFT_MAX]; /* the drafter's probability of each token */
} arena_draft;

typedef struct {
    uint32_t n_slots;
    uint32_t head;        /* next slot to write (monotonic; slot = head % n_slots) */
    arena_draft slots[];  /* n_slots entries */
} arena_draft_ring;

size_t arena_draft_ring_bytes(uint32_t n_slots);
void arena_draft_ring_init(arena_draft_ring *r, uint32_t n_slots);
/* Publish a draft; returns the slot index written. */
uint32_t arena_draft_ring_put(arena_draft_ring *r, const arena_draft *d);
/* Copy slot i out consistently; false if it was being written (retry later) or is empty. */
bool arena_draft_ring_get(const arena_draft_ring *r, uint32_t slot, arena_draft *out);

#endif
