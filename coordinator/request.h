/*
 * coordinator/request — one generation job, shared between the HTTP threads that receive and
 * answer it and the engine thread that runs it.
 *
 * Life of a request: an HTTP thread creates it (coord_request_new), fills the input parameters
 * (plain fields of coord_params, string fields through the setters), and hands it to the engine's
 * submit callback. From then on the parameters are read-only. The engine appends generated ids
 * and their text as they are accepted (coord_request_append), with a logprob record per reported
 * token when the request asks for them (coord_request_append_logprobs), and ends it exactly once,
 * with coord_request_finish or coord_request_fail. The HTTP thread meanwhile blocks in
 * coord_request_wait, which hands over the text generated since its last offset, so a streaming
 * response can forward each piece as it arrives. When the client goes away the HTTP side calls
 * coord_request_cancel; the engine polls coord_request_cancelled between steps and should end the
 * request soon after (finish with "stop" or fail; either is fine, nobody is listening).
 *
 * Ownership: the object is reference counted. The creator holds one reference; an engine that
 * keeps the request past its submit callback takes its own with coord_request_ref and drops it
 * with coord_request_unref(&req), which also nulls the caller's pointer. The last unref frees.
 *
 * Thread safety: all output-side and waiting functions may be called from any thread (one mutex
 * and one condition variable per request). Parameter fields are written by the creator before
 * submit only, so the engine reads them without locking.
 */
#ifndef OROCHI_COORD_REQUEST_H
#define OROCHI_COORD_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define COORD_MAX_STOP 4          /* OpenAI allows up to four stop sequences */
#define COORD_DRAFT_KINDS_LEN 128 /* "model,ngram,layerskip,medusa" and room to spare */
#define COORD_MESSAGE_LEN 512     /* failure messages are cut to this many bytes */
#define COORD_STATUS_CONTEXT 413  /* failure status: the prompt does not fit the context */
#define COORD_MAX_TOP_LOGPROBS 20 /* alternatives per token (OpenAI's chat limit) */
#define COORD_MAX_BIAS 300        /* logit_bias entries (OpenAI's limit) */

typedef enum { COORD_REQ_COMPLETION, COORD_REQ_CHAT } coord_request_kind;

/* Where a request stands. RUNNING covers queued and generating. */
typedef enum { COORD_REQ_RUNNING, COORD_REQ_DONE, COORD_REQ_FAILED } coord_request_state;

typedef struct {
    char *role;    /* "system" | "user" | "assistant" (the API's "developer" is "system") */
    char *content; /* the message text (content parts already joined) */
} coord_message;

/* What a request's grammar stands for. */
typedef enum {
    COORD_CONSTRAIN_NONE,    /* no grammar */
    COORD_CONSTRAIN_GRAMMAR, /* the client's own grammar (the "grammar" field) */
    COORD_CONSTRAIN_JSON,    /* response_format json_object / json_schema */
    COORD_CONSTRAIN_TOOL, /* a tool call: {"name": ..., "arguments": {...}}, answered as tool_calls
                           */
} coord_constraint;

/* The job's input, as parsed from the HTTP body. Numeric fields are set directly by the creator;
 * string fields are owned by the request and set through the coord_request_set_ / add_ functions.
 */
typedef struct {
    coord_request_kind kind;
    char id[64];             /* "cmpl-..." / "chatcmpl-...", for responses and logs */
    char *prompt;            /* COMPLETION: the prompt text (NUL-terminated) */
    coord_message *messages; /* CHAT: the conversation, oldest first */
    int n_messages;
    int max_tokens;     /* >= 1; default 128 */
    double temperature; /* >= 0; 0 means greedy; default 1.0 as in the OpenAI API */
    double top_p;       /* (0, 1]; default 1 */
    int top_k;          /* 0 = off (a non-standard extension field) */
    bool has_seed;
    int64_t seed;
    bool stream;                /* informational for the engine: the HTTP side streams */
    bool stream_usage;          /* HTTP side only: stream_options.include_usage (a usage chunk) */
    bool echo;                  /* HTTP side only: answer the prompt before the completion */
    char *stop[COORD_MAX_STOP]; /* stop sequences; the engine ends generation at the first match */
    int n_stop;
    bool logprobs;    /* report each generated token's logprob (completions: logprobs >= 0; chat:
                       * logprobs true) */
    int top_logprobs; /* with logprobs: the most likely alternatives reported per token,
                       * 0..COORD_MAX_TOP_LOGPROBS (completions: the logprobs count) */
    /* logit_bias (added to the token's logit, -100..100) and the repetition penalties (-2..2:
     * a token's logit less count * frequency_penalty, less presence_penalty once it occurred,
     * counting the generated tokens): every row a token is chosen from is shaped so, drafts and
     * verification alike (coord_slots.c, engine_slot_shape) */
    int n_bias;
    int32_t bias_id[COORD_MAX_BIAS];
    float bias[COORD_MAX_BIAS];
    double frequency_penalty, presence_penalty;
    /* structured output: every answer is a sentence of this grammar (model/grammar.h), compiled
     * from response_format, a tool choice or the "grammar" extension field; NULL: free text.
     * Every row a token is chosen from is masked by it, drafts and verification alike
     * (coord_slots.c, engine_slot_constrain), and the tokens it forces are drafted. */
    struct grammar *grammar;
    char *grammar_text;          /* its text (a clone compiles its own copy) */
    coord_constraint constraint; /* what the grammar is for (how the answer is reported) */
    bool tools_auto; /* tools offered, tool_choice auto: an answer that is a call of one of them is
                      * reported as tool_calls, any other as content */
    char *chat_vars; /* CHAT with tools or tool turns: the template's variables as JSON (messages,
                      * tools), rendered by tokenizer_chat_render_vars; NULL: roles/contents */
    int n_choices;   /* n: answers to the same prompt (the HTTP side runs one request each,
                      * coord_request_clone; the engine sees each alone) */
    char *model;     /* the model the client named, or NULL */
    char *options_json; /* the raw JSON text of the body's "orochi" object, or NULL */
} coord_params;

/* Run statistics, reported by the engine when it finishes a request. */
typedef struct {
    int prompt_tokens;
    int cached_tokens; /* prompt tokens whose K/V were reused from an earlier request */
    int completion_tokens;
    int steps;                               /* verification steps (forward passes) */
    double mean_accepted;                    /* tokens accepted per step */
    int speculation_length; /* the draft depth it was last given (its own, in batches) */
    char draft_kinds[COORD_DRAFT_KINDS_LEN]; /* comma separated, e.g. "ngram,model"; "" if none */
    double queued_ms;                        /* from arrival to admission into a sequence slot */
    double prompt_ms; /* from admission to the first generated token (tokenize, prefill, sample) */
    double decode_ms; /* from the first generated token to the last */
} coord_stats;

/* A consistent snapshot of the request's end state (coord_request_outcome). */
typedef struct {
    coord_request_state state;
    bool cancelled;
    int http_status;                 /* FAILED: the status to answer with */
    char message[COORD_MESSAGE_LEN]; /* FAILED: why */
    char finish_reason[16];          /* DONE: "stop" | "length" */
    coord_stats stats;               /* DONE: as the engine reported them */
    int n_ids;                       /* ids generated so far */
    size_t text_len;                 /* bytes of text generated so far */
    int n_logprobs;                  /* logprob records appended so far */
} coord_outcome;

/* A token and its logprob: the log of its probability under the target model's distribution at
 * temperature 1 (the raw logits' softmax), whatever the request's sampling settings. `piece` is
 * the tokenizer's bytes for the id (not NUL-terminated; any bytes, possibly part of a UTF-8
 * character; a special token's literal text such as "<|im_end|>"). */
typedef struct {
    int32_t id;
    float logprob;
    const char *piece;
    size_t piece_len;
} coord_token_lp;

/* The logprob record of one generated token that the answer reports. */
typedef struct {
    coord_token_lp token; /* the token generated */
    size_t text_start;    /* byte offset in the generated text where its piece begins */
    int n_top;            /* alternatives in top: 0..COORD_MAX_TOP_LOGPROBS */
    coord_token_lp top[COORD_MAX_TOP_LOGPROBS]; /* most likely first (ties: the lower id first) */
} coord_logprob;

typedef struct coord_request coord_request;

/* A new request with the defaults above and one reference held by the caller; NULL when out of
 * memory. */
coord_request *coord_request_new(coord_request_kind kind);
coord_request *coord_request_ref(coord_request *req);
/* A new request with src's parameters (deep copies; its own grammar compiled from the text) and
 * none of its output: choice `index` of an n > 1 request. A seeded request's clone draws with seed
 * + index, so the choices differ. NULL when out of memory. */
coord_request *coord_request_clone(coord_request *src, int index);
/* Drops the caller's reference and sets *req to NULL; frees on the last one. NULL-safe. */
void coord_request_unref(coord_request **req);

/* --- input (creator, before submit) ---------------------------------------------------------- */

/* The parameters. Writable only until the request is submitted. */
coord_params *coord_request_params(coord_request *req);
/* String setters copy their argument; each returns 0, or -1 when out of memory (or, for
 * coord_request_add_stop, when COORD_MAX_STOP are already set). */
int coord_request_set_prompt(coord_request *req, const char *text);
int coord_request_add_message(coord_request *req, const char *role, const char *content);
int coord_request_add_stop(coord_request *req, const char *stop);
int coord_request_set_model(coord_request *req, const char *model);
int coord_request_set_options(coord_request *req, const char *json);
/* Compiles and keeps the grammar text (replacing any earlier one). 0; 1 with the grammar's error
 * in err; -1 when out of memory. */
int coord_request_set_grammar(coord_request *req, const char *text, size_t len,
                              coord_constraint what, char *err, size_t errlen);
/* Keeps the template variables (a JSON object's text). 0, or -1 when out of memory. */
int coord_request_set_chat_vars(coord_request *req, const char *json);

/* --- output (engine thread) ------------------------------------------------------------------ */

/* Appends n generated ids and the `len` bytes of text they decode to (either may be empty) and
 * wakes waiters. Returns 0, or -1 if the request has already ended (the call is then ignored) or
 * memory ran out (the request is then failed with 500). */
int coord_request_append(coord_request *req, const int32_t *ids, int n, const char *text,
                         size_t len);
/* Appends the logprob records of n generated tokens (for a request with params.logprobs), their
 * pieces copied. Records go in generation order and must be appended before the text they start in
 * (coord_request_append), so a streaming reader that holds the text up to some offset also holds
 * the records of every token starting before it. Tokens the answer does not report are not
 * appended: the end-of-sequence token, and tokens after a stop string (see
 * coord_request_cut_logprobs). Returns 0, or -1 if the request has already ended or memory ran out
 * (the request is then failed with 500). */
int coord_request_append_logprobs(coord_request *req, const coord_logprob *lp, int n);
/* A stop string cut the text at byte text_end: drops the records of the tokens whose text starts at
 * or after it. Those tokens' text was never handed to a reader (the engine holds back text that may
 * begin a stop string), so no reader has released their records either. */
void coord_request_cut_logprobs(coord_request *req, size_t text_end);
/* Ends the request successfully. finish_reason: "stop" or "length". stats may be NULL (then all
 * zero except completion_tokens, which counts the appended ids). Returns -1 if already ended. */
int coord_request_finish(coord_request *req, const char *finish_reason, const coord_stats *stats);
/* Ends the request with an HTTP status (400, 413, 500, 503, ...) and a message for the client.
 * 413 (COORD_STATUS_CONTEXT) is reserved for "the prompt does not fit the context" and the message
 * should give the prompt's tokens and the context length; the HTTP side answers it as OpenAI does,
 * 400 with code context_length_exceeded. Returns -1 if already ended. */
int coord_request_fail(coord_request *req, int http_status, const char *message);
/* True once the client has gone away; the engine should stop working on the request. */
bool coord_request_cancelled(const coord_request *req);

/* --- waiting side (HTTP thread) -------------------------------------------------------------- */

/* Blocks until the text grows past *text_off, the request ends, or timeout_ms passes (< 0: no
 * limit, 0: just look). The text past *text_off is handed over: if piece is not NULL, *piece gets a
 * malloc'd NUL-terminated copy of it (NULL when there is none) and *piece_len its length, and
 * *text_off moves to the end of the text (when the copy cannot be allocated, *piece is NULL and
 * *text_off stays, so nothing is lost). Returns the state at
 * that moment, so a DONE/FAILED return means the handed-over text is the last. Returns at once
 * (RUNNING) once the request is cancelled. */
coord_request_state coord_request_wait(coord_request *req, size_t *text_off, int timeout_ms,
                                       char **piece, size_t *piece_len);
/* The client went away: flags the request for the engine and wakes waiters. Idempotent. */
void coord_request_cancel(coord_request *req);
coord_request_state coord_request_state_now(coord_request *req);
void coord_request_outcome(coord_request *req, coord_outcome *out);
/* malloc'd copies of everything generated so far. The ids copy is NULL with *n = 0 when there are
 * none; the text copy is NUL-terminated ("" when empty). NULL with a zero count when out of memory.
 */
int32_t *coord_request_ids(coord_request *req, int *n);
char *coord_request_text(coord_request *req, size_t *len);
/* A malloc'd copy of the logprob records from index `from` on (one block: the records, then their
 * pieces, which the records point into; free() it once). NULL with *n = 0 when there are none or
 * memory ran out. */
coord_logprob *coord_request_logprobs(coord_request *req, int from, int *n);

#endif
