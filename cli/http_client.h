/*
 * cli/http_client — a minimal HTTP/1.1 client for talking to an orochi coordinator: one TCP
 * connection per request ("Connection: close"), plain http:// URLs only, Content-Length, chunked
 * and read-until-close bodies, delivered piece by piece as they arrive so server-sent events can
 * be shown while a generation runs. Also a small server-sent-events parser. Used by
 * `orochi generate` / `orochi chat`, and reusable by tests and benchmarks (it needs only libc).
 */
#ifndef OROCHI_CLI_HTTP_CLIENT_H
#define OROCHI_CLI_HTTP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

/* Results of hcli_do. */
enum {
    HCLI_OK = 0,
    HCLI_ECONNECT = -1, /* could not resolve or connect */
    HCLI_EIO = -2,      /* the connection failed or timed out mid-way */
    HCLI_EPROTO = -3,   /* the answer is not HTTP/1.x as we understand it */
    HCLI_ABORTED = -4,  /* the body callback asked to stop */
    HCLI_ENOMEM = -5,
    HCLI_EURL = -6,     /* the URL is not http://host[:port][/prefix] */
};

typedef struct {
    char host[256];   /* name or address; IPv6 without the brackets */
    char port[8];     /* "80" when the URL names none */
    char prefix[256]; /* path prefix without a trailing '/', usually "" */
} hcli_url;

/* Called with each piece of a 2xx answer's body as it arrives (after chunked decoding). Return 0
 * to go on; anything else stops reading and closes the connection (hcli_do: HCLI_ABORTED). */
typedef int (*hcli_body_fn)(void *ctx, const char *data, size_t len);

typedef struct {
    const char *method;       /* NULL: POST when a body is given, else GET */
    const char *path;         /* e.g. "/v1/completions"; appended to the URL's prefix */
    const char *api_key;      /* non-NULL, non-empty: "Authorization: Bearer KEY" */
    const char *content_type; /* NULL: "application/json" when a body is given */
    const char *body;
    size_t body_len;
    const char *extra_headers; /* raw "Name: value\r\n" lines, or NULL */
    int timeout_ms;            /* limit for connecting and for each read or write; 0: none */
    hcli_body_fn on_body;      /* NULL: every body is collected in the response */
    void *ctx;
} hcli_request;

typedef struct {
    int status;
    char content_type[128];
    char *body; /* the collected body, NUL-terminated (non-2xx answers always, 2xx without
                 * on_body); NULL if empty */
    size_t body_len;
} hcli_response;

int hcli_url_parse(const char *url, hcli_url *out, char *err, size_t errlen);
/* Sends one request to `url` (http://host[:port][/prefix]) and reads the answer into *resp (free
 * with hcli_response_free, also after an error). Returns HCLI_OK or a negative HCLI_ code with a
 * one-line reason in err; an unreachable server reads "cannot connect to URL: reason". */
int hcli_do(const char *url, const hcli_request *rq, hcli_response *resp, char *err, size_t errlen);
void hcli_response_free(hcli_response *resp);

/* Server-sent events: feed body bytes in any pieces; fn gets each event's data (multi-line data
 * joined with '\n', NUL-terminated). Comments and other fields are skipped. */
typedef int (*hcli_sse_fn)(void *ctx, const char *data, size_t len);

typedef struct {
    hcli_sse_fn fn;
    void *ctx;
    char *line; /* the current unfinished line */
    size_t line_len, line_cap;
    char *data; /* the data of the current event */
    size_t data_len, data_cap;
    bool has_data, oom;
} hcli_sse;

void hcli_sse_init(hcli_sse *p, hcli_sse_fn fn, void *ctx);
/* Returns 0, fn's non-zero result (parsing stops there), or HCLI_ENOMEM. */
int hcli_sse_feed(hcli_sse *p, const char *bytes, size_t n);
void hcli_sse_free(hcli_sse *p);

#endif
