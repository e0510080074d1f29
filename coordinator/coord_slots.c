/*
 * coordinator/coord_slots.c — the sequence slots: a request from admission to its last token.
 *
 * engine_slot_start renders and tokenizes the prompt, refuses one that cannot fit (413), starts it
 * from the longest committed beginning another slot left in the cache, and prefills the rest in
 * steps of up to max_width (each also a plain step for the other active greedy requests:
 * piggybacking). engine_slot_emit hands a step's new tokens to the request (text released up to
 * a stop string, logprobs when asked) and sees its end; engine_slot_finish and engine_slot_fail
 * end it and keep its committed tokens for the next prompt that shares them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/buf.h"

#include "coordinator/engine.h"
#include "model/ngram.h"

/* the request's span on its slot's track of the timeline */
static void engine_slot_trace(coord *c, int s, int status)
{
    const engine_slot *sl = &c->eng->slots[s];
    if (!coord_tracing(c) || !sl->admitted_us)
        return;
    coord_trace_span(c, (int)getpid(), "coordinator", COORD_TRACE_SLOT + s, "request",
                     sl->admitted_us, rt_now_us(),
                     "\"id\":%llu,\"status\":%d,\"prompt_tokens\":%d,\"completion_tokens\":%d,"
                     "\"queued_us\":%llu",
                     (unsigned long long)sl->req_id, status, sl->n_prompt, sl->generated,
                     (unsigned long long)(sl->admitted_us - sl->queued_us));
}

static void engine_slot_release(coord *c, int s)
{
    engine_slot *sl = &c->eng->slots[s];
    engine_feedback_done(c, sl->req_id);
    int n = c->eng->prefix[s] < sl->n_all ? c->eng->prefix[s] : sl->n_all;
    int32_t *k = n > 0 && sl->all ? realloc(c->eng->kept[s], (size_t)n * sizeof *k) : NULL;
    c->eng->n_kept[s] = 0;
    if (k) {
        memcpy(k, sl->all, (size_t)n * sizeof *k);
        c->eng->kept[s] = k;
        c->eng->n_kept[s] = n;
    }
    free(sl->out.text);
    free(sl->all);
    free(sl->work);
    free(sl->pen_count);
    free(sl->pen_ids);
    grammar_matcher_free(&sl->gm);
    grammar_state_free(&sl->gst);
    for (int i = 0; i < COORD_TREE_CAP; i++)
        grammar_state_free(&sl->gnode[i]);
    coord_request_unref(&sl->req);
    memset(sl, 0, sizeof *sl);
    if (c->eng->prefix[s] > c->eng->held[s]) /* the rows written stay until --kv-release */
        c->eng->held[s] = c->eng->prefix[s];
    c->eng->prefix[s] = 0;
    c->eng->idle_since[s] = rt_now_us();
}

bool engine_slot_shaped(const engine_slot *sl)
{
    return sl->prm->n_bias > 0 || sl->prm->frequency_penalty != 0 ||
           sl->prm->presence_penalty != 0 || sl->prm->grammar;
}

/* ==== structured output ======================================================================= */

/* The grammar's position after the committed tokens: fed those generated since the last call (the
 * masks chose them, so the grammar takes them). 0, or -1 when out of memory or it refused one. */
static int engine_grammar_sync(const coord *c, engine_slot *sl)
{
    if (!c->eng->gvocab && !(c->eng->gvocab = grammar_vocab_new(c->tok)))
        return -1;
    if (!sl->gm) {
        sl->gm = grammar_matcher_new(sl->prm->grammar, c->eng->gvocab);
        sl->gst = grammar_start(sl->prm->grammar);
        sl->g_upto = sl->n_prompt;
        if (!sl->gm || !sl->gst)
            return -1;
    }
    for (; sl->g_upto < sl->n_all; sl->g_upto++)
        if (grammar_advance(sl->gm, sl->gst, sl->all[sl->g_upto]))
            return -1;
    return 0;
}

/* The position after node i of a tree (node 0: the committed text): its parent's advanced over
 * its token, in sl->gnode[i]; NULL when the grammar refuses the token there (or out of memory). */
static grammar_state *engine_grammar_node(engine_slot *sl, grammar_state *const *at, int i,
                                          const int32_t *tok, int p)
{
    if (i == 0)
        return sl->gst;
    if (p < 0 || !at[p])
        return NULL;
    if (!sl->gnode[i] && !(sl->gnode[i] = grammar_clone(at[p])))
        return NULL;
    if (grammar_copy(sl->gnode[i], at[p]) || grammar_advance(sl->gm, sl->gnode[i], tok[i]))
        return NULL;
    return sl->gnode[i];
}

/* Masks one row by the position st; greedy rows that need no distribution (`full` false) only
 * when their argmax is refused. A position that allows no token at all (a grammar no token can
 * continue) lets the end-of-generation tokens through, so the answer ends instead of breaking. */
static int engine_grammar_row(const coord *c, engine_slot *sl, const grammar_state *st, float *row,
                              bool full)
{
    int V = c->model->cfg.vocab;
    if (!full && grammar_allows(sl->gm, st, sampler_argmax(row, V)))
        return 0;
    const uint64_t *mask = grammar_mask(sl->gm, st);
    if (!mask)
        return -1;
    bool any = false;
    for (int w = 0; w < (V + 63) / 64 && !any; w++)
        any = mask[w] != 0;
    for (int id = 0; id < V; id++)
        if (any ? !(mask[id / 64] >> (id % 64) & 1) : !tokenizer_is_eog(c->tok, id))
            row[id] = -INFINITY;
    return 0;
}

static int engine_grammar_rows(const coord *c, engine_slot *sl, float *rows, const int32_t *tok,
                               const int32_t *parent, int n)
{
    if (engine_grammar_sync(c, sl))
        return -1;
    grammar_state *at[RT_MAX_WIDTH];
    bool full = !sl->greedy || sl->prm->logprobs;
    for (int i = 0; i < n && i < RT_MAX_WIDTH; i++) {
        at[i] = engine_grammar_node(sl, at, i, tok, parent ? parent[i] : i - 1);
        /* a node the grammar refuses is never accepted (its parent's row refuses it): its row is
         * read by nobody */
        if (at[i] && engine_grammar_row(c, sl, at[i], rows + (size_t)i * c->model->cfg.vocab, full))
            return -1;
    }
    return 0;
}

int engine_slot_constrain_tree(coord *c, engine_slot *sl, coord_tree *t, char *err, size_t errlen)
{
    if (!sl->prm->grammar)
        return 0;
    if (engine_grammar_sync(c, sl)) {
        snprintf(err, errlen, "the grammar could not follow the answer (out of memory)");
        return -1;
    }
    /* the forced text as a draft chain: it has one spelling in text, the tokenizer's the likeliest
     */
    char text[96];
    size_t n = c->opt.no_grammar_drafts ? 0 : grammar_forced(sl->gst, text, sizeof text);
    if (n) {
        static arena_draft d; /* the engine is one thread */
        int32_t ids[ARENA_DRAFT_MAX];
        int k = tokenizer_encode(c->tok, text, n, false, ids, ARENA_DRAFT_MAX, NULL);
        d.n = k > 0 ? (uint32_t)k : 0;
        for (int i = 0; i < k; i++) {
            d.tokens[i] = ids[i];
            d.parent[i] = i - 1;
            d.conf[i] = 1;
        }
        ctl_tree_add(t, &d, 1.0f, CTL_MAX_OWNERS - 1);
    }
    /* cut what the grammar refuses */
    grammar_state *at[COORD_TREE_CAP];
    int map[COORD_TREE_CAP], m = 0;
    static coord_tree cut;
    cut = *t;
    for (int i = 0; i < t->n; i++) {
        at[i] = engine_grammar_node(sl, at, i, t->tokens, t->parent[i]);
        map[i] = -1;
        if (!at[i])
            continue;
        map[i] = m;
        cut.tokens[m] = t->tokens[i];
        cut.parent[m] = i ? map[t->parent[i]] : -1;
        cut.weight[m] = t->weight[i];
        cut.support[m] = t->support[i];
        cut.owners[m] = t->owners[i];
        m++;
    }
    cut.n = m;
    *t = cut;
    return 0;
}

/* logit_bias and the penalties (engine_slot_shape) */
static int engine_slot_bias(const coord *c, engine_slot *sl, float *rows, const int32_t *tok,
                            const int32_t *parent, int n)
{
    const coord_params *prm = sl->prm;
    int V = c->model->cfg.vocab;
    double fp = prm->frequency_penalty, pp = prm->presence_penalty;
    bool pen = fp != 0 || pp != 0;
    if (pen && !sl->pen_count) {
        sl->pen_count = calloc((size_t)V, sizeof *sl->pen_count);
        sl->pen_ids = malloc((size_t)V * sizeof *sl->pen_ids);
        if (!sl->pen_count || !sl->pen_ids)
            return -1;
        sl->pen_upto = sl->n_prompt;
    }
    if (pen) /* count the tokens generated since the last shaped row */
        for (; sl->pen_upto < sl->n_all; sl->pen_upto++) {
            int32_t t = sl->all[sl->pen_upto];
            if (t >= 0 && t < V && sl->pen_count[t]++ == 0)
                sl->pen_ids[sl->n_pen_ids++] = t;
        }
    for (int i = 0; i < n; i++) {
        float *row = rows + (size_t)i * V;
        for (int b = 0; b < prm->n_bias; b++)
            if (prm->bias_id[b] < V)
                row[prm->bias_id[b]] += prm->bias[b];
        if (!pen)
            continue;
        /* the tree's nodes on i's path (node 0, the last committed token, is counted already) */
        int32_t path[RT_MAX_WIDTH];
        int depth = 0;
        for (int j = i; j > 0 && depth < RT_MAX_WIDTH; j = parent ? parent[j] : j - 1)
            path[depth++] = tok[j];
        /* one subtraction per token of its whole count, as a sequential step would make it:
         * first the tokens on the path (committed count plus their occurrences there) ... */
        for (int a = 0; a < depth; a++) {
            int32_t t = path[a];
            bool first = t >= 0 && t < V;
            for (int q = 0; q < a && first; q++)
                first = path[q] != t;
            if (!first)
                continue;
            int total = sl->pen_count[t];
            for (int q = a; q < depth; q++)
                total += path[q] == t;
            row[t] -= (float)(total * fp + pp);
        }
        /* ... then the other generated tokens */
        for (int k = 0; k < sl->n_pen_ids; k++) {
            int32_t t = sl->pen_ids[k];
            bool on_path = false;
            for (int q = 0; q < depth && !on_path; q++)
                on_path = path[q] == t;
            if (!on_path)
                row[t] -= (float)(sl->pen_count[t] * fp + pp);
        }
    }
    return 0;
}

int engine_slot_shape(const coord *c, engine_slot *sl, float *rows, const int32_t *tok,
                      const int32_t *parent, int n)
{
    const coord_params *prm = sl->prm;
    if (!engine_slot_shaped(sl))
        return 0;
    if (prm->n_bias > 0 || prm->frequency_penalty != 0 || prm->presence_penalty != 0)
        if (engine_slot_bias(c, sl, rows, tok, parent, n))
            return -1;
    return prm->grammar ? engine_grammar_rows(c, sl, rows, tok, parent, n) : 0;
}

/* Publish the target's hidden state of batch row `row` (just computed) for the request in
 * sequence slot `slot`, its context of ctx_len tokens: Medusa speculators draft from it. */
void engine_publish_hidden(coord *c, int slot, uint64_t req_id, int ctx_len, int row)
{
    rt_hidden *h = rt_hidden_at(c->grp.hidden, c->model->cfg.dim, slot);
    const float *x = llama_ctx_shared(c->kv)->x + (size_t)row * c->model->cfg.dim;
    __atomic_store_n(&h->seq, h->seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    h->request_id = req_id;
    h->ctx_len = (uint64_t)ctx_len;
    memcpy(h->h, x, (size_t)c->model->cfg.dim * sizeof *x);
    __atomic_store_n(&h->seq, h->seq + 1, __ATOMIC_RELEASE);
}

/* The request a speculator that has not said it drafts for every request is fed: the oldest active
 * one (a model drafter before its first DraftReady, which keeps one request's state then). The
 * others (ngram, replay, medusa, a model drafter once it said every_request) are fed every
 * active request. */
uint64_t engine_focus(const coord *c)
{
    uint64_t best = 0;
    for (int s = 0; s < c->opt.n_seq; s++) {
        const engine_slot *sl = &c->eng->slots[s];
        if (sl->used && (!best || sl->req_id < best))
            best = sl->req_id;
    }
    return best;
}

/* One token's logprob record: the log-softmax of the logits row that chose it, at temperature 1
 * (the raw logits, whatever the request samples with), for the chosen id and the k most likely ids
 * (descending; ties: the lower id first, as sampler_argmax), with their pieces. The normaliser is
 * max + log(sum exp(x - max)), the sum in double. The k best are a partial selection: a small
 * sorted array that a logit enters only when it beats the current k-th. */
static void engine_logprob(const coord *c, const float *row, int32_t id, int k, coord_logprob *out)
{
    int V = c->model->cfg.vocab;
    float mx = row[0];
    for (int i = 1; i < V; i++)
        mx = row[i] > mx ? row[i] : mx;
    int32_t top_id[COORD_MAX_TOP_LOGPROBS];
    float top_x[COORD_MAX_TOP_LOGPROBS];
    int n = 0;
    k = k < COORD_MAX_TOP_LOGPROBS ? k : COORD_MAX_TOP_LOGPROBS;
    double sum = 0;
    for (int i = 0; i < V; i++) {
        float x = row[i];
        sum += expf(x - mx);
        if (k == 0 || (n == k && !(x > top_x[k - 1])))
            continue;
        int j = n < k ? n++ : k - 1;
        for (; j > 0 && x > top_x[j - 1]; j--) {
            top_x[j] = top_x[j - 1];
            top_id[j] = top_id[j - 1];
        }
        top_x[j] = x;
        top_id[j] = i;
    }
    double lse = (double)mx + log(sum);
    const char *pc;
    size_t pl = tokenizer_piece(c->tok, id, &pc);
    out->token = (coord_token_lp){id, (float)((double)row[id] - lse), pc, pl};
    out->n_top = n;
    for (int j = 0; j < n; j++) {
        pl = tokenizer_piece(c->tok, top_id[j], &pc);
        out->top[j] = (coord_token_lp){top_id[j], (float)((double)top_x[j] - lse), pc, pl};
    }
}

/* The logprob records of a step's tokens ids[0..n) whose text begins at start[e] (eos excluded by
 * the caller), for a request that asks for them. Tokens at or after a stop string (its text begins
 * at cut; SIZE_MAX when none) are not reported, including those appended in earlier steps. Records
 * go to the request before the text they start in (engine_slot_emit flushes after this). */
static void engine_slot_logprobs(coord *c, engine_slot *sl, const int32_t *ids,
                                 const float *const *rows, const size_t *start, int n, size_t cut)
{
    for (int e = 0; e < n && start[e] < cut; e++) {
        coord_logprob lp;
        engine_logprob(c, rows[e], ids[e], sl->prm->top_logprobs, &lp);
        lp.text_start = start[e];
        if (coord_request_append_logprobs(sl->req, &lp, 1)) {
            sl->stop = true;
            return;
        }
    }
    if (cut != SIZE_MAX)
        coord_request_cut_logprobs(sl->req, cut);
}

/* Emit new tokens of a slot; sets sl->stop at eos, a stop string or an allocation failure.
 * Returns how many of the n ids the request got: up to and including an eos, so tokens a
 * verification accepted past the end of sequence are never counted as generated. rows[e] is the
 * logits row (V floats) whose distribution chose ids[e]; it is read only when the request asks for
 * logprobs (rows may be NULL otherwise). n <= RT_MAX_WIDTH: a step emits its accepted path (at most
 * the tree's nodes, the root standing for the correction/bonus token). */
static int slot_emit_ids(coord *c, engine_slot *sl, const int32_t *ids, const float *const *rows,
                         int n)
{
    size_t start[RT_MAX_WIDTH + 1]; /* where each token's piece begins in the text */
    int kept = n, texted = n;       /* ids the request got; of those, tokens with text */
    for (int e = 0; e < n; e++) {
        coord_request_append(sl->req, &ids[e], 1, NULL, 0);
        if (tokenizer_is_eog(c->tok, ids[e])) {
            sl->finish = "stop";
            sl->stop = true;
            kept = e + 1;
            texted = e;
            break;
        }
        start[e] = sl->out.len;
        const char *pc;
        size_t pl = tokenizer_is_special(c->tok, ids[e]) ? 0 : tokenizer_piece(c->tok, ids[e], &pc);
        if (pl && coord_text_add(&sl->out, pc, pl)) {
            sl->stop = true;
            kept = e + 1;
            texted = e;
            break;
        }
    }
    if (sl->prm->logprobs && rows) {
        size_t cut;
        bool stopped = coord_text_find_stop(&sl->out, sl->prm, &cut);
        engine_slot_logprobs(c, sl, ids, rows, start, texted, stopped ? cut : SIZE_MAX);
    }
    if (sl->stop) /* eos or out of memory: engine_slot_finish flushes the text */
        return kept;
    if (coord_text_flush(&sl->out, sl->req, sl->prm, false)) {
        sl->finish = "stop";
        sl->stop = true;
    }
    return n;
}

int engine_slot_emit(coord *c, engine_slot *sl, const int32_t *ids, const float *const *rows, int n)
{
    int kept = slot_emit_ids(c, sl, ids, rows, n);
    /* the latency histograms: the first emission (engine_slot_start's, the first token alone)
     * from the request's arrival; later ones share the gap since the request's previous tokens */
    uint64_t now = rt_now_us();
    pthread_mutex_lock(&c->met.lock);
    if (!sl->emit_us)
        coord_latency_observe(&c->met.ttft, (double)(now - sl->queued_us) / 1e6, 1);
    else if (kept > 0)
        coord_latency_observe(&c->met.itl, (double)(now - sl->emit_us) / 1e6 / kept,
                              (uint64_t)kept);
    pthread_mutex_unlock(&c->met.lock);
    sl->emit_us = now;
    return kept;
}

void engine_slot_finish(coord *c, int s)
{
    engine_slot *sl = &c->eng->slots[s];
    coord_text_flush(&sl->out, sl->req, sl->prm, true); /* after a stop string this adds nothing */
    coord_stats stats = {0};
    stats.prompt_tokens = sl->n_prompt;
    stats.cached_tokens = sl->cached;
    stats.completion_tokens = sl->generated;
    stats.steps = sl->steps;
    stats.mean_accepted =
        sl->verify_steps ? (double)(sl->accepted_total + sl->verify_steps) / sl->verify_steps : 1.0;
    snprintf(stats.draft_kinds, sizeof stats.draft_kinds, "%s", sl->kinds);
    stats.speculation_length = engine_active(c) > 1 ? sl->spec_len : c->spec_len;
    uint64_t now = rt_now_us();
    stats.queued_ms = (double)(sl->admitted_us - sl->queued_us) / 1e3;
    stats.prompt_ms = (double)(sl->first_us - sl->admitted_us) / 1e3;
    stats.decode_ms = (double)(now - sl->first_us) / 1e3;
    coord_request_finish(sl->req, sl->finish, &stats);
    engine_slot_trace(c, s, 200);
    pthread_mutex_lock(&c->met.lock);
    c->met.tokens += (uint64_t)sl->generated;
    c->met.prompt_tokens += (uint64_t)sl->n_prompt;
    pthread_mutex_unlock(&c->met.lock);
    if (c->opt.trace)
        rt_log("coordinator",
               "request %llu: %d prompt + %d generated tokens in %d steps (%.2f per "
               "verification)",
               (unsigned long long)sl->req_id, sl->n_prompt, sl->generated, sl->steps,
               stats.mean_accepted);
    engine_slot_release(c, s);
}

void engine_slot_fail(coord *c, int s, int status, const char *msg)
{
    coord_request_fail(c->eng->slots[s].req, status, msg);
    engine_slot_trace(c, s, status);
    if (status >= 500) {
        snprintf(c->met.last_error, sizeof c->met.last_error, "request %llu: %d %.160s",
                 (unsigned long long)c->eng->slots[s].req_id, status, msg);
        c->met.last_error_us = rt_now_us();
    }
    engine_slot_release(c, s);
}

/* Whether this cycle verifies drafts: a width above 1 (the plan's choice for the context) and
 * the guard on. While not, speculators get no Feedback and sit idle (their cores go to the
 * target); the next Feedback resets them to the then committed context. */
bool engine_speculating(const coord *c, int n_active)
{
    const ctl_guard *g = n_active > 1 ? &c->guard_batch : &c->guard;
    if (c->width <= 1)
        return false;
    for (int s = 0; s < c->opt.n_seq; s++) /* a seeded request's trees must not depend on timing */
        if (engine_slot_seeded(c, s))
            return true;
    return !c->opt.guard_enabled || g->on;
}

/* Whether slot s's request is over: a stop (end of text, a stop string), its length, or a
 * client gone. */
bool engine_slot_over(const engine_slot *sl)
{
    return sl->stop || sl->generated >= sl->max_new || coord_request_cancelled(sl->req);
}

/* Name a draft kind among those the request's accepted or verified drafts came from (once). */
void engine_slot_add_kind(engine_slot *sl, const char *kind)
{
    size_t kl = strlen(sl->kinds);
    if (!strstr(sl->kinds, kind))
        snprintf(sl->kinds + kl, sizeof sl->kinds - kl, "%s%s", kl ? "," : "", kind);
}

/* Tokens slot s may still take: its request's length and the context's end. */
int engine_slot_room(const coord *c, int s)
{
    const engine_slot *sl = &c->eng->slots[s];
    int room = sl->max_new - sl->generated, ctx = c->opt.n_ctx - c->eng->prefix[s];
    return room < ctx ? room : ctx;
}

int engine_active(const coord *c)
{
    int n = 0;
    for (int s = 0; s < c->opt.n_seq; s++)
        n += c->eng->slots[s].used;
    return n;
}

/* The tokens slot b's rows hold: an active request's, or what an idle slot kept. */
static const int32_t *engine_slot_tokens(const coord *c, int b, int *n)
{
    const engine_slot *o = &c->eng->slots[b];
    *n = o->used ? o->n_all : c->eng->n_kept[b];
    return o->used ? o->all : c->eng->kept[b];
}

/* Before slot s's own rows are written for the sequence toks[0..n): every slot that borrows rows
 * of s keeps borrowing only those whose positions its tokens share with that sequence (such a row
 * is written again with the same bytes: a position's K/V depend only on the tokens up to it). An
 * active borrower gets the rest copied into its own rows; an idle one forgets the rest of what it
 * kept. */
static void engine_unshare_from(coord *c, int s, const int32_t *toks, int n)
{
    for (int b = 0; b < c->opt.n_seq; b++) {
        int lent = engine_lent_by(c, b, s), nb;
        if (lent == 0)
            continue;
        const int32_t *bt = engine_slot_tokens(c, b, &nb);
        int k = bt ? ngram_common_prefix(bt, nb, toks, n) : 0;
        if (lent <= k)
            continue;
        bool active = c->eng->slots[b].used;
        llama_kv_unshare(c->kv, b, k, active);
        if (!active && c->eng->n_kept[b] > k)
            c->eng->n_kept[b] = k;
    }
}

int engine_lent_by(const coord *c, int b, int s)
{
    int from, lent = b != s ? llama_kv_lent(c->kv, b, &from) : 0;
    return lent > 0 && from == s ? lent : 0;
}

bool engine_slot_lends(const coord *c, int s)
{
    for (int b = 0; b < c->opt.n_seq; b++)
        if (c->eng->slots[b].used && engine_lent_by(c, b, s))
            return true;
    return false;
}

int engine_free_slot(const coord *c)
{
    int first = -1;
    for (int s = 0; s < c->opt.n_seq; s++) {
        if (c->eng->slots[s].used)
            continue;
        if (!engine_slot_lends(c, s))
            return s;
        if (first < 0)
            first = s;
    }
    return first;
}

/* Start slot s's prompt from the longest committed beginning it shares with any slot — an active
 * one's committed tokens, an idle one's kept tokens (its own included: then the rows are already
 * in place) — leaving at least its last token to prefill (its logits draw the first token). With
 * --prefix-share (CPU groups) another slot's rows are borrowed, read where they lie
 * (llama_kv_share_prefix), from ENGINE_SHARE_MIN rows up; otherwise copied within the cache
 * (llama_kv_copy_prefix). The workers read them from there. */
#define ENGINE_SHARE_MIN 16 /* a page of one KV head's f32 rows of 64: fewer are copied */
static int engine_reuse_prefix(coord *c, int s, char *err, size_t errlen)
{
    engine_slot *sl = &c->eng->slots[s];
    int best = 0, from = s;
    engine_unshare_from(c, s, sl->all, sl->n_all); /* first: it may shorten what others kept */
    for (int t = 0; t < (c->opt.no_prefix_reuse ? 0 : c->opt.n_seq); t++) {
        const engine_slot *o = &c->eng->slots[t];
        const int32_t *toks = t != s && o->used ? o->all : c->eng->kept[t];
        int n = t != s && o->used ? c->eng->prefix[t] : c->eng->n_kept[t];
        if (!toks || n <= 0)
            continue;
        int k = ngram_common_prefix(toks, n, sl->all, sl->n_all - 1);
        if (k > best || (k == best && t == s)) {
            best = k;
            from = t;
        }
    }
    c->eng->n_kept[s] = 0; /* the slot's rows are this request's from here on */
    bool share = c->kv_share_ok && from != s && best >= ENGINE_SHARE_MIN;
    if (share ? llama_kv_share_prefix(c->kv, from, s, best, err, errlen)
              : llama_kv_copy_prefix(c->kv, from, s, best, err, errlen))
        return -1;
    c->eng->prefix[s] = best;
    return 0;
}

/* The requests that decode a token in each step of another's prefill: the active greedy ones
 * (the coordinator takes their argmax, as a plain cycle would) but slot `s`, with room for a
 * token. A new request's prompt no longer holds the others up: its chunk's step gives each of
 * them its next token for little more than the chunk costs alone. Returns how many, in pig[]. */
static int engine_piggyback_slots(coord *c, int s, int *pig)
{
    int n = 0;
    for (int k = 0; k < c->opt.n_seq && n < RT_MAX_SEQ; k++) {
        const engine_slot *o = &c->eng->slots[k];
        if (k != s && o->used && !engine_slot_seeded(c, k) && !engine_slot_over(o) &&
            engine_slot_room(c, k) >= 1)
            pig[n++] = k;
    }
    return n;
}

/* After a prefill step that carried them at batch rows w, w + 1, ...: each piggybacked request
 * takes its row's token (greedy: the argmax; sampled: drawn from the row as a plain step draws
 * it), commits the row and emits the token. */
static void engine_piggyback_take(coord *c, const int *pig, int n, int w, int logits_from)
{
    int V = c->model->cfg.vocab;
    for (int k = 0; k < n; k++) {
        int s = pig[k];
        engine_slot *o = &c->eng->slots[s];
        int32_t row = w + k;
        char err[256];
        if (llama_commit(c->kv, &row, 1, err, sizeof err)) {
            engine_slot_fail(c, s, 500, err);
            continue;
        }
        c->eng->prefix[s]++;
        float *lg = c->grp.logits + (size_t)(row - logits_from) * (size_t)V;
        if (engine_slot_shape(c, o, lg, NULL, NULL, 1)) {
            engine_slot_fail(c, s, 500, "out of memory");
            continue;
        }
        int32_t next = o->greedy ? sampler_argmax(lg, V) : sampler_sample(&o->smp, lg, V, o->work);
        o->all[o->n_all++] = next;
        o->steps++;
        o->verify_steps++;
        o->last_added = 1;
        const float *row_lg = lg;
        o->generated += engine_slot_emit(c, o, &next, o->prm->logprobs ? &row_lg : NULL, 1);
        pthread_mutex_lock(&c->met.lock);
        c->met.accept_hist[0]++;
        c->met.piggyback_tokens++;
        pthread_mutex_unlock(&c->met.lock);
        if (engine_slot_over(o))
            engine_slot_finish(c, s);
    }
}

/* Take a request into slot s: tokenize, check it fits, prefill its prompt (steps of this slot's
 * prompt chunks, each carrying a token of every other active request but those sampling with a
 * seed, whose output must not depend on when prompts arrive: engine_piggyback_slots),
 * draw the first token. Returns 0 when the slot is now active. */
int engine_slot_start(coord *c, int s, coord_request *req, uint64_t queued_us)
{
    engine_slot *sl = &c->eng->slots[s];
    memset(sl, 0, sizeof *sl);
    sl->used = true;
    sl->queued_us = queued_us;
    sl->admitted_us = rt_now_us();
    sl->req = req;
    sl->prm = coord_request_params(req);
    sl->req_id = ++c->next_request_id;
    sl->finish = "length";
    c->eng->prefix[s] = 0;
    sl->spec_len = c->spec_len; /* its own length in batches starts from the group's */
    ctl_reqlen_init(&sl->len, c->spec_len, c->len.lo, c->len.hi, c->len.window);
    char err[512];
    int V = c->model->cfg.vocab;
    char *text = coord_render_prompt(c->tok, sl->prm, err, sizeof err);
    if (!text) { /* the chat template refused the conversation, or cannot be run */
        engine_slot_fail(c, s, strstr(err, "out of memory") ? 500 : 400, err);
        return -1;
    }
    int cap = (int)strlen(text) + 8;
    sl->all =
        text ? malloc(((size_t)cap + (size_t)c->opt.n_ctx + RT_MAX_WIDTH + 8) * sizeof *sl->all)
             : NULL;
    sl->work = malloc((size_t)V * 3 * sizeof(float) + (size_t)V * 8);
    if (!sl->all || !sl->work) {
        free(text);
        engine_slot_fail(c, s, 500, "out of memory");
        return -1;
    }
    int off = tokenizer_add_bos(c->tok) && tokenizer_bos(c->tok) >= 0 ? 1 : 0, needed = 0;
    int n = tokenizer_encode(c->tok, text, strlen(text), true, sl->all + off, cap - off, &needed);
    free(text);
    if (n < 0) {
        engine_slot_fail(c, s, 400, "the prompt could not be tokenized");
        return -1;
    }
    if (off)
        sl->all[0] = tokenizer_bos(c->tok);
    sl->n_all = sl->n_prompt = n + off;
    if (sl->n_all == 0) {
        engine_slot_fail(c, s, 400, "the prompt is empty");
        return -1;
    }
    for (int b = 0; b < sl->prm->n_bias; b++)
        if (sl->prm->bias_id[b] >= V) {
            snprintf(err, sizeof err, "logit_bias names token %d; the model's vocabulary has %d",
                     (int)sl->prm->bias_id[b], V);
            engine_slot_fail(c, s, 400, err);
            return -1;
        }
    if (sl->n_all >= c->opt.n_ctx) {
        snprintf(err, sizeof err,
                 "the prompt is %d tokens; the context holds %d (prompt plus at least "
                 "one generated token)",
                 sl->n_all, c->opt.n_ctx);
        engine_slot_fail(c, s, 413, err);
        return -1;
    }
    sl->max_new = sl->prm->max_tokens < c->opt.n_ctx - sl->n_all ? sl->prm->max_tokens
                                                                 : c->opt.n_ctx - sl->n_all;
    for (int i = 0; i < sl->prm->n_stop; i++)
        if (strlen(sl->prm->stop[i]) > sl->out.max_stop)
            sl->out.max_stop = strlen(sl->prm->stop[i]);
    sl->out.max_stop = sl->out.max_stop ? sl->out.max_stop - 1 : 0;
    sl->greedy = sl->prm->temperature <= 0;
    sampler_init(&sl->smp, (float)sl->prm->temperature, sl->prm->top_k, (float)sl->prm->top_p,
                 sl->prm->has_seed ? (uint64_t)sl->prm->seed : sl->req_id);
    int32_t path[RT_MAX_WIDTH], seq[RT_MAX_WIDTH];
    for (int i = 0; i < RT_MAX_WIDTH; i++)
        path[i] = i;
    int *prefix = c->eng->prefix;
    coord_trace_async(c, "queued", sl->req_id, sl->queued_us, sl->admitted_us);
    uint64_t t_prefill = rt_now_us();
    if (engine_reuse_prefix(c, s, err, sizeof err)) {
        engine_slot_fail(c, s, 503, err);
        return -1;
    }
    sl->cached = prefix[s];
    int w_last = 0; /* the last prompt token's batch row (in the last prompt step) */
    while (prefix[s] < sl->n_all) {
        /* the other requests decode a token each in the same step (engine_piggyback_slots). The
         * prompt keeps at least half the width: with more requests aboard than the other half
         * holds, they take turns (from a start that moves each step), so a long prompt neither
         * starves behind them nor stalls any of them for more than a step or two */
        int pig_all[RT_MAX_SEQ], n_cand = engine_piggyback_slots(c, s, pig_all);
        int left = sl->n_all - prefix[s], W = c->opt.chunk_rows;
        int floor_w = (W + 1) / 2 < left ? (W + 1) / 2 : left;
        int n_pig = n_cand < W - floor_w ? n_cand : W - floor_w;
        int pig[RT_MAX_SEQ];
        for (int k = 0; k < n_pig; k++)
            pig[k] = pig_all[(c->eng->pig_rr + k) % n_cand];
        if (n_cand)
            c->eng->pig_rr = (c->eng->pig_rr + n_pig) % n_cand;
        int room = W - n_pig;
        int w = left < room ? left : room;
        bool last = prefix[s] + w == sl->n_all;
        int32_t tok[RT_MAX_WIDTH], parent[RT_MAX_WIDTH];
        memcpy(tok, sl->all + prefix[s], (size_t)w * sizeof *tok);
        for (int i = 0; i < w; i++) {
            parent[i] = i - 1;
            seq[i] = s;
        }
        for (int k = 0; k < n_pig; k++) {
            const engine_slot *o = &c->eng->slots[pig[k]];
            tok[w + k] = o->all[o->n_all - 1];
            parent[w + k] = -1;
            seq[w + k] = pig[k];
        }
        llama_batch b = {.n = w + n_pig,
                         .tokens = tok,
                         .parent = parent,
                         .seq = seq,
                         .logits_from = last ? w - 1 : w};
        if (engine_step(c, b.n, tok, parent, seq, prefix, b.logits_from, NULL, err, sizeof err) ||
            engine_set_batch(c, &b, prefix, err, sizeof err) ||
            llama_commit(c->kv, path, w, err, sizeof err)) {
            engine_slot_fail(c, s, 503, err);
            return -1;
        }
        engine_piggyback_take(c, pig, n_pig, w, b.logits_from);
        prefix[s] += w;
        w_last = w - 1;
    }
    coord_trace_span(c, (int)getpid(), "coordinator", COORD_TRACE_ENGINE, "prefill", t_prefill,
                     rt_now_us(), "\"request\":%llu,\"tokens\":%d", (unsigned long long)sl->req_id,
                     sl->n_all);
    if (engine_slot_shape(c, sl, c->grp.logits, NULL, NULL, 1)) {
        engine_slot_fail(c, s, 500, "out of memory");
        return -1;
    }
    int32_t next = sl->greedy ? sampler_argmax(c->grp.logits, V)
                              : sampler_sample(&sl->smp, c->grp.logits, V, sl->work);
    sl->all[sl->n_all++] = next;
    sl->generated = 1;
    sl->steps = 1;
    sl->first_us = rt_now_us();
    const float *row = c->grp.logits; /* the last prompt position's row chose the first token */
    engine_slot_emit(c, sl, &next, &row, 1);
    if (sl->stop || sl->generated >= sl->max_new) {
        engine_slot_finish(c, s);
        return -1;
    }
    /* a new text: re-test speculation at once when that is cheap, i.e. every speculator that would
     * be fed switches requests for free (a model drafter would re-read the whole prompt) */
    bool cheap = true;
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        const coord_peer *p = &c->grp.peers[i];
        cheap &= p->role != PEER_SPECULATOR || !p->connected || p->multi || p->benched > 0;
    }
    if (cheap) {
        ctl_guard *g = engine_active(c) > 1 ? &c->guard_batch : &c->guard;
        bool was_on = g->on;
        ctl_guard_reprobe(g);
        if (!was_on && g->on)
            rt_log("coordinator",
                   "guard%s: speculation on to test on a new text (the last judged window: "
                   "speculative %.3f ms/token against plain %.3f ms/token)",
                   g == &c->guard_batch ? " (batches)" : "", g->spec * 1e3, g->base * 1e3);
    }
    if (engine_speculating(c, engine_active(c))) {
        bool focus = engine_focus(c) == sl->req_id;
        engine_publish_hidden(c, s, sl->req_id, sl->n_all, w_last);
        engine_feedback(c, s, sl->req_id, sl->all, sl->n_all, NULL, 0, 0, NULL, !focus);
    }
    return 0;
}
