/*
 * cli/util — small helpers shared by the CLI subcommands: option parsing with clear errors,
 * wall-clock time, model loading that reports a malformed file as one line and status 2.
 */
#ifndef OROCHI_CLI_UTIL_H
#define OROCHI_CLI_UTIL_H

#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

#include "model/llama.h"

double cli_now(void);
/* Parse a whole-string integer/float within [lo, hi]; on error print "orochi CMD: OPT ..." and
 * return false. */
bool cli_int(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out);
bool cli_float(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out);
/* argv[*i] needs a value: returns it and advances, or prints an error and returns NULL. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);
/* Parse "1 2 3" or "1,2,3" into ids (malloc'd); returns the count or -1 with a message. */
int cli_parse_ids(const char *cmd, const char *s, int32_t **ids);
/* Peak resident set size of this process in bytes. */
uint64_t cli_peak_rss(void);
int cli_online_cores(void);
/* The median of v[0..n) (sorts v in place; the mean of the middle two when n is even). */
double cli_median(double *v, int n);
/* The whole file at path, NUL-terminated (its byte count in *len when len is not NULL); NULL when
 * it cannot be opened or read, or memory runs out. The caller frees it. */
char *cli_read_file(const char *path, size_t *len);
/* Open path for appending (a benchmark's JSON lines), creating its directories; NULL on failure. */
FILE *cli_open_append(const char *path);
/* The 1-minute load average (-1 when unknown), reported beside every benchmark figure. */
double cli_loadavg(void);
/* Parse "1,2,4" into at most max whole numbers within [lo, hi]; the count, or -1 after one line
 * naming opt. */
int cli_int_list(const char *cmd, const char *opt, const char *s, long lo, long hi, int *out,
                 int max);
/* Deterministic token ids in [0, vocab) for synthetic contexts (benchmarks, profiling). */
void cli_synthetic_ids(int32_t *ids, int n, int vocab);

/* A growable byte buffer for writing GGUF headers (orochi mkmodel, orochi quantize): values are
 * appended little-endian; an allocation failure sets oom and later appends do nothing. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
    bool oom;
} cli_buf;
void cli_buf_put(cli_buf *b, const void *src, size_t n);
void cli_buf_u32(cli_buf *b, uint32_t v);
void cli_buf_u64(cli_buf *b, uint64_t v);
/* a GGUF string: u64 length, then the bytes */
void cli_buf_str(cli_buf *b, const char *s, uint64_t len);

#endif
