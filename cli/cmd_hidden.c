/*
 * cli/cmd_hidden.c — `orochi hidden`: the training data for Medusa heads (tools/train_medusa.py).
 *
 * For every prompt line the target generates greedily (temperature 0, exactly the tokens of
 * `orochi run --temp 0`), and for every position of prompt + generation the command records the
 * token id and the target's final hidden state h there: the residual stream after the last layer,
 * before the output norm (llama_ctx_shared(ctx)->x + i * dim after llama_forward), the state a
 * Medusa head reads at run time. The last generated token is fed through the target as well, so
 * every recorded token has its h. The trainer pairs h at position p with the tokens at p + 2 + k.
 *
 * File (all little-endian; docs/medusa.md "Training"):
 *   header   char magic[4] = "OMHS", u32 version = 1, u32 dim, u32 vocab, u32 n_seq
 *   n_seq x  u32 n, u32 n_prompt, int32 tokens[n], float32 hidden[n][dim]
 * n_prompt counts the prompt tokens (BOS included when the tokenizer adds one); tokens[n_prompt..n)
 * are the target's greedy continuation (ending at EOS when it came first).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "model/tokenizer.h"

#define HID_MAGIC "OMHS"
#define HID_VERSION 1u

typedef struct {
    int32_t *ids;
    int n;
} hid_prompt;

static void hid_usage(FILE *out)
{
    fprintf(out,
            "usage: orochi hidden --model M --prompts FILE --out DATA.bin [-n N] [--threads T]\n"
            "                     [--chat] [--no-special]\n"
            "  Medusa training data: for every non-empty line of FILE (a plain-text prompt) the\n"
            "  target generates N tokens greedily (default 128, fewer at EOS); DATA.bin gets the\n"
            "  token ids and the target's final hidden states (before the output norm) of every\n"
            "  position of prompt + generation. Format: docs/medusa.md, section Training.\n"
            "  --chat        wrap each line in the model's chat template first\n"
            "  --no-special  keep special-token text (e.g. <|im_start|>) in prompts plain text\n"
            "  Greedy decoding: the output depends only on the model and the prompts.\n"
            "  Progress (tokens/s) goes to stderr. Exit 2 for bad options or input.\n");
}

static bool hid_u32(FILE *f, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return fwrite(b, 1, 4, f) == 4;
}

/* Read FILE's non-empty lines (a trailing '\r' dropped) and tokenize them. Returns the count, or
 * -1 after printing one line. */
static int hid_read_prompts(const char *path, const tokenizer *tok, bool chat, bool special,
                            hid_prompt **out)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "orochi hidden: cannot read --prompts file '%s'\n", path);
        return -1;
    }
    hid_prompt *ps = NULL;
    int n = 0, cap = 0, lineno = 0, rc = -1;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    while ((len = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (len == 0)
            continue;
        if (memchr(line, 0, (size_t)len)) {
            fprintf(stderr, "orochi hidden: %s:%d: the line holds a NUL byte\n", path, lineno);
            goto done;
        }
        char *text = chat ? tokenizer_chat_prompt(tok, line) : line;
        if (!text) {
            fprintf(stderr, "orochi hidden: out of memory\n");
            goto done;
        }
        size_t tlen = strlen(text);
        int off = tokenizer_add_bos(tok) && tokenizer_bos(tok) >= 0 ? 1 : 0;
        int tcap = (int)tlen + 2, needed = 0;
        int32_t *ids = malloc((size_t)tcap * sizeof *ids);
        int got =
            ids ? tokenizer_encode(tok, text, tlen, special, ids + off, tcap - off, &needed) : -1;
        if (chat)
            free(text);
        if (got < 0) {
            free(ids);
            fprintf(stderr, "orochi hidden: %s:%d: tokenizing the prompt failed\n", path, lineno);
            goto done;
        }
        if (off)
            ids[0] = tokenizer_bos(tok);
        if (got + off == 0) {
            free(ids);
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            hid_prompt *np = realloc(ps, (size_t)cap * sizeof *np);
            if (!np) {
                free(ids);
                fprintf(stderr, "orochi hidden: out of memory\n");
                goto done;
            }
            ps = np;
        }
        ps[n++] = (hid_prompt){ids, got + off};
    }
    if (ferror(f)) {
        fprintf(stderr, "orochi hidden: error reading '%s'\n", path);
        goto done;
    }
    rc = n;
done:
    free(line);
    fclose(f);
    if (rc < 0) {
        for (int i = 0; i < n; i++)
            free(ps[i].ids);
        free(ps);
        ps = NULL;
    }
    *out = ps;
    return rc;
}

int cmd_hidden(int argc, char **argv)
{
    const char *model_path = NULL, *prompts_path = NULL, *out_path = NULL;
    long n_predict = 128, threads = 0;
    bool chat = false, special = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            hid_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--chat")) {
            chat = true;
            continue;
        }
        if (!strcmp(a, "--no-special")) {
            special = false;
            continue;
        }
        if (!(v = cli_value("hidden", argc, argv, &i)))
            return 2;
        bool ok = true;
        if (!strcmp(a, "--model") || !strcmp(a, "-m"))
            model_path = v;
        else if (!strcmp(a, "--prompts"))
            prompts_path = v;
        else if (!strcmp(a, "--out"))
            out_path = v;
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict"))
            ok = cli_int("hidden", a, v, 0, 1 << 20, &n_predict);
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t"))
            ok = cli_int("hidden", a, v, 1, 1024, &threads);
        else {
            fprintf(stderr, "orochi hidden: unknown option '%s'\n", a);
            hid_usage(stderr);
            return 2;
        }
        if (!ok)
            return 2;
    }
    if (!model_path || !prompts_path || !out_path) {
        fprintf(stderr, "orochi hidden: --model, --prompts and --out are required\n");
        hid_usage(stderr);
        return 2;
    }

    char err[512];
    llama_model *m = llama_model_load(model_path, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    tokenizer *tok = tokenizer_new(m->file, err, sizeof err);
    if (!tok) {
        fprintf(stderr, "%s\n", err);
        llama_model_destroy(&m);
        return 2;
    }
    int rc = 1;
    hid_prompt *ps = NULL;
    llama_ctx *ctx = NULL;
    float *logits = NULL, *hidden = NULL;
    int32_t *seq = NULL;
    FILE *f = NULL;
    char *tmp_path = NULL;
    int n_ps = hid_read_prompts(prompts_path, tok, chat, special, &ps);
    if (n_ps < 0) {
        rc = 2;
        goto done;
    }
    if (n_ps == 0) {
        fprintf(stderr, "orochi hidden: '%s' holds no prompt (no non-empty line)\n", prompts_path);
        rc = 2;
        goto done;
    }
    const int dim = m->cfg.dim, vocab = m->cfg.vocab;
    int longest = 0;
    for (int i = 0; i < n_ps; i++)
        if (ps[i].n > longest)
            longest = ps[i].n;
    /* + 1: the last generated token is fed too, for its hidden state */
    long need = (long)longest + n_predict + 1;
    if (need > m->cfg.ctx) {
        fprintf(stderr,
                "orochi hidden: the longest prompt (%d tokens) + -n %ld + 1 exceeds the model "
                "context %d\n",
                longest, n_predict, m->cfg.ctx);
        rc = 2;
        goto done;
    }
    llama_ctx_params cp = {
        .n_threads = (int)threads, .max_width = KMAT_MAX_W, .n_ctx = (int)need, .kv = KV_F32};
    ctx = llama_ctx_new(m, &cp, err, sizeof err);
    logits = malloc((size_t)KMAT_MAX_W * (size_t)vocab * sizeof *logits);
    hidden = malloc((size_t)need * (size_t)dim * sizeof *hidden);
    seq = malloc((size_t)need * sizeof *seq);
    size_t plen = strlen(out_path);
    tmp_path = malloc(plen + 32);
    if (!ctx || !logits || !hidden || !seq || !tmp_path) {
        fprintf(stderr, "orochi hidden: %s\n", ctx ? "out of memory" : err);
        goto done;
    }
    snprintf(tmp_path, plen + 32, "%s.%d.tmp", out_path, (int)getpid());
    f = fopen(tmp_path, "wb");
    if (!f) {
        fprintf(stderr, "orochi hidden: cannot write '%s'\n", out_path);
        goto done;
    }
    bool wok = fwrite(HID_MAGIC, 1, 4, f) == 4 && hid_u32(f, HID_VERSION) &&
               hid_u32(f, (uint32_t)dim) && hid_u32(f, (uint32_t)vocab) &&
               hid_u32(f, (uint32_t)n_ps);

    const llama_shared *sh = llama_ctx_shared(ctx);
    const int32_t eos = tokenizer_eos(tok);
    int32_t path[KMAT_MAX_W];
    for (int i = 0; i < KMAT_MAX_W; i++)
        path[i] = i;
    const bool tty = isatty(2);
    double t0 = cli_now(), t_last = t0;
    long tot_tokens = 0, tot_gen = 0;
    for (int s = 0; s < n_ps && wok; s++) {
        llama_ctx_reset(ctx);
        int n = ps[s].n;
        memcpy(seq, ps[s].ids, (size_t)n * sizeof *seq);
        /* prefill in chains of max_width tokens, as llama_prefill, keeping every row's state */
        for (int done = 0; done < n;) {
            int w = n - done < KMAT_MAX_W ? n - done : KMAT_MAX_W;
            bool last = done + w == n;
            llama_batch b = {.n = w, .tokens = seq + done, .logits_from = w - 1};
            if (llama_forward(ctx, &b, last ? logits : NULL, err, sizeof err) ||
                llama_commit(ctx, path, w, err, sizeof err)) {
                fprintf(stderr, "orochi hidden: prompt %d: %s\n", s + 1, err);
                goto done;
            }
            memcpy(hidden + (size_t)done * dim, sh->x, (size_t)w * dim * sizeof *hidden);
            done += w;
        }
        /* greedy continuation; each new token is fed (for its state) even when it is the last */
        for (long g = 0; g < n_predict; g++) {
            int32_t id = sampler_argmax(logits, vocab);
            seq[n] = id;
            int32_t zero = 0;
            llama_batch b = {.n = 1, .tokens = &seq[n]};
            bool stop = id == eos || g + 1 == n_predict;
            if (llama_forward(ctx, &b, stop ? NULL : logits, err, sizeof err) ||
                llama_commit(ctx, &zero, 1, err, sizeof err)) {
                fprintf(stderr, "orochi hidden: prompt %d: %s\n", s + 1, err);
                goto done;
            }
            memcpy(hidden + (size_t)n * dim, sh->x, (size_t)dim * sizeof *hidden);
            n++;
            tot_gen++;
            if (stop)
                break;
        }
        tot_tokens += n;
        wok = hid_u32(f, (uint32_t)n) && hid_u32(f, (uint32_t)ps[s].n) &&
              fwrite(seq, sizeof *seq, (size_t)n, f) == (size_t)n &&
              fwrite(hidden, sizeof *hidden, (size_t)n * dim, f) == (size_t)n * dim;
        double now = cli_now();
        if (s + 1 == n_ps || now - t_last >= (tty ? 0.5 : 10.0)) {
            t_last = now;
            fprintf(stderr,
                    "%sorochi hidden: %d/%d prompts, %ld tokens (%ld generated), %.1f tok/s "
                    "(%.1f generated tok/s)%s",
                    tty ? "\r" : "", s + 1, n_ps, tot_tokens, tot_gen,
                    now > t0 ? tot_tokens / (now - t0) : 0.0, now > t0 ? tot_gen / (now - t0) : 0.0,
                    tty ? "" : "\n");
        }
    }
    if (tty)
        fprintf(stderr, "\n");
    if (fclose(f))
        wok = false;
    f = NULL;
    if (!wok || rename(tmp_path, out_path)) {
        fprintf(stderr, "orochi hidden: write failed: '%s'\n", out_path);
        remove(tmp_path);
        goto done;
    }
    double el = cli_now() - t0;
    fprintf(stderr,
            "orochi hidden: wrote %s: %d sequences, %ld tokens (%ld generated), dim %d, %.1f MiB "
            "in %.1f s (%.1f tok/s, %.1f generated tok/s, threads %d)\n",
            out_path, n_ps, tot_tokens, tot_gen, dim,
            (20.0 + 8.0 * n_ps + (double)tot_tokens * (4.0 + 4.0 * dim)) / (1 << 20), el,
            el > 0 ? tot_tokens / el : 0.0, el > 0 ? tot_gen / el : 0.0, llama_ctx_threads(ctx));
    rc = 0;
done:
    if (f) {
        fclose(f);
        remove(tmp_path);
    }
    free(tmp_path);
    free(seq);
    free(hidden);
    free(logits);
    llama_ctx_destroy(&ctx);
    if (ps)
        for (int i = 0; i < n_ps; i++)
            free(ps[i].ids);
    free(ps);
    tokenizer_destroy(&tok);
    llama_model_destroy(&m);
    return rc;
}
