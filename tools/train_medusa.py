#!/usr/bin/env python3
"""Train Medusa-1 heads for an orochi target by self-distillation (numpy only).

    tools/train_medusa.py --target M.gguf --data DATA.bin [--data MORE.bin] --out HEADS.gguf
                          --heads K [--epochs E] [--lr LR] [--batch B] [--seed S]
                          [--holdout 0.1] [--resume CKPT.npz] [--checkpoint CKPT.npz]
                          [--full-vocab] [--prompt-pairs]
    tools/train_medusa.py --make-prompts PROMPTS.txt [--count N] [--seed S] [--docs DIR]

DATA.bin comes from `orochi hidden` (the target's greedy generations with the final hidden state h
of every position, docs/medusa.md "Training"). Head k (0-based) learns to predict the token at
position p + 2 + k from h at position p, with the formula the engine evaluates (model/medusa.h):

    z = h + silu(W_k h + b_k),    logits = lm_head(rmsnorm(z) * output_norm)

output_norm and lm_head are the target's, frozen (read from its GGUF and dequantised once); W_k
and b_k start at zero, so every head starts as the target's own next-token head. The loss is the
cross-entropy of each head on the target's own greedy continuation (self-distillation: the labels
are the tokens the target itself produced), averaged per head and summed over heads; Adam,
minibatches, a per-epoch shuffle drawn from (seed, epoch), so a run is deterministic and a resumed
run continues exactly where the checkpoint (written after every epoch) left it.

By default the softmax runs over a shortlist of the vocabulary: every token of the training split
plus the target's own top-16 tokens at up to 1024 training positions. This makes a step an order
of magnitude cheaper than the full vocabulary (49152 tokens for SmolLM2) and loses little: the
labels are all in it, and the tokens outside it are ones the target never produced nor ranked
high here. --full-vocab trains on the full softmax. The held-out top-1 accuracy is reported on
the shortlist every epoch and, at the end, on the full vocabulary (what the engine's argmax sees).

--make-prompts writes prompt lines for `orochi hidden` from the documentation installed on this
machine (/usr/share/doc/*/README*, changelogs excluded): the first sentences of paragraphs,
de-duplicated, sampled deterministically by --seed.

Only the standard library and numpy are used.
"""
import argparse
import glob
import gzip
import hashlib
import json
import os
import re
import struct
import sys
import time

import numpy as np

DATA_MAGIC = b"OMHS"
DATA_VERSION = 1
GGUF_ALIGN = 32

# ===== GGUF reading (metadata, tensor table, dequantisation of the few types heads need) =====

GT_F32, GT_F16, GT_Q4_0, GT_Q4_1, GT_Q8_0, GT_BF16 = 0, 1, 2, 3, 8, 30
TYPE_NAMES = {GT_F32: "F32", GT_F16: "F16", GT_Q4_0: "Q4_0", GT_Q4_1: "Q4_1", GT_Q8_0: "Q8_0",
              GT_BF16: "BF16"}


class Fail(Exception):
    """A user-facing error: one line, exit status 2."""


class GGUF:
    """A GGUF v2/v3 file: .meta (key -> value), .tensors (name -> (type, shape, absolute offset))."""

    _SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
                11: "<q", 12: "<d"}

    def __init__(self, path):
        self.path = path
        try:
            self.buf = np.memmap(path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as e:
            raise Fail("cannot read GGUF '%s': %s" % (path, e))
        self.mv = memoryview(self.buf)
        self.off = 0
        try:
            self._parse()
        except (struct.error, IndexError, UnicodeDecodeError, OverflowError) as e:
            raise Fail("'%s' is not a valid GGUF file (%s)" % (path, e))

    def _take(self, fmt):
        v = struct.unpack_from(fmt, self.mv, self.off)
        self.off += struct.calcsize(fmt)
        return v[0]

    def _str(self):
        n = self._take("<Q")
        if self.off + n > len(self.buf):
            raise IndexError("string past the end")
        s = bytes(self.mv[self.off:self.off + n]).decode("utf-8", "replace")
        self.off += n
        return s

    def _value(self, t):
        if t in self._SCALARS:
            return self._take(self._SCALARS[t])
        if t == 8:
            return self._str()
        if t == 9:
            et, n = self._take("<I"), self._take("<Q")
            if et in self._SCALARS and et != 7:
                size = struct.calcsize(self._SCALARS[et])
                if self.off + n * size > len(self.buf):
                    raise IndexError("array past the end")
                self.off += n * size  # large arrays (token scores) are skipped, not decoded
                return None
            return [self._value(et) for _ in range(n)]
        raise IndexError("unknown metadata type %d" % t)

    def _parse(self):
        if bytes(self.mv[:4]) != b"GGUF":
            raise Fail("'%s' is not a GGUF file (bad magic)" % self.path)
        self.off = 4
        version = self._take("<I")
        if version not in (2, 3):
            raise Fail("'%s': unsupported GGUF version %d" % (self.path, version))
        n_tensors, n_kv = self._take("<Q"), self._take("<Q")
        self.meta = {}
        for _ in range(n_kv):
            key = self._str()
            self.meta[key] = self._value(self._take("<I"))
        infos = []
        for _ in range(n_tensors):
            name = self._str()
            nd = self._take("<I")
            shape = [self._take("<Q") for _ in range(nd)]
            infos.append((name, self._take("<I"), shape, self._take("<Q")))
        align = self.meta.get("general.alignment", GGUF_ALIGN)
        data = (self.off + align - 1) // align * align
        self.tensors = {name: (t, shape, data + off) for name, t, shape, off in infos}

    def tensor(self, name):
        """The tensor dequantised to float32, shaped [ne1, ne0] (rows, cols) or [ne0]."""
        if name not in self.tensors:
            raise Fail("'%s' has no tensor '%s'" % (self.path, name))
        t, shape, off = self.tensors[name]
        count = int(np.prod(shape))
        cols = shape[0]
        blocks = {GT_Q8_0: 34, GT_Q4_0: 18, GT_Q4_1: 20}
        if t == GT_F32:
            nbytes = 4 * count
        elif t in (GT_F16, GT_BF16):
            nbytes = 2 * count
        elif t in blocks:
            if cols % 32:
                raise Fail("'%s': tensor '%s' has %d columns, not a multiple of 32" % (self.path, name, cols))
            nbytes = count // 32 * blocks[t]
        else:
            raise Fail("'%s': tensor '%s' has type %d, which train_medusa.py does not read (F32 F16 BF16 "
                       "Q8_0 Q4_0 Q4_1; re-quantize with `orochi quantize`)" % (self.path, name, t))
        if off + nbytes > len(self.buf):
            raise Fail("'%s': tensor '%s' runs past the end of the file" % (self.path, name))
        raw = np.asarray(self.buf[off:off + nbytes])
        if t == GT_F32:
            x = raw.view("<f4").astype(np.float32)
        elif t == GT_F16:
            x = raw.view("<f2").astype(np.float32)
        elif t == GT_BF16:
            x = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            b = raw.reshape(-1, blocks[t])
            d = b[:, 0:2].copy().view("<f2").astype(np.float32)  # [nblocks, 1]
            if t == GT_Q8_0:
                x = b[:, 2:].copy().view(np.int8).astype(np.float32) * d
            else:
                qs = b[:, 2:] if t == GT_Q4_0 else b[:, 4:]
                q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)  # [nb, 32]
                if t == GT_Q4_0:
                    x = (q - 8.0) * d
                else:
                    m = b[:, 2:4].copy().view("<f2").astype(np.float32)
                    x = q * d + m
        x = x.reshape(-1)
        return x.reshape(shape[::-1]) if len(shape) > 1 else x


def load_target(path):
    """(name, dim, vocab, eps, output_norm [dim], lm_head [vocab, dim]) of a llama GGUF."""
    g = GGUF(path)
    arch = g.meta.get("general.architecture")
    if not isinstance(arch, str):
        raise Fail("'%s' has no general.architecture" % path)

    def key(k):
        v = g.meta.get("%s.%s" % (arch, k))
        if v is None:
            raise Fail("'%s' lacks metadata key '%s.%s'" % (path, arch, k))
        return v

    dim = int(key("embedding_length"))
    eps = float(g.meta.get("%s.attention.layer_norm_rms_epsilon" % arch, 1e-5))
    head = "output.weight" if "output.weight" in g.tensors else "token_embd.weight"
    lm = g.tensor(head)
    if lm.ndim != 2 or lm.shape[1] != dim:
        raise Fail("'%s': %s has shape %r, expected [vocab, %d]" % (path, head, lm.shape, dim))
    vocab = lm.shape[0]
    norm = g.tensor("output_norm.weight")
    if norm.shape != (dim,):
        raise Fail("'%s': output_norm.weight has shape %r, expected [%d]" % (path, norm.shape, dim))
    name = g.meta.get("general.name")
    if not isinstance(name, str) or not name:
        name = os.path.basename(path)
    return name, dim, vocab, eps, norm.astype(np.float32), np.ascontiguousarray(lm, dtype=np.float32), head


# ===== the training data (orochi hidden) =====

def read_data(paths, dim, vocab):
    """Sequences from one or more `orochi hidden` files: a list of (tokens, n_prompt, hidden)."""
    seqs = []
    for path in paths:
        try:
            buf = np.memmap(path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as e:
            raise Fail("cannot read --data '%s': %s" % (path, e))
        if len(buf) < 20 or bytes(buf[:4]) != DATA_MAGIC:
            raise Fail("'%s' is not an `orochi hidden` file (bad magic)" % path)
        version, fdim, fvocab, nseq = struct.unpack("<4I", bytes(buf[4:20]))
        if version != DATA_VERSION:
            raise Fail("'%s': data version %d, expected %d" % (path, version, DATA_VERSION))
        if fdim != dim or fvocab != vocab:
            raise Fail("'%s' was made with dim %d, vocab %d; the target has dim %d, vocab %d"
                       % (path, fdim, fvocab, dim, vocab))
        off = 20
        for s in range(nseq):
            if off + 8 > len(buf):
                raise Fail("'%s' is truncated (sequence %d of %d)" % (path, s + 1, nseq))
            n, n_prompt = struct.unpack("<2I", bytes(buf[off:off + 8]))
            off += 8
            end = off + 4 * n + 4 * n * dim
            if n_prompt > n or end > len(buf):
                raise Fail("'%s' is truncated or malformed at sequence %d of %d" % (path, s + 1, nseq))
            toks = np.asarray(buf[off:off + 4 * n]).view("<i4").astype(np.int64)
            hid = np.asarray(buf[off + 4 * n:end]).view("<f4").reshape(n, dim)
            if n and (toks.min() < 0 or toks.max() >= vocab):
                raise Fail("'%s': sequence %d holds a token id outside [0, %d)" % (path, s + 1, vocab))
            seqs.append((toks, int(n_prompt), hid))
            off = end
        if off != len(buf):
            raise Fail("'%s' has %d bytes after its %d sequences" % (path, len(buf) - off, nseq))
    return seqs


def build_samples(seqs, which, heads, prompt_pairs):
    """Hidden rows and labels [n, heads] (-1: none) of the sequences `which`. Head k at position p
    is labelled with the token at p + 2 + k when it exists and (unless prompt_pairs) lies in the
    generated part, i.e. is the target's own greedy choice."""
    hs, labels = [], []
    for i in which:
        toks, n_prompt, hid = seqs[i]
        n = len(toks)
        if n < 3:
            continue
        p = np.arange(n)
        lab = np.full((n, heads), -1, dtype=np.int64)
        for k in range(heads):
            q = p + 2 + k
            ok = q < n
            if not prompt_pairs:
                ok &= q >= n_prompt
            lab[ok, k] = toks[q[ok]]
        keep = (lab >= 0).any(axis=1)
        hs.append(np.asarray(hid[keep], dtype=np.float32))
        labels.append(lab[keep])
    if not hs:
        return np.zeros((0, seqs[0][2].shape[1] if seqs else 0), np.float32), np.zeros((0, heads), np.int64)
    return np.concatenate(hs), np.concatenate(labels)


# ===== the heads =====

class Heads:
    """K heads over a (possibly shortlisted) lm_head: forward, loss and gradients in float32."""

    def __init__(self, heads, dim, norm, eps):
        self.K, self.dim, self.eps = heads, dim, np.float32(eps)
        self.norm = norm.astype(np.float32)
        self.WT = np.zeros((heads, dim, dim), np.float32)  # W_k transposed: u = h @ WT[k]
        self.b = np.zeros((heads, dim), np.float32)

    def set_vocab(self, lm):
        """lm: [S, dim] rows of the lm_head the softmax runs over (kept in both layouts: the
        reference BLAS is several times slower on a transposed operand)."""
        self.L = np.ascontiguousarray(lm, dtype=np.float32)
        self.LT = np.ascontiguousarray(self.L.T)

    def _pre(self, k, H):
        U = H @ self.WT[k]
        U += self.b[k]
        E = np.exp(-np.abs(U))  # a sigmoid that never overflows
        S = np.where(U >= 0, 1.0 / (1.0 + E), E / (1.0 + E))
        Z = H + U * S
        r = 1.0 / np.sqrt((Z * Z).mean(axis=1, keepdims=True) + self.eps)
        Y = Z * r
        return U, S, r, Y

    def logits(self, H, labels):
        """Logits of every (row, head) pair with a label, stacked head by head; the pairs."""
        rows, parts = [], []
        for k in range(self.K):
            sel = np.nonzero(labels[:, k] != -1)[0]
            if not len(sel):
                continue
            _, _, _, Y = self._pre(k, H[sel])
            parts.append(Y * self.norm)
            rows.append((k, sel))
        if not parts:
            return None, rows
        return np.concatenate(parts) @ self.LT, rows

    def step_grads(self, H, labels):
        """Loss per head (mean CE over its labelled rows), correct top-1 counts, row counts, and the
        gradients dWT [K, dim, dim], db [K, dim] of the summed per-head means."""
        K = self.K
        cache, parts, targets, scale = [], [], [], []
        for k in range(K):
            sel = np.nonzero(labels[:, k] >= 0)[0]
            if not len(sel):
                continue
            Hk = H[sel]
            U, S, r, Y = self._pre(k, Hk)
            cache.append((k, Hk, U, S, r, Y))
            parts.append(Y * self.norm)
            targets.append(labels[sel, k])
            scale.append(np.full(len(sel), 1.0 / len(sel), np.float32))
        loss, correct, count = np.zeros(K), np.zeros(K), np.zeros(K)
        gW, gb = np.zeros_like(self.WT), np.zeros_like(self.b)
        if not parts:
            return loss, correct, count, gW, gb
        N = np.concatenate(parts)
        tgt = np.concatenate(targets)
        sc = np.concatenate(scale)
        lg = N @ self.LT
        idx = np.arange(len(tgt))
        m = lg.max(axis=1, keepdims=True)
        hit = lg[idx, tgt] >= m[:, 0]
        lg -= m
        np.exp(lg, out=lg)
        s = lg.sum(axis=1, keepdims=True)
        ce = np.log(s[:, 0]) - np.log(np.maximum(lg[idx, tgt], 1e-38))
        lg /= s
        lg[idx, tgt] -= 1.0
        lg *= sc[:, None]
        dN = lg @ self.L
        del lg
        o = 0
        for k, Hk, U, S, r, Y in cache:
            n = len(Hk)
            loss[k] = ce[o:o + n].mean()
            correct[k] = hit[o:o + n].sum()
            count[k] = n
            dY = dN[o:o + n] * self.norm
            dZ = r * (dY - Y * (dY * Y).mean(axis=1, keepdims=True))
            dU = dZ * (S * (1.0 + U * (1.0 - S)))
            gW[k] = Hk.T @ dU
            gb[k] = dU.sum(axis=0)
            o += n
        return loss, correct, count, gW, gb


def evaluate(heads, H, labels, batch=256):
    """Per-head mean CE and top-1 accuracy (argmax over the heads' current vocabulary)."""
    K = heads.K
    loss, correct, count = np.zeros(K), np.zeros(K), np.zeros(K)
    for i in range(0, len(H), batch):
        Hb, Lb = H[i:i + batch], labels[i:i + batch]
        lg, rows = heads.logits(Hb, Lb)
        o = 0
        for k, sel in rows:
            x = lg[o:o + len(sel)]
            t = Lb[sel, k]
            ok = t >= 0  # labels outside the vocabulary in use are -2: never right
            m = x.max(axis=1)
            lse = m + np.log(np.exp(x - m[:, None]).sum(axis=1))
            tl = np.where(ok, x[np.arange(len(t)), np.maximum(t, 0)], -np.inf)
            loss[k] += np.minimum(lse - tl, 50.0).sum()
            correct[k] += (ok & (tl >= m)).sum()
            count[k] += len(sel)
            o += len(sel)
    with np.errstate(invalid="ignore", divide="ignore"):
        return loss / np.maximum(count, 1), correct / np.maximum(count, 1), count


class Adam:
    def __init__(self, shapes, lr, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps, self.t = lr, b1, b2, eps, 0
        self.m = [np.zeros(s, np.float32) for s in shapes]
        self.v = [np.zeros(s, np.float32) for s in shapes]

    def step(self, params, grads):
        self.t += 1
        c1, c2 = 1.0 - self.b1 ** self.t, 1.0 - self.b2 ** self.t
        for p, g, m, v in zip(params, grads, self.m, self.v):
            m *= self.b1
            m += (1.0 - self.b1) * g
            v *= self.b2
            v += (1.0 - self.b2) * g * g
            p -= (self.lr / c1) * m / (np.sqrt(v / c2) + self.eps)


# ===== output =====

def write_heads(path, heads, dim, vocab, target_name, description):
    """The heads as the side GGUF model/medusa.h loads: F32 res.weight [dim, dim] and F32 res.bias
    [dim] per head, no out.weight (the target's lm_head is used)."""
    def s(b, x):
        x = x.encode()
        b += struct.pack("<Q", len(x)) + x

    def kv_str(b, k, v):
        s(b, k)
        b += struct.pack("<I", 8)
        s(b, v)

    def kv_u32(b, k, v):
        s(b, k)
        b += struct.pack("<II", 4, v)

    tensors = []
    for k in range(heads.K):
        tensors.append(("medusa.%d.res.weight" % k, [dim, dim], np.ascontiguousarray(heads.WT[k].T)))
        tensors.append(("medusa.%d.res.bias" % k, [dim], heads.b[k]))
    hdr = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 8))
    kv_str(hdr, "general.architecture", "orochi-medusa")
    kv_str(hdr, "general.name", "orochi-train-medusa")
    kv_str(hdr, "general.description", description)
    kv_u32(hdr, "general.alignment", GGUF_ALIGN)
    kv_u32(hdr, "medusa.head_count", heads.K)
    kv_u32(hdr, "medusa.embedding_length", dim)
    kv_u32(hdr, "medusa.vocab_size", vocab)
    kv_str(hdr, "medusa.target", target_name)
    off = 0
    for name, shape, x in tensors:
        s(hdr, name)
        hdr += struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        hdr += struct.pack("<IQ", GT_F32, off)
        off += (x.nbytes + GGUF_ALIGN - 1) // GGUF_ALIGN * GGUF_ALIGN
    hdr += bytes(-len(hdr) % GGUF_ALIGN)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "wb") as f:
        f.write(hdr)
        for _, _, x in tensors:
            data = np.asarray(x, dtype="<f4").tobytes()
            f.write(data + bytes(-len(data) % GGUF_ALIGN))
    os.replace(tmp, path)


def save_checkpoint(path, heads, opt, epoch, config, shortlist, history):
    tmp = "%s.%d.tmp.npz" % (path[:-4] if path.endswith(".npz") else path, os.getpid())
    np.savez(tmp, WT=heads.WT, b=heads.b, mW=opt.m[0], vW=opt.v[0], mb=opt.m[1], vb=opt.v[1],
             t=np.int64(opt.t), epoch=np.int64(epoch), config=np.array(json.dumps(config, sort_keys=True)),
             shortlist=shortlist, history=np.array(json.dumps(history)))
    os.replace(tmp, path)


# ===== progress =====

class Progress:
    def __init__(self, total, label):
        self.total, self.label, self.t0, self.last = total, label, time.time(), 0.0
        self.tty = sys.stderr.isatty()
        self.next_pct = 10

    def update(self, done, text):
        now = time.time()
        pct = 100 * done // max(self.total, 1)
        if self.tty:
            if now - self.last < 0.3 and done < self.total:
                return
            self.last = now
            width = 24
            fill = width * done // max(self.total, 1)
            el = now - self.t0
            eta = el / done * (self.total - done) if done else 0
            sys.stderr.write("\r%s [%s%s] %3d%% %s %.0fs eta %.0fs  " % (
                self.label, "#" * fill, "." * (width - fill), pct, text, el, eta))
        elif pct >= self.next_pct or done == self.total:
            while self.next_pct <= pct:
                self.next_pct += 10
            sys.stderr.write("%s %3d%% %s %.0fs\n" % (self.label, pct, text, now - self.t0))
        sys.stderr.flush()

    def close(self):
        if self.tty:
            sys.stderr.write("\n")


def fmt_heads(v, pct=True):
    return " ".join(("h%d %.1f%%" % (k, 100 * x)) if pct else ("h%d %.3f" % (k, x)) for k, x in enumerate(v))


# ===== prompts from the local documentation =====

def doc_sentences(docs):
    """First sentences of prose paragraphs in the README files under docs (de-duplicated)."""
    files = sorted(glob.glob(os.path.join(docs, "*", "README*")))
    files = [f for f in files if os.path.isfile(f) and "changelog" not in f.lower()]
    if not files:
        raise Fail("no README files under %s" % docs)
    seen, cands = set(), []
    for path in files:
        try:
            if path.endswith(".gz"):
                with gzip.open(path, "rb") as f:
                    raw = f.read(200000)
            else:
                with open(path, "rb") as f:
                    raw = f.read(200000)
        except OSError:
            continue
        text = raw.decode("utf-8", "replace")
        for para in re.split(r"\n\s*\n", text):
            line = " ".join(para.split())
            # prose only: starts with a letter, mostly letters, no markup / tables / license boilerplate
            if len(line) < 40 or not line[0].isalpha():
                continue
            letters = sum(c.isalpha() or c == " " for c in line)
            if letters < 0.85 * len(line) or "copyright" in line.lower() or "http" in line or \
                    re.search(r"[-=*_#~]{3}", line):
                continue
            m = re.match(r"(.{40,240}?[.!?:])(\s|$)", line)
            prompt = m.group(1) if m else line[:200].rsplit(" ", 1)[0]
            key = prompt.lower()
            if key in seen:
                continue
            seen.add(key)
            cands.append(prompt)
    if not cands:
        raise Fail("no usable paragraph in the README files under %s" % docs)
    return cands, len(files)


def python_docstrings(pylib):
    """(function name, first docstring line) of the Python standard library's functions."""
    out, seen = [], set()
    for path in sorted(glob.glob(os.path.join(pylib, "*.py"))):
        try:
            text = open(path, encoding="utf-8", errors="replace").read()
        except OSError:
            continue
        for m in re.finditer(r'\n\s*def ([a-z][a-z0-9_]{2,30})\([^)]*\)[^:\n]*:\n\s+"""([A-Z][^\n"]{24,110}\.)', text):
            name, doc = m.group(1), m.group(2)
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            out.append((name, doc))
    return out


# Instruction prompts (--style instruct): tasks of the kinds a chat model is asked for (explain,
# condense, code, arithmetic), their material drawn from this machine's documentation and Python
# library, or numbers drawn at random. Not the bench prompts' texts.
DOC_TASKS = ["Explain this in simple words: {s}", "Give a one-sentence summary of this text: {s}",
             "Rewrite this so that a beginner understands it: {s}", "What does this mean, and why would "
             "someone need it? {s}", "List three key points of this text: {s}"]
CODE_TASKS = ["Write a Python function called {name}. {doc}", "Implement this in C as a function "
              "named {name}: {doc}", "Write a JavaScript function {name} for this task: {doc}",
              "Show how a Python function named {name} could work. {doc}"]
MATH_TASKS = ["What is {a} times {b}? Show your work.",
              "Add {a} and {b}, then divide the result by {c}. What do you get? Explain each step.",
              "A train moves at {c} km per hour for {d} hours. How far does it travel?",
              "A rectangle is {c} m long and {d} m wide. What is its area and its perimeter?",
              "Tom is {c} years old and his aunt is {f} years old. How many years older is she?",
              "What is the average of {c}, {d} and {e}? Explain how to compute it.",
              "Each ticket costs {c} dollars. How much do {d} tickets cost, with step by step reasoning?"]


def instruct_prompts(count, rng, docs, pylib):
    sents, _ = doc_sentences(docs)
    funcs = python_docstrings(pylib)
    out = []
    for i in range(count):
        kind = i % 3
        if kind == 0 or (kind == 1 and not funcs):
            t = DOC_TASKS[int(rng.integers(len(DOC_TASKS)))]
            out.append(t.format(s=sents[int(rng.integers(len(sents)))]))
        elif kind == 1:
            name, doc = funcs[int(rng.integers(len(funcs)))]
            out.append(CODE_TASKS[int(rng.integers(len(CODE_TASKS)))].format(name=name, doc=doc))
        else:
            n = [int(x) for x in rng.integers(2, 90, size=5)]
            out.append(MATH_TASKS[int(rng.integers(len(MATH_TASKS)))].format(
                a=n[0] * 7 + 40, b=n[1], c=n[2], d=n[3], e=n[4], f=n[2] + n[3]))
    return out


def make_prompts(out, count, seed, docs, style="docs", pylib=None):
    rng = np.random.default_rng(seed)
    if style == "instruct":
        lines = instruct_prompts(count, rng, docs, pylib or sorted(glob.glob("/usr/lib/python3.*"))[-1])
        what = "instruction prompts"
    else:
        cands, n_files = doc_sentences(docs)
        pick = rng.permutation(len(cands))[:count]
        lines = [cands[i] for i in sorted(pick)]
        what = "prompts (of %d candidates from %d README files)" % (len(cands), n_files)
    with open(out, "w") as f:
        for line in lines:
            f.write(line + "\n")
    sys.stderr.write("train_medusa: wrote %s: %d %s\n" % (out, len(lines), what))


# ===== main =====

def parse_args(argv):
    ap = argparse.ArgumentParser(description="Train Medusa-1 heads by self-distillation (docs/medusa.md).")
    ap.add_argument("--target", help="the target model GGUF")
    ap.add_argument("--data", action="append", help="`orochi hidden` output (repeatable)")
    ap.add_argument("--out", help="heads GGUF to write")
    ap.add_argument("--heads", type=int, help="number of heads K (head k predicts token p+2+k)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=128, help="positions per minibatch")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--holdout", type=float, default=0.1, help="fraction of sequences held out")
    ap.add_argument("--resume", help="continue from this checkpoint")
    ap.add_argument("--checkpoint", help="checkpoint written after every epoch (default OUT.ckpt.npz)")
    ap.add_argument("--full-vocab", action="store_true", help="softmax over the whole vocabulary")
    ap.add_argument("--shortlist-top", type=int, default=16,
                    help="the target's top tokens at sampled positions added to the shortlist")
    ap.add_argument("--prompt-pairs", action="store_true",
                    help="also train on labels inside the prompt (default: generated tokens only)")
    ap.add_argument("--eval-full", type=int, default=512,
                    help="held-out positions evaluated on the full vocabulary at the end (0: none)")
    ap.add_argument("--make-prompts", metavar="FILE", help="write prompts from local docs and exit")
    ap.add_argument("--count", type=int, default=400, help="with --make-prompts: how many")
    ap.add_argument("--docs", default="/usr/share/doc", help="with --make-prompts: where to look")
    ap.add_argument("--style", choices=("docs", "instruct"), default="docs",
                    help="with --make-prompts: first sentences of docs, or instruction prompts (explain, "
                         "summarise, code from the Python library's docstrings, arithmetic)")
    ap.add_argument("--pylib", help="with --style instruct: the Python library directory (default the "
                                    "newest /usr/lib/python3.*)")
    a = ap.parse_args(argv)
    if a.make_prompts:
        return a
    missing = [o for o in ("target", "data", "out", "heads") if not getattr(a, o)]
    if missing:
        ap.error("missing " + ", ".join("--" + o for o in missing))
    if not 1 <= a.heads <= 64:
        ap.error("--heads must be in 1..64")
    if a.epochs < 0 or a.batch < 1 or not a.lr > 0 or not 0 <= a.holdout < 1:
        ap.error("--epochs >= 0, --batch >= 1, --lr > 0 and 0 <= --holdout < 1 are required")
    return a


def main(argv):
    a = parse_args(argv)
    if a.make_prompts:
        make_prompts(a.make_prompts, a.count, a.seed, a.docs, a.style, a.pylib)
        return 0
    t_start = time.time()
    name, dim, vocab, eps, norm, lm, head_name = load_target(a.target)
    sys.stderr.write("train_medusa: target %s: dim %d, vocab %d, lm_head %s (%s), %.1f s\n" % (
        name, dim, vocab, head_name, TYPE_NAMES.get(GGUF(a.target).tensors[head_name][0], "?"),
        time.time() - t_start))
    seqs = read_data(a.data, dim, vocab)
    if len(seqs) < 2 and a.holdout > 0:
        raise Fail("the data holds %d sequence(s); a held-out split needs at least 2 (or --holdout 0)"
                   % len(seqs))
    rng = np.random.default_rng(a.seed)
    order = rng.permutation(len(seqs))
    n_hold = int(round(a.holdout * len(seqs)))
    if a.holdout > 0:
        n_hold = min(max(n_hold, 1), len(seqs) - 1)
    hold_idx, train_idx = sorted(order[:n_hold]), sorted(order[n_hold:])
    Htr, Ytr = build_samples(seqs, train_idx, a.heads, a.prompt_pairs)
    Hho, Yho = build_samples(seqs, hold_idx, a.heads, a.prompt_pairs)
    if not len(Htr):
        raise Fail("no training position: the sequences need generated tokens at p+2 (orochi hidden -n)")
    n_tok = sum(len(s[0]) for s in seqs)
    sys.stderr.write("train_medusa: %d sequences (%d tokens): %d training positions, %d held-out "
                     "positions (%d sequences)\n" % (len(seqs), n_tok, len(Htr), len(Hho), len(hold_idx)))

    # the shortlist: the training split's tokens + the target's own top tokens at sampled positions
    if a.full_vocab:
        shortlist = np.arange(vocab)
    else:
        toks = np.unique(np.concatenate([seqs[i][0] for i in train_idx]))
        srng = np.random.default_rng([a.seed, 7])
        probe = Htr[np.sort(srng.permutation(len(Htr))[:1024])]
        y = probe / np.sqrt((probe * probe).mean(axis=1, keepdims=True) + eps) * norm
        top = []
        lmT = None
        for i in range(0, len(y), 128):
            if lmT is None:
                lmT = np.ascontiguousarray(lm.T)
            lg = y[i:i + 128] @ lmT
            top.append(np.argpartition(-lg, a.shortlist_top, axis=1)[:, :a.shortlist_top].reshape(-1))
        del lmT
        shortlist = np.unique(np.concatenate([toks] + top))
    if a.resume:
        try:
            ck = np.load(a.resume)
            ck_cfg = json.loads(str(ck["config"]))
        except (OSError, ValueError, KeyError) as e:
            raise Fail("cannot read checkpoint '%s': %s" % (a.resume, e))
        shortlist = ck["shortlist"]
    remap = np.full(vocab, -2, np.int64)
    remap[shortlist] = np.arange(len(shortlist))

    def to_short(Y):
        return np.where(Y >= 0, remap[np.maximum(Y, 0)], -1)

    Ytr_s, Yho_s = to_short(Ytr), to_short(Yho)
    if (Ytr_s == -2).any():
        raise Fail("internal: a training label is outside the shortlist")
    heads = Heads(a.heads, dim, norm, eps)
    heads.set_vocab(lm[shortlist])
    opt = Adam([heads.WT.shape, heads.b.shape], a.lr)
    config = {"heads": a.heads, "dim": dim, "vocab": vocab, "seed": a.seed, "holdout": a.holdout,
              "batch": a.batch, "lr": a.lr, "prompt_pairs": a.prompt_pairs, "full_vocab": a.full_vocab,
              "data": hashlib.sha256(Ytr.tobytes() + Yho.tobytes()).hexdigest()[:16]}
    start_epoch, history = 0, []
    if a.resume:
        for k in ("heads", "dim", "vocab", "seed", "holdout", "batch", "prompt_pairs", "data"):
            if ck_cfg.get(k) != config[k]:
                raise Fail("checkpoint '%s' was made with %s=%r, this run has %r" % (
                    a.resume, k, ck_cfg.get(k), config[k]))
        heads.WT[...] = ck["WT"]
        heads.b[...] = ck["b"]
        opt.m = [ck["mW"].copy(), ck["mb"].copy()]
        opt.v = [ck["vW"].copy(), ck["vb"].copy()]
        opt.t = int(ck["t"])
        start_epoch = int(ck["epoch"])
        history = json.loads(str(ck["history"]))
        sys.stderr.write("train_medusa: resumed from %s after epoch %d\n" % (a.resume, start_epoch))
    ckpt = a.checkpoint or (a.out + ".ckpt.npz")
    sys.stderr.write("train_medusa: %d heads, softmax over %d tokens%s; %d epochs of %d steps "
                     "(batch %d), lr %g, seed %d\n" % (
                         a.heads, len(shortlist), " (full vocabulary)" if a.full_vocab else " (shortlist)",
                         a.epochs, (len(Htr) + a.batch - 1) // a.batch, a.batch, a.lr, a.seed))
    if len(Hho) and start_epoch == 0:
        l0, acc0, _ = evaluate(heads, Hho, Yho_s)
        sys.stderr.write("train_medusa: before training (W = 0, each head = the target's next-token head): "
                         "held-out loss %.3f, top-1 %s\n" % (l0.sum(), fmt_heads(acc0)))

    step_times = []
    for epoch in range(start_epoch, a.epochs):
        perm = np.random.default_rng([a.seed, epoch + 1]).permutation(len(Htr))
        n_steps = (len(perm) + a.batch - 1) // a.batch
        bar = Progress(n_steps, "epoch %d/%d" % (epoch + 1, a.epochs))
        t0 = time.time()
        run_loss, run_hit, run_n = np.zeros(a.heads), np.zeros(a.heads), np.zeros(a.heads)
        for s in range(n_steps):
            ts = time.time()
            idx = np.sort(perm[s * a.batch:(s + 1) * a.batch])
            loss, hit, cnt, gW, gb = heads.step_grads(Htr[idx], Ytr_s[idx])
            opt.step([heads.WT, heads.b], [gW, gb])
            step_times.append(time.time() - ts)
            run_loss += loss * cnt
            run_hit += hit
            run_n += cnt
            tr = run_loss / np.maximum(run_n, 1)
            bar.update(s + 1, "loss %.3f (%s)" % (tr.sum(), " ".join("%.2f" % x for x in tr)))
        bar.close()
        el = time.time() - t0
        tr_loss = run_loss / np.maximum(run_n, 1)
        line = "epoch %d/%d: train loss %.3f, top-1 %s | %.1f s (%.0f positions/s, %.0f ms/step)" % (
            epoch + 1, a.epochs, tr_loss.sum(), fmt_heads(run_hit / np.maximum(run_n, 1)), el,
            len(Htr) / el, 1000 * el / n_steps)
        rec = {"epoch": epoch + 1, "train_loss": list(tr_loss), "seconds": el}
        if len(Hho):
            hl, hacc, _ = evaluate(heads, Hho, Yho_s)
            line += "\n  held-out: loss %.3f, top-1 %s" % (hl.sum(), fmt_heads(hacc))
            rec.update(holdout_loss=list(hl), holdout_top1=list(hacc))
        sys.stderr.write(line + "\n")
        history.append(rec)
        save_checkpoint(ckpt, heads, opt, epoch + 1, config, shortlist, history)

    desc = "Medusa-1 heads trained by tools/train_medusa.py: %d epochs, lr %g, batch %d, seed %d, %d " \
           "training positions" % (a.epochs, a.lr, a.batch, a.seed, len(Htr))
    if len(Hho) and a.eval_full > 0:
        sel = np.sort(np.random.default_rng([a.seed, 9]).permutation(len(Hho))[:a.eval_full])
        t0 = time.time()
        heads.set_vocab(lm)
        _, facc, fcnt = evaluate(heads, Hho[sel], Yho[sel])
        sys.stderr.write("train_medusa: held-out top-1 on the full vocabulary (%d positions, %.1f s): %s\n"
                         % (len(sel), time.time() - t0, fmt_heads(facc)))
        desc += "; held-out top-1 (full vocabulary) " + fmt_heads(facc)
    write_heads(a.out, heads, dim, vocab, name, desc)
    if step_times:
        sys.stderr.write("train_medusa: median step %.1f ms (batch %d, %d heads, %d-token softmax)\n" % (
            1000 * float(np.median(step_times)), a.batch, a.heads, len(shortlist)))
    sys.stderr.write("train_medusa: wrote %s (%d heads) in %.1f s total\n" % (a.out, a.heads, time.time() - t_start))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Fail as e:
        sys.stderr.write("train_medusa: %s\n" % e)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
