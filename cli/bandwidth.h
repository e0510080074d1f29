/*
 * cli/bandwidth — the memory read bandwidth of this machine, measured, not assumed: the floor
 * every decode-speed figure (GB/s of weights read per second) is judged against.
 *
 * A measurement streams a buffer far larger than the last-level cache with T threads, each
 * summing its own contiguous slice with vector loads (the access pattern of a decode step), and
 * keeps the best of a few passes of three loop shapes (a bare sum, the same with a software
 * prefetch, half floats widened). Results are cached per CPU model and thread count in
 * $XDG_CACHE_HOME/orochi/bandwidth (default ~/.cache/orochi/bandwidth), one line per thread count:
 * "<cpu model>\t<threads>\t<GB/s>". The cache keeps the best figure measured: on a shared machine a
 * busy neighbour lowers a measurement (the same machine measured 36 to 47 GB/s on 2 threads within
 * an hour), and a floor that sank with it would flatter every figure judged against it. `orochi
 * bench --bandwidth` measures again and keeps the better; everything else reads the cache and
 * measures (about a second) only what is missing. Delete the file to start over on a new machine.
 */
#ifndef OROCHI_CLI_BANDWIDTH_H
#define OROCHI_CLI_BANDWIDTH_H

#include <stdbool.h>

/* Measure the read bandwidth in GB/s with `threads` threads (no cache). */
double bw_measure(int threads);
/* The floor for `threads` threads: the cached figure, or a fresh measurement that is then cached.
 * *measured_now tells which (may be NULL). */
double bw_floor(int threads, bool *measured_now);
/* Store a measurement in the cache unless it holds a better one for this CPU and thread count;
 * returns the floor now cached. */
double bw_store(int threads, double gbs);
/* Where the cache lives (for messages). */
const char *bw_cache_path(void);

#endif
