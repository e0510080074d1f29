/*
 * kernels/cuda — the GPU op set of orochi (CUDA + cuBLAS), the twin of kernels/cpu for a GPU
 * worker: batched matmul over an output-row range for every type the CPU computes (F32/F16/BF16,
 * Q8_0, Q4_0/Q4_1, Q5_0/Q5_1, IQ4_NL and the K-quants Q2_K..Q6_K: own kernels that dequantize in
 * registers, the same sums whatever the batch, on CUDA cores or, for the quantized types, on
 * tensor cores (kcuda_set_matmul_kind); cuBLAS beside them for the float types), rmsnorm, rope, silu*mul, embedding rows, residual
 * add, and attention as partials — dense (a query against the committed prefix), sparse (against
 * its tree ancestors, a COO list), both in one pass — and their online-softmax merge.
 *
 * Every op is queued on the context's stream and takes device addresses: memory from
 * kcuda_alloc, or host memory mapped with kcuda_register (the shared-memory arena: kernels read
 * and write it in place). Data layouts are exactly those of the CPU twins (kernels/cpu/kernels.h,
 * model/llama.c), so a worker can hand the same arena offsets to either. Errors of a launch are
 * reported by the next kcuda_sync. Built only when CMake finds nvcc (OROCHI_CUDA); each op's
 * agreement with its CPU twin is checked by ctest unit_cuda_kernels on a machine with a GPU, and
 * by unit_cuda_kernels_emu everywhere, the same kernels run by the CUDA emulation (tests/cuda_emu).
 */
#ifndef OROCHI_KCUDA_H
#define OROCHI_KCUDA_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KCUDA_MAX_HEAD_DIM 256 /* attention: head_dim a multiple of 32, at most this */
#define KCUDA_ATT_MIN_KEYS 64  /* attention: keys a part of a cut stream takes at least */
#define KCUDA_ATT_MAX_PARTS 256
/* attention's tiled kernel (kcuda_set_att_tile): queries a block takes, the largest head; by
 * default (KCUDA_TILE_AUTO) the shortest longest key stream of a step it takes and the least
 * queries a KV head serves times that stream */
#define KCUDA_ATT_TILE_Q 16
#define KCUDA_ATT_TILE_HD 128
#define KCUDA_ATT_TILE_MIN_KEYS 1024
#define KCUDA_ATT_TILE_MIN_WORK 28672
/* the quantized matmul by default (kcuda_set_matmul_unroll 0): 2 groups in flight a lane for
 * steps of at most this many columns, 1 for wider ones */
#define KCUDA_UNROLL_AUTO_N 4
/* attention: the context's buffer of part records (head_dim + 2 floats each) */
#define KCUDA_ATT_PART_FLOATS ((size_t)4096 * (KCUDA_MAX_HEAD_DIM + 2))

/* How many CUDA devices this process can use; 0 with the reason in why (no driver, no device). */
int kcuda_devices(char *why, size_t whylen);

typedef struct kcuda kcuda;

/* A context on device `device`: its stream and cuBLAS handle. NULL with err on failure. */
kcuda *kcuda_new(int device, char *err, size_t errlen);
void kcuda_destroy(kcuda **g);
/* "NAME, N GiB, sm_XY" of the context's device into out. */
void kcuda_describe(const kcuda *g, char *out, size_t len);
/* 1 when the device shares the host's memory (an integrated GPU: mapped host memory is its own
 * memory), 0 for a discrete card whose reads of mapped memory cross the bus. */
int kcuda_integrated(const kcuda *g);
/* Wait for the stream; 0, or -1 with the first error any queued op raised. */
int kcuda_sync(kcuda *g, char *err, size_t errlen);

/* Device memory (NULL on failure) and copies on the context's stream (asynchronous with respect
 * to the host; kcuda_sync before reading a download). 0, or -1 with err. */
void *kcuda_alloc(size_t bytes);
void kcuda_free(void *p);
int kcuda_upload(kcuda *g, void *dst, const void *src, size_t bytes, char *err, size_t errlen);
int kcuda_download(kcuda *g, void *dst, const void *src, size_t bytes, char *err, size_t errlen);
/* `rows` rows of `width` bytes from src (spitch bytes apart) to dst (dpitch apart), any mix of
 * device and mapped host addresses. 0, or -1 with err. */
int kcuda_copy2d(kcuda *g, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                 size_t rows, char *err, size_t errlen);
/* Map `bytes` of host memory at `host` for the device (page-locked, mapped): *dev receives the
 * address kernels use for it. 0, or -1 with err. */
int kcuda_register(void *host, size_t bytes, void **dev, char *err, size_t errlen);
/* kcuda_register for memory the device only reads (a model file's read-only mapping): registered
 * read-only, so pages that may not be written (PROT_READ) can be mapped. 0: registered here
 * (kcuda_unregister it); 1: this process had registered it already (*dev still set; leave it);
 * -1 with err. */
int kcuda_register_ro(const void *host, size_t bytes, void **dev, char *err, size_t errlen);
void kcuda_unregister(void *host);
/* depth x height blocks of `width` bytes: block (z, y) from src + z * pitch_z + y * pitch_y to the
 * same offset from dst; any mix of device and mapped host addresses, by a kernel (one launch
 * whatever the block count, where cudaMemcpy3D would need the planes to be height * pitch_y
 * apart). Sizes, pitches and addresses multiples of 4 bytes. */
void kcuda_copy3d(kcuda *g, void *dst, const void *src, size_t width, size_t height,
                  size_t pitch_y, size_t depth, size_t pitch_z);
/* kcuda_copy3d whose planes lie dst_pitch_z apart in dst and src_pitch_z apart in src (a copy
 * between blocks laid out alike but for their plane pitch). */
void kcuda_copy3d_pz(kcuda *g, void *dst, size_t dst_pitch_z, const void *src, size_t src_pitch_z,
                     size_t width, size_t height, size_t pitch_y, size_t depth);
/* The device's copy bandwidth: `reps` device-to-device copies of `bytes` (after one unmeasured),
 * timed on the host around a sync; *gbps gets bytes read plus bytes written per second over 1e9
 * (the roofline a step's weight reads are compared with). 0, or -1 with err. */
int kcuda_copy_gbps(kcuda *g, size_t bytes, int reps, double *gbps, char *err, size_t errlen);
/* The rate of the instruction the tensor-core matmul runs (mma.sync m16n8k16, f16 inputs, f32
 * sums): 2 blocks of 4 warps a multiprocessor, each warp 8 independent chains of them on
 * registers, launched until `seconds` have passed (after one unmeasured launch); *tflops gets
 * 4096 flops an instruction per second over 1e12 (what a wide step's matmul flops are compared
 * with). 0, or -1 with err. */
int kcuda_mma_tflops(kcuda *g, double seconds, double *tflops, char *err, size_t errlen);
/* Make the context's scratch (the 16-bit activations of a cuBLAS matmul, the tensor-core matmul's
 * inputs in fragment order) at least `bytes`, so that no op allocates while a graph is being
 * captured; once a graph has been captured the scratch never moves (a recording may hold its
 * address), so this belongs before the first capture. 0, or -1 with err. */
int kcuda_reserve(kcuda *g, size_t bytes, char *err, size_t errlen);

/* CUDA graphs: the ops queued on the context's stream between kcuda_capture_begin and
 * kcuda_capture_end are recorded instead of run (no kcuda_sync, allocation or host wait may come
 * between), and kcuda_graph_launch queues the recording again, with the same arguments and
 * addresses, as one launch. */
typedef struct kcuda_graph kcuda_graph;
int kcuda_capture_begin(kcuda *g, char *err, size_t errlen);
/* The captured graph, instantiated; NULL with err when capture or instantiation failed (the
 * stream is then back to running ops as they are queued). */
kcuda_graph *kcuda_capture_end(kcuda *g, char *err, size_t errlen);
int kcuda_graph_launch(kcuda *g, kcuda_graph *graph, char *err, size_t errlen);
void kcuda_graph_destroy(kcuda_graph **graph);

/* y[t * ldy + r] = W[r] . x[t * w->cols ...] for rows r in [lo, hi) and tokens t < n; w->data is
 * a device address of GGUF rows (w->packed is ignored). Types: every one kcuda_type_ok takes
 * (KT_SUPPORTED_LIST), all by the op set's own kernels, whose result for a token does not depend on the other tokens
 * of the batch (a tree's verification gives the bits sequential decoding gives). 0, or -1 with
 * err for another type. */
int kcuda_matmul(kcuda *g, const kmat *w, int64_t lo, int64_t hi, const float *x, int n, float *y,
                 int64_t ldy, char *err, size_t errlen);
/* The fused forms of the forward (docs/gpu.md, "Fused launches"): each is one launch where the
 * unfused ops are several, and gives every output the bits those ops give it — each row's sums
 * are kcuda_matmul's, taken in its order. */
#define KCUDA_MM_MAX 3
/* One output of kcuda_matmul_multi: rows [lo, hi) of w into y (token t's row at y + t * ldy). */
typedef struct {
    const kmat *w;
    int64_t lo, hi;
    float *y;
    int64_t ldy;
} kcuda_mm;
/* kcuda_matmul of `count` (1..KCUDA_MM_MAX) matrices over the same n input rows x — the q, k and v
 * projections. 0, or -1 with err when the matrices differ in type or column count (the caller
 * then calls kcuda_matmul for each) or one is refused as kcuda_matmul refuses it. */
int kcuda_matmul_multi(kcuda *g, const kcuda_mm *mm, int count, const float *x, int n, char *err,
                       size_t errlen);
/* y[t * ldy + r] += W[r] . x[t] for rows [lo, hi): kcuda_matmul then kcuda_add_cols (the residual
 * add), in one launch. 0, or -1 with err. */
int kcuda_matmul_add(kcuda *g, const kmat *w, int64_t lo, int64_t hi, const float *x, int n,
                     float *y, int64_t ldy, char *err, size_t errlen);
/* y[t * ldy + r] = silu(G[r] . x[t]) * (U[r] . x[t]) for rows [lo, hi): the gate and up matmuls and
 * kcuda_silu_mul in one launch (the up projection is never stored). 0, or -1 with err when gate
 * and up differ in type or column count. */
int kcuda_matmul_silu(kcuda *g, const kmat *gate, const kmat *up, int64_t lo, int64_t hi,
                      const float *x, int n, float *y, int64_t ldy, char *err, size_t errlen);
/* After the q/k/v projections of n tokens: RoPE of q_heads query heads (row t at q + t *
 * q_stride) and of KV heads [kv_h0, kv_h1) of the key rows (row t at k + t * kv_stride, head h at
 * + h * head_dim), then the key and value heads [kv_h0, kv_h1) stored into rows r0.. of each of
 * n_dst (1 or 2) K/V block pairs, as kcuda_kv_store stores them — kcuda_rope twice and
 * kcuda_kv_store 2 * n_dst times, in one launch. Before RoPE, where set: the biases added (bq
 * indexed as q's rows, bk and bv as k's and v's), each query and key head RMS-normalised with
 * q_norm / k_norm (head_dim weights; the sum of squares in double, as k_rmsnorm); neox rotates
 * pairs (i, i + half) instead of (2i, 2i + 1) — the qwen2 / qwen3 pieces of model/llama.c. */
typedef struct {
    float *q;
    int64_t q_stride;
    int q_heads;
    float *k;
    const float *v;
    int64_t kv_stride;
    int kv_h0, kv_h1;
    int head_dim, half;
    const float *cs, *sn;
    kv_type type;
    int64_t head_rows, r0;
    void *k_dst[2], *v_dst[2];
    int n_dst;
    int neox;
    const float *bq, *bk, *bv, *q_norm, *k_norm;
    float eps;
} kcuda_rope_kv;
void kcuda_rope_store(kcuda *g, const kcuda_rope_kv *a, int n);
/* The quantized matmuls' loads in flight: each lane loads `groups` (1, 2 or 4) of its 8-weight
 * groups before it adds any, the additions in the same order — the same bits whatever the
 * setting, a different speed (measured by deploy/gpu-check.sh). 0 (until set; another value too):
 * by the step, 2 for at most KCUDA_UNROLL_AUTO_N columns, else 1 — on an H100, 2 groups saved 5-10%
 * of a 1-token step and 1 group was fastest at 16 and 64 on the 1B shape (docs/gpu.md). */
void kcuda_set_matmul_unroll(kcuda *g, int groups);
/* The groups in flight the quantized matmul uses for n input columns (1 where it has no such
 * knob: the CPU stand-in). */
int kcuda_matmul_unroll(const kcuda *g, int n);
/* Where the quantized matmuls multiply (every op that runs one: kcuda_matmul, _cols, _multi, _add,
 * _silu): KCUDA_MM_SIMT on CUDA cores, each weight dequantized to f32 and multiplied with the f32
 * activations; KCUDA_MM_TC on tensor cores (mma m16n8k16), the weights and the activations rounded
 * to f16 and the products summed in f32, a block of 16 rows reading each token's inputs once.
 * Either gives a token the same bits whatever the batch (the two differ from each other in the
 * last bits, so a process keeps one setting for all its steps). KCUDA_MM_AUTO (until set; another
 * value too): tensor cores — on an H200 about as fast as CUDA cores from 2 tokens a step (20%
 * slower at one) and 3 to 6 times faster at 16 to 64 (docs/gpu.md). The float types run on CUDA
 * cores whatever the setting. */
enum { KCUDA_MM_AUTO = 0, KCUDA_MM_SIMT = 1, KCUDA_MM_TC = 2 };
void kcuda_set_matmul_kind(kcuda *g, int kind);
/* KCUDA_MM_SIMT or KCUDA_MM_TC: what a matmul of `type` runs on under the context's setting. */
int kcuda_matmul_kind(const kcuda *g, uint32_t type);
/* The tensor-core matmul's inputs: read from the f32 rows by every warp, each lane its 8 columns
 * of a token, rounded to f16 where they are multiplied (KCUDA_FRAG_OFF); or first rounded once
 * into fragment order by one launch more (k_xfrag), so that a warp's B fragments of a token tile
 * are one load of 512 consecutive bytes (KCUDA_FRAG_ON, from 1 token a step). The same f16
 * values in the same sums: the same bits either way. KCUDA_FRAG_AUTO (until set; another value
 * too): from KCUDA_FRAG_AUTO_N tokens, where every warp reading 16 bytes of each of 8 tokens'
 * rows per block was most of a wide step's load instructions (docs/gpu.md). The order lives in
 * the context's scratch: a step captured into a graph uses it only if kcuda_reserve made room
 * before (else the f32 rows, the same bits). */
enum { KCUDA_FRAG_AUTO = 0, KCUDA_FRAG_ON = 1, KCUDA_FRAG_OFF = 2 };
#define KCUDA_FRAG_AUTO_N 17
void kcuda_set_matmul_frag(kcuda *g, int how);
/* 1 when a matmul of `type` over n tokens asks for its inputs in fragment order. */
int kcuda_matmul_frag(const kcuda *g, uint32_t type, int n);
/* The tensor-core matmul's token groups: a launch's blocks take its rows once per group
 * (gridDim.y), each block the token tiles of its group, where one block took them all — G times
 * the blocks of a wide step, each with a G-th of the accumulators, for the steps whose blocks are
 * too few or too large to fill the card; every output the same sums in the same order, so the
 * same bits. 1, 2, 4 or 8 groups at most (no more than the step's 8-token tiles); 0 (until set;
 * another value too): kcuda_groups_rule's default, one group until a timing says otherwise. */
void kcuda_set_matmul_groups(kcuda *g, int groups);
/* The groups a matmul of `type` over n tokens runs in (1 on CUDA cores and for a float type). */
int kcuda_matmul_groups(const kcuda *g, uint32_t type, int n);
/* The tensor-core matmul's loads in flight in a step of up to 8 tokens (one token tile a pass):
 * each warp loads `blocks` (4 or 8) of its row tile's 32-column blocks before it multiplies any,
 * the products in the same order — the same bits whatever the setting. 0 (until set; another
 * value too): kcuda_depth_rule's default, 8 where the device holds every block of the launch at once
 * with the 8-deep kernel (a matrix of few rows, whose warps alone must keep the memory busy), else
 * 4. Wider steps keep 4 (2 token tiles a pass) or 2 (4 or 8). */
void kcuda_set_matmul_depth(kcuda *g, int blocks);
/* The blocks in flight a warp of a matmul of `type` over `rows` rows (the rows of one launch: the
 * fused q/k/v's together) and n tokens loads: 2, 4 or 8; 0 on CUDA cores, for a float type and on
 * the CPU stand-in. Asks the runtime what a multiprocessor holds once per kernel. */
int kcuda_matmul_depth(kcuda *g, uint32_t type, int64_t rows, int n);
/* The tensor-core matmul launched early (on: a programmatic dependent launch, sm_90): its blocks may
 * start while the kernel ahead of it in the stream still runs, bring the first round of their
 * weights into L2 meanwhile, and wait for that kernel's writes before they read their inputs — the
 * same bits, a launch's start and its first loads hidden behind the kernel before. The kernels
 * that come before a matmul in a forward (rmsnorm, attention, the matmul) let the next one start
 * as soon as all their blocks run. Off until set (not yet timed on a GPU). */
void kcuda_set_matmul_early(kcuda *g, bool on);
/* Ask the runtime, once and outside any graph capture, what a multiprocessor holds of the 8-deep
 * kernels of `type` (every fused form, inputs in fragment order or not), which kcuda_depth_rule
 * needs: a launch captured before its type was prepared takes 4 blocks in flight (the same bits).
 * Nothing for a float type; the CPU stand-in does nothing. */
void kcuda_matmul_prepare(kcuda *g, uint32_t type);
/* The scratch bytes the fragment order of n tokens of `cols` inputs takes (kcuda_reserve): 8-token
 * tiles of f16 values. */
static inline size_t kcuda_frag_bytes(int n, int64_t cols)
{
    return (size_t)((n + 7) / 8) * 8 * (size_t)cols * 2;
}
/* Ops queued on the context's stream since it was made: each kernel launch, copy and graph launch
 * counts one (a step's launch count, for tests and profiles). */
long kcuda_launches(const kcuda *g);
/* kcuda_matmul over input columns [c0, c1) only (kmat_mul_cols): y[t * ldy + r] = W[r][c0:c1] .
 * x[t], x holding n rows of c1 - c0 values — a partial sum. For the quantized types c0 and c1
 * on whole blocks (32 columns, 256 for the K-quants); any range of F32, F16, BF16. 0, or -1 with
 * err. */
int kcuda_matmul_cols(kcuda *g, const kmat *w, int64_t lo, int64_t hi, int64_t c0, int64_t c1,
                      const float *x, int n, float *y, int64_t ldy, char *err, size_t errlen);
/* kcuda_matmul through cuBLAS for F32 (SGEMM) and F16, BF16 (the activations rounded to the
 * weight's type, cublasGemmEx with f32 accumulation); the 8- and 4-bit types as kcuda_matmul.
 * cuBLAS picks its algorithm by shape, so a token's result may change with the batch's width:
 * the forward does not use it (docs/gpu.md). 0, or -1 with err. */
int kcuda_matmul_blas(kcuda *g, const kmat *w, int64_t lo, int64_t hi, const float *x, int n,
                      float *y, int64_t ldy, char *err, size_t errlen);
/* out[t] = rmsnorm(x[t]) * weight for n rows of dim (k_rmsnorm). */
void kcuda_rmsnorm(kcuda *g, float *out, const float *x, const float *weight, int dim, int n,
                   float eps);
/* RoPE of n rows (each at x + t * stride) of n_heads heads: pairs (2i, 2i+1) rotated by row t's
 * cos/sin cs[t * half + i], sn[t * half + i] (k_rope_apply). */
void kcuda_rope(kcuda *g, float *x, int n, int64_t stride, int n_heads, int head_dim, int half,
                const float *cs, const float *sn);
/* gate = silu(gate) * up over `count` values of n rows, each at t * stride (k_silu_mul). */
void kcuda_silu_mul(kcuda *g, float *gate, const float *up, int n, int64_t stride, int64_t count);
/* x[t * dim + c] += bias[c] for c in [lo, hi), t < n (an output projection's bias). */
void kcuda_add_bias(kcuda *g, float *x, const float *bias, int n, int64_t dim, int64_t lo,
                    int64_t hi);
/* x[t * dim + c] += d[t * dim + c] for c in [lo, hi), t < n. */
void kcuda_add_cols(kcuda *g, float *x, const float *d, int n, int64_t dim, int64_t lo,
                    int64_t hi);
/* Columns [c0, c1) of embedding rows ids[0..n) into out + t * ldo (kmat_row); ids on the device.
 * 0, or -1 with err for a type without a GPU dequantizer. */
int kcuda_embed(kcuda *g, const kmat *table, const int32_t *ids, int n, float *out, int64_t ldo,
                int64_t c0, int64_t c1, char *err, size_t errlen);

/* KV heads [h0, h1) of n projected rows (row t at src + t * src_stride floats, head h at
 * + h * head_dim) into rows r0 .. r0 + n - 1 of a K or V block in the engine's layout (head h's
 * row r at dst + (h * head_rows + r) * head_dim elements of `type`, as kcuda_att reads it): f32
 * copied, f16 rounded to nearest even (kt_f32_to_f16). */
void kcuda_kv_store(kcuda *g, kv_type type, void *dst, int64_t head_rows, int64_t r0,
                    const float *src, int64_t src_stride, int h0, int h1, int head_dim, int n);

/* Attention of n tokens for query heads [h0, h1) over one layer's K/V in the engine's layout:
 * KV head kvh's row r at k + (kvh * head_rows + r) * head_dim elements (f32 or f16). Token i's
 * prefix is rows seq_row[i] .. seq_row[i] + n_prefix[i] - 1, its tree ancestors rows tree_row +
 * anc[i * anc_stride + j] for j < n_anc[i]. q of token i, head h at q + i * q_stride + h *
 * head_dim. All index arrays are device addresses.
 *
 * A (token, head)'s key stream may be cut into parts, one block each, whose partials a second
 * launch joins (long prefixes beside few tokens: more blocks, more loads in flight). parts = 0
 * lets kcuda_att_parts choose from max_keys; parts = N asks for N (tests, benches). Any cut gives
 * the same answer within rounding. */
typedef struct {
    kv_type type;
    const void *k, *v;
    int64_t head_rows, tree_row;
    int head_dim, n_heads, n_kv_heads;
    float scale;
    const int32_t *seq_row, *n_prefix, *anc, *n_anc;
    int anc_stride;
    int max_keys; /* no token's key stream longer (0: not known; the stream is then not cut) */
    int parts;    /* 0: kcuda_att_parts's choice; N: N parts (bounded as kcuda_att_parts says) */
} kcuda_att;

/* The parts kcuda_attention cuts each of n tokens' key streams into: a->parts when set, else the
 * largest power of two that keeps every part at KCUDA_ATT_MIN_KEYS of max_keys or more and the
 * blocks of all n_heads heads (tiled: of the token groups and KV heads) within 8 per
 * multiprocessor; either way at most KCUDA_ATT_MAX_PARTS
 * and what the context's partial buffer holds (KCUDA_ATT_PART_FLOATS), and at least 1. It depends
 * on n, n_heads, head_dim, max_keys and parts only (a recorded graph keeps it). */
int kcuda_att_parts(const kcuda *g, const kcuda_att *a, int n);
/* The keys an attention warp scores before it updates its softmax: 4 (until set), or 1 (one key
 * at a time; another value means 4) — the same answer within rounding, a tuning knob. */
void kcuda_set_att_keys(kcuda *g, int keys);
/* Attention by tiles: the queries of a run of tokens of one sequence that share a KV head (at
 * most KCUDA_ATT_TILE_Q) take their common prefix together, each tile of 32 K and V rows loaded
 * once into shared memory for all of them — one load where the plain kernel makes one per query.
 * Head sizes up to KCUDA_ATT_TILE_HD and at most KCUDA_ATT_TILE_Q query heads per KV head; others
 * take the plain kernel. The same answer within rounding. `how`: KCUDA_TILE_AUTO (until set; any
 * other value too) tiles steps whose longest key stream (kcuda_att.max_keys) reaches
 * KCUDA_ATT_TILE_MIN_KEYS and whose tokens x query heads per KV head x that stream reach
 * KCUDA_ATT_TILE_MIN_WORK — the H100's timings of 42 (shape, keys, width) cells (docs/gpu.md,
 * "Long prefixes"): the tiles lost at 256 keys however wide, won from 2 tokens at 4096 keys on the
 * 1B shape, 4 on the default one — ON always, OFF never. */
enum { KCUDA_TILE_AUTO = 0, KCUDA_TILE_ON = 1, KCUDA_TILE_OFF = 2 };
void kcuda_set_att_tile(kcuda *g, int how);
/* Whether attention over a step of n tokens with a's shape runs by tiles (1) or not (0). */
int kcuda_att_tiles(const kcuda *g, const kcuda_att *a, int n);

enum { KCUDA_ATT_FULL = 3, KCUDA_ATT_DENSE = 1, KCUDA_ATT_SPARSE = 2 };

/* mode FULL: prefix then ancestors in one online-softmax pass, the finished output to out + i *
 * out_stride + h * head_dim. DENSE or SPARSE: one key set, the unnormalised partial as the
 * engine's record — head_dim outputs, then max and sum — at out + i * out_stride + h *
 * rec_stride. 0, or -1 with err for a head_dim the kernel does not take. */
int kcuda_attention(kcuda *g, const kcuda_att *a, int mode, const float *q, int64_t q_stride,
                    int n, int h0, int h1, float *out, int64_t out_stride, int64_t rec_stride,
                    char *err, size_t errlen);
/* Merge two partial records (dense at pd, sparse at ps: head_dim outputs, max, sum) of heads
 * heads[0..n_heads_list) of n tokens (record of token i, head h at + i * rec_tok + h * rec_head)
 * and write each finished output to out + i * out_stride + h * head_dim (katt_merge, katt_finish). */
void kcuda_att_merge(kcuda *g, const float *pd, const float *ps, int64_t rec_tok, int64_t rec_head,
                     const int32_t *heads, int n_heads_list, int n, int head_dim, float *out,
                     int64_t out_stride);

#ifdef __cplusplus
}
#endif

#endif
