/*
 * tests/unit/test_schema.c — JSON Schema to grammar (coordinator/schema.h): each schema's
 * grammar is compiled by the grammar engine (model/grammar.h) and must accept the valid
 * documents and refuse the invalid ones — a missing required key, an extra key, keys out of
 * order, a wrong type, a value outside an enum, an array too long, an unterminated string,
 * trailing garbage. Bounded integers and numbers are checked value by value against arithmetic
 * over whole ranges; long strings cross the grammar's 4096 repetition bound. Unsupported and
 * wrong schemas must be refused with the keyword and its path; tool calls and json_object too.
 *
 * Schemas and documents are written with ' for " (ts_dq turns them back), so that they read as
 * JSON; the few documents that need exact bytes are written in C escapes with ts_raw.
 *
 * `unit_schema --match SCHEMA_FILE` judges documents from stdin instead (see ts_match_main), so
 * that tests/reference/test_schema_jsonschema.py can hold the grammars against an independent
 * validator, python3-jsonschema, on random documents.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "coordinator/schema.h"
#include "model/grammar.h"

#define DOCS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define NONE ((const char *const[]){NULL})

/* A copy of s with every ' made " (the test's way of writing JSON). */
static char *ts_dq(const char *s)
{
    char *d = strdup(s);
    for (char *p = d; *p; p++)
        if (*p == '\'')
            *p = '"';
    return d;
}

/* The grammar text of a schema written with ', or NULL with err. */
static char *ts_text(const char *schema, char *err, size_t errlen)
{
    char *js = ts_dq(schema);
    cJSON *s = cJSON_Parse(js);
    if (!s)
        fail_msg("the test's schema is not JSON: %s", js);
    char *text = schema_to_grammar(s, err, errlen);
    cJSON_Delete(s);
    free(js);
    return text;
}

static grammar *ts_parse(const char *text, const char *what)
{
    char err[256];
    grammar *g = grammar_parse(text, strlen(text), err, sizeof err);
    if (!g)
        fail_msg("the grammar of %s does not compile: %s\n%s", what, err, text);
    return g;
}

/* Compiles the schema's grammar; the test fails when either step fails. *text_out keeps the
 * grammar text for messages (freed by the caller). */
static grammar *ts_compile(const char *schema, char **text_out)
{
    char err[256];
    char *text = ts_text(schema, err, sizeof err);
    if (!text)
        fail_msg("schema refused: %s\n%s", err, schema);
    grammar *g = ts_parse(text, schema);
    *text_out = text;
    return g;
}

static bool ts_match(const grammar *g, const char *doc)
{
    return grammar_matches(g, doc, strlen(doc));
}

/* Every document of valid (written with ') is accepted, every one of invalid refused. The valid
 * ones must also be JSON (a check on the test's own data). */
static void ts_check(const char *schema, const char *const *valid, const char *const *invalid)
{
    char *text;
    grammar *g = ts_compile(schema, &text);
    for (; *valid; valid++) {
        char *doc = ts_dq(*valid);
        cJSON *j = cJSON_Parse(doc);
        if (!j)
            fail_msg("test data: '%s' is not JSON", doc);
        cJSON_Delete(j);
        if (!ts_match(g, doc))
            fail_msg("schema %s\nrefused the valid document %s\ngrammar:\n%s", schema, doc, text);
        free(doc);
    }
    for (; *invalid; invalid++) {
        char *doc = ts_dq(*invalid);
        if (ts_match(g, doc))
            fail_msg("schema %s\naccepted the invalid document %s\ngrammar:\n%s", schema, doc,
                     text);
        free(doc);
    }
    grammar_free(&g);
    free(text);
}

/* One document in exact bytes. */
static void ts_raw(const char *schema, const char *doc, bool want)
{
    char *text;
    grammar *g = ts_compile(schema, &text);
    if (ts_match(g, doc) != want)
        fail_msg("schema %s: %s the document [%s]\ngrammar:\n%s", schema,
                 want ? "refused" : "accepted", doc, text);
    grammar_free(&g);
    free(text);
}

/* The schema is refused with an error that contains want. */
static void ts_refused(const char *schema, const char *want)
{
    char err[256] = "";
    char *text = ts_text(schema, err, sizeof err);
    if (text)
        fail_msg("schema %s was accepted:\n%s", schema, text);
    if (!strstr(err, want))
        fail_msg("schema %s: the error '%s' does not say '%s'", schema, err, want);
}

/* ==== scalars ================================================================================= */

static void test_scalars(void **state)
{
    (void)state;
    ts_check("{'type': 'string'}",
             DOCS("''", "'abc'", "'a\\'b'", "'\\\\n'", "'tab\\tnew\\nline\\r\\b\\f\\/'",
                  "'\\u00e9\\u20AC'", "'\\ud83d\\ude00'", "'caf\xC3\xA9 \xE2\x82\xAC'", "'x' ",
                  "'x'\n  "),
             DOCS("abc", "'abc", "'a'b'", "'\\x'", "'\\u12'", "'\\ud83d'", "'\\ude00'", " 'x'",
                  "'x' y", "'x''", "1", "null"));
    ts_raw("{\"type\": \"string\"}", "\"a\nb\"", false); /* raw control characters */
    ts_raw("{\"type\": \"string\"}", "\"a\tb\"", false);
    ts_raw("{\"type\": \"string\"}",
           "\"a\x7f"
           "b\"",
           true); /* DEL is not a control of JSON */
    ts_check("{'type': 'integer'}", DOCS("0", "-5", "42", "123456789012345", "-123456789012345"),
             DOCS("01", "1.5", "1e3", "+1", "1234567890123456", "'1'", "-", "", "1 2", "--1"));
    ts_check("{'type': 'number'}",
             DOCS("0", "-0.5", "1.25e-3", "3E+10", "1.0", "100", "0.123456789012345"),
             DOCS(".5", "1.", "1e", "01.2", "NaN", "0.1234567890123456", "1e1234", "-.5", "0x1"));
    ts_check("{'type': 'boolean'}", DOCS("true", "false"),
             DOCS("True", "1", "'true'", "truefalse"));
    ts_check("{'type': 'null'}", DOCS("null"), DOCS("nul", "'null'", "0"));
    ts_check("{'type': ['string', 'null']}", DOCS("'x'", "null"), DOCS("1", "true", "[]"));
    ts_check("{'type': ['integer', 'number']}", DOCS("1", "1.5"), DOCS("'1'"));
    /* anything: the empty schema and true */
    ts_check("{}", DOCS("1", "'s'", "[1, {'a': null}]", "{'x': [true]}", "null"),
             DOCS("[1,]", "{'a'}", "tru"));
    ts_check("true", DOCS("1", "{}"), DOCS("{"));
}

/* Whitespace: at most one space, or a newline and up to 20 spaces or tabs, between tokens. */
static void test_whitespace(void **state)
{
    (void)state;
    const char *s = "{'type': 'array', 'items': {'type': 'integer'}}";
    ts_check(s, DOCS("[1,2]", "[ 1 , 2 ]", "[\n  1,\n  2\n]", "[\n\t\t1]", "[1]\n"),
             DOCS("[  1]", "[1  ]", "[\n\n1]", " [1]", "[1]  ", "[ \n1]"));
    char doc[64];
    snprintf(doc, sizeof doc, "[\n%*s1]", 20, "");
    ts_raw(s, doc, true);
    snprintf(doc, sizeof doc, "[\n%*s1]", 21, "");
    ts_raw(s, doc, false);
}

/* ==== objects ================================================================================= */

static void test_object_keys(void **state)
{
    (void)state;
    /* required a and c, optional b and d: keys in this order */
    const char *s = "{'type': 'object', 'properties': {'a': {'type': 'integer'}, 'b': {'type': "
                    "'string'}, 'c': {'type': 'integer'}, 'd': {'type': 'boolean'}}, "
                    "'required': ['a', 'c'], 'additionalProperties': false}";
    ts_check(s,
             DOCS("{'a':1,'c':2}", "{'a':1,'b':'x','c':2}", "{'a':1,'c':2,'d':true}",
                  "{'a':1,'b':'','c':2,'d':false}", "{ 'a' : 1 , 'c' : 2 }",
                  "{\n  'a': 1,\n  'b': 'x',\n  'c': 2\n}"),
             DOCS("{'c':2}", "{'a':1}", "{'a':1,'c':2,'e':3}", "{'c':2,'a':1}",
                  "{'a':1,'a':1,'c':2}", "{'a':1,,'c':2}", "{'a':1,'c':2,}", "{'a':'1','c':2}",
                  "{'a':1 'c':2}", "{'a':1,'c':2", "{'a':1,'c':2}}", "{'a':1,'c':2,'b':'x'}",
                  "{,'a':1,'c':2}", "{}", "[]", "{'a':1,'b':null,'c':2}"));
    /* all optional; additionalProperties absent is closed too */
    s = "{'type': 'object', 'properties': {'name': {'type': 'string'}, 'names': {'type': "
        "'array', 'items': {'type': 'string'}}, 'z': {'type': 'null'}}}";
    ts_check(s,
             DOCS("{}", "{ }", "{'name':'x'}", "{'names':[]}", "{'z':null}",
                  "{'name':'a','z':null}", "{'name':'a','names':['b','c'],'z':null}",
                  "{'names':['b'],'z':null}"),
             DOCS("{,}", "{'names':[],'name':'a'}", "{'nam':'x'}", "{'other':1}", "{'name':'a',}",
                  "{'z':null,'name':'a'}"));
    /* the last one required */
    s = "{'properties': {'a': {'type': 'integer'}, 'b': {'type': 'integer'}}, 'required': ['b']}";
    ts_check(s, DOCS("{'b':2}", "{'a':1,'b':2}"), DOCS("{}", "{'a':1}", "{'b':2,'a':1}"));
    /* keys that need escapes, and non-ASCII */
    s = "{'type': 'object', 'properties': {'a\\'b': {'const': 1}, 'caf\xC3\xA9': {'const': 2}, "
        "'new\\nline': {'const': 3}}, 'required': ['a\\'b']}";
    ts_check(s, DOCS("{'a\\'b': 1, 'caf\xC3\xA9': 2}", "{'a\\'b': 1, 'new\\nline': 3}"),
             DOCS("{'ab': 1}", "{'a\\'b': 1, 'cafe': 2}"));
    /* an empty object of no properties */
    ts_check("{'type': 'object', 'additionalProperties': false}", DOCS("{}", "{ }"),
             DOCS("{'a':1}"));
    ts_check("{'type': 'object', 'properties': {}, 'additionalProperties': false}", DOCS("{}"),
             DOCS("{'a':1}"));
}

static void test_open_objects(void **state)
{
    (void)state;
    ts_check("{'type': 'object'}",
             DOCS("{}", "{'a': 1}", "{'a': {'b': [1, 2.5, 'x', null, true, false, {}]}}",
                  "{'': ''}", "{'a':1,'a':2}"),
             DOCS("[]", "{'a'}", "{'a':}", "{a:1}", "{'a':1,}", "'x'", "{'a':1}}"));
    ts_check("{'type': 'object', 'additionalProperties': {'type': 'integer'}}",
             DOCS("{}", "{'x': 1}", "{'x': 1, 'y': -2}"), DOCS("{'x': 'one'}", "{'x': 1.5}"));
    ts_check("{'type': 'object', 'additionalProperties': true}", DOCS("{'x': [1]}"), DOCS("[]"));
}

/* ==== arrays and strings ====================================================================== */

static void test_arrays(void **state)
{
    (void)state;
    ts_check("{'type': 'array', 'items': {'type': 'integer'}, 'minItems': 1, 'maxItems': 3}",
             DOCS("[1]", "[1,2,3]", "[ 1 , 2 ]"),
             DOCS("[]", "[1,2,3,4]", "[1,]", "['a']", "[1 2]", "[,1]", "[1", "1"));
    ts_check("{'type': 'array', 'maxItems': 0}", DOCS("[]", "[ ]"), DOCS("[1]"));
    ts_check("{'type': 'array', 'minItems': 2}", DOCS("[1, 'a']", "[1,2,3,4,5,6,7,8,9,10]"),
             DOCS("[]", "[1]"));
    ts_check("{'type': 'array'}", DOCS("[]", "[[], [[1]], {'a': [null]}]"), DOCS("[[]", "{}"));
    ts_check("{'type': 'array', 'items': {'type': 'array', 'items': {'enum': ['x', 'y']}, "
             "'maxItems': 2}, 'uniqueItems': false}",
             DOCS("[]", "[[], ['x', 'y'], ['y']]"), DOCS("[['x', 'y', 'x']]", "[['z']]", "['x']"));
}

/* A JSON string of n characters c (a one-byte character, or a 2-byte UTF-8 one when wide). */
static char *ts_long_string(int n, bool wide)
{
    char *s = malloc((size_t)n * 2 + 3), *p = s;
    *p++ = '"';
    for (int i = 0; i < n; i++) {
        if (wide) {
            *p++ = (char)0xC3;
            *p++ = (char)0xA9;
        } else {
            *p++ = 'a' + i % 26;
        }
    }
    *p++ = '"';
    *p = 0;
    return s;
}

static void ts_lengths(const char *schema, const int *lens, const bool *want, int n)
{
    char *text;
    grammar *g = ts_compile(schema, &text);
    for (int i = 0; i < n; i++)
        for (int wide = 0; wide < 2; wide++) {
            char *s = ts_long_string(lens[i], wide);
            if (ts_match(g, s) != want[i])
                fail_msg("schema %s: a string of %d%s characters %s", schema, lens[i],
                         wide ? " two-byte" : "", want[i] ? "refused" : "accepted");
            free(s);
        }
    grammar_free(&g);
    free(text);
}

static void test_strings(void **state)
{
    (void)state;
    ts_check("{'type': 'string', 'minLength': 2, 'maxLength': 4}",
             DOCS("'ab'", "'abcd'", "'a\\nb'", "'\xC3\xA9\xC3\xA9'", "'\\ud83d\\ude00\\u0041'",
                  "'\\\\\\\\'"),
             DOCS("''", "'a'", "'abcde'", "'\xC3\xA9'", "'\\ud83d\\ude00'", "'abc"));
    ts_check("{'maxLength': 0}", DOCS("''"), DOCS("'a'", "1"));
    ts_check("{'type': 'string', 'minLength': 3}", DOCS("'abc'", "'abcdefghijklmnop'"),
             DOCS("'ab'"));
    /* past the grammar's 4096 bound: blocks of 4096 */
    static const int lens[] = {0, 1, 4095, 4096, 4097, 5000, 5001, 9000};
    static const bool upto5000[] = {1, 1, 1, 1, 1, 1, 0, 0};
    ts_lengths("{\"type\": \"string\", \"maxLength\": 5000}", lens, upto5000, 8);
    static const int lens2[] = {4999, 5000, 8191, 8192, 8193, 12000, 12001, 13000, 20000};
    static const bool mid[] = {0, 1, 1, 1, 1, 1, 0, 0, 0};
    ts_lengths("{\"type\": \"string\", \"minLength\": 5000, \"maxLength\": 12000}", lens2, mid, 9);
    static const int lens3[] = {8999, 9000, 20000};
    static const bool from9000[] = {0, 1, 1};
    ts_lengths("{\"type\": \"string\", \"minLength\": 9000}", lens3, from9000, 3);
    /* a bound no answer can reach is no bound */
    static const int lens4[] = {0, 10000};
    static const bool any[] = {1, 1};
    ts_lengths("{\"type\": \"string\", \"maxLength\": 100000000}", lens4, any, 2);
}

static void test_formats(void **state)
{
    (void)state;
    ts_check("{'type': 'string', 'format': 'date'}",
             DOCS("'2024-02-29'", "'2000-02-29'", "'2023-12-31'", "'2023-04-30'", "'0001-01-01'",
                  "'1996-02-29'", "'0000-02-29'"),
             DOCS("'2023-02-29'", "'1900-02-29'", "'2023-04-31'", "'2023-13-01'", "'2023-00-10'",
                  "'2023-01-00'", "'2023-1-01'", "'20230101'", "2023", "'2023-02-30'"));
    ts_check("{'type': 'string', 'format': 'time'}",
             DOCS("'12:34:56Z'", "'23:59:59.123+05:30'", "'00:00:00-00:00'"),
             DOCS("'24:00:00Z'", "'12:34:56'", "'12:60:00Z'", "'1:02:03Z'"));
    ts_check("{'type': 'string', 'format': 'date-time'}",
             DOCS("'2024-01-15T10:20:30Z'", "'2024-01-15T10:20:30.5+01:00'"),
             DOCS("'2024-01-15 10:20:30Z'", "'2024-01-15T10:20Z'"));
    ts_check(
        "{'type': 'string', 'format': 'uuid'}",
        DOCS("'123e4567-e89b-12d3-a456-426614174000'", "'ABCDEF00-0000-0000-0000-000000000000'"),
        DOCS("'123e4567e89b12d3a456426614174000'", "'123e4567-e89b-12d3-a456-42661417400'",
             "'g23e4567-e89b-12d3-a456-426614174000'"));
    ts_check("{'type': 'string', 'format': 'email'}",
             DOCS("'a.b@example.com'", "'x+tag@mail.example.co.uk'"),
             DOCS("'ab'", "'a@b'", "'@example.com'", "'a@-x.com'", "'a b@x.com'"));
    ts_check("{'type': 'string', 'format': 'ipv4'}",
             DOCS("'192.168.0.1'", "'0.0.0.0'", "'255.255.255.255'"),
             DOCS("'256.1.1.1'", "'01.1.1.1'", "'1.1.1'", "'1.1.1.1.1'"));
    ts_check("{'type': ['string', 'null'], 'format': 'date'}", DOCS("'2024-05-06'", "null"),
             DOCS("'x'"));
}

/* ==== enum, const, anyOf, $ref ================================================================ */

static void test_enum_const(void **state)
{
    (void)state;
    ts_check(
        "{'enum': ['red', 'green', 1, null, {'a': [1, 2]}, 2.5, true]}",
        DOCS("'red'", "'green'", "1", "null", "{'a':[1,2]}", "{ 'a' : [ 1 , 2 ] }", "2.5", "true"),
        DOCS("'blue'", "2", "{'a':[1]}", "'Red'", "'red' 'red'", "false", "{}"));
    /* the type filters the values */
    ts_check("{'type': 'string', 'enum': ['a', 1, 'b']}", DOCS("'a'", "'b'"), DOCS("1"));
    ts_check("{'type': 'integer', 'enum': [1, 1.5, 2]}", DOCS("1", "2"), DOCS("1.5"));
    ts_check("{'const': 'x\\ny\\'z'}", DOCS("'x\\ny\\'z'"), DOCS("'x\\\\ny\\'z'", "'xy'"));
    ts_check("{'const': []}", DOCS("[]", "[ ]"), DOCS("[1]"));
    ts_check("{'const': {}}", DOCS("{}"), DOCS("{'a':1}"));
    ts_check("{'const': -0.001}", DOCS("-0.001"), DOCS("0"));
}

static void test_any_of(void **state)
{
    (void)state;
    ts_check("{'anyOf': [{'type': 'string', 'maxLength': 3}, {'type': 'integer'}]}",
             DOCS("'abc'", "5"), DOCS("'abcd'", "1.5", "null"));
    ts_check("{'oneOf': [{'type': 'object', 'properties': {'a': {'type': 'integer'}}, "
             "'required': ['a']}, {'type': 'object', 'properties': {'b': {'type': 'string'}}, "
             "'required': ['b']}]}",
             DOCS("{'a': 1}", "{'b': 'x'}"), DOCS("{}", "{'a': 'x'}", "{'a': 1, 'b': 'x'}"));
    ts_check("{'allOf': [{'type': 'integer'}], 'title': 'one'}", DOCS("3"), DOCS("'3'"));
    ts_check("{'anyOf': [{'type': 'null'}]}", DOCS("null"), DOCS("1"));
}

static void test_refs(void **state)
{
    (void)state;
    /* a recursive tree */
    const char *tree = "{'$defs': {'node': {'type': 'object', 'properties': {'value': {'type': "
                       "'integer'}, 'children': {'type': 'array', 'items': {'$ref': "
                       "'#/$defs/node'}}}, 'required': ['value']}}, '$ref': '#/$defs/node'}";
    ts_check(tree,
             DOCS("{'value': 1}", "{'value': 1, 'children': []}",
                  "{'value': 1, 'children': [{'value': 2}, {'value': 3, 'children': [{'value': "
                  "4}]}]}"),
             DOCS("{}", "{'value': 1, 'children': [{}]}",
                  "{'value': 1, 'children': [{'value': "
                  "'x'}]}"));
    /* definitions, Optional[...] the pydantic way, and a reference to the whole schema */
    ts_check("{'type': 'object', 'properties': {'p': {'anyOf': [{'$ref': '#/definitions/P'}, "
             "{'type': 'null'}], 'default': null}}, 'required': ['p'], 'definitions': {'P': "
             "{'type': 'object', 'properties': {'x': {'type': 'number'}}, 'required': ['x'], "
             "'title': 'P'}}}",
             DOCS("{'p': null}", "{'p': {'x': 1.5}}"), DOCS("{}", "{'p': {}}", "{'p': 1}"));
    ts_check("{'type': 'object', 'properties': {'v': {'type': 'integer'}, 'next': {'anyOf': "
             "[{'$ref': '#'}, {'type': 'null'}]}}, 'required': ['v', 'next']}",
             DOCS("{'v': 1, 'next': null}", "{'v': 1, 'next': {'v': 2, 'next': null}}"),
             DOCS("{'v': 1}", "{'v': 1, 'next': {'v': 2}}"));
    /* names that need ~ escapes, and two references to one definition */
    ts_check("{'$defs': {'a/b': {'type': 'integer'}, 'c~d': {'type': 'string'}}, 'type': 'array', "
             "'items': {'anyOf': [{'$ref': '#/$defs/a~1b'}, {'$ref': '#/$defs/c~0d'}, {'$ref': "
             "'#/$defs/a~1b'}]}}",
             DOCS("[1, 'x', 2]"), DOCS("[true]"));
}

/* ==== bounded numbers ========================================================================= */

static uint64_t ts_rng = 0x9E3779B97F4A7C15ULL;
static int64_t ts_rand(int64_t lo, int64_t hi)
{
    ts_rng ^= ts_rng << 13;
    ts_rng ^= ts_rng >> 7;
    ts_rng ^= ts_rng << 17;
    return lo + (int64_t)(ts_rng % (uint64_t)(hi - lo + 1));
}

static void ts_int_value(const grammar *g, const char *schema, int64_t v, int64_t lo, int64_t hi)
{
    char doc[32];
    snprintf(doc, sizeof doc, "%lld", (long long)v);
    bool want = v >= lo && v <= hi;
    if (ts_match(g, doc) != want)
        fail_msg("%s: %s %s", schema, doc, want ? "refused" : "accepted");
}

/* An integer range [lo, hi] (written with the given keywords) against every value near its ends
 * and the powers of ten, and random ones. */
static void ts_int_range(const char *schema, int64_t lo, int64_t hi)
{
    char *text;
    grammar *g = ts_compile(schema, &text);
    for (int64_t d = -40; d <= 40; d++) {
        ts_int_value(g, schema, lo + d, lo, hi);
        ts_int_value(g, schema, hi + d, lo, hi);
    }
    for (int64_t p = 1; p <= 100000000000000LL; p *= 10)
        for (int64_t d = -2; d <= 2; d++) {
            ts_int_value(g, schema, p + d, lo, hi);
            ts_int_value(g, schema, -p + d, lo, hi);
        }
    int64_t span = hi - lo;
    for (int i = 0; i < 3000; i++)
        ts_int_value(g, schema, ts_rand(lo - span / 4 - 10, hi + span / 4 + 10), lo, hi);
    grammar_free(&g);
    free(text);
}

static void test_integer_bounds(void **state)
{
    (void)state;
    static const int64_t ranges[][2] = {
        {0, 100},
        {0, 0},
        {7, 7},
        {19, 2001},
        {-999, -100},
        {-5, 5},
        {123, 123456},
        {-1, 0},
        {1, 999999},
        {-100000, 99999},
        {10, 99},
        {100, 1000},
        {-47, -3},
        {998, 1002},
        {3000, 3999},
        {-314159, 271828},
        {0, 999999999999999LL},
        {-999999999999999LL, -1},
    };
    char schema[160];
    for (size_t i = 0; i < sizeof ranges / sizeof *ranges; i++) {
        snprintf(schema, sizeof schema,
                 "{\"type\": \"integer\", \"minimum\": %lld, \"maximum\": %lld}",
                 (long long)ranges[i][0], (long long)ranges[i][1]);
        ts_int_range(schema, ranges[i][0], ranges[i][1]);
    }
    for (int i = 0; i < 40; i++) { /* random ranges of random sizes */
        int64_t scale = (int64_t)1 << ts_rand(1, 40);
        int64_t a = ts_rand(-scale, scale), b = ts_rand(-scale, scale);
        if (a > b) {
            int64_t t = a;
            a = b;
            b = t;
        }
        snprintf(schema, sizeof schema,
                 "{\"type\": \"integer\", \"minimum\": %lld, \"maximum\": %lld}", (long long)a,
                 (long long)b);
        ts_int_range(schema, a, b);
    }
    /* exclusive bounds (the number form and draft 4's boolean), fractions, one side only */
    ts_int_range("{\"type\": \"integer\", \"exclusiveMinimum\": -5, \"exclusiveMaximum\": 5}", -4,
                 4);
    ts_int_range("{\"type\": \"integer\", \"minimum\": -5, \"exclusiveMinimum\": true, "
                 "\"maximum\": 5, \"exclusiveMaximum\": true}",
                 -4, 4);
    ts_int_range("{\"type\": \"integer\", \"minimum\": 1.5, \"maximum\": 9.99}", 2, 9);
    ts_int_range("{\"type\": \"integer\", \"minimum\": 3, \"exclusiveMinimum\": 3}", 4,
                 999999999999999LL);
    ts_int_range("{\"type\": \"integer\", \"maximum\": -17}", -999999999999999LL, -17);
    ts_int_range("{\"type\": \"integer\", \"minimum\": 0}", 0, 999999999999999LL);
    ts_int_range("{\"type\": \"integer\", \"minimum\": -1e300, \"maximum\": 1e300}",
                 -999999999999999LL, 999999999999999LL);
}

/* A number range against quarter steps written with 0, 1 and 2 decimals. */
static void ts_num_range(double lo, bool lo_open, double hi, bool hi_open, bool has_lo, bool has_hi)
{
    char schema[200] = "{\"type\": \"number\"", *p = schema + strlen(schema);
    if (has_lo)
        p += sprintf(p, ", \"%s\": %g", lo_open ? "exclusiveMinimum" : "minimum", lo);
    if (has_hi)
        p += sprintf(p, ", \"%s\": %g", hi_open ? "exclusiveMaximum" : "maximum", hi);
    strcpy(p, "}");
    char *text;
    grammar *g = ts_compile(schema, &text);
    double from = (has_lo ? lo : hi - 30) - 3, to = (has_hi ? hi : lo + 30) + 3;
    for (double x = from; x <= to; x += 0.25) {
        bool want =
            (!has_lo || (lo_open ? x > lo : x >= lo)) && (!has_hi || (hi_open ? x < hi : x <= hi));
        char doc[3][40];
        snprintf(doc[0], 40, "%.2f", x);
        snprintf(doc[1], 40, "%.3f", x);
        int n = 2;
        if (x == (long)x)
            snprintf(doc[n++], 40, "%ld", (long)x);
        for (int k = 0; k < n; k++) {
            if (!strcmp(doc[k], "-0.00") || !strcmp(doc[k], "-0.000"))
                continue; /* -0: the grammar writes no negative zero */
            if (ts_match(g, doc[k]) != want)
                fail_msg("%s: %s %s\n%s", schema, doc[k], want ? "refused" : "accepted", text);
        }
    }
    grammar_free(&g);
    free(text);
}

static void test_number_bounds(void **state)
{
    (void)state;
    ts_check("{'type': 'number', 'minimum': 0, 'maximum': 10}",
             DOCS("0", "0.5", "10", "10.0", "10.000", "9.999", "3"),
             DOCS("10.5", "-0.1", "11", "1e1", "10.001", "-1"));
    ts_check("{'type': 'number', 'exclusiveMinimum': 0}", DOCS("0.001", "5", "1000000.5"),
             DOCS("0", "0.0", "-0.5", "-0"));
    ts_check("{'type': 'number', 'exclusiveMaximum': 0}", DOCS("-0.5", "-3"),
             DOCS("0", "0.0", "-0", "1"));
    static const struct {
        double lo, hi;
    } r[] = {{0, 10}, {-7, 3}, {-12, -5}, {5, 5}, {0, 0}, {-1, 1}, {98, 102}, {-3, 0}};
    for (size_t i = 0; i < sizeof r / sizeof *r; i++)
        for (int f = 0; f < 4; f++) {
            bool lo_open = f & 1, hi_open = f & 2;
            if (r[i].lo == r[i].hi && (lo_open || hi_open))
                continue; /* empty: refused (test_refused) */
            ts_num_range(r[i].lo, lo_open, r[i].hi, hi_open, true, true);
        }
    ts_num_range(-4, false, 0, false, true, false);
    ts_num_range(-4, true, 0, false, true, false);
    ts_num_range(0, false, 17, false, false, true);
    ts_num_range(0, false, -17, true, false, true);
}

/* ==== descriptive keywords, refusals ========================================================== */

static void test_descriptive(void **state)
{
    (void)state;
    ts_check("{'$schema': 'https://json-schema.org/draft/2020-12/schema', '$id': 'x', 'title': "
             "'T', 'description': 'D', 'type': 'object', '$comment': 'c', 'properties': {'a': "
             "{'type': 'string', 'examples': ['e'], 'default': 'd', 'deprecated': false, "
             "'readOnly': true, 'writeOnly': false}}, 'required': ['a']}",
             DOCS("{'a': 'x'}"), DOCS("{}"));
}

static void test_refused(void **state)
{
    (void)state;
    ts_refused("{'type': 'string', 'pattern': 'a+'}",
               "pattern: regular expressions are not supported");
    ts_refused("{'properties': {'age': {'type': 'integer', 'multipleOf': 2}}}",
               "properties.age.multipleOf: not supported");
    ts_refused("{'properties': {'a': {'items': {'not': {}}}}}",
               "properties.a.items.not: not supported");
    ts_refused("{'patternProperties': {}}", "patternProperties: not supported");
    ts_refused("{'type': 'object', 'minProperties': 1}", "minProperties: not supported");
    ts_refused("{'type': 'number', 'minimum': 0.5}", "minimum: only whole-number bounds");
    ts_refused("{'type': 'number', 'exclusiveMaximum': 2.5}",
               "exclusiveMaximum: only whole-number");
    ts_refused("{'type': 'strin'}", "type: 'strin' is not a JSON Schema type");
    ts_refused("{'type': []}", "type: an empty list");
    ts_refused("{'type': 3}", "type: must be a type name");
    ts_refused("{'$ref': '#/$defs/missing'}", "$ref: '#/$defs/missing' is not defined");
    ts_refused("{'$ref': 'http://example.com/s.json'}", "$ref: 'http://example.com/s.json' only");
    ts_refused("{'$defs': {'a': {'type': 'object'}}, '$ref': '#/$defs/a/properties'}", "only");
    ts_refused("{'$defs': {'a': {'$ref': '#/$defs/b'}, 'b': {'anyOf': [{'$ref': '#/$defs/a'}, "
               "{'type': 'null'}]}}, '$ref': '#/$defs/a'}",
               "left recursion");
    ts_refused("{'anyOf': [{'$ref': '#'}, {'type': 'null'}]}", "left recursion");
    ts_refused("{'$ref': '#/$defs/x', 'type': 'string', '$defs': {'x': {}}}",
               "type: cannot be combined with $ref");
    ts_refused("{'$defs': {'x': {'type': 'string', 'pattern': 'z'}}, '$ref': '#/$defs/x'}",
               "$defs.x.pattern: regular expressions");
    ts_refused("{'allOf': [{'type': 'string'}, {'maxLength': 3}]}", "allOf: only an allOf of one");
    ts_refused("{'anyOf': [{'type': 'string'}], 'type': 'string'}",
               "type: cannot be combined with anyOf");
    ts_refused("{'anyOf': []}", "anyOf: must be a non-empty array");
    ts_refused("{'anyOf': [{'type': 'string'}, {'type': 'integer', 'maximum': 'x'}]}",
               "anyOf[1].maximum: must be a number");
    ts_refused("{'type': 'object', 'properties': {'a': {}}, 'required': ['b']}",
               "required: 'b' is not one of the properties");
    ts_refused("{'type': 'object', 'required': ['b']}", "required: needs properties");
    ts_refused("{'type': 'object', 'properties': {'a': {'type': 'string'}}, "
               "'additionalProperties': {'type': 'string'}}",
               "additionalProperties: a schema next to properties is not supported");
    ts_refused("{'type': 'string', 'format': 'uri'}", "format: 'uri' is not supported");
    ts_refused("{'type': 'string', 'format': 'date', 'maxLength': 10}",
               "format: cannot be combined");
    ts_refused("{'type': 'integer', 'maxLength': 3}", "maxLength: applies to strings");
    ts_refused("{'type': 'string', 'minimum': 3}", "minimum: applies to numbers");
    ts_refused("{'type': 'integer', 'minimum': 5, 'maximum': 4}",
               "minimum: no integer lies within");
    ts_refused("{'type': 'integer', 'exclusiveMinimum': 4, 'exclusiveMaximum': 5}", "no integer");
    ts_refused("{'type': 'number', 'exclusiveMinimum': 5, 'maximum': 5}", "no number lies within");
    ts_refused("{'type': 'integer', 'minimum': 1e16}", "minimum: no integer of at most 15");
    ts_refused("{'type': 'integer', 'exclusiveMaximum': true}",
               "exclusiveMaximum: true needs maximum");
    ts_refused("{'items': [{'type': 'string'}]}", "items: a list of schemas");
    ts_refused("{'type': 'array', 'uniqueItems': true}", "uniqueItems: only false");
    ts_refused("{'type': 'array', 'minItems': 3, 'maxItems': 2}", "minItems: is above maxItems");
    ts_refused("{'type': 'string', 'minLength': 3, 'maxLength': 2}",
               "minLength: is above maxLength");
    ts_refused("{'minLength': -1}", "minLength: must be a non-negative integer");
    ts_refused("{'maxItems': 1.5}", "maxItems: must be a non-negative integer");
    ts_refused("{'type': 'string', 'minLength': 20000000}", "minLength: above 16777216");
    ts_refused("false", "schema: the schema false allows no value");
    ts_refused("{'properties': {'a': false}}", "properties.a: the schema false");
    ts_refused("{'properties': {'a': 3}}", "properties.a: a schema must be an object");
    ts_refused("{'enum': []}", "enum: must be a non-empty array");
    ts_refused("{'type': 'string', 'enum': [1, 2]}", "enum: no value has the schema's type");
    ts_refused("{'enum': [1], 'const': 1}", "const: cannot be combined with enum");
    ts_refused("{'enum': [1], 'minimum': 0}", "minimum: cannot be combined with enum");
    ts_refused("{'type': 'object', 'properties': {'a': {}, 'a': {}}}",
               "properties: 'a' is listed twice");
    ts_refused("{'nullable': true}", "nullable: not supported");

    /* nesting deeper than 64 */
    char deep[2048] = "", *p = deep;
    for (int i = 0; i < 70; i++)
        p += sprintf(p, "{'items': ");
    p += sprintf(p, "{}");
    for (int i = 0; i < 70; i++)
        *p++ = '}';
    *p = 0;
    ts_refused(deep, "nested deeper than 64");
}

/* ==== json_object and tool calls ============================================================== */

static void test_json_object(void **state)
{
    (void)state;
    char *text = schema_json_object_grammar();
    assert_non_null(text);
    grammar *g = ts_parse(text, "json_object");
    const char *const yes[] = {"{}", "{\"a\": 1}", "{\"a\": {\"b\": [1, \"x\", null]}}",
                               "{\n  \"k\": true\n}\n"};
    const char *const no[] = {"[]", "\"x\"", "1", "{\"a\":}", "{", "{} {}", "{\"a\":1,}"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
        if (!ts_match(g, yes[i]))
            fail_msg("json_object refused %s", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof *no; i++)
        if (ts_match(g, no[i]))
            fail_msg("json_object accepted %s", no[i]);
    /* nesting: 40 levels of objects and arrays */
    char deep[512], *p = deep;
    for (int i = 0; i < 20; i++)
        p += sprintf(p, "{\"a\": [");
    p += sprintf(p, "1");
    for (int i = 0; i < 20; i++)
        p += sprintf(p, "]}");
    assert_true(ts_match(g, deep));
    grammar_free(&g);
    free(text);
}

static const char *TOOLS =
    "[{'type': 'function', 'function': {'name': 'get_weather', 'description': 'The weather', "
    "'parameters': {'type': 'object', 'properties': {'city': {'type': 'string', 'maxLength': "
    "20}, 'unit': {'type': 'string', 'enum': ['celsius', 'fahrenheit']}}, 'required': ['city', "
    "'unit']}}}, "
    "{'type': 'function', 'function': {'name': 'get_time', 'parameters': {'type': 'object', "
    "'properties': {'city': {'$ref': '#/$defs/city'}}, 'required': ['city'], '$defs': {'city': "
    "{'type': 'string'}}}}}, "
    "{'type': 'function', 'function': {'name': 'ping', 'strict': true}}]";

/* The tool-call grammar of tools (written with '), or NULL with err. */
static char *ts_tool_text(const char *tools, const char *only, char *err, size_t errlen)
{
    char *js = ts_dq(tools);
    cJSON *t = cJSON_Parse(js);
    if (!t)
        fail_msg("the test's tools are not JSON: %s", js);
    char *text = schema_tool_call_grammar(t, only, err, errlen);
    cJSON_Delete(t);
    free(js);
    return text;
}

static void ts_tool_check(const char *only, const char *const *valid, const char *const *invalid)
{
    char err[256];
    char *text = ts_tool_text(TOOLS, only, err, sizeof err);
    if (!text)
        fail_msg("tools refused: %s", err);
    grammar *g = ts_parse(text, "tools");
    for (; *valid; valid++) {
        char *doc = ts_dq(*valid);
        if (!ts_match(g, doc))
            fail_msg("tool call %s refused\n%s", doc, text);
        free(doc);
    }
    for (; *invalid; invalid++) {
        char *doc = ts_dq(*invalid);
        if (ts_match(g, doc))
            fail_msg("tool call %s accepted\n%s", doc, text);
        free(doc);
    }
    grammar_free(&g);
    free(text);
}

static void ts_tool_refused(const char *tools, const char *only, const char *want)
{
    char err[256] = "";
    char *text = ts_tool_text(tools, only, err, sizeof err);
    if (text)
        fail_msg("tools %s accepted:\n%s", tools, text);
    if (!strstr(err, want))
        fail_msg("tools %s: the error '%s' does not say '%s'", tools, err, want);
}

static void test_tool_calls(void **state)
{
    (void)state;
    ts_tool_check(NULL,
                  DOCS("{'name': 'get_weather', 'arguments': {'city': 'Paris', 'unit': 'celsius'}}",
                       "{'name': 'get_time', 'arguments': {'city': 'Oslo'}}",
                       "{'name': 'get_time', 'arguments': { 'city' : 'Oslo' }}\n",
                       "{'name': 'ping', 'arguments': {}}"),
                  DOCS("{'name': 'get_weather', 'arguments': {'city': 'Paris'}}",
                       "{'name': 'get_weather', 'arguments': {'city': 'Paris', 'unit': 'kelvin'}}",
                       "{'name': 'get_date', 'arguments': {'city': 'Oslo'}}",
                       "{'name':'get_time','arguments':{'city':'Oslo'}}", /* the layout is fixed */
                       "{'arguments': {'city': 'Oslo'}, 'name': 'get_time'}",
                       "{'name': 'ping', 'arguments': {'x': 1}}",
                       "{'name': 'get_time', 'arguments': {'city': 'Oslo'}} x"));
    ts_tool_check(
        "get_time", DOCS("{'name': 'get_time', 'arguments': {'city': 'Oslo'}}"),
        DOCS("{'name': 'get_weather', 'arguments': {'city': 'Paris', 'unit': 'celsius'}}"));
    ts_tool_refused(TOOLS, "nope", "tools: no function is named 'nope'");
    ts_tool_refused("[]", NULL, "tools: must be a non-empty array");
    ts_tool_refused("[{'type': 'function'}]", NULL, "tools[0].function: must be an object");
    ts_tool_refused("[{'type': 'retrieval', 'function': {'name': 'x'}}]", NULL,
                    "tools[0].type: only \"function\" tools");
    ts_tool_refused("[{'type': 'function', 'function': {'name': 'a'}}, {'type': 'function', "
                    "'function': {'description': 'no name'}}]",
                    NULL, "tools[1].function.name: must be a non-empty string");
    ts_tool_refused("[{'type': 'function', 'function': {'name': 'a'}}, {'type': 'function', "
                    "'function': {'name': 'a'}}]",
                    NULL, "tools[1].function.name: 'a' names two functions");
    ts_tool_refused("[{'type': 'function', 'function': {'name': 'a'}}, {'type': 'function', "
                    "'function': {'name': 'b', 'parameters': {'type': 'object', 'properties': "
                    "{'city': {'type': 'string', 'pattern': 'x'}}}}}]",
                    NULL, "tools[1].function.parameters.properties.city.pattern: regular");
    ts_tool_refused("[{'type': 'function', 'function': {'name': 'b', 'parameters': {'$ref': "
                    "'#/$defs/q'}}}]",
                    NULL, "tools[0].function.parameters.$ref: '#/$defs/q' is not defined");
}

/* A schema of many optional keys, long documents: the grammar stays quick to follow. */
static void test_many_keys(void **state)
{
    (void)state;
    char schema[8192] = "{'type': 'object', 'properties': {", *p = schema + strlen(schema);
    for (int i = 0; i < 60; i++)
        p += sprintf(p, "%s'key%d': {'type': %s}", i ? ", " : "", i,
                     i % 3 == 0   ? "'integer'"
                     : i % 3 == 1 ? "'string'"
                                  : "'boolean'");
    strcpy(p, "}, 'required': ['key59']}");
    char doc[8192] = "{", *d = doc + 1;
    for (int i = 0; i < 60; i += 2)
        d += sprintf(d, "%s'key%d': %s", i ? ", " : "", i,
                     i % 3 == 0   ? "123"
                     : i % 3 == 1 ? "'some text'"
                                  : "true");
    strcpy(d, ", 'key59': false}");
    const char *const valid[] = {doc, "{'key59': true}", "{'key0': 1, 'key59': true}", NULL};
    ts_check(schema, valid,
             DOCS("{}", "{'key1': 'a'}", "{'key59': true, 'key0': 1}", "{'key59': 'x'}"));
}

/* ==== random schemas ========================================================================= */

static cJSON *ts_random_schema(int depth);

static cJSON *ts_random_value(int depth)
{
    switch (ts_rand(0, depth > 2 ? 4 : 6)) {
    case 0: return cJSON_CreateNull();
    case 1: return cJSON_CreateBool(ts_rand(0, 1));
    case 2: return cJSON_CreateNumber((double)ts_rand(-3000, 3000) / (ts_rand(0, 1) ? 1 : 8));
    case 3: return cJSON_CreateString(ts_rand(0, 1) ? "a\"b" : "caf\xC3\xA9\n");
    case 4: return cJSON_CreateString("");
    case 5: {
        cJSON *a = cJSON_CreateArray();
        for (int i = ts_rand(0, 3); i > 0; i--)
            cJSON_AddItemToArray(a, ts_random_value(depth + 1));
        return a;
    }
    default: {
        cJSON *o = cJSON_CreateObject();
        for (int i = ts_rand(0, 3); i > 0; i--)
            cJSON_AddItemToObject(o, ts_rand(0, 1) ? "k" : "k2", ts_random_value(depth + 1));
        return o;
    }
    }
}

static cJSON *ts_random_list(int depth, int max)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = ts_rand(0, max); i > 0; i--)
        cJSON_AddItemToArray(a, ts_random_schema(depth + 1));
    return a;
}

/* A schema of random keywords with random (sometimes wrong) values. */
static cJSON *ts_random_schema(int depth)
{
    static const char *const types[] = {"string", "number", "integer", "boolean",
                                        "null",   "object", "array",   "nope"};
    static const char *const refs[] = {"#",          "#/$defs/a", "#/$defs/b", "#/definitions/a",
                                       "#/$defs/zz", "x"};
    static const char *const formats[] = {"date",  "time", "date-time", "uuid",
                                          "email", "ipv4", "uri"};
    static const char *const names[] = {"a", "b", "c", "key", "a\"b"};
    long r = ts_rand(0, 20);
    if (r == 0)
        return cJSON_CreateBool(ts_rand(0, 5) > 0);
    if (r == 1 && depth)
        return cJSON_CreateNumber(3);
    cJSON *s = cJSON_CreateObject();
    for (int k = ts_rand(0, depth > 3 ? 1 : 4); k > 0; k--) {
        switch (ts_rand(0, 24)) {
        case 0: cJSON_AddStringToObject(s, "type", types[ts_rand(0, 7)]); break;
        case 1: {
            cJSON *t = cJSON_AddArrayToObject(s, "type");
            for (int i = ts_rand(0, 3); i > 0; i--)
                cJSON_AddItemToArray(t, cJSON_CreateString(types[ts_rand(0, 7)]));
            break;
        }
        case 2: {
            cJSON *p = cJSON_AddObjectToObject(s, "properties");
            for (int i = ts_rand(0, 4); i > 0; i--)
                cJSON_AddItemToObject(p, names[ts_rand(0, 4)], ts_random_schema(depth + 1));
            break;
        }
        case 3: {
            cJSON *q = cJSON_AddArrayToObject(s, "required");
            for (int i = ts_rand(0, 2); i > 0; i--)
                cJSON_AddItemToArray(q, cJSON_CreateString(names[ts_rand(0, 4)]));
            break;
        }
        case 4:
            cJSON_AddItemToObject(s, "additionalProperties",
                                  ts_rand(0, 1) ? cJSON_CreateBool(ts_rand(0, 1))
                                                : ts_random_schema(depth + 1));
            break;
        case 5: cJSON_AddItemToObject(s, "items", ts_random_schema(depth + 1)); break;
        case 6:
        case 7: {
            static const char *const counts[] = {"minItems", "maxItems", "minLength", "maxLength"};
            static const long values[] = {-1, 0, 1, 2, 3, 4095, 4096, 4097, 9000, 20000000};
            double v = (double)values[ts_rand(0, 9)] + (ts_rand(0, 9) ? 0 : 0.5);
            cJSON_AddNumberToObject(s, counts[ts_rand(0, 3)], v);
            break;
        }
        case 8: cJSON_AddItemToObject(s, "enum", ts_random_list(depth + 2, 3)); break;
        case 9: cJSON_AddItemToObject(s, "const", ts_random_value(depth)); break;
        case 10: cJSON_AddItemToObject(s, "anyOf", ts_random_list(depth, 3)); break;
        case 11: cJSON_AddItemToObject(s, "oneOf", ts_random_list(depth, 3)); break;
        case 12: cJSON_AddItemToObject(s, "allOf", ts_random_list(depth, 2)); break;
        case 13:
        case 14: cJSON_AddStringToObject(s, "$ref", refs[ts_rand(0, 5)]); break;
        case 15: cJSON_AddStringToObject(s, "format", formats[ts_rand(0, 6)]); break;
        case 16:
        case 17: {
            static const char *const bounds[] = {"minimum", "maximum", "exclusiveMinimum",
                                                 "exclusiveMaximum"};
            static const double values[] = {-1e16, -100, -1.5, 0, 0.5, 1, 7, 99, 1e15, 3e300};
            if (ts_rand(0, 5))
                cJSON_AddNumberToObject(s, bounds[ts_rand(0, 3)], values[ts_rand(0, 9)]);
            else
                cJSON_AddBoolToObject(s, bounds[ts_rand(2, 3)], ts_rand(0, 1));
            break;
        }
        case 18: cJSON_AddStringToObject(s, "title", "t"); break;
        case 19:
            if (!depth) {
                cJSON *d = cJSON_AddObjectToObject(s, ts_rand(0, 1) ? "$defs" : "definitions");
                cJSON_AddItemToObject(d, "a", ts_random_schema(depth + 1));
                cJSON_AddItemToObject(d, "b", ts_random_schema(depth + 1));
            }
            break;
        case 20: cJSON_AddStringToObject(s, "pattern", "a+"); break;
        case 21: cJSON_AddNumberToObject(s, "multipleOf", 2); break;
        case 22: cJSON_AddBoolToObject(s, "uniqueItems", ts_rand(0, 1)); break;
        default: cJSON_AddStringToObject(s, "type", types[ts_rand(0, 6)]); break;
        }
    }
    return s;
}

/* Any schema is either refused with a message or turned into a grammar that compiles: the
 * server never hands the engine a grammar of its own that the engine refuses. */
static void test_random_schemas(void **state)
{
    (void)state;
    int refused = 0, accepted = 0;
    for (int i = 0; i < 4000; i++) {
        cJSON *s = ts_random_schema(0);
        char err[256] = "";
        char *text = schema_to_grammar(s, err, sizeof err);
        if (!text) {
            if (!err[0] || !strcmp(err, "out of memory")) {
                char *js = cJSON_PrintUnformatted(s);
                fail_msg("schema %s refused without a reason ('%s')", js, err);
            }
            refused++;
        } else {
            grammar *g = grammar_parse(text, strlen(text), err, sizeof err);
            if (!g) {
                char *js = cJSON_PrintUnformatted(s);
                fail_msg("schema %s: its grammar does not compile: %s\n%s", js, err, text);
            }
            grammar_free(&g);
            free(text);
            accepted++;
        }
        cJSON_Delete(s);
    }
    print_message("random schemas: %d made grammars that compile, %d refused\n", accepted, refused);
    assert_true(accepted > 400 && refused > 400); /* both paths were exercised */
}

/* unit_schema --match SCHEMA_FILE: the grammar of the schema in the file judges documents, one
 * per line of stdin written as a JSON string; prints 1 (accepted) or 0 per line. Exit 2 when the
 * schema is refused. tests/reference/test_schema_jsonschema.py holds it against jsonschema. */
static int ts_match_main(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 2;
    }
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *schema = cJSON_Parse(buf);
    char err[256] = "not JSON";
    char *text = schema ? schema_to_grammar(schema, err, sizeof err) : NULL;
    grammar *g = text ? grammar_parse(text, strlen(text), err, sizeof err) : NULL;
    cJSON_Delete(schema);
    if (!g) {
        printf("refused: %s\n", err);
        free(text);
        return 2;
    }
    static char line[1 << 20];
    while (fgets(line, sizeof line, stdin)) {
        cJSON *doc = cJSON_Parse(line);
        bool ok =
            cJSON_IsString(doc) && grammar_matches(g, doc->valuestring, strlen(doc->valuestring));
        printf("%d\n", ok);
        cJSON_Delete(doc);
    }
    grammar_free(&g);
    free(text);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--match"))
        return ts_match_main(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars),        cmocka_unit_test(test_whitespace),
        cmocka_unit_test(test_object_keys),    cmocka_unit_test(test_open_objects),
        cmocka_unit_test(test_arrays),         cmocka_unit_test(test_strings),
        cmocka_unit_test(test_formats),        cmocka_unit_test(test_enum_const),
        cmocka_unit_test(test_any_of),         cmocka_unit_test(test_refs),
        cmocka_unit_test(test_integer_bounds), cmocka_unit_test(test_number_bounds),
        cmocka_unit_test(test_descriptive),    cmocka_unit_test(test_refused),
        cmocka_unit_test(test_json_object),    cmocka_unit_test(test_tool_calls),
        cmocka_unit_test(test_many_keys),      cmocka_unit_test(test_random_schemas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
