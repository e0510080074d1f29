/*
 * cli/cmd_run.c — `orochi run` (in-process sequential decoding, the baseline every speculative
 * mode is compared with) and `orochi eval` (teacher-forced logits of a token sequence, written as
 * raw float32 rows; the reference tests drive the engine through it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/bandwidth.h"
#include "cli/util.h"
#include "model/tokenizer.h"


typedef struct {
    const char *model, *prompt, *prompt_file, *chat_template;
    long n_predict, top_k, threads, seed;
    double temp, top_p;
    bool chat, print_ids, no_special;
    kv_type kv;
    int act_bits;
} run_opts;

static void run_usage(FILE *out)
{
    fprintf(out,
            "usage: orochi run --model M (--prompt P | --prompt-file F) [-n N] [--temp T]\n"
            "                  [--top-k K] [--top-p P] [--seed S] [--threads T] [--chat]\n"
            "                  [--print-ids] [--kv f32|f16] [--act-bits auto|16|8] [--no-special]\n"
            "                  [--chat-template FILE]\n"
            "  Sequential decoding in this process. Text streams to stdout (with --print-ids: the\n"
            "  generated ids, space-separated, one line); a speed summary goes to stderr.\n"
            "  --temp 0 is greedy (default 0.8, top-k 40, top-p 0.95, seed 1).\n"
            "  Special-token text in the prompt (e.g. <|im_start|>) becomes that token, as in\n"
            "  orochi tokenize and the group's completions; --no-special keeps it plain text.\n"
            "  --act-bits: the precision quantized matmuls quantize their activations to: auto\n"
            "  (default) 8 bits for K-quant matrices and 16 for the rest, or 8 or 16 for all\n"
            "  (orochi-coordinator --act-bits computes the same way).\n"
            "  --chat: the prompt as one user message of the file's chat template (a Jinja\n"
            "  template, run as written: docs/models.md); --chat-template FILE: this template\n"
            "  instead.\n");
}

/* --act-bits: 8, 16 or auto */
static bool parse_act_bits(const char *cmd, const char *s, int *bits)
{
    *bits = llama_act_bits_parse(s);
    if (*bits < 0) {
        fprintf(stderr, "orochi %s: --act-bits expects 8, 16 or auto, got '%s'\n", cmd, s);
        return false;
    }
    return true;
}

static bool parse_kv(const char *cmd, const char *s, kv_type *kv)
{
    if (!strcmp(s, "f32"))
        *kv = KV_F32;
    else if (!strcmp(s, "f16"))
        *kv = KV_F16;
    else {
        fprintf(stderr, "orochi %s: --kv expects f32 or f16, got '%s'\n", cmd, s);
        return false;
    }
    return true;
}

static int run_parse(int argc, char **argv, run_opts *o)
{
    *o = (run_opts){.n_predict = 128, .top_k = 40, .seed = 1, .temp = 0.8, .top_p = 0.95,
                    .kv = KV_F32, .act_bits = LLAMA_ACT_AUTO};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            run_usage(stdout);
            return 1;
        } else if (!strcmp(a, "--chat")) {
            o->chat = true;
        } else if (!strcmp(a, "--no-special")) {
            o->no_special = true;
        } else if (!strcmp(a, "--print-ids")) {
            o->print_ids = true;
        } else if (!(v = cli_value("run", argc, argv, &i))) {
            return 2;
        } else if (!strcmp(a, "--model") || !strcmp(a, "-m")) {
            o->model = v;
        } else if (!strcmp(a, "--prompt") || !strcmp(a, "-p")) {
            o->prompt = v;
        } else if (!strcmp(a, "--prompt-file")) {
            o->prompt_file = v;
        } else if (!strcmp(a, "--chat-template")) {
            o->chat_template = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (!cli_int("run", a, v, 0, 1 << 24, &o->n_predict))
                return 2;
        } else if (!strcmp(a, "--temp")) {
            if (!cli_float("run", a, v, 0, 100, &o->temp))
                return 2;
        } else if (!strcmp(a, "--top-k")) {
            if (!cli_int("run", a, v, 0, 1 << 24, &o->top_k))
                return 2;
        } else if (!strcmp(a, "--top-p")) {
            if (!cli_float("run", a, v, 0, 1, &o->top_p))
                return 2;
        } else if (!strcmp(a, "--seed")) {
            if (!cli_int("run", a, v, 0, 0x7fffffffL, &o->seed))
                return 2;
        } else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            if (!cli_int("run", a, v, 1, 1024, &o->threads))
                return 2;
        } else if (!strcmp(a, "--kv")) {
            if (!parse_kv("run", v, &o->kv))
                return 2;
        } else if (!strcmp(a, "--act-bits")) {
            if (!parse_act_bits("run", v, &o->act_bits))
                return 2;
        } else {
            fprintf(stderr, "orochi run: unknown option '%s'\n", a);
            run_usage(stderr);
            return 2;
        }
    }
    if (!o->model || (!o->prompt == !o->prompt_file)) {
        fprintf(stderr, "orochi run: --model and exactly one of --prompt / --prompt-file are required\n");
        run_usage(stderr);
        return 2;
    }
    return 0;
}

/* Tokenize the prompt (chat-wrapped if asked); returns the count or -1. */
static int run_encode_prompt(const tokenizer *tok, const run_opts *o, int32_t **ids)
{
    char *text = o->prompt_file ? cli_read_file(o->prompt_file, NULL) : strdup(o->prompt);
    if (!text) {
        fprintf(stderr, "orochi run: cannot read prompt file '%s'\n", o->prompt_file);
        return -1;
    }
    if (o->chat) {
        char *wrapped = tokenizer_chat_prompt(tok, text);
        free(text);
        text = wrapped;
        if (!text)
            return -1;
    }
    int needed = 0;
    size_t len = strlen(text);
    int cap = (int)len + 2;
    *ids = malloc((size_t)cap * sizeof **ids);
    int off = tokenizer_add_bos(tok) && tokenizer_bos(tok) >= 0 ? 1 : 0;
    /* one rule with orochi tokenize and the coordinator: special-token text is parsed */
    int n = *ids ? tokenizer_encode(tok, text, len, !o->no_special, *ids + off, cap - off, &needed)
                 : -1;
    free(text);
    if (n < 0) {
        fprintf(stderr, "orochi run: tokenizing the prompt failed\n");
        return -1;
    }
    if (off)
        (*ids)[0] = tokenizer_bos(tok);
    return n + off;
}

int cmd_run(int argc, char **argv)
{
    run_opts o;
    int rc = run_parse(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    char err[512];
    llama_model *m = llama_model_load(o.model, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    llama_model_set_act_bits(m, o.act_bits, err, sizeof err);
    tokenizer *tok = tokenizer_new(m->file, err, sizeof err);
    if (!tok || (o.chat_template && tokenizer_chat_template_file(tok, o.chat_template, err,
                                                                  sizeof err))) {
        fprintf(stderr, "orochi run: %s\n", err);
        tokenizer_destroy(&tok);
        llama_model_destroy(&m);
        return 2;
    }
    int32_t *prompt = NULL, *out_ids = NULL;
    float *logits = NULL;
    void *work = NULL;
    llama_ctx *ctx = NULL;
    rc = 1;
    int n_prompt = run_encode_prompt(tok, &o, &prompt);
    if (n_prompt <= 0) {
        if (n_prompt == 0)
            fprintf(stderr, "orochi run: the prompt is empty\n");
        rc = 2;
        goto done;
    }
    int n_ctx = n_prompt + (int)o.n_predict;
    if (n_ctx > m->cfg.ctx) {
        fprintf(stderr, "orochi run: prompt (%d tokens) + -n %ld exceeds the model context %d\n",
                n_prompt, o.n_predict, m->cfg.ctx);
        rc = 2;
        goto done;
    }
    llama_ctx_params cp = {.n_threads = (int)o.threads, .max_width = KMAT_MAX_W, .n_ctx = n_ctx,
                           .kv = o.kv};
    ctx = llama_ctx_new(m, &cp, err, sizeof err);
    logits = malloc((size_t)m->cfg.vocab * sizeof *logits);
    work = malloc((size_t)m->cfg.vocab * 8);
    out_ids = malloc(((size_t)o.n_predict + 1) * sizeof *out_ids);
    if (!ctx || !logits || !work || !out_ids) {
        fprintf(stderr, "orochi run: %s\n", ctx ? "out of memory" : err);
        goto done;
    }

    double t0 = cli_now();
    if (llama_prefill(ctx, prompt, n_prompt, logits, err, sizeof err)) {
        fprintf(stderr, "orochi run: %s\n", err);
        goto done;
    }
    double t_prompt = cli_now() - t0;

    sampler smp;
    sampler_init(&smp, (float)o.temp, (int)o.top_k, (float)o.top_p, (uint64_t)o.seed);
    int n_out = 0;
    double t1 = cli_now();
    for (; n_out < o.n_predict; n_out++) {
        int32_t id = sampler_sample(&smp, logits, m->cfg.vocab, work);
        out_ids[n_out] = id;
        if (!o.print_ids) {
            const char *piece;
            size_t len = tokenizer_is_special(tok, id) ? 0 : tokenizer_piece(tok, id, &piece);
            fwrite(piece, 1, len, stdout);
            fflush(stdout);
        }
        if (tokenizer_is_eog(tok, id) || n_out + 1 == o.n_predict) {
            n_out++;
            break;
        }
        int32_t zero = 0;
        llama_batch b = {.n = 1, .tokens = &id};
        if (llama_forward(ctx, &b, logits, err, sizeof err) || llama_commit(ctx, &zero, 1, err, sizeof err)) {
            fprintf(stderr, "orochi run: %s\n", err);
            goto done;
        }
    }
    double t_decode = cli_now() - t1;
    if (o.print_ids) {
        for (int i = 0; i < n_out; i++)
            printf(i ? " %d" : "%d", out_ids[i]);
        printf("\n");
    } else {
        printf("\n");
    }
    fflush(stdout);
    /* each decode step after the first token runs one forward */
    int steps = n_out > 1 ? n_out - 1 : 0;
    double dec_tps = steps && t_decode > 0 ? steps / t_decode : 0;
    double gbs = dec_tps * (double)llama_model_step_bytes(m) / 1e9;
    double floor = bw_floor(llama_ctx_threads(ctx), NULL);
    fprintf(stderr,
            "orochi run: prompt %d tok, %.1f prompt tok/s | decode %d tok, %.1f decode tok/s, "
            "%.2f GB/s weights (%.0f%% of the %.1f GB/s measured floor) | threads %d, %s kernels | "
            "peak RSS %.1f MiB\n",
            n_prompt, t_prompt > 0 ? n_prompt / t_prompt : 0, n_out, dec_tps, gbs,
            floor > 0 ? 100.0 * gbs / floor : 0, floor, llama_ctx_threads(ctx),
            kisa_name(kisa_current()), (double)cli_peak_rss() / (1 << 20));
    rc = 0;
done:
    llama_ctx_destroy(&ctx);
    free(prompt);
    free(out_ids);
    free(logits);
    free(work);
    tokenizer_destroy(&tok);
    llama_model_destroy(&m);
    return rc;
}

/* ===== eval ===== */

int cmd_eval(int argc, char **argv)
{
    const char *model = NULL, *ids_s = NULL, *out = NULL;
    long batch = 1, threads = 0;
    kv_type kv = KV_F32;
    int act_bits = LLAMA_ACT_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: orochi eval --model M --ids \"I J K ...\" --out FILE [--batch W]\n"
                   "                   [--threads T] [--kv f32|f16] [--act-bits auto|16|8]\n"
                   "  Teacher-forced forward over the ids in chains of W tokens; FILE gets n x vocab\n"
                   "  little-endian float32 logits, row i after consuming ids[0..i].\n");
            return 0;
        }
        if (!(v = cli_value("eval", argc, argv, &i)))
            return 2;
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--ids"))
            ids_s = v;
        else if (!strcmp(a, "--out"))
            out = v;
        else if (!strcmp(a, "--batch")) {
            if (!cli_int("eval", a, v, 1, KMAT_MAX_W, &batch))
                return 2;
        } else if (!strcmp(a, "--threads")) {
            if (!cli_int("eval", a, v, 1, 1024, &threads))
                return 2;
        } else if (!strcmp(a, "--kv")) {
            if (!parse_kv("eval", v, &kv))
                return 2;
        } else if (!strcmp(a, "--act-bits")) {
            if (!parse_act_bits("eval", v, &act_bits))
                return 2;
        } else {
            fprintf(stderr, "orochi eval: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!model || !ids_s || !out) {
        fprintf(stderr, "orochi eval: --model, --ids and --out are required\n");
        return 2;
    }
    int32_t *ids = NULL;
    int n = cli_parse_ids("eval", ids_s, &ids);
    if (n <= 0) {
        if (n == 0)
            fprintf(stderr, "orochi eval: --ids is empty\n");
        free(ids);
        return 2;
    }
    char err[512];
    llama_model *m = llama_model_load(model, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        free(ids);
        return 2;
    }
    llama_model_set_act_bits(m, act_bits, err, sizeof err);
    int rc = 1;
    llama_ctx_params cp = {.n_threads = (int)threads, .max_width = (int)batch, .n_ctx = n, .kv = kv};
    llama_ctx *ctx = llama_ctx_new(m, &cp, err, sizeof err);
    float *logits = malloc((size_t)batch * (size_t)m->cfg.vocab * sizeof *logits);
    FILE *f = fopen(out, "wb");
    if (!ctx || !logits || !f) {
        fprintf(stderr, "orochi eval: %s\n", !ctx ? err : !f ? "cannot open --out file" : "out of memory");
        goto done;
    }
    int32_t path[KMAT_MAX_W];
    for (int i = 0; i < KMAT_MAX_W; i++)
        path[i] = i;
    for (int done_n = 0; done_n < n;) {
        int w = n - done_n < batch ? n - done_n : (int)batch;
        llama_batch b = {.n = w, .tokens = ids + done_n};
        if (llama_forward(ctx, &b, logits, err, sizeof err) || llama_commit(ctx, path, w, err, sizeof err)) {
            fprintf(stderr, "orochi eval: %s\n", err);
            rc = 2;
            goto done;
        }
        if (fwrite(logits, sizeof *logits, (size_t)w * (size_t)m->cfg.vocab, f) != (size_t)w * (size_t)m->cfg.vocab) {
            fprintf(stderr, "orochi eval: write failed\n");
            goto done;
        }
        done_n += w;
    }
    rc = 0;
done:
    if (f && fclose(f) && !rc) {
        fprintf(stderr, "orochi eval: write failed\n");
        rc = 1;
    }
    free(logits);
    llama_ctx_destroy(&ctx);
    llama_model_destroy(&m);
    free(ids);
    return rc;
}
