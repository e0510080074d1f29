/*
 * model/tokenizer_internal — the tokenizer's state, shared by the files that make up the tokenizer
 * (model/tokenizer.c: vocabulary, encoding and decoding; model/chat.c: chat templates). Nothing
 * outside model/ includes it.
 */
#ifndef OROCHI_TOKENIZER_INTERNAL_H
#define OROCHI_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/tokenizer.h"

enum { TOK_KIND_BPE, TOK_KIND_SPM };
enum { TOK_PRE_GPT2, TOK_PRE_SMOLLM, TOK_PRE_LLAMA3, TOK_PRE_QWEN2 };
enum {
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

typedef struct {
    uint64_t key; /* (left id << 32) | right id; UINT64_MAX = empty */
    int32_t rank;
    int32_t result;
} tokenizer_merge_slot;

struct tokenizer {
    int kind;
    int pre;
    bool ignore_merges; /* llama3: a pre-token that is a whole vocab entry is emitted as is */
    int32_t n_vocab;

    char *text;          /* all token strings, each NUL-terminated */
    size_t *text_off;    /* n_vocab + 1 */
    char *piece;         /* decoded bytes of each token */
    size_t *piece_off;   /* n_vocab + 1 */
    uint8_t *type;       /* token types (1 when the file has none) */
    float *score;        /* SPM scores (NULL for BPE) */

    int32_t *vocab_ht;   /* string -> id, open addressing, -1 empty */
    size_t vocab_mask;
    tokenizer_merge_slot *merge_ht;
    size_t merge_mask;

    int32_t byte_id[256]; /* BPE: the byte's printable-char token; SPM: <0xXX>; -1 none */

    int32_t *special;        /* special token ids by (first byte, length desc) */
    int32_t special_first[257];
    int32_t n_special;

    int32_t bos, eos, unk;
    int32_t eog[TOKENIZER_MAX_EOG]; /* the tokens that end a generation (tokenizer_eog) */
    int n_eog;
    bool add_bos;
    bool add_space_prefix;
    bool chatml;
    char *chat_system; /* the template's default system message, or NULL */
    char *chat_template; /* tokenizer.chat_template (or an override), run by model/jinja.c */
    size_t chat_template_len;
};

/* The text of token id (tokenizer.c) and its length. */
const char *tok_text(const tokenizer *tok, int32_t id, size_t *len);
/* The opening of a ChatML system turn. */
#define TOK_SYS_OPEN "<|im_start|>system\n"

#endif
