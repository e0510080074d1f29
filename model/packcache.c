/*
 * model/packcache.c — the packed-weights cache file: find, check, build, map (packcache.h).
 */
#define _GNU_SOURCE
#include "model/packcache.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<xxhash.h>)
#define XXH_INLINE_ALL
#include <xxhash.h>
#define PACKCACHE_HAVE_XXH 1
#endif
#endif

#define PC_MAGIC "OROCHIPK"
#define PC_HUGE ((size_t)2 << 20)

/* The header at the start of the cache file (the rest of its PACKCACHE_DATA_OFF bytes is zero). */
typedef struct {
    char magic[8];
    uint32_t version, header_bytes;
    uint64_t key;
    uint64_t dev, ino, size;
    int64_t mtime_sec, mtime_nsec;
    uint64_t data_bytes, data_off;
    uint64_t checksum; /* XXH3-64 of the data */
} pc_header;

static double pc_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

bool packcache_dir(char *out, size_t len)
{
    const char *env = getenv("OROCHI_PACK_CACHE");
    if (env && *env) {
        if (!strcmp(env, "off") || !strcmp(env, "0"))
            return false;
        return (size_t)snprintf(out, len, "%s", env) < len;
    }
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && *xdg)
        return (size_t)snprintf(out, len, "%s/orochi", xdg) < len;
    const char *home = getenv("HOME");
    if (home && *home)
        return (size_t)snprintf(out, len, "%s/.cache/orochi", home) < len;
    return false;
}

/* mkdir -p */
static int pc_mkdirs(const char *dir)
{
    char p[512];
    if ((size_t)snprintf(p, sizeof p, "%s", dir) >= sizeof p)
        return -1;
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (mkdir(p, 0755) && errno != EEXIST)
                return -1;
            *s = '/';
        }
    return mkdir(p, 0755) && errno != EEXIST ? -1 : 0;
}

/* A 2 MiB-aligned mapping of len bytes of fd (offset 0): a reserved span, the file mapped over
 * its aligned start. NULL on failure. */
static void *pc_map_aligned(int fd, size_t len, int prot)
{
    size_t span = len + PC_HUGE;
    uint8_t *r = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED)
        return NULL;
    uint8_t *a = (uint8_t *)(((uintptr_t)r + PC_HUGE - 1) & ~(uintptr_t)(PC_HUGE - 1));
    if (a > r)
        munmap(r, (size_t)(a - r));
    size_t tail = (size_t)(r + span - (a + len));
    if (tail)
        munmap(a + len, tail);
    void *m = mmap(a, len, prot, MAP_SHARED | MAP_FIXED, fd, 0);
    if (m == MAP_FAILED) {
        munmap(a, len);
        return NULL;
    }
    return m;
}

#ifdef PACKCACHE_HAVE_XXH
/* The cache file at path when it is valid for (key, identity, bytes): mapped into out, 0. 1 when
 * it does not exist, -1 when it exists but fails a check (why in why). */
static int pc_open_valid(const char *path, uint64_t key, const struct stat *id, size_t bytes,
                         packcache_block *out, char *why, size_t whylen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 1 : (snprintf(why, whylen, "%s", strerror(errno)), -1);
    pc_header h;
    struct stat st;
    int rc = -1;
    if (fstat(fd, &st) || pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) {
        snprintf(why, whylen, "its header cannot be read");
    } else if (memcmp(h.magic, PC_MAGIC, 8) || h.version != PACKCACHE_VERSION) {
        snprintf(why, whylen, "another layout version (%u, this orochi writes %u)", h.version,
                 PACKCACHE_VERSION);
    } else if (h.key != key || h.dev != (uint64_t)id->st_dev || h.ino != (uint64_t)id->st_ino ||
               h.size != (uint64_t)id->st_size || h.mtime_sec != (int64_t)id->st_mtim.tv_sec ||
               h.mtime_nsec != (int64_t)id->st_mtim.tv_nsec) {
        snprintf(why, whylen, "it was made from another version of the model file");
    } else if (h.data_bytes != bytes || h.data_off != PACKCACHE_DATA_OFF ||
               (uint64_t)st.st_size != PACKCACHE_DATA_OFF + bytes) {
        snprintf(why, whylen, "its length is wrong (%lld bytes, want %zu)", (long long)st.st_size,
                 PACKCACHE_DATA_OFF + bytes);
    } else {
        /* the checksum is read through the mapping, asked for huge pages first: the page cache
         * then holds the file in 2 MiB folios (a fault of a VM_HUGEPAGE mapping reads ahead in
         * PMD-sized folios; a pread would fill it with small ones, which every process would then
         * map 4 KiB at a time). This process's page-table entries are dropped afterwards, so that
         * it maps only what it computes with. */
        size_t len = PACKCACHE_DATA_OFF + bytes;
        uint8_t *m = pc_map_aligned(fd, len, PROT_READ);
        if (!m) {
            snprintf(why, whylen, "mmap: %s", strerror(errno));
        } else {
#ifdef MADV_HUGEPAGE
            madvise(m, len, MADV_HUGEPAGE);
#endif
            if (XXH3_64bits(m + PACKCACHE_DATA_OFF, bytes) != h.checksum) {
                snprintf(why, whylen, "its checksum does not match (corrupt)");
                munmap(m, len);
            } else {
                madvise(m + PACKCACHE_DATA_OFF, bytes, MADV_DONTNEED);
                out->map = m;
                out->map_len = len;
                out->base = m + PACKCACHE_DATA_OFF;
                out->bytes = bytes;
                snprintf(out->path, sizeof out->path, "%s", path);
                rc = 0;
            }
        }
    }
    close(fd);
    return rc;
}

/* Samples of the model file's bytes into st (packcache_identity, which the key hashes): its first
 * 4 MiB (metadata, tensor table), 64 KiB at 64 evenly spaced offsets and its last 1 MiB. A file
 * rewritten in place with the same size within one tick of the file system's clock keeps its
 * inode and time stamp; its bytes do not. */
static void pc_fingerprint(XXH3_state_t *st, const char *path, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    size_t cap = (size_t)4 << 20;
    uint8_t *buf = malloc(cap);
    if (fd >= 0 && buf) {
        size_t spots[66][2] = {{0, cap}, {size > ((size_t)1 << 20) ? size - ((size_t)1 << 20) : 0,
                                          (size_t)1 << 20}};
        for (int i = 0; i < 64; i++)
            spots[2 + i][0] = size / 64 * (size_t)i, spots[2 + i][1] = (size_t)64 << 10;
        for (int i = 0; i < 66; i++) {
            ssize_t got = pread(fd, buf, spots[i][1], (off_t)spots[i][0]);
            if (got > 0)
                XXH3_64bits_update(st, buf, (size_t)got);
        }
    }
    if (fd >= 0)
        close(fd);
    free(buf);
}

/* Remove the caches of other versions of the model file named `name` in dir (a file replaced or
 * rewritten under the same name leaves its old cache behind otherwise), and temporary files of
 * builders that died, keeping `keep` (and its lock; the locks of other versions are removed: no
 * process loading this version takes them). */
static void pc_evict(const char *dir, const char *name, const char *keep)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    size_t nl = strlen(name), kl = strlen(keep);
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *f = e->d_name;
        if (strncmp(f, name, nl) || f[nl] != '.' ||
            (!strncmp(f, keep, kl) && (!f[kl] || !strcmp(f + kl, ".lock"))))
            continue; /* another file, or this version's cache and lock */
        const char *pack = strstr(f + nl, ".pack");
        if (!pack || strchr(f + nl + 1, '.') != pack)
            continue; /* not NAME.<key>.pack... */
        const char *tmp = strstr(pack, ".tmp.");
        if (tmp) { /* a builder's: only when it is gone */
            int pid = atoi(tmp + 5);
            if (pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH)
                continue;
        } else if (strcmp(pack, ".pack") && strcmp(pack, ".pack.lock")) {
            continue;
        }
        char p[1100];
        snprintf(p, sizeof p, "%s/%s", dir, f);
        if (!unlink(p) && !strcmp(pack, ".pack"))
            fprintf(stderr, "orochi: removed %s (the cache of another version of %s)\n", p, name);
    }
    closedir(d);
}

/* Build the cache file at path through a temporary file renamed into place. 0, or -1 with why. */
static int pc_build(const char *path, uint64_t key, const struct stat *id, size_t bytes,
                    const char *model_path, packcache_fill_fn fill, void *arg, char *why,
                    size_t whylen)
{
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(why, whylen, "cannot create %s: %s", tmp, strerror(errno));
        return -1;
    }
    size_t len = PACKCACHE_DATA_OFF + bytes;
    int e = posix_fallocate(fd, 0, (off_t)len);
    if (e) {
        snprintf(why, whylen, "cannot reserve %.2f GB in the cache directory: %s", len / 1e9,
                 strerror(e));
        close(fd);
        unlink(tmp);
        return -1;
    }
    uint8_t *m = pc_map_aligned(fd, len, PROT_READ | PROT_WRITE);
    if (!m) {
        snprintf(why, whylen, "mmap: %s", strerror(errno));
        close(fd);
        unlink(tmp);
        return -1;
    }
#ifdef MADV_HUGEPAGE
    madvise(m, len, MADV_HUGEPAGE); /* the page cache in 2 MiB folios (pc_open_valid) */
#endif
    fprintf(stderr, "orochi: packing the weights of %s (%.2f GB) into the cache %s — once per "
                    "model file; later starts map it\n",
            model_path, bytes / 1e9, path);
    double t0 = pc_now();
    fill(m + PACKCACHE_DATA_OFF, bytes, arg);
    pc_header h = {.version = PACKCACHE_VERSION,
                   .header_bytes = (uint32_t)sizeof h,
                   .key = key,
                   .dev = (uint64_t)id->st_dev,
                   .ino = (uint64_t)id->st_ino,
                   .size = (uint64_t)id->st_size,
                   .mtime_sec = (int64_t)id->st_mtim.tv_sec,
                   .mtime_nsec = (int64_t)id->st_mtim.tv_nsec,
                   .data_bytes = bytes,
                   .data_off = PACKCACHE_DATA_OFF,
                   .checksum = XXH3_64bits(m + PACKCACHE_DATA_OFF, bytes)};
    memcpy(h.magic, PC_MAGIC, 8);
    memcpy(m, &h, sizeof h);
    munmap(m, len);
    /* no fsync: a file cut short by a crash fails its checksum at the next start and is rebuilt */
    int rc = close(fd);
    if (rc || rename(tmp, path)) {
        snprintf(why, whylen, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    fprintf(stderr, "orochi: packed %s in %.1f s\n", model_path, pc_now() - t0);
    return 0;
}
#endif

/* The private block: fill into this process's memory, on huge pages. */
static int pc_private(size_t bytes, packcache_fill_fn fill, void *arg, packcache_block *out)
{
    size_t len = (bytes + PC_HUGE - 1) & ~(PC_HUGE - 1);
    if (!len)
        len = PC_HUGE;
    void *p;
    if (posix_memalign(&p, PC_HUGE, len))
        return -1;
#ifdef MADV_HUGEPAGE
    madvise(p, len, MADV_HUGEPAGE);
#endif
    fill(p, bytes, arg);
    out->base = p;
    out->bytes = bytes;
    out->map = NULL;
    out->map_len = len;
    out->path[0] = '\0';
    return 0;
}

int packcache_get(const char *model_path, uint64_t identity, const void *desc, size_t desc_len,
                  size_t bytes, packcache_fill_fn fill, void *arg, packcache_block *out, char *err,
                  size_t errlen)
{
    memset(out, 0, sizeof *out);
    char dir[400], why[1200] = "";
    bool cache = packcache_dir(dir, sizeof dir);
#ifdef PACKCACHE_HAVE_XXH
    struct stat id;
    if (cache && bytes && !stat(model_path, &id)) {
        uint64_t v = PACKCACHE_VERSION;
        XXH3_state_t *st = XXH3_createState();
        uint64_t key = 0;
        if (st && XXH3_64bits_reset(st) == XXH_OK) {
            XXH3_64bits_update(st, &v, sizeof v);
            uint64_t ident[5] = {(uint64_t)id.st_dev, (uint64_t)id.st_ino, (uint64_t)id.st_size,
                                 (uint64_t)id.st_mtim.tv_sec, (uint64_t)id.st_mtim.tv_nsec};
            XXH3_64bits_update(st, ident, sizeof ident);
            XXH3_64bits_update(st, &identity, sizeof identity); /* the sampled bytes' hash */
            XXH3_64bits_update(st, desc, desc_len);
            key = XXH3_64bits_digest(st);
        }
        XXH3_freeState(st);
        char base[256], path[512], lock[530];
        snprintf(base, sizeof base, "%s", model_path);
        if ((size_t)snprintf(path, sizeof path, "%s/%s.%016" PRIx64 ".pack", dir, basename(base),
                             key) >= sizeof path) {
            snprintf(why, sizeof why, "the cache path is too long");
        } else if (pc_mkdirs(dir)) {
            snprintf(why, sizeof why, "cannot create %s: %s", dir, strerror(errno));
        } else {
            int r = pc_open_valid(path, key, &id, bytes, out, why, sizeof why);
            if (!r)
                return 0;
            snprintf(lock, sizeof lock, "%s.lock", path);
            int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
            if (lfd < 0) {
                snprintf(why, sizeof why, "cannot create %s: %s", lock, strerror(errno));
            } else {
                if (flock(lfd, LOCK_EX | LOCK_NB)) {
                    fprintf(stderr, "orochi: waiting for another process packing %s\n",
                            model_path);
                    flock(lfd, LOCK_EX);
                }
                char why2[1200] = "";
                r = pc_open_valid(path, key, &id, bytes, out, why2, sizeof why2);
                if (r < 0)
                    fprintf(stderr, "orochi: the weights cache %s is not used (%s): rebuilding\n",
                            path, why2);
                if (r && !pc_build(path, key, &id, bytes, model_path, fill, arg, why,
                                   sizeof why) &&
                    !(r = pc_open_valid(path, key, &id, bytes, out, why, sizeof why))) {
                    out->built = true;
                    char keep[300];
                    snprintf(keep, sizeof keep, "%s", path + strlen(dir) + 1);
                    pc_evict(dir, basename(base), keep);
                }
                flock(lfd, LOCK_UN);
                close(lfd);
                if (!r)
                    return 0;
            }
        }
    } else if (cache && bytes) {
        snprintf(why, sizeof why, "%s: %s", model_path, strerror(errno));
    }
#else
    (void)identity;
    (void)desc;
    (void)desc_len;
    if (cache && bytes)
        snprintf(why, sizeof why, "this build has no checksum library (xxhash.h)");
#endif
    if (why[0])
        fprintf(stderr, "orochi: weights cache unusable (%s): packing %s privately, this process "
                        "holds its own %.2f GB copy\n",
                why, model_path, bytes / 1e9);
    if (pc_private(bytes, fill, arg, out)) {
        snprintf(err, errlen, "%s: out of memory packing %.2f GB of weights", model_path,
                 bytes / 1e9);
        return -1;
    }
    return 0;
}

uint64_t packcache_identity(const char *path)
{
#ifdef PACKCACHE_HAVE_XXH
    struct stat st;
    XXH3_state_t *x = XXH3_createState();
    uint64_t id = 0;
    if (x && !stat(path, &st) && XXH3_64bits_reset(x) == XXH_OK) {
        uint64_t size = (uint64_t)st.st_size;
        XXH3_64bits_update(x, &size, sizeof size);
        pc_fingerprint(x, path, (size_t)st.st_size);
        id = XXH3_64bits_digest(x);
        if (!id)
            id = 1; /* 0 means unknown */
    }
    XXH3_freeState(x);
    return id;
#else
    (void)path;
    return 0;
#endif
}

void packcache_release(packcache_block *b)
{
    if (b->map)
        munmap(b->map, b->map_len);
    else
        free(b->base);
    memset(b, 0, sizeof *b);
}
