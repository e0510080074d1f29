/*
 * cli/util — small helpers shared by the CLI subcommands: option parsing with clear errors,
 * wall-clock time, model loading that reports a malformed file as one line and status 2.
 */
#ifndef OROCHI_CLI_UTIL_H
#define OROCHI_CLI_UTIL_H

#include <stdbool.h>
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

#endif
