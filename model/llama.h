/*
 * model/llama — the Llama-architecture target model: load from GGUF, run a batch of W tokens
 * arranged as a token tree, commit an accepted path into the KV prefix.
 *
 * The forward takes tokens with explicit positions and parent indices (a chain is the causal case).
 * Their K/V go to a per-layer tree area; each token attends to the committed prefix (dense part)
 * and to its own ancestors in the tree, in one causal pass. A batch may also append to the tree
 * of the previous ones (a drafter growing its tree round by round computes each node once). A
 * context may be one part of a column split: it then computes only its output rows of every linear
 * layer and the lm_head, and only its query heads' attention (the dense prefix part, the sparse
 * tree part or both), meeting the other parts at synchronisation points; how the work is shared
 * is a partition plan (llama_partition). The parts' pieces concatenate bit-identically, except
 * that a head whose dense and sparse parts are computed by different parts is merged by online
 * softmax.
 */
#ifndef OROCHI_LLAMA_H
#define OROCHI_LLAMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kernels.h"
#include "model/gguf.h"
#include "model/packcache.h"

/* The families orochi runs (general.architecture): llama (Llama 2/3/3.1-3.3, Mistral, SmolLM),
 * qwen2 (q/k/v biases, NEOX RoPE), qwen3 (per-head q/k RMS norms, NEOX RoPE). docs/models.md. */
typedef enum { LLAMA_ARCH_LLAMA, LLAMA_ARCH_QWEN2, LLAMA_ARCH_QWEN3 } llama_arch;
/* RoPE's frequency scaling (rope.scaling.type; LLAMA3: the per-pair factors of rope_freqs.weight) */
typedef enum { LLAMA_ROPE_NONE, LLAMA_ROPE_LINEAR, LLAMA_ROPE_YARN, LLAMA_ROPE_LLAMA3 } llama_rope_scaling;

typedef struct {
    int n_layers, dim, ffn, n_heads, n_kv_heads, head_dim, rot_dim, vocab, ctx;
    float rope_base, norm_eps;
    llama_arch arch;
    bool rope_neox; /* RoPE rotates pairs (i, i + rot_dim / 2) (qwen2, qwen3), else (2i, 2i + 1) */
    llama_rope_scaling rope_scaling;
    float rope_factor;   /* linear, yarn: rope.scaling.factor (positions are divided by it) */
    float yarn_attn;     /* yarn: rope.scaling.attn_factor (1) */
    int yarn_orig_ctx;   /* yarn: rope.scaling.original_context_length */
} llama_config;

typedef struct {
    const float *attn_norm, *ffn_norm;
    kmat wq, wk, wv, wo, w_gate, w_up, w_down;
    /* optional: q/k/v and output biases (attn_*.bias; qwen2 has q/k/v), per-head q and k RMS norm
     * weights of head_dim (attn_q_norm, attn_k_norm; qwen3); NULL when absent */
    const float *bq, *bk, *bv, *bo, *q_norm, *k_norm;
} llama_layer;

typedef struct {
    llama_config cfg;
    gguf_file *file; /* owns the mapping every weight points into */
    kmat tok_embd, lm_head;
    const float *out_norm;
    const float *rope_factors; /* rope_freqs.weight (rot_dim / 2; Llama 3.1-3.3), NULL if absent */
    llama_layer *layers;
    int tied; /* lm_head is the embedding matrix */
    /* every matrix's packed rows, in step order: the shared cache file's mapping, or this
     * process's memory (model/packcache.h) */
    packcache_block pack;
    /* the file's content identity when loaded (packcache_identity; 0: unknown): processes of a
     * group compare theirs with the coordinator's */
    uint64_t identity;
    /* a cheaper copy of the lm_head for contexts with screen_top (llama_model_screen_head);
     * type 0 rows 0: none */
    kmat lm_screen;
    void *screen_data;
} llama_model;

/* Load a llama GGUF. On failure NULL and one line in err naming the file and what is wrong
 * (missing key or tensor, wrong shape, unsupported tensor type). */
llama_model *llama_model_load(const char *path, char *err, size_t errlen);
/* llama_model_load without the CPU's repacked copy of the matrices: for a process whose forward
 * runs on a GPU (it copies the file's rows to the device), so that its host memory holds no second
 * copy of the weights. A CPU matmul over such a model still computes the same bits, packing a group
 * at a time on the fly (slower). */
llama_model *llama_model_load_unpacked(const char *path, char *err, size_t errlen);
void llama_model_destroy(llama_model **model);
/* Keep only the listed layers, in that order (self-speculation: the target with layers skipped).
 * Returns 0, or -1 with err for an index out of range or an empty list. */
int llama_model_keep_layers(llama_model *m, const int *layers, int n, char *err, size_t errlen);
/* The shape of a llama GGUF without loading its weights (what llama_model_load would check).
 * Returns 0, or -1 with err. */
int llama_read_config(const char *path, llama_config *c, char *err, size_t errlen);
/* Same layer count and attention shape (so one's K/V rows can stand for the other's). */
bool llama_config_same_kv(const llama_config *a, const llama_config *b);
/* Give the model a screening copy of its lm_head in `type` (Q4_0 or Q4_1): a context created with
 * screen_top K computes every logit with it — fewer bytes per token — and then recomputes the K
 * best of each row with the exact lm_head, so a drafter's best candidates keep the exact head's
 * order unless the exact best is not among the screen's K best. Returns 0, or -1 with err. */
int llama_model_screen_head(llama_model *m, uint32_t type, char *err, size_t errlen);
/* The activation precision of every quantized matrix of the model (kmat.act_bits): 16 or 8 bits,
 * or LLAMA_ACT_AUTO (the default of every command): 8 for the K family (Q2_K..Q6_K, the types of
 * the K-quant files users run at real sizes, which llama.cpp also multiplies against 8-bit
 * activations) and 16 for the legacy and float types. 8 halves the integer work of batches,
 * verification steps and prompts at a larger rounding error (docs/performance.md, "8-bit
 * activations"); every width computes each token the same way under any setting, so speculative
 * output still equals sequential output of the same setting. Returns 0, or -1 with err for
 * another value. */
#define LLAMA_ACT_AUTO 0
int llama_model_set_act_bits(llama_model *m, int bits, char *err, size_t errlen);
/* "8", "16" or "auto" (LLAMA_ACT_AUTO) -> the value llama_model_set_act_bits takes; -1 otherwise. */
int llama_act_bits_parse(const char *s);
/* The name of a precision: "8", "16" or "auto". */
const char *llama_act_bits_name(int bits);
/* Bytes of weights a step reads: every layer matrix plus the lm_head. */
size_t llama_model_step_bytes(const llama_model *m);
/* Multiply-adds per token of a step (matmuls only, no attention). */
double llama_model_step_macs(const llama_model *m);

/* The state the parts of a column-split forward share: the KV cache (per layer K then V, each
 * head-major: per KV head, n_seq * n_ctx prefix rows then max_width tree rows of head_dim
 * elements) and the activations a part
 * reads from others. One contiguous block; llama_shared_layout gives its size and offsets, so the
 * block can be a region of the shared-memory arena. */
typedef struct {
    size_t kv_off, x_off, q_off, att_off, xb2_off, hg_off, hu_off, kk_off, vv_off, ap_off, mp_off,
        epoch_off, lend_off;
    size_t layer_kv_bytes; /* bytes of one layer's K (or V) rows */
    /* bound pointers (llama_shared_bind) */
    void *base;
    uint8_t *kv;
    float *x, *q, *att, *xb2, *hg, *hu, *kk, *vv;
    /* attention partials of heads whose dense and sparse parts are computed by different parts:
     * per token and query head, the dense then the sparse partial (head_dim outputs, then max and
     * sum) */
    float *ap;
    /* the Megatron plan's partial sums: per part, max_width rows of dim */
    float *mp;
    /* per sequence slot, a counter bumped whenever the slot's committed rows change other than by
     * growing (the length set lower, a reset, a copied prefix): a process that keeps its own copy
     * of committed rows (a GPU worker's device mirror) knows from it when to read them again */
    uint32_t *epoch;
    /* per sequence slot, the rows another slot lends it (llama_kv_share_prefix): lend[2 s] the
     * lending slot, lend[2 s + 1] how many of slot s's first rows are read from there instead of
     * from its own (0: none). Every process that attends reads it here. */
    int32_t *lend;
} llama_shared;

/* Bytes of the shared block for this shape (n_seq sequence slots of n_ctx prefix rows each, then
 * one tree area of max_width rows); fills offsets when not NULL. */
size_t llama_shared_layout(const llama_config *c, int n_ctx, int max_width, int n_seq, kv_type kv,
                           llama_shared *offsets);
void llama_shared_bind(llama_shared *sh, void *base, const llama_config *c, int n_ctx,
                       int max_width, int n_seq, kv_type kv);

/* A partition plan: how the parts of a column split share each kind of a step's work. For each
 * kind, part i takes the share frac[kind][i] of its units (the shares are normalised, so any
 * non-negative weights with a positive sum do), as one contiguous range in part order; the
 * range boundaries are the rounded cumulative shares, in whole units of:
 *   LP_QKV        the q projection by query heads and the k/v projections by KV heads (RoPE
 *                 and the K/V store go with them; a part's KV heads are also the ones it commits);
 *   LP_WO, LP_FFN_DOWN  output rows of dim, in blocks of LLAMA_PART_BLOCK (and the embedding
 *                 columns follow LP_WO);
 *   LP_FFN_UP     gate/up rows of ffn, in blocks of LLAMA_PART_BLOCK;
 *   LP_LM_HEAD    vocabulary rows, in blocks of LLAMA_PART_BLOCK;
 *   LP_ATT_DENSE  query heads whose attention over the committed prefix (the dense part) the part
 *                 computes;
 *   LP_ATT_SPARSE query heads whose attention over their tree ancestors (the sparse part) the
 *                 part computes.
 * A head whose dense and sparse parts fall to one part is computed in one causal pass; one whose
 * parts differ is computed as two partials that are merged by online softmax (katt_merge) before
 * the output projection, which changes the rounding of that head (not bit-identical to one pass;
 * the same tokens in practice). A part may get nothing of a kind. There is no cap at the number
 * of KV heads: any number of parts up to LLAMA_MAX_PARTS. */
#define LLAMA_MAX_PARTS 16
#define LLAMA_PART_BLOCK 16
enum { LP_QKV, LP_WO, LP_FFN_UP, LP_FFN_DOWN, LP_LM_HEAD, LP_ATT_DENSE, LP_ATT_SPARSE, LP_N };
extern const char *const llama_part_kind_names[LP_N]; /* "qkv", "wo", ... (the plan's keys) */
/* How the two linears of a pair (q/k/v then wo; gate/up then down) are split. HCMP: both by
 * output rows, the parts exchanging the activations between them (attention's output, the FFN
 * hidden state) through the shared block. MEGATRON, the baseline: the first by output rows (query
 * heads with their KV heads; gate/up rows), the second by input columns — each part multiplies its
 * own slice of the activations, giving a partial sum of the whole output that the parts then
 * reduce through the shared block (LP_WO and LP_FFN_DOWN give who reduces which output columns);
 * attention stays with the q/k/v heads (the attention kinds are not used). */
enum { LP_STYLE_HCMP = 0, LP_STYLE_MEGATRON = 1 };
typedef struct {
    int n_parts;
    int style;
    float frac[LP_N][LLAMA_MAX_PARTS];
} llama_partition;

/* An even plan of n parts (every share 1/n). */
void llama_partition_even(llama_partition *p, int n_parts);
/* Check a plan: 1..LLAMA_MAX_PARTS parts, every share finite and >= 0, a positive sum per kind.
 * Returns 0, or -1 with err naming the kind and part. */
int llama_partition_check(const llama_partition *p, char *err, size_t errlen);

/* The plan as a flat list of LP_N * n_parts shares, kind-major, and its style apart (the Welcome
 * and Reconfigure messages carry it so). pack returns the count written to out (LP_N * LLAMA_MAX_PARTS room);
 * unpack returns 0, or -1 with err for a count that is not LP_N * n_parts or a bad plan. */
size_t llama_partition_pack(const llama_partition *p, float *out);
int llama_partition_unpack(llama_partition *p, int n_parts, const float *shares, size_t n,
                           int style, char *err, size_t errlen);

typedef struct {
    int n_threads; /* 0: all online cores */
    int max_width; /* widest batch a forward takes (<= KMAT_MAX_W) */
    int n_ctx;     /* prefix capacity per sequence; 0: the model's context length */
    int n_seq;     /* sequence slots (batching of several requests); 0: 1 */
    kv_type kv;    /* KV cache element type */
    /* column split: this context computes part `part` of `n_parts`. Without a plan (NULL) the
     * split is even and needs n_parts <= n_kv_heads (each part its KV heads and their query
     * heads); with one, any shares and up to LLAMA_MAX_PARTS parts (plan->n_parts == n_parts).
     * Every part must be given the same plan. The plan is copied. */
    int part, n_parts;
    const llama_partition *plan;
    /* Without a plan: split the query heads evenly instead of the KV heads. A KV head whose query
     * heads fall to two parts is projected by both; the part that does not own it (the owner is
     * the part of its first query head) keeps that head's tree rows of K and V in private memory
     * and commits them to the shared prefix like the owner does (the same bytes). Attention is then
     * balanced — 5 and 4 query heads instead of 6 and 3 for 9 heads of 3 KV heads on 2 parts —
     * with no extra synchronisation and results bit-identical to one part; up to n_heads parts.
     * CPU contexts only (the GPU forward reads every tree row from the shared block); every part
     * must be given the same setting. */
    bool kv_dup;
    void *shared; /* the shared block (llama_shared_layout bytes), or NULL to allocate one */
    /* called at each synchronisation point when n_parts > 1; returns 0, or -1 if a peer is lost */
    int (*sync)(void *arg);
    void *sync_arg;
    /* Read the committed prefix from another context's KV cache instead of this one's (a drafter
     * that is a re-quantized copy of the target attends to the target's K/V in the arena: no
     * prefill, no commits of its own). NULL: this context's own prefix rows. The source must have
     * this model's layer count and KV shape and this context's kv type; the sequence slot read is
     * set by llama_ctx_map_prefix_source. llama_commit and llama_prefill are refused. */
    const llama_shared *prefix_src;
    int prefix_src_n_ctx, prefix_src_max_width, prefix_src_n_seq; /* the source's layout */
    /* > 0 with a model that has a screening head (llama_model_screen_head): logits come from it,
     * the screen_top best of each row recomputed with the exact lm_head (a drafter's logits: the
     * rest stay approximate). One part only. */
    int screen_top;
} llama_ctx_params;

typedef struct llama_ctx llama_ctx;

llama_ctx *llama_ctx_new(const llama_model *m, const llama_ctx_params *p, char *err, size_t errlen);
void llama_ctx_destroy(llama_ctx **ctx);
int llama_ctx_prefix_len(const llama_ctx *ctx);
int llama_ctx_threads(const llama_ctx *ctx);
/* The greedy choice among this part's columns of one logits row (k_argmax over them): the token
 * id, and its logit in *value. Parts merge theirs by the largest value, ties to the lower id. */
int32_t llama_ctx_part_argmax(const llama_ctx *ctx, const float *logits, float *value);
/* Swap the partition plan between steps (every part at the same step boundary; NULL: even).
 * The K/V cache stays where it is (it is laid out by head, not by part), so the next step simply
 * runs with the new ranges. Returns 0, or -1 with err (a bad plan, a part count that differs). */
int llama_ctx_set_partition(llama_ctx *ctx, const llama_partition *plan, char *err, size_t errlen);
/* This part's range [lo, hi) of a kind's units (query heads for LP_QKV and the attention kinds,
 * rows for the rest). */
void llama_ctx_part_range(const llama_ctx *ctx, int kind, int64_t *lo, int64_t *hi);
/* Synchronisation points per layer: 4 (after attention, after the wo residual, after gate/up,
 * after the down residual), or 5 when the plan makes attention read another part's projections
 * (one more after the q/k/v projections). The embeddings add one before the first layer. */
int llama_ctx_syncs_per_layer(const llama_ctx *ctx);
/* Set the committed length (a worker learns it from the coordinator each step). Without a
 * sequence argument: slot 0. */
void llama_ctx_set_prefix_len(llama_ctx *ctx, int n);
int llama_ctx_seq_prefix_len(const llama_ctx *ctx, int seq);
/* Copy the K/V rows of positions [0, n) of sequence slot src (where they lie: its own rows or
 * the ones it borrows) to slot dst's own rows (every layer, the KV heads this context owns; dst
 * borrows nothing after it) and make n dst's committed length: a prompt that begins with tokens
 * another slot has already committed starts from them (a position's K/V depend only on the
 * tokens up to it, so the rows are the ones a prefill would compute, bit for bit). src == dst
 * only sets the length (and borrows at most n rows). Returns 0, or -1 with err for a slot or length out of range or a context
 * that reads its prefix from another (prefix_src). */
int llama_kv_copy_prefix(llama_ctx *ctx, int src, int dst, int n, char *err, size_t errlen);
/* Make slot dst's first n rows those of slot src, read in place: dst borrows them (the lend
 * table of the shared block, which every process's attention reads), so a common beginning is
 * held once however many slots start with it. Where src itself borrows its first p rows, dst
 * borrows min(n, p) from the same lender and the rows [p, n) are copied from src's own; n is
 * dst's committed length. The lender's rows [0, n) must stay as they are while dst borrows them:
 * before a slot's own rows below a borrower's count are written again, llama_kv_unshare that
 * borrower. Returns 0, or -1 with err (slots or n out of range, a context with a prefix source). */
int llama_kv_share_prefix(llama_ctx *ctx, int src, int dst, int n, char *err, size_t errlen);
/* How many of slot seq's first rows it borrows, and from which slot (*from, may be NULL). */
int llama_kv_lent(const llama_ctx *ctx, int seq, int *from);
/* Slot seq stops borrowing from row `keep` on (keep 0: borrows nothing), so it no longer needs
 * the lender's rows past keep: with `copy` the rows [keep, n) it borrowed are copied into its own
 * first; without, its caller forgets them (its own rows there hold nothing of its sequence). */
void llama_kv_unshare(llama_ctx *ctx, int seq, int keep, bool copy);
/* Gives the memory of slot seq's rows [from, n_ctx) back to the system: the whole pages they
 * span in every K/V region of the heads this context owns are removed from the shared block's
 * file (madvise MADV_REMOVE; they read as zeros, and take memory again when written). The slot's
 * committed length, and the rows it borrows, drop to at most `from`. Returns the bytes given back; 0 where the block is
 * not a shared file (a private block keeps its pages) or nothing whole lay in the range. */
size_t llama_kv_release(llama_ctx *ctx, int seq, int from);
void llama_ctx_set_seq_prefix_len(llama_ctx *ctx, int seq, int n);
const llama_shared *llama_ctx_shared(const llama_ctx *ctx);
/* Which sequence slot of params.prefix_src the prefix of this context's slot `seq` is read from
 * (ignored without a source, or for a slot out of range); by default slot s reads slot s (0 where
 * the source has fewer). A drafter that drafts for several requests in one batch gives each its
 * own slot here, mapped to the target's slot of that request. */
void llama_ctx_map_prefix_source(llama_ctx *ctx, int seq, int src);
/* The same for slot 0. */
void llama_ctx_set_prefix_source_seq(llama_ctx *ctx, int seq);
/* Forget the committed prefix. */
void llama_ctx_reset(llama_ctx *ctx);

/* A batch of tokens forming a token tree — or, with `append`, growing the current one.
 *
 * Tree indices: a fresh batch's token i is tree index i. An appended batch's token i is tree index
 * T + i, T being the tree's size before it (the tokens of every batch since the last fresh one), so
 * a parent may be a token of an earlier batch; the appended tokens attend to the prefix and to
 * their ancestors, whose K/V stay in the tree area. Growing a tree by appends gives bit-identical
 * logits to one forward over the whole tree (a drafter pays each node once, not once per round).
 * Appending is refused once the tree is closed: by llama_commit, llama_ctx_reset, a change of a
 * prefix length, or a failed forward; and when the tree would exceed max_width tokens in all.
 * Every part of a column split must be given the same sequence of batches. */
typedef struct {
    int n; /* tokens in the batch, 1..max_width */
    const int32_t *tokens;
    const int32_t *parent; /* parent's tree index, -1 = child of the prefix; NULL = chain (the
                            * previous tree index, so an appended chain continues the last token) */
    const int32_t *pos;    /* positions; NULL = prefix length + depth in the tree */
    const int32_t *seq;    /* sequence slot per token (a tree stays in one slot); NULL = slot 0 */
    int logits_from;       /* compute logits only for tokens i >= logits_from (batch indices) */
    bool append;           /* grow the current tree instead of starting a new one */
} llama_batch;

/* Run the batch; logits (may be NULL) receives (n - logits_from) x vocab floats, row j holding
 * the logits of batch token logits_from + j (an appended batch: its own tokens only). Returns 0,
 * or -1 with a message in err (bad token id, parent, capacity). The tree's K/V stay in the tree
 * area until the next fresh batch. */
int llama_forward(llama_ctx *ctx, const llama_batch *b, float *logits, char *err, size_t errlen);
/* Validate a batch and derive its ancestor lists and positions without running it (a process
 * that commits a step other processes computed calls this first). */
int llama_ctx_set_batch(llama_ctx *ctx, const llama_batch *b, char *err, size_t errlen);
/* Move the K/V of tree tokens path[0..n) (tree indices of a root-to-node path, in order, all of
 * one sequence) into that sequence's prefix. Several paths (of different sequences) may be
 * committed from one tree; the tree can no longer be appended to. */
int llama_commit(llama_ctx *ctx, const int32_t *path, int n, char *err, size_t errlen);

/* Keep one root-to-node path of the current tree as the whole tree: path[0..n) are tree indices,
 * path[0] a root (a child of the prefix) and each next one a child of the one before. The rows of
 * path[drop..n) move to tree indices 0..n-drop, the prefix length of their sequence grows by
 * `drop` (the first `drop` tokens of the path are now committed where the prefix is read: a
 * drafter whose prefix is the target's, once the target has committed them), and the tree is
 * that chain, open for appends. A drafter working ahead keeps its main branch this way, and the
 * rest of a chain the target confirmed. Returns 0, or -1 with err (not a path, no tree). */
int llama_tree_keep_path(llama_ctx *ctx, const int32_t *path, int n, int drop, char *err,
                         size_t errlen);

/* Convenience: feed ids as chains of up to max_width tokens, committing each; logits of the last
 * token go to last_logits (may be NULL). */
int llama_prefill(llama_ctx *ctx, const int32_t *ids, int n, float *last_logits, char *err,
                  size_t errlen);

/* ===== sampling ===== */

typedef struct {
    float temp;  /* 0 = greedy */
    int top_k;   /* 0 = off */
    float top_p; /* 1 = off */
    uint64_t rng;
} sampler;

void sampler_init(sampler *s, float temp, int top_k, float top_p, uint64_t seed);
/* Greedy: the lowest index among the maxima. Otherwise a draw from the tempered, truncated
 * distribution; `work` must hold 2 * n floats' worth of scratch (n ints + n floats). */
int32_t sampler_sample(sampler *s, const float *logits, int n, void *work);
int32_t sampler_argmax(const float *logits, int n);
/* The distribution sampler_sample draws from, as a dense vector: probs[0..n) holds the tempered,
 * top-k then top-p truncated probabilities (summing to 1 over the support, 0 elsewhere); greedy
 * (temp <= 0) gives a one-hot at the argmax. `work` as for sampler_sample. Uses no randomness.
 * Returns the support size. */
int sampler_probs(const sampler *s, const float *logits, int n, float *probs, void *work);
/* A draw from an explicit non-negative vector (normalised or not) by inverse CDF in id order, with
 * the sampler's generator; -1 when it has no positive entry. */
int32_t sampler_draw(sampler *s, const float *probs, int n);
/* A uniform double in [0, 1) (53 bits) from the sampler's generator. */
double sampler_uniform(sampler *s);

#endif
