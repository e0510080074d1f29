/*
 * cli/cmd_mkmodel.c — `orochi mkmodel`: write a deterministic random-weight Llama GGUF.
 *
 * Tests need models of every tensor type small enough to check against the numpy reference, and
 * benchmarks need models of real shapes (1B-7B) where step time does not depend on the weight
 * values. The file carries everything a real one does: llama.* metadata, a working byte-level BPE
 * vocabulary (3 ChatML special tokens, the 256 byte tokens, then merges learned from a built-in
 * text until the vocabulary is full), a ChatML chat template, F32 norms and matrices in the
 * chosen type. Weights come from a splitmix64 stream per tensor, so a (shape, type, seed) always
 * gives the same bytes. Matrices are scaled by 1/sqrt(fan_in) so activations keep unit scale.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "kernels/cpu/kernels.h"

#define MK_ALIGN 32
#define MK_SPECIALS 3

static const char MK_CORPUS[] =
    "the quick brown fox jumps over the lazy dog. a model reads the text and writes the next "
    "token; the target verifies the tree of drafts and keeps the longest accepted path. "
    "speculative decoding is lossless: greedy output equals sequential output, token for token. "
    "hello world! in the beginning there was the word, and the word was with the model. "
    "one two three four five six seven eight nine ten. int main(void) { return 0; } "
    "for i in range(10): print(i) # numbers and code and prose, again and again and again.";

/* ===== GGUF header pieces (cli_buf, cli/util.h) ===== */

static void mk_str(cli_buf *b, const char *s)
{
    cli_buf_str(b, s, strlen(s));
}

static void mk_kv_u32(cli_buf *b, const char *key, uint32_t v)
{
    mk_str(b, key);
    cli_buf_u32(b, 4);
    cli_buf_u32(b, v);
}

static void mk_kv_f32(cli_buf *b, const char *key, float v)
{
    mk_str(b, key);
    cli_buf_u32(b, 6);
    cli_buf_put(b, &v, 4);
}

static void mk_kv_bool(cli_buf *b, const char *key, bool v)
{
    uint8_t x = v;
    mk_str(b, key);
    cli_buf_u32(b, 7);
    cli_buf_put(b, &x, 1);
}

static void mk_kv_str(cli_buf *b, const char *key, const char *v)
{
    mk_str(b, key);
    cli_buf_u32(b, 8);
    mk_str(b, v);
}

static void mk_kv_strs(cli_buf *b, const char *key, char **v, uint64_t n)
{
    mk_str(b, key);
    cli_buf_u32(b, 9);
    cli_buf_u32(b, 8);
    cli_buf_u64(b, n);
    for (uint64_t i = 0; i < n; i++)
        mk_str(b, v[i]);
}

static void mk_kv_i32s(cli_buf *b, const char *key, const int32_t *v, uint64_t n)
{
    mk_str(b, key);
    cli_buf_u32(b, 9);
    cli_buf_u32(b, 5);
    cli_buf_u64(b, n);
    cli_buf_put(b, v, n * 4);
}

/* ===== the vocabulary ===== */

/* GPT-2's byte -> unicode code point map: printable bytes stand for themselves, the rest are
 * shifted to 256 + k in byte order. */
static uint32_t mk_byte_cp(int byte)
{
    if ((byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || byte >= 174)
        return (uint32_t)byte;
    int k = 0;
    for (int c = 0; c < byte; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174))
            k++;
    return 256u + (uint32_t)k;
}

static void mk_utf8(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = 0;
    }
}

typedef struct {
    char **tokens;
    int32_t *types;
    char **merges;
    int n_tokens, n_merges;
} mk_vocab;

static void mk_vocab_free(mk_vocab *v)
{
    for (int i = 0; i < v->n_tokens; i++)
        free(v->tokens[i]);
    for (int i = 0; i < v->n_merges; i++)
        free(v->merges[i]);
    free(v->tokens);
    free(v->types);
    free(v->merges);
}

/* Learn merges on the built-in corpus: words are split at spaces with the space kept at the front
 * of the next word, like the GPT-2 pre-tokenizer; each round merges the most frequent adjacent
 * pair (ties: the pair of lowest token ids). */
static int mk_vocab_build(int vocab, mk_vocab *v)
{
    v->tokens = calloc((size_t)vocab, sizeof *v->tokens);
    v->types = calloc((size_t)vocab, sizeof *v->types);
    v->merges = calloc((size_t)vocab, sizeof *v->merges);
    size_t n = strlen(MK_CORPUS);
    int *seq = malloc(n * sizeof *seq);
    int *cnt = NULL;
    if (!v->tokens || !v->types || !v->merges || !seq) {
        free(seq);
        return -1;
    }
    static const char *specials[MK_SPECIALS] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < MK_SPECIALS; i++) {
        v->tokens[i] = strdup(specials[i]);
        v->types[i] = 3;
    }
    for (int b = 0; b < 256; b++) {
        char s[4];
        mk_utf8(mk_byte_cp(b), s);
        v->tokens[MK_SPECIALS + b] = strdup(s);
        v->types[MK_SPECIALS + b] = 1;
    }
    v->n_tokens = MK_SPECIALS + 256;
    for (size_t i = 0; i < n; i++)
        seq[i] = MK_SPECIALS + (unsigned char)MK_CORPUS[i];
    int space = MK_SPECIALS + ' ';
    while (v->n_tokens < vocab) {
        int nt = v->n_tokens, best_a = -1, best_b = -1, best = 1;
        free(cnt); /* the vocabulary stays small: merges stop once no pair repeats */
        cnt = calloc((size_t)nt * (size_t)nt, sizeof *cnt);
        if (!cnt)
            break;
        for (size_t i = 0; i + 1 < n; i++)
            if (seq[i + 1] != space) /* never merge across a word start */
                cnt[seq[i] * nt + seq[i + 1]]++;
        for (int a = 0; a < nt; a++)
            for (int b = 0; b < nt; b++)
                if (cnt[a * nt + b] > best) {
                    best = cnt[a * nt + b];
                    best_a = a;
                    best_b = b;
                }
        if (best_a < 0)
            break;
        size_t la = strlen(v->tokens[best_a]), lb = strlen(v->tokens[best_b]);
        char *tok = malloc(la + lb + 1), *merge = malloc(la + lb + 2);
        if (!tok || !merge) {
            free(tok);
            free(merge);
            break;
        }
        sprintf(tok, "%s%s", v->tokens[best_a], v->tokens[best_b]);
        sprintf(merge, "%s %s", v->tokens[best_a], v->tokens[best_b]);
        v->tokens[nt] = tok;
        v->types[nt] = 1;
        v->merges[v->n_merges++] = merge;
        v->n_tokens++;
        size_t w = 0;
        for (size_t i = 0; i < n; i++) {
            if (i + 1 < n && seq[i] == best_a && seq[i + 1] == best_b) {
                seq[w++] = nt;
                i++;
            } else {
                seq[w++] = seq[i];
            }
        }
        n = w;
    }
    /* fill the rest with unused placeholder tokens so the vocab has the asked size */
    for (int i = v->n_tokens; i < vocab; i++) {
        char name[32];
        snprintf(name, sizeof name, "<|unused_%d|>", i);
        v->tokens[i] = strdup(name);
        v->types[i] = 5;
    }
    v->n_tokens = vocab;
    free(seq);
    free(cnt);
    return 0;
}

/* ===== tensors ===== */

typedef struct {
    char name[64];
    uint32_t type;
    int64_t cols, rows; /* ne[0], ne[1] (rows == 1 and n_dims == 1 for norms) */
    int n_dims;
    float scale; /* weights and biases uniform in [-scale, scale]; norms 1 +- scale */
    bool norm;   /* a 1-D F32 vector (a norm, a bias, the rope factors) */
    bool bias;   /* centred on 0, not 1 */
    int factors; /* > 0: Llama 3.1's RoPE factors for this many rotary dimensions */
    uint64_t offset;
} mk_tensor;

/* Llama 3.1's RoPE factor of pair i of rot dimensions (base 500000, factor 8, low/high frequency
 * factors 1 and 4, original context 8192): 1 for pairs that turn fast, 8 for slow ones, smoothly
 * between — the values the Llama-3.1 files carry in rope_freqs.weight. */
static float mk_llama3_factor(int i, int rot)
{
    const double two_pi = 6.283185307179586, orig = 8192, lo = 1, hi = 4, f = 8;
    double inv = pow(500000.0, -2.0 * i / rot), wavelen = two_pi / inv;
    if (wavelen < orig / hi)
        return 1.0f;
    if (wavelen > orig / lo)
        return (float)f;
    double smooth = (orig / wavelen - lo) / (hi - lo);
    return (float)(1.0 / ((1 - smooth) / f + smooth));
}

static uint64_t mk_splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float mk_uniform(uint64_t *s)
{
    return (float)((double)(mk_splitmix(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static void mk_add(mk_tensor *t, int *n, const char *name, uint32_t type, int64_t cols, int64_t rows,
                   bool norm)
{
    mk_tensor *x = &t[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->type = norm ? KT_F32 : type;
    x->cols = cols;
    x->rows = norm ? 1 : rows;
    x->n_dims = norm ? 1 : 2;
    x->norm = norm;
    x->scale = norm ? 0.1f : (float)(sqrt(3.0 / (double)cols));
}

static uint64_t mk_tensor_bytes(const mk_tensor *t)
{
    return (uint64_t)kt_row_bytes(t->type, (uint64_t)t->cols) * (uint64_t)t->rows;
}

/* Rows of one tensor quantized by the pool's threads: row r's values are the stream's calls
 * r * cols .. (a splitmix state advances by a constant per call, so a thread starts its rows
 * where a sequential writer would be), so the file is the same whatever the thread count. */
typedef struct {
    const mk_tensor *t;
    uint64_t s0;   /* the tensor's state before its first value */
    int64_t r0;    /* the chunk's first row */
    uint8_t *out;  /* the chunk's quantized rows */
    float *rows;   /* a row of floats per thread */
} mk_chunk;

static void mk_rows(void *arg, int64_t begin, int64_t end, int thread)
{
    mk_chunk *c = arg;
    const mk_tensor *t = c->t;
    float *row = c->rows + (size_t)thread * (size_t)t->cols;
    size_t nb = kt_row_bytes(t->type, (uint64_t)t->cols);
    for (int64_t i = begin; i < end; i++) {
        uint64_t s = c->s0 + (uint64_t)(c->r0 + i) * (uint64_t)t->cols * 0x9e3779b97f4a7c15ull;
        for (int64_t k = 0; k < t->cols; k++)
            row[k] = t->factors ? mk_llama3_factor((int)k, t->factors)
                     : t->norm && !t->bias ? 1.0f + t->scale * mk_uniform(&s)
                                           : t->scale * mk_uniform(&s);
        kt_quantize_row(t->type, row, c->out + (size_t)i * nb, t->cols);
    }
}

#define MK_CHUNK_BYTES ((size_t)64 << 20) /* quantized rows written at a time */

static int mk_write_tensor(FILE *f, kpool *pool, const mk_tensor *t, uint64_t seed, int index)
{
    size_t nb = kt_row_bytes(t->type, (uint64_t)t->cols);
    int64_t per = (int64_t)(MK_CHUNK_BYTES / nb);
    per = per < 1 ? 1 : per > t->rows ? t->rows : per;
    int threads = pool ? kpool_threads(pool) : 1;
    mk_chunk c = {.t = t, .s0 = seed * 0x100000001b3ull + (uint64_t)index * 0x9e3779b97f4a7c15ull};
    c.out = malloc((size_t)per * nb);
    c.rows = malloc((size_t)threads * (size_t)t->cols * sizeof *c.rows);
    int rc = c.out && c.rows ? 0 : -1;
    for (c.r0 = 0; !rc && c.r0 < t->rows; c.r0 += per) {
        int64_t n = t->rows - c.r0 < per ? t->rows - c.r0 : per;
        kpool_run(pool, n, 1, mk_rows, &c);
        if (fwrite(c.out, 1, (size_t)n * nb, f) != (size_t)n * nb)
            rc = -1;
    }
    free(c.out);
    free(c.rows);
    return rc;
}

/* Any type orochi computes with, by its ggml name in any case (f32, q4_k, iq4_nl, ...). */
static bool mk_type(const char *s, uint32_t *out)
{
    for (uint32_t t = 0; t < 64; t++) {
        const kt_traits *tr = kt_traits_of(t);
        if (tr && tr->supported && !strcasecmp(s, tr->name)) {
            *out = t;
            return true;
        }
    }
    return false;
}

static void mk_usage(FILE *out)
{
    fprintf(out, "usage: orochi mkmodel --out F --layers L --dim D --ffn F --heads H --kv-heads K\n"
                 "                      --vocab V --ctx C --type T --seed S [--tied]\n"
                 "                      [--arch llama|llama31|qwen2|qwen3] [--head-dim HD]\n"
                 "                      [--bias] [--rope-scaling linear:F|yarn:F:ORIG]\n"
                 "  --arch: llama (default); llama31 (llama with Llama 3.1's rope_freqs.weight,\n"
                 "  rope base 500000); qwen2 (q/k/v biases, NEOX RoPE, base 1000000); qwen3\n"
                 "  (per-head q/k norms, NEOX RoPE, base 1000000). --head-dim: the head size when\n"
                 "  it is not dim / heads (attention.key_length). --bias: q/k/v and output biases\n"
                 "  on a llama. --rope-scaling: rope.scaling.* keys (docs/models.md).\n"
                 "  T: any type orochi computes with (f32 f16 bf16 q8_0 q6_k q5_k q5_1 q5_0 q4_k q4_1\n"
                 "  q4_0 iq4_nl q3_k q2_k; K-types need dim and ffn multiples of 256; norms are\n"
                 "  always f32). --tied omits output.weight (the lm_head is then the embedding\n"
                 "  matrix). V >= 259.\n");
}

int cmd_mkmodel(int argc, char **argv)
{
    const char *out = NULL, *type_s = "f32", *arch_s = "llama", *scaling = NULL;
    long layers = 2, dim = 64, ffn = 128, heads = 4, kv_heads = 4, vocab = 512, ctx = 256, seed = 1;
    long head_dim = 0;
    bool tied = false, bias = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long *target = NULL, lo = 1, hi = 1L << 20;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            mk_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--tied") || !strcmp(a, "--bias")) {
            *(a[2] == 't' ? &tied : &bias) = true;
            continue;
        }
        if (!(v = cli_value("mkmodel", argc, argv, &i)))
            return 2;
        if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--type")) type_s = v;
        else if (!strcmp(a, "--arch")) arch_s = v;
        else if (!strcmp(a, "--rope-scaling")) scaling = v;
        else if (!strcmp(a, "--head-dim")) target = &head_dim, hi = 512;
        else if (!strcmp(a, "--layers")) target = &layers, hi = 1024;
        else if (!strcmp(a, "--dim")) target = &dim;
        else if (!strcmp(a, "--ffn")) target = &ffn;
        else if (!strcmp(a, "--heads")) target = &heads, hi = 1024;
        else if (!strcmp(a, "--kv-heads")) target = &kv_heads, hi = 1024;
        else if (!strcmp(a, "--vocab")) target = &vocab, lo = MK_SPECIALS + 256, hi = 1 << 24;
        else if (!strcmp(a, "--ctx")) target = &ctx, hi = 1 << 24;
        else if (!strcmp(a, "--seed")) target = &seed, lo = 0, hi = 0x7fffffffL;
        else {
            fprintf(stderr, "orochi mkmodel: unknown option '%s'\n", a);
            mk_usage(stderr);
            return 2;
        }
        if (target && !cli_int("mkmodel", a, v, lo, hi, target))
            return 2;
    }
    uint32_t type;
    if (!out) {
        fprintf(stderr, "orochi mkmodel: --out is required\n");
        return 2;
    }
    if (!mk_type(type_s, &type)) {
        fprintf(stderr, "orochi mkmodel: unknown --type '%s' (one of " KT_SUPPORTED_LIST ")\n",
                type_s);
        return 2;
    }
    int block = kt_traits_of(type)->block;
    if (block > 32 && (dim % block || ffn % block)) {
        fprintf(stderr, "orochi mkmodel: --type %s needs --dim and --ffn multiples of %d\n",
                kt_traits_of(type)->name, block);
        return 2;
    }
    bool llama31 = !strcmp(arch_s, "llama31"), qwen2 = !strcmp(arch_s, "qwen2"),
         qwen3 = !strcmp(arch_s, "qwen3");
    if (!llama31 && !qwen2 && !qwen3 && strcmp(arch_s, "llama")) {
        fprintf(stderr, "orochi mkmodel: --arch %s: llama, llama31, qwen2 or qwen3\n", arch_s);
        return 2;
    }
    const char *arch = qwen2 ? "qwen2" : qwen3 ? "qwen3" : "llama";
    if ((!head_dim && dim % heads) || heads % kv_heads || dim % 32 || ffn % 32) {
        fprintf(stderr, "orochi mkmodel: need dim %% heads == 0 (or --head-dim), heads %% kv-heads "
                        "== 0, dim and ffn multiples of 32\n");
        return 2;
    }
    long hd = head_dim ? head_dim : dim / heads, qd = heads * hd, kvd = kv_heads * hd;
    if (hd % 2 || (qd % block && block > 32) || qd % 32) {
        fprintf(stderr, "orochi mkmodel: the head size %ld must be even and heads x head size a "
                        "multiple of 32 (of %d for --type %s)\n", hd, block > 32 ? block : 32,
                kt_traits_of(type)->name);
        return 2;
    }
    float scale_factor = 0;
    long scale_orig = 0;
    const char *scale_kind = ""; /* rope.scaling.type: "" (no keys), linear or yarn */
    if (scaling) {
        if (sscanf(scaling, "linear:%f", &scale_factor) == 1 && scale_factor > 0)
            scale_kind = "linear";
        else if (sscanf(scaling, "yarn:%f:%ld", &scale_factor, &scale_orig) == 2 &&
                 scale_factor > 0 && scale_orig >= 1)
            scale_kind = "yarn";
        else {
            fprintf(stderr,
                    "orochi mkmodel: --rope-scaling %s: linear:FACTOR or yarn:FACTOR:ORIG_CTX\n",
                    scaling);
            return 2;
        }
    }
    bool biases = bias || qwen2;
    float rope_base = llama31 ? 500000.0f : qwen2 || qwen3 ? 1000000.0f : 10000.0f;

    mk_vocab voc = {0};
    if (mk_vocab_build((int)vocab, &voc)) {
        fprintf(stderr, "orochi mkmodel: out of memory building the vocabulary\n");
        mk_vocab_free(&voc);
        return 1;
    }
    int n_t = 0, cap = 4 + 15 * (int)layers;
    mk_tensor *t = calloc((size_t)cap, sizeof *t);
    if (!t) {
        mk_vocab_free(&voc);
        return 1;
    }
    mk_add(t, &n_t, "token_embd.weight", type, dim, vocab, false);
    t[0].scale = 1.0f;
    for (long l = 0; l < layers; l++) {
        char name[64];
#define MK_LAYER(suffix, c, r, norm)                                       \
        snprintf(name, sizeof name, "blk.%ld.%s.weight", l, suffix);       \
        mk_add(t, &n_t, name, type, c, r, norm);
        MK_LAYER("attn_norm", dim, 1, true)
        MK_LAYER("attn_q", dim, qd, false)
        MK_LAYER("attn_k", dim, kvd, false)
        MK_LAYER("attn_v", dim, kvd, false)
        MK_LAYER("attn_output", qd, dim, false)
        MK_LAYER("ffn_norm", dim, 1, true)
        MK_LAYER("ffn_gate", dim, ffn, false)
        MK_LAYER("ffn_up", dim, ffn, false)
        MK_LAYER("ffn_down", ffn, dim, false)
#undef MK_LAYER
#define MK_VEC(suffix, n, is_bias)                                         \
        do {                                                               \
            snprintf(name, sizeof name, "blk.%ld.%s", l, suffix);          \
            mk_add(t, &n_t, name, type, n, 1, true);                       \
            t[n_t - 1].bias = is_bias;                                     \
        } while (0);
        if (biases) {
            MK_VEC("attn_q.bias", qd, true)
            MK_VEC("attn_k.bias", kvd, true)
            MK_VEC("attn_v.bias", kvd, true)
        }
        if (bias)
            MK_VEC("attn_output.bias", dim, true)
        if (qwen3) {
            MK_VEC("attn_q_norm.weight", hd, false)
            MK_VEC("attn_k_norm.weight", hd, false)
        }
#undef MK_VEC
    }
    if (llama31) {
        mk_add(t, &n_t, "rope_freqs.weight", type, hd / 2, 1, true);
        t[n_t - 1].factors = (int)hd;
    }
    mk_add(t, &n_t, "output_norm.weight", type, dim, 1, true);
    if (!tied)
        mk_add(t, &n_t, "output.weight", type, dim, vocab, false);

    cli_buf b = {0};
    cli_buf_put(&b, "GGUF", 4);
    cli_buf_u32(&b, 3);
    cli_buf_u64(&b, (uint64_t)n_t);
    int n_kv = 19 + (head_dim ? 2 : 0) + (scale_kind[0] ? 2 : 0) + (scale_orig ? 1 : 0);
    cli_buf_u64(&b, (uint64_t)n_kv);
    char key[96];
#define MK_KEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    mk_kv_str(&b, "general.architecture", arch);
    mk_kv_str(&b, "general.name", "orochi-mkmodel");
    mk_kv_u32(&b, "general.alignment", MK_ALIGN);
    mk_kv_u32(&b, MK_KEY("block_count"), (uint32_t)layers);
    mk_kv_u32(&b, MK_KEY("context_length"), (uint32_t)ctx);
    mk_kv_u32(&b, MK_KEY("embedding_length"), (uint32_t)dim);
    mk_kv_u32(&b, MK_KEY("feed_forward_length"), (uint32_t)ffn);
    mk_kv_u32(&b, MK_KEY("attention.head_count"), (uint32_t)heads);
    mk_kv_u32(&b, MK_KEY("attention.head_count_kv"), (uint32_t)kv_heads);
    mk_kv_f32(&b, MK_KEY("rope.freq_base"), rope_base);
    mk_kv_f32(&b, MK_KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    if (head_dim) {
        mk_kv_u32(&b, MK_KEY("attention.key_length"), (uint32_t)hd);
        mk_kv_u32(&b, MK_KEY("attention.value_length"), (uint32_t)hd);
    }
    if (scale_kind[0]) {
        mk_kv_str(&b, MK_KEY("rope.scaling.type"), scale_kind);
        mk_kv_f32(&b, MK_KEY("rope.scaling.factor"), scale_factor);
    }
    if (scale_orig)
        mk_kv_u32(&b, MK_KEY("rope.scaling.original_context_length"), (uint32_t)scale_orig);
#undef MK_KEY
    mk_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    mk_kv_str(&b, "tokenizer.ggml.pre", "smollm");
    mk_kv_strs(&b, "tokenizer.ggml.tokens", voc.tokens, (uint64_t)voc.n_tokens);
    mk_kv_i32s(&b, "tokenizer.ggml.token_type", voc.types, (uint64_t)voc.n_tokens);
    mk_kv_strs(&b, "tokenizer.ggml.merges", voc.merges, (uint64_t)voc.n_merges);
    mk_kv_u32(&b, "tokenizer.ggml.eos_token_id", 2);
    mk_kv_bool(&b, "tokenizer.ggml.add_bos_token", false);
    mk_kv_str(&b, "tokenizer.chat_template",
              "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
              "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt "
              "%}{{ '<|im_start|>assistant\\n' }}{% endif %}");
    uint64_t off = 0;
    for (int i = 0; i < n_t; i++) {
        t[i].offset = off;
        off += (mk_tensor_bytes(&t[i]) + MK_ALIGN - 1) / MK_ALIGN * MK_ALIGN;
        mk_str(&b, t[i].name);
        cli_buf_u32(&b, (uint32_t)t[i].n_dims);
        cli_buf_u64(&b, (uint64_t)t[i].cols);
        if (t[i].n_dims == 2)
            cli_buf_u64(&b, (uint64_t)t[i].rows);
        cli_buf_u32(&b, t[i].type);
        cli_buf_u64(&b, t[i].offset);
    }
    static const uint8_t zeros[MK_ALIGN];
    cli_buf_put(&b, zeros, (MK_ALIGN - b.n % MK_ALIGN) % MK_ALIGN);

    int rc = 1;
    kpool *pool = NULL;
    FILE *f = b.oom ? NULL : fopen(out, "wb");
    if (!f) {
        fprintf(stderr, "orochi mkmodel: cannot write '%s': %s\n", out,
                b.oom ? "out of memory" : strerror(errno));
        goto done;
    }
    if (fwrite(b.p, 1, b.n, f) != b.n)
        goto write_fail;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    pool = kpool_new(cores < 1 ? 1 : cores > 64 ? 64 : (int)cores);
    for (int i = 0; i < n_t; i++) {
        if (mk_write_tensor(f, pool, &t[i], (uint64_t)seed, i))
            goto write_fail;
        uint64_t pad = (MK_ALIGN - mk_tensor_bytes(&t[i]) % MK_ALIGN) % MK_ALIGN;
        if (fwrite(zeros, 1, pad, f) != pad)
            goto write_fail;
    }
    if (fclose(f)) {
        f = NULL;
        goto write_fail;
    }
    f = NULL;
    fprintf(stderr, "orochi mkmodel: wrote %s (%d tensors, %.1f MiB, %d merges)\n", out, n_t,
            (double)(b.n + off) / (1 << 20), voc.n_merges);
    rc = 0;
    goto done;
write_fail:
    fprintf(stderr, "orochi mkmodel: write to '%s' failed: %s\n", out, strerror(errno));
    if (f) {
        fclose(f);
        f = NULL;
    }
    struct stat st;
    if (stat(out, &st) == 0 && S_ISREG(st.st_mode))
        remove(out); /* no partial file left behind (a full disk would keep it) */
done:
    if (f)
        fclose(f);
    kpool_destroy(&pool);
    free(b.p);
    free(t);
    mk_vocab_free(&voc);
    return rc;
}
