/*
 * tests/fuzz/fuzz_arena — libFuzzer target for attaching to a shared-memory arena whose bytes
 * someone else wrote (shm/arena.c: arena_attach -> arena_validate, arena_region_find, and the
 * stale-arena probe arena_unlink_stale), and for reading a draft ring out of such an arena
 * (shm/draft_ring.c: arena_draft_ring_get).
 *
 * arena_attach takes a name, not a buffer, and its validation (arena_validate) is static, so each
 * input really becomes a POSIX shared-memory object (/orochi-fuzz-arena-PID in /dev/shm, removed
 * after every input and at exit) that arena_attach then opens, sizes, maps and validates. If
 * arena.c ever exposes the check on a header copy (e.g. `arena_header_check(const arena_header *,
 * uint64_t object_size, err, errlen)`), a buffer-only target would run several times faster.
 *
 * Input: byte 0 = flags, the rest = the object's bytes (header first, see shm/arena.h).
 *   bit 0  store the right magic          bit 1  store the right layout version
 *   bit 2  store total_size = the object's real size (so deeper checks are reached)
 *   bits 3-4  zero bytes appended to the object: 0, 64, 4096, 65536 (room for regions)
 *   bit 5  after a successful attach, overwrite the shared header (a peer gone wrong)
 *   bit 6  run arena_unlink_stale on the object    bit 7  store our pid as the creator
 *
 * Checked: arena_attach accepts exactly the objects an independent reading of the header rules
 * in arena.h accepts (magic, version, total_size == object size, at most 32 regions, each named
 * (NUL-terminated, non-empty, printable ASCII, unique), 64-byte aligned, past the header, inside the object, not
 * overlapping); a refusal comes with a one-line error naming the arena; an accepted arena maps the
 * whole object and every region is found by name at base + offset with its size, inside the
 * mapping, a name not in the table is not found, and none of that changes when the shared header
 * is rewritten after the attach. arena_unlink_stale never removes an arena whose creator (us) is
 * alive and always removes one whose header is garbage. For every region named "drafts" (where
 * the coordinator keeps the speculators' rings), a copy of the region on the heap, of exactly its
 * size, is read as ring 0 at every slot the input names: ASan reports any read past the region.
 *
 * Build and run: `make fuzz`, then tests/fuzz/run_fuzz.sh (seeds: tests/fuzz/corpus/arena/).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm/arena.h"
#include "tests/fuzz/fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_ALIGN 64u
#define FZ_HEADER_BYTES ((sizeof(arena_header) + FZ_ALIGN - 1) & ~(size_t)(FZ_ALIGN - 1))

static char fz_name[64];
static int fz_lowest_fd; /* the lowest free descriptor between inputs */

static void fz_cleanup(void)
{
    shm_unlink(fz_name);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    snprintf(fz_name, sizeof fz_name, "/orochi-fuzz-arena-%d", (int)getpid());
    shm_unlink(fz_name);
    atexit(fz_cleanup);
    fz_lowest_fd = dup(0);
    if (fz_lowest_fd < 0)
        abort();
    close(fz_lowest_fd);
    return 0;
}

/* The rules of shm/arena.h, read independently of arena.c: would an attacher accept h? */
static bool fz_header_ok(const arena_header *h, uint64_t size)
{
    if (h->magic != ARENA_MAGIC || h->layout_version != ARENA_LAYOUT_VERSION ||
        h->total_size != size || h->n_regions > ARENA_MAX_REGIONS)
        return false;
    for (uint32_t i = 0; i < h->n_regions; i++) {
        const arena_region *r = &h->regions[i];
        size_t nl = strnlen(r->name, sizeof r->name);
        if (nl == sizeof r->name || nl == 0)
            return false;
        for (size_t k = 0; k < nl; k++)
            if ((unsigned char)r->name[k] < 0x20 || (unsigned char)r->name[k] > 0x7e)
                return false; /* printable ASCII only */
        if (r->offset % FZ_ALIGN || r->offset < FZ_HEADER_BYTES || r->offset > size ||
            r->size > size - r->offset)
            return false;
        for (uint32_t j = 0; j < i; j++) {
            const arena_region *q = &h->regions[j];
            if (!strcmp(q->name, r->name))
                return false;
            if (r->offset < q->offset + q->size && q->offset < r->offset + r->size)
                return false;
        }
    }
    return true;
}

/* Write the object: n bytes of data, then `pad` zero bytes. */
static void fz_make_object(const uint8_t *data, size_t n, size_t pad)
{
    int fd = shm_open(fz_name, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        fuzz_fail("shm_open %s: %s", fz_name, strerror(errno));
    if (ftruncate(fd, (off_t)(n + pad)) != 0)
        fuzz_fail("ftruncate: %s", strerror(errno));
    for (size_t off = 0; off < n;) {
        ssize_t w = pwrite(fd, data + off, n - off, (off_t)off);
        if (w <= 0)
            fuzz_fail("pwrite: %s", strerror(errno));
        off += (size_t)w;
    }
    close(fd);
}

/* Read ring 0 of a "drafts" region from a heap copy of exactly the region's size, at the slots
 * the input names (the coordinator takes the slot from a speculator's DraftReady). */
static void fz_read_ring(const void *region, uint64_t rsize, const uint8_t *slots, size_t n)
{
    if (rsize < offsetof(arena_draft_ring, slots) || rsize > (1u << 20))
        return;
    arena_draft_ring *copy = malloc(rsize);
    if (!copy)
        abort();
    memcpy(copy, region, rsize);
    /* capacity the region really has for slots */
    uint64_t cap = (rsize - offsetof(arena_draft_ring, slots)) / sizeof(arena_draft);
    for (size_t i = 0; i + 4 <= n && i < 64; i += 4) {
        uint32_t slot;
        memcpy(&slot, slots + i, 4);
        /* the reader passes the capacity it laid the ring out with; the ring's own n_slots (shared
         * memory) may say anything */
        arena_draft d;
        if (arena_draft_ring_get(copy, (uint32_t)(cap < UINT32_MAX ? cap : UINT32_MAX), slot, &d) &&
            d.n > ARENA_DRAFT_MAX)
            fuzz_fail("ring slot %u: a draft of %u tokens", slot, d.n);
    }
    free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const size_t pads[4] = {0, 64, 4096, 65536};
    uint8_t flags = data[0];
    size_t n = size - 1;
    size_t pad = pads[(flags >> 3) & 3];
    uint64_t osize = n + pad;
    /* the object: the input's bytes, then zeros; the header fields the flags name are patched */
    size_t head = osize < sizeof(arena_header) ? (size_t)osize : sizeof(arena_header);
    size_t wlen = n > head ? n : head;
    uint8_t *obj = calloc(1, wlen ? wlen : 1);
    if (!obj)
        abort();
    if (n)
        memcpy(obj, data + 1, n);
    arena_header h = {0};
    memcpy(&h, obj, head);
    if (head == sizeof h) {
        if (flags & 1)
            h.magic = ARENA_MAGIC;
        if (flags & 2)
            h.layout_version = ARENA_LAYOUT_VERSION;
        if (flags & 4)
            h.total_size = osize;
        if (flags & 128)
            h.creator_pid = (uint64_t)getpid();
        memcpy(obj, &h, sizeof h);
    }
    fz_make_object(obj, wlen, (size_t)osize - wlen);
    bool want = osize >= FZ_HEADER_BYTES && fz_header_ok(&h, osize);

    char err[512] = "";
    arena *a = arena_attach(fz_name, err, sizeof err);
    if (!a != !want)
        fuzz_fail("arena_attach %s an object the header rules %s (%s)", a ? "accepted" : "refused",
                  want ? "accept" : "refuse", err);
    if (!a) {
        /* region names with unprintable bytes are refused before any message quotes one */
        fuzz_check_err("arena_attach", err, sizeof err);
        if (!strstr(err, fz_name))
            fuzz_fail("arena_attach's error does not name the arena: %s", err);
        /* no partial state: a refused attach leaves the object as it was, and no mapping or
         * descriptor behind (the next input's shm_open/ftruncate would notice neither, so the
         * descriptor count is checked) */
        int fd = shm_open(fz_name, O_RDONLY, 0);
        if (fd < 0)
            fuzz_fail("a refused arena_attach removed the object");
        if (fd != fz_lowest_fd)
            fuzz_fail("a refused arena_attach left a descriptor open (next free is %d, was %d)", fd,
                      fz_lowest_fd);
        close(fd);
    } else {
        uint8_t *base = arena_base(a);
        if (arena_size(a) != osize || (const void *)arena_header_of(a) != (void *)base)
            fuzz_fail("attached %" PRIu64 " bytes of a %" PRIu64 "-byte object", arena_size(a),
                      osize);
        if (strcmp(arena_name(a), fz_name))
            fuzz_fail("arena_name: %s", arena_name(a));
        volatile uint64_t gen = arena_generation(a);
        (void)gen;
        void *where[ARENA_MAX_REGIONS];
        uint64_t sizes[ARENA_MAX_REGIONS];
        for (int pass = 0; pass < 2; pass++) {
            for (uint32_t i = 0; i < h.n_regions; i++) {
                const arena_region *r = &h.regions[i];
                uint64_t rs = UINT64_MAX;
                uint8_t *p = arena_region_find(a, r->name, &rs);
                if (p != base + r->offset || rs != r->size || r->offset + rs > osize)
                    fuzz_fail("region '%s': found at +%td (%" PRIu64
                              " bytes), header says +%" PRIu64 " (%" PRIu64 ")",
                              r->name, p ? p - base : -1, rs, r->offset, r->size);
                if (pass == 0) {
                    where[i] = p;
                    sizes[i] = rs;
                } else if (where[i] != p || sizes[i] != rs) {
                    fuzz_fail("region '%s' moved after the shared header was rewritten", r->name);
                }
                if (rs) {
                    volatile uint8_t x = p[0] ^ p[rs - 1];
                    (void)x;
                }
                if (pass == 0 && !strcmp(r->name, "drafts"))
                    fz_read_ring(p, rs, obj + head, wlen - head);
            }
            if (arena_region_find(a, "no such region: 33 bytes long....", NULL) ||
                arena_region_find(a, NULL, NULL))
                fuzz_fail("found a region that is not in the table");
            if (pass == 0 && !(flags & 32))
                break;
            if (pass == 0) {
                /* a peer gone wrong rewrites the shared header after we attached */
                arena_header *shared = (arena_header *)base;
                shared->n_regions = UINT32_MAX;
                for (int i = 0; i < ARENA_MAX_REGIONS; i++) {
                    shared->regions[i].offset = UINT64_MAX - 63;
                    shared->regions[i].size = UINT64_MAX;
                }
            }
        }
        arena_destroy(&a);
        if (a)
            fuzz_fail("arena_destroy did not null the pointer");
        /* an attacher never unlinks */
        int fd = shm_open(fz_name, O_RDONLY, 0);
        if (fd < 0)
            fuzz_fail("the object vanished after an attacher's arena_destroy");
        if (fd != fz_lowest_fd)
            fuzz_fail("arena_destroy left a descriptor open (next free is %d, was %d)", fd,
                      fz_lowest_fd);
        close(fd);
    }

    if (flags & 64) {
        /* the header as the probe will read it (rewritten above with flag 32) */
        bool header_read = false, ours = false;
        int fd = shm_open(fz_name, O_RDONLY, 0);
        arena_header now = {0};
        if (fd >= 0) {
            if (pread(fd, &now, sizeof now, 0) == (ssize_t)sizeof now)
                header_read = now.magic == ARENA_MAGIC &&
                              now.layout_version == ARENA_LAYOUT_VERSION && now.creator_pid > 0 &&
                              now.creator_pid <= (uint64_t)INT_MAX;
            else
                header_read = false;
            ours = header_read && now.creator_pid == (uint64_t)getpid();
            close(fd);
        }
        bool removed = arena_unlink_stale(fz_name);
        fd = shm_open(fz_name, O_RDONLY, 0);
        if (removed == (fd >= 0))
            fuzz_fail("arena_unlink_stale returned %d but the object %s", removed,
                      fd >= 0 ? "is still there" : "is gone");
        if (fd >= 0)
            close(fd);
        if (ours && removed)
            fuzz_fail("arena_unlink_stale removed an arena whose creator (us) is alive");
        if (!header_read && !removed)
            fuzz_fail("arena_unlink_stale kept an arena whose header is garbage");
    }
    shm_unlink(fz_name);
    free(obj);
    return 0;
}
