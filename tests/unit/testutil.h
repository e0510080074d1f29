/*
 * tests/unit/testutil.h — shared helpers for the C unit tests: make a tiny random model with the
 * orochi CLI, synchronise column parts run as threads, compare float arrays by relative L2 error.
 */
#ifndef OROCHI_TESTUTIL_H
#define OROCHI_TESTUTIL_H

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Write a tiny model of `type` to OROCHI_TMP and return its path (static buffer per call site). */
static inline const char *tu_make_model(const char *tag, const char *type, const char *extra)
{
    static char paths[8][512];
    static int next;
    char *path = paths[next++ % 8];
    const char *bin = getenv("OROCHI_BIN"), *tmp = getenv("OROCHI_TMP");
    if (!bin || !tmp) {
        fprintf(stderr, "OROCHI_BIN and OROCHI_TMP must be set (ctest sets them)\n");
        exit(1);
    }
    snprintf(path, 512, "%s/unit-%s-%s.gguf", tmp, tag, type);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' mkmodel --out '%s' --type %s --seed 11 %s 2>/dev/null", bin, path,
             type, extra ? extra : "--layers 2 --dim 64 --ffn 96 --heads 4 --kv-heads 2 --vocab 300 --ctx 128");
    if (system(cmd) != 0) {
        fprintf(stderr, "mkmodel failed: %s\n", cmd);
        exit(1);
    }
    return path;
}

/* llama_ctx_params.sync for column parts run as threads: arg is a pthread_barrier_t (what the
 * worker processes do through the arena barrier). */
static inline int tu_barrier_sync(void *arg)
{
    pthread_barrier_wait(arg);
    return 0;
}

static inline double tu_rel_l2(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
