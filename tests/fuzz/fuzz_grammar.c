/*
 * tests/fuzz/fuzz_grammar — libFuzzer target for the two parsers of structured output: grammar
 * text from a request's "grammar" field (model/grammar.c: grammar_parse) and JSON Schemas from
 * response_format and tools (coordinator/schema.c: schema_to_grammar, whose output grammar_parse
 * then reads).
 *
 * Input: text, a NUL byte, then a sample text (no NUL: the sample is empty).
 *   - The text as a grammar: refused with a one-line error, or compiled; then the sample is fed
 *     whole and byte by byte, which must agree (taken or refused at the same byte, accepting at
 *     the same end), grammar_matches must agree with the whole feed, and the forced text of every
 *     position reached must be taken by that position.
 *   - The text as JSON: when cJSON reads it, schema_to_grammar must refuse it with a one-line
 *     error or give a grammar that compiles (a schema the converter accepts never yields a grammar
 *     the engine refuses), and the sample runs through that grammar the same way.
 *
 * Build and run: `make fuzz`, then tests/fuzz/run_fuzz.sh (seeds: tests/fuzz/corpus/grammar/).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "coordinator/schema.h"
#include "model/grammar.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The forced text of s must be taken by s (on a copy). */
static void fz_check_forced(const grammar_state *s)
{
    char forced[64];
    size_t n = grammar_forced(s, forced, sizeof forced);
    if (n > sizeof forced)
        fuzz_fail("grammar_forced wrote %zu bytes into %zu", n, sizeof forced);
    grammar_state *c = grammar_clone(s);
    if (!c)
        return;
    if (n && grammar_feed(c, forced, n))
        fuzz_fail("the forced text '%.*s' is refused where it was forced", (int)n, forced);
    grammar_state_free(&c);
}

/* The sample through g: whole and byte by byte agree, and with grammar_matches. */
static void fz_run(const grammar *g, const char *sample, size_t n)
{
    grammar_state *whole = grammar_start(g), *bytes = grammar_start(g);
    if (!whole || !bytes) {
        grammar_state_free(&whole);
        grammar_state_free(&bytes);
        return;
    }
    int rw = grammar_feed(whole, sample, n);
    size_t taken = 0;
    int rb = 0;
    for (; taken < n && !rb; taken++) {
        if (taken % 7 == 0)
            fz_check_forced(bytes);
        rb = grammar_feed(bytes, sample + taken, 1);
    }
    if ((rw == 0) != (rb == 0))
        fuzz_fail("the sample is %s whole but %s byte by byte (at byte %zu)",
                  rw ? "refused" : "taken", rb ? "refused" : "taken", taken);
    if (!rw && grammar_accepting(whole) != grammar_accepting(bytes))
        fuzz_fail("whole and byte-by-byte feeds disagree on whether the text may end");
    if (!rw && grammar_done(whole) && !grammar_accepting(whole))
        fuzz_fail("a position where nothing may follow does not accept");
    bool m = grammar_matches(g, sample, n);
    if (m != (!rw && grammar_accepting(whole)))
        fuzz_fail("grammar_matches says %d, the feed %d", m, !rw && grammar_accepting(whole));
    if (rw) /* a refused feed leaves the position as it was: the start */
        fz_check_forced(whole);
    grammar_state_free(&whole);
    grammar_state_free(&bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - data) : size;
    const char *sample = nul ? (const char *)nul + 1 : "";
    size_t slen = nul ? size - tlen - 1 : 0;
    char err[256] = "";
    grammar *g = grammar_parse((const char *)data, tlen, err, sizeof err);
    if (!g)
        fuzz_check_err("grammar_parse", err, sizeof err);
    else
        fz_run(g, sample, slen);
    grammar_free(&g);

    cJSON *schema = cJSON_ParseWithLength((const char *)data, tlen);
    if (schema) {
        err[0] = 0;
        char *text = schema_to_grammar(schema, err, sizeof err);
        if (!text) {
            fuzz_check_err("schema_to_grammar", err, sizeof err);
        } else {
            char gerr[256] = "";
            grammar *sg = grammar_parse(text, strlen(text), gerr, sizeof gerr);
            if (!sg && strcmp(gerr, "out of memory"))
                fuzz_fail("schema_to_grammar gave a grammar the engine refuses (%s):\n%.2000s",
                          gerr, text);
            if (sg)
                fz_run(sg, sample, slen);
            grammar_free(&sg);
            free(text);
        }
        cJSON_Delete(schema);
    }
    return 0;
}
