/*
 * coordinator/coord — the coordinator's internal state, shared by its files, listed from the
 * floor up (a file calls only the ones below it; what the group and the operator code report
 * upward goes through the listeners in coord.on, set by coord_engine_init):
 *   coord_group.c   the peers: spawning, Hello/Welcome, heartbeats, supervision and restarts,
 *                   the status file, the answers to operator requests, each peer's last error;
 *   coord_trace.c   the step timeline (Chrome trace JSON) while a trace runs;
 *   coord_plan.c    the ARCA plan (--plan FILE);
 *   coord_ops.c     operator requests from `orochi-launch` (trace, swap, detach: RUN_DIR/ops/);
 *   coord_output.c  a request's text: the prompt rendered, the output released up to a stop;
 *   the engine      requests through the verification loop (drafts -> step -> accept -> commit
 *                   -> feedback), in five files on their own floors (coordinator/engine.h): the
 * step (coord_step.c), the drafts (coord_drafts.c), the sequence slots (coord_slots.c), the free
 * run (coord_freerun.c) and the cycle with the queue (coord_engine.c); coord_metrics.c the engine's
 * /metrics text; coord_status.c  the group as JSON for GET /status (the page's dashboard);
 *   coord_main.c    options, set-up (arena, socket, HTTP), the main loop, shutdown.
 * One thread (the main loop) owns the ZeroMQ socket, the arena and the engine state; HTTP threads
 * only hand requests over through the queue.
 */
#ifndef OROCHI_COORD_H
#define OROCHI_COORD_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "policy/control.h"
#include "coordinator/http.h"
#include "coordinator/request.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "group/runtime.h"

#define COORD_MAX_PEERS 32
#define COORD_QUEUE 1024 /* the most requests --max-queue lets wait */
#define COORD_MAX_SPAWN_ARGS 32
#define COORD_TREE_CAP CTL_TREE_CAP /* nodes of the merged draft trie */

typedef ctl_vote coord_vote;
typedef ctl_tree coord_tree; /* a token tree rooted at the last committed token (node 0) */

typedef enum { PEER_FREE = 0, PEER_WORKER, PEER_SPECULATOR } coord_peer_role;

typedef struct {
    coord_peer_role role;
    char name[64];     /* "worker-0", "ngram", ... (the launcher's role name) */
    uint8_t ident[64]; /* ZeroMQ routing id */
    size_t ident_len;
    bool connected;                   /* welcomed and alive */
    bool ready;                       /* workers: mapped the model and the arena, may be rung */
    bool came_up;                     /* workers: said "ready" since this process joined */
    pid_t pid;                        /* from Hello */
    pid_t child;                      /* when we spawned it: the child pid we wait for */
    char *argv[COORD_MAX_SPAWN_ARGS]; /* how to spawn it again (NULL: not ours) */
    uint64_t started_us, last_hb_us, hb_steps;
    int restarts;
    uint64_t respawn_at_us; /* when to spawn again after a death (0: not) */
    int failed_starts;      /* deaths in a row before joining, or (a worker) before it was ready
                               (back-off, give-up) */
    bool refused;           /* the coordinator refused its Hello: never respawn */
    int index;              /* worker part / speculator ring */
    char kind[16];
    char placement[200]; /* speculators: Heartbeat.placement (threads, ahead or in turns, why) */
    /* speculator bookkeeping */
    uint64_t drafted, accepted;
    ctl_acr acr; /* average acceptance rate of its voted drafts, and its vote weight (Minions) */
    arena_draft slot_draft[RT_MAX_SEQ]; /* its draft per sequence slot in the step being verified
                                         * (n = 0: none) */
    struct {
        uint64_t req, ctx; /* the latest DraftReady for this sequence slot's request */
        uint32_t ring_slot, n;
        bool fresh;
    } draft_ready[RT_MAX_SEQ];
    uint64_t slot_fed_req[RT_MAX_SEQ], slot_fed_ctx[RT_MAX_SEQ]; /* latest Feedback per slot */
    bool multi;  /* it is fed every active request: ngram, replay, medusa, and a model drafter
                  * that says every_request in its DraftReady (it drafts for all in a batch) */
    bool lookup; /* ngram: what it drafts, the workers' free run finds by itself */
    uint64_t fed_req, fed_ctx; /* latest Feedback sent (the context it holds) */
    /* what the draft wait learns about it (coord_drafts.c, engine_draft_budget_us) */
    uint64_t fed_us;       /* when the latest Feedback went out */
    bool fed_reset;        /* ... and whether it was a reset (the whole context) */
    bool reply_timed;      /* its reply to that Feedback has been timed */
    double reply_ema_us;   /* time from a Feedback to its DraftReady, EMA */
    double accept_ema;     /* its drafted tokens the target accepted per step, EMA */
    int reply_n, accept_n; /* samples behind each EMA */
    int unscored;          /* steps since its last acceptance sample */
    int benched;           /* Feedbacks skipped in a row because its drafts do not pay */
    int bench_interval;    /* skips before it is fed again to re-measure it */
    double draft_ema_us;   /* reply latency to Feedbacks that were not resets, EMA */
    int draft_n;
    uint64_t benched_total;
    /* what `status` shows: the latest step (workers: compute and barrier wait, EMA) or draft
     * (speculators: drafting time, EMA), and the latest trouble */
    double step_ema_us, wait_ema_us, draft_work_ema_us;
    int step_n, draft_work_n;
    char last_error[160];
    uint64_t last_error_us;
    /* operator requests (coord_ops.c) */
    char op[64];                          /* the request to answer when a swap or detach ends */
    char *old_argv[COORD_MAX_SPAWN_ARGS]; /* swap: the configuration to go back to on failure */
    enum { SWAP_NONE = 0, SWAP_STOPPING, SWAP_STARTED } swap;
    uint64_t op_deadline_us;
    bool detaching; /* detach-speculator: it leaves the vote, and is never spawned again */
    int swaps;
} coord_peer;

struct coord_engine_state;
typedef struct coord coord;

/* What the group (coord_group.c) and the operator requests (coord_ops.c) tell the floors above
 * them, which coord_engine_init sets: the group never calls up into the engine or the operator
 * code by name, so the coordinator's files stand on one another without a circle. */
typedef struct {
    void (*step_done)(coord *c, coord_peer *p, const Orochi__StepDone *d);     /* engine */
    void (*draft_ready)(coord *c, coord_peer *p, const Orochi__DraftReady *r); /* engine */
    void (*worker_lost)(coord *c, coord_peer *p); /* engine: a worker is gone mid-step */
    /* operator code: a peer's process ended; true when a swap or detach takes it from here */
    bool (*peer_exit)(coord *c, coord_peer *p, const char *why);
} coord_listeners;

/* What the command line (and the environment) set: fixed once the coordinator has started. */
typedef struct {
    const char *run_dir, *target, *bind, *api_key, *external;
    const char *chat_template; /* --chat-template FILE: instead of the model file's template */
    char api_key_buf[512];     /* the key read from --api-key-file or $OROCHI_API_KEY */
    int max_queue;             /* requests waiting beyond it get 429 */
    int act_bits;    /* --act-bits: the workers' activation precision (8, 16, LLAMA_ACT_AUTO) */
    kv_type kv_elem; /* --kv: the K/V cache's element type in the arena (every role's) */
    bool kv_dup;     /* the even split divides query heads (llama_ctx_params.kv_dup) */
    bool no_prefix_reuse; /* --prefix-reuse off: every prompt is computed whole */
    bool no_prefix_share; /* --prefix-share off: a reused beginning is copied, not read in place */
    int kv_dup_opt;       /* --kv-dup: -1 auto (on when every worker is a CPU), 0 off, 1 on */
    int port, n_workers, threads_per_worker, max_width, n_ctx, max_draft, draft_wait_ms;
    int prefill_width; /* --prefill-width: the most rows of a step carrying a prompt chunk */
    int chunk_rows;    /* the larger of the two: the rows of a step carrying a prompt chunk */
    int step_rows;     /* that or --max-batch, the larger: the rows any step may carry (arena) */
    char worker_device[RT_MAX_WORKERS][4]; /* "cpu" or "gpu" per worker (--workers cpu:N,gpu:M) */
    /* --gpu-memory, --gpu-graphs, --gpu-fuse, --gpu-att-parts, --gpu-matmul for GPU workers ("":
     * the worker's default) */
    char gpu_memory[8], gpu_graphs[4], gpu_fuse[4], gpu_att_parts[8], gpu_matmul[8];
    char gpu_weights[8], gpu_limit[24]; /* --gpu-weights, --gpu-memory-limit (passed on) */
    bool draft_wait_fixed; /* --draft-wait fixed: every fed speculator up to draft_wait_ms */
    int n_seq;             /* requests verified together (sequence slots, --max-batch) */
    int kv_release_s;      /* --kv-release: seconds a slot idles before its K/V pages go back */
    int heartbeat_ms, dead_ms;
    int drain_ms; /* SIGTERM: how long admitted requests may take to finish */
    bool trace, no_spawn;
    /* speculation (policy/control.h, docs/speculation.md) */
    bool tree, adaptive;
    coord_vote vote;
    ctl_acr_params acr;
    int decision_threshold;
    bool guard_enabled;
    bool no_free_run;       /* --free-run off: every token goes through a verification cycle */
    bool no_grammar_drafts; /* --grammar-drafts off: a grammar's forced text is not drafted */
    bool no_lookup_run;     /* --lookup-run off: ngram drafts only through verification cycles */
    int guard_window, guard_probe;
    const char *plan_path; /* --plan FILE (reread when the file changes) */
    const char *spec_specs[RT_MAX_SPECULATORS];
    int n_spec_specs;
    char bin_dir[4096];
} coord_options;

/* The group: the control socket, the arena and what it holds, the peers, the step in flight. */
typedef struct {
    void *zctx, *sock;
    arena *arena;
    rt_step *step;
    float *logits;
    arena_draft_ring *rings;
    size_t ring_bytes;
    rt_hidden *hidden;
    coord_peer peers[COORD_MAX_PEERS];
    uint64_t started_us, last_status_us, last_hb_sent_us;
    uint64_t step_counter;
    /* the step in flight */
    uint64_t step_wait_id;
    bool step_failed;
    char step_err[256];
} coord_group_state;

/* A latency histogram in seconds (Prometheus): observations at or below each bound of
 * coord_latency_le (coord_metrics.c), their count and their sum. */
#define COORD_LAT_BUCKETS 14
typedef struct {
    uint64_t n[COORD_LAT_BUCKETS];
    uint64_t count;
    double sum;
} coord_latency;

/* One verification cycle as the page's timeline draws it (GET /status, "recent_steps"). */
#define COORD_RECENT_STEPS 256
typedef struct {
    uint64_t seq;     /* 1, 2, ...: the cycle's number */
    uint32_t t_ms;    /* when it ended, since the group started */
    uint16_t requests, rows, tokens; /* the requests it served, its rows, the tokens they got */
    uint16_t steps;   /* forward passes: 1 for a verification cycle, those a free run's take saw */
    float ms;         /* the whole cycle: drafts, the step(s), verification */
} coord_step_rec;

/* What /metrics and `status` report; HTTP threads read it under `lock`. */
typedef struct {
    pthread_mutex_t lock;
    uint64_t requests, tokens, steps, prompt_tokens, failed, restarts;
    uint64_t free_tokens;      /* tokens taken from free-running decodes */
    uint64_t piggyback_tokens; /* tokens decoded in the steps of another request's prefill */
    uint64_t accept_hist[RT_MAX_WIDTH + 1]; /* tokens accepted per verification step */
    uint64_t batch_hist[RT_MAX_SEQ + 1];    /* requests per verification step */
    double step_seconds, draft_wait_seconds;
    double worker_compute_us[RT_MAX_WORKERS];
    uint64_t worker_steps[RT_MAX_WORKERS];
    char spec_text[4096]; /* speculator gauges, rebuilt by the main loop */
    char mem_text[4096];  /* each role's memory gauges, rebuilt every 10 s */
    uint64_t last_mem_us;
    char last_error[200]; /* the latest failed request, for `status` */
    uint64_t last_error_us;
    /* the controllers as the engine left them (coord_metrics_controllers) */
    int spec_len, width;
    bool guard_on;
    uint64_t len_changes, guard_switches_off;
    int slots_active;       /* sequence slots with a request */
    uint64_t kv_held;       /* K/V bytes the slots' committed rows have written (whole pages) */
    uint64_t kv_lent;       /* K/V bytes slots read from another slot's rows (whole pages) */
    uint64_t kv_full;       /* every slot at its full context */
    coord_latency ttft;   /* a request's arrival to its first token */
    coord_latency itl;    /* between a request's tokens (coord_latency_observe_gap) */
    struct cJSON *status; /* the group for GET /status, rebuilt by the main loop (coord_status.c) */
    uint64_t status_us;   /* when it was built (main loop only) */
    coord_step_rec recent[COORD_RECENT_STEPS]; /* the latest cycles, a ring: n_recent % size */
    uint64_t n_recent;
} coord_metrics;

struct coord {
    coord_options opt;
    coord_group_state grp;
    coord_metrics met;

    /* the engine: its sequence slots (private to it: coordinator/engine.h) and the controllers
     * and the plan it steers by */
    struct coord_engine_state *eng;
    double step_ema_us;    /* a verification cycle but its draft wait, EMA: a token's price */
    int width;             /* verification width: nodes of a verified tree, root included */
    int spec_len;          /* current speculation length (max draft depth) */
    ctl_length len;        /* the adaptive length (--adaptive on) */
    ctl_guard guard;       /* speculation off while it is slower than plain decoding (--guard on) */
    ctl_guard guard_batch; /* the same for cycles that verify several requests */
    ctl_lookup lookup;     /* prompt lookup's acceptance per match order, carried from run to run */
    /* the group's own step-time curve for prompt lookup when the plan gives none (measured
     * once, engine_measure_costs): cost[w] for w = 1..self_cost_w (0: none) */
    float self_cost[RT_MAX_WIDTH + 1];
    int self_cost_w;
    bool self_cost_tried;
    /* the plan (--plan FILE) */
    struct coord_plan *plan;
    int plan_bucket; /* the bucket applied last (-1: none) */
    int64_t plan_mtime;
    uint64_t plan_checked_us;
    /* the partition plan the workers run (the plan's "partition"; none: the even split), and its
     * generation: bumped with every change, carried by each step in the arena (rt_step) */
    llama_partition part;
    bool part_set;
    bool kv_release_ok; /* every worker a CPU: idle slots' K/V pages may go back (--kv-release) */
    bool kv_share_ok;   /* every worker a CPU and --prefix-share on: slots may borrow rows */
    uint32_t part_gen;

    /* the model (weights stay unmapped but for metadata: the coordinator computes nothing) */
    llama_model *model;
    tokenizer *tok;
    llama_ctx *kv; /* a view over the shared block, used to commit accepted paths */
    uint64_t vocab_hash;
    char model_name[256];

    /* requests: HTTP threads push, the main loop pops */
    pthread_mutex_t qlock;
    coord_request *queue[COORD_QUEUE];
    uint64_t queued_us[COORD_QUEUE]; /* when each queued request arrived */
    int qhead, qlen;
    uint64_t next_request_id;
    http_server *http;

    /* operator requests and the timeline */
    uint64_t ops_checked_us;
    struct coord_trace *tracer; /* non-NULL while a trace runs */

    coord_listeners on;
};

extern volatile int coord_stop_flag;

/* coord_group.c */
/* answer operator request `op` (first line "ok" or "error", then the text) in RUN_DIR/ops */
void coord_ops_answer(coord *c, const char *op, bool ok, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* remember p's latest trouble for `status` */
void coord_peer_error(coord_peer *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int coord_group_spawn_all(coord *c);
void coord_group_pump(coord *c, int timeout_ms);
void coord_group_supervise(coord *c);
/* Keep the group alive for a moment: take the peers' messages (waiting up to timeout_ms for the
 * first) and supervise their processes (heartbeats, respawns). The main loop does it between
 * cycles, and so does the engine wherever it waits inside one (for workers, a step, drafts): the
 * one way the coordinator serves its group while it waits. */
void coord_group_serve(coord *c, int timeout_ms);
bool coord_group_workers_ready(const coord *c);
int coord_group_count(const coord *c, coord_peer_role role, bool connected_only);
void coord_group_broadcast(coord *c, coord_peer_role role, Orochi__Envelope__BodyCase which,
                           void *body);
void coord_group_send(coord *c, coord_peer *p, Orochi__Envelope__BodyCase which, void *body);
void coord_group_shutdown(coord *c);
void coord_group_write_status(coord *c);
/* Rebuild the memory gauges of /metrics (m_mem_text) from /proc/PID/smaps_rollup of the
 * coordinator and every running peer on this machine. */
void coord_group_memory_gauges(coord *c);
/* free a peer's command line (argv or old_argv: COORD_MAX_SPAWN_ARGS entries) and clear it */
void coord_free_argv(char **argv);
/* start p's process from p->argv now */
int coord_group_spawn(coord *c, coord_peer *p);
/* RUN_DIR/cmd/ROLE: how p is started, one argument per line (`debug ROLE`) */
void coord_group_write_cmd(coord *c, const coord_peer *p);
/* a model drafter on cores the workers use: no drafting ahead (adds --work-ahead 0) */
void coord_group_speculator_placement(coord *c, coord_peer *p);

/* coord_metrics.c */
/* `times` observations of `seconds` each (call with c->met.lock held) */
void coord_latency_observe(coord_latency *h, double seconds, uint64_t times);
/* copy the controllers' state (length, its changes, width, guard) into c->met for /metrics: the
 * engine calls it after every tick, so /metrics is never behind a finished request */
void coord_metrics_controllers(coord *c);
/* K/V bytes of `rows` rows in every (layer, K or V, KV head) region of a sequence slot, in whole
 * pages: what the arena's file has committed for them. */
uint64_t coord_kv_bytes(const coord *c, int rows);
/* Records a verification cycle (steps 1) or a free run's take (its steps) in met.recent, the
 * timeline of GET /status; met.lock held. */
void coord_metrics_cycle_locked(coord *c, int requests, int rows, int tokens, int steps, double ms);

/* coord_status.c: the group as JSON (GET /status, the page's dashboard) */
/* rebuild the picture of the processes and the controllers, twice a second (the main loop) */
void coord_status_poll(coord *c);
/* the picture and the live counters as JSON text, malloc'd (HTTP threads); NULL: none yet */
char *coord_engine_status(void *ctx);
/* free the picture (after the HTTP server has stopped) */
void coord_status_fini(coord *c);

/* coord_plan.c */
int coord_plan_load(coord *c, char *err, size_t errlen);
/* tell every connected worker the partition plan (a Reconfigure; the next step carries its
 * generation) */
void coord_group_reconfigure(coord *c);
/* reread the plan when its file changed (checked at most once a second) */
void coord_plan_poll(coord *c);
/* apply the plan's bucket for a context of n_ctx tokens (width, length bounds) */
void coord_plan_apply(coord *c, int n_ctx);
/* the applied bucket's tree shape (NULL: none), which merged drafts are fitted to */
const ctl_template *coord_plan_tree(const coord *c);
/* the applied bucket's step-time curve as cost[w] = t(w) / t(1) for w = 1..the returned width
 * (at most max_width; 0: the plan has none for it); cost may be NULL to ask whether there is one */
int coord_plan_costs(const coord *c, float *cost);

/* coord_ops.c: operator requests (RUN_DIR/ops/NAME.req, answered in NAME.out) */
/* look for new requests (at most every 100 ms) and finish swaps and detaches that are due;
 * called by the main loop between verification cycles */
void coord_ops_poll(coord *c);
/* the group's supervision saw p's process end: true when a swap or detach takes it from here
 * (no respawn, no restart counted) */
bool coord_ops_on_exit(coord *c, coord_peer *p, const char *why);

/* coord_trace.c: the step timeline (docs/operations.md) */
/* start writing OUT (Chrome trace JSON) for `seconds`; `op` is answered when it ends */
int coord_trace_start(coord *c, const char *out, double seconds, const char *op, char *err,
                      size_t errlen);
/* end the trace when its time is up (or now, when `force`) */
void coord_trace_poll(coord *c, bool force);
static inline bool coord_tracing(const coord *c)
{
    return c->tracer != 0;
}
/* one span [start_us, end_us) of process `pid` (role name `role`) on thread `tid`; args_fmt
 * (may be NULL) formats the members of its "args" object */
void coord_trace_span(coord *c, int pid, const char *role, int tid, const char *name,
                      uint64_t start_us, uint64_t end_us, const char *args_fmt, ...)
    __attribute__((format(printf, 8, 9)));
/* an async span [begin_us, end_us) of `name` with id `id` on the coordinator's track (Perfetto
 * draws overlapping ones side by side: the queue) */
void coord_trace_async(coord *c, const char *name, uint64_t id, uint64_t begin_us, uint64_t end_us);
#define COORD_TRACE_ENGINE 1 /* the coordinator's verification loop */
#define COORD_TRACE_SLOT 100 /* + s: sequence slot s (its requests) */

/* the engine (coord_engine.c, coord_step.c, coord_drafts.c: the rest is private to it) */
int coord_engine_submit(void *ctx, coord_request *req);
char *coord_engine_metrics(void *ctx);
int coord_engine_health(void *ctx, char *msg, size_t len);
/* The engine's state, and the listeners (coord.on) the group and the operator code report to. */
int coord_engine_init(coord *c);
void coord_engine_fini(coord *c);
/* Admit queued requests into free slots, then run one verification step for all active ones. */
void coord_engine_tick(coord *c);
/* Whether a request is being served or waits for a slot: the main loop then polls its socket
 * without waiting, so nothing but the steps sets the pace. */
bool coord_engine_busy(coord *c);
void coord_engine_on_step_done(coord *c, coord_peer *p, const Orochi__StepDone *d);
void coord_engine_on_draft_ready(coord *c, coord_peer *p, const Orochi__DraftReady *r);
void coord_engine_on_worker_lost(coord *c, coord_peer *p);

#endif
