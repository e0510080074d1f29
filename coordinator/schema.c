/*
 * coordinator/schema.c — JSON Schema to grammar text (interface and the shape of the grammars:
 * coordinator/schema.h; the supported keywords: docs/http-api.md).
 *
 * How a schema becomes grammar. The schema is walked once, depth first. Each schema node is
 * written as one grammar item: a helper rule's name for the plain cases (`string`, `integer`,
 * `value` for "anything"), a literal, or a rule of its own named after where it sits
 * (`age-7` for properties.age, with the path as a comment above it). Items never carry
 * whitespace; the container that holds them writes `ws` after each, so that no two `ws` meet and
 * each space has one parse: the grammar engine follows every parse at once, so an ambiguous
 * grammar costs it time and memory on every character.
 *
 * Objects with properties list their members in the schema's order. Each member is a rule
 * `"key" ws ":" ws value ws`; a chain of tail rules says what may follow member j ("," and member
 * j+1, which may be left out unless required, then the tail of j+1), and the object is
 * "{" ws, one alternative per property that may come first (those up to the first required one),
 * then "}". Every member starts with its own key, so the engine keeps a parse per optional key
 * only until the key's text tells them apart.
 *
 * Numbers with bounds are written as ranges of digit strings: a range of integers of the same
 * length is split at its first differing digit (the low end's digit and the rest of its range,
 * the first digits strictly between followed by any digits, the high end's digit and the rest of
 * its range), which gives alternatives that begin differently. A bounded number is a sign and an
 * integer part in such a range with a fraction that is free, or, at the range's ends, zero or
 * nonzero as the bound's kind asks.
 *
 * Lengths and item counts past the grammar's repetition bound (4096) are counted in blocks of
 * 4096 (sc_repeat).
 *
 * $ref targets become rules written once each (a worklist, so recursive schemas are rules that
 * refer to each other); a target that can reach itself through $ref, anyOf, oneOf and allOf
 * alone, before any JSON text, is refused (it would be left recursion, which the grammar engine
 * refuses too, with a less helpful message).
 */
#define _GNU_SOURCE
#include "coordinator/schema.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/utf8.h"

#define SC_CAP 999999999999999LL /* the largest integer part a number may have: 15 digits */
#define SC_REP 4096              /* the grammar's largest repetition bound */
#define SC_LEN_MAX (1L << 24)    /* a length bound above this is no bound (no answer is so long) */
#define SC_NEST 64               /* schemas nested deeper are refused */
#define SC_LEFT_VISITS 4096      /* steps the left-recursion check may take */

/* ==== the fixed helper rules ================================================================== */

enum {
    H_WS,
    H_VALUE,
    H_OBJECT,
    H_MEMBER,
    H_ARRAY,
    H_STRING,
    H_CHAR,
    H_UNICODE,
    H_HEX,
    H_NUMBER,
    H_INTEGER,
    H_FRAC,
    H_EXP,
    H_ZFRAC,
    H_NZFRAC,
    H_BOOLEAN,
    H_DATE,
    H_LEAPYEAR,
    H_TIME,
    H_DATETIME,
    H_UUID,
    H_EMAIL,
    H_LABEL,
    H_IPV4,
    H_OCTET,
    H_COUNT
};

#define B(h) (1u << (h))

/* Written after the schema's own rules, each once and only when used (with what it uses). The
 * whitespace rule bounds a gap between tokens to 21 characters, so that a model cannot run away
 * in whitespace; strings exclude raw control characters and pair \u surrogates. */
static const struct {
    const char *name, *body;
    uint32_t deps;
} SC_HELPERS[H_COUNT] = {
    [H_WS] = {"ws", "| \" \" | \"\\n\" [ \\t]{0,20}", 0},
    [H_VALUE] = {"value", "object | array | string | number | \"true\" | \"false\" | \"null\"",
                 B(H_OBJECT) | B(H_ARRAY) | B(H_STRING) | B(H_NUMBER)},
    [H_OBJECT] = {"object", "\"{\" ws ( member ( \",\" ws member )* )? \"}\"",
                  B(H_WS) | B(H_MEMBER)},
    [H_MEMBER] = {"member", "string ws \":\" ws value ws", B(H_STRING) | B(H_WS) | B(H_VALUE)},
    [H_ARRAY] = {"array", "\"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"",
                 B(H_WS) | B(H_VALUE)},
    [H_STRING] = {"string", "\"\\\"\" char* \"\\\"\"", B(H_CHAR)},
    [H_CHAR] = {"char", "[^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" unicode )",
                B(H_UNICODE)},
    [H_UNICODE] = {"unicode",
                   "[0-9a-cA-CefEF] hex{3} | [dD] [0-7] hex{2} "
                   "| [dD] [89abAB] hex{2} \"\\\\u\" [dD] [c-fC-F] hex{2}",
                   B(H_HEX)},
    [H_HEX] = {"hex", "[0-9a-fA-F]", 0},
    [H_NUMBER] = {"number", "integer frac? exp?", B(H_INTEGER) | B(H_FRAC) | B(H_EXP)},
    [H_INTEGER] = {"integer", "\"-\"? ( \"0\" | [1-9] [0-9]{0,14} )", 0},
    [H_FRAC] = {"frac", "\".\" [0-9]{1,15}", 0},
    [H_EXP] = {"exp", "[eE] [-+]? [0-9]{1,3}", 0},
    [H_ZFRAC] = {"zfrac", "| \".\" \"0\"{1,15}", 0},
    [H_NZFRAC] = {"nzfrac", "\".\" \"0\"{0,14} [1-9] [0-9]{0,14}", 0},
    [H_BOOLEAN] = {"boolean", "\"true\" | \"false\"", 0},
    /* RFC 3339 full-date, days per month and leap years included */
    [H_DATE] =
        {"date",
         "[0-9]{4} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] "
         "| \"3\" [01] ) | ( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" "
         ") | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) ) | leapyear \"-02-29\"",
         B(H_LEAPYEAR)},
    [H_LEAPYEAR] = {"leapyear",
                    "[0-9]{2} ( \"0\" [48] | [2468] [048] | [13579] [26] ) "
                    "| ( \"0\" [48] | [2468] [048] | [13579] [26] | \"00\" ) \"00\"",
                    0},
    /* RFC 3339 full-time: the offset is required */
    [H_TIME] =
        {"time",
         "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] "
         "( \".\" [0-9]{1,9} )? ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )",
         0},
    [H_DATETIME] = {"datetime", "date \"T\" time", B(H_DATE) | B(H_TIME)},
    [H_UUID] = {"uuid", "hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}", B(H_HEX)},
    [H_EMAIL] = {"email", "[A-Za-z0-9._%+-]{1,64} \"@\" label ( \".\" label ){1,8}", B(H_LABEL)},
    [H_LABEL] = {"label", "[A-Za-z0-9] ( [A-Za-z0-9-]{0,61} [A-Za-z0-9] )?", 0},
    [H_IPV4] = {"ipv4", "octet \".\" octet \".\" octet \".\" octet", B(H_OCTET)},
    [H_OCTET] = {"octet", "\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9]{2} | [1-9] [0-9] | [0-9]",
                 0},
};

static const struct {
    const char *format;
    int helper;
} SC_FORMATS[] = {
    {"date", H_DATE}, {"time", H_TIME},   {"date-time", H_DATETIME},
    {"uuid", H_UUID}, {"email", H_EMAIL}, {"ipv4", H_IPV4},
};

/* ==== keywords ================================================================================ */

enum {
    T_NULL = 1,
    T_BOOLEAN = 2,
    T_INTEGER = 4,
    T_NUMBER = 8,
    T_STRING = 16,
    T_ARRAY = 32,
    T_OBJECT = 64
};
static const char *const SC_TYPE_NAMES[] = {"null",   "boolean", "integer", "number",
                                            "string", "array",   "object"};
#define SC_N_TYPES 7

/* Annotations: they say nothing about which documents are valid. */
static const char *const SC_DESCRIPTIVE[] = {
    "title",      "description", "$schema",   "$id",   "examples",    "default", "$comment",
    "deprecated", "readOnly",    "writeOnly", "$defs", "definitions", NULL};

static const char *const SC_COMBINERS[] = {"type",  "enum",  "const", "anyOf",
                                           "oneOf", "allOf", "$ref",  NULL};

/* The keywords that constrain one kind of value, and the types they apply to. */
static const struct {
    const char *kw;
    unsigned types;
    const char *kind;
} SC_TYPED[] = {
    {"properties", T_OBJECT, "objects"},
    {"required", T_OBJECT, "objects"},
    {"additionalProperties", T_OBJECT, "objects"},
    {"items", T_ARRAY, "arrays"},
    {"minItems", T_ARRAY, "arrays"},
    {"maxItems", T_ARRAY, "arrays"},
    {"uniqueItems", T_ARRAY, "arrays"},
    {"minLength", T_STRING, "strings"},
    {"maxLength", T_STRING, "strings"},
    {"format", T_STRING, "strings"},
    {"minimum", T_INTEGER | T_NUMBER, "numbers"},
    {"maximum", T_INTEGER | T_NUMBER, "numbers"},
    {"exclusiveMinimum", T_INTEGER | T_NUMBER, "numbers"},
    {"exclusiveMaximum", T_INTEGER | T_NUMBER, "numbers"},
};
#define SC_N_TYPED (sizeof SC_TYPED / sizeof *SC_TYPED)

static bool sc_in(const char *const *list, const char *s)
{
    for (; *list; list++)
        if (!strcmp(*list, s))
            return true;
    return false;
}

static const cJSON *sc_field(const cJSON *obj, const char *name)
{
    return cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, name) : NULL;
}

/* ==== the converter's state =================================================================== */

typedef struct {
    char *name;
    char *where; /* the schema path the rule stands for (a comment above it), or NULL */
    char *body;  /* NULL until written */
} sc_rule;

typedef struct {
    const cJSON *schema; /* what a $ref points at */
    char *path;          /* where that is, for errors inside it */
    int rule;
    bool written;
} sc_def;

typedef struct {
    const cJSON *doc; /* the schema "#" means: where $ref looks */
    size_t doc_plen;  /* the path's length at doc */
    sc_rule *rules;
    size_t n_rules, cap_rules;
    sc_def *defs;
    size_t n_defs, cap_defs;
    uint32_t helpers;
    char path[512]; /* where the walk is, e.g. "properties.tags.items" */
    size_t plen;
    int depth;
    char *err;
    size_t errlen;
    bool failed;
} sc_ctx;

static void sc_init(sc_ctx *c, const cJSON *doc, char *err, size_t errlen)
{
    *c = (sc_ctx){.doc = doc, .err = err, .errlen = errlen};
    if (err && errlen)
        err[0] = 0;
}

static void sc_free(sc_ctx *c)
{
    for (size_t i = 0; i < c->n_rules; i++) {
        free(c->rules[i].name);
        free(c->rules[i].where);
        free(c->rules[i].body);
    }
    for (size_t i = 0; i < c->n_defs; i++)
        free(c->defs[i].path);
    free(c->rules);
    free(c->defs);
}

/* "path.keyword: what" into err (only the first failure is kept); -1. */
static int __attribute__((format(printf, 3, 4)))
sc_fail(sc_ctx *c, const char *kw, const char *fmt, ...)
{
    if (c->failed)
        return -1;
    c->failed = true;
    if (!c->err || !c->errlen)
        return -1;
    /* a long path keeps its end, where the trouble is */
    const char *path = c->plen > 120 ? c->path + c->plen - 117 : c->path;
    int n = snprintf(c->err, c->errlen, "%s%s%s%s: ", c->plen > 120 ? "..." : "", path,
                     c->plen && kw ? "." : "",
                     kw        ? kw
                     : c->plen ? ""
                               : "schema");
    if (n >= 0 && (size_t)n < c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    /* one line whatever the schema's names and values hold: control bytes become spaces */
    for (char *q = c->err; *q; q++)
        if ((unsigned char)*q < 0x20 || *q == 0x7f)
            *q = ' ';
    return -1;
}

static int sc_oom(sc_ctx *c)
{
    if (!c->failed && c->err && c->errlen)
        snprintf(c->err, c->errlen, "out of memory");
    c->failed = true;
    return -1;
}

/* Appends a path segment (".key", or "[i]" when key is NULL); returns the length to go back to. */
static size_t sc_push(sc_ctx *c, const char *key, int index)
{
    size_t old = c->plen;
    size_t room = sizeof c->path - c->plen;
    int n = key ? snprintf(c->path + c->plen, room, "%s%s", c->plen ? "." : "", key)
                : snprintf(c->path + c->plen, room, "[%d]", index);
    c->plen = n < 0 ? c->plen : (size_t)n < room ? c->plen + (size_t)n : sizeof c->path - 1;
    return old;
}

static void sc_pop(sc_ctx *c, size_t len)
{
    c->plen = len;
    c->path[len] = 0;
}

static void sc_use(sc_ctx *c, int h)
{
    if (c->helpers & B(h))
        return;
    c->helpers |= B(h);
    for (int d = 0; d < H_COUNT; d++)
        if (SC_HELPERS[h].deps & B(d))
            sc_use(c, d);
}

/* Writes a helper's name as an item of e. */
static void sc_helper(sc_ctx *c, strbuf *e, int h)
{
    sc_use(c, h);
    strbuf_printf(e, "%s", SC_HELPERS[h].name);
}

/* Appends " | " before every alternative but the first (*count counts them). */
static void sc_sep(strbuf *e, int *count)
{
    if ((*count)++)
        strbuf_add(e, " | ", 3);
}

/* ==== rules =================================================================================== */

/* A new rule with its body to come: named `name` exactly, or after hint ("root" when both are
 * NULL); -1 when out of memory. Generated names are [A-Za-z0-9_]+ "-" number, so they meet
 * neither the helpers' names nor those with two dashes (str-0-24). */
static int sc_rule_new(sc_ctx *c, const char *name, const char *hint)
{
    if (c->failed)
        return -1;
    if (buf_grow((void **)&c->rules, &c->cap_rules, c->n_rules + 1, sizeof *c->rules, 64))
        return sc_oom(c);
    char buf[64];
    bool shared = name != NULL; /* a named rule may serve many places: no comment */
    if (!name && hint) {
        size_t n = 0;
        for (const char *p = hint; *p && n < 24; p++)
            buf[n++] =
                (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')
                    ? *p
                    : '_';
        if (!n)
            buf[n++] = 's';
        snprintf(buf + n, sizeof buf - n, "-%zu", c->n_rules);
        name = buf;
    }
    sc_rule *r = &c->rules[c->n_rules];
    *r = (sc_rule){.name = strdup(name ? name : "root")};
    if (c->plen && !shared) {
        r->where = strdup(c->path);
        for (char *p = r->where; p && *p; p++) /* a comment is one line */
            if ((unsigned char)*p < 0x20)
                *p = '?';
    }
    if (!r->name || (c->plen && !shared && !r->where)) {
        free(r->name);
        free(r->where);
        return sc_oom(c);
    }
    return (int)c->n_rules++;
}

static int sc_rule_find(const sc_ctx *c, const char *name)
{
    for (size_t i = 0; i < c->n_rules; i++)
        if (!strcmp(c->rules[i].name, name))
            return (int)i;
    return -1;
}

/* Gives rule r the text of b as its body (b is emptied). */
static int sc_rule_set(sc_ctx *c, int r, strbuf *b)
{
    if (b->oom) {
        strbuf_free(b);
        return sc_oom(c);
    }
    if (r < 0 || c->failed) {
        strbuf_free(b);
        return -1;
    }
    c->rules[r].body = b->p ? b->p : strdup("");
    *b = (strbuf){0};
    return c->rules[r].body ? 0 : sc_oom(c);
}

/* The whole grammar text: the rules in the order they were made (root first), then the helpers. */
static char *sc_assemble(sc_ctx *c)
{
    if (c->failed)
        return NULL;
    strbuf out = {0};
    strbuf_printf(&out, "# JSON Schema as a grammar (coordinator/schema.c)\n");
    for (size_t i = 0; i < c->n_rules; i++) {
        if (c->rules[i].where)
            strbuf_printf(&out, "# %s\n", c->rules[i].where);
        strbuf_printf(&out, "%s ::= %s\n", c->rules[i].name,
                      c->rules[i].body ? c->rules[i].body : "");
    }
    for (int h = 0; h < H_COUNT; h++)
        if (c->helpers & B(h))
            strbuf_printf(&out, "%s ::= %s\n", SC_HELPERS[h].name, SC_HELPERS[h].body);
    if (out.oom) {
        strbuf_free(&out);
        sc_oom(c);
        return NULL;
    }
    return out.p;
}

/* ==== literals ================================================================================ */

/* Appends s[0..n) as a grammar literal; -1 when it is not valid UTF-8. */
static int sc_lit(strbuf *e, const char *s, size_t n)
{
    strbuf_add(e, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            char esc[2] = {'\\', (char)ch};
            strbuf_add(e, esc, 2);
            i++;
        } else if (ch < 0x20 || ch == 0x7f) {
            strbuf_printf(e, "\\x%02X", ch);
            i++;
        } else {
            size_t k = ch < 0x80 ? 1 : utf8_char((const unsigned char *)s + i, n - i);
            if (!k)
                return -1;
            strbuf_add(e, s + i, k);
            i += k;
        }
    }
    strbuf_add(e, "\"", 1);
    return 0;
}

/* Appends the JSON text of string s (the escapes a JSON writer must use, nothing more). */
static void sc_json_string(strbuf *b, const char *s)
{
    strbuf_add(b, "\"", 1);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        const char *esc = ch == '"'    ? "\\\""
                          : ch == '\\' ? "\\\\"
                          : ch == '\b' ? "\\b"
                          : ch == '\f' ? "\\f"
                          : ch == '\n' ? "\\n"
                          : ch == '\r' ? "\\r"
                          : ch == '\t' ? "\\t"
                                       : NULL;
        if (esc)
            strbuf_add(b, esc, strlen(esc));
        else if (ch < 0x20)
            strbuf_printf(b, "\\u%04x", ch);
        else
            strbuf_add(b, s, 1);
    }
    strbuf_add(b, "\"", 1);
}

/* Appends the grammar literal of string s's JSON text; -1 when s is not valid UTF-8. */
static int sc_string_lit(strbuf *e, const char *s)
{
    strbuf j = {0};
    sc_json_string(&j, s);
    if (j.oom) {
        e->oom = true;
        return 0;
    }
    int rc = sc_lit(e, j.p, j.len);
    strbuf_free(&j);
    return rc;
}

/* The JSON text of a number: whole numbers without a fraction, others in the fewest digits that
 * read back the same. */
static void sc_json_number(char *buf, size_t cap, double d)
{
    if (d == 0)
        d = 0; /* -0 is written 0 */
    if (d == floor(d) && fabs(d) < 1e15) {
        snprintf(buf, cap, "%.0f", d);
        return;
    }
    snprintf(buf, cap, "%.15g", d);
    if (strtod(buf, NULL) != d)
        snprintf(buf, cap, "%.17g", d);
}

/* Appends one JSON value (of enum or const) as grammar: its compact text, with ws allowed between
 * the tokens of arrays and objects (keys in the value's order). */
static int sc_value_lit(sc_ctx *c, const cJSON *v, const char *kw, strbuf *e)
{
    if (cJSON_IsNull(v)) {
        strbuf_add(e, "\"null\"", 6);
    } else if (cJSON_IsTrue(v)) {
        strbuf_add(e, "\"true\"", 6);
    } else if (cJSON_IsFalse(v)) {
        strbuf_add(e, "\"false\"", 7);
    } else if (cJSON_IsNumber(v)) {
        if (!isfinite(v->valuedouble))
            return sc_fail(c, kw, "a number JSON cannot write");
        char num[40];
        sc_json_number(num, sizeof num, v->valuedouble);
        sc_lit(e, num, strlen(num));
    } else if (cJSON_IsString(v)) {
        if (sc_string_lit(e, v->valuestring))
            return sc_fail(c, kw, "a string that is not valid UTF-8");
    } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        bool obj = cJSON_IsObject(v);
        sc_use(c, H_WS);
        strbuf_add(e, obj ? "\"{\" ws" : "\"[\" ws", 6);
        const cJSON *m;
        int i = 0;
        cJSON_ArrayForEach(m, v)
        {
            if (i++)
                strbuf_add(e, " \",\" ws", 7);
            strbuf_add(e, " ", 1);
            if (obj) {
                if (sc_string_lit(e, m->string))
                    return sc_fail(c, kw, "a key that is not valid UTF-8");
                strbuf_add(e, " ws \":\" ws ", 11);
            }
            if (sc_value_lit(c, m, kw, e))
                return -1;
            strbuf_add(e, " ws", 3);
        }
        strbuf_add(e, obj ? " \"}\"" : " \"]\"", 4);
    } else {
        return sc_fail(c, kw, "not a JSON value");
    }
    return 0;
}

/* The types a JSON value has (a whole number is an integer and a number). */
static unsigned sc_type_of(const cJSON *v)
{
    if (cJSON_IsNull(v))
        return T_NULL;
    if (cJSON_IsBool(v))
        return T_BOOLEAN;
    if (cJSON_IsNumber(v))
        return v->valuedouble == floor(v->valuedouble) ? T_INTEGER | T_NUMBER : T_NUMBER;
    if (cJSON_IsString(v))
        return T_STRING;
    if (cJSON_IsArray(v))
        return T_ARRAY;
    return cJSON_IsObject(v) ? T_OBJECT : 0;
}

/* ==== repetition ============================================================================== */

/* Appends `item` repeated min..max times (max < 0: no bound), item being one grammar item. The
 * grammar's bounds stop at 4096; longer runs are counted in blocks of 4096: min as whole blocks
 * and the rest, an optional k = a * 4096 + b as either fewer than a blocks and up to 4095 more,
 * or a blocks and up to b more (each length has one reading). */
static int sc_repeat(sc_ctx *c, strbuf *e, const char *item, long min, long max, const char *kw)
{
    if (max > SC_LEN_MAX)
        max = -1;
    if (min > SC_LEN_MAX)
        return sc_fail(c, kw, "above %ld is not supported", SC_LEN_MAX);
    if (min <= SC_REP && max <= SC_REP) {
        if (max < 0 && min <= 1)
            strbuf_printf(e, " %s%s", item, min ? "+" : "*");
        else if (max < 0)
            strbuf_printf(e, " %s{%ld,}", item, min);
        else if (max == 1 && min == 1)
            strbuf_printf(e, " %s", item);
        else if (max && min == max)
            strbuf_printf(e, " %s{%ld}", item, min);
        else if (max)
            strbuf_printf(e, " %s{%ld,%ld}", item, min, max);
        return 0;
    }
    char blk[96];
    snprintf(blk, sizeof blk, "%s-x%d", item, SC_REP);
    if (sc_rule_find(c, blk) < 0) {
        int r = sc_rule_new(c, blk, NULL);
        strbuf b = {0};
        strbuf_printf(&b, "%s{%d}", item, SC_REP);
        if (sc_rule_set(c, r, &b))
            return -1;
    }
    long q = min / SC_REP, r = min % SC_REP;
    if (q)
        strbuf_printf(e, " %s{%ld}", blk, q);
    if (r)
        strbuf_printf(e, " %s{%ld}", item, r);
    if (max < 0) {
        strbuf_printf(e, " %s*", item);
        return 0;
    }
    long k = max - min;
    if (k && k <= SC_REP) {
        strbuf_printf(e, " %s{0,%ld}", item, k);
    } else if (k > SC_REP) {
        long a = k / SC_REP, b = k % SC_REP;
        strbuf_add(e, " (", 2);
        if (a > 1)
            strbuf_printf(e, " %s{0,%ld}", blk, a - 1);
        strbuf_printf(e, " %s{0,%d} | %s{%ld}", item, SC_REP - 1, blk, a);
        if (b)
            strbuf_printf(e, " %s{0,%ld}", item, b);
        strbuf_add(e, " )", 2);
    }
    return 0;
}

/* A non-negative whole number keyword (minLength, maxItems...) into *out; absent: dflt. */
static int sc_count(sc_ctx *c, const cJSON *s, const char *kw, long dflt, long *out)
{
    const cJSON *v = sc_field(s, kw);
    *out = dflt;
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
        return sc_fail(c, kw, "must be a non-negative integer");
    *out = v->valuedouble > 1e15 ? (long)1e15 : (long)v->valuedouble;
    return 0;
}

/* ==== numbers ================================================================================= */

static int sc_ndigits(int64_t v)
{
    int n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

static int64_t sc_pow10(int n)
{
    int64_t p = 1;
    while (n-- > 0)
        p *= 10;
    return p;
}

/* Appends the digit strings from x to y (both n digits, x <= y) as one grammar item sequence. */
static void sc_same_len(strbuf *e, const char *x, const char *y, int n)
{
    static const char nines[] = "999999999999999999", zeros[] = "000000000000000000";
    int k = 0;
    while (k < n && x[k] == y[k])
        k++;
    if (k) {
        strbuf_printf(e, "\"%.*s\"", k, x);
        if (k == n)
            return;
        strbuf_add(e, " ", 1);
    }
    x += k, y += k, n -= k; /* now x[0] < y[0] */
    bool xz = strspn(x + 1, "0") >= (size_t)(n - 1), y9 = strspn(y + 1, "9") >= (size_t)(n - 1);
    char lo = xz ? x[0] : x[0] + 1, hi = y9 ? y[0] : y[0] - 1;
    int alts = !xz + (lo <= hi) + !y9, i = 0;
    if (alts > 1)
        strbuf_add(e, "( ", 2);
    if (!xz) {
        sc_sep(e, &i);
        strbuf_printf(e, "\"%c\" ", x[0]);
        sc_same_len(e, x + 1, nines, n - 1);
    }
    if (lo <= hi) {
        sc_sep(e, &i);
        lo == hi ? strbuf_printf(e, "\"%c\"", lo) : strbuf_printf(e, "[%c-%c]", lo, hi);
        if (n > 2)
            strbuf_printf(e, " [0-9]{%d}", n - 1);
        else if (n == 2)
            strbuf_add(e, " [0-9]", 6);
    }
    if (!y9) {
        sc_sep(e, &i);
        strbuf_printf(e, "\"%c\" ", y[0]);
        sc_same_len(e, zeros, y + 1, n - 1);
    }
    if (alts > 1)
        strbuf_add(e, " )", 2);
}

/* Appends "( ... )": the decimal numbers from a to b, 0 <= a <= b, without leading zeros. */
static void sc_digits(strbuf *e, int64_t a, int64_t b)
{
    strbuf_add(e, "( ", 2);
    int alt = 0;
    for (int len = sc_ndigits(a); len <= sc_ndigits(b); len++) {
        int64_t lo = len == 1 ? 0 : sc_pow10(len - 1), hi = sc_pow10(len) - 1;
        lo = lo < a ? a : lo;
        hi = hi > b ? b : hi;
        if (lo > hi)
            continue;
        char x[24], y[24];
        snprintf(x, sizeof x, "%lld", (long long)lo);
        snprintf(y, sizeof y, "%lld", (long long)hi);
        if (alt++)
            strbuf_add(e, " | ", 3);
        sc_same_len(e, x, y, len);
    }
    strbuf_add(e, " )", 2);
}

/* A bound of minimum/maximum: none, or v (open: v itself excluded), set by keyword kw. */
typedef struct {
    bool has, open;
    double v;
    const char *kw;
} sc_lim;

/* The lower (or upper) bound from minimum and exclusiveMinimum (a number, or draft 4's boolean
 * that makes minimum exclusive); the tighter of the two when both are numbers. */
static int sc_limit(sc_ctx *c, const cJSON *s, bool upper, sc_lim *out)
{
    const char *kw = upper ? "maximum" : "minimum";
    const char *xkw = upper ? "exclusiveMaximum" : "exclusiveMinimum";
    const cJSON *m = sc_field(s, kw), *x = sc_field(s, xkw);
    *out = (sc_lim){0};
    if (m) {
        if (!cJSON_IsNumber(m))
            return sc_fail(c, kw, "must be a number");
        *out = (sc_lim){true, false, m->valuedouble, kw};
    }
    if (cJSON_IsBool(x)) {
        if (cJSON_IsTrue(x)) {
            if (!m)
                return sc_fail(c, xkw, "true needs %s", kw);
            out->open = true;
            out->kw = xkw;
        }
    } else if (cJSON_IsNumber(x)) {
        double v = x->valuedouble;
        if (!out->has || (upper ? v <= out->v : v >= out->v))
            *out = (sc_lim){true, true, v, xkw};
    } else if (x) {
        return sc_fail(c, xkw, "must be a number");
    }
    return 0;
}

/* Appends magnitude alternatives (each preceded by " | " once *n > 0): v = I[.F] from a (open:
 * excluded) to b (open: excluded; b_none: up to the 15-digit cap, any fraction). */
static void sc_magnitude(sc_ctx *c, strbuf *e, int *n, int64_t a, bool a_open, int64_t b,
                         bool b_open, bool b_none)
{
    if (b_none)
        b = SC_CAP, b_open = false;
    if (a > b)
        return;
    if (a == b && !b_none) {
        if (!a_open && !b_open) {
            sc_sep(e, n);
            strbuf_printf(e, "\"%lld\" zfrac", (long long)a);
            sc_use(c, H_ZFRAC);
        }
        return;
    }
    if (a_open) { /* I = a needs a nonzero fraction */
        sc_sep(e, n);
        strbuf_printf(e, "\"%lld\" nzfrac", (long long)a);
        sc_use(c, H_NZFRAC);
    }
    int64_t lo = a_open ? a + 1 : a, hi = b_none ? SC_CAP : b - 1;
    if (lo <= hi) { /* any fraction */
        sc_sep(e, n);
        sc_digits(e, lo, hi);
        strbuf_add(e, " frac?", 6);
        sc_use(c, H_FRAC);
    }
    if (!b_none && !b_open) { /* I = b: the fraction must be zero */
        sc_sep(e, n);
        strbuf_printf(e, "\"%lld\" zfrac", (long long)b);
        sc_use(c, H_ZFRAC);
    }
}

/* Appends an integer or number item under the schema's minimum/maximum bounds. */
static int sc_number(sc_ctx *c, const cJSON *s, bool integer, strbuf *e)
{
    sc_lim lo, hi;
    if (sc_limit(c, s, false, &lo) || sc_limit(c, s, true, &hi))
        return -1;
    if (!lo.has && !hi.has) {
        sc_helper(c, e, integer ? H_INTEGER : H_NUMBER);
        return 0;
    }
    /* every number the grammar writes lies strictly between -cap and cap */
    const double cap = 1e15;
    if (lo.has && lo.v >= cap)
        return sc_fail(c, lo.kw, "no %s of at most 15 integer digits is that large",
                       integer ? "integer" : "number");
    if (hi.has && hi.v <= -cap)
        return sc_fail(c, hi.kw, "no %s of at most 15 integer digits is that small",
                       integer ? "integer" : "number");
    lo.has = lo.has && lo.v > -cap;
    hi.has = hi.has && hi.v < cap;
    if (integer) { /* whole, closed bounds */
        int64_t L = -SC_CAP, H = SC_CAP;
        if (lo.has)
            L = (int64_t)(lo.open ? floor(lo.v) + 1 : ceil(lo.v));
        if (hi.has)
            H = (int64_t)(hi.open ? ceil(hi.v) - 1 : floor(hi.v));
        L = L < -SC_CAP ? -SC_CAP : L;
        H = H > SC_CAP ? SC_CAP : H;
        if (L > H)
            return sc_fail(c, lo.has ? lo.kw : hi.kw, "no integer lies within the bounds");
        strbuf_add(e, "( ", 2);
        if (H >= 0)
            sc_digits(e, L > 0 ? L : 0, H);
        if (L < 0) {
            strbuf_add(e, H >= 0 ? " | \"-\" " : "\"-\" ", H >= 0 ? 7 : 4);
            sc_digits(e, H < 0 ? -H : 1, -L);
        }
        strbuf_add(e, " )", 2);
        return 0;
    }
    if ((lo.has && lo.v != floor(lo.v)) || (hi.has && hi.v != floor(hi.v)))
        return sc_fail(c, lo.has && lo.v != floor(lo.v) ? lo.kw : hi.kw,
                       "only whole-number bounds are supported for type number");
    int64_t L = lo.has ? (int64_t)lo.v : 0, H = hi.has ? (int64_t)hi.v : 0;
    int n = 0;
    strbuf pos = {0}, neg = {0};
    /* x >= 0: magnitudes from max(L, 0) */
    if (!hi.has || H > 0 || (H == 0 && !hi.open)) {
        bool above = lo.has && L >= 0;
        sc_magnitude(c, &pos, &n, above ? L : 0, above && lo.open, H, hi.open, !hi.has);
    }
    /* x < 0, written "-" v with v > 0: v from -H (or just above 0) up to -L */
    int m = 0;
    if (!lo.has || L < 0) {
        bool below = hi.has && H <= 0;
        sc_magnitude(c, &neg, &m, below ? -H : 0, below ? (hi.open || H == 0) : true,
                     lo.has ? -L : 0, lo.open, !lo.has);
    }
    if (!n && !m) {
        strbuf_free(&pos);
        strbuf_free(&neg);
        return sc_fail(c, lo.has ? lo.kw : hi.kw, "no number lies within the bounds");
    }
    strbuf_add(e, "( ", 2);
    if (n)
        strbuf_add(e, pos.p, pos.len);
    if (m)
        strbuf_printf(e, "%s\"-\" ( %s )", n ? " | " : "", neg.p);
    strbuf_add(e, " )", 2);
    e->oom |= pos.oom || neg.oom;
    strbuf_free(&pos);
    strbuf_free(&neg);
    return 0;
}

/* ==== strings, arrays, objects ================================================================ */

static int sc_schema(sc_ctx *c, const cJSON *s, const char *hint, strbuf *e);

static int sc_string(sc_ctx *c, const cJSON *s, strbuf *e)
{
    const cJSON *format = sc_field(s, "format");
    long min, max;
    if (sc_count(c, s, "minLength", 0, &min) || sc_count(c, s, "maxLength", -1, &max))
        return -1;
    if (format) {
        if (!cJSON_IsString(format))
            return sc_fail(c, "format", "must be a string");
        if (sc_field(s, "minLength") || sc_field(s, "maxLength"))
            return sc_fail(c, "format", "cannot be combined with minLength or maxLength");
        for (size_t i = 0; i < sizeof SC_FORMATS / sizeof *SC_FORMATS; i++)
            if (!strcmp(SC_FORMATS[i].format, format->valuestring)) {
                sc_use(c, SC_FORMATS[i].helper);
                strbuf_printf(e, "( \"\\\"\" %s \"\\\"\" )", SC_HELPERS[SC_FORMATS[i].helper].name);
                return 0;
            }
        return sc_fail(c, "format",
                       "'%.40s' is not supported (supported: date, time, date-time, uuid, email, "
                       "ipv4)",
                       format->valuestring);
    }
    if (max >= 0 && min > max)
        return sc_fail(c, "minLength", "is above maxLength");
    if (min == 0 && max < 0) {
        sc_helper(c, e, H_STRING);
        return 0;
    }
    char name[64];
    if (max < 0)
        snprintf(name, sizeof name, "str-%ld-more", min);
    else
        snprintf(name, sizeof name, "str-%ld-%ld", min, max);
    if (sc_rule_find(c, name) < 0) {
        int r = sc_rule_new(c, name, NULL);
        strbuf b = {0};
        strbuf_add(&b, "\"\\\"\"", 4);
        sc_use(c, H_CHAR);
        if (sc_repeat(c, &b, "char", min, max, "minLength")) {
            strbuf_free(&b);
            return -1;
        }
        strbuf_add(&b, " \"\\\"\"", 5);
        if (sc_rule_set(c, r, &b))
            return -1;
    }
    strbuf_printf(e, "%s", name);
    return 0;
}

/* Appends a name made of hint and a suffix (for a rule's hint). */
static const char *sc_hint(char *buf, size_t cap, const char *hint, const char *suffix)
{
    snprintf(buf, cap, "%s_%s", hint, suffix);
    return buf;
}

static int sc_array(sc_ctx *c, const cJSON *s, const char *hint, strbuf *e)
{
    const cJSON *items = sc_field(s, "items");
    long min, max;
    if (sc_count(c, s, "minItems", 0, &min) || sc_count(c, s, "maxItems", -1, &max))
        return -1;
    if (cJSON_IsArray(items))
        return sc_fail(c, "items", "a list of schemas (a tuple) is not supported");
    if (max >= 0 && min > max)
        return sc_fail(c, "minItems", "is above maxItems");
    if (!items && min == 0 && max < 0) {
        sc_helper(c, e, H_ARRAY);
        return 0;
    }
    sc_use(c, H_WS);
    if (max == 0) {
        strbuf_add(e, "( \"[\" ws \"]\" )", 14);
        return 0;
    }
    char hb[64];
    int r = sc_rule_new(c, NULL, hint);
    strbuf item = {0}, b = {0};
    if (items) {
        size_t old = sc_push(c, "items", 0);
        sc_schema(c, items, sc_hint(hb, sizeof hb, hint, "item"), &item);
        sc_pop(c, old);
    } else {
        sc_helper(c, &item, H_VALUE);
    }
    int more = sc_rule_new(c, NULL, sc_hint(hb, sizeof hb, hint, "more"));
    strbuf_printf(&b, "\",\" ws %s ws", item.p ? item.p : "");
    sc_rule_set(c, more, &b);
    strbuf_printf(&b, "\"[\" ws %s%s ws", min ? "" : "( ", item.p ? item.p : "");
    if (!c->failed)
        sc_repeat(c, &b, c->rules[more].name, min ? min - 1 : 0, max < 0 ? -1 : max - 1,
                  "minItems");
    strbuf_printf(&b, "%s \"]\"", min ? "" : " )?");
    e->oom |= item.oom;
    strbuf_free(&item);
    if (sc_rule_set(c, r, &b))
        return -1;
    strbuf_printf(e, "%s", c->rules[r].name);
    return 0;
}

/* An object without properties: any object, the empty one, or one whose values follow addl. */
static int sc_open_object(sc_ctx *c, const cJSON *addl, const char *hint, strbuf *e)
{
    if (!addl || cJSON_IsTrue(addl)) {
        sc_helper(c, e, H_OBJECT);
        return 0;
    }
    sc_use(c, H_WS);
    if (cJSON_IsFalse(addl)) {
        strbuf_add(e, "( \"{\" ws \"}\" )", 14);
        return 0;
    }
    char hb[64];
    int r = sc_rule_new(c, NULL, hint);
    int kv = sc_rule_new(c, NULL, sc_hint(hb, sizeof hb, hint, "kv"));
    strbuf v = {0}, b = {0};
    size_t old = sc_push(c, "additionalProperties", 0);
    sc_schema(c, addl, sc_hint(hb, sizeof hb, hint, "value"), &v);
    sc_pop(c, old);
    sc_use(c, H_STRING);
    strbuf_printf(&b, "string ws \":\" ws %s ws", v.p ? v.p : "");
    e->oom |= v.oom;
    strbuf_free(&v);
    if (sc_rule_set(c, kv, &b))
        return -1;
    strbuf_printf(&b, "\"{\" ws ( %s ( \",\" ws %s )* )? \"}\"", c->rules[kv].name,
                  c->rules[kv].name);
    if (sc_rule_set(c, r, &b))
        return -1;
    strbuf_printf(e, "%s", c->rules[r].name);
    return 0;
}

static int sc_object(sc_ctx *c, const cJSON *s, const char *hint, strbuf *e)
{
    const cJSON *props = sc_field(s, "properties"), *req = sc_field(s, "required");
    const cJSON *addl = sc_field(s, "additionalProperties"), *v;
    if (props && !cJSON_IsObject(props))
        return sc_fail(c, "properties", "must be an object of schemas");
    if (req && !cJSON_IsArray(req))
        return sc_fail(c, "required", "must be an array of property names");
    cJSON_ArrayForEach(v, req)
    {
        if (!cJSON_IsString(v))
            return sc_fail(c, "required", "must be an array of property names");
    }
    if (addl && !cJSON_IsBool(addl) && !cJSON_IsObject(addl))
        return sc_fail(c, "additionalProperties", "must be a boolean or a schema");
    int n = props ? cJSON_GetArraySize(props) : 0;
    if (!n) {
        if (cJSON_GetArraySize(req))
            return sc_fail(c, "required", "needs properties naming the required keys");
        return sc_open_object(c, addl, hint, e);
    }
    if (cJSON_IsObject(addl))
        return sc_fail(c, "additionalProperties",
                       "a schema next to properties is not supported (only false: the keys an "
                       "object may have are its properties)");
    cJSON_ArrayForEach(v, req)
    {
        if (!cJSON_GetObjectItemCaseSensitive(props, v->valuestring))
            return sc_fail(c, "required", "'%.60s' is not one of the properties", v->valuestring);
    }

    bool *required = calloc((size_t)n, sizeof *required);
    int *kv = malloc((size_t)n * sizeof *kv), *tail = malloc((size_t)(n + 1) * sizeof *tail);
    if (!required || !kv || !tail) {
        free(required);
        free(kv);
        free(tail);
        return sc_oom(c);
    }
    int first_req = n, i = 0;
    const cJSON *p, *q;
    cJSON_ArrayForEach(p, props)
    {
        for (q = props->child; q != p; q = q->next)
            if (!strcmp(q->string, p->string)) {
                sc_fail(c, "properties", "'%.60s' is listed twice", p->string);
                goto out;
            }
        cJSON_ArrayForEach(v, req) required[i] |= !strcmp(v->valuestring, p->string);
        if (required[i] && first_req == n)
            first_req = i;
        i++;
    }
    sc_use(c, H_WS);
    int r = sc_rule_new(c, NULL, hint);
    /* members: "key" ws ":" ws value ws */
    i = 0;
    cJSON_ArrayForEach(p, props)
    {
        strbuf b = {0};
        size_t old = sc_push(c, "properties", 0);
        sc_push(c, p->string, 0);
        kv[i] = sc_rule_new(c, NULL, p->string);
        if (sc_string_lit(&b, p->string)) {
            sc_pop(c, old);
            strbuf_free(&b);
            sc_fail(c, "properties", "a property name that is not valid UTF-8");
            goto out;
        }
        strbuf_add(&b, " ws \":\" ws ", 11);
        sc_schema(c, p, p->string, &b);
        strbuf_add(&b, " ws", 3);
        sc_pop(c, old);
        if (sc_rule_set(c, kv[i], &b))
            goto out;
        i++;
    }
    /* tail j: what may follow member j - 1 */
    char hb[64];
    tail[n] = -1;
    for (int j = n - 1; j >= 1; j--) {
        strbuf b = {0};
        tail[j] = sc_rule_new(c, NULL, sc_hint(hb, sizeof hb, hint, "tail"));
        if (c->failed)
            goto out;
        strbuf_printf(&b, required[j] ? "\",\" ws %s" : "( \",\" ws %s )?", c->rules[kv[j]].name);
        if (tail[j + 1] >= 0)
            strbuf_printf(&b, " %s", c->rules[tail[j + 1]].name);
        if (sc_rule_set(c, tail[j], &b))
            goto out;
    }
    strbuf b = {0};
    strbuf_add(&b, "\"{\" ws ( ", 9);
    for (int j = 0; j <= first_req && j < n; j++) {
        strbuf_printf(&b, "%s%s", j ? " | " : "", c->rules[kv[j]].name);
        if (tail[j + 1] >= 0)
            strbuf_printf(&b, " %s", c->rules[tail[j + 1]].name);
    }
    strbuf_printf(&b, " )%s \"}\"", first_req == n ? "?" : "");
    if (sc_rule_set(c, r, &b) == 0)
        strbuf_printf(e, "%s", c->rules[r].name);
out:
    free(required);
    free(kv);
    free(tail);
    return c->failed ? -1 : 0;
}

/* ==== schemas ================================================================================= */

/* The schema $ref names within c->doc, or NULL (unsupported or undefined: *why says which). */
static const cJSON *sc_lookup(const sc_ctx *c, const char *ref, const char **why)
{
    *why = "only \"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\" are supported";
    if (!strcmp(ref, "#"))
        return c->doc;
    const char *container = !strncmp(ref, "#/$defs/", 8)          ? "$defs"
                            : !strncmp(ref, "#/definitions/", 14) ? "definitions"
                                                                  : NULL;
    if (!container)
        return NULL;
    const char *p = ref + (container[0] == '$' ? 8 : 14);
    char name[256];
    size_t n = 0;
    for (; *p && n + 1 < sizeof name; p++) {
        if (*p == '/')
            return NULL; /* a pointer into a definition */
        if (*p == '~' && (p[1] == '0' || p[1] == '1'))
            name[n++] = *++p == '0' ? '~' : '/';
        else
            name[n++] = *p;
    }
    name[n] = 0;
    *why = "is not defined";
    return cJSON_GetObjectItemCaseSensitive(sc_field(c->doc, container), name);
}

/* Whether s reaches a schema of chain[0..n) through $ref, anyOf, oneOf and allOf alone: 1 yes, 0
 * no, 2 too many steps to tell. */
static int sc_left_loop(const sc_ctx *c, const cJSON *s, const cJSON **chain, int n, int *visits)
{
    if (++*visits > SC_LEFT_VISITS || n >= SC_NEST)
        return 2;
    const cJSON *ref = sc_field(s, "$ref");
    const char *why;
    const cJSON *t = cJSON_IsString(ref) ? sc_lookup(c, ref->valuestring, &why) : NULL;
    if (t) {
        for (int i = 0; i < n; i++)
            if (chain[i] == t)
                return 1;
        chain[n] = t;
        int rc = sc_left_loop(c, t, chain, n + 1, visits);
        if (rc)
            return rc;
    }
    static const char *const kws[] = {"anyOf", "oneOf", "allOf"};
    for (int k = 0; k < 3; k++) {
        const cJSON *m, *arr = sc_field(s, kws[k]);
        cJSON_ArrayForEach(m, (cJSON_IsArray(arr) ? arr : NULL))
        {
            int rc = sc_left_loop(c, m, chain, n, visits);
            if (rc)
                return rc;
        }
    }
    return 0;
}

/* Appends the rule a $ref stands for, made (and queued to be written) on its first use. */
static int sc_ref(sc_ctx *c, const cJSON *ref, strbuf *e)
{
    if (!cJSON_IsString(ref))
        return sc_fail(c, "$ref", "must be a string");
    const char *why;
    const cJSON *t = sc_lookup(c, ref->valuestring, &why);
    if (!t)
        return sc_fail(c, "$ref", "'%.80s' %s", ref->valuestring, why);
    for (size_t i = 0; i < c->n_defs; i++)
        if (c->defs[i].schema == t) {
            strbuf_printf(e, "%s", c->rules[c->defs[i].rule].name);
            return 0;
        }
    const cJSON *chain[SC_NEST + 1] = {t};
    int visits = 0, loop = sc_left_loop(c, t, chain, 1, &visits);
    if (loop)
        return sc_fail(c, "$ref",
                       loop == 1 ? "'%.80s' reaches itself through $ref, anyOf, oneOf or allOf "
                                   "before any JSON text (left recursion)"
                                 : "'%.80s': its references go too deep to check",
                       ref->valuestring);
    /* where the target sits: its path in the document, for errors inside it */
    char where[sizeof c->path];
    const char *name = t == c->doc ? NULL : strrchr(ref->valuestring, '/') + 1;
    snprintf(where, sizeof where, "%.*s%s%s%s", (int)c->doc_plen, c->path,
             name && c->doc_plen ? "." : "",
             name ? (ref->valuestring[2] == '$' ? "$defs." : "definitions.") : "",
             name ? name : "");
    if (buf_grow((void **)&c->defs, &c->cap_defs, c->n_defs + 1, sizeof *c->defs, 8))
        return sc_oom(c);
    size_t old = c->plen;
    memcpy(c->path, where, strlen(where) + 1);
    c->plen = strlen(where);
    int r = sc_rule_new(c, NULL, name ? name : "doc");
    c->plen = old;
    c->path[old] = 0;
    if (r < 0)
        return -1;
    char *path = strdup(where);
    if (!path)
        return sc_oom(c);
    c->defs[c->n_defs++] = (sc_def){t, path, r, false};
    strbuf_printf(e, "%s", c->rules[r].name);
    return 0;
}

/* Writes the rules of the $ref targets queued so far (and those they queue). */
static int sc_write_defs(sc_ctx *c)
{
    for (size_t i = 0; i < c->n_defs && !c->failed; i++) {
        if (c->defs[i].written)
            continue;
        c->defs[i].written = true;
        size_t old = c->plen;
        snprintf(c->path, sizeof c->path, "%s", c->defs[i].path);
        c->plen = strlen(c->path);
        const cJSON *s = c->defs[i].schema;
        int r = c->defs[i].rule;
        strbuf b = {0};
        char hint[64];
        snprintf(hint, sizeof hint, "%s", c->rules[r].name);
        sc_schema(c, s, hint, &b);
        sc_rule_set(c, r, &b);
        sc_pop(c, old);
    }
    return c->failed ? -1 : 0;
}

/* Fails unless every keyword of s is descriptive or `kw` itself (or one of `also`). */
static int sc_alone(sc_ctx *c, const cJSON *s, const char *kw, const char *also)
{
    const cJSON *m;
    cJSON_ArrayForEach(m, s)
    {
        if (sc_in(SC_DESCRIPTIVE, m->string) || !strcmp(m->string, kw) ||
            (also && !strcmp(m->string, also)))
            continue;
        return sc_fail(c, m->string, "cannot be combined with %s", kw);
    }
    return 0;
}

/* The schema's "type" as T_ bits (all of them when it has none); -1 on a bad type. */
static int sc_types(sc_ctx *c, const cJSON *s, unsigned *mask)
{
    const cJSON *type = sc_field(s, "type"), *t;
    *mask = 0;
    if (!type) {
        *mask = T_NULL | T_BOOLEAN | T_INTEGER | T_NUMBER | T_STRING | T_ARRAY | T_OBJECT;
        return 0;
    }
    if (cJSON_IsArray(type) && !cJSON_GetArraySize(type))
        return sc_fail(c, "type", "an empty list of types allows no value");
    cJSON_ArrayForEach(t, (cJSON_IsArray(type) ? type : NULL))
    {
        if (!cJSON_IsString(t))
            return sc_fail(c, "type", "must be a type name or a list of them");
    }
    if (!cJSON_IsArray(type) && !cJSON_IsString(type))
        return sc_fail(c, "type", "must be a type name or a list of them");
    for (t = cJSON_IsArray(type) ? type->child : type; t;
         t = cJSON_IsArray(type) ? t->next : NULL) {
        int k = 0;
        while (k < SC_N_TYPES && strcmp(SC_TYPE_NAMES[k], t->valuestring))
            k++;
        if (k == SC_N_TYPES)
            return sc_fail(c, "type", "'%.40s' is not a JSON Schema type", t->valuestring);
        *mask |= 1u << k;
    }
    return 0;
}

static int sc_enum(sc_ctx *c, const cJSON *s, strbuf *e)
{
    bool is_enum = sc_field(s, "enum") != NULL;
    const char *kw = is_enum ? "enum" : "const";
    const cJSON *vals = sc_field(s, kw), *v;
    unsigned mask;
    if (sc_alone(c, s, kw, "type") || sc_types(c, s, &mask))
        return -1;
    if (is_enum && (!cJSON_IsArray(vals) || !cJSON_GetArraySize(vals)))
        return sc_fail(c, "enum", "must be a non-empty array of values");
    int n = 0;
    strbuf_add(e, "( ", 2);
    for (v = is_enum ? vals->child : vals; v; v = is_enum ? v->next : NULL) {
        if (!(sc_type_of(v) & mask))
            continue; /* valid only if it also has the type: it never does */
        if (n++)
            strbuf_add(e, " | ", 3);
        if (sc_value_lit(c, v, kw, e))
            return -1;
    }
    strbuf_add(e, " )", 2);
    return n ? 0 : sc_fail(c, kw, "no value has the schema's type");
}

/* A schema of types (the "type" keyword, or the types its other keywords apply to). */
static int sc_typed(sc_ctx *c, const cJSON *s, const char *hint, strbuf *e)
{
    unsigned mask, implied = 0;
    bool typed = sc_field(s, "type") != NULL;
    if (sc_types(c, s, &mask))
        return -1;
    for (size_t k = 0; k < SC_N_TYPED; k++) {
        if (!sc_field(s, SC_TYPED[k].kw))
            continue;
        if (!(SC_TYPED[k].types & mask))
            return sc_fail(c, SC_TYPED[k].kw, "applies to %s, which the type does not allow",
                           SC_TYPED[k].kind);
        implied |= SC_TYPED[k].types & ~T_INTEGER;
    }
    if (!typed)
        mask = implied;
    if (!mask) {
        sc_helper(c, e, H_VALUE);
        return 0;
    }
    if (mask & T_NUMBER) /* the number item takes the integers too */
        mask &= ~T_INTEGER;
    int n = __builtin_popcount(mask), i = 0;
    if (n > 1)
        strbuf_add(e, "( ", 2);
    for (int k = 0; k < SC_N_TYPES && !c->failed; k++) {
        if (!(mask & (1u << k)))
            continue;
        if (i++)
            strbuf_add(e, " | ", 3);
        switch (1u << k) {
        case T_NULL: strbuf_add(e, "\"null\"", 6); break;
        case T_BOOLEAN: sc_helper(c, e, H_BOOLEAN); break;
        case T_INTEGER: sc_number(c, s, true, e); break;
        case T_NUMBER: sc_number(c, s, false, e); break;
        case T_STRING: sc_string(c, s, e); break;
        case T_ARRAY: sc_array(c, s, hint, e); break;
        case T_OBJECT: sc_object(c, s, hint, e); break;
        }
    }
    if (n > 1)
        strbuf_add(e, " )", 2);
    return c->failed ? -1 : 0;
}

static int sc_schema_body(sc_ctx *c, const cJSON *s, const char *hint, strbuf *e)
{
    const cJSON *v, *m;
    cJSON_ArrayForEach(m, s)
    {
        const char *kw = m->string;
        if (!strcmp(kw, "pattern"))
            return sc_fail(c, kw, "regular expressions are not supported");
        if (!strcmp(kw, "uniqueItems") && !cJSON_IsFalse(m))
            return sc_fail(c, kw, "only false is supported");
        bool known = sc_in(SC_DESCRIPTIVE, kw) || sc_in(SC_COMBINERS, kw);
        for (size_t k = 0; k < SC_N_TYPED && !known; k++)
            known = !strcmp(SC_TYPED[k].kw, kw);
        if (!known)
            return sc_fail(c, kw, "not supported (docs/http-api.md lists the JSON Schema subset)");
    }
    if ((v = sc_field(s, "$ref")))
        return sc_alone(c, s, "$ref", NULL) ? -1 : sc_ref(c, v, e);
    if ((v = sc_field(s, "allOf"))) {
        if (sc_alone(c, s, "allOf", NULL))
            return -1;
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 1)
            return sc_fail(c, "allOf", "only an allOf of one schema is supported");
        size_t old = sc_push(c, "allOf", 0);
        sc_push(c, NULL, 0);
        int rc = sc_schema(c, v->child, hint, e);
        sc_pop(c, old);
        return rc;
    }
    const char *any = sc_field(s, "anyOf") ? "anyOf" : sc_field(s, "oneOf") ? "oneOf" : NULL;
    if (any) { /* oneOf as anyOf: a document valid under two alternatives is accepted */
        v = sc_field(s, any);
        if (sc_alone(c, s, any, NULL))
            return -1;
        if (!cJSON_IsArray(v) || !cJSON_GetArraySize(v))
            return sc_fail(c, any, "must be a non-empty array of schemas");
        int n = cJSON_GetArraySize(v), i = 0;
        if (n > 1)
            strbuf_add(e, "( ", 2);
        cJSON_ArrayForEach(m, v)
        {
            char hb[64];
            snprintf(hb, sizeof hb, "%s_%d", hint, i);
            size_t old = sc_push(c, any, 0);
            sc_push(c, NULL, i);
            if (i++)
                strbuf_add(e, " | ", 3);
            int rc = sc_schema(c, m, hb, e);
            sc_pop(c, old);
            if (rc)
                return -1;
        }
        if (n > 1)
            strbuf_add(e, " )", 2);
        return 0;
    }
    if (sc_field(s, "enum") || sc_field(s, "const"))
        return sc_enum(c, s, e);
    return sc_typed(c, s, hint, e);
}

/* Appends the grammar item of schema s (hint: what to name its rules after). */
static int sc_schema(sc_ctx *c, const cJSON *s, const char *hint, strbuf *e)
{
    if (c->failed)
        return -1;
    if (cJSON_IsTrue(s)) {
        sc_helper(c, e, H_VALUE);
        return 0;
    }
    if (cJSON_IsFalse(s))
        return sc_fail(c, NULL, "the schema false allows no value");
    if (!cJSON_IsObject(s))
        return sc_fail(c, NULL, "a schema must be an object or a boolean");
    if (c->depth >= SC_NEST)
        return sc_fail(c, NULL, "schemas nested deeper than %d are not supported", SC_NEST);
    c->depth++;
    int rc = sc_schema_body(c, s, hint, e);
    c->depth--;
    return c->failed ? -1 : rc;
}

/* ==== the interface =========================================================================== */

char *schema_to_grammar(const cJSON *schema, char *err, size_t errlen)
{
    sc_ctx c;
    sc_init(&c, schema, err, errlen);
    int root = sc_rule_new(&c, NULL, NULL);
    strbuf b = {0};
    if (schema && !sc_schema(&c, schema, "root", &b)) {
        sc_use(&c, H_WS);
        strbuf_add(&b, " ws", 3);
    } else if (!schema) {
        sc_fail(&c, NULL, "no schema");
    }
    sc_rule_set(&c, root, &b);
    sc_write_defs(&c);
    char *text = sc_assemble(&c);
    sc_free(&c);
    return text;
}

char *schema_json_object_grammar(void)
{
    sc_ctx c;
    sc_init(&c, NULL, NULL, 0);
    int root = sc_rule_new(&c, NULL, NULL);
    strbuf b = {0};
    sc_use(&c, H_OBJECT);
    sc_use(&c, H_WS);
    strbuf_add(&b, "object ws", 9);
    sc_rule_set(&c, root, &b);
    char *text = sc_assemble(&c);
    sc_free(&c);
    return text;
}

char *schema_tool_call_grammar(const cJSON *tools, const char *only_name, char *err, size_t errlen)
{
    sc_ctx c;
    sc_init(&c, NULL, err, errlen);
    sc_push(&c, "tools", 0);
    if (!cJSON_IsArray(tools) || !cJSON_GetArraySize(tools)) {
        sc_fail(&c, NULL, "must be a non-empty array of functions");
        return NULL;
    }
    int root = sc_rule_new(&c, NULL, NULL), i = 0, n = 0;
    strbuf b = {0};
    strbuf_add(&b, "(", 1);
    const cJSON *t;
    cJSON_ArrayForEach(t, tools)
    {
        size_t top = sc_push(&c, NULL, i);
        const cJSON *type = sc_field(t, "type"), *fn = sc_field(t, "function");
        const cJSON *name = sc_field(fn, "name"), *params = sc_field(fn, "parameters");
        if (cJSON_IsNull(params)) /* as OpenAI reads it: no parameters */
            params = NULL;
        if (!cJSON_IsObject(t)) {
            sc_fail(&c, NULL, "must be an object {\"type\": \"function\", \"function\": {...}}");
            break;
        }
        if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))) {
            sc_fail(&c, "type", "only \"function\" tools are supported");
            break;
        }
        if (!cJSON_IsObject(fn)) {
            sc_fail(&c, "function", "must be an object with a name and parameters");
            break;
        }
        sc_push(&c, "function", 0);
        if (!cJSON_IsString(name) || !name->valuestring[0]) {
            sc_fail(&c, "name", "must be a non-empty string");
            break;
        }
        for (const cJSON *u = tools->child; u != t; u = u->next)
            if (!strcmp(sc_field(sc_field(u, "function"), "name")->valuestring,
                        name->valuestring)) {
                sc_fail(&c, "name", "'%.60s' names two functions", name->valuestring);
                break;
            }
        if (c.failed)
            break;
        if (!only_name || !strcmp(only_name, name->valuestring)) {
            /* {"name": "<fn>", "arguments": <parameters>} */
            strbuf call = {0};
            strbuf_add(&call, "{\"name\": ", 9);
            sc_json_string(&call, name->valuestring);
            strbuf_add(&call, ", \"arguments\": ", 15);
            strbuf_add(&b, n ? " | " : " ", n ? 3 : 1);
            n++;
            bool oom = call.oom, bad = !oom && sc_lit(&b, call.p, call.len);
            if (oom || bad) {
                strbuf_free(&call);
                oom ? sc_oom(&c) : sc_fail(&c, "name", "is not valid UTF-8");
                break;
            }
            strbuf_free(&call);
            strbuf_add(&b, " ", 1);
            if (params) {
                sc_push(&c, "parameters", 0);
                c.doc = params;
                c.doc_plen = c.plen;
                char hint[40];
                snprintf(hint, sizeof hint, "args%d", i);
                if (sc_schema(&c, params, hint, &b) || sc_write_defs(&c))
                    break;
            } else { /* no parameters: the empty parameter list */
                sc_use(&c, H_WS);
                strbuf_add(&b, "\"{\" ws \"}\"", 10);
            }
            strbuf_add(&b, " \"}\"", 4);
        }
        sc_pop(&c, top);
        i++;
    }
    if (!c.failed && !n) /* the path is "tools" again */
        sc_fail(&c, NULL, "no function is named '%.60s'", only_name);
    sc_use(&c, H_WS);
    strbuf_add(&b, " ) ws", 5);
    sc_rule_set(&c, root, &b);
    char *text = sc_assemble(&c);
    sc_free(&c);
    return text;
}
