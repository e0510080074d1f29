/*
 * coordinator/coord_engine.c — requests through the verification loop.
 *
 * Up to --max-batch requests share each target step, each in its own KV sequence slot. For a
 * request: render and tokenize the prompt, refuse it if it cannot fit the context (413), prefill
 * it through the workers in chains of up to max_width (each step also a plain step for every other
 * active greedy request: engine_piggyback_slots), and take the first token from the last prompt
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
 *      Each slot's drafts are merged; the width is shared out by what was drafted and each slot's
 *      trie voted into one tree within its share;
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
 * Stop conditions: the tokenizer's end-of-generation tokens (tokenizer_eog), max_tokens (or the context end), stop strings (text is
 * held back until it cannot be the start of a stop string).
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
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/coord.h"
#include "coordinator/coord_output.h"
#include "coordinator/verify.h"
#include "base/buf.h"
#include "base/utf8.h"

#define ENGINE_WORKER_WAIT_US 60000000u /* how long a request waits for the workers to be back */
#define ENGINE_EMA 0.25       /* weight of the newest sample in the draft wait's averages */
#define ENGINE_WAIT_WARMUP 4  /* samples of a speculator before its wait is measured, not capped */
#define ENGINE_WAIT_PROBE 32  /* steps unscored before a speculator is waited on again */
#define ENGINE_BENCH_PROBE 64 /* Feedbacks a benched speculator skips before it is tried again */
#define ENGINE_FREE_GUARDED 16 /* steps of a free run while width 1 keeps speculators off (the
                                * plan's next bucket may speculate) */
#define ENGINE_LOOKUP_ORDER 3  /* prompt lookup in a free run: the longest match tried (ngram's) */
#define ENGINE_COST_REPS 9     /* rounds of the group's own step-time measurement */

static double engine_ema(double avg, int have, double x);

/* ===== the queue (HTTP threads -> main loop) ===== */

int coord_engine_submit(void *ctx, coord_request *req)
{
    coord *c = ctx;
    pthread_mutex_lock(&c->qlock);
    if (c->qlen >= (c->max_queue > 0 ? c->max_queue : COORD_QUEUE)) {
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
    if (ready == c->n_workers)
        return 1;
    snprintf(msg, len, "%d of %d workers connected", ready, c->n_workers);
    return 0;
}

/* ===== one verification step through the workers ===== */

/* The report of a finished step (the step itself completed through the arena doorbell). */
void coord_engine_on_step_done(coord *c, coord_peer *p, const Orochi__StepDone *d)
{
    if (p->index < 0 || p->index >= RT_MAX_WORKERS)
        return;
    pthread_mutex_lock(&c->mlock);
    c->m_worker_compute_us[p->index] += (double)d->compute_us;
    c->m_worker_steps[p->index]++;
    pthread_mutex_unlock(&c->mlock);
    if (d->error && d->error[0])
        coord_peer_error(p, "step %llu: %.120s", (unsigned long long)d->step_id, d->error);
    p->step_ema_us = engine_ema(p->step_ema_us, p->step_n, (double)d->compute_us);
    p->wait_ema_us = engine_ema(p->wait_ema_us, p->step_n++, (double)d->wait_us);
    if (!coord_tracing(c) || !d->start_us)
        return;
    uint64_t end = d->start_us + d->compute_us;
    coord_trace_span(c, (int)p->pid, p->name, (int)p->pid, "step", d->start_us, end,
                     "\"step\":%llu,\"tokens\":%u,\"embed_us\":%llu,\"attention_us\":%llu,"
                     "\"attn_out_us\":%llu,\"ffn_up_us\":%llu,\"ffn_down_us\":%llu,"
                     "\"lm_head_us\":%llu,\"barrier_us\":%llu",
                     (unsigned long long)d->step_id, d->n_tokens, (unsigned long long)d->embed_us,
                     (unsigned long long)d->attention_us, (unsigned long long)d->attn_out_us,
                     (unsigned long long)d->ffn_up_us, (unsigned long long)d->ffn_down_us,
                     (unsigned long long)d->lm_head_us, (unsigned long long)d->wait_us);
    for (size_t i = 0; i + 1 < d->n_long_waits; i += 2)
        coord_trace_span(c, (int)p->pid, p->name, (int)p->pid, "barrier wait", d->long_waits[i],
                         d->long_waits[i] + d->long_waits[i + 1], NULL);
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
        coord_group_serve(c, 5);
    }
    return true;
}

/* A free-running greedy decode in flight (rt_step.run_max): the workers make the tokens, and
 * engine_step hands them to engine_run_take as they come, each time it wakes and once at the end;
 * it returns true to end the run early (the workers stop after the step they are in). */
typedef struct {
    uint32_t max;           /* steps the workers may make */
    const int32_t *eog;     /* they stop after a step that made one of these */
    int n_eog;
    int period_ms;          /* how often the coordinator looks for new tokens */
    int n;                  /* requests in the run, one row each */
    int slots[RT_MAX_SEQ];  /* their sequence slots, in row order */
    int speculators;        /* connected when it started: the run ends when that changes */
    int taken;              /* steps taken so far */
} engine_run;

static bool engine_run_take(coord *c, engine_run *r, int ready);

/* Hand the tokens every worker has made and committed to engine_run_take; ask the workers to stop
 * when it says so. */
static void engine_run_poll(coord *c, engine_run *run)
{
    rt_step *st = c->step;
    uint32_t ready = RT_RUN_MAX;
    for (int i = 0; i < c->n_workers && i < RT_MAX_WORKERS; i++) {
        uint32_t k = __atomic_load_n(&st->run_count[i], __ATOMIC_ACQUIRE);
        ready = k < ready ? k : ready;
    }
    if ((int)ready > run->taken && engine_run_take(c, run, (int)ready))
        __atomic_store_n(&st->run_stop, 1, __ATOMIC_RELEASE);
}

/* Run one step over n tokens (parents, sequence slots; seq_prefix: committed length of every
 * slot); re-run it while workers are lost and come back. With `run`, a one-token step that the
 * workers continue as a free-running decode: a run that lost a worker after some tokens were
 * taken is not re-run (what was taken stands; the next step goes on from there). Returns 0, or
 * -1 if the group cannot finish it (err says why). */
static int engine_step(coord *c, int n, const int32_t *tokens, const int32_t *parent,
                       const int32_t *seq, const int *seq_prefix, int logits_from, engine_run *run,
                       char *err, size_t errlen)
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
        st->n_prefix = (uint32_t)seq_prefix[seq ? seq[0] : 0];
        st->logits_from = (uint32_t)logits_from;
        st->plan_gen = c->part_gen;
        memcpy(st->tokens, tokens, (size_t)n * sizeof *tokens);
        for (int i = 0; i < n; i++) {
            st->parent[i] = parent ? parent[i] : i - 1;
            st->seq[i] = seq ? seq[i] : 0;
        }
        for (int s = 0; s < RT_MAX_SEQ; s++)
            st->seq_prefix[s] = s < c->n_seq ? (uint32_t)seq_prefix[s] : 0;
        st->run_max = run ? run->max : 0;
        st->run_n_eog = run ? (uint32_t)(run->n_eog < RT_MAX_EOG ? run->n_eog : RT_MAX_EOG) : 0;
        for (uint32_t k = 0; k < st->run_n_eog; k++)
            st->run_eog[k] = run->eog[k];
        st->run_stop = 0;
        memset(st->run_count, 0, sizeof st->run_count);
        arena_barrier_init(&st->barrier, (uint32_t)c->n_workers);
        memset(st->err, 0, sizeof st->err);
        __atomic_store_n(&st->done, 0, __ATOMIC_RELAXED);
        c->step_wait_id = st->step_id;
        c->step_failed = false;
        c->step_err[0] = 0;
        /* ring: the workers wait on the doorbell in the arena (see rt_step) */
        __atomic_store_n(&st->doorbell, (uint32_t)st->step_id, __ATOMIC_SEQ_CST);
        rt_futex_wake(&st->doorbell);
        uint64_t last_pump = rt_now_us();
        uint32_t want = (uint32_t)st->step_id;
        int finished = 0;
        for (;;) {
            uint32_t d = __atomic_load_n(&st->done, __ATOMIC_ACQUIRE);
            finished = 0;
            for (int i = 0; i < c->n_workers && i < RT_MAX_WORKERS; i++)
                finished += __atomic_load_n(&st->done_step[i], __ATOMIC_ACQUIRE) == want;
            if (finished >= c->n_workers || c->step_failed || coord_stop_flag)
                break;
            rt_futex_wait(&st->done, d, run ? run->period_ms : 2);
            if (run)
                engine_run_poll(c, run);
            if (rt_now_us() - last_pump > 2000) { /* liveness: a worker may have died */
                coord_group_serve(c, 0);
                last_pump = rt_now_us();
            }
        }
        for (int i = 0; i < c->n_workers && i < RT_MAX_WORKERS; i++)
            if (st->err[i][0]) {
                c->step_failed = true;
                snprintf(c->step_err, sizeof c->step_err, "worker-%d: %.160s", i, st->err[i]);
            }
        c->step_wait_id = 0;
        if (run)
            engine_run_poll(c, run);
        if (!c->step_failed && finished >= c->n_workers) {
            uint64_t t1 = rt_now_us();
            pthread_mutex_lock(&c->mlock);
            c->m_steps += run ? 0u : 1u; /* a run's steps are counted as their tokens are taken */
            c->m_step_seconds += (t1 - t0) / 1e6;
            pthread_mutex_unlock(&c->mlock);
            coord_trace_span(c, (int)getpid(), "coordinator", COORD_TRACE_ENGINE, "step", t0, t1,
                             "\"step\":%llu,\"tokens\":%d,\"attempts\":%d",
                             (unsigned long long)st->step_id, n, attempt + 1);
            return 0;
        }
        if (coord_stop_flag)
            break;
        if (run)
            __atomic_store_n(&st->run_stop, 1, __ATOMIC_RELEASE);
        rt_log("coordinator", "step %llu failed (%s): %s", (unsigned long long)st->step_id,
               c->step_err, run && run->taken ? "going on after the tokens made" : "re-running it");
        /* let the survivors report back before the barrier is re-armed */
        uint64_t settle = rt_now_us() + 200000u;
        while (rt_now_us() < settle) {
            coord_group_serve(c, 5);
        }
        if (run && run->taken)
            return 0;
    }
    snprintf(err, errlen, "step could not be completed: %s",
             c->step_err[0] ? c->step_err : "stopping");
    return -1;
}

/* Tell the commit view about the step just run (positions per sequence slot). */
static int engine_set_batch(coord *c, const llama_batch *b, const int *seq_prefix, char *err,
                            size_t errlen)
{
    for (int s = 0; s < c->n_seq; s++)
        llama_ctx_set_seq_prefix_len(c->kv, s, seq_prefix[s]);
    return llama_ctx_set_batch(c->kv, b, err, errlen);
}

/* ===== drafts ===== */

/* An exponential moving average; the first sample (have == 0) starts it. */
static double engine_ema(double avg, int have, double x)
{
    return have ? avg + ENGINE_EMA * (x - avg) : x;
}

static int engine_slot_of(const coord *c, uint64_t req_id);
static bool engine_slot_seeded(const coord *c, int slot);

/* Whether p was fed this context of the request in sequence slot `slot` (a benched speculator
 * was not, and has no draft coming). */
static bool engine_fed(const coord_peer *p, int slot, uint64_t req_id, int n_all)
{
    return p->slot_fed_req[slot] == req_id && p->slot_fed_ctx[slot] == (uint64_t)n_all;
}

void coord_engine_on_draft_ready(coord *c, coord_peer *p, const Orochi__DraftReady *r)
{
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
static bool engine_benched(const coord *c, coord_peer *p)
{
    if (p->draft_n < ENGINE_WAIT_WARMUP || p->accept_n < ENGINE_WAIT_WARMUP ||
        c->step_ema_us <= 0 || c->draft_wait_fixed ||
        p->draft_ema_us < 0.1 * c->step_ema_us || /* drafting nearly free (ngram): never benched */
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
static void engine_feedback(coord *c, int slot, uint64_t req_id, const int32_t *all, int n_all,
                            const int32_t *added, int n_added, int accepted,
                            const coord_tree *verified, bool multi_only)
{
    /* a seeded request's trees must not depend on timing: the fixed length, not the adaptive */
    bool seeded = engine_slot_seeded(c, slot);
    int fixed_len = c->max_draft < c->width - 1 ? c->max_draft : c->width - 1;
    uint32_t max_depth = (uint32_t)(seeded ? (fixed_len > 0 ? fixed_len : 1) : c->spec_len);
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        coord_peer *p = &c->peers[i];
        if (p->role != PEER_SPECULATOR || !p->connected || (multi_only && !p->multi))
            continue;
        if (!seeded && engine_benched(c, p))
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
        fb.tree = c->tree;
        uint32_t sp[CTL_TREE_CAP], sr[CTL_TREE_CAP];
        const ctl_template *shape = seeded || !c->tree ? NULL : coord_plan_tree(c);
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

static void engine_feedback_done(coord *c, uint64_t req_id)
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
 * *probe tells a probe. */
static uint64_t engine_draft_budget_us(const coord *c, const coord_peer *p, uint64_t t0, bool fixed,
                                       bool *probe)
{
    double cap = c->draft_wait_ms > 0 ? c->draft_wait_ms * 1000.0 : 0, w;
    *probe = false;
    if (fixed || c->draft_wait_fixed || p->reply_n < ENGINE_WAIT_WARMUP ||
        p->accept_n < ENGINE_WAIT_WARMUP || c->step_ema_us <= 0)
        return (uint64_t)cap;
    double gain = p->accept_ema * c->step_ema_us;
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
static int engine_gather_drafts(coord *c, int slot, uint64_t req_id, const int32_t *all, int n_all,
                                bool fixed)
{
    for (int i = 0; i < COORD_MAX_PEERS; i++)
        c->peers[i].slot_draft[slot].n = 0;
    if (!coord_group_count(c, PEER_SPECULATOR, true))
        return 0;
    uint64_t t0 = rt_now_us(), until[COORD_MAX_PEERS] = {0};
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        coord_peer *p = &c->peers[i];
        if (p->role != PEER_SPECULATOR || !p->connected || !engine_fed(p, slot, req_id, n_all))
            continue;
        bool probe;
        until[i] = t0 + engine_draft_budget_us(c, p, t0, fixed, &probe);
        if (probe)
            p->unscored = 0; /* one probe, then the gain rules again */
        if (c->trace)
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
            coord_peer *p = &c->peers[i];
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
    pthread_mutex_lock(&c->mlock);
    c->m_draft_wait_seconds += (rt_now_us() - t0) / 1e6;
    pthread_mutex_unlock(&c->mlock);
    int got = 0;
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        coord_peer *p = &c->peers[i];
        if (p->role != PEER_SPECULATOR || !p->connected || !p->draft_ready[slot].fresh ||
            p->draft_ready[slot].req != req_id || p->draft_ready[slot].ctx != (uint64_t)n_all ||
            p->draft_ready[slot].n == 0)
            continue;
        arena_draft_ring *ring =
            (arena_draft_ring *)((uint8_t *)c->rings + (size_t)p->index * c->ring_bytes);
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
        coord_peer *p = &c->peers[i];
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
static void engine_merge_drafts(coord *c, int slot, int32_t root, coord_tree *merged)
{
    ctl_tree_init(merged, root);
    coord_peer *best = NULL;
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        coord_peer *p = &c->peers[i];
        if (!p->slot_draft[slot].n)
            continue;
        if (c->vote == VOTE_OFF) {
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

/* ===== the scheduler: up to n_seq requests share each verification step ===== */

typedef struct {
    bool used;
    coord_request *req;
    const coord_params *prm;
    uint64_t req_id;
    int32_t *all; /* prompt + generated tokens */
    int n_all, n_prompt, generated, max_new, steps, accepted_total, verify_steps;
    bool greedy, stop;
    const char *finish;
    sampler smp;
    void *work; /* sampling scratch: 3 * V floats + V * 8 bytes */
    coord_text out;
    char kinds[COORD_DRAFT_KINDS_LEN];
    coord_tree tree;                 /* this step's tree */
    int off;                         /* where the tree sits in the step batch */
    int last_added;                  /* tokens the last step appended */
    int last_row;                    /* batch row of the last accepted node */
    uint64_t queued_us, admitted_us; /* arrived, taken into the slot (the timeline) */
    uint64_t first_us;               /* the first token was drawn (the prompt's time ends) */
    int cached;                      /* prompt tokens whose K/V came from another request */
} engine_slot;

struct coord_engine_state {
    engine_slot slots[RT_MAX_SEQ];
    int prefix[RT_MAX_SEQ]; /* committed length per sequence slot */
    /* an idle slot's committed tokens (its last request's), whose K/V rows are still in its
     * region of the cache: a new prompt that begins with them starts from them */
    int32_t *kept[RT_MAX_SEQ];
    int n_kept[RT_MAX_SEQ];
    int rr;                 /* round-robin start for budget leftovers */
};

static int engine_slot_of(const coord *c, uint64_t req_id)
{
    for (int s = 0; s < c->n_seq; s++)
        if (c->eng->slots[s].used && c->eng->slots[s].req_id == req_id)
            return s;
    return -1;
}

/* A request that samples with a seed: its trees must not depend on timing (see
 * engine_gather_drafts), so its speculators are always fed and its width share is fixed. */
static bool engine_slot_seeded(const coord *c, int slot)
{
    const engine_slot *sl = &c->eng->slots[slot];
    return sl->used && !sl->greedy && sl->prm->has_seed;
}

/* the request's span on its slot's track of the timeline */
static void slot_trace(coord *c, int s, int status)
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

static void slot_release(coord *c, int s)
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
    coord_request_unref(&sl->req);
    memset(sl, 0, sizeof *sl);
    c->eng->prefix[s] = 0;
}

/* Publish the target's hidden state of batch row `row` (just computed) for the request's context
 * of ctx_len tokens: Medusa speculators draft from it. */
static void engine_publish_hidden(coord *c, uint64_t req_id, int ctx_len, int row)
{
    rt_hidden *h = c->hidden;
    const float *x = llama_ctx_shared(c->kv)->x + (size_t)row * c->model->cfg.dim;
    __atomic_store_n(&h->seq, h->seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    h->request_id = req_id;
    h->ctx_len = (uint64_t)ctx_len;
    memcpy(h->h, x, (size_t)c->model->cfg.dim * sizeof *x);
    __atomic_store_n(&h->seq, h->seq + 1, __ATOMIC_RELEASE);
}

/* The request the model speculators draft for: the oldest active one. Such a speculator keeps one
 * request's state (private KV and all), so feeding it every slot in turn would make it start over
 * each step. Speculators that switch requests for free (ngram) are fed every active request. */
static uint64_t engine_focus(const coord *c)
{
    uint64_t best = 0;
    for (int s = 0; s < c->n_seq; s++) {
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
 * go to the request before the text they start in (slot_emit flushes after this). */
static void slot_logprobs(coord *c, engine_slot *sl, const int32_t *ids, const float *const *rows,
                          const size_t *start, int n, size_t cut)
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
static int slot_emit(coord *c, engine_slot *sl, const int32_t *ids, const float *const *rows, int n)
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
        slot_logprobs(c, sl, ids, rows, start, texted, stopped ? cut : SIZE_MAX);
    }
    if (sl->stop) /* eos or out of memory: slot_finish flushes the text */
        return kept;
    if (coord_text_flush(&sl->out, sl->req, sl->prm, false)) {
        sl->finish = "stop";
        sl->stop = true;
    }
    return n;
}

static void slot_finish(coord *c, int s)
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
    uint64_t now = rt_now_us();
    stats.queued_ms = (double)(sl->admitted_us - sl->queued_us) / 1e3;
    stats.prompt_ms = (double)(sl->first_us - sl->admitted_us) / 1e3;
    stats.decode_ms = (double)(now - sl->first_us) / 1e3;
    coord_request_finish(sl->req, sl->finish, &stats);
    slot_trace(c, s, 200);
    pthread_mutex_lock(&c->mlock);
    c->m_tokens += (uint64_t)sl->generated;
    c->m_prompt_tokens += (uint64_t)sl->n_prompt;
    pthread_mutex_unlock(&c->mlock);
    if (c->trace)
        rt_log("coordinator",
               "request %llu: %d prompt + %d generated tokens in %d steps (%.2f per "
               "verification)",
               (unsigned long long)sl->req_id, sl->n_prompt, sl->generated, sl->steps,
               stats.mean_accepted);
    slot_release(c, s);
}

static void slot_fail(coord *c, int s, int status, const char *msg)
{
    coord_request_fail(c->eng->slots[s].req, status, msg);
    slot_trace(c, s, status);
    if (status >= 500) {
        snprintf(c->last_error, sizeof c->last_error, "request %llu: %d %.160s",
                 (unsigned long long)c->eng->slots[s].req_id, status, msg);
        c->last_error_us = rt_now_us();
    }
    slot_release(c, s);
}

/* Whether this cycle verifies drafts: a width above 1 (the plan's choice for the context) and
 * the guard on. While not, speculators get no Feedback and sit idle (their cores go to the
 * target); the next Feedback resets them to the then committed context. */
static bool engine_speculating(const coord *c, int n_active)
{
    const ctl_guard *g = n_active > 1 ? &c->guard_batch : &c->guard;
    if (c->width <= 1)
        return false;
    for (int s = 0; s < c->n_seq; s++) /* a seeded request's trees must not depend on timing */
        if (engine_slot_seeded(c, s))
            return true;
    return !c->guard_enabled || g->on;
}

/* Whether slot s's request is over: a stop (end of text, a stop string), its length, or a
 * client gone. */
static bool slot_over(const engine_slot *sl)
{
    return sl->stop || sl->generated >= sl->max_new || coord_request_cancelled(sl->req);
}

/* Name a draft kind among those the request's accepted or verified drafts came from (once). */
static void slot_add_kind(engine_slot *sl, const char *kind)
{
    size_t kl = strlen(sl->kinds);
    if (!strstr(sl->kinds, kind))
        snprintf(sl->kinds + kl, sizeof sl->kinds - kl, "%s%s", kl ? "," : "", kind);
}

/* Tokens slot s may still take: its request's length and the context's end. */
static int slot_room(const coord *c, int s)
{
    const engine_slot *sl = &c->eng->slots[s];
    int room = sl->max_new - sl->generated, ctx = c->n_ctx - c->eng->prefix[s];
    return room < ctx ? room : ctx;
}

static int engine_active(const coord *c)
{
    int n = 0;
    for (int s = 0; s < c->n_seq; s++)
        n += c->eng->slots[s].used;
    return n;
}

/* The longest run of tokens that begins both a and b (at most n). */
static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb)
{
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* Start slot s's prompt from the longest committed beginning it shares with any slot — an active
 * one's committed tokens, an idle one's kept tokens (its own included: then the rows are already
 * in place) — leaving at least its last token to prefill (its logits draw the first token). The
 * rows are copied within the cache (llama_kv_copy_prefix); the workers read them from there. */
static int engine_reuse_prefix(coord *c, int s, char *err, size_t errlen)
{
    engine_slot *sl = &c->eng->slots[s];
    int best = 0, from = s;
    for (int t = 0; t < (c->no_prefix_reuse ? 0 : c->n_seq); t++) {
        const engine_slot *o = &c->eng->slots[t];
        const int32_t *toks = t != s && o->used ? o->all : c->eng->kept[t];
        int n = t != s && o->used ? c->eng->prefix[t] : c->eng->n_kept[t];
        if (!toks || n <= 0)
            continue;
        int k = common_prefix(toks, n, sl->all, sl->n_all - 1);
        if (k > best || (k == best && t == s)) {
            best = k;
            from = t;
        }
    }
    c->eng->n_kept[s] = 0; /* the slot's rows are this request's from here on */
    if (llama_kv_copy_prefix(c->kv, from, s, best, err, errlen))
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
    for (int k = 0; k < c->n_seq && n < RT_MAX_SEQ; k++) {
        const engine_slot *o = &c->eng->slots[k];
        if (k != s && o->used && o->greedy && !slot_over(o) && slot_room(c, k) >= 1)
            pig[n++] = k;
    }
    return n;
}

/* After a prefill step that carried them at batch rows w, w + 1, ...: each piggybacked request
 * takes its row's argmax, commits the row and emits the token. */
static void engine_piggyback_take(coord *c, const int *pig, int n, int w, int logits_from)
{
    int V = c->model->cfg.vocab;
    for (int k = 0; k < n; k++) {
        int s = pig[k];
        engine_slot *o = &c->eng->slots[s];
        int32_t row = w + k;
        char err[256];
        if (llama_commit(c->kv, &row, 1, err, sizeof err)) {
            slot_fail(c, s, 500, err);
            continue;
        }
        c->eng->prefix[s]++;
        const float *lg = c->logits + (size_t)(row - logits_from) * (size_t)V;
        int32_t next = sampler_argmax(lg, V);
        o->all[o->n_all++] = next;
        o->steps++;
        o->verify_steps++;
        o->last_added = 1;
        o->generated += slot_emit(c, o, &next, o->prm->logprobs ? &lg : NULL, 1);
        pthread_mutex_lock(&c->mlock);
        c->m_accept_hist[0]++;
        c->m_piggyback_tokens++;
        pthread_mutex_unlock(&c->mlock);
        if (slot_over(o))
            slot_finish(c, s);
    }
}

/* Take a request into slot s: tokenize, check it fits, prefill its prompt (steps of this slot's
 * prompt chunks, each carrying a token of every other greedy request: engine_piggyback_slots),
 * draw the first token. Returns 0 when the slot is now active. */
static int slot_start(coord *c, int s, coord_request *req, uint64_t queued_us)
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
    char err[512];
    int V = c->model->cfg.vocab;
    char *text = coord_render_prompt(c->tok, sl->prm, err, sizeof err);
    if (!text) { /* the chat template refused the conversation, or cannot be run */
        slot_fail(c, s, strstr(err, "out of memory") ? 500 : 400, err);
        return -1;
    }
    int cap = (int)strlen(text) + 8;
    sl->all =
        text ? malloc(((size_t)cap + (size_t)c->n_ctx + RT_MAX_WIDTH + 8) * sizeof *sl->all) : NULL;
    sl->work = malloc((size_t)V * 3 * sizeof(float) + (size_t)V * 8);
    if (!sl->all || !sl->work) {
        free(text);
        slot_fail(c, s, 500, "out of memory");
        return -1;
    }
    int off = tokenizer_add_bos(c->tok) && tokenizer_bos(c->tok) >= 0 ? 1 : 0, needed = 0;
    int n = tokenizer_encode(c->tok, text, strlen(text), true, sl->all + off, cap - off, &needed);
    free(text);
    if (n < 0) {
        slot_fail(c, s, 400, "the prompt could not be tokenized");
        return -1;
    }
    if (off)
        sl->all[0] = tokenizer_bos(c->tok);
    sl->n_all = sl->n_prompt = n + off;
    if (sl->n_all == 0) {
        slot_fail(c, s, 400, "the prompt is empty");
        return -1;
    }
    if (sl->n_all >= c->n_ctx) {
        snprintf(err, sizeof err,
                 "the prompt is %d tokens; the context holds %d (prompt plus at least "
                 "one generated token)",
                 sl->n_all, c->n_ctx);
        slot_fail(c, s, 413, err);
        return -1;
    }
    sl->max_new =
        sl->prm->max_tokens < c->n_ctx - sl->n_all ? sl->prm->max_tokens : c->n_ctx - sl->n_all;
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
        slot_fail(c, s, 503, err);
        return -1;
    }
    sl->cached = prefix[s];
    while (prefix[s] < sl->n_all) {
        /* the other greedy requests decode a token each in the same step, as many as leave the
         * prompt a token of the width (engine_piggyback_slots) */
        int pig[RT_MAX_SEQ], n_pig = engine_piggyback_slots(c, s, pig);
        n_pig = n_pig < c->max_width - 1 ? n_pig : c->max_width - 1;
        int room = c->max_width - n_pig;
        int w = sl->n_all - prefix[s] < room ? sl->n_all - prefix[s] : room;
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
            slot_fail(c, s, 503, err);
            return -1;
        }
        engine_piggyback_take(c, pig, n_pig, w, b.logits_from);
        prefix[s] += w;
    }
    coord_trace_span(c, (int)getpid(), "coordinator", COORD_TRACE_ENGINE, "prefill", t_prefill,
                     rt_now_us(), "\"request\":%llu,\"tokens\":%d", (unsigned long long)sl->req_id,
                     sl->n_all);
    int32_t next = sl->greedy ? sampler_argmax(c->logits, V)
                              : sampler_sample(&sl->smp, c->logits, V, sl->work);
    sl->all[sl->n_all++] = next;
    sl->generated = 1;
    sl->steps = 1;
    sl->first_us = rt_now_us();
    const float *row = c->logits; /* the last prompt position's row chose the first token */
    slot_emit(c, sl, &next, &row, 1);
    if (sl->stop || sl->generated >= sl->max_new) {
        slot_finish(c, s);
        return -1;
    }
    /* a new text: re-test speculation at once when that is cheap, i.e. every speculator that would
     * be fed switches requests for free (a model drafter would re-read the whole prompt) */
    bool cheap = true;
    for (int i = 0; i < COORD_MAX_PEERS; i++) {
        const coord_peer *p = &c->peers[i];
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
        int w_last = (sl->n_prompt - 1) % c->max_width; /* the last prompt token's batch row */
        if (focus)
            engine_publish_hidden(c, sl->req_id, sl->n_all, w_last);
        engine_feedback(c, s, sl->req_id, sl->all, sl->n_all, NULL, 0, 0, NULL, !focus);
    }
    return 0;
}

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
        const coord_peer *p = &c->peers[i];
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
    return n > 0 && !(only && other) && !c->no_lookup_run && engine_lookup_costs(c, NULL) >= 2;
}

/* Whether the group should measure its own step-time curve now: prompt lookup could run in the
 * free run but for a curve (the plan has none for this context, or there is no plan), and it
 * has not been measured yet. */
static bool engine_lookup_needs_costs(coord *c)
{
    int other;
    return !c->no_lookup_run && !c->no_free_run && !c->self_cost_tried && c->max_width >= 2 &&
           coord_plan_costs(c, NULL) < 2 && engine_lookup_peers(c, &other) > 0;
}

/* Measure the group's step time at widths 1, 2, 4, 8, 16 (up to --max-width): ENGINE_COST_REPS
 * rounds, each width in turn within a round (so a change of the machine's speed falls on all of
 * them), after one round of warm-up; chains of slot s's last token on its committed prefix,
 * nothing committed (the tree area is the next step's to overwrite). The medians become the cost
 * curve (ctl_cost_curve). A few dozen steps, once: what a plan's curve gives without a profile. */
static void engine_measure_costs(coord *c, int s)
{
    if (c->n_ctx - c->eng->prefix[s] < 16) /* no room for the widest step here: a later request */
        return;
    c->self_cost_tried = true;
    const engine_slot *sl = &c->eng->slots[s];
    int ws[5], n_w = 0;
    for (int w = 1; w <= 16 && w <= c->max_width; w *= 2)
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
    c->self_cost_w = ctl_cost_curve(ws, med, n_w, c->max_width, c->self_cost);
    char line[256];
    size_t at = 0;
    for (int i = 0; i < n_w && at < sizeof line; i++)
        at += (size_t)snprintf(line + at, sizeof line - at, " %.2f", med[i] / 1e3);
    rt_log("coordinator",
           "prompt lookup: no plan curve, the group's step times measured in %.0f ms at context "
           "%d (ms at widths 1..%d):%s",
           (double)(rt_now_us() - t0) / 1e3, c->eng->prefix[s], ws[n_w - 1], line);
}

/* Whether slot s may decode free-running among n_active requests: greedy, without logprobs (the
 * workers choose by argmax and nobody reads the logits), with no speculator connected, or
 * speculation switched off (by the guard or width 1: the speculators sit idle, unfed), or only
 * prompt lookup to do (engine_lookup_free), and at least two tokens to go. */
static bool engine_can_run_free(coord *c, int s, int n_active)
{
    const engine_slot *sl = &c->eng->slots[s];
    if (!sl->greedy || sl->prm->logprobs || c->no_free_run)
        return false;
    if (coord_group_count(c, PEER_SPECULATOR, true) > 0 && engine_speculating(c, n_active) &&
        !engine_lookup_free(c, true))
        return false;
    return slot_room(c, s) >= 2;
}

/* engine_run's taker: each request's new tokens join it as if each had been a step's bonus token
 * (its predecessor's row committed); the run ends at any request's end (end of text, a stop
 * string, its length, a client gone) or when a queued request could share the steps. A request
 * that ended takes none of the steps after its end; the others take every step made. */
static bool engine_run_take(coord *c, engine_run *r, int ready)
{
    const rt_step *st = c->step;
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
                slot_add_kind(sl, "ngram");
            sl->generated += slot_emit(c, sl, dst, NULL, k);
        }
        end |= slot_over(sl);
    }
    if (ready > r->taken) {
        pthread_mutex_lock(&c->mlock);
        for (int a = 0; a <= RT_MAX_WIDTH; a++)
            c->m_accept_hist[a] += hist[a];
        c->m_batch_hist[r->n] += (uint64_t)(ready - r->taken); /* n <= RT_MAX_SEQ */
        c->m_steps += (uint64_t)(ready - r->taken);
        c->m_free_tokens += (uint64_t)took;
        pthread_mutex_unlock(&c->mlock);
    }
    r->taken = ready;
    if (end)
        return true;
    pthread_mutex_lock(&c->qlock);
    bool queued = c->qlen > 0;
    pthread_mutex_unlock(&c->qlock);
    return (queued && engine_active(c) < c->n_seq) ||
           coord_group_count(c, PEER_SPECULATOR, true) != r->speculators;
}

/* The free run's rows in the arena: what each may make and, with prompt lookup, its context's
 * latest tokens (the last one, the root, goes as the step's token), the plan's cost curve and the
 * acceptance estimates carried from the last run. */
static void engine_run_lookup(coord *c, const int *slots, int n, bool lookup)
{
    rt_step *st = c->step;
    st->run_draft = 0;
    if (lookup) {
        st->run_width = (uint32_t)engine_lookup_costs(c, st->run_cost);
        st->run_draft = (uint32_t)c->max_draft;
        st->run_order = ENGINE_LOOKUP_ORDER;
        st->run_lookup = c->lookup;
        st->run_lookup_out = c->lookup;
    }
    for (int i = 0; i < n; i++) {
        const engine_slot *sl = &c->eng->slots[slots[i]];
        int room = slot_room(c, slots[i]);
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
static void engine_run_free(coord *c, const int *slots, int n)
{
    int *prefix = c->eng->prefix;
    int room = RT_RUN_MAX;
    for (int i = 0; i < n; i++) {
        int r = slot_room(c, slots[i]);
        room = r < room ? r : room;
    }
    /* with speculators switched off by the guard, short runs: the guard counts their steps as
     * plain cycles and switches speculation on again for its probe */
    int speculators = coord_group_count(c, PEER_SPECULATOR, true);
    bool lookup = speculators && engine_lookup_free(c, false);
    bool guarded = speculators && !engine_lookup_free(c, true);
    int cap = RT_RUN_MAX;
    if (guarded && c->guard_enabled && c->width > 1) { /* up to the guard's next probe */
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
                    .speculators = speculators};
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
            slot_fail(c, slots[i], 503, err);
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
        c->lookup = c->step->run_lookup_out;
    long made = 0; /* tokens the steps made, drafts accepted included */
    for (int i = 0; i < n && r.taken > 0; i++)
        made += c->step->run_upto[r.taken - 1][i];
    if (r.taken > 0 && guarded && c->guard_enabled && c->width > 1) {
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
        if (sl->used && slot_over(sl))
            slot_finish(c, slots[i]);
    }
}

/* One verification step for every active slot: each gets its share of the width, the drafts for
 * its context merged and voted into a tree, all trees in one target step; then per slot: verify,
 * commit, emit, feed back. */
static void engine_step_all(coord *c)
{
    struct coord_engine_state *e = c->eng;
    int active[RT_MAX_SEQ], n_act = 0;
    for (int s = 0; s < c->n_seq; s++)
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
    int n = 0, width = c->width < RT_MAX_WIDTH ? c->width : RT_MAX_WIDTH;
    int budget[RT_MAX_SEQ], cap[RT_MAX_SEQ];
    for (int k = 0; k < n_act; k++) {
        int s = active[k];
        engine_slot *sl = &e->slots[s];
        uint64_t w0 = rt_now_us();
        if (speculating)
            engine_gather_drafts(c, s, sl->req_id, sl->all, sl->n_all, engine_slot_seeded(c, s));
        else
            for (int i = 0; i < COORD_MAX_PEERS; i++)
                c->peers[i].slot_draft[s].n = 0;
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
        int room = slot_room(c, s);
        cap[k] = merged[k].n < room ? merged[k].n : room;
        if (cap[k] < 1 || !speculating)
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
        ctl_tree_vote(&merged[k], c->vote, budget[k], &sl->tree);
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
            slot_fail(c, active[k], 503, err);
        return;
    }
    uint64_t t_step_done = rt_now_us();
    int yielded = 0;
    pthread_mutex_lock(&c->mlock);
    c->m_batch_hist[n_act]++;
    pthread_mutex_unlock(&c->mlock);
    for (int k = 0; k < n_act; k++) {
        int s = active[k];
        engine_slot *sl = &e->slots[s];
        const coord_tree *t = &sl->tree;
        verify_tree vt = {.n = t->n, .tokens = t->tokens, .parent = t->parent};
        verify_result vr;
        const float *lg = c->logits + (size_t)sl->off * V;
        if (sl->greedy) {
            verify_greedy(&vt, lg, V, &vr);
        } else if (verify_sample(&vt, lg, V, &sl->smp, sl->work, &vr)) {
            slot_fail(c, s, 500, "internal error: the verification tree is malformed");
            continue;
        }
        int32_t path[RT_MAX_WIDTH];
        for (int i = 0; i < vr.n_path; i++)
            path[i] = vr.path[i] + sl->off;
        if (llama_commit(c->kv, path, vr.n_path, err, sizeof err)) {
            slot_fail(c, s, 500, err);
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
            coord_peer *p = &c->peers[i];
            const arena_draft *d = &p->slot_draft[s];
            if (p->role != PEER_SPECULATOR || !d->n)
                continue;
            int depth, matched;
            ctl_tree_match(d, added, a, &depth, &matched);
            bool verified = false;
            for (int j = 1; j < t->n; j++)
                verified |= (t->owners[j] >> p->index) & 1u;
            if (verified) /* ACR credits the voted drafts only (Minions) */
                ctl_acr_update(&p->acr, &c->acr, depth, matched);
            p->accept_ema = engine_ema(p->accept_ema, p->accept_n++, matched);
            p->unscored = 0;
            p->drafted += (uint64_t)depth;
            p->accepted += (uint64_t)matched;
            if (verified && p->kind[0])
                slot_add_kind(sl, p->kind);
        }
        pthread_mutex_lock(&c->mlock);
        c->m_accept_hist[a < RT_MAX_WIDTH ? a : RT_MAX_WIDTH]++;
        pthread_mutex_unlock(&c->mlock);
        const float *rows[RT_MAX_WIDTH + 1]; /* the row whose distribution chose added[j] */
        if (sl->prm->logprobs)
            for (int j = 0; j < n_add; j++)
                rows[j] = lg + (size_t)vr.path[j] * V;
        sl->generated += slot_emit(c, sl, added, sl->prm->logprobs ? rows : NULL, n_add);
        if (slot_over(sl))
            slot_finish(c, s);
    }
    /* the controllers learn from single-request cycles (a batch's cost per token says more about
     * the batch than about speculation): the whole cycle, drafting and waiting included */
    uint64_t t_verified = rt_now_us();
    double cycle = (t_verified - t_cycle) / 1e6;
    coord_trace_span(c, (int)getpid(), "coordinator", COORD_TRACE_ENGINE, "verify", t_step_done,
                     t_verified, "\"accepted\":%d", yielded - n_act);
    if (c->trace)
        rt_log("coordinator",
               "cycle %.1f ms: draft wait %.1f ms, step %.1f ms, %d nodes, %d tokens for %d "
               "requests%s",
               cycle * 1e3, waited / 1e3, (t_step_done - t_step) / 1e3, n, yielded, n_act,
               speculating ? "" : " (plain)");
    if (yielded && c->width > 1) {
        if (c->adaptive && speculating && n_act == 1)
            c->spec_len = ctl_length_sample(&c->len, cycle, yielded);
        if (c->guard_enabled) {
            ctl_guard *g = n_act > 1 ? &c->guard_batch : &c->guard;
            bool was_on = g->on, on = ctl_guard_sample(g, speculating, cycle, yielded);
            if (was_on != on) /* every switch with the figures it was made on */
                rt_log("coordinator",
                       "guard%s: speculation %s: speculative %.3f ms/token at %.2f tokens a "
                       "step against plain %.3f ms/token (%s), speculation length %d; %s",
                       g == &c->guard_batch ? " (batches)" : "", on ? "on to test" : "off",
                       g->spec * 1e3, g->per_step, g->base * 1e3,
                       on ? "the last judged window" : g->spec > CTL_GUARD_HOPELESS * g->base
                                                           ? "a clear loss"
                                                           : "not cheaper",
                       c->spec_len,
                       on ? "judged after the warm-up cycles"
                          : "plain steps until the next probe");
            if (was_on && !on && n_act == 1 && c->adaptive) {
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
        if (sl->req_id == focus)
            engine_publish_hidden(c, sl->req_id, sl->n_all, sl->last_row);
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
    return c->eng ? 0 : -1;
}

void coord_engine_fini(coord *c)
{
    if (!c->eng)
        return;
    for (int s = 0; s < RT_MAX_SEQ; s++)
        if (c->eng->slots[s].used)
            slot_fail(c, s, 503, "the coordinator is shutting down");
    for (int s = 0; s < RT_MAX_SEQ; s++)
        free(c->eng->kept[s]);
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

void coord_engine_tick(coord *c)
{
    /* admit queued requests into free slots (FIFO) */
    for (int s = 0; s < c->n_seq; s++) {
        if (c->eng->slots[s].used)
            continue;
        uint64_t queued_us = 0;
        coord_request *req = engine_pop(c, &queued_us);
        if (!req)
            break;
        pthread_mutex_lock(&c->mlock);
        c->m_requests++;
        pthread_mutex_unlock(&c->mlock);
        if (coord_request_cancelled(req)) {
            coord_request_fail(req, 499, "the client went away");
            coord_request_unref(&req);
            continue;
        }
        slot_start(c, s, req, queued_us);
    }
    engine_step_all(c);
}
