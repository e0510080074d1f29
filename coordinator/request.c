/*
 * coordinator/request.c — see request.h. One mutex guards the output side (ids, text, state); a
 * condition variable is broadcast on every change so any number of waiters (normally one HTTP
 * thread) see new text promptly. The cancel flag is an atomic so the engine can poll it in its hot
 * loop without taking the lock. Text and ids grow by doubling; a failed allocation turns the
 * request into a 500 failure rather than silently dropping output. Logprob records are kept flat:
 * one entry per reported token, its alternatives in a shared array and every piece's bytes in one
 * byte pool, each growing by doubling, so a cut (a stop string) just shortens all three.
 */
#define _GNU_SOURCE
#include "coordinator/request.h"
#include "base/buf.h"
#include "model/grammar.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A token of a logprob record as stored: its piece is pool[piece_off .. piece_off + piece_len). */
typedef struct {
    int32_t id;
    float logprob;
    size_t piece_off, piece_len;
} lp_entry;

/* One reported token: its entry, its alternatives at tops[top_at .. top_at + n_top). */
typedef struct {
    lp_entry token;
    size_t text_start;
    int n_top, top_at;
} lp_record;

struct coord_request {
    atomic_int refs;
    atomic_bool cancelled;
    coord_params params;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC; broadcast on append, finish, fail, cancel */
    coord_request_state state;
    int32_t *ids;
    int n_ids, cap_ids;
    char *text; /* always NUL-terminated when non-NULL */
    size_t text_len, text_cap;
    lp_record *lp; /* logprob records; their alternatives; the pieces' bytes */
    int n_lp, cap_lp;
    lp_entry *tops;
    int n_tops, cap_tops;
    char *pool;
    size_t pool_len, pool_cap;
    int http_status;
    char message[COORD_MESSAGE_LEN];
    char finish_reason[16];
    coord_stats stats;
};

static void request_free(coord_request *req);
static int request_set_string(char **slot, const char *s);
static int request_fail_locked(coord_request *req, int http_status, const char *message);

coord_request *coord_request_new(coord_request_kind kind)
{
    coord_request *req = calloc(1, sizeof *req);
    if (!req)
        return NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int cv_rc = pthread_cond_init(&req->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (cv_rc) {
        free(req);
        return NULL;
    }
    if (pthread_mutex_init(&req->mu, NULL)) {
        pthread_cond_destroy(&req->cv);
        free(req);
        return NULL;
    }
    atomic_init(&req->refs, 1);
    atomic_init(&req->cancelled, false);
    req->params = (coord_params){.kind = kind, .max_tokens = 128, .temperature = 1.0, .top_p = 1.0};
    req->state = COORD_REQ_RUNNING;
    return req;
}

coord_request *coord_request_ref(coord_request *req)
{
    if (req)
        atomic_fetch_add_explicit(&req->refs, 1, memory_order_relaxed);
    return req;
}

void coord_request_unref(coord_request **req)
{
    if (!req || !*req)
        return;
    coord_request *r = *req;
    *req = NULL;
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1)
        request_free(r);
}

coord_request *coord_request_clone(coord_request *src, int index)
{
    const coord_params *a = &src->params;
    coord_request *req = coord_request_new(a->kind);
    if (!req)
        return NULL;
    coord_params *b = &req->params;
    *b = *a; /* the numbers; every owned string is copied below */
    b->prompt = b->model = b->options_json = b->chat_vars = b->grammar_text = NULL;
    b->grammar = NULL;
    b->messages = NULL;
    b->n_messages = b->n_stop = 0;
    b->seed = a->seed + index;
    bool ok = !request_set_string(&b->prompt, a->prompt) &&
              !request_set_string(&b->model, a->model) &&
              !request_set_string(&b->options_json, a->options_json) &&
              !request_set_string(&b->chat_vars, a->chat_vars);
    for (int i = 0; ok && i < a->n_messages; i++)
        ok = !coord_request_add_message(req, a->messages[i].role, a->messages[i].content);
    for (int i = 0; ok && i < a->n_stop; i++)
        ok = !coord_request_add_stop(req, a->stop[i]);
    char err[256];
    if (ok && a->grammar_text)
        ok = !coord_request_set_grammar(req, a->grammar_text, strlen(a->grammar_text),
                                        a->constraint, err, sizeof err);
    if (!ok)
        coord_request_unref(&req);
    return req;
}

/* ---- input ----------------------------------------------------------------------------------- */

coord_params *coord_request_params(coord_request *req)
{
    return &req->params;
}

/* Replaces *slot with a copy of s (NULL clears it). */
static int request_set_string(char **slot, const char *s)
{
    char *copy = NULL;
    if (s && !(copy = strdup(s)))
        return -1;
    free(*slot);
    *slot = copy;
    return 0;
}

int coord_request_set_prompt(coord_request *req, const char *text)
{
    return request_set_string(&req->params.prompt, text);
}

int coord_request_set_model(coord_request *req, const char *model)
{
    return request_set_string(&req->params.model, model);
}

int coord_request_set_options(coord_request *req, const char *json)
{
    return request_set_string(&req->params.options_json, json);
}

int coord_request_add_stop(coord_request *req, const char *stop)
{
    coord_params *p = &req->params;
    if (p->n_stop >= COORD_MAX_STOP || !stop)
        return -1;
    if (!(p->stop[p->n_stop] = strdup(stop)))
        return -1;
    p->n_stop++;
    return 0;
}

int coord_request_set_grammar(coord_request *req, const char *text, size_t len,
                              coord_constraint what, char *err, size_t errlen)
{
    coord_params *p = &req->params;
    grammar *g = grammar_parse(text, len, err, errlen);
    if (!g)
        return strcmp(err, "out of memory") ? 1 : -1;
    char *copy = strndup(text, len);
    if (!copy) {
        grammar_free(&g);
        return -1;
    }
    grammar_free(&p->grammar);
    free(p->grammar_text);
    p->grammar = g;
    p->grammar_text = copy;
    p->constraint = what;
    return 0;
}

int coord_request_set_chat_vars(coord_request *req, const char *json)
{
    char *copy = strdup(json);
    if (!copy)
        return -1;
    free(req->params.chat_vars);
    req->params.chat_vars = copy;
    return 0;
}

int coord_request_add_message(coord_request *req, const char *role, const char *content)
{
    coord_params *p = &req->params;
    coord_message *grown = realloc(p->messages, ((size_t)p->n_messages + 1) * sizeof *grown);
    if (!grown)
        return -1;
    p->messages = grown;
    coord_message m = {strdup(role), strdup(content)};
    if (!m.role || !m.content) {
        free(m.role);
        free(m.content);
        return -1;
    }
    p->messages[p->n_messages++] = m;
    return 0;
}

/* ---- output ---------------------------------------------------------------------------------- */

/* Makes room for `more` ids and `extra` text bytes (plus the NUL). */
static int request_reserve(coord_request *req, int more, size_t extra)
{
    size_t cap_ids = (size_t)req->cap_ids;
    if (more > 0 && buf_grow((void **)&req->ids, &cap_ids, (size_t)req->n_ids + (size_t)more,
                             sizeof *req->ids, 64))
        return -1;
    req->cap_ids = (int)cap_ids;
    void *text = req->text;
    if (buf_grow(&text, &req->text_cap, req->text_len + extra + 1, 1, 256))
        return -1;
    req->text = text;
    return 0;
}

int coord_request_append(coord_request *req, const int32_t *ids, int n, const char *text,
                         size_t len)
{
    if (n < 0)
        n = 0;
    pthread_mutex_lock(&req->mu);
    int rc = -1;
    if (req->state != COORD_REQ_RUNNING) {
        /* ended already: ignore */
    } else if (request_reserve(req, n, len)) {
        request_fail_locked(req, 500, "out of memory while collecting generated text");
    } else {
        if (n)
            memcpy(req->ids + req->n_ids, ids, (size_t)n * sizeof *ids);
        req->n_ids += n;
        if (len)
            memcpy(req->text + req->text_len, text, len);
        req->text_len += len;
        req->text[req->text_len] = 0;
        rc = 0;
        /* only a streaming response waits for text; waking a non-streaming waiter on every token
         * would cost a context switch per token on a machine whose cores the workers need */
        if (len && req->params.stream)
            pthread_cond_broadcast(&req->cv);
    }
    pthread_mutex_unlock(&req->mu);
    return rc;
}

/* Room for n more records with `tops` alternatives and `bytes` piece bytes in all. */
static int request_reserve_lp(coord_request *req, int n, int tops, size_t bytes)
{
    size_t cap_lp = (size_t)req->cap_lp, cap_tops = (size_t)req->cap_tops;
    int rc = buf_grow((void **)&req->lp, &cap_lp, (size_t)req->n_lp + n, sizeof *req->lp, 64) ||
             buf_grow((void **)&req->tops, &cap_tops, (size_t)req->n_tops + tops, sizeof *req->tops,
                      256) ||
             buf_grow((void **)&req->pool, &req->pool_cap, req->pool_len + bytes, 1, 1024);
    req->cap_lp = (int)cap_lp;
    req->cap_tops = (int)cap_tops;
    return rc ? -1 : 0;
}

/* Stores one token's entry, its piece copied into the pool (room reserved). */
static lp_entry request_store_lp(coord_request *req, const coord_token_lp *t)
{
    lp_entry e = {.id = t->id,
                  .logprob = t->logprob,
                  .piece_off = req->pool_len,
                  .piece_len = t->piece ? t->piece_len : 0};
    if (e.piece_len)
        memcpy(req->pool + req->pool_len, t->piece, e.piece_len);
    req->pool_len += e.piece_len;
    return e;
}

/* A record's alternatives, within 0..COORD_MAX_TOP_LOGPROBS. */
static int request_top_count(const coord_logprob *lp)
{
    return lp->n_top < 0                        ? 0
           : lp->n_top > COORD_MAX_TOP_LOGPROBS ? COORD_MAX_TOP_LOGPROBS
                                                : lp->n_top;
}

int coord_request_append_logprobs(coord_request *req, const coord_logprob *lp, int n)
{
    int tops = 0;
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        int k = request_top_count(&lp[i]);
        tops += k;
        bytes += lp[i].token.piece ? lp[i].token.piece_len : 0;
        for (int j = 0; j < k; j++)
            bytes += lp[i].top[j].piece ? lp[i].top[j].piece_len : 0;
    }
    pthread_mutex_lock(&req->mu);
    int rc = -1;
    if (req->state != COORD_REQ_RUNNING) {
        /* ended already: ignore */
    } else if (request_reserve_lp(req, n, tops, bytes)) {
        request_fail_locked(req, 500, "out of memory while collecting logprobs");
    } else {
        for (int i = 0; i < n; i++) {
            int k = request_top_count(&lp[i]);
            lp_record *r = &req->lp[req->n_lp++];
            r->token = request_store_lp(req, &lp[i].token);
            r->text_start = lp[i].text_start;
            r->n_top = k;
            r->top_at = req->n_tops;
            for (int j = 0; j < k; j++)
                req->tops[req->n_tops++] = request_store_lp(req, &lp[i].top[j]);
        }
        rc = 0;
    }
    pthread_mutex_unlock(&req->mu);
    return rc;
}

void coord_request_cut_logprobs(coord_request *req, size_t text_end)
{
    pthread_mutex_lock(&req->mu);
    while (req->n_lp > 0 && req->lp[req->n_lp - 1].text_start >= text_end) {
        const lp_record *r = &req->lp[--req->n_lp];
        req->n_tops = r->top_at;
        req->pool_len = r->token.piece_off; /* its piece, then its alternatives' pieces */
    }
    pthread_mutex_unlock(&req->mu);
}

int coord_request_finish(coord_request *req, const char *finish_reason, const coord_stats *stats)
{
    pthread_mutex_lock(&req->mu);
    int rc = -1;
    if (req->state == COORD_REQ_RUNNING) {
        snprintf(req->finish_reason, sizeof req->finish_reason, "%s",
                 finish_reason ? finish_reason : "stop");
        if (stats) {
            req->stats = *stats;
            req->stats.draft_kinds[COORD_DRAFT_KINDS_LEN - 1] = 0;
        } else {
            req->stats = (coord_stats){.completion_tokens = req->n_ids};
        }
        req->state = COORD_REQ_DONE;
        pthread_cond_broadcast(&req->cv);
        rc = 0;
    }
    pthread_mutex_unlock(&req->mu);
    return rc;
}

int coord_request_fail(coord_request *req, int http_status, const char *message)
{
    pthread_mutex_lock(&req->mu);
    int rc = request_fail_locked(req, http_status, message);
    pthread_mutex_unlock(&req->mu);
    return rc;
}

static int request_fail_locked(coord_request *req, int http_status, const char *message)
{
    if (req->state != COORD_REQ_RUNNING)
        return -1;
    req->http_status = http_status >= 400 && http_status <= 599 ? http_status : 500;
    snprintf(req->message, sizeof req->message, "%s", message ? message : "request failed");
    req->state = COORD_REQ_FAILED;
    pthread_cond_broadcast(&req->cv);
    return 0;
}

bool coord_request_cancelled(const coord_request *req)
{
    return atomic_load_explicit(&req->cancelled, memory_order_acquire);
}

/* ---- waiting side ---------------------------------------------------------------------------- */

coord_request_state coord_request_wait(coord_request *req, size_t *text_off, int timeout_ms,
                                       char **piece, size_t *piece_len)
{
    if (piece)
        *piece = NULL;
    if (piece_len)
        *piece_len = 0;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    if (timeout_ms > 0) {
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&req->mu);
    while (req->state == COORD_REQ_RUNNING && req->text_len <= *text_off &&
           !atomic_load(&req->cancelled) && timeout_ms != 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&req->cv, &req->mu);
        else if (pthread_cond_timedwait(&req->cv, &req->mu, &deadline) == ETIMEDOUT)
            break;
    }
    if (req->text_len > *text_off) {
        size_t n = req->text_len - *text_off;
        bool handed = true;
        if (piece && (handed = (*piece = malloc(n + 1)) != NULL)) {
            memcpy(*piece, req->text + *text_off, n);
            (*piece)[n] = 0;
            if (piece_len)
                *piece_len = n;
        }
        if (handed) /* out of memory: the text stays for the next call */
            *text_off = req->text_len;
    }
    coord_request_state st = req->state;
    pthread_mutex_unlock(&req->mu);
    return st;
}

void coord_request_cancel(coord_request *req)
{
    atomic_store_explicit(&req->cancelled, true, memory_order_release);
    pthread_mutex_lock(&req->mu);
    pthread_cond_broadcast(&req->cv);
    pthread_mutex_unlock(&req->mu);
}

coord_request_state coord_request_state_now(coord_request *req)
{
    pthread_mutex_lock(&req->mu);
    coord_request_state st = req->state;
    pthread_mutex_unlock(&req->mu);
    return st;
}

void coord_request_outcome(coord_request *req, coord_outcome *out)
{
    pthread_mutex_lock(&req->mu);
    *out = (coord_outcome){.state = req->state,
                           .http_status = req->http_status,
                           .stats = req->stats,
                           .n_ids = req->n_ids,
                           .text_len = req->text_len,
                           .n_logprobs = req->n_lp};
    memcpy(out->message, req->message, sizeof out->message);
    memcpy(out->finish_reason, req->finish_reason, sizeof out->finish_reason);
    pthread_mutex_unlock(&req->mu);
    out->cancelled = coord_request_cancelled(req);
}

int32_t *coord_request_ids(coord_request *req, int *n)
{
    pthread_mutex_lock(&req->mu);
    int32_t *copy = req->n_ids ? malloc((size_t)req->n_ids * sizeof *copy) : NULL;
    *n = copy ? req->n_ids : 0;
    if (copy)
        memcpy(copy, req->ids, (size_t)req->n_ids * sizeof *copy);
    pthread_mutex_unlock(&req->mu);
    return copy;
}

char *coord_request_text(coord_request *req, size_t *len)
{
    pthread_mutex_lock(&req->mu);
    char *copy = malloc(req->text_len + 1);
    *len = copy ? req->text_len : 0;
    if (copy) {
        if (req->text_len)
            memcpy(copy, req->text, req->text_len);
        copy[req->text_len] = 0;
    }
    pthread_mutex_unlock(&req->mu);
    return copy;
}

coord_logprob *coord_request_logprobs(coord_request *req, int from, int *n)
{
    pthread_mutex_lock(&req->mu);
    if (from < 0)
        from = 0;
    int count = req->n_lp > from ? req->n_lp - from : 0;
    size_t bytes = 0;
    if (count)
        bytes = req->pool_len - req->lp[from].token.piece_off;
    coord_logprob *out = count ? malloc((size_t)count * sizeof *out + bytes + 1) : NULL;
    *n = out ? count : 0;
    if (out) {
        char *pieces = (char *)(out + count);
        size_t base = req->lp[from].token.piece_off;
        if (bytes)
            memcpy(pieces, req->pool + base, bytes);
        for (int i = 0; i < count; i++) {
            const lp_record *r = &req->lp[from + i];
            coord_logprob *o = &out[i];
            o->token = (coord_token_lp){r->token.id, r->token.logprob,
                                        pieces + (r->token.piece_off - base), r->token.piece_len};
            o->text_start = r->text_start;
            o->n_top = r->n_top;
            for (int j = 0; j < r->n_top; j++) {
                const lp_entry *t = &req->tops[r->top_at + j];
                o->top[j] = (coord_token_lp){t->id, t->logprob, pieces + (t->piece_off - base),
                                             t->piece_len};
            }
        }
    }
    pthread_mutex_unlock(&req->mu);
    return out;
}

static void request_free(coord_request *req)
{
    coord_params *p = &req->params;
    free(p->prompt);
    for (int i = 0; i < p->n_messages; i++) {
        free(p->messages[i].role);
        free(p->messages[i].content);
    }
    free(p->messages);
    for (int i = 0; i < p->n_stop; i++)
        free(p->stop[i]);
    free(p->model);
    free(p->options_json);
    grammar_free(&p->grammar);
    free(p->grammar_text);
    free(p->chat_vars);
    free(req->ids);
    free(req->text);
    free(req->lp);
    free(req->tops);
    free(req->pool);
    pthread_cond_destroy(&req->cv);
    pthread_mutex_destroy(&req->mu);
    free(req);
}
