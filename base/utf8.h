/*
 * base/utf8 — the UTF-8 rules shared by everything that streams or cleans text: where a stream can
 * be cut without splitting a character, how long a valid character is, a character decoded and
 * encoded, and a cleaned copy.
 */
#ifndef OROCHI_UTF8_H
#define OROCHI_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the longest prefix of s[0..n) that does not end inside a UTF-8 character which the
 * next bytes could still complete (a lead byte C2..F4 without all its continuation bytes yet).
 * Bytes that can never become a character are not held back. */
size_t utf8_complete(const unsigned char *s, size_t n);

/* Length of the valid UTF-8 character at s[0..n) (1..4: shortest form, no surrogate, at most
 * U+10FFFF), or 0 when the bytes there are not one. */
size_t utf8_char(const unsigned char *s, size_t n);

/* utf8_char, with the character's code point in *cp when there is one. */
size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* Writes code point cp (at most U+10FFFF) as UTF-8 into out (room for 4); returns its length. */
size_t utf8_put(uint32_t cp, char *out);

/* A NUL-terminated copy of s[0..n) as valid UTF-8: each byte that starts no valid character
 * becomes U+FFFD, NULs are dropped. NULL when out of memory. */
char *utf8_clean(const char *s, size_t n);

#endif
