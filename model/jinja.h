/*
 * model/jinja — the chat templates GGUF files carry (tokenizer.chat_template), rendered as
 * Hugging Face's apply_chat_template renders them with Python's jinja2: trim_blocks and
 * lstrip_blocks on, `raise_exception`, `strftime_now`, a `tojson` that writes non-ASCII text as is.
 *
 * The subset of Jinja that chat templates use: text, {{ expressions }}, {# comments #}, whitespace
 * control ({%- -%}, {{- -}}, {%+ ... %}); if / elif / else, for (with `loop`, tuple unpacking,
 * else) and set (a name, a namespace's attribute); literals (strings, numbers, lists, dicts,
 * true/false/none), arithmetic, ~, comparisons, in / not in, and / or / not, `x if c else y`,
 * attribute and item access, slices, filters (trim, tojson, length, count, string, upper, lower,
 * capitalize, title, first, last, join, default, items, list, reverse, replace, int, float, abs,
 * round, select / reject / selectattr / rejectattr, map(attribute=...)), tests (defined,
 * undefined, none, string, number, integer, float, boolean, true, false, mapping, iterable,
 * sequence, callable, odd, even, equalto, eq, ne, in), string and dict methods (strip, lstrip,
 * rstrip, split, startswith, endswith, replace, upper, lower, title, capitalize, find, items,
 * keys, values, get), range, namespace, raise_exception and strftime_now. A template using
 * anything else (macros, call blocks, includes) is refused with the construct named, never
 * rendered by a guess.
 */
#ifndef OROCHI_JINJA_H
#define OROCHI_JINJA_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    const char *role, *content;
} jinja_message;

/* The template's text for n messages, as apply_chat_template(messages, add_generation_prompt,
 * bos_token=bos, eos_token=eos) gives it. A malloc'd string, or NULL with one line in err (a
 * syntax error or an unsupported construct, with its line; raise_exception's message). */
char *jinja_render_chat(const char *tmpl, size_t len, const jinja_message *msgs, int n,
                        bool add_generation_prompt, const char *bos, const char *eos, char *err,
                        size_t errlen);

/* The template's text with the variables in vars, a JSON object of len vars_len (messages
 * with any fields - tool_calls, tool roles -, tools, documents, enable_thinking, ...; a key given
 * there overrides add_generation_prompt, which is true otherwise). Errors as jinja_render_chat;
 * a vars that is not a JSON object is named "chat variables: ...". */
char *jinja_render_vars(const char *tmpl, size_t len, const char *vars, size_t vars_len,
                        const char *bos, const char *eos, char *err, size_t errlen);

#endif
