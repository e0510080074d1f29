/*
 * model/gguf — a careful reader of GGUF v2/v3 files.
 *
 * The file is mmapped read-only; metadata and the tensor table are parsed once at open, with every
 * count, length, offset and size checked against the file size and for overflow. Strings and tensor
 * data are views into the mapping (not NUL-terminated), so the reader copies nothing big.
 * A malformed file yields an error string of one line naming the field or tensor and its byte offset.
 */
#ifndef OROCHI_GGUF_H
#define OROCHI_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

typedef enum {
    GGUF_UINT8 = 0,
    GGUF_INT8 = 1,
    GGUF_UINT16 = 2,
    GGUF_INT16 = 3,
    GGUF_UINT32 = 4,
    GGUF_INT32 = 5,
    GGUF_FLOAT32 = 6,
    GGUF_BOOL = 7,
    GGUF_STRING = 8,
    GGUF_ARRAY = 9,
    GGUF_UINT64 = 10,
    GGUF_INT64 = 11,
    GGUF_FLOAT64 = 12,
    GGUF_TYPE_COUNT
} gguf_type;

/* A string inside the mapping. */
typedef struct {
    uint64_t len;
    const char *ptr;
} gguf_str;

typedef struct gguf_value gguf_value;

/* An array value: `n` elements of `elem` type. Scalar elements are read with gguf_array_*
 * accessors from `raw` (little-endian, packed); string elements are in `strs`; nested arrays in
 * `items`. */
typedef struct {
    gguf_type elem;
    uint64_t n;
    const uint8_t *raw;  /* scalar elements, packed */
    gguf_str *strs;      /* elem == GGUF_STRING: n strings */
    gguf_value *items;   /* elem == GGUF_ARRAY: n nested arrays */
} gguf_array;

struct gguf_value {
    gguf_type type;
    union {
        uint64_t u;   /* UINT8..UINT64, BOOL */
        int64_t i;    /* INT8..INT64 */
        double f;     /* FLOAT32, FLOAT64 */
        gguf_str str; /* STRING */
        gguf_array arr;
    };
};

typedef struct {
    gguf_str key;
    gguf_value value;
    uint64_t offset; /* byte offset of the key in the file */
} gguf_kv;

#define GGUF_MAX_DIMS 4

typedef struct {
    gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous (innermost) dimension */
    uint32_t type;              /* ggml type id (kt_type) */
    uint64_t offset;            /* relative to the start of the data section */
    uint64_t nbytes;
    const void *data;           /* inside the mapping */
    uint64_t info_offset;       /* byte offset of this tensor's info record */
} gguf_tensor;

typedef struct gguf_file {
    char *path;
    const uint8_t *base; /* mapping */
    uint64_t size;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset; /* start of the tensor data section */
    uint64_t n_kv;
    gguf_kv *kv;
    uint64_t n_tensors;
    gguf_tensor *tensors;
} gguf_file;

/* Open and validate `path`. On failure returns NULL and writes one line (no newline) into err,
 * e.g. "bad.gguf: tensor 'blk.0.attn_q.weight' at byte 1234: data [off, off+n) past end of file". */
gguf_file *gguf_open(const char *path, char *err, size_t errlen);
/* Same checks over a caller-owned buffer (the fuzz target uses this); the buffer must outlive the
 * returned file. */
gguf_file *gguf_open_memory(const void *buf, uint64_t size, const char *label, char *err,
                            size_t errlen);
void gguf_close(gguf_file **file);

const gguf_kv *gguf_find(const gguf_file *f, const char *key);
const gguf_tensor *gguf_tensor_find(const gguf_file *f, const char *name);

/* Typed getters: return false when the key is absent or of an incompatible type. Integer getters
 * accept any integer type whose value fits. */
bool gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out);
bool gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
bool gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
bool gguf_get_f32(const gguf_file *f, const char *key, float *out);
bool gguf_get_bool(const gguf_file *f, const char *key, bool *out);
bool gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);
/* The array under key, or NULL. */
const gguf_array *gguf_get_array(const gguf_file *f, const char *key);

/* Element i of a scalar array, converted. */
int64_t gguf_array_int(const gguf_array *a, uint64_t i);
double gguf_array_float(const gguf_array *a, uint64_t i);

const char *gguf_type_name(gguf_type t);
bool gguf_str_eq(gguf_str s, const char *cstr);
/* Write len bytes of s into dst (cap bytes) as printable one-line text for a message: control
 * and non-ASCII bytes as \xNN, quote and backslash escaped; at most 64 characters, then "..." if
 * cut. Strings from a file are quoted in errors only through it. */
void gguf_escape(char *dst, size_t cap, const char *s, uint64_t len);

#endif
