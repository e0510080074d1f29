/*
 * model/chat.c — chat templates of the tokenizer (interface: model/tokenizer.h, tokenizer_chat_*):
 * the file's Jinja template (tokenizer.chat_template, or one given with --chat-template) run by
 * the interpreter of model/jinja.c, with the "developer" role as a system turn; a file without a
 * template gets the built-in ChatML or Llama 2 [INST] rendering; and the JSON-variables form
 * (tools, tool calls, enable_thinking) for templates that take more than messages.
 */
#define _GNU_SOURCE /* memmem */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "model/jinja.h"
#include "model/tokenizer_internal.h"

char *tokenizer_chat_prompt(const tokenizer *tok, const char *user_message)
{
    const char *role = "user";
    return tokenizer_chat_render(tok, 1, &role, &user_message);
}

static bool tok_role_system(const char *role)
{
    return !strcmp(role, "system") || !strcmp(role, "developer");
}

/* The text of token id (NULL terminated, arena-free copy), or "" when id < 0. */
static char *tok_text_dup(const tokenizer *tok, int32_t id)
{
    size_t len = 0;
    const char *t = id >= 0 ? tok_text(tok, id, &len) : "";
    char *s = malloc(len + 1);
    if (s) {
        memcpy(s, t, len);
        s[len] = '\0';
    }
    return s;
}

static char *tok_chat_builtin(const tokenizer *tok, int n, const char *const *roles,
                              const char *const *contents);

char *tokenizer_chat_render_err(const tokenizer *tok, int n, const char *const *roles,
                                const char *const *contents, char *err, size_t errlen)
{
    if (!tok->chat_template) {
        char *out = tok_chat_builtin(tok, n, roles, contents);
        if (!out)
            snprintf(err, errlen, "out of memory");
        return out;
    }
    /* the OpenAI "developer" role is a system turn to the templates (which know system) */
    jinja_message *m = malloc((size_t)(n ? n : 1) * sizeof *m);
    char *bos = tok_text_dup(tok, tok->bos), *eos = tok_text_dup(tok, tok->eos);
    char *out = NULL;
    if (m && bos && eos) {
        for (int i = 0; i < n; i++)
            m[i] = (jinja_message){tok_role_system(roles[i]) ? "system" : roles[i], contents[i]};
        out = jinja_render_chat(tok->chat_template, tok->chat_template_len, m, n, true, bos, eos,
                                err, errlen);
    } else {
        snprintf(err, errlen, "out of memory");
    }
    free(m);
    free(bos);
    free(eos);
    return out;
}

char *tokenizer_chat_render_vars(const tokenizer *tok, const char *vars, size_t len, char *err,
                                 size_t errlen)
{
    if (!tok->chat_template) {
        snprintf(err, errlen,
                 "the model file has no chat template (tokenizer.chat_template): "
                 "give one with --chat-template FILE");
        return NULL;
    }
    char *bos = tok_text_dup(tok, tok->bos), *eos = tok_text_dup(tok, tok->eos);
    char *out = NULL;
    if (bos && eos)
        out = jinja_render_vars(tok->chat_template, tok->chat_template_len, vars, len, bos, eos,
                                err, errlen);
    else
        snprintf(err, errlen, "out of memory");
    free(bos);
    free(eos);
    return out;
}

bool tokenizer_chat_mentions(const tokenizer *tok, const char *name)
{
    return tok->chat_template &&
           memmem(tok->chat_template, tok->chat_template_len, name, strlen(name)) != NULL;
}

int tokenizer_chat_template_file(tokenizer *tok, const char *path, char *err, size_t errlen)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        snprintf(err, errlen, "cannot open the chat template %s", path);
        return -1;
    }
    void *buf = NULL;
    size_t cap = 0, n = 0;
    bool ok = true;
    for (size_t got = 1; ok && got; n += got) { /* templates of up to 16 MiB */
        ok = n < ((size_t)1 << 24) && !buf_grow(&buf, &cap, n + 4096, 1, 4096);
        got = ok ? fread((char *)buf + n, 1, cap - n, fp) : 0;
    }
    fclose(fp);
    int rc = ok ? tokenizer_set_chat_template(tok, buf, n) : -1;
    if (rc)
        snprintf(err, errlen, "the chat template %s: out of memory (or larger than 16 MiB)", path);
    free(buf);
    return rc;
}

char *tokenizer_chat_render(const tokenizer *tok, int n, const char *const *roles,
                            const char *const *contents)
{
    char err[512];
    char *out = tokenizer_chat_render_err(tok, n, roles, contents, err, sizeof err);
    if (!out)
        fprintf(stderr, "tokenizer: %s\n", err);
    return out;
}

/* The built-in rendering of a file without a template: ChatML, or Llama 2's [INST]. */
static char *tok_chat_builtin(const tokenizer *tok, int n, const char *const *roles,
                              const char *const *contents)
{
    size_t cap = 128 + (tok->chat_system ? strlen(tok->chat_system) : 0);
    for (int i = 0; i < n; i++)
        cap += strlen(roles[i]) + strlen(contents[i]) + 64;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    size_t m = 0;
    if (tok->chatml) {
        if (tok->chat_system && (n == 0 || !tok_role_system(roles[0])))
            m += (size_t)snprintf(out + m, cap - m, "%s%s<|im_end|>\n", TOK_SYS_OPEN,
                                  tok->chat_system);
        for (int i = 0; i < n; i++)
            m += (size_t)snprintf(out + m, cap - m, "<|im_start|>%s\n%s<|im_end|>\n",
                                  tok_role_system(roles[i]) ? "system" : roles[i], contents[i]);
        snprintf(out + m, cap - m, "<|im_start|>assistant\n");
        return out;
    }
    const char *sys = NULL; /* folded into the next user turn */
    out[0] = '\0';
    for (int i = 0; i <= n; i++) {
        if (i < n && tok_role_system(roles[i])) {
            sys = contents[i];
            continue;
        }
        bool user = i < n && !strcmp(roles[i], "user");
        if (sys && !user) { /* no user turn to fold it into: a turn of its own */
            m += (size_t)snprintf(out + m, cap - m, "%s[INST] <<SYS>>\n%s\n<</SYS>>\n\n [/INST]",
                                  m ? " " : "", sys);
            sys = NULL;
        }
        if (i == n)
            break;
        if (user) {
            m += (size_t)snprintf(out + m, cap - m, "%s[INST] ", m ? " " : "");
            if (sys)
                m += (size_t)snprintf(out + m, cap - m, "<<SYS>>\n%s\n<</SYS>>\n\n", sys);
            sys = NULL;
            m += (size_t)snprintf(out + m, cap - m, "%s [/INST]", contents[i]);
        } else {
            m += (size_t)snprintf(out + m, cap - m, " %s", contents[i]);
        }
    }
    return out;
}
