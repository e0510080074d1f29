/*
 * cli/cmd_quantize.c — `orochi quantize IN OUT TYPE`: rewrite a GGUF model with its weight
 * matrices in another tensor type (F32, F16, BF16, Q8_0, Q4_0, Q4_1).
 *
 * Why it exists: the engine and the speculators want the same model in several types (a Q8_0
 * target, a Q4_0 draft, an F16 file for the reference tests) and the only other tool that makes
 * them is llama.cpp's. The block formats are not re-implemented here: every row goes through
 * kt_dequantize_row / kt_quantize_row from kernels/cpu, the same code the engine and `orochi
 * mkmodel` use, so what this writes is exactly what the kernels expect.
 *
 * What changes: every 2-D (or higher) tensor whose name ends in ".weight" is converted to TYPE —
 * the token embedding and output.weight included (llama.cpp picks other types for those; one
 * rule for all is simpler to reason about and to test). Everything else (1-D norms and biases)
 * is copied byte for byte. A tensor also stays as it is, with a note on stderr, when
 *   - its current type was named with --keep;
 *   - it already has type TYPE (copied verbatim, so Q4_1 -> Q4_1 reproduces the bytes exactly:
 *     requantizing dequantized Q4_1 blocks would not, because a block's min/max need not be
 *     hit by any of its nibbles);
 *   - TYPE is a block type and its row length is not a multiple of 32 (llama.cpp falls back to
 *     another type there; keeping the original is the lossless choice);
 *   - its current type is one orochi cannot dequantize (K-quants etc.).
 *
 * The output is GGUF v3: the header, every metadata key/value copied as raw bytes from the
 * input (so nested arrays, odd types and key order survive untouched) except general.file_type,
 * which is set to the llama.cpp file-type number of TYPE (appended if the input has none); then
 * the tensor-info table with the new types and offsets, each tensor's data aligned to the input's
 * general.alignment (default 32). It is written to OUT.tmp and renamed to OUT only when complete,
 * so a failure never leaves a partial OUT; OUT.tmp is removed on failure.
 *
 * Rows of a converted tensor are processed in slabs of about QZ_SLAB_BYTES output bytes, each
 * slab split over a kpool (--threads, default 2): rows are independent, so the bytes do not
 * depend on the thread count. Progress goes to stderr: a bar redrawn with \r on a terminal, a
 * line every 10% otherwise, then one summary line.
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
#define QZ_TYPE_LIST "F32, F16, BF16, Q8_0, Q4_0, Q4_1"

/* The types TYPE may name, with llama.cpp's general.file_type number (enum llama_ftype). */
typedef struct {
    const char *name;
    uint32_t type;
    uint32_t file_type;
} qz_type_name;

static const qz_type_name QZ_TYPES[] = {
    {"F32", KT_F32, 0},   {"F16", KT_F16, 1},   {"BF16", KT_BF16, 32},
    {"Q8_0", KT_Q8_0, 7}, {"Q4_0", KT_Q4_0, 2}, {"Q4_1", KT_Q4_1, 3},
};

typedef struct {
    const char *in, *out;
    const qz_type_name *to;
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
 * replaced in place (as uint32) or appended. Returns the number of records written, or 0 with
 * a message when a record's computed size does not match the offsets the reader recorded
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
        if (gguf_str_eq(kv->key, key)) {
            cli_buf_str(b, key, sizeof key - 1);
            cli_buf_u32(b, GGUF_UINT32);
            cli_buf_u32(b, file_type);
            replaced = true;
        } else {
            cli_buf_put(b, f->base + kv->offset, (size_t)len);
        }
    }
    if (!replaced) {
        cli_buf_str(b, key, sizeof key - 1);
        cli_buf_u32(b, GGUF_UINT32);
        cli_buf_u32(b, file_type);
    }
    return f->n_kv + !replaced;
}

/* ===== the plan: what happens to each tensor ===== */

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

/* A tensor name for a one-line note: control bytes shown as '?', long names cut. */
static const char *qz_name(char *buf, size_t cap, gguf_str s)
{
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    for (size_t i = 0; i < n; i++)
        buf[i] = (unsigned char)s.ptr[i] < 0x20 || s.ptr[i] == 0x7f ? '?' : s.ptr[i];
    buf[n] = '\0';
    return buf;
}

/* Decide each tensor's output type, size and offset; notes on stderr for tensors that stay as
 * they are although they are weight matrices. Returns the data section size. */
static uint64_t qz_plan(const gguf_file *f, const qz_options *o, qz_tensor *ts, uint64_t *n_convert,
                        uint64_t *n_same)
{
    uint64_t off = 0;
    char name[96];
    *n_convert = *n_same = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *src = &f->tensors[i];
        qz_tensor *t = &ts[i];
        t->src = src;
        t->type = src->type;
        t->convert = false;
        t->cols = (int64_t)src->ne[0];
        t->rows = (int64_t)(src->ne[1] * src->ne[2] * src->ne[3]);
        t->nbytes = src->nbytes;
        bool matrix = src->n_dims >= 2 && qz_ends_with(src->name, ".weight");
        const kt_traits *from = kt_traits_of(src->type);
        const kt_traits *to = kt_traits_of(o->to->type);
        if (matrix && src->type == o->to->type) {
            (*n_same)++;
        } else if (matrix && src->type < 64 && ((o->keep >> src->type) & 1)) {
            /* --keep: stays, silently (it was asked for) */
        } else if (matrix && (!from || !from->supported)) {
            fprintf(stderr,
                    "orochi quantize: note: '%s' kept as %s: orochi cannot convert that type\n",
                    qz_name(name, sizeof name, src->name), qz_type_str(src->type));
        } else if (matrix && src->ne[0] % (uint64_t)to->block) {
            fprintf(stderr,
                    "orochi quantize: note: '%s' kept as %s: row length %llu is not a "
                    "multiple of %d\n",
                    qz_name(name, sizeof name, src->name), qz_type_str(src->type),
                    (unsigned long long)src->ne[0], to->block);
        } else if (matrix) {
            t->type = o->to->type;
            t->convert = true;
            t->nbytes = (uint64_t)kt_row_bytes(t->type, src->ne[0]) * (uint64_t)t->rows;
            (*n_convert)++;
        }
        t->offset = off;
        off += (t->nbytes + f->alignment - 1) / f->alignment * f->alignment;
    }
    return off;
}

/* The header: magic, version 3, counts, metadata, tensor infos, padding to the alignment. */
static bool qz_write_header(const gguf_file *f, const qz_options *o, const qz_tensor *ts,
                            cli_buf *b)
{
    cli_buf_put(b, "GGUF", 4);
    cli_buf_u32(b, 3);
    cli_buf_u64(b, f->n_tensors);
    size_t n_kv_at = b->n;
    cli_buf_u64(b, 0); /* patched below: one more when general.file_type is added */
    uint64_t n_kv = qz_write_metadata(f, o->to->file_type, b);
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
        "usage: orochi quantize IN OUT TYPE [--keep TYPE]... [--threads N]\n"
        "\n"
        "Write the GGUF model IN to OUT with its weight matrices (2-D '*.weight' tensors, the\n"
        "token embedding and output.weight included) converted to TYPE, one of\n"
        "  " QZ_TYPE_LIST " (case-insensitive).\n"
        "1-D tensors (norms, biases) are copied unchanged. A matrix also stays as it is when\n"
        "it already has type TYPE (bytes copied exactly), when its type was named with --keep,\n"
        "or, with a note, when TYPE is a 32-element block type and its row length is not a\n"
        "multiple of 32. Metadata is copied verbatim except general.file_type, which is set\n"
        "(or added) for TYPE; tensor data keeps the input's general.alignment.\n"
        "OUT is written as OUT.tmp and renamed when complete.\n"
        "\n"
        "options:\n"
        "  --keep TYPE   leave tensors whose current type is TYPE unchanged (repeatable)\n"
        "  --threads N   threads converting rows (default %d)\n"
        "  -h, --help    show this help\n"
        "\n"
        "Progress goes to stderr (a bar on a terminal, a line per 10%% otherwise), then one\n"
        "summary line. exit status: 0 ok, 1 write failed midway (disk full, I/O error),\n"
        "2 bad usage, unknown type, unreadable or malformed IN, OUT not creatable\n",
        QZ_DEFAULT_THREADS);
}

static const qz_type_name *qz_type_lookup(const char *s)
{
    for (size_t i = 0; i < sizeof QZ_TYPES / sizeof QZ_TYPES[0]; i++)
        if (!strcasecmp(s, QZ_TYPES[i].name))
            return &QZ_TYPES[i];
    return NULL;
}

/* Parse argv into o; returns -1 to go on, else the exit status. */
static int qz_parse_args(int argc, char **argv, qz_options *o)
{
    const char *pos[3] = {NULL, NULL, NULL};
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
    if (n_pos < 3) {
        fprintf(stderr, "orochi quantize: needs IN OUT TYPE (see orochi quantize --help)\n");
        return 2;
    }
    o->in = pos[0];
    o->out = pos[1];
    o->to = qz_type_lookup(pos[2]);
    if (!o->to) {
        fprintf(stderr, "orochi quantize: unknown type '%s' (one of " QZ_TYPE_LIST ")\n", pos[2]);
        return 2;
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
    uint64_t n_convert, n_same;
    progress.total = qz_plan(f, &o, ts, &n_convert, &n_same);
    progress.n_tensors = f->n_tensors;
    if (!qz_write_header(f, &o, ts, &hdr))
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
    fprintf(stderr,
            "orochi quantize: wrote %s: %llu tensors converted to %s, %llu kept (%llu already "
            "%s); %.1f MiB -> %.1f MiB in %.2f s\n",
            o.out, (unsigned long long)n_convert, o.to->name,
            (unsigned long long)(f->n_tensors - n_convert), (unsigned long long)n_same, o.to->name,
            (double)f->size / QZ_MIB, (double)(hdr.n + progress.total) / QZ_MIB, cli_now() - t0);
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
