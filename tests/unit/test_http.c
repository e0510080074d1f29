/*
 * tests/unit/test_http.c — the coordinator's HTTP API against a fake engine, over real sockets.
 *
 * The fake engine is a thread that answers each submitted request with a fixed sequence of text
 * pieces (one id each, one of them the first half of a UTF-8 character) and finishes it; a few
 * magic prompts make it fail at once, fail after some text, trickle text until cancelled, or
 * never answer. Its submit callback refuses prompts longer than FAKE_CONTEXT bytes with 413, the
 * way the real engine refuses prompts longer than the model context.
 *
 * The server is started on an ephemeral port per test; requests go through cli/http_client (so the
 * client library is tested too) or, for malformed traffic, through raw sockets. Besides the happy
 * paths the tests check every validation error's status and message, streaming (SSE events,
 * reassembled text, [DONE]), authentication, body limits, metrics, client hang-up cancelling the
 * engine's work, server stop with a request in flight, and that the server keeps serving after
 * all of it. The request object is also tested directly.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/http_client.h"
#include "coordinator/http.h"
#include "coordinator/request.h"

#define FAKE_CONTEXT 64 /* prompts longer than this many bytes are refused with 413 */
#define FAKE_QUEUE 64
#define TIMEOUT_MS 10000

/* The canned answer: "Hello, wérld!" with é split across two pieces. */
static const char *const PIECES[] = {"Hello", ",", " w", "\xC3", "\xA9", "rld", "!"};
#define N_PIECES 7
#define FULL_TEXT "Hello, w\xC3\xA9rld!"

/* ==== fake engine ============================================================================= */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    coord_request *queue[FAKE_QUEUE];
    int n_queued;
    coord_request *parked[FAKE_QUEUE]; /* "hang" requests: never answered until shutdown */
    int n_parked;
    bool stop, healthy;
    pthread_t thread;
    atomic_int cancels_seen, submitted;
    /* the parameters of the last request, to check parsing */
    coord_params last;
    char last_options[256], last_stop0[32], last_model[64], last_messages[256];
} fake_engine;

static const char *fake_prompt(const coord_params *p)
{
    if (p->kind == COORD_REQ_COMPLETION)
        return p->prompt;
    return p->n_messages ? p->messages[p->n_messages - 1].content : "";
}

static size_t fake_prompt_len(const coord_params *p)
{
    if (p->kind == COORD_REQ_COMPLETION)
        return strlen(p->prompt);
    size_t n = 0;
    for (int i = 0; i < p->n_messages; i++)
        n += strlen(p->messages[i].content);
    return n;
}

static int fake_submit(void *ctx, coord_request *req)
{
    fake_engine *f = ctx;
    const coord_params *p = coord_request_params(req);
    atomic_fetch_add(&f->submitted, 1);
    size_t len = fake_prompt_len(p);
    if (len > FAKE_CONTEXT) {
        char msg[128];
        snprintf(msg, sizeof msg, "prompt of %zu tokens exceeds the context of %d", len, FAKE_CONTEXT);
        coord_request_fail(req, 413, msg);
        return -1;
    }
    pthread_mutex_lock(&f->mu);
    f->last = *p;
    snprintf(f->last_options, sizeof f->last_options, "%s", p->options_json ? p->options_json : "");
    snprintf(f->last_stop0, sizeof f->last_stop0, "%s", p->n_stop ? p->stop[0] : "");
    snprintf(f->last_model, sizeof f->last_model, "%s", p->model ? p->model : "");
    f->last_messages[0] = 0;
    for (int i = 0; i < p->n_messages; i++) {
        size_t used = strlen(f->last_messages);
        snprintf(f->last_messages + used, sizeof f->last_messages - used, "%s:%s|",
                 p->messages[i].role, p->messages[i].content);
    }
    int rc = 0;
    if (!strcmp(fake_prompt(p), "hang") && f->n_parked < FAKE_QUEUE) {
        f->parked[f->n_parked++] = coord_request_ref(req);
    } else if (f->n_queued < FAKE_QUEUE) {
        f->queue[f->n_queued++] = coord_request_ref(req);
        pthread_cond_signal(&f->cv);
    } else {
        coord_request_fail(req, 503, "the fake engine's queue is full");
        rc = -1;
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static void fake_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The fake logprob record of piece n, whose text begins at byte `at`: logprob -(n+1)/4, and the
 * alternatives the request asks for: the token itself first, then "B", "C", ... one less each; for
 * the last piece "A", "B", ... all likelier than the token (which a completions answer then adds
 * to its alternatives). All values are exact in binary, so the answers can be compared exactly. */
static coord_logprob fake_logprob(const coord_params *p, int n, size_t at)
{
    static const char LETTERS[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    coord_logprob lp = {.token = {10 + n, -0.25f * (float)(n + 1), PIECES[n], strlen(PIECES[n])},
                        .text_start = at,
                        .n_top = p->top_logprobs};
    bool last = n == N_PIECES - 1;
    for (int j = 0; j < lp.n_top; j++) {
        float v =
            last ? lp.token.logprob + 0.5f * (float)(lp.n_top - j) : lp.token.logprob - (float)j;
        lp.top[j] = j == 0 && !last ? lp.token : (coord_token_lp){200 + j, v, LETTERS + j, 1};
    }
    return lp;
}

static void fake_run_one(fake_engine *f, coord_request *req)
{
    const coord_params *p = coord_request_params(req);
    const char *prompt = fake_prompt(p);
    if (!strcmp(prompt, "fail-now")) {
        coord_request_fail(req, 503, "the engine is overloaded");
        return;
    }
    if (!strcmp(prompt, "fail-midway")) {
        int32_t id = 99;
        coord_request_append(req, &id, 1, "partial", 7);
        fake_sleep_ms(20);
        coord_request_fail(req, 500, "worker 1 died");
        return;
    }
    if (!strcmp(prompt, "slow")) {
        for (int i = 0; i < 500 && !coord_request_cancelled(req); i++) {
            int32_t id = 1000 + i;
            coord_request_append(req, &id, 1, " tick", 5);
            fake_sleep_ms(20);
        }
        if (coord_request_cancelled(req))
            atomic_fetch_add(&f->cancels_seen, 1);
        coord_request_finish(req, "stop", NULL);
        return;
    }
    if (!strcmp(prompt, "stop-cut")) {
        /* as the engine does when a stop string begins at byte 8 ("Hello, w|..."): the records of
         * every token went first, the text after the cut was held back, the cut drops the records
         * of the tokens that begin at or after it */
        size_t at = 0;
        for (int i = 0; i < N_PIECES && p->logprobs; i++) {
            coord_logprob lp = fake_logprob(p, i, at);
            coord_request_append_logprobs(req, &lp, 1);
            at += strlen(PIECES[i]);
        }
        for (int i = 0; i < 3; i++) {
            int32_t id = 10 + i;
            coord_request_append(req, &id, 1, PIECES[i], strlen(PIECES[i]));
            if (p->stream)
                fake_sleep_ms(2);
        }
        coord_request_cut_logprobs(req, 8);
        coord_request_finish(req, "stop", NULL);
        return;
    }
    if (!strcmp(prompt, "sleepy"))
        fake_sleep_ms(1500);
    int n = 0;
    size_t at = 0;
    for (; n < N_PIECES && n < p->max_tokens; n++) {
        int32_t id = 10 + n;
        if (p->logprobs) { /* the record goes before the text it starts in */
            coord_logprob lp = fake_logprob(p, n, at);
            coord_request_append_logprobs(req, &lp, 1);
        }
        at += strlen(PIECES[n]);
        coord_request_append(req, &id, 1, PIECES[n], strlen(PIECES[n]));
        if (p->stream)
            fake_sleep_ms(2); /* give the stream a chance to send pieces separately */
    }
    coord_stats st = {.prompt_tokens = (int)fake_prompt_len(p), .completion_tokens = n,
                      .steps = (n + 1) / 2, .mean_accepted = n ? (double)n / ((n + 1) / 2) : 0};
    snprintf(st.draft_kinds, sizeof st.draft_kinds, "ngram,model");
    coord_request_finish(req, n == p->max_tokens ? "length" : "stop", &st);
}

static void *fake_main(void *arg)
{
    fake_engine *f = arg;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (!f->stop && !f->n_queued)
            pthread_cond_wait(&f->cv, &f->mu);
        if (f->stop)
            break;
        coord_request *req = f->queue[0];
        memmove(f->queue, f->queue + 1, (size_t)--f->n_queued * sizeof *f->queue);
        pthread_mutex_unlock(&f->mu);
        fake_run_one(f, req);
        coord_request_unref(&req);
        pthread_mutex_lock(&f->mu);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

static char *fake_metrics(void *ctx)
{
    fake_engine *f = ctx;
    char buf[256];
    snprintf(buf, sizeof buf,
             "# TYPE fake_engine_submitted_total counter\nfake_engine_submitted_total %d\n",
             atomic_load(&f->submitted));
    return strdup(buf);
}

static int fake_health(void *ctx, char *msg, size_t len)
{
    fake_engine *f = ctx;
    pthread_mutex_lock(&f->mu);
    bool ok = f->healthy;
    pthread_mutex_unlock(&f->mu);
    if (!ok)
        snprintf(msg, len, "no workers connected");
    return ok;
}

/* /status: a fixed object; none (503) while the engine is unhealthy */
static char *fake_status(void *ctx)
{
    fake_engine *f = ctx;
    pthread_mutex_lock(&f->mu);
    bool ok = f->healthy;
    pthread_mutex_unlock(&f->mu);
    return ok ? strdup("{\"object\":\"orochi.status\",\"processes\":[{\"name\":\"coordinator\"}]}")
              : NULL;
}

static void fake_start(fake_engine *f)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    f->healthy = true;
    assert_int_equal(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

static void fake_stop(fake_engine *f)
{
    pthread_mutex_lock(&f->mu);
    f->stop = true;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    pthread_join(f->thread, NULL);
    for (int i = 0; i < f->n_queued; i++) {
        coord_request_fail(f->queue[i], 503, "shutting down");
        coord_request_unref(&f->queue[i]);
    }
    for (int i = 0; i < f->n_parked; i++) {
        coord_request_fail(f->parked[i], 503, "shutting down");
        coord_request_unref(&f->parked[i]);
    }
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
}

/* ==== fixture ================================================================================= */

typedef struct {
    fake_engine eng;
    http_server *srv;
    char url[64];
    int port;
} fixture;

static int fx_setup(void **state, http_config cfg)
{
    fixture *fx = calloc(1, sizeof *fx);
    fake_start(&fx->eng);
    http_engine e = {.ctx = &fx->eng,
                     .submit = fake_submit,
                     .metrics = fake_metrics,
                     .health = fake_health,
                     .status = fake_status};
    cfg.model_name = "test-model";
    cfg.quiet = true;
    char err[256];
    fx->srv = http_server_start(&cfg, &e, err, sizeof err);
    if (!fx->srv)
        fail_msg("http_server_start: %s", err);
    fx->port = http_server_port(fx->srv);
    assert_true(fx->port > 0);
    snprintf(fx->url, sizeof fx->url, "http://127.0.0.1:%d", fx->port);
    *state = fx;
    return 0;
}

static int setup_default(void **state)
{
    return fx_setup(state, (http_config){0});
}

static int setup_small_body(void **state)
{
    return fx_setup(state, (http_config){.max_body_bytes = 4096});
}

static int setup_auth(void **state)
{
    return fx_setup(state, (http_config){.api_key = "sekrit"});
}

static int setup_short_idle(void **state)
{
    return fx_setup(state, (http_config){.idle_timeout_s = 1});
}

static int setup_short_header(void **state)
{
    return fx_setup(state, (http_config){.header_timeout_s = 1});
}

static int setup_small_budget(void **state)
{
    return fx_setup(state, (http_config){.max_connections = 64, .header_timeout_s = 30});
}

static int fx_teardown(void **state)
{
    fixture *fx = *state;
    http_server_stop(&fx->srv);
    assert_null(fx->srv);
    fake_stop(&fx->eng);
    free(fx);
    return 0;
}

/* ==== client helpers ========================================================================== */

/* One request; returns the status and the collected body (free with hcli_response_free). */
static int http_call(const fixture *fx, const char *method, const char *path, const char *body,
                     const char *key, hcli_response *resp)
{
    hcli_request rq = {.method = method, .path = path, .api_key = key, .body = body,
                       .body_len = body ? strlen(body) : 0, .timeout_ms = TIMEOUT_MS};
    char err[256];
    int rc = hcli_do(fx->url, &rq, resp, err, sizeof err);
    if (rc)
        fail_msg("%s %s: %s", method ? method : "?", path, err);
    return resp->status;
}

/* POST a JSON body; returns the parsed answer (caller deletes) and the status. */
static cJSON *post_json(const fixture *fx, const char *path, const char *body, int *status)
{
    hcli_response resp;
    *status = http_call(fx, "POST", path, body, NULL, &resp);
    assert_non_null(resp.body);
    cJSON *js = cJSON_Parse(resp.body);
    if (!js)
        fail_msg("answer is not JSON: %s", resp.body);
    hcli_response_free(&resp);
    return js;
}

static const cJSON *jget(const cJSON *obj, const char *path)
{
    /* "a.b.0.c": members and array indices */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *cur = obj;
    for (char *save = NULL, *tok = strtok_r(buf, ".", &save); tok && cur;
         tok = strtok_r(NULL, ".", &save))
        cur = (*tok >= '0' && *tok <= '9') ? cJSON_GetArrayItem(cur, atoi(tok))
                                           : cJSON_GetObjectItemCaseSensitive(cur, tok);
    return cur;
}

static const char *jstr(const cJSON *obj, const char *path)
{
    const cJSON *v = jget(obj, path);
    if (!cJSON_IsString(v))
        fail_msg("%s is not a string", path);
    return v->valuestring;
}

static double jnum(const cJSON *obj, const char *path)
{
    const cJSON *v = jget(obj, path);
    if (!cJSON_IsNumber(v))
        fail_msg("%s is not a number", path);
    return v->valuedouble;
}

/* Expects an OpenAI-style error with `status`, a message containing `needle`, and `param`
 * (NULL: null). */
static void expect_error(const fixture *fx, const char *path, const char *body, int status,
                         const char *needle, const char *param)
{
    int got;
    cJSON *js = post_json(fx, path, body, &got);
    if (got != status)
        fail_msg("body %s: status %d, wanted %d (%s)", body, got, status,
                 cJSON_PrintUnformatted(js));
    const char *msg = jstr(js, "error.message");
    if (!strstr(msg, needle))
        fail_msg("body %s: message '%s' lacks '%s'", body, msg, needle);
    const char *type = jstr(js, "error.type");
    assert_string_equal(type, status >= 500 ? "server_error" : "invalid_request_error");
    const cJSON *p = jget(js, "error.param");
    if (param) {
        if (!cJSON_IsString(p) || strcmp(p->valuestring, param))
            fail_msg("body %s: param %s, wanted %s", body, cJSON_PrintUnformatted(p), param);
    } else {
        assert_true(cJSON_IsNull(p));
    }
    cJSON_Delete(js);
}

/* POST a body of `len` bytes (it may hold NULs); returns the parsed answer and the status. */
static cJSON *post_raw(const fixture *fx, const char *path, const char *body, size_t len,
                       int *status)
{
    hcli_request rq = {
        .method = "POST", .path = path, .body = body, .body_len = len, .timeout_ms = TIMEOUT_MS};
    hcli_response resp;
    char err[256];
    if (hcli_do(fx->url, &rq, &resp, err, sizeof err))
        fail_msg("POST %s: %s", path, err);
    *status = resp.status;
    cJSON *js = resp.body ? cJSON_Parse(resp.body) : NULL;
    if (!js)
        fail_msg("answer is not JSON: %s", resp.body ? resp.body : "(none)");
    hcli_response_free(&resp);
    return js;
}

/* Like expect_error, and the error's code must be `code` (NULL: null). */
static void expect_error_code(const fixture *fx, const char *path, const char *body, size_t len,
                              int status, const char *needle, const char *param, const char *code)
{
    int got;
    cJSON *js = post_raw(fx, path, body, len, &got);
    if (got != status)
        fail_msg("body %s: status %d, wanted %d (%s)", body, got, status,
                 cJSON_PrintUnformatted(js));
    const char *msg = jstr(js, "error.message");
    if (!strstr(msg, needle))
        fail_msg("body %s: message '%s' lacks '%s'", body, msg, needle);
    assert_string_equal(jstr(js, "error.type"), "invalid_request_error");
    const cJSON *p = jget(js, "error.param");
    if (param ? !cJSON_IsString(p) || strcmp(p->valuestring, param) : !cJSON_IsNull(p))
        fail_msg("body %s: param %s, wanted %s", body, cJSON_PrintUnformatted(p),
                 param ? param : "null");
    const cJSON *c = jget(js, "error.code");
    if (code ? !cJSON_IsString(c) || strcmp(c->valuestring, code) : !cJSON_IsNull(c))
        fail_msg("body %s: code %s, wanted %s", body, cJSON_PrintUnformatted(c),
                 code ? code : "null");
    cJSON_Delete(js);
}

/* A TCP connection to the server on this machine's loopback port. */
static int connect_local(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* Raw bytes to the server; collects the answer until the server closes or nothing arrives for
 * wait_ms. */
static size_t raw_exchange(int port, const char *data, size_t len, char *out, size_t cap, int wait_ms)
{
    int fd = connect_local(port);
    struct timeval tv = {wait_ms / 1000, (wait_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (len)
        assert_int_equal(send(fd, data, len, MSG_NOSIGNAL), (ssize_t)len);
    size_t n = 0;
    ssize_t got;
    while (n + 1 < cap && (got = recv(fd, out + n, cap - 1 - n, 0)) > 0)
        n += (size_t)got;
    out[n] = 0;
    close(fd);
    return n;
}

/* A good request after whatever came before: the server still serves. */
static void expect_still_serving(const fixture *fx)
{
    int status;
    cJSON *js = post_json(fx, "/v1/completions", "{\"prompt\":\"still there?\"}", &status);
    assert_int_equal(status, 200);
    assert_string_equal(jstr(js, "choices.0.text"), FULL_TEXT);
    cJSON_Delete(js);
}

/* ==== the request object ====================================================================== */

typedef struct {
    coord_request *req;
} producer_arg;

static void *producer(void *arg)
{
    coord_request *req = ((producer_arg *)arg)->req;
    for (int i = 0; i < 50; i++) {
        int32_t id = i;
        char t[8];
        snprintf(t, sizeof t, "%d,", i);
        coord_request_append(req, &id, 1, t, strlen(t));
        if (i % 10 == 0)
            fake_sleep_ms(1);
    }
    coord_stats st = {.prompt_tokens = 3, .completion_tokens = 50, .steps = 10, .mean_accepted = 5};
    snprintf(st.draft_kinds, sizeof st.draft_kinds, "model");
    coord_request_finish(req, "length", &st);
    return NULL;
}

static void test_request_object(void **state)
{
    (void)state;
    coord_request *req = coord_request_new(COORD_REQ_COMPLETION);
    assert_non_null(req);
    coord_params *p = coord_request_params(req);
    assert_int_equal(p->max_tokens, 128);
    assert_true(p->temperature == 1.0 && p->top_p == 1.0 && p->top_k == 0 && !p->has_seed);
    assert_int_equal(coord_request_set_prompt(req, "abc"), 0);
    for (int i = 0; i < COORD_MAX_STOP; i++)
        assert_int_equal(coord_request_add_stop(req, "x"), 0);
    assert_int_equal(coord_request_add_stop(req, "one too many"), -1);

    /* nothing yet: a zero timeout just looks, a short one times out */
    size_t off = 0;
    char *piece;
    size_t plen;
    assert_int_equal(coord_request_wait(req, &off, 0, &piece, &plen), COORD_REQ_RUNNING);
    assert_null(piece);
    assert_int_equal(coord_request_wait(req, &off, 30, &piece, &plen), COORD_REQ_RUNNING);
    assert_null(piece);

    /* a producer thread; the waiter reassembles everything in order */
    pthread_t t;
    producer_arg arg = {coord_request_ref(req)};
    assert_int_equal(pthread_create(&t, NULL, producer, &arg), 0);
    char all[512] = "";
    coord_request_state st;
    do {
        st = coord_request_wait(req, &off, -1, &piece, &plen);
        if (piece) {
            assert_int_equal(strlen(piece), plen);
            strcat(all, piece);
            free(piece);
        }
    } while (st == COORD_REQ_RUNNING);
    pthread_join(t, NULL);
    coord_request_unref(&arg.req);
    assert_null(arg.req);
    assert_int_equal(st, COORD_REQ_DONE);
    char want[512] = "";
    for (int i = 0; i < 50; i++)
        sprintf(want + strlen(want), "%d,", i);
    assert_string_equal(all, want);
    assert_int_equal(off, strlen(want));

    coord_outcome o;
    coord_request_outcome(req, &o);
    assert_int_equal(o.state, COORD_REQ_DONE);
    assert_string_equal(o.finish_reason, "length");
    assert_int_equal(o.stats.steps, 10);
    assert_string_equal(o.stats.draft_kinds, "model");
    assert_int_equal(o.n_ids, 50);
    int n;
    int32_t *ids = coord_request_ids(req, &n);
    assert_int_equal(n, 50);
    assert_int_equal(ids[49], 49);
    free(ids);

    /* ended: further output is refused */
    int32_t id = 7;
    coord_logprob late = {.token = {7, -1.0f, "x", 1}};
    assert_int_equal(coord_request_append_logprobs(req, &late, 1), -1);
    assert_int_equal(coord_request_append(req, &id, 1, "x", 1), -1);
    assert_int_equal(coord_request_fail(req, 500, "late"), -1);
    assert_int_equal(coord_request_finish(req, "stop", NULL), -1);
    coord_request_unref(&req);
    assert_null(req);

    /* logprob records: pieces copied, alternatives kept, a cut drops the tail, copies from an
     * index on */
    req = coord_request_new(COORD_REQ_COMPLETION);
    coord_logprob recs[3] = {
        {.token = {1, -0.5f, "ab", 2},
         .text_start = 0,
         .n_top = 2,
         .top = {{1, -0.5f, "ab", 2}, {2, -1.5f, "\xC3", 1}}},
        {.token = {3, -2.0f, "cd", 2}, .text_start = 2, .n_top = 1, .top = {{4, -0.25f, "", 0}}},
        {.token = {5, -3.0f, "<|im_end|>", 10}, .text_start = 4},
    };
    assert_int_equal(coord_request_append_logprobs(req, recs, 2), 0);
    assert_int_equal(coord_request_append_logprobs(req, recs + 2, 1), 0);
    coord_request_outcome(req, &o);
    assert_int_equal(o.n_logprobs, 3);
    coord_logprob *got = coord_request_logprobs(req, 1, &n);
    assert_int_equal(n, 2);
    assert_int_equal(got[0].token.id, 3);
    assert_true(got[0].token.logprob == -2.0f && got[0].text_start == 2 && got[0].n_top == 1);
    assert_int_equal(got[0].top[0].id, 4);
    assert_int_equal(got[0].top[0].piece_len, 0);
    assert_int_equal(got[1].token.piece_len, 10);
    assert_memory_equal(got[1].token.piece, "<|im_end|>", 10);
    free(got);
    coord_request_cut_logprobs(req, 2); /* a stop string at byte 2: tokens from there on go */
    got = coord_request_logprobs(req, 0, &n);
    assert_int_equal(n, 1);
    assert_memory_equal(got[0].token.piece, "ab", 2);
    assert_int_equal(got[0].n_top, 2);
    assert_memory_equal(got[0].top[1].piece, "\xC3", 1);
    assert_true(got[0].top[1].logprob == -1.5f);
    free(got);
    assert_null(coord_request_logprobs(req, 1, &n));
    assert_int_equal(n, 0);
    /* after a cut the pool is reused: a new record's piece is intact */
    assert_int_equal(coord_request_append_logprobs(req, recs + 1, 1), 0);
    got = coord_request_logprobs(req, 0, &n);
    assert_int_equal(n, 2);
    assert_memory_equal(got[1].token.piece, "cd", 2);
    assert_memory_equal(got[0].top[0].piece, "ab", 2);
    free(got);
    coord_request_unref(&req);

    /* failing and cancelling */
    req = coord_request_new(COORD_REQ_CHAT);
    assert_int_equal(coord_request_add_message(req, "user", "hi"), 0);
    assert_false(coord_request_cancelled(req));
    coord_request_cancel(req);
    assert_true(coord_request_cancelled(req));
    off = 0;
    assert_int_equal(coord_request_wait(req, &off, -1, NULL, NULL), COORD_REQ_RUNNING);
    assert_int_equal(coord_request_fail(req, 42, "odd status"), 0);
    coord_request_outcome(req, &o);
    assert_int_equal(o.state, COORD_REQ_FAILED);
    assert_int_equal(o.http_status, 500); /* not an HTTP error status: made one */
    assert_true(o.cancelled);
    assert_string_equal(o.message, "odd status");
    coord_request_unref(&req);
    coord_request_unref(&req); /* NULL-safe */
}

/* ==== the client library on its own =========================================================== */

static void test_client_url(void **state)
{
    (void)state;
    hcli_url u;
    char err[256];
    assert_int_equal(hcli_url_parse("http://127.0.0.1:8080", &u, err, sizeof err), 0);
    assert_string_equal(u.host, "127.0.0.1");
    assert_string_equal(u.port, "8080");
    assert_string_equal(u.prefix, "");
    assert_int_equal(hcli_url_parse("HTTP://example.org/api/", &u, err, sizeof err), 0);
    assert_string_equal(u.host, "example.org");
    assert_string_equal(u.port, "80");
    assert_string_equal(u.prefix, "/api");
    assert_int_equal(hcli_url_parse("http://[::1]:9/", &u, err, sizeof err), 0);
    assert_string_equal(u.host, "::1");
    assert_string_equal(u.port, "9");
    assert_int_equal(hcli_url_parse("https://x:1", &u, err, sizeof err), HCLI_EURL);
    assert_non_null(strstr(err, "https"));
    assert_int_equal(hcli_url_parse("http://x:70000", &u, err, sizeof err), HCLI_EURL);
    assert_int_equal(hcli_url_parse("http://x:12ab", &u, err, sizeof err), HCLI_EURL);
    assert_int_equal(hcli_url_parse("http://:80", &u, err, sizeof err), HCLI_EURL);
    assert_int_equal(hcli_url_parse("localhost:80", &u, err, sizeof err), HCLI_EURL);

    /* nobody listens on port 1 */
    hcli_request rq = {.path = "/health", .timeout_ms = 2000};
    hcli_response resp;
    assert_int_equal(hcli_do("http://127.0.0.1:1", &rq, &resp, err, sizeof err), HCLI_ECONNECT);
    assert_non_null(strstr(err, "cannot connect to http://127.0.0.1:1: "));
    hcli_response_free(&resp);
}

typedef struct {
    char joined[1024];
    int events;
} sse_collect;

static int sse_collect_fn(void *ctx, const char *data, size_t len)
{
    sse_collect *c = ctx;
    assert_int_equal(strlen(data), len);
    strcat(c->joined, data);
    strcat(c->joined, "|");
    c->events++;
    return 0;
}

static void test_client_sse_parser(void **state)
{
    (void)state;
    const char *stream = ": keepalive\n\ndata: {\"a\":1}\n\ndata:x\r\ndata: y\r\n\r\nevent: e\nid: 3\n"
                         "data: [DONE]\n\n";
    /* fed whole, then byte by byte: same events */
    for (int bytewise = 0; bytewise < 2; bytewise++) {
        sse_collect c = {0};
        hcli_sse p;
        hcli_sse_init(&p, sse_collect_fn, &c);
        size_t n = strlen(stream);
        if (bytewise)
            for (size_t i = 0; i < n; i++)
                assert_int_equal(hcli_sse_feed(&p, stream + i, 1), 0);
        else
            assert_int_equal(hcli_sse_feed(&p, stream, n), 0);
        hcli_sse_free(&p);
        assert_int_equal(c.events, 3);
        assert_string_equal(c.joined, "{\"a\":1}|x\ny|[DONE]|");
    }
}

/* ==== generation: plain answers =============================================================== */

static void test_completion(void **state)
{
    fixture *fx = *state;
    int status;
    cJSON *js = post_json(fx, "/v1/completions",
                          "{\"model\":\"test-model\",\"prompt\":\"Say hi\",\"max_tokens\":16,"
                          "\"temperature\":0,\"top_p\":0.5,\"top_k\":5,\"seed\":7,\"stop\":[\"\\n\",\"END\"],"
                          "\"orochi\":{\"draft\":\"ngram\"},\"user\":\"ignored\"}",
                          &status);
    assert_int_equal(status, 200);
    assert_true(!strncmp(jstr(js, "id"), "cmpl-", 5));
    assert_string_equal(jstr(js, "object"), "text_completion");
    assert_string_equal(jstr(js, "model"), "test-model");
    assert_true(jnum(js, "created") > 1.6e9);
    assert_int_equal(cJSON_GetArraySize(jget(js, "choices")), 1);
    assert_int_equal(jnum(js, "choices.0.index"), 0);
    assert_string_equal(jstr(js, "choices.0.text"), FULL_TEXT);
    assert_string_equal(jstr(js, "choices.0.finish_reason"), "stop");
    assert_int_equal(jnum(js, "usage.prompt_tokens"), 6);
    assert_int_equal(jnum(js, "usage.completion_tokens"), N_PIECES);
    assert_int_equal(jnum(js, "usage.total_tokens"), 6 + N_PIECES);
    const cJSON *ids = jget(js, "orochi.token_ids");
    assert_int_equal(cJSON_GetArraySize(ids), N_PIECES);
    for (int i = 0; i < N_PIECES; i++)
        assert_int_equal(cJSON_GetArrayItem(ids, i)->valuedouble, 10 + i);
    assert_int_equal(jnum(js, "orochi.steps"), 4);
    assert_true(jnum(js, "orochi.mean_accepted") == 7.0 / 4);
    assert_string_equal(jstr(js, "orochi.draft_kinds.0"), "ngram");
    assert_string_equal(jstr(js, "orochi.draft_kinds.1"), "model");
    assert_int_equal(cJSON_GetArraySize(jget(js, "orochi.draft_kinds")), 2);
    cJSON_Delete(js);

    /* the engine got what the body said */
    fake_engine *f = &fx->eng;
    pthread_mutex_lock(&f->mu);
    assert_int_equal(f->last.kind, COORD_REQ_COMPLETION);
    assert_int_equal(f->last.max_tokens, 16);
    assert_true(f->last.temperature == 0 && f->last.top_p == 0.5);
    assert_int_equal(f->last.top_k, 5);
    assert_true(f->last.has_seed && f->last.seed == 7);
    assert_false(f->last.stream);
    assert_int_equal(f->last.n_stop, 2);
    assert_string_equal(f->last_stop0, "\n");
    assert_string_equal(f->last_model, "test-model");
    assert_string_equal(f->last_options, "{\"draft\":\"ngram\"}");
    pthread_mutex_unlock(&f->mu);

    /* defaults, a one-element prompt list, and max_tokens cutting the answer ("length") */
    js = post_json(fx, "/v1/completions", "{\"prompt\":[\"x\"],\"max_tokens\":3,\"stop\":\"\\n\"}", &status);
    assert_int_equal(status, 200);
    assert_string_equal(jstr(js, "choices.0.text"), "Hello, w");
    assert_string_equal(jstr(js, "choices.0.finish_reason"), "length");
    assert_int_equal(cJSON_GetArraySize(jget(js, "orochi.token_ids")), 3);
    cJSON_Delete(js);
    pthread_mutex_lock(&f->mu);
    assert_true(f->last.temperature == 1.0 && f->last.top_p == 1.0 && !f->last.has_seed);
    assert_int_equal(f->last.n_stop, 1);
    pthread_mutex_unlock(&f->mu);

    /* ids are unique per request */
    cJSON *a = post_json(fx, "/v1/completions", "{\"prompt\":\"a\"}", &status);
    cJSON *b = post_json(fx, "/v1/completions", "{\"prompt\":\"b\"}", &status);
    assert_string_not_equal(jstr(a, "id"), jstr(b, "id"));
    cJSON_Delete(a);
    cJSON_Delete(b);
}

static void test_chat(void **state)
{
    fixture *fx = *state;
    int status;
    cJSON *js = post_json(fx, "/v1/chat/completions",
                          "{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
                          "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hel\"},"
                          "{\"type\":\"text\",\"text\":\"lo\"}]}],\"max_completion_tokens\":50}",
                          &status);
    assert_int_equal(status, 200);
    assert_true(!strncmp(jstr(js, "id"), "chatcmpl-", 9));
    assert_string_equal(jstr(js, "object"), "chat.completion");
    assert_string_equal(jstr(js, "choices.0.message.role"), "assistant");
    assert_string_equal(jstr(js, "choices.0.message.content"), FULL_TEXT);
    assert_string_equal(jstr(js, "choices.0.finish_reason"), "stop");
    assert_int_equal(jnum(js, "usage.completion_tokens"), N_PIECES);
    assert_int_equal(cJSON_GetArraySize(jget(js, "orochi.token_ids")), N_PIECES);
    cJSON_Delete(js);
    pthread_mutex_lock(&fx->eng.mu);
    assert_int_equal(fx->eng.last.kind, COORD_REQ_CHAT);
    assert_int_equal(fx->eng.last.max_tokens, 50);
    assert_string_equal(fx->eng.last_messages, "system:be brief|user:hello|");
    pthread_mutex_unlock(&fx->eng.mu);
}

/* ==== streaming =============================================================================== */

typedef struct {
    hcli_sse sse;
    char text[1024];
    int chunks, done, after_done, errors, stop_after;
    char finish[32], first_role[32];
    int n_ids;
    bool bad_json;
    char error_msg[256];
    int usage_chunks, usage_total, usage_nulls; /* stream_options.include_usage */
    bool chunk_after_usage;
} stream_collect;

static int stream_on_event(void *ctx, const char *data, size_t len)
{
    stream_collect *c = ctx;
    (void)len;
    if (c->done)
        c->after_done++;
    if (!strcmp(data, "[DONE]")) {
        c->done++;
        return 0;
    }
    cJSON *js = cJSON_Parse(data);
    if (!js) {
        c->bad_json = true;
        return 0;
    }
    const cJSON *err = jget(js, "error.message");
    if (cJSON_IsString(err)) {
        c->errors++;
        snprintf(c->error_msg, sizeof c->error_msg, "%s", err->valuestring);
    }
    const cJSON *choices = jget(js, "choices");
    if (cJSON_IsArray(choices) && cJSON_GetArraySize(choices) == 0) {
        /* the usage chunk: no choices, the usage */
        c->usage_chunks++;
        c->usage_total = (int)jnum(js, "usage.total_tokens");
        cJSON_Delete(js);
        return 0;
    }
    if (c->usage_chunks)
        c->chunk_after_usage = true;
    if (cJSON_IsNull(jget(js, "usage")))
        c->usage_nulls++;
    const cJSON *t = jget(js, "choices.0.text");
    if (!cJSON_IsString(t))
        t = jget(js, "choices.0.delta.content");
    if (cJSON_IsString(t))
        strncat(c->text, t->valuestring, sizeof c->text - strlen(c->text) - 1);
    const cJSON *role = jget(js, "choices.0.delta.role");
    if (cJSON_IsString(role) && !c->first_role[0])
        snprintf(c->first_role, sizeof c->first_role, "%s", role->valuestring);
    const cJSON *fin = jget(js, "choices.0.finish_reason");
    if (cJSON_IsString(fin)) {
        snprintf(c->finish, sizeof c->finish, "%s", fin->valuestring);
        c->n_ids = cJSON_GetArraySize(jget(js, "orochi.token_ids"));
    } else if (!err) {
        c->chunks++;
    }
    cJSON_Delete(js);
    return c->stop_after && c->chunks >= c->stop_after;
}

static int stream_on_body(void *ctx, const char *data, size_t len)
{
    stream_collect *c = ctx;
    return hcli_sse_feed(&c->sse, data, len);
}

/* POST with stream:true through the client; the events land in *c. Returns hcli_do's result. */
static int stream_call(const fixture *fx, const char *path, const char *body, stream_collect *c,
                       hcli_response *resp)
{
    hcli_sse_init(&c->sse, stream_on_event, c);
    hcli_request rq = {.path = path, .body = body, .body_len = strlen(body), .timeout_ms = TIMEOUT_MS,
                       .on_body = stream_on_body, .ctx = c};
    char err[256];
    int rc = hcli_do(fx->url, &rq, resp, err, sizeof err);
    hcli_sse_free(&c->sse);
    return rc;
}

static void test_stream_completion(void **state)
{
    fixture *fx = *state;
    stream_collect c = {0};
    hcli_response resp;
    assert_int_equal(stream_call(fx, "/v1/completions", "{\"prompt\":\"hi\",\"stream\":true}", &c, &resp),
                     0);
    assert_int_equal(resp.status, 200);
    assert_true(!strncmp(resp.content_type, "text/event-stream", 17));
    hcli_response_free(&resp);
    assert_false(c.bad_json);
    assert_string_equal(c.text, FULL_TEXT);
    assert_true(c.chunks >= 2); /* pieces arrive as separate events */
    assert_string_equal(c.finish, "stop");
    assert_int_equal(c.n_ids, N_PIECES);
    assert_int_equal(c.done, 1);
    assert_int_equal(c.after_done, 0);
    assert_int_equal(c.errors, 0);
    pthread_mutex_lock(&fx->eng.mu);
    assert_true(fx->eng.last.stream);
    pthread_mutex_unlock(&fx->eng.mu);

    /* cut by max_tokens in the middle of é: the held-back byte comes out as U+FFFD */
    stream_collect d = {0};
    assert_int_equal(stream_call(fx, "/v1/completions",
                                 "{\"prompt\":\"hi\",\"stream\":true,\"max_tokens\":4}", &d, &resp), 0);
    hcli_response_free(&resp);
    assert_string_equal(d.text, "Hello, w\xEF\xBF\xBD");
    assert_string_equal(d.finish, "length");
    assert_int_equal(d.done, 1);
}

static void test_stream_chat(void **state)
{
    fixture *fx = *state;
    stream_collect c = {0};
    hcli_response resp;
    assert_int_equal(stream_call(fx, "/v1/chat/completions",
                                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true}",
                                 &c, &resp),
                     0);
    assert_int_equal(resp.status, 200);
    hcli_response_free(&resp);
    assert_false(c.bad_json);
    assert_string_equal(c.first_role, "assistant");
    assert_string_equal(c.text, FULL_TEXT);
    assert_string_equal(c.finish, "stop");
    assert_int_equal(c.n_ids, N_PIECES);
    assert_int_equal(c.done, 1);
}

/* ==== errors ================================================================================== */

static void test_invalid_json(void **state)
{
    fixture *fx = *state;
    expect_error(fx, "/v1/completions", "{\"prompt\": \"x\",", 400, "not valid JSON", NULL);
    expect_error(fx, "/v1/completions", "{not json}", 400, "not valid JSON", NULL);
    expect_error(fx, "/v1/completions", "{\"prompt\":\"x\"} trailing", 400, "unexpected data", NULL);
    expect_error(fx, "/v1/completions", "[1,2]", 400, "must be a JSON object", NULL);
    expect_error(fx, "/v1/chat/completions", "\"hi\"", 400, "must be a JSON object", NULL);
    expect_error(fx, "/v1/completions", "", 400, "empty", NULL);
    expect_still_serving(fx);
}

static void test_wrong_types(void **state)
{
    fixture *fx = *state;
    static const struct {
        const char *path, *body, *needle, *param;
    } cases[] = {
        {"/v1/completions", "{}", "missing required field 'prompt'", "prompt"},
        {"/v1/completions", "{\"prompt\":null}", "missing required field 'prompt'", "prompt"},
        {"/v1/completions", "{\"prompt\":5}", "prompt must be a string", "prompt"},
        {"/v1/completions", "{\"prompt\":[\"a\",\"b\"]}", "lists of several prompts", "prompt"},
        {"/v1/completions", "{\"prompt\":[1,2,3]}", "token ids", "prompt"},
        {"/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":\"5\"}", "max_tokens must be an integer", "max_tokens"},
        {"/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":1.5}", "max_tokens must be an integer", "max_tokens"},
        {"/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":5000}", "at most 4096", "max_tokens"},
        {"/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":1e300}", "at most 4096", "max_tokens"},
        {"/v1/completions", "{\"prompt\":\"a\",\"temperature\":\"hot\"}", "temperature must be a number", "temperature"},
        {"/v1/completions", "{\"prompt\":\"a\",\"temperature\":-0.5}", "between 0 and 2", "temperature"},
        {"/v1/completions", "{\"prompt\":\"a\",\"top_p\":0}", "top_p must be in (0, 1]", "top_p"},
        {"/v1/completions", "{\"prompt\":\"a\",\"top_p\":1.5}", "top_p must be in (0, 1]", "top_p"},
        {"/v1/completions", "{\"prompt\":\"a\",\"top_p\":[]}", "top_p must be a number", "top_p"},
        {"/v1/completions", "{\"prompt\":\"a\",\"top_k\":-1}", "top_k", "top_k"},
        {"/v1/completions", "{\"prompt\":\"a\",\"seed\":\"7\"}", "seed must be an integer", "seed"},
        {"/v1/completions", "{\"prompt\":\"a\",\"stream\":\"yes\"}", "stream must be true or false", "stream"},
        {"/v1/completions", "{\"prompt\":\"a\",\"stream\":1}", "stream must be true or false", "stream"},
        {"/v1/completions", "{\"prompt\":\"a\",\"stop\":[1]}", "stop must be", "stop"},
        {"/v1/completions", "{\"prompt\":\"a\",\"stop\":\"\"}", "stop must not be an empty string", "stop"},
        {"/v1/completions", "{\"prompt\":\"a\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "at most 4", "stop"},
        {"/v1/completions", "{\"prompt\":\"a\",\"n\":9}", "n must be an integer from 1 to 8", "n"},
        {"/v1/completions", "{\"prompt\":\"a\",\"model\":7}", "model must be a string", "model"},
        {"/v1/completions", "{\"prompt\":\"a\",\"orochi\":[1]}", "orochi must be an object", "orochi"},
        {"/v1/chat/completions", "{}", "missing required field 'messages'", "messages"},
        {"/v1/chat/completions", "{\"messages\":\"hi\"}", "non-empty array", "messages"},
        {"/v1/chat/completions", "{\"messages\":[]}", "non-empty array", "messages"},
        {"/v1/chat/completions", "{\"messages\":[7]}", "messages[0] must be an object", "messages[0]"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":1,\"content\":\"x\"}]}", "messages[0].role must be a string", "messages[0].role"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"user\"}]}", "messages[1].content must be a string", "messages[1].content"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content must be a string", "messages[0].content"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", "array of text parts", "messages[0].content"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "must be \"system\", \"developer\", \"user\", \"assistant\" or \"tool\"", "messages[0].role"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":true}", "temperature must be a number", "temperature"},
        /* logprobs: OpenAI's types and ranges per route */
        {"/v1/completions", "{\"prompt\":\"a\",\"logprobs\":6}", "logprobs must be an integer from 0 to 5", "logprobs"},
        {"/v1/completions", "{\"prompt\":\"a\",\"logprobs\":-1}", "logprobs must be an integer from 0 to 5", "logprobs"},
        {"/v1/completions", "{\"prompt\":\"a\",\"logprobs\":1.5}", "logprobs must be an integer from 0 to 5", "logprobs"},
        {"/v1/completions", "{\"prompt\":\"a\",\"logprobs\":true}", "logprobs must be an integer from 0 to 5", "logprobs"},
        {"/v1/completions", "{\"prompt\":\"a\",\"logprobs\":\"2\"}", "logprobs must be an integer from 0 to 5", "logprobs"},
        {"/v1/completions", "{\"prompt\":\"a\",\"logprobs\":0,\"echo\":true}", "logprobs cannot be combined with echo", "logprobs"},
        {"/v1/completions", "{\"prompt\":\"a\",\"echo\":true,\"logprobs\":2}", "the prompt's logprobs are not computed", "logprobs"},
        {"/v1/completions", "{\"prompt\":\"a\",\"logprobs\":2,\"top_logprobs\":2}", "top_logprobs is a chat completions field", "top_logprobs"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}", "logprobs must be true or false", "logprobs"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":\"yes\"}", "logprobs must be true or false", "logprobs"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", "top_logprobs requires logprobs to be true", "top_logprobs"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":false,\"top_logprobs\":0}", "top_logprobs requires logprobs to be true", "top_logprobs"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs must be an integer from 0 to 20", "top_logprobs"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":-1}", "top_logprobs must be an integer from 0 to 20", "top_logprobs"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":2.5}", "top_logprobs must be an integer from 0 to 20", "top_logprobs"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":\"3\"}", "top_logprobs must be an integer from 0 to 20", "top_logprobs"},
        /* what the server cannot do is refused by name, never ignored */
        {"/v1/completions", "{\"prompt\":\"a\",\"echo\":\"yes\"}", "echo must be true or false", "echo"},
        {"/v1/completions", "{\"prompt\":\"a\",\"best_of\":3}", "best_of must be 1", "best_of"},
        {"/v1/completions", "{\"prompt\":\"a\",\"suffix\":\"end\"}", "suffix is not supported", "suffix"},
        {"/v1/completions", "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}", "only allowed when stream is true", "stream_options"},
        {"/v1/completions", "{\"prompt\":\"a\",\"stream\":true,\"stream_options\":true}", "stream_options must be an object", "stream_options"},
        {"/v1/completions", "{\"prompt\":\"a\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}", "include_usage must be true or false", "stream_options.include_usage"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_error(fx, cases[i].path, cases[i].body, 400, cases[i].needle, cases[i].param);
    /* none of them reached the engine */
    assert_int_equal(atomic_load(&fx->eng.submitted), 0);
    expect_still_serving(fx);
}

static void test_bad_max_tokens(void **state)
{
    fixture *fx = *state;
    expect_error(fx, "/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":-5}", 400,
                 "max_tokens must be at least 1, got -5", "max_tokens");
    expect_error(fx, "/v1/completions", "{\"prompt\":\"a\",\"max_tokens\":0}", 400,
                 "max_tokens must be at least 1, got 0", "max_tokens");
    expect_error(fx, "/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":-1}", 400,
                 "at least 1", "max_tokens");
    expect_still_serving(fx);
}

static void test_prompt_too_long(void **state)
{
    fixture *fx = *state;
    char body[512], prompt[201];
    memset(prompt, 'a', 200);
    prompt[200] = 0;
    /* the engine's 413 is answered as OpenAI does: 400, code context_length_exceeded */
    snprintf(body, sizeof body, "{\"prompt\":\"%s\"}", prompt);
    expect_error_code(fx, "/v1/completions", body, strlen(body), 400,
                      "prompt of 200 tokens exceeds the context of 64", "prompt",
                      "context_length_exceeded");
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"stream\":true}", prompt);
    expect_error_code(fx, "/v1/completions", body, strlen(body), 400, "exceeds the context",
                      "prompt", "context_length_exceeded");
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}]}", prompt);
    expect_error_code(fx, "/v1/chat/completions", body, strlen(body), 400, "prompt of 200 tokens",
                      "messages", "context_length_exceeded");
    expect_still_serving(fx);
}

static void test_engine_failures(void **state)
{
    fixture *fx = *state;
    /* failed before any text: a plain error answer with the engine's status, streaming or not */
    expect_error(fx, "/v1/completions", "{\"prompt\":\"fail-now\"}", 503, "overloaded", NULL);
    expect_error(fx, "/v1/completions", "{\"prompt\":\"fail-now\",\"stream\":true}", 503, "overloaded", NULL);
    expect_error(fx, "/v1/completions", "{\"prompt\":\"fail-midway\"}", 500, "worker 1 died", NULL);
    /* failed mid-stream: the text so far, an error event, then [DONE] */
    stream_collect c = {0};
    hcli_response resp;
    assert_int_equal(stream_call(fx, "/v1/completions", "{\"prompt\":\"fail-midway\",\"stream\":true}",
                                 &c, &resp), 0);
    assert_int_equal(resp.status, 200);
    hcli_response_free(&resp);
    assert_string_equal(c.text, "partial");
    assert_int_equal(c.errors, 1);
    assert_string_equal(c.error_msg, "worker 1 died");
    assert_int_equal(c.done, 1);
    assert_string_equal(c.finish, "");
    expect_still_serving(fx);
}

static void test_routes(void **state)
{
    fixture *fx = *state;
    hcli_response resp;
    assert_int_equal(http_call(fx, "GET", "/v2/nothing", NULL, NULL, &resp), 404);
    assert_non_null(strstr(resp.body, "no route for GET /v2/nothing"));
    assert_true(!strncmp(resp.content_type, "application/json", 16));
    hcli_response_free(&resp);
    assert_int_equal(http_call(fx, "POST", "/v1/completions/x", "{}", NULL, &resp), 404);
    hcli_response_free(&resp);
    assert_int_equal(http_call(fx, "GET", "/v1/completions", NULL, NULL, &resp), 405);
    assert_non_null(strstr(resp.body, "use POST"));
    hcli_response_free(&resp);
    assert_int_equal(http_call(fx, "DELETE", "/v1/chat/completions", NULL, NULL, &resp), 405);
    hcli_response_free(&resp);
    assert_int_equal(http_call(fx, "POST", "/health", "{}", NULL, &resp), 405);
    hcli_response_free(&resp);

    /* models */
    assert_int_equal(http_call(fx, "GET", "/v1/models", NULL, NULL, &resp), 200);
    cJSON *js = cJSON_Parse(resp.body);
    hcli_response_free(&resp);
    assert_string_equal(jstr(js, "object"), "list");
    assert_string_equal(jstr(js, "data.0.id"), "test-model");
    assert_string_equal(jstr(js, "data.0.object"), "model");
    cJSON_Delete(js);
    assert_int_equal(http_call(fx, "GET", "/v1/models/test-model", NULL, NULL, &resp), 200);
    hcli_response_free(&resp);
    assert_int_equal(http_call(fx, "GET", "/v1/models/gpt-4", NULL, NULL, &resp), 404);
    hcli_response_free(&resp);

    /* health, then an unhealthy engine */
    assert_int_equal(http_call(fx, "GET", "/health", NULL, NULL, &resp), 200);
    js = cJSON_Parse(resp.body);
    hcli_response_free(&resp);
    assert_string_equal(jstr(js, "status"), "ok");
    cJSON_Delete(js);
    pthread_mutex_lock(&fx->eng.mu);
    fx->eng.healthy = false;
    pthread_mutex_unlock(&fx->eng.mu);
    assert_int_equal(http_call(fx, "GET", "/health", NULL, NULL, &resp), 503);
    assert_non_null(strstr(resp.body, "no workers connected"));
    hcli_response_free(&resp);
}

/* the page compiled into the server (coordinator/page/embed.cmake) */
extern const unsigned char http_page_html[];
extern const size_t http_page_html_len;

static void test_page_and_status(void **state)
{
    fixture *fx = *state;
    hcli_response resp;
    /* the page: the embedded file, byte for byte, as HTML kept to its own origin */
    assert_true(http_page_html_len > 1000);
    assert_int_equal(http_call(fx, "GET", "/", NULL, NULL, &resp), 200);
    assert_true(!strncmp(resp.content_type, "text/html", 9));
    assert_int_equal(resp.body_len, http_page_html_len);
    assert_memory_equal(resp.body, http_page_html, http_page_html_len);
    assert_non_null(strstr(resp.body, "<title>orochi</title>"));
    hcli_response_free(&resp);
    assert_int_equal(http_call(fx, "HEAD", "/", NULL, NULL, &resp), 200);
    hcli_response_free(&resp);
    assert_int_equal(http_call(fx, "POST", "/", "{}", NULL, &resp), 405);
    hcli_response_free(&resp);
    assert_int_equal(http_call(fx, "GET", "/index.html", NULL, NULL, &resp), 404);
    hcli_response_free(&resp);

    /* the engine's status, as it gives it; none yet: 503 */
    assert_int_equal(http_call(fx, "GET", "/status", NULL, NULL, &resp), 200);
    assert_true(!strncmp(resp.content_type, "application/json", 16));
    cJSON *js = cJSON_Parse(resp.body);
    hcli_response_free(&resp);
    assert_string_equal(jstr(js, "object"), "orochi.status");
    assert_string_equal(jstr(js, "processes.0.name"), "coordinator");
    cJSON_Delete(js);
    assert_int_equal(http_call(fx, "POST", "/status", "{}", NULL, &resp), 405);
    hcli_response_free(&resp);
    pthread_mutex_lock(&fx->eng.mu);
    fx->eng.healthy = false;
    pthread_mutex_unlock(&fx->eng.mu);
    assert_int_equal(http_call(fx, "GET", "/status", NULL, NULL, &resp), 503);
    assert_non_null(strstr(resp.body, "no status"));
    hcli_response_free(&resp);

    /* both counted under their own route */
    assert_int_equal(http_call(fx, "GET", "/metrics", NULL, NULL, &resp), 200);
    assert_non_null(strstr(resp.body, "orochi_http_requests_total{route=\"/\",code=\"200\"} 2\n"));
    assert_non_null(
        strstr(resp.body, "orochi_http_requests_total{route=\"/status\",code=\"503\"} 1\n"));
    hcli_response_free(&resp);
}

static void test_body_too_large(void **state)
{
    fixture *fx = *state; /* max_body_bytes = 4096 */
    size_t n = 10000;
    char *body = malloc(n + 1);
    memset(body, ' ', n);
    memcpy(body, "{\"prompt\":\"", 11);
    memcpy(body + n - 2, "\"}", 2);
    body[n] = 0;
    expect_error(fx, "/v1/completions", body, 413, "exceeds the limit of 4096 bytes", NULL);
    free(body);

    /* announced with Expect: 100-continue: refused before the body is sent */
    char head[512], out[4096];
    snprintf(head, sizeof head,
             "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             "Content-Length: 10485760\r\nExpect: 100-continue\r\n\r\n");
    raw_exchange(fx->port, head, strlen(head), out, sizeof out, 5000);
    assert_true(!strncmp(out, "HTTP/1.1 413", 12));
    assert_null(strstr(out, "100 Continue"));

    /* a chunked body (no Content-Length) over the limit */
    static const char chunked_head[] =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    char *raw = malloc(20000);
    size_t len = (size_t)sprintf(raw, "%s", chunked_head);
    for (int i = 0; i < 6; i++) {
        len += (size_t)sprintf(raw + len, "400\r\n");
        memset(raw + len, 'x', 0x400);
        len += 0x400;
        len += (size_t)sprintf(raw + len, "\r\n");
    }
    len += (size_t)sprintf(raw + len, "0\r\n\r\n");
    raw_exchange(fx->port, raw, len, out, sizeof out, 5000);
    free(raw);
    assert_true(!strncmp(out, "HTTP/1.1 413", 12));
    expect_still_serving(fx);
}

static void test_api_key(void **state)
{
    fixture *fx = *state; /* api_key = "sekrit" */
    static const char body[] = "{\"prompt\":\"hi\"}";
    hcli_response resp;
    assert_int_equal(http_call(fx, "POST", "/v1/completions", body, NULL, &resp), 401);
    cJSON *js = cJSON_Parse(resp.body);
    hcli_response_free(&resp);
    assert_string_equal(jstr(js, "error.type"), "authentication_error");
    assert_non_null(strstr(jstr(js, "error.message"), "API key"));
    cJSON_Delete(js);
    assert_int_equal(http_call(fx, "POST", "/v1/completions", body, "wrong", &resp), 401);
    hcli_response_free(&resp);
    assert_int_equal(http_call(fx, "POST", "/v1/completions", body, "sekrit2", &resp), 401);
    hcli_response_free(&resp);
    assert_int_equal(http_call(fx, "POST", "/v1/completions", body, "sekri", &resp), 401);
    hcli_response_free(&resp);
    assert_int_equal(http_call(fx, "GET", "/metrics", NULL, NULL, &resp), 401);
    hcli_response_free(&resp);
    assert_int_equal(http_call(fx, "GET", "/v1/models", NULL, "nope", &resp), 401);
    hcli_response_free(&resp);
    assert_int_equal(atomic_load(&fx->eng.submitted), 0);

    assert_int_equal(http_call(fx, "POST", "/v1/completions", body, "sekrit", &resp), 200);
    js = cJSON_Parse(resp.body);
    hcli_response_free(&resp);
    assert_string_equal(jstr(js, "choices.0.text"), FULL_TEXT);
    cJSON_Delete(js);
    assert_int_equal(http_call(fx, "GET", "/v1/models", NULL, "sekrit", &resp), 200);
    hcli_response_free(&resp);
    /* health needs no key, nor the page (a browser cannot send one when it opens a URL); the
     * status does */
    assert_int_equal(http_call(fx, "GET", "/health", NULL, NULL, &resp), 200);
    hcli_response_free(&resp);
    assert_int_equal(http_call(fx, "GET", "/", NULL, NULL, &resp), 200);
    hcli_response_free(&resp);
    assert_int_equal(http_call(fx, "GET", "/status", NULL, NULL, &resp), 401);
    hcli_response_free(&resp);
    assert_int_equal(http_call(fx, "GET", "/status", NULL, "sekrit", &resp), 200);
    hcli_response_free(&resp);
}

static void test_metrics(void **state)
{
    fixture *fx = *state;
    int status;
    cJSON_Delete(post_json(fx, "/v1/completions", "{\"prompt\":\"a\"}", &status));
    cJSON_Delete(post_json(fx, "/v1/completions", "{\"prompt\":\"b\"}", &status));
    cJSON_Delete(post_json(fx, "/v1/completions", "{\"prompt\":7}", &status));
    cJSON_Delete(post_json(fx, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"c\"}]}", &status));
    hcli_response resp;
    http_call(fx, "GET", "/nowhere", NULL, NULL, &resp);
    hcli_response_free(&resp);
    assert_int_equal(http_call(fx, "GET", "/metrics", NULL, NULL, &resp), 200);
    assert_true(!strncmp(resp.content_type, "text/plain; version=0.0.4", 25));
    const char *m = resp.body;
    assert_non_null(strstr(m, "fake_engine_submitted_total 3\n"));
    assert_non_null(strstr(m, "# TYPE orochi_http_requests_total counter\n"));
    assert_non_null(strstr(m, "orochi_http_requests_total{route=\"/v1/completions\",code=\"200\"} 2\n"));
    assert_non_null(strstr(m, "orochi_http_requests_total{route=\"/v1/completions\",code=\"400\"} 1\n"));
    assert_non_null(strstr(m, "orochi_http_requests_total{route=\"/v1/chat/completions\",code=\"200\"} 1\n"));
    assert_non_null(strstr(m, "orochi_http_requests_total{route=\"other\",code=\"404\"} 1\n"));
    assert_non_null(strstr(m, "orochi_http_active_requests 0\n"));
    hcli_response_free(&resp);
    /* the first /metrics answer is counted in the next */
    assert_int_equal(http_call(fx, "GET", "/metrics", NULL, NULL, &resp), 200);
    assert_non_null(strstr(resp.body, "orochi_http_requests_total{route=\"/metrics\",code=\"200\"} 1\n"));
    hcli_response_free(&resp);
}

/* ==== robustness ============================================================================== */

static void test_garbage_traffic(void **state)
{
    fixture *fx = *state;
    char out[4096];
    static const char *const junk[] = {
        "GARBAGE\r\n\r\n",
        "GET / HTTP/9.9\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":", /* then hang up */
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", /* a TLS hello */
        "",                                             /* connect and close */
    };
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
        /* a short receive timeout: answers come quickly or never */
        raw_exchange(fx->port, junk[i], strlen(junk[i]), out, sizeof out, 300);
        expect_still_serving(fx);
    }
    /* a body with bytes that are not UTF-8 in the prompt: refused, naming the prompt */
    expect_error(fx, "/v1/completions", "{\"prompt\":\"\xff\xfe\",\"max_tokens\":\"x\"}", 400,
                 "not valid UTF-8", "prompt");
    /* invalid UTF-8 in the URL of a 404 becomes U+FFFD, and the answer is valid JSON */
    static const char bad_url[] = "GET /\xff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    raw_exchange(fx->port, bad_url, strlen(bad_url), out, sizeof out, 5000);
    char *json = strstr(out, "\r\n\r\n");
    if (json && strstr(out, " 404 ")) {
        cJSON *js = cJSON_Parse(json + 4);
        assert_non_null(js);
        cJSON_Delete(js);
    }
    expect_still_serving(fx);
}

static void *call_many(void *arg)
{
    const fixture *fx = arg;
    long ok = 0;
    for (int i = 0; i < 5; i++) {
        hcli_request rq = {.path = "/v1/completions", .body = "{\"prompt\":\"par\"}", .body_len = 16,
                           .timeout_ms = TIMEOUT_MS};
        hcli_response resp;
        char err[256];
        if (!hcli_do(fx->url, &rq, &resp, err, sizeof err) && resp.status == 200 && resp.body &&
            strstr(resp.body, "\"text\":\"Hello, w"))
            ok++;
        hcli_response_free(&resp);
    }
    return (void *)ok;
}

static void test_concurrent_clients(void **state)
{
    fixture *fx = *state;
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, call_many, fx), 0);
    long total = 0;
    for (int i = 0; i < 4; i++) {
        void *ok;
        pthread_join(t[i], &ok);
        total += (long)ok;
    }
    assert_int_equal(total, 20);
}

static bool wait_for_cancels(fake_engine *f, int want)
{
    for (int i = 0; i < 300 && atomic_load(&f->cancels_seen) < want; i++)
        fake_sleep_ms(10);
    return atomic_load(&f->cancels_seen) >= want;
}

/* Polls /metrics until it contains `needle` (a counter may land a moment after the cancel). */
static bool wait_for_metric(const fixture *fx, const char *needle)
{
    for (int i = 0; i < 100; i++) {
        hcli_response m;
        http_call(fx, "GET", "/metrics", NULL, NULL, &m);
        bool found = m.body && strstr(m.body, needle);
        hcli_response_free(&m);
        if (found)
            return true;
        fake_sleep_ms(20);
    }
    return false;
}

static void test_client_gone_cancels(void **state)
{
    fixture *fx = *state;
    /* streaming: the client stops reading after two chunks and hangs up */
    stream_collect c = {.stop_after = 2};
    hcli_response resp;
    assert_int_equal(stream_call(fx, "/v1/completions", "{\"prompt\":\"slow\",\"stream\":true}", &c, &resp),
                     HCLI_ABORTED);
    hcli_response_free(&resp);
    assert_true(wait_for_cancels(&fx->eng, 1));

    /* not streaming: the client sends the request and hangs up while the engine works */
    static const char req[] = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              "Content-Length: 17\r\n\r\n{\"prompt\":\"slow\"}";
    int fd = connect_local(fx->port);
    assert_int_equal(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    fake_sleep_ms(100);
    close(fd);
    assert_true(wait_for_cancels(&fx->eng, 2));
    expect_still_serving(fx);

    /* both count as 499 (the client left), the stream as well as the plain request */
    assert_true(wait_for_metric(fx, "orochi_http_requests_total{route=\"/v1/completions\","
                                    "code=\"499\"} 2\n"));
    assert_true(wait_for_metric(fx, "orochi_http_active_requests 0\n"));
    hcli_response m;
    http_call(fx, "GET", "/metrics", NULL, NULL, &m);
    /* only the request that came after was answered whole */
    assert_non_null(strstr(m.body, "{route=\"/v1/completions\",code=\"200\"} 1\n"));
    hcli_response_free(&m);
}

/* The idle timeout (1 s here) closes idle keep-alive connections, but never cuts a generation
 * that takes longer than that; after the answer the connection is idle and times out again. */
static void test_idle_timeout(void **state)
{
    fixture *fx = *state;
    static const char req[] = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              "Content-Length: 19\r\n\r\n{\"prompt\":\"sleepy\"}";
    int fd = connect_local(fx->port);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    char out[8192];
    size_t n = 0;
    ssize_t got;
    while (n + 1 < sizeof out && (got = recv(fd, out + n, sizeof out - 1 - n, 0)) > 0)
        n += (size_t)got;
    out[n] = 0;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    close(fd);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    assert_true(!strncmp(out, "HTTP/1.1 200", 12));
    assert_non_null(strstr(out, FULL_TEXT));
    /* the answer came after ~1.5 s, then the idle connection was closed ~1 s later */
    assert_true(secs > 2.0 && secs < 8.0);
}

static void *post_hang(void *arg)
{
    const fixture *fx = arg;
    hcli_request rq = {.path = "/v1/completions", .body = "{\"prompt\":\"hang\"}", .body_len = 17,
                       .timeout_ms = TIMEOUT_MS};
    hcli_response resp;
    char err[256];
    long rc = hcli_do(fx->url, &rq, &resp, err, sizeof err);
    hcli_response_free(&resp);
    return (void *)rc;
}

/* The count a draining coordinator waits for: 0, 1 while a client holds a connection, 0 again once
 * it closed it; and 0 after a request answered on a connection of its own. */
static int open_connections_within(const fixture *fx, int want, int ms)
{
    int n = http_server_open_connections(fx->srv);
    for (int i = 0; i < ms / 10 && n != want; i++) {
        fake_sleep_ms(10);
        n = http_server_open_connections(fx->srv);
    }
    return n;
}

static void test_open_connections(void **state)
{
    fixture *fx = *state;
    assert_int_equal(open_connections_within(fx, 0, 2000), 0);
    int fd = connect_local(fx->port);
    assert_int_equal(open_connections_within(fx, 1, 2000), 1);
    close(fd);
    assert_int_equal(open_connections_within(fx, 0, 2000), 0);
    expect_still_serving(fx);
    assert_int_equal(open_connections_within(fx, 0, 2000), 0);
}

/* The engine never answers; stopping the server must still be prompt, and cancel the request. */
static void test_stop_with_request_in_flight(void **state)
{
    fixture *fx = *state;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, post_hang, fx), 0);
    for (int i = 0; i < 200 && atomic_load(&fx->eng.submitted) < 1; i++)
        fake_sleep_ms(10);
    assert_int_equal(atomic_load(&fx->eng.submitted), 1);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    http_server_stop(&fx->srv);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    assert_true(secs < 3.0);
    void *rc;
    pthread_join(t, &rc);
    assert_int_not_equal((long)rc, HCLI_OK); /* the connection was closed without an answer */
    pthread_mutex_lock(&fx->eng.mu);
    assert_int_equal(fx->eng.n_parked, 1);
    assert_true(coord_request_cancelled(fx->eng.parked[0]));
    pthread_mutex_unlock(&fx->eng.mu);
}

static void test_start_errors(void **state)
{
    fixture *fx = *state;
    fake_engine *f = &fx->eng;
    http_engine e = {.ctx = f, .submit = fake_submit};
    char err[256];
    /* the port is taken by the fixture's server */
    http_config cfg = {.port = fx->port, .quiet = true};
    http_server *srv = http_server_start(&cfg, &e, err, sizeof err);
    assert_null(srv);
    assert_non_null(strstr(err, "cannot serve on 127.0.0.1 port"));
    cfg = (http_config){.bind_addr = "no.such.host.invalid", .quiet = true};
    assert_null(http_server_start(&cfg, &e, err, sizeof err));
    assert_non_null(strstr(err, "cannot resolve bind address"));
    http_engine none = {0};
    assert_null(http_server_start(NULL, &none, err, sizeof err));
    assert_non_null(strstr(err, "submit"));
    /* no engine callbacks for metrics/health: defaults */
    cfg = (http_config){.quiet = true};
    srv = http_server_start(&cfg, &e, err, sizeof err);
    assert_non_null(srv);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", http_server_port(srv));
    hcli_request rq = {.path = "/health", .timeout_ms = TIMEOUT_MS};
    hcli_response resp;
    assert_int_equal(hcli_do(url, &rq, &resp, err, sizeof err), 0);
    assert_int_equal(resp.status, 200);
    hcli_response_free(&resp);
    rq.path = "/metrics";
    assert_int_equal(hcli_do(url, &rq, &resp, err, sizeof err), 0);
    assert_non_null(strstr(resp.body, "orochi_http_requests_total{route=\"/health\",code=\"200\"} 1"));
    hcli_response_free(&resp);
    rq.path = "/v1/models";
    assert_int_equal(hcli_do(url, &rq, &resp, err, sizeof err), 0);
    assert_non_null(strstr(resp.body, "\"id\":\"orochi\""));
    hcli_response_free(&resp);
    http_server_stop(&srv);
    assert_null(srv);
}

/* ==== the CLI client (`orochi generate`) against the server =================================== */

/* Runs `cmd`, returns the exit status; stdout and stderr go to out. */
static int run_cli(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli_generate(void **state)
{
    fixture *fx = *state;
    const char *bin = getenv("OROCHI_BIN");
    if (!bin) {
        printf("skipping: OROCHI_BIN is not set (ctest sets it)\n");
        skip();
    }
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd, "'%s' generate --url %s --prompt hi -n 50 --temp 0 2>&1", bin, fx->url);
    assert_int_equal(run_cli(cmd, out, sizeof out), 0);
    assert_true(!strncmp(out, FULL_TEXT "\n", strlen(FULL_TEXT) + 1));
    assert_non_null(strstr(out, "orochi generate: prompt 2 tok | 7 tok in"));
    assert_non_null(strstr(out, "mean accepted 1.75, drafts ngram,model | finish stop"));

    snprintf(cmd, sizeof cmd, "'%s' generate --url %s --prompt hi --stream 2>/dev/null", bin, fx->url);
    assert_int_equal(run_cli(cmd, out, sizeof out), 0);
    assert_string_equal(out, FULL_TEXT "\n");

    snprintf(cmd, sizeof cmd, "'%s' generate --url %s --prompt hi --print-ids -n 4 2>/dev/null", bin, fx->url);
    assert_int_equal(run_cli(cmd, out, sizeof out), 0);
    assert_string_equal(out, "10 11 12 13\n");
    snprintf(cmd, sizeof cmd, "'%s' generate --url %s --prompt hi --print-ids --stream --chat 2>/dev/null",
             bin, fx->url);
    assert_int_equal(run_cli(cmd, out, sizeof out), 0);
    assert_string_equal(out, "10 11 12 13 14 15 16\n");

    /* an error answer and an unreachable server: exit 1 with a clear line */
    snprintf(cmd, sizeof cmd, "'%s' generate --url %s --prompt fail-now 2>&1", bin, fx->url);
    assert_int_equal(run_cli(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "orochi generate: the server answered 503: the engine is overloaded"));
    snprintf(cmd, sizeof cmd, "'%s' generate --url http://127.0.0.1:1 --prompt hi 2>&1", bin);
    assert_int_equal(run_cli(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "orochi generate: cannot connect to http://127.0.0.1:1: "));
    snprintf(cmd, sizeof cmd, "'%s' generate --url https://x --prompt hi 2>&1", bin);
    assert_int_equal(run_cli(cmd, out, sizeof out), 2);

    /* chat: two turns, the second sees the history */
    snprintf(cmd, sizeof cmd, "printf 'first\\n\\nsecond\\n/exit\\nnot sent\\n' | '%s' chat --url %s 2>/dev/null",
             bin, fx->url);
    assert_int_equal(run_cli(cmd, out, sizeof out), 0);
    assert_string_equal(out, FULL_TEXT "\n" FULL_TEXT "\n");
    pthread_mutex_lock(&fx->eng.mu);
    assert_string_equal(fx->eng.last_messages, "user:first|assistant:" FULL_TEXT "|user:second|");
    pthread_mutex_unlock(&fx->eng.mu);
}

/* ==== text arrives whole, or is refused by name =============================================== */

static void test_text_whole(void **state)
{
    fixture *fx = *state;
    /* an escaped NUL: cJSON would cut the string there; refused, naming the field */
    static const char nul_prompt[] = "{\"prompt\":\"Once\\u0000 upon a time\"}";
    expect_error_code(fx, "/v1/completions", nul_prompt, strlen(nul_prompt), 400,
                      "prompt contains a NUL character", "prompt", NULL);
    static const char nul_list[] = "{\"prompt\":[\"Once\\u0000 upon\"]}";
    expect_error_code(fx, "/v1/completions", nul_list, strlen(nul_list), 400, "NUL", "prompt[0]",
                      NULL);
    static const char nul_msg[] = "{\"messages\":[{\"role\":\"system\",\"content\":\"ok\"},"
                                  "{\"role\":\"user\",\"content\":\"Once\\u0000 upon\"}]}";
    expect_error_code(fx, "/v1/chat/completions", nul_msg, strlen(nul_msg), 400, "NUL",
                      "messages[1].content", NULL);
    static const char nul_part[] =
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
        "\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\\u0000c\"}]}]}";
    expect_error_code(fx, "/v1/chat/completions", nul_part, strlen(nul_part), 400, "NUL",
                      "messages[0].content[1].text", NULL);
    static const char nul_stop[] = "{\"prompt\":\"a\",\"stop\":[\"x\",\"\\u0000\"]}";
    expect_error_code(fx, "/v1/completions", nul_stop, strlen(nul_stop), 400, "NUL", "stop[1]",
                      NULL);
    /* a raw NUL byte inside a string */
    static const char raw_nul[] = "{\"prompt\":\"Once\0 upon\"}";
    expect_error_code(fx, "/v1/completions", raw_nul, sizeof raw_nul - 1, 400, "NUL", "prompt",
                      NULL);
    /* bytes that are not UTF-8: a stray continuation byte, an overlong form, a lone lead byte */
    static const char *const bad_utf8[] = {"{\"prompt\":\"caf\x80\"}", "{\"prompt\":\"\xC0\xAF\"}",
                                           "{\"prompt\":\"end\xE2\x82\"}",
                                           "{\"prompt\":\"\xED\xA0\x80\"}"};
    for (size_t i = 0; i < sizeof bad_utf8 / sizeof bad_utf8[0]; i++)
        expect_error_code(fx, "/v1/completions", bad_utf8[i], strlen(bad_utf8[i]), 400,
                          "prompt contains bytes that are not valid UTF-8", "prompt", NULL);
    static const char bad_msg[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"ol\xE9\"}]}";
    expect_error_code(fx, "/v1/chat/completions", bad_msg, strlen(bad_msg), 400, "not valid UTF-8",
                      "messages[0].content", NULL);
    /* an escaped lone surrogate is not valid JSON text */
    expect_error(fx, "/v1/completions", "{\"prompt\":\"\\ud800x\"}", 400, "not valid JSON", NULL);
    assert_int_equal(atomic_load(&fx->eng.submitted), 0);

    /* what must pass: an escaped backslash before u0000, multi-byte UTF-8 and surrogate pairs;
     * the engine gets the text whole */
    int status;
    cJSON *js =
        post_json(fx, "/v1/chat/completions",
                  "{\"messages\":[{\"role\":\"user\",\"content\":"
                  "\"a\\\\u0000b caf\xC3\xA9 \xE2\x82\xAC \\ud83d\\ude00 \xF0\x9F\x98\x80\"}]}",
                  &status);
    assert_int_equal(status, 200);
    cJSON_Delete(js);
    pthread_mutex_lock(&fx->eng.mu);
    assert_string_equal(fx->eng.last_messages, "user:a\\u0000b caf\xC3\xA9 \xE2\x82\xAC "
                                               "\xF0\x9F\x98\x80 \xF0\x9F\x98\x80|");
    pthread_mutex_unlock(&fx->eng.mu);
    expect_still_serving(fx);
}

/* ==== OpenAI's shapes: model_not_found, developer, echo, usage chunk ========================== */

static void test_unknown_model(void **state)
{
    fixture *fx = *state;
    static const char *const bodies[][2] = {
        {"/v1/completions", "{\"model\":\"gpt-4o\",\"prompt\":\"hi\"}"},
        {"/v1/completions", "{\"model\":\"\",\"prompt\":\"hi\"}"},
        {"/v1/completions", "{\"model\":\"TEST-MODEL\",\"prompt\":\"hi\",\"stream\":true}"},
        {"/v1/chat/completions",
         "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"},
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++)
        expect_error_code(fx, bodies[i][0], bodies[i][1], strlen(bodies[i][1]), 404,
                          "does not exist; this server serves 'test-model'", "model",
                          "model_not_found");
    assert_int_equal(atomic_load(&fx->eng.submitted), 0);
    /* the served name, or none at all, is served */
    int status;
    cJSON_Delete(
        post_json(fx, "/v1/completions", "{\"model\":\"test-model\",\"prompt\":\"hi\"}", &status));
    assert_int_equal(status, 200);
    cJSON_Delete(post_json(fx, "/v1/chat/completions",
                           "{\"model\":\"test-model\",\"messages\":[{\"role\":\"user\","
                           "\"content\":\"hi\"}]}",
                           &status));
    assert_int_equal(status, 200);
    /* /v1/models/NAME carries the same code */
    hcli_response resp;
    assert_int_equal(http_call(fx, "GET", "/v1/models/gpt-4", NULL, NULL, &resp), 404);
    cJSON *js = cJSON_Parse(resp.body);
    hcli_response_free(&resp);
    assert_string_equal(jstr(js, "error.code"), "model_not_found");
    assert_string_equal(jstr(js, "error.param"), "model");
    cJSON_Delete(js);
}

static void test_developer_role(void **state)
{
    fixture *fx = *state;
    int status;
    cJSON *js = post_json(fx, "/v1/chat/completions",
                          "{\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
                          "{\"role\":\"user\",\"content\":\"hi\"}]}",
                          &status);
    assert_int_equal(status, 200);
    cJSON_Delete(js);
    pthread_mutex_lock(&fx->eng.mu);
    assert_string_equal(fx->eng.last_messages, "system:be brief|user:hi|");
    pthread_mutex_unlock(&fx->eng.mu);
}

static void test_accepted_defaults(void **state)
{
    fixture *fx = *state;
    /* the "off" values of what the server cannot do are fine */
    static const char *const bodies[][2] = {
        {"/v1/completions", "{\"prompt\":\"hi\",\"logprobs\":null,\"echo\":false,\"n\":1,"
                            "\"best_of\":1,\"suffix\":\"\",\"top_logprobs\":0}"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                 "\"logprobs\":false,\"top_logprobs\":null,\"n\":1}"},
        {"/v1/completions", "{\"prompt\":\"hi\",\"stream\":false,\"stream_options\":null}"},
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        int status;
        cJSON *js = post_json(fx, bodies[i][0], bodies[i][1], &status);
        if (status != 200)
            fail_msg("body %s: status %d (%s)", bodies[i][1], status, cJSON_PrintUnformatted(js));
        cJSON_Delete(js);
    }
}

static void test_echo(void **state)
{
    fixture *fx = *state;
    int status;
    cJSON *js =
        post_json(fx, "/v1/completions", "{\"prompt\":\"Say hi: \",\"echo\":true}", &status);
    assert_int_equal(status, 200);
    assert_string_equal(jstr(js, "choices.0.text"), "Say hi: " FULL_TEXT);
    assert_int_equal(jnum(js, "usage.completion_tokens"), N_PIECES);
    cJSON_Delete(js);
    /* streamed: the prompt is the first event */
    stream_collect c = {0};
    hcli_response resp;
    assert_int_equal(stream_call(fx, "/v1/completions",
                                 "{\"prompt\":\"Say hi: \",\"echo\":true,\"stream\":true}", &c,
                                 &resp),
                     0);
    assert_int_equal(resp.status, 200);
    hcli_response_free(&resp);
    assert_false(c.bad_json);
    assert_string_equal(c.text, "Say hi: " FULL_TEXT);
    assert_int_equal(c.done, 1);
}

static void test_stream_include_usage(void **state)
{
    fixture *fx = *state;
    static const char *const bodies[][2] = {
        {"/v1/completions",
         "{\"prompt\":\"hi\",\"stream\":true,\"stream_options\":{\"include_usage\":true}}"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                                 "\"stream\":true,\"stream_options\":{\"include_usage\":true}}"},
    };
    for (size_t i = 0; i < 2; i++) {
        stream_collect c = {0};
        hcli_response resp;
        assert_int_equal(stream_call(fx, bodies[i][0], bodies[i][1], &c, &resp), 0);
        assert_int_equal(resp.status, 200);
        hcli_response_free(&resp);
        assert_false(c.bad_json);
        assert_string_equal(c.text, FULL_TEXT);
        assert_string_equal(c.finish, "stop");
        /* one usage chunk, last before [DONE]; every other chunk says "usage": null */
        assert_int_equal(c.usage_chunks, 1);
        assert_false(c.chunk_after_usage);
        assert_int_equal(c.usage_total, 2 + N_PIECES);
        assert_int_equal(c.usage_nulls, c.chunks + 1);
        assert_int_equal(c.done, 1);
    }
    /* without stream_options: no usage chunk (the final chunk carries usage, as before) */
    stream_collect d = {0};
    hcli_response resp;
    assert_int_equal(stream_call(fx, "/v1/completions",
                                 "{\"prompt\":\"hi\",\"stream\":true,\"stream_options\":{}}", &d,
                                 &resp),
                     0);
    hcli_response_free(&resp);
    assert_int_equal(d.usage_chunks, 0);
    assert_int_equal(d.usage_nulls, 0);
}

/* ==== logprobs =============================================================================== */

/* The fake answer's tokens as a completions answer writes them: é's two byte tokens in bytes form;
 * their character offsets in "Hello, wérld!" (both halves of é at its offset, 8). */
static const char *const LP_TOKENS[N_PIECES] = {"Hello",       ",",   " w", "bytes:\\xc3",
                                                "bytes:\\xa9", "rld", "!"};
static const int LP_OFFSETS[N_PIECES] = {0, 5, 6, 8, 8, 9, 12};

static void test_logprobs_params(void **state)
{
    fixture *fx = *state;
    static const struct {
        const char *path, *body;
        bool logprobs;
        int top;
    } cases[] = {
        {"/v1/completions", "{\"prompt\":\"hi\",\"logprobs\":3}", true, 3},
        {"/v1/completions", "{\"prompt\":\"hi\",\"logprobs\":0}", true, 0},
        {"/v1/completions", "{\"prompt\":\"hi\",\"logprobs\":5,\"echo\":false}", true, 5},
        {"/v1/completions", "{\"prompt\":\"hi\",\"logprobs\":false}", false, 0},
        {"/v1/completions", "{\"prompt\":\"hi\",\"logprobs\":null,\"top_logprobs\":0}", false, 0},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":true}", true, 0},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":true,"
         "\"top_logprobs\":20}",
         true, 20},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":false}", false, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int status;
        cJSON *js = post_json(fx, cases[i].path, cases[i].body, &status);
        if (status != 200)
            fail_msg("body %s: status %d (%s)", cases[i].body, status, cJSON_PrintUnformatted(js));
        /* asked for: an object; not asked for: null */
        assert_true(cases[i].logprobs ? cJSON_IsObject(jget(js, "choices.0.logprobs"))
                                      : cJSON_IsNull(jget(js, "choices.0.logprobs")));
        cJSON_Delete(js);
        pthread_mutex_lock(&fx->eng.mu);
        if (fx->eng.last.logprobs != cases[i].logprobs || fx->eng.last.top_logprobs != cases[i].top)
            fail_msg("body %s: the engine got logprobs %d top_logprobs %d", cases[i].body,
                     fx->eng.last.logprobs, fx->eng.last.top_logprobs);
        pthread_mutex_unlock(&fx->eng.mu);
    }
}

static void test_logprobs_completion(void **state)
{
    fixture *fx = *state;
    int status;
    cJSON *js = post_json(fx, "/v1/completions", "{\"prompt\":\"hi\",\"logprobs\":2}", &status);
    assert_int_equal(status, 200);
    assert_string_equal(jstr(js, "choices.0.text"), FULL_TEXT);
    const cJSON *lp = jget(js, "choices.0.logprobs");
    /* tokens, token_logprobs, top_logprobs, text_offset */
    assert_int_equal(cJSON_GetArraySize(lp), 4);
    assert_int_equal(cJSON_GetArraySize(jget(lp, "tokens")), N_PIECES);
    assert_int_equal(cJSON_GetArraySize(jget(lp, "token_logprobs")), N_PIECES);
    assert_int_equal(cJSON_GetArraySize(jget(lp, "top_logprobs")), N_PIECES);
    assert_int_equal(cJSON_GetArraySize(jget(lp, "text_offset")), N_PIECES);
    for (int i = 0; i < N_PIECES; i++) {
        char path[64];
        snprintf(path, sizeof path, "tokens.%d", i);
        assert_string_equal(jstr(lp, path), LP_TOKENS[i]);
        snprintf(path, sizeof path, "token_logprobs.%d", i);
        assert_true(jnum(lp, path) == -0.25 * (i + 1));
        snprintf(path, sizeof path, "text_offset.%d", i);
        assert_int_equal(jnum(lp, path), LP_OFFSETS[i]);
        /* {text: logprob}: the token itself and "B"; the last token: "A", "B" and itself */
        const cJSON *top = cJSON_GetArrayItem(jget(lp, "top_logprobs"), i);
        assert_true(cJSON_IsObject(top));
        const cJSON *self = cJSON_GetObjectItemCaseSensitive(top, LP_TOKENS[i]);
        assert_true(cJSON_IsNumber(self) && self->valuedouble == -0.25 * (i + 1));
        if (i < N_PIECES - 1) {
            assert_int_equal(cJSON_GetArraySize(top), 2);
            assert_true(jnum(top, "B") == -0.25 * (i + 1) - 1);
        } else {
            assert_int_equal(cJSON_GetArraySize(top), 3);
            assert_true(jnum(top, "A") == -1.75 + 1.0 && jnum(top, "B") == -1.75 + 0.5);
        }
    }
    cJSON_Delete(js);

    /* logprobs 0: the chosen tokens' logprobs, top_logprobs null for each */
    js = post_json(fx, "/v1/completions", "{\"prompt\":\"hi\",\"logprobs\":0,\"max_tokens\":4}",
                   &status);
    assert_int_equal(status, 200);
    lp = jget(js, "choices.0.logprobs");
    assert_int_equal(cJSON_GetArraySize(jget(lp, "tokens")), 4);
    for (int i = 0; i < 4; i++)
        assert_true(cJSON_IsNull(cJSON_GetArrayItem(jget(lp, "top_logprobs"), i)));
    assert_string_equal(jstr(lp, "tokens.3"), "bytes:\\xc3");
    cJSON_Delete(js);

    /* a stop string cut the text at byte 8: the tokens from there on are not reported */
    js = post_json(fx, "/v1/completions", "{\"prompt\":\"stop-cut\",\"logprobs\":1}", &status);
    assert_int_equal(status, 200);
    assert_string_equal(jstr(js, "choices.0.text"), "Hello, w");
    lp = jget(js, "choices.0.logprobs");
    assert_int_equal(cJSON_GetArraySize(jget(lp, "tokens")), 3);
    assert_string_equal(jstr(lp, "tokens.2"), " w");
    cJSON_Delete(js);
}

static void test_logprobs_chat(void **state)
{
    fixture *fx = *state;
    int status;
    cJSON *js =
        post_json(fx, "/v1/chat/completions",
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":true,"
                  "\"top_logprobs\":3}",
                  &status);
    assert_int_equal(status, 200);
    const cJSON *lp = jget(js, "choices.0.logprobs");
    assert_true(cJSON_IsNull(jget(lp, "refusal")));
    const cJSON *content = jget(lp, "content");
    assert_int_equal(cJSON_GetArraySize(content), N_PIECES);
    for (int i = 0; i < N_PIECES; i++) {
        const cJSON *t = cJSON_GetArrayItem(content, i);
        assert_string_equal(jstr(t, "token"), LP_TOKENS[i]);
        assert_true(jnum(t, "logprob") == -0.25 * (i + 1));
        /* bytes: the piece's bytes, whatever the token text shows */
        const cJSON *bytes = jget(t, "bytes");
        assert_int_equal(cJSON_GetArraySize(bytes), strlen(PIECES[i]));
        for (size_t b = 0; b < strlen(PIECES[i]); b++)
            assert_int_equal(cJSON_GetArrayItem(bytes, (int)b)->valuedouble,
                             (unsigned char)PIECES[i][b]);
        const cJSON *top = jget(t, "top_logprobs");
        assert_int_equal(cJSON_GetArraySize(top), 3);
        const char *first = i < N_PIECES - 1 ? LP_TOKENS[i] : "A";
        assert_string_equal(jstr(top, "0.token"), first);
        assert_true(cJSON_IsArray(jget(top, "0.bytes")));
        assert_true(jnum(top, "0.logprob") >= jnum(top, "1.logprob"));
        assert_true(jnum(top, "1.logprob") >= jnum(top, "2.logprob"));
    }
    assert_int_equal(jnum(lp, "content.3.bytes.0"), 0xC3);
    cJSON_Delete(js);

    /* logprobs without top_logprobs: each top_logprobs is an empty list */
    js = post_json(fx, "/v1/chat/completions",
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"logprobs\":true}",
                   &status);
    assert_int_equal(status, 200);
    content = jget(js, "choices.0.logprobs.content");
    assert_int_equal(cJSON_GetArraySize(content), N_PIECES);
    for (int i = 0; i < N_PIECES; i++) {
        const cJSON *top = jget(cJSON_GetArrayItem(content, i), "top_logprobs");
        assert_true(cJSON_IsArray(top) && cJSON_GetArraySize(top) == 0);
    }
    cJSON_Delete(js);
}

/* A stream's logprobs: each chunk's arrays appended to `merged`; chunks with text counted. */
typedef struct {
    hcli_sse sse;
    cJSON *merged;
    int text_chunks, text_chunks_without;
    bool bad, final_null;
} lp_collect;

static int lp_on_event(void *ctx, const char *data, size_t len)
{
    lp_collect *c = ctx;
    (void)len;
    if (!strcmp(data, "[DONE]"))
        return 0;
    cJSON *js = cJSON_Parse(data);
    const cJSON *lp = js ? jget(js, "choices.0.logprobs") : NULL;
    if (!js || !lp) {
        c->bad = true;
        cJSON_Delete(js);
        return 0;
    }
    bool final = cJSON_IsString(jget(js, "choices.0.finish_reason"));
    const cJSON *text = jget(js, "choices.0.text");
    if (!text)
        text = jget(js, "choices.0.delta.content");
    if (cJSON_IsString(text) && *text->valuestring) {
        c->text_chunks++;
        c->text_chunks_without += !cJSON_IsObject(lp);
    }
    if (final)
        c->final_null = cJSON_IsNull(lp);
    const cJSON *arr;
    cJSON_ArrayForEach(arr, lp)
    {
        if (!cJSON_IsArray(arr))
            continue;
        cJSON *into = cJSON_GetObjectItemCaseSensitive(c->merged, arr->string);
        if (!into)
            into = cJSON_AddArrayToObject(c->merged, arr->string);
        const cJSON *item;
        cJSON_ArrayForEach(item, arr)
        {
            cJSON_AddItemToArray(into, cJSON_Duplicate(item, true));
        }
    }
    cJSON_Delete(js);
    return 0;
}

static int lp_on_body(void *ctx, const char *data, size_t len)
{
    lp_collect *c = ctx;
    return hcli_sse_feed(&c->sse, data, len);
}

/* Streamed and plain answers to the same body: the chunks' logprobs put together equal the plain
 * answer's arrays, every text chunk carries a logprobs object, the final chunk none. */
static void expect_stream_logprobs(const fixture *fx, const char *path, const char *body,
                                   const char *stream_body, int n_tokens)
{
    int status;
    cJSON *plain = post_json(fx, path, body, &status);
    assert_int_equal(status, 200);
    const cJSON *want = jget(plain, "choices.0.logprobs");
    lp_collect c = {.merged = cJSON_CreateObject()};
    hcli_sse_init(&c.sse, lp_on_event, &c);
    hcli_request rq = {.path = path,
                       .body = stream_body,
                       .body_len = strlen(stream_body),
                       .timeout_ms = TIMEOUT_MS,
                       .on_body = lp_on_body,
                       .ctx = &c};
    hcli_response resp;
    char err[256];
    assert_int_equal(hcli_do(fx->url, &rq, &resp, err, sizeof err), 0);
    hcli_sse_free(&c.sse);
    assert_int_equal(resp.status, 200);
    hcli_response_free(&resp);
    assert_false(c.bad);
    assert_true(c.text_chunks >= 2);
    assert_int_equal(c.text_chunks_without, 0);
    assert_true(c.final_null); /* nothing was left for the final chunk */
    const cJSON *arr;
    int arrays = 0;
    cJSON_ArrayForEach(arr, want)
    {
        if (!cJSON_IsArray(arr))
            continue;
        arrays++;
        const cJSON *got = cJSON_GetObjectItemCaseSensitive(c.merged, arr->string);
        assert_int_equal(cJSON_GetArraySize(arr), n_tokens);
        if (!got || !cJSON_Compare(arr, got, true))
            fail_msg("%s %s: streamed %s %s, plain %s", path, stream_body, arr->string,
                     got ? cJSON_PrintUnformatted(got) : "(none)", cJSON_PrintUnformatted(arr));
    }
    assert_int_equal(arrays, cJSON_GetArraySize(c.merged));
    cJSON_Delete(c.merged);
    cJSON_Delete(plain);
}

static void test_logprobs_stream(void **state)
{
    fixture *fx = *state;
    expect_stream_logprobs(fx, "/v1/completions", "{\"prompt\":\"hi\",\"logprobs\":2}",
                           "{\"prompt\":\"hi\",\"logprobs\":2,\"stream\":true}", N_PIECES);
    expect_stream_logprobs(fx, "/v1/chat/completions",
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                           "\"logprobs\":true,\"top_logprobs\":2}",
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                           "\"logprobs\":true,\"top_logprobs\":2,\"stream\":true}",
                           N_PIECES);
    /* the stop string's cut: the same three tokens streamed */
    expect_stream_logprobs(fx, "/v1/completions", "{\"prompt\":\"stop-cut\",\"logprobs\":0}",
                           "{\"prompt\":\"stop-cut\",\"logprobs\":0,\"stream\":true}", 3);
}

/* ==== idle connections ======================================================================== */

static int raw_connect(int port)
{
    int fd = connect_local(port);
    return fd;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Seconds until the server closes fd (reading whatever it sends), at most limit_s. */
static double seconds_until_closed(int fd, double limit_s)
{
    double t0 = now_s();
    struct timeval tv = {0, 100000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[4096];
    while (now_s() - t0 < limit_s) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            break;
    }
    return now_s() - t0;
}

/* The header timeout (1 s here): a connection that sends nothing, or half a header, is closed;
 * one that is done with its answer and waits on keep-alive too. */
static void test_header_timeout(void **state)
{
    fixture *fx = *state;
    int quiet = raw_connect(fx->port);
    int half = raw_connect(fx->port);
    static const char partial[] = "GET /health HTTP/1.1\r\nHost: x\r\n";
    assert_int_equal(send(half, partial, strlen(partial), MSG_NOSIGNAL), (ssize_t)strlen(partial));
    double a = seconds_until_closed(quiet, 10), b = seconds_until_closed(half, 10);
    close(quiet);
    close(half);
    assert_true(a < 4.0);
    assert_true(b < 4.0);
    expect_still_serving(fx);
}

/* More idle connections than the budget (64 here; header timeout 30 s): once all but 1/8 of the
 * budget is open, each new connection evicts the one that has waited longest for a header, so a
 * good request that comes after the flood is answered at once rather than reset (or kept waiting
 * for the 30 s header timeout); connections that sent their request are never evicted. */
typedef struct {
    const fixture *fx;
    stream_collect c;
    int rc;
} slow_stream;

static void *run_slow_stream(void *arg)
{
    slow_stream *ss = arg;
    hcli_response resp;
    ss->rc = stream_call(ss->fx, "/v1/completions", "{\"prompt\":\"slow\",\"stream\":true}", &ss->c,
                         &resp);
    hcli_response_free(&resp);
    return NULL;
}

static void test_idle_flood_over_budget(void **state)
{
    fixture *fx = *state;
    enum { FLOOD = 70 };
    int fds[FLOOD];
    /* a stream in flight (50 ticks of 20 ms), which the floods below must not disturb */
    slow_stream ss = {.fx = fx, .c = {.stop_after = 50}};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, run_slow_stream, &ss), 0);
    fake_sleep_ms(100);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < FLOOD; i++)
            fds[i] = raw_connect(fx->port); /* those past the budget are reset by the server */
        fake_sleep_ms(200);
        /* (the fake engine runs one request at a time and is busy with the stream: /health
         * measures the server alone) */
        double t0 = now_s();
        hcli_request rq = {.path = "/health", .timeout_ms = 20000};
        hcli_response resp;
        char err[256];
        int rc = hcli_do(fx->url, &rq, &resp, err, sizeof err);
        double took = now_s() - t0;
        if (rc)
            fail_msg("the request after the flood failed: %s", err);
        assert_int_equal(resp.status, 200);
        hcli_response_free(&resp);
        printf("  a request after %d idle connections (budget 64) was answered in %.3f s\n", FLOOD,
               took);
        assert_true(took < 1.0);
        for (int i = 0; i < FLOOD; i++)
            close(fds[i]);
    }
    pthread_join(t, NULL);
    assert_int_equal(ss.rc, HCLI_ABORTED); /* ended by the client after 50 chunks, not cut */
    assert_int_equal(ss.c.chunks, 50);
    expect_still_serving(fx);
    hcli_response m;
    http_call(fx, "GET", "/metrics", NULL, NULL, &m);
    assert_non_null(strstr(m.body, "orochi_http_connection_limit 64\n"));
    const char *ev = strstr(m.body, "\norochi_http_connections_evicted_total ");
    assert_non_null(ev);
    assert_true(atoi(ev + strlen("\norochi_http_connections_evicted_total ")) > 0);
    hcli_response_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_object),
        cmocka_unit_test(test_client_url),
        cmocka_unit_test(test_client_sse_parser),
        cmocka_unit_test_setup_teardown(test_completion, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_chat, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_stream_completion, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_stream_chat, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_invalid_json, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_wrong_types, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_bad_max_tokens, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_prompt_too_long, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_engine_failures, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_routes, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_page_and_status, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_body_too_large, setup_small_body, fx_teardown),
        cmocka_unit_test_setup_teardown(test_api_key, setup_auth, fx_teardown),
        cmocka_unit_test_setup_teardown(test_metrics, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_garbage_traffic, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_clients, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_client_gone_cancels, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_idle_timeout, setup_short_idle, fx_teardown),
        cmocka_unit_test_setup_teardown(test_open_connections, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_stop_with_request_in_flight, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_start_errors, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_cli_generate, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_text_whole, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_unknown_model, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_developer_role, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_accepted_defaults, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_echo, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_stream_include_usage, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_logprobs_params, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_logprobs_completion, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_logprobs_chat, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_logprobs_stream, setup_default, fx_teardown),
        cmocka_unit_test_setup_teardown(test_header_timeout, setup_short_header, fx_teardown),
        cmocka_unit_test_setup_teardown(test_idle_flood_over_budget, setup_small_budget,
                                        fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
