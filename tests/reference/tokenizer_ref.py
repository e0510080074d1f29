"""tokenizer_ref — an independent Python reference of the orochi tokenizer (model/tokenizer.c).

Built only from a GGUF file's own metadata (read with gguf_ref.py) and the `regex` module; it
shares no code with the C implementation and deliberately uses the plain, obviously-correct
algorithms rather than the fast ones:

* special tokens (token_type 3 control / 4 user-defined) are cut out of the text first with one
  regex alternation sorted longest-first (so the leftmost, longest literal wins);
* byte-level BPE ("gpt2"): each pre-token (regex.findall of the pre-tokenizer pattern, after the
  SmolLM digit split) is mapped byte -> printable unicode char (the GPT-2 rule) and merged with the
  classic loop "merge every occurrence of the lowest-ranked adjacent pair, repeat";
* SentencePiece-style ("llama"): ' ' -> U+2581, a U+2581 prefix at the start and after special
  tokens (add_space_prefix), then repeatedly merge the adjacent pair whose concatenation is a
  vocab piece with the highest score (leftmost on ties), unknown pieces fall back to <0xXX>.

The conventions that are choices rather than facts (first duplicate wins in the vocab, merges
whose parts or result are not in the vocab are ignored, in byte-level BPE a byte with no token is
dropped, in SentencePiece a piece with no token becomes <0xXX> bytes or unknown_token_id) are the
same as the C side's, stated in model/tokenizer.c.
"""

import os
import sys

import regex

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_ref import GGUFRef  # noqa: E402

GPT2_PATTERN = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DIGIT_PATTERN = r"\p{N}"
# Qwen2's (and DeepSeek-R1-Distill-Qwen's) pre-tokenizer: Llama 3's with single digits and the
# contractions as explicit case pairs
QWEN2_PATTERN = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|"
                 r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
                 r"\s+(?!\S)|\s+")

TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6
SPM_SPACE = "\u2581"


def bytes_to_unicode():
    """The GPT-2 byte -> char table: printable bytes map to themselves, the rest to 256 + n."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table = {}
    n = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


class RefTokenizer:
    def __init__(self, gguf):
        if not isinstance(gguf, GGUFRef):
            gguf = GGUFRef(gguf)
        kv = gguf.kv
        self.model = kv.get("tokenizer.ggml.model")
        self.pre = kv.get("tokenizer.ggml.pre", "default")
        toks = kv["tokenizer.ggml.tokens"]
        self.tokens = [t if isinstance(t, str) else t.decode("utf-8", "surrogateescape")
                       for t in toks]
        n = len(self.tokens)
        self.types = list(kv.get("tokenizer.ggml.token_type", [TT_NORMAL] * n))
        # string -> first id; for SentencePiece the first *mergeable* id wins over control /
        # byte / unused duplicates of the same string
        self.vocab = {}
        order = range(n)
        if self.model == "llama":
            bad = (TT_UNKNOWN, TT_CONTROL, TT_UNUSED, TT_BYTE)
            order = [i for i in order if self.types[i] not in bad] + \
                    [i for i in order if self.types[i] in bad]
        for i in order:
            if self.tokens[i] not in self.vocab:
                self.vocab[self.tokens[i]] = i
        self.bos = kv.get("tokenizer.ggml.bos_token_id", -1)
        self.eos = kv.get("tokenizer.ggml.eos_token_id", -1)
        self.unk = kv.get("tokenizer.ggml.unknown_token_id", -1)
        self.add_bos = kv.get("tokenizer.ggml.add_bos_token", self.model == "llama")
        self.add_space_prefix = kv.get("tokenizer.ggml.add_space_prefix", True)
        specials = sorted({t for t, ty in zip(self.tokens, self.types)
                           if ty in (TT_CONTROL, TT_USER) and t}, key=len, reverse=True)
        self.special_re = regex.compile("|".join(regex.escape(s) for s in specials)) \
            if specials else None
        self._cache = {}
        if self.model == "gpt2":
            self.b2u = bytes_to_unicode()
            self.u2b = {c: b for b, c in self.b2u.items()}
            self.ranks = {}
            for r, m in enumerate(kv["tokenizer.ggml.merges"]):
                k = m.find(" ", 1)
                if k < 0:
                    raise ValueError("tokenizer.ggml.merges[%d]: no space in %r" % (r, m))
                a, b = m[:k], m[k + 1:]
                if a in self.vocab and b in self.vocab and a + b in self.vocab \
                        and (a, b) not in self.ranks:
                    self.ranks[(a, b)] = r
            if self.pre == "smollm":
                self.pre_steps = [regex.compile(DIGIT_PATTERN), regex.compile(GPT2_PATTERN)]
            elif self.pre in ("llama3", "llama-bpe"):
                self.pre_steps = [regex.compile(LLAMA3_PATTERN)]
            elif self.pre in ("qwen2", "deepseek-r1-qwen"):
                self.pre_steps = [regex.compile(QWEN2_PATTERN)]
            else:
                self.pre_steps = [regex.compile(GPT2_PATTERN)]
            self.ignore_merges = self.pre in ("llama3", "llama-bpe")
        elif self.model == "llama":
            self.scores = list(kv.get("tokenizer.ggml.scores", [0.0] * n))
            self.mergeable = {}
            for i, t in enumerate(self.tokens):
                if self.types[i] not in (TT_UNKNOWN, TT_CONTROL, TT_UNUSED, TT_BYTE) \
                        and t not in self.mergeable:
                    self.mergeable[t] = i
        else:
            raise ValueError("unsupported tokenizer.ggml.model %r" % self.model)

    # --- splitting --------------------------------------------------------------------------
    def _fragments(self, text, parse_special):
        """[(is_special, str_or_id)] in order."""
        if not parse_special or self.special_re is None:
            return [(False, text)] if text else []
        out = []
        pos = 0
        for m in self.special_re.finditer(text):
            if m.start() > pos:
                out.append((False, text[pos:m.start()]))
            out.append((True, self.vocab[m.group(0)]))
            pos = m.end()
        if pos < len(text):
            out.append((False, text[pos:]))
        return out

    def pretokenize(self, text):
        pieces = [text]
        for rx in self.pre_steps:
            nxt = []
            for p in pieces:
                # regex.split-like: keep matches and the (non-empty) gaps between them
                pos = 0
                for m in rx.finditer(p):
                    if m.start() > pos:
                        nxt.append(p[pos:m.start()])
                    nxt.append(m.group(0))
                    pos = m.end()
                if pos < len(p):
                    nxt.append(p[pos:])
            pieces = nxt
        return pieces

    # --- byte-level BPE ---------------------------------------------------------------------
    def _bpe(self, piece):
        if piece in self._cache:
            return self._cache[piece]
        mapped = "".join(self.b2u[b] for b in piece.encode("utf-8", "surrogateescape"))
        if self.ignore_merges and mapped in self.vocab:
            ids = [self.vocab[mapped]]
            self._cache[piece] = ids
            return ids
        word = list(mapped)
        while len(word) > 1:
            best = None
            for i in range(len(word) - 1):
                r = self.ranks.get((word[i], word[i + 1]))
                if r is not None and (best is None or r < best):
                    best = r
            if best is None:
                break
            new = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and self.ranks.get((word[i], word[i + 1])) == best:
                    new.append(word[i] + word[i + 1])
                    i += 2
                else:
                    new.append(word[i])
                    i += 1
            word = new
        # only a single byte without a token can be missing here: it is dropped
        ids = [self.vocab[w] for w in word if w in self.vocab]
        self._cache[piece] = ids
        return ids

    # --- SentencePiece-style ----------------------------------------------------------------
    def _spm(self, text, prefix):
        s = text.replace(" ", SPM_SPACE)
        if prefix:
            s = SPM_SPACE + s
        syms = list(s)
        while len(syms) > 1:
            best, best_i = None, -1
            for i in range(len(syms) - 1):
                tid = self.mergeable.get(syms[i] + syms[i + 1])
                if tid is not None and (best is None or self.scores[tid] > best):
                    best, best_i = self.scores[tid], i
            if best_i < 0:
                break
            syms[best_i:best_i + 2] = [syms[best_i] + syms[best_i + 1]]
        ids = []
        for sym in syms:
            tid = self.mergeable.get(sym)
            if tid is not None:
                ids.append(tid)
                continue
            for b in sym.encode("utf-8", "surrogateescape"):
                bid = self.vocab.get("<0x%02X>" % b)
                if bid is not None:
                    ids.append(bid)
                elif self.unk >= 0:
                    ids.append(self.unk)
        return ids

    # --- public -----------------------------------------------------------------------------
    def encode(self, text, parse_special=True):
        ids = []
        prev_special = True
        for is_special, frag in self._fragments(text, parse_special):
            if is_special:
                ids.append(frag)
                prev_special = True
                continue
            if self.model == "gpt2":
                for piece in self.pretokenize(frag):
                    ids.extend(self._bpe(piece))
            else:
                ids.extend(self._spm(frag, self.add_space_prefix and prev_special))
            prev_special = False
        return ids

    def token_bytes(self, tid):
        if tid < 0 or tid >= len(self.tokens):
            return b""
        t = self.tokens[tid]
        ty = self.types[tid]
        if ty in (TT_CONTROL, TT_USER):
            return t.encode("utf-8", "surrogateescape")
        if self.model == "gpt2":
            out = bytearray()
            for ch in t:
                if ch in self.u2b:
                    out.append(self.u2b[ch])
                else:
                    out += ch.encode("utf-8", "surrogateescape")
            return bytes(out)
        m = regex.fullmatch(r"<0x([0-9A-Fa-f]{2})>", t)
        if ty == TT_BYTE and m:
            return bytes([int(m.group(1), 16)])
        return t.replace(SPM_SPACE, " ").encode("utf-8", "surrogateescape")

    def _is_special(self, tid):
        return 0 <= tid < len(self.types) and self.types[tid] in (TT_CONTROL, TT_USER)

    def decode_bytes(self, ids):
        """Concatenated token bytes; for SentencePiece with add_space_prefix, the leading space of
        a text token at the start or right after a special token is dropped (undoing encode)."""
        out = bytearray()
        prev_special = True
        for tid in ids:
            b = self.token_bytes(tid)
            if self.model == "llama" and self.add_space_prefix and prev_special \
                    and not self._is_special(tid) and b.startswith(b" "):
                b = b[1:]
            out += b
            prev_special = self._is_special(tid)
        return bytes(out)

    def decode(self, ids):
        return self.decode_bytes(ids).decode("utf-8", "surrogateescape")


if __name__ == "__main__":
    tok = RefTokenizer(sys.argv[1])
    for line in sys.argv[2:]:
        ids = tok.encode(line)
        print(" ".join(map(str, ids)))
        print([tok.tokens[i] for i in ids])
