/*
 * coordinator/coord_drafts.c — the speculators' side of a verification cycle.
 *
 * Feedback tells the speculators a request's committed context (ngram, replay, medusa and a model
 * speculator that says every_request in its DraftReady are fed every active request, another
 * the oldest; a speculator whose drafting costs more than it
 * brings is benched and fed again now and then to re-measure it). DraftReady marks a draft in the
 * speculator's arena ring. engine_gather_drafts waits for the fed speculators' answers, each only
 * as long as its draft pays (engine_draft_budget_us: a draft bringing a accepted tokens is waited
 * on up to a step times, not at all when its measured reply latency says it will come later), and
 * engine_merge_drafts merges a slot's drafts into one trie, weighted by each speculator's vote.
 */
#include <stdio.h>
#include <string.h>

#include "coordinator/engine.h"

/* Whether p was fed this context of the request in sequence slot `slot` (a benched speculator
 * was not, and has no draft coming). */
static bool engine_fed(const coord_peer *p, int slot, uint64_t req_id, int n_all)
{
    return p->slot_fed_req[slot] == req_id && p->slot_fed_ctx[slot] == (uint64_t)n_all;
}

void coord_engine_on_draft_ready(coord *c, coord_peer *p, const Orochi__DraftReady *r)
{
    if (r->every_request && !p->multi) {
        p->multi = true;
        rt_log("coordinator", "%s drafts for every request (batched): fed every active request",
               p->name);
    }
    if (r->draft_end_us > r->draft_start_us && r->draft_start_us) {
        double us = (double)(r->draft_end_us - r->draft_start_us);
        p->draft_work_ema_us = engine_ema(p->draft_work_ema_us, p->draft_work_n++, us);
        if (coord_tracing(c)) {
            if (r->feedback_us && r->feedback_end_us >= r->feedback_us)
                coord_trace_span(c, (int)p->pid, p->name, (int)p->pid, "feedback", r->feedback_us,
                                 r->feedback_end_us, "\"ctx\":%llu",
                                 (unsigned long long)r->ctx_len);
            coord_trace_span(c, (int)p->pid, p->name, (int)p->pid, "draft", r->draft_start_us,
                             r->draft_end_us, "\"tokens\":%u,\"ctx\":%llu", r->n_tokens,
                             (unsigned long long)r->ctx_len);
        }
    }
    /* its reply latency, timed whether or not a step still waits for it */
    if (!p->reply_timed && p->fed_us && r->request_id == p->fed_req && r->ctx_len == p->fed_ctx) {
        double us = (double)(rt_now_us() - p->fed_us);
        p->reply_ema_us = engine_ema(p->reply_ema_us, p->reply_n++, us);
        if (!p->fed_reset) /* re-reading a whole context is no measure of its drafting */
            p->draft_ema_us = engine_ema(p->draft_ema_us, p->draft_n++, us);
        p->reply_timed = true;
    }
    int s = engine_slot_of(c, r->request_id); /* the sequence slot of the request it drafted for */
    if (s >= 0) {
        p->draft_ready[s].req = r->request_id;
        p->draft_ready[s].ctx = r->ctx_len;
        p->draft_ready[s].ring_slot = r->slot;
        p->draft_ready[s].n = r->n_tokens;
        p->draft_ready[s].fresh = true;
    }
}

/* Whether to leave p unfed this time: its drafting takes longer (its reply latency to Feedbacks
 * that were not resets) than the tokens it brings are worth (its accepted tokens per step x the
 * measured cost of a cycle). Drafting runs on the cores the target needs, so such a drafter makes
 * every step slower even when the coordinator does not wait for it. After ENGINE_BENCH_PROBE
 * skipped Feedbacks it is fed once more, to measure it again (the text may have become easier for
 * it); the interval doubles with every probe that finds it still benched. */
static bool engine_benched(const coord *c, coord_peer *p, int n_act)
{
    /* a model drafter fed every request drafts for all of them in one batch: with several
     * active (n_act), whether that pays is the batch guard's to judge, not one request's gain */
    if (p->multi && !p->lookup && n_act > 1)
        return false;
    if (p->draft_n < ENGINE_WAIT_WARMUP || p->accept_n < ENGINE_WAIT_WARMUP ||
        c->step_ema_us <= 0 || c->opt.draft_wait_fixed ||
        p->draft_ema_us < 0.1 * c->step_ema_us || /* drafting nearly free (ngram): never benched */
        /* its own drafting work nearly free, whatever its replies' latency (ngram: a lookup takes
         * microseconds; the reply waits on wake-ups that take no core from the target) */
        (p->draft_work_n && p->draft_work_ema_us < 0.1 * c->step_ema_us) ||
        p->accept_ema * c->step_ema_us >= p->draft_ema_us) {
        p->benched = 0;
        p->bench_interval = ENGINE_BENCH_PROBE;
        return false;
    }
    if (p->bench_interval < ENGINE_BENCH_PROBE)
        p->bench_interval = ENGINE_BENCH_PROBE;
    if (++p->benched > p->bench_interval) {
        /* a probe; a model drafter re-reads the whole context for it, so each probe that finds it
         * still not paying doubles the interval (up to 16 x) */
        p->benched = 0;
        if (p->bench_interval < 16 * ENGINE_BENCH_PROBE)
            p->bench_interval *= 2;
        return false;
    }
    p->benched_total++;
    return true;
}

/* Tell the speculators the committed context of the request in sequence slot `slot`: a full
 * reset to those that do not hold this request's context, the appended tokens to the others.
 * `multi_only`: only the speculators for which switching requests is free (ngram; they are fed
 * every active request, so each gets drafts); the others hold one request's state (a private KV)
 * and are fed the focus request only. `verified`: the tree the step verified (NULL: none); each
 * speculator learns how many of its own nodes were in it — none when its draft came too late or
 * lost the vote, which is then no verdict on its confidence threshold. */
void engine_feedback(coord *c, int slot, uint64_t req_id, const int32_t *all, int n_all,
                     const int32_t *added, int n_added, int accepted, const coord_tree *verified,
                     bool multi_only)
{
    /* a seeded request's trees must not depend on timing: the fixed length, not the adaptive */
    bool seeded = engine_slot_seeded(c, slot);
    int fixed_len = c->opt.max_draft < c->width - 1 ? c->opt.max_draft : c->width - 1;
    /* with other requests in flight, the request's own length (engine_slot_len) */
    int n_act = engine_active(c);
    int len = n_act > 1 ? c->eng->slots[slot].spec_len : c->spec_len;
    uint32_t max_depth = (uint32_t)(seeded ? (fixed_len > 0 ? fixed_len : 1) : len);
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        coord_peer *p = &c->grp.peers[i];
        if (p->role != PEER_SPECULATOR || !p->connected || (multi_only && !p->multi))
            continue;
        if (!seeded && engine_benched(c, p, n_act))
            continue;
        Orochi__Feedback fb = OROCHI__FEEDBACK__INIT;
        fb.request_id = req_id;
        fb.ctx_len = (uint64_t)n_all;
        fb.seq_slot = (uint32_t)slot;
        bool reset = p->fed_req != req_id || p->fed_ctx + (uint64_t)n_added != (uint64_t)n_all;
        fb.reset = reset;
        fb.tokens = (int32_t *)(reset ? all : added);
        fb.n_tokens = (size_t)(reset ? n_all : n_added);
        fb.accepted = (uint32_t)accepted;
        uint32_t mine = 0;
        for (int j = 1; verified && j < verified->n; j++)
            mine += (verified->owners[j] >> p->index) & 1u;
        fb.drafted = mine;
        fb.max_nodes = (uint32_t)(c->width - 1);
        fb.max_depth = max_depth;
        fb.tree = c->opt.tree;
        uint32_t sp[CTL_TREE_CAP], sr[CTL_TREE_CAP];
        const ctl_template *shape = seeded || !c->opt.tree ? NULL : coord_plan_tree(c);
        for (int j = 1; shape && j < shape->n && j < CTL_TREE_CAP; j++) {
            sp[j - 1] = (uint32_t)shape->parent[j];
            sr[j - 1] = (uint32_t)shape->rank[j];
        }
        fb.n_shape_parent = fb.n_shape_rank = shape && shape->n > 1 ? (size_t)(shape->n - 1) : 0;
        fb.shape_parent = sp;
        fb.shape_rank = sr;
        coord_group_send(c, p, OROCHI__ENVELOPE__BODY_FEEDBACK, &fb);
        p->fed_req = req_id;
        p->fed_ctx = (uint64_t)n_all;
        p->fed_reset = reset;
        p->fed_us = rt_now_us();
        p->reply_timed = false;
        p->slot_fed_req[slot] = req_id;
        p->slot_fed_ctx[slot] = (uint64_t)n_all;
        p->draft_ready[slot].fresh = false;
    }
}

void engine_feedback_done(coord *c, uint64_t req_id)
{
    Orochi__Feedback fb = OROCHI__FEEDBACK__INIT;
    fb.request_id = req_id;
    fb.done = true;
    coord_group_broadcast(c, PEER_SPECULATOR, OROCHI__ENVELOPE__BODY_FEEDBACK, &fb);
}

/* How long (us from t0, the start of the wait) this step may wait for p's draft. A draft that
 * brings a accepted tokens saves a verification cycles of time T each (T: measured, the wait
 * excluded), so waiting w for it pays
 * while w < a * T: p is waited on up to that gain, and not at all when its measured reply latency
 * says the draft will come later than that. A speculator that is never waited on gives no
 * acceptance samples, so after ENGINE_WAIT_PROBE steps without one it is waited on once more (up to
 * twice its reply latency) to measure it again. Before enough samples, with --draft-wait fixed,
 * and when `fixed` (see engine_gather_drafts) the wait is --draft-wait-ms, which caps every wait.
 * n_act: the requests active (a batched drafter's draft serves them all). *probe tells a probe. */
static uint64_t engine_draft_budget_us(const coord *c, const coord_peer *p, uint64_t t0, bool fixed,
                                       int n_act, bool *probe)
{
    double cap = c->opt.draft_wait_ms > 0 ? c->opt.draft_wait_ms * 1000.0 : 0, w;
    *probe = false;
    if (fixed || c->opt.draft_wait_fixed || p->reply_n < ENGINE_WAIT_WARMUP ||
        p->accept_n < ENGINE_WAIT_WARMUP || c->step_ema_us <= 0)
        return (uint64_t)cap;
    /* a batched drafter's draft comes with every other request's (n_act active): waiting for it
     * pays for all */
    int served = p->multi && !p->lookup && n_act > 1 ? n_act : 1;
    double gain = p->accept_ema * c->step_ema_us * served;
    /* its expected reply: after an incremental Feedback the drafting latency, the one benching
     * judges by (a fed speculator is then one worth waiting for); after a reset, any reply's */
    double lat =
        !p->fed_reset && p->draft_n >= ENGINE_WAIT_WARMUP ? p->draft_ema_us : p->reply_ema_us;
    double due = lat - (double)(t0 > p->fed_us ? t0 - p->fed_us : 0);
    if (p->unscored >= ENGINE_WAIT_PROBE) {
        *probe = true;
        w = gain > 2 * p->reply_ema_us ? gain : 2 * p->reply_ema_us;
    } else {
        w = due > gain ? 0 : gain;
    }
    return (uint64_t)(w < cap ? w : cap);
}

/* Wait for the fed speculators' answers for context n_all, each as long as engine_draft_budget_us
 * allows (no longer than its answer: an instant one costs nothing), and copy the drafts that
 * continue exactly this context into the peers' slot_draft[slot] (n = 0: no draft). Returns how
 * many. `fixed`: wait up to --draft-wait-ms whatever the measurements say — for a request that
 * samples with a seed, whose output depends on the trees verified (speculative sampling draws
 * along them) and which a seed promises to reproduce: its trees must not depend on timing. */
int engine_gather_drafts(coord *c, int slot, uint64_t req_id, const int32_t *all, int n_all,
                         bool fixed)
{
    for (int i = 0; i < COORD_MAX_PEERS; i++)
        c->grp.peers[i].slot_draft[slot].n = 0;
    if (!coord_group_count(c, PEER_SPECULATOR, true))
        return 0;
    uint64_t t0 = rt_now_us(), until[COORD_MAX_PEERS] = {0};
    int n_act = engine_active(c);
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        coord_peer *p = &c->grp.peers[i];
        if (p->role != PEER_SPECULATOR || !p->connected || !engine_fed(p, slot, req_id, n_all))
            continue;
        bool probe;
        until[i] = t0 + engine_draft_budget_us(c, p, t0, fixed, n_act, &probe);
        if (probe)
            p->unscored = 0; /* one probe, then the gain rules again */
        if (c->opt.trace)
            rt_log("coordinator",
                   "draft wait for %s: up to %.1f ms%s (accepted %.2f, step %.1f ms, "
                   "reply %.1f ms, fed %.1f ms ago)",
                   p->name, (until[i] - t0) / 1e3, probe ? " (probe)" : "", p->accept_ema,
                   c->step_ema_us / 1e3, p->reply_ema_us / 1e3, (t0 - p->fed_us) / 1e3);
    }
    for (;;) {
        int waiting = 0;
        uint64_t now = rt_now_us();
        for (int i = 0; i < COORD_MAX_PEERS; i++) {
            coord_peer *p = &c->grp.peers[i];
            if (p->role == PEER_SPECULATOR && p->connected && engine_fed(p, slot, req_id, n_all) &&
                now < until[i] &&
                !(p->draft_ready[slot].fresh && p->draft_ready[slot].req == req_id &&
                  p->draft_ready[slot].ctx == (uint64_t)n_all))
                waiting++;
        }
        if (!waiting || coord_stop_flag)
            break;
        coord_group_serve(c, 1);
    }
    pthread_mutex_lock(&c->met.lock);
    c->met.draft_wait_seconds += (rt_now_us() - t0) / 1e6;
    pthread_mutex_unlock(&c->met.lock);
    int got = 0;
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        coord_peer *p = &c->grp.peers[i];
        if (p->role != PEER_SPECULATOR || !p->connected || !p->draft_ready[slot].fresh ||
            p->draft_ready[slot].req != req_id || p->draft_ready[slot].ctx != (uint64_t)n_all ||
            p->draft_ready[slot].n == 0)
            continue;
        arena_draft_ring *ring =
            (arena_draft_ring *)((uint8_t *)c->grp.rings + (size_t)p->index * c->grp.ring_bytes);
        arena_draft *d = &p->slot_draft[slot];
        /* the draft must continue exactly this context */
        if (!arena_draft_ring_get(ring, RT_DRAFT_SLOTS, p->draft_ready[slot].ring_slot, d) ||
            d->request_id != req_id || d->ctx_len != (uint64_t)n_all ||
            d->last_token != all[n_all - 1]) {
            d->n = 0;
            continue;
        }
        got += d->n > 0;
    }
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        coord_peer *p = &c->grp.peers[i];
        if (p->role == PEER_SPECULATOR && engine_fed(p, slot, req_id, n_all) &&
            !p->slot_draft[slot].n)
            p->unscored++; /* a draft in time is scored after the verification */
    }
    return got;
}

/* A speculator's vote: its Minions weight (rewarded/punished by ACR thresholds) scaled by its ACR
 * itself, so that when two speculators sit at the same weight (both punished to the floor, say)
 * the one whose drafts are accepted more often still wins the vote. */
static float engine_vote_weight(const coord_peer *p)
{
    return (float)(p->acr.weight * (0.05 + p->acr.acr));
}

/* The slot's gathered drafts merged into one trie (vote off: only the heaviest speculator's). */
void engine_merge_drafts(coord *c, int slot, int32_t root, coord_tree *merged)
{
    ctl_tree_init(merged, root);
    coord_peer *best = NULL;
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        coord_peer *p = &c->grp.peers[i];
        if (!p->slot_draft[slot].n)
            continue;
        if (c->opt.vote == VOTE_OFF) {
            if (!best || engine_vote_weight(p) > engine_vote_weight(best) ||
                (engine_vote_weight(p) == engine_vote_weight(best) &&
                 p->slot_draft[slot].n > best->slot_draft[slot].n))
                best = p;
        } else {
            ctl_tree_add(merged, &p->slot_draft[slot], engine_vote_weight(p), p->index);
        }
    }
    if (best)
        ctl_tree_add(merged, &best->slot_draft[slot], engine_vote_weight(best), best->index);
}
