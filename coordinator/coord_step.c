/*
 * coordinator/coord_step.c — the engine's floor: one target step through the workers.
 *
 * engine_step writes a step (tokens, parents, sequence slots, every slot's committed length) into
 * the arena's step record, rings the doorbell and waits for every worker's done mark, serving the
 * group meanwhile (a lost worker makes the step fail; it is re-run once the worker is back: inputs
 * and the committed K/V are in the arena, untouched). A free run (engine_run) is such a step that
 * the workers continue by themselves; its taker, which the free run sets, is handed their tokens
 * as they come. Also here: the StepDone reports, the commit view's batch, and the slot lookups
 * every other part of the engine uses.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/engine.h"

/* ===== one verification step through the workers ===== */

/* The report of a finished step (the step itself completed through the arena doorbell). */
void coord_engine_on_step_done(coord *c, coord_peer *p, const Orochi__StepDone *d)
{
    if (p->index < 0 || p->index >= RT_MAX_WORKERS)
        return;
    pthread_mutex_lock(&c->met.lock);
    c->met.worker_compute_us[p->index] += (double)d->compute_us;
    c->met.worker_steps[p->index]++;
    pthread_mutex_unlock(&c->met.lock);
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
    if (!c->grp.step_wait_id)
        return;
    c->grp.step_failed = true;
    snprintf(c->grp.step_err, sizeof c->grp.step_err, "%s was lost during the step", p->name);
    /* survivors may be waiting for it at the barrier: make them give up now */
    arena_barrier_break(&c->grp.step->barrier);
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


/* Hand the tokens every worker has made and committed to the run's taker; ask the workers to stop
 * when it says so. */
static void engine_run_poll(coord *c, engine_run *run)
{
    rt_step *st = c->grp.step;
    uint32_t ready = RT_RUN_MAX;
    for (int i = 0; i < c->opt.n_workers && i < RT_MAX_WORKERS; i++) {
        uint32_t k = __atomic_load_n(&st->run_count[i], __ATOMIC_ACQUIRE);
        ready = k < ready ? k : ready;
    }
    if ((int)ready > run->taken && run->take(c, run, (int)ready))
        __atomic_store_n(&st->run_stop, 1, __ATOMIC_RELEASE);
}

/* Run one step over n tokens (parents, sequence slots; seq_prefix: committed length of every
 * slot); re-run it while workers are lost and come back. With `run`, a one-token step that the
 * workers continue as a free-running decode: a run that lost a worker after some tokens were
 * taken is not re-run (what was taken stands; the next step goes on from there). Returns 0, or
 * -1 if the group cannot finish it (err says why). */
int engine_step(coord *c, int n, const int32_t *tokens, const int32_t *parent,
                       const int32_t *seq, const int *seq_prefix, int logits_from, engine_run *run,
                       char *err, size_t errlen)
{
    uint64_t t0 = rt_now_us();
    for (int attempt = 0; attempt < 5; attempt++) {
        if (!engine_wait_workers(c)) {
            snprintf(err, errlen, "the workers are not available (%d of %d connected)",
                     coord_group_count(c, PEER_WORKER, true), c->opt.n_workers);
            return -1;
        }
        rt_step *st = c->grp.step;
        st->step_id = ++c->grp.step_counter;
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
            st->seq_prefix[s] = s < c->opt.n_seq ? (uint32_t)seq_prefix[s] : 0;
        st->run_max = run ? run->max : 0;
        st->run_n_eog = run ? (uint32_t)(run->n_eog < RT_MAX_EOG ? run->n_eog : RT_MAX_EOG) : 0;
        for (uint32_t k = 0; k < st->run_n_eog; k++)
            st->run_eog[k] = run->eog[k];
        st->run_stop = 0;
        memset(st->run_count, 0, sizeof st->run_count);
        arena_barrier_init(&st->barrier, (uint32_t)c->opt.n_workers);
        memset(st->err, 0, sizeof st->err);
        __atomic_store_n(&st->done, 0, __ATOMIC_RELAXED);
        c->grp.step_wait_id = st->step_id;
        c->grp.step_failed = false;
        c->grp.step_err[0] = 0;
        /* ring: the workers wait on the doorbell in the arena (see rt_step) */
        __atomic_store_n(&st->doorbell, (uint32_t)st->step_id, __ATOMIC_SEQ_CST);
        rt_futex_wake(&st->doorbell);
        uint64_t last_pump = rt_now_us();
        uint32_t want = (uint32_t)st->step_id;
        int finished = 0;
        for (;;) {
            uint32_t d = __atomic_load_n(&st->done, __ATOMIC_ACQUIRE);
            finished = 0;
            for (int i = 0; i < c->opt.n_workers && i < RT_MAX_WORKERS; i++)
                finished += __atomic_load_n(&st->done_step[i], __ATOMIC_ACQUIRE) == want;
            if (finished >= c->opt.n_workers || c->grp.step_failed || coord_stop_flag)
                break;
            rt_futex_wait(&st->done, d, run ? run->period_ms : 2);
            if (run)
                engine_run_poll(c, run);
            if (rt_now_us() - last_pump > 2000) { /* liveness: a worker may have died */
                coord_group_serve(c, 0);
                last_pump = rt_now_us();
            }
        }
        for (int i = 0; i < c->opt.n_workers && i < RT_MAX_WORKERS; i++)
            if (st->err[i][0]) {
                c->grp.step_failed = true;
                snprintf(c->grp.step_err, sizeof c->grp.step_err, "worker-%d: %.160s", i, st->err[i]);
            }
        c->grp.step_wait_id = 0;
        if (run)
            engine_run_poll(c, run);
        if (!c->grp.step_failed && finished >= c->opt.n_workers) {
            uint64_t t1 = rt_now_us();
            pthread_mutex_lock(&c->met.lock);
            c->met.steps += run ? 0u : 1u; /* a run's steps are counted as their tokens are taken */
            c->met.step_seconds += (t1 - t0) / 1e6;
            pthread_mutex_unlock(&c->met.lock);
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
               c->grp.step_err, run && run->taken ? "going on after the tokens made" : "re-running it");
        /* let the survivors report back before the barrier is re-armed */
        uint64_t settle = rt_now_us() + 200000u;
        while (rt_now_us() < settle) {
            coord_group_serve(c, 5);
        }
        if (run && run->taken)
            return 0;
    }
    snprintf(err, errlen, "step could not be completed: %s",
             c->grp.step_err[0] ? c->grp.step_err : "stopping");
    return -1;
}

/* Tell the commit view about the step just run (positions per sequence slot). */
int engine_set_batch(coord *c, const llama_batch *b, const int *seq_prefix, char *err,
                            size_t errlen)
{
    for (int s = 0; s < c->opt.n_seq; s++)
        llama_ctx_set_seq_prefix_len(c->kv, s, seq_prefix[s]);
    return llama_ctx_set_batch(c->kv, b, err, errlen);
}

/* An exponential moving average; the first sample (have == 0) starts it. */
double engine_ema(double avg, int have, double x)
{
    return have ? avg + ENGINE_EMA * (x - avg) : x;
}

int engine_slot_of(const coord *c, uint64_t req_id)
{
    for (int s = 0; s < c->opt.n_seq; s++)
        if (c->eng->slots[s].used && c->eng->slots[s].req_id == req_id)
            return s;
    return -1;
}

/* A request that samples with a seed: its trees must not depend on timing (see
 * engine_gather_drafts), so its speculators are always fed and its width share is fixed. */
bool engine_slot_seeded(const coord *c, int slot)
{
    const engine_slot *sl = &c->eng->slots[slot];
    return sl->used && !sl->greedy && sl->prm->has_seed;
}
