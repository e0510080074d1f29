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
 *   medusa     Medusa heads (--heads) on the target's hidden state, which the coordinator
 *              publishes in the arena.
 *   replay     the same lookup in a corpus of token-id sequences (--corpus) instead of the
 *              context, n up to 64: given the target's own greedy answers, a perfect drafter
 *              (what speculation could give at most, measured through the whole group).
 *
 * State: the committed tokens of the current request (from Feedback) and a private KV cache for
 * the model kinds — or, for a model drafter with the target's whole shape (a re-quantized copy)
 * and for layerskip keeping the target's first layers (--target-kv auto), only a private tree:
 * its attention reads the committed rows of the request's sequence slot from the target's KV
 * cache in the arena, so it never prefills or commits, and its chain lives in the tree
 * (tree_rows). A model drafter's output layer wider than 4 bits is screened
 * by a 4-bit copy whose --head-screen best candidates per row are recomputed exactly. After each
 * Feedback the speculator grows a draft TREE for the new context (LLMCad: one tree-masked forward
 * per round that appends only the nodes grown in the previous round, so each node is computed
 * once; a confidence-based branch pacer, branches opened where a candidate passes the branch
 * threshold — --branch-threshold, raised while the target keeps taking the best candidate
 * (ctl_branch) —, growth stopped by the self-adaptive fallback threshold alpha), publishes it into its ring in the arena and answers DraftReady (an empty draft too, so
 * the coordinator never waits on a speculator with nothing to say). The budget — nodes, depth,
 * and whether branches are allowed — comes with each Feedback from the coordinator's
 * controllers. While the target verifies it works ahead, one token-forward between socket polls:
 * it extends its KV along the draft's main branch and then keeps drafting greedily past the leaf
 * (the predicted correction/bonus token and a next draft's depth). When the next Feedback shows
 * everything up to there as drafted, the rest of that chain is the next draft's trunk, its K/V
 * already in place, often the whole draft — the same tree growth from scratch would give, only
 * sooner; otherwise the KV rows of the accepted part are kept and the rest, computed for a context
 * that did not happen, is dropped. After each verification that included its draft (the Feedback
 * says how many of its nodes were verified) alpha is updated by LLMCad's rule (see
 * spec_update_alpha).
 *
 * Liveness: the main loop heartbeats when it goes round, but a reset Feedback with a long prompt
 * keeps it in the draft model's prefill for seconds. A heartbeat thread covers that time: it sends
 * the heartbeat whenever the main loop has not for RT_HEARTBEAT_MS, as long as the main thread shows
 * signs of life (a stamp at every loop and between prefill chunks of SPEC_PREFILL_CHUNK tokens);
 * if the main thread has been silent for --stall-ms it stops, so a wedged speculator is still
 * replaced. Sends go through `sock_lock`; only the main thread receives. On the way out a
 * speculator removes the arena if its coordinator is dead (docs/actor-system.md, "Liveness").
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "policy/control.h"
#include "model/llama.h"
#include "model/medusa.h"
#include "model/ngram.h"
#include "model/tokenizer.h"
#include "group/runtime.h"

#define SPEC_STALL_MS_DEFAULT 30000 /* main thread silent this long: stop heartbeating */
#define SPEC_PREFILL_CHUNK 64       /* prompt tokens per prefill call (a sign of life between) */
#define SPEC_MAX_TOKENS 65536
/* the chain: the published main branch (<= ARENA_DRAFT_MAX), the predicted correction/bonus token
 * and a next draft's depth (<= ARENA_DRAFT_MAX) drafted ahead */
#define SPEC_CHAIN_MAX (2 * ARENA_DRAFT_MAX + 1)

typedef enum { SPEC_LAYERSKIP, SPEC_MODEL, SPEC_NGRAM, SPEC_MEDUSA } spec_kind;

/* A drafted token in the tree. parent -1: a child of the last committed token. */
typedef struct {
    int32_t token, parent;
    float conf; /* the drafter's probability of the token given its parent */
    double cum; /* cumulative confidence of the branch ending here (product of confs) */
    int depth;  /* 1 for children of the root */
    int children;
} spec_node;

typedef struct {
    const char *run_dir, *kind_s, *draft_path, *target_path, *layers_s, *id, *heads_path,
        *template_s, *corpus_path;
    spec_kind kind;
    int max_draft, ngram, threads, orphan_ms;
    bool ngram_set;   /* --ngram given */
    bool threads_set; /* --threads given: no measured choice */
    /* how it runs beside the workers and why, for the heartbeats once placement_ready is set
     * (written by the main thread before, never after) */
    char placement[200];
    bool placement_ready;
    bool place_pending;          /* the thread count is measured at the first draft request */
    llama_ctx_params ctx_params; /* what s->ctx was made with (spec_place makes it again) */
    float branch_threshold, alpha;
    /* the threshold the tree grows with (branch.value): --branch-threshold, raised while the
     * verifications show the target taking too few side branches (policy/control.h) */
    ctl_branch branch;
    bool alpha_off; /* --alpha off: no fallback (drafts run to the budget), no update */
    bool trace, work_ahead;
    /* replay (an ngram kind): sequences of token ids, -1 between two, looked up instead of the
     * context (--corpus) */
    int32_t *corpus;
    int n_corpus;
    const char *target_kv_s; /* --target-kv auto|on|off */
    int head_screen;         /* --head-screen K: the output layer screened in 4 bits, K rescored */
    /* the draft model reads the target's committed K/V in the arena (a re-quantized copy of the
     * target, or layerskip's first layers): no prefill and no K/V commits of its own; the
     * private KV then only holds the tree */
    bool kv_shared;
    bool layers_prefix; /* layerskip keeps the target's first layers (0 .. n-1), none skipped */
    llama_shared target_sh; /* the target's KV block in the arena (kv_shared) */
    /* kv_shared: the draft context's tree as a chain continuing the committed context — tree
     * index i holds tokens[n_committed - 1 + i] (the last committed token, then the chain) — for
     * i < tree_rows; its prefix is the target's n_committed - 1 committed tokens. kv_len is then
     * n_committed - 1 + tree_rows once spec_shared_fit has run. */
    int tree_rows;
    bool tree_branchy; /* the tree holds a grown draft, not a chain (until the main branch is kept) */
    char role[64];
    void *zctx, *sock;
    pthread_mutex_t sock_lock; /* sends come from the main and the heartbeat thread */
    /* shared with the heartbeat thread (atomics) */
    rt_life life;        /* heartbeats (from either thread), the main thread's last sign */
    uint64_t hb_drafts;  /* drafts published, for the heartbeat */
    bool hb_active;      /* drafting for a request */
    arena *arena;
    arena_draft_ring *ring;
    llama_model *model;
    llama_ctx *ctx;
    float *logits;
    /* the current request */
    uint64_t request_id;
    bool active;
    int32_t *tokens; /* committed, then the chain */
    int n_committed, n_chain, kv_len, n_ctx;
    int target_ctx; /* the target's context: tokens past it can never be committed */
    float chain_conf[SPEC_CHAIN_MAX]; /* the drafter's probability of each chain token */
    float chain_alt[SPEC_CHAIN_MAX];  /* ... and of the best other candidate at its parent (1:
                                       * unknown), which decides whether the tree branches there */
    int n_pub;      /* main-branch length of the published draft (the chain starts with it) */
    int logits_at;  /* `logits` are the next-token logits after tokens[0..logits_at) (-1: none) */
    bool published; /* a DraftReady went out for n_committed */
    uint64_t fb_us, fb_end_us; /* the latest Feedback: arrived, applied (0: none since the last
                                * draft); reported with the draft for the step timeline */
    uint64_t drafts, last_coord_us;
    /* the draft budget from the last Feedback */
    int max_nodes, max_depth;
    /* the plan's tree shape from the last Feedback (n_shape 0: none), drafted exactly by medusa */
    int32_t shape_parent[ARENA_DRAFT_MAX], shape_rank[ARENA_DRAFT_MAX];
    int n_shape;
    bool tree;
    /* the tree last published (for the fallback threshold update) */
    spec_node nodes[ARENA_DRAFT_MAX];
    int n_nodes;
    /* the tree the last growth left in the draft context (tree index 0: the root at position
     * tree_root_pos, node i: tree index i + 1, the first tree_run nodes forwarded); valid until any
     * other forward, and only for a growth without a trunk */
    bool tree_ok;
    int tree_run, tree_root_pos;
    float *tree_logits; /* (ARENA_DRAFT_MAX + 1) x vocab */
    /* medusa */
    medusa *heads;
    int tmpl[16], tmpl_len;
    const rt_hidden *hidden;
    float *hbuf;
} spec;

static volatile sig_atomic_t spec_stop;

static void spec_on_signal(int sig)
{
    (void)sig;
    spec_stop = 1;
}

static void spec_usage(FILE *out)
{
    fprintf(
        out,
        "usage: orochi-speculator --run-dir D --kind layerskip|model|ngram|medusa|replay\n"
        "                         [--id NAME] [--corpus IDS.txt]\n"
        "                         [--max-draft S] [--threads T]\n"
        "                         [--target M.gguf] [--layers 0-14|0,2,4] [--draft M.gguf]\n"
        "                         [--ngram N] [--branch-threshold P] [--alpha A|off]\n"
        "                         [--work-ahead 0|1] [--heads H.gguf] [--template 3,2,1]\n"
        "                         [--target-kv auto|on|off] [--head-screen K]\n"
        "                         [--orphan-ms MS] [--stall-ms MS] [--trace]\n"
        "  layerskip: the target with only --layers (default: the first half)\n"
        "  model:     a separate draft GGUF with the target's vocabulary (--draft)\n"
        "  ngram:     continuation of the latest earlier match of the last N..1 tokens\n"
        "  medusa:    Medusa heads (--heads, see docs/medusa.md) on the target's hidden state\n"
        "  replay:    continuation of the first match of the context's last N..1 tokens (N:\n"
        "             --ngram, default 64 here) in --corpus, a file of token ids, one sequence a\n"
        "             line: fed the target's own greedy answers, a perfect drafter\n"
        "  --work-ahead 1 (default): while the target verifies, extend the KV along the draft's\n"
        "  main branch and keep drafting past it, so a confirmed chain is the next draft\n"
        "  --target-kv auto (default): a model drafter with the target's whole shape (a\n"
        "  re-quantized copy), or layerskip keeping the first layers (0-N), reads the\n"
        "  target's committed K/V in the arena: no prefill or catch-up of its own;\n"
        "  on: require it; off: keep a private prefix\n"
        "  --head-screen K (8): a model drafter's output layer wider than 4 bits is screened\n"
        "  with a 4-bit copy and its K best candidates recomputed exactly (0: off)\n"
        "  --orphan-ms (10000): exit when the coordinator has been silent this long\n"
        "  --stall-ms (30000): stop heartbeating when the main thread has been busy in one\n"
        "  computation this long (so the coordinator replaces a wedged speculator)\n");
}

static int spec_send(spec *s, Orochi__Envelope__BodyCase which, void *body)
{
    Orochi__Envelope env;
    pthread_mutex_lock(&s->sock_lock);
    int rc = rt_send(s->sock, NULL, 0, rt_env(&env, which, body));
    pthread_mutex_unlock(&s->sock_lock);
    return rc;
}

static void spec_alive(spec *s)
{
    rt_stamp(&s->life.alive_us);
}

/* Send a heartbeat if one is due (from either thread; none while the main thread is wedged). */
static void spec_heartbeat_due(spec *s)
{
    if (!rt_life_due(&s->life, true))
        return;
    Orochi__Heartbeat hb = OROCHI__HEARTBEAT__INIT;
    hb.time_us = rt_now_us();
    hb.steps = __atomic_load_n(&s->hb_drafts, __ATOMIC_RELAXED);
    hb.state = __atomic_load_n(&s->hb_active, __ATOMIC_RELAXED) ? "drafting" : "idle";
    if (__atomic_load_n(&s->placement_ready, __ATOMIC_ACQUIRE))
        hb.placement = s->placement;
    spec_send(s, OROCHI__ENVELOPE__BODY_HEARTBEAT, &hb);
}

/* The heartbeat thread: keeps the speculator visibly alive while the main thread computes (a long
 * prompt's prefill), but not while the main thread is wedged. */
static void *spec_heartbeat_thread(void *arg)
{
    spec *s = arg;
    const struct timespec tick = {0, 50 * 1000000L};
    while (!spec_stop) {
        spec_heartbeat_due(s);
        nanosleep(&tick, NULL);
    }
    return NULL;
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
    snprintf(err, errlen, "--layers '%s': expected indices or ranges within 0..%d", spec_s,
             n_layers - 1);
    return -1;
}

/* kv_shared: make the draft context's tree exactly the chain of tokens[n_committed - 1, kv_len)
 * (fewer rows when kv_len was cut back: the rest is dropped); with nothing past the target's
 * committed prefix the tree is empty and the context's prefix is that prefix. */
static int spec_shared_fit(spec *s)
{
    int base = s->n_committed - 1, want = s->kv_len - base;
    if (s->tree_branchy) { /* a grown draft: nothing of it is a chain of the context */
        s->tree_branchy = false;
        s->tree_rows = 0;
    }
    if (want < 0) {
        want = 0;
        s->kv_len = base;
    }
    if (want > s->tree_rows) { /* cannot happen: kv_len only grows by extending the tree */
        s->kv_len = base + s->tree_rows;
        want = s->tree_rows;
    }
    if (want == 0) {
        s->tree_rows = 0;
        llama_ctx_set_prefix_len(s->ctx, base);
        return 0;
    }
    if (want < s->tree_rows) {
        int32_t path[ARENA_DRAFT_MAX];
        for (int i = 0; i < want; i++)
            path[i] = i;
        char err[256];
        if (llama_tree_keep_path(s->ctx, path, want, 0, err, sizeof err)) {
            rt_log(s->role, "draft model: %s", err);
            s->tree_rows = 0;
            s->kv_len = base;
            llama_ctx_set_prefix_len(s->ctx, base);
            return -1;
        }
        s->tree_rows = want;
    }
    return 0;
}

/* kv_shared: cover tokens[0 .. upto): the target's prefix holds the committed ones, the tree the
 * rest (forwarded one chain batch, the logits of the last into `logits`). */
static int spec_shared_extend(spec *s, int upto)
{
    if (spec_shared_fit(s))
        return -1;
    int base = s->n_committed - 1;
    if (upto <= s->kv_len)
        return 0;
    int n = upto - s->kv_len, at = s->tree_rows;
    if (at + n > ARENA_DRAFT_MAX) {
        rt_log(s->role, "draft model: a chain of %d rows is past the draft width %d", at + n,
               ARENA_DRAFT_MAX);
        return -1;
    }
    int32_t par[ARENA_DRAFT_MAX];
    for (int i = 0; i < n; i++)
        par[i] = at + i - 1; /* a chain: the root's parent is the prefix (-1) */
    llama_batch b = {.n = n,
                     .tokens = s->tokens + s->kv_len,
                     .parent = par,
                     .logits_from = n - 1,
                     .append = at > 0};
    char err[256];
    if (at == 0)
        llama_ctx_set_prefix_len(s->ctx, base);
    if (llama_forward(s->ctx, &b, s->logits, err, sizeof err)) {
        rt_log(s->role, "draft model: %s", err);
        s->tree_rows = 0;
        s->kv_len = base;
        s->logits_at = -1;
        return -1;
    }
    s->tree_rows = at + n;
    s->kv_len = s->logits_at = upto;
    return 0;
}

/* Make the private KV cover tokens[0 .. upto) (committed tokens, then the main branch of the last
 * draft when the speculator works ahead). */
static int spec_catch_up(spec *s, int upto)
{
    if (s->kv_len >= upto)
        return 0;
    if (s->kv_shared)
        return spec_shared_extend(s, upto);
    char err[256];
    llama_ctx_set_prefix_len(s->ctx, s->kv_len);
    s->logits_at = -1;
    s->tree_ok = false; /* this forward overwrites the tree area */
    /* a long prompt in chunks, with a sign of life between them (the heartbeat thread) */
    while (s->kv_len < upto) {
        int n = upto - s->kv_len < SPEC_PREFILL_CHUNK ? upto - s->kv_len : SPEC_PREFILL_CHUNK;
        if (llama_prefill(s->ctx, s->tokens + s->kv_len, n, s->logits, err, sizeof err)) {
            rt_log(s->role, "draft model: %s", err);
            return -1;
        }
        s->kv_len += n;
        spec_alive(s);
    }
    s->kv_len = s->logits_at = upto;
    return 0;
}

/* Forget KV rows from `len` on (computed for tokens that are no longer there), and the next-token
 * logits if they came from those rows. */
static void spec_kv_truncate(spec *s, int len)
{
    if (s->kv_len > len)
        s->kv_len = len;
    if (s->logits_at > s->kv_len)
        s->logits_at = -1;
}

/* Most probable first, ties to the lower id: the k best are then the first k of one order, so the
 * best candidate is the same whatever k is (the work-ahead asks for 2, the tree decoder for 4). */
/* The k most probable tokens of a logits row (softmax), best first: out[i] = {prob, id}. */
static int spec_top(const float *logits, int V, int k, float (*out)[2])
{
    /* the k largest logits in one pass (ties: the lower id), then one vectorised pass for the
     * softmax denominator: the drafter calls this once per leaf per round over the whole vocabulary
     */
    int32_t ids[4];
    int n = k_top(logits, V, k < 4 ? k : 4, ids);
    if (!n)
        return 0;
    float mx = logits[ids[0]], sum = k_sum_exp(logits, V, mx);
    for (int j = 0; j < n; j++) {
        out[j][0] = sum > 0 ? expf(logits[ids[j]] - mx) / sum : 0.0f;
        out[j][1] = (float)ids[j];
    }
    return n;
}

/* Grow a draft tree for the committed context with the draft model (LLMCad's tree generation).
 *
 * The trunk: when the Feedback confirmed everything the speculator had drafted ahead (see
 * spec_work_ahead), the rest of that chain already continues this very context, its K/V computed
 * or nearly. Its tokens are the drafter's best candidates, so as long as no other candidate at a
 * parent passes the branch threshold, growth from scratch would make exactly these nodes, one per
 * round (confidences multiplying, stopped by the same budget and alpha): they are taken as they
 * are, and the tree grows below the last of them — the draft is the one growth from scratch gives,
 * only sooner. If the trunk reaches the budget or alpha the draft is ready without a forward.
 *
 * Growth: the first round runs the root alone (the last committed token, or the trunk's last
 * token) as a fresh tree, each later round appends only the nodes the previous round grew (the tree
 * decoder: the tree mask keeps branches apart, the earlier nodes' K/V stay in the tree area), so
 * every node is forwarded once and a chain of depth d costs d token-forwards, not 1 + 2 + ... + d.
 * Appending gives bit-identical logits to re-running the whole tree (tests/unit/test_draft_kv.c),
 * so the tree is the one a full forward per round grows. After each round the leaves the
 * confidence-based pacer picks are extended. The pacer gives branch x the share M * C_x / sum(C)
 * of the node budget M (C: the branch's cumulative confidence) and extends the branches furthest
 * below their share first (max-min fairness). A leaf's best candidate extends its branch; other
 * candidates whose probability passes the branch threshold open new branches. Growth stops when
 * the tree-cumulative confidence (the best branch's C) drops below alpha — LLMCad's fallback:
 * time to verify — or the budget (nodes, depth) is spent. */
static int spec_grow_model(spec *s)
{
    int V = s->model->cfg.vocab, n = 0;
    double cum = 1.0;
    for (;;) {
        if (n >= s->max_depth || n >= s->max_nodes || cum < s->alpha)
            return n; /* growth would stop here too */
        if (n >= s->n_chain || (s->tree && s->chain_alt[n] >= s->branch.value))
            break; /* growth would branch at this parent: the tree decoder takes over */
        cum *= s->chain_conf[n];
        s->nodes[n] = (spec_node){.token = s->tokens[s->n_committed + n],
                                  .parent = n - 1,
                                  .conf = s->chain_conf[n],
                                  .cum = cum,
                                  .depth = n + 1};
        if (n > 0)
            s->nodes[n - 1].children = 1;
        n++;
    }
    int m = n;                     /* trunk nodes; node m - 1 is the root of the growth below */
    int base = s->n_committed + m; /* tokens up to and including the root */
    /* kv_shared: the tree is the chain up to the growth root (exclusive), node i at tree index
     * i + 1; otherwise the tree starts at the growth root, node i at tree index i - m + 1 */
    bool sh = s->kv_shared;
    if (sh && s->kv_len > base - 1)
        s->kv_len = base - 1;
    if (spec_catch_up(s, base - 1) || (sh && spec_shared_fit(s)))
        return m;
    int32_t tok[ARENA_DRAFT_MAX + 1], par[ARENA_DRAFT_MAX + 1];
    char err[256];
    int n_run = m; /* nodes already forwarded */
    if (!sh)
        llama_ctx_set_prefix_len(s->ctx, base - 1);
    if (sh && m + 1 + s->max_nodes > ARENA_DRAFT_MAX)
        return m; /* no room for the growth past the trunk */
    /* each trunk node took one round of growth from scratch: the rounds go on from there */
    for (int round = m; round < s->max_depth && n < s->max_nodes; round++) {
        /* tree index 0 is the root, node i >= m is tree index i - m + 1 */
        llama_batch b = {
            .tokens = tok, .parent = par, .logits_from = 0, .append = round > m || (sh && m > 0)};
        if (round == m) {
            tok[0] = s->tokens[base - 1];
            par[0] = sh ? m - 1 : -1;
            b.n = 1;
        } else {
            for (int i = n_run; i < n; i++) {
                tok[i - n_run] = s->nodes[i].token;
                par[i - n_run] = s->nodes[i].parent - (sh ? -1 : m - 1);
            }
            b.n = n - n_run;
        }
        float *rows = s->tree_logits + (size_t)(round == m ? 0 : n_run - m + 1) * V;
        if (llama_forward(s->ctx, &b, rows, err, sizeof err)) {
            rt_log(s->role, "draft model: %s", err);
            if (sh)
                s->tree_branchy = true; /* whatever the tree holds now, it is no chain */
            break;
        }
        if (sh) {
            s->tree_rows = round == m ? m + 1 : s->tree_rows + b.n;
            s->tree_branchy = true;
            s->logits_at = -1; /* the chain's last logits were for a row now past the tree */
        }
        n_run = n;
        /* the open leaves (the root on the first round), ordered by the pacer */
        int leaves[ARENA_DRAFT_MAX + 1], n_leaves = 0;
        double total = 0;
        if (n == 0) {
            leaves[n_leaves++] = -1;
            total = 1;
        }
        for (int i = 0; i < n; i++)
            if (!s->nodes[i].children && s->nodes[i].depth < s->max_depth) {
                leaves[n_leaves++] = i;
                total += s->nodes[i].cum;
            }
        if (!n_leaves)
            break;
        double deficit[ARENA_DRAFT_MAX + 1];
        for (int l = 0; l < n_leaves; l++) {
            const spec_node *nd = leaves[l] < 0 ? NULL : &s->nodes[leaves[l]];
            double c = nd ? nd->cum : 1.0;
            deficit[l] = s->max_nodes * c / (total > 0 ? total : 1) - (nd ? nd->depth : 0);
        }
        for (int a = 1; a < n_leaves; a++) /* insertion sort, largest deficit first */
            for (int b2 = a; b2 > 0 && deficit[b2] > deficit[b2 - 1]; b2--) {
                double td = deficit[b2];
                deficit[b2] = deficit[b2 - 1];
                deficit[b2 - 1] = td;
                int tl = leaves[b2];
                leaves[b2] = leaves[b2 - 1];
                leaves[b2 - 1] = tl;
            }
        int grown = 0;
        for (int l = 0; l < n_leaves && n < s->max_nodes; l++) {
            int leaf = leaves[l];
            if (n > 0 && deficit[l] <= 0 && grown)
                break; /* this branch already has its share: let the others catch up next round */
            const float *row = s->tree_logits + (size_t)(leaf - m + 1) * V;
            float top[4][2];
            int k = spec_top(row, V, s->tree ? 4 : 1, top);
            double base = leaf < 0 ? 1.0 : s->nodes[leaf].cum;
            int depth = leaf < 0 ? 1 : s->nodes[leaf].depth + 1;
            for (int c = 0; c < k && n < s->max_nodes; c++) {
                if (c > 0 && top[c][0] < s->branch.value)
                    break;
                s->nodes[n] = (spec_node){.token = (int32_t)top[c][1],
                                          .parent = leaf,
                                          .conf = top[c][0],
                                          .cum = base * top[c][0],
                                          .depth = depth};
                if (leaf >= 0)
                    s->nodes[leaf].children++;
                n++;
                grown++;
            }
        }
        if (!grown)
            break;
        double tc = 0; /* tree-cumulative confidence: the best branch */
        for (int i = 0; i < n; i++)
            if (!s->nodes[i].children && s->nodes[i].cum > tc)
                tc = s->nodes[i].cum;
        if (tc < s->alpha)
            break;
    }
    s->tree_ok = m == 0 && n_run > 0;
    s->tree_run = n_run;
    s->tree_root_pos = base - 1;
    return n;
}

/* Prompt lookup: the continuation of the most recent earlier occurrence of the context's last
 * k tokens (k from --ngram down to 1), as a chain. replay: the continuation of the first
 * occurrence of the longest such suffix in the corpus, up to the end of its sequence. */
static int spec_grow_ngram(spec *s)
{
    int n_ctx = s->n_committed, n = 0, k = 0;
    const int32_t *src = s->corpus ? s->corpus : s->tokens;
    int end = s->corpus ? s->n_corpus : n_ctx;
    int pos = s->corpus ? ngram_lookup_corpus(s->tokens, n_ctx, s->corpus, s->n_corpus, s->ngram, &k)
                        : ngram_lookup(s->tokens, n_ctx, s->ngram, &k);
    for (int j = pos; pos >= 0 && j < end && src[j] >= 0 && n < s->max_nodes && n < s->max_depth;
         j++, n++)
        s->nodes[n] = (spec_node){
            .token = src[j], .parent = n - 1, .conf = (float)k / (k + 1), .depth = n + 1};
    return n;
}

/* --corpus FILE: whitespace-separated token ids, one sequence a line. */
static int spec_load_corpus(spec *s, char *err, size_t errlen)
{
    FILE *f = fopen(s->corpus_path, "r");
    if (!f) {
        snprintf(err, errlen, "--corpus %s: %s", s->corpus_path, strerror(errno));
        return -1;
    }
    int cap = 4096, line = 1, rc = -1;
    s->corpus = malloc((size_t)cap * sizeof *s->corpus);
    s->n_corpus = 0;
    for (int ch = fgetc(f); s->corpus && ch != EOF;) {
        if (s->n_corpus + 2 > cap) {
            int32_t *grown = realloc(s->corpus, (size_t)(cap *= 2) * sizeof *s->corpus);
            if (!grown)
                break;
            s->corpus = grown;
        }
        if (ch == '\n') {
            if (s->n_corpus && s->corpus[s->n_corpus - 1] >= 0)
                s->corpus[s->n_corpus++] = -1;
            line++;
            ch = fgetc(f);
        } else if (isspace(ch)) {
            ch = fgetc(f);
        } else if (isdigit(ch)) {
            long v = 0;
            for (; isdigit(ch) && v <= INT32_MAX; ch = fgetc(f))
                v = v * 10 + (ch - '0');
            if (v > INT32_MAX) {
                snprintf(err, errlen, "--corpus %s, line %d: a token id past 2^31", s->corpus_path,
                         line);
                goto done;
            }
            s->corpus[s->n_corpus++] = (int32_t)v;
        } else {
            snprintf(err, errlen, "--corpus %s, line %d: '%c' is not part of a token id",
                     s->corpus_path, line, ch);
            goto done;
        }
    }
    if (!s->corpus)
        snprintf(err, errlen, "--corpus %s: out of memory", s->corpus_path);
    else if (!s->n_corpus)
        snprintf(err, errlen, "--corpus %s holds no token ids", s->corpus_path);
    else
        rc = 0;
done:
    fclose(f);
    return rc;
}

/* Medusa: the heads applied to the target's hidden state at the last accepted token, which the
 * coordinator publishes in the arena; the tree is the plan's shape when the Feedback carries one
 * (the calibrated tree, drafted exactly), else it follows the template (--template). */
static int spec_grow_medusa(spec *s)
{
    const rt_hidden *h = s->hidden;
    uint32_t dim = (uint32_t)s->model->cfg.dim;
    for (int tries = 0; tries < 3; tries++) {
        uint32_t before = __atomic_load_n(&h->seq, __ATOMIC_ACQUIRE);
        if (before & 1)
            continue;
        bool match = h->request_id == s->request_id && h->ctx_len == (uint64_t)s->n_committed &&
                     h->dim == dim;
        memcpy(s->hbuf, h->h, dim * sizeof(float));
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&h->seq, __ATOMIC_RELAXED) != before)
            continue;
        if (!match)
            return 0; /* not this context's state (yet): no draft this time */
        int depth = s->tmpl_len < s->max_depth ? s->tmpl_len : s->max_depth;
        int32_t tok[ARENA_DRAFT_MAX], par[ARENA_DRAFT_MAX];
        float conf[ARENA_DRAFT_MAX];
        int n = s->n_shape
                    ? medusa_draft_shape(s->heads, NULL, s->hbuf, s->shape_parent, s->shape_rank,
                                         s->n_shape, s->max_depth, s->max_nodes, tok, par, conf)
                    : medusa_draft_tree(s->heads, NULL, s->hbuf, s->tmpl, depth, s->max_nodes, tok,
                                        par, conf);
        for (int i = 0; i < n; i++) {
            int d = par[i] < 0 ? 1 : s->nodes[par[i]].depth + 1;
            double base = par[i] < 0 ? 1.0 : s->nodes[par[i]].cum;
            s->nodes[i] = (spec_node){.token = tok[i],
                                      .parent = par[i],
                                      .conf = conf[i],
                                      .cum = base * conf[i],
                                      .depth = d};
            if (par[i] >= 0)
                s->nodes[par[i]].children++;
        }
        return n < 0 ? 0 : n;
    }
    return 0;
}

/* The main branch of the published tree: its most confident leaf's path, leaf first (node
 * indices into out); returns its length. */
static int spec_main_branch(const spec *s, int *out)
{
    int best = -1, n = 0;
    for (int i = 0; i < s->n_nodes; i++)
        if (!s->nodes[i].children && (best < 0 || s->nodes[i].cum > s->nodes[best].cum))
            best = i;
    for (int i = best; i >= 0; i = s->nodes[i].parent)
        out[n++] = i;
    return n;
}

/* The main branch of the published tree (the most confident leaf's path), as the chain the
 * speculator works ahead on while the target verifies. A chain drafted ahead that the branch
 * begins (the branch was its trunk) is kept whole; otherwise K/V rows past the part both share
 * were computed for other tokens and are dropped. */
static void spec_set_chain(spec *s)
{
    int path[ARENA_DRAFT_MAX], n = spec_main_branch(s, path);
    if (s->n_committed + n >= SPEC_MAX_TOKENS)
        n = 0;
    int same = 0;
    while (same < n && same < s->n_chain &&
           s->tokens[s->n_committed + same] == s->nodes[path[n - 1 - same]].token)
        same++;
    s->n_pub = n;
    if (same == n && s->n_chain >= n)
        return;
    for (int i = 0; i < n; i++) {
        s->tokens[s->n_committed + i] = s->nodes[path[n - 1 - i]].token;
        s->chain_conf[i] = s->nodes[path[n - 1 - i]].conf;
        s->chain_alt[i] = 1.0f; /* not recorded in the tree: never a trunk node */
    }
    s->n_chain = n;
    spec_kv_truncate(s, s->n_committed + same);
}

/* The tree indices of the published main branch that the growth forwarded: the root (0), then
 * its nodes root first while forwarded, the leaf left out (the work-ahead forwards it for its
 * logits). Returns how many. */
static int spec_main_branch_rows(const spec *s, int32_t *path)
{
    int chain[ARENA_DRAFT_MAX], n = spec_main_branch(s, chain), len = 0;
    path[len++] = 0;
    for (int k = n - 1; k >= 0 && chain[k] < s->tree_run && len <= n - 1; k--)
        path[len++] = chain[k] + 1;
    return len;
}

/* Drafting ahead starts from the published tree's main branch: its rows that the growth already
 * forwarded move from the tree area into the prefix (root first), so the work-ahead only computes
 * the branch's last token and what lies beyond, instead of forwarding the branch again. */
static void spec_keep_main_branch(spec *s)
{
    if (s->kv_shared) { /* the tree becomes the main branch's chain (drafting ahead or not: the
                         * next Feedback may confirm it and keep the rows past what it commits) */
        if (!s->tree_branchy || s->n_nodes <= 0)
            return;
        int32_t path[ARENA_DRAFT_MAX + 1];
        int len = spec_main_branch_rows(s, path);
        char err[256];
        s->tree_branchy = false;
        if (llama_tree_keep_path(s->ctx, path, len, 0, err, sizeof err)) {
            rt_log(s->role, "draft model: %s", err);
            s->tree_rows = 0;
            s->kv_len = s->n_committed - 1;
            llama_ctx_set_prefix_len(s->ctx, s->kv_len);
            return;
        }
        s->tree_rows = len;
        s->kv_len = s->n_committed - 1 + len;
        s->logits_at = -1;
        return;
    }
    if (!s->work_ahead || !s->tree_ok || s->kv_len != s->tree_root_pos || s->n_nodes <= 0)
        return;
    int32_t path[ARENA_DRAFT_MAX + 1];
    int len = spec_main_branch_rows(s, path);
    s->tree_ok = false;
    char err[256];
    if (llama_commit(s->ctx, path, len, err, sizeof err)) {
        rt_log(s->role, "draft model: %s", err);
        return;
    }
    s->kv_len += len;
    s->logits_at = -1;
}

/* Draft for the current context and publish it (an empty draft too). */
static void spec_publish(spec *s)
{
    uint64_t t0 = rt_now_us();
    s->n_nodes = 0;
    if (s->kind == SPEC_NGRAM)
        s->n_nodes = spec_grow_ngram(s);
    else if (s->kind == SPEC_MEDUSA)
        s->n_nodes = spec_grow_medusa(s);
    else if (s->n_committed >= 1 && s->n_committed + s->max_depth + 1 < s->n_ctx)
        s->n_nodes = spec_grow_model(s);
    arena_draft d = {0};
    d.request_id = s->request_id;
    d.ctx_len = (uint64_t)s->n_committed;
    d.last_token = s->n_committed ? s->tokens[s->n_committed - 1] : -1;
    d.n = (uint32_t)s->n_nodes;
    for (int i = 0; i < s->n_nodes; i++) {
        d.tokens[i] = s->nodes[i].token;
        d.parent[i] = s->nodes[i].parent;
        d.conf[i] = s->nodes[i].conf;
    }
    uint32_t slot = arena_draft_ring_put(s->ring, &d);
    Orochi__DraftReady r = OROCHI__DRAFT_READY__INIT;
    r.request_id = s->request_id;
    r.ctx_len = d.ctx_len;
    r.slot = slot;
    r.n_tokens = d.n;
    r.feedback_us = s->fb_us;
    r.feedback_end_us = s->fb_end_us;
    r.draft_start_us = t0;
    r.draft_end_us = rt_now_us();
    s->fb_us = s->fb_end_us = 0;
    spec_send(s, OROCHI__ENVELOPE__BODY_DRAFT_READY, &r);
    s->published = true;
    s->drafts++;
    __atomic_store_n(&s->hb_drafts, s->drafts, __ATOMIC_RELAXED);
    int ahead = s->n_chain; /* drafted ahead for this context before the Feedback came */
    spec_set_chain(s);
    spec_keep_main_branch(s);
    if (s->trace)
        rt_log(s->role,
               "draft of %u tokens for context %d in %.1f ms (%d drafted ahead, alpha %.4g, "
               "branch threshold %.3g)",
               d.n, s->n_committed, (rt_now_us() - t0) / 1e3, ahead, s->alpha, s->branch.value);
}

/* May the chain grow by one more token drafted ahead? Up to the predicted correction/bonus token
 * and a whole next draft's depth past the published main branch — what the next draft needs if
 * the target accepts everything — and never past the target's context. */
static bool spec_may_extend(const spec *s)
{
    int end = s->n_committed + s->n_chain;
    if (s->kv_shared && s->n_chain + 2 + s->max_nodes > ARENA_DRAFT_MAX)
        return false; /* the chain's rows and the next growth share the draft width */
    return s->n_pub > 0 && s->n_chain < s->n_pub + 1 + s->max_depth &&
           s->n_chain < SPEC_CHAIN_MAX && end < s->target_ctx && end + 1 < SPEC_MAX_TOKENS &&
           end + 1 < s->n_ctx;
}

/* Work ahead while the target verifies (LLMCad's speculative generation): extend the private KV
 * along the main branch, and past its leaf draft further tokens greedily (the drafter's argmax),
 * so that when the Feedback shows the main branch and the correction/bonus token all as drafted,
 * the rest of the chain is the start of the next draft with its K/V in place (spec_grow_model's
 * trunk). At most one single-token forward per call: the caller polls its socket in between, so a
 * Feedback never waits longer than one draft-token forward. Returns whether there is more to do. */
static bool spec_work_ahead(spec *s)
{
    if (!s->work_ahead || !s->ctx || !s->active || !s->published)
        return false;
    int end = s->n_committed + s->n_chain;
    /* the chain is covered but its last token's logits are gone: recompute that row */
    if (s->kv_len == end && s->logits_at != end && s->kv_len > s->n_committed && spec_may_extend(s))
        s->kv_len--;
    if (s->kv_len < end && (s->kv_len + 1 >= s->n_ctx || spec_catch_up(s, s->kv_len + 1)))
        return false;
    if (s->kv_len == end && s->logits_at == end && spec_may_extend(s)) {
        float top[2][2];
        int k = spec_top(s->logits, s->model->cfg.vocab, 2, top);
        s->tokens[end] = (int32_t)top[0][1];
        s->chain_alt[s->n_chain] = k > 1 ? top[1][0] : 0.0f;
        s->chain_conf[s->n_chain++] = top[0][0];
    }
    return s->kv_len < s->n_committed + s->n_chain;
}

/* LLMCad's threshold update from the verification of our last tree (ctl_alpha_update). */
static void spec_update_alpha(spec *s, const int32_t *accepted, int n_acc)
{
    if (!s->n_nodes || s->alpha_off)
        return;
    int32_t token[ARENA_DRAFT_MAX], parent[ARENA_DRAFT_MAX];
    for (int i = 0; i < s->n_nodes; i++)
        token[i] = s->nodes[i].token, parent[i] = s->nodes[i].parent;
    s->alpha = ctl_alpha_update(s->alpha, token, parent, s->n_nodes, accepted, n_acc);
}

/* Count the branch points of our last tree on the accepted path, and the side branches the
 * target took there, for the branch threshold (ctl_branch_update). */
static void spec_update_branch(spec *s, const int32_t *accepted, int n_acc)
{
    if (!s->tree || !s->n_nodes)
        return;
    int parent = -1, points = 0, side = 0;
    for (int k = 0; k < n_acc; k++) {
        int first = -1, hit = -1, kids = 0;
        for (int i = 0; i < s->n_nodes; i++)
            if (s->nodes[i].parent == parent) {
                kids++;
                if (first < 0)
                    first = i;
                if (hit < 0 && s->nodes[i].token == accepted[k])
                    hit = i;
            }
        if (hit < 0)
            break;
        if (kids > 1) {
            points++;
            side += hit != first;
        }
        parent = hit;
    }
    ctl_branch_update(&s->branch, points, side);
}

/* kv_shared, all n tokens of a Feedback as drafted ahead: the target has committed the root and
 * the first n - 1 of them, so the first n rows of the chain leave the tree (they are the target's
 * prefix now) and the rest stays, the last Feedback token its new root. Before n_committed moves. */
static void spec_shared_advance(spec *s, int n)
{
    if (spec_shared_fit(s))
        return;
    int rows = s->tree_rows;
    if (rows > n) {
        int32_t path[ARENA_DRAFT_MAX];
        for (int i = 0; i < rows; i++)
            path[i] = i;
        char err[256];
        if (!llama_tree_keep_path(s->ctx, path, rows, n, err, sizeof err)) {
            s->tree_rows = rows - n;
            return;
        }
        rt_log(s->role, "draft model: %s", err);
    }
    /* nothing past the new root was forwarded: the tree starts afresh at the new prefix */
    s->tree_rows = 0;
    s->kv_len = s->n_committed + n - 1;
    llama_ctx_set_prefix_len(s->ctx, s->kv_len);
    if (s->logits_at < s->kv_len)
        s->logits_at = -1;
}

/* Apply a Feedback: keep the accepted part of the chain (and its KV), drop the rest. */
/* The accepted tokens that the last grown tree already forwarded keep their K/V: the tree's root
 * and the accepted path below it move from the tree area into the prefix (llama_commit) instead of
 * being forwarded again by the next catch-up — each drafted token is computed once. */
static void spec_commit_accepted(spec *s, const int32_t *acc, int n)
{
    if (s->kv_shared) /* the target's prefix already holds them */
        return;
    if (!s->tree_ok || s->kv_len != s->tree_root_pos || s->n_nodes <= 0) {
        if (s->trace)
            rt_log(s->role, "no tree K/V to keep (tree %d, kv %d, root %d, nodes %d)", s->tree_ok,
                   s->kv_len, s->tree_root_pos, s->n_nodes);
        return;
    }
    s->tree_ok = false;
    int32_t path[ARENA_DRAFT_MAX + 1];
    int len = 0, parent = -1;
    path[len++] = 0;                  /* the root: the last committed token */
    for (int k = 0; k + 1 < n; k++) { /* not the last token: it is the next tree's root */
        int hit = -1;
        for (int i = 0; i < s->tree_run && i < s->n_nodes; i++)
            if (s->nodes[i].parent == parent && s->nodes[i].token == acc[k]) {
                hit = i;
                break;
            }
        if (hit < 0)
            break;
        path[len++] = hit + 1;
        parent = hit;
    }
    char err[256];
    if (llama_commit(s->ctx, path, len, err, sizeof err)) {
        rt_log(s->role, "draft model: %s", err);
        return;
    }
    s->kv_len += len;
    if (s->trace)
        rt_log(s->role, "kept the K/V of %d tree rows (root and %d accepted)", len, len - 1);
}

static void spec_feedback(spec *s, const Orochi__Feedback *fb)
{
    if (fb->done) {
        if (fb->request_id == s->request_id)
            s->active = false;
        return;
    }
    if (fb->max_nodes)
        s->max_nodes = (int)(fb->max_nodes < ARENA_DRAFT_MAX ? fb->max_nodes : ARENA_DRAFT_MAX);
    if (fb->max_depth)
        s->max_depth = (int)fb->max_depth < s->max_draft ? (int)fb->max_depth : s->max_draft;
    s->tree = fb->tree;
    s->n_shape = 0;
    if (fb->n_shape_parent == fb->n_shape_rank)
        for (size_t i = 0; i < fb->n_shape_parent && i < ARENA_DRAFT_MAX; i++) {
            s->shape_parent[i] = (int32_t)fb->shape_parent[i];
            s->shape_rank[i] = (int32_t)fb->shape_rank[i];
            s->n_shape++;
        }
    if (s->kv_shared)
        llama_ctx_set_prefix_source_seq(s->ctx, (int)fb->seq_slot);
    if (fb->reset || fb->request_id != s->request_id) {
        if (!fb->reset) /* feedback for a request we never saw the start of */
            return;
        if (fb->n_tokens >= SPEC_MAX_TOKENS) {
            rt_log(s->role, "context of %zu tokens is beyond what this speculator keeps",
                   fb->n_tokens);
            s->active = false;
            return;
        }
        s->request_id = fb->request_id;
        s->active = true;
        memcpy(s->tokens, fb->tokens, fb->n_tokens * sizeof *s->tokens);
        s->n_committed = (int)fb->n_tokens;
        s->n_chain = 0;
        s->kv_len = 0;
        s->logits_at = -1;
        if (s->kv_shared) {
            s->kv_len = s->n_committed - 1;
            s->tree_branchy = false;
            s->tree_rows = 0;
            spec_shared_fit(s);
        }
        s->n_nodes = 0;
        s->n_pub = 0;
    } else {
        int n = (int)fb->n_tokens, keep = 0;
        if (s->n_committed + n >= SPEC_MAX_TOKENS) {
            s->active = false;
            return;
        }
        if (fb->drafted) { /* a draft the step never saw says nothing about alpha */
            spec_update_alpha(s, fb->tokens, n);
            spec_update_branch(s, fb->tokens, n);
        }
        spec_commit_accepted(s, fb->tokens, n);
        while (keep < n && keep < s->n_chain &&
               s->tokens[s->n_committed + keep] == fb->tokens[keep])
            keep++;
        if (keep == n) {
            /* all as drafted ahead: the rest of the chain, K/V included, continues the context */
            if (s->kv_shared)
                spec_shared_advance(s, n);
            s->n_committed += n;
            s->n_chain -= n;
            memmove(s->chain_conf, s->chain_conf + n, (size_t)s->n_chain * sizeof *s->chain_conf);
            memmove(s->chain_alt, s->chain_alt + n, (size_t)s->n_chain * sizeof *s->chain_alt);
        } else {
            /* KV rows past the first disagreement were computed for a context that never was */
            int valid = s->n_committed + keep;
            spec_kv_truncate(s, valid);
            memcpy(s->tokens + s->n_committed, fb->tokens, (size_t)n * sizeof *s->tokens);
            s->n_committed += n;
            s->n_chain = 0;
            if (s->kv_shared) { /* what the chain got right is the target's to hold now */
                s->kv_len = s->n_committed - 1;
                s->logits_at = -1;
                spec_shared_fit(s);
            }
        }
    }
    if ((uint64_t)s->n_committed != fb->ctx_len)
        rt_log(s->role, "context length %d disagrees with the coordinator's %llu", s->n_committed,
               (unsigned long long)fb->ctx_len);
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
    /* drafts need not match the target bit for bit: the default precision (8-bit activations for
     * the K-quants) makes a tree level of a K-quant drafter cheaper */
    if (llama_model_set_act_bits(s->model, LLAMA_ACT_AUTO, err, errlen))
        return -1;
    if (s->kind == SPEC_MEDUSA) {
        s->heads = medusa_load(s->heads_path, s->model, err, errlen);
        if (!s->heads)
            return -1;
        s->hbuf = malloc((size_t)s->model->cfg.dim * sizeof *s->hbuf);
        if (!s->hbuf) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
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
        s->layers_prefix = true;
        for (int i = 0; i < n; i++)
            s->layers_prefix &= list[i] == i;
        if (llama_model_keep_layers(s->model, list, n, err, errlen))
            return -1;
    }
    /* the drafter's output layer: a 4-bit screening copy when it is wider than that */
    uint32_t ht = (s->model->tied ? s->model->tok_embd : s->model->lm_head).type;
    if (s->head_screen > 0 && s->kind != SPEC_MEDUSA && ht != KT_Q4_0 && ht != KT_Q4_1 &&
        kt_row_bytes(ht, 32) > kt_row_bytes(KT_Q4_1, 32)) {
        if (llama_model_screen_head(s->model, KT_Q4_0, err, errlen))
            return -1;
    } else {
        s->head_screen = 0;
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

/* --target-kv: whether the draft model reads the target's committed K/V from the arena. `auto`
 * does when those rows are what the drafter would compute itself (or close to it): a model
 * drafter with the target's whole shape (layers, widths, heads, vocabulary), i.e. a re-quantized
 * copy; a layerskip drafter that keeps the target's first layers 0 .. n-1 (its layer l is the
 * target's layer l with the same input, so its K/V rows are the target's). `on` asks for it
 * (refused with the reason when the layers or attention shapes differ, or a layerskip list skips
 * a layer below its last); `off` keeps a private prefix. Shared, the speculator never prefills a
 * prompt or commits K/V — so after the guard has kept it idle it drafts at once instead of first
 * reading the whole context again; what it drafts ahead lives in its tree (the tokens past the
 * target's committed prefix have no rows there). Fills p for it. */
static int spec_share_target_kv(spec *s, const Orochi__Welcome *w, llama_ctx_params *p,
                                char *err, size_t errlen)
{
    const char *mode = s->target_kv_s ? s->target_kv_s : "auto";
    bool on = !strcmp(mode, "on"); /* required; auto: when the rows are the drafter's own */
    if (!strcmp(mode, "off"))
        return 0;
    bool skip = s->kind == SPEC_LAYERSKIP;
    if (s->kind != SPEC_MODEL && !(skip && s->layers_prefix)) {
        if (on) {
            snprintf(err, errlen,
                     skip ? "--target-kv on: --layers must be the target's first layers (0-N): "
                            "a skipped layer changes the K/V of every layer after it"
                          : "--target-kv on is for --kind model or layerskip");
            return -1;
        }
        return 0;
    }
    llama_config tc;
    char why[256];
    if (llama_read_config(w->target_model, &tc, why, sizeof why)) {
        snprintf(err, errlen, "--target-kv: cannot read the target's shape: %s", why);
        return on ? -1 : 0;
    }
    llama_config dcl = s->model->cfg; /* layerskip: its layers are the target's first ones */
    if (skip && dcl.n_layers <= tc.n_layers)
        dcl.n_layers = tc.n_layers;
    const llama_config *dc = &dcl;
    bool kv_ok = llama_config_same_kv(&tc, dc);
    bool copy = kv_ok && tc.ffn == dc->ffn && tc.vocab == dc->vocab;
    if (on && !kv_ok) {
        snprintf(err, errlen,
                 "--target-kv on: the draft model's layers/attention (%d layers, %d heads, %d KV "
                 "heads of %d) differ from the target's (%d, %d, %d of %d)",
                 dc->n_layers, dc->n_heads, dc->n_kv_heads, dc->head_dim, tc.n_layers, tc.n_heads,
                 tc.n_kv_heads, tc.head_dim);
        return -1;
    }
    if (!on && !copy)
        return 0;
    int n_seq = w->n_seq ? (int)w->n_seq : 1;
    uint64_t have = 0;
    void *block = arena_region_find(s->arena, RT_REGION_LLAMA, &have);
    kv_type kv = w->kv_type == KV_F16 ? KV_F16 : KV_F32; /* the target's, as the arena holds it */
    size_t need = llama_shared_layout(&tc, (int)w->n_ctx, (int)w->max_width, n_seq, kv, NULL);
    if (!block || have < need) {
        snprintf(err, errlen, "--target-kv: the arena has no K/V block for the target's shape");
        return on ? -1 : 0;
    }
    llama_shared_bind(&s->target_sh, block, &tc, (int)w->n_ctx, (int)w->max_width, n_seq, kv);
    p->kv = kv; /* the source's rows: the tree rows are read in the same stream */
    p->prefix_src = &s->target_sh;
    p->prefix_src_n_ctx = (int)w->n_ctx;
    p->prefix_src_max_width = (int)w->max_width;
    p->prefix_src_n_seq = n_seq;
    s->kv_shared = true;
    return 0;
}

/* One measurement of a drafter step on `threads` threads: a chain of SPEC_PLACE_W tokens (a tree
 * level's forward) and one token after it, at a short context. Seconds, or -1. */
#define SPEC_PLACE_W 4
static double spec_place_time(spec *s, llama_ctx *ctx, float *logits)
{
    int32_t ids[8 + SPEC_PLACE_W + 1];
    for (int i = 0; i < (int)(sizeof ids / sizeof *ids); i++)
        ids[i] = (int32_t)((i * 7919 + 13) % s->model->cfg.vocab);
    char err[256];
    llama_ctx_reset(ctx);
    if (llama_prefill(ctx, ids, 8, logits, err, sizeof err))
        return -1;
    uint64_t t0 = rt_now_us();
    if (llama_prefill(ctx, ids + 8, SPEC_PLACE_W, logits, err, sizeof err) ||
        llama_prefill(ctx, ids + 8 + SPEC_PLACE_W, 1, logits, err, sizeof err))
        return -1;
    return (double)(rt_now_us() - t0) / 1e6;
}

/* Placement by measurement. A model drafter that takes turns with the workers (no drafting ahead:
 * the coordinator found no core of its own for it) drafts while the workers wait for its draft,
 * so every core is free then. At its first draft request — the moment that is like every later
 * one, not the group's busy start — it times its step on 1 thread and on all the online cores,
 * interleaved, 3 rounds after a warm-up (about 40 ms in all on 2 cores at this size), and keeps
 * the faster (more threads only when they save at least 5%), making its context again if the
 * count changed. --threads given, or drafting
 * ahead, keeps the count as it is (spec_place_fixed). The choice and its figures go to the log
 * and, in the heartbeats, to the coordinator's log and status. */
static void spec_place_publish(spec *s)
{
    __atomic_store_n(&s->placement_ready, true, __ATOMIC_RELEASE);
    rt_log(s->role, "placement: %s", s->placement);
}

static void spec_place_fixed(spec *s)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    s->place_pending = s->model && s->kind != SPEC_MEDUSA && !s->threads_set && !s->work_ahead &&
                       cores >= 2;
    if (s->place_pending)
        return;
    snprintf(s->placement, sizeof s->placement, "%d thread%s, %s%s", s->threads,
             s->threads == 1 ? "" : "s",
             !s->model ? "no model (prompt lookup)"
             : s->work_ahead ? "drafting ahead while the target verifies"
                             : "taking turns with the workers",
             s->threads_set ? " (--threads given)" : "");
    spec_place_publish(s);
}

static void spec_place(spec *s)
{
    s->place_pending = false;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int cand[2] = {1, (int)cores};
    double t[2][4];
    llama_ctx *ctx[2] = {NULL, NULL};
    float *logits = malloc((size_t)s->model->cfg.vocab * sizeof *logits);
    char err[256] = "out of memory";
    bool ok = logits != NULL;
    for (int c = 0; ok && c < 2; c++) {
        llama_ctx_params p = {.n_threads = cand[c], .max_width = ARENA_DRAFT_MAX, .n_ctx = 64,
                              .kv = KV_F16, .n_parts = 1};
        ctx[c] = llama_ctx_new(s->model, &p, err, sizeof err);
        ok = ctx[c] != NULL;
    }
    for (int r = 0; ok && r < 4; r++)
        for (int c = 0; ok && c < 2; c++)
            ok = (t[c][r] = spec_place_time(s, ctx[c], logits)) >= 0;
    llama_ctx_destroy(&ctx[0]);
    llama_ctx_destroy(&ctx[1]);
    free(logits);
    double med[2] = {0, 0};
    for (int c = 0; ok && c < 2; c++) {
        double *v = t[c] + 1; /* round 0 warms the pages */
        for (int i = 1; i < 3; i++)
            for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
                double x = v[j];
                v[j] = v[j - 1], v[j - 1] = x;
            }
        med[c] = v[1];
    }
    int want = ok && med[1] < 0.95 * med[0] ? cand[1] : s->threads;
    if (want != s->threads) {
        llama_ctx_params p = s->ctx_params;
        p.n_threads = want;
        llama_ctx *fresh = llama_ctx_new(s->model, &p, err, sizeof err);
        if (fresh) {
            llama_ctx_destroy(&s->ctx);
            s->ctx = fresh;
            s->ctx_params = p;
            s->threads = want;
        } else
            ok = false;
    }
    if (ok)
        snprintf(s->placement, sizeof s->placement,
                 "%d thread%s, taking turns with the workers: a draft step (%d tokens, then 1) "
                 "took %.2f ms on 1 thread and %.2f ms on %d (measured at the first draft)",
                 s->threads, s->threads == 1 ? "" : "s", SPEC_PLACE_W, med[0] * 1e3,
                 med[1] * 1e3, cand[1]);
    else
        snprintf(s->placement, sizeof s->placement,
                 "%d thread%s, taking turns with the workers (not measured: %s)", s->threads,
                 s->threads == 1 ? "" : "s", err);
    spec_place_publish(s);
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
        uint8_t *rings =
            s->arena ? arena_region_find(s->arena, RT_REGION_DRAFTS, &ring_bytes) : NULL;
        size_t one = rt_ring_stride();
        if (!rings || w->draft_ring >= RT_MAX_SPECULATORS ||
            (w->draft_ring + 1) * one > ring_bytes) {
            rt_log(s->role, "cannot use draft ring %u of arena %s: %s", w->draft_ring,
                   w->arena_name, s->arena ? "region missing" : err);
            rt_free(e);
            return -1;
        }
        s->ring = (arena_draft_ring *)(rings + w->draft_ring * one);
        if (s->kind == SPEC_MEDUSA) {
            uint64_t hb = 0;
            s->hidden = arena_region_find(s->arena, RT_REGION_HIDDEN, &hb);
            if (!s->hidden ||
                hb < sizeof(rt_hidden) + (uint64_t)s->model->cfg.dim * sizeof(float)) {
                rt_log(s->role, "arena %s has no hidden-state region for this model",
                       w->arena_name);
                rt_free(e);
                return -1;
            }
        } else if (s->model) {
            s->n_ctx = (int)w->n_ctx + RT_MAX_WIDTH + ARENA_DRAFT_MAX;
            s->target_ctx = (int)w->n_ctx;
            llama_ctx_params p = {.n_threads = s->threads,
                                  .max_width = ARENA_DRAFT_MAX,
                                  .n_ctx = s->n_ctx,
                                  /* drafts only propose: half-precision K/V halves what
                                   * attention reads per drafted token, and changes no output */
                                  .kv = KV_F16,
                                  .n_parts = 1};
            p.screen_top = s->head_screen;
            if (spec_share_target_kv(s, w, &p, err, sizeof err)) {
                rt_log(s->role, "%s", err);
                rt_free(e);
                return -1;
            }
            s->ctx = llama_ctx_new(s->model, &p, err, sizeof err);
            s->ctx_params = p;
            s->logits = malloc((size_t)s->model->cfg.vocab * sizeof *s->logits);
            s->tree_logits =
                malloc((size_t)(ARENA_DRAFT_MAX + 1) * (size_t)s->model->cfg.vocab * sizeof(float));
            if (!s->ctx || !s->logits || !s->tree_logits) {
                rt_log(s->role, "%s", s->ctx ? "out of memory" : err);
                rt_free(e);
                return -1;
            }
        }
        spec_place_fixed(s);
        rt_log(s->role,
               "joined: kind %s, draft ring %u, max depth %d, branch threshold %.2f, alpha %.3g%s%s",
               s->kind_s, w->draft_ring, s->max_draft, s->branch_threshold, s->alpha,
               s->model ? "" : " (prompt lookup)",
               s->kv_shared ? ", reading the target's K/V in the arena" : "");
        rt_free(e);
        return 0;
    }
    rt_log(s->role, "no Welcome from the coordinator at %s", s->run_dir);
    return -1;
}

static int spec_parse(spec *s, int argc, char **argv)
{
    static const struct option opts[] = {{"run-dir", required_argument, 0, 'r'},
                                         {"kind", required_argument, 0, 'k'},
                                         {"id", required_argument, 0, 'i'},
                                         {"max-draft", required_argument, 0, 's'},
                                         {"threads", required_argument, 0, 't'},
                                         {"layers", required_argument, 0, 'L'},
                                         {"draft", required_argument, 0, 'd'},
                                         {"ngram", required_argument, 0, 'n'},
                                         {"orphan-ms", required_argument, 0, 'o'},
                                         {"stall-ms", required_argument, 0, 'S'},
                                         {"target", required_argument, 0, 'T'},
                                         {"branch-threshold", required_argument, 0, 'B'},
                                         {"alpha", required_argument, 0, 'A'},
                                         {"work-ahead", required_argument, 0, 'P'},
                                         {"target-kv", required_argument, 0, 'K'},
                                         {"head-screen", required_argument, 0, 'H'},
                                         {"heads", required_argument, 0, 'M'},
                                         {"template", required_argument, 0, 'E'},
                                         {"corpus", required_argument, 0, 'C'},
                                         {"trace", no_argument, 0, 'v'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'r': s->run_dir = optarg; break;
        case 'k': s->kind_s = optarg; break;
        case 'i': s->id = optarg; break;
        case 's': s->max_draft = atoi(optarg); break;
        case 't': s->threads = atoi(optarg), s->threads_set = true; break;
        case 'L': s->layers_s = optarg; break;
        case 'd': s->draft_path = optarg; break;
        case 'T': s->target_path = optarg; break;
        case 'B': s->branch_threshold = (float)atof(optarg); break;
        case 'A':
            s->alpha_off = !strcmp(optarg, "off");
            s->alpha = s->alpha_off ? 0.0f : (float)atof(optarg);
            break;
        case 'P': s->work_ahead = atoi(optarg) != 0; break;
        case 'K': s->target_kv_s = optarg; break;
        case 'H': s->head_screen = atoi(optarg); break;
        case 'M': s->heads_path = optarg; break;
        case 'E': s->template_s = optarg; break;
        case 'C': s->corpus_path = optarg; break;
        case 'n': s->ngram = atoi(optarg), s->ngram_set = true; break;
        case 'o': s->orphan_ms = atoi(optarg); break;
        case 'S': s->life.stall_ms = atoi(optarg); break;
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
    else if (!strcmp(s->kind_s, "replay"))
        s->kind = SPEC_NGRAM; /* drafts from s->corpus (spec_grow_ngram) */
    else if (!strcmp(s->kind_s, "medusa"))
        s->kind = SPEC_MEDUSA;
    else {
        fprintf(stderr,
                "orochi-speculator: unknown --kind '%s' (layerskip, model, ngram, medusa, "
                "replay)\n",
                s->kind_s);
        return 2;
    }
    if (s->kind == SPEC_MEDUSA && (!s->heads_path || !s->target_path)) {
        fprintf(stderr,
                "orochi-speculator: --kind medusa needs --heads H.gguf and --target M.gguf\n");
        return 2;
    }
    /* the Medusa tree template: candidates per level, e.g. 3,2,1 */
    const char *t = s->template_s ? s->template_s : "3,2,2,1";
    for (s->tmpl_len = 0; *t && s->tmpl_len < 16;) {
        char *end;
        long v = strtol(t, &end, 10);
        if (end == t || v < 1 || v > 16) {
            fprintf(stderr,
                    "orochi-speculator: --template expects counts 1..16 like 3,2,1 or 3-2-1\n");
            return 2;
        }
        s->tmpl[s->tmpl_len++] = (int)v;
        /* ',' or '-' between counts ('-' fits inside a launcher spec KIND:k=v,k=v) */
        t = *end == ',' || *end == '-' ? end + 1 : end;
    }
    if (!strcmp(s->kind_s, "replay")) {
        char err[512];
        if (!s->corpus_path) {
            fprintf(stderr, "orochi-speculator: --kind replay needs --corpus IDS.txt\n");
            return 2;
        }
        if (!s->ngram_set)
            s->ngram = 64;
        if (spec_load_corpus(s, err, sizeof err)) {
            fprintf(stderr, "orochi-speculator: %s\n", err);
            return 2;
        }
    } else if (s->corpus_path) {
        fprintf(stderr, "orochi-speculator: --corpus is for --kind replay\n");
        return 2;
    }
    if (s->kind == SPEC_MODEL && !s->draft_path) {
        fprintf(stderr, "orochi-speculator: --kind model needs --draft M.gguf\n");
        return 2;
    }
    if (s->kind == SPEC_LAYERSKIP && !s->target_path) {
        fprintf(stderr,
                "orochi-speculator: --kind layerskip needs --target M.gguf (the target model)\n");
        return 2;
    }
    if (s->target_kv_s && strcmp(s->target_kv_s, "auto") && strcmp(s->target_kv_s, "on") &&
        strcmp(s->target_kv_s, "off")) {
        fprintf(stderr, "orochi-speculator: --target-kv must be auto, on or off\n");
        return 2;
    }
    if (s->head_screen < 0 || s->head_screen > 64) {
        fprintf(stderr, "orochi-speculator: --head-screen must be 0..64\n");
        return 2;
    }
    if (s->orphan_ms < 100 || s->life.stall_ms < 100) {
        fprintf(stderr, "orochi-speculator: --orphan-ms and --stall-ms must be >= 100\n");
        return 2;
    }
    if (s->max_draft < 1 || s->max_draft > ARENA_DRAFT_MAX || s->ngram < 1) {
        fprintf(stderr, "orochi-speculator: --max-draft must be 1..%d and --ngram >= 1\n",
                ARENA_DRAFT_MAX);
        return 2;
    }
    if (!(s->branch_threshold > 0 && s->branch_threshold <= 1) ||
        !(s->alpha_off || (s->alpha > 0 && s->alpha < 1))) {
        fprintf(stderr,
                "orochi-speculator: --branch-threshold must be in (0, 1], --alpha in (0, 1) "
                "or off\n");
        return 2;
    }
    s->max_depth = s->max_draft;
    ctl_branch_init(&s->branch, s->branch_threshold);
    return 0;
}

int main(int argc, char **argv)
{
    spec s = {.max_draft = 4,
              .ngram = 3,
              .threads = 1,
              .orphan_ms = 10000,
              .life.stall_ms = SPEC_STALL_MS_DEFAULT,
              .branch_threshold = 0.2f,
              .head_screen = 8,
              .alpha = 0.01f,
              .max_nodes = 8,
              .max_depth = 4,
              .work_ahead = true,
              .logits_at = -1};
    int rc = spec_parse(&s, argc, argv);
    if (rc)
        return rc;
    snprintf(s.role, sizeof s.role, "%s", s.id ? s.id : s.kind_s);
    s.life.role = s.role;
    rt_pin_from_env(s.role, "OROCHI_PIN_SPECULATOR", 0);
    signal(SIGTERM, spec_on_signal);
    signal(SIGINT, spec_on_signal);
    signal(SIGPIPE, SIG_IGN);
    pthread_mutex_init(&s.sock_lock, NULL);
    s.tokens = malloc(SPEC_MAX_TOKENS * sizeof *s.tokens);
    pthread_t hb_thread;
    bool hb_started = false;
    char arena_nm[256] = "";

    char endpoint[4200];
    rt_ctl_endpoint(s.run_dir, endpoint, sizeof endpoint);
    s.zctx = zmq_ctx_new();
    s.sock = zmq_socket(s.zctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(s.sock, ZMQ_LINGER, &linger, sizeof linger);
    if (!s.tokens || zmq_connect(s.sock, endpoint) || spec_join(&s)) {
        rc = 1;
        goto out;
    }
    snprintf(arena_nm, sizeof arena_nm, "%s", arena_name(s.arena));
    s.last_coord_us = rt_now_us();
    spec_alive(&s);
    int e = pthread_create(&hb_thread, NULL, spec_heartbeat_thread, &s);
    if (e) {
        rt_log(s.role, "cannot start the heartbeat thread: %s", strerror(e));
        rc = 1;
        goto out;
    }
    hb_started = true;
    while (!spec_stop) {
        uint64_t now = rt_now_us();
        spec_alive(&s);
        __atomic_store_n(&s.hb_active, s.active, __ATOMIC_RELAXED);
        spec_heartbeat_due(&s);
        if (now - s.last_coord_us > (uint64_t)s.orphan_ms * 1000u) {
            rt_log(s.role, "coordinator silent for %d ms: exiting", s.orphan_ms);
            break;
        }
        /* draft and publish as soon as the context moved; then work ahead between polls */
        if (s.active && !s.published)
            spec_publish(&s);
        bool more = spec_work_ahead(&s);
        pthread_mutex_lock(&s.sock_lock);
        zmq_pollitem_t it = {s.sock, 0, ZMQ_POLLIN, 0};
        int ready = zmq_poll(&it, 1, more ? 0 : RT_HEARTBEAT_MS / 2);
        pthread_mutex_unlock(&s.sock_lock);
        if (ready <= 0)
            continue;
        bool bad;
        char err[256];
        for (;;) {
            pthread_mutex_lock(&s.sock_lock);
            Orochi__Envelope *env = rt_recv(s.sock, false, NULL, 0, NULL, &bad, err, sizeof err);
            pthread_mutex_unlock(&s.sock_lock);
            if (bad) {
                rt_log(s.role, "ignoring a bad frame: %s", err);
                continue;
            }
            if (!env)
                break;
            s.last_coord_us = rt_now_us();
            if (env->body_case == OROCHI__ENVELOPE__BODY_FEEDBACK) {
                s.fb_us = s.last_coord_us;
                if (s.place_pending && !env->feedback->done)
                    spec_place(&s);
                spec_feedback(&s, env->feedback);
                s.fb_end_us = rt_now_us();
                /* ngram is fed every active request in turn: answer each before the next
                 * Feedback replaces its context (a model kind answers the latest only) */
                if (s.kind == SPEC_NGRAM && s.active && !s.published)
                    spec_publish(&s);
            } else if (env->body_case == OROCHI__ENVELOPE__BODY_DRAFT_REQUEST && s.active &&
                       env->draft_request->request_id == s.request_id)
                s.published = false; /* asked again (e.g. after a lost reply) */
            else if (env->body_case == OROCHI__ENVELOPE__BODY_SHUTDOWN)
                spec_stop = 1;
            rt_free(env);
        }
    }
out:
    spec_stop = 1;
    if (hb_started)
        pthread_join(hb_thread, NULL);
    llama_ctx_destroy(&s.ctx);
    llama_model_destroy(&s.model);
    arena_destroy(&s.arena);
    /* a dead coordinator cannot unlink its arena: the last of its peers to leave does */
    if (arena_nm[0] && arena_unlink_stale(arena_nm))
        rt_log(s.role, "removed the arena %s (its coordinator is gone)", arena_nm);
    free(s.logits);
    free(s.tokens);
    free(s.tree_logits);
    free(s.hbuf);
    free(s.corpus);
    medusa_destroy(&s.heads);
    if (s.sock)
        zmq_close(s.sock);
    if (s.zctx)
        zmq_ctx_term(s.zctx);
    pthread_mutex_destroy(&s.sock_lock);
    return rc;
}
