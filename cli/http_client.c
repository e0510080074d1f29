/*
 * cli/http_client.c — see http_client.h. The answer is read through a small buffered reader: the
 * status line and headers line by line, then the body in whatever pieces recv() returns, so a
 * streamed answer reaches the caller as soon as each piece arrives. Chunked bodies are decoded on
 * the fly (chunk extensions and trailers are read and ignored). Every request closes its
 * connection, which keeps the client free of pooling state; an orochi request costs far more than
 * a TCP handshake on the same host.
 */
#define _GNU_SOURCE
#include "cli/http_client.h"
#include "base/buf.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define HCLI_BUF 16384
#define HCLI_LINE 8192 /* longest status/header/chunk-size line accepted */

typedef struct {
    int fd;
    char buf[HCLI_BUF];
    size_t start, end;
} hcli_reader;

typedef struct {
    const hcli_request *rq;
    hcli_response *resp;
    size_t cap;
    bool stream; /* deliver to rq->on_body instead of collecting */
} hcli_sink;

/* ==== URL ===================================================================================== */

int hcli_url_parse(const char *url, hcli_url *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (strncasecmp(url, "http://", 7)) {
        snprintf(err, errlen, "'%s' is not an http:// URL (https is not supported)", url);
        return HCLI_EURL;
    }
    const char *p = url + 7, *host_end, *after;
    if (*p == '[') { /* [IPv6]:port */
        host_end = strchr(p, ']');
        if (!host_end) {
            snprintf(err, errlen, "'%s': unterminated '[' in the host", url);
            return HCLI_EURL;
        }
        p++;
        after = host_end + 1;
    } else {
        host_end = p + strcspn(p, ":/");
        after = host_end;
    }
    size_t hlen = (size_t)(host_end - p);
    if (!hlen || hlen >= sizeof out->host) {
        snprintf(err, errlen, "'%s': missing or overlong host", url);
        return HCLI_EURL;
    }
    memcpy(out->host, p, hlen);
    strcpy(out->port, "80");
    if (*after == ':') {
        const char *ps = after + 1;
        size_t plen = strspn(ps, "0123456789");
        long port = plen && plen < 6 ? strtol(ps, NULL, 10) : -1;
        if (port < 1 || port > 65535 || (ps[plen] && ps[plen] != '/')) {
            snprintf(err, errlen, "'%s': the port must be a number in 1..65535", url);
            return HCLI_EURL;
        }
        snprintf(out->port, sizeof out->port, "%ld", port);
        after = ps + plen;
    } else if (*after && *after != '/') {
        snprintf(err, errlen, "'%s': unexpected '%c' after the host", url, *after);
        return HCLI_EURL;
    }
    size_t plen = strlen(after);
    while (plen && after[plen - 1] == '/')
        plen--;
    if (plen >= sizeof out->prefix) {
        snprintf(err, errlen, "'%s': the path is too long", url);
        return HCLI_EURL;
    }
    memcpy(out->prefix, after, plen);
    return HCLI_OK;
}

/* ==== connection ============================================================================== */

/* Connects with a deadline (timeout_ms > 0) by polling a non-blocking connect. */
static int hcli_connect_one(const struct addrinfo *ai, int timeout_ms, int *err_no)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
        *err_no = errno;
        return -1;
    }
    int flags = fcntl(fd, F_GETFL);
    if (timeout_ms > 0)
        fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc && errno == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int pr;
        do
            pr = poll(&p, 1, timeout_ms);
        while (pr < 0 && errno == EINTR);
        int so = 0;
        socklen_t sl = sizeof so;
        if (pr == 0)
            so = ETIMEDOUT;
        else if (pr < 0)
            so = errno;
        else
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl);
        rc = so ? -1 : 0;
        errno = so;
    }
    if (rc) {
        *err_no = errno;
        close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, flags);
    if (timeout_ms > 0) {
        struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    return fd;
}

static int hcli_connect(const char *url, const hcli_url *u, int timeout_ms, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(u->host, u->port, &hints, &res);
    if (rc) {
        snprintf(err, errlen, "cannot connect to %s: %s", url, gai_strerror(rc));
        return -1;
    }
    int fd = -1, err_no = ECONNREFUSED;
    for (const struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next)
        fd = hcli_connect_one(ai, timeout_ms, &err_no);
    freeaddrinfo(res);
    if (fd < 0)
        snprintf(err, errlen, "cannot connect to %s: %s", url, strerror(err_no));
    return fd;
}

static int hcli_send_all(int fd, const char *p, size_t n, char *err, size_t errlen)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            snprintf(err, errlen, "sending the request failed: %s",
                     w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? "timed out" : strerror(errno));
            return HCLI_EIO;
        }
        p += w;
        n -= (size_t)w;
    }
    return HCLI_OK;
}

/* ==== reading the answer ====================================================================== */

/* More bytes into the reader (compacting first). >0 read, 0 end of stream, <0 error (err set). */
static ssize_t hcli_fill(hcli_reader *r, char *err, size_t errlen)
{
    if (r->start == r->end)
        r->start = r->end = 0;
    else if (r->end == sizeof r->buf) {
        memmove(r->buf, r->buf + r->start, r->end - r->start);
        r->end -= r->start;
        r->start = 0;
    }
    if (r->end == sizeof r->buf) {
        snprintf(err, errlen, "a line of the answer is too long");
        return -1;
    }
    ssize_t n;
    do
        n = recv(r->fd, r->buf + r->end, sizeof r->buf - r->end, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        snprintf(err, errlen, "reading the answer failed: %s",
                 errno == EAGAIN || errno == EWOULDBLOCK ? "timed out" : strerror(errno));
    else
        r->end += (size_t)n;
    return n;
}

/* One CRLF- (or LF-) terminated line into `line` without the terminator. */
static int hcli_line(hcli_reader *r, char *line, size_t cap, char *err, size_t errlen)
{
    for (;;) {
        char *nl = memchr(r->buf + r->start, '\n', r->end - r->start);
        if (nl) {
            size_t n = (size_t)(nl - (r->buf + r->start));
            size_t keep = n && nl[-1] == '\r' ? n - 1 : n;
            if (keep >= cap) {
                snprintf(err, errlen, "a line of the answer is too long");
                return HCLI_EPROTO;
            }
            memcpy(line, r->buf + r->start, keep);
            line[keep] = 0;
            r->start += n + 1;
            return HCLI_OK;
        }
        ssize_t got = hcli_fill(r, err, errlen);
        if (got == 0)
            snprintf(err, errlen, "the server closed the connection mid-answer");
        if (got <= 0)
            return got == 0 ? HCLI_EPROTO : HCLI_EIO;
    }
}

static int hcli_emit(hcli_sink *s, const char *data, size_t n, char *err, size_t errlen)
{
    if (!n)
        return HCLI_OK;
    if (s->stream) {
        if (s->rq->on_body(s->rq->ctx, data, n)) {
            snprintf(err, errlen, "stopped by the caller");
            return HCLI_ABORTED;
        }
        return HCLI_OK;
    }
    hcli_response *resp = s->resp;
    if (buf_append(&resp->body, &resp->body_len, &s->cap, data, n, 4096)) {
        snprintf(err, errlen, "out of memory");
        return HCLI_ENOMEM;
    }
    return HCLI_OK;
}

/* Passes on `n` body bytes (SIZE_MAX: until the server closes). */
static int hcli_body_bytes(hcli_reader *r, hcli_sink *s, size_t n, char *err, size_t errlen)
{
    while (n) {
        if (r->start == r->end) {
            ssize_t got = hcli_fill(r, err, errlen);
            if (got == 0 && n == SIZE_MAX)
                return HCLI_OK;
            if (got == 0)
                snprintf(err, errlen, "the server closed the connection mid-body");
            if (got <= 0)
                return got == 0 ? HCLI_EPROTO : HCLI_EIO;
        }
        size_t take = r->end - r->start;
        if (take > n)
            take = n;
        int rc = hcli_emit(s, r->buf + r->start, take, err, errlen);
        if (rc)
            return rc;
        r->start += take;
        if (n != SIZE_MAX)
            n -= take;
    }
    return HCLI_OK;
}

static int hcli_body_chunked(hcli_reader *r, hcli_sink *s, char *err, size_t errlen)
{
    char line[HCLI_LINE];
    for (;;) {
        int rc = hcli_line(r, line, sizeof line, err, errlen);
        if (rc)
            return rc;
        char *end;
        errno = 0;
        unsigned long long size = strtoull(line, &end, 16);
        if (end == line || errno || (*end && *end != ';' && *end != ' ' && *end != '\t')) {
            snprintf(err, errlen, "bad chunk size line '%.32s'", line);
            return HCLI_EPROTO;
        }
        if (size == 0)
            break;
        if (size >= SIZE_MAX / 2) {
            snprintf(err, errlen, "absurd chunk size '%.32s'", line);
            return HCLI_EPROTO;
        }
        if ((rc = hcli_body_bytes(r, s, (size_t)size, err, errlen)))
            return rc;
        if ((rc = hcli_line(r, line, sizeof line, err, errlen)))
            return rc;
        if (line[0]) {
            snprintf(err, errlen, "a chunk is longer than its size says");
            return HCLI_EPROTO;
        }
    }
    do { /* trailers, up to the empty line */
        int rc = hcli_line(r, line, sizeof line, err, errlen);
        if (rc)
            return rc;
    } while (line[0]);
    return HCLI_OK;
}

/* Status line and headers; 1xx interim answers are skipped. */
static int hcli_head(hcli_reader *r, hcli_response *resp, bool *chunked, size_t *length,
                     char *err, size_t errlen)
{
    char line[HCLI_LINE];
    for (;;) {
        int rc = hcli_line(r, line, sizeof line, err, errlen);
        if (rc)
            return rc;
        int status = 0;
        if (strncmp(line, "HTTP/1.", 7) || sscanf(line + 8, " %3d", &status) != 1 || status < 100 ||
            status > 599) {
            snprintf(err, errlen, "not an HTTP/1.x answer: '%.64s'", line);
            return HCLI_EPROTO;
        }
        *chunked = false;
        *length = SIZE_MAX;
        for (;;) {
            if ((rc = hcli_line(r, line, sizeof line, err, errlen)))
                return rc;
            if (!line[0])
                break;
            char *colon = strchr(line, ':');
            if (!colon)
                continue;
            *colon = 0;
            char *v = colon + 1;
            v += strspn(v, " \t");
            if (!strcasecmp(line, "Content-Length")) {
                char *end;
                errno = 0;
                unsigned long long n = strtoull(v, &end, 10);
                if (end == v || errno) {
                    snprintf(err, errlen, "bad Content-Length '%.32s'", v);
                    return HCLI_EPROTO;
                }
                *length = (size_t)n;
            } else if (!strcasecmp(line, "Transfer-Encoding")) {
                *chunked = strcasestr(v, "chunked") != NULL;
            } else if (!strcasecmp(line, "Content-Type")) {
                snprintf(resp->content_type, sizeof resp->content_type, "%s", v);
            }
        }
        if (status >= 200) {
            resp->status = status;
            return HCLI_OK;
        }
    }
}

int hcli_do(const char *url, const hcli_request *rq, hcli_response *resp, char *err, size_t errlen)
{
    memset(resp, 0, sizeof *resp);
    hcli_url u;
    int rc = hcli_url_parse(url, &u, err, errlen);
    if (rc)
        return rc;
    const char *method = rq->method ? rq->method : rq->body ? "POST" : "GET";
    const char *path = rq->path && *rq->path ? rq->path : "/";
    bool v6 = strchr(u.host, ':') != NULL;
    char head[2048];
    int hn = snprintf(head, sizeof head,
                      "%s %s%s HTTP/1.1\r\nHost: %s%s%s:%s\r\nUser-Agent: orochi-cli\r\n"
                      "Accept: */*\r\nConnection: close\r\n",
                      method, u.prefix, path, v6 ? "[" : "", u.host, v6 ? "]" : "", u.port);
    if (rq->body)
        hn += snprintf(head + hn, sizeof head - (size_t)hn, "Content-Type: %s\r\nContent-Length: %zu\r\n",
                       rq->content_type ? rq->content_type : "application/json", rq->body_len);
    if (rq->api_key && *rq->api_key && hn < (int)sizeof head)
        hn += snprintf(head + hn, sizeof head - (size_t)hn, "Authorization: Bearer %s\r\n", rq->api_key);
    if (rq->extra_headers && hn < (int)sizeof head)
        hn += snprintf(head + hn, sizeof head - (size_t)hn, "%s", rq->extra_headers);
    if (hn < (int)sizeof head)
        hn += snprintf(head + hn, sizeof head - (size_t)hn, "\r\n");
    if (hn >= (int)sizeof head) {
        snprintf(err, errlen, "the request head is too long");
        return HCLI_EURL;
    }

    int fd = hcli_connect(url, &u, rq->timeout_ms, err, errlen);
    if (fd < 0)
        return HCLI_ECONNECT;
    hcli_reader *r = malloc(sizeof *r);
    if (!r) {
        close(fd);
        snprintf(err, errlen, "out of memory");
        return HCLI_ENOMEM;
    }
    r->fd = fd;
    r->start = r->end = 0;
    rc = hcli_send_all(fd, head, (size_t)hn, err, errlen);
    if (!rc && rq->body_len)
        rc = hcli_send_all(fd, rq->body, rq->body_len, err, errlen);
    bool chunked = false;
    size_t length = SIZE_MAX;
    if (!rc)
        rc = hcli_head(r, resp, &chunked, &length, err, errlen);
    if (!rc) {
        hcli_sink s = {.rq = rq, .resp = resp,
                       .stream = rq->on_body && resp->status >= 200 && resp->status < 300};
        bool no_body = !strcmp(method, "HEAD") || resp->status == 204 || resp->status == 304;
        if (no_body)
            rc = HCLI_OK;
        else if (chunked)
            rc = hcli_body_chunked(r, &s, err, errlen);
        else
            rc = hcli_body_bytes(r, &s, length, err, errlen);
    }
    close(fd);
    free(r);
    return rc;
}

void hcli_response_free(hcli_response *resp)
{
    if (!resp)
        return;
    free(resp->body);
    resp->body = NULL;
    resp->body_len = 0;
}

/* ==== server-sent events ====================================================================== */

void hcli_sse_init(hcli_sse *p, hcli_sse_fn fn, void *ctx)
{
    *p = (hcli_sse){.fn = fn, .ctx = ctx};
}

static bool hcli_grow(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    char *nb = realloc(*buf, c);
    if (!nb)
        return false;
    *buf = nb;
    *cap = c;
    return true;
}

/* One complete line of the event stream. */
static int hcli_sse_line(hcli_sse *p, const char *line, size_t n)
{
    if (n == 0) { /* blank line: dispatch the event */
        if (!p->has_data)
            return 0;
        p->has_data = false;
        size_t len = p->data_len;
        p->data_len = 0;
        return p->fn(p->ctx, p->data, len);
    }
    if (line[0] == ':')
        return 0; /* comment (keep-alive) */
    const char *colon = memchr(line, ':', n);
    size_t name_len = colon ? (size_t)(colon - line) : n;
    if (name_len != 4 || memcmp(line, "data", 4))
        return 0; /* event:, id:, retry: are not used by this API */
    const char *v = colon ? colon + 1 : line + n;
    if (v < line + n && *v == ' ')
        v++;
    size_t vlen = (size_t)(line + n - v);
    if (!hcli_grow(&p->data, &p->data_cap, p->data_len + vlen + 2)) {
        p->oom = true;
        return HCLI_ENOMEM;
    }
    if (p->has_data)
        p->data[p->data_len++] = '\n';
    memcpy(p->data + p->data_len, v, vlen);
    p->data_len += vlen;
    p->data[p->data_len] = 0;
    p->has_data = true;
    return 0;
}

int hcli_sse_feed(hcli_sse *p, const char *bytes, size_t n)
{
    if (p->oom)
        return HCLI_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        char c = bytes[i];
        if (c == '\n') {
            size_t len = p->line_len;
            if (len && p->line[len - 1] == '\r')
                len--;
            p->line_len = 0;
            int rc = hcli_sse_line(p, p->line ? p->line : "", len);
            if (rc)
                return rc;
            continue;
        }
        if (!hcli_grow(&p->line, &p->line_cap, p->line_len + 2)) {
            p->oom = true;
            return HCLI_ENOMEM;
        }
        p->line[p->line_len++] = c;
    }
    return 0;
}

void hcli_sse_free(hcli_sse *p)
{
    free(p->line);
    free(p->data);
    *p = (hcli_sse){0};
}
