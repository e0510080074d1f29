/*
 * kernels/cpu — the CPU op set of orochi.
 *
 * Everything the Llama forward needs, written for a memory-bound machine:
 *   - tensor types (ggml block layouts) and their traits: block size, bytes per block;
 *   - a batched matmul y[t][r] = W[r] . x[t] for W = 1..64 tokens over an output-row range
 *     [lo, hi), which streams every weight block from memory once for all tokens (quantized
 *     matrices repacked once into 16-row groups, one SIMD lane per row);
 *   - rmsnorm, rope, silu*mul, softmax;
 *   - attention as partials: (max, sum, output) per query-head over a dense prefix and over a
 *     sparse (COO) tree part, and the online-softmax merge of partials;
 *   - a pthread pool that runs a function over [0, n) in chunks.
 * Every kernel has a portable scalar path. The matmul micro-kernels exist for AVX-512 (VNNI),
 * AVX2 and plain C in one binary and are chosen at run time from cpuid (kisa_*); the other ops
 * use AVX2+FMA (x86-64) or NEON (arm64), chosen at compile time.
 */
#ifndef OROCHI_KERNELS_H
#define OROCHI_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus /* the GPU op set's sources (C++) call the type helpers */
extern "C" {
#endif

/* ===== tensor types (ggml numbering, as stored in GGUF) ===== */

typedef enum {
    KT_F32 = 0,
    KT_F16 = 1,
    KT_Q4_0 = 2,
    KT_Q4_1 = 3,
    KT_Q5_0 = 6,
    KT_Q5_1 = 7,
    KT_Q8_0 = 8,
    KT_Q2_K = 10,
    KT_Q3_K = 11,
    KT_Q4_K = 12,
    KT_Q5_K = 13,
    KT_Q6_K = 14,
    KT_IQ4_NL = 20,
    KT_BF16 = 30,
} kt_type;

#define KT_QBLOCK 32 /* elements per block of the legacy quantized types */
#define KT_KBLOCK 256 /* elements per super-block of the K-quants */

typedef struct {
    const char *name;
    int block;          /* elements per block */
    int block_bytes;    /* bytes per block */
    bool supported;     /* orochi has kernels for it */
} kt_traits;

/* The types orochi computes with, as a list for messages. */
#define KT_SUPPORTED_LIST                                                                          \
    "F32, F16, BF16, Q8_0, Q6_K, Q5_K, Q5_1, Q5_0, Q4_K, Q4_1, Q4_0, IQ4_NL, Q3_K, Q2_K"

/* Traits of ggml type id `type`; name is "type<N>" style and supported=false for ids orochi does
 * not implement, NULL for ids that are not ggml types at all. */
const kt_traits *kt_traits_of(uint32_t type);
/* Bytes of a row of n elements; 0 if n is not a multiple of the block size. */
size_t kt_row_bytes(uint32_t type, uint64_t n);

float kt_f16_to_f32(uint16_t h);
uint16_t kt_f32_to_f16(float f);
float kt_bf16_to_f32(uint16_t h);
uint16_t kt_f32_to_bf16(float f);

/* Quantize n floats (n a multiple of the type's block) into `type` blocks: every type with
 * supported = true. */
void kt_quantize_row(uint32_t type, const float *x, void *out, int64_t n);
/* Check the block scales of one row of n elements of `type` (quantized types: every f16 scale
 * and min must be finite). -1 when the row is sound; else the index of the first bad block, with
 * a short reason ("d = inf") in why. */
int64_t kt_check_row(uint32_t type, const void *row, int64_t n, char *why, size_t whylen);
/* kt_check_row over every row of a rows x cols matrix (row_bytes apart): 0 when sound, else -1
 * with "row R block B: d = inf" in why. */
int kt_check_matrix(uint32_t type, const void *data, int64_t rows, int64_t cols, size_t row_bytes,
                    char *why, size_t whylen);
/* Expand one row of n elements to floats. */
void kt_dequantize_row(uint32_t type, const void *row, float *out, int64_t n);

/* ===== thread pool ===== */

typedef struct kpool kpool;
/* fn(arg, begin, end, thread_index): run over a chunk [begin, end). */
typedef void (*kpool_fn)(void *arg, int64_t begin, int64_t end, int thread);

kpool *kpool_new(int n_threads);
void kpool_destroy(kpool **pool);
int kpool_threads(const kpool *pool);
/* Split [0, n) into chunks of at least `grain` items and run them on all threads; returns when
 * every chunk is done. With pool == NULL it runs inline on the caller. */
void kpool_run(kpool *pool, int64_t n, int64_t grain, kpool_fn fn, void *arg);

/* ===== matmul ===== */

/* A weight matrix as stored in GGUF: `rows` output features, each `cols` input elements long,
 * row r at data + r * row_bytes. */
typedef struct {
    uint32_t type;
    int64_t rows, cols;
    size_t row_bytes;
    const void *data;
    void *packed; /* the 16-row group layout (kmat_pack / kmat_pack_into), NULL until packed */
    bool packed_borrowed; /* packed lies in memory someone else owns (kmat_pack_into) */
    /* Quantized types: the precision the activations are quantized to, 16 (also 0, the default)
     * or 8 bits per element (KMAT_ACT8: half the integer dot products, so batches and prompts run
     * up to twice as fast, at a larger rounding error; see kmat_mul). Float types ignore it. */
    uint8_t act_bits;
} kmat;

#define KMAT_ACT8 8
#define KMAT_ACT16 16

/* ===== instruction sets of the matmul ===== */

typedef enum { KISA_PORTABLE = 0, KISA_AVX2 = 1, KISA_AVX512 = 2 } kisa;

const char *kisa_name(kisa i);
/* Whether this CPU (and build) can run the set: AVX2 needs AVX2+FMA+F16C, AVX512 needs
 * AVX-512 F/BW/VL and VNNI. */
bool kisa_supported(kisa i);
kisa kisa_best(void);
/* The set in use: the best supported one, or a lesser one named by OROCHI_ISA
 * (portable|avx2|avx512) in the environment. */
kisa kisa_current(void);
/* Use set i from now on (tests, benchmarks); -1 if the CPU cannot run it. Not to be called while
 * a matmul runs. Results of quantized types are bit-identical across sets; float types may differ
 * in the last bits (different reduction widths). */
int kisa_select(kisa i);

/* Repack a matrix (F32/F16/BF16, or Q8_0/Q4_0/Q4_1 with cols % 32 == 0) into w->packed, the
 * layout the micro-kernels stream. 0, or -1 when out of memory. Matrices that are not packed still
 * multiply correctly, packing a group at a time on the fly. */
int kmat_pack(kpool *pool, kmat *w);
/* Pack into dst (kmat_packed_bytes(w) bytes, 64-byte aligned, owned by the caller): a model packs
 * all its matrices into one block in the order a step reads them. */
void kmat_pack_into(kpool *pool, kmat *w, void *dst);
/* Use the packed rows at packed (kmat_packed_bytes(w) bytes, read-only, owned by the caller: a
 * model's shared cache mapping) without packing. */
void kmat_set_packed(kmat *w, const void *packed);
/* Free w->packed (unless borrowed) and forget it. */
void kmat_unpack(kmat *w);
/* Bytes kmat_pack allocates for w (0 for types it does not pack). */
size_t kmat_packed_bytes(const kmat *w);

#define KMAT_MAX_W 64 /* widest token batch a matmul takes */

/* y[t * ldy + r] = sum_k W[r][k] * x[t * cols + k] for t < n_tok, lo <= r < hi.
 * Each output row is computed the same way whatever [lo, hi) and the thread count are, so shards
 * concatenate bit-identically. Quantized weights use 16-bit activations (blocks of 32), or 8-bit
 * ones when w->act_bits is KMAT_ACT8; either way each token's row is computed the same whatever
 * the other tokens of the call are, so a batch or a verification step gives exactly what one
 * token at a time gives. The scratch must hold kmat_scratch_bytes(cols, n_tok, kpool_threads(pool)) bytes; NULL allocates
 * one per call. */
void kmat_mul(kpool *pool, const kmat *w, int64_t lo, int64_t hi, const float *x, int n_tok,
              float *y, int64_t ldy, void *scratch);
size_t kmat_scratch_bytes(int64_t cols, int n_tok, int n_threads);
/* Several matrices over the same input in one job (q/k/v, gate/up): the activations are quantized
 * once and the pool is dispatched once. Each matrix's rows are computed exactly as kmat_mul would.
 * Matrices of different row lengths, of float and quantized types mixed, or of different act_bits
 * run one by one. */
void kmat_mul_n(kpool *pool, int n, const kmat *const *w, const int64_t *lo, const int64_t *hi,
                const float *x, int n_tok, float *const *y, const int64_t *ldy, void *scratch);
/* kmat_mul over input columns [c0, c1) only: y[t][r] = W[r][c0:c1] . x[t] for rows [lo, hi),
 * x holding n_tok rows of c1 - c0 values (a partial sum: the Megatron-style row split of the
 * second linear of a pair). c0 and c1 must be multiples of the type's block (32; 256 for the K
 * family). Each block is computed as kmat_mul computes it. Returns 0, or -1 for a misaligned or
 * empty column range. scratch: kmat_scratch_bytes(c1 - c0, ...) or NULL. */
int kmat_mul_cols(kpool *pool, const kmat *w, int64_t lo, int64_t hi, int64_t c0, int64_t c1,
                  const float *x, int n_tok, float *y, int64_t ldy, void *scratch);
/* Copy row r of w into out as floats (the embedding lookup). */
void kmat_row(const kmat *w, int64_t r, float *out);

/* ===== elementwise ===== */

void k_rmsnorm(float *out, const float *x, const float *weight, int n, float eps);
/* RoPE: rotate pairs (x[2i], x[2i+1]) of each of n_heads heads of size head_dim by
 * pos * base^(-2i/d), d = rot_dim (<= head_dim; dimensions past rot_dim are untouched), in three
 * parts, since a forward pass rotates many heads of many layers at the same positions: the
 * inverse frequencies base^(-2i/rot_dim) in double (rot_dim / 2 of them, once per model), the
 * float cos/sin of pos times them (once per token and step; half = rot_dim / 2), and the
 * rotation itself. */
void k_rope_freqs(double *inv, int rot_dim, float base);
void k_rope_angles(float *cs, float *sn, const double *inv, int half, int pos);
void k_rope_apply(float *x, int n_heads, int head_dim, int half, const float *cs, const float *sn);
/* k_rope_apply in the NEOX layout (qwen2, qwen3): pairs (i, i + half) of each head. */
void k_rope_apply_neox(float *x, int n_heads, int head_dim, int half, const float *cs,
                       const float *sn);
void k_silu_mul(float *gate, const float *up, int n); /* gate = silu(gate) * up */
void k_softmax(float *x, int n);
/* sum of e^(x[i] - mx) over n values (vectorised; mx at least the largest x keeps it finite) */
float k_sum_exp(const float *x, int n, float mx);
/* The k largest of x[0..n) in one pass: their indices into ids, largest first, ties to the lower
 * index (so the first k of a larger selection are the k best); NaNs never enter. Returns how many:
 * k, or fewer when x has fewer values that are not NaN. */
int k_top(const float *x, int n, int k, int32_t *ids);
/* The index of x's largest value, the lowest such index on ties; NaNs are never taken (0 when
 * every value is NaN or n is 0). The greedy choice everywhere (sampler_argmax, the workers'
 * free-running decode), so every process picks the same token from the same row. */
int32_t k_argmax(const float *x, int n);
float k_dot(const float *a, const float *b, int n);

/* ===== attention partials ===== */

/* A partial softmax-attention result of one query-head: the running max of scores, the sum of
 * exp(score - max), and the unnormalised output sum exp(score - max) * v. */
typedef struct {
    float max;
    float sum;
} katt_stat;

/* KV storage element type. */
typedef enum { KV_F32 = 0, KV_F16 = 1 } kv_type;

/* Keys/values of one KV head: position p at base + p * stride (elements of kv_type). */
typedef struct {
    kv_type type;
    const void *k, *v;
    int64_t stride; /* elements between consecutive positions */
} katt_kv;

/* Dense part: query q (head_dim) against positions [0, n) of kv. Writes stat and out (head_dim).
 * n == 0 gives max = -inf, sum = 0, out = 0. */
void katt_dense(const float *q, const katt_kv *kv, int n, int head_dim, float scale,
                katt_stat *stat, float *out);
/* Sparse part: query q against the listed positions idx[0..n) of kv (the query's ancestors in the
 * token tree, itself included). */
void katt_sparse(const float *q, const katt_kv *kv, const int32_t *idx, int n, int head_dim,
                 float scale, katt_stat *stat, float *out);
/* Fold the listed positions into an existing partial (same arithmetic as one longer pass). */
void katt_extend(const float *q, const katt_kv *kv, const int32_t *idx, int n, int head_dim,
                 float scale, katt_stat *stat, float *out);
/* Merge partial b into a (online softmax): a becomes the partial over both key sets. */
void katt_merge(katt_stat *a, float *out_a, const katt_stat *b, const float *out_b, int head_dim);
/* The key stream of one KV head for a causal query: position j < n_prefix is prefix row j,
 * position j >= n_prefix is tree row tree_slot[j - n_prefix] (the query's ancestors, in order).
 * A prefix row j < n_lent is read from lent_k / lent_v (the rows another sequence lends this one:
 * the same positions of a prompt they share) instead of k / v; n_lent 0: none. */
typedef struct {
    kv_type type;
    const void *k, *v;           /* prefix rows */
    const void *lent_k, *lent_v; /* prefix rows below n_lent */
    int n_lent;
    const void *tree_k, *tree_v; /* tree rows */
    int64_t stride;              /* elements between consecutive rows */
    int n_prefix;
    const int32_t *tree_slot;
} katt_keys;

/* Attention of q over positions [0, n) of the stream, in chunks aligned to absolute positions:
 * the result for a query depends only on the keys' values and positions, never on where the
 * prefix ends — tree verification is bit-identical to sequential decoding. Leaves the partial in
 * st/out (call katt_finish). */
void katt_causal(const float *q, const katt_keys *s, int n, int head_dim, float scale,
                 katt_stat *st, float *out);
/* katt_causal for the nq query heads that share one KV head (grouped-query attention): query h at
 * q + h * q_stride, its partial in st[h] and out + h * out_stride. Each key and value row is
 * loaded (and converted) once for all of them; each head's result is bit-identical to katt_causal
 * on its own. */
void katt_causal_group(const float *q, int64_t q_stride, int nq, const katt_keys *s, int n,
                       int head_dim, float scale, katt_stat *st, float *out, int64_t out_stride);
/* katt_causal_group for n_tok tokens of one sequence: token t's nq query heads at q[t] +
 * h * q_stride, its key stream s[t] over n[t] positions (every s[t] with the same prefix rows and
 * n_prefix; each its own tree ancestors), its partials in st[t * nq + h] and out[t] +
 * h * out_stride. The whole chunks of the prefix that every token sees are loaded once for all
 * of them; each query's result is bit-identical to katt_causal_group on its own. */
void katt_causal_tokens(int n_tok, const float *const *q, int64_t q_stride, int nq,
                        const katt_keys *s, const int *n, int head_dim, float scale, katt_stat *st,
                        float *const *out, int64_t out_stride);
/* Finish: out /= sum. */
void katt_finish(const katt_stat *s, float *out, int head_dim);

#ifdef __cplusplus
}
#endif

#endif
