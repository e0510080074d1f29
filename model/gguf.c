/*
 * model/gguf — the GGUF v2/v3 reader (see gguf.h for the API).
 *
 * How it works: gguf_open maps the file read-only and hands the bytes to the same parser that
 * gguf_open_memory uses. The parser walks the file once with a bounds-checked cursor:
 *   header (magic, version, tensor_count, metadata_kv_count)
 *   -> metadata key/value pairs (arrays may nest, at most GGUF_MAX_DEPTH levels)
 *   -> tensor infos -> padding to general.alignment -> tensor data.
 * Every length and count is compared with the bytes that remain *before* anything is allocated
 * for it (each element has a known minimum encoded size), so an absurd count fails at once
 * instead of asking malloc for terabytes; all size arithmetic uses overflow-checked builtins.
 * Strings, scalar array elements and tensor data stay inside the mapping; only the kv table, the
 * tensor table, string-array tables and nested-array tables are allocated, each released by
 * gguf_close (or by the failing open) through one path.
 *
 * Duplicate keys and tensor names are found with a temporary open-addressing hash table that
 * lives only during the open. gguf_find / gguf_tensor_find are plain linear scans (tables are
 * small and lookups are done once at model load), which keeps them valid for any gguf_file.
 *
 * Errors are one line: "LABEL: <field> at byte <offset>: <detail>", where <field> names the header
 * field, the metadata key or the tensor; names from the file are escaped and shortened so the
 * message never spans lines.
 */
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC "GGUF"
#define GGUF_HEADER_BYTES 24u
#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_DEPTH 8 /* array nesting levels, the outermost array included */
#define GGUF_NAME_SHOWN 64 /* characters of a key/tensor name quoted in an error */

/* Minimum encoded sizes, used to bound counts against the remaining bytes before allocating. */
#define GGUF_MIN_STR 8u                /* uint64 length, no bytes */
#define GGUF_MIN_ARRAY 12u             /* uint32 type + uint64 count */
#define GGUF_MIN_KV (GGUF_MIN_STR + 4u + 1u)
#define GGUF_MIN_TENSOR (GGUF_MIN_STR + 4u + 8u + 4u + 8u) /* name, n_dims, ne[0], type, offset */

/* A gguf_file together with what gguf_close needs to release the bytes it was read from. */
typedef struct {
    gguf_file pub; /* first member: a gguf_file* of an opened file points here */
    bool mapped;
    size_t map_len;
} gguf_handle;

/* ===== ggml tensor types: elements and bytes per block ===== */

typedef struct {
    uint16_t block;
    uint16_t bytes;
} gguf_ggml_layout;

/* Indexed by ggml type id; {0, 0} marks ids that are not ggml types (4, 5). */
static const gguf_ggml_layout GGUF_GGML_TYPES[] = {
    [0] = {1, 4},      /* F32 */
    [1] = {1, 2},      /* F16 */
    [2] = {32, 18},    /* Q4_0 */
    [3] = {32, 20},    /* Q4_1 */
    [6] = {32, 22},    /* Q5_0 */
    [7] = {32, 24},    /* Q5_1 */
    [8] = {32, 34},    /* Q8_0 */
    [9] = {32, 36},    /* Q8_1 */
    [10] = {256, 84},  /* Q2_K */
    [11] = {256, 110}, /* Q3_K */
    [12] = {256, 144}, /* Q4_K */
    [13] = {256, 176}, /* Q5_K */
    [14] = {256, 210}, /* Q6_K */
    [15] = {256, 292}, /* Q8_K */
    [16] = {256, 66},  /* IQ2_XXS */
    [17] = {256, 74},  /* IQ2_XS */
    [18] = {256, 98},  /* IQ3_XXS */
    [19] = {256, 50},  /* IQ1_S */
    [20] = {32, 18},   /* IQ4_NL */
    [21] = {256, 110}, /* IQ3_S */
    [22] = {256, 82},  /* IQ2_S */
    [23] = {256, 136}, /* IQ4_XS */
    [24] = {1, 1},     /* I8 */
    [25] = {1, 2},     /* I16 */
    [26] = {1, 4},     /* I32 */
    [27] = {1, 8},     /* I64 */
    [28] = {1, 8},     /* F64 */
    [29] = {256, 56},  /* IQ1_M */
    [30] = {1, 2},     /* BF16 */
};

static const gguf_ggml_layout *gguf_ggml_layout_of(uint32_t type)
{
    if (type >= sizeof GGUF_GGML_TYPES / sizeof GGUF_GGML_TYPES[0] || !GGUF_GGML_TYPES[type].block)
        return NULL;
    return &GGUF_GGML_TYPES[type];
}

/* ===== value types ===== */

static const char *const GGUF_TYPE_NAMES[GGUF_TYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool", "string", "array", "uint64", "int64", "float64",
};

const char *gguf_type_name(gguf_type t)
{
    if ((unsigned)t >= GGUF_TYPE_COUNT)
        return "unknown";
    return GGUF_TYPE_NAMES[t];
}

/* Encoded size of a scalar type; 0 for STRING and ARRAY. */
static uint64_t gguf_scalar_size(gguf_type t)
{
    switch (t) {
    case GGUF_UINT8:
    case GGUF_INT8:
    case GGUF_BOOL:
        return 1;
    case GGUF_UINT16:
    case GGUF_INT16:
        return 2;
    case GGUF_UINT32:
    case GGUF_INT32:
    case GGUF_FLOAT32:
        return 4;
    case GGUF_UINT64:
    case GGUF_INT64:
    case GGUF_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

static uint64_t gguf_min_elem_size(gguf_type t)
{
    if (t == GGUF_STRING)
        return GGUF_MIN_STR;
    if (t == GGUF_ARRAY)
        return GGUF_MIN_ARRAY;
    return gguf_scalar_size(t);
}

static bool gguf_is_unsigned(gguf_type t)
{
    return t == GGUF_UINT8 || t == GGUF_UINT16 || t == GGUF_UINT32 || t == GGUF_UINT64;
}

static bool gguf_is_signed(gguf_type t)
{
    return t == GGUF_INT8 || t == GGUF_INT16 || t == GGUF_INT32 || t == GGUF_INT64;
}

static bool gguf_is_float(gguf_type t)
{
    return t == GGUF_FLOAT32 || t == GGUF_FLOAT64;
}

/* ===== little-endian decoding ===== */

static uint16_t gguf_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t gguf_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t gguf_le64(const uint8_t *p)
{
    return (uint64_t)gguf_le32(p) | (uint64_t)gguf_le32(p + 4) << 32;
}

/* Decode one scalar of type t at p into v (v->type is set by the caller). */
static void gguf_decode_scalar(gguf_type t, const uint8_t *p, gguf_value *v)
{
    switch (t) {
    case GGUF_UINT8:
    case GGUF_BOOL:
        v->u = p[0];
        break;
    case GGUF_INT8:
        v->i = (int8_t)p[0];
        break;
    case GGUF_UINT16:
        v->u = gguf_le16(p);
        break;
    case GGUF_INT16:
        v->i = (int16_t)gguf_le16(p);
        break;
    case GGUF_UINT32:
        v->u = gguf_le32(p);
        break;
    case GGUF_INT32:
        v->i = (int32_t)gguf_le32(p);
        break;
    case GGUF_UINT64:
        v->u = gguf_le64(p);
        break;
    case GGUF_INT64:
        v->i = (int64_t)gguf_le64(p);
        break;
    case GGUF_FLOAT32: {
        uint32_t bits = gguf_le32(p);
        float f;
        memcpy(&f, &bits, sizeof f);
        v->f = f;
        break;
    }
    case GGUF_FLOAT64: {
        uint64_t bits = gguf_le64(p);
        memcpy(&v->f, &bits, sizeof v->f);
        break;
    }
    default:
        v->u = 0;
        break;
    }
}

/* ===== the parse cursor and its errors ===== */

typedef struct {
    const uint8_t *base;
    uint64_t size;
    uint64_t pos;
    const char *label;
    char *err;
    size_t errlen;
    char what[GGUF_NAME_SHOWN + 64]; /* the field or record being read */
} gguf_reader;

void gguf_escape(char *dst, size_t cap, const char *s, uint64_t len)
{
    size_t o = 0;
    uint64_t i = 0;
    if (cap < 8) {
        if (cap)
            dst[0] = '\0';
        return;
    }
    size_t limit = cap - 4 < GGUF_NAME_SHOWN ? cap - 4 : GGUF_NAME_SHOWN; /* room for "..." */
    for (; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        bool hex = c < 0x20 || c > 0x7e;
        bool quote = c == '\'' || c == '\\';
        size_t w = hex ? 4 : quote ? 2 : 1;
        if (o + w > limit)
            break;
        if (hex) {
            snprintf(dst + o, cap - o, "\\x%02x", c);
        } else {
            if (quote)
                dst[o] = '\\';
            dst[o + w - 1] = (char)c;
        }
        o += w;
    }
    if (i < len) {
        memcpy(dst + o, "...", 3);
        o += 3;
    }
    dst[o] = '\0';
}

/* Name the record being read: "<kind> '<name>'". */
static void gguf_set_what_named(gguf_reader *r, const char *kind, gguf_str name)
{
    char q[GGUF_NAME_SHOWN + 8];
    gguf_escape(q, sizeof q, name.ptr, name.len);
    snprintf(r->what, sizeof r->what, "%s '%s'", kind, q);
}

static void gguf_set_what(gguf_reader *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void gguf_set_what(gguf_reader *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->what, sizeof r->what, fmt, ap);
    va_end(ap);
}

/* Record "LABEL: <what> at byte <at>: <detail>" and return false. */
static bool gguf_fail(gguf_reader *r, uint64_t at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool gguf_fail(gguf_reader *r, uint64_t at, const char *fmt, ...)
{
    if (!r->err || !r->errlen)
        return false;
    int n = snprintf(r->err, r->errlen, "%s: %s at byte %llu: ", r->label, r->what,
                     (unsigned long long)at);
    if (n >= 0 && (size_t)n < r->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err + n, r->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    /* the label comes from the caller and may hold anything: keep the message on one line */
    for (char *p = r->err; *p; p++)
        if ((unsigned char)*p < 0x20)
            *p = '?';
    return false;
}

static uint64_t gguf_remaining(const gguf_reader *r)
{
    return r->size - r->pos;
}

static bool gguf_need(gguf_reader *r, uint64_t n, const char *field)
{
    if (gguf_remaining(r) < n)
        return gguf_fail(r, r->pos, "%s truncated: needs %llu bytes, %llu remain", field,
                         (unsigned long long)n, (unsigned long long)gguf_remaining(r));
    return true;
}

static bool gguf_read_u32(gguf_reader *r, const char *field, uint32_t *out)
{
    if (!gguf_need(r, 4, field))
        return false;
    *out = gguf_le32(r->base + r->pos);
    r->pos += 4;
    return true;
}

static bool gguf_read_u64(gguf_reader *r, const char *field, uint64_t *out)
{
    if (!gguf_need(r, 8, field))
        return false;
    *out = gguf_le64(r->base + r->pos);
    r->pos += 8;
    return true;
}

/* A gguf string: uint64 length + bytes. `index` names an array element (UINT64_MAX: none). */
static bool gguf_read_str(gguf_reader *r, const char *field, uint64_t index, gguf_str *out)
{
    uint64_t at = r->pos;
    if (gguf_remaining(r) < 8 || gguf_le64(r->base + at) > gguf_remaining(r) - 8) {
        char name[64];
        if (index == UINT64_MAX)
            snprintf(name, sizeof name, "%s", field);
        else
            snprintf(name, sizeof name, "%s %llu", field, (unsigned long long)index);
        if (gguf_remaining(r) < 8)
            return gguf_need(r, 8, name);
        return gguf_fail(r, at, "%s length %llu exceeds the %llu bytes that remain", name,
                         (unsigned long long)gguf_le64(r->base + at),
                         (unsigned long long)(gguf_remaining(r) - 8));
    }
    out->len = gguf_le64(r->base + at);
    out->ptr = (const char *)r->base + at + 8;
    r->pos = at + 8 + out->len;
    return true;
}

/* ===== values ===== */

static void gguf_array_free(gguf_array *a)
{
    free(a->strs);
    a->strs = NULL;
    if (a->items) {
        for (uint64_t i = 0; i < a->n; i++)
            if (a->items[i].type == GGUF_ARRAY)
                gguf_array_free(&a->items[i].arr);
        free(a->items);
        a->items = NULL;
    }
}

static void gguf_value_free(gguf_value *v)
{
    if (v->type == GGUF_ARRAY)
        gguf_array_free(&v->arr);
}

/* Parse an array body (element type, count, elements) at depth (0 = a top-level value).
 * `a` must be zeroed; on failure whatever was allocated stays reachable from `a`. */
static bool gguf_parse_array(gguf_reader *r, gguf_array *a, int depth)
{
    uint64_t at = r->pos;
    uint32_t elem;
    uint64_t n;
    if (!gguf_read_u32(r, "array element type", &elem))
        return false;
    if (elem >= GGUF_TYPE_COUNT)
        return gguf_fail(r, at, "unknown array element type %u", elem);
    if (elem == GGUF_ARRAY && depth + 1 >= GGUF_MAX_DEPTH)
        return gguf_fail(r, at, "arrays nested more than %d levels deep", GGUF_MAX_DEPTH);
    a->elem = (gguf_type)elem;
    uint64_t n_at = r->pos;
    if (!gguf_read_u64(r, "array length", &n))
        return false;
    uint64_t min = gguf_min_elem_size(a->elem);
    if (n > gguf_remaining(r) / min)
        return gguf_fail(r, n_at,
                         "array length %llu of %s needs at least %llu x %llu bytes, %llu remain",
                         (unsigned long long)n, gguf_type_name(a->elem), (unsigned long long)n,
                         (unsigned long long)min, (unsigned long long)gguf_remaining(r));
    a->n = n;
    if (a->elem == GGUF_STRING) {
        a->strs = calloc(n ? n : 1, sizeof *a->strs);
        if (!a->strs)
            return gguf_fail(r, n_at, "out of memory for %llu strings", (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++)
            if (!gguf_read_str(r, "string element", i, &a->strs[i]))
                return false;
    } else if (a->elem == GGUF_ARRAY) {
        a->items = calloc(n ? n : 1, sizeof *a->items);
        if (!a->items)
            return gguf_fail(r, n_at, "out of memory for %llu nested arrays",
                             (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) {
            a->items[i].type = GGUF_ARRAY;
            if (!gguf_parse_array(r, &a->items[i].arr, depth + 1))
                return false;
        }
    } else {
        a->raw = r->base + r->pos;
        r->pos += n * min; /* n * min <= remaining: checked above */
    }
    return true;
}

/* Parse a value of type t into v (zeroed). */
static bool gguf_parse_value(gguf_reader *r, gguf_type t, gguf_value *v)
{
    v->type = t;
    if (t == GGUF_STRING)
        return gguf_read_str(r, "string value", UINT64_MAX, &v->str);
    if (t == GGUF_ARRAY)
        return gguf_parse_array(r, &v->arr, 0);
    uint64_t size = gguf_scalar_size(t);
    if (!gguf_need(r, size, gguf_type_name(t)))
        return false;
    gguf_decode_scalar(t, r->base + r->pos, v);
    r->pos += size;
    return true;
}

/* ===== duplicate detection: a temporary open-addressing set of names ===== */

typedef struct {
    uint64_t *slot; /* entry index + 1; 0 = empty */
    uint64_t mask;
} gguf_nameset;

static uint64_t gguf_hash(const char *s, uint64_t len)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (uint64_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static bool gguf_nameset_init(gguf_nameset *s, uint64_t n)
{
    uint64_t cap = 16;
    while (cap < n * 2)
        cap *= 2; /* n is bounded by the file size, so this cannot overflow */
    s->slot = calloc(cap, sizeof *s->slot);
    s->mask = cap - 1;
    return s->slot != NULL;
}

static void gguf_nameset_free(gguf_nameset *s)
{
    free(s->slot);
    s->slot = NULL;
}

static bool gguf_str_same(gguf_str a, gguf_str b)
{
    return a.len == b.len && (a.len == 0 || !memcmp(a.ptr, b.ptr, a.len));
}

/* Insert names[idx] (names is an array of records, the gguf_str at byte `off` of each `stride`
 * bytes); returns the index of an earlier equal name, or UINT64_MAX when it was new. */
static uint64_t gguf_nameset_add(gguf_nameset *s, const void *names, size_t stride, size_t off,
                                 uint64_t idx)
{
    const char *rec = (const char *)names;
    gguf_str name;
    memcpy(&name, rec + idx * stride + off, sizeof name);
    for (uint64_t h = gguf_hash(name.ptr, name.len) & s->mask;; h = (h + 1) & s->mask) {
        if (!s->slot[h]) {
            s->slot[h] = idx + 1;
            return UINT64_MAX;
        }
        gguf_str other;
        memcpy(&other, rec + (s->slot[h] - 1) * stride + off, sizeof other);
        if (gguf_str_same(name, other))
            return s->slot[h] - 1;
    }
}

/* ===== file sections ===== */

static bool gguf_parse_header(gguf_reader *r, gguf_file *f)
{
    gguf_set_what(r, "header");
    if (r->size == 0)
        return gguf_fail(r, 0, "empty file (0 bytes)");
    uint64_t have = r->size < 4 ? r->size : 4;
    if (memcmp(r->base, GGUF_MAGIC, (size_t)have)) {
        char got[32];
        gguf_escape(got, sizeof got, (const char *)r->base, have);
        gguf_set_what(r, "magic");
        return gguf_fail(r, 0, "bad magic '%s', expected 'GGUF'", got);
    }
    if (r->size < GGUF_HEADER_BYTES)
        return gguf_fail(r, 0, "file is %llu bytes, smaller than the %u-byte GGUF header",
                         (unsigned long long)r->size, GGUF_HEADER_BYTES);
    r->pos = 4;
    f->version = gguf_le32(r->base + 4);
    if (f->version != 2 && f->version != 3) {
        gguf_set_what(r, "version");
        uint32_t swapped = __builtin_bswap32(f->version);
        return gguf_fail(r, 4, "unsupported GGUF version %u (supported: 2, 3)%s", f->version,
                         (swapped == 2 || swapped == 3) ? "; big-endian files are not supported"
                                                        : "");
    }
    f->n_tensors = gguf_le64(r->base + 8);
    f->n_kv = gguf_le64(r->base + 16);
    r->pos = GGUF_HEADER_BYTES;
    if (f->n_kv > gguf_remaining(r) / GGUF_MIN_KV) {
        gguf_set_what(r, "metadata_kv_count");
        return gguf_fail(r, 16, "%llu key/value pairs cannot fit in the %llu bytes that remain",
                         (unsigned long long)f->n_kv, (unsigned long long)gguf_remaining(r));
    }
    if (f->n_tensors > gguf_remaining(r) / GGUF_MIN_TENSOR) {
        gguf_set_what(r, "tensor_count");
        return gguf_fail(r, 8, "%llu tensor infos cannot fit in the %llu bytes that remain",
                         (unsigned long long)f->n_tensors, (unsigned long long)gguf_remaining(r));
    }
    return true;
}

static bool gguf_parse_kv(gguf_reader *r, gguf_file *f)
{
    uint64_t n = f->n_kv;
    gguf_set_what(r, "metadata_kv_count");
    if (n > gguf_remaining(r) / GGUF_MIN_KV)
        return gguf_fail(r, 16, "%llu key/value pairs cannot fit in the %llu bytes that remain",
                         (unsigned long long)n, (unsigned long long)gguf_remaining(r));
    f->kv = calloc(n ? n : 1, sizeof *f->kv);
    if (!f->kv)
        return gguf_fail(r, 16, "out of memory for %llu key/value pairs", (unsigned long long)n);
    gguf_nameset seen;
    if (!gguf_nameset_init(&seen, n))
        return gguf_fail(r, 16, "out of memory for %llu key/value pairs", (unsigned long long)n);
    bool ok = true;
    for (uint64_t i = 0; i < n && ok; i++) {
        gguf_kv *kv = &f->kv[i];
        kv->offset = r->pos;
        gguf_set_what(r, "metadata key #%llu", (unsigned long long)i);
        ok = gguf_read_str(r, "key", UINT64_MAX, &kv->key);
        if (!ok)
            break;
        gguf_set_what_named(r, "metadata key", kv->key);
        uint64_t type_at = r->pos;
        uint32_t type;
        ok = gguf_read_u32(r, "value type", &type);
        if (ok && type >= GGUF_TYPE_COUNT)
            ok = gguf_fail(r, type_at, "unknown value type %u", type);
        if (ok)
            ok = gguf_parse_value(r, (gguf_type)type, &kv->value);
        if (ok) {
            uint64_t first =
                gguf_nameset_add(&seen, f->kv, sizeof *f->kv, offsetof(gguf_kv, key), i);
            if (first != UINT64_MAX)
                ok = gguf_fail(r, kv->offset, "duplicate key (first defined at byte %llu)",
                               (unsigned long long)f->kv[first].offset);
        }
    }
    gguf_nameset_free(&seen);
    return ok;
}

static bool gguf_parse_alignment(gguf_reader *r, gguf_file *f)
{
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_find(f, "general.alignment");
    if (!kv)
        return true;
    gguf_set_what_named(r, "metadata key", kv->key);
    const gguf_value *v = &kv->value;
    uint64_t a;
    if (gguf_is_unsigned(v->type))
        a = v->u;
    else if (gguf_is_signed(v->type) && v->i >= 0)
        a = (uint64_t)v->i;
    else if (gguf_is_signed(v->type))
        return gguf_fail(r, kv->offset, "alignment %lld is negative", (long long)v->i);
    else
        return gguf_fail(r, kv->offset, "alignment has type %s, expected uint32",
                         gguf_type_name(v->type));
    if (a == 0 || (a & (a - 1)) || a > UINT32_MAX)
        return gguf_fail(r, kv->offset, "alignment %llu is not a nonzero power of two below 2^32",
                         (unsigned long long)a);
    f->alignment = a;
    return true;
}

/* One tensor info record into t. */
static bool gguf_parse_tensor_info(gguf_reader *r, gguf_file *f, gguf_tensor *t, uint64_t i)
{
    t->info_offset = r->pos;
    gguf_set_what(r, "tensor #%llu", (unsigned long long)i);
    if (!gguf_read_str(r, "name", UINT64_MAX, &t->name))
        return false;
    gguf_set_what_named(r, "tensor", t->name);
    uint64_t at = r->pos;
    if (!gguf_read_u32(r, "n_dims", &t->n_dims))
        return false;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return gguf_fail(r, at, "n_dims %u is not in [1, %d]", t->n_dims, GGUF_MAX_DIMS);
    uint64_t ne_at = r->pos;
    uint64_t elems = 1;
    bool overflow = false;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d < t->n_dims) {
            at = r->pos;
            if (!gguf_read_u64(r, "dimension", &t->ne[d]))
                return false;
            if (t->ne[d] > (uint64_t)INT64_MAX)
                return gguf_fail(r, at, "ne[%u] = %llu is larger than 2^63-1", d,
                                 (unsigned long long)t->ne[d]);
        }
        overflow |= __builtin_mul_overflow(elems, t->ne[d], &elems);
    }
    if (overflow || elems > (uint64_t)INT64_MAX)
        return gguf_fail(r, ne_at, "element count ne[0]*ne[1]*ne[2]*ne[3] = %llu*%llu*%llu*%llu "
                         "overflows 64 bits", (unsigned long long)t->ne[0],
                         (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                         (unsigned long long)t->ne[3]);
    at = r->pos;
    if (!gguf_read_u32(r, "type", &t->type))
        return false;
    const gguf_ggml_layout *lay = gguf_ggml_layout_of(t->type);
    if (!lay)
        return gguf_fail(r, at, "unknown ggml type id %u", t->type);
    if (t->ne[0] % lay->block)
        return gguf_fail(r, ne_at, "ne[0] = %llu is not a multiple of the block size %u of type %u",
                         (unsigned long long)t->ne[0], lay->block, t->type);
    uint64_t nbytes = t->ne[0] / lay->block;
    overflow = __builtin_mul_overflow(nbytes, (uint64_t)lay->bytes, &nbytes);
    for (uint32_t d = 1; d < GGUF_MAX_DIMS; d++)
        overflow |= __builtin_mul_overflow(nbytes, t->ne[d], &nbytes);
    if (overflow)
        return gguf_fail(r, ne_at, "byte size of %llu elements of type %u overflows 64 bits",
                         (unsigned long long)elems, t->type);
    t->nbytes = nbytes;
    at = r->pos;
    if (!gguf_read_u64(r, "offset", &t->offset))
        return false;
    if (t->offset % f->alignment)
        return gguf_fail(r, at, "data offset %llu is not a multiple of the alignment %llu",
                         (unsigned long long)t->offset, (unsigned long long)f->alignment);
    return true;
}

typedef struct {
    uint64_t offset, end;
    uint64_t index;
} gguf_span;

static int gguf_span_cmp(const void *pa, const void *pb)
{
    const gguf_span *a = pa, *b = pb;
    if (a->offset != b->offset)
        return a->offset < b->offset ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

/* Reject tensors whose data ranges overlap (zero-byte tensors overlap nothing). */
static bool gguf_check_overlap(gguf_reader *r, gguf_file *f)
{
    uint64_t n = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        n += f->tensors[i].nbytes > 0;
    if (n < 2)
        return true;
    gguf_span *spans = malloc(n * sizeof *spans);
    if (!spans) {
        gguf_set_what(r, "tensor table");
        return gguf_fail(r, f->data_offset, "out of memory for %llu tensors",
                         (unsigned long long)n);
    }
    uint64_t k = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (t->nbytes > 0)
            spans[k++] = (gguf_span){t->offset, t->offset + t->nbytes, i};
    }
    qsort(spans, n, sizeof *spans, gguf_span_cmp);
    bool ok = true;
    for (uint64_t j = 1; j < n && ok; j++) {
        if (spans[j].offset < spans[j - 1].end) {
            const gguf_tensor *a = &f->tensors[spans[j - 1].index];
            const gguf_tensor *b = &f->tensors[spans[j].index];
            char qa[GGUF_NAME_SHOWN + 8];
            gguf_escape(qa, sizeof qa, a->name.ptr, a->name.len);
            gguf_set_what_named(r, "tensor", b->name);
            ok = gguf_fail(r, b->info_offset,
                           "data [%llu, %llu) overlaps tensor '%s' data [%llu, %llu)",
                           (unsigned long long)spans[j].offset, (unsigned long long)spans[j].end,
                           qa, (unsigned long long)spans[j - 1].offset,
                           (unsigned long long)spans[j - 1].end);
        }
    }
    free(spans);
    return ok;
}

static bool gguf_parse_tensors(gguf_reader *r, gguf_file *f)
{
    uint64_t n = f->n_tensors;
    gguf_set_what(r, "tensor_count");
    if (n > gguf_remaining(r) / GGUF_MIN_TENSOR)
        return gguf_fail(r, 8, "%llu tensor infos cannot fit in the %llu bytes that remain",
                         (unsigned long long)n, (unsigned long long)gguf_remaining(r));
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors)
        return gguf_fail(r, 8, "out of memory for %llu tensors", (unsigned long long)n);
    gguf_nameset seen;
    if (!gguf_nameset_init(&seen, n))
        return gguf_fail(r, 8, "out of memory for %llu tensors", (unsigned long long)n);
    bool ok = true;
    for (uint64_t i = 0; i < n && ok; i++) {
        ok = gguf_parse_tensor_info(r, f, &f->tensors[i], i);
        if (ok) {
            uint64_t first = gguf_nameset_add(&seen, f->tensors, sizeof *f->tensors,
                                              offsetof(gguf_tensor, name), i);
            if (first != UINT64_MAX)
                ok = gguf_fail(r, f->tensors[i].info_offset,
                               "duplicate tensor name (first defined at byte %llu)",
                               (unsigned long long)f->tensors[first].info_offset);
        }
    }
    gguf_nameset_free(&seen);
    if (!ok)
        return false;

    /* the data section starts at the next multiple of the alignment after the infos */
    uint64_t pad = (f->alignment - r->pos % f->alignment) % f->alignment;
    if (__builtin_add_overflow(r->pos, pad, &f->data_offset) ||
        (n > 0 && f->data_offset > r->size)) {
        gguf_set_what(r, "tensor data section");
        return gguf_fail(r, r->pos, "start %llu (aligned to %llu) is past the end of the file "
                         "(%llu bytes)", (unsigned long long)r->pos + pad,
                         (unsigned long long)f->alignment, (unsigned long long)r->size);
    }
    for (uint64_t i = 0; i < n; i++) {
        gguf_tensor *t = &f->tensors[i];
        uint64_t avail = r->size - f->data_offset;
        if (t->offset > avail || t->nbytes > avail - t->offset) {
            gguf_set_what_named(r, "tensor", t->name);
            return gguf_fail(r, t->info_offset,
                             "data [%llu, +%llu) past the end of the file: the data section at "
                             "byte %llu holds %llu bytes", (unsigned long long)t->offset,
                             (unsigned long long)t->nbytes, (unsigned long long)f->data_offset,
                             (unsigned long long)avail);
        }
        t->data = r->base + f->data_offset + t->offset;
    }
    return gguf_check_overlap(r, f);
}

/* ===== open / close ===== */

static void gguf_free_tables(gguf_file *f)
{
    if (f->kv) {
        for (uint64_t i = 0; i < f->n_kv; i++)
            gguf_value_free(&f->kv[i].value);
        free(f->kv);
        f->kv = NULL;
    }
    free(f->tensors);
    f->tensors = NULL;
}

void gguf_close(gguf_file **file)
{
    if (!file || !*file)
        return;
    gguf_handle *h = (gguf_handle *)*file;
    gguf_free_tables(&h->pub);
    if (h->mapped)
        munmap((void *)h->pub.base, h->map_len);
    free(h->pub.path);
    free(h);
    *file = NULL;
}

static void gguf_set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void gguf_set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    for (char *p = err; *p; p++)
        if ((unsigned char)*p < 0x20)
            *p = '?';
}

/* Parse base[0, size) into a new handle; NULL with err set on failure. */
static gguf_handle *gguf_parse(const uint8_t *base, uint64_t size, const char *label, char *err,
                               size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!label)
        label = "<memory>";
    gguf_handle *h = calloc(1, sizeof *h);
    if (!h) {
        gguf_set_err(err, errlen, "%s: out of memory", label);
        return NULL;
    }
    gguf_file *f = &h->pub;
    f->base = base;
    f->size = size;
    f->path = strdup(label);
    if (!f->path) {
        free(h);
        gguf_set_err(err, errlen, "%s: out of memory", label);
        return NULL;
    }
    gguf_reader r = {.base = base, .size = size, .label = label, .err = err, .errlen = errlen};
    if (!(base || size == 0) || !gguf_parse_header(&r, f) || !gguf_parse_kv(&r, f) ||
        !gguf_parse_alignment(&r, f) || !gguf_parse_tensors(&r, f)) {
        if (err && errlen && !err[0])
            gguf_set_err(err, errlen, "%s: invalid GGUF buffer at byte 0", label);
        gguf_free_tables(f);
        free(f->path);
        free(h);
        return NULL;
    }
    return h;
}

gguf_file *gguf_open_memory(const void *buf, uint64_t size, const char *label, char *err,
                            size_t errlen)
{
    gguf_handle *h = gguf_parse(buf, size, label, err, errlen);
    return h ? &h->pub : NULL;
}

gguf_file *gguf_open(const char *path, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!path) {
        gguf_set_err(err, errlen, "gguf_open: no path given");
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        gguf_set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        gguf_set_err(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        gguf_set_err(err, errlen, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    if (st.st_size == 0) { /* nothing to map: let the parser word the error */
        close(fd);
        gguf_handle *h = gguf_parse(NULL, 0, path, err, errlen);
        if (h) { /* cannot happen: an empty file never parses */
            gguf_file *f = &h->pub;
            gguf_close(&f);
        }
        return NULL;
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        gguf_set_err(err, errlen, "%s: file of %llu bytes is too large to map", path,
                     (unsigned long long)st.st_size);
        close(fd);
        return NULL;
    }
    size_t len = (size_t)st.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED) {
        gguf_set_err(err, errlen, "%s: cannot map %zu bytes: %s", path, len, strerror(map_errno));
        return NULL;
    }
    gguf_handle *h = gguf_parse(map, len, path, err, errlen);
    if (!h) {
        munmap(map, len);
        return NULL;
    }
    h->mapped = true;
    h->map_len = len;
    return &h->pub;
}

/* ===== lookups and getters ===== */

bool gguf_str_eq(gguf_str s, const char *cstr)
{
    if (!cstr)
        return false;
    size_t n = strlen(cstr);
    return s.len == n && (n == 0 || !memcmp(s.ptr, cstr, n));
}

const gguf_kv *gguf_find(const gguf_file *f, const char *key)
{
    if (!f || !key)
        return NULL;
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (gguf_str_eq(f->kv[i].key, key))
            return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_tensor_find(const gguf_file *f, const char *name)
{
    if (!f || !name)
        return NULL;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (gguf_str_eq(f->tensors[i].name, name))
            return &f->tensors[i];
    return NULL;
}

bool gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out)
{
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv)
        return false;
    if (gguf_is_unsigned(kv->value.type)) {
        *out = kv->value.u;
        return true;
    }
    if (gguf_is_signed(kv->value.type) && kv->value.i >= 0) {
        *out = (uint64_t)kv->value.i;
        return true;
    }
    return false;
}

bool gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out)
{
    uint64_t v;
    if (!gguf_get_u64(f, key, &v) || v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    return true;
}

bool gguf_get_i64(const gguf_file *f, const char *key, int64_t *out)
{
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv)
        return false;
    if (gguf_is_signed(kv->value.type)) {
        *out = kv->value.i;
        return true;
    }
    if (gguf_is_unsigned(kv->value.type) && kv->value.u <= (uint64_t)INT64_MAX) {
        *out = (int64_t)kv->value.u;
        return true;
    }
    return false;
}

bool gguf_get_f32(const gguf_file *f, const char *key, float *out)
{
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv)
        return false;
    if (gguf_is_float(kv->value.type))
        *out = (float)kv->value.f;
    else if (gguf_is_unsigned(kv->value.type))
        *out = (float)kv->value.u;
    else if (gguf_is_signed(kv->value.type))
        *out = (float)kv->value.i;
    else
        return false;
    return true;
}

bool gguf_get_bool(const gguf_file *f, const char *key, bool *out)
{
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv || kv->value.type != GGUF_BOOL)
        return false;
    *out = kv->value.u != 0;
    return true;
}

bool gguf_get_str(const gguf_file *f, const char *key, gguf_str *out)
{
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv || kv->value.type != GGUF_STRING)
        return false;
    *out = kv->value.str;
    return true;
}

const gguf_array *gguf_get_array(const gguf_file *f, const char *key)
{
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv || kv->value.type != GGUF_ARRAY)
        return NULL;
    return &kv->value.arr;
}

/* Element i of a scalar array decoded into v; false for out-of-range i or non-scalar arrays. */
static bool gguf_array_elem(const gguf_array *a, uint64_t i, gguf_value *v)
{
    if (!a || i >= a->n || !a->raw)
        return false;
    uint64_t size = gguf_scalar_size(a->elem);
    if (!size)
        return false;
    v->type = a->elem;
    gguf_decode_scalar(a->elem, a->raw + i * size, v);
    return true;
}

int64_t gguf_array_int(const gguf_array *a, uint64_t i)
{
    gguf_value v;
    if (!gguf_array_elem(a, i, &v))
        return 0;
    if (gguf_is_signed(v.type))
        return v.i;
    if (gguf_is_float(v.type)) {
        if (!(v.f == v.f))
            return 0; /* NaN */
        if (v.f >= 9223372036854775807.0)
            return INT64_MAX;
        if (v.f <= -9223372036854775808.0)
            return INT64_MIN;
        return (int64_t)v.f;
    }
    return v.u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v.u; /* unsigned, bool */
}

double gguf_array_float(const gguf_array *a, uint64_t i)
{
    gguf_value v;
    if (!gguf_array_elem(a, i, &v))
        return 0.0;
    if (gguf_is_float(v.type))
        return v.f;
    if (gguf_is_signed(v.type))
        return (double)v.i;
    return (double)v.u;
}
