/*
 * coordinator/openai.c — the OpenAI format of the API (interface: openai.h): request bodies
 * parsed and checked into a coord_request, answers, errors and stream chunks rendered as JSON
 * and server-sent events. No I/O: the transport (coordinator/http.c) feeds it bodies and engine
 * text and sends what it writes; the fuzzer (tests/fuzz/fuzz_http_body.c) drives it through this
 * header alone.
 */
#define _GNU_SOURCE
#include "coordinator/openai.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/utf8.h"
#include "coordinator/schema.h"
#include "model/grammar.h"

void openai_json_add_text(cJSON *obj, const char *key, const char *s, size_t n)
{
    char *clean = utf8_clean(s ? s : "", s ? n : 0);
    cJSON_AddStringToObject(obj, key, clean ? clean : "");
    free(clean);
}

/* One level of a JSON text being walked by http_json_bad_string: an array and the index of its
 * current element, or an object and the raw text of its current member's key. */
typedef struct {
    bool array;
    int index;
    size_t key, key_len; /* offset and length in the body */
} openai_jlevel;

/* Appends the path of the current position, e.g. "messages[1].content", to path. */
static void oa_jpath(const char *body, const openai_jlevel *lv, int depth, char *path, size_t cap)
{
    size_t n = 0;
    path[0] = 0;
    for (int d = 0; d < depth && n + 1 < cap; d++) {
        int w = lv[d].array
                    ? snprintf(path + n, cap - n, "[%d]", lv[d].index)
                    : snprintf(path + n, cap - n, "%s%.*s", d ? "." : "",
                               (int)(lv[d].key_len > 64 ? 64 : lv[d].key_len), body + lv[d].key);
        n += w > 0 ? (size_t)w : 0;
    }
}

/* Strings must arrive whole. cJSON decodes "\u0000" into a NUL byte that would end the C string
 * (everything after it lost without a word) and copies bytes that are not UTF-8 as they are, which
 * the tokenizer would then mangle. So before the fields are read, the body's text (already parsed
 * by cJSON, hence well formed) is walked once: the first string holding a NUL (escaped or raw) or
 * invalid UTF-8 is reported with its path. Returns 0 when every string is clean, 1 with *e filled
 * (400, the path as param), -1 when out of memory. */
static int oa_json_bad_string(const char *body, size_t len, openai_err *e)
{
    int depth = 0, cap = 0;
    openai_jlevel *lv = NULL;
    bool want_key = false;
    int rc = 0;
    for (size_t i = 0; i < len && !rc;) {
        char c = body[i];
        if (c == '{' || c == '[') {
            if (depth == cap) {
                int ncap = cap ? cap * 2 : 16;
                openai_jlevel *grown = realloc(lv, (size_t)ncap * sizeof *grown);
                if (!grown) {
                    rc = -1;
                    break;
                }
                lv = grown;
                cap = ncap;
            }
            lv[depth++] = (openai_jlevel){.array = c == '['};
            want_key = c == '{';
            i++;
        } else if (c == '}' || c == ']') {
            depth -= depth > 0;
            want_key = false;
            i++;
        } else if (c == ',') {
            if (depth && lv[depth - 1].array)
                lv[depth - 1].index++;
            want_key = depth && !lv[depth - 1].array;
            i++;
        } else if (c == '"') {
            size_t start = ++i;
            const char *bad = NULL;
            while (i < len && body[i] != '"') {
                const unsigned char *u = (const unsigned char *)body + i;
                if (*u == '\\') {
                    if (i + 5 < len && u[1] == 'u' && !memcmp(u + 2, "0000", 4))
                        bad = bad ? bad : "a NUL character (\\u0000)";
                    i += i + 1 < len ? 2 : 1;
                } else if (*u == 0) {
                    bad = bad ? bad : "a NUL character";
                    i++;
                } else {
                    size_t n = utf8_char(u, len - i);
                    if (!n)
                        bad = bad ? bad : "bytes that are not valid UTF-8";
                    i += n ? n : 1;
                }
            }
            if (want_key && depth) {
                lv[depth - 1].key = start;
                lv[depth - 1].key_len = i - start;
                want_key = false;
            }
            i++; /* the closing quote */
            if (bad) {
                char path[sizeof e->param];
                oa_jpath(body, lv, depth, path, sizeof path);
                openai_fail(e, 400, path,
                            "%s contains %s; send text as valid UTF-8 without NUL characters",
                            path[0] ? path : "the request body", bad);
                rc = 1;
            }
        } else {
            i++; /* whitespace, ':', numbers, true, false, null */
        }
    }
    free(lv);
    return rc;
}

/* The object member `name`, treating JSON null like an absent member. */
static const cJSON *oa_field(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A JSON number with an integral value; huge magnitudes are clamped so range checks still read
 * naturally ("at most 4096, got 1e300" is reported as the clamp). */
static bool oa_json_integer(const cJSON *v, long long *out)
{
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || floor(v->valuedouble) != v->valuedouble)
        return false;
    double d = v->valuedouble;
    *out = d > 4e18 ? (long long)4e18 : d < -4e18 ? (long long)-4e18 : (long long)d;
    return true;
}

static const char *oa_error_type(int status)
{
    if (status == 401)
        return "authentication_error";
    if (status == 429)
        return "rate_limit_error";
    if (status >= 500)
        return "server_error";
    return "invalid_request_error";
}

/* {"error":{message, type, param, code}}; param and code NULL or "" are null. */
cJSON *openai_error_json(int status, const char *message, const char *param, const char *code)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(root, "error");
    openai_json_add_text(e, "message", message, strlen(message));
    cJSON_AddStringToObject(e, "type", oa_error_type(status));
    if (param && *param)
        openai_json_add_text(e, "param", param, strlen(param));
    else
        cJSON_AddNullToObject(e, "param");
    if (code && *code)
        cJSON_AddStringToObject(e, "code", code);
    else
        cJSON_AddNullToObject(e, "code");
    return root;
}

/* An engine failure as the client sees it. The engine's 413 (the prompt does not fit the
 * context, see request.h) is answered the way OpenAI answers it: 400, code
 * context_length_exceeded, param naming the prompt or the messages. */
cJSON *openai_engine_error_json(bool chat, int status, const char *message, int *out_status)
{
    if (status == COORD_STATUS_CONTEXT) {
        *out_status = 400;
        return openai_error_json(400, message, chat ? "messages" : "prompt",
                                 "context_length_exceeded");
    }
    *out_status = status;
    return openai_error_json(status, message, NULL, NULL);
}

/* ==== parsing a generation request ============================================================ */

int openai_fail(openai_err *e, int status, const char *param, const char *fmt, ...)
{
    e->status = status;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

static int oa_parse_prompt(const cJSON *root, coord_request *req, openai_err *e)
{
    const cJSON *v = oa_field(root, "prompt");
    if (!v)
        return openai_fail(e, 400, "prompt", "missing required field 'prompt' (a string)");
    if (cJSON_IsArray(v)) {
        /* a one-element list is what many clients send for a single prompt */
        const cJSON *first = cJSON_GetArrayItem(v, 0);
        if (cJSON_GetArraySize(v) == 1 && cJSON_IsString(first))
            v = first;
        else if (first && cJSON_IsNumber(first))
            return openai_fail(e, 400, "prompt",
                               "prompt as token ids is not supported; send the prompt as a string");
        else
            return openai_fail(
                e, 400, "prompt",
                "prompt must be a string (lists of several prompts are not supported)");
    }
    if (!cJSON_IsString(v))
        return openai_fail(e, 400, "prompt", "prompt must be a string");
    if (coord_request_set_prompt(req, v->valuestring))
        return openai_fail(e, 503, NULL, "out of memory");
    return 0;
}

/* Message content: a string, or an array of {"type":"text","text":...} parts joined together. */
static int oa_message_content(const cJSON *c, strbuf *out)
{
    if (cJSON_IsString(c)) {
        strbuf_add(out, c->valuestring, strlen(c->valuestring));
        return 0;
    }
    if (!cJSON_IsArray(c))
        return -1;
    const cJSON *part;
    cJSON_ArrayForEach(part, c)
    {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return -1;
        strbuf_add(out, text->valuestring, strlen(text->valuestring));
    }
    strbuf_add(out, "", 0);
    return 0;
}

/* The tool_calls of assistant message i as text: each call's {"name": ..., "arguments": ...} on a
 * line (the arguments parsed when they are a JSON text, as the model writes them). */
static int oa_message_calls(const cJSON *calls, int i, strbuf *out, openai_err *e)
{
    if (!cJSON_IsArray(calls))
        return openai_fail(e, 400, "tool_calls", "messages[%d].tool_calls must be an array", i);
    int k = 0;
    const cJSON *call;
    cJSON_ArrayForEach(call, calls)
    {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || (args && !cJSON_IsString(args)))
            return openai_fail(e, 400, "tool_calls",
                               "messages[%d].tool_calls[%d] must be {\"type\": \"function\", "
                               "\"function\": {\"name\": string, \"arguments\": string}}",
                               i, k);
        cJSON *one = cJSON_CreateObject();
        cJSON_AddStringToObject(one, "name", name->valuestring);
        cJSON *parsed = args ? cJSON_Parse(args->valuestring) : cJSON_CreateObject();
        cJSON_AddItemToObject(one, "arguments",
                              parsed ? parsed : cJSON_CreateString(args->valuestring));
        char *t = cJSON_PrintUnformatted(one);
        cJSON_Delete(one);
        if (!t)
            return openai_fail(e, 503, NULL, "out of memory");
        if (out->len)
            strbuf_add(out, "\n", 1);
        strbuf_add(out, t, strlen(t));
        cJSON_free(t);
        k++;
    }
    strbuf_add(out, "", 0);
    return 0;
}

static int oa_parse_messages(const cJSON *root, coord_request *req, openai_err *e)
{
    const cJSON *msgs = oa_field(root, "messages");
    if (!msgs)
        return openai_fail(e, 400, "messages", "missing required field 'messages' (an array)");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return openai_fail(e, 400, "messages",
                           "messages must be a non-empty array of {role, content}");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        char param[48];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m))
            return openai_fail(e, 400, param,
                               "messages[%d] must be an object with role and content", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!cJSON_IsString(role))
            return openai_fail(e, 400, param, "messages[%d].role must be a string", i);
        /* "developer" is OpenAI's newer name for the system role */
        const char *as = role->valuestring;
        if (!strcmp(as, "developer"))
            as = "system";
        if (strcmp(as, "system") && strcmp(as, "user") && strcmp(as, "assistant") &&
            strcmp(as, "tool"))
            return openai_fail(e, 400, param,
                               "messages[%d].role must be \"system\", \"developer\", \"user\", "
                               "\"assistant\" or \"tool\"",
                               i);
        strbuf text = {0};
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        bool has_calls = calls && !cJSON_IsNull(calls);
        if (has_calls) {
            /* an assistant turn that called tools: each call as the JSON the model answers with */
            int rc = strcmp(as, "assistant") ? openai_fail(e, 400, param,
                                                           "only assistant messages "
                                                           "carry tool_calls (messages[%d])",
                                                           i)
                                             : oa_message_calls(calls, i, &text, e);
            if (rc) {
                strbuf_free(&text);
                return rc;
            }
            if (content && !cJSON_IsNull(content) && oa_message_content(content, &text)) {
                strbuf_free(&text);
                snprintf(param, sizeof param, "messages[%d].content", i);
                return openai_fail(e, 400, param,
                                   "messages[%d].content must be a string, null or "
                                   "an array of text parts",
                                   i);
            }
        }
        snprintf(param, sizeof param, "messages[%d].content", i);
        if (!has_calls && (!content || oa_message_content(content, &text))) {
            strbuf_free(&text);
            return openai_fail(e, 400, param,
                               "messages[%d].content must be a string (or an array of text parts)",
                               i);
        }
        int rc = text.oom ? -1 : coord_request_add_message(req, as, text.p ? text.p : "");
        strbuf_free(&text);
        if (rc)
            return openai_fail(e, 503, NULL, "out of memory");
        i++;
    }
    return 0;
}

static int oa_parse_stop(const cJSON *v, coord_request *req, openai_err *e)
{
    if (cJSON_IsString(v)) {
        if (!*v->valuestring)
            return openai_fail(e, 400, "stop", "stop must not be an empty string");
        return coord_request_add_stop(req, v->valuestring)
                   ? openai_fail(e, 503, NULL, "out of memory")
                   : 0;
    }
    if (!cJSON_IsArray(v))
        return openai_fail(e, 400, "stop", "stop must be a string or an array of strings");
    if (cJSON_GetArraySize(v) > COORD_MAX_STOP)
        return openai_fail(e, 400, "stop", "stop takes at most %d sequences", COORD_MAX_STOP);
    const cJSON *s;
    cJSON_ArrayForEach(s, v)
    {
        if (!cJSON_IsString(s) || !*s->valuestring)
            return openai_fail(e, 400, "stop",
                               "stop must be a string or an array of non-empty strings");
        if (coord_request_add_stop(req, s->valuestring))
            return openai_fail(e, 503, NULL, "out of memory");
    }
    return 0;
}

/* logprobs, OpenAI's way for each route. Completions: "logprobs" is a count 0..5 (the chosen
 * token's logprob and that many alternatives; false counts as absent), "top_logprobs" is not a
 * completions field (0 is let through as meaning nothing). Chat: "logprobs" is a boolean,
 * "top_logprobs" a count 0..20 that needs "logprobs": true. Echo would need the prompt's logprobs,
 * which the engine does not compute. */
static int oa_parse_logprobs(const cJSON *root, coord_params *p, openai_err *e)
{
    const cJSON *lp = oa_field(root, "logprobs"), *top = oa_field(root, "top_logprobs");
    long long i;
    if (p->kind == COORD_REQ_COMPLETION) {
        if (top && !(oa_json_integer(top, &i) && i == 0))
            return openai_fail(e, 400, "top_logprobs",
                               "top_logprobs is a chat completions field; on /v1/completions send "
                               "logprobs as the number of alternatives (0 to 5)");
        if (!lp || cJSON_IsFalse(lp))
            return 0;
        if (!oa_json_integer(lp, &i) || i < 0 || i > 5)
            return openai_fail(
                e, 400, "logprobs",
                "logprobs must be an integer from 0 to 5 on /v1/completions (the "
                "number of alternatives per token; 0: the chosen token's logprob only)");
        if (p->echo)
            return openai_fail(
                e, 400, "logprobs",
                "logprobs cannot be combined with echo: the prompt's logprobs are not "
                "computed (send echo false, or no logprobs)");
        p->logprobs = true;
        p->top_logprobs = (int)i;
        return 0;
    }
    if (lp && !cJSON_IsBool(lp))
        return openai_fail(e, 400, "logprobs", "logprobs must be true or false");
    p->logprobs = lp && cJSON_IsTrue(lp);
    if (top) {
        if (!oa_json_integer(top, &i) || i < 0 || i > COORD_MAX_TOP_LOGPROBS)
            return openai_fail(e, 400, "top_logprobs",
                               "top_logprobs must be an integer from 0 to %d",
                               COORD_MAX_TOP_LOGPROBS);
        if (!p->logprobs)
            return openai_fail(e, 400, "top_logprobs", "top_logprobs requires logprobs to be true");
        p->top_logprobs = (int)i;
    }
    return 0;
}

/* The sampling and control fields both routes share. */
static int oa_parse_common(const openai_limits *lim, const cJSON *root, coord_request *req,
                           openai_err *e)
{
    coord_params *p = coord_request_params(req);
    const cJSON *v;
    long long i;
    const cJSON *mt = oa_field(root, "max_tokens"), *mct = oa_field(root, "max_completion_tokens");
    if (mt && mct &&
        !(cJSON_IsNumber(mt) && cJSON_IsNumber(mct) && mt->valuedouble == mct->valuedouble))
        return openai_fail(e, 400, "max_completion_tokens",
                           "max_tokens and max_completion_tokens disagree: send one of them");
    if ((v = mt) || (v = mct)) {
        const char *name = v->string;
        if (!oa_json_integer(v, &i))
            return openai_fail(e, 400, name, "%s must be an integer", name);
        if (i < 1)
            return openai_fail(e, 400, name, "%s must be at least 1, got %lld", name, i);
        if (i > lim->max_tokens_cap)
            return openai_fail(e, 400, name, "%s must be at most %d, got %lld", name,
                               lim->max_tokens_cap, i);
        p->max_tokens = (int)i;
    } else if (p->max_tokens > lim->max_tokens_cap) {
        p->max_tokens = lim->max_tokens_cap; /* the default never asks for more than the cap */
    }
    if ((v = oa_field(root, "temperature"))) {
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
            return openai_fail(e, 400, "temperature", "temperature must be a number");
        if (v->valuedouble < 0 || v->valuedouble > 2)
            return openai_fail(e, 400, "temperature",
                               "temperature must be between 0 and 2 (0 is greedy), got %g",
                               v->valuedouble);
        p->temperature = v->valuedouble;
    }
    if ((v = oa_field(root, "top_p"))) {
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
            return openai_fail(e, 400, "top_p", "top_p must be a number");
        if (!(v->valuedouble > 0 && v->valuedouble <= 1))
            return openai_fail(e, 400, "top_p", "top_p must be in (0, 1], got %g", v->valuedouble);
        p->top_p = v->valuedouble;
    }
    if ((v = oa_field(root, "top_k"))) {
        if (!oa_json_integer(v, &i) || i < 0 || i > (1 << 24))
            return openai_fail(e, 400, "top_k", "top_k must be an integer >= 0 (0 turns it off)");
        p->top_k = (int)i;
    }
    if ((v = oa_field(root, "seed"))) {
        if (!oa_json_integer(v, &i))
            return openai_fail(e, 400, "seed", "seed must be an integer");
        p->has_seed = true;
        p->seed = i;
    }
    if ((v = oa_field(root, "stream"))) {
        if (!cJSON_IsBool(v))
            return openai_fail(e, 400, "stream", "stream must be true or false");
        p->stream = cJSON_IsTrue(v);
    }
    if ((v = oa_field(root, "stream_options"))) {
        if (!cJSON_IsObject(v))
            return openai_fail(e, 400, "stream_options", "stream_options must be an object");
        if (!p->stream)
            return openai_fail(e, 400, "stream_options",
                               "stream_options is only allowed when stream is true");
        const cJSON *u = oa_field(v, "include_usage");
        if (u && !cJSON_IsBool(u))
            return openai_fail(e, 400, "stream_options.include_usage",
                               "stream_options.include_usage must be true or false");
        p->stream_usage = u && cJSON_IsTrue(u);
    }
    if ((v = oa_field(root, "logit_bias"))) {
        if (!cJSON_IsObject(v))
            return openai_fail(e, 400, "logit_bias",
                               "logit_bias must be an object of token ids to numbers");
        for (const cJSON *b = v->child; b; b = b->next) {
            char *end = NULL;
            long long id = b->string ? strtoll(b->string, &end, 10) : -1;
            if (!b->string || !*b->string || *end || id < 0 || id > INT32_MAX)
                return openai_fail(e, 400, "logit_bias",
                                   "logit_bias keys must be token ids (non-negative integers), got "
                                   "'%.40s'",
                                   b->string ? b->string : "");
            if (!cJSON_IsNumber(b) || !isfinite(b->valuedouble) || b->valuedouble < -100 ||
                b->valuedouble > 100)
                return openai_fail(
                    e, 400, "logit_bias",
                    "logit_bias values must be numbers from -100 to 100 (token %lld)", id);
            if (p->n_bias >= COORD_MAX_BIAS)
                return openai_fail(e, 400, "logit_bias", "logit_bias holds at most %d tokens",
                                   COORD_MAX_BIAS);
            p->bias_id[p->n_bias] = (int32_t)id;
            p->bias[p->n_bias++] = (float)b->valuedouble;
        }
    }
    static const char *const penalties[] = {"frequency_penalty", "presence_penalty"};
    for (int k = 0; k < 2; k++)
        if ((v = oa_field(root, penalties[k]))) {
            if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < -2 ||
                v->valuedouble > 2)
                return openai_fail(e, 400, penalties[k], "%s must be a number from -2 to 2",
                                   penalties[k]);
            *(k ? &p->presence_penalty : &p->frequency_penalty) = v->valuedouble;
        }
    p->n_choices = 1;
    if ((v = oa_field(root, "n")) && !cJSON_IsNull(v)) {
        if (!oa_json_integer(v, &i) || i < 1 || i > OPENAI_MAX_CHOICES)
            return openai_fail(e, 400, "n", "n must be an integer from 1 to %d",
                               OPENAI_MAX_CHOICES);
        p->n_choices = (int)i;
    }
    v = NULL;
    if (p->kind == COORD_REQ_COMPLETION) {
        if ((v = oa_field(root, "echo"))) {
            if (!cJSON_IsBool(v))
                return openai_fail(e, 400, "echo", "echo must be true or false");
            p->echo = cJSON_IsTrue(v);
        }
        if (p->n_choices > 1 && p->echo)
            return openai_fail(e, 400, "n", "n above 1 cannot be combined with echo");
        if ((v = oa_field(root, "best_of")) && !(oa_json_integer(v, &i) && i == 1))
            return openai_fail(e, 400, "best_of", "best_of must be 1 (one candidate per request)");
        if ((v = oa_field(root, "suffix")) && !(cJSON_IsString(v) && !*v->valuestring))
            return openai_fail(e, 400, "suffix", "suffix is not supported by this server");
    }
    if (oa_parse_logprobs(root, p, e))
        return -1;
    if ((v = oa_field(root, "stop")) && oa_parse_stop(v, req, e))
        return -1;
    if ((v = oa_field(root, "orochi"))) {
        if (!cJSON_IsObject(v))
            return openai_fail(e, 400, "orochi", "orochi must be an object");
        char *raw = cJSON_PrintUnformatted(v);
        int rc = raw ? coord_request_set_options(req, raw) : -1;
        cJSON_free(raw);
        if (rc)
            return openai_fail(e, 503, NULL, "out of memory");
    }
    return 0;
}

/* ---- structured output and tools ---- */

/* Compiles grammar text (taken: freed here) into the request as `what`; a grammar this server
 * wrote and cannot compile is its own fault (500). */
static int oa_set_grammar(coord_request *req, char *text, coord_constraint what, const char *param,
                          openai_err *e)
{
    if (!text)
        return openai_fail(e, 503, NULL, "out of memory");
    char err[256];
    int rc = coord_request_set_grammar(req, text, strlen(text), what, err, sizeof err);
    free(text);
    if (rc < 0)
        return openai_fail(e, 503, NULL, "out of memory");
    if (rc)
        return what == COORD_CONSTRAIN_GRAMMAR
                   ? openai_fail(e, 400, param, "grammar: %s", err)
                   : openai_fail(e, 500, param, "internal error: the grammar made for %s: %s",
                                 param, err);
    return 0;
}

/* response_format: text, json_object or json_schema. */
static int oa_parse_response_format(const cJSON *v, coord_request *req, openai_err *e)
{
    const cJSON *type = cJSON_IsObject(v) ? oa_field(v, "type") : NULL;
    if (!cJSON_IsString(type))
        return openai_fail(e, 400, "response_format",
                           "response_format must be an object with a type: \"text\", "
                           "\"json_object\" or \"json_schema\"");
    if (!strcmp(type->valuestring, "text"))
        return 0;
    if (!strcmp(type->valuestring, "json_object"))
        return oa_set_grammar(req, schema_json_object_grammar(), COORD_CONSTRAIN_JSON,
                              "response_format", e);
    if (strcmp(type->valuestring, "json_schema"))
        return openai_fail(e, 400, "response_format.type",
                           "response_format.type must be \"text\", \"json_object\" or "
                           "\"json_schema\", got '%.40s'",
                           type->valuestring);
    const cJSON *js = oa_field(v, "json_schema");
    const cJSON *schema = cJSON_IsObject(js) ? oa_field(js, "schema") : NULL;
    if (!cJSON_IsObject(js))
        return openai_fail(e, 400, "response_format.json_schema",
                           "response_format.json_schema must be an object with a schema");
    if (!schema) /* OpenAI: a json_schema without a schema is any JSON object */
        return oa_set_grammar(req, schema_json_object_grammar(), COORD_CONSTRAIN_JSON,
                              "response_format", e);
    char err[256];
    char *g = schema_to_grammar(schema, err, sizeof err);
    if (!g)
        return strcmp(err, "out of memory")
                   ? openai_fail(e, 400, "response_format.json_schema.schema", "%s", err)
                   : openai_fail(e, 503, NULL, "out of memory");
    return oa_set_grammar(req, g, COORD_CONSTRAIN_JSON, "response_format", e);
}

/* The template's variables for a conversation with tools or tool turns: the messages as parsed
 * (content joined into text, a call's arguments as an object, as templates expect them) and the
 * tools (NULL: not rendered, tool_choice "none"). */
static int oa_chat_vars(const cJSON *root, coord_request *req, const cJSON *tools, openai_err *e)
{
    const coord_params *p = coord_request_params(req);
    cJSON *vars = cJSON_CreateObject();
    cJSON *msgs = cJSON_AddArrayToObject(vars, "messages");
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, oa_field(root, "messages"))
    {
        cJSON *copy = cJSON_Duplicate(m, true);
        cJSON_DeleteItemFromObjectCaseSensitive(copy, "content");
        cJSON_DeleteItemFromObjectCaseSensitive(copy, "role");
        cJSON_AddStringToObject(copy, "role", p->messages[i].role);
        cJSON *calls = cJSON_GetObjectItemCaseSensitive(copy, "tool_calls");
        if (cJSON_IsArray(calls) && cJSON_GetArraySize(calls)) {
            cJSON_AddNullToObject(copy, "content");
            cJSON *call;
            cJSON_ArrayForEach(call, calls)
            {
                cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
                cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
                cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
                if (parsed)
                    cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", parsed);
            }
        } else {
            cJSON_AddStringToObject(copy, "content", p->messages[i].content);
        }
        cJSON_AddItemToArray(msgs, copy);
        i++;
    }
    if (tools)
        cJSON_AddItemToObject(vars, "tools", cJSON_Duplicate(tools, true));
    cJSON_AddBoolToObject(vars, "add_generation_prompt", 1);
    char *text = cJSON_PrintUnformatted(vars);
    cJSON_Delete(vars);
    int rc = text ? coord_request_set_chat_vars(req, text) : -1;
    cJSON_free(text);
    return rc ? openai_fail(e, 503, NULL, "out of memory") : 0;
}

/* tools, tool_choice and parallel_tool_calls (chat). */
static int oa_parse_tools(const cJSON *root, coord_request *req, openai_err *e)
{
    const cJSON *tools = oa_field(root, "tools"), *choice = oa_field(root, "tool_choice");
    const cJSON *par = oa_field(root, "parallel_tool_calls");
    if (par && !cJSON_IsBool(par))
        return openai_fail(e, 400, "parallel_tool_calls",
                           "parallel_tool_calls must be true or false");
    if (tools && cJSON_IsNull(tools))
        tools = NULL;
    if (tools && (!cJSON_IsArray(tools) || !cJSON_GetArraySize(tools)))
        return openai_fail(e, 400, "tools", "tools must be a non-empty array of functions");
    const char *mode = "auto", *only = NULL;
    if (choice && !cJSON_IsNull(choice)) {
        if (cJSON_IsString(choice)) {
            mode = choice->valuestring;
            if (strcmp(mode, "auto") && strcmp(mode, "none") && strcmp(mode, "required"))
                return openai_fail(e, 400, "tool_choice",
                                   "tool_choice must be \"auto\", \"none\", \"required\" or "
                                   "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        } else {
            const cJSON *fn = cJSON_IsObject(choice) ? oa_field(choice, "function") : NULL;
            const cJSON *name = cJSON_IsObject(fn) ? oa_field(fn, "name") : NULL;
            if (!cJSON_IsString(name))
                return openai_fail(e, 400, "tool_choice",
                                   "tool_choice must be a string or {\"type\": \"function\", "
                                   "\"function\": {\"name\": ...}}");
            mode = "required";
            only = name->valuestring;
        }
        if (!tools && strcmp(mode, "none"))
            return openai_fail(e, 400, "tool_choice", "tool_choice needs tools");
    }
    bool tool_turns = false;
    for (int i = 0; i < coord_request_params(req)->n_messages; i++)
        tool_turns |= !strcmp(coord_request_params(req)->messages[i].role, "tool");
    const cJSON *m;
    cJSON_ArrayForEach(m, oa_field(root, "messages")) tool_turns |=
        cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(m, "tool_calls"));
    if (tools && !strcmp(mode, "required")) {
        if (coord_request_params(req)->grammar)
            return openai_fail(e, 400, "tool_choice",
                               "a required tool call and response_format (or grammar) cannot both "
                               "constrain the answer");
        char err[256];
        char *g = schema_tool_call_grammar(tools, only, err, sizeof err);
        if (!g)
            return strcmp(err, "out of memory") ? openai_fail(e, 400, "tools", "%s", err)
                                                : openai_fail(e, 503, NULL, "out of memory");
        if (oa_set_grammar(req, g, COORD_CONSTRAIN_TOOL, "tools", e))
            return -1;
    } else if (tools && !strcmp(mode, "auto")) {
        /* checked like a required call's, though the answer is free */
        char err[256];
        char *g = schema_tool_call_grammar(tools, NULL, err, sizeof err);
        if (!g)
            return strcmp(err, "out of memory") ? openai_fail(e, 400, "tools", "%s", err)
                                                : openai_fail(e, 503, NULL, "out of memory");
        free(g);
        coord_request_params(req)->tools_auto = true;
    }
    bool render = tools && strcmp(mode, "none");
    return render || tool_turns ? oa_chat_vars(root, req, render ? tools : NULL, e) : 0;
}

/* OpenAI fields that would change the answer in ways this server cannot: refused by name, never
 * ignored (an answer without them would look complete and be wrong). */
static const struct {
    const char *name, *why;
} oa_refused[] = {
    {"audio", "audio output is not supported (text only)"},
    {"functions", "the deprecated functions field is not supported: send tools"},
    {"function_call", "the deprecated function_call field is not supported: send tool_choice"},
    {"prediction", "predicted outputs are not supported"},
    {"reasoning_effort", "reasoning_effort is not supported by this server"},
    {"verbosity", "verbosity is not supported by this server"},
    {"web_search_options", "web search is not available"},
};

static int oa_parse_refused(const cJSON *root, openai_err *e)
{
    const cJSON *v;
    for (size_t i = 0; i < sizeof oa_refused / sizeof *oa_refused; i++)
        if ((v = oa_field(root, oa_refused[i].name)) && !cJSON_IsNull(v))
            return openai_fail(e, 400, oa_refused[i].name, "%s", oa_refused[i].why);
    if ((v = oa_field(root, "modalities")) && !cJSON_IsNull(v)) {
        bool text = cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 && cJSON_IsString(v->child) &&
                    !strcmp(v->child->valuestring, "text");
        if (!text)
            return openai_fail(e, 400, "modalities",
                               "modalities must be [\"text\"]: this server "
                               "answers in text only");
    }
    return 0;
}

/* The grammar of the answer: the "grammar" extension field, response_format, tools. */
static int oa_parse_structured(const cJSON *root, coord_request *req, bool chat, openai_err *e)
{
    const cJSON *v;
    if ((v = oa_field(root, "grammar")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v) || !*v->valuestring)
            return openai_fail(e, 400, "grammar",
                               "grammar must be the text of a grammar "
                               "(docs/grammar.md)");
        char *copy = strdup(v->valuestring);
        if (oa_set_grammar(req, copy, COORD_CONSTRAIN_GRAMMAR, "grammar", e))
            return -1;
    }
    if ((v = oa_field(root, "response_format")) && !cJSON_IsNull(v)) {
        if (coord_request_params(req)->grammar) {
            const cJSON *t = cJSON_IsObject(v) ? oa_field(v, "type") : NULL;
            if (!(cJSON_IsString(t) && !strcmp(t->valuestring, "text")))
                return openai_fail(e, 400, "response_format",
                                   "response_format and grammar cannot both constrain the answer");
        } else if (oa_parse_response_format(v, req, e)) {
            return -1;
        }
    }
    if (!chat) {
        static const char *const chat_only[] = {"tools", "tool_choice", "parallel_tool_calls"};
        for (int i = 0; i < 3; i++)
            if (oa_field(root, chat_only[i]))
                return openai_fail(e, 400, chat_only[i],
                                   "%s is a chat completions field (/v1/chat/completions)",
                                   chat_only[i]);
        return 0;
    }
    return oa_parse_tools(root, req, e);
}

/* A new request from a JSON body, or NULL with *e filled. */
coord_request *openai_parse_request(const openai_limits *lim, bool chat, const char *body,
                                    size_t len, openai_err *e)
{
    if (!len) {
        openai_fail(e, 400, NULL, "the request body is empty; send a JSON object");
        return NULL;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        openai_fail(e, 400, NULL, "the request body is not valid JSON (error at byte %zu)", at);
        return NULL;
    }
    while (end && end < body + len && strchr(" \t\r\n", *end) && *end)
        end++;
    if (end && end < body + len) {
        cJSON_Delete(root);
        openai_fail(e, 400, NULL,
                    "the request body is not valid JSON (unexpected data at byte %zu)",
                    (size_t)(end - body));
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        openai_fail(e, 400, NULL, "the request body must be a JSON object");
        return NULL;
    }
    int bad = oa_json_bad_string(body, len, e);
    if (bad) {
        cJSON_Delete(root);
        if (bad < 0)
            openai_fail(e, 503, NULL, "out of memory");
        return NULL;
    }
    coord_request *req = coord_request_new(chat ? COORD_REQ_CHAT : COORD_REQ_COMPLETION);
    int rc = req ? 0 : openai_fail(e, 503, NULL, "out of memory");
    /* the model first: a request for a model this server does not have is answered 404 whatever
     * else it says (OpenAI's model_not_found) */
    const cJSON *model = oa_field(root, "model");
    if (!rc && model && !cJSON_IsString(model))
        rc = openai_fail(e, 400, "model", "model must be a string");
    if (!rc && model && strcmp(model->valuestring, lim->model_name)) {
        rc = openai_fail(e, 404, "model",
                         "the model '%.200s' does not exist; this server serves '%.64s'",
                         model->valuestring, lim->model_name);
        snprintf(e->code, sizeof e->code, "model_not_found");
    }
    if (!rc && model && coord_request_set_model(req, model->valuestring))
        rc = openai_fail(e, 503, NULL, "out of memory");
    if (!rc)
        rc = chat ? oa_parse_messages(root, req, e) : oa_parse_prompt(root, req, e);
    if (!rc)
        rc = oa_parse_common(lim, root, req, e);
    if (!rc)
        rc = oa_parse_refused(root, e);
    if (!rc)
        rc = oa_parse_structured(root, req, chat, e);
    cJSON_Delete(root);
    if (rc)
        coord_request_unref(&req);
    return req;
}

/* ==== building responses ====================================================================== */

/* The "orochi" object: generated ids and the speculation statistics. */
static cJSON *oa_orochi_json(coord_request *req, const coord_outcome *o)
{
    cJSON *obj = cJSON_CreateObject();
    cJSON *ids = cJSON_AddArrayToObject(obj, "token_ids");
    int n = 0;
    int32_t *v = coord_request_ids(req, &n);
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(v[i]));
    free(v);
    cJSON_AddNumberToObject(obj, "cached_tokens", o->stats.cached_tokens);
    cJSON_AddNumberToObject(obj, "steps", o->stats.steps);
    cJSON_AddNumberToObject(obj, "mean_accepted", o->stats.mean_accepted);
    cJSON_AddNumberToObject(obj, "speculation_length", o->stats.speculation_length);
    cJSON *kinds = cJSON_AddArrayToObject(obj, "draft_kinds");
    const char *s = o->stats.draft_kinds;
    while (*s) {
        size_t len = strcspn(s, ",");
        while (len && s[len - 1] == ' ')
            len--;
        if (len) {
            char *clean = utf8_clean(s, len);
            if (clean)
                cJSON_AddItemToArray(kinds, cJSON_CreateString(clean));
            free(clean);
        }
        s += strcspn(s, ",");
        while (*s == ',' || *s == ' ')
            s++;
    }
    cJSON *t = cJSON_AddObjectToObject(obj, "timings");
    cJSON_AddNumberToObject(t, "queued_ms", o->stats.queued_ms);
    cJSON_AddNumberToObject(t, "prompt_ms", o->stats.prompt_ms);
    cJSON_AddNumberToObject(t, "decode_ms", o->stats.decode_ms);
    int after_first = o->stats.completion_tokens - 1;
    cJSON_AddNumberToObject(
        t, "decode_tok_s",
        after_first > 0 && o->stats.decode_ms > 0 ? after_first / (o->stats.decode_ms / 1e3) : 0);
    return obj;
}

static void oa_add_usage(cJSON *root, const coord_outcome *o)
{
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", o->stats.prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", o->stats.completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", o->stats.prompt_tokens + o->stats.completion_tokens);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", o->stats.cached_tokens);
}

static cJSON *oa_envelope(const openai_limits *lim, coord_request *req, const char *object,
                          time_t created)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", coord_request_params(req)->id);
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)created);
    openai_json_add_text(root, "model", lim->model_name, strlen(lim->model_name));
    return root;
}

/* ---- logprobs ---- */

/* The `token` string of a piece: the piece itself when it is valid UTF-8 without NUL bytes, else
 * "bytes:" followed by \xhh for every byte (OpenAI's form for a token that holds part of a
 * character), so the JSON stays valid UTF-8 and no byte is lost or made up. malloc'd; NULL when
 * out of memory. */
static char *oa_token_text(const char *piece, size_t len)
{
    bool plain = true;
    for (size_t i = 0; i < len && plain;) {
        size_t n = piece[i] ? utf8_char((const unsigned char *)piece + i, len - i) : 0;
        plain = n > 0;
        i += n;
    }
    char *out = malloc(plain ? len + 1 : 6 + 4 * len + 1);
    if (!out)
        return NULL;
    if (plain) {
        if (len)
            memcpy(out, piece, len);
        out[len] = 0;
        return out;
    }
    memcpy(out, "bytes:", 6);
    size_t o = 6;
    for (size_t i = 0; i < len; i++)
        o += (size_t)snprintf(out + o, 5, "\\x%02x", (unsigned char)piece[i]);
    return out;
}

/* A logprob as a JSON number with a float's 9 significant digits (not a double's 17). A probability
 * that underflowed to 0 (-inf, which JSON cannot write) is -9999, as OpenAI sends it. */
static cJSON *oa_lp_number(float lp)
{
    if (!isfinite(lp))
        return cJSON_CreateNumber(-9999.0);
    char buf[32];
    snprintf(buf, sizeof buf, "%.9g", (double)lp);
    return cJSON_CreateNumber(strtod(buf, NULL));
}

/* The character offset of the character that holds text byte `pos`, as the answer's text shows
 * it (http_utf8_clean: a valid character counts one, an invalid byte one U+FFFD, a NUL byte none).
 * The walk *c moves forward only, over the raw text p[0..n) that begins at text byte `base`; a
 * position at or past the end gets every character of it. */
static size_t oa_char_offset(openai_chars *c, const char *p, size_t n, size_t base, size_t pos)
{
    if (c->byte < base)
        c->byte = base;
    while (c->byte < base + n && c->byte < pos) {
        size_t i = c->byte - base;
        size_t len = utf8_char((const unsigned char *)p + i, n - i);
        if (!len)
            len = 1;
        if (c->byte + len > pos)
            break; /* pos is inside this character */
        c->chars += p[i] != 0;
        c->byte += len;
    }
    return c->chars;
}

/* An empty logprobs object: completions {"tokens", "token_logprobs", "top_logprobs",
 * "text_offset"}, chat {"content": [], "refusal": null}. */
static cJSON *oa_logprobs_new(bool chat)
{
    cJSON *o = cJSON_CreateObject();
    if (chat) {
        cJSON_AddArrayToObject(o, "content");
        cJSON_AddNullToObject(o, "refusal");
    } else {
        cJSON_AddArrayToObject(o, "tokens");
        cJSON_AddArrayToObject(o, "token_logprobs");
        cJSON_AddArrayToObject(o, "top_logprobs");
        cJSON_AddArrayToObject(o, "text_offset");
    }
    return o;
}

/* {"token", "logprob", "bytes"} of one chat token. */
static cJSON *oa_chat_token(const coord_token_lp *t)
{
    cJSON *o = cJSON_CreateObject();
    char *text = oa_token_text(t->piece, t->piece_len);
    cJSON_AddStringToObject(o, "token", text ? text : "");
    free(text);
    cJSON_AddItemToObject(o, "logprob", oa_lp_number(t->logprob));
    cJSON *bytes = cJSON_AddArrayToObject(o, "bytes");
    for (size_t i = 0; i < t->piece_len; i++)
        cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)t->piece[i]));
    return o;
}

/* Adds one token to a logprobs object (http_logprobs_new). Completions: its text, logprob, the
 * alternatives as {text: logprob} (null when none were asked for; the chosen token is added when
 * it is not among them, as OpenAI does, and a text seen already keeps its first, likelier entry),
 * and text_offset, its character offset in the answer's text. Chat: a content entry with the
 * alternatives as a list, exactly top_n of them. */
static void oa_logprobs_add(cJSON *obj, bool chat, int top_n, const coord_logprob *r,
                            size_t text_offset)
{
    if (chat) {
        cJSON *entry = oa_chat_token(&r->token);
        cJSON *tops = cJSON_AddArrayToObject(entry, "top_logprobs");
        for (int j = 0; j < r->n_top && j < top_n; j++)
            cJSON_AddItemToArray(tops, oa_chat_token(&r->top[j]));
        cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "content"), entry);
        return;
    }
    char *text = oa_token_text(r->token.piece, r->token.piece_len);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "tokens"),
                         cJSON_CreateString(text ? text : ""));
    free(text);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "token_logprobs"),
                         oa_lp_number(r->token.logprob));
    cJSON *tops = top_n > 0 ? cJSON_CreateObject() : cJSON_CreateNull();
    bool chosen_in = false;
    for (int j = 0; j <= r->n_top && j <= top_n && top_n > 0; j++) {
        /* the alternatives, then the chosen token when it was not one of them */
        bool extra = j == r->n_top || j == top_n;
        if (extra && chosen_in)
            break;
        const coord_token_lp *t = extra ? &r->token : &r->top[j];
        chosen_in |= t->id == r->token.id;
        char *key = oa_token_text(t->piece, t->piece_len);
        if (key && !cJSON_GetObjectItemCaseSensitive(tops, key))
            cJSON_AddItemToObject(tops, key, oa_lp_number(t->logprob));
        free(key);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "top_logprobs"), tops);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(obj, "text_offset"),
                         cJSON_CreateNumber((double)text_offset));
}

/* The logprobs of a finished request whose generated text is text[0..len). */
static cJSON *oa_result_logprobs(coord_request *req, const char *text, size_t len)
{
    const coord_params *p = coord_request_params(req);
    bool chat = p->kind == COORD_REQ_CHAT;
    int n = 0;
    coord_logprob *lp = coord_request_logprobs(req, 0, &n);
    cJSON *obj = oa_logprobs_new(chat);
    openai_chars walk = {0};
    for (int i = 0; i < n; i++)
        oa_logprobs_add(obj, chat, p->top_logprobs, &lp[i],
                        chat ? 0 : oa_char_offset(&walk, text, len, 0, lp[i].text_start));
    free(lp);
    return obj;
}

/* ---- tool calls ---- */

/* Whether the answer may be a tool call: 2 it is one (a required call), 1 it may be (auto), 0 no.
 */
static int oa_tool_mode(const coord_params *p)
{
    return p->constraint == COORD_CONSTRAIN_TOOL ? 2 : p->tools_auto && !p->grammar ? 1 : 0;
}

/* The answer as tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}] (with
 * "index" for a stream's delta), when text is one call {"name": N, "arguments": {...}} of a tool
 * the request offered; NULL otherwise (the text is then content). */
static cJSON *oa_tool_calls(const coord_params *p, const char *text, size_t len, bool delta)
{
    cJSON *call = text && len ? cJSON_ParseWithLength(text, len) : NULL;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(call, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(call, "arguments");
    if (!args)
        args = cJSON_GetObjectItemCaseSensitive(call, "parameters");
    bool offered = false;
    cJSON *vars = cJSON_IsString(name) && cJSON_IsObject(args) && p->chat_vars
                      ? cJSON_Parse(p->chat_vars)
                      : NULL;
    const cJSON *tool;
    cJSON_ArrayForEach(tool, cJSON_GetObjectItemCaseSensitive(vars, "tools"))
    {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(fn, "name");
        offered |= cJSON_IsString(n) && !strcmp(n->valuestring, name->valuestring);
    }
    cJSON_Delete(vars);
    cJSON *out = NULL;
    char *a = offered ? cJSON_PrintUnformatted(args) : NULL;
    if (a) {
        out = cJSON_CreateArray();
        cJSON *c = cJSON_CreateObject();
        if (delta)
            cJSON_AddNumberToObject(c, "index", 0);
        const char *dash = strchr(p->id, '-');
        char id[80];
        snprintf(id, sizeof id, "call_%s", dash ? dash + 1 : p->id);
        cJSON_AddStringToObject(c, "id", id);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(fn, "name", name->valuestring);
        cJSON_AddStringToObject(fn, "arguments", a);
        cJSON_AddItemToArray(out, c);
    }
    cJSON_free(a);
    cJSON_Delete(call);
    return out;
}

/* The whole answer of a finished non-streaming request. */
cJSON *openai_result_json(const openai_limits *lim, coord_request *req, time_t created)
{
    const coord_params *p = coord_request_params(req);
    bool chat = p->kind == COORD_REQ_CHAT;
    coord_outcome o;
    coord_request_outcome(req, &o);
    size_t len = 0;
    char *text = coord_request_text(req, &len);
    if (text && p->echo && p->prompt) {
        /* echo: the prompt, then the completion, as one text */
        size_t plen = strlen(p->prompt);
        char *both = malloc(plen + len + 1);
        if (both) {
            memcpy(both, p->prompt, plen);
            memcpy(both + plen, text, len + 1);
            len += plen;
        }
        free(text);
        text = both;
    }
    cJSON *root = oa_envelope(lim, req, chat ? "chat.completion" : "text_completion", created);
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "choices"), choice);
    cJSON_AddNumberToObject(choice, "index", 0);
    const char *finish = o.finish_reason[0] ? o.finish_reason : "stop";
    if (chat) {
        cJSON *msg = cJSON_AddObjectToObject(choice, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON *calls = oa_tool_mode(p) ? oa_tool_calls(p, text, len, false) : NULL;
        if (calls) {
            cJSON_AddNullToObject(msg, "content");
            cJSON_AddItemToObject(msg, "tool_calls", calls);
            finish = "tool_calls";
        } else {
            openai_json_add_text(msg, "content", text, len);
        }
    } else {
        openai_json_add_text(choice, "text", text, len);
    }
    if (p->logprobs && text) /* never with echo: text is the generated text */
        cJSON_AddItemToObject(choice, "logprobs", oa_result_logprobs(req, text, len));
    else
        cJSON_AddNullToObject(choice, "logprobs");
    free(text);
    cJSON_AddStringToObject(choice, "finish_reason", finish);
    oa_add_usage(root, &o);
    cJSON_AddItemToObject(root, "orochi", oa_orochi_json(req, &o));
    return root;
}

cJSON *openai_result_json_n(const openai_limits *lim, coord_request *const *reqs, int n,
                            time_t created)
{
    cJSON *root = openai_result_json(lim, reqs[0], created);
    cJSON *choices = cJSON_GetObjectItemCaseSensitive(root, "choices");
    cJSON *usage = cJSON_GetObjectItemCaseSensitive(root, "usage");
    for (int k = 1; k < n; k++) {
        cJSON *other = openai_result_json(lim, reqs[k], created);
        cJSON *c = cJSON_DetachItemFromArray(cJSON_GetObjectItemCaseSensitive(other, "choices"), 0);
        cJSON_ReplaceItemInObjectCaseSensitive(c, "index", cJSON_CreateNumber(k));
        /* the choice's own ids and statistics (the answer's "orochi" object is choice 0's) */
        cJSON_AddItemToObject(c, "orochi",
                              cJSON_DetachItemFromObjectCaseSensitive(other, "orochi"));
        cJSON_AddItemToArray(choices, c);
        /* the prompt counted once (its K/V is shared), every choice's tokens */
        const cJSON *ou = cJSON_GetObjectItemCaseSensitive(other, "usage");
        static const char *const sum[] = {"completion_tokens", "total_tokens"};
        for (int i = 0; i < 2; i++) {
            cJSON *a = cJSON_GetObjectItemCaseSensitive(usage, sum[i]);
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(ou, "completion_tokens");
            if (cJSON_IsNumber(a) && cJSON_IsNumber(b))
                cJSON_SetNumberValue(a, a->valuedouble + b->valuedouble);
        }
        cJSON_Delete(other);
    }
    return root;
}

/* ==== streaming =============================================================================== */

/* One chunk: a text piece, or (finish_reason set) the final chunk with usage and the orochi
 * object. logprobs (taken) is the chunk's logprobs object; NULL: null. */
cJSON *openai_chunk_json(openai_stream *st, const char *text, const char *finish_reason,
                         cJSON *logprobs)
{
    cJSON *root = oa_envelope(st->lim, st->req,
                              st->chat ? "chat.completion.chunk" : "text_completion", st->created);
    cJSON *choice = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "choices"), choice);
    cJSON_AddNumberToObject(choice, "index", st->index);
    if (st->chat) {
        cJSON *delta = cJSON_AddObjectToObject(choice, "delta");
        if (!st->role_sent) {
            cJSON_AddStringToObject(delta, "role", "assistant");
            st->role_sent = true;
        }
        if (text)
            cJSON_AddStringToObject(delta, "content", text);
    } else {
        cJSON_AddStringToObject(choice, "text", text ? text : "");
    }
    if (logprobs)
        cJSON_AddItemToObject(choice, "logprobs", logprobs);
    else
        cJSON_AddNullToObject(choice, "logprobs");
    if (finish_reason) {
        coord_outcome o;
        coord_request_outcome(st->req, &o);
        cJSON_AddStringToObject(choice, "finish_reason", finish_reason);
        if (st->usage_chunk)
            cJSON_AddNullToObject(root, "usage"); /* it comes in a chunk of its own */
        else
            oa_add_usage(root, &o);
        cJSON_AddItemToObject(root, "orochi", oa_orochi_json(st->req, &o));
    } else {
        cJSON_AddNullToObject(choice, "finish_reason");
        if (st->usage_chunk)
            cJSON_AddNullToObject(root, "usage");
    }
    return root;
}

/* stream_options.include_usage: the chunk after the last, with no choices and the usage. */
static cJSON *oa_usage_chunk_json(openai_stream *st)
{
    cJSON *root = oa_envelope(st->lim, st->req,
                              st->chat ? "chat.completion.chunk" : "text_completion", st->created);
    cJSON_AddArrayToObject(root, "choices");
    coord_outcome o;
    coord_request_outcome(st->req, &o);
    oa_add_usage(root, &o);
    return root;
}

/* Appends one SSE event carrying `js` (taken). cJSON's compact output has no raw newlines, so the
 * JSON always fits one data: line. */
void openai_stream_event(openai_stream *st, cJSON *js)
{
    char *text = js ? cJSON_PrintUnformatted(js) : NULL;
    cJSON_Delete(js);
    if (!text) {
        st->out.oom = true;
        return;
    }
    strbuf_printf(&st->out, "data: %s\n\n", text);
    cJSON_free(text);
}

/* The logprobs a chunk carries (for a request that asks): the records of the tokens whose text
 * begins in the generated bytes p[0..n) it releases, which follow those sent so far; with `last`
 * (the final chunk, n = 0) every record left, and NULL when none is. */
static cJSON *oa_stream_logprobs(openai_stream *st, const char *p, size_t n, bool last)
{
    int count = 0;
    coord_logprob *lp = coord_request_logprobs(st->req, st->lp_next, &count);
    size_t end = st->raw_sent + n;
    int take = 0;
    while (take < count && (last || lp[take].text_start < end))
        take++;
    cJSON *obj = NULL;
    if (take || !last) {
        int top_n = coord_request_params(st->req)->top_logprobs;
        obj = oa_logprobs_new(st->chat);
        for (int i = 0; i < take; i++)
            oa_logprobs_add(
                obj, st->chat, top_n, &lp[i],
                st->chat ? 0 : oa_char_offset(&st->chars, p, n, st->raw_sent, lp[i].text_start));
    }
    oa_char_offset(&st->chars, p, n, st->raw_sent, end); /* on to the chunk's end */
    st->raw_sent = end;
    st->lp_next += take;
    free(lp);
    return obj;
}

/* Adds engine text; emits whatever forms complete UTF-8 (everything when flushing). */
void openai_stream_text(openai_stream *st, const char *text, size_t len, bool flush)
{
    strbuf_add(&st->hold, text, len);
    if (st->hold.oom) {
        st->out.oom = true;
        return;
    }
    /* an answer that is (or may still become) a tool call is held whole: it goes out as
     * tool_calls at the end; an auto answer that begins otherwise is content from then on */
    int tm = st->chat && !st->tools_decided && !flush ? oa_tool_mode(coord_request_params(st->req))
                                                      : 0; /* a flush sends what is held */
    if (tm) {
        size_t i = 0;
        while (i < st->hold.len && strchr(" \t\r\n", st->hold.p[i]))
            i++;
        if (tm == 2 || i == st->hold.len || st->hold.p[i] == '{')
            return;
        st->tools_decided = true;
    }
    size_t n =
        flush ? st->hold.len : utf8_complete((const unsigned char *)st->hold.p, st->hold.len);
    if (!n)
        return;
    char *clean = utf8_clean(st->hold.p, n);
    if (!clean) {
        st->out.oom = true;
        return;
    }
    cJSON *lps = coord_request_params(st->req)->logprobs
                     ? oa_stream_logprobs(st, st->hold.p, n, false)
                     : NULL;
    if (*clean || (lps && cJSON_GetArraySize(lps->child) > 0)) /* (the first array: tokens) */
        openai_stream_event(st, openai_chunk_json(st, clean, NULL, lps));
    else
        cJSON_Delete(lps);
    free(clean);
    memmove(st->hold.p, st->hold.p + n, st->hold.len - n);
    st->hold.len -= n;
}

void openai_stream_finish(openai_stream *st)
{
    coord_outcome o;
    coord_request_outcome(st->req, &o);
    const coord_params *p = coord_request_params(st->req);
    cJSON *calls = st->chat && !st->tools_decided && oa_tool_mode(p) && o.state != COORD_REQ_FAILED
                       ? oa_tool_calls(p, st->hold.p, st->hold.len, true)
                       : NULL;
    if (calls) { /* the held answer is a call: one delta carries it whole */
        cJSON *chunk = openai_chunk_json(st, NULL, NULL, NULL);
        cJSON *delta = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(chunk, "choices"), 0), "delta");
        cJSON_AddItemToObject(delta, "tool_calls", calls);
        openai_stream_event(st, chunk);
        openai_stream_event(st, openai_chunk_json(st, NULL, "tool_calls", NULL));
        if (st->more_follow)
            return;
        if (st->usage_chunk)
            openai_stream_event(st, oa_usage_chunk_json(st));
        strbuf_add(&st->out, "data: [DONE]\n\n", 15);
        return;
    }
    st->tools_decided = true;
    openai_stream_text(st, NULL, 0, true);
    if (o.state == COORD_REQ_FAILED) {
        int status;
        openai_stream_event(st,
                            openai_engine_error_json(st->chat, o.http_status, o.message, &status));
    } else {
        cJSON *lps =
            coord_request_params(st->req)->logprobs ? oa_stream_logprobs(st, NULL, 0, true) : NULL;
        openai_stream_event(
            st, openai_chunk_json(st, NULL, o.finish_reason[0] ? o.finish_reason : "stop", lps));
        if (st->usage_chunk && !st->more_follow)
            openai_stream_event(st, oa_usage_chunk_json(st));
    }
    if (!st->more_follow)
        strbuf_add(&st->out, "data: [DONE]\n\n", 15);
}

void openai_stream_free(openai_stream *st)
{
    strbuf_free(&st->out);
    strbuf_free(&st->hold);
}
