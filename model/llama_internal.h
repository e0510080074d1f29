/*
 * model/llama_internal.h — the inside of a llama_ctx, for the files that run its forward pass:
 * model/llama.c (the CPU) and model/llama_cuda.c (the GPU worker's). Not an interface: nothing
 * else includes it.
 */
#ifndef OROCHI_LLAMA_INTERNAL_H
#define OROCHI_LLAMA_INTERNAL_H

#include "model/llama.h"

/* What a part does for one query head's attention: both key sets in one causal pass, or only
 * the prefix (dense) or only the tree ancestors (sparse), leaving a partial for the merge. */
enum { ATT_FULL, ATT_DENSE, ATT_SPARSE };
struct att_unit {
    int h0, nh, kvh, mode; /* query heads [h0, h0 + nh), all of KV head kvh */
};

struct llama_ctx {
    const llama_model *m;
    llama_ctx_params p;
    kpool *pool;
    int *prefix;      /* committed length of each sequence slot */
    int64_t tree_row; /* first tree-area row: after n_seq * n_ctx prefix rows */
    size_t kv_elem;   /* bytes per KV element */
    int64_t kv_row;   /* elements per position: n_kv_heads * head_dim */
    llama_shared sh;  /* KV cache and shared activations (owned or external) */
    void *owned_shared;
    /* the partition: each kind's range boundaries for every part (bnd[kind][0..n_parts]: part i
     * takes [bnd[i], bnd[i + 1])), in query heads for LP_QKV and the attention kinds; kvb the KV
     * heads of LP_QKV */
    int64_t bnd[LP_N][LLAMA_MAX_PARTS + 1], kvb[LLAMA_MAX_PARTS + 1];
    int kvh0, kvh1;    /* the KV heads this part projects and attends with [kvh0, kvh1) */
    int own0, own1;    /* the ones among them whose shared rows it writes (= kvh0, kvh1 unless
                          params.kv_dup split a KV head's query heads between parts) */
    uint8_t *priv_tree; /* kv_dup: tree rows of the heads it projects but does not own, per layer,
                           K then V, per head of [kvh0, kvh1), max_width rows (owned) */
    size_t priv_bytes;
    bool kv_private; /* the current partition uses kvp */
    float *kvp; /* kv_dup: this part's K and V projections (max_width x kv_row each), private:
                   two parts projecting one KV head must not rotate it in place in one buffer */
    bool att_sync;     /* a synchronisation point between the projections and attention */
    bool megatron;     /* the second linear of each pair by input columns (LP_STYLE_MEGATRON) */
    float *xs;         /* Megatron: this part's slice of a linear's input, contiguous */
    int *split_heads;  /* heads whose dense and sparse parts are computed by different parts */
    int n_split;
    struct att_unit *units, *singles; /* this part's attention work, by KV head and one by one */
    int n_units, n_singles;
    float *attp;       /* the output projection's input once split heads are merged */
    /* private */
    float *xb;    /* normed x (every part computes it for all tokens) */
    float *row;   /* one embedding row */
    int32_t *anc; /* max_width x max_width ancestor lists */
    int32_t *n_anc;
    int32_t *pos; /* positions of the tree's tokens */
    double *rope_inv;        /* RoPE inverse frequencies (rot_dim / 2), scaled (llama_rope_inv) */
    double rope_mscale;      /* YaRN: cos and sin scaled by this (1 otherwise) */
    float *rope_cs, *rope_sn; /* their cos and sin at each batch token's position (W x rot_dim / 2) */
    int32_t *seq; /* sequence slot of each tree token */
    int batch_n;  /* tokens of the tree the lists describe (all batches since the last fresh one) */
    int batch_base; /* tree slot of the running batch's first token (> 0 for an appended batch) */
    bool tree_open; /* the tree may be appended to: the prefix has not moved since it started */
    int *src_of;    /* per sequence slot: the slot of params.prefix_src its prefix is read from */
    void *scratch;  /* matmul scratch */
};

/* The model's RoPE inverse frequencies (rot_dim / 2) into inv, with its scaling applied (Llama
 * 3.1's per-pair factors, linear, YaRN); returns the magnitude cos and sin are scaled by (YaRN's,
 * else 1). */
double llama_rope_inv(const llama_model *m, double *inv);
/* cos and sin of each RoPE pair at position pos, as every backend rotates with them. */
void llama_rope_angles(const llama_ctx *x, int pos, float *cs, float *sn);

/* Validate a batch and build its ancestor lists, positions and sequence slots (llama_forward's
 * first step, for any backend). */
int llama_batch_prepare(llama_ctx *x, const llama_batch *b, char *err, size_t errlen);

/* This part's ranges in one step, in elements: rows of wo (d), down (e), gate/up (f), the lm_head
 * (v); columns of q (q, query heads x head_dim) and of k/v (k, its KV heads x head_dim). */
typedef struct {
    int64_t d0, d1, e0, e1, f0, f1, q0, q1, k0, k1, v0, v1;
} llama_part_cols;
void llama_part_cols_of(const llama_ctx *x, llama_part_cols *r);

/* Byte offset of KV head kvh's row p within one layer's K (or V) block (head-major: per KV head,
 * the n_seq * n_ctx prefix rows, then the max_width tree rows). */
static inline size_t llama_kv_offset(const llama_ctx *x, int kvh, int64_t p)
{
    int64_t rows = x->tree_row + x->p.max_width;
    return ((size_t)kvh * (size_t)rows + (size_t)p) * (size_t)x->m->cfg.head_dim * x->kv_elem;
}

/* Meet the other parts at a synchronisation point (the sync callback): 0, or -1 with err when a
 * peer was lost (the tree can then no longer grow). */
int llama_part_sync(llama_ctx *x, char *err, size_t errlen);

#endif
