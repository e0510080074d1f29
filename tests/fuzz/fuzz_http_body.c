/*
 * tests/fuzz/fuzz_http_body — libFuzzer target for the API's OpenAI format (coordinator/openai.h):
 * openai_parse_request, which fills a coord_request through coordinator/request.c, and the answer
 * side that turns engine text into JSON and server-sent events. It calls the parser exactly as the
 * transport (coordinator/http.c, http_generate) does: the body as libmicrohttpd's upload handler
 * accumulates it (NUL-terminated, NULL when empty).
 *
 * Input: byte 0 = flags, the rest = the body.
 *   bit 0  route: /v1/chat/completions if set, else /v1/completions
 *   bits 1-2  max_tokens cap of the server: 4096, 1, 100000, INT_MAX
 *   bits 3-7  seed of the splits used for the answer side (below)
 *
 * Checked: a rejected body gives no request and an error of status 400 (404 with code
 * model_not_found for a model the server does not serve) with a message, which the error object
 * must carry as valid JSON; an accepted body gives a request whose every field matches an
 * independent reading of the same JSON with cJSON (prompt or messages and their roles, "developer"
 * as "system", max_tokens within [1, cap] or the default 128, temperature in [0, 2], top_p in
 * (0, 1], top_k, seed, stream and stream_options, echo, up to 4 non-empty stop strings, the served
 * model, the "orochi" object as JSON text), holds nothing the route does not take, and came from
 * a body whose strings and keys are all valid UTF-8 without a \u0000. Then the body's raw bytes
 * are played as engine
 * output, appended in pieces cut at fuzzer-chosen points: the non-streaming answer and every SSE
 * event must be valid JSON whose strings are valid UTF-8, and the streamed text pieces must join
 * to exactly the whole text with invalid bytes replaced (a UTF-8 character cut between pieces is
 * held back, never mangled).
 *
 * Build and run: `make fuzz`, then tests/fuzz/run_fuzz.sh (seeds: tests/fuzz/corpus/http_body/,
 * dictionary: tests/fuzz/http_body.dict).
 */
#define _GNU_SOURCE /* memmem */
#include "coordinator/openai.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/utf8.h"

#include <limits.h>

#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- an independent reading of the body ---------------------------------------------------- */

static void fz_check_json_utf8(const cJSON *js);

static const cJSON *fz_member(const cJSON *root, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static void fz_expect_str(const char *what, const char *got, const char *want)
{
    if (!got || !want || strcmp(got, want))
        fuzz_fail("%s: request holds '%.80s', the body says '%.80s'", what, got ? got : "(null)",
                  want ? want : "(null)");
}

/* The accepted request must say what the body says. */
static void fz_check_request(coord_request *req, bool chat, int cap, const char *body, size_t len)
{
    const coord_params *p = coord_request_params(req);
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root || !cJSON_IsObject(root))
        fuzz_fail("accepted a body that cJSON does not read as an object");
    if (p->kind != (chat ? COORD_REQ_CHAT : COORD_REQ_COMPLETION))
        fuzz_fail("request kind %d on the %s route", p->kind, chat ? "chat" : "completions");
    const cJSON *v;
    if (chat) {
        if (p->prompt)
            fuzz_fail("chat request carries a prompt");
        const cJSON *msgs = fz_member(root, "messages");
        if (!cJSON_IsArray(msgs) || p->n_messages != cJSON_GetArraySize(msgs) || p->n_messages < 1)
            fuzz_fail("%d messages in the request, body has %d", p->n_messages,
                      cJSON_GetArraySize(msgs));
        for (int i = 0; i < p->n_messages; i++) {
            const cJSON *m = cJSON_GetArrayItem(msgs, i);
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
            const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
            const char *as = cJSON_GetStringValue(role);
            if (as && !strcmp(as, "developer")) /* OpenAI's newer name for the system role */
                as = "system";
            fz_expect_str("role", p->messages[i].role, as);
            if (strcmp(p->messages[i].role, "system") && strcmp(p->messages[i].role, "user") &&
                strcmp(p->messages[i].role, "assistant") && strcmp(p->messages[i].role, "tool"))
                fuzz_fail("message %d has role '%s'", i, p->messages[i].role);
            const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
            if (calls && !cJSON_IsNull(calls)) {
                /* an assistant's calls: each as the model writes one, a JSON object a line */
                if (strcmp(p->messages[i].role, "assistant") || !cJSON_IsArray(calls))
                    fuzz_fail("message %d: tool_calls accepted on a %s message", i,
                              p->messages[i].role);
                if (cJSON_GetArraySize(calls) && p->messages[i].content[0] != '{')
                    fuzz_fail("message %d: its calls' text '%.40s' is not JSON", i,
                              p->messages[i].content);
            } else if (cJSON_IsString(content)) {
                fz_expect_str("content", p->messages[i].content, content->valuestring);
            } else {
                /* text parts, joined */
                size_t n = 0;
                const cJSON *part;
                cJSON_ArrayForEach(part, content)
                {
                    const char *t =
                        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(part, "text"));
                    if (!t)
                        fuzz_fail("message %d: accepted a content part without text", i);
                    size_t l = strlen(t);
                    if (strncmp(p->messages[i].content + n, t, l))
                        fuzz_fail("message %d: content part not where it belongs", i);
                    n += l;
                }
                if (strlen(p->messages[i].content) != n)
                    fuzz_fail("message %d: %zu content bytes, parts hold %zu", i,
                              strlen(p->messages[i].content), n);
            }
        }
    } else {
        if (p->messages || p->n_messages)
            fuzz_fail("completion request carries messages");
        v = fz_member(root, "prompt");
        if (cJSON_IsArray(v))
            v = cJSON_GetArrayItem(v, 0);
        fz_expect_str("prompt", p->prompt, cJSON_GetStringValue(v));
    }
    v = fz_member(root, "n");
    if (p->n_choices != (v ? (int)v->valuedouble : 1) || p->n_choices < 1 || p->n_choices > 8)
        fuzz_fail("n_choices %d, the body says %g", p->n_choices, v ? v->valuedouble : 1.0);
    /* a grammar exactly when the body asks for a constrained answer */
    const cJSON *rf = fz_member(root, "response_format"), *tc = fz_member(root, "tool_choice");
    const char *rft = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rf, "type"));
    bool constrained = fz_member(root, "grammar") || (rft && strcmp(rft, "text")) ||
                       (tc && !(cJSON_IsString(tc) && (!strcmp(tc->valuestring, "auto") ||
                                                       !strcmp(tc->valuestring, "none"))));
    if (constrained != (p->grammar != NULL))
        fuzz_fail("the request %s a grammar, the body %s one", p->grammar ? "has" : "has no",
                  constrained ? "asks for" : "does not ask for");
    if ((v = fz_member(root, "max_tokens")) || (v = fz_member(root, "max_completion_tokens"))) {
        if (!cJSON_IsNumber(v) || v->valuedouble != (double)p->max_tokens)
            fuzz_fail("max_tokens %d, body says %g", p->max_tokens, v->valuedouble);
    } else if (p->max_tokens != 128 && p->max_tokens != (cap < 128 ? cap : 128)) {
        fuzz_fail("max_tokens %d without one in the body", p->max_tokens); /* the default */
    }
    /* the default (128) is held to the cap as well */
    if (p->max_tokens < 1 || p->max_tokens > cap)
        fuzz_fail("max_tokens %d outside [1, %d]", p->max_tokens, cap);
    v = fz_member(root, "temperature");
    if (!(p->temperature >= 0 && p->temperature <= 2) ||
        p->temperature != (v ? v->valuedouble : 1.0))
        fuzz_fail("temperature %g", p->temperature);
    v = fz_member(root, "top_p");
    if (!(p->top_p > 0 && p->top_p <= 1) || p->top_p != (v ? v->valuedouble : 1.0))
        fuzz_fail("top_p %g", p->top_p);
    v = fz_member(root, "top_k");
    if (p->top_k < 0 || p->top_k > (1 << 24) || p->top_k != (v ? (int)v->valuedouble : 0))
        fuzz_fail("top_k %d", p->top_k);
    v = fz_member(root, "seed");
    if (p->has_seed != (v != NULL))
        fuzz_fail("has_seed %d", p->has_seed);
    if (v && !(fabs(v->valuedouble) >= 4e18 || (double)p->seed == v->valuedouble))
        fuzz_fail("seed %lld, body says %g", (long long)p->seed, v->valuedouble);
    v = fz_member(root, "stream");
    if (p->stream != (v && cJSON_IsTrue(v)))
        fuzz_fail("stream %d", p->stream);
    v = fz_member(root, "stop");
    int n_stop = !v ? 0 : cJSON_IsString(v) ? 1 : cJSON_GetArraySize(v);
    if (p->n_stop != n_stop || n_stop > COORD_MAX_STOP)
        fuzz_fail("%d stop strings, body has %d", p->n_stop, n_stop);
    for (int i = 0; i < p->n_stop; i++) {
        fz_expect_str("stop", p->stop[i],
                      cJSON_GetStringValue(cJSON_IsString(v) ? v : cJSON_GetArrayItem(v, i)));
        if (!p->stop[i][0])
            fuzz_fail("empty stop string accepted");
    }
    v = fz_member(root, "model");
    if (v) {
        fz_expect_str("model", p->model, cJSON_GetStringValue(v));
        fz_expect_str("model served", p->model, "fuzz-model");
    } else if (p->model) {
        fuzz_fail("model '%s' without one in the body", p->model);
    }
    v = fz_member(root, "stream_options");
    if (p->stream_usage != (v && cJSON_IsTrue(fz_member(v, "include_usage"))))
        fuzz_fail("stream_usage %d", p->stream_usage);
    if (p->stream_usage && !p->stream)
        fuzz_fail("stream_usage without stream");
    v = fz_member(root, "echo");
    if (p->echo != (!chat && v && cJSON_IsTrue(v)))
        fuzz_fail("echo %d", p->echo);
    /* logprobs: completions an integer 0..5 (also the alternatives' count, never with echo),
     * chat true with top_logprobs 0..20; null and false are off */
    v = fz_member(root, "logprobs");
    bool lp_on = v && !cJSON_IsFalse(v) && !cJSON_IsNull(v);
    if (p->logprobs != lp_on)
        fuzz_fail("logprobs %d for a body whose logprobs is %s", p->logprobs,
                  v ? (cJSON_IsNumber(v) ? "a number" : "not a number") : "absent");
    if (p->logprobs && !chat &&
        !(cJSON_IsNumber(v) && v->valuedouble == p->top_logprobs && p->top_logprobs <= 5))
        fuzz_fail("completions logprobs accepted as %d alternatives", p->top_logprobs);
    if (p->logprobs && !chat && p->echo)
        fuzz_fail("echo with logprobs accepted");
    if (p->logprobs && chat && (!cJSON_IsTrue(v) || p->top_logprobs > 20))
        fuzz_fail("chat logprobs accepted with %d alternatives", p->top_logprobs);
    if (p->top_logprobs < 0 || (!p->logprobs && p->top_logprobs))
        fuzz_fail("top_logprobs %d with logprobs %d", p->top_logprobs, p->logprobs);
    v = fz_member(root, "orochi");
    if (v) {
        cJSON *opt = p->options_json ? cJSON_Parse(p->options_json) : NULL;
        /* (not cJSON_Compare: a number out of double range prints as null) */
        if (!cJSON_IsObject(opt) || cJSON_GetArraySize(opt) != cJSON_GetArraySize(v))
            fuzz_fail("the orochi object does not survive as JSON text: %.100s",
                      p->options_json ? p->options_json : "(null)");
        cJSON_Delete(opt);
    } else if (p->options_json) {
        fuzz_fail("options without an orochi object");
    }
    /* strings arrive whole: no string or key holds bytes that are not UTF-8, and the body has no
     * \u0000 escape (an odd run of backslashes before "u0000": JSON has escapes only in strings) */
    fz_check_json_utf8(root);
    for (size_t i = 0; i < len; i++) {
        if (body[i] != '\\')
            continue;
        size_t k = i;
        while (k < len && body[k] == '\\')
            k++;
        if ((k - i) % 2 == 1 && len - k >= 5 && !memcmp(body + k, "u0000", 5))
            fuzz_fail("accepted a body with a \\u0000 escape at byte %zu", k - 1);
        i = k;
    }
    cJSON_Delete(root);
}

/* ---- the answer side ------------------------------------------------------------------------ */

/* Every string in js (keys included) must be valid UTF-8. */
static void fz_check_json_utf8(const cJSON *js)
{
    for (; js; js = js->next) {
        if (js->string && !fuzz_utf8_valid(js->string, strlen(js->string)))
            fuzz_fail("invalid UTF-8 in a JSON key");
        if (cJSON_IsString(js) && !fuzz_utf8_valid(js->valuestring, strlen(js->valuestring)))
            fuzz_fail("invalid UTF-8 in a JSON string answered to the client");
        fz_check_json_utf8(js->child);
    }
}

static cJSON *fz_reparse(const char *text, size_t len, const char *what)
{
    cJSON *js = cJSON_ParseWithLength(text, len);
    if (!js)
        fuzz_fail("%s is not valid JSON: %.200s", what, text);
    fz_check_json_utf8(js);
    return js;
}

/* Plays `text` as the engine's output of req in pieces, then checks both answer forms. */
static void fz_answer(const openai_limits *lim, coord_request *req, bool chat, const uint8_t *text,
                      size_t len, unsigned seed)
{
    /* the reference: the whole text with invalid bytes replaced, NULs dropped */
    char *want = utf8_clean((const char *)text, len);
    if (!want || !fuzz_utf8_valid(want, strlen(want)))
        fuzz_fail("utf8_clean produced invalid UTF-8");
    /* echo: the non-streaming answer holds the prompt, then the completion */
    const coord_params *prm = coord_request_params(req);
    char *want_all = want;
    if (prm->echo && prm->prompt) {
        size_t pl = strlen(prm->prompt);
        char *both = malloc(pl + len + 1);
        if (!both)
            abort();
        memcpy(both, prm->prompt, pl);
        if (len)
            memcpy(both + pl, text, len);
        want_all = utf8_clean(both, pl + len);
        free(both);
    }
    openai_stream st = {.lim = lim, .req = req, .chat = chat, .created = 1700000000};
    size_t at = 0;
    int32_t id = 0;
    while (at < len) {
        seed = seed * 1103515245u + 12345u;
        /* mostly long pieces (each makes an event to check), some of 1-3 bytes to cut characters */
        size_t piece = (seed >> 16) % 4 ? 1 + (seed >> 18) % 48 : 1 + (seed >> 18) % 3;
        if (piece > len - at)
            piece = len - at;
        if (coord_request_append(req, &id, 1, (const char *)text + at, piece))
            fuzz_fail("coord_request_append failed on a running request");
        openai_stream_text(&st, (const char *)text + at, piece, false);
        at += piece;
        id++;
    }
    coord_stats stats = {
        .prompt_tokens = 3, .completion_tokens = id, .steps = 2, .mean_accepted = 1.5};
    snprintf(stats.draft_kinds, sizeof stats.draft_kinds, "ngram, model,");
    if (coord_request_finish(req, "stop", &stats))
        fuzz_fail("coord_request_finish failed on a running request");
    openai_stream_text(&st, NULL, 0, true);
    if (st.out.oom || st.hold.len)
        fuzz_fail("stream: %zu bytes held after the flush", st.hold.len);

    /* the SSE events: "data: {json}\n\n", their text joined must be the cleaned whole */
    size_t joined_len = 0;
    char *joined = malloc(st.out.len + 1);
    if (!joined)
        abort();
    for (size_t i = 0; i < st.out.len;) {
        if (st.out.len - i < 8 || memcmp(st.out.p + i, "data: ", 6))
            fuzz_fail("SSE output does not continue with 'data: ' at byte %zu", i);
        const char *ev = st.out.p + i + 6;
        const char *end = memmem(ev, st.out.len - i - 6, "\n\n", 2);
        if (!end || memchr(ev, '\n', (size_t)(end - ev)))
            fuzz_fail("SSE event at byte %zu is not one line", i);
        cJSON *js = fz_reparse(ev, (size_t)(end - ev), "an SSE event");
        const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(js, "choices"), 0);
        const char *t = chat ? cJSON_GetStringValue(cJSON_GetObjectItem(
                                   cJSON_GetObjectItem(choice, "delta"), "content"))
                             : cJSON_GetStringValue(cJSON_GetObjectItem(choice, "text"));
        if (!t || !*t)
            fuzz_fail("an SSE event without text");
        memcpy(joined + joined_len, t, strlen(t));
        joined_len += strlen(t);
        cJSON_Delete(js);
        i = (size_t)(end - st.out.p) + 2;
    }
    if (joined_len != strlen(want) || memcmp(joined, want, joined_len))
        fuzz_fail("streamed text (%zu bytes) differs from the whole text cleaned (%zu bytes)",
                  joined_len, strlen(want));
    free(joined);
    strbuf_free(&st.out);
    strbuf_free(&st.hold);

    /* the final chunk and the non-streaming answer */
    cJSON *fin = openai_chunk_json(&st, NULL, "stop", NULL);
    char *s = cJSON_PrintUnformatted(fin);
    cJSON_Delete(fz_reparse(s, strlen(s), "the final SSE chunk"));
    cJSON_free(s);
    cJSON_Delete(fin);
    cJSON *res = openai_result_json(lim, req, 1700000000);
    s = cJSON_PrintUnformatted(res);
    cJSON *back = fz_reparse(s, strlen(s), "the answer");
    const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(back, "choices"), 0);
    const char *t = chat ? cJSON_GetStringValue(cJSON_GetObjectItem(
                               cJSON_GetObjectItem(choice, "message"), "content"))
                         : cJSON_GetStringValue(cJSON_GetObjectItem(choice, "text"));
    if (!t || strcmp(t, want_all))
        fuzz_fail("the answer's text differs from the whole text cleaned");
    const cJSON *ids = cJSON_GetObjectItem(cJSON_GetObjectItem(back, "orochi"), "token_ids");
    if (cJSON_GetArraySize(ids) != id)
        fuzz_fail("the answer lists %d token ids, %d were appended", cJSON_GetArraySize(ids), id);
    cJSON_Delete(back);
    cJSON_free(s);
    cJSON_Delete(res);
    if (want_all != want)
        free(want_all);
    free(want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const int caps[4] = {4096, 1, 100000, INT_MAX};
    uint8_t flags = data[0];
    bool chat = flags & 1;
    int cap = caps[(flags >> 1) & 3];
    openai_limits lim = {.max_tokens_cap = cap, .model_name = "fuzz-model"};

    /* the body as http_on_request collects it: NUL-terminated, NULL when nothing came */
    strbuf body = {0};
    if (size > 1)
        strbuf_add(&body, (const char *)data + 1, size - 1);
    openai_err e = {0};
    coord_request *req = openai_parse_request(&lim, chat, body.p, body.len, &e);
    if (req) {
        if (e.status)
            fuzz_fail("a request and an error (%d %s) at once", e.status, e.message);
        fz_check_request(req, chat, cap, body.p, body.len);
    } else {
        /* 400, or 404 model_not_found for a model this server does not serve */
        if (e.status != 400 &&
            !(e.status == 404 && !strcmp(e.param, "model") && !strcmp(e.code, "model_not_found")))
            fuzz_fail("rejected with status %d (param '%s', code '%s'): %s", e.status, e.param,
                      e.code, e.message);
        if (!memchr(e.message, '\0', sizeof e.message) || !e.message[0])
            fuzz_fail("rejected with an empty or unterminated message");
        if (!memchr(e.param, '\0', sizeof e.param) || !memchr(e.code, '\0', sizeof e.code))
            fuzz_fail("error param or code not NUL-terminated");
        cJSON *js = openai_error_json(e.status, e.message, e.param, e.code);
        char *s = cJSON_PrintUnformatted(js);
        cJSON *back = fz_reparse(s, strlen(s), "the error answer");
        const char *msg = cJSON_GetStringValue(
            cJSON_GetObjectItem(cJSON_GetObjectItem(back, "error"), "message"));
        char *clean = utf8_clean(e.message, strlen(e.message));
        if (!msg || !clean || strcmp(msg, clean))
            fuzz_fail("the error answer does not carry the message");
        free(clean);
        cJSON_Delete(back);
        cJSON_free(s);
        cJSON_Delete(js);
        req = coord_request_new(chat ? COORD_REQ_CHAT : COORD_REQ_COMPLETION);
        if (!req)
            abort();
    }
    snprintf(coord_request_params(req)->id, sizeof coord_request_params(req)->id, "%s-fuzz",
             chat ? "chatcmpl" : "cmpl");
    fz_answer(&lim, req, chat, data + 1, size - 1, flags >> 3);
    coord_request_unref(&req);
    strbuf_free(&body);
    return 0;
}
