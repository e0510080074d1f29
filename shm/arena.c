/*
 * shm/arena.c — the process group's shared-memory arena: create it, attach to it, validate it,
 * find regions in it, and tell a crashed group's leftover arena from a live one.
 *
 * Why shared memory: the coordinator, the workers and the speculators exchange step inputs,
 * activations, logits, KV cache and drafts every step; one mapping that all of them see (and that
 * a GPU worker can register with CUDA) costs no copies and no sockets on the hot path.
 *
 * Layout: a fixed arena_header at offset 0, then the regions in the order given, each starting
 * on a 64-byte boundary (a cache line, and enough for any SIMD load). The object is sized with
 * ftruncate, so every region starts zero-filled without this process touching (and faulting in)
 * its pages. The creator writes the header with the magic number stored last (release), so an
 * attacher that sees the magic sees a complete header.
 *
 * Trust: the object's contents are shared with other processes and may be garbage (a crash in
 * the middle of creation, another program's object of the same name). An attacher copies the
 * header once, checks every field against the object's real size, and from then on uses only its
 * own validated copy of the region table, so nothing a peer writes later into the header can make
 * this process read or write outside the mapping.
 *
 * Stale arenas: the header records the creator's pid. When a name is taken, the object is probed:
 * header unreadable or garbage, or creator gone (kill(pid, 0) fails with ESRCH, or the pid is a
 * zombie), means it was left by a crashed group and may be unlinked; a creator that exists (kill
 * succeeds or EPERM) means the arena is in use. Workers and speculators call arena_unlink_stale
 * on their way out, so when the coordinator is killed the last of them removes the arena. The
 * probe cannot see a recycled pid (an unrelated process that got the dead creator's pid makes the
 * arena look in use; the error names the pid so a person can check), and it assumes one pid
 * namespace per group. Before unlinking, the name is reopened and
 * compared (device, inode) with the probed object, so a replacer never removes a fresh arena that
 * another replacer has just created in its place; two coordinators racing for one name is not
 * otherwise supported.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "shm/arena.h"

#define ARENA_ALIGN 64u
#define ARENA_NAME_MAX 200 /* characters, leading '/' included */
#define ARENA_MODE 0600
#define ARENA_CREATE_TRIES 3

struct arena {
    char name[ARENA_NAME_MAX + 1];
    int fd;           /* -1 when not open */
    void *base;       /* NULL when not mapped */
    uint64_t size;    /* mapped bytes == header total_size */
    pid_t creator;    /* this process's pid if it created the object (unlinks on destroy), else 0 */
    uint32_t n_regions;
    arena_region regions[ARENA_MAX_REGIONS]; /* validated private copy of the header's table */
};

typedef enum {
    ARENA_PROBE_ABSENT, /* no object of that name */
    ARENA_PROBE_LIVE,   /* valid header, creator process exists */
    ARENA_PROBE_STALE,  /* garbage header, or creator gone */
    ARENA_PROBE_ERROR,  /* could not inspect it (err set) */
} arena_probe_result;

__attribute__((format(printf, 3, 4))) static void arena_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static uint64_t arena_header_bytes(void)
{
    return ((uint64_t)sizeof(arena_header) + ARENA_ALIGN - 1) & ~(uint64_t)(ARENA_ALIGN - 1);
}

/* "/NAME": a leading '/', no other '/', 2..ARENA_NAME_MAX characters. */
static bool arena_name_check(const char *name, char *err, size_t errlen)
{
    if (!name || name[0] != '/') {
        arena_err(err, errlen, "arena name '%.64s' must start with '/'", name ? name : "(null)");
        return false;
    }
    size_t len = strnlen(name, ARENA_NAME_MAX + 1);
    if (len > ARENA_NAME_MAX) {
        arena_err(err, errlen, "arena name '%.32s...' is longer than %d characters", name, ARENA_NAME_MAX);
        return false;
    }
    if (len < 2) {
        arena_err(err, errlen, "arena name '/' is empty after the '/'");
        return false;
    }
    if (strchr(name + 1, '/')) {
        arena_err(err, errlen, "arena name '%s' may hold no '/' after the leading one", name);
        return false;
    }
    return true;
}

/* Place the regions after the header; fills out[] and *total, or sets err. */
static bool arena_layout(const arena_spec *specs, int n_specs, arena_region *out, uint64_t *total, char *err,
                         size_t errlen)
{
    if (n_specs < 0 || n_specs > ARENA_MAX_REGIONS) {
        arena_err(err, errlen, "arena: %d regions requested, the table holds 0..%d", n_specs, ARENA_MAX_REGIONS);
        return false;
    }
    if (n_specs > 0 && !specs) {
        arena_err(err, errlen, "arena: %d regions requested but no region specs given", n_specs);
        return false;
    }
    /* the mapping length is a size_t and ftruncate takes an off_t: stay below both */
    const uint64_t limit = (uint64_t)INT64_MAX < (uint64_t)SIZE_MAX ? (uint64_t)INT64_MAX : (uint64_t)SIZE_MAX;
    uint64_t off = arena_header_bytes();
    for (int i = 0; i < n_specs; i++) {
        const char *nm = specs[i].name;
        if (!nm || !nm[0]) {
            arena_err(err, errlen, "arena: region %d has no name", i);
            return false;
        }
        size_t len = strnlen(nm, ARENA_NAME_LEN);
        if (len >= ARENA_NAME_LEN) {
            arena_err(err, errlen, "arena: region name '%.40s...' is too long (at most %d characters)", nm,
                      ARENA_NAME_LEN - 1);
            return false;
        }
        for (int j = 0; j < i; j++)
            if (strcmp(specs[j].name, nm) == 0) {
                arena_err(err, errlen, "arena: region name '%s' is used twice (regions %d and %d)", nm, j, i);
                return false;
            }
        uint64_t size = specs[i].size;
        if (size == 0) {
            arena_err(err, errlen, "arena: region '%s' has size 0", nm);
            return false;
        }
        /* off <= limit <= INT64_MAX, so off + size + ARENA_ALIGN cannot wrap once size <= limit - off */
        if (size > limit - off || ((off + size + ARENA_ALIGN - 1) & ~(uint64_t)(ARENA_ALIGN - 1)) > limit) {
            arena_err(err, errlen, "arena: region '%s' of %" PRIu64 " bytes makes the arena too large", nm, size);
            return false;
        }
        memset(&out[i], 0, sizeof out[i]);
        memcpy(out[i].name, nm, len);
        out[i].offset = off;
        out[i].size = size;
        off = (off + size + ARENA_ALIGN - 1) & ~(uint64_t)(ARENA_ALIGN - 1);
    }
    *total = off;
    return true;
}

/* Check a header copy against the object's real size; on success copy the regions into a. */
static bool arena_validate(arena *a, const arena_header *h, uint64_t object_size, char *err, size_t errlen)
{
    const char *nm = a->name;
    if (h->magic != ARENA_MAGIC) {
        arena_err(err, errlen,
                  "arena %s: bad magic 0x%016" PRIx64 " (want 0x%016llx): not an orochi arena, or not yet "
                  "initialised",
                  nm, h->magic, ARENA_MAGIC);
        return false;
    }
    if (h->layout_version != ARENA_LAYOUT_VERSION) {
        arena_err(err, errlen, "arena %s: layout_version %" PRIu32 ", this build reads version %d", nm,
                  h->layout_version, ARENA_LAYOUT_VERSION);
        return false;
    }
    if (h->total_size != object_size) {
        arena_err(err, errlen, "arena %s: header total_size %" PRIu64 " but the object is %" PRIu64 " bytes", nm,
                  h->total_size, object_size);
        return false;
    }
    if (h->n_regions > ARENA_MAX_REGIONS) {
        arena_err(err, errlen, "arena %s: n_regions %" PRIu32 " exceeds the table's %d", nm, h->n_regions,
                  ARENA_MAX_REGIONS);
        return false;
    }
    const uint64_t first = arena_header_bytes();
    for (uint32_t i = 0; i < h->n_regions; i++) {
        const arena_region *r = &h->regions[i];
        if (!memchr(r->name, '\0', sizeof r->name)) {
            arena_err(err, errlen, "arena %s: region %" PRIu32 " name is not NUL-terminated", nm, i);
            return false;
        }
        if (!r->name[0]) {
            arena_err(err, errlen, "arena %s: region %" PRIu32 " has an empty name", nm, i);
            return false;
        }
        for (const char *ch = r->name; *ch; ch++)
            if ((unsigned char)*ch < 0x20 || (unsigned char)*ch > 0x7e) {
                /* names are quoted in the messages below: printable ASCII only */
                arena_err(err, errlen, "arena %s: region %" PRIu32 " name has byte 0x%02x", nm, i,
                          (unsigned char)*ch);
                return false;
            }
        if (r->offset % ARENA_ALIGN) {
            arena_err(err, errlen, "arena %s: region '%s' offset %" PRIu64 " is not %u-byte aligned", nm, r->name,
                      r->offset, ARENA_ALIGN);
            return false;
        }
        if (r->offset < first) {
            arena_err(err, errlen, "arena %s: region '%s' offset %" PRIu64 " overlaps the header", nm, r->name,
                      r->offset);
            return false;
        }
        if (r->offset > object_size || r->size > object_size - r->offset) {
            arena_err(err, errlen,
                      "arena %s: region '%s' (offset %" PRIu64 ", size %" PRIu64 ") lies outside the %" PRIu64
                      "-byte arena",
                      nm, r->name, r->offset, r->size, object_size);
            return false;
        }
        for (uint32_t j = 0; j < i; j++) {
            const arena_region *q = &h->regions[j];
            if (strcmp(q->name, r->name) == 0) {
                arena_err(err, errlen, "arena %s: region name '%s' appears twice", nm, r->name);
                return false;
            }
            if (r->offset < q->offset + q->size && q->offset < r->offset + r->size) {
                arena_err(err, errlen, "arena %s: regions '%s' and '%s' overlap", nm, q->name, r->name);
                return false;
            }
        }
    }
    a->n_regions = h->n_regions;
    memcpy(a->regions, h->regions, sizeof a->regions);
    return true;
}

/* A killed creator whose parent has not reaped it yet (or never will: a container whose init
 * does not reap) still answers kill(pid, 0), but it is dead and its arena is stale. */
static bool arena_pid_zombie(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = 0;
    const char *paren = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    return paren && paren[1] == ' ' && paren[2] == 'Z';
}

/* Inspect the object `name`. For STALE, *probed identifies the object inspected; for LIVE, *pid is
 * its creator. */
static arena_probe_result arena_probe(const char *name, pid_t *pid, struct stat *probed, char *err, size_t errlen)
{
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd < 0) {
        if (errno == ENOENT)
            return ARENA_PROBE_ABSENT;
        arena_err(err, errlen, "arena %s exists but cannot be inspected: %s", name, strerror(errno));
        return ARENA_PROBE_ERROR;
    }
    arena_probe_result res = ARENA_PROBE_STALE;
    arena_header h;
    if (fstat(fd, probed) != 0) {
        arena_err(err, errlen, "arena %s: fstat: %s", name, strerror(errno));
        res = ARENA_PROBE_ERROR;
    } else if (probed->st_size >= (off_t)sizeof h && pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h &&
               h.magic == ARENA_MAGIC && h.layout_version == ARENA_LAYOUT_VERSION && h.creator_pid > 0 &&
               h.creator_pid <= (uint64_t)INT_MAX) {
        *pid = (pid_t)h.creator_pid;
        if ((kill(*pid, 0) == 0 || errno != ESRCH) && !arena_pid_zombie(*pid))
            res = ARENA_PROBE_LIVE; /* exists (EPERM: someone else's process), so still in use */
    }
    close(fd);
    return res;
}

/* Unlink `name` only if it still names the object described by `st`. */
static bool arena_unlink_if_same(const char *name, const struct stat *st)
{
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd < 0)
        return false;
    struct stat now;
    bool same = fstat(fd, &now) == 0 && now.st_dev == st->st_dev && now.st_ino == st->st_ino;
    close(fd);
    return same && shm_unlink(name) == 0;
}

static arena *arena_alloc(const char *name, char *err, size_t errlen)
{
    arena *a = calloc(1, sizeof *a);
    if (!a) {
        arena_err(err, errlen, "arena %s: out of memory", name);
        return NULL;
    }
    memcpy(a->name, name, strlen(name) + 1);
    a->fd = -1;
    return a;
}

/* Open name exclusively, replacing a stale object if allowed. -1 with err on failure. */
static int arena_open_new(const char *name, bool replace_stale, char *err, size_t errlen)
{
    for (int attempt = 0; attempt < ARENA_CREATE_TRIES; attempt++) {
        int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, ARENA_MODE);
        if (fd >= 0)
            return fd;
        if (errno != EEXIST) {
            arena_err(err, errlen, "cannot create arena %s: %s", name, strerror(errno));
            return -1;
        }
        if (!replace_stale) {
            arena_err(err, errlen, "arena %s already exists (left by a crashed group? replace_stale removes it)",
                      name);
            return -1;
        }
        pid_t pid = 0;
        struct stat st;
        switch (arena_probe(name, &pid, &st, err, errlen)) {
        case ARENA_PROBE_LIVE:
            arena_err(err, errlen, "arena %s is in use by pid %d", name, (int)pid);
            return -1;
        case ARENA_PROBE_ERROR:
            return -1;
        case ARENA_PROBE_STALE:
            arena_unlink_if_same(name, &st);
            break;
        case ARENA_PROBE_ABSENT:
            break; /* removed meanwhile: try again */
        }
    }
    arena_err(err, errlen, "cannot create arena %s: the name keeps being taken by another process", name);
    return -1;
}

arena *arena_create(const char *name, const arena_spec *specs, int n_specs, bool replace_stale, char *err,
                    size_t errlen)
{
    arena_region regions[ARENA_MAX_REGIONS];
    uint64_t total = 0;
    if (!arena_name_check(name, err, errlen) || !arena_layout(specs, n_specs, regions, &total, err, errlen))
        return NULL;
    arena *a = arena_alloc(name, err, errlen);
    if (!a)
        return NULL;
    a->fd = arena_open_new(name, replace_stale, err, errlen);
    if (a->fd < 0)
        goto fail;
    a->creator = getpid(); /* from here on arena_destroy unlinks the object */
    /* the umask may have narrowed the mode at creation; make it exactly owner read/write */
    if (fchmod(a->fd, ARENA_MODE) != 0 || ftruncate(a->fd, (off_t)total) != 0) {
        arena_err(err, errlen, "arena %s: cannot size it to %" PRIu64 " bytes: %s", name, total, strerror(errno));
        goto fail;
    }
    void *base = mmap(NULL, (size_t)total, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
    if (base == MAP_FAILED) {
        arena_err(err, errlen, "arena %s: mmap of %" PRIu64 " bytes: %s", name, total, strerror(errno));
        goto fail;
    }
    a->base = base;
    a->size = total;
    a->n_regions = (uint32_t)n_specs;
    memcpy(a->regions, regions, (size_t)n_specs * sizeof regions[0]);

    arena_header *h = base;
    h->creator_pid = (uint64_t)a->creator;
    h->layout_version = ARENA_LAYOUT_VERSION;
    h->n_regions = (uint32_t)n_specs;
    h->total_size = total;
    memcpy(h->regions, regions, (size_t)n_specs * sizeof regions[0]);
    __atomic_store_n(&h->generation, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&h->magic, ARENA_MAGIC, __ATOMIC_RELEASE); /* last: the header is complete */
    return a;
fail:
    arena_destroy(&a);
    return NULL;
}

arena *arena_attach(const char *name, char *err, size_t errlen)
{
    if (!arena_name_check(name, err, errlen))
        return NULL;
    arena *a = arena_alloc(name, err, errlen);
    if (!a)
        return NULL;
    a->fd = shm_open(name, O_RDWR, 0);
    if (a->fd < 0) {
        if (errno == ENOENT)
            arena_err(err, errlen, "arena %s does not exist", name);
        else
            arena_err(err, errlen, "cannot open arena %s: %s", name, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(a->fd, &st) != 0) {
        arena_err(err, errlen, "arena %s: fstat: %s", name, strerror(errno));
        goto fail;
    }
    if (st.st_size < (off_t)arena_header_bytes()) {
        arena_err(err, errlen, "arena %s is truncated: %lld bytes, smaller than its %" PRIu64 "-byte header", name,
                  (long long)st.st_size, arena_header_bytes());
        goto fail;
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        arena_err(err, errlen, "arena %s: %lld bytes do not fit in the address space", name, (long long)st.st_size);
        goto fail;
    }
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
    if (base == MAP_FAILED) {
        arena_err(err, errlen, "arena %s: mmap of %lld bytes: %s", name, (long long)st.st_size, strerror(errno));
        goto fail;
    }
    a->base = base;
    a->size = (uint64_t)st.st_size;

    /* one snapshot of the header, taken after the magic (acquire) so a complete header is seen */
    const arena_header *shared = base;
    arena_header h;
    (void)__atomic_load_n(&shared->magic, __ATOMIC_ACQUIRE);
    memcpy(&h, shared, sizeof h);
    if (!arena_validate(a, &h, a->size, err, errlen))
        goto fail;
    return a;
fail:
    arena_destroy(&a);
    return NULL;
}

void arena_destroy(arena **ap)
{
    if (!ap || !*ap)
        return;
    arena *a = *ap;
    if (a->base)
        munmap(a->base, (size_t)a->size);
    /* only the creating process unlinks (not a fork()ed child holding a copy), and only the object
     * it created, not one that replaced it under the same name */
    struct stat st;
    if (a->fd >= 0 && a->creator != 0 && a->creator == getpid() && fstat(a->fd, &st) == 0)
        arena_unlink_if_same(a->name, &st);
    if (a->fd >= 0)
        close(a->fd);
    free(a);
    *ap = NULL;
}

bool arena_unlink_stale(const char *name)
{
    if (!arena_name_check(name, NULL, 0))
        return false;
    pid_t pid = 0;
    struct stat st;
    if (arena_probe(name, &pid, &st, NULL, 0) != ARENA_PROBE_STALE)
        return false;
    return arena_unlink_if_same(name, &st);
}

const arena_header *arena_header_of(const arena *a)
{
    return a->base;
}

void *arena_base(const arena *a)
{
    return a->base;
}

uint64_t arena_size(const arena *a)
{
    return a->size;
}

const char *arena_name(const arena *a)
{
    return a->name;
}

void *arena_region_find(const arena *a, const char *name, uint64_t *size)
{
    if (!name)
        return NULL;
    for (uint32_t i = 0; i < a->n_regions; i++)
        if (strncmp(a->regions[i].name, name, ARENA_NAME_LEN) == 0) {
            if (size)
                *size = a->regions[i].size;
            return (char *)a->base + a->regions[i].offset;
        }
    return NULL;
}

uint64_t arena_generation(const arena *a)
{
    const arena_header *h = a->base;
    return __atomic_load_n(&h->generation, __ATOMIC_ACQUIRE);
}

void arena_bump_generation(arena *a)
{
    arena_header *h = a->base;
    __atomic_fetch_add(&h->generation, 1, __ATOMIC_ACQ_REL);
}
