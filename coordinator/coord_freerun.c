/*
 * coordinator/coord_freerun.c — free-running decode, and the group's own step-time curve.
 *
 * Greedy requests without logprobs skip the verification cycle when no speculator would draft
 * for them (none connected, the guard keeps speculation off, or only ngram, whose prompt lookup
 * runs inside the run): one step of their last tokens is rung with rt_step.run_max, the workers
 * decode on by themselves, and engine_run_take hands the tokens to the requests a few steps'
 * worth at a time (see coord_engine.c's top comment). For prompt lookup in the run the group
 * measures its own step time per width once when the plan gives none (engine_measure_costs).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/engine.h"

/* ===== free-running decode ===== */

/* The cost curve prompt lookup in the free run weighs drafts against: the plan's for the context,
 * else the group's own (engine_measure_costs). Returns its widest width (0: none); cost may be
 * NULL to ask whether there is one. */
static int engine_lookup_costs(coord *c, float *cost)
{
    int w = coord_plan_costs(c, cost);
    if (w >= 2 || c->self_cost_w < 2)
        return w;
    if (cost)
        memcpy(cost, c->self_cost, (size_t)(c->self_cost_w + 1) * sizeof *cost);
    return c->self_cost_w;
}

/* The connected speculators that draft by prompt lookup (ngram); *other gets the rest. */
static int engine_lookup_peers(const coord *c, int *other)
{
    int n = 0;
    *other = 0;
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        const coord_peer *p = &c->grp.peers[i];
        if (p->role == PEER_SPECULATOR && p->connected) {
            n += p->lookup;
            *other += !p->lookup;
        }
    }
    return n;
}

/* Whether prompt lookup may run inside the free run (worker_run): an ngram speculator is
 * connected (what it would draft, the workers find themselves), there is a step-time curve (the
 * plan's for the context, or the group's own: the workers weigh each draft against it), and
 * --lookup-run is not off. With
 * `only`, every connected speculator must be ngram: then the free run replaces the verification
 * cycle; otherwise it only drafts while the guard keeps the other speculators off. */
static bool engine_lookup_free(coord *c, bool only)
{
    int other, n = engine_lookup_peers(c, &other);
    return n > 0 && !(only && other) && !c->opt.no_lookup_run && engine_lookup_costs(c, NULL) >= 2;
}

/* Whether the group should measure its own step-time curve now: prompt lookup could run in the
 * free run but for a curve (the plan has none for this context, or there is no plan), and it
 * has not been measured yet. */
bool engine_lookup_needs_costs(coord *c)
{
    int other;
    return !c->opt.no_lookup_run && !c->opt.no_free_run && !c->self_cost_tried && c->opt.max_width >= 2 &&
           coord_plan_costs(c, NULL) < 2 && engine_lookup_peers(c, &other) > 0;
}

/* Measure the group's step time at widths 1, 2, 4, 8, 16 (up to --max-width): ENGINE_COST_REPS
 * rounds, each width in turn within a round (so a change of the machine's speed falls on all of
 * them), after one round of warm-up; chains of slot s's last token on its committed prefix,
 * nothing committed (the tree area is the next step's to overwrite). The medians become the cost
 * curve (ctl_cost_curve). A few dozen steps, once: what a plan's curve gives without a profile. */
void engine_measure_costs(coord *c, int s)
{
    if (c->opt.n_ctx - c->eng->prefix[s] < 16) /* no room for the widest step here: a later request */
        return;
    c->self_cost_tried = true;
    const engine_slot *sl = &c->eng->slots[s];
    int ws[5], n_w = 0;
    for (int w = 1; w <= 16 && w <= c->opt.max_width; w *= 2)
        ws[n_w++] = w;
    double t[5][ENGINE_COST_REPS], med[5];
    int32_t tok[16], parent[16], seq[16];
    for (int i = 0; i < 16; i++) {
        tok[i] = sl->all[sl->n_all - 1];
        parent[i] = i - 1;
        seq[i] = s;
    }
    char err[512];
    uint64_t t0 = rt_now_us();
    for (int r = -1; r < ENGINE_COST_REPS; r++)
        for (int i = 0; i < n_w; i++) {
            uint64_t a = rt_now_us();
            if (engine_step(c, ws[i], tok, parent, seq, c->eng->prefix, 0, NULL, err, sizeof err)) {
                rt_log("coordinator", "measuring the step-time curve failed: %s", err);
                return;
            }
            if (r >= 0)
                t[i][r] = (double)(rt_now_us() - a);
        }
    for (int i = 0; i < n_w; i++) {
        for (int a = 1; a < ENGINE_COST_REPS; a++) /* insertion sort: a handful of values */
            for (int b = a; b > 0 && t[i][b] < t[i][b - 1]; b--) {
                double x = t[i][b];
                t[i][b] = t[i][b - 1];
                t[i][b - 1] = x;
            }
        med[i] = t[i][ENGINE_COST_REPS / 2];
    }
    c->self_cost_w = ctl_cost_curve(ws, med, n_w, c->opt.max_width, c->self_cost);
    char line[256];
    size_t at = 0;
    for (int i = 0; i < n_w && at < sizeof line; i++)
        at += (size_t)snprintf(line + at, sizeof line - at, " %.2f", med[i] / 1e3);
    rt_log("coordinator",
           "prompt lookup: no plan curve, the group's step times measured in %.0f ms at context "
           "%d (ms at widths 1..%d):%s",
           (double)(rt_now_us() - t0) / 1e3, c->eng->prefix[s], ws[n_w - 1], line);
}

/* Whether slot s may decode free-running among n_active requests: greedy, without logprobs or
 * shaped rows (the workers choose by argmax and nobody reads the logits), with no speculator
 * connected, or
 * speculation switched off (by the guard or width 1: the speculators sit idle, unfed), or only
 * prompt lookup to do (engine_lookup_free), and at least two tokens to go. */
bool engine_can_run_free(coord *c, int s, int n_active)
{
    const engine_slot *sl = &c->eng->slots[s];
    if (!sl->greedy || sl->prm->logprobs || engine_slot_shaped(sl) || c->opt.no_free_run)
        return false;
    if (coord_group_count(c, PEER_SPECULATOR, true) > 0 && engine_speculating(c, n_active) &&
        !engine_lookup_free(c, true))
        return false;
    return engine_slot_room(c, s) >= 2;
}

/* engine_run's taker: each request's new tokens join it as if each had been a step's bonus token
 * (its predecessor's row committed); the run ends at any request's end (end of text, a stop
 * string, its length, a client gone) or when a queued request could share the steps. A request
 * that ended takes none of the steps after its end; the others take every step made. */
static bool engine_run_take(coord *c, engine_run *r, int ready)
{
    const rt_step *st = c->grp.step;
    int took = 0;
    bool end = false;
    uint64_t hist[RT_MAX_WIDTH + 1] = {0};
    for (int i = 0; i < r->n; i++) {
        int s = r->slots[i];
        engine_slot *sl = &c->eng->slots[s];
        for (int k0 = r->taken; k0 < ready && !sl->stop && sl->generated < sl->max_new; k0++) {
            int from = k0 ? st->run_upto[k0 - 1][i] : 0, k = st->run_upto[k0][i] - from;
            int room = sl->max_new - sl->generated;
            k = k < room ? k : room;
            if (k <= 0)
                break;
            int32_t *dst = sl->all + sl->n_all;
            memcpy(dst, st->run_stream[i] + from, (size_t)k * sizeof *dst);
            sl->n_all += k;
            c->eng->prefix[s] += k;
            sl->steps++;
            sl->verify_steps++;
            sl->accepted_total += k - 1;
            sl->last_added = k;
            hist[k - 1]++;
            took += k;
            if (k > 1)
                engine_slot_add_kind(sl, "ngram");
            sl->generated += engine_slot_emit(c, sl, dst, NULL, k);
        }
        end |= engine_slot_over(sl);
    }
    if (ready > r->taken) {
        pthread_mutex_lock(&c->met.lock);
        for (int a = 0; a <= RT_MAX_WIDTH; a++)
            c->met.accept_hist[a] += hist[a];
        c->met.batch_hist[r->n] += (uint64_t)(ready - r->taken); /* n <= RT_MAX_SEQ */
        c->met.steps += (uint64_t)(ready - r->taken);
        c->met.free_tokens += (uint64_t)took;
        coord_metrics_cycle_locked(c, r->n, r->n, took, ready - r->taken, 0);
        pthread_mutex_unlock(&c->met.lock);
    }
    r->taken = ready;
    if (end)
        return true;
    pthread_mutex_lock(&c->qlock);
    bool queued = c->qlen > 0;
    pthread_mutex_unlock(&c->qlock);
    return (queued && engine_active(c) < c->opt.n_seq) ||
           coord_group_count(c, PEER_SPECULATOR, true) != r->speculators;
}

/* The free run's rows in the arena: what each may make and, with prompt lookup, its context's
 * latest tokens (the last one, the root, goes as the step's token), the plan's cost curve and the
 * acceptance estimates carried from the last run. */
static void engine_run_lookup(coord *c, const int *slots, int n, bool lookup)
{
    rt_step *st = c->grp.step;
    st->run_draft = 0;
    if (lookup) {
        st->run_width = (uint32_t)engine_lookup_costs(c, st->run_cost);
        st->run_draft = (uint32_t)c->opt.max_draft;
        st->run_order = ENGINE_LOOKUP_ORDER;
        st->run_lookup = c->lookup;
        st->run_lookup_out = c->lookup;
    }
    for (int i = 0; i < n; i++) {
        const engine_slot *sl = &c->eng->slots[slots[i]];
        int room = engine_slot_room(c, slots[i]);
        st->run_room[i] = (uint32_t)(room < RT_RUN_STREAM ? room : RT_RUN_STREAM);
        int h = lookup ? sl->n_all - 1 : 0;
        h = h < RT_LOOKUP_HIST ? h : RT_LOOKUP_HIST;
        st->run_hist_len[i] = (uint32_t)h;
        memcpy(st->run_hist[i], sl->all + sl->n_all - 1 - h, (size_t)h * sizeof(int32_t));
    }
}

/* Decode the n requests of slots[] free-running (engine_can_run_free): one step of their last
 * tokens rung with rt_step.run_max, the workers going on by themselves, the tokens taken a few
 * steps' worth at a time. The handoff of every step through the coordinator (wake it, verify,
 * commit, ring) is what a group costs over a single process; here it overlaps the workers' next
 * steps instead. */
void engine_run_free(coord *c, const int *slots, int n)
{
    int *prefix = c->eng->prefix;
    int room = RT_RUN_MAX;
    for (int i = 0; i < n; i++) {
        int r = engine_slot_room(c, slots[i]);
        room = r < room ? r : room;
    }
    /* with speculators switched off by the guard, short runs: the guard counts their steps as
     * plain cycles and switches speculation on again for its probe */
    int speculators = coord_group_count(c, PEER_SPECULATOR, true);
    bool lookup = speculators && engine_lookup_free(c, false);
    bool guarded = speculators && !engine_lookup_free(c, true);
    int cap = RT_RUN_MAX;
    if (guarded && c->opt.guard_enabled && c->width > 1) { /* up to the guard's next probe */
        int left = ctl_guard_plain_left(n > 1 ? &c->guard_batch : &c->guard);
        cap = left < 1 ? 1 : left < RT_RUN_MAX ? left : RT_RUN_MAX;
    } else if (guarded) {
        cap = ENGINE_FREE_GUARDED;
    }
    if (room > cap)
        room = cap;
    engine_run_lookup(c, slots, n, lookup);
    /* look about every four steps: streamed text comes in small pieces, a stop string is seen a
     * few tokens late at most, and the coordinator wakes rarely enough to cost nothing */
    int period = (int)(4 * c->step_ema_us / 1000);
    const int32_t *eog_ids;
    int n_eog = tokenizer_eog(c->tok, &eog_ids); /* before the initializer reads eog_ids */
    engine_run r = {.max = (uint32_t)room,
                    .n_eog = n_eog,
                    .eog = eog_ids,
                    .period_ms = period < 2 ? 2 : period > 20 ? 20 : period,
                    .n = n,
                    .speculators = speculators,
                    .take = engine_run_take};
    int32_t tok[RT_MAX_SEQ], parent[RT_MAX_SEQ], seq[RT_MAX_SEQ];
    for (int i = 0; i < n; i++) {
        const engine_slot *sl = &c->eng->slots[slots[i]];
        r.slots[i] = seq[i] = slots[i];
        tok[i] = sl->all[sl->n_all - 1];
        parent[i] = -1;
    }
    char err[512];
    uint64_t t0 = rt_now_us();
    if (engine_step(c, n, tok, parent, seq, prefix, 0, &r, err, sizeof err)) {
        for (int i = 0; i < n; i++)
            engine_slot_fail(c, slots[i], 503, err);
        return;
    }
    /* the workers committed the rows: the coordinator's view only moves its prefixes */
    for (int i = 0; i < n; i++)
        llama_ctx_set_seq_prefix_len(c->kv, slots[i], prefix[slots[i]]);
    uint64_t t1 = rt_now_us();
    if (r.taken > 0)
        c->step_ema_us = engine_ema(c->step_ema_us, c->step_ema_us > 0,
                                    (double)(t1 - t0) / r.taken);
    if (lookup)
        c->lookup = c->grp.step->run_lookup_out;
    long made = 0; /* tokens the steps made, drafts accepted included */
    for (int i = 0; i < n && r.taken > 0; i++)
        made += c->grp.step->run_upto[r.taken - 1][i];
    if (r.taken > 0 && guarded && c->opt.guard_enabled && c->width > 1) {
        ctl_guard *g = n > 1 ? &c->guard_batch : &c->guard;
        for (long i = 0; i < r.taken; i++) /* each step a plain cycle for the guard */
            ctl_guard_sample(g, false, (t1 - t0) / 1e6 / r.taken,
                             (int)(made * (i + 1) / r.taken - made * i / r.taken));
    }
    coord_trace_span(c, (int)getpid(), "coordinator", COORD_TRACE_ENGINE, "cycle", t0, t1,
                     "\"requests\":%d,\"nodes\":%d,\"tokens\":%ld,\"plain\":1,\"free\":1", n,
                     n, made);
    for (int i = 0; i < n; i++) {
        const engine_slot *sl = &c->eng->slots[slots[i]];
        if (sl->used && engine_slot_over(sl))
            engine_slot_finish(c, slots[i]);
    }
}
