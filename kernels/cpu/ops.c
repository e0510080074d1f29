/*
 * kernels/cpu/ops.c — the elementwise and reduction ops of the Llama block: rmsnorm, rope
 * (adjacent-pair convention, as GGUF llama files store Q/K), silu*mul, softmax and a float dot.
 * They are a small share of a step's time next to the matmuls, so they stay plain C that the
 * compiler vectorises; k_dot is explicit (AVX2, or NEON with the AVX2 code's order of additions,
 * so both give the same bits) because attention leans on it.
 */
#include <math.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vexp.h"

float k_dot(const float *a, const float *b, int n)
{
    int i = 0;
    float s = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8)
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    __m256 v = _mm256_add_ps(acc0, acc1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    s = _mm_cvtss_f32(h);
#elif defined(__ARM_NEON) && defined(__aarch64__)
    /* the AVX2 code's two 8-lane accumulators as four 4-lane ones, reduced in its order */
    float32x4_t a0l = vdupq_n_f32(0), a0h = a0l, a1l = a0l, a1h = a0l;
    for (; i + 16 <= n; i += 16) {
        a0l = vfmaq_f32(a0l, vld1q_f32(a + i), vld1q_f32(b + i));
        a0h = vfmaq_f32(a0h, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        a1l = vfmaq_f32(a1l, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        a1h = vfmaq_f32(a1h, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 8 <= n; i += 8) {
        a0l = vfmaq_f32(a0l, vld1q_f32(a + i), vld1q_f32(b + i));
        a0h = vfmaq_f32(a0h, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
    }
    s = k_hsum8_neon(vaddq_f32(a0l, a1l), vaddq_f32(a0h, a1h));
#endif
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

void k_rmsnorm(float *out, const float *x, const float *weight, int n, float eps)
{
    /* the sum of squares in double, in four interleaved partial sums (one dependent chain of n
     * adds cost a decode step 60 such chains: about 2% of a small model's step) */
    double ss4[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++)
            ss4[k] += (double)x[i + k] * x[i + k];
    for (; i < n; i++)
        ss4[i % 4] += (double)x[i] * x[i];
    double ss = (ss4[0] + ss4[2]) + (ss4[1] + ss4[3]);
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (i = 0; i < n; i++)
        out[i] = x[i] * scale * weight[i];
}

void k_rope_freqs(double *inv, int rot_dim, float base)
{
    for (int i = 0; i < rot_dim / 2; i++)
        inv[i] = pow(base, -2.0 * i / rot_dim);
}

void k_rope_angles(float *cs, float *sn, const double *inv, int half, int pos)
{
    for (int i = 0; i < half; i++) {
        double theta = pos * inv[i];
        cs[i] = (float)cos(theta);
        sn[i] = (float)sin(theta);
    }
}

void k_rope_apply(float *x, int n_heads, int head_dim, int half, const float *cs, const float *sn)
{
    /* the same inner loop for every head, so an element's arithmetic never depends on how many
     * heads a column part holds (a compiler may vectorise the inner loop, but identically for
     * each head) */
    for (int h = 0; h < n_heads; h++) {
        float *p = x + (int64_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            float a = p[2 * i], b = p[2 * i + 1];
            p[2 * i] = a * cs[i] - b * sn[i];
            p[2 * i + 1] = a * sn[i] + b * cs[i];
        }
    }
}

void k_rope_apply_neox(float *x, int n_heads, int head_dim, int half, const float *cs,
                       const float *sn)
{
    for (int h = 0; h < n_heads; h++) {
        float *p = x + (int64_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            float a = p[i], b = p[i + half];
            p[i] = a * cs[i] - b * sn[i];
            p[i + half] = a * sn[i] + b * cs[i];
        }
    }
}

#if defined(__AVX2__) && defined(__FMA__)
/* silu(g) * u for eight lanes (e^x clamped at 88: beyond it silu(g) is 0 to float precision) */
static inline __m256 k_silu8(__m256 g, __m256 u)
{
    __m256 e =
        k_exp8(_mm256_min_ps(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(88.0f)));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}
#endif

void k_silu_mul(float *gate, const float *up, int n)
{
    int i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    /* a prompt chunk runs this over 64 x ffn values per layer: eight lanes at a time */
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(gate + i, k_silu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < n) {
        /* the tail goes through the same lanes (padded), so an element's value never depends on
         * where a column part's range starts or ends */
        float gt[8] = {0}, ut[8] = {0};
        int m = n - i;
        memcpy(gt, gate + i, (size_t)m * sizeof(float));
        memcpy(ut, up + i, (size_t)m * sizeof(float));
        _mm256_storeu_ps(gt, k_silu8(_mm256_loadu_ps(gt), _mm256_loadu_ps(ut)));
        memcpy(gate + i, gt, (size_t)m * sizeof(float));
        i = n;
    }
#endif
    for (; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void k_softmax(float *x, int n)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        mx = fmaxf(mx, x[i]);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int i = 0; i < n; i++)
        x[i] *= inv;
}

int32_t k_argmax(const float *x, int n)
{
    /* two passes over the row: the largest value (eight lanes of maxima, NaNs never taken), then
     * its first index */
    float mx = -INFINITY;
    int i = 0;
#if defined(__AVX2__)
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
    for (; i + 16 <= n; i += 16) { /* max(v, m): m where v is NaN */
        m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, _mm256_max_ps(m0, m1));
    for (int l = 0; l < 8; l++)
        mx = lanes[l] > mx ? lanes[l] : mx;
#endif
    for (; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    i = 0;
#if defined(__AVX2__)
    __m256 want = _mm256_set1_ps(mx);
    for (; i + 8 <= n; i += 8)
        if (_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), want, _CMP_EQ_OQ)))
            break;
#endif
    for (; i < n; i++)
        if (x[i] == mx)
            return i;
    return 0;
}

int k_top(const float *x, int n, int k, int32_t *ids)
{
    int got = 0;
    float floor = 0; /* the k-th best so far, once there are k */
    for (int i = 0; i < n && k > 0; i++) {
        float v = x[i];
        if (got == k ? !(v > floor) : v != v)
            continue;
        int j = got < k ? got++ : k - 1;
        for (; j > 0 && v > x[ids[j - 1]]; j--)
            ids[j] = ids[j - 1];
        ids[j] = i;
        floor = x[ids[got - 1]];
    }
    return got;
}

float k_sum_exp(const float *x, int n, float mx)
{
    int i = 0;
    float s = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 acc = _mm256_setzero_ps(), m = _mm256_set1_ps(mx);
    for (; i + 8 <= n; i += 8)
        acc = _mm256_add_ps(acc, k_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), m)));
    float part[8];
    _mm256_storeu_ps(part, acc);
    s = ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
#endif
    for (; i < n; i++)
        s += expf(x[i] - mx);
    return s;
}
