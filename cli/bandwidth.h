/*
 * cli/bandwidth — the memory read bandwidth of this machine, measured, not assumed: the floor
 * every decode-speed figure (GB/s of weights read per second) is judged against.
 *
 * A measurement streams a buffer far larger than the last-level cache with T threads, each
 * summing its own contiguous slice with vector loads (the access pattern of a decode step), and
 * keeps the best of a few passes of two loop shapes (a bare sum; half floats widened). Results are cached per CPU model and thread count in
 * $XDG_CACHE_HOME/orochi/bandwidth (default ~/.cache/orochi/bandwidth), one line per thread count:
 * "<cpu model>\t<threads>\t<GB/s>". `orochi bench --bandwidth` re-measures and rewrites the cache;
 * everything else reads it and measures (about a second) only what is missing.
 */
#ifndef OROCHI_CLI_BANDWIDTH_H
#define OROCHI_CLI_BANDWIDTH_H

#include <stdbool.h>

/* Measure the read bandwidth in GB/s with `threads` threads (no cache). */
double bw_measure(int threads);
/* The floor for `threads` threads: the cached figure, or a fresh measurement that is then cached.
 * *measured_now tells which (may be NULL). */
double bw_floor(int threads, bool *measured_now);
/* Store a measurement in the cache (replacing this CPU's line for that thread count). */
void bw_store(int threads, double gbs);
/* Where the cache lives (for messages). */
const char *bw_cache_path(void);

#endif
