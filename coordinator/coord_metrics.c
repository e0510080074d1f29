/*
 * coordinator/coord_metrics.c — the engine's part of /metrics (Prometheus text): requests,
 * tokens, steps, acceptance and batch histograms, step and draft-wait time, the workers' compute,
 * and the speculator and memory gauges the main loop keeps current. Reads the counters under
 * c->mlock; the HTTP thread calls it through the engine's callback table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/coord.h"

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
    M("# HELP orochi_requests_total Requests taken by the engine.\n# TYPE orochi_requests_total "
      "counter\n"
      "orochi_requests_total %llu\n",
      (unsigned long long)c->m_requests);
    M("# TYPE orochi_requests_failed_total counter\norochi_requests_failed_total %llu\n",
      (unsigned long long)c->m_failed);
    M("# HELP orochi_tokens_generated_total Tokens generated.\n# TYPE "
      "orochi_tokens_generated_total counter\n"
      "orochi_tokens_generated_total %llu\n",
      (unsigned long long)c->m_tokens);
    M("# TYPE orochi_prompt_tokens_total counter\norochi_prompt_tokens_total %llu\n",
      (unsigned long long)c->m_prompt_tokens);
    M("# HELP orochi_steps_total Target forward steps (prefill and verification).\n"
      "# TYPE orochi_steps_total counter\norochi_steps_total %llu\n",
      (unsigned long long)c->m_steps);
    M("# HELP orochi_free_run_tokens_total Tokens the workers decoded free-running (steps the "
      "coordinator did not hand over one by one).\n"
      "# TYPE orochi_free_run_tokens_total counter\norochi_free_run_tokens_total %llu\n",
      (unsigned long long)c->m_free_tokens);
    M("# HELP orochi_prefill_piggyback_tokens_total Tokens decoded in the steps of another "
      "request's prompt (one per greedy request and prompt chunk).\n"
      "# TYPE orochi_prefill_piggyback_tokens_total counter\norochi_prefill_piggyback_tokens_total "
      "%llu\n",
      (unsigned long long)c->m_piggyback_tokens);
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
      "orochi_accepted_per_step_count %llu\n",
      (unsigned long long)count, (unsigned long long)sum, (unsigned long long)count);
    M("# HELP orochi_step_seconds Wall time of target steps, by role.\n# TYPE orochi_step_seconds "
      "summary\n"
      "orochi_step_seconds_sum{role=\"coordinator\"} "
      "%.6f\norochi_step_seconds_count{role=\"coordinator\"} %llu\n",
      c->m_step_seconds, (unsigned long long)c->m_steps);
    for (int i = 0; i < c->n_workers && i < RT_MAX_WORKERS; i++)
        M("orochi_step_seconds_sum{role=\"worker-%d\"} "
          "%.6f\norochi_step_seconds_count{role=\"worker-%d\"} %llu\n",
          i, c->m_worker_compute_us[i] / 1e6, i, (unsigned long long)c->m_worker_steps[i]);
    M("# HELP orochi_batch_size Requests verified together per step.\n# TYPE orochi_batch_size "
      "histogram\n");
    uint64_t bc = 0, bs = 0;
    for (int k = 1; k <= RT_MAX_SEQ; k++) {
        bc += c->m_batch_hist[k];
        bs += (uint64_t)k * c->m_batch_hist[k];
        M("orochi_batch_size_bucket{le=\"%d\"} %llu\n", k, (unsigned long long)bc);
    }
    M("orochi_batch_size_bucket{le=\"+Inf\"} %llu\norochi_batch_size_sum "
      "%llu\norochi_batch_size_count %llu\n",
      (unsigned long long)bc, (unsigned long long)bs, (unsigned long long)bc);
    M("# TYPE orochi_draft_wait_seconds_total counter\norochi_draft_wait_seconds_total %.6f\n",
      c->m_draft_wait_seconds);
    M("# TYPE orochi_peer_restarts_total counter\norochi_peer_restarts_total %llu\n",
      (unsigned long long)c->m_restarts);
    M("%s", c->m_spec_text);
    M("%s", c->m_mem_text);
    pthread_mutex_unlock(&c->mlock);
#undef M
    if (n >= cap)
        s[cap - 1] = 0;
    return s;
}
