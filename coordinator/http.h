/*
 * coordinator/http — the coordinator's OpenAI-compatible HTTP API (libmicrohttpd + cJSON).
 *
 * The server parses and validates each request body into a coord_request, hands it to the engine
 * through the http_engine callbacks, and answers from the request's output side: one JSON object
 * when the generation ends, or a server-sent-event stream of text pieces. It never touches the
 * model; the engine never touches HTTP. Routes, fields, errors and the streaming format are
 * documented in docs/http-api.md. It also serves the page at `/` (coordinator/page/index.html,
 * compiled in: a chat and a dashboard of the group, docs/page.md).
 *
 * Threads: libmicrohttpd runs one thread per connection (plus its listening thread), and the
 * handlers block on the request's condition variable while the engine works; see http.c. Starting
 * the server raises the process's soft RLIMIT_NOFILE up to the hard limit when the connection
 * budget needs more descriptors.
 */
#ifndef OROCHI_COORD_HTTP_H
#define OROCHI_COORD_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "coordinator/request.h"

typedef struct {
    const char *bind_addr;  /* IPv4/IPv6 literal or host name; NULL: "127.0.0.1" */
    int port;               /* 0: an ephemeral port (see http_server_port) */
    const char *api_key;    /* NULL or "": no authentication; else every route but /health and
                             * the page (/) needs "Authorization: Bearer KEY" */
    const char *model_name; /* reported by /v1/models and in responses; NULL: "orochi" */
    size_t max_body_bytes;  /* larger bodies get 413; 0: 1 MiB */
    int max_tokens_cap;     /* largest max_tokens accepted; 0: 4096 */
    int max_connections;    /* concurrent connections (one thread each); 0: 2048. Either way
                             * bounded by the open-file limit, less a reserve for the process */
    int keepalive_ms;       /* SSE comment sent on a quiet stream this often; 0: 15000 */
    int idle_timeout_s;     /* a connection with a request under way that goes quiet this long is
                             * closed (never while a generation runs); 0: 60 */
    int header_timeout_s;   /* a connection that has not sent a complete request header (a new
                             * one, or a keep-alive one between requests) and goes quiet this long
                             * is closed; 0: 10, and never above idle_timeout_s */
    bool quiet;             /* don't print libmicrohttpd's runtime messages to stderr */
} http_config;

/* What the engine provides. Callbacks run on HTTP threads, possibly several at once. */
typedef struct {
    void *ctx;
    /* Takes a new, fully parsed request. Returns 0 when queued (the engine takes its own reference
     * if it keeps req), or fails it with coord_request_fail (400/413/503 and a message) and returns
     * -1. Required. */
    int (*submit)(void *ctx, coord_request *req);
    /* Prometheus text exposition of the engine's metrics, malloc'd (the server frees it and appends
     * its own HTTP counters). NULL callback or NULL return: only the HTTP counters. */
    char *(*metrics)(void *ctx);
    /* 1 healthy; 0 not, with a reason in msg (answered as 503). NULL callback: always healthy. */
    int (*health)(void *ctx, char *msg, size_t len);
    /* GET /status: the group's processes, controllers and counters as one JSON object, malloc'd
     * (the server frees it; docs/http-api.md, "Status"). NULL callback or NULL return: 503. */
    char *(*status)(void *ctx);
} http_engine;

typedef struct http_server http_server;

/* Binds and starts serving; NULL with a one-line reason in err on failure (bad address, port in
 * use, out of memory). cfg and engine are copied; engine->ctx must outlive the server. */
http_server *http_server_start(const http_config *cfg, const http_engine *engine, char *err,
                               size_t errlen);
/* The TCP port the server listens on (the chosen one when cfg->port was 0). */
int http_server_port(const http_server *srv);
/* The connections open now: 0 when every response queued so far has reached its client (or the
 * client left), which a draining coordinator waits for before it stops the server. */
int http_server_open_connections(http_server *srv);
/* Stops accepting, ends open connections (waiting handlers give up within ~0.2 s and cancel their
 * requests), joins the threads, frees, and sets *srv to NULL. NULL-safe. */
void http_server_stop(http_server **srv);

#endif
