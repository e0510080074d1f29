/*
 * tests/fuzz/fuzz_common.h — what the libFuzzer targets share: reporting a broken invariant, the
 * "one-line error" check, a UTF-8 validator written independently of the code under test, and a
 * builder of small in-memory GGUF files (metadata only) from which the tokenizer targets make their
 * vocabularies.
 *
 * Header-only (static functions): each target is its own program, and some of them #include the
 * .c file they fuzz, so a shared library of helpers would only add link-order trouble.
 */
#ifndef OROCHI_FUZZ_COMMON_H
#define OROCHI_FUZZ_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Where invariant reports go: stderr, or a copy of it saved before libFuzzer's -close_fd_mask
 * closes fd 2 (targets whose code under test logs a line per input use that flag). */
static int fuzz_report_fd = 2;

/* A broken invariant: say which, then abort so that libFuzzer records the input as a crash. */
__attribute__((format(printf, 1, 2), noreturn, unused)) static void fuzz_fail(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n > sizeof msg - 2)
        n = (int)sizeof msg - 2;
    msg[n++] = '\n';
    ssize_t w = write(fuzz_report_fd, "fuzz: invariant broken: ", 24);
    w = write(fuzz_report_fd, msg, (size_t)n);
    (void)w;
    abort();
}

/* An error message as the project writes them: non-empty, one line, NUL-terminated in its buffer.
 */
static inline void fuzz_check_err(const char *what, const char *err, size_t cap)
{
    if (!memchr(err, '\0', cap))
        fuzz_fail("%s: error message not NUL-terminated", what);
    if (!err[0])
        fuzz_fail("%s: failed with an empty error message", what);
    if (strchr(err, '\n') || strchr(err, '\r'))
        fuzz_fail("%s: error message is not one line: %.200s", what, err);
}

/* Length of the well-formed UTF-8 character at s (1..4), 0 if s[0..n) does not start with one
 * (overlongs, surrogates and code points past U+10FFFF are not well-formed). */
static inline size_t fuzz_utf8_char(const uint8_t *s, size_t n)
{
    if (n == 0)
        return 0;
    uint8_t c = s[0];
    if (c < 0x80)
        return 1;
    size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (!len || len > n || c > 0xF4)
        return 0;
    uint32_t cp = c & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

static inline bool fuzz_utf8_valid(const void *p, size_t n)
{
    const uint8_t *s = p;
    for (size_t i = 0; i < n;) {
        size_t l = fuzz_utf8_char(s + i, n - i);
        if (!l)
            return false;
        i += l;
    }
    return true;
}

/* A malloc'd NUL-terminated copy of p[0..n). */
static inline char *fuzz_strndup(const void *p, size_t n)
{
    char *s = malloc(n + 1);
    if (!s)
        abort();
    if (n)
        memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

/* ---- an in-memory GGUF v3 file with metadata only ------------------------------------------ */

typedef struct {
    uint8_t *p;
    size_t len, cap;
    uint64_t n_kv;
} fuzz_gguf;

static inline void fuzz_gguf_put(fuzz_gguf *g, const void *src, size_t n)
{
    if (g->len + n > g->cap) {
        size_t cap = g->cap ? g->cap : 4096;
        while (cap < g->len + n)
            cap *= 2;
        uint8_t *p = realloc(g->p, cap);
        if (!p)
            abort();
        g->p = p;
        g->cap = cap;
    }
    if (n)
        memcpy(g->p + g->len, src, n);
    g->len += n;
}

static inline void fuzz_gguf_u32(fuzz_gguf *g, uint32_t v)
{
    fuzz_gguf_put(g, &v, 4);
}
static inline void fuzz_gguf_u64(fuzz_gguf *g, uint64_t v)
{
    fuzz_gguf_put(g, &v, 8);
}

static inline void fuzz_gguf_str(fuzz_gguf *g, const void *s, size_t n)
{
    fuzz_gguf_u64(g, n);
    fuzz_gguf_put(g, s, n);
}

/* "GGUF", version 3, no tensors; the kv count is patched by fuzz_gguf_finish. */
static inline void fuzz_gguf_begin(fuzz_gguf *g)
{
    *g = (fuzz_gguf){0};
    fuzz_gguf_put(g, "GGUF", 4);
    fuzz_gguf_u32(g, 3);
    fuzz_gguf_u64(g, 0);
    fuzz_gguf_u64(g, 0);
}

static inline void fuzz_gguf_key(fuzz_gguf *g, const char *key, uint32_t type)
{
    fuzz_gguf_str(g, key, strlen(key));
    fuzz_gguf_u32(g, type);
    g->n_kv++;
}

enum {
    FUZZ_GGUF_U32 = 4,
    FUZZ_GGUF_I32 = 5,
    FUZZ_GGUF_F32 = 6,
    FUZZ_GGUF_BOOL = 7,
    FUZZ_GGUF_STR = 8,
    FUZZ_GGUF_ARR = 9
};

static inline void fuzz_gguf_kv_str(fuzz_gguf *g, const char *key, const void *s, size_t n)
{
    fuzz_gguf_key(g, key, FUZZ_GGUF_STR);
    fuzz_gguf_str(g, s, n);
}

static inline void fuzz_gguf_kv_u32(fuzz_gguf *g, const char *key, uint32_t v)
{
    fuzz_gguf_key(g, key, FUZZ_GGUF_U32);
    fuzz_gguf_u32(g, v);
}

static inline void fuzz_gguf_kv_bool(fuzz_gguf *g, const char *key, bool v)
{
    fuzz_gguf_key(g, key, FUZZ_GGUF_BOOL);
    uint8_t b = v;
    fuzz_gguf_put(g, &b, 1);
}

/* An array of n strings: strs[i] of lens[i] bytes. */
static inline void fuzz_gguf_kv_strs(fuzz_gguf *g, const char *key, const char *const *strs,
                                     const size_t *lens, size_t n)
{
    fuzz_gguf_key(g, key, FUZZ_GGUF_ARR);
    fuzz_gguf_u32(g, FUZZ_GGUF_STR);
    fuzz_gguf_u64(g, n);
    for (size_t i = 0; i < n; i++)
        fuzz_gguf_str(g, strs[i], lens[i]);
}

/* An array of n 4-byte scalars of `elem` type (I32 or F32). */
static inline void fuzz_gguf_kv_arr4(fuzz_gguf *g, const char *key, uint32_t elem, const void *v,
                                     size_t n)
{
    fuzz_gguf_key(g, key, FUZZ_GGUF_ARR);
    fuzz_gguf_u32(g, elem);
    fuzz_gguf_u64(g, n);
    fuzz_gguf_put(g, v, 4 * n);
}

/* Patch the kv count and pad to the default alignment (32) so the (empty) data section starts
 * inside the file. */
static inline void fuzz_gguf_finish(fuzz_gguf *g)
{
    memcpy(g->p + 16, &g->n_kv, 8);
    static const uint8_t zero[32];
    fuzz_gguf_put(g, zero, (32 - g->len % 32) % 32);
}

/* ---- vocabularies --------------------------------------------------------------------------- */

/* GPT-2's byte -> printable code point map (bytes 33..126, 161..172, 174..255 are themselves; the
 * others, in order, become U+0100 + k), written as UTF-8 into out (<= 2 bytes + NUL). */
static inline void fuzz_gpt2_byte_char(int b, char out[4])
{
    int cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
        int k = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)))
                k++;
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

/* A list of tokens under construction: text, type, score. */
typedef struct {
    char **text;
    size_t *len;
    int32_t *type;
    float *score;
    size_t n, cap;
} fuzz_vocab;

static inline void fuzz_vocab_add(fuzz_vocab *v, const void *s, size_t n, int32_t type, float score)
{
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 512;
        v->text = realloc(v->text, v->cap * sizeof *v->text);
        v->len = realloc(v->len, v->cap * sizeof *v->len);
        v->type = realloc(v->type, v->cap * sizeof *v->type);
        v->score = realloc(v->score, v->cap * sizeof *v->score);
        if (!v->text || !v->len || !v->type || !v->score)
            abort();
    }
    v->text[v->n] = fuzz_strndup(s, n);
    v->len[v->n] = n;
    v->type[v->n] = type;
    v->score[v->n] = score;
    v->n++;
}

static inline void fuzz_vocab_free(fuzz_vocab *v)
{
    for (size_t i = 0; i < v->n; i++)
        free(v->text[i]);
    free(v->text);
    free(v->len);
    free(v->type);
    free(v->score);
    *v = (fuzz_vocab){0};
}

/* The tokenizer.* keys of a vocabulary into g. model: "gpt2" or "llama"; merges (gpt2 only) may
 * be NULL; pre may be NULL. */
static inline void fuzz_gguf_vocab(fuzz_gguf *g, const char *model, const char *pre,
                                   const fuzz_vocab *v, const char *const *merges,
                                   const size_t *merge_lens, size_t n_merges)
{
    fuzz_gguf_kv_str(g, "tokenizer.ggml.model", model, strlen(model));
    if (pre)
        fuzz_gguf_kv_str(g, "tokenizer.ggml.pre", pre, strlen(pre));
    fuzz_gguf_kv_strs(g, "tokenizer.ggml.tokens", (const char *const *)v->text, v->len, v->n);
    fuzz_gguf_kv_arr4(g, "tokenizer.ggml.token_type", FUZZ_GGUF_I32, v->type, v->n);
    if (!strcmp(model, "llama"))
        fuzz_gguf_kv_arr4(g, "tokenizer.ggml.scores", FUZZ_GGUF_F32, v->score, v->n);
    if (merges)
        fuzz_gguf_kv_strs(g, "tokenizer.ggml.merges", merges, merge_lens, n_merges);
}

#endif
