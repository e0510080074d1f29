/*
 * tests/fuzz/fuzz_vocab.h — the small vocabularies the tokenizer and chat-template targets build
 * their tokenizers from (through a real in-memory GGUF file and tokenizer_new, so the metadata
 * path is the one a model file takes).
 *
 * Both cover every byte, so decode(encode(s)) == s is a fair demand on them:
 *  - byte-level BPE ("gpt2"): three control tokens (<|endoftext|>, <|im_start|>, <|im_end|>), a
 *    user-defined one (<tool>), the 256 byte chars, and merges that build English pieces, runs of
 *    spaces/newlines, digits, a two-byte char (é) and pieces of the special tokens' own text; one
 *    merge names a missing result and one a missing part (both must be ignored), and one token
 *    string is duplicated (the first id wins).
 *  - SentencePiece-style ("llama"): <unk>, <s>, </s>, the 256 <0xXX> byte tokens, and scored pieces
 *    (▁, ▁the, ▁and, CJK, an emoji, ...), one unused (type 5) token; with and without the space
 *    prefix.
 */
#ifndef OROCHI_FUZZ_VOCAB_H
#define OROCHI_FUZZ_VOCAB_H

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tests/fuzz/fuzz_common.h"

enum {
    FUZZ_VOCAB_BPE_GPT2,
    FUZZ_VOCAB_BPE_SMOLLM,
    FUZZ_VOCAB_BPE_LLAMA3,
    FUZZ_VOCAB_SPM,
    FUZZ_VOCAB_SPM_NOPREFIX,
    FUZZ_VOCAB_COUNT
};

/* "a b" merge in GPT-2 char form from two byte strings. */
static inline void fuzz_bpe_merge(char ***merges, size_t **lens, size_t *n, const char *a,
                                  const char *b, fuzz_vocab *v, bool add_result)
{
    char buf[256];
    size_t m = 0;
    for (int half = 0; half < 2; half++) {
        const char *s = half ? b : a;
        if (half)
            buf[m++] = ' ';
        for (; *s; s++) {
            char c[4];
            fuzz_gpt2_byte_char((uint8_t)*s, c);
            size_t l = strlen(c);
            memcpy(buf + m, c, l);
            m += l;
        }
    }
    *merges = realloc(*merges, (*n + 1) * sizeof **merges);
    *lens = realloc(*lens, (*n + 1) * sizeof **lens);
    if (!*merges || !*lens)
        abort();
    (*merges)[*n] = fuzz_strndup(buf, m);
    (*lens)[*n] = m;
    (*n)++;
    if (add_result) {
        /* the merged token: both halves without the space */
        char tok[256];
        const char *sp = memchr(buf, ' ', m);
        size_t la = (size_t)(sp - buf);
        memcpy(tok, buf, la);
        memcpy(tok + la, sp + 1, m - la - 1);
        fuzz_vocab_add(v, tok, m - 1, 1, 0.0f);
    }
}

/* The GGUF bytes of fixture `which` but the template and the final padding (fuzz_gguf_finish
 * not called yet). */
static inline void fuzz_vocab_gguf_base(fuzz_gguf *g, int which)
{
    fuzz_vocab v = {0};
    char **merges = NULL;
    size_t *mlens = NULL, n_merges = 0;
    bool bpe = which <= FUZZ_VOCAB_BPE_LLAMA3;
    if (bpe) {
        fuzz_vocab_add(&v, "<|endoftext|>", 13, 3, 0);
        fuzz_vocab_add(&v, "<|im_start|>", 12, 3, 0);
        fuzz_vocab_add(&v, "<|im_end|>", 10, 3, 0);
        fuzz_vocab_add(&v, "<tool>", 6, 4, 0);
        for (int b = 0; b < 256; b++) {
            char c[4];
            fuzz_gpt2_byte_char(b, c);
            fuzz_vocab_add(&v, c, strlen(c), 1, 0);
        }
        static const char *const pairs[][2] = {
            {" ", "t"},
            {"h", "e"},
            {" t", "he"},
            {"i", "n"},
            {" ", "a"},
            {"e", "r"},
            {"o", "n"},
            {" ", " "},
            {"  ", "  "},
            {"\n", "\n"},
            {"r", "e"},
            {" ", "s"},
            {" a", "n"},
            {" an", "d"},
            {"1", "2"},
            {"12", "3"},
            {"\xC3", "\xA9"},
            {" ", "\xC3\xA9"},
            {"<", "|"},
            {"<|", "im"},
            {"_", "start"},
            {"s", "t"},
            {"st", "art"},
            {"a", "r"},
            {"ar", "t"},
            {"i", "m"},
            {"|", ">"},
            {"'", "s"},
            {"\xE2\x80", "\x99"},
            {"\xE2", "\x80"},
            {"\xF0\x9F", "\x99\x82"},
            {"\xF0", "\x9F"},
            {"\x99", "\x82"},
            {"\r", "\n"},
            {"\t", "\t"},
        };
        for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
            fuzz_bpe_merge(&merges, &mlens, &n_merges, pairs[i][0], pairs[i][1], &v, true);
        /* ignored: the result "xq" and the part "qqq" are not tokens */
        fuzz_bpe_merge(&merges, &mlens, &n_merges, "x", "q", &v, false);
        fuzz_bpe_merge(&merges, &mlens, &n_merges, "qqq", "x", &v, false);
        fuzz_vocab_add(&v, "he", 2, 1, 0); /* duplicate of the merged "he": the first id wins */
    } else {
        fuzz_vocab_add(&v, "<unk>", 5, 2, 0);
        fuzz_vocab_add(&v, "<s>", 3, 3, 0);
        fuzz_vocab_add(&v, "</s>", 4, 3, 0);
        for (int b = 0; b < 256; b++) {
            char t[8];
            snprintf(t, sizeof t, "<0x%02X>", b);
            fuzz_vocab_add(&v, t, 6, 6, 0);
        }
        static const char *const pieces[] = {
            "\xE2\x96\x81",
            "\xE2\x96\x81t",
            "he",
            "\xE2\x96\x81the",
            "\xE2\x96\x81"
            "a",
            "an",
            "\xE2\x96\x81"
            "an",
            "d",
            "\xE2\x96\x81"
            "and",
            "in",
            "er",
            "\xE2\x96\x81\xE2\x96\x81",
            "\xC3\xA9",
            "\xE2\x96\x81\xC3\xA9",
            "12",
            "1",
            "2",
            "t",
            "h",
            "e",
            "a",
            "n",
            "i",
            "r",
            "s",
            "\xE2\x96\x81s",
            "\xE6\x97\xA5\xE6\x9C\xAC",
            "\xE6\x97\xA5",
            "\xE6\x9C\xAC",
            "\xF0\x9F\x99\x82",
            "<",
            ">",
            "s>",
            "<s",
            "\n",
            "\xE2\x96\x81\n",
        };
        for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++)
            fuzz_vocab_add(&v, pieces[i], strlen(pieces[i]), 1, -(float)i * 0.5f);
        fuzz_vocab_add(&v, "zz", 2, 5, 10.0f); /* unused: never merged even with a high score */
        fuzz_vocab_add(&v, "he", 2, 3, 0);     /* a control duplicate: the normal "he" wins */
    }
    static const char *const pre[] = {"gpt2", "smollm", "llama3"};
    fuzz_gguf_begin(g);
    fuzz_gguf_kv_str(g, "general.architecture", "llama", 5);
    fuzz_gguf_vocab(g, bpe ? "gpt2" : "llama", bpe ? pre[which] : NULL, &v,
                    (const char *const *)merges, mlens, n_merges);
    fuzz_gguf_kv_u32(g, "tokenizer.ggml.bos_token_id", bpe ? 0 : 1);
    fuzz_gguf_kv_u32(g, "tokenizer.ggml.eos_token_id", bpe ? 0 : 2);
    if (!bpe) {
        fuzz_gguf_kv_u32(g, "tokenizer.ggml.unknown_token_id", 0);
        fuzz_gguf_kv_bool(g, "tokenizer.ggml.add_space_prefix", which == FUZZ_VOCAB_SPM);
    }
    for (size_t i = 0; i < n_merges; i++)
        free(merges[i]);
    free(merges);
    free(mlens);
    fuzz_vocab_free(&v);
}

/* The GGUF bytes of fixture `which`, with an optional chat template (tlen bytes; tmpl NULL: no
 * tokenizer.chat_template key). Free g->p when done. The fixture's vocabulary is built once. */
static inline void fuzz_vocab_gguf(fuzz_gguf *g, int which, const void *tmpl, size_t tlen)
{
    static fuzz_gguf base[FUZZ_VOCAB_COUNT];
    if (!base[which].p)
        fuzz_vocab_gguf_base(&base[which], which);
    *g = (fuzz_gguf){0};
    fuzz_gguf_put(g, base[which].p, base[which].len);
    g->n_kv = base[which].n_kv;
    if (tmpl)
        fuzz_gguf_kv_str(g, "tokenizer.chat_template", tmpl, tlen);
    fuzz_gguf_finish(g);
}

/* A tokenizer for fixture `which` built through gguf_open_memory + tokenizer_new. The GGUF bytes
 * and the gguf_file are freed before returning: the tokenizer must own everything it keeps (ASan
 * reports a use after free otherwise). Aborts if the fixture is refused. */
static inline tokenizer *fuzz_vocab_tokenizer(int which, const void *tmpl, size_t tlen)
{
    fuzz_gguf g;
    fuzz_vocab_gguf(&g, which, tmpl, tlen);
    char err[256];
    gguf_file *f = gguf_open_memory(g.p, g.len, "fuzz-vocab", err, sizeof err);
    if (!f)
        fuzz_fail("fixture %d: gguf_open_memory: %s", which, err);
    tokenizer *tok = tokenizer_new(f, err, sizeof err);
    if (!tok)
        fuzz_fail("fixture %d: tokenizer_new: %s", which, err);
    gguf_close(&f);
    free(g.p);
    return tok;
}

#endif
