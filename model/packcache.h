/*
 * model/packcache — the packed weights of a model file, made once per machine and mapped shared.
 *
 * The CPU matmul streams the weights in its own layout (kernels/cpu/mm_isa.h: 16-row groups). That
 * layout is written once into a cache file, and every process that loads the model — each worker,
 * the coordinator, a layerskip speculator, a second group on the same file — maps the file
 * read-only and shared: the machine holds one copy, in the page cache, whatever the group's size.
 * A process touches only the pages it computes with (a worker its rows, layerskip its layers), so
 * its proportional set size counts only those, divided among the processes that share them.
 *
 * The cache file: DIR/<model file name>.<key>.pack, the key a hash of the model file's identity
 * (device, inode, size, modification time) and of its content identity (packcache_identity: size
 * and samples of its bytes — its first 4 MiB, 64 spots of 64 KiB, its last 1 MiB: a file
 * rewritten in place within one tick of the clock keeps its inode and time stamp, not its bytes),
 * the layout's version and the layout description the caller gives (each matrix's type and
 * shape). Building a cache removes those of other versions of the same
 * file name in DIR. It holds a header (PACKCACHE_DATA_OFF bytes: magic,
 * version, key, identity, length, an XXH3-64 checksum of the data) and then the data, 2 MiB aligned
 * in the file and in memory. The layout is the same on every instruction set (the kernels read one
 * layout), so the key carries no ISA.
 *
 * Opening checks every header field and the checksum of the whole data (read with pread, not
 * through the mapping, so the check maps nothing); a cache that fails any check is rebuilt, never
 * used. The first process to miss takes an exclusive lock on DIR/<name>.lock and builds into a
 * temporary file (space reserved first with posix_fallocate, so a full disk is an error, not a
 * SIGBUS) renamed into place when complete; processes starting at the same time wait on the lock
 * and then map what it built. A cache directory that cannot be used (not writable, full, the
 * checksum library absent from the build) falls back to packing into this process's memory, with
 * a warning naming the cost.
 *
 * Where: OROCHI_PACK_CACHE=DIR, or "off" for private packing; otherwise $XDG_CACHE_HOME/orochi,
 * otherwise $HOME/.cache/orochi.
 */
#ifndef OROCHI_PACKCACHE_H
#define OROCHI_PACKCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PACKCACHE_VERSION 1
#define PACKCACHE_DATA_OFF ((size_t)2 << 20)

typedef struct {
    void *base;     /* the packed bytes */
    size_t bytes;   /* their length */
    void *map;      /* the cache file's mapping (map_len bytes), NULL for private memory */
    size_t map_len; /* private memory: the allocation's length */
    bool built;     /* this process wrote the cache file */
    char path[512]; /* the cache file ("" for private memory) */
} packcache_block;

/* Writes the packed bytes (len of them) at dst. */
typedef void (*packcache_fill_fn)(void *dst, size_t len, void *arg);

/* The packed block of `bytes` bytes for the model file at model_path (its content identity:
 * packcache_identity, which the caller has already computed) whose layout `desc` (desc_len bytes)
 * describes: mapped from the cache when it holds a valid one, otherwise built (fill) into
 * the cache and mapped, otherwise (no usable cache) filled into private memory on huge pages. The
 * mapped block is read-only. Progress and warnings are lines on stderr naming the model file.
 * 0, or -1 with err (out of memory for the private block). */
int packcache_get(const char *model_path, uint64_t identity, const void *desc, size_t desc_len,
                  size_t bytes, packcache_fill_fn fill, void *arg, packcache_block *out, char *err,
                  size_t errlen);
/* The content identity of the file at path: a hash of its size and the byte samples the cache key
 * takes (not its inode or time stamps: the same bytes on another machine have the same identity).
 * 0 when the file cannot be read or the build has no hash library. */
uint64_t packcache_identity(const char *path);
/* Unmap or free the block. */
void packcache_release(packcache_block *b);
/* The cache directory in use (OROCHI_PACK_CACHE, XDG_CACHE_HOME, HOME); false when caching is
 * off or no directory can be named. */
bool packcache_dir(char *out, size_t len);

#endif
