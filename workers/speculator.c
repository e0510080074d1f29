/*
 * orochi-speculator — drafts candidate continuations for the sequence the target is decoding.
 *
 * This file is the process: its options, joining the group, heartbeats, the Feedback it applies
 * and the drafts it publishes. The drafters are behind one interface (`drafter`: prepare what the
 * kind needs, grow a tree for the committed context; workers/speculator_internal.h), a file per
 * family: draft_model.c (model, layerskip), draft_lookup.c (ngram, replay), draft_medusa.c.
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
 *              publishes in the arena for every sequence slot (fed every request).
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
 * A model drafter drafts for every request (every_request, said in its DraftReady; the
 * coordinator then feeds it every active request): its requests' contexts live in a table
 * (spec_req, by request); with one request known it drafts as above, with several it grows every
 * moved request's tree in one batched growth after reading the round's Feedbacks
 * (spec_publish_batch, spec_grow_batch: a draft-context slot per request, reading the target's
 * slot of that request or holding the request's own K/V rows), without the work-ahead.
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

#include "workers/speculator_internal.h"


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
        "                         [--act-bits auto|8|16]\n"
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
        "  --act-bits auto (default): the drafter's activations in 8 bits for the K-quants\n"
        "  and 16 for the rest, as the target's; drafts only propose, so any precision is\n"
        "  lossless\n"
        "  --orphan-ms (10000): exit when the coordinator has been silent this long\n"
        "  --stall-ms (30000): stop heartbeating when the main thread has been busy in one\n"
        "  computation this long (so the coordinator replaces a wedged speculator)\n");
}

int spec_send(spec *s, Orochi__Envelope__BodyCase which, void *body)
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

/* Publish a draft of n nodes for a request's context of n_committed tokens (last: its last
 * token) into the ring and tell the coordinator (an empty draft too). */
static void spec_send_draft(spec *s, uint64_t request_id, int n_committed, int32_t last,
                            const spec_node *nodes, int n, uint64_t fb_us, uint64_t fb_end_us,
                            uint64_t t0, uint64_t t1)
{
    arena_draft d = {0};
    d.request_id = request_id;
    d.ctx_len = (uint64_t)n_committed;
    d.last_token = last;
    d.n = (uint32_t)n;
    for (int i = 0; i < n; i++) {
        d.tokens[i] = nodes[i].token;
        d.parent[i] = nodes[i].parent;
        d.conf[i] = nodes[i].conf;
    }
    uint32_t slot = arena_draft_ring_put(s->ring, &d);
    Orochi__DraftReady r = OROCHI__DRAFT_READY__INIT;
    r.request_id = request_id;
    r.ctx_len = d.ctx_len;
    r.slot = slot;
    r.n_tokens = d.n;
    r.feedback_us = fb_us;
    r.feedback_end_us = fb_end_us;
    r.draft_start_us = t0;
    r.draft_end_us = t1;
    r.every_request = s->every_request;
    spec_send(s, OROCHI__ENVELOPE__BODY_DRAFT_READY, &r);
    s->drafts++;
    __atomic_store_n(&s->hb_drafts, s->drafts, __ATOMIC_RELAXED);
}

/* Draft for the current context and publish it (an empty draft too). */
static void spec_publish(spec *s)
{
    uint64_t t0 = rt_now_us();
    s->n_nodes = s->d->grow(s);
    spec_send_draft(s, s->request_id, s->n_committed,
                    s->n_committed ? s->tokens[s->n_committed - 1] : -1, s->nodes, s->n_nodes,
                    s->fb_us, s->fb_end_us, t0, rt_now_us());
    s->fb_us = s->fb_end_us = 0;
    s->published = true;
    int ahead = s->n_chain; /* drafted ahead for this context before the Feedback came */
    spec_set_chain(s);
    spec_keep_main_branch(s);
    if (s->trace)
        rt_log(s->role,
               "draft of %d tokens for context %d in %.1f ms (%d drafted ahead, alpha %.4g, "
               "branch threshold %.3g)",
               s->n_nodes, s->n_committed, (rt_now_us() - t0) / 1e3, ahead, s->alpha,
               s->branch.value);
}

/* ===== every_request: several requests, one batched draft ===== */

/* An entry not fed for this long is taken for gone (its done never came: a restarted
 * coordinator), so it neither holds a place nor keeps the speculator batching. */
#define SPEC_REQ_STALE_US (30 * 1000000ull)

static bool spec_req_live(const spec_req *q, uint64_t now)
{
    return q->request_id && now - q->seen_us < SPEC_REQ_STALE_US;
}

/* Let go of an entry: its private K/V slot, if it had one, is free for another request. */
static void spec_req_drop(spec *s, spec_req *q)
{
    if (!s->kv_shared && q->ctx_slot > 0 && q->ctx_slot <= SPEC_BATCH_MAX)
        s->ctx_slot_used[q->ctx_slot] = false;
    q->ctx_slot = -1;
    q->kv_n = 0;
    q->request_id = 0;
}

/* The entry of request id (make: a free one if it has none; NULL when the table is full). */
static spec_req *spec_req_of(spec *s, uint64_t id, bool make)
{
    spec_req *free_e = NULL;
    uint64_t now = rt_now_us();
    for (int i = 0; i < RT_MAX_SEQ; i++) {
        if (s->reqs[i].request_id == id)
            return &s->reqs[i];
        if (!free_e && !spec_req_live(&s->reqs[i], now))
            free_e = &s->reqs[i];
    }
    if (!make || !free_e)
        return NULL;
    if (free_e->request_id) /* one long unfed */
        spec_req_drop(s, free_e);
    free_e->request_id = id;
    free_e->n = free_e->n_nodes = 0;
    free_e->ctx_slot = -1;
    free_e->kv_n = 0;
    free_e->pending = false;
    return free_e;
}

static int spec_reqs_live(const spec *s)
{
    int n = 0;
    uint64_t now = rt_now_us();
    for (int i = 0; i < RT_MAX_SEQ; i++)
        n += spec_req_live(&s->reqs[i], now);
    return n;
}

/* Apply a Feedback to its request's entry: the whole context (reset) or the tokens appended; when
 * the step verified nodes of the tree last published for it, alpha and the branch threshold learn
 * from what the target accepted. Returns the entry (NULL: done, or no room, or past the context
 * this speculator keeps). */
static spec_req *spec_req_feedback(spec *s, const Orochi__Feedback *fb)
{
    spec_req *q = spec_req_of(s, fb->request_id, !fb->done && fb->reset);
    if (!q)
        return NULL;
    if (fb->done) {
        spec_req_drop(s, q);
        return NULL;
    }
    int old = q->n, want = fb->reset ? (int)fb->n_tokens : q->n + (int)fb->n_tokens;
    if (want >= SPEC_MAX_TOKENS) {
        spec_req_drop(s, q);
        return NULL;
    }
    if (want > q->cap) {
        int cap = want * 2 < SPEC_MAX_TOKENS ? want * 2 : SPEC_MAX_TOKENS;
        int32_t *t = realloc(q->tokens, (size_t)cap * sizeof *t);
        if (!t) {
            spec_req_drop(s, q);
            return NULL;
        }
        q->tokens = t;
        q->cap = cap;
    }
    /* the tokens past what it knew: from a reset, those past its old context if that begins it */
    const int32_t *added = NULL;
    int n_added = 0;
    if (!fb->reset) {
        memcpy(q->tokens + q->n, fb->tokens, fb->n_tokens * sizeof *q->tokens);
        added = fb->tokens;
        n_added = (int)fb->n_tokens;
    } else {
        /* the rows of a private K/V slot hold the tokens both contexts begin with */
        int same = ngram_common_prefix(q->tokens, old, fb->tokens, want);
        if (old > 0 && want > old && same == old) {
            added = fb->tokens + old;
            n_added = want - old;
        }
        if (q->kv_n > same)
            q->kv_n = same;
        memcpy(q->tokens, fb->tokens, fb->n_tokens * sizeof *q->tokens);
    }
    q->n = want;
    if (q->kv_n > q->n - 1)
        q->kv_n = q->n > 0 ? q->n - 1 : 0;
    if (fb->drafted && added) {
        spec_update_alpha(s, q->nodes, q->n_nodes, added, n_added);
        spec_update_branch(s, q->nodes, q->n_nodes, added, n_added);
    }
    q->slot = fb->seq_slot < RT_MAX_SEQ ? (int)fb->seq_slot : 0;
    q->pending = true;
    q->seen_us = rt_now_us();
    return q;
}

/* Publish the tree an entry holds (n_nodes 0: an empty draft), drafted from t0 to t1. */
static void spec_req_answer(spec *s, spec_req *q, uint64_t t0, uint64_t t1)
{
    spec_send_draft(s, q->request_id, q->n, q->n ? q->tokens[q->n - 1] : -1, q->nodes, q->n_nodes,
                    q->fb_us, q->fb_end_us, t0, t1);
    q->pending = false;
}

/* Draft for the pending requests, SPEC_BATCH_MAX at a time, and publish each one's tree. */
static void spec_publish_batch(spec *s)
{
    spec_req *todo[SPEC_BATCH_MAX];
    int k = 0;
    for (int i = 0; i <= RT_MAX_SEQ; i++) {
        spec_req *q = i < RT_MAX_SEQ ? &s->reqs[i] : NULL;
        if (q && (!q->request_id || !q->pending))
            continue;
        if (q && (q->n < 1 || q->n + s->max_depth + 1 >= s->target_ctx)) {
            uint64_t t = rt_now_us();
            q->n_nodes = 0; /* no room for a tree: an empty draft */
            spec_req_answer(s, q, t, t);
            continue;
        }
        if (q && !s->kv_shared && q->ctx_slot < 0) { /* a slot of private K/V rows of its own */
            for (int c = 1; c <= SPEC_BATCH_MAX && q->ctx_slot < 0; c++)
                if (!s->ctx_slot_used[c]) {
                    s->ctx_slot_used[c] = true;
                    q->ctx_slot = c;
                    q->kv_n = 0;
                }
            if (q->ctx_slot < 0) { /* every slot holds another request's rows: no draft */
                uint64_t t = rt_now_us();
                q->n_nodes = 0;
                spec_req_answer(s, q, t, t);
                continue;
            }
        }
        if (q)
            todo[k++] = q;
        if (k && (k == SPEC_BATCH_MAX || !q)) {
            uint64_t t0 = rt_now_us();
            spec_grow_batch(s, todo, k);
            uint64_t t1 = rt_now_us();
            for (int r = 0; r < k; r++)
                spec_req_answer(s, todo[r], t0, t1);
            if (s->trace)
                rt_log(s->role, "a batch of %d drafts in %.1f ms (alpha %.4g)", k,
                       (t1 - t0) / 1e3, s->alpha);
            k = 0;
        }
    }
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
    s->seq_slot = fb->seq_slot < RT_MAX_SEQ ? (int)fb->seq_slot : 0;
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
            spec_update_alpha(s, s->nodes, s->n_nodes, fb->tokens, n);
            spec_update_branch(s, s->nodes, s->n_nodes, fb->tokens, n);
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

/* A Feedback, routed. every_request: its request's entry first; with one request known the
 * single-request path takes it (from a reset built out of the entry when that path does not hold
 * this request: after a batch, or when the coordinator sent only the appended tokens), with
 * several the entry waits for the next batch (spec_publish_batch) and the single-request path
 * starts over from a reset when it is one again. */
static void spec_route_feedback(spec *s, const Orochi__Feedback *fb)
{
    if (!s->every_request || fb->done) {
        if (s->every_request)
            spec_req_feedback(s, fb);
        spec_feedback(s, fb);
        return;
    }
    spec_req *q = spec_req_feedback(s, fb);
    if (!q) { /* not one it knows (no room, or an append it never saw the start of) */
        spec_feedback(s, fb);
        return;
    }
    q->fb_us = s->fb_us;
    q->fb_end_us = rt_now_us();
    if (spec_reqs_live(s) > 1) {
        s->active = false;
        s->request_id = 0;
        return;
    }
    q->pending = false;
    q->n_nodes = 0; /* the single-request path keeps its own tree and learns from it */
    if (s->active && s->request_id == fb->request_id) {
        spec_feedback(s, fb);
        return;
    }
    Orochi__Feedback r = *fb;
    r.reset = true;
    r.tokens = q->tokens;
    r.n_tokens = (size_t)q->n;
    r.drafted = 0;
    spec_feedback(s, &r);
    /* a private K/V: the rows its batch slot holds need not be computed again */
    char err[256];
    if (!s->kv_shared && s->active && q->ctx_slot > 0 && q->kv_n > 0 &&
        !llama_kv_copy_prefix(s->ctx, q->ctx_slot, 0, q->kv_n, err, sizeof err)) {
        s->kv_len = q->kv_n;
        s->logits_at = -1;
    }
}

/* ===== joining ===== */

static int spec_load(spec *s, char *err, size_t errlen, uint32_t *vocab, uint64_t *hash)
{
    if (!s->d->model) {
        *vocab = 0;
        *hash = 0;
        return 0;
    }
    const char *path = s->kind == SPEC_MODEL ? s->draft_path : s->target_path;
    s->model = llama_model_load(path, err, errlen);
    if (!s->model)
        return -1;
    /* drafts need not match the target bit for bit (--act-bits, default auto) */
    if (llama_model_set_act_bits(s->model, s->act_bits, err, errlen))
        return -1;
    if (s->d->prepare && s->d->prepare(s, err, errlen))
        return -1;
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
                hb < (uint64_t)RT_MAX_SEQ * rt_hidden_stride(s->model->cfg.dim)) {
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
            /* a model drafter drafts for every request: a slot per request of a batched draft —
             * reading the target's K/V (those prefix rows here are never written: address space
             * only), or with private K/V rows of its own (slots 1.., slot 0 the single-request
             * path's), written as the requests' contexts are caught up */
            s->every_request = s->kind == SPEC_MODEL || s->kind == SPEC_LAYERSKIP;
            if (s->every_request)
                p.n_seq = SPEC_BATCH_MAX + (s->kv_shared ? 0 : 1);
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
                                         {"act-bits", required_argument, 0, 'a'},
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
        case 'a':
            s->act_bits = llama_act_bits_parse(optarg);
            if (s->act_bits < 0) {
                fprintf(stderr, "orochi-speculator: --act-bits '%s': must be auto, 8 or 16\n",
                        optarg);
                return 2;
            }
            break;
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
    static const drafter *const kinds[] = {&drafter_layerskip, &drafter_model, &drafter_ngram,
                                           &drafter_medusa, &drafter_replay};
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds && !s->d; i++)
        if (!strcmp(s->kind_s, kinds[i]->name))
            s->d = kinds[i];
    if (s->d) {
        s->kind = s->d->kind;
    } else {
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
              .act_bits = LLAMA_ACT_AUTO,
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
        /* draft and publish as soon as the context moved (every_request with several requests:
         * one batch for all that moved); then work ahead between polls */
        if (s.active && !s.published)
            spec_publish(&s);
        if (s.every_request)
            spec_publish_batch(&s);
        spec_place_if_idle(&s);
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
                    spec_place(&s, "at the first draft");
                spec_route_feedback(&s, env->feedback);
                s.fb_end_us = rt_now_us();
                /* ngram and medusa are fed every active request in turn: answer each before
                 * the next Feedback replaces its context (a model kind answers the latest only,
                 * or with every_request all of them in one batch) */
                if ((s.kind == SPEC_NGRAM || s.kind == SPEC_MEDUSA) && s.active && !s.published)
                    spec_publish(&s);
            } else if (env->body_case == OROCHI__ENVELOPE__BODY_DRAFT_REQUEST) {
                /* asked again (e.g. after a lost reply) */
                spec_req *q = s.every_request && !s.active
                                  ? spec_req_of(&s, env->draft_request->request_id, false)
                                  : NULL;
                if (q)
                    q->pending = true;
                else if (s.active && env->draft_request->request_id == s.request_id)
                    s.published = false;
            }
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
    for (int i = 0; i < RT_MAX_SEQ; i++)
        free(s.reqs[i].tokens);
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
