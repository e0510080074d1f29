/*
 * kernels/cuda/kcuda_check.h — the argument checks of the GPU op set (kcuda.h), shared by the CUDA
 * implementation and its CPU stand-in (kcuda_fake.c) so that both refuse the same inputs with the
 * same words. Plain C, included by .cu and .c files alike.
 */
#ifndef OROCHI_KCUDA_CHECK_H
#define OROCHI_KCUDA_CHECK_H

#include <stdbool.h>
#include <stdio.h>

#include "kernels/cuda/kcuda.h"

/* The weight types the GPU op set takes: every type the CPU computes (KT_SUPPORTED_LIST). */
static inline bool kcuda_type_ok(uint32_t t)
{
    const kt_traits *tr = kt_traits_of(t);
    return tr && tr->supported;
}

/* The columns a quantized type's block holds (32, or 256 for the K-quants); 1 for a float type. */
static inline int64_t kcuda_type_block(uint32_t t)
{
    if (t == KT_F32 || t == KT_F16 || t == KT_BF16)
        return 1;
    const kt_traits *tr = kt_traits_of(t);
    return tr ? tr->block : 1;
}

/* The alignment the kernels need of a type's rows: 16 for Q4_K's and Q5_K's super-blocks (144
 * and 176 bytes, read by 16-byte words: their d, dmin and scales in one load); the others are
 * read by words their blocks' own sizes allow (kcuda_group), which any GGUF row start keeps. */
static inline size_t kcuda_type_align(uint32_t type)
{
    return type == KT_Q4_K || type == KT_Q5_K ? 16 : 1;
}

/* Whether w's rows lie where the kernels can read them (kcuda_type_align). */
static inline bool kcuda_aligned(const kmat *w)
{
    size_t a = kcuda_type_align(w->type);
    return (uintptr_t)w->data % a == 0 && w->row_bytes % a == 0;
}

/* kcuda_matmul_cols's: a GPU type with columns on 32-blocks (256 for the K-quants); input columns
 * [c0, c1) inside the row, on the type's blocks for the quantized types (a float type takes any
 * range); its rows where the kernels can read them (kcuda_aligned). */
static inline int kcuda_check_matmul(const kmat *w, int64_t c0, int64_t c1, char *err,
                                     size_t errlen)
{
    int64_t blk = kcuda_type_block(w->type), need = blk > 32 ? blk : 32;
    if (!kcuda_type_ok(w->type) || w->cols % need) {
        const kt_traits *tr = kt_traits_of(w->type);
        snprintf(err, errlen,
                 "matmul of %s, %lld columns: the GPU takes " KT_SUPPORTED_LIST
                 " with columns a multiple of 32 (256 for the K-quants)",
                 tr ? tr->name : "an unknown type", (long long)w->cols);
        return -1;
    }
    if (c0 < 0 || c1 > w->cols || c1 <= c0 || c0 % blk || c1 % blk) {
        snprintf(err, errlen, "matmul over input columns [%lld, %lld) of %lld: %s",
                 (long long)c0, (long long)c1, (long long)w->cols,
                 c1 <= c0 || c0 < 0 || c1 > w->cols ? "out of range" : "not on the type's blocks");
        return -1;
    }
    if (!kcuda_aligned(w)) {
        snprintf(err, errlen, "matmul of %s rows at %p (%zu bytes a row): the GPU reads them by "
                 "%zu-byte words", kt_traits_of(w->type)->name, w->data, (size_t)w->row_bytes,
                 kcuda_type_align(w->type));
        return -1;
    }
    return 0;
}

/* Two matrices one fused launch multiplies with the same input: one type, one column count. */
static inline int kcuda_check_same(const kmat *a, const kmat *b, const char *what, char *err,
                                   size_t errlen)
{
    if (a->type == b->type && a->cols == b->cols)
        return 0;
    const kt_traits *ta = kt_traits_of(a->type), *tb = kt_traits_of(b->type);
    snprintf(err, errlen,
             "fused matmul of %s: %s and %s, %lld and %lld columns (one type and column count)",
             what, ta ? ta->name : "unknown", tb ? tb->name : "unknown", (long long)a->cols,
             (long long)b->cols);
    return -1;
}

/* kcuda_matmul_multi's: 1..KCUDA_MM_MAX matrices, each one kcuda_matmul takes, all alike. */
static inline int kcuda_check_multi(const kcuda_mm *mm, int count, char *err, size_t errlen)
{
    if (count < 1 || count > KCUDA_MM_MAX) {
        snprintf(err, errlen, "fused matmul of %d matrices (1 to %d)", count, KCUDA_MM_MAX);
        return -1;
    }
    for (int i = 0; i < count; i++)
        if (kcuda_check_matmul(mm[i].w, 0, mm[i].w->cols, err, errlen) ||
            (i && kcuda_check_same(mm[0].w, mm[i].w, "several matrices", err, errlen)))
            return -1;
    return 0;
}

/* kcuda_attention's: a head size the kernel takes, whole groups of query heads, a known mode. */
static inline int kcuda_check_attention(const kcuda_att *a, int mode, char *err, size_t errlen)
{
    if (a->head_dim % 32 || a->head_dim > KCUDA_MAX_HEAD_DIM || a->head_dim <= 0 ||
        a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads) {
        snprintf(err, errlen,
                 "attention: head_dim %d (a multiple of 32 up to %d), %d heads over %d KV heads",
                 a->head_dim, KCUDA_MAX_HEAD_DIM, a->n_heads, a->n_kv_heads);
        return -1;
    }
    if (mode != KCUDA_ATT_FULL && mode != KCUDA_ATT_DENSE && mode != KCUDA_ATT_SPARSE) {
        snprintf(err, errlen, "attention: mode %d", mode);
        return -1;
    }
    return 0;
}

/* Whether attention over n tokens runs the tiled kernel for a (kcuda_set_att_tile's `tile`). By
 * default: the queries a KV head serves (n x query heads per KV head) times the longest stream —
 * the key reads tiles share — reach KCUDA_ATT_TILE_MIN_WORK, on a stream long enough
 * (KCUDA_ATT_TILE_MIN_KEYS) to repay the tiles' staging. */
static inline bool kcuda_att_tiled(const kcuda_att *a, int n, int tile)
{
    if (a->head_dim > KCUDA_ATT_TILE_HD || a->n_kv_heads <= 0 ||
        a->n_heads / a->n_kv_heads > KCUDA_ATT_TILE_Q || tile == KCUDA_TILE_OFF)
        return false;
    long queries = (long)n * (a->n_heads / a->n_kv_heads);
    return tile == KCUDA_TILE_ON || (a->max_keys >= KCUDA_ATT_TILE_MIN_KEYS &&
                                     queries * a->max_keys >= KCUDA_ATT_TILE_MIN_WORK);
}

/* The quantized matmul's groups in flight for n columns (kcuda_set_matmul_unroll's `set`). */
static inline int kcuda_unroll_rule(int set, int n)
{
    if (set == 1 || set == 2 || set == 4)
        return set;
    return n <= KCUDA_UNROLL_AUTO_N ? 2 : 1;
}

/* What a matmul of `type` runs on (kcuda_set_matmul_kind's `set`): the float types on CUDA cores
 * always; the quantized ones as set, by default (KCUDA_MM_AUTO) on tensor cores — on an H200 the
 * 8B shape's step at Q4_K took 10.0 / 10.7 / 13.5 / 29.3 ms at widths 1 / 8 / 16 / 64 there
 * against 8.3 / 23.1 / 44.7 / 172.8 on CUDA cores (docs/gpu.md, "Measured on an H200"). */
static inline int kcuda_mm_rule(int set, uint32_t type)
{
    if (type == KT_F32 || type == KT_F16 || type == KT_BF16)
        return KCUDA_MM_SIMT;
    return set == KCUDA_MM_SIMT ? KCUDA_MM_SIMT : KCUDA_MM_TC;
}

/* Whether a tensor-core matmul of n tokens takes its inputs in fragment order (kcuda_set_matmul_frag's
 * `set`). */
static inline bool kcuda_frag_rule(int set, int n)
{
    if (set == KCUDA_FRAG_OFF || n < 1)
        return false;
    return set == KCUDA_FRAG_ON || n >= KCUDA_FRAG_AUTO_N;
}

/* kcuda_set_matmul_groups' setting as the context keeps it: 1, 2, 4 or 8 as asked, else 0 (the
 * default). The CUDA op set and its stand-in both keep it so. */
static inline int kcuda_groups_set(int groups)
{
    return groups == 1 || groups == 2 || groups == 4 || groups == 8 ? groups : 0;
}

/* The 8-token tiles one pass of a tensor-core block takes for n tokens in `groups` groups
 * (kcuda_set_matmul_groups' setting): the power of two at or above the tiles a group needs, 8 at
 * most (a pass of 64 tokens; a group of more takes several passes). */
static inline int kcuda_pass_tiles(int n, int groups)
{
    int tiles = (n + 7) / 8, g = kcuda_groups_set(groups) > 1 ? groups : 1;
    int need = (tiles + g - 1) / g, nt = 1;
    while (nt < need && nt < 8)
        nt *= 2;
    return nt;
}

/* The token groups (blocks a row tile, gridDim.y) a tensor-core matmul of n tokens runs in under
 * kcuda_set_matmul_groups' setting: as set (1, 2, 4, 8), no more than its passes; by default 1. */
static inline int kcuda_groups_rule(int set, int n)
{
    if (kcuda_groups_set(set) < 2)
        return 1;
    int tiles = (n + 7) / 8, nt = kcuda_pass_tiles(n, set), passes = (tiles + nt - 1) / nt;
    return passes < 1 ? 1 : passes < set ? passes : set;
}

/* The blocks a tensor-core warp loads before it multiplies any (its loads in flight) in a pass of
 * `pass_tiles` token tiles, under kcuda_set_matmul_depth's `set`: 2 from 4 tiles (their
 * accumulators take the registers), 4 for 2; for one tile (a step of up to 8 tokens) 4 or 8 as
 * set, and by default 8 where all the launch's `blocks` are resident at once with the 8-deep
 * kernel (`resident8`: the multiprocessors times the blocks of it one holds) — a launch too small
 * to give the device more warps than that, whose warps' own loads in flight are all that covers
 * the memory's latency — else 4, which leaves room for more blocks a multiprocessor. The same
 * sums in the same order whatever the depth: the same bits. */
static inline int kcuda_depth_rule(int set, int pass_tiles, long blocks, long resident8)
{
    if (pass_tiles > 2)
        return 2;
    if (pass_tiles > 1 || set == 4)
        return 4;
    if (set == 8)
        return 8;
    return blocks > 0 && blocks <= resident8 ? 8 : 4;
}

/* kcuda_att_parts for a device of `sms` multiprocessors, `tile` as kcuda_att_tiled takes it (the
 * CUDA op set and its stand-in share the rule, so both count the same launches). */
static inline int kcuda_att_parts_rule(const kcuda_att *a, int n, int sms, int tile)
{
    if (n <= 0 || a->n_heads <= 0 || a->head_dim <= 0 || a->n_kv_heads <= 0)
        return 1;
    long pairs = (long)n * a->n_heads, p = a->parts;
    if (p <= 0) {
        long blocks = pairs; /* a part's blocks: one per (token, head), tiled per (group, KV head) */
        if (kcuda_att_tiled(a, n, tile)) {
            long tg = KCUDA_ATT_TILE_Q / (a->n_heads / a->n_kv_heads);
            blocks = (n + tg - 1) / tg * a->n_kv_heads;
        }
        p = 1;
        while (2 * p * blocks <= 8L * sms && 2 * p * KCUDA_ATT_MIN_KEYS <= a->max_keys)
            p *= 2;
    }
    long fit = (long)(KCUDA_ATT_PART_FLOATS / (size_t)(a->head_dim + 2)) / pairs;
    p = p > fit ? fit : p;
    p = p > KCUDA_ATT_MAX_PARTS ? KCUDA_ATT_MAX_PARTS : p;
    return p < 1 ? 1 : (int)p;
}

/* kcuda_embed's: a table type with a GPU dequantizer. */
static inline int kcuda_check_embed(const kmat *table, char *err, size_t errlen)
{
    if (!kcuda_type_ok(table->type)) {
        snprintf(err, errlen, "embedding of type %u: the GPU reads " KT_SUPPORTED_LIST,
                 table->type);
        return -1;
    }
    if (!kcuda_aligned(table)) {
        snprintf(err, errlen, "embedding of %s rows at %p: the GPU reads them by %zu-byte words",
                 kt_traits_of(table->type)->name, table->data, kcuda_type_align(table->type));
        return -1;
    }
    return 0;
}

#endif
