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
bool tokenizer_add_bos(const tokenizer *tok); /* tokenizer.ggml.add_bos_token */
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

/* Format a single user message with the file's chat template (ChatML when the template uses
 * <|im_start|>, Llama-2 [INST] otherwise) ending with the assistant prompt. Returns a malloc'd
 * string, or NULL on allocation failure. The system message is the template's default, if any. */
char *tokenizer_chat_prompt(const tokenizer *tok, const char *user_message);

/* Format a conversation of n messages (roles[i], contents[i]) with the file's chat template,
 * ending with the assistant prompt; a malloc'd string, or NULL on allocation failure.
 *   ChatML: each message as <|im_start|>ROLE\nCONTENT<|im_end|>\n, preceded by the template's
 *     default system message when the first message is not a system one (as the template's own
 *     `loop.first and messages[0]['role'] != 'system'` rule says); "developer" is a system role.
 *   Otherwise: the Llama-2 form, [INST] USER [/INST] per user turn with the assistant's turns
 *     between them and a system message folded into the next user turn as <<SYS>>; a system
 *     message that no user turn follows (an assistant turn or the end comes first) is a turn of
 *     its own, [INST] <<SYS>>\nSYSTEM\n<</SYS>>\n\n [/INST], never dropped.
 * One user message gives exactly tokenizer_chat_prompt's text. */
char *tokenizer_chat_render(const tokenizer *tok, int n, const char *const *roles,
                            const char *const *contents);

#endif
