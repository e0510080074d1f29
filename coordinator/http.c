/*
 * coordinator/http.c — the transport of the coordinator's OpenAI-compatible HTTP API (see http.h
 * and docs/http-api.md): the server's life, connections, routes, authentication, waiting for the
 * engine, streaming with keep-alives, counters. What a body means and how an answer reads is the
 * format module's, coordinator/openai.c, which does no I/O.
 *
 * Threading model. libmicrohttpd runs in thread-per-connection mode (MHD_USE_THREAD_PER_CONNECTION
 * with its internal listening thread, poll() based). Each connection's handler may therefore block:
 * a generation request is submitted to the engine, then the handler (non-streaming) or the
 * content-reader callback (streaming) sleeps on the request's condition variable until the engine
 * appends text or ends it. This keeps the code a straight line; the price is one thread per open
 * connection. The engine serves a handful of sequences, but idle connections are cheap to open, so
 * the connection budget is large (2048 by default, within the open-file limit), connections that
 * have not sent a whole request header are closed after a short quiet spell (the header timeout,
 * 10 s), and once all but 1/8 of the budget is open each new connection evicts the one that has
 * waited longest for a header (http_on_connection), so idle sockets cannot deny service
 * (slowloris). Measured with 1000 idle connections held open: a good request is answered in a few
 * milliseconds; each idle connection costs its thread, about 112 KiB of resident memory (nearly all
 * of it the binary's static TLS, which glibc zeroes for every new thread) and 8 MiB of untouched
 * address space for the stack. The alternative, libmicrohttpd's epoll mode with a thread pool and
 * suspend/resume driven by a wakeup path from the engine thread, would make idle connections
 * cheaper but every waiting handler asynchronous; at this budget the threads are acceptable.
 *
 * Timeouts: the daemon-wide timeout is the header timeout. When a request's header is complete the
 * connection's timeout becomes the idle timeout (body upload, answer); a generation turns it off
 * until answered; a keep-alive connection goes back to the header timeout between requests.
 * libmicrohttpd counts these as inactivity, so a client that trickles header bytes keeps its slot
 * longer; the eviction and the budget bound what that costs.
 *
 * Waits are sliced into HTTP_TICK_MS ticks. Between ticks a handler checks whether the client has
 * hung up (poll for POLLRDHUP on the connection's socket) and whether the server is stopping;
 * either way it cancels the request so the engine stops spending steps on it. A streaming response
 * also notices a vanished client when a write fails: libmicrohttpd then destroys the response and
 * our free callback cancels the request.
 *
 * Request life: the first call of the access handler (headers only) sets up an http_exchange as
 * the connection's per-request state; body bytes accumulate in it up to max_body_bytes (the rest
 * is read and thrown away, so the 413 answer is not lost to a TCP reset; a client that announced
 * "Expect: 100-continue" or a body far beyond the limit is answered at once instead). The last
 * call routes, authenticates, validates and answers. Every answer goes through http_send, which
 * also counts it for /metrics.
 *
 * Text from the engine is bytes; a token may end in the middle of a UTF-8 character. Streams hold
 * back an incomplete trailing sequence until the next piece completes it, and every string put
 * into JSON is first made valid UTF-8 (invalid bytes become U+FFFD), so clients always receive
 * valid JSON. Text coming in is held to a stricter rule: a string in the body that holds a NUL
 * character or bytes that are not UTF-8 is refused (400, param naming it), because the C strings
 * that carry prompts to the engine would silently cut or mangle it.
 *
 * logprobs: the engine appends a record per reported token (its id, logprob, alternatives, piece
 * bytes and the byte offset where its text begins) before the text it starts in. A plain answer
 * renders them all; a stream sends with each chunk the records of the tokens whose text begins in
 * the bytes that chunk releases, so the chunks put together equal the plain answer. Pieces that are
 * not valid UTF-8 on their own are written as "bytes:\xhh..." (chat's "bytes" has the real bytes),
 * and completions' text_offset counts characters of the text as sent.
 */
#define _GNU_SOURCE
#include "coordinator/http.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/utf8.h"
#include "coordinator/openai.h"

#define HTTP_TICK_MS 200              /* how often a waiting handler looks for hang-up / stop */
#define HTTP_DRAIN_FACTOR 16          /* bodies beyond 16x the limit are refused without reading */
#define HTTP_MAX_COUNTERS 96          /* distinct (route, code) pairs counted for /metrics */
#define HTTP_STREAM_BLOCK 16384       /* libmicrohttpd buffer for streamed responses */
#define HTTP_CLIENT_GONE 499          /* metrics code for a client that left before the answer */
#define HTTP_DEFAULT_CONNECTIONS 2048 /* connection budget when the config names none */
#define HTTP_FD_RESERVE 256           /* descriptors left to the rest of the process */
#define HTTP_ROOM_SHARE 8             /* 1/8 of the budget is kept free for new connections */

enum {
    ROUTE_COMPLETIONS,
    ROUTE_CHAT,
    ROUTE_MODELS,
    ROUTE_HEALTH,
    ROUTE_METRICS,
    ROUTE_PAGE,
    ROUTE_STATUS,
    ROUTE_OTHER,
    ROUTE_COUNT
};
static const char *const HTTP_ROUTE_LABEL[ROUTE_COUNT] = {"/v1/completions", "/v1/chat/completions",
                                                          "/v1/models",      "/health",
                                                          "/metrics",        "/",
                                                          "/status",         "other"};

/* The page at `/`: coordinator/page/index.html, made into a C array at build time
 * (coordinator/page/embed.cmake). */
extern const unsigned char http_page_html[];
extern const size_t http_page_html_len;

typedef struct {
    int route, code;
    uint64_t count;
} http_counter;

/* An open connection (libmicrohttpd's socket context). While it waits for a request header it is
 * in the server's waiting list, oldest first: the connections that may be evicted to make room. */
typedef struct http_conn {
    struct http_conn *prev, *next;
    int fd;
    bool waiting;
} http_conn;

struct http_server {
    struct MHD_Daemon *mhd;
    http_engine engine;
    char *api_key, *model_name; /* api_key NULL: no authentication */
    size_t max_body;
    int max_tokens_cap, keepalive_ms, idle_timeout_s, header_timeout_s, port;
    openai_limits lim; /* model_name and max_tokens_cap, for the format (coordinator/openai.h) */
    unsigned max_conn; /* the connection budget */
    bool quiet;
    time_t started;
    uint64_t id_salt;
    atomic_bool stopping;
    atomic_uint_fast64_t next_id;
    atomic_int active; /* generation requests held by HTTP threads */
    atomic_int open;   /* connections open now (libmicrohttpd's started minus closed) */

    pthread_mutex_t mu; /* guards counters, n_counters, the waiting list, evicted, starting,
                         * start_err */
    http_counter counters[HTTP_MAX_COUNTERS];
    int n_counters;
    http_conn *wait_head, *wait_tail;
    uint64_t evicted;
    bool starting;
    char start_err[256];
};

/* Per-request state of one connection (libmicrohttpd's *con_cls). */
typedef struct {
    int route;
    bool too_large;
    bool streaming; /* an event stream was queued: counted when it ends (http_on_completed) */
    strbuf body;
} http_exchange;

/* One streaming response (the content-reader callback's closure): the transport's state around
 * the OpenAI stream that formats it (coordinator/openai.h). */
typedef struct {
    http_server *srv;
    int fd;
    bool ended;      /* every choice's stream ended */
    size_t text_off; /* the engine text of the current choice taken so far */
    size_t out_off;  /* SSE bytes of the current fmt.out handed to libmicrohttpd */
    size_t out_seen; /* fmt.out's length when the last event was noticed (keepalive timing) */
    double last_emit;
    /* one stream per choice (n > 1), sent one after the other: cur is the one being sent, and
     * fmt[cur] the OpenAI stream that formats it */
    int n, cur;
    bool cur_done; /* fmt[cur]'s request ended: its last bytes are being sent */
    openai_stream fmt[OPENAI_MAX_CHOICES];
} http_stream;

static enum MHD_Result http_on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                       const char *method, const char *version,
                                       const char *upload_data, size_t *upload_data_size,
                                       void **con_cls);
static void http_on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                              enum MHD_RequestTerminationCode toe);
static void http_on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                               enum MHD_ConnectionNotificationCode code);
static void http_log(void *cls, const char *fmt, va_list ap);

/* ==== server life ============================================================================= */

static int http_resolve(const char *host, int port, struct sockaddr_storage *ss, char *err,
                        size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc) {
        snprintf(err, errlen, "http: cannot resolve bind address '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    memset(ss, 0, sizeof *ss);
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

/* The connection budget: what the config asks (default 2048) within the open-file limit, less a
 * reserve for the rest of the process. The soft limit is raised as far as the hard one allows
 * when the budget needs it (libmicrohttpd polls with poll(), so descriptors above FD_SETSIZE are
 * fine). */
static unsigned http_connection_budget(const http_config *cfg, bool quiet)
{
    unsigned want =
        cfg->max_connections > 0 ? (unsigned)cfg->max_connections : HTTP_DEFAULT_CONNECTIONS;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl))
        return want;
    rlim_t need = (rlim_t)want + HTTP_FD_RESERVE;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        struct rlimit raised = rl;
        raised.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
        if (raised.rlim_cur > rl.rlim_cur && !setrlimit(RLIMIT_NOFILE, &raised))
            rl.rlim_cur = raised.rlim_cur;
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        rlim_t fit =
            rl.rlim_cur > 2 * HTTP_FD_RESERVE ? rl.rlim_cur - HTTP_FD_RESERVE : rl.rlim_cur / 2;
        if (!quiet)
            fprintf(stderr,
                    "orochi http: the open-file limit (%llu) leaves room for %llu connections, "
                    "not %u\n",
                    (unsigned long long)rl.rlim_cur, (unsigned long long)fit, want);
        want = fit ? (unsigned)fit : 1;
    }
    return want;
}

http_server *http_server_start(const http_config *cfg, const http_engine *engine, char *err,
                               size_t errlen)
{
    static const http_config defaults = {0};
    if (!cfg)
        cfg = &defaults;
    if (!engine || !engine->submit) {
        snprintf(err, errlen, "http: the engine provides no submit callback");
        return NULL;
    }
    if (cfg->port < 0 || cfg->port > 65535) {
        snprintf(err, errlen, "http: port %d is out of range", cfg->port);
        return NULL;
    }
    const char *bind_addr = cfg->bind_addr && *cfg->bind_addr ? cfg->bind_addr : "127.0.0.1";
    struct sockaddr_storage ss;
    if (http_resolve(bind_addr, cfg->port, &ss, err, errlen))
        return NULL;

    http_server *srv = calloc(1, sizeof *srv);
    if (!srv || pthread_mutex_init(&srv->mu, NULL)) {
        free(srv);
        snprintf(err, errlen, "http: out of memory");
        return NULL;
    }
    srv->engine = *engine;
    srv->api_key = cfg->api_key && *cfg->api_key ? strdup(cfg->api_key) : NULL;
    srv->model_name = strdup(cfg->model_name && *cfg->model_name ? cfg->model_name : "orochi");
    srv->max_body = cfg->max_body_bytes ? cfg->max_body_bytes : (size_t)1 << 20;
    srv->max_tokens_cap = cfg->max_tokens_cap > 0 ? cfg->max_tokens_cap : 4096;
    srv->lim = (openai_limits){.model_name = srv->model_name, .max_tokens_cap = srv->max_tokens_cap};
    srv->keepalive_ms = cfg->keepalive_ms > 0 ? cfg->keepalive_ms : 15000;
    srv->idle_timeout_s = cfg->idle_timeout_s > 0 ? cfg->idle_timeout_s : 60;
    srv->header_timeout_s = cfg->header_timeout_s > 0 ? cfg->header_timeout_s : 10;
    if (srv->header_timeout_s > srv->idle_timeout_s)
        srv->header_timeout_s = srv->idle_timeout_s;
    srv->quiet = cfg->quiet;
    srv->started = time(NULL);
    srv->id_salt = ((uint64_t)srv->started << 20) ^ ((uint64_t)getpid() << 40) ^ (uintptr_t)srv;
    atomic_init(&srv->stopping, false);
    atomic_init(&srv->next_id, 1);
    atomic_init(&srv->active, 0);
    atomic_init(&srv->open, 0);
    if ((cfg->api_key && *cfg->api_key && !srv->api_key) || !srv->model_name) {
        snprintf(err, errlen, "http: out of memory");
        http_server_stop(&srv);
        return NULL;
    }

    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    srv->max_conn = http_connection_budget(cfg, cfg->quiet);
    srv->starting = true;
    /* the daemon-wide timeout is the header timeout: a connection starts out waiting for one */
    srv->mhd = MHD_start_daemon(
        flags, (uint16_t)cfg->port, NULL, NULL, http_on_request, srv, MHD_OPTION_EXTERNAL_LOGGER,
        http_log, srv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT,
        srv->max_conn, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)srv->header_timeout_s,
        MHD_OPTION_NOTIFY_COMPLETED, http_on_completed, srv, MHD_OPTION_NOTIFY_CONNECTION,
        http_on_connection, srv, MHD_OPTION_END);
    pthread_mutex_lock(&srv->mu);
    srv->starting = false;
    pthread_mutex_unlock(&srv->mu);
    if (!srv->mhd) {
        snprintf(err, errlen, "http: cannot serve on %s port %d: %s", bind_addr, cfg->port,
                 srv->start_err[0] ? srv->start_err : "libmicrohttpd refused to start");
        http_server_stop(&srv);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(srv->mhd, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = info ? info->port : cfg->port;
    return srv;
}

int http_server_port(const http_server *srv)
{
    return srv->port;
}

int http_server_open_connections(http_server *srv)
{
    return atomic_load(&srv->open);
}

void http_server_stop(http_server **psrv)
{
    if (!psrv || !*psrv)
        return;
    http_server *srv = *psrv;
    *psrv = NULL;
    /* waiting handlers see the flag within a tick, cancel their requests and return, so that
     * MHD_stop_daemon can join their threads */
    atomic_store(&srv->stopping, true);
    if (srv->mhd)
        MHD_stop_daemon(srv->mhd);
    free(srv->api_key);
    free(srv->model_name);
    pthread_mutex_destroy(&srv->mu);
    free(srv);
}

/* libmicrohttpd's messages: kept as the start error while starting, else printed unless quiet. */
static void http_log(void *cls, const char *fmt, va_list ap)
{
    http_server *srv = cls;
    char line[256];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == ' '))
        line[--n] = 0;
    pthread_mutex_lock(&srv->mu);
    bool starting = srv->starting;
    if (starting && !srv->start_err[0])
        snprintf(srv->start_err, sizeof srv->start_err, "%s", line);
    pthread_mutex_unlock(&srv->mu);
    if (!starting && !srv->quiet)
        fprintf(stderr, "orochi http: %s\n", line);
}

/* ==== small helpers =========================================================================== */

static double http_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Constant-time comparison so the API key cannot be guessed byte by byte from response times. */
static bool http_equal_ct(const char *a, size_t na, const char *b, size_t nb)
{
    unsigned char diff = na != nb;
    size_t n = na > nb ? na : nb;
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)((i < na ? a[i] : 0) ^ (i < nb ? b[i] : 0));
    return diff == 0;
}

/* Has the peer closed its side of the connection? (Clients do not half-close HTTP requests, so
 * an end-of-stream on the socket means the client went away.) */
static bool http_peer_gone(int fd)
{
    if (fd < 0)
        return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

static int http_route_of(const char *url)
{
    if (!strcmp(url, "/v1/completions"))
        return ROUTE_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions"))
        return ROUTE_CHAT;
    if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11))
        return ROUTE_MODELS;
    if (!strcmp(url, "/health"))
        return ROUTE_HEALTH;
    if (!strcmp(url, "/metrics"))
        return ROUTE_METRICS;
    if (!strcmp(url, "/"))
        return ROUTE_PAGE;
    if (!strcmp(url, "/status"))
        return ROUTE_STATUS;
    return ROUTE_OTHER;
}

/* ==== answers ================================================================================= */

static void http_count(http_server *srv, int route, int code)
{
    pthread_mutex_lock(&srv->mu);
    int i = 0;
    while (i < srv->n_counters &&
           (srv->counters[i].route != route || srv->counters[i].code != code))
        i++;
    if (i == srv->n_counters && i < HTTP_MAX_COUNTERS)
        srv->counters[srv->n_counters++] = (http_counter){route, code, 0};
    if (i < srv->n_counters)
        srv->counters[i].count++;
    pthread_mutex_unlock(&srv->mu);
}

/* Queues `body` (malloc'd; taken) as the answer and counts it. */
static enum MHD_Result http_send(http_server *srv, struct MHD_Connection *conn, int route,
                                 int status, const char *content_type, char *body, size_t len,
                                 const char *allow)
{
    struct MHD_Response *r = MHD_create_response_from_buffer_with_free_callback(len, body, free);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (status == 401)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == 503 || status == 429) /* draining, not ready, or full: worth a retry soon */
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    enum MHD_Result ok = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    http_count(srv, route, status);
    return ok;
}

/* Serializes and queues `js` (taken); a newline ends the body for the benefit of curl users. */
static enum MHD_Result http_send_json(http_server *srv, struct MHD_Connection *conn, int route,
                                      int status, cJSON *js, const char *allow)
{
    char *text = js ? cJSON_PrintUnformatted(js) : NULL;
    cJSON_Delete(js);
    if (!text)
        return MHD_NO; /* out of memory: dropping the connection is all that is left */
    size_t n = strlen(text);
    char *body = malloc(n + 2);
    if (body) {
        memcpy(body, text, n);
        body[n] = '\n';
        body[n + 1] = 0;
    }
    cJSON_free(text);
    if (!body)
        return MHD_NO;
    return http_send(srv, conn, route, status, "application/json", body, n + 1, allow);
}

static enum MHD_Result http_send_error(http_server *srv, struct MHD_Connection *conn, int route,
                                       int status, const char *message, const char *param,
                                       const char *code)
{
    return http_send_json(srv, conn, route, status, openai_error_json(status, message, param, code),
                          NULL);
}

static enum MHD_Result http_send_405(http_server *srv, struct MHD_Connection *conn, int route,
                                     const char *method, const char *url, const char *allow)
{
    char msg[320];
    snprintf(msg, sizeof msg, "method %.16s is not allowed on %.200s; use %s", method, url, allow);
    return http_send_json(srv, conn, route, 405, openai_error_json(405, msg, NULL, NULL), allow);
}

static enum MHD_Result http_send_too_large(http_server *srv, struct MHD_Connection *conn,
                                           http_exchange *ex)
{
    char msg[160];
    snprintf(msg, sizeof msg, "the request body exceeds the limit of %zu bytes", srv->max_body);
    return http_send_error(srv, conn, ex->route, 413, msg, NULL, NULL);
}

/* ==== streaming =============================================================================== */

/* Waits one tick for news and turns it into SSE bytes (coordinator/openai.c formats them). -1:
 * give up (client gone, server stopping, out of memory); the request is cancelled. */
static int http_stream_pull(http_stream *st)
{
    openai_stream *f = &st->fmt[st->cur];
    size_t before = f->out.len;
    char *piece = NULL;
    size_t plen = 0;
    coord_request_state state =
        coord_request_wait(f->req, &st->text_off, HTTP_TICK_MS, &piece, &plen);
    if (piece) {
        openai_stream_text(f, piece, plen, false);
        free(piece);
    }
    if (state == COORD_REQ_DONE || state == COORD_REQ_FAILED) {
        openai_stream_finish(f);
        st->cur_done = true; /* the next choice's turn once these bytes are out */
        st->ended = st->cur + 1 == st->n;
    } else if (!piece) {
        if (atomic_load(&st->srv->stopping) || http_peer_gone(st->fd) ||
            coord_request_cancelled(f->req)) {
            coord_request_cancel(f->req);
            return -1;
        }
        if ((http_now() - st->last_emit) * 1000.0 >= st->srv->keepalive_ms)
            strbuf_add(&f->out, ": keepalive\n\n", 13);
    }
    if (f->out.len != before)
        st->last_emit = http_now();
    if (f->out.oom) {
        coord_request_cancel(f->req);
        return -1;
    }
    return 0;
}

static ssize_t http_stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    http_stream *st = cls;
    strbuf *out = &st->fmt[st->cur].out;
    (void)pos;
    while (st->out_off == out->len) {
        if (st->ended)
            return MHD_CONTENT_READER_END_OF_STREAM;
        out->len = st->out_off = 0;
        if (st->cur_done) {
            st->cur++;
            st->cur_done = false;
            st->text_off = 0;
            out = &st->fmt[st->cur].out;
        }
        if (http_stream_pull(st))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = out->len - st->out_off;
    if (n > max)
        n = max;
    memcpy(buf, out->p + st->out_off, n);
    st->out_off += n;
    return (ssize_t)n;
}

/* libmicrohttpd is done with the response: normally after [DONE], or because the client vanished
 * (a write failed) or the server stopped; in the latter cases the engine is told to stop. */
static void http_stream_free(void *cls)
{
    http_stream *st = cls;
    for (int k = 0; k < st->n; k++) {
        if (!st->ended)
            coord_request_cancel(st->fmt[k].req);
        coord_request_unref(&st->fmt[k].req);
        openai_stream_free(&st->fmt[k]);
    }
    atomic_fetch_sub(&st->srv->active, 1);
    free(st);
}

/* ==== routes ================================================================================== */

/* Blocks until the request ends (or, with want_text, produces its first text). false: the client
 * went away or the server is stopping, and the request was cancelled. */
static bool http_await(http_server *srv, coord_request *req, int fd, bool want_text)
{
    size_t off = 0;
    for (;;) {
        coord_request_state st = coord_request_wait(req, &off, HTTP_TICK_MS, NULL, NULL);
        if (st != COORD_REQ_RUNNING || (want_text && off > 0))
            return true;
        if (atomic_load(&srv->stopping) || http_peer_gone(fd) || coord_request_cancelled(req)) {
            coord_request_cancel(req);
            return false;
        }
    }
}

/* POST /v1/completions and /v1/chat/completions. */
static enum MHD_Result http_generate(http_server *srv, struct MHD_Connection *conn,
                                     http_exchange *ex)
{
    bool chat = ex->route == ROUTE_CHAT;
    openai_err e = {0};
    coord_request *req = openai_parse_request(&srv->lim, chat, ex->body.p, ex->body.len, &e);
    if (!req)
        return http_send_error(srv, conn, ex->route, e.status, e.message, e.param, e.code);
    coord_params *p = coord_request_params(req);
    uint64_t serial = atomic_fetch_add(&srv->next_id, 1);
    snprintf(p->id, sizeof p->id, "%s-%012llx%08llx", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)(srv->id_salt & 0xffffffffffffull), (unsigned long long)serial);
    time_t created = time(NULL);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;
    atomic_fetch_add(&srv->active, 1);

    enum MHD_Result ok;
    coord_outcome o = {0};
    int n = p->n_choices > 1 ? p->n_choices : 1;
    coord_request *reqs[OPENAI_MAX_CHOICES] = {req};
    bool submitted = srv->engine.submit(srv->engine.ctx, req) == 0;
    bool waited = submitted && http_await(srv, req, fd, p->stream || n > 1);
    /* n > 1: the other choices once the first has its first text — its prompt's K/V rows are
     * committed by then, and each other choice starts from them instead of computing them again */
    bool refused = false;
    for (int k = 1; k < n && waited && !refused; k++) {
        coord_request_outcome(req, &o);
        if (o.state == COORD_REQ_FAILED)
            break;
        reqs[k] = coord_request_clone(req, k);
        refused = !reqs[k] || srv->engine.submit(srv->engine.ctx, reqs[k]);
        if (refused)
            coord_request_unref(&reqs[k]);
    }
    if (refused) { /* all or nothing: the choices already running are called off */
        for (int k = 0; k < n && reqs[k]; k++)
            coord_request_cancel(reqs[k]);
        submitted = false;
    }
    for (int k = 1; k < n && waited && reqs[k] && !p->stream; k++)
        waited = http_await(srv, reqs[k], fd, false);
    coord_request_outcome(req, &o);
    for (int k = 1; k < n && o.state != COORD_REQ_FAILED && reqs[k] && !p->stream; k++)
        coord_request_outcome(reqs[k], &o);
    if (!submitted || (waited && o.state == COORD_REQ_FAILED)) {
        /* refused, or failed before a byte was sent: a plain error answer */
        bool failed = o.state == COORD_REQ_FAILED;
        int status;
        cJSON *js = openai_engine_error_json(
            chat, failed ? o.http_status : 503,
            failed ? o.message : "the engine did not accept the request", &status);
        ok = http_send_json(srv, conn, ex->route, status, js, NULL);
    } else if (!waited) {
        http_count(srv, ex->route, HTTP_CLIENT_GONE);
        ok = MHD_NO;
    } else if (!p->stream) {
        cJSON *js = n > 1 ? openai_result_json_n(&srv->lim, reqs, n, created)
                          : openai_result_json(&srv->lim, req, created);
        ok = http_send_json(srv, conn, ex->route, 200, js, NULL);
    } else {
        http_stream *st = calloc(1, sizeof *st);
        struct MHD_Response *r = NULL;
        if (st) {
            *st = (http_stream){.srv = srv, .fd = fd, .last_emit = http_now(), .n = n};
            for (int k = 0; k < n; k++)
                st->fmt[k] = (openai_stream){.lim = &srv->lim,
                                             .req = reqs[k],
                                             .chat = chat,
                                             .index = k,
                                             .more_follow = k + 1 < n,
                                             .usage_chunk = p->stream_usage,
                                             .created = created};
            if (p->echo && p->prompt && *p->prompt) /* echo: the prompt is the first event */
                openai_stream_event(&st->fmt[0],
                                    openai_chunk_json(&st->fmt[0], p->prompt, NULL, NULL));
            r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, HTTP_STREAM_BLOCK,
                                                  http_stream_read, st, http_stream_free);
            if (!r) {
                for (int k = 0; k < n; k++)
                    openai_stream_free(&st->fmt[k]);
                free(st);
            } else {
                for (int k = 0; k < n; k++) /* the stream owns the references and the count */
                    reqs[k] = NULL;
                req = NULL;
            }
        }
        if (!r) {
            for (int k = 0; k < n && reqs[k]; k++)
                coord_request_cancel(reqs[k]);
            ok = MHD_NO;
        } else {
            MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
            MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
            MHD_add_response_header(r, "X-Accel-Buffering", "no");
            ok = MHD_queue_response(conn, MHD_HTTP_OK, r);
            MHD_destroy_response(r);
            ex->streaming = true; /* counted when it ends: 200, or 499 if the client left */
        }
    }
    for (int k = 1; k < n; k++) {
        if (reqs[k] && !waited)
            coord_request_cancel(reqs[k]);
        coord_request_unref(&reqs[k]);
    }
    if (req) {
        atomic_fetch_sub(&srv->active, 1);
        coord_request_unref(&req);
    }
    return ok;
}

static cJSON *http_model_json(const http_server *srv)
{
    cJSON *m = cJSON_CreateObject();
    openai_json_add_text(m, "id", srv->model_name, strlen(srv->model_name));
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)srv->started);
    cJSON_AddStringToObject(m, "owned_by", "orochi");
    return m;
}

/* GET /v1/models and /v1/models/NAME. */
static enum MHD_Result http_models(http_server *srv, struct MHD_Connection *conn, const char *url)
{
    if (!strncmp(url, "/v1/models/", 11)) {
        if (strcmp(url + 11, srv->model_name)) {
            char msg[320];
            snprintf(msg, sizeof msg,
                     "the model '%.200s' does not exist; this server serves '%.64s'", url + 11,
                     srv->model_name);
            return http_send_error(srv, conn, ROUTE_MODELS, 404, msg, "model", "model_not_found");
        }
        return http_send_json(srv, conn, ROUTE_MODELS, 200, http_model_json(srv), NULL);
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), http_model_json(srv));
    return http_send_json(srv, conn, ROUTE_MODELS, 200, root, NULL);
}

static enum MHD_Result http_health(http_server *srv, struct MHD_Connection *conn)
{
    char msg[256] = "";
    int healthy = srv->engine.health ? srv->engine.health(srv->engine.ctx, msg, sizeof msg) : 1;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", healthy ? "ok" : "unavailable");
    if (!healthy) {
        msg[sizeof msg - 1] = 0;
        openai_json_add_text(root, "message", msg[0] ? msg : "the engine is not ready",
                           strlen(msg[0] ? msg : "the engine is not ready"));
    }
    return http_send_json(srv, conn, ROUTE_HEALTH, healthy ? 200 : 503, root, NULL);
}

/* GET /metrics: the engine's exposition followed by the HTTP counters. A request is counted when
 * its answer is queued, so this answer is not in its own numbers. */
static enum MHD_Result http_metrics(http_server *srv, struct MHD_Connection *conn)
{
    strbuf b = {0};
    char *engine_text = srv->engine.metrics ? srv->engine.metrics(srv->engine.ctx) : NULL;
    if (engine_text) {
        size_t n = strlen(engine_text);
        strbuf_add(&b, engine_text, n);
        if (n && engine_text[n - 1] != '\n')
            strbuf_add(&b, "\n", 1);
        free(engine_text);
    }
    strbuf_printf(&b,
                    "# HELP orochi_http_requests_total HTTP requests answered, by route and status "
                    "code (499: the client left before the answer was complete).\n"
                    "# TYPE orochi_http_requests_total counter\n");
    pthread_mutex_lock(&srv->mu);
    for (int i = 0; i < srv->n_counters; i++)
        strbuf_printf(&b, "orochi_http_requests_total{route=\"%s\",code=\"%d\"} %llu\n",
                        HTTP_ROUTE_LABEL[srv->counters[i].route], srv->counters[i].code,
                        (unsigned long long)srv->counters[i].count);
    pthread_mutex_unlock(&srv->mu);
    strbuf_printf(&b,
                    "# HELP orochi_http_active_requests Generation requests being answered now.\n"
                    "# TYPE orochi_http_active_requests gauge\n"
                    "orochi_http_active_requests %d\n"
                    "# HELP orochi_http_open_connections HTTP connections open now.\n"
                    "# TYPE orochi_http_open_connections gauge\n"
                    "orochi_http_open_connections %d\n"
                    "# HELP orochi_http_connection_limit The HTTP connection budget.\n"
                    "# TYPE orochi_http_connection_limit gauge\n"
                    "orochi_http_connection_limit %u\n",
                    atomic_load(&srv->active), atomic_load(&srv->open), srv->max_conn);
    pthread_mutex_lock(&srv->mu);
    uint64_t evicted = srv->evicted;
    pthread_mutex_unlock(&srv->mu);
    strbuf_printf(&b,
                    "# HELP orochi_http_connections_evicted_total Connections closed while waiting "
                    "for a request header, to keep room in the budget.\n"
                    "# TYPE orochi_http_connections_evicted_total counter\n"
                    "orochi_http_connections_evicted_total %llu\n",
                    (unsigned long long)evicted);
    if (b.oom) {
        strbuf_free(&b);
        return MHD_NO;
    }
    return http_send(srv, conn, ROUTE_METRICS, 200, "text/plain; version=0.0.4; charset=utf-8", b.p,
                     b.len, NULL);
}

/* GET /: the page, a chat and a dashboard (docs/page.md). It holds no data of its own, so it is
 * served without the API key (a browser cannot send one when it opens a URL); the page asks for
 * the key and sends it with its own requests. Its policy lets it reach this server and nothing
 * else. */
static enum MHD_Result http_page(http_server *srv, struct MHD_Connection *conn)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        http_page_html_len, (void *)http_page_html, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; "
                            "style-src 'unsafe-inline'; connect-src 'self'; img-src data:; "
                            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    enum MHD_Result ok = MHD_queue_response(conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    http_count(srv, ROUTE_PAGE, 200);
    return ok;
}

/* GET /status: the engine's JSON picture of the group (docs/http-api.md, "Status"). */
static enum MHD_Result http_status(http_server *srv, struct MHD_Connection *conn)
{
    char *text = srv->engine.status ? srv->engine.status(srv->engine.ctx) : NULL;
    if (!text)
        return http_send_error(srv, conn, ROUTE_STATUS, 503, "the engine reports no status yet",
                               NULL, NULL);
    size_t n = strlen(text);
    char *body = realloc(text, n + 2); /* a newline ends it, as every JSON answer */
    if (!body) {
        free(text);
        return MHD_NO;
    }
    body[n] = '\n';
    body[n + 1] = 0;
    return http_send(srv, conn, ROUTE_STATUS, 200, "application/json", body, n + 1, NULL);
}

static bool http_authorized(const http_server *srv, struct MHD_Connection *conn)
{
    if (!srv->api_key)
        return true;
    const char *h =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h)
        return false;
    while (*h == ' ' || *h == '\t')
        h++;
    if (strncasecmp(h, "Bearer ", 7))
        return false;
    h += 7;
    while (*h == ' ' || *h == '\t')
        h++;
    size_t n = strlen(h);
    while (n && (h[n - 1] == ' ' || h[n - 1] == '\t'))
        n--;
    return http_equal_ct(h, n, srv->api_key, strlen(srv->api_key));
}

static enum MHD_Result http_dispatch(http_server *srv, struct MHD_Connection *conn,
                                     http_exchange *ex, const char *url, const char *method)
{
    int route = ex->route;
    if (route != ROUTE_HEALTH && route != ROUTE_PAGE && !http_authorized(srv, conn))
        return http_send_error(srv, conn, route, 401,
                               "missing or invalid API key; send 'Authorization: Bearer KEY'", NULL,
                               NULL);
    bool get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
    bool post = !strcmp(method, MHD_HTTP_METHOD_POST);
    switch (route) {
    case ROUTE_COMPLETIONS:
    case ROUTE_CHAT:
        if (!post)
            return http_send_405(srv, conn, route, method, url, "POST");
        /* a generation may outlast the idle timeout: none until it is answered (the body is in,
         * so a slow client cannot use this to hold the thread; http_on_completed restores it) */
        MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
        return http_generate(srv, conn, ex);
    case ROUTE_MODELS:
        return get ? http_models(srv, conn, url)
                   : http_send_405(srv, conn, route, method, url, "GET, HEAD");
    case ROUTE_HEALTH:
        return get ? http_health(srv, conn)
                   : http_send_405(srv, conn, route, method, url, "GET, HEAD");
    case ROUTE_METRICS:
        return get ? http_metrics(srv, conn)
                   : http_send_405(srv, conn, route, method, url, "GET, HEAD");
    case ROUTE_PAGE:
        return get ? http_page(srv, conn)
                   : http_send_405(srv, conn, route, method, url, "GET, HEAD");
    case ROUTE_STATUS:
        return get ? http_status(srv, conn)
                   : http_send_405(srv, conn, route, method, url, "GET, HEAD");
    default: {
        char msg[320];
        snprintf(msg, sizeof msg,
                 "no route for %.16s %.200s (see /v1/completions, "
                 "/v1/chat/completions, /v1/models, /health, /metrics, /status, /)",
                 method, url);
        return http_send_error(srv, conn, route, 404, msg, NULL, NULL);
    }
    }
}

/* ==== libmicrohttpd callbacks ================================================================= */

/* The waiting list: connections without a request header, oldest first. Caller holds srv->mu. */
static void http_wait_unlink(http_server *srv, http_conn *c)
{
    if (!c->waiting)
        return;
    *(c->prev ? &c->prev->next : &srv->wait_head) = c->next;
    *(c->next ? &c->next->prev : &srv->wait_tail) = c->prev;
    c->prev = c->next = NULL;
    c->waiting = false;
}

static void http_wait_append(http_server *srv, http_conn *c)
{
    http_wait_unlink(srv, c);
    c->prev = srv->wait_tail;
    *(srv->wait_tail ? &srv->wait_tail->next : &srv->wait_head) = c;
    srv->wait_tail = c;
    c->waiting = true;
}

/* Moves the connection into or out of the waiting list (it waits for a request header, or has
 * sent one). */
static void http_conn_waiting(http_server *srv, struct MHD_Connection *conn, bool waiting)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    http_conn *c = ci ? ci->socket_context : NULL;
    if (!c)
        return;
    pthread_mutex_lock(&srv->mu);
    if (waiting)
        http_wait_append(srv, c);
    else
        http_wait_unlink(srv, c);
    pthread_mutex_unlock(&srv->mu);
}

static enum MHD_Result http_on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                       const char *method, const char *version,
                                       const char *upload_data, size_t *upload_data_size,
                                       void **con_cls)
{
    http_server *srv = cls;
    http_exchange *ex = *con_cls;
    (void)version;
    if (!ex) {
        /* headers only: set up, and refuse an announced oversized body before it is sent */
        if (!(ex = calloc(1, sizeof *ex)))
            return MHD_NO;
        *con_cls = ex;
        ex->route = http_route_of(url);
        /* the header is complete: no longer evictable, and from here on the (longer) idle
         * timeout applies */
        http_conn_waiting(srv, conn, false);
        if (srv->idle_timeout_s != srv->header_timeout_s)
            MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT,
                                      (unsigned)srv->idle_timeout_s);
        const char *cl =
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            errno = 0;
            char *end;
            unsigned long long n = strtoull(cl, &end, 10);
            if (errno == ERANGE || n > srv->max_body) {
                ex->too_large = true;
                const char *expect =
                    MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
                if ((expect && !strcasecmp(expect, "100-continue")) || errno == ERANGE ||
                    n / HTTP_DRAIN_FACTOR > srv->max_body)
                    return http_send_too_large(srv, conn, ex);
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        /* keep up to the limit; read and drop the rest so the 413 reaches the client */
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (!ex->too_large && ex->body.len + n > srv->max_body) {
            ex->too_large = true;
            strbuf_free(&ex->body);
        }
        if (!ex->too_large) {
            strbuf_add(&ex->body, upload_data, n);
            if (ex->body.oom)
                return MHD_NO;
        }
        return MHD_YES;
    }
    if (ex->too_large)
        return http_send_too_large(srv, conn, ex);
    return http_dispatch(srv, conn, ex, url, method);
}

static void http_on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                              enum MHD_RequestTerminationCode toe)
{
    http_server *srv = cls;
    http_exchange *ex = *con_cls;
    if (!ex)
        return;
    /* a stream is counted when it ends: whole, or cut short because the client left (or the
     * server stopped) */
    if (ex->streaming)
        http_count(srv, ex->route,
                   toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? 200 : HTTP_CLIENT_GONE);
    /* the connection may live on (keep-alive): it waits for a request header again, under the
     * header timeout counted from now, and may be evicted */
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT,
                                  (unsigned)srv->header_timeout_s);
        http_conn_waiting(srv, conn, true);
    }
    strbuf_free(&ex->body);
    free(ex);
    *con_cls = NULL;
}

/* Connections opening and closing; both run on the listening thread (a new connection's own
 * thread does not exist yet). A new connection joins the waiting list. Room for real requests:
 * libmicrohttpd resets connections beyond the budget, so once all but 1/8 of the budget is open,
 * each new connection evicts the one that has waited longest for a request header (shutting its
 * socket down; its thread then sees the end of the stream and closes it). An idle flood therefore
 * cannot fill the budget, and a client that sends its request keeps its connection. The victim's
 * descriptor is still open: libmicrohttpd closes a socket only after the closed notice, which
 * takes it off the list under the same lock. */
static void http_on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                               enum MHD_ConnectionNotificationCode code)
{
    http_server *srv = cls;
    http_conn *c = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        unsigned open = (unsigned)atomic_fetch_add(&srv->open, 1) + 1;
        unsigned room = srv->max_conn / HTTP_ROOM_SHARE ? srv->max_conn / HTTP_ROOM_SHARE : 1;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!(c = calloc(1, sizeof *c)))
            return; /* untracked: never evicted */
        c->fd = ci ? ci->connect_fd : -1;
        *socket_context = c;
        pthread_mutex_lock(&srv->mu);
        http_conn *victim = open + room > srv->max_conn ? srv->wait_head : NULL;
        if (victim) {
            http_wait_unlink(srv, victim);
            if (victim->fd >= 0)
                shutdown(victim->fd, SHUT_RDWR);
            srv->evicted++;
        }
        http_wait_append(srv, c);
        pthread_mutex_unlock(&srv->mu);
    } else {
        atomic_fetch_sub(&srv->open, 1);
        if (c) {
            pthread_mutex_lock(&srv->mu);
            http_wait_unlink(srv, c);
            pthread_mutex_unlock(&srv->mu);
            free(c);
            *socket_context = NULL;
        }
    }
}
