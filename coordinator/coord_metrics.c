/*
 * coordinator/coord_metrics.c — the engine's part of /metrics (Prometheus text): requests,
 * tokens, steps, acceptance and batch histograms, step and draft-wait time, the workers' compute,
 * the latency histograms (time to first token, inter-token latency), and the speculator and memory
 * gauges the main loop keeps current. Reads the counters under c->met.lock; the HTTP thread calls
 * it through the engine's callback table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord.h"
#include "coordinator/engine.h"
#include "base/buf.h"

/* the histograms' upper bounds, seconds (one step of the default model is ~5 ms; a long prompt
 * behind a queue takes seconds) */
static const double coord_latency_le[COORD_LAT_BUCKETS] = {
    0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30};

void coord_latency_observe(coord_latency *h, double seconds, uint64_t times)
{
    for (int b = 0; b < COORD_LAT_BUCKETS; b++)
        if (seconds <= coord_latency_le[b])
            h->n[b] += times;
    h->count += times;
    h->sum += seconds * (double)times;
}

void coord_metrics_cycle_locked(coord *c, int requests, int rows, int tokens, int steps, double ms)
{
    coord_step_rec *r = &c->met.recent[c->met.n_recent % COORD_RECENT_STEPS];
    *r = (coord_step_rec){.seq = ++c->met.n_recent,
                          .t_ms = (uint32_t)((rt_now_us() - c->grp.started_us) / 1000),
                          .requests = (uint16_t)requests,
                          .rows = (uint16_t)rows,
                          .tokens = (uint16_t)(tokens < 65535 ? tokens : 65535),
                          .steps = (uint16_t)(steps < 65535 ? steps : 65535),
                          .ms = (float)ms};
}

/* rows' bytes in every K/V region, in whole pages: those they touch (up) or lie whole in. */
static uint64_t kv_pages_bytes(const coord *c, int rows, bool up)
{
    const llama_config *cfg = &c->model->cfg;
    uint64_t row = (uint64_t)cfg->head_dim * (c->opt.kv_elem == KV_F16 ? 2u : 4u), page = 4096;
    uint64_t per_region = ((uint64_t)rows * row + (up ? page - 1 : 0)) / page * page;
    return per_region * (uint64_t)cfg->n_layers * 2 * (uint64_t)cfg->n_kv_heads;
}

uint64_t coord_kv_bytes(const coord *c, int rows)
{
    return kv_pages_bytes(c, rows, true);
}

void coord_metrics_controllers(coord *c)
{
    int active = 0;
    uint64_t held = 0, lent = 0;
    for (int s = 0; c->eng && c->model && s < c->opt.n_seq; s++) {
        active += c->eng->slots[s].used;
        if (c->eng->prefix[s] > c->eng->held[s])
            c->eng->held[s] = c->eng->prefix[s];
        /* the pages of the rows a slot borrows are its lender's (--prefix-share) */
        uint64_t h = coord_kv_bytes(c, c->eng->held[s]);
        uint64_t l = c->kv ? kv_pages_bytes(c, llama_kv_lent(c->kv, s, NULL), false) : 0;
        held += h > l ? h - l : 0;
        lent += l;
    }
    pthread_mutex_lock(&c->met.lock);
    c->met.slots_active = active;
    c->met.kv_held = held;
    c->met.kv_lent = lent;
    c->met.kv_full = c->model ? (uint64_t)c->opt.n_seq * coord_kv_bytes(c, c->opt.n_ctx) : 0;
    c->met.spec_len = c->spec_len;
    c->met.width = c->width;
    c->met.len_changes = c->len.changes;
    c->met.guard_on = !c->opt.guard_enabled || c->guard.on;
    c->met.guard_switches_off = c->guard.switches_off;
    pthread_mutex_unlock(&c->met.lock);
}

static void metrics_latency(strbuf *s, const char *name, const char *help, const coord_latency *h)
{
    strbuf_printf(s, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int b = 0; b < COORD_LAT_BUCKETS; b++)
        strbuf_printf(s, "%s_bucket{le=\"%g\"} %llu\n", name, coord_latency_le[b],
                      (unsigned long long)h->n[b]);
    strbuf_printf(s, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
                  (unsigned long long)h->count, name, h->sum, name, (unsigned long long)h->count);
}

char *coord_engine_metrics(void *ctx)
{
    coord *c = ctx;
    strbuf sb = {0};
#define M(...) strbuf_printf(&sb, __VA_ARGS__)
    pthread_mutex_lock(&c->met.lock);
    M("# HELP orochi_requests_total Requests taken by the engine.\n# TYPE orochi_requests_total "
      "counter\n"
      "orochi_requests_total %llu\n",
      (unsigned long long)c->met.requests);
    M("# TYPE orochi_requests_failed_total counter\norochi_requests_failed_total %llu\n",
      (unsigned long long)c->met.failed);
    M("# HELP orochi_tokens_generated_total Tokens generated.\n# TYPE "
      "orochi_tokens_generated_total counter\n"
      "orochi_tokens_generated_total %llu\n",
      (unsigned long long)c->met.tokens);
    M("# TYPE orochi_prompt_tokens_total counter\norochi_prompt_tokens_total %llu\n",
      (unsigned long long)c->met.prompt_tokens);
    M("# HELP orochi_steps_total Target forward steps (prefill and verification).\n"
      "# TYPE orochi_steps_total counter\norochi_steps_total %llu\n",
      (unsigned long long)c->met.steps);
    M("# HELP orochi_free_run_tokens_total Tokens the workers decoded free-running (steps the "
      "coordinator did not hand over one by one).\n"
      "# TYPE orochi_free_run_tokens_total counter\norochi_free_run_tokens_total %llu\n",
      (unsigned long long)c->met.free_tokens);
    M("# HELP orochi_prefill_piggyback_tokens_total Tokens decoded in the steps of another "
      "request's prompt (one per request aboard a prompt step).\n"
      "# TYPE orochi_prefill_piggyback_tokens_total counter\norochi_prefill_piggyback_tokens_total "
      "%llu\n",
      (unsigned long long)c->met.piggyback_tokens);
    M("# HELP orochi_accepted_per_step Drafted tokens accepted per verification step.\n"
      "# TYPE orochi_accepted_per_step histogram\n");
    uint64_t cum = 0, count = 0, sum = 0;
    for (int i = 0; i <= RT_MAX_WIDTH; i++) {
        count += c->met.accept_hist[i];
        sum += (uint64_t)i * c->met.accept_hist[i];
    }
    static const int le[] = {0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64};
    for (size_t b = 0; b < sizeof le / sizeof le[0]; b++) {
        cum = 0;
        for (int i = 0; i <= le[b] && i <= RT_MAX_WIDTH; i++)
            cum += c->met.accept_hist[i];
        M("orochi_accepted_per_step_bucket{le=\"%d\"} %llu\n", le[b], (unsigned long long)cum);
    }
    M("orochi_accepted_per_step_bucket{le=\"+Inf\"} %llu\norochi_accepted_per_step_sum %llu\n"
      "orochi_accepted_per_step_count %llu\n",
      (unsigned long long)count, (unsigned long long)sum, (unsigned long long)count);
    M("# HELP orochi_step_seconds Wall time of target steps, by role.\n# TYPE orochi_step_seconds "
      "summary\n"
      "orochi_step_seconds_sum{role=\"coordinator\"} "
      "%.6f\norochi_step_seconds_count{role=\"coordinator\"} %llu\n",
      c->met.step_seconds, (unsigned long long)c->met.steps);
    for (int i = 0; i < c->opt.n_workers && i < RT_MAX_WORKERS; i++)
        M("orochi_step_seconds_sum{role=\"worker-%d\"} "
          "%.6f\norochi_step_seconds_count{role=\"worker-%d\"} %llu\n",
          i, c->met.worker_compute_us[i] / 1e6, i, (unsigned long long)c->met.worker_steps[i]);
    M("# HELP orochi_batch_size Requests verified together per step.\n# TYPE orochi_batch_size "
      "histogram\n");
    uint64_t bc = 0, bs = 0;
    for (int k = 1; k <= RT_MAX_SEQ; k++) {
        bc += c->met.batch_hist[k];
        bs += (uint64_t)k * c->met.batch_hist[k];
        M("orochi_batch_size_bucket{le=\"%d\"} %llu\n", k, (unsigned long long)bc);
    }
    M("orochi_batch_size_bucket{le=\"+Inf\"} %llu\norochi_batch_size_sum "
      "%llu\norochi_batch_size_count %llu\n",
      (unsigned long long)bc, (unsigned long long)bs, (unsigned long long)bc);
    M("# TYPE orochi_draft_wait_seconds_total counter\norochi_draft_wait_seconds_total %.6f\n",
      c->met.draft_wait_seconds);
    M("# TYPE orochi_peer_restarts_total counter\norochi_peer_restarts_total %llu\n",
      (unsigned long long)c->met.restarts);
    metrics_latency(&sb, "orochi_time_to_first_token_seconds",
                    "From a request's arrival to its first token.", &c->met.ttft);
    metrics_latency(&sb, "orochi_inter_token_latency_seconds",
                    "Between a request's tokens: each emission of k tokens after a gap g counts k "
                    "observations of g / k (a verification step that accepts several tokens "
                    "shares its gap among them).",
                    &c->met.itl);
    M("# TYPE orochi_speculation_length gauge\norochi_speculation_length %d\n"
      "# HELP orochi_speculation_length_changes_total Decisions of the adaptive length that "
      "moved it.\n"
      "# TYPE orochi_speculation_length_changes_total counter\n"
      "orochi_speculation_length_changes_total %llu\n"
      "# TYPE orochi_verification_width gauge\norochi_verification_width %d\n"
      "# HELP orochi_guard_on Whether speculation is on (the fallback guard).\n"
      "# TYPE orochi_guard_on gauge\norochi_guard_on %d\n"
      "# TYPE orochi_guard_switches_off_total counter\n"
      "orochi_guard_switches_off_total %llu\n",
      c->met.spec_len, (unsigned long long)c->met.len_changes, c->met.width,
      c->met.guard_on ? 1 : 0, (unsigned long long)c->met.guard_switches_off);
    M("# HELP orochi_sequence_slots Requests the group decodes together (--max-batch).\n"
      "# TYPE orochi_sequence_slots gauge\norochi_sequence_slots %d\n"
      "# TYPE orochi_sequence_slots_active gauge\norochi_sequence_slots_active %d\n"
      "# HELP orochi_kv_bytes_held K/V bytes the slots have written into the arena (pages "
      "committed), and what every slot at its full context would take.\n"
      "# TYPE orochi_kv_bytes_held gauge\norochi_kv_bytes_held %llu\n"
      "# TYPE orochi_kv_bytes_full gauge\norochi_kv_bytes_full %llu\n"
      "# HELP orochi_kv_bytes_lent K/V bytes slots read in place from another slot's rows (a "
      "common beginning held once, --prefix-share): whole pages.\n"
      "# TYPE orochi_kv_bytes_lent gauge\norochi_kv_bytes_lent %llu\n",
      c->opt.n_seq, c->met.slots_active, (unsigned long long)c->met.kv_held,
      (unsigned long long)c->met.kv_full, (unsigned long long)c->met.kv_lent);
    M("%s", c->met.spec_text);
    M("%s", c->met.mem_text);
    pthread_mutex_unlock(&c->met.lock);
#undef M
    if (sb.oom) {
        strbuf_free(&sb);
        return NULL;
    }
    return sb.p;
}
