/*
 * tests/cuda/gpu_agreement.c — how closely the GPU forward's numbers follow the CPU forward's on
 * real prompts: the per-token greedy agreement, teacher-forced, and the logit difference.
 *
 *   orochi-gpu-agreement[-emu] --model M [--prompts FILE] [--tokens N] [--limit K]
 *                              [--gpu-memory auto|mapped|mirror]
 *                              [--gpu-matmul auto|cuda|tensor] [--json FILE]
 *
 * Built against the GPU op set (orochi-gpu-agreement, with CUDA) and against the CUDA emulation
 * (orochi-gpu-agreement-emu: the same kernels' arithmetic, run on the CPU; slow, so --limit and
 * --tokens keep it short). For each prompt of FILE (default bench/prompts.jsonl: one JSON object
 * a line, its "id" and "prompt"; the model's chat template is applied), the CPU forward (one
 * part) decodes N greedy tokens and keeps each step's logits; the GPU forward (one part) is fed
 * the same tokens — the prompt in batches of up to 64, then one token a step — and each step's
 * logits are compared with the CPU's: the greedy token, the relative L2 of the row, and the
 * largest difference over the row's largest logit. A differing greedy token is a near tie when
 * the CPU's logits of the two tokens are within 1e-3 of the row's largest.
 * Prints a table per prompt and a summary; --json appends a JSON line per prompt and one summary.
 * Exits 1 when a forward fails; agreement itself is reported, not judged.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "model/llama.h"
#include "kernels/cuda/kcuda.h"
#include "model/llama_cuda.h"
#include "model/tokenizer.h"

#define MAX_PROMPT 1024
#define NEAR_TIE 1e-3

typedef struct {
    const char *model, *prompts, *json;
    int tokens, limit;
    llama_gpu_memory memory;
    int matmul; /* --gpu-matmul: KCUDA_MM_* */
} options;

typedef struct {
    int steps, agree, ties;
    double sum_l2, worst_l2, worst_diff;
} tally;

/* The string value of "key" in a one-line JSON object into out (escapes \" \\ \n \t \/ and \u of
 * ASCII); false when it is missing or malformed. */
static bool json_string(const char *line, const char *key, char *out, size_t cap)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(line, pat);
    if (!p)
        return false;
    p += strlen(pat);
    while (*p == ' ' || *p == ':')
        p++;
    if (*p++ != '"')
        return false;
    size_t n = 0;
    for (; *p && *p != '"'; p++) {
        char c = *p;
        if (c == '\\') {
            c = *++p;
            if (c == 'n')
                c = '\n';
            else if (c == 't')
                c = '\t';
            else if (c == 'u') {
                unsigned v;
                if (sscanf(p + 1, "%4x", &v) != 1 || v > 0x7f)
                    return false;
                c = (char)v;
                p += 4;
            } else if (c != '"' && c != '\\' && c != '/')
                return false;
        }
        if (n + 1 >= cap)
            return false;
        out[n++] = c;
    }
    out[n] = 0;
    return *p == '"';
}

/* One row's comparison into t. */
static void compare_row(tally *t, const float *gpu, const float *cpu, int vocab)
{
    double d2 = 0, r2 = 0, big = 0, diff = 0;
    for (int i = 0; i < vocab; i++) {
        double d = (double)gpu[i] - cpu[i];
        d2 += d * d;
        r2 += (double)cpu[i] * cpu[i];
        big = fabs(cpu[i]) > big ? fabs(cpu[i]) : big;
        diff = fabs(d) > diff ? fabs(d) : diff;
    }
    double l2 = r2 > 0 ? sqrt(d2 / r2) : sqrt(d2);
    int a = k_argmax(gpu, vocab), b = k_argmax(cpu, vocab);
    t->steps++;
    t->agree += a == b;
    t->ties += a != b && (double)cpu[b] - cpu[a] <= NEAR_TIE * big;
    t->sum_l2 += l2;
    t->worst_l2 = l2 > t->worst_l2 ? l2 : t->worst_l2;
    t->worst_diff = big > 0 && diff / big > t->worst_diff ? diff / big : t->worst_diff;
}

/* The prompt (ids[0..n)) in batches of up to w tokens, committed; the last one's logits into
 * logits. Then steps-1 more tokens, one a step: next[k] is fed at step k + 1 (the CPU's choice),
 * each step's logits into logits + (k + 1) * vocab. With gpu NULL, the CPU forward, which fills
 * next[] with its greedy choices. */
static int play(llama_ctx *ctx, llama_gpu *gpu, const int32_t *ids, int n, int w, int steps,
                int32_t *next, float *logits, int vocab, char *err, size_t errlen)
{
    static int32_t path[KMAT_MAX_W];
    for (int i = 0; i < KMAT_MAX_W; i++)
        path[i] = i;
    llama_ctx_reset(ctx);
    for (int at = 0; at < n; at += w) {
        int m = n - at < w ? n - at : w;
        bool last = at + m == n;
        llama_batch b = {.n = m, .tokens = ids + at, .logits_from = last ? m - 1 : m};
        float *out = last ? logits : NULL;
        int rc = gpu ? llama_gpu_forward(gpu, &b, out, err, errlen)
                     : llama_forward(ctx, &b, out, err, errlen);
        if (rc || llama_commit(ctx, path, m, err, errlen))
            return -1;
    }
    for (int k = 0; k + 1 < steps; k++) {
        if (!gpu)
            next[k] = k_argmax(logits + (size_t)k * vocab, vocab);
        llama_batch b = {.n = 1, .tokens = &next[k]};
        float *out = logits + (size_t)(k + 1) * vocab;
        int rc = gpu ? llama_gpu_forward(gpu, &b, out, err, errlen)
                     : llama_forward(ctx, &b, out, err, errlen);
        if (rc || llama_commit(ctx, path, 1, err, errlen))
            return -1;
    }
    return 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: orochi-gpu-agreement --model M [--prompts FILE] [--tokens N] "
                    "[--limit K] [--gpu-memory auto|mapped|mirror] [--gpu-matmul auto|cuda|tensor] "
                    "[--json FILE]\n");
    return 2;
}

/* A whole number in [1, 1 << 20] from s, or 0. */
static int count(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    return *s && !*end && v >= 1 && v <= 1 << 20 ? (int)v : 0;
}

static int parse(int argc, char **argv, options *o)
{
    *o = (options){.prompts = "bench/prompts.jsonl", .tokens = 32, .limit = 1 << 20};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        bool ok = true;
        if (!strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--prompts"))
            o->prompts = v;
        else if (!strcmp(a, "--json"))
            o->json = v;
        else if (!strcmp(a, "--tokens"))
            ok = (o->tokens = count(v)) > 0;
        else if (!strcmp(a, "--limit"))
            ok = (o->limit = count(v)) > 0;
        else if (!strcmp(a, "--gpu-matmul")) {
            o->matmul = !strcmp(v, "auto")   ? KCUDA_MM_AUTO
                        : !strcmp(v, "cuda") ? KCUDA_MM_SIMT
                        : !strcmp(v, "tensor") ? KCUDA_MM_TC
                                               : -1;
            ok = o->matmul >= 0;
        } else if (!strcmp(a, "--gpu-memory")) {
            int mode = llama_gpu_memory_parse(v);
            ok = mode >= 0;
            o->memory = ok ? (llama_gpu_memory)mode : LLAMA_GPU_AUTO;
        }
        else
            ok = false;
        if (!ok) {
            fprintf(stderr, "orochi-gpu-agreement: bad option %s %s\n", a, v);
            return usage();
        }
    }
    return o->model && argc % 2 ? 0 : usage();
}

int main(int argc, char **argv)
{
    options o;
    if (parse(argc, argv, &o))
        return 2;
    char err[512];
    llama_model *m = llama_model_load(o.model, err, sizeof err);
    if (!m) {
        fprintf(stderr, "orochi-gpu-agreement: %s\n", err);
        return 1;
    }
    tokenizer *tok = tokenizer_new(m->file, err, sizeof err);
    FILE *pf = fopen(o.prompts, "r");
    FILE *jf = o.json ? fopen(o.json, "a") : NULL;
    if (!tok || !pf || (o.json && !jf)) {
        fprintf(stderr, "orochi-gpu-agreement: %s\n",
                !tok ? err : !pf ? "cannot open the prompts file" : "cannot open the JSON file");
        return 1;
    }
    int vocab = m->cfg.vocab, w = KMAT_MAX_W, T = o.tokens;
    llama_ctx_params cp = {.n_threads = 0, .max_width = w, .n_ctx = MAX_PROMPT + T};
    llama_ctx *cpu = llama_ctx_new(m, &cp, err, sizeof err);
    size_t shared = llama_shared_layout(&m->cfg, cp.n_ctx, w, 1, KV_F32, NULL);
    size_t bytes = (shared + (size_t)T * vocab * 4 + 4095) & ~(size_t)4095;
    void *block = aligned_alloc(4096, bytes);
    if (block)
        memset(block, 0, bytes);
    llama_ctx_params gp_ctx = cp;
    gp_ctx.shared = block;
    llama_ctx *gctx = block ? llama_ctx_new(m, &gp_ctx, err, sizeof err) : NULL;
    llama_gpu_params gp = {.device = 0, .memory = o.memory, .graphs = true,
                           .matmul_kind = o.matmul};
    llama_gpu *gpu = gctx ? llama_gpu_new(gctx, &gp, block, bytes, err, sizeof err) : NULL;
    float *ref = malloc((size_t)T * vocab * 4);
    int32_t *ids = malloc(MAX_PROMPT * sizeof *ids), *next = malloc((size_t)T * sizeof *next);
    if (!cpu || !gpu || !ref || !ids || !next) {
        fprintf(stderr, "orochi-gpu-agreement: %s\n", !cpu || !gpu ? err : "out of memory");
        return 1;
    }
    float *got = (float *)((char *)block + shared);
    printf("GPU: %s\nmodel %s, %d greedy tokens a prompt, teacher-forced\n",
           llama_gpu_describe(gpu), o.model, T);
    printf("%-10s %7s %9s %6s %12s %12s %12s\n", "prompt", "tokens", "agree", "ties",
           "mean rel L2", "worst rel L2", "max |diff|");
    tally all = {0};
    char line[8192], id[128], text[4096];
    int done = 0, rc = 0;
    while (done < o.limit && fgets(line, sizeof line, pf)) {
        if (!json_string(line, "prompt", text, sizeof text))
            continue;
        if (!json_string(line, "id", id, sizeof id))
            snprintf(id, sizeof id, "#%d", done + 1);
        char *chat = tokenizer_chat_prompt(tok, text);
        const char *src = chat ? chat : text;
        int n = 0, bos = tokenizer_bos(tok);
        if (tokenizer_add_bos(tok) && bos >= 0)
            ids[n++] = bos;
        int got_n = tokenizer_encode(tok, src, strlen(src), true, ids + n, MAX_PROMPT - n, NULL);
        free(chat);
        if (got_n < 0) {
            fprintf(stderr, "orochi-gpu-agreement: prompt %s is over %d tokens\n", id, MAX_PROMPT);
            continue;
        }
        n += got_n;
        if (play(cpu, NULL, ids, n, w, T, next, ref, vocab, err, sizeof err) ||
            play(gctx, gpu, ids, n, w, T, next, got, vocab, err, sizeof err)) {
            fprintf(stderr, "orochi-gpu-agreement: prompt %s: %s\n", id, err);
            rc = 1;
            break;
        }
        tally t = {0};
        for (int k = 0; k < T; k++)
            compare_row(&t, got + (size_t)k * vocab, ref + (size_t)k * vocab, vocab);
        printf("%-10s %7d %4d/%-4d %6d %12.3g %12.3g %12.3g\n", id, n, t.agree, t.steps, t.ties,
               t.sum_l2 / t.steps, t.worst_l2, t.worst_diff);
        fflush(stdout);
        if (jf)
            fprintf(jf,
                    "{\"bench\":\"gpu_agreement\",\"prompt\":\"%s\",\"prompt_tokens\":%d,"
                    "\"steps\":%d,\"agree\":%d,\"near_ties\":%d,\"mean_rel_l2\":%.4g,"
                    "\"worst_rel_l2\":%.4g,\"max_diff_over_max\":%.4g}\n",
                    id, n, t.steps, t.agree, t.ties, t.sum_l2 / t.steps, t.worst_l2,
                    t.worst_diff);
        all.steps += t.steps;
        all.agree += t.agree;
        all.ties += t.ties;
        all.sum_l2 += t.sum_l2;
        all.worst_l2 = t.worst_l2 > all.worst_l2 ? t.worst_l2 : all.worst_l2;
        all.worst_diff = t.worst_diff > all.worst_diff ? t.worst_diff : all.worst_diff;
        done++;
    }
    if (all.steps) {
        printf("%-10s %7s %4d/%-4d %6d %12.3g %12.3g %12.3g  (%.2f%% of greedy tokens agree)\n",
               "all", "", all.agree, all.steps, all.ties, all.sum_l2 / all.steps, all.worst_l2,
               all.worst_diff, 100.0 * all.agree / all.steps);
        if (jf)
            fprintf(jf,
                    "{\"bench\":\"gpu_agreement\",\"prompt\":\"all\",\"gpu\":\"%s\",\"steps\":%d,"
                    "\"agree\":%d,\"near_ties\":%d,\"mean_rel_l2\":%.4g,\"worst_rel_l2\":%.4g,"
                    "\"max_diff_over_max\":%.4g}\n",
                    llama_gpu_describe(gpu), all.steps, all.agree, all.ties,
                    all.sum_l2 / all.steps, all.worst_l2, all.worst_diff);
    }
    if (jf)
        fclose(jf);
    fclose(pf);
    free(ref);
    free(ids);
    free(next);
    llama_gpu_destroy(&gpu);
    llama_ctx_destroy(&gctx);
    llama_ctx_destroy(&cpu);
    free(block);
    tokenizer_destroy(&tok);
    llama_model_destroy(&m);
    return rc;
}
