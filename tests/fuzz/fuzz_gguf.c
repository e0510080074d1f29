/*
 * tests/fuzz/fuzz_gguf — libFuzzer target for the GGUF reader.
 *
 * Each input is parsed with gguf_open_memory. When the reader accepts it, everything it exposes
 * is touched: every key and string byte, every element of every array (nested ones too) through
 * the accessors, the lookups by key and tensor name, and the first and last byte of every
 * tensor's data; tensors of the types orochi computes with are also checked, dequantised and
 * multiplied (fuzz_tensor). libFuzzer hands us a heap buffer of exactly `size` bytes, so ASan reports any
 * view that points outside it. A rejected input must come with a one-line error that names a
 * byte offset; anything else aborts, which libFuzzer records as a crash.
 *
 * Build and run: `make fuzz`, then tests/fuzz/run_fuzz.sh (seeds: tests/fuzz/corpus/).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "model/gguf.h"

/* A tensor of a type orochi computes with: check its first rows' block scales, dequantise the
 * first row, and multiply up to 32 rows (packed on the fly) with a vector of ones; every block
 * layout is read from fuzzed bytes and ASan watches the reads. Non-finite scales must be found
 * by the check before anything computes with them. */
static void fuzz_tensor(volatile uint8_t *sink, const gguf_tensor *t)
{
    const kt_traits *tr = kt_traits_of(t->type);
    uint64_t cols = t->ne[0];
    if (!tr || !tr->supported || cols == 0 || cols > 4096 || cols % (uint64_t)tr->block)
        return;
    size_t rb = kt_row_bytes(t->type, cols);
    int64_t rows = rb ? (int64_t)(t->nbytes / rb) : 0;
    if (rows > 32)
        rows = 32;
    if (rows < 1)
        return;
    char why[96];
    if (kt_check_matrix(t->type, t->data, rows, (int64_t)cols, rb, why, sizeof why)) {
        if (!why[0] || strchr(why, '\n'))
            abort();
        return;
    }
    float *row = malloc(cols * sizeof(float)), *x = malloc(cols * sizeof(float));
    float y[32];
    if (!row || !x)
        abort();
    kt_dequantize_row(t->type, t->data, row, (int64_t)cols);
    for (uint64_t k = 0; k < cols; k++)
        x[k] = 1.0f;
    kmat w = {.type = t->type, .rows = rows, .cols = (int64_t)cols, .row_bytes = rb,
              .data = t->data};
    kmat_mul(NULL, &w, 0, rows, x, 1, y, rows, NULL);
    *sink ^= (uint8_t)(row[cols - 1] == row[cols - 1]) ^ (uint8_t)(y[rows - 1] == y[rows - 1]);
    free(row);
    free(x);
}

/* Fold bytes into a sink so the reads cannot be optimised away. */
static void fuzz_touch(volatile uint8_t *sink, const void *p, uint64_t n)
{
    const uint8_t *b = p;
    for (uint64_t i = 0; i < n; i++)
        *sink ^= b[i];
}

static void fuzz_walk_array(volatile uint8_t *sink, const gguf_array *a)
{
    for (uint64_t i = 0; i < a->n; i++) {
        if (a->elem == GGUF_STRING) {
            fuzz_touch(sink, a->strs[i].ptr, a->strs[i].len);
        } else if (a->elem == GGUF_ARRAY) {
            if (a->items[i].type != GGUF_ARRAY)
                abort();
            fuzz_walk_array(sink, &a->items[i].arr);
        } else {
            int64_t v = gguf_array_int(a, i);
            double d = gguf_array_float(a, i);
            *sink ^= (uint8_t)v ^ (uint8_t)(d == d);
        }
    }
    /* past the end: defined to read as 0 */
    if (a->elem != GGUF_STRING && a->elem != GGUF_ARRAY && gguf_array_int(a, a->n) != 0)
        abort();
}

/* Look a name up through the C-string API when it has no NUL inside; it must be found (the
 * first of equal names is impossible: duplicates are rejected). */
static void fuzz_lookup(const gguf_file *f, gguf_str name, bool tensor, const void *expect)
{
    if (name.len > 4096 || memchr(name.ptr, 0, name.len))
        return;
    char buf[4097];
    memcpy(buf, name.ptr, name.len);
    buf[name.len] = '\0';
    const void *got =
        tensor ? (const void *)gguf_tensor_find(f, buf) : (const void *)gguf_find(f, buf);
    if (got != expect)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    volatile uint8_t sink = 0;
    gguf_file *f = gguf_open_memory(data, size, "fuzz", err, sizeof err);
    if (!f) {
        if (!err[0] || strchr(err, '\n') || !strstr(err, "byte"))
            abort();
        return 0;
    }
    if (f->data_offset > size && f->n_tensors > 0)
        abort();
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        fuzz_touch(&sink, kv->key.ptr, kv->key.len);
        fuzz_lookup(f, kv->key, false, kv);
        switch (kv->value.type) {
        case GGUF_STRING:
            fuzz_touch(&sink, kv->value.str.ptr, kv->value.str.len);
            break;
        case GGUF_ARRAY:
            fuzz_walk_array(&sink, &kv->value.arr);
            break;
        default:
            sink ^= (uint8_t)kv->value.u;
            break;
        }
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        fuzz_touch(&sink, t->name.ptr, t->name.len);
        fuzz_lookup(f, t->name, true, t);
        const uint8_t *d = t->data;
        if (d < data + f->data_offset || t->nbytes > size || d + t->nbytes > data + size)
            abort();
        if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS || t->offset % f->alignment)
            abort();
        if (t->nbytes) {
            sink ^= d[0];
            sink ^= d[t->nbytes - 1];
        }
        fuzz_tensor(&sink, t);
    }
    uint64_t u;
    uint32_t u32;
    int64_t s;
    float x;
    bool b;
    gguf_str str;
    sink ^= (uint8_t)gguf_get_u64(f, "general.alignment", &u);
    sink ^= (uint8_t)gguf_get_u32(f, "llama.block_count", &u32);
    sink ^= (uint8_t)gguf_get_i64(f, "t.i64", &s);
    sink ^= (uint8_t)gguf_get_f32(f, "t.f32", &x);
    sink ^= (uint8_t)gguf_get_bool(f, "t.bool", &b);
    sink ^= (uint8_t)gguf_get_str(f, "general.architecture", &str);
    sink ^= (uint8_t)(gguf_get_array(f, "tokenizer.ggml.tokens") != NULL);
    gguf_close(&f);
    if (f)
        abort();
    return 0;
}
