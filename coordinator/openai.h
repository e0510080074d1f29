/*
 * coordinator/openai — the OpenAI format of the API, with no I/O: a request body parsed and checked
 * into a coord_request (coordinator/request.h), and the answers rendered — the whole answer, an
 * error, and the server-sent events of a streamed one. coordinator/http.c is the transport around
 * it (sockets, routes, waiting, keep-alives); tests/fuzz/fuzz_http_body.c drives it through this
 * header. docs/http-api.md describes the fields.
 */
#ifndef OROCHI_OPENAI_H
#define OROCHI_OPENAI_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "base/buf.h"
#include "coordinator/request.h"

/* What the server serves: the model name a request may ask for and the largest max_tokens. */
typedef struct {
    const char *model_name;
    int max_tokens_cap;
} openai_limits;

/* A validation error, answered as an OpenAI-style error object. */
typedef struct {
    int status;
    char param[128]; /* "" -> null */
    char code[32];   /* "" -> null; e.g. "model_not_found" */
    char message[320];
} openai_err;

/* Fill *e (status, param, the formatted message); returns -1. */
int openai_fail(openai_err *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A new request (chat: /v1/chat/completions, else /v1/completions) from the JSON body[0..len),
 * or NULL with *e filled: 400 for a body that is not a JSON object, a field of the wrong type or
 * range, a string with a NUL or invalid UTF-8 (param: its path); 404 model_not_found for another
 * model; 503 out of memory. */
coord_request *openai_parse_request(const openai_limits *lim, bool chat, const char *body,
                                    size_t len, openai_err *e);

/* {"error":{message, type, param, code}}; param and code NULL or "" are null. */
cJSON *openai_error_json(int status, const char *message, const char *param, const char *code);
/* An engine failure as the client sees it: the engine's 413 (the prompt does not fit the context)
 * is answered as OpenAI answers it, 400 context_length_exceeded naming the prompt or messages;
 * *out_status gets the status to send. */
cJSON *openai_engine_error_json(bool chat, int status, const char *message, int *out_status);
/* The whole answer of a finished request: choices, usage and the "orochi" object. */
cJSON *openai_result_json(const openai_limits *lim, coord_request *req, time_t created);
/* The answer of n requests for the same prompt (n > 1): their choices in order, the usage's
 * completion tokens summed. */
cJSON *openai_result_json_n(const openai_limits *lim, coord_request *const *reqs, int n,
                            time_t created);
/* `key`: s[0..n) as a JSON string, invalid UTF-8 replaced. */
void openai_json_add_text(cJSON *obj, const char *key, const char *s, size_t n);

/* A walk through generated text turning byte offsets into character offsets (text_offset). */
typedef struct {
    size_t byte, chars; /* text byte reached, characters before it */
} openai_chars;

/* The format state of one streamed answer. The transport sets lim, req, chat, usage_chunk and
 * created, feeds the engine's text, and sends `out` (SSE bytes, appended; `oom` sticks). */
#define OPENAI_MAX_CHOICES 8 /* n: answers to one prompt */

typedef struct {
    const openai_limits *lim;
    coord_request *req;
    bool chat, role_sent;
    int index;        /* the choice's index (n > 1: each choice is a stream of its own, in turn) */
    bool more_follow; /* another choice's stream follows: no usage chunk and no [DONE] yet */
    bool tools_decided; /* the answer is content, not a tool call (or it cannot be one) */
    bool usage_chunk;   /* stream_options.include_usage: usage in a chunk of its own at the end */
    time_t created;
    strbuf out;  /* SSE bytes written so far */
    strbuf hold; /* text whose last UTF-8 character is incomplete */
    /* logprobs (when the request asks): the next record to send, the generated text's bytes sent
     * in chunks so far, and where text_offset's character count stands */
    int lp_next;
    size_t raw_sent;
    openai_chars chars;
} openai_stream;

/* One chunk: a text piece, or (finish_reason set) the final chunk with usage and the orochi
 * object. logprobs (taken) is the chunk's logprobs object; NULL: null. */
cJSON *openai_chunk_json(openai_stream *st, const char *text, const char *finish_reason,
                         cJSON *logprobs);
/* Appends one SSE event carrying `js` (taken) to st->out. */
void openai_stream_event(openai_stream *st, cJSON *js);
/* Adds engine text; writes an event for whatever forms complete UTF-8 (everything when
 * flushing). An answer that is, or may still become, a tool call is held until the end
 * (openai_stream_finish sends it as tool_calls), unless flushing. */
void openai_stream_text(openai_stream *st, const char *text, size_t len, bool flush);
/* The request ended (done or failed): what is held, the final chunk (or the error), the usage
 * chunk when asked for, and "data: [DONE]". */
void openai_stream_finish(openai_stream *st);
void openai_stream_free(openai_stream *st);

#endif
