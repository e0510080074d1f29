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
char *coord_render_prompt(const tokenizer *tok, const coord_params *prm, char *err, size_t errlen)
{
    if (prm->kind == COORD_REQ_COMPLETION) {
        char *t = strdup(prm->prompt ? prm->prompt : "");
        if (!t)
            snprintf(err, errlen, "out of memory");
        return t;
    }
    int n = prm->n_messages;
    const char **roles = malloc((size_t)(n ? n : 1) * sizeof *roles);
    const char **contents = malloc((size_t)(n ? n : 1) * sizeof *contents);
    char *out = NULL;
    if (roles && contents) {
        for (int i = 0; i < n; i++) {
            roles[i] = prm->messages[i].role;
            contents[i] = prm->messages[i].content;
        }
        out = tokenizer_chat_render_err(tok, n, roles, contents, err, errlen);
    } else {
        snprintf(err, errlen, "out of memory");
    }
    free(roles);
    free(contents);
    return out;
}

