/*
 * cli/cmd_quantize.c — `orochi quantize IN OUT [TYPE] [--mix PRESET|RULES]`: rewrite a GGUF model
 * with its weight matrices in other tensor types: one TYPE for all of them (F32, F16, BF16, Q8_0,
 * Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), or a per-tensor mix — one of
 * llama.cpp's presets (Q4_K_M, Q3_K_S, ...) or explicit PATTERN=TYPE rules.
 *
 * Why it exists: the engine and the speculators want the same model in several types (a Q8_0
 * target, a Q4_0 draft, an F16 file for the reference tests, the K-quant mixes people download)
 * and the only other tool that makes them is llama.cpp's. The block formats are not
 * re-implemented here: every row goes through kt_dequantize_row / kt_quantize_row from
 * kernels/cpu, the same code the engine and `orochi mkmodel` use, so what this writes is exactly
 * what the kernels expect. Any type orochi reads can be converted to any type it writes.
 *
 * Which tensors change: the weight matrices, i.e. tensors of two or more dimensions whose name
 * ends in ".weight" (the token embedding and output.weight included). Everything else (1-D norms
 * and biases) is copied byte for byte. Each matrix's type is chosen in this order:
 *   1. --keep T: a matrix whose current type is T stays as it is;
 *   2. the first --mix rule whose pattern matches the name (a rule's type may be `keep`);
 *   3. the preset (TYPE or --mix naming one of QZ_PRESETS; qz_preset_type() holds its rules,
 *      llama.cpp's for non-MoE models), else TYPE; without either the matrix stays as it is.
 * A rule's pattern matches a name that contains it as whole dot-separated parts ("output" is
 * output.weight, not blk.0.attn_output.weight; "blk.1" is not blk.10), or `*`, every matrix.
 * Then the row length (ne[0]) must be a multiple of the chosen type's block. A K-type (256) that
 * does not fit gets llama.cpp's fallback instead (Q2_K, Q3_K -> IQ4_NL; Q4_K -> Q5_0; Q5_K ->
 * Q5_1; Q6_K -> Q8_0), reported as one note per fallback with its tensor count. When a 32-block
 * type (the requested one or the fallback) does not fit either, the matrix stays as it is with a
 * note naming it (llama.cpp writes F16 there; keeping the original is the lossless choice), and
 * so does a matrix of a type orochi cannot dequantize. A matrix that already has its chosen type
 * is copied verbatim, so Q4_1 -> Q4_1 reproduces the bytes exactly (requantizing dequantized
 * Q4_1 blocks would not, because a block's min/max need not be hit by any of its nibbles).
 *
 * The output is GGUF v3: the header, every metadata key/value copied as raw bytes from the
 * input (so nested arrays, odd types and key order survive untouched) except general.file_type,
 * which is set to llama.cpp's file-type number (enum llama_ftype) of the preset or TYPE — for
 * --mix rules alone, of the type holding most matrix parameters — and appended if the input has
 * none; then the tensor-info table with the new types and offsets, each tensor's data aligned to
 * the input's general.alignment (default 32). It is written to OUT.tmp and renamed to OUT only
 * when complete, so a failure never leaves a partial OUT; OUT.tmp is removed on failure.
 *
 * Rows of a converted tensor are processed in slabs of about QZ_SLAB_BYTES output bytes, each
 * slab split over a kpool (--threads, default 2): rows are independent, so the bytes do not
 * depend on the thread count. Progress goes to stderr: a bar redrawn with \r on a terminal, a
 * line every 10% otherwise, then one summary line with the number of tensors of each type.
 * docs/quantize.md is the user's description.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "kernels/cpu/kernels.h"
#include "model/gguf.h"

#define QZ_DEFAULT_THREADS 2
#define QZ_MAX_THREADS 256
#define QZ_SLAB_BYTES (8u << 20) /* output bytes converted per pool job */
#define QZ_ROW_GRAIN 8           /* rows per pool chunk at least */
#define QZ_BAR_WIDTH 30
#define QZ_REDRAW_SECONDS 0.1
#define QZ_MIB (1024.0 * 1024.0)
#define QZ_MAX_RULES 64
#define QZ_KEEP UINT32_MAX            /* a chosen "type": the matrix stays as it is */
#define QZ_FILE_TYPE_INPUT UINT32_MAX /* general.file_type: leave the input's */
#define QZ_TYPE_LIST                                                                               \
    "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K"
#define QZ_PRESET_LIST "Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K"
/* the presets TYPE can name: those whose name is not also a type */
#define QZ_TYPE_PRESET_LIST "Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M"

/* The types TYPE may name, with llama.cpp's general.file_type number (enum llama_ftype) of a file
 * whose matrices all have that type. llama.cpp has no number for "every matrix Q3_K" (Q4_K,
 * Q5_K): those get their smallest mix's, _S (11, 14, 16), the nearest it has. */
typedef struct {
    const char *name;
    uint32_t type;
    uint32_t file_type;
} qz_type_name;

static const qz_type_name QZ_TYPES[] = {
    {"F32", KT_F32, 0},        {"F16", KT_F16, 1},    {"BF16", KT_BF16, 32}, {"Q8_0", KT_Q8_0, 7},
    {"Q4_0", KT_Q4_0, 2},      {"Q4_1", KT_Q4_1, 3},  {"Q5_0", KT_Q5_0, 8},  {"Q5_1", KT_Q5_1, 9},
    {"IQ4_NL", KT_IQ4_NL, 25}, {"Q2_K", KT_Q2_K, 10}, {"Q3_K", KT_Q3_K, 11}, {"Q4_K", KT_Q4_K, 14},
    {"Q5_K", KT_Q5_K, 16},     {"Q6_K", KT_Q6_K, 18},
};

/* llama.cpp's K-quant mixes (enum llama_ftype names and numbers); rules in qz_preset_type(). */
typedef enum {
    QZ_MIX_Q2_K,
    QZ_MIX_Q3_K_S,
    QZ_MIX_Q3_K_M,
    QZ_MIX_Q3_K_L,
    QZ_MIX_Q4_K_S,
    QZ_MIX_Q4_K_M,
    QZ_MIX_Q5_K_S,
    QZ_MIX_Q5_K_M,
    QZ_MIX_Q6_K,
} qz_mix;

typedef struct {
    const char *name;
    qz_mix mix;
    uint32_t base; /* the type of every matrix no rule of the mix moves */
    uint32_t file_type;
} qz_preset;

static const qz_preset QZ_PRESETS[] = {
    {"Q2_K", QZ_MIX_Q2_K, KT_Q2_K, 10},     {"Q3_K_S", QZ_MIX_Q3_K_S, KT_Q3_K, 11},
    {"Q3_K_M", QZ_MIX_Q3_K_M, KT_Q3_K, 12}, {"Q3_K_L", QZ_MIX_Q3_K_L, KT_Q3_K, 13},
    {"Q4_K_S", QZ_MIX_Q4_K_S, KT_Q4_K, 14}, {"Q4_K_M", QZ_MIX_Q4_K_M, KT_Q4_K, 15},
    {"Q5_K_S", QZ_MIX_Q5_K_S, KT_Q5_K, 16}, {"Q5_K_M", QZ_MIX_Q5_K_M, KT_Q5_K, 17},
    {"Q6_K", QZ_MIX_Q6_K, KT_Q6_K, 18},
};

/* One --mix rule: matrices whose name matches pat get type (or QZ_KEEP). pat points into argv. */
typedef struct {
    const char *pat;
    size_t len;
    uint32_t type;
} qz_rule;

typedef struct {
    const char *in, *out;
    const qz_type_name *to;  /* TYPE as one type for every matrix, or NULL */
    const qz_preset *preset; /* TYPE or --mix as a preset, or NULL */
    qz_rule rules[QZ_MAX_RULES];
    int n_rules;
    uint64_t keep; /* bit t set: tensors of ggml type t stay as they are */
    int threads;
} qz_options;

/* One output tensor: where its bytes come from and where they go. */
typedef struct {
    const gguf_tensor *src;
    uint32_t type;   /* output type */
    bool convert;    /* rows go through dequantize -> quantize; else bytes are copied */
    int64_t cols;    /* ne[0] */
    int64_t rows;    /* ne[1] * ne[2] * ne[3] */
    uint64_t nbytes; /* output data bytes */
    uint64_t offset; /* in the output data section */
} qz_tensor;

/* ===== metadata: encoded sizes, so each key/value can be copied as raw bytes ===== */

static uint64_t qz_scalar_bytes(gguf_type t)
{
    static const uint8_t size[GGUF_TYPE_COUNT] = {
        [GGUF_UINT8] = 1,  [GGUF_INT8] = 1,  [GGUF_UINT16] = 2,  [GGUF_INT16] = 2,
        [GGUF_UINT32] = 4, [GGUF_INT32] = 4, [GGUF_FLOAT32] = 4, [GGUF_BOOL] = 1,
        [GGUF_UINT64] = 8, [GGUF_INT64] = 8, [GGUF_FLOAT64] = 8,
    };
    return (unsigned)t < GGUF_TYPE_COUNT ? size[t] : 0;
}

/* Bytes of an array body as encoded: element type, count, elements. */
static uint64_t qz_array_bytes(const gguf_array *a)
{
    uint64_t n = 4 + 8;
    if (a->elem == GGUF_STRING) {
        for (uint64_t i = 0; i < a->n; i++)
            n += 8 + a->strs[i].len;
    } else if (a->elem == GGUF_ARRAY) {
        for (uint64_t i = 0; i < a->n; i++)
            n += qz_array_bytes(&a->items[i].arr);
    } else {
        n += a->n * qz_scalar_bytes(a->elem);
    }
    return n;
}

/* Bytes of a whole key/value record: key string, value type, value. */
static uint64_t qz_kv_bytes(const gguf_kv *kv)
{
    uint64_t n = 8 + kv->key.len + 4;
    if (kv->value.type == GGUF_STRING)
        return n + 8 + kv->value.str.len;
    if (kv->value.type == GGUF_ARRAY)
        return n + qz_array_bytes(&kv->value.arr);
    return n + qz_scalar_bytes(kv->value.type);
}

/* The metadata section of the output: the input's records verbatim, general.file_type
 * replaced in place (as uint32) or appended — unless file_type is QZ_FILE_TYPE_INPUT, which
 * leaves the input's record (or its absence) as it is. Returns the number of records written, or 0
 * with a message when a record's computed size does not match the offsets the reader recorded
 * (cannot happen for a file gguf_open accepted; checked so that a reader change cannot turn
 * this copy into garbage). */
static uint64_t qz_write_metadata(const gguf_file *f, uint32_t file_type, cli_buf *b)
{
    static const char key[] = "general.file_type";
    bool replaced = false;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        uint64_t len = qz_kv_bytes(kv);
        /* the record must end where the next one (or the tensor table) starts */
        uint64_t next = i + 1 < f->n_kv ? f->kv[i + 1].offset
                        : f->n_tensors  ? f->tensors[0].info_offset
                                        : kv->offset + len;
        if (kv->offset > f->size || len > f->size - kv->offset || kv->offset + len != next ||
            (const uint8_t *)kv->key.ptr != f->base + kv->offset + 8) {
            fprintf(stderr,
                    "orochi quantize: %s: metadata record at byte %llu is not where the "
                    "reader placed it\n",
                    f->path, (unsigned long long)kv->offset);
            return 0;
        }
        if (file_type != QZ_FILE_TYPE_INPUT && gguf_str_eq(kv->key, key)) {
            cli_buf_str(b, key, sizeof key - 1);
            cli_buf_u32(b, GGUF_UINT32);
            cli_buf_u32(b, file_type);
            replaced = true;
        } else {
            cli_buf_put(b, f->base + kv->offset, (size_t)len);
        }
    }
    if (!replaced && file_type != QZ_FILE_TYPE_INPUT) {
        cli_buf_str(b, key, sizeof key - 1);
        cli_buf_u32(b, GGUF_UINT32);
        cli_buf_u32(b, file_type);
    }
    return f->n_kv + (!replaced && file_type != QZ_FILE_TYPE_INPUT);
}

/* ===== choosing each matrix's type ===== */

static const char *qz_type_str(uint32_t type)
{
    const kt_traits *t = kt_traits_of(type);
    return t ? t->name : "unknown";
}

static bool qz_ends_with(gguf_str s, const char *suffix)
{
    size_t n = strlen(suffix);
    return s.len >= n && !memcmp(s.ptr + s.len - n, suffix, n);
}

static bool qz_contains(gguf_str s, const char *part)
{
    size_t n = strlen(part);
    for (uint64_t i = 0; n <= s.len && i <= s.len - n; i++)
        if (!memcmp(s.ptr + i, part, n))
            return true;
    return false;
}

/* A --mix pattern matches `*` every name, otherwise a name that contains it as whole
 * dot-separated parts. */
static bool qz_rule_matches(const qz_rule *r, gguf_str s)
{
    if (r->len == 1 && r->pat[0] == '*')
        return true;
    for (uint64_t i = 0; r->len <= s.len && i <= s.len - r->len; i++) {
        bool starts = i == 0 || s.ptr[i - 1] == '.';
        bool ends = i + r->len == s.len || s.ptr[i + r->len] == '.';
        if (starts && ends && !memcmp(s.ptr + i, r->pat, r->len))
            return true;
    }
    return false;
}

/* The part a matrix plays in a preset, told apart by name as llama.cpp does: output.weight
 * exactly (or token_embd.weight in a model without output.weight, where the embedding is the
 * lm_head too), the others by substring. */
typedef enum {
    QZ_ROLE_OTHER,
    QZ_ROLE_OUTPUT,
    QZ_ROLE_ATTN_V,
    QZ_ROLE_FFN_DOWN,
    QZ_ROLE_ATTN_OUTPUT,
    QZ_ROLE_ATTN_QKV,
    QZ_ROLES
} qz_role;

static qz_role qz_role_of(gguf_str name, bool has_output)
{
    if (gguf_str_eq(name, "output.weight") ||
        (!has_output && gguf_str_eq(name, "token_embd.weight")))
        return QZ_ROLE_OUTPUT;
    if (qz_contains(name, "attn_v.weight"))
        return QZ_ROLE_ATTN_V;
    if (qz_contains(name, "ffn_down"))
        return QZ_ROLE_FFN_DOWN;
    if (qz_contains(name, "attn_output.weight"))
        return QZ_ROLE_ATTN_OUTPUT;
    if (qz_contains(name, "attn_qkv.weight"))
        return QZ_ROLE_ATTN_QKV;
    return QZ_ROLE_OTHER;
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every third between. */
static bool qz_more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* The type preset p gives the i-th of the n matrices of a role (i counts them in file order:
 * their layer, in files written layer by layer). n_gqa: attention heads per KV head. These are
 * llama.cpp's rules (llama_tensor_get_type) for dense, non-Falcon models; docs/quantize.md has
 * them as a table. */
static uint32_t qz_preset_type(const qz_preset *p, qz_role role, int i, int n, uint32_t n_gqa)
{
    qz_mix m = p->mix;
    bool more = (m == QZ_MIX_Q4_K_M || m == QZ_MIX_Q5_K_M) && qz_more_bits(i, n);
    switch (role) {
    case QZ_ROLE_OUTPUT: return KT_Q6_K;
    case QZ_ROLE_ATTN_V:
        if (m == QZ_MIX_Q2_K)
            return n_gqa >= 4 ? KT_Q4_K : KT_Q3_K;
        if (m == QZ_MIX_Q3_K_M)
            return i < 2 ? KT_Q5_K : KT_Q4_K;
        if (m == QZ_MIX_Q3_K_L || (m == QZ_MIX_Q4_K_S && i < 4))
            return KT_Q5_K;
        return more ? KT_Q6_K : p->base;
    case QZ_ROLE_FFN_DOWN:
        if (m == QZ_MIX_Q2_K)
            return KT_Q3_K;
        if (m == QZ_MIX_Q3_K_M)
            return i < n / 16 ? KT_Q5_K : KT_Q4_K;
        if (m == QZ_MIX_Q3_K_L || (m == QZ_MIX_Q4_K_S && i < n / 8))
            return KT_Q5_K;
        return more ? KT_Q6_K : p->base;
    case QZ_ROLE_ATTN_OUTPUT:
        return m == QZ_MIX_Q2_K     ? KT_Q3_K
               : m == QZ_MIX_Q3_K_M ? KT_Q4_K
               : m == QZ_MIX_Q3_K_L ? KT_Q5_K
                                    : p->base;
    case QZ_ROLE_ATTN_QKV:
        return m == QZ_MIX_Q3_K_M || m == QZ_MIX_Q3_K_L ? KT_Q4_K
               : m == QZ_MIX_Q4_K_M                     ? KT_Q5_K
               : m == QZ_MIX_Q5_K_M                     ? KT_Q6_K
                                                        : p->base;
    default: return p->base;
    }
}

/* What the presets need to know about the whole file. */
typedef struct {
    bool has_output;
    uint32_t n_gqa;
    int n[QZ_ROLES]; /* matrices of each role */
    int i[QZ_ROLES]; /* of those, seen so far */
} qz_mix_state;

static bool qz_is_matrix(const gguf_tensor *t)
{
    return t->n_dims >= 2 && qz_ends_with(t->name, ".weight");
}

static void qz_mix_init(const gguf_file *f, qz_mix_state *s)
{
    memset(s, 0, sizeof *s);
    s->has_output = gguf_tensor_find(f, "output.weight") != NULL;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (qz_is_matrix(&f->tensors[i]))
            s->n[qz_role_of(f->tensors[i].name, s->has_output)]++;
    /* heads per KV head, as llama.cpp's n_gqa(); 1 when the keys are absent or arrays */
    gguf_str arch;
    uint32_t heads, kv_heads;
    char key[160];
    s->n_gqa = 1;
    if (gguf_get_str(f, "general.architecture", &arch) && arch.len < 100) {
        snprintf(key, sizeof key, "%.*s.attention.head_count", (int)arch.len, arch.ptr);
        bool ok = gguf_get_u32(f, key, &heads);
        snprintf(key, sizeof key, "%.*s.attention.head_count_kv", (int)arch.len, arch.ptr);
        if (ok && gguf_get_u32(f, key, &kv_heads) && kv_heads && heads >= kv_heads)
            s->n_gqa = heads / kv_heads;
    }
}

/* The type a matrix should get before its row length is looked at, or QZ_KEEP. */
static uint32_t qz_choose(const qz_options *o, qz_mix_state *s, const gguf_tensor *src)
{
    qz_role role = qz_role_of(src->name, s->has_output);
    int i = s->i[role]++; /* counted whichever rule decides: i stays the layer */
    if (src->type < 64 && ((o->keep >> src->type) & 1))
        return QZ_KEEP;
    for (int r = 0; r < o->n_rules; r++)
        if (qz_rule_matches(&o->rules[r], src->name))
            return o->rules[r].type;
    if (o->preset)
        return qz_preset_type(o->preset, role, i, s->n[role], s->n_gqa);
    return o->to ? o->to->type : QZ_KEEP;
}

/* llama.cpp's type for a K-quant matrix whose rows are not a multiple of 256; the type itself
 * when it has none. */
static uint32_t qz_fallback(uint32_t type)
{
    switch (type) {
    case KT_Q2_K:
    case KT_Q3_K: return KT_IQ4_NL;
    case KT_Q4_K: return KT_Q5_0;
    case KT_Q5_K: return KT_Q5_1;
    case KT_Q6_K: return KT_Q8_0;
    default: return type;
    }
}

/* ===== the plan: what happens to each tensor ===== */

/* A tensor name for a one-line note: control bytes shown as '?', long names cut. */
static const char *qz_name(char *buf, size_t cap, gguf_str s)
{
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    for (size_t i = 0; i < n; i++)
        buf[i] = (unsigned char)s.ptr[i] < 0x20 || s.ptr[i] == 0x7f ? '?' : s.ptr[i];
    buf[n] = '\0';
    return buf;
}

#define QZ_N_KTYPES (KT_Q6_K - KT_Q2_K + 1)

typedef struct {
    uint64_t n_convert;             /* tensors whose rows are converted */
    uint64_t n_same;                /* matrices that already had their chosen type */
    uint64_t fallback[QZ_N_KTYPES]; /* matrices given the fallback of KT_Q2_K + k */
    uint64_t data_bytes;            /* the output data section */
} qz_stats;

/* The type a matrix that should become want (not QZ_KEEP, not its current type) gets: want when
 * its row length is a multiple of want's block, else want's fallback when that fits; QZ_KEEP with
 * a note when neither does, or when orochi cannot read the matrix's current type. */
static uint32_t qz_settle(const gguf_tensor *src, uint32_t want, qz_stats *st)
{
    char name[96];
    const kt_traits *to = kt_traits_of(want);
    uint32_t fb = qz_fallback(want);
    const kt_traits *to_fb = kt_traits_of(fb);
    uint32_t type = want;
    if (src->ne[0] % (uint64_t)to->block) {
        if (fb == want || src->ne[0] % (uint64_t)to_fb->block) {
            fprintf(
                stderr,
                "orochi quantize: note: '%s' kept as %s: row length %llu is not a multiple of %d",
                qz_name(name, sizeof name, src->name), qz_type_str(src->type),
                (unsigned long long)src->ne[0], to->block);
            if (fb != want)
                fprintf(stderr, " (%s) nor of %d (its fallback %s)", to->name, to_fb->block,
                        to_fb->name);
            fputc('\n', stderr);
            return QZ_KEEP;
        }
        st->fallback[want - KT_Q2_K]++;
        type = fb;
    }
    const kt_traits *from = kt_traits_of(src->type);
    if (type != src->type && (!from || !from->supported)) {
        fprintf(stderr, "orochi quantize: note: '%s' kept as %s: orochi cannot convert that type\n",
                qz_name(name, sizeof name, src->name), qz_type_str(src->type));
        return QZ_KEEP;
    }
    return type;
}

/* Decide each tensor's output type, size and offset; notes on stderr for matrices that stay as
 * they are although they were to change, and one per fallback type. */
static void qz_plan(const gguf_file *f, const qz_options *o, qz_tensor *ts, qz_stats *st)
{
    qz_mix_state mix;
    qz_mix_init(f, &mix);
    memset(st, 0, sizeof *st);
    uint64_t off = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *src = &f->tensors[i];
        qz_tensor *t = &ts[i];
        t->src = src;
        t->type = src->type;
        t->convert = false;
        t->cols = (int64_t)src->ne[0];
        t->rows = (int64_t)(src->ne[1] * src->ne[2] * src->ne[3]);
        t->nbytes = src->nbytes;
        uint32_t to = qz_is_matrix(src) ? qz_choose(o, &mix, src) : QZ_KEEP;
        if (to != QZ_KEEP && to != src->type)
            to = qz_settle(src, to, st);
        if (to == src->type) {
            st->n_same++; /* already of its chosen type: bytes copied */
        } else if (to != QZ_KEEP) {
            t->type = to;
            t->convert = true;
            t->nbytes = (uint64_t)kt_row_bytes(to, src->ne[0]) * (uint64_t)t->rows;
            st->n_convert++;
        }
        t->offset = off;
        off += (t->nbytes + f->alignment - 1) / f->alignment * f->alignment;
    }
    st->data_bytes = off;
    for (int k = 0; k < QZ_N_KTYPES; k++)
        if (st->fallback[k]) {
            uint32_t type = KT_Q2_K + (uint32_t)k;
            fprintf(stderr,
                    "orochi quantize: note: %llu tensor%s written as %s instead of %s: rows not a "
                    "multiple of %d (llama.cpp's fallback)\n",
                    (unsigned long long)st->fallback[k], st->fallback[k] == 1 ? "" : "s",
                    qz_type_str(qz_fallback(type)), qz_type_str(type), KT_KBLOCK);
        }
}

/* general.file_type for the output: the preset's or TYPE's number; for --mix rules alone that
 * of the type holding most matrix parameters (the input's value when orochi has no number for
 * it). */
static uint32_t qz_file_type(const qz_options *o, const qz_tensor *ts, uint64_t n)
{
    if (o->preset)
        return o->preset->file_type;
    if (o->to)
        return o->to->file_type;
    uint64_t params[sizeof QZ_TYPES / sizeof QZ_TYPES[0]] = {0};
    uint64_t other = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (!qz_is_matrix(ts[i].src))
            continue;
        uint64_t p = (uint64_t)ts[i].cols * (uint64_t)ts[i].rows;
        size_t k = 0;
        while (k < sizeof QZ_TYPES / sizeof QZ_TYPES[0] && QZ_TYPES[k].type != ts[i].type)
            k++;
        if (k < sizeof QZ_TYPES / sizeof QZ_TYPES[0])
            params[k] += p;
        else
            other += p;
    }
    size_t best = 0;
    for (size_t k = 1; k < sizeof QZ_TYPES / sizeof QZ_TYPES[0]; k++)
        if (params[k] > params[best])
            best = k;
    return params[best] && params[best] >= other ? QZ_TYPES[best].file_type : QZ_FILE_TYPE_INPUT;
}

/* The header: magic, version 3, counts, metadata, tensor infos, padding to the alignment. */
static bool qz_write_header(const gguf_file *f, uint32_t file_type, const qz_tensor *ts, cli_buf *b)
{
    cli_buf_put(b, "GGUF", 4);
    cli_buf_u32(b, 3);
    cli_buf_u64(b, f->n_tensors);
    size_t n_kv_at = b->n;
    cli_buf_u64(b, 0); /* patched below: one more when general.file_type is added */
    uint64_t n_kv = qz_write_metadata(f, file_type, b);
    if (!n_kv && f->n_kv)
        return false;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *src = ts[i].src;
        cli_buf_str(b, src->name.ptr, src->name.len);
        cli_buf_u32(b, src->n_dims);
        for (uint32_t d = 0; d < src->n_dims; d++)
            cli_buf_u64(b, src->ne[d]);
        cli_buf_u32(b, ts[i].type);
        cli_buf_u64(b, ts[i].offset);
    }
    static const uint8_t zeros[256];
    size_t pad = (size_t)((f->alignment - b->n % f->alignment) % f->alignment);
    while (pad) {
        size_t k = pad < sizeof zeros ? pad : sizeof zeros;
        cli_buf_put(b, zeros, k);
        pad -= k;
    }
    if (b->oom) {
        fprintf(stderr, "orochi quantize: out of memory building the header\n");
        return false;
    }
    for (int k = 0; k < 8; k++)
        b->p[n_kv_at + (size_t)k] = (uint8_t)(n_kv >> (8 * k));
    return true;
}

/* ===== progress on stderr ===== */

typedef struct {
    bool tty;
    uint64_t total, done; /* output tensor bytes */
    uint64_t n_tensors;
    int decile;   /* last 10% step reported (non-tty) */
    double drawn; /* when the bar was last drawn (tty) */
} qz_progress;

static void qz_progress_show(qz_progress *p, uint64_t tensor, bool final)
{
    double frac = p->total ? (double)p->done / (double)p->total : 1.0;
    if (p->tty) {
        double now = cli_now();
        if (!final && now - p->drawn < QZ_REDRAW_SECONDS)
            return;
        p->drawn = now;
        char bar[QZ_BAR_WIDTH + 1];
        int fill = (int)(frac * QZ_BAR_WIDTH);
        for (int i = 0; i < QZ_BAR_WIDTH; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[QZ_BAR_WIDTH] = '\0';
        fprintf(stderr, "\rorochi quantize: [%s] %3d%%  tensor %llu/%llu  %.1f MiB%s", bar,
                (int)(frac * 100.0), (unsigned long long)tensor, (unsigned long long)p->n_tensors,
                (double)p->done / QZ_MIB, final ? "\n" : "");
        return;
    }
    int decile = (int)(frac * 10.0);
    if (decile <= p->decile)
        return;
    p->decile = decile;
    fprintf(stderr, "orochi quantize: %3d%%  tensor %llu/%llu, %.1f MiB written\n", decile * 10,
            (unsigned long long)tensor, (unsigned long long)p->n_tensors, (double)p->done / QZ_MIB);
}

/* ===== conversion ===== */

typedef struct {
    uint32_t from, to;
    int64_t cols;
    const uint8_t *src; /* first row of the slab */
    uint8_t *dst;
    size_t src_row, dst_row;
    float *scratch; /* one row of floats per thread */
} qz_job;

static void qz_convert_rows(void *arg, int64_t begin, int64_t end, int thread)
{
    const qz_job *j = arg;
    float *row = j->scratch + (size_t)thread * (size_t)j->cols;
    for (int64_t r = begin; r < end; r++) {
        kt_dequantize_row(j->from, j->src + (size_t)r * j->src_row, row, j->cols);
        kt_quantize_row(j->to, row, j->dst + (size_t)r * j->dst_row, j->cols);
    }
}

/* Everything one write pass needs. */
typedef struct {
    FILE *fp;
    kpool *pool;
    uint8_t *slab;  /* QZ_SLAB_BYTES or one output row, whichever is larger */
    float *scratch; /* threads x the longest converted row */
    qz_progress *progress;
} qz_writer;

static bool qz_write_bytes(qz_writer *w, const void *p, size_t n)
{
    return fwrite(p, 1, n, w->fp) == n;
}

static bool qz_write_tensor(qz_writer *w, const qz_tensor *t, uint64_t index)
{
    if (!t->convert) {
        const uint8_t *src = t->src->data;
        for (uint64_t at = 0; at < t->nbytes; at += QZ_SLAB_BYTES) {
            size_t n = (size_t)(t->nbytes - at < QZ_SLAB_BYTES ? t->nbytes - at : QZ_SLAB_BYTES);
            if (!qz_write_bytes(w, src + at, n))
                return false;
            w->progress->done += n;
            qz_progress_show(w->progress, index + 1, false);
        }
        return true;
    }
    qz_job job = {
        .from = t->src->type,
        .to = t->type,
        .cols = t->cols,
        .src_row = kt_row_bytes(t->src->type, (uint64_t)t->cols),
        .dst_row = kt_row_bytes(t->type, (uint64_t)t->cols),
        .dst = w->slab,
        .scratch = w->scratch,
    };
    int64_t slab_rows = (int64_t)(QZ_SLAB_BYTES / job.dst_row);
    if (slab_rows < 1)
        slab_rows = 1;
    for (int64_t r = 0; r < t->rows; r += slab_rows) {
        int64_t n = t->rows - r < slab_rows ? t->rows - r : slab_rows;
        job.src = (const uint8_t *)t->src->data + (size_t)r * job.src_row;
        kpool_run(w->pool, n, QZ_ROW_GRAIN, qz_convert_rows, &job);
        if (!qz_write_bytes(w, w->slab, (size_t)n * job.dst_row))
            return false;
        w->progress->done += (uint64_t)n * job.dst_row;
        qz_progress_show(w->progress, index + 1, false);
    }
    return true;
}

/* Header, then each tensor's data padded to the alignment. */
static bool qz_write_file(qz_writer *w, const gguf_file *f, const qz_tensor *ts, const cli_buf *hdr)
{
    static const uint8_t zeros[256];
    if (!qz_write_bytes(w, hdr->p, hdr->n))
        return false;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        if (!qz_write_tensor(w, &ts[i], i))
            return false;
        uint64_t pad = (f->alignment - ts[i].nbytes % f->alignment) % f->alignment;
        w->progress->done += pad; /* progress.total counts the padding too */
        while (pad) {
            size_t k = pad < sizeof zeros ? (size_t)pad : sizeof zeros;
            if (!qz_write_bytes(w, zeros, k))
                return false;
            pad -= k;
        }
    }
    qz_progress_show(w->progress, f->n_tensors, true);
    return true;
}

/* ===== the command ===== */

static void qz_usage(FILE *out)
{
    fprintf(
        out,
        "usage: orochi quantize IN OUT TYPE|PRESET [--mix RULES] [--keep TYPE]... [--threads N]\n"
        "       orochi quantize IN OUT --mix PRESET|RULES [--keep TYPE]... [--threads N]\n"
        "\n"
        "Write the GGUF model IN to OUT with its weight matrices (tensors of 2+ dimensions named\n"
        "'*.weight', the token embedding and output.weight included) converted:\n"
        "  TYPE          every matrix to one type: F32, F16, BF16, Q8_0, Q4_0, Q4_1,\n"
        "                Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K\n"
        "  PRESET        a llama.cpp K-quant mix: Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M,\n"
        "                Q5_K_S, Q5_K_M (the Q2_K and Q6_K mixes, whose names are types:\n"
        "                --mix Q2_K, --mix Q6_K)\n"
        "  --mix RULES   PATTERN=TYPE,... (TYPE may be 'keep'): the first rule whose PATTERN\n"
        "                matches a matrix decides its type, before TYPE or PRESET. PATTERN\n"
        "                matches names containing it as whole dot-separated parts ('output'\n"
        "                is output.weight, not attn_output.weight; 'blk.1' is not blk.10), '*'\n"
        "                every matrix. Without TYPE or PRESET, matrices no rule matches stay\n"
        "                as they are.\n"
        "Type and preset names are case-insensitive, patterns are not. 1-D tensors (norms,\n"
        "biases) are copied unchanged; so is a matrix that already has its type, or whose type\n"
        "was named with --keep.\n"
        "A K-type (Q2_K..Q6_K) needs rows that are a multiple of 256: other matrices get\n"
        "llama.cpp's fallback (Q2_K, Q3_K -> IQ4_NL; Q4_K -> Q5_0; Q5_K -> Q5_1; Q6_K -> Q8_0),\n"
        "one note per fallback type. A matrix whose row length is not a multiple of 32 stays as\n"
        "it is, with a note, where the type (or its fallback) has 32-element blocks.\n"
        "Metadata is copied verbatim except general.file_type (llama.cpp's number for TYPE or\n"
        "PRESET); tensor data keeps the input's general.alignment. OUT is written as OUT.tmp and\n"
        "renamed when complete. The presets' rules and examples: docs/quantize.md.\n"
        "\n"
        "options:\n"
        "  --mix X       a preset (Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S,\n"
        "                Q5_K_M, Q6_K) or RULES as above\n"
        "  --keep TYPE   leave tensors whose current type is TYPE unchanged (repeatable)\n"
        "  --threads N   threads converting rows (default %d)\n"
        "  -h, --help    show this help\n"
        "\n"
        "Progress goes to stderr (a bar on a terminal, a line per 10%% otherwise), then one\n"
        "summary line with the tensors of each type. exit status: 0 ok, 1 write failed midway\n"
        "(disk full, I/O error), 2 bad usage, unknown type, preset or rule, unreadable or\n"
        "malformed IN, OUT not creatable\n",
        QZ_DEFAULT_THREADS);
}

static const qz_type_name *qz_type_lookup(const char *s)
{
    for (size_t i = 0; i < sizeof QZ_TYPES / sizeof QZ_TYPES[0]; i++)
        if (!strcasecmp(s, QZ_TYPES[i].name))
            return &QZ_TYPES[i];
    return NULL;
}

static const qz_preset *qz_preset_lookup(const char *s)
{
    for (size_t i = 0; i < sizeof QZ_PRESETS / sizeof QZ_PRESETS[0]; i++)
        if (!strcasecmp(s, QZ_PRESETS[i].name))
            return &QZ_PRESETS[i];
    return NULL;
}

/* Parse --mix RULES ("PATTERN=TYPE,...") into o->rules; false after one line on stderr. The
 * patterns point into text. */
static bool qz_parse_rules(const char *text, qz_options *o)
{
    const char *p = text;
    for (;;) {
        const char *end = strchr(p, ',');
        if (!end)
            end = p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            b--;
        const char *eq = memchr(a, '=', (size_t)(b - a));
        const char *pe = eq, *ts = eq ? eq + 1 : NULL;
        while (pe && pe > a && (pe[-1] == ' ' || pe[-1] == '\t'))
            pe--;
        while (ts && ts < b && (*ts == ' ' || *ts == '\t'))
            ts++;
        if (!eq || pe == a || ts == b || (memchr(a, '*', (size_t)(pe - a)) && pe - a != 1)) {
            fprintf(stderr,
                    "orochi quantize: bad --mix rule '%.*s' in '%s' (want PATTERN=TYPE,... with "
                    "PATTERN a name part or '*', TYPE one of " QZ_TYPE_LIST ", keep)\n",
                    (int)(b - a), a, text);
            return false;
        }
        char name[16];
        size_t n = (size_t)(b - ts);
        const qz_type_name *t = NULL;
        if (n < sizeof name) {
            memcpy(name, ts, n);
            name[n] = '\0';
            t = qz_type_lookup(name);
        }
        if (!t && !(n == 4 && !strncasecmp(ts, "keep", 4))) {
            fprintf(
                stderr,
                "orochi quantize: unknown type '%.*s' in --mix rule '%.*s' (one of " QZ_TYPE_LIST
                ", keep)\n",
                (int)n, ts, (int)(b - a), a);
            return false;
        }
        if (o->n_rules == QZ_MAX_RULES) {
            fprintf(stderr, "orochi quantize: more than %d --mix rules\n", QZ_MAX_RULES);
            return false;
        }
        o->rules[o->n_rules++] = (qz_rule){a, (size_t)(pe - a), t ? t->type : QZ_KEEP};
        if (!*end)
            return true;
        p = end + 1;
    }
}

/* Parse argv into o; returns -1 to go on, else the exit status. */
static int qz_parse_args(int argc, char **argv, qz_options *o)
{
    const char *pos[3] = {NULL, NULL, NULL}, *mix = NULL;
    int n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            qz_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--keep")) {
            if (!(v = cli_value("quantize", argc, argv, &i)))
                return 2;
            const qz_type_name *k = qz_type_lookup(v);
            if (!k) {
                fprintf(stderr,
                        "orochi quantize: unknown --keep type '%s' (one of " QZ_TYPE_LIST ")\n", v);
                return 2;
            }
            o->keep |= 1ull << k->type;
        } else if (!strcmp(a, "--mix")) {
            if (!(v = cli_value("quantize", argc, argv, &i)))
                return 2;
            if (mix) {
                fprintf(stderr, "orochi quantize: --mix given twice ('%s', '%s')\n", mix, v);
                return 2;
            }
            mix = v;
        } else if (!strcmp(a, "--threads")) {
            long n;
            if (!(v = cli_value("quantize", argc, argv, &i)) ||
                !cli_int("quantize", a, v, 1, QZ_MAX_THREADS, &n))
                return 2;
            o->threads = (int)n;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "orochi quantize: unknown option '%s'\n", a);
            return 2;
        } else if (n_pos == 3) {
            fprintf(stderr, "orochi quantize: unexpected argument '%s' (IN OUT TYPE given)\n", a);
            return 2;
        } else {
            pos[n_pos++] = a;
        }
    }
    if (n_pos < 2 || (n_pos == 2 && !mix)) {
        fprintf(stderr, "orochi quantize: needs IN OUT TYPE or IN OUT --mix X (see orochi "
                        "quantize --help)\n");
        return 2;
    }
    o->in = pos[0];
    o->out = pos[1];
    if (pos[2] && !(o->to = qz_type_lookup(pos[2])) && !(o->preset = qz_preset_lookup(pos[2]))) {
        fprintf(stderr,
                "orochi quantize: unknown type '%s' (one of " QZ_TYPE_LIST
                "; or a preset: " QZ_TYPE_PRESET_LIST ")\n",
                pos[2]);
        return 2;
    }
    if (mix && strchr(mix, '=')) {
        if (!qz_parse_rules(mix, o))
            return 2;
    } else if (mix) {
        const qz_preset *p = qz_preset_lookup(mix);
        if (!p) {
            fprintf(stderr,
                    "orochi quantize: unknown --mix preset '%s' (one of " QZ_PRESET_LIST
                    "; or rules PATTERN=TYPE,...)\n",
                    mix);
            return 2;
        }
        if (pos[2]) {
            fprintf(stderr,
                    "orochi quantize: TYPE '%s' and --mix preset '%s' both choose every "
                    "matrix's type; give one\n",
                    pos[2], mix);
            return 2;
        }
        o->preset = p;
    }
    return -1;
}

/* Open OUT.tmp for writing (path in tmp). Returns the stream or NULL with a message. */
static FILE *qz_create(const char *out, char **tmp)
{
    struct stat st;
    if (!stat(out, &st) && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "orochi quantize: cannot write '%s': it is a directory\n", out);
        return NULL;
    }
    size_t n = strlen(out) + sizeof ".tmp";
    *tmp = malloc(n);
    if (!*tmp) {
        fprintf(stderr, "orochi quantize: out of memory\n");
        return NULL;
    }
    snprintf(*tmp, n, "%s.tmp", out);
    FILE *fp = fopen(*tmp, "wb");
    if (!fp) {
        fprintf(stderr, "orochi quantize: cannot create '%s': %s\n", *tmp, strerror(errno));
        free(*tmp);
        *tmp = NULL; /* not ours: nothing to remove */
    }
    return fp;
}

/* The summary's "Q5_0 150, Q8_0 31, F32 61": tensors of each output type, by ggml type id. */
static void qz_print_kinds(const qz_tensor *ts, uint64_t n)
{
    uint64_t count[64] = {0}, other = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (ts[i].type < 64)
            count[ts[i].type]++;
        else
            other++;
    }
    const char *sep = "";
    for (uint32_t t = 0; t < 64; t++)
        if (count[t]) {
            fprintf(stderr, "%s%s %llu", sep, qz_type_str(t), (unsigned long long)count[t]);
            sep = ", ";
        }
    if (other)
        fprintf(stderr, "%sother %llu", sep, (unsigned long long)other);
}

int cmd_quantize(int argc, char **argv)
{
    qz_options o = {.threads = QZ_DEFAULT_THREADS};
    int rc = qz_parse_args(argc, argv, &o);
    if (rc >= 0)
        return rc;

    double t0 = cli_now();
    char err[512];
    gguf_file *f = gguf_open(o.in, err, sizeof err);
    if (!f) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    cli_buf hdr = {0};
    qz_writer w = {0};
    qz_progress progress = {.tty = isatty(STDERR_FILENO) == 1, .decile = 0};
    char *tmp = NULL;
    qz_tensor *ts = NULL;
    /* create OUT.tmp before anything else is printed: a bad OUT is one line, then exit */
    w.fp = qz_create(o.out, &tmp);
    if (!w.fp) {
        rc = 2;
        goto done;
    }
    setvbuf(w.fp, NULL, _IOFBF, 1 << 20);
    rc = 1;
    ts = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *ts);
    if (!ts) {
        fprintf(stderr, "orochi quantize: out of memory for %llu tensors\n",
                (unsigned long long)f->n_tensors);
        goto done;
    }
    qz_stats st;
    qz_plan(f, &o, ts, &st);
    progress.total = st.data_bytes;
    progress.n_tensors = f->n_tensors;
    if (!qz_write_header(f, qz_file_type(&o, ts, f->n_tensors), ts, &hdr))
        goto done;

    int64_t max_cols = 0;
    size_t max_row = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (ts[i].convert) {
            size_t row = kt_row_bytes(ts[i].type, (uint64_t)ts[i].cols);
            max_cols = ts[i].cols > max_cols ? ts[i].cols : max_cols;
            max_row = row > max_row ? row : max_row;
        }
    w.pool = kpool_new(o.threads);
    w.slab = malloc(max_row > QZ_SLAB_BYTES ? max_row : QZ_SLAB_BYTES);
    w.scratch = malloc((size_t)o.threads * (size_t)(max_cols ? max_cols : 1) * sizeof(float));
    w.progress = &progress;
    if (!w.pool || !w.slab || !w.scratch) {
        fprintf(stderr, "orochi quantize: out of memory for conversion buffers\n");
        goto done;
    }

    bool ok = qz_write_file(&w, f, ts, &hdr);
    int write_errno = errno;
    if (fclose(w.fp) && ok) {
        ok = false;
        write_errno = errno;
    }
    w.fp = NULL;
    if (!ok) {
        fprintf(stderr, "%sorochi quantize: writing '%s' failed: %s\n", progress.tty ? "\n" : "",
                tmp, strerror(write_errno));
        goto done;
    }
    if (rename(tmp, o.out)) {
        fprintf(stderr, "orochi quantize: cannot rename '%s' to '%s': %s\n", tmp, o.out,
                strerror(errno));
        rc = 2;
        goto done;
    }
    free(tmp);
    tmp = NULL;
    const char *base = o.preset ? o.preset->name : o.to ? o.to->name : "";
    fprintf(stderr,
            "orochi quantize: wrote %s (%s%s%s): %llu tensors converted, %llu copied (%llu "
            "already of their chosen type); types ",
            o.out, base, *base && o.n_rules ? " + " : "", o.n_rules ? "--mix rules" : "",
            (unsigned long long)st.n_convert, (unsigned long long)(f->n_tensors - st.n_convert),
            (unsigned long long)st.n_same);
    qz_print_kinds(ts, f->n_tensors);
    fprintf(stderr, "; %.1f MiB -> %.1f MiB in %.2f s\n", (double)f->size / QZ_MIB,
            (double)(hdr.n + progress.total) / QZ_MIB, cli_now() - t0);
    rc = 0;
done:
    if (w.fp)
        fclose(w.fp);
    if (tmp)
        unlink(tmp);
    free(tmp);
    kpool_destroy(&w.pool);
    free(w.slab);
    free(w.scratch);
    free(hdr.p);
    free(ts);
    gguf_close(&f);
    return rc;
}
