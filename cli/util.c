/*
 * cli/util.c — see util.h. Option values are checked in full (no trailing junk, in range) so a
 * typo becomes an error message rather than a silent default.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/util.h"
#include "base/buf.h"

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool cli_int(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "orochi %s: %s expects an integer in [%ld, %ld], got '%s'\n", cmd, opt, lo,
                hi, s);
        return false;
    }
    *out = v;
    return true;
}

bool cli_float(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "orochi %s: %s expects a number in [%g, %g], got '%s'\n", cmd, opt, lo, hi,
                s);
        return false;
    }
    *out = v;
    return true;
}

const char *cli_value(const char *cmd, int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "orochi %s: %s needs a value\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_parse_ids(const char *cmd, const char *s, int32_t **ids)
{
    size_t cap = strlen(s) / 2 + 1, n = 0;
    int32_t *out = malloc(cap * sizeof *out);
    if (!out)
        return -1;
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n')
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "orochi %s: bad token id near '%.16s'\n", cmd, p);
            free(out);
            return -1;
        }
        out[n++] = (int32_t)v;
        p = end;
    }
    *ids = out;
    return (int)n;
}

uint64_t cli_peak_rss(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (uint64_t)ru.ru_maxrss * 1024;
}

int cli_online_cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void cli_buf_put(cli_buf *b, const void *src, size_t n)
{
    if (b->oom || n == 0)
        return;
    void *p = b->p;
    if (buf_grow(&p, &b->cap, b->n + n, 1, 1 << 16)) {
        b->oom = true;
        return;
    }
    b->p = p;
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

void cli_buf_u32(cli_buf *b, uint32_t v)
{
    uint8_t le[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    cli_buf_put(b, le, 4);
}

void cli_buf_u64(cli_buf *b, uint64_t v)
{
    cli_buf_u32(b, (uint32_t)v);
    cli_buf_u32(b, (uint32_t)(v >> 32));
}

void cli_buf_str(cli_buf *b, const char *s, uint64_t len)
{
    cli_buf_u64(b, len);
    cli_buf_put(b, s, (size_t)len);
}

static int cli_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double cli_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cli_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void cli_synthetic_ids(int32_t *ids, int n, int vocab)
{
    uint64_t s = 12345;
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((s >> 33) % (uint64_t)vocab);
    }
}

char *cli_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb)
                free(buf);
            buf = nb;
        }
    }
    if (buf && ferror(f)) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf)
        buf[n] = 0;
    if (len)
        *len = buf ? n : 0;
    return buf;
}

FILE *cli_open_append(const char *path)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(dir, 0755);
            *p = '/';
        }
    return fopen(path, "a");
}

double cli_loadavg(void)
{
    double l[1] = {0};
    return getloadavg(l, 1) == 1 ? l[0] : -1;
}

int cli_int_list(const char *cmd, const char *opt, const char *s, long lo, long hi, int *out,
                 int max)
{
    char *dup = strdup(s), *save = NULL;
    int n = 0;
    if (!dup)
        return -1;
    for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long v;
        if (n == max) {
            fprintf(stderr, "orochi %s: %s takes at most %d values\n", cmd, opt, max);
            free(dup);
            return -1;
        }
        if (!cli_int(cmd, opt, tok, lo, hi, &v)) {
            free(dup);
            return -1;
        }
        out[n++] = (int)v;
    }
    free(dup);
    if (!n) {
        fprintf(stderr, "orochi %s: %s expects a list such as 1,2,4, got '%s'\n", cmd, opt, s);
        return -1;
    }
    return n;
}
