/*
 * tests/fuzz/fuzz_tokenizer — libFuzzer target for the tokenizer (model/tokenizer.c): encode
 * arbitrary bytes, then decode.
 *
 * Input: byte 0 picks the vocabulary and the mode, the rest is the text.
 *   bits 0-2  0 byte-level BPE with the GPT-2 pre-tokenizer, 1 ... "smollm", 2 ... "llama3",
 *             3 SentencePiece-style, 4 ... without the space prefix (tests/fuzz/fuzz_vocab.h),
 *             5 a vocabulary read from the input itself (below), 6-7 the tokenizer of the GGUF
 *             named by $OROCHI_FUZZ_VOCAB when set (e.g. the default model), else fixtures 0/3
 *   bit 3     parse_special
 *   bit 4     (vocabulary from the input) "gpt2" if set, else "llama"
 *   bit 5     (vocabulary from the input) add the 256 byte tokens first
 * Vocabulary from the input: the bytes up to the first NUL are its tokens, one per line ('<...>'
 * lines are control tokens, '<0xHH>' lines byte tokens); for "gpt2" every line with a space
 * after its first byte is also a merge, and a line '=X' is the merge X only. The text follows the
 * NUL. tokenizer_new may refuse such a vocabulary, with a one-line error.
 *
 * Checked on every input: the capacity protocol of tokenizer_encode (a NULL/0 probe returns the
 * exact count, a buffer one short gets -1 and is not written past — ASan watches an exact-size
 * heap buffer); every id is in [0, vocab); decode of the ids equals the concatenation of
 * tokenizer_piece (less the SentencePiece space-prefix rule) and follows its capacity protocol;
 * decoding arbitrary ids (the input's bytes read as int32) stays in bounds, unknown ids adding
 * nothing. On the fixtures, which have a token for every byte, also:
 *   - decode(encode(s)) == s for every input (byte-level BPE: all bytes; SentencePiece: any text
 *     without a literal U+2581, which it reads as a space by design);
 *   - the special ids in the output are exactly the leftmost-longest matches of the special
 *     tokens' strings in the text when parse_special is set, and absent otherwise;
 *   - at most one token per byte (BPE) or per byte plus one (SentencePiece's space prefix): the
 *     coordinator sizes its prompt buffer as strlen + 8 (coordinator/coord_slots.c engine_slot_start).
 * With $OROCHI_FUZZ_VOCAB a byte-level BPE vocabulary must round-trip every text whose bytes all
 * have a token.
 *
 * Build and run: `make fuzz`, then tests/fuzz/run_fuzz.sh (seeds: tests/fuzz/corpus/tokenizer/).
 */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_vocab.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Built once: the fixtures, and the optional real vocabulary. Read-only afterwards. */
static tokenizer *fz_fixture[FUZZ_VOCAB_COUNT];
static tokenizer *fz_real;
static bool fz_real_bpe, fz_real_strip; /* byte-level BPE; SentencePiece with the space prefix */
static bool fz_real_byte[256];          /* the real vocabulary has a token for this byte */

/* The special strings of each fixture, by id (see fuzz_vocab.h). */
typedef struct {
    const char *text;
    int32_t id;
} fz_special;
static fz_special fz_specials[FUZZ_VOCAB_COUNT][4];
static int fz_n_specials[FUZZ_VOCAB_COUNT];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    for (int v = 0; v < FUZZ_VOCAB_COUNT; v++) {
        fz_fixture[v] = fuzz_vocab_tokenizer(v, NULL, 0);
        const tokenizer *tok = fz_fixture[v];
        for (int32_t id = 0; id < tokenizer_vocab_size(tok); id++)
            if (tokenizer_is_special(tok, id)) {
                if (fz_n_specials[v] == 4)
                    fuzz_fail("fixture %d has more special tokens than expected", v);
                fz_specials[v][fz_n_specials[v]++] =
                    (fz_special){tokenizer_token_text(tok, id), id};
            }
    }
    const char *path = getenv("OROCHI_FUZZ_VOCAB");
    if (path && *path) {
        char err[512];
        gguf_file *f = gguf_open(path, err, sizeof err);
        if (!f)
            fuzz_fail("OROCHI_FUZZ_VOCAB: %s", err);
        gguf_str model;
        fz_real_bpe = gguf_get_str(f, "tokenizer.ggml.model", &model) && gguf_str_eq(model, "gpt2");
        bool prefix = true;
        if (gguf_find(f, "tokenizer.ggml.add_space_prefix"))
            gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &prefix);
        fz_real_strip = !fz_real_bpe && prefix;
        fz_real = tokenizer_new(f, err, sizeof err);
        if (!fz_real)
            fuzz_fail("OROCHI_FUZZ_VOCAB: %s", err);
        gguf_close(&f);
        for (int b = 0; b < 256; b++) {
            char c = (char)b;
            int needed = 0;
            tokenizer_encode(fz_real, &c, 1, false, NULL, 0, &needed);
            fz_real_byte[b] = needed > 0;
        }
    }
    return 0;
}

/* A tokenizer from the "lines up to NUL" description; NULL if tokenizer_new refuses it (then the
 * error must be one line). *text / *len get the rest of the input. */
static tokenizer *fz_input_vocab(uint8_t mode, const uint8_t *p, size_t n, const uint8_t **text,
                                 size_t *len)
{
    const uint8_t *nul = memchr(p, 0, n);
    size_t vlen = nul ? (size_t)(nul - p) : n;
    *text = nul ? nul + 1 : p + n;
    *len = nul ? n - vlen - 1 : 0;
    bool gpt2 = mode & 0x10;
    fuzz_vocab v = {0}, extra = {0}; /* extra: merge strings that are not tokens */
    if (mode & 0x20)
        for (int b = 0; b < 256; b++) {
            char t[8];
            if (gpt2)
                fuzz_gpt2_byte_char(b, t);
            else
                snprintf(t, sizeof t, "<0x%02X>", b);
            fuzz_vocab_add(&v, t, strlen(t), gpt2 ? 1 : 6, 0);
        }
    const char **merges = NULL;
    size_t *mlens = NULL, n_merges = 0;
    for (size_t s = 0; s < vlen;) {
        const uint8_t *e = memchr(p + s, '\n', vlen - s);
        size_t l = e ? (size_t)(e - (p + s)) : vlen - s;
        const char *t = (const char *)p + s;
        if (gpt2 && l > 0 && t[0] == '=') {
            /* '=' lines are merges only, taken as written (a merge need not hold a space) */
            merges = realloc(merges, (n_merges + 1) * sizeof *merges);
            mlens = realloc(mlens, (n_merges + 1) * sizeof *mlens);
            if (!merges || !mlens)
                abort();
            fuzz_vocab_add(&extra, t + 1, l - 1, 0, 0);
            merges[n_merges] = extra.text[extra.n - 1];
            mlens[n_merges++] = l - 1;
            s += l + 1;
            continue;
        }
        int32_t type = 1;
        if (l == 6 && !memcmp(t, "<0x", 3) && t[5] == '>')
            type = 6;
        else if (l > 2 && t[0] == '<' && t[l - 1] == '>')
            type = 3;
        fuzz_vocab_add(&v, t, l, type, -0.25f * (float)v.n);
        if (gpt2 && l > 1 && memchr(t + 1, ' ', l - 1)) {
            merges = realloc(merges, (n_merges + 1) * sizeof *merges);
            mlens = realloc(mlens, (n_merges + 1) * sizeof *mlens);
            if (!merges || !mlens)
                abort();
            merges[n_merges] = v.text[v.n - 1];
            mlens[n_merges++] = l;
        }
        s += l + 1;
    }
    if (v.n == 0)
        fuzz_vocab_add(&v, "a", 1, 1, 0);
    fuzz_gguf g;
    fuzz_gguf_begin(&g);
    fuzz_gguf_vocab(&g, gpt2 ? "gpt2" : "llama", "llama3", &v, gpt2 ? merges : NULL, mlens,
                    n_merges);
    fuzz_gguf_finish(&g);
    char err[256];
    gguf_file *f = gguf_open_memory(g.p, g.len, "fuzz-input-vocab", err, sizeof err);
    if (!f)
        fuzz_fail("input vocabulary: gguf_open_memory refused a well-formed file: %s", err);
    tokenizer *tok = tokenizer_new(f, err, sizeof err);
    /* strings from the file are quoted escaped: the error is one line whatever a merge holds */
    if (!tok)
        fuzz_check_err("tokenizer_new", err, sizeof err);
    gguf_close(&f);
    free(g.p);
    free(merges);
    free(mlens);
    fuzz_vocab_free(&v);
    fuzz_vocab_free(&extra);
    return tok;
}

/* Encode with the capacity protocol checked; returns malloc'd ids (never NULL) and *n. */
static int32_t *fz_encode(const tokenizer *tok, const uint8_t *text, size_t len, bool special,
                          int *n)
{
    int needed = -2;
    int r = tokenizer_encode(tok, (const char *)text, len, special, NULL, 0, &needed);
    if (needed < 0)
        fuzz_fail("encode of %zu bytes: needed = %d", len, needed);
    if (r != (needed == 0 ? 0 : -1))
        fuzz_fail("encode probe: returned %d with needed = %d", r, needed);
    int32_t *ids = malloc(((size_t)needed + 1) * sizeof *ids);
    if (!ids)
        abort();
    if (needed > 0) {
        /* one short: -1, and nothing written (an exact-size buffer, so ASan sees any write) */
        int32_t *shorter = malloc((size_t)needed * sizeof *shorter);
        int again = -2;
        if (!shorter)
            abort();
        r = tokenizer_encode(tok, (const char *)text, len, special, shorter, needed - 1, &again);
        if (r != -1 || again != needed)
            fuzz_fail("encode with cap %d (needs %d): returned %d, needed %d", needed - 1, needed,
                      r, again);
        free(shorter);
    }
    int again = -2;
    r = tokenizer_encode(tok, (const char *)text, len, special, ids, needed, &again);
    if (r != needed || again != needed)
        fuzz_fail("encode with cap %d: returned %d, needed %d (probe said %d)", needed, r, again,
                  needed);
    for (int i = 0; i < needed; i++)
        if (ids[i] < 0 || ids[i] >= tokenizer_vocab_size(tok))
            fuzz_fail("encode: id %d at %d is outside the vocabulary of %d", ids[i], i,
                      tokenizer_vocab_size(tok));
    *n = needed;
    return ids;
}

/* Decode with its capacity protocol checked; returns the malloc'd text and *m. */
static char *fz_decode(const tokenizer *tok, const int32_t *ids, int n, long *m)
{
    /* an upper bound: the sum of the pieces */
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        const char *p;
        total += tokenizer_piece(tok, ids[i], &p);
    }
    char *out = malloc(total + 1);
    if (!out)
        abort();
    long r = tokenizer_decode(tok, ids, n, out, total + 1);
    if (r < 0 || (size_t)r > total || out[r] != '\0')
        fuzz_fail("decode of %d ids into %zu bytes: returned %ld", n, total + 1, r);
    /* an exact-size buffer is enough, one byte less is not */
    char *exact = malloc((size_t)r + 1);
    if (!exact)
        abort();
    if (tokenizer_decode(tok, ids, n, exact, (size_t)r + 1) != r || memcmp(exact, out, (size_t)r))
        fuzz_fail("decode into exactly %ld + 1 bytes differs", r);
    if (tokenizer_decode(tok, ids, n, exact, (size_t)r) != -1)
        fuzz_fail("decode into %ld bytes (needs %ld + 1) did not return -1", r, r);
    free(exact);
    *m = r;
    return out;
}

/* decode == the pieces concatenated, except that with SentencePiece's space prefix (`strip`) the
 * first ordinary piece after the start or a special token loses its leading space. */
static void fz_check_pieces(const tokenizer *tok, bool strip, const int32_t *ids, int n,
                            const char *out, long m)
{
    size_t at = 0;
    bool after_special = true;
    for (int i = 0; i < n; i++) {
        const char *p;
        size_t len = tokenizer_piece(tok, ids[i], &p);
        bool special = tokenizer_is_special(tok, ids[i]);
        if (strip && after_special && !special && len > 0 && p[0] == ' ') {
            p++;
            len--;
        }
        after_special = special;
        if (at + len > (size_t)m || memcmp(out + at, p, len) != 0)
            fuzz_fail("decode: piece %d (id %d) not found at byte %zu of the output", i, ids[i],
                      at);
        at += len;
    }
    if (at != (size_t)m)
        fuzz_fail("decode: %ld bytes out, pieces account for %zu", m, at);
}

/* The special ids the text must yield: leftmost-longest matches of the fixture's specials. */
static void fz_check_specials(int v, const uint8_t *text, size_t len, bool parse_special,
                              const tokenizer *tok, const int32_t *ids, int n)
{
    if (!parse_special) {
        for (int i = 0; i < n; i++)
            if (tokenizer_is_special(tok, ids[i]))
                fuzz_fail("special id %d at %d in the output without parse_special", ids[i], i);
        return;
    }
    int at_out = 0;
    for (size_t i = 0; i < len;) {
        int best = -1;
        size_t best_len = 0;
        for (int s = 0; s < fz_n_specials[v]; s++) {
            size_t l = strlen(fz_specials[v][s].text);
            if (l <= len - i && l > best_len && !memcmp(text + i, fz_specials[v][s].text, l)) {
                best = s;
                best_len = l;
            }
        }
        if (best < 0) {
            i++;
            continue;
        }
        while (at_out < n && !tokenizer_is_special(tok, ids[at_out]))
            at_out++;
        if (at_out == n || ids[at_out] != fz_specials[v][best].id)
            fuzz_fail("special '%s' at byte %zu: output has %d there", fz_specials[v][best].text, i,
                      at_out < n ? ids[at_out] : -1);
        at_out++;
        i += best_len;
    }
    while (at_out < n && !tokenizer_is_special(tok, ids[at_out]))
        at_out++;
    if (at_out != n)
        fuzz_fail("special id %d in the output matches no special string", ids[at_out]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    int v = mode & 7;
    bool special = mode & 8;
    const uint8_t *text = data + 1;
    size_t len = size - 1;
    tokenizer *own = NULL;
    const tokenizer *tok;
    bool fixture = false, real = false, strip;
    if (v == 5) {
        own = fz_input_vocab(mode, data + 1, size - 1, &text, &len);
        if (!own)
            return 0;
        tok = own;
        strip = !(mode & 0x10);
    } else if (v >= 6) {
        real = fz_real != NULL;
        tok = real ? fz_real : fz_fixture[v == 6 ? FUZZ_VOCAB_BPE_GPT2 : FUZZ_VOCAB_SPM];
        fixture = !real;
        if (!real)
            v = v == 6 ? FUZZ_VOCAB_BPE_GPT2 : FUZZ_VOCAB_SPM;
        strip = real ? fz_real_strip : v == FUZZ_VOCAB_SPM;
    } else {
        tok = fz_fixture[v];
        fixture = true;
        strip = v == FUZZ_VOCAB_SPM;
    }

    int n = 0;
    int32_t *ids = fz_encode(tok, text, len, special, &n);
    long m = 0;
    char *out = fz_decode(tok, ids, n, &m);
    fz_check_pieces(tok, strip, ids, n, out, m);

    bool bpe = v <= FUZZ_VOCAB_BPE_LLAMA3;
    if (fixture) {
        bool roundtrip = bpe || !memmem(text, len, "\xE2\x96\x81", 3);
        if (roundtrip && ((size_t)m != len || memcmp(out, text, len) != 0))
            fuzz_fail("fixture %d (parse_special %d): decode(encode(%zu bytes)) gave %ld bytes "
                      "that differ",
                      v, special, len, m);
        fz_check_specials(v, text, len, special, tok, ids, n);
        if ((size_t)n > len + (bpe ? 0 : 1))
            fuzz_fail("fixture %d: %d tokens for %zu bytes", v, n, len);
    } else if (real && fz_real_bpe) {
        bool all = true;
        for (size_t i = 0; i < len && all; i++)
            all = fz_real_byte[text[i]];
        if (all && ((size_t)m != len || memcmp(out, text, len) != 0))
            fuzz_fail("OROCHI_FUZZ_VOCAB: decode(encode(%zu bytes)) gave %ld bytes that differ",
                      len, m);
    }
    free(out);
    free(ids);

    /* arbitrary ids: the text read as int32 (up to 64 of them) */
    int32_t junk[64];
    int nj = (int)(len / 4 < 64 ? len / 4 : 64);
    if (nj > 0) {
        memcpy(junk, text, (size_t)nj * 4);
        char *jout = fz_decode(tok, junk, nj, &m);
        fz_check_pieces(tok, strip, junk, nj, jout, m);
        free(jout);
    }
    tokenizer_destroy(&own);
    return 0;
}
