/*
 * cli/cmd_mkmedusa.c — `orochi mkmedusa`: write deterministic random Medusa heads for a target.
 *
 * Trained heads are not available for the test models, but the loader, the head evaluation and
 * the draft-tree path need real files of every tensor type and of any target's shape. These heads
 * are random yet mildly informative: each residual weight is small (entries uniform in
 * +-scale * sqrt(3 / dim), so W h has about scale * rms(h) per component), hence z = h +
 * silu(W h + b) stays close to h and, projected through the target's own output norm and lm_head,
 * mostly agrees with the target's next-token guess. With --scale 0 and --no-bias a head
 * reproduces the target's logits exactly. --own-out adds a random out.weight per head (entries
 * uniform in +-sqrt(3 / dim), unit-scale logits) to exercise that variant.
 *
 * The file follows docs/medusa.md: a GGUF v3 header, the medusa.* metadata, and per head
 * res.weight, res.bias (F32, unless --no-bias) and out.weight (with --own-out), data aligned to 32
 * bytes. Every tensor has its own splitmix64 stream derived from (seed, tensor index), so the same
 * target shape, options and seed always give the same bytes.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "kernels/cpu/kernels.h"
#include "model/gguf.h"
#include "model/llama.h"

#define MKM_ALIGN 32
#define MKM_MAX_HEADS 64 /* = MEDUSA_MAX_HEADS, what the loader accepts */

enum { MKM_RES, MKM_BIAS, MKM_OUT };

typedef struct {
    char name[64];
    int kind;
    uint32_t type;
    int64_t cols, rows; /* ne[0], ne[1]; a bias is 1-D with rows == 1 */
    float scale;        /* values uniform in [-scale, scale] */
    uint64_t offset;    /* within the data section */
} mkm_tensor;

/* ===== little-endian GGUF pieces, written straight to the file ===== */

typedef struct {
    FILE *f;
    uint64_t n; /* bytes written so far */
    bool fail;
} mkm_out;

static void mkm_bytes(mkm_out *o, const void *p, size_t n)
{
    if (!o->fail && n && fwrite(p, 1, n, o->f) != n)
        o->fail = true;
    o->n += n;
}

static void mkm_u32(mkm_out *o, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    mkm_bytes(o, b, 4);
}

static void mkm_u64(mkm_out *o, uint64_t v)
{
    mkm_u32(o, (uint32_t)v);
    mkm_u32(o, (uint32_t)(v >> 32));
}

static void mkm_string(mkm_out *o, const char *s, size_t len)
{
    mkm_u64(o, len);
    mkm_bytes(o, s, len);
}

static void mkm_key_u32(mkm_out *o, const char *key, uint32_t v)
{
    mkm_string(o, key, strlen(key));
    mkm_u32(o, GGUF_UINT32);
    mkm_u32(o, v);
}

static void mkm_key_str(mkm_out *o, const char *key, const char *v, size_t len)
{
    mkm_string(o, key, strlen(key));
    mkm_u32(o, GGUF_STRING);
    mkm_string(o, v, len);
}

static void mkm_pad(mkm_out *o)
{
    static const uint8_t zeros[MKM_ALIGN];
    mkm_bytes(o, zeros, (MKM_ALIGN - o->n % MKM_ALIGN) % MKM_ALIGN);
}

/* ===== random values ===== */

static uint64_t mkm_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1) from the top 24 bits (exact in a float). */
static float mkm_sym(uint64_t *state)
{
    return (float)(int32_t)(mkm_next(state) >> 40) / 8388608.0f - 1.0f;
}

static uint64_t mkm_bytes_of(const mkm_tensor *t)
{
    return (uint64_t)kt_row_bytes(t->type, (uint64_t)t->cols) * (uint64_t)t->rows;
}

static int mkm_write_data(mkm_out *o, const mkm_tensor *t, uint64_t seed, int index)
{
    uint64_t state = seed ^ (0xd1b54a32d192ed03ull * (uint64_t)(index + 1));
    mkm_next(&state);
    size_t nb = kt_row_bytes(t->type, (uint64_t)t->cols);
    float *row = malloc((size_t)t->cols * sizeof *row);
    void *q = malloc(nb);
    if (!row || !q) {
        free(row);
        free(q);
        return -1;
    }
    for (int64_t r = 0; r < t->rows; r++) {
        for (int64_t c = 0; c < t->cols; c++)
            row[c] = t->scale * mkm_sym(&state);
        kt_quantize_row(t->type, row, q, t->cols);
        mkm_bytes(o, q, nb);
    }
    free(row);
    free(q);
    mkm_pad(o);
    return 0;
}

/* ===== the command ===== */

static bool mkm_type(const char *s, uint32_t *out)
{
    static const struct {
        const char *name;
        uint32_t type;
    } types[] = {{"f32", KT_F32}, {"f16", KT_F16}, {"bf16", KT_BF16},
                 {"q8_0", KT_Q8_0}, {"q4_0", KT_Q4_0}, {"q4_1", KT_Q4_1}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcasecmp(s, types[i].name)) {
            *out = types[i].type;
            return true;
        }
    return false;
}

static void mkm_usage(FILE *out)
{
    fprintf(out,
            "usage: orochi mkmedusa --target M.gguf --out F.gguf --heads K [--type T] [--seed S]\n"
            "                       [--scale X] [--own-out] [--no-bias]\n"
            "  Random Medusa heads (docs/medusa.md) shaped for the target model M.\n"
            "  --heads K    number of heads, 1..%d (head k guesses the token k+2 ahead)\n"
            "  --type T     res.weight (and out.weight) type: f32 f16 bf16 q8_0 q4_0 q4_1 (f32)\n"
            "  --seed S     random seed (1); same target shape, options and seed: same bytes\n"
            "  --scale X    residual weights uniform in +-X*sqrt(3/dim), biases in +-X/10 (0.1);\n"
            "               0 with --no-bias makes every head repeat the target's logits\n"
            "  --own-out    give each head its own random out.weight instead of the lm_head\n"
            "  --no-bias    omit the res.bias tensors\n",
            MKM_MAX_HEADS);
}

int cmd_mkmedusa(int argc, char **argv)
{
    const char *target_path = NULL, *out_path = NULL, *type_s = "f32";
    long heads = 0, seed = 1;
    double scale = 0.1;
    bool own_out = false, bias = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            mkm_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--own-out")) {
            own_out = true;
            continue;
        }
        if (!strcmp(a, "--no-bias")) {
            bias = false;
            continue;
        }
        if (!(v = cli_value("mkmedusa", argc, argv, &i)))
            return 2;
        bool ok = true;
        if (!strcmp(a, "--target"))
            target_path = v;
        else if (!strcmp(a, "--out"))
            out_path = v;
        else if (!strcmp(a, "--type"))
            type_s = v;
        else if (!strcmp(a, "--heads"))
            ok = cli_int("mkmedusa", a, v, 1, MKM_MAX_HEADS, &heads);
        else if (!strcmp(a, "--seed"))
            ok = cli_int("mkmedusa", a, v, 0, 0x7fffffffL, &seed);
        else if (!strcmp(a, "--scale"))
            ok = cli_float("mkmedusa", a, v, 0.0, 100.0, &scale);
        else {
            fprintf(stderr, "orochi mkmedusa: unknown option '%s'\n", a);
            mkm_usage(stderr);
            return 2;
        }
        if (!ok)
            return 2;
    }
    if (!target_path || !out_path || !heads) {
        fprintf(stderr, "orochi mkmedusa: --target, --out and --heads are required\n");
        mkm_usage(stderr);
        return 2;
    }
    uint32_t type;
    if (!mkm_type(type_s, &type)) {
        fprintf(stderr, "orochi mkmedusa: unknown --type '%s' (f32 f16 bf16 q8_0 q4_0 q4_1)\n",
                type_s);
        return 2;
    }
    char err[512];
    llama_model *target = llama_model_load(target_path, err, sizeof err);
    if (!target) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    int64_t dim = target->cfg.dim, vocab = target->cfg.vocab;
    if (!kt_row_bytes(type, (uint64_t)dim)) {
        fprintf(stderr, "orochi mkmedusa: the target's dim %lld is not a multiple of the %s block\n",
                (long long)dim, type_s);
        llama_model_destroy(&target);
        return 2;
    }
    /* medusa.target: the target's general.name, else its file name */
    char name[256];
    gguf_str gname;
    if (gguf_get_str(target->file, "general.name", &gname) && gname.len > 0) {
        size_t n = gname.len < sizeof name - 1 ? (size_t)gname.len : sizeof name - 1;
        memcpy(name, gname.ptr, n);
        name[n] = 0;
    } else {
        const char *base = strrchr(target_path, '/');
        snprintf(name, sizeof name, "%s", base ? base + 1 : target_path);
    }
    llama_model_destroy(&target);

    int n_t = 0;
    mkm_tensor t[MKM_MAX_HEADS * 3];
    memset(t, 0, sizeof t);
    float res_scale = (float)(scale * sqrt(3.0 / (double)dim));
    for (int k = 0; k < heads; k++) {
        mkm_tensor *x = &t[n_t++];
        *x = (mkm_tensor){.kind = MKM_RES, .type = type, .cols = dim, .rows = dim,
                          .scale = res_scale};
        snprintf(x->name, sizeof x->name, "medusa.%d.res.weight", k);
        if (bias) {
            x = &t[n_t++];
            *x = (mkm_tensor){.kind = MKM_BIAS, .type = KT_F32, .cols = dim, .rows = 1,
                              .scale = (float)(scale / 10.0)};
            snprintf(x->name, sizeof x->name, "medusa.%d.res.bias", k);
        }
        if (own_out) {
            x = &t[n_t++];
            *x = (mkm_tensor){.kind = MKM_OUT, .type = type, .cols = dim, .rows = vocab,
                              .scale = (float)sqrt(3.0 / (double)dim)};
            snprintf(x->name, sizeof x->name, "medusa.%d.out.weight", k);
        }
    }

    FILE *f = fopen(out_path, "wb");
    if (!f) {
        fprintf(stderr, "orochi mkmedusa: cannot write '%s'\n", out_path);
        return 1;
    }
    mkm_out o = {.f = f};
    mkm_bytes(&o, "GGUF", 4);
    mkm_u32(&o, 3);
    mkm_u64(&o, (uint64_t)n_t);
    mkm_u64(&o, 7);
    static const char arch[] = "orochi-medusa", gen[] = "orochi-mkmedusa";
    mkm_key_str(&o, "general.architecture", arch, sizeof arch - 1);
    mkm_key_str(&o, "general.name", gen, sizeof gen - 1);
    mkm_key_u32(&o, "general.alignment", MKM_ALIGN);
    mkm_key_u32(&o, "medusa.head_count", (uint32_t)heads);
    mkm_key_u32(&o, "medusa.embedding_length", (uint32_t)dim);
    mkm_key_u32(&o, "medusa.vocab_size", (uint32_t)vocab);
    mkm_key_str(&o, "medusa.target", name, strlen(name));
    uint64_t off = 0;
    for (int i = 0; i < n_t; i++) {
        t[i].offset = off;
        off += (mkm_bytes_of(&t[i]) + MKM_ALIGN - 1) / MKM_ALIGN * MKM_ALIGN;
        mkm_string(&o, t[i].name, strlen(t[i].name));
        bool vec = t[i].kind == MKM_BIAS;
        mkm_u32(&o, vec ? 1 : 2);
        mkm_u64(&o, (uint64_t)t[i].cols);
        if (!vec)
            mkm_u64(&o, (uint64_t)t[i].rows);
        mkm_u32(&o, t[i].type);
        mkm_u64(&o, t[i].offset);
    }
    mkm_pad(&o);
    int rc = 0;
    for (int i = 0; i < n_t && !rc && !o.fail; i++)
        rc = mkm_write_data(&o, &t[i], (uint64_t)seed, i);
    if (fclose(f))
        o.fail = true;
    if (rc || o.fail) {
        fprintf(stderr, "orochi mkmedusa: %s '%s'\n", rc ? "out of memory writing" : "write failed:",
                out_path);
        remove(out_path);
        return 1;
    }
    fprintf(stderr, "orochi mkmedusa: wrote %s (%ld heads, %d tensors, %.2f MiB) for '%s'\n",
            out_path, heads, n_t, (double)o.n / (1 << 20), name);
    return 0;
}
