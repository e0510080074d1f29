/*
 * coordinator/coord_engine.c — requests through the verification loop.
 *
 * One sequence at a time. For a request: render and tokenize the prompt, refuse it if it cannot
 * fit the context (413), prefill it through the workers in chains of max_width, and take the first
 * token from the last prompt position. Then, step after step:
 *   1. drafts: every connected speculator has been told the committed context (Feedback) and
 *      answers with a draft in its arena ring (DraftReady, possibly empty); wait until all have
 *      answered for this exact context or --draft-wait-ms passes, and take the draft of the
 *      speculator with the best acceptance record (ties: the longer draft);
 *   2. verify: the batch is [last committed token, d1..dk] as a chain; one StepBegin to each
 *      worker, wait for every StepDone (a lost worker makes the step fail and be re-run once the
 *      worker is back: inputs and the committed KV are in the arena, untouched);
 *   3. accept: greedy — d(i+1) is accepted while it equals the argmax at position i; the argmax at
 *      the first mismatch (or after the last draft) is the correction/bonus token;
 *   4. commit the accepted path's K/V rows into the prefix, emit the new tokens, tell the
 *      speculators (Feedback with the appended tokens).
 * Because a chain's logits are bit-identical to sequential decoding (see model/llama.c), the
 * output equals `orochi run --temp 0` token for token. With temperature > 0 this engine
 * samples sequentially (no drafts), which is trivially lossless.
 * Stop conditions: the tokenizer's eos, max_tokens (or the context end), stop strings (text is
 * held back until it cannot be the start of a stop string).
 */
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/coord.h"
#include "coordinator/verify.h"

#define ENGINE_WORKER_WAIT_US 60000000u /* how long a request waits for the workers to be back */

/* ===== the queue (HTTP threads -> main loop) ===== */

int coord_engine_submit(void *ctx, coord_request *req)
{
    coord *c = ctx;
    pthread_mutex_lock(&c->qlock);
    if (c->qlen == COORD_QUEUE) {
        pthread_mutex_unlock(&c->qlock);
        coord_request_fail(req, 503, "the request queue is full; try again later");
        return -1;
    }
    c->queue[(c->qhead + c->qlen) % COORD_QUEUE] = coord_request_ref(req);
    c->qlen++;
    pthread_mutex_unlock(&c->qlock);
    return 0;
}

static coord_request *engine_pop(coord *c)
{
    pthread_mutex_lock(&c->qlock);
    coord_request *r = NULL;
    if (c->qlen) {
        r = c->queue[c->qhead];
        c->qhead = (c->qhead + 1) % COORD_QUEUE;
        c->qlen--;
    }
    pthread_mutex_unlock(&c->qlock);
    return r;
}

int coord_engine_health(void *ctx, char *msg, size_t len)
{
    coord *c = ctx;
    int ready = coord_group_count(c, PEER_WORKER, true);
    if (ready == c->n_workers)
        return 1;
    snprintf(msg, len, "%d of %d workers connected", ready, c->n_workers);
    return 0;
}

/* ===== one verification step through the workers ===== */

void coord_engine_on_step_done(coord *c, coord_peer *p, const Orochi__StepDone *d)
{
    if (d->step_id != c->step_wait_id || p->index < 0 || p->index >= COORD_MAX_WORKERS)
        return;
    if (d->error && d->error[0]) {
        c->step_failed = true;
        snprintf(c->step_err, sizeof c->step_err, "%s: %s", p->name, d->error);
    }
    c->step_done_mask |= 1u << p->index;
    pthread_mutex_lock(&c->mlock);
    c->m_worker_compute_us[p->index] += (double)d->compute_us;
    c->m_worker_steps[p->index]++;
    pthread_mutex_unlock(&c->mlock);
}

void coord_engine_on_worker_lost(coord *c, coord_peer *p)
{
    if (!c->step_wait_id)
        return;
    c->step_failed = true;
    snprintf(c->step_err, sizeof c->step_err, "%s was lost during the step", p->name);
    /* survivors may be waiting for it at the barrier: make them give up now */
    arena_barrier_break(&c->step->barrier);
}

static bool engine_wait_workers(coord *c)
{
    uint64_t deadline = rt_now_us() + ENGINE_WORKER_WAIT_US;
    while (!coord_group_workers_ready(c)) {
        if (coord_stop_flag || rt_now_us() > deadline)
            return false;
        coord_group_pump(c, 5);
        coord_group_supervise(c);
    }
    return true;
}

/* Run one step; re-run it while workers are lost and come back. Returns 0, or -1 if the group
 * cannot finish it (err says why). */
static int engine_step(coord *c, int n, const int32_t *tokens, const int32_t *parent, int n_prefix,
                       int logits_from, char *err, size_t errlen)
{
    uint64_t t0 = rt_now_us();
    for (int attempt = 0; attempt < 5; attempt++) {
        if (!engine_wait_workers(c)) {
            snprintf(err, errlen, "the workers are not available (%d of %d connected)",
                     coord_group_count(c, PEER_WORKER, true), c->n_workers);
            return -1;
        }
        rt_step *st = c->step;
        st->step_id = ++c->step_counter;
        st->n_tokens = (uint32_t)n;
        st->n_prefix = (uint32_t)n_prefix;
        st->logits_from = (uint32_t)logits_from;
        memcpy(st->tokens, tokens, (size_t)n * sizeof *tokens);
        for (int i = 0; i < n; i++) {
            st->parent[i] = parent ? parent[i] : i - 1;
            st->seq[i] = 0;
        }
        memset(st->seq_prefix, 0, sizeof st->seq_prefix);
        st->seq_prefix[0] = (uint32_t)n_prefix;
        arena_barrier_init(&st->barrier, (uint32_t)c->n_workers);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        c->step_wait_id = st->step_id;
        c->step_done_mask = 0;
        c->step_failed = false;
        c->step_err[0] = 0;
        Orochi__StepBegin sb = OROCHI__STEP_BEGIN__INIT;
        sb.step_id = st->step_id;
        sb.n_tokens = (uint32_t)n;
        sb.n_prefix = (uint32_t)n_prefix;
        sb.logits_from = (uint32_t)logits_from;
        coord_group_broadcast(c, PEER_WORKER, OROCHI__ENVELOPE__BODY_STEP_BEGIN, &sb);
        uint32_t all = (1u << c->n_workers) - 1;
        while ((c->step_done_mask & all) != all && !c->step_failed && !coord_stop_flag) {
            coord_group_pump(c, 1);
            coord_group_supervise(c);
        }
        c->step_wait_id = 0;
        if (!c->step_failed && (c->step_done_mask & all) == all) {
            pthread_mutex_lock(&c->mlock);
            c->m_steps++;
            c->m_step_seconds += (rt_now_us() - t0) / 1e6;
            pthread_mutex_unlock(&c->mlock);
            return 0;
        }
        if (coord_stop_flag)
            break;
        rt_log("coordinator", "step %llu failed (%s): re-running it", (unsigned long long)sb.step_id,
               c->step_err);
        /* let the survivors report back before the barrier is re-armed */
        uint64_t settle = rt_now_us() + 200000u;
        while (rt_now_us() < settle) {
            coord_group_pump(c, 5);
            coord_group_supervise(c);
        }
    }
    snprintf(err, errlen, "step could not be completed: %s", c->step_err[0] ? c->step_err : "stopping");
    return -1;
}

/* Commit batch tokens path[0..n) after a step over `b`. */
static int engine_commit(coord *c, const llama_batch *b, int n_prefix, const int32_t *path, int n,
                         char *err, size_t errlen)
{
    llama_ctx_set_prefix_len(c->kv, n_prefix);
    if (llama_ctx_set_batch(c->kv, b, err, errlen))
        return -1;
    return llama_commit(c->kv, path, n, err, errlen);
}

/* ===== drafts ===== */

void coord_engine_on_draft_ready(coord *c, coord_peer *p, const Orochi__DraftReady *r)
{
    p->ready_req = r->request_id;
    p->ready_ctx = r->ctx_len;
    p->ready_slot = r->slot;
    p->ready_n = r->n_tokens;
    p->ready_fresh = true;
}

/* Tell every speculator the committed context: a full reset to those that have not seen this
 * request, the appended tokens to the others. */
static void engine_feedback(coord *c, uint64_t req_id, const int32_t *all, int n_all, const int32_t *added,
                            int n_added, int accepted, int drafted)
{
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        coord_peer *p = &c->peers[i];
        if (p->role != PEER_SPECULATOR || !p->connected)
            continue;
        Orochi__Feedback fb = OROCHI__FEEDBACK__INIT;
        fb.request_id = req_id;
        fb.ctx_len = (uint64_t)n_all;
        bool reset = p->fed_req != req_id || p->fed_ctx + (uint64_t)n_added != (uint64_t)n_all;
        fb.reset = reset;
        fb.tokens = (int32_t *)(reset ? all : added);
        fb.n_tokens = (size_t)(reset ? n_all : n_added);
        fb.accepted = (uint32_t)accepted;
        fb.drafted = (uint32_t)drafted;
        fb.max_nodes = (uint32_t)(c->width - 1);
        fb.max_depth = (uint32_t)c->spec_len;
        fb.tree = c->tree;
        coord_group_send(c, p, OROCHI__ENVELOPE__BODY_FEEDBACK, &fb);
        p->fed_req = req_id;
        p->fed_ctx = (uint64_t)n_all;
        p->ready_fresh = false;
    }
}

static void engine_feedback_done(coord *c, uint64_t req_id)
{
    Orochi__Feedback fb = OROCHI__FEEDBACK__INIT;
    fb.request_id = req_id;
    fb.done = true;
    coord_group_broadcast(c, PEER_SPECULATOR, OROCHI__ENVELOPE__BODY_FEEDBACK, &fb);
}

/* Wait until every fed speculator has answered for context n_all (or --draft-wait-ms passed) and
 * copy the drafts that continue exactly this context into the peers. Returns how many. */
static int engine_gather_drafts(coord *c, uint64_t req_id, const int32_t *all, int n_all)
{
    for (int i = 0; i < COORD_MAX_PEERS; i++)
        c->peers[i].has_draft = false;
    if (!coord_group_count(c, PEER_SPECULATOR, true))
        return 0;
    uint64_t t0 = rt_now_us(), deadline = t0 + (uint64_t)c->draft_wait_ms * 1000u;
    for (;;) {
        int waiting = 0;
        for (int i = 0; i < COORD_MAX_PEERS; i++) {
            coord_peer *p = &c->peers[i];
            if (p->role == PEER_SPECULATOR && p->connected && p->fed_req == req_id &&
                !(p->ready_fresh && p->ready_req == req_id && p->ready_ctx == (uint64_t)n_all))
                waiting++;
        }
        if (!waiting || rt_now_us() >= deadline || coord_stop_flag)
            break;
        coord_group_pump(c, 1);
        coord_group_supervise(c);
    }
    pthread_mutex_lock(&c->mlock);
    c->m_draft_wait_seconds += (rt_now_us() - t0) / 1e6;
    pthread_mutex_unlock(&c->mlock);
    int got = 0;
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        coord_peer *p = &c->peers[i];
        if (p->role != PEER_SPECULATOR || !p->connected || !p->ready_fresh || p->ready_req != req_id ||
            p->ready_ctx != (uint64_t)n_all || p->ready_n == 0)
            continue;
        arena_draft_ring *ring = (arena_draft_ring *)((uint8_t *)c->rings + (size_t)p->index * c->ring_bytes);
        /* the draft must continue exactly this context */
        if (!arena_draft_ring_get(ring, p->ready_slot, &p->draft) || p->draft.request_id != req_id ||
            p->draft.ctx_len != (uint64_t)n_all || p->draft.last_token != all[n_all - 1] || p->draft.n == 0)
            continue;
        p->has_draft = true;
        got++;
    }
    return got;
}

/* The tree to verify: the drafts merged and voted on within the node budget. */
static void engine_build_tree(coord *c, int32_t root, int max_nodes, coord_tree *out)
{
    static __thread coord_tree merged; /* 10 KiB: keep it off the stack */
    coord_tree_init(&merged, root);
    coord_peer *best = NULL;
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        coord_peer *p = &c->peers[i];
        if (!p->has_draft)
            continue;
        if (c->vote == VOTE_OFF) {
            if (!best || p->weight > best->weight || (p->weight == best->weight && p->draft.n > best->draft.n))
                best = p;
        } else {
            coord_tree_add(&merged, &p->draft, (float)p->weight, p->index);
        }
    }
    if (best)
        coord_tree_add(&merged, &best->draft, (float)best->weight, best->index);
    coord_tree_vote(&merged, c->vote, max_nodes, out);
}

/* ===== output ===== */

typedef struct {
    char *text;        /* all generated text */
    size_t len, cap, sent;
    size_t max_stop;
} engine_text;

static int text_add(engine_text *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        while (cap < t->len + n + 1)
            cap *= 2;
        char *p = realloc(t->text, cap);
        if (!p)
            return -1;
        t->text = p;
        t->cap = cap;
    }
    memcpy(t->text + t->len, s, n);
    t->len += n;
    t->text[t->len] = 0;
    return 0;
}

/* Length of the longest prefix of s[0..n) that does not end inside a UTF-8 sequence. */
static size_t utf8_complete(const char *s, size_t n)
{
    size_t i = n, back = 0;
    while (i > 0 && back < 4 && ((unsigned char)s[i - 1] & 0xc0) == 0x80) {
        i--;
        back++;
    }
    if (i == 0)
        return n;
    unsigned char lead = (unsigned char)s[i - 1];
    size_t need = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
    return back + 1 >= need ? n : i - 1;
}

/* Hand the request whatever text is now certain; returns true if a stop string was found. */
static bool text_flush(engine_text *t, coord_request *req, const coord_params *prm, bool final)
{
    size_t stop_at = t->len;
    bool stopped = false;
    for (int i = 0; i < prm->n_stop; i++) {
        size_t sl = strlen(prm->stop[i]);
        if (!sl)
            continue;
        size_t from = t->sent > sl ? t->sent - sl : 0;
        char *hit = t->len >= sl ? memmem(t->text + from, t->len - from, prm->stop[i], sl) : NULL;
        if (hit && (size_t)(hit - t->text) < stop_at) {
            stop_at = (size_t)(hit - t->text);
            stopped = true;
        }
    }
    size_t upto = stop_at;
    if (!stopped && !final) {
        upto = t->len > t->max_stop ? t->len - t->max_stop : 0;
        if (upto < t->sent)
            upto = t->sent;
        upto = t->sent + utf8_complete(t->text + t->sent, upto - t->sent);
    }
    if (upto > t->sent) {
        coord_request_append(req, NULL, 0, t->text + t->sent, upto - t->sent);
        t->sent = upto;
    }
    return stopped;
}

/* ===== a request ===== */

static char *engine_render(coord *c, const coord_params *prm)
{
    if (prm->kind == COORD_REQ_COMPLETION)
        return strdup(prm->prompt ? prm->prompt : "");
    /* chat: a single user turn uses the file's template; longer conversations are rendered in
     * ChatML when the template is ChatML, else as [INST] turns */
    if (prm->n_messages == 1 && !strcmp(prm->messages[0].role, "user"))
        return tokenizer_chat_prompt(c->tok, prm->messages[0].content);
    size_t cap = 256;
    for (int i = 0; i < prm->n_messages; i++)
        cap += strlen(prm->messages[i].role) + strlen(prm->messages[i].content) + 64;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    size_t n = 0;
    char *probe = tokenizer_chat_prompt(c->tok, "");
    bool chatml = probe && strstr(probe, "<|im_start|>");
    free(probe);
    for (int i = 0; i < prm->n_messages; i++) {
        const coord_message *m = &prm->messages[i];
        n += (size_t)snprintf(out + n, cap - n, chatml ? "<|im_start|>%s\n%s<|im_end|>\n" : "[%s] %s\n",
                              m->role, m->content);
    }
    snprintf(out + n, cap - n, chatml ? "<|im_start|>assistant\n" : "[assistant] ");
    return out;
}

static void engine_run(coord *c, coord_request *req)
{
    const coord_params *prm = coord_request_params(req);
    uint64_t req_id = ++c->next_request_id;
    char err[512];
    int V = c->model->cfg.vocab;
    char *text = engine_render(c, prm);
    int cap = text ? (int)strlen(text) + 8 : 0;
    int32_t *all = text ? malloc(((size_t)cap + (size_t)c->n_ctx + 8) * sizeof *all) : NULL;
    engine_text out = {0};
    coord_stats stats = {0};
    if (!all) {
        coord_request_fail(req, 500, "out of memory");
        goto done;
    }
    int off = tokenizer_add_bos(c->tok) && tokenizer_bos(c->tok) >= 0 ? 1 : 0;
    int needed = 0;
    int n = tokenizer_encode(c->tok, text, strlen(text), true, all + off, cap - off, &needed);
    if (n < 0) {
        coord_request_fail(req, 400, "the prompt could not be tokenized");
        goto done;
    }
    if (off)
        all[0] = tokenizer_bos(c->tok);
    int n_all = n + off, n_prompt = n_all;
    if (n_all == 0) {
        coord_request_fail(req, 400, "the prompt is empty");
        goto done;
    }
    if (n_all >= c->n_ctx) {
        snprintf(err, sizeof err, "the prompt is %d tokens; the context holds %d (prompt plus at least "
                 "one generated token)", n_all, c->n_ctx);
        coord_request_fail(req, 413, err);
        goto done;
    }
    int max_new = prm->max_tokens < c->n_ctx - n_all ? prm->max_tokens : c->n_ctx - n_all;
    for (int i = 0; i < prm->n_stop; i++)
        if (strlen(prm->stop[i]) > out.max_stop)
            out.max_stop = strlen(prm->stop[i]);
    out.max_stop = out.max_stop ? out.max_stop - 1 : 0;
    bool greedy = prm->temperature <= 0;
    sampler smp;
    sampler_init(&smp, (float)prm->temperature, prm->top_k, (float)prm->top_p,
                 prm->has_seed ? (uint64_t)prm->seed : req_id);
    void *work = malloc((size_t)V * 3 * sizeof(float) + (size_t)V * 8);
    if (!work) {
        coord_request_fail(req, 500, "out of memory");
        goto done;
    }

    /* prefill */
    int n_prefix = 0;
    int32_t path[RT_MAX_WIDTH];
    for (int i = 0; i < RT_MAX_WIDTH; i++)
        path[i] = i;
    while (n_prefix < n_all) {
        int w = n_all - n_prefix < c->max_width ? n_all - n_prefix : c->max_width;
        bool last = n_prefix + w == n_all;
        llama_batch b = {.n = w, .tokens = all + n_prefix, .logits_from = last ? w - 1 : w};
        if (engine_step(c, w, all + n_prefix, NULL, n_prefix, b.logits_from, err, sizeof err) ||
            engine_commit(c, &b, n_prefix, path, w, err, sizeof err)) {
            coord_request_fail(req, 503, err);
            goto done_work;
        }
        n_prefix += w;
    }
    int32_t next = greedy ? sampler_argmax(c->logits, V) : sampler_sample(&smp, c->logits, V, work);
    all[n_all++] = next;
    int generated = 1, steps = 1, accepted_total = 0, verify_steps = 0;
    const char *finish = "length";
    int32_t eos = tokenizer_eos(c->tok);
    bool kinds_used[RT_MAX_SPECULATORS] = {0};
    char kinds[COORD_DRAFT_KINDS_LEN] = "";

    /* emit a run of new tokens; returns true when generation must stop */
#define EMIT(ids, cnt)                                                                             \
    do {                                                                                           \
        for (int e_ = 0; e_ < (cnt); e_++) {                                                       \
            int32_t id_ = (ids)[e_];                                                               \
            coord_request_append(req, &id_, 1, NULL, 0);                                           \
            if (id_ == eos) {                                                                      \
                finish = "stop";                                                                   \
                stop = true;                                                                       \
                break;                                                                             \
            }                                                                                      \
            const char *pc_;                                                                       \
            size_t pl_ = tokenizer_is_special(c->tok, id_) ? 0 : tokenizer_piece(c->tok, id_, &pc_); \
            if (pl_ && text_add(&out, pc_, pl_)) {                                                 \
                stop = true;                                                                       \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
        if (!stop && text_flush(&out, req, prm, false)) {                                         \
            finish = "stop";                                                                       \
            stop = true;                                                                           \
        }                                                                                          \
    } while (0)

    bool stop = false;
    EMIT(&next, 1);
    engine_feedback(c, req_id, all, n_all, NULL, 0, 0, 0);
    static __thread coord_tree tree;
    while (!stop && generated < max_new && !coord_request_cancelled(req) && !coord_stop_flag) {
        int room = max_new - generated; /* tokens we may still emit */
        int budget = c->width < c->n_ctx - n_prefix ? c->width : c->n_ctx - n_prefix;
        if (budget > room)
            budget = room; /* a longer path could not be emitted anyway */
        if (budget < 1)
            budget = 1;
        engine_gather_drafts(c, req_id, all, n_all);
        engine_build_tree(c, all[n_all - 1], budget, &tree);
        int k = tree.n - 1; /* drafted nodes under verification */
        llama_batch b = {.n = tree.n, .tokens = tree.tokens, .parent = tree.parent, .logits_from = 0};
        uint64_t t_step = rt_now_us();
        if (engine_step(c, tree.n, tree.tokens, tree.parent, n_prefix, 0, err, sizeof err)) {
            coord_request_fail(req, 503, err);
            goto done_work;
        }
        verify_tree vt = {.n = tree.n, .tokens = tree.tokens, .parent = tree.parent};
        verify_result vr;
        if (greedy)
            verify_greedy(&vt, c->logits, V, &vr);
        else
            verify_sample(&vt, c->logits, V, &smp, work, &vr);
        int a = vr.n_path - 1;
        if (engine_commit(c, &b, n_prefix, vr.path, vr.n_path, err, sizeof err)) {
            coord_request_fail(req, 500, err);
            goto done_work;
        }
        n_prefix += vr.n_path;
        int32_t added[RT_MAX_WIDTH + 1];
        for (int i = 1; i < vr.n_path; i++)
            added[i - 1] = tree.tokens[vr.path[i]];
        added[a] = vr.next;
        int n_add = a + 1 < room ? a + 1 : room;
        memcpy(all + n_all, added, (size_t)n_add * sizeof *added);
        n_all += n_add;
        generated += n_add;
        steps++;
        verify_steps++;
        accepted_total += a;
        coord_adapt_sample(c, (rt_now_us() - t_step) / 1e6 / (a + 1));
        for (int i = 0; i < COORD_MAX_PEERS; i++) {
            coord_peer *p = &c->peers[i];
            if (!p->has_draft)
                continue;
            int depth, matched;
            coord_tree_match(&p->draft, added, a, &depth, &matched);
            coord_acr_update(c, p, depth, matched);
            p->drafted += (uint64_t)depth;
            p->accepted += (uint64_t)matched;
            p->drafts_used++;
            bool verified = false;
            for (int j = 1; j < tree.n; j++)
                verified |= (tree.owners[j] >> p->index) & 1u;
            if (verified && p->index < RT_MAX_SPECULATORS && !kinds_used[p->index]) {
                kinds_used[p->index] = true;
                size_t kl = strlen(kinds);
                if (!strstr(kinds, p->kind))
                    snprintf(kinds + kl, sizeof kinds - kl, "%s%s", kl ? "," : "", p->kind);
            }
        }
        pthread_mutex_lock(&c->mlock);
        c->m_accept_hist[a < RT_MAX_WIDTH ? a : RT_MAX_WIDTH]++;
        c->m_verified_nodes += (uint64_t)k;
        pthread_mutex_unlock(&c->mlock);
        EMIT(added, n_add);
        if (!stop)
            engine_feedback(c, req_id, all, n_all, added, n_add, a, k);
    }
#undef EMIT
    text_flush(&out, req, prm, true); /* after a stop string this adds nothing */
    stats.prompt_tokens = n_prompt;
    stats.completion_tokens = generated;
    stats.steps = steps;
    stats.mean_accepted = verify_steps ? (double)(accepted_total + verify_steps) / verify_steps : 1.0;
    snprintf(stats.draft_kinds, sizeof stats.draft_kinds, "%s", kinds);
    coord_request_finish(req, finish, &stats);
    pthread_mutex_lock(&c->mlock);
    c->m_tokens += (uint64_t)generated;
    c->m_prompt_tokens += (uint64_t)n_prompt;
    pthread_mutex_unlock(&c->mlock);
    if (c->trace)
        rt_log("coordinator", "request %llu: %d prompt + %d generated tokens in %d steps (%.2f per "
               "verification)", (unsigned long long)req_id, n_prompt, generated, steps, stats.mean_accepted);
done_work:
    free(work);
    engine_feedback_done(c, req_id);
done:
    free(out.text);
    free(all);
    free(text);
}

void coord_engine_run_next(coord *c)
{
    coord_request *req = engine_pop(c);
    if (!req)
        return;
    pthread_mutex_lock(&c->mlock);
    c->m_requests++;
    pthread_mutex_unlock(&c->mlock);
    if (!coord_request_cancelled(req))
        engine_run(c, req);
    if (coord_request_state_now(req) == COORD_REQ_RUNNING)
        coord_request_fail(req, 500, "the engine stopped before the request finished");
    if (coord_request_state_now(req) == COORD_REQ_FAILED) {
        pthread_mutex_lock(&c->mlock);
        c->m_failed++;
        pthread_mutex_unlock(&c->mlock);
    }
    coord_request_unref(&req);
}

/* ===== metrics ===== */

char *coord_engine_metrics(void *ctx)
{
    coord *c = ctx;
    size_t cap = 16384;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    size_t n = 0;
#define M(...) n += (size_t)snprintf(s + n, n < cap ? cap - n : 0, __VA_ARGS__)
    pthread_mutex_lock(&c->mlock);
    M("# HELP orochi_requests_total Requests taken by the engine.\n# TYPE orochi_requests_total counter\n"
      "orochi_requests_total %llu\n", (unsigned long long)c->m_requests);
    M("# TYPE orochi_requests_failed_total counter\norochi_requests_failed_total %llu\n",
      (unsigned long long)c->m_failed);
    M("# HELP orochi_tokens_generated_total Tokens generated.\n# TYPE orochi_tokens_generated_total counter\n"
      "orochi_tokens_generated_total %llu\n", (unsigned long long)c->m_tokens);
    M("# TYPE orochi_prompt_tokens_total counter\norochi_prompt_tokens_total %llu\n",
      (unsigned long long)c->m_prompt_tokens);
    M("# HELP orochi_steps_total Target forward steps (prefill and verification).\n"
      "# TYPE orochi_steps_total counter\norochi_steps_total %llu\n", (unsigned long long)c->m_steps);
    M("# HELP orochi_accepted_per_step Drafted tokens accepted per verification step.\n"
      "# TYPE orochi_accepted_per_step histogram\n");
    uint64_t cum = 0, count = 0, sum = 0;
    for (int i = 0; i <= RT_MAX_WIDTH; i++) {
        count += c->m_accept_hist[i];
        sum += (uint64_t)i * c->m_accept_hist[i];
    }
    static const int le[] = {0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64};
    for (size_t b = 0; b < sizeof le / sizeof le[0]; b++) {
        cum = 0;
        for (int i = 0; i <= le[b] && i <= RT_MAX_WIDTH; i++)
            cum += c->m_accept_hist[i];
        M("orochi_accepted_per_step_bucket{le=\"%d\"} %llu\n", le[b], (unsigned long long)cum);
    }
    M("orochi_accepted_per_step_bucket{le=\"+Inf\"} %llu\norochi_accepted_per_step_sum %llu\n"
      "orochi_accepted_per_step_count %llu\n", (unsigned long long)count, (unsigned long long)sum,
      (unsigned long long)count);
    M("# HELP orochi_step_seconds Wall time of target steps, by role.\n# TYPE orochi_step_seconds summary\n"
      "orochi_step_seconds_sum{role=\"coordinator\"} %.6f\norochi_step_seconds_count{role=\"coordinator\"} %llu\n",
      c->m_step_seconds, (unsigned long long)c->m_steps);
    for (int i = 0; i < c->n_workers && i < COORD_MAX_WORKERS; i++)
        M("orochi_step_seconds_sum{role=\"worker-%d\"} %.6f\norochi_step_seconds_count{role=\"worker-%d\"} %llu\n",
          i, c->m_worker_compute_us[i] / 1e6, i, (unsigned long long)c->m_worker_steps[i]);
    M("# TYPE orochi_draft_wait_seconds_total counter\norochi_draft_wait_seconds_total %.6f\n",
      c->m_draft_wait_seconds);
    M("# TYPE orochi_peer_restarts_total counter\norochi_peer_restarts_total %llu\n",
      (unsigned long long)c->m_restarts);
    M("%s", c->m_spec_text);
    pthread_mutex_unlock(&c->mlock);
#undef M
    if (n >= cap)
        s[cap - 1] = 0;
    return s;
}
