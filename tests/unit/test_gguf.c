/*
 * tests/unit/test_gguf — the GGUF reader against valid and malformed files.
 *
 * A small builder writes a GGUF v2/v3 file into memory: scalar keys of every type, a string, an
 * array of u32, an array of strings, a nested array, general.alignment = 32 and three tensors
 * (F32, Q8_0, F32) laid out with alignment padding. While writing, it records where the fields
 * sit, so the malformed cases are made by patching one field of a valid file. Every buffer handed
 * to the reader is a heap copy of exactly the file's size, so ASan flags any read past its end.
 *
 * Checked: values and tensor pointers of the valid files (in memory and through gguf_open on a
 * real file); every truncation is rejected; absurd counts and lengths, bad offsets, duplicates,
 * unknown type ids and bad alignments are rejected with a one-line error that mentions "byte"
 * and the field; flipping any single byte never crashes, and an accepted flip keeps all tensor
 * data inside the buffer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "model/gguf.h"

/* ===== a growable byte buffer ===== */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} tbuf;

static void tb_put(tbuf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n)
            cap *= 2;
        b->p = realloc(b->p, cap);
        assert_non_null(b->p);
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void tb_u8(tbuf *b, uint8_t v)
{
    tb_put(b, &v, 1);
}

static void tb_le(tbuf *b, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        tb_u8(b, (uint8_t)(v >> (8 * i)));
}

static void tb_u16(tbuf *b, uint16_t v) { tb_le(b, v, 2); }
static void tb_u32(tbuf *b, uint32_t v) { tb_le(b, v, 4); }
static void tb_u64(tbuf *b, uint64_t v) { tb_le(b, v, 8); }

static void tb_f32(tbuf *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    tb_u32(b, u);
}

static void tb_f64(tbuf *b, double f)
{
    uint64_t u;
    memcpy(&u, &f, 8);
    tb_u64(b, u);
}

static void tb_str(tbuf *b, const char *s)
{
    tb_u64(b, strlen(s));
    tb_put(b, s, strlen(s));
}

static void tb_key(tbuf *b, const char *key, uint32_t type)
{
    tb_str(b, key);
    tb_u32(b, type);
}

static void tb_pad(tbuf *b, size_t align)
{
    while (b->n % align)
        tb_u8(b, 0);
}

static void tb_patch_le(tbuf *b, size_t at, uint64_t v, int bytes)
{
    assert_true(at + (size_t)bytes <= b->n);
    for (int i = 0; i < bytes; i++)
        b->p[at + (size_t)i] = (uint8_t)(v >> (8 * i));
}

/* ===== the test file ===== */

#define T_N_TENSORS 3
#define T_N_KV 19

/* Where the builder put the fields that the malformed cases patch. */
typedef struct {
    size_t str_len;       /* length field of general.name's value */
    size_t arr_len;       /* count field of test.arr_u32 */
    size_t arr_elem_type; /* element type field of test.arr_u32 */
    size_t key_type;      /* value type field of test.u8 */
    size_t key_i8;        /* first byte of the key text "test.i8" */
    size_t strarr_len;    /* count field of test.arr_str */
    size_t strarr_elem0;  /* length field of test.arr_str[0] */
    size_t nested_len;    /* count of the inner arrays of test.nested */
    size_t align_val;     /* value of general.alignment */
    size_t t_name[T_N_TENSORS];  /* first byte of each tensor's name text */
    size_t t_ndims[T_N_TENSORS];
    size_t t_ne[T_N_TENSORS];    /* ne[0] of each tensor */
    size_t t_type[T_N_TENSORS];
    size_t t_off[T_N_TENSORS];
    uint64_t t_rel[T_N_TENSORS]; /* offset of each tensor in the data section */
    uint64_t t_bytes[T_N_TENSORS];
    size_t data_offset;
} tlayout;

static const char *const T_NAMES[T_N_TENSORS] = {"tok.aaa", "tok.bbb", "norm.w"};
static const uint32_t T_TYPES[T_N_TENSORS] = {0 /* F32 */, 8 /* Q8_0 */, 0 /* F32 */};
static const uint64_t T_NE[T_N_TENSORS][2] = {{4, 3}, {64, 2}, {5, 1}};
static const uint32_t T_DIMS[T_N_TENSORS] = {2, 2, 1};

/* Build the valid test file (version 2 or 3). */
static tbuf build_file(uint32_t version, tlayout *L)
{
    tbuf b = {0};
    tb_put(&b, "GGUF", 4);
    tb_u32(&b, version);
    tb_u64(&b, T_N_TENSORS);
    tb_u64(&b, T_N_KV);

    tb_key(&b, "general.architecture", 8);
    tb_str(&b, "llama");
    tb_key(&b, "general.name", 8);
    L->str_len = b.n;
    tb_str(&b, "tiny test");
    tb_key(&b, "test.u8", 0);
    L->key_type = b.n - 4;
    tb_u8(&b, 200);
    tb_key(&b, "test.i8", 1);
    L->key_i8 = b.n - 4 - 7;
    tb_u8(&b, (uint8_t)-100);
    tb_key(&b, "test.u16", 2);
    tb_u16(&b, 60000);
    tb_key(&b, "test.i16", 3);
    tb_u16(&b, (uint16_t)-30000);
    tb_key(&b, "test.u32", 4);
    tb_u32(&b, 4000000000u);
    tb_key(&b, "test.i32", 5);
    tb_u32(&b, (uint32_t)-2000000000);
    tb_key(&b, "test.f32", 6);
    tb_f32(&b, 1.5f);
    tb_key(&b, "test.bool", 7);
    tb_u8(&b, 1);
    tb_key(&b, "test.u64", 10);
    tb_u64(&b, 0xfedcba9876543210ull);
    tb_key(&b, "test.i64", 11);
    tb_u64(&b, (uint64_t)-5000000000ll);
    tb_key(&b, "test.f64", 12);
    tb_f64(&b, -0.25);
    tb_key(&b, "test.empty", 8);
    tb_str(&b, "");
    tb_key(&b, "test.arr_u32", 9);
    L->arr_elem_type = b.n;
    tb_u32(&b, 4);
    L->arr_len = b.n;
    tb_u64(&b, 5);
    for (uint32_t i = 0; i < 5; i++)
        tb_u32(&b, 10 * i + 1);
    tb_key(&b, "test.arr_str", 9);
    tb_u32(&b, 8);
    L->strarr_len = b.n;
    tb_u64(&b, 3);
    L->strarr_elem0 = b.n;
    tb_str(&b, "alpha");
    tb_str(&b, "");
    tb_str(&b, "gamma");
    tb_key(&b, "test.arr_f32", 9);
    tb_u32(&b, 6);
    tb_u64(&b, 2);
    tb_f32(&b, 0.5f);
    tb_f32(&b, -2.0f);
    /* test.nested: [[1, 2], [], [3]] as arrays of int16 */
    tb_key(&b, "test.nested", 9);
    tb_u32(&b, 9);
    tb_u64(&b, 3);
    tb_u32(&b, 3);
    L->nested_len = b.n;
    tb_u64(&b, 2);
    tb_u16(&b, 1);
    tb_u16(&b, 2);
    tb_u32(&b, 3);
    tb_u64(&b, 0);
    tb_u32(&b, 3);
    tb_u64(&b, 1);
    tb_u16(&b, 3);
    tb_key(&b, "general.alignment", 4);
    L->align_val = b.n;
    tb_u32(&b, 32);

    uint64_t rel = 0;
    for (int t = 0; t < T_N_TENSORS; t++) {
        tb_u64(&b, strlen(T_NAMES[t]));
        L->t_name[t] = b.n;
        tb_put(&b, T_NAMES[t], strlen(T_NAMES[t]));
        L->t_ndims[t] = b.n;
        tb_u32(&b, T_DIMS[t]);
        L->t_ne[t] = b.n;
        for (uint32_t d = 0; d < T_DIMS[t]; d++)
            tb_u64(&b, T_NE[t][d]);
        L->t_type[t] = b.n;
        tb_u32(&b, T_TYPES[t]);
        L->t_off[t] = b.n;
        tb_u64(&b, rel);
        uint64_t row = T_TYPES[t] == 8 ? T_NE[t][0] / 32 * 34 : T_NE[t][0] * 4;
        L->t_rel[t] = rel;
        L->t_bytes[t] = row * T_NE[t][1];
        rel = (rel + L->t_bytes[t] + 31) / 32 * 32;
    }
    tb_pad(&b, 32);
    L->data_offset = b.n;
    for (int t = 0; t < T_N_TENSORS; t++) {
        while (b.n < L->data_offset + L->t_rel[t])
            tb_u8(&b, 0);
        for (uint64_t i = 0; i < L->t_bytes[t]; i++)
            tb_u8(&b, (uint8_t)(t * 16 + i));
    }
    return b;
}

/* ===== helpers ===== */

/* Open an exact-size heap copy of buf[0, n): ASan catches any read past n. The copy is returned
 * through *copy and must outlive the file. */
static gguf_file *open_copy(const uint8_t *buf, size_t n, uint8_t **copy, char *err, size_t errlen)
{
    *copy = malloc(n ? n : 1);
    assert_non_null(*copy);
    if (n)
        memcpy(*copy, buf, n);
    return gguf_open_memory(*copy, n, "t.gguf", err, errlen);
}

/* Walk everything an accepted file exposes; tensor data must lie inside the buffer. */
static void walk_file(const gguf_file *f, const uint8_t *buf, size_t n)
{
    unsigned sum = 0;
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        assert_true(kv->key.len <= n);
        for (uint64_t j = 0; j < kv->key.len; j++)
            sum += (unsigned char)kv->key.ptr[j];
        if (kv->value.type == GGUF_STRING) {
            for (uint64_t j = 0; j < kv->value.str.len; j++)
                sum += (unsigned char)kv->value.str.ptr[j];
        } else if (kv->value.type == GGUF_ARRAY) {
            const gguf_array *a = &kv->value.arr;
            for (uint64_t j = 0; j < a->n; j++) {
                if (a->elem == GGUF_STRING)
                    sum += a->strs[j].len ? (unsigned char)a->strs[j].ptr[a->strs[j].len - 1] : 0;
                else if (a->elem == GGUF_ARRAY)
                    sum += (unsigned)a->items[j].arr.n;
                else
                    sum += (unsigned)gguf_array_int(a, j) + (gguf_array_float(a, j) > 0.0);
            }
        }
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        const uint8_t *d = t->data;
        assert_true(d >= buf + f->data_offset);
        assert_true(t->nbytes <= n);
        assert_true(d + t->nbytes <= buf + n);
        if (t->nbytes)
            sum += d[0] + d[t->nbytes - 1];
    }
    (void)sum;
}

/* The error must be one non-empty line mentioning "byte". */
static void check_error(const char *err)
{
    if (!err[0] || strchr(err, '\n') || !strstr(err, "byte"))
        fail_msg("bad error text: '%s'", err);
}

/* Patch a valid v3 file, expect rejection, and return the error for further checks. */
static void expect_reject(const tbuf *b, char *err, size_t errlen)
{
    uint8_t *copy;
    gguf_file *f = open_copy(b->p, b->n, &copy, err, errlen);
    if (f)
        fail_msg("malformed file accepted");
    check_error(err);
    free(copy);
}

static tbuf copy_of(const tbuf *b)
{
    tbuf c = {malloc(b->n), b->n, b->n};
    assert_non_null(c.p);
    memcpy(c.p, b->p, b->n);
    return c;
}

/* ===== valid files ===== */

static void check_valid(uint32_t version)
{
    tlayout L;
    tbuf b = build_file(version, &L);
    uint8_t *copy;
    char err[256];
    gguf_file *f = open_copy(b.p, b.n, &copy, err, sizeof err);
    if (!f)
        fail_msg("valid file rejected: %s", err);
    assert_int_equal(f->version, version);
    assert_int_equal(f->n_kv, T_N_KV);
    assert_int_equal(f->n_tensors, T_N_TENSORS);
    assert_int_equal(f->alignment, 32);
    assert_int_equal(f->data_offset, L.data_offset);
    assert_int_equal(f->size, b.n);
    assert_string_equal(f->path, "t.gguf");

    uint64_t u;
    int64_t i;
    uint32_t u32;
    float x;
    bool flag;
    gguf_str s;
    assert_true(gguf_get_str(f, "general.architecture", &s));
    assert_true(gguf_str_eq(s, "llama"));
    assert_false(gguf_str_eq(s, "llam"));
    assert_true(gguf_get_str(f, "general.name", &s));
    assert_true(gguf_str_eq(s, "tiny test"));
    assert_true(gguf_get_str(f, "test.empty", &s));
    assert_int_equal(s.len, 0);
    assert_true(gguf_get_u64(f, "test.u8", &u));
    assert_int_equal(u, 200);
    assert_true(gguf_get_i64(f, "test.i8", &i));
    assert_int_equal(i, -100);
    assert_false(gguf_get_u64(f, "test.i8", &u)); /* negative does not fit */
    assert_true(gguf_get_u32(f, "test.u16", &u32));
    assert_int_equal(u32, 60000);
    assert_true(gguf_get_i64(f, "test.i16", &i));
    assert_int_equal(i, -30000);
    assert_true(gguf_get_u32(f, "test.u32", &u32));
    assert_int_equal(u32, 4000000000u);
    assert_true(gguf_get_i64(f, "test.i32", &i));
    assert_int_equal(i, -2000000000);
    assert_true(gguf_get_f32(f, "test.f32", &x));
    assert_true(x == 1.5f);
    assert_true(gguf_get_bool(f, "test.bool", &flag));
    assert_true(flag);
    assert_false(gguf_get_bool(f, "test.u8", &flag));
    assert_true(gguf_get_u64(f, "test.u64", &u));
    assert_true(u == 0xfedcba9876543210ull);
    assert_false(gguf_get_u32(f, "test.u64", &u32)); /* too big */
    assert_false(gguf_get_i64(f, "test.u64", &i));
    assert_true(gguf_get_i64(f, "test.i64", &i));
    assert_true(i == -5000000000ll);
    assert_true(gguf_get_f32(f, "test.f64", &x));
    assert_true(x == -0.25f);
    assert_false(gguf_get_u64(f, "general.name", &u));
    assert_false(gguf_get_str(f, "test.u8", &s));
    assert_false(gguf_get_u64(f, "no.such.key", &u));
    assert_null(gguf_get_array(f, "test.u8"));
    assert_true(gguf_get_u32(f, "general.alignment", &u32));
    assert_int_equal(u32, 32);

    const gguf_kv *kv = gguf_find(f, "test.u8");
    assert_non_null(kv);
    assert_int_equal(kv->value.type, GGUF_UINT8);

    const gguf_array *a = gguf_get_array(f, "test.arr_u32");
    assert_non_null(a);
    assert_int_equal(a->elem, GGUF_UINT32);
    assert_int_equal(a->n, 5);
    for (uint64_t k = 0; k < 5; k++) {
        assert_int_equal(gguf_array_int(a, k), 10 * k + 1);
        assert_true(gguf_array_float(a, k) == (double)(10 * k + 1));
    }
    assert_int_equal(gguf_array_int(a, 5), 0); /* out of range */

    a = gguf_get_array(f, "test.arr_str");
    assert_non_null(a);
    assert_int_equal(a->elem, GGUF_STRING);
    assert_int_equal(a->n, 3);
    assert_true(gguf_str_eq(a->strs[0], "alpha"));
    assert_true(gguf_str_eq(a->strs[1], ""));
    assert_true(gguf_str_eq(a->strs[2], "gamma"));

    a = gguf_get_array(f, "test.arr_f32");
    assert_non_null(a);
    assert_true(gguf_array_float(a, 0) == 0.5);
    assert_true(gguf_array_float(a, 1) == -2.0);
    assert_int_equal(gguf_array_int(a, 1), -2);

    a = gguf_get_array(f, "test.nested");
    assert_non_null(a);
    assert_int_equal(a->elem, GGUF_ARRAY);
    assert_int_equal(a->n, 3);
    assert_int_equal(a->items[0].type, GGUF_ARRAY);
    assert_int_equal(a->items[0].arr.elem, GGUF_INT16);
    assert_int_equal(a->items[0].arr.n, 2);
    assert_int_equal(gguf_array_int(&a->items[0].arr, 0), 1);
    assert_int_equal(gguf_array_int(&a->items[0].arr, 1), 2);
    assert_int_equal(a->items[1].arr.n, 0);
    assert_int_equal(a->items[2].arr.n, 1);
    assert_int_equal(gguf_array_int(&a->items[2].arr, 0), 3);

    for (int t = 0; t < T_N_TENSORS; t++) {
        const gguf_tensor *tt = gguf_tensor_find(f, T_NAMES[t]);
        assert_non_null(tt);
        assert_ptr_equal(tt, &f->tensors[t]);
        assert_int_equal(tt->type, T_TYPES[t]);
        assert_int_equal(tt->n_dims, T_DIMS[t]);
        assert_int_equal(tt->ne[0], T_NE[t][0]);
        assert_int_equal(tt->ne[1], T_NE[t][1]);
        assert_int_equal(tt->ne[2], 1);
        assert_int_equal(tt->ne[3], 1);
        assert_int_equal(tt->offset, L.t_rel[t]);
        assert_int_equal(tt->nbytes, L.t_bytes[t]);
        assert_ptr_equal(tt->data, copy + L.data_offset + L.t_rel[t]);
        assert_int_equal(((const uint8_t *)tt->data)[0], (uint8_t)(t * 16));
        assert_int_equal(tt->info_offset, L.t_name[t] - 8);
    }
    assert_int_equal(f->tensors[1].nbytes, 2 * 2 * 34); /* Q8_0: 64/32 blocks of 34 bytes x 2 */
    assert_null(gguf_tensor_find(f, "tok"));
    walk_file(f, copy, b.n);

    gguf_close(&f);
    assert_null(f);
    gguf_close(&f); /* harmless */
    free(copy);
    free(b.p);
}

static void test_valid_v3(void **state)
{
    (void)state;
    check_valid(3);
}

static void test_valid_v2(void **state)
{
    (void)state;
    check_valid(2);
}

static void test_type_names(void **state)
{
    (void)state;
    assert_string_equal(gguf_type_name(GGUF_UINT8), "uint8");
    assert_string_equal(gguf_type_name(GGUF_STRING), "string");
    assert_string_equal(gguf_type_name(GGUF_ARRAY), "array");
    assert_string_equal(gguf_type_name(GGUF_FLOAT64), "float64");
    assert_string_equal(gguf_type_name((gguf_type)99), "unknown");
}

/* A file without general.alignment uses 32; one with 64 pads the data section to 64. */
static void test_alignment_values(void **state)
{
    (void)state;
    tbuf b = {0};
    tb_put(&b, "GGUF", 4);
    tb_u32(&b, 3);
    tb_u64(&b, 1);
    tb_u64(&b, 1);
    tb_key(&b, "general.alignment", 4);
    tb_u32(&b, 64);
    tb_str(&b, "w");
    tb_u32(&b, 1);
    tb_u64(&b, 8);
    tb_u32(&b, 0);
    tb_u64(&b, 0);
    tb_pad(&b, 64);
    size_t data = b.n;
    for (int i = 0; i < 32; i++)
        tb_u8(&b, (uint8_t)i);
    uint8_t *copy;
    char err[256];
    gguf_file *f = open_copy(b.p, b.n, &copy, err, sizeof err);
    if (!f)
        fail_msg("rejected: %s", err);
    assert_int_equal(f->alignment, 64);
    assert_int_equal(f->data_offset, data);
    assert_int_equal(f->data_offset % 64, 0);
    gguf_close(&f);
    free(copy);

    /* the same tensor with no alignment key: default 32 */
    tbuf c = {0};
    tb_put(&c, "GGUF", 4);
    tb_u32(&c, 3);
    tb_u64(&c, 1);
    tb_u64(&c, 0);
    tb_str(&c, "w");
    tb_u32(&c, 1);
    tb_u64(&c, 8);
    tb_u32(&c, 0);
    tb_u64(&c, 0);
    tb_pad(&c, 32);
    for (int i = 0; i < 32; i++)
        tb_u8(&c, (uint8_t)i);
    f = open_copy(c.p, c.n, &copy, err, sizeof err);
    if (!f)
        fail_msg("rejected: %s", err);
    assert_int_equal(f->alignment, 32);
    assert_int_equal(f->data_offset, 64);
    gguf_close(&f);
    free(copy);
    free(b.p);
    free(c.p);
}

/* gguf_open on a real file: valid, empty, short, missing. */
static void test_open_path(void **state)
{
    (void)state;
    const char *dir = getenv("OROCHI_TMP");
    char path[512];
    snprintf(path, sizeof path, "%s/unit_gguf_%ld.gguf", dir && *dir ? dir : "/tmp",
             (long)getpid());
    tlayout L;
    tbuf b = build_file(3, &L);
    char err[256];

    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(b.p, 1, b.n, fp), b.n);
    fclose(fp);
    gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f)
        fail_msg("valid file rejected: %s", err);
    assert_string_equal(f->path, path);
    assert_int_equal(f->n_tensors, T_N_TENSORS);
    walk_file(f, f->base, f->size);
    gguf_close(&f);

    fp = fopen(path, "wb"); /* empty */
    assert_non_null(fp);
    fclose(fp);
    assert_null(gguf_open(path, err, sizeof err));
    check_error(err);
    assert_non_null(strstr(err, path));

    fp = fopen(path, "wb"); /* 10 bytes of a header */
    assert_non_null(fp);
    assert_int_equal(fwrite(b.p, 1, 10, fp), 10);
    fclose(fp);
    assert_null(gguf_open(path, err, sizeof err));
    check_error(err);

    unlink(path);
    assert_null(gguf_open(path, err, sizeof err));
    assert_true(err[0] != '\0');
    assert_null(gguf_open_memory(NULL, 0, "x", err, sizeof err));
    check_error(err);
    assert_null(gguf_open_memory(b.p, 4, NULL, NULL, 0)); /* no error buffer: still safe */
    free(b.p);
}

/* ===== malformed files ===== */

static void test_truncated_every_length(void **state)
{
    (void)state;
    for (uint32_t version = 2; version <= 3; version++) {
        tlayout L;
        tbuf b = build_file(version, &L);
        char err[256];
        for (size_t n = 0; n < b.n; n++) {
            uint8_t *copy;
            gguf_file *f = open_copy(b.p, n, &copy, err, sizeof err);
            if (f)
                fail_msg("file truncated to %zu of %zu bytes accepted", n, b.n);
            check_error(err);
            free(copy);
        }
        free(b.p);
    }
}

static void test_bad_header(void **state)
{
    (void)state;
    tlayout L;
    tbuf b = build_file(3, &L);
    char err[256];

    tbuf c = copy_of(&b);
    c.p[0] = 'X';
    expect_reject(&c, err, sizeof err);
    assert_non_null(strstr(err, "magic"));
    free(c.p);

    const uint32_t bad_versions[] = {0, 1, 4, 0x03000000u, 0xffffffffu};
    for (size_t i = 0; i < sizeof bad_versions / sizeof bad_versions[0]; i++) {
        c = copy_of(&b);
        tb_patch_le(&c, 4, bad_versions[i], 4);
        expect_reject(&c, err, sizeof err);
        assert_non_null(strstr(err, "version"));
        free(c.p);
    }

    const uint64_t absurd[] = {1ull << 62, UINT64_MAX, 1ull << 32, 1000};
    for (size_t i = 0; i < sizeof absurd / sizeof absurd[0]; i++) {
        c = copy_of(&b);
        tb_patch_le(&c, 16, absurd[i], 8);
        expect_reject(&c, err, sizeof err);
        if (absurd[i] != 1000) /* 1000 may fit the size test and fail on a later field */
            assert_non_null(strstr(err, "metadata_kv_count"));
        free(c.p);

        c = copy_of(&b);
        tb_patch_le(&c, 8, absurd[i], 8);
        expect_reject(&c, err, sizeof err);
        assert_non_null(strstr(err, "tensor_count"));
        free(c.p);
    }
    free(b.p);
}

static void test_bad_metadata(void **state)
{
    (void)state;
    tlayout L;
    tbuf b = build_file(3, &L);
    char err[256];
    tbuf c;

    /* string length huge */
    const uint64_t lens[] = {UINT64_MAX, 1ull << 62, b.n};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        c = copy_of(&b);
        tb_patch_le(&c, L.str_len, lens[i], 8);
        expect_reject(&c, err, sizeof err);
        assert_non_null(strstr(err, "general.name"));
        free(c.p);

        c = copy_of(&b);
        tb_patch_le(&c, L.strarr_elem0, lens[i], 8);
        expect_reject(&c, err, sizeof err);
        assert_non_null(strstr(err, "test.arr_str"));
        free(c.p);
    }

    /* array length huge */
    const uint64_t counts[] = {UINT64_MAX, 1ull << 62, 1ull << 61, 100000};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        c = copy_of(&b);
        tb_patch_le(&c, L.arr_len, counts[i], 8);
        expect_reject(&c, err, sizeof err);
        assert_non_null(strstr(err, "test.arr_u32"));
        free(c.p);

        c = copy_of(&b);
        tb_patch_le(&c, L.strarr_len, counts[i], 8);
        expect_reject(&c, err, sizeof err);
        assert_non_null(strstr(err, "test.arr_str"));
        free(c.p);

        c = copy_of(&b);
        tb_patch_le(&c, L.nested_len, counts[i], 8);
        expect_reject(&c, err, sizeof err);
        assert_non_null(strstr(err, "test.nested"));
        free(c.p);
    }

    /* unknown value type id, unknown array element type */
    const uint32_t bad_types[] = {13, 255, 0xffffffffu};
    for (size_t i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
        c = copy_of(&b);
        tb_patch_le(&c, L.key_type, bad_types[i], 4);
        expect_reject(&c, err, sizeof err);
        assert_non_null(strstr(err, "test.u8"));
        assert_non_null(strstr(err, "type"));
        free(c.p);

        c = copy_of(&b);
        tb_patch_le(&c, L.arr_elem_type, bad_types[i], 4);
        expect_reject(&c, err, sizeof err);
        assert_non_null(strstr(err, "test.arr_u32"));
        free(c.p);
    }

    /* duplicate key: "test.i8" -> "test.u8" */
    c = copy_of(&b);
    assert_memory_equal(c.p + L.key_i8, "test.i8", 7);
    c.p[L.key_i8 + 5] = 'u';
    expect_reject(&c, err, sizeof err);
    assert_non_null(strstr(err, "duplicate"));
    assert_non_null(strstr(err, "test.u8"));
    free(c.p);

    /* bad alignment: 0, not a power of two */
    const uint32_t aligns[] = {0, 3, 48, 0x80000001u};
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        c = copy_of(&b);
        tb_patch_le(&c, L.align_val, aligns[i], 4);
        expect_reject(&c, err, sizeof err);
        assert_non_null(strstr(err, "alignment"));
        free(c.p);
    }
    free(b.p);
}

/* Arrays nested deeper than the reader allows are rejected, not recursed into. */
static void test_deep_nesting(void **state)
{
    (void)state;
    char err[256];
    for (int depth = 1; depth <= 12; depth++) {
        tbuf b = {0};
        tb_put(&b, "GGUF", 4);
        tb_u32(&b, 3);
        tb_u64(&b, 0);
        tb_u64(&b, 1);
        tb_key(&b, "deep", 9);
        for (int d = 1; d < depth; d++) {
            tb_u32(&b, 9);
            tb_u64(&b, 1);
        }
        tb_u32(&b, 4);
        tb_u64(&b, 1);
        tb_u32(&b, 7);
        uint8_t *copy;
        gguf_file *f = open_copy(b.p, b.n, &copy, err, sizeof err);
        if (depth <= 8) {
            if (!f)
                fail_msg("depth %d rejected: %s", depth, err);
            const gguf_array *a = gguf_get_array(f, "deep");
            assert_non_null(a);
            for (int d = 1; d < depth; d++) {
                assert_int_equal(a->n, 1);
                a = &a->items[0].arr;
            }
            assert_int_equal(gguf_array_int(a, 0), 7);
            gguf_close(&f);
        } else {
            assert_null(f);
            check_error(err);
            assert_non_null(strstr(err, "nested"));
        }
        free(copy);
        free(b.p);
    }

    /* a very deep chain of nested-array headers must not recurse without bound */
    tbuf b = {0};
    tb_put(&b, "GGUF", 4);
    tb_u32(&b, 3);
    tb_u64(&b, 0);
    tb_u64(&b, 1);
    tb_key(&b, "deep", 9);
    for (int d = 0; d < 100000; d++) {
        tb_u32(&b, 9);
        tb_u64(&b, 1);
    }
    expect_reject(&b, err, sizeof err);
    free(b.p);
}

static void test_bad_tensors(void **state)
{
    (void)state;
    tlayout L;
    tbuf b = build_file(3, &L);
    char err[256];
    tbuf c;

    /* n_dims 0 and > 4 */
    const uint32_t dims[] = {0, 5, 0xffffffffu};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        c = copy_of(&b);
        tb_patch_le(&c, L.t_ndims[1], dims[i], 4);
        expect_reject(&c, err, sizeof err);
        assert_non_null(strstr(err, "tok.bbb"));
        assert_non_null(strstr(err, "n_dims"));
        free(c.p);
    }

    /* element-count overflow: ne = [2^32, 2^32] on a 2-d F32 tensor */
    c = copy_of(&b);
    tb_patch_le(&c, L.t_ne[0], 1ull << 32, 8);
    tb_patch_le(&c, L.t_ne[0] + 8, 1ull << 32, 8);
    expect_reject(&c, err, sizeof err);
    assert_non_null(strstr(err, "tok.aaa"));
    assert_non_null(strstr(err, "overflow"));
    free(c.p);

    /* byte-size overflow only: 2^62 F32 elements (x4 bytes) */
    c = copy_of(&b);
    tb_patch_le(&c, L.t_ne[0], 1ull << 61, 8);
    tb_patch_le(&c, L.t_ne[0] + 8, 2, 8);
    expect_reject(&c, err, sizeof err);
    assert_non_null(strstr(err, "tok.aaa"));
    free(c.p);

    /* ne larger than INT64_MAX */
    c = copy_of(&b);
    tb_patch_le(&c, L.t_ne[2], UINT64_MAX, 8);
    expect_reject(&c, err, sizeof err);
    assert_non_null(strstr(err, "norm.w"));
    free(c.p);

    /* ne[0] of a Q8_0 tensor not a multiple of 32 */
    c = copy_of(&b);
    tb_patch_le(&c, L.t_ne[1], 48, 8);
    expect_reject(&c, err, sizeof err);
    assert_non_null(strstr(err, "tok.bbb"));
    assert_non_null(strstr(err, "block"));
    free(c.p);

    /* unknown ggml type ids */
    const uint32_t bad_types[] = {4, 5, 31, 39, 1000, 0xffffffffu};
    for (size_t i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
        c = copy_of(&b);
        tb_patch_le(&c, L.t_type[2], bad_types[i], 4);
        expect_reject(&c, err, sizeof err);
        assert_non_null(strstr(err, "norm.w"));
        assert_non_null(strstr(err, "type"));
        free(c.p);
    }

    /* offsets past the end, and offset + size wrapping around */
    const uint64_t offs[] = {1024, 1ull << 40, 1ull << 63, UINT64_MAX & ~31ull};
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        c = copy_of(&b);
        tb_patch_le(&c, L.t_off[2], offs[i], 8);
        expect_reject(&c, err, sizeof err);
        assert_non_null(strstr(err, "norm.w"));
        free(c.p);
    }

    /* data that would end one byte past the file: shrink the file by one */
    c = copy_of(&b);
    c.n--;
    expect_reject(&c, err, sizeof err);
    assert_non_null(strstr(err, "norm.w"));
    free(c.p);

    /* offset not a multiple of the alignment */
    c = copy_of(&b);
    tb_patch_le(&c, L.t_off[1], L.t_rel[1] + 4, 8);
    expect_reject(&c, err, sizeof err);
    assert_non_null(strstr(err, "tok.bbb"));
    assert_non_null(strstr(err, "alignment"));
    free(c.p);

    /* overlapping data: tensor 1 placed on tensor 0 */
    c = copy_of(&b);
    tb_patch_le(&c, L.t_off[1], L.t_rel[0], 8);
    expect_reject(&c, err, sizeof err);
    assert_non_null(strstr(err, "overlap"));
    free(c.p);

    /* duplicate tensor name: "tok.bbb" -> "tok.aaa" */
    c = copy_of(&b);
    memcpy(c.p + L.t_name[1], "tok.aaa", 7);
    expect_reject(&c, err, sizeof err);
    assert_non_null(strstr(err, "duplicate"));
    assert_non_null(strstr(err, "tok.aaa"));
    free(c.p);

    /* a name with a newline and control bytes still yields a one-line error */
    c = copy_of(&b);
    c.p[L.t_name[2]] = '\n';
    c.p[L.t_name[2] + 1] = '\r';
    tb_patch_le(&c, L.t_type[2], 77, 4);
    expect_reject(&c, err, sizeof err);
    assert_non_null(strstr(err, "\\x0a"));
    free(c.p);
    free(b.p);
}

/* Long or hostile names are cut and escaped so the error stays one short line; a small error
 * buffer is never overrun. */
static void test_error_text(void **state)
{
    (void)state;
    char key[2000];
    memset(key, 'k', sizeof key - 1);
    key[sizeof key - 1] = '\0';
    key[10] = '\n';
    tbuf b = {0};
    tb_put(&b, "GGUF", 4);
    tb_u32(&b, 3);
    tb_u64(&b, 0);
    tb_u64(&b, 1);
    tb_key(&b, key, 99);
    tb_u32(&b, 0);
    char err[256];
    expect_reject(&b, err, sizeof err);
    assert_non_null(strstr(err, "at byte 2031")); /* the value type field after the key */
    assert_non_null(strstr(err, "kkkk\\x0akkk"));
    assert_non_null(strstr(err, "...'"));
    assert_non_null(strstr(err, "unknown value type 99"));
    assert_true(strlen(err) < 200);

    char tiny[8];
    uint8_t *copy;
    memset(tiny, 'x', sizeof tiny);
    assert_null(open_copy(b.p, b.n, &copy, tiny, sizeof tiny));
    assert_true(strlen(tiny) < sizeof tiny);
    free(copy);
    free(b.p);
}

/* Every known ggml type, computed with or not (Q5_0, Q4_K, ... and IQ1_M, F64), is the
 * loader's problem: the reader accepts them and sizes them from its own table. */
static void test_known_unsupported_types(void **state)
{
    (void)state;
    const struct {
        uint32_t type;
        uint64_t ne0;
        uint64_t bytes;
    } cases[] = {{6, 64, 2 * 22}, {12, 256, 144}, {14, 512, 2 * 210}, {28, 3, 24}, {30, 4, 8},
                 {29, 256, 56}, {20, 32, 18}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tbuf b = {0};
        tb_put(&b, "GGUF", 4);
        tb_u32(&b, 3);
        tb_u64(&b, 1);
        tb_u64(&b, 0);
        tb_str(&b, "w");
        tb_u32(&b, 1);
        tb_u64(&b, cases[i].ne0);
        tb_u32(&b, cases[i].type);
        tb_u64(&b, 0);
        tb_pad(&b, 32);
        for (uint64_t k = 0; k < cases[i].bytes; k++)
            tb_u8(&b, 0);
        uint8_t *copy;
        char err[256];
        gguf_file *f = open_copy(b.p, b.n, &copy, err, sizeof err);
        if (!f)
            fail_msg("type %u rejected: %s", cases[i].type, err);
        assert_int_equal(f->tensors[0].type, cases[i].type);
        assert_int_equal(f->tensors[0].nbytes, cases[i].bytes);
        gguf_close(&f);
        free(copy);
        free(b.p);
    }
}

/* Every single-byte flip of the valid file: never a crash; an accepted file stays in bounds. */
static void test_flip_every_byte(void **state)
{
    (void)state;
    tlayout L;
    tbuf b = build_file(3, &L);
    char err[256];
    size_t accepted = 0;
    for (size_t i = 0; i < b.n; i++) {
        tbuf c = copy_of(&b);
        c.p[i] ^= 0xff;
        err[0] = '\0';
        gguf_file *f = gguf_open_memory(c.p, c.n, "flip.gguf", err, sizeof err);
        if (f) {
            accepted++;
            walk_file(f, c.p, c.n);
            gguf_close(&f);
        } else {
            check_error(err);
        }
        free(c.p);
    }
    /* flips in string text and tensor data are harmless: some must be accepted */
    assert_true(accepted > 0);
    free(b.p);
}

/* The real model, when present: parses, and quickly. */
static void test_real_model(void **state)
{
    (void)state;
    const char *path = getenv("OROCHI_MODEL");
    if (!path || access(path, R_OK) != 0) {
        skip();
        return;
    }
    char err[256];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    gguf_file *f = gguf_open(path, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (!f)
        fail_msg("model rejected: %s", err);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    print_message("gguf_open(%s): %.2f ms, %llu keys, %llu tensors\n", path, ms,
                  (unsigned long long)f->n_kv, (unsigned long long)f->n_tensors);
    assert_true(f->version >= 2);
    assert_true(f->n_tensors > 0);
    const gguf_array *tokens = gguf_get_array(f, "tokenizer.ggml.tokens");
    assert_non_null(tokens);
    assert_int_equal(tokens->elem, GGUF_STRING);
    assert_non_null(gguf_tensor_find(f, "token_embd.weight"));
    walk_file(f, f->base, f->size);
    gguf_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_v3),
        cmocka_unit_test(test_valid_v2),
        cmocka_unit_test(test_type_names),
        cmocka_unit_test(test_alignment_values),
        cmocka_unit_test(test_open_path),
        cmocka_unit_test(test_truncated_every_length),
        cmocka_unit_test(test_bad_header),
        cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_deep_nesting),
        cmocka_unit_test(test_bad_tensors),
        cmocka_unit_test(test_error_text),
        cmocka_unit_test(test_known_unsupported_types),
        cmocka_unit_test(test_flip_every_byte),
        cmocka_unit_test(test_real_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
