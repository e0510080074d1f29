/*
 * coordinator/coord_status.c — the group's status as JSON, for `GET /status` and the dashboard of
 * the page at `/` (docs/http-api.md, "Status"; docs/page.md).
 *
 * It says what the status file says (coord_group_write_status: each process with its pid, uptime,
 * heartbeat, steps, restarts, step time; each speculator's kind, acceptance and vote weight; the
 * controllers), plus each process's memory and the live counters a client turns into rates (tokens
 * per step, tokens per second) by taking differences between two answers.
 *
 * Two threads meet here. The peers and the controllers belong to the main loop, so the main loop
 * builds the picture of them (coord_status_poll, twice a second, as often as the status file) and
 * leaves it in c->met under c->met.lock. An HTTP thread (coord_engine_status, through the server's
 * callback table) copies that picture under the same lock, adds the counters as they are at that
 * moment, and prints it; it never looks at a peer.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/coord.h"

#define STATUS_EVERY_US 500000u /* as often as the status file is rewritten */

/* ---- memory ---------------------------------------------------------------------------------- */

/* The memory of role `name` from the gauges coord_group_memory_gauges leaves in c->met.mem_text
 * (rebuilt every 10 s; reading smaps_rollup walks page tables, so it is not read again here):
 * {"files":B,"arena":B,"private":B}, or NULL when the role has no gauge (not running here).
 * Caller holds c->met.lock. */
static cJSON *status_memory(const coord *c, const char *name)
{
    cJSON *m = NULL;
    char want[96];
    int n = snprintf(want, sizeof want, "orochi_memory_pss_bytes{role=\"%s\",kind=\"", name);
    if (n <= 0 || (size_t)n >= sizeof want)
        return NULL;
    for (const char *line = c->met.mem_text; line && *line;) {
        const char *end = strchr(line, '\n');
        if (!strncmp(line, want, (size_t)n)) {
            const char *kind = line + n, *q = strchr(kind, '"');
            char key[16];
            if (q && q - kind < (long)sizeof key && q[1] == '}' && q[2] == ' ') {
                memcpy(key, kind, (size_t)(q - kind));
                key[q - kind] = 0;
                if (!m)
                    m = cJSON_CreateObject();
                cJSON_AddNumberToObject(m, key, strtod(q + 3, NULL));
            }
        }
        line = end ? end + 1 : NULL;
    }
    return m;
}

/* ---- the picture the main loop builds -------------------------------------------------------- */

static void status_error(cJSON *o, const char *err, uint64_t at_us, uint64_t now)
{
    if (!err[0])
        return;
    cJSON_AddStringToObject(o, "last_error", err);
    cJSON_AddNumberToObject(o, "last_error_age_s", (double)(now - at_us) / 1e6);
}

static cJSON *status_peer(const coord *c, const coord_peer *p, uint64_t now)
{
    cJSON *o = cJSON_CreateObject();
    bool spec = p->role == PEER_SPECULATOR;
    cJSON_AddStringToObject(o, "name", p->name);
    cJSON_AddStringToObject(o, "role", spec ? "speculator" : "worker");
    cJSON_AddNumberToObject(o, "pid", (double)(p->child ? p->child : p->pid));
    const char *state = p->connected   ? "up"
                        : p->detaching ? "detaching"
                        : p->child     ? "starting"
                                       : "down";
    cJSON_AddStringToObject(o, "state", state);
    cJSON_AddNumberToObject(o, "restarts", p->restarts);
    if (p->swaps || p->swap)
        cJSON_AddNumberToObject(o, "swaps", p->swaps);
    if (!spec && p->index >= 0 && p->index < RT_MAX_WORKERS && c->opt.worker_device[p->index][0])
        cJSON_AddStringToObject(o, "device", c->opt.worker_device[p->index]);
    if (spec)
        cJSON_AddStringToObject(o, "kind", p->kind);
    if (p->connected) {
        cJSON_AddNumberToObject(o, "uptime_s", (double)(now - p->started_us) / 1e6);
        cJSON_AddNumberToObject(o, "heartbeat_ms", (double)(now - p->last_hb_us) / 1e3);
        cJSON_AddNumberToObject(o, "steps", (double)p->hb_steps);
        if (spec) {
            cJSON_AddNumberToObject(o, "acr", p->acr.acr);
            cJSON_AddNumberToObject(o, "weight", p->acr.weight);
            cJSON_AddNumberToObject(o, "draft_ms", p->draft_work_ema_us / 1e3);
            cJSON_AddNumberToObject(o, "reply_ms", p->reply_ema_us / 1e3);
            cJSON_AddNumberToObject(o, "accepted_per_step", p->accept_ema);
            cJSON_AddNumberToObject(o, "drafted_tokens", (double)p->drafted);
            cJSON_AddNumberToObject(o, "accepted_tokens", (double)p->accepted);
            cJSON_AddNumberToObject(o, "benched", (double)p->benched_total);
            if (p->placement[0])
                cJSON_AddStringToObject(o, "placement", p->placement);
        } else {
            cJSON_AddNumberToObject(o, "step_ms", p->step_ema_us / 1e3);
            cJSON_AddNumberToObject(o, "barrier_ms", p->wait_ema_us / 1e3);
        }
    }
    status_error(o, p->last_error, p->last_error_us, now);
    return o;
}

static cJSON *status_controllers(const coord *c)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "width", c->width);
    cJSON_AddNumberToObject(o, "speculation_length", c->spec_len);
    cJSON_AddBoolToObject(o, "tree", c->opt.tree);
    cJSON_AddStringToObject(o, "vote",
                            c->opt.vote == VOTE_MAJORITY ? "majority"
                            : c->opt.vote == VOTE_UNION  ? "union"
                                                         : "off");
    cJSON_AddBoolToObject(o, "adaptive", c->opt.adaptive);
    cJSON_AddStringToObject(o, "guard",
                            !c->opt.guard_enabled ? "disabled"
                            : c->guard.on         ? "on"
                                                  : "off");
    cJSON_AddNumberToObject(o, "plain_ms_per_token", c->guard.base * 1e3);
    cJSON_AddNumberToObject(o, "speculative_ms_per_token", c->guard.spec * 1e3);
    if (c->opt.plan_path)
        cJSON_AddStringToObject(o, "plan", c->opt.plan_path);
    else
        cJSON_AddNullToObject(o, "plan");
    return o;
}

/* The picture of the group as the main loop sees it now; NULL when out of memory. */
static cJSON *status_build(coord *c)
{
    uint64_t now = rt_now_us();
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    cJSON_AddStringToObject(root, "object", "orochi.status");
    cJSON_AddStringToObject(root, "model", c->model_name);
    cJSON *procs = cJSON_AddArrayToObject(root, "processes");
    cJSON *co = cJSON_CreateObject();
    cJSON_AddStringToObject(co, "name", "coordinator");
    cJSON_AddStringToObject(co, "role", "coordinator");
    cJSON_AddNumberToObject(co, "pid", (double)getpid());
    cJSON_AddStringToObject(co, "state", "up");
    cJSON_AddNumberToObject(co, "uptime_s", (double)(now - c->grp.started_us) / 1e6);
    cJSON_AddNumberToObject(co, "step_ms", c->step_ema_us / 1e3);
    cJSON_AddBoolToObject(co, "tracing", c->tracer != NULL);
    cJSON_AddItemToArray(procs, co);
    for (int i = 0; i < COORD_MAX_PEERS; i++) /* workers first, then speculators */
        if (c->grp.peers[i].role == PEER_WORKER)
            cJSON_AddItemToArray(procs, status_peer(c, &c->grp.peers[i], now));
    for (int i = 0; i < COORD_MAX_PEERS; i++)
        if (c->grp.peers[i].role == PEER_SPECULATOR)
            cJSON_AddItemToArray(procs, status_peer(c, &c->grp.peers[i], now));
    cJSON_AddItemToObject(root, "controllers", status_controllers(c));
    cJSON *slots = cJSON_AddObjectToObject(root, "slots");
    if (slots) {
        cJSON_AddNumberToObject(slots, "slots", c->opt.n_seq);
        cJSON_AddNumberToObject(slots, "active", c->met.slots_active);
        cJSON_AddNumberToObject(slots, "kv_bytes_held", (double)c->met.kv_held);
        cJSON_AddNumberToObject(slots, "kv_bytes_full", (double)c->met.kv_full);
        cJSON_AddNumberToObject(slots, "kv_bytes_lent", (double)c->met.kv_lent);
    }

    pthread_mutex_lock(&c->met.lock);
    cJSON_AddNumberToObject(co, "steps", (double)c->met.steps);
    status_error(co, c->met.last_error, c->met.last_error_us, now);
    cJSON *p;
    cJSON_ArrayForEach(p, procs)
    {
        cJSON *mem = status_memory(c, cJSON_GetStringValue(cJSON_GetObjectItem(p, "name")));
        if (mem)
            cJSON_AddItemToObject(p, "memory", mem);
    }
    pthread_mutex_unlock(&c->met.lock);
    return root;
}

void coord_status_poll(coord *c)
{
    uint64_t now = rt_now_us();
    if (c->met.status && now - c->met.status_us < STATUS_EVERY_US)
        return;
    cJSON *fresh = status_build(c);
    c->met.status_us = now;
    if (!fresh)
        return; /* out of memory: the last picture stays */
    pthread_mutex_lock(&c->met.lock);
    cJSON *old = c->met.status;
    c->met.status = fresh;
    pthread_mutex_unlock(&c->met.lock);
    cJSON_Delete(old);
}

void coord_status_fini(coord *c)
{
    pthread_mutex_lock(&c->met.lock);
    cJSON *old = c->met.status;
    c->met.status = NULL;
    pthread_mutex_unlock(&c->met.lock);
    cJSON_Delete(old);
}

/* ---- the answer an HTTP thread gives ------------------------------------------------------- */

char *coord_engine_status(void *ctx)
{
    coord *c = ctx;
    uint64_t now = rt_now_us();
    pthread_mutex_lock(&c->met.lock);
    cJSON *root = c->met.status ? cJSON_Duplicate(c->met.status, true) : NULL;
    cJSON *k = root ? cJSON_AddObjectToObject(root, "counters") : NULL;
    if (k) {
        /* a request's verification steps, each counted once per request it served, and the
         * tokens they gave it: the drafted tokens accepted plus the target's own one */
        uint64_t dsteps = 0, dtokens = 0;
        for (int a = 0; a <= RT_MAX_WIDTH; a++) {
            dsteps += c->met.accept_hist[a];
            dtokens += (uint64_t)(a + 1) * c->met.accept_hist[a];
        }
        /* grp.started_us is set once, before the HTTP server starts */
        cJSON_AddNumberToObject(k, "time_s", (double)(now - c->grp.started_us) / 1e6);
        cJSON_AddNumberToObject(k, "requests", (double)c->met.requests);
        cJSON_AddNumberToObject(k, "failed", (double)c->met.failed);
        cJSON_AddNumberToObject(k, "steps", (double)c->met.steps);
        cJSON_AddNumberToObject(k, "decode_steps", (double)dsteps);
        cJSON_AddNumberToObject(k, "decode_tokens", (double)dtokens);
        cJSON_AddNumberToObject(k, "tokens", (double)c->met.tokens);
        cJSON_AddNumberToObject(k, "prompt_tokens", (double)c->met.prompt_tokens);
        cJSON_AddNumberToObject(k, "free_run_tokens", (double)c->met.free_tokens);
        cJSON_AddNumberToObject(k, "restarts", (double)c->met.restarts);
        /* the latest cycles, oldest first: [seq, t_ms, requests, rows, tokens, ms, steps] */
        cJSON *rs = cJSON_AddArrayToObject(root, "recent_steps");
        uint64_t n = c->met.n_recent, from = n > COORD_RECENT_STEPS ? n - COORD_RECENT_STEPS : 0;
        for (uint64_t i = from; i < n; i++) {
            const coord_step_rec *r = &c->met.recent[i % COORD_RECENT_STEPS];
            const double v[] = {(double)r->seq, r->t_ms,   r->requests,
                                r->rows,        r->tokens, (double)(int)(r->ms * 100 + 0.5) / 100,
                                r->steps};
            cJSON_AddItemToArray(rs, cJSON_CreateDoubleArray(v, 7));
        }
    }
    pthread_mutex_unlock(&c->met.lock);
    if (!root)
        return NULL;
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    char *out = text ? strdup(text) : NULL; /* the server frees it with free() */
    cJSON_free(text);
    return out;
}
