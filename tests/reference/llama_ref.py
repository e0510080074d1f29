"""Independent numpy reference of the Llama forward pass over a GGUF model.

Used by the `reference_*` tests: the C engine's logits are compared with the
logits computed here.  Nothing is shared with the C code: the GGUF container is
read by gguf_ref.py, the tensors are dequantised by dequant_ref.py, and the
transformer below is written directly from the architecture description:

  x = token_embd[token]
  per layer:
    h = rmsnorm(x) * attn_norm
    q, k, v = Wq h + bq, Wk h + bk, Wv h + bv   (biases where the file has them: qwen2)
    qwen3: q, k = rmsnorm(each head) * attn_q_norm / attn_k_norm
    RoPE on q and k: adjacent pairs (2i, 2i+1) for llama, pairs (i, i + rot/2)
      ("NEOX") for qwen2 and qwen3; frequencies base^(-2i/rot) divided by
      rope_freqs.weight[i] (Llama 3.1), by the linear factor, or mixed by YaRN
      (interpolated below the beta_slow = 1 turn, kept above beta_fast = 32,
      a linear ramp between; cos and sin times attn_factor (1 + 0.1 ln s))
    attention over cached positions 0..p, query head h reads kv head
      h // (n_heads / n_kv_heads), scores scaled by 1/sqrt(head_dim)
    x += Wo attn + bo
    h = rmsnorm(x) * ffn_norm
    x += Wdown (silu(Wgate h) * (Wup h))
  logits = lm_head (rmsnorm(x) * output_norm)   (lm_head = token_embd if tied)

All arithmetic is done in float64 by default (weights are dequantised once, at
load, and kept in the compute dtype).

`act_bits=N` (diagnostic, off by default) models an engine that multiplies
quantised weights (Q8_0/Q4_0/Q4_1) with activations rounded to signed N-bit
blocks of 32 (scale amax/(2^(N-1)-1), round half to even) while the Q4 block
offsets meet exact activation block sums.  Comparing the engine with and
without it tells whether a disagreement is explained by its activation
rounding.  (Measured on SmolLM2-135M, 13 tokens: the modelled rounding
alone moves the logits by ~1e-1 mean relative L2 with 8 bits and by ~6e-4
mean / 1.4e-3 max with 16 bits.  At 16 bits many elements sit close enough
to a rounding tie that a float32 engine rounds them differently, so an
engine agrees with the modelled reference only somewhat better than with
the exact one; at 8 bits, away from ties, agreement was ~1e-7.)

`LlamaRef.forward` accepts a chunk of tokens at once (causal within the
chunk), which is mathematically the same as stepping them one by one but much
faster for prompts.

Run directly for a quick look:  python3 llama_ref.py MODEL.gguf [ID ...]
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dequant_ref import GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, block_offsets, dequant  # noqa: E402
from gguf_ref import GGUFRef  # noqa: E402


class LlamaConfig:
    """Hyper-parameters read from the GGUF metadata."""

    def __init__(self, kv, tensors):
        arch = kv.get("general.architecture", "llama")

        def key(name, default=None):
            value = kv.get("%s.%s" % (arch, name), default)
            if value is None:
                raise KeyError("GGUF metadata lacks %s.%s" % (arch, name))
            return value

        self.n_layers = int(key("block_count"))
        self.dim = int(key("embedding_length"))
        self.ffn = int(key("feed_forward_length"))
        self.n_heads = int(key("attention.head_count"))
        self.n_kv_heads = int(key("attention.head_count_kv", self.n_heads))
        self.eps = float(key("attention.layer_norm_rms_epsilon"))
        self.rope_base = float(key("rope.freq_base", 10000.0))
        self.arch = arch
        self.neox = arch in ("qwen2", "qwen3")
        self.scaling = kv.get(arch + ".rope.scaling.type", "none")
        self.scale_factor = float(kv.get(arch + ".rope.scaling.factor", 1.0))
        self.yarn_attn = float(kv.get(arch + ".rope.scaling.attn_factor", 1.0))
        self.ctx = int(key("context_length"))
        q_rows = int(tensors["blk.0.attn_q.weight"].ne[1])
        self.head_dim = int(key("attention.key_length", q_rows // self.n_heads))
        self.rot_dim = int(key("rope.dimension_count", self.head_dim))
        self.vocab = int(tensors["token_embd.weight"].ne[1])
        if self.n_heads % self.n_kv_heads:
            raise ValueError("head_count %d not a multiple of head_count_kv %d"
                             % (self.n_heads, self.n_kv_heads))
        if self.rot_dim % 2 or self.rot_dim > self.head_dim:
            raise ValueError("bad rope dimension %d" % self.rot_dim)
        self.orig_ctx = int(kv.get(arch + ".rope.scaling.original_context_length", self.ctx))

    def __repr__(self):
        return ("LlamaConfig(layers=%d dim=%d ffn=%d heads=%d kv_heads=%d "
                "head_dim=%d rot_dim=%d vocab=%d ctx=%d base=%g eps=%g)"
                % (self.n_layers, self.dim, self.ffn, self.n_heads,
                   self.n_kv_heads, self.head_dim, self.rot_dim, self.vocab,
                   self.ctx, self.rope_base, self.eps))


QUANTISED_TYPES = (GGML_Q8_0, GGML_Q4_0, GGML_Q4_1)


def quantise_activations(x, bits=8):
    """Round the rows of x to signed `bits`-bit blocks of 32, as float64.

    Scale d = amax / qmax with qmax = 2^(bits-1) - 1; q = round(x / d), half
    to even.  The scale and the scaled values are formed in float32, as a
    float32 engine would, so that rounding decisions match it as closely as
    possible.
    """
    qmax = np.float32(2 ** (bits - 1) - 1)
    shape = x.shape
    blocks = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    safe = np.where(amax > 0, amax, np.float32(1))
    inv = np.where(amax > 0, qmax / safe, np.float32(0)).astype(np.float32)
    q = np.rint(blocks * inv)                       # float32 product, ties to even
    d = (amax / qmax).astype(np.float64)
    return (q.astype(np.float64) * d).reshape(shape)


def block_sums(x):
    """Sums of consecutive blocks of 32 along the last axis: (T, n) -> (T, n/32)."""
    return x.reshape(x.shape[0], -1, 32).sum(axis=2)


class Matrix:
    """A dequantised weight (out, in), whether it was stored quantised, and
    (only when activation quantisation is modelled) its per-block offsets."""

    def __init__(self, values, quantised, offsets=None):
        self.values = values
        self.quantised = quantised
        self.offsets = offsets


class LlamaRef:
    """Reference Llama model with its own KV cache (one sequence)."""

    def __init__(self, path, dtype=np.float64, act_bits=None):
        self.path = path
        self.dtype = dtype
        self.act_bits = act_bits
        gguf = GGUFRef(path)
        self.cfg = LlamaConfig(gguf.kv, gguf.tensors)
        cfg = self.cfg

        def load(name, shape=None):
            info = gguf.tensors[name]
            mat = dequant(gguf.tensor_bytes(name), info.type, info.ne)
            if shape is not None and mat.shape != shape:
                raise ValueError("%s has shape %s, expected %s"
                                 % (name, mat.shape, shape))
            return mat.astype(dtype)

        def matrix(name, shape):
            info = gguf.tensors[name]
            quantised = info.type in QUANTISED_TYPES
            offsets = None
            if quantised and act_bits:
                offsets = block_offsets(gguf.tensor_bytes(name), info.type,
                                        info.ne).astype(dtype)
            return Matrix(load(name, shape), quantised, offsets)

        def vector(name):
            return load(name).reshape(-1)

        def optional(name):
            return vector(name) if name in gguf.tensors else None

        qdim = cfg.n_heads * cfg.head_dim
        kvdim = cfg.n_kv_heads * cfg.head_dim
        embd = matrix("token_embd.weight", (cfg.vocab, cfg.dim))
        self.token_embd = embd.values
        self.layers = []
        for i in range(cfg.n_layers):
            p = "blk.%d." % i
            self.layers.append({
                "attn_norm": vector(p + "attn_norm.weight"),
                "wq": matrix(p + "attn_q.weight", (qdim, cfg.dim)),
                "wk": matrix(p + "attn_k.weight", (kvdim, cfg.dim)),
                "wv": matrix(p + "attn_v.weight", (kvdim, cfg.dim)),
                "wo": matrix(p + "attn_output.weight", (cfg.dim, qdim)),
                "ffn_norm": vector(p + "ffn_norm.weight"),
                "w_gate": matrix(p + "ffn_gate.weight", (cfg.ffn, cfg.dim)),
                "w_up": matrix(p + "ffn_up.weight", (cfg.ffn, cfg.dim)),
                "w_down": matrix(p + "ffn_down.weight", (cfg.dim, cfg.ffn)),
                "bq": optional(p + "attn_q.bias"),
                "bk": optional(p + "attn_k.bias"),
                "bv": optional(p + "attn_v.bias"),
                "bo": optional(p + "attn_output.bias"),
                "q_norm": optional(p + "attn_q_norm.weight"),
                "k_norm": optional(p + "attn_k_norm.weight"),
            })
        self.output_norm = vector("output_norm.weight")
        self.tied = "output.weight" not in gguf.tensors
        if self.tied:
            self.lm_head = embd
        else:
            self.lm_head = matrix("output.weight", (cfg.vocab, cfg.dim))
        # inverse frequencies of the rotated pairs: base^(-2i/rot_dim)
        pair = np.arange(cfg.rot_dim // 2, dtype=np.float64)
        self.inv_freq = cfg.rope_base ** (-2.0 * pair / cfg.rot_dim)
        self.mscale = 1.0
        if "rope_freqs.weight" in gguf.tensors:          # Llama 3.1's factors
            self.inv_freq = self.inv_freq / vector("rope_freqs.weight").astype(np.float64)
        elif cfg.scaling == "linear":
            self.inv_freq = self.inv_freq / cfg.scale_factor
        elif cfg.scaling == "yarn":
            s, n = cfg.scale_factor, float(cfg.rot_dim)

            def turns_dim(turns):   # the pair index that turns `turns` times over orig_ctx
                return n * np.log(cfg.orig_ctx / (turns * 2 * np.pi)) / (2 * np.log(cfg.rope_base))

            lo = max(0.0, np.floor(turns_dim(32.0)))
            hi = min(n - 1, np.ceil(turns_dim(1.0)))
            ramp = np.clip((pair - lo) / max(hi - lo, 0.001), 0.0, 1.0)
            keep = 1.0 - ramp
            self.inv_freq = self.inv_freq / s * (1.0 - keep) + self.inv_freq * keep
            self.mscale = cfg.yarn_attn * (1.0 + 0.1 * np.log(s))
        self.reset()

    # -- state -------------------------------------------------------------

    def reset(self):
        """Forget the sequence: empty KV cache, position 0."""
        self.k_cache = None
        self.v_cache = None
        self.pos = 0

    def _reserve(self, length):
        """Grow the KV cache so that it holds at least `length` positions.

        The cache grows on demand (doubling) instead of being sized for the
        whole context window, which can be large for real models.
        """
        cfg = self.cfg
        if length > cfg.ctx:
            raise ValueError("sequence of %d tokens exceeds context %d"
                             % (length, cfg.ctx))
        have = 0 if self.k_cache is None else self.k_cache.shape[1]
        if length <= have:
            return
        cap = min(cfg.ctx, max(length, 2 * have, 64))
        shape = (cfg.n_layers, cap, cfg.n_kv_heads, cfg.head_dim)
        k_new = np.zeros(shape, dtype=self.dtype)
        v_new = np.zeros(shape, dtype=self.dtype)
        if have:
            k_new[:, :have] = self.k_cache
            v_new[:, :have] = self.v_cache
        self.k_cache, self.v_cache = k_new, v_new

    # -- building blocks ---------------------------------------------------

    def _matmul(self, x, weight):
        """y = W x for each row x of the chunk (T, in) -> (T, out)."""
        if not (self.act_bits and weight.quantised):
            return x @ weight.values.T
        xq = quantise_activations(x, self.act_bits)
        # W xq + M (sums(x) - sums(xq)) = D N xq + M sums(x): the block
        # offsets meet the exact activation sums, the d*n part the rounded ones
        exact_sums = block_sums(x.astype(np.float32).astype(np.float64))
        correction = (exact_sums - block_sums(xq)) @ weight.offsets.T
        return xq @ weight.values.T + correction

    def _rmsnorm(self, x, weight):
        mean_sq = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(mean_sq + self.cfg.eps) * weight

    def _rope(self, x, positions):
        """Rotate adjacent pairs (x[2i], x[2i+1]) of every head in place.

        x: (T, heads, head_dim); positions: (T,) absolute positions.
        """
        half = self.cfg.rot_dim // 2
        angle = positions.astype(np.float64)[:, None] * self.inv_freq[None, :]
        cos = (np.cos(angle) * self.mscale)[:, None, :].astype(self.dtype)  # (T, 1, half)
        sin = (np.sin(angle) * self.mscale)[:, None, :].astype(self.dtype)
        if self.cfg.neox:   # pairs (i, i + half)
            first = x[:, :, 0:half].copy()
            second = x[:, :, half:2 * half].copy()
            x[:, :, 0:half] = first * cos - second * sin
            x[:, :, half:2 * half] = first * sin + second * cos
            return x
        even = x[:, :, 0:2 * half:2].copy()
        odd = x[:, :, 1:2 * half:2].copy()
        x[:, :, 0:2 * half:2] = even * cos - odd * sin
        x[:, :, 1:2 * half:2] = even * sin + odd * cos
        return x

    def _attention(self, layer_index, q, k, v, positions):
        """Causal grouped-query attention for a chunk; caches k and v.

        q: (T, n_heads, hd); k, v: (T, n_kv, hd).  Returns (T, n_heads*hd).
        """
        cfg = self.cfg
        T = q.shape[0]
        start = int(positions[0])
        end = start + T
        k_cache = self.k_cache[layer_index]
        v_cache = self.v_cache[layer_index]
        k_cache[start:end] = k
        v_cache[start:end] = v
        keys = k_cache[:end]      # (S, n_kv, hd)
        values = v_cache[:end]
        group = cfg.n_heads // cfg.n_kv_heads
        qg = q.reshape(T, cfg.n_kv_heads, group, cfg.head_dim)
        # scores[g, r, t, s] for kv head g, query head g*group + r
        scores = np.einsum("tgrd,sgd->grts", qg, keys) / np.sqrt(cfg.head_dim)
        key_pos = np.arange(end)
        visible = key_pos[None, :] <= positions[:, None]       # (T, S)
        scores = np.where(visible[None, None], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores)
        weights /= weights.sum(axis=-1, keepdims=True)
        out = np.einsum("grts,sgd->tgrd", weights, values)
        return out.reshape(T, cfg.n_heads * cfg.head_dim)

    # -- forward -------------------------------------------------------------

    def forward(self, tokens):
        """Consume a chunk of tokens; return logits (len(tokens), vocab)."""
        cfg = self.cfg
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            return np.zeros((0, cfg.vocab), dtype=np.float64)
        if tokens.min() < 0 or tokens.max() >= cfg.vocab:
            raise ValueError("token id out of range")
        T = tokens.size
        positions = np.arange(self.pos, self.pos + T)
        self._reserve(self.pos + T)
        x = self.token_embd[tokens].copy()                    # (T, dim)
        for i, L in enumerate(self.layers):
            h = self._rmsnorm(x, L["attn_norm"])
            q, k, v = (self._matmul(h, L[w]) for w in ("wq", "wk", "wv"))
            for y, b in ((q, "bq"), (k, "bk"), (v, "bv")):
                if L[b] is not None:
                    y += L[b]
            q = q.reshape(T, cfg.n_heads, cfg.head_dim)
            k = k.reshape(T, cfg.n_kv_heads, cfg.head_dim)
            v = v.reshape(T, cfg.n_kv_heads, cfg.head_dim)
            if L["q_norm"] is not None:                        # qwen3
                q = self._rmsnorm(q, L["q_norm"])
                k = self._rmsnorm(k, L["k_norm"])
            self._rope(q, positions)
            self._rope(k, positions)
            attn = self._attention(i, q, k, v, positions)
            x = x + self._matmul(attn, L["wo"]) + (0 if L["bo"] is None else L["bo"])
            h = self._rmsnorm(x, L["ffn_norm"])
            gate = self._matmul(h, L["w_gate"])
            up = self._matmul(h, L["w_up"])
            silu = gate / (1.0 + np.exp(-gate))
            x = x + self._matmul(silu * up, L["w_down"])
        self.pos += T
        h = self._rmsnorm(x, self.output_norm)
        return self._matmul(h, self.lm_head).astype(np.float64)

    def step(self, token):
        """Consume one token; return its logits as a float64 vector."""
        return self.forward([int(token)])[0]

    def teacher_forced(self, ids, chunk=64):
        """Logits (len(ids), vocab) after each prefix of ids, from a reset state."""
        self.reset()
        rows = [self.forward(ids[i:i + chunk]) for i in range(0, len(ids), chunk)]
        return np.concatenate(rows, axis=0)

    def greedy(self, prompt_ids, n):
        """Greedy generation of n tokens after prompt_ids (state is reset).

        Returns (generated_ids, logits) where logits has len(prompt_ids) + n
        rows: row i holds the logits after consuming (prompt + generated)[:i+1],
        so the last generated token is consumed as well.
        """
        self.reset()
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError("empty prompt")
        rows = [self.forward(prompt_ids)]
        generated = []
        for _ in range(n):
            nxt = int(np.argmax(rows[-1][-1]))
            generated.append(nxt)
            rows.append(self.forward([nxt]))
        return generated, np.concatenate(rows, axis=0)


def _main(argv):
    if len(argv) < 2:
        print("usage: llama_ref.py MODEL.gguf [ID ...]")
        return 2
    import time
    t0 = time.time()
    model = LlamaRef(argv[1])
    print(model.cfg, "tied" if model.tied else "untied",
          "loaded in %.1fs" % (time.time() - t0))
    ids = [int(a) for a in argv[2:]] or [1]
    t0 = time.time()
    generated, logits = model.greedy(ids, 16)
    print("generated:", generated, "(%.1fs)" % (time.time() - t0))
    print("logits shape", logits.shape)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
