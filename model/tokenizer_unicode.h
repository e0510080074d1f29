/*
 * model/tokenizer_unicode — private to the tokenizer: the Unicode character classes used by the
 * pre-tokenizer scanners. The table lives in the generated model/tokenizer_unicode.c
 * (tools/gen_unicode_tables.py).
 */
#ifndef OROCHI_TOKENIZER_UNICODE_H
#define OROCHI_TOKENIZER_UNICODE_H

#include <stddef.h>
#include <stdint.h>

enum {
    TOKENIZER_CLASS_OTHER = 0,
    TOKENIZER_CLASS_LETTER = 1, /* \p{L} */
    TOKENIZER_CLASS_NUMBER = 2, /* \p{N} */
    TOKENIZER_CLASS_SPACE = 3,  /* White_Space (\s) */
};

/* The class of code point cp (any value; out-of-range values are OTHER). */
int tokenizer_unicode_class(uint32_t cp);

#endif
