/*
 * orochi-speculator — drafts candidate continuations for the sequence the target is decoding.
 *
 * Kinds:
 *   layerskip  the target GGUF itself with only some layers (--layers, default the first half):
 *              self-speculation, no extra model, same vocabulary by construction;
 *   model      a separate draft GGUF (--draft M) whose vocabulary must equal the target's
 *              (size and a hash of the token strings travel in Hello; the coordinator refuses a
 *              mismatch with a clear error);
 *   ngram      prompt lookup: the continuation of the most recent earlier occurrence of the
 *              context's last n tokens (n from --ngram down to 1); no model at all.
 *
 * State: the committed tokens of the current request (from Feedback) and this speculator's own
 * continuation `chain` beyond them, with a private KV cache covering committed + chain for the
 * model kinds. After each Feedback it publishes a draft of up to --max-draft tokens for the new
 * context into its ring in the arena and answers DraftReady (an empty draft too, so the
 * coordinator never waits on a speculator with nothing to say). Then it keeps drafting ahead (up
 * to --lookahead tokens) while the target verifies. When the next Feedback arrives, the part of
 * the chain the target accepted is kept — KV and all — and the rest, which assumed a context that
 * did not happen, is dropped and its KV rolled back.
 */
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "model/llama.h"
#include "model/tokenizer.h"
#include "workers/runtime.h"

#define HEARTBEAT_MS 200
#define SPEC_MAX_TOKENS 65536

typedef enum { SPEC_LAYERSKIP, SPEC_MODEL, SPEC_NGRAM } spec_kind;

typedef struct {
    const char *run_dir, *kind_s, *draft_path, *target_path, *layers_s, *id;
    spec_kind kind;
    int max_draft, lookahead, ngram, threads, orphan_ms;
    bool trace;
    char role[64];
    void *zctx, *sock;
    arena *arena;
    arena_draft_ring *ring;
    llama_model *model;
    llama_ctx *ctx;
    float *logits;
    /* the current request */
    uint64_t request_id;
    bool active;
    int32_t *tokens; /* committed, then the chain */
    float *conf;     /* per chain token: the drafter's probability */
    int n_committed, n_chain, kv_len, n_ctx;
    bool published;  /* a DraftReady went out for n_committed */
    uint64_t drafts, last_coord_us;
} spec;

static volatile sig_atomic_t spec_stop;

static void spec_on_signal(int sig)
{
    (void)sig;
    spec_stop = 1;
}

static void spec_usage(FILE *out)
{
    fprintf(out,
            "usage: orochi-speculator --run-dir D --kind layerskip|model|ngram [--id NAME]\n"
            "                         [--max-draft S] [--lookahead L] [--threads T]\n"
            "                         [--target M.gguf] [--layers 0-14|0,2,4] [--draft M.gguf]\n"
            "                         [--ngram N] [--trace]\n"
            "  layerskip: the target with only --layers (default: the first half)\n"
            "  model:     a separate draft GGUF with the target's vocabulary (--draft)\n"
            "  ngram:     continuation of the latest earlier match of the last N..1 tokens\n");
}

static int spec_send(spec *s, Orochi__Envelope__BodyCase which, void *body)
{
    Orochi__Envelope env;
    return rt_send(s->sock, NULL, 0, rt_env(&env, which, body));
}

/* ===== drafting ===== */

/* "0-14" or "0,2,4-6" -> layer list. */
static int spec_parse_layers(const char *spec_s, int n_layers, int *out, char *err, size_t errlen)
{
    int n = 0;
    const char *p = spec_s;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p)
            goto bad;
        p = end;
        if (*p == '-') {
            b = strtol(p + 1, &end, 10);
            if (end == p + 1)
                goto bad;
            p = end;
        }
        for (long i = a; i <= b; i++) {
            if (n >= n_layers || i < 0 || i >= n_layers)
                goto bad;
            out[n++] = (int)i;
        }
        if (*p == ',')
            p++;
        else if (*p)
            goto bad;
    }
    return n;
bad:
    snprintf(err, errlen, "--layers '%s': expected indices or ranges within 0..%d", spec_s, n_layers - 1);
    return -1;
}

/* Feed tokens[kv_len .. n_committed + n_chain) into the private KV; logits of the last one land
 * in s->logits. */
static int spec_catch_up(spec *s)
{
    int total = s->n_committed + s->n_chain;
    if (s->kv_len >= total)
        return 0;
    char err[256];
    llama_ctx_set_prefix_len(s->ctx, s->kv_len);
    if (llama_prefill(s->ctx, s->tokens + s->kv_len, total - s->kv_len, s->logits, err, sizeof err)) {
        rt_log(s->role, "draft model: %s", err);
        return -1;
    }
    s->kv_len = total;
    return 0;
}

/* The drafter's next token after committed + chain, with its probability; -1 if none. */
static int32_t spec_next_model(spec *s, float *conf)
{
    if (s->kv_len != s->n_committed + s->n_chain || s->kv_len == 0)
        return -1;
    int V = s->model->cfg.vocab;
    int32_t best = sampler_argmax(s->logits, V);
    double sum = 0;
    for (int i = 0; i < V; i++)
        sum += exp((double)s->logits[i] - s->logits[best]);
    *conf = (float)(1.0 / sum);
    return best;
}

static int32_t spec_next_ngram(spec *s, float *conf)
{
    int n = s->n_committed + s->n_chain;
    for (int k = s->ngram; k >= 1; k--) {
        if (n <= k)
            continue;
        const int32_t *tail = s->tokens + n - k;
        for (int start = n - k - 1; start >= 0; start--) {
            if (!memcmp(s->tokens + start, tail, (size_t)k * sizeof *tail)) {
                *conf = (float)k / (float)(k + 1);
                return s->tokens[start + k];
            }
        }
    }
    return -1;
}

/* Extend the chain by one token; false when nothing more can be drafted now. */
static bool spec_draft_one(spec *s)
{
    if (!s->active || s->n_chain >= s->lookahead ||
        s->n_committed + s->n_chain + 1 >= SPEC_MAX_TOKENS)
        return false;
    float conf = 0;
    int32_t next;
    if (s->kind == SPEC_NGRAM) {
        next = spec_next_ngram(s, &conf);
    } else {
        if (s->n_committed + s->n_chain + 1 > s->n_ctx)
            return false;
        if (spec_catch_up(s))
            return false;
        next = spec_next_model(s, &conf);
    }
    if (next < 0)
        return false;
    s->tokens[s->n_committed + s->n_chain] = next;
    s->conf[s->n_chain] = conf;
    s->n_chain++;
    return true;
}

/* Publish up to max_draft chain tokens for the current context. */
static void spec_publish(spec *s)
{
    arena_draft d = {0};
    d.request_id = s->request_id;
    d.ctx_len = (uint64_t)s->n_committed;
    d.last_token = s->n_committed ? s->tokens[s->n_committed - 1] : -1;
    d.n = (uint32_t)(s->n_chain < s->max_draft ? s->n_chain : s->max_draft);
    memcpy(d.tokens, s->tokens + s->n_committed, d.n * sizeof *d.tokens);
    memcpy(d.conf, s->conf, d.n * sizeof *d.conf);
    uint32_t slot = arena_draft_ring_put(s->ring, &d);
    Orochi__DraftReady r = OROCHI__DRAFT_READY__INIT;
    r.request_id = s->request_id;
    r.ctx_len = d.ctx_len;
    r.slot = slot;
    r.n_tokens = d.n;
    spec_send(s, OROCHI__ENVELOPE__BODY_DRAFT_READY, &r);
    s->published = true;
    s->drafts++;
    if (s->trace)
        rt_log(s->role, "draft of %u tokens for context %d", d.n, s->n_committed);
}

/* Apply a Feedback: keep the accepted part of the chain, drop the rest. */
static void spec_feedback(spec *s, const Orochi__Feedback *fb)
{
    if (fb->done) {
        if (fb->request_id == s->request_id)
            s->active = false;
        return;
    }
    if (fb->reset || fb->request_id != s->request_id) {
        if (!fb->reset) /* feedback for a request we never saw the start of */
            return;
        if (fb->n_tokens >= SPEC_MAX_TOKENS) {
            rt_log(s->role, "context of %zu tokens is beyond what this speculator keeps", fb->n_tokens);
            s->active = false;
            return;
        }
        s->request_id = fb->request_id;
        s->active = true;
        memcpy(s->tokens, fb->tokens, fb->n_tokens * sizeof *s->tokens);
        s->n_committed = (int)fb->n_tokens;
        s->n_chain = 0;
        s->kv_len = 0;
    } else {
        int n = (int)fb->n_tokens, keep = 0;
        if (s->n_committed + n >= SPEC_MAX_TOKENS) {
            s->active = false;
            return;
        }
        while (keep < n && keep < s->n_chain && s->tokens[s->n_committed + keep] == fb->tokens[keep])
            keep++;
        /* rows past the first disagreement were computed for a context that did not happen */
        int valid = s->n_committed + keep;
        if (s->kv_len > valid)
            s->kv_len = valid;
        memcpy(s->tokens + s->n_committed, fb->tokens, (size_t)n * sizeof *s->tokens);
        int old_chain = s->n_chain;
        s->n_committed += n;
        if (keep == n && old_chain > n) { /* the whole step matched our chain: keep the rest */
            s->n_chain = old_chain - n;
            memmove(s->conf, s->conf + n, (size_t)s->n_chain * sizeof *s->conf);
        } else {
            s->n_chain = 0;
        }
    }
    if ((uint64_t)s->n_committed != fb->ctx_len)
        rt_log(s->role, "context length %d disagrees with the coordinator's %llu: resynchronising",
               s->n_committed, (unsigned long long)fb->ctx_len);
    s->published = false;
}

/* ===== joining ===== */

static int spec_load(spec *s, char *err, size_t errlen, uint32_t *vocab, uint64_t *hash)
{
    if (s->kind == SPEC_NGRAM) {
        *vocab = 0;
        *hash = 0;
        return 0;
    }
    const char *path = s->kind == SPEC_MODEL ? s->draft_path : s->target_path;
    s->model = llama_model_load(path, err, errlen);
    if (!s->model)
        return -1;
    if (s->kind == SPEC_LAYERSKIP) {
        int n_layers = s->model->cfg.n_layers, list[4096];
        int n;
        if (s->layers_s) {
            n = spec_parse_layers(s->layers_s, n_layers, list, err, errlen);
            if (n < 0)
                return -1;
        } else {
            n = n_layers / 2 ? n_layers / 2 : 1;
            for (int i = 0; i < n; i++)
                list[i] = i;
        }
        if (llama_model_keep_layers(s->model, list, n, err, errlen))
            return -1;
    }
    tokenizer *tok = tokenizer_new(s->model->file, err, errlen);
    if (!tok)
        return -1;
    *vocab = (uint32_t)s->model->cfg.vocab;
    uint64_t h = 0;
    for (int32_t i = 0; i < tokenizer_vocab_size(tok); i++) {
        const char *t = tokenizer_token_text(tok, i);
        h = rt_fnv1a(h, t ? t : "", t ? strlen(t) + 1 : 1);
    }
    *hash = h;
    tokenizer_destroy(&tok);
    return 0;
}

static int spec_join(spec *s)
{
    char err[512];
    uint32_t vocab;
    uint64_t hash;
    if (spec_load(s, err, sizeof err, &vocab, &hash)) {
        rt_log(s->role, "%s", err);
        return -1;
    }
    Orochi__Hello hello = OROCHI__HELLO__INIT;
    hello.role = OROCHI__ROLE__ROLE_SPECULATOR;
    hello.id = s->role;
    hello.pid = (uint32_t)getpid();
    hello.device = "cpu";
    hello.kind = (char *)s->kind_s;
    hello.threads = (uint32_t)s->threads;
    hello.vocab_size = vocab;
    hello.vocab_hash = hash;
    for (int attempt = 0; !spec_stop && attempt < 300; attempt++) {
        spec_send(s, OROCHI__ENVELOPE__BODY_HELLO, &hello);
        zmq_pollitem_t it = {s->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 1000) <= 0)
            continue;
        bool bad;
        Orochi__Envelope *e = rt_recv(s->sock, false, NULL, 0, NULL, &bad, err, sizeof err);
        if (bad)
            rt_log(s->role, "ignoring a bad frame from the coordinator: %s", err);
        if (!e)
            continue;
        if (e->body_case == OROCHI__ENVELOPE__BODY_ERROR) {
            rt_log(s->role, "coordinator refused us: %s", e->error->message);
            rt_free(e);
            return -1;
        }
        if (e->body_case != OROCHI__ENVELOPE__BODY_WELCOME) {
            rt_free(e);
            continue;
        }
        Orochi__Welcome *w = e->welcome;
        s->arena = arena_attach(w->arena_name, err, sizeof err);
        uint64_t ring_bytes = 0;
        uint8_t *rings = s->arena ? arena_region_find(s->arena, RT_REGION_DRAFTS, &ring_bytes) : NULL;
        size_t one = rt_ring_stride();
        if (!rings || w->draft_ring >= RT_MAX_SPECULATORS || (w->draft_ring + 1) * one > ring_bytes) {
            rt_log(s->role, "cannot use draft ring %u of arena %s: %s", w->draft_ring, w->arena_name,
                   s->arena ? "region missing" : err);
            rt_free(e);
            return -1;
        }
        s->ring = (arena_draft_ring *)(rings + w->draft_ring * one);
        if (s->model) {
            s->n_ctx = (int)w->n_ctx + RT_MAX_WIDTH + s->lookahead;
            llama_ctx_params p = {.n_threads = s->threads, .max_width = 16, .n_ctx = s->n_ctx,
                                  .kv = KV_F32, .n_parts = 1};
            s->ctx = llama_ctx_new(s->model, &p, err, sizeof err);
            s->logits = malloc((size_t)s->model->cfg.vocab * sizeof *s->logits);
            if (!s->ctx || !s->logits) {
                rt_log(s->role, "%s", s->ctx ? "out of memory" : err);
                rt_free(e);
                return -1;
            }
        }
        rt_log(s->role, "joined: kind %s, draft ring %u, max draft %d, lookahead %d%s", s->kind_s,
               w->draft_ring, s->max_draft, s->lookahead, s->model ? "" : " (prompt lookup)");
        rt_free(e);
        return 0;
    }
    rt_log(s->role, "no Welcome from the coordinator at %s", s->run_dir);
    return -1;
}

static int spec_parse(spec *s, int argc, char **argv)
{
    static const struct option opts[] = {
        {"run-dir", required_argument, 0, 'r'}, {"kind", required_argument, 0, 'k'},
        {"id", required_argument, 0, 'i'}, {"max-draft", required_argument, 0, 's'},
        {"lookahead", required_argument, 0, 'l'}, {"threads", required_argument, 0, 't'},
        {"layers", required_argument, 0, 'L'}, {"draft", required_argument, 0, 'd'},
        {"ngram", required_argument, 0, 'n'}, {"orphan-ms", required_argument, 0, 'o'},
        {"target", required_argument, 0, 'T'},
        {"trace", no_argument, 0, 'v'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'r': s->run_dir = optarg; break;
        case 'k': s->kind_s = optarg; break;
        case 'i': s->id = optarg; break;
        case 's': s->max_draft = atoi(optarg); break;
        case 'l': s->lookahead = atoi(optarg); break;
        case 't': s->threads = atoi(optarg); break;
        case 'L': s->layers_s = optarg; break;
        case 'd': s->draft_path = optarg; break;
        case 'T': s->target_path = optarg; break;
        case 'n': s->ngram = atoi(optarg); break;
        case 'o': s->orphan_ms = atoi(optarg); break;
        case 'v': s->trace = true; break;
        case 'h': spec_usage(stdout); exit(0);
        default: spec_usage(stderr); return 2;
        }
    }
    if (!s->run_dir || !s->kind_s) {
        spec_usage(stderr);
        return 2;
    }
    if (!strcmp(s->kind_s, "layerskip"))
        s->kind = SPEC_LAYERSKIP;
    else if (!strcmp(s->kind_s, "model"))
        s->kind = SPEC_MODEL;
    else if (!strcmp(s->kind_s, "ngram"))
        s->kind = SPEC_NGRAM;
    else {
        fprintf(stderr, "orochi-speculator: unknown --kind '%s' (layerskip, model, ngram)\n", s->kind_s);
        return 2;
    }
    if (s->kind == SPEC_MODEL && !s->draft_path) {
        fprintf(stderr, "orochi-speculator: --kind model needs --draft M.gguf\n");
        return 2;
    }
    if (s->kind == SPEC_LAYERSKIP && !s->target_path) {
        fprintf(stderr, "orochi-speculator: --kind layerskip needs --target M.gguf (the target model)\n");
        return 2;
    }
    if (s->max_draft < 1 || s->max_draft > ARENA_DRAFT_MAX || s->ngram < 1) {
        fprintf(stderr, "orochi-speculator: --max-draft must be 1..%d and --ngram >= 1\n", ARENA_DRAFT_MAX);
        return 2;
    }
    if (s->lookahead < s->max_draft)
        s->lookahead = s->max_draft;
    return 0;
}

int main(int argc, char **argv)
{
    spec s = {.max_draft = 4, .lookahead = 0, .ngram = 3, .threads = 1, .orphan_ms = 10000};
    int rc = spec_parse(&s, argc, argv);
    if (rc)
        return rc;
    snprintf(s.role, sizeof s.role, "%s", s.id ? s.id : s.kind_s);
    signal(SIGTERM, spec_on_signal);
    signal(SIGINT, spec_on_signal);
    signal(SIGPIPE, SIG_IGN);
    s.tokens = malloc(SPEC_MAX_TOKENS * sizeof *s.tokens);
    s.conf = malloc((size_t)(s.lookahead + 1) * sizeof *s.conf);

    char endpoint[4200];
    rt_ctl_endpoint(s.run_dir, endpoint, sizeof endpoint);
    s.zctx = zmq_ctx_new();
    s.sock = zmq_socket(s.zctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(s.sock, ZMQ_LINGER, &linger, sizeof linger);
    if (!s.tokens || !s.conf || zmq_connect(s.sock, endpoint) || spec_join(&s)) {
        rc = 1;
        goto out;
    }
    s.last_coord_us = rt_now_us();
    uint64_t last_hb = 0;
    while (!spec_stop) {
        uint64_t now = rt_now_us();
        if (now - last_hb >= HEARTBEAT_MS * 1000u) {
            Orochi__Heartbeat hb = OROCHI__HEARTBEAT__INIT;
            hb.time_us = now;
            hb.steps = s.drafts;
            hb.state = s.active ? "drafting" : "idle";
            spec_send(&s, OROCHI__ENVELOPE__BODY_HEARTBEAT, &hb);
            last_hb = now;
        }
        if (now - s.last_coord_us > (uint64_t)s.orphan_ms * 1000u) {
            rt_log(s.role, "coordinator silent for %d ms: exiting", s.orphan_ms);
            break;
        }
        /* publish as soon as the draft for this context is as long as it will get */
        if (s.active && !s.published) {
            while (s.n_chain < s.max_draft && spec_draft_one(&s))
                ;
            spec_publish(&s);
        }
        /* then keep drafting ahead, one token between polls, while the target verifies */
        bool more = s.active && spec_draft_one(&s);
        zmq_pollitem_t it = {s.sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, more ? 0 : HEARTBEAT_MS) <= 0)
            continue;
        bool bad;
        char err[256];
        Orochi__Envelope *env;
        while ((env = rt_recv(s.sock, false, NULL, 0, NULL, &bad, err, sizeof err)) || bad) {
            if (bad) {
                rt_log(s.role, "ignoring a bad frame: %s", err);
                continue;
            }
            s.last_coord_us = rt_now_us();
            if (env->body_case == OROCHI__ENVELOPE__BODY_FEEDBACK)
                spec_feedback(&s, env->feedback);
            else if (env->body_case == OROCHI__ENVELOPE__BODY_DRAFT_REQUEST && s.active &&
                     env->draft_request->request_id == s.request_id)
                s.published = false; /* asked again (e.g. after a lost reply) */
            else if (env->body_case == OROCHI__ENVELOPE__BODY_SHUTDOWN)
                spec_stop = 1;
            rt_free(env);
        }
    }
out:
    llama_ctx_destroy(&s.ctx);
    llama_model_destroy(&s.model);
    arena_destroy(&s.arena);
    free(s.logits);
    free(s.tokens);
    free(s.conf);
    if (s.sock)
        zmq_close(s.sock);
    if (s.zctx)
        zmq_ctx_term(s.zctx);
    return rc;
}
