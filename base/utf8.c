/*
 * base/utf8.c — UTF-8 completeness, validity, decoding, encoding and cleaning (interface: utf8.h).
 */
#include "base/utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

size_t utf8_complete(const unsigned char *s, size_t n)
{
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned char c = s[n - back];
        if ((c & 0xC0) == 0x80)
            continue; /* continuation byte: keep looking for the lead */
        size_t need = c >= 0xF0 && c <= 0xF4   ? 4
                      : c >= 0xE0 && c <= 0xEF ? 3
                      : c >= 0xC2 && c < 0xE0  ? 2
                                               : 1;
        return need > back ? n - back : n;
    }
    return n;
}

size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
    if (!n)
        return 0;
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2, v = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, v = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, v = c & 0x07, min = 0x10000;
    else
        return 0;
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return len;
}

size_t utf8_char(const unsigned char *s, size_t n)
{
    uint32_t cp;
    return utf8_decode(s, n, &cp);
}

size_t utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    size_t len = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    for (size_t i = len - 1; i > 0; i--, cp >>= 6)
        out[i] = (char)(0x80 | (cp & 0x3F));
    out[0] = (char)((len == 2 ? 0xC0 : len == 3 ? 0xE0 : 0xF0) | cp);
    return len;
}

char *utf8_clean(const char *s, size_t n)
{
    if (n > (SIZE_MAX - 1) / 3)
        return NULL;
    char *out = malloc(n * 3 + 1);
    if (!out)
        return NULL;
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t len = utf8_char(u + i, n - i);
        if (!len) {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        } else {
            if (u[i])
                memcpy(out + o, s + i, len), o += len;
            i += len;
        }
    }
    out[o] = 0;
    return out;
}
