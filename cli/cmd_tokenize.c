/*
 * cli/cmd_tokenize — `orochi tokenize`: show how a model's own tokenizer splits a text.
 *
 *   orochi tokenize --model M [--no-special] [--no-bos] [--ids-only] [--chat] [--] TEXT
 *   orochi tokenize --model M [--no-special] [--no-bos] [--chat] --jsonl FILE
 *
 * The GGUF file is opened with gguf_open() and only its tokenizer.* metadata is used
 * (tokenizer_new()); no weights are touched. TEXT ("-" reads stdin) is encoded with special
 * tokens written literally (e.g. "<|im_end|>") mapped to their ids unless --no-special, with the
 * BOS token first when the file asks for it (tokenizer.ggml.add_bos_token) unless --no-bos, and
 * with --chat the text is first wrapped in the file's chat template as one user message.
 * Output: one line per token, "id<TAB>piece", the piece's bytes shown with C-style escapes for
 * control bytes, backslash and invalid UTF-8; or with --ids-only the ids space-separated on one
 * line. --jsonl reads FILE, one JSON string per line (parsed with cJSON), and prints one line of
 * space-separated ids per input line, so a test can tokenize a corpus in a single process.
 * Exit status: 0 ok, 1 runtime failure (I/O, memory), 2 bad usage or malformed model file.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "model/gguf.h"
#include "model/tokenizer.h"

typedef struct {
    const char *model;
    const char *text;
    const char *jsonl;
    bool special;
    bool bos;
    bool ids_only;
    bool chat;
    const char *template_file; /* --chat-template: this Jinja template instead of the file's */
    const char *render;        /* --render-chat: a JSON array of messages to render */
} tokenize_opts;

static void tokenize_usage(FILE *out)
{
    fprintf(out,
            "usage: orochi tokenize --model M [options] [--] TEXT\n"
            "       orochi tokenize --model M [options] --jsonl FILE\n"
            "\n"
            "Encode TEXT (\"-\" reads stdin) with the model's own tokenizer and print one line per\n"
            "token: id, a tab, and the token's bytes (control bytes, backslash and invalid UTF-8\n"
            "escaped).\n"
            "\n"
            "options:\n"
            "  --model M      GGUF model file (required)\n"
            "  --no-special   treat special-token text such as <|im_end|> as plain text\n"
            "  --no-bos       do not prepend BOS even if the model's tokenizer asks for it\n"
            "  --ids-only     print only the ids, space-separated, on one line\n"
            "  --chat         wrap TEXT in the model's chat template as one user message\n"
            "  --chat-template FILE  use the Jinja chat template in FILE instead of the model's\n"
            "  --render-chat FILE    print the chat template's text for the conversation in FILE\n"
            "                 (a JSON array of {\"role\", \"content\"} objects, ending with the\n"
            "                 assistant prompt), or a JSON object of the template's variables\n"
            "                 ({\"messages\": [...], \"tools\": [...], \"enable_thinking\": false};\n"
            "                 messages with tool_calls and tool turns) instead of tokenizing;\n"
            "                 exit 2 if the template cannot be run, with the reason\n"
            "  --jsonl FILE   each line of FILE is a JSON string; print one line of ids per line\n"
            "  -h, --help     show this help\n"
            "\n"
            "exit status: 0 ok, 1 runtime failure, 2 bad usage or malformed model file\n");
}

/* Encode text (after the chat wrap when asked); returns a malloc'd id array, or NULL. */
static int32_t *tokenize_encode(const tokenizer *tok, const tokenize_opts *o, const char *text,
                                size_t len, int *n_out)
{
    char *wrapped = NULL;
    if (o->chat) {
        wrapped = tokenizer_chat_prompt(tok, text);
        if (!wrapped)
            return NULL;
        text = wrapped;
        len = strlen(wrapped);
    }
    int cap = (int)(len < 1000000 ? len : 1000000) + 16;
    int32_t *ids = NULL;
    int n = -1;
    for (int attempt = 0; attempt < 2; attempt++) {
        int32_t *p = realloc(ids, (size_t)cap * sizeof *ids);
        if (!p)
            break;
        ids = p;
        int bos = o->bos && tokenizer_add_bos(tok) && tokenizer_bos(tok) >= 0;
        int needed = 0;
        n = tokenizer_encode(tok, text, len, o->special, ids + bos, cap - bos, &needed);
        if (n >= 0) {
            if (bos)
                ids[0] = tokenizer_bos(tok);
            n += bos;
            break;
        }
        if (needed < 0)
            break; /* out of memory inside the tokenizer */
        cap = needed + 1;
    }
    free(wrapped);
    if (n < 0) {
        free(ids);
        return NULL;
    }
    *n_out = n;
    return ids;
}

/* Print bytes with escapes: printable ASCII and valid UTF-8 as is, the rest as \n \t \r \\ \xNN */
static void tokenize_print_piece(const char *p, size_t n)
{
    const unsigned char *s = (const unsigned char *)p;
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        if (c == '\\') {
            fputs("\\\\", stdout);
            i++;
        } else if (c == '\n') {
            fputs("\\n", stdout);
            i++;
        } else if (c == '\t') {
            fputs("\\t", stdout);
            i++;
        } else if (c == '\r') {
            fputs("\\r", stdout);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            printf("\\x%02x", c);
            i++;
        } else if (c < 0x80) {
            putchar(c);
            i++;
        } else {
            size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
            bool ok = len > 0 && i + len <= n;
            for (size_t k = 1; ok && k < len; k++)
                ok = (s[i + k] & 0xC0) == 0x80;
            if (ok) {
                fwrite(s + i, 1, len, stdout);
                i += len;
            } else {
                printf("\\x%02x", c);
                i++;
            }
        }
    }
}

static void tokenize_print_ids(const int32_t *ids, int n)
{
    for (int i = 0; i < n; i++)
        printf(i ? " %d" : "%d", ids[i]);
    putchar('\n');
}

static int tokenize_jsonl(const tokenizer *tok, const tokenize_opts *o)
{
    FILE *fp = fopen(o->jsonl, "rb");
    if (!fp) {
        fprintf(stderr, "orochi tokenize: cannot open %s\n", o->jsonl);
        return 1;
    }
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    long lineno = 0;
    int status = 0;
    while ((got = getline(&line, &line_cap, fp)) >= 0) {
        lineno++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
            line[--got] = '\0';
        if (got == 0) {
            putchar('\n');
            continue;
        }
        cJSON *js = cJSON_ParseWithLength(line, (size_t)got);
        if (!js || !cJSON_IsString(js)) {
            fprintf(stderr, "orochi tokenize: %s:%ld: not a JSON string\n", o->jsonl, lineno);
            cJSON_Delete(js);
            status = 2;
            break;
        }
        const char *text = cJSON_GetStringValue(js);
        int n = 0;
        int32_t *ids = tokenize_encode(tok, o, text, strlen(text), &n);
        cJSON_Delete(js);
        if (!ids) {
            fprintf(stderr, "orochi tokenize: %s:%ld: out of memory\n", o->jsonl, lineno);
            status = 1;
            break;
        }
        tokenize_print_ids(ids, n);
        free(ids);
    }
    free(line);
    fclose(fp);
    return status;
}

static int tokenize_use_template(tokenizer *tok, const char *path)
{
    char err[512];
    int rc = tokenizer_chat_template_file(tok, path, err, sizeof err);
    if (rc)
        fprintf(stderr, "orochi tokenize: %s\n", err);
    return rc;
}

/* --render-chat: the template's text for a JSON array of messages, or for a JSON object of the
 * template's variables ({"messages": [...], "tools": [...], "enable_thinking": false}). */
static int tokenize_render(const tokenizer *tok, const char *path)
{
    size_t len;
    char *js = cli_read_file(path, &len);
    if (!js) {
        fprintf(stderr, "orochi tokenize: cannot read %s\n", path);
        return 2;
    }
    cJSON *arr = cJSON_ParseWithLength(js, len);
    if (cJSON_IsObject(arr)) { /* the template's variables: messages, tools, ... */
        cJSON_Delete(arr);
        char err[512];
        char *out = tokenizer_chat_render_vars(tok, js, len, err, sizeof err);
        free(js);
        if (!out) {
            fprintf(stderr, "orochi tokenize: %s\n", err);
            return 2;
        }
        fwrite(out, 1, strlen(out), stdout);
        free(out);
        return 0;
    }
    free(js);
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : -1;
    if (n < 0) {
        fprintf(stderr, "orochi tokenize: %s: not a JSON array of messages nor an object of "
                        "template variables\n", path);
        cJSON_Delete(arr);
        return 2;
    }
    const char **roles = malloc((size_t)(n ? n : 1) * sizeof *roles);
    const char **contents = malloc((size_t)(n ? n : 1) * sizeof *contents);
    int status = 0;
    for (int i = 0; i < n && roles && contents; i++) {
        cJSON *m = cJSON_GetArrayItem(arr, i);
        roles[i] = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
        contents[i] = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "content"));
        if (!roles[i] || !contents[i]) {
            fprintf(stderr, "orochi tokenize: %s: message %d needs string role and content\n",
                    path, i);
            status = 2;
            break;
        }
    }
    if (!status && roles && contents) {
        char err[512];
        char *out = tokenizer_chat_render_err(tok, n, roles, contents, err, sizeof err);
        if (out) {
            fwrite(out, 1, strlen(out), stdout);
            free(out);
        } else {
            fprintf(stderr, "orochi tokenize: %s\n", err);
            status = 2;
        }
    }
    free(roles);
    free(contents);
    cJSON_Delete(arr);
    return status;
}

static char *tokenize_read_stdin(size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n - 1, stdin);
        n += got;
        if (got == 0)
            break;
        if (cap - n - 1 == 0) {
            char *p = realloc(buf, cap * 2);
            if (!p) {
                free(buf);
                return NULL;
            }
            buf = p;
            cap *= 2;
        }
    }
    if (buf) {
        buf[n] = '\0';
        *len = n;
    }
    return buf;
}

int cmd_tokenize(int argc, char **argv)
{
    tokenize_opts o = {.special = true, .bos = true};
    bool options_done = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options_done || a[0] != '-' || a[1] == '\0') {
            if (o.text) {
                fprintf(stderr, "orochi tokenize: more than one TEXT ('%s'); quote the text\n", a);
                return 2;
            }
            o.text = a;
        } else if (!strcmp(a, "--")) {
            options_done = true;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            tokenize_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model") || !strcmp(a, "--jsonl") ||
                   !strcmp(a, "--chat-template") || !strcmp(a, "--render-chat")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "orochi tokenize: %s needs a value\n", a);
                return 2;
            }
            const char **dst = !strcmp(a, "--model")           ? &o.model
                               : !strcmp(a, "--jsonl")         ? &o.jsonl
                               : !strcmp(a, "--chat-template") ? &o.template_file
                                                               : &o.render;
            *dst = argv[++i];
        } else if (!strcmp(a, "--no-special")) {
            o.special = false;
        } else if (!strcmp(a, "--no-bos")) {
            o.bos = false;
        } else if (!strcmp(a, "--ids-only")) {
            o.ids_only = true;
        } else if (!strcmp(a, "--chat")) {
            o.chat = true;
        } else {
            fprintf(stderr, "orochi tokenize: unknown option '%s' (use -- before a TEXT that "
                            "starts with '-')\n", a);
            tokenize_usage(stderr);
            return 2;
        }
    }
    if (!o.model) {
        fprintf(stderr, "orochi tokenize: --model is required\n");
        tokenize_usage(stderr);
        return 2;
    }
    if (!o.render && !o.text == !o.jsonl) {
        fprintf(stderr, "orochi tokenize: give exactly one of TEXT or --jsonl FILE\n");
        tokenize_usage(stderr);
        return 2;
    }

    char err[512];
    gguf_file *f = gguf_open(o.model, err, sizeof err);
    if (!f) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    tokenizer *tok = tokenizer_new(f, err, sizeof err);
    if (!tok) {
        fprintf(stderr, "%s: %s\n", o.model, err);
        gguf_close(&f);
        return 2;
    }

    int status = 0;
    if (o.template_file && tokenize_use_template(tok, o.template_file)) {
        status = 2;
    } else if (o.render) {
        status = tokenize_render(tok, o.render);
    } else if (o.jsonl) {
        status = tokenize_jsonl(tok, &o);
    } else {
        char *owned = NULL;
        size_t len;
        const char *text = o.text;
        if (!strcmp(o.text, "-")) {
            owned = tokenize_read_stdin(&len);
            text = owned;
        } else {
            len = strlen(text);
        }
        int n = 0;
        int32_t *ids = text ? tokenize_encode(tok, &o, text, len, &n) : NULL;
        if (!ids) {
            fprintf(stderr, "orochi tokenize: out of memory\n");
            status = 1;
        } else if (o.ids_only) {
            tokenize_print_ids(ids, n);
        } else {
            for (int i = 0; i < n; i++) {
                const char *p;
                size_t pl = tokenizer_piece(tok, ids[i], &p);
                printf("%d\t", ids[i]);
                tokenize_print_piece(p, pl);
                putchar('\n');
            }
        }
        free(ids);
        free(owned);
    }
    if (fflush(stdout) != 0 && status == 0) {
        fprintf(stderr, "orochi tokenize: write error\n");
        status = 1;
    }
    tokenizer_destroy(&tok);
    gguf_close(&f);
    return status;
}
