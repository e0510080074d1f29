/*
 * coordinator/coord_output — a request's text on its way in (the prompt rendered) and out (the
 * generated text released up to what is certain). Below the engine (coord_slots.c uses it) and
 * free of its state, so the chat-template fuzzer drives it through this header.
 */
#ifndef OROCHI_COORD_OUTPUT_H
#define OROCHI_COORD_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>

#include "coordinator/request.h"
#include "model/tokenizer.h"

/* The generated text of one request. max_stop: the longest stop string's length less one (what
 * must be held back in case a stop string is still being written). */
typedef struct {
    char *text; /* all generated text */
    size_t len, cap, sent;
    size_t max_stop;
} coord_text;

/* Append s[0..n); 0, or -1 when out of memory. */
int coord_text_add(coord_text *t, const char *s, size_t n);
/* Where the first stop string in the text begins: true with *at set, false (*at = t->len) when
 * there is none (only the unsent text, and a stop string's length before it, is searched). */
bool coord_text_find_stop(const coord_text *t, const coord_params *prm, size_t *at);
/* Hand the request whatever text is now certain (everything before a stop string when `final`);
 * true if a stop string was found. */
bool coord_text_flush(coord_text *t, coord_request *req, const coord_params *prm, bool final);
/* The prompt text of a request: a completion's prompt, or the conversation rendered with the
 * tokenizer's chat template; NULL with the reason in err (a template that refuses the
 * conversation or cannot be run). */
char *coord_render_prompt(const tokenizer *tok, const coord_params *prm, char *err, size_t errlen);

#endif
