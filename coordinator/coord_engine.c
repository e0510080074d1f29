/*
 * coordinator/coord_engine.c — requests through the verification loop.
 *
 * Up to --max-batch requests share each target step, each in its own KV sequence slot. For a
 * request: render and tokenize the prompt, refuse it if it cannot fit the context (413), prefill
 * it through the workers in chains of up to max_width (each step also a plain step for every other
 * active request but those sampling with a seed: engine_piggyback_slots, coord_slots.c), and take
 * the first token from the last prompt
 * position. Then, step after step, for every active slot:
 *   0. the plan's bucket for the context (width, length) and the guard decide whether this cycle
 *      speculates at all (policy/control.h): when not, W = 1 and the speculators sit idle;
 *   1. drafts: model speculators follow the oldest request (they keep one request's state), ngram
 *      follows every request; each has been told its committed context (Feedback; not while it
 *      is benched because its drafting costs more than it brings) and answers with a draft in its
 *      arena ring (DraftReady, possibly empty). The step waits for a speculator only while that
 *      pays: a draft
 *      that brings a accepted tokens saves a target steps, so with T the measured step time it is
 *      waited on up to a * T, and not at all when its measured reply latency says it will come
 *      later (averages per speculator; see engine_draft_budget_us). An instant answer costs no
 *      wait; --draft-wait-ms caps every wait, --draft-wait fixed waits up to it for everyone, and
 *      so does a request that samples with a seed (its output depends on the trees verified).
 *      Each slot's drafts are merged; the batch's width (each request's width, up to a step's
 *      rows) is shared out by what was drafted and each slot's trie voted into one tree within
 *      its share;
 *   2. verify: all slots' trees in one target step through the workers (the arena doorbell; a
 *      lost worker makes the step fail and be re-run once the worker is back: inputs and the
 *      committed KV are in the arena, untouched);
 *   3. accept: greedy — the longest root-to-leaf path whose tokens equal the target's argmax,
 *      plus the argmax after it as the correction/bonus token; with temperature > 0, multi-step
 *      speculative sampling over the tree (coordinator/verify.c);
 *   4. commit the accepted path's K/V rows into the slot's prefix, emit the new tokens (with, for
 *      a request that asks, each token's logprobs: the log-softmax of the row that chose it), tell
 *      the speculators (Feedback with the appended tokens) and score their drafts (acceptance
 *      rates, vote weights, the wait's averages); the cycle's whole time feeds the guard and the
 *      adaptive length.
 * Because a tree's logits are bit-identical to sequential decoding along each path (see
 * model/llama.c), greedy output equals `orochi run --temp 0` token for token.
 * Stop conditions: the tokenizer's end-of-generation tokens (tokenizer_eog), max_tokens (or the
 * context end), stop strings (text is held back until it cannot be the start of a stop string).
 *
 * Free run: greedy requests (no logprobs; no speculator connected, or the guard keeps them off,
 * then in runs up to the guard's next probe whose steps count as plain cycles, or only ngram
 * connected: prompt lookup drafted in the run) skip the cycle, one alone or a whole batch. One
 * step of their last tokens (a row each) is rung with rt_step.run_max and the workers decode on
 * by themselves (each row's argmax, merged across the parts at their barrier, is its request's
 * next token; with prompt lookup, after the drafts of its chain that the argmaxes confirm; each
 * worker commits its own K/V heads), while the coordinator
 * sleeps a few steps' time, takes the tokens made so far and emits them. The run ends at any
 * request's eos, length, stop string or gone client (that request takes nothing past its end: the
 * prefix sent with the next step says where its sequence ends; the others take every step), or
 * when a queued request could share the steps. What this saves is the handoff of every step
 * (wake the coordinator, verify, commit, ring the workers again): 100-150 us a step here, 5-7%
 * of a default-model step (docs/performance.md, "The group's handoff").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/engine.h"
#include "coordinator/verify.h"

/* ===== the queue (HTTP threads -> main loop) ===== */

int coord_engine_submit(void *ctx, coord_request *req)
{
    coord *c = ctx;
    pthread_mutex_lock(&c->qlock);
    if (c->qlen >= (c->opt.max_queue > 0 ? c->opt.max_queue : COORD_QUEUE)) {
        int waiting = c->qlen;
        pthread_mutex_unlock(&c->qlock);
        char msg[160];
        snprintf(msg, sizeof msg,
                 "too many requests: %d are already waiting (--max-queue); retry shortly", waiting);
        coord_request_fail(req, 429, msg);
        return -1;
    }
    c->queue[(c->qhead + c->qlen) % COORD_QUEUE] = coord_request_ref(req);
    c->queued_us[(c->qhead + c->qlen) % COORD_QUEUE] = rt_now_us();
    c->qlen++;
    pthread_mutex_unlock(&c->qlock);
    return 0;
}

static coord_request *engine_pop(coord *c, uint64_t *queued_us)
{
    pthread_mutex_lock(&c->qlock);
    coord_request *r = NULL;
    if (c->qlen) {
        r = c->queue[c->qhead];
        *queued_us = c->queued_us[c->qhead];
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
    if (ready == c->opt.n_workers)
        return 1;
    snprintf(msg, len, "%d of %d workers connected", ready, c->opt.n_workers);
    return 0;
}

/* A request's own speculation length in batch cycles (ctl_reqlen): after a cycle in which it had a
 * draft, from how many of its drafted tokens were accepted; the group's length (ctl_length, on
 * measured cost per token) learns from single-request cycles. */
static void engine_slot_len(engine_slot *sl)
{
    if (sl->used && sl->tree.n > 1 && sl->last_added >= 1)
        sl->spec_len = ctl_reqlen_sample(&sl->len, sl->last_added - 1);
}

/* One verification step for every active slot: each gets its share of the width, the drafts for
 * its context merged and voted into a tree, all trees in one target step; then per slot: verify,
 * commit, emit, feed back. */
static void engine_step_all(coord *c)
{
    struct coord_engine_state *e = c->eng;
    int active[RT_MAX_SEQ], n_act = 0;
    for (int s = 0; s < c->opt.n_seq; s++)
        if (e->slots[s].used)
            active[n_act++] = s;
    if (!n_act)
        return;
    coord_plan_apply(c, e->prefix[active[0]]);
    if (engine_lookup_needs_costs(c))
        engine_measure_costs(c, active[0]);
    bool free = true;
    for (int k = 0; k < n_act && free; k++)
        free = engine_can_run_free(c, active[k], n_act);
    if (free) {
        engine_run_free(c, active, n_act);
        return;
    }
    int V = c->model->cfg.vocab;
    char err[512];
    uint64_t t_cycle = rt_now_us(), waited = 0;
    coord_plan_apply(c, e->prefix[active[0]]);
    bool speculating = engine_speculating(c, n_act);
    /* drafts for every active request first; then the width is shared out by what was drafted:
     * each request gets its root, then one node at a time goes round to those whose merged drafts
     * have more (starting where the last step stopped), so a share nobody can use goes back */
    /* 10 KiB each: off the stack. Plain statics: the engine loop is one thread, and per-thread
     * copies cost every HTTP connection thread their size in zeroed TLS */
    static coord_tree merged[RT_MAX_SEQ];
    int32_t tokens[RT_MAX_WIDTH], parent[RT_MAX_WIDTH], seq[RT_MAX_WIDTH];
    /* the batch's width: each request's (the plan's or --max-width), up to a step's rows — a
     * request in a batch has the room for its tree it would have alone (a fixed total would leave
     * none once the requests fill it: at --max-width 8 and 8 requests, no drafted node at all) */
    int width = n_act * c->width, n = 0;
    width = width < c->opt.step_rows ? width : c->opt.step_rows;
    width = width < RT_MAX_WIDTH ? width : RT_MAX_WIDTH;
    int budget[RT_MAX_SEQ], cap[RT_MAX_SEQ];
    for (int k = 0; k < n_act; k++) {
        int s = active[k];
        engine_slot *sl = &e->slots[s];
        uint64_t w0 = rt_now_us();
        if (speculating)
            engine_gather_drafts(c, s, sl->req_id, sl->all, sl->n_all, engine_slot_seeded(c, s));
        else
            for (int i = 0; i < COORD_MAX_PEERS; i++)
                c->grp.peers[i].slot_draft[s].n = 0;
        uint64_t w1 = rt_now_us();
        waited += w1 - w0;
        if (speculating)
            coord_trace_span(c, (int)getpid(), "coordinator", COORD_TRACE_ENGINE, "draft wait", w0,
                             w1, "\"slot\":%d", s);
        engine_merge_drafts(c, s, sl->all[sl->n_all - 1], &merged[k]);
        const ctl_template *shape = coord_plan_tree(c);
        if (shape && !engine_slot_seeded(c, s)) { /* the plan's tree for this context bucket */
            static coord_tree fitted;
            ctl_tree_fit(&merged[k], shape, &fitted);
            merged[k] = fitted;
        }
        if (engine_slot_constrain_tree(c, sl, &merged[k], err, sizeof err)) {
            engine_slot_fail(c, s, 500, err);
            return;
        }
        int room = engine_slot_room(c, s);
        cap[k] = merged[k].n < room ? merged[k].n : room;
        if (cap[k] < 1 || (!speculating && (!sl->prm->grammar || c->opt.no_grammar_drafts)))
            cap[k] = 1;
        budget[k] = 1;
    }
    int left = width - n_act;
    for (int j = 0; j < n_act; j++) { /* seeded requests: the even share, whatever others drafted */
        int k = (j + e->rr) % n_act;
        if (engine_slot_seeded(c, active[k])) {
            int share = width / n_act + (j < width % n_act ? 1 : 0);
            budget[k] = share < cap[k] ? share : cap[k];
            if (budget[k] < 1)
                budget[k] = 1;
            left -= budget[k] - 1;
        }
    }
    for (int gave = 1; left > 0 && gave;) {
        gave = 0;
        for (int j = 0; j < n_act && left > 0; j++) {
            int k = (j + e->rr) % n_act;
            if (!engine_slot_seeded(c, active[k]) && budget[k] < cap[k]) {
                budget[k]++;
                left--;
                gave = 1;
            }
        }
    }
    for (int k = 0; k < n_act; k++) {
        engine_slot *sl = &e->slots[active[k]];
        ctl_tree_vote(&merged[k], c->opt.vote, budget[k], &sl->tree);
        sl->off = n;
        for (int i = 0; i < sl->tree.n; i++, n++) {
            tokens[n] = sl->tree.tokens[i];
            parent[n] = sl->tree.parent[i] < 0 ? -1 : sl->tree.parent[i] + sl->off;
            seq[n] = active[k];
        }
    }
    e->rr++;
    llama_batch b = {.n = n, .tokens = tokens, .parent = parent, .seq = seq, .logits_from = 0};
    uint64_t t_step = rt_now_us();
    if (engine_step(c, n, tokens, parent, seq, e->prefix, 0, NULL, err, sizeof err) ||
        engine_set_batch(c, &b, e->prefix, err, sizeof err)) {
        for (int k = 0; k < n_act; k++)
            engine_slot_fail(c, active[k], 503, err);
        return;
    }
    uint64_t t_step_done = rt_now_us();
    int yielded = 0;
    pthread_mutex_lock(&c->met.lock);
    c->met.batch_hist[n_act]++;
    pthread_mutex_unlock(&c->met.lock);
    for (int k = 0; k < n_act; k++) {
        int s = active[k];
        engine_slot *sl = &e->slots[s];
        const coord_tree *t = &sl->tree;
        verify_tree vt = {.n = t->n, .tokens = t->tokens, .parent = t->parent};
        verify_result vr;
        float *lg = c->grp.logits + (size_t)sl->off * V;
        if (engine_slot_shape(c, sl, lg, t->tokens, t->parent, t->n)) {
            engine_slot_fail(c, s, 500, "out of memory");
            continue;
        }
        if (sl->greedy) {
            verify_greedy(&vt, lg, V, &vr);
        } else if (verify_sample(&vt, lg, V, &sl->smp, sl->work, &vr)) {
            engine_slot_fail(c, s, 500, "internal error: the verification tree is malformed");
            continue;
        }
        int32_t path[RT_MAX_WIDTH];
        for (int i = 0; i < vr.n_path; i++)
            path[i] = vr.path[i] + sl->off;
        if (llama_commit(c->kv, path, vr.n_path, err, sizeof err)) {
            engine_slot_fail(c, s, 500, err);
            continue;
        }
        e->prefix[s] += vr.n_path;
        sl->last_row = sl->off + vr.path[vr.n_path - 1];
        int a = vr.n_path - 1, room = sl->max_new - sl->generated;
        int32_t added[RT_MAX_WIDTH + 1];
        for (int i = 1; i < vr.n_path; i++)
            added[i - 1] = t->tokens[vr.path[i]];
        added[a] = vr.next;
        int n_add = a + 1 < room ? a + 1 : room;
        memcpy(sl->all + sl->n_all, added, (size_t)n_add * sizeof *added);
        sl->n_all += n_add;
        sl->last_added = n_add;
        sl->steps++;
        sl->verify_steps++;
        sl->accepted_total += a;
        yielded += a + 1;
        for (int i = 0; i < COORD_MAX_PEERS; i++) {
            coord_peer *p = &c->grp.peers[i];
            const arena_draft *d = &p->slot_draft[s];
            if (p->role != PEER_SPECULATOR || !d->n)
                continue;
            int depth, matched;
            ctl_tree_match(d, added, a, &depth, &matched);
            bool verified = false;
            for (int j = 1; j < t->n; j++)
                verified |= (t->owners[j] >> p->index) & 1u;
            if (verified) /* ACR credits the voted drafts only (Minions) */
                ctl_acr_update(&p->acr, &c->opt.acr, depth, matched);
            p->accept_ema = engine_ema(p->accept_ema, p->accept_n++, matched);
            p->unscored = 0;
            p->drafted += (uint64_t)depth;
            p->accepted += (uint64_t)matched;
            if (verified && p->kind[0])
                engine_slot_add_kind(sl, p->kind);
        }
        pthread_mutex_lock(&c->met.lock);
        c->met.accept_hist[a < RT_MAX_WIDTH ? a : RT_MAX_WIDTH]++;
        pthread_mutex_unlock(&c->met.lock);
        const float *rows[RT_MAX_WIDTH + 1]; /* the row whose distribution chose added[j] */
        if (sl->prm->logprobs)
            for (int j = 0; j < n_add; j++)
                rows[j] = lg + (size_t)vr.path[j] * V;
        sl->generated += engine_slot_emit(c, sl, added, sl->prm->logprobs ? rows : NULL, n_add);
        if (engine_slot_over(sl))
            engine_slot_finish(c, s);
    }
    /* the controllers learn from single-request cycles (a batch's cost per token says more about
     * the batch than about speculation): the whole cycle, drafting and waiting included */
    uint64_t t_verified = rt_now_us();
    double cycle = (t_verified - t_cycle) / 1e6;
    pthread_mutex_lock(&c->met.lock); /* the timeline's record of the cycle */
    coord_metrics_cycle_locked(c, n_act, n, yielded, 1, cycle * 1e3);
    pthread_mutex_unlock(&c->met.lock);
    coord_trace_span(c, (int)getpid(), "coordinator", COORD_TRACE_ENGINE, "verify", t_step_done,
                     t_verified, "\"accepted\":%d", yielded - n_act);
    if (c->opt.trace)
        rt_log("coordinator",
               "cycle %.1f ms: draft wait %.1f ms, step %.1f ms, %d nodes, %d tokens for %d "
               "requests%s",
               cycle * 1e3, waited / 1e3, (t_step_done - t_step) / 1e3, n, yielded, n_act,
               speculating ? "" : " (plain)");
    if (yielded && c->width > 1) {
        if (c->opt.adaptive && speculating && n_act == 1)
            c->spec_len = ctl_length_sample(&c->len, cycle, yielded);
        if (c->opt.adaptive && speculating && n_act > 1)
            for (int k = 0; k < n_act; k++)
                engine_slot_len(&e->slots[active[k]]);
        if (c->opt.guard_enabled) {
            ctl_guard *g = n_act > 1 ? &c->guard_batch : &c->guard;
            bool was_on = g->on, on = ctl_guard_sample(g, speculating, cycle, yielded);
            if (was_on != on) /* every switch with the figures it was made on */
                rt_log("coordinator",
                       "guard%s: speculation %s: speculative %.3f ms/token at %.2f tokens a "
                       "step against plain %.3f ms/token (%s), speculation length %d; %s",
                       g == &c->guard_batch ? " (batches)" : "", on ? "on to test" : "off",
                       g->spec * 1e3, g->per_step, g->base * 1e3,
                       on                                       ? "the last judged window"
                       : g->spec > CTL_GUARD_HOPELESS * g->base ? "a clear loss"
                                                                : "not cheaper",
                       c->spec_len,
                       on ? "judged after the warm-up cycles" : "plain steps until the next probe");
            if (was_on && !on && n_act == 1 && c->opt.adaptive) {
                /* speculation lost at this length: probe again from the shortest drafts (the
                 * cheapest to test) and let the length climb only where that pays */
                ctl_length_init(&c->len, 1, c->len.lo, c->len.hi, c->len.window, c->len.stale);
                c->spec_len = c->len.len;
            }
        }
    }
    uint64_t focus = engine_focus(c);
    bool feed = engine_speculating(c, n_act);
    for (int k = 0; k < n_act && feed; k++) {
        int s = active[k];
        engine_slot *sl = &e->slots[s];
        if (!sl->used)
            continue;
        int a_step = sl->last_added - 1; /* accepted drafts: all appended tokens but the last */
        engine_publish_hidden(c, s, sl->req_id, sl->n_all, sl->last_row);
        engine_feedback(c, s, sl->req_id, sl->all, sl->n_all, sl->all + sl->n_all - sl->last_added,
                        sl->last_added, a_step, &sl->tree, sl->req_id != focus);
    }
    /* what a token costs without drafts: this whole cycle but its wait for drafts */
    uint64_t t_end = rt_now_us();
    c->step_ema_us =
        engine_ema(c->step_ema_us, c->step_ema_us > 0, (double)(t_end - t_cycle - waited));
    coord_trace_span(c, (int)getpid(), "coordinator", COORD_TRACE_ENGINE, "cycle", t_cycle, t_end,
                     "\"requests\":%d,\"nodes\":%d,\"tokens\":%d,\"plain\":%d", n_act, n, yielded,
                     !speculating);
}

int coord_engine_init(coord *c)
{
    /* what the group and the operator code report upward (coord.h, coord_listeners) */
    c->on = (coord_listeners){.step_done = coord_engine_on_step_done,
                              .draft_ready = coord_engine_on_draft_ready,
                              .worker_lost = coord_engine_on_worker_lost,
                              .peer_exit = coord_ops_on_exit};
    c->eng = calloc(1, sizeof *c->eng);
    coord_metrics_controllers(c);
    return c->eng ? 0 : -1;
}

void coord_engine_fini(coord *c)
{
    if (!c->eng)
        return;
    for (int s = 0; s < RT_MAX_SEQ; s++)
        if (c->eng->slots[s].used)
            engine_slot_fail(c, s, 503, "the coordinator is shutting down");
    for (int s = 0; s < RT_MAX_SEQ; s++)
        free(c->eng->kept[s]);
    grammar_vocab_free(&c->eng->gvocab);
    free(c->eng);
    c->eng = NULL;
}

bool coord_engine_busy(coord *c)
{
    if (!c->eng)
        return false;
    if (engine_active(c))
        return true;
    pthread_mutex_lock(&c->qlock);
    bool queued = c->qlen > 0;
    pthread_mutex_unlock(&c->qlock);
    return queued;
}

/* --kv-release: the K/V pages of slots idle that long go back to the system (llama_kv_release),
 * and with them the rows a later prompt could have started from. Groups of CPU workers only: a
 * GPU worker's registered arena is pinned, and its mirror keeps rows of its own. */
static void engine_release_idle(coord *c)
{
    static uint64_t last_us;
    uint64_t now = rt_now_us(), after = (uint64_t)c->opt.kv_release_s * 1000000u;
    if (c->opt.kv_release_s <= 0 || !c->kv_release_ok || now - last_us < 1000000u)
        return; /* a look a second: at most a line a second in the log */
    last_us = now;
    uint64_t held = 0;
    int n = 0;
    for (int s = 0; s < c->opt.n_seq; s++) {
        struct coord_engine_state *e = c->eng;
        if (e->slots[s].used || e->held[s] <= 0 || now - e->idle_since[s] < after ||
            engine_slot_lends(c, s)) /* its rows are an active request's too */
            continue;
        for (int b = 0; b < c->opt.n_seq; b++) { /* idle borrowers forget what they kept */
            if (engine_lent_by(c, b, s)) {
                llama_kv_unshare(c->kv, b, 0, false);
                e->n_kept[b] = 0;
            }
        }
        held += coord_kv_bytes(c, e->held[s]);
        llama_kv_release(c->kv, s, 0);
        free(e->kept[s]);
        e->kept[s] = NULL;
        e->n_kept[s] = 0;
        e->held[s] = 0;
        e->prefix[s] = 0;
        n++;
    }
    if (n)
        rt_log("coordinator", "gave back the K/V pages of %d slot%s idle for %d s (%.1f MB written)",
               n, n == 1 ? "" : "s", c->opt.kv_release_s, held / 1e6);
}

void coord_engine_tick(coord *c)
{
    /* admit queued requests into free slots (FIFO; engine_free_slot) */
    for (;;) {
        int s = engine_free_slot(c);
        if (s < 0)
            break;
        uint64_t queued_us = 0;
        coord_request *req = engine_pop(c, &queued_us);
        if (!req)
            break;
        pthread_mutex_lock(&c->met.lock);
        c->met.requests++;
        pthread_mutex_unlock(&c->met.lock);
        if (coord_request_cancelled(req)) {
            coord_request_fail(req, 499, "the client went away");
            coord_request_unref(&req);
            continue;
        }
        engine_slot_start(c, s, req, queued_us);
    }
    engine_step_all(c);
    engine_release_idle(c);
    coord_metrics_controllers(c);
}
