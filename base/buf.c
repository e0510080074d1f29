/*
 * base/buf.c — growing arrays and byte buffers (interface: buf.h).
 */
#include "base/buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int buf_grow(void **p, size_t *cap, size_t need, size_t size, size_t first)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : (first ? first : 1);
    while (c < need) {
        if (c > SIZE_MAX / 2)
            return -1;
        c *= 2;
    }
    if (size && c > SIZE_MAX / size)
        return -1;
    void *q = realloc(*p, c * size);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

int buf_append(char **p, size_t *len, size_t *cap, const void *s, size_t n, size_t first)
{
    if (n > SIZE_MAX - *len - 1)
        return -1;
    void *q = *p;
    if (buf_grow(&q, cap, *len + n + 1, 1, first))
        return -1;
    *p = q;
    if (n)
        memcpy(*p + *len, s, n);
    *len += n;
    (*p)[*len] = 0;
    return 0;
}

void strbuf_add(strbuf *b, const void *s, size_t n)
{
    if (!b->oom && buf_append(&b->p, &b->len, &b->cap, s, n, 256))
        b->oom = true;
}

void strbuf_printf(strbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
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
        strbuf_add(b, small, (size_t)n);
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
    strbuf_add(b, big, (size_t)n);
    free(big);
}

void strbuf_free(strbuf *b)
{
    free(b->p);
    *b = (strbuf){0};
}
