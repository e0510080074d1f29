/*
 * coordinator/coord_output.c — a request's text on its way in and out (interface: coord_output.h):
 * the prompt rendered (a completion's as given, a conversation through the model's chat
 * template), and the generated text handed to the request as it becomes certain — never past a
 * stop string, never a UTF-8 character cut in two.
 */
#define _GNU_SOURCE /* memmem */
#include "coordinator/coord_output.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/buf.h"
#include "base/utf8.h"

int coord_text_add(coord_text *t, const char *s, size_t n)
{
    return buf_append(&t->text, &t->len, &t->cap, s, n, 1024);
}

/* Where the first stop string in the text begins: true with *at set, false (*at = t->len) when
 * there is none. Only the unsent text (and a stop string's length before it) is searched: text
 * already handed over cannot begin one. */
bool coord_text_find_stop(const coord_text *t, const coord_params *prm, size_t *at)
{
    size_t stop_at = t->len;
    bool stopped = false;
    for (int i = 0; i < prm->n_stop; i++) {
        size_t sl = strlen(prm->stop[i]);
        if (!sl)
            continue;
        size_t from = t->sent > sl ? t->sent - sl : 0;
        char *hit = t->len >= sl ? memmem(t->text + from, t->len - from, prm->stop[i], sl) : NULL;
        if (hit && (size_t)(hit - t->text) < stop_at) {
            stop_at = (size_t)(hit - t->text);
            stopped = true;
        }
    }
    *at = stop_at;
    return stopped;
}

/* Hand the request whatever text is now certain; returns true if a stop string was found. */
bool coord_text_flush(coord_text *t, coord_request *req, const coord_params *prm, bool final)
{
    size_t stop_at;
    bool stopped = coord_text_find_stop(t, prm, &stop_at);
    size_t upto = stop_at;
    if (!stopped && !final) {
        upto = t->len > t->max_stop ? t->len - t->max_stop : 0;
        if (upto < t->sent)
            upto = t->sent;
        upto = t->sent + utf8_complete((const unsigned char *)t->text + t->sent, upto - t->sent);
    }
    if (upto > t->sent) {
        coord_request_append(req, NULL, 0, t->text + t->sent, upto - t->sent);
        t->sent = upto;
    }
    return stopped;
}

/* The prompt text of a request: a completion's prompt, or the conversation rendered with the
 * file's chat template (tokenizer_chat_render_err: the template run by the Jinja interpreter);
 * NULL with the reason in err (a template that refuses the conversation or cannot be run). */
/* For a template that does not render tools: a system turn saying what the functions are and how
 * to call one (the form a tool-call grammar constrains the answer to), before the conversation's
 * own system text if it has one. NULL when there are no tools or out of memory. */
static char *coord_tools_system(const char *vars, const char *system)
{
    cJSON *root = cJSON_Parse(vars);
    const cJSON *tools = root ? cJSON_GetObjectItemCaseSensitive(root, "tools") : NULL;
    char *list = cJSON_IsArray(tools) && cJSON_GetArraySize(tools) ? cJSON_Print(tools) : NULL;
    char *out = NULL;
    if (list) {
        const char *head = "You can call the following functions. To call one, answer with only a "
                           "JSON object of the form {\"name\": <function name>, \"arguments\": "
                           "<an object of its parameters>}.\n";
        size_t n = strlen(head) + strlen(list) + (system ? strlen(system) : 0) + 8;
        out = malloc(n);
        if (out)
            snprintf(out, n, "%s%s%s%s", system ? system : "", system ? "\n\n" : "", head, list);
    }
    cJSON_free(list);
    cJSON_Delete(root);
    return out;
}

char *coord_render_prompt(const tokenizer *tok, const coord_params *prm, char *err, size_t errlen)
{
    if (prm->kind == COORD_REQ_COMPLETION) {
        char *t = strdup(prm->prompt ? prm->prompt : "");
        if (!t)
            snprintf(err, errlen, "out of memory");
        return t;
    }
    /* tools and tool turns: through the template when it renders them */
    if (prm->chat_vars && tokenizer_chat_mentions(tok, "tools"))
        return tokenizer_chat_render_vars(tok, prm->chat_vars, strlen(prm->chat_vars), err, errlen);
    int n = prm->n_messages;
    const char **roles = malloc((size_t)(n + 1) * sizeof *roles);
    const char **contents = malloc((size_t)(n + 1) * sizeof *contents);
    char *out = NULL, *sys = NULL;
    if (roles && contents) {
        int m = 0, first = 0;
        bool has_system = n && !strcmp(prm->messages[0].role, "system");
        sys = prm->chat_vars
                  ? coord_tools_system(prm->chat_vars, has_system ? prm->messages[0].content : NULL)
                  : NULL;
        if (sys) {
            roles[m] = "system";
            contents[m++] = sys;
            first = has_system;
        }
        for (int i = first; i < n; i++, m++) {
            roles[m] = prm->messages[i].role;
            contents[m] = prm->messages[i].content;
        }
        out = tokenizer_chat_render_err(tok, m, roles, contents, err, errlen);
    } else {
        snprintf(err, errlen, "out of memory");
    }
    free(sys);
    free(roles);
    free(contents);
    return out;
}
