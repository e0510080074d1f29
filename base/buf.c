/*
 * base/buf.c — growing arrays and byte buffers (interface: buf.h).
 */
#include "base/buf.h"

#include <stdint.h>
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
