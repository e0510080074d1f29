/*
 * model/tokenizer — text <-> token ids from a GGUF file's own vocabulary.
 *
 * Two families: byte-level BPE (tokenizer.ggml.model = "gpt2", with the pre-tokenizer named by
 * tokenizer.ggml.pre) and SentencePiece-style BPE over scores ("llama"). Special/control tokens
 * written literally in the text (e.g. "<|im_start|>") map to their ids when parse_special is set.
 */
#ifndef OROCHI_TOKENIZER_H
#define OROCHI_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "model/gguf.h"

typedef struct tokenizer tokenizer;

/* Build from the file's tokenizer.* metadata; NULL with a one-line err on failure. */
tokenizer *tokenizer_new(const gguf_file *f, char *err, size_t errlen);
void tokenizer_destroy(tokenizer **tok);

int32_t tokenizer_vocab_size(const tokenizer *tok);
int32_t tokenizer_bos(const tokenizer *tok); /* -1 when none */
int32_t tokenizer_eos(const tokenizer *tok);
/* The tokens that end a generation (at most TOKENIZER_MAX_EOG): eos, the file's
 * tokenizer.ggml.eot_token_id / eom_token_id, and the control tokens that end an assistant's turn
 * in the families' chat formats (<|eot_id|>, <|eom_id|>, <end_of_turn>, <|end|>). Returns the
 * count, the ids in *ids. */
#define TOKENIZER_MAX_EOG 8
int tokenizer_eog(const tokenizer *tok, const int32_t **ids);
bool tokenizer_is_eog(const tokenizer *tok, int32_t id);
bool tokenizer_add_bos(const tokenizer *tok);                /* tokenizer.ggml.add_bos_token */
bool tokenizer_is_special(const tokenizer *tok, int32_t id); /* control tokens */

/* Encode text (len bytes) into ids; returns the number of ids written (at most cap) or -1 if cap
 * is too small; *needed (if not NULL) gets the full count. No BOS is added here. */
int tokenizer_encode(const tokenizer *tok, const char *text, size_t len, bool parse_special,
                     int32_t *ids, int cap, int *needed);

/* The bytes of token id (byte-level tokens decoded to raw bytes); returns length, 0 for unknown
 * ids. The pointer stays valid while tok lives. */
size_t tokenizer_piece(const tokenizer *tok, int32_t id, const char **bytes);
/* The token's string as stored in the vocab (for display). */
const char *tokenizer_token_text(const tokenizer *tok, int32_t id);

/* Decode ids into out (NUL-terminated); returns the byte length, or -1 if cap is too small. */
long tokenizer_decode(const tokenizer *tok, const int32_t *ids, int n, char *out, size_t cap);

/* Format a single user message with the chat template, ending with the assistant prompt
 * (tokenizer_chat_render of one message). NULL on failure (said on stderr). */
char *tokenizer_chat_prompt(const tokenizer *tok, const char *user_message);

/* Format a conversation of n messages (roles[i], contents[i]) ending with the assistant prompt;
 * a malloc'd string, or NULL with the reason in err. With a template (the file's
 * tokenizer.chat_template, or tokenizer_set_chat_template's) it is run as written by the Jinja
 * interpreter (model/jinja.h: as apply_chat_template with add_generation_prompt; "developer" is
 * passed as "system"); a template it cannot run fails with the construct named — never a
 * rendering by a guess. Without one, the built-in rendering:
 *   ChatML when the vocabulary's template uses <|im_start|> (each message as
 *     <|im_start|>ROLE\nCONTENT<|im_end|>\n);
 *   otherwise the Llama-2 form, [INST] USER [/INST] per user turn with the assistant's turns
 *     between them and a system message folded into the next user turn as <<SYS>>; a system
 *     message that no user turn follows is a turn of its own, never dropped. */
char *tokenizer_chat_render_err(const tokenizer *tok, int n, const char *const *roles,
                                const char *const *contents, char *err, size_t errlen);
/* The chat template run with the variables of a JSON object (jinja_render_vars: messages with
 * tool calls and tool turns, tools, enable_thinking, ...; roles passed as given). Only with a
 * template: a vocabulary without one fails, naming --chat-template. NULL with the reason in err. */
char *tokenizer_chat_render_vars(const tokenizer *tok, const char *vars, size_t len, char *err,
                                 size_t errlen);
/* Whether the chat template (the file's or the override) mentions name, e.g. "tools": a template
 * that never reads a variable cannot render it. False without a template. */
bool tokenizer_chat_mentions(const tokenizer *tok, const char *name);
/* tokenizer_chat_render_err, the reason on stderr. */
char *tokenizer_chat_render(const tokenizer *tok, int n, const char *const *roles,
                            const char *const *contents);
/* Use this Jinja chat template instead of the file's (--chat-template FILE). 0, or -1 when out of
 * memory. */
int tokenizer_set_chat_template(tokenizer *tok, const char *text, size_t len);
/* tokenizer_set_chat_template with the text of the file at path. 0, or -1 with err. */
int tokenizer_chat_template_file(tokenizer *tok, const char *path, char *err, size_t errlen);

#endif
