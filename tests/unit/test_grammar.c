/*
 * tests/unit/test_grammar.c — the grammar engine (model/grammar.h): the language's constructs
 * accept exactly their sentences, bad grammars are refused with the line and what is wrong,
 * characters split across feeds, forced text, and token masks over the default model's
 * vocabulary checked against rules computed here from the tokens' bytes alone (digits only, a
 * JSON string's body) and against feeding every token one by one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "model/gguf.h"
#include "model/grammar.h"
#include "model/tokenizer.h"

static grammar *tg_parse(const char *text)
{
    char err[256];
    grammar *g = grammar_parse(text, strlen(text), err, sizeof err);
    if (!g)
        fail_msg("grammar refused: %s\n%s", err, text);
    return g;
}

static bool tg_match(const grammar *g, const char *s)
{
    return grammar_matches(g, s, strlen(s));
}

static void tg_refused(const char *text, const char *want)
{
    char err[256] = "";
    grammar *g = grammar_parse(text, strlen(text), err, sizeof err);
    if (g)
        fail_msg("accepted a bad grammar: %s", text);
    if (!strstr(err, want))
        fail_msg("error '%s' does not say '%s'", err, want);
}

static void test_language(void **state)
{
    (void)state;
    grammar *g = tg_parse("root ::= \"a\" b* (\"c\" | \"d\")+ e?\n"
                          "b ::= [0-9]\n"
                          "e ::= \"!\" # a comment\n");
    assert_true(tg_match(g, "ac"));
    assert_true(tg_match(g, "a123dcd!"));
    assert_false(tg_match(g, "a"));
    assert_false(tg_match(g, "a1"));
    assert_false(tg_match(g, "acx"));
    assert_false(tg_match(g, "ac!!"));
    grammar_free(&g);
    assert_null(g);

    g = tg_parse("root ::= x{2,3} \"-\" y{2} \"-\" z{1,}\nx ::= \"ab\"\ny ::= [xy]\nz ::= [0-9]");
    assert_true(tg_match(g, "abab-xy-1"));
    assert_true(tg_match(g, "ababab-yy-123"));
    assert_false(tg_match(g, "ab-xy-1"));
    assert_false(tg_match(g, "abababab-xy-1"));
    assert_false(tg_match(g, "abab-x-1"));
    assert_false(tg_match(g, "abab-xy-"));
    grammar_free(&g);

    /* negated classes, escapes, any character, code points past ASCII */
    g = tg_parse("root ::= \"\\\"\" [^\"\\\\\\n]* \"\\\"\" . [\\u03b1-\\u03c9]+ \"\\x21\"");
    assert_true(tg_match(g, "\"hi there\"xαβω!"));
    assert_true(tg_match(g, "\"\"€λ!"));
    assert_false(tg_match(g, "\"a\"b\"xα!")); /* a quote inside */
    assert_false(tg_match(g, "\"a\\b\"xα!")); /* a backslash inside */
    assert_false(tg_match(g, "\"a\"xab!"));   /* Latin, not Greek */
    grammar_free(&g);

    /* rules in any order, multi-line alternatives, right recursion of any depth */
    g = tg_parse("root ::= list\nlist ::= item\n   | item \",\" list\nitem ::= [a-z]+");
    char big[4001];
    for (int i = 0; i < 2000; i++) {
        big[2 * i] = 'q';
        big[2 * i + 1] = ',';
    }
    big[3999] = 0;
    assert_true(tg_match(g, "a,bc,d"));
    assert_true(tg_match(g, big));
    assert_false(tg_match(g, "a,,b"));
    grammar_free(&g);
}

static void test_refused(void **state)
{
    (void)state;
    tg_refused("root ::= a\n", "line 1, column 10: the rule 'a' is not defined");
    tg_refused("root ::= root \"x\" | \"y\"", "'root' is left-recursive");
    tg_refused("root ::= a\na ::= b? a \"x\"\nb ::= \"b\"", "'a' is left-recursive");
    tg_refused("root ::= \"abc", "line 1, column 10: unterminated literal");
    tg_refused("root ::= [a-", "unterminated character class");
    tg_refused("root ::= [z-a]", "runs backwards");
    tg_refused("a ::= \"x\"", "no rule named root");
    tg_refused("", "the grammar is empty");
    tg_refused("root ::= \"a\"\nroot ::= \"b\"",
               "line 2, column 1: the rule 'root' is defined twice");
    tg_refused("root ::= (\"a\"", "unclosed parenthesis");
    tg_refused("root ::= \"a\"{3,1}", "n below m");
    tg_refused("root ::= \"a\"{99999}", "above 4096");
    tg_refused("root ::= \"\\q\"", "unknown escape \\q");
    tg_refused("root ::= \"a\" )", "unbalanced ')'");
    tg_refused("root ::= @", "unexpected '@'");
    tg_refused("root ::= \"\\uD9b1\"", "line 1, column 11: \\uD9B1 is half of a UTF-16 pair");
    tg_refused("root ::= \"\\uDC00\\uD800\"", "\\uDC00 is half of a UTF-16 pair");
}

/* Surrogates: a pair of escapes is one character, a class may run through them, and a class of
 * surrogates alone matches (and forces) nothing. */
static void test_surrogates(void **state)
{
    (void)state;
    grammar *g = tg_parse("root ::= \"\\uD83D\\uDE00\" [\\u0000-\\uFFFF]");
    assert_true(tg_match(g, "\xf0\x9f\x98\x80" "a"));
    assert_true(tg_match(g, "\xf0\x9f\x98\x80\xef\xbf\xbd"));
    assert_false(tg_match(g, "\xf0\x9f\x98\x80\xed\xa0\x80")); /* U+D800 as UTF-8 */
    grammar_state *s = grammar_start(g);
    char out[64];
    assert_int_equal(grammar_forced(s, out, sizeof out), 4);
    assert_memory_equal(out, "\xf0\x9f\x98\x80", 4);
    grammar_state_free(&s);
    grammar_free(&g);

    g = tg_parse("root ::= [\\uD800] | \"x\"");
    assert_false(tg_match(g, "\xed\xa0\x80"));
    assert_true(tg_match(g, "x"));
    s = grammar_start(g);
    size_t n = grammar_forced(s, out, sizeof out);
    assert_true(n == 0 || (n == 1 && out[0] == 'x'));
    if (n)
        assert_int_equal(grammar_feed(s, out, n), 0);
    grammar_state_free(&s);
    grammar_free(&g);

    g = tg_parse("root ::= [\\uD800] \"x\"");
    s = grammar_start(g);
    assert_int_equal(grammar_forced(s, out, sizeof out), 0); /* a surrogate is no text */
    grammar_state_free(&s);
    grammar_free(&g);
}

/* Nested repetitions multiply the parses of each character: the stacks are found again through
 * a hash set (a linear search took seconds a byte at 14 levels), and past GR_MAX_WORK offers for
 * one character the text is refused, as past GR_MAX_STACKS. An ambiguous grammar still works. */
static void test_ambiguous_bounded(void **state)
{
    (void)state;
    grammar *g = tg_parse("root ::= z\nz ::= .++++");
    assert_true(tg_match(g, "a"));
    assert_true(tg_match(g, "qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq"));
    grammar_free(&g);
    g = tg_parse("root ::= z\nz ::= .++++++++++++++");
    assert_true(tg_match(g, "a"));
    char text[97];
    memset(text, 'q', 96);
    text[96] = 0;
    assert_false(tg_match(g, text)); /* past GR_MAX_WORK */
    grammar_free(&g);
    g = tg_parse("root ::= (\"a\" | \"ab\")* \"c\"");
    assert_true(tg_match(g, "aababababc"));
    assert_false(tg_match(g, "abb"));
    grammar_free(&g);
}

static void test_feed_and_forced(void **state)
{
    (void)state;
    grammar *g = tg_parse("root ::= \"{\\\"name\\\": \\\"\" [α-ω]+ \"\\\"}\"");
    grammar_state *s = grammar_start(g);
    char out[64];
    size_t n = grammar_forced(s, out, sizeof out);
    assert_int_equal(n, 10);
    assert_memory_equal(out, "{\"name\": \"", 10);
    assert_int_equal(grammar_feed(s, out, n), 0);
    assert_int_equal(grammar_forced(s, out, sizeof out), 0); /* a choice of letters */
    /* α (ce b1) one byte at a time; a byte no Greek letter starts with is refused */
    assert_int_equal(grammar_feed(s, "\xce", 1), 0);
    assert_false(grammar_accepting(s));
    assert_int_equal(grammar_feed(s, "\xb1", 1), 0);
    assert_int_equal(grammar_feed(s, "\xe2", 1), -1); /* U+2000.. holds no Greek letter */
    assert_int_equal(grammar_feed(s, "a", 1), -1);
    assert_int_equal(grammar_feed(s, "\xc0\x80", 2), -1); /* overlong: not a character */
    assert_int_equal(grammar_feed(s, "\"x", 2), -1);      /* refused whole: s is as it was */
    n = grammar_forced(s, out, sizeof out);
    assert_int_equal(n, 0); /* more letters or the quote */
    assert_int_equal(grammar_feed(s, "\"", 1), 0);
    assert_int_equal(grammar_forced(s, out, sizeof out), 1);
    assert_int_equal(out[0], '}');
    assert_int_equal(grammar_feed(s, "}", 1), 0);
    assert_true(grammar_accepting(s));
    assert_true(grammar_done(s));
    grammar_state_free(&s);
    assert_null(s);
    grammar_free(&g);
}

/* ---- masks over the default model's vocabulary -------------------------------------------- */

typedef struct {
    gguf_file *f;
    tokenizer *tok;
} tg_model;

static int tg_setup(void **state)
{
    static tg_model m;
    char err[512];
    const char *path = getenv("OROCHI_MODEL");
    m.f = path ? gguf_open(path, err, sizeof err) : NULL;
    m.tok = m.f ? tokenizer_new(m.f, err, sizeof err) : NULL;
    if (!m.tok) {
        fprintf(stderr, "the mask tests need the default model (OROCHI_MODEL): %s\n",
                path ? err : "not set");
        return -1;
    }
    *state = &m;
    return 0;
}

static int tg_teardown(void **state)
{
    tg_model *m = *state;
    tokenizer_destroy(&m->tok);
    gguf_close(&m->f);
    return 0;
}

static bool tg_bit(const uint64_t *mask, int32_t id)
{
    return mask[id / 64] >> (id % 64) & 1;
}

static bool tg_text_token(const tokenizer *tok, int32_t id, const char **b, size_t *n)
{
    *n = tokenizer_piece(tok, id, b);
    return *n && !tokenizer_is_special(tok, id) && !tokenizer_is_eog(tok, id);
}

/* Whether b is UTF-8 whose last character may be unfinished (what a text may begin with). */
static bool tg_utf8_start(const char *b, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = (unsigned char)b[i];
        size_t len = c < 0x80                 ? 1
                     : c >= 0xC2 && c <= 0xDF ? 2
                     : (c & 0xF0) == 0xE0     ? 3
                     : c >= 0xF0 && c <= 0xF4 ? 4
                                              : 0;
        if (!len)
            return false;
        for (size_t k = 1; k < len && i + k < n; k++)
            if (((unsigned char)b[i + k] & 0xC0) != 0x80)
                return false;
        if (len == 3 && i + 1 < n && c == 0xE0 && (unsigned char)b[i + 1] < 0xA0)
            return false; /* overlong */
        if (len == 3 && i + 1 < n && c == 0xED && (unsigned char)b[i + 1] >= 0xA0)
            return false; /* a surrogate */
        if (len == 4 && i + 1 < n &&
            ((c == 0xF0 && (unsigned char)b[i + 1] < 0x90) ||
             (c == 0xF4 && (unsigned char)b[i + 1] >= 0x90)))
            return false;
        i += len;
    }
    return true;
}

static void test_mask_digits(void **state)
{
    tg_model *m = *state;
    int V = tokenizer_vocab_size(m->tok);
    grammar *g = tg_parse("root ::= [0-9]+");
    grammar_vocab *vocab = grammar_vocab_new(m->tok);
    grammar_matcher *mt = grammar_matcher_new(g, vocab);
    grammar_state *s = grammar_start(g);
    assert_non_null(mt);
    for (int round = 0; round < 2; round++) { /* at the start, then after "1": EOG allowed */
        const uint64_t *mask = grammar_mask(mt, s);
        assert_non_null(mask);
        int allowed = 0;
        for (int32_t id = 0; id < V; id++) {
            const char *b;
            size_t n;
            bool want = false;
            if (tg_text_token(m->tok, id, &b, &n)) {
                want = true;
                for (size_t i = 0; i < n; i++)
                    want = want && b[i] >= '0' && b[i] <= '9';
            } else if (tokenizer_is_eog(m->tok, id)) {
                want = round == 1;
            }
            if (tg_bit(mask, id) != want)
                fail_msg("round %d: token %d '%s' is %s", round, id,
                         tokenizer_token_text(m->tok, id), want ? "missing" : "allowed");
            allowed += want;
            assert_true(grammar_allows(mt, s, id) == want);
        }
        assert_true(allowed >= 10);
        int32_t one[4], word[4];
        assert_int_equal(tokenizer_encode(m->tok, "1", 1, false, one, 4, NULL), 1);
        assert_int_equal(tokenizer_encode(m->tok, "hello", 5, false, word, 4, NULL), 1);
        assert_int_equal(grammar_advance(mt, s, word[0]), -1);
        assert_int_equal(grammar_advance(mt, s, one[0]), 0);
    }
    grammar_state_free(&s);
    grammar_matcher_free(&mt);
    grammar_vocab_free(&vocab);
    grammar_free(&g);
}

static double tg_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A JSON-ish grammar: the mask inside a string body is every token without a quote, backslash or
 * control byte, plus those that end the string with a quote followed by what may come next. */
static void test_mask_json(void **state)
{
    tg_model *m = *state;
    int V = tokenizer_vocab_size(m->tok);
    grammar *g =
        tg_parse("root ::= \"{\" ws \"\\\"k\\\"\" ws \":\" ws str ws \"}\"\n"
                 "str ::= \"\\\"\" ([^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\nt])* \"\\\"\"\n"
                 "ws ::= | \" \"");
    double tm0 = tg_now();
    grammar_vocab *vocab = grammar_vocab_new(m->tok);
    double tm1 = tg_now();
    grammar_matcher *mt = grammar_matcher_new(g, vocab);
    printf("grammar_vocab_new: %.2f ms, grammar_matcher_new: %.3f ms\n", (tm1 - tm0) * 1e3,
           (tg_now() - tm1) * 1e3);
    grammar_state *s = grammar_start(g);
    assert_int_equal(grammar_feed(s, "{\"k\": \"ab", 9), 0);
    double t0 = tg_now();
    const uint64_t *mask = grammar_mask(mt, s);
    double t1 = tg_now();
    const uint64_t *again = grammar_mask(mt, s);
    double t2 = tg_now();
    printf("mask inside a string: %.2f ms, cached %.4f ms\n", (t1 - t0) * 1e3, (t2 - t1) * 1e3);
    assert_ptr_equal(mask, again);
    int n_allowed = 0;
    for (int32_t id = 0; id < V; id++) {
        const char *b;
        size_t n;
        bool want = false;
        if (tg_text_token(m->tok, id, &b, &n)) {
            /* the body's characters, then maybe the closing quote and " }" or "}" */
            size_t i = 0;
            while (i < n && b[i] != '"' && b[i] != '\\' && (unsigned char)b[i] >= 0x20)
                i++;
            want = i == n && tg_utf8_start(b, n);
            if (i < n && b[i] == '"' && tg_utf8_start(b, i)) {
                const char *rest = b + i + 1;
                size_t r = n - i - 1;
                want = r == 0 || (r == 1 && (*rest == ' ' || *rest == '}')) ||
                       (r == 2 && !memcmp(rest, " }", 2));
            }
            if (i < n && b[i] == '\\') /* an escape: \" \\ \n \t, maybe with more after */
                want = false;
        }
        /* tokens with an escape are checked by feeding below; here only the others */
        if (tg_text_token(m->tok, id, &b, &n) && memchr(b, '\\', n))
            continue;
        if (tg_bit(mask, id) != want)
            fail_msg("token %d '%s' is %s", id, tokenizer_token_text(m->tok, id),
                     want ? "missing" : "allowed");
        n_allowed += want;
    }
    assert_true(n_allowed > V / 2);
    /* every token against feeding its bytes to a copy */
    for (int32_t id = 0; id < V; id++) {
        grammar_state *c = grammar_clone(s);
        const char *b;
        size_t n;
        bool fed = tg_text_token(m->tok, id, &b, &n) && !grammar_feed(c, b, n);
        if (tg_bit(mask, id) != fed)
            fail_msg("token %d '%s': mask %d, feeding %d", id, tokenizer_token_text(m->tok, id),
                     tg_bit(mask, id), fed);
        grammar_state_free(&c);
    }
    /* at the end only the end-of-generation tokens */
    assert_int_equal(grammar_feed(s, "\"}", 2), 0);
    assert_true(grammar_done(s));
    mask = grammar_mask(mt, s);
    for (int32_t id = 0; id < V; id++)
        assert_true(tg_bit(mask, id) == tokenizer_is_eog(m->tok, id));
    grammar_state_free(&s);
    grammar_matcher_free(&mt);
    grammar_vocab_free(&vocab);
    grammar_free(&g);
}

int main(void)
{
    const struct CMUnitTest plain[] = {
        cmocka_unit_test(test_language),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_surrogates),
        cmocka_unit_test(test_ambiguous_bounded),
        cmocka_unit_test(test_feed_and_forced),
    };
    const struct CMUnitTest model[] = {
        cmocka_unit_test(test_mask_digits),
        cmocka_unit_test(test_mask_json),
    };
    int rc = cmocka_run_group_tests(plain, NULL, NULL);
    return rc | cmocka_run_group_tests(model, tg_setup, tg_teardown);
}
