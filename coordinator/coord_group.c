/*
 * coordinator/coord_group.c — the process group as the coordinator sees it.
 *
 * The coordinator spawns the workers and speculators named on its command line (their output goes
 * to RUN_DIR/logs/ROLE.log), answers each Hello with a Welcome, and supervises: a child that exits
 * (waitpid) or any peer that stops heartbeating for --dead-ms is declared dead. A dead worker
 * breaks the step barrier so the survivors stop waiting, the interrupted step is marked failed (the
 * engine re-runs it), and the worker is spawned again after a short back-off; it re-maps the arena
 * and carries on. A dead speculator only means fewer drafts; it is restarted the same way when it
 * was ours. Peers started by someone else (`attach-speculator`, `debug ROLE`) are supervised but
 * never spawned. RUN_DIR/status is rewritten twice a second for `orochi-launch status`; its steps
 * column is what each peer's heartbeats report (workers and speculators heartbeat from a thread of
 * their own, so the count follows them while they are busy, and a slow peer never makes a healthy
 * one look dead: docs/actor-system.md, "Liveness").
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "coordinator/coord.h"

#define RESPAWN_BACKOFF_US 300000u /* first wait before a restart; doubles per failed start */
#define RESPAWN_BACKOFF_MAX_US 10000000u
#define RESPAWN_MAX_FAILS 8 /* starts in a row that never joined: then give up */

void coord_group_send(coord *c, coord_peer *p, Orochi__Envelope__BodyCase which, void *body)
{
    Orochi__Envelope env;
    rt_send(c->grp.sock, p->ident, p->ident_len, rt_env(&env, which, body));
}

void coord_group_broadcast(coord *c, coord_peer_role role, Orochi__Envelope__BodyCase which,
                           void *body)
{
    for (int i = 0; i < COORD_MAX_PEERS; i++)
        if (c->grp.peers[i].role == role && c->grp.peers[i].connected)
            coord_group_send(c, &c->grp.peers[i], which, body);
}

void coord_group_reconfigure(coord *c)
{
    float shares[LP_N * LLAMA_MAX_PARTS];
    Orochi__Reconfigure r = OROCHI__RECONFIGURE__INIT;
    r.generation = c->part_gen;
    r.n_parts = (uint32_t)c->opt.n_workers;
    r.shares = shares;
    r.n_shares = c->part_set ? llama_partition_pack(&c->part, shares) : 0;
    r.style = c->part_set ? (uint32_t)c->part.style : 0;
    coord_group_broadcast(c, PEER_WORKER, OROCHI__ENVELOPE__BODY_RECONFIGURE, &r);
}

int coord_group_count(const coord *c, coord_peer_role role, bool connected_only)
{
    int n = 0;
    for (int i = 0; i < COORD_MAX_PEERS; i++)
        if (c->grp.peers[i].role == role && (!connected_only || c->grp.peers[i].connected))
            n++;
    return n;
}

bool coord_group_workers_ready(const coord *c)
{
    int ready = 0;
    for (int i = 0; i < COORD_MAX_PEERS; i++)
        if (c->grp.peers[i].role == PEER_WORKER && c->grp.peers[i].connected && c->grp.peers[i].ready)
            ready++;
    return ready == c->opt.n_workers;
}

/* ===== spawning ===== */

static coord_peer *group_slot(coord *c, const char *name)
{
    for (int i = 0; i < COORD_MAX_PEERS; i++)
        if (c->grp.peers[i].role != PEER_FREE && !strcmp(c->grp.peers[i].name, name))
            return &c->grp.peers[i];
    for (int i = 0; i < COORD_MAX_PEERS; i++)
        if (c->grp.peers[i].role == PEER_FREE)
            return &c->grp.peers[i];
    return NULL;
}

int coord_group_spawn(coord *c, coord_peer *p)
{
    char log[4200];
    snprintf(log, sizeof log, "%s/logs/%s.log", c->opt.run_dir, p->name);
    pid_t pid = fork();
    if (pid < 0) {
        rt_log("coordinator", "cannot fork for %s: %s", p->name, strerror(errno));
        return -1;
    }
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        setpgid(0, getppid()); /* stay in the group's process group for `down` */
        execv(p->argv[0], p->argv);
        fprintf(stderr, "cannot exec %s: %s\n", p->argv[0], strerror(errno));
        _exit(127);
    }
    p->child = pid;
    p->started_us = rt_now_us();
    p->last_hb_us = p->started_us;
    p->respawn_at_us = 0;
    rt_log("coordinator", "spawned %s (pid %d)", p->name, (int)pid);
    return 0;
}

static void group_argv(coord_peer *p, int n, ...)
{
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n && i < COORD_MAX_SPAWN_ARGS - 1; i++)
        p->argv[i] = strdup(va_arg(ap, const char *));
    va_end(ap);
}

static void group_argv_add(coord_peer *p, const char *a)
{
    int i = 0;
    while (i < COORD_MAX_SPAWN_ARGS - 1 && p->argv[i])
        i++;
    if (i < COORD_MAX_SPAWN_ARGS - 1)
        p->argv[i] = strdup(a);
}

/* the value of option `name` in p's command line (NULL: not there) */
static const char *group_arg(const coord_peer *p, const char *name)
{
    for (int i = 1; i + 1 < COORD_MAX_SPAWN_ARGS && p->argv[i + 1]; i++)
        if (!strcmp(p->argv[i], name))
            return p->argv[i + 1];
    return NULL;
}

void coord_peer_error(coord_peer *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->last_error, sizeof p->last_error, fmt, ap);
    va_end(ap);
    p->last_error_us = rt_now_us();
}

void coord_ops_answer(coord *c, const char *op, bool ok, const char *fmt, ...)
{
    char path[4400], tmp[4500];
    snprintf(path, sizeof path, "%s/ops/%s.out", c->opt.run_dir, op);
    snprintf(tmp, sizeof tmp, "%s/ops/.%s.out.tmp", c->opt.run_dir, op);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        rt_log("coordinator", "cannot answer operator request %s: %s", op, strerror(errno));
        return;
    }
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    fprintf(f, "%s\n%s\n", ok ? "ok" : "error", text);
    fclose(f);
    rename(tmp, path);
    rt_log("coordinator", "operator request %s: %s%s", op, ok ? "" : "error: ", text);
}

void coord_group_speculator_placement(coord *c, coord_peer *p)
{
    /* Placement (docs/performance.md, measured with bench/placement.py): a model drafter that
     * drafts ahead while the target verifies only pays when it has cores of its own. Sharing cores,
     * it slows every verification step more than its early drafts save (F16 target, Q4_1 drafter,
     * 2 cores: 70.7 tok/s with, 81.9 without), so by default it then waits for the Feedback — and,
     * taking turns, measures at its first draft whether every core drafts faster than one
     * (workers/speculator.c, spec_place), reporting the choice in its heartbeats. */
    const char *kind = group_arg(p, "--kind"), *thr = group_arg(p, "--threads");
    int spec_threads = thr && atoi(thr) > 0 ? atoi(thr) : 1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    bool model_kind = kind && (!strcmp(kind, "model") || !strcmp(kind, "layerskip"));
    if (model_kind && !group_arg(p, "--work-ahead") &&
        (long)c->opt.n_workers * c->opt.threads_per_worker + spec_threads > cores) {
        group_argv_add(p, "--work-ahead");
        group_argv_add(p, "0");
        rt_log("coordinator",
               "%s: %d worker thread(s) + %d drafter thread(s) > %ld cores: no drafting "
               "ahead during verification (set work-ahead=1 to force it)",
               p->name, c->opt.n_workers * c->opt.threads_per_worker, spec_threads, cores);
    }
}

/* --speculator KIND[:k=v,k=v] -> orochi-speculator --kind KIND --k v ... */
static int group_add_speculator(coord *c, const char *spec_s, int ordinal)
{
    char kind[32], args[1024] = "";
    const char *colon = strchr(spec_s, ':');
    size_t kl = colon ? (size_t)(colon - spec_s) : strlen(spec_s);
    if (kl == 0 || kl >= sizeof kind) {
        rt_log("coordinator", "bad --speculator '%s' (KIND[:key=value,...])", spec_s);
        return -1;
    }
    memcpy(kind, spec_s, kl);
    kind[kl] = 0;
    if (colon)
        snprintf(args, sizeof args, "%s", colon + 1);
    char name[64];
    snprintf(name, sizeof name, ordinal ? "%s-%d" : "%s", kind, ordinal);
    coord_peer *p = group_slot(c, name);
    if (!p)
        return -1;
    memset(p, 0, sizeof *p);
    p->role = PEER_SPECULATOR;
    snprintf(p->name, sizeof p->name, "%s", name);
    char bin[4200];
    snprintf(bin, sizeof bin, "%s/orochi-speculator", c->opt.bin_dir);
    group_argv(p, 9, bin, "--run-dir", c->opt.run_dir, "--kind", kind, "--id", name, "--target",
               c->opt.target);
    /* the deepest draft the group may ask for: the adaptive length climbs to width - 1 (from
     * --max-draft, where it starts), and each Feedback says how deep to draft now */
    char maxd[16];
    snprintf(maxd, sizeof maxd, "%d", c->opt.max_width > 1 ? c->opt.max_width - 1 : 1);
    group_argv_add(p, "--max-draft");
    group_argv_add(p, maxd);
    for (char *save = NULL, *kv = strtok_r(args, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        char opt[96];
        if (eq)
            *eq = 0;
        snprintf(opt, sizeof opt, "--%s", kv);
        group_argv_add(p, opt);
        if (eq)
            group_argv_add(p, eq + 1);
    }
    coord_group_speculator_placement(c, p);
    return 0;
}

void coord_group_write_cmd(coord *c, const coord_peer *p)
{
    char path[4400], tmp[4500];
    snprintf(path, sizeof path, "%s/cmd/%s", c->opt.run_dir, p->name);
    snprintf(tmp, sizeof tmp, "%s/cmd/.%s.tmp", c->opt.run_dir, p->name);
    FILE *f = fopen(tmp, "w"); /* renamed into place: `debug` never reads half of it */
    if (!f)
        return;
    for (int a = 0; a < COORD_MAX_SPAWN_ARGS && p->argv[a]; a++)
        fprintf(f, "%s\n", p->argv[a]);
    fclose(f);
    rename(tmp, path);
}

int coord_group_spawn_all(coord *c)
{
    char logs[4200];
    snprintf(logs, sizeof logs, "%s/logs", c->opt.run_dir);
    mkdir(logs, 0755);
    for (int i = 0; i < c->opt.n_workers; i++) {
        char name[32], idx[16], thr[16], bin[4200];
        snprintf(name, sizeof name, "worker-%d", i);
        snprintf(idx, sizeof idx, "%d", i);
        snprintf(thr, sizeof thr, "%d", c->opt.threads_per_worker);
        snprintf(bin, sizeof bin, "%s/orochi-worker", c->opt.bin_dir);
        /* $OROCHI_GPU_WORKER_BIN: the executable a GPU worker is instead (the tests' worker over
         * the CPU stand-in for the GPU op set, orochi-worker-gpuhost; docs/gpu.md) */
        const char *gpu_bin = getenv("OROCHI_GPU_WORKER_BIN");
        if (!strcmp(c->opt.worker_device[i], "gpu") && gpu_bin && *gpu_bin)
            snprintf(bin, sizeof bin, "%s", gpu_bin);
        coord_peer *p = group_slot(c, name);
        memset(p, 0, sizeof *p);
        p->role = PEER_WORKER;
        p->index = i;
        snprintf(p->name, sizeof p->name, "%s", name);
        group_argv(p, 9, bin, "--run-dir", c->opt.run_dir, "--index", idx, "--threads", thr,
                   "--device", c->opt.worker_device[i][0] ? c->opt.worker_device[i] : "cpu");
        if (!strcmp(c->opt.worker_device[i], "gpu")) {
            /* the GPU settings the coordinator was given, each passed on as is */
            const char *gpu_opts[][2] = {{"--gpu-memory", c->opt.gpu_memory},
                                         {"--gpu-graphs", c->opt.gpu_graphs},
                                         {"--gpu-fuse", c->opt.gpu_fuse},
                                         {"--gpu-att-parts", c->opt.gpu_att_parts},
                                         {"--gpu-matmul", c->opt.gpu_matmul},
                                         {"--gpu-weights", c->opt.gpu_weights},
                                         {"--gpu-memory-limit", c->opt.gpu_limit}};
            for (size_t k = 0; k < sizeof gpu_opts / sizeof gpu_opts[0]; k++)
                if (gpu_opts[k][1][0]) {
                    group_argv_add(p, gpu_opts[k][0]);
                    group_argv_add(p, gpu_opts[k][1]);
                }
        }
    }
    for (int i = 0; i < c->opt.n_spec_specs; i++)
        if (group_add_speculator(c, c->opt.spec_specs[i], i))
            return -1;
    c->grp.started_us = rt_now_us();
    char cmds[4200];
    snprintf(cmds, sizeof cmds, "%s/cmd", c->opt.run_dir);
    mkdir(cmds, 0755);
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        coord_peer *p = &c->grp.peers[i];
        if (p->role == PEER_FREE || !p->argv[0])
            continue;
        coord_group_write_cmd(c, p);
        if (c->opt.no_spawn || (c->opt.external && !strcmp(c->opt.external, p->name))) {
            rt_log("coordinator", "not spawning %s: waiting for it to connect", p->name);
            continue;
        }
        if (coord_group_spawn(c, p))
            return -1;
    }
    return 0;
}

/* ===== messages ===== */

static void group_refuse(coord *c, const uint8_t *id, size_t id_len, const char *msg)
{
    Orochi__Error e = OROCHI__ERROR__INIT;
    e.message = (char *)msg;
    e.code = 400;
    Orochi__Envelope env;
    rt_send(c->grp.sock, id, id_len, rt_env(&env, OROCHI__ENVELOPE__BODY_ERROR, &e));
    rt_log("coordinator", "refused a peer: %s", msg);
}

static coord_peer *group_by_ident(coord *c, const uint8_t *id, size_t len)
{
    for (int i = 0; i < COORD_MAX_PEERS; i++)
        if (c->grp.peers[i].role != PEER_FREE && c->grp.peers[i].ident_len == len &&
            !memcmp(c->grp.peers[i].ident, id, len))
            return &c->grp.peers[i];
    return NULL;
}

static void group_hello(coord *c, const uint8_t *id, size_t id_len, const Orochi__Hello *h)
{
    if (id_len > sizeof c->grp.peers[0].ident) { /* a peer picks its routing id (ZMQ_ROUTING_ID) */
        char msg[96];
        snprintf(msg, sizeof msg, "routing id of %zu bytes: at most %zu", id_len,
                 sizeof c->grp.peers[0].ident);
        group_refuse(c, id, id_len, msg);
        return;
    }
    char msg[512];
    coord_peer *p = NULL;
    Orochi__Welcome w = OROCHI__WELCOME__INIT;
    if (h->role == OROCHI__ROLE__ROLE_WORKER) {
        if (h->worker_index >= (uint32_t)c->opt.n_workers) {
            snprintf(msg, sizeof msg, "worker index %u: this group has %d workers (0..%d)",
                     h->worker_index, c->opt.n_workers, c->opt.n_workers - 1);
            group_refuse(c, id, id_len, msg);
            return;
        }
        char name[32];
        snprintf(name, sizeof name, "worker-%u", h->worker_index);
        p = group_slot(c, name);
        if (!p || (p->role != PEER_FREE && p->role != PEER_WORKER)) {
            /* no slot left, or a speculator took the name: a peer never takes another role's */
            snprintf(msg, sizeof msg, "%s: %s", name,
                     p ? "the name is a speculator's" : "too many peers");
            group_refuse(c, id, id_len, msg);
            return;
        }
        /* a live worker keeps its slot: a second Hello for it is an impostor (or confused) */
        if (p->role == PEER_WORKER && p->connected &&
            rt_now_us() - p->last_hb_us < (uint64_t)c->opt.dead_ms * 1000u &&
            (p->child ? (pid_t)h->pid != p->child : (pid_t)h->pid != p->pid)) {
            snprintf(msg, sizeof msg, "%s is already connected (pid %d); Hello from pid %u refused",
                     name, (int)(p->child ? p->child : p->pid), h->pid);
            group_refuse(c, id, id_len, msg);
            return;
        }
        if (p->role == PEER_FREE) {
            memset(p, 0, sizeof *p);
            p->role = PEER_WORKER;
            snprintf(p->name, sizeof p->name, "%s", name);
        }
        p->index = (int)h->worker_index;
        w.worker_index = h->worker_index;
    } else if (h->role == OROCHI__ROLE__ROLE_SPECULATOR) {
        if (h->vocab_size &&
            (h->vocab_size != (uint32_t)c->model->cfg.vocab || h->vocab_hash != c->vocab_hash)) {
            snprintf(msg, sizeof msg,
                     "speculator %s: its vocabulary (%u tokens, hash %016llx) differs "
                     "from the target's (%d tokens, hash %016llx); a draft model must share the "
                     "target's tokenizer",
                     h->id, h->vocab_size, (unsigned long long)h->vocab_hash, c->model->cfg.vocab,
                     (unsigned long long)c->vocab_hash);
            group_refuse(c, id, id_len, msg);
            for (int i = 0; i < COORD_MAX_PEERS; i++)
                if (c->grp.peers[i].role == PEER_SPECULATOR && !strcmp(c->grp.peers[i].name, h->id))
                    c->grp.peers[i].refused = true; /* never restart it: it cannot join */
            return;
        }
        p = group_slot(c, h->id[0] ? h->id : "speculator");
        if (!p) {
            group_refuse(c, id, id_len, "too many peers");
            return;
        }
        if (p->role != PEER_FREE && p->role != PEER_SPECULATOR) {
            /* a speculator named like a worker ("worker-1") must not take the worker's slot */
            snprintf(msg, sizeof msg, "speculator id '%.64s' is the name of a worker", p->name);
            group_refuse(c, id, id_len, msg);
            return;
        }
        if (p->role == PEER_FREE) {
            memset(p, 0, sizeof *p);
            p->role = PEER_SPECULATOR;
            snprintf(p->name, sizeof p->name, "%s", h->id[0] ? h->id : "speculator");
        }
        /* ring index: the slot's position among speculator slots */
        int ring = 0;
        for (int i = 0; i < COORD_MAX_PEERS && &c->grp.peers[i] != p; i++)
            if (c->grp.peers[i].role == PEER_SPECULATOR)
                ring++;
        if (ring >= RT_MAX_SPECULATORS) {
            group_refuse(c, id, id_len, "no free draft ring (at most 8 speculators)");
            p->role = PEER_FREE;
            return;
        }
        p->index = ring;
        snprintf(p->kind, sizeof p->kind, "%s", h->kind);
        p->placement[0] = 0;
        if (p->acr.weight <= 0)
            p->acr.weight = 1.0; /* a newcomer starts with an average vote */
        arena_draft_ring_init(
            (arena_draft_ring *)((uint8_t *)c->grp.rings + (size_t)ring * c->grp.ring_bytes),
            RT_DRAFT_SLOTS);
        w.draft_ring = (uint32_t)ring;
        memset(p->draft_ready, 0, sizeof p->draft_ready);
        memset(p->slot_fed_req, 0, sizeof p->slot_fed_req);
        /* state per request that a Feedback carries or the arena holds: fed every request */
        p->multi = !strcmp(p->kind, "ngram") || !strcmp(p->kind, "replay") ||
                   !strcmp(p->kind, "medusa");
        p->lookup = !strcmp(p->kind, "ngram");
        p->fed_req = p->fed_ctx = p->fed_us = 0;
    } else {
        group_refuse(c, id, id_len, "Hello without a role");
        return;
    }
    memcpy(p->ident, id, id_len);
    p->ident_len = id_len;
    p->pid = (pid_t)h->pid;
    p->connected = true;
    p->ready = false; /* a worker says "ready" in a heartbeat once it has mapped everything */
    p->came_up = false;
    if (p->role != PEER_WORKER) /* a worker's start has succeeded once it is ready */
        p->failed_starts = 0;
    p->hb_steps = 0; /* a new process counts from 0, not from where its predecessor stopped */
    p->last_hb_us = rt_now_us();
    if (!p->child)
        p->started_us = p->last_hb_us;
    w.arena_name = (char *)arena_name(c->grp.arena);
    w.layout_version = ARENA_LAYOUT_VERSION;
    w.arena_generation = arena_generation(c->grp.arena);
    w.n_workers = (uint32_t)c->opt.n_workers;
    w.max_width = (uint32_t)c->opt.step_rows; /* the rows of a step: the arena's layout */
    w.n_ctx = (uint32_t)c->opt.n_ctx;
    w.n_seq = (uint32_t)c->opt.n_seq;
    w.target_model = (char *)c->opt.target;
    float shares[LP_N * LLAMA_MAX_PARTS];
    w.plan_generation = c->part_gen;
    w.plan_shares = shares;
    w.n_plan_shares = c->part_set ? llama_partition_pack(&c->part, shares) : 0;
    w.plan_style = c->part_set ? (uint32_t)c->part.style : 0;
    w.act_bits = (uint32_t)c->opt.act_bits;
    w.kv_dup = c->opt.kv_dup;
    w.kv_type = (uint32_t)c->opt.kv_elem;
    w.target_identity = c->model ? c->model->identity : 0;
    coord_group_send(c, p, OROCHI__ENVELOPE__BODY_WELCOME, &w);
    rt_log("coordinator", "%s joined (pid %u%s%s)", p->name, h->pid, h->kind[0] ? ", kind " : "",
           h->kind);
}

static void group_dispatch(coord *c, const uint8_t *id, size_t id_len, Orochi__Envelope *env)
{
    if (env->body_case == OROCHI__ENVELOPE__BODY_HELLO) {
        group_hello(c, id, id_len, env->hello);
        return;
    }
    coord_peer *p = group_by_ident(c, id, id_len);
    if (!p || !p->connected) {
        if (c->opt.trace)
            rt_log("coordinator", "message %d from an unknown peer ignored", env->body_case);
        return;
    }
    p->last_hb_us = rt_now_us();
    switch (env->body_case) {
    case OROCHI__ENVELOPE__BODY_HEARTBEAT:
        p->hb_steps = env->heartbeat->steps;
        const char *pl = env->heartbeat->placement;
        if (pl && pl[0] && strncmp(pl, p->placement, sizeof p->placement - 1)) {
            snprintf(p->placement, sizeof p->placement, "%s", pl);
            rt_log("coordinator", "%s placement: %s", p->name, p->placement);
        }
        /* a worker being swapped out is never rung again: the engine waits for its successor */
        p->ready = env->heartbeat->state && !strcmp(env->heartbeat->state, "ready") &&
                   p->swap != SWAP_STOPPING;
        if (p->ready && !p->came_up) {
            p->came_up = true;
            p->failed_starts = 0;
        }
        break;
    case OROCHI__ENVELOPE__BODY_STEP_DONE:
        if (p->role == PEER_WORKER)
            c->on.step_done(c, p, env->step_done);
        break;
    case OROCHI__ENVELOPE__BODY_DRAFT_READY:
        if (p->role == PEER_SPECULATOR)
            c->on.draft_ready(c, p, env->draft_ready);
        break;
    case OROCHI__ENVELOPE__BODY_ERROR:
        rt_log("coordinator", "%s reports: %s", p->name, env->error->message);
        coord_peer_error(p, "%s", env->error->message);
        break;
    default:
        rt_log("coordinator", "unexpected message %d from %s ignored", env->body_case, p->name);
    }
}

void coord_group_pump(coord *c, int timeout_ms)
{
    zmq_pollitem_t it = {c->grp.sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) <= 0)
        return;
    for (int budget = 0; budget < 256; budget++) {
        uint8_t id[256];
        size_t id_len = 0;
        bool bad;
        char err[256];
        Orochi__Envelope *env =
            rt_recv(c->grp.sock, true, id, sizeof id, &id_len, &bad, err, sizeof err);
        if (bad) {
            rt_log("coordinator", "ignoring a bad frame: %s", err);
            if (strstr(err, "protocol version"))
                group_refuse(c, id, id_len, err);
            continue;
        }
        if (!env)
            break;
        group_dispatch(c, id, id_len, env);
        rt_free(env);
    }
}

/* ===== supervision ===== */

static void group_lost(coord *c, coord_peer *p, pid_t pid, const char *why)
{
    rt_log("coordinator", "%s (pid %d) lost: %s", p->name, (int)pid, why);
    coord_peer_error(p, "pid %d lost: %s", (int)pid, why);
    bool was_connected = p->connected;
    /* it died before joining, or a worker before it was ready (its setup failed): back off */
    if (!was_connected || (p->role == PEER_WORKER && !p->came_up))
        p->failed_starts++;
    p->connected = false;
    p->ident_len = 0;
    if (p->role == PEER_WORKER && was_connected)
        c->on.worker_lost(c, p);
    if (p->argv[0]) {
        if (p->child)
            kill(p->child, SIGKILL); /* a hung child: make sure it is gone before its successor */
        uint64_t wait = RESPAWN_BACKOFF_US;
        for (int i = 0; i < p->failed_starts && wait < RESPAWN_BACKOFF_MAX_US; i++)
            wait *= 2;
        p->respawn_at_us =
            rt_now_us() + (wait < RESPAWN_BACKOFF_MAX_US ? wait : RESPAWN_BACKOFF_MAX_US);
        if (p->refused || p->failed_starts >= RESPAWN_MAX_FAILS) {
            p->respawn_at_us = 0; /* it cannot join: restarting it again would only spin */
            rt_log("coordinator", "not restarting %s: %s", p->name,
                   p->refused ? "the coordinator refused it"
                              : "it failed to start too many times in a row");
        }
    } else if (p->role == PEER_SPECULATOR) {
        p->role = PEER_FREE; /* an attached speculator that left: forget it */
    }
    pthread_mutex_lock(&c->met.lock);
    c->met.restarts++;
    pthread_mutex_unlock(&c->met.lock);
}

void coord_group_serve(coord *c, int timeout_ms)
{
    coord_group_pump(c, timeout_ms);
    coord_group_supervise(c);
}

void coord_group_supervise(coord *c)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < COORD_MAX_PEERS; i++) {
            coord_peer *p = &c->grp.peers[i];
            if (p->role == PEER_FREE || p->child != pid)
                continue;
            char why[64];
            if (WIFSIGNALED(status))
                snprintf(why, sizeof why, "killed by signal %d", WTERMSIG(status));
            else
                snprintf(why, sizeof why, "exited with status %d", WEXITSTATUS(status));
            p->child = 0;
            if (!c->on.peer_exit(c, p, why))
                group_lost(c, p, pid, why);
        }
    }
    uint64_t now = rt_now_us();
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        coord_peer *p = &c->grp.peers[i];
        if (p->role == PEER_FREE)
            continue;
        if (p->connected && now - p->last_hb_us > (uint64_t)c->opt.dead_ms * 1000u)
            group_lost(c, p, p->child ? p->child : p->pid, "no heartbeat");
        if (!p->connected && !p->child && p->argv[0] && p->respawn_at_us &&
            now >= p->respawn_at_us && !coord_stop_flag) {
            p->restarts++;
            coord_group_spawn(c, p);
        }
    }
    if (now - c->grp.last_hb_sent_us > (uint64_t)c->opt.heartbeat_ms * 1000u) {
        Orochi__Heartbeat hb = OROCHI__HEARTBEAT__INIT;
        hb.time_us = now;
        hb.steps = c->grp.step_counter;
        hb.state = "serving";
        coord_group_broadcast(c, PEER_WORKER, OROCHI__ENVELOPE__BODY_HEARTBEAT, &hb);
        coord_group_broadcast(c, PEER_SPECULATOR, OROCHI__ENVELOPE__BODY_HEARTBEAT, &hb);
        c->grp.last_hb_sent_us = now;
    }
    if (now - c->grp.last_status_us > 500000u) {
        coord_group_write_status(c);
        c->grp.last_status_us = now;
    }
    if (!c->met.last_mem_us || now - c->met.last_mem_us > 10000000u) { /* smaps_rollup walks page tables */
        coord_group_memory_gauges(c);
        c->met.last_mem_us = now;
    }
}

/* PSS of a process in bytes: file pages, shared memory, anonymous. false when unreadable. */
static bool proc_pss(int pid, unsigned long long out[3])
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/smaps_rollup", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    out[0] = out[1] = out[2] = 0;
    static const char *const keys[3] = {"Pss_File:", "Pss_Shmem:", "Pss_Anon:"};
    while (fgets(line, sizeof line, f))
        for (int k = 0; k < 3; k++)
            if (!strncmp(line, keys[k], strlen(keys[k])))
                out[k] = strtoull(line + strlen(keys[k]), NULL, 10) * 1024;
    fclose(f);
    return true;
}

/* whether pid is an orochi process of this machine (a peer not spawned here may run elsewhere) */
static bool proc_orochi(int pid)
{
    char path[64], comm[32] = "";
    snprintf(path, sizeof path, "/proc/%d/comm", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool yes = fgets(comm, sizeof comm, f) && !strncmp(comm, "orochi-", 7);
    fclose(f);
    return yes;
}

void coord_group_memory_gauges(coord *c)
{
    char text[sizeof c->met.mem_text];
    size_t n = (size_t)snprintf(
        text, sizeof text,
        "# HELP orochi_memory_pss_bytes Proportional set size of each role's process (a page "
        "shared by k processes counts 1/k): kind files (the shared packed-weights cache, the model "
        "file, binaries), arena (shared memory), private (anonymous).\n"
        "# TYPE orochi_memory_pss_bytes gauge\n");
    static const char *const kinds[3] = {"files", "arena", "private"};
    unsigned long long v[3];
    if (proc_pss((int)getpid(), v))
        for (int k = 0; k < 3 && n < sizeof text; k++)
            n += (size_t)snprintf(text + n, sizeof text - n,
                                  "orochi_memory_pss_bytes{role=\"coordinator\",kind=\"%s\"} %llu\n",
                                  kinds[k], v[k]);
    for (int i = 0; i < COORD_MAX_PEERS && n < sizeof text; i++) {
        const coord_peer *p = &c->grp.peers[i];
        int pid = (int)(p->child ? p->child : p->pid);
        if (p->role == PEER_FREE || !p->connected || pid <= 0 || (!p->child && !proc_orochi(pid)) ||
            !proc_pss(pid, v))
            continue; /* a peer on another machine: its pid means nothing here */
        for (int k = 0; k < 3 && n < sizeof text; k++)
            n += (size_t)snprintf(text + n, sizeof text - n,
                                  "orochi_memory_pss_bytes{role=\"%s\",kind=\"%s\"} %llu\n",
                                  p->name, kinds[k], v[k]);
    }
    if (n >= sizeof text)
        text[sizeof text - 1] = 0;
    pthread_mutex_lock(&c->met.lock);
    memcpy(c->met.mem_text, text, sizeof text);
    pthread_mutex_unlock(&c->met.lock);
}

/* the end of a status line: the latest trouble and how long ago, if any */
static void group_status_error(FILE *f, const char *err, uint64_t at_us, uint64_t now)
{
    if (err[0])
        fprintf(f, "  last error %.0fs ago: %s", (now - at_us) / 1e6, err);
    fputc('\n', f);
}

void coord_group_write_status(coord *c)
{
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/status", c->opt.run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    uint64_t now = rt_now_us();
    pthread_mutex_lock(&c->met.lock);
    uint64_t steps = c->met.steps; /* forward passes (a free run's as its tokens come) */
    pthread_mutex_unlock(&c->met.lock);
    fprintf(f, "%-16s pid %-7d uptime %7.1fs  heartbeat      -  steps %llu  step %.2fms",
            "coordinator", (int)getpid(), (now - c->grp.started_us) / 1e6, (unsigned long long)steps,
            c->step_ema_us / 1e3);
    if (c->tracer)
        fputs("  tracing", f);
    group_status_error(f, c->met.last_error, c->met.last_error_us, now);
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        const coord_peer *p = &c->grp.peers[i];
        if (p->role == PEER_FREE)
            continue;
        int pid = (int)(p->child ? p->child : p->pid);
        if (p->connected) {
            fprintf(f, "%-16s pid %-7d uptime %7.1fs  heartbeat %5.0fms  steps %llu  restarts %d",
                    p->name, pid, (now - p->started_us) / 1e6, (now - p->last_hb_us) / 1e3,
                    (unsigned long long)p->hb_steps, p->restarts);
            if (p->role == PEER_SPECULATOR)
                fprintf(f,
                        "  kind %s  acr %.3f  weight %.3f  draft %.2fms  reply %.1fms  accepted "
                        "%.2f  benched %llu",
                        p->kind, p->acr.acr, p->acr.weight, p->draft_work_ema_us / 1e3,
                        p->reply_ema_us / 1e3, p->accept_ema, (unsigned long long)p->benched_total);
            if (p->role == PEER_SPECULATOR && p->placement[0])
                fprintf(f, "  placement: %s", p->placement);
            else
                fprintf(f, "  step %.2fms  barrier %.2fms", p->step_ema_us / 1e3,
                        p->wait_ema_us / 1e3);
        } else {
            fprintf(f, "%-16s pid %-7d (not connected%s)  restarts %d", p->name, (int)p->child,
                    p->detaching ? ", detaching"
                    : p->child   ? ", starting"
                                 : "",
                    p->restarts);
        }
        if (p->swaps || p->swap)
            fprintf(f, "  swaps %d%s", p->swaps, p->swap ? " (swapping)" : "");
        group_status_error(f, p->last_error, p->last_error_us, now);
    }
    fprintf(f,
            "%-16s width %d  speculation length %d  tree %s  vote %s  adaptive %s  guard %s"
            "  plain %.2fms/token  speculative %.2fms/token  plan %s\n",
            "controllers", c->width, c->spec_len, c->opt.tree ? "on" : "off",
            c->opt.vote == VOTE_MAJORITY ? "majority"
            : c->opt.vote == VOTE_UNION  ? "union"
                                     : "off",
            c->opt.adaptive ? "on" : "off",
            !c->opt.guard_enabled ? "disabled"
            : c->guard.on     ? "on (speculating)"
                              : "off (plain)",
            c->guard.base * 1e3, c->guard.spec * 1e3, c->opt.plan_path ? c->opt.plan_path : "none");
    fprintf(f, "%-16s %d  active %d  K/V held %.1f MB (every slot at full context: %.1f GB)\n",
            "slots", c->opt.n_seq, c->met.slots_active, (double)c->met.kv_held / 1e6,
            (double)c->met.kv_full / 1e9);
    /* the speculator gauges for /metrics */
    char text[sizeof c->met.spec_text];
    size_t n = 0;
    n += (size_t)snprintf(
        text + n, sizeof text - n,
        "# HELP orochi_speculator_acr Average acceptance rate of a speculator's drafts.\n"
        "# TYPE orochi_speculator_acr gauge\n");
    for (int i = 0; i < COORD_MAX_PEERS && n < sizeof text; i++) {
        const coord_peer *p = &c->grp.peers[i];
        if (p->role == PEER_SPECULATOR)
            n += (size_t)snprintf(text + n, sizeof text - n,
                                  "orochi_speculator_acr{id=\"%s\",kind=\"%s\"} %.4f\n"
                                  "orochi_speculator_weight{id=\"%s\",kind=\"%s\"} %.4f\n"
                                  "orochi_speculator_up{id=\"%s\",kind=\"%s\"} %d\n"
                                  "orochi_speculator_drafted_tokens_total{id=\"%s\"} %llu\n"
                                  "orochi_speculator_accepted_tokens_total{id=\"%s\"} %llu\n",
                                  p->name, p->kind, p->acr.acr, p->name, p->kind, p->acr.weight,
                                  p->name, p->kind, p->connected ? 1 : 0, p->name,
                                  (unsigned long long)p->drafted, p->name,
                                  (unsigned long long)p->accepted);
    }
    pthread_mutex_lock(&c->met.lock);
    memcpy(c->met.spec_text, text, sizeof text);
    c->met.spec_text[sizeof c->met.spec_text - 1] = 0;
    pthread_mutex_unlock(&c->met.lock);
    fclose(f);
    rename(tmp, path);
}

void coord_group_shutdown(coord *c)
{
    Orochi__Shutdown s = OROCHI__SHUTDOWN__INIT;
    s.reason = "coordinator stopping";
    coord_group_broadcast(c, PEER_WORKER, OROCHI__ENVELOPE__BODY_SHUTDOWN, &s);
    coord_group_broadcast(c, PEER_SPECULATOR, OROCHI__ENVELOPE__BODY_SHUTDOWN, &s);
    uint64_t deadline = rt_now_us() + 1500000u;
    for (;;) {
        int alive = 0;
        for (int i = 0; i < COORD_MAX_PEERS; i++) {
            coord_peer *p = &c->grp.peers[i];
            if (p->child && waitpid(p->child, NULL, WNOHANG) == 0)
                alive++;
            else
                p->child = 0;
        }
        if (!alive)
            break;
        if (rt_now_us() > deadline) {
            for (int i = 0; i < COORD_MAX_PEERS; i++)
                if (c->grp.peers[i].child) {
                    kill(c->grp.peers[i].child, SIGKILL);
                    waitpid(c->grp.peers[i].child, NULL, 0);
                    c->grp.peers[i].child = 0;
                }
            break;
        }
        usleep(20000);
    }
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        coord_free_argv(c->grp.peers[i].argv);
        coord_free_argv(c->grp.peers[i].old_argv); /* a swap cut short by the stop */
    }
}

void coord_free_argv(char **argv)
{
    for (int i = 0; i < COORD_MAX_SPAWN_ARGS; i++) {
        free(argv[i]);
        argv[i] = NULL;
    }
}
