/*
 * bench/bench.c — `orochi bench`: the engine's speed on one model, judged against the memory
 * bandwidth floor.
 *
 * Two measurements, both in one process so their ratios are fair:
 *   1. sequential greedy decode tok/s at 1 and 2 threads (or --threads list), the median of
 *      --rounds rounds, each a fresh read-bandwidth measurement and then the decode, with the
 *      achieved weight-read GB/s judged twice at the same thread count: against the floor (the
 *      best bandwidth ever measured, cli/bandwidth.h; `--bandwidth` re-measures it) and against
 *      the bandwidth measured just before the round ("beside"). On a shared machine the two
 *      differ by the neighbours' load: the first never flatters, the second compares figures
 *      from the same moment;
 *   2. the step time t(W) of one W-token forward (a chain) at a committed context of --ctx tokens
 *      for W = 1, 2, 4, ..., 64: the ratio t(W)/t(1) says how wide a verification can be before it
 *      costs more than it saves, and "perfect", W t(1) / t(W), the speedup a perfect drafter
 *      (every token accepted, drafting free: a replay of the target's own output) would give at
 *      that width — the upper bound of speculation on this model and machine, and its best W.
 * --act-bits 16,8 runs both for each activation precision of the quantized matmuls
 * (llama_model_set_act_bits), interleaved within each round and each width.
 * Each timing is the median of --reps repetitions after a warm-up. A table goes to stdout and one
 * JSON object per row to --json FILE (bench/results/bench.jsonl by default).
 * `orochi bench --tree-attention ...` (first option) is a separate micro-benchmark of the tree
 * part of attention, naive sparse vs the engine's sparse kernels vs dense (Ghidorah Fig. 10(b)),
 * in bench/tree_attention.c, which parses its own options.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/bandwidth.h"
#include "cli/commands.h"
#include "cli/util.h"
#define BENCH_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

typedef struct {
    const char *model, *json;
    long decode_tokens, ctx, reps, rounds;
    int threads[8], n_threads;
    int widths[8], n_widths;
    int acts[3], n_acts; /* activation precisions to compare (16, 8, auto: LLAMA_ACT_AUTO) */
    kv_type kv;
    bool bandwidth;
} bench_opts;

/* Decode tok/s: greedy steps after a short prompt. */
static int bench_decode(const llama_model *m, const bench_opts *o, int threads, double *tps)
{
    char err[256];
    int n_prompt = 16;
    llama_ctx_params cp = {.n_threads = threads, .max_width = 16,
                           .n_ctx = n_prompt + (int)o->decode_tokens + 1, .kv = o->kv};
    llama_ctx *ctx = llama_ctx_new(m, &cp, err, sizeof err);
    float *logits = malloc((size_t)m->cfg.vocab * sizeof *logits);
    int32_t ids[16];
    int rc = -1;
    if (!ctx || !logits)
        goto done;
    cli_synthetic_ids(ids, n_prompt, m->cfg.vocab);
    if (llama_prefill(ctx, ids, n_prompt, logits, err, sizeof err))
        goto done;
    double t0 = cli_now();
    for (long i = 0; i < o->decode_tokens; i++) {
        int32_t id = sampler_argmax(logits, m->cfg.vocab), zero = 0;
        llama_batch b = {.n = 1, .tokens = &id};
        if (llama_forward(ctx, &b, logits, err, sizeof err) || llama_commit(ctx, &zero, 1, err, sizeof err))
            goto done;
    }
    *tps = (double)o->decode_tokens / (cli_now() - t0);
    rc = 0;
done:
    if (rc)
        fprintf(stderr, "orochi bench: decode failed: %s\n", ctx ? err : "cannot create context");
    free(logits);
    llama_ctx_destroy(&ctx);
    return rc;
}

/* Step time of a W-token chain at a committed context of o->ctx tokens (median of reps). */
static int bench_width(const llama_model *m, const bench_opts *o, llama_ctx *ctx, int w, float *logits,
                       double *t_step)
{
    char err[256];
    int32_t ids[KMAT_MAX_W];
    double times[64];
    int reps = o->reps < 64 ? (int)o->reps : 64;
    cli_synthetic_ids(ids, w, m->cfg.vocab);
    llama_batch b = {.n = w, .tokens = ids};
    if (llama_forward(ctx, &b, logits, err, sizeof err)) { /* warm-up */
        fprintf(stderr, "orochi bench: %s\n", err);
        return -1;
    }
    for (int r = 0; r < reps; r++) {
        double t0 = cli_now();
        llama_forward(ctx, &b, logits, err, sizeof err);
        times[r] = cli_now() - t0;
    }
    *t_step = cli_median(times, reps);
    return 0;
}

/* --act-bits: a comma-separated list of 16, 8 and auto. */
static bool bench_acts(const char *s, int *out, int *n)
{
    *n = 0;
    char *dup = strdup(s), *save = NULL;
    bool ok = true;
    for (char *tok = strtok_r(dup, ",", &save); ok && tok; tok = strtok_r(NULL, ",", &save)) {
        int bits = llama_act_bits_parse(tok);
        ok = *n < 3 && bits >= 0;
        if (ok)
            out[(*n)++] = bits;
    }
    free(dup);
    if (!ok || !*n)
        fprintf(stderr, "orochi bench: --act-bits takes up to three of 16, 8 and auto, got '%s'\n", s);
    return ok && *n > 0;
}

static bool bench_list(const char *s, int *out, int *n, int max, long hi)
{
    *n = 0;
    char *dup = strdup(s), *save = NULL;
    for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long v;
        if (*n == max || !cli_int("bench", "list", tok, 1, hi, &v)) {
            free(dup);
            return false;
        }
        out[(*n)++] = (int)v;
    }
    free(dup);
    return *n > 0;
}


/* --bandwidth: measure the floor at each thread count afresh, cache it, print it. */
static int bench_bandwidth(const bench_opts *o)
{
    FILE *js = cli_open_append(o->json);
    printf("%-10s %10s %10s %10s\n", "threads", "read GB/s", "floor", "load avg");
    for (int i = 0; i < o->n_threads; i++) {
        fprintf(stderr, "orochi bench: measuring read bandwidth at %d threads...\n", o->threads[i]);
        double g = bw_measure(o->threads[i]), la = cli_loadavg();
        if (g <= 0) {
            fprintf(stderr, "orochi bench: out of memory for the bandwidth buffer\n");
            return 1;
        }
        double best = bw_store(o->threads[i], g);
        printf("%-10d %10.2f %10.2f %10.2f\n", o->threads[i], g, best, la);
        if (js)
            fprintf(js, "{\"bench\":\"bandwidth\",\"threads\":%d,\"gb_s\":%.3f,\"loadavg\":%.2f}\n",
                    o->threads[i], g, la);
    }
    if (js)
        fclose(js);
    fprintf(stderr, "orochi bench: floor = the best measured so far, cached in %s\n", bw_cache_path());
    return 0;
}

static void bench_usage(FILE *out)
{
    fprintf(out, "usage: orochi bench [--model M] [--threads 1,2] [--widths 1,2,4,8,16,32,64]\n"
                 "                    [--ctx 256] [--decode-tokens 64] [--rounds 3] [--reps 5]\n"
                 "                    [--kv f32|f16] [--act-bits auto|16|8|16,8,auto] [--json FILE]\n"
                 "       orochi bench --bandwidth [--threads 1,2] [--json FILE]\n"
                 "       orochi bench --tree-attention [--widths 4,8,16,32,64] [--heads 9] ...\n"
                 "       orochi bench --plans [--parts 2] [--plan hcmp|split|megatron:S]... ...\n"
                 "  Decode tok/s per thread count (median of --rounds, each after a fresh\n"
                 "  bandwidth measurement) and the W-token step-time curve at --ctx, with\n"
                 "  achieved GB/s against the floor (the best read bandwidth measured at that\n"
                 "  thread count) and against the bandwidth measured beside each round.\n"
                 "  --bandwidth measures the floor afresh and caches it in\n"
                 "  %s (other commands measure what is missing).\n"
                 "  --tree-attention (first option) times the tree part of attention: naive\n"
                 "  sparse vs katt_sparse / katt_causal_group vs dense (`orochi bench\n"
                 "  --tree-attention --help`).\n"
                 "  --plans (first option) times verification steps under partition plans, the\n"
                 "  parts as threads (`orochi bench --plans --help`).\n", bw_cache_path());
}


int cmd_bench(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--tree-attention"))
        return bench_tree_attention(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "--plans"))
        return bench_plans(argc - 1, argv + 1);
    bench_opts o = {.model = BENCH_DEFAULT_MODEL, .json = "bench/results/bench.jsonl",
                    .decode_tokens = 64, .ctx = 256, .reps = 5, .rounds = 3, .kv = KV_F32};
    bench_list("1,2", o.threads, &o.n_threads, 8, 1024);
    bench_list("1,2,4,8,16,32,64", o.widths, &o.n_widths, 8, KMAT_MAX_W);
    o.acts[0] = LLAMA_ACT_AUTO, o.n_acts = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            bench_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--bandwidth")) {
            o.bandwidth = true;
            continue;
        }
        if (!(v = cli_value("bench", argc, argv, &i)))
            return 2;
        if (!strcmp(a, "--model")) o.model = v;
        else if (!strcmp(a, "--json")) o.json = v;
        else if (!strcmp(a, "--threads")) {
            if (!bench_list(v, o.threads, &o.n_threads, 8, 1024))
                return 2;
        } else if (!strcmp(a, "--widths")) {
            if (!bench_list(v, o.widths, &o.n_widths, 8, KMAT_MAX_W))
                return 2;
        } else if (!strcmp(a, "--ctx")) {
            if (!cli_int("bench", a, v, 1, 1 << 20, &o.ctx))
                return 2;
        } else if (!strcmp(a, "--decode-tokens")) {
            if (!cli_int("bench", a, v, 1, 1 << 20, &o.decode_tokens))
                return 2;
        } else if (!strcmp(a, "--rounds")) {
            if (!cli_int("bench", a, v, 1, 16, &o.rounds))
                return 2;
        } else if (!strcmp(a, "--reps")) {
            if (!cli_int("bench", a, v, 1, 64, &o.reps))
                return 2;
        } else if (!strcmp(a, "--act-bits")) {
            if (!bench_acts(v, o.acts, &o.n_acts))
                return 2;
        } else if (!strcmp(a, "--kv")) {
            if (strcmp(v, "f32") && strcmp(v, "f16")) {
                fprintf(stderr, "orochi bench: --kv expects f32 or f16\n");
                return 2;
            }
            o.kv = strcmp(v, "f16") ? KV_F32 : KV_F16;
        } else {
            fprintf(stderr, "orochi bench: unknown option '%s'\n", a);
            bench_usage(stderr);
            return 2;
        }
    }
    if (o.bandwidth)
        return bench_bandwidth(&o);
    char err[512];
    llama_model *m = llama_model_load(o.model, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    FILE *js = cli_open_append(o.json);
    if (!js)
        fprintf(stderr, "orochi bench: cannot open %s for JSON lines; table only\n", o.json);
    double gb = (double)llama_model_step_bytes(m) / 1e9, macs = llama_model_step_macs(m);
    const char *name = strrchr(o.model, '/') ? strrchr(o.model, '/') + 1 : o.model;
    printf("model %s: %d layers, dim %d, vocab %d, %.1f MB of weights read per step\n\n", name,
           m->cfg.n_layers, m->cfg.dim, m->cfg.vocab, gb * 1e3);

    double floors[8];
    for (int i = 0; i < o.n_threads; i++)
        floors[i] = bw_floor(o.threads[i], NULL);
    printf("matmul kernels: %s; floor: the best read bandwidth measured at the same thread count "
           "(%s);\nbeside: the read bandwidth measured just before each decode round (median of "
           "%ld rounds)\n",
           kisa_name(kisa_current()), bw_cache_path(), o.rounds);
    printf("%-10s %4s %10s %10s %10s %10s %10s %10s\n", "threads", "act", "tok/s", "GB/s",
           "of floor", "floor GB/s", "of beside", "beside GB/s");
    int rc = 1;
    for (int i = 0; i < o.n_threads; i++) {
        double tps_r[3][16], bw_r[16], frac_r[3][16];
        int nr = o.rounds < 16 ? (int)o.rounds : 16;
        for (int r = 0; r < nr; r++) {
            fprintf(stderr, "orochi bench: round %d/%d at %d threads: bandwidth, then %ld tokens...\n",
                    r + 1, nr, o.threads[i], o.decode_tokens);
            bw_r[r] = bw_measure(o.threads[i]);
            if (bw_r[r] <= 0)
                goto done;
            for (int a = 0; a < o.n_acts; a++) {
                llama_model_set_act_bits(m, o.acts[a], err, sizeof err);
                if (bench_decode(m, &o, o.threads[i], &tps_r[a][r]))
                    goto done;
                frac_r[a][r] = tps_r[a][r] * gb / bw_r[r];
            }
            if (bw_r[r] > floors[i]) /* a better measurement raises the cached floor */
                floors[i] = bw_store(o.threads[i], bw_r[r]);
        }
        double beside = cli_median(bw_r, nr);
        for (int a = 0; a < o.n_acts; a++) {
            double tps = cli_median(tps_r[a], nr), frac = cli_median(frac_r[a], nr);
            printf("%-10d %4s %10.1f %10.2f %9.0f%% %10.1f %9.0f%% %10.1f\n", o.threads[i],
                   llama_act_bits_name(o.acts[a]), tps, tps * gb, 100 * tps * gb / floors[i], floors[i], 100 * frac,
                   beside);
            if (js)
                fprintf(js, "{\"bench\":\"decode\",\"model\":\"%s\",\"isa\":\"%s\",\"threads\":%d,"
                            "\"act_bits\":\"%s\",\"tok_s\":%.3f,\"gb_s\":%.3f,\"floor_gb_s\":%.2f,"
                            "\"of_floor\":%.4f,\"beside_gb_s\":%.2f,\"of_beside\":%.4f,"
                            "\"rounds\":%d,\"loadavg\":%.2f}\n",
                        name, kisa_name(kisa_current()), o.threads[i], llama_act_bits_name(o.acts[a]), tps, tps * gb,
                        floors[i], tps * gb / floors[i], beside, frac, nr, cli_loadavg());
        }
    }

    int threads = o.threads[o.n_threads - 1];
    llama_ctx_params cp = {.n_threads = threads, .max_width = KMAT_MAX_W,
                           .n_ctx = (int)o.ctx + KMAT_MAX_W, .kv = o.kv};
    llama_ctx *ctx = llama_ctx_new(m, &cp, err, sizeof err);
    float *logits = malloc((size_t)KMAT_MAX_W * (size_t)m->cfg.vocab * sizeof *logits);
    int32_t *ids = malloc((size_t)o.ctx * sizeof *ids);
    if (!ctx || !logits || !ids) {
        fprintf(stderr, "orochi bench: %s\n", ctx ? "out of memory" : err);
        goto width_done;
    }
    cli_synthetic_ids(ids, (int)o.ctx, m->cfg.vocab);
    fprintf(stderr, "orochi bench: filling a context of %ld tokens...\n", o.ctx);
    if (llama_prefill(ctx, ids, (int)o.ctx, logits, err, sizeof err)) {
        fprintf(stderr, "orochi bench: %s\n", err);
        goto width_done;
    }
    printf("\nbatch step time at context %ld, %d threads (median of %ld)\n", o.ctx, threads, o.reps);
    printf("%-6s %4s %10s %10s %10s %10s %10s %10s\n", "W", "act", "ms", "t(W)/t(1)", "tok/s",
           "GB/s", "GFLOP/s", "perfect");
    double t1[3] = {0, 0, 0}, best[3] = {0, 0, 0};
    int best_w[3] = {0, 0, 0};
    for (int i = 0; i < o.n_widths; i++) {
        int w = o.widths[i];
        double t[3];
        for (int a = 0; a < o.n_acts; a++) { /* interleaved: each precision at this width */
            llama_model_set_act_bits(m, o.acts[a], err, sizeof err);
            if (bench_width(m, &o, ctx, w, logits, &t[a]))
                goto width_done;
            if (i == 0)
                t1[a] = t[a] * (w == 1 ? 1 : 0);
        }
        for (int a = 0; a < o.n_acts; a++) {
            double ratio = t1[a] > 0 ? t[a] / t1[a] : NAN;
            /* a perfect drafter (every drafted token accepted, drafting free) turns a W-token
             * step into W tokens: W t(1) / t(W) is the most speculation can give at this width */
            double perfect = t1[a] > 0 ? w / ratio : NAN;
            if (perfect > best[a])
                best[a] = perfect, best_w[a] = w;
            printf("%-6d %4s %10.2f %10.2f %10.1f %10.2f %10.2f %9.2fx\n", w, llama_act_bits_name(o.acts[a]),
                   t[a] * 1e3, ratio, w / t[a], gb / t[a], 2 * macs * w / t[a] / 1e9, perfect);
            if (js)
                fprintf(js, "{\"bench\":\"width\",\"model\":\"%s\",\"threads\":%d,\"ctx\":%ld,"
                            "\"w\":%d,\"act_bits\":\"%s\",\"ms\":%.4f,\"ratio\":%.4f,\"gb_s\":%.3f,"
                            "\"gflop_s\":%.3f,\"perfect\":%.4f,\"loadavg\":%.2f}\n",
                        name, threads, o.ctx, w, llama_act_bits_name(o.acts[a]), t[a] * 1e3,
                        t1[a] > 0 ? ratio : -1.0, gb / t[a], 2 * macs * w / t[a] / 1e9,
                        t1[a] > 0 ? perfect : -1.0, cli_loadavg());
        }
    }
    for (int a = 0; a < o.n_acts; a++)
        if (best_w[a])
            printf("perfect-drafter bound (activations %s): at most %.2fx, at W = %d\n",
                   llama_act_bits_name(o.acts[a]), best[a], best_w[a]);
    rc = 0;
width_done:
    free(ids);
    free(logits);
    llama_ctx_destroy(&ctx);
done:
    if (js)
        fclose(js);
    llama_model_destroy(&m);
    if (!rc && js)
        fprintf(stderr, "orochi bench: JSON lines appended to %s\n", o.json);
    return rc;
}
