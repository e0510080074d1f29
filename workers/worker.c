/*
 * orochi-worker — executes its column part of the target model for each verification step.
 *
 * Life of a worker: connect a DEALER socket to the coordinator's control socket, say Hello with
 * its part index, receive Welcome (arena name, number of parts, shapes, the target model path),
 * map the model and attach the arena. Then, each time the coordinator rings the step's doorbell
 * (rt_step.doorbell in the arena: no message announces a step), read the step's tokens and tree
 * from the arena, run its part of the forward — every linear layer for its output rows, attention for
 * its KV heads — meeting the other workers at the arena barrier between ops, write its columns of
 * the logits into the arena, and answer StepDone. A step rung as a free run (rt_step.run_max)
 * goes on by itself: the workers take each row's argmax as its request's next token (the parts'
 * bests merged at their barrier), commit the rows, publish the tokens and run the next step, until
 * the run's end (worker_run). Nothing but these small messages crosses the
 * socket. All state worth keeping (the KV cache) lives in the arena, so a restarted worker simply
 * maps it again and the coordinator re-runs the interrupted step.
 *
 * Two threads. The main thread waits on the doorbell and computes; while it waits at a step
 * barrier for a slower peer it may wait a long time, and that must never make it look dead. So a
 * control thread owns the socket's receiving side and the heartbeat: it sends a Heartbeat every
 * RT_HEARTBEAT_MS carrying the steps done, reads the coordinator's messages (Shutdown, heartbeats)
 * and notices an orphaned worker (the coordinator silent for --orphan-ms: the worker exits, so a
 * crashed group never leaves workers behind). The heartbeat means "this process runs and its main
 * thread is not wedged": the main thread stamps `life.alive_us` in its idle loop, at every barrier and
 * after every slice of a barrier wait, and the control thread withholds heartbeats once that stamp
 * is older than --stall-ms, so a worker stuck inside an op is still declared dead by the
 * coordinator (after --stall-ms plus its --dead-ms), while one that is merely waiting for a peer
 * never is. The barrier itself has no fixed timeout: a worker waits as long as its coordinator is
 * there, and the coordinator breaks the barrier when it declares a party dead
 * (docs/actor-system.md, "Liveness"). Sends from both threads go through `sock_lock` (a ZeroMQ
 * socket is not thread-safe).
 *
 * On the way out a worker removes the arena if its creator (the coordinator) is dead: whoever
 * leaves last after a coordinator crash cleans /dev/shm.
 */
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "model/llama.h"
#include "model/ngram.h"
#include "model/llama_cuda.h"
#include "group/runtime.h"

#define CONTROL_TICK_MS 20   /* the control thread's period: socket reads, heartbeat, orphan */
#define BARRIER_SLICE_MS 100 /* a barrier wait checks in this often (alive, coordinator there) */
#define BARRIER_SPIN 20000
#define STALL_MS_DEFAULT 30000 /* main thread silent this long inside an op: stop heartbeating */
#define LONG_WAIT_US 200       /* barrier waits this long are reported one by one (the timeline) */
#define LONG_WAITS_MAX 8       /* ... at most this many per step; the rest only in the sum */

/* Where a step's time goes, for StepDone (docs/operations.md, "The step timeline"). The forward
 * pass meets the other workers at a barrier after the embeddings and four times per layer, so
 * the stretch of compute that ends at synchronisation point k is of a known kind: the embeddings
 * (k = 0), then per layer attention, its output projection, the FFN's gate/up, its down
 * projection; what follows the last point is the LM head. Two clock reads per point. */
enum { PH_EMBED, PH_ATTENTION, PH_ATTN_OUT, PH_FFN_UP, PH_FFN_DOWN, PH_LM_HEAD, PH_N };
typedef struct {
    uint64_t seg_us; /* when the stretch now running began */
    int n_sync;      /* synchronisation points passed in this step */
    uint64_t phase_us[PH_N], wait_us;
    uint64_t long_waits[2 * LONG_WAITS_MAX]; /* start, duration */
    int n_long;
} worker_phases;

typedef struct {
    const char *run_dir, *device;
    const char *gpu_memory; /* --gpu-memory: auto, mapped, mirror */
    const char *gpu_weights; /* --gpu-weights: auto, device, mapped */
    size_t gpu_limit;        /* --gpu-memory-limit (0: none) */
    bool gpu_graphs;        /* --gpu-graphs on|off */
    bool gpu_fuse;          /* --gpu-fuse on|off */
    int gpu_att_parts;      /* --gpu-att-parts auto|N (0: auto) */
    int gpu_matmul;         /* --gpu-matmul auto|cuda|tensor (llama_gpu_matmul_parse) */
    int index, threads, orphan_ms;
    bool trace;
    char role[32];
    void *zctx, *sock;
    pthread_mutex_t sock_lock; /* the socket is shared by the main and the control thread */
    pthread_t control;
    bool control_started;
    arena *arena;
    rt_step *step;
    float *logits;
    llama_model *model;
    llama_ctx *ctx;
#ifdef OROCHI_HAVE_CUDA
    llama_gpu *gpu; /* --device gpu: the forward runs there */
#endif
    int n_workers;    /* parts of the model in the group (from the Welcome) */
    worker_phases ph; /* the step in flight (main thread only) */
    /* shared between the threads (atomics) */
    uint64_t steps;         /* steps computed (main writes, the heartbeat reads) */
    uint64_t last_coord_us; /* last sign of the coordinator: a message or a doorbell */
    rt_life life;           /* heartbeats, and the main thread's last sign of life */
    bool ready;             /* model and arena mapped: heartbeats say "ready" */
    /* the partition plan: the generation the context runs (main thread), and the latest
     * Reconfigure the control thread received (under plan_lock) */
    uint32_t plan_gen;
    pthread_mutex_t plan_lock;
    bool pending_valid, pending_even;
    uint32_t pending_gen;
    llama_partition pending;
} worker;

static volatile sig_atomic_t worker_stop;

static void worker_take_reconfigure(worker *w, const Orochi__Reconfigure *r);

static void worker_on_signal(int sig)
{
    (void)sig;
    worker_stop = 1;
}

static void worker_usage(FILE *out)
{
    fprintf(out, "usage: orochi-worker --run-dir D --index I [--threads T] [--device cpu|gpu]\n"
                 "                     [--gpu-memory auto|mapped|mirror] [--gpu-graphs on|off]\n"
                 "                     [--gpu-fuse on|off] [--gpu-att-parts auto|N]\n"
                 "                     [--gpu-matmul auto|cuda|tensor] [--gpu-weights auto|device|mapped]\n"
                 "                     [--gpu-memory-limit BYTES] [--orphan-ms MS]\n"
                 "                     [--stall-ms MS] [--trace]\n"
                 "  Joins the process group whose coordinator listens in run dir D and computes\n"
                 "  column part I of the target model for every verification step.\n"
                 "  --gpu-memory (auto): with --device gpu, where the activations and K/V rows\n"
                 "  live: mapped (read in place in the arena; a GPU sharing the host's memory),\n"
                 "  mirror (device copies, the arena the source; a discrete card); auto picks by\n"
                 "  the device. --gpu-graphs (on): a sole GPU part replays steps as CUDA graphs.\n"
                 "  --gpu-fuse (on): the GPU's fused launches (q/k/v as one matmul, RoPE with the\n"
                 "  K/V stores, gate/up with SiLU, the residual adds in their matmuls); off runs\n"
                 "  one launch per op, the same bits, for comparison.\n"
                 "  --gpu-att-parts (auto): the parts the GPU's attention cuts each token's key\n"
                 "  stream into, side by side (auto: by the context's length and the batch's\n"
                 "  width; 1: never; up to 256; the same answer within rounding).\n"
                 "  --gpu-matmul (auto): the quantized matrices on tensor cores (f16 products,\n"
                 "  every step width-invariant; auto) or on CUDA cores (cuda: f32, faster for\n"
                 "  one-token steps, 4-6x slower for trees of 16-64; docs/gpu.md).\n"
                 "  --gpu-weights (auto): device keeps in device memory only the weight rows this\n"
                 "  part computes under its partition; mapped reads them in place from the model\n"
                 "  file's pages (no copy; the memory itself on a GPU sharing the host's); auto:\n"
                 "  mapped on an integrated GPU, device on a discrete one.\n"
                 "  --gpu-memory-limit (none): the device memory this part may take, e.g. 40G; a\n"
                 "  share that needs more is refused, naming the bytes (docs/gpu.md, \"One copy\").\n"
                 "  --orphan-ms (10000): exit when the coordinator has been silent this long.\n"
                 "  --stall-ms (30000): stop heartbeating when the compute thread has been inside\n"
                 "  one op this long (so the coordinator replaces a wedged worker).\n");
}

/* After each slice of a barrier wait: the main thread is alive (only waiting), and goes on
 * waiting while the worker is not stopping; the coordinator breaks the barrier if a peer died,
 * and the control thread stops the worker if the coordinator is gone. */
static bool worker_keep_waiting(void *arg)
{
    worker *w = arg;
    rt_stamp(&w->life.alive_us);
    return !worker_stop;
}

static int worker_barrier(void *arg)
{
    worker *w = arg;
    worker_phases *ph = &w->ph;
    uint64_t t0 = rt_now_us();
    /* with 5 points per layer the first two both close attention stretches (the q/k/v
     * projections, then attention itself) */
    int per = w->ctx ? llama_ctx_syncs_per_layer(w->ctx) : 4, k = (ph->n_sync - 1) % per;
    ph->phase_us[ph->n_sync ? PH_ATTENTION + (per == 5 && k > 0 ? k - 1 : k) : PH_EMBED] +=
        t0 - ph->seg_us;
    ph->n_sync++;
    __atomic_store_n(&w->life.alive_us, t0, __ATOMIC_RELAXED);
    int rc = arena_barrier_wait_while(&w->step->barrier, BARRIER_SPIN, BARRIER_SLICE_MS,
                                      worker_keep_waiting, w);
    uint64_t t1 = rt_now_us(), waited = t1 - t0;
    ph->wait_us += waited;
    if (waited >= LONG_WAIT_US && ph->n_long < LONG_WAITS_MAX) {
        ph->long_waits[2 * ph->n_long] = t0;
        ph->long_waits[2 * ph->n_long + 1] = waited;
        ph->n_long++;
    }
    ph->seg_us = t1;
    return rc;
}

static int worker_send(worker *w, Orochi__Envelope__BodyCase which, void *body)
{
    Orochi__Envelope env;
    pthread_mutex_lock(&w->sock_lock);
    int rc = rt_send(w->sock, NULL, 0, rt_env(&env, which, body));
    pthread_mutex_unlock(&w->sock_lock);
    return rc;
}

static void worker_heartbeat(worker *w)
{
    Orochi__Heartbeat hb = OROCHI__HEARTBEAT__INIT;
    hb.time_us = rt_now_us();
    hb.steps = __atomic_load_n(&w->steps, __ATOMIC_RELAXED);
    hb.state = __atomic_load_n(&w->ready, __ATOMIC_ACQUIRE) ? "ready" : "joining";
    worker_send(w, OROCHI__ENVELOPE__BODY_HEARTBEAT, &hb);
}

/* The control thread: heartbeats, the coordinator's messages, orphan detection. Started once the
 * coordinator has welcomed us; from then on only this thread receives on the socket. */
static void *worker_control(void *arg)
{
    worker *w = arg;
    const struct timespec tick = {0, CONTROL_TICK_MS * 1000000L};
    while (!worker_stop) {
        /* joining (mapping and repacking the model) may take long: only a ready worker stalls */
        if (rt_life_due(&w->life, __atomic_load_n(&w->ready, __ATOMIC_ACQUIRE)))
            worker_heartbeat(w);
        if (rt_age_us(&w->last_coord_us) > (uint64_t)w->orphan_ms * 1000u) {
            rt_log(w->role, "coordinator silent for %d ms: exiting", w->orphan_ms);
            worker_stop = 1;
            break;
        }
        pthread_mutex_lock(&w->sock_lock);
        bool bad;
        char err[256];
        Orochi__Envelope *env;
        while ((env = rt_recv(w->sock, false, NULL, 0, NULL, &bad, err, sizeof err)) || bad) {
            if (bad) {
                rt_log(w->role, "ignoring a bad frame: %s", err);
                continue;
            }
            rt_stamp(&w->last_coord_us);
            if (env->body_case == OROCHI__ENVELOPE__BODY_SHUTDOWN) {
                rt_log(w->role, "shutdown: %s", env->shutdown->reason);
                worker_stop = 1;
            } else if (env->body_case == OROCHI__ENVELOPE__BODY_RECONFIGURE) {
                worker_take_reconfigure(w, env->reconfigure);
            }
            rt_free(env);
        }
        pthread_mutex_unlock(&w->sock_lock);
        nanosleep(&tick, NULL);
    }
    return NULL;
}

/* Control thread: keep a Reconfigure for the main thread, which applies it when a step carries
 * its generation (worker_replan). */
static void worker_take_reconfigure(worker *w, const Orochi__Reconfigure *r)
{
    llama_partition lp;
    char err[256];
    bool even = r->n_shares == 0;
    if (!even && llama_partition_unpack(&lp, (int)r->n_parts, r->shares, r->n_shares,
                                        (int)r->style, err, sizeof err)) {
        rt_log(w->role, "ignoring Reconfigure %u: %s", r->generation, err);
        return;
    }
    pthread_mutex_lock(&w->plan_lock);
    w->pending_valid = true;
    w->pending_even = even;
    w->pending_gen = r->generation;
    if (!even)
        w->pending = lp;
    pthread_mutex_unlock(&w->plan_lock);
}

static int worker_start_control(worker *w)
{
    rt_stamp(&w->last_coord_us);
    rt_stamp(&w->life.alive_us);
    int e = pthread_create(&w->control, NULL, worker_control, w);
    if (e) {
        rt_log(w->role, "cannot start the control thread: %s", strerror(e));
        return -1;
    }
    w->control_started = true;
    return 0;
}

/* Hello until Welcome (or give up); then map the model and the arena. */
static int worker_join(worker *w)
{
    Orochi__Hello hello = OROCHI__HELLO__INIT;
    hello.role = OROCHI__ROLE__ROLE_WORKER;
    hello.id = w->role;
    hello.pid = (uint32_t)getpid();
    hello.device = (char *)w->device;
    hello.threads = (uint32_t)w->threads;
    hello.worker_index = (uint32_t)w->index;
    Orochi__Envelope *env = NULL;
    for (int attempt = 0; !worker_stop && attempt < 300 && !env; attempt++) {
        worker_send(w, OROCHI__ENVELOPE__BODY_HELLO, &hello);
        zmq_pollitem_t it = {w->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 1000) <= 0)
            continue;
        bool bad;
        char err[256];
        Orochi__Envelope *e = rt_recv(w->sock, false, NULL, 0, NULL, &bad, err, sizeof err);
        if (bad)
            rt_log(w->role, "ignoring a bad frame from the coordinator: %s", err);
        if (e && e->body_case == OROCHI__ENVELOPE__BODY_WELCOME)
            env = e;
        else if (e && e->body_case == OROCHI__ENVELOPE__BODY_ERROR) {
            rt_log(w->role, "coordinator refused us: %s", e->error->message);
            rt_free(e);
            return -1;
        } else
            rt_free(e);
    }
    if (!env) {
        rt_log(w->role, "no Welcome from the coordinator at %s", w->run_dir);
        return -1;
    }
    Orochi__Welcome *wel = env->welcome;
    char err[512];
    int rc = -1;
    /* joined: heartbeats ("joining") from now on, also while the model is mapped and repacked */
    if (worker_start_control(w))
        goto done;
    /* a GPU worker computes from its device copy: no CPU repacking of the weights */
    w->model = !strcmp(w->device, "gpu")
                   ? llama_model_load_unpacked(wel->target_model, err, sizeof err)
                   : llama_model_load(wel->target_model, err, sizeof err);
    if (!w->model) {
        rt_log(w->role, "%s", err);
        goto done;
    }
    if (wel->target_identity && w->model->identity &&
        w->model->identity != wel->target_identity) {
        rt_log(w->role,
               "%s is not the file the group started with: its bytes changed since the "
               "coordinator loaded it (replaced or rewritten); restart the group to serve it",
               wel->target_model);
        goto done;
    }
    if (llama_model_set_act_bits(w->model, (int)wel->act_bits, err, sizeof err)) {
        rt_log(w->role, "Welcome: %s", err);
        goto done;
    }
    w->arena = arena_attach(wel->arena_name, err, sizeof err);
    if (!w->arena) {
        rt_log(w->role, "%s", err);
        goto done;
    }
    uint64_t llama_size = 0, step_size = 0;
    w->step = arena_region_find(w->arena, RT_REGION_STEP, &step_size);
    if (w->step && step_size < sizeof(rt_step)) {
        rt_log(w->role, "the arena's step record is %llu bytes, this build's %zu: the coordinator "
               "is another build of orochi", (unsigned long long)step_size, sizeof(rt_step));
        goto done;
    }
    void *shared = arena_region_find(w->arena, RT_REGION_LLAMA, &llama_size);
    w->logits = arena_region_find(w->arena, RT_REGION_LOGITS, NULL);
    int n_seq = wel->n_seq ? (int)wel->n_seq : 1;
    if (n_seq > RT_MAX_SEQ) {
        rt_log(w->role, "Welcome asks for %d sequence slots; this build has %d", n_seq, RT_MAX_SEQ);
        goto done;
    }
    if (wel->kv_type > KV_F16) {
        rt_log(w->role, "Welcome names K/V type %u; this build knows 0 (f32) and 1 (f16)",
               wel->kv_type);
        goto done;
    }
    kv_type kv = (kv_type)wel->kv_type;
    size_t need = llama_shared_layout(&w->model->cfg, (int)wel->n_ctx, (int)wel->max_width, n_seq,
                                      kv, NULL);
    if (!w->step || !shared || !w->logits || llama_size < need) {
        rt_log(w->role, "arena %s lacks the step/llama/logits regions this model needs",
               wel->arena_name);
        goto done;
    }
    llama_partition plan;
    if (wel->n_plan_shares &&
        llama_partition_unpack(&plan, (int)wel->n_workers, wel->plan_shares, wel->n_plan_shares,
                               (int)wel->plan_style, err, sizeof err)) {
        rt_log(w->role, "Welcome: %s", err);
        goto done;
    }
    w->plan_gen = wel->plan_generation;
    llama_ctx_params p = {.n_threads = w->threads,
                          .max_width = (int)wel->max_width,
                          .n_ctx = (int)wel->n_ctx,
                          .n_seq = n_seq,
                          .kv = kv,
                          .part = (int)wel->worker_index,
                          .n_parts = (int)wel->n_workers,
                          .plan = wel->n_plan_shares ? &plan : NULL,
                          .kv_dup = wel->kv_dup,
                          .shared = shared,
                          .sync = worker_barrier,
                          .sync_arg = w};
    w->ctx = llama_ctx_new(w->model, &p, err, sizeof err);
    if (!w->ctx) {
        rt_log(w->role, "%s", err);
        goto done;
    }
#ifdef OROCHI_HAVE_CUDA
    if (!strcmp(w->device, "gpu")) {
        llama_gpu_params gp = {.device = 0,
                               .memory = (llama_gpu_memory)llama_gpu_memory_parse(w->gpu_memory),
                               .graphs = w->gpu_graphs,
                               .unfused = !w->gpu_fuse,
                               .att_parts = w->gpu_att_parts,
                               .matmul_kind = w->gpu_matmul,
                               .weights = (llama_gpu_weights)llama_gpu_weights_parse(w->gpu_weights),
                               .memory_limit = w->gpu_limit};
        w->gpu = llama_gpu_new(w->ctx, &gp, arena_base(w->arena), (size_t)arena_size(w->arena),
                               err, sizeof err);
        if (!w->gpu) {
            rt_log(w->role, "GPU: %s", err);
            goto done;
        }
        rt_log(w->role, "GPU: %s; the arena mapped for it",
               llama_gpu_describe(w->gpu));
    }
#endif
    w->n_workers = (int)wel->n_workers;
    rt_log(w->role,
           "joined: part %u of %u, %s, %d threads, activations %s, %s K/V, arena %s, model %s",
           wel->worker_index, wel->n_workers, w->device, llama_ctx_threads(w->ctx),
           llama_act_bits_name((int)wel->act_bits), wel->kv_type == KV_F16 ? "f16" : "f32",
           wel->arena_name, wel->target_model);
    rc = 0;
done:
    rt_free(env);
    return rc;
}

/* One forward pass of the worker's part, on its device. */
static int worker_forward(worker *w, const llama_batch *b, char *err, size_t errlen)
{
#ifdef OROCHI_HAVE_CUDA
    if (w->gpu)
        return llama_gpu_forward(w->gpu, b, w->logits, err, errlen);
#endif
    return llama_forward(w->ctx, b, w->logits, err, errlen);
}

/* The barrier of a free-running decode between two forward passes: the LM head's stretch ends
 * here, and the next forward's phases count from its embeddings again. */
static int worker_run_sync(worker *w)
{
    worker_phases *ph = &w->ph;
    uint64_t t0 = rt_now_us();
    ph->phase_us[PH_LM_HEAD] += t0 - ph->seg_us;
    int rc = arena_barrier_wait_while(&w->step->barrier, BARRIER_SPIN, BARRIER_SLICE_MS,
                                      worker_keep_waiting, w);
    uint64_t t1 = rt_now_us();
    ph->wait_us += t1 - t0;
    ph->n_sync = 0;
    ph->seg_us = t1;
    return rc;
}

/* A row of a free run: its context (the latest RT_LOOKUP_HIST tokens the coordinator gave, then
 * what the run made: the lookup searches it), what it may still make, and its part of the step in
 * flight: the batch index of its root, the drafts after it and their match order. */
typedef struct {
    int len, room, made;
    int off, drafted, order;
} run_row;

static int32_t run_ctx[RT_MAX_SEQ][RT_LOOKUP_HIST + 1 + RT_RUN_STREAM]; /* main thread only */

/* The next step's batch: each row's last token, then the chain its prompt lookup drafts (as long
 * as ctl_lookup_lengths finds worth it). Returns the batch's tokens. */
static int run_layout(const rt_step *st, const ctl_lookup *est, run_row *rows, int n,
                      int32_t *tok, int32_t *parent, int32_t *seq)
{
    int order[RT_MAX_SEQ], avail[RT_MAX_SEQ], from[RT_MAX_SEQ], d[RT_MAX_SEQ];
    for (int i = 0; i < n; i++) {
        run_row *r = &rows[i];
        int k = 0, pos = -1;
        avail[i] = 0;
        if (st->run_draft > 0)
            pos = ngram_lookup(run_ctx[i], r->len, (int)st->run_order, &k);
        if (pos >= 0) {
            int a = r->len - pos, cap = r->room - 1; /* the bonus token takes one */
            a = a < cap ? a : cap;
            avail[i] = a < (int)st->run_draft ? a : (int)st->run_draft;
        }
        order[i] = k;
        from[i] = pos;
    }
    int wmax = st->run_width < RT_MAX_WIDTH ? (int)st->run_width : RT_MAX_WIDTH;
    if (st->run_draft > 0)
        ctl_lookup_lengths(est, n, order, avail, st->run_cost, wmax, d);
    else
        memset(d, 0, sizeof d);
    int nb = 0;
    for (int i = 0; i < n; i++) {
        run_row *r = &rows[i];
        r->off = nb;
        r->drafted = d[i];
        r->order = order[i];
        tok[nb] = run_ctx[i][r->len - 1];
        parent[nb] = -1;
        seq[nb++] = st->seq[i];
        for (int j = 0; j < d[i]; j++, nb++) {
            tok[nb] = run_ctx[i][from[i] + j];
            parent[nb] = nb - 1;
            seq[nb] = st->seq[i];
        }
    }
    return nb;
}

/* Free-running greedy decode after a step of one root token per sequence (rt_step.run_max): take
 * each row's argmax — after the drafts it accepted — as its sequence's next tokens, commit the
 * rows just computed, publish the tokens and run the next step of the same sequences, with the
 * drafts prompt lookup finds worth it; every worker does the same in lock step (see rt_step).
 * Returns the tokens of the steps made (each step's batch, drafts included: StepDone's n_tokens);
 * err says why it stopped early on a failure. */
static int worker_run(worker *w, char *err, size_t errlen)
{
    rt_step *st = w->step;
    int n = (int)st->n_tokens, nb = n, V = w->model->cfg.vocab, made = 0, me = w->index;
    int computed = 0; /* tokens of the steps made, drafts included */
    int32_t tok[RT_MAX_WIDTH], parent[RT_MAX_WIDTH], seq[RT_MAX_WIDTH], ids[RT_MAX_WIDTH];
    run_row rows[RT_MAX_SEQ];
    ctl_lookup est = st->run_lookup;
    for (int i = 0; i < n; i++) {
        run_row *r = &rows[i];
        uint32_t h = st->run_hist_len[i] < RT_LOOKUP_HIST ? st->run_hist_len[i] : RT_LOOKUP_HIST;
        memcpy(run_ctx[i], st->run_hist[i], h * sizeof(int32_t));
        run_ctx[i][h] = st->tokens[i]; /* the root: the last token made */
        *r = (run_row){.len = (int)h + 1,
                       .room = st->run_room[i] < RT_RUN_STREAM ? (int)st->run_room[i]
                                                               : RT_RUN_STREAM,
                       .off = i};
        tok[i] = st->tokens[i];
        parent[i] = -1;
        seq[i] = st->seq[i];
    }
    uint32_t max = st->run_max < RT_RUN_MAX ? st->run_max : RT_RUN_MAX;
    for (;;) {
        for (int j = 0; j < nb; j++) {
            float v;
            int32_t id = llama_ctx_part_argmax(w->ctx, w->logits + (size_t)j * (size_t)V, &v);
            st->run_best[me][j].value = v;
            st->run_best[me][j].index = id;
        }
        if (me == 0)
            st->run_seen_stop = __atomic_load_n(&st->run_stop, __ATOMIC_ACQUIRE);
        if (worker_run_sync(w)) {
            snprintf(err, errlen, "free-running decode: a peer did not reach the barrier");
            return computed;
        }
        bool end = st->run_seen_stop != 0;
        for (int j = 0; j < nb; j++) {
            float v = st->run_best[0][j].value;
            ids[j] = st->run_best[0][j].index;
            for (int k = 1; k < w->n_workers && k < RT_MAX_WORKERS; k++)
                if (st->run_best[k][j].value > v) { /* parts in column order: ties keep the lower */
                    v = st->run_best[k][j].value;
                    ids[j] = st->run_best[k][j].index;
                }
        }
        /* the next round's bests are written after the next forward's barriers: no one
         * overwrites these before every worker has read them */
        for (int i = 0; i < n; i++) {
            run_row *r = &rows[i];
            int m = 0, path[RT_MAX_WIDTH];
            while (m < r->drafted && ids[r->off + m] == tok[r->off + m + 1])
                m++;
            ctl_lookup_record(&est, r->order, r->drafted, m);
            for (int j = 0; j <= m; j++)
                path[j] = r->off + j;
            if (llama_commit(w->ctx, path, m + 1, err, errlen))
                return computed;
            /* its tokens: the accepted drafts and the argmax after them, up to an end of text */
            int32_t *dst = run_ctx[i] + r->len;
            int got = 0;
            for (int j = 0; j <= m && got < r->room; j++) {
                dst[got++] = j < m ? tok[r->off + j + 1] : ids[r->off + m];
                bool eog = false;
                for (uint32_t k = 0; k < st->run_n_eog && k < RT_MAX_EOG; k++)
                    eog |= dst[got - 1] == st->run_eog[k];
                if (eog) {
                    end = true;
                    break;
                }
            }
            if (me == 0) {
                memcpy(st->run_stream[i] + r->made, dst, (size_t)got * sizeof *dst);
                st->run_upto[made][i] = (uint16_t)(r->made + got);
            }
            r->len += got;
            r->made += got;
            r->room -= got;
            end |= r->room <= 0;
        }
        if (me == 0)
            st->run_lookup_out = est;
        made++;
        computed += nb;
        __atomic_store_n(&st->run_count[me], (uint32_t)made, __ATOMIC_RELEASE);
        if ((uint32_t)made >= max || end)
            return computed;
        nb = run_layout(st, &est, rows, n, tok, parent, seq);
        llama_batch b = {.n = nb, .tokens = tok, .parent = parent, .seq = seq, .logits_from = 0};
        if (worker_forward(w, &b, err, errlen))
            return computed;
        __atomic_fetch_add(&w->steps, 1, __ATOMIC_RELAXED);
    }
}

#define REPLAN_WAIT_MS 5000 /* how long a step waits for the Reconfigure its generation names */

/* The step names partition generation `want`: apply the Reconfigure that brought it (it is sent
 * before the step is rung, but the socket may deliver it a little after the doorbell). Returns 0,
 * or -1 with err. */
static int worker_replan(worker *w, uint32_t want, char *err, size_t errlen)
{
    llama_partition lp;
    bool got = false, even = false;
    for (int waited = 0; !got && waited < REPLAN_WAIT_MS && !worker_stop; waited++) {
        pthread_mutex_lock(&w->plan_lock);
        if (w->pending_valid && w->pending_gen == want) {
            got = true;
            even = w->pending_even;
            lp = w->pending;
        }
        pthread_mutex_unlock(&w->plan_lock);
        if (!got) {
            rt_stamp(&w->life.alive_us);
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
        }
    }
    if (!got) {
        snprintf(err, errlen, "the step runs partition generation %u, which never arrived", want);
        return -1;
    }
    if (llama_ctx_set_partition(w->ctx, even ? NULL : &lp, err, errlen))
        return -1;
    w->plan_gen = want;
    rt_log(w->role, "partition generation %u applied (%s)", want, even ? "even" : "the plan's");
    return 0;
}

/* Run the step the arena holds (the doorbell rang), then report: error text and `done` in the
 * arena for the coordinator's wait, StepDone over the socket for its metrics. */
static void worker_step(worker *w)
{
    rt_step *st = w->step;
    Orochi__StepDone done = OROCHI__STEP_DONE__INIT;
    done.step_id = st->step_id;
    done.worker_index = (uint32_t)w->index;
    char err[160] = "";
    uint64_t t0 = rt_now_us();
    worker_phases *ph = &w->ph;
    memset(ph, 0, sizeof *ph);
    ph->seg_us = t0;
    uint32_t n = st->n_tokens;
    if (n == 0 || n > RT_MAX_WIDTH) {
        snprintf(err, sizeof err, "step %llu: %u tokens", (unsigned long long)st->step_id, n);
    } else if (st->plan_gen != w->plan_gen && worker_replan(w, st->plan_gen, err, sizeof err)) {
        n = 0;
    } else {
        for (int s = 0; s < RT_MAX_SEQ; s++)
            llama_ctx_set_seq_prefix_len(w->ctx, s, (int)st->seq_prefix[s]);
        llama_batch b = {.n = (int)n,
                         .tokens = st->tokens,
                         .parent = st->parent,
                         .seq = st->seq,
                         .logits_from = (int)st->logits_from};
        if (worker_forward(w, &b, err, sizeof err) == 0) {
            __atomic_fetch_add(&w->steps, 1, __ATOMIC_RELAXED);
            if (st->run_max > 0 && n <= RT_MAX_SEQ)
                n = (uint32_t)worker_run(w, err, sizeof err);
        }
    }
    uint64_t t_end = rt_now_us();
    ph->phase_us[ph->n_sync ? PH_LM_HEAD : PH_EMBED] += t_end - ph->seg_us;
    done.compute_us = t_end - t0;
    done.start_us = t0;
    done.n_tokens = n;
    done.wait_us = ph->wait_us;
    done.embed_us = ph->phase_us[PH_EMBED];
    done.attention_us = ph->phase_us[PH_ATTENTION];
    done.attn_out_us = ph->phase_us[PH_ATTN_OUT];
    done.ffn_up_us = ph->phase_us[PH_FFN_UP];
    done.ffn_down_us = ph->phase_us[PH_FFN_DOWN];
    done.lm_head_us = ph->phase_us[PH_LM_HEAD];
    done.n_long_waits = (size_t)(2 * ph->n_long);
    done.long_waits = ph->long_waits;
    if (w->index < RT_MAX_WORKERS) {
        memcpy(st->err[w->index], err, sizeof st->err[0]);
        __atomic_store_n(&st->done_step[w->index], (uint32_t)st->step_id, __ATOMIC_RELEASE);
    }
    __atomic_fetch_add(&st->done, 1, __ATOMIC_RELEASE);
    rt_futex_wake(&st->done);
    done.error = err;
    if (err[0])
        rt_log(w->role, "step %llu failed: %s", (unsigned long long)st->step_id, err);
    else if (w->trace)
        rt_log(w->role, "step %llu: %u tokens in %llu us", (unsigned long long)st->step_id, n,
               (unsigned long long)done.compute_us);
    worker_send(w, OROCHI__ENVELOPE__BODY_STEP_DONE, &done);
}

static int worker_parse(worker *w, int argc, char **argv)
{
    static const struct option opts[] = {{"run-dir", required_argument, 0, 'r'},
                                         {"index", required_argument, 0, 'i'},
                                         {"threads", required_argument, 0, 't'},
                                         {"device", required_argument, 0, 'd'},
                                         {"gpu-memory", required_argument, 0, 'm'},
                                         {"gpu-graphs", required_argument, 0, 'g'},
                                         {"gpu-fuse", required_argument, 0, 'f'},
                                         {"gpu-att-parts", required_argument, 0, 'a'},
                                         {"gpu-matmul", required_argument, 0, 'k'},
                                         {"gpu-weights", required_argument, 0, 'W'},
                                         {"gpu-memory-limit", required_argument, 0, 'L'},
                                         {"orphan-ms", required_argument, 0, 'o'},
                                         {"stall-ms", required_argument, 0, 's'},
                                         {"trace", no_argument, 0, 'v'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'r': w->run_dir = optarg; break;
        case 'i': w->index = atoi(optarg); break;
        case 't': w->threads = atoi(optarg); break;
        case 'd': w->device = optarg; break;
        case 'm': w->gpu_memory = optarg; break;
        case 'g':
        case 'f':
            if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
                fprintf(stderr, "orochi-worker: --%s %s: must be on or off\n",
                        c == 'g' ? "gpu-graphs" : "gpu-fuse", optarg);
                return 2;
            }
            *(c == 'g' ? &w->gpu_graphs : &w->gpu_fuse) = !strcmp(optarg, "on");
            break;
        case 'a':
            if ((w->gpu_att_parts = llama_gpu_att_parts_parse(optarg)) < 0) {
                fprintf(stderr, "orochi-worker: --gpu-att-parts %s: auto or 1..256\n", optarg);
                return 2;
            }
            break;
        case 'k':
            if ((w->gpu_matmul = llama_gpu_matmul_parse(optarg)) < 0) {
                fprintf(stderr, "orochi-worker: --gpu-matmul %s: auto, cuda or tensor\n", optarg);
                return 2;
            }
            break;
        case 'W':
            if (llama_gpu_weights_parse(optarg) < 0) {
                fprintf(stderr, "orochi-worker: --gpu-weights %s: auto, device or mapped\n",
                        optarg);
                return 2;
            }
            w->gpu_weights = optarg;
            break;
        case 'L':
            if (llama_gpu_bytes_parse(optarg, &w->gpu_limit)) {
                fprintf(stderr, "orochi-worker: --gpu-memory-limit %s: a byte count, e.g. 40G, "
                                "512M or 0 (none)\n", optarg);
                return 2;
            }
            break;
        case 'o': w->orphan_ms = atoi(optarg); break;
        case 's': w->life.stall_ms = atoi(optarg); break;
        case 'v': w->trace = true; break;
        case 'h': worker_usage(stdout); exit(0);
        default: worker_usage(stderr); return 2;
        }
    }
    if (!w->run_dir || w->index < 0 || w->threads < 0 || w->orphan_ms < 100 || w->life.stall_ms < 100) {
        worker_usage(stderr);
        return 2;
    }
#ifdef OROCHI_HAVE_CUDA
    if (strcmp(w->device, "cpu") && strcmp(w->device, "gpu")) {
        fprintf(stderr, "orochi-worker: --device %s: must be cpu or gpu\n", w->device);
        return 2;
    }
    if (llama_gpu_memory_parse(w->gpu_memory) < 0) {
        fprintf(stderr, "orochi-worker: --gpu-memory %s: must be auto, mapped or mirror\n",
                w->gpu_memory);
        return 2;
    }
#else
    if (strcmp(w->device, "cpu")) {
        fprintf(stderr,
                "orochi-worker: --device %s is not available in this build (cpu only: it was built "
                "without CUDA; CMake builds the GPU worker when it finds nvcc)\n",
                w->device);
        return 2;
    }
#endif
    return 0;
}

int main(int argc, char **argv)
{
    worker w = {.device = "cpu", .gpu_memory = "auto", .gpu_weights = "auto", .gpu_graphs = true, .gpu_fuse = true, .threads = 1,
                .orphan_ms = 10000, .life.stall_ms = STALL_MS_DEFAULT};
    int rc = worker_parse(&w, argc, argv);
    if (rc)
        return rc;
    snprintf(w.role, sizeof w.role, "worker-%d", w.index);
    w.life.role = w.role;
    rt_pin_from_env(w.role, "OROCHI_PIN_WORKERS", w.index);
    signal(SIGTERM, worker_on_signal);
    signal(SIGINT, worker_on_signal);
    signal(SIGPIPE, SIG_IGN);
    pthread_mutex_init(&w.sock_lock, NULL);
    pthread_mutex_init(&w.plan_lock, NULL);
    char arena_nm[256] = "";

    char endpoint[4200];
    rt_ctl_endpoint(w.run_dir, endpoint, sizeof endpoint);
    w.zctx = zmq_ctx_new();
    w.sock = zmq_socket(w.zctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(w.sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(w.sock, ZMQ_ROUTING_ID, w.role, strlen(w.role));
    if (zmq_connect(w.sock, endpoint)) {
        rt_log(w.role, "cannot connect to %s: %s", endpoint, zmq_strerror(zmq_errno()));
        rc = 1;
        goto out;
    }
    if (worker_join(&w)) {
        /* the coordinator logs why (a configuration this worker cannot run: no GPU, a weight
         * type, memory) and counts it as a failed start; the message may take a moment to go */
        Orochi__Error e = OROCHI__ERROR__INIT;
        e.message = (char *)(rt_log_last()[0] ? rt_log_last() : "joining failed");
        e.code = 1;
        linger = 1000;
        zmq_setsockopt(w.sock, ZMQ_LINGER, &linger, sizeof linger);
        worker_send(&w, OROCHI__ENVELOPE__BODY_ERROR, &e);
        rc = 1;
        goto out;
    }
    snprintf(arena_nm, sizeof arena_nm, "%s", arena_name(w.arena));
    /* the step already in the arena when we join (e.g. the one our predecessor died in) is the
     * coordinator's to re-ring, not ours to run */
    uint32_t last_bell = __atomic_load_n(&w.step->doorbell, __ATOMIC_ACQUIRE);
    __atomic_store_n(&w.ready, true, __ATOMIC_RELEASE);
    worker_heartbeat(&w); /* "ready": from now on the coordinator may ring us */
    while (!worker_stop) {
        rt_stamp(&w.life.alive_us);
        /* the hot path: the doorbell, spinning briefly, then a futex sleep with a short timeout
         * so a stop is noticed */
        uint32_t bell = __atomic_load_n(&w.step->doorbell, __ATOMIC_ACQUIRE);
        for (int spin = 0; bell == last_bell && spin < 2000; spin++) {
            if (!(spin & 31))
                sched_yield();
            bell = __atomic_load_n(&w.step->doorbell, __ATOMIC_ACQUIRE);
        }
        if (bell == last_bell) {
            rt_futex_wait(&w.step->doorbell, last_bell, 20);
            bell = __atomic_load_n(&w.step->doorbell, __ATOMIC_ACQUIRE);
        }
        if (bell != last_bell) {
            last_bell = bell;
            rt_stamp(&w.last_coord_us); /* a doorbell is the coordinator speaking too */
            worker_step(&w);
        }
    }
out:
    worker_stop = 1;
    if (w.control_started)
        pthread_join(w.control, NULL);
#ifdef OROCHI_HAVE_CUDA
    if (w.gpu) {
        long replayed, recorded;
        llama_gpu_graph_counts(w.gpu, &replayed, &recorded);
        rt_log(w.role, "GPU: %ld steps replayed from %ld CUDA graphs recorded", replayed, recorded);
    }
    llama_gpu_destroy(&w.gpu);
#endif
    llama_ctx_destroy(&w.ctx);
    llama_model_destroy(&w.model);
    arena_destroy(&w.arena);
    /* a dead coordinator cannot unlink its arena: the last of its peers to leave does */
    if (arena_nm[0] && arena_unlink_stale(arena_nm))
        rt_log(w.role, "removed the arena %s (its coordinator is gone)", arena_nm);
    if (w.sock)
        zmq_close(w.sock);
    if (w.zctx)
        zmq_ctx_term(w.zctx);
    pthread_mutex_destroy(&w.sock_lock);
    return rc;
}
