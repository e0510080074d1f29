/*
 * model/jinja.c — a Jinja interpreter for chat templates (model/jinja.h says which subset).
 *
 * The template is cut into text, output and statement pieces (whitespace control applied as
 * jinja2 applies it with trim_blocks and lstrip_blocks), the statements are matched into a tree
 * (if/elif/else, for/else, set), and the tree is run. Expressions are kept as source text and
 * evaluated by a recursive-descent evaluator each time they run: a chat template is short and
 * its loops run over a handful of messages, so no syntax tree is built. The evaluator has a
 * `live` flag: the branch of an `and`, `or` or `if ... else` that is not taken is parsed but not
 * evaluated (raise_exception in it does nothing). Every value lives in one arena freed after the
 * render.
 */
#define _GNU_SOURCE /* memmem */
#include "model/jinja.h"
#include "base/buf.h"
#include "base/utf8.h"

#include <ctype.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ===== arena ===== */

typedef struct jchunk {
    struct jchunk *next;
    size_t used, cap;
    char data[];
} jchunk;

typedef struct jctx jctx;

enum { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_FUNC };

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct {
    int t;
    union {
        long long i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        jlist *l;
        jdict *d;
    };
    bool ns; /* a namespace(): its attributes may be set */
} jv;
struct jlist {
    int n, cap;
    jv *v;
};
struct jdict {
    int n, cap;
    jv *k; /* string keys */
    jv *v;
};

/* ===== pieces and nodes ===== */

enum { P_TEXT, P_OUT, P_STMT };
typedef struct {
    int kind;
    const char *p; /* text, or the expression / statement source */
    size_t n;
    int line;
} jpiece;

enum { N_TEXT, N_OUT, N_IF, N_FOR, N_SET };
typedef struct jnode jnode;
struct jnode {
    int kind, line;
    const char *p; /* text / expression / condition / iterable / set value */
    size_t n;
    jnode *body, *alt, *next; /* alt: an if's else (an N_IF for elif), a for's else */
    const char *tgt;          /* for: the loop names ("a, b"); set: the target */
    size_t tgtn;
    const char *cond; /* for: the `if` filter */
    size_t condn;
};

typedef struct {
    const char *name;
    size_t n;
    jv v;
} jvar;

struct jctx {
    jchunk *arena;
    jvar *vars;
    int n_vars, cap_vars;
    char *out;
    size_t out_n, out_cap;
    char *err;
    size_t errlen;
    jmp_buf fail;
    int line;
    const char *src; /* the template (line numbers of expressions) */
    int depth;       /* nesting of expressions and statements being read or run */
    long steps;      /* nodes run and loop turns (a bound on a template's work) */
    bool json;       /* reading the caller's JSON variables, not template source */
};

/* Bounds on what a template may ask for (a file's template is outside input): nesting, the work
 * of one rendering, its text, a range. */
#define JINJA_MAX_DEPTH 200
#define JINJA_MAX_STEPS 10000000L
#define JINJA_MAX_OUT ((size_t)16 << 20)
#define JINJA_MAX_RANGE 1000000LL

static void *ja(jctx *c, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!c->arena || c->arena->used + n > c->arena->cap) {
        size_t cap = n > 65536 ? n : 65536;
        jchunk *k = malloc(sizeof *k + cap);
        if (!k) {
            snprintf(c->err, c->errlen, "chat template: out of memory");
            longjmp(c->fail, 1);
        }
        k->next = c->arena;
        k->used = 0;
        k->cap = cap;
        c->arena = k;
    }
    void *p = c->arena->data + c->arena->used;
    c->arena->used += n;
    return p;
}

static void jfail(jctx *c, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->json)
        snprintf(c->err, c->errlen, "chat variables: %s", msg);
    else
        snprintf(c->err, c->errlen, "chat template, line %d: %s", c->line, msg);
    longjmp(c->fail, 1);
}

/* ===== values ===== */

static jv jv_undef(void)
{
    jv v = {0};
    v.t = JV_UNDEF;
    return v;
}
static jv jv_none(void)
{
    jv v = {0};
    v.t = JV_NONE;
    return v;
}
static jv jv_bool(bool b)
{
    jv v = {0};
    v.t = JV_BOOL;
    v.i = b;
    return v;
}
static jv jv_int(long long i)
{
    jv v = {0};
    v.t = JV_INT;
    v.i = i;
    return v;
}
static jv jv_float(double f)
{
    jv v = {0};
    v.t = JV_FLOAT;
    v.f = f;
    return v;
}
static jv jv_str(const char *p, size_t n)
{
    jv v = {0};
    v.t = JV_STR;
    v.s.p = p;
    v.s.n = n;
    return v;
}
static jv jv_strz(const char *p)
{
    return jv_str(p, strlen(p));
}
static jv jv_list(jctx *c)
{
    jv v = {0};
    v.t = JV_LIST;
    v.l = ja(c, sizeof *v.l);
    memset(v.l, 0, sizeof *v.l);
    return v;
}
static jv jv_dict(jctx *c)
{
    jv v = {0};
    v.t = JV_DICT;
    v.d = ja(c, sizeof *v.d);
    memset(v.d, 0, sizeof *v.d);
    return v;
}

/* An arena array of n used elements of `size` bytes with room for one more: the same array, or a
 * copy twice as large (*cap updated). */
static void *ja_room(jctx *c, void *v, int n, int *cap, size_t size)
{
    if (n < *cap)
        return v;
    int grown = *cap ? 2 * *cap : 8;
    void *nv = ja(c, (size_t)grown * size);
    if (n)
        memcpy(nv, v, (size_t)n * size);
    *cap = grown;
    return nv;
}

static void list_push(jctx *c, jlist *l, jv x)
{
    l->v = ja_room(c, l->v, l->n, &l->cap, sizeof *l->v);
    l->v[l->n++] = x;
}

static bool str_eq(jv a, const char *p, size_t n)
{
    return a.t == JV_STR && a.s.n == n && !memcmp(a.s.p, p, n);
}

static jv *dict_find(jdict *d, const char *k, size_t n)
{
    for (int i = 0; i < d->n; i++)
        if (str_eq(d->k[i], k, n))
            return &d->v[i];
    return NULL;
}

static void dict_set(jctx *c, jdict *d, jv k, jv v)
{
    if (k.t == JV_STR) {
        jv *have = dict_find(d, k.s.p, k.s.n);
        if (have) {
            *have = v;
            return;
        }
    }
    int cap = d->cap; /* keys and values grow together */
    d->k = ja_room(c, d->k, d->n, &cap, sizeof *d->k);
    d->v = ja_room(c, d->v, d->n, &d->cap, sizeof *d->v);
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

static bool truthy(jv v)
{
    switch (v.t) {
    case JV_BOOL:
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0;
    case JV_STR: return v.s.n > 0;
    case JV_LIST: return v.l->n > 0;
    case JV_DICT: return v.d->n > 0;
    case JV_FUNC: return true;
    default: return false;
    }
}

/* ===== text building ===== */

typedef struct {
    char *p;
    size_t n, cap;
} jbuf;

static void jb_put(jctx *c, jbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = ja(c, cap);
        if (b->n)
            memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void jb_puts(jctx *c, jbuf *b, const char *s)
{
    jb_put(c, b, s, strlen(s));
}

/* Python's repr of a float (the shortest text that reads back the same). */
static void fmt_float(char *out, size_t len, double f)
{
    if (isinf(f)) {
        snprintf(out, len, f > 0 ? "inf" : "-inf");
        return;
    }
    if (isnan(f)) {
        snprintf(out, len, "nan");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, len, "%.*g", prec, f);
        if (strtod(out, NULL) == f)
            break;
    }
    if (!strpbrk(out, ".eni"))
        strncat(out, ".0", len - strlen(out) - 1);
}

static void to_text(jctx *c, jbuf *b, jv v, bool repr);

static void repr_str(jctx *c, jbuf *b, jv v)
{
    bool dq = memchr(v.s.p, '\'', v.s.n) && !memchr(v.s.p, '"', v.s.n);
    jb_put(c, b, dq ? "\"" : "'", 1);
    for (size_t i = 0; i < v.s.n; i++) {
        unsigned char ch = (unsigned char)v.s.p[i];
        if (ch == '\\')
            jb_puts(c, b, "\\\\");
        else if (ch == '\n')
            jb_puts(c, b, "\\n");
        else if (ch == '\t')
            jb_puts(c, b, "\\t");
        else if (ch == '\r')
            jb_puts(c, b, "\\r");
        else if (ch == '\'' && !dq)
            jb_puts(c, b, "\\'");
        else
            jb_put(c, b, (const char *)&ch, 1);
    }
    jb_put(c, b, dq ? "\"" : "'", 1);
}

/* str() of a value ({{ x }}, ~, |string); repr inside lists and dicts, as Python prints them. */
static void to_text(jctx *c, jbuf *b, jv v, bool repr)
{
    char num[64];
    switch (v.t) {
    case JV_UNDEF: return;
    case JV_NONE: jb_puts(c, b, "None"); return;
    case JV_BOOL: jb_puts(c, b, v.i ? "True" : "False"); return;
    case JV_INT: snprintf(num, sizeof num, "%lld", v.i); jb_puts(c, b, num); return;
    case JV_FLOAT: fmt_float(num, sizeof num, v.f); jb_puts(c, b, num); return;
    case JV_STR:
        if (repr)
            repr_str(c, b, v);
        else
            jb_put(c, b, v.s.p, v.s.n);
        return;
    case JV_LIST:
        jb_puts(c, b, "[");
        for (int i = 0; i < v.l->n; i++) {
            if (i)
                jb_puts(c, b, ", ");
            to_text(c, b, v.l->v[i], true);
        }
        jb_puts(c, b, "]");
        return;
    case JV_DICT:
        if (v.ns) {
            jb_puts(c, b, "<Namespace>");
            return;
        }
        jb_puts(c, b, "{");
        for (int i = 0; i < v.d->n; i++) {
            if (i)
                jb_puts(c, b, ", ");
            to_text(c, b, v.d->k[i], true);
            jb_puts(c, b, ": ");
            to_text(c, b, v.d->v[i], true);
        }
        jb_puts(c, b, "}");
        return;
    default: jb_puts(c, b, "<function>"); return;
    }
}

static jv as_str(jctx *c, jv v)
{
    if (v.t == JV_STR)
        return v;
    jbuf b = {0};
    to_text(c, &b, v, false);
    return jv_str(b.p ? b.p : "", b.n);
}

/* json.dumps(v, ensure_ascii=False, indent=indent) */
static void to_json(jctx *c, jbuf *b, jv v, int indent, int depth)
{
    char num[64];
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE: jb_puts(c, b, "null"); return;
    case JV_BOOL: jb_puts(c, b, v.i ? "true" : "false"); return;
    case JV_INT: snprintf(num, sizeof num, "%lld", v.i); jb_puts(c, b, num); return;
    case JV_FLOAT:
        fmt_float(num, sizeof num, v.f);
        jb_puts(c, b, isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : isnan(v.f) ? "NaN" : num);
        return;
    case JV_STR:
        jb_puts(c, b, "\"");
        for (size_t i = 0; i < v.s.n; i++) {
            unsigned char ch = (unsigned char)v.s.p[i];
            if (ch == '"')
                jb_puts(c, b, "\\\"");
            else if (ch == '\\')
                jb_puts(c, b, "\\\\");
            else if (ch == '\n')
                jb_puts(c, b, "\\n");
            else if (ch == '\r')
                jb_puts(c, b, "\\r");
            else if (ch == '\t')
                jb_puts(c, b, "\\t");
            else if (ch == '\b')
                jb_puts(c, b, "\\b");
            else if (ch == '\f')
                jb_puts(c, b, "\\f");
            else if (ch < 0x20) {
                snprintf(num, sizeof num, "\\u%04x", ch);
                jb_puts(c, b, num);
            } else
                jb_put(c, b, (const char *)&ch, 1);
        }
        jb_puts(c, b, "\"");
        return;
    case JV_LIST:
    case JV_DICT: {
        bool list = v.t == JV_LIST;
        int n = list ? v.l->n : v.d->n;
        jb_puts(c, b, list ? "[" : "{");
        if (!n) {
            jb_puts(c, b, list ? "]" : "}");
            return;
        }
        for (int i = 0; i < n; i++) {
            if (i)
                jb_puts(c, b, indent >= 0 ? "," : ", ");
            if (indent >= 0) {
                jb_puts(c, b, "\n");
                for (int s = 0; s < indent * (depth + 1); s++)
                    jb_puts(c, b, " ");
            }
            if (!list) {
                to_json(c, b, v.d->k[i], indent, depth + 1);
                jb_puts(c, b, ": ");
            }
            to_json(c, b, list ? v.l->v[i] : v.d->v[i], indent, depth + 1);
        }
        if (indent >= 0) {
            jb_puts(c, b, "\n");
            for (int s = 0; s < indent * depth; s++)
                jb_puts(c, b, " ");
        }
        jb_puts(c, b, list ? "]" : "}");
        return;
    }
    default: jfail(c, "tojson of a function");
    }
}

static bool jv_equal(jv a, jv b)
{
    bool an = a.t == JV_INT || a.t == JV_FLOAT || a.t == JV_BOOL;
    bool bn = b.t == JV_INT || b.t == JV_FLOAT || b.t == JV_BOOL;
    if (an && bn) {
        double x = a.t == JV_FLOAT ? a.f : (double)a.i, y = b.t == JV_FLOAT ? b.f : (double)b.i;
        return x == y;
    }
    if (a.t != b.t)
        return (a.t == JV_UNDEF || a.t == JV_NONE) && (b.t == JV_UNDEF || b.t == JV_NONE) &&
               a.t == b.t;
    switch (a.t) {
    case JV_STR: return a.s.n == b.s.n && !memcmp(a.s.p, b.s.p, a.s.n);
    case JV_LIST:
        if (a.l->n != b.l->n)
            return false;
        for (int i = 0; i < a.l->n; i++)
            if (!jv_equal(a.l->v[i], b.l->v[i]))
                return false;
        return true;
    case JV_DICT:
        if (a.d->n != b.d->n)
            return false;
        for (int i = 0; i < a.d->n; i++) {
            jv *o = a.d->k[i].t == JV_STR ? dict_find(b.d, a.d->k[i].s.p, a.d->k[i].s.n) : NULL;
            if (!o || !jv_equal(a.d->v[i], *o))
                return false;
        }
        return true;
    default: return true; /* none == none */
    }
}

/* ===== variables ===== */

static jv *var_find(jctx *c, const char *name, size_t n)
{
    for (int i = c->n_vars - 1; i >= 0; i--)
        if (c->vars[i].n == n && !memcmp(c->vars[i].name, name, n))
            return &c->vars[i].v;
    return NULL;
}

/* A new variable in the innermost scope (scopes are marks in the variable stack). */
static void var_push(jctx *c, const char *name, size_t n, jv v)
{
    c->vars = ja_room(c, c->vars, c->n_vars, &c->cap_vars, sizeof *c->vars);
    c->vars[c->n_vars++] = (jvar){name, n, v};
}

/* ===== expressions ===== */

enum { F_RAISE = 1, F_STRFTIME, F_RANGE, F_NAMESPACE };

typedef struct {
    jctx *c;
    const char *p, *end;
} jx; /* an expression being read */

static void ws(jx *x)
{
    while (x->p < x->end && isspace((unsigned char)*x->p))
        x->p++;
}

static bool peek(jx *x, const char *tok)
{
    ws(x);
    size_t n = strlen(tok);
    return (size_t)(x->end - x->p) >= n && !memcmp(x->p, tok, n);
}

static bool is_name_char(char ch)
{
    return isalnum((unsigned char)ch) || ch == '_';
}

/* A keyword or name `w` next (not a prefix of a longer name). */
static bool peek_word(jx *x, const char *w)
{
    ws(x);
    size_t n = strlen(w);
    return (size_t)(x->end - x->p) >= n && !memcmp(x->p, w, n) &&
           (x->p + n == x->end || !is_name_char(x->p[n]));
}

static bool eat(jx *x, const char *tok)
{
    if (!peek(x, tok))
        return false;
    x->p += strlen(tok);
    return true;
}

static bool eat_word(jx *x, const char *w)
{
    if (!peek_word(x, w))
        return false;
    x->p += strlen(w);
    return true;
}

static void expect(jx *x, const char *tok)
{
    if (!eat(x, tok))
        jfail(x->c, "expected '%s' at '%.*s'", tok, (int)(x->end - x->p > 20 ? 20 : x->end - x->p),
              x->p);
}

static size_t read_name(jx *x, const char **name)
{
    ws(x);
    const char *s = x->p;
    if (x->p < x->end && (isalpha((unsigned char)*x->p) || *x->p == '_'))
        while (x->p < x->end && is_name_char(*x->p))
            x->p++;
    *name = s;
    return (size_t)(x->p - s);
}

static jv expr(jx *x, bool live);

/* A string literal with Python's escapes. */
/* digits hex digits (fewer where the text ends or a non-hex character comes) */
static unsigned read_hex(jx *x, int digits)
{
    unsigned cp = 0;
    for (int i = 0; i < digits && x->p < x->end && isxdigit((unsigned char)*x->p); i++, x->p++)
        cp = cp * 16 + (unsigned)(isdigit((unsigned char)*x->p)
                                      ? *x->p - '0'
                                      : tolower((unsigned char)*x->p) - 'a' + 10);
    return cp;
}

static jv read_string(jx *x)
{
    char q = *x->p++;
    jbuf b = {0};
    jb_put(x->c, &b, "", 0);
    while (x->p < x->end && *x->p != q) {
        char ch = *x->p++;
        if (ch != '\\' || x->p == x->end) {
            jb_put(x->c, &b, &ch, 1);
            continue;
        }
        char e = *x->p++;
        switch (e) {
        case 'n': jb_put(x->c, &b, "\n", 1); break;
        case 't': jb_put(x->c, &b, "\t", 1); break;
        case 'r': jb_put(x->c, &b, "\r", 1); break;
        case '\\': jb_put(x->c, &b, "\\", 1); break;
        case '\'': jb_put(x->c, &b, "'", 1); break;
        case '"': jb_put(x->c, &b, "\"", 1); break;
        case '\n': break;
        case 'b': jb_put(x->c, &b, "\b", 1); break;
        case 'f': jb_put(x->c, &b, "\f", 1); break;
        case 'u':
        case 'x': {
            unsigned cp = read_hex(x, e == 'u' ? 4 : 2);
            /* a JSON surrogate pair: one character outside the BMP */
            if (cp >= 0xD800 && cp < 0xDC00 && x->end - x->p >= 6 && x->p[0] == '\\' &&
                x->p[1] == 'u') {
                const char *back = x->p;
                x->p += 2;
                unsigned lo = read_hex(x, 4);
                if (lo >= 0xDC00 && lo < 0xE000)
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else
                    x->p = back;
            }
            char u[4];
            jb_put(x->c, &b, u, utf8_put(cp, u));
            break;
        }
        case '/':
            if (x->c->json) {
                jb_put(x->c, &b, "/", 1);
                break;
            }
            /* Python keeps the backslash */
            __attribute__((fallthrough));
        default: {
            char raw[2] = {'\\', e};
            jb_put(x->c, &b, raw, 2);
        }
        }
    }
    if (x->p == x->end)
        jfail(x->c, "unterminated string");
    x->p++;
    return jv_str(b.p, b.n);
}

typedef struct {
    jv v[8];
    const char *kw[8];
    size_t kwn[8];
    int n;
} jargs;

static void read_args(jx *x, bool live, jargs *a)
{
    a->n = 0;
    if (eat(x, ")"))
        return;
    do {
        if (a->n == 8)
            jfail(x->c, "more than 8 arguments");
        const char *save = x->p, *name;
        size_t nn = read_name(x, &name);
        a->kw[a->n] = NULL;
        a->kwn[a->n] = 0;
        if (nn && peek(x, "=") && !peek(x, "==")) {
            eat(x, "=");
            a->kw[a->n] = name;
            a->kwn[a->n] = nn;
        } else {
            x->p = save;
        }
        a->v[a->n++] = expr(x, live);
    } while (eat(x, ","));
    expect(x, ")");
}

static jv arg_kw(const jargs *a, const char *kw, int pos, jv dflt)
{
    for (int i = 0; i < a->n; i++)
        if (a->kw[i] && a->kwn[i] == strlen(kw) && !memcmp(a->kw[i], kw, a->kwn[i]))
            return a->v[i];
    int k = 0;
    for (int i = 0; i < a->n; i++)
        if (!a->kw[i] && k++ == pos)
            return a->v[i];
    return dflt;
}

/* Integers a template computes with stay within +-2^53 (a float holds them exactly; no operation
 * on them overflows). */
#define JINJA_INT_MAX 9007199254740992LL

static long long as_int(jctx *c, jv v)
{
    if ((v.t == JV_INT || v.t == JV_BOOL) && v.i >= -JINJA_INT_MAX && v.i <= JINJA_INT_MAX)
        return v.i;
    if (v.t == JV_FLOAT && v.f >= -(double)JINJA_INT_MAX && v.f <= (double)JINJA_INT_MAX)
        return (long long)v.f;
    jfail(c, v.t == JV_INT || v.t == JV_FLOAT ? "an integer out of range" : "an integer was expected");
    return 0;
}

/* An integer result, checked against the range. */
static jv int_result(jctx *c, long long r)
{
    if (r < -JINJA_INT_MAX || r > JINJA_INT_MAX)
        jfail(c, "an integer out of range");
    return jv_int(r);
}

static jv call_test(jctx *c, const char *name, size_t n, jv v, const jargs *a);

/* Whether item passes select/reject's test (name in args[first]), or is truthy without one. */
static bool select_pass(jctx *c, jv item, const jargs *a, int first)
{
    if (a->n <= first)
        return truthy(item);
    jv t = a->v[first];
    if (t.t != JV_STR)
        jfail(c, "a test name was expected");
    jargs rest = {.n = 0};
    for (int i = first + 1; i < a->n; i++)
        rest.v[rest.n++] = a->v[i];
    return truthy(call_test(c, t.s.p, t.s.n, item, &rest));
}

static jv get_item(jctx *c, jv obj, jv key);

static jv apply_filter(jctx *c, const char *f, size_t fn, jv v, const jargs *a)
{
#define IS(name) (fn == strlen(name) && !memcmp(f, name, fn))
    if (IS("trim")) {
        jv s = as_str(c, v);
        size_t b = 0, e = s.s.n;
        while (b < e && isspace((unsigned char)s.s.p[b]))
            b++;
        while (e > b && isspace((unsigned char)s.s.p[e - 1]))
            e--;
        return jv_str(s.s.p + b, e - b);
    }
    if (IS("tojson")) {
        jv ind = arg_kw(a, "indent", 0, jv_none());
        jbuf b = {0};
        jb_put(c, &b, "", 0);
        to_json(c, &b, v, ind.t == JV_NONE ? -1 : (int)as_int(c, ind), 0);
        return jv_str(b.p, b.n);
    }
    if (IS("length") || IS("count")) {
        if (v.t == JV_STR) { /* characters, not bytes */
            long long k = 0;
            for (size_t i = 0; i < v.s.n; i++)
                k += ((unsigned char)v.s.p[i] & 0xC0) != 0x80;
            return jv_int(k);
        }
        return jv_int(v.t == JV_LIST ? v.l->n : v.t == JV_DICT ? v.d->n : 0);
    }
    if (IS("string"))
        return as_str(c, v);
    if (IS("upper") || IS("lower") || IS("capitalize") || IS("title")) {
        jv s = as_str(c, v);
        char *o = ja(c, s.s.n + 1);
        bool start = true;
        for (size_t i = 0; i < s.s.n; i++) {
            char ch = s.s.p[i];
            if (IS("upper"))
                ch = (char)toupper((unsigned char)ch);
            else if (IS("lower"))
                ch = (char)tolower((unsigned char)ch);
            else if (IS("capitalize"))
                ch = (char)(i ? tolower((unsigned char)ch) : toupper((unsigned char)ch));
            else {
                ch = (char)(start ? toupper((unsigned char)ch) : tolower((unsigned char)ch));
                start = !isalnum((unsigned char)ch);
            }
            o[i] = ch;
        }
        return jv_str(o, s.s.n);
    }
    if (IS("first") || IS("last")) {
        if (v.t == JV_LIST)
            return v.l->n ? v.l->v[IS("first") ? 0 : v.l->n - 1] : jv_undef();
        if (v.t == JV_STR && v.s.n)
            return jv_str(v.s.p + (IS("first") ? 0 : v.s.n - 1), 1);
        return jv_undef();
    }
    if (IS("join")) {
        jv sep = arg_kw(a, "d", 0, jv_strz(""));
        jbuf b = {0};
        jb_put(c, &b, "", 0);
        for (int i = 0; v.t == JV_LIST && i < v.l->n; i++) {
            if (i)
                to_text(c, &b, sep, false);
            to_text(c, &b, v.l->v[i], false);
        }
        return jv_str(b.p, b.n);
    }
    if (IS("default") || IS("d")) {
        jv d = arg_kw(a, "default_value", 0, jv_strz(""));
        bool boolean = truthy(arg_kw(a, "boolean", 1, jv_bool(false)));
        return v.t == JV_UNDEF || (boolean && !truthy(v)) ? d : v;
    }
    if (IS("items") || IS("list") || IS("reverse")) {
        jv out = jv_list(c);
        if (IS("items") && v.t == JV_DICT)
            for (int i = 0; i < v.d->n; i++) {
                jv pair = jv_list(c);
                list_push(c, pair.l, v.d->k[i]);
                list_push(c, pair.l, v.d->v[i]);
                list_push(c, out.l, pair);
            }
        else if (v.t == JV_LIST)
            for (int i = 0; i < v.l->n; i++)
                list_push(c, out.l, v.l->v[IS("reverse") ? v.l->n - 1 - i : i]);
        else if (v.t == JV_DICT)
            for (int i = 0; i < v.d->n; i++)
                list_push(c, out.l, v.d->k[i]);
        else if (v.t == JV_STR) {
            if (IS("reverse")) {
                char *o = ja(c, v.s.n + 1);
                for (size_t i = 0; i < v.s.n; i++)
                    o[i] = v.s.p[v.s.n - 1 - i];
                return jv_str(o, v.s.n);
            }
            for (size_t i = 0; i < v.s.n; i++)
                list_push(c, out.l, jv_str(v.s.p + i, 1));
        }
        return out;
    }
    if (IS("replace")) {
        jv s = as_str(c, v), from = as_str(c, arg_kw(a, "old", 0, jv_strz(""))),
           to = as_str(c, arg_kw(a, "new", 1, jv_strz("")));
        jbuf b = {0};
        jb_put(c, &b, "", 0);
        for (size_t i = 0; i < s.s.n;) {
            if (from.s.n && i + from.s.n <= s.s.n && !memcmp(s.s.p + i, from.s.p, from.s.n)) {
                jb_put(c, &b, to.s.p, to.s.n);
                i += from.s.n;
            } else
                jb_put(c, &b, s.s.p + i++, 1);
        }
        return jv_str(b.p, b.n);
    }
    if (IS("int")) {
        if (v.t == JV_STR) {
            char num[32];
            snprintf(num, sizeof num, "%.*s", (int)(v.s.n > 30 ? 30 : v.s.n), v.s.p);
            return int_result(c, strtoll(num, NULL, 10));
        }
        return jv_int(as_int(c, v));
    }
    if (IS("float")) {
        char num[64];
        snprintf(num, sizeof num, "%.*s", v.t == JV_STR ? (int)(v.s.n > 60 ? 60 : v.s.n) : 0,
                 v.t == JV_STR ? v.s.p : "");
        return jv_float(v.t == JV_FLOAT ? v.f : v.t == JV_STR ? strtod(num, NULL) : (double)v.i);
    }
    if (IS("abs"))
        return v.t == JV_FLOAT ? jv_float(fabs(v.f)) : jv_int(llabs(as_int(c, v))); /* bounded */
    if (IS("select") || IS("reject") || IS("selectattr") || IS("rejectattr")) {
        bool attr = f[fn - 4] == 'a', keep = f[0] == 's';
        jv out = jv_list(c);
        for (int i = 0; v.t == JV_LIST && i < v.l->n; i++) {
            jv item = v.l->v[i];
            if (attr)
                item = get_item(c, item, a->n ? a->v[0] : jv_undef());
            if (select_pass(c, item, a, attr ? 1 : 0) == keep)
                list_push(c, out.l, v.l->v[i]);
        }
        return out;
    }
    if (IS("map")) {
        jv at = arg_kw(a, "attribute", -1, jv_undef());
        jv out = jv_list(c);
        for (int i = 0; v.t == JV_LIST && i < v.l->n; i++) {
            if (at.t != JV_UNDEF)
                list_push(c, out.l, get_item(c, v.l->v[i], at));
            else if (a->n && a->v[0].t == JV_STR)
                list_push(c, out.l, apply_filter(c, a->v[0].s.p, a->v[0].s.n, v.l->v[i],
                                                 &(jargs){.n = 0}));
            else
                jfail(c, "map without a filter or an attribute");
        }
        return out;
    }
    jfail(c, "filter '%.*s' is not supported", (int)fn, f);
    return jv_undef();
#undef IS
}

static jv call_test(jctx *c, const char *t, size_t tn, jv v, const jargs *a)
{
#define IS(name) (tn == strlen(name) && !memcmp(t, name, tn))
    if (IS("defined"))
        return jv_bool(v.t != JV_UNDEF);
    if (IS("undefined"))
        return jv_bool(v.t == JV_UNDEF);
    if (IS("none"))
        return jv_bool(v.t == JV_NONE);
    if (IS("string"))
        return jv_bool(v.t == JV_STR);
    if (IS("number"))
        return jv_bool(v.t == JV_INT || v.t == JV_FLOAT);
    if (IS("integer"))
        return jv_bool(v.t == JV_INT);
    if (IS("float"))
        return jv_bool(v.t == JV_FLOAT);
    if (IS("boolean"))
        return jv_bool(v.t == JV_BOOL);
    if (IS("true") || IS("false"))
        return jv_bool(v.t == JV_BOOL && v.i == IS("true"));
    if (IS("mapping"))
        return jv_bool(v.t == JV_DICT);
    if (IS("iterable") || IS("sequence"))
        return jv_bool(v.t == JV_LIST || v.t == JV_DICT || v.t == JV_STR);
    if (IS("callable"))
        return jv_bool(v.t == JV_FUNC);
    if (IS("odd") || IS("even"))
        return jv_bool((as_int(c, v) % 2 != 0) == IS("odd"));
    if (IS("equalto") || IS("eq") || IS("=="))
        return jv_bool(a->n && jv_equal(v, a->v[0]));
    if (IS("ne") || IS("!="))
        return jv_bool(!(a->n && jv_equal(v, a->v[0])));
    if (IS("in")) {
        if (!a->n)
            return jv_bool(false);
        jv in = a->v[0];
        if (in.t == JV_LIST) {
            for (int i = 0; i < in.l->n; i++)
                if (jv_equal(in.l->v[i], v))
                    return jv_bool(true);
            return jv_bool(false);
        }
        return jv_bool(in.t == JV_STR && v.t == JV_STR && v.s.n <= in.s.n &&
                       memmem(in.s.p, in.s.n, v.s.p, v.s.n));
    }
    jfail(c, "test '%.*s' is not supported", (int)tn, t);
    return jv_undef();
#undef IS
}

static jv get_item(jctx *c, jv obj, jv key)
{
    if (obj.t == JV_DICT && key.t == JV_STR) {
        jv *v = dict_find(obj.d, key.s.p, key.s.n);
        return v ? *v : jv_undef();
    }
    if ((obj.t == JV_LIST || obj.t == JV_STR) && (key.t == JV_INT || key.t == JV_BOOL)) {
        long long n = obj.t == JV_LIST ? obj.l->n : (long long)obj.s.n, i = key.i;
        if (i < 0)
            i += n;
        if (i < 0 || i >= n)
            return jv_undef();
        return obj.t == JV_LIST ? obj.l->v[i] : jv_str(obj.s.p + i, 1);
    }
    (void)c;
    return jv_undef();
}

/* obj[a:b:s] */
static jv slice(jctx *c, jv obj, jv a, jv b, jv s)
{
    long long n = obj.t == JV_LIST ? obj.l->n : obj.t == JV_STR ? (long long)obj.s.n : 0;
    long long step = s.t == JV_NONE || s.t == JV_UNDEF ? 1 : as_int(c, s);
    if (!step)
        jfail(c, "slice step 0");
    long long lo, hi;
    if (step > 0) {
        lo = a.t == JV_NONE || a.t == JV_UNDEF ? 0 : as_int(c, a);
        hi = b.t == JV_NONE || b.t == JV_UNDEF ? n : as_int(c, b);
        lo = lo < 0 ? (lo + n < 0 ? 0 : lo + n) : (lo > n ? n : lo);
        hi = hi < 0 ? (hi + n < 0 ? 0 : hi + n) : (hi > n ? n : hi);
    } else {
        lo = a.t == JV_NONE || a.t == JV_UNDEF ? n - 1 : as_int(c, a);
        hi = b.t == JV_NONE || b.t == JV_UNDEF ? -1 : as_int(c, b);
        if (a.t != JV_NONE && a.t != JV_UNDEF)
            lo = lo < 0 ? (lo + n < 0 ? -1 : lo + n) : (lo >= n ? n - 1 : lo);
        if (b.t != JV_NONE && b.t != JV_UNDEF)
            hi = hi < 0 ? (hi + n < 0 ? -1 : hi + n) : (hi >= n ? n - 1 : hi);
    }
    if (obj.t == JV_STR) {
        jbuf buf = {0};
        jb_put(c, &buf, "", 0);
        for (long long i = lo; step > 0 ? i < hi : i > hi; i += step)
            jb_put(c, &buf, obj.s.p + i, 1);
        return jv_str(buf.p, buf.n);
    }
    jv out = jv_list(c);
    for (long long i = lo; obj.t == JV_LIST && (step > 0 ? i < hi : i > hi); i += step)
        list_push(c, out.l, obj.l->v[i]);
    return out;
}

/* obj.name(args...): the string and dict methods templates call */
static jv call_method(jctx *c, jv obj, const char *m, size_t mn, const jargs *a)
{
#define IS(name) (mn == strlen(name) && !memcmp(m, name, mn))
    if (obj.t == JV_STR) {
        if (IS("strip") || IS("lstrip") || IS("rstrip")) {
            jv chars = arg_kw(a, "chars", 0, jv_none());
            size_t b = 0, e = obj.s.n;
            bool l = !IS("rstrip"), r = !IS("lstrip");
#define STRIPPED(ch)                                                                               \
    (chars.t == JV_STR ? memchr(chars.s.p, (ch), chars.s.n) != NULL : isspace((unsigned char)(ch)))
            while (l && b < e && STRIPPED(obj.s.p[b]))
                b++;
            while (r && e > b && STRIPPED(obj.s.p[e - 1]))
                e--;
#undef STRIPPED
            return jv_str(obj.s.p + b, e - b);
        }
        if (IS("upper") || IS("lower") || IS("title") || IS("capitalize"))
            return apply_filter(c, m, mn, obj, a);
        if (IS("startswith") || IS("endswith")) {
            jv s = as_str(c, arg_kw(a, "prefix", 0, jv_strz("")));
            if (s.s.n > obj.s.n)
                return jv_bool(false);
            return jv_bool(!memcmp(obj.s.p + (IS("startswith") ? 0 : obj.s.n - s.s.n), s.s.p,
                                   s.s.n));
        }
        if (IS("replace"))
            return apply_filter(c, "replace", 7, obj, a);
        if (IS("find")) {
            jv s = as_str(c, arg_kw(a, "sub", 0, jv_strz("")));
            const char *at = s.s.n <= obj.s.n ? memmem(obj.s.p, obj.s.n, s.s.p, s.s.n) : NULL;
            return jv_int(at ? at - obj.s.p : -1);
        }
        if (IS("split")) {
            jv sep = arg_kw(a, "sep", 0, jv_none());
            jv out = jv_list(c);
            if (sep.t != JV_STR) { /* runs of whitespace */
                size_t i = 0;
                while (i < obj.s.n) {
                    while (i < obj.s.n && isspace((unsigned char)obj.s.p[i]))
                        i++;
                    size_t s0 = i;
                    while (i < obj.s.n && !isspace((unsigned char)obj.s.p[i]))
                        i++;
                    if (i > s0)
                        list_push(c, out.l, jv_str(obj.s.p + s0, i - s0));
                }
                return out;
            }
            if (!sep.s.n)
                jfail(c, "empty separator");
            size_t s0 = 0;
            for (size_t i = 0; i + sep.s.n <= obj.s.n;) {
                if (!memcmp(obj.s.p + i, sep.s.p, sep.s.n)) {
                    list_push(c, out.l, jv_str(obj.s.p + s0, i - s0));
                    i += sep.s.n;
                    s0 = i;
                } else
                    i++;
            }
            list_push(c, out.l, jv_str(obj.s.p + s0, obj.s.n - s0));
            return out;
        }
    }
    if (obj.t == JV_DICT) {
        if (IS("items") || IS("keys"))
            return apply_filter(c, IS("items") ? "items" : "list", IS("items") ? 5 : 4, obj, a);
        if (IS("values")) {
            jv out = jv_list(c);
            for (int i = 0; i < obj.d->n; i++)
                list_push(c, out.l, obj.d->v[i]);
            return out;
        }
        if (IS("get")) {
            jv v = get_item(c, obj, a->n ? a->v[0] : jv_undef());
            return v.t == JV_UNDEF ? (a->n > 1 ? a->v[1] : jv_none()) : v;
        }
    }
    jfail(c, "method '%.*s' is not supported", (int)mn, m);
    return jv_undef();
#undef IS
}

static jv call_func(jctx *c, jv fn, const jargs *a)
{
    switch ((int)fn.i) {
    case F_RAISE:
        jfail(c, "raise_exception: %.*s", a->n && a->v[0].t == JV_STR ? (int)a->v[0].s.n : 0,
              a->n && a->v[0].t == JV_STR ? a->v[0].s.p : "");
        return jv_undef();
    case F_STRFTIME: {
        jv f = as_str(c, a->n ? a->v[0] : jv_strz(""));
        char fmt[128], out[256];
        snprintf(fmt, sizeof fmt, "%.*s", (int)(f.s.n > 120 ? 120 : f.s.n), f.s.p);
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        size_t n = strftime(out, sizeof out, fmt, &tmv);
        char *p = ja(c, n + 1);
        memcpy(p, out, n + 1);
        return jv_str(p, n);
    }
    case F_RANGE: {
        long long lo = 0, hi, step = 1;
        if (a->n == 1)
            hi = as_int(c, a->v[0]);
        else {
            lo = a->n ? as_int(c, a->v[0]) : 0;
            hi = a->n > 1 ? as_int(c, a->v[1]) : 0;
            step = a->n > 2 ? as_int(c, a->v[2]) : 1;
        }
        if (!step)
            jfail(c, "range step 0");
        if ((hi - lo) / step > JINJA_MAX_RANGE) /* each within 2^53: no overflow */
            jfail(c, "a range of more than %lld numbers", JINJA_MAX_RANGE);
        jv out = jv_list(c);
        for (long long i = lo; step > 0 ? i < hi : i > hi; i += step)
            list_push(c, out.l, jv_int(i));
        return out;
    }
    case F_NAMESPACE: {
        jv ns = jv_dict(c);
        ns.ns = true;
        for (int i = 0; i < a->n; i++)
            if (a->kw[i])
                dict_set(c, ns.d, jv_str(a->kw[i], a->kwn[i]), a->v[i]);
        return ns;
    }
    default: jfail(c, "call of a value that is not a function"); return jv_undef();
    }
}

static jv primary(jx *x, bool live)
{
    jctx *c = x->c;
    ws(x);
    if (x->p == x->end)
        jfail(c, "an expression ends too early");
    char ch = *x->p;
    if (ch == '\'' || ch == '"') {
        jv s = read_string(x);
        while (peek(x, "'") || peek(x, "\"")) { /* adjacent literals concatenate */
            jv t = read_string(x);
            jbuf b = {0};
            jb_put(c, &b, s.s.p, s.s.n);
            jb_put(c, &b, t.s.p, t.s.n);
            s = jv_str(b.p, b.n);
        }
        return s;
    }
    if (isdigit((unsigned char)ch)) {
        const char *s = x->p;
        bool flt = false;
        while (x->p < x->end && (isdigit((unsigned char)*x->p) || *x->p == '.' || *x->p == '_')) {
            if (*x->p == '.') {
                if (flt || x->p + 1 >= x->end || !isdigit((unsigned char)x->p[1]))
                    break;
                flt = true;
            }
            x->p++;
        }
        if (c->json && x->p < x->end && (*x->p == 'e' || *x->p == 'E')) { /* JSON's 1e-5 */
            flt = true;
            x->p++;
            if (x->p < x->end && (*x->p == '+' || *x->p == '-'))
                x->p++;
            while (x->p < x->end && isdigit((unsigned char)*x->p))
                x->p++;
        }
        char num[64];
        snprintf(num, sizeof num, "%.*s", (int)(x->p - s > 60 ? 60 : x->p - s), s);
        return flt ? jv_float(strtod(num, NULL)) : int_result(c, strtoll(num, NULL, 10));
    }
    if (eat(x, "(")) {
        jv v = expr(x, live);
        if (eat(x, ",")) { /* a tuple: a list */
            jv t = jv_list(c);
            list_push(c, t.l, v);
            if (!peek(x, ")"))
                do
                    list_push(c, t.l, expr(x, live));
                while (eat(x, ",") && !peek(x, ")"));
            v = t;
        }
        expect(x, ")");
        return v;
    }
    if (eat(x, "[")) {
        jv l = jv_list(c);
        if (!eat(x, "]")) {
            do {
                if (peek(x, "]"))
                    break;
                list_push(c, l.l, expr(x, live));
            } while (eat(x, ","));
            expect(x, "]");
        }
        return l;
    }
    if (eat(x, "{")) {
        jv d = jv_dict(c);
        if (!eat(x, "}")) {
            do {
                if (peek(x, "}"))
                    break;
                jv k = expr(x, live);
                expect(x, ":");
                jv v = expr(x, live);
                dict_set(c, d.d, k, v);
            } while (eat(x, ","));
            expect(x, "}");
        }
        return d;
    }
    const char *name;
    size_t n = read_name(x, &name);
    if (!n)
        jfail(c, "unexpected '%c'", ch);
#define W(s) (n == strlen(s) && !memcmp(name, s, n))
    if (c->json) { /* the caller's variables: JSON literals only */
        if (W("true") || W("false") || W("null"))
            return W("true") ? jv_bool(true) : W("false") ? jv_bool(false) : jv_none();
        jfail(c, "'%.*s' is not JSON", (int)(n > 20 ? 20 : n), name);
    }
    if (W("true") || W("True"))
        return jv_bool(true);
    if (W("false") || W("False"))
        return jv_bool(false);
    if (W("none") || W("None"))
        return jv_none();
    jv *v = var_find(c, name, n);
    if (v)
        return *v;
    jv fn = {.t = JV_FUNC};
    fn.i = W("raise_exception") ? F_RAISE
           : W("strftime_now")  ? F_STRFTIME
           : W("range")         ? F_RANGE
           : W("namespace")     ? F_NAMESPACE
                                : 0;
#undef W
    return fn.i ? fn : jv_undef();
}

/* primary, then .attr, [key], [a:b:c] and calls */
static jv postfix(jx *x, bool live)
{
    jctx *c = x->c;
    jv v = primary(x, live);
    for (;;) {
        if (eat(x, ".")) {
            const char *name;
            size_t n = read_name(x, &name);
            if (!n)
                jfail(c, "a name was expected after '.'");
            if (peek(x, "(")) {
                eat(x, "(");
                jargs a;
                read_args(x, live, &a);
                v = live ? call_method(c, v, name, n, &a) : jv_undef();
            } else {
                v = live ? get_item(c, v, jv_str(name, n)) : jv_undef();
            }
        } else if (eat(x, "[")) {
            jv a = jv_none(), b = jv_none(), s = jv_none();
            bool sl = false;
            if (!peek(x, ":"))
                a = expr(x, live);
            if (eat(x, ":")) {
                sl = true;
                if (!peek(x, ":") && !peek(x, "]"))
                    b = expr(x, live);
                if (eat(x, ":") && !peek(x, "]"))
                    s = expr(x, live);
            }
            expect(x, "]");
            v = !live ? jv_undef() : sl ? slice(c, v, a, b, s) : get_item(c, v, a);
        } else if (peek(x, "(")) {
            eat(x, "(");
            jargs a;
            read_args(x, live, &a);
            v = live ? call_func(c, v, &a) : jv_undef();
        } else {
            return v;
        }
    }
}

/* postfix, then | filters and `is` tests */
static jv unary(jx *x, bool live)
{
    jctx *c = x->c;
    if (eat(x, "-")) {
        jv v = unary(x, live);
        if (!live)
            return v;
        return v.t == JV_FLOAT ? jv_float(-v.f) : jv_int(-as_int(c, v)); /* |i| <= 2^53 */
    }
    if (eat(x, "+"))
        return unary(x, live);
    jv v = postfix(x, live);
    for (;;) {
        if (peek(x, "|") && !peek(x, "||")) {
            eat(x, "|");
            const char *name;
            size_t n = read_name(x, &name);
            jargs a = {.n = 0};
            if (eat(x, "("))
                read_args(x, live, &a);
            if (live)
                v = apply_filter(c, name, n, v, &a);
        } else if (peek_word(x, "is")) {
            eat_word(x, "is");
            bool neg = eat_word(x, "not");
            const char *name;
            size_t n = read_name(x, &name);
            if (!n && (peek(x, "==") || peek(x, "!="))) { /* `is ==`: rare; read as a test */
                name = x->p;
                n = 2;
                x->p += 2;
            }
            jargs a = {.n = 0};
            if (eat(x, "("))
                read_args(x, live, &a);
            else if (n && !peek_word(x, "and") && !peek_word(x, "or") && !peek_word(x, "else") &&
                     !peek_word(x, "if") && x->p < x->end &&
                     (isalnum((unsigned char)*x->p) || *x->p == '\'' || *x->p == '"')) {
                a.v[0] = postfix(x, live); /* `is equalto 'x'`: one argument, no parentheses */
                a.n = 1;
            }
            if (live) {
                bool r = truthy(call_test(c, name, n, v, &a));
                v = jv_bool(neg ? !r : r);
            }
        } else {
            return v;
        }
    }
}

static jv arith(jctx *c, char op, jv a, jv b)
{
    if (op == '+' && a.t == JV_STR && b.t == JV_STR) {
        jbuf buf = {0};
        jb_put(c, &buf, a.s.p, a.s.n);
        jb_put(c, &buf, b.s.p, b.s.n);
        return jv_str(buf.p, buf.n);
    }
    if (op == '+' && a.t == JV_LIST && b.t == JV_LIST) {
        jv out = jv_list(c);
        for (int i = 0; i < a.l->n; i++)
            list_push(c, out.l, a.l->v[i]);
        for (int i = 0; i < b.l->n; i++)
            list_push(c, out.l, b.l->v[i]);
        return out;
    }
    if (op == '*' && a.t == JV_STR && (b.t == JV_INT || b.t == JV_BOOL)) {
        long long times = as_int(c, b);
        if (times > 0 && a.s.n && (size_t)times > JINJA_MAX_OUT / a.s.n)
            jfail(c, "a repeated string of more than %zu bytes", JINJA_MAX_OUT);
        jbuf buf = {0};
        jb_put(c, &buf, "", 0);
        for (long long i = 0; i < times; i++)
            jb_put(c, &buf, a.s.p, a.s.n);
        return jv_str(buf.p, buf.n);
    }
    bool an = a.t == JV_INT || a.t == JV_BOOL || a.t == JV_FLOAT;
    bool bn = b.t == JV_INT || b.t == JV_BOOL || b.t == JV_FLOAT;
    if (!an || !bn)
        jfail(c, "'%c' of values that are not both numbers (nor strings for +)", op);
    bool flt = a.t == JV_FLOAT || b.t == JV_FLOAT || op == '/';
    double x = a.t == JV_FLOAT ? a.f : (double)a.i, y = b.t == JV_FLOAT ? b.f : (double)b.i;
    long long ai = flt ? 0 : as_int(c, a), bi = flt ? 0 : as_int(c, b), r;
    switch (op) {
    case '+': return flt ? jv_float(x + y) : int_result(c, ai + bi);
    case '-': return flt ? jv_float(x - y) : int_result(c, ai - bi);
    case '*':
        if (flt)
            return jv_float(x * y);
        if (__builtin_mul_overflow(ai, bi, &r))
            jfail(c, "an integer out of range");
        return int_result(c, r);
    case '/':
        if (y == 0)
            jfail(c, "division by zero");
        return jv_float(x / y);
    case 'f': /* // */
        if (y == 0)
            jfail(c, "division by zero");
        return flt ? jv_float(floor(x / y)) : int_result(c, (long long)floor(x / y));
    default: /* % */
        if (y == 0)
            jfail(c, "modulo by zero");
        if (flt)
            return jv_float(x - y * floor(x / y));
        r = ai % bi; /* |ai|, |bi| <= 2^53: no overflow */
        return jv_int(r && ((r < 0) != (bi < 0)) ? r + bi : r);
    }
}

static jv term(jx *x, bool live) /* * / // % */
{
    jv v = unary(x, live);
    for (;;) {
        char op;
        if (eat(x, "//"))
            op = 'f';
        else if (peek(x, "*") && !peek(x, "**"))
            eat(x, "*"), op = '*';
        else if (eat(x, "/"))
            op = '/';
        else if (eat(x, "%"))
            op = '%';
        else
            return v;
        jv w = unary(x, live);
        v = live ? arith(x->c, op, v, w) : v;
    }
}

static jv concat(jx *x, bool live) /* ~ */
{
    jv v = term(x, live);
    while (eat(x, "~")) {
        jv w = term(x, live);
        if (live) {
            jbuf b = {0};
            jb_put(x->c, &b, "", 0);
            to_text(x->c, &b, v, false);
            to_text(x->c, &b, w, false);
            v = jv_str(b.p, b.n);
        }
    }
    return v;
}

static jv sum(jx *x, bool live) /* + - */
{
    jv v = concat(x, live);
    for (;;) {
        char op;
        if (eat(x, "+"))
            op = '+';
        else if (peek(x, "-") && !peek(x, "-}") && !peek(x, "-%"))
            eat(x, "-"), op = '-';
        else
            return v;
        jv w = concat(x, live);
        v = live ? arith(x->c, op, v, w) : v;
    }
}

static int cmp_values(jctx *c, jv a, jv b)
{
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
        int r = memcmp(a.s.p, b.s.p, n);
        return r ? r : (a.s.n > b.s.n) - (a.s.n < b.s.n);
    }
    bool an = a.t == JV_INT || a.t == JV_BOOL || a.t == JV_FLOAT;
    bool bn = b.t == JV_INT || b.t == JV_BOOL || b.t == JV_FLOAT;
    if (!an || !bn)
        jfail(c, "ordering of values that are not both numbers or both strings");
    double x = a.t == JV_FLOAT ? a.f : (double)a.i, y = b.t == JV_FLOAT ? b.f : (double)b.i;
    return (x > y) - (x < y);
}

static jv compare(jx *x, bool live)
{
    jv v = sum(x, live);
    for (;;) {
        int op; /* 0 ==, 1 !=, 2 <, 3 >, 4 <=, 5 >=, 6 in, 7 not in */
        if (eat(x, "=="))
            op = 0;
        else if (eat(x, "!="))
            op = 1;
        else if (eat(x, "<="))
            op = 4;
        else if (eat(x, ">="))
            op = 5;
        else if (eat(x, "<"))
            op = 2;
        else if (eat(x, ">"))
            op = 3;
        else if (eat_word(x, "in"))
            op = 6;
        else if (peek_word(x, "not")) {
            const char *save = x->p;
            eat_word(x, "not");
            if (!eat_word(x, "in")) {
                x->p = save;
                return v;
            }
            op = 7;
        } else
            return v;
        jv w = sum(x, live);
        if (!live)
            continue;
        bool r;
        if (op <= 1)
            r = jv_equal(v, w) == (op == 0);
        else if (op <= 5) {
            int k = cmp_values(x->c, v, w);
            r = op == 2 ? k < 0 : op == 3 ? k > 0 : op == 4 ? k <= 0 : k >= 0;
        } else {
            jargs a = {.n = 1};
            a.v[0] = w;
            bool in = w.t == JV_DICT ? (v.t == JV_STR && dict_find(w.d, v.s.p, v.s.n) != NULL)
                                     : truthy(call_test(x->c, "in", 2, v, &a));
            r = op == 6 ? in : !in;
        }
        v = jv_bool(r);
    }
}

static jv not_expr(jx *x, bool live)
{
    if (eat_word(x, "not")) {
        jv v = not_expr(x, live);
        return live ? jv_bool(!truthy(v)) : v;
    }
    return compare(x, live);
}

static jv and_expr(jx *x, bool live)
{
    jv v = not_expr(x, live);
    while (eat_word(x, "and")) {
        bool take = live && truthy(v);
        jv w = not_expr(x, take);
        if (live)
            v = take ? w : v;
    }
    return v;
}

static jv or_expr(jx *x, bool live)
{
    jv v = and_expr(x, live);
    while (eat_word(x, "or")) {
        bool take = live && !truthy(v);
        jv w = and_expr(x, take);
        if (live)
            v = take ? w : v;
    }
    return v;
}

static jv expr_if(jx *x, bool live);

static jv expr(jx *x, bool live)
{
    if (++x->c->depth > JINJA_MAX_DEPTH)
        jfail(x->c, "expressions nested more than %d deep", JINJA_MAX_DEPTH);
    jv v = expr_if(x, live);
    x->c->depth--;
    return v;
}

/* `a if cond else b` (without else: undefined when cond is false) */
static jv expr_if(jx *x, bool live)
{
    const char *start = x->p;
    jv v = or_expr(x, false); /* read once to find `if` */
    if (!peek_word(x, "if")) {
        x->p = start;
        return or_expr(x, live);
    }
    eat_word(x, "if");
    jv cond = or_expr(x, live);
    bool yes = live && truthy(cond);
    jv other = jv_undef();
    if (eat_word(x, "else"))
        other = expr(x, live && !yes);
    const char *after = x->p;
    x->p = start;
    v = or_expr(x, yes);
    x->p = after;
    return !live ? jv_undef() : yes ? v : other;
}

static jv eval_src(jctx *c, const char *p, size_t n)
{
    jx x = {c, p, p + n};
    jv v = expr(&x, true);
    ws(&x);
    if (x.p != x.end)
        jfail(c, "unexpected '%.*s'", (int)(x.end - x.p > 20 ? 20 : x.end - x.p), x.p);
    return v;
}

/* ===== the template: pieces ===== */

static int line_of(const char *src, const char *p)
{
    int line = 1;
    for (const char *q = src; q < p; q++)
        line += *q == '\n';
    return line;
}

typedef struct {
    jpiece *v;
    int n, cap;
} jpieces;

static void piece_push(jctx *c, jpieces *ps, jpiece p)
{
    ps->v = ja_room(c, ps->v, ps->n, &ps->cap, sizeof *ps->v);
    ps->v[ps->n++] = p;
}

/* Cut the template into pieces, applying whitespace control: `-` strips the whitespace on its
 * side; otherwise a statement or comment tag takes the spaces and tabs before it on its line
 * (lstrip_blocks, unless `+`) and the newline right after it (trim_blocks). */
static void cut(jctx *c, const char *s, size_t len, jpieces *ps)
{
    const char *p = s, *end = s + len, *text = s;
    bool skip_ws = false, skip_nl = false;
    while (p < end) {
        const char *o = p;
        while (o + 1 < end && !(o[0] == '{' && (o[1] == '{' || o[1] == '%' || o[1] == '#')))
            o++;
        if (o + 1 >= end)
            o = end;
        /* the text before the tag */
        const char *ts = text, *te = o;
        if (skip_ws)
            while (ts < te && isspace((unsigned char)*ts))
                ts++;
        else if (skip_nl && ts < te && (*ts == '\n' || (*ts == '\r' && ts + 1 < te && ts[1] == '\n')))
            ts += *ts == '\r' ? 2 : 1;
        skip_ws = skip_nl = false;
        if (o == end) {
            if (te > ts)
                piece_push(c, ps, (jpiece){P_TEXT, ts, (size_t)(te - ts), 0});
            break;
        }
        char kind = o[1];
        bool minus = o + 2 < end && o[2] == '-', plus = o + 2 < end && o[2] == '+';
        if (minus)
            while (te > ts && isspace((unsigned char)te[-1]))
                te--;
        else if (kind != '{' && !plus) {
            /* lstrip_blocks: the spaces and tabs between the line's start and the tag (not when
             * another tag ends on the same line) */
            const char *q = o;
            while (q > text && (q[-1] == ' ' || q[-1] == '\t'))
                q--;
            if (q > text ? q[-1] == '\n' : q == s)
                te = q < ts ? ts : q;
        }
        if (te > ts)
            piece_push(c, ps, (jpiece){P_TEXT, ts, (size_t)(te - ts), 0});
        /* the tag */
        char close = kind == '{' ? '}' : kind == '%' ? '%' : '#';
        const char *b = o + 2 + (minus || plus);
        const char *q = b;
        /* the end of the tag: outside string literals for {{ and {% */
        char quote = 0;
        while (q + 1 < end) {
            if (kind != '#') {
                if (quote) {
                    if (*q == '\\')
                        q++;
                    else if (*q == quote)
                        quote = 0;
                    q++;
                    continue;
                }
                if (*q == '\'' || *q == '"') {
                    quote = *q++;
                    continue;
                }
            }
            if (q[0] == close && q[1] == '}')
                break;
            q++;
        }
        if (q + 1 >= end) {
            c->line = line_of(s, o);
            jfail(c, "a tag '%c%c' is not closed", '{', kind);
        }
        const char *be = q;
        bool rminus = be > b && be[-1] == '-';
        if (rminus)
            be--;
        if (kind != '#')
            piece_push(c, ps, (jpiece){kind == '{' ? P_OUT : P_STMT, b, (size_t)(be - b),
                                       line_of(s, o)});
        p = text = q + 2;
        if (rminus)
            skip_ws = true;
        else if (kind != '{')
            skip_nl = true; /* trim_blocks */
    }
}

/* ===== the template: nodes ===== */

static bool stmt_word(const jpiece *pc, const char *w, const char **rest, size_t *rn)
{
    const char *p = pc->p, *e = pc->p + pc->n;
    while (p < e && isspace((unsigned char)*p))
        p++;
    size_t n = strlen(w);
    if ((size_t)(e - p) < n || memcmp(p, w, n) || (p + n < e && is_name_char(p[n])))
        return false;
    p += n;
    while (p < e && isspace((unsigned char)*p))
        p++;
    while (e > p && isspace((unsigned char)e[-1]))
        e--;
    *rest = p;
    *rn = (size_t)(e - p);
    return true;
}

static jnode *new_node(jctx *c, int kind, int line)
{
    jnode *n = ja(c, sizeof *n);
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->line = line;
    return n;
}

/* Nodes from piece *at until a statement whose first word is one of `ends` (returned in *which,
 * -1 at the end of the template). */
static jnode *parse_nodes(jctx *c, const jpieces *ps, int *at, const char *const *ends, int n_ends,
                          int *which)
{
    jnode *head = NULL, **tail = &head;
    *which = -1;
    if (++c->depth > JINJA_MAX_DEPTH)
        jfail(c, "statements nested more than %d deep", JINJA_MAX_DEPTH);
    while (*at < ps->n) {
        const jpiece *pc = &ps->v[(*at)++];
        c->line = pc->line;
        if (pc->kind == P_TEXT || pc->kind == P_OUT) {
            jnode *n = new_node(c, pc->kind == P_TEXT ? N_TEXT : N_OUT, pc->line);
            n->p = pc->p;
            n->n = pc->n;
            *tail = n;
            tail = &n->next;
            continue;
        }
        const char *r;
        size_t rn;
        for (int e = 0; e < n_ends; e++)
            if (stmt_word(pc, ends[e], &r, &rn)) {
                *which = e;
                (*at)--; /* the caller reads the terminator */
                c->depth--;
                return head;
            }
        jnode *n;
        if (stmt_word(pc, "if", &r, &rn)) {
            n = new_node(c, N_IF, pc->line);
            n->p = r;
            n->n = rn;
            static const char *const ie[] = {"elif", "else", "endif"};
            int w;
            n->body = parse_nodes(c, ps, at, ie, 3, &w);
            jnode *cur = n;
            while (w == 0 || w == 1) {
                const jpiece *t = &ps->v[(*at)++];
                if (w == 0) { /* elif: an if in the else */
                    jnode *e = new_node(c, N_IF, t->line);
                    stmt_word(t, "elif", &e->p, &e->n);
                    e->body = parse_nodes(c, ps, at, ie, 3, &w);
                    cur->alt = e;
                    cur = e;
                } else {
                    cur->alt = parse_nodes(c, ps, at, ie + 2, 1, &w);
                    w = w == 0 ? 2 : -1;
                }
            }
            if (w != 2)
                jfail(c, "an if without its endif");
            (*at)++;
        } else if (stmt_word(pc, "for", &r, &rn)) {
            n = new_node(c, N_FOR, pc->line);
            /* NAMES in ITERABLE [if COND] */
            const char *in = NULL, *e = r + rn;
            for (const char *q = r; q + 4 <= e; q++)
                if (!memcmp(q, " in ", 4)) {
                    in = q;
                    break;
                }
            if (!in)
                jfail(c, "a for without 'in'");
            n->tgt = r;
            n->tgtn = (size_t)(in - r);
            const char *it = in + 4;
            /* a trailing ` if ` filter, outside brackets and strings */
            int depth = 0;
            char quote = 0;
            const char *cond = NULL;
            for (const char *q = it; q < e; q++) {
                if (quote) {
                    if (*q == quote)
                        quote = 0;
                    continue;
                }
                if (*q == '\'' || *q == '"')
                    quote = *q;
                else if (*q == '(' || *q == '[' || *q == '{')
                    depth++;
                else if (*q == ')' || *q == ']' || *q == '}')
                    depth--;
                else if (!depth && q + 4 <= e && !memcmp(q, " if ", 4)) {
                    cond = q + 4;
                    e = q;
                    break;
                }
            }
            if (cond) {
                n->cond = cond;
                n->condn = (size_t)(r + rn - cond);
            }
            if (e - it > 10 && !memcmp(e - 10, " recursive", 10))
                jfail(c, "a recursive for loop is not supported");
            n->p = it;
            n->n = (size_t)(e - it);
            static const char *const fe[] = {"else", "endfor"};
            int w;
            n->body = parse_nodes(c, ps, at, fe, 2, &w);
            if (w == 0) {
                (*at)++;
                n->alt = parse_nodes(c, ps, at, fe + 1, 1, &w);
                w = w == 0 ? 1 : -1;
            }
            if (w != 1)
                jfail(c, "a for without its endfor");
            (*at)++;
        } else if (stmt_word(pc, "set", &r, &rn)) {
            n = new_node(c, N_SET, pc->line);
            const char *eq = NULL;
            for (const char *q = r; q < r + rn; q++)
                if (*q == '=' && q[1] != '=' && (q == r || (q[-1] != '=' && q[-1] != '!' &&
                                                            q[-1] != '<' && q[-1] != '>'))) {
                    eq = q;
                    break;
                }
            if (!eq)
                jfail(c, "a block set ({%% set x %%}...{%% endset %%}) is not supported");
            n->tgt = r;
            n->tgtn = (size_t)(eq - r);
            while (n->tgtn && isspace((unsigned char)r[n->tgtn - 1]))
                n->tgtn--;
            n->p = eq + 1;
            n->n = (size_t)(r + rn - eq - 1);
        } else {
            const char *w = pc->p;
            while (w < pc->p + pc->n && isspace((unsigned char)*w))
                w++;
            const char *we = w;
            while (we < pc->p + pc->n && is_name_char(*we))
                we++;
            jfail(c, "the statement '%.*s' is not supported", (int)(we - w), w);
            return NULL;
        }
        *tail = n;
        tail = &n->next;
    }
    c->depth--;
    return head;
}

/* ===== running ===== */

static void emit(jctx *c, const char *p, size_t n)
{
    if (c->out_n + n > JINJA_MAX_OUT)
        jfail(c, "the rendered text exceeds %zu bytes", JINJA_MAX_OUT);
    if (buf_append(&c->out, &c->out_n, &c->out_cap, p, n, 1024))
        jfail(c, "out of memory");
}

/* Assign v to the loop names "a" or "a, b" (unpacking a pair). */
static void bind_names(jctx *c, const char *t, size_t tn, jv v)
{
    const char *e = t + tn;
    int k = 0;
    for (const char *p = t; p < e;) {
        while (p < e && (isspace((unsigned char)*p) || *p == ','))
            p++;
        const char *s = p;
        while (p < e && is_name_char(*p))
            p++;
        if (p == s)
            break;
        bool tuple = memchr(t, ',', tn) != NULL;
        var_push(c, s, (size_t)(p - s), tuple ? get_item(c, v, jv_int(k)) : v);
        k++;
    }
}

static void run(jctx *c, const jnode *n)
{
    if (++c->depth > JINJA_MAX_DEPTH)
        jfail(c, "statements nested more than %d deep", JINJA_MAX_DEPTH);
    for (; n; n = n->next) {
        c->line = n->line;
        if (++c->steps > JINJA_MAX_STEPS)
            jfail(c, "the template runs more than %ld steps", JINJA_MAX_STEPS);
        switch (n->kind) {
        case N_TEXT: emit(c, n->p, n->n); break;
        case N_OUT: {
            jv v = eval_src(c, n->p, n->n);
            jbuf b = {0};
            to_text(c, &b, v, false);
            if (b.n)
                emit(c, b.p, b.n);
            break;
        }
        case N_IF: {
            const jnode *i = n;
            while (i && i->kind == N_IF && !truthy(eval_src(c, i->p, i->n)))
                i = i->alt;
            if (i && i->kind == N_IF)
                run(c, i->body);
            else if (i)
                run(c, i);
            break;
        }
        case N_FOR: {
            jv it = eval_src(c, n->p, n->n);
            jv items = apply_filter(c, it.t == JV_DICT ? "list" : "list", 4, it,
                                    &(jargs){.n = 0});
            /* the `if` filter first: loop.length counts what passes */
            jv kept = jv_list(c);
            for (int i = 0; i < items.l->n; i++) {
                if (n->cond) {
                    int mark = c->n_vars;
                    bind_names(c, n->tgt, n->tgtn, items.l->v[i]);
                    bool pass = truthy(eval_src(c, n->cond, n->condn));
                    c->n_vars = mark;
                    if (!pass)
                        continue;
                }
                list_push(c, kept.l, items.l->v[i]);
            }
            int len = kept.l->n;
            for (int i = 0; i < len; i++) {
                if (++c->steps > JINJA_MAX_STEPS)
                    jfail(c, "the template runs more than %ld steps", JINJA_MAX_STEPS);
                int mark = c->n_vars;
                jv loop = jv_dict(c);
                dict_set(c, loop.d, jv_strz("index0"), jv_int(i));
                dict_set(c, loop.d, jv_strz("index"), jv_int(i + 1));
                dict_set(c, loop.d, jv_strz("revindex0"), jv_int(len - 1 - i));
                dict_set(c, loop.d, jv_strz("revindex"), jv_int(len - i));
                dict_set(c, loop.d, jv_strz("first"), jv_bool(i == 0));
                dict_set(c, loop.d, jv_strz("last"), jv_bool(i == len - 1));
                dict_set(c, loop.d, jv_strz("length"), jv_int(len));
                dict_set(c, loop.d, jv_strz("previtem"), i ? kept.l->v[i - 1] : jv_undef());
                dict_set(c, loop.d, jv_strz("nextitem"), i + 1 < len ? kept.l->v[i + 1] : jv_undef());
                var_push(c, "loop", 4, loop);
                bind_names(c, n->tgt, n->tgtn, kept.l->v[i]);
                run(c, n->body);
                c->n_vars = mark; /* a loop's sets do not leak (jinja2's scoping) */
            }
            if (!len && n->alt)
                run(c, n->alt);
            break;
        }
        case N_SET: {
            jv v = eval_src(c, n->p, n->n);
            const char *dot = memchr(n->tgt, '.', n->tgtn);
            if (dot) { /* ns.attr = ... */
                jv *ns = var_find(c, n->tgt, (size_t)(dot - n->tgt));
                if (!ns || ns->t != JV_DICT || !ns->ns)
                    jfail(c, "set of an attribute of something that is not a namespace");
                size_t an = n->tgtn - (size_t)(dot + 1 - n->tgt);
                dict_set(c, ns->d, jv_str(dot + 1, an), v);
            } else if (memchr(n->tgt, ',', n->tgtn)) {
                bind_names(c, n->tgt, n->tgtn, v);
            } else {
                var_push(c, n->tgt, n->tgtn, v);
            }
            break;
        }
        }
    }
    c->depth--;
}

/* The template's text with its variables: the messages (msgs, n) where msgs is given, then the
 * keys of the JSON object vars (a later one wins). */
static char *render(const char *tmpl, size_t len, const jinja_message *msgs, int n,
                    const char *vars, size_t vars_len, bool add_generation_prompt,
                    const char *bos, const char *eos, char *err, size_t errlen)
{
    /* on the heap: what longjmp leaves behind is then well defined (no local changed after
     * setjmp) */
    jctx *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "chat template: out of memory");
        return NULL;
    }
    c->err = err;
    c->errlen = errlen;
    c->src = tmpl;
    char *result = NULL;
    if (setjmp(c->fail)) {
        free(c->out);
        goto done;
    }
    var_push(c, "add_generation_prompt", 21, jv_bool(add_generation_prompt));
    var_push(c, "bos_token", 9, bos ? jv_strz(bos) : jv_strz(""));
    var_push(c, "eos_token", 9, eos ? jv_strz(eos) : jv_strz(""));
    if (msgs) {
        jv messages = jv_list(c);
        for (int i = 0; i < n; i++) {
            jv m = jv_dict(c);
            dict_set(c, m.d, jv_strz("role"), jv_strz(msgs[i].role));
            dict_set(c, m.d, jv_strz("content"), jv_strz(msgs[i].content));
            list_push(c, messages.l, m);
        }
        var_push(c, "messages", 8, messages);
    }
    if (vars) {
        c->json = true;
        jv v = eval_src(c, vars, vars_len);
        c->json = false;
        if (v.t != JV_DICT)
            jfail(c, "not a JSON object");
        for (int i = 0; i < v.d->n; i++)
            if (v.d->k[i].t != JV_STR)
                jfail(c, "a key that is not a string");
        for (int i = 0; i < v.d->n; i++)
            var_push(c, v.d->k[i].s.p, v.d->k[i].s.n, v.d->v[i]);
    }
    jpieces ps = {0};
    cut(c, tmpl, len, &ps);
    int at = 0, which;
    jnode *root = parse_nodes(c, &ps, &at, NULL, 0, &which);
    emit(c, "", 0);
    run(c, root);
    result = c->out;
done:
    while (c->arena) {
        jchunk *k = c->arena->next;
        free(c->arena);
        c->arena = k;
    }
    free(c);
    return result;
}

char *jinja_render_chat(const char *tmpl, size_t len, const jinja_message *msgs, int n,
                        bool add_generation_prompt, const char *bos, const char *eos, char *err,
                        size_t errlen)
{
    return render(tmpl, len, msgs, n, NULL, 0, add_generation_prompt, bos, eos, err, errlen);
}

char *jinja_render_vars(const char *tmpl, size_t len, const char *vars, size_t vars_len,
                        const char *bos, const char *eos, char *err, size_t errlen)
{
    return render(tmpl, len, NULL, 0, vars, vars_len, true, bos, eos, err, errlen);
}
