/*
 * cli/cmd_generate.c — `orochi generate` and `orochi chat`: clients of a running coordinator's
 * HTTP API (docs/http-api.md), over the small HTTP client in cli/http_client.
 *
 * generate sends one completion (or, with --chat, one chat turn) and prints the text, either at
 * the end or, with --stream, piece by piece as the server-sent events arrive; --print-ids prints
 * the generated token ids from the answer's `orochi` object instead. chat keeps the conversation
 * as a list of messages and streams every reply. Both print a one-line summary to stderr: tokens,
 * tokens per second as seen by the client, and the server's speculation statistics (steps, mean
 * accepted tokens per step, draft kinds).
 *
 * Exit status: 0 ok, 1 the server could not be reached or answered with an error, 2 bad usage.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/commands.h"
#include "cli/http_client.h"
#include "cli/util.h"
#include "base/buf.h"

typedef struct {
    const char *cmd; /* "generate" | "chat", for messages */
    const char *url, *api_key, *prompt, *prompt_file, *system;
    const char *stop[4];
    int n_stop;
    long n_predict, top_k, seed, timeout_s;
    double temp, top_p;
    bool has_n, has_temp, has_top_k, has_top_p, has_seed;
    bool stream, chat, print_ids;
} gen_opts;

/* What one exchange with the server produced. */
typedef struct {
    const gen_opts *o;
    bool echo;        /* print text as it arrives (streaming) */
    char *text;       /* the generated text, accumulated */
    size_t text_len, text_cap;
    cJSON *final;     /* the whole answer, or the final stream chunk (has usage and orochi) */
    char error[512];  /* an error the server reported */
    bool done_seen, oom;
    double t_start, t_first, t_end;
    hcli_sse sse;
} gen_result;

static void gen_usage(FILE *out, const char *cmd)
{
    if (!strcmp(cmd, "chat"))
        fprintf(out,
                "usage: orochi chat --url URL [--system S] [-n N] [--temp T] [--top-p P] [--top-k K]\n"
                "                   [--seed S] [--api-key K] [--timeout SECONDS]\n"
                "  An interactive chat with a running coordinator: one line per user turn, replies\n"
                "  stream as they are generated. '/exit' or end of input ends it, '/reset' forgets\n"
                "  the conversation. The URL may also come from $OROCHI_URL, the key from\n"
                "  $OROCHI_API_KEY.\n");
    else
        fprintf(out,
                "usage: orochi generate --url URL (--prompt P | --prompt-file F) [-n N] [--temp T]\n"
                "                       [--top-p P] [--top-k K] [--seed S] [--stop S]... [--stream]\n"
                "                       [--chat [--system S]] [--print-ids] [--api-key K]\n"
                "                       [--timeout SECONDS]\n"
                "  One request to a running coordinator (POST URL/v1/completions, or\n"
                "  /v1/chat/completions with --chat). Prints the text (as it arrives with --stream;\n"
                "  with --print-ids the generated token ids instead) and a summary on stderr.\n"
                "  Unset options take the server's defaults (128 tokens, temperature 1; 0 is greedy).\n"
                "  The URL may also come from $OROCHI_URL, the key from $OROCHI_API_KEY.\n");
}

/* 0 ok, 1 --help was printed, 2 bad usage. */
static int gen_parse(const char *cmd, int argc, char **argv, gen_opts *o)
{
    *o = (gen_opts){.cmd = cmd, .url = getenv("OROCHI_URL"), .api_key = getenv("OROCHI_API_KEY"),
                    .timeout_s = 600, .chat = !strcmp(cmd, "chat")};
    bool is_chat_cmd = o->chat;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            gen_usage(stdout, cmd);
            return 1;
        } else if (!is_chat_cmd && !strcmp(a, "--stream")) {
            o->stream = true;
        } else if (!is_chat_cmd && !strcmp(a, "--chat")) {
            o->chat = true;
        } else if (!is_chat_cmd && !strcmp(a, "--print-ids")) {
            o->print_ids = true;
        } else if (!(v = cli_value(cmd, argc, argv, &i))) {
            return 2;
        } else if (!strcmp(a, "--url")) {
            o->url = v;
        } else if (!strcmp(a, "--api-key")) {
            o->api_key = v;
        } else if (!is_chat_cmd && (!strcmp(a, "--prompt") || !strcmp(a, "-p"))) {
            o->prompt = v;
        } else if (!is_chat_cmd && !strcmp(a, "--prompt-file")) {
            o->prompt_file = v;
        } else if (!strcmp(a, "--system")) {
            o->system = v;
        } else if (!is_chat_cmd && !strcmp(a, "--stop")) {
            if (o->n_stop == 4) {
                fprintf(stderr, "orochi %s: at most 4 --stop sequences\n", cmd);
                return 2;
            }
            o->stop[o->n_stop++] = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict") || !strcmp(a, "--max-tokens")) {
            if (!cli_int(cmd, a, v, 1, 1 << 24, &o->n_predict))
                return 2;
            o->has_n = true;
        } else if (!strcmp(a, "--temp")) {
            if (!cli_float(cmd, a, v, 0, 2, &o->temp))
                return 2;
            o->has_temp = true;
        } else if (!strcmp(a, "--top-p")) {
            if (!cli_float(cmd, a, v, 1e-9, 1, &o->top_p))
                return 2;
            o->has_top_p = true;
        } else if (!strcmp(a, "--top-k")) {
            if (!cli_int(cmd, a, v, 0, 1 << 24, &o->top_k))
                return 2;
            o->has_top_k = true;
        } else if (!strcmp(a, "--seed")) {
            if (!cli_int(cmd, a, v, 0, 0x7fffffffL, &o->seed))
                return 2;
            o->has_seed = true;
        } else if (!strcmp(a, "--timeout")) {
            if (!cli_int(cmd, a, v, 0, 86400, &o->timeout_s))
                return 2;
        } else {
            fprintf(stderr, "orochi %s: unknown option '%s'\n", cmd, a);
            gen_usage(stderr, cmd);
            return 2;
        }
    }
    if (!o->url) {
        fprintf(stderr, "orochi %s: --url is required (or set $OROCHI_URL), e.g. "
                        "http://127.0.0.1:8080\n", cmd);
        return 2;
    }
    hcli_url u;
    char err[512];
    if (hcli_url_parse(o->url, &u, err, sizeof err)) {
        fprintf(stderr, "orochi %s: %s\n", cmd, err);
        return 2;
    }
    if (!is_chat_cmd && !o->prompt == !o->prompt_file) {
        fprintf(stderr, "orochi %s: exactly one of --prompt / --prompt-file is required\n", cmd);
        gen_usage(stderr, cmd);
        return 2;
    }
    if (o->system && !o->chat) {
        fprintf(stderr, "orochi %s: --system needs --chat\n", cmd);
        return 2;
    }
    return 0;
}

/* ==== one exchange ============================================================================ */

static void gen_add_text(gen_result *r, const char *s, size_t n)
{
    if (!n)
        return;
    if (r->echo && !r->o->print_ids) {
        fwrite(s, 1, n, stdout);
        fflush(stdout);
    }
    if (buf_append(&r->text, &r->text_len, &r->text_cap, s, n, 1024))
        r->oom = true;
}

/* The text of choices[0] in an answer or chunk: .text, .message.content or .delta.content. */
static const char *gen_choice_text(const cJSON *js, const cJSON **choice_out)
{
    const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(js, "choices"), 0);
    if (choice_out)
        *choice_out = choice;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(choice, "text");
    if (!cJSON_IsString(t)) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(choice, "message");
        if (!m)
            m = cJSON_GetObjectItemCaseSensitive(choice, "delta");
        t = cJSON_GetObjectItemCaseSensitive(m, "content");
    }
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* The message of an OpenAI-style error object, if `js` is one. */
static bool gen_error_message(const cJSON *js, char *out, size_t len)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(js, "error");
    if (!e)
        return false;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
    snprintf(out, len, "%s", cJSON_IsString(m) ? m->valuestring : "unspecified error");
    return true;
}

static int gen_on_event(void *ctx, const char *data, size_t len)
{
    gen_result *r = ctx;
    if (!strcmp(data, "[DONE]")) {
        r->done_seen = true;
        return 0;
    }
    cJSON *js = cJSON_ParseWithLength(data, len);
    if (!js) {
        snprintf(r->error, sizeof r->error, "the server sent an event that is not JSON: %.80s", data);
        return 1;
    }
    if (gen_error_message(js, r->error, sizeof r->error)) {
        cJSON_Delete(js);
        return 0;
    }
    const cJSON *choice = NULL;
    const char *text = gen_choice_text(js, &choice);
    if (text) {
        if (!r->t_first && *text)
            r->t_first = cli_now();
        gen_add_text(r, text, strlen(text));
    }
    if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(choice, "finish_reason"))) {
        cJSON_Delete(r->final);
        r->final = js;
        return 0;
    }
    cJSON_Delete(js);
    return 0;
}

static int gen_on_body(void *ctx, const char *data, size_t len)
{
    gen_result *r = ctx;
    return hcli_sse_feed(&r->sse, data, len);
}

/* Results of gen_exchange (the reason is printed already). */
enum { GEN_OK, GEN_ANSWERED_ERROR, GEN_TRANSPORT };

/* Posts `body` and collects the answer into *r (free with gen_result_free in every case).
 * GEN_ANSWERED_ERROR: the server reported an error (HTTP status or error event);
 * GEN_TRANSPORT: it could not be reached or the connection failed. */
static int gen_exchange(const gen_opts *o, const char *body, bool stream, gen_result *r)
{
    *r = (gen_result){.o = o, .echo = stream};
    hcli_sse_init(&r->sse, gen_on_event, r);
    hcli_request rq = {.path = o->chat ? "/v1/chat/completions" : "/v1/completions",
                       .api_key = o->api_key, .body = body, .body_len = strlen(body),
                       .timeout_ms = (int)o->timeout_s * 1000,
                       .on_body = stream ? gen_on_body : NULL, .ctx = r};
    hcli_response resp;
    char err[512];
    r->t_start = cli_now();
    int rc = hcli_do(o->url, &rq, &resp, err, sizeof err);
    r->t_end = cli_now();
    hcli_sse_free(&r->sse);
    if (rc && !(rc == HCLI_ABORTED && r->error[0])) {
        fprintf(stderr, "%sorochi %s: %s\n", r->text_len ? "\n" : "", o->cmd, err);
        hcli_response_free(&resp);
        return GEN_TRANSPORT;
    }
    int status = GEN_OK;
    if (resp.status != 200) {
        cJSON *js = resp.body ? cJSON_Parse(resp.body) : NULL;
        char msg[512];
        if (!gen_error_message(js, msg, sizeof msg))
            snprintf(msg, sizeof msg, "%.200s", resp.body ? resp.body : "(no body)");
        fprintf(stderr, "orochi %s: the server answered %d: %s\n", o->cmd, resp.status, msg);
        cJSON_Delete(js);
        status = GEN_ANSWERED_ERROR;
    } else if (!stream) {
        r->final = resp.body ? cJSON_Parse(resp.body) : NULL;
        const char *text = r->final ? gen_choice_text(r->final, NULL) : NULL;
        if (!text) {
            fprintf(stderr, "orochi %s: the server's answer has no choices[0] text\n", o->cmd);
            status = GEN_ANSWERED_ERROR;
        } else {
            gen_add_text(r, text, strlen(text));
        }
    } else if (r->error[0]) {
        fprintf(stderr, "%sorochi %s: the generation failed: %s\n", r->text_len ? "\n" : "", o->cmd,
                r->error);
        status = GEN_ANSWERED_ERROR;
    } else if (!r->done_seen || !r->final) {
        fprintf(stderr, "%sorochi %s: the stream ended without its final event\n",
                r->text_len ? "\n" : "", o->cmd);
        status = GEN_TRANSPORT;
    }
    if (!status && r->oom) {
        fprintf(stderr, "orochi %s: out of memory\n", o->cmd);
        status = GEN_TRANSPORT;
    }
    hcli_response_free(&resp);
    return status;
}

static double gen_number(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static void gen_print_ids(const gen_result *r)
{
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(r->final, "orochi"), "token_ids");
    const cJSON *id;
    int i = 0;
    cJSON_ArrayForEach(id, ids)
        printf(i++ ? " %d" : "%d", (int)id->valuedouble);
    printf("\n");
}

/* "orochi generate: prompt 12 tok | 64 tok in 1.20 s, 53.3 tok/s (first token 0.08 s) |
 *  steps 20, mean accepted 3.20, drafts ngram,model | finish length" */
static void gen_summary(const gen_result *r)
{
    const cJSON *usage = cJSON_GetObjectItemCaseSensitive(r->final, "usage");
    const cJSON *oro = cJSON_GetObjectItemCaseSensitive(r->final, "orochi");
    const cJSON *choice = NULL;
    gen_choice_text(r->final, &choice);
    const cJSON *fin = cJSON_GetObjectItemCaseSensitive(choice, "finish_reason");
    double n = gen_number(usage, "completion_tokens"), secs = r->t_end - r->t_start;
    char drafts[256] = "";
    const cJSON *k;
    cJSON_ArrayForEach(k, cJSON_GetObjectItemCaseSensitive(oro, "draft_kinds")) {
        if (cJSON_IsString(k) && strlen(drafts) + strlen(k->valuestring) + 2 < sizeof drafts) {
            if (drafts[0])
                strcat(drafts, ",");
            strcat(drafts, k->valuestring);
        }
    }
    char first[64] = "";
    if (r->t_first)
        snprintf(first, sizeof first, " (first token %.2f s)", r->t_first - r->t_start);
    fprintf(stderr,
            "orochi %s: prompt %.0f tok | %.0f tok in %.2f s, %.1f tok/s%s | steps %.0f, mean "
            "accepted %.2f, drafts %s | finish %s\n",
            r->o->cmd, gen_number(usage, "prompt_tokens"), n, secs, secs > 0 ? n / secs : 0, first,
            gen_number(oro, "steps"), gen_number(oro, "mean_accepted"), drafts[0] ? drafts : "none",
            cJSON_IsString(fin) ? fin->valuestring : "?");
}

static void gen_result_free(gen_result *r)
{
    free(r->text);
    cJSON_Delete(r->final);
    *r = (gen_result){0};
}

/* The sampling fields the user set; the server's defaults apply to the rest. */
static void gen_add_sampling(const gen_opts *o, cJSON *body)
{
    if (o->has_n)
        cJSON_AddNumberToObject(body, "max_tokens", (double)o->n_predict);
    if (o->has_temp)
        cJSON_AddNumberToObject(body, "temperature", o->temp);
    if (o->has_top_p)
        cJSON_AddNumberToObject(body, "top_p", o->top_p);
    if (o->has_top_k)
        cJSON_AddNumberToObject(body, "top_k", (double)o->top_k);
    if (o->has_seed)
        cJSON_AddNumberToObject(body, "seed", (double)o->seed);
    if (o->n_stop) {
        cJSON *stop = cJSON_AddArrayToObject(body, "stop");
        for (int i = 0; i < o->n_stop; i++)
            cJSON_AddItemToArray(stop, cJSON_CreateString(o->stop[i]));
    }
}

static cJSON *gen_message(const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    return m;
}

/* ==== the commands ============================================================================ */

int cmd_generate(int argc, char **argv)
{
    gen_opts o;
    int rc = gen_parse("generate", argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    char *prompt = o.prompt_file ? cli_read_file(o.prompt_file, NULL) : strdup(o.prompt);
    if (!prompt) {
        fprintf(stderr, "orochi generate: cannot read prompt file '%s'\n", o.prompt_file);
        return 2;
    }
    cJSON *body = cJSON_CreateObject();
    if (o.chat) {
        cJSON *msgs = cJSON_AddArrayToObject(body, "messages");
        if (o.system)
            cJSON_AddItemToArray(msgs, gen_message("system", o.system));
        cJSON_AddItemToArray(msgs, gen_message("user", prompt));
    } else {
        cJSON_AddStringToObject(body, "prompt", prompt);
    }
    free(prompt);
    gen_add_sampling(&o, body);
    cJSON_AddBoolToObject(body, "stream", o.stream);
    char *text = cJSON_PrintUnformatted(body);
    cJSON_Delete(body);
    if (!text) {
        fprintf(stderr, "orochi generate: out of memory\n");
        return 1;
    }
    gen_result r;
    rc = gen_exchange(&o, text, o.stream, &r) == GEN_OK ? 0 : 1;
    cJSON_free(text);
    if (!rc) {
        if (o.print_ids)
            gen_print_ids(&r);
        else if (o.stream)
            printf("\n");
        else
            printf("%s\n", r.text ? r.text : "");
        fflush(stdout);
        gen_summary(&r);
    }
    gen_result_free(&r);
    return rc;
}

int cmd_chat(int argc, char **argv)
{
    gen_opts o;
    int rc = gen_parse("chat", argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    cJSON *history = cJSON_CreateArray();
    if (o.system)
        cJSON_AddItemToArray(history, gen_message("system", o.system));
    bool tty = isatty(STDIN_FILENO);
    char *line = NULL;
    size_t cap = 0;
    rc = 0;
    for (;;) {
        if (tty) {
            fprintf(stderr, "> ");
            fflush(stderr);
        }
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0)
            break;
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = 0;
        if (!n)
            continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit"))
            break;
        if (!strcmp(line, "/reset")) {
            while (cJSON_GetArraySize(history) > (o.system ? 1 : 0))
                cJSON_DeleteItemFromArray(history, cJSON_GetArraySize(history) - 1);
            fprintf(stderr, "(conversation cleared)\n");
            continue;
        }
        cJSON_AddItemToArray(history, gen_message("user", line));
        cJSON *body = cJSON_CreateObject();
        cJSON_AddItemReferenceToObject(body, "messages", history);
        gen_add_sampling(&o, body);
        cJSON_AddBoolToObject(body, "stream", true);
        char *text = cJSON_PrintUnformatted(body);
        cJSON_Delete(body);
        if (!text) {
            fprintf(stderr, "orochi chat: out of memory\n");
            rc = 1;
            break;
        }
        gen_result r;
        int turn = gen_exchange(&o, text, true, &r);
        cJSON_free(text);
        if (turn == GEN_OK) {
            printf("\n");
            fflush(stdout);
            cJSON_AddItemToArray(history, gen_message("assistant", r.text ? r.text : ""));
            gen_summary(&r);
        } else {
            /* the turn did not happen: forget it, so the user can retry or rephrase */
            cJSON_DeleteItemFromArray(history, cJSON_GetArraySize(history) - 1);
        }
        gen_result_free(&r);
        if (turn == GEN_TRANSPORT) { /* the server is gone: nothing more to talk to */
            rc = 1;
            break;
        }
    }
    free(line);
    cJSON_Delete(history);
    return rc;
}
