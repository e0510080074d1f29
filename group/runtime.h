/*
 * group/runtime — what every process of a group shares: the control-plane framing (one protobuf
 * Envelope per ZeroMQ frame, with the protocol version checked on receipt), the run-directory
 * conventions (socket and arena names), logging with the role's name, and the arena regions every
 * role finds by name.
 */
#ifndef OROCHI_RUNTIME_H
#define OROCHI_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "policy/control.h"
#include "orochi.pb-c.h"
#include "shm/arena.h"

#define OROCHI_PROTOCOL_VERSION 2

/* Arena regions (names shared by all roles). */
#define RT_REGION_STEP "step"     /* rt_step: the current step's inputs */
#define RT_REGION_LLAMA "llama"   /* llama_shared block: KV cache + shared activations */
#define RT_REGION_LOGITS "logits" /* max_width x vocab floats */
#define RT_REGION_DRAFTS "drafts" /* RT_MAX_SPECULATORS draft rings */
#define RT_REGION_HIDDEN "hidden" /* rt_hidden per slot: the last hidden state (Medusa) */

#define RT_MAX_WIDTH 64
#define RT_MAX_SEQ 64     /* sequence slots: requests verified together in one step */
#define RT_MAX_SPECULATORS 8
#define RT_DRAFT_SLOTS RT_MAX_SEQ /* drafts a speculator's ring holds: one per sequence slot */

#define RT_MAX_WORKERS 8
#define RT_RUN_MAX 256     /* steps one free-running decode may make (rt_step.run_max) */
#define RT_RUN_STREAM 512  /* tokens one row of a free run may make */
#define RT_LOOKUP_HIST 2048 /* context tokens a free run's prompt lookup searches (the latest) */

/* The inputs of one verification step, written by the coordinator before it rings the doorbell.
 * The hot path of a step does not go through ZeroMQ: a socket round trip wakes two I/O threads
 * and two main threads per direction, which on a machine whose cores are busy with the forward
 * costs more than a millisecond per step. The coordinator stores the step id in `doorbell` and
 * wakes the workers' futex; each worker runs the step, writes its error (if any) into err[index]
 * and the step id into done_step[index], bumps `done` and wakes the coordinator's futex. A worker
 * only counts for the step it actually ran, so a late report from an abandoned attempt can never
 * be taken for the re-run's. Workers are rung only once every one has reported itself ready. StepDone still goes over the socket
 * afterwards as the step's report (timings), and StepBegin is kept in the protocol for tools. */
/* the end-of-generation tokens a free run stops at (tokenizer_eog's, TOKENIZER_MAX_EOG) */
#define RT_MAX_EOG 8

typedef struct {
    arena_barrier barrier;  /* the workers' per-op barrier */
    uint32_t doorbell;      /* futex word: low 32 bits of the step to run */
    uint32_t done;          /* futex word: bumped whenever a worker finishes a step */
    uint32_t done_step[RT_MAX_WORKERS]; /* low 32 bits of the last step each worker finished */
    char err[RT_MAX_WORKERS][160];
    uint64_t step_id;
    uint32_t n_tokens;
    uint32_t n_prefix;
    uint32_t logits_from;
    uint32_t plan_gen; /* the partition plan's generation this step runs with (Reconfigure) */
    int32_t tokens[RT_MAX_WIDTH];
    int32_t parent[RT_MAX_WIDTH];
    int32_t seq[RT_MAX_WIDTH];        /* sequence slot of each token */
    uint32_t seq_prefix[RT_MAX_SEQ];  /* committed length of each slot */
    /* Free-running greedy decode (run_max > 0; a step of one root token per sequence, n_tokens
     * of them, each of another slot): after the step the workers themselves take each row's
     * argmax as its sequence's next token, commit the rows just computed, publish the tokens and
     * run the next step of the same sequences, until run_max steps, a row's run_room tokens, an
     * end-of-generation token in any row (run_eog[0..run_n_eog): tokenizer_eog), or run_stop. With run_draft > 0 each row's next
     * step may also carry a chain of up to run_draft tokens drafted by prompt lookup (the
     * continuation of the latest earlier occurrence of its context's last run_order..1 tokens,
     * searched in the row's run_hist plus what the run made), as many as ctl_lookup_lengths finds
     * worth their step time (run_cost, up to run_width tokens a step, from the plan's curve, and
     * the acceptance estimates run_lookup, which the run updates); a row then takes its accepted
     * drafts and the argmax after them, and commits their rows. Each worker writes its part's
     * best of every token of the step into run_best[index][token], all meet at the barrier, and
     * every one merges the same way (largest, ties to the lower part: the lower index), so they
     * agree on the tokens and, running the same policy on the same verdicts, on the next step's
     * drafts; whether to go on is worker 0's reading of run_stop, published in run_seen_stop, so
     * they agree on that too. Worker 0 appends each row's tokens to run_stream[row] and sets
     * run_upto[k][row] (its stream's length after step k), and at the end of every step copies
     * its estimates to run_lookup_out, before any worker's run_count passes k; a step counts for
     * the coordinator once every worker's run_count (steps made and committed) has passed it. */
    uint32_t run_max;
    int32_t run_eog[RT_MAX_EOG];
    uint32_t run_n_eog;
    uint32_t run_stop;                  /* the coordinator asks the run to end */
    uint32_t run_seen_stop;             /* worker 0's reading of run_stop this round */
    uint32_t run_count[RT_MAX_WORKERS]; /* steps each worker has made, its K/V committed */
    struct {
        float value;
        int32_t index;
    } run_best[RT_MAX_WORKERS][RT_MAX_WIDTH];
    uint32_t run_room[RT_MAX_SEQ]; /* tokens each row may make (at most RT_RUN_STREAM) */
    uint32_t run_draft, run_order, run_width;
    float run_cost[RT_MAX_WIDTH + 1]; /* [w]: the step time of w tokens over one token's */
    ctl_lookup run_lookup, run_lookup_out;
    uint32_t run_hist_len[RT_MAX_SEQ];
    int32_t run_hist[RT_MAX_SEQ][RT_LOOKUP_HIST]; /* each row's latest context tokens */
    uint16_t run_upto[RT_RUN_MAX][RT_MAX_SEQ];
    int32_t run_stream[RT_MAX_SEQ][RT_RUN_STREAM];
} rt_step;

/* Futex wait/wake on a 32-bit word in shared memory (cross-process: no private flag). */
int rt_futex_wait(uint32_t *addr, uint32_t expected, int timeout_ms);
void rt_futex_wake(uint32_t *addr);

/* Bytes between consecutive draft rings in the drafts region (64-byte aligned). */
static inline size_t rt_ring_stride(void)
{
    return (arena_draft_ring_bytes(RT_DRAFT_SLOTS) + 63) & ~(size_t)63;
}

/* The target's final hidden state (residual stream after the last layer, before the output norm)
 * at the last accepted token of a request, published after each step under a seqlock, one per
 * sequence slot (RT_MAX_SEQ of them, rt_hidden_stride bytes apart: rt_hidden_at). Medusa heads
 * draft from it. */
typedef struct {
    uint32_t seq;        /* odd while being written */
    uint32_t dim;
    uint64_t request_id;
    uint64_t ctx_len;    /* committed length it belongs to (the root token included) */
    float h[];           /* dim floats */
} rt_hidden;

static inline size_t rt_hidden_stride(int dim)
{
    return (sizeof(rt_hidden) + (size_t)dim * sizeof(float) + 63) & ~(size_t)63;
}

/* Sequence slot `slot`'s hidden state in the region at `base`. */
static inline rt_hidden *rt_hidden_at(void *base, int dim, int slot)
{
    return (rt_hidden *)((uint8_t *)base + (size_t)slot * rt_hidden_stride(dim));
}

/* ===== logging ===== */

/* "2026-11-22T10:00:00.123 worker-0: message" to stderr (the launcher sends it to the role's log). */
void rt_log(const char *role, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The message of the calling thread's last rt_log ("" before any): a role that cannot go on
 * sends it to the coordinator as the reason. */
const char *rt_log_last(void);
/* Pin this process to one CPU when the environment variable `var` holds a comma list of CPU
 * numbers: entry index % count (OROCHI_PIN_WORKERS for worker i, OROCHI_PIN_SPECULATOR for a
 * speculator). Call before any thread starts so they all inherit it. Placement experiments only
 * (bench/placement.py); by default nothing is pinned. */
void rt_pin_from_env(const char *role, const char *var, int index);
uint64_t rt_now_us(void);

/* ===== names ===== */

/* ipc://RUN_DIR/ctl */
void rt_ctl_endpoint(const char *run_dir, char *out, size_t len);
/* "/orochi-<16 hex digits of a hash of the absolute run dir>" */
void rt_arena_name(const char *run_dir, char *out, size_t len);

/* ===== framing ===== */

/* Pack and send an envelope (version filled in). `identity` (ROUTER side) may be NULL for
 * DEALER sockets. Returns 0 or -1 (errno from zmq). */
int rt_send(void *sock, const void *identity, size_t id_len, Orochi__Envelope *env);
/* Receive one envelope. For ROUTER sockets the peer identity is copied into id (cap bytes) and
 * *id_len set. Returns NULL when nothing could be read (timeout/EAGAIN), or on a malformed frame
 * or another protocol version — then *bad is set and err holds one line describing it (the caller
 * logs it and, for a wrong version, answers with an Error). */
Orochi__Envelope *rt_recv(void *sock, bool router, uint8_t *id, size_t cap, size_t *id_len,
                          bool *bad, char *err, size_t errlen);
void rt_free(Orochi__Envelope *env);

/* Envelope builders: fill *env (stack storage) with the body; return env. */
Orochi__Envelope *rt_env(Orochi__Envelope *env, Orochi__Envelope__BodyCase which, void *body);

/* FNV-1a over a tokenizer's token strings, to check that a draft model shares the vocabulary. */
uint64_t rt_fnv1a(uint64_t h, const void *data, size_t len);

/* ===== liveness: heartbeats from a thread of their own, but not for a wedged main thread ===== */

#define RT_HEARTBEAT_MS 200 /* a heartbeat this often; the coordinator's --dead-ms is 3000 */

/* A role's liveness. Its main thread stamps `alive` as it works (rt_stamp); a thread of its own
 * asks rt_life_due every few ms whether a heartbeat should go out now, so a long computation or
 * a wait for a peer never looks like death — unless the main thread has shown no sign for
 * stall_ms, when the heartbeats stop (logged once, and the recovery too) and the coordinator
 * replaces the role as dead. The fields are read and written with atomics; either thread may ask. */
typedef struct {
    const char *role; /* for the log lines */
    int stall_ms;
    uint64_t alive_us;   /* the main thread's last sign of life */
    uint64_t hb_sent_us; /* when the last heartbeat went out */
    bool stalled;
} rt_life;

/* *at = now (atomically). */
void rt_stamp(uint64_t *at);
/* Microseconds since *at (atomically read; 0 if in the future). */
uint64_t rt_age_us(const uint64_t *at);
/* Whether a heartbeat is due now: none went out for RT_HEARTBEAT_MS and the main thread is not
 * stalled (`may_stall` false: it cannot stall yet, e.g. while joining maps a model). When it says
 * yes it records the heartbeat as sent. */
bool rt_life_due(rt_life *l, bool may_stall);

#endif
