/*
 * model/grammar.c — grammar-constrained generation (interface and language: model/grammar.h).
 *
 * Compiling. The text is parsed by recursive descent into rules of alternatives; every
 * alternative is a run of elements in one flat array, ended by an END element: a character class
 * (ranges of code points, maybe negated) or a reference to a rule. Groups and repetitions become
 * rules of their own: x* is R ::= x R | (empty), x+ is x x*, x? is R ::= x | (empty), x{m,n} is m
 * copies then n - m nested optionals. Then every referenced rule must be defined, and no rule may
 * reach itself at its left edge (through rules that can match nothing), which is what lets the
 * expansion below end.
 *
 * Following text. A position is a set of stacks of element indices. The top of each stack is a
 * character class the next character may match; below it, where to continue once the rule being
 * matched ends. An empty stack means the text may end. A character advances every stack whose top
 * matches it: the top moves one element on, and the stack is expanded again (an END pops; a rule
 * reference pushes each of its alternatives — and where the reference is the last element of its
 * alternative, it replaces that alternative instead of returning to it, so right recursion such as
 * x* does not grow the stack). Duplicate stacks are merged. Multi-byte characters are taken byte by
 * byte: until the last byte arrives the position keeps the partial character, and a byte is
 * refused once no stack could match any character that begins so.
 *
 * Masks. The vocabulary's token bytes are kept in a trie; a mask walks it depth first, one
 * position per depth, so tokens sharing a beginning share its work and a refused byte cuts its
 * whole subtree. The last few masks are kept by position (inside a JSON string most steps come
 * back to the same one).
 */
#include "model/grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "model/tokenizer.h"

#define GR_MAX_DEPTH 256   /* stack elements: deeper nesting is refused */
#define GR_MAX_STACKS 4096 /* parses followed at once: more is refused (an ambiguous grammar) */
#define GR_MAX_REPEAT 4096 /* x{m,n}: bounds above this are refused */
#define GR_MAX_WORK 65536  /* expansion steps for one character: more is refused */
#define GR_CACHE 16        /* masks kept per matcher */

enum { GE_END, GE_CHAR, GE_RULE };

typedef struct {
    uint8_t kind;
    int32_t arg; /* GE_CHAR: class index; GE_RULE: rule index */
} gr_elem;

typedef struct {
    uint32_t lo, hi;
} gr_range;

typedef struct {
    int first, n; /* ranges[first .. first + n) */
    bool neg;
} gr_class;

typedef struct {
    char *name;           /* NULL for the rules groups and repetitions make */
    int first_alt, n_alt; /* alts[first_alt .. + n_alt): element index of each alternative */
    bool defined;
    int ref_line, ref_col; /* where it was first referenced (for "undefined rule") */
} gr_rule;

struct grammar {
    gr_elem *el;
    int n_el, cap_el;
    int32_t *alts;
    int n_alts, cap_alts;
    gr_rule *rules;
    int n_rules, cap_rules;
    gr_class *cls;
    int n_cls, cap_cls;
    gr_range *ranges;
    int n_ranges, cap_ranges;
    int root;
};

typedef struct {
    int off, len; /* pool[off .. off + len), the top last */
} gr_span;

struct grammar_state {
    const grammar *g;
    int32_t *pool; /* the stacks' elements, one after the other */
    int n_pool, cap_pool;
    gr_span *st; /* the stacks */
    int n, cap;
    uint32_t pend; /* a character begun: its bits so far */
    int pend_need; /* continuation bytes still to come (0: none begun) */
    int pend_len;  /* the begun character's length in bytes */
    int32_t *ht;   /* while stacks are added: a hash set of their indices + 1 (0: free) */
    int ht_cap;    /* its slots, a power of two, at least twice n (0: none yet) */
    int work;      /* gr_expand calls since the position was cleared */
};

/* ==== growing arrays ========================================================================== */

static int gr_grow(void **p, int *cap, int need, size_t size)
{
    if (need <= *cap)
        return 0;
    int ncap = *cap ? *cap : 16;
    while (ncap < need)
        ncap *= 2;
    void *q = realloc(*p, (size_t)ncap * size);
    if (!q)
        return -1;
    *p = q;
    *cap = ncap;
    return 0;
}

/* ==== the parser ============================================================================== */

typedef struct {
    gr_elem *el;
    int n, cap;
} gr_seq;

typedef struct {
    grammar *g;
    const char *s, *end;
    const char *p;
    char *err;
    size_t errlen;
    bool failed;
} gr_parser;

static void gr_where(const gr_parser *ps, const char *at, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (const char *q = ps->s; q < at && q < ps->end; q++) {
        if (*q == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

static int gr_fail(gr_parser *ps, const char *at, const char *fmt, const char *what)
{
    if (!ps->failed) {
        int line, col;
        gr_where(ps, at, &line, &col);
        char msg[200];
        snprintf(msg, sizeof msg, fmt, what ? what : "");
        snprintf(ps->err, ps->errlen, "line %d, column %d: %s", line, col, msg);
        ps->failed = true;
    }
    return -1;
}

/* A byte of the grammar text as an error shows it: itself when printable ASCII, else \xHH. */
static void gr_show(char c, char out[8])
{
    unsigned char u = (unsigned char)c;
    if (u >= 0x20 && u < 0x7f)
        snprintf(out, 8, "%c", c);
    else
        snprintf(out, 8, "\\x%02x", u);
}

static int gr_oom(gr_parser *ps)
{
    if (!ps->failed)
        snprintf(ps->err, ps->errlen, "out of memory");
    ps->failed = true;
    return -1;
}

static bool gr_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

/* Skips spaces, newlines and comments. */
static void gr_skip(gr_parser *ps)
{
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
            ps->p++;
        } else if (c == '#') {
            while (ps->p < ps->end && *ps->p != '\n')
                ps->p++;
        } else {
            break;
        }
    }
}

/* Whether the text at p is `name ::=` (the start of the next rule). */
static bool gr_at_rule_start(const gr_parser *ps, const char *p)
{
    const char *q = p;
    while (q < ps->end && gr_name_char(*q))
        q++;
    if (q == p)
        return false;
    while (q < ps->end && (*q == ' ' || *q == '\t'))
        q++;
    return ps->end - q >= 3 && !memcmp(q, "::=", 3);
}

static int gr_rule_named(gr_parser *ps, const char *name, size_t len, const char *at)
{
    grammar *g = ps->g;
    for (int i = 0; i < g->n_rules; i++)
        if (g->rules[i].name && strlen(g->rules[i].name) == len &&
            !memcmp(g->rules[i].name, name, len))
            return i;
    if (gr_grow((void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof *g->rules))
        return gr_oom(ps);
    char *copy = strndup(name, len);
    if (!copy)
        return gr_oom(ps);
    gr_rule *r = &g->rules[g->n_rules];
    *r = (gr_rule){.name = copy};
    gr_where(ps, at, &r->ref_line, &r->ref_col);
    return g->n_rules++;
}

static int gr_new_rule(gr_parser *ps)
{
    grammar *g = ps->g;
    if (gr_grow((void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof *g->rules))
        return gr_oom(ps);
    g->rules[g->n_rules] = (gr_rule){0};
    return g->n_rules++;
}

static int gr_seq_push(gr_parser *ps, gr_seq *q, int kind, int32_t arg)
{
    if (gr_grow((void **)&q->el, &q->cap, q->n + 1, sizeof *q->el))
        return gr_oom(ps);
    q->el[q->n++] = (gr_elem){(uint8_t)kind, arg};
    return 0;
}

/* Appends a finished alternative (its elements and an END) to the grammar; its start index. */
static int gr_emit_alt(gr_parser *ps, const gr_elem *el, int n)
{
    grammar *g = ps->g;
    if (gr_grow((void **)&g->el, &g->cap_el, g->n_el + n + 1, sizeof *g->el))
        return gr_oom(ps);
    int start = g->n_el;
    if (n) /* (an empty alternative may come with no array at all) */
        memcpy(g->el + g->n_el, el, (size_t)n * sizeof *el);
    g->n_el += n;
    g->el[g->n_el++] = (gr_elem){GE_END, 0};
    return start;
}

/* Gives rule r the alternatives whose start indices are in starts. */
static int gr_define(gr_parser *ps, int r, const int32_t *starts, int n)
{
    grammar *g = ps->g;
    if (gr_grow((void **)&g->alts, &g->cap_alts, g->n_alts + n, sizeof *g->alts))
        return gr_oom(ps);
    memcpy(g->alts + g->n_alts, starts, (size_t)n * sizeof *starts);
    g->rules[r].first_alt = g->n_alts;
    g->rules[r].n_alt = n;
    g->rules[r].defined = true;
    g->n_alts += n;
    return 0;
}

/* A rule of the given alternatives (each a run of elements; NULL/0 = the empty one). */
static int gr_rule_of(gr_parser *ps, const gr_elem *a, int na, const gr_elem *b, int nb, bool two)
{
    int r = gr_new_rule(ps);
    if (r < 0)
        return -1;
    int32_t starts[2];
    starts[0] = gr_emit_alt(ps, a, na);
    if (two)
        starts[1] = gr_emit_alt(ps, b, nb);
    if (starts[0] < 0 || (two && starts[1] < 0) || gr_define(ps, r, starts, two ? 2 : 1))
        return -1;
    return r;
}

static int gr_add_class(gr_parser *ps, const gr_range *rg, int n, bool neg)
{
    grammar *g = ps->g;
    if (gr_grow((void **)&g->ranges, &g->cap_ranges, g->n_ranges + n, sizeof *g->ranges) ||
        gr_grow((void **)&g->cls, &g->cap_cls, g->n_cls + 1, sizeof *g->cls))
        return gr_oom(ps);
    if (n) /* [] matches nothing, [^] anything: no ranges */
        memcpy(g->ranges + g->n_ranges, rg, (size_t)n * sizeof *rg);
    g->cls[g->n_cls] = (gr_class){g->n_ranges, n, neg};
    g->n_ranges += n;
    return g->n_cls++;
}

/* One UTF-8 character of the grammar text at p (advanced); -1 when malformed. */
static long gr_utf8(const char **p, const char *end)
{
    uint32_t cp;
    size_t n = utf8_decode((const unsigned char *)*p, (size_t)(end - *p), &cp);
    if (!n)
        return -1;
    *p += n;
    return cp;
}

static int gr_hex(gr_parser *ps, int digits, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        char c = ps->p < ps->end ? *ps->p : 0;
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return gr_fail(ps, ps->p, "expected %s hex digits after the escape",
                           digits == 2   ? "2"
                           : digits == 4 ? "4"
                                         : "8");
        v = v << 4 | (uint32_t)d;
        ps->p++;
    }
    if (v > 0x10FFFF)
        return gr_fail(ps, ps->p, "escaped code point past U+10FFFF%s", NULL);
    *out = v;
    return 0;
}

/* One character of a literal or a class (an escape or a UTF-8 character); -1 on error. A class
 * (in_class) may name a surrogate as a range's end; a literal may not. */
static long gr_char(gr_parser *ps, bool in_class)
{
    if (ps->p >= ps->end)
        return gr_fail(ps, ps->p, "unexpected end of the grammar%s", NULL);
    if (*ps->p != '\\') {
        long c = gr_utf8(&ps->p, ps->end);
        return c < 0 ? gr_fail(ps, ps->p, "invalid UTF-8 in the grammar%s", NULL) : c;
    }
    ps->p++;
    if (ps->p >= ps->end)
        return gr_fail(ps, ps->p, "unexpected end of the grammar after \\%s", NULL);
    char e = *ps->p++;
    uint32_t v;
    switch (e) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'x': return gr_hex(ps, 2, &v) ? -1 : (long)v;
    case 'u':
    case 'U': {
        const char *at = ps->p - 2;
        if (gr_hex(ps, e == 'u' ? 4 : 8, &v))
            return -1;
        if (v < 0xD800 || v > 0xDFFF)
            return (long)v;
        /* a UTF-16 pair written as two escapes (as JSON writes them) is one character */
        uint32_t lo;
        if (v <= 0xDBFF && ps->end - ps->p >= 6 && ps->p[0] == '\\' && ps->p[1] == 'u') {
            const char *keep = ps->p;
            ps->p += 2;
            if (gr_hex(ps, 4, &lo))
                return -1;
            if (lo >= 0xDC00 && lo <= 0xDFFF)
                return 0x10000 + ((long)(v - 0xD800) << 10) + (lo - 0xDC00);
            ps->p = keep;
        }
        if (in_class) /* a range may run through the surrogates: they never match */
            return (long)v;
        char what[16];
        snprintf(what, sizeof what, "u%04X", (unsigned)v);
        return gr_fail(ps, at, "\\%s is half of a UTF-16 pair, not a character", what);
    }
    case '\\':
    case '"':
    case '\'':
    case '/':
    case ']':
    case '[':
    case '-':
    case '^': return e;
    default: {
        char what[8];
        gr_show(e, what);
        return gr_fail(ps, ps->p - 2, "unknown escape \\%s", what);
    }
    }
}

static int gr_alternatives(gr_parser *ps, int rule, bool in_group);

/* [ ... ] at ps->p; pushes its class onto q. */
static int gr_class_item(gr_parser *ps, gr_seq *q)
{
    const char *open = ps->p++;
    bool neg = ps->p < ps->end && *ps->p == '^';
    ps->p += neg;
    gr_range rg[256];
    int n = 0;
    while (ps->p < ps->end && *ps->p != ']') {
        long lo = gr_char(ps, true);
        if (lo < 0)
            return -1;
        long hi = lo;
        if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
            ps->p++;
            hi = gr_char(ps, true);
            if (hi < 0)
                return -1;
            if (hi < lo)
                return gr_fail(ps, ps->p, "a class range runs backwards%s", NULL);
        }
        if (n == (int)(sizeof rg / sizeof *rg))
            return gr_fail(ps, ps->p, "a character class holds at most 256 ranges%s", NULL);
        rg[n++] = (gr_range){(uint32_t)lo, (uint32_t)hi};
    }
    if (ps->p >= ps->end)
        return gr_fail(ps, open, "unterminated character class%s", NULL);
    ps->p++;
    int c = gr_add_class(ps, rg, n, neg);
    return c < 0 ? -1 : gr_seq_push(ps, q, GE_CHAR, c);
}

/* Wraps q's elements from `from` on (the last item) into a repetition of min..max (max < 0: no
 * bound), replacing them. */
static int gr_repeat(gr_parser *ps, gr_seq *q, int from, long min, long max)
{
    int n_item = q->n - from;
    gr_elem item[1];
    if (n_item == 0) /* "" or (an empty group inlined) */
        return gr_fail(ps, ps->p, "an empty item cannot be repeated%s", NULL);
    if (n_item == 1) {
        item[0] = q->el[from];
    } else { /* several elements: a rule of its own */
        int r = gr_rule_of(ps, q->el + from, n_item, NULL, 0, false);
        if (r < 0)
            return -1;
        item[0] = (gr_elem){GE_RULE, r};
    }
    q->n = from;
    for (long i = 0; i < min; i++)
        if (gr_seq_push(ps, q, item[0].kind, item[0].arg))
            return -1;
    if (max < 0) { /* R ::= item R | (empty) */
        int r = gr_new_rule(ps);
        if (r < 0)
            return -1;
        gr_elem two[2] = {item[0], {GE_RULE, r}};
        int32_t starts[2] = {gr_emit_alt(ps, two, 2), gr_emit_alt(ps, NULL, 0)};
        if (starts[0] < 0 || starts[1] < 0 || gr_define(ps, r, starts, 2))
            return -1;
        return gr_seq_push(ps, q, GE_RULE, r);
    }
    int inner = -1; /* O_k ::= item O_(k-1) | (empty), O_1 ::= item | (empty) */
    for (long k = 0; k < max - min; k++) {
        gr_elem two[2] = {item[0], {GE_RULE, inner}};
        inner = gr_rule_of(ps, two, inner < 0 ? 1 : 2, NULL, 0, true);
        if (inner < 0)
            return -1;
    }
    return inner < 0 ? 0 : gr_seq_push(ps, q, GE_RULE, inner);
}

static long gr_number(gr_parser *ps)
{
    long v = 0;
    const char *start = ps->p;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        v = v * 10 + (*ps->p++ - '0');
        if (v > GR_MAX_REPEAT)
            return gr_fail(ps, start, "a repetition bound above 4096%s", NULL);
    }
    return ps->p == start ? gr_fail(ps, start, "expected a number in {m,n}%s", NULL) : v;
}

/* { m } { m , } { m , n } at ps->p, applied to the item starting at from. */
static int gr_braces(gr_parser *ps, gr_seq *q, int from)
{
    const char *open = ps->p++;
    gr_skip(ps);
    long min = gr_number(ps), max;
    if (min < 0)
        return -1;
    gr_skip(ps);
    if (ps->p < ps->end && *ps->p == ',') {
        ps->p++;
        gr_skip(ps);
        max = ps->p < ps->end && *ps->p == '}' ? -1 : gr_number(ps);
        if (max < -1 || (ps->failed))
            return -1;
    } else {
        max = min;
    }
    gr_skip(ps);
    if (ps->p >= ps->end || *ps->p != '}')
        return gr_fail(ps, open, "unterminated {m,n}%s", NULL);
    ps->p++;
    if (max >= 0 && max < min)
        return gr_fail(ps, open, "{m,n} with n below m%s", NULL);
    return gr_repeat(ps, q, from, min, max);
}

/* One alternative: items until '|', ')', the next rule or the end. */
static int gr_sequence(gr_parser *ps, gr_seq *q, bool in_group)
{
    for (;;) {
        gr_skip(ps);
        if (ps->p >= ps->end || *ps->p == '|' || *ps->p == ')')
            return 0;
        if (!in_group && gr_at_rule_start(ps, ps->p))
            return 0;
        int from = q->n;
        char c = *ps->p;
        if (c == '"') {
            const char *open = ps->p++;
            while (ps->p < ps->end && *ps->p != '"') {
                long ch = gr_char(ps, false);
                if (ch < 0)
                    return -1;
                gr_range rg = {(uint32_t)ch, (uint32_t)ch};
                int k = gr_add_class(ps, &rg, 1, false);
                if (k < 0 || gr_seq_push(ps, q, GE_CHAR, k))
                    return -1;
            }
            if (ps->p >= ps->end)
                return gr_fail(ps, open, "unterminated literal%s", NULL);
            ps->p++;
        } else if (c == '[') {
            if (gr_class_item(ps, q))
                return -1;
        } else if (c == '.') {
            ps->p++;
            gr_range rg = {0, 0x10FFFF};
            int k = gr_add_class(ps, &rg, 1, false);
            if (k < 0 || gr_seq_push(ps, q, GE_CHAR, k))
                return -1;
        } else if (c == '(') {
            const char *open = ps->p++;
            int r = gr_new_rule(ps);
            if (r < 0 || gr_alternatives(ps, r, true))
                return -1;
            if (ps->p >= ps->end || *ps->p != ')')
                return gr_fail(ps, open, "unclosed parenthesis%s", NULL);
            ps->p++;
            if (gr_seq_push(ps, q, GE_RULE, r))
                return -1;
        } else if (gr_name_char(c)) {
            const char *name = ps->p;
            while (ps->p < ps->end && gr_name_char(*ps->p))
                ps->p++;
            int r = gr_rule_named(ps, name, (size_t)(ps->p - name), name);
            if (r < 0 || gr_seq_push(ps, q, GE_RULE, r))
                return -1;
        } else {
            char what[8];
            gr_show(c, what);
            return gr_fail(ps, ps->p, "unexpected '%s'", what);
        }
        /* postfix operators on the item just read */
        for (;;) {
            char o = ps->p < ps->end ? *ps->p : 0;
            int rc = 0;
            if (o == '*' || o == '+' || o == '?') {
                ps->p++;
                rc = gr_repeat(ps, q, from, o == '+', o == '?' ? 1 : -1);
            } else if (o == '{') {
                rc = gr_braces(ps, q, from);
            } else {
                break;
            }
            if (rc)
                return -1;
        }
    }
}

/* alternative ('|' alternative)* into rule r. */
static int gr_alternatives(gr_parser *ps, int rule, bool in_group)
{
    int32_t *starts = NULL;
    int n = 0, cap = 0, rc = 0;
    gr_seq q = {0};
    for (;;) {
        q.n = 0;
        if (gr_sequence(ps, &q, in_group)) {
            rc = -1;
            break;
        }
        int s = gr_emit_alt(ps, q.el, q.n);
        if (s < 0 || gr_grow((void **)&starts, &cap, n + 1, sizeof *starts)) {
            rc = gr_oom(ps);
            break;
        }
        starts[n++] = s;
        gr_skip(ps);
        if (ps->p < ps->end && *ps->p == '|') {
            ps->p++;
            continue;
        }
        break;
    }
    if (!rc)
        rc = gr_define(ps, rule, starts, n);
    free(starts);
    free(q.el);
    return rc;
}

/* ==== checks after parsing ==================================================================== */

static bool gr_check(gr_parser *ps)
{
    grammar *g = ps->g;
    for (int r = 0; r < g->n_rules; r++)
        if (!g->rules[r].defined) {
            snprintf(ps->err, ps->errlen, "line %d, column %d: the rule '%s' is not defined",
                     g->rules[r].ref_line, g->rules[r].ref_col, g->rules[r].name);
            return false;
        }
    size_t nr = g->n_rules > 0 ? (size_t)g->n_rules : 1;
    bool *nullable = calloc(nr, 1);
    int *mark = calloc(nr, sizeof *mark);
    int *todo = malloc(nr * 2 * sizeof *todo);
    bool ok = nullable && mark && todo;
    if (!ok)
        snprintf(ps->err, ps->errlen, "out of memory");
    /* which rules can match nothing: a fixpoint */
    for (bool changed = ok; changed;) {
        changed = false;
        for (int r = 0; r < g->n_rules; r++) {
            if (nullable[r])
                continue;
            const gr_rule *R = &g->rules[r];
            for (int a = 0; a < R->n_alt && !nullable[r]; a++) {
                int p = g->alts[R->first_alt + a];
                while (g->el[p].kind == GE_RULE && nullable[g->el[p].arg])
                    p++;
                if (g->el[p].kind == GE_END)
                    nullable[r] = changed = true;
            }
        }
    }
    /* left recursion: a rule reaching itself at its left edge (depth-first, 1 = on the path) */
    for (int start = 0; ok && start < g->n_rules; start++) {
        if (mark[start])
            continue;
        int top = 0;
        todo[top++] = start;
        todo[top++] = 0; /* the next left-edge reference of this rule to visit */
        mark[start] = 1;
        while (ok && top) {
            int r = todo[top - 2], k = todo[top - 1]++;
            /* the k-th left-edge reference of r */
            const gr_rule *R = &g->rules[r];
            int seen = 0, next = -1;
            for (int a = 0; a < R->n_alt && next < 0; a++)
                for (int p = g->alts[R->first_alt + a]; g->el[p].kind == GE_RULE; p++) {
                    if (seen++ == k) {
                        next = g->el[p].arg;
                        break;
                    }
                    if (!nullable[g->el[p].arg])
                        break;
                }
            if (next < 0) {
                mark[r] = 2;
                top -= 2;
            } else if (mark[next] == 1) {
                const char *name = g->rules[next].name;
                snprintf(ps->err, ps->errlen,
                         "the rule '%s' is left-recursive: it can reach itself without matching "
                         "a character (write the repetition on the right, or use * and +)",
                         name ? name : "(a group or repetition)");
                ok = false;
            } else if (!mark[next]) {
                if (top + 2 > g->n_rules * 2) {
                    int *grown = realloc(todo, (size_t)(top + 2) * 2 * sizeof *todo);
                    if (!grown) {
                        snprintf(ps->err, ps->errlen, "out of memory");
                        ok = false;
                        break;
                    }
                    todo = grown;
                }
                mark[next] = 1;
                todo[top++] = next;
                todo[top++] = 0;
            }
        }
    }
    free(nullable);
    free(mark);
    free(todo);
    return ok;
}

grammar *grammar_parse(const char *text, size_t len, char *err, size_t errlen)
{
    grammar *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    gr_parser ps = {.g = g, .s = text, .end = text + len, .p = text, .err = err, .errlen = errlen};
    int n_named = 0;
    for (;;) {
        gr_skip(&ps);
        if (ps.p >= ps.end)
            break;
        const char *name = ps.p;
        if (!gr_at_rule_start(&ps, ps.p)) {
            gr_fail(&ps, ps.p, "expected a rule: name ::= ...%s", NULL);
            break;
        }
        while (gr_name_char(*ps.p))
            ps.p++;
        size_t nlen = (size_t)(ps.p - name);
        while (*ps.p != ':') /* gr_at_rule_start saw spaces, then ::= */
            ps.p++;
        ps.p += 3;
        int r = gr_rule_named(&ps, name, nlen, name);
        if (r < 0)
            break;
        if (g->rules[r].defined) {
            char what[80];
            snprintf(what, sizeof what, "%.*s", (int)(nlen > 64 ? 64 : nlen), name);
            gr_fail(&ps, name, "the rule '%s' is defined twice", what);
            break;
        }
        if (gr_alternatives(&ps, r, false))
            break;
        if (ps.p < ps.end && *ps.p == ')') {
            gr_fail(&ps, ps.p, "unbalanced ')'%s", NULL);
            break;
        }
        n_named++;
    }
    g->root = -1;
    for (int r = 0; r < g->n_rules && !ps.failed; r++)
        if (g->rules[r].name && !strcmp(g->rules[r].name, "root"))
            g->root = r;
    if (!ps.failed && g->root < 0) {
        snprintf(err, errlen,
                 n_named ? "the grammar has no rule named root"
                         : "the grammar is empty (it needs a rule named root)");
        ps.failed = true;
    }
    if (!ps.failed && !gr_check(&ps))
        ps.failed = true;
    if (ps.failed) {
        grammar_free(&g);
        return NULL;
    }
    return g;
}

void grammar_free(grammar **gp)
{
    grammar *g = *gp;
    if (!g)
        return;
    for (int r = 0; r < g->n_rules; r++)
        free(g->rules[r].name);
    free(g->rules);
    free(g->el);
    free(g->alts);
    free(g->cls);
    free(g->ranges);
    free(g);
    *gp = NULL;
}

int grammar_n_rules(const grammar *g)
{
    return g->n_rules;
}

/* ==== positions =============================================================================== */

static void gr_state_clear(grammar_state *s)
{
    s->n = 0;
    s->n_pool = 0;
    s->pend = 0;
    s->pend_need = 0;
    s->work = 0;
    if (s->ht_cap)
        memset(s->ht, 0, (size_t)s->ht_cap * sizeof *s->ht);
}

static bool gr_same(const grammar_state *s, int i, const int32_t *st, int len)
{
    return s->st[i].len == len &&
           (!len || !memcmp(s->pool + s->st[i].off, st, (size_t)len * sizeof *st));
}

/* The top element of stack i (which is not empty). */
static inline int32_t gr_top(const grammar_state *s, int i)
{
    return s->pool[s->st[i].off + s->st[i].len - 1];
}

static uint32_t gr_hash(const int32_t *st, int len)
{
    uint32_t h = 2166136261u ^ (uint32_t)len;
    for (int i = 0; i < len; i++)
        h = (h ^ (uint32_t)st[i]) * 16777619u;
    return h;
}

/* The hash set's slot for st: the one holding an equal stack, else the free one to take. Slots
 * naming a stack past n (a set left from before a copy) count as taken by another. */
static int32_t *gr_slot(grammar_state *s, const int32_t *st, int len)
{
    uint32_t m = (uint32_t)s->ht_cap - 1;
    for (uint32_t i = gr_hash(st, len) & m;; i = (i + 1) & m) {
        int32_t k = s->ht[i];
        if (!k || (k <= s->n && gr_same(s, k - 1, st, len)))
            return &s->ht[i];
    }
}

/* Doubles the hash set (at least 64 slots) and enters every stack. */
static int gr_rehash(grammar_state *s)
{
    int cap = s->ht_cap ? 2 * s->ht_cap : 64;
    int32_t *ht = calloc((size_t)cap, sizeof *ht);
    if (!ht)
        return -1;
    free(s->ht);
    s->ht = ht;
    s->ht_cap = cap;
    for (int i = 0; i < s->n; i++)
        *gr_slot(s, s->pool + s->st[i].off, s->st[i].len) = i + 1;
    return 0;
}

/* Adds stack st (len elements) unless already there; -1 when out of memory or too many. */
static int gr_add_stack(grammar_state *s, const int32_t *st, int len)
{
    if (2 * (s->n + 1) > s->ht_cap && gr_rehash(s))
        return -1;
    int32_t *slot = gr_slot(s, st, len);
    if (*slot)
        return 0;
    if (s->n >= GR_MAX_STACKS || gr_grow((void **)&s->st, &s->cap, s->n + 1, sizeof *s->st) ||
        gr_grow((void **)&s->pool, &s->cap_pool, s->n_pool + len, sizeof *s->pool))
        return -1;
    if (len) /* (an empty stack may come before the pool has memory) */
        memcpy(s->pool + s->n_pool, st, (size_t)len * sizeof *st);
    s->st[s->n++] = (gr_span){s->n_pool, len};
    s->n_pool += len;
    *slot = s->n;
    return 0;
}

/* Expands st (whose top may be an END or a rule reference) until every resulting stack's top is
 * a character class or the stack is empty; each is added to s. st has room for GR_MAX_DEPTH. */
static int gr_expand(grammar_state *s, int32_t *st, int len)
{
    const grammar *g = s->g;
    if (++s->work > GR_MAX_WORK) /* an ambiguous grammar (nested repetitions): refused */
        return -1;
    for (;;) {
        if (!len)
            return gr_add_stack(s, st, 0);
        const gr_elem *e = &g->el[st[len - 1]];
        if (e->kind == GE_CHAR)
            return gr_add_stack(s, st, len);
        if (e->kind == GE_END) {
            len--;
            continue;
        }
        break;
    }
    int p = st[len - 1];
    const gr_rule *R = &g->rules[g->el[p].arg];
    int base = len - 1;
    if (g->el[p + 1].kind != GE_END) /* come back after the rule; a last reference does not */
        st[base++] = p + 1;
    if (base >= GR_MAX_DEPTH)
        return -1;
    if (R->n_alt == 1) {
        st[base] = g->alts[R->first_alt];
        return gr_expand(s, st, base + 1);
    }
    int32_t copy[base + 1]; /* base < GR_MAX_DEPTH: at most 1 KiB a level */
    memcpy(copy, st, (size_t)base * sizeof *copy);
    int rc = 0;
    for (int a = 0; a < R->n_alt && !rc; a++) {
        memcpy(st, copy, (size_t)base * sizeof *st);
        st[base] = g->alts[R->first_alt + a];
        rc = gr_expand(s, st, base + 1);
    }
    return rc;
}

static bool gr_class_has(const grammar *g, int c, uint32_t cp)
{
    const gr_class *k = &g->cls[c];
    bool in = false;
    for (int i = 0; i < k->n && !in; i++)
        in = cp >= g->ranges[k->first + i].lo && cp <= g->ranges[k->first + i].hi;
    return in != k->neg;
}

/* Whether class c holds some code point of [lo, hi]. */
static bool gr_class_meets(const grammar *g, int c, uint32_t lo, uint32_t hi)
{
    const gr_class *k = &g->cls[c];
    for (int i = 0; i < k->n; i++) {
        const gr_range *r = &g->ranges[k->first + i];
        if (k->neg ? (r->lo <= lo && r->hi >= hi) : (r->lo <= hi && r->hi >= lo))
            return !k->neg;
    }
    return k->neg;
}

/* dst = src advanced over code point cp; -1 when no stack takes it (or out of memory). */
static int gr_step_cp(const grammar_state *src, uint32_t cp, grammar_state *dst)
{
    const grammar *g = src->g;
    gr_state_clear(dst);
    dst->g = g;
    int32_t st[GR_MAX_DEPTH + 1];
    for (int i = 0; i < src->n; i++) {
        int len = src->st[i].len;
        if (!len)
            continue;
        const int32_t *s = src->pool + src->st[i].off;
        if (!gr_class_has(g, g->el[s[len - 1]].arg, cp))
            continue;
        memcpy(st, s, (size_t)len * sizeof *st);
        st[len - 1]++;
        if (gr_expand(dst, st, len))
            return -1;
    }
    return dst->n ? 0 : -1;
}

/* Whether some stack could take a character in [lo, hi]. */
static bool gr_could(const grammar_state *s, uint32_t lo, uint32_t hi)
{
    for (int i = 0; i < s->n; i++)
        if (s->st[i].len && gr_class_meets(s->g, s->g->el[gr_top(s, i)].arg, lo, hi))
            return true;
    return false;
}

int grammar_copy(grammar_state *dst, const grammar_state *src)
{
    if (gr_grow((void **)&dst->pool, &dst->cap_pool, src->n_pool, sizeof *dst->pool) ||
        gr_grow((void **)&dst->st, &dst->cap, src->n, sizeof *dst->st))
        return -1;
    dst->g = src->g;
    if (src->n_pool)
        memcpy(dst->pool, src->pool, (size_t)src->n_pool * sizeof *src->pool);
    if (src->n)
        memcpy(dst->st, src->st, (size_t)src->n * sizeof *src->st);
    dst->n = src->n;
    dst->n_pool = src->n_pool;
    dst->pend = src->pend;
    dst->pend_need = src->pend_need;
    dst->pend_len = src->pend_len;
    return 0;
}

/* dst = src advanced over one byte; -1 when refused. dst != src. */
static int gr_step_byte(const grammar_state *src, uint8_t b, grammar_state *dst)
{
    uint32_t v;
    int need, len = src->pend_len;
    if (!src->pend_need) {
        if (b < 0x80)
            return gr_step_cp(src, b, dst);
        if (b >= 0xC2 && b <= 0xDF)
            v = b & 0x1F, need = 1;
        else if ((b & 0xF0) == 0xE0)
            v = b & 0x0F, need = 2;
        else if (b >= 0xF0 && b <= 0xF4)
            v = b & 0x07, need = 3;
        else
            return -1;
        len = need + 1;
    } else {
        if ((b & 0xC0) != 0x80)
            return -1;
        v = src->pend << 6 | (b & 0x3F);
        need = src->pend_need - 1;
        if (!need) { /* whole: overlong forms and surrogates are not characters */
            if ((len == 3 && v < 0x800) || (len == 4 && v < 0x10000) ||
                (v >= 0xD800 && v <= 0xDFFF) || v > 0x10FFFF)
                return -1;
            return gr_step_cp(src, v, dst);
        }
    }
    /* the characters that begin so: no shorter than their length needs, none past U+10FFFF */
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    uint32_t lo = v << (6 * need), hi = lo | ((1u << (6 * need)) - 1);
    lo = lo < least[len] ? least[len] : lo;
    hi = hi > 0x10FFFF ? 0x10FFFF : hi;
    if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF) || !gr_could(src, lo, hi) ||
        grammar_copy(dst, src))
        return -1;
    dst->pend = v;
    dst->pend_need = need;
    dst->pend_len = len;
    return 0;
}

grammar_state *grammar_start(const grammar *g)
{
    grammar_state *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->g = g;
    int32_t st[GR_MAX_DEPTH + 1];
    const gr_rule *R = &g->rules[g->root];
    for (int a = 0; a < R->n_alt; a++) {
        st[0] = g->alts[R->first_alt + a];
        if (gr_expand(s, st, 1)) {
            grammar_state_free(&s);
            return NULL;
        }
    }
    return s;
}

grammar_state *grammar_clone(const grammar_state *src)
{
    grammar_state *s = calloc(1, sizeof *s);
    if (s && grammar_copy(s, src))
        grammar_state_free(&s);
    return s;
}

/* Frees what a position holds, not the position itself (scratch positions live on the stack). */
static void gr_state_release(grammar_state *s)
{
    free(s->pool);
    free(s->st);
    free(s->ht);
}

void grammar_state_free(grammar_state **sp)
{
    grammar_state *s = *sp;
    if (!s)
        return;
    gr_state_release(s);
    free(s);
    *sp = NULL;
}

/* Swaps the contents of two positions. */
static void gr_swap(grammar_state *a, grammar_state *b)
{
    grammar_state t = *a;
    *a = *b;
    *b = t;
}

/* s advanced over bytes, using tmp as scratch; s unchanged when refused. */
static int gr_feed_with(grammar_state *s, grammar_state *tmp, grammar_state *keep,
                        const char *bytes, size_t n)
{
    if (!n)
        return 0;
    if (n > 1 && grammar_copy(keep, s))
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (gr_step_byte(s, (uint8_t)bytes[i], tmp)) {
            if (i && n > 1)
                gr_swap(s, keep); /* back to where it was */
            return -1;
        }
        gr_swap(s, tmp);
    }
    return 0;
}

int grammar_feed(grammar_state *s, const char *bytes, size_t n)
{
    grammar_state tmp = {.g = s->g}, keep = {.g = s->g};
    int rc = gr_feed_with(s, &tmp, &keep, bytes, n);
    gr_state_release(&tmp);
    gr_state_release(&keep);
    return rc;
}

bool grammar_accepting(const grammar_state *s)
{
    if (s->pend_need)
        return false;
    for (int i = 0; i < s->n; i++)
        if (!s->st[i].len)
            return true;
    return false;
}

bool grammar_done(const grammar_state *s)
{
    return !s->pend_need && s->n == 1 && !s->st[0].len;
}

size_t grammar_forced(const grammar_state *s, char *out, size_t cap)
{
    if (s->pend_need)
        return 0;
    const grammar *g = s->g;
    grammar_state a = {.g = g}, b = {.g = g};
    size_t n = 0;
    if (grammar_copy(&a, s))
        return 0;
    while (!grammar_accepting(&a)) {
        long cp = -1; /* the one character every stack's top allows, if there is one */
        for (int i = 0; i < a.n && cp != -2; i++) {
            const gr_class *k = &g->cls[g->el[gr_top(&a, i)].arg];
            const gr_range *r = k->n ? &g->ranges[k->first] : NULL;
            bool one = r && !k->neg && k->n == 1 && r->lo == r->hi;
            cp = one && (cp < 0 || cp == (long)r->lo) ? (long)r->lo : -2;
        }
        if (cp < 0 || (cp >= 0xD800 && cp <= 0xDFFF)) /* a surrogate is no text */
            break;
        char u[4];
        size_t m = utf8_put((uint32_t)cp, u);
        if (n + m > cap || gr_step_cp(&a, (uint32_t)cp, &b))
            break;
        gr_swap(&a, &b);
        memcpy(out + n, u, m);
        n += m;
    }
    gr_state_release(&a);
    gr_state_release(&b);
    return n;
}

bool grammar_matches(const grammar *g, const char *text, size_t n)
{
    grammar_state *s = grammar_start(g);
    bool ok = s && !grammar_feed(s, text, n) && grammar_accepting(s);
    grammar_state_free(&s);
    return ok;
}

/* ==== token masks ============================================================================= */

typedef struct {
    int32_t child;   /* first child node, -1 none */
    int32_t sibling; /* next sibling, -1 none */
    int32_t tok;     /* first token ending here (index into tok_next chain), -1 none */
    uint8_t byte;
} gr_node;

typedef struct {
    int32_t *key; /* the position written out (stacks with their lengths, then the partial char) */
    int key_len;
    uint64_t hash;
    uint64_t *mask;
    uint64_t used;
} gr_cached;

/* The vocabulary's token bytes in a trie, shared by every matcher over the same tokenizer. */
struct grammar_vocab {
    const tokenizer *tok;
    int V, words;
    gr_node *nodes;
    int n_nodes, cap_nodes;
    int32_t *tok_next; /* tokens ending at the same node: a chain */
    int max_len;       /* the longest token in bytes */
    const int32_t *eog;
    int n_eog;
};

struct grammar_matcher {
    const grammar *g;
    const grammar_vocab *v;
    grammar_state **depth; /* one scratch position per trie depth */
    grammar_state *tmp, *keep;
    gr_cached cache[GR_CACHE];
    uint64_t clock;
    int32_t *keybuf;
    int keycap;
};

static int gr_trie_child(grammar_vocab *m, int node, uint8_t b)
{
    int prev = -1;
    for (int c = m->nodes[node].child; c >= 0; prev = c, c = m->nodes[c].sibling)
        if (m->nodes[c].byte == b)
            return c;
    if (gr_grow((void **)&m->nodes, &m->cap_nodes, m->n_nodes + 1, sizeof *m->nodes))
        return -1;
    int c = m->n_nodes++;
    m->nodes[c] = (gr_node){-1, -1, -1, b};
    if (prev < 0)
        m->nodes[node].child = c;
    else
        m->nodes[prev].sibling = c;
    return c;
}

static bool gr_token_text(const tokenizer *tok, int32_t id)
{
    return !tokenizer_is_special(tok, id) && !tokenizer_is_eog(tok, id);
}

grammar_vocab *grammar_vocab_new(const tokenizer *tok)
{
    grammar_vocab *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->tok = tok;
    m->V = tokenizer_vocab_size(tok);
    m->words = (m->V + 63) / 64;
    m->n_eog = tokenizer_eog(tok, &m->eog);
    m->tok_next = malloc((size_t)m->V * sizeof *m->tok_next);
    bool ok = m->tok_next && !gr_grow((void **)&m->nodes, &m->cap_nodes, 1, sizeof *m->nodes);
    if (ok)
        m->nodes[m->n_nodes++] = (gr_node){-1, -1, -1, 0};
    for (int32_t id = 0; ok && id < m->V; id++) {
        const char *b;
        size_t n = tokenizer_piece(tok, id, &b);
        if (!n || !gr_token_text(tok, id))
            continue;
        int node = 0;
        for (size_t i = 0; i < n && node >= 0; i++)
            node = gr_trie_child(m, node, (uint8_t)b[i]);
        if (node < 0) {
            ok = false;
            break;
        }
        m->tok_next[id] = m->nodes[node].tok;
        m->nodes[node].tok = id;
        if ((int)n > m->max_len)
            m->max_len = (int)n;
    }
    if (!ok)
        grammar_vocab_free(&m);
    return m;
}

void grammar_vocab_free(grammar_vocab **vp)
{
    grammar_vocab *v = *vp;
    if (!v)
        return;
    free(v->nodes);
    free(v->tok_next);
    free(v);
    *vp = NULL;
}

grammar_matcher *grammar_matcher_new(const grammar *g, const grammar_vocab *v)
{
    grammar_matcher *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->g = g;
    m->v = v;
    m->depth = calloc((size_t)v->max_len + 1, sizeof *m->depth);
    bool ok = m->depth != NULL;
    for (int d = 0; ok && d <= v->max_len; d++)
        ok = (m->depth[d] = calloc(1, sizeof **m->depth)) != NULL;
    ok = ok && (m->tmp = calloc(1, sizeof *m->tmp)) && (m->keep = calloc(1, sizeof *m->keep));
    for (int i = 0; ok && i < GR_CACHE; i++)
        ok = (m->cache[i].mask = malloc((size_t)v->words * sizeof(uint64_t))) != NULL;
    if (!ok)
        grammar_matcher_free(&m);
    return m;
}

void grammar_matcher_free(grammar_matcher **mp)
{
    grammar_matcher *m = *mp;
    if (!m)
        return;
    if (m->depth)
        for (int d = 0; d <= m->v->max_len; d++)
            grammar_state_free(&m->depth[d]);
    free(m->depth);
    grammar_state_free(&m->tmp);
    grammar_state_free(&m->keep);
    for (int i = 0; i < GR_CACHE; i++) {
        free(m->cache[i].mask);
        free(m->cache[i].key);
    }
    free(m->keybuf);
    free(m);
    *mp = NULL;
}

/* The tokens below node, each allowed after the position at depth d. */
static int gr_walk(grammar_matcher *m, int node, int d, uint64_t *mask)
{
    const grammar_vocab *v = m->v;
    for (int c = v->nodes[node].child; c >= 0; c = v->nodes[c].sibling) {
        if (gr_step_byte(m->depth[d], v->nodes[c].byte, m->depth[d + 1]))
            continue;
        for (int32_t t = v->nodes[c].tok; t >= 0; t = v->tok_next[t])
            mask[t / 64] |= 1ull << (t % 64);
        if (v->nodes[c].child >= 0 && gr_walk(m, c, d + 1, mask))
            return -1;
    }
    return 0;
}

/* The position written out as a key into m->keybuf; its length. */
static int gr_key(grammar_matcher *m, const grammar_state *s)
{
    int need = s->n_pool + s->n + 3;
    if (gr_grow((void **)&m->keybuf, &m->keycap, need, sizeof *m->keybuf))
        return -1;
    int k = 0;
    for (int i = 0; i < s->n; i++) {
        m->keybuf[k++] = s->st[i].len;
        if (s->st[i].len)
            memcpy(m->keybuf + k, s->pool + s->st[i].off, (size_t)s->st[i].len * sizeof *m->keybuf);
        k += s->st[i].len;
    }
    m->keybuf[k++] = (int32_t)s->pend;
    m->keybuf[k++] = s->pend_need;
    m->keybuf[k++] = s->pend_len;
    return k;
}

const uint64_t *grammar_mask(grammar_matcher *m, const grammar_state *s)
{
    int klen = gr_key(m, s);
    if (klen < 0)
        return NULL;
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < klen; i++)
        h = (h ^ (uint32_t)m->keybuf[i]) * 1099511628211ull;
    m->clock++;
    gr_cached *slot = &m->cache[0];
    for (int i = 0; i < GR_CACHE; i++) {
        gr_cached *c = &m->cache[i];
        if (c->key && c->hash == h && c->key_len == klen &&
            !memcmp(c->key, m->keybuf, (size_t)klen * sizeof *c->key)) {
            c->used = m->clock;
            return c->mask;
        }
        if (c->used < slot->used)
            slot = c;
    }
    int32_t *key = realloc(slot->key, (size_t)klen * sizeof *key);
    if (!key)
        return NULL;
    slot->key = key;
    slot->key_len = 0;
    const grammar_vocab *v = m->v;
    memset(slot->mask, 0, (size_t)v->words * sizeof *slot->mask);
    if (grammar_copy(m->depth[0], s) || gr_walk(m, 0, 0, slot->mask))
        return NULL;
    bool end = grammar_accepting(s);
    if (grammar_done(s)) /* nothing may follow: only the end */
        memset(slot->mask, 0, (size_t)v->words * sizeof *slot->mask);
    for (int i = 0; i < v->n_eog && end; i++)
        if (v->eog[i] >= 0 && v->eog[i] < v->V)
            slot->mask[v->eog[i] / 64] |= 1ull << (v->eog[i] % 64);
    memcpy(key, m->keybuf, (size_t)klen * sizeof *key);
    slot->key_len = klen;
    slot->hash = h;
    slot->used = m->clock;
    return slot->mask;
}

int grammar_advance(grammar_matcher *m, grammar_state *s, int32_t id)
{
    const grammar_vocab *v = m->v;
    if (id < 0 || id >= v->V)
        return -1;
    if (tokenizer_is_eog(v->tok, id))
        return grammar_accepting(s) ? 0 : -1;
    if (!gr_token_text(v->tok, id))
        return -1;
    const char *b;
    size_t n = tokenizer_piece(v->tok, id, &b);
    if (!n)
        return -1;
    return gr_feed_with(s, m->tmp, m->keep, b, n);
}

bool grammar_allows(grammar_matcher *m, const grammar_state *s, int32_t id)
{
    if (id < 0 || id >= m->v->V)
        return false;
    if (tokenizer_is_eog(m->v->tok, id))
        return grammar_accepting(s);
    if (grammar_copy(m->depth[0], s))
        return false;
    return !grammar_advance(m, m->depth[0], id);
}
