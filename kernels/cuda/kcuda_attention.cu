/*
 * kernels/cuda/kcuda_attention.cu — attention partials on the GPU (kcuda.h, kcuda_attention) and
 * their merge.
 *
 * One block of ATT_WARPS warps per (token, query head). The head's query is spread over the
 * lanes (head_dim / 32 elements each); warp w takes key positions w, w + ATT_WARPS, ... of the
 * token's key stream (the prefix rows, then the tree ancestors: the same stream katt_causal
 * reads), each score a warp reduction, and keeps its own online-softmax partial (max, sum, its
 * lanes' slice of the output). The warps' partials are then merged in shared memory exactly as
 * katt_merge does, and the block writes either the finished output (FULL) or the unnormalised
 * record the engine's merge reads (DENSE, SPARSE).
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

template <typename T>
__global__ void att_kernel(kcuda_att a, int mode, const float *q, int64_t q_stride, int h0,
                           float *out, int64_t out_stride, int64_t rec_stride)
{
    int i = blockIdx.x, h = h0 + blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int hd = a.head_dim, per = hd / 32, kvh = h / (a.n_heads / a.n_kv_heads);
    const float *qh = q + (int64_t)i * q_stride + (int64_t)h * hd;
    float qv[ATT_PER_LANE], o[ATT_PER_LANE];
    for (int c = 0; c < per; c++) {
        qv[c] = qh[lane + 32 * c];
        o[c] = 0.0f;
    }
    const T *kb = (const T *)a.k + (int64_t)kvh * a.head_rows * hd;
    const T *vb = (const T *)a.v + (int64_t)kvh * a.head_rows * hd;
    int np = (mode & KCUDA_ATT_DENSE) ? a.n_prefix[i] : 0;
    int na = (mode & KCUDA_ATT_SPARSE) ? a.n_anc[i] : 0;
    int64_t first = a.seq_row[i];
    const int32_t *anc = a.anc + (int64_t)i * a.anc_stride;
    float m = -INFINITY, l = 0.0f;
    for (int j = warp; j < np + na; j += ATT_WARPS) {
        int64_t r = j < np ? first + j : a.tree_row + anc[j - np];
        const T *kr = kb + r * hd, *vr = vb + r * hd;
        float s = 0.0f;
        for (int c = 0; c < per; c++)
            s += qv[c] * att_load(kr, lane + 32 * c);
        s = kcuda_warp_sum(s) * a.scale;
        float mn = fmaxf(m, s), cold = expf(m - mn), e = expf(s - mn);
        l = l * cold + e;
        for (int c = 0; c < per; c++)
            o[c] = o[c] * cold + e * att_load(vr, lane + 32 * c);
        m = mn;
    }
    /* the warps' partials, merged as katt_merge does */
    __shared__ float sm[ATT_WARPS], sl[ATT_WARPS], so[ATT_WARPS][KCUDA_MAX_HEAD_DIM];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    for (int c = 0; c < per; c++)
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
    for (int c = 0; c < per; c++) {
        int e = lane + 32 * c;
        float acc = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            acc += so[w][e] * f[w];
        if (mode == KCUDA_ATT_FULL)
            out[(int64_t)i * out_stride + (int64_t)h * hd + e] = L > 0 ? acc / L : 0.0f;
        else
            out[(int64_t)i * out_stride + (int64_t)h * rec_stride + e] = acc;
    }
    if (mode != KCUDA_ATT_FULL && lane == 0) {
        float *rec = out + (int64_t)i * out_stride + (int64_t)h * rec_stride;
        rec[hd] = M;
        rec[hd + 1] = L;
    }
}

int kcuda_attention(kcuda *g, const kcuda_att *a, int mode, const float *q, int64_t q_stride,
                    int n, int h0, int h1, float *out, int64_t out_stride, int64_t rec_stride,
                    char *err, size_t errlen)
{
    if (kcuda_check_attention(a, mode, err, errlen))
        return -1;
    if (n <= 0 || h1 <= h0)
        return 0;
    dim3 grid(n, h1 - h0);
    g->launches++;
    if (a->type == KV_F16)
        att_kernel<__half><<<grid, 32 * ATT_WARPS, 0, g->stream>>>(*a, mode, q, q_stride, h0, out,
                                                                  out_stride, rec_stride);
    else
        att_kernel<float><<<grid, 32 * ATT_WARPS, 0, g->stream>>>(*a, mode, q, q_stride, h0, out,
                                                                 out_stride, rec_stride);
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
