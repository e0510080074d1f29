/*
 * kernels/cuda/kcuda_attention.cu — attention partials on the GPU (kcuda.h, kcuda_attention) and
 * their merge.
 *
 * One block of ATT_WARPS warps per (token, query head, part of its key stream). The head's query
 * is spread over the lanes (head_dim / 32 elements each, in registers); a token's key stream is
 * the prefix rows, then the tree ancestors (the stream katt_causal reads), and part z of P takes
 * positions [len * z / P, len * (z + 1) / P). Warp w takes ATT_KEYS (4; 1 by kcuda_set_att_keys,
 * for comparison) consecutive keys of the part at a time (w * ATT_KEYS, then ATT_WARPS * ATT_KEYS
 * further on, ...): it loads their K slices together, sums the scores with interleaved warp
 * reductions, and updates its own online-softmax partial (max, sum, its lanes' slice of the
 * output) once per group, so that ATT_KEYS rows of K and of V are in flight per warp. The warps'
 * partials are then merged in shared memory exactly as katt_merge does, and the block writes the
 * finished output (FULL), the unnormalised record the engine's merge reads (DENSE, SPARSE), or —
 * for a cut stream — the part's record into the context's buffer, which att_join_kernel merges
 * part by part into one of the first two.
 */
#include <math.h>
#include <stdio.h>

#include "kernels/cuda/kcuda_internal.h"

#define ATT_WARPS 4
#define ATT_PER_LANE (KCUDA_MAX_HEAD_DIM / 32)

template <typename T> __device__ static inline float att_load(const T *p, int i);
template <> __device__ inline float att_load<float>(const float *p, int i)
{
    return p[i];
}
template <> __device__ inline float att_load<__half>(const __half *p, int i)
{
    return __half2float(p[i]);
}

/* Where token i's head h writes (heads [h0, h0 + nh) in the launch): part z's record of a stream
 * cut into parts, else the finished output (full) or the record (outputs, max, sum). */
__device__ static inline float *att_dst(float *out, int64_t out_stride, int64_t rec_stride,
                                        float *part, int i, int h, int h0, int nh, int parts,
                                        int z, int hd, bool full)
{
    if (parts > 1)
        return part + (((int64_t)i * nh + (h - h0)) * parts + z) * (hd + 2);
    return out + (int64_t)i * out_stride + (int64_t)h * (full ? hd : rec_stride);
}

/* One finished (token, head): the output normalised (FULL) or the record (outputs, max, sum). */
__device__ static inline void att_put(float *dst, int e, float acc, float L, bool full)
{
    dst[e] = full ? (L > 0 ? acc / L : 0.0f) : acc;
}

/* A record's max and sum after its outputs (lane or thread 0 of the writer). */
__device__ static inline void att_put_stats(float *dst, int hd, float M, float L, bool full)
{
    if (!full) {
        dst[hd] = M;
        dst[hd + 1] = L;
    }
}

template <typename T, int ATT_KEYS>
__global__ void att_kernel(kcuda_att a, int mode, const float *q, int64_t q_stride, int h0,
                           float *out, int64_t out_stride, int64_t rec_stride, float *part)
{
    kcuda_let_next_start(); /* wo's matmul may start (kcuda_set_matmul_early) */
    int i = blockIdx.x, h = h0 + blockIdx.y, z = blockIdx.z, parts = gridDim.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int hd = a.head_dim, per = hd / 32, kvh = h / (a.n_heads / a.n_kv_heads);
    const float *qh = q + (int64_t)i * q_stride + (int64_t)h * hd;
    float qv[ATT_PER_LANE], o[ATT_PER_LANE];
#pragma unroll
    for (int c = 0; c < ATT_PER_LANE; c++) {
        qv[c] = c < per ? qh[lane + 32 * c] : 0.0f;
        o[c] = 0.0f;
    }
    const T *kb = (const T *)a.k + (int64_t)kvh * a.head_rows * hd;
    const T *vb = (const T *)a.v + (int64_t)kvh * a.head_rows * hd;
    int np = (mode & KCUDA_ATT_DENSE) ? a.n_prefix[i] : 0;
    int na = (mode & KCUDA_ATT_SPARSE) ? a.n_anc[i] : 0;
    int64_t first = a.seq_row[i];
    const int32_t *anc = a.anc + (int64_t)i * a.anc_stride;
    int len = np + na;
    int j0 = (int)((int64_t)len * z / parts), j1 = (int)((int64_t)len * (z + 1) / parts);
    float m = -INFINITY, l = 0.0f;
    for (int j = j0 + warp * ATT_KEYS; j < j1; j += ATT_WARPS * ATT_KEYS) {
        const T *kr[ATT_KEYS], *vr[ATT_KEYS];
        float s[ATT_KEYS];
#pragma unroll
        for (int b = 0; b < ATT_KEYS; b++) {
            int jj = j + b < j1 ? j + b : j; /* past the part: the first key again, weight 0 */
            int64_t r = jj < np ? first + jj : a.tree_row + anc[jj - np];
            kr[b] = kb + r * hd;
            vr[b] = vb + r * hd;
            s[b] = 0.0f;
        }
#pragma unroll
        for (int c = 0; c < ATT_PER_LANE; c++)
            if (c < per)
#pragma unroll
                for (int b = 0; b < ATT_KEYS; b++)
                    s[b] += qv[c] * att_load(kr[b], lane + 32 * c);
        kcuda_warp_butterfly(s, [](float x, float y) { return x + y; });
        float mn = m;
#pragma unroll
        for (int b = 0; b < ATT_KEYS; b++) {
            s[b] *= a.scale;
            if (j + b < j1)
                mn = fmaxf(mn, s[b]);
        }
        float cold = expf(m - mn), e[ATT_KEYS];
        l *= cold;
#pragma unroll
        for (int b = 0; b < ATT_KEYS; b++) {
            e[b] = j + b < j1 ? expf(s[b] - mn) : 0.0f;
            l += e[b];
        }
#pragma unroll
        for (int c = 0; c < ATT_PER_LANE; c++)
            if (c < per) {
                float acc = o[c] * cold;
#pragma unroll
                for (int b = 0; b < ATT_KEYS; b++)
                    acc += e[b] * att_load(vr[b], lane + 32 * c);
                o[c] = acc;
            }
        m = mn;
    }
    /* the warps' partials, merged as katt_merge does */
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS], so[ATT_WARPS][KCUDA_MAX_HEAD_DIM];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int c = 0; c < ATT_PER_LANE; c++)
        if (c < per)
            so[warp][lane + 32 * c] = o[c];
    __syncthreads();
    if (warp != 0)
        return;
    float M = -INFINITY, L = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++)
        if (sl[w] > 0)
            M = fmaxf(M, sm[w]);
    float f[ATT_WARPS];
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = sl[w] > 0 ? expf(sm[w] - M) : 0.0f;
        L += sl[w] * f[w];
    }
    /* where this block's result goes: a part record, the finished output, or the record */
    bool full = mode == KCUDA_ATT_FULL && parts == 1;
    float *dst = att_dst(out, out_stride, rec_stride, part, i, h, h0, gridDim.y, parts, z, hd, full);
    for (int c = 0; c < per; c++) {
        int e = lane + 32 * c;
        float acc = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            acc += so[w][e] * f[w];
        att_put(dst, e, acc, L, full);
    }
    if (lane == 0)
        att_put_stats(dst, hd, M, L, full);
}

/* ===== the tiled kernel (kcuda_set_att_tile): queries that share a key stream share its loads =====
 *
 * One block of ATT_WARPS warps per (group of tokens, KV head, part of the prefix). A group is a run
 * of at most ATT_TILE_Q / (query heads per KV head) consecutive tokens with the same sequence and
 * prefix length (a tree's tokens, a prompt's chunk; a token whose neighbour differs starts its own
 * group, and so does every token whose index is a multiple of that count); its queries are each
 * token's query heads of the KV head within [h0, h1), at most ATT_TILE_Q, warp w taking queries
 * w, w + ATT_WARPS, ... The block walks its
 * part of the common prefix in tiles of 32 keys: the K and V rows of a tile are loaded once into
 * shared memory (as floats), then for each of its queries a warp forms the tile's 32 scores one key
 * a lane, one max and one sum over the warp per tile, and adds the tile's V rows, each weighted by
 * its lane's weight, into the query's output slice (lane l holds elements l, l + 32, ...). The last part then takes each
 * query's tree ancestors key by key. Each query's result is written as att_kernel writes it. */
#define ATT_TILE 32
#define ATT_TILE_Q KCUDA_ATT_TILE_Q
#define ATT_TILE_HD KCUDA_ATT_TILE_HD /* head sizes up to this (the shared tiles' size) */
#define ATT_TILE_QW ((ATT_TILE_Q + ATT_WARPS - 1) / ATT_WARPS)

/* Whether token i starts a group of att_tile_kernel (groups of at most tg tokens). */
__device__ static inline bool att_group_start(const kcuda_att &a, int mode, int i, int tg)
{
    if (i == 0 || i % tg == 0 || a.seq_row[i] != a.seq_row[i - 1])
        return true;
    return (mode & KCUDA_ATT_DENSE) && a.n_prefix[i] != a.n_prefix[i - 1];
}

template <typename T>
__global__ void att_tile_kernel(kcuda_att a, int mode, const float *q, int64_t q_stride, int h0,
                                int h1, int n, float *out, int64_t out_stride, int64_t rec_stride,
                                float *part)
{
    kcuda_let_next_start(); /* wo's matmul may start (kcuda_set_matmul_early) */
    int i0 = blockIdx.x, z = blockIdx.z, parts = gridDim.z;
    int gs = a.n_heads / a.n_kv_heads, kvh = h0 / gs + blockIdx.y, tg = ATT_TILE_Q / gs;
    if (!att_group_start(a, mode, i0, tg))
        return; /* the whole block: no barrier is waited on */
    int nt = 1;
    while (i0 + nt < n && !att_group_start(a, mode, i0 + nt, tg))
        nt++;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, hd = a.head_dim, per = hd / 32;
    int qh0 = h0 > kvh * gs ? h0 : kvh * gs;
    int nqh = (h1 < (kvh + 1) * gs ? h1 : (kvh + 1) * gs) - qh0;
    int nq = nt * nqh; /* query k: token i0 + k / nqh, head qh0 + k % nqh */
    __shared__ float sq[ATT_TILE_Q][ATT_TILE_HD];
    __shared__ float sk[ATT_TILE][ATT_TILE_HD + 1];
    __shared__ float sv[ATT_TILE][ATT_TILE_HD];
    for (int e = threadIdx.x; e < nq * hd; e += blockDim.x) {
        int k = e / hd, c = e % hd;
        sq[k][c] = q[(int64_t)(i0 + k / nqh) * q_stride + (int64_t)(qh0 + k % nqh) * hd + c];
    }
    __syncthreads();
    const T *kb = (const T *)a.k + (int64_t)kvh * a.head_rows * hd;
    const T *vb = (const T *)a.v + (int64_t)kvh * a.head_rows * hd;
    float m[ATT_TILE_QW], l[ATT_TILE_QW], o[ATT_TILE_QW][ATT_TILE_HD / 32];
#pragma unroll
    for (int u = 0; u < ATT_TILE_QW; u++) {
        m[u] = -INFINITY;
        l[u] = 0.0f;
#pragma unroll
        for (int c = 0; c < ATT_TILE_HD / 32; c++)
            o[u][c] = 0.0f;
    }
    int np = (mode & KCUDA_ATT_DENSE) ? a.n_prefix[i0] : 0;
    int p0 = (int)((int64_t)np * z / parts), p1 = (int)((int64_t)np * (z + 1) / parts);
    int64_t first = a.seq_row[i0];
    for (int t0 = p0; t0 < p1; t0 += ATT_TILE) {
        int cnt = p1 - t0 < ATT_TILE ? p1 - t0 : ATT_TILE;
        __syncthreads(); /* the last tile's readers are done (and sq is written) */
        for (int e = threadIdx.x; e < cnt * hd; e += blockDim.x) {
            int j = e / hd, c = e % hd;
            int64_t r = (first + t0 + j) * hd + c;
            sk[j][c] = att_load(kb + r, 0);
            sv[j][c] = att_load(vb + r, 0);
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < ATT_TILE_QW; u++) {
            int k = warp + u * ATT_WARPS;
            if (k >= nq)
                break;
            float s = -INFINITY;
            if (lane < cnt) {
                float d = 0.0f;
                for (int c = 0; c < hd; c++)
                    d += sq[k][c] * sk[lane][c];
                s = d * a.scale;
            }
            float mx[1] = {s};
            kcuda_warp_butterfly(mx, [](float x, float y) { return fmaxf(x, y); });
            float mn = fmaxf(m[u], mx[0]), cold = expf(m[u] - mn);
            float pj = lane < cnt ? expf(s - mn) : 0.0f;
            l[u] = l[u] * cold + kcuda_warp_sum(pj);
            m[u] = mn;
#pragma unroll
            for (int c = 0; c < ATT_TILE_HD / 32; c++)
                o[u][c] *= cold;
            for (int j = 0; j < cnt; j++) {
                float w = __shfl_sync(0xffffffffu, pj, j); /* key j's weight, from its lane */
#pragma unroll
                for (int c = 0; c < ATT_TILE_HD / 32; c++)
                    if (c < per)
                        o[u][c] += w * sv[j][lane + 32 * c];
            }
        }
    }
    /* the tree ancestors (the last part), key by key as att_kernel takes them */
#pragma unroll
    for (int u = 0; u < ATT_TILE_QW; u++) {
        int k = warp + u * ATT_WARPS;
        if (k >= nq)
            break;
        int i = i0 + k / nqh, h = qh0 + k % nqh;
        int na = (mode & KCUDA_ATT_SPARSE) && z == parts - 1 ? a.n_anc[i] : 0;
        const int32_t *anc = a.anc + (int64_t)i * a.anc_stride;
        for (int j = 0; j < na; j++) {
            int64_t r = a.tree_row + anc[j];
            float d = 0.0f;
#pragma unroll
            for (int c = 0; c < ATT_TILE_HD / 32; c++)
                if (c < per)
                    d += sq[k][lane + 32 * c] * att_load(kb + r * hd, lane + 32 * c);
            float sc = kcuda_warp_sum(d) * a.scale;
            float mn = fmaxf(m[u], sc), cold = expf(m[u] - mn), e = expf(sc - mn);
            l[u] = l[u] * cold + e;
#pragma unroll
            for (int c = 0; c < ATT_TILE_HD / 32; c++)
                if (c < per)
                    o[u][c] = o[u][c] * cold + e * att_load(vb + r * hd, lane + 32 * c);
            m[u] = mn;
        }
        bool full = mode == KCUDA_ATT_FULL && parts == 1;
        float *dst =
            att_dst(out, out_stride, rec_stride, part, i, h, h0, h1 - h0, parts, z, hd, full);
#pragma unroll
        for (int c = 0; c < ATT_TILE_HD / 32; c++)
            if (c < per)
                att_put(dst, lane + 32 * c, o[u][c], l[u], full);
        if (lane == 0)
            att_put_stats(dst, hd, m[u], l[u], full);
    }
}

/* The parts of each (token, head) (records of hd + 2 floats, part after part) merged in order as
 * katt_merge does, into the finished output (FULL) or the record. */
__global__ void att_join_kernel(const float *part, int parts, int hd, int mode, int h0,
                                float *out, int64_t out_stride, int64_t rec_stride)
{
    kcuda_let_next_start(); /* wo's matmul may start (kcuda_set_matmul_early) */
    int i = blockIdx.x, h = h0 + blockIdx.y;
    const float *p = part + ((int64_t)i * gridDim.y + blockIdx.y) * parts * (hd + 2);
    __shared__ float f[KCUDA_ATT_MAX_PARTS];
    __shared__ float M, L;
    if (threadIdx.x == 0) {
        float mx = -INFINITY, sum = 0.0f;
        for (int z = 0; z < parts; z++)
            if (p[z * (hd + 2) + hd + 1] > 0)
                mx = fmaxf(mx, p[z * (hd + 2) + hd]);
        for (int z = 0; z < parts; z++) {
            const float *r = p + z * (hd + 2);
            f[z] = r[hd + 1] > 0 ? expf(r[hd] - mx) : 0.0f;
            sum += r[hd + 1] * f[z];
        }
        M = mx;
        L = sum;
    }
    __syncthreads();
    bool full = mode == KCUDA_ATT_FULL;
    float *dst = att_dst(out, out_stride, rec_stride, NULL, i, h, h0, gridDim.y, 1, 0, hd, full);
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float acc = 0.0f;
        for (int z = 0; z < parts; z++)
            acc += p[z * (hd + 2) + e] * f[z];
        att_put(dst, e, acc, L, full);
    }
    if (threadIdx.x == 0)
        att_put_stats(dst, hd, M, L, full);
}

void kcuda_set_att_keys(kcuda *g, int keys)
{
    g->att_keys = keys == 1 ? 1 : 4;
}

void kcuda_set_att_tile(kcuda *g, int how)
{
    g->att_tile = how == KCUDA_TILE_ON || how == KCUDA_TILE_OFF ? how : KCUDA_TILE_AUTO;
}

int kcuda_att_tiles(const kcuda *g, const kcuda_att *a, int n)
{
    return kcuda_att_tiled(a, n, g->att_tile);
}

int kcuda_att_parts(const kcuda *g, const kcuda_att *a, int n)
{
    return g->att_part ? kcuda_att_parts_rule(a, n, g->sms, g->att_tile) : 1;
}

int kcuda_attention(kcuda *g, const kcuda_att *a, int mode, const float *q, int64_t q_stride,
                    int n, int h0, int h1, float *out, int64_t out_stride, int64_t rec_stride,
                    char *err, size_t errlen)
{
    if (kcuda_check_attention(a, mode, err, errlen))
        return -1;
    if (n <= 0 || h1 <= h0)
        return 0;
    int parts = kcuda_att_parts(g, a, n);
    dim3 grid(n, h1 - h0, parts);
    g->launches++;
    bool f16 = a->type == KV_F16;
    if (kcuda_att_tiled(a, n, g->att_tile)) {
        int gs = a->n_heads / a->n_kv_heads;
        dim3 tgrid(n, (h1 - 1) / gs - h0 / gs + 1, parts);
        auto tk = f16 ? att_tile_kernel<__half> : att_tile_kernel<float>;
        tk<<<tgrid, 32 * ATT_WARPS, 0, g->stream>>>(*a, mode, q, q_stride, h0, h1, n, out,
                                                     out_stride, rec_stride, g->att_part);
    } else {
        auto k = f16 ? (g->att_keys == 1 ? att_kernel<__half, 1> : att_kernel<__half, 4>)
                     : (g->att_keys == 1 ? att_kernel<float, 1> : att_kernel<float, 4>);
        k<<<grid, 32 * ATT_WARPS, 0, g->stream>>>(*a, mode, q, q_stride, h0, out, out_stride,
                                                   rec_stride, g->att_part);
    }
    if (parts > 1) {
        g->launches++;
        att_join_kernel<<<dim3(n, h1 - h0), 64, 0, g->stream>>>(g->att_part, parts, a->head_dim,
                                                                mode, h0, out, out_stride,
                                                                rec_stride);
    }
    return 0;
}

__global__ void att_merge_kernel(const float *pd, const float *ps, int64_t rec_tok,
                                 int64_t rec_head, const int32_t *heads, int head_dim, float *out,
                                 int64_t out_stride)
{
    int i = blockIdx.x, h = heads[blockIdx.y];
    const float *d = pd + (int64_t)i * rec_tok + (int64_t)h * rec_head;
    const float *s = ps + (int64_t)i * rec_tok + (int64_t)h * rec_head;
    float md = d[head_dim], ld = d[head_dim + 1], ms = s[head_dim], ls = s[head_dim + 1];
    float M = ld > 0 && ls > 0 ? fmaxf(md, ms) : ld > 0 ? md : ms;
    float fd = ld > 0 ? expf(md - M) : 0.0f, fs = ls > 0 ? expf(ms - M) : 0.0f;
    float L = ld * fd + ls * fs, inv = L > 0 ? 1.0f / L : 0.0f;
    float *o = out + (int64_t)i * out_stride + (int64_t)h * head_dim;
    for (int e = threadIdx.x; e < head_dim; e += blockDim.x)
        o[e] = (d[e] * fd + s[e] * fs) * inv;
}

void kcuda_att_merge(kcuda *g, const float *pd, const float *ps, int64_t rec_tok, int64_t rec_head,
                     const int32_t *heads, int n_heads_list, int n, int head_dim, float *out,
                     int64_t out_stride)
{
    if (n <= 0 || n_heads_list <= 0)
        return;
    dim3 grid(n, n_heads_list);
    g->launches++;
    att_merge_kernel<<<grid, 64, 0, g->stream>>>(pd, ps, rec_tok, rec_head, heads, head_dim, out,
                                                 out_stride);
}
