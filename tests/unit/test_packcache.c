/*
 * unit_packcache — the packed-weights cache (model/packcache.h): built once and mapped by the
 * next loads; a corrupt, stale-version or wrong-length cache rebuilt, never used; a model file
 * rewritten in place (same size, same time stamp) gets a new cache; concurrent first loads build
 * once; an unusable directory or OROCHI_PACK_CACHE=off falls back to private packing; and a model
 * loaded through the cache computes bit-identical logits to one packed privately.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/llama.h"
#include "model/packcache.h"
#include "tests/unit/testutil.h"

static char dir[512], model[700], fills[600];

/* the "packed" bytes: a function of the model file's first byte and the position; each call
 * appends a byte to the fills file (counts builds across processes) */
static void fill(void *dst, size_t len, void *arg)
{
    (void)arg;
    int f = open(model, O_RDONLY);
    unsigned char seed = 0;
    if (f >= 0) {
        if (read(f, &seed, 1) != 1)
            seed = 0;
        close(f);
    }
    for (size_t i = 0; i < len; i++)
        ((unsigned char *)dst)[i] = (unsigned char)(seed + i * 7 + (i >> 12));
    int c = open(fills, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (c >= 0) {
        if (write(c, "x", 1) != 1)
            abort();
        close(c);
    }
}

static int n_fills(void)
{
    struct stat st;
    return stat(fills, &st) ? 0 : (int)st.st_size;
}

static void write_model(unsigned char first, size_t size)
{
    FILE *f = fopen(model, "wb");
    assert_non_null(f);
    fputc(first, f);
    for (size_t i = 1; i < size; i++)
        fputc((int)(i & 0xff), f);
    fclose(f);
}

static void expect_data(const packcache_block *b, unsigned char seed)
{
    const unsigned char *p = b->base;
    for (size_t i = 0; i < b->bytes; i += 997)
        assert_int_equal(p[i], (unsigned char)(seed + i * 7 + (i >> 12)));
}

static const uint64_t DESC[4] = {1, 2, 3, 4};
#define BYTES ((size_t)3 << 20)

static packcache_block get(void)
{
    packcache_block b;
    char err[256];
    assert_int_equal(packcache_get(model, packcache_identity(model), DESC, sizeof DESC, BYTES,
                                   fill, NULL, &b, err, sizeof err),
                     0);
    return b;
}

static int setup(void **state)
{
    (void)state;
    const char *tmp = getenv("OROCHI_TMP");
    snprintf(dir, sizeof dir, "%s/packcache-%d", tmp ? tmp : "/tmp", (int)getpid());
    snprintf(model, sizeof model, "%s-model.gguf", dir);
    snprintf(fills, sizeof fills, "%s-fills", dir);
    setenv("OROCHI_PACK_CACHE", dir, 1);
    unlink(fills);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'* '%s'", dir, model, fills);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_build_then_map(void **state)
{
    (void)state;
    write_model(11, 100000);
    packcache_block a = get();
    assert_true(a.built);
    assert_non_null(a.map);
    expect_data(&a, 11);
    packcache_block b = get();
    assert_false(b.built);
    assert_non_null(b.map);
    expect_data(&b, 11);
    assert_int_equal(n_fills(), 1);
    assert_string_equal(a.path, b.path);
    packcache_release(&a);
    packcache_release(&b);
}

/* flip one byte of the cache file at off */
static void damage(const char *path, off_t off)
{
    int f = open(path, O_RDWR);
    assert_true(f >= 0);
    unsigned char c;
    assert_int_equal(pread(f, &c, 1, off), 1);
    c ^= 0x5a;
    assert_int_equal(pwrite(f, &c, 1, off), 1);
    close(f);
}

static void test_bad_cache_rebuilt(void **state)
{
    (void)state;
    write_model(22, 100000);
    packcache_block a = get();
    char path[512];
    snprintf(path, sizeof path, "%s", a.path);
    packcache_release(&a);
    int before = n_fills();
    /* a byte of the data (checksum), the version field (offset 8), the length (cut short) */
    off_t offs[] = {(off_t)PACKCACHE_DATA_OFF + 12345, 8};
    for (int i = 0; i < 3; i++) {
        if (i < 2) {
            damage(path, offs[i]);
        } else {
            assert_int_equal(truncate(path, (off_t)(PACKCACHE_DATA_OFF + BYTES - 4096)), 0);
        }
        packcache_block b = get();
        assert_true(b.built);
        expect_data(&b, 22);
        assert_int_equal(n_fills(), before + i + 1);
        packcache_release(&b);
    }
}

static void test_rewritten_model(void **state)
{
    (void)state;
    write_model(33, 100000);
    struct stat st0;
    assert_int_equal(stat(model, &st0), 0);
    packcache_block a = get();
    expect_data(&a, 33);
    char old[512];
    snprintf(old, sizeof old, "%s", a.path);
    packcache_release(&a);
    /* the same inode, size and time stamps, other bytes */
    write_model(44, 100000);
    struct timespec ts[2] = {st0.st_atim, st0.st_mtim};
    assert_int_equal(utimensat(AT_FDCWD, model, ts, 0), 0);
    packcache_block b = get();
    assert_true(b.built);
    expect_data(&b, 44);
    /* the old version's cache is gone */
    assert_string_not_equal(old, b.path);
    assert_int_not_equal(access(old, F_OK), 0);
    packcache_release(&b);
}

static void test_concurrent_first_loads(void **state)
{
    (void)state;
    write_model(55, 100000);
    /* a new model name: no cache yet */
    char other[720];
    snprintf(other, sizeof other, "%s-b.gguf", model);
    assert_int_equal(rename(model, other), 0);
    memcpy(model, other, sizeof model);
    int before = n_fills();
    pid_t kids[4];
    for (int i = 0; i < 4; i++) {
        kids[i] = fork();
        if (!kids[i]) {
            packcache_block b;
            char err[256];
            int rc = packcache_get(model, packcache_identity(model), DESC, sizeof DESC, BYTES,
                                   fill, NULL, &b, err, sizeof err);
            const unsigned char *p = b.base;
            _exit(rc || !b.map || p[4096] != (unsigned char)(55 + 4096 * 7 + 1) ? 1 : 0);
        }
    }
    for (int i = 0; i < 4; i++) {
        int ws;
        assert_int_equal(waitpid(kids[i], &ws, 0), kids[i]);
        assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    }
    assert_int_equal(n_fills(), before + 1);
}

static void test_private_fallback(void **state)
{
    (void)state;
    write_model(66, 100000);
    /* a directory that cannot be made (below a regular file) */
    char bad[760];
    snprintf(bad, sizeof bad, "%s/below", model);
    setenv("OROCHI_PACK_CACHE", bad, 1);
    packcache_block a = get();
    assert_null(a.map);
    assert_false(a.built);
    expect_data(&a, 66);
    packcache_release(&a);
    setenv("OROCHI_PACK_CACHE", "off", 1);
    char out[64];
    assert_false(packcache_dir(out, sizeof out));
    packcache_block b = get();
    assert_null(b.map);
    expect_data(&b, 66);
    packcache_release(&b);
    setenv("OROCHI_PACK_CACHE", dir, 1);
}

/* A model through the cache (built, then mapped) and packed privately: the same logits, bit for
 * bit, for every packed type. */
static void test_model_logits(void **state)
{
    (void)state;
    const char *types[] = {"q4_1", "q8_0", "q4_k", "f16"};
    for (int t = 0; t < 4; t++) {
        const char *path = tu_make_model(
            "packcache", types[t],
            strcmp(types[t], "q4_k") ? NULL
                                     : "--layers 2 --dim 256 --ffn 256 --heads 4 --kv-heads 2 "
                                       "--vocab 300 --ctx 128");
        float *got[3];
        int V = 0;
        for (int k = 0; k < 3; k++) { /* private, cache built, cache mapped */
            setenv("OROCHI_PACK_CACHE", k ? dir : "off", 1);
            char err[256];
            llama_model *m = llama_model_load(path, err, sizeof err);
            assert_non_null(m);
            assert_true(k ? m->pack.map != NULL : m->pack.map == NULL);
            V = m->cfg.vocab;
            llama_ctx_params p = {.n_threads = 2, .max_width = 4, .n_ctx = 32};
            llama_ctx *ctx = llama_ctx_new(m, &p, err, sizeof err);
            assert_non_null(ctx);
            int32_t prompt[] = {1, 5, 9, 3, 7};
            got[k] = malloc((size_t)V * sizeof *got[k]);
            assert_int_equal(llama_prefill(ctx, prompt, 5, got[k], err, sizeof err), 0);
            llama_ctx_destroy(&ctx);
            llama_model_destroy(&m);
        }
        assert_memory_equal(got[0], got[1], (size_t)V * sizeof(float));
        assert_memory_equal(got[0], got[2], (size_t)V * sizeof(float));
        for (int k = 0; k < 3; k++)
            free(got[k]);
    }
    setenv("OROCHI_PACK_CACHE", dir, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_build_then_map),
        cmocka_unit_test(test_bad_cache_rebuilt),
        cmocka_unit_test(test_rewritten_model),
        cmocka_unit_test(test_concurrent_first_loads),
        cmocka_unit_test(test_private_fallback),
        cmocka_unit_test(test_model_logits),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
