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

/* One finished (token, head): the output normalised (FULL) or the record (outputs, max, sum). */
__device__ static inline void att_put(float *dst, int e, float acc, float L, bool full)
{
    dst[e] = full ? (L > 0 ? acc / L : 0.0f) : acc;
}

template <typename T, int ATT_KEYS>
__global__ void att_kernel(kcuda_att a, int mode, const float *q, int64_t q_stride, int h0,
                           float *out, int64_t out_stride, int64_t rec_stride, float *part)
{
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
#pragma unroll
        for (int sh = 16; sh > 0; sh >>= 1)
#pragma unroll
            for (int b = 0; b < ATT_KEYS; b++)
                s[b] += __shfl_xor_sync(0xffffffffu, s[b], sh);
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
    float *dst = parts > 1 ? part + (((int64_t)i * gridDim.y + blockIdx.y) * parts + z) * (hd + 2)
                 : full    ? out + (int64_t)i * out_stride + (int64_t)h * hd
                           : out + (int64_t)i * out_stride + (int64_t)h * rec_stride;
    for (int c = 0; c < per; c++) {
        int e = lane + 32 * c;
        float acc = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            acc += so[w][e] * f[w];
        att_put(dst, e, acc, L, full);
    }
    if (!full && lane == 0) {
        dst[hd] = M;
        dst[hd + 1] = L;
    }
}

/* The parts of each (token, head) (records of hd + 2 floats, part after part) merged in order as
 * katt_merge does, into the finished output (FULL) or the record. */
__global__ void att_join_kernel(const float *part, int parts, int hd, int mode, int h0,
                                float *out, int64_t out_stride, int64_t rec_stride)
{
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
    float *dst = full ? out + (int64_t)i * out_stride + (int64_t)h * hd
                      : out + (int64_t)i * out_stride + (int64_t)h * rec_stride;
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float acc = 0.0f;
        for (int z = 0; z < parts; z++)
            acc += p[z * (hd + 2) + e] * f[z];
        att_put(dst, e, acc, L, full);
    }
    if (!full && threadIdx.x == 0) {
        dst[hd] = M;
        dst[hd + 1] = L;
    }
}

void kcuda_set_att_keys(kcuda *g, int keys)
{
    g->att_keys = keys == 1 ? 1 : 4;
}

int kcuda_att_parts(const kcuda *g, const kcuda_att *a, int n)
{
    return g->att_part ? kcuda_att_parts_rule(a, n, g->sms) : 1;
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
    if (f16 && g->att_keys == 1)
        att_kernel<__half, 1><<<grid, 32 * ATT_WARPS, 0, g->stream>>>(
            *a, mode, q, q_stride, h0, out, out_stride, rec_stride, g->att_part);
    else if (f16)
        att_kernel<__half, 4><<<grid, 32 * ATT_WARPS, 0, g->stream>>>(
            *a, mode, q, q_stride, h0, out, out_stride, rec_stride, g->att_part);
    else if (g->att_keys == 1)
        att_kernel<float, 1><<<grid, 32 * ATT_WARPS, 0, g->stream>>>(
            *a, mode, q, q_stride, h0, out, out_stride, rec_stride, g->att_part);
    else
        att_kernel<float, 4><<<grid, 32 * ATT_WARPS, 0, g->stream>>>(
            *a, mode, q, q_stride, h0, out, out_stride, rec_stride, g->att_part);
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
