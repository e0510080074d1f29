/*
 * orochi-coordinator — the brain of a process group: owns the run directory, the shared-memory
 * arena and the control socket, spawns and supervises the workers and speculators, serves the
 * HTTP API, and runs the verification loop (the engine: coordinator/engine.h).
 *
 * Start-up: load the target's metadata and tokenizer (the weights stay mapped but untouched: the
 * coordinator computes nothing), lay out the arena (step inputs + barrier, the llama shared block
 * of KV cache and activations, logits, draft rings), bind ROUTER at ipc://RUN_DIR/ctl, spawn the
 * roles, start HTTP. The main loop then alternates between the control socket, supervision and
 * the next queued request. SIGTERM/SIGINT drain it: new requests are answered 503 and /health
 * says "draining", the requests already admitted or queued run to their end (at most --drain-ms),
 * then workers and speculators get Shutdown, children are reaped, the arena is unlinked. A second
 * signal stops at once (requests still running fail with 503).
 */
#include <errno.h>
#include <malloc.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <zmq.h>

#include "coordinator/coord.h"
#include "model/llama_cuda.h"

volatile int coord_stop_flag;
static volatile sig_atomic_t coord_drain_flag;

static void coord_on_signal(int sig)
{
    (void)sig;
    if (coord_drain_flag)
        coord_stop_flag = 1; /* the second signal: stop now */
    coord_drain_flag = 1;
}

/* ===== draining ===== */

/* The requests handed to the engine, so a drain knows when the last one has ended. HTTP threads
 * add (under `lock`), the main loop reads. */
#define COORD_TRACKED 256
#define COORD_DRAIN_FLUSH_US 1000000u
typedef struct {
    pthread_mutex_t lock;
    bool draining;
    coord_request *reqs[COORD_TRACKED];
    int n;
    coord *c;
} coord_drain;

/* Forget the requests that have ended; returns how many are still running. Caller holds lock. */
static int coord_drain_prune(coord_drain *d)
{
    int kept = 0;
    for (int i = 0; i < d->n; i++) {
        coord_outcome o;
        coord_request_outcome(d->reqs[i], &o);
        if (o.state == COORD_REQ_RUNNING)
            d->reqs[kept++] = d->reqs[i];
        else
            coord_request_unref(&d->reqs[i]);
    }
    d->n = kept;
    return kept;
}

/* The HTTP side's submit: refused while draining, else tracked and queued. */
static int coord_drain_submit(void *ctx, coord_request *req)
{
    coord_drain *d = ctx;
    pthread_mutex_lock(&d->lock);
    if (d->draining) {
        pthread_mutex_unlock(&d->lock);
        coord_request_fail(req, 503,
                           "the coordinator is draining (shutting down or restarting); "
                           "retry shortly");
        return -1;
    }
    if (coord_drain_prune(d) < COORD_TRACKED)
        d->reqs[d->n++] = coord_request_ref(req);
    int rc = coord_engine_submit(d->c, req);
    pthread_mutex_unlock(&d->lock);
    return rc;
}

static int coord_drain_health(void *ctx, char *msg, size_t len)
{
    coord_drain *d = ctx;
    pthread_mutex_lock(&d->lock);
    bool draining = d->draining;
    pthread_mutex_unlock(&d->lock);
    if (draining) {
        snprintf(msg, len, "draining: the coordinator is shutting down");
        return 0;
    }
    return coord_engine_health(d->c, msg, len);
}

static char *coord_drain_metrics(void *ctx)
{
    coord_drain *d = ctx;
    return coord_engine_metrics(d->c);
}

static char *coord_drain_status(void *ctx)
{
    coord_drain *d = ctx;
    return coord_engine_status(d->c);
}

/* --workers: "N" (CPU workers), or a comma list of DEVICE:N (cpu, gpu), the parts in that order:
 * "cpu:2,gpu:1" is parts 0 and 1 on the CPU and part 2 on the GPU. 0, or -1 with the reason on
 * stderr. */
static int coord_parse_workers(coord *c, const char *spec)
{
    int n = 0;
    const char *s = spec;
    while (*s) {
        const char *dev = "cpu";
        if (!strncmp(s, "cpu:", 4) || !strncmp(s, "gpu:", 4)) {
            dev = !strncmp(s, "gpu:", 4) ? "gpu" : "cpu";
            s += 4;
        }
        char *end;
        long k = strtol(s, &end, 10);
        if (end == s || k < 1 || k > RT_MAX_WORKERS || n + k > RT_MAX_WORKERS ||
            (*end && *end != ',')) {
            fprintf(stderr,
                    "orochi-coordinator: --workers %s: want N or DEVICE:N[,DEVICE:N...] with "
                    "DEVICE cpu or gpu, %d workers at most\n",
                    spec, RT_MAX_WORKERS);
            return -1;
        }
        for (long i = 0; i < k; i++)
            snprintf(c->opt.worker_device[n++], sizeof c->opt.worker_device[0], "%s", dev);
        s = *end ? end + 1 : end;
    }
    c->opt.n_workers = n;
    return 0;
}

static void coord_usage(FILE *out)
{
    fprintf(
        out,
        "usage: orochi-coordinator --run-dir D --target M [--port P] [--bind ADDR]\n"
        "         [--workers N|cpu:N[,gpu:M]] [--threads-per-worker T]\n"
        "         [--speculator KIND[:k=v,...]]...\n"
        "         [--max-width W] [--n-ctx C] [--max-draft S] [--draft-wait-ms MS]\n"
        "         [--draft-wait measured|fixed]\n"
        "         [--api-key KEY] [--external ROLE] [--no-spawn] [--heartbeat-ms MS]\n"
        "         [--dead-ms MS] [--tree on|off] [--vote majority|union|off]\n"
        "         [--adaptive on|off] [--width N] [--acr-reward-threshold R]\n"
        "         [--acr-punish-threshold P] [--reward-factor F] [--punish-factor F]\n"
        "         [--decision-threshold N] [--max-batch N|auto] [--prefill-width N]\n"
        "         [--kv-release S]\n"
        "         [--guard on|off] [--guard-window N] [--guard-probe N] [--plan FILE]\n"
        "         [--drain-ms MS] [--api-key-file F] [--max-queue N] [--free-run on|off]\n"
        "         [--act-bits auto|16|8] [--kv-dup on|off] [--prefix-reuse on|off]\n"
        "         [--prefix-share on|off]\n"
        "         [--lookup-run on|off] [--kv f32|f16] [--gpu-memory auto|mapped|mirror]\n"
        "         [--gpu-graphs on|off] [--gpu-fuse on|off] [--gpu-att-parts auto|N]\n"
        "         [--gpu-matmul auto|cuda|tensor] [--gpu-weights auto|device|mapped]\n"
        "         [--gpu-memory-limit BYTES] [--chat-template FILE] [--trace]\n"
        "         [--grammar-drafts on|off]\n"
        "  Serves the OpenAI-compatible API on http://ADDR:P (default 127.0.0.1:8080) with N\n"
        "  CPU workers (default 2) splitting the target by columns (gpu:M adds GPU workers, in\n"
        "  a build with CUDA; a plan's \"partition\" gives the shares), and the speculators\n"
        "  (layerskip, model, ngram). --external ROLE: do not spawn ROLE, wait for it to\n"
        "  connect (orochi-launch debug).\n"
        "  Draft wait: each step waits for a speculator's draft only while the tokens it is\n"
        "  expected to bring (its measured acceptance x the measured step time) are worth more\n"
        "  than the wait, given its measured reply time; --draft-wait-ms (default 200) caps\n"
        "  every wait. --draft-wait fixed waits for every speculator up to --draft-wait-ms\n"
        "  (acceptance measurements: a large value then means 'always wait for the draft'), as\n"
        "  does a request that samples with a seed (reproducible output needs the same trees).\n"
        "  Guard (default on): every --guard-window (8) single-request cycles the cost per token\n"
        "  is compared with plain decoding's; speculation that does not pay is switched off\n"
        "  (W = 1, speculators idle) and probed again after --guard-probe (48) plain cycles.\n"
        "  Grammar drafts (default on): the text a request's grammar forces (structured output,\n"
        "  a tool call) is drafted as a chain and verified, with or without speculators.\n"
        "  Prompts are computed in steps of up to --prefill-width rows (default 12, at least\n"
        "  --max-width), which also carry a token of each other active request (in turns when\n"
        "  more are active than half the rows hold).\n"
        "  --max-batch (requests decoded together, the sequence slots): auto (default) gives a\n"
        "  group of CPU workers as many as half the memory holds at full --n-ctx (4 to %d;\n"
        "  the K/V rows take memory only once written), one with a GPU worker 4 (the\n"
        "  registered arena is pinned whole); docs/memory.md, \"Sequence slots\".\n"
        "  --kv-release S (default 30; 0: never): a slot idle for S seconds gives its K/V pages\n"
        "  back to the system, and with them the rows a later prompt could start from (CPU\n"
        "  groups).\n"
        "  --prefix-share (default on; CPU groups): a prompt that begins as another slot's\n"
        "  rows reads those rows where they are instead of a copy of them, so a common\n"
        "  beginning (a system prompt, a conversation's earlier turns) is held once.\n"
        "  Free run (default on): greedy requests, alone or batched, with no speculator\n"
        "  connected or the guard keeping them off, are decoded by the workers themselves\n"
        "  (each step's argmax is the next token); the coordinator takes the tokens every\n"
        "  few steps instead of handing each one over.\n"
        "  Lookup run (default on): when every connected speculator is ngram, greedy\n"
        "  requests run free with the workers drafting by prompt lookup themselves, each row\n"
        "  as far as the measured acceptance and the step-time curve (the plan's, else the\n"
        "  group's own, measured once) say it pays (docs/speculation.md, \"Prompt lookup in\n"
        "  the free run\"); off: ngram drafts go through verification cycles.\n"
        "  --act-bits auto (default): the workers quantize the activations of K-quant\n"
        "  matmuls to 8 bits and of the other quantized types to 16; 8 or 16: all of them\n"
        "  (8: faster batches and verification steps, larger rounding; `orochi run\n"
        "  --act-bits` with the same value gives the same tokens).\n"
        "  --kv-dup (default on when every worker is a CPU): without a plan's partition the\n"
        "  workers split the query heads evenly, a KV head whose query heads two workers share\n"
        "  being projected by both (balanced attention; off: each worker whole KV heads).\n"
        "  --kv f16: the K/V cache in the arena in f16 instead of f32 (half the bytes every\n"
        "  step's attention reads: faster batches and long contexts; `orochi run --kv f16`\n"
        "  gives the same tokens).\n"
        "  --gpu-memory (auto), --gpu-graphs (on), --gpu-fuse (on) and --gpu-att-parts (auto)\n"
        "  go to the GPU workers: where a GPU part keeps its activations and K/V rows (mapped:\n"
        "  read in place in the arena, for a GPU that shares the host's memory; mirror: device\n"
        "  copies, for a discrete card; auto picks by the device), whether a sole GPU part\n"
        "  replays steps as CUDA graphs, whether it runs the fused launches or one launch per\n"
        "  op (the same bits), and how many parts its attention cuts a long key stream into\n"
        "  (auto: by length and width; 1: never; docs/gpu.md); --gpu-matmul (auto): the\n"
        "  quantized matrices on tensor cores (auto, tensor) or CUDA cores (cuda).\n"
        "  --gpu-weights (auto) and --gpu-memory-limit (none) go to them too: a GPU part keeps\n"
        "  only its partition's rows of the weights in device memory (device), or reads them\n"
        "  in place from the model file (mapped; auto: mapped on an integrated GPU), within\n"
        "  that much device memory (e.g. 40G; docs/gpu.md, \"One copy\").\n"
        "  Chat requests are rendered with the model file's chat template, run as written by\n"
        "  orochi's Jinja interpreter (docs/models.md); --chat-template FILE uses that Jinja\n"
        "  template instead. A conversation the template refuses (raise_exception) or a\n"
        "  template it cannot run answers 400 with the reason.\n"
        "  Prefix reuse (default on): a prompt that begins with tokens a sequence slot has\n"
        "  committed starts from their K/V (usage.prompt_tokens_details.cached_tokens).\n"
        "  --plan FILE: the plan `orochi profile` wrote (width and length per context bucket,\n"
        "  plain step time); reread whenever the file changes.\n"
        "  Liveness: a peer silent for --dead-ms (3000) is declared dead and replaced; peers\n"
        "  heartbeat from a thread of their own, so a slow peer never makes another look dead.\n"
        "  SIGTERM drains: new requests get 503, admitted ones finish (at most --drain-ms,\n"
        "  default 10000), then the group stops; a second SIGTERM stops at once.\n"
        "  Access: the API key is --api-key, else the first line of --api-key-file, else\n"
        "  $OROCHI_API_KEY; none: no authentication. At most --max-queue (256) requests wait\n"
        "  for a sequence slot; more get 429 with Retry-After. RUN_DIR (the control socket's\n"
        "  directory) is made private to the user (0700). See docs/security.md.\n",
        RT_MAX_SEQ);
}

/* The API key: --api-key, else the first line of key_file, else $OROCHI_API_KEY (a key on the
 * command line is visible to every user in /proc; a file or the environment is not). 0, or -1
 * with the reason on stderr. */
static int coord_api_key(coord *c, const char *key_file)
{
    if (c->opt.api_key)
        return 0;
    const char *src = NULL;
    if (key_file) {
        FILE *f = fopen(key_file, "r");
        if (!f || !fgets(c->opt.api_key_buf, sizeof c->opt.api_key_buf, f)) {
            fprintf(stderr, "orochi-coordinator: --api-key-file %s: %s\n", key_file,
                    f ? "empty" : strerror(errno));
            if (f)
                fclose(f);
            return -1;
        }
        fclose(f);
        src = key_file;
    } else {
        const char *env = getenv("OROCHI_API_KEY");
        if (!env || !*env)
            return 0;
        if (strlen(env) >= sizeof c->opt.api_key_buf) {
            fprintf(stderr, "orochi-coordinator: $OROCHI_API_KEY is too long (at most %zu bytes)\n",
                    sizeof c->opt.api_key_buf - 1);
            return -1;
        }
        snprintf(c->opt.api_key_buf, sizeof c->opt.api_key_buf, "%s", env);
        src = "$OROCHI_API_KEY";
    }
    c->opt.api_key_buf[strcspn(c->opt.api_key_buf, "\r\n")] = '\0';
    if (!c->opt.api_key_buf[0]) {
        fprintf(stderr, "orochi-coordinator: the API key from %s is empty\n", src);
        return -1;
    }
    c->opt.api_key = c->opt.api_key_buf;
    return 0;
}

/* The rows a step may carry (the arena's): a prompt chunk's, a row for every slot, and room for
 * every request's tree at once — --max-width each, as a request alone has it, so that speculation
 * still has room when the slots fill (a batch's verification width grows with its requests:
 * coord_engine.c) — up to RT_MAX_WIDTH. */
static void coord_set_step_rows(coord *c)
{
    int trees = c->opt.n_seq * c->opt.max_width, rows = c->opt.chunk_rows;
    rows = c->opt.n_seq > rows ? c->opt.n_seq : rows;
    rows = trees > rows ? trees : rows;
    c->opt.step_rows = rows < RT_MAX_WIDTH ? rows : RT_MAX_WIDTH;
}

/* A GPU setting (option code o of coord_parse), checked and kept as given: the coordinator passes
 * it on to its GPU workers (coord_group.c). 0, or -1 after saying what the option takes. */
static int coord_gpu_opt(coord *c, int o, const char *val)
{
    size_t bytes;
    struct {
        int code;
        const char *name, *takes;
        bool ok;
        char *dst;
        size_t len;
    } t[] = {
        {23, "gpu-memory", "auto, mapped or mirror", llama_gpu_memory_parse(val) >= 0,
         c->opt.gpu_memory, sizeof c->opt.gpu_memory},
        {24, "gpu-graphs", "on or off", !strcmp(val, "on") || !strcmp(val, "off"),
         c->opt.gpu_graphs, sizeof c->opt.gpu_graphs},
        {25, "gpu-fuse", "on or off", !strcmp(val, "on") || !strcmp(val, "off"), c->opt.gpu_fuse,
         sizeof c->opt.gpu_fuse},
        {26, "gpu-att-parts", "auto or 1..256", llama_gpu_att_parts_parse(val) >= 0,
         c->opt.gpu_att_parts, sizeof c->opt.gpu_att_parts},
        {27, "gpu-matmul", "auto, cuda or tensor", llama_gpu_matmul_parse(val) >= 0,
         c->opt.gpu_matmul, sizeof c->opt.gpu_matmul},
        {32, "gpu-weights", "auto, device or mapped", llama_gpu_weights_parse(val) >= 0,
         c->opt.gpu_weights, sizeof c->opt.gpu_weights},
        {33, "gpu-memory-limit", "a byte count (40G, 512M; 0: none)",
         !llama_gpu_bytes_parse(val, &bytes), c->opt.gpu_limit, sizeof c->opt.gpu_limit},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (t[i].code != o)
            continue;
        if (!t[i].ok || strlen(val) >= t[i].len) {
            fprintf(stderr, "orochi-coordinator: --%s takes %s, got '%s'\n", t[i].name, t[i].takes,
                    val);
            return -1;
        }
        snprintf(t[i].dst, t[i].len, "%s", val);
        return 0;
    }
    return -1;
}

static int coord_parse(coord *c, int argc, char **argv)
{
    static const struct option opts[] = {{"run-dir", required_argument, 0, 'r'},
                                         {"target", required_argument, 0, 'm'},
                                         {"port", required_argument, 0, 'p'},
                                         {"bind", required_argument, 0, 'b'},
                                         {"workers", required_argument, 0, 'w'},
                                         {"threads-per-worker", required_argument, 0, 't'},
                                         {"speculator", required_argument, 0, 's'},
                                         {"max-width", required_argument, 0, 'W'},
                                         {"n-ctx", required_argument, 0, 'c'},
                                         {"max-draft", required_argument, 0, 'd'},
                                         {"draft-wait-ms", required_argument, 0, 'D'},
                                         {"draft-wait", required_argument, 0, 9},
                                         {"api-key", required_argument, 0, 'k'},
                                         {"external", required_argument, 0, 'x'},
                                         {"no-spawn", no_argument, 0, 'N'},
                                         {"heartbeat-ms", required_argument, 0, 'H'},
                                         {"dead-ms", required_argument, 0, 'X'},
                                         {"tree", required_argument, 0, 'T'},
                                         {"vote", required_argument, 0, 'V'},
                                         {"adaptive", required_argument, 0, 'A'},
                                         {"width", required_argument, 0, 'Y'},
                                         {"acr-reward-threshold", required_argument, 0, 1},
                                         {"acr-punish-threshold", required_argument, 0, 2},
                                         {"reward-factor", required_argument, 0, 3},
                                         {"punish-factor", required_argument, 0, 4},
                                         {"decision-threshold", required_argument, 0, 5},
                                         {"max-batch", required_argument, 0, 8},
                                         {"guard", required_argument, 0, 10},
                                         {"guard-window", required_argument, 0, 11},
                                         {"guard-probe", required_argument, 0, 12},
                                         {"plan", required_argument, 0, 13},
                                         {"drain-ms", required_argument, 0, 14},
                                         {"api-key-file", required_argument, 0, 15},
                                         {"max-queue", required_argument, 0, 16},
                                         {"free-run", required_argument, 0, 17},
                                         {"act-bits", required_argument, 0, 18},
                                         {"kv-dup", required_argument, 0, 19},
                                         {"prefix-reuse", required_argument, 0, 20},
                                         {"lookup-run", required_argument, 0, 21},
                                         {"kv", required_argument, 0, 22},
                                         {"gpu-memory", required_argument, 0, 23},
                                         {"gpu-graphs", required_argument, 0, 24},
                                         {"gpu-fuse", required_argument, 0, 25},
                                         {"gpu-att-parts", required_argument, 0, 26},
                                         {"gpu-matmul", required_argument, 0, 27},
                                         {"gpu-weights", required_argument, 0, 32},
                                         {"gpu-memory-limit", required_argument, 0, 33},
                                         {"chat-template", required_argument, 0, 28},
                                         {"prefill-width", required_argument, 0, 29},
                                         {"kv-release", required_argument, 0, 31},
                                         {"prefix-share", required_argument, 0, 34},
                                         {"grammar-drafts", required_argument, 0, 30},
                                         {"trace", no_argument, 0, 'v'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int o;
    bool bad = false;
    const char *key_file = NULL;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'r': c->opt.run_dir = optarg; break;
        case 'm': c->opt.target = optarg; break;
        case 'p': c->opt.port = atoi(optarg); break;
        case 'b': c->opt.bind = optarg; break;
        case 'w':
            if (coord_parse_workers(c, optarg))
                return 2;
            break;
        case 't': c->opt.threads_per_worker = atoi(optarg); break;
        case 's':
            if (c->opt.n_spec_specs == RT_MAX_SPECULATORS) {
                fprintf(stderr, "orochi-coordinator: at most %d speculators\n", RT_MAX_SPECULATORS);
                return 2;
            }
            c->opt.spec_specs[c->opt.n_spec_specs++] = optarg;
            break;
        case 'W': c->opt.max_width = atoi(optarg); break;
        case 'c': c->opt.n_ctx = atoi(optarg); break;
        case 'd': c->opt.max_draft = atoi(optarg); break;
        case 'D': c->opt.draft_wait_ms = atoi(optarg); break;
        case 'k': c->opt.api_key = optarg; break;
        case 15: key_file = optarg; break;
        case 16: c->opt.max_queue = atoi(optarg); break;
        case 'x': c->opt.external = optarg; break;
        case 'N': c->opt.no_spawn = true; break;
        case 'H': c->opt.heartbeat_ms = atoi(optarg); break;
        case 'X': c->opt.dead_ms = atoi(optarg); break;
        case 'T':
            c->opt.tree = !strcmp(optarg, "on");
            bad |= strcmp(optarg, "on") && strcmp(optarg, "off");
            break;
        case 'A':
            c->opt.adaptive = !strcmp(optarg, "on");
            bad |= strcmp(optarg, "on") && strcmp(optarg, "off");
            break;
        case 'V':
            if (!strcmp(optarg, "majority"))
                c->opt.vote = VOTE_MAJORITY;
            else if (!strcmp(optarg, "union"))
                c->opt.vote = VOTE_UNION;
            else if (!strcmp(optarg, "off"))
                c->opt.vote = VOTE_OFF;
            else
                bad = true;
            break;
        case 'Y': c->width = atoi(optarg); break;
        case 1: c->opt.acr.reward_threshold = atof(optarg); break;
        case 2: c->opt.acr.punish_threshold = atof(optarg); break;
        case 3: c->opt.acr.reward_factor = atof(optarg); break;
        case 4: c->opt.acr.punish_factor = atof(optarg); break;
        case 10:
            c->opt.guard_enabled = !strcmp(optarg, "on");
            bad |= strcmp(optarg, "on") && strcmp(optarg, "off");
            break;
        case 11: c->opt.guard_window = atoi(optarg); break;
        case 12: c->opt.guard_probe = atoi(optarg); break;
        case 13: c->opt.plan_path = optarg; break;
        case 17:
            c->opt.no_free_run = !strcmp(optarg, "off");
            bad |= strcmp(optarg, "on") && strcmp(optarg, "off");
            break;
        case 30:
            c->opt.no_grammar_drafts = !strcmp(optarg, "off");
            bad |= strcmp(optarg, "on") && strcmp(optarg, "off");
            break;
        case 14: c->opt.drain_ms = atoi(optarg); break;
        case 20:
            c->opt.no_prefix_reuse = !strcmp(optarg, "off");
            bad |= strcmp(optarg, "on") && strcmp(optarg, "off");
            break;
        case 34:
            c->opt.no_prefix_share = !strcmp(optarg, "off");
            bad |= strcmp(optarg, "on") && strcmp(optarg, "off");
            break;
        case 21:
            c->opt.no_lookup_run = !strcmp(optarg, "off");
            bad |= strcmp(optarg, "on") && strcmp(optarg, "off");
            break;
        case 22:
            c->opt.kv_elem = !strcmp(optarg, "f16") ? KV_F16 : KV_F32;
            bad |= strcmp(optarg, "f32") && strcmp(optarg, "f16");
            break;
        case 23:
        case 24:
        case 25:
        case 26:
        case 27:
        case 32:
        case 33:
            if (coord_gpu_opt(c, o, optarg))
                return 2;
            break;
        case 28: c->opt.chat_template = optarg; break;
        case 29: c->opt.prefill_width = atoi(optarg); break;
        case 31: c->opt.kv_release_s = atoi(optarg) >= 0 ? atoi(optarg) : -1; break;
        case 19:
            c->opt.kv_dup_opt = !strcmp(optarg, "on") ? 1 : !strcmp(optarg, "off") ? 0 : -2;
            if (c->opt.kv_dup_opt == -2) {
                fprintf(stderr, "orochi-coordinator: --kv-dup takes on or off, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 18:
            c->opt.act_bits = llama_act_bits_parse(optarg);
            if (c->opt.act_bits < 0) {
                fprintf(stderr, "orochi-coordinator: --act-bits takes 8, 16 or auto, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 5: c->opt.decision_threshold = atoi(optarg); break;
        case 8: c->opt.n_seq = !strcmp(optarg, "auto") ? 0 : atoi(optarg) > 0 ? atoi(optarg) : -1; break;
        case 9:
            c->opt.draft_wait_fixed = !strcmp(optarg, "fixed");
            bad |= strcmp(optarg, "fixed") && strcmp(optarg, "measured");
            break;
        case 'v': c->opt.trace = true; break;
        case 'h': coord_usage(stdout); exit(0);
        default: coord_usage(stderr); return 2;
        }
    }
    if (optind < argc) { /* e.g. options after a second "--", which getopt stops at */
        fprintf(stderr, "orochi-coordinator: unexpected argument '%s'%s\n", argv[optind],
                optind > 0 && !strcmp(argv[optind - 1], "--")
                    ? " after '--' (the options after it would be ignored)"
                    : "");
        return 2;
    }
    if (!c->opt.run_dir || !c->opt.target || bad) {
        if (bad)
            fprintf(stderr,
                    "orochi-coordinator: --tree/--adaptive/--guard/--free-run/--grammar-drafts/"
                    "--prefix-reuse/--prefix-share/--lookup-run take on|off, --kv f32|f16, --vote "
                    "majority|union|off, --draft-wait measured|fixed\n");
        coord_usage(stderr);
        return 2;
    }
    if (!c->width)
        c->width = c->opt.max_width;
    if (coord_api_key(c, key_file))
        return 2;
    if (c->opt.kv_release_s < 0) {
        fprintf(stderr, "orochi-coordinator: --kv-release takes seconds (0: never)\n");
        return 2;
    }
    if (c->opt.max_queue < 1 || c->opt.max_queue > COORD_QUEUE) {
        fprintf(stderr, "orochi-coordinator: --max-queue must be 1..%d\n", COORD_QUEUE);
        return 2;
    }
    if (c->opt.n_seq < 0 || c->opt.n_seq > RT_MAX_SEQ) {
        fprintf(stderr, "orochi-coordinator: --max-batch must be 1..%d or auto\n", RT_MAX_SEQ);
        return 2;
    }
    if (c->width < 1 || c->width > c->opt.max_width || c->opt.decision_threshold < 1 ||
        c->opt.acr.reward_factor < 1 || c->opt.acr.punish_factor <= 0 ||
        c->opt.acr.punish_factor > 1 || c->opt.guard_window < 1 || c->opt.guard_probe < 1) {
        fprintf(stderr,
                "orochi-coordinator: need 1 <= width <= max-width, decision-threshold >= 1, "
                "reward-factor >= 1, 0 < punish-factor <= 1, guard-window and guard-probe >= 1\n");
        return 2;
    }
    c->spec_len = c->opt.max_draft < c->width - 1 ? c->opt.max_draft : c->width - 1;
    if (c->spec_len < 1)
        c->spec_len = 1;
    if (c->opt.prefill_width < 1 || c->opt.prefill_width > RT_MAX_WIDTH) {
        fprintf(stderr, "orochi-coordinator: --prefill-width must be 1..%d\n", RT_MAX_WIDTH);
        return 2;
    }
    c->opt.chunk_rows =
        c->opt.prefill_width > c->opt.max_width ? c->opt.prefill_width : c->opt.max_width;
    coord_set_step_rows(c); /* again in coord_auto_slots, once the slots are known */
    if (c->opt.n_workers < 1 || c->opt.n_workers > RT_MAX_WORKERS ||
        c->opt.threads_per_worker < 1 || c->opt.max_width < 1 || c->opt.max_width > RT_MAX_WIDTH ||
        c->opt.max_draft < 1 || c->opt.max_draft >= c->opt.max_width + 1 || c->opt.port < 0 ||
        c->opt.port > 65535 || c->opt.dead_ms < 100 || c->opt.drain_ms < 0) {
        fprintf(stderr,
                "orochi-coordinator: need 1 <= workers <= %d, threads >= 1, 1 <= max-width "
                "<= %d, 1 <= max-draft < max-width + 1, a valid port, dead-ms >= 100, "
                "drain-ms >= 0\n",
                RT_MAX_WORKERS, RT_MAX_WIDTH);
        return 2;
    }
    return 0;
}

/* Where orochi-worker and orochi-speculator live: beside this executable. */
static void coord_bin_dir(coord *c)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        snprintf(c->opt.bin_dir, sizeof c->opt.bin_dir, ".");
        return;
    }
    self[n] = 0;
    snprintf(c->opt.bin_dir, sizeof c->opt.bin_dir, "%s", dirname(self));
}

/* Bytes of memory the sequence slots may take: half of the smaller of the memory available
 * (/proc/meminfo) and the room left in the file system of POSIX shared memory (/dev/shm), where
 * the arena lives; 0 when neither can be read. */
static uint64_t coord_slot_budget(void)
{
    uint64_t avail = 0, room = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[128];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
                avail = (uint64_t)kb * 1024;
        fclose(f);
    }
    struct statvfs vs;
    if (!statvfs("/dev/shm", &vs))
        room = (uint64_t)vs.f_bavail * vs.f_frsize;
    uint64_t m = avail && room ? (avail < room ? avail : room) : avail ? avail : room;
    return m / 2;
}


/* --max-batch auto: a group of CPU workers takes as many sequence slots as the budget holds with
 * every slot's K/V at full --n-ctx (RT_MAX_SEQ at most, 4 at least), a group with a GPU worker 4
 * (the arena registered with CUDA is pinned whole). A slot's rows are written as its request
 * grows and the shared-memory file commits pages only when written, so the slots cost what their
 * requests hold; the budget keeps their sum within memory even when every slot fills. The
 * arena's steps grow to a row per slot; a prompt's steps keep --prefill-width rows. */
static void coord_auto_slots(coord *c, bool all_cpu)
{
    uint64_t per = coord_kv_bytes(c, c->opt.n_ctx); /* a full slot, in whole pages */
    uint64_t budget = coord_slot_budget();
    int n = 4;
    if (all_cpu) {
        uint64_t fit = per ? budget / per : RT_MAX_SEQ;
        /* never fewer than 4, the fixed default before: a small /dev/shm (a container's
         * 64 MB) still holds 4 slots' rows as they are written, as it always did */
        n = fit > RT_MAX_SEQ ? RT_MAX_SEQ : fit < 4 ? 4 : (int)fit;
    }
    c->opt.n_seq = n;
    coord_set_step_rows(c);
    rt_log("coordinator",
           "sequence slots: %d (--max-batch auto: %s; K/V %.0f MB a slot at --n-ctx %d, taken as "
           "written; budget %.1f GB, half the free memory); steps of up to %d rows, a prompt's %d",
           n, all_cpu ? "as many as the budget holds" : "4 with a GPU worker", (double)per / 1e6,
           c->opt.n_ctx, (double)budget / 1e9, c->opt.step_rows, c->opt.chunk_rows);
}

static int coord_setup(coord *c)
{
    char err[512];
    c->model = llama_model_load(c->opt.target, err, sizeof err);
    if (!c->model) {
        rt_log("coordinator", "%s", err);
        return 2;
    }
    llama_model_set_act_bits(c->model, c->opt.act_bits, err,
                             sizeof err); /* checked by coord_parse */
    c->tok = tokenizer_new(c->model->file, err, sizeof err);
    if (!c->tok || (c->opt.chat_template &&
                    tokenizer_chat_template_file(c->tok, c->opt.chat_template, err, sizeof err))) {
        rt_log("coordinator", "%s", err);
        return 2;
    }
    bool all_cpu = true;
    for (int i = 0; i < c->opt.n_workers; i++)
        all_cpu &= !strcmp(c->opt.worker_device[i], "cpu");
    if (c->opt.kv_dup_opt == 1 && !all_cpu) {
        rt_log("coordinator", "--kv-dup on needs CPU workers only (the GPU forward reads every "
                              "tree row from the arena)");
        return 2;
    }
    c->opt.kv_dup = c->opt.kv_dup_opt == 1 || (c->opt.kv_dup_opt < 0 && all_cpu);
    c->kv_release_ok = all_cpu;
    /* a GPU worker's attention reads a slot's rows from its own place only */
    c->kv_share_ok = all_cpu && !c->opt.no_prefix_share;
    int even_max = c->opt.kv_dup ? c->model->cfg.n_heads : c->model->cfg.n_kv_heads;
    if (c->opt.n_workers > even_max && !c->part_set) {
        rt_log("coordinator",
               "%d workers: the even split takes at most %d (the model has %d %s heads%s; a "
               "plan's \"partition\" shares the work any way: docs/speculation.md, \"The plan\")",
               c->opt.n_workers, even_max, even_max, c->opt.kv_dup ? "query" : "KV",
               c->opt.kv_dup ? "" : ", and --kv-dup is off");
        return 2;
    }
    if (c->opt.n_ctx <= 0 || c->opt.n_ctx > c->model->cfg.ctx)
        c->opt.n_ctx = c->model->cfg.ctx < 4096 ? c->model->cfg.ctx : 4096;
    if (!c->opt.n_seq)
        coord_auto_slots(c, all_cpu);
    uint64_t h = 0;
    for (int32_t i = 0; i < tokenizer_vocab_size(c->tok); i++) {
        const char *t = tokenizer_token_text(c->tok, i);
        h = rt_fnv1a(h, t ? t : "", t ? strlen(t) + 1 : 1);
    }
    c->vocab_hash = h;
    const char *base = strrchr(c->opt.target, '/');
    snprintf(c->model_name, sizeof c->model_name, "%s", base ? base + 1 : c->opt.target);
    char *dot = strstr(c->model_name, ".gguf");
    if (dot)
        *dot = 0;

    /* the arena */
    size_t llama_bytes = llama_shared_layout(&c->model->cfg, c->opt.n_ctx, c->opt.step_rows,
                                             c->opt.n_seq, c->opt.kv_elem, NULL);
    c->grp.ring_bytes = rt_ring_stride();
    arena_spec specs[] = {
        {RT_REGION_STEP, sizeof(rt_step)},
        {RT_REGION_LLAMA, llama_bytes},
        {RT_REGION_LOGITS, (uint64_t)c->opt.step_rows * (uint64_t)c->model->cfg.vocab * 4},
        {RT_REGION_DRAFTS, (uint64_t)RT_MAX_SPECULATORS * c->grp.ring_bytes},
        {RT_REGION_HIDDEN, (uint64_t)RT_MAX_SEQ * rt_hidden_stride(c->model->cfg.dim)},
    };
    char name[64];
    rt_arena_name(c->opt.run_dir, name, sizeof name);
    c->grp.arena =
        arena_create(name, specs, (int)(sizeof specs / sizeof specs[0]), true, err, sizeof err);
    if (!c->grp.arena) {
        rt_log("coordinator", "%s", err);
        return 1;
    }
    c->grp.step = arena_region_find(c->grp.arena, RT_REGION_STEP, NULL);
    void *shared = arena_region_find(c->grp.arena, RT_REGION_LLAMA, NULL);
    c->grp.logits = arena_region_find(c->grp.arena, RT_REGION_LOGITS, NULL);
    c->grp.rings = arena_region_find(c->grp.arena, RT_REGION_DRAFTS, NULL);
    c->grp.hidden = arena_region_find(c->grp.arena, RT_REGION_HIDDEN, NULL);
    for (int s = 0; s < RT_MAX_SEQ; s++)
        rt_hidden_at(c->grp.hidden, c->model->cfg.dim, s)->dim = (uint32_t)c->model->cfg.dim;
    llama_ctx_params p = {.n_threads = 1,
                          .max_width = c->opt.step_rows,
                          .n_ctx = c->opt.n_ctx,
                          .n_seq = c->opt.n_seq,
                          .kv = c->opt.kv_elem,
                          .n_parts = 1,
                          .shared = shared};
    c->kv = llama_ctx_new(c->model, &p, err, sizeof err);
    if (!c->kv) {
        rt_log("coordinator", "%s", err);
        return 1;
    }

    /* the control socket */
    char endpoint[4200], sockpath[4200];
    rt_ctl_endpoint(c->opt.run_dir, endpoint, sizeof endpoint);
    snprintf(sockpath, sizeof sockpath, "%s/ctl", c->opt.run_dir);
    unlink(sockpath); /* a stale socket file from a crashed coordinator */
    c->grp.zctx = zmq_ctx_new();
    c->grp.sock = zmq_socket(c->grp.zctx, ZMQ_ROUTER);
    int one = 1, linger = 0;
    zmq_setsockopt(c->grp.sock, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
    zmq_setsockopt(c->grp.sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(c->grp.sock, endpoint)) {
        rt_log("coordinator", "cannot bind %s: %s", endpoint, zmq_strerror(zmq_errno()));
        return 1;
    }
    /* RUN_DIR/arena: the name, for the launcher's clean-up after a crash */
    char arena_path[4200];
    snprintf(arena_path, sizeof arena_path, "%s/arena", c->opt.run_dir);
    FILE *af = fopen(arena_path, "w");
    if (af) {
        fprintf(af, "%s\n", name);
        fclose(af);
    }
    rt_log("coordinator",
           "arena %s (%.1f MiB), control %s, %d workers x %d threads, width %d, "
           "context %d",
           name, (double)arena_size(c->grp.arena) / (1 << 20), endpoint, c->opt.n_workers,
           c->opt.threads_per_worker, c->opt.max_width, c->opt.n_ctx);
    return 0;
}

static int coord_start_http(coord *c, coord_drain *d)
{
    char err[512];
    http_config hc = {.bind_addr = c->opt.bind,
                      .port = c->opt.port,
                      .api_key = c->opt.api_key,
                      .model_name = c->model_name,
                      .max_tokens_cap = c->opt.n_ctx};
    http_engine he = {.ctx = d,
                      .submit = coord_drain_submit,
                      .metrics = coord_drain_metrics,
                      .health = coord_drain_health,
                      .status = coord_drain_status};
    c->http = http_server_start(&hc, &he, err, sizeof err);
    if (!c->http) {
        rt_log("coordinator", "HTTP: %s", err);
        return 1;
    }
    rt_log("coordinator", "serving http://%s:%d/ (model %s)",
           c->opt.bind ? c->opt.bind : "127.0.0.1", http_server_port(c->http), c->model_name);
    char path[4200];
    snprintf(path, sizeof path, "%s/port", c->opt.run_dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fprintf(f, "%d\n", http_server_port(c->http));
        fclose(f);
    }
    return 0;
}

int main(int argc, char **argv)
{
    /* HTTP requests are served by short-lived threads, one per connection; glibc would give them
     * up to 8 malloc arenas per core, each keeping freed memory, and RSS grows with every burst
     * of connections (bench/http_mutate.py: +4.8% over 5 passes of 1000 requests from 8 clients).
     * Two arenas are plenty for a process that computes nothing. */
    mallopt(M_ARENA_MAX, 2);
    coord c = {.opt = {.port = 8080,
                       .n_workers = 2,
                       .threads_per_worker = 1,
                       .max_width = 8,
                       .max_queue = 256,
                       .act_bits = LLAMA_ACT_AUTO,
                       .kv_dup_opt = -1,
                       .max_draft = 4,
                       .draft_wait_ms = 200,
                       .heartbeat_ms = 250,
                       .dead_ms = 3000,
                       .tree = true,
                       .vote = VOTE_MAJORITY,
                       .adaptive = true,
                       .acr = {.reward_threshold = 0.5,
                               .punish_threshold = 0.2,
                               .reward_factor = 1.1,
                               .punish_factor = 0.9},
                       .guard_enabled = true,
                       .guard_window = 8,
                       .guard_probe = 48,
                       .decision_threshold = 8,
                       .n_seq = 0, /* auto */
                       .kv_release_s = 30,
                       .prefill_width = 12,
                       .drain_ms = 10000},
               .plan_bucket = -1};
    int rc = coord_parse(&c, argc, argv);
    if (rc)
        return rc;
    pthread_mutex_init(&c.qlock, NULL);
    pthread_mutex_init(&c.met.lock, NULL);
    static coord_drain drain; /* lives as long as the HTTP server that calls into it */
    pthread_mutex_init(&drain.lock, NULL);
    drain.c = &c;
    struct sigaction sa = {0};
    sa.sa_handler = coord_on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* the run directory holds the control socket and the API key file: this user's alone */
    mkdir(c.opt.run_dir, 0700);
    struct stat rst;
    if (stat(c.opt.run_dir, &rst) == 0 && (rst.st_mode & 077) && rst.st_uid == getuid()) {
        chmod(c.opt.run_dir, rst.st_mode & 0700);
        rt_log("coordinator", "run dir %s was open to others (mode %03o): made it 0700",
               c.opt.run_dir, (unsigned)(rst.st_mode & 0777));
    }
    char opsdir[4200]; /* operator requests from orochi-launch (coord_ops.c) */
    snprintf(opsdir, sizeof opsdir, "%s/ops", c.opt.run_dir);
    mkdir(opsdir, 0700);
    coord_bin_dir(&c);
    char pidpath[4200], pidtmp[4300];
    snprintf(pidpath, sizeof pidpath, "%s/coordinator.pid", c.opt.run_dir);
    snprintf(pidtmp, sizeof pidtmp, "%s.%d", pidpath, (int)getpid());
    FILE *pf = fopen(pidtmp,
                     "w"); /* written aside and renamed: the launcher never reads it half-written */
    if (pf) {
        fprintf(pf, "%d\n", (int)getpid());
        fclose(pf);
        rename(pidtmp, pidpath);
    }

    /* the guard measures plain decoding itself (a plan's in-process t(1) leaves out the group's
     * own costs) */
    ctl_guard_init(&c.guard, 0, c.opt.guard_window, c.opt.guard_probe);
    ctl_guard_init(&c.guard_batch, 0, c.opt.guard_window, c.opt.guard_probe);
    ctl_lookup_init(&c.lookup);
    ctl_length_init(&c.len, c.spec_len, 1, c.width > 1 ? c.width - 1 : 1, c.opt.decision_threshold,
                    6);
    if (c.opt.plan_path) {
        char perr[512];
        if (coord_plan_load(&c, perr, sizeof perr)) {
            fprintf(stderr, "orochi-coordinator: %s\n", perr);
            return 2;
        }
    }
    rc = coord_engine_init(&c) ? 1 : coord_setup(&c);
    if (!rc && coord_group_spawn_all(&c))
        rc = 1;
    if (!rc)
        rc = coord_start_http(&c, &drain);
    uint64_t drain_deadline = 0, flush_until = 0;
    while (!rc && !coord_stop_flag) {
        if (coord_drain_flag) {
            pthread_mutex_lock(&drain.lock);
            if (!drain.draining) {
                drain.draining = true;
                drain_deadline = rt_now_us() + (uint64_t)c.opt.drain_ms * 1000u;
                rt_log("coordinator", "draining: %d requests in flight finish, new ones get 503",
                       coord_drain_prune(&drain));
            }
            int running = coord_drain_prune(&drain);
            pthread_mutex_unlock(&drain.lock);
            /* an ended request may still be on its way to its client (the rest of a stream): the
             * HTTP side gets up to COORD_DRAIN_FLUSH_US to send it before the server is stopped,
             * and no wait once no connection is open (every answer delivered: a client that
             * keeps its connection alive gets the whole of it) */
            if (!running && !flush_until)
                flush_until = rt_now_us() + COORD_DRAIN_FLUSH_US;
            if (!running &&
                (rt_now_us() >= flush_until || !http_server_open_connections(c.http))) {
                rt_log("coordinator", "drained");
                break;
            }
            if (rt_now_us() > drain_deadline) {
                rt_log("coordinator", "drain: %d requests still running after %d ms: stopping",
                       running, c.opt.drain_ms);
                break;
            }
        }
        coord_plan_poll(&c);
        coord_ops_poll(&c);
        coord_status_poll(&c);
        /* idle: wait up to 2 ms for a message; serving: only take what has arrived (a step's
         * StepDone trails its doorbell, and waiting for it cost ~0.9 ms per plain step) */
        coord_group_serve(&c, coord_engine_busy(&c) ? 0 : 2);
        if (coord_group_workers_ready(&c))
            coord_engine_tick(&c);
    }
    coord_stop_flag = 1;
    rt_log("coordinator", "stopping");
    http_server_stop(&c.http);
    coord_status_fini(&c);
    /* fail whatever is still queued */
    for (coord_request *r; (r = (pthread_mutex_lock(&c.qlock), c.qlen ? c.queue[c.qhead] : NULL),
                           pthread_mutex_unlock(&c.qlock), r);) {
        pthread_mutex_lock(&c.qlock);
        c.qhead = (c.qhead + 1) % COORD_QUEUE;
        c.qlen--;
        pthread_mutex_unlock(&c.qlock);
        coord_request_fail(r, 503, "the coordinator is shutting down");
        coord_request_unref(&r);
    }
    coord_engine_fini(&c);
    coord_trace_poll(&c, true); /* a trace cut short is still a complete file */
    pthread_mutex_lock(&drain.lock);
    for (int i = 0; i < drain.n; i++)
        coord_request_unref(&drain.reqs[i]);
    drain.n = 0;
    pthread_mutex_unlock(&drain.lock);
    if (c.grp.sock)
        coord_group_shutdown(&c);
    llama_ctx_destroy(&c.kv);
    arena_destroy(&c.grp.arena);
    tokenizer_destroy(&c.tok);
    llama_model_destroy(&c.model);
    if (c.grp.sock)
        zmq_close(c.grp.sock);
    if (c.grp.zctx)
        zmq_ctx_term(c.grp.zctx);
    unlink(pidpath);
    return rc;
}
