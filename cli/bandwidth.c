/*
 * cli/bandwidth.c — measure and cache the machine's read bandwidth (see bandwidth.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "cli/bandwidth.h"
#include "cli/util.h"
#include "kernels/cpu/kernels.h"

#define BW_BYTES ((size_t)384 << 20) /* well past any last-level cache here */
#define BW_PASSES 6

typedef struct {
    const uint8_t *buf;
    size_t bytes;
    double sink[64];
} bw_job;

/* Sum a slice with four independent accumulators, 128 bytes per iteration; with `ahead`, a
 * software prefetch that many bytes ahead (the matmul's weight streams prefetch 8 KiB ahead, and
 * on some CPUs that reads faster than the hardware prefetcher alone). */
static void bw_read_ahead(bw_job *j, int64_t begin, int64_t end, int thread, size_t ahead)
{
    size_t per = j->bytes / 64, lo = (size_t)begin * per, hi = (size_t)end * per;
    double s = 0;
#if defined(__AVX2__)
    __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
    for (size_t i = lo; i + 128 <= hi; i += 128) {
        if (ahead) {
            __builtin_prefetch(j->buf + i + ahead, 0, 3);
            __builtin_prefetch(j->buf + i + ahead + 64, 0, 3);
        }
        a = _mm256_add_ps(a, _mm256_load_ps((const float *)(const void *)(j->buf + i)));
        b = _mm256_add_ps(b, _mm256_load_ps((const float *)(const void *)(j->buf + i + 32)));
        c = _mm256_add_ps(c, _mm256_load_ps((const float *)(const void *)(j->buf + i + 64)));
        d = _mm256_add_ps(d, _mm256_load_ps((const float *)(const void *)(j->buf + i + 96)));
    }
    float o[8];
    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
    for (int k = 0; k < 8; k++)
        s += o[k];
#else
    const uint64_t *p = (const uint64_t *)(const void *)(j->buf + lo);
    uint64_t x0 = 0, x1 = 0, x2 = 0, x3 = 0;
    for (size_t i = 0; i + 4 <= (hi - lo) / 8; i += 4) {
        x0 += p[i];
        x1 += p[i + 1];
        x2 += p[i + 2];
        x3 += p[i + 3];
    }
    s = (double)(x0 + x1 + x2 + x3);
    (void)ahead;
#endif
    j->sink[thread % 64] += s;
}

static void bw_read(void *argp, int64_t begin, int64_t end, int thread)
{
    bw_read_ahead(argp, begin, end, thread, 0);
}

static void bw_read_pf(void *argp, int64_t begin, int64_t end, int thread)
{
    bw_read_ahead(argp, begin, end, thread, 8192);
}

#if defined(__AVX2__) && defined(__F16C__)
/* The same stream read as half floats and widened (the shape of a decode step's float kernel):
 * on some CPUs a loop that does a little work per load streams faster than a bare one. */
static void bw_read_f16(void *argp, int64_t begin, int64_t end, int thread)
{
    bw_job *j = argp;
    size_t per = j->bytes / 64, lo = (size_t)begin * per, hi = (size_t)end * per;
    __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
    for (size_t i = lo; i + 64 <= hi; i += 64) {
        a = _mm256_add_ps(a, _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)(j->buf + i))));
        b = _mm256_add_ps(b, _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)(j->buf + i + 16))));
        c = _mm256_add_ps(c, _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)(j->buf + i + 32))));
        d = _mm256_add_ps(d, _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)(j->buf + i + 48))));
    }
    float o[8];
    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
    double s = 0;
    for (int k = 0; k < 8; k++)
        s += o[k];
    j->sink[thread % 64] += s;
}
#endif

double bw_measure(int threads)
{
    void *buf = NULL;
    if (posix_memalign(&buf, 4096, BW_BYTES))
        return 0;
    memset(buf, 1, BW_BYTES); /* fault every page in before timing */
    kpool *pool = kpool_new(threads);
    bw_job j = {.buf = buf, .bytes = BW_BYTES};
    double best = 0;
    for (int pass = 0; pass < BW_PASSES; pass++) {
        double t0 = cli_now();
        /* 64 slices claimed by the threads: each thread streams contiguous runs; the floor is the
         * best of three loop shapes (a bare sum, the same with a software prefetch, and half
         * floats widened) */
#if defined(__AVX2__) && defined(__F16C__)
        kpool_fn fn = pass % 3 == 0 ? bw_read : pass % 3 == 1 ? bw_read_pf : bw_read_f16;
#else
        kpool_fn fn = pass % 2 ? bw_read_pf : bw_read;
#endif
        kpool_run(pool, 64, 64 / (threads > 0 ? threads : 1), fn, &j);
        double gbs = (double)BW_BYTES / (cli_now() - t0) / 1e9;
        if (gbs > best)
            best = gbs;
    }
    kpool_destroy(&pool);
    free(buf);
    return best;
}

static char bw_path[1024];

const char *bw_cache_path(void)
{
    if (!bw_path[0]) {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && *xdg)
            snprintf(bw_path, sizeof bw_path, "%s/orochi/bandwidth", xdg);
        else
            snprintf(bw_path, sizeof bw_path, "%s/.cache/orochi/bandwidth",
                     home && *home ? home : "/tmp");
    }
    return bw_path;
}

/* This CPU's model name (tabs and newlines removed), the cache key. */
static void bw_cpu(char *out, size_t n)
{
    snprintf(out, n, "unknown-cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!strncmp(line, "model name", 10) && colon) {
            snprintf(out, n, "%s", colon + 2);
            break;
        }
    }
    fclose(f);
    for (char *p = out; *p; p++)
        if (*p == '\t' || *p == '\n')
            *p = *p == '\n' ? 0 : ' ';
}

static double bw_lookup(int threads)
{
    char cpu[256], line[512];
    bw_cpu(cpu, sizeof cpu);
    FILE *f = fopen(bw_cache_path(), "r");
    if (!f)
        return 0;
    double found = 0;
    while (fgets(line, sizeof line, f)) {
        char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
        if (!t2)
            continue;
        *t1 = 0;
        if (!strcmp(line, cpu) && atoi(t1 + 1) == threads)
            found = atof(t2 + 1);
    }
    fclose(f);
    return found;
}

double bw_store(int threads, double gbs)
{
    double had = bw_lookup(threads);
    if (had >= gbs)
        return had;
    char cpu[256], dir[1024], line[512];
    bw_cpu(cpu, sizeof cpu);
    const char *path = bw_cache_path();
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(dir, 0755);
            *p = '/';
        }
    /* keep every other line, replace ours */
    char *kept = NULL;
    size_t klen = 0;
    FILE *mem = open_memstream(&kept, &klen), *f = fopen(path, "r");
    if (!mem) {
        if (f)
            fclose(f);
        return gbs;
    }
    if (f) {
        while (fgets(line, sizeof line, f)) {
            char key[512];
            snprintf(key, sizeof key, "%s\t%d\t", cpu, threads);
            if (strncmp(line, key, strlen(key)))
                fputs(line, mem);
        }
        fclose(f);
    }
    fprintf(mem, "%s\t%d\t%.2f\n", cpu, threads, gbs);
    fclose(mem);
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid());
    FILE *out = fopen(tmp, "w");
    if (out && fwrite(kept, 1, klen, out) == klen && fclose(out) == 0)
        rename(tmp, path);
    else {
        if (out)
            fclose(out);
        remove(tmp);
        fprintf(stderr, "orochi: cannot write the bandwidth cache %s: %s\n", path, strerror(errno));
    }
    free(kept);
    return gbs;
}

double bw_floor(int threads, bool *measured_now)
{
    double g = bw_lookup(threads);
    if (measured_now)
        *measured_now = g <= 0;
    if (g > 0)
        return g;
    fprintf(stderr, "orochi: measuring the read bandwidth at %d thread%s (cached in %s)...\n",
            threads, threads == 1 ? "" : "s", bw_cache_path());
    g = bw_measure(threads);
    if (g > 0)
        bw_store(threads, g);
    return g;
}
