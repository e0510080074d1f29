/*
 * model/tokenizer — text <-> token ids from a GGUF file's own tokenizer.* metadata.
 *
 * Two families:
 *  - byte-level BPE (tokenizer.ggml.model = "gpt2"). Text is cut into pre-tokens by a hand-written
 *    UTF-8 scanner that implements the pre-tokenizer regex named by tokenizer.ggml.pre ("smollm":
 *    every \p{N} on its own, then the GPT-2 pattern; "llama3"/"llama-bpe": the Llama-3 pattern;
 *    "qwen2"/"deepseek-r1-qwen": the Llama-3 pattern with single digits;
 *    anything else: the GPT-2 pattern). Each pre-token starts as one symbol per byte (the vocab id
 *    of the byte's GPT-2 printable char) and adjacent pairs are merged lowest merge rank first
 *    (leftmost on ties) with a binary heap over a linked list of symbols, so long pieces cost
 *    O(n log n). Pairs live in an open-addressing hash (left id, right id) -> (rank, result id).
 *  - SentencePiece-style (tokenizer.ggml.model = "llama"): ' ' -> U+2581, a U+2581 prefix at the
 *    start of the text and after each special token (tokenizer.ggml.add_space_prefix, default
 *    true), one symbol per UTF-8 char, then the adjacent pair whose concatenation is a vocab piece
 *    with the highest score is merged first (leftmost on ties), again with a heap. Symbols that are
 *    not vocab pieces fall back to the byte tokens <0xXX> (or unknown_token_id).
 * Control (type 3) and user-defined (type 4) tokens are special: with parse_special they are cut
 * out of the text first, leftmost then longest match, and map straight to their ids.
 *
 * Conventions shared with the Python reference (tests/reference/tokenizer_ref.py): the first of
 * duplicate vocab strings wins (for SentencePiece, the first normal/user-defined one); merges whose
 * parts or result are not in the vocab are ignored; in byte-level BPE a byte whose char has no
 * token is dropped (vocabs such as SmolLM2's leave out 21 bytes, e.g. 0x04, 0xC0, 0xF5..0xFF, and
 * their unknown_token_id is a control token like <|endoftext|>, which must not appear by
 * accident), so decode(encode(s)) == s holds exactly when every byte of s has a token; in
 * SentencePiece a piece without a token falls back to <0xXX> per byte, else unknown_token_id;
 * special tokens decode to their literal text. Invalid UTF-8 input is accepted: each bad byte is one
 * "other"-class char (byte-level BPE then reproduces it exactly).
 *
 * Everything lives in the tokenizer struct (model/tokenizer_internal.h; read-only after
 * tokenizer_new), so one tokenizer may encode from several threads at once; encode allocates its
 * own scratch. Chat templates: model/chat.c.
 */
#include "model/tokenizer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/utf8.h"
#include "model/tokenizer_internal.h"
#include "model/tokenizer_unicode.h"


/* ------------------------------------------------------------------------------------------ */
/* small helpers                                                                                */

__attribute__((format(printf, 3, 4))) static void tok_err(char *err, size_t errlen,
                                                           const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static uint64_t tok_hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t tok_hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static size_t tok_pow2_at_least(size_t n)
{
    size_t p = 16;
    while (p < n)
        p <<= 1;
    return p;
}

const char *tok_text(const tokenizer *tok, int32_t id, size_t *len)
{
    *len = tok->text_off[id + 1] - tok->text_off[id] - 1;
    return tok->text + tok->text_off[id];
}

/* id of the vocab string s[0..n), or -1 */
static int32_t tok_vocab_find(const tokenizer *tok, const char *s, size_t n)
{
    size_t h = (size_t)tok_hash_bytes(s, n) & tok->vocab_mask;
    for (;;) {
        int32_t id = tok->vocab_ht[h];
        if (id < 0)
            return -1;
        size_t len;
        const char *t = tok_text(tok, id, &len);
        if (len == n && !memcmp(t, s, n))
            return id;
        h = (h + 1) & tok->vocab_mask;
    }
}

/* Add id under its string unless the string is already there (the first id wins). */
static void tok_vocab_insert(tokenizer *tok, int32_t id)
{
    size_t n;
    const char *s = tok_text(tok, id, &n);
    size_t h = (size_t)tok_hash_bytes(s, n) & tok->vocab_mask;
    while (tok->vocab_ht[h] >= 0) {
        size_t len;
        const char *t = tok_text(tok, tok->vocab_ht[h], &len);
        if (len == n && !memcmp(t, s, n))
            return;
        h = (h + 1) & tok->vocab_mask;
    }
    tok->vocab_ht[h] = id;
}

static const tokenizer_merge_slot *tok_merge_find(const tokenizer *tok, int32_t a, int32_t b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t h = (size_t)tok_hash_u64(key) & tok->merge_mask;
    for (;;) {
        const tokenizer_merge_slot *s = &tok->merge_ht[h];
        if (s->key == UINT64_MAX)
            return NULL;
        if (s->key == key)
            return s;
        h = (h + 1) & tok->merge_mask;
    }
}

/* Decode one UTF-8 char at s[i] (i < n): returns its length; invalid or truncated sequences,
 * overlongs and surrogates are one byte long with *cp = 0xFFFD. */
static size_t tok_utf8(const uint8_t *s, size_t n, size_t i, uint32_t *cp)
{
    size_t len = utf8_decode(s + i, n - i, cp);
    if (!len)
        *cp = 0xFFFD;
    return len ? len : 1;
}

/* The GPT-2 byte <-> char rule: bytes 33..126, 161..172, 174..255 are their own char; the others
 * (0..32, 127..160, 173), in order, become U+0100 + n. */
static bool tok_byte_is_printable(int b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

static void tok_byte_map(uint32_t byte_to_cp[256], int16_t cp_to_byte[324])
{
    for (int i = 0; i < 324; i++)
        cp_to_byte[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        byte_to_cp[b] = tok_byte_is_printable(b) ? (uint32_t)b : (uint32_t)(256 + n++);
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}

static int tok_class(uint32_t cp)
{
    if (cp < 0x80) {
        if (cp == ' ' || (cp >= 9 && cp <= 13))
            return TOKENIZER_CLASS_SPACE;
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')
            return TOKENIZER_CLASS_LETTER;
        if (cp >= '0' && cp <= '9')
            return TOKENIZER_CLASS_NUMBER;
        return TOKENIZER_CLASS_OTHER;
    }
    return tokenizer_unicode_class(cp);
}

/* ------------------------------------------------------------------------------------------ */
/* growable buffers used while encoding                                                        */

typedef struct {
    int32_t *ids;
    size_t n, cap;
    bool oom;
} tok_ids;

static void tok_ids_push(tok_ids *v, int32_t id)
{
    if (v->oom)
        return;
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 256;
        int32_t *p = realloc(v->ids, nc * sizeof *p);
        if (!p) {
            v->oom = true;
            return;
        }
        v->ids = p;
        v->cap = nc;
    }
    v->ids[v->n++] = id;
}

/* Per-encode scratch: code points of the current fragment and the merge working set. */
typedef struct {
    uint32_t *cp;   /* code point of char i */
    uint8_t *cls;   /* class of char i */
    size_t *off;    /* byte offset of char i (off[n] = end) */
    size_t chars_cap;

    /* merge symbols */
    int32_t *sym_id;
    size_t *sym_start, *sym_len;
    int32_t *sym_prev, *sym_next;
    size_t sym_cap;

    /* heap of candidate pairs */
    struct tok_pair {
        double key;      /* BPE: rank; SPM: -score (smaller pops first) */
        int32_t left;    /* symbol index */
        int32_t a, b;    /* BPE: ids of the pair; SPM: lengths of the pair */
        int32_t result;  /* id of the merged token */
    } *heap;
    size_t heap_n, heap_cap;

    char *buf; /* SPM: the fragment with spaces escaped */
    size_t buf_cap;
    bool oom;
} tok_scratch;

static bool tok_scratch_chars(tok_scratch *s, size_t n)
{
    if (n + 1 <= s->chars_cap)
        return true;
    size_t nc = tok_pow2_at_least(n + 1);
    uint32_t *cp = realloc(s->cp, nc * sizeof *cp);
    if (cp)
        s->cp = cp;
    uint8_t *cls = realloc(s->cls, nc * sizeof *cls);
    if (cls)
        s->cls = cls;
    size_t *off = realloc(s->off, nc * sizeof *off);
    if (off)
        s->off = off;
    if (!cp || !cls || !off)
        return false;
    s->chars_cap = nc;
    return true;
}

static bool tok_scratch_syms(tok_scratch *s, size_t n)
{
    if (n <= s->sym_cap)
        return true;
    size_t nc = tok_pow2_at_least(n);
    int32_t *id = realloc(s->sym_id, nc * sizeof *id);
    if (id)
        s->sym_id = id;
    size_t *st = realloc(s->sym_start, nc * sizeof *st);
    if (st)
        s->sym_start = st;
    size_t *ln = realloc(s->sym_len, nc * sizeof *ln);
    if (ln)
        s->sym_len = ln;
    int32_t *pv = realloc(s->sym_prev, nc * sizeof *pv);
    if (pv)
        s->sym_prev = pv;
    int32_t *nx = realloc(s->sym_next, nc * sizeof *nx);
    if (nx)
        s->sym_next = nx;
    if (!id || !st || !ln || !pv || !nx)
        return false;
    s->sym_cap = nc;
    return true;
}

static void tok_scratch_free(tok_scratch *s)
{
    free(s->cp);
    free(s->cls);
    free(s->off);
    free(s->sym_id);
    free(s->sym_start);
    free(s->sym_len);
    free(s->sym_prev);
    free(s->sym_next);
    free(s->heap);
    free(s->buf);
}

static bool tok_pair_less(const struct tok_pair *x, const struct tok_pair *y)
{
    if (x->key != y->key)
        return x->key < y->key;
    return x->left < y->left;
}

static void tok_heap_push(tok_scratch *s, struct tok_pair p)
{
    if (buf_grow((void **)&s->heap, &s->heap_cap, s->heap_n + 1, sizeof *s->heap, 64)) {
        s->oom = true;
        return;
    }
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!tok_pair_less(&p, &s->heap[parent]))
            break;
        s->heap[i] = s->heap[parent];
        i = parent;
    }
    s->heap[i] = p;
}

static struct tok_pair tok_heap_pop(tok_scratch *s)
{
    struct tok_pair top = s->heap[0];
    struct tok_pair last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && tok_pair_less(&s->heap[c + 1], &s->heap[c]))
            c++;
        if (!tok_pair_less(&s->heap[c], &last))
            break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n > 0)
        s->heap[i] = last;
    return top;
}

/* ------------------------------------------------------------------------------------------ */
/* pre-tokenizer scanners: each returns the end (char index) of the match that starts at i      */

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t tok_match_gpt2(const uint32_t *cp, const uint8_t *cls, size_t i, size_t n)
{
    uint32_t c = cp[i];
    if (c == '\'' && i + 1 < n) {
        uint32_t d = cp[i + 1];
        if (d == 's' || d == 't' || d == 'm' || d == 'd')
            return i + 2;
        if (i + 2 < n) {
            uint32_t e = cp[i + 2];
            if ((d == 'r' && e == 'e') || (d == 'v' && e == 'e') || (d == 'l' && e == 'l'))
                return i + 3;
        }
    }
    size_t j = i;
    if (c == ' ' && i + 1 < n && cls[i + 1] != TOKENIZER_CLASS_SPACE)
        j = i + 1;
    int k = cls[j];
    if (k != TOKENIZER_CLASS_SPACE) {
        while (j < n && cls[j] == k)
            j++;
        return j;
    }
    size_t e = i;
    while (e < n && cls[e] == TOKENIZER_CLASS_SPACE)
        e++;
    if (e == n)
        return n;       /* \s+(?!\S) up to the end */
    if (e - i >= 2)
        return e - 1;   /* \s+(?!\S): leave the last space for the next token */
    return e;           /* \s+ */
}

static uint32_t tok_ascii_lower(uint32_t c)
{
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

/* Llama-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
/* The Llama-3 pattern; Qwen2's is the same with single digits (\p{N} for \p{N}{1,3}) and its
 * contractions spelt as explicit case pairs ('[sS], not a case-insensitive 's, which also takes
 * the long s): `digits` is the longest run of digits one pre-token takes, 1 for Qwen2. */
static size_t tok_match_llama3(const uint32_t *cp, const uint8_t *cls, size_t i, size_t n,
                               size_t digits)
{
    uint32_t c = cp[i];
    if (c == '\'' && i + 1 < n) {
        uint32_t d = tok_ascii_lower(cp[i + 1]);
        if (d == 's' || d == 't' || d == 'm' || d == 'd' ||
            (digits > 1 && cp[i + 1] == 0x17F /* long s, Llama 3 only */))
            return i + 2;
        if (i + 2 < n) {
            uint32_t e = tok_ascii_lower(cp[i + 2]);
            if ((d == 'r' && e == 'e') || (d == 'v' && e == 'e') || (d == 'l' && e == 'l'))
                return i + 3;
        }
    }
    size_t j;
    if (cls[i] == TOKENIZER_CLASS_LETTER ||
        (c != '\r' && c != '\n' && cls[i] != TOKENIZER_CLASS_NUMBER && i + 1 < n &&
         cls[i + 1] == TOKENIZER_CLASS_LETTER)) {
        j = i + 1;
        while (j < n && cls[j] == TOKENIZER_CLASS_LETTER)
            j++;
        return j;
    }
    if (cls[i] == TOKENIZER_CLASS_NUMBER) {
        j = i;
        while (j < n && j - i < digits && cls[j] == TOKENIZER_CLASS_NUMBER)
            j++;
        return j;
    }
    j = i;
    if (c == ' ' && i + 1 < n && cls[i + 1] == TOKENIZER_CLASS_OTHER)
        j = i + 1;
    if (cls[j] == TOKENIZER_CLASS_OTHER) {
        while (j < n && cls[j] == TOKENIZER_CLASS_OTHER)
            j++;
        while (j < n && (cp[j] == '\r' || cp[j] == '\n'))
            j++;
        return j;
    }
    size_t e = i;
    size_t last_nl = SIZE_MAX;
    while (e < n && cls[e] == TOKENIZER_CLASS_SPACE) {
        if (cp[e] == '\r' || cp[e] == '\n')
            last_nl = e;
        e++;
    }
    if (last_nl != SIZE_MAX)
        return last_nl + 1; /* \s*[\r\n]+ */
    if (e == n)
        return n;
    if (e - i >= 2)
        return e - 1;
    return e;
}

/* ------------------------------------------------------------------------------------------ */
/* byte-level BPE                                                                              */

static void tok_bpe_piece(const tokenizer *tok, tok_scratch *s, const uint8_t *p, size_t n,
                          tok_ids *out)
{
    if (n == 1) {
        if (tok->byte_id[p[0]] >= 0)
            tok_ids_push(out, tok->byte_id[p[0]]);
        return;
    }
    if (tok->ignore_merges) {
        /* the whole piece, in printable-char form, may be a vocab entry */
        char tmp[256];
        size_t m = 0;
        bool fits = true;
        for (size_t i = 0; i < n && fits; i++) {
            size_t len;
            const char *t = tok->byte_id[p[i]] >= 0 ? tok_text(tok, tok->byte_id[p[i]], &len) : NULL;
            if (!t || m + len > sizeof tmp)
                fits = false;
            else {
                memcpy(tmp + m, t, len);
                m += len;
            }
        }
        int32_t id = fits ? tok_vocab_find(tok, tmp, m) : -1;
        if (id >= 0) {
            tok_ids_push(out, id);
            return;
        }
    }
    if (!tok_scratch_syms(s, n)) {
        s->oom = true;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        s->sym_id[i] = tok->byte_id[p[i]];
        s->sym_prev[i] = (int32_t)i - 1;
        s->sym_next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    s->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        if (s->sym_id[i] < 0 || s->sym_id[i + 1] < 0)
            continue;
        const tokenizer_merge_slot *m = tok_merge_find(tok, s->sym_id[i], s->sym_id[i + 1]);
        if (m)
            tok_heap_push(s, (struct tok_pair){m->rank, (int32_t)i, s->sym_id[i],
                                               s->sym_id[i + 1], m->result});
    }
    while (s->heap_n > 0 && !s->oom) {
        struct tok_pair pr = tok_heap_pop(s);
        int32_t l = pr.left;
        int32_t r = s->sym_next[l];
        if (s->sym_id[l] != pr.a || r < 0 || s->sym_id[r] != pr.b)
            continue; /* stale */
        s->sym_id[l] = pr.result;
        s->sym_id[r] = -2; /* dead */
        int32_t rn = s->sym_next[r];
        s->sym_next[l] = rn;
        if (rn >= 0)
            s->sym_prev[rn] = l;
        int32_t lp = s->sym_prev[l];
        if (lp >= 0 && s->sym_id[lp] >= 0) {
            const tokenizer_merge_slot *m = tok_merge_find(tok, s->sym_id[lp], pr.result);
            if (m)
                tok_heap_push(s, (struct tok_pair){m->rank, lp, s->sym_id[lp], pr.result,
                                                   m->result});
        }
        if (rn >= 0 && s->sym_id[rn] >= 0) {
            const tokenizer_merge_slot *m = tok_merge_find(tok, pr.result, s->sym_id[rn]);
            if (m)
                tok_heap_push(s, (struct tok_pair){m->rank, l, pr.result, s->sym_id[rn],
                                                   m->result});
        }
    }
    for (int32_t i = 0; i >= 0; i = s->sym_next[i]) {
        if (s->sym_id[i] >= 0)
            tok_ids_push(out, s->sym_id[i]);
    }
}

/* Split a text fragment into pre-tokens and BPE each. */
static void tok_bpe_fragment(const tokenizer *tok, tok_scratch *s, const uint8_t *text, size_t len,
                             tok_ids *out)
{
    if (!tok_scratch_chars(s, len)) {
        s->oom = true;
        return;
    }
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t c;
        size_t l = tok_utf8(text, len, i, &c);
        s->cp[n] = c;
        s->cls[n] = (uint8_t)tok_class(c);
        s->off[n] = i;
        n++;
        i += l;
    }
    s->off[n] = len;

    size_t piece_start = 0;
    while (piece_start < n && !s->oom) {
        /* the range the regex sees: for smollm, a single \p{N} or a run without any */
        size_t piece_end = n;
        if (tok->pre == TOK_PRE_SMOLLM) {
            if (s->cls[piece_start] == TOKENIZER_CLASS_NUMBER)
                piece_end = piece_start + 1;
            else {
                piece_end = piece_start;
                while (piece_end < n && s->cls[piece_end] != TOKENIZER_CLASS_NUMBER)
                    piece_end++;
            }
        }
        const uint32_t *cp = s->cp + piece_start;
        const uint8_t *cls = s->cls + piece_start;
        size_t m = piece_end - piece_start;
        for (size_t i = 0; i < m && !s->oom;) {
            size_t e = tok->pre == TOK_PRE_LLAMA3   ? tok_match_llama3(cp, cls, i, m, 3)
                       : tok->pre == TOK_PRE_QWEN2 ? tok_match_llama3(cp, cls, i, m, 1)
                                                   : tok_match_gpt2(cp, cls, i, m);
            size_t b0 = s->off[piece_start + i], b1 = s->off[piece_start + e];
            tok_bpe_piece(tok, s, text + b0, b1 - b0, out);
            i = e;
        }
        piece_start = piece_end;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* SentencePiece-style                                                                         */

static bool tok_spm_mergeable(const tokenizer *tok, int32_t id)
{
    uint8_t t = tok->type[id];
    return t != TOK_TYPE_UNKNOWN && t != TOK_TYPE_CONTROL && t != TOK_TYPE_UNUSED &&
           t != TOK_TYPE_BYTE;
}

/* The mergeable piece s[0..n), or -1 (the SPM vocab hash prefers mergeable ids). */
static int32_t tok_spm_find(const tokenizer *tok, const char *s, size_t n)
{
    int32_t id = tok_vocab_find(tok, s, n);
    return id >= 0 && tok_spm_mergeable(tok, id) ? id : -1;
}

static void tok_spm_try_pair(const tokenizer *tok, tok_scratch *s, int32_t l)
{
    if (l < 0 || s->sym_next[l] < 0)
        return;
    int32_t r = s->sym_next[l];
    size_t len = s->sym_len[l] + s->sym_len[r];
    int32_t id = tok_spm_find(tok, s->buf + s->sym_start[l], len);
    if (id < 0)
        return;
    tok_heap_push(s, (struct tok_pair){-(double)tok->score[id], l, (int32_t)s->sym_len[l],
                                       (int32_t)s->sym_len[r], id});
}

static void tok_spm_fragment(const tokenizer *tok, tok_scratch *s, const uint8_t *text, size_t len,
                             bool prefix, tok_ids *out)
{
    /* escape: ' ' -> U+2581 (3 bytes), plus the optional prefix */
    size_t need = 3 * len + 4;
    if (buf_grow((void **)&s->buf, &s->buf_cap, need, 1, 64)) {
        s->oom = true;
        return;
    }
    size_t m = 0;
    if (prefix) {
        memcpy(s->buf, "\xE2\x96\x81", 3);
        m = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(s->buf + m, "\xE2\x96\x81", 3);
            m += 3;
        } else {
            s->buf[m++] = (char)text[i];
        }
    }
    if (!tok_scratch_syms(s, m + 1)) {
        s->oom = true;
        return;
    }
    size_t n = 0;
    for (size_t i = 0; i < m;) {
        uint32_t c;
        size_t l = tok_utf8((const uint8_t *)s->buf, m, i, &c);
        s->sym_start[n] = i;
        s->sym_len[n] = l;
        s->sym_prev[n] = (int32_t)n - 1;
        s->sym_next[n] = (int32_t)n + 1;
        n++;
        i += l;
    }
    if (n == 0)
        return;
    s->sym_next[n - 1] = -1;
    s->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++)
        tok_spm_try_pair(tok, s, (int32_t)i);
    while (s->heap_n > 0 && !s->oom) {
        struct tok_pair pr = tok_heap_pop(s);
        int32_t l = pr.left;
        int32_t r = s->sym_next[l];
        if (s->sym_len[l] != (size_t)pr.a || r < 0 || s->sym_len[r] != (size_t)pr.b)
            continue; /* stale */
        s->sym_len[l] += s->sym_len[r];
        s->sym_len[r] = 0;
        int32_t rn = s->sym_next[r];
        s->sym_next[l] = rn;
        if (rn >= 0)
            s->sym_prev[rn] = l;
        if (s->sym_prev[l] >= 0)
            tok_spm_try_pair(tok, s, s->sym_prev[l]);
        tok_spm_try_pair(tok, s, l);
    }
    for (int32_t i = 0; i >= 0; i = s->sym_next[i]) {
        int32_t id = tok_spm_find(tok, s->buf + s->sym_start[i], s->sym_len[i]);
        if (id >= 0) {
            tok_ids_push(out, id);
            continue;
        }
        for (size_t k = 0; k < s->sym_len[i]; k++) {
            int32_t b = tok->byte_id[(uint8_t)s->buf[s->sym_start[i] + k]];
            if (b >= 0)
                tok_ids_push(out, b);
            else if (tok->unk >= 0)
                tok_ids_push(out, tok->unk);
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* encode                                                                                      */

/* The special token matching at text[i] (longest), or -1. */
static int32_t tok_special_at(const tokenizer *tok, const char *text, size_t len, size_t i,
                              size_t *mlen)
{
    uint8_t c = (uint8_t)text[i];
    for (int32_t k = tok->special_first[c]; k < tok->special_first[c + 1]; k++) {
        int32_t id = tok->special[k];
        size_t n;
        const char *t = tok_text(tok, id, &n);
        if (n <= len - i && !memcmp(t, text + i, n)) {
            *mlen = n;
            return id;
        }
    }
    return -1;
}

static void tok_encode_fragment(const tokenizer *tok, tok_scratch *s, const char *text, size_t len,
                                bool after_special, tok_ids *out)
{
    if (len == 0)
        return;
    if (tok->kind == TOK_KIND_BPE)
        tok_bpe_fragment(tok, s, (const uint8_t *)text, len, out);
    else
        tok_spm_fragment(tok, s, (const uint8_t *)text, len, tok->add_space_prefix && after_special,
                         out);
}

int tokenizer_encode(const tokenizer *tok, const char *text, size_t len, bool parse_special,
                     int32_t *ids, int cap, int *needed)
{
    if (len > (size_t)INT32_MAX / 4) { /* symbol indices are int32; 3 bytes per SPM space */
        if (needed)
            *needed = -1;
        return -1;
    }
    tok_ids out = {0};
    tok_scratch s = {0};
    size_t frag = 0;
    bool after_special = true;
    if (parse_special && tok->n_special > 0) {
        for (size_t i = 0; i < len && !s.oom; i++) {
            size_t mlen;
            int32_t id = tok_special_at(tok, text, len, i, &mlen);
            if (id < 0)
                continue;
            tok_encode_fragment(tok, &s, text + frag, i - frag, after_special, &out);
            tok_ids_push(&out, id);
            after_special = true;
            i += mlen - 1;
            frag = i + 1;
        }
    }
    tok_encode_fragment(tok, &s, text + frag, len - frag, after_special, &out);
    bool oom = s.oom || out.oom;
    tok_scratch_free(&s);
    if (oom) {
        free(out.ids);
        if (needed)
            *needed = -1;
        return -1;
    }
    int total = out.n > (size_t)INT32_MAX ? INT32_MAX : (int)out.n;
    if (needed)
        *needed = total;
    if (total > cap) {
        free(out.ids);
        return -1;
    }
    if (total > 0)
        memcpy(ids, out.ids, (size_t)total * sizeof *ids);
    free(out.ids);
    return total;
}

/* ------------------------------------------------------------------------------------------ */
/* decode and accessors                                                                         */

int32_t tokenizer_vocab_size(const tokenizer *tok) { return tok->n_vocab; }
int32_t tokenizer_bos(const tokenizer *tok) { return tok->bos; }
int32_t tokenizer_eos(const tokenizer *tok) { return tok->eos; }

int tokenizer_eog(const tokenizer *tok, const int32_t **ids)
{
    *ids = tok->eog;
    return tok->n_eog;
}

bool tokenizer_is_eog(const tokenizer *tok, int32_t id)
{
    for (int i = 0; i < tok->n_eog; i++)
        if (tok->eog[i] == id)
            return true;
    return false;
}

static void tok_add_eog(tokenizer *tok, int32_t id)
{
    if (id < 0 || tokenizer_is_eog(tok, id) || tok->n_eog == TOKENIZER_MAX_EOG)
        return;
    tok->eog[tok->n_eog++] = id;
}
bool tokenizer_add_bos(const tokenizer *tok) { return tok->add_bos; }

bool tokenizer_is_special(const tokenizer *tok, int32_t id)
{
    if (id < 0 || id >= tok->n_vocab)
        return false;
    return tok->type[id] == TOK_TYPE_CONTROL || tok->type[id] == TOK_TYPE_USER;
}

size_t tokenizer_piece(const tokenizer *tok, int32_t id, const char **bytes)
{
    if (id < 0 || id >= tok->n_vocab) {
        *bytes = "";
        return 0;
    }
    *bytes = tok->piece + tok->piece_off[id];
    return tok->piece_off[id + 1] - tok->piece_off[id];
}

const char *tokenizer_token_text(const tokenizer *tok, int32_t id)
{
    if (id < 0 || id >= tok->n_vocab)
        return "";
    return tok->text + tok->text_off[id];
}

long tokenizer_decode(const tokenizer *tok, const int32_t *ids, int n, char *out, size_t cap)
{
    if (cap == 0)
        return -1;
    size_t m = 0;
    bool after_special = true;
    for (int i = 0; i < n; i++) {
        const char *p;
        size_t len = tokenizer_piece(tok, ids[i], &p);
        bool special = tokenizer_is_special(tok, ids[i]);
        if (tok->kind == TOK_KIND_SPM && tok->add_space_prefix && after_special && !special &&
            len > 0 && p[0] == ' ') {
            p++;
            len--;
        }
        after_special = special;
        if (m + len + 1 > cap)
            return -1;
        memcpy(out + m, p, len);
        m += len;
    }
    out[m] = '\0';
    return (long)m;
}

/* ------------------------------------------------------------------------------------------ */
/* the chat template's text (rendering it: model/chat.c)                                        */

int tokenizer_set_chat_template(tokenizer *tok, const char *text, size_t len)
{
    char *t = malloc(len + 1);
    if (!t)
        return -1;
    memcpy(t, text, len);
    t[len] = '\0';
    free(tok->chat_template);
    tok->chat_template = t;
    tok->chat_template_len = len;
    return 0;
}

/* The default system message written literally in a ChatML template, or NULL. */
static char *tok_template_system(const char *tmpl, size_t len)
{
    const char *end = tmpl + len;
    size_t ol = sizeof TOK_SYS_OPEN - 1;
    for (const char *p = tmpl; p + ol <= end; p++) {
        if (memcmp(p, TOK_SYS_OPEN, ol) != 0)
            continue;
        const char *b = p + ol;
        const char *e = b;
        while (e + 10 <= end && memcmp(e, "<|im_end|>", 10) != 0)
            e++;
        if (e + 10 > end)
            return NULL;
        /* a template expression ('...' + messages[0]['content'] + '...') is not a literal */
        bool literal = e > b;
        for (const char *q = b; q < e && literal; q++)
            if (*q == '\'' || *q == '"' || *q == '{' || *q == '}')
                literal = false;
        if (!literal)
            continue;
        char *s = malloc((size_t)(e - b) + 1);
        if (!s)
            return NULL;
        memcpy(s, b, (size_t)(e - b));
        s[e - b] = '\0';
        return s;
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* construction                                                                                 */

void tokenizer_destroy(tokenizer **tokp)
{
    if (!tokp || !*tokp)
        return;
    tokenizer *tok = *tokp;
    free(tok->text);
    free(tok->text_off);
    free(tok->piece);
    free(tok->piece_off);
    free(tok->type);
    free(tok->score);
    free(tok->vocab_ht);
    free(tok->merge_ht);
    free(tok->special);
    free(tok->chat_system);
    free(tok->chat_template);
    free(tok);
    *tokp = NULL;
}

static bool tok_get_id(const gguf_file *f, const char *key, int32_t n_vocab, int32_t *out,
                       char *err, size_t errlen)
{
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv)
        return true;
    int64_t v;
    if (!gguf_get_i64(f, key, &v)) {
        tok_err(err, errlen, "%s: not an integer (type %lld)", key, (long long)kv->value.type);
        return false;
    }
    if (v < 0 || v >= n_vocab) {
        tok_err(err, errlen, "%s: id %lld out of range [0, %d)", key, (long long)v, n_vocab);
        return false;
    }
    *out = (int32_t)v;
    return true;
}

static bool tok_is_int_type(gguf_type t)
{
    return t == GGUF_UINT8 || t == GGUF_INT8 || t == GGUF_UINT16 || t == GGUF_INT16 ||
           t == GGUF_UINT32 || t == GGUF_INT32 || t == GGUF_UINT64 || t == GGUF_INT64;
}

/* Order of the special tokens: first byte ascending, then longest first, then id. */
static int tok_special_cmp(const tokenizer *tok, int32_t a, int32_t b)
{
    size_t la, lb;
    const char *ta = tok_text(tok, a, &la), *tb = tok_text(tok, b, &lb);
    if ((uint8_t)ta[0] != (uint8_t)tb[0])
        return (uint8_t)ta[0] < (uint8_t)tb[0] ? -1 : 1;
    if (la != lb)
        return la > lb ? -1 : 1;
    return a < b ? -1 : (a > b);
}

/* Shell sort (qsort has no context argument in C11; vocabs can have thousands of specials). */
static void tok_sort_specials(tokenizer *tok)
{
    int32_t *v = tok->special;
    int32_t n = tok->n_special;
    for (int32_t gap = n / 2; gap > 0; gap /= 2)
        for (int32_t i = gap; i < n; i++) {
            int32_t x = v[i];
            int32_t j = i;
            while (j >= gap && tok_special_cmp(tok, v[j - gap], x) > 0) {
                v[j] = v[j - gap];
                j -= gap;
            }
            v[j] = x;
        }
}

static bool tok_build_pieces(tokenizer *tok)
{
    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[324];
    tok_byte_map(byte_to_cp, cp_to_byte);
    size_t total = tok->text_off[tok->n_vocab];
    tok->piece = malloc(total + 1);
    tok->piece_off = malloc(((size_t)tok->n_vocab + 1) * sizeof *tok->piece_off);
    if (!tok->piece || !tok->piece_off)
        return false;
    size_t m = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        tok->piece_off[id] = m;
        size_t len;
        const char *t = tok_text(tok, id, &len);
        uint8_t ty = tok->type[id];
        if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER) {
            memcpy(tok->piece + m, t, len);
            m += len;
            continue;
        }
        if (tok->kind == TOK_KIND_BPE) {
            for (size_t i = 0; i < len;) {
                uint32_t c;
                size_t l = tok_utf8((const uint8_t *)t, len, i, &c);
                if (l > 1 || c < 0x80) {
                    if (c < 324 && cp_to_byte[c] >= 0)
                        tok->piece[m++] = (char)cp_to_byte[c];
                    else {
                        memcpy(tok->piece + m, t + i, l);
                        m += l;
                    }
                } else {
                    tok->piece[m++] = t[i]; /* invalid byte: copy */
                }
                i += l;
            }
        } else {
            unsigned hex;
            char tail;
            if (ty == TOK_TYPE_BYTE && len == 6 && sscanf(t, "<0x%2X%c", &hex, &tail) == 2 &&
                tail == '>') {
                tok->piece[m++] = (char)hex;
                continue;
            }
            for (size_t i = 0; i < len;) {
                if (i + 3 <= len && !memcmp(t + i, "\xE2\x96\x81", 3)) {
                    tok->piece[m++] = ' ';
                    i += 3;
                } else {
                    tok->piece[m++] = t[i++];
                }
            }
        }
    }
    tok->piece_off[tok->n_vocab] = m;
    return true;
}

static bool tok_build_merges(tokenizer *tok, const gguf_array *merges, char *err, size_t errlen)
{
    tok->merge_mask = tok_pow2_at_least(merges->n * 2 + 1) - 1;
    tok->merge_ht = malloc((tok->merge_mask + 1) * sizeof *tok->merge_ht);
    if (!tok->merge_ht) {
        tok_err(err, errlen, "%s: out of memory (%lld merges)", "tokenizer.ggml.merges",
                (long long)merges->n);
        return false;
    }
    for (size_t i = 0; i <= tok->merge_mask; i++)
        tok->merge_ht[i].key = UINT64_MAX;
    for (uint64_t r = 0; r < merges->n; r++) {
        gguf_str s = merges->strs[r];
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp) {
            char q[300];
            gguf_escape(q, sizeof q, s.ptr, s.len);
            tok_err(err, errlen, "tokenizer.ggml.merges[%llu]: no space in '%s'",
                    (unsigned long long)r, q);
            return false;
        }
        size_t la = (size_t)(sp - s.ptr);
        int32_t a = tok_vocab_find(tok, s.ptr, la);
        int32_t b = tok_vocab_find(tok, sp + 1, s.len - la - 1);
        if (a < 0 || b < 0)
            continue;
        /* the merged string: both halves are contiguous around the space, so build it */
        char stackbuf[512];
        char *cat = s.len - 1 <= sizeof stackbuf ? stackbuf : malloc(s.len);
        if (!cat)
            continue;
        memcpy(cat, s.ptr, la);
        memcpy(cat + la, sp + 1, s.len - la - 1);
        int32_t res = tok_vocab_find(tok, cat, s.len - 1);
        if (cat != stackbuf)
            free(cat);
        if (res < 0)
            continue;
        uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
        size_t h = (size_t)tok_hash_u64(key) & tok->merge_mask;
        while (tok->merge_ht[h].key != UINT64_MAX && tok->merge_ht[h].key != key)
            h = (h + 1) & tok->merge_mask;
        if (tok->merge_ht[h].key == key)
            continue; /* the first (lowest) rank wins */
        tok->merge_ht[h].key = key;
        tok->merge_ht[h].rank = (int32_t)(r > INT32_MAX ? INT32_MAX : r);
        tok->merge_ht[h].result = res;
    }
    return true;
}

tokenizer *tokenizer_new(const gguf_file *f, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    gguf_str model;
    if (!gguf_get_str(f, "tokenizer.ggml.model", &model)) {
        tok_err(err, errlen, "tokenizer.ggml.model: missing or not a string");
        return NULL;
    }
    int kind;
    if (gguf_str_eq(model, "gpt2"))
        kind = TOK_KIND_BPE;
    else if (gguf_str_eq(model, "llama"))
        kind = TOK_KIND_SPM;
    else {
        char q[300];
        gguf_escape(q, sizeof q, model.ptr, model.len);
        tok_err(err, errlen, "tokenizer.ggml.model: unsupported tokenizer '%s'", q);
        return NULL;
    }
    const gguf_array *toks = gguf_get_array(f, "tokenizer.ggml.tokens");
    if (!toks || toks->elem != GGUF_STRING || toks->n == 0 || toks->n > INT32_MAX) {
        tok_err(err, errlen, "tokenizer.ggml.tokens: missing, empty or not an array of strings");
        return NULL;
    }
    int32_t n = (int32_t)toks->n;
    const gguf_array *types = gguf_get_array(f, "tokenizer.ggml.token_type");
    if (types && (!tok_is_int_type(types->elem) || types->n != toks->n)) {
        tok_err(err, errlen, "%s: not an integer array of %lld entries",
                "tokenizer.ggml.token_type", (long long)n);
        return NULL;
    }
    const gguf_array *scores = gguf_get_array(f, "tokenizer.ggml.scores");
    if (kind == TOK_KIND_SPM && scores &&
        ((scores->elem != GGUF_FLOAT32 && scores->elem != GGUF_FLOAT64) || scores->n != toks->n)) {
        tok_err(err, errlen, "%s: not a float array of %lld entries", "tokenizer.ggml.scores",
                (long long)n);
        return NULL;
    }
    const gguf_array *merges = NULL;
    if (kind == TOK_KIND_BPE) {
        merges = gguf_get_array(f, "tokenizer.ggml.merges");
        if (!merges || merges->elem != GGUF_STRING) {
            tok_err(err, errlen, "tokenizer.ggml.merges: missing or not an array of strings");
            return NULL;
        }
    }

    tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) {
        tok_err(err, errlen, "tokenizer: out of memory");
        return NULL;
    }
    tok->kind = kind;
    tok->n_vocab = n;
    tok->bos = tok->eos = tok->unk = -1;

    /* token strings */
    size_t total = 0;
    for (int32_t i = 0; i < n; i++)
        total += toks->strs[i].len + 1;
    tok->text = malloc(total);
    tok->text_off = malloc(((size_t)n + 1) * sizeof *tok->text_off);
    tok->type = malloc((size_t)n);
    tok->vocab_mask = tok_pow2_at_least((size_t)n * 2 + 1) - 1;
    tok->vocab_ht = malloc((tok->vocab_mask + 1) * sizeof *tok->vocab_ht);
    if (kind == TOK_KIND_SPM)
        tok->score = malloc((size_t)n * sizeof *tok->score);
    if (!tok->text || !tok->text_off || !tok->type || !tok->vocab_ht ||
        (kind == TOK_KIND_SPM && !tok->score)) {
        tok_err(err, errlen, "%s: out of memory (%lld tokens)", "tokenizer.ggml.tokens",
                (long long)n);
        goto fail;
    }
    memset(tok->vocab_ht, 0xFF, (tok->vocab_mask + 1) * sizeof *tok->vocab_ht);
    size_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        gguf_str s = toks->strs[i];
        tok->text_off[i] = m;
        memcpy(tok->text + m, s.ptr, s.len);
        m += s.len;
        tok->text[m++] = '\0';
        int64_t ty = types ? gguf_array_int(types, (uint64_t)i) : TOK_TYPE_NORMAL;
        tok->type[i] = (ty >= 0 && ty <= 255) ? (uint8_t)ty : 0;
        if (tok->score)
            tok->score[i] = scores ? (float)gguf_array_float(scores, (uint64_t)i) : 0.0f;
    }
    tok->text_off[n] = m;
    /* string -> id; for SentencePiece the mergeable ids go in first so they win over
     * control/byte/unused duplicates of the same string */
    for (int pass = 0; pass < 2; pass++)
        for (int32_t i = 0; i < n; i++)
            if (kind == TOK_KIND_BPE ? pass == 0 : (pass == 0) == tok_spm_mergeable(tok, i))
                tok_vocab_insert(tok, i);

    /* special ids and flags */
    int32_t eot = -1, eom = -1;
    if (!tok_get_id(f, "tokenizer.ggml.bos_token_id", n, &tok->bos, err, errlen) ||
        !tok_get_id(f, "tokenizer.ggml.eos_token_id", n, &tok->eos, err, errlen) ||
        !tok_get_id(f, "tokenizer.ggml.unknown_token_id", n, &tok->unk, err, errlen) ||
        !tok_get_id(f, "tokenizer.ggml.eot_token_id", n, &eot, err, errlen) ||
        !tok_get_id(f, "tokenizer.ggml.eom_token_id", n, &eom, err, errlen))
        goto fail;
    /* the end of a generation: eos, the file's end of turn / of message, and the control tokens
     * that end an assistant's turn in the families' chat formats where the file's eos is another
     * token (<|eot_id|> and <|eom_id|> where eos is Llama 3's <|end_of_text|>, Gemma's
     * <end_of_turn>, Phi-3's <|end|>). A vocabulary's other end-of-text tokens (<|endoftext|>
     * beside a ChatML eos) are not: a model that emits one mid-answer goes on, as before. */
    tok_add_eog(tok, tok->eos);
    tok_add_eog(tok, eot);
    tok_add_eog(tok, eom);
    static const char *const eog_text[] = {"<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>"};
    for (size_t k = 0; k < sizeof eog_text / sizeof eog_text[0]; k++) {
        int32_t id = tok_vocab_find(tok, eog_text[k], strlen(eog_text[k]));
        if (id >= 0 && (tok->type[id] == TOK_TYPE_CONTROL || tok->type[id] == TOK_TYPE_USER))
            tok_add_eog(tok, id);
    }
    tok->add_bos = kind == TOK_KIND_SPM;
    if (gguf_find(f, "tokenizer.ggml.add_bos_token") &&
        !gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &tok->add_bos)) {
        tok_err(err, errlen, "tokenizer.ggml.add_bos_token: not a bool");
        goto fail;
    }
    tok->add_space_prefix = true;
    if (gguf_find(f, "tokenizer.ggml.add_space_prefix") &&
        !gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &tok->add_space_prefix)) {
        tok_err(err, errlen, "tokenizer.ggml.add_space_prefix: not a bool");
        goto fail;
    }

    /* pre-tokenizer */
    tok->pre = TOK_PRE_GPT2;
    gguf_str pre;
    if (kind == TOK_KIND_BPE && gguf_get_str(f, "tokenizer.ggml.pre", &pre)) {
        if (gguf_str_eq(pre, "smollm"))
            tok->pre = TOK_PRE_SMOLLM;
        else if (gguf_str_eq(pre, "llama3") || gguf_str_eq(pre, "llama-bpe"))
            tok->pre = TOK_PRE_LLAMA3;
        else if (gguf_str_eq(pre, "qwen2") || gguf_str_eq(pre, "deepseek-r1-qwen"))
            tok->pre = TOK_PRE_QWEN2;
        else if (!gguf_str_eq(pre, "gpt2") && !gguf_str_eq(pre, "gpt-2") &&
                 !gguf_str_eq(pre, "default")) {
            /* another split of the text gives other ids: refused, never guessed */
            tok_err(err, errlen,
                    "tokenizer.ggml.pre '%.*s' is not supported (orochi splits text as gpt2, gpt-2, "
                    "default, smollm, llama3, llama-bpe, qwen2 and deepseek-r1-qwen do)",
                    (int)(pre.len > 40 ? 40 : pre.len), pre.ptr);
            goto fail;
        }
    }
    tok->ignore_merges = tok->pre == TOK_PRE_LLAMA3;

    /* byte tokens */
    uint32_t byte_to_cp[256];
    int16_t cp_to_byte[324];
    tok_byte_map(byte_to_cp, cp_to_byte);
    for (int b = 0; b < 256; b++) {
        char buf[8];
        size_t l;
        if (kind == TOK_KIND_BPE)
            l = utf8_put(byte_to_cp[b], buf);
        else
            l = (size_t)snprintf(buf, sizeof buf, "<0x%02X>", b);
        tok->byte_id[b] = tok_vocab_find(tok, buf, l);
    }
    if (kind == TOK_KIND_SPM && tok->unk < 0)
        tok->unk = tok_vocab_find(tok, "<unk>", 5);

    if (merges && !tok_build_merges(tok, merges, err, errlen))
        goto fail;
    if (!tok_build_pieces(tok)) {
        tok_err(err, errlen, "tokenizer: out of memory");
        goto fail;
    }

    /* special tokens, bucketed by first byte, longest first */
    for (int32_t i = 0; i < n; i++)
        if (tokenizer_is_special(tok, i) && tok->text_off[i + 1] - tok->text_off[i] > 1)
            tok->n_special++;
    tok->special = malloc(((size_t)tok->n_special + 1) * sizeof *tok->special);
    if (!tok->special) {
        tok_err(err, errlen, "tokenizer: out of memory");
        goto fail;
    }
    tok->n_special = 0;
    for (int32_t i = 0; i < n; i++)
        if (tokenizer_is_special(tok, i) && tok->text_off[i + 1] - tok->text_off[i] > 1)
            tok->special[tok->n_special++] = i;
    tok_sort_specials(tok);
    {
        int32_t k = 0;
        for (int c = 0; c <= 256; c++) {
            while (k < tok->n_special && (uint8_t)tok->text[tok->text_off[tok->special[k]]] < c)
                k++;
            tok->special_first[c] = k;
        }
    }

    /* chat template */
    gguf_str tmpl;
    if (gguf_get_str(f, "tokenizer.chat_template", &tmpl)) {
        const char *needle = "<|im_start|>";
        size_t nl = strlen(needle);
        for (uint64_t i = 0; i + nl <= tmpl.len; i++)
            if (!memcmp(tmpl.ptr + i, needle, nl)) {
                tok->chatml = true;
                break;
            }
        if (tok->chatml)
            tok->chat_system = tok_template_system(tmpl.ptr, (size_t)tmpl.len);
        if (tokenizer_set_chat_template(tok, tmpl.ptr, (size_t)tmpl.len)) {
            tok_err(err, errlen, "out of memory");
            goto fail;
        }
    }
    return tok;

fail:
    tokenizer_destroy(&tok);
    return NULL;
}
