/*
 * tests/cuda/test_cuda_kernels.c — every op of the GPU op set (kernels/cuda/kcuda.h) against its
 * CPU twin (kernels/cpu) on fresh random inputs (the seed is printed; OROCHI_SEED=N repeats a run),
 * within the tolerances stated per op below:
 *   matmul      rows [13, 90) of 97 x 256, widths 1, 3, 8, 17, 64, every GPU type; rows outside
 *               the range untouched (Q4_K rows off 16-byte words refused, saying so). Relative
 *               L2 against kmat_mul: F32, F16, BF16 1e-5;
 *               Q8_0/Q4_0/Q4_1 2e-3 (the CPU rounds activations to 16 bits for its integer dot
 *               products). Every token's result bit for bit the same token's computed alone
 *               (the sums do not depend on the batch); on tensor cores also with the inputs in
 *               fragment order from 1 token and with none (kcuda_set_matmul_frag), and the rule
 *               choosing it on fixtures; and with the token tiles dealt to 2, 4 and 8 groups of
 *               blocks (kcuda_set_matmul_groups) at widths 17, 40, 64, and its rule on fixtures.
 *               Float rows also of 288 columns (16-byte loads, a short last span) and over
 *               columns [3, 199) (off 16-byte words: the strided reading), widths 1 and 5,
 *               every token the bits of the token alone. kcuda_matmul_blas (cuBLAS)
 *               for the float types: F32 1e-5, F16 3e-3 and BF16 1.5e-2 (it rounds activations
 *               to the weight's type).
 *   tc weights  the weights the tensor cores multiply, read out by one-hot inputs (Q8_0, Q4_0,
 *               Q5_0, IQ4_NL: the CPU's dequantized weights rounded to f16, bit for bit; Q4_1,
 *               Q5_1: within half an f16 step of them).
 *   rmsnorm, rope, silu*mul, residual add, embedding rows: max relative error 1e-5 (2e-5 silu).
 *   attention   FULL, DENSE, SPARSE over prefixes of 0..1030 rows and tree ancestors, f32 and f16
 *               K/V, each stream whole and cut into 3, 16 and 256 parts (kcuda_att_parts), a warp
 *               scoring 4 keys at a time and 1, the tiled kernel (kcuda_set_att_tile), query
 *               heads [2, 7) alone: finished outputs 1e-5 relative L2 against
 *               katt_causal_group; partial records compared normalised, and their log-sum-exp
 *               (max + log sum) within 1e-4. The rule choosing the parts on fixtures.
 *   merge       the GPU's merge of the CPU's partial records against katt_merge + katt_finish:
 *               each output within 5e-6 of the size of the two terms it sums.
 *   matmul over input columns [64, 192) (the Megatron partial; [48, 192) for the float types,
 *               a short last block) against kmat_mul_cols, the same tolerances.
 *   kv_store    f32 rows copied and f16 rows rounded bit for bit as kt_f32_to_f16; copy3d (and
 *               copy3d_pz, planes apart by other pitches on each side) copies
 *               exactly its blocks; a captured graph replays an op on new input (1e-5).
 *   fused      kcuda_matmul_multi, kcuda_matmul_add, kcuda_matmul_silu (every type, widths 1, 17)
 *               and kcuda_rope_store (f32, f16 K/V) bit for bit the ops each replaces; matrices
 *               of two types refused with the reason. The quantized matmul with 2 and 4 groups
 *               in flight per lane (kcuda_set_matmul_unroll) bit for bit the matmul with 1.
 *   tc depth    on tensor cores, steps of 1 and 5 tokens with 8 blocks in flight a warp
 *               (kcuda_set_matmul_depth) bit for bit those with 4, every quantized type, plain
 *               and gate/up; the rule (kcuda_depth_rule) on fixtures and as reported.
 *   mapped host memory (kcuda_register, the arena's path): an op writes into registered host
 *               memory and the host reads the result.
 * Without a usable GPU it prints why and exits 77, which ctest reports as skipped.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kcuda.h"
#include "kernels/cuda/kcuda_check.h"
#include "tests/unit/testutil.h"

static unsigned long long rng;
static int failures;

static float frand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xffffff) / (float)0x800000 - 1.0f; /* [-1, 1) */
}

static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = frand() * scale;
}

static double max_rel(const float *a, const float *ref, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]) / (fabs(ref[i]) > 1e-3 ? fabs(ref[i]) : 1e-3);
        m = d > m ? d : m;
    }
    return m;
}

static void check(const char *what, double err, double tol)
{
    bool ok = err <= tol && !isnan(err);
    printf("  %-48s error %.3g (tolerance %.3g) %s\n", what, err, tol, ok ? "ok" : "FAILED");
    if (!ok)
        failures++;
}

static void check_int(const char *what, long got, long want)
{
    bool ok = got == want;
    printf("  %-48s %ld (want %ld) %s\n", what, got, want, ok ? "ok" : "FAILED");
    if (!ok)
        failures++;
}

static kcuda *g;
static char err[512];

static void must(int rc, const char *what)
{
    if (rc) {
        printf("%s: %s\n", what, err);
        exit(1);
    }
}

static void *to_dev(const void *host, size_t bytes)
{
    void *d = kcuda_alloc(bytes);
    if (!d) {
        printf("cannot allocate %zu bytes on the GPU\n", bytes);
        exit(1);
    }
    must(kcuda_upload(g, d, host, bytes, err, sizeof err), "upload");
    return d;
}

static void from_dev(void *host, const void *dev, size_t bytes)
{
    must(kcuda_download(g, host, dev, bytes, err, sizeof err), "download");
    must(kcuda_sync(g, err, sizeof err), "sync");
}

/* Every type the GPU takes, in matmul order; the float types first. */
static const uint32_t all_types[] = {KT_F32,   KT_F16,    KT_BF16, KT_Q8_0, KT_Q4_0,
                                     KT_Q4_1,  KT_Q5_0,   KT_Q5_1, KT_IQ4_NL, KT_Q2_K,
                                     KT_Q3_K,  KT_Q4_K,   KT_Q5_K, KT_Q6_K};
#define N_TYPES (sizeof all_types / sizeof all_types[0])
#define N_FLOAT 3

/* Whether a matmul of n tokens (rows [lo, hi) of dw into dy, `rows` apart) gives every token the
 * bits of the same token alone (`alone`): over a sentinel, so that a pass no block took shows;
 * with `add` also as the residual form over ones (1 + the token alone's, bit for bit), so that a
 * pass two blocks took shows. */
static bool alone_bits(const kmat *dw, int64_t lo, int64_t hi, int64_t rows, const float *dx, int n,
                       float *dy, float *got, const float *alone, bool add)
{
    size_t count = (size_t)n * (size_t)rows;
    bool same = true;
    for (int form = 0; form < (add ? 2 : 1); form++) {
        for (size_t i = 0; i < count; i++)
            got[i] = form ? 1.0f : 12345.0f;
        must(kcuda_upload(g, dy, got, count * 4, err, sizeof err), "upload");
        must(form ? kcuda_matmul_add(g, dw, lo, hi, dx, n, dy, rows, err, sizeof err)
                  : kcuda_matmul(g, dw, lo, hi, dx, n, dy, rows, err, sizeof err),
             "matmul");
        from_dev(got, dy, count * 4);
        for (int i = 0; i < n; i++)
            for (int64_t r = lo; r < hi; r++)
                same &= form ? got[i * rows + r] == 1.0f + alone[i * rows + r]
                             : !memcmp(&got[i * rows + r], &alone[i * rows + r], 4);
    }
    return same;
}

/* The quantized matmul of one type on kind `kind` (KCUDA_MM_SIMT or _TC) against kmat_mul: rows
 * [lo, hi) of 97 x 512 at widths 1, 3, 8, 17, 64, every token's bits those of the token alone,
 * and input columns [c0, c1) (the Megatron partial). */
static void matmul_case(uint32_t type, int kind, const float *wf, const float *x, float *dx,
                        float *dy, float *ref, float *got, float *alone)
{
    const int widths[] = {1, 3, 8, 17, 64};
    int64_t rows = 97, cols = 512, lo = 13, hi = 90;
    bool flt = type == KT_F32 || type == KT_F16 || type == KT_BF16;
    /* the quantized types on CUDA cores 2e-3: the CPU rounds activations to 16 bits for its
     * integer dot products; on tensor cores 1.5e-3: both weights and activations go to f16 (the
     * emulation measures 2.5e-4 to 4e-4) */
    double tol = flt ? 1e-5 : kind == KCUDA_MM_TC ? 1.5e-3 : 2e-3;
    const char *kn = kind == KCUDA_MM_TC ? ", tensor cores" : "";
    kcuda_set_matmul_kind(g, kind);
    size_t rb = kt_row_bytes(type, (uint64_t)cols);
    uint8_t *wq = malloc(rb * (size_t)rows);
    for (int64_t r = 0; r < rows; r++)
        kt_quantize_row(type, wf + r * cols, wq + (size_t)r * rb, cols);
    kmat w = {.type = type, .rows = rows, .cols = cols, .row_bytes = rb, .data = wq};
    kmat dw = w;
    dw.data = to_dev(wq, rb * (size_t)rows);
    const char *tn = kt_traits_of(type)->name;
    /* every token alone: the batched results must be these bits */
    for (size_t i = 0; i < (size_t)(64 * rows); i++)
        alone[i] = 12345.0f;
    must(kcuda_upload(g, dy, alone, (size_t)(64 * rows) * 4, err, sizeof err), "upload");
    for (int i = 0; i < 64; i++)
        must(kcuda_matmul(g, &dw, lo, hi, dx + i * cols, 1, dy + i * rows, rows, err, sizeof err),
             "matmul");
    from_dev(alone, dy, (size_t)(64 * rows) * 4);
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        int n = widths[wi];
        for (size_t i = 0; i < (size_t)(n * rows); i++)
            ref[i] = got[i] = 12345.0f; /* outside [lo, hi) stays */
        kmat_mul(NULL, &w, lo, hi, x, n, ref, rows, NULL);
        must(kcuda_upload(g, dy, got, (size_t)(n * rows) * 4, err, sizeof err), "upload");
        must(kcuda_matmul(g, &dw, lo, hi, dx, n, dy, rows, err, sizeof err), "matmul");
        from_dev(got, dy, (size_t)(n * rows) * 4);
        double e = 0;
        bool kept = true;
        for (int i = 0; i < n; i++) {
            double ei = tu_rel_l2(got + i * rows + lo, ref + i * rows + lo, (size_t)(hi - lo));
            e = ei > e ? ei : e;
            for (int64_t r = 0; r < rows; r++)
                if ((r < lo || r >= hi) && got[i * rows + r] != 12345.0f)
                    kept = false;
        }
        char what[96];
        snprintf(what, sizeof what, "matmul %s width %d%s", tn, n, kn);
        check(what, e, tol);
        if (!kept) {
            printf("  %s: wrote rows outside [%lld, %lld)\n", what, (long long)lo, (long long)hi);
            failures++;
        }
        if (memcmp(got, alone, (size_t)(n * rows) * 4)) {
            printf("  %s: a token's result differs from the same token alone\n", what);
            failures++;
        }
        if (flt) {
            const double tol_blas = type == KT_F32 ? 1e-5 : type == KT_F16 ? 3e-3 : 1.5e-2;
            must(kcuda_matmul_blas(g, &dw, lo, hi, dx, n, dy, rows, err, sizeof err),
                 "matmul_blas");
            from_dev(got, dy, (size_t)(n * rows) * 4);
            e = 0;
            for (int i = 0; i < n; i++) {
                double ei = tu_rel_l2(got + i * rows + lo, ref + i * rows + lo, (size_t)(hi - lo));
                e = ei > e ? ei : e;
            }
            snprintf(what, sizeof what, "matmul %s width %d, cuBLAS", tn, n);
            check(what, e, tol_blas);
        }
    }
    /* tensor cores with the inputs in fragment order from 1 token (k_xfrag) and with none:
     * every token the bits of the token alone (which reads the f32 rows) */
    for (int f = 0; kind == KCUDA_MM_TC && f < 2; f++) {
        kcuda_set_matmul_frag(g, f ? KCUDA_FRAG_OFF : KCUDA_FRAG_ON);
        for (int n = 1; n <= 64; n = n == 1 ? 3 : n == 3 ? 17 : 64) {
            bool same = alone_bits(&dw, lo, hi, rows, dx, n, dy, got, alone, false);
            printf("  matmul %s width %d, tensor cores, inputs %s: %s\n", tn, n,
                   f ? "read in place" : "in fragment order", same ? "ok" : "FAILED");
            failures += !same;
            if (n == 64)
                break;
        }
    }
    kcuda_set_matmul_frag(g, KCUDA_FRAG_AUTO);
    /* tensor cores with the token tiles dealt to 2, 4 and 8 groups of blocks (gridDim.y), the
     * inputs in fragment order and not: every token the bits of the token alone */
    for (int gr = 2; kind == KCUDA_MM_TC && gr <= 8; gr *= 2) {
        kcuda_set_matmul_groups(g, gr);
        for (int f = 0; f < 2; f++) {
            kcuda_set_matmul_frag(g, f ? KCUDA_FRAG_OFF : KCUDA_FRAG_ON);
            for (int n = 17; n <= 64; n = n == 17 ? 40 : 64) {
                bool same = alone_bits(&dw, lo, hi, rows, dx, n, dy, got, alone, true);
                printf("  matmul %s width %d, tensor cores, %d token groups (%d used)%s: %s\n",
                       tn, n, gr, kcuda_matmul_groups(g, type, n),
                       f ? "" : ", fragment order", same ? "ok" : "FAILED");
                failures += !same;
                if (n == 64)
                    break;
            }
        }
    }
    kcuda_set_matmul_groups(g, 0);
    kcuda_set_matmul_frag(g, KCUDA_FRAG_AUTO);
    /* input columns [c0, c1) only (the Megatron partial), x holding that slice: [48, 192) for
     * the float types (a short last block of 32), [64, 192) for the 32-blocks, [256, 512) for
     * the K-quants (whole super-blocks) */
    int64_t blk = kt_traits_of(type)->block;
    int64_t c0 = flt ? 48 : blk == 256 ? 256 : 64, c1 = blk == 256 ? 512 : 192, k = c1 - c0;
    float *xs = malloc((size_t)(17 * k) * 4);
    for (int t2 = 0; t2 < 17; t2++)
        memcpy(xs + t2 * k, x + t2 * cols + c0, (size_t)k * 4);
    float *dxs = to_dev(xs, (size_t)(17 * k) * 4);
    for (int n = 8; n <= 17; n += 9) {
        if (kmat_mul_cols(NULL, &w, lo, hi, c0, c1, xs, n, ref, rows, NULL))
            failures++;
        must(kcuda_matmul_cols(g, &dw, lo, hi, c0, c1, dxs, n, dy, rows, err, sizeof err),
             "matmul_cols");
        from_dev(got, dy, (size_t)(n * rows) * 4);
        double e = 0;
        for (int i = 0; i < n; i++) {
            double ei = tu_rel_l2(got + i * rows + lo, ref + i * rows + lo, (size_t)(hi - lo));
            e = ei > e ? ei : e;
        }
        char what[96];
        snprintf(what, sizeof what, "matmul %s columns [%lld, %lld) width %d%s", tn,
                 (long long)c0, (long long)c1, n, kn);
        check(what, e, tol);
    }
    /* a range off the type's blocks is refused, saying so */
    if (!flt) {
        int bad = kcuda_matmul_cols(g, &dw, lo, hi, c0 + 16, c1, dxs, 1, dy, rows, err,
                                    sizeof err);
        bool said = bad && strstr(err, "not on the type's blocks");
        printf("  matmul %s columns off its blocks refused: %s (%s)\n", tn, said ? "ok" : "FAILED",
               err);
        failures += !said;
    }
    kcuda_free(dxs);
    free(xs);
    kcuda_free((void *)dw.data);
    free(wq);
    kcuda_set_matmul_kind(g, KCUDA_MM_AUTO);
}

/* Float rows both ways k_matmul reads them: whole rows of 288 columns (16-byte loads, the last
 * span of 256 short) and input columns [3, 199) (the rows off 16-byte words: every 32nd column a
 * lane), each at widths 1 and 5 against kmat_mul / kmat_mul_cols within 1e-5, every token the bits
 * of the token alone. */
static void test_float_rows(void)
{
    enum { ROWS = 37 };
    const int64_t rows = ROWS, cols = 288, c0s[2] = {0, 3}, c1s[2] = {288, 199};
    float *wf = malloc((size_t)(rows * cols) * 4), *x = malloc((size_t)(5 * cols) * 4);
    float ref[5 * ROWS], got[5 * ROWS], one[ROWS];
    fill(wf, (size_t)(rows * cols), 1.0f);
    fill(x, (size_t)(5 * cols), 1.0f);
    float *dy = kcuda_alloc((size_t)(5 * rows) * 4);
    for (size_t t = 0; t < N_FLOAT; t++) {
        size_t rb = kt_row_bytes(all_types[t], (uint64_t)cols);
        uint8_t *wq = malloc(rb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++)
            kt_quantize_row(all_types[t], wf + r * cols, wq + (size_t)r * rb, cols);
        kmat w = {
            .type = all_types[t], .rows = rows, .cols = cols, .row_bytes = rb, .data = wq};
        kmat dw = w;
        dw.data = to_dev(wq, rb * (size_t)rows);
        for (int ci = 0; ci < 2; ci++) {
            int64_t c0 = c0s[ci], c1 = c1s[ci], k = c1 - c0;
            float *xs = malloc((size_t)(5 * k) * 4);
            for (int i = 0; i < 5; i++)
                memcpy(xs + i * k, x + i * cols + c0, (size_t)k * 4);
            float *dxs = to_dev(xs, (size_t)(5 * k) * 4);
            for (int n = 1; n <= 5; n += 4) {
                if (kmat_mul_cols(NULL, &w, 0, rows, c0, c1, xs, n, ref, rows, NULL))
                    failures++;
                must(kcuda_matmul_cols(g, &dw, 0, rows, c0, c1, dxs, n, dy, rows, err,
                                       sizeof err),
                     "matmul_cols");
                from_dev(got, dy, (size_t)(n * rows) * 4);
                double e = 0;
                bool same = true;
                for (int i = 0; i < n; i++) {
                    double ei = tu_rel_l2(got + i * rows, ref + i * rows, (size_t)rows);
                    e = ei > e ? ei : e;
                    must(kcuda_matmul_cols(g, &dw, 0, rows, c0, c1, dxs + i * k, 1, dy, rows,
                                           err, sizeof err),
                         "matmul_cols");
                    from_dev(one, dy, (size_t)rows * 4);
                    same &= !memcmp(one, got + i * rows, (size_t)rows * 4);
                }
                char what[96];
                snprintf(what, sizeof what, "matmul %s rows of %lld, columns [%lld, %lld) width %d",
                         kt_traits_of(all_types[t])->name, (long long)cols, (long long)c0,
                         (long long)c1, n);
                check(what, e, 1e-5);
                if (!same) {
                    printf("  %s: a token's result differs from the same token alone\n", what);
                    failures++;
                }
            }
            kcuda_free(dxs);
            free(xs);
        }
        kcuda_free((void *)dw.data);
        free(wq);
    }
    kcuda_free(dy);
    free(wf), free(x);
}

static void test_matmul(void)
{
    int64_t rows = 97, cols = 512;
    float *wf = malloc((size_t)(rows * cols) * 4), *x = malloc((size_t)(64 * cols) * 4);
    float *ref = malloc((size_t)(64 * rows) * 4), *got = malloc((size_t)(64 * rows) * 4);
    float *alone = malloc((size_t)(64 * rows) * 4);
    fill(wf, (size_t)(rows * cols), 1.0f);
    fill(x, (size_t)(64 * cols), 1.0f);
    float *dx = to_dev(x, (size_t)(64 * cols) * 4);
    float *dy = kcuda_alloc((size_t)(64 * rows) * 4);
    for (size_t t = 0; t < N_TYPES; t++) {
        matmul_case(all_types[t], KCUDA_MM_SIMT, wf, x, dx, dy, ref, got, alone);
        if (t >= N_FLOAT)
            matmul_case(all_types[t], KCUDA_MM_TC, wf, x, dx, dy, ref, got, alone);
    }
    /* the kind a type runs on: floats on CUDA cores whatever is asked; by default all of them */
    kcuda_set_matmul_kind(g, KCUDA_MM_TC);
    check_int("bf16 under KCUDA_MM_TC runs on CUDA cores", kcuda_matmul_kind(g, KT_BF16),
              KCUDA_MM_SIMT);
    check_int("Q4_K under KCUDA_MM_TC runs on tensor cores", kcuda_matmul_kind(g, KT_Q4_K),
              KCUDA_MM_TC);
    kcuda_set_matmul_kind(g, KCUDA_MM_SIMT);
    check_int("Q4_K under KCUDA_MM_SIMT runs on CUDA cores", kcuda_matmul_kind(g, KT_Q4_K),
              KCUDA_MM_SIMT);
    kcuda_set_matmul_kind(g, KCUDA_MM_AUTO);
    check_int("Q4_K by default runs on tensor cores", kcuda_matmul_kind(g, KT_Q4_K), KCUDA_MM_TC);
    check_int("F16 by default runs on CUDA cores", kcuda_matmul_kind(g, KT_F16), KCUDA_MM_SIMT);
    /* Q4_K rows are read by 16-byte words: rows at an address off them are refused, saying so */
    uint8_t *odd = kcuda_alloc(2 * 144 + 16);
    kmat wodd = {.type = KT_Q4_K, .rows = 2, .cols = 256, .row_bytes = 144, .data = odd + 8};
    int bad = kcuda_matmul(g, &wodd, 0, 2, dx, 1, dy, 2, err, sizeof err);
    bool said = bad && strstr(err, "by 16-byte words");
    printf("  matmul of Q4_K rows off 16-byte words refused: %s (%s)\n", said ? "ok" : "FAILED", err);
    failures += !said;
    kcuda_free(odd);
    kcuda_free(dx);
    kcuda_free(dy);
    free(wf);
    free(x);
    free(ref);
    free(got);
    free(alone);
}

/* The weights the tensor cores multiply (km_group_h2: the codes straight into f16), read out by
 * one-hot inputs: token i's input is 1 at column c0 + i and 0 elsewhere, so its output in row r is
 * weight (r, c0 + i) as an f16 value (times 1, plus zeros: exact). Against the CPU's dequantized
 * rows (kt_dequantize_row, a reader written apart): for Q8_0, Q4_0, Q5_0 and IQ4_NL d times the
 * code (or level) is exact, and must come out rounded to f16 as kt_f32_to_f16 rounds it, bit for
 * bit; Q4_1's and Q5_1's d c + m is rounded once, so within half an f16 step of the CPU's f32
 * value (which is d c + m rounded to f32: 2^-24 of it more). Rows of 256 columns, random
 * weights. */
static void test_tc_weights(void)
{
    const uint32_t types[] = {KT_Q8_0, KT_Q4_0, KT_Q5_0, KT_IQ4_NL, KT_Q4_1, KT_Q5_1};
    const int64_t rows = 32, cols = 256;
    float *wf = malloc((size_t)(rows * cols) * 4), *deq = malloc((size_t)(rows * cols) * 4);
    float *x = calloc((size_t)(64 * cols), 4), *got = malloc((size_t)(64 * rows) * 4);
    fill(wf, (size_t)(rows * cols), 1.0f);
    float *dx = kcuda_alloc((size_t)(64 * cols) * 4), *dy = kcuda_alloc((size_t)(64 * rows) * 4);
    kcuda_set_matmul_kind(g, KCUDA_MM_TC);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const uint32_t type = types[t];
        const bool exact = type != KT_Q4_1 && type != KT_Q5_1;
        size_t rb = kt_row_bytes(type, (uint64_t)cols);
        uint8_t *wq = malloc(rb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++) {
            kt_quantize_row(type, wf + r * cols, wq + (size_t)r * rb, cols);
            kt_dequantize_row(type, wq + (size_t)r * rb, deq + r * cols, cols);
        }
        void *dq = to_dev(wq, rb * (size_t)rows);
        kmat dw = {.type = type, .rows = rows, .cols = cols, .row_bytes = rb, .data = dq};
        long off = 0;
        double worst = 0; /* Q4_1, Q5_1: the largest distance in f16 steps */
        for (int64_t c0 = 0; c0 < cols; c0 += 64) {
            for (int i = 0; i < 64; i++)
                for (int64_t c = 0; c < cols; c++)
                    x[i * cols + c] = c == c0 + i ? 1.0f : 0.0f;
            must(kcuda_upload(g, dx, x, (size_t)(64 * cols) * 4, err, sizeof err), "upload");
            must(kcuda_matmul(g, &dw, 0, rows, dx, 64, dy, rows, err, sizeof err), "matmul");
            from_dev(got, dy, (size_t)(64 * rows) * 4);
            for (int i = 0; i < 64; i++)
                for (int64_t r = 0; r < rows; r++) {
                    const float cpu = deq[r * cols + c0 + i], tc = got[i * rows + r];
                    const uint16_t h = kt_f32_to_f16(cpu);
                    if (exact) {
                        off += tc != kt_f16_to_f32(h);
                        continue;
                    }
                    /* the f16 step at the CPU's value: the distance between its neighbours */
                    const float step = kt_f16_to_f32((uint16_t)(h | 1)) -
                                       kt_f16_to_f32((uint16_t)(h & ~1));
                    const double d = fabs((double)tc - cpu) / fabs(step);
                    worst = d > worst ? d : worst;
                    off += d > 0.5 + 1e-3;
                }
        }
        char what[96];
        if (exact)
            snprintf(what, sizeof what, "tensor cores' %s weights: the CPU's rounded to f16",
                     kt_traits_of(type)->name);
        else
            snprintf(what, sizeof what,
                     "tensor cores' %s weights: within half an f16 step (worst %.3f)",
                     kt_traits_of(type)->name, worst);
        printf("  %-72s %ld of %ld off %s\n", what, off, (long)(rows * cols),
               off ? "FAILED" : "ok");
        failures += off != 0;
        kcuda_free(dq);
        free(wq);
    }
    kcuda_set_matmul_kind(g, KCUDA_MM_AUTO);
    kcuda_free(dx);
    kcuda_free(dy);
    free(wf);
    free(deq);
    free(x);
    free(got);
}

static void test_elementwise(void)
{
    int n = 5, dim = 576, heads = 9, hd = 64, half = 32, ffn = 1536;
    size_t nx = (size_t)n * dim, nf = (size_t)n * ffn;
    float *x = malloc(nx * 4), *w = malloc((size_t)dim * 4), *ref = malloc(nf * 4);
    float *got = malloc(nf * 4), *u = malloc(nf * 4), *cs = malloc((size_t)n * half * 4);
    float *sn = malloc((size_t)n * half * 4);
    fill(x, nx, 3.0f);
    fill(w, (size_t)dim, 1.0f);
    /* rmsnorm */
    for (int t = 0; t < n; t++)
        k_rmsnorm(ref + (size_t)t * dim, x + (size_t)t * dim, w, dim, 1e-5f);
    float *dx = to_dev(x, nx * 4), *dw = to_dev(w, (size_t)dim * 4);
    float *dout = kcuda_alloc(nf * 4);
    kcuda_rmsnorm(g, dout, dx, dw, dim, n, 1e-5f);
    from_dev(got, dout, nx * 4);
    check("rmsnorm", max_rel(got, ref, nx), 1e-5);
    /* rope over the q rows (heads x hd per token) */
    double inv[32];
    k_rope_freqs(inv, 2 * half, 10000.0f);
    for (int t = 0; t < n; t++)
        k_rope_angles(cs + t * half, sn + t * half, inv, half, 17 * t + 3);
    memcpy(ref, x, nx * 4);
    for (int t = 0; t < n; t++)
        k_rope_apply(ref + (size_t)t * dim, heads, hd, half, cs + t * half, sn + t * half);
    float *dcs = to_dev(cs, (size_t)n * half * 4), *dsn = to_dev(sn, (size_t)n * half * 4);
    kcuda_rope(g, dx, n, dim, heads, hd, half, dcs, dsn);
    from_dev(got, dx, nx * 4);
    check("rope", max_rel(got, ref, nx), 1e-5);
    /* silu * mul */
    float *gt = malloc(nf * 4);
    fill(gt, nf, 6.0f);
    fill(u, nf, 2.0f);
    memcpy(ref, gt, nf * 4);
    for (int t = 0; t < n; t++)
        k_silu_mul(ref + (size_t)t * ffn, u + (size_t)t * ffn, ffn);
    float *dg = to_dev(gt, nf * 4), *du = to_dev(u, nf * 4);
    kcuda_silu_mul(g, dg, du, n, ffn, ffn);
    from_dev(got, dg, nf * 4);
    check("silu*mul", max_rel(got, ref, nf), 2e-5);
    /* residual add of columns [100, 333) */
    memcpy(ref, x, nx * 4);
    for (int t = 0; t < n; t++)
        for (int c = 100; c < 333; c++)
            ref[t * dim + c] += w[c];
    float *rows_w = malloc(nx * 4);
    for (int t = 0; t < n; t++)
        memcpy(rows_w + (size_t)t * dim, w, (size_t)dim * 4);
    float *dd = to_dev(rows_w, nx * 4), *dx2 = to_dev(x, nx * 4);
    kcuda_add_cols(g, dx2, dd, n, dim, 100, 333);
    from_dev(got, dx2, nx * 4);
    check("residual add", max_rel(got, ref, nx), 0);
    /* embedding rows of 768 (whole K super-blocks), every type, columns [64, 512) */
    const uint32_t *types = all_types;
    int vocab = 50, ed = 768;
    int32_t ids[5] = {0, 49, 7, 7, 23};
    float *tab = malloc((size_t)vocab * ed * 4), *row = malloc((size_t)ed * 4);
    fill(tab, (size_t)vocab * ed, 1.0f);
    int32_t *dids = to_dev(ids, sizeof ids);
    for (size_t t = 0; t < N_TYPES; t++) {
        size_t rb = kt_row_bytes(types[t], (uint64_t)ed);
        uint8_t *q = malloc(rb * (size_t)vocab);
        for (int r = 0; r < vocab; r++)
            kt_quantize_row(types[t], tab + (size_t)r * ed, q + (size_t)r * rb, ed);
        kmat m = {.type = types[t], .rows = vocab, .cols = ed, .row_bytes = rb, .data = q};
        for (int i = 0; i < n; i++) {
            kmat_row(&m, ids[i], row);
            memcpy(ref + (size_t)i * 448, row + 64, 448 * 4);
        }
        kmat dm = m;
        dm.data = to_dev(q, rb * (size_t)vocab);
        must(kcuda_embed(g, &dm, dids, n, dout, 448, 64, 512, err, sizeof err), "embed");
        from_dev(got, dout, (size_t)n * 448 * 4);
        char what[64];
        snprintf(what, sizeof what, "embedding rows %s", kt_traits_of(types[t])->name);
        check(what, max_rel(got, ref, (size_t)n * 448), 1e-5);
        kcuda_free((void *)dm.data);
        free(q);
    }
    kcuda_free(dids);
    void *ptrs[] = {dx, dw, dout, dcs, dsn, dg, du, dd, dx2};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        kcuda_free(ptrs[i]);
    free(x), free(w), free(ref), free(got), free(u), free(cs), free(sn), free(gt), free(rows_w);
    free(tab), free(row);
}

/* Attention: 6 tokens of two sequences, 9 query heads over 3 KV heads of 64. */
#define A_N 6
#define A_H 9
#define A_KV 3
#define A_HD 64
#define A_CTX 1100
#define A_W 8

static void test_attention(kv_type kt)
{
    int64_t head_rows = 2 * A_CTX + A_W, tree_row = 2 * A_CTX;
    size_t esz = kt == KV_F16 ? 2 : 4, kv_elems = (size_t)A_KV * head_rows * A_HD;
    float *kf = malloc(kv_elems * 4), *vf = malloc(kv_elems * 4);
    fill(kf, kv_elems, 1.0f);
    fill(vf, kv_elems, 1.0f);
    void *kb = malloc(kv_elems * esz), *vb = malloc(kv_elems * esz);
    for (size_t i = 0; i < kv_elems; i++) {
        if (kt == KV_F16) {
            ((uint16_t *)kb)[i] = kt_f32_to_f16(kf[i]);
            ((uint16_t *)vb)[i] = kt_f32_to_f16(vf[i]);
        } else {
            ((float *)kb)[i] = kf[i];
            ((float *)vb)[i] = vf[i];
        }
    }
    int32_t seq_row[A_N] = {0, 0, 0, A_CTX, A_CTX, A_CTX};
    int32_t n_prefix[A_N] = {0, 5, 37, 1030, 1030, 150};
    int32_t anc[A_N * A_W] = {0}, n_anc[A_N] = {1, 2, 3, 1, 2, 3};
    const int32_t lists[A_N][3] = {{0}, {0, 1}, {0, 1, 2}, {3}, {3, 4}, {3, 4, 5}};
    for (int i = 0; i < A_N; i++)
        for (int j = 0; j < n_anc[i]; j++)
            anc[i * A_W + j] = lists[i][j];
    float q[A_N * A_H * A_HD];
    fill(q, sizeof q / 4, 1.0f);
    float scale = 1.0f / sqrtf((float)A_HD);
    int64_t rec = A_HD + 2, rec_tok = (int64_t)A_H * rec;
    float *ref = malloc((size_t)A_N * rec_tok * 4), *got = malloc((size_t)A_N * rec_tok * 4);
    kcuda_att a = {.type = kt,
                   .k = to_dev(kb, kv_elems * esz),
                   .v = to_dev(vb, kv_elems * esz),
                   .head_rows = head_rows,
                   .tree_row = tree_row,
                   .head_dim = A_HD,
                   .n_heads = A_H,
                   .n_kv_heads = A_KV,
                   .scale = scale,
                   .seq_row = to_dev(seq_row, sizeof seq_row),
                   .n_prefix = to_dev(n_prefix, sizeof n_prefix),
                   .anc = to_dev(anc, sizeof anc),
                   .n_anc = to_dev(n_anc, sizeof n_anc),
                   .anc_stride = A_W};
    float *dq = to_dev(q, sizeof q), *dout = kcuda_alloc((size_t)A_N * rec_tok * 4);
    const int modes[] = {KCUDA_ATT_FULL, KCUDA_ATT_DENSE, KCUDA_ATT_SPARSE};
    const char *names[] = {"full", "dense", "sparse"};
    float *cpu_rec[2] = {malloc((size_t)A_N * rec_tok * 4), malloc((size_t)A_N * rec_tok * 4)};
    /* each stream whole and cut into parts: 3 (uneven parts), 16 (parts shorter than a warp's
     * group of keys), 300 (bounded to KCUDA_ATT_MAX_PARTS: most parts of the short streams
     * empty); a warp scoring 4 keys at a time, then 1 (kcuda_set_att_keys); the tiled kernel
     * (kcuda_set_att_tile: tokens 3 and 4 share a sequence and a prefix, one group), and by
     * default (plain: the longest stream unset); query heads [2, 7), which cover two KV heads in
     * part */
    enum { OFF = KCUDA_TILE_OFF, ON = KCUDA_TILE_ON, AUTO = KCUDA_TILE_AUTO };
    const int part_asks[] = {1, 3, 16, 300, 1, 3, 1, 3, 300, 3, 1, 3};
    const int part_gets[] = {1, 3, 16, KCUDA_ATT_MAX_PARTS, 1, 3, 1, 3, KCUDA_ATT_MAX_PARTS, 3, 1,
                             3};
    const int keys_at[] = {4, 4, 4, 4, 1, 1, 4, 4, 4, 4, 4, 4};
    const int tile_at[] = {OFF, OFF, OFF, OFF, OFF, OFF, ON, ON, ON, ON, OFF, AUTO};
    const int h_lo[] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 0},
              h_hi[] = {A_H, A_H, A_H, A_H, A_H, A_H, A_H, A_H, A_H, 7, 7, A_H};
    float *fin = malloc((size_t)rec * 4);
    for (int mi = 0; mi < 3; mi++) {
        int mode = modes[mi];
        for (int i = 0; i < A_N; i++)
            for (int h = 0; h < A_H; h++) {
                int kvh = h / (A_H / A_KV);
                katt_keys keys = {
                    .type = kt,
                    .stride = A_HD,
                    .n_prefix = n_prefix[i],
                    .k = (uint8_t *)kb + ((size_t)kvh * head_rows + seq_row[i]) * A_HD * esz,
                    .v = (uint8_t *)vb + ((size_t)kvh * head_rows + seq_row[i]) * A_HD * esz,
                    .tree_k = (uint8_t *)kb + ((size_t)kvh * head_rows + tree_row) * A_HD * esz,
                    .tree_v = (uint8_t *)vb + ((size_t)kvh * head_rows + tree_row) * A_HD * esz,
                    .tree_slot = anc + i * A_W,
                };
                int nk = n_prefix[i] + n_anc[i];
                if (mode == KCUDA_ATT_DENSE)
                    nk = n_prefix[i];
                if (mode == KCUDA_ATT_SPARSE) {
                    keys.n_prefix = 0;
                    nk = n_anc[i];
                }
                katt_stat st;
                float *o = ref + (size_t)i * rec_tok + (size_t)h * rec;
                katt_causal_group(q + ((size_t)i * A_H + h) * A_HD, A_HD, 1, &keys, nk, A_HD,
                                  scale, &st, o, A_HD);
                o[A_HD] = st.max;
                o[A_HD + 1] = st.sum;
                if (mode != KCUDA_ATT_FULL)
                    memcpy(cpu_rec[mi - 1] + (size_t)i * rec_tok + (size_t)h * rec, o, rec * 4);
            }
        for (size_t pi = 0; pi < sizeof part_asks / sizeof part_asks[0]; pi++) {
            a.parts = part_asks[pi];
            kcuda_set_att_keys(g, keys_at[pi]);
            kcuda_set_att_tile(g, tile_at[pi]);
            int h0 = h_lo[pi], h1 = h_hi[pi];
            char what[96];
            snprintf(what, sizeof what, "attention parts asked %d", part_asks[pi]);
            check_int(what, kcuda_att_parts(g, &a, A_N), part_gets[pi]);
            bool tiles = tile_at[pi] == ON; /* by default: max_keys unset (0), so plain */
            snprintf(what, sizeof what, "attention by tiles at %d tokens, set %d", A_N, tile_at[pi]);
            check_int(what, kcuda_att_tiles(g, &a, A_N), tiles);
            double worst = 0, lse = 0;
            if (mode == KCUDA_ATT_FULL) {
                must(kcuda_attention(g, &a, mode, dq, A_H * A_HD, A_N, h0, h1, dout, A_H * A_HD,
                                     0, err, sizeof err),
                     "attention");
                from_dev(got, dout, (size_t)A_N * A_H * A_HD * 4);
                for (int i = 0; i < A_N; i++)
                    for (int h = h0; h < h1; h++) {
                        memcpy(fin, ref + (size_t)i * rec_tok + (size_t)h * rec, (size_t)rec * 4);
                        katt_stat st = {fin[A_HD], fin[A_HD + 1]};
                        katt_finish(&st, fin, A_HD);
                        double e = tu_rel_l2(got + ((size_t)i * A_H + h) * A_HD, fin, A_HD);
                        worst = e > worst ? e : worst;
                    }
            } else {
                must(kcuda_attention(g, &a, mode, dq, A_H * A_HD, A_N, h0, h1, dout, rec_tok, rec,
                                     err, sizeof err),
                     "attention");
                from_dev(got, dout, (size_t)A_N * rec_tok * 4);
                for (int i = 0; i < A_N; i++)
                    for (int h = h0; h < h1; h++) {
                        memcpy(fin, ref + (size_t)i * rec_tok + (size_t)h * rec, (size_t)rec * 4);
                        float *o = fin, *p = got + (size_t)i * rec_tok + (size_t)h * rec;
                        if (o[A_HD + 1] == 0 || p[A_HD + 1] == 0) { /* an empty key set */
                            if (o[A_HD + 1] != p[A_HD + 1])
                                lse = INFINITY;
                            continue;
                        }
                        double dl =
                            fabs((o[A_HD] + log(o[A_HD + 1])) - (p[A_HD] + log(p[A_HD + 1])));
                        lse = dl > lse ? dl : lse;
                        katt_stat so = {o[A_HD], o[A_HD + 1]}, sp = {p[A_HD], p[A_HD + 1]};
                        katt_finish(&so, o, A_HD);
                        katt_finish(&sp, p, A_HD);
                        double e = tu_rel_l2(p, o, A_HD);
                        worst = e > worst ? e : worst;
                    }
            }
            snprintf(what, sizeof what, "attention %s, KV %s, %d part%s, %s, heads %d-%d",
                     names[mi], kt == KV_F16 ? "f16" : "f32", part_gets[pi],
                     part_gets[pi] > 1 ? "s" : "",
                     tiles ? "tiles" : tile_at[pi] == AUTO ? "by default" : keys_at[pi] > 1 ? "4 keys"
                                                                                     : "1 key",
                     h0, h1 - 1);
            check(what, worst, 1e-5);
            if (mode != KCUDA_ATT_FULL) {
                snprintf(what, sizeof what, "  log-sum-exp");
                check(what, lse, 1e-4);
            }
        }
    }
    free(fin);
    kcuda_set_att_keys(g, 4);
    kcuda_set_att_tile(g, KCUDA_TILE_AUTO);
    /* the merge of the CPU's own dense and sparse records */
    int32_t heads[A_H];
    for (int h = 0; h < A_H; h++)
        heads[h] = h;
    float *dpd = to_dev(cpu_rec[0], (size_t)A_N * rec_tok * 4);
    float *dps = to_dev(cpu_rec[1], (size_t)A_N * rec_tok * 4);
    int32_t *dheads = to_dev(heads, sizeof heads);
    kcuda_att_merge(g, dpd, dps, rec_tok, rec, dheads, A_H, A_N, A_HD, dout, A_H * A_HD);
    from_dev(got, dout, (size_t)A_N * A_H * A_HD * 4);
    double worst = 0;
    for (int i = 0; i < A_N; i++)
        for (int h = 0; h < A_H; h++) {
            float o[A_HD];
            const float *d = cpu_rec[0] + (size_t)i * rec_tok + (size_t)h * rec;
            const float *s = cpu_rec[1] + (size_t)i * rec_tok + (size_t)h * rec;
            katt_stat sa = {d[A_HD], d[A_HD + 1]}, sb = {s[A_HD], s[A_HD + 1]};
            memcpy(o, d, sizeof o);
            katt_merge(&sa, o, &sb, s, A_HD);
            katt_finish(&sa, o, A_HD);
            /* each output against the size of the two terms it sums, (|d|·fd + |s|·fs) / L: the
             * GPU fuses d·fd + s·fs into one multiply-add and its expf is within 2 ulp, not the
             * host's, so an output that is the difference of two larger terms carries their
             * rounding, not its own (per output, seen on an H100: 5e-6 to 1.8e-5). Against the
             * terms' size the two differ by a few roundings on each side (up to 3 ulp between the
             * two expf, half an ulp in each product, sum, L, 1/L and the last product: under 2e-6
             * if every one fell the same way); 5e-6 leaves room, and a wrong factor is off by
             * far more (a merge that scaled both terms by fd: 2.7) */
            double mx = fmax(d[A_HD], s[A_HD]), fd = exp(d[A_HD] - mx), fs = exp(s[A_HD] - mx);
            double L = d[A_HD + 1] * fd + s[A_HD + 1] * fs;
            const float *gh = got + ((size_t)i * A_H + h) * A_HD;
            for (int e = 0; e < A_HD; e++) {
                double size = (fabs(d[e]) * fd + fabs(s[e]) * fs) / L;
                double err = fabs((double)gh[e] - o[e]) / (size > 1e-30 ? size : 1e-30);
                worst = err > worst ? err : worst;
            }
        }
    check(kt == KV_F16 ? "merge of partials (f16 K/V)" : "merge of partials (f32 K/V)", worst,
          5e-6);
    void *ptrs[] = {(void *)a.k, (void *)a.v, (void *)a.seq_row, (void *)a.n_prefix,
                    (void *)a.anc, (void *)a.n_anc, dq, dout, dpd, dps, dheads};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        kcuda_free(ptrs[i]);
    free(kf), free(vf), free(kb), free(vb), free(ref), free(got), free(cpu_rec[0]),
        free(cpu_rec[1]);
}

/* kcuda_att_parts's choice (kcuda_att_parts_rule) on fixtures: an H100's 132 multiprocessors
 * and 32 heads of 64 (the 1B shape), the default model's 9, a head of 256; the plain kernel's
 * blocks, then the tiled kernel's. When the tiles run by default (kcuda_att_tiled) and the
 * quantized matmul's groups in flight by default (kcuda_unroll_rule). */
static void test_att_parts_rule(void)
{
    static const struct {
        int n, heads, head_dim, max_keys, parts, sms, want;
        const char *why;
    } f[] = {
        {1, 32, 64, 4096, 0, 132, 32, "W=1, 4096 keys: 32 x 32 blocks within 8 per SM"},
        {1, 32, 64, 1024, 0, 132, 16, "W=1, 1024 keys: parts of 64 keys"},
        {1, 32, 64, 127, 0, 132, 1, "W=1, 127 keys: two parts would be under 64"},
        {1, 32, 64, 128, 0, 132, 2, "W=1, 128 keys: two parts of 64"},
        {16, 32, 64, 4096, 0, 132, 2, "W=16: 512 pairs, 2 parts fill 8 per SM"},
        {64, 32, 64, 4096, 0, 132, 1, "W=64: 2048 pairs fill the device uncut"},
        {1, 9, 64, 8192, 0, 132, 64, "the 135M shape, W=1: 9 x 64 blocks"},
        {1, 9, 64, 8192, 0, 1, 1, "one multiprocessor: never cut"},
        {1, 9, 64, 0, 0, 132, 1, "max_keys unknown: never cut"},
        {6, 9, 64, 0, 300, 1, 256, "asked 300: at most 256"},
        {16, 64, 256, 0, 16, 1, 4, "asked 16, room for 4096 records of 258: 4 a pair"},
        {64, 64, 256, 0, 16, 1, 1, "asked 16, room for one a pair: uncut"},
        {64, 64, 64, 0, 0, 132, 1, "asked nothing at W=64"},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        kcuda_att a = {.head_dim = f[i].head_dim,
                       .n_heads = f[i].heads,
                       .n_kv_heads = 1,
                       .max_keys = f[i].max_keys,
                       .parts = f[i].parts};
        char what[96];
        snprintf(what, sizeof what, "attention parts: %s", f[i].why);
        check_int(what, kcuda_att_parts_rule(&a, f[i].n, f[i].sms, KCUDA_TILE_OFF), f[i].want);
    }
    static const struct {
        int n, heads, kv_heads, head_dim, keys, tile, tiled, parts;
        const char *why;
    } t[] = {
        {1, 32, 8, 64, 8000, KCUDA_TILE_AUTO, 1, 64, "the 1B shape, W=1, 8000 keys: tiles (32000)"},
        {1, 9, 3, 64, 8000, KCUDA_TILE_AUTO, 0, 64, "the 135M shape, W=1, 8000 keys: plain (24000)"},
        {1, 32, 8, 64, 4096, KCUDA_TILE_AUTO, 0, 32, "the 1B shape, W=1, 4096 keys: plain (16384)"},
        {2, 32, 8, 64, 2048, KCUDA_TILE_AUTO, 0, 16, "W=2, 2048 keys: plain (16384)"},
        {2, 32, 8, 64, 8000, KCUDA_TILE_AUTO, 1, 64, "W=2, 8000 keys: tiles, 8 blocks"},
        {4, 32, 8, 64, 2048, KCUDA_TILE_AUTO, 1, 32, "W=4, 2048 keys: tiles, 8 blocks (32768)"},
        {8, 32, 8, 64, 2048, KCUDA_TILE_AUTO, 1, 32, "W=8, 2048 keys: tiles, parts of 64 keys"},
        {16, 32, 8, 64, 8000, KCUDA_TILE_AUTO, 1, 31, "W=16: tiles, records for 31 parts"},
        {1, 32, 8, 64, 8000, KCUDA_TILE_ON, 1, 64, "W=1, asked on: tiles, 8 blocks"},
        {16, 32, 8, 64, 8000, KCUDA_TILE_OFF, 0, 2, "W=16, asked off: plain"},
        {16, 9, 3, 64, 8000, KCUDA_TILE_AUTO, 1, 64, "the 135M shape, W=16: 12 blocks"},
        {16, 32, 8, 256, 8000, KCUDA_TILE_AUTO, 0, 2, "a head of 256: plain, whatever asked"},
        {16, 64, 2, 64, 8000, KCUDA_TILE_ON, 0, 1, "32 query heads a KV head: plain, always"},
        {64, 32, 8, 64, 0, KCUDA_TILE_AUTO, 0, 1, "keys unknown: plain, uncut"},
        {64, 9, 3, 64, 256, KCUDA_TILE_AUTO, 0, 1, "W=64, 256 keys: plain (tiles lost there)"},
        {10, 9, 3, 64, 1024, KCUDA_TILE_AUTO, 1, 16, "W=10, 1024 keys: tiles, 6 blocks (30720)"},
        {9, 9, 3, 64, 1024, KCUDA_TILE_AUTO, 0, 8, "W=9, 1024 keys: plain, 81 blocks (27648)"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        kcuda_att a = {.head_dim = t[i].head_dim,
                       .n_heads = t[i].heads,
                       .n_kv_heads = t[i].kv_heads,
                       .max_keys = t[i].keys};
        char what[128];
        snprintf(what, sizeof what, "attention by tiles: %s", t[i].why);
        check_int(what, kcuda_att_tiled(&a, t[i].n, t[i].tile), t[i].tiled);
        snprintf(what, sizeof what, "attention parts: %s", t[i].why);
        check_int(what, kcuda_att_parts_rule(&a, t[i].n, 132, t[i].tile), t[i].parts);
    }
    static const struct {
        int set, n, want;
    } u[] = {{0, 1, 2}, {0, 4, 2}, {0, 5, 1}, {0, 64, 1}, {1, 1, 1}, {4, 64, 4}, {2, 16, 2}, {3, 1, 2}};
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "matmul groups in flight, set %d, %d columns", u[i].set, u[i].n);
        check_int(what, kcuda_unroll_rule(u[i].set, u[i].n), u[i].want);
    }
    /* the tensor-core matmul's inputs in fragment order: by default from KCUDA_FRAG_AUTO_N
     * tokens, when on from 1, never when off, never on CUDA cores nor for a float type */
    static const struct {
        int set, n, want;
    } fr[] = {{KCUDA_FRAG_AUTO, 1, 0},  {KCUDA_FRAG_AUTO, 16, 0}, {KCUDA_FRAG_AUTO, 17, 1},
             {KCUDA_FRAG_AUTO, 64, 1}, {KCUDA_FRAG_ON, 1, 1},    {KCUDA_FRAG_ON, 2, 1},
             {KCUDA_FRAG_OFF, 64, 0},  {7, 17, 1}};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "matmul inputs in fragment order, set %d, %d columns",
                 fr[i].set, fr[i].n);
        check_int(what, kcuda_frag_rule(fr[i].set, fr[i].n), fr[i].want);
    }
    kcuda_set_matmul_kind(g, KCUDA_MM_SIMT);
    check_int("fragment order on CUDA cores", kcuda_matmul_frag(g, KT_Q4_K, 64), 0);
    kcuda_set_matmul_kind(g, KCUDA_MM_AUTO);
    check_int("fragment order for F16", kcuda_matmul_frag(g, KT_F16, 64), 0);
    check_int("fragment order for Q4_K at 64 by default", kcuda_matmul_frag(g, KT_Q4_K, 64), 1);
    /* the tensor-core matmul's token groups: the token tiles a pass takes (a power of two at or
     * above a group's share, 8 at most) and the groups used (no more than the passes) */
    static const struct {
        int set, n, tiles, groups;
    } tg[] = {{0, 1, 1, 1},  {0, 9, 2, 1},  {0, 17, 4, 1}, {0, 64, 8, 1},  {0, 100, 8, 1},
              {2, 64, 4, 2}, {4, 64, 2, 4}, {8, 64, 1, 8}, {8, 17, 1, 3},  {4, 40, 2, 3},
              {2, 8, 1, 1},  {3, 64, 8, 1}, {2, 200, 8, 2}, {8, 0, 1, 1}};
    for (size_t i = 0; i < sizeof tg / sizeof tg[0]; i++) {
        char what[96];
        snprintf(what, sizeof what, "matmul token groups set %d, %d columns: tiles a pass",
                 tg[i].set, tg[i].n);
        check_int(what, kcuda_pass_tiles(tg[i].n, tg[i].set), tg[i].tiles);
        snprintf(what, sizeof what, "matmul token groups set %d, %d columns: groups", tg[i].set,
                 tg[i].n);
        check_int(what, kcuda_groups_rule(tg[i].set, tg[i].n), tg[i].groups);
    }
    kcuda_set_matmul_groups(g, 4);
    check_int("token groups for Q4_K at 64, set 4", kcuda_matmul_groups(g, KT_Q4_K, 64), 4);
    check_int("token groups for F16", kcuda_matmul_groups(g, KT_F16, 64), 1);
    kcuda_set_matmul_kind(g, KCUDA_MM_SIMT);
    check_int("token groups on CUDA cores", kcuda_matmul_groups(g, KT_Q4_K, 64), 1);
    kcuda_set_matmul_kind(g, KCUDA_MM_AUTO);
    kcuda_set_matmul_groups(g, 0);
}

/* The unified-memory path: kernels write host memory registered for the device. */
/* kcuda_kv_store (f32 copied, f16 rounded as kt_f32_to_f16: bit for bit), kcuda_copy3d (every
 * block, nothing else; 16- and 4-byte aligned), and a captured graph replayed on new input. */
static void test_copies(void)
{
    int hd = 64, heads = 4, n = 5;
    int64_t head_rows = 40, r0 = 17, stride = heads * hd + 32;
    float *src = malloc((size_t)(n * stride) * 4);
    fill(src, (size_t)(n * stride), 3.0f);
    float *dsrc = to_dev(src, (size_t)(n * stride) * 4);
    for (int kt = KV_F32; kt <= KV_F16; kt++) {
        size_t esz = kt == KV_F16 ? 2 : 4, bytes = (size_t)(heads * head_rows * hd) * esz;
        uint8_t *got = malloc(bytes), *want = calloc(1, bytes);
        void *dst = kcuda_alloc(bytes);
        must(kcuda_upload(g, dst, want, bytes, err, sizeof err), "upload");
        kcuda_kv_store(g, (kv_type)kt, dst, head_rows, r0, dsrc, stride, 1, 3, hd, n);
        from_dev(got, dst, bytes);
        for (int h = 1; h < 3; h++)
            for (int t = 0; t < n; t++)
                for (int e = 0; e < hd; e++) {
                    size_t at = ((size_t)h * head_rows + r0 + t) * hd + e;
                    float v = src[t * stride + h * hd + e];
                    if (kt == KV_F16) {
                        uint16_t hv = kt_f32_to_f16(v);
                        memcpy(want + at * 2, &hv, 2);
                    } else {
                        memcpy(want + at * 4, &v, 4);
                    }
                }
        bool same = !memcmp(got, want, bytes);
        printf("  kv_store %s: %s\n", kt == KV_F16 ? "f16" : "f32", same ? "ok" : "FAILED");
        failures += !same;
        kcuda_free(dst);
        free(got);
        free(want);
    }
    /* 3-D copies: width 96 bytes (16-aligned) and 52 (4-aligned) */
    size_t plane = 4096, total = 8 * plane;
    uint8_t *a = malloc(total), *b = malloc(total), *want = malloc(total);
    for (size_t i = 0; i < total; i++)
        a[i] = (uint8_t)(i * 7 + 3);
    for (int wide = 0; wide < 2; wide++) {
        size_t width = wide ? 96 : 52, pitch = 400, off = 64;
        memset(b, 0xee, total);
        memcpy(want, b, total);
        for (size_t z = 0; z < 8; z++)
            for (size_t y = 0; y < 6; y++)
                memcpy(want + off + z * plane + y * pitch, a + off + z * plane + y * pitch, width);
        uint8_t *da = to_dev(a, total), *db = to_dev(b, total);
        kcuda_copy3d(g, db + off, da + off, width, 6, pitch, 8, plane);
        from_dev(b, db, total);
        bool same = !memcmp(b, want, total);
        printf("  copy3d width %zu: %s\n", width, same ? "ok" : "FAILED");
        failures += !same;
        /* planes closer together in dst (a K/V mirror holding some heads: kcuda_copy3d_pz) */
        size_t dplane = 3 * plane / 4;
        memset(b, 0xee, total);
        memcpy(want, b, total);
        for (size_t z = 0; z < 8; z++)
            for (size_t y = 0; y < 6; y++)
                memcpy(want + off + z * dplane + y * pitch, a + off + z * plane + y * pitch, width);
        kcuda_free(db);
        db = to_dev(b, total);
        kcuda_copy3d_pz(g, db + off, dplane, da + off, plane, width, 6, pitch, 8);
        from_dev(b, db, total);
        same = !memcmp(b, want, total);
        printf("  copy3d_pz width %zu: %s\n", width, same ? "ok" : "FAILED");
        failures += !same;
        kcuda_free(da);
        kcuda_free(db);
    }
    /* a graph: rmsnorm recorded once, replayed on other input */
    int dim = 256;
    float *x = malloc((size_t)dim * 2 * 4), *ref = malloc((size_t)dim * 4),
          *out = malloc((size_t)dim * 4);
    float *dx = kcuda_alloc((size_t)dim * 2 * 4), *dout = kcuda_alloc((size_t)dim * 4);
    must(kcuda_capture_begin(g, err, sizeof err), "capture");
    kcuda_rmsnorm(g, dout, dx, dx + dim, dim, 1, 1e-6f);
    kcuda_graph *gr = kcuda_capture_end(g, err, sizeof err);
    must(gr ? 0 : -1, "capture end");
    for (int rep = 0; rep < 2; rep++) {
        fill(x, (size_t)dim * 2, 1.0f + rep);
        k_rmsnorm(ref, x, x + dim, dim, 1e-6f);
        must(kcuda_upload(g, dx, x, (size_t)dim * 2 * 4, err, sizeof err), "upload");
        must(kcuda_graph_launch(g, gr, err, sizeof err), "graph launch");
        from_dev(out, dout, (size_t)dim * 4);
        check(rep ? "graph replayed on new input" : "graph launched",
              max_rel(out, ref, (size_t)dim), 1e-5);
    }
    kcuda_graph_destroy(&gr);
    kcuda_free(dx);
    kcuda_free(dout);
    kcuda_free(dsrc);
    free(src);
    free(a);
    free(b);
    free(want);
    free(x);
    free(ref);
    free(out);
}

/* A device buffer of `count` floats, each `v`. */
static float *dev_const(size_t count, float v)
{
    float *h = malloc(count * 4);
    for (size_t i = 0; i < count; i++)
        h[i] = v;
    float *d = to_dev(h, count * 4);
    free(h);
    return d;
}

/* Two device buffers of `count` floats hold the same bits (downloaded into a and b). */
static bool dev_same(const float *da, const float *db, float *a, float *b, size_t count)
{
    from_dev(a, da, count * 4);
    from_dev(b, db, count * 4);
    return !memcmp(a, b, count * 4);
}

static void report_same(const char *what, bool same)
{
    printf("  %-48s %s\n", what, same ? "same bits ok" : "DIFFERENT BITS FAILED");
    failures += !same;
}

/* The fused launches against the ops each replaces, bit for bit, every type, widths 1 and 17:
 * kcuda_matmul_multi (three matrices of different row counts and ranges, into three outputs),
 * kcuda_matmul_add (matmul, then the residual add), kcuda_matmul_silu (gate and up matmuls, then
 * silu*mul); kcuda_rope_store (RoPE of query and key heads, key and value heads stored into two
 * block pairs) for f32 and f16 K/V. Matrices of two types are refused, naming what differs. */
static void test_fused(void)
{
    const uint32_t *types = all_types;
    const int64_t rows[3] = {97, 40, 40}, lo[3] = {13, 0, 5}, hi[3] = {90, 40, 37};
    int64_t cols = 256;
    size_t big = (size_t)17 * 97;
    float *x = malloc((size_t)(17 * cols) * 4), *a = malloc(big * 4), *b = malloc(big * 4);
    fill(x, (size_t)(17 * cols), 1.0f);
    float *dx = to_dev(x, (size_t)(17 * cols) * 4);
    uint8_t *hw[4] = {0};
    kmat w[4] = {{0}};
    /* every type on CUDA cores, then the quantized ones on tensor cores */
    for (size_t tk = 0; tk < 2 * N_TYPES - N_FLOAT; tk++) {
        size_t t = tk < N_TYPES ? tk : tk - N_TYPES + N_FLOAT;
        int kind = tk < N_TYPES ? KCUDA_MM_SIMT : KCUDA_MM_TC;
        kcuda_set_matmul_kind(g, kind);
        size_t rb = kt_row_bytes(types[t], (uint64_t)cols);
        for (int m = 0; m < 4; m++) { /* q, k, v (rows[0..2]); a second 97-row one: up */
            int64_t r = m < 3 ? rows[m] : rows[0];
            float *wf = malloc((size_t)(r * cols) * 4);
            fill(wf, (size_t)(r * cols), 1.0f);
            hw[m] = malloc(rb * (size_t)r);
            for (int64_t i = 0; i < r; i++)
                kt_quantize_row(types[t], wf + i * cols, hw[m] + (size_t)i * rb, cols);
            w[m] = (kmat){.type = types[t], .rows = r, .cols = cols, .row_bytes = rb};
            w[m].data = to_dev(hw[m], rb * (size_t)r);
            free(wf);
        }
        char tn[48];
        snprintf(tn, sizeof tn, "%s%s", kt_traits_of(types[t])->name,
                 kind == KCUDA_MM_TC ? " (tensor cores)" : "");
        for (int n = 1; n <= 17; n += 16) {
            char what[96];
            /* three matrices in one launch */
            float *y1[3], *y2[3];
            kcuda_mm mm[3];
            for (int m = 0; m < 3; m++) {
                y1[m] = dev_const((size_t)n * rows[m], 7.0f);
                y2[m] = dev_const((size_t)n * rows[m], 7.0f);
                must(kcuda_matmul(g, &w[m], lo[m], hi[m], dx, n, y1[m], rows[m], err, sizeof err),
                     "matmul");
                mm[m] = (kcuda_mm){&w[m], lo[m], hi[m], y2[m], rows[m]};
            }
            must(kcuda_matmul_multi(g, mm, 3, dx, n, err, sizeof err), "matmul_multi");
            bool same = true;
            for (int m = 0; m < 3; m++)
                same &= dev_same(y1[m], y2[m], a, b, (size_t)n * rows[m]);
            snprintf(what, sizeof what, "fused q/k/v matmul %s width %d", tn, n);
            report_same(what, same);
            /* matmul + residual add */
            float *res = malloc((size_t)n * 97 * 4);
            fill(res, (size_t)n * 97, 2.0f);
            float *r1 = to_dev(res, (size_t)n * 97 * 4), *r2 = to_dev(res, (size_t)n * 97 * 4);
            must(kcuda_matmul(g, &w[0], 13, 90, dx, n, y1[0], 97, err, sizeof err), "matmul");
            kcuda_add_cols(g, r1, y1[0], n, 97, 13, 90);
            must(kcuda_matmul_add(g, &w[0], 13, 90, dx, n, r2, 97, err, sizeof err),
                 "matmul_add");
            snprintf(what, sizeof what, "fused matmul + residual add %s width %d", tn, n);
            report_same(what, dev_same(r1, r2, a, b, (size_t)n * 97));
            /* gate and up, silu*mul */
            float *up = dev_const((size_t)n * 97, 7.0f), *f2 = dev_const((size_t)n * 97, 7.0f);
            must(kcuda_matmul(g, &w[3], 13, 90, dx, n, up, 97, err, sizeof err), "matmul");
            kcuda_silu_mul(g, y1[0] + 13, up + 13, n, 97, 77);
            must(kcuda_matmul_silu(g, &w[0], &w[3], 13, 90, dx, n, f2, 97, err, sizeof err),
                 "matmul_silu");
            snprintf(what, sizeof what, "fused gate/up + silu*mul %s width %d", tn, n);
            report_same(what, dev_same(y1[0], f2, a, b, (size_t)n * 97));
            for (int m = 0; m < 3; m++) {
                kcuda_free(y1[m]);
                kcuda_free(y2[m]);
            }
            kcuda_free(r1), kcuda_free(r2), kcuda_free(up), kcuda_free(f2);
            free(res);
        }
        for (int m = 0; m < 4; m++) {
            kcuda_free((void *)w[m].data);
            free(hw[m]);
        }
    }
    /* on CUDA cores, the quantized matmul with 2 and 4 groups in flight per lane: the bits of 1,
     * on rows of 43 blocks of 32 or 6 K super-blocks (each lane 5 or 6 groups: whole rounds of U
     * and a remainder), widths 1 and 17 */
    kcuda_set_matmul_kind(g, KCUDA_MM_SIMT);
    int64_t most = 6 * 256;
    float *xw = malloc((size_t)(17 * most) * 4), *wf = malloc((size_t)(61 * most) * 4);
    fill(xw, (size_t)(17 * most), 1.0f);
    fill(wf, (size_t)(61 * most), 1.0f);
    float *dxw = to_dev(xw, (size_t)(17 * most) * 4);
    float *y1 = kcuda_alloc((size_t)17 * 61 * 4), *yu = kcuda_alloc((size_t)17 * 61 * 4);
    float *s1 = kcuda_alloc((size_t)17 * 61 * 4), *su = kcuda_alloc((size_t)17 * 61 * 4);
    float *ha = malloc((size_t)17 * 61 * 4), *hb = malloc((size_t)17 * 61 * 4);
    for (size_t t = N_FLOAT; t < N_TYPES; t++) { /* the quantized types */
        int64_t wide = kt_traits_of(types[t])->block == 256 ? most : 43 * 32;
        size_t rb = kt_row_bytes(types[t], (uint64_t)wide);
        uint8_t *q = malloc(rb * 61);
        for (int64_t i = 0; i < 61; i++)
            kt_quantize_row(types[t], wf + i * wide, q + (size_t)i * rb, wide);
        kmat m = {.type = types[t], .rows = 61, .cols = wide, .row_bytes = rb};
        m.data = to_dev(q, rb * 61);
        for (int n = 1; n <= 17; n += 16) {
            kcuda_set_matmul_unroll(g, 1);
            must(kcuda_matmul(g, &m, 0, 61, dxw, n, y1, 61, err, sizeof err) ||
                     kcuda_matmul_silu(g, &m, &m, 0, 61, dxw, n, s1, 61, err, sizeof err),
                 "matmul");
            for (int u = 2; u <= 4; u *= 2) {
                kcuda_set_matmul_unroll(g, u);
                must(kcuda_matmul(g, &m, 0, 61, dxw, n, yu, 61, err, sizeof err) ||
                         kcuda_matmul_silu(g, &m, &m, 0, 61, dxw, n, su, 61, err, sizeof err),
                     "matmul");
                char what[96];
                snprintf(what, sizeof what, "matmul (and gate/up) %s, %d groups in flight, W=%d",
                         kt_traits_of(types[t])->name, u, n);
                report_same(what, dev_same(y1, yu, ha, hb, (size_t)n * 61) &&
                                      dev_same(s1, su, ha, hb, (size_t)n * 61));
            }
        }
        kcuda_set_matmul_unroll(g, 0);
        /* on tensor cores the loads in flight, the token tiles a pass and the row tiles a block
         * follow the width: 17 tokens at once (2 blocks in flight, 2 row tiles) must be the bits
         * of each alone (8 in flight for so few rows, kcuda_depth_rule; 1 tile), over whole
         * rounds of loads and a remainder */
        kcuda_set_matmul_kind(g, KCUDA_MM_TC);
        for (int i = 0; i < 17; i++)
            must(kcuda_matmul(g, &m, 0, 61, dxw + i * wide, 1, y1 + i * 61, 61, err, sizeof err) ||
                     kcuda_matmul_silu(g, &m, &m, 0, 61, dxw + i * wide, 1, s1 + i * 61, 61, err,
                                       sizeof err),
                 "matmul");
        must(kcuda_matmul(g, &m, 0, 61, dxw, 17, yu, 61, err, sizeof err) ||
                 kcuda_matmul_silu(g, &m, &m, 0, 61, dxw, 17, su, 61, err, sizeof err),
             "matmul");
        char what[96];
        snprintf(what, sizeof what, "matmul (and gate/up) %s, tensor cores, W=17 as alone",
                 kt_traits_of(types[t])->name);
        report_same(what, dev_same(y1, yu, ha, hb, (size_t)17 * 61) &&
                              dev_same(s1, su, ha, hb, (size_t)17 * 61));
        kcuda_set_matmul_kind(g, KCUDA_MM_SIMT);
        kcuda_free((void *)m.data);
        free(q);
    }
    kcuda_set_matmul_kind(g, KCUDA_MM_AUTO);
    kcuda_free(dxw), kcuda_free(y1), kcuda_free(yu), kcuda_free(s1), kcuda_free(su);
    free(xw), free(wf), free(ha), free(hb);

    /* refusals: one type and one column count */
    kmat q8 = {.type = KT_Q8_0, .rows = 32, .cols = 64, .row_bytes = 68, .data = dx};
    kmat q4 = {.type = KT_Q4_0, .rows = 32, .cols = 64, .row_bytes = 36, .data = dx};
    kcuda_mm two[2] = {{&q8, 0, 32, a, 32}, {&q4, 0, 32, b, 32}};
    bool refused = kcuda_matmul_multi(g, two, 2, dx, 1, err, sizeof err) &&
                   strstr(err, "one type and column count");
    printf("  fused matmul of Q8_0 and Q4_0 refused: %s (%s)\n", refused ? "ok" : "FAILED", err);
    failures += !refused;
    refused = kcuda_matmul_silu(g, &q8, &q4, 0, 32, dx, 1, a, 32, err, sizeof err) &&
              strstr(err, "gate and up");
    printf("  fused gate/up of Q8_0 and Q4_0 refused: %s (%s)\n", refused ? "ok" : "FAILED", err);
    failures += !refused;
    kcuda_free(dx);

    /* RoPE of 9 query heads and KV heads [1, 3) of 4, stores into two block pairs */
    int n = 5, hd = 64, half = 24, qh = 9, kvh = 4;
    int64_t head_rows = 20, r0 = 7, qs = qh * hd + 16, ks = kvh * hd + 32;
    double inv[32];
    float *cs = malloc((size_t)n * half * 4), *sn = malloc((size_t)n * half * 4);
    k_rope_freqs(inv, 2 * half, 10000.0f);
    for (int t = 0; t < n; t++)
        k_rope_angles(cs + t * half, sn + t * half, inv, half, 11 * t + 2);
    float *dcs = to_dev(cs, (size_t)n * half * 4), *dsn = to_dev(sn, (size_t)n * half * 4);
    size_t nq = (size_t)(n * qs), nk = (size_t)(n * ks);
    float *hq = malloc(nq * 4), *hk = malloc(nk * 4), *hv = malloc(nk * 4);
    fill(hq, nq, 2.0f), fill(hk, nk, 2.0f), fill(hv, nk, 2.0f);
    for (int kt = KV_F32; kt <= KV_F16; kt++) {
        size_t esz = kt == KV_F16 ? 2 : 4, blk = (size_t)(kvh * head_rows * hd) * esz / 4;
        float *q[2], *k[2], *v[2], *dst[2][4]; /* [unfused, fused]; K, V of pair 0, 1 */
        for (int f = 0; f < 2; f++) {
            q[f] = to_dev(hq, nq * 4), k[f] = to_dev(hk, nk * 4), v[f] = to_dev(hv, nk * 4);
            for (int d = 0; d < 4; d++)
                dst[f][d] = dev_const(blk, 3.0f);
        }
        kcuda_rope(g, q[0], n, qs, qh, hd, half, dcs, dsn);
        kcuda_rope(g, k[0] + hd, n, ks, 2, hd, half, dcs, dsn);
        for (int d = 0; d < 4; d++)
            kcuda_kv_store(g, (kv_type)kt, dst[0][d], head_rows, r0, d % 2 ? v[0] : k[0], ks, 1,
                           3, hd, n);
        kcuda_rope_kv rk = {.q = q[1], .q_stride = qs, .q_heads = qh, .k = k[1], .v = v[1],
                            .kv_stride = ks, .kv_h0 = 1, .kv_h1 = 3, .head_dim = hd,
                            .half = half, .cs = dcs, .sn = dsn, .type = (kv_type)kt,
                            .head_rows = head_rows, .r0 = r0,
                            .k_dst = {dst[1][0], dst[1][2]}, .v_dst = {dst[1][1], dst[1][3]},
                            .n_dst = 2};
        kcuda_rope_store(g, &rk, n);
        size_t most = nq > nk ? nq : nk;
        most = most > blk ? most : blk;
        float *ha = malloc(most * 4), *hb = malloc(most * 4);
        bool same = dev_same(q[0], q[1], ha, hb, nq) && dev_same(k[0], k[1], ha, hb, nk) &&
                    dev_same(v[0], v[1], ha, hb, nk);
        for (int d = 0; d < 4; d++)
            same &= dev_same(dst[0][d], dst[1][d], ha, hb, blk);
        report_same(kt == KV_F16 ? "fused RoPE + K/V stores, f16" : "fused RoPE + K/V stores, f32",
                    same);
        for (int f = 0; f < 2; f++) {
            kcuda_free(q[f]), kcuda_free(k[f]), kcuda_free(v[f]);
            for (int d = 0; d < 4; d++)
                kcuda_free(dst[f][d]);
        }
        free(ha), free(hb);
    }
    kcuda_free(dcs), kcuda_free(dsn);
    free(cs), free(sn), free(hq), free(hk), free(hv), free(x), free(a), free(b);
}

/* The tensor cores' loads in flight in a step of up to 8 tokens (kcuda_set_matmul_depth): 8 blocks
 * a warp the bits of 4, every quantized type, the plain matmul and gate/up, widths 1 and 5, on
 * rows of 88 blocks of 32 (each warp 11 blocks: a whole round of 8, two of 4, and a remainder);
 * and the depth the rule picks, on fixtures and as the op set reports it. */
static void test_tc_depth(void)
{
    static const struct {
        int set, tiles;
        long blocks, resident8;
        int want;
    } d[] = {{0, 1, 256, 264, 8},  {0, 1, 264, 264, 8}, {0, 1, 265, 264, 4}, {0, 1, 256, 0, 4},
             {0, 2, 4, 264, 4},    {0, 4, 4, 264, 2},   {0, 8, 4, 264, 2},   {4, 1, 4, 264, 4},
             {8, 1, 9999, 264, 8}, {8, 2, 4, 264, 4},   {3, 1, 265, 264, 4}};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        char what[112];
        snprintf(what, sizeof what, "tc depth, set %d, %d tiles a pass, %ld blocks, %ld resident",
                 d[i].set, d[i].tiles, d[i].blocks, d[i].resident8);
        check_int(what, kcuda_depth_rule(d[i].set, d[i].tiles, d[i].blocks, d[i].resident8),
                  d[i].want);
    }
    const int64_t rows = 61, cols = 88 * 32;
    kcuda_set_matmul_kind(g, KCUDA_MM_TC);
    /* 4 row tiles: every device holds them at once (the emulation says so by default) */
    check_int("tc depth reported, Q4_K, 61 rows, W=1", kcuda_matmul_depth(g, KT_Q4_K, rows, 1), 8);
    check_int("tc depth reported, Q4_K, W=9", kcuda_matmul_depth(g, KT_Q4_K, rows, 9), 4);
    check_int("tc depth reported, Q4_K, W=17", kcuda_matmul_depth(g, KT_Q4_K, rows, 17), 2);
    check_int("tc depth reported, F16", kcuda_matmul_depth(g, KT_F16, rows, 1), 0);
    kcuda_set_matmul_depth(g, 4);
    check_int("tc depth reported, Q4_K, W=1, set 4", kcuda_matmul_depth(g, KT_Q4_K, rows, 1), 4);
    float *xw = malloc((size_t)(5 * cols) * 4), *wf = malloc((size_t)(rows * cols) * 4);
    fill(xw, (size_t)(5 * cols), 1.0f);
    fill(wf, (size_t)(rows * cols), 1.0f);
    float *dx = to_dev(xw, (size_t)(5 * cols) * 4);
    float *y4 = kcuda_alloc((size_t)5 * rows * 4), *y8 = kcuda_alloc((size_t)5 * rows * 4);
    float *s4 = kcuda_alloc((size_t)5 * rows * 4), *s8 = kcuda_alloc((size_t)5 * rows * 4);
    float *ha = malloc((size_t)5 * rows * 4), *hb = malloc((size_t)5 * rows * 4);
    for (size_t t = N_FLOAT; t < N_TYPES; t++) {
        size_t rb = kt_row_bytes(all_types[t], (uint64_t)cols);
        uint8_t *q = malloc(rb * rows);
        for (int64_t i = 0; i < rows; i++)
            kt_quantize_row(all_types[t], wf + i * cols, q + (size_t)i * rb, cols);
        kmat m = {.type = all_types[t], .rows = rows, .cols = cols, .row_bytes = rb};
        m.data = to_dev(q, rb * rows);
        for (int n = 1; n <= 5; n += 4) {
            float *y[2] = {y4, y8}, *sg[2] = {s4, s8};
            for (int k = 0; k < 2; k++) {
                kcuda_set_matmul_depth(g, 4 << k);
                must(kcuda_matmul(g, &m, 0, rows, dx, n, y[k], rows, err, sizeof err) ||
                         kcuda_matmul_silu(g, &m, &m, 0, rows, dx, n, sg[k], rows, err, sizeof err),
                     "matmul");
            }
            char what[96];
            snprintf(what, sizeof what, "matmul (and gate/up) %s, tensor cores 8 deep, W=%d",
                     kt_traits_of(all_types[t])->name, n);
            report_same(what, dev_same(y4, y8, ha, hb, (size_t)n * rows) &&
                                  dev_same(s4, s8, ha, hb, (size_t)n * rows));
        }
        kcuda_free((void *)m.data);
        free(q);
    }
    kcuda_set_matmul_depth(g, 0);
    kcuda_set_matmul_kind(g, KCUDA_MM_AUTO);
    kcuda_free(dx), kcuda_free(y4), kcuda_free(y8), kcuda_free(s4), kcuda_free(s8);
    free(xw), free(wf), free(ha), free(hb);
}

static void test_mapped(void)
{
    int dim = 256, n = 3;
    size_t bytes = 1 << 20; /* a page-aligned block, as the arena is */
    float *host = aligned_alloc(4096, bytes), *ref = malloc((size_t)n * dim * 4);
    fill(host, (size_t)(n + 1) * dim, 2.0f);
    for (int t = 0; t < n; t++)
        k_rmsnorm(ref + (size_t)t * dim, host + (size_t)t * dim, host + (size_t)n * dim, dim, 1e-6f);
    void *dev;
    must(kcuda_register(host, bytes, &dev, err, sizeof err), "register");
    float *d = dev;
    kcuda_rmsnorm(g, d + 8 * dim, d, d + n * dim, dim, n, 1e-6f);
    must(kcuda_sync(g, err, sizeof err), "sync");
    check("mapped host memory (rmsnorm in place)", max_rel(host + 8 * dim, ref, (size_t)n * dim),
          1e-5);
    kcuda_unregister(host);
    free(host);
    free(ref);
}

int main(void)
{
    char why[256];
    if (kcuda_devices(why, sizeof why) < 1) {
        printf("unit_cuda_kernels: SKIPPED: %s; the GPU kernels are compiled but not run here\n",
               why);
        return 77;
    }
    const char *s = getenv("OROCHI_SEED");
    unsigned long long seed = s ? strtoull(s, NULL, 10) : (unsigned long long)time(NULL);
    rng = seed;
    printf("unit_cuda_kernels: seed %llu (OROCHI_SEED=%llu repeats it)\n", seed, seed);
    g = kcuda_new(0, err, sizeof err);
    if (!g) {
        printf("unit_cuda_kernels: %s\n", err);
        return 1;
    }
    test_matmul();
    test_tc_weights();
    test_float_rows();
    test_elementwise();
    test_att_parts_rule();
    test_attention(KV_F32);
    test_attention(KV_F16);
    test_copies();
    test_fused();
    test_tc_depth();
    test_mapped();
    kcuda_destroy(&g);
    printf("unit_cuda_kernels: %s\n", failures ? "FAILED" : "all agree");
    return failures ? 1 : 0;
}
