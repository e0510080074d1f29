/*
 * tests/unit/test_tokenizer — the tokenizer on the default model (SmolLM2, byte-level BPE).
 *
 * The model path comes from OROCHI_MODEL; without the file the test prints a SKIP line and
 * passes. Checked: the metadata accessors; a few known ids; decode(encode(s)) == s for fixed
 * strings (whitespace runs, contractions, scripts, emoji ZWJ sequences, ChatML text), for
 * thousands of random valid UTF-8 strings from a seeded generator, and for random byte strings
 * that are mostly not UTF-8 (byte-level BPE reproduces any byte its vocab has; the 21 bytes
 * SmolLM2's vocab lacks are dropped, never mapped to a control token, and left out of the random
 * texts); pathological inputs (20k spaces, newlines, digits, punctuation, one 20k-letter word)
 * finish quickly; the capacity protocol of encode
 * and decode; the ChatML prompt with SmolLM's default system message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/gguf.h"
#include "model/tokenizer.h"

typedef struct {
    gguf_file *f;
    tokenizer *tok;
} tt_ctx;

static double tt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int tt_setup(void **state)
{
    static tt_ctx ctx;
    char err[512];
    ctx.f = gguf_open(getenv("OROCHI_MODEL"), err, sizeof err);
    if (!ctx.f) {
        fprintf(stderr, "gguf_open: %s\n", err);
        return -1;
    }
    double t0 = tt_now();
    ctx.tok = tokenizer_new(ctx.f, err, sizeof err);
    double dt = tt_now() - t0;
    if (!ctx.tok) {
        fprintf(stderr, "tokenizer_new: %s\n", err);
        return -1;
    }
    printf("tokenizer_new: %.1f ms\n", dt * 1e3);
    *state = &ctx;
    return 0;
}

static int tt_teardown(void **state)
{
    tt_ctx *ctx = *state;
    tokenizer_destroy(&ctx->tok);
    assert_null(ctx->tok);
    gguf_close(&ctx->f);
    return 0;
}

/* encode with exact sizing; returns malloc'd ids */
static int32_t *tt_encode(const tokenizer *tok, const char *s, size_t len, bool special, int *n)
{
    int needed = 0;
    int got = tokenizer_encode(tok, s, len, special, NULL, 0, &needed);
    assert_true(needed >= 0);
    if (needed == 0) {
        assert_int_equal(got, 0);
        *n = 0;
        return malloc(sizeof(int32_t));
    }
    assert_int_equal(got, -1);
    int32_t *ids = malloc((size_t)needed * sizeof *ids);
    assert_non_null(ids);
    got = tokenizer_encode(tok, s, len, special, ids, needed, NULL);
    assert_int_equal(got, needed);
    *n = got;
    return ids;
}

static void tt_roundtrip(const tokenizer *tok, const char *s, size_t len, bool special)
{
    int n;
    int32_t *ids = tt_encode(tok, s, len, special, &n);
    size_t cap = len * 4 + 64; /* specials decode to their text; nothing decodes longer */
    char *out = malloc(cap);
    assert_non_null(out);
    long m = tokenizer_decode(tok, ids, n, out, cap);
    if (m != (long)len || memcmp(out, s, len) != 0) {
        fprintf(stderr, "round trip failed for %zu bytes:", len);
        for (size_t i = 0; i < len && i < 64; i++)
            fprintf(stderr, " %02x", (uint8_t)s[i]);
        fprintf(stderr, "\n -> %ld bytes\n", m);
        fail();
    }
    assert_int_equal(out[m], '\0');
    for (int i = 0; i < n; i++)
        assert_true(ids[i] >= 0 && ids[i] < tokenizer_vocab_size(tok));
    free(out);
    free(ids);
}

static void test_accessors(void **state)
{
    const tokenizer *tok = ((tt_ctx *)*state)->tok;
    assert_int_equal(tokenizer_vocab_size(tok), 49152);
    assert_int_equal(tokenizer_bos(tok), 1);
    assert_int_equal(tokenizer_eos(tok), 2);
    assert_false(tokenizer_add_bos(tok));
    assert_true(tokenizer_is_special(tok, 0));
    assert_true(tokenizer_is_special(tok, 2));
    assert_false(tokenizer_is_special(tok, 17));
    assert_false(tokenizer_is_special(tok, -1));
    assert_false(tokenizer_is_special(tok, 49152));
    assert_string_equal(tokenizer_token_text(tok, 1), "<|im_start|>");
    const char *p;
    assert_int_equal(tokenizer_piece(tok, 198, &p), 1); /* "Ċ" */
    assert_int_equal(p[0], '\n');
    assert_int_equal(tokenizer_piece(tok, 49152, &p), 0);
    assert_int_equal(tokenizer_piece(tok, -5, &p), 0);
}

static void test_known_ids(void **state)
{
    const tokenizer *tok = ((tt_ctx *)*state)->tok;
    int n;
    int32_t *ids = tt_encode(tok, "Hello world", 11, true, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 19556);
    assert_int_equal(ids[1], 905);
    free(ids);
    const char *s = "<|im_start|>user\n";
    ids = tt_encode(tok, s, strlen(s), true, &n);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[2], 198);
    free(ids);
    ids = tt_encode(tok, s, strlen(s), false, &n);
    assert_true(n > 3);
    for (int i = 0; i < n; i++)
        assert_false(tokenizer_is_special(tok, ids[i]));
    free(ids);
    /* smollm: every digit alone */
    ids = tt_encode(tok, "12345", 5, true, &n);
    assert_int_equal(n, 5);
    free(ids);
    ids = tt_encode(tok, "", 0, true, &n);
    assert_int_equal(n, 0);
    free(ids);
}

static const char *const TT_FIXED[] = {
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "it's we're they've I'm you'll he'd 'S 'T",
    "   leading and trailing   ",
    "\n\n\t\t  \r\n mixed whitespace \x0b\x0c",
    "tabs\tand\nnewlines\n\n",
    "1234567890 3.14159 1,000,000",
    "日本語のテキスト、中文，한국어",
    "Привет, мир! Γειά σου Κόσμε! مرحبا بالعالم",
    "नमस्ते दुनिया",
    "👨‍👩‍👧‍👦 🏳️‍🌈 👍🏽 🇯🇵",
    "e\xcc\x81 a\xcc\x80 combining",
    "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start |> <|im_end| > <|endoftext",
    "int main(void) { return 0; }\n    indented();\n",
    "\xc2\xa0" "nbsp\xe2\x80\x83" "em space\xe3\x80\x80" "ideographic",
    "",
    " ",
    "'",
};

static void test_roundtrip_fixed(void **state)
{
    const tokenizer *tok = ((tt_ctx *)*state)->tok;
    for (size_t i = 0; i < sizeof TT_FIXED / sizeof TT_FIXED[0]; i++) {
        tt_roundtrip(tok, TT_FIXED[i], strlen(TT_FIXED[i]), true);
        tt_roundtrip(tok, TT_FIXED[i], strlen(TT_FIXED[i]), false);
    }
}

static uint64_t tt_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static size_t tt_put_utf8(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Which bytes the vocab can express: a lone byte encodes to one non-special token with that byte
 * as its piece. SmolLM2 leaves out 21 bytes (e.g. 0x04, 0xC0, 0xF1, 0xF5..0xFF); those are dropped
 * by encode, so round trips are only exact for text made of the others. */
static void tt_byte_ok(const tokenizer *tok, bool ok[256])
{
    int missing = 0;
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        int32_t id = -1;
        int n = tokenizer_encode(tok, &c, 1, false, &id, 1, NULL);
        const char *p;
        ok[b] = n == 1 && !tokenizer_is_special(tok, id) && tokenizer_piece(tok, id, &p) == 1 &&
                p[0] == c;
        if (!ok[b]) {
            assert_int_equal(n, 0); /* dropped, never an unknown/control token */
            missing++;
        }
    }
    assert_int_equal(missing, 21);
}

static void test_missing_bytes_dropped(void **state)
{
    const tokenizer *tok = ((tt_ctx *)*state)->tok;
    int32_t ids[8];
    int n = tokenizer_encode(tok, "a\x04" "b\xff", 4, true, ids, 8, NULL);
    char out[16];
    assert_int_equal(tokenizer_decode(tok, ids, n, out, sizeof out), 2);
    assert_string_equal(out, "ab");
}

static bool tt_utf8_ok(const bool ok[256], const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!ok[(uint8_t)s[i]])
            return false;
    return true;
}

static void test_roundtrip_random_unicode(void **state)
{
    const tokenizer *tok = ((tt_ctx *)*state)->tok;
    bool ok[256];
    tt_byte_ok(tok, ok);
    static const uint32_t ranges[][2] = {
        {0x20, 0x7E}, {0x09, 0x0D}, {0xA0, 0x2FF}, {0x300, 0x36F}, {0x370, 0x52F},
        {0x590, 0x6FF}, {0x900, 0x97F}, {0x2000, 0x206F}, {0x3000, 0x30FF}, {0x4E00, 0x9FFF},
        {0xAC00, 0xD7A3}, {0xE000, 0xFFFD}, {0x1F300, 0x1FAFF}, {0x10000, 0x10FFFF},
    };
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    char buf[4 * 80 + 1];
    for (int iter = 0; iter < 3000; iter++) {
        size_t len = 0;
        int nchars = 1 + (int)(tt_rand(&seed) % 80);
        for (int k = 0; k < nchars; k++) {
            const uint32_t *r = ranges[tt_rand(&seed) % (sizeof ranges / sizeof ranges[0])];
            uint32_t cp = r[0] + (uint32_t)(tt_rand(&seed) % (r[1] - r[0] + 1));
            if (cp >= 0xD800 && cp <= 0xDFFF)
                cp = 'x';
            char enc[4];
            size_t el = tt_put_utf8(cp, enc);
            if (!tt_utf8_ok(ok, enc, el)) {
                k--; /* a code point the vocab cannot spell: draw again */
                continue;
            }
            memcpy(buf + len, enc, el);
            len += el;
        }
        tt_roundtrip(tok, buf, len, iter % 2 == 0);
    }
}

static void test_roundtrip_random_bytes(void **state)
{
    const tokenizer *tok = ((tt_ctx *)*state)->tok;
    bool ok[256];
    tt_byte_ok(tok, ok);
    uint64_t seed = 12345;
    char buf[200];
    for (int iter = 0; iter < 2000; iter++) {
        size_t len = tt_rand(&seed) % sizeof buf;
        for (size_t k = 0; k < len; k++) {
            do
                buf[k] = (char)(tt_rand(&seed) & 0xFF);
            while (!ok[(uint8_t)buf[k]]);
        }
        tt_roundtrip(tok, buf, len, false);
    }
}

static void test_pathological(void **state)
{
    const tokenizer *tok = ((tt_ctx *)*state)->tok;
    size_t len = 20000;
    char *s = malloc(len + 1);
    assert_non_null(s);
    const char fills[] = {' ', 'a', '7', '\n', '!'};
    for (size_t f = 0; f < sizeof fills; f++) {
        memset(s, fills[f], len);
        double t0 = tt_now();
        tt_roundtrip(tok, s, len, true);
        double dt = tt_now() - t0;
        printf("20000 x '%s': %.1f ms\n", fills[f] == '\n' ? "\\n" : (char[]){fills[f], 0},
               dt * 1e3);
        assert_true(dt < 5.0);
    }
    /* one long word of mixed letters */
    uint64_t seed = 7;
    for (size_t k = 0; k < len; k++)
        s[k] = (char)('a' + tt_rand(&seed) % 26);
    double t0 = tt_now();
    tt_roundtrip(tok, s, len, true);
    printf("20000 random letters: %.1f ms\n", (tt_now() - t0) * 1e3);
    free(s);
}

static void test_capacity(void **state)
{
    const tokenizer *tok = ((tt_ctx *)*state)->tok;
    const char *s = "one two three four";
    int32_t ids[2];
    int needed = -7;
    assert_int_equal(tokenizer_encode(tok, s, strlen(s), true, ids, 2, &needed), -1);
    assert_int_equal(needed, 4);
    int32_t all[4];
    assert_int_equal(tokenizer_encode(tok, s, strlen(s), true, all, 4, &needed), 4);
    char out[32];
    assert_int_equal(tokenizer_decode(tok, all, 4, out, 5), -1);
    assert_int_equal(tokenizer_decode(tok, all, 4, out, strlen(s)), -1); /* no room for NUL */
    assert_int_equal(tokenizer_decode(tok, all, 4, out, strlen(s) + 1), (long)strlen(s));
    assert_string_equal(out, s);
    assert_int_equal(tokenizer_decode(tok, all, 0, out, 1), 0);
    assert_int_equal(tokenizer_decode(tok, all, 0, out, 0), -1);
}

/* The end of a generation: SmolLM2's eos <|im_end|> (2) alone — not <|endoftext|> (0), which
 * is no end of an assistant's turn in its ChatML, nor <|im_start|> (1), nor a plain token. */
static void test_eog(void **state)
{
    const tokenizer *tok = ((tt_ctx *)*state)->tok;
    const int32_t *ids;
    int n = tokenizer_eog(tok, &ids);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 2);
    assert_true(tokenizer_is_eog(tok, 2));
    assert_false(tokenizer_is_eog(tok, 0));
    assert_false(tokenizer_is_eog(tok, 1));
    assert_false(tokenizer_is_eog(tok, 100));
}

static void test_chat_prompt(void **state)
{
    const tokenizer *tok = ((tt_ctx *)*state)->tok;
    char *p = tokenizer_chat_prompt(tok, "Hi there");
    assert_non_null(p);
    assert_string_equal(p, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                           "trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi there"
                           "<|im_end|>\n<|im_start|>assistant\n");
    free(p);
}

/* Conversations follow the template's rule: its default system message whenever the first
 * message is not a system (or developer) one — a multi-turn chat as much as a single turn. */
static void test_chat_render(void **state)
{
    const tokenizer *tok = ((tt_ctx *)*state)->tok;
    const char *sys = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                      "Hugging Face<|im_end|>\n";
    const char *roles[] = {"user", "assistant", "user"};
    const char *texts[] = {"Hi", "Hello!", "How are you?"};
    char *p = tokenizer_chat_render(tok, 3, roles, texts);
    char want[512];
    snprintf(want, sizeof want,
             "%s<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
             "<|im_start|>user\nHow are you?<|im_end|>\n<|im_start|>assistant\n",
             sys);
    assert_string_equal(p, want);
    free(p);
    const char *roles2[] = {"developer", "user"};
    const char *texts2[] = {"Be brief.", "Hi"};
    p = tokenizer_chat_render(tok, 2, roles2, texts2);
    assert_string_equal(p, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
                           "<|im_end|>\n<|im_start|>assistant\n");
    free(p);
    const char *one = "Hi there";
    p = tokenizer_chat_render(tok, 1, roles, &one);
    char *q = tokenizer_chat_prompt(tok, one);
    assert_string_equal(p, q);
    free(p);
    free(q);
}

int main(void)
{
    const char *model = getenv("OROCHI_MODEL");
    if (!model || access(model, R_OK) != 0) {
        printf("SKIP: default model absent at %s (run make models)\n", model ? model : "(unset)");
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accessors),
        cmocka_unit_test(test_known_ids),
        cmocka_unit_test(test_chat_render),
        cmocka_unit_test(test_roundtrip_fixed),
        cmocka_unit_test(test_missing_bytes_dropped),
        cmocka_unit_test(test_roundtrip_random_unicode),
        cmocka_unit_test(test_roundtrip_random_bytes),
        cmocka_unit_test(test_pathological),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_chat_prompt),
        cmocka_unit_test(test_eog),
    };
    return cmocka_run_group_tests(tests, tt_setup, tt_teardown);
}
