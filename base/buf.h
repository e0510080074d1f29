/*
 * base/buf — growing an array, and appending to a NUL-terminated byte buffer: the one way every
 * floor above grows its buffers (HTTP bodies, generated text, rendered templates, token lists).
 */
#ifndef OROCHI_BUF_H
#define OROCHI_BUF_H

#include <stdbool.h>
#include <stddef.h>

/* Make room for `need` elements of `size` bytes in *p, whose capacity is *cap elements: the
 * capacity doubles from `first` (or from *cap) until it holds `need`. Returns 0, or -1 when out of
 * memory or the size overflows (*p and *cap unchanged then). */
int buf_grow(void **p, size_t *cap, size_t need, size_t size, size_t first);

/* Append s[0..n) to the byte buffer (*p, *len, *cap), which stays NUL-terminated (*cap counts the
 * NUL's byte; the first allocation holds at least `first` bytes). Returns 0, or -1 when out of
 * memory (the buffer unchanged). */
int buf_append(char **p, size_t *len, size_t *cap, const void *s, size_t n, size_t first);

/* A growing NUL-terminated byte buffer whose `oom` sticks once an allocation failed (later
 * appends do nothing), so a sequence of appends is checked once at its end. */
typedef struct {
    char *p;
    size_t len, cap;
    bool oom;
} strbuf;

void strbuf_add(strbuf *b, const void *s, size_t n);
void strbuf_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void strbuf_free(strbuf *b);

#endif
