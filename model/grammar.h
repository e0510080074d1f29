/*
 * model/grammar — context-free grammars that constrain generated text: a GBNF-like grammar is
 * compiled once (grammar_parse), a parse position follows the text byte by byte (grammar_state),
 * and a token mask says which vocabulary tokens may come next (grammar_matcher). The engine
 * masks every row a token is chosen from with it, drafts and verification alike, so constrained
 * speculative decoding gives what constrained sequential decoding gives (docs/grammar.md).
 *
 * The grammar language (the root rule is `root`):
 *   name ::= alternative | alternative ...     a rule; names are [A-Za-z0-9_-]+; a rule ends
 *                                              where the next `name ::=` begins
 *   "text"                                     a literal (escapes \n \r \t \\ \" \' \/ \xHH
 *                                              \uHHHH \UHHHHHHHH)
 *   [a-z0-9_] [^"\\]                           a character class (ranges; ^ negates; the same
 *                                              escapes, and \] \- \^ \[)
 *   .                                          any character
 *   name                                       a rule reference (rules may come in any order)
 *   ( ... )                                    a group
 *   x* x+ x? x{m} x{m,} x{m,n}                 repetition of the item before
 *   # ...                                      a comment to the end of the line
 * Characters are Unicode code points, matched against the UTF-8 text. A grammar whose rule can
 * reach itself without consuming a character (left recursion) is refused, as is a reference to
 * an undefined rule; errors name the line and column.
 */
#ifndef OROCHI_GRAMMAR_H
#define OROCHI_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tokenizer tokenizer;

typedef struct grammar grammar;                 /* compiled; read-only after grammar_parse */
typedef struct grammar_state grammar_state;     /* a position in the text the grammar derives */
typedef struct grammar_vocab grammar_vocab;     /* a vocabulary's token bytes, as a trie */
typedef struct grammar_matcher grammar_matcher; /* token masks of one grammar over one vocab */

/* Compiles the grammar text; NULL with "line L, column C: what" in err. */
grammar *grammar_parse(const char *text, size_t len, char *err, size_t errlen);
void grammar_free(grammar **g);
int grammar_n_rules(const grammar *g);

/* The position before any text; NULL when out of memory. */
grammar_state *grammar_start(const grammar *g);
grammar_state *grammar_clone(const grammar_state *s);
/* Copies src into dst (both of the same grammar); 0, or -1 when out of memory. */
int grammar_copy(grammar_state *dst, const grammar_state *src);
void grammar_state_free(grammar_state **s);
/* Advances over n bytes of text. 0 when the grammar allows them (s moved), -1 when not (s is
 * unchanged). Multi-byte characters may arrive split across calls. */
int grammar_feed(grammar_state *s, const char *bytes, size_t n);
/* Whether the text so far is a whole sentence of the grammar (the answer may end here). */
bool grammar_accepting(const grammar_state *s);
/* Whether nothing may follow: the answer must end here. */
bool grammar_done(const grammar_state *s);
/* The bytes every continuation must begin with (at most cap; stops at the first choice, at a
 * point where the text may end, and inside a character that is not yet whole). */
size_t grammar_forced(const grammar_state *s, char *out, size_t cap);

/* Whether text (n bytes) as a whole is a sentence of g. */
bool grammar_matches(const grammar *g, const char *text, size_t n);

/* The vocabulary's token bytes in a trie (built once per tokenizer, read-only after: any number
 * of matchers, on any threads, share it); NULL when out of memory. tok must outlive it. */
grammar_vocab *grammar_vocab_new(const tokenizer *tok);
void grammar_vocab_free(grammar_vocab **v);

/* Masks over a vocabulary: a token is allowed when its bytes may follow; the end-of-generation
 * tokens when the text may end here (and only they when it must); other special tokens never.
 * The matcher keeps scratch positions and a few recent masks; g and v must outlive it. */
grammar_matcher *grammar_matcher_new(const grammar *g, const grammar_vocab *v);
void grammar_matcher_free(grammar_matcher **m);
/* The tokens that may follow s: one bit per token id (bit id % 64 of word id / 64), (V + 63) / 64
 * words; NULL when out of memory. Valid until the matcher's next call. */
const uint64_t *grammar_mask(grammar_matcher *m, const grammar_state *s);
/* Whether token id may follow s (cheaper than a mask for one token). */
bool grammar_allows(grammar_matcher *m, const grammar_state *s, int32_t id);
/* Advances s over token id; 0, or -1 when the token may not follow (s unchanged). An
 * end-of-generation token is taken where the text may end and leaves s as it was. */
int grammar_advance(grammar_matcher *m, grammar_state *s, int32_t id);

#endif
