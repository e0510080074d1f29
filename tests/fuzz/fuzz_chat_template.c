/*
 * tests/fuzz/fuzz_chat_template — libFuzzer target for chat prompt rendering: the GGUF's
 * tokenizer.chat_template as the tokenizer reads it (ChatML or not, its literal default system
 * message: model/tokenizer.c tokenizer_new / tok_template_system), the conversation rendering
 * (tokenizer_chat_render, tokenizer_chat_prompt, and the coordinator's coord_render_prompt around
 * them), then the stop-string cut of the engine's output text (coord_text_flush) — both through
 * coordinator/coord_output.h.
 *
 * Input: byte 0 = flags, bytes 1-2 = template length L (little-endian), L template bytes, then
 * records separated by NUL bytes. A record's first byte b picks what it is (b % 5): 0 a system,
 * 1 a user, 2 an assistant, 3 a developer message whose content is the rest of the record, 4 a
 * stop string. Flags: bits 0-2 the vocabulary (tests/fuzz/fuzz_vocab.h; 5-7 wrap), bit 3 no
 * tokenizer.chat_template key at all, bits 4-7 the seed of the piece sizes below.
 *
 * Checked: tokenizer_new accepts any template. With a template, the rendering is the Jinja
 * interpreter's (model/jinja.c, fuzzed here on arbitrary template bytes): it gives a text or
 * refuses with a reason that names the chat template (never a crash, a hang past its step bound,
 * or a leak), and coord_render_prompt gives the same text or the same refusal; the last message's
 * bytes, read as the template's JSON variables (tokenizer_chat_render_vars), render or are
 * refused naming the template or the variables. Without one, the
 * rendering equals, byte for byte, what an independent reading of tokenizer.h's built-in rule
 * gives: the Llama-2 form ([INST] USER [/INST] per user turn, assistant turns between, a system
 * message folded into the next user turn as <<SYS>>, or a turn of its own when an assistant turn
 * or the end comes first). One user message renders as tokenizer_chat_prompt does. The rendered prompt tokenizes (parse_special, as engine_slot_start does) into at
 * most strlen + 8 ids, the buffer engine_slot_start gives it. The rendered prompt is then played as
 * generated text, in pieces, through coord_text_flush with the request's stop strings: the text the
 * request receives must be exactly the text before the first stop string found once the piece
 * completing it has arrived (all of it when none is), and never contain a stop string.
 *
 * Build and run: `make fuzz`, then tests/fuzz/run_fuzz.sh (seeds:
 * tests/fuzz/corpus/chat_template/).
 */
#define _GNU_SOURCE /* memmem */
#include "coordinator/coord_output.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "model/tokenizer.h"

#include "tests/fuzz/fuzz_common.h"
#include "tests/fuzz/fuzz_vocab.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_MAX_MESSAGES 16

static const tokenizer *fz_tok;              /* the tokenizer coord_render_prompt renders with */
static tokenizer *fz_full[FUZZ_VOCAB_COUNT]; /* the fixtures, for the tokenization check */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    for (int v = 0; v < FUZZ_VOCAB_COUNT; v++)
        fz_full[v] = fuzz_vocab_tokenizer(v, NULL, 0);
    return 0;
}

/* The template is read by tokenizer_new, whatever the vocabulary; a one-token one makes that
 * cheap (the fixtures' 300 tokens would cost most of each run). The rendering does not depend on
 * the vocabulary; the tokenization check uses the fixture. */
static tokenizer *fz_template_tokenizer(bool gpt2, const void *tmpl, size_t tlen)
{
    fuzz_gguf g;
    fuzz_gguf_begin(&g);
    fuzz_vocab v = {0};
    fuzz_vocab_add(&v, "a", 1, 1, 0);
    fuzz_gguf_vocab(&g, gpt2 ? "gpt2" : "llama", NULL, &v, NULL, NULL, 0);
    if (gpt2) /* byte-level BPE needs the key, even empty */
        fuzz_gguf_kv_strs(&g, "tokenizer.ggml.merges", NULL, NULL, 0);
    if (tmpl)
        fuzz_gguf_kv_str(&g, "tokenizer.chat_template", tmpl, tlen);
    fuzz_gguf_finish(&g);
    char err[256];
    gguf_file *f = gguf_open_memory(g.p, g.len, "fuzz-template", err, sizeof err);
    if (!f)
        fuzz_fail("gguf_open_memory refused a well-formed file: %s", err);
    tokenizer *tok = tokenizer_new(f, err, sizeof err);
    if (!tok)
        fuzz_fail("tokenizer_new refused a template (%zu bytes): %s", tlen, err);
    gguf_close(&f);
    free(g.p);
    fuzz_vocab_free(&v);
    return tok;
}

/* A growable string for the reference renderings. */
typedef struct {
    char *p;
    size_t len, cap;
} fz_str;

static void fz_add(fz_str *s, const char *t)
{
    size_t n = strlen(t);
    if (s->len + n + 1 > s->cap) {
        s->cap = (s->len + n + 1) * 2;
        s->p = realloc(s->p, s->cap);
        if (!s->p)
            abort();
    }
    memcpy(s->p + s->len, t, n + 1);
    s->len += n;
}

static bool fz_role_system(const char *role)
{
    return !strcmp(role, "system") || !strcmp(role, "developer");
}

/* The text the request must receive: `text` cut at the first stop string found by the flush
 * that follows each piece (flush points `ends`, the last one == len). */
static size_t fz_stop_reference(const char *text, size_t len, const size_t *ends, int n_ends,
                                char *const *stops, int n_stop)
{
    for (int k = 0; k < n_ends; k++) {
        size_t best = SIZE_MAX;
        for (int i = 0; i < n_stop; i++) {
            const char *h = memmem(text, ends[k], stops[i], strlen(stops[i]));
            if (h && (size_t)(h - text) < best)
                best = (size_t)(h - text);
        }
        if (best != SIZE_MAX)
            return best;
    }
    return len;
}

/* One input's tokenizer, message contents and stop strings, given back. */
static void fz_release(tokenizer **tok, coord_message *msgs, const coord_params *prm, char **stops)
{
    tokenizer_destroy(tok);
    fz_tok = NULL;
    for (int i = 0; i < prm->n_messages; i++)
        free(msgs[i].content);
    for (int i = 0; i < prm->n_stop; i++)
        free(stops[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    uint8_t flags = data[0];
    int which = (flags & 7) % FUZZ_VOCAB_COUNT;
    bool has_tmpl = !(flags & 8);
    size_t tlen = (size_t)data[1] | (size_t)data[2] << 8;
    if (tlen > size - 3)
        tlen = size - 3;
    const char *tmpl = (const char *)data + 3;

    /* the records */
    coord_params prm = {.kind = COORD_REQ_CHAT};
    coord_message msgs[FZ_MAX_MESSAGES];
    const char *roles[FZ_MAX_MESSAGES], *contents[FZ_MAX_MESSAGES];
    char *stops[COORD_MAX_STOP];
    static const char *const role_names[4] = {"system", "user", "assistant", "developer"};
    const uint8_t *p = data + 3 + tlen, *end = data + size;
    while (p < end) {
        const uint8_t *z = memchr(p, 0, (size_t)(end - p));
        size_t n = z ? (size_t)(z - p) : (size_t)(end - p);
        if (n >= 1) {
            if (p[0] % 5 == 4) {
                if (n > 1 && prm.n_stop < COORD_MAX_STOP)
                    stops[prm.n_stop++] = fuzz_strndup(p + 1, n - 1);
            } else if (prm.n_messages < FZ_MAX_MESSAGES) {
                int i = prm.n_messages++;
                msgs[i] = (coord_message){(char *)role_names[p[0] % 5], fuzz_strndup(p + 1, n - 1)};
                roles[i] = msgs[i].role;
                contents[i] = msgs[i].content;
            }
        }
        p += n + 1;
    }
    prm.messages = msgs;
    for (int i = 0; i < prm.n_stop; i++)
        prm.stop[i] = stops[i];

    tokenizer *tok =
        fz_template_tokenizer(which <= FUZZ_VOCAB_BPE_LLAMA3, has_tmpl ? tmpl : NULL, tlen);
    fz_tok = tok;

    /* the reference rendering (the built-in rule, without a template) */
    fz_str all = {0};
    fz_add(&all, "");
    if (has_tmpl) {
        char err[512] = "", err2[512] = "";
        char *got = tokenizer_chat_render_err(tok, prm.n_messages, roles, contents, err,
                                              sizeof err);
        char *text = coord_render_prompt(fz_tok, &prm, err2, sizeof err2);
        if (!got != !text || (got && strcmp(got, text)) || (!got && strcmp(err, err2)))
            fuzz_fail("coord_render_prompt differs from tokenizer_chat_render_err (%s / %s)", err, err2);
        if (!got && strncmp(err, "chat template", 13) && !strstr(err, "out of memory"))
            fuzz_fail("a refused template's reason does not name the chat template: %s", err);
        free(got);
        free(text);
        if (prm.n_messages > 0) { /* the last message's bytes as the template's JSON variables */
            const char *vars = contents[prm.n_messages - 1];
            char *out = tokenizer_chat_render_vars(tok, vars, strlen(vars), err, sizeof err);
            if (!out && strncmp(err, "chat template", 13) && strncmp(err, "chat variables", 14) &&
                !strstr(err, "out of memory"))
                fuzz_fail("a refused rendering's reason names neither the template nor the "
                          "variables: %s", err);
            free(out);
        }
        free(all.p);
        fz_release(&tok, msgs, &prm, stops);
        return 0;
    }
    {
        const char *fold = NULL;
        for (int i = 0; i <= prm.n_messages; i++) {
            bool user = i < prm.n_messages && !strcmp(roles[i], "user");
            if (i < prm.n_messages && fz_role_system(roles[i])) {
                fold = contents[i];
                continue;
            }
            if (fold && !user) { /* nothing to fold it into: its own turn */
                fz_add(&all, all.len ? " [INST] <<SYS>>\n" : "[INST] <<SYS>>\n");
                fz_add(&all, fold);
                fz_add(&all, "\n<</SYS>>\n\n [/INST]");
                fold = NULL;
            }
            if (i == prm.n_messages)
                break;
            if (user) {
                fz_add(&all, all.len ? " [INST] " : "[INST] ");
                if (fold) {
                    fz_add(&all, "<<SYS>>\n");
                    fz_add(&all, fold);
                    fz_add(&all, "\n<</SYS>>\n\n");
                }
                fold = NULL;
                fz_add(&all, contents[i]);
                fz_add(&all, " [/INST]");
            } else {
                fz_add(&all, " ");
                fz_add(&all, contents[i]);
            }
        }
    }
    char *got = tokenizer_chat_render(tok, prm.n_messages, roles, contents);
    if (!got || strcmp(got, all.p))
        fuzz_fail("tokenizer_chat_render of %d messages: got %zu bytes '%.120s', want %zu bytes "
                  "'%.120s'",
                  prm.n_messages, got ? strlen(got) : 0, got ? got : "(null)", all.len, all.p);
    free(got);
    if (prm.n_messages == 1 && !strcmp(roles[0], "user")) {
        got = tokenizer_chat_prompt(tok, contents[0]);
        if (!got || strcmp(got, all.p))
            fuzz_fail("tokenizer_chat_prompt differs from the one-message rendering");
        free(got);
    }
    char rerr[512];
    char *text = coord_render_prompt(fz_tok, &prm, rerr, sizeof rerr);
    if (!text || strcmp(text, all.p))
        fuzz_fail("coord_render_prompt differs from tokenizer_chat_render");

    /* engine_slot_start's tokenization of it: parse_special, into strlen + 8 ids (less the BOS slot) */
    size_t len = strlen(text);
    const tokenizer *full = fz_full[which];
    int off = tokenizer_add_bos(full) && tokenizer_bos(full) >= 0 ? 1 : 0, needed = 0;
    tokenizer_encode(full, text, len, true, NULL, 0, &needed);
    if (needed < 0 || (size_t)needed > len + 8 - (size_t)off)
        fuzz_fail("the rendered prompt of %zu bytes needs %d ids; engine_slot_start holds %zu", len,
                  needed, len + 8 - (size_t)off);

    /* the rendered text as generated output, through the stop strings */
    coord_request *req = coord_request_new(COORD_REQ_CHAT);
    if (!req)
        abort();
    coord_text out = {0};
    for (int i = 0; i < prm.n_stop; i++)
        if (strlen(prm.stop[i]) > out.max_stop)
            out.max_stop = strlen(prm.stop[i]);
    out.max_stop = out.max_stop ? out.max_stop - 1 : 0; /* as engine_slot_start sets it */
    size_t ends[512];
    int n_ends = 0;
    unsigned seed = flags >> 4;
    bool stopped = false;
    for (size_t at = 0; at < len && !stopped;) {
        seed = seed * 1103515245u + 12345u;
        size_t piece = 1 + (seed >> 16) % (n_ends < 500 ? 6 : 1 << 20);
        if (piece > len - at)
            piece = len - at;
        if (coord_text_add(&out, text + at, piece))
            abort();
        at += piece;
        ends[n_ends++] = at;
        stopped = coord_text_flush(&out, req, &prm, false);
    }
    coord_text_flush(&out, req, &prm, true); /* engine_slot_finish's: after a stop it must add nothing */
    size_t want = fz_stop_reference(text, len, ends, n_ends, prm.stop, prm.n_stop);
    size_t glen = 0;
    char *gtext = coord_request_text(req, &glen);
    if (!gtext || glen != want || memcmp(gtext, text, want))
        fuzz_fail("stop strings: the request got %zu bytes, want the first %zu of %zu", glen, want,
                  len);
    if (stopped != (want < len))
        fuzz_fail("stop strings: text cut at %zu of %zu, coord_text_flush reported a stop: %d", want, len,
                  stopped);
    for (int i = 0; i < prm.n_stop; i++)
        if (memmem(gtext, glen, prm.stop[i], strlen(prm.stop[i])))
            fuzz_fail("stop strings: the request's text contains stop string %d", i);
    free(gtext);
    free(out.text);
    coord_request_unref(&req);

    free(text);
    free(all.p);
    fz_release(&tok, msgs, &prm, stops);
    return 0;
}
