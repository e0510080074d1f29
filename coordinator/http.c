/*
 * coordinator/http.c — the OpenAI-compatible HTTP API of the coordinator (see http.h and
 * docs/http-api.md).
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
    ROUTE_OTHER,
    ROUTE_COUNT
};
static const char *const HTTP_ROUTE_LABEL[ROUTE_COUNT] = {
    "/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "other"};

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

/* A growable byte buffer; `oom` sticks once an allocation failed. */
typedef struct {
    char *p;
    size_t len, cap;
    bool oom;
} http_buf;

/* Per-request state of one connection (libmicrohttpd's *con_cls). */
typedef struct {
    int route;
    bool too_large;
    bool streaming; /* an event stream was queued: counted when it ends (http_on_completed) */
    http_buf body;
} http_exchange;

/* A validation error, answered as an OpenAI-style error object. */
typedef struct {
    int status;
    char param[128]; /* "" -> null */
    char code[32];   /* "" -> null; e.g. "model_not_found" */
    char message[320];
} http_err;

/* A walk through generated text turning byte offsets into character offsets (text_offset). */
typedef struct {
    size_t byte, chars; /* text byte reached, characters before it */
} http_chars;

/* One streaming response (the content-reader callback's closure). */
typedef struct {
    http_server *srv;
    coord_request *req;
    int fd;
    bool chat, role_sent, ended;
    bool usage_chunk; /* stream_options.include_usage: usage in a chunk of its own at the end */
    time_t created;
    size_t text_off;
    http_buf out; /* SSE bytes not yet handed to libmicrohttpd */
    size_t out_off;
    http_buf hold; /* text whose last UTF-8 character is incomplete */
    double last_emit;
    /* logprobs (when the request asks): the next record to send, the generated text's bytes sent
     * in chunks so far, and where text_offset's character count stands */
    int lp_next;
    size_t raw_sent;
    http_chars chars;
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
static void http_buf_add(http_buf *b, const char *s, size_t n);
static void http_buf_printf(http_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int http_fail(http_err *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

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

static void http_buf_add(http_buf *b, const char *s, size_t n)
{
    if (!b->oom && buf_append(&b->p, &b->len, &b->cap, s, n, 256))
        b->oom = true;
}

static void http_buf_printf(http_buf *b, const char *fmt, ...)
{
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        http_buf_add(b, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    http_buf_add(b, big, (size_t)n);
    free(big);
}

static void http_buf_free(http_buf *b)
{
    free(b->p);
    *b = (http_buf){0};
}

static void http_json_add_text(cJSON *obj, const char *key, const char *s, size_t n)
{
    char *clean = utf8_clean(s ? s : "", s ? n : 0);
    cJSON_AddStringToObject(obj, key, clean ? clean : "");
    free(clean);
}

/* One level of a JSON text being walked by http_json_bad_string: an array and the index of its
 * current element, or an object and the raw text of its current member's key. */
typedef struct {
    bool array;
    int index;
    size_t key, key_len; /* offset and length in the body */
} http_jlevel;

/* Appends the path of the current position, e.g. "messages[1].content", to path. */
static void http_jpath(const char *body, const http_jlevel *lv, int depth, char *path, size_t cap)
{
    size_t n = 0;
    path[0] = 0;
    for (int d = 0; d < depth && n + 1 < cap; d++) {
        int w = lv[d].array
                    ? snprintf(path + n, cap - n, "[%d]", lv[d].index)
                    : snprintf(path + n, cap - n, "%s%.*s", d ? "." : "",
                               (int)(lv[d].key_len > 64 ? 64 : lv[d].key_len), body + lv[d].key);
        n += w > 0 ? (size_t)w : 0;
    }
}

/* Strings must arrive whole. cJSON decodes "\u0000" into a NUL byte that would end the C string
 * (everything after it lost without a word) and copies bytes that are not UTF-8 as they are, which
 * the tokenizer would then mangle. So before the fields are read, the body's text (already parsed
 * by cJSON, hence well formed) is walked once: the first string holding a NUL (escaped or raw) or
 * invalid UTF-8 is reported with its path. Returns 0 when every string is clean, 1 with *e filled
 * (400, the path as param), -1 when out of memory. */
static int http_json_bad_string(const char *body, size_t len, http_err *e)
{
    int depth = 0, cap = 0;
    http_jlevel *lv = NULL;
    bool want_key = false;
    int rc = 0;
    for (size_t i = 0; i < len && !rc;) {
        char c = body[i];
        if (c == '{' || c == '[') {
            if (depth == cap) {
                int ncap = cap ? cap * 2 : 16;
                http_jlevel *grown = realloc(lv, (size_t)ncap * sizeof *grown);
                if (!grown) {
                    rc = -1;
                    break;
                }
                lv = grown;
                cap = ncap;
            }
            lv[depth++] = (http_jlevel){.array = c == '['};
            want_key = c == '{';
            i++;
        } else if (c == '}' || c == ']') {
            depth -= depth > 0;
            want_key = false;
            i++;
        } else if (c == ',') {
            if (depth && lv[depth - 1].array)
                lv[depth - 1].index++;
            want_key = depth && !lv[depth - 1].array;
            i++;
        } else if (c == '"') {
            size_t start = ++i;
            const char *bad = NULL;
            while (i < len && body[i] != '"') {
                const unsigned char *u = (const unsigned char *)body + i;
                if (*u == '\\') {
                    if (i + 5 < len && u[1] == 'u' && !memcmp(u + 2, "0000", 4))
                        bad = bad ? bad : "a NUL character (\\u0000)";
                    i += i + 1 < len ? 2 : 1;
                } else if (*u == 0) {
                    bad = bad ? bad : "a NUL character";
                    i++;
                } else {
                    size_t n = utf8_char(u, len - i);
                    if (!n)
                        bad = bad ? bad : "bytes that are not valid UTF-8";
                    i += n ? n : 1;
                }
            }
            if (want_key && depth) {
                lv[depth - 1].key = start;
                lv[depth - 1].key_len = i - start;
                want_key = false;
            }
            i++; /* the closing quote */
            if (bad) {
                char path[sizeof e->param];
                http_jpath(body, lv, depth, path, sizeof path);
                http_fail(e, 400, path,
                          "%s contains %s; send text as valid UTF-8 without NUL characters",
                          path[0] ? path : "the request body", bad);
                rc = 1;
            }
        } else {
            i++; /* whitespace, ':', numbers, true, false, null */
        }
    }
    free(lv);
    return rc;
}

/* The object member `name`, treating JSON null like an absent member. */
static const cJSON *http_field(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A JSON number with an integral value; huge magnitudes are clamped so range checks still read
 * naturally ("at most 4096, got 1e300" is reported as the clamp). */
static bool http_json_integer(const cJSON *v, long long *out)
{
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || floor(v->valuedouble) != v->valuedouble)
        return false;
    double d = v->valuedouble;
    *out = d > 4e18 ? (long long)4e18 : d < -4e18 ? (long long)-4e18 : (long long)d;
    return true;
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

static const char *http_error_type(int status)
{
    if (status == 401)
        return "authentication_error";
    if (status == 429)
        return "rate_limit_error";
    if (status >= 500)
        return "server_error";
    return "invalid_request_error";
}

/* {"error":{message, type, param, code}}; param and code NULL or "" are null. */
static cJSON *http_error_json(int status, const char *message, const char *param, const char *code)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(root, "error");
    http_json_add_text(e, "message", message, strlen(message));
    cJSON_AddStringToObject(e, "type", http_error_type(status));
    if (param && *param)
        http_json_add_text(e, "param", param, strlen(param));
    else
        cJSON_AddNullToObject(e, "param");
    if (code && *code)
        cJSON_AddStringToObject(e, "code", code);
    else
        cJSON_AddNullToObject(e, "code");
    return root;
}

static enum MHD_Result http_send_error(http_server *srv, struct MHD_Connection *conn, int route,
                                       int status, const char *message, const char *param,
                                       const char *code)
{
    return http_send_json(srv, conn, route, status, http_error_json(status, message, param, code),
                          NULL);
}

/* An engine failure as the client sees it. The engine's 413 (the prompt does not fit the
 * context, see request.h) is answered the way OpenAI answers it: 400, code
 * context_length_exceeded, param naming the prompt or the messages. */
static cJSON *http_engine_error_json(bool chat, int status, const char *message, int *out_status)
{
    if (status == COORD_STATUS_CONTEXT) {
        *out_status = 400;
        return http_error_json(400, message, chat ? "messages" : "prompt",
                               "context_length_exceeded");
    }
    *out_status = status;
    return http_error_json(status, message, NULL, NULL);
}

static enum MHD_Result http_send_405(http_server *srv, struct MHD_Connection *conn, int route,
                                     const char *method, const char *url, const char *allow)
{
    char msg[320];
    snprintf(msg, sizeof msg, "method %.16s is not allowed on %.200s; use %s", method, url, allow);
    return http_send_json(srv, conn, route, 405, http_error_json(405, msg, NULL, NULL), allow);
}

static enum MHD_Result http_send_too_large(http_server *srv, struct MHD_Connection *conn,
                                           http_exchange *ex)
{
    char msg[160];
    snprintf(msg, sizeof msg, "the request body exceeds the limit of %zu bytes", srv->max_body);
    return http_send_error(srv, conn, ex->route, 413, msg, NULL, NULL);
}

/* ==== parsing a generation request ============================================================ */

static int http_fail(http_err *e, int status, const char *param, const char *fmt, ...)
{
    e->status = status;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

static int http_parse_prompt(const cJSON *root, coord_request *req, http_err *e)
{
    const cJSON *v = http_field(root, "prompt");
    if (!v)
        return http_fail(e, 400, "prompt", "missing required field 'prompt' (a string)");
    if (cJSON_IsArray(v)) {
        /* a one-element list is what many clients send for a single prompt */
        const cJSON *first = cJSON_GetArrayItem(v, 0);
        if (cJSON_GetArraySize(v) == 1 && cJSON_IsString(first))
            v = first;
        else if (first && cJSON_IsNumber(first))
            return http_fail(e, 400, "prompt",
                             "prompt as token ids is not supported; send the prompt as a string");
        else
            return http_fail(
                e, 400, "prompt",
                "prompt must be a string (lists of several prompts are not supported)");
    }
    if (!cJSON_IsString(v))
        return http_fail(e, 400, "prompt", "prompt must be a string");
    if (coord_request_set_prompt(req, v->valuestring))
        return http_fail(e, 503, NULL, "out of memory");
    return 0;
}

/* Message content: a string, or an array of {"type":"text","text":...} parts joined together. */
static int http_message_content(const cJSON *c, http_buf *out)
{
    if (cJSON_IsString(c)) {
        http_buf_add(out, c->valuestring, strlen(c->valuestring));
        return 0;
    }
    if (!cJSON_IsArray(c))
        return -1;
    const cJSON *part;
    cJSON_ArrayForEach(part, c)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return -1;
        http_buf_add(out, text->valuestring, strlen(text->valuestring));
    }
    http_buf_add(out, "", 0);
    return 0;
}

static int http_parse_messages(const cJSON *root, coord_request *req, http_err *e)
{
    const cJSON *msgs = http_field(root, "messages");
    if (!msgs)
        return http_fail(e, 400, "messages", "missing required field 'messages' (an array)");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return http_fail(e, 400, "messages",
                         "messages must be a non-empty array of {role, content}");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        char param[48];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m))
            return http_fail(e, 400, param, "messages[%d] must be an object with role and content",
                             i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!cJSON_IsString(role))
            return http_fail(e, 400, param, "messages[%d].role must be a string", i);
        /* "developer" is OpenAI's newer name for the system role */
        const char *as = role->valuestring;
        if (!strcmp(as, "developer"))
            as = "system";
        if (strcmp(as, "system") && strcmp(as, "user") && strcmp(as, "assistant"))
            return http_fail(e, 400, param,
                             "messages[%d].role must be \"system\", \"developer\", \"user\" or "
                             "\"assistant\"",
                             i);
        http_buf text = {0};
        snprintf(param, sizeof param, "messages[%d].content", i);
        if (!content || http_message_content(content, &text)) {
            http_buf_free(&text);
            return http_fail(e, 400, param,
                             "messages[%d].content must be a string (or an array of text parts)",
                             i);
        }
        int rc = text.oom ? -1 : coord_request_add_message(req, as, text.p ? text.p : "");
        http_buf_free(&text);
        if (rc)
            return http_fail(e, 503, NULL, "out of memory");
        i++;
    }
    return 0;
}

static int http_parse_stop(const cJSON *v, coord_request *req, http_err *e)
{
    if (cJSON_IsString(v)) {
        if (!*v->valuestring)
            return http_fail(e, 400, "stop", "stop must not be an empty string");
        return coord_request_add_stop(req, v->valuestring)
                   ? http_fail(e, 503, NULL, "out of memory")
                   : 0;
    }
    if (!cJSON_IsArray(v))
        return http_fail(e, 400, "stop", "stop must be a string or an array of strings");
    if (cJSON_GetArraySize(v) > COORD_MAX_STOP)
        return http_fail(e, 400, "stop", "stop takes at most %d sequences", COORD_MAX_STOP);
    const cJSON *s;
    cJSON_ArrayForEach(s, v)
    {
        if (!cJSON_IsString(s) || !*s->valuestring)
            return http_fail(e, 400, "stop",
                             "stop must be a string or an array of non-empty strings");
        if (coord_request_add_stop(req, s->valuestring))
            return http_fail(e, 503, NULL, "out of memory");
    }
    return 0;
}

/* logprobs, OpenAI's way for each route. Completions: "logprobs" is a count 0..5 (the chosen
 * token's logprob and that many alternatives; false counts as absent), "top_logprobs" is not a
 * completions field (0 is let through as meaning nothing). Chat: "logprobs" is a boolean,
 * "top_logprobs" a count 0..20 that needs "logprobs": true. Echo would need the prompt's logprobs,
 * which the engine does not compute. */
static int http_parse_logprobs(const cJSON *root, coord_params *p, http_err *e)
{
    const cJSON *lp = http_field(root, "logprobs"), *top = http_field(root, "top_logprobs");
    long long i;
    if (p->kind == COORD_REQ_COMPLETION) {
        if (top && !(http_json_integer(top, &i) && i == 0))
            return http_fail(e, 400, "top_logprobs",
                             "top_logprobs is a chat completions field; on /v1/completions send "
                             "logprobs as the number of alternatives (0 to 5)");
        if (!lp || cJSON_IsFalse(lp))
            return 0;
        if (!http_json_integer(lp, &i) || i < 0 || i > 5)
            return http_fail(
                e, 400, "logprobs",
                "logprobs must be an integer from 0 to 5 on /v1/completions (the "
                "number of alternatives per token; 0: the chosen token's logprob only)");
        if (p->echo)
            return http_fail(e, 400, "logprobs",
                             "logprobs cannot be combined with echo: the prompt's logprobs are not "
                             "computed (send echo false, or no logprobs)");
        p->logprobs = true;
        p->top_logprobs = (int)i;
        return 0;
    }
    if (lp && !cJSON_IsBool(lp))
        return http_fail(e, 400, "logprobs", "logprobs must be true or false");
    p->logprobs = lp && cJSON_IsTrue(lp);
    if (top) {
        if (!http_json_integer(top, &i) || i < 0 || i > COORD_MAX_TOP_LOGPROBS)
            return http_fail(e, 400, "top_logprobs", "top_logprobs must be an integer from 0 to %d",
                             COORD_MAX_TOP_LOGPROBS);
        if (!p->logprobs)
            return http_fail(e, 400, "top_logprobs", "top_logprobs requires logprobs to be true");
        p->top_logprobs = (int)i;
    }
    return 0;
}

/* The sampling and control fields both routes share. */
static int http_parse_common(const http_server *srv, const cJSON *root, coord_request *req,
                             http_err *e)
{
    coord_params *p = coord_request_params(req);
    const cJSON *v;
    long long i;
    if ((v = http_field(root, "max_tokens")) || (v = http_field(root, "max_completion_tokens"))) {
        const char *name = v->string;
        if (!http_json_integer(v, &i))
            return http_fail(e, 400, name, "%s must be an integer", name);
        if (i < 1)
            return http_fail(e, 400, name, "%s must be at least 1, got %lld", name, i);
        if (i > srv->max_tokens_cap)
            return http_fail(e, 400, name, "%s must be at most %d, got %lld", name,
                             srv->max_tokens_cap, i);
        p->max_tokens = (int)i;
    } else if (p->max_tokens > srv->max_tokens_cap) {
        p->max_tokens = srv->max_tokens_cap; /* the default never asks for more than the cap */
    }
    if ((v = http_field(root, "temperature"))) {
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
            return http_fail(e, 400, "temperature", "temperature must be a number");
        if (v->valuedouble < 0 || v->valuedouble > 2)
            return http_fail(e, 400, "temperature",
                             "temperature must be between 0 and 2 (0 is greedy), got %g",
                             v->valuedouble);
        p->temperature = v->valuedouble;
    }
    if ((v = http_field(root, "top_p"))) {
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
            return http_fail(e, 400, "top_p", "top_p must be a number");
        if (!(v->valuedouble > 0 && v->valuedouble <= 1))
            return http_fail(e, 400, "top_p", "top_p must be in (0, 1], got %g", v->valuedouble);
        p->top_p = v->valuedouble;
    }
    if ((v = http_field(root, "top_k"))) {
        if (!http_json_integer(v, &i) || i < 0 || i > (1 << 24))
            return http_fail(e, 400, "top_k", "top_k must be an integer >= 0 (0 turns it off)");
        p->top_k = (int)i;
    }
    if ((v = http_field(root, "seed"))) {
        if (!http_json_integer(v, &i))
            return http_fail(e, 400, "seed", "seed must be an integer");
        p->has_seed = true;
        p->seed = i;
    }
    if ((v = http_field(root, "stream"))) {
        if (!cJSON_IsBool(v))
            return http_fail(e, 400, "stream", "stream must be true or false");
        p->stream = cJSON_IsTrue(v);
    }
    if ((v = http_field(root, "stream_options"))) {
        if (!cJSON_IsObject(v))
            return http_fail(e, 400, "stream_options", "stream_options must be an object");
        if (!p->stream)
            return http_fail(e, 400, "stream_options",
                             "stream_options is only allowed when stream is true");
        const cJSON *u = http_field(v, "include_usage");
        if (u && !cJSON_IsBool(u))
            return http_fail(e, 400, "stream_options.include_usage",
                             "stream_options.include_usage must be true or false");
        p->stream_usage = u && cJSON_IsTrue(u);
    }
    if ((v = http_field(root, "n"))) {
        if (!http_json_integer(v, &i) || i != 1)
            return http_fail(e, 400, "n", "n must be 1 (one choice per request)");
    }
    if (p->kind == COORD_REQ_COMPLETION) {
        if ((v = http_field(root, "echo"))) {
            if (!cJSON_IsBool(v))
                return http_fail(e, 400, "echo", "echo must be true or false");
            p->echo = cJSON_IsTrue(v);
        }
        if ((v = http_field(root, "best_of")) && !(http_json_integer(v, &i) && i == 1))
            return http_fail(e, 400, "best_of", "best_of must be 1 (one candidate per request)");
        if ((v = http_field(root, "suffix")) && !(cJSON_IsString(v) && !*v->valuestring))
            return http_fail(e, 400, "suffix", "suffix is not supported by this server");
    }
    if (http_parse_logprobs(root, p, e))
        return -1;
    if ((v = http_field(root, "stop")) && http_parse_stop(v, req, e))
        return -1;
    if ((v = http_field(root, "orochi"))) {
        if (!cJSON_IsObject(v))
            return http_fail(e, 400, "orochi", "orochi must be an object");
        char *raw = cJSON_PrintUnformatted(v);
        int rc = raw ? coord_request_set_options(req, raw) : -1;
        cJSON_free(raw);
        if (rc)
            return http_fail(e, 503, NULL, "out of memory");
    }
    return 0;
}

/* A new request from a JSON body, or NULL with *e filled. */
static coord_request *http_parse_request(const http_server *srv, bool chat, const char *body,
                                         size_t len, http_err *e)
{
    if (!len) {
        http_fail(e, 400, NULL, "the request body is empty; send a JSON object");
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        http_fail(e, 400, NULL, "the request body is not valid JSON (error at byte %zu)", at);
        return NULL;
    }
    while (end && end < body + len && strchr(" \t\r\n", *end) && *end)
        end++;
    if (end && end < body + len) {
        cJSON_Delete(root);
        http_fail(e, 400, NULL, "the request body is not valid JSON (unexpected data at byte %zu)",
                  (size_t)(end - body));
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        http_fail(e, 400, NULL, "the request body must be a JSON object");
        return NULL;
    }
    int bad = http_json_bad_string(body, len, e);
    if (bad) {
        cJSON_Delete(root);
        if (bad < 0)
            http_fail(e, 503, NULL, "out of memory");
        return NULL;
    }
    coord_request *req = coord_request_new(chat ? COORD_REQ_CHAT : COORD_REQ_COMPLETION);
    int rc = req ? 0 : http_fail(e, 503, NULL, "out of memory");
    /* the model first: a request for a model this server does not have is answered 404 whatever
     * else it says (OpenAI's model_not_found) */
    const cJSON *model = http_field(root, "model");
    if (!rc && model && !cJSON_IsString(model))
        rc = http_fail(e, 400, "model", "model must be a string");
    if (!rc && model && strcmp(model->valuestring, srv->model_name)) {
        rc = http_fail(e, 404, "model",
                       "the model '%.200s' does not exist; this server serves '%.64s'",
                       model->valuestring, srv->model_name);
        snprintf(e->code, sizeof e->code, "model_not_found");
    }
    if (!rc && model && coord_request_set_model(req, model->valuestring))
        rc = http_fail(e, 503, NULL, "out of memory");
    if (!rc)
        rc = chat ? http_parse_messages(root, req, e) : http_parse_prompt(root, req, e);
    if (!rc)
        rc = http_parse_common(srv, root, req, e);
    cJSON_Delete(root);
    if (rc)
        coord_request_unref(&req);
    return req;
}

/* ==== building responses ====================================================================== */

/* The "orochi" object: generated ids and the speculation statistics. */
static cJSON *http_orochi_json(coord_request *req, const coord_outcome *o)
{
    cJSON *obj = cJSON_CreateObject();
    cJSON *ids = cJSON_AddArrayToObject(obj, "token_ids");
    int n = 0;
    int32_t *v = coord_request_ids(req, &n);
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(v[i]));
    free(v);
    cJSON_AddNumberToObject(obj, "steps", o->stats.steps);
    cJSON_AddNumberToObject(obj, "mean_accepted", o->stats.mean_accepted);
    cJSON *kinds = cJSON_AddArrayToObject(obj, "draft_kinds");
    const char *s = o->stats.draft_kinds;
    while (*s) {
        size_t len = strcspn(s, ",");
        while (len && s[len - 1] == ' ')
            len--;
        if (len) {
            char *clean = utf8_clean(s, len);
            if (clean)
                cJSON_AddItemToArray(kinds, cJSON_CreateString(clean));
            free(clean);
        }
        s += strcspn(s, ",");
        while (*s == ',' || *s == ' ')
            s++;
    }
    cJSON *t = cJSON_AddObjectToObject(obj, "timings");
    cJSON_AddNumberToObject(t, "queued_ms", o->stats.queued_ms);
    cJSON_AddNumberToObject(t, "prompt_ms", o->stats.prompt_ms);
    cJSON_AddNumberToObject(t, "decode_ms", o->stats.decode_ms);
    int after_first = o->stats.completion_tokens - 1;
    cJSON_AddNumberToObject(t, "decode_tok_s",
                            after_first > 0 && o->stats.decode_ms > 0
                                ? after_first / (o->stats.decode_ms / 1e3)
                                : 0);
    return obj;
}

static void http_add_usage(cJSON *root, const coord_outcome *o)
{
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", o->stats.prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", o->stats.completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", o->stats.prompt_tokens + o->stats.completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", o->stats.cached_tokens);
}

static cJSON *http_envelope(const http_server *srv, coord_request *req, const char *object,
                            time_t created)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", coord_request_params(req)->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)created);
    http_json_add_text(root, "model", srv->model_name, strlen(srv->model_name));
    return root;
}

/* ---- logprobs ---- */

/* The `token` string of a piece: the piece itself when it is valid UTF-8 without NUL bytes, else
 * "bytes:" followed by \xhh for every byte (OpenAI's form for a token that holds part of a
 * character), so the JSON stays valid UTF-8 and no byte is lost or made up. malloc'd; NULL when
 * out of memory. */
static char *http_token_text(const char *piece, size_t len)
{
    bool plain = true;
    for (size_t i = 0; i < len && plain;) {
        size_t n = piece[i] ? utf8_char((const unsigned char *)piece + i, len - i) : 0;
        plain = n > 0;
        i += n;
    }
    char *out = malloc(plain ? len + 1 : 6 + 4 * len + 1);
    if (!out)
        return NULL;
    if (plain) {
        if (len)
            memcpy(out, piece, len);
        out[len] = 0;
        return out;
    }
    memcpy(out, "bytes:", 6);
    size_t o = 6;
    for (size_t i = 0; i < len; i++)
        o += (size_t)snprintf(out + o, 5, "\\x%02x", (unsigned char)piece[i]);
    return out;
}

/* A logprob as a JSON number with a float's 9 significant digits (not a double's 17). A probability
 * that underflowed to 0 (-inf, which JSON cannot write) is -9999, as OpenAI sends it. */
static cJSON *http_lp_number(float lp)
{
    if (!isfinite(lp))
        return cJSON_CreateNumber(-9999.0);
    char buf[32];
    snprintf(buf, sizeof buf, "%.9g", (double)lp);
    return cJSON_CreateNumber(strtod(buf, NULL));
}

/* The character offset of the character that holds text byte `pos`, as the answer's text shows
 * it (http_utf8_clean: a valid character counts one, an invalid byte one U+FFFD, a NUL byte none).
 * The walk *c moves forward only, over the raw text p[0..n) that begins at text byte `base`; a
 * position at or past the end gets every character of it. */
static size_t http_char_offset(http_chars *c, const char *p, size_t n, size_t base, size_t pos)
{
    if (c->byte < base)
        c->byte = base;
    while (c->byte < base + n && c->byte < pos) {
        size_t i = c->byte - base;
        size_t len = utf8_char((const unsigned char *)p + i, n - i);
        if (!len)
            len = 1;
        if (c->byte + len > pos)
            break; /* pos is inside this character */
        c->chars += p[i] != 0;
        c->byte += len;
    }
    return c->chars;
}

/* An empty logprobs object: completions {"tokens", "token_logprobs", "top_logprobs",
 * "text_offset"}, chat {"content": [], "refusal": null}. */
static cJSON *http_logprobs_new(bool chat)
{
    cJSON *o = cJSON_CreateObject();
    if (chat) {
        cJSON_AddArrayToObject(o, "content");
        cJSON_AddNullToObject(o, "refusal");
    } else {
        cJSON_AddArrayToObject(o, "tokens");
        cJSON_AddArrayToObject(o, "token_logprobs");
        cJSON_AddArrayToObject(o, "top_logprobs");
        cJSON_AddArrayToObject(o, "text_offset");
    }
    return o;
}

/* {"token", "logprob", "bytes"} of one chat token. */
static cJSON *http_chat_token(const coord_token_lp *t)
{
    cJSON *o = cJSON_CreateObject();
    char *text = http_token_text(t->piece, t->piece_len);
    cJSON_AddStringToObject(o, "token", text ? text : "");
    free(text);
    cJSON_AddItemToObject(o, "logprob", http_lp_number(t->logprob));
    cJSON *bytes = cJSON_AddArrayToObject(o, "bytes");
    for (size_t i = 0; i < t->piece_len; i++)
        cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)t->piece[i]));
    return o;
}

/* Adds one token to a logprobs object (http_logprobs_new). Completions: its text, logprob, the
 * alternatives as {text: logprob} (null when none were asked for; the chosen token is added when
 * it is not among them, as OpenAI does, and a text seen already keeps its first, likelier entry),
 * and text_offset, its character offset in the answer's text. Chat: a content entry with the
 * alternatives as a list, exactly top_n of them. */
static void http_logprobs_add(cJSON *obj, bool chat, int top_n, const coord_logprob *r,
                              size_t text_offset)
{
    if (chat) {
        cJSON *entry = http_chat_token(&r->token);
        cJSON *tops = cJSON_AddArrayToObject(entry, "top_logprobs");
        for (int j = 0; j < r->n_top && j < top_n; j++)
            cJSON_AddItemToArray(tops, http_chat_token(&r->top[j]));
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "content"), entry);
        return;
    }
    char *text = http_token_text(r->token.piece, r->token.piece_len);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "tokens"),
                         cJSON_CreateString(text ? text : ""));
    free(text);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "token_logprobs"),
                         http_lp_number(r->token.logprob));
    cJSON *tops = top_n > 0 ? cJSON_CreateObject() : cJSON_CreateNull();
    bool chosen_in = false;
    for (int j = 0; j <= r->n_top && j <= top_n && top_n > 0; j++) {
        /* the alternatives, then the chosen token when it was not one of them */
        bool extra = j == r->n_top || j == top_n;
        if (extra && chosen_in)
            break;
        const coord_token_lp *t = extra ? &r->token : &r->top[j];
        chosen_in |= t->id == r->token.id;
        char *key = http_token_text(t->piece, t->piece_len);
        if (key && !cJSON_GetObjectItemCaseSensitive(tops, key))
            cJSON_AddItemToObject(tops, key, http_lp_number(t->logprob));
        free(key);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "top_logprobs"), tops);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "text_offset"),
                         cJSON_CreateNumber((double)text_offset));
}

/* The logprobs of a finished request whose generated text is text[0..len). */
static cJSON *http_result_logprobs(coord_request *req, const char *text, size_t len)
{
    const coord_params *p = coord_request_params(req);
    bool chat = p->kind == COORD_REQ_CHAT;
    int n = 0;
    coord_logprob *lp = coord_request_logprobs(req, 0, &n);
    cJSON *obj = http_logprobs_new(chat);
    http_chars walk = {0};
    for (int i = 0; i < n; i++)
        http_logprobs_add(obj, chat, p->top_logprobs, &lp[i],
                          chat ? 0 : http_char_offset(&walk, text, len, 0, lp[i].text_start));
    free(lp);
    return obj;
}

/* The whole answer of a finished non-streaming request. */
static cJSON *http_result_json(const http_server *srv, coord_request *req, time_t created)
{
    const coord_params *p = coord_request_params(req);
    bool chat = p->kind == COORD_REQ_CHAT;
    coord_outcome o;
    coord_request_outcome(req, &o);
    size_t len = 0;
    char *text = coord_request_text(req, &len);
    if (text && p->echo && p->prompt) {
        /* echo: the prompt, then the completion, as one text */
        size_t plen = strlen(p->prompt);
        char *both = malloc(plen + len + 1);
        if (both) {
            memcpy(both, p->prompt, plen);
            memcpy(both + plen, text, len + 1);
            len += plen;
        }
        free(text);
        text = both;
    }
    cJSON *root = http_envelope(srv, req, chat ? "chat.completion" : "text_completion", created);
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "choices"), choice);
    cJSON_AddNumberToObject(choice, "index", 0);
    if (chat) {
        cJSON *msg = cJSON_AddObjectToObject(choice, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        http_json_add_text(msg, "content", text, len);
    } else {
        http_json_add_text(choice, "text", text, len);
    }
    if (p->logprobs && text) /* never with echo: text is the generated text */
        cJSON_AddItemToObject(choice, "logprobs", http_result_logprobs(req, text, len));
    else
        cJSON_AddNullToObject(choice, "logprobs");
    free(text);
    cJSON_AddStringToObject(choice, "finish_reason", o.finish_reason[0] ? o.finish_reason : "stop");
    http_add_usage(root, &o);
    cJSON_AddItemToObject(root, "orochi", http_orochi_json(req, &o));
    return root;
}

/* ==== streaming =============================================================================== */

/* One chunk: a text piece, or (finish_reason set) the final chunk with usage and the orochi
 * object. logprobs (taken) is the chunk's logprobs object; NULL: null. */
static cJSON *http_chunk_json(http_stream *st, const char *text, const char *finish_reason,
                              cJSON *logprobs)
{
    cJSON *root = http_envelope(
        st->srv, st->req, st->chat ? "chat.completion.chunk" : "text_completion", st->created);
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "choices"), choice);
    cJSON_AddNumberToObject(choice, "index", 0);
    if (st->chat) {
        cJSON *delta = cJSON_AddObjectToObject(choice, "delta");
        if (!st->role_sent) {
            cJSON_AddStringToObject(delta, "role", "assistant");
            st->role_sent = true;
        }
        if (text)
            cJSON_AddStringToObject(delta, "content", text);
    } else {
        cJSON_AddStringToObject(choice, "text", text ? text : "");
    }
    if (logprobs)
        cJSON_AddItemToObject(choice, "logprobs", logprobs);
    else
        cJSON_AddNullToObject(choice, "logprobs");
    if (finish_reason) {
        coord_outcome o;
        coord_request_outcome(st->req, &o);
        cJSON_AddStringToObject(choice, "finish_reason", finish_reason);
        if (st->usage_chunk)
            cJSON_AddNullToObject(root, "usage"); /* it comes in a chunk of its own */
        else
            http_add_usage(root, &o);
        cJSON_AddItemToObject(root, "orochi", http_orochi_json(st->req, &o));
    } else {
        cJSON_AddNullToObject(choice, "finish_reason");
        if (st->usage_chunk)
            cJSON_AddNullToObject(root, "usage");
    }
    return root;
}

/* stream_options.include_usage: the chunk after the last, with no choices and the usage. */
static cJSON *http_usage_chunk_json(http_stream *st)
{
    cJSON *root = http_envelope(
        st->srv, st->req, st->chat ? "chat.completion.chunk" : "text_completion", st->created);
    cJSON_AddArrayToObject(root, "choices");
    coord_outcome o;
    coord_request_outcome(st->req, &o);
    http_add_usage(root, &o);
    return root;
}

/* Appends one SSE event carrying `js` (taken). cJSON's compact output has no raw newlines, so the
 * JSON always fits one data: line. */
static void http_stream_event(http_stream *st, cJSON *js)
{
    char *text = js ? cJSON_PrintUnformatted(js) : NULL;
    cJSON_Delete(js);
    if (!text) {
        st->out.oom = true;
        return;
    }
    http_buf_printf(&st->out, "data: %s\n\n", text);
    cJSON_free(text);
    st->last_emit = http_now();
}

/* The logprobs a chunk carries (for a request that asks): the records of the tokens whose text
 * begins in the generated bytes p[0..n) it releases, which follow those sent so far; with `last`
 * (the final chunk, n = 0) every record left, and NULL when none is. */
static cJSON *http_stream_logprobs(http_stream *st, const char *p, size_t n, bool last)
{
    int count = 0;
    coord_logprob *lp = coord_request_logprobs(st->req, st->lp_next, &count);
    size_t end = st->raw_sent + n;
    int take = 0;
    while (take < count && (last || lp[take].text_start < end))
        take++;
    cJSON *obj = NULL;
    if (take || !last) {
        int top_n = coord_request_params(st->req)->top_logprobs;
        obj = http_logprobs_new(st->chat);
        for (int i = 0; i < take; i++)
            http_logprobs_add(
                obj, st->chat, top_n, &lp[i],
                st->chat ? 0 : http_char_offset(&st->chars, p, n, st->raw_sent, lp[i].text_start));
    }
    http_char_offset(&st->chars, p, n, st->raw_sent, end); /* on to the chunk's end */
    st->raw_sent = end;
    st->lp_next += take;
    free(lp);
    return obj;
}

/* Adds engine text; emits whatever forms complete UTF-8 (everything when flushing). */
static void http_stream_text(http_stream *st, const char *text, size_t len, bool flush)
{
    http_buf_add(&st->hold, text, len);
    if (st->hold.oom) {
        st->out.oom = true;
        return;
    }
    size_t n =
        flush ? st->hold.len : utf8_complete((const unsigned char *)st->hold.p, st->hold.len);
    if (!n)
        return;
    char *clean = utf8_clean(st->hold.p, n);
    if (!clean) {
        st->out.oom = true;
        return;
    }
    cJSON *lps = coord_request_params(st->req)->logprobs
                     ? http_stream_logprobs(st, st->hold.p, n, false)
                     : NULL;
    if (*clean || (lps && cJSON_GetArraySize(lps->child) > 0)) /* (the first array: tokens) */
        http_stream_event(st, http_chunk_json(st, clean, NULL, lps));
    else
        cJSON_Delete(lps);
    free(clean);
    memmove(st->hold.p, st->hold.p + n, st->hold.len - n);
    st->hold.len -= n;
}

/* Waits one tick for news and turns it into SSE bytes. -1: give up (client gone, server stopping,
 * out of memory); the request is cancelled. */
static int http_stream_pull(http_stream *st)
{
    char *piece = NULL;
    size_t plen = 0;
    coord_request_state state =
        coord_request_wait(st->req, &st->text_off, HTTP_TICK_MS, &piece, &plen);
    if (piece) {
        http_stream_text(st, piece, plen, false);
        free(piece);
    }
    if (state == COORD_REQ_DONE) {
        http_stream_text(st, NULL, 0, true);
        coord_outcome o;
        coord_request_outcome(st->req, &o);
        cJSON *lps = coord_request_params(st->req)->logprobs
                         ? http_stream_logprobs(st, NULL, 0, true)
                         : NULL;
        http_stream_event(
            st, http_chunk_json(st, NULL, o.finish_reason[0] ? o.finish_reason : "stop", lps));
        if (st->usage_chunk)
            http_stream_event(st, http_usage_chunk_json(st));
        http_buf_add(&st->out, "data: [DONE]\n\n", 15);
        st->ended = true;
    } else if (state == COORD_REQ_FAILED) {
        http_stream_text(st, NULL, 0, true);
        coord_outcome o;
        coord_request_outcome(st->req, &o);
        int status;
        http_stream_event(st, http_engine_error_json(st->chat, o.http_status, o.message, &status));
        http_buf_add(&st->out, "data: [DONE]\n\n", 15);
        st->ended = true;
    } else if (!piece) {
        if (atomic_load(&st->srv->stopping) || http_peer_gone(st->fd) ||
            coord_request_cancelled(st->req)) {
            coord_request_cancel(st->req);
            return -1;
        }
        if ((http_now() - st->last_emit) * 1000.0 >= st->srv->keepalive_ms) {
            http_buf_add(&st->out, ": keepalive\n\n", 13);
            st->last_emit = http_now();
        }
    }
    if (st->out.oom) {
        coord_request_cancel(st->req);
        return -1;
    }
    return 0;
}

static ssize_t http_stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    http_stream *st = cls;
    (void)pos;
    while (st->out_off == st->out.len) {
        if (st->ended)
            return MHD_CONTENT_READER_END_OF_STREAM;
        st->out.len = st->out_off = 0;
        if (http_stream_pull(st))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = st->out.len - st->out_off;
    if (n > max)
        n = max;
    memcpy(buf, st->out.p + st->out_off, n);
    st->out_off += n;
    return (ssize_t)n;
}

/* libmicrohttpd is done with the response: normally after [DONE], or because the client vanished
 * (a write failed) or the server stopped; in the latter cases the engine is told to stop. */
static void http_stream_free(void *cls)
{
    http_stream *st = cls;
    if (!st->ended)
        coord_request_cancel(st->req);
    atomic_fetch_sub(&st->srv->active, 1);
    coord_request_unref(&st->req);
    http_buf_free(&st->out);
    http_buf_free(&st->hold);
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
    http_err e = {0};
    coord_request *req = http_parse_request(srv, chat, ex->body.p, ex->body.len, &e);
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
    bool submitted = srv->engine.submit(srv->engine.ctx, req) == 0;
    bool waited = submitted && http_await(srv, req, fd, p->stream);
    coord_request_outcome(req, &o);
    if (!submitted || (waited && o.state == COORD_REQ_FAILED)) {
        /* refused, or failed before a byte was sent: a plain error answer */
        bool failed = o.state == COORD_REQ_FAILED;
        int status;
        cJSON *js = http_engine_error_json(
            chat, failed ? o.http_status : 503,
            failed ? o.message : "the engine did not accept the request", &status);
        ok = http_send_json(srv, conn, ex->route, status, js, NULL);
    } else if (!waited) {
        http_count(srv, ex->route, HTTP_CLIENT_GONE);
        ok = MHD_NO;
    } else if (!p->stream) {
        ok = http_send_json(srv, conn, ex->route, 200, http_result_json(srv, req, created), NULL);
    } else {
        http_stream *st = calloc(1, sizeof *st);
        struct MHD_Response *r = NULL;
        if (st) {
            *st = (http_stream){.srv = srv,
                                .req = req,
                                .fd = fd,
                                .chat = chat,
                                .usage_chunk = p->stream_usage,
                                .created = created,
                                .last_emit = http_now()};
            if (p->echo && p->prompt && *p->prompt) /* echo: the prompt is the first event */
                http_stream_event(st, http_chunk_json(st, p->prompt, NULL, NULL));
            r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, HTTP_STREAM_BLOCK,
                                                  http_stream_read, st, http_stream_free);
            if (!r) {
                http_buf_free(&st->out);
                free(st);
            } else {
                req = NULL; /* the stream owns the reference and the active count now */
            }
        }
        if (!r) {
            coord_request_cancel(req);
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
    if (req) {
        atomic_fetch_sub(&srv->active, 1);
        coord_request_unref(&req);
    }
    return ok;
}

static cJSON *http_model_json(const http_server *srv)
{
    cJSON *m = cJSON_CreateObject();
    http_json_add_text(m, "id", srv->model_name, strlen(srv->model_name));
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
        http_json_add_text(root, "message", msg[0] ? msg : "the engine is not ready",
                           strlen(msg[0] ? msg : "the engine is not ready"));
    }
    return http_send_json(srv, conn, ROUTE_HEALTH, healthy ? 200 : 503, root, NULL);
}

/* GET /metrics: the engine's exposition followed by the HTTP counters. A request is counted when
 * its answer is queued, so this answer is not in its own numbers. */
static enum MHD_Result http_metrics(http_server *srv, struct MHD_Connection *conn)
{
    http_buf b = {0};
    char *engine_text = srv->engine.metrics ? srv->engine.metrics(srv->engine.ctx) : NULL;
    if (engine_text) {
        size_t n = strlen(engine_text);
        http_buf_add(&b, engine_text, n);
        if (n && engine_text[n - 1] != '\n')
            http_buf_add(&b, "\n", 1);
        free(engine_text);
    }
    http_buf_printf(&b,
                    "# HELP orochi_http_requests_total HTTP requests answered, by route and status "
                    "code (499: the client left before the answer was complete).\n"
                    "# TYPE orochi_http_requests_total counter\n");
    pthread_mutex_lock(&srv->mu);
    for (int i = 0; i < srv->n_counters; i++)
        http_buf_printf(&b, "orochi_http_requests_total{route=\"%s\",code=\"%d\"} %llu\n",
                        HTTP_ROUTE_LABEL[srv->counters[i].route], srv->counters[i].code,
                        (unsigned long long)srv->counters[i].count);
    pthread_mutex_unlock(&srv->mu);
    http_buf_printf(&b,
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
    http_buf_printf(&b,
                    "# HELP orochi_http_connections_evicted_total Connections closed while waiting "
                    "for a request header, to keep room in the budget.\n"
                    "# TYPE orochi_http_connections_evicted_total counter\n"
                    "orochi_http_connections_evicted_total %llu\n",
                    (unsigned long long)evicted);
    if (b.oom) {
        http_buf_free(&b);
        return MHD_NO;
    }
    return http_send(srv, conn, ROUTE_METRICS, 200, "text/plain; version=0.0.4; charset=utf-8", b.p,
                     b.len, NULL);
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
    if (route != ROUTE_HEALTH && !http_authorized(srv, conn))
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
    default: {
        char msg[320];
        snprintf(msg, sizeof msg,
                 "no route for %.16s %.200s (see /v1/completions, "
                 "/v1/chat/completions, /v1/models, /health, /metrics)",
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
            http_buf_free(&ex->body);
        }
        if (!ex->too_large) {
            http_buf_add(&ex->body, upload_data, n);
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
    http_buf_free(&ex->body);
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
