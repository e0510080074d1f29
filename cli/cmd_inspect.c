/*
 * cli/cmd_inspect — `orochi inspect FILE`: print a GGUF file's metadata and tensor table.
 *
 * The file is opened with the validating reader (model/gguf), so a malformed file is reported as
 * one line on stderr (exit status 2) and nothing else is printed. For a valid file the output is:
 *   a summary line (version, alignment, data section start, file size);
 *   one line per metadata key: key, value type, value — strings quoted and escaped, long ones
 *   cut; arrays as "[TYPE x N] e0, e1, ..." with the first few elements (nested arrays the same
 *   way, one level shorter each time);
 *   the tensor table: name, ggml type name (from kt_traits_of), shape (ne[0] first), offset
 *   in the data section, bytes;
 *   totals: tensors, parameters, tensor bytes, and tensors of types orochi cannot compute with;
 *   the type mix: a line per tensor type (tensors, parameters, bytes, bits per weight), most
 *   parameters first, and the same for all tensors together — what `orochi quantize` made of a
 *   model at a glance.
 */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "kernels/cpu/kernels.h"
#include "model/gguf.h"
#include "model/llama.h"

#define INSPECT_STR_SHOWN 48    /* bytes of a string value printed before "..." */
#define INSPECT_ARRAY_SHOWN 4   /* elements of a top-level array printed */
#define INSPECT_MAX_NESTING 3   /* nested arrays deeper than this print as "[...]" */
#define INSPECT_MAX_KINDS 64    /* distinct tensor types listed in the type mix */

static void inspect_usage(FILE *out)
{
    fprintf(out,
            "usage: orochi inspect FILE\n"
            "\n"
            "Validate a GGUF file and print its metadata (key, type, value; arrays summarised by\n"
            "their first elements) and its tensor table (name, type, shape, offset in the data\n"
            "section, bytes), then totals and the type mix (per type: tensors, parameters, bytes,\n"
            "bits per weight), and last whether orochi can run it: the model it would compute\n"
            "(family, shape, head size, RoPE and its scaling, biases, q/k norms) or the one-line\n"
            "reason it refuses the file (docs/models.md).\n"
            "\n"
            "options:\n"
            "  -h, --help   show this help\n"
            "\n"
            "exit status: 0 ok, 2 bad usage or malformed file (one line on stderr)\n");
}

/* A gguf string, quoted, with control/non-ASCII bytes escaped and long strings cut. */
static void inspect_print_str(gguf_str s)
{
    uint64_t shown = s.len < INSPECT_STR_SHOWN ? s.len : INSPECT_STR_SHOWN;
    putchar('"');
    for (uint64_t i = 0; i < shown; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c); /* UTF-8 bytes pass through */
    }
    putchar('"');
    if (shown < s.len)
        printf("...(%llu bytes)", (unsigned long long)s.len);
}

static void inspect_print_scalar(const gguf_value *v)
{
    switch (v->type) {
    case GGUF_UINT8:
    case GGUF_UINT16:
    case GGUF_UINT32:
    case GGUF_UINT64:
        printf("%llu", (unsigned long long)v->u);
        break;
    case GGUF_INT8:
    case GGUF_INT16:
    case GGUF_INT32:
    case GGUF_INT64:
        printf("%lld", (long long)v->i);
        break;
    case GGUF_FLOAT32:
        printf("%.9g", v->f);
        break;
    case GGUF_FLOAT64:
        printf("%.17g", v->f);
        break;
    case GGUF_BOOL:
        fputs(v->u ? "true" : "false", stdout);
        break;
    case GGUF_STRING:
        inspect_print_str(v->str);
        break;
    default:
        break;
    }
}

static void inspect_print_array(const gguf_array *a, int depth)
{
    printf("[%s x %llu]", gguf_type_name(a->elem), (unsigned long long)a->n);
    if (a->n == 0)
        return;
    if (depth >= INSPECT_MAX_NESTING) {
        fputs(" ...", stdout);
        return;
    }
    uint64_t shown = (uint64_t)(INSPECT_ARRAY_SHOWN - depth);
    if (shown > a->n)
        shown = a->n;
    putchar(' ');
    for (uint64_t i = 0; i < shown; i++) {
        if (i)
            fputs(", ", stdout);
        if (a->elem == GGUF_STRING) {
            inspect_print_str(a->strs[i]);
        } else if (a->elem == GGUF_ARRAY) {
            putchar('(');
            inspect_print_array(&a->items[i].arr, depth + 1);
            putchar(')');
        } else if (a->elem == GGUF_FLOAT32 || a->elem == GGUF_FLOAT64) {
            printf("%.9g", gguf_array_float(a, i));
        } else if (a->elem == GGUF_BOOL) {
            fputs(gguf_array_int(a, i) ? "true" : "false", stdout);
        } else if (a->elem == GGUF_UINT64) {
            /* gguf_array_int clamps values above INT64_MAX: read those through the double */
            int64_t v = gguf_array_int(a, i);
            if (v == INT64_MAX)
                printf("%.17g", gguf_array_float(a, i));
            else
                printf("%lld", (long long)v);
        } else {
            printf("%lld", (long long)gguf_array_int(a, i));
        }
    }
    if (shown < a->n)
        fputs(", ...", stdout);
}

/* A key or tensor name, escaped, padded to width columns. */
static void inspect_print_name(gguf_str key, uint64_t width)
{
    for (uint64_t i = 0; i < key.len; i++) {
        unsigned char c = (unsigned char)key.ptr[i];
        if (c <= 0x20 || c >= 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
    for (uint64_t i = key.len; i < width; i++)
        putchar(' ');
}

static void inspect_print_metadata(const gguf_file *f)
{
    printf("\nmetadata: %llu keys\n", (unsigned long long)f->n_kv);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        fputs("  ", stdout);
        inspect_print_name(kv->key, 40);
        printf(" %-8s ", gguf_type_name(kv->value.type));
        if (kv->value.type == GGUF_ARRAY)
            inspect_print_array(&kv->value.arr, 0);
        else
            inspect_print_scalar(&kv->value);
        putchar('\n');
    }
}

static const char *inspect_type_name(uint32_t type, char *buf, size_t cap)
{
    const kt_traits *tr = kt_traits_of(type);
    if (tr)
        snprintf(buf, cap, "%s", tr->name);
    else
        snprintf(buf, cap, "type%u", type);
    return buf;
}

typedef struct {
    uint32_t type;
    uint64_t tensors, params, bytes;
} inspect_kind;

static void inspect_print_kind(const char *name, const inspect_kind *k)
{
    printf("  %-8s %8llu %14llu %14llu %8.3f\n", name, (unsigned long long)k->tensors,
           (unsigned long long)k->params, (unsigned long long)k->bytes,
           k->params ? 8.0 * (double)k->bytes / (double)k->params : 0.0);
}

/* The type mix: per type, most parameters first, then all tensors together. */
static void inspect_print_types(const gguf_file *f)
{
    inspect_kind kinds[INSPECT_MAX_KINDS], all = {0}, other = {0};
    int n = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        uint64_t params = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; /* checked at open */
        int k = 0;
        while (k < n && kinds[k].type != t->type)
            k++;
        if (k == n && n < INSPECT_MAX_KINDS)
            kinds[n++] = (inspect_kind){.type = t->type};
        inspect_kind *dst[2] = {k < n ? &kinds[k] : &other, &all};
        for (int j = 0; j < 2; j++) {
            dst[j]->tensors++;
            dst[j]->params += params;
            dst[j]->bytes += t->nbytes;
        }
    }
    for (int i = 1; i < n; i++) /* insertion sort: most parameters first, then by type id */
        for (int j = i; j > 0 && (kinds[j].params > kinds[j - 1].params ||
                                  (kinds[j].params == kinds[j - 1].params &&
                                   kinds[j].type < kinds[j - 1].type));
             j--) {
            inspect_kind k = kinds[j];
            kinds[j] = kinds[j - 1];
            kinds[j - 1] = k;
        }
    printf("\ntype mix: %d types\n", n + (other.tensors > 0));
    printf("  %-8s %8s %14s %14s %8s\n", "type", "tensors", "parameters", "bytes", "bits/w");
    char name[16];
    for (int i = 0; i < n; i++)
        inspect_print_kind(inspect_type_name(kinds[i].type, name, sizeof name), &kinds[i]);
    if (other.tensors)
        inspect_print_kind("other", &other);
    inspect_print_kind("all", &all);
}

static void inspect_print_tensors(const gguf_file *f)
{
    uint64_t params = 0, bytes = 0, unsupported = 0;
    printf("\ntensors: %llu\n", (unsigned long long)f->n_tensors);
    printf("  %-32s %-8s %-26s %12s %12s\n", "name", "type", "shape", "offset", "bytes");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        const kt_traits *tr = kt_traits_of(t->type);
        char type[16];
        inspect_type_name(t->type, type, sizeof type);
        char shape[96];
        size_t o = 0;
        shape[o++] = '[';
        for (uint32_t d = 0; d < t->n_dims && o < sizeof shape; d++)
            o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%llu", d ? ", " : "",
                                  (unsigned long long)t->ne[d]);
        if (o < sizeof shape)
            snprintf(shape + o, sizeof shape - o, "]");
        fputs("  ", stdout);
        inspect_print_name(t->name, 32);
        printf(" %-8s %-26s %12llu %12llu\n", type, shape, (unsigned long long)t->offset,
               (unsigned long long)t->nbytes);
        uint64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; /* checked at open */
        params += n;
        bytes += t->nbytes;
        unsupported += !(tr && tr->supported);
    }
    printf("\ntotals: %llu tensors, %llu parameters, %llu bytes of tensor data (%.2f MiB)",
           (unsigned long long)f->n_tensors, (unsigned long long)params,
           (unsigned long long)bytes, (double)bytes / (1024.0 * 1024.0));
    if (unsupported)
        printf(", %llu tensors of types orochi has no kernels for",
               (unsigned long long)unsupported);
    putchar('\n');
}

/* Whether orochi runs the file: the load a worker makes (without the CPU's repacking), and what
 * it computes, or why not. */
static void inspect_print_runnable(const char *path)
{
    char err[512];
    llama_model *m = llama_model_load_unpacked(path, err, sizeof err);
    if (!m) {
        printf("\norochi can run it: no - %s\n", err);
        return;
    }
    const llama_config *c = &m->cfg;
    const llama_layer *L = &m->layers[0];
    static const char *const arch[] = {"llama", "qwen2", "qwen3"};
    static const char *const scaling[] = {"", ", linear scaling", ", YaRN scaling",
                                          ", Llama 3.1 factors"};
    printf("\norochi can run it: yes - %s, %d layers, dim %d, ffn %d, %d query / %d KV heads of "
           "%d, vocabulary %d; RoPE %s over %d dims, base %g%s",
           arch[c->arch], c->n_layers, c->dim, c->ffn, c->n_heads, c->n_kv_heads, c->head_dim,
           c->vocab, c->rope_neox ? "NEOX" : "on adjacent pairs", c->rot_dim,
           (double)c->rope_base, scaling[c->rope_scaling]);
    if (c->rope_scaling == LLAMA_ROPE_LINEAR || c->rope_scaling == LLAMA_ROPE_YARN)
        printf(" (factor %g)", (double)c->rope_factor);
    printf("%s%s%s\n", L->bq || L->bk || L->bv ? "; q/k/v biases" : "",
           L->bo ? "; output bias" : "", L->q_norm ? "; per-head q/k norms" : "");
    llama_model_destroy(&m);
}

int cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            inspect_usage(stdout);
            return 0;
        }
        if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "orochi inspect: unknown option '%s'\n", argv[i]);
            inspect_usage(stderr);
            return 2;
        }
        if (path) {
            fprintf(stderr, "orochi inspect: more than one FILE given\n");
            inspect_usage(stderr);
            return 2;
        }
        path = argv[i];
    }
    if (!path) {
        inspect_usage(stderr);
        return 2;
    }
    char err[512];
    gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    printf("file: %s\n", path);
    printf("gguf version %u, alignment %llu, data section at byte %llu, file size %llu bytes\n",
           f->version, (unsigned long long)f->alignment, (unsigned long long)f->data_offset,
           (unsigned long long)f->size);
    inspect_print_metadata(f);
    inspect_print_tensors(f);
    inspect_print_types(f);
    gguf_close(&f);
    inspect_print_runnable(path);
    return 0;
}
